//! `cdnmap bench ...`: the benchmarks' subcommands, each the arguments and the entry point of a
//! harness in `cdnmap-bench`.

use std::process::ExitCode;

use anyhow::Result;
use cdnmap_bench::{
    cost, dns, edits, follow, loads, n1, overflow, preview, round, serve, soak, solve,
};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Cold solve of a generated world: median time, proposals, evictions, peak memory, and
    /// the ratio to a trivial pass over the same input.
    Solve(solve::SolveBenchArgs),
    /// Resolution of a pre-generated query set against a solved world's map: median lookups
    /// per second on one core, and the ratio to a trivial pass over the same queries.
    Resolve(solve::ResolveBenchArgs),
    /// The service's round with demand reports for every map unit, part by part (estimator,
    /// effective preferences, solve, index, publish, persist): medians and maxima over the
    /// timed warm rounds, peak memory, the store's size.
    Round(round::RoundBenchArgs),
    /// The table of reported server loads (a DashMap) against a HashMap behind one mutex:
    /// one report written, every load read, and both at once; medians and the ratio.
    ServerLoads(loads::LoadsBenchArgs),
    /// dnsperf against `cdnmap dns` (following a `cdnmap serve` it starts), against gdnsd with
    /// plugin_geoip answering the same world (a longest-prefix match a query) and against
    /// gdnsd serving a static zone, in turn, on loopback: median queries per second, CPU per
    /// query, latency and peak memory of each, and the ratios against issue 16's targets.
    /// Needs Debian's dnsperf and gdnsd.
    Dns(dns::DnsBenchArgs),
    /// What the stable map leaves in overflow and its latency, against a latency-optimal
    /// fractional map (a linear program over the same candidates, solved in the same run) on
    /// the generated world and on an independently generated one (issue 20).
    Overflow(overflow::OverflowBenchArgs),
    /// `cdnmap serve` on a demo world and one `cdnmap dns` following it, as processes: the time
    /// to the first DNS answer from the map, then a few rounds followed, and each process's
    /// peak resident memory.
    Follow(follow::FollowBenchArgs),
    /// The whole service as processes: `cdnmap serve` and `cdnmap dns` on a demo world with
    /// Feedback reports flowing; each round's parts, memory, the store, a front end joining,
    /// the deltas, DNS queries per second and a restart from the store.
    Serve(serve::ServeBenchArgs),
    /// The whole service held at a steady DNS load: dnsperf at `--load` (0.8) of the front
    /// end's measured peak for `--minutes` (10) while the mapper runs its rounds and Feedback
    /// flows; errors (target 0), latency percentiles, the rounds, and both processes' memory
    /// a minute (flat?). Needs Debian's dnsperf.
    Soak(soak::SoakBenchArgs),
    /// Topology edits through the service's writer and store, in process: cluster-state
    /// changes with rounds between them, cluster and map-unit upserts; each kind's
    /// acknowledgement time, the store's size after them, and a restart on that store.
    Edits(edits::EditsBenchArgs),
    /// Admin.Preview's work in process: a world solved cold then warm (the map in service),
    /// then previews of draining its busiest cluster, each part timed (the rounds' solve, the
    /// diff, the figures): medians, the ratio to the warm round's time, peak memory.
    Preview(preview::PreviewBenchArgs),
    /// The N-1 view's work: the sweep over every cluster and site of a world's map in service
    /// (median, peak memory), the worst losses estimated against the rounds' own preview, and
    /// warm rounds alone against beside sweeps at nice 10.
    N1(n1::N1BenchArgs),
    /// The cost policy's trade (issue 46): a price on every cluster of a generated world, and
    /// for each cost weight a cold round's scores and solve timed against no policy, the
    /// map's mean RTT and cost, the verifier and the latency guard; `--svg` draws the curve.
    Cost(cost::CostBenchArgs),
}

/// Runs one benchmark.
pub fn run(c: BenchCommand) -> Result<ExitCode> {
    match c {
        BenchCommand::Solve(a) => solve::solve(&a),
        BenchCommand::Resolve(a) => solve::resolve(&a),
        BenchCommand::Round(a) => round::round(&a),
        BenchCommand::Preview(a) => preview::preview(&a),
        BenchCommand::N1(a) => n1::n1(&a),
        BenchCommand::Cost(a) => cost::cost(&a),
        BenchCommand::ServerLoads(a) => loads::server_loads(&a),
        BenchCommand::Dns(a) => dns::dns(&a),
        BenchCommand::Overflow(a) => overflow::overflow(&a),
        BenchCommand::Follow(a) => follow::follow(&a),
        BenchCommand::Serve(a) => serve::serve(&a),
        BenchCommand::Soak(a) => soak::soak(&a),
        BenchCommand::Edits(a) => edits::edits(&a),
    }
}
