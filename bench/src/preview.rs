//! `cdnmap bench preview`: `Admin.Preview`'s work in process (issue 45): a generated world
//! solved cold and then warm (the map in service), then previews of draining its busiest
//! cluster, each part timed apart: the solve (`cdnmap_engine::round::preview`, the rounds' own
//! code), the diff against the map in service, and the figures of both maps. The warm round's
//! solve, measured in the same run, is the baseline. Prints the medians over `--runs`, what
//! the preview moves, and the peak of live heap bytes over the previews.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use cdnmap_api::preview::Figures;
use cdnmap_engine::round::{preview as solve_preview, round, RoundChance};
use cdnmap_mapper::{ClusterState, Stickiness};
use cdnmap_serve::resolve::ClassRules;
use clap::Args;

use crate::alloc;
use crate::solve::BenchWorld;

#[derive(Args, Debug)]
pub struct PreviewBenchArgs {
    #[command(flatten)]
    pub world: BenchWorld,
    /// Previews timed.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
}

/// Milliseconds since `t`.
pub(crate) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The median of `v` (sorted in place; the upper one of an even count).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn preview(a: &PreviewBenchArgs) -> Result<std::process::ExitCode> {
    ensure!(
        (1..=100).contains(&a.runs),
        "--runs {}: must be 1 to 100",
        a.runs
    );
    let world = a.world.generate()?;
    let default_class = world
        .classes()
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let rules = || ClassRules::for_instance(&world, &[], &default_class);
    let stickiness = Stickiness::default();
    let t = Instant::now();
    let cold = round(&world, None, &stickiness, rules()?, 1, 0, false).context("the cold round")?;
    println!("cold round     {:.0} ms", ms(t));
    let t = Instant::now();
    let warm = round(&world, Some(&cold), &stickiness, rules()?, 1, 30_000, false)
        .context("the warm round")?;
    let warm_ms = ms(t);
    drop(cold);
    println!(
        "warm round     {warm_ms:.0} ms (solve {:.0} ms): the map in service",
        warm.timings.solve_ms
    );
    let load = warm.map.demand_per_cluster(&warm.topology);
    let busiest = (0..load.len())
        .max_by(|&x, &y| load[x].total_cmp(&load[y]))
        .context("a world without clusters")?;
    let id = world.clusters()[busiest].id.clone();
    let drained = warm
        .topology
        .with_cluster_state(busiest as u32, ClusterState::Drained);
    let chance = RoundChance::default();
    let (mut solve, mut diff, mut figures, mut total) = (vec![], vec![], vec![], vec![]);
    let mut last = None;
    alloc::reset_peak();
    let live_before = alloc::live_bytes();
    for r in 0..a.runs {
        let started = Instant::now();
        let solved = solve_preview(&drained, &warm, (&stickiness, &chance), 60_000 + r as i64)?;
        solve.push(ms(started));
        let t = Instant::now();
        let d = cdnmap_mapper::diff::diff(
            (&warm.topology, &warm.map),
            (&solved.topology, &solved.map),
            20,
        );
        diff.push(ms(t));
        let t = Instant::now();
        let before = Figures::of(&warm.topology, &warm.map, &warm.measured);
        let after = Figures::of(&solved.topology, &solved.map, &solved.measured);
        figures.push(ms(t));
        total.push(ms(started));
        last = Some((d, before, after));
    }
    let (d, before, after) = last.context("no preview ran")?;
    println!(
        "preview        draining {id} ({:.0} demand of {:.0}): {} runs",
        load[busiest],
        world.total_demand(),
        a.runs
    );
    let total_median = median(&mut total);
    println!(
        "  median       solve {:.0} ms, diff {:.0} ms, figures {:.0} ms, total {total_median:.0} ms ({:.2}x the warm round's {warm_ms:.0} ms)",
        median(&mut solve),
        median(&mut diff),
        median(&mut figures),
        total_median / warm_ms
    );
    println!(
        "  would move   {:.0} demand ({:.3}%), {} map units; overflow {:.3}% -> {:.3}%; full nodes {} -> {}; mean RTT {:.2} -> {:.2} ms",
        d.moved,
        100.0 * d.moved_share(),
        d.units_changed,
        100.0 * before.overflow_share,
        100.0 * after.overflow_share,
        before.nodes_full,
        after.nodes_full,
        before.mean_rtt_ms,
        after.mean_rtt_ms
    );
    if alloc::installed() {
        println!(
            "peak heap      {:.0} MB over the previews (above the map in service)",
            alloc::peak_bytes().saturating_sub(live_before) as f64 / 1e6
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}
