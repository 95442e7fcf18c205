//! The `cdnmap` binary's global allocator: mimalloc (which keeps freed memory for reuse, where
//! the system allocator hands large blocks back to the kernel and every round pays its page
//! faults again), wrapped to count live heap bytes and their high-water mark, so benchmarks can
//! report real peak memory. Counting is switched on by the commands that report memory (the
//! benchmarks), before they allocate anything large; elsewhere (the servers) an allocation
//! costs one read of a flag more than mimalloc's, not two atomic writes to lines every thread
//! shares.

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc as System;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Counts bytes handed out by mimalloc.
pub struct Counting;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// How long mimalloc keeps freed memory before handing it back to the kernel: longer than a
/// mapping cycle (10–30 s), so each round reuses the pages the last one freed instead of
/// faulting fresh, zeroed ones in (at 1 M map units that was about a third of a sticky round);
/// an idle process still returns its memory after this.
pub const KEEP_FREED_MS: i64 = 60_000;

/// mimalloc's `mi_option_purge_delay` (its position in `mi_option_e`, `mimalloc.h`, just before
/// `mi_option_use_numa_nodes`, which the Rust binding names).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets how long freed memory is kept ([`KEEP_FREED_MS`]); the binary calls it first thing.
pub fn keep_freed_memory() {
    const _: () = assert!(libmimalloc_sys::mi_option_use_numa_nodes - 1 == MI_OPTION_PURGE_DELAY);
    // SAFETY: setting an option is a plain store in mimalloc, valid at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, KEEP_FREED_MS as _) };
}

/// Hands the freed memory mimalloc keeps back to the kernel now (`mi_collect(true)`): for the
/// points where gigabytes were freed that no round will reuse ([`cdnmap_api::memory`]).
pub fn release_freed() {
    // SAFETY: mi_collect takes no pointers; it may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Starts counting. Frees of blocks allocated before this are subtracted too, so call it before
/// the work being measured allocates (the counters saturate at 0 rather than wrap).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

#[inline]
fn grew(n: usize) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let live = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    if live > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(live, Ordering::Relaxed);
    }
}

#[inline]
fn shrank(n: usize) {
    if ENABLED.load(Ordering::Relaxed) {
        let _ = LIVE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
            Some(l.saturating_sub(n))
        });
    }
}

// SAFETY: every call forwards to mimalloc with the same arguments; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// Live heap bytes now (0 when the counting allocator is not installed).
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The largest live heap since the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new high-water mark from the live heap now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Whether the counting allocator is installed and counting (it has seen an allocation since
/// [`enable`]).
pub fn installed() -> bool {
    ENABLED.load(Ordering::Relaxed) && (live_bytes() > 0 || peak_bytes() > 0)
}
