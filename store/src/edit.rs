//! A change of the topology as it is carried out and journaled: [`Edit`], and [`apply`], the
//! pure function from a topology and an edit to the next topology. The service's topology
//! writer (`api/src/topology.rs`) applies each change with it before storing and publishing it; the store
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
#[cfg(test)]
use cdnmap_topology::format::InstanceFile;
use cdnmap_topology::format::{cluster_file, ClusterFile, MapUnitFile};
use cdnmap_topology::Topology;
use serde::{Deserialize, Serialize};

/// One edit of the topology, as the store's journal keeps it (JSON, one per entry): what
/// [`apply`] needs and nothing else (who made it and why are the action log's).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "edit", rename_all = "snake_case", deny_unknown_fields)]
pub enum Edit {
    ClusterState {
        id: String,
        state: ClusterState,
    },
    UpsertCluster {
        cluster: ClusterFile,
    },
    DeleteCluster {
        id: String,
    },
    UpsertMapUnit {
        unit: MapUnitFile,
    },
    DeleteMapUnit {
        id: String,
    },
    /// The operator's policy replaced whole (issue 46): validated against the clusters.
    Policy {
        policy: cdnmap_mapper::model::PolicySpec,
    },
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
    /// What applying it cost, and so what replaying it will cost, in map units copied or
    /// rebuilt: [`CHEAP_EDIT_COST`] for a cluster's state or an upsert in place of a cluster,
    /// the unit count for a unit edit (its columns copied) or a rebuild through the file form.
    pub cost: u64,
}

/// What replaying a cluster's state, or a cluster upserted in place, costs, in map units
/// copied: a start replayed such edits at about 27 µs each (read, decoded and applied; 3.3 s
/// for 123,000 at 30,000 units, 2026-12-07), where copying the units takes about 0.2 µs a
/// unit (a unit edit, 0.2 s at 1 M units). Counted as 1, a snapshot came only after
/// `replay_budget` of them, a million at 1 M units: half a minute of replay at a start.
pub const CHEAP_EDIT_COST: u64 = 128;

/// Why an edit does not apply to a topology (which is then unchanged): [`apply`]'s refusal.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EditError {
    #[error("no cluster {}", cdnmap_mapper::model::shown_id(.0))]
    NoCluster(String),
    #[error("the change is refused: {0}")]
    Refused(String),
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
pub fn apply(base: &Arc<Topology>, edit: &Edit) -> Result<Applied, EditError> {
    let unserved_before = unserved_classes(base);
    let mut applied = match edit {
        Edit::ClusterState { id, state } => {
            let c = base
                .cluster_index(id)
                .ok_or_else(|| EditError::NoCluster(id.clone()))?;
            let before = base.clusters()[c as usize].state;
            Applied {
                cost: CHEAP_EDIT_COST,
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
            // In place when the units can stay as they are (the cluster exists and serves
            // the same classes): no rebuild of every unit.
            match base
                .with_cluster_replaced(c.to_spec(), c.addresses.clone())
                .map_err(|e| EditError::Refused(e.to_string()))?
            {
                Some(t) => Applied {
                    cost: CHEAP_EDIT_COST,
                    topology: Arc::new(t),
                    changed: true,
                    before: None,
                    skipped_candidates: 0,
                    warnings: Vec::new(),
                },
                None => clusters_edited(base, |list| upsert(list, c, |c| &c.id))?,
            }
        }
        Edit::DeleteCluster { id } => clusters_edited(base, |list| remove(list, id, |c| &c.id))?,
        Edit::UpsertMapUnit { unit } => {
            let mut cands = Vec::new();
            unit.candidate_specs(&mut cands);
            let upsert = [(unit.spec(&cands), unit.prefixes.as_slice())];
            units_edited(base, &upsert, &[])?
        }
        Edit::DeleteMapUnit { id } => match base.unit_index(id) {
            None => unchanged(base),
            Some(_) => units_edited(base, &[], &[id.as_str()])?,
        },
        Edit::Policy { policy } => {
            let instance = base
                .instance
                .with_policy(policy)
                .map_err(|e| EditError::Refused(e.to_string()))?;
            Applied {
                cost: CHEAP_EDIT_COST,
                changed: instance.policy() != base.instance.policy(),
                topology: Arc::new(base.with_instance(instance)),
                before: None,
                skipped_candidates: 0,
                warnings: Vec::new(),
            }
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

impl Applied {
    /// `topology`, made from `base` by copying or rebuilding its units (what that costs to
    /// replay), with `entries` candidate entries of `units` map units dropped.
    fn rebuilt(base: &Topology, topology: Topology, entries: usize, units: usize) -> Applied {
        Applied {
            cost: base.unit_count().max(1) as u64,
            topology: Arc::new(topology),
            changed: true,
            before: None,
            skipped_candidates: entries,
            warnings: dropped_warning(entries, units),
        }
    }
}

/// `base` as it is: an edit that changed nothing.
fn unchanged(base: &Arc<Topology>) -> Applied {
    Applied {
        cost: 1,
        topology: Arc::clone(base),
        changed: false,
        before: None,
        skipped_candidates: 0,
        warnings: Vec::new(),
    }
}

/// `base` with map units upserted and deleted in place (`Topology::with_units_edited`: the
/// edited units validated as a file's, every other unit's columns copied), where a rebuild
/// through the file form held every unit as strings (at 1 M map units, 1.4 s an edit; at
/// 11 M, gigabytes): always a change.
fn units_edited(
    base: &Topology,
    upserts: &[(cdnmap_mapper::MapUnitSpec<'_>, &[ipnet::IpNet])],
    deletes: &[&str],
) -> Result<Applied, EditError> {
    let topology = base
        .with_units_edited(upserts, deletes, Limits::default())
        .map_err(|e| EditError::Refused(e.to_string()))?;
    Ok(Applied::rebuilt(base, topology, 0, 0))
}

/// `base` with its cluster list changed by `change` (as files), the units kept
/// (`Topology::with_clusters`: each candidate follows its cluster, and those of a cluster gone
/// or no longer serving the unit's class are dropped and counted), in one pass over the
/// candidates; unchanged when `change` says nothing changed.
fn clusters_edited(
    base: &Arc<Topology>,
    change: impl FnOnce(&mut Vec<ClusterFile>) -> bool,
) -> Result<Applied, EditError> {
    let mut files: Vec<ClusterFile> = (0..base.clusters().len())
        .map(|c| cluster_file(base, c as cdnmap_mapper::ClusterIdx))
        .collect();
    if !change(&mut files) {
        return Ok(unchanged(base));
    }
    let list = files
        .iter()
        .map(|f| (f.to_spec(), f.addresses.clone()))
        .collect();
    let (topology, entries, units) = base
        .with_clusters(list, Limits::default())
        .map_err(|e| EditError::Refused(e.to_string()))?;
    Ok(Applied::rebuilt(base, topology, entries, units))
}

/// The warning of candidates dropped with a cluster, if any were.
fn dropped_warning(entries: usize, units: usize) -> Vec<String> {
    if entries == 0 {
        return Vec::new();
    }
    vec![format!(
        "{entries} candidate entries of {units} map units dropped: their cluster is gone or no longer serves the unit's class"
    )]
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

/// The oracle of the edits in place (tests only): a change made to the topology's file form,
/// rebuilt. With `of_clusters` (the change is to the
/// clusters), candidates whose cluster is gone or no longer serves the unit's class are
/// dropped and counted; an edit of a map unit that names such a candidate is refused, as in an
/// instance file.
#[cfg(test)]
fn rebuild(
    base: &Topology,
    of_clusters: bool,
    change: impl FnOnce(&mut InstanceFile) -> bool,
) -> Result<Applied, EditError> {
    let mut file = InstanceFile::of(base);
    if !change(&mut file) {
        return Ok(Applied {
            cost: base.unit_count().max(1) as u64,
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
        .map_err(|e| EditError::Refused(e.to_string()))?;
    Ok(Applied::rebuilt(base, topology, skipped.0, skipped.1))
}

/// Drops every candidate whose cluster is not in `file` or does not serve its unit's class;
/// returns (entries dropped, units touched). A cluster whose tree is invalid serves nothing
/// here, and the build refuses it with the model's error.
#[cfg(test)]
fn drop_unservable(file: &mut InstanceFile) -> Result<(usize, usize), EditError> {
    // Which classes each cluster serves, from a build of the clusters alone.
    let mut probe = file.clone();
    probe.map_units.clear();
    let clusters = probe
        .build(Limits::default())
        .map_err(|e| EditError::Refused(e.to_string()))?;
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
    use cdnmap_topology::format::{parse_instance, unit_file};
    use rand::{Rng, SeedableRng};

    /// A world of `n` units over 6 clusters and 2 classes, with prefixes.
    fn world(n: usize) -> Topology {
        let clusters: Vec<String> = (0..6)
            .map(|c| {
                format!(
                    r#"{{"id": "c{c}", "lat": {c}, "lon": 0, "addresses": ["198.18.0.{c}"],
                      "resources": {{"name": "r", "kind": "bps", "capacity": 100,
                                     "classes": ["web", "video"]}}}}"#
                )
            })
            .collect();
        let units: Vec<String> = (0..n)
            .map(|u| {
                let class = ["web", "video"][u % 2];
                let rank = if u % 5 == 0 {
                    r#", "cluster_rank": 2"#
                } else {
                    ""
                };
                format!(
                    r#"{{"id": "u{u:04}", "class": "{class}", "demand": {d}, "lat": 1, "lon": 2,
                      "prefixes": ["10.{a}.{b}.0/24"],
                      "candidates": [{{"cluster": "c{x}", "score": {s}{rank}}},
                                     {{"cluster": "c{y}", "score": 3}}]}}"#,
                    d = u % 7,
                    a = u / 256,
                    b = u % 256,
                    x = u % 6,
                    y = (u + 1) % 6,
                    s = (u % 3) as f64 * 0.5,
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [
                {{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 0}}}},
                {{"name": "video", "priority": 1, "per_unit": {{"bps": 1, "fps": 0}}}}],
              "clusters": [{}], "map_units": [{}]}}"#,
            clusters.join(","),
            units.join(",")
        );
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    /// Unit upserts and deletes in place give exactly the topology the file form rebuilds
    /// (the oracle): random edits of existing units, new units at every position, deletes
    /// of present and absent ids, new units with explicit ranks, and the errors alike.
    #[test]
    fn unit_edits_in_place_equal_the_rebuild_through_the_file_form() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(16);
        let mut now = Arc::new(world(300));
        let mut next_new = 0;
        for step in 0..400 {
            let n = now.unit_count();
            let edit = match rng.random_range(0..5) {
                0 | 1 if n > 0 => {
                    let mut u = unit_file(&now, rng.random_range(0..n) as u32);
                    u.demand = rng.random_range(0.0..10.0);
                    u.lat = rng.random_range(-80.0..80.0);
                    u.candidates.reverse();
                    if rng.random_bool(0.3) {
                        u.candidates.pop();
                    }
                    if let Some(c) = u.candidates.first_mut().filter(|_| rng.random_bool(0.2)) {
                        c.cluster_rank = Some(rng.random_range(0.0..5.0));
                    }
                    Edit::UpsertMapUnit { unit: u }
                }
                2 => {
                    // A new unit: an id anywhere in the order, a network of its own (or,
                    // now and then, one another unit of its class has: refused).
                    next_new += 1;
                    let mut u = unit_file(&now, rng.random_range(0..n.max(1)) as u32);
                    u.id = format!("u{:04}x{next_new}", rng.random_range(0..400));
                    if rng.random_bool(0.9) {
                        u.prefixes = vec![format!("10.200.{}.0/24", next_new % 250)
                            .parse()
                            .expect("net")];
                        u.prefixes.retain(|_| next_new < 250);
                    }
                    Edit::UpsertMapUnit { unit: u }
                }
                3 if n > 0 => Edit::DeleteMapUnit {
                    id: now.unit_id(rng.random_range(0..n) as u32).to_string(),
                },
                _ => Edit::DeleteMapUnit {
                    id: format!("nobody{step}"),
                },
            };
            let oracle = match &edit {
                Edit::UpsertMapUnit { unit } => {
                    rebuild(&now, false, |f| upsert(&mut f.map_units, unit, |u| &u.id))
                }
                Edit::DeleteMapUnit { id } => {
                    rebuild(&now, false, |f| remove(&mut f.map_units, id, |u| &u.id))
                }
                _ => unreachable!("unit edits only"),
            };
            let got = apply(&now, &edit);
            match (oracle, got) {
                (Ok(want), Ok(got)) => {
                    assert_eq!(got.changed, want.changed, "step {step}: {edit:?}");
                    assert_eq!(*got.topology, *want.topology, "step {step}: {edit:?}");
                    now = got.topology;
                }
                (Err(want), Err(got)) => {
                    assert_eq!(got.to_string(), want.to_string(), "step {step}")
                }
                (want, got) => panic!("step {step}: {edit:?}: {want:?} vs {got:?}"),
            }
        }
        assert!(now.unit_count() > 100, "the edits kept a world to edit");
        // The units with explicit ranks deleted one by one: the last one takes the ranks
        // away in both.
        let ranked: Vec<String> = (0..now.unit_count() as u32)
            .map(|u| unit_file(&now, u))
            .filter(|u| u.candidates.iter().any(|c| c.cluster_rank.is_some()))
            .map(|u| u.id)
            .collect();
        assert!(!ranked.is_empty());
        for id in ranked {
            let want =
                rebuild(&now, false, |f| remove(&mut f.map_units, &id, |u| &u.id)).expect("oracle");
            let got = apply(&now, &Edit::DeleteMapUnit { id: id.clone() }).expect("delete");
            assert_eq!(*got.topology, *want.topology, "deleting {id}");
            now = got.topology;
        }
    }

    /// A cluster upsert in place (the same id, the same classes: capacity, tree, addresses,
    /// state, location changed) gives exactly the topology the file form rebuilds; one that
    /// adds a cluster or changes its classes is rebuilt, and a bad tree is refused alike.
    #[test]
    fn cluster_edits_in_place_equal_the_rebuild_through_the_file_form() {
        use cdnmap_topology::format::cluster_file;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        let mut now = Arc::new(world(200));
        // Edits that dropped candidates.
        let mut dropping = 0;
        for step in 0..80 {
            let c = rng.random_range(0..now.clusters().len()) as u32;
            let mut file = cluster_file(&now, c);
            let (edit, oracle) = if rng.random_bool(0.05) && now.clusters().len() > 2 {
                let id = file.id.clone();
                let oracle = rebuild(&now, true, |f| remove(&mut f.clusters, &id, |c| &c.id));
                (Edit::DeleteCluster { id }, oracle)
            } else {
                cluster_changed(&mut rng, &mut file, step);
                let oracle = rebuild(&now, true, |f| upsert(&mut f.clusters, &file, |c| &c.id));
                (Edit::UpsertCluster { cluster: file }, oracle)
            };
            let got = apply(&now, &edit);
            match (oracle, got) {
                (Ok(want), Ok(got)) => {
                    assert_eq!(*got.topology, *want.topology, "step {step}: {edit:?}");
                    assert_eq!(got.skipped_candidates, want.skipped_candidates);
                    // `apply` adds the classes left without an up cluster after the rebuild's.
                    assert!(
                        got.warnings.starts_with(&want.warnings),
                        "{:?}",
                        got.warnings
                    );
                    dropping += usize::from(got.skipped_candidates > 0);
                    now = got.topology;
                }
                (Err(want), Err(got)) => {
                    assert_eq!(got.to_string(), want.to_string(), "step {step}")
                }
                (want, got) => panic!("step {step}: {edit:?}: {want:?} vs {got:?}"),
            }
        }
        assert!(now.total_candidates() > 0);
        assert!(dropping >= 3, "only {dropping} edits dropped candidates");
    }

    /// One random change of a cluster's file: its place, addresses, state, tree, capacity,
    /// classes (fewer, back, or one that does not exist) or id (a new cluster).
    fn cluster_changed(
        rng: &mut rand_chacha::ChaCha8Rng,
        file: &mut cdnmap_topology::format::ClusterFile,
        step: usize,
    ) {
        use cdnmap_topology::format::{NestedNode, ResourcesFile};
        match rng.random_range(0..8) {
            0 => file.lat = rng.random_range(-80.0..80.0),
            6 => {
                // One class fewer (its units' candidates here go), or both again.
                if let ResourcesFile::Nested(root) = &mut file.resources {
                    let classes = [vec!["web".to_string()], vec!["video".to_string()]];
                    root.classes = if root.classes.len() == 2 {
                        classes[step % 2].clone()
                    } else {
                        vec!["web".into(), "video".into()]
                    };
                    root.children.clear();
                }
            }
            7 => {
                if let ResourcesFile::Nested(root) = &mut file.resources {
                    root.classes = vec!["opera".into()];
                    root.children.clear();
                }
            }
            1 => file.addresses = vec![format!("198.19.{step}.1").parse().expect("ip")],
            2 => file.state = ClusterState::Drained,
            3 => {
                // A deeper tree: the root over a leaf of the same classes.
                if let ResourcesFile::Nested(root) = &mut file.resources {
                    let leaf = NestedNode {
                        name: format!("leaf{step}"),
                        children: Vec::new(),
                        ..root.clone()
                    };
                    root.classes = Vec::new();
                    root.children = vec![leaf];
                }
            }
            4 => file.id = format!("c{step}new"),
            _ => {
                if let ResourcesFile::Nested(root) = &mut file.resources {
                    root.capacity = rng.random_range(-1.0..500.0);
                }
            }
        }
    }
}
