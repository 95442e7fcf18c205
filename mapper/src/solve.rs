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

use crate::map::{Allocation, Map};
use crate::model::{ClassIdx, ClusterIdx, ClusterState, Instance, ResourceKind, UnitIdx};

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
    let mut s = Solver::new(instance);
    s.seed(seed, options.arrival);
    finish(s, options)
}

/// The pass, the repair rounds, and reading out the map.
fn finish(mut s: Solver<'_>, options: &SolveOptions) -> Solution {
    s.run();
    let mut left = s.find_blocking();
    while !left.is_empty() && s.stats.repair_rounds < options.max_repair_rounds {
        s.stats.repair_rounds += 1;
        for &(u, j) in &left {
            s.move_up(u, j);
        }
        s.run();
        left = s.find_blocking();
    }
    s.stats.blocking_pairs_left = left.len();
    // The heaps are not needed to read the map out: free them first, to lower the peak.
    s.heap = Vec::new();
    s.seeded_keys = Vec::new();
    let map = s.to_map();
    Solution {
        map,
        stats: s.stats,
    }
}

/// Asks the CPU to start loading `slice[i]` into cache; a hint with no other effect.
#[inline(always)]
pub(crate) fn prefetch<T>(slice: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = slice.get(i) {
        // SAFETY: a prefetch has no architectural effect; the address is that of a live
        // element in any case. SSE (which provides it) is part of the x86_64 baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (r as *const T).cast::<i8>(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, i);
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
    /// Nodes whose heap still lacks the seeded holders' keys (see [`Self::heap_mut`]).
    lazy: Vec<bool>,
    /// The seeded holders' keys, grouped by (cluster, class) path id: path `p`'s are
    /// `seeded_keys[seeded_start[p]..seeded_start[p + 1]]`.
    seeded_keys: Vec<u64>,
    seeded_start: Vec<u32>,
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
            lazy: Vec::new(),
            seeded_keys: Vec::new(),
            seeded_start: Vec::new(),
            node_paths_start: Vec::new(),
            node_paths: Vec::new(),
            unit: inst
                .units
                .demand
                .iter()
                .map(|&d| UnitState {
                    unplaced: d,
                    head: NONE,
                    next: 0,
                    worst: 0,
                    evicted: 0,
                    queued: false,
                })
                .collect(),
            slots: Vec::with_capacity(n + n / 4),
            free_slots: Vec::new(),
            stack: Vec::with_capacity(n),
            scratch: vec![Vec::new(); depth],
            removed: 0.0,
            epoch: 1,
            removals: vec![Vec::new(); inst.clusters().len()],
            removal_floor: vec![0; inst.clusters().len()],
            last_removal: vec![0; inst.clusters().len()],
            moved: Vec::new(),
            stats: SolveStats::default(),
        }
    }

    /// Queues every unit, in the order of the key its first candidate gives it (class
    /// priority, then rank, then id): units a cluster likes best propose first, so few are
    /// evicted later. The order changes the work, not the result where the result is unique.
    fn push_all(&mut self, arrival: Arrival) {
        let n = self.inst.unit_count() as UnitIdx;
        self.queue_in_order(0..n, arrival);
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
        for &k in order.iter().rev() {
            let u = (k & UNIT_MASK) as UnitIdx;
            self.unit[u as usize].queued = true;
            self.stack.push(u);
        }
    }

    fn tol(&self, u: UnitIdx) -> f64 {
        EPS_REL * self.inst.units.demand[u as usize]
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
        prefetch(&units.demand, v);
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
        let accept = self.size_offer(u, i, x);
        let c = self.inst.cand_cluster(u, i);
        let path = self.paths.range(c, self.inst.units.class[u as usize]);
        if accept <= self.tol(u) {
            self.restore_scratch(path);
            return 0.0;
        }

        // Evict, leaf first, the least-liked holders until `accept` fits at every node.
        for (p, pi) in path.clone().enumerate() {
            let (n, q) = (self.paths.node[pi] as usize, self.paths.coef[pi]);
            let entries = std::mem::take(&mut self.scratch[p]);
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
            self.scratch[p] = entries;
        }

        let pos = i - self.inst.candidate_range(u).start;
        self.add(u, c, pos, Some(self.key(u, i)), accept);
        accept
    }

    /// How much of `x` of unit `u` the cluster at arena index `i` could hold if it evicted
    /// holders it likes less: the minimum over the path of (free + worse holders' usage) / the
    /// unit's coefficient. The worse holders it counted are left popped in `scratch`, for
    /// [`Self::take`] to evict or [`Self::restore_scratch`] to put back.
    fn size_offer(&mut self, u: UnitIdx, i: usize, x: f64) -> f64 {
        let c = self.inst.cand_cluster(u, i);
        let k = self.inst.units.class[u as usize];
        let path = self.paths.range(c, k);
        for p in 0..path.len() {
            self.scratch[p].clear();
        }
        if !self.up[c as usize] {
            return 0.0;
        }
        // The key is computed only when some node has to compare it (it reads the candidate's
        // rank, often the one cache miss of a rejection).
        let newcomer = self.inst.is_newcomer(u, i);
        let mut key = None;
        // At each node, free capacity plus what worse holders could give up.
        let mut accept = x;
        for (p, pi) in path.clone().enumerate() {
            let (n, q) = (self.paths.node[pi] as usize, self.paths.coef[pi]);
            self.scratch[p].clear();
            let free = self.node[n].cap - self.node[n].used;
            let need = x * q - free;
            if need <= self.node_tol(n) {
                continue;
            }
            if newcomer && self.node[n].worst_bound < NEWCOMER {
                // Only incumbents hold capacity here, and the cluster likes them all better.
                accept = accept.min((free / q).max(0.0));
                continue;
            }
            let key = *key.get_or_insert_with(|| self.key(u, i));
            if self.node[n].worst_bound <= key {
                // No holder here is worse than `u`: the heap would stop at its top.
                accept = accept.min((free / q).max(0.0));
                continue;
            }
            let mut got = 0.0;
            let mut last = u64::MAX;
            while got < need {
                let heap = self.heap_mut(n);
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

    /// Puts the entries [`Self::size_offer`] popped back into their heaps.
    fn restore_scratch(&mut self, path: std::ops::Range<usize>) {
        for (p, pi) in path.enumerate() {
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
    }

    /// How much more of `u` (up to `x`) its candidate at arena index `i` could take — the same
    /// sizing an offer makes, so a pair found blocking here is one an offer will improve.
    fn room_for(&mut self, u: UnitIdx, i: usize, x: f64) -> f64 {
        let room = self.size_offer(u, i, x);
        let c = self.inst.cand_cluster(u, i);
        self.restore_scratch(self.paths.range(c, self.inst.units.class[u as usize]));
        room
    }

    /// Warm start from `seed` (see [`solve_seeded`]).
    fn seed(&mut self, seed: &Map, arrival: Arrival) {
        let n = self.inst.unit_count().min(seed.unit_count());
        // The key of every seeded holding, and the number per path. The heaps are not built
        // here: a node's heap gets the seeded keys of the paths through it when first popped or
        // peeked (`heap_mut`), which many nodes never are. Pushes before that go to the heap
        // as usual and are merged then, so every pop sees the same keys as with heaps built
        // up front: the solve is the same, only cheaper.
        let mut seeded: Vec<u64> = Vec::with_capacity(n);
        let mut seeded_path: Vec<u32> = Vec::with_capacity(n);
        let paths = self.paths.start.len() - 1;
        let mut count = vec![0u32; paths + 1];
        let mut seeded_total = 0.0;
        // The arrival keys of the units that propose (not seeded, with demand), taken here
        // while the unit is in cache.
        let mut pending: Vec<u64> = Vec::new();
        let mut late: Vec<u64> = Vec::new();
        for u in 0..self.inst.unit_count() as UnitIdx {
            let head = self.first(u);
            let Some((first, key)) = head.filter(|&(c, _)| self.keep_seed(seed, u, n, c)) else {
                if self.unit[u as usize].unplaced > self.tol(u) {
                    let key = Self::arrival_key(u, head, arrival);
                    if (u as usize) < n && seed.overflow(u) != 0.0 {
                        late.push(key);
                    } else {
                        pending.push(key);
                    }
                }
                continue;
            };
            let d = self.inst.units.demand[u as usize];
            self.add(u, first, 0, None, d);
            self.unit[u as usize].unplaced = 0.0;
            seeded_total += d;
            let k = self.inst.units.class[u as usize];
            let path = self.paths.id(first, k);
            count[path as usize] += 1;
            seeded.push(key);
            seeded_path.push(path);
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
        drop(seeded);
        drop(seeded_path);
        self.seeded_keys = keys;
        self.seeded_start = start;
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
        // Each node's worst seeded key, for `worst_bound`.
        for p in 0..paths {
            let (x, y) = (
                self.seeded_start[p] as usize,
                self.seeded_start[p + 1] as usize,
            );
            let Some(&worst) = self.seeded_keys[x..y].iter().max() else {
                continue;
            };
            for pi in self.paths.start[p] as usize..self.paths.start[p + 1] as usize {
                let n = self.paths.node[pi] as usize;
                self.node[n].worst_bound = self.node[n].worst_bound.max(worst);
            }
        }
        self.node_paths_start = through;
        self.node_paths = node_paths;
        self.lazy = vec![true; nodes];
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
        self.queue_keys(late);
        self.queue_keys(pending);
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
        let d = self.inst.units.demand[u as usize];
        let allocs = seed.allocations(u);
        let at_first = allocs.iter().any(|a| a.cluster == first && a.amount > 0.0);
        let elsewhere =
            allocs.iter().any(|a| a.cluster != first && a.amount != 0.0) || seed.overflow(u) != 0.0;
        at_first && !elsewhere && self.up[first as usize] && d > 0.0
    }

    /// Node `n`'s heap, with the seeded holders' keys merged in on first use (see
    /// [`Self::seed`]).
    fn heap_mut(&mut self, n: usize) -> &mut BinaryHeap<u64> {
        if self.lazy.get(n).copied().unwrap_or(false) {
            self.lazy[n] = false;
            let mut entries = std::mem::take(&mut self.heap[n]).into_vec();
            let (a, b) = (self.node_paths_start[n], self.node_paths_start[n + 1]);
            for &p in &self.node_paths[a as usize..b as usize] {
                let (x, y) = (
                    self.seeded_start[p as usize],
                    self.seeded_start[p as usize + 1],
                );
                entries.extend_from_slice(&self.seeded_keys[x as usize..y as usize]);
            }
            self.heap[n] = BinaryHeap::from(entries);
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
            let Some(top) = self.heap_mut(n).pop() else {
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
    fn find_blocking(&mut self) -> Vec<(UnitIdx, usize)> {
        let mut out = Vec::new();
        let mut held: Vec<(usize, f64)> = Vec::new();
        // Past the proposal bound some units have candidates they never offered to.
        let skip = !self.stats.proposal_bound_hit;
        // Only a unit whose pointer has moved can be in a blocking pair: one holds demand only
        // at candidates up to its pointer, and one left with unplaced demand after a pass has
        // offered it to every candidate (unless the bound was hit). So, in id order as before,
        // only those are scanned.
        let units: Vec<(UnitIdx, u32)> = if skip {
            self.moved.sort_unstable();
            self.moved.clone()
        } else {
            (0..self.inst.unit_count() as UnitIdx)
                .map(|u| (u, 0))
                .collect()
        };
        for (at, &(u, since)) in units.iter().enumerate() {
            self.prefetch_units(&units, at);
            // Candidates before `worst` are ones u likes more than some of its demand's place.
            let worst = if self.unit[u as usize].unplaced > self.tol(u) {
                self.inst.candidate_count(u)
            } else {
                usize::from(self.unit[u as usize].worst)
            };
            if worst == 0 {
                continue;
            }
            // Demand at each position (usually one holding), to know what could move up.
            held.clear();
            let range = self.inst.candidate_range(u);
            let mut s = self.unit[u as usize].head;
            while s != NONE {
                let slot = self.slots[s as usize];
                if let Some(p) = self.inst.candidate_position(u, slot.cluster) {
                    held.push((p, slot.amount));
                }
                s = slot.next;
            }
            let tol = self.tol(u);
            for j in 0..worst {
                let movable = self.unit[u as usize].unplaced
                    + held
                        .iter()
                        .filter(|&&(p, _)| p > j)
                        .map(|&(_, a)| a)
                        .sum::<f64>();
                if movable <= tol {
                    continue;
                }
                if skip && self.surely_full(u, range.start + j, since) {
                    #[cfg(debug_assertions)]
                    self.check_full(u, range.start + j, movable);
                    continue;
                }
                if self.room_for(u, range.start + j, movable) > tol {
                    out.push((u, j));
                    break;
                }
            }
        }
        #[cfg(debug_assertions)]
        for u in 0..self.inst.unit_count() as UnitIdx {
            if skip && self.unit[u as usize].next == 0 {
                assert!(self.unit[u as usize].worst == 0, "unit {u}");
                assert!(
                    self.unit[u as usize].unplaced <= self.tol(u)
                        || self.inst.candidate_count(u) == 0,
                    "unit {u}"
                );
            }
        }
        out
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

    fn to_map(&self) -> Map {
        let n = self.inst.unit_count();
        let mut map = Map::with_capacity(n, self.slots.len() - self.free_slots.len());
        let mut held: Vec<(usize, Allocation)> = Vec::new();
        for u in 0..n as UnitIdx {
            let s = self.unit[u as usize].head;
            if s != NONE && self.slots[s as usize].next == NONE {
                // One holding (most units): no order to find.
                let slot = self.slots[s as usize];
                let a = (slot.amount > 0.0).then_some(Allocation {
                    cluster: slot.cluster,
                    amount: slot.amount,
                });
                map.push_unit(a, self.unit[u as usize].unplaced);
                continue;
            }
            // The unit's holdings, put in its preference order.
            held.clear();
            let mut s = self.unit[u as usize].head;
            while s != NONE {
                let slot = self.slots[s as usize];
                let j = self
                    .inst
                    .candidate_position(u, slot.cluster)
                    .unwrap_or(usize::MAX);
                if slot.amount > 0.0 {
                    let a = Allocation {
                        cluster: slot.cluster,
                        amount: slot.amount,
                    };
                    held.push((j, a));
                }
                s = slot.next;
            }
            held.sort_unstable_by_key(|&(j, _)| j);
            map.push_unit(held.iter().map(|&(_, a)| a), self.unit[u as usize].unplaced);
        }
        map
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
}
