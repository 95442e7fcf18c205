//! What the service keeps of its recent past, for its readers (the dashboard's charts and
//! event list): a bounded history of the rounds published ([`RoundPoint`], written by the
//! loop, memory only) and a bounded log of the actions on clusters ([`Event`], written by the
//! topology writer's log callback, in the order the changes were made, and by the health
//! checks).
//!
//! The actions are the **change history** (issue 45): with a store attached
//! ([`Activity::keep_in`]) each event is appended to the store's history log (synced) before
//! the action is answered, with the preview it was confirmed from (`predicted`), and what the
//! first round that mapped it then did (`observed`) as a record of its own; a start reads them
//! back, so the history survives restarts.

use std::collections::VecDeque;
use std::sync::Mutex;

use cdnmap_engine::figures;
use cdnmap_engine::round::Snapshot;
use cdnmap_mapper::ClusterState;
use serde::{Deserialize, Serialize};

use crate::ramp::{Goal as RampGoal, Phase as RampPhase, Ramp};
pub use crate::topology::Outcome;
use crate::topology::{clean, Actor, MAX_OPERATOR_LEN, MAX_REASON_LEN};

/// Rounds kept in the history the charts show (an hour at the default 10 s cycle).
pub const MAX_HISTORY_ROUNDS: usize = 360;
/// Actions kept in memory for readers (the store's history keeps more: `HISTORY_BOUNDS`).
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
    /// The topology journal's sequence number of the last edit the round solved with.
    pub topology_seq: u64,
    /// The map's cost under the topology's cost policy (`null`: no policy, issue 46).
    pub cost: Option<f64>,
}

/// One entry of the action log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    /// Increases by one per action (across restarts, with a store).
    pub seq: u64,
    pub at_unix_ms: i64,
    pub who: String,
    pub remote: String,
    pub via: String,
    pub action: String,
    pub cluster: String,
    /// The state before (`null` if the action failed before reading it).
    pub from_state: Option<ClusterState>,
    pub to_state: ClusterState,
    pub reason: String,
    pub ok: bool,
    pub error: Option<String>,
    /// What the preview it was applied after said the next round would do (`null`: none was
    /// made: no confirmation from the page and no guard).
    #[serde(default)]
    pub predicted: Option<Outcome>,
    /// What the first round that mapped it did (`null` until then, or when it failed).
    #[serde(default)]
    pub observed: Option<Outcome>,
}

/// A record of the store's change history.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Record {
    Event(Box<Event>),
    Observed {
        seq: u64,
        observed: Outcome,
    },
    /// A ramp as it is after a change of it (the last record of an id is the ramp).
    Ramp(Box<Ramp>),
}

/// Ramps kept for readers (running ones always; the oldest ended ones dropped beyond this).
pub const MAX_RAMPS: usize = 100;

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
    /// The applied actions no round has mapped yet, by seq.
    awaiting: Vec<u64>,
}

/// The service's recent past: the rounds published and the actions on clusters, each bounded.
#[derive(Debug, Default)]
pub struct Activity {
    history: Mutex<VecDeque<RoundPoint>>,
    events: Mutex<EventLog>,
    /// Where the change history is kept (set once at the start: [`Activity::keep_in`]).
    store: std::sync::OnceLock<cdnmap_store::Store>,
    /// The ramps, oldest first (the `ramp` module changes them).
    ramps: Mutex<Vec<Ramp>>,
    /// Replicated: where each new record goes to be shared with the replicas (etcd's copy of
    /// the history, written by the leader: set once at the start).
    share: std::sync::OnceLock<tokio::sync::mpsc::Sender<Vec<u8>>>,
    /// The fingerprints of the records kept (read back or written): what a merge of the
    /// replicas' copy skips.
    seen: Mutex<Seen>,
}

/// The fingerprints of the newest [`MAX_SEEN`] records kept: more than the replicas' copy
/// holds ([`crate::lead::HISTORY_KEPT`]), so a merge never takes a record twice.
#[derive(Debug, Default)]
struct Seen {
    set: std::collections::HashSet<u64>,
    order: VecDeque<u64>,
}

/// Fingerprints remembered: four times the replicas' copy of the history.
const MAX_SEEN: usize = 4 * crate::lead::HISTORY_KEPT as usize;

impl Seen {
    fn remember(&mut self, bytes: &[u8]) {
        let f = fingerprint(bytes);
        if self.set.insert(f) {
            self.order.push_back(f);
            if self.order.len() > MAX_SEEN {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    fn knows(&self, bytes: &[u8]) -> bool {
        self.set.contains(&fingerprint(bytes))
    }
}

/// Records a replicated service may have waiting to be shared with the replicas.
pub const SHARE_BACKLOG: usize = 4_096;

/// A record's fingerprint (FNV-1a, 64 bits): the same bytes, the same record, in any build.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Activity {
    /// Attaches the store's change history: reads it back (the newest [`MAX_EVENTS`] events,
    /// with what was observed of them; numbering goes on after the last), then appends each
    /// new record to it. An unreadable record is skipped and said.
    pub fn keep_in(&self, store: &cdnmap_store::Store) {
        let records = store.history().unwrap_or_else(|e| {
            tracing::error!(error = %e, "the change history is unreadable: it starts again");
            Vec::new()
        });
        if let Ok(mut seen) = self.seen.lock() {
            records.iter().for_each(|(_, b)| seen.remember(b));
        }
        if let Ok(mut log) = self.events.lock() {
            for (_, bytes) in records {
                match serde_json::from_slice::<Record>(&bytes) {
                    Ok(Record::Event(e)) => {
                        let e = *e;
                        log.next_seq = log.next_seq.max(e.seq);
                        if e.ok && e.observed.is_none() {
                            log.awaiting.push(e.seq);
                        }
                        push_bounded(&mut log.events, e);
                    }
                    Ok(Record::Observed { seq, observed }) => {
                        log.awaiting.retain(|&s| s != seq);
                        if let Some(e) = log.events.iter_mut().find(|e| e.seq == seq) {
                            e.observed = Some(observed);
                        }
                    }
                    Ok(Record::Ramp(r)) => self.put_ramp(*r),
                    Err(e) => tracing::warn!(error = %e, "a change history record is unreadable"),
                }
            }
            let kept: Vec<u64> = log.events.iter().map(|e| e.seq).collect();
            log.awaiting.retain(|s| kept.contains(s));
        }
        let _ = self.store.set(store.clone());
    }

    /// The whole change history the store keeps (every record, oldest first), as JSON lines
    /// `{"at_unix_ms": .., "record": {..}}`: what an export gives. Empty without a store.
    pub fn export(&self) -> Result<Vec<u8>, String> {
        let Some(store) = self.store.get() else {
            return Ok(Vec::new());
        };
        let records = store.history().map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(records.iter().map(|(_, r)| r.len() + 32).sum());
        for (at, bytes) in records {
            out.extend_from_slice(format!("{{\"at_unix_ms\":{at},\"record\":").as_bytes());
            out.extend_from_slice(&bytes);
            out.extend_from_slice(b"}\n");
        }
        Ok(out)
    }

    /// Replicated: each record kept from now on is also sent to `to`, which shares it with the
    /// replicas (the `server` module's task writes it to etcd while this replica leads).
    pub fn share_with(&self, to: tokio::sync::mpsc::Sender<Vec<u8>>) {
        let _ = self.share.set(to);
    }

    /// Appends `record` to the store's change history, if one is attached (synced), and
    /// shares it with the replicas; a failure is said, not fatal: the change itself is in the
    /// journal.
    fn keep(&self, at_unix_ms: i64, record: &Record) {
        match serde_json::to_vec(record) {
            Ok(bytes) => self.keep_bytes(at_unix_ms, bytes, true),
            Err(e) => tracing::error!(error = %e, "a change history record could not be encoded"),
        }
    }

    /// [`Activity::keep`] of an encoded record; `share`: to the replicas too (not a record
    /// taken from them).
    fn keep_bytes(&self, at_unix_ms: i64, bytes: Vec<u8>, share: bool) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.remember(&bytes);
        }
        if let Some(store) = self.store.get() {
            if let Err(e) = store.append_history(at_unix_ms, &bytes) {
                tracing::error!(error = %e, "a change history record could not be stored");
            }
        }
        if let Some(to) = self.share.get().filter(|_| share) {
            if let Err(e) = to.try_send(bytes) {
                tracing::error!(error = %e, "a change history record could not be shared with the replicas");
            }
        }
    }

    /// Takes in the replicas' copy of the change history (`records`, oldest first): those this
    /// replica does not have are kept and shown, as the leader that wrote them had them. An
    /// event whose number this replica gave another (a standby's own health event) is
    /// numbered after the last, and what was observed of it follows it. How many were new.
    pub fn merge_shared(&self, records: &[Vec<u8>]) -> usize {
        let mut renumbered = std::collections::HashMap::new();
        let mut new = 0;
        for bytes in records {
            let known = self.seen.lock().map_or(true, |s| s.knows(bytes));
            if known {
                continue;
            }
            let record = match serde_json::from_slice::<Record>(bytes) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "a shared change history record is unreadable");
                    continue;
                }
            };
            let taken = match record {
                Record::Event(mut e) => {
                    let Ok(mut log) = self.events.lock() else {
                        continue;
                    };
                    if e.seq <= log.next_seq {
                        let seq = log.next_seq + 1;
                        renumbered.insert(e.seq, seq);
                        e.seq = seq;
                    }
                    log.next_seq = e.seq;
                    if e.ok && e.observed.is_none() && !observes_itself(&e.action) {
                        await_bounded(&mut log.awaiting, e.seq);
                    }
                    push_bounded(&mut log.events, (*e).clone());
                    Record::Event(e)
                }
                Record::Observed { seq, observed } => {
                    let seq = renumbered.get(&seq).copied().unwrap_or(seq);
                    let Ok(mut log) = self.events.lock() else {
                        continue;
                    };
                    log.awaiting.retain(|&s| s != seq);
                    if let Some(e) = log.events.iter_mut().find(|e| e.seq == seq) {
                        e.observed = Some(observed);
                    }
                    Record::Observed { seq, observed }
                }
                Record::Ramp(r) => {
                    self.put_ramp((*r).clone());
                    Record::Ramp(r)
                }
            };
            if let Ok(mut seen) = self.seen.lock() {
                seen.remember(bytes);
            }
            match serde_json::to_vec(&taken) {
                Ok(b) => self.keep_bytes(crate::clock::now_unix_ms(), b, false),
                Err(e) => tracing::error!(error = %e, "a shared record could not be encoded"),
            }
            new += 1;
        }
        new
    }

    /// Adds a published round to the history (dropping the oldest beyond
    /// [`MAX_HISTORY_ROUNDS`]), and records it as what was observed of the applied actions it
    /// is the first to map (their cluster in the state they set).
    pub fn record_round(&self, s: &Snapshot, solve_ms: f64, topology_seq: u64) {
        self.observe(s);
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
            topology_seq,
            cost: cdnmap_mapper::policy::map_cost(&s.topology, &s.map),
        };
        if let Ok(mut h) = self.history.lock() {
            if h.len() >= MAX_HISTORY_ROUNDS {
                h.pop_front();
            }
            h.push_back(point);
        }
    }

    /// The topology journal's sequence number round `version` solved with, while it is in
    /// the history.
    pub fn topology_seq_of(&self, version: u64) -> Option<u64> {
        let h = self.history.lock().ok()?;
        h.iter()
            .rev()
            .find(|p| p.version == version)
            .map(|p| p.topology_seq)
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

    /// What the round `s` did, as observed of the applied actions waiting for it.
    fn observe(&self, s: &Snapshot) {
        let Ok(mut log) = self.events.lock() else {
            return;
        };
        if log.awaiting.is_empty() {
            return;
        }
        let demand = s.topology.total_demand();
        let observed = Outcome {
            version: s.version,
            overflow_share: if demand > 0.0 {
                s.map.total_overflow() / demand
            } else {
                0.0
            },
            moved_share: s.churn.unwrap_or(0.0),
        };
        let mut seen = Vec::new();
        let waiting = std::mem::take(&mut log.awaiting);
        for seq in waiting {
            let mapped = log.events.iter_mut().find(|e| e.seq == seq).filter(|e| {
                s.topology
                    .cluster_index(&e.cluster)
                    .is_some_and(|c| s.topology.clusters()[c as usize].state == e.to_state)
            });
            match mapped {
                Some(e) => {
                    e.observed = Some(observed);
                    seen.push(seq);
                }
                None => log.awaiting.push(seq),
            }
        }
        drop(log);
        for seq in seen {
            self.keep(s.solved_at_unix_ms, &Record::Observed { seq, observed });
        }
    }

    /// Logs an action and its outcome (the state before, or why it was refused) with what its
    /// preview `predicted`, dropping the oldest beyond [`MAX_EVENTS`]; kept in the store's
    /// change history before it returns.
    #[allow(clippy::too_many_arguments)]
    pub fn log_action(
        &self,
        actor: &Actor,
        cluster: &str,
        state: ClusterState,
        reason: &str,
        result: Result<Option<ClusterState>, String>,
        predicted: Option<Outcome>,
        now_unix_ms: i64,
    ) {
        let event = Event {
            seq: 0,
            at_unix_ms: now_unix_ms,
            who: actor.who.clone(),
            remote: actor.remote.clone(),
            via: actor.via.to_string(),
            action: action_name(state).to_string(),
            cluster: clean(cluster, MAX_OPERATOR_LEN),
            from_state: result.as_ref().ok().copied().flatten(),
            to_state: state,
            reason: clean(reason, MAX_REASON_LEN),
            ok: result.is_ok(),
            error: result.err(),
            predicted,
            observed: None,
        };
        self.push(event);
    }

    /// Numbers `event`, keeps it in the store's history, then among the events read.
    fn push(&self, mut event: Event) {
        let Ok(mut log) = self.events.lock() else {
            return;
        };
        log.next_seq += 1;
        event.seq = log.next_seq;
        if event.ok && !observes_itself(&event.action) {
            await_bounded(&mut log.awaiting, event.seq);
        }
        // Under the lock, so the history keeps the events in their order.
        self.keep(event.at_unix_ms, &Record::Event(Box::new(event.clone())));
        push_bounded(&mut log.events, event);
    }

    /// The ramps, oldest first.
    pub fn ramps(&self) -> Vec<Ramp> {
        self.ramps.lock().map_or_else(|_| Vec::new(), |r| r.clone())
    }

    /// The id the next ramp takes.
    pub fn next_ramp_id(&self) -> u64 {
        self.ramps
            .lock()
            .map_or(1, |r| r.iter().map(|r| r.id).max().unwrap_or(0) + 1)
    }

    /// Keeps `ramp` as it is now: in the store's change history (synced), then for readers.
    pub fn keep_ramp(&self, ramp: &Ramp) {
        self.keep(
            crate::clock::now_unix_ms(),
            &Record::Ramp(Box::new(ramp.clone())),
        );
        self.put_ramp(ramp.clone());
    }

    /// `ramp` in place of the one of its id (or added), the oldest ended ones dropped beyond
    /// [`MAX_RAMPS`].
    fn put_ramp(&self, ramp: Ramp) {
        let Ok(mut all) = self.ramps.lock() else {
            return;
        };
        match all.iter_mut().find(|r| r.id == ramp.id) {
            Some(r) => *r = ramp,
            None => all.push(ramp),
        }
        while all.len() > MAX_RAMPS {
            match all.iter().position(|r| r.phase != RampPhase::Running) {
                Some(i) => {
                    all.remove(i);
                }
                None => break,
            }
        }
    }

    /// Logs a ramp's start or end as an action on its cluster (`action`: `ramp_start`,
    /// `ramp_done`, `ramp_cancel`, `ramp_rollback`, `ramp_interrupted`), with what its goal's
    /// preview predicted and, once it is done, what the round that mapped its goal observed.
    pub fn log_ramp(&self, ramp: &Ramp, action: &str, error: Option<String>) {
        let to_state = match (action, ramp.goal) {
            ("ramp_start" | "ramp_done", RampGoal::Drained) => ClusterState::Drained,
            _ => ClusterState::Up,
        };
        let reason = match &ramp.why {
            Some(why) if action != "ramp_start" => format!("{} — {why}", ramp.reason),
            _ => ramp.reason.clone(),
        };
        self.push(Event {
            seq: 0,
            at_unix_ms: crate::clock::now_unix_ms(),
            who: ramp.who.clone(),
            remote: ramp.remote.clone(),
            via: ramp.via.clone(),
            action: action.to_string(),
            cluster: clean(&ramp.cluster, MAX_OPERATOR_LEN),
            from_state: Some(ClusterState::Up),
            to_state,
            reason: clean(&reason, MAX_REASON_LEN),
            ok: error.is_none(),
            error,
            predicted: ramp.predicted,
            observed: (action == "ramp_done")
                .then(|| ramp.steps.last().and_then(|s| s.observed))
                .flatten(),
        });
    }

    /// Logs what the health checks did to a cluster the operator has up: took it down
    /// (`down`, with the reason) or let it back. Who: "health checks", through "health".
    pub fn log_health(&self, cluster: &str, down: bool, reason: &str, now_unix_ms: i64) {
        let (from, to) = if down {
            (ClusterState::Up, ClusterState::Down)
        } else {
            (ClusterState::Down, ClusterState::Up)
        };
        self.push(Event {
            seq: 0,
            at_unix_ms: now_unix_ms,
            who: "health checks".into(),
            remote: "local".into(),
            via: "health".into(),
            action: if down { "health_down" } else { "health_up" }.into(),
            cluster: clean(cluster, MAX_OPERATOR_LEN),
            from_state: Some(from),
            to_state: to,
            reason: clean(reason, MAX_REASON_LEN),
            ok: true,
            error: None,
            predicted: None,
            observed: None,
        });
    }

    /// The last `limit` events, newest first.
    pub fn events(&self, limit: usize) -> Vec<Event> {
        self.events.lock().map_or_else(
            |_| Vec::new(),
            |l| l.events.iter().rev().take(limit).cloned().collect(),
        )
    }
}

/// Whether an action is its own observation (the health checks' act at a round; a ramp's
/// record carries what its rounds observed): no round's figures are waited for.
fn observes_itself(action: &str) -> bool {
    action.starts_with("health_") || action.starts_with("ramp_")
}

/// Adds `seq` to the actions waiting for a round to observe them, dropping the oldest beyond
/// [`MAX_EVENTS`] (an action on a cluster deleted before a round mapped it waits forever).
fn await_bounded(awaiting: &mut Vec<u64>, seq: u64) {
    if awaiting.len() >= MAX_EVENTS {
        awaiting.remove(0);
    }
    awaiting.push(seq);
}

/// Appends `event`, dropping the oldest beyond [`MAX_EVENTS`].
fn push_bounded(events: &mut VecDeque<Event>, event: Event) {
    if events.len() >= MAX_EVENTS {
        events.pop_front();
    }
    events.push_back(event);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor() -> Actor {
        Actor::new(Some("ana\u{7}\n "), None, "http")
    }

    /// The fingerprints a merge skips are bounded: the oldest go first.
    #[test]
    fn the_fingerprints_remembered_are_bounded() {
        let mut seen = Seen::default();
        for i in 0..=MAX_SEEN {
            seen.remember(&i.to_le_bytes());
            seen.remember(&i.to_le_bytes());
        }
        assert_eq!(seen.set.len(), MAX_SEEN);
        assert_eq!(seen.order.len(), MAX_SEEN);
        assert!(!seen.knows(&0usize.to_le_bytes()));
        assert!(seen.knows(&1usize.to_le_bytes()));
        assert!(seen.knows(&MAX_SEEN.to_le_bytes()));
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
                None,
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
