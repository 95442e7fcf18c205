//! `cdnmap solve`, `cdnmap verify` and `cdnmap demo`: a round of an instance file solved (or
//! an assignment checked) on the command line, and the demo's two rounds. `solve` and
//! `verify` share [`RoundArgs`], so `verify` checks exactly the preferences `solve` used.
//! `verify` prints a summary (violations by kind, the map's totals) before its examples, and
//! says when a map with blocking pairs may be a sticky round's that needs `--previous`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cdnmap_engine::round::{preferences, solve_preferences, RoundChance};
use cdnmap_mapper::{
    churn, verify, ClusterState, Instance, Limits, Map, Rescore, SolveOptions, Stickiness,
    DEFAULT_STICKINESS,
};
use cdnmap_topology::format::{parse_assignment, parse_assignment_with_summary, write_assignment};
use cdnmap_topology::Topology;
use clap::Args;

use crate::io::{check_writable, generate_world, located, read_instance, write_atomically};
use crate::report::Summary;
use cdnmap_world::world;

use super::world::WorldShape;

#[derive(Args, Debug)]
pub(crate) struct SolveArgs {
    /// The instance file (JSON, see docs/formats.md).
    instance: PathBuf,
    /// Where to write the assignment (JSON).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    round: RoundArgs,
    /// At most this many repair rounds after the first pass.
    #[arg(long, default_value_t = SolveOptions::default().max_repair_rounds)]
    repair_rounds: u32,
    /// Skip the independent verifier (it takes about as long as the solve).
    #[arg(long)]
    no_verify: bool,
}

/// What makes the instance of a round: the file, cluster states set on the command line, and
/// the previous map with the stickiness that turns it into effective preferences. `solve` and
/// `verify` share it, so `verify` checks exactly the preferences `solve` used.
#[derive(Args, Debug)]
pub(crate) struct RoundArgs {
    /// Refuse map units with more candidates than this (at most 255).
    #[arg(long, default_value_t = Limits::default().max_candidates)]
    max_candidates: usize,
    /// Mark this cluster down for the round (repeatable).
    #[arg(long = "down", value_name = "CLUSTER")]
    down: Vec<String>,
    /// Mark this cluster drained for the round (repeatable).
    #[arg(long = "drain", value_name = "CLUSTER")]
    drain: Vec<String>,
    /// The previous round's assignment: the round is seeded from it (sticky, warm start).
    #[arg(long, value_name = "ASSIGNMENT.json")]
    previous: Option<PathBuf>,
    /// With --previous: incumbent scores and ranks are multiplied by 1 - X, X in [0, 0.9]
    /// (0 = a cold solve; churn is still reported against the previous map).
    #[arg(long, default_value_t = DEFAULT_STICKINESS, value_name = "X", allow_negative_numbers = true)]
    stickiness: f64,
    /// With --previous: do not put incumbents before newcomers at clusters.
    #[arg(long)]
    no_incumbents_first: bool,
}

/// An instance as a round sees it.
pub(crate) struct Round {
    /// The instance with the command line's cluster states.
    instance: Topology,
    /// The previous map, if any: churn is measured against it.
    previous: Option<Map>,
    /// The preferences the solver uses and the verifier checks (`cdnmap_engine`'s, as the
    /// service's rounds make them): with stickiness on and a previous map, its incumbents
    /// favoured, and the round solved warm from that map.
    preferences: Instance,
    /// Whether the round is solved warm from `previous`.
    seeded: bool,
}

impl Round {
    /// `instance`'s round, seeded from `previous` when `stickiness` has a margin.
    fn new(instance: Topology, previous: Option<Map>, stickiness: &Stickiness) -> Result<Round> {
        let (preferences, sticky) = preferences(
            &instance,
            previous.as_ref(),
            stickiness,
            &Rescore::default(),
        )?;
        let seeded = sticky.is_some();
        Ok(Round {
            instance,
            previous,
            preferences,
            seeded,
        })
    }

    /// The preferences the solver uses and the verifier checks.
    fn effective(&self) -> &Instance {
        &self.preferences
    }
}

impl RoundArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_candidates: self.max_candidates,
        }
    }

    fn load(&self, path: &Path) -> Result<Round> {
        let mut instance = read_instance(path, self.limits())?;
        for (ids, state) in [
            (&self.down, ClusterState::Down),
            (&self.drain, ClusterState::Drained),
        ] {
            for id in ids {
                let c = instance
                    .cluster_index(id)
                    .with_context(|| format!("{}: no cluster {id:?}", path.display()))?;
                instance = instance.with_cluster_state(c, state);
            }
        }
        let stickiness = Stickiness {
            margin: self.stickiness,
            incumbents_first: !self.no_incumbents_first,
        };
        let previous = match &self.previous {
            None => None,
            Some(p) => Some(read_assignment(p, &instance)?),
        };
        // Checked even without --previous, so a bad value is never silently ignored.
        let context = || format!("--stickiness {}", self.stickiness);
        stickiness.validate().with_context(context)?;
        let path = self.previous.as_deref();
        Round::new(instance, previous, &stickiness).with_context(|| match path {
            Some(path) => format!("{} (with {})", path.display(), context()),
            None => context(),
        })
    }
}

/// Reads an assignment file against `instance`; errors name the file.
pub fn read_assignment(path: &Path, instance: &Instance) -> Result<Map> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_assignment(&bytes, instance).map_err(|e| located(path, e))
}

#[derive(Args, Debug)]
pub(crate) struct VerifyArgs {
    instance: PathBuf,
    assignment: PathBuf,
    /// The same round options `solve` was given: the map is checked against the preferences
    /// they make (with --previous, the effective preferences).
    #[command(flatten)]
    round: RoundArgs,
    /// Print at most this many violations.
    #[arg(long, default_value_t = 20)]
    max_lines: usize,
}

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    #[command(flatten)]
    shape: WorldShape,
}

/// Solves a round (warm from the previous map when there is one), verifies the result against
/// the preferences used, and summarises it.
pub(crate) fn solve_and_report(round: &Round, repair_rounds: u32, check: bool) -> (Map, Summary) {
    let options = SolveOptions {
        max_repair_rounds: repair_rounds,
        ..SolveOptions::default()
    };
    let inst = round.effective();
    let sticky = round.previous.as_ref().filter(|_| round.seeded);
    let t = Instant::now();
    let (sol, _) = solve_preferences(
        &round.instance,
        inst,
        sticky,
        &RoundChance::default(),
        &options,
    );
    let elapsed = t.elapsed();
    // Quality (RTT, first choice) is judged by the real scores, not the effective ones.
    let mut summary = Summary::new(&round.instance, &sol.map, &sol.stats, elapsed);
    if let Some(previous) = &round.previous {
        summary.churn = Some(churn(&round.instance, previous, &sol.map));
    }
    if check {
        let report = verify::verify(inst, &sol.map);
        // The cost policy's guard, checked from the latencies alone (a cold round's: a warm
        // one's stickiness may keep an incumbent within its margin).
        let guard = (!round.seeded).then(|| {
            cdnmap_mapper::policy::guard_violations(
                &round.instance,
                &Rescore::default(),
                inst,
                &sol.map,
            )
        });
        summary.guard_violations = guard.filter(|_| summary.cost.is_some());
        summary.verifier_violations = Some(report.violation_count() + guard.unwrap_or(0));
        if !report.is_ok() {
            eprintln!("{}", report.describe(inst, 20));
        }
    }
    (sol.map, summary)
}

pub(crate) fn cmd_solve(a: &SolveArgs) -> Result<ExitCode> {
    if let Some(out) = &a.out {
        check_writable(out)?;
    }
    let round = a.round.load(&a.instance)?;
    let (map, summary) = solve_and_report(&round, a.repair_rounds, !a.no_verify);
    println!("{summary}");
    if let Some(out) = &a.out {
        write_atomically(out, |w| {
            Ok(write_assignment(&round.instance, &map, &summary, w)?)
        })?;
        println!("assignment     {}", out.display());
    }
    Ok(if summary.verifier_violations.unwrap_or(0) > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

pub(crate) fn cmd_verify(a: &VerifyArgs) -> Result<ExitCode> {
    let round = a.round.load(&a.instance)?;
    let inst = round.effective();
    let bytes = std::fs::read(&a.assignment)
        .with_context(|| format!("reading {}", a.assignment.display()))?;
    let (map, summary) =
        parse_assignment_with_summary(&bytes, inst).map_err(|e| located(&a.assignment, e))?;
    let report = verify::verify(inst, &map);
    let hint =
        !report.blocking_pairs.is_empty() && round.previous.is_none() && maybe_sticky(&summary);
    print!(
        "{}",
        verdict(
            inst,
            &map,
            &report,
            a.max_lines,
            hint.then_some(STICKY_HINT)
        )
    );
    let guard = (!round.seeded && round.instance.policy().cost.is_some()).then(|| {
        cdnmap_mapper::policy::guard_violations(&round.instance, &Rescore::default(), inst, &map)
    });
    if let Some(g) = guard {
        let cost = cdnmap_mapper::policy::map_cost(&round.instance, &map).unwrap_or(0.0);
        println!(
            "cost policy: the map costs {cost:.1}; the latency guard is broken by {g} placements"
        );
    }
    Ok(if report.is_ok() && guard.unwrap_or(0) == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What `verify` says of a map with blocking pairs checked without `--previous`, when the map
/// may be a sticky round's.
pub(crate) const STICKY_HINT: &str = "hint: a sticky map is stable with respect to the \
preferences of its round: give the previous map with --previous (and the round's --stickiness)";

/// Whether an assignment file's `summary` says (or cannot rule out) that its map was solved
/// warm from a previous map: `churn` or `seeded` in it, or no summary at all.
fn maybe_sticky(summary: &serde_json::Value) -> bool {
    match summary.as_object() {
        None => true,
        Some(s) => s.contains_key("churn") || s.contains_key("seeded"),
    }
}

/// `verify`'s account of a map: the verdict, the violations counted by kind, the map's
/// totals, `hint` if any, then at most `max_lines` violations (and how many more there are).
fn verdict(
    inst: &Instance,
    map: &Map,
    report: &verify::Report,
    max_lines: usize,
    hint: Option<&str>,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let count = report.violation_count();
    if count == 0 {
        let _ = writeln!(
            out,
            "ok: {} map units, capacity, conservation, candidates and stability hold",
            inst.unit_count()
        );
    } else {
        let _ = writeln!(out, "violations: {count}");
        let kinds = [
            (
                "shape (units in the map vs the instance)",
                usize::from(report.shape.is_some()),
            ),
            ("capacity (nodes over capacity)", report.capacity.len()),
            ("conservation of demand", report.conservation.len()),
            ("placed at a non-candidate", report.not_candidate.len()),
            (
                "placed at a drained or down cluster",
                report.unavailable.len(),
            ),
            ("blocking pairs", report.blocking_pairs.len()),
        ];
        for (kind, n) in kinds {
            let _ = write!(out, "  {kind:<42} {n:>9}");
            if kind == "blocking pairs" && n > 0 {
                let _ = write!(out, " (largest gain {:.6})", report.max_blocking_gain());
            }
            out.push('\n');
        }
    }
    let demand = inst.total_demand();
    let (placed, overflow) = (map.total_allocated(), map.total_overflow());
    let up = inst
        .clusters()
        .iter()
        .filter(|c| c.state == ClusterState::Up)
        .count();
    let share = |x: f64| {
        if demand > 0.0 {
            100.0 * x / demand
        } else {
            0.0
        }
    };
    let _ = writeln!(
        out,
        "map: {} map units, {} clusters ({up} up); demand {demand:.6}: placed {placed:.6} \
         ({:.2}%), overflow {overflow:.6} ({:.2}%)",
        inst.unit_count(),
        inst.clusters().len(),
        share(placed),
        share(overflow),
    );
    if let Some(hint) = hint {
        let _ = writeln!(out, "{hint}");
    }
    if count > 0 {
        let shown = count.min(max_lines);
        let _ = writeln!(out, "the first {shown} (--max-lines):");
        let _ = writeln!(out, "{}", report.describe(inst, max_lines));
    }
    out
}

/// Two rounds of a demo world: a cold solve, then the same world with ±5% noise on demand and
/// scores, solved seeded from the first round.
pub(crate) fn cmd_demo(a: &DemoArgs) -> Result<ExitCode> {
    let params = a.shape.params();
    let inst = generate_world(&params)?;
    let repair = SolveOptions::default().max_repair_rounds;
    let first = Round::new(inst.clone(), None, &Stickiness::default())?;
    let (m0, s0) = solve_and_report(&first, repair, true);
    println!("round 1: cold solve\n{s0}\n");
    let next = world::perturb(&inst, 5.0, params.seed.wrapping_add(1))?;
    let second = Round::new(next, Some(m0), &Stickiness::default())?;
    let (_, s1) = solve_and_report(&second, repair, true);
    println!("round 2: ±5% noise on demand and scores, seeded from round 1 (stickiness {DEFAULT_STICKINESS})\n{s1}");
    if s0.verifier_violations.unwrap_or(0) + s1.verifier_violations.unwrap_or(0) > 0 {
        bail!("the verifier found violations in the demo world's map");
    }
    Ok(ExitCode::SUCCESS)
}
