//! The map read-out: in parts by unit range, each part on its own thread writing its units
//! straight into the map's columns, from the sum of the holdings of the parts before it on,
//! which the solver counts as it goes ([`Solver::count_holding`]).
//!
//! Promises: the map is the one read out on one thread ([`Solver::map_in_one_part`], tested
//! with 1, 2 and 3 parts, cold and seeded); a miscount falls back to that (debug builds
//! assert); each unit's allocations are in its preference order.

use std::mem::MaybeUninit;

use super::state::{Solver, NONE};
use crate::map::{Allocation, Map};
use crate::model::UnitIdx;
use crate::parts;

impl Solver<'_> {
    /// The unit ranges the map is read out in: those of [`parts::in_parts`] for all units.
    pub(super) fn read_out_bounds(&self) -> Vec<usize> {
        let n = self.inst.unit_count();
        parts::bounds(n, self.parts_for(n, parts::PARALLEL_ITEMS))
    }

    /// Counts a holding of unit `u` linked (`true`) or unlinked, for [`Self::to_map`].
    #[inline]
    pub(super) fn count_holding(&mut self, u: UnitIdx, linked: bool) {
        let part = self.map_bounds.partition_point(|&b| b <= u as usize);
        if let Some(h) = self.holdings.get_mut(part.wrapping_sub(1)) {
            // Saturating: a miscount must not wrap into a size `to_map` would allocate.
            *h = if linked {
                h.saturating_add(1)
            } else {
                h.saturating_sub(1)
            };
        }
    }

    /// The map, read out in parts by unit range ([`parts`]), each part on its own thread
    /// writing its units straight into the map's columns: its allocations go from the sum of
    /// the holdings of the parts before it on, which the solver counted as it went, so no part
    /// waits for another and nothing is copied after.
    pub(super) fn to_map(&self) -> Map {
        let n = self.inst.unit_count();
        let bounds = self.read_out_bounds();
        let total: usize = self.holdings.iter().sum();
        // Every holding is a slot: more would be a miscount.
        if bounds != self.map_bounds
            || bounds.len() != self.holdings.len() + 1
            || total > self.slots.len()
        {
            debug_assert!(false, "read-out parts {bounds:?} not counted");
            return self.map_in_one_part();
        }
        let mut start: Vec<u32> = Vec::with_capacity(n + 1);
        let mut allocations: Vec<Allocation> = Vec::with_capacity(total);
        let mut overflow: Vec<f64> = Vec::with_capacity(n);
        start.push(0);
        let mut chunks = Vec::with_capacity(self.holdings.len());
        let mut start_rest = &mut start.spare_capacity_mut()[..n];
        let mut alloc_rest = &mut allocations.spare_capacity_mut()[..total];
        let mut over_rest = &mut overflow.spare_capacity_mut()[..n];
        let mut offset = 0;
        for (w, &count) in bounds.windows(2).zip(&self.holdings) {
            let len = w[1] - w[0];
            let (st, st_rest) = std::mem::take(&mut start_rest).split_at_mut(len);
            let (al, al_rest) = std::mem::take(&mut alloc_rest).split_at_mut(count);
            let (ov, ov_rest) = std::mem::take(&mut over_rest).split_at_mut(len);
            chunks.push((w[0]..w[1], offset, st, al, ov));
            (start_rest, alloc_rest, over_rest) = (st_rest, al_rest, ov_rest);
            offset += count;
        }
        let written = parts::run_parts(chunks, |(units, offset, st, al, ov)| {
            self.map_part(units, offset, st, al, ov)
        });
        if written != self.holdings {
            // A miscount would leave allocations unwritten: never read them, read the map
            // out again in one part.
            debug_assert!(
                false,
                "holdings {:?} counted, {written:?} written",
                self.holdings
            );
            return self.map_in_one_part();
        }
        // SAFETY: the chunks cover elements 1..=n of `start`'s capacity, 0..total of
        // `allocations`' and 0..n of `overflow`'s. Every part has returned (a panic in one
        // would have been resumed above, before this), writing one start and one overflow per
        // unit of its range, and as many allocations as its chunk holds: `written`, checked
        // equal to the chunk lengths just above.
        unsafe {
            start.set_len(n + 1);
            allocations.set_len(total);
            overflow.set_len(n);
        }
        Map::from_columns(start, allocations, overflow)
    }

    /// The units in `units`, written to their chunks of the map's columns: `start` and
    /// `overflow` take one entry per unit (its end in the allocations, counted from `offset`,
    /// and its overflow), `allocations` the units' allocations. Returns how many allocations
    /// the units have; only those that fit were written.
    fn map_part(
        &self,
        units: std::ops::Range<usize>,
        offset: usize,
        start: &mut [MaybeUninit<u32>],
        allocations: &mut [MaybeUninit<Allocation>],
        overflow: &mut [MaybeUninit<f64>],
    ) -> usize {
        let mut at = 0;
        let mut held = Vec::new();
        for (k, u) in (units.start as UnitIdx..units.end as UnitIdx).enumerate() {
            self.holdings_of(u, &mut held, |a| {
                if let Some(slot) = allocations.get_mut(at) {
                    slot.write(a);
                }
                at += 1;
            });
            start[k].write((offset + at) as u32);
            overflow[k].write(self.unit[u as usize].unplaced);
        }
        at
    }

    /// The map read out on this thread alone (what [`Self::to_map`] falls back to).
    fn map_in_one_part(&self) -> Map {
        let n = self.inst.unit_count();
        let mut map = Map::with_capacity(n, self.slots.len() - self.free_slots.len());
        let (mut held, mut one) = (Vec::new(), Vec::new());
        for u in 0..n as UnitIdx {
            one.clear();
            self.holdings_of(u, &mut held, |a| one.push(a));
            map.push_unit(one.iter().copied(), self.unit[u as usize].unplaced);
        }
        map
    }

    /// Unit `u`'s holdings, as allocations in its preference order, to `emit`. `held`:
    /// scratch.
    fn holdings_of(
        &self,
        u: UnitIdx,
        held: &mut Vec<(usize, Allocation)>,
        mut emit: impl FnMut(Allocation),
    ) {
        let s = self.unit[u as usize].head;
        if s == NONE {
            return;
        }
        let slot = self.slots[s as usize];
        debug_assert!(
            slot.amount > 0.0,
            "unit {u} holds {} at a slot",
            slot.amount
        );
        if slot.next == NONE {
            // One holding (most units): no order to find.
            emit(Allocation {
                cluster: slot.cluster,
                amount: slot.amount,
            });
            return;
        }
        held.clear();
        let mut s = s;
        while s != NONE {
            let slot = self.slots[s as usize];
            let j = self
                .inst
                .candidate_position(u, slot.cluster)
                .unwrap_or(usize::MAX);
            let a = Allocation {
                cluster: slot.cluster,
                amount: slot.amount,
            };
            held.push((j, a));
            s = slot.next;
        }
        held.sort_unstable_by_key(|&(j, _)| j);
        for &(_, a) in held.iter() {
            emit(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::solve::tests::two_class_world;
    use crate::solve::{solve, state::Solver, SolveOptions};

    /// The map read-out's parts write where the holdings counted say, through every change
    /// of a cold and of a seeded solve: the same map as read out on one thread.
    #[test]
    fn the_read_out_parts_write_where_their_holdings_say() {
        let options = SolveOptions::default();
        let first = two_class_world(11, |_| 1.0);
        let next = two_class_world(11, |u| 1.0 + 0.1 * ((u * 7919 % 201) as f64 / 100.0 - 1.0));
        let cold = solve(&first, &options);
        let eff = crate::sticky::favour_incumbents(&next, &cold.map, &Default::default())
            .expect("effective preferences");
        for parts in [1, 2, 3] {
            for seeded in [false, true] {
                let mut s = Solver::new(if seeded { &eff } else { &first });
                s.parts = Some(parts);
                if seeded {
                    s.seed(&cold.map, options.arrival);
                } else {
                    s.push_all(options.arrival);
                }
                s.settle(&options);
                assert!(s.stats.evictions > 10, "{:?}", s.stats);
                assert_eq!(s.holdings.len(), parts);
                assert_eq!(
                    s.to_map(),
                    s.map_in_one_part(),
                    "{parts} parts, seeded {seeded}"
                );
            }
        }
    }
}
