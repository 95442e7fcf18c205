//! A change of the topology as it is carried out and journaled: [`Edit`], and [`apply`], the
//! pure function from a topology and an edit to the next topology. The topology writer
//! (`topology.rs`) applies each change with it before storing and publishing it; the store
//! keeps every acknowledged edit in its journal and a start replays them with the same
//! function onto the last snapshot, so what a start serves is what the writer published.
//!
//! **What an edit does to candidates.** Deleting a cluster, or removing a class from a
//! cluster (an upsert whose resource tree no longer serves it), leaves some map units with a
//! candidate that can no longer serve their class. The edit is not refused for that: those
//! candidates are dropped from the units' lists, and the answer counts them
//! ([`Applied::skipped_candidates`], [`Applied::warnings`]). A unit left with no candidate is
//! still mapped: its demand is overflow and it is answered by its class's fallback. An edit
//! that leaves a traffic class with no up cluster serving it (draining or deleting the last
//! one) is carried out too, with a warning.

use std::sync::Arc;

use cdnmap_mapper::{ClusterState, Instance, Limits};
use cdnmap_topology::format::{ClusterFile, InstanceFile, MapUnitFile};
use cdnmap_topology::Topology;
use serde::{Deserialize, Serialize};

/// One edit of the topology, as the store's journal keeps it (JSON, one per entry): what
/// [`apply`] needs and nothing else (who made it and why are the action log's).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "edit", rename_all = "snake_case", deny_unknown_fields)]
pub enum Edit {
    ClusterState { id: String, state: ClusterState },
    UpsertCluster { cluster: ClusterFile },
    DeleteCluster { id: String },
    UpsertMapUnit { unit: MapUnitFile },
    DeleteMapUnit { id: String },
}

impl Edit {
    /// What replaying this edit costs, in map units rebuilt: a cluster's state is set
    /// without touching the units (1); every other edit rebuilds the topology (its units).
    pub fn replay_cost(&self, units: usize) -> u64 {
        match self {
            Edit::ClusterState { .. } => 1,
            _ => units.max(1) as u64,
        }
    }
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

/// Why an edit was not carried out (the topology and the store are then unchanged).
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

/// `edit` applied to `base`, validated like an instance file: the pure part of the writer,
/// and what a start replays from the store's journal (the same edit on the same topology
/// gives the same topology).
pub fn apply(base: &Arc<Topology>, edit: &Edit) -> Result<Applied, ChangeError> {
    let unserved_before = unserved_classes(base);
    let mut applied = match edit {
        Edit::ClusterState { id, state } => {
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
        Edit::UpsertCluster { cluster: c } => {
            rebuild(base, true, |f| upsert(&mut f.clusters, c, |c| &c.id))?
        }
        Edit::DeleteCluster { id } => {
            rebuild(base, true, |f| remove(&mut f.clusters, id, |c| &c.id))?
        }
        Edit::UpsertMapUnit { unit: u } => {
            rebuild(base, false, |f| upsert(&mut f.map_units, u, |u| &u.id))?
        }
        Edit::DeleteMapUnit { id } => {
            rebuild(base, false, |f| remove(&mut f.map_units, id, |u| &u.id))?
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
fn rebuild(
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
