//! `cdnmap bench serve`: the whole service, as processes on loopback. Starts the real `cdnmap
//! serve` on a demo world and one `cdnmap dns` following it (every server on port 0, found
//! through the `listening` lines of their logs), then, while Feedback reports flow at a steady
//! rate, follows the rounds and prints, over the counted rounds, the medians and maxima of
//! each round's parts as the mapper logs them (its `round parts` and `round published` lines:
//! the same figures as `/metrics`' `cdnmap_round_part_seconds`, but per round); the time to
//! the first published map; the peak resident memory (`VmHWM`) of the mapper and of the front
//! ends; the store's size on disk; the time a second front end, started late, takes to join
//! (the whole map over WatchMap); the size of each round's delta, seen by a WatchMap client of
//! its own behind a byte-counting TCP relay; DNS queries per second during the rounds (dnsperf
//! when it is installed, else a small generator of this file's own); and, after a `kill -9`
//! of the mapper and a start on the same store, the time to the first DNS answer from the
//! stored map.
//!
//! The reports: every demand sample is one map unit's demand over one period (its configured
//! demand with ±`noise`% of noise), the units taken in turn, `--report-rate` samples a second
//! in a report every 100 ms (default: every unit once a cycle, as a fleet of front ends that
//! counted every unit would); with every map version, as soon as the bench's own WatchMap
//! client has it, the load of every resource node as that map puts it there with the
//! configured demand and coefficients (what the estimator predicts, so nothing is derated by
//! the bench's own numbers). The front ends' own demand reports are off unless
//! `--front-end-reports` (their counts of dnsperf's queries would read as the whole demand of
//! the units the bench did not report in a period).
//!
//! Every child process is killed when the bench ends, however it ends (a guard's `Drop`;
//! Ctrl-C and SIGTERM make the waiting loops fail, which drops it).

use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use cdnmap_mapper::{Instance, UnitIdx};
use cdnmap_proto::v1 as pb;
use cdnmap_proto::MAX_REPORT_SAMPLES;
use cdnmap_serve::watch::{Applied, Follower};
use cdnmap_serve::ServingMap;
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::dns::parse_dnsperf;
use crate::dns_query::{answers, write_queries};
use crate::procs::{cpu_secs, out_dir, program, spawn, Proc};
use cdnmap_world::world::WorldParams;

// The parts are the crate's: `bench soak` runs the same service with them.
pub(crate) mod dns_load;
pub(crate) mod log;
pub(crate) mod phases;
pub(crate) mod print;
pub(crate) mod procs;
pub(crate) use procs::dir_size;
pub(crate) mod relay;
pub(crate) mod reports;

use dns_load::*;
use log::*;
use phases::*;
use print::*;
use procs::*;
use relay::*;
use reports::*;

#[derive(Args, Debug)]
pub struct ServeBenchArgs {
    /// Map units of the demo world the mapper serves.
    #[arg(long, default_value_t = 100_000)]
    pub map_units: usize,
    /// Clusters of the demo world.
    #[arg(long, default_value_t = 200)]
    pub clusters: usize,
    /// The world's seed (also the reports' and the query file's).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Rounds counted (at least 10), after the first round whose whole period had reports.
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// The mapper's cycle, in seconds.
    #[arg(long, default_value_t = 10)]
    pub cycle_secs: u64,
    /// Demand samples per second sent through Feedback.ReportDemand (0: none); default: every
    /// map unit once a cycle.
    #[arg(long)]
    pub report_rate: Option<u64>,
    /// Noise on each reported demand, in percent of the unit's configured demand.
    #[arg(long, default_value_t = 5.0)]
    pub noise: f64,
    /// Queries per second the DNS load sends at most during the rounds (0: as many as are
    /// answered).
    #[arg(long, default_value_t = 0)]
    pub dns_qps: u64,
    /// Leave the front ends' own demand reports on (every 10 s, their default). Off by
    /// default (`--report-secs 3600`): the bench's reports stand for a whole fleet's, and a
    /// front end's count of dnsperf's queries (a few for a unit the bench reports hundreds
    /// for) would be taken as a unit's whole demand in a period the bench did not report it in.
    #[arg(long)]
    pub front_end_reports: bool,
    /// ECS queries in the DNS load's query file (drawn by demand from the served world).
    #[arg(long, default_value_t = 100_000)]
    pub queries: usize,
    /// Longest wait for any one step (the first map, a front end's answer, a round), seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout_secs: u64,
    /// Keep the configurations, the store, the logs and the query file here (default: a
    /// temporary directory, removed at the end).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The cdnmap binary to start as `serve` and `dns` (default: this one): another build, to
    /// measure a baseline in the same session.
    #[arg(long)]
    pub exe: Option<PathBuf>,
}

/// The fewest counted rounds (medians over fewer say little).
pub(crate) const MIN_ROUNDS: usize = 10;

/// The most counted rounds.
const MAX_ROUNDS: usize = 1_000;

/// The most demand samples a second: a report of at most `MAX_REPORT_SAMPLES` every tick.
const MAX_REPORT_RATE: u64 = 1_000_000;

/// A demand report every tick.
const REPORT_TICK: Duration = Duration::from_millis(100);

/// The most demand reports in flight at once.
const MAX_REPORTS_IN_FLIGHT: usize = 4;

/// The longest a Feedback call may take before it counts as failed.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the waiting loops look at the logs and the processes.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// A progress line at least this often while waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// The most WatchMap messages the bench's own client keeps figures of.
const MAX_UPDATES: usize = 100_000;

/// The most connections the byte-counting relay takes.
const MAX_RELAY_CONNECTIONS: usize = 16;

/// The most queries in the query file.
const MAX_QUERIES: usize = 10_000_000;

/// Queries outstanding in the built-in DNS load generator.
const OWN_LOAD_WINDOW: usize = 200;

/// Set by Ctrl-C or SIGTERM: the waiting loops fail, and the guard kills the children.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Refuses arguments out of their bounds; returns the report rate to use.
pub(crate) fn check_args(a: &ServeBenchArgs) -> Result<u64> {
    if a.map_units == 0 || a.clusters == 0 {
        bail!("--map-units and --clusters must be at least 1");
    }
    if !(MIN_ROUNDS..=MAX_ROUNDS).contains(&a.rounds) {
        bail!(
            "--rounds {}: must be in {MIN_ROUNDS}..={MAX_ROUNDS} (medians over at least {MIN_ROUNDS} rounds)",
            a.rounds
        );
    }
    let cycles = cdnmap_api::config::CYCLE_SECS;
    if !cycles.contains(&a.cycle_secs) {
        bail!(
            "--cycle-secs {}: outside {}..={} (the service's range)",
            a.cycle_secs,
            cycles.start(),
            cycles.end()
        );
    }
    let rate = a
        .report_rate
        .unwrap_or((a.map_units as u64).div_ceil(a.cycle_secs));
    if rate > MAX_REPORT_RATE {
        bail!(
            "--report-rate {rate}: at most {MAX_REPORT_RATE} samples a second (a report of at most \
             {MAX_REPORT_SAMPLES} every {REPORT_TICK:?}){}",
            if a.report_rate.is_none() { "; the default is --map-units / --cycle-secs, give a lower rate" } else { "" }
        );
    }
    if !(a.noise.is_finite() && (0.0..=50.0).contains(&a.noise)) {
        bail!("--noise {}: must be in [0, 50]", a.noise);
    }
    if a.queries == 0 || a.queries > MAX_QUERIES {
        bail!("--queries {}: must be in 1..={MAX_QUERIES}", a.queries);
    }
    if a.timeout_secs == 0 || a.timeout_secs > 24 * 3600 {
        bail!("--timeout-secs {}: must be in 1..=86400", a.timeout_secs);
    }
    if let Some(exe) = &a.exe {
        if !exe.is_file() {
            bail!("--exe {}: no such file", exe.display());
        }
    }
    Ok(rate)
}

pub(crate) fn now_unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// The command.

/// The world the mapper serves (generated here the same way, for the reports) and the DNS
/// load's query file from it.
pub(crate) fn prepare_world(a: &ServeBenchArgs, dir: &Path) -> Result<(Arc<Instance>, PathBuf)> {
    let t = Instant::now();
    let params = WorldParams {
        map_units: a.map_units,
        clusters: a.clusters,
        seed: a.seed,
        ..WorldParams::default()
    };
    let inst = crate::progress::generate_world(&params)?;
    let queries = dir.join("queries.bin");
    let (n_a, n_aaaa) = write_queries(&inst, a.queries, a.seed, &queries, Default::default())?;
    eprintln!(
        "world: {} map units, {} clusters, {} resource nodes, generated here too in {:.1} s (for \
         the reports), and {} ECS queries ({n_a} A, {n_aaaa} AAAA) in {}",
        inst.unit_count(),
        inst.clusters().len(),
        inst.node_count(),
        t.elapsed().as_secs_f64(),
        a.queries,
        queries.display()
    );
    Ok((Arc::new(inst.instance), queries))
}

/// Ctrl-C or SIGTERM: the waiting loops fail (and the children are killed on the way out).
async fn watch_signals() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => drop(s.recv().await),
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// The phases, in order; the children are killed by the caller's guard.
fn run(
    ctx: &mut Ctx,
    rt: &tokio::runtime::Runtime,
    inst: Arc<Instance>,
    rate: u64,
    queries: &Path,
) -> Result<()> {
    let a = ctx.a;
    eprintln!(
        "bench serve: {} map units, {} clusters, cycle {} s, {} counted rounds; files in {}",
        a.map_units,
        a.clusters,
        a.cycle_secs,
        a.rounds,
        ctx.dir.display()
    );
    let conf = write_serve_config(a, &ctx.dir, "serve.toml", None)?;
    let mut mapper = start_mapper(ctx, &conf, "serve.log")?;
    let secs = |t: f64, from: f64| (t - from) / 1e3;
    let first = rounds_of(&mapper.log.events).first().copied();
    let first_map_s = first.map_or(f64::NAN, |r| secs(r.at_ms, mapper.spawned_ms));
    let first_persist_ms = first.map_or(f64::NAN, |r| r.parts[5]);
    let listening_s = mapper
        .log
        .listening()
        .map_or(f64::NAN, |(t, _)| secs(t, mapper.spawned_ms));
    eprintln!("first map published {first_map_s:.1} s after the mapper's start");
    let store_first = dir_size(&ctx.dir.join("data"));
    let mut front = start_front(ctx, mapper.grpc, ("dns.log", "cdnmap dns"), &mut || {})?;
    let (watched, join) = start_watcher(ctx, rt, mapper.grpc)?;
    let stats = Arc::new(ReportStats::default());
    let c = run_rounds(
        ctx,
        rt,
        &mut mapper,
        &front,
        (&inst, &watched, &stats, rate),
        queries,
    )?;
    wait_followed(
        ctx,
        &mut front,
        &watched,
        c.rounds.last().map_or(0, |r| r.version),
    )?;
    let pid = |i| ctx.kids.pid(i);
    let peaks = [pid(mapper.idx), pid(front.idx), pid(c.late.idx)].map(peak_rss_mb);
    let store_after = dir_size(&ctx.dir.join("data"));
    let record_after = dir_size(&ctx.dir.join("data").join("reports"));
    let values_after = store_values(&ctx.dir.join("data").join("values"));
    let versions = new_rounds(&mut mapper.log, None)
        .last()
        .map_or(0, |r| r.version);
    let counted =
        c.rounds.first().map_or(0, |r| r.version)..=c.rounds.last().map_or(0, |r| r.version);
    let deltas = lock(&watched.updates)
        .iter()
        .filter(|u| !u.full && counted.contains(&u.version))
        .copied()
        .collect();
    let f = Figures {
        first_map_s,
        listening_s,
        store_first,
        store_after,
        record_after,
        values_after,
        versions,
        join,
        front: (
            secs(front.in_use_ms, front.spawned_ms),
            secs(front.answer_ms, front.spawned_ms),
        ),
        late: (
            secs(c.late.in_use_ms, c.late.spawned_ms),
            secs(c.late.answer_ms, c.late.spawned_ms),
        ),
        peaks,
        deltas,
        units: inst.unit_count(),
        lags: {
            front.log.poll();
            front_lags(&c.rounds, &front.log)
        },
        first_persist_ms,
    };
    let first_log = std::mem::replace(&mut mapper.log, LogTail::new(PathBuf::new()));
    let r = restart(ctx, &mut mapper, &mut front, versions)?;
    print_report(
        ctx,
        (&c, &f, &stats, &r),
        &first_log,
        &[&mapper.log, &front.log, &c.late.log, &r.fresh.log],
    );
    Ok(())
}

/// The report on stdout: the setting, the counted rounds, the service's figures, the restart,
/// and what the logs say (`first_log`: the mapper's before the restart).
fn print_report(
    ctx: &Ctx,
    (c, f, stats, r): (&Counted, &Figures, &ReportStats, &Restart),
    first_log: &LogTail,
    fronts: &[&LogTail],
) {
    let a = ctx.a;
    println!();
    println!(
        "bench serve: {} map units, {} clusters, cycle {} s, binary {}; the front ends' own \
         demand reports {}",
        a.map_units,
        a.clusters,
        a.cycle_secs,
        ctx.exe.display(),
        if a.front_end_reports {
            "on (every 10 s)"
        } else {
            "off (--report-secs 3600)"
        }
    );
    print_rounds(a, c);
    print_service(a, f, c, stats);
    print_restart(r);
    print_logs(first_log, fronts);
}

pub fn serve(a: &ServeBenchArgs) -> Result<ExitCode> {
    let rate = check_args(a)?;
    with_service(a, "cdnmap-bench-serve-", |ctx, rt, inst, queries| {
        run(ctx, rt, inst, rate, queries)
    })
}

/// What a bench of the whole service (`bench serve`, `bench soak`) runs in: the files'
/// directory (`a.out` or a temporary one named after `prefix`), the service's own checks of
/// its settings (first), the world and the query file, a runtime that turns Ctrl-C and
/// SIGTERM into a failure of the waiting loops; then `body`, and every child it started
/// killed however it ends.
pub(crate) fn with_service(
    a: &ServeBenchArgs,
    prefix: &str,
    body: impl FnOnce(&mut Ctx, &tokio::runtime::Runtime, Arc<Instance>, &Path) -> Result<()>,
) -> Result<ExitCode> {
    let (dir, scratch) = out_dir(a.out.as_deref(), prefix)?;
    // The service's own checks of its settings (the demo world's limits among them), first.
    cdnmap_api::Config::from_toml(&serve_config(a, &dir, None))
        .context("the mapper's settings from these arguments")?;
    let exe = match &a.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe().context("finding the cdnmap binary")?,
    };
    let (inst, queries) = prepare_world(a, &dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.spawn(watch_signals());
    let mut ctx = Ctx {
        a,
        exe,
        dir,
        kids: Children::default(),
        timeout: Duration::from_secs(a.timeout_secs),
    };
    let result = body(&mut ctx, &rt, inst, &queries);
    drop(ctx); // kills the children before the temporary directory goes
    rt.shutdown_timeout(Duration::from_secs(5));
    if result.is_ok() {
        scratch.done();
    }
    result.map(|()| ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARTS: &str = "\u{1b}[2m2026-12-01T15:16:37.934408Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \
        \u{1b}[2mcdnmap_api::service\u{1b}[0m\u{1b}[2m:\u{1b}[0m round parts \
        \u{1b}[3mestimator_ms\u{1b}[0m\u{1b}[2m=\u{1b}[0m0.5 effective_ms=1 solve_ms=2.5 \
        index_ms=3 publish_ms=4 persist_ms=5.25";
    const PUBLISHED: &str = "2026-12-01T15:16:37.934504Z  INFO cdnmap_api::service: round \
        published epoch=1 version=2 solve_ms=11.5 churn=5.8e-16 overflow=12045.9";

    #[test]
    fn log_lines_are_read_with_their_times() {
        let parts = strip_ansi(PARTS);
        assert!(!parts.contains('\u{1b}'));
        assert_eq!(
            parse_event(&parts),
            Some(Event::Parts([0.5, 1.0, 2.5, 3.0, 4.0, 5.25], false))
        );
        let beside = parts.replace("round parts ", "round parts (persist ran beside index) ");
        assert_eq!(
            parse_event(&beside),
            Some(Event::Parts([0.5, 1.0, 2.5, 3.0, 4.0, 5.25], true))
        );
        assert_eq!(
            parse_event(PUBLISHED),
            Some(Event::Published {
                epoch: 1,
                version: 2,
                step_ms: 11.5,
                churn: 5.8e-16
            })
        );
        // 2026-12-01 is day 20,788 since 1970-01-01.
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2026, 12, 1), 20_788);
        let t = line_time_ms(PUBLISHED).expect("a time");
        let want = (20_788.0 * 86_400.0 + 15.0 * 3600.0 + 16.0 * 60.0 + 37.934504) * 1e3;
        assert!((t - want).abs() < 1e-3, "{t} vs {want}");
        assert_eq!(line_time_ms("no time here"), None);
        let listening = "2026-12-01T15:16:27.929833Z  INFO cdnmap_api::server: listening \
            grpc=127.0.0.1:44071 http=127.0.0.1:32905";
        assert_eq!(
            parse_event(listening),
            Some(Event::Listening {
                grpc: "127.0.0.1:44071".parse().ok(),
                http: "127.0.0.1:32905".parse().ok(),
                dns: None,
                metrics: None,
            })
        );
        let in_use = "2026-12-01T15:16:46.514886Z  INFO cdnmap_dns: map version in use \
            epoch=1 version=2 units=2000 map_mb=0";
        assert_eq!(
            parse_event(in_use),
            Some(Event::InUse {
                epoch: 1,
                version: 2
            })
        );
        // A line missing a field is not an event, never a panic.
        assert_eq!(parse_event("x round parts estimator_ms=1"), None);
        assert_eq!(parse_event("x round published epoch=one"), None);
    }

    #[test]
    fn rounds_pair_parts_with_the_publication_after_them() {
        let events: Vec<(f64, Event)> = [strip_ansi(PARTS), PUBLISHED.to_string()]
            .iter()
            .map(|l| {
                (
                    line_time_ms(l).unwrap_or(0.0),
                    parse_event(l).expect("an event"),
                )
            })
            .collect();
        let rounds = rounds_of(&events);
        assert_eq!(rounds.len(), 1);
        assert_eq!(rounds[0].version, 2);
        assert!((rounds[0].total_ms() - (11.5 + 4.0 + 5.25)).abs() < 1e-9);
        // A publication without parts before it (a restored map) is no round.
        assert!(rounds_of(&events[1..]).is_empty());
    }

    #[test]
    fn metrics_and_medians() {
        let page = "# TYPE x gauge\ncdnmap_map_stored_version 12\ncdnmap_map_stored_epoch 1\n";
        assert_eq!(metric(page, "cdnmap_map_stored_version"), Some(12.0));
        assert_eq!(metric(page, "cdnmap_map_stored"), None);
        let labelled =
            "cdnmap_rounds_total 7\ncdnmap_feedback_refused_total{reason=\"budget\"} 2\n\
                        cdnmap_feedback_refused_total{reason=\"sources\"} 1\n";
        assert_eq!(
            metric_series(labelled, "cdnmap_feedback_refused_total"),
            vec![
                ("{reason=\"budget\"}".to_string(), 2.0),
                ("{reason=\"sources\"}".to_string(), 1.0)
            ]
        );
        assert_eq!(
            metric_series(labelled, "cdnmap_rounds_total"),
            vec![(String::new(), 7.0)]
        );
        assert!(metric_series(labelled, "cdnmap_rounds").is_empty());
        assert_eq!(median_max(vec![3.0, 1.0, 2.0]), (2.0, 3.0));
        assert_eq!(median_max(vec![4.0, 1.0, 2.0, 3.0]), (2.5, 4.0));
        assert!(median_max(Vec::new()).0.is_nan());
    }
}
