//! `cdnmap bench cost`: the cost/latency trade of the cost policy (issue 46) on a generated
//! world with a price on every cluster: for each `--weights` value, a cold round's
//! preferences (the policy's scores) and solve, timed (median of `--runs`), and the map's
//! demand-weighted mean RTT and cost, its independent verification (capacity, stability
//! under the policy's preferences) and the latency guard checked placement by placement; the
//! same world without a policy is the baseline of the times. `--svg` draws the curve.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use cdnmap_mapper::model::{CostSpec, PolicySpec};
use cdnmap_mapper::{policy, solve, verify, Rescore, SolveOptions, Stickiness};
use clap::Args;
use rand::{Rng, SeedableRng};

use crate::preview::{median, ms};
use crate::report::Summary;
use crate::solve::BenchWorld;

#[derive(Args, Debug)]
pub struct CostBenchArgs {
    #[command(flatten)]
    pub world: BenchWorld,
    /// The cost weights (ms of score per unit of price), in order.
    #[arg(long, value_delimiter = ',', default_value = "0,0.5,1,2,4,8")]
    pub weights: Vec<f64>,
    /// The latency guard: never a cluster over one more than this many ms better.
    #[arg(long, default_value_t = 10.0)]
    pub guard_ms: f64,
    /// Timed solves per weight.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Where to draw the curve (mean RTT against cost, a point per weight), as SVG.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// One weight's figures.
struct Point {
    weight: f64,
    prefs_ms: f64,
    solve_ms: f64,
    rtt_ms: f64,
    overflow_share: f64,
    cost: f64,
    violations: usize,
    guard: usize,
}

pub fn cost(a: &CostBenchArgs) -> Result<std::process::ExitCode> {
    ensure!(
        (1..=20).contains(&a.runs),
        "--runs {}: must be 1 to 20",
        a.runs
    );
    ensure!(!a.weights.is_empty(), "--weights: give at least one");
    let world = a.world.generate()?;
    // A price on every cluster, 1 to 10 per unit of Bps, drawn from the world's seed.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.world.seed ^ 0xC0_57);
    let prices = world
        .clusters()
        .iter()
        .map(|c| (c.id.clone(), rng.random_range(1.0..10.0f64)))
        .collect();
    let with_weight = |weight: f64| {
        world.instance.with_policy(&PolicySpec {
            cost: Some(CostSpec {
                weight,
                guard_ms: a.guard_ms,
                default_price: 1.0,
                prices: std::collections::BTreeMap::clone(&prices),
            }),
        })
    };
    let options = SolveOptions::default();
    // The baseline: the same world and solve, no policy.
    let mut base = Vec::new();
    for _ in 0..a.runs {
        let t = Instant::now();
        let _ = solve(&world.instance, &options);
        base.push(ms(t));
    }
    let base_ms = median(&mut base);
    let cold = solve(&world.instance, &options).map;
    let base_warm = warm(&world.instance, &cold, &options, a.runs)?;
    println!(
        "no policy      cold solve median {base_ms:.0} ms, warm round {:.0} ms ({} runs); prices 1–10 on {} clusters, guard {} ms",
        base_warm.0 + base_warm.1,
        a.runs,
        world.clusters().len(),
        a.guard_ms
    );
    println!(
        "{:>8} {:>10} {:>10} {:>8} {:>17} {:>8} {:>11} {:>14} {:>10} {:>7}",
        "weight",
        "scores ms",
        "solve ms",
        "× none",
        "warm: prefs+solve",
        "× none",
        "mean RTT",
        "cost",
        "verifier",
        "guard"
    );
    // (overflow is printed after the guard: the mean RTT is of the placed demand.)
    let base_warm_ms = base_warm.0 + base_warm.1;
    let mut points = Vec::new();
    for &weight in &a.weights {
        let inst = with_weight(weight).with_context(|| format!("weight {weight}"))?;
        let (p, (wp, ws)) = point(&inst, weight, &options, a.runs)?;
        println!(
            "{:>8} {:>10.0} {:>10.0} {:>7.2}× {:>8.0} + {:>6.0} {:>7.2}× {:>8.2} ms {:>14.0} {:>10} {:>7}   overflow {:.3}%",
            p.weight,
            p.prefs_ms,
            p.solve_ms,
            (p.prefs_ms + p.solve_ms) / base_ms.max(1e-9),
            wp,
            ws,
            (wp + ws) / base_warm_ms.max(1e-9),
            p.rtt_ms,
            p.cost,
            p.violations,
            p.guard,
            100.0 * p.overflow_share
        );
        points.push(p);
    }
    if let Some(path) = &a.svg {
        draw(path, &points, a.guard_ms)?;
        println!("curve          {}", path.display());
    }
    let bad = points.iter().any(|p| p.violations > 0 || p.guard > 0);
    Ok(if bad {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

/// One weight's figures: `inst` (the world with the policy at that weight) solved cold `runs`
/// times (its scores and solve timed), the last map verified and its guard checked, and the
/// warm round from it ([`warm`]: scores and solve, ms).
fn point(
    inst: &cdnmap_mapper::Instance,
    weight: f64,
    options: &SolveOptions,
    runs: usize,
) -> Result<(Point, (f64, f64))> {
    let (mut prefs_t, mut solve_t) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let scores = policy::rescore(inst, &Rescore::default());
        let prefs = match &scores {
            Some(s) => cdnmap_mapper::effective_preferences(inst, None, &Stickiness::default(), s)?,
            None => inst.clone(),
        };
        prefs_t.push(ms(t));
        let t = Instant::now();
        let sol = solve(&prefs, options);
        solve_t.push(ms(t));
        last = Some((prefs, sol));
    }
    let (prefs, sol) = last.context("no run")?;
    let warm_ms = warm(inst, &sol.map, options, runs)?;
    let report = verify::verify(&prefs, &sol.map);
    let summary = Summary::new(inst, &sol.map, &sol.stats, std::time::Duration::ZERO);
    let p = Point {
        weight,
        prefs_ms: median(&mut prefs_t),
        solve_ms: median(&mut solve_t),
        rtt_ms: summary.mean_rtt_ms,
        overflow_share: summary.overflow / summary.demand.max(1e-9),
        cost: summary.cost.unwrap_or(0.0),
        violations: report.violation_count(),
        guard: policy::guard_violations(inst, &Rescore::default(), &prefs, &sol.map),
    };
    Ok((p, warm_ms))
}

/// A round's steady state: `inst`'s preferences seeded from `map` (its own cold map, as the
/// next round with the same demand sees it: stickiness's default, the policy's scores) and
/// the warm solve from it; medians of `runs` (ms).
fn warm(
    inst: &cdnmap_mapper::Instance,
    map: &cdnmap_mapper::Map,
    options: &SolveOptions,
    runs: usize,
) -> Result<(f64, f64)> {
    let (mut p, mut s) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let scores = policy::rescore(inst, &Rescore::default());
        let prefs = cdnmap_mapper::effective_preferences(
            inst,
            Some(map),
            &Stickiness::default(),
            scores.as_ref().unwrap_or(&Rescore::default()),
        )?;
        p.push(ms(t));
        let t = Instant::now();
        let _ = cdnmap_mapper::solve_seeded(&prefs, map, options);
        s.push(ms(t));
    }
    Ok((median(&mut p), median(&mut s)))
}

/// Mean RTT against cost, a point per weight, labelled.
fn draw(path: &std::path::Path, points: &[Point], guard_ms: f64) -> Result<()> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", path.display());
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (c0, c1) = points.iter().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(p.cost), b.max(p.cost))
    });
    let (r0, r1) = points.iter().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(p.rtt_ms), b.max(p.rtt_ms))
    });
    let pad = |lo: f64, hi: f64| {
        let d = (hi - lo).abs().max(hi.abs() * 0.01).max(1e-9) * 0.1;
        (lo - d)..(hi + d)
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("cost against mean RTT by cost weight (guard {guard_ms} ms)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(pad(c0, c1), pad(r0, r1))
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("cost of the map (price × Bps used)")
        .y_desc("mean RTT (ms, demand-weighted)")
        .draw()
        .map_err(|x| e(&x))?;
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.cost, p.rtt_ms)),
            BLUE,
        ))
        .map_err(|x| e(&x))?;
    chart
        .draw_series(points.iter().map(|p| {
            EmptyElement::at((p.cost, p.rtt_ms))
                + Circle::new((0, 0), 4, BLUE.filled())
                + Text::new(format!("w={}", p.weight), (6, -14), ("sans-serif", 13))
        }))
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
