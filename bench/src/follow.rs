//! `cdnmap bench follow`: what a DNS front end costs to follow a big map. Starts `cdnmap serve`
//! on a demo world and one `cdnmap dns` following it, as processes on loopback, and measures
//! the time until the front end first answers from the map (the mapper's first round and the
//! whole map over WatchMap), then follows the rounds that come, and prints each process's peak
//! resident memory (the kernel's `VmHWM`) and its resident memory at the end.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::dns::{spawn_mapper_and_front_end, DemoWorld};
use crate::dns_query::answers;
use crate::procs::{check_running, free_port, memory_mb, out_dir};

#[derive(Args, Debug)]
pub struct FollowBenchArgs {
    /// Map units of the demo world the mapper serves.
    #[arg(long, default_value_t = 100_000)]
    pub map_units: usize,
    /// Clusters of the demo world.
    #[arg(long, default_value_t = 200)]
    pub clusters: usize,
    /// The world's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Map versions to follow after the first (each a WatchMap delta).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// The mapper's cycle, in seconds.
    #[arg(long, default_value_t = 10)]
    pub cycle_secs: u64,
    /// Longest wait for the first answer, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Keep the configuration, store and logs here (default: a temporary directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The cdnmap binary to start as `serve` and `dns` (default: this one): an older build, to
    /// measure a baseline in the same session.
    #[arg(long)]
    pub exe: Option<PathBuf>,
}

/// How many map versions the front end's log says it took into use.
fn versions_in_use(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.matches("map version in use").count())
        .unwrap_or(0)
}

pub fn follow(a: &FollowBenchArgs) -> Result<ExitCode> {
    if a.map_units == 0 || a.clusters == 0 {
        bail!("--map-units and --clusters must be at least 1");
    }
    let cycles = cdnmap_api::config::CYCLE_SECS;
    if !cycles.contains(&a.cycle_secs) {
        bail!(
            "--cycle-secs {} is outside {}..={} (the service's range)",
            a.cycle_secs,
            cycles.start(),
            cycles.end()
        );
    }
    let (dir, scratch) = out_dir(a.out.as_deref(), "cdnmap-bench-follow-")?;
    let exe = match &a.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe().context("finding the cdnmap binary")?,
    };
    let ports = (free_port()?, free_port()?, free_port()?);
    let world = DemoWorld {
        map_units: a.map_units,
        clusters: a.clusters,
        seed: a.seed,
        cycle_secs: a.cycle_secs,
    };
    eprintln!(
        "bench follow: {} map units, {} clusters, cycle {} s; logs in {}",
        a.map_units,
        a.clusters,
        a.cycle_secs,
        dir.display()
    );
    let started = Instant::now();
    let (mut serve, mut front, dns_addr) =
        spawn_mapper_and_front_end(&exe, &dir, &world, ports, &[])?;
    let dns_log = dir.join("dns.log");
    let timeout = Duration::from_secs(a.timeout_secs);
    while !answers(dns_addr, "cdn.example.") {
        check_running(&mut [&mut serve, &mut front], &dir)?;
        if started.elapsed() > timeout {
            bail!(
                "no answer within {timeout:?}; see the logs in {}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let first = started.elapsed();
    let joined = versions_in_use(&dns_log);
    eprintln!("first answer after {:.1} s", first.as_secs_f64());
    // Follow the rounds that come.
    let follow_started = Instant::now();
    let limit = Duration::from_secs(a.cycle_secs * 3 * (a.rounds as u64 + 1) + 60);
    while versions_in_use(&dns_log) < joined + a.rounds {
        check_running(&mut [&mut serve, &mut front], &dir)?;
        if follow_started.elapsed() > limit {
            bail!(
                "{} of {} map versions followed within {limit:?}; see the logs in {}",
                versions_in_use(&dns_log) - joined,
                a.rounds,
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let followed = versions_in_use(&dns_log) - joined;
    let (serve_peak, serve_now) = memory_mb(serve.0.id()).context("reading the mapper's memory")?;
    let (dns_peak, dns_now) = memory_mb(front.0.id()).context("reading the front end's memory")?;
    println!(
        "bench follow: {} map units, {} clusters, {} map versions followed after the first",
        a.map_units, a.clusters, followed
    );
    println!(
        "  first DNS answer from the map: {:.1} s after start (the mapper's first round, \
         then the whole map over WatchMap)",
        first.as_secs_f64()
    );
    println!("  cdnmap serve: peak RSS {serve_peak:.0} MB, now {serve_now:.0} MB");
    println!("  cdnmap dns:   peak RSS {dns_peak:.0} MB, now {dns_now:.0} MB");
    drop((front, serve)); // killed before their directory goes
    scratch.done();
    Ok(ExitCode::SUCCESS)
}
