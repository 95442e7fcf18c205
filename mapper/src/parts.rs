//! Work split into consecutive ranges, each but the first on its own scoped thread, with the
//! results joined in range order. How many parts is a fixed function of the amount of work, not
//! of the machine, so anything assembled from the parts is the same everywhere.

use std::ops::Range;

/// Below this many items, a second thread costs more than it saves.
pub(crate) const PARALLEL_ITEMS: usize = 1 << 16;

/// The number of parts `n` items are split into: two from `min` on (the deployments cdnmap
/// targets have at least two cores), else one. `min`: [`PARALLEL_ITEMS`] for light work per
/// item, less for heavier.
pub(crate) fn parts_for(n: usize, min: usize) -> usize {
    if n >= min {
        2
    } else {
        1
    }
}

/// The bounds of `parts` consecutive ranges covering `0..n` (as even as integer division
/// makes them); at least one range, and none empty unless `n` is 0.
pub(crate) fn bounds(n: usize, parts: usize) -> Vec<usize> {
    let parts = parts.clamp(1, n.max(1));
    (0..=parts).map(|k| n * k / parts).collect()
}

/// `f` on each range of [`bounds`]`(n, parts)`, as [`run_parts`] runs them.
pub(crate) fn in_parts<T: Send>(
    n: usize,
    parts: usize,
    f: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    let ranges = bounds(n, parts).windows(2).map(|w| w[0]..w[1]).collect();
    run_parts(ranges, f)
}

/// `f` on each input (a part's range, or the slices it may write), the first on this thread
/// and each other on its own scoped thread; the results in input order. A panic in a part is
/// resumed here.
pub(crate) fn run_parts<I: Send, T: Send>(inputs: Vec<I>, f: impl Fn(I) -> T + Sync) -> Vec<T> {
    let f = &f;
    let mut inputs = inputs.into_iter();
    let Some(first) = inputs.next() else {
        return Vec::new();
    };
    std::thread::scope(|scope| {
        let others: Vec<_> = inputs.map(|i| scope.spawn(move || f(i))).collect();
        let mut done = vec![f(first)];
        done.extend(others.into_iter().map(|h| {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        }));
        done
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_cover_the_range_in_order() {
        for n in [0, 1, 2, 7, 100] {
            for parts in [1, 2, 3, 7, 200] {
                let got: Vec<usize> = in_parts(n, parts, |r| r.collect::<Vec<_>>()).concat();
                assert_eq!(got, (0..n).collect::<Vec<_>>(), "n {n} parts {parts}");
                let b = bounds(n, parts);
                assert!(b.windows(2).all(|w| w[0] < w[1] || n == 0), "{b:?}");
            }
        }
    }

    #[test]
    fn a_panic_in_a_part_reaches_the_caller() {
        let caught = std::panic::catch_unwind(|| {
            in_parts(10, 2, |r| assert!(r.start == 0, "second part fails"));
        });
        assert!(caught.is_err());
    }
}
