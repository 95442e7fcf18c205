//! The serving map: one map version as answering needs it, and nothing more. For each map unit
//! (in id order): its id, class and prefixes, the shares of its demand placed per cluster (in
//! the unit's preference order), its overflow share and its two backup clusters; for each cluster
//! (in id order): its id, addresses and state; per class, the two fallback clusters.
//!
//! The mapper builds it from a solution ([`ServingMap::of_solution`]); a front end builds it
//! from the WatchMap stream ([`crate::watch`]). Both then index it with the same
//! [`crate::resolve::Resolver`], so they answer every query alike by construction, and a front
//! end holds this instead of an instance with resource trees and candidate lists.
//!
//! Units are columns (one string arena for the ids, offsets for the variable parts), so a map
//! of 10 M units is a few dozen allocations, not tens of millions. The columns saying which
//! units there are (ids, classes, prefixes) are shared with the previous map when they are
//! equal ([`ServingMap::of_solution_after`]): they change only when the topology's units do,
//! and sharing them makes "the same units as before" one pointer comparison for the resolver,
//! which then keeps its prefix index ([`crate::resolve::Resolver::new_after`]).

use std::net::IpAddr;
use std::sync::Arc;

use cdnmap_mapper::model::{ClassIdx, ClusterIdx, ClusterState, Instance, UnitIdx};
use cdnmap_mapper::Map;
use cdnmap_topology::Topology;
use ipnet::IpNet;

/// No cluster (a unit without a backup).
const NONE: ClusterIdx = ClusterIdx::MAX;

/// A share may exceed 1 by this much (rounding in the division that made it).
pub const SHARE_SLACK: f64 = 1e-9;

/// Why a serving map could not be built or indexed: the input named.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error(
        "map unit {id:?} comes after {previous:?}: units must be in strictly increasing id order"
    )]
    UnitOrder { id: String, previous: String },
    #[error(
        "cluster {id:?} comes after {previous:?}: clusters must be in strictly increasing id order"
    )]
    ClusterOrder { id: String, previous: String },
    #[error("map unit {id:?}: {problem}")]
    Unit { id: String, problem: String },
    #[error("the map has {map_units} map units but the instance has {instance_units}")]
    MapShape {
        map_units: usize,
        instance_units: usize,
    },
    #[error("prefix {prefix} is claimed by two map units of one class, {first:?} and {second:?}")]
    PrefixClaimedTwice {
        prefix: String,
        first: String,
        second: String,
    },
    #[error("{what}: {count}, at most {limit}")]
    TooMany {
        what: &'static str,
        count: usize,
        limit: usize,
    },
}

/// A cluster as answering needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServingCluster {
    pub id: String,
    pub addresses: Vec<IpAddr>,
    pub state: ClusterState,
}

impl ServingCluster {
    /// The clusters of `topology`, by cluster index.
    pub fn of_topology(topology: &Topology) -> Vec<ServingCluster> {
        topology
            .instance
            .clusters()
            .iter()
            .enumerate()
            .map(|(ci, c)| ServingCluster {
                id: c.id.clone(),
                addresses: topology.cluster_addresses(ci as ClusterIdx).to_vec(),
                state: c.state,
            })
            .collect()
    }

    pub fn is_up(&self) -> bool {
        self.state == ClusterState::Up
    }
}

/// One map version, for answering.
#[derive(Debug, Clone, PartialEq)]
pub struct ServingMap {
    classes: Vec<Arc<str>>,
    clusters: Vec<ServingCluster>,
    units: Units,
    fallback: Vec<[Option<ClusterIdx>; 2]>,
    source: Source,
}

/// The topology a serving map's units were taken from, on the mapper's side (`None` for a map
/// built from WatchMap): it lets the next round see "the same units" with two pointer
/// comparisons instead of comparing every unit's id and prefixes. Not part of the map's
/// value: two maps of the same contents are equal wherever they were built.
#[derive(Clone, Default)]
struct Source(Option<Topology>);

impl PartialEq for Source {
    fn eq(&self, _: &Source) -> bool {
        true
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Source(topology)"
        } else {
            "Source(none)"
        })
    }
}

/// The unit columns, in strictly increasing id order.
#[derive(Debug, Clone, Default, PartialEq)]
struct Units {
    keys: Arc<UnitKeys>,
    share_end: Vec<u32>,
    share_cluster: Vec<ClusterIdx>,
    /// The shares of the units whose placement is not one whole share (most units' is: their
    /// demand sits at one cluster, and a share of exactly 1.0 is not stored; at 11 M units,
    /// 88 MB less per map version), one after the other in unit order.
    share: Vec<f64>,
    /// Those units, with the position of their first share in `share`.
    split: Sparse<u32>,
    /// The units whose overflow share is not +0.0 (most have none), with it.
    overflow: Sparse<f64>,
    backup: Vec<[ClusterIdx; 2]>,
    /// The units with a companion (go with the winner: the cluster their answers name second,
    /// [`cdnmap_mapper::companion`]), with it and the share of the unit's demand reserved there.
    companion: Sparse<(ClusterIdx, f64)>,
}

/// The shares of a unit placed whole at one cluster.
const WHOLE: [f64; 1] = [1.0];

impl Units {
    /// The placement of the unit about to be placed (the next after `share_end`'s), whose
    /// clusters `share_cluster` ends with and whose shares `share` ends with from `start`: a
    /// whole share is taken back out of `share`.
    fn end_placement(&mut self, start: usize, overflow: f64, companion: Option<(ClusterIdx, f64)>) {
        let at = self.share_end.len();
        let whole = match &self.share[start..] {
            [] => true,
            [one] => one.to_bits() == WHOLE[0].to_bits(),
            _ => false,
        };
        if whole {
            self.share.truncate(start);
        }
        self.split.push(at, (!whole).then_some(start as u32));
        self.overflow
            .push(at, (overflow.to_bits() != 0).then_some(overflow));
        self.companion.push(at, companion);
        self.share_end.push(self.share_cluster.len() as u32);
    }
}

/// A value some units have (most have none), by unit: one bit a unit says whether it has one
/// (so a unit without is known in one read), and the values of those that have one are kept
/// in unit order, found by a binary search.
#[derive(Debug, Clone, Default, PartialEq)]
struct Sparse<T> {
    bits: Vec<u64>,
    values: Vec<(UnitIdx, T)>,
}

impl<T: Copy> Sparse<T> {
    /// Unit `at`'s value: units are pushed in order, every one of them.
    fn push(&mut self, at: usize, value: Option<T>) {
        if at.is_multiple_of(64) {
            self.bits.push(0);
        }
        if let Some(v) = value {
            self.values.push((at as UnitIdx, v));
            if let Some(w) = self.bits.last_mut() {
                *w |= 1 << (at % 64);
            }
        }
    }

    fn get(&self, u: UnitIdx) -> Option<T> {
        let bit = self
            .bits
            .get(u as usize / 64)
            .is_some_and(|w| w >> (u % 64) & 1 == 1);
        if !bit {
            return None;
        }
        let v = &self.values;
        v.binary_search_by_key(&u, |&(w, _)| w).ok().map(|i| v[i].1)
    }

    fn reserve(&mut self, units: usize, exact: bool) {
        if exact {
            self.bits.reserve_exact(units / 64 + 1);
        } else {
            self.bits.reserve(units / 64 + 1);
        }
    }

    fn heap_bytes(&self) -> usize {
        8 * self.bits.capacity() + std::mem::size_of::<(UnitIdx, T)>() * self.values.capacity()
    }
}

/// Which units there are: ids, classes and (truncated) prefixes, everything a prefix index
/// depends on and nothing that a round's map changes. Behind an `Arc` so that successive maps
/// of the same units hold one copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct UnitKeys {
    id_text: String,
    id_end: Vec<u32>,
    class: Vec<ClassIdx>,
    prefix_end: Vec<u32>,
    prefixes: PrefixColumn,
}

impl UnitKeys {
    /// The keys of the first `n` units.
    fn first(&self, n: usize) -> UnitKeys {
        let ids = n.checked_sub(1).map_or(0, |l| self.id_end[l] as usize);
        let prefixes = n.checked_sub(1).map_or(0, |l| self.prefix_end[l] as usize);
        let words = self.prefixes.words[..prefixes].to_vec();
        let v6 = words.iter().filter(|&&w| w & V6 != 0).count();
        UnitKeys {
            id_text: self.id_text[..ids].to_string(),
            id_end: self.id_end[..n].to_vec(),
            class: self.class[..n].to_vec(),
            prefix_end: self.prefix_end[..n].to_vec(),
            prefixes: PrefixColumn {
                words,
                v6: self.prefixes.v6[..v6].to_vec(),
            },
        }
    }
}

/// A map's unit keys (ids, classes, prefixes) held apart from the map version: every version
/// of the same units shares them, so holding this holds no version's placements.
#[derive(Debug, Clone)]
pub struct UnitKeysRef(Arc<UnitKeys>);

impl UnitKeysRef {
    /// The positions of unit `u`'s prefixes among all units' (as
    /// [`ServingMap::unit_prefix_positions`]).
    pub(crate) fn prefix_positions(&self, u: UnitIdx) -> std::ops::Range<usize> {
        ServingMap::range(&self.0.prefix_end, u)
    }

    /// The prefix at position `at` (truncated).
    pub(crate) fn prefix(&self, at: usize) -> IpNet {
        self.0.prefixes.get(at)
    }
}

/// Prefixes (truncated) in 8 bytes each where an `IpNet` takes 18: an IPv4 prefix as its
/// address and length in one word, an IPv6 prefix as the position of its `IpNet` in a side
/// column (most client prefixes are IPv4 /24s: at 11 M map units, 110 MB less per copy of
/// the units).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PrefixColumn {
    /// IPv4: `address << 8 | length`; IPv6: [`V6`] and the position in `v6`.
    words: Vec<u64>,
    v6: Vec<IpNet>,
}

/// The bit of a [`PrefixColumn`] word that says "IPv6, by position".
const V6: u64 = 1 << 63;

impl PrefixColumn {
    fn len(&self) -> usize {
        self.words.len()
    }

    fn push(&mut self, p: &IpNet) {
        match p.trunc() {
            IpNet::V4(n) => self
                .words
                .push(u64::from(u32::from(n.network())) << 8 | u64::from(n.prefix_len())),
            v6 => {
                self.words.push(V6 | self.v6.len() as u64);
                self.v6.push(v6);
            }
        }
    }

    fn get(&self, i: usize) -> IpNet {
        let w = self.words[i];
        if w & V6 != 0 {
            return self.v6[(w & !V6) as usize];
        }
        let (addr, len) = ((w >> 8) as u32, (w & 0xff) as u8);
        // Pushed from a valid prefix: the length is at most 32.
        IpNet::V4(ipnet::Ipv4Net::new(addr.into(), len).unwrap_or_default())
    }

    fn reserve(&mut self, n: usize, exact: bool) {
        if exact {
            self.words.reserve_exact(n);
        } else {
            self.words.reserve(n);
        }
    }

    fn heap_bytes(&self) -> usize {
        8 * self.words.capacity() + std::mem::size_of::<IpNet>() * self.v6.capacity()
    }
}

/// A unit's prefixes, read out of a [`PrefixColumn`].
#[derive(Debug, Clone)]
pub struct Prefixes<'a> {
    column: &'a PrefixColumn,
    at: std::ops::Range<usize>,
}

impl Iterator for Prefixes<'_> {
    type Item = IpNet;

    fn next(&mut self) -> Option<IpNet> {
        self.at.next().map(|i| self.column.get(i))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.at.size_hint()
    }
}

impl ExactSizeIterator for Prefixes<'_> {}

/// How much a map holds, column by column (to reserve room for a map about to be built).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    pub units: usize,
    pub id_bytes: usize,
    pub prefixes: usize,
    pub shares: usize,
}

impl std::ops::Add for Sizes {
    type Output = Sizes;
    fn add(self, o: Sizes) -> Sizes {
        Sizes {
            units: self.units + o.units,
            id_bytes: self.id_bytes + o.id_bytes,
            prefixes: self.prefixes + o.prefixes,
            shares: self.shares + o.shares,
        }
    }
}

/// The error of a column that would pass [`MAX_COLUMN`].
fn column_full() -> ServeError {
    ServeError::TooMany {
        what: "entries in one column of the serving map",
        count: MAX_COLUMN + 1,
        limit: MAX_COLUMN,
    }
}

/// Builds a [`ServingMap`] unit by unit, in id order, checking each as it comes.
#[derive(Debug)]
pub struct Builder {
    map: ServingMap,
    /// While the units pushed are, in order, those of the map whose unit keys the map being
    /// built holds ([`Self::expect_units_of`]), how many have been: their keys are not copied.
    /// `None`: the keys are the map's own, every unit pushed.
    repeating: Option<usize>,
    /// The companion of the next unit pushed ([`Self::companion_of_next`]).
    next_companion: Option<(ClusterIdx, f64)>,
}

/// Most bytes of unit ids, prefixes or shares one serving map holds (offsets are `u32`).
pub const MAX_COLUMN: usize = u32::MAX as usize;

impl Builder {
    /// An empty map over `classes` (by class index) and `clusters` (in strictly increasing id
    /// order: cluster index = position).
    pub fn new(
        classes: Vec<Arc<str>>,
        clusters: Vec<ServingCluster>,
    ) -> Result<Builder, ServeError> {
        for w in clusters.windows(2) {
            if w[0].id >= w[1].id {
                return Err(ServeError::ClusterOrder {
                    id: w[1].id.clone(),
                    previous: w[0].id.clone(),
                });
            }
        }
        if classes.len() > usize::from(ClassIdx::MAX) + 1 {
            return Err(ServeError::TooMany {
                what: "traffic classes",
                count: classes.len(),
                limit: usize::from(ClassIdx::MAX) + 1,
            });
        }
        let fallback = vec![[None, None]; classes.len()];
        Ok(Builder {
            map: ServingMap {
                classes,
                clusters,
                units: Units::default(),
                fallback,
                source: Source::default(),
            },
            repeating: None,
            next_companion: None,
        })
    }

    /// Gives the next unit pushed ([`Self::push`], [`Self::push_placement_of`]) a companion:
    /// the cluster its answers name second and the share of its demand reserved there (in
    /// (0, 0.5]; not one of the unit's shares' clusters, which the push checks).
    pub fn companion_of_next(&mut self, cluster: ClusterIdx, share: f64) {
        self.next_companion = Some((cluster, share));
    }

    /// Expects the units about to be pushed to be `old`'s (ids, classes, prefixes, in order;
    /// `old`'s classes must be this map's): as long as they are, their keys are `old`'s,
    /// shared, not copied, and a map of exactly `old`'s units shares them
    /// ([`ServingMap::shares_units_with`]: a front end taking a whole map again, of the units
    /// it holds, holds them once and keeps its prefix index). From the first unit that differs
    /// the map has keys of its own, as without. Nothing for a builder with a unit already, or
    /// other classes.
    pub fn expect_units_of(&mut self, old: &ServingMap) {
        if self.unit_count() == 0 && old.classes == self.map.classes {
            self.map.units.keys = Arc::clone(&old.units.keys);
            self.repeating = Some(0);
        }
    }

    /// Whether the next unit expected ([`Self::expect_units_of`]) is this one.
    fn is_expected(
        &self,
        id: &str,
        class: ClassIdx,
        prefixes: impl Iterator<Item = IpNet>,
    ) -> bool {
        let (Some(u), k) = (self.repeating, &self.map.units.keys) else {
            return false;
        };
        if u >= k.class.len() {
            return false;
        }
        let u = u as UnitIdx;
        let at = ServingMap::range(&k.prefix_end, u);
        self.map.unit_id(u) == id
            && k.class[u as usize] == class
            && prefixes
                .map(|p| p.trunc())
                .eq(at.map(|i| k.prefixes.get(i)))
    }

    /// Gives up the expected units' keys: the map keeps its own copy of those pushed so far.
    fn stop_repeating(&mut self) {
        if let Some(n) = self.repeating.take() {
            let keys = self.map.units.keys.first(n);
            self.map.units.keys = Arc::new(keys);
        }
    }

    /// Reserves room for `more` (exactly: a map of a million units grown by doubling would
    /// hold up to twice its size).
    pub fn reserve(&mut self, more: Sizes) {
        self.make_room(more, true);
    }

    /// Makes room for `more`, growing by doubling (no copy when there is room already, as
    /// after [`Self::reserve`] with a good guess).
    pub fn grow(&mut self, more: Sizes) {
        self.make_room(more, false);
    }

    fn make_room(&mut self, more: Sizes, exact: bool) {
        fn room<T>(v: &mut Vec<T>, n: usize, exact: bool) {
            if exact {
                v.reserve_exact(n);
            } else {
                v.reserve(n);
            }
        }
        let u = &mut self.map.units;
        // Keys shared with another map are complete: never grown (nor copied to be).
        if let Some(k) = Arc::get_mut(&mut u.keys) {
            if exact {
                k.id_text.reserve_exact(more.id_bytes);
            } else {
                k.id_text.reserve(more.id_bytes);
            }
            room(&mut k.id_end, more.units, exact);
            room(&mut k.prefix_end, more.units, exact);
            room(&mut k.class, more.units, exact);
            k.prefixes.reserve(more.prefixes, exact);
        }
        room(&mut u.share_end, more.units, exact);
        u.split.reserve(more.units, exact);
        u.overflow.reserve(more.units, exact);
        u.companion.reserve(more.units, exact);
        room(&mut u.backup, more.units, exact);
        room(&mut u.share_cluster, more.shares, exact);
    }

    pub fn unit_count(&self) -> usize {
        self.repeating
            .unwrap_or_else(|| self.map.units.keys.class.len())
    }

    /// The id of the last unit pushed.
    pub fn last_id(&self) -> Option<&str> {
        let n = self.unit_count();
        (n > 0).then(|| self.map.unit_id((n - 1) as UnitIdx))
    }

    /// Appends a unit: its id must follow the last one's; `shares` are (cluster, share of its
    /// demand) in the unit's preference order, each in (0, 1], distinct clusters; `overflow`
    /// in [0, 1].
    pub fn push(
        &mut self,
        id: &str,
        class: ClassIdx,
        prefixes: impl IntoIterator<Item = IpNet, IntoIter: ExactSizeIterator + Clone>,
        shares: impl IntoIterator<Item = (ClusterIdx, f64)>,
        overflow: f64,
        backups: [Option<ClusterIdx>; 2],
    ) -> Result<(), ServeError> {
        let prefixes = prefixes.into_iter();
        if let Some(previous) = self.last_id() {
            if previous >= id {
                return Err(ServeError::UnitOrder {
                    id: id.to_string(),
                    previous: previous.to_string(),
                });
            }
        }
        if usize::from(class) >= self.map.classes.len() {
            return Err(ServeError::Unit {
                id: id.to_string(),
                problem: format!("class index {class} of {}", self.map.classes.len()),
            });
        }
        if let Some(n) = self.repeating {
            if self.is_expected(id, class, prefixes.clone()) {
                self.push_placement(id, (0, 0), shares, overflow, backups)?;
                self.repeating = Some(n + 1);
                return Ok(());
            }
            self.stop_repeating();
        }
        self.push_placement(id, (id.len(), prefixes.len()), shares, overflow, backups)?;
        let k = Arc::make_mut(&mut self.map.units.keys);
        k.id_text.push_str(id);
        k.id_end.push(k.id_text.len() as u32);
        k.class.push(class);
        for p in prefixes {
            k.prefixes.push(&p);
        }
        k.prefix_end.push(k.prefixes.len() as u32);
        Ok(())
    }

    /// Checks and appends the placement of unit `id` (its shares, overflow and backups, as
    /// [`Self::push`] takes them), all or nothing; `more_keys` (id bytes, prefixes) are about to
    /// be appended to the key columns and must fit too.
    fn push_placement(
        &mut self,
        id: &str,
        more_keys: (usize, usize),
        shares: impl IntoIterator<Item = (ClusterIdx, f64)>,
        overflow: f64,
        backups: [Option<ClusterIdx>; 2],
    ) -> Result<(), ServeError> {
        let bad = |problem: String| ServeError::Unit {
            id: id.to_string(),
            problem,
        };
        let companion = self.next_companion.take();
        let clusters = self.map.clusters.len();
        let cluster_ok = |c: ClusterIdx| (c as usize) < clusters;
        if let Some((c, share)) = companion {
            let most = cdnmap_mapper::model::MAX_COMPANION_SHARE + SHARE_SLACK;
            if !cluster_ok(c) {
                return Err(bad(format!("companion cluster index {c} of {clusters}")));
            }
            if !(share.is_finite() && share > 0.0 && share <= most) {
                return Err(bad(format!("companion share {share} is not in (0, 0.5]")));
            }
        }
        if !(overflow.is_finite() && (0.0..=1.0 + SHARE_SLACK).contains(&overflow)) {
            return Err(bad(format!("overflow share {overflow} is not in [0, 1]")));
        }
        for b in backups.into_iter().flatten() {
            if !cluster_ok(b) {
                return Err(bad(format!("backup cluster index {b} of {clusters}")));
            }
        }
        if backups[1].is_some() && (backups[0].is_none() || backups[0] == backups[1]) {
            return Err(bad(
                "a second backup cluster without a distinct first".into()
            ));
        }
        let u = &mut self.map.units;
        let (start, share_start) = (u.share_cluster.len(), u.share.len());
        for (c, s) in shares {
            let problem = if !cluster_ok(c) {
                Some(format!("cluster index {c} of {clusters}"))
            } else if !(s.is_finite() && s > 0.0 && s <= 1.0 + SHARE_SLACK) {
                Some(format!("share {s} is not in (0, 1]"))
            } else if u.share_cluster[start..].contains(&c) {
                Some(format!("cluster index {c} holds two shares"))
            } else if companion.is_some_and(|(k, _)| k == c) {
                Some(format!(
                    "cluster index {c} is its companion and holds a share"
                ))
            } else {
                None
            };
            if let Some(problem) = problem {
                u.share_cluster.truncate(start);
                u.share.truncate(share_start);
                return Err(bad(problem));
            }
            u.share_cluster.push(c);
            u.share.push(s);
        }
        let too_big = u.keys.id_text.len() + more_keys.0 > MAX_COLUMN
            || u.keys.prefixes.len() + more_keys.1 > MAX_COLUMN
            || u.share_cluster.len() > MAX_COLUMN;
        if too_big {
            u.share_cluster.truncate(start);
            u.share.truncate(share_start);
            return Err(column_full());
        }
        u.end_placement(share_start, overflow, companion);
        u.backup
            .push([backups[0].unwrap_or(NONE), backups[1].unwrap_or(NONE)]);
        Ok(())
    }

    /// Makes the map being built one of exactly `old`'s units (ids, classes, prefixes: shared,
    /// not copied; `old`'s classes must be this map's): the placements are then appended unit
    /// by unit in `old`'s order ([`Self::push_placement_of`], [`Self::copy_placement`]), every
    /// one of them before [`Self::finish_placements`]. Only for a builder with no unit yet.
    pub fn share_units_of(&mut self, old: &ServingMap) -> Result<(), ServeError> {
        if self.unit_count() != 0 || old.classes != self.map.classes {
            return Err(ServeError::Unit {
                id: self.last_id().unwrap_or_default().to_string(),
                problem: format!(
                    "a map sharing another's {} units must start empty, with its classes",
                    old.unit_count()
                ),
            });
        }
        self.map.units.keys = Arc::clone(&old.units.keys);
        self.repeating = None;
        Ok(())
    }

    /// The next unit's placement (after [`Self::share_units_of`]), checked as [`Self::push`]
    /// checks it.
    pub fn push_placement_of(
        &mut self,
        shares: impl IntoIterator<Item = (ClusterIdx, f64)>,
        overflow: f64,
        backups: [Option<ClusterIdx>; 2],
    ) -> Result<(), ServeError> {
        let u = self.map.units.share_end.len() as UnitIdx;
        let id = self.next_shared_id(u)?;
        self.push_placement(&id, (0, 0), shares, overflow, backups)
    }

    /// The id of shared unit `u`, the next to be placed (an error when all are).
    fn next_shared_id(&self, u: UnitIdx) -> Result<String, ServeError> {
        if (u as usize) < self.unit_count() {
            Ok(self.map.unit_id(u).to_string())
        } else {
            Err(ServeError::Unit {
                id: u.to_string(),
                problem: format!("one placement more than the {} units", self.unit_count()),
            })
        }
    }

    /// Copies the placement of `old`'s unit `u` as the next unit's (after
    /// [`Self::share_units_of`]: `u` is that unit), its clusters renumbered by `cluster_map`
    /// (old index to new; `None`: the cluster is gone, an error). `old` checked it when it was
    /// pushed, so only the renumbering is checked here.
    pub fn copy_placement(
        &mut self,
        old: &ServingMap,
        u: UnitIdx,
        cluster_map: &[Option<ClusterIdx>],
    ) -> Result<(), ServeError> {
        let at = self.map.units.share_end.len() as UnitIdx;
        if at != u || !Arc::ptr_eq(&self.map.units.keys, &old.units.keys) {
            return Err(ServeError::Unit {
                id: old.unit_id(u).to_string(),
                problem: format!("copied as unit {at} of a map not sharing its units"),
            });
        }
        let gone = |what: &str| ServeError::Unit {
            id: old.unit_id(u).to_string(),
            problem: format!("its {what} is gone"),
        };
        let renumber = |c: ClusterIdx| -> Result<ClusterIdx, ServeError> {
            cluster_map
                .get(c as usize)
                .copied()
                .flatten()
                .ok_or_else(|| gone("cluster"))
        };
        let (clusters, shares) = old.shares(u);
        let [b0, b1] = old.units.backup[u as usize];
        let backup = [
            if b0 == NONE { NONE } else { renumber(b0)? },
            if b1 == NONE { NONE } else { renumber(b1)? },
        ];
        let companion = match old.companion(u) {
            Some((c, share)) => Some((renumber(c)?, share)),
            None => None,
        };
        let units = &mut self.map.units;
        let (start, share_start) = (units.share_cluster.len(), units.share.len());
        for &c in clusters {
            match renumber(c) {
                Ok(c) => units.share_cluster.push(c),
                Err(e) => {
                    units.share_cluster.truncate(start);
                    return Err(e);
                }
            }
        }
        if units.share_cluster.len() > MAX_COLUMN {
            units.share_cluster.truncate(start);
            return Err(column_full());
        }
        units.share.extend_from_slice(shares);
        units.end_placement(share_start, old.overflow(u), companion);
        units.backup.push(backup);
        Ok(())
    }

    /// The map of shared units ([`Self::share_units_of`]) once every unit has its placement;
    /// an error naming the first unit without one otherwise.
    pub fn finish_placements(self) -> Result<ServingMap, ServeError> {
        let placed = self.map.units.share_end.len();
        if placed != self.unit_count() {
            return Err(ServeError::Unit {
                id: self.next_shared_id(placed as UnitIdx)?,
                problem: "it has no placement".into(),
            });
        }
        Ok(self.map)
    }

    /// The cluster with this id.
    pub fn cluster_index(&self, id: &str) -> Option<ClusterIdx> {
        self.map.cluster_index(id)
    }

    /// Sets each class's two fallback clusters (by class index; missing ones none, and so
    /// are indices past the clusters).
    pub fn set_fallback(&mut self, fallback: &[[Option<ClusterIdx>; 2]]) {
        let clusters = self.map.clusters.len();
        for (k, f) in self.map.fallback.iter_mut().enumerate() {
            if let Some(&[a, b]) = fallback.get(k) {
                let ok = |c: Option<ClusterIdx>| c.filter(|&c| (c as usize) < clusters);
                *f = [ok(a), ok(b)];
            }
        }
    }

    /// The map.
    pub fn finish(mut self) -> ServingMap {
        // Fewer units than expected: the map's keys are those of its own.
        if self
            .repeating
            .is_some_and(|n| n < self.map.units.keys.class.len())
        {
            self.stop_repeating();
        }
        self.map
    }
}

impl ServingMap {
    /// The serving map of `map`, a map of `topology`'s instance: shares by [`cdnmap_mapper::map::share`]
    /// (the one definition), each unit's backups its two best up candidates outside its
    /// placements,
    /// each class's fallbacks the two up clusters serving it with the most room.
    pub fn of_solution(topology: &Topology, map: &Map) -> Result<ServingMap, ServeError> {
        Self::of_solution_after(topology, map, None)
    }

    /// [`Self::of_solution`], sharing the unit ids, classes and prefixes with `previous` (the
    /// serving map of the round before) when `topology` has exactly those: the usual round,
    /// where only demand and the map changed. Those columns are then not copied again, and
    /// the resolver sees the same units with one pointer comparison.
    pub fn of_solution_after(
        topology: &Topology,
        map: &Map,
        previous: Option<&ServingMap>,
    ) -> Result<ServingMap, ServeError> {
        let instance = &topology.instance;
        if map.unit_count() != instance.unit_count() {
            return Err(ServeError::MapShape {
                map_units: map.unit_count(),
                instance_units: instance.unit_count(),
            });
        }
        let classes = instance
            .classes()
            .iter()
            .map(|c| Arc::from(c.name.as_str()))
            .collect();
        let clusters = ServingCluster::of_topology(topology);
        let up: Vec<bool> = clusters.iter().map(ServingCluster::is_up).collect();
        let mut b = Builder::new(classes, clusters)?;
        let units = instance.unit_count() as UnitIdx;
        let shared = previous.filter(|p| p.has_units_of(topology));
        let mut sizes = Sizes {
            units: units as usize,
            shares: map.allocation_count(),
            ..Sizes::default()
        };
        match shared {
            Some(p) => b.map.units.keys = Arc::clone(&p.units.keys),
            None => {
                sizes.id_bytes = (0..units).map(|u| instance.unit_id(u).len()).sum();
                sizes.prefixes = topology.addressing.prefix_count();
            }
        }
        b.reserve(sizes);
        // A unit placed at the clusters it was placed at before, over the same candidates and
        // with the clusters up alike, has the backups it had: only the others' candidates are
        // read (at 11 M map units, a fifth of the build read them all).
        let backups_before = shared.filter(|p| {
            p.source
                .0
                .as_ref()
                .is_some_and(|s| s.instance.shares_candidates(instance))
                && p.clusters.len() == up.len()
                && p.clusters.iter().zip(&up).all(|(c, &u)| c.is_up() == u)
        });
        let mut placed = Vec::new();
        for u in 0..instance.unit_count() as UnitIdx {
            placed.clear();
            placed.extend(cdnmap_mapper::map::unit_shares(instance, map, u));
            let companion = map.companion(u).map(|a| {
                let share = cdnmap_mapper::map::share(a.amount, instance.unit_demand(u));
                (a.cluster, share)
            });
            let overflow = cdnmap_mapper::map::share(map.overflow(u), instance.unit_demand(u));
            let before = backups_before.filter(|p| {
                let was = p.shares(u).0;
                was.len() == placed.len() && was.iter().zip(&placed).all(|(&a, &(b, _))| a == b)
            });
            let backups = match before {
                Some(p) => p.backups(u),
                None => {
                    let mut outside = instance
                        .candidates(u)
                        .map(|c| c.cluster)
                        .filter(|&c| up[c as usize] && !placed.iter().any(|&(p, _)| p == c));
                    [outside.next(), outside.next()]
                }
            };
            if let Some((c, share)) = companion.filter(|&(_, share)| share > 0.0) {
                b.companion_of_next(c, share);
            }
            if shared.is_some() {
                // Unit `u`'s keys are there already (and were checked when first pushed).
                let id = instance.unit_id(u);
                b.push_placement(id, (0, 0), placed.iter().copied(), overflow, backups)?;
            } else {
                b.push(
                    instance.unit_id(u),
                    instance.unit_class(u),
                    topology.unit_prefixes(u).iter().copied(),
                    placed.iter().copied(),
                    overflow,
                    backups,
                )?;
            }
        }
        b.set_fallback(&fallbacks(instance, map));
        b.map.source = Source(Some(topology.clone()));
        Ok(b.finish())
    }

    /// Class names by class index.
    pub fn classes(&self) -> &[Arc<str>] {
        &self.classes
    }

    pub fn class_index(&self, name: &str) -> Option<ClassIdx> {
        self.classes
            .iter()
            .position(|c| &**c == name)
            .map(|k| k as ClassIdx)
    }

    /// Clusters by cluster index (id order).
    pub fn clusters(&self) -> &[ServingCluster] {
        &self.clusters
    }

    pub fn cluster_index(&self, id: &str) -> Option<ClusterIdx> {
        self.clusters
            .binary_search_by(|c| c.id.as_str().cmp(id))
            .ok()
            .map(|c| c as ClusterIdx)
    }

    pub fn unit_count(&self) -> usize {
        self.units.keys.class.len()
    }

    /// Whether `self` and `other` have the same units: ids, classes and prefixes, in the same
    /// order (one pointer comparison when they share them, a comparison of the columns
    /// otherwise). What a prefix index depends on.
    /// Whether the two maps hold one copy of their units (ids, classes, prefixes), not two.
    pub fn shares_units_with(&self, other: &ServingMap) -> bool {
        Arc::ptr_eq(&self.units.keys, &other.units.keys)
    }

    /// Whether a unit's answer is computed alike in both maps apart from its own placement: the
    /// same classes, clusters up alike (by index) and fallbacks.
    pub fn answers_alike(&self, other: &ServingMap) -> bool {
        self.classes == other.classes
            && self.fallback == other.fallback
            && self.clusters.len() == other.clusters.len()
            && self
                .clusters
                .iter()
                .zip(&other.clusters)
                .all(|(a, b)| a.is_up() == b.is_up())
    }

    /// Whether unit `u` is placed alike in this map and in `other` (of the same units and
    /// clusters): the same clusters by index and shares bit for bit, the same backups, and
    /// for a unit with nothing placed, overflow alike.
    pub fn placed_alike(&self, u: UnitIdx, other: &ServingMap) -> bool {
        let ((ca, sa), (cb, sb)) = (self.shares(u), other.shares(u));
        ca == cb
            && sa.iter().zip(sb).all(|(x, y)| x.to_bits() == y.to_bits())
            && self.units.backup[u as usize] == other.units.backup[u as usize]
            && self.companion(u).map(|(c, s)| (c, s.to_bits()))
                == other.companion(u).map(|(c, s)| (c, s.to_bits()))
            // A unit with nothing placed is answered by whether it overflowed (the class's
            // fallback) or had no demand (its best candidates).
            && (!ca.is_empty() || (self.overflow(u) > 0.0) == (other.overflow(u) > 0.0))
    }

    /// The unit keys, held apart from this version ([`UnitKeysRef`]).
    pub(crate) fn unit_keys(&self) -> UnitKeysRef {
        UnitKeysRef(Arc::clone(&self.units.keys))
    }

    /// The positions of unit `u`'s prefixes among all units' (in unit order).
    pub fn unit_prefix_positions(&self, u: UnitIdx) -> std::ops::Range<usize> {
        Self::range(&self.units.keys.prefix_end, u)
    }

    pub fn same_units(&self, other: &ServingMap) -> bool {
        Arc::ptr_eq(&self.units.keys, &other.units.keys) || self.units.keys == other.units.keys
    }

    /// Whether this map's units are exactly `topology`'s: ids, classes and prefixes (as the
    /// map holds them, truncated), in order.
    fn has_units_of(&self, topology: &Topology) -> bool {
        let instance = &topology.instance;
        // Built from this topology's units and addressing (the usual round): the same units
        // by construction, classes included.
        if let Some(source) = &self.source.0 {
            if Arc::ptr_eq(&source.addressing, &topology.addressing)
                && source.instance.shares_units(instance)
            {
                return true;
            }
        }
        let n = instance.unit_count();
        n == self.unit_count()
            && (0..n as UnitIdx).all(|u| {
                let (mine, theirs) = (self.unit_prefixes(u), topology.unit_prefixes(u));
                self.unit_class(u) == instance.unit_class(u)
                    && mine.len() == theirs.len()
                    && mine.zip(theirs).all(|(a, b)| a == b.trunc())
                    && self.unit_id(u) == instance.unit_id(u)
            })
    }

    fn range(ends: &[u32], u: UnitIdx) -> std::ops::Range<usize> {
        let u = u as usize;
        let start = if u == 0 { 0 } else { ends[u - 1] as usize };
        start..ends[u] as usize
    }

    pub fn unit_id(&self, u: UnitIdx) -> &str {
        let k = &self.units.keys;
        &k.id_text[Self::range(&k.id_end, u)]
    }

    /// The unit with this id (a binary search: units are in id order).
    pub fn unit_index(&self, id: &str) -> Option<UnitIdx> {
        let (mut lo, mut hi) = (0usize, self.unit_count());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.unit_id(mid as UnitIdx).cmp(id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid as UnitIdx),
            }
        }
        None
    }

    pub fn unit_class(&self, u: UnitIdx) -> ClassIdx {
        self.units.keys.class[u as usize]
    }

    pub fn unit_class_name(&self, u: UnitIdx) -> &str {
        &self.classes[usize::from(self.unit_class(u))]
    }

    /// Unit `u`'s prefixes (truncated).
    pub fn unit_prefixes(&self, u: UnitIdx) -> Prefixes<'_> {
        let k = &self.units.keys;
        Prefixes {
            column: &k.prefixes,
            at: Self::range(&k.prefix_end, u),
        }
    }

    /// Unit `u`'s placements: clusters and shares of its demand, in its preference order.
    pub fn shares(&self, u: UnitIdx) -> (&[ClusterIdx], &[f64]) {
        let units = &self.units;
        let r = Self::range(&units.share_end, u);
        let n = r.len();
        let shares = match units.split.get(u) {
            Some(at) => &units.share[at as usize..at as usize + n],
            None => &WHOLE[..n.min(1)],
        };
        (&units.share_cluster[r], shares)
    }

    /// The share of unit `u`'s demand no candidate took.
    pub fn overflow(&self, u: UnitIdx) -> f64 {
        self.units.overflow.get(u).unwrap_or(0.0)
    }

    /// Unit `u`'s companion (go with the winner): the cluster its answers name second, and
    /// the share of its demand reserved there. Not among [`Self::shares`]: clients are not
    /// spread over it, every answer names it after the cluster they get.
    pub fn companion(&self, u: UnitIdx) -> Option<(ClusterIdx, f64)> {
        self.units.companion.get(u)
    }

    /// The cluster an answer names second when `u`'s demand sits wholly at one cluster: its
    /// best up candidate outside its placements.
    pub fn backup(&self, u: UnitIdx) -> Option<ClusterIdx> {
        self.backups(u)[0]
    }

    /// Unit `u`'s two best up candidates outside its placements: the second is the answer's
    /// second cluster when none of the placements is up (the first is then its first).
    pub fn backups(&self, u: UnitIdx) -> [Option<ClusterIdx>; 2] {
        self.units.backup[u as usize].map(|b| (b != NONE).then_some(b))
    }

    /// The class's two fallback clusters.
    pub fn fallback(&self, class: ClassIdx) -> [Option<ClusterIdx>; 2] {
        self.fallback
            .get(usize::from(class))
            .copied()
            .unwrap_or([None, None])
    }

    /// Whether unit `u` answers alike in `self` and unit `v` in `other` (same id assumed):
    /// class name, prefixes, shares per cluster id (exactly), overflow and backups.
    pub fn same_unit(&self, u: UnitIdx, other: &ServingMap, v: UnitIdx) -> bool {
        // The usual case first, without allocating: the same shares in the same order.
        fn in_order(a: &ServingMap, u: UnitIdx, b: &ServingMap, v: UnitIdx) -> bool {
            let ((ca, sa), (cb, sb)) = (a.shares(u), b.shares(v));
            ca.len() == cb.len()
                && ca
                    .iter()
                    .zip(cb)
                    .all(|(&x, &y)| a.clusters[x as usize].id == b.clusters[y as usize].id)
                && sa.iter().zip(sb).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        fn by_id(m: &ServingMap, u: UnitIdx) -> Vec<(&str, u64)> {
            let (c, s) = m.shares(u);
            let mut v: Vec<(&str, u64)> = c
                .iter()
                .zip(s)
                .map(|(&c, &s)| (m.clusters[c as usize].id.as_str(), s.to_bits()))
                .collect();
            v.sort_unstable();
            v
        }
        fn backup(m: &ServingMap, u: UnitIdx) -> [Option<&str>; 2] {
            m.backups(u)
                .map(|b| b.map(|c| m.clusters[c as usize].id.as_str()))
        }
        fn companion(m: &ServingMap, u: UnitIdx) -> Option<(&str, u64)> {
            m.companion(u)
                .map(|(c, s)| (m.clusters[c as usize].id.as_str(), s.to_bits()))
        }
        self.unit_class_name(u) == other.unit_class_name(v)
            && self.unit_prefixes(u).eq(other.unit_prefixes(v))
            && self.overflow(u).to_bits() == other.overflow(v).to_bits()
            && companion(self, u) == companion(other, v)
            && backup(self, u) == backup(other, v)
            && (in_order(self, u, other, v) || by_id(self, u) == by_id(other, v))
    }

    /// What the map holds, column by column.
    pub fn sizes(&self) -> Sizes {
        let (u, k) = (&self.units, &self.units.keys);
        Sizes {
            units: k.class.len(),
            id_bytes: k.id_text.len(),
            prefixes: k.prefixes.len(),
            shares: u.share_cluster.len(),
        }
    }

    /// Bytes this map holds on the heap (about; unit keys shared with another map count in
    /// both).
    pub fn heap_bytes(&self) -> usize {
        let (u, k) = (&self.units, &self.units.keys);
        k.id_text.capacity()
            + 4 * (k.id_end.capacity() + k.prefix_end.capacity() + u.share_end.capacity())
            + std::mem::size_of::<ClassIdx>() * k.class.capacity()
            + k.prefixes.heap_bytes()
            + 4 * (u.share_cluster.capacity() + 2 * u.backup.capacity())
            + 8 * u.share.capacity()
            + u.split.heap_bytes()
            + u.overflow.heap_bytes()
            + u.companion.heap_bytes()
    }
}

/// Per class, the two up clusters serving it with the most room for one more unit of demand
/// (the smallest free share along the class's path).
fn fallbacks(instance: &Instance, map: &Map) -> Vec<[Option<ClusterIdx>; 2]> {
    let used = cdnmap_mapper::map::node_usage(instance, map);
    (0..instance.classes().len())
        .map(|k| {
            let k = k as ClassIdx;
            let mut best: Vec<(f64, ClusterIdx)> = instance
                .clusters()
                .iter()
                .enumerate()
                .filter(|(_, c)| c.state == ClusterState::Up && c.serves(k))
                .map(|(ci, c)| {
                    let room = c
                        .path(k)
                        .map(|n| {
                            let cap = c.nodes[n as usize].capacity;
                            let free = cap - used[instance.global_node(ci as ClusterIdx, n)];
                            if cap > 0.0 {
                                free / cap
                            } else {
                                0.0
                            }
                        })
                        .fold(f64::INFINITY, f64::min);
                    (room, ci as ClusterIdx)
                })
                .collect();
            best.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            [best.first().map(|b| b.1), best.get(1).map(|b| b.1)]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefixes read back from the compact column as they were pushed (truncated), IPv4 in
    /// words and IPv6 beside, in order; two columns of the same pushes are equal.
    #[test]
    fn prefixes_read_back_from_the_compact_column() {
        let texts = [
            "10.1.2.0/24",
            "2001:db8::/48",
            "0.0.0.0/0",
            "10.1.2.3/32",
            "::/0",
            "::ffff:10.0.0.0/104",
            "2001:db8::1/128",
            "192.168.7.9/20",
        ];
        let nets: Vec<IpNet> = texts.iter().map(|t| t.parse().expect("prefix")).collect();
        let mut column = PrefixColumn::default();
        for n in &nets {
            column.push(n);
        }
        let back: Vec<IpNet> = (0..column.len()).map(|i| column.get(i)).collect();
        let want: Vec<IpNet> = nets.iter().map(IpNet::trunc).collect();
        assert_eq!(back, want);
        assert_eq!(column.v6.len(), 4);
        let mut again = PrefixColumn::default();
        for n in &nets {
            again.push(n);
        }
        assert_eq!(again, column);
        let read = Prefixes {
            column: &column,
            at: 1..4,
        };
        assert_eq!(read.len(), 3);
        assert_eq!(read.collect::<Vec<_>>(), want[1..4].to_vec());
    }

    /// Overflow shares are kept for the units that have one (-0.0 included, bit for bit) and
    /// read back exactly, 0.0 for the rest, past a word of the bitmap; a map sharing the units
    /// and copying every placement is the same map.
    #[test]
    fn overflow_shares_read_back_exactly_and_survive_a_copy() {
        let classes: Vec<Arc<str>> = vec![Arc::from("web")];
        let clusters = vec![ServingCluster {
            id: "a".into(),
            addresses: vec![IpAddr::from([192, 0, 2, 1])],
            state: ClusterState::Up,
        }];
        let overflow = |i: u32| match i % 7 {
            0 => 0.25,
            3 => -0.0,
            5 => 1.0,
            _ => 0.0,
        };
        let mut b = Builder::new(classes.clone(), clusters.clone()).expect("clusters");
        for i in 0..200u32 {
            let prefix: IpNet = format!("10.0.{i}.0/24").parse().expect("prefix");
            let o = overflow(i);
            let shares = (o < 1.0).then_some((0, 1.0 - o));
            b.push(&format!("u{i:03}"), 0, [prefix], shares, o, [None, None])
                .expect("a unit");
        }
        let m = b.finish();
        for i in 0..200u32 {
            assert_eq!(m.overflow(i).to_bits(), overflow(i).to_bits(), "unit {i}");
        }
        assert_eq!(m.overflow(500), 0.0, "past the units");
        let mut copy = Builder::new(classes, clusters).expect("clusters");
        copy.share_units_of(&m).expect("empty");
        for u in 0..200 {
            copy.copy_placement(&m, u, &[Some(0)]).expect("copied");
        }
        let copy = copy.finish_placements().expect("all placed");
        assert_eq!(copy, m);
        assert!(copy.shares_units_with(&m));
    }
    /// Shares read back as pushed, bit for bit, whether whole (not stored), split, partial or
    /// none; only the shares other than one whole one take room; a copy is the same map.
    #[test]
    fn whole_shares_take_no_room_and_every_share_reads_back_exactly() {
        let classes: Vec<Arc<str>> = vec![Arc::from("web")];
        let clusters: Vec<ServingCluster> = ["a", "b", "c"]
            .iter()
            .map(|id| ServingCluster {
                id: (*id).into(),
                addresses: vec![IpAddr::from([192, 0, 2, 1])],
                state: ClusterState::Up,
            })
            .collect();
        let shares = |i: u32| -> Vec<(ClusterIdx, f64)> {
            match i % 6 {
                0 => vec![(i % 3, 1.0)],
                1 => vec![(0, 0.25), (2, 0.75)],
                2 => vec![],
                3 => vec![(1, 0.5)],
                4 => vec![(2, 1.0 - 1e-12)],
                _ => vec![(1, 1.0), (0, 1e-9)],
            }
        };
        let mut b = Builder::new(classes.clone(), clusters.clone()).expect("clusters");
        for i in 0..300u32 {
            let prefix: IpNet = format!("10.{}.{}.0/24", i / 256, i % 256)
                .parse()
                .expect("prefix");
            let over = if i % 6 == 2 { 1.0 } else { 0.0 };
            b.push(
                &format!("u{i:03}"),
                0,
                [prefix],
                shares(i),
                over,
                [None, None],
            )
            .expect("a unit");
        }
        let m = b.finish();
        for i in 0..300u32 {
            let (c, s) = m.shares(i);
            let want = shares(i);
            assert_eq!(c, want.iter().map(|w| w.0).collect::<Vec<_>>(), "unit {i}");
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(s), bits(&want.iter().map(|w| w.1).collect::<Vec<_>>()));
        }
        // Stored: units 1, 3, 4 and 5 of every six (2 + 1 + 1 + 2 shares) of 7 placements.
        assert_eq!(m.units.share.len(), 50 * 6);
        assert_eq!(m.sizes().shares, 50 * 7);
        let mut copy = Builder::new(classes, clusters).expect("clusters");
        copy.share_units_of(&m).expect("empty");
        for u in 0..300 {
            copy.copy_placement(&m, u, &[Some(0), Some(1), Some(2)])
                .expect("copied");
        }
        assert_eq!(copy.finish_placements().expect("all placed"), m);
    }
    /// A map built while expecting another's units is the map built without, and shares the
    /// other's unit keys exactly when it has the same units: whatever differs first (an id, a
    /// class, a prefix, a unit more or less), wherever.
    #[test]
    fn a_map_of_the_units_expected_shares_their_keys_and_any_other_is_the_same_as_without() {
        let classes: Vec<Arc<str>> = vec![Arc::from("web"), Arc::from("video")];
        let clusters = vec![ServingCluster {
            id: "a".into(),
            addresses: vec![IpAddr::from([192, 0, 2, 1])],
            state: ClusterState::Up,
        }];
        type Unit = (String, ClassIdx, Vec<IpNet>);
        let unit = |i: u32| -> Unit {
            let mut prefixes = vec![format!("10.{}.{}.0/24", i / 256, i % 256)
                .parse()
                .expect("prefix")];
            if i.is_multiple_of(5) {
                prefixes.push(format!("2001:db8:{i:x}::/48").parse().expect("prefix"));
            }
            (format!("u{i:04}"), (i % 2) as ClassIdx, prefixes)
        };
        let build = |units: &[Unit], expect: Option<&ServingMap>| {
            let mut b = Builder::new(classes.clone(), clusters.clone()).expect("clusters");
            if let Some(old) = expect {
                b.expect_units_of(old);
            }
            for (n, (id, class, prefixes)) in units.iter().enumerate() {
                let share = if n % 3 == 0 { 0.5 } else { 1.0 };
                b.push(
                    id,
                    *class,
                    prefixes.iter().copied(),
                    [(0, share)],
                    0.0,
                    [None, None],
                )
                .expect("a unit");
            }
            b.finish()
        };
        let units: Vec<Unit> = (0..300).map(unit).collect();
        let old = build(&units, None);
        let again = build(&units, Some(&old));
        assert_eq!(again, old);
        assert!(again.shares_units_with(&old));
        let mut variants: Vec<Vec<Unit>> = Vec::new();
        for at in [0usize, 1, 150, 299] {
            let mut v = units.clone();
            v[at].0.push('x');
            variants.push(v);
            let mut v = units.clone();
            v[at].1 ^= 1;
            variants.push(v);
            let mut v = units.clone();
            v[at].2[0] = "10.200.0.0/16".parse().expect("prefix");
            variants.push(v);
            variants.push(units[..at].to_vec());
        }
        let mut more = units.clone();
        more.push(unit(300));
        variants.push(more);
        for v in variants {
            let with = build(&v, Some(&old));
            assert_eq!(with, build(&v, None));
            assert!(!with.shares_units_with(&old));
        }
    }
}
