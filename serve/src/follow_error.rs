//! Why a front end could not apply a WatchMap update ([`FollowError`]): what the follower
//! ([`crate::watch`]) and the columns of a full map ([`crate::columns`]) both refuse with.

use crate::serving::ServeError;

/// Why an update could not be applied (the copy is then unchanged; the stream is restarted
/// with a full map).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FollowError {
    #[error("a delta against version {base:?} (epoch, version) arrived while holding {held:?}")]
    Gap { base: (u64, u64), held: (u64, u64) },
    #[error(
        "part of a full map of {got:?} (epoch, version) arrived while {building:?} was coming"
    )]
    Parts {
        got: (u64, u64),
        building: Option<(u64, u64)>,
    },
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    #[error(transparent)]
    Map(#[from] ServeError),
}

/// [`FollowError::Invalid`]: `field` of the update, and what is wrong with it.
pub(crate) fn invalid(field: impl Into<String>, problem: impl Into<String>) -> FollowError {
    FollowError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}
