//! The map units, in two passes: pass 1 places the prefixes in cities and totals the demand
//! per class (what capacity is sized against); pass 2 replays the demand stream and streams the
//! map units, with their locations, prefixes and candidates, into the builder.

use std::fmt::Write as _;

use anyhow::Result;
use cdnmap_mapper::{CandidateSpec, MapUnitSpec};
use cdnmap_topology::TopologyBuilder;
use rand::Rng;

use super::candidates::{prefix_key, within_reach, Shortlists, SiteIndex};
use super::classes::{prefix_classes, unit_demand, CLASSES};
use super::data::City;
use super::geo::{jitter, unit_vector};
use super::prefixes::{PrefixAllocator, V6_SHARE};
use super::rng::{rng_for, stream};
use super::{WorldParams, UNIT_JITTER_KM};

/// Pass 1: where the prefixes are, and the demand capacity is sized against.
pub(super) struct Placement {
    /// The number of prefixes, `⌈map_units / 3⌉`.
    pub(super) prefixes: usize,
    /// Each prefix's city (an index into the cities).
    pub(super) city_of_prefix: Vec<u16>,
    /// How many prefixes each city got.
    pub(super) prefixes_in_city: Vec<u32>,
    /// Per used site, the expected population of the cities nearest to it.
    pub(super) voronoi_population: Vec<f64>,
    /// The world's demand per class (indices into `CLASSES`).
    pub(super) class_demand: [f64; 3],
    /// An upper bound on the world's candidate count (for the builder's `reserve`).
    pub(super) reserve_candidates: usize,
}

impl Placement {
    /// Pass 1 over `cities` (with their `lists`) for a world of `used_sites` sites.
    pub(super) fn draw(
        cities: &[City],
        lists: &Shortlists,
        used_sites: usize,
        params: &WorldParams,
    ) -> Placement {
        let prefixes = params.map_units.div_ceil(3);
        let mut cumulative = Vec::with_capacity(cities.len());
        let mut total_population = 0u64;
        for c in cities {
            total_population += c.population;
            cumulative.push(total_population);
        }
        let voronoi_population = expected_population(
            cities,
            &lists.nearest_site,
            used_sites,
            prefixes,
            total_population,
        );
        let (city_of_prefix, prefixes_in_city) =
            place_prefixes(&cumulative, total_population, prefixes, params.seed);
        let mut placement = Placement {
            prefixes,
            city_of_prefix,
            prefixes_in_city,
            voronoi_population,
            class_demand: [0.0; 3],
            reserve_candidates: 0,
        };
        (placement.class_demand, placement.reserve_candidates) =
            placement.total_demand(cities, lists, params);
        placement
    }

    /// The demand per class, drawn from the demand stream exactly as pass 2 will draw it, and
    /// the bound on the candidates.
    fn total_demand(
        &self,
        cities: &[City],
        lists: &Shortlists,
        params: &WorldParams,
    ) -> ([f64; 3], usize) {
        let mut rng = rng_for(params.seed, stream::DEMAND);
        let mut class_demand = [0.0; 3];
        let mut reserve_candidates = 0usize;
        for (p, &city) in self.city_of_prefix.iter().enumerate() {
            let city = usize::from(city);
            let classes = prefix_classes(p, self.prefixes, params.map_units);
            for &k in classes {
                class_demand[k] += unit_demand(
                    &mut rng,
                    cities[city].population,
                    self.prefixes_in_city[city],
                    k,
                );
            }
            reserve_candidates += usize::from(lists.candidate_bound[city]) * classes.len();
        }
        (class_demand, reserve_candidates)
    }
}

/// Capacity follows the expected demand: a city's demand is its population if it gets a
/// prefix at all, which it does with probability 1 - (1 - population / total)^prefixes. Per
/// used site (`nearest_site` per city), that expected population of its cities (a Voronoi
/// split).
fn expected_population(
    cities: &[City],
    nearest_site: &[u32],
    used_sites: usize,
    prefixes: usize,
    total_population: u64,
) -> Vec<f64> {
    let mut voronoi_population = vec![0.0; used_sites];
    for (city, &s) in cities.iter().zip(nearest_site) {
        let share = city.population as f64 / total_population as f64;
        let covered = -(prefixes as f64 * (-share).ln_1p()).exp_m1();
        voronoi_population[s as usize] += city.population as f64 * covered;
    }
    voronoi_population
}

/// Each prefix's city, drawn with probability ∝ population from the prefix-city stream
/// (`cumulative`: the cities' running population total), and the number of prefixes per city.
fn place_prefixes(
    cumulative: &[u64],
    total_population: u64,
    prefixes: usize,
    seed: u64,
) -> (Vec<u16>, Vec<u32>) {
    let mut rng = rng_for(seed, stream::PREFIX_CITY);
    let mut city_of_prefix: Vec<u16> = Vec::with_capacity(prefixes);
    let mut prefixes_in_city = vec![0u32; cumulative.len()];
    for _ in 0..prefixes {
        let x = rng.random_range(0..total_population);
        let city = cumulative.partition_point(|&c| c <= x);
        city_of_prefix.push(city as u16);
        prefixes_in_city[city] += 1;
    }
    (city_of_prefix, prefixes_in_city)
}

/// Pass 2: what it reads.
pub(super) struct UnitPass<'a> {
    pub(super) params: &'a WorldParams,
    pub(super) cities: &'a [City],
    pub(super) index: &'a SiteIndex,
    pub(super) lists: &'a Shortlists,
    /// The cluster ids, by cluster index.
    pub(super) ids: &'a [String],
    pub(super) placement: &'a Placement,
}

impl<'a> UnitPass<'a> {
    /// Pushes every map unit into `builder`, prefix by prefix, and returns how many it pushed.
    /// `progress` is called every 16,384 prefixes with the number so far.
    pub(super) fn push_all(
        &self,
        builder: &mut TopologyBuilder,
        progress: &dyn Fn(usize),
    ) -> Result<usize> {
        let params = self.params;
        let ids: &'a [String] = self.ids;
        let mut demand_rng = rng_for(params.seed, stream::DEMAND);
        let mut location_rng = rng_for(params.seed, stream::UNIT_LOCATION);
        let mut family_rng = rng_for(params.seed, stream::PREFIX_FAMILY);
        let mut allocator = PrefixAllocator::new();
        let mut near: Vec<(f64, u32)> = Vec::new();
        let mut scratch: Vec<(u64, u32)> = Vec::new();
        let mut candidates: Vec<CandidateSpec<'a>> = Vec::with_capacity(params.candidates);
        let mut id = String::with_capacity(32);
        #[cfg(debug_assertions)]
        let mut previous_id = String::new();
        let mut done = 0usize;
        for (p, &city) in self.placement.city_of_prefix.iter().enumerate() {
            let city = usize::from(city);
            let c = &self.cities[city];
            let (lat, lon) = jitter(&mut location_rng, c.lat, c.lon, UNIT_JITTER_KM);
            let prefix = if family_rng.random_bool(V6_SHARE) {
                allocator.v6()?
            } else {
                allocator.v4()?
            };
            // The nearest of the clusters the prefix may use (a site's clusters in the
            // prefix's rendezvous order), then those within reach.
            self.index.nearest(
                self.lists.of(city),
                params,
                prefix_key(params.seed, p),
                &unit_vector(lat, lon),
                &mut scratch,
                &mut near,
            );
            within_reach(&near, ids, params.max_rtt_ms, &mut candidates);

            for &k in prefix_classes(p, self.placement.prefixes, params.map_units) {
                let in_city = self.placement.prefixes_in_city[city];
                let demand = unit_demand(&mut demand_rng, c.population, in_city, k);
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
                let spec = MapUnitSpec {
                    id: &id,
                    class: CLASSES[k].name,
                    demand,
                    lat,
                    lon,
                    candidates: &candidates,
                };
                builder.push_unit(&spec, std::slice::from_ref(&prefix))?;
                done += 1;
            }
            if p % 16_384 == 16_383 {
                progress(done);
            }
        }
        Ok(done)
    }
}
