//! `cdnmap bench dns`: dnsperf against `cdnmap dns` (following a real `cdnmap serve`), against
//! gdnsd with `plugin_geoip` answering from a `nets` map of the same world (a longest-prefix
//! match per query, as `cdnmap dns` does), against gdnsd serving a static zone, and against
//! Knot DNS in three setups ([`crate::knot`]), on loopback, in one run (`--servers` picks a
//! subset).
//!
//! The query file holds realistic ECS queries: map units drawn by demand from the world the
//! mapper serves, a client subnet inside each (/24 for IPv4, /56 for IPv6, or the unit's prefix
//! when shorter), A for IPv4 clients and AAAA for IPv6 ones, hostnames of every traffic class
//! (with a thousand content names per class). It is written in dnsperf's binary format (`-B`:
//! each message prefixed by its 2-byte length), since dnsperf's text format cannot give each
//! query its own ECS option.
//!
//! The gdnsd peers: **gdnsd-geoip** has one map per traffic class whose `nets` are every map
//! unit's prefixes of that class, each to the unit's first two candidates (a resource per class
//! names each datacenter's addresses), so each query is a longest-prefix match over the world's
//! prefixes and an answer with the matched net's scope: the job `cdnmap dns` does, but for the
//! map's contents (the candidates' order, not the solved map, which moves every round; the cost
//! of a lookup does not depend on which cluster it finds). gdnsd allows 254 datacenters a map:
//! a world of more clusters shares them (cluster `c` is datacenter `c mod 254`), which changes
//! no lookup. **gdnsd-static** answers the same names from a static zone (every name a fixed
//! set of addresses: no lookup at all), so its ratio says what the lookup costs altogether.
//! **knot-static**, **knot-geoip** (`mod-geoip` in subnet mode, a view per prefix of the
//! world: the job gdnsd-geoip does) and **knot-geoip-signed** (the same with `mod-onlinesign`,
//! ECDSA P-256, asked with a twin of the query file whose queries set the DO bit: every answer
//! signed afresh) are the issue 44 peers; their answers to the query file's first queries are
//! checked against the world before the runs (addresses and ECS scope; an RRSIG when signed).
//! The servers are measured in turn, `--runs` times each, and the medians compared
//! against issue 16's targets: at least both gdnsd peers' queries per second, and no more CPU
//! per query than gdnsd-geoip (Knot's ratios are printed for reference). Beside the medians it prints the ratios run by run (cdnmap dns's
//! run over the peer's run of the same round, measured one right after the other, so that the
//! machine's drift over the benchmark cancels), and dnsperf's own CPU per query while it sends:
//! dnsperf and the server share the machine's two cores, so a rate follows both. Before the
//! runs, `cdnmap dns`'s answers to the first 2,000 queries of the file are checked against the
//! mapper's `Resolve` (addresses in order, ECS scope): a benchmark of wrong answers would be no
//! benchmark.
//!
//! During the runs the mapper is paused (SIGSTOP, continued after): in production it runs on
//! other machines than the front ends, and here its rounds (at 11 M map units seconds of CPU
//! each, on a 2-core machine that dnsperf and the server already fill) would fall into some
//! servers' runs and not others'. `cdnmap dns` answers from the map it holds, as gdnsd does
//! from its configuration; `--mapper-running` measures with the rounds going on.
//!
//! `--dnstap FILE` adds one more server to the turns: a second `cdnmap dns` following the same
//! mapper with dnstap on (`dnstap_file = FILE`, every query and response logged, or one of
//! `--dnstap-sample`), and prints its rate and CPU a query over the first front end's, run by
//! run, against issue 44's target (at least 0.9× the rate without it), with the messages it
//! wrote and dropped.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cdnmap_mapper::UnitIdx;
use cdnmap_proto::v1 as pb;
use cdnmap_topology::Topology;
use clap::Args;
use hickory_server::proto::op::Message;
use hickory_server::proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use hickory_server::proto::rr::RecordType;

use crate::dns_query::{ask, wait_answering, write_queries, QueryFlags, NAMES};
use crate::knot;
use crate::procs::{cpu_secs, free_port, out_dir, program, spawn, Proc};
use cdnmap_world::world::WorldParams;

#[derive(Args, Debug)]
pub struct DnsBenchArgs {
    /// Map units of the demo world the mapper serves.
    #[arg(long, default_value_t = 30_000)]
    pub map_units: usize,
    /// Clusters of the demo world.
    #[arg(long, default_value_t = 120)]
    pub clusters: usize,
    /// The world's seed (also the query file's).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Queries in the query file (dnsperf loops over it).
    #[arg(long, default_value_t = 100_000)]
    pub queries: usize,
    /// Seconds per dnsperf run.
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// dnsperf runs per server, the servers in turn. Nine by default: on a small machine the
    /// runs fall into a fast and a slow mode (the scheduler's, `docs/perf/bench-serve.md`),
    /// and a median over a few rounds moves with how many land in the slow one.
    #[arg(long, default_value_t = 9)]
    pub runs: usize,
    /// dnsperf clients (source ports).
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Queries outstanding at most.
    #[arg(long, default_value_t = 200)]
    pub outstanding: usize,
    /// Keep the query file, configurations and logs here (default: a temporary directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Let the mapper run its rounds during the dnsperf runs (by default it is paused, SIGSTOP,
    /// for their length: its rounds would take a core from whichever server's runs they fall
    /// in, and `cdnmap dns` answers from the map it holds either way).
    #[arg(long)]
    pub mapper_running: bool,
    /// UDP answering threads of each server, the same for all three (`cdnmap dns
    /// --udp-threads`, gdnsd's `udp_threads`). Default: half the cores, at least one; dnsperf
    /// runs on the same machine and takes the rest.
    #[arg(long)]
    pub udp_threads: Option<usize>,
    /// `cdnmap dns --udp-coalesce-us` (default: the front end's own, 50; 0 turns the receive
    /// coalescing off, to measure what it gives).
    #[arg(long)]
    pub udp_coalesce_us: Option<u64>,
    /// The servers measured, comma-separated (default: all of them, measured in this order).
    /// knot-geoip-signed is asked with the query file's twin whose queries set the DO bit;
    /// every other server with the query file itself.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Server::ALL)]
    pub servers: Vec<Server>,
    /// Every query carries a DNS cookie (RFC 7873): a client cookie of its own, with no server
    /// cookie (dnsperf cannot send back what a server gave), so each answer makes a new server
    /// cookie: the costliest case. The same query file goes to every server.
    #[arg(long)]
    pub cookies: bool,
    /// `cdnmap dns`'s `rrl_responses_per_sec` (default: off). dnsperf sends from one address,
    /// so a limit below the rate of the bench's most asked name (`www.cdn.example`, about a
    /// sixth of the queries) limits the bench: give one above it (100000, the most allowed)
    /// to measure what the accounting costs.
    #[arg(long)]
    pub rrl_responses_per_sec: Option<u32>,
    /// Also measure a second `cdnmap dns` logging queries and responses in dnstap to this file
    /// (`dnstap_file`), in the same turns, and compare it with the first.
    #[arg(long)]
    pub dnstap: Option<PathBuf>,
    /// With `--dnstap`: log one query of this many (`dnstap_sample`, default 1: every one).
    #[arg(long, default_value_t = 1, requires = "dnstap")]
    pub dnstap_sample: u32,
}

impl DnsBenchArgs {
    /// The front end's flags for this bench's settings. The settings without a flag (response
    /// rate limiting) and `extra` (TOML lines) go into a configuration file, `dir/NAME.toml`.
    fn front_args(&self, dir: &Path, name: &str, extra: &str) -> Result<Vec<String>> {
        let mut args = vec!["--udp-threads".to_string(), self.threads().to_string()];
        if let Some(us) = self.udp_coalesce_us {
            args.extend(["--udp-coalesce-us".to_string(), us.to_string()]);
        }
        let mut config = extra.to_string();
        if let Some(rate) = self.rrl_responses_per_sec {
            config.push_str(&format!("rrl_responses_per_sec = {rate}\n"));
        }
        if !config.is_empty() {
            let path = dir.join(format!("{name}.toml"));
            std::fs::write(&path, config)?;
            args.extend(["--config".to_string(), path.display().to_string()]);
        }
        Ok(args)
    }

    /// The query file's flags: a client cookie in each query with `--cookies`; the DO bit
    /// when `dnssec_ok`.
    fn query_flags(&self, dnssec_ok: bool) -> QueryFlags {
        QueryFlags {
            dnssec_ok,
            cookies: self.cookies,
        }
    }

    /// The servers of `--servers`, each once, in the order they are measured.
    fn selected(&self) -> Vec<Server> {
        let mut servers = self.servers.clone();
        servers.sort();
        servers.dedup();
        servers
    }

    /// The UDP threads each server runs: `--udp-threads`, else half the cores (at least 1).
    fn threads(&self) -> usize {
        self.udp_threads.unwrap_or_else(|| {
            (std::thread::available_parallelism().map_or(2, |n| n.get()) / 2).max(1)
        })
    }
}

/// A process stopped (SIGSTOP) while this lives, continued (SIGCONT) when it is dropped.
struct Paused<'a>(&'a Proc);

impl<'a> Paused<'a> {
    fn new(p: &'a Proc) -> Result<Self> {
        signal(p, libc::SIGSTOP)?;
        Ok(Paused(p))
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        let _ = signal(self.0, libc::SIGCONT);
    }
}

fn signal(p: &Proc, sig: libc::c_int) -> Result<()> {
    let pid = libc::pid_t::try_from(p.0.id()).context("a process id")?;
    // SAFETY: kill(2) on a child this process started and has not reaped (it is waited for
    // only when its `Proc` is dropped, after this).
    if unsafe { libc::kill(pid, sig) } != 0 {
        bail!(
            "signalling {} (pid {pid}): {}",
            p.1,
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// The most queries a query file holds.
const MAX_QUERIES: usize = 10_000_000;
/// The most datacenters gdnsd's geoip plugin allows in one map.
const GDNSD_MAX_DCS: usize = 254;

/// gdnsd's configuration in `dir` (listening on `port` with `udp_threads`, with `plugins`, a
/// config fragment), and its zone: the SOA, NS and `records`.
fn write_gdnsd_config(
    dir: &Path,
    (port, udp_threads): (u16, usize),
    plugins: &str,
    records: &str,
) -> Result<()> {
    for sub in ["zones", "run", "state", "geoip"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    std::fs::write(
        dir.join("config"),
        format!(
            "options => {{\n  listen => [ 127.0.0.1:{port} ]\n  udp_threads => {udp_threads}\n  run_dir => {}\n  state_dir => {}\n}}\n{plugins}",
            dir.join("run").display(),
            dir.join("state").display()
        ),
    )?;
    let zone = format!(
        "$TTL 20\n@ SOA ns1 hostmaster 1 3600 600 86400 60\n@ NS ns1\n@ NS ns2\n\
         ns1 A 127.0.0.1\nns2 A 127.0.0.1\n{records}"
    );
    std::fs::write(dir.join("zones").join("cdn.example"), zone)?;
    Ok(())
}

/// gdnsd serving the query file's names from a static zone.
fn write_gdnsd_static(dir: &Path, port: (u16, usize)) -> Result<()> {
    let mut records = String::new();
    for (name, _) in NAMES {
        for i in 1..=3 {
            records.push_str(&format!("{name} A 198.18.0.{i}\n"));
        }
        records.push_str(&format!(
            "{name} AAAA 2001:db8::1\n{name} AAAA 2001:db8::2\n"
        ));
    }
    write_gdnsd_config(dir, port, "", &records)
}

/// gdnsd with `plugin_geoip` answering the query file's names from `world` (module docs): a
/// map and a resource per class, each map's `nets` in a file of its own (`geoip/nets-CLASS`).
/// Returns how many nets it wrote.
fn write_gdnsd_geoip(dir: &Path, port: (u16, usize), world: &Topology) -> Result<usize> {
    let geoip_dir = dir.join("geoip");
    std::fs::create_dir_all(&geoip_dir)
        .with_context(|| format!("creating {}", geoip_dir.display()))?;
    let dcs = world.clusters().len().clamp(1, GDNSD_MAX_DCS);
    let dc_names: Vec<String> = (0..dcs).map(|d| format!("dc{d}")).collect();
    let mut nets = 0;
    let mut maps = String::new();
    let mut resources = String::new();
    for (c, class) in world.classes().iter().enumerate() {
        let file = format!("nets-{}", class.name);
        let path = geoip_dir.join(&file);
        let mut w = BufWriter::new(
            File::create(&path).with_context(|| format!("creating {}", path.display()))?,
        );
        for u in 0..world.unit_count() as UnitIdx {
            if usize::from(world.unit_class(u)) != c {
                continue;
            }
            let list: Vec<String> = world
                .candidates(u)
                .take(2)
                .map(|k| dc_names[k.cluster as usize % dcs].clone())
                .collect();
            if list.is_empty() {
                continue;
            }
            for net in world.unit_prefixes(u) {
                writeln!(w, "{net} => [ {} ]", list.join(", "))?;
                nets += 1;
            }
        }
        w.flush()?;
        maps.push_str(&format!(
            "      m-{0} => {{\n        datacenters => [ {1} ]\n        nets => {file}\n      }}\n",
            class.name,
            dc_names.join(", ")
        ));
        // Each datacenter's addresses: those of the first cluster it stands for, by family
        // (multifo's `addrs_v4` and `addrs_v6`); a family it has none of, a stand-in.
        let mut dcmap = String::new();
        for (d, name) in dc_names.iter().enumerate() {
            let addrs = world.cluster_addresses(d as u32);
            let family = |v4: bool, stand_in: &str| {
                let list: Vec<String> = addrs
                    .iter()
                    .filter(|a| a.is_ipv4() == v4)
                    .map(|a| a.to_string())
                    .collect();
                if list.is_empty() {
                    stand_in.to_string()
                } else {
                    list.join(", ")
                }
            };
            dcmap.push_str(&format!(
                "          {name} => {{ addrs_v4 => [ {} ], addrs_v6 => [ {} ] }}\n",
                family(true, "198.18.0.1"),
                family(false, "2001:db8::1")
            ));
        }
        resources.push_str(&format!(
            "      {0} => {{\n        map => m-{0}\n        dcmap => {{\n{dcmap}        }}\n      }}\n",
            class.name
        ));
    }
    let plugins = format!(
        "plugins => {{\n  geoip => {{\n    undefined_datacenters_ok => true\n    maps => {{\n{maps}    }}\n    resources => {{\n{resources}    }}\n  }}\n}}\n"
    );
    let mut records = String::new();
    for (name, class) in NAMES {
        if world.class_index(class).is_some() {
            records.push_str(&format!("{name} DYNA geoip!{class}\n"));
        } else {
            records.push_str(&format!("{name} A 198.18.0.1\n"));
        }
    }
    write_gdnsd_config(dir, port, &plugins, &records)?;
    Ok(nets)
}

/// dnsperf's CPU seconds a second while it sends (process `pid`, a run of `seconds`), read from
/// /proc over the run's middle: from 15% to 90% of its length. Not over its whole life: after
/// sending it waits for late answers, and that wait (seconds at full CPU when a server lost a
/// few queries) is no cost of the answers it got.
fn client_cpu_rate(pid: u32, seconds: u64) -> Option<f64> {
    let run = Duration::from_secs(seconds);
    std::thread::sleep(run.mul_f64(0.15));
    let (t0, c0) = (Instant::now(), cpu_secs(pid)?);
    std::thread::sleep(run.mul_f64(0.75));
    let (t1, c1) = (Instant::now(), cpu_secs(pid)?);
    Some((c1 - c0) / (t1 - t0).as_secs_f64())
}

/// One dnsperf run's figures.
#[derive(Debug, Clone, Default)]
pub(crate) struct Run {
    pub(crate) qps: f64,
    /// The server's CPU time per query answered, microseconds.
    pub(crate) cpu_us: f64,
    /// dnsperf's own CPU time per query answered while it sends, microseconds (what the
    /// server's answers cost the load generator: on a machine that dnsperf and the server
    /// share, the rate follows the two together).
    pub(crate) client_cpu_us: f64,
    pub(crate) latency_ms: f64,
    pub(crate) stddev_ms: f64,
    pub(crate) lost: f64,
    pub(crate) noerror_pct: f64,
    pub(crate) sent: f64,
    pub(crate) completed: f64,
    /// dnsperf's own measure of how long it ran, seconds.
    pub(crate) run_secs: f64,
    /// The largest latency, ms.
    pub(crate) latency_max_ms: f64,
    /// Each response code with how many answers had it, as dnsperf lists them.
    pub(crate) rcodes: Vec<(String, u64)>,
}

pub(crate) fn parse_dnsperf(out: &str) -> Result<Run> {
    let field = |label: &str| -> Option<f64> {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let noerror_pct = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Response codes:"))
        .and_then(|rest| rest.split("NOERROR").nth(1))
        .and_then(|rest| rest.split('(').nth(1))
        .and_then(|rest| rest.split('%').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    // `Average Latency (s):  0.002220 (min 0.000014, max 0.016658)`
    let latency_max = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Average Latency (s):"))
        .and_then(|rest| rest.split("max").nth(1))
        .and_then(|rest| rest.trim().trim_end_matches(')').parse::<f64>().ok());
    Ok(Run {
        qps: field("Queries per second:").context("dnsperf printed no queries per second")?,
        cpu_us: f64::NAN,
        client_cpu_us: f64::NAN,
        latency_ms: field("Average Latency (s):").unwrap_or(f64::NAN) * 1e3,
        stddev_ms: field("Latency StdDev (s):").unwrap_or(f64::NAN) * 1e3,
        lost: field("Queries lost:").unwrap_or(f64::NAN),
        noerror_pct,
        sent: field("Queries sent:").unwrap_or(f64::NAN),
        completed: field("Queries completed:").unwrap_or(f64::NAN),
        run_secs: field("Run time (s):").unwrap_or(f64::NAN),
        latency_max_ms: latency_max.unwrap_or(f64::NAN) * 1e3,
        rcodes: parse_rcodes(out),
    })
}

/// dnsperf's `Response codes:` line (`NOERROR 99 (99.00%), NXDOMAIN 1 (1.00%)`): each code
/// and its count.
fn parse_rcodes(out: &str) -> Vec<(String, u64)> {
    let Some(line) = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Response codes:"))
    else {
        return Vec::new();
    };
    line.split(',')
        .filter_map(|part| {
            let mut words = part.split_whitespace();
            let code = words.next()?;
            let n = words.next()?.parse().ok()?;
            Some((code.to_string(), n))
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Refuses arguments out of their bounds.
fn check_args(a: &DnsBenchArgs) -> Result<()> {
    if a.queries == 0 || a.queries > MAX_QUERIES {
        bail!("--queries {}: must be in 1..={MAX_QUERIES}", a.queries);
    }
    if a.runs == 0 || a.runs > 100 {
        bail!("--runs {}: must be in 1..=100", a.runs);
    }
    if a.seconds == 0 || a.seconds > 3600 {
        bail!("--seconds {}: must be in 1..=3600", a.seconds);
    }
    use cdnmap_dns::config::{UDP_COALESCE_US, UDP_THREADS};
    if let Some(n) = a.udp_threads.filter(|n| !UDP_THREADS.contains(n)) {
        bail!("--udp-threads {n}: must be in {UDP_THREADS:?}");
    }
    if let Some(us) = a.udp_coalesce_us.filter(|us| !UDP_COALESCE_US.contains(us)) {
        bail!("--udp-coalesce-us {us}: must be in {UDP_COALESCE_US:?}");
    }
    if a.servers.is_empty() {
        bail!("--servers: name at least one server");
    }
    if a.servers.contains(&Server::CdnmapSigned) && !a.servers.contains(&Server::Cdnmap) {
        bail!("--servers: cdnmap-signed follows cdnmap's mapper; name cdnmap too");
    }
    if a.dnstap.is_some() && !a.servers.contains(&Server::Cdnmap) {
        bail!(
            "--dnstap: measures a second cdnmap dns beside the first; --servers must name cdnmap"
        );
    }
    use cdnmap_dns::rrl::RESPONSES_PER_SEC;
    if let Some(r) = a
        .rrl_responses_per_sec
        .filter(|r| !RESPONSES_PER_SEC.contains(r))
    {
        bail!("--rrl-responses-per-sec {r}: must be in {RESPONSES_PER_SEC:?}");
    }
    Ok(())
}

/// The world (the same one `cdnmap serve` builds from the same demo settings) and dnsperf's
/// query file from it, in `dir`.
fn query_file(a: &DnsBenchArgs, dir: &Path) -> Result<(Topology, PathBuf)> {
    let params = WorldParams {
        map_units: a.map_units,
        clusters: a.clusters,
        seed: a.seed,
        ..WorldParams::default()
    };
    let instance = crate::progress::generate_world(&params)?;
    let queries = dir.join("queries.bin");
    let (n_a, n_aaaa) =
        write_queries(&instance, a.queries, a.seed, &queries, a.query_flags(false))?;
    println!(
        "query file: {} queries ({n_a} A, {n_aaaa} AAAA), ECS from {} map units by demand{}: {}",
        a.queries,
        instance.unit_count(),
        if a.cookies {
            ", each with a client cookie"
        } else {
            ""
        },
        queries.display()
    );
    Ok((instance, queries))
}

/// The demo world a benchmark's mapper serves, and its cycle.
pub(crate) struct DemoWorld {
    pub map_units: usize,
    pub clusters: usize,
    pub seed: u64,
    pub cycle_secs: u64,
}

/// Starts the mapper (`cdnmap serve` on `world`, gRPC on `grpc`, HTTP on `http`, its store,
/// config and log in `dir`) and the front end (`cdnmap dns` on `dns_port` following it, logging
/// at info): (mapper, front end, the front end's address). Does not wait for either.
pub(crate) fn spawn_mapper_and_front_end(
    exe: &Path,
    dir: &Path,
    world: &DemoWorld,
    (grpc, http, dns_port): (u16, u16, u16),
    front_args: &[String],
) -> Result<(Proc, Proc, SocketAddr)> {
    let serve_conf = dir.join("serve.toml");
    std::fs::write(
        &serve_conf,
        format!(
            "grpc_listen = \"127.0.0.1:{grpc}\"\nhttp_listen = \"127.0.0.1:{http}\"\n\
             data_dir = {:?}\ncycle_secs = {}\n[demo]\nmap_units = {}\nclusters = {}\nseed = {}\n",
            dir.join("data").display().to_string(),
            world.cycle_secs,
            world.map_units,
            world.clusters,
            world.seed
        ),
    )?;
    let serve = spawn(
        Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(&serve_conf),
        &dir.join("serve.log"),
        "cdnmap serve",
    )?;
    let dns_addr = SocketAddr::from(([127, 0, 0, 1], dns_port));
    let front = spawn_front_end(exe, dir, grpc, dns_addr, front_args, "dns")?;
    Ok((serve, front, dns_addr))
}

/// A front end (`cdnmap dns` on `addr`, following the mapper with gRPC on `grpc`, with
/// `front_args`, logging at info to `dir/NAME.log`). Does not wait for it.
fn spawn_front_end(
    exe: &Path,
    dir: &Path,
    grpc: u16,
    addr: SocketAddr,
    front_args: &[String],
    name: &str,
) -> Result<Proc> {
    let mut cmd = Command::new(exe);
    cmd.arg("dns")
        .args(["--mapper", &format!("http://127.0.0.1:{grpc}")])
        .args(["--listen", &addr.to_string()])
        .args(["--zone", "cdn.example."])
        .args(front_args)
        .env("RUST_LOG", "info");
    spawn(&mut cmd, &dir.join(format!("{name}.log")), "cdnmap dns")
}

/// The second front end of `--dnstap`: dnstap to `file` (one query of `sample`), its metrics
/// on `metrics`; once it answers.
fn start_tapped(
    a: &DnsBenchArgs,
    exe: &Path,
    dir: &Path,
    grpc: u16,
    (port, metrics): (u16, u16),
    (file, sample): (&Path, u32),
) -> Result<(Proc, SocketAddr)> {
    let extra = format!(
        "dnstap_file = {:?}\ndnstap_sample = {sample}\nmetrics_listen = \"127.0.0.1:{metrics}\"\n",
        file.display().to_string()
    );
    let args = a.front_args(dir, "dns-dnstap", &extra)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut front = spawn_front_end(exe, dir, grpc, addr, &args, "dns-dnstap")?;
    wait_answering(addr, &mut [&mut front], dir)?;
    Ok((front, addr))
}

/// The values of the metrics `names` (each with its labels, as `/metrics` writes it) of the
/// front end with metrics on `metrics`; NaN for one it does not show.
fn metric_values<const N: usize>(metrics: u16, names: [&str; N]) -> Result<[f64; N]> {
    let page = crate::procs::http_get(SocketAddr::from(([127, 0, 0, 1], metrics)), "/metrics")?;
    Ok(names.map(|name| {
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    }))
}

/// The front ends whose metrics the bench reads after the runs: their metrics ports.
#[derive(Default)]
struct Watched {
    /// The one logging in dnstap (`--dnstap`).
    dnstap: Option<u16>,
    /// cdnmap-signed.
    signed: Option<u16>,
}

/// The mapper and the front end, once the front end answers: (mapper, front end, its address).
fn start_cdnmap(
    a: &DnsBenchArgs,
    exe: &Path,
    dir: &Path,
    ports: (u16, u16, u16),
) -> Result<(Proc, Proc, SocketAddr)> {
    let world = DemoWorld {
        map_units: a.map_units,
        clusters: a.clusters,
        seed: a.seed,
        cycle_secs: 30,
    };
    let (mut serve, mut front, dns_addr) =
        spawn_mapper_and_front_end(exe, dir, &world, ports, &a.front_args(dir, "dns", "")?)?;
    wait_answering(dns_addr, &mut [&mut serve, &mut front], dir)?;
    Ok((serve, front, dns_addr))
}

/// gdnsd from its configuration in `dir/NAME` (`name` also names its log), once it answers.
fn start_gdnsd(
    gdnsd: &Path,
    dir: &Path,
    name: &'static str,
    port: u16,
) -> Result<(Proc, SocketAddr)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut peer = spawn(
        Command::new(gdnsd)
            .arg("-c")
            .arg(dir.join(name))
            .arg("start"),
        &dir.join(format!("{name}.log")),
        name,
    )?;
    wait_answering(addr, &mut [&mut peer], dir)?;
    Ok((peer, addr))
}

/// A server `bench dns` measures (`--servers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Server {
    /// `cdnmap dns`, following `cdnmap serve`.
    Cdnmap,
    /// A second `cdnmap dns` of the same mapper signing online (an ECDSA P-256 key made by
    /// `dnssec-keygen`), asked with the DO bit.
    CdnmapSigned,
    /// gdnsd with `plugin_geoip` and the world's nets.
    GdnsdGeoip,
    /// gdnsd with a static zone.
    GdnsdStatic,
    /// Knot DNS with a static zone.
    KnotStatic,
    /// Knot DNS with `mod-geoip` in subnet mode and the world's prefixes.
    KnotGeoip,
    /// The same with `mod-onlinesign` (algorithm 13), asked with the DO bit.
    KnotGeoipSigned,
    /// A second `cdnmap dns` with dnstap on (`--dnstap`; not a `--servers` value).
    #[value(skip)]
    CdnmapDnstap,
}

impl Server {
    /// Every server, in the order they are measured.
    pub const ALL: [Server; 7] = [
        Server::Cdnmap,
        Server::CdnmapSigned,
        Server::GdnsdGeoip,
        Server::GdnsdStatic,
        Server::KnotStatic,
        Server::KnotGeoip,
        Server::KnotGeoipSigned,
    ];

    /// Its name in the output (and its log's).
    fn name(self) -> &'static str {
        match self {
            Server::Cdnmap => "cdnmap dns",
            Server::CdnmapSigned => "cdnmap-signed",
            Server::GdnsdGeoip => "gdnsd-geoip",
            Server::GdnsdStatic => "gdnsd-static",
            Server::KnotStatic => "knot-static",
            Server::KnotGeoip => "knot-geoip",
            Server::KnotGeoipSigned => "knot-geoip-signed",
            Server::CdnmapDnstap => "cdnmap dns+dnstap",
        }
    }

    /// Its line in the table of medians.
    fn what(self) -> &'static str {
        match self {
            Server::Cdnmap => "cdnmap dns (map lookup per query)",
            Server::CdnmapSigned => {
                "cdnmap-signed (the same, signed online, signature cache; DO queries)"
            }
            Server::GdnsdGeoip => "gdnsd-geoip (nets lookup per query)",
            Server::GdnsdStatic => "gdnsd-static (no lookup)",
            Server::KnotStatic => "knot-static (no lookup)",
            Server::KnotGeoip => "knot-geoip (mod-geoip subnet lookup per query)",
            Server::KnotGeoipSigned => {
                "knot-geoip-signed (the same, signed online per answer; DO queries)"
            }
            Server::CdnmapDnstap => "cdnmap dns with dnstap on",
        }
    }

    /// Its Knot setup, if it is Knot.
    fn knot(self) -> Option<knot::Setup> {
        match self {
            Server::KnotStatic => Some(knot::Setup::Static),
            Server::KnotGeoip => Some(knot::Setup::Geoip),
            Server::KnotGeoipSigned => Some(knot::Setup::GeoipSigned),
            _ => None,
        }
    }
}

/// A server started and checked, with the query file it is measured with.
struct Target {
    server: Server,
    addr: SocketAddr,
    proc: Proc,
    queries: PathBuf,
}

/// The dnsperf runs, taking the `targets` in turn; prints each run. Returns each target's runs,
/// in the order of `targets`.
fn measure(a: &DnsBenchArgs, dnsperf: &Path, targets: &[Target]) -> Result<Vec<Vec<Run>>> {
    let ports: Vec<String> = targets
        .iter()
        .map(|t| format!("{} on :{}", t.server.name(), t.addr.port()))
        .collect();
    println!(
        "dnsperf -B -l {} -c {} -q {}, {} runs each, in turn ({}); each server {} UDP thread(s); cdnmap dns's receive coalescing {}, response rate limiting {}",
        a.seconds,
        a.clients,
        a.outstanding,
        a.runs,
        ports.join(", "),
        a.threads(),
        a.udp_coalesce_us.map_or("at its default".to_string(), |us| format!("{us} µs")),
        a.rrl_responses_per_sec.map_or("off".to_string(), |r| format!("at {r}/s")),
    );
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); targets.len()];
    for r in 0..a.runs {
        for (i, t) in targets.iter().enumerate() {
            let run = dnsperf_run(a, dnsperf, t)?;
            println!(
                "  run {}: {:<17} {:>9.0} q/s  {:.2} µs CPU/query (dnsperf {:.2})  latency {:.3} ms (stddev {:.3})  lost {}  NOERROR {:.2}%",
                r + 1,
                t.server.name(),
                run.qps,
                run.cpu_us,
                run.client_cpu_us,
                run.latency_ms,
                run.stddev_ms,
                run.lost,
                run.noerror_pct
            );
            results[i].push(run);
        }
    }
    Ok(results)
}

/// One dnsperf run against `t`, with the server's CPU time over it.
fn dnsperf_run(a: &DnsBenchArgs, dnsperf: &Path, t: &Target) -> Result<Run> {
    let pid = t.proc.0.id();
    let cpu_before = cpu_secs(pid);
    let child = Command::new(dnsperf)
        .args([
            "-s",
            "127.0.0.1",
            "-p",
            &t.addr.port().to_string(),
            "-B",
            "-d",
        ])
        .arg(&t.queries)
        .args(["-l", &a.seconds.to_string()])
        .args(["-c", &a.clients.to_string()])
        .args(["-q", &a.outstanding.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running dnsperf")?;
    let client_rate = client_cpu_rate(child.id(), a.seconds);
    let out = child.wait_with_output().context("waiting for dnsperf")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut run = parse_dnsperf(&text).with_context(|| {
        format!(
            "dnsperf against {}: {}{}",
            t.server.name(),
            text,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let answered = run.qps * a.seconds as f64;
    if let (Some(b), Some(e)) = (cpu_before, cpu_secs(pid)) {
        run.cpu_us = (e - b) / answered * 1e6;
    }
    run.client_cpu_us = client_rate.map_or(f64::NAN, |r| r / run.qps * 1e6);
    Ok(run)
}

/// Queries of the query file checked against the mapper's `Resolve`.
const CHECKED: usize = 2_000;

/// What a DNS answer says: the addresses in order, and the ECS scope.
type Said = (Vec<String>, Option<u8>);

/// `cdnmap dns`'s answer to the encoded query `raw`, if it answered.
fn dns_says(addr: SocketAddr, raw: &[u8]) -> Option<Said> {
    let m = ask(addr, raw)?;
    let addrs = m
        .answers
        .iter()
        .filter_map(|r| r.data.ip_addr())
        .map(|a| a.to_string())
        .collect();
    let scope = m
        .edns
        .as_ref()
        .and_then(|e| match e.option(EdnsCode::Subnet) {
            Some(EdnsOption::Subnet(s)) => Some(s.scope_prefix()),
            _ => None,
        });
    Some((addrs, scope))
}

/// Checks `cdnmap dns` (at `dns`) against the mapper's `ResolveBatch` (gRPC on `grpc`) on the
/// first [`CHECKED`] queries of the query file: every answer's addresses, in order, and scope
/// must be `Resolve`'s. A round may land between the two questions: a query that differs is
/// asked again, both ways, a second later. Returns (checked, equal at once, equal at the second
/// look).
fn check_answers(dns: SocketAddr, grpc: u16, queries: &Path) -> Result<(usize, usize, usize)> {
    let bytes = std::fs::read(queries).with_context(|| format!("reading {}", queries.display()))?;
    let (mut raws, mut requests) = (Vec::new(), Vec::new());
    let mut at = 0;
    while at + 2 <= bytes.len() && raws.len() < CHECKED {
        let len = usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
        let raw = bytes
            .get(at + 2..at + 2 + len)
            .context("the query file is cut short")?;
        at += 2 + len;
        let m = Message::from_vec(raw).context("a query of the query file does not parse")?;
        let q = m.queries.first().context("a query without a question")?;
        let subnet = match m.edns.as_ref().and_then(|e| e.option(EdnsCode::Subnet)) {
            Some(EdnsOption::Subnet(s)) => format!("{}/{}", s.addr(), s.source_prefix()),
            _ => String::new(),
        };
        requests.push(pb::ResolveRequest {
            client_subnet: subnet,
            resolver_ip: "127.0.0.1".into(),
            qname: q.name().to_ascii(),
            qtype: u32::from(u16::from(q.query_type())),
        });
        raws.push(raw.to_vec());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mapper_says = |requests: &[pb::ResolveRequest]| -> Result<Vec<Said>> {
        runtime.block_on(async {
            let mut client =
                pb::mapping_client::MappingClient::connect(format!("http://127.0.0.1:{grpc}"))
                    .await
                    .context("connecting to the mapper's gRPC")?;
            let mut out = Vec::with_capacity(requests.len());
            for chunk in requests.chunks(1000) {
                let answers = client
                    .resolve_batch(pb::ResolveBatchRequest {
                        queries: chunk.to_vec(),
                    })
                    .await
                    .context("ResolveBatch")?
                    .into_inner()
                    .answers;
                if answers.len() != chunk.len() {
                    bail!(
                        "ResolveBatch answered {} of {} queries",
                        answers.len(),
                        chunk.len()
                    );
                }
                out.extend(answers.into_iter().map(|a| {
                    let scope = u8::try_from(a.scope_prefix_len).ok();
                    (a.addresses, scope)
                }));
            }
            Ok(out)
        })
    };
    let want = mapper_says(&requests)?;
    let differ: Vec<usize> = (0..raws.len())
        .filter(|&i| dns_says(dns, &raws[i]).as_ref() != want.get(i))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let again: Vec<pb::ResolveRequest> = differ.iter().map(|&i| requests[i].clone()).collect();
    let want_again = mapper_says(&again)?;
    let still: Vec<usize> = differ
        .iter()
        .zip(&want_again)
        .filter(|&(&i, w)| dns_says(dns, &raws[i]).as_ref() != Some(w))
        .map(|(&i, _)| i)
        .collect();
    if let Some(&i) = still.first() {
        bail!(
            "cdnmap dns and Resolve differ on {} of {} queries, twice; the first: {:?}: dns {:?}, Resolve {:?}",
            still.len(),
            raws.len(),
            requests[i],
            dns_says(dns, &raws[i]),
            want_again[differ.iter().position(|&d| d == i).unwrap_or(0)]
        );
    }
    Ok((raws.len(), raws.len() - differ.len(), differ.len()))
}

/// The medians of each server's runs (`results[i]` of `servers[i]`), and, with cdnmap dns
/// measured, the ratios against issue 16's targets (gdnsd's) and against Knot's setups for
/// reference. `threads`: each server's UDP threads, for how busy they were.
fn print_medians(servers: &[Server], results: &[Vec<Run>], threads: usize) {
    let med = |i: usize, f: &dyn Fn(&Run) -> f64| median(results[i].iter().map(f).collect());
    // The share of its UDP threads' cores a server kept busy (CPU seconds a second).
    let busy = |r: &Run| 100.0 * r.qps * r.cpu_us / 1e6 / threads as f64;
    println!();
    println!(
        "| server | median q/s | median CPU per query (µs) | dnsperf's CPU per query (µs) | median busy (of {threads} core(s)) | median latency (ms) | NOERROR |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, s) in servers.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.0}% | {:.3} | {:.2}% |",
            s.what(),
            med(i, &|r| r.qps),
            med(i, &|r| r.cpu_us),
            med(i, &|r| r.client_cpu_us),
            med(i, &busy),
            med(i, &|r| r.latency_ms),
            med(i, &|r| r.noerror_pct)
        );
    }
    println!();
    // A server whose threads are not kept busy is not what limits the rate: dnsperf is.
    let saturated = (0..servers.len()).all(|i| med(i, &busy) >= SATURATED_PCT);
    let Some(ours) = servers.iter().position(|&s| s == Server::Cdnmap) else {
        return;
    };
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    let q = |i: usize| med(i, &|r| r.qps);
    let cpu = |i: usize| med(i, &|r| r.cpu_us);
    let peers: Vec<(usize, Server)> = servers
        .iter()
        .copied()
        .enumerate()
        .filter(|&(i, _)| i != ours)
        .collect();
    for &(peer, s) in &peers {
        let ratio = q(ours) / q(peer);
        let (lo, mid, hi) = paired(&results[ours], &results[peer], |r| r.qps);
        let target = match s {
            Server::GdnsdGeoip | Server::GdnsdStatic => {
                format!("target >= 1.0: {}", met(ratio >= 1.0))
            }
            Server::KnotGeoipSigned => "cdnmap dns unsigned against Knot signing".to_string(),
            Server::CdnmapSigned => format!(
                "the inverse is signed / unsigned: {:.3}, target >= {SIGNED_TARGET}: {}",
                1.0 / ratio,
                met(1.0 / ratio >= SIGNED_TARGET)
            ),
            Server::CdnmapDnstap => format!(
                "the inverse is dnstap on / off: {:.3}, target >= {DNSTAP_TARGET}: {}",
                1.0 / ratio,
                met(1.0 / ratio >= DNSTAP_TARGET)
            ),
            _ => "for reference".to_string(),
        };
        println!(
            "queries per second, cdnmap dns / {}: {ratio:.3} ({target}); run by run (the two measured one after the other): median {mid:.3}, from {lo:.3} to {hi:.3}",
            s.name()
        );
    }
    for &(peer, s) in &peers {
        let (lo, mid, hi) = paired(&results[ours], &results[peer], |r| r.cpu_us);
        println!(
            "CPU per query, {} / cdnmap dns, run by run: median {:.3}, from {:.3} to {:.3}",
            s.name(),
            1.0 / mid,
            1.0 / hi,
            1.0 / lo
        );
    }
    print_cpu_targets(&peers, &|i| cpu(i), ours);
    let signed = servers.iter().position(|&s| s == Server::CdnmapSigned);
    let knot_signed = servers.iter().position(|&s| s == Server::KnotGeoipSigned);
    if let (Some(ours), Some(knot)) = (signed, knot_signed) {
        let ratio = q(ours) / q(knot);
        let (lo, mid, hi) = paired(&results[ours], &results[knot], |r| r.qps);
        println!(
            "queries per second, cdnmap-signed / knot-geoip-signed: {ratio:.3} (target >= {SIGNED_OVER_KNOT}: {}); run by run: median {mid:.3}, from {lo:.3} to {hi:.3}",
            met(ratio >= SIGNED_OVER_KNOT)
        );
    }
    if !saturated {
        println!(
            "the servers' threads were not all busy (>= {SATURATED_PCT:.0}%): the rates are bounded by dnsperf, not by the servers, and their ratios tie within the noise; the CPU per query is what tells the servers apart here"
        );
    }
}

/// Each peer's CPU a query over cdnmap dns's (by the medians, `cpu` of a server's index), with
/// issue 16's target against gdnsd-geoip.
fn print_cpu_targets(peers: &[(usize, Server)], cpu: &dyn Fn(usize) -> f64, ours: usize) {
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    for &(peer, s) in peers {
        let ratio = cpu(peer) / cpu(ours);
        match s {
            Server::GdnsdGeoip => println!(
                "CPU per query, gdnsd-geoip / cdnmap dns: {ratio:.3} (target >= 1.0, no more CPU a \
                 query than gdnsd-geoip: {}; the comparison least sensitive to what else the machine runs)",
                met(ratio >= 1.0)
            ),
            Server::GdnsdStatic | Server::KnotStatic => println!(
                "CPU per query, {} / cdnmap dns: {ratio:.3} (for reference: what the lookup, the server pick and the demand count cost over a fixed answer)",
                s.name()
            ),
            _ => println!(
                "CPU per query, {} / cdnmap dns: {ratio:.3} (for reference)",
                s.name()
            ),
        }
    }
}

/// Issue 44's target: the rate with dnstap on at least this share of the rate without.
const DNSTAP_TARGET: f64 = 0.9;
/// Issue 44's targets for signing: the signed rate at least this share of the unsigned one...
const SIGNED_TARGET: f64 = 0.8;
/// ... and at least this many times Knot's signed rate (`mod-geoip` with `mod-onlinesign`).
const SIGNED_OVER_KNOT: f64 = 10.0;

/// `f` of each of `ours` over `f` of `theirs` in the same round (measured one right after the
/// other, so the machine's drift over the whole benchmark cancels out): the least, the median
/// and the largest of these ratios (all NaN when no round gave one).
fn paired(ours: &[Run], theirs: &[Run], f: impl Fn(&Run) -> f64) -> (f64, f64, f64) {
    let ratios: Vec<f64> = ours
        .iter()
        .zip(theirs)
        .map(|(ours, theirs)| f(ours) / f(theirs))
        .filter(|r| r.is_finite())
        .collect();
    if ratios.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, median(ratios), hi)
}

/// How busy (percent of its UDP threads' cores) a server must be for its rate to be its own
/// limit rather than the load generator's.
const SATURATED_PCT: f64 = 90.0;

/// A peer configured before the servers start: its port, the query file it is measured with,
/// and the answers it must give to that file's first queries (Knot's geo setups).
struct Planned {
    server: Server,
    port: u16,
    queries: PathBuf,
    expected: Vec<knot::Expected>,
}

/// The query file's twin with the DO bit set, `dir/queries-do.bin`, written once.
fn do_queries(a: &DnsBenchArgs, dir: &Path, world: &Topology) -> Result<PathBuf> {
    let path = dir.join("queries-do.bin");
    if !path.exists() {
        write_queries(world, a.queries, a.seed, &path, a.query_flags(true))?;
        println!(
            "query file with the DO bit set (the same queries): {}",
            path.display()
        );
    }
    Ok(path)
}

/// A second `cdnmap dns` of the mapper on `grpc`, signing with a key `dnssec-keygen` makes in
/// `dir/keys` (a CSK, algorithm 13), listening on `port`; once it answers a DO query of
/// `queries` with an RRSIG.
fn start_signed(
    a: &DnsBenchArgs,
    exe: &Path,
    dir: &Path,
    grpc: u16,
    (port, metrics): (u16, u16),
    queries: &Path,
) -> Result<(Proc, SocketAddr)> {
    let keygen = program("dnssec-keygen")?;
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys)?;
    let out = Command::new(keygen)
        .args(["-q", "-a", "ECDSAP256SHA256", "-f", "KSK", "-K"])
        .arg(&keys)
        .arg("cdn.example")
        .stdin(Stdio::null())
        .output()
        .context("running dnssec-keygen")?;
    if !out.status.success() {
        bail!(
            "dnssec-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let base = keys.join(String::from_utf8_lossy(&out.stdout).trim());
    let extra = format!(
        "dnssec_keys = [{:?}]\nmetrics_listen = \"127.0.0.1:{metrics}\"\n",
        base.display().to_string()
    );
    let args = a.front_args(dir, "dns-signed", &extra)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut front = spawn_front_end(exe, dir, grpc, addr, &args, "dns-signed")?;
    wait_answering(addr, &mut [&mut front], dir)?;
    // A signed answer, not only an answer: the first DO query's answer ends with its RRSIG.
    let raw = std::fs::read(queries).with_context(|| format!("reading {}", queries.display()))?;
    let len = raw
        .get(..2)
        .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        .context("an empty query file")?;
    let first = raw.get(2..2 + len).context("a cut query file")?;
    let signed = ask(addr, first).is_some_and(|m| {
        m.answers
            .iter()
            .any(|r| r.record_type() == RecordType::RRSIG)
    });
    if !signed {
        bail!(
            "cdnmap-signed answered a DO query without an RRSIG; see {}",
            dir.join("dns-signed.log").display()
        );
    }
    Ok((front, addr))
}

/// Writes peer `s`'s configuration in `dir/NAME` from `world` (and, for the signed setup, the
/// query file's twin with the DO bit): `None` when the world is beyond what it takes.
fn plan_peer(
    a: &DnsBenchArgs,
    s: Server,
    dir: &Path,
    world: &Topology,
    queries: &Path,
) -> Result<Option<Planned>> {
    let port = free_port()?;
    let at = (port, a.threads());
    let sub = dir.join(s.name());
    let mut plan = Planned {
        server: s,
        port,
        queries: queries.to_path_buf(),
        expected: Vec::new(),
    };
    match (s, s.knot()) {
        (Server::Cdnmap, _) => return Ok(None),
        (Server::CdnmapSigned, _) => {
            do_queries(a, dir, world)?;
            return Ok(None);
        }
        (Server::GdnsdGeoip, _) => {
            let nets = write_gdnsd_geoip(&sub, at, world)?;
            println!(
                "gdnsd-geoip: {nets} nets in {} maps (one a class), {} datacenters",
                world.classes().len(),
                world.clusters().len().clamp(1, GDNSD_MAX_DCS)
            );
        }
        (Server::GdnsdStatic, _) => write_gdnsd_static(&sub, at)?,
        (_, Some(setup)) => {
            let Some(views) = knot::write_config(&sub, at, setup, world)? else {
                println!(
                    "{}: skipped: the world's prefixes make more than {} views, Knot's bound here",
                    s.name(),
                    knot::MAX_VIEWS
                );
                return Ok(None);
            };
            if setup == knot::Setup::GeoipSigned {
                plan.queries = do_queries(a, dir, world)?;
            }
            if setup != knot::Setup::Static {
                plan.expected = knot::expected_geo(world, &plan.queries, knot::CHECKED)?;
                println!(
                    "{}: {views} mod-geoip views (one per prefix and owner name)",
                    s.name()
                );
            }
        }
        (_, None) => return Ok(None),
    }
    Ok(Some(plan))
}

/// Starts a planned peer and checks its answers (Knot's: [`knot::check_answers`]).
fn start_peer(
    plan: Planned,
    dir: &Path,
    gdnsd: Option<&Path>,
    knotd: Option<&Path>,
) -> Result<Target> {
    let started = Instant::now();
    let name = plan.server.name();
    let (proc, addr) = match (plan.server.knot(), knotd, gdnsd) {
        (Some(_), Some(knotd), _) => knot::start(knotd, dir, name, plan.port)?,
        (None, _, Some(gdnsd)) => start_gdnsd(gdnsd, dir, name, plan.port)?,
        _ => bail!("{name}: its program was not looked for"),
    };
    println!(
        "{name} answering {:.1} s after its start",
        started.elapsed().as_secs_f64()
    );
    if let Some(setup) = plan.server.knot() {
        let n = knot::check_answers(addr, setup, &plan.queries, &plan.expected)?;
        let what = match setup {
            knot::Setup::Static => "NOERROR with addresses, ECS echoed",
            knot::Setup::Geoip => "the world's addresses for the client's prefix, its length as the ECS scope",
            knot::Setup::GeoipSigned => {
                "the world's addresses for the client's prefix, its length as the ECS scope, an RRSIG"
            }
        };
        println!("answers: {name} gave {what} to all {n} queries checked");
    }
    Ok(Target {
        server: plan.server,
        addr,
        proc,
        queries: plan.queries,
    })
}

/// The mapper and `cdnmap dns` following it, its answers checked against `Resolve`, and beside
/// it the signed front end and the dnstap one when asked for: each pushed onto `targets`. The
/// mapper, and the dnstap front end's metrics port.
fn start_cdnmaps(
    a: &DnsBenchArgs,
    servers: &[Server],
    exe: &Path,
    dir: &Path,
    queries: &Path,
    targets: &mut Vec<Target>,
) -> Result<(Proc, Watched)> {
    let mut watched = Watched::default();
    let [grpc, http, dns_port] = [(); 3].map(|()| free_port());
    let (grpc, http, dns_port) = (grpc?, http?, dns_port?);
    let (mapper, front, dns_addr) = start_cdnmap(a, exe, dir, (grpc, http, dns_port))?;
    let (checked, equal, later) = check_answers(dns_addr, grpc, queries)?;
    println!(
        "answers: cdnmap dns gave Resolve's answer (addresses in order, ECS scope) to all \
         {checked} queries checked ({equal} at once, {later} at a second look after a round)"
    );
    targets.push(Target {
        server: Server::Cdnmap,
        addr: dns_addr,
        proc: front,
        queries: queries.to_path_buf(),
    });
    if servers.contains(&Server::CdnmapSigned) {
        let do_file = dir.join("queries-do.bin");
        let ports = (free_port()?, free_port()?);
        let (p, addr) = start_signed(a, exe, dir, grpc, ports, &do_file)?;
        println!("cdnmap-signed: a second front end signing online, asked with DO queries");
        watched.signed = Some(ports.1);
        targets.push(Target {
            server: Server::CdnmapSigned,
            addr,
            proc: p,
            queries: do_file,
        });
    }
    if let Some(file) = &a.dnstap {
        let ports = (free_port()?, free_port()?);
        let (p, addr) = start_tapped(a, exe, dir, grpc, ports, (file, a.dnstap_sample))?;
        println!(
            "{}: a second front end logging {} in dnstap to {}",
            Server::CdnmapDnstap.name(),
            if a.dnstap_sample == 1 {
                "every query and response".to_string()
            } else {
                format!("one query (and response) of {}", a.dnstap_sample)
            },
            file.display()
        );
        watched.dnstap = Some(ports.1);
        targets.push(Target {
            server: Server::CdnmapDnstap,
            addr,
            proc: p,
            queries: queries.to_path_buf(),
        });
    }
    Ok((mapper, watched))
}

pub fn dns(a: &DnsBenchArgs) -> Result<std::process::ExitCode> {
    check_args(a)?;
    let servers = a.selected();
    let dnsperf = program("dnsperf")?;
    let gdnsd = servers
        .iter()
        .any(|s| matches!(s, Server::GdnsdGeoip | Server::GdnsdStatic))
        .then(|| program("gdnsd"))
        .transpose()?;
    let knotd = servers
        .iter()
        .any(|s| s.knot().is_some())
        .then(knot::knotd)
        .transpose()?;
    let (dir, scratch) = out_dir(a.out.as_deref(), "cdnmap-bench-dns-")?;
    let exe = std::env::current_exe().context("finding the cdnmap binary")?;
    let (world, queries) = query_file(a, &dir)?;
    let mut planned = Vec::new();
    for &s in &servers {
        planned.extend(plan_peer(a, s, &dir, &world, &queries)?);
    }
    drop(world);
    let mut targets = Vec::new();
    let (mut serve, mut watched) = (None, Watched::default());
    if servers.contains(&Server::Cdnmap) {
        let (mapper, w) = start_cdnmaps(a, &servers, &exe, &dir, &queries, &mut targets)?;
        serve = Some(mapper);
        watched = w;
    }
    for plan in planned {
        targets.push(start_peer(plan, &dir, gdnsd.as_deref(), knotd.as_deref())?);
    }
    let results = {
        let _paused = match &serve {
            Some(mapper) if !a.mapper_running => {
                println!("the mapper is paused (SIGSTOP) during the runs: cdnmap dns answers from the map it holds (--mapper-running to let it run its rounds)");
                Some(Paused::new(mapper)?)
            }
            _ => None,
        };
        measure(a, &dnsperf, &targets)?
    };
    let measured: Vec<Server> = targets.iter().map(|t| t.server).collect();
    print_medians(&measured, &results, a.threads());
    if let Some(metrics) = watched.signed {
        let [hits, misses] = metric_values(
            metrics,
            [
                "cdnmap_dns_dnssec_signatures_total{cache=\"hit\"}",
                "cdnmap_dns_dnssec_signatures_total{cache=\"miss\"}",
            ],
        )?;
        println!(
            "cdnmap-signed's signature cache, over the check and every run: {hits:.0} signatures found, {misses:.0} made ({:.1}% found)",
            100.0 * hits / (hits + misses).max(1.0)
        );
    }
    if let (Some(file), Some(metrics)) = (&a.dnstap, watched.dnstap) {
        // The writer counts messages as written when it flushes: idle 0.2 s, at least every
        // second.
        std::thread::sleep(Duration::from_millis(1500));
        let [written, dropped] = metric_values(
            metrics,
            [
                "cdnmap_dns_dnstap_written_total",
                "cdnmap_dns_dnstap_dropped_total",
            ],
        )?;
        let bytes = std::fs::metadata(file).map_or(0, |m| m.len());
        println!(
            "dnstap: {written:.0} messages written ({:.1} MB in {}), {dropped:.0} dropped ({:.3}% of those made)",
            bytes as f64 / 1e6,
            file.display(),
            100.0 * dropped / (written + dropped).max(1.0)
        );
    }
    let peaks: Vec<String> = targets
        .iter()
        .map(|t| match crate::procs::memory_mb(t.proc.0.id()) {
            Some((peak, _)) => format!("{} {peak:.0} MB", t.server.name()),
            None => format!("{} not read", t.server.name()),
        })
        .collect();
    println!("peak RSS (VmHWM): {}", peaks.join(", "));
    drop(targets);
    drop(serve);
    scratch.done();
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns_query::query;
    use std::net::IpAddr;

    #[test]
    fn paired_ratios_compare_each_round_with_itself() {
        let run = |qps: f64| Run {
            qps,
            ..Run::default()
        };
        // A machine slowing down over the benchmark: every server slower each round, cdnmap
        // dns 1.1× the static zone within each round; medians of all runs would blur that.
        let results = [
            vec![run(110.0), run(88.0), run(66.0)],
            vec![run(1.0), run(1.0), run(1.0)],
            vec![run(100.0), run(80.0), run(f64::NAN)],
        ];
        let (lo, mid, hi) = paired(&results[0], &results[2], |r| r.qps);
        assert!((lo - 1.1).abs() < 1e-12 && (mid - 1.1).abs() < 1e-12 && (hi - 1.1).abs() < 1e-12);
        let (lo, mid, hi) = paired(&results[0], &results[1], |r| r.qps);
        assert_eq!((lo, mid, hi), (66.0, 88.0, 110.0));
        // No round with a ratio: nothing to say, rather than an empty range.
        let none = [vec![run(f64::NAN)], vec![run(1.0)], vec![run(1.0)]];
        let (lo, mid, hi) = paired(&none[0], &none[2], |r| r.qps);
        assert!(lo.is_nan() && mid.is_nan() && hi.is_nan());
    }

    #[test]
    fn dnsperf_output_is_parsed() {
        let out = "Statistics:\n\n  Queries sent:         100\n  Queries completed:    100 (100.00%)\n  \
                   Queries lost:         0 (0.00%)\n\n  Response codes:       NOERROR 99 (99.00%), NXDOMAIN 1 (1.00%)\n  \
                   Run time (s):         2.000175\n  Queries per second:   42556.238258\n\n  Average Latency (s):  0.002220 (min 0.000014, max 0.016658)\n  \
                   Latency StdDev (s):   0.001000\n";
        let r = parse_dnsperf(out).expect("parses");
        assert_eq!(r.qps, 42556.238258);
        assert!((r.latency_ms - 2.22).abs() < 1e-9);
        assert!((r.stddev_ms - 1.0).abs() < 1e-9);
        assert_eq!(r.lost, 0.0);
        assert_eq!(r.noerror_pct, 99.0);
        assert_eq!((r.sent, r.completed, r.run_secs), (100.0, 100.0, 2.000175));
        assert!((r.latency_max_ms - 16.658).abs() < 1e-9);
        assert_eq!(
            r.rcodes,
            vec![("NOERROR".to_string(), 99), ("NXDOMAIN".to_string(), 1)]
        );
        assert!(parse_dnsperf("nothing").is_err());
    }

    /// gdnsd, started on the geoip configuration of a small world, answers a client of each
    /// unit's prefix with the addresses of the unit's first candidate and a scope covering the
    /// prefix: the peer does the job it stands for. (A real gdnsd, installed from Debian when
    /// missing.)
    #[test]
    fn gdnsd_geoip_answers_each_prefix_with_its_units_first_candidate() {
        let world = cdnmap_world::world::generate(
            &WorldParams {
                map_units: 300,
                clusters: 10,
                seed: 5,
                ..WorldParams::default()
            },
            &|_| {},
        )
        .expect("world");
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port().expect("port");
        let nets = write_gdnsd_geoip(&dir.path().join("g"), (port, 1), &world).expect("config");
        let prefixes: usize = (0..world.unit_count() as UnitIdx)
            .map(|u| world.unit_prefixes(u).len())
            .sum();
        assert_eq!(nets, prefixes);
        let gdnsd = cdnmap_tests::ensure_debian_tool("gdnsd", &["gdnsd"]).expect("gdnsd");
        let (peer, addr) = start_gdnsd(&gdnsd, dir.path(), "g", port).expect("gdnsd answers");
        let mut checked = 0;
        for u in (0..world.unit_count() as UnitIdx).step_by(7) {
            let class = &world.classes()[usize::from(world.unit_class(u))].name;
            let name = match class.as_str() {
                "video" => "v1.video.cdn.example.",
                "apps" => "api1.apps.cdn.example.",
                _ => "c1.web.cdn.example.",
            };
            let Some(net) = world.unit_prefixes(u).iter().find(|n| n.addr().is_ipv4()) else {
                continue;
            };
            let first = world.candidates(u).next().expect("a candidate").cluster;
            let q = query(
                1,
                name,
                RecordType::A,
                Some(*net),
                QueryFlags::default(),
                None,
            )
            .expect("query");
            let (mut got, scope) = dns_says(addr, &q).expect("an answer");
            let mut want: Vec<String> = world
                .cluster_addresses(first)
                .iter()
                .filter(|a| a.is_ipv4())
                .map(IpAddr::to_string)
                .collect();
            got.sort();
            want.sort();
            assert_eq!(got, want, "unit {u} ({net}, {class})");
            // The prefix, or wider where gdnsd merged neighbours of the same answer.
            assert!(
                scope.is_some_and(|s| s <= net.prefix_len()),
                "unit {u} ({net}): scope {scope:?}"
            );
            checked += 1;
        }
        assert!(checked >= 20, "only {checked} units checked");
        drop(peer);
    }

    #[test]
    fn query_files_are_length_prefixed_messages_with_ecs() {
        let world = cdnmap_world::world::generate(
            &WorldParams {
                map_units: 200,
                clusters: 8,
                seed: 3,
                ..WorldParams::default()
            },
            &|_| {},
        )
        .expect("world");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.bin");
        let (a, aaaa) =
            write_queries(&world, 500, 3, &path, QueryFlags::default()).expect("writes");
        assert_eq!(a + aaaa, 500);
        let bytes = std::fs::read(&path).expect("read");
        let (mut at, mut seen) = (0, 0);
        while at < bytes.len() {
            let len = usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
            let m = Message::from_vec(&bytes[at + 2..at + 2 + len]).expect("a DNS message");
            let q = &m.queries[0];
            assert!(q.name().to_ascii().ends_with(".cdn.example."));
            let ecs = m
                .edns
                .as_ref()
                .and_then(|e| e.option(hickory_server::proto::rr::rdata::opt::EdnsCode::Subnet));
            let Some(EdnsOption::Subnet(s)) = ecs else {
                panic!("no ECS in query {seen}");
            };
            // The family of the subnet matches the query type.
            assert_eq!(s.addr().is_ipv4(), q.query_type() == RecordType::A);
            assert!(!m.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok));
            at += 2 + len;
            seen += 1;
        }
        assert_eq!(seen, 500);
        // The twin with the DO bit: the same queries, each with DO set.
        let twin = dir.path().join("q-do.bin");
        assert_eq!(
            write_queries(
                &world,
                500,
                3,
                &twin,
                QueryFlags {
                    dnssec_ok: true,
                    cookies: false,
                },
            )
            .expect("writes"),
            (a, aaaa)
        );
        let twin = std::fs::read(&twin).expect("read");
        let (mut at, mut at_twin) = (0, 0);
        while at < bytes.len() {
            let len = usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
            let len_twin = usize::from(u16::from_be_bytes([twin[at_twin], twin[at_twin + 1]]));
            let m = Message::from_vec(&bytes[at + 2..at + 2 + len]).expect("a DNS message");
            let t = Message::from_vec(&twin[at_twin + 2..at_twin + 2 + len_twin]).expect("DNS");
            assert_eq!(m.queries, t.queries);
            assert!(t.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok));
            at += 2 + len;
            at_twin += 2 + len_twin;
        }
    }
}
