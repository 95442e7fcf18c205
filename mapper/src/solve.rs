//! The solver: deferred acceptance with capacities over resource trees, map units proposing
//! (DESIGN.md, "Allocation semantics"), followed by repair rounds.
//!
//! # Keys
//!
//! A cluster's preference for a unit is the tuple `(newcomer, class priority, rank, map unit
//! id)`, lower first (`newcomer` is false for every candidate of a plain instance; stickiness
//! marks incumbents). It is packed into a `u64`: 1 + 8 bits for the first two, 31 bits for the
//! rank (a non-negative finite `f32`, whose sign bit is 0 and whose bits order like the number),
//! 24 bits for the unit's index (units are indexed in id order).
//!
//! # The pass
//!
//! Every map unit with unplaced demand offers all of it to its best candidate not yet closed to
//! it. The cluster computes, at each node of the unit's path, how much of the unit it could hold
//! if it evicted every holder it likes less (`free + usage of worse holders`, divided by the
//! unit's coefficient there); it accepts the minimum of that over the path, and then evicts, node
//! by node from the leaf up, the holders it likes least until the accepted amount fits (the last
//! one possibly in part). Evicted demand goes back to its owner, which offers it again from its
//! current candidate on. A partial rejection closes the (unit, cluster) pair, so the pass makes at
//! most one closing offer per candidate, plus one offer per eviction.
//!
//! Each node keeps a max-heap of the keys of the units holding capacity there, worst on top. A
//! key packs the cluster's preference `(class priority rank, rank, map unit index)` into a `u64`
//! (8 + 32 + 24 bits); non-negative `f32` ranks order like their bit patterns, and map units are
//! indexed in id order, so comparing keys is comparing preferences. Entries are removed lazily:
//! an entry whose unit no longer holds anything at the cluster is dropped when it surfaces.
//! In a seeded solve a node's heap gets the seeded holders' keys only when it is first peeked or
//! popped (`Solver::heap_mut`).
//!
//! # Repair
//!
//! When classes consume Bps and Fps in different proportions a cluster can become *less* picky
//! for some unit after an eviction (freeing Bps at the root by squeezing a Bps-heavy class at an
//! Fps node), so the pass can end with blocking pairs. Repair rounds find them, let each such unit
//! withdraw from the clusters it likes less than the best blocking one, and re-run the pass from
//! there, until none remain or [`SolveOptions::max_repair_rounds`] is reached. The rounds used and
//! the pairs left are reported in [`SolveStats`]. The scan looks only at units whose proposal
//! pointer has moved, and skips candidates that provably still have no room for the unit
//! (`Solver::surely_full`).

use std::collections::BinaryHeap;
use std::mem::MaybeUninit;

use crate::map::{Allocation, Map};
use crate::model::{ClassIdx, ClusterIdx, ClusterState, Instance, ResourceKind, UnitIdx};
use crate::parts;
/// Re-exported where it used to live (the resolver reads it from here).
pub(crate) use crate::prefetch::prefetch;

/// Amounts and capacities below this share of a unit's demand (or a node's capacity) are noise.
pub const EPS_REL: f64 = 1e-9;

const NONE: u32 = u32::MAX;
/// After this many evictions of one unit in a solve, its holdings are evicted whole (see
/// `Solver::evict`).
const EVICTIONS_BEFORE_WHOLE: u8 = 64;
/// How many units ahead the solver's loops prefetch a unit's columns, and its candidate.
const PREFETCH_FAR: usize = 16;
const PREFETCH_NEAR: usize = 8;
/// The most removals [`Solver::surely_full`] looks at before sizing the offer instead.
const MAX_SCAN: usize = 32;
/// How many of a path's worst seeded keys a node's heap takes before the rest
/// ([`Solver::merge_worst`]).
const WORST_KEPT: usize = 8;
/// The blocking-pair scan splits over threads from this many units on (a unit's checks cost
/// far more than one step of a pass over all units).
const SCAN_PART: usize = 1 << 12;
const UNIT_BITS: u32 = 24;
const UNIT_MASK: u64 = (1 << UNIT_BITS) - 1;
/// The key bit of a newcomer (see [`crate::sticky`]): every newcomer's key is above every
/// incumbent's.
const NEWCOMER: u64 = 1 << 63;

/// Tunables of a solve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SolveOptions {
    /// At most this many repair rounds after the first pass (DESIGN.md, "Allocation semantics").
    pub max_repair_rounds: u32,
    /// The order in which map units make their first offers.
    pub arrival: Arrival,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            max_repair_rounds: 16,
            arrival: Arrival::Preference,
        }
    }
}

/// The order in which map units first propose. Where the stable allocation is unique (classes
/// in equal proportions) the order changes only the work, never the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// By the key their first candidate gives them (class priority, rank, id): units clusters
    /// like best come first and are rarely evicted later. The fast default.
    Preference,
    /// By map unit id: the textbook order, with many more evictions.
    Id,
}

/// What a solve did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SolveStats {
    /// Offers made by map units to clusters.
    pub proposals: u64,
    /// Allocations evicted, in whole or in part.
    pub evictions: u64,
    /// Evictions that took a unit's whole holding where a part was asked for, to turn a
    /// rejection rotation in one step (see `Solver::evict`); they can leave room that the
    /// repair rounds then fill.
    pub whole_evictions: u64,
    /// Repair rounds that found blocking pairs and re-ran the pass.
    pub repair_rounds: u32,
    /// Map units still in a blocking pair when the repair rounds ran out (goal: 0).
    pub blocking_pairs_left: usize,
    /// Demand a seeded solve kept where the seed had it (after shedding overloads).
    pub seeded_demand: f64,
    /// Whether a pass hit its proposal bound ([`proposal_bound`]) and stopped early, leaving
    /// the demand it had not placed as overflow. Never seen in tests; a safety net.
    pub proposal_bound_hit: bool,
}

/// The most offers one pass may make: generous (a pass makes at most one closing offer per
/// candidate plus one offer per eviction), but finite.
pub fn proposal_bound(instance: &Instance) -> u64 {
    64 * (instance.total_candidates() as u64 + instance.unit_count() as u64) + 1024
}

/// A map and how it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct Solution {
    pub map: Map,
    pub stats: SolveStats,
}

/// Solves `instance` cold: the map-unit-proposing stable allocation, repaired where the single
/// pass leaves blocking pairs. Deterministic.
pub fn solve(instance: &Instance, options: &SolveOptions) -> Solution {
    let mut s = Solver::new(instance);
    s.push_all(options.arrival);
    finish(s, options)
}

/// Solves `instance` warm, starting from `seed` (normally the previous round's map): every unit
/// whose whole demand sat at its first choice (an up cluster) keeps it there, at its new demand;
/// nodes pushed over capacity shed the holders they like least; then every other unit proposes
/// from its first choice (the units the seed left in overflow last), and repair rounds remove
/// any blocking pair left. With stickiness
/// ([`crate::sticky`]) most units' first choice is where they were, so little moves. The result
/// is stable for `instance`'s preferences, like a cold solve's, but it is a stable allocation
/// *near the seed* rather than the map-unit-optimal one. Work: one pass over the units plus the
/// proposals of the units not at their first choice. Entries of `seed` that do not fit
/// `instance` (units beyond its count, other clusters) are ignored.
pub fn solve_seeded(instance: &Instance, seed: &Map, options: &SolveOptions) -> Solution {
    seeded_in_parts(instance, seed, options, None)
}

/// [`solve_seeded`], its passes split into `parts` (by their size when `None`).
fn seeded_in_parts(
    instance: &Instance,
    seed: &Map,
    options: &SolveOptions,
    parts: Option<usize>,
) -> Solution {
    let mut s = Solver::new(instance);
    s.parts = parts;
    s.seed(seed, options.arrival);
    finish(s, options)
}

/// The pass, the repair rounds, and reading out the map.
fn finish(mut s: Solver<'_>, options: &SolveOptions) -> Solution {
    s.settle(options);
    // The heaps are not needed to read the map out: free them first, to lower the peak.
    s.heap = Vec::new();
    s.seeded = Vec::new();
    let map = s.to_map();
    Solution {
        map,
        stats: s.stats,
    }
}

/// The resource nodes (global index, coefficient > 0) that demand of each (cluster, class)
/// passes, leaf first.
struct Paths {
    classes: usize,
    start: Vec<u32>,
    node: Vec<u32>,
    coef: Vec<f64>,
}

impl Paths {
    fn new(inst: &Instance) -> Self {
        let classes = inst.classes().len();
        let mut p = Paths {
            classes,
            start: Vec::with_capacity(inst.clusters().len() * classes + 1),
            node: Vec::new(),
            coef: Vec::new(),
        };
        p.start.push(0);
        for (ci, cluster) in inst.clusters().iter().enumerate() {
            for (k, class) in inst.classes().iter().enumerate() {
                for local in cluster.path(k as ClassIdx) {
                    let q = class.per_unit.get(cluster.nodes[local as usize].kind);
                    if q > 0.0 {
                        p.node
                            .push(inst.global_node(ci as ClusterIdx, local) as u32);
                        p.coef.push(q);
                    }
                }
                p.start.push(p.node.len() as u32);
            }
        }
        p
    }

    /// The index of the (cluster, class) path: `start[id]..start[id + 1]`.
    fn id(&self, c: ClusterIdx, k: ClassIdx) -> u32 {
        (c as usize * self.classes + usize::from(k)) as u32
    }

    fn range(&self, c: ClusterIdx, k: ClassIdx) -> std::ops::Range<usize> {
        let i = c as usize * self.classes + usize::from(k);
        self.start[i] as usize..self.start[i + 1] as usize
    }
}

/// One unit's holding at one cluster; slots of a unit form a linked list.
#[derive(Clone, Copy)]
struct Slot {
    cluster: ClusterIdx,
    next: u32,
    amount: f64,
}

/// The keys of the units one part of a seeding pass seeded, grouped by (cluster, class) path
/// id, in unit order: path `p`'s are `keys[start[p]..start[p + 1]]`.
struct SeededKeys {
    keys: Vec<u64>,
    start: Vec<u32>,
}

impl SeededKeys {
    fn of_path(&self, p: usize) -> &[u64] {
        &self.keys[self.start[p] as usize..self.start[p + 1] as usize]
    }
}

/// What one part of a seeding pass found, beyond the unit states and slots it wrote.
struct SeedPart {
    keys: SeededKeys,
    /// Per path id: the demand seeded on it, and the largest key seeded on it (0: none).
    demand: Vec<f64>,
    worst: Vec<u64>,
    /// The arrival keys of the units that propose, and of those the seed left in overflow.
    pending: Vec<u64>,
    late: Vec<u64>,
}

/// What reading the state tells of a unit in the blocking-pair scan.
enum Verdict {
    /// In no blocking pair.
    Clear,
    /// In one with its candidate at this position.
    Blocking(usize),
    /// Unknown from this position on: the candidate there, offered this much demand, needs a
    /// heap walk.
    Unsure(usize, f64),
}

/// The sorted union (with repeats) of two sorted lists.
fn merge_sorted(a: Vec<u64>, b: Vec<u64>) -> Vec<u64> {
    if a.is_empty() {
        return b;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] <= b[j] {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// A resource node's state in a solve.
#[derive(Clone, Copy)]
struct NodeState {
    cap: f64,
    used: f64,
    /// At least the largest key ever pushed to the node's heap (the seeded holders'
    /// included), so a unit whose key is not below it has no worse holder there and
    /// [`Solver::size_offer`] need not look (nor build a lazy heap). Never lowered.
    worst_bound: u64,
    kind: ResourceKind,
}

/// A map unit's state in a solve.
#[derive(Clone, Copy)]
struct UnitState {
    /// Demand not placed at any cluster.
    unplaced: f64,
    /// The first of its holdings (slots), or `NONE`.
    head: u32,
    /// The position in its candidate list it proposes to next.
    next: u8,
    /// The position in its candidate list of the worst cluster it holds demand at.
    worst: u8,
    /// How often it has been evicted in this solve (saturating).
    evicted: u8,
    /// Whether it is on the stack.
    queued: bool,
}

impl UnitState {
    /// A unit with all of its demand `d` still to place.
    fn unplaced(d: f64) -> Self {
        UnitState {
            unplaced: d,
            head: NONE,
            next: 0,
            worst: 0,
            evicted: 0,
            queued: false,
        }
    }
}

/// A slot holding nothing, linked to nothing.
const BLANK_SLOT: Slot = Slot {
    cluster: 0,
    next: NONE,
    amount: 0.0,
};

struct Solver<'a> {
    inst: &'a Instance,
    paths: Paths,
    /// Per class: priority rank (dense, lower preferred) and coefficient per resource kind.
    prio_rank: Vec<u64>,
    coef: Vec<[f64; 2]>,
    up: Vec<bool>,
    /// Per global node, in one record: an offer reads all of it at each node of its path.
    node: Vec<NodeState>,
    heap: Vec<BinaryHeap<u64>>,
    /// Per node: 0 once its heap holds the seeded holders' keys (or there are none); before
    /// that, a bound above every seeded key left out (their largest plus one, or after
    /// [`Self::merge_worst`] the least key it took), see [`Self::heap_above`].
    unmerged: Vec<u64>,
    /// Per node: whether its heap holds each path's worst seeded keys ([`Self::merge_worst`]),
    /// the rest being below `unmerged`.
    merged_worst: Vec<bool>,
    /// Per path id, once a node on it needed them: its `WORST_KEPT` worst seeded keys, and the
    /// least of them if the path has more (the rest are below it), else 0.
    path_worst: Vec<Option<(Vec<u64>, u64)>>,
    /// `WORST_KEPT`, but for tests.
    worst_kept: usize,
    /// The seeded holders' keys, per part of the seeding pass (see [`Self::seed`]).
    seeded: Vec<SeededKeys>,
    /// The path ids through each node: `node_paths[node_paths_start[n]..node_paths_start[n + 1]]`
    /// (built by a seeded solve only).
    node_paths_start: Vec<u32>,
    node_paths: Vec<u32>,
    /// Per map unit, in one record so that a unit's state is one cache line.
    unit: Vec<UnitState>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    stack: Vec<UnitIdx>,
    /// Per path position: the heap entries popped while sizing an offer.
    scratch: Vec<Vec<u64>>,
    /// Demand taken back from holdings so far (for [`SolveStats::seeded_demand`]).
    removed: f64,
    /// Removals so far: each takes the next number (an *epoch*).
    epoch: u32,
    /// Per cluster: (epoch, key of the holder) of every removal there, in order.
    /// Only the newest are kept (at most `2 * MAX_SCAN`): `removal_floor` is the epoch of the
    /// newest one dropped (0: none).
    removals: Vec<Vec<(u32, u64)>>,
    removal_floor: Vec<u32>,
    /// Per cluster: the epoch of its newest removal (0: none).
    last_removal: Vec<u32>,
    /// The units whose proposal pointer has moved, each with the epoch when it first did, in
    /// that order: the only units that can be in a blocking pair (see [`Self::find_blocking`]).
    moved: Vec<(UnitIdx, u32)>,
    /// How many parts the passes that split over threads use (`None`: by their size, see
    /// [`parts::parts_for`]); set by tests.
    parts: Option<usize>,
    /// The unit ranges of the map read-out's parts (and of the seeding pass's), and how many
    /// holdings (linked slots) the units of each have: each part writes its allocations
    /// straight into the map, from the sum of the holdings before it on (see
    /// [`Self::to_map`]). Set by `push_all` or `seed`, kept by `add` and `unlink`.
    map_bounds: Vec<usize>,
    holdings: Vec<usize>,
    stats: SolveStats,
}

fn kind_index(kind: ResourceKind) -> usize {
    match kind {
        ResourceKind::Bps => 0,
        ResourceKind::Fps => 1,
    }
}

impl<'a> Solver<'a> {
    fn new(inst: &'a Instance) -> Self {
        let mut prios: Vec<u32> = inst.classes().iter().map(|c| c.priority).collect();
        prios.sort_unstable();
        prios.dedup();
        let prio_rank = inst
            .classes()
            .iter()
            .map(|c| prios.partition_point(|&p| p < c.priority) as u64)
            .collect();
        let coef = inst
            .classes()
            .iter()
            .map(|c| [c.per_unit.bps, c.per_unit.fps])
            .collect();
        let nodes = inst.node_count();
        let node = inst
            .clusters()
            .iter()
            .flat_map(|c| &c.nodes)
            .map(|n| NodeState {
                cap: n.capacity,
                used: 0.0,
                worst_bound: 0,
                kind: n.kind,
            })
            .collect();
        let paths = Paths::new(inst);
        let depth = (0..paths.start.len() - 1)
            .map(|i| (paths.start[i + 1] - paths.start[i]) as usize)
            .max()
            .unwrap_or(0);
        let n = inst.unit_count();
        Solver {
            inst,
            paths,
            prio_rank,
            coef,
            up: inst
                .clusters()
                .iter()
                .map(|c| c.state == ClusterState::Up)
                .collect(),
            node,
            heap: (0..nodes).map(|_| BinaryHeap::new()).collect(),
            unmerged: Vec::new(),
            merged_worst: Vec::new(),
            path_worst: Vec::new(),
            worst_kept: WORST_KEPT,
            seeded: Vec::new(),
            node_paths_start: Vec::new(),
            node_paths: Vec::new(),
            // Filled by `push_all` or `seed`.
            unit: Vec::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            stack: Vec::with_capacity(n),
            scratch: vec![Vec::new(); depth],
            removed: 0.0,
            epoch: 1,
            removals: vec![Vec::new(); inst.clusters().len()],
            removal_floor: vec![0; inst.clusters().len()],
            last_removal: vec![0; inst.clusters().len()],
            moved: Vec::new(),
            parts: None,
            map_bounds: Vec::new(),
            holdings: Vec::new(),
            stats: SolveStats::default(),
        }
    }

    /// The pass and the repair rounds.
    fn settle(&mut self, options: &SolveOptions) {
        self.run();
        let mut left = self.find_blocking();
        while !left.is_empty() && self.stats.repair_rounds < options.max_repair_rounds {
            self.stats.repair_rounds += 1;
            for &(u, j) in &left {
                self.move_up(u, j);
            }
            self.run();
            left = self.find_blocking();
        }
        self.stats.blocking_pairs_left = left.len();
    }

    /// Queues every unit, in the order of the key its first candidate gives it (class
    /// priority, then rank, then id): units a cluster likes best propose first, so few are
    /// evicted later. The order changes the work, not the result where the result is unique.
    fn push_all(&mut self, arrival: Arrival) {
        self.unit = self
            .inst
            .demand
            .iter()
            .map(|&d| UnitState::unplaced(d))
            .collect();
        let n = self.inst.unit_count() as UnitIdx;
        self.slots = Vec::with_capacity(n as usize + n as usize / 4);
        self.map_bounds = self.read_out_bounds();
        self.holdings = vec![0; self.map_bounds.len() - 1];
        self.queue_in_order(0..n, arrival);
    }

    /// The unit ranges the map is read out in: those of [`parts::in_parts`] for all units.
    fn read_out_bounds(&self) -> Vec<usize> {
        let n = self.inst.unit_count();
        parts::bounds(n, self.parts_for(n, parts::PARALLEL_ITEMS))
    }

    /// Counts a holding of unit `u` linked (`true`) or unlinked, for [`Self::to_map`].
    fn count_holding(&mut self, u: UnitIdx, linked: bool) {
        let part = self.map_bounds.partition_point(|&b| b <= u as usize);
        if let Some(h) = self.holdings.get_mut(part.wrapping_sub(1)) {
            // Saturating: a miscount must not wrap into a size `to_map` would allocate.
            *h = if linked {
                h.saturating_add(1)
            } else {
                h.saturating_sub(1)
            };
        }
    }

    fn queue_in_order(&mut self, units: impl Iterator<Item = UnitIdx>, arrival: Arrival) {
        let order: Vec<u64> = units
            .map(|u| Self::arrival_key(u, self.first(u), arrival))
            .collect();
        self.queue_keys(order);
    }

    /// What unit `u` is queued by: the key its first candidate gives it (`first`), or its
    /// index (the low bits of a key are the unit's index in either case).
    fn arrival_key(u: UnitIdx, first: Option<(ClusterIdx, u64)>, arrival: Arrival) -> u64 {
        match first {
            Some((_, key)) if arrival == Arrival::Preference => key,
            _ => u64::from(u),
        }
    }

    /// Queues the units of `order` (their [`Self::arrival_key`]s), lowest key first.
    fn queue_keys(&mut self, mut order: Vec<u64>) {
        order.sort_unstable();
        self.queue_sorted(&order);
    }

    /// [`Self::queue_keys`] for keys sorted already.
    fn queue_sorted(&mut self, order: &[u64]) {
        for &k in order.iter().rev() {
            let u = (k & UNIT_MASK) as UnitIdx;
            self.unit[u as usize].queued = true;
            self.stack.push(u);
        }
    }

    /// How many parts a pass over `n` items splits into ([`parts::parts_for`] with `min`,
    /// unless a test set [`Self::parts`]).
    fn parts_for(&self, n: usize, min: usize) -> usize {
        self.parts.unwrap_or_else(|| parts::parts_for(n, min))
    }

    fn tol(&self, u: UnitIdx) -> f64 {
        EPS_REL * self.inst.demand[u as usize]
    }

    /// The cluster's preference key for unit `u` reached through candidate arena index `i`:
    /// lower is preferred.
    fn key(&self, u: UnitIdx, i: usize) -> u64 {
        let (_, _, rank) = self.inst.cand_score_rank(u, i);
        self.pack_key(u, rank, self.inst.is_newcomer(u, i))
    }

    fn pack_key(&self, u: UnitIdx, rank: f32, newcomer: bool) -> u64 {
        let k = self.inst.units.class[u as usize];
        let newcomer = if newcomer { NEWCOMER } else { 0 };
        newcomer
            | (self.prio_rank[usize::from(k)] << 55)
            | (u64::from(rank.to_bits()) << UNIT_BITS)
            | u64::from(u)
    }

    /// The cluster of unit `u`'s first candidate, and the key it gives the unit.
    fn first(&self, u: UnitIdx) -> Option<(ClusterIdx, u64)> {
        let f = self.inst.first_candidate(u)?;
        Some((f.cluster, self.pack_key(u, f.rank, f.newcomer)))
    }

    fn node_coef(&self, n: usize, u: UnitIdx) -> f64 {
        let k = self.inst.units.class[u as usize];
        self.coef[usize::from(k)][kind_index(self.node[n].kind)]
    }

    fn node_tol(&self, n: usize) -> f64 {
        EPS_REL * self.node[n].cap.max(1.0)
    }

    fn find_slot(&self, u: UnitIdx, c: ClusterIdx) -> Option<u32> {
        let mut s = self.unit[u as usize].head;
        while s != NONE {
            let slot = &self.slots[s as usize];
            if slot.cluster == c {
                return Some(s);
            }
            s = slot.next;
        }
        None
    }

    fn held(&self, u: UnitIdx, c: ClusterIdx) -> f64 {
        self.find_slot(u, c)
            .map_or(0.0, |s| self.slots[s as usize].amount)
    }

    /// Drains the stack of units with unplaced demand.
    fn run(&mut self) {
        let bound = self.stats.proposals + proposal_bound(self.inst);
        while let Some(u) = self.stack.pop() {
            self.prefetch_ahead();
            self.unit[u as usize].queued = false;
            if self.stats.proposals >= bound {
                self.stats.proposal_bound_hit = true;
                continue; // what is unplaced stays unplaced: reported as overflow
            }
            self.propose(u);
        }
    }

    /// Hides the memory latency of the units about to be popped: their columns are scattered
    /// over the instance's arrays, so each pop would otherwise wait on several cache misses.
    /// Two stages, because a unit's candidates are found through its columns.
    fn prefetch_ahead(&self) {
        let len = self.stack.len();
        if len > PREFETCH_FAR {
            self.prefetch_unit(self.stack[len - PREFETCH_FAR]);
        }
        if len > PREFETCH_NEAR {
            let v = self.stack[len - PREFETCH_NEAR];
            let i = self.inst.candidate_range(v).start + usize::from(self.unit[v as usize].next);
            self.inst.prefetch_candidate(v, i);
        }
    }

    /// Like [`Self::prefetch_ahead`], for a scan over `units` now at `at`.
    fn prefetch_units(&self, units: &[(UnitIdx, u32)], at: usize) {
        if let Some(&(v, _)) = units.get(at + PREFETCH_FAR) {
            self.prefetch_unit(v);
        }
        if let Some(&(v, _)) = units.get(at + PREFETCH_NEAR) {
            self.inst
                .prefetch_candidate(v, self.inst.candidate_range(v).start);
            let s = self.unit[v as usize].head;
            if s != NONE {
                prefetch(&self.slots, s as usize);
            }
        }
    }

    /// The first stage: unit `v`'s own columns and solver state.
    fn prefetch_unit(&self, v: UnitIdx) {
        let (units, v) = (&self.inst.units, v as usize);
        prefetch(&units.cand_start, v);
        if let Some(f) = &self.inst.favour {
            prefetch(&f.start, v);
            prefetch(&f.promote, v);
        }
        prefetch(&self.inst.demand, v);
        prefetch(&units.class, v);
        prefetch(&self.unit, v);
    }

    fn propose(&mut self, u: UnitIdx) {
        let range = self.inst.candidate_range(u);
        let tol = self.tol(u);
        while self.unit[u as usize].unplaced > tol
            && usize::from(self.unit[u as usize].next) < range.len()
        {
            let i = range.start + usize::from(self.unit[u as usize].next);
            if !self.offer(u, i) {
                self.advance(u);
            }
        }
    }

    /// Offers all of `u`'s unplaced demand to its candidate at arena index `i`; returns whether
    /// all of it was accepted.
    fn offer(&mut self, u: UnitIdx, i: usize) -> bool {
        let x = self.unit[u as usize].unplaced;
        let accept = self.take(u, i, x);
        if accept >= x {
            self.unit[u as usize].unplaced = 0.0;
            true
        } else {
            self.unit[u as usize].unplaced = x - accept;
            false
        }
    }

    /// The cluster at arena index `i` takes as much as it can of `x` of unit `u`'s demand,
    /// evicting holders it likes less; returns the amount placed (the caller takes it from
    /// wherever it was).
    fn take(&mut self, u: UnitIdx, i: usize, x: f64) -> f64 {
        self.stats.proposals += 1;
        let (c, newcomer) = self.inst.cand_cluster_newcomer(u, i);
        let path = self.paths.range(c, self.inst.units.class[u as usize]);
        let accept = self.size_offer(u, i, x, (c, newcomer, path.clone()));
        if accept <= self.tol(u) {
            self.restore_scratch(path);
            return 0.0;
        }

        // Evict, leaf first, the least-liked holders until `accept` fits at every node.
        for (p, pi) in path.clone().enumerate() {
            let (n, q) = (self.paths.node[pi] as usize, self.paths.coef[pi]);
            let mut entries = std::mem::take(&mut self.scratch[p]);
            for &e in &entries {
                let need = accept * q - (self.node[n].cap - self.node[n].used);
                if need <= self.node_tol(n) {
                    self.heap[n].push(e);
                    continue;
                }
                let v = (e & UNIT_MASK) as UnitIdx;
                let amount = self.held(v, c);
                if amount <= 0.0 {
                    continue; // evicted in full at a node below
                }
                let qv = self.node_coef(n, v);
                self.stats.evictions += 1;
                if amount * qv <= need + self.node_tol(n) {
                    self.evict(v, c, amount, e);
                } else {
                    self.evict(v, c, need / qv, e);
                    self.heap[n].push(e);
                }
            }
            entries.clear();
            self.scratch[p] = entries;
        }

        let pos = i - self.inst.candidate_range(u).start;
        self.add(u, c, pos, Some(self.key(u, i)), accept);
        accept
    }

    /// How much of `x` of unit `u` the cluster at arena index `i` could hold if it evicted
    /// holders it likes less: the minimum over the path of (free + worse holders' usage) / the
    /// unit's coefficient. The worse holders it counted are left popped in `scratch`, for
    /// [`Self::take`] to evict or [`Self::restore_scratch`] to put back. `target`: the
    /// candidate's cluster, whether `u` is a newcomer there, and the path of `u`'s class.
    ///
    /// Every caller tells only whether the answer is above `u`'s tolerance, so once a node
    /// leaves no more than that the rest of the path is not looked at: most offers of a warm
    /// round's overflow are refused at their first full node.
    fn size_offer(
        &mut self,
        u: UnitIdx,
        i: usize,
        x: f64,
        (c, newcomer, path): (ClusterIdx, bool, std::ops::Range<usize>),
    ) -> f64 {
        // Between offers the scratch lists are empty: `take` and `restore_scratch` empty them.
        debug_assert!(self.scratch.iter().all(Vec::is_empty));
        if !self.up[c as usize] {
            return 0.0;
        }
        let tol = self.tol(u);
        // The key is computed only when some node has to compare it (it reads the candidate's
        // rank, often the one cache miss of a rejection).
        let mut key = None;
        // At each node, free capacity plus what worse holders could give up.
        let mut accept = x;
        for (p, pi) in path.enumerate() {
            if accept <= tol {
                break;
            }
            let (n, q) = (self.paths.node[pi] as usize, self.paths.coef[pi]);
            let free = self.node[n].cap - self.node[n].used;
            let need = x * q - free;
            if need <= self.node_tol(n) {
                continue;
            }
            let Some(key) = self.may_hold_worse(n, u, i, newcomer, &mut key) else {
                accept = accept.min((free / q).max(0.0));
                continue;
            };
            let mut got = 0.0;
            let mut last = u64::MAX;
            while got < need {
                let heap = self.heap_above(n, Some(key));
                let Some(&top) = heap.peek() else {
                    break;
                };
                if top <= key {
                    break;
                }
                heap.pop();
                if top == last {
                    continue; // a duplicate entry of the unit just taken
                }
                let v = (top & UNIT_MASK) as UnitIdx;
                let amount = self.held(v, c);
                if amount <= 0.0 {
                    continue; // stale: v no longer holds anything here
                }
                last = top;
                got += amount * self.node_coef(n, v);
                self.scratch[p].push(top);
            }
            accept = accept.min(((free + got) / q).max(0.0));
        }
        accept
    }

    /// Whether node `n` may hold units it likes less than `u` (reached through its candidate at
    /// arena index `i`): `None` when it surely holds none, so an offer gets only its free
    /// capacity there; else `u`'s key, to compare with the heap. `key` caches the key (it reads
    /// the candidate's rank, often the one cache miss of a rejection).
    fn may_hold_worse(
        &self,
        n: usize,
        u: UnitIdx,
        i: usize,
        newcomer: bool,
        key: &mut Option<u64>,
    ) -> Option<u64> {
        if newcomer && self.node[n].worst_bound < NEWCOMER {
            return None; // only incumbents hold capacity here, and it likes them all better
        }
        let key = *key.get_or_insert_with(|| self.key(u, i));
        // At or above the bound, no holder here is worse than `u`: the heap would stop at its
        // top.
        (self.node[n].worst_bound > key).then_some(key)
    }

    /// What [`Self::size_offer`] gives an offer of `x` of unit `u` at its candidate at arena
    /// index `i`, when that can be told without taking entries off a heap: when no node short
    /// of room for it may hold a unit it likes less (by `worst_bound`, or by the top of its
    /// heap once no seeded key left out of it is above the unit's, see [`Self::heap_above`]).
    /// `None` otherwise. Reads only, so threads can share it.
    fn room_without_heaps(&self, u: UnitIdx, i: usize, x: f64) -> Option<f64> {
        let (c, newcomer) = self.inst.cand_cluster_newcomer(u, i);
        if !self.up[c as usize] {
            return Some(0.0);
        }
        let mut key = None;
        let mut accept = x;
        for pi in self.paths.range(c, self.inst.units.class[u as usize]) {
            let (n, q) = (self.paths.node[pi] as usize, self.paths.coef[pi]);
            let free = self.node[n].cap - self.node[n].used;
            if x * q - free <= self.node_tol(n) {
                continue;
            }
            if let Some(key) = self.may_hold_worse(n, u, i, newcomer, &mut key) {
                if self
                    .unmerged
                    .get(n)
                    .is_some_and(|&m| m > key.saturating_add(1))
                {
                    return None; // a seeded key may be above `key`: the heap lacks them yet
                }
                if self.heap[n].peek().is_some_and(|&top| top > key) {
                    return None; // a worse holder, or a stale entry: only a walk tells
                }
            }
            accept = accept.min((free / q).max(0.0));
        }
        Some(accept)
    }

    /// Puts the entries [`Self::size_offer`] popped back into their heaps.
    fn restore_scratch(&mut self, path: std::ops::Range<usize>) {
        for (p, pi) in path.enumerate() {
            if self.scratch[p].is_empty() {
                continue; // most refusals take nothing off a heap
            }
            let n = self.paths.node[pi] as usize;
            for e in self.scratch[p].drain(..) {
                self.heap[n].push(e);
            }
        }
    }

    /// Places `amount` of `u` at `c` (its candidate at position `pos`), adding heap entries with
    /// `key` if `u` held nothing there (none when `key` is `None`: the caller builds the heaps).
    fn add(&mut self, u: UnitIdx, c: ClusterIdx, pos: usize, key: Option<u64>, amount: f64) {
        let path = self.paths.range(c, self.inst.units.class[u as usize]);
        match self.find_slot(u, c) {
            Some(s) => self.slots[s as usize].amount += amount,
            None => {
                let slot = Slot {
                    cluster: c,
                    next: self.unit[u as usize].head,
                    amount,
                };
                let s = match self.free_slots.pop() {
                    Some(s) => {
                        self.slots[s as usize] = slot;
                        s
                    }
                    None => {
                        self.slots.push(slot);
                        (self.slots.len() - 1) as u32
                    }
                };
                self.unit[u as usize].head = s;
                self.count_holding(u, true);
                self.unit[u as usize].worst = self.unit[u as usize].worst.max(pos as u8);
                if let Some(key) = key {
                    for pi in path.clone() {
                        let n = self.paths.node[pi] as usize;
                        self.heap[n].push(key);
                        self.node[n].worst_bound = self.node[n].worst_bound.max(key);
                    }
                }
            }
        }
        for pi in path {
            self.node[self.paths.node[pi] as usize].used += amount * self.paths.coef[pi];
        }
    }

    /// A cluster evicts `amount` of `v`: as DESIGN.md has it, the evicted demand "moves on to its
    /// next candidate", so if `c` is where `v` is proposing now, the pair closes and `v`'s
    /// pointer moves past it. Without this, mixed Bps/Fps proportions let two units evict each
    /// other back and forth in ever smaller amounts (the squeeze of one frees the other's
    /// binding resource); with it, every eviction closes a pair and the pass stays linear.
    ///
    /// Fractional demand has one more trap: a *rejection rotation* (x evicts a little of a, a
    /// evicts as much of b at y, b of c at z, c comes back to x and evicts a again) moves the
    /// same small amount around the loop again and again, so the offers grow like demand / δ.
    /// A unit evicted more than [`EVICTIONS_BEFORE_WHOLE`] times in one solve is therefore
    /// evicted whole from then on: the loop then turns in one step. Taking more than was
    /// needed can leave room a unit would use: the repair rounds find and fix that, and the
    /// verifier checks the end result as always.
    fn evict(&mut self, v: UnitIdx, c: ClusterIdx, amount: f64, key: u64) {
        let range = self.inst.candidate_range(v);
        let at = range.start + usize::from(self.unit[v as usize].next);
        if at < range.end && self.inst.cand_cluster(v, at) == c {
            self.advance(v);
        }
        let count = &mut self.unit[v as usize].evicted;
        *count = count.saturating_add(1);
        let amount = if *count > EVICTIONS_BEFORE_WHOLE {
            let held = self.held(v, c);
            if held > amount {
                self.stats.whole_evictions += 1;
            }
            held
        } else {
            amount
        };
        self.remove(v, c, amount, key);
    }

    /// Moves `u`'s proposal pointer past its current candidate (the pair closes).
    fn advance(&mut self, u: UnitIdx) {
        if self.unit[u as usize].next == 0 {
            self.moved.push((u, self.epoch));
        }
        self.unit[u as usize].next += 1;
    }

    /// Takes `amount` of `v`'s holding at `c` back into `v`'s unplaced demand (all of it if
    /// what would remain is noise) and queues `v` to offer it again.
    /// `key`: `c`'s key for `v`, recorded with the removal (see [`Self::surely_full`]).
    fn remove(&mut self, v: UnitIdx, c: ClusterIdx, amount: f64, key: u64) {
        let Some(s) = self.find_slot(v, c) else {
            return;
        };
        let held = self.slots[s as usize].amount;
        let amount = if held - amount <= self.tol(v) {
            self.unlink(v, s);
            self.update_worst(v);
            held
        } else {
            self.slots[s as usize].amount = held - amount;
            amount
        };
        for pi in self.paths.range(c, self.inst.units.class[v as usize]) {
            self.node[self.paths.node[pi] as usize].used -= amount * self.paths.coef[pi];
        }
        self.unit[v as usize].unplaced += amount;
        self.removed += amount;
        self.epoch = self.epoch.saturating_add(1);
        let log = &mut self.removals[c as usize];
        if log.len() >= 2 * MAX_SCAN {
            self.removal_floor[c as usize] = log[MAX_SCAN - 1].0;
            log.drain(..MAX_SCAN);
        }
        log.push((self.epoch, key));
        self.last_removal[c as usize] = self.epoch;
        if !self.unit[v as usize].queued {
            self.unit[v as usize].queued = true;
            self.stack.push(v);
        }
    }

    /// Recomputes the position of the worst cluster `v` holds demand at.
    fn update_worst(&mut self, v: UnitIdx) {
        let mut worst = 0;
        let mut s = self.unit[v as usize].head;
        while s != NONE {
            let slot = self.slots[s as usize];
            if let Some(j) = self.inst.candidate_position(v, slot.cluster) {
                worst = worst.max(j);
            }
            s = slot.next;
        }
        self.unit[v as usize].worst = worst as u8;
    }

    fn unlink(&mut self, v: UnitIdx, s: u32) {
        let next = self.slots[s as usize].next;
        if self.unit[v as usize].head == s {
            self.unit[v as usize].head = next;
        } else {
            let mut p = self.unit[v as usize].head;
            while self.slots[p as usize].next != s {
                p = self.slots[p as usize].next;
            }
            self.slots[p as usize].next = next;
        }
        self.slots[s as usize].amount = 0.0;
        self.free_slots.push(s);
        self.count_holding(v, false);
    }

    /// How much more of `u` (up to `x`) its candidate at arena index `i` could take — the same
    /// sizing an offer makes, so a pair found blocking here is one an offer will improve.
    fn room_for(&mut self, u: UnitIdx, i: usize, x: f64) -> f64 {
        let (c, newcomer) = self.inst.cand_cluster_newcomer(u, i);
        let path = self.paths.range(c, self.inst.units.class[u as usize]);
        let room = self.size_offer(u, i, x, (c, newcomer, path.clone()));
        self.restore_scratch(path);
        room
    }

    /// Warm start from `seed` (see [`solve_seeded`]). The pass over the units runs in parts
    /// by unit range ([`parts`]), each on its own thread writing its own units' states and
    /// home slots (slot `u` is unit `u`'s first); the parts' sums and keys are joined in
    /// unit order, so the solve does not depend on the machine.
    fn seed(&mut self, seed: &Map, arrival: Arrival) {
        let units = self.inst.unit_count();
        let n = units.min(seed.unit_count());
        let paths = self.paths.start.len() - 1;
        // Every unit gets its home slot; a unit not seeded leaves its own unused. The parts
        // write every unit's state and home slot, into memory not written before. The heaps
        // are not built here: a node's heap takes the seeded keys of the paths through it only
        // when a walk may reach them (`heap_above`), which many nodes never need; pushes before
        // that go to the heap as usual, so every walk sees the same keys as on heaps built up
        // front: the solve is the same, only cheaper.
        let mut unit: Vec<UnitState> = Vec::with_capacity(units);
        let mut slots: Vec<Slot> = Vec::with_capacity(units + units / 4);
        // The map read-out's parts: each part's seeded units are its first holdings.
        let bounds = self.read_out_bounds();
        let mut chunks = Vec::with_capacity(bounds.len() - 1);
        let mut unit_rest = &mut unit.spare_capacity_mut()[..units];
        let mut slot_rest = &mut slots.spare_capacity_mut()[..units];
        for w in bounds.windows(2) {
            let (u, u_rest) = std::mem::take(&mut unit_rest).split_at_mut(w[1] - w[0]);
            let (sl, sl_rest) = std::mem::take(&mut slot_rest).split_at_mut(w[1] - w[0]);
            chunks.push((w[0], u, sl));
            (unit_rest, slot_rest) = (u_rest, sl_rest);
        }
        let this = &*self;
        let done = parts::run_parts(chunks, |(from, unit, slots)| {
            this.seed_part(seed, n, arrival, from, unit, slots)
        });
        // SAFETY: the chunks cover elements 0..units of both spare capacities, each part wrote
        // every element of its chunks (`seed_part` writes both for each unit), and every part
        // has returned (a panic in one would have been resumed above, leaving both empty).
        unsafe {
            unit.set_len(units);
            slots.set_len(units);
        }
        self.unit = unit;
        self.slots = slots;
        self.holdings = done.iter().map(|part| part.keys.keys.len()).collect();
        self.map_bounds = bounds;
        // Each node's usage, from the demand seeded per path.
        let mut seeded_total = 0.0;
        for part in &done {
            for (p, &d) in part.demand.iter().enumerate() {
                if d == 0.0 {
                    continue;
                }
                seeded_total += d;
                for pi in self.paths.start[p] as usize..self.paths.start[p + 1] as usize {
                    self.node[self.paths.node[pi] as usize].used += d * self.paths.coef[pi];
                }
            }
        }
        // The paths through each node.
        let nodes = self.heap.len();
        let mut through = vec![0u32; nodes + 1];
        for &node in &self.paths.node {
            through[node as usize + 1] += 1;
        }
        for i in 0..nodes {
            through[i + 1] += through[i];
        }
        let mut node_paths = vec![0u32; self.paths.node.len()];
        let mut fill = through.clone();
        for p in 0..paths {
            let (a, b) = (self.paths.start[p], self.paths.start[p + 1]);
            for pi in a as usize..b as usize {
                let node = self.paths.node[pi] as usize;
                node_paths[fill[node] as usize] = p as u32;
                fill[node] += 1;
            }
        }
        // Each node's worst seeded key, for `worst_bound` and `unmerged`.
        self.unmerged = vec![0; nodes];
        self.merged_worst = vec![false; nodes];
        self.path_worst = vec![None; paths];
        for part in &done {
            for (p, &worst) in part.worst.iter().enumerate() {
                if part.keys.of_path(p).is_empty() {
                    continue;
                }
                for pi in self.paths.start[p] as usize..self.paths.start[p + 1] as usize {
                    let n = self.paths.node[pi] as usize;
                    self.node[n].worst_bound = self.node[n].worst_bound.max(worst);
                    self.unmerged[n] = self.unmerged[n].max(worst.saturating_add(1));
                }
            }
        }
        self.node_paths_start = through;
        self.node_paths = node_paths;
        let (mut pending, mut late) = (Vec::new(), Vec::new());
        self.seeded = done
            .into_iter()
            .map(|part| {
                pending = merge_sorted(std::mem::take(&mut pending), part.pending);
                late = merge_sorted(std::mem::take(&mut late), part.late);
                part.keys
            })
            .collect();
        // Shed what no longer fits (demand grew, capacity shrank), children before parents.
        let removed_before = self.removed;
        for c in 0..self.inst.clusters().len() as ClusterIdx {
            for local in (0..self.inst.clusters()[c as usize].nodes.len() as u32).rev() {
                self.shed(c, self.inst.global_node(c, local));
            }
        }
        self.stats.seeded_demand = seeded_total - (self.removed - removed_before);
        // Units the shedding gave demand back to are queued already: they propose last. Before
        // them, the units the seed left in overflow: most are refused by every candidate again,
        // and a refusal made after the others have settled is rarely undone by a later removal,
        // so the blocking-pair scan passes it (`surely_full`) instead of sizing the offer
        // again; fewer of them are accepted and then evicted on the way, too.
        self.queue_sorted(&late);
        self.queue_sorted(&pending);
    }

    /// One part of the seeding pass: the units from `from` on, whose states are `unit` and
    /// whose home slots are `slots`, every one of which it writes. A unit [`Self::keep_seed`]
    /// keeps is placed whole at its first choice; every other unit's arrival key is taken
    /// here, while the unit is in cache.
    fn seed_part(
        &self,
        seed: &Map,
        n: usize,
        arrival: Arrival,
        from: usize,
        unit: &mut [MaybeUninit<UnitState>],
        slots: &mut [MaybeUninit<Slot>],
    ) -> SeedPart {
        let paths = self.paths.start.len() - 1;
        let mut demand = vec![0.0; paths];
        let mut worst = vec![0u64; paths];
        let mut count = vec![0u32; paths + 1];
        let (mut seeded, mut seeded_path) = (Vec::with_capacity(unit.len()), Vec::new());
        seeded_path.reserve(unit.len());
        let (mut pending, mut late) = (Vec::new(), Vec::new());
        for (local, (state, slot)) in unit.iter_mut().zip(slots.iter_mut()).enumerate() {
            let u = (from + local) as UnitIdx;
            let d = self.inst.demand[u as usize];
            let head = self.first(u);
            let Some((first, key)) = head.filter(|&(c, _)| self.keep_seed(seed, u, n, c)) else {
                state.write(UnitState::unplaced(d));
                slot.write(BLANK_SLOT);
                if d > self.tol(u) {
                    let key = Self::arrival_key(u, head, arrival);
                    if (u as usize) < n && seed.overflow(u) != 0.0 {
                        late.push(key);
                    } else {
                        pending.push(key);
                    }
                }
                continue;
            };
            slot.write(Slot {
                cluster: first,
                next: NONE,
                amount: d,
            });
            state.write(UnitState {
                unplaced: 0.0,
                head: u,
                ..UnitState::unplaced(d)
            });
            let path = self.paths.id(first, self.inst.units.class[u as usize]) as usize;
            demand[path] += d;
            worst[path] = worst[path].max(key);
            count[path] += 1;
            seeded.push(key);
            seeded_path.push(path as u32);
        }
        // Group the keys by path (a counting sort).
        let mut start = Vec::with_capacity(paths + 1);
        let mut acc = 0u32;
        for &c in &count {
            start.push(acc);
            acc += c;
        }
        let mut fill = start.clone();
        let mut keys = vec![0u64; seeded.len()];
        for (&key, &path) in seeded.iter().zip(&seeded_path) {
            let at = &mut fill[path as usize];
            keys[*at as usize] = key;
            *at += 1;
        }
        // Sorted here, on the part's thread: the join only merges.
        pending.sort_unstable();
        late.sort_unstable();
        SeedPart {
            keys: SeededKeys { keys, start },
            demand,
            worst,
            pending,
            late,
        }
    }

    /// Whether unit `u` keeps its place from `seed`: only a unit whose whole demand sat at its
    /// first choice (an up cluster) does; any other unit proposes afresh from its first choice
    /// (its incumbent bonus usually brings it back where it was). Seeded units cannot be in a
    /// blocking pair, and the fresh proposals follow deferred acceptance, so repair has little
    /// left to do. `n`: the units both the instance and the seed have.
    /// `first`: the cluster of its first candidate.
    fn keep_seed(&self, seed: &Map, u: UnitIdx, n: usize, first: ClusterIdx) -> bool {
        if u as usize >= n {
            return false;
        }
        let d = self.inst.demand[u as usize];
        let allocs = seed.allocations(u);
        let at_first = allocs.iter().any(|a| a.cluster == first && a.amount > 0.0);
        let elsewhere =
            allocs.iter().any(|a| a.cluster != first && a.amount != 0.0) || seed.overflow(u) != 0.0;
        at_first && !elsewhere && self.up[first as usize] && d > 0.0
    }

    /// Node `n`'s heap, with the seeded holders' keys merged in on first use (see
    /// [`Self::seed`]).
    fn heap_mut(&mut self, n: usize) -> &mut BinaryHeap<u64> {
        if self.unmerged.get(n).is_some_and(|&m| m != 0) {
            self.unmerged[n] = 0;
            let mut entries = std::mem::take(&mut self.heap[n]).into_vec();
            let (a, b) = (self.node_paths_start[n], self.node_paths_start[n + 1]);
            for &p in &self.node_paths[a as usize..b as usize] {
                // After `merge_worst`, only the keys below each path's worst few are left.
                let below = match &self.path_worst[p as usize] {
                    Some((_, least)) if self.merged_worst[n] => *least,
                    _ => u64::MAX,
                };
                for part in &self.seeded {
                    let keys = part.of_path(p as usize);
                    if below == u64::MAX {
                        entries.extend_from_slice(keys);
                    } else {
                        entries.extend(keys.iter().filter(|&&k| k < below));
                    }
                }
            }
            self.heap[n] = BinaryHeap::from(entries);
        }
        &mut self.heap[n]
    }

    /// Pushes the worst few seeded keys of each path through node `n` onto its heap (at most
    /// `WORST_KEPT` a path, found once per path), and lowers `unmerged` to the least of them
    /// where a path has more: a walk that stops before that (shedding one or two holders, an
    /// offer making room by evicting a few) needs no more of them.
    fn merge_worst(&mut self, n: usize) {
        self.merged_worst[n] = true;
        let (a, b) = (self.node_paths_start[n], self.node_paths_start[n + 1]);
        let mut below = 0;
        for pi in a as usize..b as usize {
            let p = self.node_paths[pi] as usize;
            if self.path_worst[p].is_none() {
                let kept = self.worst_kept.max(1);
                let mut worst: Vec<u64> = Vec::with_capacity(kept + 1);
                let mut more = false;
                for part in &self.seeded {
                    for &k in part.of_path(p) {
                        if worst.len() == kept && worst.last().is_some_and(|&w| k <= w) {
                            more = true;
                            continue;
                        }
                        let at = worst.partition_point(|&w| w > k);
                        worst.insert(at, k);
                        if worst.len() > kept {
                            worst.pop();
                            more = true;
                        }
                    }
                }
                let least = if more { worst[worst.len() - 1] } else { 0 };
                self.path_worst[p] = Some((worst, least));
            }
            if let Some((worst, least)) = &self.path_worst[p] {
                self.heap[n].extend(worst.iter().copied());
                below = below.max(*least);
            }
        }
        // The keys left out are below `below`: `m - 1` bounds them, as `heap_above` reads it.
        self.unmerged[n] = below;
    }

    /// Node `n`'s heap, for the next step of a walk over the entries above `key`: its top is
    /// the largest entry there is. The seeded keys are merged in only once the walk may reach
    /// them: not while none is above `key` (a newcomer's offer, above every seeded incumbent,
    /// never merges), nor while the top of what was pushed is at least the largest of them (an
    /// incumbent's offer that the newcomers held there make room for); and then in two steps,
    /// each path's worst few first ([`Self::merge_worst`]), the rest once the walk goes below
    /// them. `key`: `None` for a walk over every entry (shedding). The walk pops the same
    /// entries in the same order as on the merged heap.
    fn heap_above(&mut self, n: usize, key: Option<u64>) -> &mut BinaryHeap<u64> {
        // `m - 1` bounds the seeded keys left out (none when `m` is 0).
        let m = self.unmerged.get(n).copied().unwrap_or(0);
        let floor = key.map_or(0, |k| k.saturating_add(1));
        if m > floor && self.heap[n].peek().is_none_or(|&top| top < m - 1) {
            if !self.merged_worst[n] {
                self.merge_worst(n);
                return self.heap_above(n, key);
            }
            return self.heap_mut(n);
        }
        &mut self.heap[n]
    }

    /// Evicts the holders node `n` of cluster `c` likes least until it is within capacity.
    fn shed(&mut self, c: ClusterIdx, n: usize) {
        let mut last = u64::MAX;
        loop {
            let excess = self.node[n].used - self.node[n].cap;
            if excess <= self.node_tol(n) {
                return;
            }
            let Some(top) = self.heap_above(n, None).pop() else {
                return;
            };
            let v = (top & UNIT_MASK) as UnitIdx;
            let amount = self.held(v, c);
            if top == last || amount <= 0.0 {
                continue; // duplicate or stale
            }
            last = top;
            let q = self.node_coef(n, v);
            if q <= 0.0 {
                continue;
            }
            self.stats.evictions += 1;
            if amount * q <= excess + self.node_tol(n) {
                self.evict(v, c, amount, top);
            } else {
                self.evict(v, c, excess / q, top);
                self.heap[n].push(top);
            }
        }
    }

    /// For every unit in a blocking pair, the position of its best blocking candidate.
    ///
    /// Only a unit whose pointer has moved can be in a blocking pair: one holds demand only at
    /// candidates up to its pointer, and one left with unplaced demand after a pass has offered
    /// it to every candidate (unless the proposal bound was hit). So only those are scanned,
    /// in two sweeps: first, on several threads ([`parts`]), every check that reading the
    /// state settles ([`Self::scan_unit`]); then, in unit order on this thread, the checks
    /// that must walk a heap. A walk changes no decision (it only drops stale entries and
    /// builds lazy heaps), so the pairs found are the same as in one sequential sweep.
    fn find_blocking(&mut self) -> Vec<(UnitIdx, usize)> {
        // Past the proposal bound some units have candidates they never offered to.
        let skip = !self.stats.proposal_bound_hit;
        let units: Vec<(UnitIdx, u32)> = if skip {
            self.moved.sort_unstable();
            self.moved.clone()
        } else {
            (0..self.inst.unit_count() as UnitIdx)
                .map(|u| (u, 0))
                .collect()
        };
        let this = &*self;
        let parts = self.parts_for(units.len(), SCAN_PART);
        let verdicts = parts::in_parts(units.len(), parts, |r| {
            let mut held = Vec::new();
            r.map(|at| {
                this.prefetch_units(&units, at);
                this.scan_unit(units[at], skip, 0, &mut held)
            })
            .collect::<Vec<_>>()
        });
        let mut out = Vec::new();
        let mut held = Vec::new();
        for (&(u, since), verdict) in units.iter().zip(verdicts.into_iter().flatten()) {
            let mut verdict = verdict;
            while let Verdict::Unsure(j, movable) = verdict {
                let i = self.inst.candidate_range(u).start + j;
                verdict = if self.room_for(u, i, movable) > self.tol(u) {
                    Verdict::Blocking(j)
                } else {
                    self.scan_unit((u, since), skip, j + 1, &mut held)
                };
            }
            if let Verdict::Blocking(j) = verdict {
                out.push((u, j));
            }
        }
        #[cfg(debug_assertions)]
        self.check_scan(&units, skip);
        out
    }

    /// The blocking-pair scan of unit `u` (whose pointer first moved at epoch `since`) from
    /// its candidate position `from` on, reading only: the first candidate it would rather
    /// have more demand at that has room for it, or the first whose room only a heap walk can
    /// tell. `held`: scratch.
    fn scan_unit(
        &self,
        (u, since): (UnitIdx, u32),
        skip: bool,
        from: usize,
        held: &mut Vec<(usize, f64)>,
    ) -> Verdict {
        let worst = self.scan_limit(u);
        if worst <= from {
            return Verdict::Clear;
        }
        self.held_positions(u, held);
        let (range, tol) = (self.inst.candidate_range(u), self.tol(u));
        for j in from..worst {
            let movable = self.movable(u, j, held);
            if movable <= tol || (skip && self.surely_full(u, range.start + j, since)) {
                continue;
            }
            match self.room_without_heaps(u, range.start + j, movable) {
                Some(room) if room <= tol => continue,
                Some(_) => return Verdict::Blocking(j),
                None => return Verdict::Unsure(j, movable),
            }
        }
        Verdict::Clear
    }

    /// The candidate positions the scan checks for unit `u` are those before this one: the
    /// candidates it likes more than some of its demand's place (all, if some is unplaced).
    fn scan_limit(&self, u: UnitIdx) -> usize {
        if self.unit[u as usize].unplaced > self.tol(u) {
            self.inst.candidate_count(u)
        } else {
            usize::from(self.unit[u as usize].worst)
        }
    }

    /// Unit `u`'s demand at each candidate position it holds some at (usually one), into
    /// `held`.
    fn held_positions(&self, u: UnitIdx, held: &mut Vec<(usize, f64)>) {
        held.clear();
        let mut s = self.unit[u as usize].head;
        while s != NONE {
            let slot = self.slots[s as usize];
            if let Some(p) = self.inst.candidate_position(u, slot.cluster) {
                held.push((p, slot.amount));
            }
            s = slot.next;
        }
    }

    /// The demand unit `u` would move to its candidate at position `j` if it could: what is
    /// unplaced and what it holds at candidates after `j` (`held`: [`Self::held_positions`]).
    fn movable(&self, u: UnitIdx, j: usize, held: &[(usize, f64)]) -> f64 {
        self.unit[u as usize].unplaced
            + held
                .iter()
                .filter(|&&(p, _)| p > j)
                .map(|&(_, a)| a)
                .sum::<f64>()
    }

    /// Checks (in debug builds) every candidate the scan passed by [`Self::surely_full`], and
    /// that every unit whose pointer never moved is placed.
    #[cfg(debug_assertions)]
    fn check_scan(&mut self, units: &[(UnitIdx, u32)], skip: bool) {
        if !skip {
            return;
        }
        let mut held = Vec::new();
        for &(u, since) in units {
            let worst = self.scan_limit(u);
            self.held_positions(u, &mut held);
            let start = self.inst.candidate_range(u).start;
            for j in 0..worst {
                let movable = self.movable(u, j, &held);
                if movable > self.tol(u) && self.surely_full(u, start + j, since) {
                    self.check_full(u, start + j, movable);
                }
            }
        }
        for u in 0..self.inst.unit_count() as UnitIdx {
            if self.unit[u as usize].next == 0 {
                assert!(self.unit[u as usize].worst == 0, "unit {u}");
                assert!(
                    self.unit[u as usize].unplaced <= self.tol(u)
                        || self.inst.candidate_count(u) == 0,
                    "unit {u}"
                );
            }
        }
    }

    /// Whether the cluster at arena index `i` surely has no room for `u` (one of the
    /// candidates its proposal pointer has passed), without sizing an offer.
    ///
    /// The pointer passes a candidate only when the cluster took less than all that was
    /// offered (a partial or zero acceptance) or evicted `u` there. Right after a partial or
    /// zero acceptance, the node that limited it has no room for `u`: its free capacity plus
    /// the usage of the holders it likes less than `u` — what [`Self::size_offer`] counts —
    /// is about zero (below `u`'s tolerance for a zero acceptance). That sum cannot grow while
    /// the cluster only gains holders (one it likes less than `u` turns free capacity into
    /// such usage; a better one uses up free capacity), nor when it loses a holder it likes
    /// less than `u` (usage of such holders turns back into free capacity). It can grow only
    /// by a removal there of `u` itself or of a holder the cluster likes better. So if no such
    /// removal happened at the cluster since `u`'s pointer first moved, the cluster still has
    /// no room for `u`. An eviction that moved the pointer is itself a removal of `u` after
    /// that moment, so it never passes this test. Only float rounding and the node tolerance
    /// separate this from `room_for(..) <= tol`, and the verifier's tolerances are wider.
    /// Scans the cluster's removals newest first and gives up (false) after a few.
    /// `since`: the epoch when `u`'s pointer first moved.
    fn surely_full(&self, u: UnitIdx, i: usize, since: u32) -> bool {
        if since == 0 || self.epoch == u32::MAX {
            return false;
        }
        let c = self.inst.cand_cluster(u, i);
        if self.last_removal[c as usize] <= since {
            return true; // no removal there since: the log need not be read
        }
        let mut key = None;
        let mut scanned = 0;
        for &(epoch, k) in self.removals[c as usize].iter().rev() {
            if epoch <= since {
                break;
            }
            scanned += 1;
            let key = *key.get_or_insert_with(|| self.key(u, i));
            if k <= key || scanned > MAX_SCAN {
                return false;
            }
        }
        // Removals dropped from the log are older than those kept: none may be after `since`.
        self.removal_floor[c as usize] <= since
    }

    /// Checks (in debug builds) that a candidate [`Self::surely_full`] passed over indeed has
    /// no room for `u` beyond the tolerances.
    #[cfg(debug_assertions)]
    fn check_full(&mut self, u: UnitIdx, i: usize, movable: f64) {
        let c = self.inst.cand_cluster(u, i);
        let path = self.paths.range(c, self.inst.units.class[u as usize]);
        let band = self.tol(u)
            + path
                .map(|pi| self.node_tol(self.paths.node[pi] as usize) / self.paths.coef[pi])
                .sum::<f64>();
        let room = self.room_for(u, i, movable);
        assert!(
            room <= band,
            "unit {u} candidate {i}: room {room} > band {band}"
        );
    }

    /// Repairs the blocking pair of `u` and its candidate at position `j`: offers the cluster
    /// the demand `u` has in overflow and at candidates after `j`, and moves what it takes from
    /// there (overflow first, then the worst clusters). Only what is accepted moves, so a pair
    /// that another unit's repair already used up costs nothing, and each move is a strict
    /// improvement for the unit; the room a move leaves behind is found by the next scan.
    fn move_up(&mut self, u: UnitIdx, j: usize) {
        let range = self.inst.candidate_range(u);
        let movable = self.unit[u as usize].unplaced
            + (range.start + j + 1..range.end)
                .map(|i| self.held(u, self.inst.cand_cluster(u, i)))
                .sum::<f64>();
        if movable <= self.tol(u) {
            return;
        }
        let mut moved = self.take(u, range.start + j, movable);
        let from_overflow = moved.min(self.unit[u as usize].unplaced);
        self.unit[u as usize].unplaced -= from_overflow;
        moved -= from_overflow;
        for p in (j + 1..range.len()).rev() {
            if moved <= 0.0 {
                break;
            }
            let c = self.inst.cand_cluster(u, range.start + p);
            let held = self.held(u, c);
            if held > 0.0 {
                let amount = held.min(moved);
                let key = self.key(u, range.start + p);
                self.remove(u, c, amount, key);
                // `remove` hands the amount back as unplaced: it is placed at `j` already.
                self.unit[u as usize].unplaced -= amount;
                moved -= amount;
            }
        }
    }

    /// The map, read out in parts by unit range ([`parts`]), each part on its own thread
    /// writing its units straight into the map's columns: its allocations go from the sum of
    /// the holdings of the parts before it on, which the solver counted as it went, so no part
    /// waits for another and nothing is copied after.
    fn to_map(&self) -> Map {
        let n = self.inst.unit_count();
        let bounds = self.read_out_bounds();
        let total: usize = self.holdings.iter().sum();
        // Every holding is a slot: more would be a miscount.
        if bounds != self.map_bounds
            || bounds.len() != self.holdings.len() + 1
            || total > self.slots.len()
        {
            debug_assert!(false, "read-out parts {bounds:?} not counted");
            return self.map_in_one_part();
        }
        let mut start: Vec<u32> = Vec::with_capacity(n + 1);
        let mut allocations: Vec<Allocation> = Vec::with_capacity(total);
        let mut overflow: Vec<f64> = Vec::with_capacity(n);
        start.push(0);
        let mut chunks = Vec::with_capacity(self.holdings.len());
        let mut start_rest = &mut start.spare_capacity_mut()[..n];
        let mut alloc_rest = &mut allocations.spare_capacity_mut()[..total];
        let mut over_rest = &mut overflow.spare_capacity_mut()[..n];
        let mut offset = 0;
        for (w, &count) in bounds.windows(2).zip(&self.holdings) {
            let len = w[1] - w[0];
            let (st, st_rest) = std::mem::take(&mut start_rest).split_at_mut(len);
            let (al, al_rest) = std::mem::take(&mut alloc_rest).split_at_mut(count);
            let (ov, ov_rest) = std::mem::take(&mut over_rest).split_at_mut(len);
            chunks.push((w[0]..w[1], offset, st, al, ov));
            (start_rest, alloc_rest, over_rest) = (st_rest, al_rest, ov_rest);
            offset += count;
        }
        let written = parts::run_parts(chunks, |(units, offset, st, al, ov)| {
            self.map_part(units, offset, st, al, ov)
        });
        if written != self.holdings {
            // A miscount would leave allocations unwritten: never read them, read the map
            // out again in one part.
            debug_assert!(
                false,
                "holdings {:?} counted, {written:?} written",
                self.holdings
            );
            return self.map_in_one_part();
        }
        // SAFETY: the chunks cover elements 1..=n of `start`'s capacity, 0..total of
        // `allocations`' and 0..n of `overflow`'s. Every part has returned (a panic in one
        // would have been resumed above, before this), writing one start and one overflow per
        // unit of its range, and as many allocations as its chunk holds: `written`, checked
        // equal to the chunk lengths just above.
        unsafe {
            start.set_len(n + 1);
            allocations.set_len(total);
            overflow.set_len(n);
        }
        Map::from_columns(start, allocations, overflow)
    }

    /// The units in `units`, written to their chunks of the map's columns: `start` and
    /// `overflow` take one entry per unit (its end in the allocations, counted from `offset`,
    /// and its overflow), `allocations` the units' allocations. Returns how many allocations
    /// the units have; only those that fit were written.
    fn map_part(
        &self,
        units: std::ops::Range<usize>,
        offset: usize,
        start: &mut [MaybeUninit<u32>],
        allocations: &mut [MaybeUninit<Allocation>],
        overflow: &mut [MaybeUninit<f64>],
    ) -> usize {
        let mut at = 0;
        let mut held = Vec::new();
        for (k, u) in (units.start as UnitIdx..units.end as UnitIdx).enumerate() {
            self.holdings_of(u, &mut held, |a| {
                if let Some(slot) = allocations.get_mut(at) {
                    slot.write(a);
                }
                at += 1;
            });
            start[k].write((offset + at) as u32);
            overflow[k].write(self.unit[u as usize].unplaced);
        }
        at
    }

    /// The map read out on this thread alone (what [`Self::to_map`] falls back to).
    fn map_in_one_part(&self) -> Map {
        let n = self.inst.unit_count();
        let mut map = Map::with_capacity(n, self.slots.len() - self.free_slots.len());
        let (mut held, mut one) = (Vec::new(), Vec::new());
        for u in 0..n as UnitIdx {
            one.clear();
            self.holdings_of(u, &mut held, |a| one.push(a));
            map.push_unit(one.iter().copied(), self.unit[u as usize].unplaced);
        }
        map
    }

    /// Unit `u`'s holdings, as allocations in its preference order, to `emit`. `held`:
    /// scratch.
    fn holdings_of(
        &self,
        u: UnitIdx,
        held: &mut Vec<(usize, Allocation)>,
        mut emit: impl FnMut(Allocation),
    ) {
        let s = self.unit[u as usize].head;
        if s == NONE {
            return;
        }
        let slot = self.slots[s as usize];
        debug_assert!(
            slot.amount > 0.0,
            "unit {u} holds {} at a slot",
            slot.amount
        );
        if slot.next == NONE {
            // One holding (most units): no order to find.
            emit(Allocation {
                cluster: slot.cluster,
                amount: slot.amount,
            });
            return;
        }
        held.clear();
        let mut s = s;
        while s != NONE {
            let slot = self.slots[s as usize];
            let j = self
                .inst
                .candidate_position(u, slot.cluster)
                .unwrap_or(usize::MAX);
            let a = Allocation {
                cluster: slot.cluster,
                amount: slot.amount,
            };
            held.push((j, a));
            s = slot.next;
        }
        held.sort_unstable_by_key(|&(j, _)| j);
        for &(_, a) in held.iter() {
            emit(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::parse_instance;
    use crate::model::Limits;

    /// DESIGN.md's worked example: 20 units of video arrive, then 26 of apps; the Fps node B
    /// would need 31, so 4 units of video are evicted to their next candidate and all apps fit.
    #[test]
    fn merging_sorted_lists_sorts_their_union() {
        let cases: [(Vec<u64>, Vec<u64>); 4] = [
            (vec![], vec![3, 5]),
            (vec![1, 4, 9], vec![]),
            (vec![1, 4, 4, 9], vec![0, 4, 10, 11]),
            (vec![7], vec![2, 3]),
        ];
        for (a, b) in cases {
            let mut want = [a.clone(), b.clone()].concat();
            want.sort_unstable();
            assert_eq!(merge_sorted(a, b), want);
        }
    }

    #[test]
    fn worked_eviction_example() {
        let json = r#"{
          "traffic_classes": [
            {"name": "video", "priority": 1, "per_unit": {"bps": 1.0, "fps": 0.25}},
            {"name": "apps", "priority": 0, "per_unit": {"bps": 0.25, "fps": 1.0}}],
          "clusters": [
            {"id": "c1", "lat": 0, "lon": 0, "resources":
              {"name": "A", "kind": "bps", "capacity": 26.5, "children": [
                {"name": "B", "kind": "fps", "capacity": 30, "children": [
                  {"name": "video", "kind": "fps", "capacity": 1000, "classes": ["video"]},
                  {"name": "apps", "kind": "fps", "capacity": 1000, "classes": ["apps"]}]}]}},
            {"id": "c2", "lat": 0, "lon": 0, "resources":
              {"name": "root", "kind": "bps", "capacity": 1000, "classes": ["video"]}}],
          "map_units": [
            {"id": "1-video", "class": "video", "demand": 20, "lat": 0, "lon": 0,
             "candidates": [{"cluster": "c1", "score": 5}, {"cluster": "c2", "score": 9}]},
            {"id": "2-apps", "class": "apps", "demand": 26, "lat": 0, "lon": 0,
             "candidates": [{"cluster": "c1", "score": 5}]}]
        }"#;
        let inst = parse_instance(json.as_bytes(), Limits::default()).expect("valid instance");
        // Arrival by id replays the story: video ("1-video") proposes first.
        let by_id = SolveOptions {
            arrival: Arrival::Id,
            ..SolveOptions::default()
        };
        let sol = solve(&inst, &by_id);
        let video = inst.unit_index("1-video").expect("unit");
        let apps = inst.unit_index("2-apps").expect("unit");
        let c1 = inst.cluster_index("c1").expect("cluster");
        let c2 = inst.cluster_index("c2").expect("cluster");
        let got = |u| {
            sol.map
                .allocations(u)
                .iter()
                .map(|a| (a.cluster, a.amount))
                .collect::<Vec<_>>()
        };
        assert_eq!(got(video), vec![(c1, 16.0), (c2, 4.0)]);
        assert_eq!(got(apps), vec![(c1, 26.0)]);
        assert_eq!(sol.map.total_overflow(), 0.0);
        assert_eq!(sol.stats.evictions, 1);
        assert_eq!(sol.stats.blocking_pairs_left, 0);
        // The default arrival order (apps first: the cluster prefers them) gets the same map
        // without evicting anyone.
        let fast = solve(&inst, &SolveOptions::default());
        assert_eq!(fast.map, sol.map);
        assert_eq!(fast.stats.evictions, 0);
    }

    /// A random two-class world (Bps- and Fps-heavy classes over trees of both kinds), its
    /// units' demand scaled by `scale(u)`: tight enough that some demand overflows.
    fn two_class_world(seed: u64, scale: impl Fn(usize) -> f64) -> Instance {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let clusters: Vec<String> = (0..24)
            .map(|c| {
                let cap = rng.random_range(60.0..140.0f64);
                format!(
                    r#"{{"id": "c{c:02}", "lat": 0, "lon": 0, "resources": {{"name": "root", "kind": "bps", "capacity": {cap}, "children": [
                        {{"name": "f", "kind": "fps", "capacity": {f}, "children": [
                          {{"name": "v", "kind": "bps", "capacity": {v}, "classes": ["video"]}},
                          {{"name": "a", "kind": "fps", "capacity": 1000, "classes": ["apps"]}}]}}]}}}}"#,
                    f = cap * 0.8,
                    v = cap * 0.7
                )
            })
            .collect();
        let units: Vec<String> = (0..4000)
            .map(|u| {
                let k = rng.random_range(1..=8usize);
                let cands = crate::testing::random_candidates(&mut rng, 24, k, 1.0);
                let class = if u % 3 == 0 { "apps" } else { "video" };
                let demand = rng.random_range(0.5..2.0f64) * scale(u);
                format!(
                    r#"{{"id": "u{u:05}", "class": "{class}", "demand": {demand}, "lat": 0, "lon": 0, "candidates": [{cands}]}}"#
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [
                 {{"name": "video", "priority": 1, "per_unit": {{"bps": 1.0, "fps": 0.25}}}},
                 {{"name": "apps", "priority": 0, "per_unit": {{"bps": 0.25, "fps": 1.0}}}}],
               "clusters": [{}], "map_units": [{}]}}"#,
            clusters.join(","),
            units.join(",")
        );
        parse_instance(json.as_bytes(), Limits::default()).expect("valid instance")
    }

    /// A seeded solve split into 1, 2 or 3 parts (its seeding pass and its blocking-pair
    /// scan) finds the same map, up to the rounding of the usage sums, and each is stable for
    /// the effective preferences.
    /// The map read-out's parts write where the holdings counted say, through every change
    /// of a cold and of a seeded solve: the same map as read out on one thread.
    #[test]
    fn the_read_out_parts_write_where_their_holdings_say() {
        let options = SolveOptions::default();
        let first = two_class_world(11, |_| 1.0);
        let next = two_class_world(11, |u| 1.0 + 0.1 * ((u * 7919 % 201) as f64 / 100.0 - 1.0));
        let cold = solve(&first, &options);
        let eff = crate::sticky::favour_incumbents(&next, &cold.map, &Default::default())
            .expect("effective preferences");
        for parts in [1, 2, 3] {
            for seeded in [false, true] {
                let mut s = Solver::new(if seeded { &eff } else { &first });
                s.parts = Some(parts);
                if seeded {
                    s.seed(&cold.map, options.arrival);
                } else {
                    s.push_all(options.arrival);
                }
                s.settle(&options);
                assert!(s.stats.evictions > 10, "{:?}", s.stats);
                assert_eq!(s.holdings.len(), parts);
                assert_eq!(
                    s.to_map(),
                    s.map_in_one_part(),
                    "{parts} parts, seeded {seeded}"
                );
            }
        }
    }

    /// The seeded keys join a node's heap only when a walk reaches them ([`Solver::heap_above`]):
    /// the same solve as with every heap merged up front, pop for pop.
    #[test]
    fn lazy_heaps_walk_as_merged_ones() {
        let options = SolveOptions::default();
        let first = two_class_world(7, |_| 1.0);
        let cold = solve(&first, &options);
        let next = two_class_world(7, |u| 1.0 + 0.1 * ((u * 7919 % 201) as f64 / 100.0 - 1.0));
        let eff = crate::sticky::favour_incumbents(&next, &cold.map, &Default::default())
            .expect("effective preferences");
        let lazy = solve_seeded(&eff, &cold.map, &options);
        // Heaps that take each path's worst key or two first, then the rest.
        for kept in [1, 2] {
            let mut s = Solver::new(&eff);
            s.worst_kept = kept;
            s.seed(&cold.map, options.arrival);
            let staged = finish(s, &options);
            assert_eq!(lazy.stats, staged.stats, "{kept} kept");
            assert_eq!(lazy.map, staged.map, "{kept} kept");
        }
        let mut s = Solver::new(&eff);
        s.seed(&cold.map, options.arrival);
        for n in 0..s.heap.len() {
            s.heap_mut(n);
        }
        let merged = finish(s, &options);
        assert!(
            lazy.stats.evictions > 10 && lazy.stats.proposals > 100,
            "{:?}",
            lazy.stats
        );
        assert_eq!(lazy.stats, merged.stats);
        assert_eq!(lazy.map, merged.map);
    }

    #[test]
    fn the_parts_do_not_change_a_seeded_solve() {
        let options = SolveOptions::default();
        let first = two_class_world(5, |_| 1.0);
        let cold = solve(&first, &options);
        assert!(cold.map.total_overflow() > 1.0, "the world must overflow");
        // The same world, demand moved by up to ±10%.
        let next = two_class_world(5, |u| 1.0 + 0.1 * ((u * 7919 % 201) as f64 / 100.0 - 1.0));
        let eff = crate::sticky::favour_incumbents(&next, &cold.map, &Default::default())
            .expect("effective preferences");
        let one = seeded_in_parts(&eff, &cold.map, &options, Some(1));
        assert!(one.stats.proposals > 100, "{:?}", one.stats);
        for parts in [1, 2, 3] {
            let got = seeded_in_parts(&eff, &cold.map, &options, Some(parts));
            let report = crate::verify::verify(&eff, &got.map);
            assert!(
                report.is_ok(),
                "{parts} parts: {}",
                report.describe(&eff, 5)
            );
            for u in 0..eff.unit_count() as UnitIdx {
                let tol = 1e-9 * eff.demand[u as usize];
                let (a, b) = (one.map.allocations(u), got.map.allocations(u));
                assert_eq!(a.len(), b.len(), "{parts} parts, unit {u}");
                for (x, y) in a.iter().zip(b) {
                    assert!(x.cluster == y.cluster && (x.amount - y.amount).abs() <= tol);
                }
                assert!((one.map.overflow(u) - got.map.overflow(u)).abs() <= tol);
            }
        }
    }
}
