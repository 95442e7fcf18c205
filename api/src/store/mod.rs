//! Persistence: the topology, the last maps (versioned, a bounded number kept) with what
//! rebuilds the estimator, and the demand record (feedback reports, bounded by age and count).
//! What is large is a value file of its own ([`values`]: the topology, each map version's
//! record, the base topologies they name, the estimator's round entries and checkpoint); the
//! demand record is a log of segment files ([`reports`]); sled keeps the epoch.
//!
//! **What is durable when.** Every write method returns only after its bytes are synced (a
//! value file, then its directory; a report's record in its segment): once it returns `Ok`, the write
//! survives a crash or restart. The service acknowledges a feedback report only after
//! [`Store::append_report`] returned, so an acknowledged report is never lost; a map is
//! published to queries before it is persisted (a crash in between loses that version, and the
//! restart serves the previous one, which is then the last version stored).
//!
//! The topology and the bases are in the compact form of `cdnmap_topology::compact` (a JSON
//! instance file an older build wrote is still read), every value file compressed with zstd;
//! `cdnmap store dump` prints any stored version as the JSON assignment format.

use std::path::Path;

use cdnmap_mapper::{Instance, Limits, Map};
use cdnmap_topology::format::parse_assignment;
use cdnmap_topology::Topology;
use serde::{Deserialize, Serialize};

mod read;
mod record;
mod reports;
mod values;

pub use read::{StoredMaps, VersionInfo};

use record::{decode_topology, Record, SERVED_MAGIC};
use values::Values;

/// The directory of value files, inside the store's.
const VALUES_DIR: &str = "values";
/// The directory of the demand record's segments ([`reports`]).
const REPORTS_DIR: &str = "reports";
/// The topology's value file (the instance file format).
const TOPOLOGY_FILE: &str = "topology";
/// Each stored map version's record ([`Store::put_served`]): this prefix, the version and the
/// generation of the base it was solved from (zero-padded, so records list in version order).
/// The newest is the served one; the older ones are the history of `maps_kept` versions.
const RECORD_FILE: &str = "map-";
/// The base topologies the kept records were solved from: this prefix, then the generation
/// (the version of the first record solved from it); the instance file format.
const BASE_FILE: &str = "base-";
/// Each round's estimator entry since the checkpoint: this prefix, then the record's version.
const ENTRY_FILE: &str = "round-";
/// The estimator's last checkpoint: its header, the version of the record it was taken after
/// (u64 BE), then the whole state ([`Store::put_checkpoint`]).
const CHECKPOINT_FILE: &str = "estimator";
const CHECKPOINT_MAGIC: &[u8; 8] = b"CDNEST01";
/// The start counter (in sled): every start takes the next epoch (a map's identity is
/// (epoch, version)).
const EPOCH_KEY: &[u8] = b"epoch";

// Where an older build kept its values in sled (moved to value files by `Store::migrate`).
/// The topology (tree `topology`).
const TOPOLOGY_KEY: &[u8] = b"instance";
/// The published map of a build before the history of records.
const SERVED_KEY: &[u8] = b"served";
/// Records: this prefix, then the version and the base's generation (u64 BE each).
const RECORD_PREFIX: &[u8] = b"map/";
/// Bases: this prefix, then the generation (u64 BE).
const BASE_PREFIX: &[u8] = b"base/";
/// The checkpoint, as [`CHECKPOINT_FILE`] holds it.
const CHECKPOINT_KEY: &[u8] = b"estimator";
/// Round entries: this prefix, then the version (u64 BE).
const ENTRY_PREFIX: &[u8] = b"round/";
/// The topology [`SERVED_KEY`]'s round started from: generation (8 bytes), then JSON.
const BASE_KEY: &[u8] = b"served-base";

/// sled's page cache (its default is 1 GiB). sled holds the small, hot part of the store
/// (the epoch, the demand reports, which are appended and rarely read back); a cache of the
/// default size fills with reports in a minute of a busy feed and stays full, a gigabyte of
/// the mapper's memory for nothing.
const SLED_CACHE_BYTES: u64 = 64 << 20;

/// A checkpoint written but not yet durable ([`Store::write_checkpoint`]).
#[derive(Debug)]
pub struct PendingCheckpoint {
    store: Store,
    version: u64,
    value: values::Pending,
}

impl PendingCheckpoint {
    /// Bytes of the checkpoint's state (before compression: its file is smaller).
    pub fn bytes(&self) -> u64 {
        self.value.len
    }

    /// Makes the checkpoint durable and in place, then drops the round entries it covers (up
    /// to its version). Entries after it are kept, so a crash at any point leaves a checkpoint
    /// and the entries that follow it. Durable when it returns.
    pub fn commit(self) -> Result<(), StoreError> {
        self.value.commit()?;
        let values = &self.store.values;
        for name in values.names(ENTRY_FILE)? {
            if name_number(&name, ENTRY_FILE).is_some_and(|v| v <= self.version) {
                values.remove(&name)?;
            }
        }
        Ok(())
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
    #[error("store: {what}: {source}")]
    File {
        what: String,
        source: std::io::Error,
    },
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

/// The persistent state of one mapper: sled for what is small (the epoch, the feedback
/// reports, an older build's whole-map history) and [`Values`] files for what is large.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
    topology: sled::Tree,
    maps: sled::Tree,
    /// Where an older build kept the demand record: moved to `report_log` when the store is
    /// opened, empty after.
    reports: sled::Tree,
    /// The demand record ([`reports`]).
    report_log: reports::ReportLog,
    /// Where an older build kept its records, bases, entries and checkpoint: moved to
    /// `values` when the store is opened ([`Store::open`]), empty after.
    served: sled::Tree,
    values: Values,
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

#[cfg(test)]
fn prefixed(prefix: &[u8], n: u64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&n.to_be_bytes());
    key
}

/// A record's key: the version and the generation of the base it names.
#[cfg(test)]
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

/// The value file of record `version` (solved from base `generation`): the numbers
/// zero-padded, so the names list in version order.
fn record_name(version: u64, generation: u64) -> String {
    format!("{RECORD_FILE}{version:020}-{generation:020}")
}

/// (version, base generation) of a record's file name.
fn record_name_parts(name: &str) -> Option<(u64, u64)> {
    let (v, g) = name.strip_prefix(RECORD_FILE)?.split_once('-')?;
    Some((v.parse().ok()?, g.parse().ok()?))
}

fn base_name(generation: u64) -> String {
    format!("{BASE_FILE}{generation:020}")
}

fn entry_name(version: u64) -> String {
    format!("{ENTRY_FILE}{version:020}")
}

/// The number of a base's or an entry's file name.
fn name_number(name: &str, prefix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?.parse().ok()
}

/// The number after `prefix` in `key`.
fn key_number(key: &[u8], prefix: &[u8]) -> Option<u64> {
    key.strip_prefix(prefix)
        .and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map(u64::from_be_bytes)
}

impl Store {
    /// Opens (creating) the store at `path`: sled's files and the `values/` directory. Values
    /// an older build kept in sled are moved to their files first ([`Self::migrate`]).
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(SLED_CACHE_BYTES)
            .open()
            .map_err(|source| StoreError::Open {
                path: path.display().to_string(),
                source,
            })?;
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(io(format!("opening tree {name}")))
        };
        let store = Store {
            topology: tree("topology")?,
            maps: tree("maps")?,
            reports: tree("reports")?,
            report_log: reports::ReportLog::open(&path.join(REPORTS_DIR))?,
            served: tree("served")?,
            values: Values::open(&path.join(VALUES_DIR))?,
            db,
        };
        store.migrate()?;
        store.migrate_reports()?;
        Ok(store)
    }

    /// Moves the reports an older build kept in sled to the report log (all in one segment,
    /// written whole), then clears them from sled. A crash in between moves nothing twice: the
    /// log is only written when empty, and the next open finds it written and only clears.
    fn migrate_reports(&self) -> Result<(), StoreError> {
        if self.reports.is_empty() {
            return Ok(());
        }
        let mut records = Vec::new();
        for kv in self.reports.iter() {
            let (k, v) = kv.map_err(io("reading an older build's reports"))?;
            let (Some(at), Some(id)) = (key_number(&k[..8.min(k.len())], b""), k.get(8..16)) else {
                continue;
            };
            let id = <[u8; 8]>::try_from(id).map(u64::from_be_bytes).unwrap_or(0);
            records.push((at as i64, id, v.to_vec()));
        }
        self.report_log.import(&records)?;
        self.reports
            .clear()
            .map_err(io("clearing an older build's reports"))?;
        self.flush("the moved reports")
    }

    /// Moves the values an older build kept in sled (the topology; the records, bases, round
    /// entries and checkpoint; a served record and its base of a build before the history)
    /// to their files, each written and synced before its key is removed, so a crash in
    /// between only repeats the move. A value this build cannot place is left where it is.
    fn migrate(&self) -> Result<(), StoreError> {
        let mut moved: Vec<(sled::Tree, sled::IVec)> = Vec::new();
        if let Some(json) = self
            .topology
            .get(TOPOLOGY_KEY)
            .map_err(io("reading an older build's topology"))?
        {
            self.values.put(TOPOLOGY_FILE, &[&json])?;
            moved.push((self.topology.clone(), TOPOLOGY_KEY.into()));
        }
        for kv in self.served.iter() {
            let (key, value) = kv.map_err(io("reading an older build's records"))?;
            let (name, body): (String, &[u8]) = if let Some((v, g)) = record_key_parts(&key) {
                (record_name(v, g), &value)
            } else if let Some(g) = key_number(&key, BASE_PREFIX) {
                (base_name(g), &value)
            } else if let Some(v) = key_number(&key, ENTRY_PREFIX) {
                (entry_name(v), &value)
            } else if key == CHECKPOINT_KEY {
                (CHECKPOINT_FILE.to_string(), &value)
            } else if key == SERVED_KEY {
                match record::decode(&value) {
                    Ok((r, _)) => {
                        let (_, version, _, generation) = r.identity();
                        (record_name(version, generation), &value)
                    }
                    Err(_) => continue, // read (and reported) as it is
                }
            } else if key == BASE_KEY && value.len() >= 8 {
                let (generation, json) = value.split_at(8);
                let generation = <[u8; 8]>::try_from(generation).map_or(0, u64::from_be_bytes);
                (base_name(generation), json)
            } else {
                continue;
            };
            self.values.put(&name, &[body])?;
            moved.push((self.served.clone(), key));
        }
        if moved.is_empty() {
            return Ok(());
        }
        for (tree, key) in moved {
            tree.remove(key)
                .map_err(io("removing an older build's moved value"))?;
        }
        self.flush("the values moved out of sled")
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

    /// Replaces the stored topology (in the compact form). Durable when it returns.
    pub fn put_topology(&self, topology: &Topology) -> Result<(), StoreError> {
        self.values.put_with(TOPOLOGY_FILE, |w| {
            cdnmap_topology::compact::encode_to(topology, w)
        })
    }

    /// The stored topology, validated like an instance file.
    pub fn topology(&self, limits: Limits) -> Result<Option<Topology>, StoreError> {
        let Some(bytes) = self.values.get(TOPOLOGY_FILE)? else {
            return Ok(None);
        };
        decode_topology(&bytes, limits)
            .map(Some)
            .map_err(|problem| StoreError::Corrupt {
                what: "the stored topology".into(),
                problem,
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
    pub fn map_count(&self) -> Result<usize, StoreError> {
        Ok(self.values.names(RECORD_FILE)?.len())
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
    /// when `served.write_base` says it changed (an Admin edit since the last record). Each is
    /// a value file of its own; the record is written last, so it is the commit: a crash
    /// before it leaves the old served record, and a base or entry no record names, which the
    /// next write drops or replaces. Then drops the records beyond the newest `keep` and the
    /// bases no kept record names. Durable when it returns.
    pub fn put_served(&self, served: &ServedRef<'_>, keep: usize) -> Result<(), StoreError> {
        let record = Record::of(served);
        if served.write_base {
            // Most often the base is the stored topology (the round after an edit, or the
            // first): then it is the same file, linked.
            self.values.put_or_link_with(
                &base_name(served.base_generation),
                |w| cdnmap_topology::compact::encode_to(served.base, w),
                TOPOLOGY_FILE,
            )?;
        }
        self.values
            .put(&entry_name(served.version), &[served.round_entry])?;
        self.values
            .put_with(&record_name(served.version, served.base_generation), |w| {
                w.write_all(SERVED_MAGIC)?;
                postcard::to_io(&record, w)
                    .map(|_| ())
                    .map_err(std::io::Error::other)
            })?;
        self.prune(served.version, keep)
    }

    /// Drops the records older than the newest `keep` versions up to `version`, the bases no
    /// kept record names (a record's name carries its base's generation, so no record is read
    /// for it), and an older build's whole-map history.
    fn prune(&self, version: u64, keep: usize) -> Result<(), StoreError> {
        let oldest = version.saturating_sub(keep.max(1) as u64 - 1);
        let mut named = std::collections::BTreeSet::new();
        for name in self.values.names(RECORD_FILE)? {
            match record_name_parts(&name) {
                Some((v, _)) if v < oldest => self.values.remove(&name)?,
                Some((_, g)) => {
                    named.insert(g);
                }
                None => {}
            }
        }
        for name in self.values.names(BASE_FILE)? {
            if name_number(&name, BASE_FILE).is_some_and(|g| !named.contains(&g)) {
                self.values.remove(&name)?;
            }
        }
        // The history of an older build (whole maps, read only when no record exists).
        if !self.maps.is_empty() {
            self.maps
                .clear()
                .map_err(io("dropping the history of an older build"))?;
            self.flush("dropping the history of an older build")?;
        }
        Ok(())
    }

    /// Stores `state`, the estimator's whole state after the round of record `version`, as
    /// the checkpoint, then drops the round entries it covers (up to `version`). Entries after
    /// it are kept, so a crash at any point leaves a checkpoint and the entries that follow
    /// it. Durable when it returns.
    pub fn put_checkpoint(&self, version: u64, state: &[u8]) -> Result<(), StoreError> {
        self.write_checkpoint(version, |w| w.write_all(state))?
            .commit()
    }

    /// Writes what `write` writes (the estimator's whole state after the round of record
    /// `version`, streamed: at 11 M map units it is over a gigabyte) as the next checkpoint,
    /// unsynced and not yet in place: the caller can let go of the state before
    /// [`PendingCheckpoint::commit`] makes it durable, as [`Self::put_checkpoint`] does.
    pub fn write_checkpoint(
        &self,
        version: u64,
        write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
    ) -> Result<PendingCheckpoint, StoreError> {
        let value = self.values.write_pending(CHECKPOINT_FILE, |w| {
            w.write_all(CHECKPOINT_MAGIC)?;
            w.write_all(&version.to_be_bytes())?;
            write(w)
        })?;
        Ok(PendingCheckpoint {
            store: self.clone(),
            version,
            value,
        })
    }

    /// The served record (the newest stored map version), if one was stored, with its
    /// instance rebuilt exactly: the base topology it names, with the round's demands,
    /// coefficients and capacities; and the estimator's checkpoint and the round entries after
    /// it, up to the served version.
    pub fn served(&self) -> Result<Option<Served>, StoreError> {
        Ok(self.served_read(None)?.map(|(served, _)| served))
    }

    /// [`Self::served`], given `topology`, the stored topology ([`Self::topology`], or what
    /// was just [`Self::put_topology`]'d): when the served record's base file holds the same
    /// bytes as the topology's, the base is `topology` (not read and decoded a second time)
    /// and its generation comes back too, so that a round solved from `topology` writes no
    /// base of its own.
    pub fn served_on(
        &self,
        topology: &Topology,
    ) -> Result<Option<(Served, Option<u64>)>, StoreError> {
        self.served_read(Some(topology))
    }

    fn served_read(
        &self,
        topology: Option<&Topology>,
    ) -> Result<Option<(Served, Option<u64>)>, StoreError> {
        let newest = self.values.names(RECORD_FILE)?.into_iter().next_back();
        let Some((version, generation)) = newest.as_deref().and_then(record_name_parts) else {
            return Ok(None);
        };
        let known = match topology {
            Some(t) if self.values.same(TOPOLOGY_FILE, &base_name(generation))? => Some(t),
            _ => None,
        };
        let served = self.read_record(version, generation, "the stored served map", known)?;
        Ok(served.map(|s| (s, known.map(|_| generation))))
    }

    /// Map version `version` as stored, with the instance it was solved for: the served one
    /// or an older one of the history; `None` when it is not kept.
    pub fn stored_map(&self, version: u64) -> Result<Option<(Topology, Map)>, StoreError> {
        Ok(self
            .maps()
            .get(version)?
            .map(|served| (served.topology, served.map)))
    }

    /// The stored map versions (what `cdnmap store list|dump` reads without sled).
    pub fn maps(&self) -> StoredMaps {
        StoredMaps::of(self.values.clone())
    }

    /// The served record `version` (of base `generation`) read back with its base (errors
    /// name it `what`; `known_base`: see [`StoredMaps::record`]) and the estimator's log.
    fn read_record(
        &self,
        version: u64,
        generation: u64,
        what: &str,
        known_base: Option<&Topology>,
    ) -> Result<Option<Served>, StoreError> {
        let Some((mut served, inline)) =
            self.maps().record(version, generation, what, known_base)?
        else {
            return Ok(None);
        };
        served.estimator = match inline {
            // A record of format 03 carries the estimator's whole state.
            Some(state) => EstimatorLog {
                checkpoint: (!state.is_empty()).then_some((served.version, state)),
                entries: Vec::new(),
            },
            None => self.estimator_log(served.version)?,
        };
        Ok(Some(served))
    }

    /// The estimator's checkpoint and the round entries after it up to `served` (in version
    /// order, stopping before a missing version).
    fn estimator_log(&self, served: u64) -> Result<EstimatorLog, StoreError> {
        let corrupt = |problem: String| StoreError::Corrupt {
            what: "the estimator's checkpoint".into(),
            problem,
        };
        let checkpoint = match self.values.get(CHECKPOINT_FILE)? {
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
        for version in after.saturating_add(1)..=served {
            // A round whose write failed: the state replays up to it.
            let Some(entry) = self.values.get(&entry_name(version))? else {
                break;
            };
            entries.push((version, entry));
        }
        Ok(EstimatorLog {
            checkpoint,
            entries,
        })
    }

    /// Appends one feedback report (already validated, encoded) received at `at_unix_ms`,
    /// then keeps only the reports received at most `retain_ms` before it, and of those the
    /// newest `max_reports` ([`reports`]). Durable when it returns.
    pub fn append_report(
        &self,
        at_unix_ms: i64,
        report: &[u8],
        retain_ms: i64,
        max_reports: usize,
    ) -> Result<u64, StoreError> {
        let id = self.db.generate_id().map_err(io("numbering a report"))?;
        self.report_log
            .append(at_unix_ms, id, report, retain_ms, max_reports)?;
        Ok(id)
    }

    /// The kept reports received in `[from_ms, to_ms)`, oldest first, with their times.
    pub fn reports(&self, from_ms: i64, to_ms: i64) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        self.report_log.read(from_ms, to_ms)
    }

    /// How many reports the store holds (kept, or in a segment not yet deleted).
    pub fn report_count(&self) -> Result<usize, StoreError> {
        self.report_log.count()
    }
}

#[cfg(test)]
mod tests;
