//! A property of the store and the topology writer together: whatever edits the writer
//! acknowledges (random clusters with random resource trees, deep and wide ones among them,
//! map units, cluster states, deletes, and snapshots taken between them), a restart — the store
//! opened again and its topology read, as a start does — gives back exactly the topology the
//! writer published, under the same journal number. The replicas' log in etcd holds the same
//! JSON as the journal (`topology::carry_out`), so it reads back too.
//!
//! Driven by bolero (random cases for a second in `cargo test`; `cargo bolero test` for
//! more). An edit the writer refuses is simply not acknowledged: a tree deeper than
//! `MAX_TREE_DEPTH`, a unit naming a cluster that is not there.

use std::path::Path;
use std::sync::Arc;

use bolero::TypeGenerator;
use cdnmap_mapper::{ClusterState, Limits, ResourceKind};
use cdnmap_topology::format::{
    CandidateFile, ClusterFile, FlatNode, MapUnitFile, NestedNode, ResourcesFile,
};
use cdnmap_topology::Topology;

use cdnmap_store::Store;
use cdnmap_topology::format::parse_instance;

use crate::topology::{Change, SharedTopology};

/// Cluster ids the cases draw from: the base world's two and four more.
const CLUSTER_IDS: [&str; 6] = ["a", "b", "c0", "c1", "c2", "c3"];
/// Map unit ids: the base world's two and four more.
const UNIT_IDS: [&str; 6] = ["u1", "u2", "v0", "v1", "v2", "v3"];
/// Trees of up to this many levels are drawn: past `MAX_TREE_DEPTH`, and past the 62 levels
/// the journal's JSON reader once stopped at.
const LEVELS_MAX: u8 = 80;
/// Up to this many leaves beside a tree's spine at its bottom (with the spine, past
/// `MAX_TREE_NODES` at times: refused).
const WIDTH_MAX: u16 = 1_100;

/// The store at `path` opened again (the writer's last handle on it may still be going).
fn reopen(path: &Path) -> Store {
    let started = std::time::Instant::now();
    loop {
        match Store::open(path) {
            Ok(s) => return s,
            Err(e) if started.elapsed() < std::time::Duration::from_secs(10) => {
                assert!(e.to_string().contains("lock"), "reopen: {e}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("reopen: {e}"),
        }
    }
}

/// The base world: two clusters, two map units.
fn instance() -> Topology {
    let json = r#"{
      "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 1}}],
      "clusters": [
        {"id": "a", "lat": 1, "lon": 2, "addresses": ["198.18.0.1"],
         "resources": {"name": "r", "kind": "bps", "capacity": 1.5, "classes": ["web"]}},
        {"id": "b", "lat": 3, "lon": 4, "addresses": ["198.18.1.1"],
         "resources": {"name": "r", "kind": "bps", "capacity": 10, "classes": ["web"]}}],
      "map_units": [
        {"id": "u1", "class": "web", "demand": 1, "prefixes": ["10.0.1.0/24"], "lat": 0, "lon": 0,
         "candidates": [{"cluster": "a", "score": 1}, {"cluster": "b", "score": 2}]},
        {"id": "u2", "class": "web", "demand": 1, "prefixes": ["10.0.2.0/24"], "lat": 0, "lon": 0,
         "candidates": [{"cluster": "a", "score": 1}, {"cluster": "b", "score": 2}]}]
    }"#;
    parse_instance(json.as_bytes(), Limits::default()).expect("valid")
}

/// One step of a case.
#[derive(Debug, Clone, TypeGenerator)]
enum Op {
    /// A cluster upserted with a tree: a spine of `levels` nodes (web on its deepest), a
    /// leaf beside every spine node when `bushy`, and `width` more leaves at the bottom.
    UpsertCluster {
        id: u8,
        levels: u8,
        width: u16,
        bushy: bool,
        nested: bool,
        state: u8,
        capacity: u16,
    },
    DeleteCluster {
        id: u8,
    },
    State {
        id: u8,
        state: u8,
    },
    UpsertUnit {
        id: u8,
        cluster: u8,
        demand: u16,
    },
    DeleteUnit {
        id: u8,
    },
    /// The topology as published now written as a snapshot (as the writer does once the
    /// journal since the last is long).
    Snapshot,
    /// The store closed, opened again and its topology compared.
    Restart,
}

fn state(n: u8) -> ClusterState {
    [ClusterState::Up, ClusterState::Drained, ClusterState::Down][usize::from(n % 3)]
}

/// The resource tree of [`Op::UpsertCluster`], flat or nested.
fn tree(levels: u8, width: u16, bushy: bool, nested: bool, capacity: u16) -> ResourcesFile {
    let levels = 1 + usize::from(levels % LEVELS_MAX);
    let width = usize::from(width % (WIDTH_MAX + 1));
    let node = |name: String, classes: Vec<String>, children: Vec<String>| FlatNode {
        name,
        kind: ResourceKind::Bps,
        capacity: 1.0 + f64::from(capacity),
        classes,
        children,
    };
    let mut flat = Vec::new();
    for level in 1..=levels {
        let mut children = Vec::new();
        if level < levels {
            children.push(format!("s{}", level + 1));
            if bushy {
                children.push(format!("b{level}"));
                flat.push(node(format!("b{level}"), vec![], vec![]));
            }
        } else {
            children.extend((0..width).map(|w| format!("w{w}")));
            flat.extend((0..width).map(|w| node(format!("w{w}"), vec![], vec![])));
        }
        let classes = if level == levels && width == 0 {
            vec!["web".to_string()]
        } else {
            vec![]
        };
        flat.push(node(format!("s{level}"), classes, children));
    }
    if width > 0 {
        // Web on a bottom leaf (a class sits on a leaf).
        if let Some(w0) = flat.iter_mut().find(|n| n.name == "w0") {
            w0.classes = vec!["web".to_string()];
        }
    }
    if !nested {
        return ResourcesFile::Flat(flat);
    }
    // The same tree nested, built bottom up without recursion.
    let mut built: std::collections::HashMap<String, NestedNode> = Default::default();
    for level in (1..=levels).rev() {
        let name = format!("s{level}");
        let spec = flat.iter().find(|n| n.name == name).cloned();
        let Some(spec) = spec else { continue };
        let children = spec
            .children
            .iter()
            .map(|c| {
                built.remove(c).unwrap_or_else(|| {
                    let leaf = flat.iter().find(|n| &n.name == c);
                    NestedNode {
                        name: c.clone(),
                        kind: ResourceKind::Bps,
                        capacity: 1.0 + f64::from(capacity),
                        classes: leaf.map_or(vec![], |l| l.classes.clone()),
                        children: vec![],
                    }
                })
            })
            .collect();
        built.insert(
            name.clone(),
            NestedNode {
                name,
                kind: spec.kind,
                capacity: spec.capacity,
                classes: spec.classes,
                children,
            },
        );
    }
    match built.remove("s1") {
        Some(root) => ResourcesFile::Nested(root),
        None => ResourcesFile::Flat(flat),
    }
}

/// The change `op` asks the writer for (`None`: not a change).
fn change(op: &Op) -> Option<Change> {
    let cluster_id = |id: u8| CLUSTER_IDS[usize::from(id) % CLUSTER_IDS.len()].to_string();
    let unit_id = |id: u8| UNIT_IDS[usize::from(id) % UNIT_IDS.len()].to_string();
    Some(match *op {
        Op::UpsertCluster {
            id,
            levels,
            width,
            bushy,
            nested,
            state: s,
            capacity,
        } => Change::UpsertCluster(ClusterFile {
            id: cluster_id(id),
            lat: f64::from(id % 90),
            lon: f64::from(capacity % 180),
            addresses: vec![format!("198.18.9.{}", 1 + id % 200)
                .parse()
                .expect("an address")],
            state: state(s),
            classes: None,
            resources: tree(levels, width, bushy, nested, capacity),
        }),
        Op::DeleteCluster { id } => Change::DeleteCluster(cluster_id(id)),
        Op::State { id, state: s } => Change::ClusterState {
            id: cluster_id(id),
            state: state(s),
            reason: "a property test".into(),
            actor: crate::topology::Actor::new(Some("test"), None, "test"),
            predicted: None,
        },
        Op::UpsertUnit {
            id,
            cluster,
            demand,
        } => Change::UpsertMapUnit(MapUnitFile {
            id: unit_id(id),
            class: "web".into(),
            demand: f64::from(demand),
            prefixes: vec![format!("10.9.{}.0/24", id % 200).parse().expect("a prefix")],
            lat: 0.0,
            lon: 0.0,
            candidates: vec![CandidateFile {
                cluster: cluster_id(cluster),
                score: 1.0,
                cluster_rank: None,
            }],
        }),
        Op::DeleteUnit { id } => Change::DeleteMapUnit(unit_id(id)),
        Op::Snapshot | Op::Restart => return None,
    })
}

/// The stored topology after a reopen, and the journal number of its last edit.
fn restarted(path: &Path) -> (Topology, u64) {
    let store = reopen(path);
    store
        .stored_topology(Limits::default())
        .unwrap_or_else(|e| panic!("a restart cannot read what was acknowledged: {e}"))
        .expect("a stored topology")
}

/// Runs `ops` through the topology writer over a store at `path` holding `start` after
/// journal entry `seq`, up to the first [`Op::Restart`]; returns what the writer published
/// and the ops left.
fn run<'a>(
    path: &Path,
    start: Topology,
    seq: u64,
    ops: &'a [Op],
) -> (Arc<Topology>, u64, &'a [Op]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let store = reopen(path);
    let (topology, seq, rest) = runtime.block_on(async {
        let log: crate::topology::Log = Arc::new(|_, _| {});
        let writer = SharedTopology::start(store.clone(), start, seq, 0, log, Default::default());
        let mut rest = ops;
        while let Some((op, tail)) = rest.split_first() {
            rest = tail;
            match op {
                Op::Restart => break,
                Op::Snapshot => {
                    let now = writer.current_versioned();
                    store
                        .put_snapshot(now.seq, &now.topology)
                        .expect("a snapshot");
                }
                op => {
                    if let Some(c) = change(op) {
                        // Refused or not, the writer goes on; what counts is what it published.
                        let _ = writer.change(c).await;
                    }
                }
            }
        }
        let now = writer.current_versioned();
        (Arc::clone(&now.topology), now.seq, rest)
    });
    // Every handle on the store goes with the runtime's tasks.
    drop(runtime);
    drop(store);
    (topology, seq, rest)
}

/// The property (module docs) for one case.
fn check(ops: &[Op]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = instance();
    Store::open(dir.path())
        .expect("open")
        .put_topology(&base)
        .expect("the first topology");
    let (mut now, mut seq, mut rest) = (base, 0, ops);
    loop {
        let (published, published_seq, left) = run(dir.path(), now, seq, rest);
        let (stored, stored_seq) = restarted(dir.path());
        assert_eq!(stored_seq, published_seq, "the journal's number");
        assert!(
            stored == *published,
            "a restart read another topology than the writer published"
        );
        (now, seq, rest) = (stored, stored_seq, left);
        if rest.is_empty() {
            return;
        }
    }
}

#[test]
fn a_restart_reads_back_every_topology_the_writer_acknowledged() {
    // A case opens sled a few times and syncs every acknowledged edit (about 10 cases a
    // second here): three seconds of them.
    bolero::check!()
        .with_test_time(std::time::Duration::from_secs(3))
        .with_generator(bolero::produce::<Vec<Op>>().with().len(1usize..40))
        .for_each(|ops: &Vec<Op>| check(ops));
}

/// The case that once bricked a store: a cluster 62 levels deep upserted, then a restart.
#[test]
fn a_tree_62_levels_deep_is_refused_and_a_restart_reads_what_was_acknowledged() {
    let deep = |levels: u8, nested| Op::UpsertCluster {
        id: 2,
        levels: levels - 1,
        width: 0,
        bushy: false,
        nested,
        state: 0,
        capacity: 10,
    };
    let deepest = cdnmap_mapper::MAX_TREE_DEPTH as u8;
    check(&[
        deep(62, true),
        deep(62, false),
        Op::Restart,
        deep(deepest, true),
        Op::Restart,
        deep(deepest, false),
        Op::Snapshot,
        Op::UpsertUnit {
            id: 3,
            cluster: 2,
            demand: 5,
        },
        Op::Restart,
    ]);
}
