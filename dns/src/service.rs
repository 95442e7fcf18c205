//! Service bindings (RFC 9460) for the map's names: the HTTPS and SVCB records of the front
//! end's configuration (`[[services]]`), whose `ipv4hint` and `ipv6hint` are the addresses the
//! same client gets for A and AAAA at that moment.
//!
//! **Why hints from the map.** A browser that asks for HTTPS beside A and AAAA may connect to
//! a hint before the address answers arrive (RFC 9460 §7.3). Hints written in a zone file
//! point at fixed servers; here they are the map's decision for the client's unit (the same
//! lookup, the same selector pick, the same ECS scope: `cdnmap_serve::answer`'s
//! `QType::Service`), so a client that follows them lands where the allocation put it. No
//! peer keeps hints consistent with a capacity-aware map.
//!
//! **Configuration.** Each entry names the mapped names it is published at (one name, or
//! `*.` and a suffix for every name below it), its type (HTTPS, the default, or SVCB) and its
//! data in presentation format without hints (`1 . alpn=h3,h2`). A name's records are its
//! exact entries of the type asked, else those of the longest matching suffix. Hints are added
//! to records in service mode (priority above 0) whose target is `.` (the owner itself, whose
//! addresses the map decides); an alias (priority 0) or another target carries none (hints
//! must be the target's addresses). Their TTL is the answers' (`ttl_secs`), since the hints
//! follow the map.
//!
//! **Checked at start and on SIGHUP**, each error naming the entry (`services[i]`): the name
//! below a zone's apex, the type, the data as hickory's presentation parser reads it, no
//! `ipv4hint`/`ipv6hint` (they come from the map), no key twice, every `mandatory` key
//! present, an alias without parameters; at most [`MAX_SERVICES`] entries of at most
//! [`MAX_SERVICE_DATA`] bytes of data each. On the wire the parameters are written in
//! increasing key order, as RFC 9460 §2.2 requires.

use std::net::IpAddr;

use hickory_server::proto::rr::rdata::svcb::{IpHint, SvcParamKey, SvcParamValue, SVCB};
use hickory_server::proto::rr::rdata::{A, AAAA, HTTPS};
use hickory_server::proto::rr::{LowerName, Name, RData, Record, RecordType};
use serde::Deserialize;

use cdnmap_serve::answer::{self, Place};

use crate::zonedata::{name_in, ZoneConfig, ZoneDataError};

/// Most `[[services]]` entries.
pub const MAX_SERVICES: usize = 256;
/// The longest data of one entry, bytes (an `ech` configuration list is the large part).
pub const MAX_SERVICE_DATA: usize = 4096;

/// One `[[services]]` entry of the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// A mapped name, or `*.` and a suffix for every name below it: fully qualified (a final
    /// dot) or relative to the apex (with a single zone).
    pub name: String,
    /// HTTPS (default) or SVCB.
    #[serde(rename = "type", default)]
    pub rtype: Option<String>,
    /// `SvcPriority TargetName SvcParams...` in presentation format, without hints.
    pub data: String,
}

/// One binding as built: where it is published, its type, its record data without hints.
#[derive(Debug, Clone)]
struct Binding {
    /// The name, lower case with the final dot, or the suffix (with its leading dot) of a
    /// `*.` pattern.
    at: String,
    wildcard: bool,
    rtype: RecordType,
    svcb: SVCB,
    /// Service mode with the owner as target: the map's addresses are its hints.
    hinted: bool,
}

/// The configuration's bindings, checked.
#[derive(Debug, Clone, Default)]
pub struct Services {
    bindings: Vec<Binding>,
}

/// The record type of a binding query: HTTPS (65) or SVCB (64).
pub fn is_binding_type(rtype: RecordType) -> bool {
    matches!(rtype, RecordType::HTTPS | RecordType::SVCB)
}

impl Services {
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    /// The bindings of `rtype` published at `name` (lower case, final dot): its exact
    /// entries, else those of the longest `*.` suffix it falls below.
    fn matching<'s>(
        &'s self,
        name: &'s str,
        rtype: RecordType,
    ) -> impl Iterator<Item = &'s Binding> + 's {
        let of_type = self.bindings.iter().filter(move |b| b.rtype == rtype);
        let exact = of_type.clone().any(|b| !b.wildcard && b.at == name);
        let suffix = if exact {
            None
        } else {
            of_type
                .clone()
                .filter(|b| b.wildcard && below(name, &b.at))
                .map(|b| b.at.len())
                .max()
        };
        of_type.filter(move |b| match suffix {
            None => exact && !b.wildcard && b.at == name,
            Some(len) => b.wildcard && b.at.len() == len && below(name, &b.at),
        })
    }

    /// Whether a binding of `rtype` is published at `name` (lower case, final dot).
    pub fn publishes(&self, name: &str, rtype: RecordType) -> bool {
        !self.bindings.is_empty() && self.matching(name, rtype).next().is_some()
    }

    /// The answer section for a query of `rtype` at `name`, the map's addresses `hints`
    /// (IPv4 and IPv6, as `cdnmap_serve::answer` decided them) added where they belong, each
    /// record with TTL `ttl`.
    pub fn answer(
        &self,
        name: &LowerName,
        rtype: RecordType,
        hints: &[IpAddr],
        ttl: u32,
    ) -> Vec<Record> {
        let text = name.to_string();
        let owner: Name = name.into();
        self.matching(&text, rtype)
            .map(|b| {
                let mut svcb = b.svcb.clone();
                if b.hinted {
                    add_hints(&mut svcb, hints);
                }
                let rdata = match b.rtype {
                    RecordType::SVCB => RData::SVCB(svcb),
                    _ => RData::HTTPS(HTTPS(svcb)),
                };
                Record::from_rdata(owner.clone(), ttl, rdata)
            })
            .collect()
    }

    /// The bindings of `entries` for `zones`, checked (module docs); the error names the entry.
    pub fn build(
        zones: &[ZoneConfig],
        entries: &[ServiceConfig],
    ) -> Result<Services, ZoneDataError> {
        if entries.len() > MAX_SERVICES {
            return Err(ZoneDataError {
                key: "services".into(),
                problem: format!("{} entries; at most {MAX_SERVICES}", entries.len()),
            });
        }
        let placement = answer::Zones::new(zones.iter().map(|z| z.apex.iter()));
        let mut bindings = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let err = |problem: String| ZoneDataError {
                key: format!("services[{i}]"),
                problem: format!(
                    "{} {}: {problem}",
                    e.name,
                    e.rtype.as_deref().unwrap_or("HTTPS")
                ),
            };
            bindings.push(binding(zones, &placement, e).map_err(err)?);
        }
        Ok(Services { bindings })
    }
}

/// Whether `name` lies strictly below `suffix` (with its leading dot), ASCII case ignored.
fn below(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len()
        && name
            .get(name.len() - suffix.len()..)
            .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
}

/// One entry, checked.
fn binding(
    zones: &[ZoneConfig],
    placement: &answer::Zones,
    e: &ServiceConfig,
) -> Result<Binding, String> {
    let rtype = match e.rtype.as_deref() {
        None => RecordType::HTTPS,
        Some(t) if t.eq_ignore_ascii_case("HTTPS") => RecordType::HTTPS,
        Some(t) if t.eq_ignore_ascii_case("SVCB") => RecordType::SVCB,
        Some(_) => return Err("the type must be HTTPS or SVCB".into()),
    };
    let relative = !e.name.ends_with('.');
    if relative && zones.len() != 1 {
        return Err(format!(
            "a name relative to the apex needs exactly one zone ({} are served): write it fully qualified, with a final dot",
            zones.len()
        ));
    }
    let zone = zones.first().ok_or("no zones are served")?;
    let (wildcard, bare) = match e.name.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, e.name.as_str()),
    };
    if bare.contains('*') {
        return Err("only a leading `*.` may stand for the names below a suffix".into());
    }
    let name = name_in(bare, &zone.apex)?;
    let labels: Vec<&[u8]> = name.iter().collect();
    match (
        placement.place(labels.len(), labels.iter().copied()),
        wildcard,
    ) {
        (Place::Below(Some(_)), _) | (Place::Apex(_), true) => {}
        (Place::Apex(_), false) => {
            return Err("an apex is no mapped name (its answers are the zone's SOA and NS)".into())
        }
        _ => return Err(format!("{name} is in none of the zones")),
    }
    if e.data.len() > MAX_SERVICE_DATA {
        return Err(format!(
            "{} bytes of data; at most {MAX_SERVICE_DATA}",
            e.data.len()
        ));
    }
    let svcb = match RData::try_from_str(rtype, &e.data) {
        Ok(RData::HTTPS(HTTPS(s))) | Ok(RData::SVCB(s)) => s,
        Ok(_) => return Err(format!("{:?} is not {rtype} data", e.data)),
        Err(err) => return Err(format!("{:?} is not {rtype} data: {err}", e.data)),
    };
    let svcb = checked(svcb, &e.data)?;
    let hinted = svcb.svc_priority > 0 && svcb.target_name.is_root();
    let at = name.to_ascii();
    let at = if wildcard { format!(".{at}") } else { at };
    Ok(Binding {
        at,
        wildcard,
        rtype,
        svcb,
        hinted,
    })
}

/// `svcb` (read from `data`) with its parameters in increasing key order, refused when it
/// carries hints, a key twice, a mandatory key it lacks, or parameters in alias mode.
fn checked(svcb: SVCB, data: &str) -> Result<SVCB, String> {
    let mut params = svcb.svc_params.clone();
    if svcb.svc_priority == 0 && !params.is_empty() {
        return Err(format!(
            "{data:?}: an alias (priority 0) takes no parameters (RFC 9460 §2.4.2)"
        ));
    }
    for (key, _) in &params {
        if matches!(key, SvcParamKey::Ipv4Hint | SvcParamKey::Ipv6Hint) {
            return Err(format!(
                "{data:?}: ipv4hint and ipv6hint come from the map (the addresses the client gets for A and AAAA); leave them out"
            ));
        }
    }
    params.sort_by_key(|(k, _)| u16::from(*k));
    if let Some(w) = params.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!("{data:?}: {} is given twice", w[0].0));
    }
    for (_, value) in &params {
        if let SvcParamValue::Mandatory(m) = value {
            for k in &m.0 {
                if !params.iter().any(|(have, _)| have == k) {
                    return Err(format!("{data:?}: mandatory lists {k}, which is not given"));
                }
            }
        }
    }
    Ok(SVCB::new(svcb.svc_priority, svcb.target_name, params))
}

/// `svcb`'s parameters with `hints` added as `ipv4hint` and `ipv6hint` (each only when there
/// is an address of its family), kept in increasing key order.
fn add_hints(svcb: &mut SVCB, hints: &[IpAddr]) {
    let v4: Vec<A> = hints
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(a) => Some(A(*a)),
            IpAddr::V6(_) => None,
        })
        .collect();
    let v6: Vec<AAAA> = hints
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(a) => Some(AAAA(*a)),
            IpAddr::V4(_) => None,
        })
        .collect();
    let params = &mut svcb.svc_params;
    if !v4.is_empty() {
        params.push((SvcParamKey::Ipv4Hint, SvcParamValue::Ipv4Hint(IpHint(v4))));
    }
    if !v6.is_empty() {
        params.push((SvcParamKey::Ipv6Hint, SvcParamValue::Ipv6Hint(IpHint(v6))));
    }
    params.sort_by_key(|(k, _)| u16::from(*k));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zones() -> Vec<ZoneConfig> {
        let apex = Name::from_ascii("cdn.example.").expect("a name");
        vec![ZoneConfig {
            nameservers: vec![Name::from_ascii("ns1.cdn.example.").expect("a name")],
            hostmaster: Name::from_ascii("hostmaster.cdn.example.").expect("a name"),
            apex,
        }]
    }

    fn entry(name: &str, rtype: Option<&str>, data: &str) -> ServiceConfig {
        ServiceConfig {
            name: name.into(),
            rtype: rtype.map(str::to_string),
            data: data.into(),
        }
    }

    fn build(entries: &[ServiceConfig]) -> Result<Services, String> {
        Services::build(&zones(), entries).map_err(|e| e.to_string())
    }

    /// Record data as presentation text, without the trailing commas and quotes hickory's
    /// display writes after lists (dig reads the wire form in the end-to-end test).
    fn shown(data: &RData) -> String {
        data.to_string()
            .replace(", ", " ")
            .trim_end_matches(',')
            .replace('"', "")
    }

    #[test]
    fn bad_entries_are_refused_naming_the_entry() {
        let cases: &[(ServiceConfig, &str)] = &[
            (
                entry("www", Some("MX"), "1 . alpn=h2"),
                "services[0]: www MX: the type must be HTTPS or SVCB",
            ),
            (entry("@", None, "1 . alpn=h2"), "an apex is no mapped name"),
            (
                entry("www.other.test.", None, "1 ."),
                "in none of the zones",
            ),
            (
                entry("a.*.cdn.example.", None, "1 ."),
                "only a leading `*.`",
            ),
            (entry("www", None, "x . alpn=h2"), "is not HTTPS data"),
            (
                entry("www", None, "1 . ipv4hint=192.0.2.1"),
                "come from the map",
            ),
            (
                entry("www", None, "0 other.example. alpn=h2"),
                "an alias (priority 0) takes no parameters",
            ),
            (
                entry("www", None, "1 . mandatory=port alpn=h2"),
                "mandatory lists port",
            ),
            (entry("www", None, "1 . alpn=h2 alpn=h3"), "given twice"),
            (
                entry("www", None, &format!("1 . ech={}", "A".repeat(5000))),
                "bytes of data",
            ),
        ];
        for (e, want) in cases {
            let got = build(std::slice::from_ref(e)).expect_err(want);
            assert!(got.contains(want), "{e:?}: {got}");
            assert!(got.starts_with("services[0]: "), "{got}");
        }
        let many = vec![entry("www", None, "1 ."); MAX_SERVICES + 1];
        assert!(build(&many)
            .expect_err("too many")
            .starts_with("services: "));
    }

    #[test]
    fn names_take_their_exact_entries_else_the_longest_suffix() {
        let s = build(&[
            entry("*.cdn.example.", None, "1 . alpn=h2"),
            entry("*.video", None, "1 . alpn=h3,h2"),
            entry("*.video", None, "2 . alpn=h2 port=8443"),
            entry("live.video", None, "1 . alpn=h3"),
            entry("www", Some("svcb"), "1 . alpn=h2"),
        ])
        .expect("valid");
        let priorities = |name: &str, rtype| -> Vec<(u16, String)> {
            let name = LowerName::from(Name::from_ascii(name).expect("a name"));
            s.answer(&name, rtype, &[], 20)
                .iter()
                .map(|r| match &r.data {
                    RData::HTTPS(HTTPS(b)) | RData::SVCB(b) => (b.svc_priority, shown(&r.data)),
                    _ => panic!("not a binding: {r:?}"),
                })
                .collect()
        };
        assert_eq!(
            priorities("a.video.cdn.example.", RecordType::HTTPS).len(),
            2
        );
        assert_eq!(
            priorities("live.video.cdn.example.", RecordType::HTTPS),
            vec![(1, "1 . alpn=h3".to_string())]
        );
        assert_eq!(
            priorities("www.cdn.example.", RecordType::HTTPS).len(),
            1,
            "*.cdn.example."
        );
        assert_eq!(priorities("www.cdn.example.", RecordType::SVCB).len(), 1);
        assert!(priorities("www.cdn.example.", RecordType::SVCB)[0]
            .1
            .contains("alpn=h2"));
        assert!(!s.publishes("a.other.test.", RecordType::HTTPS));
        assert!(
            !s.publishes("cdn.example.", RecordType::HTTPS),
            "only below the suffix"
        );
        assert!(!s.publishes("x.video.cdn.example.", RecordType::SVCB));
    }

    #[test]
    fn hints_are_added_in_key_order_to_service_mode_records_of_the_owner() {
        let s = build(&[
            entry("a", None, "1 . ech=AEj+DQBEAQAgACBY port=8443 alpn=h3,h2"),
            entry("b", None, "0 a.cdn.example."),
            entry("c", None, "1 other.example. alpn=h2"),
        ])
        .expect("valid");
        let hints: Vec<IpAddr> = ["192.0.2.1", "192.0.2.2", "2001:db8::1"]
            .iter()
            .map(|a| a.parse().expect("an address"))
            .collect();
        let answer = |name: &str| {
            let name = LowerName::from(Name::from_ascii(name).expect("a name"));
            let records = s.answer(&name, RecordType::HTTPS, &hints, 20);
            assert_eq!(records.len(), 1);
            assert_eq!(records[0].ttl, 20);
            shown(&records[0].data)
        };
        assert_eq!(
            answer("a.cdn.example."),
            "1 . alpn=h3,h2 port=8443 ipv4hint=192.0.2.1,192.0.2.2 ech=AEj+DQBEAQAgACBY ipv6hint=2001:db8::1"
        );
        assert_eq!(answer("b.cdn.example."), "0 a.cdn.example.");
        assert_eq!(answer("c.cdn.example."), "1 other.example. alpn=h2");
    }
}
