//! The cache hint the solver, the model's candidate accessors and the resolver share: a leaf
//! module (it imports nothing of the crate), so that none of them imports another for it.
//!
//! Promise: a prefetch is a hint with no effect on any result; out-of-range indices are ignored.

/// Asks the CPU to start loading `slice[i]` into cache; a hint with no other effect.
#[inline(always)]
pub fn prefetch<T>(slice: &[T], i: usize) {
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

/// Asks the CPU to start loading every cache line `r` spans (a struct of more than one line,
/// or one that straddles two: [`prefetch`] loads only the line its first byte is on); a hint
/// with no other effect.
#[inline(always)]
pub fn prefetch_whole<T>(r: &T) {
    const LINE: usize = 64;
    let first = (r as *const T).cast::<u8>();
    let last = (first as usize + std::mem::size_of::<T>().max(1) - 1) & !(LINE - 1);
    let mut line = first as usize & !(LINE - 1);
    while line <= last {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch has no architectural effect, and never faults, whatever the
        // address; these are the lines of a live value in any case.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line as *const i8)
        }
        line += LINE;
    }
}
