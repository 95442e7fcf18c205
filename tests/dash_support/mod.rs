//! What `dashboard.rs` and `browser.rs` share: a running `cdnmap serve` on ephemeral ports (a
//! guard that kills it), and a small HTTP/1.1 client over `TcpStream` (`Connection: close`, so
//! a response ends when the server closes).

#![allow(dead_code)] // each test file uses its part

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use std::time::{Duration, Instant};

use cdnmap_tests::mapper::Setup;
use cdnmap_tests::{bin, Running};
use serde_json::Value;

#[allow(unused_imports)] // each test file uses its part
pub use cdnmap_tests::mapper::{CLUSTERS, CYCLE_SECS, MAP_UNITS, TOKEN};
/// How long a server may take to answer after it is started.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a test waits for the next round (a cycle, plus slack for a loaded machine).
pub const ROUND_TIMEOUT: Duration = Duration::from_secs(3 * CYCLE_SECS + 30);

/// A response: status code, headers (names lower-cased) and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `error` of a JSON error body.
    pub fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no \"error\" in {:?}", self.body))
            .to_string()
    }
}

/// One HTTP/1.1 request to `addr`. Chunked bodies are decoded.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("set a read timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method == "POST" || method == "DELETE" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("send the request head");
    s.write_all(body.as_bytes()).expect("send the request body");
    // Read the head, then the body by its length: some servers (chromedriver) keep the
    // connection open despite `Connection: close`.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut buf).expect("read the response head");
        assert!(
            n > 0,
            "the connection closed before the end of the head: {raw:?}"
        );
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_string();
    let mut rest = raw[head_end + 4..].to_vec();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let chunked = find("transfer-encoding").is_some_and(|v| v.contains("chunked"));
    if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while rest.len() < len {
            let n = s.read(&mut buf).expect("read the response body");
            assert!(
                n > 0,
                "the connection closed {} bytes into a {len}-byte body",
                rest.len()
            );
            rest.extend_from_slice(&buf[..n]);
        }
        rest.truncate(len);
    } else if chunked {
        while !rest.ends_with(b"0\r\n\r\n") {
            let n = s.read(&mut buf).expect("read the response body");
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&buf[..n]);
        }
    } else {
        s.read_to_end(&mut rest).expect("read the response body");
    }
    let rest = String::from_utf8_lossy(&rest).to_string();
    let body = if chunked { dechunk(&rest) } else { rest };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// `cdnmap serve --config cdnmap.toml` in `dir`, logging to `log`.
/// A running `cdnmap serve --config FILE` on the small demo world; killed when dropped.
pub struct DashServer {
    setup: Setup,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    process: Running,
}

impl DashServer {
    /// Starts a server (with the Admin token if `with_token`) and waits until `/api/status`
    /// answers with a map.
    pub fn start(with_token: bool) -> DashServer {
        DashServer::start_with(Setup::new(bin!(), with_token))
    }

    /// [`DashServer::start`] without the tests' tight capacity: the demo world at `cdnmap
    /// serve`'s own default headroom (the `[demo]` table without `headroom`).
    pub fn start_with_serve_defaults() -> DashServer {
        let setup = Setup::new(bin!(), false);
        let text = std::fs::read_to_string(&setup.config).expect("read the config");
        let pinned = format!("headroom = {:?}\n", cdnmap_tests::mapper::HEADROOM);
        assert!(text.contains(&pinned), "{text}");
        std::fs::write(&setup.config, text.replace(&pinned, "")).expect("write the config");
        DashServer::start_with(setup)
    }

    pub fn start_with(mut setup: Setup) -> DashServer {
        let process = setup.spawn();
        let mut server = DashServer {
            http: setup.http,
            grpc: setup.grpc,
            setup,
            process,
        };
        server.wait_ready();
        server
    }

    /// Stops the server and starts it again on the same configuration and data directory: it
    /// serves the stored map before its first round.
    pub fn restart(&mut self) {
        self.process.kill();
        self.process = self.setup.spawn();
        self.wait_ready();
    }

    /// What the server logged so far, for assertion messages.
    pub fn log(&self) -> String {
        self.process.log()
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            self.process.assert_running();
            // The server listens on port 0 and says where.
            let Some((grpc, http)) = cdnmap_tests::mapper::listening(&self.log()) else {
                assert!(
                    started.elapsed() < READY_TIMEOUT,
                    "cdnmap serve said on no address within {READY_TIMEOUT:?}:\n{}",
                    self.log()
                );
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            (self.grpc, self.http) = (grpc, http);
            if TcpStream::connect(self.http).is_ok() {
                let r = self.get("/api/status");
                if r.status == 200 && r.json()["map_version"].as_u64().unwrap_or(0) >= 1 {
                    return;
                }
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "cdnmap serve did not answer on {} within {READY_TIMEOUT:?}:\n{}",
                self.http,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        request(self.http, "GET", path, &[], None)
    }

    /// `GET path`, which must answer 200 with JSON.
    pub fn get_ok(&self, path: &str) -> Value {
        let r = self.get(path);
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        r.json()
    }

    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(headers);
        request(self.http, "POST", path, &h, Some(body))
    }

    /// Polls `f` until it returns `Some`, for at most `timeout`; panics naming `what`.
    pub fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut() -> Option<T>,
    ) -> T {
        let started = Instant::now();
        loop {
            if let Some(t) = f() {
                return t;
            }
            assert!(
                started.elapsed() < timeout,
                "{what}: not within {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `/api/status`, `/api/clusters?top=5` and `/api/map` of one map version (read again when
    /// a round lands between the reads).
    pub fn consistent_reads(&self) -> (Value, Value, Value) {
        self.wait_until("three reads of one map version", ROUND_TIMEOUT, || {
            let st = self.get_ok("/api/status");
            let cl = self.get_ok("/api/clusters?top=5");
            let m = self.get_ok("/api/map");
            let v = &st["map_version"];
            (cl["map_version"] == *v && m["map_version"] == *v).then_some((st, cl, m))
        })
    }

    /// Waits until the published map version is above `version`; returns the new one.
    pub fn wait_for_version_after(&self, version: u64) -> u64 {
        let started = Instant::now();
        loop {
            let v = self.get_ok("/api/status")["map_version"]
                .as_u64()
                .expect("map_version");
            if v > version {
                return v;
            }
            assert!(
                started.elapsed() < ROUND_TIMEOUT,
                "no round after version {version} within {ROUND_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
