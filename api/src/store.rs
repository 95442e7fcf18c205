//! Persistence in sled: the topology, the last maps (versioned, a bounded number kept), and the
//! demand record (feedback reports, bounded by age and count).
//!
//! **What is durable when.** Every write method returns only after `sled::Db::flush`: once it
//! returns `Ok`, the write survives a crash or restart. The service acknowledges a feedback
//! report only after [`Store::append_report`] returned, so an acknowledged report is never lost;
//! a map is published to queries before it is persisted (a crash in between loses that version,
//! and the restart serves the previous one, which is then the last version stored).
//!
//! Values are the project's JSON file formats (`docs/formats.md`: instance and assignment), so
//! a store can be inspected with ordinary tools and read back by the same validating parsers.

use std::path::Path;

use cdnmap_mapper::format::{parse_assignment, parse_instance, write_instance};
use cdnmap_mapper::{Instance, Limits, Map};
use serde::{Deserialize, Serialize};

const TOPOLOGY_KEY: &[u8] = b"instance";
/// The start counter: every start takes the next epoch (a map's identity is (epoch, version)).
const EPOCH_KEY: &[u8] = b"epoch";
/// The published map with what it was solved with, self-contained: see [`Store::put_served`].
const SERVED_KEY: &[u8] = b"served";
/// The served record's header: its format and version.
const SERVED_MAGIC: &[u8; 8] = b"CDNSRV03";
/// The topology the served record's round started from: generation (8 bytes), then JSON.
const BASE_KEY: &[u8] = b"served-base";

/// The served record after its header (postcard): what the round changed of its base
/// topology, and the map. The estimator's state follows it as it is, after its length (u64
/// LE), in its own encoding (copied
/// into a serde field it would go through serde a byte at a time, and be copied once more).
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    epoch: u64,
    version: u64,
    solved_at_unix_ms: i64,
    base_generation: u64,
    demands: Vec<f64>,
    per_unit: Vec<cdnmap_mapper::PerUnit>,
    capacities: Vec<f64>,
    map: MapColumns,
}

impl Record {
    fn of(s: &ServedRef<'_>) -> Record {
        let inst = s.instance;
        Record {
            epoch: s.epoch,
            version: s.version,
            solved_at_unix_ms: s.solved_at_unix_ms,
            base_generation: s.base_generation,
            demands: (0..inst.unit_count() as u32)
                .map(|u| inst.unit_demand(u))
                .collect(),
            per_unit: inst.classes().iter().map(|c| c.per_unit).collect(),
            capacities: inst.capacities(),
            map: MapColumns::of(s.map),
        }
    }
}

/// A map as columns: per unit its allocation count and overflow; per allocation its cluster
/// index and amount.
#[derive(Debug, Serialize, Deserialize)]
struct MapColumns {
    count: Vec<u32>,
    overflow: Vec<f64>,
    cluster: Vec<u32>,
    amount: Vec<f64>,
}

impl MapColumns {
    fn of(map: &Map) -> MapColumns {
        let n = map.unit_count();
        let mut out = MapColumns {
            count: Vec::with_capacity(n),
            overflow: Vec::with_capacity(n),
            cluster: Vec::with_capacity(n),
            amount: Vec::with_capacity(n),
        };
        for u in 0..n as u32 {
            let a = map.allocations(u);
            out.count.push(a.len() as u32);
            out.overflow.push(map.overflow(u));
            out.cluster.extend(a.iter().map(|x| x.cluster));
            out.amount.extend(a.iter().map(|x| x.amount));
        }
        out
    }

    /// The map, checked against `instance`: one entry per unit, known clusters, amounts that
    /// are numbers.
    fn to_map(&self, instance: &Instance) -> Result<Map, String> {
        let n = instance.unit_count();
        if self.count.len() != n || self.overflow.len() != n {
            return Err(format!("{} units, the instance {n}", self.count.len()));
        }
        if self.cluster.len() != self.amount.len() {
            return Err("allocation columns of different lengths".into());
        }
        let clusters = instance.clusters().len() as u32;
        let mut map = Map::with_capacity(n, self.cluster.len());
        let mut at = 0usize;
        for (u, &k) in self.count.iter().enumerate() {
            let end = at
                .checked_add(k as usize)
                .filter(|&e| e <= self.cluster.len())
                .ok_or_else(|| format!("unit {u}: allocations past the end"))?;
            let mut allocs = Vec::with_capacity(k as usize);
            for i in at..end {
                let (c, x) = (self.cluster[i], self.amount[i]);
                if c >= clusters || !x.is_finite() {
                    return Err(format!("unit {u}: allocation ({c}, {x}) is not valid"));
                }
                allocs.push(cdnmap_mapper::Allocation {
                    cluster: c,
                    amount: x,
                });
            }
            map.push_unit(allocs, self.overflow[u]);
            at = end;
        }
        if at != self.cluster.len() {
            return Err("allocations left after the last unit".into());
        }
        Ok(map)
    }
}

/// Why the store failed, naming what it was doing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("store at {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error("store: {what}: {source}")]
    Io { what: String, source: sled::Error },
    #[error("store: {what} is unreadable: {problem}")]
    Corrupt { what: String, problem: String },
}

fn io(what: impl Into<String>) -> impl FnOnce(sled::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}

/// A map as stored: its version metadata and the map in the assignment format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMapMeta {
    pub version: u64,
    pub solved_at_unix_ms: i64,
}

/// The persistent state of one mapper.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    topology: sled::Tree,
    maps: sled::Tree,
    reports: sled::Tree,
    served: sled::Tree,
}

/// The published map as stored: its identity, the round's own instance (forecast demand,
/// learned coefficients, derated capacities, the cluster states of that round), the map, and
/// the estimator's state after that round (opaque bytes, the estimator's own encoding). It
/// needs nothing else to be read, so no later topology edit can make it unreadable, and a
/// restart serves exactly what was published.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    pub instance: Instance,
    pub map: Map,
    pub estimates: Vec<u8>,
}

/// What [`Store::put_served`] writes: a [`Served`] by reference.
#[derive(Debug, Clone, Copy)]
pub struct ServedRef<'a> {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    /// The topology the round started from (with the cluster states of the round), its
    /// generation (changed by every edit), and whether it changed since the last record.
    pub base: &'a Instance,
    pub base_generation: u64,
    pub write_base: bool,
    /// The round's instance: `base` with the round's demands, coefficients and capacities.
    pub instance: &'a Instance,
    pub map: &'a Map,
    pub estimates: &'a [u8],
}

impl Served {
    pub fn as_ref(&self) -> ServedRef<'_> {
        ServedRef {
            epoch: self.epoch,
            version: self.version,
            solved_at_unix_ms: self.solved_at_unix_ms,
            base: &self.instance,
            base_generation: 0,
            write_base: true,
            instance: &self.instance,
            map: &self.map,
            estimates: &self.estimates,
        }
    }
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = sled::open(path).map_err(|source| StoreError::Open {
            path: path.display().to_string(),
            source,
        })?;
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(io(format!("opening tree {name}")))
        };
        Ok(Store {
            topology: tree("topology")?,
            maps: tree("maps")?,
            reports: tree("reports")?,
            served: tree("served")?,
            db,
        })
    }

    /// Waits until every write so far is on disk.
    pub fn flush_all(&self) -> Result<(), StoreError> {
        self.flush("the store")
    }

    fn flush(&self, what: &str) -> Result<(), StoreError> {
        self.db
            .flush()
            .map(|_| ())
            .map_err(io(format!("flushing {what}")))
    }

    /// Replaces the stored topology.
    pub fn put_topology(&self, instance: &Instance) -> Result<(), StoreError> {
        let mut bytes = Vec::new();
        write_instance(instance, &mut bytes).map_err(|e| StoreError::Corrupt {
            what: "the topology to store".into(),
            problem: e.to_string(),
        })?;
        self.topology
            .insert(TOPOLOGY_KEY, bytes)
            .map_err(io("writing the topology"))?;
        self.flush("the topology")
    }

    /// The stored topology, validated like an instance file.
    pub fn topology(&self, limits: Limits) -> Result<Option<Instance>, StoreError> {
        let Some(bytes) = self
            .topology
            .get(TOPOLOGY_KEY)
            .map_err(io("reading the topology"))?
        else {
            return Ok(None);
        };
        parse_instance(&bytes, limits)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                what: "the stored topology".into(),
                problem: e.to_string(),
            })
    }

    /// The newest map of the history, read against `instance`: how a store written before the
    /// served record existed is read (by map unit and cluster id, so it fails when the
    /// topology was edited since; the caller then starts without it).
    pub fn latest_map(
        &self,
        instance: &Instance,
    ) -> Result<Option<(StoredMapMeta, Map)>, StoreError> {
        let Some((key, bytes)) = self.maps.last().map_err(io("reading the newest map"))? else {
            return Ok(None);
        };
        let version = <[u8; 8]>::try_from(key.as_ref())
            .map(u64::from_be_bytes)
            .map_err(|_| StoreError::Corrupt {
                what: "a stored map's key".into(),
                problem: format!("{} bytes, not 8", key.len()),
            })?;
        let corrupt = |problem: String| StoreError::Corrupt {
            what: format!("stored map version {version}"),
            problem,
        };
        #[derive(Deserialize)]
        struct Summary {
            summary: StoredMapMeta,
        }
        let meta: Summary = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let map = parse_assignment(&bytes, instance).map_err(|e| corrupt(e.to_string()))?;
        Ok(Some((meta.summary, map)))
    }

    /// How many map versions are stored.
    pub fn map_count(&self) -> usize {
        self.maps.len()
    }

    /// Takes the next epoch (1 for a new store) and stores it before returning, so no two
    /// starts of this store ever share one.
    pub fn next_epoch(&self) -> Result<u64, StoreError> {
        let last = match self
            .topology
            .get(EPOCH_KEY)
            .map_err(io("reading the epoch"))?
        {
            None => 0,
            Some(b) => <[u8; 8]>::try_from(b.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| StoreError::Corrupt {
                    what: "the stored epoch".into(),
                    problem: format!("{} bytes, not 8", b.len()),
                })?,
        };
        let next = last.checked_add(1).ok_or_else(|| StoreError::Corrupt {
            what: "the stored epoch".into(),
            problem: "it is at its maximum".into(),
        })?;
        self.topology
            .insert(EPOCH_KEY, &next.to_be_bytes())
            .map_err(io("writing the epoch"))?;
        self.flush("the epoch")?;
        Ok(next)
    }

    /// Replaces the served record and appends the map to the history of `keep` versions.
    /// The round's base topology is written with it when `served.write_base` says it changed
    /// (an Admin edit since the last record): the two in one atomic batch, so a crash leaves
    /// the old pair or the new one. Durable when it returns.
    pub fn put_served(&self, served: &ServedRef<'_>, keep: usize) -> Result<(), StoreError> {
        let record = Record::of(served);
        let mut bytes = Vec::with_capacity(
            16 + 8 * (3 * served.instance.unit_count()) + served.estimates.len(),
        );
        bytes.extend_from_slice(SERVED_MAGIC);
        postcard::to_io(&record, &mut bytes).map_err(|e| StoreError::Corrupt {
            what: format!("map version {} to store", served.version),
            problem: e.to_string(),
        })?;
        bytes.extend_from_slice(&(served.estimates.len() as u64).to_le_bytes());
        bytes.extend_from_slice(served.estimates);
        let mut batch = sled::Batch::default();
        if served.write_base {
            let mut base = served.base_generation.to_be_bytes().to_vec();
            write_instance(served.base, &mut base).map_err(|e| StoreError::Corrupt {
                what: "the round's topology to store".into(),
                problem: e.to_string(),
            })?;
            batch.insert(BASE_KEY, base);
        }
        batch.insert(SERVED_KEY, bytes);
        self.served
            .apply_batch(batch)
            .map_err(io(format!("writing map version {}", served.version)))?;
        let map = postcard::to_stdvec(&record.map).map_err(|e| StoreError::Corrupt {
            what: format!("map version {} to store", served.version),
            problem: e.to_string(),
        })?;
        self.put_history(served.version, map, keep)?;
        self.flush("a map")
    }

    /// The served record, if one was stored, with its instance rebuilt exactly: the base
    /// topology it names, with the round's demands, coefficients and capacities.
    pub fn served(&self) -> Result<Option<Served>, StoreError> {
        let Some(bytes) = self
            .served
            .get(SERVED_KEY)
            .map_err(io("reading the served map"))?
        else {
            return Ok(None);
        };
        let corrupt = |problem: String| StoreError::Corrupt {
            what: "the stored served map".into(),
            problem,
        };
        let body = bytes.strip_prefix(SERVED_MAGIC.as_slice()).ok_or_else(|| {
            corrupt(format!(
                "its header is not {:?}",
                String::from_utf8_lossy(SERVED_MAGIC)
            ))
        })?;
        let (record, rest): (Record, &[u8]) =
            postcard::take_from_bytes(body).map_err(|e| corrupt(e.to_string()))?;
        let (len, estimates) = rest.split_at(8.min(rest.len()));
        let len = <[u8; 8]>::try_from(len)
            .map(u64::from_le_bytes)
            .map_err(|_| corrupt("cut short before the estimator's state".into()))?;
        if len != estimates.len() as u64 {
            return Err(corrupt(format!(
                "the estimator's state is {} bytes where {len} were written",
                estimates.len()
            )));
        }
        let base = self
            .served
            .get(BASE_KEY)
            .map_err(io("reading the served map's topology"))?
            .ok_or_else(|| corrupt("its topology is missing".into()))?;
        let (generation, json) = base.split_at(8.min(base.len()));
        let generation = <[u8; 8]>::try_from(generation)
            .map(u64::from_be_bytes)
            .map_err(|_| corrupt("its topology is cut short".into()))?;
        if generation != record.base_generation {
            return Err(corrupt(format!(
                "it names topology {} but the store holds {generation}",
                record.base_generation
            )));
        }
        let base = parse_instance(json, Limits::default())
            .map_err(|e| corrupt(format!("its topology: {e}")))?;
        let instance = base
            .with_demands(record.demands)
            .and_then(|i| i.with_capacities(&record.per_unit, &record.capacities))
            .map_err(|e| corrupt(format!("its instance: {e}")))?;
        let map = record
            .map
            .to_map(&instance)
            .map_err(|e| corrupt(format!("its map: {e}")))?;
        Ok(Some(Served {
            epoch: record.epoch,
            version: record.version,
            solved_at_unix_ms: record.solved_at_unix_ms,
            instance,
            map,
            estimates: estimates.to_vec(),
        }))
    }

    fn put_history(&self, version: u64, map: Vec<u8>, keep: usize) -> Result<(), StoreError> {
        self.maps
            .insert(version.to_be_bytes(), map)
            .map_err(io(format!("writing map version {version}")))?;
        // Versions are big-endian keys, so iteration is in version order: drop the oldest.
        let stored = self.maps.len();
        for key in self
            .maps
            .iter()
            .keys()
            .take(stored.saturating_sub(keep.max(1)))
        {
            let key = key.map_err(io("listing stored maps"))?;
            self.maps.remove(key).map_err(io("dropping an old map"))?;
        }
        Ok(())
    }

    /// Appends one feedback report (already validated, as JSON) received at `at_unix_ms`, then
    /// drops reports older than `retain_ms` before it and all but the newest `max_reports`.
    /// Durable when it returns.
    pub fn append_report(
        &self,
        at_unix_ms: i64,
        report: &[u8],
        retain_ms: i64,
        max_reports: usize,
    ) -> Result<u64, StoreError> {
        let id = self.db.generate_id().map_err(io("numbering a report"))?;
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&(at_unix_ms as u64).to_be_bytes());
        key[8..].copy_from_slice(&id.to_be_bytes());
        self.reports
            .insert(key, report)
            .map_err(io("writing a report"))?;
        let cutoff = (at_unix_ms.saturating_sub(retain_ms).max(0) as u64).to_be_bytes();
        for old in self.reports.range(..cutoff.as_slice()).keys() {
            let old = old.map_err(io("listing old reports"))?;
            self.reports
                .remove(old)
                .map_err(io("dropping an old report"))?;
        }
        let excess = self.reports.len().saturating_sub(max_reports.max(1));
        for old in self.reports.iter().keys().take(excess) {
            let old = old.map_err(io("listing reports"))?;
            self.reports.remove(old).map_err(io("dropping a report"))?;
        }
        self.flush("a report")?;
        Ok(id)
    }

    /// The stored reports received in `[from_ms, to_ms)`, oldest first, with their times.
    pub fn reports(&self, from_ms: i64, to_ms: i64) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        let lo = (from_ms.max(0) as u64).to_be_bytes();
        let hi = (to_ms.max(0) as u64).to_be_bytes();
        self.reports
            .range(lo.as_slice()..hi.as_slice())
            .map(|kv| {
                let (k, v) = kv.map_err(io("reading reports"))?;
                let at = <[u8; 8]>::try_from(&k[..8.min(k.len())])
                    .map(|b| u64::from_be_bytes(b) as i64)
                    .map_err(|_| StoreError::Corrupt {
                        what: "a stored report's key".into(),
                        problem: format!("{} bytes", k.len()),
                    })?;
                Ok((at, v.to_vec()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::{solve, ClusterState, SolveOptions};

    fn instance() -> Instance {
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
        let served = |version: u64| Served {
            epoch: 3,
            version,
            solved_at_unix_ms: 1_000 * version as i64,
            instance: inst.clone(),
            map: map.clone(),
            estimates: format!("state {version}").into_bytes(),
        };
        {
            let store = Store::open(dir.path()).expect("open");
            assert!(store.topology(Limits::default()).expect("read").is_none());
            assert!(store.served().expect("read").is_none());
            assert_eq!(store.next_epoch().expect("epoch"), 1);
            store.put_topology(&inst).expect("topology");
            for version in 1..=5 {
                store.put_served(&served(version).as_ref(), 3).expect("map");
            }
            assert_eq!(store.map_count(), 3);
        }
        let store = reopen(dir.path());
        assert_eq!(store.next_epoch().expect("epoch"), 2);
        let back = store
            .topology(Limits::default())
            .expect("read")
            .expect("stored");
        assert_eq!(back, inst);
        assert_eq!(store.served().expect("read"), Some(served(5)));
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
        cdnmap_mapper::format::write_assignment(&inst, &map, &meta, &mut json).expect("write");
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
            instance: inst.clone(),
            map,
            estimates: Vec::new(),
        };
        store.put_served(&record.as_ref(), 4).expect("map");
        let mut file = cdnmap_mapper::format::InstanceFile::of(&inst);
        file.map_units.retain(|u| u.id != "u1");
        file.clusters.retain(|c| c.id != "b");
        for u in &mut file.map_units {
            u.candidates.retain(|c| c.cluster != "b");
        }
        let edited = file.build(Limits::default()).expect("valid");
        store.put_topology(&edited).expect("topology");
        assert_eq!(store.served().expect("read"), Some(record));
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
        let record = |version, write_base| ServedRef {
            epoch: 2,
            version,
            solved_at_unix_ms: 7,
            base: &base,
            base_generation: 4,
            write_base,
            instance: &round,
            map: &map,
            estimates: b"e",
        };
        store.put_served(&record(1, true), 4).expect("first");
        store.put_served(&record(2, false), 4).expect("second");
        let back = store.served().expect("read").expect("stored");
        assert_eq!(back.instance, round);
        assert_eq!(back.map, map);
        assert_eq!(
            (back.epoch, back.version, back.estimates),
            (2, 2, b"e".to_vec())
        );
        // A record naming another generation than the stored base is refused, naming both.
        store
            .put_served(
                &ServedRef {
                    base_generation: 5,
                    ..record(3, false)
                },
                4,
            )
            .expect("third");
        let err = store.served().expect_err("mismatch");
        assert!(err.to_string().contains("names topology 5"), "{err}");
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
            instance: inst,
            map,
            estimates: vec![1, 2, 3],
        };
        store.put_served(&record.as_ref(), 4).expect("map");
        let bytes = store.served.get(SERVED_KEY).expect("get").expect("stored");
        for cut in [0, 7, 8, 20, bytes.len() / 2, bytes.len() - 1] {
            store
                .served
                .insert(SERVED_KEY, &bytes[..cut])
                .expect("insert");
            let err = store.served().expect_err("cut short");
            assert!(err.to_string().contains("served map"), "{err}");
        }
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
}
