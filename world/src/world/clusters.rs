//! Where the clusters are: one per used site, the rest apportioned by metro population
//! (D'Hondt), with their ids and addresses.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::data::Site;

/// A heap entry of the D'Hondt apportionment: the next seat goes to the greatest
/// `population / (seats + 1)`, ties to the more populous (earlier) site.
#[derive(PartialEq, Eq)]
struct Quotient {
    population: u64,
    seats: u64,
    site: usize,
}

impl Ord for Quotient {
    fn cmp(&self, other: &Self) -> Ordering {
        let lhs = u128::from(self.population) * u128::from(other.seats + 1);
        let rhs = u128::from(other.population) * u128::from(self.seats + 1);
        lhs.cmp(&rhs).then_with(|| other.site.cmp(&self.site))
    }
}

impl PartialOrd for Quotient {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Clusters per site: one for each of the `min(k, sites)` first sites, the rest by D'Hondt.
fn apportion(populations: &[u64], k: usize) -> Vec<usize> {
    let used = k.min(populations.len());
    let mut seats = vec![0usize; used];
    let mut heap = BinaryHeap::with_capacity(used);
    for (site, &population) in populations.iter().take(used).enumerate() {
        seats[site] = 1;
        heap.push(Quotient {
            population,
            seats: 1,
            site,
        });
    }
    for _ in used..k {
        let Some(mut top) = heap.pop() else { break };
        seats[top.site] += 1;
        top.seats += 1;
        heap.push(top);
    }
    seats
}

/// A generated cluster, before it becomes a [`ClusterSpec`].
pub(super) struct GenCluster {
    pub(super) id: String,
    /// Index into the used sites.
    pub(super) site: usize,
    pub(super) lat: f64,
    pub(super) lon: f64,
}

/// The clusters, at their sites, sorted by id (so that a position here is the builder's cluster
/// index).
pub(super) fn layout_clusters(sites: &[Site], k: usize) -> Vec<GenCluster> {
    let populations: Vec<u64> = sites.iter().map(|s| s.metro_population).collect();
    let seats = apportion(&populations, k);
    let mut clusters = Vec::with_capacity(k);
    for (site_index, (site, &n)) in sites.iter().zip(&seats).enumerate() {
        let code = site.iata.to_ascii_lowercase();
        for number in 1..=n {
            clusters.push(GenCluster {
                id: format!("{code}-{number}"),
                site: site_index,
                lat: site.lat,
                lon: site.lon,
            });
        }
    }
    clusters.sort_by(|a, b| a.id.cmp(&b.id));
    clusters
}

/// Cluster `j`'s addresses: two IPv4 from 198.18.0.0/15, one IPv6 from 2001:db8::/32.
pub(super) fn cluster_addresses(j: usize) -> Vec<IpAddr> {
    let base = 0xC612_0000u32 + 2 * (j as u32 % (1 << 16));
    vec![
        IpAddr::V4(Ipv4Addr::from(base)),
        IpAddr::V4(Ipv4Addr::from(base + 1)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, j as u16, 0, 0, 0, 1)),
    ]
}
