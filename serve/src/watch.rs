//! WatchMap's messages, both sides, and the only place that converts them: a [`ServingMap`] as
//! a full map (in parts) or as the delta from the version before, on the mapper's side; a
//! [`Follower`] that applies them into the next [`ServingMap`], on the front end's side. The
//! protobuf forms of a cluster's state and of a selection policy are here too.
//!
//! **Order.** Units travel in strictly increasing id order and clusters in id order, in full
//! maps and deltas alike, so a front end builds its map by one merge, without sorting or a
//! table keyed by id beside it.
//!
//! **Parts.** A full map of many units is sent as several messages of at most
//! [`PART_UNITS`] units, each but the last with `more` set; the first carries the clusters,
//! rules, fallbacks and the whole map's size, later ones units only. A full map's units travel
//! as columns ([`crate::columns`]); a delta's as one `UnitMapping` message each (few, and
//! readable). A front end applies nothing until the last part, and pushes each part's units
//! into the compact columns of the map it is building as it comes.
//!
//! **Bounded deltas.** A delta carries at most [`MAX_DELTA_UNITS`] units (changed or gone),
//! as many as a part of a full map: a round that moves more (a large site down, a shift of
//! demand) is sent as a full map in parts ([`delta_update`] says so), so no message grows
//! with the map. A front end taking a full map of the units it holds keeps their keys and
//! its prefix index ([`Builder::expect_units_of`]).
//!
//! **Changed sections.** Besides its units, a delta carries the map-wide sections (clusters,
//! hostname rules with the default class, fallbacks, last resorts) whole, or, to a front end
//! that asked for it, only those that differ from the [`Sections`] the stream last sent
//! ([`delta_for`]): the clusters that changed or appeared, whole, and `removed_clusters`; the
//! others named in `sections` when carried, so that "unchanged" and "now empty" differ. The
//! [`Follower`] completes such a delta with the sections of the version it holds and applies
//! it as one that carries them all; a mapper that sends them all (an older one) is followed
//! as before. A cluster's server loads travel only when its policy reads them (power-of-d),
//! so reported loads do not make every cluster change.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use cdnmap_mapper::model::{shown_id, ClassIdx, ClusterIdx, ClusterState, UnitIdx};
use cdnmap_proto::v1 as pb;
use ipnet::IpNet;

use crate::columns;
use crate::follow_error::invalid;
use crate::servers::Policy;
use crate::serving::{Builder, ServingCluster, ServingMap, Sizes};

pub use crate::follow_error::FollowError;
pub use crate::limits::{
    MAX_CLASSES, MAX_CLUSTERS, MAX_DELTA_UNITS, MAX_UNITS, MAX_UNIT_PREFIXES, PART_UNITS,
};

/// A cluster's state on the wire.
pub fn state_pb(state: ClusterState) -> pb::ClusterState {
    match state {
        ClusterState::Up => pb::ClusterState::Up,
        ClusterState::Drained => pb::ClusterState::Drained,
        ClusterState::Down => pb::ClusterState::Down,
    }
}

/// A cluster's state from the wire: `None` for `UNSPECIFIED` (each caller says what that
/// means) and for a number that is no state.
pub fn state_from_pb(value: i32) -> Option<ClusterState> {
    match pb::ClusterState::try_from(value) {
        Ok(pb::ClusterState::Up) => Some(ClusterState::Up),
        Ok(pb::ClusterState::Drained) => Some(ClusterState::Drained),
        Ok(pb::ClusterState::Down) => Some(ClusterState::Down),
        Ok(pb::ClusterState::Unspecified) | Err(_) => None,
    }
}

/// A selection policy on the wire.
pub fn policy_pb(policy: &Policy) -> pb::ServerSelection {
    let mut out = pb::ServerSelection {
        policy: policy.name().to_string(),
        vnodes: policy.vnodes(),
        c: 0.0,
        d: 0,
    };
    match *policy {
        Policy::Consistent { .. } => {}
        Policy::BoundedLoads { c, .. } => out.c = c,
        Policy::PowerOfD { d, .. } => out.d = d,
    }
    out
}

/// The policy a `WatchMap` cluster carries; an absent selection is the default policy.
pub fn policy_from_pb(s: Option<&pb::ServerSelection>) -> Result<Policy, String> {
    let Some(s) = s else {
        return Ok(Policy::default());
    };
    let policy = match s.policy.as_str() {
        "consistent" => Policy::Consistent { vnodes: s.vnodes },
        "bounded" => Policy::BoundedLoads {
            vnodes: s.vnodes,
            c: s.c,
        },
        "power-of-d" => Policy::PowerOfD {
            vnodes: s.vnodes,
            d: s.d,
        },
        other => {
            return Err(format!(
                "unknown policy {other:?} (consistent, bounded or power-of-d)"
            ))
        }
    };
    policy.validate().map_err(|e| e.to_string())?;
    Ok(policy)
}

/// A map version's identity and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Identity {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
}

impl Identity {
    /// (epoch, version): ordered as a pair.
    pub fn key(&self) -> (u64, u64) {
        (self.epoch, self.version)
    }
}

/// What a message carries besides the map: each cluster's selection policy (by cluster
/// index), the last reported load of a server, and the hostname rules and default class.
pub struct Edge<'a> {
    pub policies: &'a [Policy],
    pub load: &'a (dyn Fn(&str, IpAddr) -> f64 + Sync),
    pub rules: &'a [(String, String)],
    pub default_class: &'a str,
    /// Per class name, its last resort.
    pub bypass: &'a [(String, Bypass)],
}

/// A traffic class's last resort (a partner CDN; "bypass" in Traffic Control): what clients
/// of a unit whose every candidate is full or down are answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bypass {
    /// A CNAME to this name (absolute, ending in a dot).
    Cname(String),
    /// These addresses (A for IPv4 ones, AAAA for IPv6 ones).
    Addresses(Vec<IpAddr>),
}

/// Most addresses of a last resort.
pub const MAX_BYPASS_ADDRESSES: usize = 16;

impl Bypass {
    /// Checks a CNAME target: an absolute hostname (labels of letters, digits, `-` and `_`,
    /// 1 to 63 bytes each, 253 in all without the last dot).
    pub fn cname(name: &str) -> Result<Bypass, String> {
        let bare = name.strip_suffix('.').unwrap_or(name);
        let ok = !bare.is_empty()
            && bare.len() <= 253
            && bare.split('.').all(|l| {
                (1..=63).contains(&l.len())
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if ok {
            Ok(Bypass::Cname(format!("{bare}.")))
        } else {
            Err(format!("{} is not a hostname", shown_id(name)))
        }
    }

    /// Checks addresses: 1 to [`MAX_BYPASS_ADDRESSES`] of them.
    pub fn addresses(addresses: &[String]) -> Result<Bypass, String> {
        if addresses.is_empty() || addresses.len() > MAX_BYPASS_ADDRESSES {
            return Err(format!(
                "{} addresses, must be 1..={MAX_BYPASS_ADDRESSES}",
                addresses.len()
            ));
        }
        addresses
            .iter()
            .map(|a| {
                a.parse::<IpAddr>()
                    .map_err(|_| format!("{} is not an address", shown_id(a)))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Bypass::Addresses)
    }
}

fn unit_pb(m: &ServingMap, u: UnitIdx) -> pb::UnitMapping {
    let clusters = m.clusters();
    let (placed, shares) = m.shares(u);
    let backups = m.backups(u);
    pb::UnitMapping {
        id: m.unit_id(u).to_string(),
        traffic_class: m.unit_class_name(u).to_string(),
        prefixes: m.unit_prefixes(u).map(|p| p.to_string()).collect(),
        shares: placed
            .iter()
            .zip(shares)
            .map(|(&c, &share)| pb::ClusterShare {
                cluster: clusters[c as usize].id.clone(),
                share,
            })
            .collect(),
        overflow_share: m.overflow(u),
        backup_cluster: backups[0].map_or(String::new(), |c| clusters[c as usize].id.clone()),
        second_backup_cluster: backups[1]
            .map_or(String::new(), |c| clusters[c as usize].id.clone()),
        companion: m.companion(u).map(|(c, share)| pb::ClusterShare {
            cluster: clusters[c as usize].id.clone(),
            share,
        }),
    }
}

/// A cluster on the wire: its servers' loads only when its policy reads them (power-of-d),
/// so that a delta carrying what changed is not made of loads nothing reads.
fn cluster_pb(
    c: &ServingCluster,
    policy: Policy,
    load: &dyn Fn(usize, IpAddr) -> f64,
) -> pb::ClusterAddresses {
    pb::ClusterAddresses {
        id: c.id.clone(),
        addresses: c.addresses.iter().map(|a| a.to_string()).collect(),
        state: state_pb(c.state) as i32,
        selection: Some(policy_pb(&policy)),
        server_loads: match policy {
            Policy::PowerOfD { .. } => c
                .addresses
                .iter()
                .enumerate()
                .map(|(j, &a)| load(j, a))
                .collect(),
            Policy::Consistent { .. } | Policy::BoundedLoads { .. } => Vec::new(),
        },
    }
}

fn clusters_pb(edge: &Edge<'_>, m: &ServingMap) -> Vec<pb::ClusterAddresses> {
    m.clusters()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let policy = edge.policies.get(i).copied().unwrap_or_default();
            cluster_pb(c, policy, &|_, a| (edge.load)(&c.id, a))
        })
        .collect()
}

fn fallbacks_pb(m: &ServingMap) -> Vec<pb::ClassFallback> {
    let clusters = m.clusters();
    m.classes()
        .iter()
        .enumerate()
        .map(|(k, class)| pb::ClassFallback {
            traffic_class: class.to_string(),
            clusters: m
                .fallback(k as ClassIdx)
                .into_iter()
                .flatten()
                .map(|c| clusters[c as usize].id.clone())
                .collect(),
        })
        .collect()
}

fn rules_pb(rules: &[(String, String)]) -> Vec<pb::ClassRule> {
    rules
        .iter()
        .map(|(pattern, class)| pb::ClassRule {
            pattern: pattern.clone(),
            traffic_class: class.clone(),
        })
        .collect()
}

fn bypass_pb(bypass: &[(String, Bypass)]) -> Vec<pb::ClassBypass> {
    bypass
        .iter()
        .map(|(class, b)| match b {
            Bypass::Cname(name) => pb::ClassBypass {
                traffic_class: class.clone(),
                cname: name.clone(),
                addresses: Vec::new(),
            },
            Bypass::Addresses(a) => pb::ClassBypass {
                traffic_class: class.clone(),
                cname: String::new(),
                addresses: a.iter().map(|a| a.to_string()).collect(),
            },
        })
        .collect()
}

/// The message of `m` without units: identity, clusters, rules, fallbacks, last resorts.
fn frame(edge: &Edge<'_>, id: Identity, m: &ServingMap) -> pb::MapUpdate {
    pb::MapUpdate {
        epoch: id.epoch,
        version: id.version,
        solved_at_unix_ms: id.solved_at_unix_ms,
        clusters: clusters_pb(edge, m),
        class_rules: rules_pb(edge.rules),
        default_class: edge.default_class.to_string(),
        fallbacks: fallbacks_pb(m),
        bypass: bypass_pb(edge.bypass),
        ..Default::default()
    }
}

/// The map-wide sections a WatchMap caller holds (clusters, hostname rules and default class,
/// fallbacks, last resorts), as the mapper last sent them: what a delta that carries only
/// what changed is made against ([`delta_for`]). A stream keeps one per caller (at most
/// [`MAX_CLUSTERS`] clusters and [`MAX_CLASSES`] classes' worth).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sections {
    clusters: Vec<pb::ClusterAddresses>,
    class_rules: Vec<pb::ClassRule>,
    default_class: String,
    fallbacks: Vec<pb::ClassFallback>,
    bypass: Vec<pb::ClassBypass>,
}

impl Sections {
    /// The sections `update` brings its caller to when it carries them all: a full map's
    /// first part, or a delta without `sections`.
    pub fn of(update: &pb::MapUpdate) -> Sections {
        Sections {
            clusters: update.clusters.clone(),
            class_rules: update.class_rules.clone(),
            default_class: update.default_class.clone(),
            fallbacks: update.fallbacks.clone(),
            bypass: update.bypass.clone(),
        }
    }

    /// Moves `msg`'s sections into a delta that carries those that differ from `self`'s
    /// (clusters one by one, by id; the others whole), and makes `self` the sections `msg`
    /// had.
    fn carry_changes(&mut self, msg: &mut pb::MapUpdate) {
        let next = Sections {
            clusters: std::mem::take(&mut msg.clusters),
            class_rules: std::mem::take(&mut msg.class_rules),
            default_class: std::mem::take(&mut msg.default_class),
            fallbacks: std::mem::take(&mut msg.fallbacks),
            bypass: std::mem::take(&mut msg.bypass),
        };
        let (changed, removed) = changed_clusters(&self.clusters, &next.clusters);
        msg.clusters = changed;
        msg.removed_clusters = removed;
        let class_rules =
            self.class_rules != next.class_rules || self.default_class != next.default_class;
        let sections = pb::DeltaSections {
            class_rules,
            // With new rules, the fallbacks too: a front end numbers the classes the
            // fallbacks name first, then those only the rules name, as in a full map.
            fallbacks: class_rules || self.fallbacks != next.fallbacks,
            bypass: self.bypass != next.bypass,
        };
        if sections.class_rules {
            msg.class_rules = next.class_rules.clone();
            msg.default_class = next.default_class.clone();
        }
        if sections.fallbacks {
            msg.fallbacks = next.fallbacks.clone();
        }
        if sections.bypass {
            msg.bypass = next.bypass.clone();
        }
        msg.sections = Some(sections);
        *self = next;
    }
}

/// The clusters of `next` that `held` lacks or holds otherwise (whole, in `next`'s order),
/// and the ids of `held`'s that `next` lacks (in `held`'s order): one merge, both lists being
/// in increasing id order; a list out of order only makes more clusters look changed.
fn changed_clusters(
    held: &[pb::ClusterAddresses],
    next: &[pb::ClusterAddresses],
) -> (Vec<pb::ClusterAddresses>, Vec<String>) {
    use std::cmp::Ordering;
    let (mut changed, mut removed) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < held.len() || j < next.len() {
        let order = match (held.get(i), next.get(j)) {
            (Some(h), Some(n)) => h.id.cmp(&n.id),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match order {
            Ordering::Less => {
                removed.push(held[i].id.clone());
                i += 1;
            }
            Ordering::Greater => {
                changed.push(next[j].clone());
                j += 1;
            }
            Ordering::Equal => {
                if held[i] != next[j] {
                    changed.push(next[j].clone());
                }
                i += 1;
                j += 1;
            }
        }
    }
    (changed, removed)
}

/// How many messages the full map of `m` takes.
pub fn full_parts(m: &ServingMap) -> usize {
    m.unit_count().div_ceil(PART_UNITS).max(1)
}

/// Message `part` (of [`full_parts`]) of the whole map `m`: what a front end joining, or fallen
/// behind, starts from. Made one at a time, so a stream holds one part, not the whole map.
pub fn full_part(edge: &Edge<'_>, id: Identity, m: &ServingMap, part: usize) -> pb::MapUpdate {
    let parts = full_parts(m);
    let mut msg = if part == 0 {
        frame(edge, id, m)
    } else {
        pb::MapUpdate {
            epoch: id.epoch,
            version: id.version,
            solved_at_unix_ms: id.solved_at_unix_ms,
            ..Default::default()
        }
    };
    msg.full = true;
    msg.more = part + 1 < parts;
    if part == 0 {
        msg.size = Some(columns::size_of(m));
    }
    let start = part * PART_UNITS;
    let end = (start + PART_UNITS).min(m.unit_count());
    msg.columns = Some(columns::of(m, start..end));
    msg
}

/// The map units a message carries (as columns and as messages).
pub fn unit_count(msg: &pb::MapUpdate) -> usize {
    msg.units.len() + msg.columns.as_ref().map_or(0, |c| c.id_lengths.len())
}

/// A whole map in one message with its units as `UnitMapping` messages instead of columns,
/// checked as a front end checks it: for tools and tests that read units by id.
pub fn readable(update: pb::MapUpdate) -> Result<pb::MapUpdate, FollowError> {
    if update.columns.is_none() {
        return Ok(update);
    }
    if !update.full || update.more {
        return Err(invalid(
            "columns",
            "only a whole map in one message is made readable",
        ));
    }
    let mut f = Follower::default();
    f.apply(update.clone())?;
    let m = &f.held().ok_or_else(|| invalid("version", "not held"))?.map;
    Ok(pb::MapUpdate {
        columns: None,
        units: (0..m.unit_count() as UnitIdx)
            .map(|u| unit_pb(m, u))
            .collect(),
        ..update
    })
}

/// What changed from `prev` to `next`, for a caller that holds `prev` with the sections
/// `edge` gives it: [`delta_for`] against those sections.
pub fn delta_update(
    edge: &Edge<'_>,
    prev_id: Identity,
    prev: &ServingMap,
    id: Identity,
    next: &ServingMap,
) -> Option<pb::MapUpdate> {
    let mut held = Sections::of(&frame(edge, prev_id, prev));
    delta_for(edge, Some(&mut held), prev_id, prev, id, next)
}

/// What changed from `prev` to `next`: the units whose answer may differ (by id; see
/// [`ServingMap::same_unit`]) in id order and the ids gone; with `held` (the sections the
/// caller holds), the clusters that changed and the other sections that differ from `held`'s,
/// `held` becoming `next`'s; without, every section whole (a caller that did not ask for
/// changes only, or whose sections the stream does not know). `None` when the units are more
/// than [`MAX_DELTA_UNITS`] (`next` is then sent as a full map, and `held` is unchanged).
pub fn delta_for(
    edge: &Edge<'_>,
    held: Option<&mut Sections>,
    prev_id: Identity,
    prev: &ServingMap,
    id: Identity,
    next: &ServingMap,
) -> Option<pb::MapUpdate> {
    let (changed, removed) = changed_units(prev, next);
    if changed.len().saturating_add(removed.len()) > MAX_DELTA_UNITS {
        return None;
    }
    let mut msg = frame(edge, id, next);
    if let Some(held) = held {
        held.carry_changes(&mut msg);
    }
    msg.base_epoch = prev_id.epoch;
    msg.base_version = prev_id.version;
    msg.units = changed.into_iter().map(|u| unit_pb(next, u)).collect();
    msg.removed_units = removed;
    Some(msg)
}

/// The units of `next` whose answer may differ from `prev`'s, in id order, and the ids of
/// `prev`'s units that `next` no longer has: one merge over the two id orders.
pub fn changed_units(prev: &ServingMap, next: &ServingMap) -> (Vec<UnitIdx>, Vec<String>) {
    let (mut changed, mut removed) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0 as UnitIdx, 0 as UnitIdx);
    let (n, m) = (prev.unit_count() as UnitIdx, next.unit_count() as UnitIdx);
    while i < n || j < m {
        let order = match (i < n, j < m) {
            (true, true) => prev.unit_id(i).cmp(next.unit_id(j)),
            (true, false) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                removed.push(prev.unit_id(i).to_string());
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                changed.push(j);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                if !prev.same_unit(i, next, j) {
                    changed.push(j);
                }
                i += 1;
                j += 1;
            }
        }
    }
    (changed, removed)
}

/// What the front end answers with besides the map: per cluster (by index) its selection
/// policy and its servers' last reported loads, and the hostname rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extras {
    pub policies: Vec<Policy>,
    pub loads: Vec<Vec<f64>>,
    pub rules: Vec<(String, String)>,
    pub default_class: String,
    /// Per class name, its last resort.
    pub bypass: Vec<(String, Bypass)>,
}

/// A version the stream has brought in whole.
#[derive(Debug, Clone)]
pub struct Followed {
    pub identity: Identity,
    pub map: Arc<ServingMap>,
    pub extras: Arc<Extras>,
}

/// What [`Follower::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A new version is held.
    New,
    /// A part of a full map was taken; more are to come.
    Part,
    /// A full map older than the one held: not applied.
    Stale,
}

/// A full map being received in parts.
struct Building {
    identity: Identity,
    /// Older than the map held: its parts are taken (the stream goes on) but not kept.
    stale: bool,
    builder: Builder,
    extras: Extras,
    classes: Vec<Arc<str>>,
    /// Class index by class number (a position in the first part's fallbacks), for columns.
    class_of: Vec<ClassIdx>,
}

/// The front end's side of WatchMap: the versions the stream brought, applied in order.
#[derive(Default)]
pub struct Follower {
    held: Option<Followed>,
    building: Option<Building>,
}

impl Follower {
    /// A follower holding `f`, with no full map coming: a delta based on `f` applies, and a
    /// full map older than `f` is not applied. A front end following several mappers seeds
    /// each stream with the version in use this way, instead of keeping a map per stream.
    pub fn holding(f: Followed) -> Follower {
        Follower {
            held: Some(f),
            building: None,
        }
    }

    /// Puts `f` in place of the version held (`None`: nothing held) and returns the one held
    /// before; a full map being received stays. (Its parts are compared with the version held
    /// when its first part came.)
    pub fn hold(&mut self, f: Option<Followed>) -> Option<Followed> {
        std::mem::replace(&mut self.held, f)
    }

    /// Whether a full map is being received (its first part came, its last has not).
    pub fn is_building(&self) -> bool {
        self.building.is_some()
    }

    /// The version held.
    pub fn held(&self) -> Option<&Followed> {
        self.held.as_ref()
    }

    /// The identity held ((0, 0): none yet).
    pub fn identity(&self) -> (u64, u64) {
        self.held.as_ref().map_or((0, 0), |h| h.identity.key())
    }

    /// Applies one message. A full map (its last part) replaces what is held; a delta must
    /// follow the version held. A full map older than the one held is not applied. On error
    /// nothing held changes (a full map being received is dropped).
    pub fn apply(&mut self, update: pb::MapUpdate) -> Result<Applied, FollowError> {
        let result = self.apply_inner(update);
        if result.is_err() {
            self.building = None;
        }
        result
    }

    fn apply_inner(&mut self, update: pb::MapUpdate) -> Result<Applied, FollowError> {
        let identity = Identity {
            epoch: update.epoch,
            version: update.version,
            solved_at_unix_ms: update.solved_at_unix_ms,
        };
        let held = self.identity();
        if !update.full {
            if self.building.is_some() {
                return Err(FollowError::Parts {
                    got: identity.key(),
                    building: self.building.as_ref().map(|b| b.identity.key()),
                });
            }
            if update.columns.is_some() {
                return Err(invalid("columns", "a delta carries its units as `units`"));
            }
            if (update.base_epoch, update.base_version) != held || self.held.is_none() {
                return Err(FollowError::Gap {
                    base: (update.base_epoch, update.base_version),
                    held,
                });
            }
            let next = self.delta(identity, update)?;
            self.held = Some(next);
            return Ok(Applied::New);
        }
        if update.sections.is_some() || !update.removed_clusters.is_empty() {
            return Err(invalid(
                "sections",
                "a full map carries every section, and no `sections` or `removed_clusters`",
            ));
        }
        let more = update.more;
        match &mut self.building {
            Some(b) if b.identity.key() == identity.key() => {
                if !update.clusters.is_empty() || !update.fallbacks.is_empty() {
                    return Err(invalid(
                        "clusters",
                        "a full map's later parts carry units only",
                    ));
                }
                if !b.stale {
                    push_part(b, update)?;
                }
            }
            Some(b) => {
                return Err(FollowError::Parts {
                    got: identity.key(),
                    building: Some(b.identity.key()),
                })
            }
            None => {
                let (extras, classes, clusters) = frame_of(&update)?;
                let builder = Builder::new(classes.clone(), clusters)?;
                let class_of = update
                    .fallbacks
                    .iter()
                    .map(|f| class_in(&classes, &f.traffic_class).unwrap_or_default())
                    .collect();
                let mut b = Building {
                    identity,
                    stale: self.held.is_some() && identity.key() < held,
                    builder,
                    extras,
                    classes,
                    class_of,
                };
                if !b.stale {
                    let fallback =
                        fallback_of(&update, &b.classes, &|id| b.builder.cluster_index(id));
                    b.builder.set_fallback(&fallback);
                    // A whole map again (the mapper sends one for a round that moved many
                    // units, or a stream starting over) is usually of the units held: their
                    // keys are kept once, and so is the prefix index.
                    if let Some(h) = &self.held {
                        b.builder.expect_units_of(&h.map);
                    }
                    // Room for the whole map at once: as the first part announces it, else
                    // the size of the map held (the best guess of the one coming).
                    match (&update.size, &self.held) {
                        (Some(size), _) => b.builder.reserve(columns::room_for(size)),
                        (None, Some(h)) => b.builder.reserve(h.map.sizes()),
                        (None, None) => {}
                    }
                    push_part(&mut b, update)?;
                }
                self.building = Some(b);
            }
        }
        if more {
            return Ok(Applied::Part);
        }
        let Some(b) = self.building.take() else {
            return Ok(Applied::Part);
        };
        if b.stale {
            return Ok(Applied::Stale);
        }
        self.held = Some(Followed {
            identity: b.identity,
            map: Arc::new(b.builder.finish()),
            extras: Arc::new(b.extras),
        });
        Ok(Applied::New)
    }

    /// The held version with `update` (a delta) applied: one merge of the held units and the
    /// update's, in id order.
    fn delta(&self, identity: Identity, update: pb::MapUpdate) -> Result<Followed, FollowError> {
        let Some(held) = &self.held else {
            return Err(FollowError::Gap {
                base: (update.base_epoch, update.base_version),
                held: (0, 0),
            });
        };
        let update = with_held_sections(held, update)?;
        let old = &held.map;
        let (extras, classes, clusters) = frame_of(&update)?;
        let removed: HashSet<&str> = update.removed_units.iter().map(String::as_str).collect();
        let mut b = Builder::new(classes.clone(), clusters)?;
        let fallback = fallback_of(&update, &classes, &|id| b.cluster_index(id));
        b.set_fallback(&fallback);
        // Old indices to new, by id: a cluster or class gone must leave no unit behind.
        let cluster_map: Vec<Option<ClusterIdx>> = old
            .clusters()
            .iter()
            .map(|c| b.cluster_index(&c.id))
            .collect();
        let class_map: Vec<Option<ClassIdx>> = old
            .classes()
            .iter()
            .map(|name| class_in(&classes, name))
            .collect();
        let total = old.unit_count() + update.units.len();
        if total > MAX_UNITS {
            return Err(invalid(
                "units",
                format!("{total} map units, at most {MAX_UNITS}"),
            ));
        }
        if let Some(changed) = same_units_changed(old, &classes, &removed, &update.units, &b)? {
            // The usual round: the same units, some placed elsewhere. Their keys are shared,
            // the other placements copied column by column, not pushed anew.
            b.share_units_of(old)?;
            b.reserve(Sizes {
                units: old.unit_count(),
                shares: old.sizes().shares + sizes_of(&update.units).shares,
                ..Sizes::default()
            });
            let mut changed = changed.into_iter().peekable();
            for u in 0..old.unit_count() as UnitIdx {
                match changed.next_if(|(v, _)| *v == u) {
                    Some((_, p)) => {
                        if let Some((c, share)) = p.companion {
                            b.companion_of_next(c, share);
                        }
                        b.push_placement_of(p.shares, p.overflow, p.backups)?
                    }
                    None => b.copy_placement(old, u, &cluster_map).map_err(|e| {
                        invalid(format!("units[{:?}]", old.unit_id(u)), e.to_string())
                    })?,
                }
            }
            return Ok(Followed {
                identity,
                map: Arc::new(b.finish_placements()?),
                extras: Arc::new(extras),
            });
        }
        b.reserve(old.sizes() + sizes_of(&update.units));
        let mut incoming = update.units.into_iter().peekable();
        let mut u = 0 as UnitIdx;
        let n = old.unit_count() as UnitIdx;
        loop {
            let next_new = incoming.peek().map(|x| x.id.as_str());
            let take_old = match (u < n, next_new) {
                (false, None) => break,
                (true, None) => true,
                (false, Some(_)) => false,
                (true, Some(id)) => old.unit_id(u) < id,
            };
            if take_old {
                let id = old.unit_id(u);
                if !removed.contains(id) {
                    copy_unit(&mut b, old, u, &cluster_map, &class_map)?;
                }
                u += 1;
                continue;
            }
            let Some(unit) = incoming.next() else {
                break;
            };
            if u < n && old.unit_id(u) == unit.id {
                u += 1; // replaced
            }
            push_unit(&mut b, &classes, &unit)?;
        }
        Ok(Followed {
            identity,
            map: Arc::new(b.finish()),
            extras: Arc::new(extras),
        })
    }
}

/// `update`, a delta, with every map-wide section: when it carries only those that changed
/// (`sections` set), the others as `held` has them, and its clusters merged into `held`'s by
/// id (those in `removed_clusters` left out). Refused, naming the field: clusters or removed
/// ids out of order or unknown, and a section carried that `sections` does not name.
fn with_held_sections(
    held: &Followed,
    mut update: pb::MapUpdate,
) -> Result<pb::MapUpdate, FollowError> {
    let Some(sections) = update.sections.take() else {
        if !update.removed_clusters.is_empty() {
            return Err(invalid(
                "removed_clusters",
                "only in a delta with `sections` (one without carries every cluster)",
            ));
        }
        return Ok(update);
    };
    for (n, field) in [
        (update.clusters.len(), "clusters"),
        (update.removed_clusters.len(), "removed_clusters"),
    ] {
        if n > MAX_CLUSTERS {
            return Err(invalid(
                field,
                format!("{n} clusters, at most {MAX_CLUSTERS}"),
            ));
        }
    }
    let carried_unnamed = [
        (
            !sections.class_rules
                && (!update.class_rules.is_empty() || !update.default_class.is_empty()),
            "class_rules",
        ),
        (
            !sections.fallbacks && !update.fallbacks.is_empty(),
            "fallbacks",
        ),
        (!sections.bypass && !update.bypass.is_empty(), "bypass"),
    ];
    if let Some((_, field)) = carried_unnamed.iter().find(|(bad, _)| *bad) {
        return Err(invalid(
            *field,
            format!("carried, but `sections.{field}` is not set"),
        ));
    }
    let (m, x) = (&*held.map, &*held.extras);
    let changed = std::mem::take(&mut update.clusters);
    let removed = std::mem::take(&mut update.removed_clusters);
    for (ids, field) in [
        (
            changed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            "clusters",
        ),
        (
            removed.iter().map(String::as_str).collect(),
            "removed_clusters",
        ),
    ] {
        if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
            return Err(invalid(
                field,
                format!(
                    "{} after {}: not in increasing id order",
                    shown_id(w[1]),
                    shown_id(w[0])
                ),
            ));
        }
    }
    let mut changed = changed.into_iter().peekable();
    let mut removed = removed.iter().peekable();
    let mut merged = Vec::with_capacity(m.clusters().len() + changed.len());
    for (i, c) in m.clusters().iter().enumerate() {
        merged.extend(std::iter::from_fn(|| changed.next_if(|n| n.id < c.id)));
        let new = changed.next_if(|n| n.id == c.id);
        if removed.next_if(|r| **r == c.id).is_some() {
            if new.is_some() {
                return Err(invalid(
                    "removed_clusters",
                    format!("{} is both removed and changed", shown_id(&c.id)),
                ));
            }
            continue;
        }
        merged.push(new.unwrap_or_else(|| {
            let policy = x.policies.get(i).copied().unwrap_or_default();
            let loads = x.loads.get(i);
            cluster_pb(c, policy, &|j, _| {
                loads.and_then(|l| l.get(j)).copied().unwrap_or(0.0)
            })
        }));
    }
    merged.extend(changed);
    if let Some(r) = removed.next() {
        return Err(invalid(
            "removed_clusters",
            format!("{} is no cluster held", shown_id(r)),
        ));
    }
    update.clusters = merged;
    if !sections.class_rules {
        update.class_rules = rules_pb(&x.rules);
        update.default_class = x.default_class.clone();
    }
    if !sections.fallbacks {
        update.fallbacks = fallbacks_pb(m);
    }
    if !sections.bypass {
        update.bypass = bypass_pb(&x.bypass);
    }
    Ok(update)
}

/// A placement from a delta, for a unit `old` has with the same class and prefixes.
struct Placement {
    shares: Vec<(ClusterIdx, f64)>,
    overflow: f64,
    backups: [Option<ClusterIdx>; 2],
    companion: Option<(ClusterIdx, f64)>,
}

/// When a delta keeps `old`'s units exactly (no unit removed or added, the classes the same,
/// each unit it carries of the same class and prefixes as before), the units it changes by
/// index, in order, with their placements parsed; `None` when it does not (the map is then
/// built unit by unit).
fn same_units_changed(
    old: &ServingMap,
    classes: &[Arc<str>],
    removed: &HashSet<&str>,
    units: &[pb::UnitMapping],
    b: &Builder,
) -> Result<Option<Vec<(UnitIdx, Placement)>>, FollowError> {
    if !removed.is_empty() || old.classes() != classes {
        return Ok(None);
    }
    let mut changed = Vec::with_capacity(units.len());
    for unit in units {
        let Some(u) = old.unit_index(&unit.id) else {
            return Ok(None);
        };
        let parsed = parse_unit(classes, unit, &|id| b.cluster_index(id))?;
        let same_prefixes = parsed.prefixes.len() == old.unit_prefixes(u).len()
            && parsed
                .prefixes
                .iter()
                .zip(old.unit_prefixes(u))
                .all(|(p, q)| p.trunc() == q);
        if parsed.class != old.unit_class(u) || !same_prefixes {
            return Ok(None);
        }
        changed.push((
            u,
            Placement {
                shares: parsed.shares,
                overflow: unit.overflow_share,
                backups: parsed.backups,
                companion: parsed.companion,
            },
        ));
    }
    // In id order, each unit once (a unit sent twice is the general path's error).
    if changed.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Ok(None);
    }
    Ok(Some(changed))
}

/// An unchanged unit of `old` into the map being built, its clusters and class renumbered.
fn copy_unit(
    b: &mut Builder,
    old: &ServingMap,
    u: UnitIdx,
    cluster_map: &[Option<ClusterIdx>],
    class_map: &[Option<ClassIdx>],
) -> Result<(), FollowError> {
    let id = old.unit_id(u);
    let gone = |what: &str| invalid(format!("units[{id:?}]"), format!("its {what} is gone"));
    let class = class_map[usize::from(old.unit_class(u))].ok_or_else(|| gone("class"))?;
    let (clusters, shares) = old.shares(u);
    let mut placed = Vec::with_capacity(clusters.len());
    for (&c, &s) in clusters.iter().zip(shares) {
        placed.push((cluster_map[c as usize].ok_or_else(|| gone("cluster"))?, s));
    }
    let mut backups = [None, None];
    for (i, b) in old.backups(u).into_iter().enumerate() {
        if let Some(c) = b {
            backups[i] = Some(cluster_map[c as usize].ok_or_else(|| gone("backup cluster"))?);
        }
    }
    if let Some((c, share)) = old.companion(u) {
        let c = cluster_map[c as usize].ok_or_else(|| gone("companion cluster"))?;
        b.companion_of_next(c, share);
    }
    b.push(
        id,
        class,
        old.unit_prefixes(u),
        placed,
        old.overflow(u),
        backups,
    )?;
    Ok(())
}

fn class_in(classes: &[Arc<str>], name: &str) -> Option<ClassIdx> {
    classes
        .iter()
        .position(|c| &**c == name)
        .map(|k| k as ClassIdx)
}

/// What a message's frame holds: the extras, the class names, the clusters.
type Frame = (Extras, Vec<Arc<str>>, Vec<ServingCluster>);

/// The extras, the classes (the fallbacks' classes in order, then any other the rules or the
/// default name, by name) and the clusters of a message that carries them.
fn frame_of(update: &pb::MapUpdate) -> Result<Frame, FollowError> {
    if update.clusters.len() > MAX_CLUSTERS {
        return Err(invalid(
            "clusters",
            format!("{} clusters, at most {MAX_CLUSTERS}", update.clusters.len()),
        ));
    }
    let mut classes: Vec<Arc<str>> = Vec::new();
    let mut add = |name: &str| {
        if !classes.iter().any(|c| &**c == name) {
            classes.push(Arc::from(name));
        }
    };
    for f in &update.fallbacks {
        add(&f.traffic_class);
    }
    let mut more: Vec<&str> = update
        .class_rules
        .iter()
        .map(|r| r.traffic_class.as_str())
        .chain(std::iter::once(update.default_class.as_str()))
        .collect();
    more.sort_unstable();
    for name in more {
        add(name);
    }
    if classes.len() > MAX_CLASSES {
        return Err(invalid(
            "fallbacks",
            format!("{} traffic classes, at most {MAX_CLASSES}", classes.len()),
        ));
    }
    let mut extras = Extras {
        rules: update
            .class_rules
            .iter()
            .map(|r| (r.pattern.clone(), r.traffic_class.clone()))
            .collect(),
        default_class: update.default_class.clone(),
        ..Extras::default()
    };
    if update.bypass.len() > MAX_CLASSES {
        return Err(invalid(
            "bypass",
            format!("{} entries, at most {MAX_CLASSES}", update.bypass.len()),
        ));
    }
    for (i, b) in update.bypass.iter().enumerate() {
        let field = format!("bypass[{i}] ({})", shown_id(&b.traffic_class));
        let bypass = match (b.cname.is_empty(), b.addresses.is_empty()) {
            (false, true) => Bypass::cname(&b.cname),
            (true, false) => Bypass::addresses(&b.addresses),
            _ => Err("needs a cname or addresses, not both".to_string()),
        }
        .map_err(|e| invalid(field, e))?;
        extras.bypass.push((b.traffic_class.clone(), bypass));
    }
    let mut clusters = Vec::with_capacity(update.clusters.len());
    for (i, c) in update.clusters.iter().enumerate() {
        let field = |f: &str| format!("clusters[{i}] ({:?}).{f}", c.id);
        let addresses = c
            .addresses
            .iter()
            .map(|a| {
                a.parse::<IpAddr>().map_err(|_| {
                    invalid(
                        field("addresses"),
                        format!("{} is not an address", shown_id(a)),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let state = state_from_pb(c.state)
            .ok_or_else(|| invalid(field("state"), format!("{} is not a state", c.state)))?;
        let policy =
            policy_from_pb(c.selection.as_ref()).map_err(|e| invalid(field("selection"), e))?;
        let loads = addresses
            .iter()
            .enumerate()
            .map(|(j, _)| {
                c.server_loads
                    .get(j)
                    .copied()
                    .filter(|l| l.is_finite() && *l >= 0.0)
                    .unwrap_or(0.0)
            })
            .collect();
        extras.policies.push(policy);
        extras.loads.push(loads);
        clusters.push(ServingCluster {
            id: c.id.clone(),
            addresses,
            state,
        });
    }
    Ok((extras, classes, clusters))
}

/// Per class, its fallback clusters as the message names them (unknown ids left out).
fn fallback_of(
    update: &pb::MapUpdate,
    classes: &[Arc<str>],
    cluster: &dyn Fn(&str) -> Option<ClusterIdx>,
) -> Vec<[Option<ClusterIdx>; 2]> {
    let mut out = vec![[None, None]; classes.len()];
    for f in &update.fallbacks {
        let Some(k) = class_in(classes, &f.traffic_class) else {
            continue;
        };
        let ids: Vec<Option<ClusterIdx>> = f.clusters.iter().map(|c| cluster(c)).collect();
        out[usize::from(k)] = [
            ids.first().copied().flatten(),
            ids.get(1).copied().flatten(),
        ];
    }
    out
}

struct ParsedUnit {
    class: ClassIdx,
    prefixes: Vec<IpNet>,
    shares: Vec<(ClusterIdx, f64)>,
    backups: [Option<ClusterIdx>; 2],
    companion: Option<(ClusterIdx, f64)>,
}

fn parse_unit(
    classes: &[Arc<str>],
    u: &pb::UnitMapping,
    cluster: &dyn Fn(&str) -> Option<ClusterIdx>,
) -> Result<ParsedUnit, FollowError> {
    let field = |f: &str| format!("units[{:?}].{f}", u.id);
    if u.prefixes.len() > MAX_UNIT_PREFIXES || u.shares.len() > MAX_UNIT_PREFIXES {
        return Err(invalid(
            field("prefixes"),
            format!("more than {MAX_UNIT_PREFIXES} prefixes or shares"),
        ));
    }
    let class = class_in(classes, &u.traffic_class).ok_or_else(|| {
        invalid(
            field("traffic_class"),
            format!("{:?} is no class the fallbacks name", u.traffic_class),
        )
    })?;
    let prefixes = u
        .prefixes
        .iter()
        .map(|p| {
            p.parse::<IpNet>().map_err(|_| {
                invalid(
                    field("prefixes"),
                    format!("{} is not a prefix", shown_id(p)),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let known = |id: &str, what: &str| {
        cluster(id).ok_or_else(|| invalid(field(what), format!("{id:?} is no cluster of the map")))
    };
    let shares = u
        .shares
        .iter()
        .map(|s| Ok((known(&s.cluster, "shares")?, s.share)))
        .collect::<Result<Vec<_>, FollowError>>()?;
    let companion = match &u.companion {
        Some(c) => Some((known(&c.cluster, "companion")?, c.share)),
        None => None,
    };
    let mut backups = [None, None];
    for (i, (id, what)) in [
        (&u.backup_cluster, "backup_cluster"),
        (&u.second_backup_cluster, "second_backup_cluster"),
    ]
    .into_iter()
    .enumerate()
    {
        if !id.is_empty() {
            backups[i] = Some(known(id, what)?);
        }
    }
    Ok(ParsedUnit {
        class,
        prefixes,
        shares,
        backups,
        companion,
    })
}

/// What a message's units take in a serving map.
fn sizes_of(units: &[pb::UnitMapping]) -> Sizes {
    Sizes {
        units: units.len(),
        id_bytes: units.iter().map(|u| u.id.len()).sum(),
        prefixes: units.iter().map(|u| u.prefixes.len()).sum(),
        shares: units.iter().map(|u| u.shares.len()).sum(),
    }
}

/// A full map's part into the map being built: its columns, then its units.
fn push_part(b: &mut Building, update: pb::MapUpdate) -> Result<(), FollowError> {
    if let Some(c) = &update.columns {
        columns::push(&mut b.builder, &b.class_of, c)?;
    }
    push_units(&mut b.builder, &b.classes, update.units)
}

fn push_units(
    b: &mut Builder,
    classes: &[Arc<str>],
    units: Vec<pb::UnitMapping>,
) -> Result<(), FollowError> {
    let total = b.unit_count() + units.len();
    if total > MAX_UNITS {
        return Err(invalid(
            "units",
            format!("{total} map units, at most {MAX_UNITS}"),
        ));
    }
    b.grow(sizes_of(&units));
    for u in &units {
        push_unit(b, classes, u)?;
    }
    Ok(())
}

/// `u` parsed ([`parse_unit`]) and pushed to `b`, its companion with it.
fn push_unit(
    b: &mut Builder,
    classes: &[Arc<str>],
    u: &pb::UnitMapping,
) -> Result<(), FollowError> {
    let parsed = parse_unit(classes, u, &|id| b.cluster_index(id))?;
    if let Some((c, share)) = parsed.companion {
        b.companion_of_next(c, share);
    }
    b.push(
        &u.id,
        parsed.class,
        parsed.prefixes.iter().copied(),
        parsed.shares,
        u.overflow_share,
        parsed.backups,
    )?;
    Ok(())
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn cluster(id: &str, state: ClusterState) -> ServingCluster {
        ServingCluster {
            id: id.to_string(),
            addresses: vec!["192.0.2.1".parse().expect("address")],
            state,
        }
    }

    /// A random map: `units` units ("u00001", ... in id order, some ids skipped), classes
    /// "video" and "web", clusters from `ids`.
    pub(super) fn map(rng: &mut ChaCha8Rng, units: usize, ids: &[&str]) -> ServingMap {
        let classes: Vec<Arc<str>> = vec![Arc::from("video"), Arc::from("web")];
        let states = [ClusterState::Up, ClusterState::Drained, ClusterState::Down];
        let clusters = ids
            .iter()
            .map(|id| cluster(id, states[rng.random_range(0..3)]))
            .collect();
        let mut b = Builder::new(classes, clusters).expect("clusters in order");
        let n = ids.len() as ClusterIdx;
        for i in 0..units {
            if rng.random_bool(0.1) {
                continue;
            }
            let prefix: IpNet = format!("10.{}.{}.0/24", i >> 8 & 255, i & 255)
                .parse()
                .expect("prefix");
            let first = rng.random_range(0..n);
            let mut shares = vec![(first, 1.0)];
            let mut overflow = 0.0;
            if rng.random_bool(0.2) {
                shares = vec![(first, 0.25), ((first + 1) % n, 0.75)];
            } else if rng.random_bool(0.1) {
                (shares, overflow) = (vec![(first, 0.875)], 0.125);
            } else if n > 1 && rng.random_bool(0.15) {
                // Go with the winner: a companion beside the unit's cluster.
                shares = vec![(first, 0.75)];
                b.companion_of_next((first + 1) % n, 0.25);
            }
            let backups = [Some((first + 2) % n), None];
            let id = format!("u{i:06}");
            b.push(
                &id,
                (i % 2) as ClassIdx,
                [prefix],
                shares,
                overflow,
                backups,
            )
            .expect("a valid unit");
        }
        b.set_fallback(&[[Some(0), Some(1)], [Some(1), None]]);
        b.finish()
    }

    /// Policies (the first cluster's power-of-d, so its loads travel) and rules.
    fn edge_parts() -> (Vec<Policy>, Vec<(String, String)>) {
        let mut policies = vec![Policy::default(); 8];
        policies[0] = Policy::PowerOfD { vnodes: 10, d: 2 };
        (
            policies,
            vec![("*.video.example".to_string(), "video".to_string())],
        )
    }

    pub(super) fn with_edge<R>(f: impl FnOnce(&Edge<'_>) -> R) -> R {
        let (policies, rules) = edge_parts();
        let load = |_: &str, _: IpAddr| 0.5;
        f(&Edge {
            policies: &policies,
            load: &load,
            rules: &rules,
            default_class: "web",
            bypass: &bypass_parts(),
        })
    }

    fn bypass_parts() -> Vec<(String, Bypass)> {
        vec![
            (
                "video".to_string(),
                Bypass::cname("video.partner.example").expect("a name"),
            ),
            (
                "web".to_string(),
                Bypass::addresses(&["192.0.2.10".into(), "2001:db8::10".into()])
                    .expect("addresses"),
            ),
        ]
    }

    pub(super) fn id(epoch: u64, version: u64) -> Identity {
        Identity {
            epoch,
            version,
            solved_at_unix_ms: 7,
        }
    }

    fn send_full(f: &mut Follower, m: &ServingMap, at: Identity) -> Vec<Applied> {
        (0..full_parts(m))
            .map(|p| {
                let msg = with_edge(|e| full_part(e, at, m, p));
                f.apply(msg).expect("a part applies")
            })
            .collect()
    }

    /// A version lent to a follower (`holding`, `hold`) is what a delta must follow and what
    /// a full map is compared with, as one the follower brought in itself; taking it back
    /// leaves a full map being received in place.
    #[test]
    fn a_lent_version_is_followed_like_one_brought_in() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let m = map(&mut rng, 300, &["a", "b", "c"]);
        let next = map(&mut rng, 300, &["a", "b", "c"]);
        let mut source = Follower::default();
        send_full(&mut source, &m, id(5, 40));
        let lent = source.held().expect("held").clone();
        // A delta from the lent version applies, and shares nothing with the lender's state.
        let mut f = Follower::holding(lent.clone());
        let delta =
            with_edge(|e| delta_update(e, id(5, 40), &m, id(5, 41), &next)).expect("a small delta");
        assert_eq!(f.apply(delta.clone()), Ok(Applied::New));
        assert_eq!(*f.held().expect("held").map, next);
        assert_eq!(source.identity(), (5, 40));
        // Nothing held: the same delta is a gap.
        let mut empty = Follower::default();
        assert!(matches!(empty.apply(delta), Err(FollowError::Gap { .. })));
        // An older full map against the lent version is stale; a newer one applies.
        let mut f = Follower::default();
        assert_eq!(f.hold(Some(lent.clone())).map(|h| h.identity), None);
        assert_eq!(send_full(&mut f, &next, id(3, 90)), vec![Applied::Stale]);
        assert_eq!(f.identity(), (5, 40));
        // Taking the version back mid-map keeps the map being received.
        let big = map(&mut rng, PART_UNITS * 3 / 2, &["a", "b"]);
        let p0 = with_edge(|e| full_part(e, id(9, 1), &big, 0));
        assert_eq!(f.apply(p0), Ok(Applied::Part));
        assert!(f.is_building());
        let back = f.hold(None).expect("the lent version");
        assert_eq!(back.identity.key(), (5, 40));
        let p1 = with_edge(|e| full_part(e, id(9, 1), &big, 1));
        assert_eq!(f.apply(p1), Ok(Applied::New));
        assert!(!f.is_building());
        assert_eq!(*f.held().expect("held").map, big);
    }

    #[test]
    fn policies_survive_the_wire() {
        for p in [
            Policy::Consistent { vnodes: 7 },
            Policy::BoundedLoads { vnodes: 9, c: 1.5 },
            Policy::PowerOfD { vnodes: 3, d: 4 },
        ] {
            assert_eq!(policy_from_pb(Some(&policy_pb(&p))), Ok(p));
        }
        assert_eq!(policy_from_pb(None), Ok(Policy::default()));
        let bad = pb::ServerSelection {
            policy: "random".into(),
            ..Default::default()
        };
        assert!(policy_from_pb(Some(&bad)).unwrap_err().contains("random"));
        let bad = pb::ServerSelection {
            policy: "bounded".into(),
            vnodes: 10,
            c: 0.5,
            d: 0,
        };
        assert!(policy_from_pb(Some(&bad)).unwrap_err().contains("c is 0.5"));
    }

    /// A round that moves more units than a delta carries has no delta: the map goes whole,
    /// and a front end taking it over the units it holds keeps their keys (so its prefix
    /// index too), holding the map sent.
    #[test]
    fn a_round_moving_more_than_a_delta_carries_goes_whole_over_the_units_held() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let first = map(
            &mut rng,
            MAX_DELTA_UNITS + MAX_DELTA_UNITS / 4,
            &["a", "b", "c"],
        );
        // Every unit's placement again, from the same draw of units (same ids and prefixes).
        let mut b =
            Builder::new(first.classes().to_vec(), first.clusters().to_vec()).expect("clusters");
        b.share_units_of(&first).expect("empty");
        for u in 0..first.unit_count() as UnitIdx {
            let (clusters, _) = first.shares(u);
            let c = clusters.first().map_or(0, |c| (c + 1) % 3);
            b.push_placement_of([(c, 1.0)], 0.0, [Some((c + 1) % 3), None])
                .expect("placed");
        }
        let moved = b.finish_placements().expect("all placed");
        assert!(changed_units(&first, &moved).0.len() > MAX_DELTA_UNITS);
        assert_eq!(
            with_edge(|e| delta_update(e, id(1, 1), &first, id(1, 2), &moved)),
            None
        );
        // A small change still goes as a delta.
        assert!(with_edge(|e| delta_update(e, id(1, 1), &first, id(1, 2), &first)).is_some());
        let mut f = Follower::default();
        send_full(&mut f, &first, id(1, 1));
        let held_first = Arc::clone(&f.held().expect("held").map);
        let applied = send_full(&mut f, &moved, id(1, 2));
        assert_eq!(applied.last(), Some(&Applied::New));
        let held = &f.held().expect("held").map;
        assert_eq!(**held, moved);
        assert!(
            held.shares_units_with(&held_first),
            "the units' keys are kept once"
        );
    }

    /// A map of more than two parts' units arrives in three messages and is held, equal to
    /// what was sent, only after the last; nothing is held before.
    #[test]
    fn a_full_map_in_parts_is_the_map_sent() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let m = map(&mut rng, PART_UNITS * 2 + PART_UNITS / 2, &["a", "b", "c"]);
        assert!(m.unit_count() > 2 * PART_UNITS, "{}", m.unit_count());
        assert_eq!(full_parts(&m), 3);
        let mut f = Follower::default();
        let first = with_edge(|e| full_part(e, id(1, 1), &m, 0));
        assert!(first.more && first.full && !first.clusters.is_empty());
        assert_eq!(f.apply(first), Ok(Applied::Part));
        assert!(f.held().is_none(), "nothing held before the last part");
        let second = with_edge(|e| full_part(e, id(1, 1), &m, 1));
        assert!(second.clusters.is_empty() && second.fallbacks.is_empty());
        assert_eq!(f.apply(second), Ok(Applied::Part));
        let last = with_edge(|e| full_part(e, id(1, 1), &m, 2));
        assert!(!last.more);
        assert_eq!(f.apply(last), Ok(Applied::New));
        let held = f.held().expect("held");
        assert_eq!(*held.map, m);
        assert_eq!(held.identity, id(1, 1));
        // Loads travel for the power-of-d cluster only; the others' read 0 (nothing reads them).
        assert_eq!(held.extras.loads, vec![vec![0.5], vec![0.0], vec![0.0]]);
        assert_eq!(held.extras.bypass, bypass_parts());
        assert_eq!(
            held.extras.bypass[0].1,
            Bypass::Cname("video.partner.example.".into()),
            "made absolute"
        );
        // A full map older than the one held is taken part by part and not applied.
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let other = map(&mut rng, PART_UNITS + PART_UNITS / 2, &["a", "b"]);
        let applied = send_full(&mut f, &other, id(0, 9));
        assert_eq!(applied, vec![Applied::Part, Applied::Stale]);
        assert_eq!(f.identity(), (1, 1));
        assert_eq!(*f.held().expect("held").map, m);
        // A newer one after it is applied.
        assert_eq!(
            send_full(&mut f, &other, id(2, 1)).last(),
            Some(&Applied::New)
        );
        assert_eq!(*f.held().expect("held").map, other);
    }

    /// A part of another version while one is coming is refused, and the half-received map
    /// dropped; the version held stays.
    #[test]
    fn parts_of_two_versions_do_not_mix() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let small = map(&mut rng, 50, &["a", "b", "c"]);
        let big = map(&mut rng, PART_UNITS * 3 / 2, &["a", "b", "c"]);
        let mut f = Follower::default();
        assert_eq!(send_full(&mut f, &small, id(1, 1)), vec![Applied::New]);
        let p0 = with_edge(|e| full_part(e, id(1, 3), &big, 0));
        assert_eq!(f.apply(p0), Ok(Applied::Part));
        let other = with_edge(|e| full_part(e, id(1, 4), &big, 1));
        assert!(matches!(f.apply(other), Err(FollowError::Parts { .. })));
        let late = with_edge(|e| full_part(e, id(1, 3), &big, 1));
        // The map being built was dropped: a later part alone starts a new one, which then
        // lacks the first part's clusters.
        assert!(f.apply(late).is_err());
        assert_eq!(*f.held().expect("held").map, small);
        // A delta in the middle of a full map is refused too.
        let p0 = with_edge(|e| full_part(e, id(1, 3), &big, 0));
        assert_eq!(f.apply(p0), Ok(Applied::Part));
        let delta = with_edge(|e| delta_update(e, id(1, 1), &small, id(1, 2), &small))
            .expect("a small delta");
        assert!(matches!(f.apply(delta), Err(FollowError::Parts { .. })));
    }

    /// Random pairs of maps, over cluster lists that gain and lose clusters: the delta from
    /// one to the other, applied to the first, gives exactly the second; a delta not based on
    /// the version held is a gap.
    #[test]
    fn a_delta_applied_gives_the_next_map() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let lists: [&[&str]; 3] = [&["a", "b", "c"], &["a", "b", "c", "d"], &["b", "c", "d"]];
        for case in 0..30 {
            let prev = map(&mut rng, 400, lists[case % 2]);
            let mut next = map(&mut rng, 400, lists[case % 3]);
            if case % 5 == 0 {
                next = prev.clone();
            }
            let mut f = Follower::default();
            send_full(&mut f, &prev, id(2, 5));
            let delta = with_edge(|e| delta_update(e, id(2, 5), &prev, id(2, 6), &next))
                .expect("a small delta");
            let (changed, removed) = changed_units(&prev, &next);
            assert_eq!(delta.units.len(), changed.len());
            assert_eq!(delta.removed_units, removed);
            if case % 5 == 0 {
                assert!(changed.is_empty() && removed.is_empty());
            }
            match f.apply(delta) {
                Ok(Applied::New) => assert_eq!(*f.held().expect("held").map, next, "case {case}"),
                // An unchanged unit on a cluster the next list lacks: the front end asks for a
                // full map instead (the mapper never sends such a delta: a unit on a removed
                // cluster changed).
                Err(FollowError::Invalid { problem, .. }) => {
                    assert!(problem.contains("gone"), "case {case}: {problem}");
                }
                other => panic!("case {case}: {other:?}"),
            }
            let gap = with_edge(|e| delta_update(e, id(2, 4), &prev, id(2, 7), &next))
                .expect("a small delta");
            assert!(matches!(f.apply(gap), Err(FollowError::Gap { .. })));
        }
    }

    /// `prev`'s units (ids, classes, prefixes) with new random placements over clusters `ids`,
    /// each unit moved with probability `moved`.
    fn replaced(rng: &mut ChaCha8Rng, prev: &ServingMap, ids: &[&str], moved: f64) -> ServingMap {
        let clusters = ids.iter().map(|id| cluster(id, ClusterState::Up)).collect();
        edited(
            rng,
            prev,
            clusters,
            moved,
            &[[Some(0), Some(1)], [Some(1), None]],
        )
    }

    /// `prev`'s units (ids, classes, prefixes) over `clusters` (in id order), each unit placed
    /// elsewhere at random with probability `moved` or when a cluster it names is gone, and
    /// the classes' fallbacks `fallback`.
    fn edited(
        rng: &mut ChaCha8Rng,
        prev: &ServingMap,
        clusters: Vec<ServingCluster>,
        moved: f64,
        fallback: &[[Option<ClusterIdx>; 2]],
    ) -> ServingMap {
        let ids: Vec<String> = clusters.iter().map(|c| c.id.clone()).collect();
        let mut b = Builder::new(prev.classes().to_vec(), clusters).expect("clusters");
        let n = ids.len() as ClusterIdx;
        let index = |c: ClusterIdx| {
            let id = &prev.clusters()[c as usize].id;
            ids.iter().position(|x| x == id).map(|i| i as ClusterIdx)
        };
        for u in 0..prev.unit_count() as UnitIdx {
            let (clusters, shares) = prev.shares(u);
            let kept: Option<Vec<(ClusterIdx, f64)>> = clusters
                .iter()
                .zip(shares)
                .map(|(&c, &s)| index(c).map(|c| (c, s)))
                .collect();
            let backups: Option<Vec<ClusterIdx>> =
                prev.backups(u).into_iter().flatten().map(index).collect();
            let companion = prev.companion(u).map(|(c, s)| index(c).map(|c| (c, s)));
            let (shares, backups) = match (kept, backups, companion) {
                (Some(k), Some(kb), None | Some(Some(_))) if !rng.random_bool(moved) => {
                    if let Some(Some((c, share))) = companion {
                        b.companion_of_next(c, share);
                    }
                    (k, [kb.first().copied(), kb.get(1).copied()])
                }
                _ => {
                    let first = rng.random_range(0..n);
                    (vec![(first, 1.0)], [Some((first + 1) % n), None])
                }
            };
            b.push(
                prev.unit_id(u),
                prev.unit_class(u),
                prev.unit_prefixes(u),
                shares,
                prev.overflow(u),
                backups,
            )
            .expect("a valid unit");
        }
        b.set_fallback(fallback);
        b.finish()
    }

    /// The usual round: the same units, a few placed elsewhere, over a cluster list that may
    /// gain a cluster (and so renumber the others): the delta applied is exactly the next map,
    /// and it shares the units (ids, classes, prefixes) of the map before rather than a copy.
    #[test]
    fn a_delta_of_the_same_units_shares_them_and_gives_the_next_map() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (case, ids) in [
            &["a", "b", "c"][..],
            &["0", "a", "b", "c"],
            &["a", "b", "c"],
        ]
        .into_iter()
        .enumerate()
        {
            let prev = map(&mut rng, 3_000, &["a", "b", "c"]);
            let next = replaced(&mut rng, &prev, ids, 0.05);
            let mut f = Follower::default();
            send_full(&mut f, &prev, id(2, 5));
            let held_prev = Arc::clone(&f.held().expect("held").map);
            let delta = with_edge(|e| delta_update(e, id(2, 5), &prev, id(2, 6), &next))
                .expect("a small delta");
            assert!(!delta.units.is_empty() && delta.units.len() < prev.unit_count() / 5);
            assert_eq!(f.apply(delta), Ok(Applied::New), "case {case}");
            let held = f.held().expect("held");
            assert_eq!(*held.map, next, "case {case}");
            assert!(held.map.shares_units_with(&held_prev), "case {case}");
        }
    }

    /// Units out of id order, an unknown class or cluster, a share out of (0, 1]: refused,
    /// naming the unit, and nothing held changes.
    #[test]
    fn bad_units_are_refused_by_name() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let m = map(&mut rng, 20, &["a", "b", "c"]);
        let mut f = Follower::default();
        send_full(&mut f, &m, id(1, 1));
        // A full map with its units as messages (what an older mapper sent; still taken).
        let mut good = with_edge(|e| full_part(e, id(1, 2), &m, 0));
        good.columns = None;
        good.units = (0..m.unit_count() as UnitIdx)
            .map(|u| unit_pb(&m, u))
            .collect();
        let mut f2 = Follower::default();
        assert_eq!(f2.apply(good.clone()), Ok(Applied::New));
        assert_eq!(*f2.held().expect("held").map, m, "units as messages");
        type Break = Box<dyn Fn(&mut pb::MapUpdate)>;
        let cases: Vec<(Break, &str)> = vec![
            (Box::new(|u| u.units.swap(0, 1)), "increasing id order"),
            (
                Box::new(|u| u.units[3].traffic_class = "apps".into()),
                "no class the fallbacks name",
            ),
            (
                Box::new(|u| u.units[2].shares[0].cluster = "zz".into()),
                "no cluster of the map",
            ),
            (
                Box::new(|u| u.units[1].shares[0].share = 1.5),
                "not in (0, 1]",
            ),
            (
                Box::new(|u| u.units[1].shares[0].share = f64::NAN),
                "not in (0, 1]",
            ),
            (
                Box::new(|u| u.units[4].prefixes = vec!["10.0.0.0/99".into()]),
                "is not a prefix",
            ),
            (Box::new(|u| u.clusters.swap(0, 2)), "increasing id order"),
        ];
        for (break_it, want) in cases {
            let mut bad = good.clone();
            break_it(&mut bad);
            let e = f.apply(bad).expect_err(want);
            assert!(e.to_string().contains(want), "{e} (wanted {want:?})");
            assert_eq!(f.identity(), (1, 1));
            assert_eq!(*f.held().expect("held").map, m);
        }
    }

    /// Columns that disagree with each other or hold a bad unit: refused with the column or
    /// the unit named, and nothing held changes.
    #[test]
    fn bad_columns_are_refused_by_name() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let m = map(&mut rng, 40, &["a", "b", "c"]);
        let mut f = Follower::default();
        send_full(&mut f, &m, id(1, 1));
        let good = with_edge(|e| full_part(e, id(1, 2), &m, 0));
        type Break = Box<dyn Fn(&mut pb::UnitColumns)>;
        let cases: Vec<(Break, &str)> = vec![
            (
                // The first two ids swapped (all are seven bytes).
                Box::new(|c| c.ids[..14].rotate_left(7)),
                "increasing id order",
            ),
            (Box::new(|c| c.ids[1] = 0xff), "not UTF-8"),
            (Box::new(|c| c.ids.truncate(20)), "columns.ids"),
            (Box::new(|c| c.ids.push(b'x')), "left after the last unit"),
            (
                Box::new(|c| c.id_lengths[0] = u32::MAX),
                "cut short at unit 0",
            ),
            (Box::new(|c| c.classes[3] = 9), "class number 9"),
            (
                Box::new(|c| c.classes.pop().map(drop).unwrap_or(())),
                "entries for",
            ),
            (Box::new(|c| c.share_clusters[2] = 77), "cluster index 77"),
            (
                Box::new(|c| {
                    let last = c.placements.len() - 1;
                    c.placements[last] = 4 << 1
                }),
                "cut short in columns.share_clusters",
            ),
            (Box::new(|c| c.placements[1] = 2 << 1 | 1), "whole: true"),
            (Box::new(|c| c.shares.push(0.5)), "left after the last unit"),
            (Box::new(|c| c.prefixes[0] = 3), "neither 1 (IPv4) nor 2"),
            (
                Box::new(|c| (c.prefixes[1], c.prefixes[4]) = (23, 1)),
                "beyond the prefix length",
            ),
            (Box::new(|c| c.prefix_counts[5] = 5_000), "at most 4096"),
            (Box::new(|c| c.backups[0] = 100), "backup cluster index 99"),
            (
                Box::new(|c| c.backups.pop().map(drop).unwrap_or(())),
                "two each",
            ),
            (Box::new(|c| c.overflow_shares[0] = 2.0), "not in [0, 1]"),
            (Box::new(|c| c.overflow_shares.clear()), "overflow shares"),
        ];
        for (break_it, want) in cases {
            let mut bad = good.clone();
            break_it(bad.columns.as_mut().expect("columns"));
            let e = f.apply(bad).expect_err(want);
            assert!(e.to_string().contains(want), "{e} (wanted {want:?})");
            assert_eq!(f.identity(), (1, 1));
            assert_eq!(*f.held().expect("held").map, m);
        }
        // A delta never carries columns.
        let mut delta =
            with_edge(|e| delta_update(e, id(1, 1), &m, id(1, 2), &m)).expect("a small delta");
        delta.columns = good.columns.clone();
        let e = f.apply(delta).expect_err("columns in a delta");
        assert!(e.to_string().contains("as `units`"), "{e}");
    }

    /// What a mapper adds to a map, owned: policies by cluster index, server loads, rules, the
    /// default class and last resorts.
    #[derive(Clone)]
    struct Side {
        policies: Vec<Policy>,
        loads: std::collections::HashMap<(String, IpAddr), f64>,
        rules: Vec<(String, String)>,
        default_class: String,
        bypass: Vec<(String, Bypass)>,
    }

    impl Side {
        /// What `with_edge` gives.
        fn base() -> Side {
            let (policies, rules) = edge_parts();
            Side {
                policies,
                loads: Default::default(),
                rules,
                default_class: "web".into(),
                bypass: bypass_parts(),
            }
        }

        fn with<R>(&self, f: impl FnOnce(&Edge<'_>) -> R) -> R {
            let load =
                |c: &str, a: IpAddr| self.loads.get(&(c.to_string(), a)).copied().unwrap_or(0.0);
            f(&Edge {
                policies: &self.policies,
                load: &load,
                rules: &self.rules,
                default_class: &self.default_class,
                bypass: &self.bypass,
            })
        }

        /// `m` whole at `at`, followed by a new front end; and the sections its first part
        /// carries, as a stream keeps them.
        fn full(&self, m: &ServingMap, at: Identity) -> (Followed, Sections) {
            let mut f = Follower::default();
            let mut sections = None;
            for p in 0..full_parts(m) {
                let msg = self.with(|e| full_part(e, at, m, p));
                sections.get_or_insert_with(|| Sections::of(&msg));
                f.apply(msg).expect("a part applies");
            }
            let held = f.held().expect("a map held").clone();
            (held, sections.unwrap_or_default())
        }
    }

    /// Whether `d` carries no map-wide section.
    fn carries_no_section(d: &pb::MapUpdate) -> bool {
        d.clusters.is_empty()
            && d.removed_clusters.is_empty()
            && d.class_rules.is_empty()
            && d.default_class.is_empty()
            && d.fallbacks.is_empty()
            && d.bypass.is_empty()
    }

    const FALLBACK: [[Option<ClusterIdx>; 2]; 2] = [[Some(0), Some(1)], [Some(1), None]];

    /// A round that changed nothing is a delta of no unit and no section (a few bytes, where
    /// every section whole is hundreds), and the follower holds the same map and extras at
    /// the new version. A delta that carries every section (to a front end that did not ask
    /// for changes only) gives the same.
    #[test]
    fn a_delta_with_nothing_changed_carries_no_section_and_keeps_the_map() {
        use cdnmap_proto::prost::Message;
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let m = map(&mut rng, 500, &["a", "b", "c"]);
        let mut f = Follower::default();
        send_full(&mut f, &m, id(1, 1));
        let before = f.held().expect("held").clone();
        let d = with_edge(|e| delta_update(e, id(1, 1), &m, id(1, 2), &m)).expect("a delta");
        assert_eq!(d.sections, Some(pb::DeltaSections::default()));
        assert!(carries_no_section(&d), "{d:?}");
        assert!(d.units.is_empty() && d.removed_units.is_empty());
        let whole = with_edge(|e| delta_for(e, None, id(1, 1), &m, id(1, 2), &m)).expect("a delta");
        assert_eq!(whole.sections, None);
        assert_eq!(whole.clusters.len(), 3);
        assert!(
            d.encoded_len() < 32 && whole.encoded_len() > 200,
            "{} and {} bytes",
            d.encoded_len(),
            whole.encoded_len()
        );
        let mut g = Follower::holding(before.clone());
        assert_eq!(f.apply(d), Ok(Applied::New));
        assert_eq!(g.apply(whole), Ok(Applied::New));
        for f in [&f, &g] {
            let held = f.held().expect("held");
            assert_eq!(held.identity.key(), (1, 2));
            assert_eq!(*held.map, m);
            assert_eq!(held.extras, before.extras);
        }
    }

    /// A cluster drained: the delta carries that cluster alone, whole, and the follower's map
    /// is the mapper's.
    #[test]
    fn a_drained_cluster_is_the_only_cluster_a_delta_carries() {
        let mut rng = ChaCha8Rng::seed_from_u64(22);
        let up = |id: &str| cluster(id, ClusterState::Up);
        let base = map(&mut rng, 400, &["a", "b", "c"]);
        let prev = edited(
            &mut rng,
            &base,
            vec![up("a"), up("b"), up("c")],
            0.0,
            &FALLBACK,
        );
        let drained = vec![up("a"), cluster("b", ClusterState::Drained), up("c")];
        let next = edited(&mut rng, &prev, drained, 0.0, &FALLBACK);
        let side = Side::base();
        let (held, mut sections) = side.full(&prev, id(1, 1));
        let d = side
            .with(|e| delta_for(e, Some(&mut sections), id(1, 1), &prev, id(1, 2), &next))
            .expect("a delta");
        assert_eq!(d.sections, Some(pb::DeltaSections::default()));
        let ids: Vec<&str> = d.clusters.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["b"]);
        assert_eq!(d.clusters[0].state, pb::ClusterState::Drained as i32);
        assert_eq!(d.clusters[0].addresses, ["192.0.2.1"]);
        assert!(d.removed_clusters.is_empty() && d.fallbacks.is_empty());
        let mut f = Follower::holding(held);
        assert_eq!(f.apply(d), Ok(Applied::New));
        let (fresh, fresh_sections) = side.full(&next, id(1, 2));
        assert_eq!(*f.held().expect("held").map, next);
        assert_eq!(f.held().expect("held").extras, fresh.extras);
        assert_eq!(
            sections, fresh_sections,
            "the stream holds what the front end holds"
        );
    }

    /// Rules, the default class and last resorts changed (to none): the delta carries them
    /// (empty, flagged), the fallbacks with the rules, and no cluster; the follower has none
    /// after it, and keeps none through the next delta that does not carry them.
    #[test]
    fn changed_rules_and_last_resorts_travel_even_when_now_empty() {
        let mut rng = ChaCha8Rng::seed_from_u64(23);
        let m = map(&mut rng, 300, &["a", "b", "c"]);
        let side = Side::base();
        let (held, mut sections) = side.full(&m, id(1, 1));
        assert!(!held.extras.rules.is_empty() && !held.extras.bypass.is_empty());
        let mut f = Follower::holding(held);
        let bare = Side {
            rules: Vec::new(),
            default_class: "video".into(),
            bypass: Vec::new(),
            ..side.clone()
        };
        let d = bare
            .with(|e| delta_for(e, Some(&mut sections), id(1, 1), &m, id(1, 2), &m))
            .expect("a delta");
        assert_eq!(
            d.sections,
            Some(pb::DeltaSections {
                class_rules: true,
                fallbacks: true,
                bypass: true
            })
        );
        assert!(d.class_rules.is_empty() && d.bypass.is_empty() && d.clusters.is_empty());
        assert_eq!(d.default_class, "video");
        assert_eq!(f.apply(d), Ok(Applied::New));
        let x = &f.held().expect("held").extras;
        assert!(x.rules.is_empty() && x.bypass.is_empty(), "{x:?}");
        assert_eq!(x.default_class, "video");
        // Unchanged since: nothing carried, nothing brought back.
        let d = bare
            .with(|e| delta_for(e, Some(&mut sections), id(1, 2), &m, id(1, 3), &m))
            .expect("a delta");
        assert!(carries_no_section(&d));
        assert_eq!(f.apply(d), Ok(Applied::New));
        let held = f.held().expect("held");
        assert_eq!(held.extras, bare.full(&m, id(1, 3)).0.extras);
        assert_eq!(*held.map, m);
    }

    /// A rule naming a class the map has no unit of makes a class the front end numbers
    /// after the map's; rules without it again take it away, as a full map would.
    #[test]
    fn a_class_only_a_rule_names_comes_and_goes_as_in_a_full_map() {
        let mut rng = ChaCha8Rng::seed_from_u64(26);
        let m = map(&mut rng, 200, &["a", "b", "c"]);
        let plain = Side::base();
        let apps = Side {
            rules: vec![("*.apps.example".into(), "apps".into())],
            ..plain.clone()
        };
        let (held, mut sections) = plain.full(&m, id(1, 1));
        let mut f = Follower::holding(held);
        for (v, side) in [(2, &apps), (3, &plain), (4, &apps)] {
            let d = side
                .with(|e| delta_for(e, Some(&mut sections), id(1, v - 1), &m, id(1, v), &m))
                .expect("a delta");
            assert_eq!(f.apply(d), Ok(Applied::New), "version {v}");
            let (fresh, _) = side.full(&m, id(1, v));
            let held = f.held().expect("held");
            assert_eq!(held.map.classes(), fresh.map.classes(), "version {v}");
            assert_eq!(*held.map, *fresh.map, "version {v}");
            assert_eq!(held.extras, fresh.extras, "version {v}");
        }
    }

    /// A reported load changed: a power-of-d cluster's is carried (that cluster alone), one
    /// that nothing reads (a consistent-hashing cluster's) is not.
    #[test]
    fn loads_travel_when_a_policy_reads_them() {
        let mut rng = ChaCha8Rng::seed_from_u64(24);
        let m = map(&mut rng, 300, &["a", "b", "c"]);
        let mut side = Side::base();
        let (held, mut sections) = side.full(&m, id(1, 1));
        let mut f = Follower::holding(held);
        let server: IpAddr = "192.0.2.1".parse().expect("address");
        side.loads.insert(("b".into(), server), 0.75);
        let d = side
            .with(|e| delta_for(e, Some(&mut sections), id(1, 1), &m, id(1, 2), &m))
            .expect("a delta");
        assert!(carries_no_section(&d), "b is consistent hashing: {d:?}");
        assert_eq!(f.apply(d), Ok(Applied::New));
        side.loads.insert(("a".into(), server), 0.25);
        let d = side
            .with(|e| delta_for(e, Some(&mut sections), id(1, 2), &m, id(1, 3), &m))
            .expect("a delta");
        let carried: Vec<(&str, &[f64])> = d
            .clusters
            .iter()
            .map(|c| (c.id.as_str(), c.server_loads.as_slice()))
            .collect();
        assert_eq!(carried, [("a", &[0.25][..])]);
        assert_eq!(f.apply(d), Ok(Applied::New));
        assert_eq!(
            f.held().expect("held").extras.loads,
            [vec![0.25], vec![0.0], vec![0.0]]
        );
    }

    /// A delta of changed sections that does not hold together is refused by field, and
    /// nothing held changes: removed clusters without `sections`, an unknown one, one both
    /// removed and changed, clusters out of order, a section carried that `sections` does
    /// not name; and a full map with `sections`.
    #[test]
    fn bad_changed_sections_are_refused_by_field() {
        let mut rng = ChaCha8Rng::seed_from_u64(25);
        let m = map(&mut rng, 100, &["a", "b", "c"]);
        let next = map(&mut rng, 100, &["a", "b", "c"]);
        let mut f = Follower::default();
        send_full(&mut f, &m, id(1, 1));
        let good = with_edge(|e| delta_update(e, id(1, 1), &m, id(1, 2), &next)).expect("delta");
        let cluster_pb = |id: &str| pb::ClusterAddresses {
            id: id.into(),
            addresses: vec!["192.0.2.9".into()],
            state: pb::ClusterState::Up as i32,
            ..Default::default()
        };
        type Break = Box<dyn Fn(&mut pb::MapUpdate)>;
        let cases: Vec<(Break, &str)> = vec![
            (
                Box::new(|d| {
                    d.sections = None;
                    d.removed_clusters = vec!["a".into()];
                }),
                "removed_clusters: only in a delta with `sections`",
            ),
            (
                Box::new(|d| d.removed_clusters = vec!["zz".into()]),
                "\"zz\" is no cluster held",
            ),
            (
                Box::new(move |d| {
                    d.removed_clusters = vec!["b".into()];
                    d.clusters = vec![cluster_pb("b")];
                }),
                "both removed and changed",
            ),
            (
                Box::new(move |d| d.clusters = vec![cluster_pb("c"), cluster_pb("a")]),
                "not in increasing id order",
            ),
            (
                Box::new(|d| d.removed_clusters = vec!["c".into(), "a".into()]),
                "not in increasing id order",
            ),
            (
                Box::new(|d| {
                    d.fallbacks = vec![pb::ClassFallback {
                        traffic_class: "web".into(),
                        clusters: vec!["a".into()],
                    }]
                }),
                "`sections.fallbacks` is not set",
            ),
            (
                Box::new(|d| d.default_class = "video".into()),
                "`sections.class_rules` is not set",
            ),
            (
                Box::new(|d| {
                    d.full = true;
                    d.base_version = 0;
                }),
                "a full map carries every section",
            ),
        ];
        for (break_it, want) in cases {
            let mut bad = good.clone();
            break_it(&mut bad);
            let e = f.apply(bad).expect_err(want);
            assert!(e.to_string().contains(want), "{e} (wanted {want:?})");
            assert_eq!(f.identity(), (1, 1));
            assert_eq!(*f.held().expect("held").map, m);
        }
        assert_eq!(f.apply(good), Ok(Applied::New));
        assert_eq!(*f.held().expect("held").map, next);
    }

    /// One random round's edits of `map` and `side`: units moved, clusters gained, lost,
    /// drained or brought back, fallbacks, policies, loads, rules, the default class and
    /// last resorts changed, each now and then.
    fn random_round(rng: &mut ChaCha8Rng, m: &ServingMap, side: &mut Side) -> ServingMap {
        const POOL: [&str; 5] = ["a", "b", "c", "d", "e"];
        const STATES: [ClusterState; 3] =
            [ClusterState::Up, ClusterState::Drained, ClusterState::Down];
        let mut clusters: Vec<ServingCluster> = m.clusters().to_vec();
        if rng.random_bool(0.3) {
            let mut ids: Vec<&str> = POOL
                .iter()
                .copied()
                .filter(|_| rng.random_bool(0.7))
                .collect();
            if ids.len() < 2 {
                ids = vec!["a", "c"];
            }
            clusters = ids
                .into_iter()
                .map(|id| {
                    m.clusters()
                        .iter()
                        .find(|c| c.id == id)
                        .cloned()
                        .unwrap_or_else(|| cluster(id, ClusterState::Up))
                })
                .collect();
        }
        for c in &mut clusters {
            if rng.random_bool(0.15) {
                c.state = STATES[rng.random_range(0..3)];
            }
            if rng.random_bool(0.05) {
                c.addresses
                    .push(IpAddr::from([192, 0, 2, rng.random_range(2..250)]));
            }
        }
        let n = clusters.len() as ClusterIdx;
        let mut fallback = [[Some(0), Some(1)], [Some(1), None]];
        if rng.random_bool(0.3) {
            let a = rng.random_range(0..n);
            fallback = [[Some(a), None], [Some((a + 1) % n), Some(a)]];
        }
        let next = edited(rng, m, clusters, 0.05, &fallback);
        let pick = |rng: &mut ChaCha8Rng| match rng.random_range(0..3) {
            0 => Policy::Consistent { vnodes: 100 },
            1 => Policy::PowerOfD { vnodes: 10, d: 2 },
            _ => Policy::BoundedLoads {
                vnodes: 20,
                c: 1.25,
            },
        };
        if rng.random_bool(0.2) {
            let i = rng.random_range(0..side.policies.len());
            side.policies[i] = pick(rng);
        }
        for c in next.clusters() {
            for &a in &c.addresses {
                if rng.random_bool(0.3) {
                    side.loads
                        .insert((c.id.clone(), a), f64::from(rng.random_range(0..4u8)) / 4.0);
                }
            }
        }
        if rng.random_bool(0.15) {
            side.rules = match rng.random_range(0..4) {
                0 => Vec::new(),
                1 => vec![("*.video.example".into(), "video".into())],
                // A class the map has no unit of: a front end numbers it after the map's.
                2 => vec![("*.apps.example".into(), "apps".into())],
                _ => vec![
                    ("www.example".into(), "web".into()),
                    ("*.v.example".into(), "video".into()),
                ],
            };
        }
        if rng.random_bool(0.1) {
            side.default_class = ["web", "video"][rng.random_range(0..2)].into();
        }
        if rng.random_bool(0.15) {
            side.bypass = if rng.random_bool(0.5) {
                Vec::new()
            } else {
                bypass_parts()
            };
        }
        next
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// A front end following a seeded random run of rounds with deltas of the changed
        /// sections holds, after each, what a new front end given the map whole holds (map
        /// and extras), and the stream's sections are those of that full map.
        #[test]
        fn deltas_of_changed_sections_follow_like_full_maps(seed in 0u64..1_000_000, rounds in 1usize..12) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut side = Side::base();
            let mut m = map(&mut rng, 200, &["a", "b", "c"]);
            let (held, mut sections) = side.full(&m, id(3, 1));
            let mut f = Follower::holding(held);
            for v in 2..2 + rounds as u64 {
                let next = random_round(&mut rng, &m, &mut side);
                let d = side
                    .with(|e| delta_for(e, Some(&mut sections), id(3, v - 1), &m, id(3, v), &next))
                    .expect("a small delta");
                proptest::prop_assert!(d.sections.is_some());
                proptest::prop_assert_eq!(f.apply(d), Ok(Applied::New), "round {}", v);
                let (fresh, fresh_sections) = side.full(&next, id(3, v));
                let held = f.held().expect("held");
                proptest::prop_assert_eq!(&*held.map, &*fresh.map, "round {}", v);
                proptest::prop_assert_eq!(&held.extras, &fresh.extras, "round {}", v);
                proptest::prop_assert_eq!(&sections, &fresh_sections, "round {}", v);
                m = next;
            }
        }
    }

    proptest::proptest! {
        /// Any columns at all (a valid message with random bytes written over it, random
        /// lengths): applied or refused, never a panic; a refusal leaves the map held.
        #[test]
        fn mangled_columns_never_panic(
            seed in 0u64..1_000,
            edits in proptest::collection::vec((0usize..11, 0usize..64, proptest::prelude::any::<u32>()), 1..6),
        ) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let m = map(&mut rng, 64, &["a", "b", "c"]);
            let mut f = Follower::default();
            send_full(&mut f, &m, id(1, 1));
            let mut msg = with_edge(|e| full_part(e, id(1, 2), &m, 0));
            let c = msg.columns.as_mut().expect("columns");
            for (column, at, value) in edits {
                let words: &mut Vec<u32> = match column {
                    0 => &mut c.id_lengths,
                    1 => &mut c.classes,
                    2 => &mut c.prefix_counts,
                    3 => &mut c.placements,
                    4 => &mut c.share_clusters,
                    5 => &mut c.overflow_units,
                    6 => &mut c.backups,
                    7 => {
                        let i = at % c.ids.len().max(1);
                        if let Some(b) = c.ids.get_mut(i) { *b = value as u8 }
                        continue;
                    }
                    8 => {
                        let i = at % c.prefixes.len().max(1);
                        if let Some(b) = c.prefixes.get_mut(i) { *b = value as u8 }
                        continue;
                    }
                    9 => {
                        c.shares.push(f64::from_bits(u64::from(value) << 32));
                        continue;
                    }
                    _ => {
                        c.prefixes.truncate(at);
                        continue;
                    }
                };
                if value % 7 == 0 {
                    words.truncate(at);
                } else if let Some(w) = {
                    let i = at % words.len().max(1);
                    words.get_mut(i)
                } {
                    *w = value % 1024;
                }
            }
            if f.apply(msg).is_err() {
                proptest::prop_assert_eq!(f.identity(), (1, 1));
                proptest::prop_assert_eq!(&*f.held().expect("held").map, &m);
            }
        }
    }
}
