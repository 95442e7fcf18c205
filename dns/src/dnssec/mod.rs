//! DNSSEC online signing (docs/dns.md, "DNSSEC"): keys from BIND's key files (`keys`),
//! RRSIG/NSEC/DNSKEY records written by hand (`sign`), and the signature cache (`cache`) that
//! makes each distinct RRset's signature once per key and validity window.
//!
//! What is signed: a response to a query with the DO bit, in a zone with keys: every RRset of
//! its answer and authority sections (the map's A/AAAA answers, ECS-scoped ones included, the
//! SOA, NS, static records, the DNSKEY RRset), each followed by its RRSIGs. Denial is compact
//! (RFC 9824): a name that does not exist is answered NOERROR with one NSEC at the query's name,
//! next name `\000.<name>`, types RRSIG, NSEC and NXNAME; NODATA with one NSEC at the name
//! listing the types there. A positive answer synthesized from a wildcard rule
//! (`ClassRules::synthesized_from`) is signed as the wildcard's RRset, one signature for every
//! name it answers, with a minimally covering NSEC showing the name is not there
//! (`sign::white_lie`); NODATA there adds the wildcard's own NSEC. The DNSKEY RRset is signed by the key-signing keys (SEP flag), the
//! rest by the zone-signing keys, or by the SEP keys when a zone has no other (a CSK); each
//! algorithm of the zone's keys signs. Every key whose dates say it is published is in the
//! DNSKEY RRset; only the active ones sign (a rollover's next key is published first).
//!
//! Time is passed in (`now`, Unix seconds); the handler reads the clock.

pub mod cache;
pub mod keys;
pub mod reply;
pub mod sign;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use hickory_server::proto::rr::{DNSClass, Name, Record, RecordType};
use ring::rand::SystemRandom;

use crate::zonedata::ZoneConfig;
use cache::SignatureCache;
use keys::{Algorithm, Key, KeyError, MAX_KEYS};
use sign::{RrsigHeader, Validity};

/// The DNSKEY RRset's TTL.
pub const DNSKEY_TTL: u32 = 3600;

/// One zone's keys.
#[derive(Debug)]
pub struct ZoneKeys {
    /// The apex, lower case, fully qualified: the RRSIGs' signer.
    pub apex: Name,
    /// Its text (lower case, final dot), as a query's name is compared.
    pub apex_text: String,
    /// Its wire form (lower case, uncompressed): the RRSIGs' signer field.
    pub apex_wire: Vec<u8>,
    pub keys: Vec<Key>,
}

/// The keys of every zone, by the zone's index in the configuration.
#[derive(Debug, Default)]
pub struct KeySet {
    zones: Vec<Option<ZoneKeys>>,
}

/// Why a key set was refused: the configuration key (`dnssec_keys[i]`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct KeySetError {
    pub key: String,
    pub problem: String,
}

impl KeySet {
    /// Reads the keys at `paths` (their base paths, `dnssec_keys`) for `zones`. Every key's
    /// zone must be one of them; no key twice, no two keys of a zone with one algorithm and
    /// tag (their signatures could not be told apart); at most [`MAX_KEYS`].
    pub fn load(paths: &[PathBuf], zones: &[ZoneConfig]) -> Result<KeySet, KeySetError> {
        let keys = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Key::load(p).map_err(|e: KeyError| KeySetError {
                    key: format!("dnssec_keys[{i}]"),
                    problem: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        KeySet::from_keys(keys, zones)
    }

    /// The set of `keys` (in `dnssec_keys`' order) for `zones`.
    pub fn from_keys(keys: Vec<Key>, zones: &[ZoneConfig]) -> Result<KeySet, KeySetError> {
        let err = |i: usize, problem: String| KeySetError {
            key: format!("dnssec_keys[{i}]"),
            problem,
        };
        if keys.len() > MAX_KEYS {
            return Err(KeySetError {
                key: "dnssec_keys".into(),
                problem: format!("{} keys; at most {MAX_KEYS}", keys.len()),
            });
        }
        let mut set = KeySet {
            zones: zones.iter().map(|_| None).collect(),
        };
        for (i, key) in keys.into_iter().enumerate() {
            let Some(z) = zones.iter().position(|z| z.apex.to_lowercase() == key.zone) else {
                return Err(err(
                    i,
                    format!(
                        "{}: the key's zone {} is not one of the zones served",
                        key.path.display(),
                        key.zone
                    ),
                ));
            };
            let zone = set.zones[z].get_or_insert_with(|| ZoneKeys {
                apex: key.zone.clone(),
                apex_text: key.zone.to_string(),
                apex_wire: sign::wire_name(&key.zone),
                keys: Vec::new(),
            });
            if let Some(same) = zone
                .keys
                .iter()
                .find(|k| k.algorithm == key.algorithm && k.tag == key.tag)
            {
                let problem = if same.public == key.public {
                    format!(
                        "{}: the same key as {}",
                        key.path.display(),
                        same.path.display()
                    )
                } else {
                    format!(
                        "{}: algorithm {} tag {} is also the tag of {} (a key tag collision: make another key)",
                        key.path.display(),
                        key.algorithm.number(),
                        key.tag,
                        same.path.display()
                    )
                };
                return Err(err(i, problem));
            }
            zone.keys.push(key);
        }
        Ok(set)
    }

    /// Zone `z`'s keys, if it has any.
    pub fn zone(&self, z: usize) -> Option<&ZoneKeys> {
        self.zones.get(z)?.as_ref()
    }

    /// The keys, for the log: `cdn.example.: 34532/13 KSK, 7284/15 ZSK`.
    pub fn summary(&self) -> String {
        let zones: Vec<String> = self
            .zones
            .iter()
            .flatten()
            .map(|z| {
                let keys: Vec<String> = z
                    .keys
                    .iter()
                    .map(|k| {
                        let role = if k.is_sep() { "KSK" } else { "ZSK" };
                        format!("{}/{} {role}", k.tag, k.algorithm.number())
                    })
                    .collect();
                format!("{}: {}", z.apex, keys.join(", "))
            })
            .collect();
        if zones.is_empty() {
            "no keys: unsigned".into()
        } else {
            zones.join("; ")
        }
    }

    /// Every key, in zone order.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.zones.iter().flatten().flat_map(|z| z.keys.iter())
    }
}

impl ZoneKeys {
    /// The DNSKEY RRset at `now`: every published key.
    pub fn dnskey_rrset(&self, now: u64) -> Vec<Record> {
        self.keys
            .iter()
            .filter(|k| k.timing.published(now))
            .map(|k| {
                sign::raw_record(
                    self.apex.clone(),
                    DNSKEY_TTL,
                    DNSClass::IN,
                    RecordType::DNSKEY,
                    k.dnskey_rdata(),
                )
            })
            .collect()
    }

    /// The keys that sign an RRset at `now`: for each algorithm of the active keys, the
    /// key-signing keys for the DNSKEY RRset and the zone-signing keys for any other, or the
    /// other kind when the algorithm has none of that kind (a CSK).
    pub fn signers(&self, now: u64, dnskey: bool) -> Vec<&Key> {
        let mut out = Vec::with_capacity(self.keys.len());
        for alg in Algorithm::ALL {
            let of_alg = || {
                self.keys
                    .iter()
                    .filter(move |k| k.algorithm == alg && k.timing.signs(now))
            };
            let preferred = of_alg().any(|k| k.is_sep() == dnskey);
            out.extend(of_alg().filter(|k| !preferred || k.is_sep() == dnskey));
        }
        out
    }
}

/// The signing state a front end shares: the keys in use (swapped whole on SIGHUP), the
/// signature cache and the validity settings.
pub struct Signing {
    keys: ArcSwapOption<KeySet>,
    /// Whether any zone has keys (what the fast path asks, once a batch).
    on: AtomicBool,
    pub cache: SignatureCache,
    pub validity: Validity,
    rng: SystemRandom,
}

impl Default for Signing {
    fn default() -> Self {
        Signing::new(None, Validity::default(), 64)
    }
}

impl Signing {
    pub fn new(keys: Option<KeySet>, validity: Validity, cache_entries: usize) -> Signing {
        let s = Signing {
            keys: ArcSwapOption::empty(),
            on: AtomicBool::new(false),
            cache: SignatureCache::new(cache_entries),
            validity,
            rng: SystemRandom::new(),
        };
        s.replace(keys);
        s
    }

    /// Whether any zone is signed.
    #[inline]
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The keys in use.
    pub fn keys(&self) -> Option<Arc<KeySet>> {
        if !self.is_on() {
            return None;
        }
        self.keys.load_full()
    }

    /// Puts `keys` in use (`None` or an empty set: unsigned). The signature cache is emptied:
    /// a new key may have an old one's tag and algorithm, which the cache's entries name.
    pub fn replace(&self, keys: Option<KeySet>) {
        let keys = keys.filter(|k| k.keys().next().is_some());
        self.on.store(keys.is_some(), Ordering::Relaxed);
        self.keys.store(keys.map(Arc::new));
        self.cache.clear();
    }

    /// `section` with each RRset (a run of records of one owner, type and class) followed by
    /// its RRSIGs by `zone`'s signers at `now`.
    pub fn signed_section(&self, zone: &ZoneKeys, section: Vec<Record>, now: u64) -> Vec<Record> {
        self.signed_as(zone, section, None, now)
    }

    /// [`Signing::signed_section`], each RRset signed as the wildcard's RRset it was
    /// synthesized from when `wildcard` gives that wildcard's labels (RFC 4035 §5.3.4: the
    /// RRSIG's Labels field is the wildcard's, its signature over `*.<encloser>`), so one
    /// signature serves every name the wildcard answers with the same records.
    pub fn signed_as(
        &self,
        zone: &ZoneKeys,
        section: Vec<Record>,
        wildcard: Option<u8>,
        now: u64,
    ) -> Vec<Record> {
        let mut out = Vec::with_capacity(section.len() * 2);
        let mut start = 0;
        while start < section.len() {
            let first = &section[start];
            let end = section[start..]
                .iter()
                .position(|r| {
                    r.record_type() != first.record_type()
                        || r.dns_class != first.dns_class
                        || r.name != first.name
                })
                .map_or(section.len(), |n| start + n);
            let rrset = &section[start..end];
            out.extend_from_slice(rrset);
            self.sign_rrset(zone, rrset, wildcard, now, &mut out);
            start = end;
        }
        out
    }

    /// Appends the RRSIGs of `rrset` (one owner, type, class; the first record's TTL) to
    /// `out`, from the cache or made now; as the RRset of the wildcard of `wildcard` labels
    /// above it when given ([`Signing::signed_as`]).
    fn sign_rrset(
        &self,
        zone: &ZoneKeys,
        rrset: &[Record],
        wildcard: Option<u8>,
        now: u64,
        out: &mut Vec<Record>,
    ) {
        let Some(first) = rrset.first() else { return };
        let rtype = first.record_type();
        let star = wildcard
            .filter(|&l| l < first.name.num_labels())
            .and_then(|l| first.name.trim_to(usize::from(l)).prepend_label("*").ok());
        let as_star: Vec<Record>;
        let refs: Vec<&Record> = match &star {
            Some(star) => {
                as_star = rrset
                    .iter()
                    .map(|r| {
                        let mut r = r.clone();
                        r.name = star.clone();
                        r
                    })
                    .collect();
                as_star.iter().collect()
            }
            None => rrset.iter().collect(),
        };
        let owner = star.as_ref().unwrap_or(&first.name);
        let Some(body) = sign::canonical_rrset(&refs) else {
            tracing::debug!(owner = %first.name, %rtype, "an RRset that cannot be encoded is not signed");
            return;
        };
        let window = self.validity.window(now);
        for key in zone.signers(now, rtype == RecordType::DNSKEY) {
            let header = RrsigHeader {
                covered: rtype,
                algorithm: key.algorithm.number(),
                owner,
                original_ttl: first.ttl,
                window,
                key_tag: key.tag,
                signer: &zone.apex,
            }
            .to_bytes();
            let mut signed = header.clone();
            signed.extend_from_slice(&body);
            let Some(signature) = self
                .cache
                .get_or_sign(&signed, || key.sign(&self.rng, &signed))
            else {
                tracing::warn!(
                    key = key.tag,
                    "signing failed; the RRset goes without this key's RRSIG"
                );
                continue;
            };
            let mut rdata = header;
            rdata.extend_from_slice(&signature);
            out.push(sign::raw_record(
                first.name.clone(),
                first.ttl,
                first.dns_class,
                RecordType::RRSIG,
                rdata,
            ));
        }
    }

    /// The RRSIGs' RDATA (each as `out` gets it) of the RRset of `rdatas` (each a record's
    /// RDATA, in canonical form: addresses) at `owner` (wire form, lower case, `labels`
    /// labels), type `rtype`, class IN, TTL `ttl`, by `zone`'s signers at `now`: for the fast
    /// path, which writes the records itself (`crate::wire`). The same signatures as
    /// [`Signing::signed_section`] makes for the same RRset (the same cache entries).
    #[allow(clippy::too_many_arguments)]
    pub fn rrsig_rdatas(
        &self,
        zone: &ZoneKeys,
        owner: &[u8],
        labels: u8,
        rtype: u16,
        ttl: u32,
        rdatas: &mut [&[u8]],
        now: u64,
        mut out: impl FnMut(&[u8]),
    ) {
        rdatas.sort_unstable();
        let mut body = Vec::with_capacity(rdatas.len() * (owner.len() + 26));
        let mut last: Option<&[u8]> = None;
        for rdata in rdatas.iter() {
            if last == Some(rdata) {
                continue; // RFC 4034 §6.3: duplicates are not signed
            }
            last = Some(rdata);
            body.extend_from_slice(owner);
            body.extend_from_slice(&rtype.to_be_bytes());
            body.extend_from_slice(&1u16.to_be_bytes());
            body.extend_from_slice(&ttl.to_be_bytes());
            body.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            body.extend_from_slice(rdata);
        }
        let window = self.validity.window(now);
        let signer = &zone.apex_wire;
        // What is signed, then (cut after the RRSIG's fields) the RRSIG's RDATA: one buffer.
        let mut signed = Vec::with_capacity(18 + signer.len() + body.len().max(64));
        for key in zone.signers(now, false) {
            signed.clear();
            signed.extend_from_slice(&rtype.to_be_bytes());
            signed.push(key.algorithm.number());
            signed.push(labels);
            signed.extend_from_slice(&ttl.to_be_bytes());
            signed.extend_from_slice(&window.expiration.to_be_bytes());
            signed.extend_from_slice(&window.inception.to_be_bytes());
            signed.extend_from_slice(&key.tag.to_be_bytes());
            signed.extend_from_slice(signer);
            let fields = signed.len();
            signed.extend_from_slice(&body);
            let Some(signature) = self
                .cache
                .get_or_sign(&signed, || key.sign(&self.rng, &signed))
            else {
                continue;
            };
            signed.truncate(fields);
            signed.extend_from_slice(&signature);
            out(&signed);
        }
    }

    /// The NSEC of a wildcard answer for `qname` and its RRSIGs ([`sign::white_lie`]), TTL
    /// `ttl`; `None` when there is no white lie to tell (the answer is then signed at its
    /// name).
    pub fn wildcard_proof(
        &self,
        zone: &ZoneKeys,
        qname: &Name,
        ttl: u32,
        now: u64,
    ) -> Option<Vec<Record>> {
        let (owner, rdata) = sign::white_lie(&sign::wire_name(qname))?;
        let owner = sign::name_of_wire(&owner)?;
        let nsec = sign::raw_record(owner, ttl, DNSClass::IN, RecordType::NSEC, rdata);
        Some(self.signed_section(zone, vec![nsec], now))
    }

    /// The compact denial (RFC 9824) for `owner`: its NSEC (types `types` with RRSIG and NSEC,
    /// TTL `ttl`) and the NSEC's RRSIGs.
    pub fn denial(
        &self,
        zone: &ZoneKeys,
        owner: &Name,
        types: &[u16],
        ttl: u32,
        now: u64,
    ) -> Vec<Record> {
        let nsec = sign::raw_record(
            owner.clone(),
            ttl,
            DNSClass::IN,
            RecordType::NSEC,
            sign::compact_nsec_rdata(owner, types),
        );
        self.signed_section(zone, vec![nsec], now)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::Ipv4Addr;
    use std::path::Path;

    use hickory_server::proto::rr::rdata::A;
    use hickory_server::proto::rr::RData;
    use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ED25519};

    use super::keys::tests::{key, ECDSA_KSK, ED25519_ZSK};
    use super::*;

    pub(crate) fn zone_config(apex: &str) -> ZoneConfig {
        let name = |s: &str| Name::from_ascii(s).expect("a name");
        ZoneConfig {
            apex: name(apex),
            nameservers: vec![name(&format!("ns1.{apex}"))],
            hostmaster: name(&format!("hostmaster.{apex}")),
        }
    }

    /// An Ed25519 CSK of `zone` (flags 257) made from a fixed seed, as a key set for the zones
    /// `zones`.
    pub(crate) fn ed25519_csk(zone: &str, zones: &[ZoneConfig]) -> KeySet {
        use base64::Engine as _;
        use ring::signature::KeyPair as _;
        let seed = [7u8; 32];
        let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).expect("a pair");
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let key = format!(
            "{zone} IN DNSKEY 257 3 15 {}\n",
            b64(pair.public_key().as_ref())
        );
        let private = format!(
            "Private-key-format: v1.3\nAlgorithm: 15 (ED25519)\nPrivateKey: {}\n",
            b64(&seed)
        );
        let key = Key::from_texts(Path::new("Ktest"), &key, &private).expect("a key");
        KeySet::from_keys(vec![key], zones).expect("a set")
    }

    /// The test keys of `cdn.example.`: the ECDSA KSK and the Ed25519 ZSK.
    pub(crate) fn key_set() -> KeySet {
        KeySet::from_keys(
            vec![key(ECDSA_KSK), key(ED25519_ZSK)],
            &[zone_config("other.example."), zone_config("cdn.example.")],
        )
        .expect("a valid set")
    }

    /// Checks `rrsig` over `rrset` with `key`'s public key, as a validator does: the RRSIG's
    /// fields, then the RRset in canonical form.
    pub(crate) fn verifies(key: &Key, rrsig: &Record, rrset: &[&Record]) -> bool {
        let RData::Unknown { rdata, .. } = &rrsig.data else {
            return false;
        };
        let bytes = &rdata.anything;
        let split = bytes.len() - 64;
        let mut signed = bytes[..split].to_vec();
        signed.extend_from_slice(&sign::canonical_rrset(rrset).expect("encoded"));
        let (alg, public): (&dyn ring::signature::VerificationAlgorithm, Vec<u8>) =
            match key.algorithm {
                Algorithm::EcdsaP256Sha256 => {
                    (&ECDSA_P256_SHA256_FIXED, [&[4u8][..], &key.public].concat())
                }
                Algorithm::Ed25519 => (&ED25519, key.public.clone()),
            };
        UnparsedPublicKey::new(alg, public)
            .verify(&signed, &bytes[split..])
            .is_ok()
    }

    fn tag_of(rrsig: &Record) -> u16 {
        let RData::Unknown { rdata, .. } = &rrsig.data else {
            return 0;
        };
        u16::from_be_bytes([rdata.anything[16], rdata.anything[17]])
    }

    /// Keys go to their zone by the DNSKEY's owner; a key of a zone not served, or given
    /// twice, is refused naming its entry.
    #[test]
    fn keys_go_to_their_zones() {
        let set = key_set();
        assert!(set.zone(0).is_none());
        let z = set.zone(1).expect("cdn.example. is signed");
        assert_eq!(z.apex_text, "cdn.example.");
        assert_eq!(set.summary(), "cdn.example.: 34532/13 KSK, 7284/15 ZSK");
        let e = KeySet::from_keys(vec![key(ECDSA_KSK)], &[zone_config("other.example.")])
            .expect_err("not served");
        assert_eq!(e.key, "dnssec_keys[0]");
        assert!(
            e.problem
                .contains("zone cdn.example. is not one of the zones"),
            "{e}"
        );
        let e = KeySet::from_keys(
            vec![key(ECDSA_KSK), key(ECDSA_KSK)],
            &[zone_config("cdn.example.")],
        )
        .expect_err("twice");
        assert_eq!(e.key, "dnssec_keys[1]");
        let e = KeySet::load(
            &[PathBuf::from("/nonexistent/K")],
            &[zone_config("cdn.example.")],
        )
        .expect_err("no file");
        assert!(
            e.to_string()
                .starts_with("dnssec_keys[0]: /nonexistent/K.key: cannot be read"),
            "{e}"
        );
    }

    /// An A RRset is signed by the ZSK of each algorithm (here the KSK too: it is the only key
    /// of algorithm 13), the DNSKEY RRset by the KSK of each; every RRSIG verifies over its
    /// RRset; the second answer's signatures come from the cache.
    #[test]
    fn rrsets_are_signed_by_the_right_keys_and_verify() {
        let set = key_set();
        let z = set.zone(1).expect("signed");
        let signing = Signing::new(None, Validity::default(), 1024);
        let now = 1_796_653_289 + 60;
        let owner = Name::from_ascii("www.cdn.example.").expect("a name");
        let a = |o| Record::from_rdata(owner.clone(), 20, RData::A(A(Ipv4Addr::new(192, 0, 2, o))));
        let section = vec![a(1), a(2)];
        let signed = signing.signed_section(z, section.clone(), now);
        assert_eq!(signed.len(), 4, "{signed:?}");
        let rrset: Vec<&Record> = section.iter().collect();
        let tags: Vec<u16> = signed[2..].iter().map(tag_of).collect();
        assert_eq!(
            tags,
            [34532, 7284],
            "one per algorithm: the CSK of 13, the ZSK of 15"
        );
        for (sig, k) in signed[2..].iter().zip(&z.keys) {
            assert_eq!(sig.record_type(), RecordType::RRSIG);
            assert!(verifies(k, sig, &rrset), "{k:?}");
        }
        let again = signing.signed_section(z, section, now);
        assert_eq!(again, signed, "the cached signatures");
        assert_eq!(signing.cache.stats(), (2, 2));
        let dnskeys = z.dnskey_rrset(now);
        assert_eq!(dnskeys.len(), 2);
        let signed = signing.signed_section(z, dnskeys.clone(), now);
        let sigs: Vec<&Record> = signed
            .iter()
            .filter(|r| r.record_type() == RecordType::RRSIG)
            .collect();
        assert_eq!(
            sigs.iter().map(|s| tag_of(s)).collect::<Vec<_>>(),
            [34532, 7284]
        );
        let rrset: Vec<&Record> = dnskeys.iter().collect();
        assert!(verifies(&z.keys[0], sigs[0], &rrset));
        assert!(verifies(&z.keys[1], sigs[1], &rrset));
    }

    /// A key whose `Activate` is to come is in the DNSKEY RRset and does not sign.
    #[test]
    fn a_key_not_active_yet_is_published_and_does_not_sign() {
        let (base, k, p) = ED25519_ZSK;
        let later = p.replace("Activate: 20261207142129", "Activate: 20271207142129");
        let next = Key::from_texts(Path::new(base), k, &later).expect("a key");
        let mut set = KeySet::from_keys(vec![key(ECDSA_KSK), next], &[zone_config("cdn.example.")])
            .expect("a set");
        let z = set.zones[0].take().expect("signed");
        let now = 1_796_653_289 + 60;
        assert_eq!(z.dnskey_rrset(now).len(), 2);
        let tags: Vec<u16> = z.signers(now, false).iter().map(|k| k.tag).collect();
        assert_eq!(tags, [34532]);
        let in_a_year = now + 366 * 86_400;
        let tags: Vec<u16> = z.signers(in_a_year, false).iter().map(|k| k.tag).collect();
        assert_eq!(tags, [34532, 7284]);
    }
}
