//! Answering one DNS query from the local map (hickory's `RequestHandler`).
//!
//! What a query is answered with is decided by `cdnmap_serve::answer` (the one decision the
//! fast path, `crate::wire`, and the mapper's `Resolve` make too): REFUSED outside the zones,
//! SOA and NS at an apex, NXDOMAIN for names no hostname rule names, A/AAAA from the map (the
//! client subnet of the query's EDNS Client Subnet option, else the resolver's address) with
//! the ECS option echoed with the answer's scope, NODATA with the SOA for other types,
//! SERVFAIL before the first map (its module docs have the whole order). A name with static
//! records (`crate::zonedata`: the glue, TXT, CAA, MX, SRV, CNAME) is answered from them once
//! the checks before the map's pass (EDNS version, class, transfers, ECS), map or no map; the
//! names between an apex and a static name are NODATA where the map says NXDOMAIN. Here the
//! query is read out of hickory's `Request` (`read`), the decision encoded as hickory's
//! records (`reply`), its demand and outcome counted, and the reply sent. Before the decision,
//! anything but a standard query is NOTIMP and not exactly one question FORMERR.
//!
//! Truncation is hickory's: a UDP response larger than the smaller of the client's EDNS buffer
//! and `max_udp_payload` (512 bytes without EDNS) is cut with TC set, and the client asks again
//! over TCP.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, MessageType, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption, NSIDPayload};
use hickory_server::proto::rr::rdata::{A, AAAA, CNAME, HINFO, TXT};
use hickory_server::proto::rr::{DNSClass, LowerName, Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use ipnet::IpNet;

use cdnmap_serve::answer::{self, Authority, Decision, Ecs, Place, QType, Rcode, Records};

use crate::cookie::Checked;

use super::front::{Front, Scratch, Zones, SCRATCH};
use super::local::Live;

/// hickory's handler over a shared [`Front`].
#[derive(Clone)]
pub struct Handler(pub Arc<Front>);

fn metadata(request: &Request, code: ResponseCode, authoritative: bool) -> Metadata {
    let mut m = Metadata::response_from_request(&request.metadata);
    m.message_type = MessageType::Response;
    m.authoritative = authoritative;
    m.response_code = code;
    m
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let front = &self.0;
        let builder = MessageResponseBuilder::from_message_request(request);
        let send = |code: ResponseCode| metadata(request, code, false);
        let result = if request.metadata.op_code != OpCode::Query
            || request.metadata.message_type != MessageType::Query
        {
            front.counters.notimp.increment(1);
            response
                .send_response(builder.build_no_records(send(ResponseCode::NotImp)))
                .await
        } else if request.queries.queries().is_empty() && request_cookie(request).is_some() {
            // RFC 7873 §5.4: a query for a server cookie alone.
            let reply = cookie_only(front, request);
            send_reply(request, response.clone(), &reply).await
        } else if request.queries.queries().len() != 1 {
            front.counters.formerr.increment(1);
            response
                .send_response(builder.build_no_records(send(ResponseCode::FormErr)))
                .await
        } else {
            let reply = decide_and_count(front, request);
            send_reply(request, response.clone(), &reply).await
        };
        match result {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "sending a DNS response failed");
                metrics::counter!("cdnmap_dns_send_errors_total").increment(1);
                hickory_server::proto::op::Header {
                    metadata: metadata(request, ResponseCode::ServFail, false),
                    counts: Default::default(),
                }
                .into()
            }
        }
    }
}

/// The data of a request's COOKIE option, in EDNS version 0.
fn request_cookie(request: &Request) -> Option<&[u8]> {
    let edns = request.edns.as_ref().filter(|e| e.version() == 0)?;
    match edns.option(EdnsCode::Cookie)? {
        EdnsOption::Unknown(_, data) => Some(data),
        _ => None,
    }
}

/// The reply to a query with no question and a COOKIE option (RFC 7873 §5.4: "querying for a
/// server cookie"): NOERROR, no records, the cookie option with a server cookie; FORMERR when
/// the option is malformed.
fn cookie_only<'f>(front: &'f Front, request: &Request) -> Reply<'f> {
    let cookies = &front.cookies;
    let checked =
        request_cookie(request).map(|data| cookies.check(data, request.src().ip(), cookies.now()));
    let Some(Checked::Good { reply: option, .. }) = checked else {
        front.counters.formerr.increment(1);
        return Reply {
            code: ResponseCode::FormErr,
            bare: true,
            records: Vec::new(),
            ns: &[],
            soa: Vec::new(),
            edns: None,
        };
    };
    let mut edns = Edns::new();
    let asked = request.edns.as_ref().map_or(512, Edns::max_payload);
    edns.set_max_payload(asked.clamp(512, front.max_udp_payload));
    edns.set_version(0);
    let code = crate::cookie::OPTION_COOKIE;
    edns.options_mut()
        .insert(EdnsOption::Unknown(code, option.to_vec()));
    front.counters.nodata().increment(1);
    Reply {
        code: ResponseCode::NoError,
        bare: false,
        records: Vec::new(),
        ns: &[],
        soa: Vec::new(),
        edns: Some(edns),
    }
}

/// The client subnet a query's ECS option carries (`Err` when it is malformed: FORMERR).
/// `octets_ok` is what the query's wire bytes say of its address octets
/// (`wire::ecs_octets_ok`: hickory drops octets beyond the prefix unseen).
fn client_subnet(edns: Option<&Edns>, octets_ok: bool) -> Result<Option<ClientSubnet>, ()> {
    let Some(EdnsOption::Subnet(ecs)) = edns.and_then(|e| e.option(EdnsCode::Subnet)) else {
        return Ok(None);
    };
    if !octets_ok {
        return Err(()); // RFC 7871 §6: too many address octets, or bits set beyond the prefix
    }
    let bits = if ecs.addr().is_ipv4() { 32 } else { 128 };
    if ecs.source_prefix() > bits || ecs.scope_prefix() != 0 {
        return Err(()); // RFC 7871 §7.1.1: a query's scope must be 0
    }
    // RFC 7871 §6: address bits beyond the source prefix length must be zero; a server
    // receiving one set returns FORMERR.
    let truncated = IpNet::new(ecs.addr(), ecs.source_prefix()).map(|n| n.trunc().addr());
    if truncated != Ok(ecs.addr()) {
        return Err(());
    }
    Ok(Some(*ecs))
}

/// The TTL of the HINFO record an ANY query gets (RFC 8482 §6: a long one, so that resolvers
/// keep it and do not ask again; 3789 s is the RFC's own example).
const ANY_HINFO_TTL: u32 = 3789;

/// The parsed query, as hickory's `Request` holds it.
struct Parsed<'q> {
    pub name: &'q LowerName,
    pub class: DNSClass,
    pub qtype: RecordType,
    pub edns: Option<&'q Edns>,
    /// Whether the query's ECS option has exactly the address octets its prefix needs, none
    /// with a bit beyond it, as its wire bytes say (`wire::ecs_octets_ok`).
    pub ecs_octets_ok: bool,
    /// The resolver's address (the client when the query carries no ECS option).
    pub src: IpAddr,
}

/// What a reply is encoded with besides the decision: the zones' records, the answers' TTL
/// and our UDP buffer size.
struct Source<'a> {
    pub zones: &'a Zones,
    /// The front end's name: NSID's and CHAOS `id.server`'s answer.
    pub identity: &'a str,
    pub ttl: u32,
    pub max_udp_payload: u16,
    /// The server cookies' secrets and clock (`crate::cookie`).
    pub cookies: &'a crate::cookie::Cookies,
}

/// A decision in hickory's records.
#[derive(Debug)]
struct Reply<'a> {
    pub code: ResponseCode,
    /// Bare (REFUSED, FORMERR, SERVFAIL): no records, no OPT record, not authoritative.
    pub bare: bool,
    pub records: Vec<Record>,
    /// The authority section's NS records (with the apex SOA).
    pub ns: &'a [Record],
    /// The authority section's SOA (negative answers), else empty.
    pub soa: Vec<Record>,
    /// The response's OPT record (when the query had one), with the ECS option echoed.
    pub edns: Option<Edns>,
}

/// The place of hickory's name among the zones, from its labels.
fn place(zones: &answer::Zones, name: &LowerName) -> Place {
    // A name has at most 127 labels (255 bytes).
    let mut labels: [&[u8]; 128] = [&[]; 128];
    let mut n = 0;
    for (slot, label) in labels.iter_mut().zip(name.iter()) {
        *slot = label;
        n += 1;
    }
    zones.place(n, labels[..n].iter().copied())
}

/// The decision for `q` from `live` (`None` before the first map), and its reply, with the
/// query's COOKIE option answered (`crate::cookie`: FORMERR when it is malformed, else the
/// server cookie in the reply's OPT record, after the ECS option); the query's name is left in
/// `scratch.qname`, the addresses answered in `scratch.addrs`.
fn decide<'a, 'v>(
    src: &Source<'a>,
    live: Option<&'v Live>,
    q: &Parsed<'_>,
    scratch: &mut Scratch,
) -> (Decision<'v>, Reply<'a>) {
    let cookies = src.cookies;
    // Options are read in EDNS version 0 only (RFC 6891 §6.1.3: BADVERS first).
    let cookie =
        q.edns
            .filter(|e| e.version() == 0)
            .and_then(|e| match e.option(EdnsCode::Cookie)? {
                EdnsOption::Unknown(_, data) => Some(cookies.check(data, q.src, cookies.now())),
                _ => None,
            });
    match cookie {
        Some(Checked::Malformed) => {
            scratch.addrs.clear();
            let formerr = Decision {
                rcode: Rcode::FormErr,
                zone: None,
                records: Records::None,
                authority: Authority::None,
                mapped: None,
            };
            let reply = reply(src, q, &formerr, &[], None);
            (formerr, reply)
        }
        Some(Checked::Good { reply: option, .. }) => {
            let (d, mut reply) = decide_query(src, live, q, scratch);
            if let Some(e) = reply.edns.as_mut() {
                let code = crate::cookie::OPTION_COOKIE;
                e.options_mut()
                    .insert(EdnsOption::Unknown(code, option.to_vec()));
            }
            (d, reply)
        }
        None => decide_query(src, live, q, scratch),
    }
}

/// [`decide`] but for the COOKIE option.
fn decide_query<'a, 'v>(
    src: &Source<'a>,
    live: Option<&'v Live>,
    q: &Parsed<'_>,
    scratch: &mut Scratch,
) -> (Decision<'v>, Reply<'a>) {
    let subnet = client_subnet(q.edns, q.ecs_octets_ok);
    let ecs = match subnet {
        Err(()) => Ecs::Malformed,
        Ok(None) => Ecs::Absent,
        Ok(Some(s)) => Ecs::Subnet {
            addr: s.addr(),
            source: s.source_prefix(),
        },
    };
    let Scratch { qname, key, addrs } = scratch;
    qname.clear();
    let _ = write!(qname, "{}", q.name);
    let query = answer::Query {
        name: qname,
        place: place(&src.zones.names, q.name),
        class_in: q.class == DNSClass::IN,
        qtype: match QType::of(u16::from(q.qtype)) {
            QType::Other if binding_asked(src, q) => QType::Service,
            t => t,
        },
        edns_version: q.edns.map(Edns::version),
        ecs,
        client: ecs.client(q.src),
    };
    if q.class == DNSClass::CH {
        addrs.clear();
        return chaos(src, q, &query);
    }
    if let Some(answered) = from_statics(src, q, &query) {
        addrs.clear();
        return answered;
    }
    let view = live.map(Live::view);
    let mut decision = answer::decide(&src.zones.names, view.as_ref(), &query, key, addrs);
    if decision.rcode == Rcode::NxDomain && src.zones.statics.load().is_between(qname) {
        // Between an apex and a static name (RFC 8020): the name exists, without data.
        decision.rcode = Rcode::NoError;
    }
    let reply = reply(src, q, &decision, addrs, subnet.ok().flatten());
    (decision, reply)
}

/// The decision and reply for `query` from the static records (`crate::zonedata`), when
/// its name has some and the query gets that far (the checks before the map's: EDNS
/// version, class, transfers, ECS; at an apex, types other than SOA, NS and ANY).
fn from_statics<'a, 'v>(
    src: &Source<'a>,
    q: &Parsed<'_>,
    query: &answer::Query<'_>,
) -> Option<(Decision<'v>, Reply<'a>)> {
    let statics = src.zones.statics.load();
    let at = statics.get(query.name)?;
    // What the map's decision says before it asks the map: SERVFAIL (no map) below an apex,
    // the apex's own answer at one.
    let before = match answer::admit(query, None) {
        Ok(_) => return None,
        Err(d) => d,
    };
    let zone = match (query.place, before.rcode) {
        (answer::Place::Below(Some(z)), Rcode::ServFail) => z,
        (answer::Place::Apex(z), Rcode::NoError)
            if !matches!(query.qtype, QType::Soa | QType::Ns | QType::Any) =>
        {
            z
        }
        _ => return None,
    };
    let records = if query.qtype == QType::Any && at.cname().is_none() {
        Vec::new()
    } else {
        statics.answer(at, q.qtype)
    };
    let (kind, authority) = match (query.qtype, records.is_empty()) {
        (QType::Any, true) => (Records::Hinfo, Authority::None), // RFC 8482
        (_, true) => (Records::None, Authority::Soa),            // NODATA
        // Counted as an answer with records (not the map's: no route).
        (_, false) => (Records::Addresses, Authority::None),
    };
    let decision = Decision {
        rcode: Rcode::NoError,
        zone: Some(zone),
        records: kind,
        authority,
        mapped: None,
    };
    let mut reply = reply(src, q, &decision, &[], None);
    if !records.is_empty() {
        reply.records = records;
    }
    Some((decision, reply))
}

/// The names a CHAOS TXT query asks a server's identity by: RFC 4892's `id.server` and BIND's
/// `hostname.bind`.
const IDENTITY_NAMES: [&str; 2] = ["id.server.", "hostname.bind."];

/// A CHAOS-class query's decision and reply: TXT at `id.server` and `hostname.bind` answers the
/// front end's name (`src.identity`), as operators of a fleet ask which server answered; every
/// other CHAOS query is REFUSED, `version.bind` and `version.server` included (a version tells
/// an attacker which bugs to try). Checks that come first for every query (EDNS version,
/// ECS) come first here too.
fn chaos<'a, 'v>(
    src: &Source<'a>,
    q: &Parsed<'_>,
    query: &answer::Query<'_>,
) -> (Decision<'v>, Reply<'a>) {
    let refused = Decision {
        rcode: Rcode::Refused,
        zone: None,
        records: Records::None,
        authority: Authority::None,
        mapped: None,
    };
    let asks_identity = q.qtype == RecordType::TXT
        && IDENTITY_NAMES
            .iter()
            .any(|n| query.name.eq_ignore_ascii_case(n));
    // An EDNS version above 0 or a malformed ECS option: as for any query.
    let first = match (query.edns_version, query.ecs) {
        (Some(v), _) if v > 0 => Some(Rcode::BadVers),
        (_, Ecs::Malformed) => Some(Rcode::FormErr),
        _ => None,
    };
    let decision = match (first, asks_identity) {
        (Some(rcode), _) => Decision { rcode, ..refused },
        (None, true) => Decision {
            rcode: Rcode::NoError,
            records: Records::Addresses,
            ..refused
        },
        (None, false) => refused,
    };
    let mut reply = reply(src, q, &decision, &[], None);
    if decision.rcode == Rcode::NoError {
        let mut record = Record::from_rdata(
            q.name.into(),
            0,
            RData::TXT(TXT::new(vec![src.identity.to_string()])),
        );
        record.dns_class = DNSClass::CH;
        reply.records = vec![record];
    }
    (decision, reply)
}

/// `d` in hickory's records: the answer section's (`addrs`, the addresses decided), the
/// authority section's and the OPT record (the query's ECS option `ecs` echoed).
fn reply<'a>(
    src: &Source<'a>,
    q: &Parsed<'_>,
    d: &Decision<'_>,
    addrs: &[IpAddr],
    ecs: Option<ClientSubnet>,
) -> Reply<'a> {
    let code = match d.rcode {
        Rcode::NoError => ResponseCode::NoError,
        Rcode::FormErr => ResponseCode::FormErr,
        Rcode::ServFail => ResponseCode::ServFail,
        Rcode::NxDomain => ResponseCode::NXDomain,
        Rcode::Refused => ResponseCode::Refused,
        Rcode::BadVers => ResponseCode::BADVERS,
    };
    let bare = d.rcode.is_bare();
    // The response's OPT record: our buffer size, and the ECS option echoed with its scope.
    let mut edns = q.edns.filter(|_| !bare).map(|req| {
        let mut e = Edns::new();
        e.set_max_payload(req.max_payload().clamp(512, src.max_udp_payload));
        e.set_version(0);
        e
    });
    // NSID (RFC 5001): a query that asks gets the front end's name.
    let asks_nsid = q.edns.is_some_and(|e| e.option(EdnsCode::NSID).is_some());
    if let (Some(e), true) = (edns.as_mut(), asks_nsid) {
        if let Ok(nsid) = NSIDPayload::new(src.identity.as_bytes()) {
            e.options_mut().insert(EdnsOption::NSID(nsid));
        }
    }
    let scope = d.mapped.and_then(|m| m.ecs_scope);
    if let (Some(e), Some(mut echo), Some(scope)) = (edns.as_mut(), ecs, scope) {
        echo.set_scope_prefix(scope);
        e.options_mut().insert(EdnsOption::Subnet(echo));
    }
    let zones = src.zones;
    Reply {
        code,
        bare,
        records: records(src, q.name, q.qtype, d, addrs),
        ns: match d.authority {
            Authority::Ns => zones.ns(d.zone),
            _ => &[],
        },
        soa: match d.authority {
            Authority::Soa => zones.soa(d.zone),
            _ => Vec::new(),
        },
        edns,
    }
}

/// The answer section of `d` for `name`.
fn records(
    src: &Source<'_>,
    name: &LowerName,
    rtype: RecordType,
    d: &Decision<'_>,
    addrs: &[IpAddr],
) -> Vec<Record> {
    let owner = || -> Name { name.into() };
    match d.records {
        Records::None => Vec::new(),
        Records::Addresses => {
            let owner = owner();
            addrs
                .iter()
                .map(|&ip| {
                    let rdata = match ip {
                        IpAddr::V4(v4) => RData::A(A(v4)),
                        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
                    };
                    Record::from_rdata(owner.clone(), src.ttl, rdata)
                })
                .collect()
        }
        // `cdnmap_serve::answer` answers only targets hickory takes.
        Records::Cname(target) => Name::from_ascii(target)
            .map(|t| Record::from_rdata(owner(), src.ttl, RData::CNAME(CNAME(t))))
            .into_iter()
            .collect(),
        Records::Hinfo => {
            // RFC 8482 §4.2: ANY gets one synthesized HINFO record, not every RRset.
            let hinfo = HINFO::new("RFC8482".to_string(), String::new());
            vec![Record::from_rdata(
                owner(),
                ANY_HINFO_TTL,
                RData::HINFO(hinfo),
            )]
        }
        Records::Soa => src.zones.soa(d.zone),
        Records::Ns => src.zones.ns(d.zone).to_vec(),
        Records::Service => src
            .zones
            .services
            .load()
            .answer(name, rtype, addrs, src.ttl),
    }
}

/// Whether `q` asks for a service binding the configuration publishes at its name
/// (`crate::service`): HTTPS or SVCB, class IN.
fn binding_asked(src: &Source<'_>, q: &Parsed<'_>) -> bool {
    q.class == DNSClass::IN
        && crate::service::is_binding_type(q.qtype)
        && src
            .zones
            .services
            .load()
            .publishes(&q.name.to_string(), q.qtype)
}

/// Decides the request's (single) query from what `front` holds, counts its demand and its
/// outcome, and gives the reply.
fn decide_and_count<'f>(front: &'f Front, request: &Request) -> Reply<'f> {
    let query = &request.queries.queries()[0];
    let q = Parsed {
        name: query.name(),
        class: query.query_class(),
        qtype: query.query_type(),
        edns: request.edns.as_ref(),
        ecs_octets_ok: crate::wire::ecs_octets_ok(request.as_slice()),
        src: request.src().ip(),
    };
    let guard = front.live.load();
    let live = guard.as_deref();
    let src = Source {
        zones: &front.zones,
        identity: &front.identity,
        ttl: front.ttl,
        max_udp_payload: front.max_udp_payload,
        cookies: &front.cookies,
    };
    SCRATCH.with_borrow_mut(|scratch| {
        let (decision, mut reply) = decide(&src, live, &q, scratch);
        if front.dnssec.is_on() {
            secure(front, &q, live, &decision, &mut reply, &scratch.qname);
        }
        if let (Some(m), Some(live)) = (decision.mapped, live) {
            if m.demand {
                let block = front.demand.block(&live.view.resolver);
                block.count(&m.client, &m.answer);
            }
            if m.count_host {
                front.demand.count_host(&scratch.qname);
            }
        }
        front.counters.outcome(&decision).increment(1);
        if let Some(r) = decision.routed() {
            front.counters.route(r).increment(1);
        }
        reply
    })
}

/// DNSSEC (`crate::dnssec::reply`): in a signed zone, the DNSKEY RRset at the apex, and for a
/// query with the DO bit the RRSIGs of every RRset and compact denial; the clock read here.
fn secure(
    front: &Front,
    q: &Parsed<'_>,
    live: Option<&Live>,
    d: &Decision<'_>,
    reply: &mut Reply<'_>,
    qname: &str,
) {
    let dnssec_ok = q.edns.is_some_and(|e| e.flags().dnssec_ok);
    let (Some(z), false, DNSClass::IN) = (d.zone, reply.bare, q.class) else {
        return;
    };
    if !dnssec_ok && q.qtype != RecordType::DNSKEY {
        return;
    }
    let Some(keys) = front.dnssec.keys() else {
        return;
    };
    let Some(zone) = keys.zone(z) else {
        return;
    };
    let statics = front.zones.statics.load();
    let services = front.zones.services.load();
    let asked = crate::dnssec::reply::Asked {
        qname: q.name.into(),
        qname_text: qname,
        qtype: q.qtype,
        dnssec_ok,
        mapped: live.is_some_and(|l| l.view.resolver.rules().rule_class(qname).is_some()),
        wildcard: live.and_then(|l| l.view.resolver.rules().synthesized_from(qname)),
        statics: &statics,
        services: &services,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut authority: Vec<Record> = reply.ns.to_vec();
    authority.append(&mut reply.soa);
    let (answer, code) = (&mut reply.records, &mut reply.code);
    let signed = crate::dnssec::reply::secure(
        &front.dnssec,
        zone,
        &asked,
        code,
        answer,
        &mut authority,
        now,
    );
    reply.ns = &[];
    reply.soa = authority;
    if let (true, Some(e)) = (signed, reply.edns.as_mut()) {
        e.set_dnssec_ok(true);
    }
}

/// Encodes a reply with hickory and sends it.
async fn send_reply<R: ResponseHandler>(
    request: &Request,
    mut response: R,
    reply: &Reply<'_>,
) -> Result<ResponseInfo, hickory_server::net::NetError> {
    let mut builder = MessageResponseBuilder::from_message_request(request);
    if reply.bare {
        let m = metadata(request, reply.code, false);
        return response.send_response(builder.build_no_records(m)).await;
    }
    // BADVERS says nothing of the zone's data: not authoritative.
    let m = metadata(request, reply.code, reply.code != ResponseCode::BADVERS);
    if let Some(e) = reply.edns.as_ref() {
        builder.edns(e);
    }
    let msg = builder.build(
        m,
        reply.records.iter(),
        reply.ns.iter(),
        reply.soa.iter(),
        [],
    );
    response.send_response(msg).await
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::Ipv4Addr;

    use cdnmap_mapper::model::ClusterState;
    use cdnmap_serve::serving::{Builder, ServingCluster};

    use super::*;
    use crate::config::ZoneConfig;
    use crate::local::LocalView;

    /// A view of one unit (10.0.0.0/24, class "video") on one cluster with one IPv4 server,
    /// the fallback of both classes, names "*.video.example" of class "video".
    fn view() -> LocalView {
        view_with_server("192.0.2.1")
    }

    /// [`view`] with the server `server`.
    fn view_with_server(server: &str) -> LocalView {
        let classes: Vec<Arc<str>> = vec![Arc::from("video"), Arc::from("web")];
        let clusters = vec![ServingCluster {
            id: "a".to_string(),
            addresses: vec![server.parse().expect("address")],
            state: ClusterState::Up,
        }];
        let mut b = Builder::new(classes, clusters).expect("one cluster");
        let prefix: IpNet = "10.0.0.0/24".parse().expect("prefix");
        b.push("u1", 0, [prefix], [(0, 1.0)], 0.0, [None, None])
            .expect("a valid unit");
        b.set_fallback(&[[Some(0), None], [Some(0), None]]);
        let m = b.finish();
        crate::local::test_view(&m, &[("*.video.example", "video")])
    }

    /// The zone `example.` (name server `ns1.example.`), serial 1, TTL 20.
    pub(crate) fn zones() -> Zones {
        let name = |s: &str| Name::from_ascii(s).expect("a name");
        let config = ZoneConfig {
            apex: name("example."),
            nameservers: vec![name("ns1.example.")],
            hostmaster: name("hostmaster.example."),
        };
        Zones::new(&[config], 1, 20)
    }

    /// [`zones`] with static records: `ns1.example.` A and AAAA (the glue), a TXT at the apex,
    /// `static.video.example.` A (a name the rule `*.video.example` names too), `alias` a
    /// CNAME to it and `out` a CNAME out of the zone.
    pub(crate) fn zones_with_statics() -> Zones {
        let text = r#"
            zones = ["example."]
            [[records]]
            name = "ns1"
            type = "A"
            data = "192.0.2.53"
            [[records]]
            name = "ns1"
            type = "AAAA"
            data = "2001:db8::53"
            [[records]]
            name = "@"
            type = "TXT"
            data = "v=spf1 -all"
            [[records]]
            name = "static.video.example."
            type = "A"
            data = "198.51.100.7"
            ttl = 60
            [[records]]
            name = "alias"
            type = "CNAME"
            data = "static.video"
            [[records]]
            name = "out"
            type = "CNAME"
            data = "www.example.org."
        "#;
        let config = crate::config::DnsConfig::from_toml(text).expect("valid");
        let statics = config.static_data().expect("valid records");
        Zones::with_data(&config.zones().expect("zones"), Some(1), 20, statics)
    }

    /// The zones of [`zones_with_statics`], as configured.
    pub(crate) fn zones_with_statics_config() -> Vec<ZoneConfig> {
        crate::config::DnsConfig::from_toml(r#"zones = ["example."]"#)
            .and_then(|c| c.zones())
            .expect("zones")
    }

    /// The decision for `qname`/`qtype` from 203.0.113.5, with an ECS option of `ecs` if any,
    /// and its reply.
    fn check(
        live: Option<&Live>,
        qname: &str,
        qtype: RecordType,
        ecs: Option<(&str, u8)>,
        f: impl FnOnce(&Decision<'_>, &Reply<'_>),
    ) {
        let edns = ecs.map(|(addr, len)| {
            let mut e = Edns::new();
            e.set_max_payload(4096);
            let subnet = ClientSubnet::new(addr.parse().expect("an address"), len, 0);
            e.options_mut().insert(EdnsOption::Subnet(subnet));
            e
        });
        check_edns(live, qname, qtype, edns, f);
    }

    /// [`check`] with the query's OPT record `edns`.
    fn check_edns(
        live: Option<&Live>,
        qname: &str,
        qtype: RecordType,
        edns: Option<Edns>,
        f: impl FnOnce(&Decision<'_>, &Reply<'_>),
    ) {
        check_class(live, qname, DNSClass::IN, qtype, edns, f);
    }

    /// [`check_edns`] in class `class`.
    fn check_class(
        live: Option<&Live>,
        qname: &str,
        class: DNSClass,
        qtype: RecordType,
        edns: Option<Edns>,
        f: impl FnOnce(&Decision<'_>, &Reply<'_>),
    ) {
        let zones = zones();
        let src = Source {
            zones: &zones,
            identity: "fe-test-1",
            ttl: 20,
            max_udp_payload: 1232,
            cookies: &crate::cookie::Cookies::at_fixed_time([1; 16], None, 1_800_000_000),
        };
        let name = LowerName::new(&Name::from_ascii(qname).expect("a name"));
        let q = Parsed {
            name: &name,
            class,
            qtype,
            edns: edns.as_ref(),
            ecs_octets_ok: true,
            src: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 5)),
        };
        let (d, reply) = decide(&src, live, &q, &mut Scratch::default());
        f(&d, &reply);
    }

    /// CHAOS TXT `id.server` and `hostname.bind` (any case) answer the front end's name, in
    /// class CH; `version.bind`, `version.server`, another type or another name are REFUSED;
    /// an EDNS version above 0 is BADVERS there too.
    #[test]
    fn chaos_answers_the_identity_and_refuses_the_version() {
        let txt = |r: &Reply<'_>| -> Vec<String> {
            r.records
                .iter()
                .filter(|rec| rec.dns_class == DNSClass::CH)
                .filter_map(|rec| match &rec.data {
                    RData::TXT(t) => Some(t.to_string()),
                    _ => None,
                })
                .collect()
        };
        for name in ["id.server.", "hostname.bind.", "ID.Server."] {
            check_class(None, name, DNSClass::CH, RecordType::TXT, None, |d, r| {
                assert_eq!(d.rcode, Rcode::NoError, "{name}");
                assert_eq!(txt(r), ["fe-test-1"], "{name}: {r:?}");
            });
        }
        for (name, qtype) in [
            ("version.bind.", RecordType::TXT),
            ("version.server.", RecordType::TXT),
            ("authors.bind.", RecordType::TXT),
            ("id.server.", RecordType::A),
        ] {
            check_class(None, name, DNSClass::CH, qtype, None, |d, r| {
                assert_eq!(d.rcode, Rcode::Refused, "{name} {qtype}");
                assert!(is_bare(r, ResponseCode::Refused), "{name}: {r:?}");
            });
        }
        let mut v1 = Edns::new();
        v1.set_version(1);
        check_class(
            None,
            "id.server.",
            DNSClass::CH,
            RecordType::TXT,
            Some(v1),
            |d, _| {
                assert_eq!(d.rcode, Rcode::BadVers);
            },
        );
    }

    /// A query with an NSID option gets the front end's name in it, whatever the answer; one
    /// without gets none.
    #[test]
    fn nsid_answers_the_identity_when_asked() {
        let nsid = |r: &Reply<'_>| match r.edns.as_ref()?.option(EdnsCode::NSID)? {
            EdnsOption::NSID(p) => Some(p.clone()),
            _ => None,
        };
        let asking = || {
            let mut e = Edns::new();
            e.set_max_payload(1232);
            let empty = NSIDPayload::new(Vec::new()).expect("an empty payload");
            e.options_mut().insert(EdnsOption::NSID(empty));
            e
        };
        let want = NSIDPayload::new(b"fe-test-1".to_vec()).expect("a payload");
        let l = live(view());
        for (qname, qtype) in [
            ("x.video.example.", RecordType::A),
            ("example.", RecordType::SOA),
            ("nx.example.", RecordType::A),
        ] {
            check_edns(Some(&l), qname, qtype, Some(asking()), |_, r| {
                assert_eq!(nsid(r), Some(want.clone()), "{qname}: {r:?}");
            });
            let mut plain = Edns::new();
            plain.set_max_payload(1232);
            check_edns(Some(&l), qname, qtype, Some(plain), |_, r| {
                assert_eq!(nsid(r), None, "{qname}: {r:?}");
            });
        }
    }

    fn live(view: LocalView) -> Live {
        Live::new(Arc::new(view))
    }

    /// A bare reply of `code`.
    fn is_bare(r: &Reply<'_>, code: ResponseCode) -> bool {
        r.bare && r.code == code && r.records.is_empty() && r.edns.is_none()
    }

    fn echoed_scope(r: &Reply<'_>) -> Option<u8> {
        match r.edns.as_ref()?.option(EdnsCode::Subnet)? {
            EdnsOption::Subnet(s) => Some(s.scope_prefix()),
            _ => None,
        }
    }

    /// A front end answering from `view` (no demand counted yet).
    pub(crate) fn front_of(zones: Zones, view: LocalView) -> Front {
        let front = Front::new(zones, 20, 1232, 0).with_cookies(
            crate::cookie::Cookies::at_fixed_time([1; 16], None, 1_800_000_000),
        );
        front.put_view(view);
        front
    }

    /// Selectors rebuilt for a view are used with that view only: once another is in use
    /// (version 1 of another epoch, another mapper's map, or any later one), selectors
    /// rebuilt for the one before are refused and the view in use keeps its own.
    #[test]
    fn rebuilt_selectors_serve_the_view_they_were_built_for() {
        let front = front_of(zones(), view()); // version 1 of epoch 1
        let other = view_with_server("198.51.100.9");
        let a = |front: &Front| -> Vec<RData> {
            let name = LowerName::new(&Name::from_ascii("www.video.example.").expect("a name"));
            let q = Parsed {
                name: &name,
                class: DNSClass::IN,
                qtype: RecordType::A,
                edns: None,
                ecs_octets_ok: true,
                src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)),
            };
            let src = Source {
                zones: &front.zones,
                identity: &front.identity,
                ttl: 20,
                max_udp_payload: 1232,
                cookies: &front.cookies,
            };
            let live = front.live.load();
            let (_, reply) = decide(&src, live.as_deref(), &q, &mut Scratch::default());
            reply.records.iter().map(|r| r.data.clone()).collect()
        };
        let in_use = front.view().expect("a view");
        let servers = other.build_servers(&[]).expect("selectors");
        assert!(front.put_rebuilt(&in_use, servers), "for the view in use");
        assert_eq!(a(&front), [RData::A(A(Ipv4Addr::from([198, 51, 100, 9])))]);
        // Another view put in use: selectors rebuilt for the one before are refused.
        front.put_view(view());
        let servers = other.build_servers(&[]).expect("selectors");
        assert!(
            !front.put_rebuilt(&in_use, servers),
            "for the view replaced"
        );
        assert_eq!(a(&front), [RData::A(A(Ipv4Addr::from([192, 0, 2, 1])))]);
    }

    #[test]
    fn names_outside_the_zones_are_refused_and_no_map_is_servfail() {
        let v = live(view());
        check(Some(&v), "www.other.test.", RecordType::A, None, |_, r| {
            assert!(is_bare(r, ResponseCode::Refused), "{r:?}");
        });
        check(None, "www.video.example.", RecordType::A, None, |_, r| {
            assert!(is_bare(r, ResponseCode::ServFail), "{r:?}");
        });
        // A query's ECS scope must be 0; a source prefix beyond the family's bits is malformed.
        check(
            Some(&v),
            "www.video.example.",
            RecordType::A,
            Some(("10.0.0.0", 33)),
            |_, r| {
                assert!(is_bare(r, ResponseCode::FormErr), "{r:?}");
            },
        );
    }

    /// RFC 7871 §6: address bits beyond the source prefix are FORMERR; RFC 5936: zone
    /// transfers are refused; RFC 8482 §4.2: ANY is one HINFO, at a mapped name and the apex.
    #[test]
    fn host_bits_transfers_and_any_answer_as_their_rfcs_say() {
        let v = live(view());
        let name = "www.video.example.";
        check(
            Some(&v),
            name,
            RecordType::A,
            Some(("10.0.0.1", 24)),
            |_, r| {
                assert!(is_bare(r, ResponseCode::FormErr), "{r:?}");
            },
        );
        check(
            Some(&v),
            name,
            RecordType::A,
            Some(("10.0.0.0", 24)),
            |_, r| {
                assert_eq!(r.records.len(), 1, "{r:?}");
            },
        );
        for qtype in [RecordType::AXFR, RecordType::IXFR] {
            check(Some(&v), "example.", qtype, None, |_, r| {
                assert!(is_bare(r, ResponseCode::Refused), "{r:?}");
            });
        }
        for qname in [name, "example."] {
            check(Some(&v), qname, RecordType::ANY, None, |d, r| {
                assert!(!r.bare);
                assert_eq!(r.code, ResponseCode::NoError);
                assert_eq!(r.records.len(), 1, "{r:?}");
                let expected = RData::HINFO(HINFO::new("RFC8482".into(), String::new()));
                assert_eq!(r.records[0].data, expected);
                assert_eq!(r.records[0].ttl, ANY_HINFO_TTL);
                assert!(!d.mapped.is_some_and(|m| m.demand));
            });
        }
        check(
            Some(&v),
            "www.unknown.example.",
            RecordType::ANY,
            None,
            |_, r| {
                assert_eq!(r.code, ResponseCode::NXDomain);
            },
        );
    }

    /// RFC 6891 §6.1.3: a query of EDNS version 1 is BADVERS with an OPT record of version
    /// 0, inside the zones or not.
    #[test]
    fn an_edns_version_above_0_is_badvers() {
        let v = live(view());
        let mut edns = Edns::new();
        edns.set_version(1);
        for qname in ["www.video.example.", "www.other.test."] {
            check_edns(
                Some(&v),
                qname,
                RecordType::A,
                Some(edns.clone()),
                |_, r| {
                    assert!(!r.bare);
                    assert_eq!(r.code, ResponseCode::BADVERS, "{qname}");
                    assert!(r.records.is_empty());
                    assert_eq!(r.edns.as_ref().map(Edns::version), Some(0));
                },
            );
        }
    }

    #[test]
    fn the_apex_answers_soa_and_ns_without_a_map() {
        check(None, "example.", RecordType::SOA, None, |_, r| {
            assert_eq!(r.code, ResponseCode::NoError);
            assert_eq!(r.records.len(), 1);
            assert_eq!(r.records[0].record_type(), RecordType::SOA);
            assert_eq!(r.ns.len(), 1);
            assert!(r.soa.is_empty());
        });
        check(None, "example.", RecordType::A, None, |_, r| {
            assert!(r.records.is_empty());
            assert_eq!(r.soa.len(), 1);
        });
    }

    #[test]
    fn a_name_no_rule_names_is_nxdomain_with_the_soa() {
        let v = live(view());
        check(
            Some(&v),
            "www.unknown.example.",
            RecordType::A,
            None,
            |d, r| {
                assert_eq!(r.code, ResponseCode::NXDomain);
                assert!(r.records.is_empty());
                assert_eq!(r.soa.len(), 1);
                assert_eq!(d.mapped, None);
            },
        );
    }

    #[test]
    fn the_ecs_scope_is_the_units_prefix_and_the_query_counts_as_demand() {
        let v = live(view());
        check(
            Some(&v),
            "www.video.example.",
            RecordType::A,
            Some(("10.0.0.77", 32)),
            |d, r| {
                assert_eq!(r.code, ResponseCode::NoError);
                let ips: Vec<RData> = r.records.iter().map(|r| r.data.clone()).collect();
                assert_eq!(ips, [RData::A(A(Ipv4Addr::new(192, 0, 2, 1)))]);
                assert!(r.soa.is_empty());
                assert_eq!(echoed_scope(r), Some(24));
                let m = d.mapped.expect("the map's answer");
                assert!(m.demand, "the unit's demand");
                assert_eq!(m.client, "10.0.0.77/32".parse::<IpNet>().expect("a net"));
                assert_eq!((m.answer.prefix_len, m.answer.class), (24, 0));
                assert!(!m.count_host, "no cluster selects with bounded loads");
            },
        );
        // A source prefix of 0: the resolver's address is the client, the scope echoed 0.
        check(
            Some(&v),
            "www.video.example.",
            RecordType::A,
            Some(("0.0.0.0", 0)),
            |_, r| {
                assert_eq!(echoed_scope(r), Some(0));
            },
        );
        // No ECS in the query: none echoed; the resolver's address is in no unit (the class's
        // fallback answers), so nothing counts as demand.
        check(
            Some(&v),
            "www.video.example.",
            RecordType::A,
            None,
            |d, r| {
                assert!(r.edns.is_none());
                assert_eq!(r.records.len(), 1);
                let m = d.mapped.expect("the map's answer");
                assert!(m.answer.unit.is_none() && !m.demand, "{m:?}");
            },
        );
    }

    #[test]
    fn aaaa_without_an_ipv6_server_and_other_types_are_nodata() {
        let v = live(view());
        for qtype in [RecordType::AAAA, RecordType::TXT] {
            check(Some(&v), "www.video.example.", qtype, None, |_, r| {
                assert_eq!(r.code, ResponseCode::NoError, "{qtype}");
                assert!(r.records.is_empty(), "{qtype}");
                assert_eq!(r.soa.len(), 1, "{qtype}");
            });
        }
    }

    /// `cdnmap_serve::answer` places names by their labels as hickory's `zone_of` does, and
    /// answers a CNAME target only where hickory can make a name of it (no label beginning
    /// with '-', which `Bypass::cname` lets through): the two agree name by name.
    #[test]
    fn zones_place_names_as_hickory_does() {
        let apexes = ["example.", "sub.example.", "other.test.", "."];
        for apex_set in [&apexes[..1], &apexes[1..3], &apexes[..3], &apexes[3..]] {
            let configs: Vec<Name> = apex_set
                .iter()
                .map(|a| Name::from_ascii(a).expect("an apex"))
                .collect();
            let zones = answer::Zones::new(configs.iter().map(|n| n.iter()));
            for name in [
                "example.",
                "EXAMPLE.",
                "www.example.",
                "a.b.sub.example.",
                "sub.example.",
                "badexample.",
                "example.org.",
                "other.test.",
                "x.other.TEST.",
                ".",
                "a.",
            ] {
                let n = LowerName::new(&Name::from_ascii(name).expect("a name"));
                let holding = configs.iter().position(|a| LowerName::new(a).zone_of(&n));
                let want = match holding {
                    None => Place::Outside,
                    Some(i) if LowerName::new(&configs[i]) == n => Place::Apex(i),
                    Some(i) => Place::Below(Some(i)),
                };
                assert_eq!(place(&zones, &n), want, "{name} in {apex_set:?}");
                let target = name.to_string();
                let hickory =
                    Name::from_ascii(&target).is_ok_and(|t| configs.iter().any(|a| a.zone_of(&t)));
                assert_eq!(zones.holds(&target), hickory, "{name} in {apex_set:?}");
            }
        }
        for target in ["-x.example.", "a.-b.example.", "x-.example.", "_x.example."] {
            let parses = Name::from_ascii(target).is_ok();
            assert_eq!(parses, answer::cname_answerable(target), "{target}");
        }
    }
}
