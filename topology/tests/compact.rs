//! The compact form gives back the topology it encoded, and refuses a cut, damaged or forged
//! encoding with an error, never a panic.

use std::net::IpAddr;

use cdnmap_mapper::{
    CandidateSpec, ClusterSpec, ClusterState, Limits, MapUnitSpec, PerUnit, ResourceKind,
    ResourceNodeSpec, TrafficClass,
};
use cdnmap_topology::compact::{decode, encode, CompactError, MAGIC};
use cdnmap_topology::{Topology, TopologyBuilder};
use ipnet::IpNet;
use proptest::prelude::*;

const CLASSES: [&str; 2] = ["web", "video"];

fn classes() -> Vec<TrafficClass> {
    CLASSES
        .iter()
        .enumerate()
        .map(|(i, name)| TrafficClass {
            name: (*name).into(),
            priority: i as u32,
            per_unit: PerUnit {
                bps: 1.0 + i as f64,
                fps: 0.5,
            },
            companion_share: 0.0,
        })
        .collect()
}

/// `c0` serves both classes (a tree of two leaves), `c1` web, `c2` video (drained).
fn clusters() -> Vec<(ClusterSpec, Vec<IpAddr>)> {
    let leaf = |name: &str, kind, capacity, classes: &[&str]| ResourceNodeSpec {
        name: name.into(),
        kind,
        capacity,
        classes: classes.iter().map(|c| (*c).into()).collect(),
        children: vec![],
    };
    let spec = |id: &str, state, resources| ClusterSpec {
        id: id.into(),
        lat: 1.5,
        lon: -2.25,
        state,
        serves: None,
        resources,
    };
    let mut root = leaf("root", ResourceKind::Bps, 100.0, &[]);
    root.children = vec!["w".into(), "v".into()];
    vec![
        (
            spec(
                "c0",
                ClusterState::Up,
                vec![
                    root,
                    leaf("w", ResourceKind::Fps, 40.0, &["web"]),
                    leaf("v", ResourceKind::Bps, 70.0, &["video"]),
                ],
            ),
            vec![
                "198.18.0.1".parse().expect("ip"),
                "2001:db8::1".parse().expect("ip"),
            ],
        ),
        (
            spec(
                "c1",
                ClusterState::Up,
                vec![leaf("r", ResourceKind::Bps, 10.0, &["web"])],
            ),
            vec!["198.18.1.1".parse().expect("ip")],
        ),
        (
            spec(
                "c2",
                ClusterState::Drained,
                vec![leaf("r", ResourceKind::Bps, 10.0, &["video"])],
            ),
            vec![],
        ),
    ]
}

/// One generated unit: class, demand, location, candidates (cluster, score, rank), prefixes
/// (v6 or not, length).
type UnitGen = (
    usize,
    f64,
    (f64, f64),
    Vec<(f64, Option<f64>)>,
    Vec<(bool, u8)>,
);

fn unit_strategy() -> impl Strategy<Value = UnitGen> {
    (
        0..2usize,
        0.0..1e6f64,
        (-90.0..90.0f64, -180.0..180.0f64),
        prop::collection::vec((0.0..1e4f64, prop::option::of(0.0..100.0f64)), 0..3),
        prop::collection::vec((any::<bool>(), 8..=24u8), 0..4),
    )
}

/// The topology of `units` (unit `i` named `u{i}`, pushed in reverse order so the builder
/// sorts): every prefix holds the unit's index, so no two units claim one.
fn topology(units: &[UnitGen]) -> Topology {
    let mut b = TopologyBuilder::new(classes(), clusters(), Limits::default()).expect("clusters");
    // The operator's policy (issue 46) goes with the topology; half the worlds have one.
    if units.len() % 2 == 1 {
        let spec = cdnmap_mapper::model::PolicySpec {
            cost: Some(cdnmap_mapper::model::CostSpec {
                weight: 1.5,
                guard_ms: 7.0,
                default_price: 0.25,
                prices: [("c1".to_string(), 3.0)].into_iter().collect(),
            }),
        };
        b.set_policy(&spec).expect("a valid policy");
    }
    for (i, (class, demand, (lat, lon), cands, prefixes)) in units.iter().enumerate().rev() {
        // Clusters of the class, in order: web c0 c1, video c0 c2.
        let serving = [["c0", "c1"], ["c0", "c2"]][*class];
        let cands: Vec<CandidateSpec<'_>> = cands
            .iter()
            .zip(serving)
            .map(|(&(score, cluster_rank), cluster)| CandidateSpec {
                cluster,
                score,
                cluster_rank,
            })
            .collect();
        let nets: Vec<IpNet> = prefixes
            .iter()
            .enumerate()
            .map(|(j, &(v6, len))| {
                let tag = (i as u32) << 8 | j as u32;
                if v6 {
                    let a = 0x2001_0db8_0000_0000_0000_0000_0000_0000u128 | u128::from(tag) << 64;
                    IpNet::new(IpAddr::from(a.to_be_bytes()), 64 + len).expect("v6")
                } else {
                    IpNet::new(IpAddr::from((tag << 8).to_be_bytes()), len.max(24)).expect("v4")
                }
            })
            .collect();
        let spec = MapUnitSpec {
            id: &format!("u{i:03}"),
            class: CLASSES[*class],
            demand: *demand,
            lat: *lat,
            lon: *lon,
            candidates: &cands,
        };
        b.push_unit(&spec, &nets).expect("unit");
    }
    b.finish().expect("topology")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Decoding an encoding gives the topology back: units, candidates (scores, explicit
    /// ranks), prefixes, clusters with their trees, states and addresses.
    #[test]
    fn a_topology_survives_the_compact_form(units in prop::collection::vec(unit_strategy(), 0..40)) {
        let t = topology(&units);
        let bytes = encode(&t);
        prop_assert!(bytes.starts_with(MAGIC));
        let back = decode(&bytes, Limits::default()).expect("decoded");
        prop_assert_eq!(&back, &t);
        // And the encoding is a function of the topology.
        prop_assert_eq!(encode(&back), bytes);
        // The instance file form keeps it too, policy and all.
        let file = cdnmap_topology::format::InstanceFile::of(&t);
        prop_assert_eq!(file.policy.is_some(), units.len() % 2 == 1);
        let json = serde_json::to_vec(&file).expect("json");
        let again: cdnmap_topology::format::InstanceFile = serde_json::from_slice(&json).expect("parsed");
        prop_assert_eq!(&again.build(Limits::default()).expect("built"), &t);
    }

    /// Any byte changed, at any place, gives an error or a topology, never a panic; and a
    /// topology that comes back is valid (it went through the builder).
    #[test]
    fn a_damaged_encoding_never_panics(
        units in prop::collection::vec(unit_strategy(), 1..10),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = encode(&topology(&units));
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x.max(1);
        }
        if let Ok(t) = decode(&bytes, Limits::default()) {
            prop_assert_eq!(t.addressing.unit_count(), t.unit_count());
        }
    }
}

/// Every cut of an encoding is refused with an error.
#[test]
fn every_cut_of_an_encoding_is_refused() {
    let units: Vec<UnitGen> = (0..6)
        .map(|i| {
            (
                i % 2,
                10.0 * i as f64,
                (1.0, 2.0),
                vec![(1.0, Some(3.0)), (2.0, None)],
                vec![(i % 3 == 0, 16)],
            )
        })
        .collect();
    let bytes = encode(&topology(&units));
    for cut in 0..bytes.len() {
        let e = decode(&bytes[..cut], Limits::default()).expect_err("a cut encoding");
        let msg = e.to_string();
        assert!(!msg.is_empty(), "cut at {cut}");
        if cut < MAGIC.len() {
            assert!(matches!(e, CompactError::Header), "cut at {cut}: {e}");
        }
    }
    assert!(decode(&bytes, Limits::default()).is_ok());
}

/// A JSON instance file is not a compact topology, and says so.
#[test]
fn a_json_file_is_refused_by_its_header() {
    let e = decode(br#"{"traffic_classes": []}"#, Limits::default()).expect_err("json");
    assert!(e.to_string().contains("CDNTOP01"), "{e}");
}

/// A writer that takes `room` bytes, then fails.
struct Full {
    taken: Vec<u8>,
    room: usize,
}

impl std::io::Write for Full {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.taken.len() + buf.len() > self.room {
            return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "full"));
        }
        self.taken.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// The chunked writer gives postcard's own bytes, across chunk boundaries (varints one by
    /// one, byte strings longer than a chunk), and a writer's error is the writer's.
    #[test]
    fn postcard_to_io_writes_postcards_bytes(
        words in prop::collection::vec(any::<u32>(), 0..40_000),
        bytes in prop::collection::vec(any::<u8>(), 0..150_000),
        text in ".{0,40}",
        pairs in prop::collection::vec(any::<(u16, f64)>(), 0..5_000),
        room in 0usize..200_000,
    ) {
        let value = (&words, serde_bytes_of(&bytes), &text, &pairs);
        let expected = postcard::to_stdvec(&value).expect("postcard");
        let mut out = Vec::new();
        cdnmap_topology::compact::postcard_to_io(&value, &mut out).expect("written");
        prop_assert_eq!(&out, &expected);
        let mut full = Full { taken: Vec::new(), room };
        match cdnmap_topology::compact::postcard_to_io(&value, &mut full) {
            Ok(()) => prop_assert_eq!(&full.taken, &expected),
            Err(e) => {
                prop_assert!(expected.len() > room, "failed with room for all");
                prop_assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
                prop_assert!(expected.starts_with(&full.taken));
            }
        }
    }
}

/// `bytes` serialized as one byte string (postcard: a length, then the bytes in one piece).
fn serde_bytes_of(bytes: &[u8]) -> ByteString<'_> {
    ByteString(bytes)
}

struct ByteString<'a>(&'a [u8]);

impl serde::Serialize for ByteString<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}
