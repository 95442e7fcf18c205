//! What the front end's tasks share (`Front`): the served zones and their apex records, the
//! view answered from and the selectors answering with it (one swap), the demand counted, and
//! the query counters; and each answering thread's scratch buffers. Both answering paths, the
//! fast path (`crate::wire`) and hickory's (`crate::answer`), read it.

use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use hickory_server::proto::rr::rdata::{NS, SOA};
use hickory_server::proto::rr::{Name, RData, Record};

use cdnmap_serve::answer::{self, Decision, Rcode, Records};
use cdnmap_serve::resolve::Route;
use cdnmap_serve::servers::Servers;

use super::config::ZoneConfig;
use super::demand::DemandCounter;
use super::local::{Live, LocalView};

/// SOA timers (seconds): refresh, retry, expire, minimum (the negative-caching TTL).
const SOA_TIMERS: (i32, i32, i32, u32) = (3600, 600, 86_400, 60);

/// The served zones: where names fall among them (`cdnmap_serve::answer::Zones`, in the
/// configuration's order) and each one's apex records, made once.
pub struct Zones {
    pub names: answer::Zones,
    records: Vec<ApexRecords>,
}

/// A zone's SOA and NS records.
struct ApexRecords {
    soa: Record,
    ns: Vec<Record>,
}

impl Zones {
    pub fn new(zones: &[ZoneConfig], serial: u32, ttl: u32) -> Zones {
        let records = zones
            .iter()
            .map(|z| ApexRecords::new(z, serial, ttl))
            .collect();
        let names = answer::Zones::new(zones.iter().map(|z| z.apex.iter()));
        Zones { names, records }
    }

    /// Zone `z`'s SOA record, as a section.
    pub(crate) fn soa(&self, z: Option<usize>) -> &[Record] {
        z.and_then(|z| self.records.get(z))
            .map_or(&[], |r| std::slice::from_ref(&r.soa))
    }

    /// Zone `z`'s NS records.
    pub(crate) fn ns(&self, z: Option<usize>) -> &[Record] {
        z.and_then(|z| self.records.get(z)).map_or(&[], |r| &r.ns)
    }
}

impl ApexRecords {
    fn new(z: &ZoneConfig, serial: u32, ttl: u32) -> ApexRecords {
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
        ApexRecords { soa, ns }
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

/// Responses by their rcode (`cdnmap_dns_responses_total{rcode, answer}`: `rcode` the
/// response's RCODE mnemonic, `answer` "records" or "nodata" for NOERROR, "none" otherwise),
/// registered once, so counting a response is one atomic add, and nothing without a metrics
/// recorder.
pub struct Counters {
    pub(crate) answer: metrics::Counter,
    nodata: metrics::Counter,
    nxdomain: metrics::Counter,
    refused: metrics::Counter,
    servfail: metrics::Counter,
    pub(crate) formerr: metrics::Counter,
    pub(crate) notimp: metrics::Counter,
    badvers: metrics::Counter,
    /// Answers with addresses by why they name them (`Route`, in its order).
    routes: [metrics::Counter; Route::ALL.len()],
}

/// The `cdnmap_dns_responses_total` counter of `rcode` (a mnemonic of RFC 1035 / 6891) and
/// `answer`.
pub fn response_counter(rcode: &'static str, answer: &'static str) -> metrics::Counter {
    metrics::counter!("cdnmap_dns_responses_total", "rcode" => rcode, "answer" => answer)
}

impl Counters {
    pub fn register() -> Counters {
        let c = |rcode: &'static str| response_counter(rcode, "none");
        let counters = Counters {
            answer: response_counter("NOERROR", "records"),
            nodata: response_counter("NOERROR", "nodata"),
            nxdomain: c("NXDOMAIN"),
            refused: c("REFUSED"),
            servfail: c("SERVFAIL"),
            formerr: c("FORMERR"),
            notimp: c("NOTIMP"),
            badvers: c("BADVERS"),
            routes: Route::ALL.map(
                |r| metrics::counter!("cdnmap_dns_answers_by_route_total", "route" => r.as_str()),
            ),
        };
        // Every series at 0 from the start (an alert on a rate sees 0, not nothing).
        for c in [
            &counters.answer,
            &counters.nodata,
            &counters.nxdomain,
            &counters.refused,
            &counters.servfail,
            &counters.formerr,
            &counters.notimp,
            &counters.badvers,
        ]
        .into_iter()
        .chain(&counters.routes)
        {
            c.increment(0);
        }
        counters
    }

    /// The counter of answers with addresses routed so.
    pub(crate) fn route(&self, r: Route) -> &metrics::Counter {
        &self.routes[r as usize]
    }

    /// The `cdnmap_dns_responses_total` counter a decision counts in.
    pub(crate) fn outcome(&self, d: &Decision<'_>) -> &metrics::Counter {
        match (d.rcode, d.records) {
            (Rcode::Refused, _) => &self.refused,
            (Rcode::FormErr, _) => &self.formerr,
            (Rcode::ServFail, _) => &self.servfail,
            (Rcode::NxDomain, _) => &self.nxdomain,
            (Rcode::BadVers, _) => &self.badvers,
            (Rcode::NoError, Records::None) => &self.nodata,
            (Rcode::NoError, _) => &self.answer,
        }
    }
}

/// What the handler reads: the zones, the published view, the counters.
pub struct Front {
    pub zones: Zones,
    /// The view answered from and the selectors answering with it, swapped as one
    /// ([`Front::put_view`], [`Front::put_rebuilt`]).
    pub live: ArcSwapOption<Live>,
    pub ttl: u32,
    pub max_udp_payload: u16,
    pub demand: DemandCounter,
    /// The hostnames of the last report period and their queries: the bounded-loads weights.
    pub hot_hosts: arc_swap::ArcSwap<Vec<(String, f64)>>,
    /// Where the current demand report period began.
    pub period_start_unix_ms: std::sync::atomic::AtomicI64,
    pub counters: Counters,
}

impl Front {
    /// A front end with no map yet.
    pub fn new(zones: Zones, ttl: u32, max_udp_payload: u16, period_start_unix_ms: i64) -> Front {
        Front {
            zones,
            live: ArcSwapOption::empty(),
            ttl,
            max_udp_payload,
            demand: DemandCounter::default(),
            hot_hosts: arc_swap::ArcSwap::default(),
            period_start_unix_ms: std::sync::atomic::AtomicI64::new(period_start_unix_ms),
            counters: Counters::register(),
        }
    }

    /// Answers from `view` from now on, with the selectors built with it.
    pub fn put_view(&self, view: LocalView) {
        self.live.store(Some(Arc::new(Live::new(Arc::new(view)))));
    }

    /// The view answered from, if any.
    pub fn view(&self) -> Option<Arc<LocalView>> {
        self.live.load().as_ref().map(|l| Arc::clone(&l.view))
    }

    /// Answers with `servers` (rebuilt over the last period's hostnames for bounded loads)
    /// when `view` is still the one answered from; says whether it did. A view put in use
    /// meanwhile keeps its own selectors: selectors are never used with a view they were not
    /// built for (another version, or the same version number of another epoch).
    pub fn put_rebuilt(&self, view: &Arc<LocalView>, servers: Servers) -> bool {
        let current = self.live.load();
        if !current.as_ref().is_some_and(|l| Arc::ptr_eq(&l.view, view)) {
            return false;
        }
        let next = Live::rebuilt(Arc::clone(view), servers);
        let before = self.live.compare_and_swap(&current, Some(Arc::new(next)));
        match (before.as_ref(), current.as_ref()) {
            (Some(b), Some(c)) => Arc::ptr_eq(b, c),
            _ => false,
        }
    }
}
