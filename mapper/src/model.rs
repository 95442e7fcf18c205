//! The domain model: traffic classes, clusters with resource trees, map units with candidates.
//!
//! An [`Instance`] is built once through an [`InstanceBuilder`], which validates every input and
//! refuses bad input with a [`ModelError`] naming it. After that the instance is immutable and
//! indexed: clusters and map units are sorted by id, so an index order *is* the id order that the
//! preference tie-breaks use, and each map unit's candidates are sorted by the unit's preference
//! (score, then cluster id).
//!
//! Map units are stored column-wise (one vector per field, candidates in one flat arena) so that
//! ten million of them fit in a few GB: see `ARCHITECTURE.md`, "Memory".

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::prefetch::prefetch;

/// At most this many map units: the solver packs a map unit's index into 24 bits of a key.
pub const MAX_MAP_UNITS: usize = 1 << 24;
/// At most this many traffic classes: the solver packs a class's priority rank into 8 bits.
pub const MAX_CLASSES: usize = 255;
/// At most this many clusters in one instance.
pub const MAX_CLUSTERS: usize = 1 << 20;
/// At most this many resource nodes in one cluster's tree.
pub const MAX_TREE_NODES: usize = 1024;
/// At most this many addresses per cluster.
pub const MAX_ADDRESSES: usize = 1024;
/// At most this many prefixes per map unit.
pub const MAX_PREFIXES_PER_UNIT: usize = 4096;
/// The hard ceiling on [`Limits::max_candidates`]: a proposal pointer is one byte.
pub const MAX_CANDIDATES_CEILING: usize = 255;
/// The default limit on candidates per map unit.
pub const DEFAULT_MAX_CANDIDATES: usize = 64;

/// Configurable limits applied while building an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A map unit with more candidates than this is refused (at most [`MAX_CANDIDATES_CEILING`]).
    pub max_candidates: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_candidates: DEFAULT_MAX_CANDIDATES,
        }
    }
}

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
pub struct TrafficClass {
    pub name: String,
    pub priority: u32,
    pub per_unit: PerUnit,
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
    pub addresses: Vec<IpAddr>,
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

/// Index of a traffic class in [`Instance::classes`].
pub type ClassIdx = u16;
/// Index of a cluster in [`Instance::clusters`] (clusters are sorted by id).
pub type ClusterIdx = u32;
/// Index of a map unit (map units are sorted by id).
pub type UnitIdx = u32;

/// A validated cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub id: String,
    pub lat: f64,
    pub lon: f64,
    pub addresses: Vec<IpAddr>,
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

/// A candidate as given in input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CandidateSpec<'a> {
    pub cluster: &'a str,
    pub score: f64,
    pub cluster_rank: Option<f64>,
}

/// A map unit as given in input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MapUnitSpec<'a> {
    pub id: &'a str,
    pub class: &'a str,
    pub demand: f64,
    pub lat: f64,
    pub lon: f64,
    pub prefixes: &'a [IpNet],
    pub candidates: &'a [CandidateSpec<'a>],
}

/// A validated candidate: a cluster, the unit's score for it, and the rank the cluster gives the
/// unit (the explicit `cluster_rank`, or the score when none was given).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub cluster: ClusterIdx,
    pub score: f32,
    pub rank: f32,
    /// Whether `rank` came from an explicit `cluster_rank`.
    pub explicit_rank: bool,
    /// Whether the cluster holds this unit as an *incumbent* and puts it before every
    /// non-incumbent, whatever their class priority (set only by stickiness,
    /// [`crate::sticky::favour_incumbents`]; plain instances have none).
    pub incumbent: bool,
}

/// The stored rank of a candidate without an explicit `cluster_rank`.
pub(crate) const NO_RANK: f32 = f32::INFINITY;

/// Map units, column-wise. Candidates of unit `u` are at `cand_start[u]..cand_start[u + 1]`
/// of the [`CandidateColumns`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MapUnits {
    pub(crate) ids: Vec<Box<str>>,
    pub(crate) class: Vec<ClassIdx>,
    /// Filled while building only (empty in an instance, which keeps its demand apart in
    /// `Instance::demand`; the name keeps instance code from reading it by mistake).
    pub(crate) building_demand: Vec<f64>,
    pub(crate) lat: Vec<f32>,
    pub(crate) lon: Vec<f32>,
    pub(crate) prefix_start: Vec<u32>,
    pub(crate) prefixes: Vec<IpNet>,
    pub(crate) cand_start: Vec<u32>,
}

/// The candidates of all map units in one arena, each unit's in its preference order. Kept apart
/// from [`MapUnits`] so that an instance with other preferences (stickiness) shares everything
/// else.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CandidateColumns {
    pub(crate) cluster: Vec<ClusterIdx>,
    pub(crate) score: Vec<f32>,
    /// Explicit cluster ranks, [`NO_RANK`] where none was given; absent when no candidate has
    /// one. (Input ranks are finite, so infinity is free to mean "none" and compares equal.)
    pub(crate) rank: Option<Vec<f32>>,
    /// Each unit's first candidate (a placeholder for a unit without candidates), written
    /// down with the unit: the passes over every unit of a warm round (stickiness, seeding)
    /// read little else of most units, and 8 bytes a unit stream where a unit's candidate
    /// lines (twice 64 bytes at 16 candidates) do not. Empty in [`Favour::moved`].
    pub(crate) head: Vec<Head>,
}

/// A unit's first candidate in its instance's arena: its cluster, and the rank that cluster
/// gives the unit (the explicit rank if any, else the score).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Head {
    pub(crate) cluster: ClusterIdx,
    pub(crate) rank: f32,
}

impl CandidateColumns {
    /// Appends the head of a unit whose candidates are the arena's entries from `start` on.
    fn push_head(&mut self, start: usize) {
        let head = match self.cluster.get(start) {
            None => Head::default(),
            Some(&cluster) => Head {
                cluster,
                rank: match self.rank.as_ref().map(|r| r[start]) {
                    Some(r) if r != NO_RANK => r,
                    _ => self.score[start],
                },
            },
        };
        self.head.push(head);
    }
}

/// How stickiness changed an instance's preferences ([`crate::sticky`]), kept beside the
/// instance's own candidates rather than as a copy of them: a round's effective preferences
/// differ from its instance's only at the incumbents, and copying the candidate arena (16 M
/// entries at 1 M units) cost more than the rest of a warm round's preparation.
///
/// A *favoured* candidate's score and rank are multiplied by `factor`. A unit keeps its
/// candidates where they are in the instance's arena unless the bonus reordered them: when
/// one favoured candidate moved forward (the usual case: the incumbent got its place back
/// after the scores moved), `promote` says from where to where; in any other reordering the
/// unit's candidates are copied, in their new order, to `moved`, and its `start` points
/// there (index `arena_len + k` is `moved`'s entry `k`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Favour {
    pub(crate) factor: f32,
    /// Clusters like every favoured candidate (an incumbent) better than every other.
    pub(crate) incumbents_first: bool,
    /// Where each unit's candidates start, in the arena followed by `moved`.
    pub(crate) start: Vec<u32>,
    /// Per unit: `[p, q]`, its candidate at position `p` moved forward to position `q`
    /// (`p > q`), the ones between shifting back by one; `[0, 0]` for none.
    pub(crate) promote: Vec<[u8; 2]>,
    /// The length of the instance's candidate arena.
    pub(crate) arena_len: usize,
    /// The candidates of the units whose order changed.
    pub(crate) moved: CandidateColumns,
    /// Favoured candidates, one bit per entry of the arena followed by `moved` (an entry
    /// keeps its bit wherever a promotion shows it).
    pub(crate) favoured: Vec<u64>,
    /// Each unit's first candidate, as [`Instance::first_candidate`] gives it: written down
    /// while the unit's candidates are in cache, because a seeded solve reads the first
    /// candidate of every unit and little else of most.
    pub(crate) first: Vec<FirstCandidate>,
}

/// A unit's most preferred candidate: its cluster, the rank that cluster gives the unit, and
/// whether the unit is a newcomer there that the cluster likes less than every incumbent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FirstCandidate {
    pub(crate) cluster: ClusterIdx,
    pub(crate) rank: f32,
    pub(crate) newcomer: bool,
}

impl Favour {
    fn is_favoured(&self, entry: usize) -> bool {
        self.favoured[entry / 64] & (1 << (entry % 64)) != 0
    }
}

/// Under a promotion `[p, q]`, the (instance) position of the entry shown at position `j`.
fn promoted_entry([p, q]: [u8; 2], j: usize) -> usize {
    let (p, q) = (usize::from(p), usize::from(q));
    if j < q || j > p {
        j
    } else if j == q {
        p
    } else {
        j - 1
    }
}

/// Under a promotion `[p, q]`, the position where the entry at (instance) position `b` is
/// shown: the inverse of [`promoted_entry`].
fn promoted_position([p, q]: [u8; 2], b: usize) -> usize {
    let (p, q) = (usize::from(p), usize::from(q));
    if b < q || b > p {
        b
    } else if b == p {
        q
    } else {
        b + 1
    }
}

/// Classes and clusters: what every round's instance shares unless the topology changes.
#[derive(Debug, Clone, PartialEq)]
struct Topology {
    classes: Vec<TrafficClass>,
    clusters: Vec<Cluster>,
    /// Global index of each cluster's node 0; `node_offset[clusters.len()]` is the node count.
    node_offset: Vec<u32>,
    class_by_name: HashMap<String, ClassIdx>,
    cluster_by_id: HashMap<String, ClusterIdx>,
}

/// A validated, indexed, immutable problem instance. Cloning is cheap (three reference counts);
/// instances derived from it (other preferences, a cluster's state) share what did not change.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    topology: Arc<Topology>,
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
        self.units
            .ids
            .binary_search_by(|probe| (**probe).cmp(id))
            .ok()
            .map(|i| i as UnitIdx)
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
        &self.units.ids[u as usize]
    }

    pub fn unit_class(&self, u: UnitIdx) -> ClassIdx {
        self.units.class[u as usize]
    }

    pub fn unit_demand(&self, u: UnitIdx) -> f64 {
        self.demand[u as usize]
    }

    pub fn unit_location(&self, u: UnitIdx) -> (f64, f64) {
        (
            f64::from(self.units.lat[u as usize]),
            f64::from(self.units.lon[u as usize]),
        )
    }

    pub fn unit_prefixes(&self, u: UnitIdx) -> &[IpNet] {
        let u = u as usize;
        let (a, b) = (self.units.prefix_start[u], self.units.prefix_start[u + 1]);
        &self.units.prefixes[a as usize..b as usize]
    }

    /// Number of candidates of unit `u`.
    pub fn candidate_count(&self, u: UnitIdx) -> usize {
        let u = u as usize;
        (self.units.cand_start[u + 1] - self.units.cand_start[u]) as usize
    }

    /// The position of unit `u`'s candidates in the flat candidate arena (followed, in an
    /// instance with stickiness, by the candidates that moved: see [`Favour`]). Every
    /// candidate accessor below takes such a position.
    #[inline]
    pub(crate) fn candidate_range(&self, u: UnitIdx) -> std::ops::Range<usize> {
        let u = u as usize;
        let (a, b) = (
            self.units.cand_start[u] as usize,
            self.units.cand_start[u + 1] as usize,
        );
        match &self.favour {
            None => a..b,
            Some(f) => {
                let s = f.start[u] as usize;
                s..s + (b - a)
            }
        }
    }

    /// The entry shown at unit `u`'s candidate position `i` (an index into the arena
    /// followed by the moved candidates; `i` itself but for a promotion).
    #[inline]
    fn entry(&self, u: UnitIdx, i: usize) -> usize {
        match &self.favour {
            Some(f) if i < f.arena_len => {
                let promote = f.promote[u as usize];
                if promote[0] == 0 {
                    return i;
                }
                let s = f.start[u as usize] as usize;
                s + promoted_entry(promote, i - s)
            }
            _ => i,
        }
    }

    /// The columns holding `entry`, and its index there.
    #[inline]
    fn columns(&self, entry: usize) -> (&CandidateColumns, usize) {
        match &self.favour {
            Some(f) if entry >= f.arena_len => (&f.moved, entry - f.arena_len),
            _ => (&self.cands, entry),
        }
    }

    /// The cluster of unit `u`'s candidate at position `i`.
    #[inline]
    pub(crate) fn cand_cluster(&self, u: UnitIdx, i: usize) -> ClusterIdx {
        let (c, k) = self.columns(self.entry(u, i));
        c.cluster[k]
    }

    /// The position (0 = most preferred) of cluster `c` among unit `u`'s candidates.
    pub(crate) fn candidate_position(&self, u: UnitIdx, c: ClusterIdx) -> Option<usize> {
        let range = self.candidate_range(u);
        let (cols, k) = self.columns(range.start);
        let b = cols.cluster[k..k + range.len()]
            .iter()
            .position(|&x| x == c)?;
        Some(match &self.favour {
            Some(f) if range.start < f.arena_len && f.promote[u as usize][0] != 0 => {
                promoted_position(f.promote[u as usize], b)
            }
            _ => b,
        })
    }

    /// The unit's score for its candidate at position `i`, the explicit rank if any, and
    /// the rank the cluster gives the unit.
    #[inline]
    pub(crate) fn cand_score_rank(&self, u: UnitIdx, i: usize) -> (f32, Option<f32>, f32) {
        let entry = self.entry(u, i);
        let (c, k) = self.columns(entry);
        let mut score = c.score[k];
        let mut explicit = c.rank.as_ref().map(|r| r[k]).filter(|&r| r != NO_RANK);
        if let Some(f) = self.favour.as_ref().filter(|f| f.is_favoured(entry)) {
            score *= f.factor;
            explicit = explicit.map(|r| r * f.factor);
        }
        (score, explicit, explicit.unwrap_or(score))
    }

    /// Whether the cluster of unit `u`'s candidate at position `i` holds the unit as an
    /// incumbent that it likes better than every newcomer (stickiness).
    #[inline]
    pub(crate) fn is_incumbent(&self, u: UnitIdx, i: usize) -> bool {
        self.favour
            .as_ref()
            .is_some_and(|f| f.incumbents_first && f.is_favoured(self.entry(u, i)))
    }

    /// The cluster of unit `u`'s candidate at position `i`, and whether the unit is a
    /// newcomer there ([`Self::cand_cluster`] and [`Self::is_newcomer`] in one lookup).
    #[inline]
    pub(crate) fn cand_cluster_newcomer(&self, u: UnitIdx, i: usize) -> (ClusterIdx, bool) {
        let entry = self.entry(u, i);
        let (c, k) = self.columns(entry);
        let newcomer = self
            .favour
            .as_ref()
            .is_some_and(|f| f.incumbents_first && !f.is_favoured(entry));
        (c.cluster[k], newcomer)
    }

    /// Whether unit `u`'s candidate at position `i` is a newcomer its cluster likes less than
    /// every incumbent (only when stickiness puts incumbents first).
    #[inline]
    pub(crate) fn is_newcomer(&self, u: UnitIdx, i: usize) -> bool {
        self.favour
            .as_ref()
            .is_some_and(|f| f.incumbents_first && !f.is_favoured(self.entry(u, i)))
    }

    /// Unit `u`'s most preferred candidate (`None` if it has none), as written down with the
    /// candidates (the head column, or stickiness's [`Favour::first`]); debug builds check it
    /// against the candidates themselves.
    #[inline]
    pub(crate) fn first_candidate(&self, u: UnitIdx) -> Option<FirstCandidate> {
        if self.candidate_count(u) == 0 {
            return None;
        }
        let first = match &self.favour {
            Some(f) => f.first[u as usize],
            None => {
                let head = self.cands.head[u as usize];
                FirstCandidate {
                    cluster: head.cluster,
                    rank: head.rank,
                    newcomer: false,
                }
            }
        };
        #[cfg(debug_assertions)]
        {
            // What was written down is what the candidates say.
            let i = self.candidate_range(u).start;
            let read = FirstCandidate {
                cluster: self.cand_cluster(u, i),
                rank: self.cand_score_rank(u, i).2,
                newcomer: self.is_newcomer(u, i),
            };
            debug_assert_eq!(first, read, "unit {u}'s first candidate");
        }
        Some(first)
    }

    /// Asks the CPU to load unit `u`'s candidate at position `i`.
    #[inline]
    pub(crate) fn prefetch_candidate(&self, u: UnitIdx, i: usize) {
        let entry = self.entry(u, i);
        let (c, k) = self.columns(entry);
        prefetch(&c.cluster, k);
        prefetch(&c.score, k);
        if let Some(r) = &c.rank {
            prefetch(r, k);
        }
        if let Some(f) = &self.favour {
            prefetch(&f.favoured, entry / 64);
        }
    }

    /// Candidate `j` (0 = most preferred) of unit `u`.
    pub fn candidate(&self, u: UnitIdx, j: usize) -> Candidate {
        let i = self.candidate_range(u).start + j;
        self.candidate_at(u, i)
    }

    /// Unit `u`'s candidate at position `i` of the arena.
    #[inline]
    pub(crate) fn candidate_at(&self, u: UnitIdx, i: usize) -> Candidate {
        let (score, explicit, rank) = self.cand_score_rank(u, i);
        Candidate {
            cluster: self.cand_cluster(u, i),
            score,
            rank,
            explicit_rank: explicit.is_some(),
            incumbent: self.is_incumbent(u, i),
        }
    }

    /// Unit `u`'s candidates, most preferred first.
    #[inline]
    pub fn candidates(&self, u: UnitIdx) -> impl ExactSizeIterator<Item = Candidate> + '_ {
        self.candidate_range(u)
            .map(move |i| self.candidate_at(u, i))
    }

    /// Total number of candidates over all map units.
    pub fn total_candidates(&self) -> usize {
        self.cands.cluster.len()
    }

    pub fn total_demand(&self) -> f64 {
        self.demand.iter().sum()
    }

    /// The same instance with stickiness's changes to its candidates (built by
    /// [`crate::sticky`] for an instance that has none).
    pub(crate) fn with_favour(&self, favour: Favour) -> Instance {
        debug_assert!(self.favour.is_none());
        debug_assert_eq!(favour.arena_len, self.cands.cluster.len());
        debug_assert_eq!(favour.start.len(), self.unit_count());
        Instance {
            topology: Arc::clone(&self.topology),
            units: Arc::clone(&self.units),
            demand: Arc::clone(&self.demand),
            cands: Arc::clone(&self.cands),
            favour: Some(Arc::new(favour)),
        }
    }

    /// The same preferences with stickiness's changes written into the candidate columns (the
    /// candidates of every unit in its order, no [`Favour`]), for deriving preferences from
    /// an instance that already has them. Incumbent marks are lost.
    pub(crate) fn flattened(&self) -> Instance {
        if self.favour.is_none() {
            return self.clone();
        }
        let total = self.total_candidates();
        let mut cands = CandidateColumns {
            cluster: Vec::with_capacity(total),
            score: Vec::with_capacity(total),
            rank: self.cands.rank.as_ref().map(|_| Vec::with_capacity(total)),
            head: Vec::with_capacity(self.unit_count()),
        };
        let mut cand_start = Vec::with_capacity(self.unit_count() + 1);
        cand_start.push(0);
        for u in 0..self.unit_count() as UnitIdx {
            let start = cands.cluster.len();
            for i in self.candidate_range(u) {
                let (score, explicit, _) = self.cand_score_rank(u, i);
                cands.cluster.push(self.cand_cluster(u, i));
                cands.score.push(score);
                if let Some(r) = cands.rank.as_mut() {
                    r.push(explicit.unwrap_or(NO_RANK));
                }
            }
            cands.push_head(start);
            cand_start.push(cands.cluster.len() as u32);
        }
        debug_assert_eq!(cand_start, self.units.cand_start);
        Instance {
            topology: Arc::clone(&self.topology),
            units: Arc::clone(&self.units),
            demand: Arc::clone(&self.demand),
            cands: Arc::new(cands),
            favour: None,
        }
    }

    /// The same instance with cluster `cluster` in `state` (drained and down clusters take no
    /// demand). Shares the map units and candidates.
    pub fn with_cluster_state(&self, cluster: ClusterIdx, state: ClusterState) -> Instance {
        let mut topology = (*self.topology).clone();
        if let Some(c) = topology.clusters.get_mut(cluster as usize) {
            c.state = state;
        }
        Instance {
            topology: Arc::new(topology),
            units: Arc::clone(&self.units),
            demand: Arc::clone(&self.demand),
            cands: Arc::clone(&self.cands),
            favour: self.favour.clone(),
        }
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
        let ids: usize = u.ids.iter().map(|s| s.len().max(8)).sum::<usize>()
            + u.ids.capacity() * std::mem::size_of::<Box<str>>();
        ids + u.class.capacity() * 2
            + self.demand.capacity() * 8
            + (u.lat.capacity() + u.lon.capacity()) * 4
            + u.prefix_start.capacity() * 4
            + u.prefixes.capacity() * std::mem::size_of::<IpNet>()
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

/// Builds an [`Instance`], validating as it goes. Classes and clusters come first (so candidates
/// can be resolved by cluster id); map units are then pushed one at a time, so a generator or a
/// streaming parser never needs a second copy of them.
#[derive(Debug)]
pub struct InstanceBuilder {
    limits: Limits,
    classes: Vec<TrafficClass>,
    clusters: Vec<Cluster>,
    node_offset: Vec<u32>,
    class_by_name: HashMap<String, ClassIdx>,
    cluster_by_id: HashMap<String, ClusterIdx>,
    units: MapUnits,
    cands: CandidateColumns,
    /// Per cluster, the `push_unit` call that last named it as a candidate: finds duplicates.
    seen_stamp: Vec<u32>,
    /// Counts `push_unit` calls (refused ones too, so their marks never match a later call).
    stamp: u32,
    scratch: Vec<(f32, ClusterIdx, f32)>,
}

fn check_number(
    subject: impl Fn() -> String,
    field: &'static str,
    value: f64,
) -> Result<(), ModelError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(ModelError::BadNumber {
            subject: subject(),
            field,
            value,
            rule: "must be a finite number >= 0",
        })
    }
}

fn check_f32(
    subject: impl Fn() -> String,
    field: &'static str,
    value: f64,
) -> Result<f32, ModelError> {
    check_number(&subject, field, value)?;
    let narrow = value as f32;
    if narrow.is_finite() {
        // `+ 0.0` turns -0.0 into +0.0, so the bit pattern orders like the number.
        Ok(narrow + 0.0)
    } else {
        Err(ModelError::BadNumber {
            subject: subject(),
            field,
            value,
            rule: "must be at most 3.4e38",
        })
    }
}

fn check_location(subject: impl Fn() -> String, lat: f64, lon: f64) -> Result<(), ModelError> {
    if !(lat.is_finite() && (-90.0..=90.0).contains(&lat)) {
        return Err(ModelError::BadNumber {
            subject: subject(),
            field: "lat",
            value: lat,
            rule: "must be a latitude in [-90, 90]",
        });
    }
    if !(lon.is_finite() && (-180.0..=180.0).contains(&lon)) {
        return Err(ModelError::BadNumber {
            subject: subject(),
            field: "lon",
            value: lon,
            rule: "must be a longitude in [-180, 180]",
        });
    }
    Ok(())
}

fn too_many(
    subject: impl FnOnce() -> String,
    what: &'static str,
    count: usize,
    limit: usize,
) -> Result<(), ModelError> {
    if count > limit {
        Err(ModelError::TooMany {
            subject: subject(),
            what,
            count,
            limit,
        })
    } else {
        Ok(())
    }
}

impl InstanceBuilder {
    /// Validates the classes and clusters.
    pub fn new(
        classes: Vec<TrafficClass>,
        clusters: Vec<ClusterSpec>,
        limits: Limits,
    ) -> Result<Self, ModelError> {
        too_many(
            || "limits".into(),
            "candidates per map unit allowed",
            limits.max_candidates,
            MAX_CANDIDATES_CEILING,
        )?;
        too_many(
            || "instance".into(),
            "traffic classes",
            classes.len(),
            MAX_CLASSES,
        )?;
        too_many(
            || "instance".into(),
            "clusters",
            clusters.len(),
            MAX_CLUSTERS,
        )?;
        let mut class_by_name = HashMap::with_capacity(classes.len());
        for (i, class) in classes.iter().enumerate() {
            if class.name.is_empty() {
                return Err(ModelError::EmptyId {
                    what: "traffic class",
                    context: String::new(),
                });
            }
            let subject = || format!("traffic class {:?}", class.name);
            check_number(subject, "per_unit.bps", class.per_unit.bps)?;
            check_number(subject, "per_unit.fps", class.per_unit.fps)?;
            if class_by_name
                .insert(class.name.clone(), i as ClassIdx)
                .is_some()
            {
                return Err(ModelError::DuplicateId {
                    what: "traffic class",
                    id: class.name.clone(),
                    context: String::new(),
                });
            }
        }
        let mut clusters: Vec<Cluster> = clusters
            .into_iter()
            .map(|spec| build_cluster(spec, &class_by_name))
            .collect::<Result<_, _>>()?;
        clusters.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(w) = clusters.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(ModelError::DuplicateId {
                what: "cluster",
                id: w[0].id.clone(),
                context: String::new(),
            });
        }
        let cluster_by_id = clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), i as ClusterIdx))
            .collect();
        let mut node_offset = Vec::with_capacity(clusters.len() + 1);
        let mut total = 0u32;
        for c in &clusters {
            node_offset.push(total);
            total += c.nodes.len() as u32;
        }
        node_offset.push(total);
        let mut units = MapUnits::default();
        units.prefix_start.push(0);
        units.cand_start.push(0);
        Ok(InstanceBuilder {
            limits,
            seen_stamp: vec![0; clusters.len()],
            stamp: 0,
            classes,
            clusters,
            node_offset,
            class_by_name,
            cluster_by_id,
            units,
            cands: CandidateColumns::default(),
            scratch: Vec::new(),
        })
    }

    /// Reserves room for `units` more map units with `candidates` candidates in all.
    pub fn reserve(&mut self, units: usize, candidates: usize) {
        let u = &mut self.units;
        u.ids.reserve_exact(units);
        u.class.reserve_exact(units);
        u.building_demand.reserve_exact(units);
        u.lat.reserve_exact(units);
        u.lon.reserve_exact(units);
        u.prefix_start.reserve_exact(units);
        u.cand_start.reserve_exact(units);
        self.cands.cluster.reserve_exact(candidates);
        self.cands.score.reserve_exact(candidates);
        self.cands.head.reserve_exact(units);
    }

    pub fn cluster_index(&self, id: &str) -> Option<ClusterIdx> {
        self.cluster_by_id.get(id).copied()
    }

    /// Validates one map unit and appends it. On error nothing is appended.
    pub fn push_unit(&mut self, spec: &MapUnitSpec<'_>) -> Result<(), ModelError> {
        if spec.id.is_empty() {
            return Err(ModelError::EmptyId {
                what: "map unit",
                context: format!(" (map unit #{})", self.units.ids.len()),
            });
        }
        let unit_index = self.units.ids.len();
        too_many(
            || "instance".into(),
            "map units",
            unit_index + 1,
            MAX_MAP_UNITS,
        )?;
        let subject = || format!("map unit {:?}", spec.id);
        let class =
            *self
                .class_by_name
                .get(spec.class)
                .ok_or_else(|| ModelError::UnknownClass {
                    subject: subject(),
                    class: spec.class.to_string(),
                })?;
        check_number(subject, "demand", spec.demand)?;
        check_location(subject, spec.lat, spec.lon)?;
        too_many(
            subject,
            "prefixes",
            spec.prefixes.len(),
            MAX_PREFIXES_PER_UNIT,
        )?;
        too_many(
            subject,
            "candidates",
            spec.candidates.len(),
            self.limits.max_candidates,
        )?;
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.seen_stamp.fill(0);
            self.stamp = 1;
        }
        let stamp = self.stamp;
        self.scratch.clear();
        let mut any_rank = false;
        for cand in spec.candidates {
            let c = *self.cluster_by_id.get(cand.cluster).ok_or_else(|| {
                ModelError::UnknownCluster {
                    map_unit: spec.id.to_string(),
                    cluster: cand.cluster.to_string(),
                }
            })?;
            if self.seen_stamp[c as usize] == stamp {
                return Err(ModelError::DuplicateCandidate {
                    map_unit: spec.id.to_string(),
                    cluster: cand.cluster.to_string(),
                });
            }
            self.seen_stamp[c as usize] = stamp;
            if !self.clusters[c as usize].serves(class) {
                return Err(ModelError::ClassNotServed {
                    map_unit: spec.id.to_string(),
                    cluster: cand.cluster.to_string(),
                    class: spec.class.to_string(),
                });
            }
            let cand_subject = || format!("map unit {:?}: candidate {:?}", spec.id, cand.cluster);
            let score = check_f32(cand_subject, "score", cand.score)?;
            let rank = match cand.cluster_rank {
                Some(r) => {
                    any_rank = true;
                    check_f32(cand_subject, "cluster_rank", r)?
                }
                None => NO_RANK,
            };
            self.scratch.push((score, c, rank));
        }
        // A map unit prefers lower score; ties broken by cluster id (= cluster index).
        self.scratch
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));

        let u = &mut self.units;
        let cands = &mut self.cands;
        if any_rank && cands.rank.is_none() {
            let mut ranks = Vec::with_capacity(cands.cluster.capacity());
            ranks.resize(cands.cluster.len(), NO_RANK);
            cands.rank = Some(ranks);
        }
        let start = cands.cluster.len();
        for &(score, c, rank) in &self.scratch {
            cands.cluster.push(c);
            cands.score.push(score);
            if let Some(ranks) = cands.rank.as_mut() {
                ranks.push(rank);
            }
        }
        cands.push_head(start);
        u.cand_start.push(cands.cluster.len() as u32);
        u.prefixes.extend_from_slice(spec.prefixes);
        u.prefix_start.push(u.prefixes.len() as u32);
        u.ids.push(spec.id.into());
        u.class.push(class);
        u.building_demand.push(spec.demand + 0.0);
        u.lat.push(spec.lat as f32);
        u.lon.push(spec.lon as f32);
        Ok(())
    }

    /// Sorts the map units by id (a no-op when they came sorted) and refuses duplicates.
    pub fn finish(self) -> Result<Instance, ModelError> {
        let (mut units, mut cands) = (self.units, self.cands);
        let sorted = units.ids.windows(2).all(|w| w[0] <= w[1]);
        if !sorted {
            (units, cands) = sort_units(units, cands);
        }
        if let Some(w) = units.ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(ModelError::DuplicateId {
                what: "map unit",
                id: w[0].to_string(),
                context: String::new(),
            });
        }
        // The demand column lives apart in an instance (`Instance::demand`).
        let demand = Arc::new(std::mem::take(&mut units.building_demand));
        Ok(Instance {
            topology: Arc::new(Topology {
                classes: self.classes,
                clusters: self.clusters,
                node_offset: self.node_offset,
                class_by_name: self.class_by_name,
                cluster_by_id: self.cluster_by_id,
            }),
            units: Arc::new(units),
            demand,
            cands: Arc::new(cands),
            favour: None,
        })
    }
}

/// Reorders the columns of `units` into id order.
fn sort_units(units: MapUnits, cands: CandidateColumns) -> (MapUnits, CandidateColumns) {
    let n = units.ids.len();
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by(|&a, &b| units.ids[a as usize].cmp(&units.ids[b as usize]));
    let mut out = MapUnits::default();
    let mut out_cands = CandidateColumns {
        rank: cands
            .rank
            .as_ref()
            .map(|_| Vec::with_capacity(cands.cluster.len())),
        ..CandidateColumns::default()
    };
    out.prefix_start.push(0);
    out.cand_start.push(0);
    for &i in &order {
        let i = i as usize;
        let (p0, p1) = (
            units.prefix_start[i] as usize,
            units.prefix_start[i + 1] as usize,
        );
        out.prefixes.extend_from_slice(&units.prefixes[p0..p1]);
        out.prefix_start.push(out.prefixes.len() as u32);
        let (c0, c1) = (
            units.cand_start[i] as usize,
            units.cand_start[i + 1] as usize,
        );
        out_cands.head.push(cands.head[i]);
        out_cands.cluster.extend_from_slice(&cands.cluster[c0..c1]);
        out_cands.score.extend_from_slice(&cands.score[c0..c1]);
        if let (Some(dst), Some(src)) = (out_cands.rank.as_mut(), cands.rank.as_ref()) {
            dst.extend_from_slice(&src[c0..c1]);
        }
        out.cand_start.push(out_cands.cluster.len() as u32);
        out.ids.push(units.ids[i].clone());
        out.class.push(units.class[i]);
        out.building_demand.push(units.building_demand[i]);
        out.lat.push(units.lat[i]);
        out.lon.push(units.lon[i]);
    }
    (out, out_cands)
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
fn build_cluster(
    spec: ClusterSpec,
    class_by_name: &HashMap<String, ClassIdx>,
) -> Result<Cluster, ModelError> {
    let cid = spec.id;
    if cid.is_empty() {
        return Err(ModelError::EmptyId {
            what: "cluster",
            context: String::new(),
        });
    }
    check_location(|| format!("cluster {cid:?}"), spec.lat, spec.lon)?;
    too_many(
        || format!("cluster {cid:?}"),
        "addresses",
        spec.addresses.len(),
        MAX_ADDRESSES,
    )?;
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
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        if n.name.is_empty() {
            return Err(ModelError::EmptyId {
                what: "resource node",
                context: format!(" in cluster {cid:?}"),
            });
        }
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
    // Parent of each node, refusing unknown and shared children.
    let mut parent: Vec<Option<usize>> = vec![None; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for child in &n.children {
            let &c = by_name
                .get(child.as_str())
                .ok_or_else(|| ModelError::UnknownNode {
                    cluster: cid.clone(),
                    node: child.clone(),
                })?;
            if let Some(p) = parent[c] {
                return Err(ModelError::SharedChild {
                    cluster: cid.clone(),
                    node: child.clone(),
                    first: nodes[p].name.clone(),
                    second: n.name.clone(),
                });
            }
            parent[c] = Some(i);
        }
    }
    let mut roots = (0..nodes.len()).filter(|&i| parent[i].is_none());
    let Some(root) = roots.next() else {
        // Every node has a parent: following parents from any node must loop.
        return Err(ModelError::TreeCycle {
            cluster: cid,
            node: nodes[on_cycle(0, &parent)].name.clone(),
        });
    };
    if let Some(other) = roots.next() {
        return Err(ModelError::SeveralRoots {
            cluster: cid,
            first: nodes[root].name.clone(),
            second: nodes[other].name.clone(),
        });
    }
    // Pre-order walk from the root; a node not reached sits on a cycle.
    let mut order: Vec<usize> = Vec::with_capacity(nodes.len());
    let mut new_index = vec![u32::MAX; nodes.len()];
    let mut stack = vec![root];
    while let Some(i) = stack.pop() {
        new_index[i] = order.len() as u32;
        order.push(i);
        stack.extend(
            nodes[i]
                .children
                .iter()
                .rev()
                .filter_map(|c| by_name.get(c.as_str()).copied()),
        );
    }
    if let Some(i) = (0..nodes.len()).find(|&i| new_index[i] == u32::MAX) {
        // Not reachable from the root, yet every node but the root has a parent: the parent
        // chain from here ends in a cycle.
        return Err(ModelError::TreeCycle {
            cluster: cid,
            node: nodes[on_cycle(i, &parent)].name.clone(),
        });
    }
    let mut leaf_of_class: Vec<Option<u32>> = vec![None; class_by_name.len()];
    let mut out = Vec::with_capacity(nodes.len());
    for &i in &order {
        let n = &nodes[i];
        let mut classes = Vec::with_capacity(n.classes.len());
        for class in &n.classes {
            let &k = class_by_name
                .get(class.as_str())
                .ok_or_else(|| ModelError::UnknownClass {
                    subject: format!("cluster {cid:?}: resource node {:?}", n.name),
                    class: class.clone(),
                })?;
            if !n.children.is_empty() {
                return Err(ModelError::ClassNotOnLeaf {
                    cluster: cid.clone(),
                    class: class.clone(),
                    node: n.name.clone(),
                });
            }
            if let Some(prev) = leaf_of_class[usize::from(k)] {
                return Err(ModelError::ClassOnTwoLeaves {
                    cluster: cid.clone(),
                    class: class.clone(),
                    first: nodes[order[prev as usize]].name.clone(),
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
            parent: parent[i].map(|p| new_index[p]),
            children: n
                .children
                .iter()
                .filter_map(|c| by_name.get(c.as_str()).map(|&c| new_index[c]))
                .collect(),
            classes,
        });
    }
    if let Some(serves) = &spec.serves {
        for class in serves {
            let &k = class_by_name
                .get(class.as_str())
                .ok_or_else(|| ModelError::UnknownClass {
                    subject: format!("cluster {cid:?}"),
                    class: class.clone(),
                })?;
            if leaf_of_class[usize::from(k)].is_none() {
                return Err(ModelError::NoLeafForClass {
                    cluster: cid.clone(),
                    class: class.clone(),
                });
            }
        }
    }
    Ok(Cluster {
        id: cid,
        lat: spec.lat,
        lon: spec.lon,
        addresses: spec.addresses,
        state: spec.state,
        nodes: out,
        leaf_of_class,
    })
}
