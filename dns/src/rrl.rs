//! Response rate limiting (RRL), as BIND and Knot do it: an authoritative server answers
//! whoever a datagram's source address names, so a forged source turns it into a reflector
//! that sends its answers, larger than the queries, at a victim. Responses to one client prefix
//! are limited per second and per response kind; what is over the limit is dropped, but every
//! `slip`-th one is sent as a small truncated response (TC=1, no answer: a real client asks
//! again over TCP, which a forged source cannot) or, to a query with a DNS cookie, as BADCOOKIE
//! with a server cookie (the client asks again with it and is then not limited: RFC 7873 §5.2.3,
//! as BIND does).
//!
//! **What is counted together** (an account): responses to one client prefix
//! (`rrl_ipv4_prefix`, default /24; `rrl_ipv6_prefix`, default /56) of one kind: answers and
//! NODATA each by query name and type (a flood of one name does not limit another), NXDOMAIN
//! for all names (a flood of random names is one account), errors (REFUSED, FORMERR, SERVFAIL,
//! …) for all names.
//!
//! **The account** is BIND's: a balance credited `rrl_responses_per_sec` a second (up to that
//! many), debited one a response; a response that leaves it below zero is limited. The balance
//! goes into debt down to `rrl_window_secs` seconds' worth of responses (at most 524,287), so a
//! prefix that keeps sending faster than the limit gets nothing but slips until it has kept
//! under it for about that long.
//!
//! **Exempt**: queries with a valid server cookie (their source is real: `crate::cookie`), and
//! TCP (the UDP loop applies this; TCP's answers never pass through it).
//!
//! **Bounded**: a fixed table of [`SETS`] × [`WAYS`] accounts of 8 bytes (512 KiB), each an
//! atomic word updated by compare-and-swap, so the limit is one for the whole server, whichever
//! UDP thread answers, with no lock and no allocation per query. An account is found by a keyed
//! hash (a secret of the process, so clients cannot aim collisions) in its set of 8; a new one
//! takes the place of the one idle longest. A flood from more distinct accounts than a set holds
//! evicts idle accounts first, then the least recently limited: such an account starts again with
//! a full balance, which lets through at most one second's worth more.
//!
//! Time is passed in (whole seconds), as BIND counts it.

use std::hash::Hasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip::SipHasher13;

use crate::cookie::{Checked, Cookies, OPTION_COOKIE, REPLY_LEN};

/// Sets of accounts.
pub const SETS: usize = 8192;
/// Accounts a set holds: eight 8-byte words, one cache line.
pub const WAYS: usize = 8;
/// The deepest debt an account can hold (a 20-bit balance).
pub const MAX_DEBT: i64 = (1 << 19) - 1;
/// Bounds of the configuration's values.
pub const RESPONSES_PER_SEC: std::ops::RangeInclusive<u32> = 0..=100_000;
pub const WINDOW_SECS: std::ops::RangeInclusive<u32> = 1..=3600;
pub const SLIP: std::ops::RangeInclusive<u32> = 0..=10;
pub const IPV4_PREFIX: std::ops::RangeInclusive<u8> = 8..=32;
pub const IPV6_PREFIX: std::ops::RangeInclusive<u8> = 16..=128;

/// The limits (`rrl_*` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RrlConfig {
    /// Responses a second an account may get (0: no rate limiting).
    pub responses_per_sec: u32,
    /// Seconds of responses an account may owe.
    pub window_secs: u32,
    /// Every this many limited responses one is slipped (0: none, 1: every one).
    pub slip: u32,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
}

impl Default for RrlConfig {
    /// BIND's defaults but the rate, which is off (`docs/dns.md`, "Response rate limiting").
    fn default() -> RrlConfig {
        RrlConfig {
            responses_per_sec: 0,
            window_secs: 15,
            slip: 2,
            ipv4_prefix: 24,
            ipv6_prefix: 56,
        }
    }
}

/// What a response is, for its account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Answer,
    NoData,
    NxDomain,
    Error,
}

/// What to do with a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Send,
    Drop,
    Slip,
}

/// The accounts (module docs).
pub struct Rrl {
    config: RrlConfig,
    /// The key of the accounts' hash.
    key: [u8; 16],
    slots: Box<[AtomicU64]>,
    dropped: metrics::Counter,
    slipped: metrics::Counter,
}

/// The counters of limited responses, at 0 from the start.
pub fn register_counters() {
    for name in [
        "cdnmap_dns_rrl_dropped_total",
        "cdnmap_dns_rrl_slipped_total",
    ] {
        metrics::counter!(name).increment(0);
    }
}

/// An account's word: tag (16 bits, never 0 in a used slot), second (20 bits, wrapping), balance
/// (20 bits, two's complement), slip count (8 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Account {
    tag: u16,
    second: u32,
    balance: i64,
    slips: u8,
}

const SECOND_MASK: u32 = (1 << 20) - 1;

impl Account {
    fn unpack(w: u64) -> Account {
        let raw = ((w >> 8) & 0xF_FFFF) as i64;
        Account {
            tag: (w >> 48) as u16,
            second: ((w >> 28) as u32) & SECOND_MASK,
            balance: if raw >= 1 << 19 { raw - (1 << 20) } else { raw },
            slips: w as u8,
        }
    }

    fn pack(self) -> u64 {
        (u64::from(self.tag) << 48)
            | (u64::from(self.second & SECOND_MASK) << 28)
            | (((self.balance as u64) & 0xF_FFFF) << 8)
            | u64::from(self.slips)
    }

    /// Seconds since the account was last debited, at `now` (20 bits of it: an account idle
    /// for 12 days may look recent, and then owes what it owed).
    fn idle(self, now: u32) -> u32 {
        (now & SECOND_MASK).wrapping_sub(self.second) & SECOND_MASK
    }
}

impl Rrl {
    /// The accounts for `config`, hashed with `key`; `None` when it limits nothing (a rate of 0).
    pub fn new(config: RrlConfig, key: [u8; 16]) -> Option<Rrl> {
        if config.responses_per_sec == 0 {
            return None;
        }
        Some(Rrl {
            config,
            key,
            slots: (0..SETS * WAYS).map(|_| AtomicU64::new(0)).collect(),
            dropped: metrics::counter!("cdnmap_dns_rrl_dropped_total"),
            slipped: metrics::counter!("cdnmap_dns_rrl_slipped_total"),
        })
    }

    pub fn config(&self) -> &RrlConfig {
        &self.config
    }

    /// Debits the account hashed `h` one response at `now` (seconds): whether it is sent,
    /// dropped or slipped.
    pub fn debit(&self, h: u64, now: u32) -> Action {
        let set = &self.slots[(h as usize % SETS) * WAYS..][..WAYS];
        let tag = ((h >> 48) as u16).max(1);
        // A few tries when another thread changed the set meanwhile; then let it through.
        for _ in 0..4 {
            let (slot, old) = self.find(set, tag, now);
            let before = match Account::unpack(old) {
                a if a.tag == tag => a,
                _ => Account {
                    tag,
                    second: now & SECOND_MASK,
                    balance: i64::from(self.config.responses_per_sec),
                    slips: 0,
                },
            };
            let (after, action) = self.step(before, now);
            if set[slot]
                .compare_exchange(old, after.pack(), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return action;
            }
        }
        Action::Send
    }

    /// The slot of `tag` in `set` and its word, else the slot to take for it: an empty one, else
    /// the one idle longest.
    fn find(&self, set: &[AtomicU64], tag: u16, now: u32) -> (usize, u64) {
        let mut victim = (0, 0, 0u32);
        for (i, slot) in set.iter().enumerate() {
            let w = slot.load(Ordering::Relaxed);
            let a = Account::unpack(w);
            if w != 0 && a.tag == tag {
                return (i, w);
            }
            let idle = if w == 0 { u32::MAX } else { a.idle(now) };
            if i == 0 || idle > victim.2 {
                victim = (i, w, idle);
            }
        }
        (victim.0, victim.1)
    }

    /// The account after one more response at `now`, and what happens to that response.
    fn step(&self, mut a: Account, now: u32) -> (Account, Action) {
        let rate = i64::from(self.config.responses_per_sec);
        let floor = -(rate * i64::from(self.config.window_secs)).min(MAX_DEBT);
        let credit = i64::from(a.idle(now)) * rate;
        a.balance = (a.balance + credit).min(rate) - 1;
        a.second = now & SECOND_MASK;
        if a.balance >= 0 {
            return (a, Action::Send);
        }
        a.balance = a.balance.max(floor);
        let slip = self.config.slip;
        if slip == 0 {
            return (a, Action::Drop);
        }
        a.slips = a.slips.saturating_add(1);
        if u32::from(a.slips) >= slip {
            a.slips = 0;
            return (a, Action::Slip);
        }
        (a, Action::Drop)
    }

    /// The account of a response of `kind` to `client`, for the question `question` (the
    /// name as on the wire, then type and class; empty when the query has none).
    pub fn account(&self, client: IpAddr, kind: Kind, question: &[u8]) -> u64 {
        let mut h = SipHasher13::new_with_key(&self.key);
        h.write_u8(kind as u8);
        match client.to_canonical() {
            IpAddr::V4(a) => {
                let bits = u32::from(a) & mask32(self.config.ipv4_prefix);
                h.write_u8(4);
                h.write(&bits.to_be_bytes());
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a) & mask128(self.config.ipv6_prefix);
                h.write_u8(6);
                h.write(&bits.to_be_bytes());
            }
        }
        if matches!(kind, Kind::Answer | Kind::NoData) {
            // The name in lower case, and the type (not the class: what BIND keys by).
            let mut name = [0u8; 256];
            let n = question.len().saturating_sub(4).min(name.len());
            for (d, s) in name.iter_mut().zip(&question[..n]) {
                *d = s.to_ascii_lowercase();
            }
            h.write(&name[..n]);
            h.write(question.get(n..n + 2).unwrap_or_default());
        }
        h.finish()
    }

    /// Applies the limit to `response`, the UDP answer to `query` from `src`, at `now` (Unix
    /// seconds, as cookies are dated: [`Cookies::now`]): left as
    /// it is, emptied (dropped: nothing is sent) or replaced by a slip (module docs).
    /// `max_udp_payload` is the OPT payload size a BADCOOKIE slip announces.
    pub fn apply(
        &self,
        cookies: &Cookies,
        query: &[u8],
        src: SocketAddr,
        response: &mut Vec<u8>,
        now: u32,
        max_udp_payload: u16,
    ) {
        if response.len() < 12 {
            return;
        }
        let cookie = crate::cookie::in_query(query).map(|data| cookies.check(data, src.ip(), now));
        if cookie.is_some_and(|c| c.valid()) {
            return; // a valid server cookie: the source is real
        }
        let question = question(query);
        let kind = kind_of(response);
        match self.debit(self.account(src.ip(), kind, question), now) {
            Action::Send => {}
            Action::Drop => {
                response.clear();
                self.dropped.increment(1);
            }
            Action::Slip => {
                let cookie = match cookie {
                    Some(Checked::Good { reply, .. }) => Some(reply),
                    _ => None,
                };
                slip(query, question, cookie, max_udp_payload, response);
                self.slipped.increment(1);
            }
        }
    }
}

/// The network mask of an IPv4 prefix of `len` bits.
fn mask32(len: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(len.min(32)))
        .unwrap_or(0)
}

/// The network mask of an IPv6 prefix of `len` bits.
fn mask128(len: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(len.min(128)))
        .unwrap_or(0)
}

/// A response's kind, from its header: the RCODE, and for NOERROR whether it answers.
pub fn kind_of(response: &[u8]) -> Kind {
    let answers = u16::from_be_bytes([response[6], response[7]]);
    match response[3] & 0x0f {
        0 if answers > 0 => Kind::Answer,
        0 => Kind::NoData,
        3 => Kind::NxDomain,
        _ => Kind::Error,
    }
}

/// The first question of `query` as sent (name, type, class), empty when it has none or it
/// cannot be read (a name that is compressed or runs past the end).
pub fn question(query: &[u8]) -> &[u8] {
    if query.len() < 12 || query[4..6] == [0, 0] {
        return &[];
    }
    let mut at = 12;
    while let Some(&len) = query.get(at) {
        match len {
            0 => return query.get(12..at + 5).unwrap_or_default(),
            l if l & 0xc0 != 0 => return &[],
            l => at += 1 + usize::from(l),
        }
    }
    &[]
}

/// The slip for `query` into `out`: its id, opcode, RD and CD, its question; with a client
/// cookie, BADCOOKIE (RCODE 23) with the cookie option `cookie` in an OPT record; else TC=1.
fn slip(
    query: &[u8],
    question: &[u8],
    cookie: Option<[u8; REPLY_LEN]>,
    max_udp_payload: u16,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(&query[..2]);
    let tc = if cookie.is_some() { 0 } else { 0x02 };
    out.push(0x80 | (query[2] & 0x79) | tc); // QR, opcode, RD; TC
    let rcode = if cookie.is_some() { 23 & 0x0f } else { 0 };
    out.push((query[3] & 0x10) | rcode); // CD; the RCODE's low bits
    let counts = [
        u16::from(!question.is_empty()),
        0,
        0,
        u16::from(cookie.is_some()),
    ];
    for c in counts {
        out.extend_from_slice(&c.to_be_bytes());
    }
    out.extend_from_slice(question);
    if let Some(cookie) = cookie {
        out.push(0); // the root
        out.extend_from_slice(&41u16.to_be_bytes());
        out.extend_from_slice(&max_udp_payload.to_be_bytes());
        out.extend_from_slice(&[23 >> 4, 0, 0, 0]); // the RCODE's high bits, version 0
        out.extend_from_slice(&(4 + REPLY_LEN as u16).to_be_bytes());
        out.extend_from_slice(&OPTION_COOKIE.to_be_bytes());
        out.extend_from_slice(&(REPLY_LEN as u16).to_be_bytes());
        out.extend_from_slice(&cookie);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rrl(rate: u32, window: u32, slip: u32) -> Rrl {
        let config = RrlConfig {
            responses_per_sec: rate,
            window_secs: window,
            slip,
            ..RrlConfig::default()
        };
        Rrl::new(config, [3; 16]).expect("on")
    }

    fn count(actions: impl IntoIterator<Item = Action>) -> [usize; 3] {
        let mut n = [0; 3];
        for a in actions {
            n[a as usize] += 1;
        }
        n
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    const Q: &[u8] = b"\x03www\x03cdn\x07example\x00\x00\x01\x00\x01";

    /// Within a second an account gets its rate; beyond it every `slip`-th response slips and
    /// the others are dropped; while it keeps exceeding the rate it stays in debt, and after
    /// `window` quiet seconds it has its rate again.
    #[test]
    fn an_account_gets_its_rate_then_slips_and_drops() {
        let r = rrl(5, 3, 2);
        let h = r.account(ip("192.0.2.1"), Kind::Answer, Q);
        let t = 1_000_000;
        assert_eq!(count((0..100).map(|_| r.debit(h, t))), [5, 48, 47]);
        // The next second: still in debt (it sent 20 times its rate).
        assert_eq!(count((0..10).map(|_| r.debit(h, t + 1))), [0, 5, 5]);
        // Quiet for the window (its debt is 3 s of responses): its rate again, not more.
        // (The slip count goes on from where it was.)
        assert_eq!(count((0..10).map(|_| r.debit(h, t + 5))), [5, 2, 3]);
        // slip 0 drops all; 1 slips all.
        for (slip, want) in [(0, [5, 95, 0]), (1, [5, 0, 95])] {
            let r = rrl(5, 3, slip);
            let h = r.account(ip("192.0.2.1"), Kind::Answer, Q);
            assert_eq!(count((0..100).map(|_| r.debit(h, t))), want, "slip {slip}");
        }
    }

    /// One account per client prefix (/24, /56), kind, and for answers the name and type (any
    /// case); NXDOMAIN and errors of one prefix are one account whatever the name.
    #[test]
    fn accounts_are_by_prefix_kind_and_name() {
        let r = rrl(1, 1, 0);
        let a = |client: &str, kind, q: &[u8]| r.account(ip(client), kind, q);
        let other_name = b"\x03WwW\x03cdn\x07example\x00\x00\x01\x00\x01";
        assert_eq!(
            a("192.0.2.1", Kind::Answer, Q),
            a("192.0.2.200", Kind::Answer, Q)
        );
        assert_eq!(
            a("192.0.2.1", Kind::Answer, Q),
            a("::ffff:192.0.2.9", Kind::Answer, Q)
        );
        assert_eq!(
            a("192.0.2.1", Kind::Answer, Q),
            a("192.0.2.1", Kind::Answer, other_name)
        );
        assert_ne!(
            a("192.0.2.1", Kind::Answer, Q),
            a("192.0.3.1", Kind::Answer, Q)
        );
        assert_ne!(
            a("192.0.2.1", Kind::Answer, Q),
            a("192.0.2.1", Kind::NoData, Q)
        );
        let aaaa = b"\x03www\x03cdn\x07example\x00\x00\x1c\x00\x01";
        assert_ne!(
            a("192.0.2.1", Kind::Answer, Q),
            a("192.0.2.1", Kind::Answer, aaaa)
        );
        let nx1 = b"\x02r1\x03cdn\x07example\x00\x00\x01\x00\x01";
        let nx2 = b"\x02r2\x03cdn\x07example\x00\x00\x01\x00\x01";
        assert_eq!(
            a("192.0.2.1", Kind::NxDomain, nx1),
            a("192.0.2.1", Kind::NxDomain, nx2)
        );
        assert_eq!(
            a("192.0.2.1", Kind::Error, nx1),
            a("192.0.2.7", Kind::Error, &[])
        );
        assert_ne!(
            a("192.0.2.1", Kind::NxDomain, nx1),
            a("192.0.2.1", Kind::Error, nx1)
        );
        assert_eq!(
            a("2001:db8:0:ff::1", Kind::Answer, Q),
            a("2001:db8:0:1::2", Kind::Answer, Q)
        );
        assert_ne!(
            a("2001:db8:0:ff::1", Kind::Answer, Q),
            a("2001:db8:0:100::1", Kind::Answer, Q)
        );
        // Limiting one account leaves another be.
        let t = 77;
        let (x, y) = (
            a("192.0.2.1", Kind::Answer, Q),
            a("198.51.100.1", Kind::Answer, Q),
        );
        assert_eq!(count((0..10).map(|_| r.debit(x, t))), [1, 9, 0]);
        assert_eq!(r.debit(y, t), Action::Send);
    }

    /// The limit is one for the server: four threads debiting one account at once send its
    /// rate, not four times it.
    #[test]
    fn the_limit_holds_across_threads() {
        let r = rrl(100, 1, 0);
        let h = r.account(ip("192.0.2.1"), Kind::Answer, Q);
        let sent: usize = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).filter(|_| r.debit(h, 5) == Action::Send).count()))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a thread"))
                .sum()
        });
        // A debit that lost its race four times is let through: a handful at most.
        assert!((100..=110).contains(&sent), "{sent}");
    }

    /// The table is fixed: a new account takes the place of the one idle longest in its set,
    /// so an account being limited keeps its place (and its debt) against new ones.
    #[test]
    fn the_table_is_bounded_and_evicts_the_idle() {
        let r = rrl(2, 10, 0);
        assert_eq!(r.slots.len(), SETS * WAYS);
        let key = |tag: u64| (tag << 48) | 5; // set 5
        let victim = key(1000);
        for tag in 1..WAYS as u64 {
            assert_eq!(r.debit(key(tag), 10), Action::Send);
        }
        assert_eq!(count((0..10).map(|_| r.debit(victim, 20))), [2, 8, 0]);
        // The set is full: each new account takes an idle one's place, not the victim's.
        for tag in 2000..2000 + WAYS as u64 - 1 {
            assert_eq!(r.debit(key(tag), 21), Action::Send);
        }
        assert_eq!(r.debit(victim, 21), Action::Drop, "still in debt");
        // The first of the seven idle since 10 was evicted: it starts again with a full balance.
        assert_eq!(count((0..3).map(|_| r.debit(key(1), 22))), [2, 1, 0]);
    }

    #[test]
    fn words_pack_and_unpack() {
        for a in [
            Account {
                tag: 1,
                second: 0,
                balance: 0,
                slips: 0,
            },
            Account {
                tag: u16::MAX,
                second: SECOND_MASK,
                balance: -MAX_DEBT,
                slips: 255,
            },
            Account {
                tag: 77,
                second: 12345,
                balance: 100_000,
                slips: 3,
            },
        ] {
            assert_eq!(Account::unpack(a.pack()), a);
        }
    }

    /// A slip is the query's id and question with TC=1, or BADCOOKIE with the cookie when the
    /// query had one; the kinds are read off the response's header.
    #[test]
    fn slips_and_kinds() {
        let mut query = vec![0xab, 0xcd, 0x01, 0x10, 0, 1, 0, 0, 0, 0, 0, 0];
        query.extend_from_slice(Q);
        let mut out = Vec::new();
        slip(&query, question(&query), None, 1232, &mut out);
        assert_eq!(out[..4], [0xab, 0xcd, 0x83, 0x10]);
        assert_eq!(out[4..12], [0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&out[12..], Q);
        slip(&query, question(&query), Some([5; 24]), 1232, &mut out);
        let m = hickory_server::proto::op::Message::from_vec(&out).expect("readable");
        assert_eq!(
            m.metadata.response_code,
            hickory_server::proto::op::ResponseCode::BADCOOKIE
        );
        assert!(!m.metadata.truncation);
        let edns = m.edns.as_ref().expect("an OPT record");
        let cookie = edns.option(hickory_server::proto::rr::rdata::opt::EdnsCode::Cookie);
        assert_eq!(
            cookie,
            Some(&hickory_server::proto::rr::rdata::opt::EdnsOption::Unknown(
                10,
                vec![5; 24]
            ))
        );
        let header = |rcode: u8, answers: u8| [0, 0, 0x84, rcode, 0, 1, 0, answers, 0, 0, 0, 0];
        assert_eq!(kind_of(&header(0, 1)), Kind::Answer);
        assert_eq!(kind_of(&header(0, 0)), Kind::NoData);
        assert_eq!(kind_of(&header(3, 0)), Kind::NxDomain);
        assert_eq!(kind_of(&header(5, 0)), Kind::Error);
        assert_eq!(question(&query[..20]), b"");
    }
}
