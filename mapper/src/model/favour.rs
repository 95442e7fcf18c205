//! Stickiness's changes to an instance's preferences, as data: which candidates are favoured,
//! the promotion of a unit's one incumbent, the moved copies of the units reordered otherwise,
//! and each unit's first candidate (`crate::sticky` builds them; `candidates` reads through
//! them).
//!
//! Promises: a promotion `[p, q]` moves one entry forward (`p > q`; `[0, 0]` is none), and
//! [`promoted_entry`] and [`promoted_position`] are each other's inverse.

use super::columns::CandidateColumns;
use super::limits::ClusterIdx;

/// How stickiness changed an instance's preferences ([`crate::sticky`]), kept beside the
/// instance's own candidates rather than as a copy of them: a round's effective preferences
/// differ from its instance's only at the incumbents, and copying the candidate arena (16 M
/// entries at 1 M units) cost more than the rest of a warm round's preparation.
///
/// A *favoured* candidate's score and rank are multiplied by `factor`. A unit keeps its
/// candidates where they are in the instance's arena unless the bonus reordered them: when
/// one favoured candidate moved forward (the usual case: the incumbent got its place back
/// after the scores moved), `promote` says from where to where; in any other reordering the
/// unit's candidates are copied, in their new order, to `moved`, and its `start` points
/// there (index `arena_len + k` is `moved`'s entry `k`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Favour {
    pub(crate) factor: f32,
    /// Clusters like every favoured candidate (an incumbent) better than every other.
    pub(crate) incumbents_first: bool,
    /// Where each unit's candidates start, in the arena followed by `moved`.
    pub(crate) start: Vec<u32>,
    /// Per unit: `[p, q]`, its candidate at position `p` moved forward to position `q`
    /// (`p > q`), the ones between shifting back by one; `[0, 0]` for none.
    pub(crate) promote: Vec<[u8; 2]>,
    /// The length of the instance's candidate arena.
    pub(crate) arena_len: usize,
    /// The candidates of the units whose order changed.
    pub(crate) moved: CandidateColumns,
    /// Favoured candidates, one bit per entry of the arena followed by `moved` (an entry
    /// keeps its bit wherever a promotion shows it).
    pub(crate) favoured: Vec<u64>,
    /// Each unit's first candidate, as [`Instance::first_candidate`] gives it: written down
    /// while the unit's candidates are in cache, because a seeded solve reads the first
    /// candidate of every unit and little else of most.
    pub(crate) first: Vec<FirstCandidate>,
}

/// A unit's most preferred candidate: its cluster, the rank that cluster gives the unit, and
/// whether the unit is a newcomer there that the cluster likes less than every incumbent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FirstCandidate {
    pub(crate) cluster: ClusterIdx,
    pub(crate) rank: f32,
    pub(crate) newcomer: bool,
}

impl Favour {
    #[inline]
    pub(super) fn is_favoured(&self, entry: usize) -> bool {
        self.favoured[entry / 64] & (1 << (entry % 64)) != 0
    }
}

/// Under a promotion `[p, q]`, the (instance) position of the entry shown at position `j`.
#[inline]
pub(super) fn promoted_entry([p, q]: [u8; 2], j: usize) -> usize {
    let (p, q) = (usize::from(p), usize::from(q));
    if j < q || j > p {
        j
    } else if j == q {
        p
    } else {
        j - 1
    }
}

/// Under a promotion `[p, q]`, the position where the entry at (instance) position `b` is
/// shown: the inverse of [`promoted_entry`].
#[inline]
pub(super) fn promoted_position([p, q]: [u8; 2], b: usize) -> usize {
    let (p, q) = (usize::from(p), usize::from(q));
    if b < q || b > p {
        b
    } else if b == p {
        q
    } else {
        b + 1
    }
}
