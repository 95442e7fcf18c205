//! The solver's state: one record per resource node and per map unit (each read whole where
//! it is read, so one cache line), the holdings' slots, the (cluster, class) paths, and the
//! bookkeeping of every change of a holding.
//!
//! Promises: a unit's holdings are the slots linked from its `head`, at most one per cluster,
//! each holding more than the unit's tolerance; a node's `used` is the sum over its holders of
//! their amount times their coefficient, and its heap (with the seeded keys not merged yet, see
//! `heap`) holds a key of every holder; every holding is added by [`Solver::add`] and taken
//! back by [`Solver::remove`], which keep the usage, the removal log (for
//! `Solver::surely_full`), the read-out's holding counts and the unit's worst position true.

use std::collections::BinaryHeap;

use super::options::{SolveStats, EPS_REL};
use crate::model::{ClassIdx, ClusterIdx, ClusterState, Instance, ResourceKind, UnitIdx};
use crate::parts;

/// The most removals [`Solver::surely_full`] looks at before sizing the offer instead.
pub(super) const MAX_SCAN: usize = 32;
/// How many of a path's worst seeded keys a node's heap takes before the rest
/// ([`Solver::merge_worst`]).
pub(super) const WORST_KEPT: usize = 8;

/// The keys of the units one part of a seeding pass seeded, grouped by (cluster, class) path
/// id, in unit order: path `p`'s are `keys[start[p]..start[p + 1]]`.
pub(super) struct SeededKeys {
    pub(super) keys: Vec<u64>,
    pub(super) start: Vec<u32>,
}

impl SeededKeys {
    #[inline]
    pub(super) fn of_path(&self, p: usize) -> &[u64] {
        &self.keys[self.start[p] as usize..self.start[p + 1] as usize]
    }
}

/// No slot (the end of a unit's list of holdings).
pub(super) const NONE: u32 = u32::MAX;

/// The resource nodes (global index, coefficient > 0) that demand of each (cluster, class)
/// passes, leaf first.
pub(super) struct Paths {
    pub(super) classes: usize,
    pub(super) start: Vec<u32>,
    pub(super) node: Vec<u32>,
    pub(super) coef: Vec<f64>,
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
    #[inline]
    pub(super) fn id(&self, c: ClusterIdx, k: ClassIdx) -> u32 {
        (c as usize * self.classes + usize::from(k)) as u32
    }

    #[inline]
    pub(super) fn range(&self, c: ClusterIdx, k: ClassIdx) -> std::ops::Range<usize> {
        let i = c as usize * self.classes + usize::from(k);
        self.start[i] as usize..self.start[i + 1] as usize
    }
}

/// One unit's holding at one cluster; slots of a unit form a linked list.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    pub(super) cluster: ClusterIdx,
    pub(super) next: u32,
    pub(super) amount: f64,
}

/// A resource node's state in a solve.
#[derive(Clone, Copy)]
pub(super) struct NodeState {
    pub(super) cap: f64,
    pub(super) used: f64,
    /// At least the largest key ever pushed to the node's heap (the seeded holders'
    /// included), so a unit whose key is not below it has no worse holder there and
    /// [`Solver::size_offer`] need not look (nor build a lazy heap). Never lowered.
    pub(super) worst_bound: u64,
    pub(super) kind: ResourceKind,
}

/// A map unit's state in a solve.
#[derive(Clone, Copy)]
pub(super) struct UnitState {
    /// Demand not placed at any cluster.
    pub(super) unplaced: f64,
    /// The first of its holdings (slots), or `NONE`.
    pub(super) head: u32,
    /// The position in its candidate list it proposes to next.
    pub(super) next: u8,
    /// The position in its candidate list of the worst cluster it holds demand at.
    pub(super) worst: u8,
    /// How often it has been evicted in this solve (saturating).
    pub(super) evicted: u8,
    /// Whether it is on the stack.
    pub(super) queued: bool,
}

impl UnitState {
    /// A unit with all of its demand `d` still to place.
    #[inline]
    pub(super) fn unplaced(d: f64) -> Self {
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
pub(super) const BLANK_SLOT: Slot = Slot {
    cluster: 0,
    next: NONE,
    amount: 0.0,
};

pub(super) struct Solver<'a> {
    pub(super) inst: &'a Instance,
    pub(super) paths: Paths,
    /// Per class: priority rank (dense, lower preferred) and coefficient per resource kind.
    pub(super) prio_rank: Vec<u64>,
    pub(super) coef: Vec<[f64; 2]>,
    pub(super) up: Vec<bool>,
    /// Per global node, in one record: an offer reads all of it at each node of its path.
    pub(super) node: Vec<NodeState>,
    pub(super) heap: Vec<BinaryHeap<u64>>,
    /// Per node: 0 once its heap holds the seeded holders' keys (or there are none); before
    /// that, a bound above every seeded key left out (their largest plus one, or after
    /// [`Self::merge_worst`] the least key it took), see [`Self::heap_above`].
    pub(super) unmerged: Vec<u64>,
    /// Per node: whether its heap holds each path's worst seeded keys ([`Self::merge_worst`]),
    /// the rest being below `unmerged`.
    pub(super) merged_worst: Vec<bool>,
    /// Per path id, once a node on it needed them: its `WORST_KEPT` worst seeded keys, and the
    /// least of them if the path has more (the rest are below it), else 0.
    pub(super) path_worst: Vec<Option<(Vec<u64>, u64)>>,
    /// `WORST_KEPT`, but for tests.
    pub(super) worst_kept: usize,
    /// The seeded holders' keys, per part of the seeding pass (see [`Self::seed`]).
    pub(super) seeded: Vec<SeededKeys>,
    /// The path ids through each node: `node_paths[node_paths_start[n]..node_paths_start[n + 1]]`
    /// (built by a seeded solve only).
    pub(super) node_paths_start: Vec<u32>,
    pub(super) node_paths: Vec<u32>,
    /// Per map unit, in one record so that a unit's state is one cache line.
    pub(super) unit: Vec<UnitState>,
    pub(super) slots: Vec<Slot>,
    pub(super) free_slots: Vec<u32>,
    pub(super) stack: Vec<UnitIdx>,
    /// Per path position: the heap entries popped while sizing an offer.
    pub(super) scratch: Vec<Vec<u64>>,
    /// Demand taken back from holdings so far (for [`SolveStats::seeded_demand`]).
    pub(super) removed: f64,
    /// Removals so far: each takes the next number (an *epoch*).
    pub(super) epoch: u32,
    /// Per cluster: (epoch, key of the holder) of every removal there, in order.
    /// Only the newest are kept (at most `2 * MAX_SCAN`): `removal_floor` is the epoch of the
    /// newest one dropped (0: none).
    pub(super) removals: Vec<Vec<(u32, u64)>>,
    pub(super) removal_floor: Vec<u32>,
    /// Per cluster: the epoch of its newest removal (0: none).
    pub(super) last_removal: Vec<u32>,
    /// The units whose proposal pointer has moved, each with the epoch when it first did, in
    /// that order: the only units that can be in a blocking pair (see [`Self::find_blocking`]).
    pub(super) moved: Vec<(UnitIdx, u32)>,
    /// How many parts the passes that split over threads use (`None`: by their size, see
    /// [`parts::parts_for`]); set by tests.
    pub(super) parts: Option<usize>,
    /// The unit ranges of the map read-out's parts (and of the seeding pass's), and how many
    /// holdings (linked slots) the units of each have: each part writes its allocations
    /// straight into the map, from the sum of the holdings before it on (see
    /// [`Self::to_map`]). Set by `push_all` or `seed`, kept by `add` and `unlink`.
    pub(super) map_bounds: Vec<usize>,
    pub(super) holdings: Vec<usize>,
    pub(super) stats: SolveStats,
}

#[inline]
fn kind_index(kind: ResourceKind) -> usize {
    match kind {
        ResourceKind::Bps => 0,
        ResourceKind::Fps => 1,
    }
}

impl<'a> Solver<'a> {
    pub(super) fn new(inst: &'a Instance) -> Self {
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
}

impl Solver<'_> {
    /// How many parts a pass over `n` items splits into ([`parts::parts_for`] with `min`,
    /// unless a test set [`Self::parts`]).
    pub(super) fn parts_for(&self, n: usize, min: usize) -> usize {
        self.parts.unwrap_or_else(|| parts::parts_for(n, min))
    }

    #[inline]
    pub(super) fn tol(&self, u: UnitIdx) -> f64 {
        EPS_REL * self.inst.demand[u as usize]
    }

    #[inline]
    pub(super) fn node_coef(&self, n: usize, u: UnitIdx) -> f64 {
        let k = self.inst.units.class[u as usize];
        self.coef[usize::from(k)][kind_index(self.node[n].kind)]
    }

    #[inline]
    pub(super) fn node_tol(&self, n: usize) -> f64 {
        EPS_REL * self.node[n].cap.max(1.0)
    }

    #[inline]
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

    #[inline]
    pub(super) fn held(&self, u: UnitIdx, c: ClusterIdx) -> f64 {
        self.find_slot(u, c)
            .map_or(0.0, |s| self.slots[s as usize].amount)
    }

    /// Places `amount` of `u` at `c` (its candidate at position `pos`), adding heap entries with
    /// `key` if `u` held nothing there (none when `key` is `None`: the caller builds the heaps).
    #[inline]
    pub(super) fn add(
        &mut self,
        u: UnitIdx,
        c: ClusterIdx,
        pos: usize,
        key: Option<u64>,
        amount: f64,
    ) {
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

    /// Takes `amount` of `v`'s holding at `c` back into `v`'s unplaced demand (all of it if
    /// what would remain is noise) and queues `v` to offer it again.
    /// `key`: `c`'s key for `v`, recorded with the removal (see [`Self::surely_full`]).
    #[inline]
    pub(super) fn remove(&mut self, v: UnitIdx, c: ClusterIdx, amount: f64, key: u64) {
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
}
