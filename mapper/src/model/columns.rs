//! The instance's unit columns: map units column-wise, and the candidates of all units in one
//! arena with each unit's first candidate (its head) written down beside them.
//!
//! Promises: unit `u`'s candidates are `cand_start[u]..cand_start[u + 1]` of the arena, in
//! the unit's preference order; `head[u]` is the first of them (cluster, and the rank its
//! cluster gives the unit), written when the unit's candidates are; explicit ranks exist only
//! when some candidate has one, [`NO_RANK`] standing for none.

use super::limits::{ClassIdx, ClusterIdx};

/// The stored rank of a candidate without an explicit `cluster_rank`.
pub(crate) const NO_RANK: f32 = f32::INFINITY;

/// Map units, column-wise. Candidates of unit `u` are at `cand_start[u]..cand_start[u + 1]`
/// of the [`CandidateColumns`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MapUnits {
    pub(crate) ids: Vec<Box<str>>,
    pub(crate) class: Vec<ClassIdx>,
    /// Filled while building only (empty in an instance, which keeps its demand apart in
    /// `Instance::demand`; the name keeps instance code from reading it by mistake).
    pub(crate) building_demand: Vec<f64>,
    pub(crate) lat: Vec<f32>,
    pub(crate) lon: Vec<f32>,
    pub(crate) cand_start: Vec<u32>,
}

/// The candidates of all map units in one arena, each unit's in its preference order. Kept apart
/// from [`MapUnits`] so that an instance with other preferences (stickiness) shares everything
/// else.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CandidateColumns {
    pub(crate) cluster: Vec<ClusterIdx>,
    pub(crate) score: Vec<f32>,
    /// Explicit cluster ranks, [`NO_RANK`] where none was given; absent when no candidate has
    /// one. (Input ranks are finite, so infinity is free to mean "none" and compares equal.)
    pub(crate) rank: Option<Vec<f32>>,
    /// Each unit's first candidate (a placeholder for a unit without candidates), written
    /// down with the unit: the passes over every unit of a warm round (stickiness, seeding)
    /// read little else of most units, and 8 bytes a unit stream where a unit's candidate
    /// lines (twice 64 bytes at 16 candidates) do not. Empty in [`Favour::moved`].
    pub(crate) head: Vec<Head>,
}

/// A unit's first candidate in its instance's arena: its cluster, and the rank that cluster
/// gives the unit (the explicit rank if any, else the score).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Head {
    pub(crate) cluster: ClusterIdx,
    pub(crate) rank: f32,
}

impl CandidateColumns {
    /// Appends the head of a unit whose candidates are the arena's entries from `start` on.
    #[inline]
    pub(super) fn push_head(&mut self, start: usize) {
        let head = match self.cluster.get(start) {
            None => Head::default(),
            Some(&cluster) => Head {
                cluster,
                rank: match self.rank.as_ref().map(|r| r[start]) {
                    Some(r) if r != NO_RANK => r,
                    _ => self.score[start],
                },
            },
        };
        self.head.push(head);
    }
}
