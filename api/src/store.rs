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

use cdnmap_mapper::format::{parse_assignment, parse_instance, write_assignment, write_instance};
use cdnmap_mapper::{Instance, Limits, Map};
use serde::{Deserialize, Serialize};

const TOPOLOGY_KEY: &[u8] = b"instance";
/// The start counter: every start takes the next epoch (a map's identity is (epoch, version)).
const EPOCH_KEY: &[u8] = b"epoch";
/// The published map with what it was solved with, self-contained: see [`Store::put_served`].
const SERVED_KEY: &[u8] = b"served";
/// The served record's header: its format and version.
const SERVED_MAGIC: &[u8; 8] = b"CDNSRV01";

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

    /// Replaces the served record (one insert, so a crash leaves the old record or the new
    /// one, never a mix) and appends the map to the history of `keep` versions. Durable when
    /// it returns.
    pub fn put_served(&self, served: &ServedRef<'_>, keep: usize) -> Result<(), StoreError> {
        let corrupt = |e: serde_json::Error| StoreError::Corrupt {
            what: format!("map version {} to store", served.version),
            problem: e.to_string(),
        };
        let mut instance = Vec::new();
        write_instance(served.instance, &mut instance).map_err(corrupt)?;
        let meta = StoredMapMeta {
            version: served.version,
            solved_at_unix_ms: served.solved_at_unix_ms,
        };
        let mut map = Vec::new();
        write_assignment(served.instance, served.map, &meta, &mut map).map_err(corrupt)?;
        let mut bytes =
            Vec::with_capacity(48 + instance.len() + map.len() + served.estimates.len());
        bytes.extend_from_slice(SERVED_MAGIC);
        bytes.extend_from_slice(&served.epoch.to_le_bytes());
        bytes.extend_from_slice(&served.version.to_le_bytes());
        bytes.extend_from_slice(&served.solved_at_unix_ms.to_le_bytes());
        for part in [&instance[..], &map[..], served.estimates] {
            bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
            bytes.extend_from_slice(part);
        }
        self.served
            .insert(SERVED_KEY, bytes)
            .map_err(io(format!("writing map version {}", served.version)))?;
        self.put_history(served.version, map, keep)?;
        self.flush("a map")
    }

    /// The served record, if one was stored.
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
        let mut r = Reader(&bytes);
        if r.take(8).map_err(&corrupt)? != SERVED_MAGIC {
            return Err(corrupt(format!(
                "its header is not {:?}",
                String::from_utf8_lossy(SERVED_MAGIC)
            )));
        }
        let epoch = r.u64().map_err(&corrupt)?;
        let version = r.u64().map_err(&corrupt)?;
        let solved_at_unix_ms = r.u64().map_err(&corrupt)? as i64;
        let instance = r.part().map_err(&corrupt)?;
        let map = r.part().map_err(&corrupt)?;
        let estimates = r.part().map_err(&corrupt)?.to_vec();
        if !r.0.is_empty() {
            return Err(corrupt(format!("{} bytes after its last part", r.0.len())));
        }
        let instance = parse_instance(instance, Limits::default())
            .map_err(|e| corrupt(format!("its instance: {e}")))?;
        let map = parse_assignment(map, &instance).map_err(|e| corrupt(format!("its map: {e}")))?;
        Ok(Some(Served {
            epoch,
            version,
            solved_at_unix_ms,
            instance,
            map,
            estimates,
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

/// Reads the served record's fixed fields and length-prefixed parts.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "cut short: {} bytes left where {n} were due",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn part(&mut self) -> Result<&'a [u8], String> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| format!("a part of {n} bytes"))?;
        self.take(n)
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
        let store = Store::open(dir.path()).expect("reopen");
        assert_eq!(store.next_epoch().expect("epoch"), 2);
        let back = store
            .topology(Limits::default())
            .expect("read")
            .expect("stored");
        assert_eq!(back, inst);
        assert_eq!(store.served().expect("read"), Some(served(5)));
        let (meta, back_map) = store.latest_map(&back).expect("read").expect("stored");
        assert_eq!(meta.version, 5);
        assert_eq!(back_map, map);
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
        assert!(
            store.latest_map(&edited).is_err(),
            "the history is read by id"
        );
        assert_eq!(store.served().expect("read"), Some(record));
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
