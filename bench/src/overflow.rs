//! `cdnmap bench overflow` (issue 20): how much demand the stable map leaves in overflow and
//! what latency it gives, against a latency-optimal fractional map over the same candidates —
//! a linear program solved in the same run (good_lp with Clarabel, an interior-point solver
//! in pure Rust) — on the project's generated world and on a world of the same shape built
//! here by an independent generator (clusters and clients scattered at random, not at real
//! cities; candidate lists by distance with noise; skewed capacities), which the project's
//! tuning has not seen.
//!
//! The LP: a variable per (unit, candidate) and one for the unit's overflow; each unit's
//! variables sum to its demand; on every resource node of every cluster, what the placed
//! demand costs (the class's coefficient for the node's kind) is at most the node's
//! capacity; down and drained clusters take nothing. It minimises the demand-weighted score
//! plus a penalty on overflow larger than any score, so it places as much demand as fits and,
//! among those maps, the one of least latency.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use cdnmap_mapper::{
    node_usage, second_chance, solve, verify, ClusterState, Instance, Map, SecondChance,
    SecondChanceParams, SolveOptions, UnitIdx,
};
use cdnmap_topology::Topology;
use clap::Args;
use good_lp::{
    constraint, default_solver, variable, Expression, ProblemVariables, Solution, SolverModel,
    Variable,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Args, Debug)]
pub struct OverflowBenchArgs {
    /// Map units of each world.
    #[arg(long, default_value_t = 20_000)]
    pub map_units: usize,
    /// Clusters of each world.
    #[arg(long, default_value_t = 120)]
    pub clusters: usize,
    /// Candidates per unit (at most).
    #[arg(long, default_value_t = 16)]
    pub candidates: usize,
    /// Seed of both worlds.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Leave the LP out (its figures then read 0): for a quick look at the phase alone.
    #[arg(long)]
    pub skip_lp: bool,
    #[command(flatten)]
    pub chance: SecondChanceArgs,
}

/// The second chance's bounds ([`SecondChanceParams`]), for the benchmarks that run it.
#[derive(Args, Debug, Clone)]
pub struct SecondChanceArgs {
    /// The second chance's bound on the RTT a move adds (ms).
    #[arg(long, default_value_t = SecondChanceParams::default().max_added_ms)]
    pub max_added_ms: f32,
    /// The second chance's moves per chain.
    #[arg(long, default_value_t = SecondChanceParams::default().max_hops)]
    pub max_hops: usize,
    /// The second chance's search states per placement (0: no chains, beyond the lists
    /// only).
    #[arg(long, default_value_t = SecondChanceParams::default().max_expansions)]
    pub max_expansions: usize,
    /// Beyond the lists: the most a cluster's estimated RTT may exceed the unit's best listed
    /// score (ms).
    #[arg(long, default_value_t = SecondChanceParams::default().max_beyond_ms)]
    pub max_beyond_ms: f32,
}

impl SecondChanceArgs {
    pub fn params(&self) -> SecondChanceParams {
        SecondChanceParams {
            max_added_ms: self.max_added_ms,
            max_hops: self.max_hops,
            max_expansions: self.max_expansions,
            max_beyond_ms: self.max_beyond_ms,
            ..SecondChanceParams::default()
        }
    }
}

/// A map's figures.
#[derive(Debug, Clone, Copy)]
struct Figures {
    /// Overflow / demand.
    unplaced: f64,
    /// Demand-weighted mean score of what is placed.
    mean_rtt: f64,
    /// Seconds to make the map.
    secs: f64,
    /// The most loaded node's load / capacity (an interior-point solution is feasible within
    /// its tolerance).
    worst_node: f64,
}

pub fn overflow(a: &OverflowBenchArgs) -> Result<std::process::ExitCode> {
    ensure!(
        (1..=200_000).contains(&a.map_units),
        "--map-units must be in 1..=200000 (the LP has a variable per candidate)"
    );
    ensure!(
        (1..=2_000).contains(&a.clusters),
        "--clusters must be in 1..=2000"
    );
    ensure!(
        (1..=64).contains(&a.candidates),
        "--candidates must be in 1..=64"
    );
    let generated = crate::progress::generate_world(&cdnmap_world::world::WorldParams {
        map_units: a.map_units,
        clusters: a.clusters,
        seed: a.seed,
        candidates: a.candidates,
        ..Default::default()
    })?;
    let unseen = unseen_world(a.map_units, a.clusters, a.candidates, a.seed)?;
    println!("| world | map | unplaced demand | mean RTT (ms, placed demand) | time |");
    println!("|---|---|---|---|---|");
    for (name, world) in [("generated", &generated), ("unseen", &unseen)] {
        let inst = &world.instance;
        let stable = stable_figures(inst);
        let lp = if a.skip_lp {
            Figures {
                unplaced: 0.0,
                mean_rtt: 0.0,
                secs: 0.0,
                worst_node: 0.0,
            }
        } else {
            lp_figures(inst).with_context(|| format!("the LP of the {name} world"))?
        };
        let row = |map: &str, f: &Figures| {
            println!(
                "| {name} | {map} | {:.3}% | {:.2} | {:.2} s |",
                100.0 * f.unplaced,
                f.mean_rtt,
                f.secs
            )
        };
        ensure!(
            stable.worst_node <= 1.0 + 1e-9,
            "the stable map of the {name} world loads a node to {} of its capacity",
            stable.worst_node
        );
        let params = a.chance.params();
        let (within, within_report) =
            second_chance_figures(inst, SecondChance::WithinLists, &params)?;
        let (beyond, beyond_report) =
            second_chance_figures(inst, SecondChance::BeyondLists, &params)?;
        row("stable (cdnmap)", &stable);
        row("stable + second chance within lists", &within);
        row("stable + second chance beyond lists", &beyond);
        row("LP (latency-optimal, fractional, over the lists)", &lp);
        for (map, f) in [
            ("stable", &stable),
            ("+ within lists", &within),
            ("+ beyond lists", &beyond),
        ] {
            println!(
                "| {name} | {map} − LP | {:+.3} points (target ≤ +0.1) | {:.3}× (target ≤ 1.02×) | |",
                100.0 * (f.unplaced - lp.unplaced),
                f.mean_rtt / lp.mean_rtt.max(f64::MIN_POSITIVE),
            );
        }
        println!("{name}, within lists: {within_report}");
        println!("{name}, beyond lists: {beyond_report}");
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The stable map with the second chance in `mode`: its figures (a placement beyond the
/// lists counted at its estimated RTT), and what the phase did and the blocking pairs it
/// introduced (the verifier's, told apart from any other).
fn second_chance_figures(
    inst: &Instance,
    mode: SecondChance,
    params: &SecondChanceParams,
) -> Result<(Figures, String)> {
    let t = Instant::now();
    let sol = solve(inst, &SolveOptions::default());
    let solve_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (map, report) = second_chance(inst, &sol.map, mode, params);
    let phase_secs = t.elapsed().as_secs_f64();
    let checked = verify(inst, &map);
    // Beyond the lists, the verifier's "not a candidate" placements are exactly the phase's.
    let mut beyond: Vec<(UnitIdx, u32)> =
        report.beyond.iter().map(|b| (b.unit, b.cluster)).collect();
    beyond.sort_unstable();
    beyond.dedup();
    let not_listed: Vec<(UnitIdx, u32)> = checked
        .not_candidate
        .iter()
        .map(|p| (p.map_unit, p.cluster))
        .collect();
    ensure!(
        checked.capacity.is_empty()
            && checked.conservation.is_empty()
            && checked.unavailable.is_empty()
            && not_listed == beyond,
        "the second chance's map is not feasible, or places beyond the lists what it does not \
         report: {}",
        checked.describe(inst, 3)
    );
    let (introduced, other) = report.split(&checked.blocking_pairs);
    let beyond_amount = report.placed_beyond();
    let said = format!(
        "placed {:.1} of overflow: {:.1} in {} chains after {} moves of {:.1} demand, {:.1} beyond the lists in {} placements; {:.1} ms ({:.1}% of the solve's {:.1} ms); blocking pairs {} introduced by it, {} other",
        report.placed,
        report.placed - beyond_amount,
        report.placements,
        report.moves,
        report.moved,
        beyond_amount,
        report.beyond.len(),
        phase_secs * 1e3,
        100.0 * phase_secs / solve_secs.max(1e-9),
        solve_secs * 1e3,
        introduced.len(),
        other.len()
    );
    // The mean RTT counts placements beyond the lists at the phase's estimate
    // (`mean_score`, through `second_chance::estimate_beyond`).
    let figures = figures_of(inst, &map, solve_secs + phase_secs);
    Ok((figures, said))
}

/// The stable map's figures (a cold solve, checked by the verifier).
fn stable_figures(inst: &Instance) -> Figures {
    let t = Instant::now();
    let sol = solve(inst, &SolveOptions::default());
    let secs = t.elapsed().as_secs_f64();
    let report = verify(inst, &sol.map);
    if !report.is_ok() {
        println!(
            "the stable map does not verify: {}",
            report.describe(inst, 3)
        );
    }
    figures_of(inst, &sol.map, secs)
}

fn figures_of(inst: &Instance, map: &Map, secs: f64) -> Figures {
    let demand = inst.total_demand();
    Figures {
        unplaced: map.total_overflow() / demand.max(f64::MIN_POSITIVE),
        mean_rtt: cdnmap_mapper::map::mean_score(inst, map, |_| Some(1.0)).unwrap_or(0.0),
        secs,
        worst_node: worst_node(inst, map),
    }
}

/// The most loaded node's load / capacity under `map`.
fn worst_node(inst: &Instance, map: &Map) -> f64 {
    let used = node_usage(inst, map);
    inst.clusters()
        .iter()
        .enumerate()
        .flat_map(|(c, cl)| {
            cl.nodes
                .iter()
                .enumerate()
                .map(move |(n, node)| (c, n, node.capacity))
        })
        .map(|(c, n, cap)| used[inst.global_node(c as u32, n as u32)] / cap.max(f64::MIN_POSITIVE))
        .fold(0.0f64, f64::max)
}

/// The LP's figures: see the module documentation.
fn lp_figures(inst: &Instance) -> Result<Figures> {
    let t = Instant::now();
    let classes = inst.classes();
    let clusters = inst.clusters();
    let max_score = (0..inst.unit_count() as UnitIdx)
        .flat_map(|u| inst.candidates(u).map(|c| f64::from(c.score)))
        .fold(1.0f64, f64::max);
    let penalty = 10.0 * max_score;
    let mut vars = ProblemVariables::new();
    // Per unit: its candidates' variables (cluster, score) and its overflow.
    let mut placed: Vec<Vec<(u32, f64, Variable)>> = Vec::with_capacity(inst.unit_count());
    let mut over: Vec<Variable> = Vec::with_capacity(inst.unit_count());
    // Per global node: the terms of what it carries.
    let mut load: Vec<Expression> = vec![Expression::from(0.0); inst.node_count()];
    let mut objective = Expression::from(0.0);
    for u in 0..inst.unit_count() as UnitIdx {
        let d = inst.unit_demand(u);
        let k = inst.unit_class(u);
        let per_unit = classes[usize::from(k)].per_unit;
        let mut mine = Vec::new();
        for c in inst.candidates(u) {
            let cl = &clusters[c.cluster as usize];
            if cl.state != ClusterState::Up || d <= 0.0 {
                continue;
            }
            let x = vars.add(variable().min(0.0).max(d));
            objective += f64::from(c.score) * x;
            for n in cl.path(k) {
                let coef = per_unit.get(cl.nodes[n as usize].kind);
                if coef > 0.0 {
                    load[inst.global_node(c.cluster, n)] += coef * x;
                }
            }
            mine.push((c.cluster, f64::from(c.score), x));
        }
        let o = vars.add(variable().min(0.0).max(d.max(0.0)));
        objective += penalty * o;
        placed.push(mine);
        over.push(o);
    }
    let mut model = vars.minimise(objective).using(default_solver);
    for (u, mine) in placed.iter().enumerate() {
        let sum: Expression = mine.iter().map(|&(_, _, x)| x).sum::<Expression>() + over[u];
        model = model.with(constraint!(sum == inst.unit_demand(u as UnitIdx).max(0.0)));
    }
    for (c, cl) in clusters.iter().enumerate() {
        for (n, node) in cl.nodes.iter().enumerate() {
            let g = inst.global_node(c as u32, n as u32);
            let carried = std::mem::replace(&mut load[g], Expression::from(0.0));
            model = model.with(constraint!(carried <= node.capacity));
        }
    }
    let solution = model.solve().map_err(|e| anyhow::anyhow!("{e}"))?;
    let secs = t.elapsed().as_secs_f64();
    let (mut sum, mut amount, mut overflow) = (0.0, 0.0, 0.0);
    for (u, mine) in placed.iter().enumerate() {
        for &(_, score, x) in mine {
            let v = solution.value(x).max(0.0);
            sum += score * v;
            amount += v;
        }
        overflow += solution.value(over[u]).max(0.0);
    }
    // An interior-point solution is feasible within its tolerance: say by how much.
    let mut lp_map = Map::with_capacity(inst.unit_count(), 0);
    for (u, mine) in placed.iter().enumerate() {
        lp_map.push_unit(
            mine.iter()
                .map(|&(cluster, _, x)| cdnmap_mapper::Allocation {
                    cluster,
                    amount: solution.value(x).max(0.0),
                }),
            solution.value(over[u]).max(0.0),
        );
    }
    let worst = worst_node(inst, &lp_map);
    println!(
        "LP: {} variables, worst node at {worst:.6} of its capacity, {secs:.1} s",
        placed.iter().map(Vec::len).sum::<usize>() + over.len()
    );
    Ok(Figures {
        unplaced: overflow / inst.total_demand().max(f64::MIN_POSITIVE),
        mean_rtt: if amount > 0.0 { sum / amount } else { 0.0 },
        secs,
        worst_node: worst,
    })
}

/// A world of the same shape as the generator's, built independently: clusters and clients
/// at random points of the sphere's populated band, three classes with different Bps/Fps
/// profiles and priorities, each unit's candidates its nearest clusters by distance with 20%
/// noise (up to `candidates`), scores the RTT of that distance; cluster capacities skewed
/// (log-normal) so that total capacity is about 1.1 times the demand it must carry.
fn unseen_world(units: usize, clusters: usize, candidates: usize, seed: u64) -> Result<Topology> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x005e_ed0f_0e4e_f10e);
    let sites: Vec<(f64, f64)> = (0..clusters).map(|_| point(&mut rng)).collect();
    let (unit_json, bps_total, fps_of) = unseen_units(&mut rng, units, &sites, candidates);
    let cluster_json = unseen_clusters(&mut rng, &sites, bps_total, fps_of);
    let class_json: Vec<String> = UNSEEN_CLASSES
        .iter()
        .map(|(name, priority, bps, fps, _)| {
            format!(r#"{{"name": "{name}", "priority": {priority}, "per_unit": {{"bps": {bps}, "fps": {fps}}}}}"#)
        })
        .collect();
    let json = format!(
        r#"{{"traffic_classes": [{}], "clusters": [{}], "map_units": [{}]}}"#,
        class_json.join(","),
        cluster_json.join(","),
        unit_json.join(",")
    );
    let world =
        cdnmap_topology::format::parse_instance(json.as_bytes(), cdnmap_mapper::Limits::default())
            .context("the unseen world")?;
    println!(
        "unseen world: {} map units, {} clusters, {:.1} candidates a unit",
        world.instance.unit_count(),
        clusters,
        world.instance.total_candidates() as f64 / units.max(1) as f64
    );
    Ok(world)
}

/// The unseen world's traffic classes: (name, priority, bps, fps, share of units).
const UNSEEN_CLASSES: [(&str, u32, f64, f64, f64); 3] = [
    ("web", 1, 1.0, 2.0, 0.5),
    ("video", 2, 6.0, 0.5, 0.3),
    ("apps", 0, 0.5, 4.0, 0.2),
];

/// A point of the unseen world: latitude in [-45, 60), longitude in [-180, 180).
fn point(rng: &mut ChaCha8Rng) -> (f64, f64) {
    (
        rng.random_range(-45.0..60.0f64),
        rng.random_range(-180.0..180.0f64),
    )
}

/// The RTT between two points: 5 ms plus 1 ms per 100 km of great circle.
fn rtt(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (la1, lo1, la2, lo2) = (
        a.0.to_radians(),
        a.1.to_radians(),
        b.0.to_radians(),
        b.1.to_radians(),
    );
    let h = ((la2 - la1) / 2.0).sin().powi(2)
        + la1.cos() * la2.cos() * ((lo2 - lo1) / 2.0).sin().powi(2);
    let km = 2.0 * 6371.0 * h.sqrt().asin();
    5.0 + km / 100.0
}

/// The unseen world's map units as JSON, each at a random point with a class and a demand
/// and its `candidates` nearest sites (RTTs with noise); and the demand's total bps and each
/// class's fps.
fn unseen_units(
    rng: &mut ChaCha8Rng,
    units: usize,
    sites: &[(f64, f64)],
    candidates: usize,
) -> (Vec<String>, f64, [f64; 3]) {
    let classes = UNSEEN_CLASSES;
    let mut unit_json = Vec::with_capacity(units);
    let (mut bps_total, mut fps_of) = (0.0, [0.0f64; 3]);
    for u in 0..units {
        let at = point(rng);
        let pick: f64 = rng.random();
        let k = if pick < classes[0].4 {
            0
        } else if pick < classes[0].4 + classes[1].4 {
            1
        } else {
            2
        };
        let demand: f64 = (rng.random_range(0.0..1.0f64).powi(3) * 50.0 + 1.0).round();
        bps_total += demand * classes[k].2;
        fps_of[k] += demand * classes[k].3;
        let mut near: Vec<(f64, usize)> = sites
            .iter()
            .enumerate()
            .map(|(c, &s)| (rtt(at, s) * rng.random_range(0.8..1.2), c))
            .collect();
        near.sort_by(|a, b| a.0.total_cmp(&b.0));
        let cands: Vec<String> = near
            .iter()
            .take(candidates)
            .map(|&(score, c)| format!(r#"{{"cluster": "c{c:04}", "score": {score:.3}}}"#))
            .collect();
        unit_json.push(format!(
            r#"{{"id": "u{u:06}", "class": "{}", "demand": {demand}, "lat": {:.4}, "lon": {:.4}, "candidates": [{}]}}"#,
            classes[k].0,
            at.0,
            at.1,
            cands.join(",")
        ));
    }
    (unit_json, bps_total, fps_of)
}

/// The unseen world's clusters as JSON: capacities, each cluster's share log-normal, the
/// totals 1.1 times the demand's cost.
fn unseen_clusters(
    rng: &mut ChaCha8Rng,
    sites: &[(f64, f64)],
    bps_total: f64,
    fps_of: [f64; 3],
) -> Vec<String> {
    let clusters = sites.len();
    let shares: Vec<f64> = (0..clusters)
        .map(|_| (rng.random_range(-1.0..1.0f64) * 0.8).exp())
        .collect();
    let total: f64 = shares.iter().sum();
    (0..clusters)
        .map(|c| {
            let s = shares[c] / total * 1.1;
            // Each class's leaf: its own Fps demand's share, a little looser than the root.
            let leaf = |name: &str, fps: f64| {
                format!(r#"{{"name": "{name}", "kind": "fps", "capacity": {:.3}, "classes": ["{name}"]}}"#, fps * s * 1.05)
            };
            format!(
                r#"{{"id": "c{c:04}", "lat": {:.4}, "lon": {:.4}, "resources": {{"name": "uplink", "kind": "bps", "capacity": {:.3}, "children": [{}, {}, {}]}}}}"#,
                sites[c].0,
                sites[c].1,
                bps_total * s,
                leaf("web", fps_of[0]),
                leaf("video", fps_of[1]),
                leaf("apps", fps_of[2]),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The LP against the stable map, its oracle both ways: the stable map is a feasible
    /// placement, so the LP places at least as much (a too tight LP fails); the LP's map keeps
    /// every node within its capacity (a too loose one fails).
    #[test]
    fn the_lp_places_at_least_the_stable_map_and_within_capacity() {
        for seed in [1, 2] {
            let world = unseen_world(1_500, 16, 4, seed).expect("a world");
            let inst = &world.instance;
            let stable = stable_figures(inst);
            assert!(stable.worst_node <= 1.0 + 1e-9, "{stable:?}");
            let lp = lp_figures(inst).expect("the LP");
            assert!(lp.unplaced <= stable.unplaced + 1e-6, "{lp:?} {stable:?}");
            assert!(lp.worst_node <= 1.0 + 1e-5, "{lp:?}");
            assert!(lp.mean_rtt > 0.0);
        }
    }
}
