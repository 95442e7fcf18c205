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
            db,
        })
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

    /// Stores map `version` (of `instance`) and drops all but the newest `keep` versions.
    pub fn put_map(
        &self,
        instance: &Instance,
        map: &Map,
        meta: &StoredMapMeta,
        keep: usize,
    ) -> Result<(), StoreError> {
        let mut bytes = Vec::new();
        write_assignment(instance, map, meta, &mut bytes).map_err(|e| StoreError::Corrupt {
            what: format!("map version {} to store", meta.version),
            problem: e.to_string(),
        })?;
        self.maps
            .insert(meta.version.to_be_bytes(), bytes)
            .map_err(io(format!("writing map version {}", meta.version)))?;
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
        self.flush("a map")
    }

    /// The newest stored map, read against `instance` (the stored topology).
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

    #[test]
    fn topology_and_maps_survive_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inst = instance().with_cluster_state(1, ClusterState::Drained);
        let map = solve(&inst, &SolveOptions::default()).map;
        {
            let store = Store::open(dir.path()).expect("open");
            assert!(store.topology(Limits::default()).expect("read").is_none());
            store.put_topology(&inst).expect("topology");
            for version in 1..=5 {
                let meta = StoredMapMeta {
                    version,
                    solved_at_unix_ms: 1_000 * version as i64,
                };
                store.put_map(&inst, &map, &meta, 3).expect("map");
            }
            assert_eq!(store.map_count(), 3);
        }
        let store = Store::open(dir.path()).expect("reopen");
        let back = store
            .topology(Limits::default())
            .expect("read")
            .expect("stored");
        assert_eq!(back, inst);
        let (meta, back_map) = store.latest_map(&back).expect("read").expect("stored");
        assert_eq!(meta.version, 5);
        assert_eq!(meta.solved_at_unix_ms, 5_000);
        assert_eq!(back_map, map);
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
