//! Where a topology sits on the Internet: each map unit's client networks and each cluster's
//! server addresses, in columns by the instance's own unit and cluster indices. Allocation never
//! reads them (the mapper's [`Instance`] does not hold them); answering a query does.
//!
//! Promises: an [`Addressing`] built for an instance has exactly one entry per unit and per
//! cluster of it, at that unit's and that cluster's index; no unit has more than
//! [`MAX_PREFIXES_PER_UNIT`] prefixes and no cluster more than [`MAX_ADDRESSES`] addresses;
//! in a [`crate::Topology`], no two units of one class claim the same client network (by
//! [`canonical`] form), so every topology can be indexed for queries.

use std::net::IpAddr;
use std::sync::Arc;

use cdnmap_mapper::model::Piece;
use cdnmap_mapper::{ClassIdx, ClusterIdx, Instance, UnitIdx};
use ipnet::IpNet;

/// At most this many addresses per cluster.
pub const MAX_ADDRESSES: usize = 1024;
/// At most this many prefixes per map unit.
pub const MAX_PREFIXES_PER_UNIT: usize = 4096;

/// Client networks by unit index, server addresses by cluster index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addressing {
    /// The units' prefixes, behind an `Arc`: a cluster's addresses change without copying
    /// them (`with_cluster_addresses`).
    units: Arc<UnitPrefixes>,
    addresses: Vec<Vec<IpAddr>>,
}

/// Unit `u`'s prefixes are `prefixes[start[u]..start[u + 1]]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct UnitPrefixes {
    start: Vec<u32>,
    prefixes: Vec<IpNet>,
}

impl Addressing {
    /// No prefix and no address for any of `instance`'s units and clusters: a topology that is
    /// only solved, never answered from (benchmarks of the solver, `cdnmap solve`).
    pub fn none_for(instance: &Instance) -> Addressing {
        Addressing {
            units: Arc::new(UnitPrefixes {
                start: vec![0; instance.unit_count() + 1],
                prefixes: Vec::new(),
            }),
            addresses: vec![Vec::new(); instance.clusters().len()],
        }
    }

    /// Whether this addressing has an entry for each of `instance`'s units and clusters.
    pub fn fits(&self, instance: &Instance) -> bool {
        self.unit_count() == instance.unit_count()
            && self.addresses.len() == instance.clusters().len()
    }

    pub fn unit_count(&self) -> usize {
        self.units.start.len().saturating_sub(1)
    }

    /// Unit `u`'s client networks.
    pub fn unit_prefixes(&self, u: UnitIdx) -> &[IpNet] {
        let u = u as usize;
        let (a, b) = (self.units.start[u], self.units.start[u + 1]);
        &self.units.prefixes[a as usize..b as usize]
    }

    /// Cluster `c`'s server addresses.
    pub fn cluster_addresses(&self, c: ClusterIdx) -> &[IpAddr] {
        &self.addresses[c as usize]
    }

    /// The same units' prefixes (shared) beside `instance`'s clusters, each with its
    /// addresses from `addresses` (by cluster id; none for a cluster not named).
    pub(crate) fn with_clusters(
        &self,
        instance: &Instance,
        addresses: Vec<(String, Vec<IpAddr>)>,
    ) -> Addressing {
        let mut by_index = vec![Vec::new(); instance.clusters().len()];
        for (id, a) in addresses {
            if let Some(c) = instance.cluster_index(&id) {
                by_index[c as usize] = a;
            }
        }
        Addressing {
            units: Arc::clone(&self.units),
            addresses: by_index,
        }
    }

    /// The same addressing with cluster `c`'s addresses replaced (the units' prefixes shared).
    pub(crate) fn with_cluster_addresses(
        &self,
        c: ClusterIdx,
        addresses: Vec<IpAddr>,
    ) -> Addressing {
        let mut out = Addressing {
            units: Arc::clone(&self.units),
            addresses: self.addresses.clone(),
        };
        if let Some(a) = out.addresses.get_mut(c as usize) {
            *a = addresses;
        }
        out
    }

    /// All prefixes of all units.
    pub fn prefix_count(&self) -> usize {
        self.units.prefixes.len()
    }

    /// Bytes held on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.units.start.capacity() * 4
            + self.units.prefixes.capacity() * std::mem::size_of::<IpNet>()
            + self.addresses.capacity() * std::mem::size_of::<Vec<IpAddr>>()
            + self
                .addresses
                .iter()
                .map(|a| a.capacity() * std::mem::size_of::<IpAddr>())
                .sum::<usize>()
    }
}

impl Addressing {
    /// The addressing of an instance edited into `pieces` (`Instance::with_units_edited`): a
    /// kept run's prefixes copied from this one, a new unit's from `new(i)` (the upsert's
    /// index); the clusters' addresses as they are.
    pub(crate) fn spliced<'a>(
        &self,
        pieces: &[Piece],
        new: impl Fn(usize) -> &'a [IpNet],
    ) -> Addressing {
        let mut prefix_start = Vec::with_capacity(self.units.start.len() + pieces.len());
        prefix_start.push(0u32);
        let mut prefixes = Vec::with_capacity(self.units.prefixes.len() + pieces.len());
        for piece in pieces {
            match piece {
                Piece::Kept(r) => {
                    let (p0, p1) = (
                        self.units.start[r.start as usize],
                        self.units.start[r.end as usize],
                    );
                    let base = prefixes.len() as u32;
                    prefixes.extend_from_slice(&self.units.prefixes[p0 as usize..p1 as usize]);
                    prefix_start.extend(
                        self.units.start[r.start as usize + 1..=r.end as usize]
                            .iter()
                            .map(|&s| s - p0 + base),
                    );
                }
                Piece::New(i) => {
                    prefixes.extend_from_slice(new(*i));
                    prefix_start.push(prefixes.len() as u32);
                }
            }
        }
        Addressing {
            units: Arc::new(UnitPrefixes {
                start: prefix_start,
                prefixes,
            }),
            addresses: self.addresses.clone(),
        }
    }
}

/// The first client network that a unit of `fresh` and another unit of its class both claim
/// in the topology of `instance` and `addressing` (canonical), with the two units in index
/// order: the claim check of [`claimed_twice`] for an edit, whose other units were checked
/// before. One pass over the prefixes, a table of the fresh units' claims only.
pub(crate) fn claimed_twice_by(
    instance: &Instance,
    addressing: &Addressing,
    fresh: &[UnitIdx],
) -> Option<(IpNet, UnitIdx, UnitIdx)> {
    let mut claims: std::collections::HashMap<(ClassIdx, IpNet), UnitIdx> =
        std::collections::HashMap::new();
    for &u in fresh {
        let class = instance.unit_class(u);
        for p in addressing.unit_prefixes(u) {
            match claims.entry((class, canonical(p))) {
                std::collections::hash_map::Entry::Occupied(e) if *e.get() != u => {
                    let (a, b) = ((*e.get()).min(u), (*e.get()).max(u));
                    return Some((e.key().1, a, b));
                }
                std::collections::hash_map::Entry::Occupied(_) => {}
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(u);
                }
            }
        }
    }
    if claims.is_empty() {
        return None;
    }
    let is_fresh = |u: UnitIdx| fresh.binary_search(&u).is_ok();
    for u in 0..instance.unit_count() as UnitIdx {
        if is_fresh(u) {
            continue;
        }
        let class = instance.unit_class(u);
        for p in addressing.unit_prefixes(u) {
            if let Some(&f) = claims.get(&(class, canonical(p))) {
                return Some((canonical(p), u.min(f), u.max(f)));
            }
        }
    }
    None
}

/// Collects an [`Addressing`] beside an instance being built: prefixes in push order,
/// addresses by cluster id, then both put in the instance's order.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    prefix_start: Vec<u32>,
    prefixes: Vec<IpNet>,
    addresses: Vec<(String, Vec<IpAddr>)>,
}

impl Collector {
    pub(crate) fn new(addresses: Vec<(String, Vec<IpAddr>)>) -> Collector {
        Collector {
            prefix_start: vec![0],
            prefixes: Vec::new(),
            addresses,
        }
    }

    pub(crate) fn reserve(&mut self, units: usize, prefixes: usize) {
        self.prefix_start.reserve_exact(units);
        self.prefixes.reserve_exact(prefixes);
    }

    /// The prefixes of the unit just pushed.
    pub(crate) fn push_unit(&mut self, prefixes: &[IpNet]) {
        self.prefixes.extend_from_slice(prefixes);
        self.prefix_start.push(self.prefixes.len() as u32);
    }

    /// The addressing of `instance`, whose units are the pushes in `order` (`order[u]` the
    /// push that became unit `u`; `None`: in push order).
    pub(crate) fn finish(self, instance: &Instance, order: Option<&[u32]>) -> Addressing {
        let mut addresses = vec![Vec::new(); instance.clusters().len()];
        for (id, a) in self.addresses {
            if let Some(c) = instance.cluster_index(&id) {
                addresses[c as usize] = a;
            }
        }
        let Some(order) = order else {
            return Addressing {
                units: Arc::new(UnitPrefixes {
                    start: self.prefix_start,
                    prefixes: self.prefixes,
                }),
                addresses,
            };
        };
        let mut out = Collector::new(Vec::new());
        out.reserve(order.len(), self.prefixes.len());
        for &i in order {
            let (a, b) = (
                self.prefix_start[i as usize],
                self.prefix_start[i as usize + 1],
            );
            out.push_unit(&self.prefixes[a as usize..b as usize]);
        }
        Addressing {
            units: Arc::new(UnitPrefixes {
                start: out.prefix_start,
                prefixes: out.prefixes,
            }),
            addresses,
        }
    }
}

/// A prefix in its canonical form: truncated, and a v4-mapped IPv6 prefix (`::ffff:0:0/96` or
/// longer) as the IPv4 prefix it is. Two prefixes cover the same addresses exactly when their
/// canonical forms are equal.
#[inline]
pub fn canonical(net: &IpNet) -> IpNet {
    let net = net.trunc();
    if let IpNet::V6(n) = net {
        if n.prefix_len() >= 96 {
            if let Some(v4) = n.network().to_ipv4_mapped() {
                if let Ok(p) = ipnet::Ipv4Net::new(v4, n.prefix_len() - 96) {
                    return IpNet::V4(p.trunc());
                }
            }
        }
    }
    net
}

/// The first client network (canonical, in sort order) that two map units of one class
/// claim, with the two units: a query from it could not tell them apart.
pub(crate) fn claimed_twice(
    instance: &Instance,
    addressing: &Addressing,
) -> Option<(IpNet, UnitIdx, UnitIdx)> {
    // A sort, not a table keyed by prefix: at a million units it holds half the memory.
    let mut claims: Vec<(ClassIdx, IpNet, UnitIdx)> = Vec::with_capacity(addressing.prefix_count());
    for u in 0..instance.unit_count() as UnitIdx {
        let class = instance.unit_class(u);
        claims.extend(
            addressing
                .unit_prefixes(u)
                .iter()
                .map(|p| (class, canonical(p), u)),
        );
    }
    claims.sort_unstable();
    claims.dedup(); // one unit naming a network twice claims it once
    claims
        .windows(2)
        .find(|w| (w[0].0, w[0].1) == (w[1].0, w[1].1))
        .map(|w| (w[0].1, w[0].2, w[1].2))
}
