//! The DNS front end as the end-to-end tests run it: `cdnmap dns` started on port 0 with a
//! config of the test's, Debian's `dig` as its client (installed when missing), its `/metrics`,
//! and the oracle its answers are held to (the mapper's `Resolve`). Shared by `tests/dns.rs`
//! and `tests/lead.rs`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cdnmap_proto::v1 as pb;
use ipnet::IpNet;

use crate::mapper::{all_units, http_get, ok, qname_of, status, Server};
use crate::{ensure_debian_tool, listening_addr, Running};

/// How long a front end may take to load its first map.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

pub fn dig_bin() -> PathBuf {
    ensure_debian_tool("dig", &["dnsutils"]).unwrap_or_else(|e| panic!("{e}"))
}

/// A running `cdnmap dns`; killed when dropped.
pub struct Dns {
    pub process: Running,
    /// Where it answers (UDP and TCP), as it reported.
    pub addr: SocketAddr,
    /// Where it serves /metrics, if its config asks for it.
    pub metrics: Option<SocketAddr>,
    /// Its configuration file (rewritten by a test before a SIGHUP).
    pub config: PathBuf,
}

impl Dns {
    /// Starts a front end for zone `cdn.example.` following the mapper at `mapper`, with the
    /// config file `config` (TOML text), on port 0 (as `metrics_listen` should be); waits until
    /// it says where it listens.
    pub fn start(bin: &Path, dir: &Path, mapper: SocketAddr, config: &str) -> Dns {
        Dns::start_url(bin, dir, &format!("http://{mapper}"), config)
    }

    /// [`Dns::start`] following the mapper at URL `mapper`.
    pub fn start_url(bin: &Path, dir: &Path, mapper: &str, config: &str) -> Dns {
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        let n = STARTS.fetch_add(1, Ordering::Relaxed) + 1;
        let conf = dir.join(format!("dns-{n}.toml"));
        std::fs::write(&conf, config).expect("write the DNS config");
        let mut process = Running::cdnmap(
            bin,
            dir,
            [
                "dns".as_ref(),
                "--config".as_ref(),
                conf.as_os_str(),
                "--mapper".as_ref(),
                mapper.as_ref(),
                "--listen".as_ref(),
                "127.0.0.1:0".as_ref(),
                "--zone".as_ref(),
                "cdn.example.".as_ref(),
                "--name".as_ref(),
                "dns-e2e".as_ref(),
                "--report-secs".as_ref(),
                std::ffi::OsStr::new("1"),
            ],
            dir.join(format!("dns-{n}.log")),
        );
        let started = Instant::now();
        let addr = loop {
            process.assert_running();
            if let Some(addr) = listening_addr(&process.log(), "dns") {
                break addr;
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "cdnmap dns said on no address within {READY_TIMEOUT:?}:\n{}",
                process.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let metrics = listening_addr(&process.log(), "metrics");
        Dns {
            process,
            addr,
            metrics,
            config: conf,
        }
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Waits (10 s at most) until the log holds `needle` `n` times.
    pub fn wait_logged(&self, needle: &str, n: usize) {
        let started = std::time::Instant::now();
        while self.log().matches(needle).count() < n {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "cdnmap dns did not log {needle:?} {n} times:\n{}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    pub fn dig(&self, args: &[&str]) -> Reply {
        dig(self.addr, args)
    }

    /// Waits until `www.cdn.example A` is answered with NOERROR (a map is loaded).
    pub fn wait_answering(&mut self) {
        let started = Instant::now();
        loop {
            self.process.assert_running();
            if self.dig(&["www.cdn.example", "A"]).status == "NOERROR" {
                return;
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "cdnmap dns answered nothing within {READY_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What dig printed, parsed.
#[derive(Debug, Default, Clone)]
pub struct Reply {
    pub status: String,
    pub flags: Vec<String>,
    /// `(name, ttl, type, data)` of the answer section, in order.
    pub answers: Vec<(String, u32, String, String)>,
    pub authority: Vec<(String, u32, String, String)>,
    /// The ECS option of the reply: `address/source/scope`.
    pub client_subnet: Option<String>,
    pub raw: String,
}

impl Reply {
    pub fn addresses(&self) -> Vec<String> {
        self.answers
            .iter()
            .filter(|a| a.2 == "A" || a.2 == "AAAA")
            .map(|a| a.3.clone())
            .collect()
    }

    pub fn scope(&self) -> Option<u8> {
        self.client_subnet
            .as_deref()
            .and_then(|s| s.rsplit('/').next())
            .and_then(|s| s.parse().ok())
    }
}

pub fn dig(addr: SocketAddr, args: &[&str]) -> Reply {
    let out = Command::new(dig_bin())
        .arg(format!("@{}", addr.ip()))
        .args(["-p", &addr.port().to_string()])
        .args([
            "+tries=1",
            "+time=2",
            "+noall",
            "+comments",
            "+answer",
            "+authority",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run dig");
    let raw = String::from_utf8_lossy(&out.stdout).to_string();
    let mut r = Reply {
        raw: raw.clone(),
        ..Reply::default()
    };
    let mut section = "";
    for line in raw.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            r.status = rest.split(',').next().unwrap_or_default().to_string();
        } else if let Some(rest) = line.strip_prefix(";; flags: ") {
            r.flags = rest
                .split(';')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect();
        } else if let Some(rest) = line.strip_prefix("; CLIENT-SUBNET: ") {
            r.client_subnet = Some(rest.trim().to_string());
        } else if line.starts_with(";; ANSWER SECTION") {
            section = "answer";
        } else if line.starts_with(";; AUTHORITY SECTION") {
            section = "authority";
        } else if !line.starts_with(';') && !line.trim().is_empty() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 5 {
                let rec = (
                    f[0].to_string(),
                    f[1].parse().unwrap_or(0),
                    f[3].to_string(),
                    f[4..].join(" "),
                );
                match section {
                    "answer" => r.answers.push(rec),
                    "authority" => r.authority.push(rec),
                    _ => {}
                }
            }
        }
    }
    r
}

/// A host address inside `net`.
pub fn host_in(net: IpNet) -> IpAddr {
    match net {
        IpNet::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) | 7)),
        IpNet::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) | 7)),
    }
}

pub async fn resolve(
    server: &Server,
    subnet: &str,
    resolver: &str,
    qname: &str,
    qtype: u32,
) -> pb::ResolveResponse {
    ok(
        server
            .mapping()
            .resolve(pb::ResolveRequest {
                client_subnet: subnet.into(),
                resolver_ip: resolver.into(),
                qname: qname.into(),
                qtype,
            })
            .await,
        "Resolve",
    )
}

/// The value of `series` (a metric's name with its labels, as `/metrics` writes them) in a
/// Prometheus text `body`.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The front end's `/metrics`.
pub fn metrics_of(dns: &Dns) -> String {
    let (status, body) = http_get(dns.metrics.expect("metrics_listen"), "/metrics");
    assert!(status.contains("200"), "{status}: {body}");
    body
}

/// The epoch of `server`'s start, once its first round has published a map of it (a start
/// serves its store's map, of the epoch before, until then).
pub async fn epoch_of(server: &Server) -> u64 {
    let started = Instant::now();
    loop {
        let s = status(server).await;
        if s.last_round_at_unix_ms > 0 && !s.last_round_failed {
            return s.map_epoch;
        }
        assert!(
            started.elapsed() < READY_TIMEOUT,
            "no round within {READY_TIMEOUT:?}: {s:?}
{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Up to 16 of `server`'s map units, spread over its map.
pub async fn sample_units(server: &Server) -> Vec<pb::MapUnit> {
    let units = all_units(server).await;
    units
        .iter()
        .step_by(units.len() / 16 + 1)
        .filter(|u| !u.prefixes.is_empty())
        .cloned()
        .collect()
}

/// A client subnet in the first prefix of `u`, and the query type of its family.
pub fn client_of(u: &pb::MapUnit) -> (String, u32, &'static str) {
    let net: IpNet = u.prefixes[0].parse().expect("a prefix");
    let subnet = format!("{}/{}", host_in(net), net.prefix_len());
    match net {
        IpNet::V4(_) => (subnet, 1, "A"),
        IpNet::V6(_) => (subnet, 28, "AAAA"),
    }
}

/// The first of `units` for which `dns` (dig, with the unit's client subnet) does not answer
/// as `server`'s `Resolve`, described; `None` when it answers every one alike.
pub async fn differs_from(dns: &Dns, server: &Server, units: &[pb::MapUnit]) -> Option<String> {
    for u in units {
        let (subnet, qtype, name) = client_of(u);
        let qname = qname_of(&u.traffic_class);
        let want = resolve(server, &subnet, "", qname, qtype).await;
        let got = dns.dig(&[qname, name, &format!("+subnet={subnet}")]);
        if got.status != "NOERROR" || got.addresses() != want.addresses {
            return Some(format!(
                "unit {} {name} {subnet}: dig {} {:?}, Resolve {:?}",
                u.id,
                got.status,
                got.addresses(),
                want.addresses
            ));
        }
    }
    None
}

/// What `dns` answers for each of `units` (dig, with the unit's client subnet).
pub fn answers_for(dns: &Dns, units: &[pb::MapUnit]) -> Vec<Vec<String>> {
    units
        .iter()
        .map(|u| {
            let (subnet, _, name) = client_of(u);
            let r = dns.dig(&[
                qname_of(&u.traffic_class),
                name,
                &format!("+subnet={subnet}"),
            ]);
            assert_eq!(r.status, "NOERROR", "{}", r.raw);
            r.addresses()
        })
        .collect()
}

/// Waits until `dns` uses the map of `server` (its epoch and version on the front end's
/// `/metrics`) and answers `units` as its `Resolve` does; a round may land between the
/// questions, so a difference is retried until `within` has passed.
pub async fn wait_following(dns: &Dns, server: &Server, units: &[pb::MapUnit], within: Duration) {
    let started = Instant::now();
    loop {
        let s = status(server).await;
        let body = metrics_of(dns);
        let held = (
            metric(&body, "cdnmap_dns_map_epoch"),
            metric(&body, "cdnmap_dns_map_version"),
        );
        let problem = if held != (Some(s.map_epoch as f64), Some(s.map_version as f64)) {
            Some(format!(
                "the front end holds {held:?}, the mapper serves ({}, {})",
                s.map_epoch, s.map_version
            ))
        } else {
            differs_from(dns, server, units).await
        };
        let Some(problem) = problem else {
            return;
        };
        assert!(
            started.elapsed() < within,
            "not following the mapper at {} within {within:?}: {problem}
front end:
{}",
            server.grpc,
            dns.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A peer DNS server a test runs (Debian's gdnsd, unbound) on loopback; killed and reaped
/// when dropped.
pub struct DnsPeer {
    what: &'static str,
    child: std::process::Child,
    pub addr: SocketAddr,
    log: PathBuf,
}

/// A UDP port free on loopback now (the peers cannot take port 0 and say which they took).
pub fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .port()
}

impl DnsPeer {
    /// Starts `cmd` (the peer `what`, its output to `log`), which will answer on `addr`, and
    /// waits (bounded) until `dig @addr probe` says NOERROR.
    pub fn start(
        what: &'static str,
        mut cmd: Command,
        log: PathBuf,
        addr: SocketAddr,
        probe: &[&str],
    ) -> DnsPeer {
        let out = std::fs::File::create(&log).expect("the peer's log");
        let err = out.try_clone().expect("the log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        let mut peer = DnsPeer {
            what,
            child,
            addr,
            log,
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = peer.child.try_wait() {
                panic!("{what} exited with {status}:\n{}", peer.log());
            }
            let r = dig(peer.addr, probe);
            if r.status == "NOERROR" {
                return peer;
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "{} answered nothing within {READY_TIMEOUT:?}:\n{}\n{}",
                peer.what,
                r.raw,
                peer.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the peer logged so far (its own log file where it writes one there).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Debian's gdnsd (installed when missing) in `dir/gdnsd` serving `zone` (a zone file's
    /// text) as `origin` (no final dot) on a free loopback port, once it answers the apex's
    /// SOA: the oracle of the static records.
    pub fn gdnsd(dir: &Path, origin: &str, zone: &str) -> DnsPeer {
        let gdnsd = ensure_debian_tool("gdnsd", &["gdnsd"]).unwrap_or_else(|e| panic!("{e}"));
        let dir = dir.join("gdnsd");
        for sub in ["zones", "run", "state"] {
            std::fs::create_dir_all(dir.join(sub)).expect("gdnsd's directories");
        }
        let port = free_port();
        std::fs::write(
            dir.join("config"),
            format!(
                "options => {{\n  listen => [ 127.0.0.1:{port} ]\n  udp_threads => 1\n  tcp_threads => 1\n  run_dir => {}\n  state_dir => {}\n}}\n",
                dir.join("run").display(),
                dir.join("state").display()
            ),
        )
        .expect("gdnsd's config");
        std::fs::write(dir.join("zones").join(origin), zone).expect("the zone file");
        let mut cmd = Command::new(gdnsd);
        cmd.arg("-c").arg(&dir).arg("start");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        DnsPeer::start("gdnsd", cmd, dir.join("gdnsd.log"), addr, &[origin, "SOA"])
    }
}

impl Drop for DnsPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
