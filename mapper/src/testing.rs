//! Helpers for the crate's unit tests.

use rand::Rng;

/// A JSON candidate list (without its brackets): `k` distinct clusters of `c00`, `c01`, ...
/// (`clusters` of them) in random order, each with a score in [1, 2) and, with probability
/// `ranked`, a cluster rank in [0, 5).
pub(crate) fn random_candidates(
    rng: &mut impl Rng,
    clusters: usize,
    k: usize,
    ranked: f64,
) -> String {
    let mut ids: Vec<usize> = (0..clusters).collect();
    for i in 0..k {
        let j = rng.random_range(i..clusters);
        ids.swap(i, j);
    }
    let cands: Vec<String> = ids[..k]
        .iter()
        .map(|c| {
            let score = rng.random_range(1.0..2.0f64);
            if rng.random_bool(ranked) {
                let rank = rng.random_range(0.0..5.0f64);
                format!(r#"{{"cluster": "c{c:02}", "score": {score}, "cluster_rank": {rank}}}"#)
            } else {
                format!(r#"{{"cluster": "c{c:02}", "score": {score}}}"#)
            }
        })
        .collect();
    cands.join(",")
}
