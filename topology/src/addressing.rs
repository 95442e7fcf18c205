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

use cdnmap_mapper::{ClassIdx, ClusterIdx, Instance, UnitIdx};
use ipnet::IpNet;

/// At most this many addresses per cluster.
pub const MAX_ADDRESSES: usize = 1024;
/// At most this many prefixes per map unit.
pub const MAX_PREFIXES_PER_UNIT: usize = 4096;

/// Client networks by unit index, server addresses by cluster index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addressing {
    /// Unit `u`'s prefixes are `prefixes[prefix_start[u]..prefix_start[u + 1]]`.
    prefix_start: Vec<u32>,
    prefixes: Vec<IpNet>,
    addresses: Vec<Vec<IpAddr>>,
}

impl Addressing {
    /// No prefix and no address for any of `instance`'s units and clusters: a topology that is
    /// only solved, never answered from (benchmarks of the solver, `cdnmap solve`).
    pub fn none_for(instance: &Instance) -> Addressing {
        Addressing {
            prefix_start: vec![0; instance.unit_count() + 1],
            prefixes: Vec::new(),
            addresses: vec![Vec::new(); instance.clusters().len()],
        }
    }

    /// Whether this addressing has an entry for each of `instance`'s units and clusters.
    pub fn fits(&self, instance: &Instance) -> bool {
        self.unit_count() == instance.unit_count()
            && self.addresses.len() == instance.clusters().len()
    }

    pub fn unit_count(&self) -> usize {
        self.prefix_start.len().saturating_sub(1)
    }

    /// Unit `u`'s client networks.
    pub fn unit_prefixes(&self, u: UnitIdx) -> &[IpNet] {
        let u = u as usize;
        let (a, b) = (self.prefix_start[u], self.prefix_start[u + 1]);
        &self.prefixes[a as usize..b as usize]
    }

    /// Cluster `c`'s server addresses.
    pub fn cluster_addresses(&self, c: ClusterIdx) -> &[IpAddr] {
        &self.addresses[c as usize]
    }

    /// All prefixes of all units.
    pub fn prefix_count(&self) -> usize {
        self.prefixes.len()
    }

    /// Bytes held on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.prefix_start.capacity() * 4
            + self.prefixes.capacity() * std::mem::size_of::<IpNet>()
            + self.addresses.capacity() * std::mem::size_of::<Vec<IpAddr>>()
            + self
                .addresses
                .iter()
                .map(|a| a.capacity() * std::mem::size_of::<IpAddr>())
                .sum::<usize>()
    }
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
                prefix_start: self.prefix_start,
                prefixes: self.prefixes,
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
            prefix_start: out.prefix_start,
            prefixes: out.prefixes,
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
