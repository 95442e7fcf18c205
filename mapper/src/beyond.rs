//! The RTT estimate of a placement beyond a unit's candidate list: the distance model
//! ([`crate::geo`]) calibrated by the unit's listed scores. The second chance places beyond
//! the lists at this estimate, and [`crate::map::mean_score`] counts such a placement at it,
//! so a map's RTT is told alike wherever it is told. Reads only the instance and `geo`.

use crate::model::{ClusterIdx, Instance, UnitIdx};

/// How unit `u`'s listed scores stand against the distance model, from its position `at`
/// and each cluster's (`pos`, on the unit sphere): the median of what they exceed the model
/// by, the best and the worst. `None` for a unit with no candidates.
pub(crate) fn calibration(
    inst: &Instance,
    u: UnitIdx,
    at: &[f64; 3],
    pos: impl Fn(ClusterIdx) -> [f64; 3],
) -> Option<(f64, f64, f64)> {
    use crate::geo::{chord2, chord2_to_km, rtt_from_km};
    let mut offsets = Vec::with_capacity(16);
    let (mut best, mut worst) = (f64::INFINITY, f64::NEG_INFINITY);
    // The clusters and scores alone (not `candidates`, which also reads ranks and marks: this
    // runs for every overflowing unit a round).
    for i in inst.candidate_range(u) {
        let km = chord2_to_km(chord2(at, &pos(inst.cand_cluster(u, i))));
        let score = f64::from(inst.cand_score_rank(u, i).0);
        offsets.push(score - rtt_from_km(km));
        best = best.min(score);
        worst = worst.max(score);
    }
    if offsets.is_empty() {
        return None; // nothing to calibrate by
    }
    let mid = offsets.len() / 2;
    let offset = *offsets.select_nth_unstable_by(mid, f64::total_cmp).1;
    Some((offset, best, worst))
}

/// The RTT the second chance estimates for unit `u` at cluster `c` beyond its list: the
/// distance model calibrated by the unit's listed scores (the median of what they exceed it
/// by), never better than its worst listed score. `None` for a unit with no candidates or a
/// cluster that is not in the instance. What a placement beyond the list is counted at
/// wherever a map's RTT is told (the dashboard, replays).
pub fn estimate_beyond(inst: &Instance, u: UnitIdx, c: ClusterIdx) -> Option<f64> {
    use crate::geo::{chord2, unit_vector};
    let pos = |c: ClusterIdx| {
        let cl = &inst.clusters()[c as usize];
        unit_vector(cl.lat, cl.lon)
    };
    let cl = inst.clusters().get(c as usize)?;
    let (lat, lon) = inst.unit_location(u);
    let at = unit_vector(lat, lon);
    let (offset, _, worst) = calibration(inst, u, &at, pos)?;
    Some(calibrated(
        chord2(&at, &unit_vector(cl.lat, cl.lon)),
        offset,
        worst,
    ))
}

/// The estimate at squared chord `c2` (unit sphere) of a unit calibrated by `offset`, never
/// better than its `worst` listed score: the one formula of [`estimate_beyond`] and of the
/// second chance's placements beyond the lists.
pub(crate) fn calibrated(c2: f64, offset: f64, worst: f64) -> f64 {
    use crate::geo::{chord2_to_km, rtt_from_km};
    (rtt_from_km(chord2_to_km(c2)) + offset).max(worst)
}
