//! The operator dashboard (issue 8): a page served by `cdnmap serve` next to `/metrics`, and the
//! JSON API behind it (`/api/...`, documented in `docs/dashboard.md`).
//!
//! - [`figures`] computes what the page shows from one published snapshot — per-cluster demand,
//!   node loads and utilization, the map units each cluster holds, demand flows from regions to
//!   clusters, the demand-weighted mean RTT, and a map unit's "why" — without I/O or a clock.
//! - [`http`] is the axum router: the embedded page (`api/assets/`), the read-only API, and the
//!   actions (drain / undrain / down), which need the Admin token and go through the same code
//!   path as the gRPC Admin `SetClusterState`.
//! - [`DashState`] (kept in the service's `Shared`) holds a bounded history of recent rounds, a
//!   bounded log of actions, and the figures of the current map version, computed once per
//!   version on first request.

mod app;
mod clusters;
pub mod http;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use cdnmap_mapper::ClusterState;
use serde::Serialize;

use cdnmap_engine::figures;
use cdnmap_engine::round::Snapshot;

pub(crate) use app::ApiError;
pub(crate) use clusters::authorize;
pub use http::router;

/// Rounds kept in the history the charts show (an hour at the default 10 s cycle).
pub const MAX_HISTORY_ROUNDS: usize = 360;
/// Actions kept in the event log (memory only; every action is also in the service's log).
pub const MAX_EVENTS: usize = 1_000;
/// The longest operator name kept from an `X-Operator` header (longer ones are cut).
pub const MAX_OPERATOR_LEN: usize = 64;
/// The longest reason kept with an action (longer ones are cut).
pub const MAX_REASON_LEN: usize = 200;

/// One published round, as the charts show it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RoundPoint {
    pub version: u64,
    pub at_unix_ms: i64,
    /// Wall time of the whole round (estimates, solve, index), ms.
    pub solve_ms: f64,
    /// Share of demand whose cluster changed (`null` for the first round after a start).
    pub churn: Option<f64>,
    pub demand: f64,
    pub overflow: f64,
    pub overflow_share: f64,
    /// Demand-weighted mean score (RTT estimate, ms) of the placed demand; `null` if none.
    pub mean_rtt_ms: Option<f64>,
    pub proposals: u64,
    pub repair_rounds: u32,
}

/// Who did an action: the operator's name (the page's `X-Operator` header, or gRPC metadata
/// `x-operator`), the remote address, and the interface.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Actor {
    pub who: String,
    pub remote: String,
    pub via: &'static str,
}

/// Keeps printable characters of an operator-supplied string, at most `max` of them.
pub fn clean(text: &str, max: usize) -> String {
    text.chars()
        .filter(|c| !c.is_control())
        .take(max)
        .collect::<String>()
        .trim()
        .to_string()
}

impl Actor {
    pub fn new(who: Option<&str>, remote: Option<SocketAddr>, via: &'static str) -> Actor {
        let who = who
            .map(|w| clean(w, MAX_OPERATOR_LEN))
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| "anonymous".into());
        Actor {
            who,
            remote: remote.map_or_else(|| "unknown".into(), |a| a.to_string()),
            via,
        }
    }

    /// The caller of a gRPC Admin request.
    pub fn of_grpc<T>(request: &tonic::Request<T>) -> Actor {
        let who = request
            .metadata()
            .get("x-operator")
            .and_then(|v| v.to_str().ok());
        Actor::new(
            who,
            crate::listen::peer_of(request).map(|p| p.remote),
            "grpc",
        )
    }
}

/// One entry of the action log.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    /// Increases by one per action since the server started.
    pub seq: u64,
    pub at_unix_ms: i64,
    pub who: String,
    pub remote: String,
    pub via: &'static str,
    pub action: &'static str,
    pub cluster: String,
    /// The state before (`null` if the action failed before reading it).
    pub from_state: Option<ClusterState>,
    pub to_state: ClusterState,
    pub reason: String,
    pub ok: bool,
    pub error: Option<String>,
}

/// The name of the action that sets `state`.
pub fn action_name(state: ClusterState) -> &'static str {
    match state {
        ClusterState::Up => "undrain",
        ClusterState::Drained => "drain",
        ClusterState::Down => "mark_down",
    }
}

#[derive(Debug, Default)]
struct EventLog {
    next_seq: u64,
    events: VecDeque<Event>,
}

/// The dashboard's part of the service state.
#[derive(Debug, Default)]
pub struct DashState {
    history: Mutex<VecDeque<RoundPoint>>,
    events: Mutex<EventLog>,
    /// The figures of the newest version asked for.
    view: Mutex<Option<Arc<figures::View>>>,
}

impl DashState {
    /// Adds a published round to the history (dropping the oldest beyond
    /// [`MAX_HISTORY_ROUNDS`]).
    pub fn record_round(&self, s: &Snapshot, solve_ms: f64) {
        let demand = s.topology.total_demand();
        let overflow = s.map.total_overflow();
        let point = RoundPoint {
            version: s.version,
            at_unix_ms: s.solved_at_unix_ms,
            solve_ms,
            churn: s.churn,
            demand,
            overflow,
            overflow_share: if demand > 0.0 { overflow / demand } else { 0.0 },
            mean_rtt_ms: figures::mean_score(&s.topology, &s.map, &s.measured),
            proposals: s.stats.proposals,
            repair_rounds: s.stats.repair_rounds,
        };
        if let Ok(mut h) = self.history.lock() {
            if h.len() >= MAX_HISTORY_ROUNDS {
                h.pop_front();
            }
            h.push_back(point);
        }
    }

    /// The last `limit` rounds, oldest first.
    pub fn history(&self, limit: usize) -> Vec<RoundPoint> {
        self.history.lock().map_or_else(
            |_| Vec::new(),
            |h| {
                h.iter()
                    .skip(h.len().saturating_sub(limit))
                    .cloned()
                    .collect()
            },
        )
    }

    /// Logs an action and its outcome (the state before, or why it was refused), dropping the
    /// oldest beyond [`MAX_EVENTS`].
    pub fn log_action(
        &self,
        actor: &Actor,
        cluster: &str,
        state: ClusterState,
        reason: &str,
        result: Result<Option<ClusterState>, String>,
        now_unix_ms: i64,
    ) {
        let Ok(mut log) = self.events.lock() else {
            return;
        };
        log.next_seq += 1;
        let event = Event {
            seq: log.next_seq,
            at_unix_ms: now_unix_ms,
            who: actor.who.clone(),
            remote: actor.remote.clone(),
            via: actor.via,
            action: action_name(state),
            cluster: clean(cluster, MAX_OPERATOR_LEN),
            from_state: result.as_ref().ok().copied().flatten(),
            to_state: state,
            reason: clean(reason, MAX_REASON_LEN),
            ok: result.is_ok(),
            error: result.err(),
        };
        if log.events.len() >= MAX_EVENTS {
            log.events.pop_front();
        }
        log.events.push_back(event);
    }

    /// Logs what the health checks did to a cluster the operator has up: took it down
    /// (`down`, with the reason) or let it back. Who: "health checks", through "health".
    pub fn log_health(&self, cluster: &str, down: bool, reason: &str, now_unix_ms: i64) {
        let Ok(mut log) = self.events.lock() else {
            return;
        };
        log.next_seq += 1;
        let (from, to) = if down {
            (ClusterState::Up, ClusterState::Down)
        } else {
            (ClusterState::Down, ClusterState::Up)
        };
        let event = Event {
            seq: log.next_seq,
            at_unix_ms: now_unix_ms,
            who: "health checks".into(),
            remote: "local".into(),
            via: "health",
            action: if down { "health_down" } else { "health_up" },
            cluster: clean(cluster, MAX_OPERATOR_LEN),
            from_state: Some(from),
            to_state: to,
            reason: clean(reason, MAX_REASON_LEN),
            ok: true,
            error: None,
        };
        if log.events.len() >= MAX_EVENTS {
            log.events.pop_front();
        }
        log.events.push_back(event);
    }

    /// The last `limit` events, newest first.
    pub fn events(&self, limit: usize) -> Vec<Event> {
        self.events.lock().map_or_else(
            |_| Vec::new(),
            |l| l.events.iter().rev().take(limit).cloned().collect(),
        )
    }

    /// The figures of `snapshot`, computed once per version.
    pub fn view(&self, snapshot: &Snapshot) -> Arc<figures::View> {
        if let Ok(v) = self.view.lock() {
            if let Some(v) = v.as_ref().filter(|v| v.version == snapshot.version) {
                return Arc::clone(v);
            }
        }
        let view = Arc::new(figures::View::new(snapshot));
        if let Ok(mut v) = self.view.lock() {
            // Keep the newest version (two requests may compute concurrently).
            if v.as_ref().is_none_or(|old| old.version <= view.version) {
                *v = Some(Arc::clone(&view));
            }
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor() -> Actor {
        Actor::new(Some("ana\u{7}\n "), None, "http")
    }

    #[test]
    fn operator_names_are_cleaned_and_bounded() {
        assert_eq!(actor().who, "ana");
        assert_eq!(Actor::new(Some("  "), None, "http").who, "anonymous");
        let long = "x".repeat(MAX_OPERATOR_LEN * 2);
        assert_eq!(
            Actor::new(Some(&long), None, "http").who.len(),
            MAX_OPERATOR_LEN
        );
    }

    #[test]
    fn the_event_log_is_bounded_and_newest_first() {
        let d = DashState::default();
        let failed = || Err("no cluster \"nope\"".to_string());
        for i in 0..MAX_EVENTS + 5 {
            d.log_action(
                &actor(),
                "nope",
                ClusterState::Drained,
                "",
                failed(),
                i as i64,
            );
        }
        let all = d.events(usize::MAX);
        assert_eq!(all.len(), MAX_EVENTS);
        assert_eq!(all[0].seq, (MAX_EVENTS + 5) as u64);
        assert_eq!(all[0].at_unix_ms, (MAX_EVENTS + 4) as i64);
        assert!(!all[0].ok);
        assert_eq!(all[0].error.as_deref(), Some("no cluster \"nope\""));
        assert_eq!(all[0].action, "drain");
        assert_eq!(d.events(3).len(), 3);
    }
}
