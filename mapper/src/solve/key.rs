//! Keys: a cluster's preference for a unit, `(newcomer, class priority rank, rank, map unit
//! index)` lower first, packed into a `u64` (1 + 8 + 31 + 24 bits, high to low), and the
//! arrival order the key of a unit's first candidate gives it.
//!
//! Promises: comparing two keys compares the preferences they pack (the rank is a non-negative
//! finite `f32`, whose bits order like the number; units are indexed in id order); the low
//! [`UNIT_BITS`] bits of a key are the unit's index. The layout is tied to the model's limits
//! by the assertions below, so raising a limit past what the layout holds fails to compile.

use super::options::Arrival;
use super::state::Solver;
use crate::model::{ClusterIdx, UnitIdx, MAX_CANDIDATES_CEILING, MAX_CLASSES, MAX_MAP_UNITS};

/// The low bits of a key: the unit's index.
pub(super) const UNIT_BITS: u32 = 24;
pub(super) const UNIT_MASK: u64 = (1 << UNIT_BITS) - 1;
/// The bits of the rank above them: an `f32`'s bits without the sign bit (ranks are
/// non-negative, so it is 0).
const RANK_BITS: u32 = 31;
/// Where the class's priority rank starts, and its width.
const PRIO_SHIFT: u32 = UNIT_BITS + RANK_BITS;
const PRIO_BITS: u32 = 8;
/// The key bit of a newcomer (see [`crate::sticky`]): every newcomer's key is above every
/// incumbent's.
pub(super) const NEWCOMER: u64 = 1 << (PRIO_SHIFT + PRIO_BITS);

// A rank is `f32::to_bits` less its sign bit.
const _: () = assert!(RANK_BITS + 1 == u32::BITS && std::mem::size_of::<f32>() == 4);
// The layout fills the 64 bits exactly, newcomer on top.
const _: () = assert!(PRIO_SHIFT == 55 && PRIO_SHIFT + PRIO_BITS + 1 == u64::BITS);
// Every unit index fits its bits, and in a `UnitIdx`.
const _: () = assert!(MAX_MAP_UNITS <= 1 << UNIT_BITS);
const _: () = assert!(MAX_MAP_UNITS - 1 <= UnitIdx::MAX as usize);
// A priority rank (`Solver::prio_rank`: a class's among the distinct priorities) is below
// the number of classes, and fits its bits.
const _: () = assert!(MAX_CLASSES <= 1 << PRIO_BITS);
// A proposal pointer (and a unit's worst position) is one byte.
const _: () = assert!(MAX_CANDIDATES_CEILING <= u8::MAX as usize);

impl Solver<'_> {
    /// The cluster's preference key for unit `u` reached through candidate arena index `i`:
    /// lower is preferred.
    #[inline]
    pub(super) fn key(&self, u: UnitIdx, i: usize) -> u64 {
        let (_, _, rank) = self.inst.cand_score_rank(u, i);
        self.pack_key(u, rank, self.inst.is_newcomer(u, i))
    }

    #[inline]
    fn pack_key(&self, u: UnitIdx, rank: f32, newcomer: bool) -> u64 {
        let k = self.inst.units.class[u as usize];
        let newcomer = if newcomer { NEWCOMER } else { 0 };
        newcomer
            | (self.prio_rank[usize::from(k)] << PRIO_SHIFT)
            | (u64::from(rank.to_bits()) << UNIT_BITS)
            | u64::from(u)
    }

    /// The cluster of unit `u`'s first candidate, and the key it gives the unit.
    #[inline]
    pub(super) fn first(&self, u: UnitIdx) -> Option<(ClusterIdx, u64)> {
        let f = self.inst.first_candidate(u)?;
        Some((f.cluster, self.pack_key(u, f.rank, f.newcomer)))
    }

    /// What unit `u` is queued by: the key its first candidate gives it (`first`), or its
    /// index (the low bits of a key are the unit's index in either case).
    #[inline]
    pub(super) fn arrival_key(
        u: UnitIdx,
        first: Option<(ClusterIdx, u64)>,
        arrival: Arrival,
    ) -> u64 {
        match first {
            Some((_, key)) if arrival == Arrival::Preference => key,
            _ => u64::from(u),
        }
    }
}
