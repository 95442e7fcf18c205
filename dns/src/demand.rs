//! What the front end saw: queries per (map-unit prefix, class) for Feedback.ReportDemand, and
//! queries per hostname for bounded-loads selection. Both tables are bounded; counts beyond the
//! bound are dropped and counted, never grown without limit.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cdnmap_mapper::ClassIdx;
use ipnet::IpNet;

use super::local::LocalView;

/// Most (prefix, class) pairs counted in one period.
pub const MAX_TRACKED_PREFIXES: usize = 1_000_000;
/// Most hostnames counted in one period.
pub const MAX_TRACKED_HOSTS: usize = 100_000;

/// The tables' hash: Fx (a few instructions on these short keys; the keys come from the map,
/// not chosen freely by clients beyond the map's prefixes).
type Fx = rustc_hash::FxBuildHasher;

/// Shards of the tables. A thread counts into its own shard (threads are numbered on first
/// use), so the answering threads never contend for a lock or a cache line.
const SHARDS: usize = 16;

#[derive(Debug, Default)]
struct Shard {
    prefixes: HashMap<(IpNet, Arc<str>), u64, Fx>,
    hosts: HashMap<String, u64, Fx>,
}

#[derive(Debug)]
pub struct DemandCounter {
    shards: Vec<Mutex<Shard>>,
    /// Keys held over all shards (the bound is on this).
    prefixes: AtomicUsize,
    hosts: AtomicUsize,
    dropped: AtomicU64,
}

impl Default for DemandCounter {
    fn default() -> Self {
        DemandCounter {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            prefixes: AtomicUsize::new(0),
            hosts: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }
}

/// One period's counts, largest first.
pub type Counts = Vec<((IpNet, Arc<str>), u64)>;

fn thread_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|s| *s)
}

impl DemandCounter {
    fn shard(&self) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[thread_shard()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a query of `client` answered from a map unit's prefix of length `len`.
    pub fn count(&self, view: &LocalView, client: &IpNet, len: u8, class: ClassIdx) {
        let addr = match client.network() {
            IpAddr::V6(a) => a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4),
            v4 => v4,
        };
        let Ok(prefix) = IpNet::new(addr, len).map(|p| p.trunc()) else {
            return;
        };
        let Some(name) = view.class_arc(class) else {
            return;
        };
        self.add(&mut self.shard(), (prefix, name), 1);
    }

    fn add(&self, shard: &mut Shard, key: (IpNet, Arc<str>), n: u64) {
        if let Some(c) = shard.prefixes.get_mut(&key) {
            *c += n;
            return;
        }
        if self.prefixes.fetch_add(1, Ordering::Relaxed) >= MAX_TRACKED_PREFIXES {
            self.prefixes.fetch_sub(1, Ordering::Relaxed);
            self.dropped.fetch_add(n, Ordering::Relaxed);
            metrics::counter!("cdnmap_dns_demand_dropped_total").increment(n);
            return;
        }
        shard.prefixes.insert(key, n);
    }

    /// Counts a query for hostname `qname`.
    pub fn count_host(&self, qname: &str) {
        let mut key = String::with_capacity(qname.len());
        cdnmap_serve::servers::content_key(qname, &mut key);
        let mut shard = self.shard();
        if let Some(c) = shard.hosts.get_mut(&key) {
            *c += 1;
            return;
        }
        if self.hosts.fetch_add(1, Ordering::Relaxed) >= MAX_TRACKED_HOSTS {
            self.hosts.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        shard.hosts.insert(key, 1);
    }

    /// Takes the period's prefix counts (the tables start again empty).
    pub fn take(&self) -> Counts {
        let mut merged: HashMap<(IpNet, Arc<str>), u64, Fx> = HashMap::default();
        for shard in &self.shards {
            let taken =
                std::mem::take(&mut shard.lock().unwrap_or_else(|e| e.into_inner()).prefixes);
            self.prefixes.fetch_sub(taken.len(), Ordering::Relaxed);
            for (k, n) in taken {
                *merged.entry(k).or_insert(0) += n;
            }
        }
        let mut out: Counts = merged.into_iter().collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// Puts back counts a failed report did not deliver (within the tables' bound).
    pub fn restore(&self, counts: Counts) {
        let mut shard = self.shard();
        for (k, n) in counts {
            self.add(&mut shard, k, n);
        }
    }

    /// Takes the period's hostname counts, most queried first.
    pub fn take_hosts(&self) -> Vec<(String, u64)> {
        let mut merged: HashMap<String, u64, Fx> = HashMap::default();
        for shard in &self.shards {
            let taken = std::mem::take(&mut shard.lock().unwrap_or_else(|e| e.into_inner()).hosts);
            self.hosts.fetch_sub(taken.len(), Ordering::Relaxed);
            for (k, n) in taken {
                *merged.entry(k).or_insert(0) += n;
            }
        }
        let mut out: Vec<(String, u64)> = merged.into_iter().collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// Counts dropped because the table was full, since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
