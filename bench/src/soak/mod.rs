//! `cdnmap bench soak` (issue 17, point 7): the whole service held at a steady DNS load for
//! minutes. It starts what `bench serve` starts, with `bench serve`'s code (the real `cdnmap
//! serve` on a demo world and one `cdnmap dns` following it, on loopback, port 0; the bench's
//! own WatchMap client; every child killed however the bench ends), then:
//!
//! 1. **the peak**: dnsperf without a rate limit against the front end for `--peak-secs`, with
//!    `bench dns`'s query file (ECS queries drawn by demand from the served world) and `bench
//!    serve`'s dnsperf options (8 clients, 200 in flight), the mapper running its rounds;
//! 2. **the soak**: dnsperf limited (`-Q`) to `--load` (0.8) of that peak for `--minutes` (10),
//!    in verbose mode (a line per query: [`stream`]), while the mapper runs its rounds every
//!    `--cycle-secs` and Feedback flows: the front end's own demand reports (every 10 s, the
//!    demand of dnsperf's queries) and `bench serve`'s load report with every map version
//!    (and, with `--report-rate`, its demand samples too).
//!
//! It prints the queries sent, answered and lost, the response codes and the errors (lost,
//! SERVFAIL, any code other than NOERROR: the target is 0), the latency's percentiles, the
//! rounds of the soak (their durations, overruns of the cycle), the Feedback reports accepted
//! and refused (the front end's and the mapper's `/metrics`, the bench's own calls), and the
//! resident memory of both processes sampled every second, with a table a minute and a verdict
//! on whether it stayed flat (its end against its value after the first minute).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cdnmap_mapper::Instance;
use clap::Args;

use crate::dns::{parse_dnsperf, Run};
use crate::procs::memory_mb;
use crate::procs::{cpu_secs, program, Proc};
use crate::serve::dns_load::{dnsperf_args, finish_dns_load, start_dns_load, DnsFigures};
use crate::serve::log::{rounds_of, Event, RoundRec};
use crate::serve::phases::{
    start_front, start_mapper, start_reports, start_watcher, Ctx, Front, Mapper,
};
use crate::serve::print::{fmt_mb, median_max, print_logs};
use crate::serve::procs::{http_get, metric_series, write_serve_config};
use crate::serve::reports::ReportStats;
use crate::serve::{
    check_args as check_service_args, dir_size, lock, now_unix_ms, with_service, ServeBenchArgs,
    MIN_ROUNDS,
};

mod print;
mod stream;

use print::*;
use stream::*;

#[derive(Args, Debug)]
pub struct SoakBenchArgs {
    /// Map units of the demo world the mapper serves.
    #[arg(long, default_value_t = 30_000)]
    pub map_units: usize,
    /// Clusters of the demo world.
    #[arg(long, default_value_t = 120)]
    pub clusters: usize,
    /// The world's seed (also the query file's).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Minutes of the soak at `--load` of the peak (fractions allowed: 0.1 is 6 s).
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// The soak's query rate, as a share of the peak measured first (dnsperf's `-Q`).
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    /// Seconds of the peak measurement (dnsperf without a rate limit).
    #[arg(long, default_value_t = 15)]
    pub peak_secs: u64,
    /// The mapper's cycle, in seconds.
    #[arg(long, default_value_t = 10)]
    pub cycle_secs: u64,
    /// Demand samples a second the bench sends through Feedback.ReportDemand besides the front
    /// end's own reports (default none: the front end's reports are the demand of dnsperf's
    /// queries).
    #[arg(long, default_value_t = 0)]
    pub report_rate: u64,
    /// Noise on each demand sample the bench reports, in percent of the unit's demand.
    #[arg(long, default_value_t = 5.0)]
    pub noise: f64,
    /// ECS queries in dnsperf's query file (drawn by demand from the served world).
    #[arg(long, default_value_t = 100_000)]
    pub queries: usize,
    /// Longest wait for any one step (the first map, a front end's answer, dnsperf's end after
    /// its time), seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Keep the configurations, the store, the logs and dnsperf's output here (default: a
    /// temporary directory, removed at the end).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// The cdnmap binary to start as `serve` and `dns` (default: this one).
    #[arg(long)]
    pub exe: Option<std::path::PathBuf>,
}

/// The longest soak, minutes (a day).
const MAX_MINUTES: f64 = 24.0 * 60.0;

/// The longest peak measurement, seconds.
const MAX_PEAK_SECS: u64 = 600;

/// How often the resident memory is sampled (and the processes checked).
const SAMPLE: Duration = Duration::from_secs(1);

/// A row of the table, and a progress line, this often.
const ROW: Duration = Duration::from_secs(60);

/// The response code every query of the query file should get (its names are all under a
/// hostname rule of the demo world; an AAAA for a class without IPv6 is NOERROR without data).
const EXPECTED_RCODE: &str = "NOERROR";

/// Resident memory is flat when its end is at most this share above its value after the first
/// minute...
const FLAT_SHARE: f64 = 0.05;

/// ... or at most this many MB above it (small processes move by a few pages).
const FLAT_MB: f64 = 5.0;

/// Refuses arguments out of their bounds (the service's with `bench serve`'s checks); returns
/// the soak's length in seconds.
fn check_args(a: &SoakBenchArgs) -> Result<u64> {
    if !(a.minutes.is_finite() && a.minutes > 0.0 && a.minutes <= MAX_MINUTES) {
        bail!(
            "--minutes {}: must be more than 0 and at most {MAX_MINUTES} (a day)",
            a.minutes
        );
    }
    let secs = (a.minutes * 60.0).round() as u64;
    if secs == 0 {
        bail!("--minutes {}: less than a second", a.minutes);
    }
    if !(a.load.is_finite() && a.load > 0.0 && a.load <= 1.0) {
        bail!(
            "--load {}: must be more than 0 and at most 1 (a share of the measured peak)",
            a.load
        );
    }
    if a.peak_secs == 0 || a.peak_secs > MAX_PEAK_SECS {
        bail!(
            "--peak-secs {}: must be in 1..={MAX_PEAK_SECS}",
            a.peak_secs
        );
    }
    check_service_args(&service_args(a))?;
    Ok(secs)
}

/// The service `bench serve` would start for these arguments: the front end's own demand
/// reports on, the bench's demand samples at `--report-rate`.
fn service_args(a: &SoakBenchArgs) -> ServeBenchArgs {
    ServeBenchArgs {
        map_units: a.map_units,
        clusters: a.clusters,
        seed: a.seed,
        rounds: MIN_ROUNDS, // unused: the soak counts the rounds of its minutes
        cycle_secs: a.cycle_secs,
        report_rate: Some(a.report_rate),
        noise: a.noise,
        dns_qps: 0,
        front_end_reports: true,
        queries: a.queries,
        timeout_secs: a.timeout_secs,
        out: a.out.clone(),
        exe: a.exe.clone(),
    }
}

pub fn soak(a: &SoakBenchArgs) -> Result<ExitCode> {
    let secs = check_args(a)?;
    let dnsperf = program("dnsperf")?; // before anything starts
    with_service(
        &service_args(a),
        "cdnmap-bench-soak-",
        |ctx, rt, inst, queries| run(ctx, rt, (a, secs, &dnsperf), inst, queries),
    )
}

/// What the counters say at a moment: the mapper's and the front end's `/metrics`, the store's
/// size, the bench's own Feedback calls.
struct Snapshot {
    mapper: String,
    front: String,
    store: u64,
    load_reports: u64,
    loads: u64,
    demand_samples: u64,
    failed: u64,
}

fn snapshot(http: SocketAddr, front: SocketAddr, dir: &Path, s: &ReportStats) -> Result<Snapshot> {
    let ld = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    Ok(Snapshot {
        mapper: http_get(http, "/metrics").context("the mapper's /metrics")?,
        front: http_get(front, "/metrics").context("the front end's /metrics")?,
        store: dir_size(&dir.join("data")),
        load_reports: ld(&s.load_reports),
        loads: ld(&s.loads),
        demand_samples: ld(&s.samples),
        failed: ld(&s.failed),
    })
}

/// The growth of counter `name` from `before` to `after` (`/metrics` pages), by series.
fn growth(before: &str, after: &str, name: &str) -> Vec<(String, f64)> {
    let was = metric_series(before, name);
    metric_series(after, name)
        .into_iter()
        .map(|(labels, v)| {
            let b = was.iter().find(|(l, _)| *l == labels).map_or(0.0, |x| x.1);
            (labels, v - b)
        })
        .collect()
}

/// A row of the table: an interval of the soak (a minute; the last one until dnsperf ended).
#[derive(Debug, Clone)]
struct Row {
    /// Seconds since the soak's start at its end, and its length.
    end_secs: f64,
    secs: f64,
    answered: u64,
    errors: u64,
    p99_ms: f64,
    rounds: usize,
    round_max_ms: f64,
    /// VmRSS of the mapper and the front end at its end, and the most sampled in it, MB.
    rss: [f64; 2],
    rss_max: [f64; 2],
}

/// What the soak measured.
struct Soaked {
    asked_qps: u64,
    secs: f64,
    rows: Vec<Row>,
    total: Tally,
    run: Run,
    /// VmRSS of the mapper and the front end at the soak's start, and the most sampled, MB.
    rss_start: [f64; 2],
    rss_max: [f64; 2],
    /// Peak resident memory (VmHWM) at the end, MB.
    hwm: [Option<f64>; 2],
    rounds: Vec<RoundRec>,
    slow: usize,
    /// CPU seconds over the soak: the mapper, the front end, dnsperf, this bench.
    cpu: Vec<(&'static str, f64)>,
    /// The growth of the kernel's UDP error counters.
    udp: Vec<(String, u64)>,
}

/// The kernel's UDP error counters (`/proc/net/snmp`): a header line and a value line, both
/// `Udp:`.
fn udp_errors() -> Vec<(String, u64)> {
    let text = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return Vec::new();
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .skip(1)
        .filter(|(name, _)| name.ends_with("Errors"))
        .filter_map(|(name, v)| Some((name.to_string(), v.parse().ok()?)))
        .collect()
}

fn run(
    ctx: &mut Ctx,
    rt: &tokio::runtime::Runtime,
    (a, secs, dnsperf): (&SoakBenchArgs, u64, &Path),
    inst: Arc<Instance>,
    queries: &Path,
) -> Result<()> {
    eprintln!(
        "bench soak: {} map units, {} clusters, cycle {} s; the peak over {} s, then {} s at \
         {:.0}% of it; files in {}",
        a.map_units,
        a.clusters,
        a.cycle_secs,
        a.peak_secs,
        secs,
        100.0 * a.load,
        ctx.dir.display()
    );
    let conf = write_serve_config(ctx.a, &ctx.dir, "serve.toml", None)?;
    let mut mapper = start_mapper(ctx, &conf, "serve.log")?;
    let mut front = start_front(ctx, mapper.grpc, ("dns.log", "cdnmap dns"), &mut || {})?;
    let front_metrics = front
        .metrics
        .context("the front end's `listening` line names no metrics address")?;
    let (watched, _) = start_watcher(ctx, rt, mapper.grpc)?;
    let stats = Arc::new(ReportStats::default());
    let until = Instant::now() + Duration::from_secs(a.peak_secs + secs) + 2 * ctx.timeout;
    let how = (a.report_rate, a.noise, a.seed);
    let tasks = start_reports(rt, mapper.grpc, (&inst, &watched, &stats), how, until);

    eprintln!(
        "phase 1: the front end's peak, dnsperf without a rate limit for {} s",
        a.peak_secs
    );
    let load = start_dns_load(front.dns, queries, a.peak_secs, 0, &ctx.dir)?;
    let peak = finish_dns_load(load, Duration::from_secs(a.peak_secs) + ctx.timeout)?;
    if peak.qps.is_nan() || peak.qps < 1.0 {
        bail!(
            "dnsperf measured no peak ({:.0} queries/s, {} lost); its output is {}",
            peak.qps,
            peak.lost,
            ctx.dir.join("dnsperf.out").display()
        );
    }
    let qps = ((a.load * peak.qps).round() as u64).max(1);
    eprintln!(
        "peak {:.0} queries/s; phase 2: {qps} queries/s ({:.0}%) for {secs} s",
        peak.qps,
        100.0 * a.load
    );

    let before = snapshot(mapper.http, front_metrics, &ctx.dir, &stats)?;
    let soaked = soak_phase(ctx, &mut mapper, &front, (dnsperf, queries), (secs, qps))?;
    let after = snapshot(mapper.http, front_metrics, &ctx.dir, &stats)?;
    tasks.iter().for_each(|t| t.abort());

    println!();
    println!(
        "bench soak: {} map units, {} clusters, cycle {} s, binary {}; Feedback: the front end's \
         own demand reports (every 10 s), the bench's load report with every map version{}",
        a.map_units,
        a.clusters,
        a.cycle_secs,
        ctx.exe.display(),
        if a.report_rate > 0 {
            format!(" and {} demand samples a second", a.report_rate)
        } else {
            String::new()
        }
    );
    print_peak(a, &peak);
    print_soak(a, &soaked);
    print_cpu(&soaked);
    print_rounds(a, &soaked, (&before, &after));
    print_feedback(&before, &after, &stats);
    print_memory(&soaked, (before.store, after.store));
    front.log.poll();
    print_logs(&mapper.log, &[&front.log]);
    Ok(())
}

/// dnsperf at `qps` for `secs` against the front end, its output read as it runs; the table's
/// rows a minute, the memory of both processes sampled every second.
fn soak_phase(
    ctx: &mut Ctx,
    mapper: &mut Mapper,
    front: &Front,
    (dnsperf, queries): (&Path, &Path),
    (secs, qps): (u64, u64),
) -> Result<Soaked> {
    let pids = [ctx.kids.pid(mapper.idx), ctx.kids.pid(front.idx)];
    let sample = || pids.map(|p| p.and_then(memory_mb));
    let rss_now = || sample().map(|m| m.map_or(f64::NAN, |(_, rss)| rss));
    let mut args = dnsperf_args(front.dns, queries, secs, qps);
    args.push("-v".into());
    eprintln!("soak: dnsperf {}", args.join(" "));
    // Each query one line; twice as many as asked, and room for dnsperf's own.
    let max_lines = qps.saturating_mul(secs).saturating_mul(2) + 100_000;
    let rss_start = rss_now();
    let cpu = |pid: Option<u32>| pid.and_then(cpu_secs).unwrap_or(f64::NAN);
    let bench = Some(std::process::id());
    let cpu_start = [pids[0], pids[1], bench].map(cpu);
    let udp_start = udp_errors();
    let err_log = ctx.dir.join("dnsperf-soak.err");
    let mut stream = Stream::start(dnsperf, &args, &err_log, max_lines)?;
    // dnsperf's CPU, as last read before it exited (it is gone from /proc after).
    let mut dnsperf_cpu = f64::NAN;
    let (started, from_ms) = (Instant::now(), now_unix_ms());
    let limit = Duration::from_secs(secs) + ctx.timeout;
    let mut t = Track {
        rows: Vec::new(),
        total: Tally::default(),
        row_from: (0.0, from_ms),
        row_max: rss_start,
        max: rss_start,
        last: rss_start,
        cycle_ms: ctx.a.cycle_secs as f64 * 1e3,
    };
    let mut ended = false;
    for _ in 0..=limit.as_secs() / SAMPLE.as_secs() {
        std::thread::sleep(SAMPLE);
        t.sampled(rss_now());
        dnsperf_cpu = cpu(Some(stream.pid())).max(dnsperf_cpu);
        if stream.exited()? {
            ended = true;
            break;
        }
        ctx.kids.check(&ctx.dir)?;
        // A row a minute; the last one ends with dnsperf.
        let due = ROW * (t.rows.len() as u32 + 1);
        if started.elapsed() >= due && due < Duration::from_secs(secs) {
            t.close(stream.take(), started.elapsed().as_secs_f64(), mapper);
        }
    }
    if !ended {
        bail!(
            "dnsperf did not end within {limit:?} of its start ({secs} s asked); its errors in {}",
            err_log.display()
        );
    }
    let (run, rest) = stream.finish()?;
    let cpu_end = [pids[0], pids[1], bench].map(cpu);
    let used = |i: usize| cpu_end[i] - cpu_start[i];
    let cpu = vec![
        ("cdnmap serve", used(0)),
        ("cdnmap dns", used(1)),
        ("dnsperf (to its last second)", dnsperf_cpu),
        (
            "this bench (its reader of dnsperf's lines, the reports)",
            used(2),
        ),
    ];
    let udp = udp_errors_since(&udp_start);
    // The last row ends when dnsperf stopped sending (by its own clock, not this loop's).
    let end_secs = if run.run_secs.is_finite() {
        run.run_secs
    } else {
        started.elapsed().as_secs_f64()
    };
    t.close(rest, end_secs, mapper);
    let to_ms = now_unix_ms();
    let (rounds, slow) = rounds_during(mapper, from_ms, to_ms);
    Ok(Soaked {
        asked_qps: qps,
        secs: end_secs,
        rows: t.rows,
        total: t.total,
        run,
        rss_start,
        rss_max: t.max,
        hwm: sample().map(|m| m.map(|(hwm, _)| hwm)),
        rounds,
        slow,
        cpu,
        udp,
    })
}

/// The kernel's UDP error counters' growth since `start`.
fn udp_errors_since(start: &[(String, u64)]) -> Vec<(String, u64)> {
    udp_errors()
        .into_iter()
        .map(|(name, n)| {
            let was = start.iter().find(|(k, _)| *k == name).map_or(0, |x| x.1);
            (name, n.saturating_sub(was))
        })
        .collect()
}

/// The mapper's rounds logged in [`from_ms`, `to_ms`], and how many of them were slow.
fn rounds_during(mapper: &mut Mapper, from_ms: f64, to_ms: f64) -> (Vec<RoundRec>, usize) {
    mapper.log.poll();
    let during = |at: f64| at >= from_ms && at <= to_ms;
    let rounds = rounds_of(&mapper.log.events)
        .into_iter()
        .filter(|r| during(r.at_ms))
        .collect();
    let slow = mapper
        .log
        .events
        .iter()
        .filter(|(at, e)| *e == Event::Slow && during(*at))
        .count();
    (rounds, slow)
}

/// The soak's figures as they come: the rows closed so far, the whole tally, the memory.
struct Track {
    rows: Vec<Row>,
    total: Tally,
    /// Where the open row began: seconds since the soak's start, Unix ms.
    row_from: (f64, f64),
    row_max: [f64; 2],
    max: [f64; 2],
    last: [f64; 2],
    cycle_ms: f64,
}

impl Track {
    fn sampled(&mut self, rss: [f64; 2]) {
        for (i, now) in rss.into_iter().enumerate() {
            self.row_max[i] = self.row_max[i].max(now);
            self.max[i] = self.max[i].max(now);
        }
        self.last = rss;
    }

    /// Closes the open row at `end_secs` (since the soak's start) with `tally`, the mapper's
    /// rounds published in it, and the memory; prints its progress line.
    fn close(&mut self, tally: Tally, end_secs: f64, mapper: &mut Mapper) {
        let end_ms = now_unix_ms();
        mapper.log.poll();
        let (from_secs, from_ms) = self.row_from;
        let rounds: Vec<f64> = rounds_of(&mapper.log.events)
            .iter()
            .filter(|r| r.at_ms > from_ms && r.at_ms <= end_ms)
            .map(RoundRec::total_ms)
            .collect();
        let row = Row {
            end_secs,
            secs: end_secs - from_secs,
            answered: tally.answered(),
            errors: tally.errors(EXPECTED_RCODE),
            p99_ms: tally.latency.quantile_ms(0.99),
            rounds: rounds.len(),
            round_max_ms: median_max(rounds).1,
            rss: self.last,
            rss_max: self.row_max,
        };
        eprintln!(
            "  {:>4.0}-{:.0} s: {:.0} answered/s, {} errors, p99 {:.2} ms, {} rounds (max \
             {:.0} ms{}); RSS cdnmap serve {:.0} MB, cdnmap dns {:.0} MB",
            from_secs,
            end_secs,
            row.answered as f64 / row.secs.max(1e-9),
            row.errors,
            row.p99_ms,
            row.rounds,
            row.round_max_ms,
            if row.round_max_ms > self.cycle_ms {
                ", OVER the cycle"
            } else {
                ""
            },
            row.rss[0],
            row.rss[1]
        );
        self.total.merge(&tally);
        self.rows.push(row);
        self.row_from = (end_secs, end_ms);
        self.row_max = self.last;
    }
}
