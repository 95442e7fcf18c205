//! Prefetching ahead: the units about to be popped from the stack (or reached by the scan)
//! have their columns scattered over the instance's arrays, so the loops ask for them 16 and 8
//! units ahead, in two stages (a unit's candidates are found through its columns).
//!
//! Promises: hints only: nothing here changes any result.

use super::state::{Solver, NONE};
use crate::mem::prefetch;
use crate::model::UnitIdx;

/// How many units ahead the solver's loops prefetch a unit's columns, and its candidate.
const PREFETCH_FAR: usize = 16;
const PREFETCH_NEAR: usize = 8;

impl Solver<'_> {
    /// Hides the memory latency of the units about to be popped: their columns are scattered
    /// over the instance's arrays, so each pop would otherwise wait on several cache misses.
    /// Two stages, because a unit's candidates are found through its columns.
    #[inline]
    pub(super) fn prefetch_ahead(&self) {
        let len = self.stack.len();
        if len > PREFETCH_FAR {
            self.prefetch_unit(self.stack[len - PREFETCH_FAR]);
        }
        if len > PREFETCH_NEAR {
            let v = self.stack[len - PREFETCH_NEAR];
            let i = self.inst.candidate_range(v).start + usize::from(self.unit[v as usize].next);
            self.inst.prefetch_candidate(v, i);
        }
    }

    /// Like [`Self::prefetch_ahead`], for a scan over `units` now at `at`.
    #[inline]
    pub(super) fn prefetch_units(&self, units: &[(UnitIdx, u32)], at: usize) {
        if let Some(&(v, _)) = units.get(at + PREFETCH_FAR) {
            self.prefetch_unit(v);
        }
        if let Some(&(v, _)) = units.get(at + PREFETCH_NEAR) {
            self.inst
                .prefetch_candidate(v, self.inst.candidate_range(v).start);
            let s = self.unit[v as usize].head;
            if s != NONE {
                prefetch(&self.slots, s as usize);
            }
        }
    }

    /// The first stage: unit `v`'s own columns and solver state.
    fn prefetch_unit(&self, v: UnitIdx) {
        let (units, v) = (&self.inst.units, v as usize);
        prefetch(&units.cand_start, v);
        if let Some(f) = &self.inst.favour {
            prefetch(&f.start, v);
            prefetch(&f.promote, v);
        }
        prefetch(&self.inst.demand, v);
        prefetch(&units.class, v);
        prefetch(&self.unit, v);
    }
}
