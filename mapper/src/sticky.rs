//! Stickiness: seeding a round from the previous map so that small changes move little demand
//! (DESIGN.md, "Stickiness").
//!
//! Two mechanisms work together, and neither weakens stability:
//!
//! 1. **Incumbents favoured, on both sides** ([`favour_incumbents`]). Call *(m, c)* an incumbent
//!    pair when the previous map had some of unit *m*'s demand at cluster *c*.
//!    - *Units*: the pair's score is multiplied by `1 − margin`, so a unit leaves its cluster
//!      only for one better by more than the margin (hysteresis).
//!    - *Clusters*: with `incumbents_first` (the default) a cluster likes every incumbent better
//!      than every newcomer, whatever the class; among incumbents, and among newcomers, the
//!      usual `(class priority, rank, id)` decides, an incumbent's rank also multiplied by
//!      `1 − margin`. So newcomers take free capacity but push no one out, and when a cluster
//!      must shed (its capacity shrank, its incumbents' demand grew) it sheds by priority and
//!      rank. This is what keeps a failure's ripple small: the demand of a cluster that went
//!      down moves, and displaces little. The price: a better-priority class arriving at a full
//!      cluster waits in its next choice (or overflow) until room appears; a cold solve
//!      (stickiness 0) now and then, or `incumbents_first = false`, re-optimises.
//!
//!    The result is a new [`Instance`] — the *effective preferences* — which the solver solves
//!    and the verifier checks, exactly as any other instance. `margin = 0` returns the instance
//!    unchanged: a cold solve.
//! 2. **Warm start** ([`crate::solve_seeded`]): the solve starts from the previous map's shares,
//!    sheds what no longer fits, lets only the unplaced demand propose, and repairs blocking
//!    pairs. Its work is proportional to what changed, and it ends at a stable allocation of the
//!    effective preferences close to the previous map.
//!
//! Because the effective preferences only ever make a previous allocation *more* attractive to
//! both sides, a map that was stable last round is still stable when nothing changed: same
//! inputs plus the previous map give the same map and zero churn.

use crate::error::ModelError;
use crate::map::Map;
use crate::model::{CandidateColumns, Instance, UnitIdx, NO_RANK};

/// The largest margin accepted: at 1 an incumbent's score would be 0 and nothing could ever
/// move.
pub const MAX_STICKINESS: f64 = 0.9;

/// The default margin: an incumbent is kept unless another candidate is more than 10% better.
pub const DEFAULT_STICKINESS: f64 = 0.1;

/// How strongly a round holds on to the previous map (module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stickiness {
    /// In `[0, MAX_STICKINESS]`: incumbent scores and ranks are multiplied by `1 − margin`.
    /// 0 switches stickiness off (a plain cold solve).
    pub margin: f64,
    /// Clusters like every incumbent better than every newcomer.
    pub incumbents_first: bool,
}

impl Default for Stickiness {
    fn default() -> Self {
        Stickiness {
            margin: DEFAULT_STICKINESS,
            incumbents_first: true,
        }
    }
}

impl Stickiness {
    /// No stickiness: the effective preferences are the instance's.
    pub const OFF: Stickiness = Stickiness {
        margin: 0.0,
        incumbents_first: false,
    };

    /// The default with another margin.
    pub fn margin(margin: f64) -> Self {
        Stickiness {
            margin,
            ..Stickiness::default()
        }
    }
}

/// The effective preferences of a round seeded from `previous` (a map of an instance with the
/// same map units, e.g. the previous round's): see the module documentation.
pub fn favour_incumbents(
    instance: &Instance,
    previous: &Map,
    stickiness: &Stickiness,
) -> Result<Instance, ModelError> {
    let margin = stickiness.margin;
    if !(margin.is_finite() && (0.0..=MAX_STICKINESS).contains(&margin)) {
        return Err(ModelError::BadNumber {
            subject: "stickiness".into(),
            field: "margin",
            value: margin,
            rule: "must be a number in [0, 0.9]",
        });
    }
    if previous.unit_count() != instance.unit_count() {
        return Err(ModelError::MapShape {
            map_units: previous.unit_count(),
            instance_units: instance.unit_count(),
        });
    }
    if margin == 0.0 {
        return Ok(instance.clone());
    }
    let factor = (1.0 - margin) as f32;
    let old = &instance.cands;
    let total = old.cluster.len();
    // Start from a copy; only incumbents change, and each only moves forward in its list.
    let mut cands = CandidateColumns {
        cluster: old.cluster.clone(),
        score: old.score.clone(),
        rank: old.rank.clone(),
        incumbent: None,
    };
    let mut marks = vec![0u64; total.div_ceil(64)];
    for u in 0..instance.unit_count() as UnitIdx {
        let range = instance.candidate_range(u);
        for a in previous.allocations(u) {
            if a.amount.is_nan() || a.amount <= 0.0 {
                continue;
            }
            let list = &cands.cluster[range.clone()];
            let Some(j) = list.iter().position(|&c| c == a.cluster) else {
                continue;
            };
            let mut i = range.start + j;
            if bit(&marks, i) {
                continue; // the map named the cluster twice
            }
            cands.score[i] *= factor;
            if let Some(r) = cands.rank.as_mut() {
                // Without an explicit rank the rank is the score, which just got the bonus.
                if r[i] != NO_RANK {
                    r[i] *= factor;
                }
            }
            set_bit(&mut marks, i, true);
            // Insertion: the unit's preference is (score, cluster id); only this entry got
            // better, so it moves forward past the entries it now beats.
            while i > range.start
                && (cands.score[i], cands.cluster[i]) < (cands.score[i - 1], cands.cluster[i - 1])
            {
                cands.cluster.swap(i, i - 1);
                cands.score.swap(i, i - 1);
                if let Some(r) = cands.rank.as_mut() {
                    r.swap(i, i - 1);
                }
                let (a, b) = (bit(&marks, i), bit(&marks, i - 1));
                set_bit(&mut marks, i, b);
                set_bit(&mut marks, i - 1, a);
                i -= 1;
            }
        }
    }
    cands.incumbent = stickiness.incumbents_first.then_some(marks);
    Ok(instance.with_candidates(cands))
}

fn bit(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

fn set_bit(bits: &mut [u64], i: usize, on: bool) {
    if on {
        bits[i / 64] |= 1 << (i % 64);
    } else {
        bits[i / 64] &= !(1 << (i % 64));
    }
}
