//! Resolution: from a DNS query (client subnet, hostname) to the clusters that answer it, using
//! one published map. The first piece of the service (issue 4), pure and testable on its own.
//!
//! A [`Resolver`] is built once per map version and then only read ("build once, then query;
//! swap whole snapshots"). What depends only on the map units' prefixes and classes (the
//! prefix tables below, and which unit answers each prefix and class) is a prefix index of its
//! own, which the next version's resolver shares when its map has the same units
//! ([`Resolver::new_after`]): a round changes the map, rarely the units.
//!
//! - **Prefix tables.** Every map unit's prefixes are flattened into disjoint address intervals,
//!   each labelled with the most specific prefix covering it; a lookup is one binary search.
//!   IPv4 and IPv6 are separate tables: an IPv6 prefix never answers an IPv4 client (so an ECS
//!   scope never exceeds the client family's length), and a v4-mapped IPv6 prefix
//!   (`::ffff:10.0.0.0/104`) *is* its IPv4 form (`10.0.0.0/8`), as is a v4-mapped client
//!   address. A prefix names a *group*: the map units of that prefix, one per traffic class.
//! - **Class rules.** The hostname picks the traffic class: an exact name (`www.example.com`)
//!   or a wildcard (`*.video.example.com`, any name below it); the longest match wins, and
//!   names no rule matches get the default class.
//! - **Split units.** A unit whose demand the map split over several clusters picks one by a
//!   deterministic weighted hash of (client subnet, hostname), so one client sees one answer
//!   and the clusters get their shares.
//! - **Two clusters.** An answer names a second cluster (the unit's next allocation or its
//!   best other up candidate), so clients have somewhere to fall back to.
//! - **Fallback.** A client outside every prefix, or a unit with nothing placed (all of it
//!   overflow, or its clusters no longer up), gets the up cluster serving the class with the
//!   most room: an answer, never an error.
//! - **Scopes.** Every answer says for which addresses it holds (the ECS scope, RFC 7871
//!   §7.2.1): the widest prefix around the client inside the client's interval of the prefix
//!   table, so no other prefix starts or ends inside it (two bit comparisons against the
//!   interval's neighbours, [`widest_within`]); a split unit's answer holds for the client's
//!   subnet only. A client outside every prefix gets the widest prefix around it that holds
//!   none, never /0.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use cdnmap_mapper::model::{ClassIdx, ClusterIdx, Instance, UnitIdx};
use cdnmap_mapper::{Map, ModelError};
use cdnmap_topology::{canonical, Topology};

use crate::serving::{ServeError, ServingMap};
use cdnmap_mapper::mem::prefetch;

/// At most this many hostname rules.
pub const MAX_CLASS_RULES: usize = 10_000;
/// The longest hostname accepted (RFC 1035: 255 octets on the wire, 253 in text).
pub const MAX_QNAME_LEN: usize = 253;

const NO_GROUP: u32 = u32::MAX;

/// The rule tables' hash: xxh3 (fast on short keys; the tables are built by the operator, so a
/// flooding-resistant hash buys nothing here).
type NameMap = HashMap<String, ClassIdx, xxhash_rust::xxh3::Xxh3DefaultBuilder>;

/// Hostname → traffic class.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassRules {
    exact: NameMap,
    /// Keyed by the suffix below the `*.`.
    wildcard: NameMap,
    /// Bit `n`: some wildcard suffix has `n` labels (63: 63 or more); only those suffixes of a
    /// name are looked up.
    wildcard_labels: u64,
    /// Every name the rules make exist (DNS's view of them): each exact name, each wildcard
    /// name's suffix, and their ancestors ([`Self::synthesized_from`]).
    occupied: NameSet,
    default: ClassIdx,
}

type NameSet = std::collections::HashSet<String, xxhash_rust::xxh3::Xxh3DefaultBuilder>;

fn label_bit(labels: usize) -> u64 {
    1 << labels.min(63)
}

/// Lower-cases a name and drops one trailing dot; `None` if it is empty or too long.
fn normalise(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > MAX_QNAME_LEN {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

impl ClassRules {
    /// Rules `(pattern, class name)`: a pattern is a hostname or `*.` followed by one;
    /// `classes` are the class names by class index.
    pub fn new(
        classes: &[impl AsRef<str>],
        rules: &[(String, String)],
        default: &str,
    ) -> Result<Self, ModelError> {
        let class = |name: &str, subject: &str| {
            classes
                .iter()
                .position(|c| c.as_ref() == name)
                .map(|k| k as ClassIdx)
                .ok_or_else(|| ModelError::UnknownClass {
                    subject: subject.to_string(),
                    class: name.to_string(),
                })
        };
        if rules.len() > MAX_CLASS_RULES {
            return Err(ModelError::TooMany {
                subject: "hostname rules".into(),
                what: "rules",
                count: rules.len(),
                limit: MAX_CLASS_RULES,
            });
        }
        let default = class(default, "default class")?;
        let mut out = ClassRules {
            exact: NameMap::default(),
            wildcard: NameMap::default(),
            wildcard_labels: 0,
            occupied: NameSet::default(),
            default,
        };
        for (pattern, name) in rules {
            let subject = format!("hostname rule {pattern:?}");
            let k = class(name, &subject)?;
            let host = pattern.strip_prefix("*.").unwrap_or(pattern);
            let host = normalise(host).ok_or_else(|| ModelError::BadName {
                subject: subject.clone(),
                problem: "is not a hostname",
            })?;
            if host.contains('*') || host.split('.').any(str::is_empty) {
                return Err(ModelError::BadName {
                    subject,
                    problem: "is not a hostname (a wildcard may only be a leading \"*.\")",
                });
            }
            if pattern.starts_with("*.") {
                out.wildcard_labels |= label_bit(host.split('.').count());
            }
            let mut at = host.as_str();
            loop {
                out.occupied.insert(at.to_string());
                let Some((_, up)) = at.split_once('.') else {
                    break;
                };
                at = up;
            }
            let table = if pattern.starts_with("*.") {
                &mut out.wildcard
            } else {
                &mut out.exact
            };
            if table.insert(host, k).is_some() {
                return Err(ModelError::DuplicateId {
                    what: "hostname rule",
                    id: pattern.clone(),
                    context: String::new(),
                });
            }
        }
        Ok(out)
    }

    /// [`Self::new`] over an instance's classes.
    pub fn for_instance(
        instance: &Instance,
        rules: &[(String, String)],
        default: &str,
    ) -> Result<Self, ModelError> {
        let names: Vec<&str> = instance.classes().iter().map(|c| c.name.as_str()).collect();
        Self::new(&names, rules, default)
    }

    /// Every name gets `class`.
    pub fn only(class: ClassIdx) -> Self {
        ClassRules {
            exact: NameMap::default(),
            wildcard: NameMap::default(),
            wildcard_labels: 0,
            occupied: NameSet::default(),
            default: class,
        }
    }

    /// The class of `qname` (case-insensitive, with or without the trailing dot).
    pub fn class_of(&self, qname: &str) -> ClassIdx {
        self.rule_class(qname).unwrap_or(self.default)
    }

    /// The class of the rule naming `qname`, `None` when no rule does (the name gets the
    /// default class; an authoritative front end answers NXDOMAIN for it).
    pub fn rule_class(&self, qname: &str) -> Option<ClassIdx> {
        let mut buf = [0u8; MAX_QNAME_LEN];
        let name = lower(qname, &mut buf)?;
        if !self.exact.is_empty() {
            if let Some(&k) = self.exact.get(name) {
                return Some(k);
            }
        }
        // Longest wildcard first: the suffixes after each dot, left to right, looking up only
        // those with as many labels as some rule's suffix.
        let mut labels = name.bytes().filter(|&b| b == b'.').count() + 1;
        let mut rest = name;
        while let Some(dot) = rest.find('.') {
            rest = &rest[dot + 1..];
            labels -= 1;
            if self.wildcard_labels & label_bit(labels) != 0 {
                if let Some(&k) = self.wildcard.get(rest) {
                    return Some(k);
                }
            }
        }
        None
    }

    /// When `qname`'s answer is, in DNS's terms, synthesized from a wildcard whose closest
    /// encloser is `qname` less its first label (RFC 4592: `*.video.example` answers
    /// `v1.video.example`, and nothing the rules name is at or below `v1.video.example`):
    /// the number of labels of that encloser, which is a DNSSEC signature's Labels field
    /// for the wildcard (`crate`'s users sign the wildcard's RRset once for every name it
    /// answers). `None` for any other name, deeper names below a wildcard included.
    pub fn synthesized_from(&self, qname: &str) -> Option<u8> {
        if self.wildcard.is_empty() {
            return None;
        }
        let mut buf = [0u8; MAX_QNAME_LEN];
        let name = lower(qname, &mut buf)?;
        let (first, encloser) = name.split_once('.')?;
        if first == "*" || !self.wildcard.contains_key(encloser) || self.occupied.contains(name) {
            return None;
        }
        u8::try_from(encloser.split('.').count()).ok()
    }
}

/// `qname` without its final dot, in lower case (in place when it already is, else in
/// `buf`); `None` when it is empty, too long or not ASCII.
fn lower<'a>(qname: &'a str, buf: &'a mut [u8; MAX_QNAME_LEN]) -> Option<&'a str> {
    let name = qname.strip_suffix('.').unwrap_or(qname);
    if name.is_empty() || name.len() > MAX_QNAME_LEN || !name.is_ascii() {
        return None;
    }
    if !name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some(name);
    }
    let buf = &mut buf[..name.len()];
    buf.copy_from_slice(name.as_bytes());
    buf.make_ascii_lowercase();
    std::str::from_utf8(buf).ok()
}

/// Why an answer names the clusters it does (the answer's routing reason: a metric label of
/// the front end's, in Resolve's answer and in the dashboard's lookup).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Route {
    /// The unit's cluster in the map.
    Mapped = 0,
    /// The unit's demand is split over clusters; one is picked by a hash of the client.
    Split = 1,
    /// The unit's cluster is not up: another of its allocations, or its best backup.
    Backup = 2,
    /// None of the unit's demand was placed (no candidate had room): the class's fallback.
    Overflow = 3,
    /// None of the unit's clusters is up: the class's fallback.
    Down = 4,
    /// The client is in no map unit of the class: the class's fallback.
    Unmatched = 5,
    /// The unit's answer would be the class's fallback for overflow or down, and the class
    /// has a last resort configured (a partner CDN): answered with that. Never a resolver's
    /// own route; what answers from it says so ([`Route::bypassed`]).
    Bypass = 6,
}

impl Route {
    pub const ALL: [Route; 7] = [
        Route::Mapped,
        Route::Split,
        Route::Backup,
        Route::Overflow,
        Route::Down,
        Route::Unmatched,
        Route::Bypass,
    ];

    /// Whether an answer so routed goes to the class's last resort when it has one: every
    /// candidate of the unit full (overflow) or down.
    pub fn bypassed(self) -> bool {
        matches!(self, Route::Overflow | Route::Down)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Route::Mapped => "mapped",
            Route::Split => "split",
            Route::Backup => "backup",
            Route::Overflow => "overflow",
            Route::Down => "down",
            Route::Unmatched => "unmatched",
            Route::Bypass => "bypass",
        }
    }

    fn from_bits(b: u32) -> Route {
        Route::ALL.get(b as usize).copied().unwrap_or(Route::Mapped)
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where one query goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub class: ClassIdx,
    /// The map unit the client belongs to (`None`: outside every prefix; the fallback).
    pub unit: Option<UnitIdx>,
    /// The prefix length the answer holds for, the ECS scope of the reply: every address of
    /// the client's prefix of this length gets this answer (RFC 7871 §7.2.1), so a caching
    /// resolver may hand it to all of them. Never wider than the unit's prefix, never over a
    /// prefix nested in it, not wider than the client's subnet for a split unit; for a client
    /// outside every prefix, the widest prefix around it that holds none.
    pub scope_prefix_len: u8,
    /// The length of the unit's prefix that matched (0 outside every prefix), in the family
    /// it was matched in (IPv4 for a v4-mapped client): what demand is counted by.
    pub prefix_len: u8,
    /// The cluster to answer with, and a second one to fall back to (if the topology has one).
    pub primary: Option<ClusterIdx>,
    pub secondary: Option<ClusterIdx>,
    /// The second is the unit's companion (its class goes with the winner): the answer names
    /// one of its servers after the first's, for the share of the demand the map reserved.
    pub companion: bool,
    /// Where the unit was found: the (prefix group, class) slot of the resolver's prefix index
    /// (`None` with `unit`). Demand is counted by it ([`SlotNames`]): the slot stands for the
    /// matched prefix and the class, what a count by `prefix_len` would key on.
    pub slot: Option<u32>,
    /// Why these clusters.
    pub route: Route,
}

impl Answer {
    /// The clusters whose servers an answer to A and AAAA names, in order: the primary, then
    /// the companion when the second is one ([`crate::servers`]).
    pub fn named(&self) -> impl Iterator<Item = ClusterIdx> {
        self.primary
            .into_iter()
            .chain(self.secondary.filter(|_| self.companion))
    }
}

/// Names the slots of a resolver's prefix index ([`Answer::slot`]) as (prefix, class name),
/// holding the index and the unit keys but no map version's placements, so that counts kept by
/// slot (an array, where a table keyed by prefix costs a hash probe a query) can be read out
/// after the map moved on. Every resolver sharing the index numbers its slots alike, with the
/// same classes ([`Self::fit`]).
#[derive(Debug, Clone)]
pub struct SlotNames {
    index: Arc<PrefixIndex>,
    keys: crate::serving::UnitKeysRef,
    classes: Vec<Arc<str>>,
}

impl SlotNames {
    /// How many slots there are (every [`Answer::slot`] of a fitting resolver is below it).
    pub fn len(&self) -> usize {
        self.index.unit.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.unit.is_empty()
    }

    /// Whether `resolver`'s slots are these: the same prefix index and class names.
    pub fn fit(&self, resolver: &Resolver) -> bool {
        Arc::ptr_eq(&self.index, &resolver.index) && self.classes[..] == resolver.map.classes()[..]
    }

    /// Slot `slot`'s prefix (in the family it is matched in, truncated) and class name; `None`
    /// for a slot no unit holds or one out of range.
    pub fn name(&self, slot: u32) -> Option<(IpNet, &Arc<str>)> {
        let classes = self.index.classes.max(1);
        let u = *self.index.unit.get(slot as usize)?;
        if u == NO_GROUP {
            return None;
        }
        let (g, class) = (slot as usize / classes, slot as usize % classes);
        let at = self
            .keys
            .prefix_positions(u)
            .find(|&at| self.index.group_of[at] as usize == g)?;
        // As the index holds it: a v4-mapped prefix as its IPv4 form.
        Some((canonical(&self.keys.prefix(at)), self.classes.get(class)?))
    }
}

/// One map version, indexed for queries.
#[derive(Debug, Clone)]
pub struct Resolver {
    map: Arc<ServingMap>,
    rules: ClassRules,
    /// Which unit a client of a class belongs to: shared with the resolver of the map before
    /// when the units are the same.
    index: Arc<PrefixIndex>,
    /// Per (group, class): the answer, computed once per map version (`classes` per group).
    pre: Vec<Pre>,
}

/// The part of the index that depends on the map units' prefixes and classes only, not on the
/// map: the prefix tables and each (prefix group, class)'s unit. Building it sorts every
/// (prefix, unit) claim and then the intervals, most of the indexing time at a million units,
/// while from one round to the next it is the same unless the topology's units changed; so a
/// resolver takes the previous one's when its map has the same units ([`Resolver::new_after`]).
#[derive(Debug)]
struct PrefixIndex {
    v4: Table<u32>,
    /// `v4_dir[b]`: the first IPv4 interval starting at or after `b << 16`, so a lookup searches
    /// only the intervals of its /16 (one or two cache lines instead of ~19 misses).
    v4_dir: Vec<u32>,
    /// The /24 pages of the /16s with more than [`PAGE_MIN`] intervals: `v4_page[b]` is /16
    /// `b`'s page (`NO_PAGE`: none; length 2^16 once any page exists), and its page's 256
    /// entries in `v4_sub` name the interval holding each /24's first address, with
    /// [`MORE`] set where another interval starts inside that /24. A lookup in a dense /16
    /// is then one read and no search (at 11 M units, a /16 of 256 /24s took ~5 dependent
    /// misses to search).
    v4_page: Vec<u32>,
    v4_sub: Vec<u32>,
    v6: Table<u128>,
    /// Every [`V6_STRIDE`]th IPv6 interval start: a lookup searches this small array (its
    /// upper levels stay cached), then [`V6_STRIDE`] starts, not the whole table (at 11 M
    /// units, ~10 cache misses a lookup).
    v6_top: Vec<u128>,
    /// Per (group, class), `classes` per group: the group's unit of the class, or `NO_GROUP`.
    unit: Vec<u32>,
    /// By position in the map's prefixes (unit by unit, in unit order): the prefix's group,
    /// so that a unit's slots are found from the unit (the answers of the units a round moved
    /// are computed again, not all of them: [`Resolver::new_after`]).
    group_of: Vec<u32>,
    /// The map's class count when it was built (the layout of `unit`).
    classes: usize,
}

/// The answer for one (prefix group, class), computed when the map is indexed: a lookup is then
/// the prefix search and one read (plus a hash for the rare split unit).
#[derive(Debug, Clone, Copy)]
struct Pre {
    /// The group's unit of the class, or `NO_GROUP`.
    unit: u32,
    /// The answer's first cluster (`NONE_CLUSTER`: none), or `SPLIT`: the unit's demand is
    /// split and the primary is picked per query. (12 bytes a slot, not 16 with a flag: at
    /// 11 M units, 44 MB less per map version, and a front end holds two while it swaps.)
    primary: u32,
    /// The answer's second cluster in the low [`ROUTE_SHIFT`] bits (`SECOND_NONE`: none),
    /// the answer's [`Route`] above them (a cluster index is below `MAX_CLUSTERS`, 2^20), and
    /// in the top bit ([`COMPANION`]) whether the second is the unit's companion.
    secondary: u32,
}

/// The IPv6 table's sampling for [`PrefixIndex::v6_top`] (16 starts: four cache lines).
const V6_STRIDE: usize = 16;

/// Queries whose memory reads [`Resolver::resolve_classed`] starts together.
const BATCH_BLOCK: usize = 16;

/// A /16 with more intervals than this gets a page of /24 entries ([`PrefixIndex::v4_page`]);
/// one with fewer is searched (they fit a cache line or two).
const PAGE_MIN: u32 = 8;
const NO_PAGE: u32 = u32::MAX;
/// A /24 entry's flag: another interval starts inside the /24 (search from the entry's).
const MORE: u32 = 1 << 31;

const NONE_CLUSTER: u32 = u32::MAX;
/// [`Pre::primary`] of a split unit (no cluster index comes near: an instance has at most `MAX_CLUSTERS`).
const SPLIT: u32 = u32::MAX - 1;
/// Where a [`Pre`]'s route starts in its `secondary`.
const ROUTE_SHIFT: u32 = 28;
const SECOND_NONE: u32 = (1 << ROUTE_SHIFT) - 1;
/// [`Pre::secondary`]'s bit that says the second cluster is the unit's companion.
const COMPANION: u32 = 1 << 31;
const ROUTE_BITS: u32 = 0b111;
const _: () = assert!((Route::ALL.len() as u32) <= ROUTE_BITS + 1);
const _: () = assert!(cdnmap_mapper::model::MAX_CLUSTERS < SECOND_NONE as usize);

impl Pre {
    fn new(unit: u32, picked: Picked) -> Pre {
        let mut pre = Pre::packed(
            unit,
            picked.primary.unwrap_or(NONE_CLUSTER),
            picked.secondary,
            picked.route,
        );
        if picked.companion {
            pre.secondary |= COMPANION;
        }
        pre
    }

    fn packed(unit: u32, primary: u32, secondary: Option<ClusterIdx>, route: Route) -> Pre {
        let second = secondary.map_or(SECOND_NONE, |c| c & SECOND_NONE);
        Pre {
            unit,
            primary,
            secondary: (route as u32) << ROUTE_SHIFT | second,
        }
    }

    fn companion(&self) -> bool {
        self.secondary & COMPANION != 0
    }

    fn split(&self) -> bool {
        self.primary == SPLIT
    }

    fn secondary(&self) -> Option<ClusterIdx> {
        let c = self.secondary & SECOND_NONE;
        (c != SECOND_NONE).then_some(c)
    }

    fn route(&self) -> Route {
        Route::from_bits(self.secondary >> ROUTE_SHIFT & ROUTE_BITS)
    }
}

/// A unit's clusters for an answer ([`Resolver::pick_routed`]).
#[derive(Debug, Clone, Copy)]
struct Picked {
    primary: Option<ClusterIdx>,
    secondary: Option<ClusterIdx>,
    route: Route,
    /// `secondary` is the unit's companion.
    companion: bool,
}

impl Picked {
    fn of(primary: Option<ClusterIdx>, secondary: Option<ClusterIdx>, route: Route) -> Picked {
        Picked {
            primary,
            secondary,
            route,
            companion: false,
        }
    }
}

fn cluster_opt(c: u32) -> Option<ClusterIdx> {
    (c != NONE_CLUSTER).then_some(c)
}

/// One address family's prefixes, flattened: interval starts (an address as an integer), and
/// for each interval its group and the prefix length that labels it.
#[derive(Debug, Clone, Default)]
struct Table<K> {
    starts: Vec<K>,
    group: Vec<u32>,
    len: Vec<u8>,
}

/// Where a client address fell: the most specific prefix group holding it (`NO_GROUP`: none)
/// with that prefix's length, and the **scope**: the widest prefix around the address that
/// lies inside the address's interval, so that every address of it falls in the same group
/// (no other prefix starts or ends inside it). Lengths are in the table's family (IPv4 for a
/// v4-mapped client too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hit {
    group: u32,
    len: u8,
    scope: u8,
}

impl Hit {
    fn group(&self) -> Option<(u32, u8)> {
        (self.group != NO_GROUP).then_some((self.group, self.len))
    }
}

/// `client`'s prefix length in its table's family (a v4-mapped IPv6 client's as IPv4).
fn table_len(client: IpNet) -> u8 {
    match client {
        IpNet::V4(n) => n.prefix_len(),
        IpNet::V6(n) if n.network().to_ipv4_mapped().is_some() => n.prefix_len().saturating_sub(96),
        IpNet::V6(n) => n.prefix_len(),
    }
}

/// A scope of `client`'s table (see [`table_len`]) in `client`'s own family: a v4-mapped IPv6
/// client's IPv4 scope as the IPv6 length it is.
fn client_scope(client: IpNet, scope: u8) -> u8 {
    match client {
        IpNet::V6(n) if n.network().to_ipv4_mapped().is_some() => scope + 96,
        _ => scope,
    }
}

/// An IPv4 table's /16 directory ([`PrefixIndex::v4_dir`]).
fn v4_directory(v4: &Table<u32>) -> Vec<u32> {
    (0..=1u64 << 16)
        .map(|b| {
            let at = (b << 16).min(u64::from(u32::MAX) + 1);
            v4.starts.partition_point(|&s| u64::from(s) < at) as u32
        })
        .collect()
}

/// The /24 pages of an IPv4 table ([`PrefixIndex::v4_page`]): a page for each /16 in which
/// more than [`PAGE_MIN`] intervals start. Nothing when there is no such /16, or when interval
/// indices would reach the [`MORE`] flag.
fn v4_pages(v4: &Table<u32>, dir: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let dense = |b: usize| dir[b + 1] - dir[b] > PAGE_MIN;
    if v4.starts.len() >= MORE as usize || !(0..1 << 16).any(dense) {
        return (Vec::new(), Vec::new());
    }
    let mut page = vec![NO_PAGE; 1 << 16];
    let mut sub = Vec::new();
    for b in (0..1 << 16).filter(|&b| dense(b)) {
        page[b] = (sub.len() / 256) as u32;
        // The interval holding each /24's first address: walking forward from the one before
        // the /16's first (some interval starts at 0.0.0.0, so there is one).
        let mut i = (dir[b] as usize).saturating_sub(1);
        for c in 0..256u32 {
            let first = (b as u32) << 16 | c << 8;
            while v4.starts.get(i + 1).is_some_and(|&s| s <= first) {
                i += 1;
            }
            let more = v4.starts.get(i + 1).is_some_and(|&s| s <= first | 0xff);
            sub.push(i as u32 | if more { MORE } else { 0 });
        }
    }
    (page, sub)
}

/// The length of the widest prefix (of a `bits`-wide family) holding `a` whose addresses all
/// lie in `[lo, hi]` (`lo <= a <= hi`). The block of `a` with its low `k` bits free starts at
/// or after `lo` exactly when `a` and `lo - 1` differ above bit `k` (and always for `lo = 0`),
/// and ends at or before `hi` exactly when `a` and `hi + 1` do (and always at the top).
fn widest_within(a: u128, lo: u128, hi: u128, bits: u32) -> u8 {
    let top = if bits == 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    };
    // The number of low bits that may be free given one bound: the highest bit where `a`
    // and the address just beyond the bound differ.
    let free = |beyond: u128| 127 - (a ^ beyond).leading_zeros();
    let mut k = bits;
    if lo > 0 {
        k = k.min(free(lo - 1));
    }
    if hi < top {
        k = k.min(free(hi + 1));
    }
    (bits - k) as u8
}

impl<K: Copy + Ord + Into<u128>> Table<K> {
    /// The last interval among `from..to` starting at or before `point` (`None`: none does,
    /// which in a whole table means the table is empty).
    fn search(&self, point: K, from: usize, to: usize) -> Option<usize> {
        (from + self.starts[from..to].partition_point(|&s| s <= point)).checked_sub(1)
    }

    /// Interval `i`'s group, length, first and last address (`None`: the empty table's one
    /// interval, no prefix anywhere).
    fn at(&self, i: Option<usize>, bits: u32) -> (u32, u8, u128, u128) {
        let top = if bits == 128 {
            u128::MAX
        } else {
            (1u128 << bits) - 1
        };
        let Some(i) = i else {
            return (NO_GROUP, 0, 0, top);
        };
        let hi = self
            .starts
            .get(i + 1)
            .map_or(top, |&next| Into::<u128>::into(next) - 1);
        (self.group[i], self.len[i], self.starts[i].into(), hi)
    }
}

impl Table<u64> {
    /// The same table with 32-bit keys (IPv4: every start fits).
    fn narrow(self) -> Table<u32> {
        Table {
            starts: self.starts.iter().map(|&s| s as u32).collect(),
            group: self.group,
            len: self.len,
        }
    }
}

impl<K: Copy + Ord + std::ops::Add<Output = K> + From<u8>> Table<K> {
    /// Flattens prefixes `(first, last, group, length)` of one family, whose last address is
    /// `top`, into disjoint intervals, the most specific prefix winning. (IPv4 is built with
    /// `u64` keys, so that the address after the last is a key too, then narrowed.)
    fn build(mut prefixes: Vec<(K, K, u32, u8)>, top: K) -> Table<K> {
        let zero = K::from(0);
        let one = K::from(1);
        // Outer prefixes before the ones they contain: by start, then by end descending.
        prefixes.sort_unstable_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)));
        let mut segs: Vec<(K, u32, u8)> = Vec::with_capacity(2 * prefixes.len() + 1);
        segs.push((zero, NO_GROUP, 0));
        let mut stack: Vec<(K, u32, u8)> = Vec::new(); // (last, group, len)
        let close = |stack: &mut Vec<(K, u32, u8)>, segs: &mut Vec<(K, u32, u8)>, upto: K| {
            // Pop every open prefix ending before `upto`; after each, the enclosing one
            // resumes.
            while let Some(&(last, _, _)) = stack.last() {
                if last >= upto {
                    break;
                }
                stack.pop();
                let resume = stack.last().map_or((NO_GROUP, 0), |&(_, g, l)| (g, l));
                segs.push((last + one, resume.0, resume.1));
            }
        };
        for &(start, last, g, len) in &prefixes {
            close(&mut stack, &mut segs, start);
            segs.push((start, g, len));
            stack.push((last, g, len));
        }
        drop(prefixes);
        close(&mut stack, &mut segs, top);
        // Keep the last segment of each start, and merge neighbours with the same label.
        let mut t = Table {
            starts: Vec::new(),
            group: Vec::new(),
            len: Vec::new(),
        };
        for (start, g, len) in segs {
            if t.starts.last() == Some(&start) {
                t.starts.pop();
                t.group.pop();
                t.len.pop();
            }
            if t.group.last() == Some(&g) && t.len.last() == Some(&len) {
                continue;
            }
            t.starts.push(start);
            t.group.push(g);
            t.len.push(len);
        }
        t
    }
}

/// An IPv4 prefix as one sortable integer: its address, then its length.
fn v4_key(n: &Ipv4Net) -> u64 {
    u64::from(u32::from(n.network())) << 8 | u64::from(n.prefix_len())
}

impl PrefixIndex {
    /// Indexes `map`'s prefixes. Refuses two map units of one class claiming the same prefix.
    fn build(map: &ServingMap) -> Result<Self, ServeError> {
        // Groups: one per distinct canonical prefix, from the (prefix, unit) claims sorted (a
        // sort, not a table keyed by prefix: at a million units it holds half the memory).
        // An IPv4 prefix is claimed as one `u64` (address and length: 16 bytes a claim where
        // an `IpNet` took 24; at 11 M units, 90 MB less while a front end builds its index).
        let classes = map.classes().len();
        // A claim: (prefix, unit, the prefix's position among the map's prefixes).
        let prefixes = map.sizes().prefixes;
        let mut v4_claims: Vec<(u64, UnitIdx, u32)> = Vec::with_capacity(prefixes);
        let mut v6_claims: Vec<(u128, u8, UnitIdx, u32)> = Vec::new();
        for u in 0..map.unit_count() as UnitIdx {
            for (p, at) in map.unit_prefixes(u).zip(map.unit_prefix_positions(u)) {
                // Positions are below MAX_COLUMN, a u32.
                let at = at as u32;
                match canonical(&p) {
                    IpNet::V4(n) => v4_claims.push((v4_key(&n), u, at)),
                    IpNet::V6(n) => {
                        v6_claims.push((u128::from(n.network()), n.prefix_len(), u, at))
                    }
                }
            }
        }
        v4_claims.sort_unstable();
        v6_claims.sort_unstable();
        let v4_groups = v4_claims.chunk_by(|x, y| x.0 == y.0).count();
        let v6_groups = v6_claims.chunk_by(|x, y| (x.0, x.1) == (y.0, y.1)).count();
        let mut unit: Vec<u32> = Vec::with_capacity((v4_groups + v6_groups) * classes);
        let mut group_of = vec![NO_GROUP; prefixes];
        // The next group's slots, taken by `run`'s units (the claims of prefix `net`: unit and
        // position; a unit may name one prefix twice).
        let mut claim = |run: &mut dyn Iterator<Item = (UnitIdx, u32)>,
                         net: &dyn Fn() -> IpNet|
         -> Result<u32, ServeError> {
            let g = (unit.len() / classes.max(1)) as u32;
            unit.extend(std::iter::repeat_n(NO_GROUP, classes));
            for (u, at) in run {
                group_of[at as usize] = g;
                let slot = &mut unit[g as usize * classes + usize::from(map.unit_class(u))];
                if *slot != NO_GROUP && *slot != u {
                    return Err(ServeError::PrefixClaimedTwice {
                        prefix: net().to_string(),
                        first: map.unit_id(*slot).to_string(),
                        second: map.unit_id(u).to_string(),
                    });
                }
                *slot = u;
            }
            Ok(g)
        };
        let mut v4 = Vec::with_capacity(v4_groups);
        for run in v4_claims.chunk_by(|x, y| x.0 == y.0) {
            let (addr, len) = ((run[0].0 >> 8) as u32, (run[0].0 & 0xff) as u8);
            let net = || IpNet::V4(Ipv4Net::new(addr.into(), len).unwrap_or_default());
            let g = claim(&mut run.iter().map(|c| (c.1, c.2)), &net)?;
            let first = u64::from(addr);
            let last = first | (u64::from(u32::MAX) >> len);
            v4.push((first, last, g, len));
        }
        drop(v4_claims);
        let mut v6 = Vec::with_capacity(v6_groups);
        for run in v6_claims.chunk_by(|x, y| (x.0, x.1) == (y.0, y.1)) {
            let (addr, len) = (run[0].0, run[0].1);
            let net = || IpNet::V6(Ipv6Net::new(addr.into(), len).unwrap_or_default());
            let g = claim(&mut run.iter().map(|c| (c.2, c.3)), &net)?;
            let last = addr | u128::MAX.checked_shr(u32::from(len)).unwrap_or(0);
            v6.push((addr, last, g, len));
        }
        drop(v6_claims);
        let v4 = Table::build(v4, u64::from(u32::MAX)).narrow();
        let v6 = Table::build(v6, u128::MAX);
        let v4_dir = v4_directory(&v4);
        let (v4_page, v4_sub) = v4_pages(&v4, &v4_dir);
        Ok(PrefixIndex {
            v4,
            v4_dir,
            v4_page,
            v4_sub,
            v6_top: v6.starts.iter().step_by(V6_STRIDE).copied().collect(),
            v6,
            unit,
            group_of,
            classes,
        })
    }

    /// Whether this index, built for some map, holds for `map`: the same units and classes.
    fn fits(&self, built_for: &ServingMap, map: &ServingMap) -> bool {
        self.classes == map.classes().len() && built_for.same_units(map)
    }

    /// The group (map units of one prefix) covering `ip`, and the prefix's length.
    fn hit(&self, ip: IpAddr) -> Hit {
        match ip {
            IpAddr::V4(a) => self.lookup_v4(u32::from(a)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => self.lookup_v4(u32::from(v4)),
                None => self.lookup_v6(u128::from(a)),
            },
        }
    }

    /// The IPv6 interval containing `p` (not v4-mapped). The v4-mapped addresses are answered
    /// by the IPv4 table, so they bound the scope as a prefix of their own would.
    fn lookup_v6(&self, p: u128) -> Hit {
        const MAPPED: (u128, u128) = (0xffff << 32, (0xffff << 32) | 0xffff_ffff);
        let (group, len, mut lo, mut hi) = self.v6.at(self.search_v6(p), 128);
        if p < MAPPED.0 {
            hi = hi.min(MAPPED.0 - 1);
        } else {
            lo = lo.max(MAPPED.1 + 1);
        }
        Hit {
            group,
            len,
            scope: widest_within(p, lo, hi, 128),
        }
    }

    /// The most specific prefix group holding `ip`, with its prefix's length.
    fn group(&self, ip: IpAddr) -> Option<(u32, u8)> {
        self.hit(ip).group()
    }

    /// The IPv4 interval containing `p`: from its /24's page entry where its /16 has a page,
    /// else searched within its /16 only.
    fn lookup_v4(&self, p: u32) -> Hit {
        let i = match self.v4_entry(p) {
            Some(e) if e & MORE == 0 => Some(e as usize),
            // Intervals start inside the /24: the last at or before `p`, from the entry's
            // (which starts at or before the /24's first address) to the /16's end.
            Some(e) => {
                let hi = self.v4_dir[(p >> 16) as usize + 1] as usize;
                self.v4.search(p, (e & !MORE) as usize, hi)
            }
            None => self.search_v4(p),
        };
        self.v4_hit(p, i)
    }

    /// The IPv6 interval containing `p`: the sample at or before it, then the starts up to
    /// the next sample.
    fn search_v6(&self, p: u128) -> Option<usize> {
        let k = self.v6_top.partition_point(|&s| s <= p);
        let from = k.saturating_sub(1) * V6_STRIDE;
        let to = (k * V6_STRIDE).min(self.v6.starts.len());
        self.v6.search(p, from, to)
    }

    /// The /24 page entry of `p`, if its /16 has a page.
    fn v4_entry(&self, p: u32) -> Option<u32> {
        let page = *self.v4_page.get((p >> 16) as usize)?;
        (page != NO_PAGE).then(|| self.v4_sub[page as usize * 256 + (p >> 8 & 0xff) as usize])
    }

    /// The IPv4 interval containing `p`, searched within its /16 only (the last interval
    /// starting at or before `p`: inside the block, or the one before it).
    fn search_v4(&self, p: u32) -> Option<usize> {
        let b = (p >> 16) as usize;
        let (lo, hi) = (self.v4_dir[b] as usize, self.v4_dir[b + 1] as usize);
        // From the interval before the block's first, so that one is found when no interval
        // starts inside the block.
        self.v4.search(p, lo.saturating_sub(1), hi)
    }

    /// The hit of `p` in IPv4 interval `i`.
    fn v4_hit(&self, p: u32, i: Option<usize>) -> Hit {
        let (group, len, first, last) = self.v4.at(i, 32);
        Hit {
            group,
            len,
            scope: widest_within(u128::from(p), first, last, 32),
        }
    }

    /// The slot of (group, class) in `unit` (and in a resolver's `pre`).
    fn slot(&self, g: u32, class: ClassIdx) -> usize {
        g as usize * self.classes + usize::from(class)
    }
}

impl Resolver {
    /// Indexes `map` for queries. Refuses two map units of one class claiming the same prefix.
    pub fn new(map: Arc<ServingMap>, rules: ClassRules) -> Result<Self, ServeError> {
        Self::new_after(map, rules, None)
    }

    /// [`Self::new`], taking `previous`'s prefix index when `map` has the same units (ids,
    /// classes and prefixes, in order) and classes as `previous`'s map, which is the usual
    /// round: then only the answers are computed again, not the prefix tables. Any other map
    /// is indexed whole, as by [`Self::new`].
    pub fn new_after(
        map: Arc<ServingMap>,
        rules: ClassRules,
        previous: Option<&Resolver>,
    ) -> Result<Self, ServeError> {
        let index = match previous.filter(|p| p.index.fits(&p.map, &map)) {
            Some(p) => Arc::clone(&p.index),
            None => Arc::new(PrefixIndex::build(&map)?),
        };
        let mut r = Resolver {
            map,
            rules,
            index,
            pre: Vec::new(),
        };
        // The answers of the units the map before placed alike are that map's: only the
        // others' are computed again (at 11 M units, all of them take a second and more of
        // reads all over the map; a round moves a few thousand).
        let before =
            previous.filter(|p| Arc::ptr_eq(&p.index, &r.index) && r.map.answers_alike(&p.map));
        if let Some(p) = before {
            let mut pre = p.pre.clone();
            for u in 0..r.map.unit_count() as UnitIdx {
                if r.map.placed_alike(u, &p.map) {
                    continue;
                }
                let class = r.map.unit_class(u);
                for at in r.map.unit_prefix_positions(u) {
                    let g = r.index.group_of[at];
                    pre[r.index.slot(g, class)] = r.pre_of(u);
                }
            }
            r.pre = pre;
            return Ok(r);
        }
        // Each unit's answer, ahead (a split unit's is picked per query).
        let pre = r
            .index
            .unit
            .iter()
            .map(|&unit| {
                if unit == NO_GROUP {
                    Pre::new(unit, Picked::of(None, None, Route::Unmatched))
                } else {
                    r.pre_of(unit)
                }
            })
            .collect();
        r.pre = pre;
        Ok(r)
    }

    /// Unit `u`'s answer, ahead of any query (a split unit's is picked per query).
    fn pre_of(&self, u: UnitIdx) -> Pre {
        if self.map.shares(u).0.len() > 1 {
            return Pre::packed(u, SPLIT, None, Route::Split);
        }
        Pre::new(u, self.pick_routed(u, 0.0))
    }

    /// Why unit `u`'s clients are answered as they are (as its queries' answers say; a split
    /// unit's as its first allocation's).
    pub fn route_of(&self, u: UnitIdx) -> Route {
        let why = self.pick_routed(u, 0.0).route;
        if why == Route::Mapped && self.map.shares(u).0.len() > 1 {
            return Route::Split;
        }
        why
    }

    /// Indexes the map of a solution: [`ServingMap::of_solution`], then [`Self::new`].
    pub fn of_solution(
        topology: &Topology,
        map: &Map,
        rules: ClassRules,
    ) -> Result<Self, ServeError> {
        Self::of_solution_after(topology, map, rules, None)
    }

    /// [`Self::of_solution`] after `previous`, the resolver of the round before:
    /// [`ServingMap::of_solution_after`] (sharing its unit columns when the units are the
    /// same), then [`Self::new_after`] (sharing its prefix index then).
    pub fn of_solution_after(
        topology: &Topology,
        map: &Map,
        rules: ClassRules,
        previous: Option<&Resolver>,
    ) -> Result<Self, ServeError> {
        let serving = ServingMap::of_solution_after(topology, map, previous.map(|p| &*p.map))?;
        Self::new_after(Arc::new(serving), rules, previous)
    }

    /// Whether `self` and `other` share one prefix index (one was built after the other, over
    /// the same units): what [`Self::new_after`] reused, for tests and measurements.
    pub fn shares_index_with(&self, other: &Resolver) -> bool {
        Arc::ptr_eq(&self.index, &other.index)
    }

    /// The map this resolver indexes.
    pub fn map(&self) -> &Arc<ServingMap> {
        &self.map
    }

    pub fn rules(&self) -> &ClassRules {
        &self.rules
    }

    /// The precomputed answer for client address `ip` and `class`, with the prefix length.
    fn pre_for(&self, ip: IpAddr, class: ClassIdx) -> Option<(&Pre, u8)> {
        let (g, len) = self.index.group(ip)?;
        let pre = &self.pre[self.index.slot(g, class)];
        (pre.unit != NO_GROUP).then_some((pre, len))
    }

    /// The map unit of class `class` for client address `ip`, and its prefix length.
    pub fn unit_for(&self, ip: IpAddr, class: ClassIdx) -> Option<(UnitIdx, u8)> {
        self.pre_for(ip, class).map(|(p, len)| (p.unit, len))
    }

    /// Unit `u`'s placed clusters and their cumulative shares.
    /// The allocation of unit `u` that `x` in [0, 1) falls in, by cumulative share of its
    /// placed demand (the last allocation's upper end is 1, with no rounding gap). Computed
    /// per call: only a split unit's queries come here with `x` other than 0, and a column of
    /// cumulative shares beside the map cost 4 bytes a share per version.
    fn allocation_at(shares: &[f64], x: f32) -> usize {
        let total: f64 = shares.iter().sum();
        let mut cum = 0.0;
        for (i, s) in shares.iter().enumerate() {
            cum += s / total;
            if i + 1 == shares.len() || x < cum as f32 {
                return i;
            }
        }
        0
    }

    /// Unit `u`'s two clusters; `x` in [0, 1) picks among a split unit's allocations by share.
    /// The second is the unit's companion when it has one and both are up. Nothing placed,
    /// or nothing up: the class's fallback.
    fn pick_routed(&self, u: UnitIdx, x: f32) -> Picked {
        let (clusters, shares) = self.map.shares(u);
        let fallback = |why: Route| {
            let [p, s] = self.map.fallback(self.map.unit_class(u));
            Picked::of(p, s, why)
        };
        if clusters.is_empty() {
            if self.map.overflow(u) > 0.0 {
                return fallback(Route::Overflow); // all of it overflow
            }
            // No demand to place (none forecast yet): its best up candidates (the backups).
            return match self.map.backups(u) {
                [Some(p), s] => Picked::of(Some(p), s, Route::Mapped),
                _ => fallback(Route::Down),
            };
        }
        let chosen = clusters[Self::allocation_at(shares, x)];
        let up = |c: ClusterIdx| self.map.clusters()[c as usize].is_up();
        // The second: another allocation, else the best up candidate outside the allocations
        // (the backups: any up allocation other than `p` is found first, so the candidate
        // is the first backup, or the second when `p` is the first).
        let other = |p: Option<ClusterIdx>| {
            clusters
                .iter()
                .copied()
                .find(|&c| Some(c) != p && up(c))
                .or_else(|| {
                    self.map
                        .backups(u)
                        .into_iter()
                        .flatten()
                        .find(|&c| Some(c) != p)
                })
        };
        if up(chosen) {
            if let Some((c, _)) = self.map.companion(u).filter(|&(c, _)| up(c)) {
                return Picked {
                    companion: true,
                    ..Picked::of(Some(chosen), Some(c), Route::Mapped)
                };
            }
            return Picked::of(Some(chosen), other(Some(chosen)), Route::Mapped);
        }
        match other(None) {
            Some(p) => Picked::of(Some(p), other(Some(p)), Route::Backup),
            None => fallback(Route::Down),
        }
    }

    /// Answers a query from `client` (the ECS subnet if the query had one, else the resolver's
    /// address as a host prefix) for `qname`. Never fails.
    pub fn resolve(&self, client: IpNet, qname: &str) -> Answer {
        let class = self.rules.class_of(qname);
        self.resolve_in_class(client, qname, class)
    }

    /// [`Self::resolve`] for a query whose class is known (its name's
    /// [`ClassRules::class_of`]: a caller that matched the name against the rules already,
    /// as `crate::answer` does to tell NXDOMAIN, need not match it again).
    pub fn resolve_in_class(&self, client: IpNet, qname: &str, class: ClassIdx) -> Answer {
        self.answer(class, self.index.hit(client.network()), client, qname)
    }

    /// Answers many queries at once, like [`Self::resolve`] on each, in order, into `out`.
    /// Queries are taken in blocks whose memory reads are started together (prefetched), so
    /// the cache misses of one query overlap the others' instead of following each other.
    pub fn resolve_batch(&self, queries: &[(IpNet, &str)], out: &mut Vec<Answer>) {
        out.clear();
        out.reserve(queries.len());
        let mut classed = [(IpNet::V4(Default::default()), "", 0 as ClassIdx); BATCH_BLOCK];
        for block in queries.chunks(BATCH_BLOCK) {
            for (c, &(client, qname)) in classed.iter_mut().zip(block) {
                *c = (client, qname, self.rules.class_of(qname));
            }
            self.resolve_classed(&classed[..block.len()], out);
        }
    }

    /// [`Self::resolve_batch`] of queries whose class is known (each name's
    /// [`ClassRules::class_of`]; a front end that has matched the names against the rules
    /// already need not match them again), appending to `out`.
    pub fn resolve_classed(&self, queries: &[(IpNet, &str, ClassIdx)], out: &mut Vec<Answer>) {
        const BLOCK: usize = BATCH_BLOCK;
        out.reserve(queries.len());
        let mut class = [0 as ClassIdx; BLOCK];
        let mut v4 = [None::<u32>; BLOCK];
        let mut found = [Hit {
            group: NO_GROUP,
            len: 0,
            scope: 0,
        }; BLOCK];
        let index = &*self.index;
        for block in queries.chunks(BLOCK) {
            // 1: the /16 directory entry of each IPv4 client.
            for (i, &(client, _, c)) in block.iter().enumerate() {
                class[i] = c;
                v4[i] = match client.network() {
                    IpAddr::V4(a) => Some(u32::from(a)),
                    IpAddr::V6(a) => a.to_ipv4_mapped().map(u32::from),
                };
                if let Some(p) = v4[i] {
                    prefetch(&index.v4_page, (p >> 16) as usize);
                    prefetch(&index.v4_dir, (p >> 16) as usize);
                }
            }
            // 2: the /24 entry where the /16 has a page, else the start of its intervals.
            for &p in v4.iter().take(block.len()).flatten() {
                match index.v4_page.get((p >> 16) as usize) {
                    Some(&page) if page != NO_PAGE => prefetch(
                        &index.v4_sub,
                        page as usize * 256 + (p >> 8 & 0xff) as usize,
                    ),
                    _ => prefetch(&index.v4.starts, index.v4_dir[(p >> 16) as usize] as usize),
                }
            }
            // 3: the interval a /24 entry names.
            for &p in v4.iter().take(block.len()).flatten() {
                if let Some(e) = index.v4_entry(p) {
                    let at = (e & !MORE) as usize;
                    prefetch(&index.v4.starts, at);
                    prefetch(&index.v4.group, at);
                    prefetch(&index.v4.len, at);
                }
            }
            // 4: the interval, and the answer entry it leads to.
            for (i, (client, _, _)) in block.iter().enumerate() {
                found[i] = match v4[i] {
                    Some(p) => index.lookup_v4(p),
                    None => index.hit(client.network()),
                };
                if let Some((g, _)) = found[i].group() {
                    prefetch(&self.pre, index.slot(g, class[i]));
                }
            }
            // 5: the answers.
            for (i, &(client, qname, _)) in block.iter().enumerate() {
                out.push(self.answer(class[i], found[i], client, qname));
            }
        }
    }

    /// The answer for a query of `class` from `client`, which fell where `hit` says. Its ECS
    /// scope covers only addresses that get the same answer: the hit's scope (inside the
    /// client's interval, so inside its unit's prefix and clear of every prefix nested in
    /// it); for a split unit, whose cluster is picked by a hash of the client's subnet, not
    /// wider than that subnet.
    fn answer(&self, class: ClassIdx, hit: Hit, client: IpNet, qname: &str) -> Answer {
        let found = hit.group().and_then(|(g, _)| {
            let slot = self.index.slot(g, class);
            let pre = &self.pre[slot];
            (pre.unit != NO_GROUP).then_some((pre, slot as u32))
        });
        let Some((pre, slot)) = found else {
            let [primary, secondary] = self.map.fallback(class);
            return Answer {
                class,
                unit: None,
                scope_prefix_len: client_scope(client, hit.scope),
                prefix_len: 0,
                primary,
                secondary,
                companion: false,
                slot: None,
                route: Route::Unmatched,
            };
        };
        let (picked, scope) = if pre.split() {
            let x = (hash(client, qname) >> 40) as f32 / (1u64 << 24) as f32;
            let mut picked = self.pick_routed(pre.unit, x);
            if picked.route == Route::Mapped {
                picked.route = Route::Split;
            }
            (picked, hit.scope.max(table_len(client)))
        } else {
            let picked = Picked {
                primary: cluster_opt(pre.primary),
                secondary: pre.secondary(),
                route: pre.route(),
                companion: pre.companion(),
            };
            (picked, hit.scope)
        };
        Answer {
            class,
            unit: Some(pre.unit),
            scope_prefix_len: client_scope(client, scope),
            prefix_len: hit.len,
            primary: picked.primary,
            secondary: picked.secondary,
            companion: picked.companion,
            slot: Some(slot),
            route: picked.route,
        }
    }

    /// What names this resolver's slots ([`Answer::slot`]), apart from this map version.
    pub fn slot_names(&self) -> SlotNames {
        SlotNames {
            index: Arc::clone(&self.index),
            keys: self.map.unit_keys(),
            classes: self.map.classes().to_vec(),
        }
    }

    /// The cluster an answer names second when unit `u`'s demand sits wholly at one cluster
    /// (see [`ServingMap::backup`]).
    pub fn backup(&self, u: UnitIdx) -> Option<ClusterIdx> {
        self.map.backup(u)
    }

    /// The class's two fallback clusters: the up clusters serving it with the most room.
    pub fn fallback(&self, class: ClassIdx) -> [Option<ClusterIdx>; 2] {
        self.map.fallback(class)
    }

    /// The addresses to hand out for `answer`: the primary cluster's, then the secondary's,
    /// at most `max`.
    pub fn addresses(&self, answer: &Answer, max: usize) -> Vec<IpAddr> {
        let clusters = self.map.clusters();
        [answer.primary, answer.secondary]
            .into_iter()
            .flatten()
            .flat_map(|c| clusters[c as usize].addresses.iter().copied())
            .take(max)
            .collect()
    }
}

/// A stable 64-bit hash of (client subnet, lower-cased qname without the trailing dot).
fn hash(client: IpNet, qname: &str) -> u64 {
    let mut buf = [0u8; 17 + MAX_QNAME_LEN];
    let net = client.trunc();
    let (addr, len): ([u8; 16], u8) = match net {
        IpNet::V4(n) => (n.network().to_ipv6_mapped().octets(), n.prefix_len()),
        IpNet::V6(n) => (n.network().octets(), n.prefix_len()),
    };
    buf[..16].copy_from_slice(&addr);
    buf[16] = len;
    let name = qname.strip_suffix('.').unwrap_or(qname).as_bytes();
    let name = &name[..name.len().min(MAX_QNAME_LEN)];
    let tail = &mut buf[17..17 + name.len()];
    tail.copy_from_slice(name);
    tail.make_ascii_lowercase();
    xxhash_rust::xxh3::xxh3_64(&buf[..17 + name.len()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::model::Limits;
    use cdnmap_mapper::{solve, SolveOptions};
    use cdnmap_topology::format::parse_instance;
    use rand::{Rng, SeedableRng};

    /// An index of IPv4 prefixes only, `(first, length)`, each its own group.
    fn v4_index(prefixes: &[(u32, u8)]) -> PrefixIndex {
        let claims = prefixes
            .iter()
            .enumerate()
            .map(|(g, &(a, len))| {
                let first = u64::from(a & !(u32::MAX.checked_shr(u32::from(len)).unwrap_or(0)));
                (first, first | u64::from(u32::MAX) >> len, g as u32, len)
            })
            .collect();
        let v4 = Table::build(claims, u64::from(u32::MAX)).narrow();
        let v4_dir = v4_directory(&v4);
        let (v4_page, v4_sub) = v4_pages(&v4, &v4_dir);
        PrefixIndex {
            v4,
            v4_dir,
            v4_page,
            v4_sub,
            v6: Table::default(),
            v6_top: Vec::new(),
            unit: Vec::new(),
            group_of: Vec::new(),
            classes: 1,
        }
    }

    /// A name is synthesized from a wildcard (in DNS's sense) only one label below the
    /// wildcard's suffix, and only when no rule makes it or a name below it exist.
    #[test]
    fn names_synthesized_from_a_wildcard() {
        let rule = |p: &str| (p.to_string(), "web".to_string());
        let rules = ClassRules::new(
            &["web"],
            &[
                rule("*.v.example.com"),
                rule("www.v.example.com"),
                rule("a.b.v.example.com"),
                rule("*.e.v.example.com"),
                rule("cdn.example.com"),
            ],
            "web",
        )
        .expect("valid rules");
        for (name, want) in [
            ("v1.v.example.com.", Some(3)),
            ("V1.V.Example.com", Some(3)),
            ("x.e.v.example.com", Some(4)),
            ("www.v.example.com", None), // an exact rule
            ("b.v.example.com", None),   // a rule below it
            ("e.v.example.com", None),   // a wildcard's suffix
            ("x.y.v.example.com", None), // two labels below
            ("*.v.example.com", None),   // the wildcard itself
            ("v.example.com", None),
            ("x.cdn.example.com", None), // no wildcard
        ] {
            assert_eq!(rules.synthesized_from(name), want, "{name}");
        }
    }

    /// A rule matches whatever the name's case and final dot: a name already in lower case is
    /// read in place, any other through a lower-cased copy, to the same class.
    #[test]
    fn class_rules_ignore_case_and_the_final_dot() {
        let rules = ClassRules::new(
            &["web", "video"],
            &[
                ("www.Example.com".to_string(), "web".to_string()),
                ("*.v.example.com".to_string(), "video".to_string()),
            ],
            "web",
        )
        .expect("valid rules");
        for name in ["www.example.com", "WWW.EXAMPLE.COM.", "wWw.example.com."] {
            assert_eq!(rules.rule_class(name), Some(0), "{name}");
        }
        for name in [
            "a.v.example.com.",
            "A.B.V.Example.COM",
            "x-1_y.v.example.com",
        ] {
            assert_eq!(rules.rule_class(name), Some(1), "{name}");
        }
        for name in ["v.example.com", "example.com.", "", ".", "www.example.co"] {
            assert_eq!(rules.rule_class(name), None, "{name}");
        }
    }

    /// The /24 pages find what a search of the whole table finds, hit and scope, in dense
    /// /16s with nested, touching and host prefixes, and in sparse ones.
    #[test]
    fn the_v4_pages_agree_with_a_search_of_the_whole_table() {
        let (mut paged, mut searched_inside) = (0, 0);
        for seed in 0..40u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let bases = [0x0A00_0000u32, 0x0A01_0000, 0x0A09_0000, 0xC0A8_0000, 0];
            let mut prefixes = vec![(0x0A00_0000, 8)];
            for _ in 0..rng.random_range(1..400) {
                let base = bases[rng.random_range(0..bases.len())];
                let len = [16, 20, 24, 24, 24, 26, 30, 32][rng.random_range(0..8)];
                prefixes.push((base ^ rng.random_range(0..1 << 18), len));
            }
            prefixes.sort_unstable();
            prefixes.dedup_by_key(|&mut (a, len)| (a >> (32 - u32::from(len)), len));
            let index = v4_index(&prefixes);
            paged += usize::from(!index.v4_sub.is_empty());
            searched_inside += index.v4_sub.iter().filter(|&&e| e & MORE != 0).count();
            let whole = |p: u32| {
                let n = index.v4.starts.len();
                index.v4_hit(p, index.v4.search(p, 0, n))
            };
            let mut points: Vec<u32> = (0..2_000)
                .map(|_| bases[rng.random_range(0..bases.len())] ^ rng.random_range(0..1 << 18))
                .collect();
            for &s in &index.v4.starts {
                points.extend([s, s.wrapping_sub(1), s | 0xff, s & !0xff]);
            }
            points.extend([0, u32::MAX]);
            for p in points {
                let at = std::net::Ipv4Addr::from(p);
                assert_eq!(index.lookup_v4(p), whole(p), "seed {seed}, {at}");
            }
        }
        // Both kinds of entry were met: most worlds had pages, and some /24s a search.
        assert!(
            paged >= 30 && searched_inside > 0,
            "{paged} paged, {searched_inside}"
        );
    }

    /// The IPv6 samples find what a search of the whole table finds.
    #[test]
    fn the_v6_samples_agree_with_a_search_of_the_whole_table() {
        let mut sampled = 0;
        for seed in 0..40u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let bases = [0x2a00u128 << 112, 0x2001_0db8 << 96, 0, u128::MAX];
            let draw = |rng: &mut rand::rngs::StdRng| {
                bases[rng.random_range(0..bases.len())] ^ u128::from(rng.random::<u64>()) << 40
            };
            let mut claims: Vec<(u128, u128, u32, u8)> = (0..rng.random_range(1..300))
                .map(|g| {
                    let len = [0, 32, 48, 48, 56, 64, 128][rng.random_range(0..7)];
                    let host = u128::MAX.checked_shr(len).unwrap_or(0);
                    let first = draw(&mut rng) & !host;
                    (first, first | host, g, len as u8)
                })
                .collect();
            claims.sort_unstable_by_key(|c| (c.0, c.3));
            claims.dedup_by_key(|c| (c.0, c.3));
            let v6 = Table::build(claims, u128::MAX);
            let index = PrefixIndex {
                v6_top: v6.starts.iter().step_by(V6_STRIDE).copied().collect(),
                v6,
                ..v4_index(&[])
            };
            sampled += usize::from(index.v6_top.len() > 2);
            let n = index.v6.starts.len();
            let mut points: Vec<u128> = (0..2_000).map(|_| draw(&mut rng)).collect();
            for &s in &index.v6.starts {
                points.extend([s, s.wrapping_sub(1), s.wrapping_add(1)]);
            }
            points.extend([0, u128::MAX]);
            for p in points {
                let at = std::net::Ipv6Addr::from(p);
                assert_eq!(
                    index.search_v6(p),
                    index.v6.search(p, 0, n),
                    "seed {seed}, {at}"
                );
            }
        }
        assert!(sampled >= 30, "only {sampled} tables had samples to search");
    }

    fn instance() -> Topology {
        let json = r#"{
          "traffic_classes": [
            {"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 1}},
            {"name": "video", "priority": 1, "per_unit": {"bps": 1, "fps": 1}}],
          "clusters": [
            {"id": "a", "lat": 0, "lon": 0, "addresses": ["198.18.0.1", "198.18.0.2"],
             "resources": {"name": "r", "kind": "bps", "capacity": 10, "classes": ["web", "video"]}},
            {"id": "b", "lat": 0, "lon": 0, "addresses": ["198.18.1.1"],
             "resources": {"name": "r", "kind": "bps", "capacity": 100, "classes": ["web", "video"]}}],
          "map_units": [
            {"id": "wide-web", "class": "web", "demand": 1, "prefixes": ["10.0.0.0/8"], "lat": 0, "lon": 0,
             "candidates": [{"cluster": "b", "score": 1}]},
            {"id": "narrow-web", "class": "web", "demand": 20, "prefixes": ["10.1.2.0/24", "2001:db8::/48"], "lat": 0, "lon": 0,
             "candidates": [{"cluster": "a", "score": 1}, {"cluster": "b", "score": 2}]},
            {"id": "narrow-video", "class": "video", "demand": 1, "prefixes": ["10.1.2.0/24"], "lat": 0, "lon": 0,
             "candidates": [{"cluster": "b", "score": 1}]}]
        }"#;
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    fn resolver(inst: &Topology) -> Resolver {
        let map = solve(inst, &SolveOptions::default()).map;
        let rules =
            ClassRules::for_instance(inst, &[("*.video.example".into(), "video".into())], "web")
                .expect("rules");
        Resolver::of_solution(inst, &map, rules).expect("resolver")
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("prefix")
    }

    #[test]
    fn longest_prefix_and_class_pick_the_unit() {
        let inst = instance();
        let r = resolver(&inst);
        let id = |a: Answer| a.unit.map(|u| inst.unit_id(u).to_string());
        assert_eq!(
            id(r.resolve(net("10.1.2.3/32"), "www.example.")).as_deref(),
            Some("narrow-web")
        );
        assert_eq!(
            id(r.resolve(net("10.1.3.3/32"), "www.example")).as_deref(),
            Some("wide-web")
        );
        assert_eq!(
            id(r.resolve(net("10.1.2.0/24"), "A.Video.Example.")).as_deref(),
            Some("narrow-video")
        );
        // No video unit covers 10.9.0.0: video there falls back.
        assert_eq!(r.resolve(net("10.9.0.1/32"), "x.video.example").unit, None);
        assert_eq!(
            id(r.resolve(net("2001:db8::1/128"), "www")).as_deref(),
            Some("narrow-web")
        );
        assert_eq!(
            id(r.resolve(net("::ffff:10.1.2.9/128"), "www")).as_deref(),
            Some("narrow-web")
        );
        // Scopes: narrow-web is split (picked by the client's subnet), so its answer holds for
        // the client's subnet within its /24; wide-web's /8 holds narrow's /24, so the widest
        // prefix around 10.7.7.7 clear of it is 10.4.0.0/14.
        assert_eq!(r.resolve(net("10.1.2.3/32"), "www").scope_prefix_len, 32);
        assert_eq!(r.resolve(net("10.1.2.0/24"), "www").scope_prefix_len, 24);
        assert_eq!(r.resolve(net("10.7.7.7/32"), "www").scope_prefix_len, 14);
    }

    #[test]
    fn a_split_unit_answers_by_its_shares_and_names_two_clusters() {
        let inst = instance();
        let r = resolver(&inst);
        // narrow-web (20) is split: 10 at a (its capacity), 10 at b.
        let a = inst.cluster_index("a").expect("a");
        let mut at_a = 0;
        for i in 0..2000u32 {
            let client = IpNet::from(IpAddr::from([10, 1, 2, (i % 256) as u8]));
            let ans = r.resolve(client, &format!("host{i}.example"));
            assert!(ans.primary.is_some() && ans.secondary.is_some());
            assert_ne!(ans.primary, ans.secondary);
            at_a += usize::from(ans.primary == Some(a));
            // Deterministic: the same query, the same answer.
            assert_eq!(ans, r.resolve(client, &format!("HOST{i}.example.")));
        }
        assert!((900..1100).contains(&at_a), "{at_a} of 2000 at a");
        assert!(r.addresses(&r.resolve(net("10.1.2.1/32"), "w"), 8).len() >= 2);
    }

    #[test]
    fn a_batch_answers_exactly_as_single_queries() {
        let inst = instance();
        let r = resolver(&inst);
        let clients = [
            "10.1.2.3/32",
            "10.1.2.0/24",
            "10.9.9.9/32",
            "192.0.2.1/32",
            "2001:db8::7/128",
            "2001:db9::1/128",
            "::ffff:10.1.2.200/128",
            "0.0.0.0/0",
        ];
        let names = ["www.example.", "a.video.example", "X.VIDEO.EXAMPLE.", ""];
        let queries: Vec<(IpNet, &str)> = (0..100)
            .map(|i| (net(clients[i % clients.len()]), names[i % names.len()]))
            .collect();
        let mut out = Vec::new();
        r.resolve_batch(&queries, &mut out);
        assert_eq!(out.len(), queries.len());
        for (ans, &(client, name)) in out.iter().zip(&queries) {
            assert_eq!(*ans, r.resolve(client, name), "{client} {name:?}");
        }
    }

    /// Every answer says why: its unit's cluster, a split unit's pick, a backup while the
    /// unit's cluster is down, the class's fallback for a unit left wholly in overflow, for
    /// one with nothing up, and for a client in no unit; a batch says the same.
    #[test]
    fn answers_give_their_route() {
        let inst = instance();
        let r = resolver(&inst);
        let route = |r: &Resolver, client: &str, name: &str| r.resolve(net(client), name).route;
        assert_eq!(route(&r, "10.7.7.7/32", "www"), Route::Mapped);
        assert_eq!(route(&r, "10.1.2.3/32", "www"), Route::Split);
        assert_eq!(route(&r, "10.1.2.3/32", "a.video.example"), Route::Mapped);
        assert_eq!(route(&r, "192.0.2.1/32", "www"), Route::Unmatched);
        let wide = inst.instance.unit_index("wide-web").expect("wide-web");
        assert_eq!(r.route_of(wide), Route::Mapped);

        // b down under the same map: wide-web and narrow-video have nothing else up; split
        // narrow-web answers from a, by backup when its pick was b.
        let b = inst.cluster_index("b").expect("b");
        let down = inst.with_cluster_state(b, cdnmap_mapper::model::ClusterState::Down);
        let map = solve(&inst, &SolveOptions::default()).map;
        let rules =
            ClassRules::for_instance(&inst, &[("*.video.example".into(), "video".into())], "web")
                .expect("rules");
        let r = Resolver::of_solution(&down, &map, rules).expect("resolver");
        assert_eq!(route(&r, "10.7.7.7/32", "www"), Route::Down);
        assert_eq!(r.route_of(wide), Route::Down);
        assert_eq!(route(&r, "10.1.2.3/32", "a.video.example"), Route::Down);
        let routes: std::collections::BTreeSet<Route> = (0..64u8)
            .map(|i| {
                r.resolve(IpNet::from(IpAddr::from([10, 1, 2, i])), "www")
                    .route
            })
            .collect();
        assert_eq!(routes, [Route::Split, Route::Backup].into());
        let queries: Vec<(IpNet, &str)> = vec![
            (net("10.7.7.7/32"), "www"),
            (net("192.0.2.9/32"), "x.video.example"),
        ];
        let mut out = Vec::new();
        r.resolve_batch(&queries, &mut out);
        assert_eq!(
            out.iter().map(|a| a.route).collect::<Vec<_>>(),
            [Route::Down, Route::Unmatched]
        );

        // A unit with no demand is not overflow: answered from its best candidate.
        let json = r#"{
          "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 1}}],
          "clusters": [{"id": "a", "lat": 0, "lon": 0, "addresses": ["198.18.0.1"],
             "resources": {"name": "r", "kind": "bps", "capacity": 100, "classes": ["web"]}},
             {"id": "b", "lat": 0, "lon": 0, "addresses": ["198.18.0.2"],
             "resources": {"name": "r", "kind": "bps", "capacity": 1000, "classes": ["web"]}}],
          "map_units": [
            {"id": "idle", "class": "web", "demand": 0, "prefixes": ["10.1.0.0/16"], "lat": 0, "lon": 0,
             "candidates": [{"cluster": "a", "score": 1}]}]
        }"#;
        let idle = parse_instance(json.as_bytes(), Limits::default()).expect("valid");
        let map = solve(&idle, &SolveOptions::default()).map;
        let r = Resolver::of_solution(&idle, &map, ClassRules::only(0)).expect("resolver");
        let a = r.resolve(net("10.1.0.1/32"), "www");
        assert_eq!((a.route, a.primary), (Route::Mapped, Some(0)), "{a:?}");

        // One cluster with room for one of two units: the other is all overflow.
        let json = r#"{
          "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 1}}],
          "clusters": [{"id": "a", "lat": 0, "lon": 0, "addresses": ["198.18.0.1"],
             "resources": {"name": "r", "kind": "bps", "capacity": 1, "classes": ["web"]}}],
          "map_units": [
            {"id": "near", "class": "web", "demand": 1, "prefixes": ["10.1.0.0/16"], "lat": 0, "lon": 0,
             "candidates": [{"cluster": "a", "score": 1}]},
            {"id": "far", "class": "web", "demand": 1, "prefixes": ["10.2.0.0/16"], "lat": 0, "lon": 0,
             "candidates": [{"cluster": "a", "score": 2}]}]
        }"#;
        let full = parse_instance(json.as_bytes(), Limits::default()).expect("valid");
        let map = solve(&full, &SolveOptions::default()).map;
        let r = Resolver::of_solution(&full, &map, ClassRules::only(0)).expect("resolver");
        assert_eq!(route(&r, "10.1.0.1/32", "www"), Route::Mapped);
        assert_eq!(route(&r, "10.2.0.1/32", "www"), Route::Overflow);
        assert_eq!(
            r.resolve(net("10.2.0.1/32"), "www").primary,
            Some(0),
            "the fallback"
        );
    }

    #[test]
    fn outside_every_prefix_gets_the_roomiest_cluster() {
        let inst = instance();
        let r = resolver(&inst);
        let ans = r.resolve(net("192.0.2.1/32"), "www.example");
        assert_eq!(ans.unit, None);
        // The widest prefix around it holding no mapped prefix: 128.0.0.0/1 (the world's
        // IPv4 prefixes are all in 10.0.0.0/8), not /0, which would hand this fallback to
        // every client of a caching resolver.
        assert_eq!(ans.scope_prefix_len, 1);
        assert_eq!(ans.primary, inst.cluster_index("b"));
    }

    #[test]
    fn bad_rules_and_shared_prefixes_are_refused() {
        let inst = instance();
        let bad =
            |p: &str, c: &str| ClassRules::for_instance(&inst, &[(p.into(), c.into())], "web");
        assert!(matches!(
            bad("*.x", "nope"),
            Err(ModelError::UnknownClass { .. })
        ));
        assert!(matches!(
            bad("a.*.x", "web"),
            Err(ModelError::BadName { .. })
        ));
        assert!(matches!(
            bad("a..x", "web"),
            Err(ModelError::BadName { .. })
        ));
        assert!(matches!(bad("", "web"), Err(ModelError::BadName { .. })));
        assert!(ClassRules::for_instance(&inst, &[], "nope").is_err());
    }
    /// A map of `n` units over 5 clusters (cluster 3 in state `down3`), drawn from `seed`: IPv4
    /// and IPv6 prefixes that nest and repeat across classes, a unit naming one prefix twice,
    /// whole, split, partial and empty placements.
    fn drawn_map(seed: u64, n: u32, down3: bool) -> ServingMap {
        use crate::serving::{Builder, ServingCluster};
        use cdnmap_mapper::model::ClusterState;
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let classes: Vec<Arc<str>> = vec![Arc::from("web"), Arc::from("video")];
        let clusters = (0..5)
            .map(|i| ServingCluster {
                id: format!("c{i}"),
                addresses: vec![IpAddr::from([198, 18, 0, i as u8])],
                state: if i == 3 && down3 {
                    ClusterState::Down
                } else {
                    ClusterState::Up
                },
            })
            .collect();
        let mut b = Builder::new(classes, clusters).expect("clusters");
        for u in 0..n {
            // Unit u's prefixes: its own /24 (shared by the two classes of one block), at
            // times a /16 around it or an IPv6 /48 beside it, at times its /24 twice.
            let block = u / 2;
            let mut prefixes = vec![net(&format!("10.{}.{}.0/24", block / 7, block % 7 * 31))];
            match rng.random_range(0..6) {
                0 if block % 7 == 0 => {
                    prefixes.push(net(&format!("10.{}.0.0/16", block / 7 + 100)))
                }
                1 => prefixes.push(net(&format!("2001:db8:{block:x}::/48"))),
                2 => prefixes.push(prefixes[0]),
                _ => {}
            }
            b.push(
                &format!("u{u:05}"),
                (u % 2) as ClassIdx,
                prefixes,
                drawn_shares(&mut rng),
                0.0,
                [Some(rng.random_range(0..5)), None],
            )
            .expect("a unit");
        }
        b.set_fallback(&[[Some(1), Some(2)], [Some(4), None]]);
        b.finish()
    }

    fn drawn_shares(rng: &mut impl rand::Rng) -> Vec<(ClusterIdx, f64)> {
        let c = rng.random_range(0..5u32);
        match rng.random_range(0..5) {
            0 => vec![(c, 0.25), ((c + 1) % 5, 0.75)],
            1 => vec![],
            2 => vec![(c, 0.5)],
            _ => vec![(c, 1.0)],
        }
    }

    /// The map `old` with about one unit in ten placed anew (drawn from `seed`).
    fn moved(old: &ServingMap, seed: u64) -> ServingMap {
        use crate::serving::Builder;
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut b =
            Builder::new(old.classes().to_vec(), old.clusters().to_vec()).expect("clusters");
        b.set_fallback(&[[Some(1), Some(2)], [Some(4), None]]);
        b.share_units_of(old).expect("empty");
        let same: Vec<Option<ClusterIdx>> = (0..5).map(Some).collect();
        for u in 0..old.unit_count() as UnitIdx {
            if rng.random_range(0..10) == 0 {
                let backup = [Some(rng.random_range(0..5)), None];
                b.push_placement_of(drawn_shares(&mut rng), 0.0, backup)
                    .expect("placed");
            } else {
                b.copy_placement(old, u, &same).expect("copied");
            }
        }
        b.finish_placements().expect("all placed")
    }

    fn answers(r: &Resolver) -> Vec<(u32, u32, u32)> {
        r.pre
            .iter()
            .map(|p| (p.unit, p.primary, p.secondary))
            .collect()
    }

    /// A resolver after another over the same units computes again only the answers of the
    /// units placed otherwise, and has every answer a resolver of its own map has; a change of
    /// a cluster's state computes them all.
    #[test]
    fn the_answers_after_a_round_are_those_of_the_map_indexed_afresh() {
        let rules =
            ClassRules::new(&[Arc::from("web"), Arc::from("video")], &[], "web").expect("rules");
        for seed in 0..8 {
            let first = Arc::new(drawn_map(seed, 700, false));
            let r1 = Resolver::new(Arc::clone(&first), rules.clone()).expect("first");
            let mut before = r1;
            let mut map = first;
            for round in 0..3 {
                let next = Arc::new(moved(&map, seed * 10 + round));
                let after = Resolver::new_after(Arc::clone(&next), rules.clone(), Some(&before))
                    .expect("after");
                let afresh = Resolver::new(Arc::clone(&next), rules.clone()).expect("afresh");
                assert!(after.shares_index_with(&before));
                assert_eq!(
                    answers(&after),
                    answers(&afresh),
                    "seed {seed}, round {round}"
                );
                assert_ne!(answers(&after), answers(&before), "the round moved some");
                before = after;
                map = next;
            }
            // A cluster down: every unit's answer may change.
            let down = Arc::new(drawn_map(seed, 700, true));
            let up = Arc::new(drawn_map(seed, 700, false));
            let r_up = Resolver::new(Arc::clone(&up), rules.clone()).expect("up");
            let after =
                Resolver::new_after(Arc::clone(&down), rules.clone(), Some(&r_up)).expect("after");
            let afresh = Resolver::new(down, rules.clone()).expect("afresh");
            assert_eq!(
                answers(&after),
                answers(&afresh),
                "seed {seed}, a cluster down"
            );
        }
    }
}
