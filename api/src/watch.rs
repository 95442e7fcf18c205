//! WatchMap's messages, the mapper's side: a published [`Snapshot`] as a full map or as the
//! delta from the version before, and the protobuf form of a cluster's state. This module and
//! `dns::local` (which applies them) are the only places that convert WatchMap messages; every
//! share a front end holds comes from [`crate::round::shares`], like the deltas' comparison.

use cdnmap_mapper::servers::Policy;
use cdnmap_mapper::{ClusterState, UnitIdx};
use cdnmap_proto::v1 as pb;

use crate::config::Config;
use crate::round::{changed_units, Snapshot};
use crate::selection::ServerLoads;

/// What a message carries besides the snapshot: each cluster's selection policy (by cluster
/// index of the snapshot's instance), the last reported server loads, and the configuration's
/// hostname rules and default class.
pub struct Edge<'a> {
    policies: &'a [Policy],
    loads: Option<&'a ServerLoads>,
    config: &'a Config,
}

impl<'a> Edge<'a> {
    pub fn new(policies: &'a [Policy], loads: Option<&'a ServerLoads>, config: &'a Config) -> Self {
        Edge {
            policies,
            loads,
            config,
        }
    }
}

/// A cluster's state on the wire.
pub fn state_pb(state: ClusterState) -> pb::ClusterState {
    match state {
        ClusterState::Up => pb::ClusterState::Up,
        ClusterState::Drained => pb::ClusterState::Drained,
        ClusterState::Down => pb::ClusterState::Down,
    }
}

/// A cluster's state from the wire: `None` for `UNSPECIFIED` (each caller says what that
/// means) and for a number that is no state.
pub fn state_from_pb(value: i32) -> Option<ClusterState> {
    match pb::ClusterState::try_from(value) {
        Ok(pb::ClusterState::Up) => Some(ClusterState::Up),
        Ok(pb::ClusterState::Drained) => Some(ClusterState::Drained),
        Ok(pb::ClusterState::Down) => Some(ClusterState::Down),
        Ok(pb::ClusterState::Unspecified) | Err(_) => None,
    }
}

fn unit_pb(s: &Snapshot, u: UnitIdx) -> pb::UnitMapping {
    let (placed, overflow_share) = crate::round::shares(s, u);
    let clusters = s.instance.clusters();
    pb::UnitMapping {
        id: s.instance.unit_id(u).to_string(),
        traffic_class: s.instance.classes()[usize::from(s.instance.unit_class(u))]
            .name
            .clone(),
        prefixes: s
            .instance
            .unit_prefixes(u)
            .iter()
            .map(|p| p.to_string())
            .collect(),
        shares: placed
            .into_iter()
            .map(|(c, share)| pb::ClusterShare {
                cluster: clusters[c as usize].id.clone(),
                share,
            })
            .collect(),
        overflow_share,
        backup_cluster: s
            .resolver
            .backup(u)
            .map_or(String::new(), |c| clusters[c as usize].id.clone()),
    }
}

fn clusters_pb(edge: &Edge<'_>, s: &Snapshot) -> Vec<pb::ClusterAddresses> {
    let (policies, loads) = (edge.policies, edge.loads);
    s.instance
        .clusters()
        .iter()
        .zip(policies)
        .map(|(c, policy)| pb::ClusterAddresses {
            id: c.id.clone(),
            addresses: c.addresses.iter().map(|a| a.to_string()).collect(),
            state: state_pb(c.state) as i32,
            selection: Some(crate::selection::policy_pb(policy)),
            server_loads: c
                .addresses
                .iter()
                .map(|&a| loads.map_or(0.0, |l| l.get(&c.id, a)))
                .collect(),
        })
        .collect()
}

/// Per class, its fallback clusters.
fn fallbacks_pb(s: &Snapshot) -> Vec<pb::ClassFallback> {
    let clusters = s.instance.clusters();
    s.instance
        .classes()
        .iter()
        .enumerate()
        .map(|(k, class)| pb::ClassFallback {
            traffic_class: class.name.clone(),
            clusters: s
                .resolver
                .fallback(k as cdnmap_mapper::ClassIdx)
                .into_iter()
                .flatten()
                .map(|c| clusters[c as usize].id.clone())
                .collect(),
        })
        .collect()
}

fn rules_pb(edge: &Edge<'_>) -> Vec<pb::ClassRule> {
    edge.config
        .class_rules
        .iter()
        .map(|r| pb::ClassRule {
            pattern: r.pattern.clone(),
            traffic_class: r.class.clone(),
        })
        .collect()
}

/// The whole map of `s`: what a front end joining, or fallen behind, starts from.
pub fn full_update(edge: &Edge<'_>, s: &Snapshot) -> pb::MapUpdate {
    pb::MapUpdate {
        epoch: s.epoch,
        version: s.version,
        full: true,
        base_epoch: 0,
        base_version: 0,
        units: (0..s.instance.unit_count() as UnitIdx)
            .map(|u| unit_pb(s, u))
            .collect(),
        removed_units: Vec::new(),
        clusters: clusters_pb(edge, s),
        class_rules: rules_pb(edge),
        default_class: edge.config.default_class.clone(),
        solved_at_unix_ms: s.solved_at_unix_ms,
        fallbacks: fallbacks_pb(s),
    }
}

/// What changed from `prev` to `next` (by map unit id): the units whose answer may differ,
/// the units gone, and the clusters, rules and fallbacks whole.
pub fn delta_update(edge: &Edge<'_>, prev: &Snapshot, next: &Snapshot) -> pb::MapUpdate {
    let (changed, removed) = changed_units(prev, next);
    pb::MapUpdate {
        epoch: next.epoch,
        version: next.version,
        full: false,
        base_epoch: prev.epoch,
        base_version: prev.version,
        units: changed.into_iter().map(|u| unit_pb(next, u)).collect(),
        removed_units: removed,
        clusters: clusters_pb(edge, next),
        class_rules: rules_pb(edge),
        default_class: edge.config.default_class.clone(),
        solved_at_unix_ms: next.solved_at_unix_ms,
        fallbacks: fallbacks_pb(next),
    }
}
