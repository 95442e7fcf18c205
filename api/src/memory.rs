//! Handing freed memory back to the kernel at the two points where a start has just freed
//! gigabytes that no round reuses soon: after the stored topology is decoded and its map
//! served (the decoded file's columns, about 3 GB at 11 M map units), and after the
//! estimator's checkpoint is replayed. The binary's allocator keeps freed memory for a minute
//! (so that each round reuses the last one's pages); left to that, a restarted mapper held
//! about 3 GB more than one started afresh, for good.
//!
//! The allocator is the binary's choice, so the binary says how ([`on_release`]); without it
//! (the tests, a library user) [`release`] does nothing.

use std::sync::OnceLock;

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Sets how freed memory is handed back (once; later calls are ignored).
pub fn on_release(release: fn()) {
    let _ = RELEASE.set(release);
}

/// Hands freed memory back, if the binary said how.
pub fn release() {
    if let Some(release) = RELEASE.get() {
        release();
    }
}
