//! `cdnmap bench n1`: the N-1 view's work (issue 45) on a generated world's map in service
//! (solved cold, then warm): the whole sweep over every cluster and site
//! (`cdnmap_engine::n1::sweep`), median of `--runs`; the worst `--exact` losses previewed with
//! the rounds' own code, estimate against exact; and warm rounds timed alone and then with
//! sweeps running beside them at nice 10 (as the service runs them), the medians' ratio.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use cdnmap_api::n1::Gate;
use cdnmap_api::preview::Figures;
use cdnmap_engine::n1::sweep;
use cdnmap_engine::round::{preview as solve_preview, round, RoundChance, Snapshot};
use cdnmap_mapper::{ClusterState, Stickiness};
use cdnmap_serve::resolve::ClassRules;
use clap::Args;

use crate::alloc;
use crate::preview::{median, ms};
use crate::solve::BenchWorld;

#[derive(Args, Debug)]
pub struct N1BenchArgs {
    #[command(flatten)]
    pub world: BenchWorld,
    /// Sweeps timed, and warm rounds timed alone and beside sweeps.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// The worst losses previewed exactly.
    #[arg(long, default_value_t = 5)]
    pub exact: usize,
}

pub fn n1(a: &N1BenchArgs) -> Result<std::process::ExitCode> {
    ensure!(
        (1..=100).contains(&a.runs),
        "--runs {}: must be 1 to 100",
        a.runs
    );
    ensure!(a.exact <= 50, "--exact {}: at most 50", a.exact);
    let world = a.world.generate()?;
    let default_class = world
        .classes()
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let rules = || ClassRules::for_instance(&world, &[], &default_class);
    let stickiness = Stickiness::default();
    let cold = round(&world, None, &stickiness, rules()?, 1, 0, false).context("the cold round")?;
    let warm = round(&world, Some(&cold), &stickiness, rules()?, 1, 30_000, false)
        .context("the warm round")?;
    drop(cold);

    alloc::reset_peak();
    let live_before = alloc::live_bytes();
    let mut times = Vec::new();
    let mut found = None;
    for _ in 0..a.runs {
        let t = Instant::now();
        found = Some(sweep(&warm.topology, &warm.map, &mut || true));
        times.push(ms(t));
    }
    let found = found.context("no sweep ran")?;
    println!(
        "sweep          {} clusters, {} sites: median {:.0} ms of {} runs",
        found.clusters.len(),
        found.sites.len(),
        median(&mut times),
        a.runs
    );
    if alloc::installed() {
        println!(
            "peak heap      {:.0} MB over the sweeps (above the map in service)",
            alloc::peak_bytes().saturating_sub(live_before) as f64 / 1e6
        );
    }
    println!(
        "overflow now   {:.3}%; the worst losses, estimated against the rounds' own preview:",
        100.0 * found.overflow_share
    );
    let worst: Vec<_> = found.clusters.iter().chain(&found.sites).collect();
    let mut worst = worst;
    worst.sort_by(|x, y| y.overflow.total_cmp(&x.overflow));
    let (mut errors, mut exact_ms) = (Vec::new(), Vec::new());
    for loss in worst.iter().take(a.exact) {
        let mut topology = warm.topology.clone();
        for &c in &loss.clusters {
            topology = topology.with_cluster_state(c, ClusterState::Down);
        }
        let t = Instant::now();
        let solved = solve_preview(
            &topology,
            &warm,
            (&stickiness, &RoundChance::default()),
            60_000,
        )?;
        let after = Figures::of(&solved.topology, &solved.map, &solved.measured);
        exact_ms.push(ms(t));
        let points = 100.0 * (loss.overflow_share - after.overflow_share);
        errors.push(points.abs());
        println!(
            "  {:<24} lost {:>10.0}: overflow estimated {:.3}%, exact {:.3}% ({points:+.3} points)",
            loss.name,
            loss.demand,
            100.0 * loss.overflow_share,
            100.0 * after.overflow_share
        );
    }
    if !errors.is_empty() {
        println!(
            "  estimate off by {:.3} points at the median (most {:.3}); an exact preview {:.0} ms",
            median(&mut errors.clone()),
            errors.iter().copied().fold(0.0, f64::max),
            median(&mut exact_ms)
        );
    }
    beside_rounds(a, &world, &warm, &stickiness, &rules)
}

/// Warm rounds alone, then with sweeps running beside them on another thread at nice 10,
/// stepping aside while a round solves ([`Gate`], as the service's do).
fn beside_rounds(
    a: &N1BenchArgs,
    world: &cdnmap_topology::Topology,
    warm: &Snapshot,
    stickiness: &Stickiness,
    rules: &dyn Fn() -> Result<ClassRules, cdnmap_mapper::ModelError>,
) -> Result<std::process::ExitCode> {
    // The service's way: a flag up while a round solves, which the sweep's gate steps aside for.
    let solving = AtomicBool::new(false);
    let time_rounds = |n: usize| -> Result<Vec<f64>> {
        let mut out = Vec::new();
        for r in 0..n {
            let t = Instant::now();
            solving.store(true, Ordering::Relaxed);
            let now = 40_000 + r as i64;
            let solved = round(world, Some(warm), stickiness, rules()?, 1, now, false);
            solving.store(false, Ordering::Relaxed);
            solved?;
            out.push(ms(t));
            // The rounds' cycle leaves the sweep time between them (10-30 s in service).
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(out)
    };
    let mut alone = time_rounds(a.runs)?;
    let stop = AtomicBool::new(false);
    let sweeps = AtomicUsize::new(0);
    let mut beside = std::thread::scope(|scope| {
        scope.spawn(|| {
            cdnmap_api::service::lower_thread_priority();
            while !stop.load(Ordering::Relaxed) {
                let mut gate = Gate::new(&solving, std::time::Duration::from_secs(3600));
                let _ = sweep(&warm.topology, &warm.map, &mut || {
                    gate.go_on() && !stop.load(Ordering::Relaxed)
                });
                sweeps.fetch_add(1, Ordering::Relaxed);
            }
        });
        let timed = time_rounds(a.runs);
        stop.store(true, Ordering::Relaxed);
        timed
    })?;
    let (alone_ms, beside_ms) = (median(&mut alone), median(&mut beside));
    println!(
        "rounds         warm round median {alone_ms:.0} ms alone, {beside_ms:.0} ms beside sweeps ({:.3}x; {} sweeps ran beside {} rounds)",
        beside_ms / alone_ms,
        sweeps.load(Ordering::Relaxed),
        a.runs
    );
    Ok(std::process::ExitCode::SUCCESS)
}
