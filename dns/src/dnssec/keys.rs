//! DNSSEC keys from BIND's key files: `K<zone>+<alg>+<tag>.key` holds the DNSKEY record in
//! text (with BIND's timing comments), `.private` the private key (`Private-key-format: v1.3`,
//! `Algorithm: 13 (ECDSAP256SHA256)` or `15 (ED25519)`, `PrivateKey: <base64>`, and the timing
//! lines `Publish:`, `Activate:`, `Inactive:`, `Delete:` in `YYYYMMDDHHMMSS`, UTC). Keys made by
//! `dnssec-keygen` load as they are.
//!
//! Only algorithms 13 (ECDSA P-256 with SHA-256) and 15 (Ed25519) are taken; a key of another
//! is refused with an error naming its file. A key with the SEP flag (flags 257) is a
//! key-signing key, one without (256) a zone-signing key; a zone with SEP keys only signs with
//! them everything (a combined signing key, CSK).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use hickory_server::proto::rr::Name;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

/// The DNSKEY flags: the zone key bit (RFC 4034 §2.1.1).
pub const FLAG_ZONE: u16 = 0x0100;
/// The secure entry point bit: a key-signing key.
pub const FLAG_SEP: u16 = 0x0001;
/// The revoked bit (RFC 5011): such a key is refused.
pub const FLAG_REVOKE: u16 = 0x0080;
/// Most keys one front end holds (every zone's, with the ones of a rollover).
pub const MAX_KEYS: usize = 64;
/// The largest key file read: a DNSKEY of these algorithms and its comments are a few hundred
/// bytes.
const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// Why a key could not be used: the file, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct KeyError {
    pub file: String,
    pub problem: String,
}

fn error(file: &Path, problem: impl Into<String>) -> KeyError {
    KeyError {
        file: file.display().to_string(),
        problem: problem.into(),
    }
}

/// The signing algorithms taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Algorithm {
    /// 13: ECDSA on P-256 with SHA-256 (RFC 6605), the signature r||s, 64 bytes.
    EcdsaP256Sha256,
    /// 15: Ed25519 (RFC 8080), 64 bytes.
    Ed25519,
}

impl Algorithm {
    /// Every algorithm, in the order of their numbers.
    pub const ALL: [Algorithm; 2] = [Algorithm::EcdsaP256Sha256, Algorithm::Ed25519];

    pub fn number(self) -> u8 {
        match self {
            Algorithm::EcdsaP256Sha256 => 13,
            Algorithm::Ed25519 => 15,
        }
    }

    fn of(number: u8) -> Option<Algorithm> {
        match number {
            13 => Some(Algorithm::EcdsaP256Sha256),
            15 => Some(Algorithm::Ed25519),
            _ => None,
        }
    }

    /// The length of its public key in a DNSKEY record.
    fn public_len(self) -> usize {
        match self {
            Algorithm::EcdsaP256Sha256 => 64,
            Algorithm::Ed25519 => 32,
        }
    }
}

/// When a key is published, signs, stops signing and goes (Unix seconds; `None`: not set).
/// BIND writes these as `Publish:`, `Activate:`, `Inactive:` and `Delete:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    pub publish: Option<u64>,
    pub activate: Option<u64>,
    pub inactive: Option<u64>,
    pub delete: Option<u64>,
}

impl Timing {
    /// Whether the key is in the DNSKEY RRset at `now`: published (or no date) and not
    /// deleted.
    pub fn published(&self, now: u64) -> bool {
        self.publish.is_none_or(|t| t <= now) && self.delete.is_none_or(|t| t > now)
    }

    /// Whether the key signs at `now`: published, active (or no date), not inactive. A key
    /// whose `Activate` is still to come is published but does not sign (a rollover's new
    /// key, published before use).
    pub fn signs(&self, now: u64) -> bool {
        self.published(now)
            && self.activate.is_none_or(|t| t <= now)
            && self.inactive.is_none_or(|t| t > now)
    }
}

enum Pair {
    Ecdsa(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
}

/// One key: its DNSKEY record's fields, its timing, and the private key to sign with.
pub struct Key {
    /// The zone (the DNSKEY record's owner), lower case, fully qualified.
    pub zone: Name,
    pub flags: u16,
    pub algorithm: Algorithm,
    /// The public key as the DNSKEY record holds it.
    pub public: Vec<u8>,
    /// Its key tag (RFC 4034 Appendix B).
    pub tag: u16,
    pub timing: Timing,
    /// The base path it was read from (without `.key` / `.private`).
    pub path: PathBuf,
    pair: Pair,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("zone", &self.zone.to_string())
            .field("flags", &self.flags)
            .field("algorithm", &self.algorithm)
            .field("tag", &self.tag)
            .field("timing", &self.timing)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The key tag of a DNSKEY record's RDATA (RFC 4034 Appendix B; not for algorithm 1).
pub fn key_tag(rdata: &[u8]) -> u16 {
    let mut ac: u32 = 0;
    for (i, &b) in rdata.iter().enumerate() {
        ac += if i & 1 == 1 {
            u32::from(b)
        } else {
            u32::from(b) << 8
        };
    }
    ac += (ac >> 16) & 0xFFFF;
    (ac & 0xFFFF) as u16
}

/// `base` without a final `.key` or `.private`: the key's base path.
pub fn base_path(base: &Path) -> PathBuf {
    let text = base.as_os_str().to_string_lossy();
    for ext in [".key", ".private"] {
        if let Some(stripped) = text.strip_suffix(ext) {
            return PathBuf::from(stripped);
        }
    }
    base.to_path_buf()
}

fn with_ext(base: &Path, ext: &str) -> PathBuf {
    let mut s = base.as_os_str().to_os_string();
    s.push(ext);
    PathBuf::from(s)
}

fn read_small(path: &Path) -> Result<String, KeyError> {
    let meta = std::fs::metadata(path).map_err(|e| error(path, format!("cannot be read: {e}")))?;
    if meta.len() > MAX_KEY_FILE_BYTES {
        return Err(error(path, format!("{} bytes: not a key file", meta.len())));
    }
    std::fs::read_to_string(path).map_err(|e| error(path, format!("cannot be read: {e}")))
}

impl Key {
    /// Reads the key at base path `base` (`K<zone>+<alg>+<tag>`; a path ending in `.key` or
    /// `.private` is taken as its base): `base.key` and `base.private`.
    pub fn load(base: &Path) -> Result<Key, KeyError> {
        let base = base_path(base);
        let key_file = with_ext(&base, ".key");
        let private_file = with_ext(&base, ".private");
        let key_text = read_small(&key_file)?;
        let private_text = read_small(&private_file)?;
        Key::from_texts(&base, &key_text, &private_text)
    }

    /// The key from its files' texts (`base` names them in errors).
    pub fn from_texts(base: &Path, key_text: &str, private_text: &str) -> Result<Key, KeyError> {
        let key_file = with_ext(base, ".key");
        let private_file = with_ext(base, ".private");
        let dnskey = parse_dnskey(&key_file, key_text)?;
        let private = parse_private(&private_file, private_text)?;
        if private.algorithm != dnskey.algorithm {
            return Err(error(
                &private_file,
                format!(
                    "algorithm {} but the .key file's DNSKEY is algorithm {}",
                    private.algorithm.number(),
                    dnskey.algorithm.number()
                ),
            ));
        }
        let pair = match dnskey.algorithm {
            Algorithm::EcdsaP256Sha256 => {
                let mut public = Vec::with_capacity(65);
                public.push(0x04); // uncompressed point: x || y
                public.extend_from_slice(&dnskey.public);
                EcdsaKeyPair::from_private_key_and_public_key(
                    &ECDSA_P256_SHA256_FIXED_SIGNING,
                    &private.key,
                    &public,
                    &SystemRandom::new(),
                )
                .map(Pair::Ecdsa)
                .map_err(|e| error(&private_file, format!("the private key does not match the .key file's public key or is not a P-256 key: {e}")))?
            }
            Algorithm::Ed25519 => Ed25519KeyPair::from_seed_and_public_key(&private.key, &dnskey.public)
                .map(Pair::Ed25519)
                .map_err(|e| error(&private_file, format!("the private key does not match the .key file's public key or is not an Ed25519 seed: {e}")))?,
        };
        let mut key = Key {
            zone: dnskey.zone,
            flags: dnskey.flags,
            algorithm: dnskey.algorithm,
            public: dnskey.public,
            tag: 0,
            // The .private file's dates when it has them (BIND keeps both), else the comments'.
            timing: Timing {
                publish: private.timing.publish.or(dnskey.timing.publish),
                activate: private.timing.activate.or(dnskey.timing.activate),
                inactive: private.timing.inactive.or(dnskey.timing.inactive),
                delete: private.timing.delete.or(dnskey.timing.delete),
            },
            path: base.to_path_buf(),
            pair,
        };
        key.tag = key_tag(&key.dnskey_rdata());
        key.check_file_name(&key_file)?;
        Ok(key)
    }

    /// A file named as BIND names keys (`K<zone>+<alg>+<tag>`) must name this key's zone,
    /// algorithm and tag.
    fn check_file_name(&self, key_file: &Path) -> Result<(), KeyError> {
        let Some(name) = self.path.file_name().and_then(|n| n.to_str()) else {
            return Ok(());
        };
        let Some(rest) = name.strip_prefix('K') else {
            return Ok(());
        };
        let mut parts = rest.rsplitn(3, '+');
        let (Some(tag), Some(alg), Some(zone)) = (parts.next(), parts.next(), parts.next()) else {
            return Ok(());
        };
        let (Ok(tag), Ok(alg)) = (tag.parse::<u16>(), alg.parse::<u8>()) else {
            return Ok(());
        };
        let own_zone = self.zone.to_string();
        let zone_ok = own_zone.eq_ignore_ascii_case(zone)
            || own_zone
                .trim_end_matches('.')
                .eq_ignore_ascii_case(zone.trim_end_matches('.'));
        if tag != self.tag || alg != self.algorithm.number() || !zone_ok {
            return Err(error(
                key_file,
                format!(
                    "the file is named for zone {zone}, algorithm {alg}, tag {tag}, but holds a key of {own_zone}, algorithm {}, tag {}",
                    self.algorithm.number(),
                    self.tag
                ),
            ));
        }
        Ok(())
    }

    /// The DNSKEY record's RDATA: flags, protocol 3, algorithm, public key.
    pub fn dnskey_rdata(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.public.len());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.push(3);
        out.push(self.algorithm.number());
        out.extend_from_slice(&self.public);
        out
    }

    /// Whether it is a key-signing key (the SEP flag).
    pub fn is_sep(&self) -> bool {
        self.flags & FLAG_SEP != 0
    }

    /// Signs `message`: 64 bytes for either algorithm. ECDSA draws its nonce from `rng`.
    pub fn sign(&self, rng: &SystemRandom, message: &[u8]) -> Option<Vec<u8>> {
        match &self.pair {
            Pair::Ecdsa(p) => p.sign(rng, message).ok().map(|s| s.as_ref().to_vec()),
            Pair::Ed25519(p) => Some(p.sign(message).as_ref().to_vec()),
        }
    }

    /// The SHA-256 digest of its DS record (RFC 4509): over the owner's canonical wire name
    /// and the DNSKEY RDATA.
    pub fn ds_sha256(&self) -> Vec<u8> {
        let mut data = super::sign::wire_name(&self.zone);
        data.extend_from_slice(&self.dnskey_rdata());
        ring::digest::digest(&ring::digest::SHA256, &data)
            .as_ref()
            .to_vec()
    }

    /// Its DS record (digest type 2, SHA-256) in presentation form, as `dnssec-dsfromkey -2`
    /// prints it: `cdn.example. IN DS 12345 13 2 ABCD…`.
    pub fn ds_text(&self) -> String {
        let hex: String = self
            .ds_sha256()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect();
        format!(
            "{} IN DS {} {} 2 {hex}",
            self.zone,
            self.tag,
            self.algorithm.number()
        )
    }
}

/// A `.key` file's DNSKEY record.
struct Dnskey {
    zone: Name,
    flags: u16,
    algorithm: Algorithm,
    public: Vec<u8>,
    timing: Timing,
}

fn decode_base64(file: &Path, what: &str, text: &str) -> Result<Vec<u8>, KeyError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| error(file, format!("{what} is not base64: {e}")))
}

/// The `.key` file: comments (`;`, BIND's timing ones read), then one DNSKEY record
/// (`owner [ttl] [IN] DNSKEY flags protocol algorithm base64…`).
fn parse_dnskey(file: &Path, text: &str) -> Result<Dnskey, KeyError> {
    let mut timing = Timing::default();
    let mut found: Option<Dnskey> = None;
    for line in text.lines().map(str::trim) {
        if let Some(comment) = line.strip_prefix(';') {
            if let Some((field, value)) = comment.trim().split_once(':') {
                set_timing(&mut timing, file, field.trim(), value)?;
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        if found.is_some() {
            return Err(error(
                file,
                "more than one record: a key file holds one DNSKEY",
            ));
        }
        found = Some(dnskey_record(file, line)?);
    }
    let mut dnskey = found.ok_or_else(|| error(file, "no DNSKEY record"))?;
    dnskey.timing = timing;
    Ok(dnskey)
}

/// The DNSKEY record of a `.key` file's `line` (`owner [ttl] [IN] DNSKEY flags protocol
/// algorithm base64…`), its dates not yet read.
fn dnskey_record(file: &Path, line: &str) -> Result<Dnskey, KeyError> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let at = tokens
        .iter()
        .position(|t| t.eq_ignore_ascii_case("DNSKEY"))
        .ok_or_else(|| error(file, format!("{line:?} is not a DNSKEY record")))?;
    // owner, then an optional TTL and class.
    let between = &tokens[1..at];
    let class_ok = between
        .iter()
        .all(|t| t.eq_ignore_ascii_case("IN") || t.parse::<u32>().is_ok());
    if at == 0 || between.len() > 2 || !class_ok {
        return Err(error(
            file,
            format!("{line:?} is not `owner [ttl] IN DNSKEY …`"),
        ));
    }
    let fields = &tokens[at + 1..];
    if fields.len() < 4 {
        return Err(error(
            file,
            "the DNSKEY record needs flags, protocol, algorithm and the key",
        ));
    }
    let flags: u16 = fields[0]
        .parse()
        .map_err(|_| error(file, format!("flags {:?} is not a number", fields[0])))?;
    if fields[1] != "3" {
        return Err(error(
            file,
            format!("protocol {} (DNSSEC keys are protocol 3)", fields[1]),
        ));
    }
    let number: u8 = fields[2]
        .parse()
        .map_err(|_| error(file, format!("algorithm {:?} is not a number", fields[2])))?;
    let algorithm = Algorithm::of(number).ok_or_else(|| {
        error(
            file,
            format!("algorithm {number}: only 13 (ECDSAP256SHA256) and 15 (ED25519) are supported"),
        )
    })?;
    if flags & FLAG_ZONE == 0 || flags & !(FLAG_ZONE | FLAG_SEP) != 0 {
        let what = if flags & FLAG_REVOKE != 0 {
            "a revoked key"
        } else {
            "not a zone key"
        };
        return Err(error(
            file,
            format!("flags {flags}: {what} (256 for a zone-signing key, 257 for a key-signing or combined key)"),
        ));
    }
    let public = decode_base64(file, "the public key", &fields[3..].concat())?;
    if public.len() != algorithm.public_len() {
        return Err(error(
            file,
            format!(
                "the public key is {} bytes; algorithm {number} has {}",
                public.len(),
                algorithm.public_len()
            ),
        ));
    }
    let zone = Name::from_ascii(tokens[0]).map_err(|e| {
        error(
            file,
            format!("owner {:?} is not a domain name: {e}", tokens[0]),
        )
    })?;
    if !zone.is_fqdn() {
        return Err(error(
            file,
            format!("owner {:?} is not fully qualified (a final dot)", tokens[0]),
        ));
    }
    Ok(Dnskey {
        zone: zone.to_lowercase(),
        flags,
        algorithm,
        public,
        timing: Timing::default(),
    })
}

/// A `.private` file's algorithm, key and dates.
struct Private {
    algorithm: Algorithm,
    key: Vec<u8>,
    timing: Timing,
}

fn parse_private(file: &Path, text: &str) -> Result<Private, KeyError> {
    let mut format = None;
    let mut algorithm = None;
    let mut key = None;
    let mut timing = Timing::default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((field, value)) = line.split_once(':') else {
            return Err(error(file, format!("{line:?} is not `Field: value`")));
        };
        let value = value.trim();
        match field.trim() {
            "Private-key-format" => format = Some(value.to_string()),
            "Algorithm" => {
                let number = value.split_whitespace().next().unwrap_or_default();
                let number: u8 = number
                    .parse()
                    .map_err(|_| error(file, format!("Algorithm {value:?} is not a number")))?;
                algorithm = Some(Algorithm::of(number).ok_or_else(|| {
                    error(
                        file,
                        format!("Algorithm {value}: only 13 (ECDSAP256SHA256) and 15 (ED25519) are supported"),
                    )
                })?);
            }
            "PrivateKey" => key = Some(decode_base64(file, "PrivateKey", value)?),
            other => set_timing(&mut timing, file, other, value)?,
        }
    }
    match format.as_deref() {
        Some(v) if v.starts_with("v1.") => {}
        Some(v) => return Err(error(file, format!("Private-key-format {v}: v1.x is read"))),
        None => {
            return Err(error(
                file,
                "no Private-key-format line: not a BIND private key file",
            ))
        }
    }
    let algorithm = algorithm.ok_or_else(|| error(file, "no Algorithm line"))?;
    let key = key.ok_or_else(|| error(file, "no PrivateKey line"))?;
    if key.len() != 32 {
        return Err(error(
            file,
            format!("PrivateKey is {} bytes; 32 expected", key.len()),
        ));
    }
    Ok(Private {
        algorithm,
        key,
        timing,
    })
}

/// Sets the date `field` (`Publish`, `Activate`, `Inactive`, `Delete`) from `value`
/// (`YYYYMMDDHHMMSS`, then anything: BIND's comments add the date in words); other fields are
/// passed over (`Created`, `SyncPublish`, …).
fn set_timing(timing: &mut Timing, file: &Path, field: &str, value: &str) -> Result<(), KeyError> {
    let slot = match field {
        "Publish" => &mut timing.publish,
        "Activate" => &mut timing.activate,
        "Inactive" => &mut timing.inactive,
        "Delete" => &mut timing.delete,
        _ => return Ok(()),
    };
    let stamp = value.split_whitespace().next().unwrap_or_default();
    *slot = Some(parse_stamp(stamp).ok_or_else(|| {
        error(
            file,
            format!("{field}: {stamp:?} is not a date YYYYMMDDHHMMSS"),
        )
    })?);
    Ok(())
}

/// `YYYYMMDDHHMMSS` (UTC) in Unix seconds.
pub fn parse_stamp(s: &str) -> Option<u64> {
    if s.len() != 14 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s[r].parse::<i64>().ok();
    let (y, mo, d, h, mi, se) = (
        n(0..4)?,
        n(4..6)?,
        n(6..8)?,
        n(8..10)?,
        n(10..12)?,
        n(12..14)?,
    );
    if !(1970..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&d)
        || h > 23
        || mi > 59
        || se > 60
    {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    u64::try_from(days * 86_400 + h * 3600 + mi * 60 + se).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A KSK of `cdn.example.` made by `dnssec-keygen -a ECDSAP256SHA256 -f KSK` (BIND 9.18).
    pub(crate) const ECDSA_KSK: (&str, &str, &str) = (
        "Kcdn.example.+013+34532",
        "; This is a key-signing key, keyid 34532, for cdn.example.
; Created: 20261207142129 (Mon Dec  7 14:21:29 2026)
; Publish: 20261207142129 (Mon Dec  7 14:21:29 2026)
; Activate: 20261207142129 (Mon Dec  7 14:21:29 2026)
cdn.example. IN DNSKEY 257 3 13 F6vcL7uIV6pEVx1/OqsNBoJxCQkXpnrVQlacwR7oyvDGRDUQtX5U02vf Qb2bbKHf9z4Zocu0CqScepO0Lty0hQ==
",
        "Private-key-format: v1.3
Algorithm: 13 (ECDSAP256SHA256)
PrivateKey: yBH8mXz3KtQ465qVZJZJXRSpJ1LapYelulLIxvXdtI0=
Created: 20261207142129
Publish: 20261207142129
Activate: 20261207142129
",
    );

    /// A ZSK of `cdn.example.` made by `dnssec-keygen -a ED25519` (BIND 9.18).
    pub(crate) const ED25519_ZSK: (&str, &str, &str) = (
        "Kcdn.example.+015+07284",
        "; This is a zone-signing key, keyid 7284, for cdn.example.
; Created: 20261207142129 (Mon Dec  7 14:21:29 2026)
; Publish: 20261207142129 (Mon Dec  7 14:21:29 2026)
; Activate: 20261207142129 (Mon Dec  7 14:21:29 2026)
cdn.example. IN DNSKEY 256 3 15 LEI107GcU+6ENNjHKBRf8QopWBryYkglYMqBjoPdyMA=
",
        "Private-key-format: v1.3
Algorithm: 15 (ED25519)
PrivateKey: k6ymbSdeDiHNk6ML+dIkatzqEkMvGtc4mCg0OtOKsTU=
Created: 20261207142129
Publish: 20261207142129
Activate: 20261207142129
",
    );

    pub(crate) fn key((base, key, private): (&str, &str, &str)) -> Key {
        Key::from_texts(Path::new(base), key, private).expect("a valid key")
    }

    fn refused(base: &str, key: &str, private: &str) -> String {
        Key::from_texts(Path::new(base), key, private)
            .expect_err("refused")
            .to_string()
    }

    /// The tags computed are the ones in BIND's file names; the DS records are the ones
    /// `dnssec-dsfromkey -2` printed for these files.
    #[test]
    fn keygen_keys_load_with_their_tags_and_ds() {
        let ksk = key(ECDSA_KSK);
        assert_eq!(
            (ksk.tag, ksk.flags, ksk.algorithm.number()),
            (34532, 257, 13)
        );
        assert!(ksk.is_sep());
        assert_eq!(ksk.zone.to_string(), "cdn.example.");
        assert_eq!(
            ksk.ds_text(),
            "cdn.example. IN DS 34532 13 2 8FEDBC5CE45BEA139E48344445E96D8CD8E574295813208232A694C142CC62D8"
        );
        let zsk = key(ED25519_ZSK);
        assert_eq!(
            (zsk.tag, zsk.flags, zsk.algorithm.number()),
            (7284, 256, 15)
        );
        assert!(!zsk.is_sep());
        assert_eq!(
            zsk.ds_text(),
            "cdn.example. IN DS 7284 15 2 74A18379799E5DE22DF403DDA7DA7AA758698020FB9CFA152D2794A2190D5563"
        );
        assert_eq!(zsk.timing.activate, parse_stamp("20261207142129"));
    }

    /// Signatures verify with ring's verification against the DNSKEY's public key.
    #[test]
    fn signatures_verify_with_the_public_key() {
        use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ED25519};
        let rng = SystemRandom::new();
        let message = b"an RRset in canonical form";
        let ksk = key(ECDSA_KSK);
        let sig = ksk.sign(&rng, message).expect("signed");
        assert_eq!(sig.len(), 64);
        let mut public = vec![4];
        public.extend_from_slice(&ksk.public);
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &public)
            .verify(message, &sig)
            .expect("ECDSA verifies");
        let zsk = key(ED25519_ZSK);
        let sig = zsk.sign(&rng, message).expect("signed");
        UnparsedPublicKey::new(&ED25519, &zsk.public)
            .verify(message, &sig)
            .expect("Ed25519 verifies");
        assert!(UnparsedPublicKey::new(&ED25519, &zsk.public)
            .verify(b"another message", &sig)
            .is_err());
    }

    /// Other algorithms, a private key of another key, a misnamed file, a revoked key, and
    /// broken files are refused, each error naming the file.
    #[test]
    fn bad_key_files_are_refused_naming_the_file() {
        let (base, k, p) = ECDSA_KSK;
        let rsa = k.replace("257 3 13", "257 3 8");
        assert!(refused(base, &rsa, p).contains("Kcdn.example.+013+34532.key: algorithm 8"));
        let other_alg = p.replace("13 (ECDSAP256SHA256)", "8 (RSASHA256)");
        assert!(refused(base, k, &other_alg).contains(".private: Algorithm 8"));
        let mismatch = refused(base, k, ED25519_ZSK.2);
        assert!(mismatch.contains(".private: algorithm 15"), "{mismatch}");
        let other_private = p.replace(
            "yBH8mXz3KtQ465qVZJZJXRSpJ1LapYelulLIxvXdtI0=",
            "k6ymbSdeDiHNk6ML+dIkatzqEkMvGtc4mCg0OtOKsTU=",
        );
        assert!(refused(base, k, &other_private).contains("does not match"));
        let misnamed = refused("Kcdn.example.+013+11111", k, p);
        assert!(
            misnamed.contains("named for zone cdn.example., algorithm 13, tag 11111"),
            "{misnamed}"
        );
        let revoked = k.replace("257 3 13", "385 3 13");
        assert!(refused("Kx", &revoked, p).contains("a revoked key"));
        assert!(refused(base, "; nothing\n", p).contains("no DNSKEY record"));
        assert!(refused(base, k, "PrivateKey: abc\n").contains("not base64"));
        assert!(refused(base, k, "Algorithm: 13\n").contains("no Private-key-format"));
        let bad_date = p.replace("Activate: 20261207142129", "Activate: tomorrow");
        assert!(refused(base, k, &bad_date).contains("Activate: \"tomorrow\""));
        let relative = k.replace("cdn.example. IN", "cdn.example IN");
        assert!(refused("Kx", &relative, p).contains("not fully qualified"));
        let missing = Key::load(Path::new("/nonexistent/Kcdn.example.+013+34532"))
            .expect_err("no file")
            .to_string();
        assert!(missing.starts_with("/nonexistent/Kcdn.example.+013+34532.key: cannot be read"));
    }

    /// A key whose `Activate` is to come is published and does not sign; one past `Inactive`
    /// neither signs; one past `Delete` is not published.
    #[test]
    fn timing_says_when_a_key_is_published_and_signs() {
        let t = Timing {
            publish: Some(100),
            activate: Some(200),
            inactive: Some(300),
            delete: Some(400),
        };
        let at = |now| (t.published(now), t.signs(now));
        assert_eq!(at(50), (false, false));
        assert_eq!(at(150), (true, false));
        assert_eq!(at(250), (true, true));
        assert_eq!(at(350), (true, false));
        assert_eq!(at(450), (false, false));
        assert!(Timing::default().signs(0));
        assert_eq!(parse_stamp("19700101000000"), Some(0));
        assert_eq!(parse_stamp("20261207142129"), Some(1_796_653_289));
        assert_eq!(parse_stamp("20000229000000"), Some(951_782_400));
        assert_eq!(parse_stamp("2026120714212"), None);
        assert_eq!(parse_stamp("20261307142129"), None);
    }

    /// RFC 4034 Appendix B's tag of a DNSKEY written byte by byte.
    #[test]
    fn key_tag_sums_as_the_rfc_says() {
        assert_eq!(key_tag(&[0x01, 0x00, 3, 13]), 0x010D + 0x0300);
        assert_eq!(
            key_tag(&[0xFF, 0xFF, 0xFF, 0xFF]),
            ((0x1FFFEu32 + 1) & 0xFFFF) as u16
        );
    }
}
