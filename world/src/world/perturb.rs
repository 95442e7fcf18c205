//! Perturbation: the same world with noise on every demand and score (a round's worth of
//! change, for sticky rounds and benchmarks).

use anyhow::{ensure, Result};
use cdnmap_mapper::model::{DEFAULT_MAX_CANDIDATES, MAX_CANDIDATES_CEILING};
use cdnmap_mapper::{
    CandidateSpec, ClusterSpec, InstanceBuilder, Limits, MapUnitSpec, ResourceNodeSpec, UnitIdx,
};
use cdnmap_topology::Topology;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The same world with every map unit's demand and every candidate's score multiplied by an
/// independent factor uniform in [1 − pct/100, 1 + pct/100] (`pct` in [0, 100]). Ids, classes,
/// locations, prefixes, candidate clusters, explicit cluster ranks and clusters are kept (the
/// addressing is shared). Deterministic given `seed`.
pub fn perturb(topology: &Topology, pct: f64, seed: u64) -> Result<Topology> {
    let instance = &topology.instance;
    ensure!(
        pct.is_finite() && (0.0..=100.0).contains(&pct),
        "pct must be a percentage in [0, 100], got {pct}"
    );
    let classes = instance.classes();
    let specs = cluster_specs_of(instance);
    let n = instance.unit_count();
    let most = (0..n as UnitIdx)
        .map(|u| instance.candidate_count(u))
        .max()
        .unwrap_or(0);
    let limits = Limits {
        max_candidates: most.clamp(DEFAULT_MAX_CANDIDATES, MAX_CANDIDATES_CEILING),
    };
    let mut builder = InstanceBuilder::new(classes.to_vec(), specs, limits)?;
    builder.reserve(n, instance.total_candidates());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (lo, hi) = (1.0 - pct / 100.0, 1.0 + pct / 100.0);
    let mut candidates: Vec<CandidateSpec<'_>> = Vec::new();
    for u in 0..n as UnitIdx {
        let factor = rng.random_range(lo..=hi);
        candidates.clear();
        for cand in instance.candidates(u) {
            let g = rng.random_range(lo..=hi);
            candidates.push(CandidateSpec {
                cluster: &instance.clusters()[cand.cluster as usize].id,
                score: f64::from(cand.score) * g,
                cluster_rank: cand.explicit_rank.then_some(f64::from(cand.rank)),
            });
        }
        let (lat, lon) = instance.unit_location(u);
        builder.push_unit(&MapUnitSpec {
            id: instance.unit_id(u),
            class: &classes[usize::from(instance.unit_class(u))].name,
            demand: instance.unit_demand(u) * factor,
            lat,
            lon,
            candidates: &candidates,
        })?;
    }
    Ok(topology.with_instance(builder.finish()?))
}

/// The clusters of `instance` as specs (what a builder takes to make them again).
pub(crate) fn cluster_specs_of(instance: &cdnmap_mapper::Instance) -> Vec<ClusterSpec> {
    let classes = instance.classes();
    instance
        .clusters()
        .iter()
        .map(|c| ClusterSpec {
            id: c.id.clone(),
            lat: c.lat,
            lon: c.lon,
            state: c.state,
            serves: None,
            resources: c
                .nodes
                .iter()
                .map(|node| ResourceNodeSpec {
                    name: node.name.clone(),
                    kind: node.kind,
                    capacity: node.capacity,
                    classes: node
                        .classes
                        .iter()
                        .map(|&k| classes[usize::from(k)].name.clone())
                        .collect(),
                    children: node
                        .children
                        .iter()
                        .map(|&ch| c.nodes[ch as usize].name.clone())
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::{generate, WorldParams};

    #[test]
    fn perturb_keeps_structure() {
        let inst = generate(
            &WorldParams {
                map_units: 3_000,
                clusters: 50,
                seed: 11,
                ..WorldParams::default()
            },
            &|_| {},
        )
        .unwrap();
        assert_eq!(
            perturb(&inst, 0.0, 1).unwrap(),
            inst,
            "0% rebuilds the same instance"
        );
        let pct = 10.0;
        let p = perturb(&inst, pct, 42).unwrap();
        assert_eq!(p, perturb(&inst, pct, 42).unwrap());
        assert_ne!(p, perturb(&inst, pct, 43).unwrap());
        assert_eq!(p.clusters(), inst.clusters());
        assert_eq!(p.classes(), inst.classes());
        assert_eq!(p.unit_count(), inst.unit_count());
        let tol = 1e-6;
        let (lo, hi) = (1.0 - pct / 100.0 - tol, 1.0 + pct / 100.0 + tol);
        let mut changed = 0;
        for u in 0..inst.unit_count() as UnitIdx {
            assert_eq!(p.unit_id(u), inst.unit_id(u));
            assert_eq!(p.unit_class(u), inst.unit_class(u));
            assert_eq!(p.unit_prefixes(u), inst.unit_prefixes(u));
            assert_eq!(p.unit_location(u), inst.unit_location(u));
            let r = p.unit_demand(u) / inst.unit_demand(u);
            assert!((lo..=hi).contains(&r), "demand ratio {r}");
            let mut before: Vec<(u32, f32)> =
                inst.candidates(u).map(|c| (c.cluster, c.score)).collect();
            let mut after: Vec<(u32, f32)> =
                p.candidates(u).map(|c| (c.cluster, c.score)).collect();
            before.sort_by_key(|c| c.0);
            after.sort_by_key(|c| c.0);
            assert_eq!(before.len(), after.len());
            for (b, a) in before.iter().zip(&after) {
                assert_eq!(a.0, b.0);
                let r = f64::from(a.1) / f64::from(b.1);
                assert!((lo..=hi).contains(&r), "score ratio {r}");
            }
            if inst
                .candidates(u)
                .map(|c| c.cluster)
                .ne(p.candidates(u).map(|c| c.cluster))
            {
                changed += 1;
            }
        }
        assert!(changed > 0, "some preference orders change");
        assert!(perturb(&inst, -1.0, 1).is_err());
        assert!(perturb(&inst, f64::NAN, 1).is_err());
        assert!(perturb(&inst, 101.0, 1).is_err());
    }
}
