//! Command-line parsing and the file-handling subcommands.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cdnmap_mapper::{
    churn, favour_incumbents, solve, solve_seeded, verify, ClusterState, Instance, Limits, Map,
    SolveOptions, Stickiness, DEFAULT_STICKINESS,
};
use cdnmap_topology::format::{parse_assignment, write_assignment};
use cdnmap_topology::Topology;
use clap::{Args, Parser, Subcommand};

use crate::io::{check_writable, generate_world, progress, read_instance, write_atomically};
use crate::report::Summary;
use cdnmap_world::synth;
use cdnmap_world::world::{self, WorldParams};

#[derive(Parser, Debug)]
#[command(name = "cdnmap", version, about = "CDN mapping control plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the mapper: a mapping round every cycle, gRPC for DNS front ends (Mapping,
    /// Feedback, Admin, health, reflection), /metrics. Without --config: the demo world on
    /// 127.0.0.1 (gRPC 50051, HTTP 8080).
    Serve(ServeArgs),
    /// Run an authoritative DNS front end: answers A/AAAA for the zone from a local copy of
    /// the mapper's map (kept by WatchMap), with EDNS Client Subnet, and reports demand.
    Dns(DnsArgs),
    /// Run a health monitor: probes the clusters' addresses the mapper names (its
    /// `[health]`) and reports its verdicts through Feedback's ReportHealth every interval;
    /// with several monitors the mapper decides by quorum.
    Monitor(MonitorArgs),
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
    Bench(crate::bench::BenchCommand),
    /// Replay a demand trace through the estimator and the mapper, round by round on a
    /// simulated clock, and write a report (report.md, rounds.csv, SVG plots).
    Replay(ReplayArgs),
    /// Bring an operator's existing inputs in as an instance file.
    #[command(subcommand)]
    Import(ImportCommand),
    /// The demand record of a running (or stopped) system.
    #[command(subcommand)]
    Record(RecordCommand),
    /// The map versions a store keeps: list them, or write one as an assignment file (also
    /// beside a running server).
    #[command(subcommand)]
    Store(crate::store_cmd::StoreCommand),
    /// In-cluster server selection at work: place servers and keys, add or remove a server,
    /// and print each policy's max/avg load, the keys moved, and ring lookups per second.
    Ring(crate::ring::RingArgs),
    /// Reproduce the load-balancing results the second level rests on, with the project's own
    /// selection code: balls-into-bins with d choices, Go-With-The-Winner, hashing policies.
    /// Each prints a table and writes CSV and SVG (docs/simulate.md).
    #[command(subcommand)]
    Simulate(crate::simulate::SimulateCommand),
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// The instance (topology, candidates; its demands are the first round's).
    instance: PathBuf,
    /// The trace (JSON Lines, docs/trace.md).
    trace: PathBuf,
    /// The report's directory.
    #[arg(long)]
    out: PathBuf,
    /// Another setting to run beside the default, as NAME:key=value,... with keys stickiness
    /// (a number), learning (on/off) and forecast (on/off); repeatable.
    #[arg(long = "compare", value_name = "SETTING")]
    compare: Vec<String>,
    /// Rounds after which capacity violations are counted as "after warm-up" in the report.
    #[arg(long, default_value_t = 60)]
    warmup: usize,
}

#[derive(Subcommand, Debug)]
enum RecordCommand {
    /// Write the demand record of [--from, --to) as a trace.
    Export(ExportArgs),
}

#[derive(Args, Debug)]
struct ExportArgs {
    /// Start of the period (Unix ms).
    #[arg(long)]
    from: i64,
    /// End of the period (Unix ms, exclusive).
    #[arg(long)]
    to: i64,
    /// Where to write the trace.
    out: PathBuf,
    /// The running server's HTTP address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: std::net::SocketAddr,
    /// The running server's Admin token (`/record` needs it).
    #[arg(long)]
    token: Option<String>,
    /// Read a stopped server's store instead of asking a running one.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The round length the trace declares.
    #[arg(long, default_value_t = 10_000)]
    round_ms: i64,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// The configuration file (TOML; see the api crate's config module). Absent: defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// etcd's client URLs, comma-separated (the config's `etcd`): this mapper is then one
    /// replica of several, and publishes only while it leads. `https://` URLs need the
    /// config's `etcd_ca_file` (and `etcd_cert_file`, `etcd_key_file` for client
    /// certificates).
    #[arg(long, value_delimiter = ',', value_name = "URL[,URL...]")]
    etcd: Vec<String>,
    /// This replica's name among the replicas (the config's `node_id`).
    #[arg(long)]
    node_id: Option<String>,
}

#[derive(Args, Debug)]
struct DnsArgs {
    /// The configuration file (TOML; see the dns crate's config module). The flags below
    /// override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The mapper's gRPC address, e.g. http://127.0.0.1:50051, or several, comma-separated
    /// (the replicas of a highly available mapper: the highest map identity is followed).
    #[arg(long)]
    mapper: Option<String>,
    /// Where to answer DNS, UDP and TCP (port 0: any port free for both; the log's
    /// `listening` line names it).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// A zone to be authoritative for (repeatable; replaces the config's list).
    #[arg(long = "zone", value_name = "ZONE")]
    zones: Vec<String>,
    /// TTL of A/AAAA answers, seconds.
    #[arg(long)]
    ttl: Option<u32>,
    /// The name this front end reports demand under.
    #[arg(long)]
    name: Option<String>,
    /// Seconds between demand reports.
    #[arg(long)]
    report_secs: Option<u64>,
    /// Serve Prometheus /metrics here (queries by outcome, map version, reconnects, reports;
    /// port 0: any free port, named in the log's `listening` line).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// UDP answering loops, each a thread with its own socket (default: one per core).
    #[arg(long)]
    udp_threads: Option<usize>,
    /// Under load (queries closer than this), how long a UDP loop waits between receives so
    /// that each takes a batch, microseconds (default 50; 0: never waits).
    #[arg(long)]
    udp_coalesce_us: Option<u64>,
}

#[derive(Args, Debug)]
struct MonitorArgs {
    /// How to reach the mappers: a `cdnmap dns` configuration file (its `mapper`,
    /// `mapper_ca_file`, `cert_file`, `key_file`, `feedback_token` and `name`; the rest is
    /// not used). The flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The mapper's gRPC address, or several, comma-separated (each is reported to).
    #[arg(long)]
    mapper: Option<String>,
    /// The name this monitor reports under (one of the mapper's `[health] monitors`).
    #[arg(long)]
    name: Option<String>,
}

#[derive(Args, Debug)]
struct SolveArgs {
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
struct RoundArgs {
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
struct Round {
    /// The instance with the command line's cluster states.
    instance: Topology,
    /// The previous map, if any: churn is measured against it.
    previous: Option<Map>,
    /// The effective preferences built from the previous map, when stickiness is on: the
    /// round is then solved warm from the previous map.
    sticky: Option<Instance>,
}

impl Round {
    /// The preferences the solver uses and the verifier checks.
    fn effective(&self) -> &Instance {
        self.sticky.as_ref().unwrap_or(&self.instance)
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
        let sticky = match (&previous, &self.previous) {
            (Some(map), Some(path)) if self.stickiness > 0.0 => Some(
                favour_incumbents(&instance, map, &stickiness)
                    .with_context(|| format!("{} (with {})", path.display(), context()))?,
            ),
            _ => None,
        };
        Ok(Round {
            instance,
            previous,
            sticky,
        })
    }
}

/// Reads an assignment file against `instance`; errors name the file.
pub fn read_assignment(path: &Path, instance: &Instance) -> Result<Map> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_assignment(&bytes, instance).with_context(|| format!("{}", path.display()))
}

#[derive(Args, Debug)]
struct VerifyArgs {
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

#[derive(Subcommand, Debug)]
enum ImportCommand {
    /// An Apache Traffic Control coverage zone file (coverageZones, deepCoverageZones): every
    /// network becomes map units over the clusters of an instance, the group's cluster (from
    /// --groups) first and the others by distance from the zone's coordinates. Prints what
    /// it took, the groups --groups does not name and those it left out.
    Czf(CzfArgs),
}

#[derive(Args, Debug)]
struct CzfArgs {
    /// The coverage zone file (JSON).
    czf: PathBuf,
    /// An instance file whose clusters and classes the map units go over (its own map units
    /// are not taken).
    #[arg(long, value_name = "INSTANCE")]
    clusters: PathBuf,
    /// The mapping of each cache group to its cluster: a TOML file with a [groups] table,
    /// `"group" = "cluster-id"`.
    #[arg(long, value_name = "GROUPS.toml")]
    groups: PathBuf,
    /// The classes of each network's map units and their shares of its demand.
    #[arg(
        long,
        value_name = "CLASS=SHARE,...",
        default_value = "web=0.5,video=0.35,apps=0.15"
    )]
    class_mix: world::ClassMix,
    /// At most this many candidates per map unit.
    #[arg(long, default_value_t = WorldParams::default().candidates)]
    candidates: usize,
    /// Clusters farther than this RTT estimate are not candidates (the group's always is).
    #[arg(long, default_value_t = WorldParams::default().max_rtt_ms)]
    max_rtt_ms: f64,
    /// Where to write the instance.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "json")]
    format: crate::io::InstanceFormat,
}

/// The groups file of `import czf`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupsFile {
    groups: std::collections::BTreeMap<String, String>,
}

/// The largest coverage zone or groups file read (a full CDN's zone file is tens of MB).
const MAX_IMPORT_BYTES: u64 = 1 << 30;

fn read_bounded(path: &Path) -> Result<String> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if size > MAX_IMPORT_BYTES {
        bail!(
            "{}: {size} bytes, at most {MAX_IMPORT_BYTES}",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn cmd_import_czf(a: &CzfArgs) -> Result<ExitCode> {
    check_writable(&a.out)?;
    let zones = cdnmap_world::czf::parse(&read_bounded(&a.czf)?, &a.czf.display().to_string())?;
    let groups: GroupsFile = toml::from_str(&read_bounded(&a.groups)?)
        .with_context(|| format!("{}", a.groups.display()))?;
    let base = read_instance(&a.clusters, Limits::default())?;
    let params = cdnmap_world::czf::ZoneParams {
        mix: a.class_mix.clone(),
        candidates: a.candidates,
        max_rtt_ms: a.max_rtt_ms,
    };
    let (inst, report) = cdnmap_world::czf::world_of(&zones, &base, &groups.groups, &params)?;
    write_atomically(&a.out, |w| crate::io::write_instance_as(&inst, a.format, w))?;
    println!(
        "{report}\nwrote {}: {} map units, {} clusters, {} candidates",
        a.out.display(),
        inst.instance.unit_count(),
        inst.instance.clusters().len(),
        inst.instance.total_candidates()
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
struct WorldArgs {
    #[command(flatten)]
    shape: WorldShape,
    /// Write the same world with every demand and score multiplied by an independent factor
    /// in [1 - PCT/100, 1 + PCT/100].
    #[arg(long, value_name = "PCT")]
    perturb: Option<f64>,
    /// Seed of the perturbation (default: the world seed + 1).
    #[arg(long)]
    perturb_seed: Option<u64>,
    /// Where to write the instance.
    #[arg(long)]
    out: PathBuf,
    /// The instance file's format: JSON, or compact (the store's columns in a zstd frame with
    /// a checksum; every command that reads an instance reads either).
    #[arg(long, value_enum, default_value = "json")]
    format: crate::io::InstanceFormat,
    /// Also write a synthetic demand trace of this many hours (fractional allowed, at most
    /// 336) for the written world: a daily rhythm by time zone, noise, a flash crowd, a
    /// cluster failure and true costs above the configured ones (see docs/trace.md). Needs
    /// --out-trace.
    #[arg(long, value_name = "HOURS")]
    trace: Option<f64>,
    /// Where to write the trace (JSON Lines). Needs --trace.
    #[arg(long, value_name = "TRACE.jsonl")]
    out_trace: Option<PathBuf>,
    /// Seed of the trace (default: the world seed + 2).
    #[arg(long)]
    trace_seed: Option<u64>,
    /// Map units from the located networks of this MaxMind DB (GeoIP2/GeoLite2 City, DB-IP
    /// City) instead of generated ones: one per network and class of --class-mix, at the
    /// network's location, with the world's clusters and candidate model (--map-units does
    /// not apply). May be given several times; a network in two files is taken from the first.
    #[arg(long, value_name = "CITY.mmdb")]
    mmdb: Vec<PathBuf>,
    /// With --mmdb: the edge sites the clusters are laid out on, in the format of
    /// data/pop-sites.csv (iata,metro,country,lat,lon,timezone,metro_population). Default:
    /// the built-in 240 sites.
    #[arg(long, value_name = "SITES.csv", requires = "mmdb")]
    sites: Option<PathBuf>,
    /// With --mmdb: the classes of each network's map units and their shares of its demand.
    #[arg(
        long,
        value_name = "CLASS=SHARE,...",
        default_value = "web=0.5,video=0.35,apps=0.15"
    )]
    class_mix: world::ClassMix,
    /// With --mmdb: IPv6 networks longer than this fold into their prefix of this length
    /// (IPv4 ones longer than /24 into their /24).
    #[arg(long, default_value_t = cdnmap_world::mmdb::DEFAULT_V6_FOLD_LEN, value_parser = clap::value_parser!(u8).range(1..=128))]
    v6_fold_len: u8,
    /// Also write the world's networks, each at its location, as a MaxMind DB (what --mmdb
    /// reads: a generated world as a database, for trying the real-data path without a
    /// licensed one).
    #[arg(long, value_name = "OUT.mmdb")]
    write_mmdb: Option<PathBuf>,
}

impl WorldArgs {
    /// The trace to write, if any: `--trace` and `--out-trace` come together.
    fn trace(&self) -> Result<Option<(synth::TraceParams, &Path)>> {
        match (self.trace, &self.out_trace) {
            (Some(hours), Some(path)) => {
                synth::check_hours(hours)?;
                if path == self.out.as_path() {
                    bail!(
                        "--out-trace {} is the instance's --out: give the trace its own file",
                        path.display()
                    );
                }
                let seed = self.trace_seed.unwrap_or(self.shape.seed.wrapping_add(2));
                Ok(Some((synth::TraceParams::new(hours, seed), path)))
            }
            (Some(hours), None) => {
                bail!("--trace {hours} needs --out-trace TRACE.jsonl (where to write the trace)")
            }
            (None, Some(path)) => bail!(
                "--out-trace {} needs --trace HOURS (how long a trace to write)",
                path.display()
            ),
            (None, None) => {
                if self.trace_seed.is_some() {
                    bail!("--trace-seed needs --trace HOURS and --out-trace TRACE.jsonl");
                }
                Ok(None)
            }
        }
    }
}

#[derive(Args, Debug)]
struct DemoArgs {
    #[command(flatten)]
    shape: WorldShape,
}

pub fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    // The front end holds one map version and builds the next beside it: memory it frees goes
    // back to the kernel at once (mimalloc's default), so its resident size is what it holds.
    // Every other command keeps freed memory for the next round (see `alloc`).
    if !matches!(cli.command, Command::Dns(_)) {
        crate::alloc::keep_freed_memory();
        cdnmap_api::memory::on_release(crate::alloc::release_freed);
    }
    if matches!(cli.command, Command::Bench(_)) {
        crate::alloc::enable(); // the benchmarks report peak memory
    }
    match cli.command {
        Command::Serve(a) => cmd_serve(&a),
        Command::Dns(a) => cmd_dns(a),
        Command::Monitor(a) => cmd_monitor(a),
        Command::Replay(a) => cmd_replay(&a),
        Command::Record(RecordCommand::Export(a)) => cmd_export(&a),
        Command::Store(c) => crate::store_cmd::run(&c),
        Command::Import(ImportCommand::Czf(a)) => cmd_import_czf(&a),
        Command::Solve(a) => cmd_solve(&a),
        Command::Verify(a) => cmd_verify(&a),
        Command::World(a) => cmd_world(&a),
        Command::Demo(a) => cmd_demo(&a),
        Command::Bench(c) => crate::bench::run(c),
        Command::Ring(a) => crate::ring::run(&a).map(|()| ExitCode::SUCCESS),
        Command::Simulate(c) => crate::simulate::run(&c).map(|()| ExitCode::SUCCESS),
    }
}

/// Solves a round (warm from the previous map when there is one), verifies the result against
/// the preferences used, and summarises it.
fn solve_and_report(round: &Round, repair_rounds: u32, check: bool) -> (Map, Summary) {
    let options = SolveOptions {
        max_repair_rounds: repair_rounds,
        ..SolveOptions::default()
    };
    let inst = round.effective();
    let t = Instant::now();
    let sol = match (&round.previous, &round.sticky) {
        (Some(previous), Some(effective)) => solve_seeded(effective, previous, &options),
        _ => solve(inst, &options),
    };
    let elapsed = t.elapsed();
    // Quality (RTT, first choice) is judged by the real scores, not the effective ones.
    let mut summary = Summary::new(&round.instance, &sol.map, &sol.stats, elapsed);
    if let Some(previous) = &round.previous {
        summary.churn = Some(churn(&round.instance, previous, &sol.map));
    }
    if check {
        let report = verify::verify(inst, &sol.map);
        summary.verifier_violations = Some(report.violation_count());
        if !report.is_ok() {
            eprintln!("{}", report.describe(inst, 20));
        }
    }
    (sol.map, summary)
}

fn cmd_solve(a: &SolveArgs) -> Result<ExitCode> {
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

fn cmd_verify(a: &VerifyArgs) -> Result<ExitCode> {
    let round = a.round.load(&a.instance)?;
    let inst = round.effective();
    let map = read_assignment(&a.assignment, inst)?;
    let report = verify::verify(inst, &map);
    if report.is_ok() {
        println!(
            "ok: {} map units, capacity, conservation, candidates and stability hold",
            inst.unit_count()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{}", report.describe(inst, a.max_lines));
        Ok(ExitCode::from(1))
    }
}

fn cmd_world(a: &WorldArgs) -> Result<ExitCode> {
    check_writable(&a.out)?;
    let trace = a.trace()?;
    if let Some((params, path)) = &trace {
        params
            .validate()
            .with_context(|| format!("--trace {}", params.hours))?;
        check_writable(path)?;
    }
    if let Some(path) = &a.write_mmdb {
        check_writable(path)?;
    }
    let mut inst = if a.mmdb.is_empty() {
        generate_world(&a.shape.params())?
    } else {
        let source = crate::io::MmdbSource {
            files: a.mmdb.clone(),
            sites: a.sites.clone(),
            class_mix: a.class_mix.clone(),
            v6_fold_len: a.v6_fold_len,
        };
        let bar = progress(0, "world");
        let started = std::time::Instant::now();
        let (inst, summary) = crate::io::mmdb_world(&source, &a.shape.params(), &|done| {
            bar.set_length(done as u64);
            bar.set_position(done as u64)
        })?;
        bar.finish_and_clear();
        println!(
            "{summary}\nmade the world in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        inst
    };
    if let Some(pct) = a.perturb {
        let seed = a.perturb_seed.unwrap_or(a.shape.seed.wrapping_add(1));
        inst = world::perturb(&inst, pct, seed).with_context(|| format!("--perturb {pct}"))?;
    }
    write_atomically(&a.out, |w| crate::io::write_instance_as(&inst, a.format, w))?;
    if let Some(path) = &a.write_mmdb {
        let nets = world::located_networks(&inst);
        // Build epoch 0: the same world gives the same bytes.
        let bytes = cdnmap_world::mmdb::write(&nets, "GeoLite2-City", 0)?;
        write_atomically(path, |w| Ok(std::io::Write::write_all(w, &bytes)?))?;
        println!(
            "wrote {}: {} networks at their locations, {} bytes",
            path.display(),
            nets.len(),
            bytes.len()
        );
    }
    println!(
        "wrote {}: {} map units, {} clusters, {} candidates, demand {:.1}",
        a.out.display(),
        inst.unit_count(),
        inst.clusters().len(),
        inst.total_candidates(),
        inst.total_demand()
    );
    if let Some((params, path)) = &trace {
        let bar = progress(params.rounds(), "trace");
        let mut summary = None;
        write_atomically(path, |w| {
            summary = Some(synth::write_trace(&inst, params, w, &|r| {
                bar.set_position(r)
            })?);
            Ok(())
        })?;
        bar.finish_and_clear();
        let summary = summary.context("the trace writer returned no summary")?;
        println!("wrote {}\n{summary}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Two rounds of a demo world: a cold solve, then the same world with ±5% noise on demand and
/// scores, solved seeded from the first round.
fn cmd_demo(a: &DemoArgs) -> Result<ExitCode> {
    let params = a.shape.params();
    let inst = generate_world(&params)?;
    let repair = SolveOptions::default().max_repair_rounds;
    let first = Round {
        instance: inst.clone(),
        previous: None,
        sticky: None,
    };
    let (m0, s0) = solve_and_report(&first, repair, true);
    println!("round 1: cold solve\n{s0}\n");
    let next = world::perturb(&inst, 5.0, params.seed.wrapping_add(1))?;
    let effective = favour_incumbents(&next, &m0, &Stickiness::default())?;
    let second = Round {
        instance: next,
        previous: Some(m0),
        sticky: Some(effective),
    };
    let (_, s1) = solve_and_report(&second, repair, true);
    println!("round 2: ±5% noise on demand and scores, seeded from round 1 (stickiness {DEFAULT_STICKINESS})\n{s1}");
    if s0.verifier_violations.unwrap_or(0) + s1.verifier_violations.unwrap_or(0) > 0 {
        bail!("the verifier found violations in the demo world's map");
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_serve(a: &ServeArgs) -> Result<ExitCode> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    // SIGHUP's handler first, before the store (which may take a while) is read: SIGHUP
    // reloads, and never kills.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let hangups = hangups(&runtime);
    let mut config = match &a.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            cdnmap_api::Config::from_toml(&text).with_context(|| format!("{}", path.display()))?
        }
        None => cdnmap_api::Config::default(),
    };
    // The flags override the file's keys, and are checked as the file's are.
    if !a.etcd.is_empty() {
        config.etcd = a.etcd.clone();
    }
    if let Some(id) = &a.node_id {
        config.node_id = Some(id.clone());
    }
    config
        .validate()
        .context("the configuration with --etcd and --node-id")?;
    // Checked at every start, not only the first (when the store has no topology yet and the
    // networks are read).
    if let Some(m) = &config.mmdb {
        m.class_mix
            .parse::<world::ClassMix>()
            .with_context(|| format!("the configuration's mmdb.class_mix {:?}", m.class_mix))?;
    }
    // The topology to start from when the store has none (a restart keeps the stored one,
    // with every acknowledged edit, and does not read or generate this).
    let (instance_file, demo) = (config.instance.clone(), config.demo.clone());
    let mmdb = config.mmdb.clone();
    let initial = move || match (&instance_file, &mmdb) {
        (Some(path), _) => read_instance(path, Limits::default()),
        (None, Some(m)) => {
            let source = crate::io::MmdbSource {
                files: m.files.clone(),
                sites: m.sites.clone(),
                class_mix: m.class_mix.parse().context("mmdb.class_mix")?,
                v6_fold_len: m.v6_fold_len,
            };
            let params = WorldParams {
                clusters: m.clusters,
                seed: m.seed,
                ..WorldParams::default()
            };
            let (topology, summary) = crate::io::mmdb_world(&source, &params, &|_| {})?;
            tracing::info!(
                map_units = topology.instance.unit_count(),
                clusters = params.clusters,
                "the world of the [mmdb] networks:\n{summary}"
            );
            Ok(topology)
        }
        (None, None) => {
            let params = WorldParams {
                map_units: demo.map_units,
                clusters: demo.clusters,
                seed: demo.seed,
                ..WorldParams::default()
            };
            tracing::info!(
                map_units = params.map_units,
                clusters = params.clusters,
                "no instance configured: serving the demo world"
            );
            world::generate(&params, &|_| {})
        }
    };
    runtime.block_on(cdnmap_api::server::serve(
        config,
        initial,
        async {
            shutdown_signal().await;
            tracing::info!("shutting down");
        },
        hangups,
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// Logs to stderr at `RUST_LOG`'s level (info by default).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
}

/// A `cdnmap dns` configuration: the file's, or the defaults; checked once the command line's
/// overrides are in (by the caller).
fn dns_config(path: Option<&PathBuf>) -> Result<cdnmap_dns::DnsConfig> {
    Ok(match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            cdnmap_dns::DnsConfig::parse_toml(&text)
                .with_context(|| format!("{}", path.display()))?
        }
        None => cdnmap_dns::DnsConfig::default(),
    })
}

fn cmd_monitor(a: MonitorArgs) -> Result<ExitCode> {
    init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut hup = hangups(&runtime);
    runtime.spawn(async move {
        while hup.changed().await.is_ok() {
            tracing::info!("SIGHUP: nothing to reload (the monitor reads its files at start)");
        }
    });
    let mut config = dns_config(a.config.as_ref())?;
    if let Some(m) = a.mapper {
        config.mapper = m;
    }
    if let Some(n) = a.name {
        config.name = n;
    }
    config.validate().context("the monitor's settings")?;
    let links = config
        .mappers()
        .into_iter()
        .map(|url| cdnmap_dns::MapperLink::new(&config, url))
        .collect::<Result<Vec<_>>>()?;
    tracing::info!(name = %config.name, mappers = links.len(), "monitor started");
    runtime.block_on(crate::monitor::run(
        config.name.clone(),
        links,
        shutdown_signal(),
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_dns(a: DnsArgs) -> Result<ExitCode> {
    init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let hangups = hangups(&runtime);
    let mut config = dns_config(a.config.as_ref())?;
    if let Some(m) = a.mapper {
        config.mapper = m;
    }
    if let Some(l) = a.listen {
        config.listen = l;
    }
    if !a.zones.is_empty() {
        config.zones = a.zones;
    }
    if let Some(t) = a.ttl {
        config.ttl_secs = t;
    }
    if let Some(n) = a.name {
        config.name = n;
    }
    if let Some(r) = a.report_secs {
        config.report_secs = r;
    }
    if let Some(m) = a.metrics_listen {
        config.metrics_listen = Some(m);
    }
    if let Some(n) = a.udp_threads {
        config.udp_threads = Some(n);
    }
    if let Some(us) = a.udp_coalesce_us {
        config.udp_coalesce_us = us;
    }
    config.validate().context("the DNS front end's settings")?;
    runtime.block_on(cdnmap_dns::run(config, shutdown_signal(), hangups))?;
    Ok(ExitCode::SUCCESS)
}

/// SIGHUPs from now on, counted: what a long-running command watches to reload what it can
/// (each says in its log what it reloaded). Installed as a command starts, so a SIGHUP never
/// kills it, even one that comes while the store is read; one that comes before the command
/// watches is seen when it starts to. Without a handler (it could not be installed, or not
/// on Unix) the count never changes.
fn hangups(runtime: &tokio::runtime::Runtime) -> tokio::sync::watch::Receiver<u64> {
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let _entered = runtime.enter();
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                runtime.spawn(async move {
                    while hup.recv().await.is_some() {
                        tx.send_modify(|n| *n += 1);
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler: SIGHUP would stop this process")
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (runtime, tx);
    rx
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutting down");
}

fn cmd_replay(a: &ReplayArgs) -> Result<ExitCode> {
    use crate::replay::{replay, write_report, Setting};
    let instance = read_instance(&a.instance, Limits::default())?;
    let file = File::open(&a.trace).with_context(|| format!("reading {}", a.trace.display()))?;
    let name = a.trace.display().to_string();
    let (header, records) = cdnmap_world::trace::read(std::io::BufReader::new(file), &name)?;
    let mut settings = vec![Setting::default()];
    for spec in &a.compare {
        settings.push(Setting::parse(spec)?);
    }
    let mut results = Vec::with_capacity(settings.len());
    for setting in settings {
        let bar = progress(0, &setting.name);
        let rows = replay(&instance, &header, &records, &setting, &|done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        })
        .with_context(|| format!("{name}: setting {:?}", setting.name))?;
        bar.finish_and_clear();
        let late: usize = rows.iter().skip(a.warmup).map(|r| r.violations).sum();
        println!(
            "{:<14} {} rounds, {} capacity violations after round {}",
            setting.name,
            rows.len(),
            late,
            a.warmup
        );
        results.push((setting, rows));
    }
    write_report(&a.out, &results, a.warmup)?;
    println!("report         {}", a.out.join("report.md").display());
    Ok(ExitCode::SUCCESS)
}

fn cmd_export(a: &ExportArgs) -> Result<ExitCode> {
    if a.to < a.from {
        bail!("--to {} is before --from {}", a.to, a.from);
    }
    if a.round_ms <= 0 {
        bail!("--round-ms must be > 0, got {}", a.round_ms);
    }
    check_writable(&a.out)?;
    let lines = match &a.data_dir {
        Some(dir) => crate::record::read_store(dir, a.from, a.to)?,
        None => crate::record::fetch(a.http, a.token.as_deref(), a.from, a.to)?,
    };
    let (header, records) = crate::record::to_trace(&lines, a.from, a.round_ms)?;
    write_atomically(&a.out, |w| {
        cdnmap_world::trace::write_header(w, &header)?;
        for r in &records {
            cdnmap_world::trace::write_record(w, r)?;
        }
        Ok(())
    })?;
    println!("wrote {}: {} records", a.out.display(), records.len());
    Ok(ExitCode::SUCCESS)
}
