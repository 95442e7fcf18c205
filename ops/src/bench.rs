//! `cdnmap bench ...`: benchmarks that print medians, ratios to a baseline measured in the same
//! run, memory, and the quality of the result (DESIGN.md: "benchmarks report quality as well as
//! speed").

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use cdnmap_mapper::{
    churn, favour_incumbents, solve as solve_instance, solve_seeded, Instance, Map, SolveOptions,
    Stickiness, UnitIdx, DEFAULT_STICKINESS,
};
use clap::Args;

use crate::alloc;
use crate::cli::generate_world;
use crate::report::Summary;
use crate::world::{perturb, WorldParams};

/// The second half of `bench solve --perturb`: cold and seeded solves of a jittered world.
fn sticky_round(
    a: &SolveBenchArgs,
    inst: &Instance,
    first: &Map,
    pct: f64,
    first_cold: Duration,
) -> Result<()> {
    let next = perturb(inst, pct, a.seed.wrapping_add(1))?;
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
        a.seed.wrapping_add(1)
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
        "               = effective preferences {:.1} ms + seeded solve {:.1} ms; proposals {}   evictions {}   repair rounds {}   blocking pairs {}",
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
    println!(
        "warm / cold    {:>15.1}%   (the first world's cold solve: {:.1} ms)",
        100.0 * warm.as_secs_f64() / cold.as_secs_f64().max(1e-9),
        ms(first_cold)
    );
    Ok(())
}

#[derive(Args, Debug)]
pub struct SolveBenchArgs {
    /// Number of map units in the generated world.
    #[arg(long, default_value_t = 1_000_000)]
    pub map_units: usize,
    /// Number of clusters.
    #[arg(long, default_value_t = 1_000)]
    pub clusters: usize,
    /// Candidates per map unit (at most).
    #[arg(long, default_value_t = 16)]
    pub candidates: usize,
    /// World seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
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
}

/// Runs `f` `runs` times; returns the median time, the sorted times, and the last result.
fn time_runs<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, Vec<Duration>, T) {
    let mut times = Vec::with_capacity(runs);
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
pub fn trivial_pass(inst: &Instance) -> Vec<f64> {
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
    let params = WorldParams {
        map_units: a.map_units,
        clusters: a.clusters,
        seed: a.seed,
        candidates: a.candidates,
        ..WorldParams::default()
    };
    let t = Instant::now();
    let inst = generate_world(&params)?;
    let units = inst.unit_count() as f64;
    println!(
        "world          {} map units, {} clusters, {:.1} candidates/unit, seed {} (generated in {:.1} s)",
        inst.unit_count(),
        inst.clusters().len(),
        inst.total_candidates() as f64 / units,
        a.seed,
        t.elapsed().as_secs_f64()
    );

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
        "cold solve     median {:>9.1} ms   min {:.1} max {:.1} over {} runs, one thread",
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
