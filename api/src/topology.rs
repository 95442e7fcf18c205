//! The one writer of the topology: every change (Admin's edits and cluster states, the
//! dashboard's actions, and later health checks) goes through one task, in arrival order,
//! as apply → validate → persist → publish → log, and the caller is answered only after all
//! five. So what the store holds is always the last change acknowledged, never an older copy
//! stored late; and every reader (the round, feedback validation, Admin reads) sees the
//! published topology through one `ArcSwap`, without a lock (tokio's advice for a shared I/O
//! resource: message passing to the task that owns it).
//!
//! **Persisting costs the edit, not the topology.** A change is stored as its [`Edit`], one
//! entry appended to the store's journal and synced before the answer (a few hundred bytes),
//! not as the whole topology (at 11 M map units about half a gigabyte compressed, seconds to
//! write). The published topology carries the journal's sequence number of the last edit in
//! it, which is how each round's record names the topology it was solved from. Once
//! replaying the journal since the last snapshot would cost more than
//! [`replay_budget`] (in map units rebuilt), the writer has the topology at that point written
//! as the next snapshot, on a thread of its own, one at a time: the edits that follow are
//! not held up by it, and a start replays at most about that budget onto the newest snapshot.
//!
//! **Replicated** (`cdnmap serve --etcd`), only the leader carries out changes made here, and
//! between apply and journal it appends each to the replicas' log in etcd (its leader key and
//! the edit's number compared); every replica applies that log in order through this same
//! writer ([`SharedTopology::apply_shared`]), under the same numbers as its journal's.
//!
//! What an edit does to candidates, and to classes left without an up cluster (a warning in
//! the answer, in the log and in the metrics, `cdnmap_classes_unserved`), is `cdnmap_store::edit`'s.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use cdnmap_mapper::ClusterState;
use cdnmap_store::edit::{apply, unserved_classes, Applied, Edit, EditError};
use cdnmap_store::Store;
use cdnmap_topology::format::{ClusterFile, MapUnitFile};
use cdnmap_topology::Topology;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// Changes waiting for the writer; a caller beyond it waits for room.
const QUEUE: usize = 64;

/// How much replaying the journal may cost, in map units copied or rebuilt (what applying
/// each edit cost, [`Applied::cost`]: 1 for a cluster's state or a cluster upserted in place,
/// the unit count for a unit edit, whose columns are copied, 0.2 s at 1 M map units), before
/// the writer takes a snapshot: about one copy of the units, or 65,536 cheap edits. A start
/// then replays about that much, beyond the edits made while a snapshot was being written.
pub fn replay_budget(units: usize) -> u64 {
    units as u64 + 65_536
}

/// The longest operator name kept from an `X-Operator` header (longer ones are cut).
pub const MAX_OPERATOR_LEN: usize = 64;
/// The longest reason kept with an action (longer ones are cut).
pub const MAX_REASON_LEN: usize = 200;

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

/// A change's effect on the map: the overflow share after it and the share of the demand it
/// moved; of a preview (the map version it started from) or of a round (the version made).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Outcome {
    pub version: u64,
    pub overflow_share: f64,
    pub moved_share: f64,
}

/// One change of the topology.
#[derive(Debug, Clone)]
pub enum Change {
    /// An operator's action on a cluster (Admin `SetClusterState`, the dashboard): logged
    /// with who did it and why.
    ClusterState {
        id: String,
        state: ClusterState,
        reason: String,
        actor: Actor,
        /// What the preview it is applied after said (the change history keeps it).
        predicted: Option<Outcome>,
    },
    UpsertCluster(ClusterFile),
    DeleteCluster(String),
    UpsertMapUnit(MapUnitFile),
    DeleteMapUnit(String),
    /// The operator's policy replaced whole.
    Policy(cdnmap_mapper::model::PolicySpec),
}

impl Change {
    /// The change an edit read from the replicas' log makes here (replicated: the leader's
    /// Admin or dashboard change, applied on every replica).
    pub fn shared(edit: Edit) -> Change {
        match edit {
            Edit::ClusterState { id, state } => Change::ClusterState {
                id,
                state,
                reason: "applied from the replicas' edits".into(),
                actor: Actor::new(Some("leader"), None, "etcd"),
                predicted: None,
            },
            Edit::UpsertCluster { cluster } => Change::UpsertCluster(cluster),
            Edit::DeleteCluster { id } => Change::DeleteCluster(id),
            Edit::UpsertMapUnit { unit } => Change::UpsertMapUnit(unit),
            Edit::DeleteMapUnit { id } => Change::DeleteMapUnit(id),
            Edit::Policy { policy } => Change::Policy(policy),
        }
    }

    /// The edit this change makes (what is applied and journaled).
    pub fn edit(&self) -> Edit {
        match self {
            Change::ClusterState { id, state, .. } => Edit::ClusterState {
                id: id.clone(),
                state: *state,
            },
            Change::UpsertCluster(c) => Edit::UpsertCluster { cluster: c.clone() },
            Change::DeleteCluster(id) => Edit::DeleteCluster { id: id.clone() },
            Change::UpsertMapUnit(u) => Edit::UpsertMapUnit { unit: u.clone() },
            Change::DeleteMapUnit(id) => Edit::DeleteMapUnit { id: id.clone() },
            Change::Policy(p) => Edit::Policy { policy: p.clone() },
        }
    }
}

/// Why a change was not carried out (the topology and the store are then unchanged).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeError {
    /// The edit does not apply to the topology ([`apply`]'s refusal).
    #[error(transparent)]
    Edit(#[from] EditError),
    #[error("storing the topology failed: {0}")]
    Store(String),
    #[error("the topology writer has stopped")]
    Stopped,
    /// Replicated: this replica does not lead; changes go to the leader (named when known).
    #[error("this replica is a standby ({0}): send changes to the leader")]
    NotLeader(String),
    /// Replicated: the change could not be written to etcd for the replicas (nothing changed).
    #[error("the change could not be shared with the replicas: {0}")]
    Shared(String),
    /// The guard refused it (`[guard]`, the `guard` module): which limits, with the figures.
    #[error("{0}")]
    Guard(String),
}

/// Called by the writer after each change is published, before the caller is answered: the
/// action log sees changes in the order they were made.
pub type Log = Arc<dyn Fn(&Change, &Result<Applied, ChangeError>) + Send + Sync>;

struct Request {
    change: Change,
    /// Replicated: the edit's number in the replicas' log (an edit read from etcd, applied
    /// here as it was on the leader); `None`: a change made here, which the leader appends to
    /// that log before anything else.
    shared_seq: Option<u64>,
    reply: oneshot::Sender<Result<Applied, ChangeError>>,
}

/// Replicated, this replica's part in the election (set once the service has connected to
/// etcd): the writer appends the leader's changes to the replicas' log through it.
pub type Lead = Arc<std::sync::OnceLock<Arc<crate::lead::Coordinator>>>;

/// The published topology and the journal's sequence number of the last edit in it (the
/// topology is the stored one after that many edits).
#[derive(Debug)]
pub struct Versioned {
    pub topology: Arc<Topology>,
    pub seq: u64,
}

/// The handle every reader and writer of the topology holds.
#[derive(Clone)]
pub struct SharedTopology {
    current: Arc<ArcSwap<Versioned>>,
    tx: mpsc::Sender<Request>,
    /// Whether a snapshot is being written (one at a time).
    snapshotting: Arc<AtomicBool>,
}

impl SharedTopology {
    /// Starts the writer task (on the current tokio runtime) over `initial`, the stored
    /// topology after journal entry `seq`.
    /// `replayed` is what the start's replay of the journal onto the newest snapshot cost
    /// (`cdnmap_store::StartTopology::replayed`): the count toward the next snapshot goes on from
    /// there, and a snapshot is taken at once when it is over [`replay_budget`] already, so
    /// edits made across many short-lived starts do not pile up in the journal.
    pub fn start(
        store: Store,
        initial: Topology,
        seq: u64,
        replayed: u64,
        log: Log,
        lead: Lead,
    ) -> SharedTopology {
        let current = Arc::new(ArcSwap::from_pointee(Versioned {
            topology: Arc::new(initial),
            seq,
        }));
        let (tx, rx) = mpsc::channel(QUEUE);
        let snapshotting = Arc::new(AtomicBool::new(false));
        tokio::spawn(writer(
            rx,
            Arc::clone(&current),
            store,
            log,
            (Arc::clone(&snapshotting), replayed),
            lead,
        ));
        SharedTopology {
            current,
            tx,
            snapshotting,
        }
    }

    /// Waits (at most `limit`) until no snapshot is being written: a stop lets the one in
    /// progress finish, so the next start replays less. Whether none is.
    pub async fn snapshot_written(&self, limit: std::time::Duration) -> bool {
        let until = tokio::time::Instant::now() + limit;
        while self.snapshotting.load(Ordering::Acquire) {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        true
    }

    /// The published topology (the next round solves it).
    pub fn current(&self) -> Arc<Topology> {
        Arc::clone(&self.current.load().topology)
    }

    /// The published topology and the journal's sequence number of its last edit, read
    /// together.
    pub fn current_versioned(&self) -> Arc<Versioned> {
        self.current.load_full()
    }

    /// Carries out `change`; returns once it is stored and published (or refused).
    /// Replicated, only the leader carries changes out, each appended to the replicas' log in
    /// etcd first.
    pub async fn change(&self, change: Change) -> Result<Applied, ChangeError> {
        self.request(change, None).await
    }

    /// Replicated: carries out the edit number `seq` of the replicas' log (which must follow
    /// the last one applied), as the leader did.
    pub async fn apply_shared(&self, seq: u64, edit: Edit) -> Result<Applied, ChangeError> {
        self.request(Change::shared(edit), Some(seq)).await
    }

    async fn request(
        &self,
        change: Change,
        shared_seq: Option<u64>,
    ) -> Result<Applied, ChangeError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request {
                change,
                shared_seq,
                reply,
            })
            .await
            .map_err(|_| ChangeError::Stopped)?;
        answer.await.map_err(|_| ChangeError::Stopped)?
    }
}

async fn writer(
    mut rx: mpsc::Receiver<Request>,
    current: Arc<ArcSwap<Versioned>>,
    store: Store,
    log: Log,
    (snapshotting, replayed): (Arc<AtomicBool>, u64),
    lead: Lead,
) {
    // Replay cost journaled since the last snapshot was asked for: at a start, what its
    // replay cost.
    let mut since_snapshot = replayed;
    let start = current.load_full();
    if since_snapshot >= replay_budget(start.topology.unit_count())
        && !snapshotting.swap(true, Ordering::AcqRel)
    {
        since_snapshot = 0;
        snapshot(&store, &start.topology, start.seq, &snapshotting);
    }
    while let Some(Request {
        change,
        shared_seq,
        reply,
    }) = rx.recv().await
    {
        let now = current.load_full();
        let result = carry_out(&change, shared_seq, &now, &store, lead.get()).await;
        let result = result.map(|(applied, seq, cost)| {
            if applied.changed {
                current.store(Arc::new(Versioned {
                    topology: Arc::clone(&applied.topology),
                    seq,
                }));
                since_snapshot += cost;
                if since_snapshot >= replay_budget(applied.topology.unit_count())
                    && !snapshotting.swap(true, Ordering::AcqRel)
                {
                    since_snapshot = 0;
                    snapshot(&store, &applied.topology, seq, &snapshotting);
                }
            }
            applied
        });
        if let Ok(applied) = &result {
            for w in &applied.warnings {
                tracing::warn!(change = ?kind(&change), "{w}");
            }
            metrics::gauge!("cdnmap_classes_unserved")
                .set(unserved_classes(&applied.topology).len() as f64);
        }
        log(&change, &result);
        let _ = reply.send(result);
    }
}

/// One change on the topology `now`: applied (validated), then — replicated, for a change
/// made here — appended to the replicas' log in etcd under the leader's term, then journaled
/// (synced); the applied change, its journal number and its replay cost. An edit from the
/// replicas' log (`shared_seq`) must be the next one and is not appended again. Applying and
/// journaling block: off the async threads, one change at a time.
async fn carry_out(
    change: &Change,
    shared_seq: Option<u64>,
    now: &Arc<Versioned>,
    store: &Store,
    lead: Option<&Arc<crate::lead::Coordinator>>,
) -> Result<(Applied, u64, u64), ChangeError> {
    let next = now.seq + 1;
    let term = match (lead, shared_seq) {
        (Some(_), Some(n)) if n != next => {
            return Err(ChangeError::Shared(format!(
                "edit {n} of the replicas' log does not follow edit {} applied here",
                now.seq
            )))
        }
        (Some(l), None) => Some(l.term().ok_or_else(|| {
            ChangeError::NotLeader(match l.leader_name() {
                Some(leader) => format!("{leader} leads"),
                None => "no leader is known".into(),
            })
        })?),
        _ => None,
    };
    let edit = change.edit();
    let base = Arc::clone(&now.topology);
    let to_apply = edit.clone();
    let applied =
        tokio::task::spawn_blocking(move || apply(&base, &to_apply).map_err(ChangeError::from))
            .await
            .unwrap_or_else(|e| {
                Err(ChangeError::Store(format!("the writer's task failed: {e}")))
            })?;
    if !applied.changed {
        if let Some(n) = shared_seq {
            // The leader's edit changed its topology; here it changes nothing: the two have
            // parted (a store with edits of its own). Said, not skipped: the numbering of the
            // journal and the log would part too.
            return Err(ChangeError::Shared(format!(
                "edit {n} of the replicas' log changes nothing here: this replica's topology \
                 is not the leader's"
            )));
        }
        return Ok((applied, now.seq, 0));
    }
    if let (Some(l), Some(term)) = (lead, &term) {
        let bytes = serde_json::to_vec(&edit).map_err(|e| ChangeError::Shared(e.to_string()))?;
        match l.append_edit(term, next, &bytes).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(ChangeError::Shared(format!(
                    "etcd refused edit {next}: the term ended, or the replicas' log holds an \
                     edit this replica has not applied yet; try again"
                )))
            }
            Err(e) => return Err(ChangeError::Shared(e.to_string())),
        }
    }
    let store = store.clone();
    let cost = applied.cost;
    let seq = tokio::task::spawn_blocking(move || {
        store
            .append_edit(crate::clock::now_unix_ms(), &edit)
            .map_err(|e| ChangeError::Store(e.to_string()))
    })
    .await
    .unwrap_or_else(|e| Err(ChangeError::Store(format!("the writer's task failed: {e}"))))?;
    if lead.is_some() && seq != next {
        // The journal and the replicas' log number edits alike; a store with edits of its
        // own (made before the replica joined) cannot follow the log.
        tracing::error!(
            seq,
            next,
            "the journal's numbering left the replicas' log's"
        );
    }
    Ok((applied, seq, cost))
}

/// Writes `topology` (the one after journal entry `seq`) as the store's next snapshot on a
/// thread of its own, then lets the next one start (`busy`). A failure is logged: the journal
/// still holds every edit, so nothing is lost, and the next budget's worth of edits tries
/// again.
fn snapshot(store: &Store, topology: &Arc<Topology>, seq: u64, busy: &Arc<AtomicBool>) {
    let (store, topology, done) = (store.clone(), Arc::clone(topology), Arc::clone(busy));
    let spawned = std::thread::Builder::new()
        .name("cdnmap-snapshot".into())
        .spawn(move || {
            let t = std::time::Instant::now();
            let result = store.put_snapshot(seq, &topology);
            // Let go of the store before saying it is done (a stop then closes it).
            drop((store, topology));
            match result {
                Ok(()) => tracing::info!(
                    seq,
                    ms = t.elapsed().as_secs_f64() * 1e3,
                    "topology snapshot stored"
                ),
                Err(e) => tracing::error!(seq, error = %e, "storing a topology snapshot failed"),
            }
            done.store(false, Ordering::Release);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "no thread for the topology snapshot");
        busy.store(false, Ordering::Release);
    }
}

fn kind(change: &Change) -> &'static str {
    match change {
        Change::ClusterState { .. } => "cluster state",
        Change::UpsertCluster(_) => "upsert cluster",
        Change::DeleteCluster(_) => "delete cluster",
        Change::UpsertMapUnit(_) => "upsert map unit",
        Change::DeleteMapUnit(_) => "delete map unit",
        Change::Policy(_) => "policy",
    }
}

#[cfg(test)]
mod restart;
#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::Limits;
    use cdnmap_topology::format::{parse_instance, InstanceFile};
    use std::sync::Mutex;

    /// Two classes; "a" serves both, "b" only web, "c" only video; units list a and b or a and c.
    fn instance() -> Topology {
        let cluster = |id: &str, classes: &str| {
            format!(
                r#"{{"id": "{id}", "lat": 0, "lon": 0, "addresses": ["198.18.0.1"],
                  "resources": {{"name": "r", "kind": "bps", "capacity": 10, "classes": [{classes}]}}}}"#
            )
        };
        let unit = |id: &str, class: &str, other: &str| {
            format!(
                r#"{{"id": "{id}", "class": "{class}", "demand": 1, "lat": 0, "lon": 0,
                  "candidates": [{{"cluster": "a", "score": 1}}, {{"cluster": "{other}", "score": 2}}]}}"#
            )
        };
        let json = format!(
            r#"{{"traffic_classes": [
                {{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 0}}}},
                {{"name": "video", "priority": 1, "per_unit": {{"bps": 1, "fps": 0}}}}],
              "clusters": [{}, {}, {}],
              "map_units": [{}, {}, {}]}}"#,
            cluster("a", r#""web", "video""#),
            cluster("b", r#""web""#),
            cluster("c", r#""video""#),
            unit("u1", "web", "b"),
            unit("u2", "web", "b"),
            unit("u3", "video", "c"),
        );
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    fn state(id: &str, state: ClusterState) -> Change {
        Change::ClusterState {
            id: id.into(),
            state,
            reason: String::new(),
            actor: Actor::new(Some("test"), None, "test"),
            predicted: None,
        }
    }

    #[test]
    fn deleting_a_cluster_drops_its_candidates_and_counts_them() {
        let base = Arc::new(instance());
        let applied = apply(&base, &Change::DeleteCluster("b".into()).edit()).expect("applied");
        assert!(applied.changed);
        assert_eq!(applied.skipped_candidates, 2);
        assert_eq!(applied.warnings.len(), 1, "{:?}", applied.warnings);
        assert!(applied.warnings[0].contains("2 candidate entries of 2 map units"));
        let t = &applied.topology;
        assert_eq!(t.clusters().len(), 2);
        let u1 = t.unit_index("u1").expect("u1");
        assert_eq!(t.candidates(u1).count(), 1);
        // Deleting nothing changes nothing.
        let none = apply(&base, &Change::DeleteCluster("zz".into()).edit()).expect("applied");
        assert!(!none.changed);
    }

    #[test]
    fn removing_a_class_from_a_cluster_is_not_refused() {
        let base = Arc::new(instance());
        let mut file = InstanceFile::of(&base);
        let mut a = file.clusters.remove(0);
        if let cdnmap_topology::format::ResourcesFile::Nested(root) = &mut a.resources {
            root.classes = vec!["web".into()];
        }
        let applied = apply(&base, &Change::UpsertCluster(a).edit()).expect("applied");
        // u3 (video) listed a; it keeps c.
        assert_eq!(applied.skipped_candidates, 1);
        let t = &applied.topology;
        let u3 = t.unit_index("u3").expect("u3");
        let left: Vec<u32> = t.candidates(u3).map(|c| c.cluster).collect();
        assert_eq!(left, vec![t.cluster_index("c").expect("c")]);
        // A unit edit that names a cluster without its class is refused, as in a file.
        let mut u = file.map_units.remove(2);
        u.candidates[0].cluster = "b".into();
        let err = apply(&applied.topology, &Change::UpsertMapUnit(u).edit()).expect_err("refused");
        assert!(matches!(err, EditError::Refused(_)), "{err}");
    }

    /// A unit edit claiming a client network that another unit of its class has is refused,
    /// naming both; in another class the same network is fine.
    #[test]
    fn a_unit_claiming_another_units_network_is_refused() {
        let base = Arc::new(instance());
        let file = InstanceFile::of(&base);
        let mut u1 = file.map_units[0].clone();
        u1.prefixes = vec!["10.1.2.0/24".parse().expect("net")];
        let with = apply(&base, &Change::UpsertMapUnit(u1).edit()).expect("applied");
        let mut u2 = file.map_units[1].clone(); // web, as u1
        u2.prefixes = vec!["10.1.2.99/24".parse().expect("net")];
        let err = apply(&with.topology, &Change::UpsertMapUnit(u2).edit()).expect_err("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("10.1.2.0/24") && msg.contains("\"u1\"") && msg.contains("\"u2\""),
            "{msg}"
        );
        let mut u3 = file.map_units[2].clone(); // video
        u3.prefixes = vec!["10.1.2.0/24".parse().expect("net")];
        apply(&with.topology, &Change::UpsertMapUnit(u3).edit()).expect("another class");
    }

    #[test]
    fn draining_the_last_cluster_of_a_class_warns() {
        let base = Arc::new(instance());
        let one = apply(&base, &state("c", ClusterState::Drained).edit()).expect("applied");
        assert!(
            one.warnings.is_empty(),
            "a still serves video: {:?}",
            one.warnings
        );
        let two = apply(&one.topology, &state("a", ClusterState::Down).edit()).expect("applied");
        assert_eq!(two.warnings.len(), 1, "{:?}", two.warnings);
        assert!(two.warnings[0].contains("\"video\""), "{:?}", two.warnings);
        assert_eq!(unserved_classes(&two.topology), vec!["video".to_string()]);
        assert_eq!(two.before, Some(ClusterState::Up));
        let err =
            apply(&base, &state("zz", ClusterState::Down).edit()).expect_err("no such cluster");
        assert!(matches!(err, EditError::NoCluster(_)));
    }

    /// Three writers at once, each on its own cluster and unit: every change goes through the one
    /// writer, so the store, read back after the last answer, holds each key's last
    /// acknowledged value, and the log saw the changes in the order they were made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_changes_are_stored_in_the_order_acknowledged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let base = instance();
        store.put_topology(&base).expect("topology");
        let logged: Arc<Mutex<Vec<(String, ClusterState)>>> = Arc::default();
        let to_log = Arc::clone(&logged);
        let log: Log = Arc::new(move |change, result| {
            if let (Change::ClusterState { id, state, .. }, Ok(_)) = (change, result) {
                to_log.lock().expect("log").push((id.clone(), *state));
            }
        });
        let topology = SharedTopology::start(store.clone(), base, 0, 0, log, Lead::default());
        let mut tasks = Vec::new();
        for (w, (cluster, unit)) in [("a", "u1"), ("b", "u2"), ("c", "u3")]
            .into_iter()
            .enumerate()
        {
            let topology = topology.clone();
            tasks.push(tokio::spawn(async move {
                let mut last = (ClusterState::Up, 1.0);
                for i in 0..40 {
                    let s = [ClusterState::Drained, ClusterState::Up, ClusterState::Down][i % 3];
                    topology.change(state(cluster, s)).await.expect("state");
                    let mut file = InstanceFile::of(&topology.current());
                    let mut u = file
                        .map_units
                        .drain(..)
                        .find(|u| u.id == unit)
                        .expect("unit");
                    u.demand = (w * 1000 + i) as f64;
                    topology
                        .change(Change::UpsertMapUnit(u))
                        .await
                        .expect("upsert");
                    last = (s, (w * 1000 + i) as f64);
                }
                (cluster, unit, last)
            }));
        }
        let mut want = Vec::new();
        for t in tasks {
            want.push(t.await.expect("writer"));
        }
        let stored = store
            .topology(Limits::default())
            .expect("read")
            .expect("stored");
        assert_eq!(stored, *topology.current());
        for (cluster, unit, (s, demand)) in want {
            let c = stored.cluster_index(cluster).expect("cluster");
            assert_eq!(stored.clusters()[c as usize].state, s, "{cluster}");
            let u = stored.unit_index(unit).expect("unit");
            assert_eq!(stored.unit_demand(u), demand, "{unit}");
        }
        let log = logged.lock().expect("log");
        assert_eq!(log.len(), 120);
        for cluster in ["a", "b", "c"] {
            let last = log
                .iter()
                .rev()
                .find(|(id, _)| id == cluster)
                .expect("logged");
            let c = stored.cluster_index(cluster).expect("cluster");
            assert_eq!(stored.clusters()[c as usize].state, last.1);
        }
    }

    /// Edits made across many short starts are snapshotted all the same (issue 41, finding 9):
    /// the writer counted toward its next snapshot from zero at every start, so a mapper
    /// restarted more often than `replay_budget`'s worth of edits came never took one, and
    /// each start replayed the whole journal (123,000 edits, 3.3 s, then growing). Each start
    /// here makes 300 cluster-state edits, under the budget (512 of them), and the fifth start
    /// replays less than the budget.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn edits_across_short_starts_are_snapshotted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let base = instance();
        let budget = replay_budget(base.unit_count());
        assert!(300 * cdnmap_store::edit::CHEAP_EDIT_COST < budget);
        store.put_topology(&base).expect("topology");
        let log: Log = Arc::new(|_, _| {});
        for start in 0..5 {
            let at = store
                .start_topology(Limits::default(), || Err::<Topology, _>("no initial"))
                .expect("the stored topology");
            assert!(
                at.replayed < budget,
                "start {start} replayed {} (budget {budget})",
                at.replayed
            );
            let writer = SharedTopology::start(
                store.clone(),
                at.topology,
                at.seq,
                at.replayed,
                Arc::clone(&log),
                Lead::default(),
            );
            for i in 0..300 {
                let s = [ClusterState::Drained, ClusterState::Up][i % 2];
                writer.change(state("b", s)).await.expect("state");
            }
            assert!(
                writer
                    .snapshot_written(std::time::Duration::from_secs(10))
                    .await
            );
        }
    }

    #[test]
    fn operator_names_are_cleaned_and_bounded() {
        let actor = Actor::new(Some("ana\u{7}\n "), None, "http");
        assert_eq!(actor.who, "ana");
        assert_eq!(Actor::new(Some("  "), None, "http").who, "anonymous");
        let long = "x".repeat(MAX_OPERATOR_LEN * 2);
        assert_eq!(
            Actor::new(Some(&long), None, "http").who.len(),
            MAX_OPERATOR_LEN
        );
    }
}
