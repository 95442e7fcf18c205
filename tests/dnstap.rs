//! End-to-end tests of the front end's dnstap log (issue 44, item 7), read back with stock
//! tools: Debian's `dnstap-ldns` (package dnstap-ldns) reads the file `cdnmap dns` writes, and
//! `fstrm_capture` (package fstrm-bin) is the reader on the unix socket it writes to, its
//! capture then read by `dnstap-ldns`. Both are installed when missing.
//!
//! - to a file: every UDP query (fast path and general path) and a TCP query, each an
//!   `AUTH_QUERY` with the client's address and the query's ECS option and an
//!   `AUTH_RESPONSE` with the addresses `dig` got, the identity and the counters;
//! - to a socket, sampled: exactly one query of N logged (one UDP loop: the count is exact),
//!   and a reader that goes away and comes back gets the messages again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cdnmap_tests::bin;
use cdnmap_tests::dns::{host_in, metric, metrics_of, Dns};
use cdnmap_tests::ensure_debian_tool;
use cdnmap_tests::mapper::{all_units, Setup};
use ipnet::IpNet;

/// How long a front end may take to stop and close its log.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

fn dnstap_ldns() -> PathBuf {
    ensure_debian_tool("dnstap-ldns", &["dnstap-ldns"]).unwrap_or_else(|e| panic!("{e}"))
}

fn fstrm_capture() -> PathBuf {
    ensure_debian_tool("fstrm_capture", &["fstrm-bin"]).unwrap_or_else(|e| panic!("{e}"))
}

/// One dnstap message as `dnstap-ldns -y` prints it (a YAML document).
#[derive(Debug)]
struct Logged {
    text: String,
}

impl Logged {
    /// The value of `key` (the first line `key: value`, at any indentation), unquoted.
    fn field(&self, key: &str) -> Option<&str> {
        let key = format!("{key}: ");
        self.text
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(key.as_str()))
            .map(|v| v.trim().trim_matches('"'))
    }

    /// The message's type (`AUTH_QUERY`, `AUTH_RESPONSE`): the `type:` of its `message:`
    /// block (the document's own `type:`, unindented, is `MESSAGE`).
    fn kind(&self) -> &str {
        self.text
            .lines()
            .find_map(|l| l.strip_prefix("  type: "))
            .unwrap_or("")
    }
}

/// `dnstap-ldns -r FILE -y`: every message of a dnstap file.
fn read_back(file: &Path) -> Vec<Logged> {
    let out = Command::new(dnstap_ldns())
        .args(["-r"])
        .arg(file)
        .arg("-y")
        .stdin(Stdio::null())
        .output()
        .expect("dnstap-ldns runs");
    assert!(
        out.status.success(),
        "dnstap-ldns -r {} -y: {}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split("---\n")
        .filter(|d| !d.trim().is_empty() && d.trim() != "...")
        .map(|d| Logged {
            text: d.to_string(),
        })
        .collect()
}

/// Stops `dns` (SIGTERM) and waits for it to exit, so its log is closed (STOP written).
fn stop(dns: &mut Dns) {
    dns.process.send_sigterm();
    let started = Instant::now();
    while dns.process.exited().is_none() {
        assert!(
            started.elapsed() < STOP_TIMEOUT,
            "cdnmap dns did not stop within {STOP_TIMEOUT:?}:\n{}",
            dns.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client subnet inside a web unit's IPv4 prefix, `a.b.c.d/len`.
async fn web_subnet(server: &cdnmap_tests::mapper::Server) -> String {
    let units = all_units(server).await;
    let unit = units
        .iter()
        .find(|u| u.traffic_class == "web" && u.prefixes.iter().any(|p| p.contains('.')))
        .expect("a web unit with an IPv4 prefix");
    let prefix = unit
        .prefixes
        .iter()
        .find(|p| p.contains('.'))
        .expect("an IPv4 prefix");
    let net: IpNet = prefix.parse().expect("a prefix");
    // The subnet as dig sends it: a /24 (or the prefix, when longer) around a host of it.
    let len = net.prefix_len().max(24);
    let sub = IpNet::new(host_in(net), len).expect("a subnet").trunc();
    sub.to_string()
}

/// The start of the ECS option (RFC 7871) of client subnet `subnet` (IPv4, `a.b.c.d/len`),
/// as `dnstap-ldns` prints EDNS options (hexadecimal): code 8, length, family 1, the source
/// prefix length; then, after the scope, the address octets the prefix covers.
fn ecs_hex(subnet: &str) -> (String, String) {
    let net: IpNet = subnet.parse().expect("a subnet");
    let octets = usize::from(net.prefix_len()).div_ceil(8);
    let IpNet::V4(v4) = net else {
        panic!("an IPv4 subnet: {subnet}")
    };
    let address: String = v4.addr().octets()[..octets]
        .iter()
        .map(|o| format!("{o:02x}"))
        .collect();
    (
        format!("0008{:04x}0001{:02x}", 4 + octets, net.prefix_len()),
        address,
    )
}

/// Whether a message's text holds the ECS option `(head, address)` of [`ecs_hex`] (any scope).
fn has_ecs(m: &Logged, (head, address): &(String, String)) -> bool {
    m.text.match_indices(head.as_str()).any(|(at, _)| {
        let rest = &m.text[at + head.len()..];
        rest.get(2..2 + address.len()) == Some(address.as_str())
    })
}

/// Waits until `dns`'s counter `series` reaches `want` (the writer is a thread of its own).
fn wait_metric(dns: &Dns, series: &str, want: f64) -> String {
    let started = Instant::now();
    loop {
        let body = metrics_of(dns);
        if metric(&body, series).unwrap_or(0.0) >= want {
            return body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{series} stays below {want}:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dnstap_to_a_file_is_read_back_by_dnstap_ldns() {
    dnstap_ldns();
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let file = setup.dir.path().join("queries.dnstap");
    let config = format!(
        "udp_threads = 1\nmetrics_listen = \"127.0.0.1:0\"\ndnstap_file = {:?}\n",
        file.display().to_string()
    );
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, &config);
    dns.wait_answering();
    let subnet = web_subnet(&server).await;
    let ecs = format!("+subnet={subnet}");
    // Over UDP, the fast path (A with ECS) and the general path (TXT at the apex), and TCP.
    let udp = dns.dig(&["www.cdn.example", "A", &ecs]);
    assert_eq!(udp.status, "NOERROR", "{}", udp.raw);
    let general = dns.dig(&["cdn.example", "SOA"]);
    assert_eq!(general.status, "NOERROR", "{}", general.raw);
    let tcp = dns.dig(&["www.cdn.example", "A", &ecs, "+tcp"]);
    assert_eq!(tcp.status, "NOERROR", "{}", tcp.raw);
    let body = metrics_of(&dns);
    let datagrams = metric(&body, "cdnmap_dns_udp_datagrams_total").expect("datagrams");
    // Each datagram and the TCP query: a query and a response message each.
    let want = 2.0 * (datagrams + 1.0);
    let body = wait_metric(&dns, "cdnmap_dns_dnstap_written_total", want);
    assert_eq!(
        metric(&body, "cdnmap_dns_dnstap_written_total"),
        Some(want),
        "{body}"
    );
    assert_eq!(
        metric(&body, "cdnmap_dns_dnstap_dropped_total"),
        Some(0.0),
        "{body}"
    );
    stop(&mut dns);

    let logged = read_back(&file);
    assert_eq!(logged.len() as f64, want, "{logged:#?}");
    let of = |kind: &str, proto: &str| -> Vec<&Logged> {
        logged
            .iter()
            .filter(|m| m.kind() == kind && m.field("socket_protocol") == Some(proto))
            .collect()
    };
    assert_eq!(of("AUTH_QUERY", "UDP").len() as f64, datagrams);
    assert_eq!(of("AUTH_RESPONSE", "UDP").len() as f64, datagrams);
    assert_eq!(of("AUTH_QUERY", "TCP").len(), 1);
    assert_eq!(of("AUTH_RESPONSE", "TCP").len(), 1);
    for m in &logged {
        assert_eq!(m.field("identity"), Some("dns-e2e"), "{}", m.text);
        assert_eq!(m.field("query_address"), Some("127.0.0.1"), "{}", m.text);
        assert_eq!(m.field("socket_family"), Some("INET"), "{}", m.text);
        assert!(m.field("query_port").is_some(), "{}", m.text);
        assert_eq!(
            m.field("response_port"),
            Some(dns.addr.port().to_string().as_str()),
            "{}",
            m.text
        );
    }
    // The ECS queries, over both transports, carry their subnet (a scope of 0); their
    // responses the subnet again and the addresses dig got.
    let ecs_of = ecs_hex(&subnet);
    for (proto, reply) in [("UDP", &udp), ("TCP", &tcp)] {
        let queries: Vec<&Logged> = of("AUTH_QUERY", proto)
            .into_iter()
            .filter(|m| has_ecs(m, &ecs_of))
            .collect();
        assert_eq!(
            queries.len(),
            1,
            "{proto}: {subnet} {ecs_of:?} in {logged:#?}"
        );
        assert!(
            queries[0]
                .text
                .contains(&format!("{}00{}", ecs_of.0, ecs_of.1)),
            "a query's scope is 0: {}",
            queries[0].text
        );
        let responses: Vec<&Logged> = of("AUTH_RESPONSE", proto)
            .into_iter()
            .filter(|m| has_ecs(m, &ecs_of))
            .collect();
        assert_eq!(responses.len(), 1, "{proto}: {subnet} in {logged:#?}");
        let addresses = reply.addresses();
        assert!(!addresses.is_empty(), "{}", reply.raw);
        for a in addresses {
            assert!(
                responses[0].text.contains(&a),
                "{a} in {}",
                responses[0].text
            );
        }
    }
    // The general path's answer is logged too.
    assert!(
        of("AUTH_RESPONSE", "UDP")
            .iter()
            .any(|m| m.text.contains("SOA")),
        "{logged:#?}"
    );
}

/// `fstrm_capture` reading on `socket`, writing to `out`; killed when dropped.
struct Capture(Child);

impl Capture {
    fn start(socket: &Path, out: &Path) -> Capture {
        let child = Command::new(fstrm_capture())
            .args(["-t", "protobuf:dnstap.Dnstap", "-u"])
            .arg(socket)
            .arg("-w")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("fstrm_capture runs");
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "fstrm_capture made no socket"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Capture(child)
    }

    /// Stops it (SIGTERM: it closes its file) and waits.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let started = Instant::now();
        while self.0.try_wait().ok().flatten().is_none() {
            assert!(
                started.elapsed() < STOP_TIMEOUT,
                "fstrm_capture did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `n` UDP queries for `www.cdn.example A` from one socket, each answered before the
/// next.
fn queries(dns: &Dns, n: usize) {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("a timeout");
    let mut q = vec![0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ["www", "cdn", "example"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut buf = [0u8; 2048];
    for i in 0..n {
        q[..2].copy_from_slice(&(i as u16).to_be_bytes());
        socket.send_to(&q, dns.addr).expect("send");
        socket.recv(&mut buf).expect("an answer");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dnstap_to_a_socket_is_sampled_and_survives_its_reader() {
    dnstap_ldns();
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let dir = setup.dir.path().to_path_buf();
    let socket = dir.join("dnstap.sock");
    let first = dir.join("first.fstrm");
    let capture = Capture::start(&socket, &first);
    const N: f64 = 7.0;
    let config = format!(
        "udp_threads = 1\nmetrics_listen = \"127.0.0.1:0\"\ndnstap_socket = {:?}\ndnstap_sample = {N}\ndnstap_identity = \"edge-7\"\ndnstap_messages = \"queries\"\n",
        socket.display().to_string()
    );
    let mut dns = Dns::start(bin!(), &dir, server.grpc, &config);
    dns.wait_answering();
    queries(&dns, 200);
    let body = metrics_of(&dns);
    let datagrams = metric(&body, "cdnmap_dns_udp_datagrams_total").expect("datagrams");
    // One of every N, the first included: a count, exact with one UDP loop. Queries only.
    let sampled = (datagrams / N).ceil();
    let body = wait_metric(&dns, "cdnmap_dns_dnstap_written_total", sampled);
    assert_eq!(
        metric(&body, "cdnmap_dns_dnstap_written_total"),
        Some(sampled),
        "{datagrams} datagrams: {body}"
    );
    assert_eq!(
        metric(&body, "cdnmap_dns_dnstap_dropped_total"),
        Some(0.0),
        "{body}"
    );
    // Give the writer an idle flush, then take the reader away.
    std::thread::sleep(Duration::from_millis(600));
    capture.stop();
    let logged = read_back(&first);
    assert_eq!(logged.len() as f64, sampled, "{logged:#?}");
    for m in &logged {
        assert_eq!(m.kind(), "AUTH_QUERY", "{}", m.text);
        assert_eq!(m.field("identity"), Some("edge-7"), "{}", m.text);
        assert!(m.text.contains("www.cdn.example."), "{}", m.text);
    }

    // No reader: the front end answers on, dropping (and counting) what it cannot write; a
    // new reader gets messages again.
    std::fs::remove_file(&socket).ok();
    queries(&dns, 50);
    let second = dir.join("second.fstrm");
    let capture = Capture::start(&socket, &second);
    let before = metric(&metrics_of(&dns), "cdnmap_dns_dnstap_written_total").unwrap_or(0.0);
    let started = Instant::now();
    loop {
        queries(&dns, 20);
        let body = metrics_of(&dns);
        if metric(&body, "cdnmap_dns_dnstap_written_total").unwrap_or(0.0) > before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the writer did not connect to the new reader:\n{body}\n{}",
            dns.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let body = metrics_of(&dns);
    assert!(
        metric(&body, "cdnmap_dns_dnstap_dropped_total").unwrap_or(0.0) >= 1.0,
        "queries without a reader are dropped and counted: {body}"
    );
    stop(&mut dns);
    capture.stop();
    let again = read_back(&second);
    assert!(!again.is_empty(), "the second reader got messages");
    assert!(again.iter().all(|m| m.kind() == "AUTH_QUERY"));
}
