//! What the front end's tasks share (`Front`): the served zones and their apex records, the
//! view answered from and the selectors answering with it (one swap), the demand counted, and
//! the query counters; and each answering thread's scratch buffers. Both answering paths, the
//! fast path (`crate::wire`) and hickory's (`crate::answer`), read it.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use hickory_server::proto::rr::rdata::{NS, SOA};
use hickory_server::proto::rr::{Name, RData, Record};

use cdnmap_serve::answer::{self, Decision, Rcode, Records};
use cdnmap_serve::resolve::Route;
use cdnmap_serve::servers::Servers;

use super::config::ZoneConfig;
use super::demand::DemandCounter;
use super::local::{Live, LocalView};
use super::service::Services;
use super::zonedata::StaticData;

/// SOA timers (seconds): refresh, retry, expire, minimum (the negative-caching TTL).
const SOA_TIMERS: (i32, i32, i32, u32) = (3600, 600, 86_400, 60);

/// The served zones: where names fall among them (`cdnmap_serve::answer::Zones`, in the
/// configuration's order), each one's apex records, made once, their static records
/// (`crate::zonedata`) and their SOA serial.
///
/// **The serial** is one for the whole fleet, never a process's start time: `soa_serial` when
/// configured, else the epoch of the map answered from, in seconds (the mapper's start, Unix
/// time: the same on every front end following the same mappers, and a larger one after each
/// restart of the mapper; seconds fit a u32 until 2106). Before the first map it is 1. It
/// moves only forward in RFC 1982 serial arithmetic ([`Zones::follow_epoch`]): a front end
/// that keeps running never answers an older serial.
pub struct Zones {
    pub names: answer::Zones,
    records: Vec<ApexRecords>,
    /// The static records (empty without `[[records]]`), replaced whole on SIGHUP
    /// ([`Zones::reload`]).
    pub statics: ArcSwap<StaticData>,
    /// The service bindings (empty without `[[services]]`), replaced whole on SIGHUP.
    pub services: ArcSwap<Services>,
    serial: AtomicU32,
    /// The serial follows the map's epoch (no `soa_serial`).
    derived_serial: AtomicBool,
}

/// A zone's SOA and NS records.
struct ApexRecords {
    soa: Record,
    ns: Vec<Record>,
}

/// Whether serial `a` is after `b` (RFC 1982 §3.2, 32 bits).
pub fn serial_after(a: u32, b: u32) -> bool {
    a != b && (a.wrapping_sub(b) as i32) > 0
}

impl Zones {
    /// Zones with a fixed serial and no static records.
    pub fn new(zones: &[ZoneConfig], serial: u32, ttl: u32) -> Zones {
        Zones::with_data(zones, Some(serial), ttl, StaticData::default())
    }

    /// Zones with the configured serial `soa_serial` (`None`: the map's epoch) and static
    /// records `statics`.
    pub fn with_data(
        zones: &[ZoneConfig],
        soa_serial: Option<u32>,
        ttl: u32,
        statics: StaticData,
    ) -> Zones {
        let records = zones.iter().map(|z| ApexRecords::new(z, ttl)).collect();
        let names = answer::Zones::new(zones.iter().map(|z| z.apex.iter()));
        Zones {
            names,
            records,
            statics: ArcSwap::from_pointee(statics),
            services: ArcSwap::from_pointee(Services::default()),
            serial: AtomicU32::new(soa_serial.unwrap_or(1)),
            derived_serial: AtomicBool::new(soa_serial.is_none()),
        }
    }

    /// These zones publishing the service bindings `services`.
    pub fn with_services(self, services: Services) -> Zones {
        self.services.store(Arc::new(services));
        self
    }

    /// The SOA serial answered now.
    pub fn serial(&self) -> u32 {
        self.serial.load(Ordering::Relaxed)
    }

    /// Follows a map of epoch `epoch_ms` (Unix milliseconds at the mapper's start): the serial
    /// becomes its seconds when that is after the serial in use (RFC 1982), never before.
    /// Nothing with a configured serial. Says whether the serial changed.
    pub fn follow_epoch(&self, epoch_ms: u64) -> bool {
        if !self.derived_serial.load(Ordering::Relaxed) {
            return false;
        }
        let secs = u32::try_from(epoch_ms / 1000).unwrap_or(u32::MAX).max(1);
        self.serial
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                serial_after(secs, now).then_some(secs)
            })
            .is_ok()
    }

    /// Takes reloaded zone data: the static records `statics`, and `soa_serial` (`None`: the
    /// serial follows the map's epoch from the next map on, forward only). A configured serial
    /// before the one in use (RFC 1982) is refused: the serial never goes backward. Says what
    /// it did, for the log.
    pub fn reload(&self, statics: StaticData, soa_serial: Option<u32>) -> Result<String, String> {
        if let Some(n) = soa_serial {
            let now = self.serial();
            if n != now && !serial_after(n, now) {
                return Err(format!(
                    "soa_serial {n} is before the serial in use, {now} (RFC 1982): the zone data is kept as it was"
                ));
            }
        }
        let names = statics.len();
        self.statics.store(Arc::new(statics));
        self.derived_serial
            .store(soa_serial.is_none(), Ordering::Relaxed);
        if let Some(n) = soa_serial {
            self.serial.store(n, Ordering::Relaxed);
        }
        Ok(format!(
            "{names} static names; SOA serial {}",
            soa_serial.map_or("from the map's epoch".to_string(), |n| n.to_string())
        ))
    }

    /// Zone `z`'s SOA record (with the serial in use), as a section.
    pub(crate) fn soa(&self, z: Option<usize>) -> Vec<Record> {
        let serial = self.serial();
        z.and_then(|z| self.records.get(z))
            .map(|r| {
                let mut soa = r.soa.clone();
                if let RData::SOA(s) = &mut soa.data {
                    s.serial = serial;
                }
                soa
            })
            .into_iter()
            .collect()
    }

    /// Zone `z`'s NS records.
    pub(crate) fn ns(&self, z: Option<usize>) -> &[Record] {
        z.and_then(|z| self.records.get(z)).map_or(&[], |r| &r.ns)
    }
}

impl ApexRecords {
    /// The SOA with serial 0 ([`Zones::soa`] sets the one in use).
    fn new(z: &ZoneConfig, ttl: u32) -> ApexRecords {
        let apex: Name = z.apex.clone();
        let soa = Record::from_rdata(
            apex.clone(),
            SOA_TIMERS.3,
            RData::SOA(SOA::new(
                z.nameservers[0].clone(),
                z.hostmaster.clone(),
                0,
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

    /// The counter of NOERROR responses without records.
    pub(crate) fn nodata(&self) -> &metrics::Counter {
        &self.nodata
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
    /// A digest of the static names the map's rules named, as last logged.
    shadowed: std::sync::atomic::AtomicU64,
    /// The front end's name, as NSID (RFC 5001) and CHAOS `id.server`/`hostname.bind` answer
    /// it ([`Front::with_identity`]; default `cdnmap-dns`).
    pub identity: Box<str>,
    /// The secrets server cookies are made and checked with (`crate::cookie`;
    /// [`Front::with_cookies`]; default a random secret).
    pub cookies: crate::cookie::Cookies,
    /// Response rate limiting of UDP responses (`crate::rrl`; [`Front::with_rrl`]; default
    /// none).
    pub rrl: Option<crate::rrl::Rrl>,
    /// DNSSEC: the keys in use (none: unsigned), the signature cache ([`Front::with_dnssec`]).
    pub dnssec: crate::dnssec::Signing,
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
            counters: {
                crate::rrl::register_counters();
                Counters::register()
            },
            shadowed: std::sync::atomic::AtomicU64::new(0),
            identity: "cdnmap-dns".into(),
            cookies: crate::cookie::Cookies::random(),
            rrl: None,
            dnssec: crate::dnssec::Signing::default(),
        }
    }

    /// The front end making and checking server cookies with `cookies`.
    pub fn with_cookies(mut self, cookies: crate::cookie::Cookies) -> Front {
        self.cookies = cookies;
        self
    }

    /// The front end limiting its UDP responses with `rrl` (`None`: not limited).
    pub fn with_rrl(mut self, rrl: Option<crate::rrl::Rrl>) -> Front {
        self.rrl = rrl;
        self
    }

    /// The front end answering NSID and CHAOS identity queries with `name` (its configured
    /// `name`, at most 253 bytes).
    pub fn with_identity(mut self, name: &str) -> Front {
        self.identity = name.into();
        self
    }

    /// The front end signing with `dnssec` (its keys, cache and validity).
    pub fn with_dnssec(mut self, dnssec: crate::dnssec::Signing) -> Front {
        self.dnssec = dnssec;
        self
    }

    /// Answers from `view` from now on, with the selectors built with it.
    pub fn put_view(&self, view: LocalView) {
        if self.zones.follow_epoch(view.epoch) {
            tracing::info!(
                serial = self.zones.serial(),
                epoch = view.epoch,
                "the SOA serial follows the map's epoch"
            );
        }
        self.warn_shadowed(&view);
        self.live.store(Some(Arc::new(Live::new(Arc::new(view)))));
    }

    /// Logs the static names the hostname rules of `view` also name (answered from their
    /// static records: `crate::zonedata`), when they are not the ones logged last.
    fn warn_shadowed(&self, view: &LocalView) {
        let statics = self.zones.statics.load();
        if statics.is_empty() {
            return;
        }
        let rules = view.resolver.rules();
        let named: Vec<&str> = statics
            .names()
            .into_iter()
            .filter(|n| rules.rule_class(n).is_some())
            .collect();
        let mut digest = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&named, &mut digest);
        let digest = std::hash::Hasher::finish(&digest);
        if self.shadowed.swap(digest, Ordering::Relaxed) != digest && !named.is_empty() {
            tracing::warn!(
                names = %named.join(" "),
                "static names the map's hostname rules also name: answered from their static records, not the map"
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DnsConfig;

    fn serial_of(zones: &Zones) -> u32 {
        match &zones.soa(Some(0))[0].data {
            RData::SOA(s) => s.serial,
            other => panic!("{other:?}"),
        }
    }

    /// Without `soa_serial` the serial is 1 until a map, then its epoch in seconds, and only
    /// moves forward (RFC 1982, across the wrap too); a configured one stays.
    #[test]
    fn the_serial_follows_the_maps_epoch_forward_only() {
        let config = DnsConfig::default();
        let zones = config.zones().expect("zones");
        let derived = Zones::with_data(&zones, None, 20, StaticData::default());
        assert_eq!(serial_of(&derived), 1);
        assert!(derived.follow_epoch(1_780_000_000_123));
        assert_eq!(serial_of(&derived), 1_780_000_000);
        assert!(!derived.follow_epoch(1_700_000_000_000), "an older epoch");
        assert_eq!(serial_of(&derived), 1_780_000_000);
        assert!(derived.follow_epoch(1_780_000_001_000));
        assert_eq!(derived.serial(), 1_780_000_001);
        let fixed = Zones::with_data(&zones, Some(7), 20, StaticData::default());
        assert!(!fixed.follow_epoch(1_780_000_000_000));
        assert_eq!(serial_of(&fixed), 7);
        // Reloaded: a configured serial forward is taken, one before it refused; none again
        // follows the epoch, forward only.
        assert_eq!(
            fixed.reload(StaticData::default(), Some(5)),
            Err("soa_serial 5 is before the serial in use, 7 (RFC 1982): the zone data is kept as it was".to_string())
        );
        assert!(fixed.reload(StaticData::default(), Some(8)).is_ok());
        assert_eq!(serial_of(&fixed), 8);
        assert!(fixed.reload(StaticData::default(), None).is_ok());
        assert!(fixed.follow_epoch(1_780_000_000_000));
        assert_eq!(serial_of(&fixed), 1_780_000_000);
        assert!(serial_after(1, u32::MAX) && !serial_after(u32::MAX, 1));
        assert!(!serial_after(5, 5));
    }
}
