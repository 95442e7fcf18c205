//! Reading stored map versions from the value files alone. The store reads its records this
//! way, and so does `cdnmap store list|dump`, also beside a running `cdnmap serve` (which holds
//! sled's lock): a record is one file, written whole and renamed into place, so a reader sees
//! a version whole or not at all.

use std::path::Path;

use cdnmap_mapper::Limits;
use cdnmap_topology::Topology;

use super::record::{decode, decode_topology};
use super::values::Values;
use super::{
    base_name, record_name, record_name_parts, EstimatorLog, Served, StoreError, RECORD_FILE,
    VALUES_DIR,
};

/// One stored map version, as listed: its identity and the topology it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionInfo {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    /// The generation of the base topology the record names.
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
}

impl StoredMaps {
    /// The versions stored under `path`, a store's directory (`data_dir`), without opening
    /// sled: nothing is written or cleaned up.
    pub fn open(path: &Path) -> Result<StoredMaps, StoreError> {
        Ok(StoredMaps {
            values: Values::open_existing(&path.join(VALUES_DIR))?,
        })
    }

    pub(super) fn of(values: Values) -> StoredMaps {
        StoredMaps { values }
    }

    /// Every stored version, oldest first.
    pub fn versions(&self) -> Result<Vec<VersionInfo>, StoreError> {
        let mut out = Vec::new();
        for name in self.values.names(RECORD_FILE)? {
            let Some((version, generation)) = record_name_parts(&name) else {
                continue;
            };
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
        let Some((_, generation)) = self
            .values
            .names(&prefix)?
            .first()
            .and_then(|n| record_name_parts(n))
        else {
            return Ok(None);
        };
        let what = format!("stored map version {version}");
        Ok(self
            .record(version, generation, &what, None)?
            .map(|(served, _)| served))
    }

    /// Record `version` (of base `generation`) read back with its base (errors name it
    /// `what`), and the estimator state a record of format 03 carries inline. `known_base` is
    /// the base already decoded, when the caller knows it (the stored topology, when the base
    /// file holds the same bytes).
    pub(super) fn record(
        &self,
        version: u64,
        generation: u64,
        what: &str,
        known_base: Option<&Topology>,
    ) -> Result<Option<(Served, InlineState)>, StoreError> {
        let corrupt = |problem: String| StoreError::Corrupt {
            what: what.to_string(),
            problem,
        };
        let Some(bytes) = self.values.get(&record_name(version, generation))? else {
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
                let bytes = self
                    .values
                    .get(&base_name(generation))?
                    .ok_or_else(|| corrupt("its topology is missing".into()))?;
                decoded = decode_topology(&bytes, Limits::default())
                    .map_err(|e| corrupt(format!("its topology: {e}")))?;
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
