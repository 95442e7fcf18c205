//! Measured scores: some units' candidates scored by what was measured (round-trip times from
//! clients, issue 19) instead of the instance's estimate, applied where stickiness applies its
//! bonus ([`crate::sticky::effective_preferences`]), so that a round reads the measured scores
//! through the same accessors as every other preference and no candidate arena is copied.
//!
//! Promises: a [`Rescore`] names each (unit, cluster) once, only clusters that are among the
//! unit's candidates, with a finite score in `(0, MAX_MEASURED_SCORE]`; a unit's list is in
//! cluster order. Building one costs in proportion to the measurements, never to the instance.

use crate::error::ModelError;
use crate::model::{ClusterIdx, Instance, UnitIdx};

/// The largest measured score taken: a minute of round trip is a broken measurement.
pub const MAX_MEASURED_SCORE: f32 = 60_000.0;

/// Measured scores for some units' candidates, by unit index of one instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rescore {
    /// The units with a measurement, ascending.
    units: Vec<UnitIdx>,
    /// Where each unit's measurements start in `measured` (one more entry than `units`).
    start: Vec<u32>,
    /// (cluster, measured score), in cluster order within a unit.
    measured: Vec<(ClusterIdx, f32)>,
    /// Measurements of a cluster that is not among the unit's candidates (left out).
    not_candidates: usize,
    /// Per entry of `measured`, the rank its cluster gives the unit, when it is not the score
    /// (the cost policy's: its scores order the unit's candidates, its clusters rank the unit
    /// by latency); `None`: the scores are the ranks, as measured RTTs are.
    ranks: Option<Vec<f32>>,
}

impl Rescore {
    /// The measurements of `instance`'s units, each `(unit, cluster, score)`. A measurement of
    /// a cluster the unit does not have as a candidate is left out and counted
    /// ([`Self::not_candidates`]): measuring cannot add a candidate. A unit or cluster index
    /// out of range, a score that is not a number in `(0, MAX_MEASURED_SCORE]`, or a (unit,
    /// cluster) given twice is refused with an error naming it.
    pub fn new(
        instance: &Instance,
        measurements: impl IntoIterator<Item = (UnitIdx, ClusterIdx, f32)>,
    ) -> Result<Rescore, ModelError> {
        let mut all: Vec<(UnitIdx, ClusterIdx, f32)> = measurements.into_iter().collect();
        all.sort_unstable_by_key(|&(u, c, _)| (u, c));
        let mut out = Rescore::default();
        let clusters = instance.clusters().len();
        for (i, &(u, c, score)) in all.iter().enumerate() {
            if u as usize >= instance.unit_count() || c as usize >= clusters {
                return Err(ModelError::BadNumber {
                    subject: format!("a measured score of unit {u} at cluster {c}"),
                    field: "index",
                    value: f64::from(u.max(c)),
                    rule: "must name a unit and a cluster of the instance",
                });
            }
            let named = || {
                format!(
                    "the measured score of map unit {:?} at cluster {:?}",
                    instance.unit_id(u),
                    instance.clusters()[c as usize].id
                )
            };
            if !(score > 0.0 && score <= MAX_MEASURED_SCORE) {
                return Err(ModelError::BadNumber {
                    subject: named(),
                    field: "score",
                    value: f64::from(score),
                    rule: "must be a number in (0, 60000]",
                });
            }
            if i > 0 && (all[i - 1].0, all[i - 1].1) == (u, c) {
                return Err(ModelError::BadNumber {
                    subject: named(),
                    field: "score",
                    value: f64::from(score),
                    rule: "is given twice",
                });
            }
            if instance.candidate_position(u, c).is_none() {
                out.not_candidates += 1;
                continue;
            }
            if out.units.last() != Some(&u) {
                out.units.push(u);
                out.start.push(out.measured.len() as u32);
            }
            out.measured.push((c, score));
        }
        if !out.units.is_empty() {
            out.start.push(out.measured.len() as u32);
        }
        Ok(out)
    }

    /// Scores made elsewhere in the crate (the policy's, `crate::policy`), already in this
    /// type's shape: `units` ascending, `start` one more entry than `units`, each unit's
    /// scores in cluster order, every cluster a candidate of the unit.
    pub(crate) fn from_parts(
        units: Vec<UnitIdx>,
        start: Vec<u32>,
        measured: Vec<(ClusterIdx, f32)>,
        ranks: Option<Vec<f32>>,
    ) -> Rescore {
        debug_assert_eq!(start.len(), units.len() + 1);
        debug_assert!(ranks.as_ref().is_none_or(|r| r.len() == measured.len()));
        Rescore {
            units,
            start,
            measured,
            not_candidates: 0,
            ranks,
        }
    }

    /// Whether the entries carry ranks of their own ([`Self::ranks_at`]).
    pub(crate) fn has_ranks(&self) -> bool {
        self.ranks.is_some()
    }

    /// The ranks of the unit at position `i` of [`Self::units`], in the order of
    /// [`Self::at`]'s entries, when the entries carry their own.
    pub(crate) fn ranks_at(&self, i: usize) -> Option<&[f32]> {
        let r = self.ranks.as_ref()?;
        Some(&r[self.start[i] as usize..self.start[i + 1] as usize])
    }

    /// Whether no unit has a measurement.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// The units with a measurement, ascending.
    pub fn units(&self) -> &[UnitIdx] {
        &self.units
    }

    /// The number of (unit, cluster) measurements taken.
    pub fn len(&self) -> usize {
        self.measured.len()
    }

    /// Measurements left out because their cluster is not among the unit's candidates.
    pub fn not_candidates(&self) -> usize {
        self.not_candidates
    }

    /// The position in [`Self::units`] of the first unit at or after `u`.
    pub(crate) fn first_at_or_after(&self, u: UnitIdx) -> usize {
        self.units.partition_point(|&x| x < u)
    }

    /// The measurements of the unit at position `i` of [`Self::units`], in cluster order.
    pub(crate) fn at(&self, i: usize) -> &[(ClusterIdx, f32)] {
        &self.measured[self.start[i] as usize..self.start[i + 1] as usize]
    }

    /// Unit `u`'s measured score at cluster `c`, if measured.
    pub fn score(&self, u: UnitIdx, c: ClusterIdx) -> Option<f32> {
        let i = self.units.binary_search(&u).ok()?;
        let list = self.at(i);
        list.binary_search_by_key(&c, |&(x, _)| x)
            .ok()
            .map(|k| list[k].1)
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.units.capacity() * 4
            + self.start.capacity() * 4
            + self.measured.capacity() * 8
            + self.ranks.as_ref().map_or(0, |r| r.capacity() * 4)
    }
}

/// `next` as a round may take it after `previous` (the measured scores the last round used,
/// by index of the same units): a unit whose candidates keep their order takes its new scores
/// (a unit measured before and not now goes back to the estimates the same way); of the units
/// whose order would change, at most `max_reordered` do, in unit order, and the others keep
/// what they had (their previous scores, or none) until a later round. A warm start repairs a
/// few thousand reordered units in a round; measured at 1 M units, 20,000 units reordered at
/// once left it short of stable after its 16 repair rounds. Returns the admitted scores and how
/// many units were held back. `next` must be of `instance` ([`Rescore::new`]); of `previous`,
/// what is no longer a candidate (or a unit) of `instance` is left out.
pub fn admitted(
    instance: &Instance,
    next: &Rescore,
    previous: &Rescore,
    max_reordered: usize,
) -> (Rescore, usize) {
    let order = |u: UnitIdx, list: &[(ClusterIdx, f32)]| -> Vec<ClusterIdx> {
        let mut cands: Vec<(f32, ClusterIdx)> = instance
            .candidates(u)
            .map(|c| {
                let s = list
                    .binary_search_by_key(&c.cluster, |&(x, _)| x)
                    .map_or(c.score, |k| list[k].1);
                (s, c.cluster)
            })
            .collect();
        cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        cands.into_iter().map(|(_, c)| c).collect()
    };
    let mut out = Rescore {
        units: Vec::with_capacity(next.units.len()),
        start: Vec::with_capacity(next.units.len() + 1),
        measured: Vec::with_capacity(next.len()),
        not_candidates: next.not_candidates,
        ranks: None,
    };
    let (mut reordered, mut held) = (0usize, 0usize);
    let (mut i, mut j) = (0usize, 0usize);
    while i < next.units.len() || j < previous.units.len() {
        let (a, b) = (next.units.get(i).copied(), previous.units.get(j).copied());
        let u = match (a, b) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => break,
        };
        let new: &[(ClusterIdx, f32)] = if a == Some(u) { next.at(i) } else { &[] };
        let old: &[(ClusterIdx, f32)] = if b == Some(u) { previous.at(j) } else { &[] };
        if a == Some(u) {
            i += 1;
        }
        if b == Some(u) {
            j += 1;
        }
        if u as usize >= instance.unit_count() {
            continue;
        }
        let take = if new == old || order(u, new) == order(u, old) {
            true
        } else if reordered < max_reordered {
            reordered += 1;
            true
        } else {
            held += 1;
            false
        };
        // `next` was checked against this instance; `previous` against the last round's,
        // whose units (by id) may have other candidates now.
        let kept = if take { new } else { old };
        let at = out.measured.len();
        out.measured.extend(
            kept.iter()
                .filter(|&&(c, _)| take || instance.candidate_position(u, c).is_some()),
        );
        if out.measured.len() > at {
            out.units.push(u);
            out.start.push(at as u32);
        }
    }
    if !out.units.is_empty() {
        out.start.push(out.measured.len() as u32);
    }
    (out, held)
}
