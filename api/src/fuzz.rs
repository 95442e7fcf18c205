//! Fuzz targets for the mapper's gRPC conversions that change state: the `Cluster` and
//! `MapUnit` messages of Admin's upserts, as prost decodes them from a request's bytes,
//! turned into an edit (`admin::cluster_from_pb`, `admin::unit_from_pb`) and applied to a
//! topology (`cdnmap_store::edit::apply`, what the topology writer does). Whatever the bytes, nothing
//! panics; a refusal's message is of bounded length; and an edit carried out is one a restart
//! reproduces: journaled (JSON) and replayed onto the same topology, it gives the same
//! topology, which written as an instance file parses back to itself.
//!
//! The corpus (`src/__fuzz__/fuzz__upserts/corpus`) is the clusters and map units of a small
//! generated world (the instance corpus's `world-12x4.json`), encoded as Admin's clients send
//! them (written by the ignored test `write_corpus`). `cdnmap_tests::fuzz` says how the
//! targets run.

use std::path::Path;
use std::sync::Arc;

use cdnmap_mapper::Limits;
use cdnmap_proto::prost::Message;
use cdnmap_proto::v1 as pb;
use cdnmap_tests::fuzz::{assert_bounded, corpus, Mutation};
use cdnmap_topology::format::{parse_instance, write_instance};
use cdnmap_topology::Topology;

use crate::admin::{cluster_from_pb, cluster_pb, unit_admin_pb, unit_from_pb};
use cdnmap_store::edit::{apply, Edit};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/__fuzz__/fuzz__upserts/corpus"
);
const WORLD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../topology/src/__fuzz__/fuzz__instance/corpus/world-12x4.json"
);

fn base() -> Arc<Topology> {
    let bytes = std::fs::read(WORLD).expect("the instance corpus's world");
    Arc::new(parse_instance(&bytes, Limits::default()).expect("the world parses"))
}

fn written(t: &Topology) -> Vec<u8> {
    let mut out = Vec::new();
    write_instance(t, &mut out).expect("writing to memory");
    out
}

/// Applies `edit` to `base` and checks the outcome (module docs).
fn check_edit(base: &Arc<Topology>, edit: Edit) {
    match apply(base, &edit) {
        Ok(applied) => {
            let after = written(&applied.topology);
            let journaled = serde_json::to_vec(&edit).expect("an edit serializes");
            let replayed: Edit = serde_json::from_slice(&journaled)
                .unwrap_or_else(|e| panic!("a journaled edit does not read back: {e}"));
            let again = apply(base, &replayed)
                .unwrap_or_else(|e| panic!("a journaled edit is refused on replay: {e}"));
            assert!(
                written(&again.topology) == after,
                "replayed, another topology"
            );
            let parsed = parse_instance(&after, Limits::default())
                .unwrap_or_else(|e| panic!("the edited topology does not parse back: {e}"));
            assert!(
                written(&parsed) == after,
                "written and parsed, another topology"
            );
        }
        Err(e) => assert_bounded(&e.to_string(), 0),
    }
}

/// The bytes as each upsert's request: a cluster, then a map unit.
fn check(base: &Arc<Topology>, bytes: &[u8]) {
    if let Ok(c) = pb::Cluster::decode(bytes) {
        match cluster_from_pb(c) {
            Ok(cluster) => check_edit(base, Edit::UpsertCluster { cluster }),
            Err(status) => assert_bounded(status.message(), bytes.len()),
        }
    }
    if let Ok(u) = pb::MapUnit::decode(bytes) {
        match unit_from_pb(u) {
            Ok(unit) => check_edit(base, Edit::UpsertMapUnit { unit }),
            Err(status) => assert_bounded(status.message(), bytes.len()),
        }
    }
}

/// Raw requests: the corpus, then random bytes.
#[test]
fn upserts() {
    let base = base();
    bolero::check!().for_each(|bytes: &[u8]| check(&base, bytes));
}

/// Mutations of the corpus's requests, with fields put in whole: ids, addresses and
/// prefixes of 3,000 bytes, the other cluster states, numbers at the edge of their type, a
/// resource tree deeper than the model takes.
#[test]
fn upsert_mutations() {
    let base = base();
    let corpus = corpus(Path::new(CORPUS));
    let long = "a".repeat(3000);
    let tokens: Vec<Vec<u8>> = [
        pb::Cluster {
            id: long.clone(),
            ..Default::default()
        }
        .encode_to_vec(),
        pb::Cluster {
            addresses: vec![long.clone()],
            ..Default::default()
        }
        .encode_to_vec(),
        pb::MapUnit {
            prefixes: vec![long.clone()],
            ..Default::default()
        }
        .encode_to_vec(),
        pb::Cluster {
            state: pb::ClusterState::Down as i32,
            lat: f64::MAX,
            lon: -0.0,
            ..Default::default()
        }
        .encode_to_vec(),
        pb::MapUnit {
            demand: 1e308,
            lat: f64::NAN,
            ..Default::default()
        }
        .encode_to_vec(),
        // A resource tree past the depth the model takes (62 levels once bricked a store).
        pb::Cluster {
            resources: Some(chain(62)),
            ..Default::default()
        }
        .encode_to_vec(),
        vec![0xff; 10],
    ]
    .into();
    let tokens: Vec<&[u8]> = tokens.iter().map(Vec::as_slice).collect();
    bolero::check!()
        .with_type::<Mutation>()
        .for_each(|m| check(&base, &m.apply(&corpus, &tokens)));
}

/// A resource tree of `levels` nodes in a chain, the last serving web.
fn chain(levels: usize) -> pb::ResourceNode {
    let node = |i: usize, children| pb::ResourceNode {
        name: format!("n{i}"),
        kind: "bps".into(),
        capacity: 10.0,
        classes: if i == levels {
            vec!["web".into()]
        } else {
            vec![]
        },
        children,
    };
    (1..levels)
        .rev()
        .fold(node(levels, vec![]), |tree, i| node(i, vec![tree]))
}

/// The corpus: every cluster and the first map units of the world, encoded.
fn requests() -> Vec<(String, Vec<u8>)> {
    let base = base();
    let clusters = (0..base.clusters().len()).map(|c| {
        (
            format!("cluster-{c:02}"),
            cluster_pb(&base, c).encode_to_vec(),
        )
    });
    let units = (0..4).map(|u| {
        (
            format!("unit-{u:02}"),
            unit_admin_pb(&base, u).encode_to_vec(),
        )
    });
    clusters.chain(units).collect()
}

/// Writes the corpus: `cargo test -p cdnmap-api write_corpus -- --ignored`.
#[test]
#[ignore]
fn write_corpus() {
    std::fs::create_dir_all(CORPUS).expect("the corpus directory");
    for (name, bytes) in requests() {
        std::fs::write(format!("{CORPUS}/{name}"), bytes).expect("a corpus file");
    }
}

/// The corpus is the requests as they are made today, and each is carried out.
#[test]
fn the_corpus_is_requests_carried_out() {
    let made: Vec<Vec<u8>> = requests().into_iter().map(|(_, b)| b).collect();
    assert_eq!(corpus(Path::new(CORPUS)), made, "run write_corpus again");
    let base = base();
    for (name, bytes) in requests() {
        let edit = if name.starts_with("cluster") {
            let c = pb::Cluster::decode(bytes.as_slice()).expect("decodes");
            Edit::UpsertCluster {
                cluster: cluster_from_pb(c).expect("converts"),
            }
        } else {
            let u = pb::MapUnit::decode(bytes.as_slice()).expect("decodes");
            Edit::UpsertMapUnit {
                unit: unit_from_pb(u).expect("converts"),
            }
        };
        apply(&base, &edit).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
