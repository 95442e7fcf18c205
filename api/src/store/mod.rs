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

use cdnmap_mapper::{Instance, Limits, Map};
use cdnmap_topology::format::{parse_assignment, parse_instance, write_instance};
use cdnmap_topology::Topology;
use serde::{Deserialize, Serialize};

mod record;

use record::{Record, Record03, Stored};

const TOPOLOGY_KEY: &[u8] = b"instance";
/// The start counter: every start takes the next epoch (a map's identity is (epoch, version)).
const EPOCH_KEY: &[u8] = b"epoch";
/// The published map with what it was solved with, self-contained, from a build before the
/// history of records (read when no record is under [`RECORD_PREFIX`]).
const SERVED_KEY: &[u8] = b"served";
/// Each stored map version's record ([`Store::put_served`]): this prefix, then the version
/// (u64 BE, so records list in version order). The newest is the served one; the older ones
/// are the history of `maps_kept` versions.
const RECORD_PREFIX: &[u8] = b"map/";
/// The base topologies the kept records were solved from: this prefix, then the generation
/// (u64 BE: the version of the first record solved from it), then JSON.
const BASE_PREFIX: &[u8] = b"base/";
/// The served record's header: its format and version.
const SERVED_MAGIC: &[u8; 8] = b"CDNSRV04";
/// The served record of the format before (the whole estimator state inline), still read.
const SERVED_MAGIC_03: &[u8; 8] = b"CDNSRV03";
/// The estimator's last checkpoint: its header, the version of the record it was taken after
/// (u64 BE), then the whole state ([`Store::put_checkpoint`]).
const CHECKPOINT_KEY: &[u8] = b"estimator";
const CHECKPOINT_MAGIC: &[u8; 8] = b"CDNEST01";
/// Each round's estimator entry since the checkpoint: this prefix, then the record's version
/// (u64 BE, so entries list in version order).
const ENTRY_PREFIX: &[u8] = b"round/";

/// The topology [`SERVED_KEY`]'s round started from: generation (8 bytes), then JSON.
const BASE_KEY: &[u8] = b"served-base";

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
/// what rebuilds the estimator's state after that round. It needs nothing else to be read, so
/// no later topology edit can make it unreadable, and a restart serves exactly what was
/// published.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    /// The round's topology: its base with the round's demands, coefficients and capacities.
    pub topology: Topology,
    pub map: Map,
    pub estimator: EstimatorLog,
}

/// The estimator's state as stored (opaque bytes, the estimator's own encodings): the last
/// checkpoint of the whole state and the entries of the rounds after it, up to the served
/// one. Replaying the entries onto the checkpoint gives the state after the served round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EstimatorLog {
    /// The whole state, and the version of the round it was taken after.
    pub checkpoint: Option<(u64, Vec<u8>)>,
    /// `(version, entry)` of each round after the checkpoint, in version order, up to the
    /// served version; it stops before the first missing version (a round whose write failed).
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// What [`Store::put_served`] writes: a [`Served`] by reference.
#[derive(Debug, Clone, Copy)]
pub struct ServedRef<'a> {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    /// The topology the round started from (with the cluster states of the round), its
    /// generation (the version of the first record solved from it: a new one after every
    /// edit), and whether it changed since the last record.
    pub base: &'a Topology,
    pub base_generation: u64,
    pub write_base: bool,
    /// The round's instance: `base` with the round's demands, coefficients and capacities.
    pub instance: &'a Instance,
    pub map: &'a Map,
    /// The round's estimator entry (what it observed, the small state after it).
    pub round_entry: &'a [u8],
}

impl Served {
    /// The record as written (its last estimator entry as the round's; a checkpoint is written
    /// apart, [`Store::put_checkpoint`]).
    pub fn as_ref(&self) -> ServedRef<'_> {
        ServedRef {
            epoch: self.epoch,
            version: self.version,
            solved_at_unix_ms: self.solved_at_unix_ms,
            base: &self.topology,
            base_generation: 0,
            write_base: true,
            instance: &self.topology,
            map: &self.map,
            round_entry: self.estimator.entries.last().map_or(&[], |(_, e)| e),
        }
    }
}

fn prefixed(prefix: &[u8], n: u64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&n.to_be_bytes());
    key
}

/// A record's key: the version and the generation of the base it names.
fn record_key(version: u64, generation: u64) -> Vec<u8> {
    let mut key = prefixed(RECORD_PREFIX, version);
    key.extend_from_slice(&generation.to_be_bytes());
    key
}

/// (version, base generation) of a record's key.
fn record_key_parts(key: &[u8]) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(RECORD_PREFIX)?;
    let version = <[u8; 8]>::try_from(rest.get(..8)?).ok()?;
    let generation = <[u8; 8]>::try_from(rest.get(8..)?).ok()?;
    Some((u64::from_be_bytes(version), u64::from_be_bytes(generation)))
}

fn entry_key(version: u64) -> Vec<u8> {
    prefixed(ENTRY_PREFIX, version)
}

/// The number after `prefix` in `key`.
fn key_number(key: &[u8], prefix: &[u8]) -> Option<u64> {
    key.strip_prefix(prefix)
        .and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map(u64::from_be_bytes)
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
    pub fn put_topology(&self, topology: &Topology) -> Result<(), StoreError> {
        let mut bytes = Vec::new();
        write_instance(topology, &mut bytes).map_err(|e| StoreError::Corrupt {
            what: "the topology to store".into(),
            problem: e.to_string(),
        })?;
        self.topology
            .insert(TOPOLOGY_KEY, bytes)
            .map_err(io("writing the topology"))?;
        self.flush("the topology")
    }

    /// The stored topology, validated like an instance file.
    pub fn topology(&self, limits: Limits) -> Result<Option<Topology>, StoreError> {
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
        self.served.scan_prefix(RECORD_PREFIX).count()
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

    /// Stores the record of map version `served.version` (the served one from now on, the
    /// newest of the history) with the round's estimator entry, and the round's base topology
    /// when `served.write_base` says it changed (an Admin edit since the last record): the
    /// three in one atomic batch, so a crash leaves the old set or the new one. Then drops the
    /// records beyond the newest `keep` and the bases no kept record names. Durable when it
    /// returns.
    pub fn put_served(&self, served: &ServedRef<'_>, keep: usize) -> Result<(), StoreError> {
        let record = Record::of(served);
        let mut bytes = Vec::with_capacity(16 + 12 * served.instance.unit_count());
        bytes.extend_from_slice(SERVED_MAGIC);
        postcard::to_io(&record, &mut bytes).map_err(|e| StoreError::Corrupt {
            what: format!("map version {} to store", served.version),
            problem: e.to_string(),
        })?;
        let mut batch = sled::Batch::default();
        if served.write_base {
            let mut base = Vec::new();
            write_instance(served.base, &mut base).map_err(|e| StoreError::Corrupt {
                what: "the round's topology to store".into(),
                problem: e.to_string(),
            })?;
            batch.insert(prefixed(BASE_PREFIX, served.base_generation), base);
        }
        batch.insert(record_key(served.version, served.base_generation), bytes);
        batch.insert(entry_key(served.version), served.round_entry);
        self.served
            .apply_batch(batch)
            .map_err(io(format!("writing map version {}", served.version)))?;
        self.prune(served.version, keep)?;
        self.flush("a map")
    }

    /// Drops the records older than the newest `keep` versions up to `version`, the bases no
    /// kept record names (a record's key carries its base's generation, so no record is read
    /// for it), and a served record of a build before the history.
    fn prune(&self, version: u64, keep: usize) -> Result<(), StoreError> {
        let oldest = version.saturating_sub(keep.max(1) as u64 - 1);
        let mut kept_base = u64::MAX;
        for key in self.served.scan_prefix(RECORD_PREFIX).keys() {
            let key = key.map_err(io("listing stored maps"))?;
            match record_key_parts(&key) {
                Some((v, _)) if v < oldest => {
                    self.served
                        .remove(&key)
                        .map_err(io("dropping an old map"))?;
                }
                Some((_, g)) => kept_base = kept_base.min(g),
                None => {}
            }
        }
        let unused = self
            .served
            .range(BASE_PREFIX.to_vec()..prefixed(BASE_PREFIX, kept_base))
            .keys();
        for key in unused {
            let key = key.map_err(io("listing stored topologies"))?;
            self.served
                .remove(key)
                .map_err(io("dropping an old topology"))?;
        }
        for legacy in [SERVED_KEY, BASE_KEY] {
            self.served
                .remove(legacy)
                .map_err(io("dropping a record of an older build"))?;
        }
        // The history of an older build (whole maps, read only when no record exists).
        if !self.maps.is_empty() {
            self.maps
                .clear()
                .map_err(io("dropping the history of an older build"))?;
        }
        Ok(())
    }

    /// Stores `state`, the estimator's whole state after the round of record `version`, as
    /// the checkpoint, then drops the round entries it covers (up to `version`). Entries after
    /// it are kept, so a crash at any point leaves a checkpoint and the entries that follow
    /// it. Durable when it returns.
    pub fn put_checkpoint(&self, version: u64, state: &[u8]) -> Result<(), StoreError> {
        let mut bytes = Vec::with_capacity(16 + state.len());
        bytes.extend_from_slice(CHECKPOINT_MAGIC);
        bytes.extend_from_slice(&version.to_be_bytes());
        bytes.extend_from_slice(state);
        self.served
            .insert(CHECKPOINT_KEY, bytes)
            .map_err(io("writing the estimator's checkpoint"))?;
        self.flush("the estimator's checkpoint")?;
        let covered = self
            .served
            .range(ENTRY_PREFIX.to_vec()..=entry_key(version))
            .keys();
        for key in covered {
            let key = key.map_err(io("listing round entries"))?;
            self.served
                .remove(key)
                .map_err(io("dropping a round entry"))?;
        }
        self.flush("the round entries")
    }

    /// The served record (the newest stored map version), if one was stored, with its
    /// instance rebuilt exactly: the base topology it names, with the round's demands,
    /// coefficients and capacities; and the estimator's checkpoint and the round entries after
    /// it, up to the served version.
    pub fn served(&self) -> Result<Option<Served>, StoreError> {
        let newest = self
            .served
            .scan_prefix(RECORD_PREFIX)
            .keys()
            .next_back()
            .transpose()
            .map_err(io("listing stored maps"))?;
        let (bytes, base) = match newest.as_deref().and_then(record_key_parts) {
            Some((version, generation)) => {
                let bytes = self.get_served(&record_key(version, generation), "the served map")?;
                let base = self.get_served(&prefixed(BASE_PREFIX, generation), "its topology")?;
                (bytes, base.map(|b| (generation, b.to_vec())))
            }
            None => {
                // A store of a build before the history: one record and its base.
                let bytes = self.get_served(SERVED_KEY, "the served map")?;
                let base = self.get_served(BASE_KEY, "its topology")?.map(|b| {
                    let (generation, json) = b.split_at(8.min(b.len()));
                    let generation = <[u8; 8]>::try_from(generation).map(u64::from_be_bytes);
                    (generation.unwrap_or(u64::MAX), json.to_vec())
                });
                (bytes, base)
            }
        };
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        self.read_record(&bytes, base, "the stored served map", true)
            .map(Some)
    }

    /// Map version `version` as stored, with the instance it was solved for: the served one
    /// or an older one of the history; `None` when it is not kept.
    pub fn stored_map(&self, version: u64) -> Result<Option<(Topology, Map)>, StoreError> {
        let key = self
            .served
            .scan_prefix(prefixed(RECORD_PREFIX, version))
            .keys()
            .next()
            .transpose()
            .map_err(io("listing stored maps"))?;
        let Some((_, generation)) = key.as_deref().and_then(record_key_parts) else {
            return Ok(None);
        };
        let what = format!("stored map version {version}");
        let bytes = self.get_served(&record_key(version, generation), &what)?;
        let base = self.get_served(&prefixed(BASE_PREFIX, generation), &what)?;
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let base = base.map(|b| (generation, b.to_vec()));
        let served = self.read_record(&bytes, base, &what, false)?;
        Ok(Some((served.topology, served.map)))
    }

    fn get_served(&self, key: &[u8], what: &str) -> Result<Option<sled::IVec>, StoreError> {
        self.served.get(key).map_err(io(format!("reading {what}")))
    }

    /// A record's bytes with its base (generation, JSON), read back (errors name it `what`);
    /// the estimator's log with it when `with_estimator` (the served record's).
    fn read_record(
        &self,
        bytes: &[u8],
        base: Option<(u64, Vec<u8>)>,
        what: &str,
        with_estimator: bool,
    ) -> Result<Served, StoreError> {
        let corrupt = |problem: String| StoreError::Corrupt {
            what: what.to_string(),
            problem,
        };
        let (record, estimator) = if let Some(body) = bytes.strip_prefix(SERVED_MAGIC.as_slice()) {
            let record: Record = postcard::from_bytes(body).map_err(|e| corrupt(e.to_string()))?;
            let estimator = if with_estimator {
                self.estimator_log(record.version)?
            } else {
                EstimatorLog::default()
            };
            (Stored::Now(record), estimator)
        } else if let Some(body) = bytes.strip_prefix(SERVED_MAGIC_03.as_slice()) {
            let (record, rest): (Record03, &[u8]) =
                postcard::take_from_bytes(body).map_err(|e| corrupt(e.to_string()))?;
            let (len, state) = rest.split_at(8.min(rest.len()));
            let len = <[u8; 8]>::try_from(len)
                .map(u64::from_le_bytes)
                .map_err(|_| corrupt("cut short before the estimator's state".into()))?;
            if len != state.len() as u64 {
                return Err(corrupt(format!(
                    "the estimator's state is {} bytes where {len} were written",
                    state.len()
                )));
            }
            let estimator = EstimatorLog {
                checkpoint: (!state.is_empty()).then(|| (record.version, state.to_vec())),
                entries: Vec::new(),
            };
            (Stored::Format03(record), estimator)
        } else {
            return Err(corrupt(format!(
                "its header is not {:?}",
                String::from_utf8_lossy(SERVED_MAGIC)
            )));
        };
        let (generation, json) = base.ok_or_else(|| corrupt("its topology is missing".into()))?;
        let (epoch, version, solved_at_unix_ms, base_generation) = record.identity();
        if generation != base_generation {
            return Err(corrupt(format!(
                "it names topology {base_generation} but the store holds {generation}"
            )));
        }
        let base = parse_instance(&json, Limits::default())
            .map_err(|e| corrupt(format!("its topology: {e}")))?;
        let (topology, map) = record.instance_and_map(&base).map_err(corrupt)?;
        Ok(Served {
            epoch,
            version,
            solved_at_unix_ms,
            topology,
            map,
            estimator,
        })
    }

    /// The estimator's checkpoint and the round entries after it up to `served` (in version
    /// order, stopping before a missing version).
    fn estimator_log(&self, served: u64) -> Result<EstimatorLog, StoreError> {
        let corrupt = |problem: String| StoreError::Corrupt {
            what: "the estimator's checkpoint".into(),
            problem,
        };
        let checkpoint = match self
            .served
            .get(CHECKPOINT_KEY)
            .map_err(io("reading the estimator's checkpoint"))?
        {
            None => None,
            Some(bytes) => {
                let body = bytes
                    .strip_prefix(CHECKPOINT_MAGIC.as_slice())
                    .ok_or_else(|| corrupt("its header is wrong".into()))?;
                let (version, state) = body.split_at(8.min(body.len()));
                let version = <[u8; 8]>::try_from(version)
                    .map(u64::from_be_bytes)
                    .map_err(|_| corrupt("cut short".into()))?;
                Some((version, state.to_vec()))
            }
        };
        // Entries replay onto a checkpoint only (the first round's is written after it).
        let Some(after) = checkpoint.as_ref().map(|(v, _)| *v) else {
            return Ok(EstimatorLog::default());
        };
        let mut entries = Vec::new();
        let from = entry_key(after.saturating_add(1));
        for kv in self.served.range(from..=entry_key(served)) {
            let (key, entry) = kv.map_err(io("reading round entries"))?;
            let version = key_number(&key, ENTRY_PREFIX)
                .ok_or_else(|| corrupt(format!("a round entry's key of {} bytes", key.len())))?;
            let expected = entries.last().map_or(after + 1, |(v, _): &(u64, _)| v + 1);
            if version != expected {
                break; // a round whose write failed: the state replays up to it
            }
            entries.push((version, entry.to_vec()));
        }
        Ok(EstimatorLog {
            checkpoint,
            entries,
        })
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
mod tests;
