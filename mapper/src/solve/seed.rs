//! The warm start's seeding pass (see [`super::solve_seeded`]): in parts by unit range, each
//! on its own thread writing its units' records and home slots, summing the seeded demand per
//! path and grouping the seeded keys by path; then the join in unit order, and the shedding of
//! what no longer fits.
//!
//! Promises: the parts are joined in unit order, so the solve depends on the split only in the
//! last bits of the usage sums (a unit test checks 1, 2 and 3 parts within 1e-9 of each unit's
//! demand); every unit's record and home slot are written (slot `u` is unit `u`'s first);
//! after `seed` every node is within capacity (but for what its tolerance allows), and the units
//! to propose are queued: the seed's overflow units below the others.

use std::mem::MaybeUninit;

use super::key::UNIT_MASK;
use super::options::Arrival;
use super::state::{SeededKeys, Slot, Solver, UnitState, BLANK_SLOT, NONE};
use crate::map::Map;
use crate::model::{ClusterIdx, UnitIdx};
use crate::parts;

/// What one part of a seeding pass found, beyond the unit states and slots it wrote.
pub(super) struct SeedPart {
    pub(super) keys: SeededKeys,
    /// Per path id: the demand seeded on it, and the largest key seeded on it (0: none).
    pub(super) demand: Vec<f64>,
    pub(super) worst: Vec<u64>,
    /// The arrival keys of the units that propose, and of those the seed left in overflow.
    pub(super) pending: Vec<u64>,
    pub(super) late: Vec<u64>,
}

/// The sorted union (with repeats) of two sorted lists.
fn merge_sorted(a: Vec<u64>, b: Vec<u64>) -> Vec<u64> {
    if a.is_empty() {
        return b;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] <= b[j] {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

impl Solver<'_> {
    /// Warm start from `seed` (see [`solve_seeded`]). The pass over the units runs in parts
    /// by unit range ([`parts`]), each on its own thread writing its own units' states and
    /// home slots (slot `u` is unit `u`'s first); the parts' sums and keys are joined in
    /// unit order, so the solve does not depend on the machine.
    pub(super) fn seed(&mut self, seed: &Map, arrival: Arrival) {
        let units = self.inst.unit_count();
        let n = units.min(seed.unit_count());
        // Every unit gets its home slot; a unit not seeded leaves its own unused. The parts
        // write every unit's state and home slot, into memory not written before. The heaps
        // are not built here: a node's heap takes the seeded keys of the paths through it only
        // when a walk may reach them (`heap_above`), which many nodes never need; pushes before
        // that go to the heap as usual, so every walk sees the same keys as on heaps built up
        // front: the solve is the same, only cheaper.
        let mut unit: Vec<UnitState> = Vec::with_capacity(units);
        let mut slots: Vec<Slot> = Vec::with_capacity(units + units / 4);
        // The map read-out's parts: each part's seeded units are its first holdings.
        let bounds = self.read_out_bounds();
        let mut chunks = Vec::with_capacity(bounds.len() - 1);
        let mut unit_rest = &mut unit.spare_capacity_mut()[..units];
        let mut slot_rest = &mut slots.spare_capacity_mut()[..units];
        for w in bounds.windows(2) {
            let (u, u_rest) = std::mem::take(&mut unit_rest).split_at_mut(w[1] - w[0]);
            let (sl, sl_rest) = std::mem::take(&mut slot_rest).split_at_mut(w[1] - w[0]);
            chunks.push((w[0], u, sl));
            (unit_rest, slot_rest) = (u_rest, sl_rest);
        }
        let this = &*self;
        let done = parts::run_parts(chunks, |(from, unit, slots)| {
            this.seed_part(seed, n, arrival, from, unit, slots)
        });
        // SAFETY: the chunks cover elements 0..units of both spare capacities, each part wrote
        // every element of its chunks (`seed_part` writes both for each unit), and every part
        // has returned (a panic in one would have been resumed above, leaving both empty).
        unsafe {
            unit.set_len(units);
            slots.set_len(units);
        }
        self.unit = unit;
        self.slots = slots;
        self.holdings = done.iter().map(|part| part.keys.keys.len()).collect();
        self.map_bounds = bounds;
        let seeded_total = self.seeded_usage(&done);
        let (through, node_paths) = self.paths_through_nodes();
        self.seeded_worst(&done);
        self.node_paths_start = through;
        self.node_paths = node_paths;
        let (mut pending, mut late) = (Vec::new(), Vec::new());
        self.seeded = done
            .into_iter()
            .map(|part| {
                pending = merge_sorted(std::mem::take(&mut pending), part.pending);
                late = merge_sorted(std::mem::take(&mut late), part.late);
                part.keys
            })
            .collect();
        // Shed what no longer fits (demand grew, capacity shrank), children before parents.
        let removed_before = self.removed;
        for c in 0..self.inst.clusters().len() as ClusterIdx {
            for local in (0..self.inst.clusters()[c as usize].nodes.len() as u32).rev() {
                self.shed(c, self.inst.global_node(c, local));
            }
        }
        self.stats.seeded_demand = seeded_total - (self.removed - removed_before);
        // Units the shedding gave demand back to are queued already: they propose last. Before
        // them, the units the seed left in overflow: most are refused by every candidate again,
        // and a refusal made after the others have settled is rarely undone by a later removal,
        // so the blocking-pair scan passes it (`surely_full`) instead of sizing the offer
        // again; fewer of them are accepted and then evicted on the way, too.
        self.queue_sorted(&late);
        self.queue_sorted(&pending);
    }

    /// Adds the demand `done` seeded on each path to its nodes' usage; the total seeded.
    fn seeded_usage(&mut self, done: &[SeedPart]) -> f64 {
        let mut seeded_total = 0.0;
        for part in done {
            for (p, &d) in part.demand.iter().enumerate() {
                if d == 0.0 {
                    continue;
                }
                seeded_total += d;
                for pi in self.paths.start[p] as usize..self.paths.start[p + 1] as usize {
                    self.node[self.paths.node[pi] as usize].used += d * self.paths.coef[pi];
                }
            }
        }
        seeded_total
    }

    /// The paths through each node: where each node's start in the list, and the list.
    fn paths_through_nodes(&self) -> (Vec<u32>, Vec<u32>) {
        let paths = self.paths.start.len() - 1;
        let nodes = self.heap.len();
        let mut through = vec![0u32; nodes + 1];
        for &node in &self.paths.node {
            through[node as usize + 1] += 1;
        }
        for i in 0..nodes {
            through[i + 1] += through[i];
        }
        let mut node_paths = vec![0u32; self.paths.node.len()];
        let mut fill = through.clone();
        for p in 0..paths {
            let (a, b) = (self.paths.start[p], self.paths.start[p + 1]);
            for pi in a as usize..b as usize {
                let node = self.paths.node[pi] as usize;
                node_paths[fill[node] as usize] = p as u32;
                fill[node] += 1;
            }
        }
        (through, node_paths)
    }

    /// Each node's worst seeded key, for `worst_bound` and `unmerged`.
    fn seeded_worst(&mut self, done: &[SeedPart]) {
        let (nodes, paths) = (self.heap.len(), self.paths.start.len() - 1);
        self.unmerged = vec![0; nodes];
        self.merged_worst = vec![false; nodes];
        self.path_worst = vec![None; paths];
        for part in done {
            for (p, &worst) in part.worst.iter().enumerate() {
                if part.keys.of_path(p).is_empty() {
                    continue;
                }
                for pi in self.paths.start[p] as usize..self.paths.start[p + 1] as usize {
                    let n = self.paths.node[pi] as usize;
                    self.node[n].worst_bound = self.node[n].worst_bound.max(worst);
                    self.unmerged[n] = self.unmerged[n].max(worst.saturating_add(1));
                }
            }
        }
    }

    /// One part of the seeding pass: the units from `from` on, whose states are `unit` and
    /// whose home slots are `slots`, every one of which it writes. A unit [`Self::keep_seed`]
    /// keeps is placed whole at its first choice; every other unit's arrival key is taken
    /// here, while the unit is in cache.
    fn seed_part(
        &self,
        seed: &Map,
        n: usize,
        arrival: Arrival,
        from: usize,
        unit: &mut [MaybeUninit<UnitState>],
        slots: &mut [MaybeUninit<Slot>],
    ) -> SeedPart {
        let paths = self.paths.start.len() - 1;
        let mut demand = vec![0.0; paths];
        let mut worst = vec![0u64; paths];
        let mut count = vec![0u32; paths + 1];
        let (mut seeded, mut seeded_path) = (Vec::with_capacity(unit.len()), Vec::new());
        seeded_path.reserve(unit.len());
        let (mut pending, mut late) = (Vec::new(), Vec::new());
        for (local, (state, slot)) in unit.iter_mut().zip(slots.iter_mut()).enumerate() {
            let u = (from + local) as UnitIdx;
            let d = self.inst.demand[u as usize];
            let head = self.first(u);
            let Some((first, key)) = head.filter(|&(c, _)| self.keep_seed(seed, u, n, c)) else {
                state.write(UnitState::unplaced(d));
                slot.write(BLANK_SLOT);
                if d > self.tol(u) {
                    let key = Self::arrival_key(u, head, arrival);
                    if (u as usize) < n && seed.overflow(u) != 0.0 {
                        late.push(key);
                    } else {
                        pending.push(key);
                    }
                }
                continue;
            };
            slot.write(Slot {
                cluster: first,
                next: NONE,
                amount: d,
            });
            state.write(UnitState {
                unplaced: 0.0,
                head: u,
                ..UnitState::unplaced(d)
            });
            let path = self.paths.id(first, self.inst.units.class[u as usize]) as usize;
            demand[path] += d;
            worst[path] = worst[path].max(key);
            count[path] += 1;
            seeded.push(key);
            seeded_path.push(path as u32);
        }
        // Group the keys by path (a counting sort).
        let mut start = Vec::with_capacity(paths + 1);
        let mut acc = 0u32;
        for &c in &count {
            start.push(acc);
            acc += c;
        }
        let mut fill = start.clone();
        let mut keys = vec![0u64; seeded.len()];
        for (&key, &path) in seeded.iter().zip(&seeded_path) {
            let at = &mut fill[path as usize];
            keys[*at as usize] = key;
            *at += 1;
        }
        // Sorted here, on the part's thread: the join only merges.
        pending.sort_unstable();
        late.sort_unstable();
        SeedPart {
            keys: SeededKeys { keys, start },
            demand,
            worst,
            pending,
            late,
        }
    }

    /// Whether unit `u` keeps its place from `seed`: only a unit whose whole demand sat at its
    /// first choice (an up cluster) does; any other unit proposes afresh from its first choice
    /// (its incumbent bonus usually brings it back where it was). Seeded units cannot be in a
    /// blocking pair, and the fresh proposals follow deferred acceptance, so repair has little
    /// left to do. `n`: the units both the instance and the seed have.
    /// `first`: the cluster of its first candidate.
    fn keep_seed(&self, seed: &Map, u: UnitIdx, n: usize, first: ClusterIdx) -> bool {
        if u as usize >= n {
            return false;
        }
        let d = self.inst.demand[u as usize];
        let allocs = seed.allocations(u);
        let at_first = allocs.iter().any(|a| a.cluster == first && a.amount > 0.0);
        let elsewhere =
            allocs.iter().any(|a| a.cluster != first && a.amount != 0.0) || seed.overflow(u) != 0.0;
        at_first && !elsewhere && self.up[first as usize] && d > 0.0
    }

    /// Evicts the holders node `n` of cluster `c` likes least until it is within capacity.
    fn shed(&mut self, c: ClusterIdx, n: usize) {
        let mut last = u64::MAX;
        loop {
            let excess = self.node[n].used - self.node[n].cap;
            if excess <= self.node_tol(n) {
                return;
            }
            let Some(top) = self.heap_above(n, None).pop() else {
                return;
            };
            let v = (top & UNIT_MASK) as UnitIdx;
            let amount = self.held(v, c);
            if top == last || amount <= 0.0 {
                continue; // duplicate or stale
            }
            last = top;
            let q = self.node_coef(n, v);
            if q <= 0.0 {
                continue;
            }
            self.stats.evictions += 1;
            if amount * q <= excess + self.node_tol(n) {
                self.evict(v, c, amount, top);
            } else {
                self.evict(v, c, excess / q, top);
                self.heap[n].push(top);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::UnitIdx;
    use crate::solve::tests::two_class_world;
    use crate::solve::{seeded_in_parts, solve, SolveOptions};

    #[test]
    fn merging_sorted_lists_sorts_their_union() {
        let cases: [(Vec<u64>, Vec<u64>); 4] = [
            (vec![], vec![3, 5]),
            (vec![1, 4, 9], vec![]),
            (vec![1, 4, 4, 9], vec![0, 4, 10, 11]),
            (vec![7], vec![2, 3]),
        ];
        for (a, b) in cases {
            let mut want = [a.clone(), b.clone()].concat();
            want.sort_unstable();
            assert_eq!(merge_sorted(a, b), want);
        }
    }

    /// A seeded solve split into 1, 2 or 3 parts (its seeding pass and its blocking-pair
    /// scan) finds the same map, up to the rounding of the usage sums, and each is stable for
    /// the effective preferences.
    #[test]
    fn the_parts_do_not_change_a_seeded_solve() {
        let options = SolveOptions::default();
        let first = two_class_world(5, |_| 1.0);
        let cold = solve(&first, &options);
        assert!(cold.map.total_overflow() > 1.0, "the world must overflow");
        // The same world, demand moved by up to ±10%.
        let next = two_class_world(5, |u| 1.0 + 0.1 * ((u * 7919 % 201) as f64 / 100.0 - 1.0));
        let eff = crate::sticky::favour_incumbents(&next, &cold.map, &Default::default())
            .expect("effective preferences");
        let one = seeded_in_parts(&eff, &cold.map, &options, Some(1));
        assert!(one.stats.proposals > 100, "{:?}", one.stats);
        for parts in [1, 2, 3] {
            let got = seeded_in_parts(&eff, &cold.map, &options, Some(parts));
            let report = crate::verify::verify(&eff, &got.map);
            assert!(
                report.is_ok(),
                "{parts} parts: {}",
                report.describe(&eff, 5)
            );
            for u in 0..eff.unit_count() as UnitIdx {
                let tol = 1e-9 * eff.demand[u as usize];
                let (a, b) = (one.map.allocations(u), got.map.allocations(u));
                assert_eq!(a.len(), b.len(), "{parts} parts, unit {u}");
                for (x, y) in a.iter().zip(b) {
                    assert!(x.cluster == y.cluster && (x.amount - y.amount).abs() <= tol);
                }
                assert!((one.map.overflow(u) - got.map.overflow(u)).abs() <= tol);
            }
        }
    }
}
