//! Stickiness: seeding a round from the previous map so that small changes move little demand
//! (DESIGN.md, "Stickiness").
//!
//! Two mechanisms work together, and neither weakens stability:
//!
//! 1. **Incumbents favoured, on both sides** ([`favour_incumbents`]). Where the previous map had
//!    some of unit *m*'s demand at cluster *c*, the pair's score (what *m* thinks of *c*) and rank
//!    (what *c* thinks of *m*) are both multiplied by `1 − stickiness`. So a unit leaves its
//!    cluster only for one better by more than that margin, and a cluster evicts an incumbent only
//!    for a newcomer it likes better by more than that margin (class priority still comes first).
//!    The result is a new [`Instance`] — the *effective preferences* — which the solver solves and
//!    the verifier checks, exactly as any other instance. `stickiness = 0` returns the instance
//!    unchanged.
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

/// The largest stickiness accepted: at 1 an incumbent's score would be 0 and nothing could ever
/// move.
pub const MAX_STICKINESS: f64 = 0.9;

/// The default stickiness: an incumbent is kept unless another candidate is more than 10%
/// better.
pub const DEFAULT_STICKINESS: f64 = 0.1;

/// The effective preferences of a round seeded from `previous` (a map of an instance with the
/// same map units, e.g. the previous round's): see the module documentation.
pub fn favour_incumbents(
    instance: &Instance,
    previous: &Map,
    stickiness: f64,
) -> Result<Instance, ModelError> {
    if !(stickiness.is_finite() && (0.0..=MAX_STICKINESS).contains(&stickiness)) {
        return Err(ModelError::BadNumber {
            subject: "stickiness".into(),
            field: "value",
            value: stickiness,
            rule: "must be a number in [0, 0.9]",
        });
    }
    if previous.unit_count() != instance.unit_count() {
        return Err(ModelError::MapShape {
            map_units: previous.unit_count(),
            instance_units: instance.unit_count(),
        });
    }
    if stickiness == 0.0 {
        return Ok(instance.clone());
    }
    let factor = (1.0 - stickiness) as f32;
    let old = &instance.cands;
    let total = old.cluster.len();
    let mut cands = CandidateColumns {
        cluster: Vec::with_capacity(total),
        score: Vec::with_capacity(total),
        rank: old.rank.as_ref().map(|_| Vec::with_capacity(total)),
    };
    let mut scratch: Vec<(f32, u32, f32)> = Vec::new();
    for u in 0..instance.unit_count() as UnitIdx {
        let range = instance.candidate_range(u);
        let held = previous.allocations(u);
        let incumbent = |c: u32| held.iter().any(|a| a.cluster == c && a.amount > 0.0);
        if !held.iter().any(|a| a.amount > 0.0) {
            cands.cluster.extend_from_slice(&old.cluster[range.clone()]);
            cands.score.extend_from_slice(&old.score[range.clone()]);
            if let (Some(dst), Some(src)) = (cands.rank.as_mut(), old.rank.as_ref()) {
                dst.extend_from_slice(&src[range]);
            }
            continue;
        }
        scratch.clear();
        for i in range {
            let c = old.cluster[i];
            let rank = old.rank.as_ref().map_or(NO_RANK, |r| r[i]);
            let (mut score, mut rank) = (old.score[i], rank);
            if incumbent(c) {
                score *= factor;
                // Without an explicit rank the rank is the score, which just got the bonus.
                if rank != NO_RANK {
                    rank *= factor;
                }
            }
            scratch.push((score, c, rank));
        }
        // The unit's preference: score, then cluster id.
        scratch.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(score, c, rank) in &scratch {
            cands.cluster.push(c);
            cands.score.push(score);
            if let Some(ranks) = cands.rank.as_mut() {
                ranks.push(rank);
            }
        }
    }
    Ok(instance.with_candidates(cands))
}
