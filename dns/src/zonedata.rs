//! Zone data beyond the map: the static records of the front end's configuration
//! (`[[records]]`), among them the addresses of the in-zone nameservers (the glue), built once
//! at start into a table both answering paths read.
//!
//! **Which names are static.** A name with records here is answered from them, before the
//! map is asked, on both paths (the fast path, `crate::wire`, gives such a name to the hickory
//! path, `crate::answer`): the map's names are decided by the hostname rules the mapper sends
//! with each version (`ClassRules::rule_class`: exact names and `*.` suffix patterns), which
//! the front end does not know at start, so a static name a rule also names cannot be refused
//! then; it is answered from its records (the operator's configuration is the more specific
//! statement), and the front end logs the names the rules of a new map also name
//! (`Front::put_view`).
//!
//! **What is answered** at a static name (below an apex; at the apex the SOA, NS and ANY
//! answers are the apex's, and the static types are answered beside them): the records of the
//! type asked; NODATA with the SOA when it has none of that type; a CNAME for every type but
//! ANY, followed through static names of the zones (at most [`MAX_CNAME_CHAIN`] links) with
//! their records of the type asked added to the answer section, as authoritative servers do;
//! one HINFO for ANY (RFC 8482, as at mapped names). The names between an apex and a static
//! name (empty non-terminals, such as `_tcp.cdn.example.` of `_sip._tcp.cdn.example.`) are
//! NODATA instead of NXDOMAIN when no rule names them (RFC 8020).
//!
//! **Checked at start**, each error naming the entry (`records[i]`), the record (its name and
//! type), its zone and what is wrong: names in a zone, no wildcard; a CNAME never beside other
//! data at a name, never at an apex, never two; data of the type (addresses, TXT up to
//! [`MAX_TXT_BYTES`] split into strings of 255 bytes, CAA `issue`/`issuewild`, MX, SRV); TTLs
//! within [`TTL_SECS`] (default [`DEFAULT_TTL`]), one for all the records of
//! a name and type (an RRset: RFC 2181 §5.2); no record twice; at most
//! [`MAX_STATIC_NAMES`] names, [`MAX_RECORDS_PER_NAME`] records a name. Once any record is
//! configured, every nameserver name inside its zone must have an address (A or AAAA), as a
//! delegation checker verifies; a configuration without records keeps working as before (the
//! front end logs the nameservers without an address).

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use hickory_server::proto::rr::rdata::caa::read_issuer;
use hickory_server::proto::rr::rdata::{A, AAAA, CAA, CNAME, MX, SRV, TXT};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use serde::Deserialize;

use cdnmap_serve::answer::{self, Place};

/// The TTLs a record may carry, in seconds (the answers' `ttl_secs` takes the same range).
pub const TTL_SECS: std::ops::RangeInclusive<u32> = 1..=86_400;

/// A zone as the front end serves it: its apex, NS names and SOA mailbox.
#[derive(Debug, Clone)]
pub struct ZoneConfig {
    pub apex: Name,
    pub nameservers: Vec<Name>,
    pub hostmaster: Name,
}

/// Why the zone data was refused: the configuration's key (`records[i]`, `zones[i]`) and what
/// is wrong, the record named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct ZoneDataError {
    pub key: String,
    pub problem: String,
}

/// Most static names (the glue included) over all zones.
pub const MAX_STATIC_NAMES: usize = 1024;
/// Most records at one name.
pub const MAX_RECORDS_PER_NAME: usize = 32;
/// Most entries in `[[records]]` (bounds the work of checking them).
pub const MAX_RECORDS: usize = MAX_STATIC_NAMES * 4;
/// The longest TXT data, bytes (split into strings of at most 255 bytes each).
pub const MAX_TXT_BYTES: usize = 2048;
/// Most CNAME links followed for an answer.
pub const MAX_CNAME_CHAIN: usize = 8;
/// A static record's TTL when it gives none (the NS records' floor too).
pub const DEFAULT_TTL: u32 = 3600;

/// One `[[records]]` entry of the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordConfig {
    /// `@` (the apex), a name relative to the apex (with a single zone), or a fully
    /// qualified name (a final dot) inside one of the zones.
    pub name: String,
    /// A, AAAA, TXT, CAA, MX, SRV or CNAME.
    #[serde(rename = "type")]
    pub rtype: String,
    /// The record's data in zone-file presentation (TXT: the text itself, unquoted).
    pub data: String,
    /// Seconds (default [`DEFAULT_TTL`]).
    pub ttl: Option<u32>,
}

/// The records of one static name.
#[derive(Debug, Clone)]
pub struct StaticName {
    /// The zone holding it.
    pub zone: usize,
    pub records: Vec<Record>,
}

impl StaticName {
    /// Its CNAME, if it is an alias.
    pub fn cname(&self) -> Option<&Name> {
        self.records.iter().find_map(|r| match &r.data {
            RData::CNAME(CNAME(t)) => Some(t),
            _ => None,
        })
    }
}

/// Every static name, by its text in lower case with the final dot (as hickory shows a
/// `LowerName`, and the fast path writes a query's name).
#[derive(Debug, Clone, Default)]
pub struct StaticData {
    names: HashMap<String, StaticName>,
    /// The empty non-terminals: names between an apex and a static name.
    between: HashSet<String>,
}

impl StaticData {
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// The records of `name` (lower case, final dot), if it is static.
    #[inline]
    pub fn get(&self, name: &str) -> Option<&StaticName> {
        if self.names.is_empty() {
            return None;
        }
        self.names.get(name)
    }

    /// Whether `name` (lower case, final dot) lies between an apex and a static name.
    pub fn is_between(&self, name: &str) -> bool {
        self.between.contains(name)
    }

    /// The static names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.names.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// The answer section for a query of `qtype` at static name `at`: its records of that
    /// type, or its CNAME followed by what the target's static records answer (a chain of at
    /// most [`MAX_CNAME_CHAIN`] links; a loop stops it). Empty: NODATA.
    pub fn answer(&self, at: &StaticName, qtype: RecordType) -> Vec<Record> {
        let mut out = Vec::new();
        let mut here = at;
        for _ in 0..MAX_CNAME_CHAIN {
            let Some(target) = here.cname() else {
                out.extend(
                    here.records
                        .iter()
                        .filter(|r| r.record_type() == qtype)
                        .cloned(),
                );
                return out;
            };
            out.extend(here.records.iter().cloned()); // the CNAME alone
            if qtype == RecordType::CNAME {
                return out;
            }
            let key = target.to_lowercase().to_ascii();
            match self.names.get(&key) {
                Some(next) if !out.iter().any(|r| r.name == next.records[0].name) => here = next,
                _ => return out,
            }
        }
        out
    }
}

/// The error for entry `i`, its record `name`/`rtype` in zone `zone`.
fn record_error(
    i: usize,
    name: &str,
    rtype: &str,
    zone: Option<&Name>,
    problem: String,
) -> ZoneDataError {
    let zone = zone.map_or(String::new(), |z| format!(" in zone {z}"));
    ZoneDataError {
        key: format!("records[{i}]"),
        problem: format!("{name} {rtype}{zone}: {problem}"),
    }
}

/// `text` as a domain name: fully qualified when it ends with a dot, else relative to `apex`
/// (`@`: the apex itself).
pub(crate) fn name_in(text: &str, apex: &Name) -> Result<Name, String> {
    if text == "@" {
        return Ok(apex.clone());
    }
    let name = Name::from_ascii(text).map_err(|e| format!("{text:?} is not a domain name: {e}"))?;
    let name = if text.ends_with('.') {
        name
    } else {
        name.append_domain(apex)
            .map_err(|e| format!("{text:?} below {apex}: {e}"))?
    };
    Ok(name.to_lowercase())
}

/// The whole numbers of `data`, split at whitespace, `n` of them then the rest.
fn fields(data: &str, n: usize) -> Result<(Vec<u16>, &str), String> {
    let mut rest = data.trim();
    let mut numbers = Vec::with_capacity(n);
    for _ in 0..n {
        let (word, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let v: u16 = word
            .parse()
            .map_err(|_| format!("{word:?} is not a number of 0 to 65535 (data {data:?})"))?;
        numbers.push(v);
        rest = after.trim_start();
    }
    Ok((numbers, rest.trim_end()))
}

/// A target name of the data (`data` for the error): one word, relative to `apex` unless it
/// ends with a dot.
fn target(word: &str, apex: &Name, data: &str) -> Result<Name, String> {
    if word.is_empty() || word.contains(char::is_whitespace) {
        return Err(format!("{data:?} must end with one domain name"));
    }
    name_in(word, apex)
}

/// TXT data as its strings: at most 255 bytes each, cut at character boundaries.
fn txt_strings(data: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in data.chars() {
        if current.len() + c.len_utf8() > 255 {
            out.push(std::mem::take(&mut current));
        }
        current.push(c);
    }
    if !current.is_empty() || out.is_empty() {
        out.push(current);
    }
    out
}

/// The record data of `rtype` from `data` (names in it relative to `apex`).
fn rdata(rtype: RecordType, data: &str, apex: &Name) -> Result<RData, String> {
    Ok(match rtype {
        RecordType::A => RData::A(A(data
            .trim()
            .parse::<Ipv4Addr>()
            .map_err(|_| format!("{data:?} is not an IPv4 address"))?)),
        RecordType::AAAA => RData::AAAA(AAAA(
            data.trim()
                .parse::<Ipv6Addr>()
                .map_err(|_| format!("{data:?} is not an IPv6 address"))?,
        )),
        RecordType::TXT => {
            if data.len() > MAX_TXT_BYTES {
                return Err(format!(
                    "{} bytes of text; at most {MAX_TXT_BYTES}",
                    data.len()
                ));
            }
            RData::TXT(TXT::new(txt_strings(data)))
        }
        RecordType::CAA => {
            let (flags, rest) = fields(data, 1)?;
            let (tag, value) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            let critical = match flags[0] {
                0 => false,
                128 => true,
                f => return Err(format!("flags {f}: 0, or 128 (critical)")),
            };
            if !matches!(tag, "issue" | "issuewild") {
                return Err(format!(
                    "tag {tag:?}: issue or issuewild (data such as `0 issue \"ca.example\"`)"
                ));
            }
            let (issuer, options) = read_issuer(value.as_bytes())
                .map_err(|e| format!("{value:?} is not an issuer value: {e}"))?;
            if tag == "issue" {
                RData::CAA(CAA::new_issue(critical, issuer, options))
            } else {
                RData::CAA(CAA::new_issuewild(critical, issuer, options))
            }
        }
        RecordType::MX => {
            let (n, rest) = fields(data, 1)?;
            RData::MX(MX::new(n[0], target(rest, apex, data)?))
        }
        RecordType::SRV => {
            let (n, rest) = fields(data, 3)?;
            RData::SRV(SRV::new(n[0], n[1], n[2], target(rest, apex, data)?))
        }
        RecordType::CNAME => RData::CNAME(CNAME(target(data.trim(), apex, data)?)),
        other => return Err(format!("type {other} is not served as a static record")),
    })
}

/// The types a static record may have.
const TYPES: [(&str, RecordType); 7] = [
    ("A", RecordType::A),
    ("AAAA", RecordType::AAAA),
    ("TXT", RecordType::TXT),
    ("CAA", RecordType::CAA),
    ("MX", RecordType::MX),
    ("SRV", RecordType::SRV),
    ("CNAME", RecordType::CNAME),
];

impl StaticData {
    /// The static records of `records` in `zones` (`zones_of`: where names fall among them),
    /// checked (module docs); the error names the entry, the record and its zone.
    pub fn build(
        zones: &[ZoneConfig],
        records: &[RecordConfig],
    ) -> Result<StaticData, ZoneDataError> {
        if records.len() > MAX_RECORDS {
            return Err(ZoneDataError {
                key: "records".into(),
                problem: format!("{} records; at most {MAX_RECORDS}", records.len()),
            });
        }
        let placement = answer::Zones::new(zones.iter().map(|z| z.apex.iter()));
        let mut data = StaticData::default();
        for (i, r) in records.iter().enumerate() {
            let (z, record) = parse_record(zones, &placement, r).map_err(|(zone, problem)| {
                record_error(i, &r.name, &r.rtype, zone.as_ref(), problem)
            })?;
            data.add(z, record, &zones[z].apex, &r.data)
                .map_err(|p| record_error(i, &r.name, &r.rtype, Some(&zones[z].apex), p))?;
        }
        for name in data.names.keys() {
            data.between.remove(name);
        }
        if !data.names.is_empty() {
            for (zi, z) in zones.iter().enumerate() {
                if let Some(ns) = unaddressed(z, &data).first() {
                    return Err(ZoneDataError {
                        key: format!("zones[{zi}]"),
                        problem: format!(
                            "{}: the nameserver {ns} is inside the zone but has no address: give it an A or AAAA record in [[records]]",
                            z.apex
                        ),
                    });
                }
            }
        }
        Ok(data)
    }

    /// Adds `record` of zone `z` (apex `apex`; its data as configured, `data`, for errors),
    /// checked against the records already at its name: the bounds, the same data twice, one
    /// TTL an RRset, a CNAME alone at a name.
    fn add(&mut self, z: usize, record: Record, apex: &Name, data: &str) -> Result<(), String> {
        let (name, rtype, ttl) = (record.name.clone(), record.record_type(), record.ttl);
        let key = name.to_ascii();
        if !self.names.contains_key(&key) && self.names.len() >= MAX_STATIC_NAMES {
            return Err(format!("more than {MAX_STATIC_NAMES} static names"));
        }
        let entry = self.names.entry(key).or_insert(StaticName {
            zone: z,
            records: Vec::new(),
        });
        if entry.records.len() >= MAX_RECORDS_PER_NAME {
            return Err(format!(
                "more than {MAX_RECORDS_PER_NAME} records at {name}"
            ));
        }
        if entry.records.iter().any(|o| o.data == record.data) {
            return Err(format!("{data:?} is given twice"));
        }
        if let Some(other) = entry
            .records
            .iter()
            .find(|o| o.record_type() == rtype && o.ttl != ttl)
        {
            return Err(format!(
                "ttl {ttl} differs from the other {rtype} records' at {name} ({}): one TTL an RRset (RFC 2181 §5.2)",
                other.ttl
            ));
        }
        let has_cname = entry.cname().is_some();
        if has_cname || (rtype == RecordType::CNAME && !entry.records.is_empty()) {
            return Err(format!(
                "a CNAME cannot be beside other data at {name} (RFC 1034 §3.6.2)"
            ));
        }
        entry.records.push(record);
        // The names between the apex and this one.
        let mut up = name.base_name();
        while up.num_labels() > apex.num_labels() {
            self.between.insert(up.to_ascii());
            up = up.base_name();
        }
        Ok(())
    }
}

/// The record `r` configures and the index of its zone among `zones` (`placement`: where
/// names fall among them): its type, name, TTL and data read and checked on their own. An
/// error says what is wrong, with the zone when the name is in one.
fn parse_record(
    zones: &[ZoneConfig],
    placement: &answer::Zones,
    r: &RecordConfig,
) -> Result<(usize, Record), (Option<Name>, String)> {
    let rtype = TYPES
        .iter()
        .find(|(t, _)| t.eq_ignore_ascii_case(&r.rtype))
        .map(|&(_, t)| t)
        .ok_or_else(|| {
            let types = "the type must be one of A, AAAA, TXT, CAA, MX, SRV, CNAME";
            (None, types.to_string())
        })?;
    let relative = r.name == "@" || !r.name.ends_with('.');
    if relative && zones.len() != 1 {
        return Err((
            None,
            format!(
                "a name relative to the apex needs exactly one zone ({} are served): write it fully qualified, with a final dot",
                zones.len()
            ),
        ));
    }
    let name = name_in(&r.name, &zones[0].apex).map_err(|e| (None, e))?;
    let labels: Vec<&[u8]> = name.iter().collect();
    let z = match placement.place(labels.len(), labels.iter().copied()) {
        Place::Apex(z) | Place::Below(Some(z)) => z,
        _ => return Err((None, format!("{name} is in none of the zones"))),
    };
    let apex = &zones[z].apex;
    let err = |problem: String| (Some(apex.clone()), problem);
    if name.is_wildcard() || name.iter().any(|l| l == b"*") {
        return Err(err("wildcard names are not served".into()));
    }
    if rtype == RecordType::CNAME && &name == apex {
        return Err(err(
            "a CNAME at the apex would hide its SOA and NS records".into()
        ));
    }
    let ttl = r.ttl.unwrap_or(DEFAULT_TTL);
    if !TTL_SECS.contains(&ttl) {
        return Err(err(format!("ttl {ttl} is outside {TTL_SECS:?}")));
    }
    let rd = rdata(rtype, &r.data, apex).map_err(err)?;
    Ok((z, Record::from_rdata(name, ttl, rd)))
}

/// The nameservers of zone `z` inside it without an A or AAAA record in `data`.
pub fn unaddressed<'z>(z: &'z ZoneConfig, data: &StaticData) -> Vec<&'z Name> {
    z.nameservers
        .iter()
        .filter(|ns| z.apex.zone_of(ns))
        .filter(|ns| {
            !data
                .names
                .get(&ns.to_lowercase().to_ascii())
                .is_some_and(|s| {
                    s.records
                        .iter()
                        .any(|r| matches!(r.record_type(), RecordType::A | RecordType::AAAA))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DnsConfig;

    /// One zone `cdn.example.` with `ns1` and `ns2` in it, and these records after the glue.
    fn config(records: &str) -> String {
        format!(
            "zones = [\"cdn.example.\"]\nnameservers = [\"ns1.cdn.example.\", \"ns2.cdn.example.\"]\n\
             [[records]]\nname = \"ns1\"\ntype = \"A\"\ndata = \"192.0.2.53\"\n\
             [[records]]\nname = \"ns2.cdn.example.\"\ntype = \"AAAA\"\ndata = \"2001:db8::53\"\n{records}"
        )
    }

    fn record(name: &str, rtype: &str, data: &str) -> String {
        format!("[[records]]\nname = {name:?}\ntype = {rtype:?}\ndata = {data:?}\n")
    }

    fn build(text: &str) -> Result<StaticData, String> {
        let c = DnsConfig::from_toml(text).map_err(|e| e.to_string())?;
        c.static_data().map_err(|e| e.to_string())
    }

    /// Every refusal, with its exact text: the entry, the record's name and type, its zone.
    #[test]
    fn bad_records_are_refused_naming_the_entry_the_record_and_the_zone() {
        let long_txt = "x".repeat(MAX_TXT_BYTES + 1);
        let cases: Vec<(String, &str)> = vec![
            (
                config(&record("www", "HINFO", "a b")),
                "records[2]: www HINFO: the type must be one of A, AAAA, TXT, CAA, MX, SRV, CNAME",
            ),
            (
                config(&record("www.other.test.", "A", "192.0.2.1")),
                "records[2]: www.other.test. A: www.other.test. is in none of the zones",
            ),
            (
                config(&record("a..b", "A", "192.0.2.1")),
                "records[2]: a..b A: \"a..b\" is not a domain name: Malformed label: ",
            ),
            (
                config(&record("*.w", "A", "192.0.2.1")),
                "records[2]: *.w A in zone cdn.example.: wildcard names are not served",
            ),
            (
                config(&record("@", "CNAME", "www.example.org.")),
                "records[2]: @ CNAME in zone cdn.example.: a CNAME at the apex would hide its SOA and NS records",
            ),
            (
                config(&format!(
                    "{}{}",
                    record("docs", "TXT", "hello"),
                    record("docs", "CNAME", "www.example.org.")
                )),
                "records[3]: docs CNAME in zone cdn.example.: a CNAME cannot be beside other data at docs.cdn.example. (RFC 1034 §3.6.2)",
            ),
            (
                config(&format!(
                    "{}{}",
                    record("docs", "CNAME", "www.example.org."),
                    record("docs", "A", "192.0.2.1")
                )),
                "records[3]: docs A in zone cdn.example.: a CNAME cannot be beside other data at docs.cdn.example. (RFC 1034 §3.6.2)",
            ),
            (
                config(&record("ns1", "A", "192.0.2.53")),
                "records[2]: ns1 A in zone cdn.example.: \"192.0.2.53\" is given twice",
            ),
            (
                config(&record("www", "A", "192.0.2.300")),
                "records[2]: www A in zone cdn.example.: \"192.0.2.300\" is not an IPv4 address",
            ),
            (
                config(&record("www", "AAAA", "192.0.2.1")),
                "records[2]: www AAAA in zone cdn.example.: \"192.0.2.1\" is not an IPv6 address",
            ),
            (
                config(&record("www", "TXT", &long_txt)),
                "records[2]: www TXT in zone cdn.example.: 2049 bytes of text; at most 2048",
            ),
            (
                config(&record("@", "CAA", "1 issue \"ca.example\"")),
                "records[2]: @ CAA in zone cdn.example.: flags 1: 0, or 128 (critical)",
            ),
            (
                config(&record("@", "CAA", "0 iodef \"mailto:a@b\"")),
                "records[2]: @ CAA in zone cdn.example.: tag \"iodef\": issue or issuewild (data such as `0 issue \"ca.example\"`)",
            ),
            (
                config(&record("@", "MX", "ten mail")),
                "records[2]: @ MX in zone cdn.example.: \"ten\" is not a number of 0 to 65535 (data \"ten mail\")",
            ),
            (
                config(&record("@", "MX", "10 mail other")),
                "records[2]: @ MX in zone cdn.example.: \"10 mail other\" must end with one domain name",
            ),
            (
                config(&record("_sip._tcp", "SRV", "0 5 sip")),
                "records[2]: _sip._tcp SRV in zone cdn.example.: \"sip\" is not a number of 0 to 65535 (data \"0 5 sip\")",
            ),
            (
                config("[[records]]\nname = \"www\"\ntype = \"A\"\ndata = \"192.0.2.1\"\nttl = 0\n"),
                "records[2]: www A in zone cdn.example.: ttl 0 is outside 1..=86400",
            ),
            (
                config("[[records]]\nname = \"ns1\"\ntype = \"A\"\ndata = \"192.0.2.1\"\nttl = 60\n"),
                "records[2]: ns1 A in zone cdn.example.: ttl 60 differs from the other A records' at ns1.cdn.example. (3600): one TTL an RRset (RFC 2181 §5.2)",
            ),
            (
                config("[[records]]\nname = \"www\"\ntype = \"A\"\ndata = \"192.0.2.1\"\nclass = \"IN\"\n"),
                "unknown field `class`",
            ),
            (
                format!(
                    "zones = [\"a.example.\", \"b.example.\"]\n{}",
                    record("www", "A", "192.0.2.1")
                ),
                "records[0]: www A: a name relative to the apex needs exactly one zone (2 are served): write it fully qualified, with a final dot",
            ),
            // Glue: an in-zone nameserver without an address, once records are given.
            (
                format!(
                    "zones = [\"cdn.example.\"]\nnameservers = [\"ns1.cdn.example.\", \"ns.other.test.\"]\n{}",
                    record("@", "TXT", "hello")
                ),
                "zones[0]: cdn.example.: the nameserver ns1.cdn.example. is inside the zone but has no address: give it an A or AAAA record in [[records]]",
            ),
            (
                format!(
                    "zones = [\"cdn.example.\"]\n{}",
                    record("ns1", "CNAME", "host.other.test.")
                ),
                "zones[0]: cdn.example.: the nameserver ns1.cdn.example. is inside the zone but has no address: give it an A or AAAA record in [[records]]",
            ),
        ];
        for (text, want) in cases {
            let e = build(&text).expect_err(&text);
            assert!(
                e.starts_with(want) || (want.starts_with("unknown") && e.contains(want)),
                "{text}\n got: {e}\nwant: {want}"
            );
        }
        // The bounds: records a name.
        let many: String = (0..=MAX_RECORDS_PER_NAME)
            .map(|i| record("www", "A", &format!("192.0.2.{i}")))
            .collect();
        assert_eq!(
            build(&config(&many)).expect_err("too many"),
            "records[34]: www A in zone cdn.example.: more than 32 records at www.cdn.example."
        );
        // Without records, an in-zone nameserver without an address is what it was (warned).
        assert!(build("nameservers = [\"ns1.cdn.example.\"]").is_ok());
    }

    /// The records built: names in lower case, relative names and data below the apex, TXT
    /// cut into strings of 255 bytes, the default TTL; empty non-terminals; CNAME chains.
    #[test]
    fn records_are_built_and_answered_by_type() {
        let text = config(&format!(
            "{}{}{}{}{}{}{}",
            record("@", "TXT", &"é".repeat(200)),
            record("@", "CAA", "128 issue \"ca.example\""),
            record("@", "MX", "10 mail"),
            record("_SIP._tcp", "SRV", "0 5 5060 sip.cdn.example."),
            record("docs", "CNAME", "alias"),
            record("alias", "CNAME", "ns1"),
            record("loop", "CNAME", "loop"),
        ));
        let data = build(&text).expect("valid");
        assert_eq!(
            data.names(),
            [
                "_sip._tcp.cdn.example.",
                "alias.cdn.example.",
                "cdn.example.",
                "docs.cdn.example.",
                "loop.cdn.example.",
                "ns1.cdn.example.",
                "ns2.cdn.example."
            ]
        );
        assert!(data.is_between("_tcp.cdn.example."));
        assert!(!data.is_between("cdn.example.") && !data.is_between("ns1.cdn.example."));
        let apex = data.get("cdn.example.").expect("the apex");
        let txt = data.answer(apex, RecordType::TXT);
        let RData::TXT(t) = &txt[0].data else {
            panic!("{txt:?}")
        };
        let lens: Vec<usize> = t.txt_data.iter().map(|s| s.len()).collect();
        assert_eq!(lens, [254, 146], "400 bytes of two-byte characters");
        assert_eq!(txt[0].ttl, DEFAULT_TTL);
        let mx = data.answer(apex, RecordType::MX);
        assert_eq!(mx[0].data.to_string(), "10 mail.cdn.example.");
        assert!(data.answer(apex, RecordType::A).is_empty(), "NODATA");
        let docs = data.get("docs.cdn.example.").expect("docs");
        let chain: Vec<String> = data
            .answer(docs, RecordType::A)
            .iter()
            .map(|r| format!("{} {}", r.name, r.data))
            .collect();
        assert_eq!(
            chain,
            [
                "docs.cdn.example. alias.cdn.example.",
                "alias.cdn.example. ns1.cdn.example.",
                "ns1.cdn.example. 192.0.2.53"
            ]
        );
        assert_eq!(data.answer(docs, RecordType::CNAME).len(), 1);
        assert_eq!(
            data.answer(docs, RecordType::TXT).len(),
            2,
            "the chain, no TXT"
        );
        let looped = data.get("loop.cdn.example.").expect("loop");
        assert_eq!(data.answer(looped, RecordType::A).len(), 1, "a loop stops");
    }

    /// Whatever a record's name and data hold, it is built or refused with an error naming its
    /// entry: never a panic (a fuzz target: its inputs in `cargo test` are random for a
    /// second, `cdnmap_tests::fuzz`).
    #[test]
    fn any_record_is_built_or_refused_never_a_panic() {
        let zones = DnsConfig::default().zones().expect("zones");
        bolero::check!()
            .with_type::<(u8, String, String, Option<u32>)>()
            .for_each(|(t, name, data, ttl)| {
                let r = RecordConfig {
                    name: name.clone(),
                    rtype: TYPES[usize::from(*t) % TYPES.len()].0.to_string(),
                    data: data.clone(),
                    ttl: *ttl,
                };
                let glue = RecordConfig {
                    name: "ns1".into(),
                    rtype: "A".into(),
                    data: "192.0.2.53".into(),
                    ttl: None,
                };
                if let Err(e) = StaticData::build(&zones, &[glue, r]) {
                    let e = e.to_string();
                    assert!(
                        e.starts_with("records[1]: ") || e.starts_with("zones[0]: "),
                        "{e}"
                    );
                }
            });
    }

    /// The example of docs/dns.md's "Zone data" is valid.
    #[test]
    fn the_documented_zone_data_example_is_valid() {
        let doc = include_str!("../../docs/dns.md");
        let section = doc
            .split("## Zone data")
            .nth(1)
            .and_then(|s| s.split("```toml\n").nth(1))
            .and_then(|s| s.split("```").next())
            .expect("the example");
        let data = build(section).expect("the documented example");
        assert_eq!(data.len(), 5);
    }
}
