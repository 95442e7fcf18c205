//! Answering one DNS query from the local map (hickory's `RequestHandler`).
//!
//! - Names outside every configured zone: REFUSED.
//! - The apex: SOA and NS; other types there: NOERROR with no answers and the SOA.
//! - Names below the apex that a hostname rule names: A/AAAA from the map (the client subnet of
//!   the query's EDNS Client Subnet option, else the resolver's address), the ECS option echoed
//!   with the answer's scope (`Answer::scope_prefix_len`: the addresses it holds for); other types: NOERROR, no
//!   answers, the SOA. Names no rule names: NXDOMAIN with the SOA.
//! - No map yet: SERVFAIL. Anything but a standard query: NOTIMP; not exactly one question:
//!   FORMERR.
//!
//! Truncation is hickory's: a UDP response larger than the smaller of the client's EDNS buffer
//! and `max_udp_payload` (512 bytes without EDNS) is cut with TC set, and the client asks again
//! over TCP.
//!
//! `decide` makes the `Decision` from the parsed query and the view alone (no socket, no
//! `ResponseHandler`: unit tested below); the handler counts its demand and outcome, and
//! `send` encodes it with hickory.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, MessageType, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};
use hickory_server::proto::rr::rdata::{A, AAAA, CNAME, HINFO, NS, SOA};
use hickory_server::proto::rr::{DNSClass, LowerName, Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use ipnet::IpNet;

use cdnmap_serve::resolve::Route;
use cdnmap_serve::watch::Bypass;

use super::config::ZoneConfig;
use super::demand::DemandCounter;
use super::local::LocalView;

/// SOA timers (seconds): refresh, retry, expire, minimum (the negative-caching TTL).
const SOA_TIMERS: (i32, i32, i32, u32) = (3600, 600, 86_400, 60);

/// A served zone, with its apex records made once.
pub struct Zone {
    pub apex: LowerName,
    /// The apex as text, lower case with the final dot (the fast path's `crate::wire`).
    pub apex_text: String,
    soa: Record,
    ns: Vec<Record>,
}

impl Zone {
    pub fn new(z: &ZoneConfig, serial: u32, ttl: u32) -> Zone {
        let apex: Name = z.apex.clone();
        let soa = Record::from_rdata(
            apex.clone(),
            SOA_TIMERS.3,
            RData::SOA(SOA::new(
                z.nameservers[0].clone(),
                z.hostmaster.clone(),
                serial,
                SOA_TIMERS.0,
                SOA_TIMERS.1,
                SOA_TIMERS.2,
                SOA_TIMERS.3,
            )),
        );
        let ns = z
            .nameservers
            .iter()
            .map(|n| Record::from_rdata(apex.clone(), ttl.max(3600), RData::NS(NS(n.clone()))))
            .collect();
        let apex = LowerName::new(&apex);
        Zone {
            apex_text: apex.to_string(),
            apex,
            soa,
            ns,
        }
    }
}

/// Per-thread buffers, so answering a query allocates no strings.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) qname: String,
    pub(crate) key: String,
    pub(crate) addrs: Vec<IpAddr>,
}

thread_local! {
    pub(crate) static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Queries answered, by outcome: `cdnmap_dns_queries_total{rcode=...}` (registered once, so
/// counting a query is one atomic add, and nothing without a metrics recorder).
pub struct Counters {
    pub(crate) answer: metrics::Counter,
    nodata: metrics::Counter,
    nxdomain: metrics::Counter,
    refused: metrics::Counter,
    servfail: metrics::Counter,
    formerr: metrics::Counter,
    badvers: metrics::Counter,
    /// Answers with addresses by why they name them (`Route`, in its order).
    routes: [metrics::Counter; Route::ALL.len()],
}

impl Counters {
    pub fn register() -> Counters {
        let c =
            |rcode: &'static str| metrics::counter!("cdnmap_dns_queries_total", "rcode" => rcode);
        Counters {
            answer: c("answer"),
            nodata: c("nodata"),
            nxdomain: c("nxdomain"),
            refused: c("refused"),
            servfail: c("servfail"),
            formerr: c("formerr"),
            badvers: c("badvers"),
            routes: Route::ALL.map(
                |r| metrics::counter!("cdnmap_dns_answers_by_route_total", "route" => r.as_str()),
            ),
        }
    }

    /// The counter of answers with addresses routed so.
    pub(crate) fn route(&self, r: Route) -> &metrics::Counter {
        &self.routes[r as usize]
    }
}

/// What the handler reads: the zones, the published view, the counters.
pub struct Front {
    pub zones: Vec<Zone>,
    pub view: ArcSwapOption<LocalView>,
    /// Selectors rebuilt each report period over the hostnames seen (bounded loads), for the
    /// view identity (epoch, version) they were built for: a version number alone recurs in
    /// another epoch (another mapper's, or a restarted one's), with other clusters.
    pub servers: ArcSwapOption<((u64, u64), cdnmap_serve::servers::Servers)>,
    pub ttl: u32,
    pub max_udp_payload: u16,
    pub demand: DemandCounter,
    /// The hostnames of the last report period and their queries: the bounded-loads weights.
    pub hot_hosts: arc_swap::ArcSwap<Vec<(String, f64)>>,
    /// Where the current demand report period began.
    pub period_start_unix_ms: std::sync::atomic::AtomicI64,
    pub counters: Counters,
}

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
            response
                .send_response(builder.build_no_records(send(ResponseCode::NotImp)))
                .await
        } else if request.queries.queries().len() != 1 {
            response
                .send_response(builder.build_no_records(send(ResponseCode::FormErr)))
                .await
        } else {
            answer(front, request, response.clone()).await
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

/// The parsed query a decision reads.
struct Query<'q> {
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

/// What a decision reads besides the query and the view: the zones, the selectors rebuilt for
/// bounded loads, the answers' TTL and our UDP buffer size.
struct Source<'a> {
    pub zones: &'a [Zone],
    pub rebuilt: &'a ArcSwapOption<((u64, u64), cdnmap_serve::servers::Servers)>,
    pub ttl: u32,
    pub max_udp_payload: u16,
}

/// A query counted as demand: its client and the resolver's answer (the matched unit's slot,
/// prefix length and class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Demand {
    pub client: IpNet,
    pub answer: cdnmap_serve::resolve::Answer,
}

/// An authoritative response: NOERROR (with records, or NODATA) or NXDOMAIN.
#[derive(Debug)]
struct Answer<'a> {
    pub code: ResponseCode,
    pub records: Vec<Record>,
    /// The authority section's NS records (with the apex SOA).
    pub ns: &'a [Record],
    /// The authority section's SOA (negative answers), else empty.
    pub soa: &'a [Record],
    /// The response's OPT record (when the query had one), with the ECS option echoed.
    pub edns: Option<Edns>,
    /// What to count as demand for the matched unit.
    pub demand: Option<Demand>,
    /// Count the query's hostname (some cluster selects with bounded loads).
    pub count_host: bool,
    /// Why the map's answer names its clusters (`None`: no map answer).
    pub route: Option<Route>,
}

/// What to answer one query with, decided without sockets or hickory's `ResponseHandler`.
#[derive(Debug)]
enum Decision<'a> {
    /// No records, no OPT record, not authoritative: REFUSED (outside the zones, or not class
    /// IN), FORMERR (a malformed ECS option), SERVFAIL (no map yet).
    Bare(ResponseCode),
    Answer(Answer<'a>),
}

impl Decision<'_> {
    /// The `cdnmap_dns_queries_total` counter this outcome counts in.
    fn counter<'c>(&self, c: &'c Counters) -> &'c metrics::Counter {
        match self {
            Decision::Bare(ResponseCode::Refused) => &c.refused,
            Decision::Bare(ResponseCode::FormErr) => &c.formerr,
            Decision::Bare(_) => &c.servfail,
            Decision::Answer(a) if a.code == ResponseCode::NXDomain => &c.nxdomain,
            Decision::Answer(a) if a.code == ResponseCode::BADVERS => &c.badvers,
            Decision::Answer(a) if a.records.is_empty() => &c.nodata,
            Decision::Answer(_) => &c.answer,
        }
    }
}

/// The decision for `q` from the view held (`None` before the first map); the query's name is
/// left in `scratch.qname` for counting.
fn decide<'a>(
    src: &Source<'a>,
    view: Option<&LocalView>,
    q: &Query<'_>,
    scratch: &mut Scratch,
) -> Decision<'a> {
    // The response's OPT record: our buffer size, and the ECS option echoed with its scope.
    let edns = q.edns.map(|req| {
        let mut e = Edns::new();
        e.set_max_payload(req.max_payload().clamp(512, src.max_udp_payload));
        e.set_version(0);
        e
    });
    let mut answer = Answer {
        code: ResponseCode::NoError,
        records: Vec::new(),
        ns: &[],
        soa: &[],
        edns,
        demand: None,
        route: None,
        count_host: false,
    };
    // RFC 6891 §6.1.3: an EDNS version we do not implement (we implement 0) is answered
    // BADVERS, with our OPT record saying version 0, before anything else is looked at.
    if q.edns.is_some_and(|e| e.version() > 0) {
        answer.code = ResponseCode::BADVERS; // its high bits go in the OPT record (hickory)
        return Decision::Answer(answer);
    }
    let Some(zone) = src.zones.iter().find(|z| z.apex.zone_of(q.name)) else {
        return Decision::Bare(ResponseCode::Refused);
    };
    if q.class != DNSClass::IN {
        return Decision::Bare(ResponseCode::Refused);
    }
    // Zone transfers are not offered (RFC 5936 §2.2.1: a server may refuse a transfer; the
    // map changes every round, and its zone is synthesized per client).
    if matches!(q.qtype, RecordType::AXFR | RecordType::IXFR) {
        return Decision::Bare(ResponseCode::Refused);
    }
    let Ok(ecs) = client_subnet(q.edns, q.ecs_octets_ok) else {
        return Decision::Bare(ResponseCode::FormErr);
    };
    let soa = std::slice::from_ref(&zone.soa);
    let any = |answer: &mut Answer<'_>| {
        // RFC 8482 §4.2: ANY gets one synthesized HINFO record, not every RRset.
        let hinfo = HINFO::new("RFC8482".to_string(), String::new());
        let owner: Name = q.name.into();
        answer.records.push(Record::from_rdata(
            owner,
            ANY_HINFO_TTL,
            RData::HINFO(hinfo),
        ));
    };
    if zone.apex == *q.name {
        match q.qtype {
            RecordType::ANY => any(&mut answer),
            RecordType::SOA => {
                answer.records.push(zone.soa.clone());
                answer.ns = &zone.ns;
            }
            RecordType::NS => answer.records.extend(zone.ns.iter().cloned()),
            _ => answer.soa = soa,
        }
        return Decision::Answer(answer);
    }
    let Some(view) = view else {
        return Decision::Bare(ResponseCode::ServFail);
    };
    let Scratch { qname, key, addrs } = scratch;
    qname.clear();
    let _ = write!(qname, "{}", q.name);
    if view.resolver.rules().rule_class(qname).is_none() {
        answer.code = ResponseCode::NXDomain;
        answer.soa = soa;
        return Decision::Answer(answer);
    }
    let client = match &ecs {
        Some(e) if e.source_prefix() > 0 => IpNet::new(e.addr(), e.source_prefix())
            .map(|n| n.trunc())
            .ok(),
        _ => None,
    }
    .unwrap_or_else(|| IpNet::from(q.src));
    let a = view.resolver.resolve(client, qname);
    // A unit whose every candidate is full or down goes to its class's last resort, if any
    // (a CNAME into the front end's own zones would loop: not taken).
    let bypass = a
        .route
        .bypassed()
        .then(|| view.bypass(a.class))
        .flatten()
        .filter(|b| match b {
            Bypass::Cname(target) => !Name::from_ascii(target).is_ok_and(|t| {
                let t = LowerName::from(&t);
                src.zones.iter().any(|z| z.apex.zone_of(&t))
            }),
            Bypass::Addresses(_) => true,
        });
    // RFC 1034 §3.6.2: a name with a CNAME has no other data; every type gets the CNAME.
    let cname = matches!(bypass, Some(Bypass::Cname(_)));
    if q.qtype == RecordType::ANY && !cname {
        any(&mut answer);
        return Decision::Answer(answer);
    }
    if !matches!(q.qtype, RecordType::A | RecordType::AAAA) && !cname {
        answer.soa = soa;
        return Decision::Answer(answer);
    }
    let v6 = q.qtype == RecordType::AAAA;
    let rebuilt = src.rebuilt.load();
    let servers = match rebuilt.as_deref() {
        Some((built_for, s)) if *built_for == (view.epoch, view.version) => Some(s),
        _ => view.servers(),
    };
    addrs.clear();
    let owner: Name = q.name.into();
    match bypass {
        Some(Bypass::Cname(target)) => {
            if let Ok(target) = Name::from_ascii(target) {
                answer.records.push(Record::from_rdata(
                    owner.clone(),
                    src.ttl,
                    RData::CNAME(CNAME(target)),
                ));
            }
        }
        Some(Bypass::Addresses(all)) => {
            addrs.extend(all.iter().copied().filter(|ip| ip.is_ipv6() == v6));
        }
        None => {
            if let Some(servers) = servers {
                servers.answer(&a, qname, v6, key, addrs);
            }
        }
    }
    for &ip in addrs.iter() {
        let rdata = match ip {
            IpAddr::V4(v4) => RData::A(A(v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        };
        answer
            .records
            .push(Record::from_rdata(owner.clone(), src.ttl, rdata));
    }
    if answer.records.is_empty() {
        answer.soa = soa; // no server of the family: NODATA
    }
    if let (Some(e), Some(ecs)) = (answer.edns.as_mut(), &ecs) {
        let mut echo = *ecs;
        echo.set_scope_prefix(if ecs.source_prefix() == 0 {
            0
        } else {
            a.scope_prefix_len
        });
        e.options_mut().insert(EdnsOption::Subnet(echo));
    }
    if a.unit.is_some() && matches!(q.qtype, RecordType::A | RecordType::AAAA) {
        answer.demand = Some(Demand { client, answer: a });
    }
    answer.count_host = view.has_bounded && matches!(q.qtype, RecordType::A | RecordType::AAAA);
    answer.route = Some(if bypass.is_some() {
        Route::Bypass
    } else {
        a.route
    });
    Decision::Answer(answer)
}

/// Decides the request's (single) query from what `front` holds, counts its demand and its
/// outcome.
fn decide_and_count<'f>(front: &'f Front, request: &Request) -> Decision<'f> {
    let query = &request.queries.queries()[0];
    let q = Query {
        name: query.name(),
        class: query.query_class(),
        qtype: query.query_type(),
        edns: request.edns.as_ref(),
        ecs_octets_ok: crate::wire::ecs_octets_ok(request.as_slice()),
        src: request.src().ip(),
    };
    let guard = front.view.load();
    let view = guard.as_deref();
    let src = Source {
        zones: &front.zones,
        rebuilt: &front.servers,
        ttl: front.ttl,
        max_udp_payload: front.max_udp_payload,
    };
    let decision = SCRATCH.with_borrow_mut(|scratch| {
        let decision = decide(&src, view, &q, scratch);
        if let (Decision::Answer(a), Some(view)) = (&decision, view) {
            if let Some(d) = a.demand {
                front
                    .demand
                    .block(&view.resolver)
                    .count(&d.client, &d.answer);
            }
            if a.count_host {
                front.demand.count_host(&scratch.qname);
            }
        }
        decision
    });
    decision.counter(&front.counters).increment(1);
    if let Decision::Answer(Answer {
        route: Some(r),
        records,
        ..
    }) = &decision
    {
        if !records.is_empty() {
            front.counters.route(*r).increment(1);
        }
    }
    decision
}

/// Encodes a decision with hickory and sends it.
async fn send<R: ResponseHandler>(
    request: &Request,
    mut response: R,
    decision: &Decision<'_>,
) -> Result<ResponseInfo, hickory_server::net::NetError> {
    let mut builder = MessageResponseBuilder::from_message_request(request);
    match decision {
        Decision::Bare(code) => {
            let m = metadata(request, *code, false);
            response.send_response(builder.build_no_records(m)).await
        }
        Decision::Answer(a) => {
            // BADVERS says nothing of the zone's data: not authoritative.
            let m = metadata(request, a.code, a.code != ResponseCode::BADVERS);
            if let Some(e) = a.edns.as_ref() {
                builder.edns(e);
            }
            let msg = builder.build(m, a.records.iter(), a.ns.iter(), a.soa.iter(), []);
            response.send_response(msg).await
        }
    }
}

async fn answer<R: ResponseHandler>(
    front: &Front,
    request: &Request,
    response: R,
) -> Result<ResponseInfo, hickory_server::net::NetError> {
    let decision = decide_and_count(front, request);
    send(request, response, &decision).await
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use cdnmap_mapper::model::ClusterState;
    use cdnmap_serve::serving::{Builder, ServingCluster};

    use super::*;

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

    fn zone() -> Zone {
        let name = |s: &str| Name::from_ascii(s).expect("a name");
        let config = ZoneConfig {
            apex: name("example."),
            nameservers: vec![name("ns1.example.")],
            hostmaster: name("hostmaster.example."),
        };
        Zone::new(&config, 1, 20)
    }

    /// The decision for `qname`/`qtype` from 203.0.113.5, with an ECS option of `ecs` if any.
    fn check(
        view: Option<&LocalView>,
        qname: &str,
        qtype: RecordType,
        ecs: Option<(&str, u8)>,
        f: impl FnOnce(&Decision<'_>),
    ) {
        let edns = ecs.map(|(addr, len)| {
            let mut e = Edns::new();
            e.set_max_payload(4096);
            let subnet = ClientSubnet::new(addr.parse().expect("an address"), len, 0);
            e.options_mut().insert(EdnsOption::Subnet(subnet));
            e
        });
        check_edns(view, qname, qtype, edns, f);
    }

    /// [`check`] with the query's OPT record `edns`.
    fn check_edns(
        view: Option<&LocalView>,
        qname: &str,
        qtype: RecordType,
        edns: Option<Edns>,
        f: impl FnOnce(&Decision<'_>),
    ) {
        let zones = [zone()];
        let rebuilt = ArcSwapOption::empty();
        let src = Source {
            zones: &zones,
            rebuilt: &rebuilt,
            ttl: 20,
            max_udp_payload: 1232,
        };
        let name = LowerName::new(&Name::from_ascii(qname).expect("a name"));
        let q = Query {
            name: &name,
            class: DNSClass::IN,
            qtype,
            edns: edns.as_ref(),
            ecs_octets_ok: true,
            src: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 5)),
        };
        f(&decide(&src, view, &q, &mut Scratch::default()));
    }

    fn answer<'d>(d: &'d Decision<'_>) -> &'d Answer<'d> {
        match d {
            Decision::Answer(a) => a,
            Decision::Bare(code) => panic!("a bare {code:?}, not an answer"),
        }
    }

    fn echoed_scope(a: &Answer<'_>) -> Option<u8> {
        match a.edns.as_ref()?.option(EdnsCode::Subnet)? {
            EdnsOption::Subnet(s) => Some(s.scope_prefix()),
            _ => None,
        }
    }

    /// Selectors rebuilt for a view are used with the view of that identity (epoch, version)
    /// only: version 1 of another epoch (another mapper's map) has its own.
    #[test]
    fn rebuilt_selectors_serve_the_identity_they_were_built_for() {
        let v = view(); // version 1 of epoch 1
        let other = view_with_server("198.51.100.9");
        let zones = [zone()];
        let name = LowerName::new(&Name::from_ascii("www.video.example.").expect("a name"));
        let q = Query {
            name: &name,
            class: DNSClass::IN,
            qtype: RecordType::A,
            edns: None,
            ecs_octets_ok: true,
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)),
        };
        for (built_for, want) in [((1, 1), [198, 51, 100, 9]), ((2, 1), [192, 0, 2, 1])] {
            let servers = other.build_servers(&[]).expect("selectors");
            let rebuilt = ArcSwapOption::from_pointee((built_for, servers));
            let src = Source {
                zones: &zones,
                rebuilt: &rebuilt,
                ttl: 20,
                max_udp_payload: 1232,
            };
            let d = decide(&src, Some(&v), &q, &mut Scratch::default());
            let ips: Vec<RData> = answer(&d).records.iter().map(|r| r.data.clone()).collect();
            assert_eq!(
                ips,
                [RData::A(A(Ipv4Addr::from(want)))],
                "built for {built_for:?}"
            );
        }
    }

    #[test]
    fn names_outside_the_zones_are_refused_and_no_map_is_servfail() {
        let v = view();
        check(Some(&v), "www.other.test.", RecordType::A, None, |d| {
            assert!(matches!(d, Decision::Bare(ResponseCode::Refused)), "{d:?}");
        });
        check(None, "www.video.example.", RecordType::A, None, |d| {
            assert!(matches!(d, Decision::Bare(ResponseCode::ServFail)), "{d:?}");
        });
        // A query's ECS scope must be 0; a source prefix beyond the family's bits is malformed.
        check(
            Some(&v),
            "www.video.example.",
            RecordType::A,
            Some(("10.0.0.0", 33)),
            |d| {
                assert!(matches!(d, Decision::Bare(ResponseCode::FormErr)), "{d:?}");
            },
        );
    }

    /// RFC 7871 §6: address bits beyond the source prefix are FORMERR; RFC 5936: zone
    /// transfers are refused; RFC 8482 §4.2: ANY is one HINFO, at a mapped name and the apex.
    #[test]
    fn host_bits_transfers_and_any_answer_as_their_rfcs_say() {
        let v = view();
        let name = "www.video.example.";
        check(Some(&v), name, RecordType::A, Some(("10.0.0.1", 24)), |d| {
            assert!(matches!(d, Decision::Bare(ResponseCode::FormErr)), "{d:?}");
        });
        check(Some(&v), name, RecordType::A, Some(("10.0.0.0", 24)), |d| {
            assert_eq!(answer(d).records.len(), 1, "{d:?}");
        });
        for qtype in [RecordType::AXFR, RecordType::IXFR] {
            check(Some(&v), "example.", qtype, None, |d| {
                assert!(matches!(d, Decision::Bare(ResponseCode::Refused)), "{d:?}");
            });
        }
        for qname in [name, "example."] {
            check(Some(&v), qname, RecordType::ANY, None, |d| {
                let a = answer(d);
                assert_eq!(a.code, ResponseCode::NoError);
                assert_eq!(a.records.len(), 1, "{d:?}");
                let expected = RData::HINFO(HINFO::new("RFC8482".into(), String::new()));
                assert_eq!(a.records[0].data, expected);
                assert_eq!(a.records[0].ttl, ANY_HINFO_TTL);
                assert_eq!(a.demand, None);
            });
        }
        check(
            Some(&v),
            "www.unknown.example.",
            RecordType::ANY,
            None,
            |d| {
                assert_eq!(answer(d).code, ResponseCode::NXDomain);
            },
        );
    }

    /// RFC 6891 §6.1.3: a query of EDNS version 1 is BADVERS with an OPT record of version
    /// 0, inside the zones or not.
    #[test]
    fn an_edns_version_above_0_is_badvers() {
        let v = view();
        let mut edns = Edns::new();
        edns.set_version(1);
        for qname in ["www.video.example.", "www.other.test."] {
            check_edns(Some(&v), qname, RecordType::A, Some(edns.clone()), |d| {
                let a = answer(d);
                assert_eq!(a.code, ResponseCode::BADVERS, "{qname}");
                assert!(a.records.is_empty());
                assert_eq!(a.edns.as_ref().map(Edns::version), Some(0));
            });
        }
    }

    #[test]
    fn the_apex_answers_soa_and_ns_without_a_map() {
        check(None, "example.", RecordType::SOA, None, |d| {
            let a = answer(d);
            assert_eq!(a.code, ResponseCode::NoError);
            assert_eq!(a.records.len(), 1);
            assert_eq!(a.records[0].record_type(), RecordType::SOA);
            assert_eq!(a.ns.len(), 1);
            assert!(a.soa.is_empty());
        });
        check(None, "example.", RecordType::A, None, |d| {
            let a = answer(d);
            assert!(a.records.is_empty());
            assert_eq!(a.soa.len(), 1);
        });
    }

    #[test]
    fn a_name_no_rule_names_is_nxdomain_with_the_soa() {
        let v = view();
        check(Some(&v), "www.unknown.example.", RecordType::A, None, |d| {
            let a = answer(d);
            assert_eq!(a.code, ResponseCode::NXDomain);
            assert!(a.records.is_empty());
            assert_eq!(a.soa.len(), 1);
            assert_eq!(a.demand, None);
        });
    }

    #[test]
    fn the_ecs_scope_is_the_units_prefix_and_the_query_counts_as_demand() {
        let v = view();
        check(
            Some(&v),
            "www.video.example.",
            RecordType::A,
            Some(("10.0.0.77", 32)),
            |d| {
                let a = answer(d);
                assert_eq!(a.code, ResponseCode::NoError);
                let ips: Vec<RData> = a.records.iter().map(|r| r.data.clone()).collect();
                assert_eq!(ips, [RData::A(A(Ipv4Addr::new(192, 0, 2, 1)))]);
                assert!(a.soa.is_empty());
                assert_eq!(echoed_scope(a), Some(24));
                let d = a.demand.expect("the unit's demand");
                assert_eq!(d.client, "10.0.0.77/32".parse::<IpNet>().expect("a net"));
                assert_eq!((d.answer.prefix_len, d.answer.class), (24, 0));
                assert!(!a.count_host, "no cluster selects with bounded loads");
            },
        );
        // A source prefix of 0: the resolver's address is the client, the scope echoed 0.
        check(
            Some(&v),
            "www.video.example.",
            RecordType::A,
            Some(("0.0.0.0", 0)),
            |d| {
                assert_eq!(echoed_scope(answer(d)), Some(0));
            },
        );
        // No ECS in the query: none echoed; the resolver's address is in no unit (the class's
        // fallback answers), so nothing counts as demand.
        check(Some(&v), "www.video.example.", RecordType::A, None, |d| {
            let a = answer(d);
            assert!(a.edns.is_none());
            assert_eq!(a.records.len(), 1);
            assert_eq!(a.demand, None);
        });
    }

    #[test]
    fn aaaa_without_an_ipv6_server_and_other_types_are_nodata() {
        let v = view();
        for qtype in [RecordType::AAAA, RecordType::TXT] {
            check(Some(&v), "www.video.example.", qtype, None, |d| {
                let a = answer(d);
                assert_eq!(a.code, ResponseCode::NoError, "{qtype}");
                assert!(a.records.is_empty(), "{qtype}");
                assert_eq!(a.soa.len(), 1, "{qtype}");
            });
        }
    }
}
