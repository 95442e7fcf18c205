//! The one writer of the topology: every change (Admin's edits and cluster states, the
//! dashboard's actions, and later health checks) goes through one task, in arrival order,
//! as apply → validate → persist → publish → log, and the caller is answered only after all
//! five. So what the store holds is always the last change acknowledged, never an older copy
//! stored late; and every reader (the round, feedback validation, Admin reads) sees the
//! published topology through one `ArcSwap`, without a lock (tokio's advice for a shared I/O
//! resource: message passing to the task that owns it).
//!
//! **What a change does to candidates.** Deleting a cluster, or removing a class from a
//! cluster (an upsert whose resource tree no longer serves it), leaves some map units with a
//! candidate that can no longer serve their class. The change is not refused for that: those
//! candidates are dropped from the units' lists, and the answer counts them
//! ([`Applied::skipped_candidates`], [`Applied::warnings`]). A unit left with no candidate is
//! still mapped: its demand is overflow and it is answered by its class's fallback. A change
//! that leaves a traffic class with no up cluster serving it (draining or deleting the last
//! one) is carried out too, with a warning in the answer, in the log and in the metrics
//! (`cdnmap_classes_unserved`): that class's clients get no address until a cluster is back.

use std::sync::Arc;

use arc_swap::ArcSwap;
use cdnmap_mapper::{ClusterState, Instance, Limits};
use cdnmap_topology::format::{ClusterFile, InstanceFile, MapUnitFile};
use cdnmap_topology::Topology;
use tokio::sync::{mpsc, oneshot};

use crate::store::Store;

/// Changes waiting for the writer; a caller beyond it waits for room.
const QUEUE: usize = 64;

/// One change of the topology.
#[derive(Debug, Clone)]
pub enum Change {
    /// An operator's action on a cluster (Admin `SetClusterState`, the dashboard): logged
    /// with who did it and why.
    ClusterState {
        id: String,
        state: ClusterState,
        reason: String,
        actor: crate::dashboard::Actor,
    },
    UpsertCluster(ClusterFile),
    DeleteCluster(String),
    UpsertMapUnit(MapUnitFile),
    DeleteMapUnit(String),
}

/// What a change did.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The topology after the change (published and stored).
    pub topology: Arc<Topology>,
    /// Whether anything changed (a delete of nothing, or a state set to what it was, did not).
    pub changed: bool,
    /// For a cluster-state change: the state before.
    pub before: Option<ClusterState>,
    /// Candidate entries dropped because their cluster can no longer serve the unit's class.
    pub skipped_candidates: usize,
    /// What the operator should know: candidates dropped, classes left without an up cluster.
    pub warnings: Vec<String>,
}

/// Why a change was not carried out (the topology and the store are then unchanged).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeError {
    #[error("no cluster {0:?}")]
    NoCluster(String),
    #[error("the change is refused: {0}")]
    Refused(String),
    #[error("storing the topology failed: {0}")]
    Store(String),
    #[error("the topology writer has stopped")]
    Stopped,
}

/// Called by the writer after each change is published, before the caller is answered: the
/// action log sees changes in the order they were made.
pub type Log = Arc<dyn Fn(&Change, &Result<Applied, ChangeError>) + Send + Sync>;

struct Request {
    change: Change,
    reply: oneshot::Sender<Result<Applied, ChangeError>>,
}

/// The handle every reader and writer of the topology holds.
#[derive(Clone)]
pub struct SharedTopology {
    current: Arc<ArcSwap<Topology>>,
    tx: mpsc::Sender<Request>,
}

impl SharedTopology {
    /// Starts the writer task (on the current tokio runtime) over `initial`, the stored
    /// topology.
    pub fn start(store: Store, initial: Topology, log: Log) -> SharedTopology {
        let current = Arc::new(ArcSwap::from_pointee(initial));
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(writer(rx, Arc::clone(&current), store, log));
        SharedTopology { current, tx }
    }

    /// The published topology (the next round solves it).
    pub fn current(&self) -> Arc<Topology> {
        self.current.load_full()
    }

    /// Carries out `change`; returns once it is stored and published (or refused).
    pub async fn change(&self, change: Change) -> Result<Applied, ChangeError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request { change, reply })
            .await
            .map_err(|_| ChangeError::Stopped)?;
        answer.await.map_err(|_| ChangeError::Stopped)?
    }
}

async fn writer(
    mut rx: mpsc::Receiver<Request>,
    current: Arc<ArcSwap<Topology>>,
    store: Store,
    log: Log,
) {
    while let Some(Request { change, reply }) = rx.recv().await {
        let base = current.load_full();
        let store = store.clone();
        let job = change.clone();
        // Applying (a rebuild through the file form) and storing block: off the async threads,
        // one change at a time.
        let result = tokio::task::spawn_blocking(move || {
            let applied = apply(&base, &job)?;
            if applied.changed {
                store
                    .put_topology(&applied.topology)
                    .map_err(|e| ChangeError::Store(e.to_string()))?;
            }
            Ok(applied)
        })
        .await
        .unwrap_or_else(|e| Err(ChangeError::Store(format!("the writer's task failed: {e}"))));
        if let Ok(applied) = &result {
            if applied.changed {
                current.store(Arc::clone(&applied.topology));
            }
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

fn kind(change: &Change) -> &'static str {
    match change {
        Change::ClusterState { .. } => "cluster state",
        Change::UpsertCluster(_) => "upsert cluster",
        Change::DeleteCluster(_) => "delete cluster",
        Change::UpsertMapUnit(_) => "upsert map unit",
        Change::DeleteMapUnit(_) => "delete map unit",
    }
}

/// The names of the traffic classes no up cluster serves.
pub fn unserved_classes(instance: &Instance) -> Vec<String> {
    instance
        .classes()
        .iter()
        .enumerate()
        .filter(|&(k, _)| {
            !instance
                .clusters()
                .iter()
                .any(|c| c.state == ClusterState::Up && c.serves(k as cdnmap_mapper::ClassIdx))
        })
        .map(|(_, c)| c.name.clone())
        .collect()
}

/// `change` applied to `base`, validated like an instance file: the pure part of the writer.
pub fn apply(base: &Arc<Topology>, change: &Change) -> Result<Applied, ChangeError> {
    let unserved_before = unserved_classes(base);
    let mut applied = match change {
        Change::ClusterState { id, state, .. } => {
            let c = base
                .cluster_index(id)
                .ok_or_else(|| ChangeError::NoCluster(id.clone()))?;
            let before = base.clusters()[c as usize].state;
            Applied {
                changed: before != *state,
                topology: if before == *state {
                    Arc::clone(base)
                } else {
                    Arc::new(base.with_cluster_state(c, *state))
                },
                before: Some(before),
                skipped_candidates: 0,
                warnings: Vec::new(),
            }
        }
        Change::UpsertCluster(c) => edit(base, true, |f| upsert(&mut f.clusters, c, |c| &c.id))?,
        Change::DeleteCluster(id) => edit(base, true, |f| remove(&mut f.clusters, id, |c| &c.id))?,
        Change::UpsertMapUnit(u) => edit(base, false, |f| upsert(&mut f.map_units, u, |u| &u.id))?,
        Change::DeleteMapUnit(id) => {
            edit(base, false, |f| remove(&mut f.map_units, id, |u| &u.id))?
        }
    };
    for class in unserved_classes(&applied.topology) {
        if !unserved_before.contains(&class) {
            applied.warnings.push(format!(
                "no up cluster serves traffic class {class:?} any more: its clients get no address until one is back"
            ));
        }
    }
    Ok(applied)
}

/// Replaces the item of `list` with `item`'s id, or appends it: always a change.
fn upsert<T: Clone>(list: &mut Vec<T>, item: &T, id: impl Fn(&T) -> &String) -> bool {
    match list.iter().position(|x| id(x) == id(item)) {
        Some(i) => list[i] = item.clone(),
        None => list.push(item.clone()),
    }
    true
}

/// Removes the item of `list` with id `gone`: whether there was one.
fn remove<T>(list: &mut Vec<T>, gone: &str, id: impl Fn(&T) -> &String) -> bool {
    let before = list.len();
    list.retain(|x| id(x) != gone);
    list.len() < before
}

/// A change made to the topology's file form. With `of_clusters` (the change is to the
/// clusters), candidates whose cluster is gone or no longer serves the unit's class are
/// dropped and counted; an edit of a map unit that names such a candidate is refused, as in an
/// instance file.
fn edit(
    base: &Topology,
    of_clusters: bool,
    change: impl FnOnce(&mut InstanceFile) -> bool,
) -> Result<Applied, ChangeError> {
    let mut file = InstanceFile::of(base);
    if !change(&mut file) {
        return Ok(Applied {
            topology: Arc::new(base.clone()),
            changed: false,
            before: None,
            skipped_candidates: 0,
            warnings: Vec::new(),
        });
    }
    let skipped = if of_clusters {
        drop_unservable(&mut file)?
    } else {
        (0, 0)
    };
    let topology = file
        .build(Limits::default())
        .map_err(|e| ChangeError::Refused(e.to_string()))?;
    let mut warnings = Vec::new();
    if skipped.0 > 0 {
        warnings.push(format!(
            "{} candidate entries of {} map units dropped: their cluster is gone or no longer serves the unit's class",
            skipped.0, skipped.1
        ));
    }
    Ok(Applied {
        topology: Arc::new(topology),
        changed: true,
        before: None,
        skipped_candidates: skipped.0,
        warnings,
    })
}

/// Drops every candidate whose cluster is not in `file` or does not serve its unit's class;
/// returns (entries dropped, units touched). A cluster whose tree is invalid serves nothing
/// here, and the build refuses it with the model's error.
fn drop_unservable(file: &mut InstanceFile) -> Result<(usize, usize), ChangeError> {
    // Which classes each cluster serves, from a build of the clusters alone.
    let mut probe = file.clone();
    probe.map_units.clear();
    let clusters = probe
        .build(Limits::default())
        .map_err(|e| ChangeError::Refused(e.to_string()))?;
    let (mut entries, mut units) = (0, 0);
    for u in &mut file.map_units {
        let class = clusters.class_index(&u.class);
        let before = u.candidates.len();
        u.candidates
            .retain(|c| match (clusters.cluster_index(&c.cluster), class) {
                (Some(ci), Some(k)) => clusters.clusters()[ci as usize].serves(k),
                // An unknown class is the unit's own error, which the build names.
                (Some(_), None) => true,
                (None, _) => false,
            });
        if u.candidates.len() < before {
            entries += before - u.candidates.len();
            units += 1;
        }
    }
    Ok((entries, units))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_topology::format::parse_instance;
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
            actor: crate::dashboard::Actor::new(Some("test"), None, "test"),
        }
    }

    #[test]
    fn deleting_a_cluster_drops_its_candidates_and_counts_them() {
        let base = Arc::new(instance());
        let applied = apply(&base, &Change::DeleteCluster("b".into())).expect("applied");
        assert!(applied.changed);
        assert_eq!(applied.skipped_candidates, 2);
        assert_eq!(applied.warnings.len(), 1, "{:?}", applied.warnings);
        assert!(applied.warnings[0].contains("2 candidate entries of 2 map units"));
        let t = &applied.topology;
        assert_eq!(t.clusters().len(), 2);
        let u1 = t.unit_index("u1").expect("u1");
        assert_eq!(t.candidates(u1).count(), 1);
        // Deleting nothing changes nothing.
        let none = apply(&base, &Change::DeleteCluster("zz".into())).expect("applied");
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
        let applied = apply(&base, &Change::UpsertCluster(a)).expect("applied");
        // u3 (video) listed a; it keeps c.
        assert_eq!(applied.skipped_candidates, 1);
        let t = &applied.topology;
        let u3 = t.unit_index("u3").expect("u3");
        let left: Vec<u32> = t.candidates(u3).map(|c| c.cluster).collect();
        assert_eq!(left, vec![t.cluster_index("c").expect("c")]);
        // A unit edit that names a cluster without its class is refused, as in a file.
        let mut u = file.map_units.remove(2);
        u.candidates[0].cluster = "b".into();
        let err = apply(&applied.topology, &Change::UpsertMapUnit(u)).expect_err("refused");
        assert!(matches!(err, ChangeError::Refused(_)), "{err}");
    }

    /// A unit edit claiming a client network that another unit of its class has is refused,
    /// naming both; in another class the same network is fine.
    #[test]
    fn a_unit_claiming_another_units_network_is_refused() {
        let base = Arc::new(instance());
        let file = InstanceFile::of(&base);
        let mut u1 = file.map_units[0].clone();
        u1.prefixes = vec!["10.1.2.0/24".parse().expect("net")];
        let with = apply(&base, &Change::UpsertMapUnit(u1)).expect("applied");
        let mut u2 = file.map_units[1].clone(); // web, as u1
        u2.prefixes = vec!["10.1.2.99/24".parse().expect("net")];
        let err = apply(&with.topology, &Change::UpsertMapUnit(u2)).expect_err("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("10.1.2.0/24") && msg.contains("\"u1\"") && msg.contains("\"u2\""),
            "{msg}"
        );
        let mut u3 = file.map_units[2].clone(); // video
        u3.prefixes = vec!["10.1.2.0/24".parse().expect("net")];
        apply(&with.topology, &Change::UpsertMapUnit(u3)).expect("another class");
    }

    #[test]
    fn draining_the_last_cluster_of_a_class_warns() {
        let base = Arc::new(instance());
        let one = apply(&base, &state("c", ClusterState::Drained)).expect("applied");
        assert!(
            one.warnings.is_empty(),
            "a still serves video: {:?}",
            one.warnings
        );
        let two = apply(&one.topology, &state("a", ClusterState::Down)).expect("applied");
        assert_eq!(two.warnings.len(), 1, "{:?}", two.warnings);
        assert!(two.warnings[0].contains("\"video\""), "{:?}", two.warnings);
        assert_eq!(unserved_classes(&two.topology), vec!["video".to_string()]);
        assert_eq!(two.before, Some(ClusterState::Up));
        let err = apply(&base, &state("zz", ClusterState::Down)).expect_err("no such cluster");
        assert!(matches!(err, ChangeError::NoCluster(_)));
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
        let topology = SharedTopology::start(store.clone(), base, log);
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
}
