//! Persistence: the topology, the last maps (versioned, a bounded number kept) with what
//! rebuilds the estimator, and the demand record (feedback reports, bounded by age, count and
//! disk bytes). Also the two things a start replays or reads back without the service: the
//! topology's edits ([`edit`]: [`edit::Edit`] and [`edit::apply`]) and the demand record's
//! types ([`record`]).
//!
//! The crate depends on the pure crates only (mapper, topology, estimator), not on the
//! service or the round engine: a map record is written from its parts ([`ServedRef`]) and
//! read back as its parts ([`Served`]). It never reads the clock (every time is an argument)
//! and does no I/O outside its own directory; errors are [`StoreError`], naming the file.
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
//! The topology is a snapshot in the compact form of `cdnmap_topology::compact` (a JSON
//! instance file an older build wrote is still read) and the journal of the edits after it
//! ([`journal`]): an edit is stored as itself, not as a copy of the topology, and each record
//! names the topology it was solved from by the journal's sequence number of its last edit.
//! Every value file is compressed with zstd; `cdnmap store dump` prints any stored version as
//! the JSON assignment format.
//!
//! **The history of map versions.** The served record (the newest) is always whole
//! (`map-<version>-j<seq>`); each older kept version is a delta against the next newer one
//! (`mapd-<version>-j<seq>`, [`map_record::Delta`]), so a listing tells the two apart. A record
//! holds the round's demands as 16-bit codes where the code's value is the demand bit for bit
//! (every forecast: the estimator rounds them so, `cdnmap_estimator::demand_code`), the
//! others exactly; a delta holds, column by column, what differs from the next record
//! (wrapping differences and XORs, mostly zeros, which zstd takes away). Why: at 11 M map
//! units a record with `f64` demands was about 103 MB, 88 MB of it incompressible forecasts,
//! and `maps_kept = 64` of them 6.6 GB; now a whole record is 34 MB and a delta 5 MB
//! (`docs/perf/store-history.md`).
//! Version `v − k` is read by applying `k` deltas to the newest whole record.
//!
//! [`Store::put_served`] writes the new record whole (the commit), then the previous record's
//! delta, then removes the previous whole file, each write synced before the next step. A
//! crash between any two leaves the new record served and every kept version readable: a
//! version found both whole and as a delta is read from the whole file, and the delta goes at
//! the next prune; a version left whole stays so until it is pruned. A damaged delta refuses
//! its version and the older ones (read through it) with an error naming the file; the newer
//! ones, the start and the next rounds do not read it; a damaged served record, or a damaged
//! snapshot, does not stop a start either: it falls back to the newest state that reads and
//! says what it skipped ([`recover`]). Pruning drops the oldest versions
//! first, on which nothing depends (deltas depend on newer versions only). Records of the
//! formats before (03: the estimator's state inline; 04: the demands as `f64`s) are still
//! read, and a record of format 04 served before is rewritten as a delta like any other.

use std::path::Path;

use cdnmap_mapper::{Instance, Limits, Map};
use cdnmap_topology::format::parse_assignment;
use cdnmap_topology::Topology;
use serde::{Deserialize, Serialize};

pub mod edit;
mod error;
mod journal;
mod map_record;
mod read;
pub mod record;
mod recover;
mod reports;
mod values;

pub use error::StoreError;
pub use read::{RecordKind, StoredMaps, VersionInfo};
pub use recover::{StartServed, StartTopology};
pub use reports::Bounds as ReportBounds;

use edit::Edit;
use error::io;
use map_record::Record;
use values::Values;

/// The directory of value files, inside the store's.
const VALUES_DIR: &str = "values";
/// The directory of the demand record's segments ([`reports`]).
const REPORTS_DIR: &str = "reports";
/// The directory of the change history's segments (the same log as the demand record's).
const HISTORY_DIR: &str = "history";

/// What the change history keeps: a year of records, at most this many, in at most 64 MB.
pub const HISTORY_BOUNDS: ReportBounds = ReportBounds {
    retain_ms: 366 * 24 * 3_600_000,
    max_reports: 20_000,
    max_bytes: 64 << 20,
};
/// The directory of the topology's journal ([`journal`]), inside the store's.
const JOURNAL_DIR: &str = "journal";
/// Where a start moves the damaged files it skipped ([`recover`]), inside the store's.
const DAMAGED_DIR: &str = "damaged";
/// The topology as an older build stored it (the compact form, or an instance file): the
/// snapshot of sequence number 0.
const TOPOLOGY_FILE: &str = "topology";
/// A snapshot of the topology: this prefix, then the journal's sequence number of the last
/// edit in it (zero-padded); the compact form.
const SNAPSHOT_FILE: &str = "topology-";
/// How many of the snapshots after the served record's base are kept: what a round in flight
/// may need (its base is after the served one's; each snapshot written while it solves is
/// after its base, so it needs the newest before those), with this many written while it
/// solves less one.
const SNAPSHOTS_AHEAD: usize = 3;
/// Each stored map version's record ([`Store::put_served`]): this prefix, the version, and the
/// topology it was solved from: `j` and the journal's sequence number of its last edit, or
/// (an older build's records) the generation of a base file (zero-padded, so records list in
/// version order). The newest is the served one, always whole; the older ones are the history
/// of `maps_kept` versions, each a delta ([`DELTA_FILE`]) once the next one is written.
const RECORD_FILE: &str = "map-";
/// An older version of the history kept as a delta against the next newer record
/// ([`map_record::Delta`]): this prefix, then the version and the topology as for
/// [`RECORD_FILE`], so a listing tells whole records from deltas.
const DELTA_FILE: &str = "mapd-";
/// The base topologies an older build's records were solved from: this prefix, then the
/// generation (the version of the first record solved from it). Records now name a journal
/// position instead; these go when no kept record names them.
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

/// What sled writes to its settings file, `conf`, in the store's directory (then a checksum):
/// its defaults, which this build never changes. A `conf` that does not start so is damaged
/// (sled refuses it with an error naming neither it nor what to do) and can be removed: sled
/// writes it anew.
const SLED_CONF: &str = "segment_size: 524288\nuse_compression: false\nversion: 0.34\n";

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
    /// The change history: the operators' actions and what came of them, as the service
    /// encodes them (the same segment log as the demand record).
    history_log: reports::ReportLog,
    /// The topology's edits since its oldest kept snapshot ([`journal`]).
    journal: journal::Journal,
    /// Held while snapshots and journal segments are dropped (by a round's prune and by a
    /// snapshot's, which may run at once).
    pruning: std::sync::Arc<std::sync::Mutex<()>>,
    /// Where an older build kept its records, bases, entries and checkpoint: moved to
    /// `values` when the store is opened ([`Store::open`]), empty after.
    served: sled::Tree,
    values: Values,
    /// The served record as [`Store::put_served`] last wrote it: the next one rewrites it as
    /// a delta against itself without reading it back (after a start, it is read once).
    last: std::sync::Arc<LastRecord>,
    /// Where a start moves the damaged files it skipped ([`recover`]): nothing reads them.
    damaged: std::path::PathBuf,
}

/// The record [`Store::put_served`] wrote last (at 11 M map units about 100 MB of columns).
#[derive(Default)]
struct LastRecord(std::sync::Mutex<Option<std::sync::Arc<Record>>>);

impl std::fmt::Debug for LastRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let version = self
            .0
            .lock()
            .ok()
            .and_then(|r| r.as_ref().map(|r| r.version));
        f.debug_struct("LastRecord")
            .field("version", &version)
            .finish()
    }
}

/// How far [`Store::put_served`] goes: all the way, or (tests) to a step after which a crash
/// is simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PutStep {
    /// The new record is written (the commit).
    Committed,
    /// The previous record's delta is written too (its whole file not yet removed).
    DeltaWritten,
    /// Everything, pruning included.
    Done,
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
    /// The journal's sequence number of the last edit in the topology the round started from
    /// (the topology writer publishes each topology with that number): the record names its
    /// base by it, and the store rebuilds the base from a snapshot and the journal.
    pub base_seq: u64,
    /// The round's instance: `base` with the round's demands, coefficients and capacities.
    pub instance: &'a Instance,
    pub map: &'a Map,
    /// The round's estimator entry (what it observed, the small state after it).
    pub round_entry: &'a [u8],
}

impl Served {
    /// The record as written, naming the stored topology after edit `base_seq` as its base
    /// (its last estimator entry as the round's; a checkpoint is written apart,
    /// [`Store::put_checkpoint`]).
    pub fn as_ref(&self, base_seq: u64) -> ServedRef<'_> {
        ServedRef {
            epoch: self.epoch,
            version: self.version,
            solved_at_unix_ms: self.solved_at_unix_ms,
            base_seq,
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

/// The topology a record was solved from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BaseOf {
    /// The stored topology after journal entry `.0` (a snapshot and the journal).
    Journal(u64),
    /// An older build's base file of this generation.
    File(u64),
}

impl BaseOf {
    /// The number the record's own identity carries for its base.
    fn number(self) -> u64 {
        match self {
            BaseOf::Journal(n) | BaseOf::File(n) => n,
        }
    }
}

/// The value file of record `version` (solved from `base`): the numbers zero-padded, so the
/// names list in version order.
fn record_name(version: u64, base: BaseOf) -> String {
    version_name(RECORD_FILE, version, base)
}

/// The value file of version `version` (solved from `base`) kept as a delta.
fn delta_name(version: u64, base: BaseOf) -> String {
    version_name(DELTA_FILE, version, base)
}

fn version_name(prefix: &str, version: u64, base: BaseOf) -> String {
    match base {
        BaseOf::Journal(seq) => format!("{prefix}{version:020}-j{seq:020}"),
        BaseOf::File(g) => format!("{prefix}{version:020}-{g:020}"),
    }
}

/// (version, base) of a record's file name.
fn record_name_parts(name: &str) -> Option<(u64, BaseOf)> {
    version_name_parts(name, RECORD_FILE)
}

fn version_name_parts(name: &str, prefix: &str) -> Option<(u64, BaseOf)> {
    let (v, b) = name.strip_prefix(prefix)?.split_once('-')?;
    let base = match b.strip_prefix('j') {
        Some(seq) => BaseOf::Journal(seq.parse().ok()?),
        None => BaseOf::File(b.parse().ok()?),
    };
    Some((v.parse().ok()?, base))
}

/// A stored version's file: its whole record, or its delta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VersionFile {
    pub(crate) version: u64,
    pub(crate) base: BaseOf,
    pub(crate) delta: bool,
    pub(crate) name: String,
}

/// The stored versions' files, in version order, a version's whole record before its delta
/// (both are there after a crash between writing the delta and removing the whole record).
fn version_files(values: &Values) -> Result<Vec<VersionFile>, StoreError> {
    let mut out = Vec::new();
    for (prefix, delta) in [(RECORD_FILE, false), (DELTA_FILE, true)] {
        for name in values.names(prefix)? {
            if let Some((version, base)) = version_name_parts(&name, prefix) {
                out.push(VersionFile {
                    version,
                    base,
                    delta,
                    name,
                });
            }
        }
    }
    out.sort_by_key(|f| (f.version, f.delta));
    Ok(out)
}

fn snapshot_name(seq: u64) -> String {
    format!("{SNAPSHOT_FILE}{seq:020}")
}

/// The snapshots among `values` (the legacy topology file as sequence number 0), oldest
/// first: (sequence number, file name).
fn snapshots(values: &Values) -> Result<Vec<(u64, String)>, StoreError> {
    let mut out: Vec<(u64, String)> = values
        .names(SNAPSHOT_FILE)?
        .into_iter()
        .filter_map(|n| Some((name_number(&n, SNAPSHOT_FILE)?, n)))
        .collect();
    if values
        .names(TOPOLOGY_FILE)?
        .iter()
        .any(|n| n == TOPOLOGY_FILE)
    {
        out.push((0, TOPOLOGY_FILE.to_string()));
    }
    // By number; for the same number the snapshot before the legacy file.
    out.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())));
    out.dedup_by_key(|s| s.0);
    Ok(out)
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

/// Why sled's files in `path` did not open, naming the damaged file and what to do when one
/// is: its settings (`conf`, which can be removed), or its log (`db`: the epoch counter and
/// the report ids).
fn sled_open_error(path: &Path, source: sled::Error) -> StoreError {
    let conf = path.join("conf");
    let damaged_conf = std::fs::read(&conf)
        .is_ok_and(|bytes| bytes.len() > 8 && !bytes.starts_with(SLED_CONF.as_bytes()));
    if damaged_conf {
        return StoreError::Corrupt {
            what: format!("sled's settings file {}", conf.display()),
            problem: format!(
                "it is damaged (sled says: {source}); it holds only sled's settings, which \
                 this build always writes the same: remove it and start again (sled writes it \
                 anew; the epoch counter and the report ids are in {}, which stays)",
                path.join("db").display()
            ),
        };
    }
    match source {
        sled::Error::Corruption { .. } => StoreError::Corrupt {
            what: format!(
                "sled's log {} (the store's epoch counter and report ids)",
                path.join("db").display()
            ),
            problem: format!(
                "it is damaged (sled says: {source}); the topology, the maps and the demand \
                 record are in files of their own beside it and not affected: to start on \
                 them, move db, conf and blobs/ out of {} (the epoch counter then starts \
                 again, so restart the front ends too: they take only maps of an epoch above \
                 the one they hold)",
                path.display()
            ),
        },
        source => StoreError::Open {
            path: path.display().to_string(),
            source,
        },
    }
}

/// Removes the snapshot files sled was writing when the process died (`snap.<lsn>.generating`).
/// sled 0.34 writes a snapshot under that name, syncs it, then renames it to `snap.<lsn>`; but
/// its open reads the newest `snap.` file by name, the `.generating` one included, and refuses
/// to start when a kill -9 tore it (sled issue #1527: "empty/corrupt snapshot file found",
/// then `Corruption { at: None }`). Such a file is never a snapshot sled finished, and a
/// snapshot only caches the log, so sled starts from the one before and the log after it.
fn remove_torn_sled_snapshots(path: &Path) -> Result<(), StoreError> {
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(reports::file_error(format!("listing {}", path.display()))(
                e,
            ))
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            let file = entry.path();
            tracing::warn!(
                file = %file.display(),
                "a snapshot sled did not finish (the process stopped while writing it) is removed; sled starts from its log"
            );
            values::remove_if_present(&file)?;
        }
    }
    Ok(())
}

impl Store {
    /// Opens (creating) the store at `path`: sled's files and the `values/` directory. Values
    /// an older build kept in sled are moved to their files first ([`Self::migrate`]).
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        remove_torn_sled_snapshots(path)?;
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(SLED_CACHE_BYTES)
            .open()
            .map_err(|source| sled_open_error(path, source))?;
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(io(format!("opening tree {name}")))
        };
        let store = Store {
            journal: journal::Journal::open(&path.join(JOURNAL_DIR))?,
            pruning: Default::default(),
            topology: tree("topology")?,
            maps: tree("maps")?,
            reports: tree("reports")?,
            report_log: reports::ReportLog::open(&path.join(REPORTS_DIR))?,
            history_log: reports::ReportLog::open(&path.join(HISTORY_DIR))?,
            served: tree("served")?,
            values: Values::open(&path.join(VALUES_DIR))?,
            last: Default::default(),
            damaged: path.join(DAMAGED_DIR),
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
                (record_name(v, BaseOf::File(g)), &value)
            } else if let Some(g) = key_number(&key, BASE_PREFIX) {
                (base_name(g), &value)
            } else if let Some(v) = key_number(&key, ENTRY_PREFIX) {
                (entry_name(v), &value)
            } else if key == CHECKPOINT_KEY {
                (CHECKPOINT_FILE.to_string(), &value)
            } else if key == SERVED_KEY {
                match map_record::decode(&value) {
                    Ok((r, _)) => {
                        let (_, version, _, generation) = r.identity();
                        (record_name(version, BaseOf::File(generation)), &value)
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

    /// Stores `topology` as the topology after every edit journaled so far (a snapshot at the
    /// journal's last sequence number): how a new store gets its first topology. Durable
    /// when it returns.
    pub fn put_topology(&self, topology: &Topology) -> Result<(), StoreError> {
        self.put_snapshot(self.journal.last()?, topology)
    }

    /// Stores `topology`, the topology after journal entry `seq`, as a snapshot, then drops
    /// the snapshots and journal segments no kept record needs any more. Durable when it
    /// returns.
    pub fn put_snapshot(&self, seq: u64, topology: &Topology) -> Result<(), StoreError> {
        self.values.put_with(&snapshot_name(seq), |w| {
            cdnmap_topology::compact::encode_to(topology, w)
        })?;
        self.prune_topology()
    }

    /// Journals `edit` (carried out at `at_unix_ms`) as the next edit of the topology; returns
    /// its sequence number. Durable when it returns.
    pub fn append_edit(&self, at_unix_ms: i64, edit: &Edit) -> Result<u64, StoreError> {
        let bytes = serde_json::to_vec(edit).map_err(|e| StoreError::Corrupt {
            what: "an edit to journal".into(),
            problem: e.to_string(),
        })?;
        self.journal.append(at_unix_ms, &bytes)
    }

    /// The stored topology, validated like an instance file.
    pub fn topology(&self, limits: Limits) -> Result<Option<Topology>, StoreError> {
        Ok(self.stored_topology(limits)?.map(|(t, _)| t))
    }

    /// The stored topology (the newest snapshot with the journal's edits after it replayed)
    /// and the sequence number of its last edit.
    pub fn stored_topology(&self, limits: Limits) -> Result<Option<(Topology, u64)>, StoreError> {
        // The topology after every acknowledged edit, or an error: a damaged journal is a
        // start's to fall back past, saying what it lost (`recover`).
        if let Some(d) = self.journal.damage()? {
            return Err(StoreError::Corrupt {
                what: "the stored topology".into(),
                problem: d.problem,
            });
        }
        let last = self.journal.last()?;
        let Some((seq, name)) = snapshots(&self.values)?.pop() else {
            if last > 0 {
                // Edits with nothing to replay them onto: starting afresh would drop them.
                return Err(StoreError::Corrupt {
                    what: "the stored topology".into(),
                    problem: format!(
                        "the journal holds {last} edits but no snapshot of the topology is left"
                    ),
                });
            }
            return Ok(None);
        };
        let topology = read::snapshot(&self.values, &name, limits)?;
        let entries = self.journal.read(seq, last)?;
        let topology = read::replay(topology, seq, &entries, self.journal.dir())?;
        Ok(Some((topology, last.max(seq))))
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

    /// How many map versions are stored (whole or as deltas).
    pub fn map_count(&self) -> Result<usize, StoreError> {
        let mut versions: Vec<u64> = version_files(&self.values)?
            .iter()
            .map(|f| f.version)
            .collect();
        versions.dedup();
        Ok(versions.len())
    }

    /// Takes the next epoch, the stored one plus one or `floor` when that is more, and stores
    /// it before returning, so no two starts of this store ever share one. The service's floor
    /// is its clock (Unix milliseconds): a store that was lost, and starts again at nothing,
    /// still takes an epoch above every one a front end may hold from before.
    pub fn next_epoch(&self, floor: u64) -> Result<u64, StoreError> {
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
        let next = last
            .checked_add(1)
            .ok_or_else(|| StoreError::Corrupt {
                what: "the stored epoch".into(),
                problem: "it is at its maximum".into(),
            })?
            .max(floor);
        self.topology
            .insert(EPOCH_KEY, &next.to_be_bytes())
            .map_err(io("writing the epoch"))?;
        self.flush("the epoch")?;
        Ok(next)
    }

    /// Stores the record of map version `served.version` (the served one from now on, the
    /// newest of the history) with the round's estimator entry. Each is a value file of its
    /// own; the record is written last, so it is the commit: a crash before it leaves the old
    /// served record and an entry no record names, which the next write replaces. The record
    /// names its base by the journal's sequence number (`served.base_seq`): no topology is
    /// written. Then the record served until now is rewritten as a delta against the new one
    /// ([`Self::rewrite_as_delta`]), and the records beyond the newest `keep`, the snapshots,
    /// journal segments and older builds' bases no kept record needs are dropped. Durable
    /// when it returns.
    pub fn put_served(&self, served: &ServedRef<'_>, keep: usize) -> Result<(), StoreError> {
        self.put_served_until(served, keep, PutStep::Done)
    }

    /// [`Self::put_served`] up to step `until` (tests stop it there, as a crash would).
    fn put_served_until(
        &self,
        served: &ServedRef<'_>,
        keep: usize,
        until: PutStep,
    ) -> Result<(), StoreError> {
        let record = std::sync::Arc::new(Record::of(served));
        self.values
            .put(&entry_name(served.version), &[served.round_entry])?;
        // The newest whole record before this one: the served one until now.
        let previous = version_files(&self.values)?
            .into_iter()
            .rfind(|f| !f.delta && f.version < served.version);
        let name = record_name(served.version, BaseOf::Journal(served.base_seq));
        self.values
            .put_with(&name, |w| map_record::write(&record, w))?;
        let cached = match self.last.0.lock() {
            Ok(mut last) => last.replace(std::sync::Arc::clone(&record)),
            Err(_) => None,
        };
        if until == PutStep::Committed {
            return Ok(());
        }
        if let Some(previous) = previous {
            self.rewrite_as_delta(&previous, cached, &record, until)?;
        }
        if until == PutStep::DeltaWritten {
            return Ok(());
        }
        self.prune(served.version, keep)
    }

    /// Rewrites the whole record `previous` as a delta against `newer` (just written and
    /// synced): the delta is written and synced, then the whole file removed, so a crash
    /// leaves one or both, each of which reads back the same version. The older record is
    /// `cached` when that is it (the record written last), else read back. A record that
    /// cannot be read back, or of a format before the delta's, is left whole (read, or
    /// refused with an error naming it, as before).
    fn rewrite_as_delta(
        &self,
        previous: &VersionFile,
        cached: Option<std::sync::Arc<Record>>,
        newer: &Record,
        until: PutStep,
    ) -> Result<(), StoreError> {
        let older = match cached {
            Some(r)
                if r.version == previous.version && r.base_generation == previous.base.number() =>
            {
                r
            }
            _ => match self.values.get(&previous.name) {
                Ok(Some(bytes)) => match map_record::decode(&bytes) {
                    Ok((map_record::Stored::Now(r), _)) => std::sync::Arc::new(r),
                    _ => return Ok(()),
                },
                _ => return Ok(()),
            },
        };
        let Ok(delta) = map_record::DeltaOf::new(&older, newer) else {
            return Ok(());
        };
        self.values
            .put_with(&delta_name(previous.version, previous.base), |w| {
                map_record::write_delta(&delta, w)
            })?;
        if until == PutStep::DeltaWritten {
            return Ok(());
        }
        self.values.remove(&previous.name)
    }

    /// Drops the versions older than the newest `keep` up to `version` (a delta depends only
    /// on newer versions: the oldest just goes), the delta of a version whose whole record is
    /// there too (a crash between writing the one and removing the other: the whole one is
    /// read), an older build's bases no kept record names (a record's name carries its base,
    /// so no record is read for it), then the snapshots and journal segments no kept record
    /// needs ([`Self::prune_topology`]), and an older build's whole-map history.
    fn prune(&self, version: u64, keep: usize) -> Result<(), StoreError> {
        let oldest = version.saturating_sub(keep.max(1) as u64 - 1);
        let files = version_files(&self.values)?;
        let mut named = std::collections::BTreeSet::new();
        for f in &files {
            let whole_too = f.delta && files.iter().any(|w| w.version == f.version && !w.delta);
            if f.version < oldest || whole_too {
                self.values.remove(&f.name)?;
            } else if let BaseOf::File(g) = f.base {
                named.insert(g);
            }
        }
        for name in self.values.names(BASE_FILE)? {
            if name_number(&name, BASE_FILE).is_some_and(|g| !named.contains(&g)) {
                self.values.remove(&name)?;
            }
        }
        self.prune_topology()?;
        // The history of an older build (whole maps, read only when no record exists).
        if !self.maps.is_empty() {
            self.maps
                .clear()
                .map_err(io("dropping the history of an older build"))?;
            self.flush("dropping the history of an older build")?;
        }
        Ok(())
    }

    /// Keeps the snapshots that are needed and drops the others: the newest (a start reads
    /// it), the newest at or before the served record's base (a start rebuilds that base from
    /// it), the newest at or before the oldest kept record's base (the history's bases are
    /// rebuilt from it), and the newest [`SNAPSHOTS_AHEAD`] after the served record's base; then
    /// the journal segments before the oldest kept snapshot. So the store holds at most five
    /// snapshots whatever the number of edits (three when none came after the served
    /// record's base).
    ///
    /// Why those after the served base: a round in flight took its topology after the served
    /// record's, and its record needs the newest snapshot at or before it, which a snapshot
    /// written while the round solves must not drop (it did: the record's base was then
    /// rebuilt from an older snapshot and the journal since, thousands of edits under
    /// continuous Admin edits, and a start took up to 10 s).
    fn prune_topology(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.pruning.lock().map_err(|_| StoreError::Corrupt {
            what: "the store's snapshots".into(),
            problem: "a pruner panicked".into(),
        })?;
        let snaps = snapshots(&self.values)?;
        let Some(newest) = snaps.last().map(|s| s.0) else {
            return Ok(());
        };
        // Of every kept version, whole or a delta (in version order: the served one last).
        let seqs: Vec<u64> = version_files(&self.values)?
            .iter()
            .filter_map(|f| match f.base {
                BaseOf::Journal(seq) => Some(seq),
                BaseOf::File(_) => None,
            })
            .collect();
        let newest_at = |seq: u64| snaps.iter().rev().find(|s| s.0 <= seq).map(|s| s.0);
        let mut keep = vec![newest];
        keep.extend(seqs.last().and_then(|&s| newest_at(s)));
        keep.extend(seqs.iter().min().and_then(|&s| newest_at(s)));
        let served_base = seqs.last().copied().unwrap_or(0);
        keep.extend(
            snaps
                .iter()
                .rev()
                .map(|s| s.0)
                .filter(|&s| s > served_base)
                .take(SNAPSHOTS_AHEAD),
        );
        for (seq, name) in &snaps {
            if !keep.contains(seq) {
                self.values.remove(name)?;
            }
        }
        // A legacy topology file beside a snapshot of the same number is the same topology.
        if snaps.iter().any(|s| s.0 == 0 && s.1 != TOPOLOGY_FILE) {
            self.values.remove(TOPOLOGY_FILE)?;
        }
        let oldest_kept = keep.iter().copied().min().unwrap_or(newest);
        self.journal.drop_through(oldest_kept)
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
        self.served_read(None, true)
    }

    /// The served record without the estimator's log (what a start serves first; the log is
    /// read apart, [`Self::estimator_checkpoint`] and [`Self::estimator_entry`], while the
    /// map is already served), given `topology`, the stored topology after edit `seq`
    /// ([`Self::stored_topology`], or what was just [`Self::put_topology`]'d): when the served
    /// record was solved from it (no edit since), it is the record's base, not rebuilt a second
    /// time. A record of format 03 still brings its inline estimator state.
    pub fn served_on(&self, topology: &Topology, seq: u64) -> Result<Option<Served>, StoreError> {
        self.served_read(Some((topology, seq)), false)
    }

    fn served_read(
        &self,
        topology: Option<(&Topology, u64)>,
        with_log: bool,
    ) -> Result<Option<Served>, StoreError> {
        let newest = self.values.names(RECORD_FILE)?.into_iter().next_back();
        let Some((version, base)) = newest.as_deref().and_then(record_name_parts) else {
            return Ok(None);
        };
        let known = match (topology, base) {
            (Some((t, seq)), BaseOf::Journal(s)) if s == seq => Some(t),
            // An older build's base that is the legacy topology file (linked, or the same
            // bytes), with no edit journaled since.
            (Some((t, 0)), BaseOf::File(g))
                if self.values.same(TOPOLOGY_FILE, &base_name(g))? =>
            {
                Some(t)
            }
            _ => None,
        };
        self.read_record(version, base, "the stored served map", known, with_log)
    }

    /// Map version `version` as stored, with the instance it was solved for: the served one
    /// or an older one of the history; `None` when it is not kept.
    pub fn stored_map(&self, version: u64) -> Result<Option<(Topology, Map)>, StoreError> {
        Ok(self
            .maps()
            .get(version)?
            .map(|served| (served.topology, served.map)))
    }

    /// The stored map versions (what `cdnmap store list|dump` read without sled).
    pub fn maps(&self) -> StoredMaps {
        StoredMaps::of(self.values.clone(), self.journal.dir().to_path_buf())
    }

    /// The served record `version` (of `base`) read back with its base (errors name it
    /// `what`; `known_base`: see [`StoredMaps::record`]) and, `with_log`, the estimator's log.
    fn read_record(
        &self,
        version: u64,
        base: BaseOf,
        what: &str,
        known_base: Option<&Topology>,
        with_log: bool,
    ) -> Result<Option<Served>, StoreError> {
        let Some((mut served, inline)) = self.maps().record(version, base, what, known_base)?
        else {
            return Ok(None);
        };
        served.estimator = match inline {
            // A record of format 03 carries the estimator's whole state.
            Some(state) => EstimatorLog {
                checkpoint: (!state.is_empty()).then_some((served.version, state)),
                entries: Vec::new(),
            },
            None if with_log => self.estimator_log(served.version)?,
            None => EstimatorLog::default(),
        };
        Ok(Some(served))
    }

    /// The estimator's checkpoint and the round entries after it up to `served` (in version
    /// order, stopping before a missing version).
    fn estimator_log(&self, served: u64) -> Result<EstimatorLog, StoreError> {
        let checkpoint = self.estimator_checkpoint()?;
        // Entries replay onto a checkpoint only (the first round's is written after it).
        let Some(after) = checkpoint.as_ref().map(|(v, _)| *v) else {
            return Ok(EstimatorLog::default());
        };
        let mut entries = Vec::new();
        for version in after.saturating_add(1)..=served {
            // A round whose write failed: the state replays up to it.
            let Some(entry) = self.estimator_entry(version)? else {
                break;
            };
            entries.push((version, entry));
        }
        Ok(EstimatorLog {
            checkpoint,
            entries,
        })
    }

    /// The estimator's last checkpoint: the version of the record it was taken after, and the
    /// whole state.
    pub fn estimator_checkpoint(&self) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let read = self.read_estimator_checkpoint(|_, r| {
            let mut state = Vec::new();
            r.read_to_end(&mut state).map(|_| state)
        })?;
        // A read error is the file's damage, reported by the read itself; this is what is left.
        read.map(|(version, state)| {
            state
                .map(|s| (version, s))
                .map_err(|e| StoreError::Corrupt {
                    what: "the estimator's checkpoint".into(),
                    problem: e.to_string(),
                })
        })
        .transpose()
    }

    /// What `read` makes of the estimator's last checkpoint (given the version of the record
    /// it was taken after, and a reader of the state: at 11 M map units it is 1.4 GB, read as
    /// it is decoded, never whole in memory), with that version; `None` when there is none. A
    /// damaged checkpoint is an error, whatever `read` made of it.
    pub fn read_estimator_checkpoint<T>(
        &self,
        read: impl FnOnce(u64, &mut dyn std::io::Read) -> T,
    ) -> Result<Option<(u64, T)>, StoreError> {
        let made = self.values.read_with(CHECKPOINT_FILE, |_, r| {
            let mut head = [0u8; CHECKPOINT_MAGIC.len() + 8];
            match r.read_exact(&mut head) {
                Ok(()) if head.starts_with(CHECKPOINT_MAGIC.as_slice()) => {}
                Ok(()) => return Err("its header is wrong"),
                Err(_) => return Err("cut short"),
            }
            let mut version = [0u8; 8];
            version.copy_from_slice(&head[CHECKPOINT_MAGIC.len()..]);
            let version = u64::from_be_bytes(version);
            Ok((version, read(version, r)))
        })?;
        made.transpose().map_err(|problem| StoreError::Corrupt {
            what: "the estimator's checkpoint".into(),
            problem: problem.into(),
        })
    }

    /// The estimator's entry of the round of record `version`, if it is stored.
    pub fn estimator_entry(&self, version: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.values.get(&entry_name(version))
    }

    /// Appends one feedback report (already validated, encoded) received at `at_unix_ms`,
    /// then keeps only what `bounds` keep: the reports that arrived at most `retain_ms` before
    /// it, of those the newest `max_reports`, in at most `max_bytes` of disk ([`reports`]).
    /// Durable when it returns.
    pub fn append_report(
        &self,
        at_unix_ms: i64,
        report: &[u8],
        bounds: ReportBounds,
    ) -> Result<u64, StoreError> {
        let id = self.db.generate_id().map_err(io("numbering a report"))?;
        self.report_log.append(at_unix_ms, id, report, bounds)?;
        Ok(id)
    }

    /// Bytes the demand record's reports take on disk.
    pub fn report_bytes(&self) -> Result<u64, StoreError> {
        self.report_log.bytes()
    }

    /// The kept reports received in `[from_ms, to_ms)`, oldest first, with their times.
    pub fn reports(&self, from_ms: i64, to_ms: i64) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        self.report_log.read(from_ms, to_ms)
    }

    /// [`Self::reports`], or `None` as soon as their payloads pass `max_bytes` (no more than
    /// that is read into memory).
    pub fn reports_within(
        &self,
        from_ms: i64,
        to_ms: i64,
        max_bytes: usize,
    ) -> Result<Option<reports::Reports>, StoreError> {
        self.report_log.read_within(from_ms, to_ms, max_bytes)
    }

    /// At least the bytes of the reports received in `[from_ms, to_ms)` (the segments that
    /// hold any), known without reading them.
    pub fn report_bytes_within(&self, from_ms: i64, to_ms: i64) -> Result<u64, StoreError> {
        self.report_log.bytes_within(from_ms, to_ms)
    }

    /// Calls `each` with the kept reports received in `[from_ms, to_ms)`, one segment of the
    /// record in memory at a time (`reports::ReportLog::for_each`); `each` returning false
    /// stops.
    pub fn for_each_report(
        &self,
        from_ms: i64,
        to_ms: i64,
        each: impl FnMut(i64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.report_log.for_each(from_ms, to_ms, each)
    }

    /// Appends one record of the change history (an action or what came of it, encoded by the
    /// service) at `at_unix_ms`, within [`HISTORY_BOUNDS`]. Durable when it returns.
    pub fn append_history(&self, at_unix_ms: i64, record: &[u8]) -> Result<u64, StoreError> {
        let id = self
            .db
            .generate_id()
            .map_err(io("numbering a history record"))?;
        self.history_log
            .append(at_unix_ms, id, record, HISTORY_BOUNDS)?;
        Ok(id)
    }

    /// The change history kept, oldest first, with the times the records were appended.
    pub fn history(&self) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        self.history_log.read(i64::MIN, i64::MAX)
    }

    /// How many reports the store holds (kept, or in a segment not yet deleted).
    pub fn report_count(&self) -> Result<usize, StoreError> {
        self.report_log.count()
    }
}

#[cfg(test)]
mod tests;
