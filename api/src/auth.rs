//! The Admin token's check, one for gRPC Admin, the dashboard's actions and `/record`, with
//! failures watched: each is counted (`cdnmap_admin_auth_failures_total{listener}`) and logged
//! (at most one line every [`LOG_EVERY`], saying how many it passed over), and a source (its
//! address; IPv6: its /64, `listen::source_of`) that fails [`MAX_FAILURES`] times within
//! [`FAILURE_WINDOW`] is refused, its token not looked at, until the window ends
//! (`cdnmap_admin_auth_refused_total{listener}`; gRPC RESOURCE_EXHAUSTED, HTTP 429). A right
//! token forgets a source's failures. The table of sources is bounded ([`MAX_SOURCES`]); its
//! core, [`Failures`], is pure (time is an argument). Also the token checks every listener
//! shares: `bearer_token` (an `Authorization` header's token) and `constant_time_eq`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::throttle::LogThrottle;

/// Failed authentications a source may make within [`FAILURE_WINDOW`]...
pub const MAX_FAILURES: u32 = 10;
/// ...counted from its first failure; then it is refused until the window ends.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Sources whose failures are remembered at once; past it, those whose window ended are
/// forgotten first, then the one whose window began first.
pub const MAX_SOURCES: usize = 4096;
/// At most one log line of failures, and one of refused sources, this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The token of an `Authorization` header's value in the Bearer scheme (RFC 6750 §2.1), the
/// scheme's name in any case (RFC 7235 §2.1: auth-schemes are case-insensitive) and one or
/// more spaces after it; `None` for another scheme.
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only (how long a
/// comparison takes says nothing of how close a wrong token came).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One source's failures in its current window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    start_ms: u64,
    failures: u32,
}

/// Failed authentications by source, within their windows.
#[derive(Debug, Default)]
pub struct Failures {
    by_source: HashMap<Option<IpAddr>, Window>,
}

impl Failures {
    fn window_ms() -> u64 {
        FAILURE_WINDOW.as_millis() as u64
    }

    /// Whether `source` may try at `now_ms`: `Err(how long until it may)` when it failed
    /// [`MAX_FAILURES`] times in its current window.
    pub fn check(&self, source: Option<IpAddr>, now_ms: u64) -> Result<(), Duration> {
        match self.by_source.get(&source) {
            Some(w) if w.failures >= MAX_FAILURES => {
                let ends = w.start_ms + Self::window_ms();
                if now_ms < ends {
                    Err(Duration::from_millis(ends - now_ms))
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// A failure of `source` at `now_ms`: the failures of its window so far, this one in.
    pub fn failed(&mut self, source: Option<IpAddr>, now_ms: u64) -> u32 {
        if !self.by_source.contains_key(&source) && self.by_source.len() >= MAX_SOURCES {
            self.make_room(now_ms);
        }
        let w = self.by_source.entry(source).or_insert(Window {
            start_ms: now_ms,
            failures: 0,
        });
        if now_ms.saturating_sub(w.start_ms) >= Self::window_ms() {
            *w = Window {
                start_ms: now_ms,
                failures: 0,
            };
        }
        w.failures = w.failures.saturating_add(1);
        w.failures
    }

    /// `source` gave the right token: its failures are forgotten.
    pub fn succeeded(&mut self, source: Option<IpAddr>) {
        self.by_source.remove(&source);
    }

    /// Forgets the sources whose window ended at `now_ms`, or else the one whose began first.
    fn make_room(&mut self, now_ms: u64) {
        let window = Self::window_ms();
        self.by_source
            .retain(|_, w| now_ms.saturating_sub(w.start_ms) < window);
        if self.by_source.len() >= MAX_SOURCES {
            let oldest = self
                .by_source
                .iter()
                .min_by_key(|(_, w)| w.start_ms)
                .map(|(s, _)| *s);
            if let Some(s) = oldest {
                self.by_source.remove(&s);
            }
        }
    }

    /// Sources remembered.
    pub fn sources(&self) -> usize {
        self.by_source.len()
    }
}

/// Why a request did not pass the Admin token's check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// The server has no `admin_token`: nothing passes (not counted as a failure).
    Disabled,
    /// No `Bearer` token given.
    Missing,
    /// A token that is not the Admin token.
    Wrong,
    /// The source failed too often: refused, its token not looked at, for this long yet.
    TooMany { retry_after: Duration },
}

/// The Admin token and the failures of those who tried it.
#[derive(Debug)]
pub struct AdminGate {
    token: Option<Arc<str>>,
    failures: Mutex<Failures>,
    failures_logged: LogThrottle,
    refusals_logged: LogThrottle,
}

impl AdminGate {
    pub fn new(token: Option<Arc<str>>) -> AdminGate {
        AdminGate {
            token,
            failures: Mutex::default(),
            failures_logged: LogThrottle::new(LOG_EVERY),
            refusals_logged: LogThrottle::new(LOG_EVERY),
        }
    }

    /// Whether an Admin token is configured (without one, Admin and actions are refused).
    pub fn enabled(&self) -> bool {
        self.token.is_some()
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, Failures> {
        // Nothing under the lock can leave `Failures` half changed.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks `authorization` (the header's value) of a request from `remote` on `listener`
    /// ("grpc", "http") for `what` (named in the log), now.
    pub fn check(
        &self,
        authorization: Option<&str>,
        remote: Option<IpAddr>,
        listener: &'static str,
        what: &str,
    ) -> Result<(), Denied> {
        self.check_at(
            authorization,
            remote,
            listener,
            what,
            crate::throttle::now_ms(),
        )
    }

    /// [`AdminGate::check`] at `now_ms`.
    pub fn check_at(
        &self,
        authorization: Option<&str>,
        remote: Option<IpAddr>,
        listener: &'static str,
        what: &str,
        now_ms: u64,
    ) -> Result<(), Denied> {
        let Some(token) = &self.token else {
            return Err(Denied::Disabled);
        };
        let source = remote.map(crate::listen::source_of);
        if let Err(retry_after) = self.failures().check(source, now_ms) {
            metrics::counter!("cdnmap_admin_auth_refused_total", "listener" => listener)
                .increment(1);
            if let Some(passed) = self.refusals_logged.allow(now_ms) {
                tracing::warn!(
                    ?remote,
                    listener,
                    what,
                    ?retry_after,
                    others_since = passed,
                    "a source past its failed Admin authentications refused"
                );
            }
            return Err(Denied::TooMany { retry_after });
        }
        let given = authorization.and_then(bearer_token);
        let denied = match given {
            Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => {
                self.failures().succeeded(source);
                return Ok(());
            }
            Some(_) => Denied::Wrong,
            None => Denied::Missing,
        };
        let failures = self.failures().failed(source, now_ms);
        metrics::counter!("cdnmap_admin_auth_failures_total", "listener" => listener).increment(1);
        if let Some(passed) = self.failures_logged.allow(now_ms) {
            let why = if denied == Denied::Wrong {
                "wrong token"
            } else {
                "no Bearer token"
            };
            tracing::warn!(
                ?remote,
                listener,
                what,
                why,
                failures_in_window = failures,
                others_since = passed,
                "Admin authentication failed"
            );
        }
        Err(denied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().expect("an address"))
    }

    /// A source's failures, its refusal and the window's end, as a timeline.
    #[test]
    fn a_source_is_refused_after_its_failures_until_its_window_ends() {
        let mut f = Failures::default();
        let (a, b) = (ip("192.0.2.1"), ip("192.0.2.2"));
        for i in 1..=MAX_FAILURES {
            assert_eq!(f.check(a, 1_000), Ok(()), "failure {i}");
            assert_eq!(f.failed(a, 1_000), i);
        }
        assert_eq!(f.check(a, 2_000), Err(Duration::from_millis(59_000)));
        assert_eq!(f.check(b, 2_000), Ok(()), "another source is not refused");
        assert_eq!(f.check(a, 60_999), Err(Duration::from_millis(1)));
        assert_eq!(f.check(a, 61_000), Ok(()), "the window ended");
        // A failure after the window starts a new one.
        assert_eq!(f.failed(a, 61_000), 1);
        assert_eq!(f.check(a, 61_001), Ok(()));
        // A right token forgets the source's failures.
        for i in 0..MAX_FAILURES - 2 {
            f.failed(b, 3_000 + u64::from(i));
        }
        f.succeeded(b);
        assert_eq!(f.failed(b, 4_000), 1);
    }

    #[test]
    fn the_table_holds_at_most_max_sources_forgetting_ended_windows_first() {
        let mut f = Failures::default();
        for i in 0..MAX_SOURCES as u32 {
            let source = Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
            f.failed(source, u64::from(i));
        }
        assert_eq!(f.sources(), MAX_SOURCES);
        // Full, all windows open: the oldest goes.
        f.failed(ip("192.0.2.9"), 10_000);
        assert_eq!(f.sources(), MAX_SOURCES);
        assert!(!f.by_source.contains_key(&ip("10.0.0.0")));
        // Later, every window but the newest ended: they all go.
        f.failed(ip("192.0.2.10"), 60_000 + MAX_SOURCES as u64);
        assert_eq!(f.sources(), 2, "the newest two");
    }

    #[test]
    fn the_gate_counts_failures_by_source_and_lets_the_right_token_through() {
        let gate = AdminGate::new(Some(Arc::from("the-admin-token")));
        let (a, b) = (ip("192.0.2.1"), ip("2001:db8::1"));
        let check =
            |auth: Option<&str>, remote, now| gate.check_at(auth, remote, "grpc", "test", now);
        assert_eq!(check(None, a, 0), Err(Denied::Missing));
        assert_eq!(
            check(Some("Basic the-admin-token"), a, 1),
            Err(Denied::Missing)
        );
        for t in 2..u64::from(MAX_FAILURES) {
            assert_eq!(check(Some("Bearer nope"), a, t), Err(Denied::Wrong));
        }
        assert_eq!(
            check(Some("Bearer the-admin-token"), a, 20),
            Err(Denied::TooMany {
                retry_after: Duration::from_millis(59_980)
            }),
            "the right token too, once refused"
        );
        assert_eq!(check(Some("Bearer the-admin-token"), b, 20), Ok(()));
        // Another address in b's /64 is the same source.
        assert_eq!(
            check(Some("Bearer x"), ip("2001:db8::2"), 21),
            Err(Denied::Wrong)
        );
        assert_eq!(check(Some("Bearer the-admin-token"), a, 60_000), Ok(()));
        let disabled = AdminGate::new(None);
        assert_eq!(
            disabled.check_at(Some("Bearer x"), a, "grpc", "test", 0),
            Err(Denied::Disabled)
        );
    }

    /// RFC 7235 §2.1: the scheme is case-insensitive and one or more spaces follow it; another
    /// scheme, or none, gives no token.
    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for (value, token) in [
            ("Bearer s3cret", Some("s3cret")),
            ("bearer s3cret", Some("s3cret")),
            ("BEARER s3cret", Some("s3cret")),
            ("bEaReR   s3cret", Some("s3cret")),
            ("Bearer ", Some("")),
            ("Basic s3cret", None),
            ("Bearers3cret", None),
            ("Bearer", None),
            ("", None),
        ] {
            assert_eq!(bearer_token(value), token, "{value:?}");
        }
    }
}
