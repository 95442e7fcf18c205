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
/// leading `*` (hickory's `num_labels` leaves both out).
fn labels(owner: &Name) -> u8 {
    owner.num_labels()
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

/// The owner and RDATA of the NSEC a wildcard answer carries (RFC 4035 §3.1.3.3: it shows the
/// query's name was not there, so the wildcard answered), made minimally covering (RFC 4470's
/// "white lies"): the owner just before `qname` (its first label's last octet one less, then
/// `\255`), the next name just after it and its descendants (its first label followed by
/// `\000`), types RRSIG and NSEC. So it covers the query's name and names no client asks for
/// (RFC 8198: a resolver may answer from a cached NSEC the names it covers), and its
/// signature depends on the name alone. Validators take the closest encloser to be the longer
/// ancestor the query's name shares with the owner or the next name (BIND's
/// `dns_nsec_noexistnodata`): both share the wildcard's, so the next name is not RFC 4470's
/// `\000.<qname>`, a descendant. `qname` in wire form, lower case. `None` when no owner can
/// be made before it (a first label of one `\000`) or a label or name would be too long:
/// the answer is then signed at the query's name.
pub fn white_lie(qname: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let len = usize::from(*qname.first()?);
    let (label, rest) = (qname.get(1..1 + len)?, qname.get(1 + len..)?);
    let (&last, head) = label.split_last()?;
    let mut first: Vec<u8> = head.to_vec();
    if last > 0 {
        // An upper-case letter sorts as its lower case (RFC 4034 §6.1): step below `A` then.
        let below = match last - 1 {
            b'A'..=b'Z' => b'@',
            b => b,
        };
        first.push(below);
        if label.len() < 63 && qname.len() < 255 {
            first.push(0xff);
        }
    }
    if first.is_empty() || label.len() >= 63 || qname.len() >= 255 {
        return None;
    }
    let mut owner = Vec::with_capacity(1 + first.len() + rest.len());
    owner.push(first.len() as u8);
    owner.extend_from_slice(&first);
    owner.extend_from_slice(rest);
    let mut rdata = Vec::with_capacity(1 + qname.len() + 8);
    rdata.push(label.len() as u8 + 1);
    rdata.extend_from_slice(label);
    rdata.push(0);
    rdata.extend_from_slice(rest);
    rdata.extend_from_slice(&type_bitmaps(&[
        u16::from(RecordType::RRSIG),
        u16::from(RecordType::NSEC),
    ]));
    Some((owner, rdata))
}

/// The name of `wire` (wire form, uncompressed; any octets in its labels).
pub fn name_of_wire(wire: &[u8]) -> Option<Name> {
    let mut labels = Vec::new();
    let mut at = 0;
    loop {
        let len = usize::from(*wire.get(at)?);
        if len == 0 {
            break;
        }
        labels.push(wire.get(at + 1..at + 1 + len)?);
        at += len + 1;
    }
    let mut name = Name::from_labels(labels).ok()?;
    name.set_fqdn(true);
    Some(name)
}

/// The number of labels of the name `wire` (wire form, uncompressed), without the root.
pub fn wire_labels(wire: &[u8]) -> u8 {
    let (mut at, mut n) = (0usize, 0u8);
    while let Some(&len) = wire.get(at) {
        if len == 0 {
            break;
        }
        at += usize::from(len) + 1;
        n = n.saturating_add(1);
    }
    n
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

    /// A white lie's owner sorts just before the name and its next name just after, in
    /// DNSSEC's order (RFC 4034 §6.1: labels from the right, octets compared in lower case),
    /// with nothing a hostname could be in between.
    #[test]
    fn white_lies_cover_the_name_alone() {
        let canonical = |wire: &[u8]| {
            let mut labels = Vec::new();
            let mut at = 0;
            while wire[at] != 0 {
                let l = usize::from(wire[at]);
                labels.push(wire[at + 1..at + 1 + l].to_ascii_lowercase());
                at += l + 1;
            }
            labels.reverse();
            labels
        };
        for q in [
            "v1.video.cdn.example.",
            "a.cdn.example.",
            "x-0.cdn.example.",
            "b.cdn.example.",
        ] {
            let qname = wire_name(&name(q));
            let (owner, rdata) = white_lie(&qname).expect("a white lie");
            let next = &rdata[..qname.len() + 1];
            assert!(canonical(&owner) < canonical(&qname), "{q}");
            assert!(canonical(&qname) < canonical(next), "{q}");
            // After the name's descendants, and sharing only the parent with it.
            let mut child = vec![1, 0];
            child.extend_from_slice(&qname);
            assert!(canonical(&child) < canonical(next), "{q}");
            assert_eq!(wire_labels(next), wire_labels(&qname));
            assert_eq!(
                canonical(next)[..],
                {
                    let mut c = canonical(&qname);
                    c.last_mut().expect("a label").push(0);
                    c
                }[..]
            );
            assert_eq!(&rdata[qname.len() + 1..], &type_bitmaps(&[46, 47])[..]);
            assert_eq!(wire_labels(&owner), wire_labels(&qname));
            // Any hostname of the same parent is outside the range.
            for other in ["v0.", "v10.", "w.", "a0.", "x-.", "z."] {
                let mut o = name(other).to_string();
                o.push_str(&q[q.find('.').expect("a dot") + 1..]);
                let o = canonical(&wire_name(&name(&o)));
                assert!(
                    o <= canonical(&owner) || o >= canonical(next) || o == canonical(&qname),
                    "{q}: {other}"
                );
            }
        }
        assert_eq!(
            white_lie(&wire_name(&name("v1.cdn.example."))).map(|(o, _)| o[..4].to_vec()),
            Some(vec![3, b'v', b'0', 0xff])
        );
        // `[` less one is `Z`, which sorts as `z`, after `[`: the owner steps to `@`.
        let bracket = [1, b'[', 3, b'c', b'o', b'm', 0];
        let (owner, _) = white_lie(&bracket).expect("a white lie");
        assert_eq!(owner[..3], [2, b'@', 0xff]);
        assert!(canonical(&owner) < canonical(&bracket));
        assert_eq!(white_lie(&[1, 0, 0]), None, "nothing before \\000");
        assert_eq!(white_lie(&[0]), None, "the root");
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
