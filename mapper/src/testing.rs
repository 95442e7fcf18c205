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

/// An instance from JSON in the instance file's shape (nested resource trees only, and only
/// the fields allocation reads): what the crate's unit tests write their small worlds in. The file
/// format itself, with every form and field, is `cdnmap-topology`'s; this reader only spares the
/// mapper's own tests a dependency on it.
pub(crate) fn parse_instance(
    json: &[u8],
    limits: crate::model::Limits,
) -> Result<crate::model::Instance, crate::error::ModelError> {
    use crate::model::{
        CandidateSpec, ClusterSpec, ClusterState, InstanceBuilder, MapUnitSpec, ResourceKind,
        ResourceNodeSpec, TrafficClass,
    };
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct File {
        traffic_classes: Vec<TrafficClass>,
        clusters: Vec<Cluster>,
        map_units: Vec<Unit>,
    }
    #[derive(Deserialize)]
    struct Cluster {
        id: String,
        lat: f64,
        lon: f64,
        #[serde(default)]
        state: ClusterState,
        #[serde(default)]
        classes: Option<Vec<String>>,
        resources: Node,
    }
    #[derive(Deserialize)]
    struct Node {
        name: String,
        kind: ResourceKind,
        capacity: f64,
        #[serde(default)]
        classes: Vec<String>,
        #[serde(default)]
        children: Vec<Node>,
    }
    #[derive(Deserialize)]
    struct Unit {
        id: String,
        class: String,
        demand: f64,
        lat: f64,
        lon: f64,
        candidates: Vec<Candidate>,
    }
    #[derive(Deserialize)]
    struct Candidate {
        cluster: String,
        score: f64,
        #[serde(default)]
        cluster_rank: Option<f64>,
    }
    fn flatten(n: &Node, out: &mut Vec<ResourceNodeSpec>) {
        out.push(ResourceNodeSpec {
            name: n.name.clone(),
            kind: n.kind,
            capacity: n.capacity,
            classes: n.classes.clone(),
            children: n.children.iter().map(|c| c.name.clone()).collect(),
        });
        n.children.iter().for_each(|c| flatten(c, out));
    }

    let file: File = serde_json::from_slice(json).expect("test JSON in the instance file's shape");
    let clusters = file
        .clusters
        .into_iter()
        .map(|c| {
            let mut resources = Vec::new();
            flatten(&c.resources, &mut resources);
            ClusterSpec {
                id: c.id,
                lat: c.lat,
                lon: c.lon,
                state: c.state,
                serves: c.classes,
                resources,
            }
        })
        .collect();
    let mut b = InstanceBuilder::new(file.traffic_classes, clusters, limits)?;
    for u in &file.map_units {
        let cands: Vec<CandidateSpec> = u
            .candidates
            .iter()
            .map(|c| CandidateSpec {
                cluster: &c.cluster,
                score: c.score,
                cluster_rank: c.cluster_rank,
            })
            .collect();
        b.push_unit(&MapUnitSpec {
            id: &u.id,
            class: &u.class,
            demand: u.demand,
            lat: u.lat,
            lon: u.lon,
            candidates: &cands,
        })?;
    }
    b.finish()
}
