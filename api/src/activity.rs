//! What the service keeps of its recent past, for its readers (the dashboard's charts and
//! event list): a bounded history of the rounds published ([`RoundPoint`], written by the
//! loop) and a bounded log of the actions on clusters ([`Event`], written by the topology
//! writer's log callback, in the order the changes were made, and by the health checks).
//! Memory only: every action is in the service's log too.

use std::collections::VecDeque;
use std::sync::Mutex;

use cdnmap_engine::figures;
use cdnmap_engine::round::Snapshot;
use cdnmap_mapper::ClusterState;
use serde::Serialize;

use crate::topology::{clean, Actor, MAX_OPERATOR_LEN, MAX_REASON_LEN};

/// Rounds kept in the history the charts show (an hour at the default 10 s cycle).
pub const MAX_HISTORY_ROUNDS: usize = 360;
/// Actions kept in the event log (memory only; every action is also in the service's log).
pub const MAX_EVENTS: usize = 1_000;

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

/// The service's recent past: the rounds published and the actions on clusters, each bounded.
#[derive(Debug, Default)]
pub struct Activity {
    history: Mutex<VecDeque<RoundPoint>>,
    events: Mutex<EventLog>,
}

impl Activity {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor() -> Actor {
        Actor::new(Some("ana\u{7}\n "), None, "http")
    }

    #[test]
    fn the_event_log_is_bounded_and_newest_first() {
        let d = Activity::default();
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
