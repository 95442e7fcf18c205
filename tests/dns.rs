//! End-to-end tests of the DNS front end, `cdnmap dns`, against the real binary, with Debian's
//! `dig` as the client (installed by the test setup when missing) and a real `cdnmap serve` as
//! its mapper (issue 6):
//!
//! - answers agree with the mapper's own `Resolve` for the same client and name (the oracle:
//!   the same clusters, the same servers in the same order, the ECS scope) over UDP and TCP,
//!   for A and AAAA, with and without `+subnet=`;
//! - the status codes: SOA and NS at the apex, NXDOMAIN for names no rule names, REFUSED
//!   outside the zone, NODATA for other types, FORMERR for a malformed ECS option (RFC 7871),
//!   BADVERS for an EDNS version other than 0 (RFC 6891), one HINFO for ANY (RFC 8482),
//!   REFUSED for zone transfers (RFC 5936);
//! - a large answer is truncated over UDP without EDNS and complete over TCP;
//! - with no mapper yet it answers SERVFAIL, then answers once the mapper is up, keeps answering
//!   when the mapper dies, reconnects when it returns, and reports per-prefix demand;
//! - following two mappers (issue 18), it answers from the map of the higher epoch, keeps it
//!   when that mapper dies (never taking the lower epoch's), and takes the other's when it
//!   comes back with a higher epoch;
//! - it follows a mapper over mutual TLS (issue 17): only front ends with a certificate from
//!   the operator's CA watch maps and send feedback, their reports are recorded under their
//!   certificate's name, and the mapper's certificate is replaced without dropping the stream;
//! - under load the UDP loop takes queries in batches (receive coalescing) and still answers
//!   each once, to its sender;
//! - static zone data (the nameservers' addresses, TXT, CAA, MX, SRV, CNAME) is answered as
//!   gdnsd answers the same records from a zone file (the oracle), and two front ends of one
//!   mapper answer the same SOA serial, the mapper's epoch.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cdnmap_proto::v1 as pb;
use cdnmap_tests::bin;
use cdnmap_tests::dns::{
    answers_for, client_of, epoch_of, host_in, metric, metrics_of, resolve, sample_units,
    wait_following, Dns, READY_TIMEOUT,
};
use cdnmap_tests::mapper::{
    all_units, http_get, ok, qname_of, status, www_query, Server, Setup, CYCLE_SECS,
};
use ipnet::IpNet;

/// A query for `name` of type `qtype` (class IN, no EDNS), as its bytes.
fn raw_query(name: &str, qtype: u16) -> Vec<u8> {
    let mut q = vec![0x4a, 0x17, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// The RCODE of the response to [`raw_query`] over UDP (checked to answer its id).
fn rcode_over_udp(addr: SocketAddr, name: &str, qtype: u16) -> u8 {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("a timeout");
    socket
        .send_to(&raw_query(name, qtype), addr)
        .expect("send the query");
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("a response");
    assert!(n >= 12 && buf[..2] == [0x4a, 0x17], "{:?}", &buf[..n]);
    buf[3] & 0x0f
}

/// The RCODE of the response to [`raw_query`] over TCP (two length bytes first).
fn rcode_over_tcp(addr: SocketAddr, name: &str, qtype: u16) -> u8 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect over TCP");
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("a timeout");
    let q = raw_query(name, qtype);
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    stream.write_all(&framed).expect("send the query");
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).expect("a response's length");
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).expect("a response");
    assert!(buf.len() >= 12 && buf[..2] == [0x4a, 0x17], "{buf:?}");
    buf[3] & 0x0f
}

/// The oracle: for map units of every class, IPv4 and IPv6, the front end's answer (servers in
/// order, ECS scope) equals the mapper's `Resolve` for the same client and name, over UDP and
/// TCP. A round may land between the two questions; a mismatch is retried, and must clear.
#[tokio::test(flavor = "multi_thread")]
async fn answers_agree_with_the_mappers_resolve() {
    let mut setup = Setup::with_extra(
        bin!(),
        true,
        "[selection.default]\npolicy = \"consistent\"\nvnodes = 40\n",
    );
    let server = setup.start().await;
    // Three answering loops, each on its own socket: dig's queries, each from a port of its
    // own, are spread over them by the kernel (SO_REUSEPORT), and every one must answer alike.
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, "udp_threads = 3\n");
    dns.wait_answering();
    let units = all_units(&server).await;
    let mut checked = 0;
    let (mut v4, mut v6) = (0, 0);
    for (i, u) in units.iter().enumerate().step_by(units.len() / 60 + 1) {
        let Some(prefix) = u.prefixes.first() else {
            continue;
        };
        let net: IpNet = prefix.parse().expect("a prefix");
        let qname = qname_of(&u.traffic_class);
        let qtypes: &[(u32, &str)] = if net.addr().is_ipv4() {
            v4 += 1;
            &[(1, "A")]
        } else {
            v6 += 1;
            &[(28, "AAAA"), (1, "A")]
        };
        let subnet = format!("{}/{}", host_in(net), net.prefix_len());
        for &(qtype, name) in qtypes {
            let tcp = if i % 2 == 0 { "+tcp" } else { "+notcp" };
            let mut attempts = 0;
            loop {
                attempts += 1;
                let want = resolve(&server, &subnet, "", qname, qtype).await;
                let got = dns.dig(&[qname, name, &format!("+subnet={subnet}"), tcp]);
                assert!(
                    (1..=3).contains(&want.addresses.len()),
                    "Resolve names 1 to 3 selected servers: {want:?}"
                );
                let same = got.status == "NOERROR"
                    && got.addresses() == want.addresses
                    && got.scope() == Some(want.scope_prefix_len as u8)
                    && got.answers.iter().all(|a| a.1 == 20);
                if same {
                    break;
                }
                assert!(
                    attempts < 4,
                    "unit {} {name} {subnet}: dig {:?} scope {:?}, Resolve {:?} scope {} \
                     (unit {}):\n{}",
                    u.id,
                    got.addresses(),
                    got.scope(),
                    want.addresses,
                    want.scope_prefix_len,
                    want.map_unit,
                    got.raw
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 50 && v4 > 0 && v6 > 0,
        "{checked} checked ({v4} v4, {v6} v6)"
    );

    // Without ECS: the resolver's address (127.0.0.1, outside every prefix: the fallback).
    let got = dns.dig(&["www.cdn.example", "A"]);
    let want = resolve(&server, "", "127.0.0.1", "www.cdn.example.", 1).await;
    assert_eq!(got.addresses(), want.addresses, "{}", got.raw);
    assert!(got.client_subnet.is_none(), "no ECS asked, none echoed");
    assert!(got.flags.contains(&"aa".to_string()), "{:?}", got.flags);
    assert!(
        got.addresses().len() >= 2,
        "at least two servers: {}",
        got.raw
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn status_codes_apex_records_and_truncation() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    // Sixteen long NS names: the apex's NS answer does not fit in 512 bytes.
    let ns: Vec<String> = (0..16)
        .map(|i| format!("\"ns{i}-{}.cdn.example.\"", "x".repeat(40)))
        .collect();
    let config = format!(
        "nameservers = [{}]\nmetrics_listen = \"127.0.0.1:0\"\n",
        ns.join(", ")
    );
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, &config);
    let metrics = dns
        .metrics
        .expect("cdnmap dns says where it serves /metrics");
    dns.wait_answering();

    let soa = dns.dig(&["cdn.example", "SOA"]);
    assert_eq!(soa.status, "NOERROR", "{}", soa.raw);
    assert_eq!(soa.answers.len(), 1, "{}", soa.raw);
    assert_eq!(soa.answers[0].2, "SOA");
    assert!(soa.answers[0].3.starts_with("ns0-"), "{}", soa.raw);

    let nx = dns.dig(&["no-such-name.cdn.example", "A"]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.raw);
    assert!(nx.flags.contains(&"aa".to_string()));
    assert_eq!(
        nx.authority.first().map(|a| a.2.as_str()),
        Some("SOA"),
        "{}",
        nx.raw
    );

    let refused = dns.dig(&["www.example.org", "A"]);
    assert_eq!(refused.status, "REFUSED", "{}", refused.raw);
    assert!(refused.answers.is_empty());

    let nodata = dns.dig(&["www.cdn.example", "TXT"]);
    assert_eq!(nodata.status, "NOERROR", "{}", nodata.raw);
    assert!(nodata.answers.is_empty());
    assert_eq!(nodata.authority.first().map(|a| a.2.as_str()), Some("SOA"));

    // Every class's names are known: a rule names them.
    for name in [
        "edge7.video.cdn.example",
        "api.apps.cdn.example",
        "www.cdn.example",
    ] {
        let r = dns.dig(&[name, "A", "+subnet=1.2.3.0/24"]);
        assert_eq!(r.status, "NOERROR", "{name}: {}", r.raw);
        assert!(!r.addresses().is_empty(), "{name}: {}", r.raw);
    }

    // UDP without EDNS: the NS set does not fit in 512 bytes, so TC is set...
    let cut = dns.dig(&["cdn.example", "NS", "+noedns", "+ignore"]);
    assert!(cut.flags.contains(&"tc".to_string()), "{}", cut.raw);
    assert!(cut.answers.len() < 16, "{}", cut.raw);
    // ...and dig, seeing TC, asks again over TCP and gets all of it.
    let full = dns.dig(&["cdn.example", "NS", "+noedns"]);
    assert_eq!(full.answers.len(), 16, "{}", full.raw);
    assert!(!full.flags.contains(&"tc".to_string()));
    let tcp = dns.dig(&["cdn.example", "NS", "+tcp"]);
    assert_eq!(tcp.answers.len(), 16, "{}", tcp.raw);

    // An ECS option with a source prefix longer than its family: FORMERR (RFC 7871 §7.1.1
    // also refuses a nonzero scope in a query; dig cannot send one).
    let bad = dns.dig(&["www.cdn.example", "A", "+ednsopt=8:00012100c0000200"]);
    assert_eq!(bad.status, "FORMERR", "{}", bad.raw);
    // Still answering.
    assert_eq!(dns.dig(&["www.cdn.example", "A"]).status, "NOERROR");

    // RFC 7871 §6: address bits set beyond the source prefix (a /20 whose third byte is
    // 0x0f) are FORMERR; the same prefix with them clear is answered.
    let bits = dns.dig(&["www.cdn.example", "A", "+ednsopt=8:0001140001020f"]);
    assert_eq!(bits.status, "FORMERR", "{}", bits.raw);
    let clean = dns.dig(&["www.cdn.example", "A", "+ednsopt=8:00011400010200"]);
    assert_eq!(clean.status, "NOERROR", "{}", clean.raw);
    assert!(!clean.addresses().is_empty(), "{}", clean.raw);

    // RFC 6891 §6.1.3: an EDNS version other than 0 is answered BADVERS, with an OPT record
    // of version 0, wherever the name is.
    for name in ["www.cdn.example", "www.example.org"] {
        let v1 = dns.dig(&[name, "A", "+edns=1", "+noednsnegotiation"]);
        assert_eq!(v1.status, "BADVERS", "{name}: {}", v1.raw);
        assert!(v1.raw.contains("EDNS: version: 0"), "{name}: {}", v1.raw);
        assert!(v1.answers.is_empty() && !v1.flags.contains(&"aa".to_string()));
    }

    // RFC 8482 §4.2: ANY gets one synthesized HINFO record, at a mapped name and at the apex;
    // a name no rule names stays NXDOMAIN.
    for name in ["www.cdn.example", "cdn.example"] {
        let any = dns.dig(&[name, "ANY"]);
        assert_eq!(any.status, "NOERROR", "{name}: {}", any.raw);
        assert_eq!(any.answers.len(), 1, "{name}: {}", any.raw);
        assert_eq!(any.answers[0].2, "HINFO", "{name}: {}", any.raw);
        assert_eq!(any.answers[0].3, "\"RFC8482\" \"\"", "{name}: {}", any.raw);
    }
    assert_eq!(
        dns.dig(&["no-such-name.cdn.example", "ANY"]).status,
        "NXDOMAIN"
    );

    // RFC 5936 §2.2.1: zone transfers are refused, AXFR over TCP and IXFR over UDP.
    assert_eq!(
        rcode_over_tcp(dns.addr, "cdn.example", 252),
        5,
        "AXFR: REFUSED"
    );
    assert_eq!(
        rcode_over_udp(dns.addr, "cdn.example", 251),
        5,
        "IXFR: REFUSED"
    );
    assert_eq!(dns.dig(&["www.cdn.example", "A"]).status, "NOERROR");

    // Every outcome above is counted on /metrics.
    let (status, body) = http_get(metrics, "/metrics");
    assert!(status.contains("200"), "{status}");
    let count = |rcode: &str| -> f64 {
        body.lines()
            .find(|l| l.starts_with(&format!("cdnmap_dns_responses_total{{{rcode}}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    for (rcode, at_least) in [
        ("rcode=\"NOERROR\",answer=\"records\"", 4.0),
        ("rcode=\"NXDOMAIN\",answer=\"none\"", 1.0),
        ("rcode=\"REFUSED\",answer=\"none\"", 3.0),
        ("rcode=\"NOERROR\",answer=\"nodata\"", 1.0),
        ("rcode=\"FORMERR\",answer=\"none\"", 2.0),
        ("rcode=\"BADVERS\",answer=\"none\"", 2.0),
    ] {
        assert!(
            count(rcode) >= at_least,
            "{rcode}: {}\n{body}",
            count(rcode)
        );
    }
    // Each answer with addresses by its route: the queries without ECS came from 127.0.0.1,
    // in no map unit.
    let routed = |route: &str| -> f64 {
        body.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "cdnmap_dns_answers_by_route_total{{route=\"{route}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let all: f64 = ["mapped", "split", "backup", "overflow", "down", "unmatched"]
        .into_iter()
        .map(routed)
        .sum();
    assert!(routed("unmatched") >= 3.0, "{body}");
    assert!(
        all <= count("rcode=\"NOERROR\",answer=\"records\""),
        "{all} routed of {} answers",
        count("rcode=\"NOERROR\",answer=\"records\"")
    );
    assert!(body.contains("cdnmap_dns_map_version"), "{body}");
    cdnmap_tests::promtool_check_metrics(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
}

/// Asks `dns` for `www.cdn.example A` `n` times from one IPv4 prefix of a web unit of
/// `server`'s map (each NOERROR): the unit's prefix and the ECS subnet used.
async fn dig_from_a_web_unit(server: &Server, dns: &Dns, n: usize) -> (IpNet, String) {
    let units = all_units(server).await;
    let unit = units
        .iter()
        .find(|u| u.traffic_class == "web" && u.prefixes.iter().any(|p| p.contains('.')))
        .expect("a web unit with an IPv4 prefix");
    let net: IpNet = unit.prefixes[0].parse().expect("a prefix");
    let subnet = format!("{}/{}", host_in(net), net.prefix_len());
    for _ in 0..n {
        let r = dns.dig(&["www.cdn.example", "A", &format!("+subnet={subnet}")]);
        assert_eq!(r.status, "NOERROR", "{}", r.raw);
    }
    (net, subnet)
}

#[tokio::test(flavor = "multi_thread")]
async fn keeps_answering_without_the_mapper_reconnects_and_reports_demand() {
    // The front end is told the mapper's address before the mapper is up, and follows that
    // one address across the mapper's restart below: the addresses of a first run, pinned.
    let mut setup = Setup::new(bin!(), true);
    setup.pin_from_a_first_run().await;
    // The front end first, with no mapper: SERVFAIL (no map), never a wrong answer.
    let mut dns = Dns::start(bin!(), setup.dir.path(), setup.grpc, "");
    std::thread::sleep(Duration::from_millis(500));
    let early = dns.dig(&["www.cdn.example", "A"]);
    assert_eq!(early.status, "SERVFAIL", "{}", early.raw);

    let server = setup.start().await;
    dns.wait_answering();
    // Queries from one prefix of a real unit, to be reported.
    let (net, subnet) = dig_from_a_web_unit(&server, &dns, 25).await;
    // The reports (one a second) reach the mapper's demand record: all 25 queries, counted
    // against the unit's prefix, summed over however many periods they fell in.
    let prefix = net.trunc().to_string();
    let started = Instant::now();
    // The record needs the Admin token.
    let (status, body) = server.http_get("/record?from_ms=0&to_ms=9999999999999");
    assert!(status.contains("401"), "{status}: {body}");
    loop {
        let (status, body) = server.http_get_authed("/record?from_ms=0&to_ms=9999999999999");
        assert!(status.contains("200"), "{status}: {body}");
        let counted: f64 = body
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r["reporter"] == "dns-e2e")
            .flat_map(|r| {
                r["report"]["demand"]["samples"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|s| s["target"]["prefix"] == prefix.as_str() && s["class"] == "web")
            .map(|s| s["queries"].as_f64().unwrap_or(0.0))
            .sum();
        assert!(
            counted <= 25.0,
            "more counted than asked: {counted}\n{body}"
        );
        if counted == 25.0 {
            break;
        }
        // A report is sent every second; each waits for the record's fsync, which a loaded
        // machine (the suite's other stores syncing at once) can hold for seconds.
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "{counted} of 25 queries for {prefix} reported by dns-e2e:\n{body}\n\
             front end:\n{}\nmapper:\n{}",
            dns.log(),
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The mapper dies: the front end answers from its last map.
    let before = dns.dig(&["www.cdn.example", "A", &format!("+subnet={subnet}")]);
    server.kill();
    std::thread::sleep(Duration::from_millis(500));
    let after = dns.dig(&["www.cdn.example", "A", &format!("+subnet={subnet}")]);
    assert_eq!(after.status, "NOERROR", "{}", after.raw);
    assert_eq!(after.addresses(), before.addresses());

    // It comes back: the front end follows it again.
    let follows = |log: &str| log.matches("following the mapper's map").count();
    let before = follows(&dns.log());
    let _server = setup.start().await;
    let started = Instant::now();
    while follows(&dns.log()) <= before {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no reconnection:\n{}",
            dns.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(dns.dig(&["www.cdn.example", "A"]).status, "NOERROR");
}

/// Waits until `log()` holds `needle` `n` times, for at most 10 s.
async fn wait_logged(what: &str, log: impl Fn() -> String, needle: &str, n: usize) {
    let started = Instant::now();
    while log().matches(needle).count() < n {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what} did not log {needle:?} {n} times:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGHUP reloads and never kills (issue 41): a plaintext mapper sent SIGHUP while it starts
/// (as soon as it logs anything, before it listens) and twice while it serves, and a front
/// end sent SIGHUP twice, keep running and answering, and each says in its log that it had a
/// SIGHUP and what it reloaded (with no TLS: nothing but the front end's zone data). Before,
/// SIGHUP killed both.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_and_never_kills_the_mapper_or_the_front_end() {
    let mut setup = Setup::new(bin!(), true);
    let mut starting = setup.spawn();
    let started = Instant::now();
    while starting.log().is_empty() {
        starting.assert_running();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nothing logged"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    starting.send_signal("HUP");
    let started = Instant::now();
    while cdnmap_tests::mapper::listening(&starting.log()).is_none() {
        starting.assert_running();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{}",
            starting.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = || starting.log();
    wait_logged("the starting mapper", log, "SIGHUP", 1).await;
    starting.assert_running();
    drop(starting);

    let mut server = setup.start().await;
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, "");
    dns.wait_answering();
    let streams = dns.log().matches("following the mapper's map").count();
    for n in 1..=2 {
        server.send_signal("HUP");
        dns.process.send_signal("HUP");
        let (mapper_log, dns_log) = (|| server.log(), || dns.log());
        wait_logged("the mapper", mapper_log, "SIGHUP: nothing to reload", n).await;
        wait_logged(
            "the front end",
            dns_log,
            "SIGHUP: no TLS files to reload",
            n,
        )
        .await;
        server.assert_running();
        dns.process.assert_running();
        ok(
            server.mapping().resolve(www_query()).await,
            "Resolve after SIGHUP",
        );
        let r = dns.dig(&["www.cdn.example", "A"]);
        assert_eq!(r.status, "NOERROR", "{}", r.raw);
    }
    // The front end's map stream was not touched.
    assert_eq!(
        dns.log().matches("following the mapper's map").count(),
        streams,
        "{}",
        dns.log()
    );
}

/// A mapper that keeps WatchMap to the front ends it knows (`watch_open = false`, issue 41)
/// is followed by a front end with its token (sent with WatchMap as with its reports), and
/// refuses one without.
#[tokio::test(flavor = "multi_thread")]
async fn a_front_end_follows_a_mapper_closed_to_strangers_with_its_token() {
    let mut setup = Setup::with_config(
        bin!(),
        true,
        "watch_open = false\n",
        "[feedback_tokens]\n\"dns-e2e\" = \"dns-e2e-token-42\"\n",
    );
    let server = setup.start().await;
    let mut dns = Dns::start(
        bin!(),
        setup.dir.path(),
        server.grpc,
        "feedback_token = \"dns-e2e-token-42\"\n",
    );
    dns.wait_answering();
    let stranger = Dns::start(bin!(), setup.dir.path(), server.grpc, "");
    let log = || stranger.log();
    wait_logged(
        "the front end without a token",
        log,
        "WatchMap needs a front end's token",
        1,
    )
    .await;
    assert_eq!(stranger.dig(&["www.cdn.example", "A"]).status, "SERVFAIL");
}

/// A front end following two mappers (issue 18: the replicas of a highly available mapper,
/// here two standalone ones of different worlds, whose epochs are each start's clock):
/// it answers from the map of the higher epoch (the front end's epoch and version are that
/// mapper's, and its answers that mapper's `Resolve`'s), keeps answering from it when that
/// mapper is killed, never takes the lower epoch's map meanwhile (through that mapper's
/// rounds), and takes the other mapper's map once it restarts with a higher epoch.
#[tokio::test(flavor = "multi_thread")]
async fn follows_the_highest_epoch_of_two_mappers() {
    // Two worlds (demo seeds 1 and 2), so that their maps answer differently.
    let mut a = Setup::new(bin!(), true);
    let mut b = Setup::new(bin!(), true);
    let text = std::fs::read_to_string(&b.config).expect("read the config");
    assert!(text.contains("\nseed = 1\n"), "{text}");
    std::fs::write(&b.config, text.replace("\nseed = 1\n", "\nseed = 2\n"))
        .expect("write the config");
    // A starts first, B after it (an epoch is its start's clock, so B's is the higher); A's
    // address is pinned: the front end must find it there after its restart.
    let server_a = a.start().await;
    a.pin();
    let server_b = b.start().await;
    let (epoch_a, epoch_b) = (epoch_of(&server_a).await, epoch_of(&server_b).await);
    assert!(epoch_b > epoch_a, "epochs: A {epoch_a}, B {epoch_b}");
    let units_b = sample_units(&server_b).await;
    // The check below tells the maps apart: for most of B's sampled clients A answers
    // otherwise.
    let mut differ = 0;
    for u in &units_b {
        let (subnet, qtype, _) = client_of(u);
        let qname = qname_of(&u.traffic_class);
        let (from_a, from_b) = (
            resolve(&server_a, &subnet, "", qname, qtype).await,
            resolve(&server_b, &subnet, "", qname, qtype).await,
        );
        differ += usize::from(from_a.addresses != from_b.addresses);
    }
    assert!(
        differ * 2 > units_b.len(),
        "the two worlds answer alike for {} of {} clients",
        units_b.len() - differ,
        units_b.len()
    );

    let (url_a, url_b) = (
        format!("http://{}", server_a.grpc),
        format!("http://{}", server_b.grpc),
    );
    let mut dns = Dns::start_url(
        bin!(),
        a.dir.path(),
        &format!("{url_a},{url_b}"),
        "metrics_listen = \"127.0.0.1:0\"\n",
    );
    dns.wait_answering();
    wait_following(&dns, &server_b, &units_b, READY_TIMEOUT).await;
    let connected = |body: &str, url: &str| {
        metric(
            body,
            &format!("cdnmap_dns_mapper_connected{{mapper=\"{url}\"}}"),
        )
    };
    let body = metrics_of(&dns);
    assert_eq!(connected(&body, &url_a), Some(1.0), "{body}");
    assert_eq!(connected(&body, &url_b), Some(1.0), "{body}");
    assert!(
        dns.log()
            .lines()
            .any(|l| l.contains("map version in use") && l.contains(&url_b)),
        "the log names the mapper a version came from:\n{}",
        dns.log()
    );
    cdnmap_tests::promtool_check_metrics(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));

    // B dies: the front end answers from B's map throughout A's rounds of the lower epoch.
    // (What it holds is read once B is gone and a version B sent just before has landed: B
    // may publish between any earlier read and the kill.)
    let version_a = status(&server_a).await.map_version;
    server_b.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = metric(&metrics_of(&dns), "cdnmap_dns_map_version");
    let before = answers_for(&dns, &units_b);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(CYCLE_SECS + 3) {
        let body = metrics_of(&dns);
        assert_eq!(
            metric(&body, "cdnmap_dns_map_epoch"),
            Some(epoch_b as f64),
            "{body}"
        );
        assert_eq!(metric(&body, "cdnmap_dns_map_version"), held, "{body}");
        assert_eq!(answers_for(&dns, &units_b), before, "{}", dns.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        status(&server_a).await.map_version > version_a,
        "A ran no round while B was away: nothing lower was offered"
    );
    assert_eq!(connected(&metrics_of(&dns), &url_b), Some(0.0));
    assert_eq!(connected(&metrics_of(&dns), &url_a), Some(1.0));

    // A restarts, with an epoch above B's (a later clock): the front end takes A's map.
    server_a.kill();
    let server_a = a.start().await;
    let epoch = epoch_of(&server_a).await;
    assert!(
        epoch > epoch_b,
        "A restarted at epoch {epoch}, B's was {epoch_b}"
    );
    let units_a = sample_units(&server_a).await;
    wait_following(&dns, &server_a, &units_a, READY_TIMEOUT).await;
    let last_in_use = dns
        .log()
        .lines()
        .rfind(|l| l.contains("map version in use"))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(last_in_use.contains(&url_a), "{last_in_use}");
}

/// A mapper that lost its store is followed at once (issue 41, finding 7). The epoch lived
/// only in the mapper's store, so a mapper started on an empty `data_dir` published epoch 1
/// again, below what a running front end held, and the front end kept its old map until the
/// new epoch's versions passed it (never, when the old epoch was higher). A start's epoch is
/// now at least its clock's (Unix ms), above every epoch of before.
#[tokio::test(flavor = "multi_thread")]
async fn a_mapper_that_lost_its_store_is_followed_at_once() {
    let mut setup = Setup::new(bin!(), true);
    // Three starts of one store (before the fix, epochs 1, 2, 3).
    for _ in 0..2 {
        setup.start().await.kill();
    }
    let server = setup.start().await;
    setup.pin();
    let epoch = epoch_of(&server).await;
    let units = sample_units(&server).await;
    let mut dns = Dns::start(
        bin!(),
        setup.dir.path(),
        server.grpc,
        "metrics_listen = \"127.0.0.1:0\"\n",
    );
    dns.wait_answering();
    wait_following(&dns, &server, &units, READY_TIMEOUT).await;

    // The store is lost; the mapper starts again on an empty data_dir, where it was.
    server.kill();
    std::fs::remove_dir_all(setup.dir.path().join("data")).expect("removing the store");
    let server = setup.start().await;
    let again = epoch_of(&server).await;
    assert!(
        again > epoch,
        "the new store's epoch {again}, the lost one's {epoch}"
    );
    let units = sample_units(&server).await;
    // Followed with its first map, long before a round could pass the version held.
    wait_following(&dns, &server, &units, Duration::from_secs(CYCLE_SECS - 2)).await;
}

/// TLS and mutual TLS between the front end and the mapper (issue 17): rustls on both
/// listeners, a front end's certificate from the operator's CA as its identity, certificates
/// from another CA refused in the handshake, clients without a certificate refused by the
/// services that need one, and the mapper's certificate reloaded (on a file's change and on
/// SIGHUP) with the front end's map stream kept.
#[tokio::test(flavor = "multi_thread")]
async fn follows_a_mapper_over_mutual_tls() {
    use cdnmap_tests::mapper::{endpoint, https_get, served_certificate, TOKEN};
    use cdnmap_tests::pki::Ca;
    let pki = tempfile::tempdir().expect("a temporary directory");
    let p = pki.path();
    let mapper_ca = Ca::new(p, "mapper");
    let server_leaf = mapper_ca.leaf(p, "mapper", &["localhost", "127.0.0.1"], true);
    let front_ca = Ca::new(p, "front-ends");
    let front = front_ca.leaf(p, "dns-ams-1", &["dns-ams-1.front-ends.example"], false);
    let rogue_ca = Ca::new(p, "rogue");
    let rogue = rogue_ca.leaf(p, "rogue", &["dns-ams-1.front-ends.example"], false);

    let mut setup = Setup::with_extra(
        bin!(),
        true,
        &format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\n",
            server_leaf.cert, server_leaf.key, front_ca.cert
        ),
    );
    setup.ca = Some(mapper_ca.cert.clone());
    let server = setup.start().await;
    assert!(
        server.log().contains("TLS on gRPC and HTTP"),
        "{}",
        server.log()
    );

    // Plaintext is not spoken on a TLS listener.
    let plain = endpoint(server.grpc, None, None).connect().await;
    if let Ok(channel) = plain {
        let r = pb::mapping_client::MappingClient::new(channel)
            .resolve(www_query())
            .await;
        assert!(r.is_err(), "a plaintext Resolve on the TLS listener: {r:?}");
    }
    // A client with no certificate resolves, but may not watch maps or send feedback.
    let mut mapping = server.mapping();
    let answer = ok(mapping.resolve(www_query()).await, "Resolve over TLS");
    assert_eq!(answer.rcode, 0);
    let watch = mapping
        .watch_map(pb::WatchMapRequest::default())
        .await
        .map(|_| ());
    assert_eq!(
        watch.as_ref().map_err(|s| s.code()),
        Err(tonic::Code::Unauthenticated),
        "{watch:?}"
    );
    let report = server
        .feedback()
        .report_demand(pb::DemandReport {
            reporter: "forged".into(),
            period_start_unix_ms: 0,
            period_end_unix_ms: 1000,
            samples: vec![],
        })
        .await;
    assert_eq!(
        report.as_ref().map(|_| ()).map_err(|s| s.code()),
        Err(tonic::Code::Unauthenticated),
        "{report:?}"
    );
    // A certificate from another CA fails the handshake: nothing is served to it.
    let rogue_call = match endpoint(
        server.grpc,
        Some(&mapper_ca.cert),
        Some((&rogue.cert, &rogue.key)),
    )
    .connect()
    .await
    {
        Err(e) => Err(e.to_string()),
        Ok(channel) => pb::mapping_client::MappingClient::new(channel)
            .watch_map(pb::WatchMapRequest::default())
            .await
            .map(|_| ())
            .map_err(|s| s.to_string()),
    };
    assert!(rogue_call.is_err(), "a rogue certificate was served");

    // The front end, over https:// with the operator's certificate for it.
    let mut dns = Dns::start_url(
        bin!(),
        setup.dir.path(),
        &format!("https://localhost:{}", server.grpc.port()),
        &format!(
            "mapper_ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
            mapper_ca.cert, front.cert, front.key
        ),
    );
    dns.wait_answering();
    let (_, subnet) = dig_from_a_web_unit(&server, &dns, 5).await;
    // Its reports are recorded under its certificate's name, not the name it gives itself
    // ("dns-e2e"); /record is read over HTTPS by Python's client.
    let auth = format!("Bearer {TOKEN}");
    let started = Instant::now();
    loop {
        let (code, body) = https_get(
            server.http,
            "/record?from_ms=0&to_ms=9999999999999",
            &mapper_ca.cert,
            &[("Authorization", &auth)],
        );
        assert_eq!(code, 200, "{body}");
        assert!(!body.contains("\"dns-e2e\""), "{body}");
        if body.contains("\"reporter\":\"dns-ams-1.front-ends.example\"") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "no report from dns-ams-1:\n{body}\n{}\n{}",
            dns.log(),
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The mapper's certificate is replaced: new connections get the new one (a file's
    // change is seen within a few seconds), the front end's stream stays.
    let follows = |log: &str| log.matches("following the mapper's map").count();
    let streams = follows(&dns.log());
    let served = |pem: &str| pem.split_whitespace().collect::<String>();
    assert_eq!(
        served(&served_certificate(server.grpc, &mapper_ca.cert)),
        served(&server_leaf.cert_pem)
    );
    let renewed = mapper_ca.leaf(p, "mapper", &["localhost", "127.0.0.1"], true);
    assert_ne!(renewed.cert_pem, server_leaf.cert_pem);
    let started = Instant::now();
    while served(&served_certificate(server.grpc, &mapper_ca.cert)) != served(&renewed.cert_pem) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the new certificate is not served:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        served(&served_certificate(server.http, &mapper_ca.cert)),
        served(&renewed.cert_pem),
        "the HTTP listener serves the new certificate too"
    );
    // SIGHUP reloads too (and says so).
    let pid = server.pid();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill -HUP");
    assert!(hup.success());
    let started = Instant::now();
    while !server.log().contains("why=\"SIGHUP\"") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no reload on SIGHUP:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The front end's SIGHUP reads its TLS files again, for its next connection.
    dns.process.send_signal("HUP");
    let reloaded = "SIGHUP: the TLS files of the links to the mappers reloaded";
    wait_logged("the front end", || dns.log(), reloaded, 1).await;
    // The front end kept its stream through the reloads, and answers.
    assert_eq!(follows(&dns.log()), streams, "{}", dns.log());
    let r = dns.dig(&["www.cdn.example", "A", &format!("+subnet={subnet}")]);
    assert_eq!(r.status, "NOERROR", "{}", r.raw);
}

/// The response to `datagram` over UDP, if one comes within a second.
fn udp_exchange(addr: SocketAddr, datagram: &[u8]) -> Option<Vec<u8>> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("a timeout");
    socket.send_to(datagram, addr).expect("send the datagram");
    let mut buf = vec![0u8; 65_536];
    let n = socket.recv(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// `query` with its header's flags (bytes 2 and 3) and counts replaced.
fn with_header(query: &[u8], flags: [u8; 2], counts: [u16; 4]) -> Vec<u8> {
    let mut q = query.to_vec();
    q[2..4].copy_from_slice(&flags);
    for (i, c) in counts.iter().enumerate() {
        q[4 + 2 * i..6 + 2 * i].copy_from_slice(&c.to_be_bytes());
    }
    q
}

/// An OPT record (version 0, payload 1232) carrying `options` (already encoded).
fn opt_record(options: &[u8]) -> Vec<u8> {
    let mut r = vec![0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0];
    r.extend_from_slice(&(options.len() as u16).to_be_bytes());
    r.extend_from_slice(options);
    r
}

/// Bad datagrams on the DNS surface, as a table, each sent as raw bytes (what dig will not
/// send): shorter than a header, no question, two questions, a compression loop, a label of
/// 64 bytes, a question cut short, an unknown opcode, NOTIFY, a response (and a malformed one),
/// two OPT records, an option running past its record, an ECS option of an unknown family, a
/// header claiming 65,535 answers, trailing bytes, kilobytes of junk after a header (read as
/// a question for the root, outside the zone). Each gets exactly the answer written here (its
/// RCODE, echoing the id, with QR set) or no answer at all, and after each the front end
/// answers dig as before.
#[tokio::test]
async fn bad_datagrams_get_exact_answers_and_the_front_end_serves_on() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, "");
    dns.wait_answering();
    let good = raw_query("www.cdn.example", 1);
    let edns = |options: &[u8]| {
        let mut q = with_header(&good, [0, 0], [1, 0, 0, 1]);
        q.extend_from_slice(&opt_record(options));
        q
    };
    let mut looped = good[..12].to_vec();
    looped.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]); // a name pointing at itself
    let mut long_label = good[..12].to_vec();
    long_label.push(64);
    long_label.extend_from_slice(&[b'a'; 64]);
    long_label.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut two_opts = with_header(&good, [0, 0], [1, 0, 0, 2]);
    two_opts.extend_from_slice(&opt_record(&[]));
    two_opts.extend_from_slice(&opt_record(&[]));
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[0xde, 0xad]);
    let mut junk = with_header(&good[..12], [0, 0], [1, 0, 0, 0]);
    junk.extend((0..4000u32).map(|i| (i * 7 % 251) as u8));
    // RCODEs: 0 NOERROR, 1 FORMERR (RFC 1035 §4.1.1; RFC 6891 §6.1.1 for two OPT records;
    // RFC 7871 §6 for an unknown ECS family), 4 NOTIMP (an opcode it does not implement),
    // 5 REFUSED (outside its zones). Trailing bytes after a whole question are ignored, as
    // hickory's parser does (RFC 1035 says nothing of them): the question is answered.
    let rows: Vec<(&str, Vec<u8>, Option<u8>)> = vec![
        ("eleven bytes", good[..11].to_vec(), None),
        (
            "no question",
            with_header(&good[..12], [0, 0], [0, 0, 0, 0]),
            Some(1),
        ),
        (
            "two questions, one given",
            with_header(&good, [0, 0], [2, 0, 0, 0]),
            Some(1),
        ),
        ("a compression loop", looped, Some(1)),
        ("a label of 64 bytes", long_label, Some(1)),
        (
            "a question cut short",
            good[..good.len() - 2].to_vec(),
            Some(1),
        ),
        (
            "opcode 15",
            with_header(&good, [0x78, 0], [1, 0, 0, 0]),
            Some(4),
        ),
        (
            "NOTIFY",
            with_header(&good, [0x20, 0], [1, 0, 0, 0]),
            Some(4),
        ),
        (
            "a response",
            with_header(&good, [0x80, 0], [1, 0, 0, 0]),
            None,
        ),
        (
            "a malformed response",
            with_header(&good[..20], [0x84, 0], [1, 0, 0, 0]),
            None,
        ),
        ("two OPT records", two_opts, Some(1)),
        (
            "an option past its record",
            edns(&[0, 8, 0, 40, 0, 1, 24, 0]),
            Some(1),
        ),
        (
            "ECS of family 3",
            edns(&[0, 8, 0, 7, 0, 3, 24, 0, 10, 0, 1]),
            Some(1),
        ),
        (
            "65,535 answers claimed",
            with_header(&good, [0, 0], [1, 0xffff, 0, 0]),
            Some(1),
        ),
        ("trailing bytes", trailing, Some(0)),
        ("4,000 bytes of junk", junk, Some(5)),
    ];
    let mut wrong = Vec::new();
    for (what, datagram, expected) in &rows {
        let got = udp_exchange(dns.addr, datagram);
        let rcode = got.as_ref().map(|r| {
            assert!(r.len() >= 12, "{what}: a response of {} bytes", r.len());
            assert_eq!(r[..2], datagram[..2], "{what}: the response's id");
            assert!(r[2] & 0x80 != 0, "{what}: a response without QR");
            r[3] & 0x0f
        });
        if rcode != *expected {
            wrong.push(format!("{what}: expected {expected:?}, got {rcode:?}"));
        }
        // The front end answers on.
        assert_eq!(
            dns.dig(&["www.cdn.example", "A"]).status,
            "NOERROR",
            "after {what}:\n{}",
            dns.log()
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A class's last resort (`[bypass.CLASS]`, a partner CDN): a unit whose every candidate is
/// down is answered with the class's CNAME, or its addresses of the query's family, by dig
/// through `cdnmap dns` and by the mapper's Resolve alike, counted as route "bypass"; a unit
/// with its cluster up is answered from it as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_unit_with_nothing_up_goes_to_its_class_last_resort() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = cdnmap_tests::mapper::write_small_instance(
        dir.path(),
        &[
            ("a", &["198.51.100.1"], "up"),
            ("b", &["198.51.100.2"], "down"),
        ],
        &[
            ("ua", "web", "10.0.3.0/24", &["a"]),
            ("ub", "web", "10.0.1.0/24", &["b"]),
            ("uv", "video", "10.0.2.0/24", &["b"]),
        ],
    );
    let mut setup = Setup::with_config(
        bin!(),
        true,
        &format!("instance = {path:?}\n"),
        "[bypass.web]\ncname = \"web.partner.example\"\n\
         [bypass.video]\naddresses = [\"192.0.2.10\", \"2001:db8::10\"]\n",
    );
    let server = setup.start().await;
    let mut dns = Dns::start(
        bin!(),
        setup.dir.path(),
        server.grpc,
        "metrics_listen = \"127.0.0.1:0\"\n",
    );
    dns.wait_answering();
    let web = dns.dig(&["www.cdn.example", "A", "+subnet=10.0.1.0/24"]);
    assert_eq!(web.status, "NOERROR", "{}", web.raw);
    assert_eq!(web.answers.len(), 1, "{}", web.raw);
    assert_eq!(web.answers[0].2, "CNAME", "{}", web.raw);
    assert_eq!(web.answers[0].3, "web.partner.example.", "{}", web.raw);
    // A name with a CNAME has no other data (RFC 1034 §3.6.2): every type gets it.
    for qtype in ["AAAA", "TXT", "ANY"] {
        let other = dns.dig(&["www.cdn.example", qtype, "+subnet=10.0.1.0/24"]);
        assert_eq!(
            other
                .answers
                .iter()
                .map(|a| (a.2.as_str(), a.3.as_str()))
                .collect::<Vec<_>>(),
            [("CNAME", "web.partner.example.")],
            "{qtype}: {}",
            other.raw
        );
    }
    let video = dns.dig(&["x.video.cdn.example", "A", "+subnet=10.0.2.0/24"]);
    assert_eq!(
        video
            .answers
            .iter()
            .map(|a| a.3.as_str())
            .collect::<Vec<_>>(),
        ["192.0.2.10"],
        "{}",
        video.raw
    );
    let video6 = dns.dig(&["x.video.cdn.example", "AAAA", "+subnet=10.0.2.0/24"]);
    assert_eq!(
        video6
            .answers
            .iter()
            .map(|a| a.3.as_str())
            .collect::<Vec<_>>(),
        ["2001:db8::10"],
        "{}",
        video6.raw
    );
    let up = dns.dig(&["www.cdn.example", "A", "+subnet=10.0.3.0/24"]);
    assert_eq!(
        up.answers.iter().map(|a| a.3.as_str()).collect::<Vec<_>>(),
        ["198.51.100.1"],
        "{}",
        up.raw
    );

    let mut mapping = server.mapping();
    let q = |subnet: &str, qname: &str| pb::ResolveRequest {
        client_subnet: subnet.into(),
        resolver_ip: String::new(),
        qname: qname.into(),
        qtype: 1,
    };
    let r = ok(
        mapping.resolve(q("10.0.1.9/32", "www.cdn.example")).await,
        "Resolve",
    );
    assert_eq!(
        (r.route.as_str(), r.cname.as_str()),
        ("bypass", "web.partner.example."),
        "{r:?}"
    );
    assert!(r.addresses.is_empty(), "{r:?}");
    let r = ok(
        mapping
            .resolve(q("10.0.2.9/32", "x.video.cdn.example"))
            .await,
        "Resolve",
    );
    assert_eq!(
        (r.route.as_str(), r.addresses.clone()),
        ("bypass", vec!["192.0.2.10".to_string()]),
        "{r:?}"
    );
    let r = ok(
        mapping.resolve(q("10.0.3.9/32", "www.cdn.example")).await,
        "Resolve",
    );
    assert_eq!(r.route, "mapped", "{r:?}");

    let body = metrics_of(&dns);
    let bypassed = metric(&body, "cdnmap_dns_answers_by_route_total{route=\"bypass\"}");
    assert_eq!(bypassed, Some(6.0), "{body}");
}

/// Receive coalescing (`udp_coalesce_us`): queries further apart than the interval never make
/// the loop wait; queries paced faster than one per interval but slower than the loop answers
/// them are taken in batches (the loop counts its waits, and datagrams per receive are well
/// above one, where without the waits each receive finds one), and every query is still
/// answered exactly once, to the socket that sent it, with its id.
#[tokio::test(flavor = "multi_thread")]
async fn under_load_the_udp_loop_takes_queries_in_batches_and_answers_each() {
    const QUERIES: usize = 2_000;
    const SOCKETS: usize = 4;
    const PACE: Duration = Duration::from_micros(100);
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let config = "udp_threads = 1\nudp_coalesce_us = 1000\nmetrics_listen = \"127.0.0.1:0\"\n";
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, config);
    dns.wait_answering();
    let counters = |body: &str| {
        ["receives", "datagrams", "coalescing_waits"]
            .map(|c| metric(body, &format!("cdnmap_dns_udp_{c}_total")).unwrap_or(0.0))
    };
    let addr = dns.addr;
    // Light load: one query at a time, 20 ms apart (twenty intervals): no waits.
    let before = counters(&metrics_of(&dns));
    tokio::task::spawn_blocking(move || {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .expect("a timeout");
        let mut buf = [0u8; 4096];
        for i in 0..20u16 {
            let mut q = raw_query("www.cdn.example", 1);
            q[..2].copy_from_slice(&i.to_be_bytes());
            socket.send_to(&q, addr).expect("send a query");
            let n = socket.recv(&mut buf).expect("an answer");
            assert!(n >= 12 && buf[..2] == i.to_be_bytes(), "{:?}", &buf[..n]);
            // Far apart enough that a loop descheduled for a few milliseconds on a busy
            // machine after its send (its wait then measured from late) still sees none.
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .expect("the client thread");
    let light = counters(&metrics_of(&dns));
    assert!(
        light[1] - before[1] >= 20.0,
        "20 queries counted: {light:?} after {before:?}"
    );
    assert_eq!(light[2], before[2], "no waits at one query per 20 ms");
    let before = light;
    let answered = tokio::task::spawn_blocking(move || {
        let sockets: Vec<std::net::UdpSocket> = (0..SOCKETS)
            .map(|_| {
                let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
                s.set_nonblocking(true).expect("non-blocking");
                s
            })
            .collect();
        // Ids answered, by socket; every read drains what is waiting, so that no socket's
        // receive buffer overflows while the queries go out.
        let mut answered: Vec<Vec<u16>> = vec![Vec::new(); SOCKETS];
        let mut buf = [0u8; 4096];
        let mut drain = |answered: &mut Vec<Vec<u16>>| {
            for (s, ids) in sockets.iter().zip(answered.iter_mut()) {
                while let Ok(n) = s.recv(&mut buf) {
                    assert!(n >= 12, "a response of {n} bytes");
                    assert_eq!(buf[3] & 0x0f, 0, "NOERROR: {:?}", &buf[..n]);
                    ids.push(u16::from_be_bytes([buf[0], buf[1]]));
                }
            }
        };
        let start = Instant::now();
        for i in 0..QUERIES {
            // On a fixed schedule, one query per PACE (spinning: a sleep would overshoot).
            while start.elapsed() < PACE * i as u32 {
                std::hint::spin_loop();
            }
            let mut q = raw_query("www.cdn.example", 1);
            q[..2].copy_from_slice(&(i as u16).to_be_bytes());
            sockets[i % SOCKETS]
                .send_to(&q, addr)
                .expect("send a query");
            drain(&mut answered);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while answered.iter().map(Vec::len).sum::<usize>() < QUERIES && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            drain(&mut answered);
        }
        answered
    })
    .await
    .expect("the client thread");
    for (s, ids) in answered.iter().enumerate() {
        let mut ids = ids.clone();
        ids.sort_unstable();
        let want: Vec<u16> = (0..QUERIES)
            .filter(|i| i % SOCKETS == s)
            .map(|i| i as u16)
            .collect();
        assert_eq!(
            ids, want,
            "socket {s}: each of its queries answered once, to it"
        );
    }
    let after = counters(&metrics_of(&dns));
    let [receives, datagrams, waits] = [0, 1, 2].map(|i| after[i] - before[i]);
    assert!(
        datagrams >= QUERIES as f64,
        "{datagrams} datagrams counted for {QUERIES} queries"
    );
    assert!(waits > 0.0, "the loop waited: {waits} waits");
    assert!(
        datagrams / receives >= 4.0,
        "queries every {PACE:?}, waits of 1 ms: {datagrams} datagrams in {receives} receives"
    );
}

/// The front end's probes on its metrics listener, no token: `/healthz` alive; `/readyz` 503
/// naming the mapper while it has no map (its mapper is not up), then, following a real mapper,
/// 200 with the map in use (the mapper's epoch) and its age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_on_the_metrics_listener() {
    let bin = bin!();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("an address");
    let config = "metrics_listen = \"127.0.0.1:0\"\n";
    let alone = Dns::start(bin, dir.path(), nowhere, config);
    let metrics = alone.metrics.expect("metrics_listen");
    let (line, body) = http_get(metrics, "/healthz");
    assert!(line.contains(" 200 "), "{line} {body}");
    assert_eq!(body, r#"{"alive":true}"#);
    let (line, body) = http_get(metrics, "/readyz");
    assert!(line.contains(" 503 "), "{line} {body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(ready["ready"], false, "{body}");
    let reason = ready["reason"].as_str().expect("a reason");
    assert!(
        reason.starts_with("no map yet") && reason.contains(&nowhere.to_string()),
        "{body}"
    );
    drop(alone);

    let mut setup = Setup::new(bin, true);
    let server = setup.start().await;
    let epoch = epoch_of(&server).await;
    let mut dns = Dns::start(bin, dir.path(), server.grpc, config);
    dns.wait_answering();
    let metrics = dns.metrics.expect("metrics_listen");
    let (line, body) = http_get(metrics, "/readyz");
    assert!(line.contains(" 200 "), "{line} {body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(ready["ready"], true, "{body}");
    assert_eq!(ready["map"]["epoch"], epoch, "{body}");
    assert!(
        ready["map"]["version"].as_u64().is_some_and(|v| v >= 1),
        "{body}"
    );
    assert!(
        ready["map"]["age_secs"].as_f64().is_some_and(|a| a >= 0.0),
        "{body}"
    );
}

/// A port in use stops `cdnmap dns` at once, exit 2, the error naming the setting and the
/// address: `listen` (its TCP side) and `metrics_listen`.
#[test]
fn a_port_in_use_stops_dns_naming_the_address() {
    let bin = bin!();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("its address");
    let cases = [
        (
            format!("listen = \"{addr}\"\n"),
            format!("error: listen {addr}: TCP: "),
        ),
        (
            format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"{addr}\"\n"),
            format!("error: metrics_listen {addr}: "),
        ),
    ];
    for (i, (config, needle)) in cases.iter().enumerate() {
        let conf = dir.path().join(format!("in-use-{i}.toml"));
        std::fs::write(&conf, format!("{config}zones = [\"cdn.example.\"]\n")).expect("write");
        let mut process = cdnmap_tests::Running::cdnmap(
            bin,
            dir.path(),
            [
                "dns".as_ref(),
                "--config".as_ref(),
                conf.as_os_str(),
                "--mapper".as_ref(),
                std::ffi::OsStr::new("http://127.0.0.1:1"),
            ],
            dir.path().join(format!("in-use-{i}.log")),
        );
        let started = Instant::now();
        let status = loop {
            if let Some(status) = process.exited() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "still running:\n{}",
                process.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = process.log();
        assert_eq!(status.code(), Some(2), "{config}: {status}\n{log}");
        assert!(
            log.contains(needle) && log.contains("in use"),
            "{config}: no {needle:?}:\n{log}"
        );
    }
    drop(taken);
}

/// The front end's token from `feedback_token_file`: a mapper with `watch_open = false` lets
/// only a front end with a token of its `[feedback_tokens]` follow the map, and this one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_ends_token_comes_from_a_file() {
    let bin = bin!();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let token = "front-end-token-e2e";
    let mut setup = Setup::with_config(
        bin,
        false,
        "watch_open = false\n",
        &format!("[feedback_tokens]\n\"dns-e2e\" = {token:?}\n"),
    );
    let server = setup.start().await;
    let path = dir.path().join("feedback-token");
    std::fs::write(&path, format!("{token}\n")).expect("write the token file");
    let config = format!("feedback_token_file = {path:?}\n");
    let mut dns = Dns::start(bin, dir.path(), server.grpc, &config);
    dns.wait_answering();
    assert!(!dns.log().contains(token), "the token is in the log");
}

/// The static records of [`zone_data_is_served_like_gdnsd_and_one_serial_for_two_front_ends`],
/// in the front end's configuration (after the NS names).
const ZONE_DATA: &str = r#"
nameservers = ["ns1.cdn.example.", "ns2.cdn.example."]

[[records]]
name = "ns1"
type = "A"
data = "192.0.2.53"

[[records]]
name = "ns2.cdn.example."
type = "AAAA"
data = "2001:db8::53"
ttl = 7200

[[records]]
name = "@"
type = "TXT"
data = "v=spf1 -all"
ttl = 300

[[records]]
name = "@"
type = "TXT"
data = "LONG_TXT"
ttl = 300

[[records]]
name = "@"
type = "CAA"
data = '0 issue "letsencrypt.org"'

[[records]]
name = "@"
type = "MX"
data = "10 mail"

[[records]]
name = "mail"
type = "A"
data = "192.0.2.25"

[[records]]
name = "_sip._tcp"
type = "SRV"
data = "0 5 5060 sip.example.org."

[[records]]
name = "docs"
type = "CNAME"
data = "www.example.org."

[[records]]
name = "alias"
type = "CNAME"
data = "ns1"
"#;

/// The same records as a zone file, for gdnsd (CAA in RFC 3597's generic form: gdnsd has no
/// CAA syntax; `TXT_A`, `TXT_B` the long TXT's two strings, `CAA_LEN` and `CAA_HEX` its CAA).
const GDNSD_ZONE: &str = r#"$TTL 3600
@ SOA ns1 hostmaster 1 3600 600 86400 60
@ NS ns1
@ NS ns2
ns1 A 192.0.2.53
ns2 7200 AAAA 2001:db8::53
@ 300 TXT "v=spf1 -all"
@ 300 TXT "TXT_A" "TXT_B"
@ TYPE257 \# CAA_LEN CAA_HEX
@ MX 10 mail
mail A 192.0.2.25
_sip._tcp SRV 0 5 5060 sip.example.org.
docs CNAME www.example.org.
alias CNAME ns1
"#;

/// Zone data beyond the map, end to end with dig: the nameservers' addresses (the glue), TXT
/// (one of 300 bytes, sent as two strings) and CAA at the apex, MX, SRV and CNAME at names,
/// NODATA at a static name without the type and at an empty non-terminal, NXDOMAIN beside
/// them, all on UDP and TCP; the same questions asked of gdnsd serving the same records as a
/// zone file (the oracle) get the same answer sections (names, TTLs, types, data) and
/// statuses. And two front ends of one mapper, started more than a second apart, answer the
/// same SOA serial: the mapper's epoch in seconds, not their start times.
#[tokio::test(flavor = "multi_thread")]
async fn zone_data_is_served_like_gdnsd_and_one_serial_for_two_front_ends() {
    use cdnmap_tests::dns::DnsPeer;
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let (txt_a, txt_b) = ("a".repeat(255), "b".repeat(45));
    let config = ZONE_DATA.replace("LONG_TXT", &format!("{txt_a}{txt_b}"));
    let mut a = Dns::start(bin!(), setup.dir.path(), server.grpc, &config);
    a.wait_answering();
    // A second apart at least: start times in seconds would differ.
    std::thread::sleep(Duration::from_millis(1100));
    let mut b = Dns::start(bin!(), setup.dir.path(), server.grpc, &config);
    b.wait_answering();

    let caa: Vec<u8> = [&[0u8, 5][..], b"issue", b"letsencrypt.org"].concat();
    let caa_hex: String = caa.iter().map(|b| format!("{b:02x}")).collect();
    let zone = GDNSD_ZONE
        .replace("TXT_A", &txt_a)
        .replace("TXT_B", &txt_b)
        .replace("CAA_LEN", &caa.len().to_string())
        .replace("CAA_HEX", &caa_hex);
    let gdnsd = DnsPeer::gdnsd(setup.dir.path(), "cdn.example", &zone);

    // (name, type, status, the answer section's types)
    let questions: [(&str, &str, &str, &[&str]); 14] = [
        ("ns1.cdn.example", "A", "NOERROR", &["A"]),
        ("ns2.cdn.example", "AAAA", "NOERROR", &["AAAA"]),
        ("NS1.cdn.example", "A", "NOERROR", &["A"]),
        ("cdn.example", "TXT", "NOERROR", &["TXT", "TXT"]),
        ("cdn.example", "CAA", "NOERROR", &["CAA"]),
        ("cdn.example", "MX", "NOERROR", &["MX"]),
        ("mail.cdn.example", "A", "NOERROR", &["A"]),
        ("_sip._tcp.cdn.example", "SRV", "NOERROR", &["SRV"]),
        ("docs.cdn.example", "A", "NOERROR", &["CNAME"]),
        ("docs.cdn.example", "TXT", "NOERROR", &["CNAME"]),
        ("alias.cdn.example", "CNAME", "NOERROR", &["CNAME"]),
        ("ns1.cdn.example", "TXT", "NOERROR", &[]),
        ("_tcp.cdn.example", "SRV", "NOERROR", &[]),
        ("nope.cdn.example", "A", "NXDOMAIN", &[]),
    ];
    // Sorted, owner names in lower case (ours are, as for the map's names; gdnsd copies the
    // question's case).
    let sorted = |r: &cdnmap_tests::dns::Reply| {
        let mut v = r.answers.clone();
        v.iter_mut().for_each(|a| a.0.make_ascii_lowercase());
        v.sort();
        v
    };
    for (name, qtype, want_status, want_types) in questions {
        let oracle = cdnmap_tests::dns::dig(gdnsd.addr, &[name, qtype, "+norec"]);
        assert_eq!(oracle.status, want_status, "gdnsd: {}", oracle.raw);
        for tcp in ["+notcp", "+tcp"] {
            let ours = a.dig(&[name, qtype, "+norec", tcp]);
            assert_eq!(
                ours.status, want_status,
                "{name} {qtype} {tcp}: {}",
                ours.raw
            );
            assert!(ours.flags.contains(&"aa".to_string()), "{}", ours.raw);
            let types: Vec<&str> = ours.answers.iter().map(|a| a.2.as_str()).collect();
            assert_eq!(types, want_types, "{name} {qtype} {tcp}: {}", ours.raw);
            assert_eq!(
                sorted(&ours),
                sorted(&oracle),
                "{name} {qtype} {tcp}: ours\n{}\ngdnsd's\n{}",
                ours.raw,
                oracle.raw
            );
            if want_types.is_empty() {
                assert_eq!(
                    ours.authority.first().map(|r| r.2.as_str()),
                    Some("SOA"),
                    "{}",
                    ours.raw
                );
            }
        }
    }
    // A CNAME to a static name of the zone: the target's records follow (gdnsd answers the
    // CNAME alone and leaves the rest to the resolver; BIND and Knot add them, as here).
    let chased = a.dig(&["alias.cdn.example", "A", "+norec"]);
    let lines: Vec<(String, String, String)> = chased
        .answers
        .iter()
        .map(|r| (r.0.clone(), r.2.clone(), r.3.clone()))
        .collect();
    assert_eq!(
        lines,
        [
            (
                "alias.cdn.example.".to_string(),
                "CNAME".to_string(),
                "ns1.cdn.example.".to_string()
            ),
            (
                "ns1.cdn.example.".to_string(),
                "A".to_string(),
                "192.0.2.53".to_string()
            )
        ],
        "{}",
        chased.raw
    );
    // The map's names are answered as before beside them.
    let mapped = a.dig(&["www.cdn.example", "A", "+subnet=1.2.3.0/24"]);
    assert_eq!(mapped.status, "NOERROR", "{}", mapped.raw);
    assert!(!mapped.addresses().is_empty(), "{}", mapped.raw);

    // One serial: the mapper's epoch in seconds, on both front ends.
    let epoch = epoch_of(&server).await;
    let serial_of = |dns: &Dns| -> u64 {
        let soa = dns.dig(&["cdn.example", "SOA"]);
        assert_eq!(soa.answers.len(), 1, "{}", soa.raw);
        let fields: Vec<&str> = soa.answers[0].3.split_whitespace().collect();
        fields[2].parse().expect("a serial")
    };
    // The front ends may still hold the map of the mapper's store (the epoch before) for a
    // round: wait, boundedly, until both serve the current epoch's.
    let started = Instant::now();
    loop {
        let (sa, sb) = (serial_of(&a), serial_of(&b));
        if sa == epoch / 1000 && sb == epoch / 1000 {
            break;
        }
        assert!(
            started.elapsed() < READY_TIMEOUT,
            "serials {sa} and {sb}, the mapper's epoch {epoch} ms:\n{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    a.process.assert_running();
    b.process.assert_running();
}

/// SIGHUP reloads the zone data: a record added to the file is answered, one removed is
/// NXDOMAIN; a file whose records do not load (a CNAME beside other data) keeps the data in
/// use, and the log says why, naming the record; a configured serial moves forward and one
/// before it is refused.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_zone_data_and_keeps_it_when_the_file_is_bad() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let glue = "nameservers = [\"ns1.cdn.example.\"]\n\
                [[records]]\nname = \"ns1\"\ntype = \"A\"\ndata = \"192.0.2.53\"\n";
    let txt =
        |data: &str| format!("[[records]]\nname = \"info\"\ntype = \"TXT\"\ndata = {data:?}\n");
    let first = format!("soa_serial = 10\n{glue}{}", txt("one"));
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, &first);
    dns.wait_answering();
    let txt_of = |dns: &Dns, name: &str| {
        let r = dns.dig(&[name, "TXT"]);
        (
            r.status.clone(),
            r.answers.iter().map(|a| a.3.clone()).collect::<Vec<_>>(),
        )
    };
    let serial_of = |dns: &Dns| -> String {
        let soa = dns.dig(&["cdn.example", "SOA"]);
        soa.answers[0]
            .3
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        txt_of(&dns, "info.cdn.example"),
        ("NOERROR".into(), vec!["\"one\"".to_string()])
    );
    assert_eq!(serial_of(&dns), "10");

    // A new record, the old one gone, the serial forward.
    let second = format!(
        "soa_serial = 11\n{glue}[[records]]\nname = \"news\"\ntype = \"TXT\"\ndata = \"two\"\n"
    );
    std::fs::write(&dns.config, &second).expect("rewrite the config");
    dns.process.send_signal("HUP");
    wait_logged(
        "the front end",
        || dns.log(),
        "SIGHUP: the zone data reloaded",
        1,
    )
    .await;
    assert_eq!(
        txt_of(&dns, "news.cdn.example"),
        ("NOERROR".into(), vec!["\"two\"".to_string()])
    );
    assert_eq!(txt_of(&dns, "info.cdn.example").0, "NXDOMAIN");
    assert_eq!(serial_of(&dns), "11");

    // Records that do not load: kept as they were, the record named in the log.
    let bad = format!(
        "soa_serial = 12\n{glue}{}[[records]]\nname = \"news\"\ntype = \"CNAME\"\ndata = \"x.example.org.\"\n",
        txt("two")
    );
    std::fs::write(
        &dns.config,
        bad.replace("name = \"info\"", "name = \"news\""),
    )
    .expect("rewrite");
    dns.process.send_signal("HUP");
    wait_logged("the front end", || dns.log(), "the one in use is kept", 1).await;
    assert!(
        dns.log().contains(
            "records[2]: news CNAME in zone cdn.example.: a CNAME cannot be beside other data"
        ),
        "{}",
        dns.log()
    );
    assert_eq!(
        txt_of(&dns, "news.cdn.example"),
        ("NOERROR".into(), vec!["\"two\"".to_string()])
    );
    assert_eq!(serial_of(&dns), "11");

    // A serial before the one in use: refused, kept.
    std::fs::write(
        &dns.config,
        second.replace("soa_serial = 11", "soa_serial = 9"),
    )
    .expect("rewrite");
    dns.process.send_signal("HUP");
    wait_logged("the front end", || dns.log(), "the one in use is kept", 2).await;
    assert!(
        dns.log()
            .contains("soa_serial 9 is before the serial in use, 11"),
        "{}",
        dns.log()
    );
    assert_eq!(serial_of(&dns), "11");
    dns.process.assert_running();
}

/// The front end says who it is, as a fleet's operators ask with dig: CHAOS TXT `id.server` and
/// `hostname.bind` answer its configured `name`, and so does NSID (RFC 5001) on an answer from
/// the map (the fast path hands a query with an NSID option to hickory's) and on NXDOMAIN;
/// `version.bind` is REFUSED.
#[tokio::test(flavor = "multi_thread")]
async fn it_says_its_name_by_chaos_and_nsid_and_not_its_version() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, "");
    dns.wait_answering();
    for name in ["id.server", "hostname.bind"] {
        let r = dns.dig(&[name, "CH", "TXT"]);
        assert_eq!(r.status, "NOERROR", "{}", r.raw);
        assert_eq!(r.answers.len(), 1, "{}", r.raw);
        assert_eq!(r.answers[0].3, "\"dns-e2e\"", "{}", r.raw);
        assert!(r.raw.contains("\tCH\tTXT\t"), "{}", r.raw);
    }
    let version = dns.dig(&["version.bind", "CH", "TXT"]);
    assert_eq!(version.status, "REFUSED", "{}", version.raw);
    for name in ["www.cdn.example", "no-such-name.cdn.example"] {
        let r = dns.dig(&["+nsid", name, "A", "+subnet=1.2.3.0/24"]);
        assert!(
            r.raw.contains("NSID: 64 6e 73 2d 65 32 65 (\"dns-e2e\")"),
            "{name}: {}",
            r.raw
        );
        let plain = dns.dig(&[name, "A", "+subnet=1.2.3.0/24"]);
        assert!(!plain.raw.contains("NSID"), "{name}: {}", plain.raw);
    }
}

/// The `key=value` parameters of an HTTPS record's data as dig prints it, by key.
fn svc_params(data: &str) -> std::collections::BTreeMap<String, String> {
    data.split_whitespace()
        .skip(2)
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.to_string(), v.trim_matches('"').to_string()),
            None => (p.to_string(), String::new()),
        })
        .collect()
}

/// HTTPS records at mapped names (RFC 9460) carry as `ipv4hint` and `ipv6hint` the addresses
/// the same client gets for A and AAAA (the same map decision, in the same order), with the
/// same ECS scope, over UDP and TCP; the configured parameters come first, in key order; a
/// name without a binding answers NODATA; a bad binding stops the start naming the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_records_carry_the_maps_addresses_as_hints() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let config = r#"
[[services]]
name = "*.cdn.example."
data = "1 . alpn=h3,h2 port=443"

[[services]]
name = "static.cdn.example."
type = "SVCB"
data = "2 . alpn=h2"
"#;
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, config);
    dns.wait_answering();
    let units = sample_units(&server).await;
    let (mut checked, mut with_v6) = (0, 0);
    for (i, u) in units.iter().enumerate() {
        let qname = qname_of(&u.traffic_class);
        let net: IpNet = u.prefixes[0].parse().expect("a prefix");
        let subnet = format!("+subnet={}/{}", host_in(net), net.prefix_len());
        let tcp = if i % 2 == 0 { "+tcp" } else { "+notcp" };
        let mut attempts = 0;
        loop {
            attempts += 1;
            let a = dns.dig(&[qname, "A", &subnet, tcp]);
            let aaaa = dns.dig(&[qname, "AAAA", &subnet, tcp]);
            let https = dns.dig(&[qname, "HTTPS", &subnet, tcp]);
            assert_eq!(https.status, "NOERROR", "{}", https.raw);
            assert_eq!(https.answers.len(), 1, "{}", https.raw);
            let (_, ttl, rtype, data) = &https.answers[0];
            assert_eq!((rtype.as_str(), *ttl), ("HTTPS", 20), "{}", https.raw);
            assert!(data.starts_with("1 . "), "{data}");
            let params = svc_params(data);
            let keys: Vec<&str> = params.keys().map(String::as_str).collect();
            let hints = |key: &str| -> Vec<String> {
                params
                    .get(key)
                    .map(|v| v.split(',').map(str::to_string).collect())
                    .unwrap_or_default()
            };
            assert_eq!(
                params.get("alpn").map(String::as_str),
                Some("h3,h2"),
                "{data}"
            );
            assert_eq!(
                params.get("port").map(String::as_str),
                Some("443"),
                "{data}"
            );
            let order: Vec<&str> = data
                .split_whitespace()
                .skip(2)
                .map(|p| p.split('=').next().unwrap_or(p))
                .collect();
            let rank = |k: &str| {
                ["alpn", "port", "ipv4hint", "ech", "ipv6hint"]
                    .iter()
                    .position(|x| *x == k)
            };
            assert!(
                order.windows(2).all(|w| rank(w[0]) < rank(w[1])),
                "key order: {data}"
            );
            let same = hints("ipv4hint") == a.addresses()
                && hints("ipv6hint") == aaaa.addresses()
                && https.scope() == a.scope()
                && https.scope() == aaaa.scope();
            if same {
                assert!(!a.addresses().is_empty(), "{}", a.raw);
                assert!(https.scope().is_some(), "{}", https.raw);
                with_v6 += usize::from(keys.contains(&"ipv6hint"));
                break;
            }
            // A round may have moved the unit between the three queries: ask again.
            assert!(
                attempts < 4,
                "unit {}: HTTPS {data} scope {:?}; A {:?} scope {:?}; AAAA {:?} scope {:?}",
                u.id,
                https.scope(),
                a.addresses(),
                a.scope(),
                aaaa.addresses(),
                aaaa.scope()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        checked += 1;
    }
    assert!(checked >= 10, "{checked} units checked");
    assert!(with_v6 > 0, "some unit's answer has IPv6 hints");
    // SVCB: only the name that has one; HTTPS without a binding below another zone's
    // suffix does not exist here, and a static name answers from its records first.
    let svcb = dns.dig(&["www.cdn.example", "SVCB", "+subnet=1.2.3.0/24"]);
    assert_eq!(
        (svcb.status.as_str(), svcb.answers.len()),
        ("NOERROR", 0),
        "NODATA: {}",
        svcb.raw
    );
    let nx = dns.dig(&["no-such-name.cdn.example", "HTTPS"]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.raw);
    drop(dns);

    // A binding that carries its own hints is refused at start, naming the entry.
    let bad = "[[services]]\nname = \"www\"\ndata = \"1 . ipv4hint=192.0.2.1\"\n";
    let path = setup.dir.path().join("bad-services.toml");
    std::fs::write(&path, bad).expect("write the config");
    let out = std::process::Command::new(bin!())
        .args(["dns", "--config"])
        .arg(&path)
        .output()
        .expect("run cdnmap dns");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {err}");
    assert!(
        err.contains("services[0]") && err.contains("come from the map"),
        "{err}"
    );
}
