//! A response made secure (the hickory path's last step before encoding, `crate::answer`): the
//! DNSKEY RRset at a signed apex, and for a query with the DO bit every RRset signed and
//! negative answers denied by compact denial of existence (RFC 9824).

use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::{Name, RData, Record, RecordType};

use super::sign::TYPE_NXNAME;
use super::{Signing, ZoneKeys};
use crate::service::Services;
use crate::zonedata::StaticData;

/// The NSEC TTL when the authority section has no SOA (RFC 9077: the SOA's TTL and minimum,
/// the lesser; the zones' are 60).
pub const NSEC_TTL_DEFAULT: u32 = 60;

/// What the query asked and what is at its name.
pub struct Asked<'a> {
    /// The query's name (the NSEC's owner).
    pub qname: Name,
    /// Its text, lower case with the final dot.
    pub qname_text: &'a str,
    pub qtype: RecordType,
    /// Whether the query has the DO bit.
    pub dnssec_ok: bool,
    /// Whether a hostname rule of the map names it (it has A and AAAA).
    pub mapped: bool,
    /// When its answer is synthesized from a wildcard rule (`ClassRules::synthesized_from`):
    /// that wildcard's labels.
    pub wildcard: Option<u8>,
    /// The zones' static records.
    pub statics: &'a StaticData,
    /// The service bindings (HTTPS, SVCB) published at mapped names.
    pub services: &'a Services,
}

impl Asked<'_> {
    /// The labels of the wildcard the answer is signed as (a positive answer synthesized from
    /// a wildcard of `zone` at a name no static record makes exist), if any.
    fn signed_as_wildcard(&self, zone: &ZoneKeys) -> Option<u8> {
        signed_as_wildcard(self.wildcard, zone, self.statics, self.qname_text)
    }

    /// The types at the name (for a NODATA's NSEC): at an apex its SOA, NS, DNSKEY and static
    /// types; at a static name its types; at a mapped name A, AAAA and the service bindings
    /// published there (a validator may deny a type from a cached NSEC, RFC 8198); none at an
    /// empty non-terminal.
    fn types_here(&self, zone: &ZoneKeys) -> Vec<u16> {
        let mut types: Vec<u16> = Vec::new();
        if self.qname_text == zone.apex_text {
            types.extend([RecordType::SOA, RecordType::NS, RecordType::DNSKEY].map(u16::from));
        }
        if let Some(at) = self.statics.get(self.qname_text) {
            types.extend(at.records.iter().map(|r| u16::from(r.record_type())));
        } else if self.mapped {
            types.extend([RecordType::A, RecordType::AAAA].map(u16::from));
            for binding in [RecordType::SVCB, RecordType::HTTPS] {
                if self.services.publishes(self.qname_text, binding) {
                    types.push(u16::from(binding));
                }
            }
        }
        types.retain(|&t| t != u16::from(self.qtype));
        types
    }
}

/// The labels of the wildcard a positive answer at `qname` (lower case, final dot) is signed
/// as: `wildcard`'s (`ClassRules::synthesized_from`), when that wildcard is in `zone` and no
/// static record makes the name, or a name below it, exist. Both paths ask this.
pub fn signed_as_wildcard(
    wildcard: Option<u8>,
    zone: &ZoneKeys,
    statics: &StaticData,
    qname: &str,
) -> Option<u8> {
    wildcard.filter(|&l| {
        usize::from(l) >= usize::from(zone.apex.num_labels())
            && statics.get(qname).is_none()
            && !statics.is_between(qname)
    })
}

/// Makes the response to `asked` in `zone` secure at `now`: `code`, the answer section
/// `answer` and the authority section `authority` (the NS and SOA records) rewritten. A
/// DNSKEY query at the apex gets the DNSKEY RRset (with or without DO). With DO, every RRset
/// is followed by its RRSIGs; NXDOMAIN becomes NOERROR with the NSEC of compact denial (types
/// RRSIG, NSEC, NXNAME), NODATA gets the NSEC at the name listing the types there. Says
/// whether the response is signed (its OPT record then sets DO).
pub fn secure(
    signing: &Signing,
    zone: &ZoneKeys,
    asked: &Asked<'_>,
    code: &mut ResponseCode,
    answer: &mut Vec<Record>,
    authority: &mut Vec<Record>,
    now: u64,
) -> bool {
    let apex = asked.qname_text == zone.apex_text;
    if apex && asked.qtype == RecordType::DNSKEY && *code == ResponseCode::NoError {
        *answer = zone.dnskey_rrset(now);
        authority.clear();
    }
    if !asked.dnssec_ok {
        return false;
    }
    let nodata = *code == ResponseCode::NoError && answer.is_empty();
    let denial = match *code {
        ResponseCode::NXDomain => Some(vec![TYPE_NXNAME]),
        ResponseCode::NoError if nodata => Some(asked.types_here(zone)),
        ResponseCode::NoError => None,
        _ => return false,
    };
    *code = ResponseCode::NoError;
    let nsec_ttl = authority
        .iter()
        .find_map(|r| match &r.data {
            RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
            _ => None,
        })
        .unwrap_or(NSEC_TTL_DEFAULT);
    // At a name a wildcard answers, the NSEC that shows the name itself is not there (RFC
    // 4035 §3.1.3.3): beside the answer, signed as the wildcard's RRset; or, for NODATA,
    // beside the wildcard's own NSEC without the type asked (§3.1.3.4).
    let wildcard = asked
        .signed_as_wildcard(zone)
        .filter(|_| denial.is_none() || nodata)
        .and_then(|l| {
            let star = asked
                .qname
                .trim_to(usize::from(l))
                .prepend_label("*")
                .ok()?;
            let proof = signing.wildcard_proof(zone, &asked.qname, nsec_ttl, now)?;
            Some((l, star, proof))
        });
    let labels = wildcard.as_ref().map(|(l, ..)| *l);
    *answer = signing.signed_as(zone, std::mem::take(answer), labels, now);
    let mut signed = signing.signed_section(zone, std::mem::take(authority), now);
    match (denial, wildcard) {
        (Some(types), Some((_, star, proof))) => {
            signed.extend(proof);
            signed.extend(signing.denial(zone, &star, &types, nsec_ttl, now));
        }
        (Some(types), None) => {
            signed.extend(signing.denial(zone, &asked.qname, &types, nsec_ttl, now));
        }
        (None, Some((_, _, proof))) => signed.extend(proof),
        (None, None) => {}
    }
    *authority = signed;
    true
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use hickory_server::proto::rr::rdata::{A, SOA};

    use super::super::sign::Validity;
    use super::super::tests::{key_set, verifies};
    use super::*;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).expect("a name")
    }

    fn soa() -> Record {
        Record::from_rdata(
            name("cdn.example."),
            60,
            RData::SOA(SOA::new(
                name("ns1.cdn.example."),
                name("hostmaster.cdn.example."),
                7,
                3600,
                600,
                86_400,
                60,
            )),
        )
    }

    /// The time the tests sign at: inside the test keys' validity.
    const NOW: u64 = 1_796_653_289 + 60;

    fn signing() -> Signing {
        Signing::new(None, Validity::default(), 1024)
    }

    /// No service bindings.
    static NO_SERVICES: std::sync::LazyLock<Services> = std::sync::LazyLock::new(Services::default);

    fn asked<'a>(qname: &'a str, qtype: RecordType, statics: &'a StaticData) -> Asked<'a> {
        Asked {
            qname: name(qname),
            qname_text: qname,
            qtype,
            dnssec_ok: true,
            mapped: qname.starts_with("www."),
            wildcard: None,
            statics,
            services: &NO_SERVICES,
        }
    }

    /// The NSEC of a response's authority section: its owner's text, its next name's
    /// first label, and its types.
    fn nsec(authority: &[Record]) -> (String, Vec<u8>, Vec<u16>) {
        let r = authority
            .iter()
            .find(|r| r.record_type() == RecordType::NSEC)
            .expect("an NSEC");
        let RData::Unknown { rdata, .. } = &r.data else {
            panic!("{r:?}");
        };
        let bytes = &rdata.anything;
        let mut at = 0;
        while bytes[at] != 0 {
            at += usize::from(bytes[at]) + 1;
        }
        at += 1;
        let mut types = Vec::new();
        while at < bytes.len() {
            let (window, len) = (bytes[at], usize::from(bytes[at + 1]));
            for (i, b) in bytes[at + 2..at + 2 + len].iter().enumerate() {
                for bit in 0..8 {
                    if b & (0x80 >> bit) != 0 {
                        types.push(u16::from(window) << 8 | (i * 8 + bit) as u16);
                    }
                }
            }
            at += 2 + len;
        }
        (r.name.to_string(), bytes[..2].to_vec(), types)
    }

    /// The answer and authority sections of the NOERROR response to `q` with `answer` and
    /// `authority`, made secure by `signing` at `now`.
    fn secured(
        signing: &Signing,
        zone: &ZoneKeys,
        q: &Asked<'_>,
        (mut answer, mut authority): (Vec<Record>, Vec<Record>),
        now: u64,
    ) -> (Vec<Record>, Vec<Record>) {
        let mut code = ResponseCode::NoError;
        assert!(secure(
            signing,
            zone,
            q,
            &mut code,
            &mut answer,
            &mut authority,
            now
        ));
        assert_eq!(code, ResponseCode::NoError);
        (answer, authority)
    }

    /// A wildcard's answer is signed as `*.<encloser>` (Labels the encloser's), so two names
    /// it answers with the same records share the signature (one cache entry), and carries a
    /// signed NSEC covering the name; not so at a name a static record makes exist.
    #[test]
    fn wildcard_answers_share_the_wildcards_signature() {
        let (set, signing, now) = (key_set(), signing(), NOW);
        let zone = set.zone(1).expect("signed");
        let statics = StaticData::default();
        let address = |owner: &str| {
            Record::from_rdata(name(owner), 20, RData::A(A(Ipv4Addr::new(192, 0, 2, 1))))
        };
        let mut signatures = Vec::new();
        for qname in ["v1.cdn.example.", "v2.cdn.example."] {
            let q = Asked {
                wildcard: Some(2),
                ..asked(qname, RecordType::A, &statics)
            };
            let (answer, authority) =
                secured(&signing, zone, &q, (vec![address(qname)], Vec::new()), now);
            assert_eq!(answer[0].name, name(qname), "the records keep their owner");
            let rrsig = &answer[2];
            let RData::Unknown { rdata, .. } = &rrsig.data else {
                panic!("{rrsig:?}");
            };
            assert_eq!(rdata.anything[3], 2, "Labels: cdn.example");
            assert!(verifies(
                &zone.keys[1],
                rrsig,
                &[&address("*.cdn.example.")]
            ));
            signatures.push(rdata.anything.clone());
            let kinds: Vec<RecordType> = authority.iter().map(Record::record_type).collect();
            assert_eq!(
                kinds,
                [RecordType::NSEC, RecordType::RRSIG, RecordType::RRSIG]
            );
            assert_eq!(authority[0].ttl, NSEC_TTL_DEFAULT);
            assert!(verifies(&zone.keys[1], &authority[2], &[&authority[0]]));
        }
        assert_eq!(signatures[0], signatures[1], "one signature for both names");
        // NODATA at such a name: the white lie and the wildcard's own NSEC without the type.
        let mut wildcard_nsecs = Vec::new();
        for qname in ["v1.cdn.example.", "v2.cdn.example."] {
            let q = Asked {
                wildcard: Some(2),
                mapped: true,
                ..asked(qname, RecordType::TXT, &statics)
            };
            let (_, authority) = secured(&signing, zone, &q, (Vec::new(), vec![soa()]), now);
            let nsecs: Vec<&Record> = authority
                .iter()
                .filter(|r| r.record_type() == RecordType::NSEC)
                .collect();
            assert_eq!(nsecs.len(), 2, "{authority:?}");
            assert!(nsecs[0].name.to_ascii().ends_with(".cdn.example."));
            assert_eq!(nsecs[1].name, name("*.cdn.example."));
            assert_eq!(
                nsec(&authority[authority.len() - 3..]).2,
                [1, 28, 46, 47],
                "A AAAA"
            );
            let rrsig = &authority[authority.len() - 1];
            assert!(verifies(&zone.keys[1], rrsig, &[nsecs[1]]));
            wildcard_nsecs.push(rrsig.data.clone());
        }
        assert_eq!(
            wildcard_nsecs[0], wildcard_nsecs[1],
            "the wildcard's NSEC signed once"
        );
        // A static name under the wildcard: signed at its name.
        let statics = StaticData::build(
            &[crate::zonedata::ZoneConfig {
                apex: name("cdn.example."),
                nameservers: vec![name("ns.elsewhere.example.")],
                hostmaster: name("hostmaster.cdn.example."),
            }],
            &[crate::zonedata::RecordConfig {
                name: "_x.v1.cdn.example.".into(),
                rtype: "TXT".into(),
                data: "hi".into(),
                ttl: None,
            }],
        )
        .expect("a record");
        let q = Asked {
            wildcard: Some(2),
            ..asked("v1.cdn.example.", RecordType::A, &statics)
        };
        let (answer, authority) = secured(
            &signing,
            zone,
            &q,
            (vec![address("v1.cdn.example.")], Vec::new()),
            now,
        );
        assert!(verifies(&zone.keys[1], &answer[2], &[&answer[0]]));
        assert!(authority.is_empty());
    }

    /// NXDOMAIN becomes NOERROR with the SOA, one NSEC at the name (next `\000.<name>`, types
    /// RRSIG NSEC NXNAME), each signed and verifying; NODATA lists the types there but the one
    /// asked; an answer's RRsets are signed; without DO nothing changes but a DNSKEY query.
    #[test]
    fn answers_are_signed_and_denials_compact() {
        let (set, signing, now) = (key_set(), signing(), NOW);
        let zone = set.zone(1).expect("signed");
        let statics = StaticData::default();

        let mut code = ResponseCode::NXDomain;
        let (mut answer, mut authority) = (Vec::new(), vec![soa()]);
        let q = asked("nx.cdn.example.", RecordType::A, &statics);
        assert!(secure(
            &signing,
            zone,
            &q,
            &mut code,
            &mut answer,
            &mut authority,
            now
        ));
        assert_eq!(code, ResponseCode::NoError);
        assert!(answer.is_empty());
        let kinds: Vec<RecordType> = authority.iter().map(Record::record_type).collect();
        use RecordType::{NSEC, RRSIG, SOA as SOA_T};
        assert_eq!(kinds, [SOA_T, RRSIG, RRSIG, NSEC, RRSIG, RRSIG]);
        let (owner, next, types) = nsec(&authority);
        assert_eq!(
            (owner.as_str(), next.as_slice()),
            ("nx.cdn.example.", &[1u8, 0][..])
        );
        assert_eq!(types, [46, 47, 128]);
        assert_eq!(authority[3].ttl, 60);
        // The ZSK's signature over the NSEC verifies.
        assert!(verifies(&zone.keys[1], &authority[5], &[&authority[3]]));

        let mut code = ResponseCode::NoError;
        let (mut answer, mut authority) = (Vec::new(), vec![soa()]);
        let q = asked("www.cdn.example.", RecordType::AAAA, &statics);
        assert!(secure(
            &signing,
            zone,
            &q,
            &mut code,
            &mut answer,
            &mut authority,
            now
        ));
        assert_eq!(nsec(&authority).2, [1, 46, 47], "A, RRSIG, NSEC: not AAAA");
        // With an HTTPS binding published at the name, its NSEC says HTTPS is there: a
        // validator denying from a cached NSEC (RFC 8198) must not deny the binding.
        let zones = [crate::zonedata::ZoneConfig {
            apex: name("cdn.example."),
            nameservers: vec![name("ns1.cdn.example.")],
            hostmaster: name("hostmaster.cdn.example."),
        }];
        let binding = crate::service::ServiceConfig {
            name: "*.cdn.example.".into(),
            rtype: None,
            data: "1 . alpn=h2".into(),
        };
        let services = Services::build(&zones, &[binding]).expect("a binding");
        let q = Asked {
            services: &services,
            ..asked("www.cdn.example.", RecordType::TXT, &statics)
        };
        let (_, authority) = secured(&signing, zone, &q, (Vec::new(), vec![soa()]), now);
        assert_eq!(
            nsec(&authority).2,
            [1, 28, 46, 47, 65],
            "A AAAA RRSIG NSEC HTTPS"
        );
        let q = asked("cdn.example.", RecordType::TXT, &statics);
        let (_, authority) = secured(&signing, zone, &q, (Vec::new(), vec![soa()]), now);
        assert_eq!(
            nsec(&authority).2,
            [2, 6, 46, 47, 48],
            "NS SOA RRSIG NSEC DNSKEY"
        );

        let a = Record::from_rdata(
            name("www.cdn.example."),
            20,
            RData::A(A(Ipv4Addr::new(192, 0, 2, 1))),
        );
        let (mut answer, mut authority) = (vec![a.clone()], Vec::new());
        let q = asked("www.cdn.example.", RecordType::A, &statics);
        assert!(secure(
            &signing,
            zone,
            &q,
            &mut code,
            &mut answer,
            &mut authority,
            now
        ));
        assert_eq!(answer.len(), 3);
        assert!(verifies(&zone.keys[0], &answer[1], &[&a]));
        assert!(verifies(&zone.keys[1], &answer[2], &[&a]));

        let plain = Asked {
            dnssec_ok: false,
            ..asked("nx.cdn.example.", RecordType::A, &statics)
        };
        let mut code = ResponseCode::NXDomain;
        let (mut answer, mut authority) = (Vec::new(), vec![soa()]);
        assert!(!secure(
            &signing,
            zone,
            &plain,
            &mut code,
            &mut answer,
            &mut authority,
            now
        ));
        assert_eq!(
            (code, answer.len(), authority.len()),
            (ResponseCode::NXDomain, 0, 1)
        );
        let dnskey = Asked {
            dnssec_ok: false,
            ..asked("cdn.example.", RecordType::DNSKEY, &statics)
        };
        let mut code = ResponseCode::NoError;
        let (mut answer, mut authority) = (Vec::new(), vec![soa()]);
        secure(
            &signing,
            zone,
            &dnskey,
            &mut code,
            &mut answer,
            &mut authority,
            now,
        );
        assert_eq!(
            (answer.len(), authority.len()),
            (2, 0),
            "the DNSKEY RRset, unsigned"
        );
    }
}
