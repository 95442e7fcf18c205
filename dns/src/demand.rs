//! What the front end saw: queries per (map-unit prefix, class) for Feedback.ReportDemand, and
//! queries per hostname for bounded-loads selection. Both are bounded; counts beyond the bound
//! are dropped and counted, never grown without limit.
//!
//! A query answered from the view in use is counted by its slot in the view's prefix index (an
//! atomic add into an array as long as the index, `SlotCounts`); the slots are named (prefix,
//! class) when the period is taken. What cannot be counted so (a block begun on a view just
//! replaced, counts a failed report gives back, a counter past 2^31) goes to tables keyed by
//! prefix. Either way a period's counts are the same.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use cdnmap_mapper::mem::prefetch;
use cdnmap_mapper::ClassIdx;
use cdnmap_serve::resolve::{Answer, Resolver, SlotNames};
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

/// A count at or above this moves to the keyed tables ([`SlotCounts::spill`]), so a slot's
/// counter never wraps however long a period runs.
const SPILL: u32 = 1 << 31;

/// Counts by slot of one prefix index ([`SlotNames`]: a (prefix group, class) each): a query's
/// count is one atomic add into an array, where the keyed tables cost a hash probe by prefix
/// and its cache misses (6% of the front end's CPU under dnsperf at 1 M map units). One array
/// for all answering threads: 4 bytes a slot, 44 MB at 11 M map units.
#[derive(Debug)]
struct SlotCounts {
    names: SlotNames,
    counts: Box<[AtomicU32]>,
}

impl SlotCounts {
    fn new(names: SlotNames) -> Self {
        let counts = std::iter::repeat_with(|| AtomicU32::new(0))
            .take(names.len())
            .collect();
        SlotCounts { names, counts }
    }

    /// The counts (each taken, left 0) that are not 0, by slot.
    fn drain(&self, out: &mut Vec<(u32, u32)>) {
        for (slot, c) in self.counts.iter().enumerate() {
            if c.load(Ordering::Relaxed) != 0 {
                // Slots are u32 (`Answer::slot`).
                out.push((slot as u32, c.swap(0, Ordering::Relaxed)));
            }
        }
    }
}

#[derive(Debug)]
pub struct DemandCounter {
    shards: Vec<Mutex<Shard>>,
    /// Keys held over all shards (the bound is on this).
    prefixes: AtomicUsize,
    hosts: AtomicUsize,
    dropped: AtomicU64,
    /// The counts by slot of the view in use ([`Self::prepare`]).
    slots: ArcSwapOption<SlotCounts>,
    /// Slot arrays of views no longer in use, drained at the next two takes (an answering
    /// thread may have loaded one just before it was replaced, and add to it for the length of
    /// a block) and then dropped. The lock also puts `prepare` and `take` one after the other.
    retired: Mutex<Vec<(Arc<SlotCounts>, u8)>>,
}

impl Default for DemandCounter {
    fn default() -> Self {
        DemandCounter {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            prefixes: AtomicUsize::new(0),
            hosts: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            slots: ArcSwapOption::empty(),
            retired: Mutex::default(),
        }
    }
}

/// What one block of answers from one resolver counts into ([`DemandCounter::block`]).
pub struct BlockCounts<'a> {
    counter: &'a DemandCounter,
    resolver: &'a Resolver,
    /// The slot array, when it numbers the resolver's slots.
    slots: Option<arc_swap::Guard<Option<Arc<SlotCounts>>>>,
}

impl BlockCounts<'_> {
    /// Starts loading the counter `a` will add to (a hint, as `prefetch`).
    #[inline]
    pub fn prefetch(&self, a: &Answer) {
        if let (Some(Some(slots)), Some(slot)) = (self.slots.as_deref(), a.slot) {
            prefetch(&slots.counts, slot as usize);
        }
    }

    /// Counts a query from `client` answered `a` (nothing for a client outside every unit).
    #[inline]
    pub fn count(&self, client: &IpNet, a: &Answer) {
        if a.unit.is_none() {
            return;
        }
        if let (Some(Some(slots)), Some(slot)) = (self.slots.as_deref(), a.slot) {
            if let Some(c) = slots.counts.get(slot as usize) {
                if c.fetch_add(1, Ordering::Relaxed) >= SPILL {
                    self.counter.spill(slots, slot);
                }
                return;
            }
        }
        self.counter
            .count(self.resolver.map().classes(), client, a.prefix_len, a.class);
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

    fn retired(&self) -> std::sync::MutexGuard<'_, Vec<(Arc<SlotCounts>, u8)>> {
        self.retired.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts by `resolver`'s slots from now on (called as its view is put in use, before the
    /// answering threads see it): a new array when the one in use numbers another index (the
    /// map's units or classes changed), else nothing.
    pub fn prepare(&self, resolver: &Resolver) {
        let mut retired = self.retired();
        if let Some(current) = self.slots.load().as_deref() {
            if current.names.fit(resolver) {
                return;
            }
        }
        let fresh = Arc::new(SlotCounts::new(resolver.slot_names()));
        if let Some(old) = self.slots.swap(Some(fresh)) {
            retired.push((old, 0));
        }
    }

    /// The counts of one block of answers from `resolver`: by slot when the array in use
    /// numbers its slots (the usual case), else keyed by prefix (a block that began on a
    /// view just replaced).
    pub fn block<'a>(&'a self, resolver: &'a Resolver) -> BlockCounts<'a> {
        let slots = self.slots.load();
        let fits = slots.as_deref().is_some_and(|s| s.names.fit(resolver));
        BlockCounts {
            counter: self,
            resolver,
            slots: fits.then_some(slots),
        }
    }

    /// Moves [`SPILL`] of a slot's count to the keyed tables, if it still holds that much (two
    /// threads may both see it cross).
    #[cold]
    fn spill(&self, slots: &SlotCounts, slot: u32) {
        let Some(c) = slots.counts.get(slot as usize) else {
            return;
        };
        let mut now = c.load(Ordering::Relaxed);
        while now >= SPILL {
            match c.compare_exchange_weak(now, now - SPILL, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    if let Some((prefix, name)) = slots.names.name(slot) {
                        let mut shard = self.shard();
                        let table = shard.class_table(usize::MAX, name, || Arc::clone(name));
                        self.add(table, prefix, u64::from(SPILL));
                    }
                    return;
                }
                Err(seen) => now = seen,
            }
        }
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
        let key = cdnmap_serve::servers::content_key(qname, &mut shard.key);
        if let Some(c) = shard.hosts.get_mut(key) {
            *c += 1;
            return;
        }
        if self.hosts.fetch_add(1, Ordering::Relaxed) >= MAX_TRACKED_HOSTS {
            self.hosts.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        shard.hosts.insert(key.to_string(), 1);
    }

    /// Takes the period's prefix counts (the tables start again empty). At most
    /// [`MAX_TRACKED_PREFIXES`] of each slot array's counts are taken, the largest, and at most
    /// twice that in all (the keyed tables hold as many more); the rest are dropped (and
    /// counted), as the keyed tables drop what is beyond their bound.
    pub fn take(&self) -> Counts {
        let mut merged: HashMap<(IpNet, Arc<str>), u64, Fx> = HashMap::default();
        {
            let mut retired = self.retired();
            let mut by_slot = Vec::new();
            let current = self.slots.load_full();
            for slots in current.iter().chain(retired.iter().map(|(s, _)| s)) {
                by_slot.clear();
                slots.drain(&mut by_slot);
                self.keep_largest(&mut by_slot);
                for &(slot, n) in &by_slot {
                    if let Some((prefix, name)) = slots.names.name(slot) {
                        *merged.entry((prefix, Arc::clone(name))).or_insert(0) += u64::from(n);
                    }
                }
            }
            retired.retain_mut(|(_, takes)| {
                *takes += 1;
                *takes < 2
            });
        }
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
        // The slot arrays' counts (each bounded) and the keyed tables' together: the largest.
        if out.len() > 2 * MAX_TRACKED_PREFIXES {
            let dropped: u64 = out[2 * MAX_TRACKED_PREFIXES..].iter().map(|x| x.1).sum();
            out.truncate(2 * MAX_TRACKED_PREFIXES);
            self.dropped.fetch_add(dropped, Ordering::Relaxed);
            metrics::counter!("cdnmap_dns_demand_dropped_total").increment(dropped);
        }
        out
    }

    /// Keeps the [`MAX_TRACKED_PREFIXES`] largest of `by_slot`, counting the rest dropped.
    fn keep_largest(&self, by_slot: &mut Vec<(u32, u32)>) {
        if by_slot.len() <= MAX_TRACKED_PREFIXES {
            return;
        }
        by_slot.select_nth_unstable_by(MAX_TRACKED_PREFIXES, |a, b| b.1.cmp(&a.1));
        let dropped: u64 = by_slot[MAX_TRACKED_PREFIXES..]
            .iter()
            .map(|&(_, n)| u64::from(n))
            .sum();
        by_slot.truncate(MAX_TRACKED_PREFIXES);
        self.dropped.fetch_add(dropped, Ordering::Relaxed);
        metrics::counter!("cdnmap_dns_demand_dropped_total").increment(dropped);
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

    /// A resolver over `units` (id, class, prefix; each wholly at cluster `a`) of classes web
    /// and video (`*.video.example` is video).
    fn resolver(units: &[(&str, ClassIdx, &str)], previous: Option<&Resolver>) -> Resolver {
        use cdnmap_mapper::model::ClusterState;
        use cdnmap_serve::resolve::ClassRules;
        use cdnmap_serve::serving::{Builder, ServingCluster};
        let classes: Vec<Arc<str>> = vec!["web".into(), "video".into()];
        let a = ServingCluster {
            id: "a".into(),
            addresses: vec!["192.0.2.1".parse().expect("an address")],
            state: ClusterState::Up,
        };
        let mut b = Builder::new(classes.clone(), vec![a]).expect("clusters");
        for &(id, class, prefix) in units {
            b.push(id, class, [net(prefix)], [(0, 1.0)], 0.0, [None, None])
                .expect(id);
        }
        b.set_fallback(&[[Some(0), None], [Some(0), None]]);
        let rules = [("*.video.example".to_string(), "video".to_string())];
        let rules = ClassRules::new(&classes, &rules, "web").expect("rules");
        Resolver::new_after(Arc::new(b.finish()), rules, previous).expect("indexed")
    }

    /// Counted by slot (an array per prefix index) or keyed by prefix, the same counts: through
    /// a new map of the same units (the same array), a map of other units (a new array, the
    /// old one's counts still taken) and a block begun on the view just replaced (keyed).
    #[test]
    fn counts_by_slot_are_the_keyed_counts_through_view_changes() {
        let units = [
            ("u1", 0, "10.1.2.0/24"),
            ("u2", 1, "10.1.2.0/24"),
            ("u3", 0, "2001:db8::/32"),
            ("u4", 0, "::ffff:10.9.0.0/112"),
            ("u5", 1, "10.1.0.0/16"),
        ];
        let r1 = resolver(&units, None);
        let r1b = resolver(&units, Some(&r1));
        let r2 = resolver(&[("v1", 1, "10.1.2.0/23"), ("v2", 0, "10.1.2.0/24")], None);
        let queries = [
            ("10.1.2.3/32", "www.example."),
            ("10.1.2.0/24", "x.video.example."),
            ("10.1.3.0/24", "x.video.example."),
            ("2001:db8::1/128", "www.example."),
            ("::ffff:10.9.0.1/128", "www.example."),
            ("10.9.0.0/24", "www.example."),
            ("192.0.2.1/32", "www.example."), // outside every prefix
        ];
        let by_slot = DemandCounter::default();
        let keyed = DemandCounter::default();
        let ask = |d: &DemandCounter, r: &Resolver, times: usize| {
            let block = d.block(r);
            for (client, qname) in queries {
                let a = r.resolve(net(client), qname);
                for _ in 0..times {
                    block.prefetch(&a);
                    block.count(&net(client), &a);
                }
            }
        };
        by_slot.prepare(&r1);
        let first = by_slot.slots.load_full().expect("an array");
        ask(&by_slot, &r1, 3);
        ask(&keyed, &r1, 3);
        by_slot.prepare(&r1b);
        let same = by_slot.slots.load_full().expect("an array");
        assert!(Arc::ptr_eq(&first, &same), "the same units share one array");
        ask(&by_slot, &r1b, 2);
        ask(&keyed, &r1b, 2);
        by_slot.prepare(&r2);
        ask(&by_slot, &r1, 1); // a block begun on the old view: keyed
        ask(&keyed, &r1, 1);
        ask(&by_slot, &r2, 4);
        ask(&keyed, &r2, 4);
        assert_eq!(
            first
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .sum::<u32>(),
            6 * (3 + 2)
        );
        let counted = by_slot.take();
        let get = |p: &str, c: &str| {
            counted
                .iter()
                .find(|((q, n), _)| *q == net(p) && &**n == c)
                .map_or(0, |x| x.1)
        };
        assert_eq!(get("10.1.2.0/24", "web"), 3 + 2 + 1 + 4); // r1, r1b, r1 keyed, r2's v2
        assert_eq!(get("10.9.0.0/16", "web"), 2 * (3 + 2 + 1));
        // 10.1.2.0/24's video client falls in v2's prefix, which has no video unit: no demand.
        assert_eq!(get("10.1.2.0/23", "video"), 4);
        assert_eq!(counted, keyed.take());
        assert_eq!(by_slot.retired().len(), 1, "kept for one more take");
        assert!(by_slot.take().is_empty(), "taken means empty");
        assert!(by_slot.retired().is_empty(), "dropped after two");
    }

    /// A slot's counter never wraps: past 2^31 the count moves to the keyed tables.
    #[test]
    fn a_slot_count_past_two_to_the_31_spills_whole() {
        let r = resolver(&[("u1", 0, "10.1.2.0/24")], None);
        let d = DemandCounter::default();
        d.prepare(&r);
        let a = r.resolve(net("10.1.2.3/32"), "www.example.");
        let slots = d.slots.load_full().expect("an array");
        let slot = a.slot.expect("a slot") as usize;
        slots.counts[slot].store(SPILL + 5, Ordering::Relaxed);
        let block = d.block(&r);
        for _ in 0..3 {
            block.count(&net("10.1.2.3/32"), &a);
        }
        assert!(slots.counts[slot].load(Ordering::Relaxed) < SPILL);
        let counted = d.take();
        assert_eq!(
            counted,
            vec![((net("10.1.2.0/24"), "web".into()), u64::from(SPILL) + 8)]
        );
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
