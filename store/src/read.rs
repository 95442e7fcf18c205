//! Reading stored map versions from the value files alone. The store reads its records this
//! way, and so does `cdnmap store list|dump`, also beside a running `cdnmap serve` (which holds
//! sled's lock): a record or a delta is one file, written whole and renamed into place, so a
//! reader sees it whole or not at all; a version whose whole record goes while it is read (the
//! writer rewrote it as a delta) is read from its delta.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cdnmap_mapper::Limits;
use cdnmap_topology::Topology;

use super::map_record::{decode, decode_delta, decode_topology, identity, Record, Stored};
use super::values::Values;
use super::{
    base_name, delta_name, journal, record_name, snapshots, version_files, BaseOf, EstimatorLog,
    Served, StoreError, VersionFile, JOURNAL_DIR, VALUES_DIR,
};
use crate::edit::{apply, Edit};

/// The snapshot in value file `name`, decoded and validated.
pub(super) fn snapshot(
    values: &Values,
    name: &str,
    limits: Limits,
) -> Result<Topology, StoreError> {
    let bytes = values.get(name)?.ok_or_else(|| StoreError::Corrupt {
        what: format!("the topology snapshot {name}"),
        problem: "it is gone".into(),
    })?;
    decode_topology(&bytes, limits).map_err(|problem| StoreError::Corrupt {
        what: format!("the topology snapshot {name}"),
        problem,
    })
}

/// `topology` (the one after edit `seq`) with the journal's `entries` after it applied in
/// order, as the writer applied them (`journal` names the journal in errors).
pub(super) fn replay(
    topology: Topology,
    seq: u64,
    entries: &[(u64, Vec<u8>)],
    journal: &Path,
) -> Result<Topology, StoreError> {
    let mut now = Arc::new(topology);
    for (n, bytes) in entries {
        let corrupt = |problem: String| StoreError::Corrupt {
            what: format!("edit {n} of the topology journal in {}", journal.display()),
            problem,
        };
        debug_assert!(*n > seq);
        let edit: Edit = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
        // Every journaled edit was applied once already: one that no longer applies means the
        // journal and the snapshot do not belong together.
        now = apply(&now, &edit)
            .map_err(|e| corrupt(format!("it no longer applies: {e}")))?
            .topology;
    }
    Ok(Arc::unwrap_or_clone(now))
}

/// [`replay`], skipping each edit that does not read or no longer applies (stored by an
/// older build that took what this one refuses, or after a snapshot that was lost); what was
/// skipped, each naming the edit and why, and what the replay cost (`Applied::cost`, summed).
/// What a start replays: an edit it cannot carry out must not keep it from starting.
pub(super) fn replay_skipping(
    topology: Topology,
    seq: u64,
    entries: &[(u64, Vec<u8>)],
    journal: &Path,
) -> (Topology, Vec<String>, u64) {
    let mut now = Arc::new(topology);
    let mut skipped = Vec::new();
    let mut cost = 0u64;
    for (n, bytes) in entries {
        debug_assert!(*n > seq);
        let applied = serde_json::from_slice::<Edit>(bytes)
            .map_err(|e| {
                let deep = if e.to_string().contains("recursion limit") {
                    format!(
                        " (a resource tree deeper than the {} levels this build takes, stored \
                         by an older build)",
                        cdnmap_mapper::MAX_TREE_DEPTH
                    )
                } else {
                    String::new()
                };
                format!("it does not read: {e}{deep}")
            })
            .and_then(|edit| apply(&now, &edit).map_err(|e| format!("it no longer applies: {e}")));
        match applied {
            Ok(a) => {
                cost = cost.saturating_add(a.cost);
                now = a.topology;
            }
            Err(problem) => skipped.push(format!(
                "edit {n} of the topology journal in {} is skipped: {problem}",
                journal.display()
            )),
        }
    }
    (Arc::unwrap_or_clone(now), skipped, cost)
}

/// The stored topology after edit `seq`: the newest snapshot at or before it, with the
/// journal's edits up to `seq` replayed.
pub(super) fn topology_at(
    values: &Values,
    journal_dir: &Path,
    seq: u64,
) -> Result<Topology, StoreError> {
    let Some((at, name)) = snapshots(values)?.into_iter().rev().find(|s| s.0 <= seq) else {
        return Err(StoreError::Corrupt {
            what: format!("the topology after edit {seq}"),
            problem: "no snapshot at or before it is kept".into(),
        });
    };
    let base = snapshot(values, &name, Limits::default())?;
    let entries = journal::read_dir(journal_dir, at, seq)?;
    if entries.last().map_or(at, |e| e.0) != seq {
        return Err(StoreError::Corrupt {
            what: format!("the topology after edit {seq}"),
            problem: format!(
                "the journal ends before it, at edit {}",
                entries.last().map_or(at, |e| e.0)
            ),
        });
    }
    replay(base, at, &entries, journal_dir)
}

/// One stored map version, as listed: its identity, the topology it names, and how it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionInfo {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    /// The topology the record names: the journal's sequence number of its last edit (an
    /// older build's record: the generation of its base file).
    pub base_generation: u64,
    /// The record's file's size on disk, in bytes (compressed; its base not counted).
    pub bytes: u64,
    /// The record's bytes before compression.
    pub value_bytes: u64,
    /// Whether it is kept whole or as a delta.
    pub kind: RecordKind,
}

/// How a stored version is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// Its whole record (the served version; after a crash, perhaps an older one too).
    Whole,
    /// What differs from the record of version `against` (the next newer one kept).
    Delta { against: u64 },
}

/// The estimator's whole state a record of format 03 carries inline (`None` for records of
/// the format now).
pub(super) type InlineState = Option<Vec<u8>>;

/// The stored map versions of a store directory, read only.
#[derive(Debug, Clone)]
pub struct StoredMaps {
    values: Values,
    /// The topology's journal (the records' bases are rebuilt from a snapshot and it).
    journal: PathBuf,
}

impl StoredMaps {
    /// The versions stored under `path`, a store's directory (`data_dir`), without opening
    /// sled: nothing is written or cleaned up.
    pub fn open(path: &Path) -> Result<StoredMaps, StoreError> {
        Ok(StoredMaps {
            values: Values::open_existing(&path.join(VALUES_DIR))?,
            journal: path.join(JOURNAL_DIR),
        })
    }

    pub(super) fn of(values: Values, journal: PathBuf) -> StoredMaps {
        StoredMaps { values, journal }
    }

    /// Every stored version, oldest first; a version kept twice (a crash between writing its
    /// delta and removing its whole record) as its whole record, which is the one read.
    pub fn versions(&self) -> Result<Vec<VersionInfo>, StoreError> {
        let mut out: Vec<VersionInfo> = Vec::new();
        for f in version_files(&self.values)? {
            if out.last().is_some_and(|v| v.version == f.version) {
                continue;
            }
            // Dropped since it was listed (a running server prunes; or it rewrote a whole
            // record as a delta, which is then read).
            let mut bytes = self.values.get(&f.name)?;
            let mut f = f;
            if bytes.is_none() && !f.delta {
                f.delta = true;
                f.name = delta_name(f.version, f.base);
                bytes = self.values.get(&f.name)?;
            }
            let Some(bytes) = bytes else {
                continue;
            };
            let what = format!("stored map version {} ({})", f.version, f.name);
            let ((epoch, v, solved_at_unix_ms, base_generation), against) = identity(&bytes)
                .map_err(|problem| StoreError::Corrupt {
                    what: what.clone(),
                    problem,
                })?;
            let generation = f.base.number();
            if (v, base_generation) != (f.version, generation) {
                return Err(StoreError::Corrupt {
                    what,
                    problem: format!(
                        "it says version {v} of topology {base_generation} but is stored as \
                         version {} of topology {generation}",
                        f.version
                    ),
                });
            }
            out.push(VersionInfo {
                epoch,
                version: v,
                solved_at_unix_ms,
                base_generation,
                bytes: self.values.file_len(&f.name)?.unwrap_or(0),
                value_bytes: bytes.len() as u64,
                kind: match (f.delta, against) {
                    (true, Some(against)) => RecordKind::Delta { against },
                    (false, None) => RecordKind::Whole,
                    _ => {
                        return Err(StoreError::Corrupt {
                            what,
                            problem: "its contents are not of the kind its name says".into(),
                        })
                    }
                },
            });
        }
        Ok(out)
    }

    /// The newest stored version's number, if any.
    pub fn newest(&self) -> Result<Option<u64>, StoreError> {
        Ok(version_files(&self.values)?.last().map(|f| f.version))
    }

    /// Map version `version` with the instance it was solved for (no estimator log); `None`
    /// when it is not kept. A version kept as a delta is rebuilt from the newest whole record
    /// at or after it and the deltas between; a damaged file on that way refuses it with an
    /// error naming the file.
    pub fn get(&self, version: u64) -> Result<Option<Served>, StoreError> {
        let files = version_files(&self.values)?;
        let what = format!("stored map version {version}");
        let Some((stored, base)) = self.load(version, files, &what)? else {
            return Ok(None);
        };
        Ok(Some(self.finish(stored, base, &what, None)?))
    }

    /// The record of `version` as stored, and the topology it names: its whole record, or its delta applied to the
    /// record of the version it is against (itself read so, until a whole one). `None` when
    /// `version` is not kept.
    pub(super) fn load(
        &self,
        version: u64,
        mut files: Vec<VersionFile>,
        what: &str,
    ) -> Result<Option<(Stored, BaseOf)>, StoreError> {
        let corrupt = |name: &str, problem: String| StoreError::Corrupt {
            what: what.to_string(),
            problem: format!("{name}: {problem}"),
        };
        // The deltas from `version` up, each with its file's name.
        let mut deltas: Vec<(super::map_record::Delta, String)> = Vec::new();
        let mut v = version;
        let mut first_base = None;
        let newest = loop {
            // Its whole record first (the one read when both are there), then its delta; a
            // file gone since the listing is looked for as the other kind, and a version
            // stored since (a running server went on) in a new listing.
            let mut base = files.iter().find(|f| f.version == v).map(|f| f.base);
            if base.is_none() && !deltas.is_empty() {
                files = version_files(&self.values)?;
                base = files.iter().find(|f| f.version == v).map(|f| f.base);
            }
            let Some(base) = base else {
                if deltas.is_empty() {
                    return Ok(None);
                }
                let (_, name) = &deltas[deltas.len() - 1];
                return Err(corrupt(
                    name,
                    format!("version {v}, which it is read against, is not kept"),
                ));
            };
            first_base.get_or_insert(base);
            let whole = record_name(v, base);
            if let Some(bytes) = self.values.get(&whole)? {
                break decode(&bytes).map_err(|e| corrupt(&whole, e))?.0;
            }
            let name = delta_name(v, base);
            let Some(bytes) = self.values.get(&name)? else {
                if deltas.is_empty() {
                    return Ok(None); // dropped since it was listed
                }
                return Err(corrupt(&name, format!("version {v} is gone")));
            };
            let delta = decode_delta(&bytes).map_err(|e| corrupt(&name, e))?;
            if delta.version != v || delta.against <= v {
                return Err(corrupt(
                    &name,
                    format!(
                        "it says version {} against version {}, stored as a delta of version {v}",
                        delta.version, delta.against
                    ),
                ));
            }
            v = delta.against;
            deltas.push((delta, name));
        };
        let Some(base) = first_base else {
            return Ok(None);
        };
        if deltas.is_empty() {
            return Ok(Some((newest, base)));
        }
        let mut record: Record = match newest {
            Stored::Now(r) => r,
            Stored::Format03(_) => {
                let (_, name) = &deltas[deltas.len() - 1];
                return Err(corrupt(
                    name,
                    "it is against a record of format 03, which no delta is".into(),
                ));
            }
        };
        while let Some((delta, name)) = deltas.pop() {
            record = delta.apply(&record).map_err(|e| corrupt(&name, e))?;
        }
        Ok(Some((Stored::Now(record), base)))
    }

    /// Record `version` (of `base`) read back with its base (errors name it `what`), and the
    /// estimator state a record of format 03 carries inline. `known_base` is the base already
    /// decoded, when the caller knows it (the stored topology, when the record was solved
    /// from it).
    pub(super) fn record(
        &self,
        version: u64,
        base_of: BaseOf,
        what: &str,
        known_base: Option<&Topology>,
    ) -> Result<Option<(Served, InlineState)>, StoreError> {
        let Some(bytes) = self.values.get(&record_name(version, base_of))? else {
            return Ok(None);
        };
        let (record, inline) = decode(&bytes).map_err(|problem| StoreError::Corrupt {
            what: what.to_string(),
            problem,
        })?;
        Ok(Some((
            self.finish(record, base_of, what, known_base)?,
            inline,
        )))
    }

    /// A record read back with its base (`known_base`, or rebuilt: [`Self::record`]).
    fn finish(
        &self,
        record: Stored,
        base_of: BaseOf,
        what: &str,
        known_base: Option<&Topology>,
    ) -> Result<Served, StoreError> {
        let corrupt = |problem: String| StoreError::Corrupt {
            what: what.to_string(),
            problem,
        };
        let generation = base_of.number();
        let (epoch, version, solved_at_unix_ms, base_generation) = record.identity();
        if generation != base_generation {
            return Err(corrupt(format!(
                "it names topology {base_generation} but is stored under {generation}"
            )));
        }
        let decoded;
        let base = match known_base {
            Some(base) => base,
            None => {
                decoded = match base_of {
                    BaseOf::Journal(seq) => topology_at(&self.values, &self.journal, seq)
                        .map_err(|e| corrupt(format!("its topology: {e}")))?,
                    BaseOf::File(g) => {
                        let bytes = self
                            .values
                            .get(&base_name(g))?
                            .ok_or_else(|| corrupt("its topology is missing".into()))?;
                        decode_topology(&bytes, Limits::default())
                            .map_err(|e| corrupt(format!("its topology: {e}")))?
                    }
                };
                &decoded
            }
        };
        let (topology, map) = record.instance_and_map(base).map_err(corrupt)?;
        Ok(Served {
            epoch,
            version,
            solved_at_unix_ms,
            topology,
            map,
            estimator: EstimatorLog::default(),
        })
    }
}
