//! Command-line parsing: the commands and their arguments, each run by its module under
//! `cmd` (or `bench`, `store_cmd`, `ring`, `simulate`).

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::cmd::record::RecordCommand;
use crate::cmd::world::ImportCommand;
use crate::cmd::{dns, monitor, record, replay, serve, solve, world};

#[derive(Parser, Debug)]
#[command(name = "cdnmap", version, about = "CDN mapping control plane")]
struct Cli {
    /// How `serve`, `dns` and `monitor` log: text (coloured only on a terminal, and never with
    /// NO_COLOR set) or json (one object a line). Default: $CDNMAP_LOG_FORMAT, else text.
    #[arg(long, global = true, value_name = "text|json")]
    log_format: Option<crate::cmd::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the mapper: a mapping round every cycle, gRPC for DNS front ends (Mapping,
    /// Feedback, Admin, health, reflection), /metrics. Without --config: the demo world on
    /// 127.0.0.1 (gRPC 50051, HTTP 8080).
    Serve(serve::ServeArgs),
    /// Run an authoritative DNS front end: answers A/AAAA for the zone from a local copy of
    /// the mapper's map (kept by WatchMap), with EDNS Client Subnet, and reports demand.
    Dns(dns::DnsArgs),
    /// Run a health monitor: probes the clusters' addresses the mapper names (its
    /// `[health]`) and reports its verdicts through Feedback's ReportHealth every interval;
    /// with several monitors the mapper decides by quorum.
    Monitor(monitor::MonitorArgs),
    /// Solve an instance file: print a summary and write the assignment.
    Solve(solve::SolveArgs),
    /// Check an assignment against its instance (capacity, conservation, candidates,
    /// stability); exits 1 on any violation.
    Verify(solve::VerifyArgs),
    /// Generate a realistic world from real city and site coordinates.
    World(world::WorldArgs),
    /// Generate the demo world, solve it, verify it and print the summary.
    Demo(solve::DemoArgs),
    /// Benchmarks that print medians and quality figures.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// Replay a demand trace through the estimator and the mapper, round by round on a
    /// simulated clock, and write a report (report.md, rounds.csv, SVG plots).
    Replay(replay::ReplayArgs),
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
    /// Map versions compared: `cdnmap map diff --data-dir D A B` is `cdnmap store diff`.
    #[command(subcommand)]
    Map(MapCommand),
    /// In-cluster server selection at work: place servers and keys, add or remove a server,
    /// and print each policy's max/avg load, the keys moved, and ring lookups per second.
    Ring(crate::ring::RingArgs),
    /// Reproduce the load-balancing results the second level rests on, with the project's own
    /// selection code: balls-into-bins with d choices, Go-With-The-Winner, hashing policies.
    /// Each prints a table and writes CSV and SVG (docs/simulate.md).
    #[command(subcommand)]
    Simulate(crate::simulate::SimulateCommand),
}

#[derive(clap::Subcommand, Debug)]
pub enum MapCommand {
    /// Compare two stored map versions (the same as `cdnmap store diff`): the demand the newer
    /// places where the older did not, between which clusters, and the units whose answers
    /// changed.
    Diff(crate::store_cmd::DiffArgs),
}

pub fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    crate::cmd::set_log_format(cli.log_format)?;
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
        Command::Serve(a) => serve::cmd_serve(&a),
        Command::Dns(a) => dns::cmd_dns(a),
        Command::Monitor(a) => monitor::cmd_monitor(a),
        Command::Replay(a) => replay::cmd_replay(&a),
        Command::Record(RecordCommand::Export(a)) => record::cmd_export(&a),
        Command::Store(c) => crate::store_cmd::run(&c),
        Command::Map(MapCommand::Diff(a)) => {
            crate::store_cmd::run(&crate::store_cmd::StoreCommand::Diff(a))
        }
        Command::Import(ImportCommand::Czf(a)) => world::cmd_import_czf(&a),
        Command::Solve(a) => solve::cmd_solve(&a),
        Command::Verify(a) => solve::cmd_verify(&a),
        Command::World(a) => world::cmd_world(&a),
        Command::Demo(a) => solve::cmd_demo(&a),
        Command::Bench(c) => crate::bench::run(c),
        Command::Ring(a) => crate::ring::run(&a).map(|()| ExitCode::SUCCESS),
        Command::Simulate(c) => crate::simulate::run(&c).map(|()| ExitCode::SUCCESS),
    }
}
