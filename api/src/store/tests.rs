//! The store's tests.

use super::record::{CompactMap, MapColumns, Record03, SERVED_MAGIC_03};
use super::*;
use crate::edit::apply;
use cdnmap_mapper::{solve, ClusterState, SolveOptions};
use cdnmap_topology::format::{parse_instance, write_instance};
use std::sync::Arc;

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

/// Opens the store again once the dropped one's background threads let go of its lock
/// (sled releases it a moment after the last handle is dropped).
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
        assert_eq!(store.next_epoch().expect("epoch"), 1);
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
    assert_eq!(store.next_epoch().expect("epoch"), 2);
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
    for demands in [
        Some((0..5).map(|u| inst.unit_demand(u)).collect::<Vec<_>>()),
        None,
    ] {
        let compact = CompactMap::of(&map, demands.as_deref());
        let back = compact.to_map(&inst).expect("reads back");
        assert_eq!(back, map);
        for u in 0..5 {
            assert_eq!(back.overflow(u).to_bits(), map.overflow(u).to_bits());
        }
        if demands.is_some() {
            assert_eq!(
                compact.amount.len(),
                3,
                "the whole demand of v0 is not stored"
            );
        }
        let mut cut = CompactMap::of(&map, demands.as_deref());
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
        let mut bytes = SERVED_MAGIC.to_vec();
        bytes.extend(postcard::to_stdvec(&Record::of(&served)).expect("encode"));
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

#[test]
fn reports_are_kept_by_age_and_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    for t in 0..10i64 {
        let body = format!("{{\"t\": {t}}}");
        store
            .append_report(t * 1_000, body.as_bytes(), 5_000, 100)
            .expect("append");
    }
    // At t = 9 s with 5 s of retention: reports from 4 s on are kept.
    let kept = store.reports(0, i64::MAX).expect("read");
    let times: Vec<i64> = kept.iter().map(|(t, _)| *t).collect();
    assert_eq!(times, vec![4_000, 5_000, 6_000, 7_000, 8_000, 9_000]);
    assert_eq!(kept[0].1, b"{\"t\": 4}".to_vec());
    store
        .append_report(9_500, b"{}", 60_000, 3)
        .expect("append");
    assert_eq!(store.reports(0, i64::MAX).expect("read").len(), 3);
    assert_eq!(store.reports(8_000, 9_000).expect("read").len(), 1);
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
                            .append_report(1_000 + t * 4 + w, b"{}", i64::MAX, 50)
                            .expect("append");
                    }
                });
            }
        });
        let held = store.reports(0, i64::MAX).expect("read");
        assert_eq!(held.len(), 50);
        held
    };
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.reports(0, i64::MAX).expect("read"), held);
    store
        .append_report(10_000, b"{}", i64::MAX, 10)
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
    let store = Store::open(dir.path()).expect("reopen");
    assert!(store.reports.is_empty());
    let back = store.reports(0, i64::MAX).expect("read");
    assert_eq!(back, vec![(4_000, b"a".to_vec()), (5_000, b"b".to_vec())]);
    drop(store);
    let store = Store::open(dir.path()).expect("again");
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
