//! The answer decision: what one query is answered with, decided once for the three ways a
//! query comes in — the DNS front end's fast path (`cdnmap-dns`, `wire.rs`), its hickory path
//! (`answer.rs`) and the mapper's `Resolve`/`ResolveBatch` (`cdnmap-api`, `mapping.rs`). Each
//! reads its query into a [`Query`], calls [`decide`] (or its two steps, [`admit`] and
//! [`from_map`], around a batch of resolver lookups), and only encodes the [`Decision`]: into
//! wire bytes, hickory's records, or protobuf.
//!
//! In order, as RFCs and operators expect of an authoritative server:
//!
//! 1. An EDNS version other than 0: BADVERS (RFC 6891 §6.1.3), before anything else.
//! 2. A name outside every zone, a class other than IN, a transfer of a zone (RFC 5936
//!    §2.2.1: the map changes every round and its zone is synthesized per client): REFUSED.
//!    A malformed ECS option: FORMERR (RFC 7871 §6, §7.1.1).
//! 3. A zone's apex: SOA (with the NS records in the authority section), NS, one HINFO for
//!    ANY (RFC 8482 §4.2), NODATA with the SOA for other types.
//! 4. No map yet: SERVFAIL. A name no hostname rule names: NXDOMAIN with the SOA.
//! 5. Otherwise the map answers: the resolver's [`Answer`] for the client (the ECS subnet, else
//!    the resolver's address); a unit whose every candidate is full or down goes to its
//!    class's last resort ([`Bypass`]) when it has one and it is not a CNAME back into the
//!    zones (a loop). A CNAME answers every type (RFC 1034 §3.6.2); ANY gets the HINFO; A and
//!    AAAA get the servers the selectors pick (every address of both clusters when there are
//!    no selectors), or NODATA when there is no server of the family; other types NODATA.
//!
//! The mapper's `Resolve` serves no zone: its queries are placed below no apex
//! ([`Place::Below`]`(None)`), are of class IN without EDNS, and no CNAME target is one of
//! its zones ([`Zones::default`]).
//!
//! A service binding (HTTPS or SVCB, RFC 9460) the front end publishes at a mapped name is
//! asked as [`QType::Service`]: its hints are the addresses of both families step 5 answers
//! the same client at that moment.
//!
//! Pure: no I/O, no clock, no allocation per query (the addresses go into the caller's
//! buffer; a service binding's IPv6 hints take one buffer of their own).

use std::net::IpAddr;

use cdnmap_mapper::model::ClassIdx;
use ipnet::IpNet;

use crate::resolve::{Answer, ClassRules, Resolver, Route};
use crate::servers::{key_hash_of, Servers};
use crate::watch::Bypass;

/// Without selectors, at most this many addresses of the two clusters are answered.
pub const MAX_UNSELECTED_ADDRESSES: usize = 8;

/// A zone's position among the [`Zones`] (the first holding a name decides).
pub type ZoneIdx = usize;

/// The served zones' apexes, as lower-case labels, in the configuration's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zones {
    apexes: Vec<Vec<Box<[u8]>>>,
}

/// Where a name falls among the zones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In no zone.
    Outside,
    /// At zone `.0`'s apex.
    Apex(ZoneIdx),
    /// Strictly below zone `.0`'s apex; `None` for a query of a server of no zone (the
    /// mapper's `Resolve`).
    Below(Option<ZoneIdx>),
}

impl Zones {
    /// Zones of these apexes, each given by its labels (the root by none).
    pub fn new<'a, A, L>(apexes: A) -> Zones
    where
        A: IntoIterator<Item = L>,
        L: IntoIterator<Item = &'a [u8]>,
    {
        let apexes = apexes
            .into_iter()
            .map(|labels| {
                labels
                    .into_iter()
                    .map(|l| l.to_ascii_lowercase().into_boxed_slice())
                    .collect()
            })
            .collect();
        Zones { apexes }
    }

    /// Zones of apexes given as text (`"example."`; `"."` the root), labels split at dots.
    pub fn of_text(apexes: &[&str]) -> Zones {
        Zones::new(apexes.iter().map(|a| text_labels(a).1))
    }

    pub fn len(&self) -> usize {
        self.apexes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.apexes.is_empty()
    }

    /// Where the name of these `count` labels (first to last, as on the wire) falls: the first
    /// zone whose apex's labels are its last ones (ASCII case ignored) holds it, as hickory's
    /// `Name::zone_of` says.
    #[inline]
    pub fn place<'l, I>(&self, count: usize, labels: I) -> Place
    where
        I: Iterator<Item = &'l [u8]> + Clone,
    {
        for (i, apex) in self.apexes.iter().enumerate() {
            if apex.len() > count {
                continue;
            }
            let tail = labels.clone().skip(count - apex.len());
            if tail.zip(apex).all(|(l, a)| l.eq_ignore_ascii_case(a)) {
                return if apex.len() == count {
                    Place::Apex(i)
                } else {
                    Place::Below(Some(i))
                };
            }
        }
        Place::Outside
    }

    /// Whether a CNAME to `target` (a name as [`Bypass::cname`] checks it) would point into
    /// these zones.
    pub fn holds(&self, target: &str) -> bool {
        let (count, labels) = text_labels(target);
        self.place(count, labels) != Place::Outside
    }
}

/// The labels of a name as text without escapes (`"a.b."`, `"a.b"`; `"."` or `""` the root),
/// and how many.
fn text_labels(name: &str) -> (usize, impl Iterator<Item = &[u8]> + Clone) {
    let bare = name.strip_suffix('.').unwrap_or(name);
    let count = if bare.is_empty() {
        0
    } else {
        bare.bytes().filter(|&b| b == b'.').count() + 1
    };
    (count, bare.split('.').map(str::as_bytes).take(count))
}

/// Whether a CNAME target can be answered: a DNS encoder (hickory's text parser) takes no
/// label beginning with '-', which [`Bypass::cname`] lets through. Such a target is kept as
/// the class's last resort (`Resolve` names it) but the DNS answer carries no record of it
/// (NODATA).
pub fn cname_answerable(target: &str) -> bool {
    !target.split('.').any(|l| l.starts_with('-'))
}

/// A query type, as far as the decision tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QType {
    A,
    Aaaa,
    /// ANY (255).
    Any,
    Soa,
    Ns,
    /// AXFR or IXFR.
    Transfer,
    /// A service binding (HTTPS or SVCB, RFC 9460) the front end publishes at the name: the
    /// map's addresses of both families are its hints. [`QType::of`] never gives it: the front
    /// end asks for it when its configuration has a binding for the name.
    Service,
    Other,
}

impl QType {
    /// The type of record type number `code`.
    pub fn of(code: u16) -> QType {
        match code {
            1 => QType::A,
            28 => QType::Aaaa,
            255 => QType::Any,
            6 => QType::Soa,
            2 => QType::Ns,
            251 | 252 => QType::Transfer,
            _ => QType::Other,
        }
    }

    /// [`Self::of`] a `Resolve` request's `qtype`.
    pub fn of_u32(code: u32) -> QType {
        u16::try_from(code).map_or(QType::Other, QType::of)
    }

    /// A or AAAA: the map's servers are asked for (as the client's connection will follow:
    /// its demand is counted).
    pub fn asks_addresses(self) -> bool {
        matches!(self, QType::A | QType::Aaaa)
    }

    /// A, AAAA or a service binding: the selectors pick servers for the answer.
    pub fn picks_servers(self) -> bool {
        matches!(self, QType::A | QType::Aaaa | QType::Service)
    }
}

/// A query's EDNS Client Subnet option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecs {
    Absent,
    /// Address bits beyond the source prefix, a source prefix beyond the family's bits, a
    /// scope other than 0 or address octets the prefix does not need: FORMERR.
    Malformed,
    /// A well-formed option: its address and source prefix length.
    Subnet {
        addr: IpAddr,
        source: u8,
    },
}

impl Ecs {
    /// The client the map answers: the subnet when its source prefix is longer than 0, else
    /// the resolver's address.
    #[inline]
    pub fn client(self, resolver: IpAddr) -> IpNet {
        match self {
            Ecs::Subnet { addr, source } if source > 0 => IpNet::new(addr, source)
                .map(|n| n.trunc())
                .unwrap_or_else(|_| IpNet::from(resolver)),
            _ => IpNet::from(resolver),
        }
    }
}

/// One query, as the decision reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query<'q> {
    /// The name as text (the hostname rules' and selectors' key; any case, with or without
    /// the final dot).
    pub name: &'q str,
    pub place: Place,
    pub class_in: bool,
    pub qtype: QType,
    /// The OPT record's EDNS version (`None`: no OPT record).
    pub edns_version: Option<u8>,
    pub ecs: Ecs,
    /// The client the map answers ([`Ecs::client`] for a DNS query).
    pub client: IpNet,
}

impl<'q> Query<'q> {
    /// A query of the mapper's `Resolve`: no zone, class IN, no EDNS, the client given.
    pub fn resolve(name: &'q str, qtype: u32, client: IpNet) -> Query<'q> {
        Query {
            name,
            place: Place::Below(None),
            class_in: true,
            qtype: QType::of_u32(qtype),
            edns_version: None,
            ecs: Ecs::Absent,
            client,
        }
    }
}

/// One map version as the decision answers from it.
#[derive(Debug, Clone, Copy)]
pub struct View<'v> {
    pub resolver: &'v Resolver,
    /// The selectors (`None`: every address of the answer's clusters, at most
    /// [`MAX_UNSELECTED_ADDRESSES`]).
    pub servers: Option<&'v Servers>,
    /// Per class name, its last resort.
    pub bypass: &'v [(String, Bypass)],
    /// Some cluster selects with bounded loads: address queries count their hostname.
    pub bounded: bool,
}

impl<'v> View<'v> {
    /// Class `k`'s last resort, if it has one.
    #[inline]
    pub fn bypass_of(&self, k: ClassIdx) -> Option<&'v Bypass> {
        let name = self.resolver.map().classes().get(usize::from(k))?;
        self.bypass
            .iter()
            .find(|(class, _)| class.as_str() == &**name)
            .map(|(_, b)| b)
    }
}

/// The response code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError,
    FormErr,
    ServFail,
    NxDomain,
    Refused,
    /// RFC 6891: the OPT record says version 0.
    BadVers,
}

impl Rcode {
    /// Its number (BADVERS is 16, its high bits in the OPT record).
    pub fn code(self) -> u16 {
        match self {
            Rcode::NoError => 0,
            Rcode::FormErr => 1,
            Rcode::ServFail => 2,
            Rcode::NxDomain => 3,
            Rcode::Refused => 5,
            Rcode::BadVers => 16,
        }
    }

    /// REFUSED, FORMERR and SERVFAIL are answered bare: no records, no OPT record, not
    /// authoritative.
    pub fn is_bare(self) -> bool {
        matches!(self, Rcode::Refused | Rcode::FormErr | Rcode::ServFail)
    }
}

/// The answer section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Records<'v> {
    None,
    /// The addresses the decision wrote into the caller's buffer (at least one).
    Addresses,
    Cname(&'v str),
    /// RFC 8482's HINFO for ANY.
    Hinfo,
    /// The zone's SOA record.
    Soa,
    /// The zone's NS records.
    Ns,
    /// The service binding's records ([`QType::Service`]): the addresses the decision wrote
    /// into the caller's buffer (IPv4 first, maybe none) are their hints.
    Service,
}

/// The authority section: the zone's SOA or NS records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    None,
    Soa,
    Ns,
}

/// What the map answered a query with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped<'v> {
    /// The client looked up.
    pub client: IpNet,
    /// The resolver's answer (unit, class, clusters, scope, route).
    pub answer: Answer,
    /// Why: the resolver's route, or [`Route::Bypass`] when the class's last resort answers.
    pub route: Route,
    /// The last resort answering, if one does.
    pub bypass: Option<&'v Bypass>,
    /// The scope echoed in the response's ECS option, when the query had one and the answer
    /// is addresses or a CNAME: the answer's scope, 0 for a source prefix of 0.
    pub ecs_scope: Option<u8>,
    /// The query asks for addresses (A or AAAA): the answer names its clusters' servers.
    pub asks_addresses: bool,
    /// Count the query as demand of `answer`'s unit (an A or AAAA query of a unit).
    pub demand: bool,
    /// Count the query's hostname (an A or AAAA query; some cluster selects with bounded loads).
    pub count_host: bool,
}

/// What to answer one query with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'v> {
    pub rcode: Rcode,
    /// The zone whose SOA and NS records `records` and `authority` name.
    pub zone: Option<ZoneIdx>,
    pub records: Records<'v>,
    pub authority: Authority,
    /// The map's answer, when the map was asked.
    pub mapped: Option<Mapped<'v>>,
}

impl<'v> Decision<'v> {
    fn bare(rcode: Rcode) -> Decision<'v> {
        Decision {
            rcode,
            zone: None,
            records: Records::None,
            authority: Authority::None,
            mapped: None,
        }
    }

    fn of_zone(rcode: Rcode, zone: Option<ZoneIdx>, records: Records<'v>, a: Authority) -> Self {
        Decision {
            rcode,
            zone,
            records,
            authority: a,
            mapped: None,
        }
    }

    /// The route an answer with records from the map counts under (addresses or a CNAME).
    pub fn routed(&self) -> Option<Route> {
        match self.records {
            Records::Addresses | Records::Cname(_) => self.mapped.map(|m| m.route),
            _ => None,
        }
    }
}

/// The decision for `q` from `view` (`None`: no map yet): [`admit`], the resolver's answer,
/// [`from_map`]. The addresses answered go into `out`, its content key into `key` when it is
/// not the name itself.
pub fn decide<'v>(
    zones: &Zones,
    view: Option<&View<'v>>,
    q: &Query<'_>,
    key: &mut String,
    out: &mut Vec<IpAddr>,
) -> Decision<'v> {
    out.clear();
    let class = match admit(q, view.map(|v| v.resolver.rules())) {
        Ok(class) => class,
        Err(decided) => return decided,
    };
    let Some(view) = view else {
        return Decision::bare(Rcode::ServFail); // `admit` says so first
    };
    let answer = view.resolver.resolve_in_class(q.client, q.name, class);
    let hash = if q.qtype.picks_servers() {
        key_hash_of(q.name, key)
    } else {
        0 // no servers are picked
    };
    from_map(zones, view, q, answer, hash, out)
}

/// [`decide`] for each of `queries` from `view`, their resolver lookups made together
/// ([`Resolver::resolve_classed`]: their cache misses overlap): `each` is given each query's
/// position, decision and addresses, in order.
pub fn decide_each<'v>(
    zones: &Zones,
    view: &View<'v>,
    queries: &[Query<'_>],
    mut each: impl FnMut(usize, &Decision<'v>, &[IpAddr]),
) {
    let rules = view.resolver.rules();
    let admitted: Vec<Result<ClassIdx, Decision<'static>>> =
        queries.iter().map(|q| admit(q, Some(rules))).collect();
    let lookups: Vec<(IpNet, &str, ClassIdx)> = queries
        .iter()
        .zip(&admitted)
        .filter_map(|(q, a)| a.as_ref().ok().map(|&class| (q.client, q.name, class)))
        .collect();
    let mut answers = Vec::with_capacity(lookups.len());
    view.resolver.resolve_classed(&lookups, &mut answers);
    let mut answers = answers.into_iter();
    let (mut key, mut out) = (String::new(), Vec::new());
    for (i, (q, admitted)) in queries.iter().zip(admitted).enumerate() {
        let d = match admitted {
            Err(decided) => {
                out.clear();
                decided
            }
            Ok(class) => {
                // One answer a query admitted, in order.
                let answer = answers
                    .next()
                    .unwrap_or_else(|| view.resolver.resolve_in_class(q.client, q.name, class));
                let hash = key_hash_of(q.name, &mut key);
                from_map(zones, view, q, answer, hash, &mut out)
            }
        };
        each(i, &d, &out);
    }
}

/// The first step: the decision for `q` when it is made before the map is asked (steps 1 to
/// 4 of the module docs), else the class of the rule naming it. `rules`: the view's hostname
/// rules (`None`: no map yet).
#[inline]
pub fn admit(q: &Query<'_>, rules: Option<&ClassRules>) -> Result<ClassIdx, Decision<'static>> {
    if q.edns_version.is_some_and(|v| v > 0) {
        return Err(Decision::bare(Rcode::BadVers));
    }
    let zone = match q.place {
        Place::Outside => return Err(Decision::bare(Rcode::Refused)),
        Place::Apex(z) => Some(z),
        Place::Below(z) => z,
    };
    let transfer = q.qtype == QType::Transfer && zone.is_some();
    if !q.class_in || transfer {
        return Err(Decision::bare(Rcode::Refused));
    }
    if q.ecs == Ecs::Malformed {
        return Err(Decision::bare(Rcode::FormErr));
    }
    if let Place::Apex(z) = q.place {
        return Err(apex(z, q.qtype));
    }
    let Some(rules) = rules else {
        return Err(Decision::bare(Rcode::ServFail));
    };
    rules.rule_class(q.name).ok_or(Decision::of_zone(
        Rcode::NxDomain,
        zone,
        Records::None,
        Authority::Soa,
    ))
}

/// The answer at zone `z`'s apex to a query of type `qtype`.
fn apex(z: ZoneIdx, qtype: QType) -> Decision<'static> {
    let (records, authority) = match qtype {
        QType::Any => (Records::Hinfo, Authority::None),
        QType::Soa => (Records::Soa, Authority::Ns),
        QType::Ns => (Records::Ns, Authority::None),
        _ => (Records::None, Authority::Soa),
    };
    Decision::of_zone(Rcode::NoError, Some(z), records, authority)
}

/// The second step: the decision for `q`, admitted, from the resolver's `answer` for it
/// (step 5 of the module docs). `hash` is its name's selection hash
/// ([`key_hash_of`]; read only for A and AAAA). The addresses answered go into `out`.
#[inline]
pub fn from_map<'v>(
    zones: &Zones,
    view: &View<'v>,
    q: &Query<'_>,
    answer: Answer,
    hash: u64,
    out: &mut Vec<IpAddr>,
) -> Decision<'v> {
    out.clear();
    let zone = match q.place {
        Place::Apex(z) => Some(z),
        Place::Below(z) => z,
        Place::Outside => None,
    };
    let bypass = last_resort(zones, view, &answer);
    let mut mapped = Mapped {
        client: q.client,
        answer,
        route: if bypass.is_some() {
            Route::Bypass
        } else {
            answer.route
        },
        bypass,
        ecs_scope: None,
        asks_addresses: q.qtype.asks_addresses(),
        demand: false,
        count_host: false,
    };
    let cname = match bypass {
        Some(Bypass::Cname(target)) => Some(target.as_str()),
        _ => None,
    };
    let (records, authority) = match (cname, q.qtype) {
        (None, QType::Any) => (Records::Hinfo, Authority::None),
        (None, t) if !t.asks_addresses() && t != QType::Service => (Records::None, Authority::Soa),
        _ => {
            let records = match q.qtype {
                QType::Service => hints(view, &answer, bypass, hash, out),
                t => addresses(view, t, &answer, bypass, hash, out),
            };
            mapped.ecs_scope = match q.ecs {
                Ecs::Subnet { source: 0, .. } => Some(0),
                Ecs::Subnet { .. } => Some(answer.scope_prefix_len),
                _ => None,
            };
            mapped.demand = mapped.asks_addresses && answer.unit.is_some();
            mapped.count_host = mapped.asks_addresses && view.bounded;
            match records {
                Records::None => (Records::None, Authority::Soa), // NODATA
                r => (r, Authority::None),
            }
        }
    };
    Decision {
        rcode: Rcode::NoError,
        zone,
        records,
        authority,
        mapped: Some(mapped),
    }
}

/// The records of an answer to a service binding query ([`QType::Service`]): a CNAME when the
/// last resort is one (it answers every type), else the binding with, as hints, the addresses
/// an A query and an AAAA query of the same client would get now (the same answer, the same
/// name's hash), IPv4 first, into `out`.
fn hints<'v>(
    view: &View<'v>,
    answer: &Answer,
    bypass: Option<&'v Bypass>,
    hash: u64,
    out: &mut Vec<IpAddr>,
) -> Records<'v> {
    let mut v6 = Vec::new();
    if let r @ Records::Cname(_) = addresses(view, QType::Aaaa, answer, bypass, hash, &mut v6) {
        return r;
    }
    addresses(view, QType::A, answer, bypass, hash, out);
    out.extend(v6);
    Records::Service
}

/// The class's last resort for `answer`, when its unit's every candidate is full or down and
/// the class has one that is not a CNAME into `zones`.
#[inline]
fn last_resort<'v>(zones: &Zones, view: &View<'v>, answer: &Answer) -> Option<&'v Bypass> {
    if !answer.route.bypassed() {
        return None;
    }
    view.bypass_of(answer.class).filter(|b| match b {
        Bypass::Cname(target) => !(cname_answerable(target) && zones.holds(target)),
        Bypass::Addresses(_) => true,
    })
}

/// The records of an answer to an A or AAAA query (or a CNAME to any): the last resort's, or
/// the servers the selectors pick, into `out`.
#[inline]
fn addresses<'v>(
    view: &View<'v>,
    qtype: QType,
    answer: &Answer,
    bypass: Option<&'v Bypass>,
    hash: u64,
    out: &mut Vec<IpAddr>,
) -> Records<'v> {
    let v6 = qtype == QType::Aaaa;
    match bypass {
        Some(Bypass::Cname(target)) if cname_answerable(target) => return Records::Cname(target),
        Some(Bypass::Cname(_)) => return Records::None,
        Some(Bypass::Addresses(all)) => {
            out.extend(all.iter().copied().filter(|ip| ip.is_ipv6() == v6));
        }
        None => match view.servers {
            Some(servers) => servers.answer_hashed(answer, hash, v6, out),
            None => {
                // The primary cluster's, then a companion's one, as `Servers::answer_hashed`
                // names them.
                let clusters = view.resolver.map().clusters();
                let of = |c: Option<cdnmap_mapper::model::ClusterIdx>| {
                    c.into_iter()
                        .flat_map(|c| clusters[c as usize].addresses.iter().copied())
                        .filter(|a| a.is_ipv6() == v6)
                };
                let companion = answer.secondary.filter(|_| answer.companion);
                let primary = MAX_UNSELECTED_ADDRESSES - usize::from(companion.is_some());
                out.extend(of(answer.primary).take(primary));
                out.extend(of(companion).take(1));
            }
        },
    }
    if out.is_empty() {
        Records::None
    } else {
        Records::Addresses
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cdnmap_mapper::model::ClusterState;

    use super::*;
    use crate::servers::Policy;
    use crate::serving::Builder;
    use crate::ServingCluster;

    /// The world of the tests: zone `example.`; clusters a (up, two IPv4 servers and one
    /// IPv6), b (down), c (up, one IPv4 server); per class a unit at a down cluster, whose
    /// last resort is a CNAME (web), addresses (video), a CNAME into the zone (apps: a loop,
    /// not taken) or one no DNS answer can carry (dash); a unit mapped, one on its backup,
    /// one split, one over IPv6.
    struct World {
        resolver: Resolver,
        servers: Servers,
        bypass: Vec<(String, Bypass)>,
    }

    fn world() -> World {
        let classes: Vec<Arc<str>> = ["video", "web", "apps", "dash"].map(Arc::from).to_vec();
        let cluster = |id: &str, state, addresses: &[&str]| ServingCluster {
            id: id.to_string(),
            addresses: addresses
                .iter()
                .map(|a| a.parse().expect("an address"))
                .collect(),
            state,
        };
        let clusters = vec![
            cluster(
                "a",
                ClusterState::Up,
                &["192.0.2.1", "192.0.2.2", "2001:db8::a"],
            ),
            cluster("b", ClusterState::Down, &["192.0.2.11"]),
            cluster("c", ClusterState::Up, &["192.0.2.21"]),
        ];
        let mut b = Builder::new(classes.clone(), clusters.clone()).expect("clusters");
        type Unit<'a> = (
            &'a str,
            ClassIdx,
            &'a str,
            &'a [(u32, f64)],
            [Option<u32>; 2],
        );
        let units: [Unit<'_>; 8] = [
            ("u1", 0, "10.0.0.0/24", &[(0, 1.0)], [Some(2), None]),
            ("u2", 1, "10.0.1.0/24", &[(1, 1.0)], [None, None]),
            ("u3", 0, "10.0.2.0/24", &[(1, 1.0)], [None, None]),
            ("u4", 2, "10.0.3.0/24", &[(1, 1.0)], [None, None]),
            ("u5", 2, "10.0.4.0/24", &[(1, 1.0)], [Some(2), None]),
            ("u6", 1, "10.0.5.0/24", &[(0, 0.5), (2, 0.5)], [None, None]),
            ("u7", 3, "10.0.6.0/24", &[(1, 1.0)], [None, None]),
            ("u8", 1, "2001:db8:1::/48", &[(0, 1.0)], [None, None]),
        ];
        for (id, class, prefix, shares, backups) in units {
            let prefix: IpNet = prefix.parse().expect("a prefix");
            b.push(id, class, [prefix], shares.iter().copied(), 0.0, backups)
                .expect(id);
        }
        b.set_fallback(&[
            [Some(0), Some(2)],
            [Some(2), Some(0)],
            [Some(2), None],
            [Some(2), None],
        ]);
        let map = Arc::new(b.finish());
        let rules: Vec<(String, String)> = [
            ("*.video.example", "video"),
            ("www.example", "web"),
            ("*.apps.example", "apps"),
            ("*.dash.example", "dash"),
        ]
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .to_vec();
        let rules = ClassRules::new(&classes, &rules, "web").expect("rules");
        let resolver = Resolver::new(map, rules).expect("an index");
        let policies = vec![Policy::default(); clusters.len()];
        let servers = Servers::build(&clusters, &policies, |_, _| 0.0, &[]).expect("selectors");
        let bypass = vec![
            (
                "web".into(),
                Bypass::cname("web.partner.test").expect("a name"),
            ),
            (
                "video".into(),
                Bypass::addresses(&["192.0.2.99".into(), "2001:db8::99".into()])
                    .expect("addresses"),
            ),
            (
                "apps".into(),
                Bypass::cname("loop.example.").expect("a name"),
            ),
            (
                "dash".into(),
                Bypass::cname("-x.partner.test").expect("a name"),
            ),
        ];
        World {
            resolver,
            servers,
            bypass,
        }
    }

    impl World {
        fn view(&self) -> View<'_> {
            View {
                resolver: &self.resolver,
                servers: Some(&self.servers),
                bypass: &self.bypass,
                bounded: true,
            }
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    /// A DNS query for `name` (text, with the final dot) of `qtype` from resolver
    /// 203.0.113.5, with the ECS option `ecs` (`Some((addr, source))`).
    fn dns_query<'q>(
        zones: &Zones,
        name: &'q str,
        qtype: u16,
        ecs: Option<(&str, u8)>,
    ) -> Query<'q> {
        let (count, labels) = text_labels(name);
        let ecs = match ecs {
            Some((addr, source)) => Ecs::Subnet {
                addr: ip(addr),
                source,
            },
            None => Ecs::Absent,
        };
        Query {
            name,
            place: zones.place(count, labels),
            class_in: true,
            qtype: QType::of(qtype),
            edns_version: Some(0),
            ecs,
            client: ecs.client(ip("203.0.113.5")),
        }
    }

    /// What a decision says, in short: its code, its records' kind, its authority section,
    /// its route, the ECS scope echoed and whether it counts as demand.
    fn summary<'v>(
        d: &Decision<'v>,
    ) -> (
        Rcode,
        Records<'v>,
        Authority,
        Option<Route>,
        Option<u8>,
        bool,
    ) {
        let m = d.mapped;
        (
            d.rcode,
            d.records,
            d.authority,
            m.map(|m| m.route),
            m.and_then(|m| m.ecs_scope),
            m.is_some_and(|m| m.demand),
        )
    }

    /// The decision table: every step of the order, with the addresses answered checked
    /// against the resolver and the selectors (or the last resort's), and `decide_each`
    /// deciding each query as `decide` does.
    #[test]
    fn decisions_follow_the_order_of_the_module_docs() {
        use Authority as Au;
        use Rcode::*;
        use Records as R;
        let w = world();
        let view = w.view();
        let zones = Zones::of_text(&["example."]);
        let (none, v4, v6) = (None, Some(("10.0.0.0", 24)), Some(("2001:db8:1::", 48)));
        let bypass = Some(Route::Bypass);
        type Row<'a> = (
            &'a str,
            u16,
            Option<(&'a str, u8)>,
            (
                Rcode,
                Records<'a>,
                Authority,
                Option<Route>,
                Option<u8>,
                bool,
            ),
        );
        let table: Vec<Row<'_>> = vec![
            (
                "www.other.test.",
                1,
                none,
                (Refused, R::None, Au::None, None, None, false),
            ),
            (
                "example.",
                252,
                none,
                (Refused, R::None, Au::None, None, None, false),
            ),
            (
                "example.",
                6,
                none,
                (NoError, R::Soa, Au::Ns, None, None, false),
            ),
            (
                "example.",
                2,
                none,
                (NoError, R::Ns, Au::None, None, None, false),
            ),
            (
                "example.",
                255,
                none,
                (NoError, R::Hinfo, Au::None, None, None, false),
            ),
            (
                "example.",
                1,
                none,
                (NoError, R::None, Au::Soa, None, None, false),
            ),
            (
                "nx.example.",
                1,
                v4,
                (NxDomain, R::None, Au::Soa, None, None, false),
            ),
            // Mapped, from the unit's prefix (its scope echoed) or the resolver's address
            // (in no unit: the class's fallback, no demand).
            (
                "v.video.example.",
                1,
                v4,
                (
                    NoError,
                    R::Addresses,
                    Au::None,
                    Some(Route::Mapped),
                    Some(24),
                    true,
                ),
            ),
            (
                "v.video.example.",
                1,
                Some(("10.0.0.0", 0)),
                (
                    NoError,
                    R::Addresses,
                    Au::None,
                    Some(Route::Unmatched),
                    Some(0),
                    false,
                ),
            ),
            (
                "v.video.example.",
                1,
                none,
                (
                    NoError,
                    R::Addresses,
                    Au::None,
                    Some(Route::Unmatched),
                    None,
                    false,
                ),
            ),
            (
                "v.video.example.",
                28,
                v4,
                (
                    NoError,
                    R::Addresses,
                    Au::None,
                    Some(Route::Mapped),
                    Some(24),
                    true,
                ),
            ),
            (
                "v.video.example.",
                16,
                v4,
                (NoError, R::None, Au::Soa, Some(Route::Mapped), None, false),
            ),
            (
                "v.video.example.",
                255,
                v4,
                (
                    NoError,
                    R::Hinfo,
                    Au::None,
                    Some(Route::Mapped),
                    None,
                    false,
                ),
            ),
            (
                "www.example.",
                28,
                v6,
                (
                    NoError,
                    R::Addresses,
                    Au::None,
                    Some(Route::Mapped),
                    Some(48),
                    true,
                ),
            ),
            (
                "www.example.",
                1,
                Some(("10.0.5.0", 24)),
                (
                    NoError,
                    R::Addresses,
                    Au::None,
                    Some(Route::Split),
                    Some(24),
                    true,
                ),
            ),
            (
                "x.apps.example.",
                1,
                Some(("10.0.4.0", 24)),
                (
                    NoError,
                    R::Addresses,
                    Au::None,
                    Some(Route::Backup),
                    Some(24),
                    true,
                ),
            ),
            // The last resorts: a CNAME answers every type; addresses of the family; a loop
            // back into the zone is not taken (the fallback answers, down); a target no DNS
            // answer can carry is NODATA.
            (
                "www.example.",
                1,
                Some(("10.0.1.0", 24)),
                (
                    NoError,
                    R::Cname("web.partner.test."),
                    Au::None,
                    bypass,
                    Some(24),
                    true,
                ),
            ),
            (
                "www.example.",
                16,
                Some(("10.0.1.0", 24)),
                (
                    NoError,
                    R::Cname("web.partner.test."),
                    Au::None,
                    bypass,
                    Some(24),
                    false,
                ),
            ),
            (
                "www.example.",
                255,
                Some(("10.0.1.0", 24)),
                (
                    NoError,
                    R::Cname("web.partner.test."),
                    Au::None,
                    bypass,
                    Some(24),
                    false,
                ),
            ),
            (
                "v.video.example.",
                28,
                Some(("10.0.2.0", 24)),
                (NoError, R::Addresses, Au::None, bypass, Some(24), true),
            ),
            (
                "v.video.example.",
                255,
                Some(("10.0.2.0", 24)),
                (NoError, R::Hinfo, Au::None, bypass, None, false),
            ),
            (
                "x.apps.example.",
                1,
                Some(("10.0.3.0", 24)),
                (
                    NoError,
                    R::Addresses,
                    Au::None,
                    Some(Route::Down),
                    Some(24),
                    true,
                ),
            ),
            (
                "x.dash.example.",
                1,
                Some(("10.0.6.0", 24)),
                (NoError, R::None, Au::Soa, bypass, Some(24), true),
            ),
        ];
        let queries: Vec<Query<'_>> = table
            .iter()
            .map(|(name, qtype, ecs, _)| dns_query(&zones, name, *qtype, *ecs))
            .collect();
        let mut decided = Vec::new();
        for (q, (name, qtype, _, want)) in queries.iter().zip(&table) {
            let (mut key, mut out) = (String::new(), Vec::new());
            let d = decide(&zones, Some(&view), q, &mut key, &mut out);
            assert_eq!(summary(&d), *want, "{name} type {qtype}");
            assert_eq!(d.zone, (d.rcode != Refused).then_some(0), "{name}");
            let want_out = match d.mapped {
                Some(m) if d.records == R::Addresses && m.route == Route::Bypass => {
                    vec![ip(if q.qtype == QType::Aaaa {
                        "2001:db8::99"
                    } else {
                        "192.0.2.99"
                    })]
                }
                Some(m) if d.records == R::Addresses => {
                    let a = w.resolver.resolve(q.client, q.name);
                    assert_eq!(a, m.answer, "{name}");
                    let mut picked = Vec::new();
                    w.servers
                        .answer(&a, q.name, q.qtype == QType::Aaaa, &mut key, &mut picked);
                    picked
                }
                _ => Vec::new(),
            };
            assert_eq!(out, want_out, "{name} type {qtype}");
            if let Some(m) = d.mapped {
                assert_eq!(m.count_host, m.asks_addresses, "bounded: {name}");
            }
            decided.push((d, out));
        }
        let mut each = Vec::new();
        decide_each(&zones, &view, &queries, |i, d, out| {
            each.push((i, *d, out.to_vec()))
        });
        let positions: Vec<usize> = each.iter().map(|e| e.0).collect();
        assert_eq!(positions, (0..queries.len()).collect::<Vec<_>>());
        let each: Vec<_> = each.into_iter().map(|(_, d, out)| (d, out)).collect();
        assert_eq!(each, decided);
    }

    /// A service binding's hints are the addresses an A query and an AAAA query of the same
    /// client get at that moment (IPv4 first), with the same ECS scope; a CNAME last resort
    /// answers it as it answers every type; it counts no demand (the client's address
    /// queries do).
    #[test]
    fn service_hints_are_the_address_answers_of_the_same_client() {
        let w = world();
        let view = w.view();
        let zones = Zones::of_text(&["example."]);
        let clients = [
            ("v.video.example.", "10.0.0.0", 24), // mapped
            ("www.example.", "10.0.5.0", 24),     // split
            ("x.apps.example.", "10.0.4.0", 24),  // on its backup
            ("v.video.example.", "10.0.2.0", 24), // last resort: addresses
            ("www.example.", "2001:db8:1::", 48), // over IPv6
            ("www.example.", "10.0.1.0", 24),     // last resort: a CNAME
            ("x.dash.example.", "10.0.6.0", 24),  // last resort no answer carries
        ];
        for (name, addr, source) in clients {
            let ask = |qtype: u16| {
                let mut q = dns_query(&zones, name, qtype, Some((addr, source)));
                if qtype == 65 {
                    q.qtype = QType::Service;
                }
                let (mut key, mut out) = (String::new(), Vec::new());
                let d = decide(&zones, Some(&view), &q, &mut key, &mut out);
                (d, out)
            };
            let (a, v4) = ask(1);
            let (aaaa, v6) = ask(28);
            let (service, hints) = ask(65);
            let m = service.mapped.expect("mapped");
            assert_eq!(m.ecs_scope, a.mapped.and_then(|m| m.ecs_scope), "{name}");
            assert!(!m.demand && !m.count_host, "{name}: no demand");
            match a.records {
                Records::Cname(t) => {
                    assert_eq!(service.records, Records::Cname(t), "{name}");
                    assert!(hints.is_empty(), "{name}");
                }
                _ => {
                    assert_eq!(service.records, Records::Service, "{name}");
                    assert_eq!(service.authority, Authority::None, "{name}");
                    assert_eq!(hints, [v4, v6].concat(), "{name}");
                }
            }
            assert_eq!(aaaa.mapped.map(|m| m.answer), Some(m.answer), "{name}");
        }
        // Without a binding configured the front end asks as for any other type: NODATA.
        let q = dns_query(&zones, "www.example.", 65, Some(("10.0.5.0", 24)));
        let d = decide(&zones, Some(&view), &q, &mut String::new(), &mut Vec::new());
        assert_eq!((d.records, d.authority), (Records::None, Authority::Soa));
    }

    /// Without a map, the apex still answers and the rest is SERVFAIL; ahead of everything,
    /// an EDNS version above 0 is BADVERS and a malformed ECS option FORMERR (inside a zone).
    #[test]
    fn badvers_formerr_and_servfail_come_in_their_order() {
        let w = world();
        let zones = Zones::of_text(&["example."]);
        let (mut key, mut out) = (String::new(), Vec::new());
        let mut decide = |view: Option<&View<'_>>, q: &Query<'_>| {
            decide(&zones, view, q, &mut key, &mut out).rcode
        };
        let q = dns_query(&zones, "v.video.example.", 1, None);
        assert_eq!(decide(None, &q), Rcode::ServFail);
        let apex = dns_query(&zones, "example.", 6, None);
        assert_eq!(decide(None, &apex), Rcode::NoError);
        let outside = dns_query(&zones, "www.other.test.", 1, None);
        for (q, want) in [(q, Rcode::BadVers), (outside, Rcode::BadVers)] {
            let q = Query {
                edns_version: Some(1),
                ..q
            };
            assert_eq!(decide(Some(&w.view()), &q), want);
        }
        let malformed = Query {
            ecs: Ecs::Malformed,
            ..q
        };
        assert_eq!(decide(Some(&w.view()), &malformed), Rcode::FormErr);
        let outside = Query {
            ecs: Ecs::Malformed,
            ..outside
        };
        assert_eq!(decide(Some(&w.view()), &outside), Rcode::Refused);
        let chaos = Query {
            class_in: false,
            ..q
        };
        assert_eq!(decide(Some(&w.view()), &chaos), Rcode::Refused);
    }

    /// `Resolve`'s queries: no zone, so transfers are not refused, a CNAME into "the zone" is
    /// no loop, and the client is the one given; without selectors, every address of the
    /// answer's clusters.
    #[test]
    fn resolve_serves_no_zone() {
        let w = world();
        let zones = Zones::default();
        let (mut key, mut out) = (String::new(), Vec::new());
        let net = |s: &str| -> IpNet { s.parse().expect("a prefix") };
        let q = Query::resolve("X.Apps.Example", 1, net("10.0.3.7/32"));
        let d = decide(&zones, Some(&w.view()), &q, &mut key, &mut out);
        assert_eq!(d.records, Records::Cname("loop.example."));
        assert_eq!(d.mapped.map(|m| m.route), Some(Route::Bypass));
        let q = Query::resolve("v.video.example", 252, net("10.0.0.0/24"));
        let d = decide(&zones, Some(&w.view()), &q, &mut key, &mut out);
        assert_eq!((d.rcode, d.records), (Rcode::NoError, Records::None));
        assert_eq!(d.mapped.map(|m| m.route), Some(Route::Mapped));
        let q = Query::resolve("nx.example", 1, net("10.0.0.0/24"));
        let d = decide(&zones, Some(&w.view()), &q, &mut key, &mut out);
        assert_eq!((d.rcode, d.mapped), (Rcode::NxDomain, None));
        let unselected = View {
            servers: None,
            ..w.view()
        };
        let q = Query::resolve("v.video.example", 1, net("10.0.0.0/24"));
        let d = decide(&zones, Some(&unselected), &q, &mut key, &mut out);
        assert_eq!(d.records, Records::Addresses);
        // The primary cluster's addresses only, without selectors too.
        assert_eq!(out, [ip("192.0.2.1"), ip("192.0.2.2")]);
    }

    /// Names are placed by their labels, ASCII case ignored, the first zone holding them
    /// deciding; the root holds every name.
    #[test]
    fn zones_place_names_by_their_labels() {
        let zones = Zones::of_text(&["example.", "sub.example.", "Other.Test"]);
        let place = |name: &str| {
            let (count, labels) = text_labels(name);
            zones.place(count, labels)
        };
        assert_eq!(place("example."), Place::Apex(0));
        assert_eq!(place("WWW.example."), Place::Below(Some(0)));
        assert_eq!(
            place("a.sub.example."),
            Place::Below(Some(0)),
            "the first zone"
        );
        assert_eq!(place("other.test."), Place::Apex(2));
        assert_eq!(place("badexample."), Place::Outside);
        assert_eq!(place("example.org."), Place::Outside);
        assert_eq!(place("."), Place::Outside);
        assert!(zones.holds("x.other.test"));
        assert!(!zones.holds("partner.example.net."));
        let root = Zones::of_text(&["."]);
        assert_eq!(root.place(0, std::iter::empty()), Place::Apex(0));
        assert!(root.holds("anything.at.all."));
        assert!(!Zones::default().holds("example."));
        assert!(cname_answerable("a-b._c.example."));
        assert!(!cname_answerable("-a.example."));
    }
}
