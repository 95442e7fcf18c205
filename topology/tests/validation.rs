//! Every bad input the model refuses, each with its specific [`ModelError`] variant and a message
//! that names the offending input; JSON-level failures that must be errors, never panics; and the
//! equivalences the formats promise (nested and flat trees, extra fields ignored).

use cdnmap_mapper::{
    CandidateSpec, ClusterSpec, InstanceBuilder, Limits, MapUnitSpec, ModelError, TrafficClass,
};
use cdnmap_topology::format::{parse_instance, FormatError, InstanceFile};
use cdnmap_topology::Topology;
use serde_json::{json, Value};

/// A small valid world: two classes, cluster "fra1" with a flat tree, "ams1" with a nested one,
/// "lhr1" serving web only, and two map units.
fn base() -> Value {
    json!({
        "traffic_classes": [
            {"name": "web", "priority": 0, "per_unit": {"bps": 1.0, "fps": 0.5}},
            {"name": "video", "priority": 1, "per_unit": {"bps": 2.0, "fps": 0.25}},
            {"name": "apps", "priority": 2, "per_unit": {"bps": 0.25, "fps": 1.0}},
        ],
        "clusters": [
            {"id": "fra1", "lat": 50.1, "lon": 8.7, "addresses": ["192.0.2.1"],
             "resources": [
                {"name": "uplink", "kind": "bps", "capacity": 100.0, "children": ["cpu"]},
                {"name": "cpu", "kind": "fps", "capacity": 50.0,
                 "children": ["web-leaf", "video-leaf"]},
                {"name": "web-leaf", "kind": "fps", "capacity": 40.0, "classes": ["web"]},
                {"name": "video-leaf", "kind": "fps", "capacity": 40.0, "classes": ["video"]},
             ]},
            {"id": "ams1", "lat": 52.4, "lon": 4.9, "state": "drained",
             "resources": {"name": "uplink", "kind": "bps", "capacity": 100.0, "children": [
                {"name": "cpu", "kind": "fps", "capacity": 50.0, "children": [
                    {"name": "web-leaf", "kind": "fps", "capacity": 40.0, "classes": ["web"]},
                    {"name": "video-leaf", "kind": "fps", "capacity": 40.0, "classes": ["video"]},
                ]},
             ]}},
            {"id": "lhr1", "lat": 51.5, "lon": -0.1,
             "resources": {"name": "uplink", "kind": "bps", "capacity": 10.0, "classes": ["web"]}},
        ],
        "map_units": [
            {"id": "u1", "class": "web", "demand": 3.0, "lat": 50.0, "lon": 8.0,
             "prefixes": ["198.51.100.0/24"],
             "candidates": [{"cluster": "fra1", "score": 10.0},
                            {"cluster": "ams1", "score": 12.0, "cluster_rank": 1.0}]},
            {"id": "u2", "class": "video", "demand": 5.0, "lat": 51.0, "lon": 7.0,
             "candidates": [{"cluster": "ams1", "score": 9.0}, {"cluster": "fra1", "score": 11.0}]},
        ],
    })
}

fn parse(v: &Value, limits: Limits) -> Result<Topology, FormatError> {
    parse_instance(v.to_string().as_bytes(), limits)
}

/// An edit of the base world's JSON.
type Edit = fn(&mut Value);

/// The model error that `edit`ed base JSON is refused with.
fn check(edit: Edit) -> ModelError {
    check_with(edit, Limits::default())
}

fn check_with(edit: Edit, limits: Limits) -> ModelError {
    let mut v = base();
    edit(&mut v);
    match parse(&v, limits) {
        Err(FormatError::Model(e)) => e,
        Err(e) => panic!("expected a model error, got {e}"),
        Ok(_) => panic!("expected a model error, the instance was accepted"),
    }
}

/// Replaces cluster "fra1"'s tree.
fn fra1_tree(v: &mut Value, tree: Value) {
    v["clusters"][0]["resources"] = tree;
}

struct Case {
    name: &'static str,
    edit: Edit,
    is: fn(&ModelError) -> bool,
    /// Substrings the message must contain (quoted ids are quoted as `{:?}` does).
    names: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    vec![
        // ---- duplicate ids ----
        Case {
            name: "duplicate traffic class",
            edit: |v| {
                let c = v["traffic_classes"][1].clone();
                v["traffic_classes"].as_array_mut().unwrap().push(c);
            },
            is: |e| matches!(e, ModelError::DuplicateId { what: "traffic class", id, .. } if id == "video"),
            names: &["traffic class", "\"video\""],
        },
        Case {
            name: "duplicate cluster",
            edit: |v| {
                let c = v["clusters"][2].clone();
                v["clusters"].as_array_mut().unwrap().push(c);
            },
            is: |e| matches!(e, ModelError::DuplicateId { what: "cluster", id, .. } if id == "lhr1"),
            names: &["cluster", "\"lhr1\""],
        },
        Case {
            name: "duplicate map unit",
            edit: |v| {
                let u = v["map_units"][1].clone();
                v["map_units"].as_array_mut().unwrap().push(u);
            },
            is: |e| matches!(e, ModelError::DuplicateId { what: "map unit", id, .. } if id == "u2"),
            names: &["map unit", "\"u2\""],
        },
        Case {
            name: "duplicate resource node, flat",
            edit: |v| {
                let n = v["clusters"][0]["resources"][1].clone();
                v["clusters"][0]["resources"]
                    .as_array_mut()
                    .unwrap()
                    .push(n);
            },
            is: |e| matches!(e, ModelError::DuplicateId { what: "resource node", id, .. } if id == "cpu"),
            names: &["resource node", "\"cpu\"", "\"fra1\""],
        },
        Case {
            name: "duplicate resource node, nested",
            edit: |v| {
                v["clusters"][1]["resources"]["children"][0]["children"][1]["name"] =
                    json!("web-leaf");
            },
            is: |e| matches!(e, ModelError::DuplicateId { what: "resource node", id, .. } if id == "web-leaf"),
            names: &["resource node", "\"web-leaf\"", "\"ams1\""],
        },
        // ---- tree shape ----
        Case {
            name: "cycle: every node has a parent",
            edit: |v| {
                fra1_tree(
                    v,
                    json!([
                        {"name": "A", "kind": "bps", "capacity": 1.0, "children": ["B"]},
                        {"name": "B", "kind": "fps", "capacity": 1.0, "children": ["A"]},
                    ]),
                )
            },
            is: |e| matches!(e, ModelError::TreeCycle { cluster, node } if cluster == "fra1" && (node == "A" || node == "B")),
            names: &["\"fra1\"", "cycle"],
        },
        Case {
            name: "cycle: a node that is its own child",
            edit: |v| {
                fra1_tree(
                    v,
                    json!([{"name": "A", "kind": "bps", "capacity": 1.0, "children": ["A"]}]),
                )
            },
            is: |e| matches!(e, ModelError::TreeCycle { cluster, node } if cluster == "fra1" && node == "A"),
            names: &["\"fra1\"", "cycle", "\"A\""],
        },
        Case {
            name: "cycle not reachable from the root",
            edit: |v| {
                fra1_tree(
                    v,
                    json!([
                        {"name": "root", "kind": "bps", "capacity": 1.0,
                         "classes": ["web", "video"]},
                        {"name": "A", "kind": "fps", "capacity": 1.0, "children": ["B"]},
                        {"name": "B", "kind": "fps", "capacity": 1.0, "children": ["A"]},
                    ]),
                )
            },
            is: |e| matches!(e, ModelError::TreeCycle { cluster, node } if cluster == "fra1" && (node == "A" || node == "B")),
            names: &["\"fra1\"", "cycle"],
        },
        Case {
            name: "shared child",
            edit: |v| {
                fra1_tree(
                    v,
                    json!([
                        {"name": "R", "kind": "bps", "capacity": 1.0, "children": ["X", "Y"]},
                        {"name": "X", "kind": "fps", "capacity": 1.0, "children": ["L"]},
                        {"name": "Y", "kind": "fps", "capacity": 1.0, "children": ["L"]},
                        {"name": "L", "kind": "fps", "capacity": 1.0, "classes": ["web", "video"]},
                    ]),
                )
            },
            is: |e| {
                matches!(e, ModelError::SharedChild { cluster, node, first, second }
                    if cluster == "fra1" && node == "L" && first == "X" && second == "Y")
            },
            names: &["\"fra1\"", "\"L\"", "\"X\"", "\"Y\""],
        },
        Case {
            name: "unknown child",
            edit: |v| {
                v["clusters"][0]["resources"][1]["children"] = json!(["web-leaf", "ghost"]);
            },
            is: |e| matches!(e, ModelError::UnknownNode { cluster, node } if cluster == "fra1" && node == "ghost"),
            names: &["\"fra1\"", "\"ghost\""],
        },
        Case {
            name: "several roots",
            edit: |v| {
                fra1_tree(
                    v,
                    json!([
                        {"name": "R1", "kind": "bps", "capacity": 1.0, "classes": ["web"]},
                        {"name": "R2", "kind": "bps", "capacity": 1.0, "classes": ["video"]},
                    ]),
                )
            },
            is: |e| matches!(e, ModelError::SeveralRoots { cluster, .. } if cluster == "fra1"),
            names: &["\"fra1\"", "\"R1\"", "\"R2\"", "several roots"],
        },
        Case {
            name: "empty tree",
            edit: |v| fra1_tree(v, json!([])),
            is: |e| matches!(e, ModelError::EmptyTree { cluster } if cluster == "fra1"),
            names: &["\"fra1\"", "no nodes"],
        },
        // ---- classes on the tree ----
        Case {
            name: "class attached to a non-leaf",
            edit: |v| v["clusters"][0]["resources"][1]["classes"] = json!(["web"]),
            is: |e| {
                matches!(e, ModelError::ClassNotOnLeaf { cluster, class, node }
                    if cluster == "fra1" && class == "web" && node == "cpu")
            },
            names: &["\"fra1\"", "\"web\"", "\"cpu\"", "not a leaf"],
        },
        Case {
            name: "class attached to two leaves",
            edit: |v| v["clusters"][0]["resources"][3]["classes"] = json!(["video", "web"]),
            is: |e| {
                matches!(e, ModelError::ClassOnTwoLeaves { cluster, class, first, second }
                    if cluster == "fra1" && class == "web" && first == "web-leaf" && second == "video-leaf")
            },
            names: &["\"fra1\"", "\"web\"", "\"web-leaf\"", "\"video-leaf\""],
        },
        Case {
            name: "serves a class no leaf carries",
            edit: |v| v["clusters"][0]["classes"] = json!(["web", "apps"]),
            is: |e| {
                matches!(e, ModelError::NoLeafForClass { cluster, class }
                    if cluster == "fra1" && class == "apps")
            },
            names: &["\"fra1\"", "\"apps\""],
        },
        Case {
            name: "serves an unknown class",
            edit: |v| v["clusters"][0]["classes"] = json!(["audio"]),
            is: |e| matches!(e, ModelError::UnknownClass { class, .. } if class == "audio"),
            names: &["\"fra1\"", "\"audio\""],
        },
        Case {
            name: "leaf carries an unknown class",
            edit: |v| v["clusters"][0]["resources"][2]["classes"] = json!(["audio"]),
            is: |e| matches!(e, ModelError::UnknownClass { class, .. } if class == "audio"),
            names: &["\"fra1\"", "\"web-leaf\"", "\"audio\""],
        },
        // ---- map unit references ----
        Case {
            name: "map unit of an unknown class",
            edit: |v| v["map_units"][0]["class"] = json!("audio"),
            is: |e| matches!(e, ModelError::UnknownClass { class, .. } if class == "audio"),
            names: &["\"u1\"", "\"audio\""],
        },
        Case {
            name: "unknown candidate cluster",
            edit: |v| v["map_units"][1]["candidates"][1]["cluster"] = json!("nowhere"),
            is: |e| {
                matches!(e, ModelError::UnknownCluster { map_unit, cluster }
                    if map_unit == "u2" && cluster == "nowhere")
            },
            names: &["\"u2\"", "\"nowhere\""],
        },
        Case {
            name: "candidate cluster does not serve the class",
            edit: |v| v["map_units"][1]["candidates"][1]["cluster"] = json!("lhr1"),
            is: |e| {
                matches!(e, ModelError::ClassNotServed { map_unit, cluster, class }
                    if map_unit == "u2" && cluster == "lhr1" && class == "video")
            },
            names: &["\"u2\"", "\"lhr1\"", "\"video\""],
        },
        Case {
            name: "duplicate candidate",
            edit: |v| v["map_units"][0]["candidates"][1]["cluster"] = json!("fra1"),
            is: |e| {
                matches!(e, ModelError::DuplicateCandidate { map_unit, cluster }
                    if map_unit == "u1" && cluster == "fra1")
            },
            names: &["\"u1\"", "\"fra1\"", "twice"],
        },
        // ---- numbers ----
        Case {
            name: "negative demand",
            edit: |v| v["map_units"][0]["demand"] = json!(-1.0),
            is: |e| bad_number(e, "demand", "\"u1\""),
            names: &["\"u1\"", "demand", "-1"],
        },
        Case {
            name: "negative capacity",
            edit: |v| v["clusters"][0]["resources"][1]["capacity"] = json!(-5.0),
            is: |e| bad_number(e, "capacity", "\"cpu\""),
            names: &["\"fra1\"", "\"cpu\"", "capacity", "-5"],
        },
        Case {
            name: "negative capacity, nested",
            edit: |v| v["clusters"][1]["resources"]["capacity"] = json!(-5.0),
            is: |e| bad_number(e, "capacity", "\"ams1\""),
            names: &["\"ams1\"", "\"uplink\"", "capacity"],
        },
        Case {
            name: "negative bps coefficient",
            edit: |v| v["traffic_classes"][1]["per_unit"]["bps"] = json!(-2.0),
            is: |e| bad_number(e, "per_unit.bps", "\"video\""),
            names: &["\"video\"", "per_unit.bps", "-2"],
        },
        Case {
            name: "negative fps coefficient",
            edit: |v| v["traffic_classes"][0]["per_unit"]["fps"] = json!(-0.5),
            is: |e| bad_number(e, "per_unit.fps", "\"web\""),
            names: &["\"web\"", "per_unit.fps", "-0.5"],
        },
        Case {
            name: "negative score",
            edit: |v| v["map_units"][1]["candidates"][0]["score"] = json!(-3.0),
            is: |e| bad_number(e, "score", "\"ams1\""),
            names: &["\"u2\"", "\"ams1\"", "score", "-3"],
        },
        Case {
            name: "score beyond f32",
            edit: |v| v["map_units"][1]["candidates"][0]["score"] = json!(1e39),
            is: |e| bad_number(e, "score", "\"u2\""),
            names: &["\"u2\"", "\"ams1\"", "score", "3.4e38"],
        },
        Case {
            name: "negative cluster_rank",
            edit: |v| v["map_units"][0]["candidates"][1]["cluster_rank"] = json!(-1.0),
            is: |e| bad_number(e, "cluster_rank", "\"ams1\""),
            names: &["\"u1\"", "\"ams1\"", "cluster_rank", "-1"],
        },
        Case {
            name: "cluster latitude beyond 90",
            edit: |v| v["clusters"][2]["lat"] = json!(91.0),
            is: |e| bad_number(e, "lat", "\"lhr1\""),
            names: &["\"lhr1\"", "lat", "91"],
        },
        Case {
            name: "cluster longitude beyond -180",
            edit: |v| v["clusters"][2]["lon"] = json!(-180.5),
            is: |e| bad_number(e, "lon", "\"lhr1\""),
            names: &["\"lhr1\"", "lon", "-180.5"],
        },
        Case {
            name: "map unit latitude beyond -90",
            edit: |v| v["map_units"][1]["lat"] = json!(-90.1),
            is: |e| bad_number(e, "lat", "\"u2\""),
            names: &["\"u2\"", "lat", "-90.1"],
        },
        Case {
            name: "map unit longitude beyond 180",
            edit: |v| v["map_units"][1]["lon"] = json!(181.0),
            is: |e| bad_number(e, "lon", "\"u2\""),
            names: &["\"u2\"", "lon", "181"],
        },
        // ---- empty ids ----
        Case {
            name: "empty class name",
            edit: |v| v["traffic_classes"][2]["name"] = json!(""),
            is: |e| {
                matches!(
                    e,
                    ModelError::EmptyId {
                        what: "traffic class",
                        ..
                    }
                )
            },
            names: &["traffic class", "empty id"],
        },
        Case {
            name: "empty cluster id",
            edit: |v| v["clusters"][2]["id"] = json!(""),
            is: |e| {
                matches!(
                    e,
                    ModelError::EmptyId {
                        what: "cluster",
                        ..
                    }
                )
            },
            names: &["cluster", "empty id"],
        },
        Case {
            name: "empty map unit id",
            edit: |v| v["map_units"][1]["id"] = json!(""),
            is: |e| {
                matches!(
                    e,
                    ModelError::EmptyId {
                        what: "map unit",
                        ..
                    }
                )
            },
            names: &["map unit", "empty id", "#1"],
        },
        Case {
            name: "empty resource node name",
            edit: |v| v["clusters"][2]["resources"]["name"] = json!(""),
            is: |e| {
                matches!(
                    e,
                    ModelError::EmptyId {
                        what: "resource node",
                        ..
                    }
                )
            },
            names: &["resource node", "empty id", "\"lhr1\""],
        },
        // ---- ids with characters that are not allowed, or too long ----
        Case {
            name: "a NUL in a cluster id",
            edit: |v| v["clusters"][2]["id"] = json!("lhr\u{0}1"),
            is: |e| {
                matches!(
                    e,
                    ModelError::BadId {
                        what: "cluster",
                        ..
                    }
                )
            },
            names: &["cluster id", "U+0000", "not allowed"],
        },
        Case {
            name: "a right-to-left override in a map unit id",
            edit: |v| v["map_units"][1]["id"] = json!("u\u{202E}2"),
            is: |e| {
                matches!(
                    e,
                    ModelError::BadId {
                        what: "map unit",
                        ..
                    }
                )
            },
            names: &["map unit id", "U+202E", "#1"],
        },
        Case {
            name: "a class name of a million bytes",
            edit: |v| v["traffic_classes"][2]["name"] = json!("x".repeat(1_000_000)),
            is: |e| {
                matches!(
                    e,
                    ModelError::BadId {
                        what: "traffic class",
                        ..
                    }
                )
            },
            names: &["traffic class id", "1000000 bytes, at most 256"],
        },
    ]
}

/// Ids in other scripts are ids; an error names a long id by its first characters and its
/// length, never whole (RFC-style hostile input: a megabyte id is not echoed).
#[test]
fn ids_in_other_scripts_are_kept_and_a_long_one_is_cut_in_errors() {
    let mut v = base();
    v["clusters"][2]["resources"]["name"] = json!("zürich-1");
    let inst = parse(&v, Limits::default()).expect("an id in another script is valid");
    assert!(inst
        .clusters()
        .iter()
        .any(|c| c.nodes.iter().any(|n| n.name == "zürich-1")));
    let e = check(|v| v["map_units"][1]["id"] = json!("y".repeat(1_000_000)));
    let msg = e.to_string();
    assert!(
        msg.len() < 400,
        "{} bytes: {}",
        msg.len(),
        &msg[..400.min(msg.len())]
    );
    assert!(msg.contains("(1000000 bytes)"), "{msg}");
}

/// A `BadNumber` for `field` whose subject contains `subject`.
fn bad_number(e: &ModelError, field: &str, subject: &str) -> bool {
    matches!(e, ModelError::BadNumber { subject: s, field: f, .. } if *f == field && s.contains(subject))
}

#[test]
fn the_base_world_is_valid() {
    let inst = parse(&base(), Limits::default()).expect("valid");
    assert_eq!(inst.clusters().len(), 3);
    assert_eq!(inst.unit_count(), 2);
    assert_eq!(inst.total_candidates(), 4);
}

#[test]
fn every_bad_input_is_refused_with_its_own_error() {
    let mut failures = Vec::new();
    for case in cases() {
        let e = check(case.edit);
        let msg = e.to_string();
        if !(case.is)(&e) {
            failures.push(format!("{}: unexpected error {e:?}", case.name));
        }
        for needle in case.names {
            if !msg.contains(needle) {
                failures.push(format!("{}: message {msg:?} lacks {needle:?}", case.name));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn candidate_limits() {
    // More candidates than the configured limit.
    let e = check_with(
        |v| {
            v["map_units"][1]["candidates"]
                .as_array_mut()
                .unwrap()
                .push(json!({"cluster": "lhr1", "score": 1.0}))
        },
        Limits { max_candidates: 2 },
    );
    // (u2 is video and lhr1 does not serve it, but the count is checked first.)
    assert!(
        matches!(&e, ModelError::TooMany { what: "candidates", count: 3, limit: 2, subject } if subject.contains("\"u2\"")),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("\"u2\"") && msg.contains('3') && msg.contains('2'),
        "{msg}"
    );

    // Exactly the limit is fine.
    assert!(parse(&base(), Limits { max_candidates: 2 }).is_ok());

    // A limit beyond the ceiling is itself refused.
    let e = check_with(
        |_| {},
        Limits {
            max_candidates: 256,
        },
    );
    assert!(
        matches!(
            e,
            ModelError::TooMany {
                limit: 255,
                count: 256,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("256"));
}

// ---- NaN and infinity, which JSON cannot carry: through the builder ----

fn specs() -> (Vec<TrafficClass>, Vec<ClusterSpec>) {
    let file: InstanceFile = serde_json::from_value(base()).unwrap();
    let clusters = file.clusters.iter().map(|c| c.to_spec()).collect();
    (file.traffic_classes, clusters)
}

fn builder_error(edit: impl FnOnce(&mut Vec<TrafficClass>, &mut Vec<ClusterSpec>)) -> ModelError {
    let (mut classes, mut clusters) = specs();
    edit(&mut classes, &mut clusters);
    InstanceBuilder::new(classes, clusters, Limits::default()).expect_err("refused")
}

/// A valid unit spec; `f` edits it before it is pushed.
fn unit_error(f: impl FnOnce(&mut MapUnitSpec<'_>, &mut Vec<CandidateSpec<'_>>)) -> ModelError {
    let (classes, clusters) = specs();
    let mut b = InstanceBuilder::new(classes, clusters, Limits::default()).unwrap();
    let mut cands = vec![
        CandidateSpec {
            cluster: "fra1",
            score: 1.0,
            cluster_rank: None,
        },
        CandidateSpec {
            cluster: "ams1",
            score: 2.0,
            cluster_rank: Some(3.0),
        },
    ];
    let mut spec = MapUnitSpec {
        id: "u9",
        class: "web",
        demand: 1.0,
        lat: 0.0,
        lon: 0.0,
        candidates: &[],
    };
    f(&mut spec, &mut cands);
    spec.candidates = &cands;
    b.push_unit(&spec).expect_err("refused")
}

#[test]
fn non_finite_numbers_are_refused() {
    let mut failures = Vec::new();
    let mut expect = |name: &str, e: ModelError, field: &str, subject: &str| {
        let msg = e.to_string();
        if !bad_number(&e, field, subject) || !msg.contains(subject) || !msg.contains(field) {
            failures.push(format!("{name}: {e:?} / {msg}"));
        }
    };
    for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let e = builder_error(|cl, _| cl[0].per_unit.bps = x);
        expect("bps coefficient", e, "per_unit.bps", "\"web\"");
        let e = builder_error(|cl, _| cl[1].per_unit.fps = x);
        expect("fps coefficient", e, "per_unit.fps", "\"video\"");
        let e = builder_error(|_, cs| cs[0].resources[1].capacity = x);
        expect("capacity", e, "capacity", "\"cpu\"");
        let e = builder_error(|_, cs| cs[2].lat = x);
        expect("cluster lat", e, "lat", "\"lhr1\"");
        let e = builder_error(|_, cs| cs[2].lon = x);
        expect("cluster lon", e, "lon", "\"lhr1\"");
        let e = unit_error(|u, _| u.demand = x);
        expect("demand", e, "demand", "\"u9\"");
        let e = unit_error(|u, _| u.lat = x);
        expect("unit lat", e, "lat", "\"u9\"");
        let e = unit_error(|u, _| u.lon = x);
        expect("unit lon", e, "lon", "\"u9\"");
        let e = unit_error(|_, c| c[0].score = x);
        expect("score", e, "score", "\"fra1\"");
        let e = unit_error(|_, c| c[1].cluster_rank = Some(x));
        expect("cluster_rank", e, "cluster_rank", "\"ams1\"");
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn builder_refuses_bad_units_without_appending_them() {
    let (classes, clusters) = specs();
    let mut b = InstanceBuilder::new(classes, clusters, Limits::default()).unwrap();
    let good = [CandidateSpec {
        cluster: "fra1",
        score: 1.0,
        cluster_rank: None,
    }];
    let unit = |id, demand| MapUnitSpec {
        id,
        class: "web",
        demand,
        lat: 0.0,
        lon: 0.0,
        candidates: &good,
    };
    b.push_unit(&unit("a", 1.0)).unwrap();
    assert!(b.push_unit(&unit("b", -1.0)).is_err());
    b.push_unit(&unit("c", 2.0)).unwrap();
    let inst = b.finish().unwrap();
    assert_eq!(inst.unit_count(), 2);
    assert_eq!(inst.unit_index("b"), None);
    assert_eq!(inst.unit_demand(inst.unit_index("c").unwrap()), 2.0);
}

/// A unit refused after some of its candidates were checked must not poison the next unit's
/// duplicate-candidate check.
#[test]
fn a_refused_unit_does_not_poison_the_next_one() {
    let (classes, clusters) = specs();
    let mut b = InstanceBuilder::new(classes, clusters, Limits::default()).unwrap();
    let bad = [
        CandidateSpec {
            cluster: "fra1",
            score: 1.0,
            cluster_rank: None,
        },
        // lhr1 does not serve video: refused after fra1 was marked as seen.
        CandidateSpec {
            cluster: "lhr1",
            score: 2.0,
            cluster_rank: None,
        },
    ];
    let unit = |id, candidates| MapUnitSpec {
        id,
        class: "video",
        demand: 1.0,
        lat: 0.0,
        lon: 0.0,
        candidates,
    };
    let e = b.push_unit(&unit("a", &bad)).unwrap_err();
    assert!(matches!(e, ModelError::ClassNotServed { .. }), "{e:?}");
    b.push_unit(&unit("b", &bad[..1]))
        .expect("a valid unit after a refused one");
}

/// A cycle's error names a node on the cycle, not one hanging below it.
#[test]
fn cycle_error_names_a_node_on_the_cycle() {
    let e = check(|v| {
        fra1_tree(
            v,
            json!([
                {"name": "leaf", "kind": "fps", "capacity": 1.0, "classes": ["web"]},
                {"name": "A", "kind": "bps", "capacity": 1.0, "children": ["B", "leaf"]},
                {"name": "B", "kind": "fps", "capacity": 1.0, "children": ["A"]},
            ]),
        )
    });
    assert!(
        matches!(&e, ModelError::TreeCycle { node, .. } if node == "A" || node == "B"),
        "{e:?}"
    );
}

// ---- JSON-level failures: errors, never panics ----

#[test]
fn malformed_json_is_an_error() {
    let edits: Vec<(&str, Edit)> = vec![
        ("missing demand", |v| {
            v["map_units"][0].as_object_mut().unwrap().remove("demand");
        }),
        ("missing map_units", |v| {
            v.as_object_mut().unwrap().remove("map_units");
        }),
        ("missing resources", |v| {
            v["clusters"][0]
                .as_object_mut()
                .unwrap()
                .remove("resources");
        }),
        ("missing node kind", |v| {
            v["clusters"][0]["resources"][0]
                .as_object_mut()
                .unwrap()
                .remove("kind");
        }),
        ("missing fps coefficient", |v| {
            v["traffic_classes"][0]["per_unit"]
                .as_object_mut()
                .unwrap()
                .remove("fps");
        }),
        ("demand as a string", |v| {
            v["map_units"][0]["demand"] = json!("3")
        }),
        ("lat as null", |v| v["clusters"][0]["lat"] = Value::Null),
        ("candidates as an object", |v| {
            v["map_units"][0]["candidates"] = json!({"cluster": "fra1"})
        }),
        ("resources as a number", |v| {
            v["clusters"][0]["resources"] = json!(7)
        }),
        ("flat children as objects", |v| {
            v["clusters"][0]["resources"][0]["children"] = json!([{"name": "cpu"}])
        }),
        ("unknown resource kind", |v| {
            v["clusters"][0]["resources"][0]["kind"] = json!("iops")
        }),
        ("unknown cluster state", |v| {
            v["clusters"][0]["state"] = json!("broken")
        }),
        ("negative priority", |v| {
            v["traffic_classes"][0]["priority"] = json!(-1)
        }),
        ("fractional priority", |v| {
            v["traffic_classes"][0]["priority"] = json!(1.5)
        }),
        ("bad prefix", |v| {
            v["map_units"][0]["prefixes"] = json!(["198.51.100.0/33"])
        }),
        ("bad address", |v| {
            v["clusters"][0]["addresses"] = json!(["192.0.2.256"])
        }),
        ("top level an array", |v| *v = json!([])),
    ];
    for (name, edit) in edits {
        let mut v = base();
        edit(&mut v);
        match parse(&v, Limits::default()) {
            Err(e @ FormatError::Json { .. }) => assert!(!e.to_string().is_empty(), "{name}"),
            Err(e) => panic!("{name}: expected a JSON error, got {e}"),
            Ok(_) => panic!("{name}: accepted"),
        }
    }
    let texts: [&[u8]; 6] = [
        b"",
        b"{",
        b"not json",
        b"{\"traffic_classes\": [], \"clusters\": [], \"map_units\": [}",
        b"{\"traffic_classes\": [], \"clusters\": [], \"map_units\": []} trailing",
        // Beyond f64: serde_json refuses rather than producing infinity.
        b"{\"traffic_classes\": [{\"name\": \"w\", \"priority\": 0, \"per_unit\": {\"bps\": 1e400, \"fps\": 0}}], \"clusters\": [], \"map_units\": []}",
    ];
    for text in texts {
        assert!(
            parse_instance(text, Limits::default()).is_err(),
            "{:?}",
            String::from_utf8_lossy(text)
        );
    }
}

// ---- equivalences ----

/// Asserts that two instances have the same contents, through the public accessors (`Instance`'s
/// derived `PartialEq` cannot be used: see `an_instance_equals_its_clone`).
fn assert_same(a: &Topology, b: &Topology) {
    assert_eq!(a.classes(), b.classes());
    assert_eq!(a.clusters(), b.clusters());
    for c in 0..a.clusters().len() as u32 {
        assert_eq!(a.cluster_addresses(c), b.cluster_addresses(c));
    }
    assert_eq!(a.unit_count(), b.unit_count());
    for u in 0..a.unit_count() as u32 {
        assert_eq!(a.unit_id(u), b.unit_id(u));
        assert_eq!(a.unit_class(u), b.unit_class(u));
        assert_eq!(a.unit_demand(u), b.unit_demand(u));
        assert_eq!(a.unit_location(u), b.unit_location(u));
        assert_eq!(a.unit_prefixes(u), b.unit_prefixes(u));
        assert!(a.candidates(u).eq(b.candidates(u)), "{}", a.unit_id(u));
    }
}

#[test]
fn an_instance_equals_its_clone() {
    let inst = parse(&base(), Limits::default()).unwrap();
    assert_eq!(inst.clone(), inst);
}

#[test]
fn nested_and_flat_trees_build_identical_clusters() {
    let nested = parse(&base(), Limits::default()).unwrap();
    let fra1 = nested.cluster_index("fra1").unwrap() as usize;
    let ams1 = nested.cluster_index("ams1").unwrap() as usize;
    // fra1 is given flat and ams1 nested, with the same tree: only id, location, addresses and
    // state differ.
    let (a, b) = (&nested.clusters()[fra1], &nested.clusters()[ams1]);
    assert_eq!(a.nodes, b.nodes);
    for k in 0..3 {
        assert_eq!(a.leaf_of(k), b.leaf_of(k));
    }

    // fra1 nested, and flat in a shuffled order: identical instances.
    let mut v = base();
    fra1_tree(
        &mut v,
        json!({"name": "uplink", "kind": "bps", "capacity": 100.0, "children": [
            {"name": "cpu", "kind": "fps", "capacity": 50.0, "children": [
                {"name": "web-leaf", "kind": "fps", "capacity": 40.0, "classes": ["web"]},
                {"name": "video-leaf", "kind": "fps", "capacity": 40.0, "classes": ["video"]},
            ]},
        ]}),
    );
    assert_same(&parse(&v, Limits::default()).unwrap(), &nested);
    let mut v = base();
    fra1_tree(
        &mut v,
        json!([
            {"name": "video-leaf", "kind": "fps", "capacity": 40.0, "classes": ["video"]},
            {"name": "cpu", "kind": "fps", "capacity": 50.0,
             "children": ["web-leaf", "video-leaf"]},
            {"name": "web-leaf", "kind": "fps", "capacity": 40.0, "classes": ["web"]},
            {"name": "uplink", "kind": "bps", "capacity": 100.0, "children": ["cpu"]},
        ]),
    );
    assert_same(&parse(&v, Limits::default()).unwrap(), &nested);
}

/// A key the format does not name is refused wherever it is (a typo such as `"stat"` is
/// never taken for an absent key), with the line and column, the item it is in and the key.
#[test]
fn unknown_fields_are_refused() {
    type Edit = fn(&mut Value);
    let edits: &[(&str, &str, Edit)] = &[
        ("comment", "", |v| v["comment"] = json!("by hand")),
        ("colour", "traffic class \"web\": ", |v| {
            v["traffic_classes"][0]["colour"] = json!("blue")
        }),
        ("iops", "traffic class \"web\", per_unit: ", |v| {
            v["traffic_classes"][0]["per_unit"]["iops"] = json!(3)
        }),
        ("site", "cluster \"fra1\": ", |v| {
            v["clusters"][0]["site"] = json!({"city": "Frankfurt"})
        }),
        ("vendor", "cluster \"fra1\", resources[0]: ", |v| {
            v["clusters"][0]["resources"][0]["vendor"] = json!("x")
        }),
        ("note", "cluster \"ams1\", resources.children[0]: ", |v| {
            v["clusters"][1]["resources"]["children"][0]["note"] = json!(null)
        }),
        ("asn", "map unit \"u1\": ", |v| {
            v["map_units"][0]["asn"] = json!(64500)
        }),
        ("rtt_ms", "map unit \"u1\", candidates[0]: ", |v| {
            v["map_units"][0]["candidates"][0]["rtt_ms"] = json!(12.5)
        }),
    ];
    parse(&base(), Limits::default()).expect("the base parses");
    for (key, at_want, edit) in edits {
        let mut v = base();
        edit(&mut v);
        let text = v.to_string();
        match parse(&v, Limits::default()) {
            Err(FormatError::Json {
                line,
                column,
                at,
                message,
            }) => {
                // One line (compact JSON): the column is just after the key.
                let quoted = format!("\"{key}\"");
                let end = text.find(&quoted).expect("the key") + quoted.len();
                assert_eq!((line, column), (1, end), "{key}: {message}");
                assert_eq!(at, *at_want, "{key}");
                assert!(
                    message.starts_with(&format!("unknown field `{key}`, expected ")),
                    "{key}: {message}"
                );
            }
            Err(e) => panic!("{key}: expected a JSON error, got {e}"),
            Ok(_) => panic!("{key}: accepted"),
        }
    }
}

/// A chain of `levels` resource nodes (`n1` the root, `n<levels>` the leaf carrying web and
/// video), flat or nested.
fn chain(levels: usize, nested: bool) -> Value {
    let node = |i: usize| {
        let mut n = json!({"name": format!("n{i}"), "kind": "bps", "capacity": 100.0});
        if i == levels {
            n["classes"] = json!(["web", "video"]);
        }
        n
    };
    if nested {
        let mut tree = node(levels);
        for i in (1..levels).rev() {
            let mut parent = node(i);
            parent["children"] = json!([tree]);
            tree = parent;
        }
        tree
    } else {
        Value::Array(
            (1..=levels)
                .map(|i| {
                    let mut n = node(i);
                    if i < levels {
                        n["children"] = json!([format!("n{}", i + 1)]);
                    }
                    n
                })
                .collect(),
        )
    }
}

/// A resource tree of the most levels the model takes is parsed, and reads back from every
/// form it is written in (the nested instance file, the compact form); one level more is
/// refused with an error naming the cluster and the limit, flat or nested, before anything
/// could store it (a tree 62 levels deep was once taken and then unreadable: the journal's
/// JSON reader stops at 128 levels of nesting, two a tree level).
#[test]
fn a_resource_tree_deeper_than_the_limit_is_refused_naming_the_cluster() {
    let limit = cdnmap_mapper::MAX_TREE_DEPTH;
    for nested in [false, true] {
        let mut v = base();
        fra1_tree(&mut v, chain(limit, nested));
        let deepest = parse(&v, Limits::default()).expect("the deepest tree taken");
        let mut written = Vec::new();
        cdnmap_topology::format::write_instance(&deepest, &mut written).expect("write");
        assert_same(
            &parse_instance(&written, Limits::default()).expect("the written file reads back"),
            &deepest,
        );
        let compact = cdnmap_topology::compact::encode(&deepest);
        assert_same(
            &cdnmap_topology::compact::decode(&compact, Limits::default())
                .expect("the compact form reads back"),
            &deepest,
        );
        for levels in [limit + 1, 62, 200] {
            let mut v = base();
            fra1_tree(&mut v, chain(levels, nested));
            let e = check_with_value(v);
            let msg = e.to_string();
            assert!(
                matches!(&e, ModelError::TreeTooDeep { cluster, .. } if cluster == "fra1"),
                "{levels} levels, nested {nested}: {e:?}"
            );
            assert!(
                msg.contains("\"fra1\"") && msg.contains(&format!("{limit} levels")),
                "{msg}"
            );
        }
    }
}

/// The model error `v` is refused with (built from its JSON value: a tree nested deeper than
/// serde_json's reader of text, as Admin's conversion hands it to the model).
fn check_with_value(v: Value) -> ModelError {
    let file: InstanceFile = serde_json::from_value(v).expect("an instance file");
    match file.build(Limits::default()) {
        Err(cdnmap_topology::TopologyError::Model(e)) => e,
        Err(e) => panic!("expected a model error, got {e}"),
        Ok(_) => panic!("expected a model error, the instance was accepted"),
    }
}
