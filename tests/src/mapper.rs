//! A running `cdnmap serve` for end-to-end tests: its configuration in a temporary directory
//! (the small demo world on ephemeral ports), the process (killed when dropped), and gRPC/HTTP
//! clients for it. `serve.rs`, `dns.rs` and the dashboard tests share it.

use std::fmt::Debug;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cdnmap_proto::v1 as pb;
use cdnmap_proto::v1::admin_client::AdminClient;
use cdnmap_proto::v1::feedback_client::FeedbackClient;
use cdnmap_proto::v1::mapping_client::MappingClient;
use tempfile::TempDir;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::Running;

pub const TOKEN: &str = "e2e-admin-token-7f3a";
pub const CYCLE_SECS: u64 = 10;
pub const TTL_SECS: u32 = 30;
pub const MAP_UNITS: u64 = 3000;
pub const CLUSTERS: u64 = 40;
/// The tests' demo world keeps the generator's tight capacity (total capacity 1.1 × the total
/// demand), not the roomier default of `cdnmap serve`'s demo: clusters run full, demand is
/// evicted and passed over, which is what the tests exercise.
pub const HEADROOM: f64 = 1.1;
/// How long a server may take to answer after it is started.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The hostnames the tests ask for, one per class (the default class rules: `*.video.cdn.example`
/// → video, `*.apps.cdn.example` → apps, anything else → web).
pub fn qname_of(class: &str) -> &'static str {
    match class {
        "web" => "www.cdn.example.",
        "video" => "edge7.video.cdn.example.",
        "apps" => "api.apps.cdn.example.",
        other => panic!("no qname for class {other:?}"),
    }
}

/// A configuration in its own temporary directory: the config file, the data directory, and the
/// servers' logs. Servers started from it share the data directory (so a second one restarts).
/// They listen on port 0, so no two tests race for a port: `grpc` and `http` are the addresses
/// the last server started reported (its "listening" log line). A test whose front end must
/// follow one mapper address across restarts pins them ([`Setup::pin`]).
pub struct Setup {
    bin: PathBuf,
    pub dir: TempDir,
    pub config: PathBuf,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    starts: usize,
    /// With `[tls]` in the configuration: the CA the server's certificate chains to (the
    /// test's clients then speak TLS, trusting it).
    pub ca: Option<PathBuf>,
}

/// The addresses a server reported in its "listening" line, once it has.
pub fn listening(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    Some((
        crate::listening_addr(log, "grpc")?,
        crate::listening_addr(log, "http")?,
    ))
}

impl Setup {
    /// The small demo world with the admin token (`with_token`) or without one, for the
    /// `cdnmap` binary `bin` (see [`crate::bin!`]).
    pub fn new(bin: &Path, with_token: bool) -> Setup {
        Setup::with_extra(bin, with_token, "")
    }

    /// [`Setup::new`] with `extra` appended to the configuration (TOML tables, say).
    pub fn with_extra(bin: &Path, with_token: bool, extra: &str) -> Setup {
        Setup::with_config(bin, with_token, "", extra)
    }

    /// [`Setup::with_extra`] with `top` among the configuration's top-level keys (before its
    /// first table).
    pub fn with_config(bin: &Path, with_token: bool, top: &str, extra: &str) -> Setup {
        Setup::with_demo(bin, with_token, top, HEADROOM, extra)
    }

    /// [`Setup::with_config`] with the demo world's `headroom` (total capacity over total
    /// demand) instead of [`HEADROOM`].
    pub fn with_demo(bin: &Path, with_token: bool, top: &str, headroom: f64, extra: &str) -> Setup {
        let dir = tempfile::Builder::new()
            .prefix("cdnmap-serve-")
            .tempdir()
            .expect("a temporary directory");
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let data = dir.path().join("data");
        let token = if with_token {
            format!("admin_token = {TOKEN:?}\n")
        } else {
            String::new()
        };
        let text = format!(
            "cycle_secs = {CYCLE_SECS}\n\
             grpc_listen = \"{any}\"\n\
             http_listen = \"{any}\"\n\
             data_dir = {data:?}\n\
             ttl_secs = {TTL_SECS}\n\
             {token}\
             {top}\
             \n\
             [demo]\n\
             map_units = {MAP_UNITS}\n\
             clusters = {CLUSTERS}\n\
             seed = 1\n\
             headroom = {headroom:?}\n\
             {extra}\n",
            data = data.to_str().expect("a UTF-8 temporary path"),
        );
        let config = dir.path().join("cdnmap.toml");
        std::fs::write(&config, text).expect("write the config");
        Setup {
            bin: bin.to_path_buf(),
            dir,
            config,
            grpc: any,
            http: any,
            starts: 0,
            ca: None,
        }
    }

    /// Pins the configuration to the addresses the last server reported (`grpc`, `http`), so
    /// the servers started next listen where it did, instead of on port 0: for a front end,
    /// which follows one mapper address, to see the mapper come back. (A restart binds with
    /// SO_REUSEADDR, so the old connections' TIME_WAIT does not stand in the way.)
    ///
    /// This is the one place the tests release a port and bind it again, and it cannot be
    /// avoided: a process that has exited holds no port. Between the last server's exit and
    /// the next one's bind, another process binding port 0 may be given one of these ports
    /// (the kernel picks among some 28,000, so it is unlikely); the next start then fails with
    /// "address in use", and the test with it.
    pub fn pin(&mut self) {
        assert!(
            self.grpc.port() != 0 && self.http.port() != 0,
            "pin: no server has reported its addresses yet"
        );
        let text = std::fs::read_to_string(&self.config).expect("read the config");
        let pinned: String = text
            .lines()
            .map(|l| {
                if l.starts_with("grpc_listen =") {
                    format!("grpc_listen = \"{}\"\n", self.grpc)
                } else if l.starts_with("http_listen =") {
                    format!("http_listen = \"{}\"\n", self.http)
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(&self.config, pinned).expect("write the config");
    }

    /// Learns the addresses a mapper will listen on before it runs: starts a server on port 0
    /// only until it says where it listens, kills it, and [`Setup::pin`]s those addresses, for a
    /// test that must give a front end the mapper's address before the mapper is up. (The data
    /// directory may keep what the short run stored; the next start restarts from it.)
    pub async fn pin_from_a_first_run(&mut self) {
        let mut process = self.spawn();
        (self.grpc, self.http) = wait_listening(&mut process).await;
        process.kill();
        self.pin();
    }

    /// Starts `cdnmap serve --config FILE` without waiting for it (each start logs to its own
    /// file; all share the data directory).
    pub fn spawn(&mut self) -> Running {
        self.starts += 1;
        let log = self.dir.path().join(format!("server-{}.log", self.starts));
        let config = self.config.clone();
        Running::cdnmap(
            &self.bin,
            self.dir.path(),
            [
                std::ffi::OsStr::new("serve"),
                "--config".as_ref(),
                config.as_os_str(),
            ],
            log,
        )
    }

    /// Starts `cdnmap serve --config FILE`, waits for the addresses it listens on and until its
    /// health service says SERVING.
    pub async fn start(&mut self) -> Server {
        let mut process = self.spawn();
        let (grpc, http) = wait_listening(&mut process).await;
        (self.grpc, self.http) = (grpc, http);
        let mut server = Server {
            process,
            grpc,
            http,
            channel: None,
            ca: self.ca.clone(),
        };
        server.wait_ready().await;
        server
    }
}

/// Waits until `process` (a `cdnmap serve`) says where it listens: (gRPC, HTTP).
async fn wait_listening(process: &mut Running) -> (SocketAddr, SocketAddr) {
    let started = Instant::now();
    loop {
        process.assert_running();
        if let Some(addrs) = listening(&process.log()) {
            return addrs;
        }
        assert!(
            started.elapsed() < READY_TIMEOUT,
            "cdnmap serve said on no address within {READY_TIMEOUT:?}:\n{}",
            process.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A running `cdnmap serve`; killed (and reaped) when dropped.
pub struct Server {
    process: Running,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    channel: Option<Channel>,
    /// The CA to trust when the server speaks TLS.
    pub ca: Option<PathBuf>,
}

impl Server {
    /// What the server logged so far, for assertion messages.
    pub fn log(&self) -> String {
        self.process.log()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub async fn wait_ready(&mut self) {
        let started = Instant::now();
        let endpoint = self.endpoint(None);
        loop {
            self.process.assert_running();
            if let Ok(channel) = endpoint.connect().await {
                let ok = HealthClient::new(channel.clone())
                    .check(HealthCheckRequest {
                        service: "cdnmap.v1.Mapping".into(),
                    })
                    .await
                    .is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32);
                if ok {
                    self.channel = Some(channel);
                    return;
                }
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "cdnmap serve did not answer within {READY_TIMEOUT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// An endpoint of the gRPC listener: TLS trusting [`Self::ca`] when the server has one,
    /// presenting `identity` (certificate and key files) when given.
    pub fn endpoint(&self, identity: Option<(&Path, &Path)>) -> tonic::transport::Endpoint {
        endpoint(self.grpc, self.ca.as_deref(), identity)
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone().expect("the server is ready")
    }

    pub fn mapping(&self) -> MappingClient<Channel> {
        MappingClient::new(self.channel())
    }

    pub fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel())
    }

    pub fn feedback(&self) -> FeedbackClient<Channel> {
        FeedbackClient::new(self.channel())
    }

    /// Sends the signal named `name` ("HUP", ...) to the server.
    pub fn send_signal(&mut self, name: &str) {
        self.process.send_signal(name);
    }

    /// Panics (with the log) if the server has exited.
    pub fn assert_running(&mut self) {
        self.process.assert_running();
    }

    /// Kills the server (as a crash would) and waits for it to exit.
    pub fn kill(mut self) {
        self.process.kill();
    }

    /// Stops the server with SIGTERM and asserts that it exits cleanly (status 0) within 30 s,
    /// having flushed its store; returns its log. (The test's runtime keeps running meanwhile,
    /// so its clients see the server's goodbye and close their connections.)
    pub async fn terminate(mut self) -> String {
        self.channel = None;
        self.process.send_sigterm();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.process.exited() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{} did not stop within 30 s of SIGTERM:\n{}",
                self.process.what(),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let log = self.log();
        assert!(status.success(), "exit after SIGTERM: {status}\n{log}");
        assert!(log.contains("the store is flushed"), "{log}");
        log
    }

    /// `GET path` over plain HTTP/1.1 on the HTTP listener: (status line, body).
    pub fn http_get(&self, path: &str) -> (String, String) {
        http_get(self.http, path)
    }

    /// [`Self::http_get`] with the Admin token ([`TOKEN`]).
    pub fn http_get_authed(&self, path: &str) -> (String, String) {
        http_get_with(
            self.http,
            path,
            &[("Authorization", &format!("Bearer {TOKEN}"))],
        )
    }
}

/// An endpoint of the gRPC listener at `addr`: plaintext, or TLS trusting `ca` (and
/// presenting `identity`, certificate and key files, when given).
pub fn endpoint(
    addr: SocketAddr,
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> tonic::transport::Endpoint {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let scheme = if ca.is_some() { "https" } else { "http" };
    let mut endpoint = Channel::from_shared(format!("{scheme}://{addr}"))
        .expect("a valid URI")
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(10));
    if let Some(ca) = ca {
        let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)));
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(read(cert), read(key)));
        }
        endpoint = endpoint.tls_config(tls).expect("a TLS configuration");
    }
    endpoint
}

/// The plainest Resolve: `www.cdn.example.` A from resolver 1.0.0.1.
pub fn www_query() -> pb::ResolveRequest {
    pb::ResolveRequest {
        resolver_ip: "1.0.0.1".into(),
        qname: "www.cdn.example.".into(),
        qtype: 1,
        ..Default::default()
    }
}

/// A demand sample of `queries` for map unit `u`, named by id.
pub fn unit_sample(u: &pb::MapUnit, queries: f64) -> pb::DemandSample {
    pb::DemandSample {
        target: Some(pb::demand_sample::Target::MapUnit(u.id.clone())),
        traffic_class: u.traffic_class.clone(),
        queries,
    }
}

/// `GET path` over HTTPS from `addr`, trusting `ca`, with `headers` (Python's `urllib`, a
/// client independent of ours): (status code, body).
pub fn https_get(
    addr: SocketAddr,
    path: &str,
    ca: &Path,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let script = r#"
import json, ssl, sys, urllib.error, urllib.request
url, ca, headers = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ctx = ssl.create_default_context(cafile=ca)
req = urllib.request.Request(url, headers=headers)
try:
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        code, body = r.status, r.read()
except urllib.error.HTTPError as e:
    code, body = e.code, e.read()
sys.stdout.write(str(code) + chr(10))
sys.stdout.buffer.write(body)
"#;
    let headers: std::collections::BTreeMap<&str, &str> = headers.iter().copied().collect();
    let headers = format!(
        "{{{}}}",
        headers
            .iter()
            .map(|(k, v)| format!("{k:?}: {v:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(format!("https://localhost:{}{path}", addr.port()))
        .arg(ca)
        .arg(headers)
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (code, body) = text.split_once('\n').unwrap_or_else(|| {
        panic!(
            "python3's HTTPS GET {path} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code.parse().expect("a status code"), body.to_string())
}

/// The certificate (PEM) the TLS listener at `addr` presents now, verified against `ca`
/// (Python's `ssl`).
pub fn served_certificate(addr: SocketAddr, ca: &Path) -> String {
    let script = r#"
import ssl, sys
print(ssl.get_server_certificate(("localhost", int(sys.argv[1])), ca_certs=sys.argv[2]))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &addr.port().to_string()])
        .arg(ca)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python3 could not get the certificate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `GET path` over plain HTTP/1.1 from `addr`: (status line, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    http_get_with(addr, path, &[])
}

/// [`http_get`] with `headers`.
pub fn http_get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("send the request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the response");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

/// A chunked HTTP/1.1 body (RFC 9112 §7.1) decoded: each chunk's size in hex, its bytes, and
/// a zero-sized chunk last. Panics on a malformed one (the server's framing is under test).
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or_else(|e| panic!("a chunk size, not {size:?}: {e}"));
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = after[size..]
            .strip_prefix("\r\n")
            .expect("CRLF after a chunk");
    }
}

/// `POST path` with a JSON `body` and `headers` over plain HTTP/1.1: (status line, body).
pub fn http_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (String, String) {
    try_http_post(addr, path, headers, body)
        .unwrap_or_else(|e| panic!("POST {path} to {addr}: {e}"))
}

/// [`http_post`], with what went wrong on the way (no connection, the connection closed
/// before the whole request was sent, ...) as an error instead of a panic: for a test whose
/// server may die under its request. The status line is empty when the connection closed
/// before any response.
pub fn try_http_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, body.to_string()))
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// A request with `authorization: Bearer <token>` (or none).
pub fn authed<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(message);
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("valid metadata"),
        );
    }
    r
}

pub fn ok<T: Debug>(r: Result<Response<T>, Status>, what: &str) -> T {
    match r {
        Ok(r) => r.into_inner(),
        Err(s) => panic!("{what}: {:?} {:?}", s.code(), s.message()),
    }
}

/// Every map unit, through Admin.ListMapUnits a page of 1,000 at a time.
pub async fn all_units(server: &Server) -> Vec<pb::MapUnit> {
    let mut admin = server.admin();
    let mut units = Vec::new();
    let mut after = String::new();
    loop {
        let page = ok(
            admin
                .list_map_units(authed(
                    pb::ListRequest {
                        page_size: 1000,
                        after_id: after.clone(),
                    },
                    Some(TOKEN),
                ))
                .await,
            "ListMapUnits",
        );
        units.extend(page.map_units);
        if page.next_after_id.is_empty() {
            return units;
        }
        after = page.next_after_id;
    }
}

/// Every cluster, through Admin.ListClusters a page of 1,000 at a time.
pub async fn all_clusters(server: &Server) -> Vec<pb::Cluster> {
    let mut admin = server.admin();
    let mut clusters = Vec::new();
    let mut after = String::new();
    loop {
        let page = ok(
            admin
                .list_clusters(authed(
                    pb::ListRequest {
                        page_size: 1000,
                        after_id: after.clone(),
                    },
                    Some(TOKEN),
                ))
                .await,
            "ListClusters",
        );
        clusters.extend(page.clusters);
        if page.next_after_id.is_empty() {
            return clusters;
        }
        after = page.next_after_id;
    }
}

/// Admin.GetStatus.
pub async fn status(server: &Server) -> pb::Status {
    ok(
        server
            .admin()
            .get_status(authed(pb::GetStatusRequest {}, Some(TOKEN)))
            .await,
        "GetStatus",
    )
}

/// Resolves a host in the first prefix of `unit` (its class's name); the answer must name
/// addresses.
pub async fn resolves(server: &Server, unit: &pb::MapUnit) -> pb::ResolveResponse {
    let a = ok(
        server
            .mapping()
            .resolve(pb::ResolveRequest {
                client_subnet: unit.prefixes[0].clone(),
                resolver_ip: String::new(),
                qname: qname_of(&unit.traffic_class).into(),
                qtype: if unit.prefixes[0].contains(':') {
                    28
                } else {
                    1
                },
            })
            .await,
        "Resolve",
    );
    assert!(!a.addresses.is_empty(), "{a:?}");
    a
}

/// A cluster of [`write_small_instance`]: id, addresses, state ("up", "drained", "down").
pub type SmallCluster<'a> = (&'a str, &'a [&'a str], &'a str);
/// A map unit of [`write_small_instance`]: id, class, prefix, candidates best first.
pub type SmallUnit<'a> = (&'a str, &'a str, &'a str, &'a [&'a str]);

/// A small topology for a test that needs its own, written as the instance file `w.json` in
/// `dir` (its path returned): classes web, video and apps; each cluster with an uplink and a
/// leaf per class, all of ample capacity, at one place; each unit with demand 10 and its
/// candidates scored 1, 2, ... in order.
pub fn write_small_instance(dir: &Path, clusters: &[SmallCluster], units: &[SmallUnit]) -> PathBuf {
    use serde_json::json;
    let leaf = |k: &str| json!({"name": k, "kind": "fps", "capacity": 1e6, "classes": [k]});
    let classes: Vec<serde_json::Value> = ["web", "video", "apps"]
        .iter()
        .map(|k| json!({"name": k, "priority": 1, "per_unit": {"bps": 1.0, "fps": 1.0}}))
        .collect();
    let clusters: Vec<serde_json::Value> = clusters
        .iter()
        .map(|&(id, addresses, state)| {
            json!({"id": id, "lat": 50.0, "lon": 8.0, "addresses": addresses, "state": state,
                   "resources": {"name": "uplink", "kind": "bps", "capacity": 1e6,
                                 "children": [leaf("web"), leaf("video"), leaf("apps")]}})
        })
        .collect();
    let units: Vec<serde_json::Value> = units
        .iter()
        .map(|&(id, class, prefix, candidates)| {
            let candidates: Vec<serde_json::Value> = candidates
                .iter()
                .enumerate()
                .map(|(i, c)| json!({"cluster": c, "score": 1.0 + i as f64}))
                .collect();
            json!({"id": id, "class": class, "demand": 10, "prefixes": [prefix],
                   "lat": 50.0, "lon": 8.0, "candidates": candidates})
        })
        .collect();
    let instance = json!({"traffic_classes": classes, "clusters": clusters, "map_units": units});
    let path = dir.join("w.json");
    std::fs::write(&path, instance.to_string()).expect("write the instance");
    path
}
