//! Log lines an outsider can cause, throttled: at most one a period, the next one saying how
//! many were passed over. Pure (time is an argument); [`now_ms`] is the clock callers pass.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Milliseconds on a monotonic clock that starts with the process.
pub fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// At most one line every `every`.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    /// When a line was last allowed, and the lines passed over since.
    state: Mutex<(Option<u64>, u64)>,
}

impl LogThrottle {
    pub const fn new(every: Duration) -> LogThrottle {
        LogThrottle {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// Whether a line may be logged at `now_ms`: `Some(passed over since the last one)`, or
    /// `None` (counted, to be said with the next line allowed).
    pub fn allow(&self, now_ms: u64) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (last, passed) = &mut *state;
        let due = last.is_none_or(|l| now_ms.saturating_sub(l) >= self.every.as_millis() as u64);
        if due {
            *last = Some(now_ms);
            Some(std::mem::take(passed))
        } else {
            *passed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_period_and_then_how_many_were_passed_over() {
        let t = LogThrottle::new(Duration::from_secs(10));
        assert_eq!(t.allow(5_000), Some(0));
        assert_eq!(t.allow(5_001), None);
        assert_eq!(t.allow(14_999), None);
        assert_eq!(t.allow(15_000), Some(2));
        assert_eq!(t.allow(15_000), None);
        assert_eq!(t.allow(40_000), Some(1));
        // A clock that went back counts as no time at all.
        assert_eq!(t.allow(1_000), None);
    }
}
