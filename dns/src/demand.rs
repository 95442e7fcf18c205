//! What the front end saw: queries per (map-unit prefix, class) for Feedback.ReportDemand, and
//! queries per hostname for bounded-loads selection. Both tables are bounded; counts beyond the
//! bound are dropped and counted, never grown without limit.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cdnmap_mapper::ClassIdx;
use ipnet::IpNet;

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

/// One thread's counts. The prefix counts are a table per class, found by the query's class
/// index and checked by name (a new map may number the classes otherwise): a query costs one
/// lookup by prefix and no reference count (an `Arc` cloned per query is two atomic writes to
/// a cache line every answering thread shares).
#[derive(Debug, Default)]
struct Shard {
    prefixes: Vec<(Arc<str>, HashMap<IpNet, u64, Fx>)>,
    hosts: HashMap<String, u64, Fx>,
    /// Scratch for a query's content key (looked up by `&str`; copied only when inserted).
    key: String,
}

impl Shard {
    /// The table of class `name`, expected at `slot`; created (with `name()`) when missing.
    fn class_table(
        &mut self,
        slot: usize,
        name: &str,
        make: impl FnOnce() -> Arc<str>,
    ) -> &mut HashMap<IpNet, u64, Fx> {
        let at = match self.prefixes.get(slot) {
            Some((n, _)) if &**n == name => slot,
            _ => match self.prefixes.iter().position(|(n, _)| &**n == name) {
                Some(i) => i,
                None => {
                    self.prefixes.push((make(), HashMap::default()));
                    self.prefixes.len() - 1
                }
            },
        };
        &mut self.prefixes[at].1
    }
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

    /// Counts a query of `client` answered from a map unit's prefix of length `len`, of class
    /// `class` of the map's `classes` (the view's: `LocalView::resolver`'s map).
    pub fn count(&self, classes: &[Arc<str>], client: &IpNet, len: u8, class: ClassIdx) {
        let addr = match client.network() {
            IpAddr::V6(a) => a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4),
            v4 => v4,
        };
        let Ok(prefix) = IpNet::new(addr, len).map(|p| p.trunc()) else {
            return;
        };
        let Some(name) = classes.get(usize::from(class)) else {
            return;
        };
        let mut shard = self.shard();
        let table = shard.class_table(usize::from(class), name, || Arc::clone(name));
        self.add(table, prefix, 1);
    }

    fn add(&self, table: &mut HashMap<IpNet, u64, Fx>, prefix: IpNet, n: u64) {
        if let Some(c) = table.get_mut(&prefix) {
            *c += n;
            return;
        }
        if self.prefixes.fetch_add(1, Ordering::Relaxed) >= MAX_TRACKED_PREFIXES {
            self.prefixes.fetch_sub(1, Ordering::Relaxed);
            self.dropped.fetch_add(n, Ordering::Relaxed);
            metrics::counter!("cdnmap_dns_demand_dropped_total").increment(n);
            return;
        }
        table.insert(prefix, n);
    }

    /// Counts a query for hostname `qname`.
    pub fn count_host(&self, qname: &str) {
        let mut guard = self.shard();
        let shard = &mut *guard;
        cdnmap_serve::servers::content_key(qname, &mut shard.key);
        if let Some(c) = shard.hosts.get_mut(shard.key.as_str()) {
            *c += 1;
            return;
        }
        if self.hosts.fetch_add(1, Ordering::Relaxed) >= MAX_TRACKED_HOSTS {
            self.hosts.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        shard.hosts.insert(shard.key.clone(), 1);
    }

    /// Takes the period's prefix counts (the tables start again empty).
    pub fn take(&self) -> Counts {
        let mut merged: HashMap<(IpNet, Arc<str>), u64, Fx> = HashMap::default();
        for shard in &self.shards {
            let taken =
                std::mem::take(&mut shard.lock().unwrap_or_else(|e| e.into_inner()).prefixes);
            for (name, table) in taken {
                self.prefixes.fetch_sub(table.len(), Ordering::Relaxed);
                for (prefix, n) in table {
                    *merged.entry((prefix, Arc::clone(&name))).or_insert(0) += n;
                }
            }
        }
        let mut out: Counts = merged.into_iter().collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// Puts back counts a failed report did not deliver (within the tables' bound).
    pub fn restore(&self, counts: Counts) {
        let mut shard = self.shard();
        for ((prefix, name), n) in counts {
            let table = shard.class_table(usize::MAX, &name, || Arc::clone(&name));
            self.add(table, prefix, n);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("a prefix")
    }

    /// Counts are per (unit prefix, class name), summed over threads; a map that numbers the
    /// classes otherwise counts into the same names; what a failed report gives back is
    /// counted again; the bound on prefixes drops (and counts) what is beyond it.
    #[test]
    fn counts_are_per_prefix_and_class_name_over_threads_and_numberings() {
        let d = DemandCounter::default();
        let one: Vec<Arc<str>> = vec!["web".into(), "video".into()];
        let renumbered: Vec<Arc<str>> = vec!["video".into(), "web".into()];
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        d.count(&one, &net("10.1.2.3/32"), 24, 0);
                        d.count(&one, &net("10.1.2.0/24"), 24, 1);
                        d.count(&renumbered, &net("10.1.2.9/32"), 24, 0);
                        d.count(&one, &net("::ffff:10.9.0.1/128"), 16, 0);
                        d.count(&one, &net("10.1.2.3/32"), 24, 7); // no such class
                    }
                });
            }
        });
        let counts = d.take();
        let get = |p: &str, c: &str| {
            counts
                .iter()
                .find(|((q, n), _)| *q == net(p) && &**n == c)
                .map_or(0, |x| x.1)
        };
        assert_eq!(get("10.1.2.0/24", "web"), 400);
        assert_eq!(get("10.1.2.0/24", "video"), 800);
        assert_eq!(get("10.9.0.0/16", "web"), 400);
        assert_eq!(counts.len(), 3, "{counts:?}");
        assert!(counts.windows(2).all(|w| w[0].1 >= w[1].1), "largest first");
        assert!(d.take().is_empty(), "taken means empty");
        d.restore(counts.clone());
        d.count(&one, &net("10.1.2.3/32"), 24, 0);
        let again = d.take();
        assert_eq!(again.len(), 3);
        assert!(again.contains(&((net("10.1.2.0/24"), "web".into()), 401)));

        for i in 0..(MAX_TRACKED_PREFIXES as u32 + 10) {
            let p = IpNet::new(std::net::Ipv4Addr::from(i << 8).into(), 24).expect("prefix");
            d.count(&one, &p, 24, 0);
        }
        assert_eq!(d.dropped(), 10);
        assert_eq!(d.take().len(), MAX_TRACKED_PREFIXES);
    }

    #[test]
    fn hosts_are_counted_by_content_key() {
        let d = DemandCounter::default();
        for name in ["www.cdn.example.", "WWW.cdn.example.", "img.cdn.example."] {
            d.count_host(name);
        }
        let hosts = d.take_hosts();
        assert_eq!(hosts.iter().map(|h| h.1).sum::<u64>(), 3);
        assert_eq!(hosts[0].1, 2, "{hosts:?}");
    }
}
