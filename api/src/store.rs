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

/// The served record after its header (postcard): what the round changed of its base
/// topology, and the map. The estimator's state is not in it: the round's entry is written
/// beside it in the same batch, and the whole state now and then ([`Store::put_checkpoint`]).
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    epoch: u64,
    version: u64,
    solved_at_unix_ms: i64,
    base_generation: u64,
    demands: Vec<f64>,
    per_unit: Vec<cdnmap_mapper::PerUnit>,
    capacities: Vec<f64>,
    map: CompactMap,
}

impl Record {
    fn of(s: &ServedRef<'_>) -> Record {
        let inst = s.instance;
        let demands: Vec<f64> = (0..inst.unit_count() as u32)
            .map(|u| inst.unit_demand(u))
            .collect();
        Record {
            epoch: s.epoch,
            version: s.version,
            solved_at_unix_ms: s.solved_at_unix_ms,
            base_generation: s.base_generation,
            map: CompactMap::of(s.map, Some(&demands)),
            demands,
            per_unit: inst.classes().iter().map(|c| c.per_unit).collect(),
            capacities: inst.capacities(),
        }
    }
}

/// The record of format 03 (read only): the map as [`MapColumns`], the estimator's whole
/// state after it.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct Record03 {
    epoch: u64,
    version: u64,
    solved_at_unix_ms: i64,
    base_generation: u64,
    demands: Vec<f64>,
    per_unit: Vec<cdnmap_mapper::PerUnit>,
    capacities: Vec<f64>,
    map: MapColumns,
}

/// A served record as read, of either format.
enum Stored {
    Now(Record),
    Format03(Record03),
}

impl Stored {
    /// (epoch, version, solved at, base generation).
    fn identity(&self) -> (u64, u64, i64, u64) {
        match self {
            Stored::Now(r) => (r.epoch, r.version, r.solved_at_unix_ms, r.base_generation),
            Stored::Format03(r) => (r.epoch, r.version, r.solved_at_unix_ms, r.base_generation),
        }
    }

    /// The round's instance (`base` with the round's demands, coefficients and capacities)
    /// and its map, checked against it.
    fn instance_and_map(self, base: &Topology) -> Result<(Topology, Map), String> {
        let (demands, per_unit, capacities) = match &self {
            Stored::Now(r) => (r.demands.clone(), &r.per_unit, &r.capacities),
            Stored::Format03(r) => (r.demands.clone(), &r.per_unit, &r.capacities),
        };
        let instance = base
            .with_demands(demands)
            .and_then(|i| i.with_capacities(per_unit, capacities))
            .map_err(|e| format!("its instance: {e}"))?;
        let instance = base.with_instance(instance);
        let map = match &self {
            Stored::Now(r) => r.map.to_map(&instance),
            Stored::Format03(r) => r.map.to_map(&instance),
        }
        .map_err(|e| format!("its map: {e}"))?;
        Ok((instance, map))
    }
}

/// A map, compactly: per unit `count << 1 | whole`, where `whole` says the unit's one
/// allocation is its whole demand (bit for bit, so its amount is not stored: most units at
/// most rounds); the clusters and the other amounts in unit order; overflow only where there
/// is some. About 3 bytes a unit where [`MapColumns`] took 17 or more.
#[derive(Debug, Serialize, Deserialize)]
struct CompactMap {
    count: Vec<u32>,
    cluster: Vec<u32>,
    amount: Vec<f64>,
    overflow: Vec<(u32, f64)>,
}

impl CompactMap {
    /// `map` with `demands` (by unit) to leave whole-demand amounts out; `None` stores every
    /// amount (a map read without its instance).
    fn of(map: &Map, demands: Option<&[f64]>) -> CompactMap {
        let n = map.unit_count();
        let mut out = CompactMap {
            count: Vec::with_capacity(n),
            cluster: Vec::with_capacity(n),
            amount: Vec::new(),
            overflow: Vec::new(),
        };
        for u in 0..n as u32 {
            let a = map.allocations(u);
            let overflow = map.overflow(u);
            let whole = match (a, demands.and_then(|d| d.get(u as usize))) {
                ([only], Some(d)) => overflow == 0.0 && only.amount.to_bits() == d.to_bits(),
                _ => false,
            };
            out.count.push((a.len() as u32) << 1 | u32::from(whole));
            out.cluster.extend(a.iter().map(|x| x.cluster));
            if !whole {
                out.amount.extend(a.iter().map(|x| x.amount));
            }
            if overflow != 0.0 || overflow.is_sign_negative() {
                out.overflow.push((u, overflow));
            }
        }
        out
    }

    /// The map, checked against `instance` (whose demands the whole amounts are): one entry
    /// per unit, known clusters, amounts that are numbers, every column used up exactly.
    fn to_map(&self, instance: &Instance) -> Result<Map, String> {
        let n = instance.unit_count();
        if self.count.len() != n {
            return Err(format!("{} units, the instance {n}", self.count.len()));
        }
        let clusters = instance.clusters().len() as u32;
        let mut map = Map::with_capacity(n, self.cluster.len());
        let (mut at, mut amounts, mut over) = (0usize, self.amount.iter(), self.overflow.iter());
        let mut next_over = over.next();
        for (u, &c) in self.count.iter().enumerate() {
            let (k, whole) = ((c >> 1) as usize, c & 1 == 1);
            if whole && k != 1 {
                return Err(format!("unit {u}: a whole demand in {k} allocations"));
            }
            let end = at
                .checked_add(k)
                .filter(|&e| e <= self.cluster.len())
                .ok_or_else(|| format!("unit {u}: allocations past the end"))?;
            let mut allocs = Vec::with_capacity(k);
            for &cl in &self.cluster[at..end] {
                let amount = if whole {
                    instance.unit_demand(u as u32)
                } else {
                    *amounts
                        .next()
                        .ok_or_else(|| format!("unit {u}: amounts past the end"))?
                };
                if cl >= clusters || !amount.is_finite() {
                    return Err(format!(
                        "unit {u}: allocation ({cl}, {amount}) is not valid"
                    ));
                }
                allocs.push(cdnmap_mapper::Allocation {
                    cluster: cl,
                    amount,
                });
            }
            let overflow = match next_over {
                Some(&(v, x)) if v as usize == u => {
                    next_over = over.next();
                    if !x.is_finite() {
                        return Err(format!("unit {u}: overflow {x} is not a number"));
                    }
                    x
                }
                _ => 0.0,
            };
            map.push_unit(allocs, overflow);
            at = end;
        }
        if at != self.cluster.len() || amounts.next().is_some() || next_over.is_some() {
            return Err("allocations or overflow left after the last unit".into());
        }
        Ok(map)
    }
}

/// A map as format 03 stored it (read only): per unit its allocation count and overflow; per
/// allocation its cluster index and amount.
#[derive(Debug, Serialize, Deserialize)]
struct MapColumns {
    count: Vec<u32>,
    overflow: Vec<f64>,
    cluster: Vec<u32>,
    amount: Vec<f64>,
}

impl MapColumns {
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
mod tests {
    use super::*;
    use cdnmap_mapper::{solve, ClusterState, SolveOptions};

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
                store.put_served(&served(version).as_ref(), 3).expect("map");
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
        // Versions 1-4 from the first topology, 5-8 from the edited one.
        let base_of = |v: u64| if v < 5 { (&first, 1) } else { (&edited, 5) };
        for v in 1..=8u64 {
            let (base, generation) = base_of(v);
            store
                .put_served(
                    &ServedRef {
                        epoch: 1,
                        version: v,
                        solved_at_unix_ms: v as i64,
                        base,
                        base_generation: generation,
                        write_base: v == generation,
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
                assert_eq!(store.map_count(), 4);
                let (instance, map) = store.stored_map(1).expect("read").expect("kept");
                assert_eq!((&instance, &map), (&first, &maps[1]));
            }
        }
        assert_eq!(
            store.map_count(),
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
        let bases: Vec<_> = store.served.scan_prefix(BASE_PREFIX).keys().collect();
        assert_eq!(
            bases.len(),
            1,
            "the first topology is named by no kept record"
        );
        assert_eq!(store.served().expect("read").expect("stored").version, 8);
        // A record cut short is refused, naming what it is.
        store
            .served
            .insert(record_key(6, 5), &b"CDNSRV04\xff"[..])
            .expect("insert");
        let err = store.stored_map(6).expect_err("corrupt");
        assert!(err.to_string().contains("stored map version 6"), "{err}");
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
        let put = |version: u64| {
            let e = format!("e{version}").into_bytes();
            store
                .put_served(
                    &ServedRef {
                        epoch: 1,
                        version,
                        solved_at_unix_ms: 0,
                        base: &inst,
                        base_generation: 1,
                        write_base: version == 1,
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
        let left: Vec<_> = store
            .served
            .scan_prefix(ENTRY_PREFIX)
            .keys()
            .map(|k| k.expect("key").to_vec())
            .collect();
        assert_eq!(
            left,
            vec![entry_key(6), entry_key(7)],
            "covered entries are dropped"
        );
        store.served.remove(entry_key(6)).expect("remove");
        assert_eq!(
            versions(&log(&store)),
            Vec::<u64>::new(),
            "stops before the gap"
        );
        // A cut checkpoint is an error naming it.
        store
            .served
            .insert(CHECKPOINT_KEY, &b"CDNEST01\x00"[..])
            .expect("insert");
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
        store.put_served(&record.as_ref(), 4).expect("map");
        let mut file = cdnmap_topology::format::InstanceFile::of(&inst);
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
            round_entry: b"e",
        };
        store.put_served(&record(1, true), 4).expect("first");
        store.put_served(&record(2, false), 4).expect("second");
        let back = store.served().expect("read").expect("stored");
        assert_eq!(back.topology.instance, round);
        assert_eq!(back.map, map);
        assert_eq!((back.epoch, back.version), (2, 2));
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
        assert!(err.to_string().contains("topology is missing"), "{err}");
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
        let back = store.served().expect("read").expect("stored");
        assert_eq!((back.epoch, back.version, &back.map), (2, 7, &map));
        assert_eq!(back.estimator.checkpoint, Some((7, b"est".to_vec())));
        store
            .put_served(
                &ServedRef {
                    version: 8,
                    base_generation: 8,
                    ..back.as_ref()
                },
                4,
            )
            .expect("next");
        assert_eq!(store.served().expect("read").expect("stored").version, 8);
        assert!(store.served.get(SERVED_KEY).expect("get").is_none());
        assert!(store.served.get(BASE_KEY).expect("get").is_none());
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
        store.put_served(&record.as_ref(), 4).expect("map");
        let key = record_key(1, 0);
        let bytes = store.served.get(&key).expect("get").expect("stored");
        for cut in [0, 7, 8, 20, bytes.len() / 2, bytes.len() - 1] {
            store.served.insert(&key, &bytes[..cut]).expect("insert");
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
