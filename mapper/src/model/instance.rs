//! The instance: its parts behind `Arc`s, the accessors of its classes, clusters and unit
//! columns, and the instances derived from it (a cluster's state, other demands
//! `with_demands`, other coefficients and capacities `with_costs`/`with_capacities`).
//!
//! Promises: an [`Instance`] is immutable and valid by construction; a derived instance
//! validates what it takes (refusing it with an error naming the input) and shares every part
//! that did not change, so cloning and deriving are cheap.

use std::sync::Arc;

use super::columns::{CandidateColumns, Head, MapUnits};
use super::favour::Favour;
use super::limits::{check_companion_share, check_number, ClassIdx, ClusterIdx, UnitIdx};
use super::topology::{
    build_cluster, Cluster, ClusterSpec, ClusterState, PerUnit, Topology, TrafficClass,
};
use crate::error::ModelError;

/// A validated, indexed, immutable problem instance. Cloning is cheap (three reference counts);
/// instances derived from it (other preferences, a cluster's state) share what did not change.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub(super) topology: Arc<Topology>,
    pub(crate) units: Arc<MapUnits>,
    /// Each unit's demand, apart from the other unit columns: a round's forecast changes it
    /// alone ([`Instance::with_demands`]).
    pub(crate) demand: Arc<Vec<f64>>,
    pub(crate) cands: Arc<CandidateColumns>,
    /// Stickiness's changes to the candidates, if any.
    pub(crate) favour: Option<Arc<Favour>>,
}

impl Instance {
    pub fn classes(&self) -> &[TrafficClass] {
        &self.topology.classes
    }

    pub fn clusters(&self) -> &[Cluster] {
        &self.topology.clusters
    }

    pub fn class_index(&self, name: &str) -> Option<ClassIdx> {
        self.topology.class_by_name.get(name).copied()
    }

    pub fn cluster_index(&self, id: &str) -> Option<ClusterIdx> {
        self.topology.cluster_by_id.get(id).copied()
    }

    /// The map unit with this id (binary search: units are sorted by id).
    pub fn unit_index(&self, id: &str) -> Option<UnitIdx> {
        self.units.ids.binary_search(id).ok().map(|i| i as UnitIdx)
    }

    /// Number of resource nodes over all clusters.
    pub fn node_count(&self) -> usize {
        self.topology.node_offset.last().copied().unwrap_or(0) as usize
    }

    /// Global index of `cluster`'s local node `node` (0..node_count()).
    pub fn global_node(&self, cluster: ClusterIdx, node: u32) -> usize {
        (self.topology.node_offset[cluster as usize] + node) as usize
    }

    pub fn unit_count(&self) -> usize {
        self.units.ids.len()
    }

    pub fn unit_id(&self, u: UnitIdx) -> &str {
        self.units.ids.get(u as usize)
    }

    /// Every unit's id, concatenated in unit order, and where each one ends in that text (a
    /// column to store as it is).
    pub fn unit_id_column(&self) -> (&str, &[u32]) {
        self.units.ids.parts()
    }

    /// Whether `other` has the same map units by id, in the same order, so that a column by
    /// unit index of one is one of the other. Instances derived from one another share their
    /// unit columns, and the check is then a pointer comparison; otherwise the ids are compared.
    pub fn same_unit_ids(&self, other: &Instance) -> bool {
        self.shares_units(other) || self.units.ids == other.units.ids
    }

    /// Whether `other` shares this instance's unit columns (ids, classes, locations): one
    /// pointer comparison, true for instances derived from one another by their demand,
    /// costs, cluster states or preferences.
    pub fn shares_units(&self, other: &Instance) -> bool {
        Arc::ptr_eq(&self.units, &other.units)
    }

    /// Whether `other` has this instance's candidates, in the same order for every unit: one
    /// copy of the candidate columns and the same (or no) stickiness changes to them.
    pub fn shares_candidates(&self, other: &Instance) -> bool {
        Arc::ptr_eq(&self.cands, &other.cands)
            && match (&self.favour, &other.favour) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }

    pub fn unit_class(&self, u: UnitIdx) -> ClassIdx {
        self.units.class[u as usize]
    }

    pub fn unit_demand(&self, u: UnitIdx) -> f64 {
        self.demand[u as usize]
    }

    /// Every unit's demand, by unit index (what the store encodes without a copy).
    pub fn demands(&self) -> &[f64] {
        &self.demand
    }

    pub fn unit_location(&self, u: UnitIdx) -> (f64, f64) {
        (
            f64::from(self.units.lat[u as usize]),
            f64::from(self.units.lon[u as usize]),
        )
    }

    /// Number of candidates of unit `u`.
    pub fn candidate_count(&self, u: UnitIdx) -> usize {
        let u = u as usize;
        (self.units.cand_start[u + 1] - self.units.cand_start[u]) as usize
    }

    /// Total number of candidates over all map units.
    pub fn total_candidates(&self) -> usize {
        self.cands.cluster.len()
    }

    pub fn total_demand(&self) -> f64 {
        self.demand.iter().sum()
    }

    /// The operator's policy (issue 46).
    pub fn policy(&self) -> &super::policy::Policy {
        &self.topology.policy
    }

    /// The clusters' ids, in index order.
    pub fn cluster_ids(&self) -> Vec<&str> {
        self.topology.cluster_ids()
    }

    /// The same instance with the operator's policy `spec` (validated against its clusters),
    /// sharing the map units and candidates.
    pub fn with_policy(&self, spec: &super::policy::PolicySpec) -> Result<Instance, ModelError> {
        let mut topology = (*self.topology).clone();
        topology.policy = super::policy::Policy::of(spec, &topology.cluster_ids())?;
        Ok(self.with_topology(topology))
    }

    /// The same instance with cluster `cluster` in `state` (drained and down clusters take no
    /// demand). Shares the map units and candidates.
    pub fn with_cluster_state(&self, cluster: ClusterIdx, state: ClusterState) -> Instance {
        let mut topology = (*self.topology).clone();
        if let Some(c) = topology.clusters.get_mut(cluster as usize) {
            c.state = state;
        }
        self.with_topology(topology)
    }

    /// The same instance with cluster `spec.id` replaced by `spec` (validated as an instance
    /// file's cluster: its resource tree, its classes), sharing the map units and candidates:
    /// an operator's edit of a cluster's capacity, tree, location or state. `None` when that
    /// cannot leave the units as they are — no cluster has that id (a new one renumbers the
    /// clusters after it), or the cluster would serve other classes than it does (candidates
    /// would have to go) — and the caller rebuilds instead.
    pub fn with_cluster_replaced(&self, spec: ClusterSpec) -> Result<Option<Instance>, ModelError> {
        let Some(c) = self.cluster_index(&spec.id) else {
            return Ok(None);
        };
        let cluster = build_cluster(spec, &self.topology.class_by_name)?;
        let old = &self.topology.clusters[c as usize];
        let classes = self.classes().len() as ClassIdx;
        if (0..classes).any(|k| old.serves(k) != cluster.serves(k)) {
            return Ok(None);
        }
        let mut topology = (*self.topology).clone();
        topology.clusters[c as usize] = cluster;
        let mut total = 0u32;
        for (i, cl) in topology.clusters.iter().enumerate() {
            topology.node_offset[i] = total;
            total += cl.nodes.len() as u32;
        }
        if let Some(last) = topology.node_offset.last_mut() {
            *last = total;
        }
        Ok(Some(self.with_topology(topology)))
    }

    /// The same instance with each unit's demand replaced (`demands[u]` for unit index `u`),
    /// sharing every other column: what a round's forecast changes. Refused, naming the unit,
    /// when a demand is not a finite number >= 0 or the count is not the unit count.
    pub fn with_demands(&self, demands: Vec<f64>) -> Result<Instance, ModelError> {
        if demands.len() != self.unit_count() {
            return Err(ModelError::MapShape {
                map_units: demands.len(),
                instance_units: self.unit_count(),
            });
        }
        if let Some(u) = demands.iter().position(|d| !(d.is_finite() && *d >= 0.0)) {
            check_number(
                || format!("map unit {:?}", self.unit_id(u as UnitIdx)),
                "demand",
                demands[u],
            )?;
        }
        Ok(Instance {
            topology: Arc::clone(&self.topology),
            units: Arc::clone(&self.units),
            demand: Arc::new(demands),
            cands: Arc::clone(&self.cands),
            favour: self.favour.clone(),
        })
    }

    /// The same instance with other costs: each class's coefficients (`per_unit`, by class
    /// index) and each cluster's capacities multiplied by `capacity_factor` (by cluster index),
    /// sharing the map units and candidates: what learned coefficients and derating change.
    /// Refused, naming the class or cluster, when a number is not finite and >= 0 or a count
    /// does not match.
    pub fn with_costs(
        &self,
        per_unit: &[PerUnit],
        capacity_factor: &[f64],
    ) -> Result<Instance, ModelError> {
        let clusters = self.clusters();
        if capacity_factor.len() != clusters.len() {
            return Err(ModelError::TooMany {
                subject: "the capacity factors".into(),
                what: "clusters (one per cluster is needed)",
                count: capacity_factor.len(),
                limit: clusters.len(),
            });
        }
        let mut capacities = Vec::with_capacity(self.node_count());
        for (cluster, &f) in clusters.iter().zip(capacity_factor) {
            check_number(|| format!("cluster {:?}", cluster.id), "capacity factor", f)?;
            capacities.extend(cluster.nodes.iter().map(|n| {
                if f == 1.0 {
                    n.capacity
                } else {
                    n.capacity * f
                }
            }));
        }
        self.with_capacities(per_unit, &capacities)
    }

    /// The same instance with each class's companion share (by class index: go with the
    /// winner, [`crate::companion`]), sharing everything else; refused, naming the class, when
    /// a share is not in [0, 0.5] or the count does not match.
    pub fn with_companion_shares(&self, shares: &[f64]) -> Result<Instance, ModelError> {
        let mut topology = (*self.topology).clone();
        if shares.len() != topology.classes.len() {
            return Err(ModelError::TooMany {
                subject: "the companion shares".into(),
                what: "classes (one per traffic class is needed)",
                count: shares.len(),
                limit: topology.classes.len(),
            });
        }
        for (class, &share) in topology.classes.iter_mut().zip(shares) {
            check_companion_share(|| format!("traffic class {:?}", class.name), share)?;
            class.companion_share = share;
        }
        Ok(self.with_topology(topology))
    }

    /// Every resource node's capacity (by global node index), as [`Instance::with_capacities`]
    /// takes them back.
    pub fn capacities(&self) -> Vec<f64> {
        self.clusters()
            .iter()
            .flat_map(|c| c.nodes.iter().map(|n| n.capacity))
            .collect()
    }

    /// The same instance with other coefficients (by class index) and node capacities (by
    /// global node index), sharing the map units and candidates: how a stored round's instance
    /// is read back exactly. Refused, naming the class or node, when a number is not finite
    /// and >= 0 or a count does not match.
    pub fn with_capacities(
        &self,
        per_unit: &[PerUnit],
        capacities: &[f64],
    ) -> Result<Instance, ModelError> {
        let mut topology = (*self.topology).clone();
        if per_unit.len() != topology.classes.len() {
            return Err(ModelError::TooMany {
                subject: "the coefficients".into(),
                what: "classes (one per traffic class is needed)",
                count: per_unit.len(),
                limit: topology.classes.len(),
            });
        }
        if capacities.len() != self.node_count() {
            return Err(ModelError::TooMany {
                subject: "the capacities".into(),
                what: "resource nodes (one per node is needed)",
                count: capacities.len(),
                limit: self.node_count(),
            });
        }
        for (class, p) in topology.classes.iter_mut().zip(per_unit) {
            let subject = || format!("traffic class {:?}", class.name);
            check_number(subject, "per_unit.bps", p.bps)?;
            check_number(subject, "per_unit.fps", p.fps)?;
            class.per_unit = *p;
        }
        let mut next = capacities.iter();
        for cluster in &mut topology.clusters {
            for n in &mut cluster.nodes {
                let c = next.next().copied().unwrap_or_default();
                check_number(
                    || format!("cluster {:?}, node {:?}", cluster.id, n.name),
                    "capacity",
                    c,
                )?;
                n.capacity = c;
            }
        }
        Ok(self.with_topology(topology))
    }

    fn with_topology(&self, topology: Topology) -> Instance {
        Instance {
            topology: Arc::new(topology),
            units: Arc::clone(&self.units),
            demand: Arc::clone(&self.demand),
            cands: Arc::clone(&self.cands),
            favour: self.favour.clone(),
        }
    }

    /// Bytes held by this instance's heap allocations (map units dominate; an estimate for the
    /// string and hash-map parts).
    pub fn heap_bytes(&self) -> usize {
        let u = &self.units;
        u.ids.heap_bytes()
            + u.class.capacity() * 2
            + self.demand.capacity() * 8
            + (u.lat.capacity() + u.lon.capacity()) * 4
            + u.cand_start.capacity() * 4
            + self.cands.cluster.capacity() * 4
            + self.cands.score.capacity() * 4
            + self.cands.rank.as_ref().map_or(0, |r| r.capacity() * 4)
            + self.cands.head.capacity() * std::mem::size_of::<Head>()
            + self.favour.as_ref().map_or(0, |f| {
                f.start.capacity() * 4
                    + f.favoured.capacity() * 8
                    + f.moved.cluster.capacity() * 4
                    + f.moved.score.capacity() * 4
                    + f.moved.rank.as_ref().map_or(0, |r| r.capacity() * 4)
            })
    }
}
