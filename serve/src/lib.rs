//! What answering a query needs, on both sides of WatchMap: the resolver over one published
//! map version (prefix tables, hostname class rules, the split of a unit over its clusters,
//! the fallback) and the in-cluster server selection over it. The mapper's `Resolve` and the
//! DNS front end both answer through this crate, so they answer alike by construction.
//!
//! No I/O, no async, no clock reads: a resolver is built once per map version and then only
//! read.

pub mod resolve;
pub mod servers;
pub mod serving;
pub mod watch;

pub use serving::{ServeError, ServingCluster, ServingMap};

/// Asks the CPU to start loading `slice[i]` into the cache (no effect if `i` is out of range,
/// or off x86_64): the batch resolver starts the reads of several queries before it needs any.
#[inline(always)]
pub(crate) fn prefetch<T>(slice: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = slice.get(i) {
        // SAFETY: a prefetch has no architectural effect; the address is that of a live
        // element in any case. SSE (which provides it) is part of the x86_64 baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (r as *const T).cast::<i8>(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, i);
}
