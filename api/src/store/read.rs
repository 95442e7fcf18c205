//! Reading stored map versions from the value files alone. The store reads its records this
//! way, and so does `cdnmap store list|dump`, also beside a running `cdnmap serve` (which holds
//! sled's lock): a record is one file, written whole and renamed into place, so a reader sees
//! a version whole or not at all.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cdnmap_mapper::Limits;
use cdnmap_topology::Topology;

use super::record::{decode, decode_topology};
use super::values::Values;
use super::{
    base_name, journal, record_name, record_name_parts, snapshots, BaseOf, EstimatorLog, Served,
    StoreError, JOURNAL_DIR, RECORD_FILE, VALUES_DIR,
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

/// One stored map version, as listed: its identity and the topology it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionInfo {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    /// The topology the record names: the journal's sequence number of its last edit (an
    /// older build's record: the generation of its base file).
    pub base_generation: u64,
    /// The record's size on disk, in bytes (its base not counted).
    pub bytes: u64,
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

    /// Every stored version, oldest first.
    pub fn versions(&self) -> Result<Vec<VersionInfo>, StoreError> {
        let mut out = Vec::new();
        for name in self.values.names(RECORD_FILE)? {
            let Some((version, base)) = record_name_parts(&name) else {
                continue;
            };
            let generation = base.number();
            // Dropped since it was listed (a running server prunes): not a version any more.
            let Some(bytes) = self.values.get(&name)? else {
                continue;
            };
            let what = format!("stored map version {version}");
            let (record, _) = decode(&bytes).map_err(|problem| StoreError::Corrupt {
                what: what.clone(),
                problem,
            })?;
            let (epoch, v, solved_at_unix_ms, base_generation) = record.identity();
            if (v, base_generation) != (version, generation) {
                return Err(StoreError::Corrupt {
                    what,
                    problem: format!(
                        "it says version {v} of topology {base_generation} but is stored as \
                         version {version} of topology {generation}"
                    ),
                });
            }
            out.push(VersionInfo {
                epoch,
                version,
                solved_at_unix_ms,
                base_generation,
                bytes: bytes.len() as u64,
            });
        }
        Ok(out)
    }

    /// The newest stored version's number, if any.
    pub fn newest(&self) -> Result<Option<u64>, StoreError> {
        Ok(self
            .values
            .names(RECORD_FILE)?
            .iter()
            .filter_map(|n| record_name_parts(n))
            .map(|(v, _)| v)
            .max())
    }

    /// Map version `version` with the instance it was solved for (no estimator log); `None`
    /// when it is not kept.
    pub fn get(&self, version: u64) -> Result<Option<Served>, StoreError> {
        let prefix = format!("{RECORD_FILE}{version:020}-");
        let Some((_, base)) = self
            .values
            .names(&prefix)?
            .first()
            .and_then(|n| record_name_parts(n))
        else {
            return Ok(None);
        };
        let what = format!("stored map version {version}");
        Ok(self
            .record(version, base, &what, None)?
            .map(|(served, _)| served))
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
        let corrupt = |problem: String| StoreError::Corrupt {
            what: what.to_string(),
            problem,
        };
        let generation = base_of.number();
        let Some(bytes) = self.values.get(&record_name(version, base_of))? else {
            return Ok(None);
        };
        let (record, inline) = decode(&bytes).map_err(corrupt)?;
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
        let served = Served {
            epoch,
            version,
            solved_at_unix_ms,
            topology,
            map,
            estimator: EstimatorLog::default(),
        };
        Ok(Some((served, inline)))
    }
}
