//! The heaps of a seeded solve and their merge protocol: a node's heap takes the seeded
//! holders' keys of the paths through it only when a walk may reach them, first each path's
//! `WORST_KEPT` worst ([`Solver::merge_worst`]), then the rest ([`Solver::heap_mut`]).
//!
//! Promises: a walk over a node's entries above a key ([`Solver::heap_above`]) pops the same
//! entries in the same order as on the heap with every seeded key merged up front (a unit
//! test checks the whole solve, with 1, 2 and 8 kept per path); `unmerged[n] - 1` bounds the
//! seeded keys not in node `n`'s heap yet (none when it is 0).

use std::collections::BinaryHeap;

use super::state::Solver;

impl Solver<'_> {
    /// Node `n`'s heap, for the next step of a walk over the entries above `key`: its top is
    /// the largest entry there is. The seeded keys are merged in only once the walk may reach
    /// them: not while none is above `key` (a newcomer's offer, above every seeded incumbent,
    /// never merges), nor while the top of what was pushed is at least the largest of them (an
    /// incumbent's offer that the newcomers held there make room for); and then in two steps,
    /// each path's worst few first ([`Self::merge_worst`]), the rest once the walk goes below
    /// them. `key`: `None` for a walk over every entry (shedding). The walk pops the same
    /// entries in the same order as on the merged heap.
    #[inline]
    pub(super) fn heap_above(&mut self, n: usize, key: Option<u64>) -> &mut BinaryHeap<u64> {
        // `m - 1` bounds the seeded keys left out (none when `m` is 0).
        let m = self.unmerged.get(n).copied().unwrap_or(0);
        let floor = key.map_or(0, |k| k.saturating_add(1));
        if m > floor && self.heap[n].peek().is_none_or(|&top| top < m - 1) {
            if !self.merged_worst[n] {
                self.merge_worst(n);
                return self.heap_above(n, key);
            }
            return self.heap_mut(n);
        }
        &mut self.heap[n]
    }

    /// Pushes the worst few seeded keys of each path through node `n` onto its heap (at most
    /// `WORST_KEPT` a path, found once per path), and lowers `unmerged` to the least of them
    /// where a path has more: a walk that stops before that (shedding one or two holders, an
    /// offer making room by evicting a few) needs no more of them.
    fn merge_worst(&mut self, n: usize) {
        self.merged_worst[n] = true;
        let (a, b) = (self.node_paths_start[n], self.node_paths_start[n + 1]);
        let mut below = 0;
        for pi in a as usize..b as usize {
            let p = self.node_paths[pi] as usize;
            if self.path_worst[p].is_none() {
                let kept = self.worst_kept.max(1);
                let mut worst: Vec<u64> = Vec::with_capacity(kept + 1);
                let mut more = false;
                for part in &self.seeded {
                    for &k in part.of_path(p) {
                        if worst.len() == kept && worst.last().is_some_and(|&w| k <= w) {
                            more = true;
                            continue;
                        }
                        let at = worst.partition_point(|&w| w > k);
                        worst.insert(at, k);
                        if worst.len() > kept {
                            worst.pop();
                            more = true;
                        }
                    }
                }
                let least = if more { worst[worst.len() - 1] } else { 0 };
                self.path_worst[p] = Some((worst, least));
            }
            if let Some((worst, least)) = &self.path_worst[p] {
                self.heap[n].extend(worst.iter().copied());
                below = below.max(*least);
            }
        }
        // The keys left out are below `below`: `m - 1` bounds them, as `heap_above` reads it.
        self.unmerged[n] = below;
    }

    /// Node `n`'s heap, with the seeded holders' keys merged in on first use (see
    /// [`Self::seed`]).
    fn heap_mut(&mut self, n: usize) -> &mut BinaryHeap<u64> {
        if self.unmerged.get(n).is_some_and(|&m| m != 0) {
            self.unmerged[n] = 0;
            let mut entries = std::mem::take(&mut self.heap[n]).into_vec();
            let (a, b) = (self.node_paths_start[n], self.node_paths_start[n + 1]);
            for &p in &self.node_paths[a as usize..b as usize] {
                // After `merge_worst`, only the keys below each path's worst few are left.
                let below = match &self.path_worst[p as usize] {
                    Some((_, least)) if self.merged_worst[n] => *least,
                    _ => u64::MAX,
                };
                for part in &self.seeded {
                    let keys = part.of_path(p as usize);
                    if below == u64::MAX {
                        entries.extend_from_slice(keys);
                    } else {
                        entries.extend(keys.iter().filter(|&&k| k < below));
                    }
                }
            }
            self.heap[n] = BinaryHeap::from(entries);
        }
        &mut self.heap[n]
    }
}

#[cfg(test)]
mod tests {
    use crate::solve::tests::two_class_world;
    use crate::solve::{finish, solve, solve_seeded, state::Solver, SolveOptions};

    /// The seeded keys join a node's heap only when a walk reaches them ([`Solver::heap_above`]):
    /// the same solve as with every heap merged up front, pop for pop.
    #[test]
    fn lazy_heaps_walk_as_merged_ones() {
        let options = SolveOptions::default();
        let first = two_class_world(7, |_| 1.0);
        let cold = solve(&first, &options);
        let next = two_class_world(7, |u| 1.0 + 0.1 * ((u * 7919 % 201) as f64 / 100.0 - 1.0));
        let eff = crate::sticky::favour_incumbents(&next, &cold.map, &Default::default())
            .expect("effective preferences");
        let lazy = solve_seeded(&eff, &cold.map, &options);
        // Heaps that take each path's worst key or two first, then the rest.
        for kept in [1, 2] {
            let mut s = Solver::new(&eff);
            s.worst_kept = kept;
            s.seed(&cold.map, options.arrival);
            let staged = finish(s, &options);
            assert_eq!(lazy.stats, staged.stats, "{kept} kept");
            assert_eq!(lazy.map, staged.map, "{kept} kept");
        }
        let mut s = Solver::new(&eff);
        s.seed(&cold.map, options.arrival);
        for n in 0..s.heap.len() {
            s.heap_mut(n);
        }
        let merged = finish(s, &options);
        assert!(
            lazy.stats.evictions > 10 && lazy.stats.proposals > 100,
            "{:?}",
            lazy.stats
        );
        assert_eq!(lazy.stats, merged.stats);
        assert_eq!(lazy.map, merged.map);
    }
}
