//! The store's tests.

use super::map_record::{
    CompactMap, Delta, MapColumns, Record03, Record04, SERVED_MAGIC_03, SERVED_MAGIC_04,
};
use super::*;
use crate::edit::apply;
use cdnmap_mapper::{solve, ClusterState, SolveOptions};
use cdnmap_topology::format::{parse_instance, write_instance};
use std::sync::Arc;

pub(super) fn instance() -> Topology {
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

/// `s` as the build before wrote its record (format 04: the demands as `f64`s).
fn record04(s: &ServedRef<'_>) -> Vec<u8> {
    let inst = s.instance;
    let demands: Vec<f64> = (0..inst.unit_count() as u32)
        .map(|u| inst.unit_demand(u))
        .collect();
    let old = Record04 {
        epoch: s.epoch,
        version: s.version,
        solved_at_unix_ms: s.solved_at_unix_ms,
        base_generation: s.base_seq,
        map: CompactMap::of(s.map, Some(inst)),
        demands,
        per_unit: inst.classes().iter().map(|c| c.per_unit).collect(),
        capacities: inst.capacities(),
    };
    let mut bytes = SERVED_MAGIC_04.to_vec();
    bytes.extend(postcard::to_stdvec(&old).expect("encode"));
    bytes
}

/// Opens the store again once the dropped one's background threads let go of its lock
/// (sled releases it a moment after the last handle is dropped).
pub(super) fn reopen(path: &Path) -> Store {
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

#[test]
fn topology_and_maps_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance().with_cluster_state(1, ClusterState::Drained);
    let map = solve(&inst, &SolveOptions::default()).map;
    let entry = |version: u64| format!("entry {version}").into_bytes();
    let served = |version: u64| Served {
        epoch: 3,
        version,
        solved_at_unix_ms: 1_000 * version as i64,
        topology: inst.clone(),
        map: map.clone(),
        estimator: EstimatorLog {
            checkpoint: Some((1, b"state 1".to_vec())),
            entries: (2..=version).map(|v| (v, entry(v))).collect(),
        },
    };
    {
        let store = Store::open(dir.path()).expect("open");
        assert!(store.topology(Limits::default()).expect("read").is_none());
        assert!(store.served().expect("read").is_none());
        assert_eq!(store.next_epoch(0).expect("epoch"), 1);
        store.put_topology(&inst).expect("topology");
        for version in 1..=5 {
            store
                .put_served(&served(version).as_ref(0), 3)
                .expect("map");
            if version == 1 {
                store.put_checkpoint(1, b"state 1").expect("checkpoint");
            }
        }
    }
    let store = reopen(dir.path());
    assert_eq!(store.next_epoch(0).expect("epoch"), 2);
    let back = store
        .topology(Limits::default())
        .expect("read")
        .expect("stored");
    assert_eq!(back, inst);
    assert_eq!(store.served().expect("read"), Some(served(5)));
    // The topology is kept in the compact form, once: the records name it.
    let bytes = store
        .values
        .get(&snapshot_name(0))
        .expect("read")
        .expect("snapshot");
    assert!(bytes.starts_with(cdnmap_topology::compact::MAGIC));
    assert_eq!(snapshots(&store.values).expect("list").len(), 1);
}

/// The history keeps `keep` records (the served one counts), each read back exactly with
/// the instance it was solved for, and the bases only the records still kept name.
#[test]
fn older_versions_are_read_back_from_the_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = instance();
    let edited = first.with_cluster_state(0, ClusterState::Drained);
    let store = Store::open(dir.path()).expect("open");
    let a = |cluster, amount| cdnmap_mapper::Allocation { cluster, amount };
    // Version v: u1 on a or b by parity, u2 split by v (or overflowing).
    let map_of = |v: u64| {
        let mut m = Map::with_capacity(2, 3);
        m.push_unit([a((v % 2) as u32, 1.0)], 0.0);
        if v.is_multiple_of(3) {
            m.push_unit([a(1, 0.5)], 0.5);
        } else {
            m.push_unit([a(0, 1.0 / v as f64), a(1, 1.0 - 1.0 / v as f64)], 0.0);
        }
        m
    };
    let maps: Vec<Map> = (0..=8).map(map_of).collect();
    // Versions 1-4 from the first topology, 5-8 from the edited one (edit 1 of the journal).
    store.put_topology(&first).expect("topology");
    let base_of = |v: u64| if v < 5 { (&first, 0) } else { (&edited, 1) };
    for v in 1..=8u64 {
        if v == 5 {
            let drain = crate::edit::Edit::ClusterState {
                id: "a".into(),
                state: ClusterState::Drained,
            };
            assert_eq!(store.append_edit(0, &drain).expect("journal"), 1);
        }
        let (base, seq) = base_of(v);
        store
            .put_served(
                &ServedRef {
                    epoch: 1,
                    version: v,
                    solved_at_unix_ms: v as i64,
                    base_seq: seq,
                    instance: base,
                    map: &maps[v as usize],
                    round_entry: &[],
                },
                4,
            )
            .expect("served");
        let (instance, map) = store.stored_map(v).expect("read").expect("stored");
        assert_eq!((&instance, &map), (base, &maps[v as usize]), "v{v}");
        if v == 4 {
            assert_eq!(store.map_count().expect("count"), 4);
            let (instance, map) = store.stored_map(1).expect("read").expect("kept");
            assert_eq!((&instance, &map), (&first, &maps[1]));
        }
    }
    assert_eq!(
        store.map_count().expect("count"),
        4,
        "the served version and three before it"
    );
    for v in 5..=8 {
        let (instance, map) = store.stored_map(v).expect("read").expect("kept");
        assert_eq!((&instance, &map), (&edited, &maps[v as usize]), "v{v}");
    }
    assert_eq!(
        store.stored_map(4).expect("read"),
        None,
        "beyond the history"
    );
    assert_eq!(store.stored_map(9).expect("read"), None, "not yet");
    assert_eq!(
        snapshots(&store.values).expect("list"),
        vec![(0, snapshot_name(0))],
        "one snapshot, the journal's edit replayed onto it"
    );
    assert_eq!(store.served().expect("read").expect("stored").version, 8);
    // The value files alone, read while the store (and sled's lock) is open, list and give
    // back the same versions.
    let read_only = StoredMaps::open(dir.path()).expect("read only");
    let listed: Vec<(u64, u64, i64, u64)> = read_only
        .versions()
        .expect("versions")
        .iter()
        .map(|v| (v.epoch, v.version, v.solved_at_unix_ms, v.base_generation))
        .collect();
    assert_eq!(
        listed,
        (5..=8).map(|v| (1, v, v as i64, 1)).collect::<Vec<_>>()
    );
    assert_eq!(read_only.newest().expect("newest"), Some(8));
    for v in 5..=8 {
        let got = read_only.get(v).expect("read").expect("kept");
        assert_eq!(
            (&got.topology, &got.map),
            (&edited, &maps[v as usize]),
            "v{v}"
        );
    }
    assert_eq!(read_only.get(4).expect("read").map(|s| s.version), None);
    // A record cut short is refused, naming what it is.
    store
        .values
        .put(&record_name(6, BaseOf::Journal(1)), &[&b"CDNSRV04\xff"[..]])
        .expect("write");
    let err = store.stored_map(6).expect_err("corrupt");
    assert!(err.to_string().contains("stored map version 6"), "{err}");
    let err = read_only.versions().expect_err("corrupt");
    assert!(err.to_string().contains("stored map version 6"), "{err}");
    // A directory that is not a store is named.
    let err = StoredMaps::open(&dir.path().join("nowhere")).expect_err("no store");
    assert!(err.to_string().contains("nowhere"), "{err}");
}

/// A checkpoint drops the entries it covers and keeps the later ones; a missing entry
/// (a round whose write failed) ends the replayable entries before it; without a
/// checkpoint no entry is replayable.
#[test]
fn the_estimator_log_is_a_checkpoint_and_the_entries_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    store.put_topology(&inst).expect("topology");
    let put = |version: u64| {
        let e = format!("e{version}").into_bytes();
        store
            .put_served(
                &ServedRef {
                    epoch: 1,
                    version,
                    solved_at_unix_ms: 0,
                    base_seq: 0,
                    instance: &inst,
                    map: &map,
                    round_entry: &e,
                },
                4,
            )
            .expect("served");
    };
    let log = |store: &Store| store.served().expect("read").expect("stored").estimator;
    let versions = |l: &EstimatorLog| l.entries.iter().map(|(v, _)| *v).collect::<Vec<_>>();
    for v in 1..=3 {
        put(v);
    }
    assert_eq!(log(&store), EstimatorLog::default(), "no checkpoint yet");
    store.put_checkpoint(2, b"s2").expect("checkpoint");
    for v in 4..=7 {
        put(v);
    }
    let l = log(&store);
    assert_eq!(l.checkpoint, Some((2, b"s2".to_vec())));
    assert_eq!(versions(&l), vec![3, 4, 5, 6, 7]);
    assert_eq!(l.entries[0].1, b"e3".to_vec());
    store.put_checkpoint(5, b"s5").expect("checkpoint");
    assert_eq!(versions(&log(&store)), vec![6, 7]);
    assert_eq!(
        store.values.names(ENTRY_FILE).expect("list"),
        vec![entry_name(6), entry_name(7)],
        "covered entries are dropped"
    );
    store.values.remove(&entry_name(6)).expect("remove");
    assert_eq!(
        versions(&log(&store)),
        Vec::<u64>::new(),
        "stops before the gap"
    );
    // A cut checkpoint is an error naming it.
    store
        .values
        .put(CHECKPOINT_FILE, &[&b"CDNEST01\x00"[..]])
        .expect("write");
    let err = store.served().expect_err("cut checkpoint");
    assert!(err.to_string().contains("checkpoint"), "{err}");
}

/// A store written before the served record existed: its history's newest map (JSON) is
/// read against the topology.
#[test]
fn a_legacy_history_is_read_against_the_topology() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    let meta = StoredMapMeta {
        version: 3,
        solved_at_unix_ms: 30,
    };
    let mut json = Vec::new();
    cdnmap_topology::format::write_assignment(&inst, &map, &meta, &mut json).expect("write");
    store.maps.insert(3u64.to_be_bytes(), json).expect("insert");
    assert!(store.served().expect("read").is_none());
    let (back_meta, back_map) = store.latest_map(&inst).expect("read").expect("stored");
    assert_eq!((back_meta, back_map), (meta, map));
}

/// The served record carries its own instance: a topology that lost a unit and a cluster
/// since (Admin deletes) does not make it unreadable.
#[test]
fn the_served_map_is_read_without_the_topology() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    let record = Served {
        epoch: 1,
        version: 9,
        solved_at_unix_ms: 5,
        topology: inst.clone(),
        map,
        estimator: EstimatorLog::default(),
    };
    store.put_topology(&inst).expect("topology");
    store.put_served(&record.as_ref(0), 4).expect("map");
    // Edits since, and a snapshot of the edited topology: the record's base is rebuilt from
    // the snapshot it was solved from, which is kept for it.
    let mut now = Arc::new(inst.clone());
    for edit in [
        crate::edit::Edit::DeleteMapUnit { id: "u1".into() },
        crate::edit::Edit::DeleteCluster { id: "b".into() },
    ] {
        now = apply(&now, &edit).expect("applies").topology;
        store.append_edit(0, &edit).expect("journal");
    }
    store.put_snapshot(2, &now).expect("snapshot");
    assert_eq!(store.served().expect("read"), Some(record));
    let (stored, seq) = store
        .stored_topology(Limits::default())
        .expect("read")
        .expect("stored");
    assert_eq!((&stored, seq), (&*now, 2));
}

/// A round's instance differs from its base topology by demands, coefficients and
/// capacities: the record stores only those, and reads the round's instance back exactly;
/// a later record with the same base does not write it again.
#[test]
fn the_rounds_instance_is_read_back_from_its_base() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = instance();
    let round = base
        .with_demands(vec![0.75, 1.0 / 3.0])
        .and_then(|i| {
            i.with_costs(
                &[cdnmap_mapper::PerUnit { bps: 1.1, fps: 0.7 }],
                &[0.9, 1.0],
            )
        })
        .expect("edits");
    let map = solve(&round, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    store.put_topology(&base).expect("topology");
    let record = |version| ServedRef {
        epoch: 2,
        version,
        solved_at_unix_ms: 7,
        base_seq: 0,
        instance: &round,
        map: &map,
        round_entry: b"e",
    };
    store.put_served(&record(1), 4).expect("first");
    store.put_served(&record(2), 4).expect("second");
    let back = store.served().expect("read").expect("stored");
    assert_eq!(back.topology.instance, round);
    assert_eq!(back.map, map);
    assert_eq!((back.epoch, back.version), (2, 2));
    // A record naming an edit the journal does not have is refused, naming it.
    store
        .put_served(
            &ServedRef {
                base_seq: 5,
                ..record(3)
            },
            4,
        )
        .expect("third");
    let err = store.served().expect_err("mismatch");
    assert!(
        err.to_string().contains("the journal ends before it"),
        "{err}"
    );
}

/// The compact map reads back bit for bit: a whole-demand unit (no amount stored), a split
/// unit, one allocation short of its demand, overflow (and a negative zero), no
/// allocation at all; with and without the demands; and a column cut short is refused.
#[test]
fn a_compact_map_reads_back_bit_for_bit() {
    let inst = instance();
    let four = |demands: Vec<f64>| {
        let mut file = cdnmap_topology::format::InstanceFile::of(&inst);
        let mut u = file.map_units[0].clone();
        for (i, d) in demands.iter().enumerate() {
            u.id = format!("v{i}");
            u.demand = *d;
            u.prefixes = vec![format!("10.1.{i}.0/24").parse().expect("prefix")];
            file.map_units.push(u.clone());
        }
        file.map_units.retain(|u| u.id.starts_with('v'));
        for k in &mut file.traffic_classes {
            k.companion_share = 0.25;
        }
        file.build(Limits::default()).expect("valid")
    };
    let inst = four(vec![1.0 / 3.0, 2.0, 1.0, 5.0, 0.0]);
    let a = |cluster, amount| cdnmap_mapper::Allocation { cluster, amount };
    let mut map = Map::with_capacity(5, 6);
    map.push_unit([a(0, 1.0 / 3.0)], 0.0); // whole
    map.push_unit([a(0, 1.25), a(1, 0.75)], 0.0); // split
    map.push_unit([a(1, 0.5)], 0.5); // overflow
    map.push_unit([a(1, 5.0)], -0.0); // whole amount, but a negative-zero overflow
    map.push_unit([], 0.0); // nothing placed
    let map = {
        // The same with a companion at v0 (whole: the demand split by the class's share), v1
        // (split) and v2 (with overflow).
        let mut with = Map::with_capacity(5, 8);
        let (rest, reserved) = cdnmap_mapper::companion::split(0.25, 1.0 / 3.0);
        with.push_unit_with([a(0, rest)], Some(a(1, reserved)), 0.0);
        for u in 1..5 {
            let companion = [1, 2].contains(&u).then(|| a(0, 0.25));
            let placed = map.allocations(u).iter().map(|x| match u {
                1 | 2 => a(x.cluster, x.amount - 0.25 / map.allocations(u).len() as f64),
                _ => *x,
            });
            with.push_unit_with(placed, companion, map.overflow(u));
        }
        with
    };
    let mut damaged = CompactMap::of(&map, None);
    damaged.count[4] |= 1 << 31; // a companion of a unit with no allocation
    assert!(damaged.to_map(&inst).is_err());
    for demands in [Some(&*inst), None] {
        let compact = CompactMap::of(&map, demands);
        let back = compact.to_map(&inst).expect("reads back");
        assert_eq!(back, map);
        for u in 0..5 {
            assert_eq!(back.overflow(u).to_bits(), map.overflow(u).to_bits());
        }
        if demands.is_some() {
            assert_eq!(
                compact.amount.len(),
                5,
                "the whole demand of v0 (beside its companion) is not stored, the others are"
            );
        }
        let mut cut = CompactMap::of(&map, demands);
        cut.amount.pop();
        assert!(cut.to_map(&inst).is_err());
    }
}

/// A store of the build before the history: its one served record (format 03, the
/// estimator's whole state inline) and base are read, and the next record replaces them.
#[test]
fn a_record_of_the_build_before_is_read_then_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    let n = map.unit_count() as u32;
    let old = Record03 {
        epoch: 2,
        version: 7,
        solved_at_unix_ms: 70,
        base_generation: 3,
        demands: (0..n).map(|u| inst.unit_demand(u)).collect(),
        per_unit: inst.classes().iter().map(|c| c.per_unit).collect(),
        capacities: inst.capacities(),
        map: MapColumns {
            count: (0..n).map(|u| map.allocations(u).len() as u32).collect(),
            overflow: (0..n).map(|u| map.overflow(u)).collect(),
            cluster: (0..n)
                .flat_map(|u| map.allocations(u).iter().map(|a| a.cluster))
                .collect(),
            amount: (0..n)
                .flat_map(|u| map.allocations(u).iter().map(|a| a.amount))
                .collect(),
        },
    };
    let mut bytes = SERVED_MAGIC_03.to_vec();
    bytes.extend(postcard::to_stdvec(&old).expect("encode"));
    bytes.extend(3u64.to_le_bytes());
    bytes.extend(b"est");
    store.served.insert(SERVED_KEY, bytes).expect("insert");
    let mut base = 3u64.to_be_bytes().to_vec();
    write_instance(&inst, &mut base).expect("json");
    store.served.insert(BASE_KEY, base).expect("insert");
    store
        .maps
        .insert(6u64.to_be_bytes(), &b"old"[..])
        .expect("insert");
    store.flush_all().expect("flush");
    drop(store);
    // Opening moves the record and its base to value files.
    let store = reopen(dir.path());
    assert!(store.served.get(SERVED_KEY).expect("get").is_none());
    assert!(store.served.get(BASE_KEY).expect("get").is_none());
    let back = store.served().expect("read").expect("stored");
    assert_eq!((back.epoch, back.version, &back.map), (2, 7, &map));
    assert_eq!(back.estimator.checkpoint, Some((7, b"est".to_vec())));
    store.put_topology(&inst).expect("topology");
    store
        .put_served(
            &ServedRef {
                version: 8,
                ..back.as_ref(0)
            },
            4,
        )
        .expect("next");
    assert_eq!(store.served().expect("read").expect("stored").version, 8);
    assert!(
        store.maps.is_empty(),
        "the older build's history is dropped too"
    );
}

#[test]
fn a_cut_served_record_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    let record = Served {
        epoch: 1,
        version: 1,
        solved_at_unix_ms: 0,
        topology: inst,
        map,
        estimator: EstimatorLog::default(),
    };
    store.put_topology(&record.topology).expect("topology");
    store.put_served(&record.as_ref(0), 4).expect("map");
    let name = record_name(1, BaseOf::Journal(0));
    let bytes = store.values.get(&name).expect("get").expect("stored");
    // A record cut short inside a sound value file: the record's decoder refuses it.
    for cut in [0, 7, 8, 20, bytes.len() / 2, bytes.len() - 1] {
        store.values.put(&name, &[&bytes[..cut]]).expect("write");
        let err = store.served().expect_err("cut short");
        assert!(err.to_string().contains("served map"), "{err}");
    }
    // The value file itself cut short: its header refuses it, naming the file.
    store.values.put(&name, &[&bytes]).expect("write");
    let path = dir.path().join(VALUES_DIR).join(&name);
    let file = std::fs::read(&path).expect("read");
    std::fs::write(&path, &file[..file.len() - 3]).expect("cut");
    let err = store.served().expect_err("cut file");
    assert!(err.to_string().contains(&name), "{err}");
}

/// A store of the build before, which kept its values in sled (records, bases, round entries,
/// the checkpoint, the topology): opening it moves them to value files, and it reads back
/// exactly what it held, then goes on from there.
#[test]
fn a_store_that_kept_its_values_in_sled_is_moved_to_files_and_reads_back_the_same() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    let mut json = Vec::new();
    write_instance(&inst, &mut json).expect("json");
    store
        .topology
        .insert(TOPOLOGY_KEY, json.clone())
        .expect("topology");
    store
        .served
        .insert(prefixed(BASE_PREFIX, 1), json)
        .expect("base");
    for version in 1..=3u64 {
        let served = ServedRef {
            epoch: 4,
            version,
            solved_at_unix_ms: 10 * version as i64,
            base_seq: 1,
            instance: &inst,
            map: &map,
            round_entry: &[],
        };
        let bytes = record04(&served);
        store
            .served
            .insert(record_key(version, 1), bytes)
            .expect("record");
        let entry = format!("e{version}").into_bytes();
        store
            .served
            .insert(prefixed(ENTRY_PREFIX, version), entry)
            .expect("entry");
    }
    let mut checkpoint = CHECKPOINT_MAGIC.to_vec();
    checkpoint.extend(1u64.to_be_bytes());
    checkpoint.extend(b"s1");
    store
        .served
        .insert(CHECKPOINT_KEY, checkpoint)
        .expect("checkpoint");
    store.flush_all().expect("flush");
    drop(store);

    let store = reopen(dir.path());
    assert!(store.served.is_empty(), "every value moved out of sled");
    assert_eq!(store.topology.get(TOPOLOGY_KEY).expect("get"), None);
    assert_eq!(
        store.topology(Limits::default()).expect("read"),
        Some(inst.clone())
    );
    assert_eq!(store.map_count().expect("count"), 3);
    let back = store.served().expect("read").expect("stored");
    assert_eq!(
        (back.epoch, back.version, &back.topology, &back.map),
        (4, 3, &inst, &map)
    );
    assert_eq!(back.estimator.checkpoint, Some((1, b"s1".to_vec())));
    let entries: Vec<(u64, Vec<u8>)> = vec![(2, b"e2".to_vec()), (3, b"e3".to_vec())];
    assert_eq!(back.estimator.entries, entries);
    let (old, old_map) = store.stored_map(1).expect("read").expect("kept");
    assert_eq!((&old, &old_map), (&inst, &map));
    drop(store);
    // A second open finds nothing left to move and reads the same.
    let store = reopen(dir.path());
    assert_eq!(store.served().expect("read").expect("stored"), back);
}

/// Bounds of age and count, and no byte bound to speak of.
fn bounded(retain_ms: i64, max_reports: usize) -> ReportBounds {
    ReportBounds {
        retain_ms,
        max_reports,
        max_bytes: u64::MAX,
    }
}

/// Past the byte bound the oldest segments go, whatever their age; the newest are read as
/// appended, and a reopened store reads the same.
#[test]
fn reports_past_the_byte_bound_go_oldest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let payload = vec![b'x'; 4 << 20];
    let bounds = ReportBounds {
        retain_ms: i64::MAX,
        max_reports: usize::MAX,
        max_bytes: 3 * reports::SEGMENT_BYTES,
    };
    let (held, on_disk) = {
        let store = Store::open(dir.path()).expect("open");
        // 40 reports of 4 MiB: 160 MiB through a log bounded to 96 MiB.
        for t in 0..40i64 {
            store.append_report(t, &payload, bounds).expect("append");
            assert!(store.report_bytes().expect("bytes") <= bounds.max_bytes + (4 << 20) + 64);
        }
        let held = store.reports(0, i64::MAX).expect("read");
        (held, store.report_bytes().expect("bytes"))
    };
    let times: Vec<i64> = held.iter().map(|(t, _)| *t).collect();
    // Whole segments go: what is kept is within a segment and a report of the bound.
    let kept_bytes = times.len() as u64 * payload.len() as u64;
    assert!(
        kept_bytes + reports::SEGMENT_BYTES + payload.len() as u64 > bounds.max_bytes
            && times.len() < 40,
        "{times:?}"
    );
    let newest: Vec<i64> = (40 - times.len() as i64..40).collect();
    assert_eq!(times, newest, "the newest are kept, in order");
    let segments_bytes: u64 = std::fs::read_dir(dir.path().join(REPORTS_DIR))
        .expect("list")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(reports::PREFIX))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert_eq!(segments_bytes, on_disk, "the files are what the log counts");
    let store = reopen(dir.path());
    assert_eq!(store.reports(0, i64::MAX).expect("read"), held);
}

#[test]
fn reports_are_kept_by_age_and_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    for t in 0..10i64 {
        let body = format!("{{\"t\": {t}}}");
        store
            .append_report(t * 1_000, body.as_bytes(), bounded(5_000, 100))
            .expect("append");
    }
    // At t = 9 s with 5 s of retention: reports from 4 s on are kept.
    let kept = store.reports(0, i64::MAX).expect("read");
    let times: Vec<i64> = kept.iter().map(|(t, _)| *t).collect();
    assert_eq!(times, vec![4_000, 5_000, 6_000, 7_000, 8_000, 9_000]);
    assert_eq!(kept[0].1, b"{\"t\": 4}".to_vec());
    store
        .append_report(9_500, b"{}", bounded(60_000, 3))
        .expect("append");
    assert_eq!(store.reports(0, i64::MAX).expect("read").len(), 3);
    assert_eq!(store.reports(8_000, 9_000).expect("read").len(), 1);
    // A bounded read gives the same reports within its bound, and nothing past it.
    let all = store.reports(0, i64::MAX).expect("read");
    let bytes: usize = all.iter().map(|(_, p)| p.len()).sum();
    let within = store.reports_within(0, i64::MAX, bytes).expect("read");
    assert_eq!(within.as_ref(), Some(&all));
    assert_eq!(
        store.reports_within(0, i64::MAX, bytes - 1).expect("read"),
        None
    );
    assert_eq!(
        store
            .reports_within(9_400, 9_600, 2)
            .expect("read")
            .map(|r| r.len()),
        Some(1)
    );
    // The walk /record streams: the same reports; stopped when asked.
    let mut walked = Vec::new();
    store
        .for_each_report(0, i64::MAX, |at, p| {
            walked.push((at, p.to_vec()));
            true
        })
        .expect("walk");
    assert_eq!(walked, all);
    let mut seen = 0;
    store
        .for_each_report(0, i64::MAX, |_, _| {
            seen += 1;
            false
        })
        .expect("walk");
    assert_eq!(seen, 1);
    // The bytes a period may cover, known from the segments: at least what a read returns,
    // none for a period before every report.
    let covered = store.report_bytes_within(0, i64::MAX).expect("bytes");
    assert!(covered >= bytes as u64, "{covered} < {bytes}");
    assert_eq!(store.report_bytes_within(-5_000, 0).expect("bytes"), 0);
}

/// Racing appenders keep the record's bounds exactly (appends are serialized), and a reopened
/// store holds the same reports.
#[test]
fn racing_appenders_keep_the_bounds_and_a_reopen_holds_the_same_reports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let held = {
        let store = Store::open(dir.path()).expect("open");
        std::thread::scope(|s| {
            for w in 0..4i64 {
                let store = store.clone();
                s.spawn(move || {
                    for t in 0..200i64 {
                        store
                            .append_report(1_000 + t * 4 + w, b"{}", bounded(i64::MAX, 50))
                            .expect("append");
                    }
                });
            }
        });
        let held = store.reports(0, i64::MAX).expect("read");
        assert_eq!(held.len(), 50);
        held
    };
    let store = reopen(dir.path());
    assert_eq!(store.reports(0, i64::MAX).expect("read"), held);
    store
        .append_report(10_000, b"{}", bounded(i64::MAX, 10))
        .expect("append");
    assert_eq!(store.reports(0, i64::MAX).expect("read").len(), 10);
}

/// Reports an older build kept in sled are moved to the report log when the store opens.
#[test]
fn reports_in_sled_are_moved_to_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(dir.path()).expect("open");
        for (t, body) in [(5_000i64, "b"), (4_000, "a")] {
            let mut key = [0u8; 16];
            key[..8].copy_from_slice(&(t as u64).to_be_bytes());
            key[8..].copy_from_slice(&(t as u64).to_be_bytes());
            store.reports.insert(key, body.as_bytes()).expect("insert");
        }
        store.db.flush().expect("flush");
    }
    let store = reopen(dir.path());
    assert!(store.reports.is_empty());
    let back = store.reports(0, i64::MAX).expect("read");
    assert_eq!(back, vec![(4_000, b"a".to_vec()), (5_000, b"b".to_vec())]);
    drop(store);
    // (sled's flusher may hold the lock a moment after the drop: `reopen` waits for it.)
    let store = reopen(dir.path());
    assert_eq!(store.report_count().expect("count"), 2);
}

#[test]
fn a_corrupt_map_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let inst = instance();
    store.put_topology(&inst).expect("topology");
    store
        .maps
        .insert(7u64.to_be_bytes(), b"not json".to_vec())
        .expect("insert");
    let err = store.latest_map(&inst).expect_err("corrupt");
    assert!(err.to_string().contains("map version 7"), "{err}");
}

/// The served record's base is the stored topology when no edit came since (not rebuilt
/// again); after an edit it is rebuilt from the snapshot and the journal up to the edit the
/// record names, and a record solved after the edit gets the edited topology.
#[test]
fn a_records_base_is_the_stored_topology_or_rebuilt_from_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    store.put_topology(&inst).expect("topology");
    let served = |version: u64, base_seq: u64| ServedRef {
        epoch: 1,
        version,
        solved_at_unix_ms: 0,
        base_seq,
        instance: &inst,
        map: &map,
        round_entry: &[],
    };
    store.put_served(&served(7, 0), 4).expect("served");
    let on = store.served_on(&inst, 0).expect("read").expect("stored");
    assert_eq!(Some(on), store.served().expect("read"));
    // An edit since: the base is rebuilt as it was.
    let drain = crate::edit::Edit::ClusterState {
        id: "a".into(),
        state: ClusterState::Drained,
    };
    assert_eq!(store.append_edit(0, &drain).expect("journal"), 1);
    let edited = inst.with_cluster_state(0, ClusterState::Drained);
    let (stored, seq) = store
        .stored_topology(Limits::default())
        .expect("read")
        .expect("stored");
    assert_eq!((&stored, seq), (&edited, 1));
    let on = store.served_on(&edited, 1).expect("read").expect("stored");
    assert_eq!(
        on.topology, inst,
        "the base rebuilt as the record was solved"
    );
    store.put_served(&served(8, 1), 4).expect("served");
    assert_eq!(
        store.stored_map(8).expect("read").map(|(t, _)| t),
        Some(edited)
    );
    assert!(!store
        .values
        .same(TOPOLOGY_FILE, "no-such-value")
        .expect("same"));
}

/// Many edits and rounds, snapshots now and then: the store keeps at most three snapshots
/// and the journal from the oldest of them, every kept record reads back with the topology
/// it was solved from, and a reopened store has the last topology.
#[test]
fn snapshots_and_the_journal_keep_what_the_kept_records_need() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let mut now = Arc::new(inst.clone());
    // The topology after each edit, by sequence number.
    let mut after = vec![Arc::clone(&now)];
    // The sequence number each version was solved after.
    let mut seq_of = vec![0u64];
    let keep = 5;
    {
        let store = Store::open(dir.path()).expect("open");
        store.put_topology(&inst).expect("topology");
        for version in 1..=40u64 {
            // Three edits between rounds: the two clusters' states and a unit's demand.
            for k in 0..3u64 {
                let n = version * 3 + k;
                let edit = match k {
                    0 => crate::edit::Edit::ClusterState {
                        id: "a".into(),
                        state: [ClusterState::Up, ClusterState::Drained][(n % 2) as usize],
                    },
                    1 => crate::edit::Edit::ClusterState {
                        id: "b".into(),
                        state: [ClusterState::Down, ClusterState::Up][(n % 2) as usize],
                    },
                    _ => {
                        let mut u = cdnmap_topology::format::unit_file(&now, 0);
                        u.demand = version as f64;
                        crate::edit::Edit::UpsertMapUnit { unit: u }
                    }
                };
                let applied = apply(&now, &edit).expect("applies");
                if applied.changed {
                    now = applied.topology;
                    let seq = store.append_edit(0, &edit).expect("journal");
                    assert_eq!(seq, after.len() as u64);
                    after.push(Arc::clone(&now));
                }
            }
            let seq = after.len() as u64 - 1;
            seq_of.push(seq);
            if version % 7 == 0 {
                store.put_snapshot(seq, &now).expect("snapshot");
            }
            store
                .put_served(
                    &ServedRef {
                        epoch: 1,
                        version,
                        solved_at_unix_ms: 0,
                        base_seq: seq,
                        instance: &now,
                        map: &map,
                        round_entry: &[],
                    },
                    keep,
                )
                .expect("served");
            assert!(snapshots(&store.values).expect("list").len() <= 3);
            for v in version.saturating_sub(keep as u64 - 1).max(1)..=version {
                let (t, _) = store.stored_map(v).expect("read").expect("kept");
                assert_eq!(t, *after[seq_of[v as usize] as usize], "version {v}");
            }
        }
        // From the oldest snapshot on, the journal is whole.
        let oldest = snapshots(&store.values).expect("list")[0].0;
        assert_eq!(
            store.journal.read(oldest, u64::MAX).expect("read").len() as u64,
            after.len() as u64 - 1 - oldest
        );
    }
    let store = reopen(dir.path());
    let (t, seq) = store
        .stored_topology(Limits::default())
        .expect("read")
        .expect("stored");
    assert_eq!((&t, seq), (&*now, after.len() as u64 - 1));
    // Every snapshot gone: the journal's edits are refused, not dropped by a fresh start.
    for (_, name) in snapshots(&store.values).expect("list") {
        store.values.remove(&name).expect("remove");
    }
    let err = store
        .stored_topology(Limits::default())
        .expect_err("edits without a snapshot");
    assert!(err.to_string().contains("no snapshot"), "{err}");
}

/// A world of `units` map units (at most 65,536) and `clusters` clusters: the test instance's
/// unit and cluster `b`, repeated.
fn world(units: usize, clusters: usize) -> Topology {
    let mut file = cdnmap_topology::format::InstanceFile::of(&instance());
    let (unit, cluster) = (file.map_units[0].clone(), file.clusters[1].clone());
    file.clusters = (0..clusters)
        .map(|c| {
            let mut cl = cluster.clone();
            cl.id = format!("c{c}");
            cl.addresses = vec![format!("198.18.{}.{}", c / 250, c % 250 + 1)
                .parse()
                .expect("address")];
            cl
        })
        .collect();
    file.map_units = (0..units)
        .map(|i| {
            let mut u = unit.clone();
            u.id = format!("u{i:05}");
            u.prefixes = vec![format!("10.{}.{}.0/24", i / 256, i % 256)
                .parse()
                .expect("prefix")];
            u.candidates[0].cluster = "c0".into();
            u.candidates[1].cluster = format!("c{}", 1 % clusters);
            u
        })
        .collect();
    for k in &mut file.traffic_classes {
        k.companion_share = 0.3;
    }
    file.build(Limits::default()).expect("valid")
}

/// Round `r` on `base`, as the service would store it: forecasts (code values) that move a
/// little every round, one unit in 16 at a configured demand no code holds (the same every
/// round), and a map that moves one unit in 50 a round, splits some, overflows one.
fn round_of(base: &Topology, r: u64) -> (cdnmap_mapper::Instance, Map) {
    use cdnmap_estimator::demand_code;
    let n = base.unit_count();
    let k = base.clusters().len() as u64;
    let demands: Vec<f64> = (0..n as u64)
        .map(|u| {
            if u % 16 == 0 {
                1.0 / 3.0 + u as f64
            } else {
                demand_code::round(10.0 + (u % 97) as f64 * 1.7 + (r * (u % 7)) as f64 * 0.01)
            }
        })
        .collect();
    let instance = base.with_demands(demands.clone()).expect("demands");
    let a = |cluster: u64, amount| cdnmap_mapper::Allocation {
        cluster: cluster as u32,
        amount,
    };
    let mut map = Map::with_capacity(n, n + n / 50);
    for (u, &d) in demands.iter().enumerate() {
        let u = u as u64;
        let c = (u * 7 + u64::from(u % 50 <= r % 50)) % k;
        if u % 100 == 3 {
            map.push_unit([a(c, d * 0.25), a((c + 1) % k, d * 0.75)], 0.0);
        } else if u % 100 == 7 && (u % 300 != 7 || r.is_multiple_of(2)) {
            // A companion (go with the winner), beside the unit's cluster; one in three of
            // them there every other round only.
            let (rest, reserved) = cdnmap_mapper::companion::split(0.3, d);
            let companion = a((c + 1) % k, reserved);
            map.push_unit_with([a(c, rest)], Some(companion), 0.0);
        } else if u == 5 {
            map.push_unit([a(c, d / 2.0)], d / 2.0);
        } else {
            map.push_unit([a(c, d)], 0.0);
        }
    }
    (instance, map)
}

/// Puts round `v` of `base` (solved after edit `seq`) as the served record.
fn put_round(store: &Store, base: &Topology, seq: u64, v: u64, keep: usize, until: PutStep) {
    let (instance, map) = round_of(base, v);
    store
        .put_served_until(
            &ServedRef {
                epoch: 1,
                version: v,
                solved_at_unix_ms: 1_000 * v as i64,
                base_seq: seq,
                instance: &instance,
                map: &map,
                round_entry: b"e",
            },
            keep,
            until,
        )
        .expect("put");
}

/// Every version in `versions` reads back as round `v` of the base `base_of(v)` was put: its
/// instance and its map, bit for bit.
fn assert_rounds(
    store: &Store,
    versions: std::ops::RangeInclusive<u64>,
    base_of: impl Fn(u64) -> Topology,
) {
    for v in versions {
        let (instance, map) = round_of(&base_of(v), v);
        let (t, m) = store
            .stored_map(v)
            .unwrap_or_else(|e| panic!("version {v}: {e}"))
            .unwrap_or_else(|| panic!("version {v} is kept"));
        assert_eq!(t.instance, instance, "version {v}'s instance");
        assert_eq!(m, map, "version {v}'s map");
        for u in 0..instance.unit_count() as u32 {
            assert_eq!(
                t.unit_demand(u).to_bits(),
                instance.unit_demand(u).to_bits(),
                "version {v}, unit {u}"
            );
        }
    }
}

/// (version, whole or a delta against which) of each listed version.
fn kinds(store: &Store) -> Vec<(u64, RecordKind)> {
    store
        .maps()
        .versions()
        .expect("list")
        .iter()
        .map(|v| (v.version, v.kind))
        .collect()
}

/// The history after `served`, the versions back to `oldest` each a delta against the next.
fn deltas_to(oldest: u64, served: u64) -> Vec<(u64, RecordKind)> {
    (oldest..=served)
        .map(|v| {
            let kind = if v == served {
                RecordKind::Whole
            } else {
                RecordKind::Delta { against: v + 1 }
            };
            (v, kind)
        })
        .collect()
}

/// The served record is whole, every older kept version a delta against the next, much
/// smaller; each reads back exactly the instance and map that were put, across a topology edit
/// that changed the units (the delta then is against a record of other units, and as
/// right), after a reopen (the previous record read back rather than remembered), and past
/// the pruning of the oldest.
#[test]
fn older_versions_are_deltas_that_read_back_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = world(3_000, 20);
    let delete = crate::edit::Edit::DeleteMapUnit {
        id: "u00007".into(),
    };
    let edited = apply(&Arc::new(first.clone()), &delete)
        .expect("applies")
        .topology;
    let edited = Arc::unwrap_or_clone(edited);
    let base_of = |v: u64| if v < 7 { first.clone() } else { edited.clone() };
    let keep = 8;
    {
        let store = Store::open(dir.path()).expect("open");
        store.put_topology(&first).expect("topology");
        for v in 1..=12u64 {
            if v == 7 {
                assert_eq!(store.append_edit(0, &delete).expect("journal"), 1);
            }
            put_round(
                &store,
                &base_of(v),
                u64::from(v >= 7),
                v,
                keep,
                PutStep::Done,
            );
            let oldest = v.saturating_sub(keep as u64 - 1).max(1);
            assert_eq!(kinds(&store), deltas_to(oldest, v), "after version {v}");
            assert_rounds(&store, oldest..=v, base_of);
        }
        assert_eq!(store.map_count().expect("count"), keep);
        // A delta of unchanged units is a small part of a whole record (2.9 to 3.2 times
        // smaller here, a world of 3,000 units where one in 100 has a companion that moves
        // with its unit; 3.5 times without them).
        let listed = store.maps().versions().expect("list");
        let whole = listed.last().expect("served").bytes;
        for v in &listed[..listed.len() - 1] {
            if v.version >= 7 {
                assert!(
                    v.bytes * 5 < whole * 2,
                    "version {}: {} of {whole} bytes",
                    v.version,
                    v.bytes
                );
            }
        }
    }
    let store = reopen(dir.path());
    put_round(&store, &edited, 1, 13, keep, PutStep::Done);
    assert_eq!(kinds(&store), deltas_to(6, 13));
    assert_rounds(&store, 6..=13, base_of);
    assert_eq!(store.served().expect("read").expect("stored").version, 13);
}

/// A crash between any two steps of a put (the new record written; the previous one's delta
/// written; its whole file removed, which a crash may also undo) leaves a store that opens,
/// serves the new version and reads every kept version back exactly; the next puts go on
/// from there, and pruning drops what the crash left twice.
#[test]
fn a_crash_between_the_steps_of_a_put_loses_no_version() {
    let base = world(500, 5);
    for step in [PutStep::Committed, PutStep::DeltaWritten] {
        let dir = tempfile::tempdir().expect("tempdir");
        let keep = 4;
        {
            let store = Store::open(dir.path()).expect("open");
            store.put_topology(&base).expect("topology");
            for v in 1..=4 {
                put_round(&store, &base, 0, v, keep, PutStep::Done);
            }
            put_round(&store, &base, 0, 5, keep, step);
            if step == PutStep::Committed {
                // And the delta's write itself cut short.
                let tmp = delta_name(4, BaseOf::Journal(0)) + ".tmp";
                std::fs::write(dir.path().join(VALUES_DIR).join(tmp), b"half a delta")
                    .expect("tmp");
            }
        }
        let store = reopen(dir.path());
        let served = store.served().expect("read").expect("stored");
        assert_eq!(served.version, 5, "{step:?}");
        // Not yet pruned (the put stopped before); version 4 as its whole record (and, after
        // the delta's write, its delta too).
        let mut listed = deltas_to(1, 5);
        listed[3].1 = RecordKind::Whole;
        assert_eq!(kinds(&store), listed, "{step:?}");
        let files = version_files(&store.values).expect("files");
        let fours = files.iter().filter(|f| f.version == 4).count();
        assert_eq!(
            fours,
            if step == PutStep::Committed { 1 } else { 2 },
            "{step:?}"
        );
        assert_rounds(&store, 1..=5, |_| base.clone());
        // Read-only, as `cdnmap store dump` would.
        let read_only = StoredMaps::open(dir.path()).expect("read only");
        let (instance, map) = round_of(&base, 3);
        let got = read_only.get(3).expect("read").expect("kept");
        assert_eq!((&got.topology.instance, &got.map), (&instance, &map));

        put_round(&store, &base, 0, 6, keep, PutStep::Done);
        // Version 4 stays whole until it is pruned; its delta is gone.
        let mut listed = deltas_to(3, 6);
        listed[1].1 = RecordKind::Whole;
        assert_eq!(kinds(&store), listed, "{step:?}");
        assert_eq!(
            version_files(&store.values).expect("files").len(),
            4,
            "{step:?}: one file a version"
        );
        assert_rounds(&store, 3..=6, |_| base.clone());
        put_round(&store, &base, 0, 7, keep, PutStep::Done);
        put_round(&store, &base, 0, 8, keep, PutStep::Done);
        assert_eq!(kinds(&store), deltas_to(5, 8), "{step:?}");
        assert_rounds(&store, 5..=8, |_| base.clone());
    }
}

/// A damaged delta refuses its version and the older ones (read through it) with an error
/// naming its file; the newer versions read, the store opens, serves the newest and goes on
/// storing, and pruning takes the damaged delta away in its turn.
#[test]
fn a_damaged_delta_refuses_its_versions_and_nothing_else() {
    let base = world(500, 5);
    let keep = 6;
    type Damage = fn(&std::path::Path, &Values, &str);
    let damages: [(&str, Damage); 3] = [
        ("its file", |path, _, _| {
            let mut bytes = std::fs::read(path).expect("read");
            let at = bytes.len() / 2;
            bytes[at] ^= 0x55;
            std::fs::write(path, bytes).expect("damage");
        }),
        ("its contents", |_, values, name| {
            let mut bytes = values.get(name).expect("read").expect("delta");
            bytes.truncate(bytes.len() / 2);
            values.put(name, &[&bytes]).expect("write");
        }),
        ("columns that do not fit", |_, values, name| {
            let bytes = values.get(name).expect("read").expect("delta");
            let mut delta = map_record::decode_delta(&bytes).expect("a delta");
            delta.cluster.pop();
            let mut out = Vec::new();
            map_record::write_delta(&delta, &mut out).expect("encode");
            values.put(name, &[&out]).expect("write");
        }),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        store.put_topology(&base).expect("topology");
        for v in 1..=6 {
            put_round(&store, &base, 0, v, keep, PutStep::Done);
        }
        let name = delta_name(4, BaseOf::Journal(0));
        damage(
            &dir.path().join(VALUES_DIR).join(&name),
            &store.values,
            &name,
        );
        for v in [4, 2] {
            let err = store.stored_map(v).expect_err("damaged");
            assert!(
                err.to_string().contains(&name),
                "{what}: version {v}: {err}"
            );
        }
        assert_rounds(&store, 5..=6, |_| base.clone());
        drop(store);
        let store = reopen(dir.path());
        assert_eq!(store.served().expect("read").expect("stored").version, 6);
        for v in 7..=9 {
            put_round(&store, &base, 0, v, keep, PutStep::Done);
        }
        assert!(store.stored_map(4).is_err(), "{what}");
        assert_rounds(&store, 5..=9, |_| base.clone());
        put_round(&store, &base, 0, 10, keep, PutStep::Done);
        assert_eq!(kinds(&store), deltas_to(5, 10), "{what}");
        assert_rounds(&store, 5..=10, |_| base.clone());
    }
}

/// A delta applied to the record it is against gives the older record back bit for bit,
/// for random records of different unit counts (codes, exceptions, counts, clusters near
/// both ends of u32); every cut of an encoded delta, and byte flips in it, are refused or
/// read as some record, never a panic.
#[test]
fn a_delta_gives_the_older_record_back_and_damage_never_panics() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(16);
    let record = |rng: &mut rand_chacha::ChaCha8Rng, version: u64| {
        let n = rng.random_range(0..40usize);
        let demands: Vec<f64> = (0..n)
            .map(|_| match rng.random_range(0..4) {
                0 => rng.random_range(0.0..1e6),
                1 => f64::from_bits(rng.random::<u64>() >> 2),
                _ => cdnmap_estimator::demand_code::decode(rng.random_range(0..0xfeff)),
            })
            .collect();
        let (mut count, mut cluster, mut amount, mut overflow) = (vec![], vec![], vec![], vec![]);
        for u in 0..n as u32 {
            let k = rng.random_range(0..4u32);
            let whole = k == 1 && rng.random_bool(0.7);
            count.push(k << 1 | u32::from(whole));
            for _ in 0..k {
                cluster.push(if rng.random_bool(0.2) {
                    u32::MAX - rng.random_range(0..3)
                } else {
                    rng.random_range(0..10)
                });
                if !whole {
                    amount.push(rng.random::<f64>());
                }
            }
            if rng.random_bool(0.1) {
                overflow.push((u, rng.random::<f64>()));
            }
        }
        Record {
            epoch: 1,
            version,
            solved_at_unix_ms: version as i64,
            base_generation: rng.random_range(0..3),
            per_unit: vec![cdnmap_mapper::PerUnit { bps: 1.0, fps: 2.0 }],
            capacities: vec![rng.random::<f64>(); rng.random_range(0..3)],
            demands: map_record::Demands::of(&demands),
            map: CompactMap {
                count,
                cluster,
                amount,
                overflow,
            },
        }
    };
    for case in 0..2_000 {
        let older = record(&mut rng, 4);
        let newer = if case % 3 == 0 {
            // The next round of the same units: most columns the same.
            let mut newer = older.clone();
            newer.version = 5;
            for c in newer.demands.codes.0.iter_mut().step_by(3) {
                *c = c
                    .saturating_add(1)
                    .min(cdnmap_estimator::demand_code::MAX_CODE);
            }
            newer
        } else {
            record(&mut rng, 5)
        };
        let delta = Delta::between(&older, &newer).expect("a delta");
        assert_eq!(delta.apply(&newer).expect("applies"), older, "case {case}");
        let mut bytes = Vec::new();
        map_record::write_delta(&delta, &mut bytes).expect("encode");
        assert_eq!(map_record::decode_delta(&bytes).expect("decodes"), delta);
        // What the store writes, computed while it is written: the same bytes.
        let mut streamed = Vec::new();
        let of = map_record::DeltaOf::new(&older, &newer).expect("columns that fit");
        map_record::write_delta(&of, &mut streamed).expect("encode");
        assert!(streamed == bytes, "case {case}: the streamed delta differs");
        let check = |bytes: &[u8]| {
            if let Ok(d) = map_record::decode_delta(bytes) {
                let _ = d.apply(&newer);
            }
        };
        for cut in 0..bytes.len() {
            assert!(
                map_record::decode_delta(&bytes[..cut]).is_err(),
                "case {case}: cut at {cut}"
            );
        }
        for _ in 0..20 {
            let mut damaged = bytes.clone();
            let at = rng.random_range(8..damaged.len());
            damaged[at] ^= 1 << rng.random_range(0..8);
            check(&damaged);
        }
        // Against another record than its own: refused.
        let mut other = newer.clone();
        other.version = 6;
        assert!(delta.apply(&other).is_err());
    }
}

/// The demands of a record: code values as codes, anything else (a configured demand, a
/// negative zero) exactly; a code that is no demand's is refused.
#[test]
fn demands_are_codes_where_exact_and_exceptions_else() {
    let demands = vec![0.0, 1.0 / 3.0, 2.0, -0.0, 55.25, 1e-310, 7.0];
    let d = map_record::Demands::of(&demands);
    assert_eq!(d.exceptions.len(), 3, "1/3, -0 and a tiny subnormal");
    assert_eq!(d.exception_units, vec![1, 2, 2]);
    let back = d.to_vec().expect("reads back");
    assert_eq!(
        back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        demands.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let mut bad = d.clone();
    bad.codes.0[0] = 0xff00;
    assert!(bad.to_vec().expect_err("infinity").contains("unit 0"));
    let mut bad = d.clone();
    bad.exception_units.push(9);
    bad.exceptions.push(1.0);
    assert!(bad.to_vec().is_err(), "past the last unit");
    let mut bad = d.clone();
    bad.exception_units[1] = 0;
    assert!(bad.to_vec().is_err(), "a unit twice");
    let mut bad = d;
    bad.exceptions.pop();
    assert!(bad.to_vec().is_err(), "a unit without its demand");
}

/// A record of format 04 (the demands as `f64`s) reads back as it was stored, and the next
/// put rewrites it as a delta, which reads back the same.
#[test]
fn a_record_of_format_04_reads_back_and_becomes_a_delta() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = world(200, 3);
    let store = Store::open(dir.path()).expect("open");
    store.put_topology(&base).expect("topology");
    let (instance, map) = round_of(&base, 1);
    let served = ServedRef {
        epoch: 1,
        version: 1,
        solved_at_unix_ms: 1_000,
        base_seq: 0,
        instance: &instance,
        map: &map,
        round_entry: b"e",
    };
    store
        .values
        .put(&record_name(1, BaseOf::Journal(0)), &[&record04(&served)])
        .expect("write");
    assert_rounds(&store, 1..=1, |_| base.clone());
    put_round(&store, &base, 0, 2, 2, PutStep::Done);
    assert_eq!(kinds(&store), deltas_to(1, 2));
    assert_rounds(&store, 1..=2, |_| base.clone());
    put_round(&store, &base, 0, 3, 2, PutStep::Done);
    assert_eq!(kinds(&store), deltas_to(2, 3));
}

/// A reader beside a running server: versions listed before the server went on (a whole
/// record rewritten as a delta, a newer version written) are still read, from the files
/// there now.
#[test]
fn a_reader_with_an_old_listing_follows_the_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = world(300, 4);
    let store = Store::open(dir.path()).expect("open");
    store.put_topology(&base).expect("topology");
    for v in 1..=3 {
        put_round(&store, &base, 0, v, 8, PutStep::Done);
    }
    let listed = version_files(&store.values).expect("files");
    for v in 4..=5 {
        put_round(&store, &base, 0, v, 8, PutStep::Done);
    }
    let read_only = StoredMaps::open(dir.path()).expect("read only");
    for v in 1..=3 {
        let (stored, _) = read_only
            .load(v, listed.clone(), "a version")
            .expect("read")
            .expect("kept");
        let (instance, map) = round_of(&base, v);
        let (t, m) = stored.instance_and_map(&base).expect("instance");
        assert_eq!((&t.instance, &m), (&instance, &map), "version {v}");
    }
}

/// Issue 41 (9): a round takes the topology after edit 12 and solves it while the writer goes
/// on and stores a snapshot at edit 20. That snapshot's prune used to drop the snapshot at
/// edit 10 (neither the newest nor the newest at or before the served record's base, edit 0),
/// which the round's record then needed: a start rebuilt its base from the snapshot of edit 0
/// and the journal (under continuous Admin edits, about 2,000 edits and up to 10 s). Every
/// snapshot after the served record's base is kept (a round in flight started after it), so
/// the record's base is rebuilt from the snapshot at edit 10 and two edits.
#[test]
fn a_snapshot_written_while_a_round_solves_keeps_the_one_its_record_needs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let map = solve(&inst, &SolveOptions::default()).map;
    let store = Store::open(dir.path()).expect("open");
    store.put_topology(&inst).expect("topology");
    let served = |version: u64, base_seq: u64, instance: &Topology| {
        store
            .put_served(
                &ServedRef {
                    epoch: 1,
                    version,
                    solved_at_unix_ms: 0,
                    base_seq,
                    instance,
                    map: &map,
                    round_entry: &[],
                },
                4,
            )
            .expect("served");
    };
    served(1, 0, &inst);
    let mut now = Arc::new(inst.clone());
    let mut after = vec![Arc::clone(&now)];
    let mut edit = |store: &Store| {
        let n = after.len() as u64;
        let e = crate::edit::Edit::ClusterState {
            id: "a".into(),
            state: [ClusterState::Drained, ClusterState::Up][(n % 2) as usize],
        };
        now = apply(&now, &e).expect("applies").topology;
        assert_eq!(store.append_edit(0, &e).expect("journal"), n);
        after.push(Arc::clone(&now));
        Arc::clone(&now)
    };
    for _ in 1..10 {
        edit(&store);
    }
    let ten = edit(&store);
    store.put_snapshot(10, &ten).expect("snapshot 10");
    edit(&store);
    // The round takes the topology after edit 12 ...
    let base = edit(&store);
    // ... while the writer goes on and snapshots edit 20.
    for _ in 13..20 {
        edit(&store);
    }
    let twenty = edit(&store);
    store.put_snapshot(20, &twenty).expect("snapshot 20");
    served(2, 12, &base);
    let kept: Vec<u64> = snapshots(&store.values)
        .expect("list")
        .iter()
        .map(|s| s.0)
        .collect();
    assert!(
        kept.contains(&10),
        "the snapshot the served record's base is rebuilt from: kept {kept:?}"
    );
    let (t, _) = store.stored_map(2).expect("read").expect("kept");
    assert_eq!(t, *base, "the base rebuilt as the round took it");
    // The next round's record (after edit 20) needs the snapshot of 20, and no longer 10.
    served(3, 20, &twenty);
    let kept: Vec<u64> = snapshots(&store.values)
        .expect("list")
        .iter()
        .map(|s| s.0)
        .collect();
    assert!(kept.len() <= 3, "{kept:?}");
    for v in 1..=3 {
        assert!(store.stored_map(v).expect("read").is_some(), "version {v}");
    }
}

/// Issue 41 (10): the wall clock jumps ahead by two retention periods for a while, then back.
/// Retention went by the newest time ever appended, so the reports before the jump, and those
/// acknowledged after the clock was put right, were hidden (60 of 80 in the audit). It goes by
/// arrival now: a report appended after another is never older, and a jump of the clock ages
/// the record by at most `MAX_ARRIVAL_STEP_MS`. All 80 are read back, after a reopen too;
/// they go once reports have kept arriving for the retention period.
#[test]
fn a_clock_jump_never_hides_an_acknowledged_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hour = 3_600_000i64;
    let t0 = 1_800_000_000_000i64;
    let mut times = Vec::new();
    {
        let store = Store::open(dir.path()).expect("open");
        let mut append = |at: i64| {
            store
                .append_report(at, format!("{at}").as_bytes(), bounded(hour, 1_000))
                .expect("append");
            times.push(at);
        };
        // 20 reports a second apart, 20 with the clock two hours ahead, 40 once it is back.
        (0..20).for_each(|i| append(t0 + i * 1_000));
        (0..20).for_each(|i| append(t0 + 2 * hour + 20_000 + i * 1_000));
        (0..40).for_each(|i| append(t0 + 40_000 + i * 1_000));
        let read: Vec<i64> = store
            .reports(i64::MIN, i64::MAX)
            .expect("read")
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(read.len(), 80, "every acknowledged report: {read:?}");
    }
    let store = reopen(dir.path());
    let mut read: Vec<i64> = store
        .reports(i64::MIN, i64::MAX)
        .expect("read")
        .iter()
        .map(|r| r.0)
        .collect();
    read.sort_unstable();
    times.sort_unstable();
    assert_eq!(read, times, "after a reopen too");
    // A report a minute for an hour and more: the first 80 go, the newest hour stays.
    let later: Vec<i64> = (1..=70).map(|m| t0 + 80_000 + m * 60_000).collect();
    for &at in &later {
        store
            .append_report(at, b"later", bounded(hour, 1_000))
            .expect("append");
    }
    let read: Vec<i64> = store
        .reports(i64::MIN, i64::MAX)
        .expect("read")
        .iter()
        .map(|r| r.0)
        .collect();
    assert!(
        read.iter().all(|at| later.contains(at)) && read.len() >= 60 && read.len() <= 62,
        "{read:?}"
    );
}

/// Issue 41 (a nit): a damaged byte in sled's `conf` (its settings, beside the epoch counter
/// and the report ids in `db`) refused the open with "Read corrupted data at file offset
/// None", naming neither the file nor what to do. The error names the file and says what to
/// do; done, the store opens with its epoch counter as it was. A damaged `db` is named too.
#[test]
fn a_damaged_sled_conf_is_named_with_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(dir.path()).expect("open");
        assert_eq!(store.next_epoch(0).expect("epoch"), 1);
    }
    let conf = dir.path().join("conf");
    let whole = std::fs::read(&conf).expect("sled's conf");
    assert!(
        whole.starts_with(SLED_CONF.as_bytes()),
        "sled's settings as this build writes them: {:?}",
        String::from_utf8_lossy(&whole)
    );
    for at in [3, 20, 40] {
        let mut bad = whole.clone();
        bad[at] ^= 0x55;
        std::fs::write(&conf, &bad).expect("damage");
        let err = open_err(dir.path());
        let msg = err.to_string();
        assert!(
            msg.contains(&conf.display().to_string())
                && msg.contains("remove it")
                && msg.contains("epoch counter"),
            "byte {at}: {msg}"
        );
    }
    std::fs::remove_file(&conf).expect("remove it, as the error says");
    let store = reopen(dir.path());
    assert_eq!(store.next_epoch(0).expect("epoch"), 2, "the counter kept");
    drop(store);
    let db = dir.path().join("db");
    let mut bad = std::fs::read(&db).expect("sled's db");
    for b in bad.iter_mut().take(200) {
        *b ^= 0x55;
    }
    std::fs::write(&db, &bad).expect("damage");
    let msg = open_err(dir.path()).to_string();
    assert!(
        msg.contains(&db.display().to_string()) && msg.contains("epoch counter"),
        "{msg}"
    );
}

/// The error of opening the store at `path` (once the last handle let go of sled's lock).
fn open_err(path: &Path) -> StoreError {
    let started = std::time::Instant::now();
    loop {
        match Store::open(path) {
            Ok(_) => panic!("the damaged store opened"),
            Err(e) if e.to_string().contains("lock") && started.elapsed().as_secs() < 10 => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => return e,
        }
    }
}

/// Flips a byte in the middle of value file `name` (past its header): its contents damaged.
fn damage(store: &Store, name: &str) {
    let path = store.values.path_of(name);
    let mut bytes = std::fs::read(&path).expect("the file");
    let at = 24 + (bytes.len() - 24) / 2;
    bytes[at] ^= 0x55;
    std::fs::write(&path, &bytes).expect("damage");
}

/// The files in the store's `damaged/`.
fn set_aside(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join(DAMAGED_DIR))
        .map(|d| {
            d.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn no_initial() -> Result<Topology, String> {
    Err("not asked for".into())
}

/// Issue 41 (8): one damaged byte in the served record (the newest map file, which every
/// older version is a delta of) refused every start. The start now reads the stored topology,
/// moves the stored versions aside naming the damaged file, and serves no map until the first
/// round; the next record is the served one from then on, and a reopen reads it.
#[test]
fn a_damaged_served_record_is_moved_aside_and_the_start_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    {
        let store = Store::open(dir.path()).expect("open");
        store.put_topology(&inst).expect("topology");
        for v in 1..=3 {
            put_round(&store, &inst, 0, v, 4, PutStep::Done);
        }
        let newest = store.values.names(RECORD_FILE).expect("list");
        assert_eq!(newest.len(), 1);
        damage(&store, &newest[0]);
        let err = store.served_on(&inst, 0).expect_err("damaged");
        assert!(err.to_string().contains(&newest[0]), "{err}");
    }
    let store = reopen(dir.path());
    let start = store
        .start_topology(Limits::default(), no_initial)
        .expect("the topology reads");
    assert!(start.exact && start.skipped.is_empty() && !start.fresh);
    assert_eq!((&start.topology, start.seq), (&inst, 0));
    let from = store.start_served(&start).expect("the start goes on");
    assert!(from.served.is_none());
    assert_eq!(from.skipped_version, Some(3));
    assert!(
        from.skipped.len() == 1 && from.skipped[0].contains("map-00000000000000000003"),
        "{:?}",
        from.skipped
    );
    assert_eq!(store.map_count().expect("count"), 0);
    assert_eq!(set_aside(dir.path()).len(), 3, "the record and two deltas");
    // The first round's record, served from then on.
    put_round(&store, &inst, 0, 1, 4, PutStep::Done);
    drop(store);
    let store = reopen(dir.path());
    let start = store
        .start_topology(Limits::default(), no_initial)
        .expect("read");
    let served = store.start_served(&start).expect("read");
    assert_eq!(served.served.map(|s| s.version), Some(1));
    assert!(served.skipped.is_empty());
    assert_rounds(&store, 1..=1, |_| inst.clone());
}

/// Issue 41 (8): the newest snapshot damaged, an older one kept (the journal is kept from the
/// oldest kept snapshot on): the start reads the older one with the journal after it, exactly
/// the topology last published, moves the damaged one aside naming it, writes the topology it
/// serves as a snapshot, and serves the stored map on it.
#[test]
fn a_damaged_snapshot_falls_back_to_an_older_one_and_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let mut now = Arc::new(inst.clone());
    {
        let store = Store::open(dir.path()).expect("open");
        store.put_topology(&inst).expect("topology");
        put_round(&store, &inst, 0, 1, 4, PutStep::Done);
        for n in 1..=7u64 {
            let e = crate::edit::Edit::ClusterState {
                id: "a".into(),
                state: [ClusterState::Drained, ClusterState::Up][(n % 2) as usize],
            };
            now = apply(&now, &e).expect("applies").topology;
            store.append_edit(0, &e).expect("journal");
            if n == 5 {
                store.put_snapshot(5, &now).expect("snapshot");
            }
        }
        put_round(&store, &now, 7, 2, 4, PutStep::Done);
        let kept: Vec<u64> = snapshots(&store.values)
            .expect("list")
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(kept, vec![0, 5]);
        damage(&store, &snapshot_name(5));
    }
    let store = reopen(dir.path());
    let start = store
        .start_topology(Limits::default(), no_initial)
        .expect("the start goes on");
    assert!(start.exact, "{:?}", start.skipped);
    assert_eq!((&start.topology, start.seq), (&*now, 7));
    assert!(
        start.skipped.len() == 1 && start.skipped[0].contains(&snapshot_name(5)),
        "{:?}",
        start.skipped
    );
    assert_eq!(set_aside(dir.path()), vec![snapshot_name(5)]);
    let served = store.start_served(&start).expect("read");
    assert_eq!(served.served.map(|s| s.version), Some(2));
    drop(store);
    let store = reopen(dir.path());
    let again = store
        .start_topology(Limits::default(), no_initial)
        .expect("read");
    assert!(again.skipped.is_empty(), "{:?}", again.skipped);
    assert_eq!((&again.topology, again.seq), (&*now, 7));
    assert_rounds(&store, 1..=1, |_| inst.clone());
}

/// Issue 41 (8): the only snapshot damaged. When the configured topology is what it held (its
/// header's length and checksum say so) and the journal holds every edit, the start is exact:
/// the snapshot is written again and the stored map served. With another configured topology,
/// the start serves it with the journal replayed, says that it may not be the topology last
/// published, and maps afresh (the records' bases are gone).
#[test]
fn the_only_snapshot_damaged_falls_back_to_the_configured_topology_and_the_journal() {
    let inst = instance();
    let build = |dir: &Path| -> Topology {
        let store = Store::open(dir).expect("open");
        store.put_topology(&inst).expect("topology");
        let mut now = Arc::new(inst.clone());
        for n in 1..=3u64 {
            let e = crate::edit::Edit::ClusterState {
                id: "b".into(),
                state: [ClusterState::Drained, ClusterState::Down][(n % 2) as usize],
            };
            now = apply(&now, &e).expect("applies").topology;
            store.append_edit(0, &e).expect("journal");
        }
        put_round(&store, &now, 3, 1, 4, PutStep::Done);
        damage(&store, &snapshot_name(0));
        Arc::unwrap_or_clone(now)
    };
    // The configured topology is the one stored.
    let dir = tempfile::tempdir().expect("tempdir");
    let after = build(dir.path());
    let store = reopen(dir.path());
    let start = store
        .start_topology(Limits::default(), || Ok::<_, String>(inst.clone()))
        .expect("the start goes on");
    assert!(start.exact, "{:?}", start.skipped);
    assert_eq!((&start.topology, start.seq), (&after, 3));
    assert!(
        start.skipped.iter().any(|s| s.contains("written again")),
        "{:?}",
        start.skipped
    );
    let served = store.start_served(&start).expect("read");
    assert_eq!(
        served.served.map(|s| s.topology.instance),
        Some(round_of(&after, 1).0)
    );
    drop(store);
    let store = reopen(dir.path());
    let again = store
        .start_topology(Limits::default(), no_initial)
        .expect("read");
    assert!(
        again.skipped.is_empty() && again.topology == after,
        "{:?}",
        again.skipped
    );
    drop(store);
    // Another configured topology: served with the journal, said, and the map afresh.
    let dir = tempfile::tempdir().expect("tempdir");
    let after = build(dir.path());
    let other = inst.with_cluster_state(0, ClusterState::Drained);
    let store = reopen(dir.path());
    let start = store
        .start_topology(Limits::default(), || Ok::<_, String>(other.clone()))
        .expect("the start goes on");
    assert!(!start.exact);
    assert_eq!(
        start.topology,
        after.with_cluster_state(0, ClusterState::Drained),
        "the configured topology with the journal's edits"
    );
    assert!(
        start
            .skipped
            .iter()
            .any(|s| s.contains("only if the configuration")),
        "{:?}",
        start.skipped
    );
    let served = store.start_served(&start).expect("read");
    assert!(served.served.is_none() && served.skipped_version == Some(1));
}

/// Issue 41 (8): the only snapshot damaged and the edits before the journal's first only in
/// it: the start serves the configured topology with the edits the journal holds, and says
/// which acknowledged edits are lost.
#[test]
fn edits_only_in_a_damaged_snapshot_are_said_to_be_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let store = Store::open(dir.path()).expect("open");
    store.put_topology(&inst).expect("topology");
    // Cluster b with 1,024 long addresses: 40 kB an edit, a journal segment every ~100.
    let mut b = cdnmap_topology::format::cluster_file(&inst, 1);
    let mut now = Arc::new(inst.clone());
    let mut n = 0u64;
    while store.journal.first().expect("first") == Some(1) || n < 120 {
        n += 1;
        b.addresses = (0..1024u16)
            .map(|i| {
                format!("2001:db8:{n:x}:{i:x}:aaaa:bbbb:cccc:dddd")
                    .parse()
                    .expect("v6")
            })
            .collect();
        let e = crate::edit::Edit::UpsertCluster { cluster: b.clone() };
        now = apply(&now, &e).expect("applies").topology;
        store.append_edit(0, &e).expect("journal");
        if n == 120 {
            store.put_snapshot(n, &now).expect("snapshot");
        }
        assert!(n < 400, "the journal's first segment never dropped");
    }
    let first = store.journal.first().expect("first").expect("some");
    assert!(first > 1 && first <= 120, "{first}");
    damage(&store, &snapshot_name(120));
    drop(store);
    let store = reopen(dir.path());
    let start = store
        .start_topology(Limits::default(), || Ok::<_, String>(inst.clone()))
        .expect("the start goes on");
    assert!(!start.exact);
    assert_eq!(
        (&start.topology, start.seq),
        (&*now, n),
        "b as the last edit left it"
    );
    let lost = format!("edits 1 to {} were only in them", first - 1);
    assert!(
        start.skipped.iter().any(|s| s.contains(&lost)),
        "{:?}",
        start.skipped
    );
}

/// Issue 41 (1): a store an older build bricked (it journaled a cluster whose tree is 70
/// levels deep, past what serde_json reads, so no start could read it again) starts: the edit is skipped, named with why,
/// the edits after it replayed, and the topology served written as a snapshot.
#[test]
fn a_store_bricked_by_a_deep_tree_starts_without_that_edit() {
    use cdnmap_topology::format::{NestedNode, ResourcesFile};
    let dir = tempfile::tempdir().expect("tempdir");
    let inst = instance();
    let drained = inst.with_cluster_state(1, ClusterState::Drained);
    {
        let store = Store::open(dir.path()).expect("open");
        store.put_topology(&inst).expect("topology");
        let mut deep = cdnmap_topology::format::cluster_file(&inst, 0);
        deep.id = "deep".into();
        let node = |i: usize, children| NestedNode {
            name: format!("n{i}"),
            kind: cdnmap_mapper::ResourceKind::Bps,
            capacity: 1.0,
            classes: if i == 70 { vec!["web".into()] } else { vec![] },
            children,
        };
        let tree = (1..70)
            .rev()
            .fold(node(70, vec![]), |t, i| node(i, vec![t]));
        deep.resources = ResourcesFile::Nested(tree);
        let edit = crate::edit::Edit::UpsertCluster { cluster: deep };
        // As the older build journaled it (no depth limit then).
        let bytes = serde_json::to_vec(&edit).expect("json");
        assert_eq!(store.journal.append(0, &bytes).expect("journal"), 1);
        let drain = crate::edit::Edit::ClusterState {
            id: "b".into(),
            state: ClusterState::Drained,
        };
        assert_eq!(store.append_edit(0, &drain).expect("journal"), 2);
        let err = store
            .stored_topology(Limits::default())
            .expect_err("what an older build's start read");
        assert!(err.to_string().contains("recursion limit"), "{err}");
    }
    let store = reopen(dir.path());
    let start = store
        .start_topology(Limits::default(), no_initial)
        .expect("the start goes on");
    assert!(!start.exact);
    assert_eq!((&start.topology, start.seq), (&drained, 2));
    assert!(
        start.skipped.len() == 1
            && start.skipped[0].contains("edit 1 of the topology journal")
            && start.skipped[0].contains("deeper than the 32 levels"),
        "{:?}",
        start.skipped
    );
    drop(store);
    let store = reopen(dir.path());
    let again = store
        .start_topology(Limits::default(), no_initial)
        .expect("read");
    assert!(again.skipped.is_empty() && again.topology == drained);
}

/// Issue 41, finding 7: a store that was lost restarted at epoch 1, so a front end holding an
/// epoch of the lost store ignored its maps until their version passed the one it held. The
/// epoch is the stored one plus one or the floor (the service's clock), whichever is more: a
/// new store starts at the clock; a clock set back still gets a new epoch, above the last.
#[test]
fn an_epoch_is_above_the_stored_one_and_the_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = 1_796_000_000_000; // Unix ms, late 2026
    {
        let store = Store::open(dir.path()).expect("open");
        assert_eq!(store.next_epoch(clock).expect("epoch"), clock);
        assert_eq!(store.next_epoch(clock + 5).expect("epoch"), clock + 5);
    }
    let store = reopen(dir.path());
    // The clock set back an hour: one above the last all the same.
    assert_eq!(
        store.next_epoch(clock - 3_600_000).expect("epoch"),
        clock + 6
    );
    drop(store);
    // The store lost: a new one, started later, is above everything the old one gave.
    let lost = tempfile::tempdir().expect("tempdir");
    let store = Store::open(lost.path()).expect("open");
    assert!(store.next_epoch(clock + 60_000).expect("epoch") > clock + 6);
}

/// A kill -9 while sled writes a snapshot leaves a torn `snap.<lsn>.generating`, which sled
/// 0.34 reads as its newest snapshot and then refuses to start on (sled issue #1527; seen in
/// the kill -9 campaign of `tests/crash.rs`). The store removes it before sled opens, and
/// keeps what sled held.
#[test]
fn a_snapshot_sled_did_not_finish_is_removed_and_the_store_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let epoch = {
        let store = Store::open(dir.path()).expect("open");
        store.next_epoch(7).expect("epoch")
    };
    // What a kill leaves: the file created, a few bytes of it written.
    std::fs::write(dir.path().join("snap.00000000FFFFFFFF.generating"), b"torn").expect("write");
    let store = reopen(dir.path());
    assert!(
        !dir.path().join("snap.00000000FFFFFFFF.generating").exists(),
        "the torn snapshot is gone"
    );
    assert_eq!(
        store.next_epoch(0).expect("epoch"),
        epoch + 1,
        "the epoch counter survived"
    );
}
