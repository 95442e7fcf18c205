//! Two stored map versions compared for an operator (`Admin.DiffMaps`, the dashboard's
//! `/api/diff`; `cdnmap store diff` reads a store directory itself): read back from the store
//! off the async threads, one diff at a time (each holds two whole versions and their
//! topologies), compared by `cdnmap_mapper::diff`.

use cdnmap_mapper::diff::MapDiff;

use crate::service::Shared;

/// Map diffs run one at a time.
static DIFFS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// The most flows or units a diff lists.
pub const MAX_ROWS: u32 = 10_000;
/// What a diff lists when not told: 100 rows.
pub const DEFAULT_ROWS: usize = 100;

/// How many rows `n` asks for (0: [`DEFAULT_ROWS`]), or why not.
pub fn rows(n: u32) -> Result<usize, String> {
    match n {
        0 => Ok(DEFAULT_ROWS),
        n if n <= MAX_ROWS => Ok(n as usize),
        n => Err(format!("{n}; at most {MAX_ROWS}")),
    }
}

/// Why a diff was not made.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("another map diff is running: retry when it is done")]
    Busy,
    /// A version that is not stored, and the versions that are.
    #[error("{0}")]
    NotStored(String),
    #[error("reading the stored maps: {0}")]
    Failed(String),
}

/// Versions `from` and `to` compared.
pub struct Diffed {
    pub from: u64,
    pub to: u64,
    pub diff: MapDiff,
}

/// Stored versions `from` and `to` (0: the newest) of `shared`'s store compared, listing at
/// most `max_units` changed units.
pub async fn diff_stored(
    shared: &Shared,
    from: u64,
    to: u64,
    max_units: usize,
) -> Result<Diffed, DiffError> {
    let _one = DIFFS.try_acquire().map_err(|_| DiffError::Busy)?;
    let maps = shared.store.maps();
    tokio::task::spawn_blocking(move || {
        let failed = |e: cdnmap_store::StoreError| DiffError::Failed(e.to_string());
        let to = match to {
            0 => maps
                .newest()
                .map_err(failed)?
                .ok_or_else(|| DiffError::NotStored("no map version is stored yet".into()))?,
            v => v,
        };
        let read = |v: u64| -> Result<cdnmap_store::Served, DiffError> {
            maps.get(v).map_err(failed)?.ok_or_else(|| {
                let kept: Vec<String> = maps
                    .versions()
                    .map(|vs| vs.iter().map(|v| v.version.to_string()).collect())
                    .unwrap_or_default();
                DiffError::NotStored(format!(
                    "map version {v} is not stored (kept: {})",
                    kept.join(", ")
                ))
            })
        };
        let (old, new) = (read(from)?, read(to)?);
        let diff = cdnmap_mapper::diff::diff(
            (&old.topology, &old.map),
            (&new.topology, &new.map),
            max_units,
        );
        Ok(Diffed { from, to, diff })
    })
    .await
    .map_err(|e| DiffError::Failed(e.to_string()))?
}
