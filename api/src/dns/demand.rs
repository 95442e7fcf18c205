//! What the front end saw: queries per (map-unit prefix, class) for Feedback.ReportDemand, and
//! queries per hostname for bounded-loads selection. Both tables are bounded; counts beyond the
//! bound are dropped and counted, never grown without limit.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cdnmap_mapper::{ClassIdx, UnitIdx};
use dashmap::DashMap;
use ipnet::IpNet;

use super::local::LocalView;

/// Most (prefix, class) pairs counted in one period.
pub const MAX_TRACKED_PREFIXES: usize = 1_000_000;
/// Most hostnames counted in one period.
pub const MAX_TRACKED_HOSTS: usize = 100_000;

#[derive(Debug, Default)]
pub struct DemandCounter {
    prefixes: DashMap<(IpNet, Arc<str>), u64>,
    hosts: DashMap<String, u64>,
    dropped: AtomicU64,
}

/// One period's counts, largest first.
pub type Counts = Vec<((IpNet, Arc<str>), u64)>;

impl DemandCounter {
    /// Counts a query of `client` answered from unit `u` (matched at prefix length `len`).
    pub fn count(&self, view: &LocalView, _u: UnitIdx, client: &IpNet, len: u8, class: ClassIdx) {
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
        self.add((prefix, name), 1);
    }

    fn add(&self, key: (IpNet, Arc<str>), n: u64) {
        if let Some(mut c) = self.prefixes.get_mut(&key) {
            *c += n;
            return;
        }
        if self.prefixes.len() >= MAX_TRACKED_PREFIXES {
            self.dropped.fetch_add(n, Ordering::Relaxed);
            metrics::counter!("cdnmap_dns_demand_dropped_total").increment(n);
            return;
        }
        *self.prefixes.entry(key).or_insert(0) += n;
    }

    /// Counts a query for hostname `qname`.
    pub fn count_host(&self, qname: &str) {
        let mut key = String::with_capacity(qname.len());
        cdnmap_mapper::servers::content_key(qname, &mut key);
        if let Some(mut c) = self.hosts.get_mut(&key) {
            *c += 1;
            return;
        }
        if self.hosts.len() < MAX_TRACKED_HOSTS {
            *self.hosts.entry(key).or_insert(0) += 1;
        }
    }

    /// Takes the period's prefix counts (the table starts again empty).
    pub fn take(&self) -> Counts {
        let mut out = Vec::with_capacity(self.prefixes.len());
        self.prefixes.retain(|k, v| {
            out.push((k.clone(), *v));
            false
        });
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// Puts back counts a failed report did not deliver (within the table's bound).
    pub fn restore(&self, counts: Counts) {
        for (k, n) in counts {
            self.add(k, n);
        }
    }

    /// Takes the period's hostname counts, most queried first.
    pub fn take_hosts(&self) -> Vec<(String, u64)> {
        let mut out = Vec::with_capacity(self.hosts.len());
        self.hosts.retain(|k, v| {
            out.push((k.clone(), *v));
            false
        });
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// Counts dropped because the table was full, since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
