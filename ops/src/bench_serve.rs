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

use crate::bench_dns::{answers, cpu_secs, parse_dnsperf, program, spawn, write_queries, Proc};
use cdnmap_world::world::{self, WorldParams};

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
const MIN_ROUNDS: usize = 10;
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
const POLL: Duration = Duration::from_millis(50);
/// A progress line at least this often while waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);
/// The most WatchMap messages the bench's own client keeps figures of.
const MAX_UPDATES: usize = 100_000;
/// The most connections the byte-counting relay takes.
const MAX_RELAY_CONNECTIONS: usize = 16;
/// The most queries in the query file.
const MAX_QUERIES: usize = 10_000_000;
/// The most bytes read from an HTTP answer (`/metrics`).
const MAX_HTTP_BYTES: u64 = 64 << 20;
/// Queries outstanding in the built-in DNS load generator.
const OWN_LOAD_WINDOW: usize = 200;

/// Set by Ctrl-C or SIGTERM: the waiting loops fail, and the guard kills the children.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Refuses arguments out of their bounds; returns the report rate to use.
fn check_args(a: &ServeBenchArgs) -> Result<u64> {
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

fn now_unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// The logs.

/// What a line of a `cdnmap serve` or `cdnmap dns` log says, of what the bench reads.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// The addresses bound (`grpc`, `http` of the mapper; `dns` of a front end).
    Listening {
        grpc: Option<SocketAddr>,
        http: Option<SocketAddr>,
        dns: Option<SocketAddr>,
    },
    /// A round's parts, ms: estimator, effective preferences, solve, index, publish, persist.
    Parts([f64; 6]),
    /// A round published: its identity, the loop's step (estimator to index) in ms, its churn.
    Published {
        epoch: u64,
        version: u64,
        step_ms: f64,
        churn: f64,
    },
    /// A round took longer than the cycle.
    Slow,
    /// A start serves the stored map.
    Restored { epoch: u64, version: u64 },
    /// A front end took a map version into use.
    InUse { epoch: u64, version: u64 },
    /// A front end opened its WatchMap stream.
    Following,
    /// The estimator's checkpoint: bytes, encode and write ms.
    Checkpoint { bytes: f64, ms: f64 },
    /// A line logged at ERROR.
    Error(String),
}

/// `s` without its terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of `key=` in a log line (up to the next space).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=");
    let at = line.find(&pat)? + pat.len();
    line[at..].split_whitespace().next()
}

fn num<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    field(line, key)?.parse().ok()
}

/// Days from 1970-01-01 to a civil date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The time a log line starts with (`2026-12-01T15:16:27.677932Z`), in Unix ms.
fn line_time_ms(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let (h, mi) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let s: f64 = t.next()?.parse().ok()?;
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60;
    Some(secs as f64 * 1e3 + s * 1e3)
}

/// The event a (colourless) log line reports, if the bench reads it.
fn parse_event(line: &str) -> Option<Event> {
    if line.contains(" round parts ") {
        let keys = [
            "estimator_ms",
            "effective_ms",
            "solve_ms",
            "index_ms",
            "publish_ms",
            "persist_ms",
        ];
        let mut parts = [0.0; 6];
        for (p, k) in parts.iter_mut().zip(keys) {
            *p = num(line, k)?;
        }
        return Some(Event::Parts(parts));
    }
    if line.contains(" round published ") {
        return Some(Event::Published {
            epoch: num(line, "epoch")?,
            version: num(line, "version")?,
            step_ms: num(line, "solve_ms")?,
            churn: num(line, "churn").unwrap_or(0.0),
        });
    }
    if line.contains(" listening ") {
        let addr = |k| num::<SocketAddr>(line, k);
        return Some(Event::Listening {
            grpc: addr("grpc"),
            http: addr("http"),
            dns: addr("dns"),
        });
    }
    if line.contains("round took longer than the cycle") {
        return Some(Event::Slow);
    }
    if line.contains("serving the stored map until the first round") {
        return Some(Event::Restored {
            epoch: num(line, "epoch")?,
            version: num(line, "version")?,
        });
    }
    if line.contains("map version in use") {
        return Some(Event::InUse {
            epoch: num(line, "epoch")?,
            version: num(line, "version")?,
        });
    }
    if line.contains("following the mapper's map") {
        return Some(Event::Following);
    }
    if line.contains(" estimator checkpoint ") {
        let ms = num::<f64>(line, "encode_ms")? + num::<f64>(line, "write_ms")?;
        return Some(Event::Checkpoint {
            bytes: num(line, "bytes")?,
            ms,
        });
    }
    if line.contains(" ERROR ") {
        return Some(Event::Error(line.to_string()));
    }
    None
}

/// A log file read as it grows: its events, each with the time its line gives (Unix ms).
struct LogTail {
    path: PathBuf,
    offset: u64,
    partial: String,
    events: Vec<(f64, Event)>,
}

impl LogTail {
    fn new(path: PathBuf) -> Self {
        LogTail {
            path,
            offset: 0,
            partial: String::new(),
            events: Vec::new(),
        }
    }

    /// Reads what was written since the last call.
    fn poll(&mut self) {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            return;
        }
        self.offset += buf.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        while let Some(end) = self.partial.find('\n') {
            let line = strip_ansi(&self.partial[..end]);
            self.partial.drain(..=end);
            if let (Some(at), Some(e)) = (line_time_ms(&line), parse_event(&line)) {
                self.events.push((at, e));
            }
        }
    }

    fn find<T>(&self, f: impl Fn(&Event) -> Option<T>) -> Option<(f64, T)> {
        self.events.iter().find_map(|(t, e)| f(e).map(|x| (*t, x)))
    }

    fn listening(&self) -> Option<(f64, [Option<SocketAddr>; 3])> {
        self.find(|e| match e {
            Event::Listening { grpc, http, dns } => Some([*grpc, *http, *dns]),
            _ => None,
        })
    }

    fn in_use(&self) -> Option<(f64, (u64, u64))> {
        self.find(|e| match e {
            Event::InUse { epoch, version } => Some((*epoch, *version)),
            _ => None,
        })
    }

    fn count(&self, f: impl Fn(&Event) -> bool) -> usize {
        self.events.iter().filter(|(_, e)| f(e)).count()
    }
}

/// One round as the mapper's log tells it.
#[derive(Debug, Clone, Copy)]
struct RoundRec {
    at_ms: f64,
    epoch: u64,
    version: u64,
    /// Estimator, effective preferences, solve, index, publish, persist, ms.
    parts: [f64; 6],
    /// The loop's step (estimator to index, with the entry's encoding), ms.
    step_ms: f64,
    churn: f64,
}

impl RoundRec {
    /// The whole round: the step, then publish and persist (the estimator entry's encoding,
    /// a part of both the step and persist, is counted twice: well under a millisecond).
    fn total_ms(&self) -> f64 {
        self.step_ms + self.parts[4] + self.parts[5]
    }
}

/// The rounds of a mapper's log: each `round parts` line with the `round published` after it.
fn rounds_of(events: &[(f64, Event)]) -> Vec<RoundRec> {
    let mut out = Vec::new();
    let mut parts = None;
    for (at, e) in events {
        match e {
            Event::Parts(p) => parts = Some(*p),
            Event::Published {
                epoch,
                version,
                step_ms,
                churn,
            } => {
                if let Some(parts) = parts.take() {
                    out.push(RoundRec {
                        at_ms: *at,
                        epoch: *epoch,
                        version: *version,
                        parts,
                        step_ms: *step_ms,
                        churn: *churn,
                    });
                }
            }
            _ => {}
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The processes.

/// The child processes; each is killed (SIGKILL) and reaped when dropped, on every exit path.
#[derive(Default)]
struct Children {
    procs: Vec<(Option<Proc>, PathBuf)>,
}

/// The last lines of a log, for an error message (the temporary directory goes with the bench).
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<String> = text.lines().rev().take(5).map(strip_ansi).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n    ")
}

impl Children {
    /// Adds `p`, which logs to `log`.
    fn add(&mut self, p: Proc, log: &Path) -> usize {
        self.procs.push((Some(p), log.to_path_buf()));
        self.procs.len() - 1
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.procs.get(i)?.0.as_ref().map(|p| p.0.id())
    }

    /// `kill -9` of child `i`, reaped.
    fn kill(&mut self, i: usize) {
        if let Some(p) = self.procs.get_mut(i) {
            drop(p.0.take());
        }
    }

    /// Fails, naming the process and the logs, if one that was not killed has exited, or
    /// when the bench was interrupted.
    fn check(&mut self, dir: &Path) -> Result<()> {
        if INTERRUPTED.load(Ordering::Relaxed) {
            bail!("interrupted; the servers are stopped");
        }
        for (p, log) in &mut self.procs {
            let Some(p) = p else { continue };
            if let Ok(Some(status)) = p.0.try_wait() {
                bail!(
                    "{} exited with {status}; the end of its log ({}; all logs in {}):\n    {}",
                    p.1,
                    log.display(),
                    dir.display(),
                    log_tail(log)
                );
            }
        }
        Ok(())
    }
}

/// Waits for `f` to give a value, failing after `timeout` or if a child exits; prints a
/// progress line now and then.
fn wait_for<T>(
    what: &str,
    timeout: Duration,
    kids: &mut Children,
    dir: &Path,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T> {
    let started = Instant::now();
    let mut said = Instant::now();
    loop {
        if let Some(x) = f() {
            return Ok(x);
        }
        kids.check(dir)?;
        if started.elapsed() > timeout {
            bail!(
                "no {what} within {timeout:?}; see the logs in {}",
                dir.display()
            );
        }
        if said.elapsed() > PROGRESS_EVERY {
            eprintln!(
                "  ... waiting for {what} ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        std::thread::sleep(POLL);
    }
}

/// The mapper's configuration (`grpc` may name a fixed address, else port 0), its store in
/// `dir`.
fn serve_config(a: &ServeBenchArgs, dir: &Path, grpc: Option<SocketAddr>) -> String {
    let grpc = grpc.map_or_else(|| "127.0.0.1:0".to_string(), |g| g.to_string());
    format!(
        "grpc_listen = \"{grpc}\"\nhttp_listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n\
         cycle_secs = {}\n[demo]\nmap_units = {}\nclusters = {}\nseed = {}\n",
        dir.join("data").display().to_string(),
        a.cycle_secs,
        a.map_units,
        a.clusters,
        a.seed
    )
}

/// Writes the mapper's configuration into `dir` as `name`.
fn write_serve_config(
    a: &ServeBenchArgs,
    dir: &Path,
    name: &str,
    grpc: Option<SocketAddr>,
) -> Result<PathBuf> {
    let conf = dir.join(name);
    std::fs::write(&conf, serve_config(a, dir, grpc))
        .with_context(|| format!("writing {}", conf.display()))?;
    Ok(conf)
}

fn spawn_serve(exe: &Path, conf: &Path, log: &Path) -> Result<Proc> {
    spawn(
        Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(conf)
            .env("NO_COLOR", "1"),
        log,
        "cdnmap serve",
    )
}

fn spawn_dns(
    exe: &Path,
    grpc: SocketAddr,
    (log, name): (&Path, &'static str),
    reports: bool,
) -> Result<Proc> {
    let report_secs = if reports { "10" } else { "3600" };
    spawn(
        Command::new(exe)
            .arg("dns")
            .args(["--report-secs", report_secs])
            .args(["--mapper", &format!("http://{grpc}")])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--zone", "cdn.example."])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1"),
        log,
        name,
    )
}

/// A process's peak resident memory (`VmHWM`), MB.
fn peak_rss_mb(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Bytes of the files under `dir`.
fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// `GET path` over HTTP/1.1, the body.
fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.take(MAX_HTTP_BYTES).read_to_string(&mut text)?;
    let (_, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path} from {addr}: no HTTP answer"))?;
    Ok(body.to_string())
}

/// The value of an unlabelled metric in a Prometheus text page.
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------------------------------
// The bench's own WatchMap client, behind a byte-counting relay.

/// One WatchMap message as the bench's client saw it.
#[derive(Debug, Clone, Copy)]
struct UpdateRec {
    at: Instant,
    version: u64,
    full: bool,
    more: bool,
    units: usize,
    removed: usize,
    /// Bytes from the mapper on the wire since the message before (HTTP/2 framing included).
    wire_bytes: u64,
}

/// What the client shares with the rest of the bench.
struct Watched {
    updates: Mutex<Vec<UpdateRec>>,
    map: Mutex<Option<Arc<ServingMap>>>,
    /// The version of `map`, announced as each is applied (the load reports follow it).
    version: tokio::sync::watch::Sender<u64>,
    wire: AtomicU64,
    error: Mutex<Option<String>>,
}

impl Watched {
    fn new() -> Self {
        Watched {
            updates: Mutex::default(),
            map: Mutex::default(),
            version: tokio::sync::watch::channel(0).0,
            wire: AtomicU64::new(0),
            error: Mutex::default(),
        }
    }
}

/// A TCP relay on loopback to `upstream` that counts the bytes coming back; returns its
/// address. Each connection is two threads that end with it.
fn relay(upstream: SocketAddr, watched: Arc<Watched>) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("bench-relay".into())
        .spawn(move || {
            for down in listener.incoming().take(MAX_RELAY_CONNECTIONS).flatten() {
                let Ok(up) = TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = up.set_nodelay(true);
                let _ = down.set_nodelay(true);
                let (Ok(up2), Ok(down2)) = (up.try_clone(), down.try_clone()) else {
                    continue;
                };
                let _ = std::thread::Builder::new().spawn(move || copy(down, up, None));
                let w = Arc::clone(&watched);
                let _ = std::thread::Builder::new().spawn(move || copy(up2, down2, Some(&w.wire)));
            }
        })?;
    Ok(addr)
}

fn copy(mut from: TcpStream, mut to: TcpStream, count: Option<&AtomicU64>) {
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(c) = count {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Follows the map from version 0 through `relay` (applied as a front end applies it, with
/// the front end's own code), noting every message, until the stream ends or
/// `MAX_UPDATES` messages.
async fn watch_map(relay: SocketAddr, watched: Arc<Watched>) {
    if let Err(e) = follow(relay, &watched).await {
        *lock(&watched.error) = Some(format!("{e:#}"));
    }
}

async fn follow(relay: SocketAddr, watched: &Arc<Watched>) -> Result<()> {
    let mut client = pb::mapping_client::MappingClient::connect(format!("http://{relay}"))
        .await?
        .max_decoding_message_size(1 << 30);
    let mut stream = client
        .watch_map(pb::WatchMapRequest::default())
        .await?
        .into_inner();
    let mut follower = Follower::default();
    let mut wire_before = 0;
    for _ in 0..MAX_UPDATES {
        let Some(update) = stream.message().await? else {
            return Ok(());
        };
        let wire = watched.wire.load(Ordering::Relaxed);
        let rec = UpdateRec {
            at: Instant::now(),
            version: update.version,
            full: update.full,
            more: update.more,
            units: update.units.len(),
            removed: update.removed_units.len(),
            wire_bytes: wire - wire_before,
        };
        wire_before = wire;
        lock(&watched.updates).push(rec);
        let (f, applied) = tokio::task::spawn_blocking(move || {
            let applied = follower.apply(update);
            (follower, applied)
        })
        .await?;
        follower = f;
        if applied.map_err(|e| anyhow::anyhow!("{e}"))? == Applied::New {
            *lock(&watched.map) = follower.held().map(|h| Arc::clone(&h.map));
            watched.version.send_replace(follower.identity().1);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The reports.

/// What the reporters did.
#[derive(Default)]
struct ReportStats {
    demand_reports: AtomicU64,
    samples: AtomicU64,
    load_reports: AtomicU64,
    loads: AtomicU64,
    failed: AtomicU64,
    /// Demand ticks skipped: `MAX_REPORTS_IN_FLIGHT` calls were still open.
    skipped: AtomicU64,
    latency_us_max: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ReportStats {
    fn note<T>(&self, result: std::result::Result<T, String>, started: Instant) -> bool {
        let us = started.elapsed().as_micros() as u64;
        self.latency_us_max.fetch_max(us, Ordering::Relaxed);
        match result {
            Ok(_) => true,
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                lock(&self.first_error).get_or_insert(e);
                false
            }
        }
    }
}

async fn feedback_client(
    grpc: SocketAddr,
) -> Result<pb::feedback_client::FeedbackClient<tonic::transport::Channel>> {
    Ok(pb::feedback_client::FeedbackClient::connect(format!("http://{grpc}")).await?)
}

/// One demand report sent (at most `RPC_TIMEOUT`), its outcome counted.
async fn send_demand(
    mut client: pb::feedback_client::FeedbackClient<tonic::transport::Channel>,
    report: pb::DemandReport,
    stats: Arc<ReportStats>,
) {
    let started = Instant::now();
    let sent = tokio::time::timeout(RPC_TIMEOUT, client.report_demand(report)).await;
    let result = match sent {
        Ok(Ok(ack)) => Ok(ack.into_inner().accepted),
        Ok(Err(status)) => Err(format!("ReportDemand: {status}")),
        Err(_) => Err(format!("ReportDemand: no answer within {RPC_TIMEOUT:?}")),
    };
    if let Ok(accepted) = &result {
        stats.samples.fetch_add(*accepted, Ordering::Relaxed);
        stats.demand_reports.fetch_add(1, Ordering::Relaxed);
    }
    stats.note(result, started);
}

/// Demand reports at `rate` samples a second until `until`: a report every `REPORT_TICK`,
/// at most `MAX_REPORTS_IN_FLIGHT` calls at once (a tick with that many is skipped, and
/// counted); unit after unit, each its configured demand with ±`noise`% of noise.
async fn report_demand(
    grpc: SocketAddr,
    inst: Arc<Instance>,
    (rate, noise, seed): (u64, f64, u64),
    until: Instant,
    stats: Arc<ReportStats>,
) {
    let client = match feedback_client(grpc).await {
        Ok(c) => c,
        Err(e) => {
            stats.note::<()>(Err(format!("connecting: {e:#}")), Instant::now());
            return;
        }
    };
    let per_tick =
        ((rate as f64 * REPORT_TICK.as_secs_f64()).round() as usize).clamp(1, MAX_REPORT_SAMPLES);
    let n = inst.unit_count() as UnitIdx;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfeed);
    let mut next: UnitIdx = 0;
    let mut calls = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(REPORT_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let ticks = until
        .saturating_duration_since(Instant::now())
        .as_millis()
        .div_ceil(REPORT_TICK.as_millis()) as usize;
    for _ in 0..ticks {
        tick.tick().await;
        while calls.try_join_next().is_some() {}
        if Instant::now() >= until {
            break;
        }
        if calls.len() >= MAX_REPORTS_IN_FLIGHT {
            stats.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let samples = (0..per_tick)
            .map(|_| {
                let u = next;
                next = (next + 1) % n.max(1);
                let x = 1.0 + noise / 100.0 * rng.random_range(-1.0..1.0);
                pb::DemandSample {
                    target: Some(pb::demand_sample::Target::MapUnit(inst.unit_id(u).into())),
                    traffic_class: inst.classes()[usize::from(inst.unit_class(u))].name.clone(),
                    queries: inst.unit_demand(u) * x,
                }
            })
            .collect::<Vec<_>>();
        let end = now_unix_ms() as i64;
        let report = pb::DemandReport {
            reporter: "bench-serve".into(),
            period_start_unix_ms: end - REPORT_TICK.as_millis() as i64,
            period_end_unix_ms: end,
            samples,
        };
        calls.spawn(send_demand(client.clone(), report, Arc::clone(&stats)));
    }
    let drain = async { while calls.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(RPC_TIMEOUT, drain).await;
}

/// The load every resource node of `inst` carries under `map` with each unit's configured
/// demand and the configured coefficients (what the estimator predicts): (cluster, node, load).
fn node_loads(inst: &Instance, map: &ServingMap) -> Vec<pb::NodeLoad> {
    let clusters: Vec<Option<u32>> = map
        .clusters()
        .iter()
        .map(|c| inst.cluster_index(&c.id))
        .collect();
    let n = map.unit_count();
    let aligned = n == inst.unit_count()
        && n > 0
        && map.unit_id(0) == inst.unit_id(0)
        && map.unit_id(n as UnitIdx - 1) == inst.unit_id(n as UnitIdx - 1);
    let mut used = vec![0.0; inst.node_count()];
    for u in 0..n as UnitIdx {
        let iu = if aligned {
            Some(u)
        } else {
            inst.unit_index(map.unit_id(u))
        };
        let Some(iu) = iu else { continue };
        let k = inst.unit_class(iu);
        let per_unit = inst.classes()[usize::from(k)].per_unit;
        let demand = inst.unit_demand(iu);
        let (cs, shares) = map.shares(u);
        for (&c, &s) in cs.iter().zip(shares) {
            let Some(ic) = clusters.get(c as usize).copied().flatten() else {
                continue;
            };
            let cluster = &inst.clusters()[ic as usize];
            for node in cluster.path(k) {
                let kind = cluster.nodes[node as usize].kind;
                used[inst.global_node(ic, node)] += demand * s * per_unit.get(kind);
            }
        }
    }
    let mut out = Vec::with_capacity(used.len());
    for (ci, cluster) in inst.clusters().iter().enumerate() {
        for (ni, node) in cluster.nodes.iter().enumerate() {
            out.push(pb::NodeLoad {
                cluster: cluster.id.clone(),
                node: node.name.clone(),
                load: used[inst.global_node(ci as u32, ni as u32)],
            });
        }
    }
    out
}

/// A load report for every map version the bench's WatchMap client applies, sent as soon as
/// it has it (so the loads the next round learns from are those under the map it replaces),
/// until `until`: every node's load under that map.
async fn report_loads(
    grpc: SocketAddr,
    inst: Arc<Instance>,
    watched: Arc<Watched>,
    until: Instant,
    stats: Arc<ReportStats>,
) {
    let mut client = match feedback_client(grpc).await {
        Ok(c) => c,
        Err(e) => {
            stats.note::<()>(Err(format!("connecting: {e:#}")), Instant::now());
            return;
        }
    };
    let mut versions = watched.version.subscribe();
    versions.mark_changed(); // the map held now first
    let deadline = tokio::time::Instant::from_std(until);
    for _ in 0..MAX_UPDATES {
        match tokio::time::timeout_at(deadline, versions.changed()).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        let Some(map) = lock(&watched.map).clone() else {
            continue;
        };
        let inst = Arc::clone(&inst);
        let Ok(loads) = tokio::task::spawn_blocking(move || node_loads(&inst, &map)).await else {
            continue;
        };
        for chunk in loads.chunks(MAX_REPORT_SAMPLES) {
            let report = pb::LoadReport {
                reporter: "bench-serve".into(),
                measured_at_unix_ms: now_unix_ms() as i64,
                loads: chunk.to_vec(),
                servers: Vec::new(),
            };
            let started = Instant::now();
            let sent = tokio::time::timeout(RPC_TIMEOUT, client.report_load(report)).await;
            let result = match sent {
                Ok(Ok(ack)) => Ok(ack.into_inner().accepted),
                Ok(Err(status)) => Err(format!("ReportLoad: {status}")),
                Err(_) => Err(format!("ReportLoad: no answer within {RPC_TIMEOUT:?}")),
            };
            if let Ok(accepted) = &result {
                stats.loads.fetch_add(*accepted, Ordering::Relaxed);
                stats.load_reports.fetch_add(1, Ordering::Relaxed);
            }
            stats.note(result, started);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The DNS load.

/// The DNS load during the rounds: dnsperf, or the built-in generator on a thread.
enum DnsLoad {
    Dnsperf { proc: Proc, out: PathBuf },
    Own(std::thread::JoinHandle<Result<OwnRun>>),
}

/// What the DNS load measured.
#[derive(Debug, Clone)]
struct DnsFigures {
    tool: String,
    qps: f64,
    noerror_pct: f64,
    lost: f64,
    latency_ms: f64,
}

/// The built-in generator's tally.
#[derive(Debug, Clone, Copy, Default)]
struct OwnRun {
    sent: u64,
    answered: u64,
    noerror: u64,
    lost: u64,
    secs: f64,
}

/// dnsperf's options, for the command and for the report.
fn dnsperf_args(target: SocketAddr, queries: &Path, secs: u64, qps: u64) -> Vec<String> {
    let mut args: Vec<String> = [
        "-s",
        "127.0.0.1",
        "-p",
        &target.port().to_string(),
        "-B",
        "-d",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(queries.display().to_string());
    args.extend(["-l", &secs.to_string(), "-c", "8", "-q", "200"].map(String::from));
    if qps > 0 {
        args.extend(["-Q".to_string(), qps.to_string()]);
    }
    args
}

fn start_dns_load(
    target: SocketAddr,
    queries: &Path,
    secs: u64,
    qps: u64,
    dir: &Path,
) -> Result<DnsLoad> {
    if let Ok(dnsperf) = program("dnsperf") {
        let out = dir.join("dnsperf.out");
        let args = dnsperf_args(target, queries, secs, qps);
        eprintln!("dns load: dnsperf {}", args.join(" "));
        let proc = spawn(Command::new(dnsperf).args(&args), &out, "dnsperf")?;
        return Ok(DnsLoad::Dnsperf { proc, out });
    }
    eprintln!(
        "dns load: dnsperf is not installed (Debian: apt-get install dnsperf); the built-in \
         generator ({OWN_LOAD_WINDOW} in flight, one socket) for {secs} s"
    );
    let messages = read_queries(queries)?;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let handle = std::thread::Builder::new()
        .name("bench-dns-load".into())
        .spawn(move || own_load(target, &messages, deadline, qps))?;
    Ok(DnsLoad::Own(handle))
}

/// The query file's messages (each prefixed by its 2-byte length).
fn read_queries(path: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let mut at = 0;
    while at + 2 <= bytes.len() {
        let len = usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
        let Some(m) = bytes.get(at + 2..at + 2 + len) else {
            bail!("{}: a message runs past the end", path.display());
        };
        out.push(m.to_vec());
        at += 2 + len;
    }
    if out.is_empty() {
        bail!("{}: no query", path.display());
    }
    Ok(out)
}

/// The built-in generator: `OWN_LOAD_WINDOW` queries in flight on one UDP socket, the next
/// sent for each answer, the window counted lost and sent again after 100 ms without one;
/// at most `qps` a second (0: no limit), until `deadline`.
fn own_load(
    target: SocketAddr,
    messages: &[Vec<u8>],
    deadline: Instant,
    qps: u64,
) -> Result<OwnRun> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.connect(target)?;
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
    let started = Instant::now();
    let mut run = OwnRun::default();
    let mut in_flight = 0usize;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let budget = if qps == 0 {
            u64::MAX
        } else {
            (qps as f64 * started.elapsed().as_secs_f64()) as u64
        };
        while in_flight < OWN_LOAD_WINDOW && run.sent < budget {
            let m = &messages[(run.sent % messages.len() as u64) as usize];
            run.sent += 1;
            if socket.send(m).is_ok() {
                in_flight += 1;
            }
        }
        if in_flight == 0 {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        match socket.recv(&mut buf) {
            Ok(n) => {
                run.answered += 1;
                in_flight -= 1;
                if n >= 4 && buf[3] & 0x0f == 0 {
                    run.noerror += 1;
                }
            }
            Err(_) => {
                run.lost += in_flight as u64;
                in_flight = 0;
            }
        }
    }
    run.secs = started.elapsed().as_secs_f64();
    Ok(run)
}

/// Waits for the DNS load to end (bounded by `timeout`) and reads its figures.
fn finish_dns_load(load: DnsLoad, timeout: Duration) -> Result<DnsFigures> {
    match load {
        DnsLoad::Dnsperf { mut proc, out } => {
            let started = Instant::now();
            while proc.0.try_wait()?.is_none() {
                if started.elapsed() > timeout || INTERRUPTED.load(Ordering::Relaxed) {
                    bail!("dnsperf did not end within {timeout:?}");
                }
                std::thread::sleep(POLL);
            }
            let text = std::fs::read_to_string(&out)
                .with_context(|| format!("reading {}", out.display()))?;
            let run = parse_dnsperf(&text).with_context(|| format!("dnsperf: {text}"))?;
            Ok(DnsFigures {
                tool: "dnsperf (-c 8 -q 200)".into(),
                qps: run.qps,
                noerror_pct: run.noerror_pct,
                lost: run.lost,
                latency_ms: run.latency_ms,
            })
        }
        DnsLoad::Own(handle) => {
            let run = handle
                .join()
                .map_err(|_| anyhow::anyhow!("the DNS load generator panicked"))??;
            Ok(DnsFigures {
                tool: format!("the built-in generator ({OWN_LOAD_WINDOW} in flight, one socket)"),
                qps: run.answered as f64 / run.secs.max(1e-9),
                noerror_pct: 100.0 * run.noerror as f64 / (run.answered.max(1)) as f64,
                lost: run.lost as f64,
                latency_ms: f64::NAN,
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The phases.

/// A `cdnmap serve` started by the bench.
struct Mapper {
    idx: usize,
    log: LogTail,
    spawned_ms: f64,
    grpc: SocketAddr,
    http: SocketAddr,
}

/// A `cdnmap dns` started by the bench: when it was started, took its first map into use and
/// first answered (Unix ms).
struct Front {
    idx: usize,
    log: LogTail,
    spawned_ms: f64,
    dns: SocketAddr,
    in_use_ms: f64,
    in_use: (u64, u64),
    answer_ms: f64,
}

/// What every phase needs.
struct Ctx<'a> {
    a: &'a ServeBenchArgs,
    exe: PathBuf,
    dir: PathBuf,
    kids: Children,
    timeout: Duration,
}

/// Starts the mapper with configuration `conf` and waits until it listens (after its first
/// map, or the stored map).
fn start_mapper(ctx: &mut Ctx, conf: &Path, log: &str) -> Result<Mapper> {
    let log = ctx.dir.join(log);
    let spawned_ms = now_unix_ms();
    let idx = ctx.kids.add(spawn_serve(&ctx.exe, conf, &log)?, &log);
    let mut tail = LogTail::new(log);
    let (_, addrs) = wait_for(
        "listening line from the mapper",
        ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || {
            tail.poll();
            tail.listening()
        },
    )?;
    let [Some(grpc), Some(http), _] = addrs else {
        bail!("the mapper's listening line names no grpc and http addresses");
    };
    Ok(Mapper {
        idx,
        log: tail,
        spawned_ms,
        grpc,
        http,
    })
}

/// Starts a front end following `grpc` and waits until it answers from a map.
/// `on_poll` runs at every look (the restart probes the running front end with it).
fn start_front(
    ctx: &mut Ctx,
    grpc: SocketAddr,
    (log, name): (&str, &'static str),
    on_poll: &mut dyn FnMut(),
) -> Result<Front> {
    let log = ctx.dir.join(log);
    let spawned_ms = now_unix_ms();
    let proc = spawn_dns(&ctx.exe, grpc, (&log, name), ctx.a.front_end_reports)?;
    let idx = ctx.kids.add(proc, &log);
    let mut tail = LogTail::new(log);
    let what = format!("DNS answer from {name}");
    let (dns, answer_ms) = wait_for(&what, ctx.timeout, &mut ctx.kids, &ctx.dir, || {
        on_poll();
        tail.poll();
        let dns = tail.listening()?.1[2]?;
        answers(dns, "cdn.example.").then(|| (dns, now_unix_ms()))
    })?;
    let (in_use_ms, in_use) = wait_for(&what, ctx.timeout, &mut ctx.kids, &ctx.dir, || {
        tail.poll();
        tail.in_use()
    })?;
    Ok(Front {
        idx,
        log: tail,
        spawned_ms,
        dns,
        in_use_ms,
        in_use,
        answer_ms,
    })
}

/// How a front end came to hold the whole map: WatchMap messages, units, bytes on the wire,
/// seconds from the request to the map applied.
#[derive(Debug, Clone, Copy, Default)]
struct Join {
    messages: usize,
    units: usize,
    wire_bytes: u64,
    secs: f64,
}

/// Starts the bench's own WatchMap client behind the counting relay; waits until it holds
/// the whole map.
fn start_watcher(
    ctx: &mut Ctx,
    rt: &tokio::runtime::Runtime,
    grpc: SocketAddr,
) -> Result<(Arc<Watched>, Join)> {
    let watched = Arc::new(Watched::new());
    let relay = relay(grpc, Arc::clone(&watched))?;
    let asked = Instant::now();
    rt.spawn(watch_map(relay, Arc::clone(&watched)));
    wait_for(
        "whole map at the bench's WatchMap client",
        ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || {
            let error = lock(&watched.error).clone();
            match error {
                Some(e) => Some(Err(anyhow::anyhow!("the bench's WatchMap client: {e}"))),
                None => lock(&watched.map).is_some().then_some(Ok(())),
            }
        },
    )??;
    let updates = lock(&watched.updates).clone();
    let end = updates.iter().position(|u| u.full && !u.more).unwrap_or(0);
    let whole = &updates[..=end.min(updates.len().saturating_sub(1))];
    let join = Join {
        messages: whole.len(),
        units: whole.iter().map(|u| u.units).sum(),
        wire_bytes: whole.iter().map(|u| u.wire_bytes).sum(),
        secs: whole
            .last()
            .map_or(0.0, |u| u.at.duration_since(asked).as_secs_f64()),
    };
    Ok((watched, join))
}

/// What the counted rounds gave.
struct Counted {
    rounds: Vec<RoundRec>,
    /// Rounds `quiet` and after ran with the DNS load.
    quiet: usize,
    slow: usize,
    late: Front,
    late_after: usize,
    dns: DnsFigures,
    dns_cpu_us: f64,
    report_secs: f64,
    /// Demand samples acknowledged a second before the DNS load and during it.
    report_rates: (f64, f64),
}

/// The rounds observed after `known` of them, once a round published after `after`.
fn new_rounds(log: &mut LogTail, after: Option<&RoundRec>) -> Vec<RoundRec> {
    log.poll();
    let all = rounds_of(&log.events);
    match after {
        Some(r0) => all
            .into_iter()
            .filter(|r| r.epoch == r0.epoch && r.version > r0.version)
            .collect(),
        None => all,
    }
}

fn print_round(i: usize, of: usize, r: &RoundRec) {
    let p = r.parts;
    eprintln!(
        "round {i}/{of} (version {}): {:.0} ms = step {:.0} (estimator {:.0}, effective {:.0}, \
         solve {:.0}, index {:.0}) + publish {:.0} + persist {:.0}; churn {:.3}%",
        r.version,
        r.total_ms(),
        r.step_ms,
        p[0],
        p[1],
        p[2],
        p[3],
        p[4],
        p[5],
        100.0 * r.churn
    );
}

/// The reporters, until `until`.
fn start_reports(
    rt: &tokio::runtime::Runtime,
    grpc: SocketAddr,
    (inst, watched, stats): (&Arc<Instance>, &Arc<Watched>, &Arc<ReportStats>),
    (rate, noise, seed): (u64, f64, u64),
    until: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (inst, stats) = (Arc::clone(inst), Arc::clone(stats));
    let mut tasks = vec![rt.spawn(report_loads(
        grpc,
        Arc::clone(&inst),
        Arc::clone(watched),
        until,
        Arc::clone(&stats),
    ))];
    if rate > 0 {
        let how = (rate, noise, seed);
        tasks.push(rt.spawn(report_demand(grpc, inst, how, until, stats)));
    }
    eprintln!("reports flowing: {rate} demand samples/s, every node's load with every map version");
    tasks
}

/// Reports flow; after the first round whose period they covered, the counted rounds: a
/// second front end started in the first half, the DNS load on the first front end in the
/// second half.
fn run_rounds(
    ctx: &mut Ctx,
    rt: &tokio::runtime::Runtime,
    mapper: &mut Mapper,
    front: &Front,
    (inst, watched, stats, rate): (&Arc<Instance>, &Arc<Watched>, &Arc<ReportStats>, u64),
    queries: &Path,
) -> Result<Counted> {
    let (a, cycle) = (ctx.a, Duration::from_secs(ctx.a.cycle_secs));
    let until = Instant::now() + cycle * (2 * a.rounds as u32 + 8) + ctx.timeout;
    let how = (rate, a.noise, a.seed);
    let tasks = start_reports(rt, mapper.grpc, (inst, watched, stats), how, until);
    let reports_from = Instant::now();
    let known = new_rounds(&mut mapper.log, None).len();
    let what = "round after the reports began";
    let r0 = wait_for(
        what,
        cycle * 3 + ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || new_rounds(&mut mapper.log, None).get(known).copied(),
    )?;
    eprintln!(
        "round of version {} had part of a period of reports; counting the {} after it",
        r0.version, a.rounds
    );
    let (quiet, late_after) = (a.rounds / 2, (a.rounds / 4).max(1));
    let load_secs = a.cycle_secs * (a.rounds - quiet) as u64;
    let (mut printed, mut late, mut load) = (0, None, None);
    let round_limit = cycle * 3 + ctx.timeout;
    let mut last_round = Instant::now();
    loop {
        let rounds = new_rounds(&mut mapper.log, Some(&r0));
        for (i, r) in rounds.iter().enumerate().take(a.rounds).skip(printed) {
            print_round(i + 1, a.rounds, r);
            last_round = Instant::now();
        }
        printed = rounds.len();
        if late.is_none() && rounds.len() >= late_after {
            eprintln!("starting a second cdnmap dns (after counted round {late_after})");
            let name = ("dns-late.log", "cdnmap dns (late)");
            late = Some(start_front(ctx, mapper.grpc, name, &mut || {})?);
        }
        if load.is_none() && rounds.len() >= quiet {
            let cpu = ctx.kids.pid(front.idx).and_then(cpu_secs);
            let started = start_dns_load(front.dns, queries, load_secs, a.dns_qps, &ctx.dir)?;
            let samples = stats.samples.load(Ordering::Relaxed);
            load = Some((started, Instant::now(), cpu, samples));
        }
        if rounds.len() >= a.rounds && late.is_some() {
            break;
        }
        ctx.kids.check(&ctx.dir)?;
        if last_round.elapsed() > round_limit {
            bail!(
                "no round within {round_limit:?}; see the logs in {}",
                ctx.dir.display()
            );
        }
        std::thread::sleep(POLL);
    }
    let Some((load, load_started, cpu_before, samples_before)) = load else {
        bail!("the DNS load was not started");
    };
    let dns = finish_dns_load(load, Duration::from_secs(load_secs) + ctx.timeout)?;
    let dns_secs = load_started.elapsed().as_secs_f64();
    let cpu_after = ctx.kids.pid(front.idx).and_then(cpu_secs);
    let report_secs = reports_from.elapsed().as_secs_f64();
    tasks.iter().for_each(|t| t.abort());
    let quiet_secs = load_started.duration_since(reports_from).as_secs_f64();
    let samples_after = stats.samples.load(Ordering::Relaxed) - samples_before;
    let report_rates = (
        samples_before as f64 / quiet_secs.max(1e-9),
        samples_after as f64 / dns_secs.max(1e-9),
    );
    let dns_cpu_us = match (cpu_before, cpu_after) {
        (Some(b), Some(e)) => (e - b) / (dns.qps * dns_secs).max(1.0) * 1e6,
        _ => f64::NAN,
    };
    let mut rounds = new_rounds(&mut mapper.log, Some(&r0));
    rounds.truncate(a.rounds);
    let slow = mapper.log.count(|e| *e == Event::Slow);
    let Some(late) = late else {
        bail!("the second front end was not started");
    };
    eprintln!("counted rounds done");
    Ok(Counted {
        rounds,
        quiet,
        slow,
        late,
        late_after,
        dns,
        dns_cpu_us,
        report_secs,
        report_rates,
    })
}

/// Waits (at most a minute) until the first front end and the bench's WatchMap client hold
/// version `last`, so that the last round's delta is counted too.
fn wait_followed(ctx: &mut Ctx, front: &mut Front, watched: &Watched, last: u64) -> Result<()> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        front.log.poll();
        let at_front = front
            .log
            .events
            .iter()
            .any(|(_, e)| matches!(e, Event::InUse { version, .. } if *version >= last));
        if at_front && *watched.version.borrow() >= last {
            break;
        }
        ctx.kids.check(&ctx.dir)?;
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// What the restart gave (times in seconds after the `kill -9`).
struct Restart {
    stored: u64,
    restored: Option<(f64, u64, u64)>,
    listening_s: f64,
    fresh: Front,
    killed_ms: f64,
    running_took: Option<(f64, (u64, u64))>,
    /// The version the running front end held at the kill.
    running_held: Option<(u64, u64)>,
    probes: (usize, usize),
    peak_mb: Option<f64>,
}

/// `kill -9` of the mapper once its last round (`last`) is stored, a start on the same store (and the
/// same gRPC address, so the running front end finds it again) with a fresh front end beside
/// it: the times to the stored map served and to the fresh front end's first answer.
fn restart(ctx: &mut Ctx, mapper: &mut Mapper, front: &mut Front, last: u64) -> Result<Restart> {
    let http = mapper.http;
    let stored = wait_for(
        "stored last round",
        ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || {
            let page = http_get(http, "/metrics").ok()?;
            let v = metric(&page, "cdnmap_map_stored_version")? as u64;
            (v >= last).then_some(v)
        },
    )?;
    eprintln!(
        "kill -9 of the mapper (version {stored} stored); starting it again on the same store"
    );
    ctx.kids.kill(mapper.idx);
    let killed_ms = now_unix_ms();
    let conf = write_serve_config(ctx.a, &ctx.dir, "serve-restart.toml", Some(mapper.grpc))?;
    let log = ctx.dir.join("serve-restart.log");
    let idx = ctx.kids.add(spawn_serve(&ctx.exe, &conf, &log)?, &log);
    let mut tail = LogTail::new(log);
    // The running front end keeps answering from its map meanwhile: probed once a second.
    let (mut ok, mut probes, mut probed) = (0, 0, Instant::now() - Duration::from_secs(1));
    let grpc = mapper.grpc;
    let dns = front.dns;
    let mut probe = || {
        if probed.elapsed() >= Duration::from_secs(1) {
            probes += 1;
            ok += usize::from(answers(dns, "cdn.example."));
            probed = Instant::now();
        }
    };
    let name = ("dns-restart.log", "cdnmap dns (started with the restart)");
    let fresh = start_front(ctx, grpc, name, &mut probe)?;
    let restarted = wait_for(
        "listening line of the restarted mapper",
        ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || {
            tail.poll();
            tail.listening()
        },
    )?;
    let restored = tail.find(|e| match e {
        Event::Restored { epoch, version } => Some((*epoch, *version)),
        _ => None,
    });
    // The running front end takes the restarted mapper's map once it has reconnected.
    let waited = Instant::now();
    let running_took = loop {
        front.log.poll();
        let took = front.log.events.iter().find_map(|(t, e)| match e {
            Event::InUse { epoch, version } if *t > killed_ms => Some((*t, (*epoch, *version))),
            _ => None,
        });
        if took.is_some() || waited.elapsed() > Duration::from_secs(30) {
            break took;
        }
        ctx.kids.check(&ctx.dir)?;
        std::thread::sleep(POLL);
    };
    mapper.idx = idx;
    mapper.log = tail;
    let s = |t: f64| (t - killed_ms) / 1e3;
    Ok(Restart {
        stored,
        restored: restored.map(|(t, (e, v))| (s(t), e, v)),
        listening_s: s(restarted.0),
        fresh,
        killed_ms,
        running_took: running_took.map(|(t, id)| (s(t), id)),
        running_held: front
            .log
            .events
            .iter()
            .rev()
            .filter(|(t, _)| *t <= killed_ms)
            .find_map(|(_, e)| match e {
                Event::InUse { epoch, version } => Some((*epoch, *version)),
                _ => None,
            }),
        probes: (ok, probes),
        peak_mb: peak_rss_mb(ctx.kids.pid(idx)),
    })
}

// ---------------------------------------------------------------------------------------------
// The figures.

fn median_max(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (f64::NAN, f64::NAN),
        n if n % 2 == 1 => (v[n / 2], v[n - 1]),
        n => ((v[n / 2 - 1] + v[n / 2]) / 2.0, v[n - 1]),
    }
}

fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

/// For each round of `rounds`, the time from its `round published` line (written after the
/// round is persisted, when WatchMap announces it) to the front end of `log` taking it into
/// use, ms.
fn front_lags(rounds: &[RoundRec], log: &LogTail) -> Vec<f64> {
    rounds
        .iter()
        .filter_map(|r| {
            let (t, ()) = log.find(|e| {
                (*e == Event::InUse {
                    epoch: r.epoch,
                    version: r.version,
                })
                .then_some(())
            })?;
            Some(t - r.at_ms)
        })
        .collect()
}

/// Everything measured before the restart.
struct Figures {
    first_map_s: f64,
    listening_s: f64,
    store_first: u64,
    store_after: u64,
    versions: u64,
    join: Join,
    front: (f64, f64),
    late: (f64, f64),
    peaks: [Option<f64>; 3],
    deltas: Vec<UpdateRec>,
    units: usize,
    /// [`front_lags`] of the first front end over the counted rounds.
    lags: Vec<f64>,
    /// The first round's persist, ms (the first map is served after it).
    first_persist_ms: f64,
}

fn fmt_mb(x: Option<f64>) -> String {
    x.map_or("unknown".into(), |v| format!("{v:.0} MB"))
}

/// A row of the rounds' table: median and max over all counted rounds, the quiet ones and
/// those with the DNS load.
fn print_row(name: &str, c: &Counted, f: impl Fn(&RoundRec) -> f64, digits: usize) {
    let cell = |rs: &[RoundRec]| {
        let (m, x) = median_max(rs.iter().map(&f).collect());
        format!("{m:.digits$} / {x:.digits$}")
    };
    let q = c.quiet.min(c.rounds.len());
    println!(
        "| {name} | {} | {} | {} |",
        cell(&c.rounds),
        cell(&c.rounds[..q]),
        cell(&c.rounds[q..])
    );
}

fn print_rounds(a: &ServeBenchArgs, c: &Counted) {
    let v = |i: usize| c.rounds.get(i).map_or(0, |r| r.version);
    let (n, q) = (c.rounds.len(), c.quiet.min(c.rounds.len()));
    println!(
        "round parts over {n} counted rounds (versions {}..={}), from the mapper's log (`round \
         parts` and `round published` lines), with reports flowing; the DNS load ran during \
         the last {} (versions {}..={}):",
        v(0),
        v(n.saturating_sub(1)),
        n - q,
        v(q),
        v(n.saturating_sub(1))
    );
    println!(
        "| part, ms: median / max | all {n} rounds | {q} rounds without DNS load | {} rounds with it |",
        n - q
    );
    println!("|---|---|---|---|");
    let names = [
        "estimator",
        "effective preferences",
        "solve",
        "index",
        "publish",
        "persist",
    ];
    for (i, name) in names.iter().enumerate() {
        print_row(name, c, |r| r.parts[i], 1);
    }
    print_row("the loop's step (estimator to index)", c, |r| r.step_ms, 1);
    print_row(
        "**round in all** (step + publish + persist)",
        c,
        RoundRec::total_ms,
        1,
    );
    print_row("churn (%)", c, |r| 100.0 * r.churn, 3);
    let over = c
        .rounds
        .iter()
        .filter(|r| r.total_ms() > a.cycle_secs as f64 * 1e3)
        .count();
    println!(
        "overruns: {over} of the counted rounds over the {} s cycle; {} `round took longer than \
         the cycle` lines in the whole log",
        a.cycle_secs, c.slow
    );
}

fn print_service(a: &ServeBenchArgs, f: &Figures, c: &Counted, stats: &ReportStats) {
    println!(
        "first published map: {:.1} s after the mapper's start (the demo world generated, the cold \
         round; its `round published` line, after its persist of {:.1} s; listening at {:.1} s)",
        f.first_map_s,
        f.first_persist_ms / 1e3,
        f.listening_s
    );
    let (m, x) = median_max(f.lags.clone());
    println!(
        "a round's map in use at the first front end {m:.0} ms (median) after the round's `round \
         published` line, max {x:.0} ms, over {} counted rounds (WatchMap announces a round after \
         its persist)",
        f.lags.len()
    );
    let ld = |x: &AtomicU64| x.load(Ordering::Relaxed);
    println!(
        "reports over {:.0} s: {} demand reports, {} samples ({:.0}/s acknowledged before the DNS \
         load, {:.0}/s during it, of {}/s asked; {} ticks skipped with {MAX_REPORTS_IN_FLIGHT} \
         calls open); {} load reports, {} node loads; {} calls failed{}; slowest call {:.0} ms",
        c.report_secs,
        ld(&stats.demand_reports),
        ld(&stats.samples),
        c.report_rates.0,
        c.report_rates.1,
        a.report_rate
            .unwrap_or((a.map_units as u64).div_ceil(a.cycle_secs)),
        ld(&stats.skipped),
        ld(&stats.load_reports),
        ld(&stats.loads),
        ld(&stats.failed),
        lock(&stats.first_error)
            .as_ref()
            .map_or(String::new(), |e| format!(" (first: {e})")),
        ld(&stats.latency_us_max) as f64 / 1e3
    );
    println!(
        "peak RSS (VmHWM): cdnmap serve {}; cdnmap dns {} (started with it), {} (joined late); \
         this bench's own process (the world, its WatchMap client's map, the reports) {}, {:.0} s \
         of CPU so far",
        fmt_mb(f.peaks[0]),
        fmt_mb(f.peaks[1]),
        fmt_mb(f.peaks[2]),
        fmt_mb(peak_rss_mb(Some(std::process::id()))),
        cpu_secs(std::process::id()).unwrap_or(f64::NAN)
    );
    println!(
        "store on disk: {:.1} MB after the first round; {:.1} MB after {} rounds (versions 1..={}), \
         the demand record of the reports included",
        mb(f.store_first as f64),
        mb(f.store_after as f64),
        f.versions,
        f.versions
    );
    let j = f.join;
    println!(
        "joining: the whole map over WatchMap to the bench's own client in {:.2} s (messages: {}, units: {}, \
         {:.1} MB on the wire); cdnmap dns started with the mapper: map in use {:.2} s after its start, \
         first answer {:.2} s; cdnmap dns started after counted round {}: map in use {:.2} s, first answer {:.2} s",
        j.secs, j.messages, j.units, mb(j.wire_bytes as f64), f.front.0, f.front.1, c.late_after, f.late.0, f.late.1
    );
    print_deltas(f);
    let d = &c.dns;
    println!(
        "DNS during the last {} counted rounds, {} against the first cdnmap dns: {:.0} queries/s, NOERROR {:.2}%, \
         lost {}, mean latency {}; the front end's CPU {:.2} µs per query",
        c.rounds.len() - c.quiet.min(c.rounds.len()),
        d.tool,
        d.qps,
        d.noerror_pct,
        d.lost,
        if d.latency_ms.is_nan() {
            "not measured".to_string()
        } else {
            format!("{:.3} ms", d.latency_ms)
        },
        c.dns_cpu_us
    );
}

fn print_deltas(f: &Figures) {
    if f.deltas.is_empty() {
        println!("a round's delta: not observed (the bench's WatchMap client got no delta in the counted rounds)");
        return;
    }
    let units = median_max(
        f.deltas
            .iter()
            .map(|d| (d.units + d.removed) as f64)
            .collect(),
    );
    let bytes = median_max(f.deltas.iter().map(|d| d.wire_bytes as f64).collect());
    println!(
        "a round's delta (WatchMap, {} deltas seen by the bench's client behind a byte-counting relay): \
         median {:.0} units ({:.2}% of {}), max {:.0}; median {:.2} MB on the wire, max {:.2} MB \
         (the whole map: {:.1} MB)",
        f.deltas.len(),
        units.0,
        100.0 * units.0 / f.units.max(1) as f64,
        f.units,
        units.1,
        mb(bytes.0),
        mb(bytes.1),
        mb(f.join.wire_bytes as f64)
    );
}

fn print_restart(r: &Restart) {
    let s = |t: f64| (t - r.killed_ms) / 1e3;
    let (e, v) = r.fresh.in_use;
    let stored = if v == r.stored {
        "the stored map"
    } else {
        "NOT the stored map"
    };
    let stream = r
        .fresh
        .log
        .find(|e| (*e == Event::Following).then_some(()))
        .map_or("—".into(), |(t, ())| format!("{:.1} s", s(t)));
    println!(
        "restart (kill -9, then a start on the same store, version {} stored): the stored map served \
         {}; listening {:.1} s; a cdnmap dns started with it: WatchMap stream open {stream} (after its \
         reconnection backoff), map in use {:.1} s (epoch {e} version {v}: {stored}), first DNS \
         answer {:.1} s after the kill",
        r.stored,
        r.restored.map_or("— no `serving the stored map` line".into(), |(t, e, v)| format!(
            "{t:.1} s after the kill (epoch {e} version {v})"
        )),
        r.listening_s,
        s(r.fresh.in_use_ms),
        s(r.fresh.answer_ms)
    );
    println!(
        "  meanwhile the running front end answered {} of {} probes (one a second) and {}; the \
         restarted mapper's peak RSS {}",
        r.probes.0,
        r.probes.1,
        r.running_took.map_or(
            "took no new map version within 30 s".into(),
            |(t, (e, v))| format!(
                "took its first map version after the kill, epoch {e} version {v}, into use \
                 {t:.1} s after it (it held {})",
                r.running_held
                    .map_or("none".into(), |(e, v)| format!("epoch {e} version {v}"))
            )
        ),
        fmt_mb(r.peak_mb)
    );
}

fn print_logs(mapper: &LogTail, fronts: &[&LogTail]) {
    let cps: Vec<(f64, f64)> = mapper
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Checkpoint { bytes, ms } => Some((*bytes, *ms)),
            _ => None,
        })
        .collect();
    if let Some(&(bytes, _)) = cps.last() {
        let (m, x) = median_max(cps.iter().map(|c| c.1).collect());
        println!(
            "estimator checkpoints (off the round): {} of {:.0} MB, median {m:.0} ms, max {x:.0} ms",
            cps.len(),
            mb(bytes)
        );
    }
    let errors: Vec<&String> = std::iter::once(mapper)
        .chain(fronts.iter().copied())
        .flat_map(|l| l.events.iter())
        .filter_map(|(_, e)| match e {
            Event::Error(line) => Some(line),
            _ => None,
        })
        .collect();
    if let Some(first) = errors.first() {
        println!("ERROR lines in the logs: {} (first: {first})", errors.len());
    }
}

// ---------------------------------------------------------------------------------------------
// The command.

/// The world the mapper serves (generated here the same way, for the reports) and the DNS
/// load's query file from it.
fn prepare_world(a: &ServeBenchArgs, dir: &Path) -> Result<(Arc<Instance>, PathBuf)> {
    let t = Instant::now();
    let params = WorldParams {
        map_units: a.map_units,
        clusters: a.clusters,
        seed: a.seed,
        ..WorldParams::default()
    };
    let inst = world::generate(&params, &|_| {})?;
    let queries = dir.join("queries.bin");
    let (n_a, n_aaaa) = write_queries(&inst, a.queries, a.seed, &queries)?;
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
    Ok((Arc::new(inst), queries))
}

/// Where the files go: `--out`, else a temporary directory (returned, to be kept while the
/// servers run).
fn out_dir(a: &ServeBenchArgs) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    Ok(match &a.out {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("cdnmap-bench-serve-")
                .tempdir()?;
            (temp.path().to_path_buf(), Some(temp))
        }
    })
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
    print_rounds(a, &c);
    print_service(a, &f, &c, &stats);
    print_restart(&r);
    print_logs(
        &first_log,
        &[&mapper.log, &front.log, &c.late.log, &r.fresh.log],
    );
    Ok(())
}

pub fn serve(a: &ServeBenchArgs) -> Result<ExitCode> {
    let rate = check_args(a)?;
    let (dir, _temp) = out_dir(a)?;
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
    let result = run(&mut ctx, &rt, inst, rate, &queries);
    drop(ctx); // kills the children before the temporary directory goes
    rt.shutdown_timeout(Duration::from_secs(5));
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
            Some(Event::Parts([0.5, 1.0, 2.5, 3.0, 4.0, 5.25]))
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
        assert_eq!(median_max(vec![3.0, 1.0, 2.0]), (2.0, 3.0));
        assert_eq!(median_max(vec![4.0, 1.0, 2.0, 3.0]), (2.5, 4.0));
        assert!(median_max(Vec::new()).0.is_nan());
    }
}
