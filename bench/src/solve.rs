//! `cdnmap bench solve` and `cdnmap bench resolve`: a cold (and a seeded) solve, and lookups
//! against a solved world's map, printing medians, ratios to a baseline measured in the same
//! run, memory, and the quality of the result (DESIGN.md: "benchmarks report quality as well as
//! speed"). Also [`BenchWorld`], the generated world the in-process benchmarks start from.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use cdnmap_mapper::ClassIdx;
use cdnmap_mapper::{
    churn, effective_preferences, favour_incumbents, solve as solve_instance, solve_seeded, Map,
    Rescore, Solution, SolveOptions, Stickiness, UnitIdx, DEFAULT_STICKINESS,
};
use cdnmap_serve::resolve::{ClassRules, Resolver};
use cdnmap_topology::Topology;
use clap::Args;

use crate::alloc;
use crate::progress::generate_world;
use crate::report::Summary;
use cdnmap_world::world::{perturb, WorldParams};

/// The second half of `bench solve --perturb`: cold and seeded solves of a jittered world.
fn sticky_round(
    a: &SolveBenchArgs,
    inst: &Topology,
    first: &Map,
    pct: f64,
    first_cold: Duration,
) -> Result<()> {
    let next = perturb(inst, pct, a.world.seed.wrapping_add(1))?;
    let options = SolveOptions::default();
    let (cold, _, cold_sol) = time_runs(a.runs, || solve_instance(black_box(&next), &options));
    let stickiness = Stickiness::margin(a.stickiness);
    let (prefs, _, effective) = time_runs(a.runs, || {
        favour_incumbents(black_box(&next), first, &stickiness)
    });
    let effective = effective?;
    let (warm_solve, _, warm_sol) = time_runs(a.runs, || {
        solve_seeded(black_box(&effective), first, &options)
    });
    // The warm figure is everything a round does from (instance, previous map) to the new map
    // (engine/src/round.rs): the effective preferences plus the seeded solve, each a median.
    let warm = prefs + warm_solve;
    // The independent verifier, against the preferences the warm solve used (not timed).
    let report = cdnmap_mapper::verify::verify(&effective, &warm_sol.map);
    if !report.is_ok() {
        eprintln!("{}", report.describe(&effective, 10));
    }
    let demand = next.total_demand();
    let cold_churn = churn(&next, first, &cold_sol.map);
    let warm_churn = churn(&next, first, &warm_sol.map);
    println!();
    println!(
        "sticky round   the same world, every demand and score x [1 - {pct}%, 1 + {pct}%], seed {}",
        a.world.seed.wrapping_add(1)
    );
    println!(
        "cold solve     median {:>9.1} ms   churn {:.3}%   overflow {:.2}%",
        ms(cold),
        100.0 * cold_churn,
        100.0 * cold_sol.map.total_overflow() / demand
    );
    println!(
        "warm solve     median {:>9.1} ms   churn {:.3}%   overflow {:.2}%   (stickiness {}, seeded from the first map)",
        ms(warm),
        100.0 * warm_churn,
        100.0 * warm_sol.map.total_overflow() / demand,
        a.stickiness
    );
    println!(
        "               = effective preferences {:.1} ms (two threads) + seeded solve {:.1} ms (proposals on one thread; seeding, scan and map read-out on two); proposals {}   evictions {}   repair rounds {}   blocking pairs {}",
        ms(prefs),
        ms(warm_solve),
        warm_sol.stats.proposals,
        warm_sol.stats.evictions,
        warm_sol.stats.repair_rounds,
        warm_sol.stats.blocking_pairs_left
    );
    println!(
        "verifier       {:>12}   violations (warm map, effective preferences)",
        report.violation_count()
    );
    // The ratio is against the cold solve of the same (perturbed) world, the solve the warm
    // one stands in for; against the first world's, a different instance, for reference.
    let ratio = |base: Duration| 100.0 * warm.as_secs_f64() / base.as_secs_f64().max(1e-9);
    println!(
        "warm / cold    {:>15.1}%   (cold solve of this world {:.1} ms; {:.1}% of the first world's, {:.1} ms)",
        ratio(cold),
        ms(cold),
        ratio(first_cold),
        ms(first_cold)
    );
    if let Some(pct) = a.measured {
        measured_round(a, &next, first, pct, prefs, warm_solve)?;
    }
    if let Some(mode) = a.second_chance {
        second_chance_round(a, mode, inst, first, &next, cold)?;
    }
    Ok(())
}

/// `bench solve --perturb P --second-chance`: the second chance for overflow (issue 20) on
/// the first map, timed against the cold solve, then a sticky round seeded from its map with
/// the phase again, its churn against the phase's map.
fn second_chance_round(
    a: &SolveBenchArgs,
    mode: cdnmap_mapper::SecondChance,
    inst: &Topology,
    first: &Map,
    next: &Topology,
    cold: Duration,
) -> Result<()> {
    use cdnmap_mapper::{second_chance, second_chance_seeded};
    let params = a.chance.params();
    let demand = inst.total_demand();
    let (phase, _, (placed, report)) = time_runs(a.runs, || {
        second_chance(black_box(inst), first, mode, &params)
    });
    let checked = cdnmap_mapper::verify::verify(inst, &placed);
    let (introduced, other) = report.split(&checked.blocking_pairs);
    println!(
        "second chance  {mode:?}: median {:.1} ms ({:.1}% of the cold solve's {:.1} ms): overflow {:.3}% -> {:.3}%, {} moves, {} placements beyond the lists ({:.3}% of the demand), blocking pairs {} its own, {} other, feasible: {}",
        ms(phase),
        100.0 * phase.as_secs_f64() / cold.as_secs_f64().max(1e-9),
        ms(cold),
        100.0 * first.total_overflow() / demand,
        100.0 * placed.total_overflow() / demand,
        report.moves,
        report.beyond.len(),
        100.0 * report.placed_beyond() / demand,
        introduced.len(),
        other.len(),
        checked.capacity.is_empty() && checked.conservation.is_empty()
    );
    // The next round: seeded from the phase's map, the phase again.
    let stickiness = Stickiness::margin(a.stickiness);
    let effective = favour_incumbents(next, &placed, &stickiness)?;
    let warm = solve_seeded(&effective, &placed, &SolveOptions::default());
    let (again, _) = second_chance_seeded(next, &warm.map, Some(&placed), mode, &params);
    println!(
        "               the sticky round after it (seeded from its map, the phase again): churn {:.3}% (the seeded solve alone {:.3}%), overflow {:.3}%, repair rounds {}, blocking pairs left {}",
        100.0 * churn(next, &placed, &again),
        100.0 * churn(next, &placed, &warm.map),
        100.0 * again.total_overflow() / next.total_demand(),
        warm.stats.repair_rounds,
        warm.stats.blocking_pairs_left
    );
    // A failed cluster: the one carrying the most of the phase's map goes down. Measured in a
    // round of its own (the first world again, no noise), so that what moves is what the
    // failure moves; and in the noisy round, beside that round's churn without the failure.
    let mut load = vec![0.0f64; next.clusters().len()];
    for u in 0..placed.unit_count() as UnitIdx {
        for al in placed.allocations(u) {
            load[al.cluster as usize] += al.amount;
        }
    }
    let Some((failed, carried)) = load
        .iter()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .map(|(c, &l)| (c as cdnmap_mapper::ClusterIdx, l))
    else {
        return Ok(());
    };
    // (moved with the phase, moved by the seeded solve alone), each over the failed demand.
    let fail_in = |world: &Topology| -> Result<(f64, f64)> {
        let down = world.with_cluster_state(failed, cdnmap_mapper::ClusterState::Down);
        let effective = favour_incumbents(&down, &placed, &stickiness)?;
        let warm = solve_seeded(&effective, &placed, &SolveOptions::default());
        let (after, _) = second_chance_seeded(&down, &warm.map, Some(&placed), mode, &params);
        let moved = |m: &Map| churn(&down, &placed, m) * down.total_demand() / carried.max(1e-9);
        Ok((moved(&after), moved(&warm.map)))
    };
    let (alone, alone_seeded) = fail_in(inst)?;
    let (noisy, noisy_seeded) = fail_in(next)?;
    let noise = |m: &Map| churn(next, &placed, m) * next.total_demand() / carried.max(1e-9);
    println!(
        "               a failed cluster ({}, carrying {:.1}% of the demand), a round of its own: {:.3}x its demand moved (the seeded solve alone {:.3}x); in the noisy round: {:.3}x ({:.3}x), of which that round without the failure moves {:.3}x ({:.3}x)",
        next.clusters()[failed as usize].id,
        100.0 * carried / next.total_demand(),
        alone,
        alone_seeded,
        noisy,
        noisy_seeded,
        noise(&again),
        noise(&warm.map),
    );
    Ok(())
}

/// `bench solve --perturb P --measured PCT`: the sticky round again with the RTTs of PCT% of
/// the units measured (each candidate's score times a factor in [0.5, 1.5], so most of those
/// units' candidates are reordered): what measured scores cost a round (issue 19, point 3).
fn measured_round(
    a: &SolveBenchArgs,
    next: &Topology,
    first: &Map,
    pct: f64,
    prefs_before: Duration,
    solve_before: Duration,
) -> Result<()> {
    ensure!(
        (0.0..=100.0).contains(&pct),
        "--measured must be a percentage in [0, 100]"
    );
    let (units, measurements) = draw_measurements(next, a.world.seed, pct);
    rtt_table(a, next, &measurements)?;
    let t = Instant::now();
    let rescore = Rescore::new(next, measurements)?;
    let build = t.elapsed();
    let stickiness = Stickiness::margin(a.stickiness);
    let options = SolveOptions::default();
    let (prefs, _, effective) = time_runs(a.runs, || {
        effective_preferences(black_box(next), Some(first), &stickiness, &rescore)
    });
    let effective = effective?;
    let (warm_solve, _, warm_sol) = time_runs(a.runs, || {
        solve_seeded(black_box(&effective), first, &options)
    });
    let report = cdnmap_mapper::verify::verify(&effective, &warm_sol.map);
    if !report.is_ok() {
        eprintln!("{}", report.describe(&effective, 10));
    }
    println!(
        "measured RTTs  {units} units ({pct}%), {} (unit, cluster) pairs: Rescore built in {:.1} ms; effective preferences {:.1} ms (without: {:.1}), seeded solve {:.1} ms (without: {:.1}); churn {:.3}%; repair rounds {}, blocking pairs left {}; verified: {}",
        rescore.len(),
        ms(build),
        ms(prefs),
        ms(prefs_before),
        ms(warm_solve),
        ms(solve_before),
        100.0 * churn(next, first, &warm_sol.map),
        warm_sol.stats.repair_rounds,
        warm_sol.stats.blocking_pairs_left,
        report.is_ok()
    );
    // What a round takes of them: at most `max_reordered_units` units reordered.
    let bound = cdnmap_estimator::rtt::RttConfig::default().max_reordered_units;
    let (taken, held) = cdnmap_mapper::admitted(next, &rescore, &Rescore::default(), bound);
    let (bounded_prefs, _, bounded) = time_runs(a.runs, || {
        effective_preferences(black_box(next), Some(first), &stickiness, &taken)
    });
    let bounded = bounded?;
    let (bounded_solve, _, bounded_sol) = time_runs(a.runs, || {
        solve_seeded(black_box(&bounded), first, &options)
    });
    let bounded_ok = cdnmap_mapper::verify::verify(&bounded, &bounded_sol.map).is_ok();
    println!(
        "               a round's share (at most {bound} units reordered, {held} held back): effective preferences {:.1} ms, seeded solve {:.1} ms; churn {:.3}%; repair rounds {}, blocking pairs left {}; verified: {bounded_ok}",
        ms(bounded_prefs),
        ms(bounded_solve),
        100.0 * churn(next, first, &bounded_sol.map),
        bounded_sol.stats.repair_rounds,
        bounded_sol.stats.blocking_pairs_left,
    );
    Ok(())
}

/// Measured RTTs for about `pct`% of `next`'s units (each of their candidates' scores times
/// 0.5 to 1.5), drawn from the world's seed: the units drawn and the (unit, cluster, RTT)s.
fn draw_measurements(
    next: &Topology,
    seed: u64,
    pct: f64,
) -> (usize, Vec<(UnitIdx, cdnmap_mapper::ClusterIdx, f32)>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_add(2));
    let mut measurements = Vec::new();
    let mut units = 0usize;
    for u in 0..next.unit_count() as UnitIdx {
        if rng.random_range(0.0..100.0) >= pct {
            continue;
        }
        units += 1;
        for c in next.candidates(u) {
            let score = (c.score * rng.random_range(0.5f32..1.5)).clamp(0.01, 60_000.0);
            measurements.push((u, c.cluster, score));
        }
    }
    (units, measurements)
}

/// The service's side: the same measurements as reports in an RTT table (by ids), and what a
/// round reads of it (every pair's estimate, mapped to indices), timed.
fn rtt_table(
    a: &SolveBenchArgs,
    next: &Topology,
    measurements: &[(UnitIdx, cdnmap_mapper::ClusterIdx, f32)],
) -> Result<()> {
    let mut table = cdnmap_estimator::rtt::RttTable::new(cdnmap_estimator::rtt::RttConfig {
        max_pairs: measurements.len(),
        min_samples: 1,
        ..Default::default()
    });
    let t = Instant::now();
    for &(u, c, score) in measurements {
        table.record(
            next.unit_id(u),
            &next.clusters()[c as usize].id,
            f64::from(score),
            10,
            0,
        )?;
    }
    let fed = t.elapsed();
    let (read, _, read_back) = time_runs(a.runs, || {
        let mut out = Vec::with_capacity(measurements.len());
        table.for_each_estimate(0, |unit, cluster, e| {
            if let (Some(u), Some(c)) = (next.unit_index(unit), next.cluster_index(cluster)) {
                out.push((u, c, e.rtt_ms));
            }
        });
        out
    });
    ensure!(
        read_back.len() == measurements.len(),
        "the RTT table lost pairs"
    );
    println!(
        "RTT table      {} pairs fed in {:.1} ms; a round's read of every estimate, by index, {:.1} ms",
        table.pairs(),
        ms(fed),
        ms(read)
    );
    Ok(())
}

/// The world a benchmark generates in-process.
#[derive(Args, Debug)]
pub struct BenchWorld {
    /// Number of map units in the generated world.
    #[arg(long, default_value_t = 1_000_000)]
    pub map_units: usize,
    /// Number of clusters.
    #[arg(long, default_value_t = 1_000)]
    pub clusters: usize,
    /// Candidates per map unit (at most).
    #[arg(long, default_value_t = 16)]
    pub candidates: usize,
    /// World seed (a benchmark's other random draws derive from it).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Total capacity over total demand.
    #[arg(long, default_value_t = 1.1)]
    pub headroom: f64,
}

impl BenchWorld {
    /// Generates the world and prints its line.
    pub fn generate(&self) -> Result<Topology> {
        let params = WorldParams {
            map_units: self.map_units,
            clusters: self.clusters,
            seed: self.seed,
            candidates: self.candidates,
            headroom: self.headroom,
            ..WorldParams::default()
        };
        let t = Instant::now();
        let inst = generate_world(&params)?;
        let units = inst.unit_count();
        println!(
            "world          {} map units, {} clusters, {:.1} candidates/unit, seed {} (generated in {:.1} s)",
            units,
            inst.clusters().len(),
            inst.total_candidates() as f64 / units.max(1) as f64,
            self.seed,
            t.elapsed().as_secs_f64()
        );
        Ok(inst)
    }
}

#[derive(Args, Debug)]
pub struct SolveBenchArgs {
    #[command(flatten)]
    pub world: BenchWorld,
    /// Timed repetitions; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Also time a sticky round: the same world with every demand and score jittered by up to
    /// PCT percent, solved cold and seeded from the first map.
    #[arg(long, value_name = "PCT")]
    pub perturb: Option<f64>,
    /// Stickiness margin of the seeded round.
    #[arg(long, default_value_t = DEFAULT_STICKINESS)]
    pub stickiness: f64,
    /// With --perturb: the sticky round again with the RTTs of PCT percent of the units
    /// measured (their candidates rescored and reordered), to show what that costs a round.
    #[arg(long, value_name = "PCT")]
    pub measured: Option<f64>,
    /// With --perturb: the second chance for overflow on the first map (timed against the
    /// cold solve) and in the sticky round after it (its churn): within-lists (the default
    /// when MODE is left out) or beyond-lists.
    #[arg(long, value_name = "MODE", num_args = 0..=1, default_missing_value = "within-lists")]
    pub second_chance: Option<cdnmap_mapper::SecondChance>,
    #[command(flatten)]
    pub chance: crate::overflow::SecondChanceArgs,
}

/// Every timed solve is first run once untimed. A mapping process is long-lived and keeps
/// freed memory between rounds ([`crate::alloc::KEEP_FREED_MS`]); a process's first solve
/// instead faults every page in fresh, which cost it about 4.5x (1 M map units: 295 ms for a
/// seeded solve that takes 65 ms in later runs), and with 5 runs the median still caught the
/// tail of that. The warm-up applies alike to cold and warm solves.
const WARM_UP: usize = 1;

/// Runs `f` once untimed (see [`WARM_UP`]), then `runs` times; returns the median time, the
/// sorted times, and the last result.
fn time_runs<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, Vec<Duration>, T) {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..WARM_UP {
        drop(black_box(f()));
    }
    let mut last = None;
    for _ in 0..runs.max(1) {
        drop(last.take());
        let t = Instant::now();
        let out = f();
        times.push(t.elapsed());
        last = Some(out);
    }
    let m = median(&mut times);
    match last {
        Some(out) => (m, times, out),
        None => unreachable!("at least one run"),
    }
}

/// The median of `samples` (sorted in place).
pub fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The baseline: one pass that sums every map unit's demand into its first candidate.
pub fn trivial_pass(inst: &Topology) -> Vec<f64> {
    let mut per_cluster = vec![0.0; inst.clusters().len()];
    for u in 0..inst.unit_count() as UnitIdx {
        if let Some(c) = inst.candidates(u).next() {
            per_cluster[c.cluster as usize] += inst.unit_demand(u);
        }
    }
    per_cluster
}

pub fn solve(a: &SolveBenchArgs) -> Result<ExitCode> {
    ensure!(a.runs >= 1, "--runs must be at least 1");
    let inst = a.world.generate()?;
    let units = inst.unit_count() as f64;

    let mut trivial: Vec<Duration> = (0..a.runs)
        .map(|_| {
            let t = Instant::now();
            black_box(trivial_pass(black_box(&inst)));
            t.elapsed()
        })
        .collect();
    let trivial = median(&mut trivial);

    let options = SolveOptions::default();
    let live_before = alloc::live_bytes();
    let mut times = Vec::with_capacity(a.runs);
    let mut peak_extra = 0usize;
    let mut last = None;
    for _ in 0..WARM_UP {
        drop(black_box(solve_instance(black_box(&inst), &options)));
    }
    for _ in 0..a.runs {
        drop(last.take());
        alloc::reset_peak();
        let base = alloc::live_bytes();
        let t = Instant::now();
        let sol = solve_instance(black_box(&inst), &options);
        times.push(t.elapsed());
        peak_extra = peak_extra.max(alloc::peak_bytes().saturating_sub(base));
        last = Some(sol);
    }
    let solve_median = median(&mut times);
    let Some(sol) = last else {
        unreachable!("runs >= 1 was checked above")
    };
    let mut summary = Summary::new(&inst, &sol.map, &sol.stats, solve_median);
    // The independent verifier on the last map (not timed).
    let report = cdnmap_mapper::verify::verify(&inst, &sol.map);
    summary.verifier_violations = Some(report.violation_count());
    if !report.is_ok() {
        eprintln!("{}", report.describe(&inst, 10));
    }

    println!(
        "trivial pass   median {:>9.1} ms   (sum each unit's demand into its first candidate)",
        ms(trivial)
    );
    println!(
        "cold solve     median {:>9.1} ms   min {:.1} max {:.1} over {} runs after {WARM_UP} warm-up, one thread",
        ms(solve_median),
        ms(times[0]),
        ms(times[times.len() - 1]),
        a.runs
    );
    println!(
        "ratio          {:>16.1}x   solve / trivial pass",
        solve_median.as_secs_f64() / trivial.as_secs_f64().max(1e-9)
    );
    println!("{summary}");
    let memory = (live_before, peak_extra);
    if let Some(pct) = a.perturb {
        sticky_round(a, &inst, &sol.map, pct, solve_median)?;
    }
    let (live_before, peak_extra) = memory;
    if alloc::installed() {
        let instance_b = live_before as f64 / units;
        let solver_b = peak_extra as f64 / units;
        println!(
            "memory         instance {:.0} B/unit + solve peak {:.0} B/unit = {:.0} B/unit ({:.2} GB at peak)",
            instance_b,
            solver_b,
            instance_b + solver_b,
            (live_before + peak_extra) as f64 / 1e9
        );
    } else {
        println!(
            "memory         (counting allocator not installed: run through the cdnmap binary)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// bench resolve

/// Hostname rules of the resolve benchmark: the world's classes (`world::traffic_classes`).
const RESOLVE_RULES: [(&str, &str); 5] = [
    ("*.video.cdn.example", "video"),
    ("live.cdn.example", "video"),
    ("*.apps.cdn.example", "apps"),
    ("static.cdn.example", "web"),
    ("*.web.cdn.example", "web"),
];
const RESOLVE_DEFAULT_CLASS: &str = "web";
/// Salt of the query generator's seed (so queries do not replay the world's random stream).
const QUERY_SALT: u64 = 0x0DE5_0B5E_ED00_0004;

#[derive(Args, Debug)]
pub struct ResolveBenchArgs {
    #[command(flatten)]
    pub world: BenchWorld,
    /// Number of pre-generated queries; each timed run resolves all of them.
    #[arg(long, default_value_t = 1_000_000)]
    pub queries: usize,
    /// Share of queries from clients outside every prefix.
    #[arg(long, default_value_t = 0.05)]
    pub outside: f64,
    /// Timed repetitions; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// gRPC Resolve calls against the service and against the echo baseline (0: skip gRPC).
    #[arg(long, default_value_t = 50_000)]
    pub grpc_calls: usize,
    /// Queries per ResolveBatch call.
    #[arg(long, default_value_t = 100)]
    pub grpc_batch: usize,
    /// gRPC calls in flight.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
}

/// A pre-generated query: the client (an ECS subnet or a resolver's host address) and the qname
/// as a slice of one shared buffer (like a name in a packet buffer).
struct Query {
    client: ipnet::IpNet,
    name_start: u32,
    name_len: u16,
}

struct QuerySet {
    queries: Vec<Query>,
    names: String,
    /// Queries whose client was drawn from outside every prefix.
    outside: usize,
    /// Queries with an ECS subnet (the rest carry a host address).
    ecs: usize,
}

impl QuerySet {
    fn name(&self, q: &Query) -> &str {
        let a = q.name_start as usize;
        &self.names[a..a + usize::from(q.name_len)]
    }
}

/// The query set: clients drawn from uniformly random map units' prefixes (80% as an ECS
/// subnet, /24 or /56, the rest as a host address) or, with probability `outside`, from
/// 198.18.0.0/15 and 2001:db8::/32 (which the world generator never allocates); hostnames by
/// the classes' demand shares (web 50%, video 35%, apps 15%) over a few hundred thousand
/// names, one in ten with DNS 0x20 random case, all with the trailing dot.
fn query_set(inst: &Topology, count: usize, outside: f64, seed: u64) -> Result<QuerySet> {
    use ipnet::IpNet;
    use rand::{Rng, SeedableRng};
    use std::fmt::Write as _;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    ensure!(inst.unit_count() > 0, "the world has no map units");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ QUERY_SALT);
    let mut queries = Vec::with_capacity(count);
    let mut names = String::with_capacity(count * 28);
    let (mut n_outside, mut ecs) = (0, 0);
    for _ in 0..count {
        let host: IpAddr = if rng.random_bool(outside) {
            n_outside += 1;
            if rng.random_bool(0.9) {
                IpAddr::V4(Ipv4Addr::from(
                    0xC612_0000 | (rng.random::<u32>() & 0x1_ffff),
                ))
            } else {
                let low = rng.random::<u128>() >> 32;
                IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | low))
            }
        } else {
            let u = rng.random_range(0..inst.unit_count()) as UnitIdx;
            let prefixes = inst.unit_prefixes(u);
            ensure!(
                !prefixes.is_empty(),
                "map unit {} has no prefix",
                inst.unit_id(u)
            );
            let p = prefixes[rng.random_range(0..prefixes.len())];
            match p {
                IpNet::V4(n) => {
                    let host = (1u64 << (32 - u32::from(n.prefix_len()))) - 1;
                    let a = u32::from(n.network()) | (rng.random::<u32>() & host as u32);
                    IpAddr::V4(Ipv4Addr::from(a))
                }
                IpNet::V6(n) => {
                    let len = u32::from(n.prefix_len());
                    let host = if len == 0 {
                        u128::MAX
                    } else {
                        u128::MAX >> len
                    };
                    let a = u128::from(n.network()) | (rng.random::<u128>() & host);
                    IpAddr::V6(Ipv6Addr::from(a))
                }
            }
        };
        let client = if rng.random_bool(0.8) {
            ecs += 1;
            let len = if host.is_ipv4() { 24 } else { 56 };
            IpNet::new(host, len)?.trunc()
        } else {
            IpNet::from(host)
        };
        let start = names.len();
        let x = rng.random::<f64>();
        let n = rng.random_range(0..100_000u32);
        if x < 0.35 {
            write!(names, "v{n}.video.cdn.example.")?;
        } else if x < 0.50 {
            write!(names, "api{}.apps.cdn.example.", n % 20_000)?;
        } else if x < 0.51 {
            names.push_str("live.cdn.example.");
        } else {
            // Named by a rule (a name no rule names is NXDOMAIN over gRPC, not an answer).
            write!(names, "site{n}.web.cdn.example.")?;
        }
        if rng.random_bool(0.1) {
            // DNS 0x20: resolvers randomise the case of every letter.
            let tail: String = names[start..]
                .chars()
                .map(|c| {
                    if rng.random_bool(0.5) {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            names.truncate(start);
            names.push_str(&tail);
        }
        queries.push(Query {
            client,
            name_start: u32::try_from(start)?,
            name_len: u16::try_from(names.len() - start)?,
        });
    }
    Ok(QuerySet {
        queries,
        names,
        outside: n_outside,
        ecs,
    })
}

/// Times `f` over `runs` runs; returns the median and the sorted times.
fn time_each(runs: usize, mut f: impl FnMut() -> u64) -> (Duration, Vec<Duration>) {
    let mut times: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            black_box(f());
            t.elapsed()
        })
        .collect();
    let m = median(&mut times);
    (m, times)
}

/// The cold solve the resolver is built from; prints its time, overflow and split units.
fn resolve_cold_solve(inst: &Topology) -> Solution {
    let units = inst.unit_count();
    let t = Instant::now();
    let sol = solve_instance(inst, &SolveOptions::default());
    let split = (0..units as UnitIdx)
        .filter(|&u| {
            sol.map
                .allocations(u)
                .iter()
                .filter(|x| x.amount > 0.0)
                .count()
                > 1
        })
        .count();
    println!(
        "cold solve     {:.1} ms   overflow {:.2}%   split units {:.2}%",
        ms(t.elapsed()),
        100.0 * sol.map.total_overflow() / inst.total_demand().max(f64::MIN_POSITIVE),
        100.0 * split as f64 / units.max(1) as f64
    );
    sol
}

/// The resolver of `sol` (dropped once built); prints its build time and memory.
fn resolve_build(inst: &Topology, sol: Solution) -> Result<Resolver> {
    let units = inst.unit_count();
    let rules: Vec<(String, String)> = RESOLVE_RULES
        .iter()
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect();
    let rules = ClassRules::for_instance(inst, &rules, RESOLVE_DEFAULT_CLASS)?;
    let live = alloc::live_bytes();
    let t = Instant::now();
    let resolver = Resolver::of_solution(inst, &sol.map, rules)?;
    let built = t.elapsed();
    let resolver_bytes = alloc::live_bytes().saturating_sub(live);
    drop(sol);
    let memory = if alloc::installed() {
        format!(
            "{:.1} MB ({:.0} B/unit)",
            resolver_bytes as f64 / 1e6,
            resolver_bytes as f64 / units.max(1) as f64
        )
    } else {
        "memory not counted (run through the cdnmap binary)".into()
    };
    println!(
        "resolver       built in {:.1} ms, {memory} on top of the instance",
        ms(built)
    );
    Ok(resolver)
}

/// One untimed pass over the queries for the answer mix; prints the queries (generated since
/// `t`) and where their answers come from.
fn resolve_mix(inst: &Topology, resolver: &Resolver, qs: &QuerySet, t: Instant) {
    let n = qs.queries.len();
    let (mut from_unit, mut no_unit_inside, mut per_class) = (0usize, 0usize, vec![0usize; 3]);
    for q in &qs.queries {
        let ans = resolver.resolve(q.client, qs.name(q));
        if ans.unit.is_some() {
            from_unit += 1;
        } else if (0..inst.classes().len()).any(|k| {
            resolver
                .unit_for(q.client.network(), k as ClassIdx)
                .is_some()
        }) {
            no_unit_inside += 1;
        }
        if let Some(c) = per_class.get_mut(usize::from(ans.class)) {
            *c += 1;
        }
    }
    let pct = |x: usize| 100.0 * x as f64 / n as f64;
    let class_mix: Vec<String> = inst
        .classes()
        .iter()
        .zip(&per_class)
        .map(|(c, &k)| format!("{} {:.1}%", c.name, pct(k)))
        .collect();
    println!(
        "queries        {n} (generated in {:.1} s): {:.1}% from clients outside every prefix, {:.1}% with an ECS subnet (/24, /56); {}",
        t.elapsed().as_secs_f64(),
        pct(qs.outside),
        pct(qs.ecs),
        class_mix.join(", ")
    );
    println!(
        "answers        {:.2}% from a map unit, {:.2}% fallback ({:.2}% inside some prefix but no unit of the class there)",
        pct(from_unit),
        pct(n - from_unit),
        pct(no_unit_inside)
    );
}

/// The medians `bench resolve` measures.
struct ResolveTimes {
    base: Duration,
    med: Duration,
    /// The resolve runs, sorted.
    times: Vec<Duration>,
    batch: Duration,
    class_of: Duration,
    unit_for: Duration,
}

/// Times the baseline, resolve, resolve_batch (checked against resolve) and the parts of
/// resolve over `runs` runs of the queries.
fn resolve_measure(runs: usize, resolver: &Resolver, qs: &QuerySet) -> Result<ResolveTimes> {
    // The baseline: touch every query and hash its qname with the same xxh3 the split uses.
    let (base, _) = time_each(runs, || {
        let mut acc = 0u64;
        for q in black_box(&qs.queries) {
            acc ^= xxhash_rust::xxh3::xxh3_64(qs.name(q).as_bytes())
                .wrapping_add(u64::from(q.client.prefix_len()));
        }
        acc
    });
    let (med, times) = time_each(runs, || {
        let mut acc = 0u64;
        for q in black_box(&qs.queries) {
            let ans = resolver.resolve(q.client, qs.name(q));
            acc = acc
                .wrapping_add(ans.primary.map_or(0, u64::from))
                .wrapping_add(u64::from(ans.scope_prefix_len));
        }
        acc
    });
    // The batch API (ResolveBatch takes up to 1,000 queries): same answers, overlapped misses.
    let pairs: Vec<(ipnet::IpNet, &str)> =
        qs.queries.iter().map(|q| (q.client, qs.name(q))).collect();
    let mut answers = Vec::new();
    for (chunk, start) in pairs.chunks(1_000).zip((0..).step_by(1_000)) {
        resolver.resolve_batch(chunk, &mut answers);
        for (k, ans) in answers.iter().enumerate() {
            let (client, name) = pairs[start + k];
            ensure!(
                *ans == resolver.resolve(client, name),
                "resolve_batch disagrees with resolve on query {}",
                start + k
            );
        }
    }
    let (batch, _) = time_each(runs, || {
        let mut acc = 0u64;
        for chunk in black_box(&pairs).chunks(1_000) {
            resolver.resolve_batch(chunk, &mut answers);
            acc = answers.iter().fold(acc, |acc, ans| {
                acc.wrapping_add(ans.primary.map_or(0, u64::from))
            });
        }
        acc
    });
    // Where the time goes: the hostname rules alone, and the prefix lookup alone (with the
    // classes computed beforehand); the rest is the split, the liveness checks, the second cluster.
    let (class_of, _) = time_each(runs, || {
        let mut acc = 0u64;
        for q in black_box(&qs.queries) {
            acc = acc.wrapping_add(u64::from(resolver.rules().class_of(qs.name(q))));
        }
        acc
    });
    let classes: Vec<ClassIdx> = qs
        .queries
        .iter()
        .map(|q| resolver.rules().class_of(qs.name(q)))
        .collect();
    let (unit_for, _) = time_each(runs, || {
        let mut acc = 0u64;
        for (q, &k) in black_box(&qs.queries).iter().zip(&classes) {
            if let Some((u, len)) = resolver.unit_for(q.client.network(), k) {
                acc = acc.wrapping_add(u64::from(u) + u64::from(len));
            }
        }
        acc
    });
    Ok(ResolveTimes {
        base,
        med,
        times,
        batch,
        class_of,
        unit_for,
    })
}

/// Prints the rates of `m` over `n` queries and the target's verdict.
fn resolve_print(m: &ResolveTimes, n: usize, units: usize, runs: usize) {
    let ResolveTimes {
        base,
        med,
        ref times,
        batch,
        class_of,
        unit_for,
    } = *m;
    let rate = |d: Duration| n as f64 / d.as_secs_f64().max(1e-12);
    println!(
        "baseline       median {:>8.1} ms   {:>7.2} M/s   {:>6.1} ns/query   (xxh3 of each qname)",
        ms(base),
        rate(base) / 1e6,
        1e9 / rate(base)
    );
    println!(
        "resolve        median {:>8.1} ms   {:>7.2} M lookups/s   {:>6.1} ns/lookup   (min {:.1} max {:.1} ms over {} runs, one thread)",
        ms(med),
        rate(med) / 1e6,
        1e9 / rate(med),
        ms(times[0]),
        ms(times[times.len() - 1]),
        runs
    );
    println!(
        "resolve_batch  median {:>8.1} ms   {:>7.2} M lookups/s   {:>6.1} ns/lookup   (blocks of 1,000 as ResolveBatch carries; same answers as resolve, checked)",
        ms(batch),
        rate(batch) / 1e6,
        1e9 / rate(batch)
    );
    let per = |d: Duration| 1e9 * d.as_secs_f64() / n as f64;
    println!(
        "breakdown      timed alone: class_of {:.1} ns, unit_for {:.1} ns (prefix table, group, unit class); resolve minus both {:.1} ns (split, liveness, second cluster, and the overlap between queries that a longer dependent chain loses)",
        per(class_of),
        per(unit_for),
        (per(med) - per(class_of) - per(unit_for)).max(0.0)
    );
    println!(
        "ratio          {:>15.1}x   resolve / baseline",
        med.as_secs_f64() / base.as_secs_f64().max(1e-12)
    );
    let target = 5e6;
    let best = rate(med).max(rate(batch));
    println!(
        "target         >= 5 M lookups/s per core at 1 M map units: {} ({:.2} M/s, the faster of resolve and resolve_batch{})",
        if best >= target { "met" } else { "NOT met" },
        best / 1e6,
        if units == 1_000_000 {
            String::new()
        } else {
            format!(", at {units} map units")
        }
    );
}

/// `--grpc-calls`: the same queries through the service's gRPC API.
fn resolve_grpc(a: &ResolveBenchArgs, inst: &Topology, qs: &QuerySet) -> Result<()> {
    ensure!(
        (1..=cdnmap_proto::MAX_BATCH_QUERIES).contains(&a.grpc_batch),
        "--grpc-batch must be in 1..={}",
        cdnmap_proto::MAX_BATCH_QUERIES
    );
    ensure!(a.concurrency >= 1, "--concurrency must be at least 1");
    let dir = tempfile::tempdir()?;
    let config = cdnmap_api::Config {
        data_dir: dir.path().join("store"),
        class_rules: RESOLVE_RULES
            .iter()
            .map(|(p, c)| cdnmap_api::config::ClassRuleConfig {
                pattern: p.to_string(),
                class: c.to_string(),
            })
            .collect(),
        default_class: RESOLVE_DEFAULT_CLASS.into(),
        ..cdnmap_api::Config::default()
    };
    let clients: Vec<(ipnet::IpNet, String)> = qs
        .queries
        .iter()
        .take(100_000)
        .map(|q| (q.client, qs.name(q).to_string()))
        .collect();
    crate::grpc::run(
        inst,
        config,
        &clients,
        a.grpc_calls,
        a.grpc_batch,
        a.concurrency,
    )?;
    Ok(())
}

pub fn resolve(a: &ResolveBenchArgs) -> Result<ExitCode> {
    ensure!(a.runs >= 1, "--runs must be at least 1");
    ensure!(a.queries >= 1, "--queries must be at least 1");
    ensure!(
        (0.0..=1.0).contains(&a.outside),
        "--outside must be in [0, 1], got {}",
        a.outside
    );
    let inst = a.world.generate()?;
    let sol = resolve_cold_solve(&inst);
    let resolver = resolve_build(&inst, sol)?;
    let t = Instant::now();
    let qs = query_set(&inst, a.queries, a.outside, a.world.seed)?;
    resolve_mix(&inst, &resolver, &qs, t);
    let m = resolve_measure(a.runs, &resolver, &qs)?;
    resolve_print(&m, qs.queries.len(), inst.unit_count(), a.runs);
    if a.grpc_calls > 0 {
        resolve_grpc(a, &inst, &qs)?;
    }
    Ok(ExitCode::SUCCESS)
}
