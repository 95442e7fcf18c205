//! Repair: the blocking-pair scan and the repair move. The scan looks only at the units whose
//! proposal pointer has moved, reads on several threads first ([`Solver::scan_unit`], with
//! [`Solver::room_without_heaps`]) and walks heaps in unit order after; it passes the
//! candidates that provably still have no room ([`Solver::surely_full`], from the removal log).
//!
//! Promises: the pairs found are those of one sequential sweep sizing every offer (a walk
//! changes no decision); a candidate `surely_full` passes has no room for the unit beyond the
//! tolerances (debug builds size the offer anyway and assert it); `move_up` moves only what the
//! blocking cluster takes, each move a strict improvement for the unit.

use super::state::{Solver, MAX_SCAN, NONE};
use crate::model::UnitIdx;
use crate::parts;

/// The blocking-pair scan splits over threads from this many units on (a unit's checks cost
/// far more than one step of a pass over all units).
const SCAN_PART: usize = 1 << 12;

/// What reading the state tells of a unit in the blocking-pair scan.
pub(super) enum Verdict {
    /// In no blocking pair.
    Clear,
    /// In one with its candidate at this position.
    Blocking(usize),
    /// Unknown from this position on: the candidate there, offered this much demand, needs a
    /// heap walk.
    Unsure(usize, f64),
}

impl Solver<'_> {
    /// For every unit in a blocking pair, the position of its best blocking candidate.
    ///
    /// Only a unit whose pointer has moved can be in a blocking pair: one holds demand only at
    /// candidates up to its pointer, and one left with unplaced demand after a pass has offered
    /// it to every candidate (unless the proposal bound was hit). So only those are scanned,
    /// in two sweeps: first, on several threads ([`parts`]), every check that reading the
    /// state settles ([`Self::scan_unit`]); then, in unit order on this thread, the checks
    /// that must walk a heap. A walk changes no decision (it only drops stale entries and
    /// builds lazy heaps), so the pairs found are the same as in one sequential sweep.
    pub(super) fn find_blocking(&mut self) -> Vec<(UnitIdx, usize)> {
        // Past the proposal bound some units have candidates they never offered to.
        let skip = !self.stats.proposal_bound_hit;
        let units: Vec<(UnitIdx, u32)> = if skip {
            self.moved.sort_unstable();
            self.moved.clone()
        } else {
            (0..self.inst.unit_count() as UnitIdx)
                .map(|u| (u, 0))
                .collect()
        };
        let this = &*self;
        let parts = self.parts_for(units.len(), SCAN_PART);
        let verdicts = parts::in_parts(units.len(), parts, |r| {
            let mut held = Vec::new();
            r.map(|at| {
                this.prefetch_units(&units, at);
                this.scan_unit(units[at], skip, 0, &mut held)
            })
            .collect::<Vec<_>>()
        });
        let mut out = Vec::new();
        let mut held = Vec::new();
        for (&(u, since), verdict) in units.iter().zip(verdicts.into_iter().flatten()) {
            let mut verdict = verdict;
            while let Verdict::Unsure(j, movable) = verdict {
                let i = self.inst.candidate_range(u).start + j;
                verdict = if self.room_for(u, i, movable) > self.tol(u) {
                    Verdict::Blocking(j)
                } else {
                    self.scan_unit((u, since), skip, j + 1, &mut held)
                };
            }
            if let Verdict::Blocking(j) = verdict {
                out.push((u, j));
            }
        }
        #[cfg(debug_assertions)]
        self.check_scan(&units, skip);
        out
    }

    /// The blocking-pair scan of unit `u` (whose pointer first moved at epoch `since`) from
    /// its candidate position `from` on, reading only: the first candidate it would rather
    /// have more demand at that has room for it, or the first whose room only a heap walk can
    /// tell. `held`: scratch.
    fn scan_unit(
        &self,
        (u, since): (UnitIdx, u32),
        skip: bool,
        from: usize,
        held: &mut Vec<(usize, f64)>,
    ) -> Verdict {
        let worst = self.scan_limit(u);
        if worst <= from {
            return Verdict::Clear;
        }
        self.held_positions(u, held);
        let (range, tol) = (self.inst.candidate_range(u), self.tol(u));
        for j in from..worst {
            let movable = self.movable(u, j, held);
            if movable <= tol || (skip && self.surely_full(u, range.start + j, since)) {
                continue;
            }
            match self.room_without_heaps(u, range.start + j, movable) {
                Some(room) if room <= tol => continue,
                Some(_) => return Verdict::Blocking(j),
                None => return Verdict::Unsure(j, movable),
            }
        }
        Verdict::Clear
    }

    /// The candidate positions the scan checks for unit `u` are those before this one: the
    /// candidates it likes more than some of its demand's place (all, if some is unplaced).
    fn scan_limit(&self, u: UnitIdx) -> usize {
        if self.unit[u as usize].unplaced > self.tol(u) {
            self.inst.candidate_count(u)
        } else {
            usize::from(self.unit[u as usize].worst)
        }
    }

    /// Unit `u`'s demand at each candidate position it holds some at (usually one), into
    /// `held`.
    fn held_positions(&self, u: UnitIdx, held: &mut Vec<(usize, f64)>) {
        held.clear();
        let mut s = self.unit[u as usize].head;
        while s != NONE {
            let slot = self.slots[s as usize];
            if let Some(p) = self.inst.candidate_position(u, slot.cluster) {
                held.push((p, slot.amount));
            }
            s = slot.next;
        }
    }

    /// The demand unit `u` would move to its candidate at position `j` if it could: what is
    /// unplaced and what it holds at candidates after `j` (`held`: [`Self::held_positions`]).
    fn movable(&self, u: UnitIdx, j: usize, held: &[(usize, f64)]) -> f64 {
        self.unit[u as usize].unplaced
            + held
                .iter()
                .filter(|&&(p, _)| p > j)
                .map(|&(_, a)| a)
                .sum::<f64>()
    }

    /// Whether the cluster at arena index `i` surely has no room for `u` (one of the
    /// candidates its proposal pointer has passed), without sizing an offer.
    ///
    /// The pointer passes a candidate only when the cluster took less than all that was
    /// offered (a partial or zero acceptance) or evicted `u` there. Right after a partial or
    /// zero acceptance, the node that limited it has no room for `u`: its free capacity plus
    /// the usage of the holders it likes less than `u` — what [`Self::size_offer`] counts —
    /// is about zero (below `u`'s tolerance for a zero acceptance). That sum cannot grow while
    /// the cluster only gains holders (one it likes less than `u` turns free capacity into
    /// such usage; a better one uses up free capacity), nor when it loses a holder it likes
    /// less than `u` (usage of such holders turns back into free capacity). It can grow only
    /// by a removal there of `u` itself or of a holder the cluster likes better. So if no such
    /// removal happened at the cluster since `u`'s pointer first moved, the cluster still has
    /// no room for `u`. An eviction that moved the pointer is itself a removal of `u` after
    /// that moment, so it never passes this test. Only float rounding and the node tolerance
    /// separate this from `room_for(..) <= tol`, and the verifier's tolerances are wider.
    /// Scans the cluster's removals newest first and gives up (false) after a few.
    /// `since`: the epoch when `u`'s pointer first moved.
    fn surely_full(&self, u: UnitIdx, i: usize, since: u32) -> bool {
        if since == 0 || self.epoch == u32::MAX {
            return false;
        }
        let c = self.inst.cand_cluster(u, i);
        if self.last_removal[c as usize] <= since {
            return true; // no removal there since: the log need not be read
        }
        let mut key = None;
        let mut scanned = 0;
        for &(epoch, k) in self.removals[c as usize].iter().rev() {
            if epoch <= since {
                break;
            }
            scanned += 1;
            let key = *key.get_or_insert_with(|| self.key(u, i));
            if k <= key || scanned > MAX_SCAN {
                return false;
            }
        }
        // Removals dropped from the log are older than those kept: none may be after `since`.
        self.removal_floor[c as usize] <= since
    }

    /// What [`Self::size_offer`] gives an offer of `x` of unit `u` at its candidate at arena
    /// index `i`, when that can be told without taking entries off a heap: when no node short
    /// of room for it may hold a unit it likes less (by `worst_bound`, or by the top of its
    /// heap once no seeded key left out of it is above the unit's, see [`Self::heap_above`]).
    /// `None` otherwise. Reads only, so threads can share it.
    fn room_without_heaps(&self, u: UnitIdx, i: usize, x: f64) -> Option<f64> {
        let (c, newcomer) = self.inst.cand_cluster_newcomer(u, i);
        if !self.up[c as usize] {
            return Some(0.0);
        }
        let mut key = None;
        let mut accept = x;
        for pi in self.paths.range(c, self.inst.units.class[u as usize]) {
            let (n, q) = (self.paths.node[pi] as usize, self.paths.coef[pi]);
            let free = self.node[n].cap - self.node[n].used;
            if x * q - free <= self.node_tol(n) {
                continue;
            }
            if let Some(key) = self.may_hold_worse(n, u, i, newcomer, &mut key) {
                if self
                    .unmerged
                    .get(n)
                    .is_some_and(|&m| m > key.saturating_add(1))
                {
                    return None; // a seeded key may be above `key`: the heap lacks them yet
                }
                if self.heap[n].peek().is_some_and(|&top| top > key) {
                    return None; // a worse holder, or a stale entry: only a walk tells
                }
            }
            accept = accept.min((free / q).max(0.0));
        }
        Some(accept)
    }

    /// Repairs the blocking pair of `u` and its candidate at position `j`: offers the cluster
    /// the demand `u` has in overflow and at candidates after `j`, and moves what it takes from
    /// there (overflow first, then the worst clusters). Only what is accepted moves, so a pair
    /// that another unit's repair already used up costs nothing, and each move is a strict
    /// improvement for the unit; the room a move leaves behind is found by the next scan.
    pub(super) fn move_up(&mut self, u: UnitIdx, j: usize) {
        let range = self.inst.candidate_range(u);
        let movable = self.unit[u as usize].unplaced
            + (range.start + j + 1..range.end)
                .map(|i| self.held(u, self.inst.cand_cluster(u, i)))
                .sum::<f64>();
        if movable <= self.tol(u) {
            return;
        }
        let mut moved = self.take(u, range.start + j, movable);
        let from_overflow = moved.min(self.unit[u as usize].unplaced);
        self.unit[u as usize].unplaced -= from_overflow;
        moved -= from_overflow;
        for p in (j + 1..range.len()).rev() {
            if moved <= 0.0 {
                break;
            }
            let c = self.inst.cand_cluster(u, range.start + p);
            let held = self.held(u, c);
            if held > 0.0 {
                let amount = held.min(moved);
                let key = self.key(u, range.start + p);
                self.remove(u, c, amount, key);
                // `remove` hands the amount back as unplaced: it is placed at `j` already.
                self.unit[u as usize].unplaced -= amount;
                moved -= amount;
            }
        }
    }

    /// Checks (in debug builds) every candidate the scan passed by [`Self::surely_full`], and
    /// that every unit whose pointer never moved is placed.
    #[cfg(debug_assertions)]
    fn check_scan(&mut self, units: &[(UnitIdx, u32)], skip: bool) {
        if !skip {
            return;
        }
        let mut held = Vec::new();
        for &(u, since) in units {
            let worst = self.scan_limit(u);
            self.held_positions(u, &mut held);
            let start = self.inst.candidate_range(u).start;
            for j in 0..worst {
                let movable = self.movable(u, j, &held);
                if movable > self.tol(u) && self.surely_full(u, start + j, since) {
                    self.check_full(u, start + j, movable);
                }
            }
        }
        for u in 0..self.inst.unit_count() as UnitIdx {
            if self.unit[u as usize].next == 0 {
                assert!(self.unit[u as usize].worst == 0, "unit {u}");
                assert!(
                    self.unit[u as usize].unplaced <= self.tol(u)
                        || self.inst.candidate_count(u) == 0,
                    "unit {u}"
                );
            }
        }
    }

    /// Checks (in debug builds) that a candidate [`Self::surely_full`] passed over indeed has
    /// no room for `u` beyond the tolerances.
    #[cfg(debug_assertions)]
    fn check_full(&mut self, u: UnitIdx, i: usize, movable: f64) {
        let c = self.inst.cand_cluster(u, i);
        let path = self.paths.range(c, self.inst.units.class[u as usize]);
        let band = self.tol(u)
            + path
                .map(|pi| self.node_tol(self.paths.node[pi] as usize) / self.paths.coef[pi])
                .sum::<f64>();
        let room = self.room_for(u, i, movable);
        assert!(
            room <= band,
            "unit {u} candidate {i}: room {room} > band {band}"
        );
    }
}
