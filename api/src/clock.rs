//! The wall clock, read here and nowhere else in the service: Unix milliseconds for what the
//! service stamps (a start's epoch floor, a round's time, a report's arrival, a journal
//! entry, an action in the log). The crates below the service (engine, store, mapper,
//! estimator) take every time as an argument.

use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock now, in Unix milliseconds (0 for a clock set before 1970).
pub fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
