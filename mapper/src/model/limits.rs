//! The named limits and the index types, and the checks every validation of the model shares.
//!
//! Promises: every list of an instance has a limit named here (or in [`Limits`]), and input
//! past it is refused with [`ModelError::TooMany`]; every number that reaches an instance is
//! finite and non-negative ([`check_number`]), and every `f32` score or rank is, with `-0.0`
//! written as `+0.0` ([`check_f32`]), so its bit pattern orders like the number (the solver's
//! keys rely on it).

use crate::error::ModelError;

/// At most this many map units: the solver packs a map unit's index into 24 bits of a key.
pub const MAX_MAP_UNITS: usize = 1 << 24;
/// At most this many traffic classes: the solver packs a class's priority rank into 8 bits.
pub const MAX_CLASSES: usize = 255;
/// At most this many clusters in one instance.
pub const MAX_CLUSTERS: usize = 1 << 20;
/// At most this many resource nodes in one cluster's tree.
pub const MAX_TREE_NODES: usize = 1024;
/// The hard ceiling on [`Limits::max_candidates`]: a proposal pointer is one byte.
pub const MAX_CANDIDATES_CEILING: usize = 255;
/// The default limit on candidates per map unit.
pub const DEFAULT_MAX_CANDIDATES: usize = 64;

/// Configurable limits applied while building an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A map unit with more candidates than this is refused (at most [`MAX_CANDIDATES_CEILING`]).
    pub max_candidates: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_candidates: DEFAULT_MAX_CANDIDATES,
        }
    }
}

/// Index of a traffic class in [`Instance::classes`].
pub type ClassIdx = u16;
/// Index of a cluster in [`Instance::clusters`] (clusters are sorted by id).
pub type ClusterIdx = u32;
/// Index of a map unit (map units are sorted by id).
pub type UnitIdx = u32;

pub(super) fn check_number(
    subject: impl Fn() -> String,
    field: &'static str,
    value: f64,
) -> Result<(), ModelError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(ModelError::BadNumber {
            subject: subject(),
            field,
            value,
            rule: "must be a finite number >= 0",
        })
    }
}

pub(super) fn check_f32(
    subject: impl Fn() -> String,
    field: &'static str,
    value: f64,
) -> Result<f32, ModelError> {
    check_number(&subject, field, value)?;
    let narrow = value as f32;
    if narrow.is_finite() {
        // `+ 0.0` turns -0.0 into +0.0, so the bit pattern orders like the number.
        Ok(narrow + 0.0)
    } else {
        Err(ModelError::BadNumber {
            subject: subject(),
            field,
            value,
            rule: "must be at most 3.4e38",
        })
    }
}

pub(super) fn check_location(
    subject: impl Fn() -> String,
    lat: f64,
    lon: f64,
) -> Result<(), ModelError> {
    if !(lat.is_finite() && (-90.0..=90.0).contains(&lat)) {
        return Err(ModelError::BadNumber {
            subject: subject(),
            field: "lat",
            value: lat,
            rule: "must be a latitude in [-90, 90]",
        });
    }
    if !(lon.is_finite() && (-180.0..=180.0).contains(&lon)) {
        return Err(ModelError::BadNumber {
            subject: subject(),
            field: "lon",
            value: lon,
            rule: "must be a longitude in [-180, 180]",
        });
    }
    Ok(())
}

/// `Err(TooMany)` naming `subject` when `count` is over `limit`: how every validation of a
/// count says so (the topology's addressing too).
pub fn too_many(
    subject: impl FnOnce() -> String,
    what: &'static str,
    count: usize,
    limit: usize,
) -> Result<(), ModelError> {
    if count > limit {
        Err(ModelError::TooMany {
            subject: subject(),
            what,
            count,
            limit,
        })
    } else {
        Ok(())
    }
}
