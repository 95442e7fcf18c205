//! Classes and clusters: the traffic classes, the clusters with their resource trees, their
//! validation ([`build_cluster`]), and [`Topology`], what every round's instance shares unless
//! the topology changes.
//!
//! Promises: a validated [`Cluster`]'s nodes are in pre-order (the root is node 0, every parent
//! before its children); it has exactly one root, no cycle, no shared or unknown child; every
//! class it serves sits on exactly one leaf, and every class its `serves` names has one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::limits::{
    check_id, check_location, check_number, too_many, ClassIdx, ClusterIdx, MAX_TREE_DEPTH,
    MAX_TREE_NODES,
};
use crate::error::ModelError;

/// What a resource node measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceKind {
    /// Bytes per second (e.g. an uplink).
    Bps,
    /// "Flytes" per second: the CPU-ish resource.
    Fps,
}

/// A cluster's liveness. Only `Up` clusters take demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClusterState {
    #[default]
    Up,
    /// Taken out of service by an operator: takes no new demand.
    Drained,
    /// Failed: takes no demand.
    Down,
}

/// What one unit of demand of a class consumes on each kind of resource node it passes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerUnit {
    pub bps: f64,
    pub fps: f64,
}

impl PerUnit {
    pub fn get(&self, kind: ResourceKind) -> f64 {
        match kind {
            ResourceKind::Bps => self.bps,
            ResourceKind::Fps => self.fps,
        }
    }
}

/// A kind of traffic with its own resource profile. Lower `priority` is preferred by clusters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficClass {
    pub name: String,
    pub priority: u32,
    pub per_unit: PerUnit,
    /// Go with the winner: the share of each unit's demand that a second cluster's address
    /// in its answers draws (clients connect to more than one address, or resolvers put
    /// the second first), reserved for it at a companion cluster ([`crate::companion`]).
    /// 0 (the default): answers name only the clusters the map gives the unit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub companion_share: f64,
}

fn is_zero(x: &f64) -> bool {
    x.to_bits() == 0
}

/// One resource node as given in input: children and classes by name, so that a bad tree
/// (cycle, shared child, unknown child) can be described and refused.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceNodeSpec {
    pub name: String,
    pub kind: ResourceKind,
    pub capacity: f64,
    pub classes: Vec<String>,
    pub children: Vec<String>,
}

/// A cluster as given in input.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    pub id: String,
    pub lat: f64,
    pub lon: f64,
    pub state: ClusterState,
    /// The classes the cluster claims to serve; each must be carried by a leaf. `None`: the
    /// classes carried by its leaves.
    pub serves: Option<Vec<String>>,
    /// The resource tree, in any order; exactly one node is the root.
    pub resources: Vec<ResourceNodeSpec>,
}

/// A validated resource node. Nodes of a cluster are in pre-order: the root is node 0 and every
/// parent comes before its children.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceNode {
    pub name: String,
    pub kind: ResourceKind,
    pub capacity: f64,
    pub parent: Option<u32>,
    pub children: Vec<u32>,
    pub classes: Vec<ClassIdx>,
}

/// A validated cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub id: String,
    pub lat: f64,
    pub lon: f64,
    pub state: ClusterState,
    pub nodes: Vec<ResourceNode>,
    /// For each class, the leaf that carries it, if the cluster serves it.
    leaf_of_class: Vec<Option<u32>>,
}

impl Cluster {
    /// The leaf carrying `class`, or `None` if the cluster does not serve it.
    pub fn leaf_of(&self, class: ClassIdx) -> Option<u32> {
        self.leaf_of_class
            .get(usize::from(class))
            .copied()
            .flatten()
    }

    pub fn serves(&self, class: ClassIdx) -> bool {
        self.leaf_of(class).is_some()
    }

    /// The nodes that demand of `class` passes, from its leaf up to the root (empty if the
    /// cluster does not serve the class).
    pub fn path(&self, class: ClassIdx) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(self.leaf_of(class), |&n| self.nodes[n as usize].parent)
    }
}

/// Classes and clusters: what every round's instance shares unless the topology changes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Topology {
    pub(super) classes: Vec<TrafficClass>,
    pub(super) clusters: Vec<Cluster>,
    /// Global index of each cluster's node 0; `node_offset[clusters.len()]` is the node count.
    pub(super) node_offset: Vec<u32>,
    pub(super) class_by_name: HashMap<String, ClassIdx>,
    pub(super) cluster_by_id: HashMap<String, ClusterIdx>,
    /// The operator's policy, by cluster index (`policy.rs`).
    pub(super) policy: super::policy::Policy,
}

impl Topology {
    /// The clusters' ids, in index order.
    pub(super) fn cluster_ids(&self) -> Vec<&str> {
        self.clusters.iter().map(|c| c.id.as_str()).collect()
    }
}

/// A node on the cycle that the parent chain from `start` runs into (the caller knows there is
/// one: the chain never reaches a root).
fn on_cycle(start: usize, parent: &[Option<usize>]) -> usize {
    // After `parent.len()` steps the walk is inside the cycle.
    let mut i = start;
    for _ in 0..parent.len() {
        match parent[i] {
            Some(p) => i = p,
            None => break,
        }
    }
    i
}

/// Validates one cluster and its resource tree, and puts the nodes in pre-order.
pub(super) fn build_cluster(
    spec: ClusterSpec,
    class_by_name: &HashMap<String, ClassIdx>,
) -> Result<Cluster, ModelError> {
    let cid = spec.id;
    check_id("cluster", &cid, String::new)?;
    check_location(|| format!("cluster {cid:?}"), spec.lat, spec.lon)?;
    too_many(
        || format!("cluster {cid:?}"),
        "resource nodes",
        spec.resources.len(),
        MAX_TREE_NODES,
    )?;
    let nodes = &spec.resources;
    if nodes.is_empty() {
        return Err(ModelError::EmptyTree { cluster: cid });
    }
    let by_name = index_nodes(&cid, nodes)?;
    let parent = parents(&cid, nodes, &by_name)?;
    let root = the_root(&cid, nodes, &parent)?;
    let (order, new_index) = pre_order(&cid, nodes, &by_name, &parent, root)?;
    let tree = Tree {
        cid: &cid,
        nodes,
        by_name: &by_name,
        parent: &parent,
        order: &order,
        new_index: &new_index,
    };
    let (out, leaf_of_class) = tree.validated_nodes(class_by_name)?;
    if let Some(serves) = &spec.serves {
        check_serves(&cid, serves, class_by_name, &leaf_of_class)?;
    }
    Ok(Cluster {
        id: cid,
        lat: spec.lat,
        lon: spec.lon,
        state: spec.state,
        nodes: out,
        leaf_of_class,
    })
}

/// Each node's position in the input by name, refusing empty and duplicate names and bad
/// capacities (in input order, so the first bad node is the one named).
fn index_nodes<'a>(
    cid: &str,
    nodes: &'a [ResourceNodeSpec],
) -> Result<HashMap<&'a str, usize>, ModelError> {
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        check_id("resource node", &n.name, || format!(" in cluster {cid:?}"))?;
        check_number(
            || format!("cluster {cid:?}: resource node {:?}", n.name),
            "capacity",
            n.capacity,
        )?;
        if by_name.insert(&n.name, i).is_some() {
            return Err(ModelError::DuplicateId {
                what: "resource node",
                id: n.name.clone(),
                context: format!(" in cluster {cid:?}"),
            });
        }
    }
    Ok(by_name)
}

/// The parent of each node (by input position), refusing unknown and shared children.
fn parents(
    cid: &str,
    nodes: &[ResourceNodeSpec],
    by_name: &HashMap<&str, usize>,
) -> Result<Vec<Option<usize>>, ModelError> {
    let mut parent: Vec<Option<usize>> = vec![None; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for child in &n.children {
            let &c = by_name
                .get(child.as_str())
                .ok_or_else(|| ModelError::UnknownNode {
                    cluster: cid.to_string(),
                    node: child.clone(),
                })?;
            if let Some(p) = parent[c] {
                return Err(ModelError::SharedChild {
                    cluster: cid.to_string(),
                    node: child.clone(),
                    first: nodes[p].name.clone(),
                    second: n.name.clone(),
                });
            }
            parent[c] = Some(i);
        }
    }
    Ok(parent)
}

/// The one node without a parent, refusing a tree with none (a cycle) or several.
fn the_root(
    cid: &str,
    nodes: &[ResourceNodeSpec],
    parent: &[Option<usize>],
) -> Result<usize, ModelError> {
    let mut roots = (0..nodes.len()).filter(|&i| parent[i].is_none());
    let Some(root) = roots.next() else {
        // Every node has a parent: following parents from any node must loop.
        return Err(ModelError::TreeCycle {
            cluster: cid.to_string(),
            node: nodes[on_cycle(0, parent)].name.clone(),
        });
    };
    if let Some(other) = roots.next() {
        return Err(ModelError::SeveralRoots {
            cluster: cid.to_string(),
            first: nodes[root].name.clone(),
            second: nodes[other].name.clone(),
        });
    }
    Ok(root)
}

/// The nodes in pre-order from the root (input positions), and each node's new index there;
/// a node not reached sits on a cycle, and a node below [`MAX_TREE_DEPTH`] levels, both
/// refused.
fn pre_order(
    cid: &str,
    nodes: &[ResourceNodeSpec],
    by_name: &HashMap<&str, usize>,
    parent: &[Option<usize>],
    root: usize,
) -> Result<(Vec<usize>, Vec<u32>), ModelError> {
    let mut order: Vec<usize> = Vec::with_capacity(nodes.len());
    let mut new_index = vec![u32::MAX; nodes.len()];
    // Each node with its level (the root's is 1).
    let mut stack = vec![(root, 1usize)];
    while let Some((i, level)) = stack.pop() {
        if level > MAX_TREE_DEPTH {
            return Err(ModelError::TreeTooDeep {
                cluster: cid.to_string(),
                node: nodes[i].name.clone(),
                level,
                limit: MAX_TREE_DEPTH,
            });
        }
        new_index[i] = order.len() as u32;
        order.push(i);
        stack.extend(
            nodes[i]
                .children
                .iter()
                .rev()
                .filter_map(|c| by_name.get(c.as_str()).map(|&c| (c, level + 1))),
        );
    }
    if let Some(i) = (0..nodes.len()).find(|&i| new_index[i] == u32::MAX) {
        // Not reachable from the root, yet every node but the root has a parent: the parent
        // chain from here ends in a cycle.
        return Err(ModelError::TreeCycle {
            cluster: cid.to_string(),
            node: nodes[on_cycle(i, parent)].name.clone(),
        });
    }
    Ok((order, new_index))
}

/// A cluster's resource tree as checked so far: a single root, no cycle, the nodes in
/// pre-order (`order`, input positions) and each node's index there (`new_index`).
struct Tree<'a> {
    cid: &'a str,
    nodes: &'a [ResourceNodeSpec],
    by_name: &'a HashMap<&'a str, usize>,
    parent: &'a [Option<usize>],
    order: &'a [usize],
    new_index: &'a [u32],
}

impl Tree<'_> {
    /// The validated nodes in pre-order, and the leaf carrying each class; refuses unknown
    /// classes, classes on a node with children and classes on two leaves.
    fn validated_nodes(
        &self,
        class_by_name: &HashMap<String, ClassIdx>,
    ) -> Result<(Vec<ResourceNode>, Vec<Option<u32>>), ModelError> {
        let (cid, nodes, new_index) = (self.cid, self.nodes, self.new_index);
        let mut leaf_of_class: Vec<Option<u32>> = vec![None; class_by_name.len()];
        let mut out = Vec::with_capacity(nodes.len());
        for &i in self.order {
            let n = &nodes[i];
            let mut classes = Vec::with_capacity(n.classes.len());
            for class in &n.classes {
                let &k =
                    class_by_name
                        .get(class.as_str())
                        .ok_or_else(|| ModelError::UnknownClass {
                            subject: format!("cluster {cid:?}: resource node {:?}", n.name),
                            class: class.clone(),
                        })?;
                if !n.children.is_empty() {
                    return Err(ModelError::ClassNotOnLeaf {
                        cluster: cid.to_string(),
                        class: class.clone(),
                        node: n.name.clone(),
                    });
                }
                if let Some(prev) = leaf_of_class[usize::from(k)] {
                    return Err(ModelError::ClassOnTwoLeaves {
                        cluster: cid.to_string(),
                        class: class.clone(),
                        first: nodes[self.order[prev as usize]].name.clone(),
                        second: n.name.clone(),
                    });
                }
                leaf_of_class[usize::from(k)] = Some(new_index[i]);
                classes.push(k);
            }
            out.push(ResourceNode {
                name: n.name.clone(),
                kind: n.kind,
                capacity: n.capacity + 0.0,
                parent: self.parent[i].map(|p| new_index[p]),
                children: n
                    .children
                    .iter()
                    .filter_map(|c| self.by_name.get(c.as_str()).map(|&c| new_index[c]))
                    .collect(),
                classes,
            });
        }
        Ok((out, leaf_of_class))
    }
}

/// Refuses a `serves` list naming an unknown class or one no leaf of the cluster carries.
fn check_serves(
    cid: &str,
    serves: &[String],
    class_by_name: &HashMap<String, ClassIdx>,
    leaf_of_class: &[Option<u32>],
) -> Result<(), ModelError> {
    for class in serves {
        let &k = class_by_name
            .get(class.as_str())
            .ok_or_else(|| ModelError::UnknownClass {
                subject: format!("cluster {cid:?}"),
                class: class.clone(),
            })?;
        if leaf_of_class[usize::from(k)].is_none() {
            return Err(ModelError::NoLeafForClass {
                cluster: cid.to_string(),
                class: class.clone(),
            });
        }
    }
    Ok(())
}
