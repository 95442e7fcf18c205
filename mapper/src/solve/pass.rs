//! The proposal pass: units proposing from the stack until none has demand left to offer, an
//! offer sized over the candidate's path (free capacity plus what worse holders could give up,
//! stopping at the first node that leaves no more than the unit's tolerance), the evictions it
//! makes (leaf first, least liked first), and the closing of a pair.
//!
//! Promises: a pass makes at most one closing offer per candidate plus one offer per eviction,
//! and at most [`proposal_bound`] offers in all (past it, what is unplaced stays overflow);
//! between offers every scratch list is empty; a unit evicted more than
//! [`EVICTIONS_BEFORE_WHOLE`] times is evicted whole, so a rejection rotation turns in one step.

use super::key::{NEWCOMER, UNIT_MASK};
use super::options::{proposal_bound, Arrival};
use super::state::{Solver, UnitState};
use crate::model::{ClusterIdx, UnitIdx};

/// After this many evictions of one unit in a solve, its holdings are evicted whole (see
/// `Solver::evict`).
const EVICTIONS_BEFORE_WHOLE: u8 = 64;

impl Solver<'_> {
    /// Queues every unit, in the order of the key its first candidate gives it (class
    /// priority, then rank, then id): units a cluster likes best propose first, so few are
    /// evicted later. The order changes the work, not the result where the result is unique.
    pub(super) fn push_all(&mut self, arrival: Arrival) {
        self.unit = self
            .inst
            .demand
            .iter()
            .map(|&d| UnitState::unplaced(d))
            .collect();
        let n = self.inst.unit_count() as UnitIdx;
        self.slots = Vec::with_capacity(n as usize + n as usize / 4);
        self.map_bounds = self.read_out_bounds();
        self.holdings = vec![0; self.map_bounds.len() - 1];
        self.queue_in_order(0..n, arrival);
    }

    fn queue_in_order(&mut self, units: impl Iterator<Item = UnitIdx>, arrival: Arrival) {
        let order: Vec<u64> = units
            .map(|u| Self::arrival_key(u, self.first(u), arrival))
            .collect();
        self.queue_keys(order);
    }

    /// Queues the units of `order` (their [`Self::arrival_key`]s), lowest key first.
    fn queue_keys(&mut self, mut order: Vec<u64>) {
        order.sort_unstable();
        self.queue_sorted(&order);
    }

    /// [`Self::queue_keys`] for keys sorted already.
    pub(super) fn queue_sorted(&mut self, order: &[u64]) {
        for &k in order.iter().rev() {
            let u = (k & UNIT_MASK) as UnitIdx;
            self.unit[u as usize].queued = true;
            self.stack.push(u);
        }
    }

    /// Drains the stack of units with unplaced demand.
    pub(super) fn run(&mut self) {
        let bound = self.stats.proposals + proposal_bound(self.inst);
        while let Some(u) = self.stack.pop() {
            self.prefetch_ahead();
            self.unit[u as usize].queued = false;
            if self.stats.proposals >= bound {
                self.stats.proposal_bound_hit = true;
                continue; // what is unplaced stays unplaced: reported as overflow
            }
            self.propose(u);
        }
    }

    fn propose(&mut self, u: UnitIdx) {
        let range = self.inst.candidate_range(u);
        let tol = self.tol(u);
        while self.unit[u as usize].unplaced > tol
            && usize::from(self.unit[u as usize].next) < range.len()
        {
            let i = range.start + usize::from(self.unit[u as usize].next);
            if !self.offer(u, i) {
                self.advance(u);
            }
        }
    }

    /// Offers all of `u`'s unplaced demand to its candidate at arena index `i`; returns whether
    /// all of it was accepted.
    fn offer(&mut self, u: UnitIdx, i: usize) -> bool {
        let x = self.unit[u as usize].unplaced;
        let accept = self.take(u, i, x);
        if accept >= x {
            self.unit[u as usize].unplaced = 0.0;
            true
        } else {
            self.unit[u as usize].unplaced = x - accept;
            false
        }
    }

    /// The cluster at arena index `i` takes as much as it can of `x` of unit `u`'s demand,
    /// evicting holders it likes less; returns the amount placed (the caller takes it from
    /// wherever it was).
    pub(super) fn take(&mut self, u: UnitIdx, i: usize, x: f64) -> f64 {
        self.stats.proposals += 1;
        let (c, newcomer) = self.inst.cand_cluster_newcomer(u, i);
        let path = self.paths.range(c, self.inst.units.class[u as usize]);
        let accept = self.size_offer(u, i, x, (c, newcomer, path.clone()));
        if accept <= self.tol(u) {
            self.restore_scratch(path);
            return 0.0;
        }

        // Evict, leaf first, the least-liked holders until `accept` fits at every node.
        for (p, pi) in path.clone().enumerate() {
            let (n, q) = (self.paths.node[pi] as usize, self.paths.coef[pi]);
            let mut entries = std::mem::take(&mut self.scratch[p]);
            for &e in &entries {
                let need = accept * q - (self.node[n].cap - self.node[n].used);
                if need <= self.node_tol(n) {
                    self.heap[n].push(e);
                    continue;
                }
                let v = (e & UNIT_MASK) as UnitIdx;
                let amount = self.held(v, c);
                if amount <= 0.0 {
                    continue; // evicted in full at a node below
                }
                let qv = self.node_coef(n, v);
                self.stats.evictions += 1;
                if amount * qv <= need + self.node_tol(n) {
                    self.evict(v, c, amount, e);
                } else {
                    self.evict(v, c, need / qv, e);
                    self.heap[n].push(e);
                }
            }
            entries.clear();
            self.scratch[p] = entries;
        }

        let pos = i - self.inst.candidate_range(u).start;
        self.add(u, c, pos, Some(self.key(u, i)), accept);
        accept
    }

    /// How much of `x` of unit `u` the cluster at arena index `i` could hold if it evicted
    /// holders it likes less: the minimum over the path of (free + worse holders' usage) / the
    /// unit's coefficient. The worse holders it counted are left popped in `scratch`, for
    /// [`Self::take`] to evict or [`Self::restore_scratch`] to put back. `target`: the
    /// candidate's cluster, whether `u` is a newcomer there, and the path of `u`'s class.
    ///
    /// Every caller tells only whether the answer is above `u`'s tolerance, so once a node
    /// leaves no more than that the rest of the path is not looked at: most offers of a warm
    /// round's overflow are refused at their first full node.
    fn size_offer(
        &mut self,
        u: UnitIdx,
        i: usize,
        x: f64,
        (c, newcomer, path): (ClusterIdx, bool, std::ops::Range<usize>),
    ) -> f64 {
        // Between offers the scratch lists are empty: `take` and `restore_scratch` empty them.
        debug_assert!(self.scratch.iter().all(Vec::is_empty));
        if !self.up[c as usize] {
            return 0.0;
        }
        let tol = self.tol(u);
        // The key is computed only when some node has to compare it (it reads the candidate's
        // rank, often the one cache miss of a rejection).
        let mut key = None;
        // At each node, free capacity plus what worse holders could give up.
        let mut accept = x;
        for (p, pi) in path.enumerate() {
            if accept <= tol {
                break;
            }
            let (n, q) = (self.paths.node[pi] as usize, self.paths.coef[pi]);
            let free = self.node[n].cap - self.node[n].used;
            let need = x * q - free;
            if need <= self.node_tol(n) {
                continue;
            }
            let Some(key) = self.may_hold_worse(n, u, i, newcomer, &mut key) else {
                accept = accept.min((free / q).max(0.0));
                continue;
            };
            let mut got = 0.0;
            let mut last = u64::MAX;
            while got < need {
                let heap = self.heap_above(n, Some(key));
                let Some(&top) = heap.peek() else {
                    break;
                };
                if top <= key {
                    break;
                }
                heap.pop();
                if top == last {
                    continue; // a duplicate entry of the unit just taken
                }
                let v = (top & UNIT_MASK) as UnitIdx;
                let amount = self.held(v, c);
                if amount <= 0.0 {
                    continue; // stale: v no longer holds anything here
                }
                last = top;
                got += amount * self.node_coef(n, v);
                self.scratch[p].push(top);
            }
            accept = accept.min(((free + got) / q).max(0.0));
        }
        accept
    }

    /// Whether node `n` may hold units it likes less than `u` (reached through its candidate at
    /// arena index `i`): `None` when it surely holds none, so an offer gets only its free
    /// capacity there; else `u`'s key, to compare with the heap. `key` caches the key (it reads
    /// the candidate's rank, often the one cache miss of a rejection).
    #[inline]
    pub(super) fn may_hold_worse(
        &self,
        n: usize,
        u: UnitIdx,
        i: usize,
        newcomer: bool,
        key: &mut Option<u64>,
    ) -> Option<u64> {
        if newcomer && self.node[n].worst_bound < NEWCOMER {
            return None; // only incumbents hold capacity here, and it likes them all better
        }
        let key = *key.get_or_insert_with(|| self.key(u, i));
        // At or above the bound, no holder here is worse than `u`: the heap would stop at its
        // top.
        (self.node[n].worst_bound > key).then_some(key)
    }

    /// Puts the entries [`Self::size_offer`] popped back into their heaps.
    fn restore_scratch(&mut self, path: std::ops::Range<usize>) {
        for (p, pi) in path.enumerate() {
            if self.scratch[p].is_empty() {
                continue; // most refusals take nothing off a heap
            }
            let n = self.paths.node[pi] as usize;
            for e in self.scratch[p].drain(..) {
                self.heap[n].push(e);
            }
        }
    }

    /// How much more of `u` (up to `x`) its candidate at arena index `i` could take — the same
    /// sizing an offer makes, so a pair found blocking here is one an offer will improve.
    #[inline]
    pub(super) fn room_for(&mut self, u: UnitIdx, i: usize, x: f64) -> f64 {
        let (c, newcomer) = self.inst.cand_cluster_newcomer(u, i);
        let path = self.paths.range(c, self.inst.units.class[u as usize]);
        let room = self.size_offer(u, i, x, (c, newcomer, path.clone()));
        self.restore_scratch(path);
        room
    }

    /// A cluster evicts `amount` of `v`: as DESIGN.md has it, the evicted demand "moves on to its
    /// next candidate", so if `c` is where `v` is proposing now, the pair closes and `v`'s
    /// pointer moves past it. Without this, mixed Bps/Fps proportions let two units evict each
    /// other back and forth in ever smaller amounts (the squeeze of one frees the other's
    /// binding resource); with it, every eviction closes a pair and the pass stays linear.
    ///
    /// Fractional demand has one more trap: a *rejection rotation* (x evicts a little of a, a
    /// evicts as much of b at y, b of c at z, c comes back to x and evicts a again) moves the
    /// same small amount around the loop again and again, so the offers grow like demand / δ.
    /// A unit evicted more than [`EVICTIONS_BEFORE_WHOLE`] times in one solve is therefore
    /// evicted whole from then on: the loop then turns in one step. Taking more than was
    /// needed can leave room a unit would use: the repair rounds find and fix that, and the
    /// verifier checks the end result as always.
    #[inline]
    pub(super) fn evict(&mut self, v: UnitIdx, c: ClusterIdx, amount: f64, key: u64) {
        let range = self.inst.candidate_range(v);
        let at = range.start + usize::from(self.unit[v as usize].next);
        if at < range.end && self.inst.cand_cluster(v, at) == c {
            self.advance(v);
        }
        let count = &mut self.unit[v as usize].evicted;
        *count = count.saturating_add(1);
        let amount = if *count > EVICTIONS_BEFORE_WHOLE {
            let held = self.held(v, c);
            if held > amount {
                self.stats.whole_evictions += 1;
            }
            held
        } else {
            amount
        };
        self.remove(v, c, amount, key);
    }

    /// Moves `u`'s proposal pointer past its current candidate (the pair closes).
    fn advance(&mut self, u: UnitIdx) {
        if self.unit[u as usize].next == 0 {
            self.moved.push((u, self.epoch));
        }
        self.unit[u as usize].next += 1;
    }
}

#[cfg(test)]
mod tests {
    use crate::model::Limits;
    use crate::solve::{solve, Arrival, SolveOptions};
    use crate::testing::parse_instance;

    /// DESIGN.md's worked example: 20 units of video arrive, then 26 of apps; the Fps node B
    /// would need 31, so 4 units of video are evicted to their next candidate and all apps fit.
    #[test]
    fn worked_eviction_example() {
        let json = r#"{
          "traffic_classes": [
            {"name": "video", "priority": 1, "per_unit": {"bps": 1.0, "fps": 0.25}},
            {"name": "apps", "priority": 0, "per_unit": {"bps": 0.25, "fps": 1.0}}],
          "clusters": [
            {"id": "c1", "lat": 0, "lon": 0, "resources":
              {"name": "A", "kind": "bps", "capacity": 26.5, "children": [
                {"name": "B", "kind": "fps", "capacity": 30, "children": [
                  {"name": "video", "kind": "fps", "capacity": 1000, "classes": ["video"]},
                  {"name": "apps", "kind": "fps", "capacity": 1000, "classes": ["apps"]}]}]}},
            {"id": "c2", "lat": 0, "lon": 0, "resources":
              {"name": "root", "kind": "bps", "capacity": 1000, "classes": ["video"]}}],
          "map_units": [
            {"id": "1-video", "class": "video", "demand": 20, "lat": 0, "lon": 0,
             "candidates": [{"cluster": "c1", "score": 5}, {"cluster": "c2", "score": 9}]},
            {"id": "2-apps", "class": "apps", "demand": 26, "lat": 0, "lon": 0,
             "candidates": [{"cluster": "c1", "score": 5}]}]
        }"#;
        let inst = parse_instance(json.as_bytes(), Limits::default()).expect("valid instance");
        // Arrival by id replays the story: video ("1-video") proposes first.
        let by_id = SolveOptions {
            arrival: Arrival::Id,
            ..SolveOptions::default()
        };
        let sol = solve(&inst, &by_id);
        let video = inst.unit_index("1-video").expect("unit");
        let apps = inst.unit_index("2-apps").expect("unit");
        let c1 = inst.cluster_index("c1").expect("cluster");
        let c2 = inst.cluster_index("c2").expect("cluster");
        let got = |u| {
            sol.map
                .allocations(u)
                .iter()
                .map(|a| (a.cluster, a.amount))
                .collect::<Vec<_>>()
        };
        assert_eq!(got(video), vec![(c1, 16.0), (c2, 4.0)]);
        assert_eq!(got(apps), vec![(c1, 26.0)]);
        assert_eq!(sol.map.total_overflow(), 0.0);
        assert_eq!(sol.stats.evictions, 1);
        assert_eq!(sol.stats.blocking_pairs_left, 0);
        // The default arrival order (apps first: the cluster prefers them) gets the same map
        // without evicting anyone.
        let fast = solve(&inst, &SolveOptions::default());
        assert_eq!(fast.map, sol.map);
        assert_eq!(fast.stats.evictions, 0);
    }
}
