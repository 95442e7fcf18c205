//! Answering one DNS query from the local map (hickory's `RequestHandler`).
//!
//! - Names outside every configured zone: REFUSED.
//! - The apex: SOA and NS; other types there: NOERROR with no answers and the SOA.
//! - Names below the apex that a hostname rule names: A/AAAA from the map (the client subnet of
//!   the query's EDNS Client Subnet option, else the resolver's address), the ECS option echoed
//!   with the scope set to the matched map unit's prefix length; other types: NOERROR, no
//!   answers, the SOA. Names no rule names: NXDOMAIN with the SOA.
//! - No map yet: SERVFAIL. Anything but a standard query: NOTIMP; not exactly one question:
//!   FORMERR.
//!
//! Truncation is hickory's: a UDP response larger than the smaller of the client's EDNS buffer
//! and `max_udp_payload` (512 bytes without EDNS) is cut with TC set, and the client asks again
//! over TCP.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, MessageType, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};
use hickory_server::proto::rr::rdata::{A, AAAA, NS, SOA};
use hickory_server::proto::rr::{DNSClass, LowerName, Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use ipnet::IpNet;

use super::config::ZoneConfig;
use super::demand::DemandCounter;
use super::local::LocalView;

/// SOA timers (seconds): refresh, retry, expire, minimum (the negative-caching TTL).
const SOA_TIMERS: (i32, i32, i32, u32) = (3600, 600, 86_400, 60);

/// A served zone, with its apex records made once.
pub struct Zone {
    pub apex: LowerName,
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
        Zone {
            apex: LowerName::new(&apex),
            soa,
            ns,
        }
    }
}

/// Per-thread buffers, so answering a query allocates no strings.
#[derive(Default)]
struct Scratch {
    qname: String,
    key: String,
    addrs: Vec<IpAddr>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Queries answered, by outcome: `cdnmap_dns_queries_total{rcode=...}` (registered once, so
/// counting a query is one atomic add, and nothing without a metrics recorder).
pub struct Counters {
    answer: metrics::Counter,
    nodata: metrics::Counter,
    nxdomain: metrics::Counter,
    refused: metrics::Counter,
    servfail: metrics::Counter,
    formerr: metrics::Counter,
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
        }
    }
}

/// What the handler reads: the zones, the published view, the counters.
pub struct Front {
    pub zones: Vec<Zone>,
    pub view: ArcSwapOption<LocalView>,
    /// Selectors rebuilt each report period over the hostnames seen (bounded loads), for the
    /// view version they were built for.
    pub servers: ArcSwapOption<(u64, cdnmap_serve::servers::Servers)>,
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
fn client_subnet(edns: Option<&Edns>) -> Result<Option<ClientSubnet>, ()> {
    let Some(EdnsOption::Subnet(ecs)) = edns.and_then(|e| e.option(EdnsCode::Subnet)) else {
        return Ok(None);
    };
    let bits = if ecs.addr().is_ipv4() { 32 } else { 128 };
    if ecs.source_prefix() > bits || ecs.scope_prefix() != 0 {
        return Err(()); // RFC 7871 §7.1.1: a query's scope must be 0
    }
    Ok(Some(*ecs))
}

async fn answer<R: ResponseHandler>(
    front: &Front,
    request: &Request,
    mut response: R,
) -> Result<ResponseInfo, hickory_server::net::NetError> {
    let query = &request.queries.queries()[0];
    let builder = MessageResponseBuilder::from_message_request(request);
    let name = query.name();
    let Some(zone) = front.zones.iter().find(|z| z.apex.zone_of(name)) else {
        front.counters.refused.increment(1);
        let m = metadata(request, ResponseCode::Refused, false);
        return response.send_response(builder.build_no_records(m)).await;
    };
    if query.query_class() != DNSClass::IN {
        front.counters.refused.increment(1);
        let m = metadata(request, ResponseCode::Refused, false);
        return response.send_response(builder.build_no_records(m)).await;
    }
    let ecs = match client_subnet(request.edns.as_ref()) {
        Ok(ecs) => ecs,
        Err(()) => {
            front.counters.formerr.increment(1);
            let m = metadata(request, ResponseCode::FormErr, false);
            return response.send_response(builder.build_no_records(m)).await;
        }
    };
    // The response's OPT record: our buffer size, and the ECS option echoed with its scope.
    let mut edns_out = request.edns.as_ref().map(|req| {
        let mut e = Edns::new();
        e.set_max_payload(req.max_payload().clamp(512, front.max_udp_payload));
        e.set_version(0);
        e
    });
    let qtype = query.query_type();
    let apex = zone.apex == *name;
    let soa = std::slice::from_ref(&zone.soa);
    let mut records: Vec<Record> = Vec::new();
    let mut code = ResponseCode::NoError;
    let mut with_soa = false;
    let mut ns: &[Record] = &[];
    if apex {
        match qtype {
            RecordType::SOA => records.push(zone.soa.clone()),
            RecordType::NS => records.extend(zone.ns.iter().cloned()),
            _ => with_soa = true,
        }
        if qtype == RecordType::SOA {
            ns = &zone.ns;
        }
    } else {
        let guard = front.view.load();
        let Some(view) = guard.as_deref() else {
            front.counters.servfail.increment(1);
            let m = metadata(request, ResponseCode::ServFail, false);
            return response.send_response(builder.build_no_records(m)).await;
        };
        SCRATCH.with_borrow_mut(|scratch| {
            let Scratch { qname, key, addrs } = scratch;
            qname.clear();
            let _ = write!(qname, "{name}");
            if view.resolver.rules().rule_class(qname).is_none() {
                code = ResponseCode::NXDomain;
                with_soa = true;
                return;
            }
            if !matches!(qtype, RecordType::A | RecordType::AAAA) {
                with_soa = true;
                return;
            }
            let client = match &ecs {
                Some(e) if e.source_prefix() > 0 => IpNet::new(e.addr(), e.source_prefix())
                    .map(|n| n.trunc())
                    .ok(),
                _ => None,
            }
            .unwrap_or_else(|| IpNet::from(request.src().ip()));
            let a = view.resolver.resolve(client, qname);
            let v6 = qtype == RecordType::AAAA;
            let rebuilt = front.servers.load();
            let servers = match rebuilt.as_deref() {
                Some((version, s)) if *version == view.version => Some(s),
                _ => view.servers(),
            };
            addrs.clear();
            if let Some(servers) = servers {
                servers.answer(&a, qname, v6, key, addrs);
            }
            let owner: Name = name.into();
            for &ip in addrs.iter() {
                let rdata = match ip {
                    IpAddr::V4(v4) => RData::A(A(v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
                };
                records.push(Record::from_rdata(owner.clone(), front.ttl, rdata));
            }
            if records.is_empty() {
                with_soa = true; // no server of the family: NODATA
            }
            if let (Some(e), Some(ecs)) = (edns_out.as_mut(), &ecs) {
                let mut echo = *ecs;
                echo.set_scope_prefix(if ecs.source_prefix() == 0 {
                    0
                } else {
                    a.scope_prefix_len
                });
                e.options_mut().insert(EdnsOption::Subnet(echo));
            }
            if a.unit.is_some() {
                front
                    .demand
                    .count(view, &client, a.scope_prefix_len, a.class);
            }
            if view.has_bounded {
                front.demand.count_host(qname);
            }
        });
    }
    match code {
        ResponseCode::NXDomain => &front.counters.nxdomain,
        _ if records.is_empty() => &front.counters.nodata,
        _ => &front.counters.answer,
    }
    .increment(1);
    let m = metadata(request, code, true);
    let mut builder = builder;
    if let Some(e) = edns_out.as_ref() {
        builder.edns(e);
    }
    let soa_iter: &[Record] = if with_soa { soa } else { &[] };
    response
        .send_response(builder.build(m, records.iter(), ns.iter(), soa_iter.iter(), []))
        .await
}
