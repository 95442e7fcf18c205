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
/// At most this many levels in one cluster's resource tree (the root is level 1). A real tree
/// has a few (an uplink, a CPU node, a leaf per class); the bound keeps every nested form of a
/// tree inside its readers' nesting limits, whatever reads it: serde_json stops at 128 levels
/// (two a tree level in an instance file, the journal's and the replicas' edits), prost at 100
/// (one a level in Admin's messages). A tree 62 levels deep was once acknowledged and then
/// unreadable in the journal.
pub const MAX_TREE_DEPTH: usize = 32;
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

/// The largest companion share of a traffic class (go with the winner): the companion is the
/// second cluster, not the first.
pub const MAX_COMPANION_SHARE: f64 = 0.5;

/// A traffic class's companion share: a number in [0, [`MAX_COMPANION_SHARE`]].
pub(super) fn check_companion_share(
    subject: impl Fn() -> String,
    value: f64,
) -> Result<(), ModelError> {
    if value.is_finite() && (0.0..=MAX_COMPANION_SHARE).contains(&value) {
        Ok(())
    } else {
        Err(ModelError::BadNumber {
            subject: subject(),
            field: "companion_share",
            value,
            rule: "must be a share in [0, 0.5]",
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

/// The most bytes an id (of a traffic class, cluster, resource node or map unit) may have.
pub const MAX_ID_BYTES: usize = 256;

/// The characters of an id an error shows (ids are cut there: an error never echoes an
/// unbounded input).
pub const SHOWN_ID_CHARS: usize = 64;

/// Checks an id: not empty, at most [`MAX_ID_BYTES`], no control character (NUL included)
/// and no bidirectional formatting character (which would make a log line or a dashboard
/// show text in another order than it is; Unicode TR 9's explicit formatting characters).
/// `context` is appended to the error (" in cluster \"x\"", ...).
pub fn check_id(
    what: &'static str,
    id: &str,
    context: impl FnOnce() -> String,
) -> Result<(), ModelError> {
    if id.is_empty() {
        return Err(ModelError::EmptyId {
            what,
            context: context(),
        });
    }
    // Most ids are short printable ASCII: one pass over the bytes.
    let printable_ascii = id.bytes().all(|b| (0x20..0x7f).contains(&b));
    let problem = if id.len() > MAX_ID_BYTES {
        Some(format!("{} bytes, at most {MAX_ID_BYTES}", id.len()))
    } else if printable_ascii {
        None
    } else {
        id.chars()
            .find(|&c| c.is_control() || is_bidi_control(c))
            .map(|c| {
                format!(
                    "character U+{:04X} (a control or bidirectional formatting character) is not allowed",
                    u32::from(c)
                )
            })
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(ModelError::BadId {
            what,
            shown: shown_id(id),
            context: context(),
            problem,
        }),
    }
}

/// `id` as an error shows it: escaped (`{:?}`), its first [`SHOWN_ID_CHARS`] characters and
/// its length when it is longer.
pub fn shown_id(id: &str) -> String {
    let count = id.chars().count();
    if count <= SHOWN_ID_CHARS {
        return format!("{id:?}");
    }
    let head: String = id.chars().take(SHOWN_ID_CHARS).collect();
    format!("{head:?}… ({} bytes)", id.len())
}

/// Unicode's bidirectional formatting characters (ALM, LRM, RLM, LRE, RLE, PDF, LRO, RLO,
/// LRI, RLI, FSI, PDI).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}
