//! Command-line parsing and the file-handling subcommands.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cdnmap_mapper::format::{parse_assignment, parse_instance, write_assignment, write_instance};
use cdnmap_mapper::{solve, verify, Instance, Limits, SolveOptions};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::bench;
use crate::report::Summary;
use crate::world::{self, WorldParams};

#[derive(Parser, Debug)]
#[command(name = "cdnmap", version, about = "CDN mapping control plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Solve an instance file: print a summary and write the assignment.
    Solve(SolveArgs),
    /// Check an assignment against its instance (capacity, conservation, candidates,
    /// stability); exits 1 on any violation.
    Verify(VerifyArgs),
    /// Generate a realistic world from real city and site coordinates.
    World(WorldArgs),
    /// Generate the demo world, solve it, verify it and print the summary.
    Demo(DemoArgs),
    /// Benchmarks that print medians and quality figures.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Args, Debug)]
struct SolveArgs {
    /// The instance file (JSON, see docs/formats.md).
    instance: PathBuf,
    /// Where to write the assignment (JSON).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
    /// At most this many repair rounds after the first pass.
    #[arg(long, default_value_t = SolveOptions::default().max_repair_rounds)]
    repair_rounds: u32,
    /// Skip the independent verifier (it takes about as long as the solve).
    #[arg(long)]
    no_verify: bool,
}

#[derive(Args, Debug)]
struct LimitArgs {
    /// Refuse map units with more candidates than this (at most 255).
    #[arg(long, default_value_t = Limits::default().max_candidates)]
    max_candidates: usize,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_candidates: self.max_candidates,
        }
    }
}

#[derive(Args, Debug)]
struct VerifyArgs {
    instance: PathBuf,
    assignment: PathBuf,
    #[command(flatten)]
    limits: LimitArgs,
    /// Print at most this many violations.
    #[arg(long, default_value_t = 20)]
    max_lines: usize,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct WorldShape {
    /// Number of map units (prefix × traffic class).
    #[arg(long, default_value_t = 30_000)]
    pub map_units: usize,
    /// Number of clusters, placed at real sites.
    #[arg(long, default_value_t = 120)]
    pub clusters: usize,
    /// Random seed: the same seed gives the same world.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// At most this many candidates per map unit.
    #[arg(long, default_value_t = WorldParams::default().candidates)]
    pub candidates: usize,
    /// At most this many of a map unit's candidates at one site.
    #[arg(long, default_value_t = WorldParams::default().max_per_site)]
    pub max_per_site: usize,
    /// Clusters farther than this RTT are not candidates.
    #[arg(long, default_value_t = WorldParams::default().max_rtt_ms)]
    pub max_rtt_ms: f64,
    /// Total capacity over total demand.
    #[arg(long, default_value_t = WorldParams::default().headroom)]
    pub headroom: f64,
}

impl WorldShape {
    pub(crate) fn params(&self) -> WorldParams {
        WorldParams {
            map_units: self.map_units,
            clusters: self.clusters,
            seed: self.seed,
            candidates: self.candidates,
            max_per_site: self.max_per_site,
            max_rtt_ms: self.max_rtt_ms,
            headroom: self.headroom,
        }
    }
}

#[derive(Args, Debug)]
struct WorldArgs {
    #[command(flatten)]
    shape: WorldShape,
    /// Where to write the instance (JSON).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct DemoArgs {
    #[command(flatten)]
    shape: WorldShape,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Cold solve of a generated world: median time, proposals, evictions, peak memory, and
    /// the ratio to a trivial pass over the same input.
    Solve(bench::SolveBenchArgs),
}

pub fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Solve(a) => cmd_solve(&a),
        Command::Verify(a) => cmd_verify(&a),
        Command::World(a) => cmd_world(&a),
        Command::Demo(a) => cmd_demo(&a),
        Command::Bench(BenchCommand::Solve(a)) => bench::solve(&a),
    }
}

/// Reads and validates an instance file; errors name the file.
pub fn read_instance(path: &Path, limits: Limits) -> Result<Instance> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_instance(&bytes, limits).with_context(|| format!("{}", path.display()))
}

/// A progress bar on stderr for `len` steps (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({eta} left)")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Generates a world with a progress bar.
pub fn generate_world(params: &WorldParams) -> Result<Instance> {
    let bar = progress(params.map_units as u64, "world");
    let inst = world::generate(params, &|done| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    Ok(inst)
}

/// Writes a file through a temporary sibling and a rename, so a failed write never leaves a
/// half-written file under the real name.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut w = BufWriter::new(file);
    write(&mut w).with_context(|| format!("writing {}", tmp.display()))?;
    w.flush()
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(w);
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn solve_and_report(
    inst: &Instance,
    repair_rounds: u32,
    check: bool,
) -> (cdnmap_mapper::Solution, Summary) {
    let options = SolveOptions {
        max_repair_rounds: repair_rounds,
        ..SolveOptions::default()
    };
    let t = Instant::now();
    let sol = solve(inst, &options);
    let elapsed = t.elapsed();
    let mut summary = Summary::new(inst, &sol.map, &sol.stats, elapsed);
    if check {
        let report = verify::verify(inst, &sol.map);
        summary.verifier_violations = Some(report.violation_count());
        if !report.is_ok() {
            eprintln!("{}", report.describe(inst, 20));
        }
    }
    (sol, summary)
}

fn cmd_solve(a: &SolveArgs) -> Result<ExitCode> {
    let inst = read_instance(&a.instance, a.limits.limits())?;
    let (sol, summary) = solve_and_report(&inst, a.repair_rounds, !a.no_verify);
    println!("{summary}");
    if let Some(out) = &a.out {
        write_atomically(out, |w| Ok(write_assignment(&inst, &sol.map, &summary, w)?))?;
        println!("assignment     {}", out.display());
    }
    Ok(if summary.verifier_violations.unwrap_or(0) > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn cmd_verify(a: &VerifyArgs) -> Result<ExitCode> {
    let inst = read_instance(&a.instance, a.limits.limits())?;
    let bytes = std::fs::read(&a.assignment)
        .with_context(|| format!("reading {}", a.assignment.display()))?;
    let map =
        parse_assignment(&bytes, &inst).with_context(|| format!("{}", a.assignment.display()))?;
    let report = verify::verify(&inst, &map);
    if report.is_ok() {
        println!(
            "ok: {} map units, capacity, conservation, candidates and stability hold",
            inst.unit_count()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{}", report.describe(&inst, a.max_lines));
        Ok(ExitCode::from(1))
    }
}

fn cmd_world(a: &WorldArgs) -> Result<ExitCode> {
    let inst = generate_world(&a.shape.params())?;
    write_atomically(&a.out, |w| Ok(write_instance(&inst, w)?))?;
    println!(
        "wrote {}: {} map units, {} clusters, {} candidates, demand {:.1}",
        a.out.display(),
        inst.unit_count(),
        inst.clusters().len(),
        inst.total_candidates(),
        inst.total_demand()
    );
    Ok(ExitCode::SUCCESS)
}

fn cmd_demo(a: &DemoArgs) -> Result<ExitCode> {
    let inst = generate_world(&a.shape.params())?;
    let (_, summary) = solve_and_report(&inst, SolveOptions::default().max_repair_rounds, true);
    println!("{summary}");
    if summary.verifier_violations.unwrap_or(0) > 0 {
        bail!("the verifier found violations in the demo world's map");
    }
    Ok(ExitCode::SUCCESS)
}
