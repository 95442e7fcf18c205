//! The verifier: checks a [`Map`] against its [`Instance`] for feasibility and stability, as
//! defined in DESIGN.md, "Allocation semantics".
//!
//! It is written independently of the solver, from the spec alone, so that one can check the
//! other: it recomputes every node's usage from the map, recomputes both sides' preferences from
//! the instance (a map unit's order from `(score, cluster id)`, a cluster's order from the tuple
//! `(class priority, rank, map unit id)`, compared field by field, never packed into an integer),
//! and looks for blocking pairs directly from their definition.
//!
//! # What is checked
//!
//! - **Capacity**: on every resource node of every cluster (up or not), the usage — the sum over
//!   the allocations passing the node of `amount × per_unit[node kind][class]` — is at most the
//!   capacity. Allocations at non-candidate clusters count too: they consume capacity all the same.
//! - **Conservation**: for every map unit, allocated + overflow = demand, with no negative (or
//!   non-finite) allocation or overflow. A map read from a file may name the same cluster twice for
//!   one unit; those amounts are summed before any other check.
//! - **Candidates**: demand goes only to the unit's candidates ([`Report::not_candidate`]).
//! - **Liveness**: demand goes only to clusters whose state is `Up` ([`Report::unavailable`]).
//! - **Stability**: there is no blocking pair ([`Report::blocking_pairs`]), see below.
//! - **Shape**: the map has one entry per map unit of the instance ([`Report::shape`]). Units the
//!   map lacks are treated as having no allocation and no overflow (so their demand shows up as a
//!   conservation violation); extra units in the map are ignored.
//!
//! # Blocking pairs
//!
//! `(m, c)` is a blocking pair when `c` is an `Up` candidate of `m` and both:
//!
//! 1. `m` has demand it would rather move to `c`:
//!    `U = overflow(m) + Σ m's allocations at clusters it likes less than c` exceeds `tol(m)`.
//!    Demand placed at a cluster that is not a candidate of `m`, or not `Up`, counts in `U` for
//!    every candidate (it is not legitimately placed anywhere). When conservation fails (say the
//!    map lost some of `m`'s demand), `U` is instead `demand(m) − Σ m's allocations at c and the
//!    clusters it likes more`, if that is larger: lost demand is unsatisfied demand too.
//! 2. `c` could take more than `tol(m)` of it: for every node `n` of `m`'s path in `c` with
//!    coefficient `q = per_unit[kind of n][class of m] > 0`,
//!    `(free(n) + usage at n held by map units that c likes strictly less than m − slack(n)) / q`
//!    exceeds `tol(m)`. Allocations at `c` of units for which `c` is not a candidate are liked less
//!    than any candidate (`c` would shed them first).
//!
//! The reported gain is `min(U, min over those nodes of the quantity above)`: how much more of `m`
//! the cluster could take. A cluster that is not `Up` is never part of a blocking pair.
//!
//! Each node's holders are sorted once by the cluster's preference key and turned into suffix sums,
//! so "usage held by units liked less than m" is one binary search: the whole check runs in
//! `O(A log A + C)` for `A` (allocation, node) pairs and `C` candidates in all, a few seconds for a
//! million map units.
//!
//! # Tolerances
//!
//! The solver works with tight tolerances (about 1e-9); the verifier's are looser, to absorb float
//! error only (sums taken in a different order, eviction arithmetic), never to excuse a real
//! violation. With `rel = 1e-6`, `abs = 1e-9` and `room_rel = 1e-8` ([`Tolerances::default`]):
//!
//! - `tol(d) = rel × d + abs` for a map unit of demand `d`. Conservation holds when
//!   `|allocated + overflow − d| ≤ tol(d)`; an allocation or overflow below `−tol(d)` is a
//!   violation; an allocation of at most `tol(d)` at a non-candidate or non-`Up` cluster is ignored.
//! - A node of capacity `cap` is over capacity when `used > cap + rel × cap + abs`, i.e.
//!   `used > cap × (1 + 1e-6) + 1e-9`.
//! - A node's room is reduced by `slack(n) = room_rel × cap` before it is compared, so a node
//!   filled to within `1e-8 × cap` of its capacity counts as full. (Without it, a node of large
//!   capacity that the solver filled up to rounding error, say 1e-12 × 1e10 = 0.01, would block
//!   with every unit of small demand that wants it; with it, only room beyond ten times the
//!   solver's own tolerance counts.)
//! - A blocking pair needs both `U > tol(d)` and a gain `> tol(d)`.
//!
//! [`verify_with`] takes other tolerances (e.g. zero, for exact hand-made examples).

use std::cmp::Ordering;
use std::fmt::Write as _;

use crate::map::Map;
use crate::model::{Candidate, ClusterIdx, ClusterState, Instance, UnitIdx};

/// The verifier's tolerances; see the module documentation for how each is used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    /// Relative tolerance on demand amounts and on node capacities.
    pub rel: f64,
    /// Absolute tolerance added to every relative one.
    pub abs: f64,
    /// Share of a node's capacity that does not count as room when looking for blocking pairs.
    pub room_rel: f64,
}

impl Default for Tolerances {
    fn default() -> Self {
        Tolerances {
            rel: 1e-6,
            abs: 1e-9,
            room_rel: 1e-8,
        }
    }
}

impl Tolerances {
    /// The tolerance on amounts of a map unit with demand `demand`: `rel × demand + abs`.
    pub fn demand(&self, demand: f64) -> f64 {
        self.rel * demand.abs() + self.abs
    }

    /// The most a node of capacity `capacity` may carry: `capacity × (1 + rel) + abs`.
    pub fn capacity_bound(&self, capacity: f64) -> f64 {
        capacity + self.rel * capacity.abs() + self.abs
    }

    /// Room at a node of capacity `capacity` that is ignored when looking for blocking pairs.
    pub fn room_slack(&self, capacity: f64) -> f64 {
        self.room_rel * capacity.abs()
    }
}

/// A resource node carrying more than its capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacityViolation {
    pub cluster: ClusterIdx,
    /// The node's index within its cluster (`Cluster::nodes`).
    pub node: u32,
    pub used: f64,
    pub capacity: f64,
}

/// A map unit whose allocations and overflow do not add up to its demand, or that has a negative
/// (or non-finite) allocation or overflow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConservationViolation {
    pub map_unit: UnitIdx,
    pub demand: f64,
    /// Sum of the unit's allocation amounts, as given.
    pub allocated: f64,
    pub overflow: f64,
    /// The most negative allocation amount, when one is below `−tol(demand)` or not finite.
    pub bad_amount: Option<f64>,
}

/// Demand of one map unit at one cluster (duplicates in the map summed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    pub map_unit: UnitIdx,
    /// The cluster's index; in [`Report::not_candidate`] it may be out of range for a hand-made
    /// map, and is then reported whatever the amount.
    pub cluster: ClusterIdx,
    pub amount: f64,
}

/// A map unit and an `Up` candidate cluster that would both gain by moving demand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockingPair {
    pub map_unit: UnitIdx,
    pub cluster: ClusterIdx,
    /// How much more of the unit's demand the cluster could take (and the unit would move).
    pub gain: f64,
}

/// A companion ([`crate::companion`]) that breaks its rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompanionViolation {
    pub map_unit: UnitIdx,
    pub cluster: ClusterIdx,
    pub amount: f64,
    /// Which rule: "its class has no companions", "not the class's share of its demand",
    /// "not one of its candidates", "not up", "also one of its placements".
    pub problem: &'static str,
}

/// The map does not have one entry per map unit of the instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShapeMismatch {
    pub instance_units: usize,
    pub map_units: usize,
}

/// Everything the verifier found wrong with a map. Each list is in a deterministic order: capacity
/// violations by cluster and node, the others by map unit (a unit's blocking pairs in its own
/// preference order).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// Nodes carrying more than their capacity.
    pub capacity: Vec<CapacityViolation>,
    /// Units whose allocated + overflow is not their demand, or with negative amounts.
    pub conservation: Vec<ConservationViolation>,
    /// Allocations at clusters that are not candidates of the unit.
    pub not_candidate: Vec<Placement>,
    /// Allocations (more than the tolerance) at clusters that are not `Up`.
    pub unavailable: Vec<Placement>,
    /// Stability violations.
    pub blocking_pairs: Vec<BlockingPair>,
    /// Set when the map's unit count differs from the instance's.
    pub shape: Option<ShapeMismatch>,
    /// Companions that break their rule.
    pub companions: Vec<CompanionViolation>,
}

impl Report {
    /// True when the map is feasible and stable.
    pub fn is_ok(&self) -> bool {
        self.violation_count() == 0
    }

    /// Number of violations of every kind.
    pub fn violation_count(&self) -> usize {
        self.capacity.len()
            + self.conservation.len()
            + self.not_candidate.len()
            + self.unavailable.len()
            + self.blocking_pairs.len()
            + usize::from(self.shape.is_some())
            + self.companions.len()
    }

    /// The largest blocking-pair gain, 0 when there is none.
    pub fn max_blocking_gain(&self) -> f64 {
        self.blocking_pairs
            .iter()
            .map(|b| b.gain)
            .fold(0.0, f64::max)
    }

    /// A human-readable account of at most `max_lines` violations (plus one line saying how many
    /// were left out), naming map units, clusters and nodes by id.
    pub fn describe(&self, instance: &Instance, max_lines: usize) -> String {
        let total = self.violation_count();
        if total == 0 {
            return "no violations".to_string();
        }
        let mut lines: Vec<String> = self.lines(instance).take(max_lines).collect();
        if lines.len() < total {
            lines.push(format!("... and {} more", total - lines.len()));
        }
        lines.join("\n")
    }

    /// A line for each violation, in [`Self::describe`]'s order (each made only when taken).
    fn lines<'a>(&'a self, instance: &'a Instance) -> impl Iterator<Item = String> + 'a {
        let unit = move |u: UnitIdx| {
            if (u as usize) < instance.unit_count() {
                format!("{:?}", instance.unit_id(u))
            } else {
                format!("#{u}")
            }
        };
        let cluster = move |c: ClusterIdx| match instance.clusters().get(c as usize) {
            Some(cl) => format!("{:?}", cl.id),
            None => format!("#{c} (no such cluster)"),
        };
        let shape = self.shape.iter().map(|s| {
            format!(
                "the map has {} map units, the instance {}",
                s.map_units, s.instance_units
            )
        });
        let capacity = self.capacity.iter().map(move |v| {
            let node = instance
                .clusters()
                .get(v.cluster as usize)
                .and_then(|c| c.nodes.get(v.node as usize))
                .map_or_else(|| format!("#{}", v.node), |n| format!("{:?}", n.name));
            format!(
                "cluster {} node {}: used {} > capacity {}",
                cluster(v.cluster),
                node,
                num(v.used),
                num(v.capacity)
            )
        });
        let conservation = self.conservation.iter().map(move |v| {
            let mut line = format!(
                "map unit {}: demand {}, but allocated {} + overflow {} = {}",
                unit(v.map_unit),
                num(v.demand),
                num(v.allocated),
                num(v.overflow),
                num(v.allocated + v.overflow)
            );
            if let Some(a) = v.bad_amount {
                let _ = write!(line, "; has an allocation of {}", num(a));
            }
            if v.overflow.is_nan() || v.overflow < 0.0 {
                line.push_str("; overflow is negative");
            }
            line
        });
        let not_candidate = self.not_candidate.iter().map(move |p| {
            format!(
                "map unit {}: {} placed at cluster {}, which is not one of its candidates",
                unit(p.map_unit),
                num(p.amount),
                cluster(p.cluster)
            )
        });
        let unavailable = self.unavailable.iter().map(move |p| {
            let state = instance
                .clusters()
                .get(p.cluster as usize)
                .map_or(ClusterState::Down, |c| c.state);
            format!(
                "map unit {}: {} placed at cluster {}, which is {}",
                unit(p.map_unit),
                num(p.amount),
                cluster(p.cluster),
                format!("{state:?}").to_lowercase()
            )
        });
        let blocking = self.blocking_pairs.iter().map(move |b| {
            format!(
                "blocking pair: map unit {} and cluster {}: the cluster could take {} more of it",
                unit(b.map_unit),
                cluster(b.cluster),
                num(b.gain)
            )
        });
        let companions = self.companions.iter().map(move |v| {
            format!(
                "map unit {}: its companion, {} at cluster {}: {}",
                unit(v.map_unit),
                num(v.amount),
                cluster(v.cluster),
                v.problem
            )
        });
        shape
            .chain(capacity)
            .chain(conservation)
            .chain(not_candidate)
            .chain(unavailable)
            .chain(blocking)
            .chain(companions)
    }
}

/// A number for humans: integers without a fraction, others with up to 6 decimals.
fn num(x: f64) -> String {
    if x.is_finite() && x == x.trunc() && x.abs() < 1e15 {
        format!("{x}")
    } else if x.is_finite() && x.abs() >= 1e-3 {
        let s = format!("{x:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{x:e}")
    }
}

/// Checks `map` against `instance` with the default [`Tolerances`].
pub fn verify(instance: &Instance, map: &Map) -> Report {
    verify_with(instance, map, &Tolerances::default())
}

/// A map unit's allocation at one cluster, duplicates summed.
#[derive(Debug, Clone, Copy)]
struct Placed {
    cluster: ClusterIdx,
    amount: f64,
    /// The rank the cluster gives the unit, when the cluster is one of its candidates.
    rank: Option<f32>,
    /// Whether the cluster holds the unit as an incumbent (stickiness).
    incumbent: bool,
}

/// A cluster's preference key for a map unit at one of its nodes: lower is liked more.
#[derive(Debug, Clone, Copy)]
struct Key {
    /// The unit is not a candidate of the cluster: liked less than every candidate.
    not_candidate: bool,
    /// A candidate the cluster does not hold as an incumbent, when the instance marks
    /// incumbents (stickiness): liked less than every incumbent, whatever the class.
    newcomer: bool,
    priority: u32,
    rank: f32,
    unit: UnitIdx,
}

/// Compares two keys as the tuple `(not_candidate, newcomer, priority, rank, unit id)`, the id
/// as a string.
fn key_cmp(instance: &Instance, a: &Key, b: &Key) -> Ordering {
    a.not_candidate
        .cmp(&b.not_candidate)
        .then(a.newcomer.cmp(&b.newcomer))
        .then(a.priority.cmp(&b.priority))
        .then(a.rank.total_cmp(&b.rank))
        .then_with(|| instance.unit_id(a.unit).cmp(instance.unit_id(b.unit)))
}

/// A map unit's usage at one node. After [`NodeHolders::build`], `weight` holds the suffix sum:
/// the usage of this holder and of all holders the cluster likes less.
#[derive(Debug, Clone, Copy)]
struct Holder {
    key: Key,
    weight: f64,
}

/// `x > bound`, or `x` is NaN.
fn above(x: f64, bound: f64) -> bool {
    x.is_nan() || x > bound
}

/// The positive part of an amount (NaN counts as 0; conservation reports it).
fn positive(x: f64) -> f64 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}

/// Checks `map` against `instance` with the given tolerances.
pub fn verify_with(instance: &Instance, map: &Map, tol: &Tolerances) -> Report {
    if !map.companion_units().is_empty() {
        return verify_companions(instance, map, tol);
    }
    let mut report = Report::default();
    let units = instance.unit_count();
    if map.unit_count() != units {
        report.shape = Some(ShapeMismatch {
            instance_units: units,
            map_units: map.unit_count(),
        });
    }
    let placed = check_units(instance, map, tol, &mut report);
    let used = node_usage(instance, &placed);
    check_capacity(instance, &used, tol, &mut report);
    let holders = NodeHolders::build(instance, &placed);
    find_blocking_pairs(instance, map, tol, &placed, &used, &holders, &mut report);
    report
}

/// A map with companions (go with the winner, [`crate::companion`]): each companion holds its rule
/// (its class has a share, its amount is that share of the unit's demand, at an up candidate
/// that is none of the unit's other allocations); the rest of the map is checked as a map of
/// the instance with the companions *reserved* (each unit's demand less its companion's, each
/// node's capacity less what the companions use on it), so it must be a stable allocation of
/// what the companions leave; and every node's capacity holds over the whole map.
fn verify_companions(instance: &Instance, map: &Map, tol: &Tolerances) -> Report {
    let clusters = instance.clusters();
    let mut demands = instance.demands().to_vec();
    let mut capacities = instance.capacities();
    let mut problems = Vec::new();
    for &u in map.companion_units() {
        let Some(c) = map.companion(u).filter(|_| (u as usize) < demands.len()) else {
            continue;
        };
        let k = instance.unit_class(u);
        let class = &instance.classes()[usize::from(k)];
        let demand = instance.unit_demand(u);
        let problem = if class.companion_share == 0.0 {
            Some("its class has no companions")
        } else if above(
            (c.amount - class.companion_share * demand).abs(),
            tol.demand(demand),
        ) {
            Some("not the class's share of its demand")
        } else if !instance.candidates(u).any(|x| x.cluster == c.cluster) {
            Some("not one of its candidates")
        } else if clusters[c.cluster as usize].state != ClusterState::Up {
            Some("not up")
        } else if map.placed(u).iter().any(|a| a.cluster == c.cluster) {
            Some("also one of its placements")
        } else {
            None
        };
        if let Some(problem) = problem {
            problems.push(CompanionViolation {
                map_unit: u,
                cluster: c.cluster,
                amount: c.amount,
                problem,
            });
        }
        let cl = &clusters[c.cluster as usize];
        demands[u as usize] = positive(demands[u as usize] - positive(c.amount));
        for n in cl.path(k) {
            let g = instance.global_node(c.cluster, n);
            let coef = class.per_unit.get(cl.nodes[n as usize].kind);
            capacities[g] = positive(capacities[g] - positive(c.amount) * coef);
        }
    }
    let per_unit: Vec<_> = instance.classes().iter().map(|k| k.per_unit).collect();
    let residual = instance
        .with_demands(demands)
        .and_then(|i| i.with_capacities(&per_unit, &capacities));
    let mut report = match residual {
        Ok(residual) => verify_with(&residual, &map.without_companions(), tol),
        // Not reachable: the demands and capacities above are finite and >= 0.
        Err(_) => Report::default(),
    };
    report.capacity.clear();
    let placed = check_units(instance, map, tol, &mut Report::default());
    check_capacity(instance, &node_usage(instance, &placed), tol, &mut report);
    report.companions = problems;
    report
}

/// Every map unit's allocations with duplicates summed, in cluster order:
/// unit `u`'s are `items[start[u]..start[u + 1]]`.
struct PlacedAll {
    start: Vec<u32>,
    items: Vec<Placed>,
}

impl PlacedAll {
    fn of(&self, u: UnitIdx) -> &[Placed] {
        let u = u as usize;
        &self.items[self.start[u] as usize..self.start[u + 1] as usize]
    }
}

/// The unit's allocations and overflow as the map gives them (none for units the map lacks).
fn unit_entry(map: &Map, u: UnitIdx) -> (&[crate::map::Allocation], f64) {
    if (u as usize) < map.unit_count() {
        (map.allocations(u), map.overflow(u))
    } else {
        (&[], 0.0)
    }
}

/// Conservation, candidate and liveness checks, unit by unit; returns the merged allocations.
fn check_units(instance: &Instance, map: &Map, tol: &Tolerances, report: &mut Report) -> PlacedAll {
    let clusters = instance.clusters();
    let units = instance.unit_count();
    let mut out = PlacedAll {
        start: Vec::with_capacity(units + 1),
        items: Vec::with_capacity(units),
    };
    out.start.push(0);
    let mut scratch: Vec<(ClusterIdx, f64)> = Vec::new();
    for u in 0..units as UnitIdx {
        let (allocs, overflow) = unit_entry(map, u);
        let demand = instance.unit_demand(u);
        let tol_d = tol.demand(demand);

        // Conservation, on the amounts as given.
        let allocated: f64 = allocs.iter().map(|a| a.amount).sum();
        let bad_amount = allocs
            .iter()
            .map(|a| a.amount)
            .filter(|&x| !x.is_finite() || x < -tol_d)
            .min_by(|a, b| a.total_cmp(b));
        let unbalanced = above((allocated + overflow - demand).abs(), tol_d);
        if unbalanced || bad_amount.is_some() || !overflow.is_finite() || overflow < -tol_d {
            report.conservation.push(ConservationViolation {
                map_unit: u,
                demand,
                allocated,
                overflow,
                bad_amount,
            });
        }

        // Merge duplicate clusters; refuse indices out of range.
        scratch.clear();
        for a in allocs {
            if (a.cluster as usize) < clusters.len() {
                scratch.push((a.cluster, a.amount));
            } else {
                report.not_candidate.push(Placement {
                    map_unit: u,
                    cluster: a.cluster,
                    amount: a.amount,
                });
            }
        }
        scratch.sort_unstable_by_key(|&(c, _)| c);
        let first = out.items.len();
        for &(c, amount) in &scratch {
            match out.items[first..].last_mut() {
                Some(last) if last.cluster == c => last.amount += amount,
                _ => out.items.push(Placed {
                    cluster: c,
                    amount,
                    rank: instance
                        .candidates(u)
                        .find(|k| k.cluster == c)
                        .map(|k| k.rank),
                    incumbent: instance
                        .candidates(u)
                        .any(|k| k.cluster == c && k.incumbent),
                }),
            }
        }
        for p in &out.items[first..] {
            if p.rank.is_none() && above(p.amount.abs(), tol_d) {
                report.not_candidate.push(Placement {
                    map_unit: u,
                    cluster: p.cluster,
                    amount: p.amount,
                });
            }
            if clusters[p.cluster as usize].state != ClusterState::Up && above(p.amount, tol_d) {
                report.unavailable.push(Placement {
                    map_unit: u,
                    cluster: p.cluster,
                    amount: p.amount,
                });
            }
        }
        out.start.push(out.items.len() as u32);
    }
    out
}

/// Usage of every node (global node index), from every allocation, candidate or not, at clusters
/// in any state. Negative amounts count as zero (they are conservation violations and must not
/// hide a capacity violation).
fn node_usage(instance: &Instance, placed: &PlacedAll) -> Vec<f64> {
    let clusters = instance.clusters();
    let mut used = vec![0.0; instance.node_count()];
    for u in 0..instance.unit_count() as UnitIdx {
        let class = instance.unit_class(u);
        let per_unit = instance.classes()[usize::from(class)].per_unit;
        for p in placed.of(u) {
            let amount = positive(p.amount);
            if amount == 0.0 {
                continue;
            }
            let cl = &clusters[p.cluster as usize];
            for n in cl.path(class) {
                let q = per_unit.get(cl.nodes[n as usize].kind);
                used[instance.global_node(p.cluster, n)] += amount * q;
            }
        }
    }
    used
}

fn check_capacity(instance: &Instance, used: &[f64], tol: &Tolerances, report: &mut Report) {
    for (c, cl) in instance.clusters().iter().enumerate() {
        for (i, node) in cl.nodes.iter().enumerate() {
            let u = used[instance.global_node(c as ClusterIdx, i as u32)];
            if above(u, tol.capacity_bound(node.capacity)) {
                report.capacity.push(CapacityViolation {
                    cluster: c as ClusterIdx,
                    node: i as u32,
                    used: u,
                    capacity: node.capacity,
                });
            }
        }
    }
}

/// For every node of every `Up` cluster, the allocations passing it with positive usage, sorted
/// by the cluster's preference (liked most first), with suffix sums of their usage.
struct NodeHolders {
    /// Holders of global node `g` are `holders[start[g]..start[g + 1]]`.
    start: Vec<u32>,
    holders: Vec<Holder>,
}

impl NodeHolders {
    fn build(instance: &Instance, placed: &PlacedAll) -> NodeHolders {
        let clusters = instance.clusters();
        let nodes = instance.node_count();
        // Calls `f(global node, holder)` for every holder, in unit order.
        let each = |f: &mut dyn FnMut(usize, Holder)| {
            for u in 0..instance.unit_count() as UnitIdx {
                let class = instance.unit_class(u);
                let tc = &instance.classes()[usize::from(class)];
                for p in placed.of(u) {
                    let amount = positive(p.amount);
                    let cl = &clusters[p.cluster as usize];
                    if amount == 0.0 || cl.state != ClusterState::Up {
                        continue;
                    }
                    let key = Key {
                        not_candidate: p.rank.is_none(),
                        newcomer: !p.incumbent,
                        priority: tc.priority,
                        rank: p.rank.unwrap_or(f32::INFINITY),
                        unit: u,
                    };
                    for n in cl.path(class) {
                        let weight = amount * tc.per_unit.get(cl.nodes[n as usize].kind);
                        if weight > 0.0 {
                            f(instance.global_node(p.cluster, n), Holder { key, weight });
                        }
                    }
                }
            }
        };
        // Counting sort by node, then each node's holders by key.
        let mut start = vec![0u32; nodes + 1];
        each(&mut |g, _| start[g + 1] += 1);
        for g in 0..nodes {
            start[g + 1] += start[g];
        }
        let placeholder = Holder {
            key: Key {
                not_candidate: true,
                newcomer: true,
                priority: 0,
                rank: 0.0,
                unit: 0,
            },
            weight: 0.0,
        };
        let mut holders = vec![placeholder; start[nodes] as usize];
        let mut next = start.clone();
        each(&mut |g, h| {
            holders[next[g] as usize] = h;
            next[g] += 1;
        });
        for g in 0..nodes {
            let seg = &mut holders[start[g] as usize..start[g + 1] as usize];
            seg.sort_unstable_by(|a, b| key_cmp(instance, &a.key, &b.key));
            let mut acc = 0.0;
            for h in seg.iter_mut().rev() {
                acc += h.weight;
                h.weight = acc;
            }
        }
        NodeHolders { start, holders }
    }

    /// Usage at global node `g` held by units the cluster likes strictly less than `key`. Keys are
    /// distinct per unit, so a unit's own usage (its key equals `key`) is never counted as room.
    fn usage_worse_than(&self, instance: &Instance, g: usize, key: &Key) -> f64 {
        let seg = &self.holders[self.start[g] as usize..self.start[g + 1] as usize];
        let p = seg.partition_point(|h| key_cmp(instance, &h.key, key) != Ordering::Greater);
        seg.get(p).map_or(0.0, |h| h.weight)
    }
}

/// A map unit's order on its candidates: lower score first, ties broken by cluster id (cluster
/// index order is id order).
fn unit_pref(a: &Candidate, b: &Candidate) -> Ordering {
    a.score.total_cmp(&b.score).then(a.cluster.cmp(&b.cluster))
}

fn find_blocking_pairs(
    instance: &Instance,
    map: &Map,
    tol: &Tolerances,
    placed: &PlacedAll,
    used: &[f64],
    holders: &NodeHolders,
    report: &mut Report,
) {
    let clusters = instance.clusters();
    let mut cands: Vec<Candidate> = Vec::new();
    // (position in `cands`, amount) of the unit's allocations at Up candidates.
    let mut at_candidates: Vec<(usize, f64)> = Vec::new();
    for m in 0..instance.unit_count() as UnitIdx {
        let demand = instance.unit_demand(m);
        let tol_d = tol.demand(demand);
        let (_, overflow) = unit_entry(map, m);
        cands.clear();
        cands.extend(instance.candidates(m));
        if !cands.is_sorted_by(|a, b| unit_pref(a, b) != Ordering::Greater) {
            cands.sort_by(unit_pref);
        }
        // Demand not legitimately placed: overflow, and demand at non-candidates or at clusters
        // that are not up.
        let mut unplaced = positive(overflow);
        at_candidates.clear();
        for p in placed.of(m) {
            let amount = positive(p.amount);
            let up = clusters[p.cluster as usize].state == ClusterState::Up;
            match cands.iter().position(|k| k.cluster == p.cluster) {
                Some(j) if up => at_candidates.push((j, amount)),
                _ => unplaced += amount,
            }
        }
        let class = instance.unit_class(m);
        let tc = &instance.classes()[usize::from(class)];
        for (j, cand) in cands.iter().enumerate() {
            // Demand m would rather have at its j-th candidate; never grows with j.
            let (mut worse, mut better) = (unplaced, 0.0);
            for &(i, a) in &at_candidates {
                if i > j {
                    worse += a;
                } else {
                    better += a;
                }
            }
            let want = f64::max(worse, demand - better);
            if want <= tol_d {
                break;
            }
            let cl = &clusters[cand.cluster as usize];
            if cl.state != ClusterState::Up {
                continue;
            }
            let key = Key {
                not_candidate: false,
                newcomer: !cand.incumbent,
                priority: tc.priority,
                rank: cand.rank,
                unit: m,
            };
            let mut gain = want;
            for n in cl.path(class) {
                let node = &cl.nodes[n as usize];
                let q = tc.per_unit.get(node.kind);
                if q <= 0.0 {
                    continue;
                }
                let g = instance.global_node(cand.cluster, n);
                let room = node.capacity - used[g] + holders.usage_worse_than(instance, g, &key)
                    - tol.room_slack(node.capacity);
                gain = gain.min(room / q);
            }
            if gain > tol_d {
                report.blocking_pairs.push(BlockingPair {
                    map_unit: m,
                    cluster: cand.cluster,
                    gain,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::Allocation;
    use crate::model::Limits;
    use crate::testing::parse_instance;
    use serde_json::{json, Value};

    fn build(v: &Value) -> Instance {
        parse_instance(v.to_string().as_bytes(), Limits::default()).expect("valid instance")
    }

    /// Classes of the worked example: apps is preferred (priority 0) and Fps-heavy, video is
    /// Bps-heavy.
    fn classes(apps_priority: u32, video_priority: u32) -> Value {
        json!([
            {"name": "apps", "priority": apps_priority, "per_unit": {"bps": 0.25, "fps": 1.0}},
            {"name": "video", "priority": video_priority, "per_unit": {"bps": 1.0, "fps": 0.25}},
        ])
    }

    /// A cluster shaped like the worked example: Bps root "A", Fps node "B" under it, one Fps
    /// leaf per class under B.
    fn cluster(id: &str, state: &str, a: f64, b: f64) -> Value {
        json!({
            "id": id, "lat": 50.0, "lon": 8.0, "state": state,
            "resources": {"name": "A", "kind": "bps", "capacity": a, "children": [
                {"name": "B", "kind": "fps", "capacity": b, "children": [
                    {"name": "LV", "kind": "fps", "capacity": 1000.0, "classes": ["video"]},
                    {"name": "LA", "kind": "fps", "capacity": 1000.0, "classes": ["apps"]},
                ]},
            ]},
        })
    }

    fn unit(id: &str, class: &str, demand: f64, cands: &[(&str, f64)]) -> Value {
        let cands: Vec<Value> = cands
            .iter()
            .map(|&(c, s)| json!({"cluster": c, "score": s}))
            .collect();
        json!({"id": id, "class": class, "demand": demand, "lat": 50.0, "lon": 8.0,
               "candidates": cands})
    }

    fn instance(classes: Value, clusters: Vec<Value>, units: Vec<Value>) -> Instance {
        build(&json!({"traffic_classes": classes, "clusters": clusters, "map_units": units}))
    }

    /// The worked example of DESIGN.md plus a second cluster "c2" (and a worse "c3") for video.
    fn worked(c2: Value) -> Instance {
        instance(
            classes(0, 1),
            vec![
                cluster("c1", "up", 26.5, 30.0),
                c2,
                cluster("c3", "up", 1000.0, 1000.0),
            ],
            vec![
                unit("apps1", "apps", 26.0, &[("c1", 1.0)]),
                unit(
                    "video1",
                    "video",
                    20.0,
                    &[("c1", 1.0), ("c2", 2.0), ("c3", 3.0)],
                ),
            ],
        )
    }

    fn big_c2() -> Value {
        cluster("c2", "up", 1000.0, 1000.0)
    }

    /// One map unit's entry: unit id, `(cluster id, amount)` allocations, overflow.
    type Entry<'a> = (&'a str, &'a [(&'a str, f64)], f64);

    /// A map from entries; every unit must be listed.
    fn map(inst: &Instance, entries: &[Entry]) -> Map {
        let mut m = Map::with_capacity(inst.unit_count(), entries.len());
        for u in 0..inst.unit_count() as UnitIdx {
            let (_, allocs, overflow) = entries
                .iter()
                .find(|e| e.0 == inst.unit_id(u))
                .unwrap_or_else(|| panic!("unit {} not in the map", inst.unit_id(u)));
            m.push_unit(
                allocs.iter().map(|&(c, amount)| Allocation {
                    cluster: inst.cluster_index(c).expect("known cluster"),
                    amount,
                }),
                *overflow,
            );
        }
        m
    }

    fn cidx(inst: &Instance, id: &str) -> ClusterIdx {
        inst.cluster_index(id).unwrap()
    }

    fn uidx(inst: &Instance, id: &str) -> UnitIdx {
        inst.unit_index(id).unwrap()
    }

    fn pairs(r: &Report) -> Vec<(UnitIdx, ClusterIdx)> {
        r.blocking_pairs
            .iter()
            .map(|b| (b.map_unit, b.cluster))
            .collect()
    }

    fn close(a: f64, b: f64) -> bool {
        // Gains are reduced by the room slack (1e-8 of a node's capacity).
        (a - b).abs() <= 1e-6 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn worked_example_stable_map_passes() {
        let inst = worked(big_c2());
        // 4 units of video evicted from c1 (B: 16 × 0.25 + 26 = 30) go to c2.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", 4.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert!(r.is_ok(), "{}", r.describe(&inst, 10));
        assert_eq!(r.violation_count(), 0);
        assert_eq!(r.describe(&inst, 10), "no violations");
    }

    #[test]
    fn capacity_overflow_at_inner_node() {
        let inst = worked(big_c2());
        // Everything at c1: B needs 20 × 0.25 + 26 = 31 Fps; A needs exactly 26.5 (fine).
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 20.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        let c1 = cidx(&inst, "c1");
        let b = inst.clusters()[c1 as usize]
            .nodes
            .iter()
            .position(|n| n.name == "B")
            .unwrap() as u32;
        assert_eq!(
            r.capacity,
            vec![CapacityViolation {
                cluster: c1,
                node: b,
                used: 31.0,
                capacity: 30.0
            }]
        );
        assert_eq!(r.violation_count(), 1, "{r:?}");
        assert!(r
            .describe(&inst, 10)
            .contains(r#"cluster "c1" node "B": used 31 > capacity 30"#));
    }

    #[test]
    fn capacity_within_tolerance_passes() {
        let inst = worked(big_c2());
        // B over by half its relative tolerance; apps1's overflow balances the extra amount,
        // within tol(26) = 2.6e-5.
        let over = 30.0 * 5e-7;
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0 + over)], -over),
                ("video1", &[("c1", 16.0), ("c2", 4.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert!(r.is_ok(), "{}", r.describe(&inst, 10));
        // Over by twice the tolerance: a violation.
        let over = 30.0 * 2e-6;
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0 + over)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", 4.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(r.capacity.len(), 1, "{r:?}");
        // And apps1's allocation exceeds its demand by 6e-5 > tol(26).
        assert_eq!(r.conservation.len(), 1, "{r:?}");
    }

    #[test]
    fn conservation_violations() {
        let inst = worked(big_c2());
        let apps = uidx(&inst, "apps1");
        let video = uidx(&inst, "video1");
        // Demand lost: 26 demanded, 20 allocated, no overflow.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 20.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", 4.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(
            r.conservation,
            vec![ConservationViolation {
                map_unit: apps,
                demand: 26.0,
                allocated: 20.0,
                overflow: 0.0,
                bad_amount: None
            }]
        );
        assert!(r
            .describe(&inst, 10)
            .contains(r#"map unit "apps1": demand 26, but allocated 20 + overflow 0 = 20"#));

        // Balanced sums that hide a negative allocation.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", 8.0), ("c3", -4.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(r.conservation.len(), 1);
        assert_eq!(r.conservation[0].map_unit, video);
        assert_eq!(r.conservation[0].bad_amount, Some(-4.0));
        assert!(r.describe(&inst, 10).contains("allocation of -4"));

        // Negative overflow.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", 6.0)], -2.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(r.conservation.len(), 1);
        assert!(r.describe(&inst, 10).contains("overflow is negative"));

        // Too much overflow.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 1.0),
                ("video1", &[("c1", 16.0), ("c2", 4.0)], 0.0),
            ],
        );
        assert_eq!(verify(&inst, &m).conservation.len(), 1);

        // NaN.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", f64::NAN)], 0.0),
            ],
        );
        assert_eq!(verify(&inst, &m).conservation.len(), 1);

        // Float error within tolerance is fine.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 1e-7),
                ("video1", &[("c1", 16.0), ("c2", 4.0 - 1e-6)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert!(r.is_ok(), "{}", r.describe(&inst, 10));
    }

    #[test]
    fn duplicate_clusters_in_a_unit_are_summed() {
        let inst = worked(big_c2());
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 20.0), ("c1", 6.0)], 0.0),
                ("video1", &[("c2", 1.0), ("c1", 16.0), ("c2", 3.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert!(r.is_ok(), "{}", r.describe(&inst, 10));
        // Summed, c1 is over capacity at B: 26 + 20 × 0.25 = 31.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 20.0), ("c1", 6.0)], 0.0),
                ("video1", &[("c1", 10.0), ("c1", 10.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(r.capacity.len(), 1);
        assert_eq!(r.capacity[0].used, 31.0);
    }

    #[test]
    fn allocation_to_a_non_candidate() {
        let inst = worked(big_c2());
        let apps = uidx(&inst, "apps1");
        let c2 = cidx(&inst, "c2");
        // c2 serves apps, but is not a candidate of apps1.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c2", 26.0)], 0.0),
                ("video1", &[("c1", 20.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(
            r.not_candidate,
            vec![Placement {
                map_unit: apps,
                cluster: c2,
                amount: 26.0
            }]
        );
        // Demand at a non-candidate is not legitimately placed: c1 (B: 25 free + 5 held by video,
        // which it likes less) blocks with apps1 for all 26.
        assert_eq!(pairs(&r), vec![(apps, cidx(&inst, "c1"))]);
        assert!(close(r.blocking_pairs[0].gain, 26.0));
        assert!(r
            .describe(&inst, 10)
            .contains(r#"map unit "apps1": 26 placed at cluster "c2", which is not one of"#));

        // A cluster index out of range (hand-made maps only) is reported whatever the amount.
        let mut m = Map::with_capacity(2, 3);
        m.push_unit(
            [
                Allocation {
                    cluster: cidx(&inst, "c1"),
                    amount: 26.0,
                },
                Allocation {
                    cluster: 99,
                    amount: 0.0,
                },
            ],
            0.0,
        );
        m.push_unit(
            [
                Allocation {
                    cluster: cidx(&inst, "c1"),
                    amount: 16.0,
                },
                Allocation {
                    cluster: c2,
                    amount: 4.0,
                },
            ],
            0.0,
        );
        let r = verify(&inst, &m);
        assert_eq!(r.violation_count(), 1, "{r:?}");
        assert_eq!(r.not_candidate[0].cluster, 99);
        assert!(r.describe(&inst, 10).contains("#99 (no such cluster)"));
    }

    #[test]
    fn allocation_at_a_drained_cluster() {
        let inst = worked(cluster("c2", "drained", 1000.0, 1000.0));
        let video = uidx(&inst, "video1");
        let c2 = cidx(&inst, "c2");
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", 4.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(
            r.unavailable,
            vec![Placement {
                map_unit: video,
                cluster: c2,
                amount: 4.0
            }]
        );
        // The 4 units belong at c3 (up, roomy), which video1 likes less than c2 but better than
        // a drained cluster; c1 is full with units it likes more.
        assert_eq!(pairs(&r), vec![(video, cidx(&inst, "c3"))]);
        assert!(r
            .describe(&inst, 10)
            .contains(r#"map unit "video1": 4 placed at cluster "c2", which is drained"#));

        // Overflowing instead of using the drained cluster: c2 never blocks, c3 does.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0)], 4.0),
            ],
        );
        let r = verify(&inst, &m);
        assert!(r.unavailable.is_empty());
        assert_eq!(pairs(&r), vec![(video, cidx(&inst, "c3"))]);

        // At c3, everything is fine.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c3", 4.0)], 0.0),
            ],
        );
        assert!(verify(&inst, &m).is_ok());
    }

    #[test]
    fn blocking_pair_due_to_overflow() {
        // c2 has room for only 2.5 units of video: its root A (Bps, 1 per video unit) is 2.5.
        let inst = worked(cluster("c2", "up", 2.5, 1000.0));
        let video = uidx(&inst, "video1");
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0)], 4.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(
            pairs(&r),
            vec![(video, cidx(&inst, "c2")), (video, cidx(&inst, "c3"))]
        );
        assert!(close(r.blocking_pairs[0].gain, 2.5), "{r:?}");
        assert!(close(r.blocking_pairs[1].gain, 4.0), "{r:?}");
        assert_eq!(r.violation_count(), 2);
        assert!(r
            .describe(&inst, 10)
            .contains(r#"blocking pair: map unit "video1" and cluster "c2""#));
        // 2.5 at c2 and 1.5 at c3 is stable.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", 2.5), ("c3", 1.5)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert!(r.is_ok(), "{}", r.describe(&inst, 10));
    }

    #[test]
    fn blocking_pair_due_to_a_worse_allocation() {
        let inst = worked(big_c2());
        let video = uidx(&inst, "video1");
        // 4 units at c3 while c2, which video1 likes more, has room.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c3", 4.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(pairs(&r), vec![(video, cidx(&inst, "c2"))]);
        assert!(close(r.blocking_pairs[0].gain, 4.0));
        assert_eq!(r.violation_count(), 1);
    }

    #[test]
    fn no_blocking_pair_when_the_room_is_held_by_better_liked_units() {
        let inst = worked(big_c2());
        // video1 overflows 4 and would rather be at c1, but c1's only binding node B is held by
        // apps1 (liked more) and video1 itself.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 26.0)], 0.0),
                ("video1", &[("c1", 16.0), ("c2", 4.0)], 0.0),
            ],
        );
        assert!(verify(&inst, &m).is_ok());
        // Same with two video units: the one c1 likes less cannot displace the one it likes more.
        let inst = instance(
            classes(0, 1),
            vec![cluster("c1", "up", 10.0, 1000.0)],
            vec![
                unit("va", "video", 10.0, &[("c1", 1.0)]),
                unit("vb", "video", 10.0, &[("c1", 2.0)]),
            ],
        );
        let m = map(&inst, &[("va", &[("c1", 10.0)], 0.0), ("vb", &[], 10.0)]);
        assert!(verify(&inst, &m).is_ok());
        // The other way round, vb holds what va (liked more) wants.
        let m = map(&inst, &[("va", &[], 10.0), ("vb", &[("c1", 10.0)], 0.0)]);
        let r = verify(&inst, &m);
        assert_eq!(pairs(&r), vec![(uidx(&inst, "va"), cidx(&inst, "c1"))]);
        assert!(close(r.blocking_pairs[0].gain, 10.0));
    }

    #[test]
    fn blocking_pair_when_the_room_is_held_by_a_lower_priority_class() {
        // apps preferred. 22 apps + 20 video at c1: B 27/30, A 25.5/26.5. apps1 overflows 4 and
        // could take video's place: at B, 3 free + 5 held by video → 8 apps units.
        let inst = worked(big_c2());
        let apps = uidx(&inst, "apps1");
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 22.0)], 4.0),
                ("video1", &[("c1", 20.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(pairs(&r), vec![(apps, cidx(&inst, "c1"))]);
        assert!(close(r.blocking_pairs[0].gain, 4.0));

        // With video preferred instead, only the free room counts: B has 3 free Fps (3 apps
        // units), A 1 free Bps (4 apps units), so the cluster can still take 3 of apps1.
        let inst = worked_with_classes(classes(1, 0));
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 22.0)], 4.0),
                ("video1", &[("c1", 20.0)], 0.0),
            ],
        );
        let r = verify(&inst, &m);
        assert_eq!(pairs(&r), vec![(apps, cidx(&inst, "c1"))]);
        assert!(close(r.blocking_pairs[0].gain, 3.0), "{r:?}");
        // Filled up (25 apps: B 30/30), that is stable even though apps1 overflows.
        let m = map(
            &inst,
            &[
                ("apps1", &[("c1", 25.0)], 1.0),
                ("video1", &[("c1", 20.0)], 0.0),
            ],
        );
        assert!(verify(&inst, &m).is_ok());
    }

    fn worked_with_classes(classes: Value) -> Instance {
        instance(
            classes,
            vec![
                cluster("c1", "up", 26.5, 30.0),
                big_c2(),
                cluster("c3", "up", 1000.0, 1000.0),
            ],
            vec![
                unit("apps1", "apps", 26.0, &[("c1", 1.0)]),
                unit(
                    "video1",
                    "video",
                    20.0,
                    &[("c1", 1.0), ("c2", 2.0), ("c3", 3.0)],
                ),
            ],
        )
    }

    /// One cluster with a single Bps node of capacity 10, two web units of demand 10.
    fn ranked(rank_a: Option<f64>, rank_b: Option<f64>) -> Instance {
        let cand = |score: f64, rank: Option<f64>| match rank {
            Some(r) => json!([{"cluster": "c1", "score": score, "cluster_rank": r}]),
            None => json!([{"cluster": "c1", "score": score}]),
        };
        build(&json!({
            "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1.0, "fps": 0.0}}],
            "clusters": [{"id": "c1", "lat": 0.0, "lon": 0.0, "resources":
                {"name": "R", "kind": "bps", "capacity": 10.0, "classes": ["web"]}}],
            "map_units": [
                {"id": "a", "class": "web", "demand": 10.0, "lat": 0.0, "lon": 0.0,
                 "candidates": cand(1.0, rank_a)},
                {"id": "b", "class": "web", "demand": 10.0, "lat": 0.0, "lon": 0.0,
                 "candidates": cand(5.0, rank_b)},
            ],
        }))
    }

    #[test]
    fn explicit_cluster_rank_decides_who_is_worse() {
        let a_holds = |inst: &Instance| map(inst, &[("a", &[("c1", 10.0)], 0.0), ("b", &[], 10.0)]);
        let b_holds = |inst: &Instance| map(inst, &[("a", &[], 10.0), ("b", &[("c1", 10.0)], 0.0)]);

        // Rank = score: the cluster likes a (score 1) more than b (score 5).
        let inst = ranked(None, None);
        assert!(verify(&inst, &a_holds(&inst)).is_ok());
        let r = verify(&inst, &b_holds(&inst));
        assert_eq!(pairs(&r), vec![(uidx(&inst, "a"), 0)]);

        // Explicit ranks reverse it.
        let inst = ranked(Some(9.0), Some(1.0));
        let r = verify(&inst, &a_holds(&inst));
        assert_eq!(pairs(&r), vec![(uidx(&inst, "b"), 0)]);
        assert!(close(r.blocking_pairs[0].gain, 10.0));
        assert!(verify(&inst, &b_holds(&inst)).is_ok());

        // Only one explicit: b's rank 0.5 beats a's score 1.
        let inst = ranked(None, Some(0.5));
        assert!(verify(&inst, &b_holds(&inst)).is_ok());
        assert!(!verify(&inst, &a_holds(&inst)).is_ok());

        // Equal ranks: the unit id breaks the tie ("a" < "b").
        let inst = ranked(Some(3.0), Some(3.0));
        assert!(verify(&inst, &a_holds(&inst)).is_ok());
        assert!(!verify(&inst, &b_holds(&inst)).is_ok());
    }

    #[test]
    fn map_with_the_wrong_number_of_units() {
        let inst = worked(big_c2());
        let mut m = Map::with_capacity(1, 1);
        m.push_unit(
            [Allocation {
                cluster: cidx(&inst, "c1"),
                amount: 26.0,
            }],
            0.0,
        );
        let r = verify(&inst, &m);
        assert_eq!(
            r.shape,
            Some(ShapeMismatch {
                instance_units: 2,
                map_units: 1
            })
        );
        // video1 is missing: its demand is lost, and it blocks with c1.
        assert_eq!(r.conservation.len(), 1);
        assert_eq!(r.conservation[0].map_unit, uidx(&inst, "video1"));
        let text = r.describe(&inst, 1);
        assert!(
            text.starts_with("the map has 1 map units, the instance 2"),
            "{text}"
        );
        assert!(text.contains("... and "), "{text}");
    }

    #[test]
    fn describe_is_bounded() {
        let inst = worked(big_c2());
        let m = map(&inst, &[("apps1", &[], 0.0), ("video1", &[], 0.0)]);
        let r = verify(&inst, &m);
        // 2 conservation violations, and every up candidate blocks.
        assert_eq!(r.conservation.len(), 2);
        assert_eq!(r.blocking_pairs.len(), 4);
        let text = r.describe(&inst, 3);
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(text.ends_with("... and 3 more"), "{text}");
    }

    // ---- cross-check against a brute-force reading of the definition ----

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A random instance: a few classes with different coefficients and priorities, clusters with
    /// the worked example's tree shape and small capacities, units with random candidates.
    fn random_instance(rng: &mut ChaCha8Rng, scale: f64) -> Instance {
        let classes = json!([
            {"name": "apps", "priority": rng.random_range(0..3), "per_unit": {"bps": 0.25, "fps": 1.0}},
            {"name": "video", "priority": rng.random_range(0..3), "per_unit": {"bps": 1.0, "fps": 0.25}},
            {"name": "web", "priority": rng.random_range(0..3), "per_unit": {"bps": 0.5, "fps": 0.0}},
        ]);
        let states = ["up", "up", "up", "drained"];
        let clusters: Vec<Value> = (0..5)
            .map(|i| {
                json!({
                    "id": format!("c{i}"), "lat": 0.0, "lon": 0.0,
                    "state": states[rng.random_range(0..states.len())],
                    "resources": {"name": "A", "kind": "bps", "capacity": rng.random_range(5.0..40.0) * scale, "children": [
                        {"name": "B", "kind": "fps", "capacity": rng.random_range(5.0..40.0) * scale, "children": [
                            {"name": "LV", "kind": "fps", "capacity": rng.random_range(5.0..40.0) * scale, "classes": ["video"]},
                            {"name": "LA", "kind": "fps", "capacity": rng.random_range(5.0..40.0) * scale, "classes": ["apps"]},
                        ]},
                        {"name": "LW", "kind": "bps", "capacity": rng.random_range(5.0..40.0) * scale, "classes": ["web"]},
                    ]},
                })
            })
            .collect();
        let class_names = ["apps", "video", "web"];
        let units: Vec<Value> = (0..25)
            .map(|i| {
                let mut cands: Vec<Value> = Vec::new();
                for c in 0..5 {
                    if rng.random_bool(0.6) {
                        // Few distinct scores, so ties (broken by id) happen.
                        let mut cand = json!({"cluster": format!("c{c}"),
                                              "score": f64::from(rng.random_range(0..4u8))});
                        if rng.random_bool(0.3) {
                            cand["cluster_rank"] = json!(f64::from(rng.random_range(0..4u8)));
                        }
                        cands.push(cand);
                    }
                }
                json!({"id": format!("u{:02}", (i * 7) % 25), "class": class_names[rng.random_range(0..3)],
                       "demand": f64::from(rng.random_range(0..8u8)),
                       "lat": 0.0, "lon": 0.0, "candidates": cands})
            })
            .collect();
        build(&json!({"traffic_classes": classes, "clusters": clusters, "map_units": units}))
    }

    /// A random map, filled greedily along each unit's candidates (so that it is feasible, often
    /// nearly full, and blocking pairs depend on the details). A sloppy one also goes through the
    /// candidates in reverse, takes less than fits, uses drained clusters and non-candidates, loses
    /// demand and splits allocations in two entries.
    fn random_map(inst: &Instance, rng: &mut ChaCha8Rng, sloppy: bool) -> Map {
        let mut m = Map::with_capacity(inst.unit_count(), inst.total_candidates());
        let mut free: Vec<f64> = (0..inst.clusters().len())
            .flat_map(|c| inst.clusters()[c].nodes.iter().map(|n| n.capacity))
            .collect();
        let mut order: Vec<UnitIdx> = (0..inst.unit_count() as UnitIdx).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let mut plan: Vec<(Vec<Allocation>, f64)> = vec![(Vec::new(), 0.0); inst.unit_count()];
        for &u in &order {
            let k = inst.unit_class(u);
            let pu = inst.classes()[usize::from(k)].per_unit;
            let mut left = inst.unit_demand(u);
            let mut cands: Vec<Candidate> = inst.candidates(u).collect();
            if sloppy && rng.random_bool(0.5) {
                cands.reverse();
            }
            for cand in cands {
                let cl = &inst.clusters()[cand.cluster as usize];
                let skip_down = cl.state != ClusterState::Up && !(sloppy && rng.random_bool(0.2));
                if left <= 0.0 || skip_down {
                    continue;
                }
                let mut fit = left;
                for n in cl.path(k) {
                    let q = pu.get(cl.nodes[n as usize].kind);
                    if q > 0.0 {
                        fit = fit.min(free[inst.global_node(cand.cluster, n)] / q);
                    }
                }
                if sloppy && rng.random_bool(0.2) {
                    fit *= 0.5;
                }
                if fit > 0.0 {
                    for n in cl.path(k) {
                        let q = pu.get(cl.nodes[n as usize].kind);
                        free[inst.global_node(cand.cluster, n)] -= fit * q;
                    }
                    plan[u as usize].0.push(Allocation {
                        cluster: cand.cluster,
                        amount: fit,
                    });
                    left -= fit;
                }
            }
            // Sometimes some demand goes to a cluster that is not a candidate (whose usage the
            // cluster would shed first).
            let c = rng.random_range(0..inst.clusters().len()) as ClusterIdx;
            let cl = &inst.clusters()[c as usize];
            let candidate = inst.candidates(u).any(|k| k.cluster == c);
            if left > 0.0 && !candidate && cl.serves(k) && sloppy && rng.random_bool(0.3) {
                let mut fit = left;
                for n in cl.path(k) {
                    let q = pu.get(cl.nodes[n as usize].kind);
                    if q > 0.0 {
                        fit = fit.min(free[inst.global_node(c, n)] / q);
                    }
                }
                if fit > 0.0 {
                    for n in cl.path(k) {
                        let q = pu.get(cl.nodes[n as usize].kind);
                        free[inst.global_node(c, n)] -= fit * q;
                    }
                    plan[u as usize].0.push(Allocation {
                        cluster: c,
                        amount: fit,
                    });
                    left -= fit;
                }
            }
            // Sometimes demand is lost rather than overflowed.
            plan[u as usize].1 = if sloppy && rng.random_bool(0.1) {
                0.0
            } else {
                left.max(0.0)
            };
        }
        for (mut allocs, overflow) in plan {
            // Sometimes an allocation is split in two entries for the same cluster.
            if let Some(&a) = allocs.first() {
                if sloppy && rng.random_bool(0.2) {
                    allocs[0].amount = a.amount * 0.25;
                    allocs.push(Allocation {
                        amount: a.amount * 0.75,
                        ..a
                    });
                }
            }
            m.push_unit(allocs, overflow);
        }
        m
    }

    /// Blocking pairs straight from the definition, in O(units² × candidates).
    fn brute_force_pairs(inst: &Instance, m: &Map, tol: &Tolerances) -> Vec<BlockingPair> {
        let clusters = inst.clusters();
        let n = inst.unit_count() as UnitIdx;
        let pu = |u: UnitIdx| inst.classes()[usize::from(inst.unit_class(u))].per_unit;
        let prio = |u: UnitIdx| inst.classes()[usize::from(inst.unit_class(u))].priority;
        let cand_of = |u: UnitIdx, c: ClusterIdx| inst.candidates(u).find(|k| k.cluster == c);
        let at = |u: UnitIdx, c: ClusterIdx| -> f64 {
            m.allocations(u)
                .iter()
                .filter(|a| a.cluster == c)
                .map(|a| a.amount)
                .sum()
        };
        // Usage of (cluster, node) by unit u.
        let usage = |u: UnitIdx, c: ClusterIdx, node: u32| -> f64 {
            let cl = &clusters[c as usize];
            if !cl.path(inst.unit_class(u)).any(|x| x == node) {
                return 0.0;
            }
            at(u, c).max(0.0) * pu(u).get(cl.nodes[node as usize].kind)
        };
        // Does c like u strictly less than m (m being a candidate of c)?
        let worse = |c: ClusterIdx, u: UnitIdx, m: UnitIdx| -> bool {
            let km = (prio(m), cand_of(m, c).unwrap().rank, inst.unit_id(m));
            match cand_of(u, c) {
                None => true,
                Some(k) => {
                    let ku = (prio(u), k.rank, inst.unit_id(u));
                    ku.0.cmp(&km.0)
                        .then(ku.1.total_cmp(&km.1))
                        .then(ku.2.cmp(km.2))
                        == Ordering::Greater
                }
            }
        };
        let mut out = Vec::new();
        for mu in 0..n {
            let tol_d = tol.demand(inst.unit_demand(mu));
            let cands: Vec<Candidate> = inst.candidates(mu).collect();
            for (j, cand) in cands.iter().enumerate() {
                let c = cand.cluster;
                if clusters[c as usize].state != ClusterState::Up {
                    continue;
                }
                // Everything not at an up candidate liked at least as much as c.
                let mut want = m.overflow(mu).max(0.0);
                let mut kept = 0.0;
                for cl in 0..clusters.len() as ClusterIdx {
                    let a = at(mu, cl).max(0.0);
                    let liked = cands[..=j].iter().any(|k| k.cluster == cl)
                        && clusters[cl as usize].state == ClusterState::Up;
                    if liked {
                        kept += a;
                    } else {
                        want += a;
                    }
                }
                want = want.max(inst.unit_demand(mu) - kept);
                if want <= tol_d {
                    continue;
                }
                let cl = &clusters[c as usize];
                let mut gain = want;
                for node in cl.path(inst.unit_class(mu)) {
                    let q = pu(mu).get(cl.nodes[node as usize].kind);
                    if q <= 0.0 {
                        continue;
                    }
                    let used: f64 = (0..n).map(|u| usage(u, c, node)).sum();
                    let held: f64 = (0..n)
                        .filter(|&u| u != mu && worse(c, u, mu))
                        .map(|u| usage(u, c, node))
                        .sum();
                    let cap = cl.nodes[node as usize].capacity;
                    gain = gain.min((cap - used + held - tol.room_slack(cap)) / q);
                }
                if gain > tol_d {
                    out.push(BlockingPair {
                        map_unit: mu,
                        cluster: c,
                        gain,
                    });
                }
            }
        }
        out
    }

    #[test]
    fn blocking_pairs_match_a_brute_force_check() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let tol = Tolerances::default();
        let mut found = 0;
        let mut stats = [0usize; 4];
        for _ in 0..300 {
            let scale = if rng.random_bool(0.3) { 20.0 } else { 1.0 };
            let inst = random_instance(&mut rng, scale);
            let sloppy = rng.random_bool(0.7);
            let m = random_map(&inst, &mut rng, sloppy);
            let r = verify_with(&inst, &m, &tol);
            let expected = brute_force_pairs(&inst, &m, &tol);
            assert_eq!(
                pairs(&r),
                expected
                    .iter()
                    .map(|b| (b.map_unit, b.cluster))
                    .collect::<Vec<_>>()
            );
            for (got, want) in r.blocking_pairs.iter().zip(&expected) {
                assert!((got.gain - want.gain).abs() < 1e-9, "{got:?} vs {want:?}");
            }
            found += expected.len();
            // The greedy fill never exceeds capacity.
            assert!(r.capacity.is_empty(), "{r:?}");
            stats[0] += r.conservation.len();
            stats[1] += r.not_candidate.len();
            stats[2] += r.unavailable.len();
            stats[3] += usize::from(r.blocking_pairs.is_empty());
        }
        // Every kind of irregularity, and stable maps too, occurred.
        assert!(found > 100, "{found}");
        assert!(stats.iter().all(|&n| n > 10), "{stats:?}");
    }

    /// A million map units verify in a few seconds (release build):
    /// `cargo test --release -p cdnmap-mapper --lib verify::tests::a_million_units -- --ignored --nocapture`
    #[test]
    #[ignore = "timing; run in release"]
    fn a_million_units() {
        use crate::model::{
            CandidateSpec, ClusterSpec, InstanceBuilder, MapUnitSpec, PerUnit, ResourceKind,
            ResourceNodeSpec, TrafficClass,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let class = |name: &str, priority: u32, bps: f64, fps: f64| TrafficClass {
            name: name.into(),
            priority,
            per_unit: PerUnit { bps, fps },
            companion_share: 0.0,
        };
        let classes = vec![
            class("apps", 0, 0.25, 1.0),
            class("video", 1, 1.0, 0.25),
            class("web", 2, 0.5, 0.5),
        ];
        let node =
            |name: &str, kind, capacity, classes: &[&str], children: &[&str]| ResourceNodeSpec {
                name: name.into(),
                kind,
                capacity,
                classes: classes.iter().map(|s| s.to_string()).collect(),
                children: children.iter().map(|s| s.to_string()).collect(),
            };
        let n_clusters = 1000;
        let clusters: Vec<ClusterSpec> = (0..n_clusters)
            .map(|i| ClusterSpec {
                id: format!("c{i:04}"),
                lat: 0.0,
                lon: 0.0,
                state: ClusterState::Up,
                serves: None,
                resources: vec![
                    node("A", ResourceKind::Bps, 400.0, &[], &["B"]),
                    node("B", ResourceKind::Fps, 400.0, &[], &["LA", "LV", "LW"]),
                    node("LA", ResourceKind::Fps, 500.0, &["apps"], &[]),
                    node("LV", ResourceKind::Fps, 500.0, &["video"], &[]),
                    node("LW", ResourceKind::Fps, 500.0, &["web"], &[]),
                ],
            })
            .collect();
        let mut b = InstanceBuilder::new(classes, clusters, Limits::default()).unwrap();
        let ids: Vec<String> = (0..n_clusters).map(|i| format!("c{i:04}")).collect();
        let names = ["apps", "video", "web"];
        let n_units = 1_000_000;
        b.reserve(n_units, n_units * 8);
        for u in 0..n_units {
            let first = rng.random_range(0..n_clusters);
            let cands: Vec<CandidateSpec> = (0..8)
                .map(|j| CandidateSpec {
                    cluster: &ids[(first + j * 37) % n_clusters],
                    score: rng.random_range(0.0..100.0),
                    cluster_rank: None,
                })
                .collect();
            b.push_unit(&MapUnitSpec {
                id: &format!("u{u:07}"),
                class: names[u % 3],
                demand: rng.random_range(0.0..2.0),
                lat: 0.0,
                lon: 0.0,
                candidates: &cands,
            })
            .unwrap();
        }
        let inst = b.finish().unwrap();
        let m = random_map(&inst, &mut rng, false);
        let t = std::time::Instant::now();
        let r = verify(&inst, &m);
        let elapsed = t.elapsed();
        eprintln!(
            "verified {} units, {} allocations in {elapsed:?}: {} violations ({} blocking pairs)",
            inst.unit_count(),
            (0..inst.unit_count() as UnitIdx)
                .map(|u| m.allocations(u).len())
                .sum::<usize>(),
            r.violation_count(),
            r.blocking_pairs.len()
        );
        assert!(r.capacity.is_empty() && r.conservation.is_empty());
        assert!(elapsed.as_secs_f64() < 10.0, "{elapsed:?}");
    }
}
