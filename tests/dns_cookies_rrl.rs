//! End-to-end tests of the DNS front end's server cookies (RFC 7873, RFC 9018) and response
//! rate limiting (issue 44, items 5 and 6), against the real binary and a real mapper, with
//! Debian's `dig` as the client where one can be:
//!
//! - `dig +cookie` learns a server cookie at one front end, and a second front end with the
//!   same `cookie_secret` takes it as valid (it echoes it: a young valid cookie is kept), while
//!   a front end with another secret replaces it; after a rotation (a new secret, the old one as
//!   `cookie_secret_previous`), by a restart or by SIGHUP, the old cookie is still valid; a
//!   malformed cookie is FORMERR;
//! - a flood of queries from many addresses of one /24 (the "victim" a reflection attack would
//!   aim at) gets at most the configured rate of answers a second, the rest dropped but for the
//!   slips (TC=1, or BADCOOKIE to queries with a client cookie), while clients in other /24s get
//!   every answer, a client of the victim's /24 with a valid server cookie gets every answer,
//!   and TCP is never limited; the drops and slips are counted in `/metrics`.
//!
//! Only loopback addresses (127.0.0.0/8) are used; every loop is bounded in count and time.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use cdnmap_tests::bin;
use cdnmap_tests::dns::{dig, metric, metrics_of, Dns};
use cdnmap_tests::mapper::Setup;

const SECRET_A: &str = "e5e973e5a6b2a43f48e7dc849e37bfcf";
const SECRET_B: &str = "445536bcd2513298075a5d379663c962";

/// The COOKIE option of a dig reply, as dig prints it (hex), and whether dig called it good.
fn cookie_of(raw: &str) -> Option<(String, bool)> {
    let line = raw.lines().find_map(|l| l.strip_prefix("; COOKIE: "))?;
    let mut words = line.split_whitespace();
    let hex = words.next()?.to_string();
    Some((hex, words.next() == Some("(good)")))
}

/// `dig +cookie[=sent]` for `www.cdn.example A` at `dns`: the reply's status and cookie.
fn dig_cookie(dns: &Dns, sent: Option<&str>) -> (String, Option<(String, bool)>) {
    let arg = match sent {
        Some(hex) => format!("+cookie={hex}"),
        None => "+cookie".to_string(),
    };
    let r = dns.dig(&[&arg, "www.cdn.example", "A", "+subnet=1.2.3.0/24"]);
    (r.status.clone(), cookie_of(&r.raw))
}

#[tokio::test(flavor = "multi_thread")]
async fn cookies_are_valid_across_the_fleet_and_across_a_rotation() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let dir = setup.dir.path().to_path_buf();
    let shared = format!("cookie_secret = \"{SECRET_A}\"\n");
    let mut one = Dns::start(bin!(), &dir, server.grpc, &shared);
    let mut two = Dns::start(bin!(), &dir, server.grpc, &shared);
    let mut other = Dns::start(bin!(), &dir, server.grpc, "");
    for dns in [&mut one, &mut two, &mut other] {
        dns.wait_answering();
    }
    // A client cookie alone: a server cookie back, the client cookie dig sent in it.
    let (status, cookie) = dig_cookie(&one, None);
    assert_eq!(status, "NOERROR");
    let (learned, good) = cookie.expect("a COOKIE option in the reply");
    assert!(good, "dig: the reply's client cookie is the one sent");
    assert_eq!(learned.len(), 48, "8 + 16 bytes: {learned}");
    assert_eq!(&learned[16..18], "01", "version 1: {learned}");
    // Sent back to the same front end and to the other with the same secret: valid and young,
    // so echoed as it is; a front end of another secret makes a new one.
    for (which, dns) in [("the same front end", &one), ("the second one", &two)] {
        let (status, cookie) = dig_cookie(dns, Some(&learned));
        assert_eq!(status, "NOERROR", "{which}");
        assert_eq!(
            cookie,
            Some((learned.clone(), true)),
            "{which}: valid, kept"
        );
    }
    let (_, cookie) = dig_cookie(&other, Some(&learned));
    let (replaced, good) = cookie.expect("a cookie");
    assert!(good && replaced != learned && replaced[..16] == learned[..16]);
    // Over TCP too.
    let r = two.dig(&[
        "+tcp",
        &format!("+cookie={learned}"),
        "www.cdn.example",
        "A",
    ]);
    assert_eq!(
        cookie_of(&r.raw),
        Some((learned.clone(), true)),
        "{}",
        r.raw
    );
    // Malformed (a client cookie of 7 bytes): FORMERR.
    let r = two.dig(&["+cookie=01020304050607", "www.cdn.example", "A"]);
    assert_eq!(r.status, "FORMERR", "{}", r.raw);
    // Rotation: the second front end restarted with a new secret, the old one as previous.
    drop(two);
    let rotated =
        format!("cookie_secret = \"{SECRET_B}\"\ncookie_secret_previous = \"{SECRET_A}\"\n");
    let mut two = Dns::start(bin!(), &dir, server.grpc, &rotated);
    two.wait_answering();
    let (_, cookie) = dig_cookie(&two, Some(&learned));
    assert_eq!(
        cookie,
        Some((learned.clone(), true)),
        "the old secret's cookie stays valid"
    );
    // Without the old secret it is replaced.
    let mut three = Dns::start(
        bin!(),
        &dir,
        server.grpc,
        &format!("cookie_secret = \"{SECRET_B}\"\n"),
    );
    three.wait_answering();
    let (_, cookie) = dig_cookie(&three, Some(&learned));
    assert_ne!(cookie.map(|c| c.0), Some(learned.clone()));
    // A cookie the rotated front end makes is valid at one made with only the new secret.
    let (_, cookie) = dig_cookie(&two, None);
    let (new, _) = cookie.expect("a cookie");
    let (_, cookie) = dig_cookie(&three, Some(&new));
    assert_eq!(cookie, Some((new.clone(), true)));
    // The same rotation without a restart: SIGHUP after the configuration is rewritten.
    let config = std::fs::read_to_string(&one.config).expect("the config");
    std::fs::write(&one.config, config.replacen(&shared, &rotated, 1)).expect("rewrite it");
    one.process.send_signal("HUP");
    one.wait_logged("cookie secrets replaced (current and previous)", 1);
    let (_, cookie) = dig_cookie(&one, Some(&learned));
    assert_eq!(cookie, Some((learned.clone(), true)), "the old one valid");
    let (_, cookie) = dig_cookie(&one, None);
    let (new, _) = cookie.expect("a cookie");
    let (_, cookie) = dig_cookie(&three, Some(&new));
    assert_eq!(cookie, Some((new, true)), "made with the new secret");
    // A secret that does not load keeps the ones in use.
    std::fs::write(&one.config, config.replacen(SECRET_A, "not hex", 1)).expect("rewrite");
    one.process.send_signal("HUP");
    one.wait_logged("the one in use is kept", 1);
    let (_, cookie) = dig_cookie(&one, Some(&learned));
    assert_eq!(cookie, Some((learned, true)));
}

/// An A query for `www.cdn.example` with id `id`, and an OPT record with a COOKIE option of
/// `cookie` when given.
fn query(id: u16, cookie: Option<&[u8]>) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0, 0, 1, 0, 0, 0, 0, 0, u8::from(cookie.is_some())]);
    for label in ["www", "cdn", "example"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    if let Some(c) = cookie {
        q.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0]);
        q.extend_from_slice(&(4 + c.len() as u16).to_be_bytes());
        q.extend_from_slice(&[0, 10]);
        q.extend_from_slice(&(c.len() as u16).to_be_bytes());
        q.extend_from_slice(c);
    }
    q
}

/// The COOKIE option's data in a response, if any (the response's last option, as the front
/// end writes it).
fn response_cookie(r: &[u8]) -> Option<Vec<u8>> {
    let at = r.windows(4).rposition(|w| w == [0, 10, 0, 24])?;
    r.get(at + 4..at + 28).map(<[u8]>::to_vec)
}

/// What a client's sockets received.
#[derive(Debug, Default, Clone, Copy)]
struct Received {
    answers: u64,
    truncated: u64,
    badcookie: u64,
}

impl Received {
    fn count(&mut self, r: &[u8]) {
        let rcode = r[3] & 0x0f;
        let truncated = r[2] & 0x02 != 0;
        if truncated {
            self.truncated += 1;
        } else if rcode == 23 & 0x0f {
            self.badcookie += 1;
        } else if rcode == 0 && u16::from_be_bytes([r[6], r[7]]) > 0 {
            self.answers += 1;
        }
    }
}

/// A socket bound to `ip` (any port), non-blocking.
fn socket_at(ip: Ipv4Addr) -> UdpSocket {
    let s = UdpSocket::bind((ip, 0)).unwrap_or_else(|e| panic!("bind {ip}: {e}"));
    s.set_nonblocking(true).expect("non-blocking");
    s
}

/// Everything waiting on `sockets`, counted.
fn drain(sockets: &[UdpSocket], into: &mut Received) {
    let mut buf = [0u8; 4096];
    for s in sockets {
        while let Ok(n) = s.recv(&mut buf) {
            if n >= 12 {
                into.count(&buf[..n]);
            }
        }
    }
}

/// One query with `cookie` from `socket` to `to`, its response within 2 s.
fn ask(socket: &UdpSocket, to: SocketAddr, cookie: Option<&[u8]>) -> Option<Vec<u8>> {
    socket.send_to(&query(7, cookie), to).expect("send");
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            return Some(buf[..n].to_vec());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_at_one_prefix_is_limited_while_others_keep_every_answer() {
    const RATE: u64 = 40;
    const VICTIM_SOCKETS: u8 = 40;
    const FLOOD: u64 = 6_000;
    const FLOOD_FOR: Duration = Duration::from_secs(3);
    const OTHERS: u8 = 8;
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let config = format!(
        "rrl_responses_per_sec = {RATE}\nrrl_window_secs = 2\nrrl_slip = 2\nmetrics_listen = \"127.0.0.1:0\"\nudp_threads = 2\n"
    );
    let mut dns = Dns::start(bin!(), setup.dir.path(), server.grpc, &config);
    dns.wait_answering();
    let addr = dns.addr;
    // The wait dig's queries may have put the 127.0.0.0/24 account into is over.
    std::thread::sleep(Duration::from_secs(3));
    let (victim, others, exempt, before) = tokio::task::spawn_blocking(move || {
        // A client of the victim's /24 learns a server cookie before the flood.
        let exempt_socket = socket_at(Ipv4Addr::new(127, 0, 0, 250));
        let cc = [7u8; 8];
        let first = ask(&exempt_socket, addr, Some(&cc)).expect("an answer before the flood");
        let cookie = response_cookie(&first).expect("a server cookie");
        let victim: Vec<UdpSocket> = (0..VICTIM_SOCKETS)
            .map(|i| socket_at(Ipv4Addr::new(127, 0, 0, 10 + i)))
            .collect();
        let others: Vec<UdpSocket> = (1..=OTHERS)
            .map(|i| socket_at(Ipv4Addr::new(127, i, i, 1)))
            .collect();
        let (mut got, mut other_got, mut exempt_got) = (
            Received::default(),
            Received::default(),
            Received::default(),
        );
        let (mut other_sent, mut exempt_sent) = (0u64, 0u64);
        let start = Instant::now();
        let cc2 = [9u8; 8];
        for i in 0..FLOOD {
            // On a schedule: FLOOD queries spread over FLOOD_FOR.
            let due = FLOOD_FOR.mul_f64(i as f64 / FLOOD as f64);
            while start.elapsed() < due {
                std::hint::spin_loop();
            }
            // One in three with a client cookie (no server cookie): their slips are BADCOOKIE.
            let c = (i % 3 == 0).then_some(&cc2[..]);
            let s = &victim[(i % u64::from(VICTIM_SOCKETS)) as usize];
            let _ = s.send_to(&query(i as u16, c), addr);
            // Every 100th: a query from each other /24 (their own rate far below the limit)
            // and one from the exempt client with its full cookie.
            if i % 100 == 0 {
                for o in &others {
                    let _ = o.send_to(&query(i as u16, None), addr);
                    other_sent += 1;
                }
                let _ = exempt_socket.send_to(&query(i as u16, Some(&cookie)), addr);
                exempt_sent += 1;
            }
            if i % 16 == 0 {
                drain(&victim, &mut got);
                drain(&others, &mut other_got);
                drain(std::slice::from_ref(&exempt_socket), &mut exempt_got);
            }
        }
        let elapsed = start.elapsed();
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            drain(&victim, &mut got);
            drain(&others, &mut other_got);
            drain(std::slice::from_ref(&exempt_socket), &mut exempt_got);
            std::thread::sleep(Duration::from_millis(10));
        }
        (
            (got, elapsed),
            (other_got, other_sent),
            (exempt_got, exempt_sent),
            first,
        )
    })
    .await
    .expect("the client thread");
    let ((got, elapsed), (other_got, other_sent), (exempt_got, exempt_sent)) =
        (victim, others, exempt);
    assert!(before.len() > 12);
    eprintln!(
        "victim: {FLOOD} queries in {elapsed:?}: {got:?}; others: {other_got:?} of {other_sent}; \
         exempt: {exempt_got:?} of {exempt_sent}"
    );
    // The victim's answers: at most the rate for each second begun (the account starts full),
    // the first second's at least.
    let seconds = elapsed.as_secs() + 2;
    assert!(
        got.answers <= RATE * seconds,
        "{got:?} in {elapsed:?}: more answers than {RATE} a second"
    );
    assert!(got.answers >= RATE / 2, "{got:?}: the limit's answers");
    // Of the limited (nearly all), every second one slipped: TC=1, BADCOOKIE for those with a
    // client cookie (a third of the queries; which are slipped depends on the order the two
    // UDP threads take them in).
    let limited = FLOOD - got.answers;
    let slips = got.truncated + got.badcookie;
    assert!(
        slips * 10 >= limited * 4 && slips * 10 <= limited * 6,
        "{got:?}: about half of {limited} limited responses slipped"
    );
    assert!(
        got.badcookie * 100 >= slips * 15 && got.badcookie * 100 <= slips * 50,
        "{got:?}: about a third of the slips BADCOOKIE"
    );
    // The others, and the exempt client of the victim's /24: every answer.
    assert_eq!(other_got.answers, other_sent, "{other_got:?}");
    assert_eq!(exempt_got.answers, exempt_sent, "{exempt_got:?}");
    // Counted: every slip sent, and the drops.
    let body = metrics_of(&dns);
    let slipped = metric(&body, "cdnmap_dns_rrl_slipped_total").unwrap_or(0.0);
    let dropped = metric(&body, "cdnmap_dns_rrl_dropped_total").unwrap_or(0.0);
    assert!(
        slipped >= slips as f64,
        "{slipped} slips counted, {slips} received"
    );
    assert!(
        dropped + slipped >= limited as f64 * 0.95,
        "{dropped} dropped and {slipped} slipped of {limited} limited"
    );
    // TCP is not limited: a victim address asks over TCP and is answered.
    let r = dig(addr, &["-b", "127.0.0.77", "+tcp", "www.cdn.example", "A"]);
    assert_eq!(r.status, "NOERROR", "{}", r.raw);
    assert!(!r.addresses().is_empty(), "{}", r.raw);
}
