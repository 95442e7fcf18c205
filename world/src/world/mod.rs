//! Deterministic, realistic world generator: map units where people live, clusters at real edge
//! sites, latency from great-circle distance.
//!
//! The reference data (`data/cities.csv` from GeoNames, CC BY 4.0; `data/pop-sites.csv` built with
//! airportsdata, MIT; see `data/README.md` for the credit lines) is embedded in the binary.
//!
//! # The model
//!
//! **Traffic classes** ([`traffic_classes`]): `web` (Bps 1.0, Fps 0.5, priority 1), `video` (Bps 4.0,
//! Fps 0.25, priority 2) and `apps` (Bps 0.25, Fps 1.0, priority 0). The classes consume the two
//! resource kinds in different proportions and clusters prefer `apps`, so the solver's eviction
//! and repair paths are exercised.
//!
//! **Clusters.** The 240 sites are ranked by metro population (ties by IATA code). With `K` clusters
//! the `min(K, 240)` most populous sites are used; each gets one cluster and the remaining
//! `K - 240` (if any) are apportioned by metro population with the D'Hondt method (exact integer
//! arithmetic), so big metros get several. Ids are the lower-case IATA code and a number
//! (`sha-1`, `sha-2`, ...). A cluster sits at its site's coordinates (a metro's clusters are
//! equally far from everyone), has two IPv4 addresses from 198.18.0.0/15 and one IPv6 address
//! from 2001:db8::/32 (unique while `K <= MAX_WORLD_CLUSTERS`), is `Up`, and has the resource tree
//! `uplink` (Bps) → `cpu` (Fps) → leaves `web`, `video`, `apps` (Fps, one class each).
//!
//! **Capacity sizing.** Capacity follows expected demand: each city's population times the
//! probability that it gets at least one prefix (`1 - (1 - population / total)^prefixes`; a city
//! with prefixes brings its whole population as demand, see below) is credited to its nearest used
//! site (a Voronoi split): `pop(s)`, split evenly over the site's clusters. A site's *region
//! factor* is `country(s) × site(s)`, independent lognormal factors (σ = [`COUNTRY_SIGMA`],
//! [`SITE_SIGMA`]; one draw per country, one per site), clamped to [[`REGION_FACTOR_MIN`],
//! [`REGION_FACTOR_MAX`]]; it scales the uplinks only (bandwidth is what a region runs short or
//! long of; cpu follows population). Each cluster's uplink and cpu get their own lognormal factor
//! (σ = [`CLUSTER_SIGMA`], clamped to [0.7, 1.4]), so some clusters are uplink-bound and others
//! cpu-bound. Uplinks are then scaled so that their total is exactly `headroom ×` the total Bps
//! cost of all demand (`Σ demand × per_unit.bps`), and cpu nodes likewise against the Fps cost.
//! The cpu is split over the class leaves in proportion to `share(k) × v(k)`, with `share(k)` the
//! class's share of the world's Fps cost and `v(k)` lognormal per cluster and class
//! (σ = [`LEAF_SIGMA`]), and each leaf gets [`LEAF_MARGIN`] of the cpu on top (capped at the cpu):
//! the leaves sum to more than the cpu, so the cpu node binds where the class mix is typical, and a
//! leaf binds where its class crowds in or its `v(k)` is small. Leaf shortages are class-specific,
//! so they mostly shift demand to a neighbour rather than overflow it. At 30,000 units × 240
//! clusters (seed 1), a cluster's uplink and cpu over the demand that ranks it first range from
//! 0.74 to 1.92 (10th–90th percentile 0.83–1.25), and at its tightest node (leaves included) from
//! 0.40 to 1.68 (0.63–1.14): demand is rejected and evicted at the short clusters and overflows
//! where a whole neighbourhood is short. With the solver at headroom 1.1 (`cdnmap demo`, and
//! `cdnmap bench solve --map-units 1000000 --clusters 1000`) about 1–2% of the demand overflows and
//! about 90% is served by its first choice. Tighter leaves would lower that share, but at the
//! price of more overflow and of more demand moved by small changes in demand.
//!
//! **Map units.** `N` map units are `⌈N/3⌉` prefixes × the 3 classes (the last prefix gets the first
//! `N mod 3` classes in name order when `N` is not a multiple of 3). Each prefix is placed in a city
//! drawn with probability ∝ population, at a uniformly random point within [`UNIT_JITTER_KM`] of the
//! city centre. Prefixes are IPv4 /24s allocated sequentially from 1.0.0.0 (skipping the reserved
//! blocks in `V4_RESERVED`), except that about [`V6_SHARE`] of them are IPv6 /48s allocated
//! sequentially from 2a00::/12. A map unit's id is `u{prefix:08}-{class}`, so ids come out in
//! sorted order and the builder's sort is a no-op. Demand is
//! `population(city) / prefixes(city) / PEOPLE_PER_DEMAND_UNIT × share(class) × noise`, with class
//! shares web 0.5, video 0.35, apps 0.15 and `noise` lognormal with mean 1 (σ = [`DEMAND_SIGMA`]);
//! it is never negative.
//!
//! **Candidates.** Each prefix has its own *rendezvous order* of the clusters (a hash of the seed,
//! the prefix's index and the cluster's index), and may use, of each site, the first
//! [`WorldParams::max_per_site`] clusters in that order (all of them if the site has no more). A
//! usable cluster's score is the RTT estimate [`rtt_ms`] from the unit's jittered location to its
//! site, plus `i / max_per_site × SITE_SPREAD_MS` for the site's `i`-th usable cluster (`i` from
//! 0; [`SITE_SPREAD_MS`] is 0.1 ms), so a site's clusters come in rendezvous order and each is the
//! first choice of an even share of the site's prefixes. A map unit's candidates are its usable
//! clusters of lowest score (ties by cluster id) whose score is at most `max_rtt_ms`, at most
//! `candidates` of them, so a list spans at least `candidates / max_per_site` sites when full. A
//! unit with no usable cluster within `max_rtt_ms` gets the usable cluster of lowest score as its
//! only candidate, so no unit is left without one. The selection is exact: each city keeps a
//! shortlist of sites (nearest first, until they offer `candidates` usable clusters, plus every
//! site within a margin that covers the unit jitter and the spread), and the three map units of a

mod candidates;
mod capacity;
mod classes;
mod clusters;
mod data;
mod geo;
mod located;
mod perturb;
mod prefixes;
mod rng;
#[cfg(test)]
mod tests;
mod units;

use anyhow::{ensure, Result};
use cdnmap_mapper::model::{DEFAULT_MAX_CANDIDATES, MAX_CANDIDATES_CEILING, MAX_MAP_UNITS};
use cdnmap_mapper::Limits;
use cdnmap_topology::{Topology, TopologyBuilder};

use candidates::{shortlists, SiteIndex};
use capacity::cluster_specs;
use clusters::layout_clusters;
use units::{Placement, UnitPass};

pub use candidates::SITE_SPREAD_MS;
pub use capacity::{
    CLUSTER_SIGMA, COUNTRY_SIGMA, LEAF_MARGIN, LEAF_SIGMA, REGION_FACTOR_MAX, REGION_FACTOR_MIN,
    SITE_SIGMA,
};
pub use classes::{traffic_classes, DEMAND_SIGMA, PEOPLE_PER_DEMAND_UNIT};
pub use data::{cities, sites, sites_from, City, Site, CITIES_CSV, SITES_CSV};
pub use geo::{
    distance_km, rtt_from_km, rtt_ms, EARTH_RADIUS_KM, FIBRE_KM_PER_MS, ROUTE_INFLATION,
    RTT_BASE_MS,
};
pub use located::{from_located, located_networks, ClassMix};
pub(crate) use perturb::cluster_specs_of;
pub use perturb::perturb;
pub use prefixes::V6_SHARE;

/// At most this many clusters in a generated world: keeps every cluster's two IPv4 addresses
/// unique within 198.18.0.0/15.
pub const MAX_WORLD_CLUSTERS: usize = 1 << 16;
/// A map unit lies within this distance of its city's centre.
pub const UNIT_JITTER_KM: f64 = 5.0;

/// Parameters of a generated world.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorldParams {
    /// Number of map units (at least 1, at most `MAX_MAP_UNITS`).
    pub map_units: usize,
    /// Number of clusters (1..=[`MAX_WORLD_CLUSTERS`]).
    pub clusters: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// At most this many candidates per map unit (1..=255).
    pub candidates: usize,
    /// At most this many of a map unit's candidates at one site (at least 1).
    pub max_per_site: usize,
    /// Clusters with a higher RTT estimate are not candidates (except the single-nearest fallback).
    pub max_rtt_ms: f64,
    /// Total capacity / total demand cost, per resource kind.
    pub headroom: f64,
}

impl Default for WorldParams {
    fn default() -> Self {
        WorldParams {
            map_units: 30_000,
            clusters: 240,
            seed: 1,
            candidates: 16,
            max_per_site: 4,
            max_rtt_ms: 150.0,
            headroom: 1.1,
        }
    }
}

impl WorldParams {
    /// Refuses parameters out of range, naming the parameter.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            (1..=MAX_MAP_UNITS).contains(&self.map_units),
            "map_units must be in 1..={MAX_MAP_UNITS}, got {}",
            self.map_units
        );
        ensure!(
            (1..=MAX_WORLD_CLUSTERS).contains(&self.clusters),
            "clusters must be in 1..={MAX_WORLD_CLUSTERS}, got {}",
            self.clusters
        );
        ensure!(
            (1..=MAX_CANDIDATES_CEILING).contains(&self.candidates),
            "candidates must be in 1..={MAX_CANDIDATES_CEILING}, got {}",
            self.candidates
        );
        ensure!(
            self.max_per_site >= 1,
            "max_per_site must be at least 1, got {}",
            self.max_per_site
        );
        ensure!(
            self.max_rtt_ms.is_finite() && self.max_rtt_ms > 0.0,
            "max_rtt_ms must be a finite number > 0, got {}",
            self.max_rtt_ms
        );
        ensure!(
            self.headroom.is_finite() && self.headroom > 0.0,
            "headroom must be a finite number > 0, got {}",
            self.headroom
        );
        Ok(())
    }
}

/// Generates a world (see the module documentation). `progress` is called now and then with the
/// number of map units generated so far, and once at the end with `params.map_units`.
/// Deterministic given `params`.
pub fn generate(params: &WorldParams, progress: &dyn Fn(usize)) -> Result<Topology> {
    params.validate()?;
    let cities = cities()?;
    let sites = sites()?;
    let clusters = layout_clusters(&sites, params.clusters);
    let used_sites = params.clusters.min(sites.len());
    let index = SiteIndex::new(&sites[..used_sites], &clusters);
    let coordinates: Vec<(f64, f64)> = cities.iter().map(|c| (c.lat, c.lon)).collect();
    let lists = shortlists(&coordinates, &index.xyz, &index.sizes(), params);

    // Pass 1: place the prefixes, and total the demand per class (replaying the demand stream
    // in pass 2 gives the same numbers) so that capacity can be sized against it exactly.
    let placement = Placement::draw(&cities, &lists, used_sites, params);
    let specs = cluster_specs(
        &clusters,
        &sites,
        &placement.voronoi_population,
        &placement.class_demand,
        params,
    );
    let limits = Limits {
        max_candidates: params.candidates.max(DEFAULT_MAX_CANDIDATES),
    };
    let mut builder = TopologyBuilder::new(traffic_classes(), specs, limits)?;
    // One prefix per unit.
    builder.reserve(
        params.map_units,
        placement.reserve_candidates,
        params.map_units,
    );

    // Pass 2: the map units, streamed into the builder.
    let ids: Vec<String> = clusters.iter().map(|c| c.id.clone()).collect();
    let pass = UnitPass {
        params,
        cities: &cities,
        index: &index,
        lists: &lists,
        ids: &ids,
        placement: &placement,
    };
    let done = pass.push_all(&mut builder, progress)?;
    let instance = builder.finish()?;
    progress(done);
    Ok(instance)
}
