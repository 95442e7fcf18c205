//! What one source of feedback may send, and how much one sample may claim: so that no single
//! front end (or forger) can move the map beyond what it could plausibly see.
//!
//! - **Budgets.** Each source (its identity, or its address when the service takes reports
//!   from anyone) has a token bucket of samples, refilled at `feedback_samples_per_sec` and
//!   holding [`BURST_SECS`] of it (a front end sends a period's counts at once), and one of
//!   bytes, [`BYTES_PER_SAMPLE`] a sample. A report past either is refused whole
//!   (RESOURCE_EXHAUSTED: the front end keeps its counts for the next period). At most
//!   [`MAX_SOURCES`] buckets are held; a full bucket is the same as none, so those go first.
//! - **Bounds relative to demand.** A demand sample, brought to one cycle, may claim at most
//!   `feedback_max_demand_ratio` times its map unit's demand in the last round, or of its
//!   class's mean unit demand when that is more (a unit rarely asked for may still grow); more
//!   is clipped to the bound and counted (`cdnmap_feedback_clipped_total`).
//!
//! Time comes in as an argument (seconds on a monotonic clock), so the arithmetic is tested
//! without waiting.

use std::collections::HashMap;
use std::sync::Mutex;

/// Seconds of the rate a bucket holds.
pub const BURST_SECS: f64 = 30.0;
/// Bytes of a report's encoding a sample may take on average (an id is at most 256 bytes).
pub const BYTES_PER_SAMPLE: f64 = 256.0;
/// Most sources with a bucket at once.
pub const MAX_SOURCES: usize = 10_000;

/// One source's token bucket of samples and of bytes.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    samples: f64,
    bytes: f64,
    at: f64,
}

/// Why a report was refused by its source's budget.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The source has spent its budget; it refills in `retry_secs`.
    Spent { retry_secs: f64 },
    /// A report larger than a whole bucket: it can never pass, at any wait.
    TooLarge,
    /// [`MAX_SOURCES`] sources are spending budgets at once.
    TooManySources,
}

/// The sources' budgets.
#[derive(Debug)]
pub struct Budgets {
    samples_per_sec: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Budgets {
    pub fn new(samples_per_sec: f64) -> Budgets {
        Budgets {
            samples_per_sec,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn capacity(&self) -> (f64, f64) {
        let samples = self.samples_per_sec * BURST_SECS;
        (samples, samples * BYTES_PER_SAMPLE)
    }

    /// Takes `samples` and `bytes` from `source`'s budget at time `now` (seconds), or says
    /// why not (and takes nothing).
    pub fn take(&self, source: &str, samples: f64, bytes: f64, now: f64) -> Result<(), Refusal> {
        let (cap_samples, cap_bytes) = self.capacity();
        if samples > cap_samples || bytes > cap_bytes {
            return Err(Refusal::TooLarge);
        }
        let rate = self.samples_per_sec;
        let refill = |b: &mut Bucket| {
            let dt = (now - b.at).max(0.0);
            b.samples = (b.samples + dt * rate).min(cap_samples);
            b.bytes = (b.bytes + dt * rate * BYTES_PER_SAMPLE).min(cap_bytes);
            b.at = now;
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(source) && buckets.len() >= MAX_SOURCES {
            // A bucket refilled to the brim is no different from no bucket.
            buckets.retain(|_, b| {
                refill(b);
                b.samples < cap_samples || b.bytes < cap_bytes
            });
            if buckets.len() >= MAX_SOURCES {
                return Err(Refusal::TooManySources);
            }
        }
        let bucket = buckets.entry(source.to_string()).or_insert(Bucket {
            samples: cap_samples,
            bytes: cap_bytes,
            at: now,
        });
        refill(bucket);
        if bucket.samples < samples || bucket.bytes < bytes {
            let short = ((samples - bucket.samples) / rate)
                .max((bytes - bucket.bytes) / (rate * BYTES_PER_SAMPLE))
                .max(0.0);
            return Err(Refusal::Spent { retry_secs: short });
        }
        bucket.samples -= samples;
        bucket.bytes -= bytes;
        Ok(())
    }
}

/// The most a demand sample of a unit may claim, per cycle: `ratio` times the unit's demand
/// in the last round, or its class's mean unit demand when that is more.
pub fn demand_bound(ratio: f64, unit_demand: f64, class_mean: f64) -> f64 {
    ratio * unit_demand.max(class_mean)
}

/// The mean unit demand of each class of `instance`, by class index.
pub fn class_means(instance: &cdnmap_mapper::Instance) -> Vec<f64> {
    let classes = instance.classes().len();
    let mut sum = vec![0.0f64; classes];
    let mut count = vec![0u64; classes];
    for u in 0..instance.unit_count() as u32 {
        let k = usize::from(instance.unit_class(u));
        sum[k] += instance.unit_demand(u);
        count[k] += 1;
    }
    sum.iter()
        .zip(&count)
        .map(|(s, &n)| if n == 0 { 0.0 } else { s / n as f64 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_holds_its_burst_and_refills_at_its_rate() {
        let b = Budgets::new(100.0); // 3,000 samples a bucket
        assert_eq!(b.take("fe", 3000.0, 0.0, 0.0), Ok(()));
        match b.take("fe", 100.0, 0.0, 0.0) {
            Err(Refusal::Spent { retry_secs }) => assert!((retry_secs - 1.0).abs() < 1e-9),
            other => panic!("{other:?}"),
        }
        // A refused report takes nothing: after one second, exactly 100 are back.
        assert_eq!(b.take("fe", 100.0, 0.0, 1.0), Ok(()));
        assert!(b.take("fe", 1.0, 0.0, 1.0).is_err());
        // Another source has its own bucket.
        assert_eq!(b.take("other", 3000.0, 0.0, 1.0), Ok(()));
        // Refilled, never past the brim.
        assert_eq!(b.take("fe", 3000.0, 0.0, 1000.0), Ok(()));
        assert!(b.take("fe", 1.0, 0.0, 1000.0).is_err());
        // Larger than a bucket: never.
        assert_eq!(b.take("new", 3001.0, 0.0, 0.0), Err(Refusal::TooLarge));
        // Bytes are a budget too.
        let cap_bytes = 3000.0 * BYTES_PER_SAMPLE;
        assert_eq!(b.take("bytes", 1.0, cap_bytes, 0.0), Ok(()));
        assert!(matches!(
            b.take("bytes", 1.0, 1.0, 0.0),
            Err(Refusal::Spent { .. })
        ));
    }

    #[test]
    fn sources_are_bounded_and_full_buckets_make_room() {
        let b = Budgets::new(1.0);
        for i in 0..MAX_SOURCES {
            assert_eq!(b.take(&format!("s{i}"), 1.0, 0.0, 0.0), Ok(()));
        }
        assert_eq!(
            b.take("one-more", 1.0, 0.0, 0.0),
            Err(Refusal::TooManySources)
        );
        // Once the others have refilled, their buckets go and the newcomer gets one.
        assert_eq!(b.take("one-more", 1.0, 0.0, 10.0), Ok(()));
    }

    #[test]
    fn the_demand_bound_follows_the_unit_or_its_class() {
        assert_eq!(demand_bound(10.0, 50.0, 2.0), 500.0);
        assert_eq!(demand_bound(10.0, 0.0, 2.0), 20.0);
    }
}
