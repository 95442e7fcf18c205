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
//! prefix share one computation.
//!
//! Everything is deterministic given [`WorldParams`]: each purpose draws from its own ChaCha8
//! stream seeded from `seed` (floating-point results are the platform's `libm`'s).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{bail, ensure, Context, Result};
use cdnmap_mapper::model::{DEFAULT_MAX_CANDIDATES, MAX_CANDIDATES_CEILING, MAX_MAP_UNITS};
use cdnmap_mapper::{
    CandidateSpec, ClusterSpec, ClusterState, Instance, InstanceBuilder, Limits, MapUnitSpec,
    PerUnit, ResourceKind, ResourceNodeSpec, TrafficClass, UnitIdx,
};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// `data/cities.csv`: cities of at least 100,000 people (GeoNames, CC BY 4.0).
pub const CITIES_CSV: &str = include_str!("../../data/cities.csv");
/// `data/pop-sites.csv`: 240 edge sites at the airports of the most populous metros.
pub const SITES_CSV: &str = include_str!("../../data/pop-sites.csv");

/// Mean Earth radius (IUGG), km.
pub const EARTH_RADIUS_KM: f64 = 6371.0088;
/// Fibre routes are longer than the great circle by about this factor.
pub const ROUTE_INFLATION: f64 = 1.5;
/// Light in fibre covers about 200 km per ms (refractive index ~1.5).
pub const FIBRE_KM_PER_MS: f64 = 200.0;
/// Fixed RTT overhead (last mile, queueing, server), ms.
pub const RTT_BASE_MS: f64 = 2.0;

/// At most this many clusters in a generated world: keeps every cluster's two IPv4 addresses
/// unique within 198.18.0.0/15.
pub const MAX_WORLD_CLUSTERS: usize = 1 << 16;
/// A map unit lies within this distance of its city's centre.
pub const UNIT_JITTER_KM: f64 = 5.0;
/// Salt of the per-prefix rendezvous order of a site's clusters.
const SITE_CHOICE_SALT: u64 = 0x5EED_5173_C40C_E000;
/// A site's clusters in one candidate list differ in score by less than this, ms (they come in the
/// prefix's rendezvous order).
pub const SITE_SPREAD_MS: f64 = 0.1;
/// Share of prefixes that are IPv6 /48s.
pub const V6_SHARE: f64 = 0.10;
/// One unit of demand per this many inhabitants.
pub const PEOPLE_PER_DEMAND_UNIT: f64 = 1000.0;
/// σ of the lognormal (mean 1) noise on each map unit's demand.
pub const DEMAND_SIGMA: f64 = 0.4;
/// σ of the lognormal uplink factor drawn per country.
pub const COUNTRY_SIGMA: f64 = 0.05;
/// σ of the lognormal uplink factor drawn per site.
pub const SITE_SIGMA: f64 = 0.1;
/// Clamp on the product of the country and site factors.
pub const REGION_FACTOR_MIN: f64 = 0.5;
/// Clamp on the product of the country and site factors.
pub const REGION_FACTOR_MAX: f64 = 2.0;
/// σ of the lognormal factor on each cluster's uplink and cpu (clamped to [0.7, 1.4]).
pub const CLUSTER_SIGMA: f64 = 0.1;
/// σ of the lognormal factor on each class's part of a cluster's cpu.
pub const LEAF_SIGMA: f64 = 0.45;
/// Each class leaf gets this share of its cluster's cpu on top of its part.
pub const LEAF_MARGIN: f64 = 0.05;

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

// ---------------------------------------------------------------------------------------------
// Traffic classes

struct ClassDef {
    name: &'static str,
    priority: u32,
    bps: f64,
    fps: f64,
    /// Share of a prefix's demand.
    share: f64,
}

const CLASSES: [ClassDef; 3] = [
    ClassDef {
        name: "web",
        priority: 1,
        bps: 1.0,
        fps: 0.5,
        share: 0.5,
    },
    ClassDef {
        name: "video",
        priority: 2,
        bps: 4.0,
        fps: 0.25,
        share: 0.35,
    },
    ClassDef {
        name: "apps",
        priority: 0,
        bps: 0.25,
        fps: 1.0,
        share: 0.15,
    },
];

/// Indices into [`CLASSES`] in name order: the order of one prefix's map units.
const ID_ORDER: [usize; 3] = [2, 1, 0];

/// The world's traffic classes: web, video and apps.
pub fn traffic_classes() -> Vec<TrafficClass> {
    CLASSES
        .iter()
        .map(|c| TrafficClass {
            name: c.name.to_string(),
            priority: c.priority,
            per_unit: PerUnit {
                bps: c.bps,
                fps: c.fps,
            },
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Reference data

/// A row of `data/cities.csv`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct City {
    pub geonameid: u64,
    pub name: String,
    /// ISO 3166-1 alpha-2 code.
    pub country: String,
    pub lat: f64,
    pub lon: f64,
    pub population: u64,
    /// IANA time zone.
    pub timezone: String,
}

/// A row of `data/pop-sites.csv`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Site {
    /// IATA code of the site's airport.
    pub iata: String,
    pub metro: String,
    pub country: String,
    pub lat: f64,
    pub lon: f64,
    pub timezone: String,
    pub metro_population: u64,
}

fn parse_csv<T: DeserializeOwned>(what: &str, text: &str) -> Result<Vec<T>> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    reader
        .deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("{what}: record {}", i + 1)))
        .collect()
}

fn check_coordinates(what: &str, lat: f64, lon: f64) -> Result<()> {
    ensure!(
        lat.is_finite() && (-90.0..=90.0).contains(&lat),
        "{what}: latitude {lat} out of range"
    );
    ensure!(
        lon.is_finite() && (-180.0..=180.0).contains(&lon),
        "{what}: longitude {lon} out of range"
    );
    Ok(())
}

/// The embedded cities, validated (coordinates in range, population > 0).
pub fn cities() -> Result<Vec<City>> {
    let cities: Vec<City> = parse_csv("data/cities.csv", CITIES_CSV)?;
    ensure!(!cities.is_empty(), "data/cities.csv: no cities");
    ensure!(
        cities.len() <= usize::from(u16::MAX),
        "data/cities.csv: more than {} cities",
        u16::MAX
    );
    for c in &cities {
        check_coordinates(&format!("data/cities.csv: {}", c.name), c.lat, c.lon)?;
        ensure!(
            c.population > 0,
            "data/cities.csv: {} has no population",
            c.name
        );
    }
    Ok(cities)
}

/// The embedded edge sites, validated (coordinates in range, distinct IATA codes), most populous
/// metro first (ties by IATA code).
pub fn sites() -> Result<Vec<Site>> {
    let mut sites: Vec<Site> = parse_csv("data/pop-sites.csv", SITES_CSV)?;
    ensure!(!sites.is_empty(), "data/pop-sites.csv: no sites");
    for s in &sites {
        check_coordinates(&format!("data/pop-sites.csv: {}", s.iata), s.lat, s.lon)?;
        ensure!(
            !s.iata.is_empty() && s.iata.chars().all(|ch| ch.is_ascii_alphanumeric()),
            "data/pop-sites.csv: bad IATA code {:?}",
            s.iata
        );
    }
    sites.sort_by(|a, b| {
        b.metro_population
            .cmp(&a.metro_population)
            .then_with(|| a.iata.cmp(&b.iata))
    });
    if let Some(w) = sites
        .windows(2)
        .find(|w| w[0].iata.eq_ignore_ascii_case(&w[1].iata))
    {
        bail!("data/pop-sites.csv: duplicate IATA code {:?}", w[0].iata);
    }
    let mut codes: Vec<String> = sites.iter().map(|s| s.iata.to_ascii_lowercase()).collect();
    codes.sort();
    if let Some(w) = codes.windows(2).find(|w| w[0] == w[1]) {
        bail!("data/pop-sites.csv: duplicate IATA code {:?}", w[0]);
    }
    Ok(sites)
}

// ---------------------------------------------------------------------------------------------
// Geometry

/// Great-circle distance in km (haversine formula, mean Earth radius).
pub fn distance_km(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let dp = p2 - p1;
    let dl = (lon2 - lon1).to_radians();
    let a = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_KM * a.sqrt().min(1.0).asin()
}

/// RTT estimate for a great-circle distance: `RTT_BASE_MS + 2 × km × ROUTE_INFLATION /
/// FIBRE_KM_PER_MS`, i.e. 2 ms plus 0.015 ms per km (London–New York, 5,570 km: about 85.6 ms).
pub fn rtt_from_km(km: f64) -> f64 {
    RTT_BASE_MS + 2.0 * km * ROUTE_INFLATION / FIBRE_KM_PER_MS
}

/// RTT estimate in ms between two points: [`rtt_from_km`] of their haversine [`distance_km`].
pub fn rtt_ms(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    rtt_from_km(distance_km(lat1, lon1, lat2, lon2))
}

/// A point as a unit vector: the chord between two of them gives the same distance as the
/// haversine formula (`d = 2R asin(chord / 2)`), with one `asin` per pair.
fn unit_vector(lat: f64, lon: f64) -> [f64; 3] {
    let (p, l) = (lat.to_radians(), lon.to_radians());
    [p.cos() * l.cos(), p.cos() * l.sin(), p.sin()]
}

fn chord2(a: &[f64; 3], b: &[f64; 3]) -> f64 {
    let (x, y, z) = (a[0] - b[0], a[1] - b[1], a[2] - b[2]);
    x * x + y * y + z * z
}

fn chord2_to_km(c2: f64) -> f64 {
    2.0 * EARTH_RADIUS_KM * (c2.sqrt() / 2.0).min(1.0).asin()
}

/// A uniformly random point within `radius_km` of (lat, lon) (flat approximation, fine at a few
/// km; longitude wrapped, latitude clamped).
fn jitter(rng: &mut ChaCha8Rng, lat: f64, lon: f64, radius_km: f64) -> (f64, f64) {
    let r = radius_km * rng.random::<f64>().sqrt();
    let theta = std::f64::consts::TAU * rng.random::<f64>();
    let km_per_deg = EARTH_RADIUS_KM.to_radians();
    let new_lat = (lat + r * theta.cos() / km_per_deg).clamp(-90.0, 90.0);
    let mut new_lon = lon + r * theta.sin() / (km_per_deg * lat.to_radians().cos().max(0.01));
    if new_lon > 180.0 {
        new_lon -= 360.0;
    } else if new_lon < -180.0 {
        new_lon += 360.0;
    }
    (new_lat, new_lon.clamp(-180.0, 180.0))
}

// ---------------------------------------------------------------------------------------------
// Randomness

/// Independent random streams, one per purpose, so that changing how one part draws does not
/// change the others.
mod stream {
    pub const CAPACITY: u64 = 2;
    pub const PREFIX_CITY: u64 = 3;
    pub const DEMAND: u64 = 4;
    pub const UNIT_LOCATION: u64 = 5;
    pub const PREFIX_FAMILY: u64 = 6;
}

fn rng_for(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A lognormal draw with median 1.
fn lognormal(rng: &mut ChaCha8Rng, sigma: f64) -> f64 {
    (sigma * normal(rng)).exp()
}

// ---------------------------------------------------------------------------------------------
// Prefixes

/// IPv4 blocks never allocated to map units: private, loopback, link-local, CGNAT, benchmarking
/// (used for cluster addresses), documentation; everything from 224.0.0.0 on is skipped too.
const V4_RESERVED: [(u32, u8); 11] = [
    (0x0A00_0000, 8),  // 10.0.0.0/8
    (0x6440_0000, 10), // 100.64.0.0/10
    (0x7F00_0000, 8),  // 127.0.0.0/8
    (0xA9FE_0000, 16), // 169.254.0.0/16
    (0xAC10_0000, 12), // 172.16.0.0/12
    (0xC000_0000, 24), // 192.0.0.0/24
    (0xC000_0200, 24), // 192.0.2.0/24
    (0xC0A8_0000, 16), // 192.168.0.0/16
    (0xC612_0000, 15), // 198.18.0.0/15
    (0xC633_6400, 24), // 198.51.100.0/24
    (0xCB00_7100, 24), // 203.0.113.0/24
];
/// 224.0.0.0: multicast and above.
const V4_END: u32 = 0xE000_0000;

/// Hands out /24s and /48s in order.
struct PrefixAllocator {
    /// Network address of the next /24 to consider.
    next_v4: u64,
    /// Index of the next /48 within 2a00::/12.
    next_v6: u64,
}

impl PrefixAllocator {
    fn new() -> Self {
        PrefixAllocator {
            next_v4: 0x0100_0000, // 1.0.0.0
            next_v6: 0,
        }
    }

    fn v4(&mut self) -> Result<IpNet> {
        loop {
            ensure!(
                self.next_v4 < u64::from(V4_END),
                "IPv4 unicast space exhausted: too many map units"
            );
            let addr = self.next_v4 as u32;
            let reserved = V4_RESERVED.iter().find(|&&(net, len)| {
                let mask = u32::MAX << (32 - u32::from(len));
                addr & mask == net
            });
            match reserved {
                Some(&(net, len)) => self.next_v4 = u64::from(net) + (1u64 << (32 - len)),
                None => {
                    self.next_v4 += 256;
                    return Ok(IpNet::V4(Ipv4Net::new(Ipv4Addr::from(addr), 24)?));
                }
            }
        }
    }

    fn v6(&mut self) -> Result<IpNet> {
        ensure!(
            self.next_v6 < 1 << 36,
            "2a00::/12 exhausted: too many map units"
        );
        let addr = (0x2a00u128 << 112) | (u128::from(self.next_v6) << 80);
        self.next_v6 += 1;
        Ok(IpNet::V6(Ipv6Net::new(Ipv6Addr::from(addr), 48)?))
    }
}

// ---------------------------------------------------------------------------------------------
// Clusters

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
struct GenCluster {
    id: String,
    /// Index into the used sites.
    site: usize,
    lat: f64,
    lon: f64,
}

/// The clusters, at their sites, sorted by id (so that a position here is the builder's cluster
/// index).
fn layout_clusters(sites: &[Site], k: usize) -> Vec<GenCluster> {
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
fn cluster_addresses(j: usize) -> Vec<IpAddr> {
    let base = 0xC612_0000u32 + 2 * (j as u32 % (1 << 16));
    vec![
        IpAddr::V4(Ipv4Addr::from(base)),
        IpAddr::V4(Ipv4Addr::from(base + 1)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, j as u16, 0, 0, 0, 1)),
    ]
}

fn resource_tree(uplink: f64, cpu: f64, leaves: [f64; 3]) -> Vec<ResourceNodeSpec> {
    let mut nodes = vec![
        ResourceNodeSpec {
            name: "uplink".into(),
            kind: ResourceKind::Bps,
            capacity: uplink,
            classes: vec![],
            children: vec!["cpu".into()],
        },
        ResourceNodeSpec {
            name: "cpu".into(),
            kind: ResourceKind::Fps,
            capacity: cpu,
            classes: vec![],
            children: CLASSES.iter().map(|c| c.name.to_string()).collect(),
        },
    ];
    for (class, capacity) in CLASSES.iter().zip(leaves) {
        nodes.push(ResourceNodeSpec {
            name: class.name.into(),
            kind: ResourceKind::Fps,
            capacity,
            classes: vec![class.name.into()],
            children: vec![],
        });
    }
    nodes
}

/// Sizes the clusters (see the module documentation) against the demand per class.
fn cluster_specs(
    clusters: &[GenCluster],
    sites: &[Site],
    voronoi_population: &[f64],
    class_demand: &[f64; 3],
    params: &WorldParams,
) -> Vec<ClusterSpec> {
    let mut rng = rng_for(params.seed, stream::CAPACITY);
    let used = voronoi_population.len();
    // One factor per country, drawn in country-code order; then one per site.
    let mut country: BTreeMap<&str, f64> = BTreeMap::new();
    for s in &sites[..used] {
        country.insert(&s.country, 1.0);
    }
    for f in country.values_mut() {
        *f = lognormal(&mut rng, COUNTRY_SIGMA);
    }
    let region: Vec<f64> = sites[..used]
        .iter()
        .map(|s| {
            let f = country[s.country.as_str()] * lognormal(&mut rng, SITE_SIGMA);
            f.clamp(REGION_FACTOR_MIN, REGION_FACTOR_MAX)
        })
        .collect();
    let mut per_site = vec![0usize; used];
    for c in clusters {
        per_site[c.site] += 1;
    }
    let mut raw = Vec::with_capacity(clusters.len());
    let (mut sum_uplink, mut sum_cpu) = (0.0, 0.0);
    for c in clusters {
        let w = voronoi_population[c.site] / per_site[c.site] as f64;
        let u = w * region[c.site] * lognormal(&mut rng, CLUSTER_SIGMA).clamp(0.7, 1.4);
        let f = w * lognormal(&mut rng, CLUSTER_SIGMA).clamp(0.7, 1.4);
        let leaf: [f64; 3] = std::array::from_fn(|_| lognormal(&mut rng, LEAF_SIGMA));
        sum_uplink += u;
        sum_cpu += f;
        raw.push((u, f, leaf));
    }
    let bps_cost: f64 = CLASSES
        .iter()
        .zip(class_demand)
        .map(|(c, d)| c.bps * d)
        .sum();
    let fps_cost: f64 = CLASSES
        .iter()
        .zip(class_demand)
        .map(|(c, d)| c.fps * d)
        .sum();
    let fps_share: [f64; 3] = std::array::from_fn(|k| {
        if fps_cost > 0.0 {
            CLASSES[k].fps * class_demand[k] / fps_cost
        } else {
            1.0 / 3.0
        }
    });
    let scale = |total: f64, sum: f64| {
        if sum > 0.0 {
            params.headroom * total / sum
        } else {
            0.0
        }
    };
    let (uplink_scale, cpu_scale) = (scale(bps_cost, sum_uplink), scale(fps_cost, sum_cpu));
    clusters
        .iter()
        .zip(raw)
        .enumerate()
        .map(|(j, (c, (u, f, leaf)))| {
            let cpu = f * cpu_scale;
            // The cpu split by share × leaf factor, plus LEAF_MARGIN of it each.
            let weight: f64 = (0..3).map(|k| fps_share[k] * leaf[k]).sum();
            let leaves = std::array::from_fn(|k| {
                let split = if weight > 0.0 {
                    fps_share[k] * leaf[k] / weight
                } else {
                    1.0 / 3.0
                };
                cpu * (LEAF_MARGIN + split).min(1.0)
            });
            ClusterSpec {
                id: c.id.clone(),
                lat: c.lat,
                lon: c.lon,
                addresses: cluster_addresses(j),
                state: ClusterState::Up,
                serves: None,
                resources: resource_tree(u * uplink_scale, cpu, leaves),
            }
        })
        .collect()
}

/// Per city, the sites whose clusters can be candidates of a map unit at any point within
/// [`UNIT_JITTER_KM`] of it, and the city's nearest site.
struct Shortlists {
    start: Vec<u32>,
    sites: Vec<u32>,
    nearest_site: Vec<u32>,
    /// An upper bound on the candidate count of a map unit in the city (for `reserve`).
    candidate_bound: Vec<u8>,
}

impl Shortlists {
    fn of(&self, city: usize) -> &[u32] {
        &self.sites[self.start[city] as usize..self.start[city + 1] as usize]
    }
}

/// `site_xyz` and `site_clusters` (the number of clusters at each) cover the used sites.
fn shortlists(
    cities: &[City],
    site_xyz: &[[f64; 3]],
    site_clusters: &[usize],
    params: &WorldParams,
) -> Shortlists {
    // A map unit takes at most `max_per_site` clusters of a site, scored from its distance to the
    // site (within UNIT_JITTER_KM of its city's) plus less than SITE_SPREAD_MS. Once the sites so
    // far offer `candidates` clusters, a site farther from the city than the last by more than
    // twice the jitter plus the spread (as km) scores worse than all of them (1 km covers
    // rounding).
    let margin =
        2.0 * UNIT_JITTER_KM + SITE_SPREAD_MS * FIBRE_KM_PER_MS / (2.0 * ROUTE_INFLATION) + 1.0;
    let max_km = (params.max_rtt_ms - RTT_BASE_MS) * FIBRE_KM_PER_MS / (2.0 * ROUTE_INFLATION);
    let mut out = Shortlists {
        start: Vec::with_capacity(cities.len() + 1),
        sites: Vec::new(),
        nearest_site: Vec::with_capacity(cities.len()),
        candidate_bound: Vec::with_capacity(cities.len()),
    };
    out.start.push(0);
    let mut order: Vec<(f64, usize)> = Vec::with_capacity(site_xyz.len());
    for city in cities {
        let p = unit_vector(city.lat, city.lon);
        order.clear();
        order.extend(
            site_xyz
                .iter()
                .enumerate()
                .map(|(s, q)| (chord2_to_km(chord2(&p, q)), s)),
        );
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        out.nearest_site.push(order[0].1 as u32);
        let mut offered = 0;
        let mut reachable = 0;
        let mut limit = f64::INFINITY;
        for &(d, s) in &order {
            if d > limit {
                break;
            }
            out.sites.push(s as u32);
            let n = site_clusters[s].min(params.max_per_site);
            offered += n;
            if d <= max_km + UNIT_JITTER_KM + 0.5 {
                reachable += n;
            }
            if offered >= params.candidates && limit.is_infinite() {
                limit = d + margin;
            }
        }
        out.start.push(out.sites.len() as u32);
        out.candidate_bound
            .push(reachable.clamp(1, params.candidates) as u8);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Generation

/// Demand of one map unit; draws one normal from `rng` (the demand stream).
fn unit_demand(
    rng: &mut ChaCha8Rng,
    city_population: u64,
    city_prefixes: u32,
    class: usize,
) -> f64 {
    let noise = lognormal(rng, DEMAND_SIGMA) * (-DEMAND_SIGMA * DEMAND_SIGMA / 2.0).exp();
    city_population as f64 / f64::from(city_prefixes.max(1)) / PEOPLE_PER_DEMAND_UNIT
        * CLASSES[class].share
        * noise
}

/// The classes (indices into [`CLASSES`], in id order) of prefix `p` out of `prefixes`.
fn prefix_classes(p: usize, prefixes: usize, map_units: usize) -> &'static [usize] {
    if p + 1 == prefixes && !map_units.is_multiple_of(3) {
        &ID_ORDER[..map_units % 3]
    } else {
        &ID_ORDER
    }
}

/// The splitmix64 finaliser: a well-mixed 64-bit hash of `z`.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of prefix `p`'s rendezvous order of clusters.
fn prefix_key(seed: u64, p: usize) -> u64 {
    mix64(mix64(seed ^ SITE_CHOICE_SALT).wrapping_add(p as u64))
}

/// Cluster `j`'s place in the rendezvous order of the prefix with key `key` (lower first).
fn rendezvous(key: u64, j: u32) -> u64 {
    mix64(key ^ u64::from(j).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The used sites: where they are and their clusters (indices, ascending).
struct SiteIndex {
    xyz: Vec<[f64; 3]>,
    clusters: Vec<Vec<u32>>,
}

impl SiteIndex {
    /// Appends to `near` (score, cluster index) the clusters of `sites` that the prefix with key
    /// `key` may use, seen from `xyz`: of each site, the first `max_per_site` in the prefix's
    /// rendezvous order, the `i`-th of them scored `RTT + i / max_per_site × SITE_SPREAD_MS`.
    fn eligible(
        &self,
        sites: &[u32],
        max_per_site: usize,
        key: u64,
        xyz: &[f64; 3],
        scratch: &mut Vec<(u64, u32)>,
        near: &mut Vec<(f64, u32)>,
    ) {
        for &s in sites {
            let s = s as usize;
            let rtt = rtt_from_km(chord2_to_km(chord2(xyz, &self.xyz[s])));
            let all = &self.clusters[s];
            if let [j] = all[..] {
                near.push((rtt, j));
                continue;
            }
            scratch.clear();
            scratch.extend(all.iter().map(|&j| (rendezvous(key, j), j)));
            let m = max_per_site.min(all.len());
            if all.len() > m {
                scratch.select_nth_unstable(m - 1);
            }
            scratch[..m].sort_unstable();
            near.extend(
                scratch[..m]
                    .iter()
                    .enumerate()
                    .map(|(i, &(_, j))| (rtt + SITE_SPREAD_MS * i as f64 / max_per_site as f64, j)),
            );
        }
    }
}

/// Generates a world (see the module documentation). `progress` is called now and then with the
/// number of map units generated so far, and once at the end with `params.map_units`.
/// Deterministic given `params`.
pub fn generate(params: &WorldParams, progress: &dyn Fn(usize)) -> Result<Instance> {
    params.validate()?;
    let cities = cities()?;
    let sites = sites()?;
    let clusters = layout_clusters(&sites, params.clusters);
    let used_sites = params.clusters.min(sites.len());
    let ids: Vec<String> = clusters.iter().map(|c| c.id.clone()).collect();
    let mut index = SiteIndex {
        xyz: sites[..used_sites]
            .iter()
            .map(|s| unit_vector(s.lat, s.lon))
            .collect(),
        clusters: vec![Vec::new(); used_sites],
    };
    for (j, c) in clusters.iter().enumerate() {
        index.clusters[c.site].push(j as u32);
    }
    let site_clusters: Vec<usize> = index.clusters.iter().map(Vec::len).collect();
    let lists = shortlists(&cities, &index.xyz, &site_clusters, params);

    // Pass 1: place the prefixes, and total the demand per class (replaying the demand stream
    // in pass 2 gives the same numbers) so that capacity can be sized against it exactly.
    let n = params.map_units;
    let prefixes = n.div_ceil(3);
    let mut cumulative = Vec::with_capacity(cities.len());
    let mut total_population = 0u64;
    for c in &cities {
        total_population += c.population;
        cumulative.push(total_population);
    }
    // Capacity follows the expected demand: a city's demand is its population if it gets a
    // prefix at all, which it does with probability 1 - (1 - population / total)^prefixes.
    let mut voronoi_population = vec![0.0; used_sites];
    for (city, &s) in cities.iter().zip(&lists.nearest_site) {
        let share = city.population as f64 / total_population as f64;
        let covered = -(prefixes as f64 * (-share).ln_1p()).exp_m1();
        voronoi_population[s as usize] += city.population as f64 * covered;
    }
    let mut rng = rng_for(params.seed, stream::PREFIX_CITY);
    let mut city_of_prefix: Vec<u16> = Vec::with_capacity(prefixes);
    let mut prefixes_in_city = vec![0u32; cities.len()];
    for _ in 0..prefixes {
        let x = rng.random_range(0..total_population);
        let city = cumulative.partition_point(|&c| c <= x);
        city_of_prefix.push(city as u16);
        prefixes_in_city[city] += 1;
    }
    let demand_rng = rng_for(params.seed, stream::DEMAND);
    let mut rng = demand_rng.clone();
    let mut class_demand = [0.0; 3];
    let mut reserve_candidates = 0usize;
    for (p, &city) in city_of_prefix.iter().enumerate() {
        let city = usize::from(city);
        let classes = prefix_classes(p, prefixes, n);
        for &k in classes {
            class_demand[k] +=
                unit_demand(&mut rng, cities[city].population, prefixes_in_city[city], k);
        }
        reserve_candidates += usize::from(lists.candidate_bound[city]) * classes.len();
    }

    let specs = cluster_specs(
        &clusters,
        &sites,
        &voronoi_population,
        &class_demand,
        params,
    );
    let limits = Limits {
        max_candidates: params.candidates.max(DEFAULT_MAX_CANDIDATES),
    };
    let mut builder = InstanceBuilder::new(traffic_classes(), specs, limits)?;
    builder.reserve(n, reserve_candidates);

    // Pass 2: the map units, streamed into the builder.
    let mut demand_rng = demand_rng;
    let mut location_rng = rng_for(params.seed, stream::UNIT_LOCATION);
    let mut family_rng = rng_for(params.seed, stream::PREFIX_FAMILY);
    let mut allocator = PrefixAllocator::new();
    let mut near: Vec<(f64, u32)> = Vec::new();
    let mut scratch: Vec<(u64, u32)> = Vec::new();
    let mut candidates: Vec<CandidateSpec<'_>> = Vec::with_capacity(params.candidates);
    let mut id = String::with_capacity(32);
    #[cfg(debug_assertions)]
    let mut previous_id = String::new();
    let mut done = 0usize;
    for (p, &city) in city_of_prefix.iter().enumerate() {
        let city = usize::from(city);
        let c = &cities[city];
        let (lat, lon) = jitter(&mut location_rng, c.lat, c.lon, UNIT_JITTER_KM);
        let prefix = if family_rng.random_bool(V6_SHARE) {
            allocator.v6()?
        } else {
            allocator.v4()?
        };

        // The nearest of the clusters the prefix may use (a site's clusters in the prefix's
        // rendezvous order), then those within reach.
        let xyz = unit_vector(lat, lon);
        near.clear();
        index.eligible(
            lists.of(city),
            params.max_per_site,
            prefix_key(params.seed, p),
            &xyz,
            &mut scratch,
            &mut near,
        );
        let by_score = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        if near.len() > params.candidates {
            near.select_nth_unstable_by(params.candidates - 1, by_score);
            near.truncate(params.candidates);
        }
        // Sorted, so that the builder's sort of each of the prefix's units is a linear pass.
        near.sort_unstable_by(by_score);
        candidates.clear();
        for &(rtt, j) in &near {
            // Compare as the builder will store it (f32), so stored scores respect the limit.
            if f64::from(rtt as f32) <= params.max_rtt_ms {
                candidates.push(CandidateSpec {
                    cluster: &ids[j as usize],
                    score: rtt,
                    cluster_rank: None,
                });
            } else {
                break;
            }
        }
        if candidates.is_empty() {
            // Nothing within reach: the single nearest cluster.
            if let Some(&(rtt, j)) = near.first() {
                candidates.push(CandidateSpec {
                    cluster: &ids[j as usize],
                    score: rtt,
                    cluster_rank: None,
                });
            }
        }

        for &k in prefix_classes(p, prefixes, n) {
            let demand = unit_demand(&mut demand_rng, c.population, prefixes_in_city[city], k);
            id.clear();
            write!(id, "u{p:08}-{}", CLASSES[k].name)?;
            #[cfg(debug_assertions)]
            {
                debug_assert!(
                    id > previous_id,
                    "map unit ids out of order: {previous_id} then {id}"
                );
                previous_id.clone_from(&id);
            }
            builder.push_unit(&MapUnitSpec {
                id: &id,
                class: CLASSES[k].name,
                demand,
                lat,
                lon,
                prefixes: std::slice::from_ref(&prefix),
                candidates: &candidates,
            })?;
            done += 1;
        }
        if p % 16_384 == 16_383 {
            progress(done);
        }
    }
    let instance = builder.finish()?;
    progress(done);
    Ok(instance)
}

/// The same world with every map unit's demand and every candidate's score multiplied by an
/// independent factor uniform in [1 − pct/100, 1 + pct/100] (`pct` in [0, 100]). Ids, classes,
/// locations, prefixes, candidate clusters, explicit cluster ranks and clusters are kept.
/// Deterministic given `seed`.
pub fn perturb(instance: &Instance, pct: f64, seed: u64) -> Result<Instance> {
    ensure!(
        pct.is_finite() && (0.0..=100.0).contains(&pct),
        "pct must be a percentage in [0, 100], got {pct}"
    );
    let classes = instance.classes();
    let specs = instance
        .clusters()
        .iter()
        .map(|c| ClusterSpec {
            id: c.id.clone(),
            lat: c.lat,
            lon: c.lon,
            addresses: c.addresses.clone(),
            state: c.state,
            serves: None,
            resources: c
                .nodes
                .iter()
                .map(|node| ResourceNodeSpec {
                    name: node.name.clone(),
                    kind: node.kind,
                    capacity: node.capacity,
                    classes: node
                        .classes
                        .iter()
                        .map(|&k| classes[usize::from(k)].name.clone())
                        .collect(),
                    children: node
                        .children
                        .iter()
                        .map(|&ch| c.nodes[ch as usize].name.clone())
                        .collect(),
                })
                .collect(),
        })
        .collect();
    let n = instance.unit_count();
    let most = (0..n as UnitIdx)
        .map(|u| instance.candidate_count(u))
        .max()
        .unwrap_or(0);
    let limits = Limits {
        max_candidates: most.clamp(DEFAULT_MAX_CANDIDATES, MAX_CANDIDATES_CEILING),
    };
    let mut builder = InstanceBuilder::new(classes.to_vec(), specs, limits)?;
    builder.reserve(n, instance.total_candidates());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (lo, hi) = (1.0 - pct / 100.0, 1.0 + pct / 100.0);
    let mut candidates: Vec<CandidateSpec<'_>> = Vec::new();
    for u in 0..n as UnitIdx {
        let factor = rng.random_range(lo..=hi);
        candidates.clear();
        for cand in instance.candidates(u) {
            let g = rng.random_range(lo..=hi);
            candidates.push(CandidateSpec {
                cluster: &instance.clusters()[cand.cluster as usize].id,
                score: f64::from(cand.score) * g,
                cluster_rank: cand.explicit_rank.then_some(f64::from(cand.rank)),
            });
        }
        let (lat, lon) = instance.unit_location(u);
        builder.push_unit(&MapUnitSpec {
            id: instance.unit_id(u),
            class: &classes[usize::from(instance.unit_class(u))].name,
            demand: instance.unit_demand(u) * factor,
            lat,
            lon,
            prefixes: instance.unit_prefixes(u),
            candidates: &candidates,
        })?;
    }
    Ok(builder.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::Candidate;

    fn small(seed: u64) -> WorldParams {
        WorldParams {
            map_units: 3_000,
            clusters: 50,
            seed,
            ..WorldParams::default()
        }
    }

    fn gen(params: &WorldParams) -> Instance {
        generate(params, &|_| {}).expect("generate")
    }

    #[test]
    fn id_order_is_name_order() {
        let names: Vec<&str> = ID_ORDER.iter().map(|&k| CLASSES[k].name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(names.len(), CLASSES.len());
    }

    #[test]
    fn data_parses() {
        let cities = cities().unwrap();
        assert_eq!(cities.len(), 6_204);
        let sites = sites().unwrap();
        assert_eq!(sites.len(), 240);
        assert!(sites
            .windows(2)
            .all(|w| w[0].metro_population >= w[1].metro_population));
    }

    #[test]
    fn deterministic() {
        let a = gen(&small(7));
        let b = gen(&small(7));
        assert_eq!(a, b);
        let c = gen(&small(8));
        assert_ne!(a, c);
    }

    #[test]
    fn sizes() {
        for (units, clusters) in [(3_000, 50), (3_001, 50), (3_002, 300), (1, 1), (10, 240)] {
            let params = WorldParams {
                map_units: units,
                clusters,
                ..small(1)
            };
            let inst = gen(&params);
            assert_eq!(inst.unit_count(), units);
            assert_eq!(inst.clusters().len(), clusters);
            for u in 0..units as UnitIdx {
                let n = inst.candidate_count(u);
                assert!(
                    (1..=params.candidates).contains(&n),
                    "unit {u}: {n} candidates"
                );
                assert_eq!(inst.unit_prefixes(u).len(), 1);
                assert!(inst.unit_demand(u) >= 0.0 && inst.unit_demand(u).is_finite());
            }
        }
        // 3,001 units: the last prefix carries only the first class in name order.
        let inst = gen(&WorldParams {
            map_units: 3_001,
            ..small(1)
        });
        assert_eq!(inst.unit_id(3_000), "u00001000-apps");
        assert_eq!(inst.unit_id(2_999), "u00000999-web");
    }

    #[test]
    fn cluster_ids_and_trees() {
        let inst = gen(&WorldParams {
            clusters: 300,
            ..small(3)
        });
        let ids: Vec<&str> = inst.clusters().iter().map(|c| c.id.as_str()).collect();
        assert!(
            ids.contains(&"sha-1") && ids.contains(&"sha-2"),
            "big metros get several"
        );
        assert!(ids.contains(&"mrs-1") && !ids.contains(&"mrs-2"));
        let mut addresses: Vec<IpAddr> = inst
            .clusters()
            .iter()
            .flat_map(|c| c.addresses.clone())
            .collect();
        let n = addresses.len();
        addresses.sort();
        addresses.dedup();
        assert_eq!(addresses.len(), n, "cluster addresses are unique");
        for c in inst.clusters() {
            assert_eq!(c.state, ClusterState::Up);
            assert_eq!(c.nodes.len(), 5);
            assert_eq!(
                (c.nodes[0].name.as_str(), c.nodes[0].kind),
                ("uplink", ResourceKind::Bps)
            );
            assert_eq!(
                (c.nodes[1].name.as_str(), c.nodes[1].kind),
                ("cpu", ResourceKind::Fps)
            );
            let cpu = c.nodes[1].capacity;
            let leaves: f64 = c.nodes[2..].iter().map(|n| n.capacity).sum();
            assert!(
                leaves > cpu,
                "{}: the leaves sum to more than the cpu: {:?}",
                c.id,
                c.nodes
            );
            assert!(c.nodes[2..]
                .iter()
                .all(|n| n.capacity <= cpu && n.capacity > 0.0));
            for k in 0..3 {
                assert!(c.serves(k));
            }
        }
    }

    #[test]
    fn capacity_matches_headroom() {
        let params = small(4);
        let inst = gen(&params);
        let mut bps = 0.0;
        let mut fps = 0.0;
        for u in 0..inst.unit_count() as UnitIdx {
            let per = inst.classes()[usize::from(inst.unit_class(u))].per_unit;
            bps += inst.unit_demand(u) * per.bps;
            fps += inst.unit_demand(u) * per.fps;
        }
        let uplink: f64 = inst.clusters().iter().map(|c| c.nodes[0].capacity).sum();
        let cpu: f64 = inst.clusters().iter().map(|c| c.nodes[1].capacity).sum();
        assert!(
            (uplink / bps - params.headroom).abs() < 1e-9,
            "{}",
            uplink / bps
        );
        assert!((cpu / fps - params.headroom).abs() < 1e-9, "{}", cpu / fps);
    }

    /// Capacity against the demand whose first choice is each cluster, as a whole (uplink, cpu)
    /// and at its tightest node (leaves too): it must vary, and some clusters must be
    /// oversubscribed, so that the solver rejects and evicts.
    #[test]
    fn regional_capacity_varies() {
        let inst = gen(&WorldParams {
            map_units: 30_000,
            clusters: 240,
            ..small(5)
        });
        // Per cluster: Bps, Fps, and the Fps of each class (in class order) of its first choosers.
        let mut first = vec![[0.0f64; 5]; inst.clusters().len()];
        for u in 0..inst.unit_count() as UnitIdx {
            let k = usize::from(inst.unit_class(u));
            let per = inst.classes()[k].per_unit;
            let c = inst.candidate(u, 0).cluster as usize;
            first[c][0] += inst.unit_demand(u) * per.bps;
            first[c][1] += inst.unit_demand(u) * per.fps;
            first[c][2 + k] += inst.unit_demand(u) * per.fps;
        }
        let (mut whole, mut tightest) = (Vec::new(), Vec::new());
        for (c, d) in inst.clusters().iter().zip(&first) {
            if d[0] <= 0.0 {
                continue;
            }
            let w = (c.nodes[0].capacity / d[0]).min(c.nodes[1].capacity / d[1]);
            let leaves = (0..3).map(|k| {
                let leaf = c.nodes.iter().find(|n| n.classes == [k as u16]).unwrap();
                leaf.capacity / d[2 + k]
            });
            whole.push(w);
            tightest.push(leaves.fold(w, f64::min));
        }
        let count = |v: &[f64], f: fn(f64) -> bool| v.iter().filter(|&&r| f(r)).count();
        let short = count(&whole, |r| r < 0.9);
        let roomy = count(&whole, |r| r > 1.2);
        let pinched = count(&tightest, |r| r < 0.7);
        assert!(
            short >= 10 && roomy >= 10 && pinched >= 10,
            "short {short}, roomy {roomy}, a node pinched {pinched} of {}",
            whole.len()
        );
    }

    /// Brute force over all clusters: unit `u`'s eligible clusters (of each site, the first
    /// `max_per_site` in its prefix's rendezvous order) as (score, cluster index), best first.
    fn brute_force(inst: &Instance, params: &WorldParams, u: UnitIdx) -> Vec<(f64, u32)> {
        let p: usize = inst.unit_id(u)[1..9].parse().unwrap();
        let key = prefix_key(params.seed, p);
        let (lat, lon) = inst.unit_location(u);
        let mut by_site: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for (j, c) in inst.clusters().iter().enumerate() {
            let site = c.id.split('-').next().unwrap();
            by_site.entry(site).or_default().push(j as u32);
        }
        let mut all = Vec::new();
        for mut js in by_site.into_values() {
            js.sort_by_key(|&j| (rendezvous(key, j), j));
            for (i, &j) in js.iter().take(params.max_per_site).enumerate() {
                let c = &inst.clusters()[j as usize];
                let spread = SITE_SPREAD_MS * i as f64 / params.max_per_site as f64;
                all.push((rtt_ms(lat, lon, c.lat, c.lon) + spread, j));
            }
        }
        all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        all
    }

    #[test]
    fn candidates_are_the_nearest_within_reach() {
        // 600 clusters: big sites have several, so the per-site limit binds.
        let params = WorldParams {
            clusters: 600,
            max_rtt_ms: 10.0,
            candidates: 8,
            max_per_site: 2,
            ..small(6)
        };
        let inst = gen(&params);
        let site = |j: u32| {
            let id = &inst.clusters()[j as usize].id;
            id[..id.find('-').unwrap()].to_string()
        };
        let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
        for j in 0..inst.clusters().len() as u32 {
            *sizes.entry(site(j)).or_default() += 1;
        }
        let (mut fallbacks, mut limited) = (0, 0);
        for u in (0..inst.unit_count() as UnitIdx).step_by(7) {
            let all = brute_force(&inst, &params, u);
            let got: Vec<Candidate> = inst.candidates(u).collect();
            // Scores are from the f64 location; the stored location is f32.
            for (i, cand) in got.iter().enumerate() {
                assert!(
                    (f64::from(cand.score) - all[i].0).abs() < 1e-3,
                    "unit {u} #{i}"
                );
            }
            let want: Vec<(f64, u32)> = all
                .iter()
                .take(params.candidates)
                .filter(|(r, _)| *r <= params.max_rtt_ms - 1e-3)
                .copied()
                .collect();
            if want.is_empty() {
                fallbacks += 1;
                assert_eq!(got.len(), 1);
                assert_eq!(got[0].cluster, all[0].1, "unit {u}: fallback is the best");
                continue;
            }
            // Equal unless a cluster sits within float noise of the limit.
            assert!(got.len() >= want.len(), "unit {u}");
            for (i, &(score, j)) in want.iter().enumerate() {
                let tie = |k: usize| want.get(k).is_some_and(|w| (w.0 - score).abs() < 1e-3);
                assert!(
                    got[i].cluster == j || tie(i + 1) || (i > 0 && tie(i - 1)),
                    "unit {u} #{i}"
                );
            }
            let mut per_site: BTreeMap<String, usize> = BTreeMap::new();
            for cand in &got {
                *per_site.entry(site(cand.cluster)).or_default() += 1;
            }
            assert!(per_site.values().all(|&n| n <= params.max_per_site));
            // Limited: without the limit, more clusters of a site would precede the last one.
            let last = site(got[got.len() - 1].cluster);
            if per_site
                .iter()
                .any(|(s, &n)| n == params.max_per_site && sizes[s] > n && *s != last)
            {
                limited += 1;
            }
            for cand in &got {
                assert!(f64::from(cand.score) <= params.max_rtt_ms);
            }
        }
        assert!(fallbacks > 0, "10 ms leaves some units out of reach");
        assert!(limited > 0, "the per-site limit binds");
    }

    /// Candidate lists span several sites, and a big site's clusters share its load.
    #[test]
    fn lists_span_sites_and_big_sites_spread() {
        let params = WorldParams {
            map_units: 60_000,
            clusters: 1_000,
            ..small(12)
        };
        let inst = gen(&params);
        let site = |j: u32| {
            let id = &inst.clusters()[j as usize].id;
            id[..id.find('-').unwrap()].to_string()
        };
        let mut first_at_sha: BTreeMap<u32, usize> = BTreeMap::new();
        let mut sites_in_lists = 0;
        for u in 0..inst.unit_count() as UnitIdx {
            let mut sites: Vec<String> = inst.candidates(u).map(|c| site(c.cluster)).collect();
            let n = sites.len();
            sites.sort();
            sites.dedup();
            assert!(
                sites.len() * params.max_per_site >= n,
                "unit {u}: {n} candidates at {} sites",
                sites.len()
            );
            sites_in_lists += sites.len();
            let first = inst.candidate(u, 0).cluster;
            if site(first) == "sha" {
                *first_at_sha.entry(first).or_default() += 1;
            }
        }
        let mean_sites = sites_in_lists as f64 / inst.unit_count() as f64;
        assert!(mean_sites >= 4.0, "{mean_sites} sites per list");
        let sha = inst
            .clusters()
            .iter()
            .filter(|c| c.id.starts_with("sha-"))
            .count();
        assert!(sha >= 20, "{sha} clusters at Shanghai");
        assert_eq!(
            first_at_sha.len(),
            sha,
            "every Shanghai cluster is someone's first choice"
        );
    }

    #[test]
    fn scores_within_limit_except_fallback() {
        let params = small(9);
        let inst = gen(&params);
        for u in 0..inst.unit_count() as UnitIdx {
            let n = inst.candidate_count(u);
            for cand in inst.candidates(u) {
                assert!(
                    f64::from(cand.score) <= params.max_rtt_ms || n == 1,
                    "unit {u}: score {}",
                    cand.score
                );
            }
        }
    }

    #[test]
    fn ids_unique_sorted_and_prefixes() {
        let inst = gen(&WorldParams {
            map_units: 6_000,
            ..small(2)
        });
        let ids: Vec<&str> = (0..inst.unit_count() as UnitIdx)
            .map(|u| inst.unit_id(u))
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(ids[0], "u00000000-apps");
        let mut prefixes: Vec<IpNet> = (0..inst.unit_count() as UnitIdx)
            .step_by(3)
            .map(|u| inst.unit_prefixes(u)[0])
            .collect();
        let v6 = prefixes
            .iter()
            .filter(|p| matches!(p, IpNet::V6(_)))
            .count();
        assert!((120..=280).contains(&v6), "{v6} IPv6 prefixes of 2,000");
        let first_v4 = prefixes.iter().find(|p| matches!(p, IpNet::V4(_))).unwrap();
        assert_eq!(first_v4.to_string(), "1.0.0.0/24");
        let space: IpNet = "2a00::/12".parse().unwrap();
        for p in &prefixes {
            match p {
                IpNet::V4(n) => {
                    assert_eq!(n.prefix_len(), 24);
                    for (net, len) in V4_RESERVED {
                        let r = Ipv4Net::new(Ipv4Addr::from(net), len).unwrap();
                        assert!(!r.contains(n), "{n} in {r}");
                    }
                }
                IpNet::V6(n) => {
                    assert_eq!(n.prefix_len(), 48);
                    assert!(space.contains(p));
                }
            }
        }
        let n = prefixes.len();
        prefixes.sort();
        prefixes.dedup();
        assert_eq!(prefixes.len(), n, "prefixes are unique");
        // Map units of one prefix share its prefix and location.
        assert_eq!(inst.unit_prefixes(0), inst.unit_prefixes(2));
        assert_eq!(inst.unit_location(0), inst.unit_location(2));
    }

    #[test]
    fn v4_allocator_skips_reserved() {
        let mut a = PrefixAllocator::new();
        a.next_v4 = 0x09FF_FF00; // 9.255.255.0
        assert_eq!(a.v4().unwrap().to_string(), "9.255.255.0/24");
        assert_eq!(a.v4().unwrap().to_string(), "11.0.0.0/24");
        a.next_v4 = 0xC611_FF00; // 198.17.255.0
        assert_eq!(a.v4().unwrap().to_string(), "198.17.255.0/24");
        assert_eq!(a.v4().unwrap().to_string(), "198.20.0.0/24");
        a.next_v4 = 0xDFFF_FF00;
        assert_eq!(a.v4().unwrap().to_string(), "223.255.255.0/24");
        assert!(a.v4().is_err());
        let mut b = PrefixAllocator::new();
        assert_eq!(b.v6().unwrap().to_string(), "2a00::/48");
        assert_eq!(b.v6().unwrap().to_string(), "2a00:0:1::/48");
    }

    #[test]
    fn haversine_sanity() {
        let (lon_lat, lon_lon, ny_lat, ny_lon) = (51.5074, -0.1278, 40.7128, -74.0060);
        let d = distance_km(lon_lat, lon_lon, ny_lat, ny_lon);
        assert!((5_540.0..5_600.0).contains(&d), "{d}");
        let rtt = rtt_ms(lon_lat, lon_lon, ny_lat, ny_lon);
        assert!((70.0..100.0).contains(&rtt), "{rtt}");
        assert_eq!(rtt, rtt_ms(ny_lat, ny_lon, lon_lat, lon_lon));
        assert_eq!(rtt_ms(10.0, 20.0, 10.0, 20.0), RTT_BASE_MS);
        let half = distance_km(0.0, 0.0, 0.0, 180.0);
        assert!((half - std::f64::consts::PI * EARTH_RADIUS_KM).abs() < 1e-6);
        // The chord form used on the hot path agrees with the haversine form.
        for &(a, b, c, e) in &[
            (51.5, -0.1, 40.7, -74.0),
            (1.0, 2.0, 1.0001, 2.0001),
            (-33.9, 151.2, 35.7, 139.7),
        ] {
            let fast = chord2_to_km(chord2(&unit_vector(a, b), &unit_vector(c, e)));
            assert!((fast - distance_km(a, b, c, e)).abs() < 1e-6, "{fast}");
        }
    }

    #[test]
    fn perturb_keeps_structure() {
        let inst = gen(&small(11));
        assert_eq!(
            perturb(&inst, 0.0, 1).unwrap(),
            inst,
            "0% rebuilds the same instance"
        );
        let pct = 10.0;
        let p = perturb(&inst, pct, 42).unwrap();
        assert_eq!(p, perturb(&inst, pct, 42).unwrap());
        assert_ne!(p, perturb(&inst, pct, 43).unwrap());
        assert_eq!(p.clusters(), inst.clusters());
        assert_eq!(p.classes(), inst.classes());
        assert_eq!(p.unit_count(), inst.unit_count());
        let tol = 1e-6;
        let (lo, hi) = (1.0 - pct / 100.0 - tol, 1.0 + pct / 100.0 + tol);
        let mut changed = 0;
        for u in 0..inst.unit_count() as UnitIdx {
            assert_eq!(p.unit_id(u), inst.unit_id(u));
            assert_eq!(p.unit_class(u), inst.unit_class(u));
            assert_eq!(p.unit_prefixes(u), inst.unit_prefixes(u));
            assert_eq!(p.unit_location(u), inst.unit_location(u));
            let r = p.unit_demand(u) / inst.unit_demand(u);
            assert!((lo..=hi).contains(&r), "demand ratio {r}");
            let mut before: Vec<(u32, f32)> =
                inst.candidates(u).map(|c| (c.cluster, c.score)).collect();
            let mut after: Vec<(u32, f32)> =
                p.candidates(u).map(|c| (c.cluster, c.score)).collect();
            before.sort_by_key(|c| c.0);
            after.sort_by_key(|c| c.0);
            assert_eq!(before.len(), after.len());
            for (b, a) in before.iter().zip(&after) {
                assert_eq!(a.0, b.0);
                let r = f64::from(a.1) / f64::from(b.1);
                assert!((lo..=hi).contains(&r), "score ratio {r}");
            }
            if inst
                .candidates(u)
                .map(|c| c.cluster)
                .ne(p.candidates(u).map(|c| c.cluster))
            {
                changed += 1;
            }
        }
        assert!(changed > 0, "some preference orders change");
        assert!(perturb(&inst, -1.0, 1).is_err());
        assert!(perturb(&inst, f64::NAN, 1).is_err());
        assert!(perturb(&inst, 101.0, 1).is_err());
    }

    #[test]
    fn bad_params() {
        let ok = small(1);
        let cases: [(WorldParams, &str); 11] = [
            (WorldParams { map_units: 0, ..ok }, "map_units"),
            (
                WorldParams {
                    map_units: MAX_MAP_UNITS + 1,
                    ..ok
                },
                "map_units",
            ),
            (WorldParams { clusters: 0, ..ok }, "clusters"),
            (
                WorldParams {
                    clusters: MAX_WORLD_CLUSTERS + 1,
                    ..ok
                },
                "clusters",
            ),
            (
                WorldParams {
                    candidates: 0,
                    ..ok
                },
                "candidates",
            ),
            (
                WorldParams {
                    candidates: 256,
                    ..ok
                },
                "candidates",
            ),
            (
                WorldParams {
                    max_per_site: 0,
                    ..ok
                },
                "max_per_site",
            ),
            (
                WorldParams {
                    max_rtt_ms: 0.0,
                    ..ok
                },
                "max_rtt_ms",
            ),
            (
                WorldParams {
                    max_rtt_ms: f64::INFINITY,
                    ..ok
                },
                "max_rtt_ms",
            ),
            (
                WorldParams {
                    headroom: 0.0,
                    ..ok
                },
                "headroom",
            ),
            (
                WorldParams {
                    headroom: f64::NAN,
                    ..ok
                },
                "headroom",
            ),
        ];
        for (params, name) in cases {
            let err = generate(&params, &|_| {}).unwrap_err().to_string();
            assert!(err.starts_with(name), "{name}: {err}");
        }
    }

    #[test]
    fn progress_reports() {
        let seen = std::cell::Cell::new(0);
        let inst = generate(&small(1), &|n| seen.set(n)).unwrap();
        assert_eq!(seen.get(), inst.unit_count());
    }

    /// `cargo test -p cdnmap-world --release -- --ignored --nocapture world_1m`
    #[test]
    #[ignore]
    fn world_1m_timing() {
        let params = WorldParams {
            map_units: 1_000_000,
            clusters: 1_000,
            ..WorldParams::default()
        };
        let t = std::time::Instant::now();
        let inst = gen(&params);
        let elapsed = t.elapsed();
        let units = inst.unit_count();
        println!(
            "{units} units x {} clusters: {:.2?}, {} candidates ({:.2}/unit), heap {} B/unit",
            inst.clusters().len(),
            elapsed,
            inst.total_candidates(),
            inst.total_candidates() as f64 / units as f64,
            inst.heap_bytes() / units
        );
        let t = std::time::Instant::now();
        let p = perturb(&inst, 5.0, 1).unwrap();
        println!("perturb: {:.2?}", t.elapsed());
        assert_eq!(p.unit_count(), units);
    }
}
