//! A unit's candidates as the solver, the verifier and the formats read them: by (unit,
//! position) through accessors, because an instance with stickiness keeps its preferences as a
//! [`Favour`] beside the shared candidate arena (`crate::sticky` builds it).
//!
//! Promises: every accessor gives the effective preference — the favoured candidates' score
//! and rank times the factor, the order after a promotion or in the moved copy — so reading
//! an instance with a `Favour` is reading the preferences written out ([`Instance::flattened`]
//! writes them out); [`Instance::first_candidate`] gives what the head column or
//! [`Favour::first`] wrote down, checked against the candidates in debug builds.

use std::sync::Arc;

use super::columns::{CandidateColumns, NO_RANK};
use super::favour::{promoted_entry, promoted_position, Favour, FirstCandidate};
use super::instance::Instance;
use super::limits::{ClusterIdx, UnitIdx};
use crate::mem::prefetch;

/// A validated candidate: a cluster, the unit's score for it, and the rank the cluster gives the
/// unit (the explicit `cluster_rank`, or the score when none was given).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub cluster: ClusterIdx,
    pub score: f32,
    pub rank: f32,
    /// Whether `rank` came from an explicit `cluster_rank`.
    pub explicit_rank: bool,
    /// Whether the cluster holds this unit as an *incumbent* and puts it before every
    /// non-incumbent, whatever their class priority (set only by stickiness,
    /// [`crate::sticky::favour_incumbents`]; plain instances have none).
    pub incumbent: bool,
}

impl Instance {
    /// The position of unit `u`'s candidates in the flat candidate arena (followed, in an
    /// instance with stickiness, by the candidates that moved: see [`Favour`]). Every
    /// candidate accessor below takes such a position.
    #[inline]
    pub(crate) fn candidate_range(&self, u: UnitIdx) -> std::ops::Range<usize> {
        let u = u as usize;
        let (a, b) = (
            self.units.cand_start[u] as usize,
            self.units.cand_start[u + 1] as usize,
        );
        match &self.favour {
            None => a..b,
            Some(f) => {
                let s = f.start[u] as usize;
                s..s + (b - a)
            }
        }
    }

    /// The entry shown at unit `u`'s candidate position `i` (an index into the arena
    /// followed by the moved candidates; `i` itself but for a promotion).
    #[inline]
    fn entry(&self, u: UnitIdx, i: usize) -> usize {
        match &self.favour {
            Some(f) if i < f.arena_len => {
                let promote = f.promote[u as usize];
                if promote[0] == 0 {
                    return i;
                }
                let s = f.start[u as usize] as usize;
                s + promoted_entry(promote, i - s)
            }
            _ => i,
        }
    }

    /// The columns holding `entry`, and its index there.
    #[inline]
    fn columns(&self, entry: usize) -> (&CandidateColumns, usize) {
        match &self.favour {
            Some(f) if entry >= f.arena_len => (&f.moved, entry - f.arena_len),
            _ => (&self.cands, entry),
        }
    }

    /// The cluster of unit `u`'s candidate at position `i`.
    #[inline]
    pub(crate) fn cand_cluster(&self, u: UnitIdx, i: usize) -> ClusterIdx {
        let (c, k) = self.columns(self.entry(u, i));
        c.cluster[k]
    }

    /// Unit `u`'s candidate clusters as a set: the arena's order, which with stickiness's
    /// promotions need not be the order of preference (for that, [`Self::candidates`]).
    #[inline]
    pub(crate) fn candidate_cluster_set(&self, u: UnitIdx) -> &[ClusterIdx] {
        let range = self.candidate_range(u);
        let (cols, k) = self.columns(range.start);
        &cols.cluster[k..k + range.len()]
    }

    /// The position (0 = most preferred) of cluster `c` among unit `u`'s candidates.
    pub(crate) fn candidate_position(&self, u: UnitIdx, c: ClusterIdx) -> Option<usize> {
        let range = self.candidate_range(u);
        let b = self.candidate_cluster_set(u).iter().position(|&x| x == c)?;
        Some(match &self.favour {
            Some(f) if range.start < f.arena_len && f.promote[u as usize][0] != 0 => {
                promoted_position(f.promote[u as usize], b)
            }
            _ => b,
        })
    }

    /// The unit's score for its candidate at position `i`, the explicit rank if any, and
    /// the rank the cluster gives the unit. Always inlined: every caller inlined it while it
    /// shared a file with the solver, and the solver's key, its hottest caller, reads it on
    /// every offer.
    #[inline(always)]
    pub(crate) fn cand_score_rank(&self, u: UnitIdx, i: usize) -> (f32, Option<f32>, f32) {
        let entry = self.entry(u, i);
        let (c, k) = self.columns(entry);
        let mut score = c.score[k];
        let mut explicit = c.rank.as_ref().map(|r| r[k]).filter(|&r| r != NO_RANK);
        if let Some(f) = self.favour.as_ref().filter(|f| f.is_favoured(entry)) {
            score *= f.factor;
            explicit = explicit.map(|r| r * f.factor);
        }
        (score, explicit, explicit.unwrap_or(score))
    }

    /// Whether the cluster of unit `u`'s candidate at position `i` holds the unit as an
    /// incumbent that it likes better than every newcomer (stickiness).
    #[inline]
    pub(crate) fn is_incumbent(&self, u: UnitIdx, i: usize) -> bool {
        self.favour
            .as_ref()
            .is_some_and(|f| f.incumbents_first && f.is_favoured(self.entry(u, i)))
    }

    /// The cluster of unit `u`'s candidate at position `i`, and whether the unit is a
    /// newcomer there ([`Self::cand_cluster`] and [`Self::is_newcomer`] in one lookup).
    #[inline]
    pub(crate) fn cand_cluster_newcomer(&self, u: UnitIdx, i: usize) -> (ClusterIdx, bool) {
        let entry = self.entry(u, i);
        let (c, k) = self.columns(entry);
        let newcomer = self
            .favour
            .as_ref()
            .is_some_and(|f| f.incumbents_first && !f.is_favoured(entry));
        (c.cluster[k], newcomer)
    }

    /// Whether unit `u`'s candidate at position `i` is a newcomer its cluster likes less than
    /// every incumbent (only when stickiness puts incumbents first).
    #[inline]
    pub(crate) fn is_newcomer(&self, u: UnitIdx, i: usize) -> bool {
        self.favour
            .as_ref()
            .is_some_and(|f| f.incumbents_first && !f.is_favoured(self.entry(u, i)))
    }

    /// Unit `u`'s most preferred candidate (`None` if it has none), as written down with the
    /// candidates (the head column, or stickiness's [`Favour::first`]); debug builds check it
    /// against the candidates themselves.
    #[inline]
    pub(crate) fn first_candidate(&self, u: UnitIdx) -> Option<FirstCandidate> {
        if self.candidate_count(u) == 0 {
            return None;
        }
        let first = match &self.favour {
            Some(f) => f.first[u as usize],
            None => {
                let head = self.cands.head[u as usize];
                FirstCandidate {
                    cluster: head.cluster,
                    rank: head.rank,
                    newcomer: false,
                }
            }
        };
        #[cfg(debug_assertions)]
        {
            // What was written down is what the candidates say.
            let i = self.candidate_range(u).start;
            let read = FirstCandidate {
                cluster: self.cand_cluster(u, i),
                rank: self.cand_score_rank(u, i).2,
                newcomer: self.is_newcomer(u, i),
            };
            debug_assert_eq!(first, read, "unit {u}'s first candidate");
        }
        Some(first)
    }

    /// Asks the CPU to load unit `u`'s candidate at position `i`.
    #[inline]
    pub(crate) fn prefetch_candidate(&self, u: UnitIdx, i: usize) {
        let entry = self.entry(u, i);
        let (c, k) = self.columns(entry);
        prefetch(&c.cluster, k);
        prefetch(&c.score, k);
        if let Some(r) = &c.rank {
            prefetch(r, k);
        }
        if let Some(f) = &self.favour {
            prefetch(&f.favoured, entry / 64);
        }
    }

    /// Candidate `j` (0 = most preferred) of unit `u`.
    pub fn candidate(&self, u: UnitIdx, j: usize) -> Candidate {
        let i = self.candidate_range(u).start + j;
        self.candidate_at(u, i)
    }

    /// Unit `u`'s candidate at position `i` of the arena.
    #[inline]
    pub(crate) fn candidate_at(&self, u: UnitIdx, i: usize) -> Candidate {
        let (score, explicit, rank) = self.cand_score_rank(u, i);
        Candidate {
            cluster: self.cand_cluster(u, i),
            score,
            rank,
            explicit_rank: explicit.is_some(),
            incumbent: self.is_incumbent(u, i),
        }
    }

    /// Unit `u`'s candidates, most preferred first.
    #[inline]
    pub fn candidates(&self, u: UnitIdx) -> impl ExactSizeIterator<Item = Candidate> + '_ {
        self.candidate_range(u)
            .map(move |i| self.candidate_at(u, i))
    }

    /// The same instance with stickiness's changes to its candidates (built by
    /// [`crate::sticky`] for an instance that has none).
    pub(crate) fn with_favour(&self, favour: Favour) -> Instance {
        debug_assert!(self.favour.is_none());
        debug_assert_eq!(favour.arena_len, self.cands.cluster.len());
        debug_assert_eq!(favour.start.len(), self.unit_count());
        Instance {
            topology: Arc::clone(&self.topology),
            units: Arc::clone(&self.units),
            demand: Arc::clone(&self.demand),
            cands: Arc::clone(&self.cands),
            favour: Some(Arc::new(favour)),
        }
    }

    /// The same preferences with stickiness's changes written into the candidate columns (the
    /// candidates of every unit in its order, no [`Favour`]), for deriving preferences from
    /// an instance that already has them. Incumbent marks are lost.
    pub(crate) fn flattened(&self) -> Instance {
        if self.favour.is_none() {
            return self.clone();
        }
        let total = self.total_candidates();
        let mut cands = CandidateColumns {
            cluster: Vec::with_capacity(total),
            score: Vec::with_capacity(total),
            rank: self.cands.rank.as_ref().map(|_| Vec::with_capacity(total)),
            head: Vec::with_capacity(self.unit_count()),
        };
        let mut cand_start = Vec::with_capacity(self.unit_count() + 1);
        cand_start.push(0);
        for u in 0..self.unit_count() as UnitIdx {
            let start = cands.cluster.len();
            for i in self.candidate_range(u) {
                let (score, explicit, _) = self.cand_score_rank(u, i);
                cands.cluster.push(self.cand_cluster(u, i));
                cands.score.push(score);
                if let Some(r) = cands.rank.as_mut() {
                    r.push(explicit.unwrap_or(NO_RANK));
                }
            }
            cands.push_head(start);
            cand_start.push(cands.cluster.len() as u32);
        }
        debug_assert_eq!(cand_start, self.units.cand_start);
        Instance {
            topology: Arc::clone(&self.topology),
            units: Arc::clone(&self.units),
            demand: Arc::clone(&self.demand),
            cands: Arc::new(cands),
            favour: None,
        }
    }
}
