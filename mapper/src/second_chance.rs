//! A second chance for overflow (issue 20): after the stable pass, demand left in overflow
//! is placed where it does the least harm, *within the candidate lists*, along the cheapest
//! *chain*: one of the unit's candidates, then moves of other units' demand from the cluster
//! the chain is at to one of the mover's own candidates, until a cluster with room for what
//! enters it (at most `max_hops` moves, each bounded in the RTT it adds to the unit moved).
//! This is the step a latency-optimal fractional map (a linear program over the same
//! candidates) takes and the stable map does not: measured on 20,000-unit worlds, the stable
//! map leaves 1.5–2% of the demand in overflow where the LP places all of it (`cdnmap bench
//! overflow`; figures and limits in `docs/perf/overflow.md`).
//!
//! It gives up stability where it acts: a unit moved to a less preferred candidate, and the
//! clusters whose load changed, may form blocking pairs (a cluster would rather have the unit
//! moved, or has room a unit wants). [`SecondChanceReport::split`] tells those pairs from any
//! other the verifier finds: a pair is the phase's when its unit or its cluster was touched by
//! it.
//!
//! Promises: the result is feasible whenever the input is (every move and placement fits the
//! residual capacity of every node on its path), conserves each unit's demand, and uses only
//! candidates at up clusters. Deterministic: units are served in index order, ties broken by
//! cluster and class index.

use std::collections::HashSet;

use crate::beyond::{calibrated, calibration};
use crate::map::{node_usage, Allocation, Map};
use crate::model::{ClassIdx, ClusterIdx, ClusterState, Instance, UnitIdx};
use crate::verify::BlockingPair;

/// The estimate of a placement beyond a unit's list, where it was first defined.
pub use crate::beyond::estimate_beyond;

/// Whether and how the second chance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecondChance {
    /// The stable map as it is.
    #[default]
    Off,
    /// Overflow placed within the candidate lists, moving other units' demand along chains.
    WithinLists,
    /// Within the lists first; then what is still left over at the nearest up clusters with
    /// room beyond the unit's list, within [`SecondChanceParams::max_beyond_ms`] of its best
    /// listed score ([`SecondChanceReport::beyond`]). In a round after another
    /// ([`second_chance_seeded`]) the clusters a unit had beyond its list come first.
    BeyondLists,
}

impl std::str::FromStr for SecondChance {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(SecondChance::Off),
            "within-lists" => Ok(SecondChance::WithinLists),
            "beyond-lists" => Ok(SecondChance::BeyondLists),
            other => Err(format!(
                "{other:?} is not a second chance: off, within-lists or beyond-lists"
            )),
        }
    }
}

/// The second chance's bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SecondChanceParams {
    /// The most RTT (score) a move may add to the unit moved, in ms.
    pub max_added_ms: f32,
    /// Moves in one chain.
    pub max_hops: usize,
    /// States a chain's search expands (per placement); 0: no chains (beyond the lists only).
    pub max_expansions: usize,
    /// Steps per overflowed unit (each a placement, direct or after one move).
    pub max_steps: usize,
    /// Beyond the lists: the most a cluster's estimated RTT may exceed the unit's best listed
    /// score, in ms.
    pub max_beyond_ms: f32,
}

impl Default for SecondChanceParams {
    fn default() -> Self {
        SecondChanceParams {
            max_added_ms: 30.0,
            max_hops: 4,
            max_expansions: 2048,
            max_steps: 64,
            max_beyond_ms: 150.0,
        }
    }
}

/// What the second chance did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SecondChanceReport {
    /// Overflow placed.
    pub placed: f64,
    /// Demand of other units moved to make room.
    pub moved: f64,
    /// Placements made (direct and after a move).
    pub placements: usize,
    /// Moves made.
    pub moves: usize,
    /// Units whose allocations changed, ascending.
    pub units: Vec<UnitIdx>,
    /// Clusters whose load it changed (they took overflowed demand, or a moved unit's, or
    /// gave some up), ascending.
    pub clusters: Vec<ClusterIdx>,
    /// Placements beyond the candidate lists (the verifier's `not_candidate`), in the order
    /// made.
    pub beyond: Vec<Beyond>,
}

/// Overflow placed at a cluster beyond the unit's candidate list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Beyond {
    pub unit: UnitIdx,
    pub cluster: ClusterIdx,
    pub amount: f64,
    /// The RTT estimated for it: the distance model ([`crate::geo::rtt_from_km`]) plus the
    /// median of what the unit's listed scores exceed the model by, and no better than the
    /// unit's worst listed score.
    pub estimate_ms: f32,
}

impl SecondChanceReport {
    /// Overflow placed beyond the candidate lists.
    pub fn placed_beyond(&self) -> f64 {
        self.beyond.iter().fold(0.0, |sum, b| sum + b.amount)
    }

    /// The verifier's blocking pairs split into those the phase introduced (its unit or its
    /// cluster touched by it) and the others.
    pub fn split<'a>(
        &self,
        pairs: &'a [BlockingPair],
    ) -> (Vec<&'a BlockingPair>, Vec<&'a BlockingPair>) {
        pairs.iter().partition(|p| {
            self.units.binary_search(&p.map_unit).is_ok()
                || self.clusters.binary_search(&p.cluster).is_ok()
        })
    }
}

/// [`Work::slot`] of a unit the phase has not changed.
const UNCHANGED: u32 = u32::MAX;

/// Relative slack when comparing amounts with capacities.
const EPS: f64 = 1e-9;

/// The residual capacities and the map being changed.
struct Work<'a> {
    inst: &'a Instance,
    /// Per global node: capacity − load.
    residual: Vec<f64>,
    /// The map the phase starts from.
    map: &'a Map,
    /// Per unit: where its changed allocations are in `changed` (`UNCHANGED`: the map's
    /// stand). Only the units the phase changes get a list of their own: at a million units,
    /// a list for every unit was most of the phase's cost.
    slot: Vec<u32>,
    changed: Vec<Vec<Allocation>>,
    overflow: Vec<f64>,
    /// Per cluster: units with an allocation there (some may have moved away since); built
    /// when a chain first looks for a way out (empty until then).
    placed_at: Vec<Vec<UnitIdx>>,
    touched: HashSet<UnitIdx>,
    took: HashSet<ClusterIdx>,
    /// Per cluster: its ways out ([`Work::exits`]), until something there changes.
    exits: Vec<Option<Vec<Exit>>>,
}

impl Work<'_> {
    fn coef(&self, k: ClassIdx, c: ClusterIdx, n: u32) -> f64 {
        let cl = &self.inst.clusters()[c as usize];
        self.inst.classes()[usize::from(k)]
            .per_unit
            .get(cl.nodes[n as usize].kind)
    }

    /// How much demand of class `k` fits at cluster `c` now.
    fn room(&self, k: ClassIdx, c: ClusterIdx) -> f64 {
        let cl = &self.inst.clusters()[c as usize];
        if cl.state != ClusterState::Up || !cl.serves(k) {
            return 0.0;
        }
        let mut room = f64::INFINITY;
        for n in cl.path(k) {
            let coef = self.coef(k, c, n);
            if coef > 0.0 {
                let r = self.residual[self.inst.global_node(c, n)].max(0.0);
                room = room.min(r / coef);
            }
        }
        room
    }

    /// Adds `amount` of class `k` at `c` to the load (negative: removes it).
    fn load(&mut self, k: ClassIdx, c: ClusterIdx, amount: f64) {
        let path: Vec<u32> = self.inst.clusters()[c as usize].path(k).collect();
        for n in path {
            let coef = self.coef(k, c, n);
            let g = self.inst.global_node(c, n);
            self.residual[g] -= amount * coef;
        }
    }

    /// Unit `u`'s allocations as they stand.
    fn allocations(&self, u: UnitIdx) -> &[Allocation] {
        match self.slot[u as usize] {
            UNCHANGED => self.map.allocations(u),
            at => &self.changed[at as usize],
        }
    }

    fn amount_at(&self, u: UnitIdx, c: ClusterIdx) -> f64 {
        self.allocations(u)
            .iter()
            .filter(|a| a.cluster == c)
            .map(|a| a.amount)
            .sum()
    }

    fn add(&mut self, u: UnitIdx, c: ClusterIdx, amount: f64) {
        if self.slot[u as usize] == UNCHANGED {
            self.slot[u as usize] = self.changed.len() as u32;
            self.changed.push(self.map.allocations(u).to_vec());
        }
        let list = &mut self.changed[self.slot[u as usize] as usize];
        match list.iter_mut().find(|a| a.cluster == c) {
            Some(a) => a.amount += amount,
            None => {
                list.push(Allocation { cluster: c, amount });
                if !self.placed_at.is_empty() {
                    self.placed_at[c as usize].push(u);
                }
            }
        }
        list.retain(|a| a.amount > 0.0);
        self.touched.insert(u);
    }

    /// How much of class `k_in` can enter cluster `c` when `y` of class `k_out` leaves it.
    fn gain(&self, c: ClusterIdx, k_in: ClassIdx, k_out: ClassIdx, y: f64) -> f64 {
        let cl = &self.inst.clusters()[c as usize];
        let out: Vec<u32> = cl.path(k_out).collect();
        let mut room = f64::INFINITY;
        for n in cl.path(k_in) {
            let coef = self.coef(k_in, c, n);
            if coef <= 0.0 {
                continue;
            }
            let freed = if out.contains(&n) {
                y * self.coef(k_out, c, n)
            } else {
                0.0
            };
            let r = self.residual[self.inst.global_node(c, n)].max(0.0);
            room = room.min((r + freed) / coef);
        }
        room
    }

    /// The least of class `k_out` that must leave cluster `c` for `x` of class `k_in` to
    /// enter (infinite when no amount would do).
    fn need(&self, c: ClusterIdx, k_in: ClassIdx, k_out: ClassIdx, x: f64) -> f64 {
        let cl = &self.inst.clusters()[c as usize];
        let out: Vec<u32> = cl.path(k_out).collect();
        let mut need = 0.0f64;
        for n in cl.path(k_in) {
            let coef = self.coef(k_in, c, n);
            if coef <= 0.0 {
                continue;
            }
            let r = self.residual[self.inst.global_node(c, n)].max(0.0);
            let short = x * coef - r;
            if short <= 0.0 {
                continue;
            }
            let f = if out.contains(&n) {
                self.coef(k_out, c, n)
            } else {
                0.0
            };
            if f <= 0.0 {
                return f64::INFINITY;
            }
            need = need.max(short / f);
        }
        need
    }

    /// Whether demand of class `k_out` leaving cluster `c` relieves every node on class
    /// `k_in`'s path there that is short of room.
    fn relieves(&self, c: ClusterIdx, k_in: ClassIdx, k_out: ClassIdx) -> bool {
        let cl = &self.inst.clusters()[c as usize];
        let out: Vec<u32> = cl.path(k_out).collect();
        cl.path(k_in).all(|n| {
            let coef = self.coef(k_in, c, n);
            coef <= 0.0
                || self.residual[self.inst.global_node(c, n)] > EPS * coef
                || (out.contains(&n) && self.coef(k_out, c, n) > 0.0)
        })
    }

    /// The ways out of cluster `c`: for each (other cluster, class), the unit placed at `c`
    /// of that class that adds the least RTT moving there (within the bound).
    fn exits(&mut self, c: ClusterIdx, params: &SecondChanceParams) -> &[Exit] {
        if self.placed_at.is_empty() {
            let mut placed_at = vec![Vec::new(); self.inst.clusters().len()];
            for u in 0..self.overflow.len() as UnitIdx {
                for a in self.allocations(u) {
                    placed_at[a.cluster as usize].push(u);
                }
            }
            self.placed_at = placed_at;
        }
        if self.exits[c as usize].is_none() {
            let inst = self.inst;
            let mut best: std::collections::HashMap<(ClusterIdx, ClassIdx), Exit> =
                std::collections::HashMap::new();
            let mut seen = HashSet::new();
            for &m in &self.placed_at[c as usize] {
                if !seen.insert(m) {
                    continue;
                }
                let amount = self.amount_at(m, c);
                if amount <= EPS {
                    continue;
                }
                let k = inst.unit_class(m);
                let Some(here) = inst.candidates(m).find(|x| x.cluster == c) else {
                    continue;
                };
                for alt in inst.candidates(m) {
                    let to = alt.cluster;
                    let added = alt.score - here.score;
                    if to == c
                        || added > params.max_added_ms
                        || inst.clusters()[to as usize].state != ClusterState::Up
                    {
                        continue;
                    }
                    let e = Exit {
                        to,
                        class: k,
                        added: added.max(0.0),
                        unit: m,
                        amount,
                    };
                    best.entry((to, k))
                        .and_modify(|b| {
                            if (e.added, std::cmp::Reverse(e.amount.to_bits()), e.unit)
                                < (b.added, std::cmp::Reverse(b.amount.to_bits()), b.unit)
                            {
                                *b = e;
                            }
                        })
                        .or_insert(e);
                }
            }
            let mut list: Vec<Exit> = best.into_values().collect();
            list.sort_by(|a, b| {
                a.added
                    .total_cmp(&b.added)
                    .then(a.to.cmp(&b.to))
                    .then(a.class.cmp(&b.class))
            });
            self.exits[c as usize] = Some(list);
        }
        self.exits[c as usize].as_deref().unwrap_or(&[])
    }

    /// The cheapest chain placing unit `u`'s overflow: a candidate of `u`, then moves of other
    /// units' demand, each from the cluster the chain is at to one of the mover's candidates,
    /// until a cluster with room for what enters it (Dijkstra over (cluster, class entering),
    /// a chain's cost its first cluster's score plus what each move adds). `None` when no
    /// chain within the bounds has room at its end.
    fn shortest_chain(&mut self, u: UnitIdx, params: &SecondChanceParams) -> Option<Chain> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let inst = self.inst;
        let k = inst.unit_class(u);
        // Per state: its cost, and how it was reached (the state before, the mover).
        let mut states: Vec<State> = Vec::new();
        let mut index: std::collections::HashMap<(ClusterIdx, ClassIdx), usize> =
            std::collections::HashMap::new();
        let mut heap = BinaryHeap::new();
        for cand in inst.candidates(u) {
            if inst.clusters()[cand.cluster as usize].state != ClusterState::Up {
                continue;
            }
            let cost = f64::from(cand.score);
            let at = states.len();
            states.push((cand.cluster, k, cost, None));
            index.insert((cand.cluster, k), at);
            heap.push(Reverse((OrdF64(cost), at)));
        }
        let mut done = HashSet::new();
        let mut expanded = 0usize;
        while let Some(Reverse((OrdF64(cost), at))) = heap.pop() {
            let (c, k_in, best, _) = states[at];
            if cost > best || !done.insert(at) {
                continue;
            }
            if self.room(k_in, c) > EPS {
                return Some(self.chain_to(u, &states, at));
            }
            expanded += 1;
            if expanded > params.max_expansions || self.hops(&states, at) >= params.max_hops {
                continue;
            }
            let exits = self.exits(c, params).to_vec();
            let movers = self.movers(&states, at);
            for e in exits {
                if movers.contains(&e.unit) || e.unit == u || !self.relieves(c, k_in, e.class) {
                    continue;
                }
                // A small cost per move: of equal chains, the shorter.
                let next = cost + f64::from(e.added) + HOP_COST;
                let key = (e.to, e.class);
                match index.get(&key) {
                    Some(&j) if states[j].2 <= next || done.contains(&j) => {}
                    Some(&j) => {
                        states[j].2 = next;
                        states[j].3 = Some((at, e.unit));
                        heap.push(Reverse((OrdF64(next), j)));
                    }
                    None => {
                        let j = states.len();
                        states.push((e.to, e.class, next, Some((at, e.unit))));
                        index.insert(key, j);
                        heap.push(Reverse((OrdF64(next), j)));
                    }
                }
            }
        }
        None
    }

    /// Moves on the way to state `at`.
    fn hops(&self, states: &[State], mut at: usize) -> usize {
        let mut hops = 0;
        while let Some((before, _)) = states[at].3 {
            hops += 1;
            at = before;
        }
        hops
    }

    /// The units moved on the way to state `at`.
    fn movers(&self, states: &[State], mut at: usize) -> Vec<UnitIdx> {
        let mut out = Vec::new();
        while let Some((before, m)) = states[at].3 {
            out.push(m);
            at = before;
        }
        out
    }

    /// The chain ending at state `at`: its clusters from `u`'s candidate on, the movers.
    fn chain_to(&self, u: UnitIdx, states: &[State], mut at: usize) -> Chain {
        let mut hops = Vec::new();
        loop {
            let (c, k, _, from) = states[at];
            match from {
                Some((before, m)) => {
                    hops.push(Hop {
                        to: c,
                        class: k,
                        mover: m,
                    });
                    at = before;
                }
                None => {
                    hops.reverse();
                    return Chain {
                        unit: u,
                        first: c,
                        hops,
                    };
                }
            }
        }
    }

    /// Places as much of `u`'s overflow `o` as `chain` can carry: the amounts from the end of
    /// the chain back (what each cluster can take given what leaves it), then the least each
    /// mover must move, forward. Returns the amount placed (0: nothing could move).
    fn push(&mut self, chain: &Chain, o: f64, report: &mut SecondChanceReport) -> f64 {
        let inst = self.inst;
        let k_u = inst.unit_class(chain.unit);
        // The clusters and classes entering them: (first, k_u), then each hop's (to, class).
        let mut at: Vec<(ClusterIdx, ClassIdx)> = vec![(chain.first, k_u)];
        at.extend(chain.hops.iter().map(|h| (h.to, h.class)));
        let last = at.len() - 1;
        // Backward: cap[i], what can enter at[i].
        let mut cap = vec![0.0; at.len()];
        cap[last] = self.room(at[last].1, at[last].0);
        for i in (0..last).rev() {
            let hop = &chain.hops[i];
            let y = self.amount_at(hop.mover, at[i].0).min(cap[i + 1]);
            cap[i] = self.gain(at[i].0, at[i].1, hop.class, y);
        }
        let delta = cap[0].min(o);
        if delta <= EPS * o.max(1.0) {
            return 0.0;
        }
        // Forward: what each mover must move.
        let mut moves = Vec::with_capacity(chain.hops.len());
        let mut x = delta;
        for (i, hop) in chain.hops.iter().enumerate() {
            let y = self
                .need(at[i].0, at[i].1, hop.class, x)
                .min(self.amount_at(hop.mover, at[i].0))
                .min(cap[i + 1]);
            moves.push(y);
            x = y;
            if y <= 0.0 {
                break;
            }
        }
        // Applied from the end of the chain, so that each move finds its room.
        for (i, hop) in chain.hops.iter().enumerate().rev() {
            let y = moves.get(i).copied().unwrap_or(0.0);
            if y <= 0.0 {
                continue;
            }
            let from = at[i].0;
            self.add(hop.mover, from, -y);
            self.load(hop.class, from, -y);
            self.add(hop.mover, hop.to, y);
            self.load(hop.class, hop.to, y);
            self.took.insert(from);
            self.took.insert(hop.to);
            self.exits[from as usize] = None;
            self.exits[hop.to as usize] = None;
            report.moved += y;
            report.moves += 1;
        }
        self.add(chain.unit, chain.first, delta);
        self.load(k_u, chain.first, delta);
        self.exits[chain.first as usize] = None;
        self.overflow[chain.unit as usize] -= delta;
        self.took.insert(chain.first);
        report.placed += delta;
        report.placements += 1;
        delta
    }
}

/// Where a unit may be placed beyond its list ([`Work::reach`]).
struct Reach {
    /// The unit's location on the unit sphere.
    at: [f64; 3],
    /// The model's calibration by the unit's listed scores: what they exceed it by (median).
    offset: f64,
    /// The unit's worst listed score: no estimate beyond the list is better.
    worst: f64,
    /// The largest estimate taken: the best listed score plus `max_beyond_ms`.
    bound: f64,
    /// The bound as a squared chord on the unit sphere.
    chord2_max: f64,
}

impl Reach {
    /// The squared chord to a cluster at `p` (unit sphere) if within the bound's: a dot
    /// product, no trigonometry. The estimate grows with it ([`Reach::estimate_at`]), so
    /// nearer by this is nearer by the estimate.
    fn within(&self, p: &[f64; 3]) -> Option<f64> {
        let c2 = crate::geo::chord2(&self.at, p);
        (c2 <= self.chord2_max * (1.0 + 1e-12)).then_some(c2)
    }

    /// The estimated RTT at squared chord `c2` (from [`Reach::within`]) if within the bound.
    fn estimate_at(&self, c2: f64) -> Option<f64> {
        let est = calibrated(c2, self.offset, self.worst);
        (est <= self.bound).then_some(est)
    }

    /// The estimated RTT to a cluster at `p` (unit sphere) if within the bound.
    fn estimate(&self, p: &[f64; 3]) -> Option<f64> {
        self.estimate_at(self.within(p)?)
    }
}

impl Work<'_> {
    /// Unit `u`'s reach beyond its list (`vectors`: each cluster on the unit sphere): the
    /// distance model (`crate::geo`) calibrated by its listed scores ([`calibration`](crate::beyond::calibration)),
    /// bounded by `max_beyond_ms` past its best. `None` for a unit with no candidates or no
    /// reach.
    fn reach(
        &self,
        u: UnitIdx,
        vectors: &[[f64; 3]],
        params: &SecondChanceParams,
    ) -> Option<Reach> {
        use crate::geo::{
            rtt_from_km, unit_vector, EARTH_RADIUS_KM, FIBRE_KM_PER_MS, ROUTE_INFLATION,
        };
        let (lat, lon) = self.inst.unit_location(u);
        let at = unit_vector(lat, lon);
        let (offset, best, worst) = calibration(self.inst, u, &at, |c| vectors[c as usize])?;
        let bound = best + f64::from(params.max_beyond_ms);
        // The bound as a distance, then as a chord: est = rtt_from_km(km) + offset.
        let km_max =
            (bound - offset - rtt_from_km(0.0)) * FIBRE_KM_PER_MS / (2.0 * ROUTE_INFLATION);
        if km_max < 0.0 {
            return None;
        }
        let half = (km_max / (2.0 * EARTH_RADIUS_KM)).min(std::f64::consts::FRAC_PI_2);
        Some(Reach {
            at,
            offset,
            worst,
            bound,
            chord2_max: (2.0 * half.sin()).powi(2),
        })
    }

    /// Places up to `amount` of unit `u`'s overflow (class `k`) at `c`, beyond its list, at
    /// estimate `est`; what fits. Returns how much was placed.
    fn place_beyond(
        &mut self,
        u: UnitIdx,
        c: ClusterIdx,
        amount: f64,
        est: f64,
        report: &mut SecondChanceReport,
    ) -> f64 {
        let k = self.inst.unit_class(u);
        let amount = self.room(k, c).min(amount).min(self.overflow[u as usize]);
        if amount <= EPS {
            return 0.0;
        }
        self.add(u, c, amount);
        self.load(k, c, amount);
        self.overflow[u as usize] -= amount;
        self.took.insert(c);
        self.exits[c as usize] = None;
        report.placed += amount;
        report.beyond.push(Beyond {
            unit: u,
            cluster: c,
            amount,
            estimate_ms: est as f32,
        });
        amount
    }

    /// Beyond the lists: each unit still overflowing, in index order, placed at the up
    /// clusters serving its class that are not its candidates and have room, nearest by
    /// estimated RTT first, while the estimate is within `max_beyond_ms` of its best listed
    /// score. The clusters are filtered by that bound as a chord on the unit sphere (a dot
    /// product a cluster) before any room is computed.
    ///
    /// Sticky: with `previous` (the last round's map), a unit first gets back, up to what it
    /// had there, the clusters beyond its list that map placed it at (still up, with room,
    /// within the bound), every such unit before any other placement; only the rest goes to
    /// the nearest. Without this, last round's placements beyond the lists (which the seeded
    /// solve, over the lists, does not keep) would be made anew in index order, many at
    /// other clusters: churn a round, and more of it when a cluster fails.
    fn beyond(
        &mut self,
        n: usize,
        params: &SecondChanceParams,
        previous: Option<&Map>,
        report: &mut SecondChanceReport,
    ) {
        use crate::geo::unit_vector;
        let inst = self.inst;
        let vectors: Vec<[f64; 3]> = inst
            .clusters()
            .iter()
            .map(|cl| unit_vector(cl.lat, cl.lon))
            .collect();
        let up: Vec<(ClusterIdx, [f64; 3])> = inst
            .clusters()
            .iter()
            .enumerate()
            .filter(|(_, cl)| cl.state == ClusterState::Up)
            .map(|(c, _)| (c as ClusterIdx, vectors[c]))
            .collect();
        // The units still overflowing, in index order: a sparse few of the map's, each with
        // its candidates and location far from the one before, so they are prefetched ahead
        // (hints only), in two stages as in the solver (`solve/ahead.rs`): a unit's columns,
        // then its candidates, found through them.
        let pending: Vec<UnitIdx> = (0..n as UnitIdx).filter(|&u| self.left(u)).collect();
        let ahead = |j: usize| {
            if let Some(&v) = pending.get(j + 16) {
                let (units, v) = (&inst.units, v as usize);
                crate::mem::prefetch(&units.cand_start, v);
                crate::mem::prefetch(&units.lat, v);
                crate::mem::prefetch(&units.lon, v);
                crate::mem::prefetch(&units.class, v);
            }
            if let Some(&v) = pending.get(j + 8) {
                inst.prefetch_candidate(v, inst.candidate_range(v).start);
            }
        };
        // Last round's placements beyond the lists, kept where they still fit.
        if let Some(prev) = previous {
            self.keep_previous(&pending, prev, &vectors, params, report);
        }
        // Per class: the positions in `up` of the clusters with room, ascending, kept true to
        // the residuals after each placement (a placement only takes room); most clusters
        // where overflow is are full, and this skips them before any distance.
        let mut with_room = self.with_room(&up);
        // (squared chord, cluster, position in `up`): the clusters within a unit's bound.
        let mut options: Vec<(f64, ClusterIdx, usize)> = Vec::new();
        for (j, &u) in pending.iter().enumerate() {
            ahead(j);
            if !self.left(u) {
                continue;
            }
            let k = inst.unit_class(u);
            if with_room[usize::from(k)].is_empty() {
                continue; // no room for its class anywhere: nothing to estimate
            }
            let Some(reach) = self.reach(u, &vectors, params) else {
                continue;
            };
            let listed = inst.candidate_cluster_set(u);
            options.clear();
            for &i in &with_room[usize::from(k)] {
                let (c, p) = &up[i];
                if let Some(c2) = reach.within(p) {
                    if !listed.contains(c) {
                        options.push((c2, *c, i));
                    }
                }
            }
            // Nearest first; the estimate (taken only for the clusters tried) grows with the
            // distance, so past the first beyond the bound all are.
            options.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for &(c2, c, i) in &options {
                if !self.left(u) {
                    break;
                }
                let Some(est) = reach.estimate_at(c2) else {
                    break;
                };
                let want = self.overflow[u as usize];
                if self.place_beyond(u, c, want, est, report) <= 0.0 {
                    continue;
                }
                for (k, r) in self.roomy(c).into_iter().enumerate() {
                    if !r {
                        with_room[k].retain(|&j| j != i);
                    }
                }
            }
        }
    }

    /// Whether unit `u` still overflows.
    fn left(&self, u: UnitIdx) -> bool {
        self.overflow[u as usize] > EPS * self.inst.unit_demand(u).max(1.0)
    }

    /// For each class, whether cluster `c` has room for it.
    fn roomy(&self, c: ClusterIdx) -> Vec<bool> {
        (0..self.inst.classes().len())
            .map(|k| self.room(k as ClassIdx, c) > EPS)
            .collect()
    }

    /// Per class: the positions in `up` of the clusters with room, ascending.
    fn with_room(&self, up: &[(ClusterIdx, [f64; 3])]) -> Vec<Vec<usize>> {
        let mut with_room: Vec<Vec<usize>> = vec![Vec::new(); self.inst.classes().len()];
        for (i, (c, _)) in up.iter().enumerate() {
            for (k, r) in self.roomy(*c).into_iter().enumerate() {
                if r {
                    with_room[k].push(i);
                }
            }
        }
        with_room
    }

    /// The sticky part of [`Self::beyond`]: each of the `pending` units gets back, up to what it
    /// had, the clusters beyond its list `prev` placed it at, where they still fit.
    fn keep_previous(
        &mut self,
        pending: &[UnitIdx],
        prev: &Map,
        vectors: &[[f64; 3]],
        params: &SecondChanceParams,
        report: &mut SecondChanceReport,
    ) {
        let inst = self.inst;
        for &u in pending
            .iter()
            .take_while(|&&u| (u as usize) < prev.unit_count())
        {
            if !self.left(u) {
                continue;
            }
            let beyond: Vec<Allocation> = prev
                .allocations(u)
                .iter()
                .filter(|a| {
                    (a.cluster as usize) < vectors.len()
                        && !inst.candidate_cluster_set(u).contains(&a.cluster)
                })
                .copied()
                .collect();
            if beyond.is_empty() {
                continue;
            }
            let Some(reach) = self.reach(u, vectors, params) else {
                continue;
            };
            for a in beyond {
                if let Some(est) = reach.estimate(&vectors[a.cluster as usize]) {
                    self.place_beyond(u, a.cluster, a.amount, est, report);
                }
            }
        }
    }
}

/// A chain search's state: the cluster, the class entering it, the cost so far, and how it
/// was reached (the state before, the unit moved).
type State = (ClusterIdx, ClassIdx, f64, Option<(usize, UnitIdx)>);

/// A move of a chain: `mover`'s demand (of `class`) from the cluster before to `to`.
#[derive(Debug, Clone, Copy)]
struct Hop {
    to: ClusterIdx,
    class: ClassIdx,
    mover: UnitIdx,
}

/// A chain for one overflowed unit: its candidate `first`, then the moves.
#[derive(Debug, Clone)]
struct Chain {
    unit: UnitIdx,
    first: ClusterIdx,
    hops: Vec<Hop>,
}

/// A way out of a cluster ([`Work::exits`]).
#[derive(Debug, Clone, Copy)]
struct Exit {
    to: ClusterIdx,
    class: ClassIdx,
    added: f32,
    unit: UnitIdx,
    amount: f64,
}

/// What a move costs besides the RTT it adds: of two chains that add alike, the shorter.
const HOP_COST: f64 = 0.01;

/// An `f64` ordered by `total_cmp`, for the heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrdF64(f64);

impl Eq for OrdF64 {}

impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// `map` (of `instance`) with its overflow given a second chance: see the module
/// documentation. `Off` returns the map as it is.
pub fn second_chance(
    instance: &Instance,
    map: &Map,
    mode: SecondChance,
    params: &SecondChanceParams,
) -> (Map, SecondChanceReport) {
    second_chance_seeded(instance, map, None, mode, params)
}

/// [`second_chance`] in a round that follows `previous` (the last round's map, after its
/// phase): beyond the lists, a unit gets back first the clusters `previous` placed it at
/// beyond its list, where they still have room and are within the bound (see
/// [`SecondChance::BeyondLists`]); `None` is [`second_chance`].
pub fn second_chance_seeded(
    instance: &Instance,
    map: &Map,
    previous: Option<&Map>,
    mode: SecondChance,
    params: &SecondChanceParams,
) -> (Map, SecondChanceReport) {
    let mut report = SecondChanceReport::default();
    if mode == SecondChance::Off || map.total_overflow() <= 0.0 {
        return (map.clone(), report);
    }
    let n = instance.unit_count().min(map.unit_count());
    let used = node_usage(instance, map);
    let mut residual = vec![0.0; instance.node_count()];
    for (c, cl) in instance.clusters().iter().enumerate() {
        for (i, node) in cl.nodes.iter().enumerate() {
            let g = instance.global_node(c as ClusterIdx, i as u32);
            residual[g] = node.capacity - used[g];
        }
    }
    let overflow = (0..n as UnitIdx).map(|u| map.overflow(u)).collect();
    let mut work = Work {
        inst: instance,
        residual,
        map,
        slot: vec![UNCHANGED; n],
        changed: Vec::new(),
        overflow,
        placed_at: Vec::new(),
        touched: HashSet::new(),
        took: HashSet::new(),
        exits: vec![None; instance.clusters().len()],
    };
    // No search states, no chains: in a stable map an overflowing unit's candidates have no
    // room for it (it would have been placed there), so there is nothing to try.
    let chains = if params.max_expansions == 0 { 0 } else { n };
    for u in 0..chains as UnitIdx {
        for _ in 0..params.max_steps {
            let o = work.overflow[u as usize];
            if o <= EPS * instance.unit_demand(u).max(1.0) {
                break;
            }
            let Some(chain) = work.shortest_chain(u, params) else {
                break;
            };
            if work.push(&chain, o, &mut report) <= 0.0 {
                break;
            }
        }
    }
    if mode == SecondChance::BeyondLists {
        work.beyond(n, params, previous, &mut report);
    }
    let extra = report.moves + report.placements + report.beyond.len();
    let mut out = Map::with_capacity(n, map.allocation_count() + extra);
    for u in 0..n as UnitIdx {
        // In the order they were made: the stable pass's first.
        out.push_unit(
            work.allocations(u).iter().copied(),
            work.overflow[u as usize].max(0.0),
        );
    }
    report.units = work.touched.into_iter().collect();
    report.units.sort_unstable();
    report.clusters = work.took.into_iter().collect();
    report.clusters.sort_unstable();
    (out, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Limits;
    use crate::testing::parse_instance;
    use crate::{solve, verify, SolveOptions};

    /// Units m (web, demand 3, score 20) and n (web, demand 1, score 10) at (0, 0), both
    /// with cluster `a` (the first of `clusters`, room for 1) their one candidate, so that n
    /// is at a and m overflows; a second class, video, when `video`. With the stable map.
    fn m_and_n(video: bool, clusters: &[String]) -> (Instance, Map) {
        let class = |name: &str| {
            format!(r#"{{"name": "{name}", "priority": 0, "per_unit": {{"bps": 1, "fps": 1}}}}"#)
        };
        let classes = if video {
            format!("{}, {}", class("web"), class("video"))
        } else {
            class("web")
        };
        let json = format!(
            r#"{{
          "traffic_classes": [{classes}],
          "clusters": [{}],
          "map_units": [
            {{"id": "m", "class": "web", "demand": 3, "lat": 0, "lon": 0,
             "candidates": [{{"cluster": "a", "score": 20}}]}},
            {{"id": "n", "class": "web", "demand": 1, "lat": 0, "lon": 0,
             "candidates": [{{"cluster": "a", "score": 10}}]}}]
        }}"#,
            clusters.join(", ")
        );
        let inst = parse_instance(json.as_bytes(), Limits::default()).expect("valid");
        let stable = solve(&inst, &SolveOptions::default()).map;
        assert_eq!(stable.overflow(0), 3.0, "m overflows");
        (inst, stable)
    }

    /// A cluster of the instance's JSON at (`lat`, 0), one Bps node of capacity `cap` for `class`.
    fn cluster(id: &str, lat: f64, cap: f64, class: &str) -> String {
        format!(
            r#"{{"id": "{id}", "lat": {lat}, "lon": 0, "resources": {{"name": "r", "kind": "bps", "capacity": {cap}, "classes": ["{class}"]}}}}"#
        )
    }

    /// Cluster a (room for 1) is the only candidate of m and the first of n, which a ranks
    /// better; b (room for 1) is n's second. Stable: n at a, m overflows, b empty. The second
    /// chance moves n to b and puts m at a: nothing overflows, and (n, a) is a blocking pair
    /// it made.
    #[test]
    fn one_move_makes_room_for_the_overflow() {
        let json = r#"{
          "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 1}}],
          "clusters": [
            {"id": "a", "lat": 0, "lon": 0, "resources": {"name": "r", "kind": "bps", "capacity": 1, "classes": ["web"]}},
            {"id": "b", "lat": 0, "lon": 0, "resources": {"name": "r", "kind": "bps", "capacity": 1, "classes": ["web"]}}],
          "map_units": [
            {"id": "m", "class": "web", "demand": 1, "lat": 0, "lon": 0,
             "candidates": [{"cluster": "a", "score": 20}]},
            {"id": "n", "class": "web", "demand": 1, "lat": 0, "lon": 0,
             "candidates": [{"cluster": "a", "score": 10}, {"cluster": "b", "score": 15}]}]
        }"#;
        let inst = parse_instance(json.as_bytes(), Limits::default()).expect("valid");
        let stable = solve(&inst, &SolveOptions::default()).map;
        assert_eq!(stable.overflow(0), 1.0, "m overflows");
        let (map, report) = second_chance(
            &inst,
            &stable,
            SecondChance::WithinLists,
            &SecondChanceParams::default(),
        );
        assert_eq!(map.total_overflow(), 0.0);
        assert_eq!(
            map.allocations(0),
            &[Allocation {
                cluster: 0,
                amount: 1.0
            }]
        );
        assert_eq!(
            map.allocations(1),
            &[Allocation {
                cluster: 1,
                amount: 1.0
            }]
        );
        assert_eq!((report.placements, report.moves), (1, 1));
        assert_eq!((report.placed, report.moved), (1.0, 1.0));
        let checked = verify(&inst, &map);
        assert!(checked.capacity.is_empty() && checked.conservation.is_empty());
        let (introduced, other) = report.split(&checked.blocking_pairs);
        assert!(other.is_empty());
        assert_eq!(introduced.len(), 1);
        assert_eq!((introduced[0].map_unit, introduced[0].cluster), (1, 0));
        // A move that would add more than the bound is not made.
        let tight = SecondChanceParams {
            max_added_ms: 4.0,
            ..SecondChanceParams::default()
        };
        let (kept, report) = second_chance(&inst, &stable, SecondChance::WithinLists, &tight);
        assert_eq!(kept.total_overflow(), 1.0);
        assert_eq!(report.moves, 0);
    }

    /// m's only candidate a is full with n, who has nowhere else to go. Beyond m's list: b is
    /// near but serves only video; c is near (about 111 km) with room for 1 of m's 3; d has
    /// room but is about 5,000 km away, beyond a bound of 50 ms; e is 2,200 km away with room.
    /// m gets 1 at c, then 2 at e; d and b are never used. Within the lists nothing moves.
    /// The placements beyond introduce no blocking pair: they take room no listed unit wanted.
    #[test]
    fn beyond_the_lists_the_nearest_with_room_within_the_bound() {
        let (inst, stable) = m_and_n(
            true,
            &[
                cluster("a", 0.0, 1.0, "web"),
                cluster("b", 0.5, 100.0, "video"),
                cluster("c", 1.0, 1.0, "web"),
                cluster("d", 45.0, 100.0, "web"),
                cluster("e", 20.0, 100.0, "web"),
            ],
        );
        let params = SecondChanceParams {
            max_beyond_ms: 50.0,
            ..SecondChanceParams::default()
        };
        let (within, _) = second_chance(&inst, &stable, SecondChance::WithinLists, &params);
        assert_eq!(within.total_overflow(), 3.0);
        let (map, report) = second_chance(&inst, &stable, SecondChance::BeyondLists, &params);
        assert_eq!(map.total_overflow(), 0.0);
        let at: Vec<(ClusterIdx, f64)> = report
            .beyond
            .iter()
            .map(|b| (b.cluster, b.amount))
            .collect();
        assert_eq!(at, vec![(2, 1.0), (4, 2.0)]);
        // The estimates: m's one score (20 at 0 km) calibrates the model to 18 ms over it,
        // and nothing beyond is better than 20.
        let want = |km: f64| (crate::geo::rtt_from_km(km) + 18.0) as f32;
        assert!((report.beyond[0].estimate_ms - want(111.2)).abs() < 0.1);
        assert!((report.beyond[1].estimate_ms - want(2_223.9)).abs() < 0.1);
        let checked = verify(&inst, &map);
        assert!(checked.capacity.is_empty() && checked.conservation.is_empty());
        let not_listed: Vec<(UnitIdx, ClusterIdx)> = checked
            .not_candidate
            .iter()
            .map(|p| (p.map_unit, p.cluster))
            .collect();
        assert_eq!(not_listed, vec![(0, 2), (0, 4)]);
        assert!(checked.blocking_pairs.is_empty());
        // A tighter bound keeps e out (2,224 km is ~33 ms over the best listed score).
        let tight = SecondChanceParams {
            max_beyond_ms: 30.0,
            ..params
        };
        let (map, report) = second_chance(&inst, &stable, SecondChance::BeyondLists, &tight);
        assert_eq!(map.total_overflow(), 2.0);
        assert_eq!(report.beyond.len(), 1);
    }

    /// A round after another: m (demand 3, overflowing at its one candidate a) was placed at
    /// e last round. Alone, the phase puts it at the nearest with room (c, 1; then e, 2);
    /// seeded with last round's map, m gets e back (all 3), and c keeps its room. With e
    /// down, or beyond the bound, the nearest again.
    #[test]
    fn beyond_the_lists_a_unit_gets_back_where_it_was() {
        let (inst, stable) = m_and_n(
            false,
            &[
                cluster("a", 0.0, 1.0, "web"),
                cluster("c", 1.0, 1.0, "web"),
                cluster("e", 20.0, 100.0, "web"),
            ],
        );
        let params = SecondChanceParams {
            max_beyond_ms: 50.0,
            ..SecondChanceParams::default()
        };
        let mut previous = Map::with_capacity(2, 2);
        previous.push_unit(
            [Allocation {
                cluster: 2,
                amount: 3.0,
            }],
            0.0,
        );
        previous.push_unit(
            [Allocation {
                cluster: 0,
                amount: 1.0,
            }],
            0.0,
        );
        let placed = |map: &Map| -> Vec<(ClusterIdx, f64)> {
            map.allocations(0)
                .iter()
                .map(|a| (a.cluster, a.amount))
                .collect()
        };
        let mode = SecondChance::BeyondLists;
        let (alone, _) = second_chance(&inst, &stable, mode, &params);
        assert_eq!(placed(&alone), vec![(1, 1.0), (2, 2.0)]);
        let (seeded, report) = second_chance_seeded(&inst, &stable, Some(&previous), mode, &params);
        assert_eq!(placed(&seeded), vec![(2, 3.0)]);
        assert_eq!(seeded.total_overflow(), 0.0);
        assert_eq!(report.beyond.len(), 1);
        let checked = verify(&inst, &seeded);
        assert!(checked.capacity.is_empty() && checked.conservation.is_empty());
        assert!(checked.blocking_pairs.is_empty());
        // e down: the nearest with room, c, then nothing else within reach.
        let down = inst.with_cluster_state(2, ClusterState::Down);
        let (map, _) = second_chance_seeded(&down, &stable, Some(&previous), mode, &params);
        assert_eq!(placed(&map), vec![(1, 1.0)]);
        // e beyond a tighter bound (2,224 km is ~33 ms over the best listed score): not kept.
        let tight = SecondChanceParams {
            max_beyond_ms: 30.0,
            ..params
        };
        let (map, _) = second_chance_seeded(&inst, &stable, Some(&previous), mode, &tight);
        assert_eq!(placed(&map), vec![(1, 1.0)]);
    }
}
