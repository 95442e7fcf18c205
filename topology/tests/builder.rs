//! The topology builder keeps each unit's prefixes and each cluster's addresses with their unit
//! and cluster whatever order they come in, refuses what is over the addressing's limits naming
//! the input, and leaves itself as it was after a refusal.

use std::collections::HashMap;
use std::net::IpAddr;

use cdnmap_mapper::{
    CandidateSpec, ClusterSpec, ClusterState, Limits, MapUnitSpec, ModelError, PerUnit,
    ResourceKind, ResourceNodeSpec, TrafficClass,
};
use cdnmap_topology::format::{parse_instance, write_instance};
use cdnmap_topology::{Topology, TopologyBuilder, MAX_ADDRESSES, MAX_PREFIXES_PER_UNIT};
use ipnet::IpNet;
use proptest::prelude::*;

fn classes() -> Vec<TrafficClass> {
    vec![TrafficClass {
        name: "web".into(),
        priority: 0,
        per_unit: PerUnit { bps: 1.0, fps: 0.0 },
        companion_share: 0.0,
    }]
}

fn cluster(id: &str) -> ClusterSpec {
    ClusterSpec {
        id: id.into(),
        lat: 0.0,
        lon: 0.0,
        state: ClusterState::Up,
        serves: None,
        resources: vec![ResourceNodeSpec {
            name: "root".into(),
            kind: ResourceKind::Bps,
            capacity: 10.0,
            classes: vec!["web".into()],
            children: vec![],
        }],
    }
}

/// A builder with one cluster, `c0`, at one address.
fn one_cluster() -> TopologyBuilder {
    TopologyBuilder::new(
        classes(),
        vec![(cluster("c0"), vec![address(1)])],
        Limits::default(),
    )
    .expect("cluster")
}

fn address(i: u32) -> IpAddr {
    IpAddr::from((0xc612_0000u32 + i).to_be_bytes())
}

fn prefix(i: u32) -> IpNet {
    IpNet::new(IpAddr::from((0x0a00_0000u32 + (i << 8)).to_be_bytes()), 24).expect("prefix")
}

fn push(
    b: &mut TopologyBuilder,
    id: &str,
    cluster: &str,
    prefixes: &[IpNet],
) -> Result<(), ModelError> {
    let cands = [CandidateSpec {
        cluster,
        score: 1.0,
        cluster_rank: None,
    }];
    let spec = MapUnitSpec {
        id,
        class: "web",
        demand: 1.0,
        lat: 0.0,
        lon: 0.0,
        candidates: &cands,
    };
    b.push_unit(&spec, prefixes)
}

proptest! {
    /// Units and clusters pushed in any order: after `finish` (which sorts both by id), every
    /// unit has the prefixes it was pushed with and every cluster its addresses; and the
    /// topology survives the file format unchanged.
    #[test]
    fn prefixes_and_addresses_follow_their_unit_and_cluster(
        unit_order in Just((0..40u32).collect::<Vec<_>>()).prop_shuffle(),
        cluster_order in Just((0..6u32).collect::<Vec<_>>()).prop_shuffle(),
        counts in proptest::collection::vec(0..4usize, 40),
    ) {
        let clusters: Vec<(ClusterSpec, Vec<IpAddr>)> = cluster_order
            .iter()
            .map(|&c| (cluster(&format!("c{c}")), (0..=c).map(|k| address(c * 16 + k)).collect()))
            .collect();
        let mut b = TopologyBuilder::new(classes(), clusters, Limits::default()).expect("clusters");
        let mut want: HashMap<String, Vec<IpNet>> = HashMap::new();
        let mut next = 0;
        for &u in &unit_order {
            let prefixes: Vec<IpNet> = (0..counts[u as usize]).map(|_| { next += 1; prefix(next) }).collect();
            let id = format!("u{u:02}");
            push(&mut b, &id, &format!("c{}", u % 6), &prefixes).expect("unit");
            want.insert(id, prefixes);
        }
        let t = b.finish().expect("topology");
        prop_assert!(t.addressing.fits(&t.instance));
        for u in 0..t.unit_count() as u32 {
            prop_assert_eq!(t.unit_prefixes(u), &want[t.unit_id(u)][..]);
        }
        for c in 0..t.clusters().len() as u32 {
            let n: u32 = t.clusters()[c as usize].id[1..].parse().expect("id");
            let addresses: Vec<IpAddr> = (0..=n).map(|k| address(n * 16 + k)).collect();
            prop_assert_eq!(t.cluster_addresses(c), &addresses[..]);
        }
        let mut json = Vec::new();
        write_instance(&t, &mut json).expect("write");
        let back = parse_instance(&json, Limits::default()).expect("read");
        prop_assert_eq!(&back, &t);
    }
}

#[test]
fn limits_are_refused_naming_the_input_and_a_refusal_changes_nothing() {
    let too_many: Vec<IpAddr> = (0..=MAX_ADDRESSES as u32).map(address).collect();
    let err = TopologyBuilder::new(
        classes(),
        vec![(cluster("big"), too_many)],
        Limits::default(),
    )
    .expect_err("too many addresses");
    assert!(err.to_string().contains("cluster \"big\""), "{err}");
    assert!(err.to_string().contains("addresses"), "{err}");

    let mut b = one_cluster();
    push(&mut b, "u1", "c0", &[prefix(1)]).expect("unit");
    let many: Vec<IpNet> = (0..=MAX_PREFIXES_PER_UNIT as u32).map(prefix).collect();
    let err = push(&mut b, "u2", "c0", &many).expect_err("too many prefixes");
    assert!(err.to_string().contains("map unit \"u2\""), "{err}");
    // Refused by the model (an unknown candidate) after the prefixes passed: nothing kept.
    push(&mut b, "u3", "nowhere", &[prefix(3)]).expect_err("unknown cluster");
    push(&mut b, "u4", "c0", &[prefix(4), prefix(5)]).expect("unit");
    let t = b.finish().expect("topology");
    assert_eq!(t.unit_count(), 2);
    let u4 = t.unit_index("u4").expect("u4");
    assert_eq!(t.unit_prefixes(u4), &[prefix(4), prefix(5)]);
    assert_eq!(
        t.unit_prefixes(t.unit_index("u1").expect("u1")),
        &[prefix(1)]
    );
}

#[test]
fn a_bare_topology_has_no_addresses_and_keeps_its_instance() {
    let mut b = one_cluster();
    push(&mut b, "u1", "c0", &[prefix(1)]).expect("unit");
    let t = b.finish().expect("topology");
    let bare = Topology::bare(t.instance.clone());
    assert_eq!(bare.instance, t.instance);
    assert!(bare.unit_prefixes(0).is_empty() && bare.cluster_addresses(0).is_empty());
    let drained = t.with_cluster_state(0, ClusterState::Drained);
    assert_eq!(drained.clusters()[0].state, ClusterState::Drained);
    assert!(std::sync::Arc::ptr_eq(&drained.addressing, &t.addressing));
}

/// `with_instance` pairs the addressing only with an instance of the same units and clusters:
/// another instance of as many units is a caller's bug, caught, not a silent mismatch of
/// prefixes and units.
#[test]
#[should_panic(expected = "other units or clusters")]
fn an_addressing_is_never_paired_with_other_units() {
    let build = |ids: [&str; 2]| {
        let mut b = one_cluster();
        for (i, id) in ids.into_iter().enumerate() {
            push(&mut b, id, "c0", &[prefix(i as u32)]).expect("unit");
        }
        b.finish().expect("topology")
    };
    let a = build(["u1", "u2"]);
    let b = build(["u1", "u3"]);
    let _ = a.with_instance(b.instance.clone());
}
