//! RRSIG, NSEC and DNSKEY records written by hand (RFC 4034), and what a signature covers: the
//! RRSIG RDATA before its signature followed by the RRset in canonical form and order (RFC 4034
//! §3.1.8.1, §6.2, §6.3): owner names in lower case, uncompressed; each record's RDATA in
//! canonical form (names in the types of §6.2 in lower case); records sorted by their RDATA.

use hickory_server::proto::rr::rdata::NULL;
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_server::proto::serialize::binary::{BinEncodable, BinEncoder};

/// RFC 9824's NXNAME meta-type, in the NSEC of an answer for a name that does not exist.
pub const TYPE_NXNAME: u16 = 128;

/// `name` in wire form, lower case, uncompressed.
pub fn wire_name(name: &Name) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + 2);
    for label in name.iter() {
        out.push(label.len() as u8);
        out.extend(label.iter().map(u8::to_ascii_lowercase));
    }
    out.push(0);
    out
}

/// The RRSIG Labels field of `owner` (RFC 4034 §3.1.3): its labels, without the root and a
/// leading `*`.
fn labels(owner: &Name) -> u8 {
    let n = owner.num_labels();
    if owner.is_wildcard() {
        n.saturating_sub(1)
    } else {
        n
    }
}

/// A validity window: the RRSIG's inception and expiration (RFC 4034 §3.1.5: seconds since
/// 1970 modulo 2^32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    pub inception: u32,
    pub expiration: u32,
}

/// How long signatures hold and how they are bucketed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// An RRSIG's expiration minus its inception.
    pub validity_secs: u32,
    /// How far before now an inception may be at the least (clocks of validators behind ours).
    pub inception_offset_secs: u32,
}

impl Default for Validity {
    fn default() -> Self {
        Validity {
            validity_secs: 7 * 86_400,
            inception_offset_secs: 3600,
        }
    }
}

impl Validity {
    /// The window of signatures made at `now` (Unix seconds). Windows are buckets a quarter of
    /// the validity long: the inception is `now - inception_offset_secs` rounded down to a
    /// multiple of a quarter of the validity, the expiration the validity after it. So every
    /// answer of a bucket carries the same window (the signature cache's hits), a signature is
    /// made again when the bucket moves, and one answered has at least three quarters of the
    /// validity less the offset left (config checks the offset is below half the validity).
    pub fn window(&self, now: u64) -> Window {
        let step = u64::from((self.validity_secs / 4).max(1));
        let start = now.saturating_sub(u64::from(self.inception_offset_secs));
        let inception = start - start % step;
        Window {
            inception: inception as u32,
            expiration: (inception + u64::from(self.validity_secs)) as u32,
        }
    }
}

/// The canonical form of a record's RDATA.
pub fn canonical_rdata(data: &RData) -> Option<Vec<u8>> {
    if let RData::Unknown { rdata, .. } = data {
        return Some(rdata.anything.to_vec());
    }
    let mut out = Vec::with_capacity(64);
    let mut encoder = BinEncoder::new(&mut out);
    encoder.set_canonical_form(true);
    data.emit(&mut encoder).ok()?;
    Some(out)
}

/// What a signature of an RRset covers besides the RRSIG's own fields: its records in
/// canonical form and order. `records` are one RRset (one owner, type, class and TTL).
pub fn canonical_rrset(records: &[&Record]) -> Option<Vec<u8>> {
    let first = records.first()?;
    let owner = wire_name(&first.name);
    let mut rdatas: Vec<Vec<u8>> = records
        .iter()
        .map(|r| canonical_rdata(&r.data))
        .collect::<Option<_>>()?;
    rdatas.sort_unstable();
    rdatas.dedup(); // RFC 4034 §6.3: duplicates are not signed
    let mut out = Vec::with_capacity(rdatas.iter().map(|r| owner.len() + 10 + r.len()).sum());
    for rdata in &rdatas {
        out.extend_from_slice(&owner);
        out.extend_from_slice(&u16::from(first.record_type()).to_be_bytes());
        out.extend_from_slice(&u16::from(first.dns_class).to_be_bytes());
        out.extend_from_slice(&first.ttl.to_be_bytes());
        out.extend_from_slice(&u16::try_from(rdata.len()).ok()?.to_be_bytes());
        out.extend_from_slice(rdata);
    }
    Some(out)
}

/// The fields of an RRSIG before its signature (RFC 4034 §3.1).
pub struct RrsigHeader<'a> {
    pub covered: RecordType,
    pub algorithm: u8,
    pub owner: &'a Name,
    pub original_ttl: u32,
    pub window: Window,
    pub key_tag: u16,
    pub signer: &'a Name,
}

impl RrsigHeader<'_> {
    /// Its wire form: the start of the RRSIG's RDATA and of what is signed.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(18 + self.signer.len() + 2 + 64);
        out.extend_from_slice(&u16::from(self.covered).to_be_bytes());
        out.push(self.algorithm);
        out.push(labels(self.owner));
        out.extend_from_slice(&self.original_ttl.to_be_bytes());
        out.extend_from_slice(&self.window.expiration.to_be_bytes());
        out.extend_from_slice(&self.window.inception.to_be_bytes());
        out.extend_from_slice(&self.key_tag.to_be_bytes());
        out.extend_from_slice(&wire_name(self.signer));
        out
    }
}

/// A record of a type hickory is not told about (RRSIG, NSEC, DNSKEY: written by hand).
pub fn raw_record(
    owner: Name,
    ttl: u32,
    class: DNSClass,
    code: RecordType,
    rdata: Vec<u8>,
) -> Record {
    let mut r = Record::from_rdata(
        owner,
        ttl,
        RData::Unknown {
            code,
            rdata: NULL::with(rdata),
        },
    );
    r.dns_class = class;
    r
}

/// The type bitmaps field of an NSEC record (RFC 4034 §4.1.2) holding `types`.
pub fn type_bitmaps(types: &[u16]) -> Vec<u8> {
    let mut types = types.to_vec();
    types.sort_unstable();
    types.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < types.len() {
        let window = (types[i] >> 8) as u8;
        let mut bits = [0u8; 32];
        let mut len = 0;
        while i < types.len() && (types[i] >> 8) as u8 == window {
            let low = (types[i] & 0xFF) as usize;
            bits[low / 8] |= 0x80 >> (low % 8);
            len = low / 8 + 1;
            i += 1;
        }
        out.push(window);
        out.push(len as u8);
        out.extend_from_slice(&bits[..len]);
    }
    out
}

/// The RDATA of the NSEC record of compact denial of existence (RFC 9824) at `owner`: the next
/// name `\000.<owner>` (the least name after it, so it covers no other name), and the types
/// `types` with RRSIG and NSEC.
pub fn compact_nsec_rdata(owner: &Name, types: &[u16]) -> Vec<u8> {
    let mut rdata = vec![1, 0];
    rdata.extend_from_slice(&wire_name(owner));
    let mut all = types.to_vec();
    all.extend([u16::from(RecordType::RRSIG), u16::from(RecordType::NSEC)]);
    rdata.extend_from_slice(&type_bitmaps(&all));
    rdata
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use hickory_server::proto::rr::rdata::{A, CNAME};

    use super::*;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).expect("a name")
    }

    /// The bitmap of RFC 4034 §4.3's example (A MX RRSIG NSEC TYPE1234), and RFC 9824's NSEC
    /// of a name that does not exist.
    #[test]
    fn bitmaps_are_written_as_the_rfcs_show() {
        let got = type_bitmaps(&[1, 15, 46, 47, 1234]);
        // Window 0: A, MX, RRSIG, NSEC in 6 bytes; window 4: type 1234 (low byte 210) in 27.
        let mut want = vec![0x00, 0x06, 0x40, 0x01, 0x00, 0x00, 0x00, 0x03, 0x04, 0x1b];
        want.extend([0; 26]);
        want.push(0x20);
        assert_eq!(got, want);
        let nsec = compact_nsec_rdata(&name("Nx.Cdn.Example."), &[TYPE_NXNAME]);
        let mut want = vec![1, 0, 2, b'n', b'x', 3, b'c', b'd', b'n', 7];
        want.extend_from_slice(b"example");
        want.extend_from_slice(&[0, 0, 17, 0, 0, 0, 0, 0, 0x03]);
        want.extend_from_slice(&[0; 10]);
        want.push(0x80);
        assert_eq!(nsec, want);
    }

    /// Records are sorted by their canonical RDATA, names in it lower case, duplicates dropped;
    /// the owner lower case.
    #[test]
    fn the_rrset_is_canonical() {
        let owner = name("WWW.cdn.example.");
        let a =
            |o: u8| Record::from_rdata(owner.clone(), 20, RData::A(A(Ipv4Addr::new(192, 0, 2, o))));
        let (r9, r1, r1b) = (a(9), a(1), a(1));
        let got = canonical_rrset(&[&r9, &r1, &r1b]).expect("encoded");
        let one = |o: u8| {
            let mut v = wire_name(&name("www.cdn.example."));
            v.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 20, 0, 4, 192, 0, 2, o]);
            v
        };
        assert_eq!(got, [one(1), one(9)].concat());
        let c = Record::from_rdata(
            owner.clone(),
            60,
            RData::CNAME(CNAME(name("Target.Example."))),
        );
        let got = canonical_rdata(&c.data).expect("encoded");
        assert_eq!(got, wire_name(&name("target.example.")));
    }

    /// Windows are quarter-validity buckets: every `now` of one bucket has the same window,
    /// the inception at least the offset before now, and at least 3/4 of the validity less
    /// the offset left.
    #[test]
    fn windows_are_buckets_with_validity_left() {
        let v = Validity::default();
        let w = v.window(1_796_653_289);
        let now = u64::from(w.inception) + u64::from(v.inception_offset_secs) + 10;
        assert_eq!(v.window(now), w);
        assert_eq!(w.inception % (v.validity_secs / 4), 0);
        assert_eq!(w.expiration - w.inception, v.validity_secs);
        for later in [now, now + 1, now + 3600] {
            let u = v.window(later);
            assert!(u64::from(u.inception) + u64::from(v.inception_offset_secs) <= later);
            let left = u64::from(u.expiration) - later;
            assert!(
                left >= u64::from(v.validity_secs) * 3 / 4 - u64::from(v.inception_offset_secs)
            );
        }
        assert_eq!(v.window(now + 60), w, "one bucket");
        assert_ne!(
            v.window(now + u64::from(v.validity_secs) / 4),
            w,
            "the next"
        );
    }
}
