//! `cdnmap bench dns`: dnsperf against `cdnmap dns` (following a real `cdnmap serve`), against
//! gdnsd with `plugin_geoip` answering from a `nets` map of the same world (a longest-prefix
//! match per query, as `cdnmap dns` does), and against gdnsd serving a static zone, on
//! loopback, in one run.
//!
//! The query file holds realistic ECS queries: map units drawn by demand from the world the
//! mapper serves, a client subnet inside each (/24 for IPv4, /56 for IPv6, or the unit's prefix
//! when shorter), A for IPv4 clients and AAAA for IPv6 ones, hostnames of every traffic class
//! (with a thousand content names per class). It is written in dnsperf's binary format (`-B`:
//! each message prefixed by its 2-byte length), since dnsperf's text format cannot give each
//! query its own ECS option.
//!
//! The two peers: **gdnsd-geoip** has one map per traffic class whose `nets` are every map
//! unit's prefixes of that class, each to the unit's first two candidates (a resource per class
//! names each datacenter's addresses), so each query is a longest-prefix match over the world's
//! prefixes and an answer with the matched net's scope: the job `cdnmap dns` does, but for the
//! map's contents (the candidates' order, not the solved map, which moves every round; the cost
//! of a lookup does not depend on which cluster it finds). gdnsd allows 254 datacenters a map:
//! a world of more clusters shares them (cluster `c` is datacenter `c mod 254`), which changes
//! no lookup. **gdnsd-static** answers the same names from a static zone (every name a fixed
//! set of addresses: no lookup at all), so its ratio says what the lookup costs altogether.
//! The three servers are measured in turn, `--runs` times each, and the medians compared
//! against issue 16's targets: at least both peers' queries per second, and no more CPU per
//! query than gdnsd-geoip. Beside the medians it prints the ratios run by run (cdnmap dns's
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
//! `--dnstap FILE` adds a fourth server to the turns: a second `cdnmap dns` following the same
//! mapper with dnstap on (`dnstap_file = FILE`, every query and response logged, or one of
//! `--dnstap-sample`), and prints its rate and CPU a query over the first front end's, run by
//! run, against issue 44's target (at least 0.9× the rate without it), with the messages it
//! wrote and dropped.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cdnmap_dns::config::fqdn;
use cdnmap_mapper::UnitIdx;
use cdnmap_proto::v1 as pb;
use cdnmap_topology::Topology;
use clap::Args;
use hickory_server::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_server::proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};
use hickory_server::proto::rr::RecordType;
use ipnet::IpNet;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::procs::{check_running, cpu_secs, free_port, out_dir, program, spawn, Proc};
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
    /// Also measure a second `cdnmap dns` logging queries and responses in dnstap to this file
    /// (`dnstap_file`), in the same turns, and compare it with the first.
    #[arg(long)]
    pub dnstap: Option<PathBuf>,
    /// With `--dnstap`: log one query of this many (`dnstap_sample`, default 1: every one).
    #[arg(long, default_value_t = 1, requires = "dnstap")]
    pub dnstap_sample: u32,
}

impl DnsBenchArgs {
    /// The front end's flags for this bench's settings.
    fn front_args(&self) -> Vec<String> {
        let mut args = vec!["--udp-threads".to_string(), self.threads().to_string()];
        if let Some(us) = self.udp_coalesce_us {
            args.extend(["--udp-coalesce-us".to_string(), us.to_string()]);
        }
        args
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
/// Content names per class in the query file.
const NAMES_PER_CLASS: u32 = 1000;
/// How long a server may take to start answering (at 11 M units the mapper's first map and a
/// front end's join take minutes; a server that exits fails the wait at once).
const READY: Duration = Duration::from_secs(900);

/// One query, encoded.
fn query(id: u16, name: &str, qtype: RecordType, subnet: Option<IpNet>) -> Result<Vec<u8>> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    let name = fqdn("query", name).map_err(|e| anyhow::anyhow!("{e}"))?;
    m.add_query(Query::query(name, qtype));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    if let Some(net) = subnet {
        edns.options_mut()
            .insert(EdnsOption::Subnet(ClientSubnet::from(net)));
    }
    m.set_edns(edns);
    Ok(m.to_vec()?)
}

/// `addr`'s answer to the query `q` (encoded), if one came within 300 ms.
fn ask(addr: SocketAddr, q: &[u8]) -> Option<Message> {
    let socket = UdpSocket::bind("127.0.0.1:0").ok()?;
    socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .ok()?;
    socket.send_to(q, addr).ok()?;
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).ok()?;
    Message::from_vec(&buf[..n]).ok()
}

/// Whether `addr` answers `www.<zone> A` with NOERROR and an address.
pub(crate) fn answers(addr: SocketAddr, zone: &str) -> bool {
    query(7, &format!("www.{zone}"), RecordType::A, None)
        .ok()
        .and_then(|q| ask(addr, &q))
        .is_some_and(|m| m.metadata.response_code == ResponseCode::NoError && !m.answers.is_empty())
}

fn wait_answering(addr: SocketAddr, procs: &mut [&mut Proc], dir: &Path) -> Result<()> {
    let started = Instant::now();
    while !answers(addr, "cdn.example.") {
        check_running(procs, dir)?;
        if started.elapsed() > READY {
            bail!(
                "{addr} did not answer within {READY:?}; see the logs in {}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// A host address inside `net` at `offset` (wrapped into the host part).
fn host(net: IpNet, offset: u128) -> IpAddr {
    match net {
        IpNet::V4(n) => {
            let span = 1u64 << (32 - u32::from(n.prefix_len()));
            let a = u64::from(u32::from(n.network())) + (offset as u64 % span);
            IpAddr::V4(Ipv4Addr::from(a as u32))
        }
        IpNet::V6(n) => {
            let bits = 128 - u32::from(n.prefix_len());
            let span = if bits >= 128 {
                u128::MAX
            } else {
                (1u128 << bits) - 1
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) | (offset & span)))
        }
    }
}

/// Writes the query file; returns how many queries of each type it holds.
pub(crate) fn write_queries(
    instance: &Topology,
    n: usize,
    seed: u64,
    path: &Path,
) -> Result<(usize, usize)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xd115);
    let units: Vec<UnitIdx> = (0..instance.unit_count() as UnitIdx)
        .filter(|&u| !instance.unit_prefixes(u).is_empty() && instance.unit_demand(u) > 0.0)
        .collect();
    if units.is_empty() {
        bail!("the world has no map unit with a prefix and demand");
    }
    let mut cum = Vec::with_capacity(units.len());
    let mut total = 0.0;
    for &u in &units {
        total += instance.unit_demand(u);
        cum.push(total);
    }
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::new(file);
    let (mut a, mut aaaa) = (0, 0);
    for i in 0..n {
        let x = rng.random::<f64>() * total;
        let u = units[cum.partition_point(|&c| c <= x).min(units.len() - 1)];
        let prefixes = instance.unit_prefixes(u);
        let net = prefixes[rng.random_range(0..prefixes.len())];
        let class = &instance.classes()[usize::from(instance.unit_class(u))].name;
        let k = rng.random_range(0..NAMES_PER_CLASS);
        let name = match class.as_str() {
            "video" => format!("v{k}.video.cdn.example."),
            "apps" => format!("api{k}.apps.cdn.example."),
            _ if k % 2 == 0 => "www.cdn.example.".to_string(),
            _ => format!("c{k}.web.cdn.example."),
        };
        let (qtype, len) = match net {
            IpNet::V4(_) => {
                a += 1;
                (RecordType::A, net.prefix_len().min(24))
            }
            IpNet::V6(_) => {
                aaaa += 1;
                (RecordType::AAAA, net.prefix_len().min(56))
            }
        };
        let client = IpNet::new(host(net, rng.random::<u128>()), len)?.trunc();
        let bytes = query(i as u16, &name, qtype, Some(client))?;
        w.write_all(&(bytes.len() as u16).to_be_bytes())?;
        w.write_all(&bytes)?;
    }
    w.flush()?;
    Ok((a, aaaa))
}

/// The names of the query file and the traffic class each stands for.
const NAMES: [(&str, &str); 4] = [
    ("www", "web"),
    ("*.web", "web"),
    ("*.video", "video"),
    ("*.apps", "apps"),
];
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
    let (n_a, n_aaaa) = write_queries(&instance, a.queries, a.seed, &queries)?;
    println!(
        "query file: {} queries ({n_a} A, {n_aaaa} AAAA), ECS from {} map units by demand: {}",
        a.queries,
        instance.unit_count(),
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
    let conf = dir.join("dns-dnstap.toml");
    std::fs::write(
        &conf,
        format!(
            "dnstap_file = {:?}\ndnstap_sample = {sample}\nmetrics_listen = \"127.0.0.1:{metrics}\"\n",
            file.display().to_string()
        ),
    )?;
    let mut args = vec!["--config".to_string(), conf.display().to_string()];
    args.extend(a.front_args());
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut front = spawn_front_end(exe, dir, grpc, addr, &args, "dns-dnstap")?;
    wait_answering(addr, &mut [&mut front], dir)?;
    Ok((front, addr))
}

/// The dnstap messages the front end with metrics on `metrics` wrote and dropped.
fn dnstap_counts(metrics: u16) -> Result<(f64, f64)> {
    let page =
        crate::serve::procs::http_get(SocketAddr::from(([127, 0, 0, 1], metrics)), "/metrics")?;
    let value = |name: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((
        value("cdnmap_dns_dnstap_written_total"),
        value("cdnmap_dns_dnstap_dropped_total"),
    ))
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
        spawn_mapper_and_front_end(exe, dir, &world, ports, &a.front_args())?;
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

/// The servers measured: cdnmap's front end first, then its peers; with `--dnstap`, a fourth,
/// [`TAPPED`].
const SERVERS: [&str; 3] = ["cdnmap dns", "gdnsd-geoip", "gdnsd-static"];
/// The front end with dnstap on (`--dnstap`).
const TAPPED: &str = "cdnmap dns+dnstap";

/// The dnsperf runs, taking the servers in turn (`targets`: name, address, process, in the
/// order of [`SERVERS`], then [`TAPPED`] if measured); prints each run.
fn measure(
    a: &DnsBenchArgs,
    dnsperf: &Path,
    queries: &Path,
    targets: &[(&'static str, SocketAddr, &Proc)],
) -> Result<Vec<Vec<Run>>> {
    let ports: Vec<String> = targets
        .iter()
        .map(|(name, addr, _)| format!("{name} on :{}", addr.port()))
        .collect();
    println!(
        "dnsperf -B -l {} -c {} -q {}, {} runs each, in turn ({}); each server {} UDP thread(s); cdnmap dns's receive coalescing {}",
        a.seconds,
        a.clients,
        a.outstanding,
        a.runs,
        ports.join(", "),
        a.threads(),
        a.udp_coalesce_us.map_or("at its default".to_string(), |us| format!("{us} µs")),
    );
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); targets.len()];
    for r in 0..a.runs {
        let pids: Vec<u32> = targets.iter().map(|(_, _, p)| p.0.id()).collect();
        for (i, &(name, addr, _)) in targets.iter().enumerate() {
            let cpu_before = cpu_secs(pids[i]);
            let child = Command::new(dnsperf)
                .args([
                    "-s",
                    "127.0.0.1",
                    "-p",
                    &addr.port().to_string(),
                    "-B",
                    "-d",
                ])
                .arg(queries)
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
                    "dnsperf against {name}: {}{}",
                    text,
                    String::from_utf8_lossy(&out.stderr)
                )
            })?;
            let answered = run.qps * a.seconds as f64;
            if let (Some(b), Some(e)) = (cpu_before, cpu_secs(pids[i])) {
                run.cpu_us = (e - b) / answered * 1e6;
            }
            run.client_cpu_us = client_rate.map_or(f64::NAN, |r| r / run.qps * 1e6);
            println!(
                "  run {}: {name:<17} {:>9.0} q/s  {:.2} µs CPU/query (dnsperf {:.2})  latency {:.3} ms (stddev {:.3})  lost {}  NOERROR {:.2}%",
                r + 1,
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

/// The medians of each server's runs, and the ratios against issue 16's targets. `threads`:
/// each server's UDP threads, for how busy they were.
fn print_medians(results: &[Vec<Run>], threads: usize) {
    let med = |i: usize, f: &dyn Fn(&Run) -> f64| median(results[i].iter().map(f).collect());
    // The share of its UDP threads' cores a server kept busy (CPU seconds a second).
    let busy = |r: &Run| 100.0 * r.qps * r.cpu_us / 1e6 / threads as f64;
    println!();
    println!(
        "| server | median q/s | median CPU per query (µs) | dnsperf's CPU per query (µs) | median busy (of {threads} core(s)) | median latency (ms) | NOERROR |"
    );
    println!("|---|---|---|---|---|---|---|");
    let what = [
        "cdnmap dns (map lookup per query)",
        "gdnsd-geoip (nets lookup per query)",
        "gdnsd-static (no lookup)",
        "cdnmap dns with dnstap on",
    ];
    for (i, name) in what.iter().enumerate().take(results.len()) {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {:.0}% | {:.3} | {:.2}% |",
            med(i, &|r| r.qps),
            med(i, &|r| r.cpu_us),
            med(i, &|r| r.client_cpu_us),
            med(i, &busy),
            med(i, &|r| r.latency_ms),
            med(i, &|r| r.noerror_pct)
        );
    }
    println!();
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    let q = |i: usize| med(i, &|r| r.qps);
    let cpu = |i: usize| med(i, &|r| r.cpu_us);
    for (peer, name) in [(1, "gdnsd-geoip"), (2, "gdnsd-static")] {
        let ratio = q(0) / q(peer);
        let (lo, mid, hi) = paired(results, peer, |r| r.qps);
        println!(
            "queries per second, cdnmap dns / {name}: {ratio:.3} (target >= 1.0: {}); run by run (the two measured one after the other): median {mid:.3}, from {lo:.3} to {hi:.3}",
            met(ratio >= 1.0)
        );
    }
    for (peer, name) in [(1, "gdnsd-geoip"), (2, "gdnsd-static")] {
        let (lo, mid, hi) = paired(results, peer, |r| r.cpu_us);
        println!(
            "CPU per query, {name} / cdnmap dns, run by run: median {:.3}, from {:.3} to {:.3}",
            1.0 / mid,
            1.0 / hi,
            1.0 / lo
        );
    }
    let cpu_ratio = cpu(1) / cpu(0);
    println!(
        "CPU per query, gdnsd-geoip / cdnmap dns: {cpu_ratio:.3} (target >= 1.0, no more CPU a \
         query than gdnsd-geoip: {}; the comparison least sensitive to what else the machine runs)",
        met(cpu_ratio >= 1.0)
    );
    println!(
        "CPU per query, gdnsd-static / cdnmap dns: {:.3} (for reference: what the lookup, the server pick and the demand count cost over a fixed answer)",
        cpu(2) / cpu(0)
    );
    if results.len() > 3 {
        print_dnstap_ratios(results, q(3) / q(0));
    }
    // A server whose threads are not kept busy is not what limits the rate: dnsperf is.
    let saturated = (0..3).all(|i| med(i, &busy) >= SATURATED_PCT);
    if !saturated {
        println!(
            "the servers' threads were not all busy (>= {SATURATED_PCT:.0}%): the rates are bounded by dnsperf, not by the servers, and their ratios tie within the noise; the CPU per query is what tells the servers apart here"
        );
    }
}

/// The front end with dnstap on (`results[3]`) against the one without (`results[0]`):
/// `ratio`, the medians' rate ratio, and both ratios run by run.
fn print_dnstap_ratios(results: &[Vec<Run>], ratio: f64) {
    let met = if ratio >= DNSTAP_TARGET {
        "met"
    } else {
        "NOT met"
    };
    // `paired` divides the first server's figure by the other's: invert for with / without.
    let (lo, mid, hi) = paired(results, 3, |r| r.qps);
    println!(
        "queries per second, cdnmap dns with dnstap / without: {ratio:.3} (target >= {DNSTAP_TARGET}: {met}); run by run: median {:.3}, from {:.3} to {:.3}",
        1.0 / mid,
        1.0 / hi,
        1.0 / lo
    );
    let (lo, mid, hi) = paired(results, 3, |r| r.cpu_us);
    println!(
        "CPU per query, cdnmap dns with dnstap / without, run by run: median {:.3}, from {:.3} to {:.3}",
        1.0 / mid,
        1.0 / hi,
        1.0 / lo
    );
}

/// Issue 44's target: the rate with dnstap on at least this share of the rate without.
const DNSTAP_TARGET: f64 = 0.9;

/// `f` of cdnmap dns's run over `f` of the peer's run in the same round (measured one right
/// after the other, so the machine's drift over the whole benchmark cancels out): the least,
/// the median and the largest of these ratios (all NaN when no round gave one).
fn paired(results: &[Vec<Run>], peer: usize, f: impl Fn(&Run) -> f64) -> (f64, f64, f64) {
    let ratios: Vec<f64> = results[0]
        .iter()
        .zip(&results[peer])
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

pub fn dns(a: &DnsBenchArgs) -> Result<std::process::ExitCode> {
    check_args(a)?;
    let dnsperf = program("dnsperf")?;
    let gdnsd = program("gdnsd")?;
    let (dir, scratch) = out_dir(a.out.as_deref(), "cdnmap-bench-dns-")?;
    let exe = std::env::current_exe().context("finding the cdnmap binary")?;
    let (world, queries) = query_file(a, &dir)?;
    let ports = [(); 7].map(|()| free_port());
    let [grpc, http, dns_port, geoip_port, static_port, tap_port, tap_metrics] = ports;
    let (grpc, http, dns_port) = (grpc?, http?, dns_port?);
    let (geoip_port, static_port) = (geoip_port?, static_port?);
    let (tap_port, tap_metrics) = (tap_port?, tap_metrics?);
    let threads = a.threads();
    let nets = write_gdnsd_geoip(&dir.join("gdnsd-geoip"), (geoip_port, threads), &world)?;
    println!(
        "gdnsd-geoip: {nets} nets in {} maps (one a class), {} datacenters",
        world.classes().len(),
        world.clusters().len().clamp(1, GDNSD_MAX_DCS)
    );
    drop(world);
    write_gdnsd_static(&dir.join("gdnsd-static"), (static_port, threads))?;
    let (serve, front, dns_addr) = start_cdnmap(a, &exe, &dir, (grpc, http, dns_port))?;
    let started = Instant::now();
    let (geoip, geoip_addr) = start_gdnsd(&gdnsd, &dir, "gdnsd-geoip", geoip_port)?;
    println!(
        "gdnsd-geoip answering {:.1} s after its start",
        started.elapsed().as_secs_f64()
    );
    let (stat, static_addr) = start_gdnsd(&gdnsd, &dir, "gdnsd-static", static_port)?;
    let (checked, equal, later) = check_answers(dns_addr, grpc, &queries)?;
    println!(
        "answers: cdnmap dns gave Resolve's answer (addresses in order, ECS scope) to all \
         {checked} queries checked ({equal} at once, {later} at a second look after a round)"
    );
    let tapped = match &a.dnstap {
        Some(file) => {
            let ports = (tap_port, tap_metrics);
            let (p, addr) = start_tapped(a, &exe, &dir, grpc, ports, (file, a.dnstap_sample))?;
            println!(
                "{TAPPED}: a second front end logging {} in dnstap to {}",
                if a.dnstap_sample == 1 {
                    "every query and response".to_string()
                } else {
                    format!("one query (and response) of {}", a.dnstap_sample)
                },
                file.display()
            );
            Some((p, addr))
        }
        None => None,
    };
    let mut targets = vec![
        (SERVERS[0], dns_addr, &front),
        (SERVERS[1], geoip_addr, &geoip),
        (SERVERS[2], static_addr, &stat),
    ];
    if let Some((p, addr)) = &tapped {
        targets.push((TAPPED, *addr, p));
    }
    let results = {
        let _paused = if a.mapper_running {
            None
        } else {
            println!("the mapper is paused (SIGSTOP) during the runs: cdnmap dns answers from the map it holds (--mapper-running to let it run its rounds)");
            Some(Paused::new(&serve)?)
        };
        measure(a, &dnsperf, &queries, &targets)?
    };
    print_medians(&results, threads);
    if let (Some(file), Some(_)) = (&a.dnstap, &tapped) {
        // The writer counts messages as written when it flushes: idle 0.2 s, at least every
        // second.
        std::thread::sleep(Duration::from_millis(1500));
        let (written, dropped) = dnstap_counts(tap_metrics)?;
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
        .map(|(name, _, p)| match crate::procs::memory_mb(p.0.id()) {
            Some((peak, _)) => format!("{name} {peak:.0} MB"),
            None => format!("{name} not read"),
        })
        .collect();
    println!("peak RSS (VmHWM): {}", peaks.join(", "));
    drop(targets);
    drop((tapped, stat, geoip, front, serve));
    scratch.done();
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (lo, mid, hi) = paired(&results, 2, |r| r.qps);
        assert!((lo - 1.1).abs() < 1e-12 && (mid - 1.1).abs() < 1e-12 && (hi - 1.1).abs() < 1e-12);
        let (lo, mid, hi) = paired(&results, 1, |r| r.qps);
        assert_eq!((lo, mid, hi), (66.0, 88.0, 110.0));
        // No round with a ratio: nothing to say, rather than an empty range.
        let none = [vec![run(f64::NAN)], vec![run(1.0)], vec![run(1.0)]];
        let (lo, mid, hi) = paired(&none, 2, |r| r.qps);
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
            let q = query(1, name, RecordType::A, Some(*net)).expect("query");
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
        let (a, aaaa) = write_queries(&world, 500, 3, &path).expect("writes");
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
            at += 2 + len;
            seen += 1;
        }
        assert_eq!(seen, 500);
    }
}
