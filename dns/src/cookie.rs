//! DNS cookies (RFC 7873): server cookies made as RFC 9018 makes them, so that every front end
//! of a fleet configured with the same secret makes and accepts the same cookies.
//!
//! **The server cookie** is 16 bytes: version 1, three reserved bytes (0), a timestamp (Unix
//! seconds, 32 bits, RFC 1982 arithmetic) and 8 bytes of SipHash-2-4, keyed with a 16-byte
//! secret, over the client cookie, the version, the reserved bytes, the timestamp and the
//! client's address (4 or 16 bytes). A server cookie is valid when it is 16 bytes of version 1,
//! its timestamp at most an hour old and at most five minutes ahead, and its hash is the one the
//! current secret or the previous one (`cookie_secret_previous`: accepted during a rotation,
//! never used to make cookies) gives.
//!
//! **What a query's COOKIE option gets** (RFC 7873 §5.2, RFC 9018 §4.3), decided by
//! [`Cookies::check`]: a malformed option (a client cookie other than 8 bytes, a server cookie
//! other than 8 to 32 bytes) is FORMERR; a client cookie alone, or with a server cookie that is
//! not valid, gets a normal answer with a new server cookie (§5.2.3: a server may answer
//! normally; BADCOOKIE is sent only where response rate limiting would otherwise drop or
//! truncate, `crate::rrl`); a valid one gets its answer with the same server cookie, or a new
//! one when it is older than half an hour. A query with a valid server cookie comes from the
//! address it claims, so response rate limiting leaves it alone.
//!
//! Everything here is pure: the time is passed in ([`Cookies::now`] reads it, or the fixed time
//! tests give).

use std::hash::Hasher;
use std::net::IpAddr;

use siphasher::sip::SipHasher24;

/// The COOKIE option's code (RFC 7873 §4).
pub const OPTION_COOKIE: u16 = 10;
/// A client cookie's length.
pub const CLIENT_LEN: usize = 8;
/// The server cookies made here (RFC 9018 §4).
pub const SERVER_LEN: usize = 16;
/// The option data a response carries: the client cookie and a server cookie.
pub const REPLY_LEN: usize = CLIENT_LEN + SERVER_LEN;
/// The server cookie's version (RFC 9018 §4.1).
const VERSION: u8 = 1;
/// A valid server cookie older than this is replaced by a new one (RFC 9018 §4.3).
pub const RENEW_AFTER_SECS: i64 = 1800;
/// A server cookie older than this is not valid (RFC 9018 §4.3).
pub const MAX_AGE_SECS: i64 = 3600;
/// Nor one whose timestamp is further ahead than this (RFC 9018 §4.3: clock skew).
pub const MAX_AHEAD_SECS: i64 = 300;

/// A secret of RFC 9018's SipHash-2-4: 16 bytes.
pub type Secret = [u8; 16];

/// The secrets server cookies are made and checked with, and the clock they are dated by.
/// Clones share the secrets, which [`Cookies::replace`] swaps for every clone at once (SIGHUP:
/// a rotation without a restart).
#[derive(Clone)]
pub struct Cookies {
    secrets: std::sync::Arc<arc_swap::ArcSwap<Secrets>>,
    /// `None`: the system clock; `Some`: a fixed time (tests: deterministic bytes).
    fixed_now: Option<u32>,
}

/// The secret cookies are made with and the one before it, still accepted.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Secrets {
    current: Secret,
    previous: Option<Secret>,
    /// Whether `current` was configured (else it is this process's random one).
    configured: bool,
}

impl std::fmt::Debug for Cookies {
    /// Never the secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secrets = self.secrets.load();
        f.debug_struct("Cookies")
            .field("configured", &secrets.configured)
            .field("previous", &secrets.previous.is_some())
            .field("fixed_now", &self.fixed_now)
            .finish_non_exhaustive()
    }
}

/// What a query's COOKIE option gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Not a client cookie of 8 bytes followed by nothing or a server cookie of 8 to 32: FORMERR
    /// (RFC 7873 §5.2.2).
    Malformed,
    /// A well-formed option: the option data to answer with (the client cookie and our server
    /// cookie), and whether the query's server cookie was valid.
    Good { reply: [u8; REPLY_LEN], valid: bool },
}

impl Checked {
    /// Whether the query carried a valid server cookie.
    pub fn valid(&self) -> bool {
        matches!(self, Checked::Good { valid: true, .. })
    }
}

impl Cookies {
    /// Cookies made with `current` and checked with it and `previous`, dated by the system
    /// clock.
    pub fn new(current: Secret, previous: Option<Secret>) -> Cookies {
        Cookies::of(Secrets {
            current,
            previous,
            configured: true,
        })
    }

    /// Cookies with a random secret (no `cookie_secret` configured): they work with this
    /// process only.
    pub fn random() -> Cookies {
        Cookies::of(Secrets {
            current: rand::random(),
            previous: None,
            configured: false,
        })
    }

    fn of(secrets: Secrets) -> Cookies {
        Cookies {
            secrets: std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(secrets)),
            fixed_now: None,
        }
    }

    /// Makes cookies with the secrets `next` holds from now on, for every clone (a
    /// configuration read again). Without a configured secret the process keeps its random
    /// one, or, when a configured one is dropped, makes a new random one and still accepts the
    /// dropped one's cookies as the previous secret's. Says what changed.
    pub fn replace(&self, next: Option<&Cookies>) -> &'static str {
        let now = **self.secrets.load();
        let secrets = match next {
            Some(next) => **next.secrets.load(),
            None if !now.configured => return "cookie secret unchanged (this process's own)",
            None => Secrets {
                current: rand::random(),
                previous: Some(now.current),
                configured: false,
            },
        };
        if secrets == now {
            return "cookie secrets unchanged";
        }
        self.secrets.store(std::sync::Arc::new(secrets));
        match (secrets.configured, secrets.previous.is_some()) {
            (true, true) => "cookie secrets replaced (current and previous)",
            (true, false) => "cookie secret replaced",
            (false, _) => "cookie secret dropped: cookies made with a random secret of this process, the dropped one's still valid",
        }
    }

    /// [`Cookies::new`] dated `now` whatever the clock says (tests: the same bytes every run).
    pub fn at_fixed_time(current: Secret, previous: Option<Secret>, now: u32) -> Cookies {
        Cookies {
            fixed_now: Some(now),
            ..Cookies::new(current, previous)
        }
    }

    /// The time cookies are dated and checked by: Unix seconds (32 bits, wrapping in 2106, as
    /// RFC 9018's timestamp does).
    pub fn now(&self) -> u32 {
        self.fixed_now.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as u32)
        })
    }

    /// What the COOKIE option `option` (its data) of a query from `client` gets at `now`
    /// (module docs).
    pub fn check(&self, option: &[u8], client: IpAddr, now: u32) -> Checked {
        let Some((cc, server)) = option.split_first_chunk::<CLIENT_LEN>() else {
            return Checked::Malformed;
        };
        if !(server.is_empty() || (8..=32).contains(&server.len())) {
            return Checked::Malformed;
        }
        let mut reply = [0u8; REPLY_LEN];
        reply[..CLIENT_LEN].copy_from_slice(cc);
        let secrets = self.secrets.load();
        let age = secrets.valid_age(cc, server, client, now);
        match age {
            Some(age) if age <= RENEW_AFTER_SECS => reply[CLIENT_LEN..].copy_from_slice(server),
            _ => reply[CLIENT_LEN..].copy_from_slice(&server_cookie(
                &secrets.current,
                cc,
                client,
                now,
            )),
        }
        Checked::Good {
            reply,
            valid: age.is_some(),
        }
    }
}

impl Secrets {
    /// The age of `server` at `now` when it is a valid server cookie for client cookie `cc`
    /// from `client` (module docs).
    fn valid_age(
        &self,
        cc: &[u8; CLIENT_LEN],
        server: &[u8],
        client: IpAddr,
        now: u32,
    ) -> Option<i64> {
        let server: &[u8; SERVER_LEN] = server.try_into().ok()?;
        if server[0] != VERSION {
            return None;
        }
        let stamp = u32::from_be_bytes([server[4], server[5], server[6], server[7]]);
        let age = i64::from(now.wrapping_sub(stamp) as i32);
        if !(-MAX_AHEAD_SECS..=MAX_AGE_SECS).contains(&age) {
            return None;
        }
        let head: &[u8; 8] = server[..8].try_into().ok()?;
        let matches = |secret: &Secret| same(&hash(secret, cc, head, client), &server[8..]);
        (matches(&self.current) || self.previous.as_ref().is_some_and(matches)).then_some(age)
    }
}

/// The data of the first COOKIE option in `query`'s OPT record, if the message can be walked
/// to it (each step bounded by the message's length).
pub fn in_query(query: &[u8]) -> Option<&[u8]> {
    let mut found = None;
    crate::walk::each_option(query, |code, data| {
        if code == OPTION_COOKIE && found.is_none() {
            found = Some(data);
        }
    });
    found
}

/// The server cookie for client cookie `cc` from `client` at `now`, made with `secret`
/// (RFC 9018 §4).
pub fn server_cookie(
    secret: &Secret,
    cc: &[u8; CLIENT_LEN],
    client: IpAddr,
    now: u32,
) -> [u8; SERVER_LEN] {
    let mut out = [0u8; SERVER_LEN];
    out[0] = VERSION;
    out[4..8].copy_from_slice(&now.to_be_bytes());
    let head: [u8; 8] = [
        out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7],
    ];
    out[8..].copy_from_slice(&hash(secret, cc, &head, client));
    out
}

/// SipHash-2-4 with `secret` over the client cookie, the server cookie's first 8 bytes
/// (version, reserved, timestamp) and the client's address, as RFC 9018 §4.4 orders them.
fn hash(secret: &Secret, cc: &[u8; CLIENT_LEN], head: &[u8; 8], client: IpAddr) -> [u8; 8] {
    let mut h = SipHasher24::new_with_key(secret);
    h.write(cc);
    h.write(head);
    match client.to_canonical() {
        IpAddr::V4(a) => h.write(&a.octets()),
        IpAddr::V6(a) => h.write(&a.octets()),
    }
    h.finish().to_le_bytes()
}

/// Whether `a` and `b` are the same bytes, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Reads a secret written as 32 hexadecimal digits (surrounding whitespace dropped); the error
/// says what is wrong, without the secret.
pub fn parse_secret(text: &str) -> Result<Secret, String> {
    let text = text.trim();
    if !text.is_ascii() {
        return Err("must be 32 hexadecimal digits (16 bytes)".to_string());
    }
    if text.len() != 32 {
        return Err(format!(
            "must be 32 hexadecimal digits (16 bytes), not {} characters",
            text.len()
        ));
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
            .map_err(|_| "must be 32 hexadecimal digits (16 bytes)".to_string())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn secret(s: &str) -> Secret {
        parse_secret(s).expect("a secret")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    /// RFC 9018 Appendix A, every example: the server cookie made for a client cookie, an
    /// address, a secret and a time, and what a query's cookie is judged.
    #[test]
    fn rfc_9018_test_vectors() {
        let a = secret("e5e973e5a6b2a43f48e7dc849e37bfcf");
        // A.1: a client cookie alone gets a new server cookie.
        let cookies = Cookies::new(a, None);
        let got = cookies.check(&hex("2464c4abcf10c957"), ip("198.51.100.100"), 1559731985);
        let want = hex("2464c4abcf10c957010000005cf79f111f8130c3eee29480");
        assert_eq!(
            got,
            Checked::Good {
                reply: want.clone().try_into().expect("24"),
                valid: false
            }
        );
        // A.2: that cookie, 40 minutes later, is valid and renewed (older than half an hour).
        let got = cookies.check(&want, ip("198.51.100.100"), 1559734385);
        let renewed = hex("2464c4abcf10c957010000005cf7a871d4a564a1442aca77");
        assert_eq!(
            got,
            Checked::Good {
                reply: renewed.try_into().expect("24"),
                valid: true
            }
        );
        // ... and ten minutes after it was made, valid and kept as it is.
        let got = cookies.check(&want, ip("198.51.100.100"), 1559731985 + 600);
        assert_eq!(
            got,
            Checked::Good {
                reply: want.clone().try_into().expect("24"),
                valid: true
            }
        );
        // From another address it is not valid: a new one.
        assert!(!cookies
            .check(&want, ip("198.51.100.101"), 1559731985)
            .valid());
        // A.3: a server cookie with reserved bytes set is valid (the hash covers them); the
        // example's reply comes 1 h 52 min after it was made, where it is too old here (RFC 9018
        // §4.3: an hour), so it is checked ten minutes in, and the reply made at the example's
        // time.
        let query = hex("fc93fc62807ddb8601abcdef5cf78f71a314227b6679ebf5");
        assert!(cookies
            .check(&query, ip("203.0.113.203"), 1559727985 + 600)
            .valid());
        let got = cookies.check(&query, ip("203.0.113.203"), 1559734700);
        let want = hex("fc93fc62807ddb86010000005cf7a9acf73a7810aca2381e");
        assert_eq!(
            got,
            Checked::Good {
                reply: want.try_into().expect("24"),
                valid: false
            }
        );
        // A.4: IPv6, the secret rolled: the old one still checks, the new one makes.
        let old = secret("dd3bdf9344b678b185a6f5cb60fca715");
        let new = secret("445536bcd2513298075a5d379663c962");
        let client = ip("2001:db8:220:1:59de:d0f4:8769:82b8");
        let query = hex("22681ab97d52c298010000005cf7c57926556bd0934c72f8");
        let rolled = Cookies::new(new, Some(old));
        let got = rolled.check(&query, client, 1559741961);
        let want = hex("22681ab97d52c298010000005cf7c609a6bb79d16625507a");
        // 144 s old: valid and kept; a new one is the example's.
        assert!(got.valid());
        let cc: [u8; 8] = query[..8].try_into().expect("8");
        assert_eq!(server_cookie(&new, &cc, client, 1559741961)[..], want[8..]);
        // Without the old secret it is not valid; with only the old one, valid.
        assert!(!Cookies::new(new, None)
            .check(&query, client, 1559741961)
            .valid());
        assert!(Cookies::new(old, None)
            .check(&query, client, 1559741961)
            .valid());
    }

    /// RFC 7873 §5.2.2: a client cookie of other than 8 bytes, or a server cookie of other
    /// than 8 to 32, is malformed; an unknown server cookie of a valid length is not.
    #[test]
    fn malformed_lengths_and_times_out_of_range() {
        let cookies = Cookies::new([7; 16], None);
        let at = ip("192.0.2.1");
        for len in [0, 1, 7, 9, 15, 41, 60] {
            assert_eq!(
                cookies.check(&vec![1; len], at, 1000),
                Checked::Malformed,
                "{len}"
            );
        }
        for len in [8, 16, 20, 40] {
            assert!(
                matches!(
                    cookies.check(&vec![1; len], at, 1000),
                    Checked::Good { valid: false, .. }
                ),
                "{len}"
            );
        }
        // Made at t: valid from t - 300 to t + 3600, renewed after t + 1800.
        let t = 1_800_000_000u32;
        let cc = [9u8; 8];
        let mut option = cc.to_vec();
        option.extend_from_slice(&server_cookie(&[7; 16], &cc, at, t));
        for (now, valid, same) in [
            (t, true, true),
            (t - 300, true, true),
            (t - 301, false, false),
            (t + 1800, true, true),
            (t + 1801, true, false),
            (t + 3600, true, false),
            (t + 3601, false, false),
        ] {
            let Checked::Good { reply, valid: v } = cookies.check(&option, at, now) else {
                panic!("{now}: malformed?");
            };
            assert_eq!(v, valid, "at t{:+}", i64::from(now) - i64::from(t));
            assert_eq!(
                reply[..] == option[..],
                same,
                "at t{:+}",
                i64::from(now) - i64::from(t)
            );
            // A new cookie is dated now.
            assert_eq!(reply[12..16], (if same { t } else { now }).to_be_bytes());
        }
        // Another version is not valid.
        option[8] = 2;
        assert!(!cookies.check(&option, at, t).valid());
        // IPv4 written as IPv4-mapped IPv6 is the same client.
        option[8] = 1;
        assert!(cookies.check(&option, ip("::ffff:192.0.2.1"), t).valid());
    }

    /// The cookie is found in a query's OPT record beside other options; a query cut short or
    /// without one has none.
    #[test]
    fn replaced_secrets_are_used_by_every_clone_and_the_previous_stays_valid() {
        let (a, b) = (secret("e5e973e5a6b2a43f48e7dc849e37bfcf"), [5u8; 16]);
        let t = 1_800_000_000u32;
        let cookies = Cookies::at_fixed_time(a, None, t);
        let clone = cookies.clone();
        let client = ip("198.51.100.7");
        let cc = [3u8; 8];
        let with = |secret: &Secret| {
            let mut option = cc.to_vec();
            option.extend_from_slice(&server_cookie(secret, &cc, client, t));
            option
        };
        assert!(clone.check(&with(&a), client, t).valid());
        assert!(!clone.check(&with(&b), client, t).valid());
        let said = cookies.replace(Some(&Cookies::new(b, Some(a))));
        assert!(said.contains("replaced"), "{said}");
        // The clone makes cookies with the new secret and takes both.
        let Checked::Good { reply, .. } = clone.check(&cc, client, t) else {
            panic!("malformed?");
        };
        assert_eq!(reply[..], with(&b)[..]);
        assert!(clone.check(&with(&a), client, t).valid());
        assert!(clone.check(&with(&b), client, t).valid());
        assert_eq!(
            cookies.replace(Some(&Cookies::new(b, Some(a)))),
            "cookie secrets unchanged"
        );
        // Dropped: a random secret of this process, the dropped one still taken.
        cookies.replace(None);
        assert!(clone.check(&with(&b), client, t).valid());
        assert!(!clone.check(&with(&a), client, t).valid());
        let Checked::Good { reply, .. } = clone.check(&cc, client, t) else {
            panic!("malformed?");
        };
        assert_ne!(reply[..], with(&b)[..]);
        // A process's own random secret is kept when none is configured again.
        let own = Cookies::random();
        let before = own.check(&cc, client, t);
        assert!(own.replace(None).contains("unchanged"));
        assert_eq!(own.check(&cc, client, t), before);
    }

    #[test]
    fn the_cookie_is_found_in_a_query() {
        let mut q = vec![
            0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 3, b'w', b'w', b'w', 0, 0, 1, 0, 1,
        ];
        q.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 19]);
        q.extend_from_slice(&[0, 8, 0, 3, 0, 1, 0]); // an ECS option (its content unread here)
        q.extend_from_slice(&[0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(in_query(&q), Some(&[1, 2, 3, 4, 5, 6, 7, 8][..]));
        assert_eq!(in_query(&q[..q.len() - 1]), None);
        assert_eq!(in_query(&q[..21]), None);
        q[11] = 0;
        assert_eq!(in_query(&q), None, "no additional record");
    }

    #[test]
    fn secrets_are_32_hex_digits() {
        assert_eq!(
            parse_secret(" 000102030405060708090a0b0c0d0e0F\n"),
            Ok(core::array::from_fn(|i| i as u8))
        );
        for bad in [
            "",
            "00",
            "000102030405060708090a0b0c0d0e0g",
            "000102030405060708090a0b0c0d0e0f00",
            "0001020304050607080éa0b0c0d0e0f",
        ] {
            assert!(parse_secret(bad).is_err(), "{bad}");
        }
    }
}
