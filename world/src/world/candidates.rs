//! Candidates: each city's shortlist of sites, each prefix's rendezvous order of a site's
//! clusters, and the selection of a prefix's candidates (the nearest usable clusters within
//! reach, or the single nearest).

use cdnmap_mapper::CandidateSpec;

use super::clusters::GenCluster;
use super::data::Site;
use super::geo::{
    chord2, chord2_to_km, rtt_from_km, unit_vector, FIBRE_KM_PER_MS, ROUTE_INFLATION, RTT_BASE_MS,
};
use super::{WorldParams, UNIT_JITTER_KM};

/// Salt of the per-prefix rendezvous order of a site's clusters.
const SITE_CHOICE_SALT: u64 = 0x5EED_5173_C40C_E000;
/// A site's clusters in one candidate list differ in score by less than this, ms (they come in the
/// prefix's rendezvous order).
pub const SITE_SPREAD_MS: f64 = 0.1;

/// Per city, the sites whose clusters can be candidates of a map unit at any point within
/// [`UNIT_JITTER_KM`] of it, and the city's nearest site.
pub(super) struct Shortlists {
    start: Vec<u32>,
    sites: Vec<u32>,
    /// Per city, its nearest used site.
    pub(super) nearest_site: Vec<u32>,
    /// An upper bound on the candidate count of a map unit in the city (for `reserve`).
    pub(super) candidate_bound: Vec<u8>,
}

impl Shortlists {
    pub(super) fn of(&self, city: usize) -> &[u32] {
        &self.sites[self.start[city] as usize..self.start[city + 1] as usize]
    }
}

/// The shortlists of the places at `coordinates` ((lat, lon) of each city, or of each
/// distinct location of a world over given networks); `site_xyz` and `site_clusters` (the
/// number of clusters at each) cover the used sites.
pub(super) fn shortlists(
    coordinates: &[(f64, f64)],
    site_xyz: &[[f64; 3]],
    site_clusters: &[usize],
    params: &WorldParams,
) -> Shortlists {
    // A map unit takes at most `max_per_site` clusters of a site, scored from its distance to the
    // site (within UNIT_JITTER_KM of its city's) plus less than SITE_SPREAD_MS. Once the sites so
    // far offer `candidates` clusters, a site farther from the city than the last by more than
    // twice the jitter plus the spread (as km) scores worse than all of them (1 km covers
    // rounding).
    let margin =
        2.0 * UNIT_JITTER_KM + SITE_SPREAD_MS * FIBRE_KM_PER_MS / (2.0 * ROUTE_INFLATION) + 1.0;
    let max_km = (params.max_rtt_ms - RTT_BASE_MS) * FIBRE_KM_PER_MS / (2.0 * ROUTE_INFLATION);
    let mut out = Shortlists {
        start: Vec::with_capacity(coordinates.len() + 1),
        sites: Vec::new(),
        nearest_site: Vec::with_capacity(coordinates.len()),
        candidate_bound: Vec::with_capacity(coordinates.len()),
    };
    out.start.push(0);
    let mut order: Vec<(f64, usize)> = Vec::with_capacity(site_xyz.len());
    for &(lat, lon) in coordinates {
        let p = unit_vector(lat, lon);
        order.clear();
        order.extend(
            site_xyz
                .iter()
                .enumerate()
                .map(|(s, q)| (chord2_to_km(chord2(&p, q)), s)),
        );
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        out.nearest_site.push(order[0].1 as u32);
        let mut offered = 0;
        let mut reachable = 0;
        let mut limit = f64::INFINITY;
        for &(d, s) in &order {
            if d > limit {
                break;
            }
            out.sites.push(s as u32);
            let n = site_clusters[s].min(params.max_per_site);
            offered += n;
            if d <= max_km + UNIT_JITTER_KM + 0.5 {
                reachable += n;
            }
            if offered >= params.candidates && limit.is_infinite() {
                limit = d + margin;
            }
        }
        out.start.push(out.sites.len() as u32);
        out.candidate_bound
            .push(reachable.clamp(1, params.candidates) as u8);
    }
    out
}

/// The splitmix64 finaliser: a well-mixed 64-bit hash of `z`.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of prefix `p`'s rendezvous order of clusters.
pub(super) fn prefix_key(seed: u64, p: usize) -> u64 {
    mix64(mix64(seed ^ SITE_CHOICE_SALT).wrapping_add(p as u64))
}

/// Cluster `j`'s place in the rendezvous order of the prefix with key `key` (lower first).
pub(super) fn rendezvous(key: u64, j: u32) -> u64 {
    mix64(key ^ u64::from(j).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The used sites: where they are and their clusters (indices, ascending).
pub(super) struct SiteIndex {
    pub(super) xyz: Vec<[f64; 3]>,
    clusters: Vec<Vec<u32>>,
}

impl SiteIndex {
    /// The index of the used sites `sites` and of the clusters laid out on them.
    pub(super) fn new(sites: &[Site], clusters: &[GenCluster]) -> SiteIndex {
        let mut index = SiteIndex {
            xyz: sites.iter().map(|s| unit_vector(s.lat, s.lon)).collect(),
            clusters: vec![Vec::new(); sites.len()],
        };
        for (j, c) in clusters.iter().enumerate() {
            index.clusters[c.site].push(j as u32);
        }
        index
    }

    /// The number of clusters at each used site.
    pub(super) fn sizes(&self) -> Vec<usize> {
        self.clusters.iter().map(Vec::len).collect()
    }

    /// Leaves in `near` (score, cluster index) the nearest of the clusters the prefix with key
    /// `key` may use from `xyz` ([`SiteIndex::eligible`] over its city's shortlisted `sites`):
    /// at most `params.candidates`, of lowest score (ties by cluster index), sorted that way so
    /// that the builder's sort of each of the prefix's units is a linear pass.
    pub(super) fn nearest(
        &self,
        sites: &[u32],
        params: &WorldParams,
        key: u64,
        xyz: &[f64; 3],
        scratch: &mut Vec<(u64, u32)>,
        near: &mut Vec<(f64, u32)>,
    ) {
        near.clear();
        self.eligible(sites, params.max_per_site, key, xyz, scratch, near);
        let by_score = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        if near.len() > params.candidates {
            near.select_nth_unstable_by(params.candidates - 1, by_score);
            near.truncate(params.candidates);
        }
        near.sort_unstable_by(by_score);
    }

    /// Appends to `near` (score, cluster index) the clusters of `sites` that the prefix with key
    /// `key` may use, seen from `xyz`: of each site, the first `max_per_site` in the prefix's
    /// rendezvous order, the `i`-th of them scored `RTT + i / max_per_site × SITE_SPREAD_MS`.
    fn eligible(
        &self,
        sites: &[u32],
        max_per_site: usize,
        key: u64,
        xyz: &[f64; 3],
        scratch: &mut Vec<(u64, u32)>,
        near: &mut Vec<(f64, u32)>,
    ) {
        for &s in sites {
            let s = s as usize;
            let rtt = rtt_from_km(chord2_to_km(chord2(xyz, &self.xyz[s])));
            let all = &self.clusters[s];
            if let [j] = all[..] {
                near.push((rtt, j));
                continue;
            }
            scratch.clear();
            scratch.extend(all.iter().map(|&j| (rendezvous(key, j), j)));
            let m = max_per_site.min(all.len());
            if all.len() > m {
                scratch.select_nth_unstable(m - 1);
            }
            scratch[..m].sort_unstable();
            near.extend(
                scratch[..m]
                    .iter()
                    .enumerate()
                    .map(|(i, &(_, j))| (rtt + SITE_SPREAD_MS * i as f64 / max_per_site as f64, j)),
            );
        }
    }
}

/// A prefix's candidates from its nearest clusters (`near`, best first, as left by
/// [`SiteIndex::nearest`]; `ids` the cluster ids by index): those whose score is within
/// `max_rtt_ms`, or, if none is, the single nearest cluster, so that no unit is left without one.
pub(super) fn within_reach<'a>(
    near: &[(f64, u32)],
    ids: &'a [String],
    max_rtt_ms: f64,
    candidates: &mut Vec<CandidateSpec<'a>>,
) {
    candidates.clear();
    for &(rtt, j) in near {
        // Compare as the builder will store it (f32), so stored scores respect the limit.
        if f64::from(rtt as f32) <= max_rtt_ms {
            candidates.push(CandidateSpec {
                cluster: &ids[j as usize],
                score: rtt,
                cluster_rank: None,
            });
        } else {
            break;
        }
    }
    if candidates.is_empty() {
        // Nothing within reach: the single nearest cluster.
        if let Some(&(rtt, j)) = near.first() {
            candidates.push(CandidateSpec {
                cluster: &ids[j as usize],
                score: rtt,
                cluster_rank: None,
            });
        }
    }
}
