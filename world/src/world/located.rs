//! A world over client networks that are given, with their locations (from a MaxMind DB,
//! [`crate::mmdb`]), instead of drawn: the same clusters at real sites, capacity sizing and
//! candidate model as the generated world (module docs of [`crate::world`]), with each network
//! where the database puts it.
//!
//! - **Map units**: one per (network, class) of the class mix, id `NETWORK-CLASS`
//!   (`198.51.100.0/24-web`), at the network's location. A database says where clients are,
//!   not how many: each network's demand is its class's share of one unit of demand (the
//!   estimator learns the real demand from the front ends' reports).
//! - **Candidates**: as the generated world's, from the network's location (a network's
//!   rendezvous order of a site's clusters keyed by its position in address order).
//! - **Capacity**: sized against that demand, each site credited with the demand of the
//!   networks nearest to it.

use std::fmt::Write as _;

use anyhow::{bail, ensure, Result};
use cdnmap_mapper::model::{DEFAULT_MAX_CANDIDATES, MAX_MAP_UNITS};
use cdnmap_mapper::{CandidateSpec, ClusterSpec, Limits, MapUnitSpec};
use cdnmap_topology::{Topology, TopologyBuilder};

use super::candidates::{prefix_key, shortlists, within_reach, Shortlists, SiteIndex};
use super::capacity::cluster_specs;
use super::classes::{traffic_classes, CLASSES};
use super::clusters::{layout_clusters, GenCluster};
use super::data::Site;
use super::geo::unit_vector;
use super::WorldParams;
use crate::mmdb::Located;

/// The classes of each network's map units and their shares of its demand.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassMix(Vec<(String, f64)>);

impl Default for ClassMix {
    /// Every class of the world at its share (web 0.5, video 0.35, apps 0.15).
    fn default() -> Self {
        ClassMix(
            CLASSES
                .iter()
                .map(|c| (c.name.to_string(), c.share))
                .collect(),
        )
    }
}

impl std::str::FromStr for ClassMix {
    type Err = anyhow::Error;

    /// `web=0.5,video=0.35`: classes of the world with their shares (> 0, finite), each once.
    fn from_str(s: &str) -> Result<Self> {
        let mut out: Vec<(String, f64)> = Vec::new();
        for part in s.split(',') {
            let Some((name, share)) = part.split_once('=') else {
                bail!("class mix {s:?}: {part:?} is not CLASS=SHARE");
            };
            let name = name.trim();
            ensure!(!name.is_empty(), "class mix {s:?}: a share without a class");
            ensure!(
                !out.iter().any(|(n, _)| n == name),
                "class mix {s:?}: {name:?} twice"
            );
            let share: f64 = share.trim().parse().map_err(|_| {
                anyhow::anyhow!("class mix {s:?}: share {share:?} of {name:?} is not a number")
            })?;
            ensure!(
                share.is_finite() && share > 0.0 && share <= 1e6,
                "class mix {s:?}: share {share} of {name:?} must be > 0 and at most 1e6"
            );
            out.push((name.to_string(), share));
        }
        Ok(ClassMix(out))
    }
}

impl ClassMix {
    /// (index into `names`, share) of each class of the mix, in class name order (a network's
    /// units in id order); an error naming a class that is not among `names`.
    pub fn classes_in(&self, names: &[&str]) -> Result<Vec<(usize, f64)>> {
        let mut out = Vec::with_capacity(self.0.len());
        for (name, share) in &self.0 {
            let Some(k) = names.iter().position(|n| n == name) else {
                bail!(
                    "class mix: no class {name:?} (the classes: {})",
                    names.join(", ")
                );
            };
            out.push((k, *share));
        }
        out.sort_by(|a, b| names[a.0].cmp(names[b.0]));
        Ok(out)
    }
}

/// A world over `nets` (disjoint or nested; a network given twice is refused) with clusters
/// at `sites` (most populous first, as [`super::sites`] gives them), of `params` apart from
/// `map_units` (one per network and class of `mix`). `progress` is called now and then with
/// the map units pushed so far.
pub fn from_located(
    nets: &[Located],
    sites: &[Site],
    mix: &ClassMix,
    params: &WorldParams,
    progress: &dyn Fn(usize),
) -> Result<Topology> {
    let classes = mix.classes_in(&CLASSES.map(|c| c.name))?;
    ensure!(!nets.is_empty(), "no located networks");
    ensure!(!sites.is_empty(), "no sites");
    let map_units = nets.len().saturating_mul(classes.len());
    ensure!(
        map_units <= MAX_MAP_UNITS,
        "{} networks × {} classes make {map_units} map units, at most {MAX_MAP_UNITS}",
        nets.len(),
        classes.len()
    );
    let params = WorldParams {
        map_units,
        ..*params
    };
    params.validate()?;
    // The distinct locations (a shortlist of sites each).
    let (mut order, location_of, places) = distinct_locations(nets);
    in_id_order(nets, &mut order);
    let clusters = layout_clusters(sites, params.clusters);
    let used_sites = params.clusters.min(sites.len());
    let index = SiteIndex::new(&sites[..used_sites], &clusters);
    let lists = shortlists(&places, &index.xyz, &index.sizes(), &params);
    let specs = demand_specs(
        &clusters,
        sites,
        (&location_of, &lists),
        &classes,
        nets.len(),
        &params,
    );
    let limits = Limits {
        max_candidates: params.candidates.max(DEFAULT_MAX_CANDIDATES),
    };
    let mut builder = TopologyBuilder::new(traffic_classes(), specs, limits)?;
    let reserve: usize = location_of
        .iter()
        .map(|&l| usize::from(lists.candidate_bound[l as usize]))
        .sum::<usize>()
        .saturating_mul(classes.len());
    builder.reserve(map_units, reserve, map_units);
    let ids: Vec<String> = clusters.iter().map(|c| c.id.clone()).collect();
    let mut near = Vec::new();
    let mut scratch = Vec::new();
    let mut candidates: Vec<CandidateSpec<'_>> = Vec::with_capacity(params.candidates);
    let mut id = String::with_capacity(64);
    let mut done = 0usize;
    for (pushed, &p) in order.iter().enumerate() {
        let (p, l) = (p as usize, &nets[p as usize]);
        let loc = location_of[p] as usize;
        index.nearest(
            lists.of(loc),
            &params,
            prefix_key(params.seed, p),
            &unit_vector(l.lat, l.lon),
            &mut scratch,
            &mut near,
        );
        within_reach(&near, &ids, params.max_rtt_ms, &mut candidates);
        for &(k, share) in &classes {
            id.clear();
            write!(id, "{}-{}", l.net, CLASSES[k].name)?;
            let spec = MapUnitSpec {
                id: &id,
                class: CLASSES[k].name,
                demand: share,
                lat: l.lat,
                lon: l.lon,
                candidates: &candidates,
            };
            builder.push_unit(&spec, std::slice::from_ref(&l.net))?;
            done += 1;
        }
        if pushed % 16_384 == 16_383 {
            progress(done);
        }
    }
    let topology = builder.finish()?;
    progress(done);
    Ok(topology)
}

/// The networks sorted by location, each network's location (an index into the distinct
/// locations), and the distinct locations.
fn distinct_locations(nets: &[Located]) -> (Vec<u32>, Vec<u32>, Vec<(f64, f64)>) {
    let mut order: Vec<u32> = (0..nets.len() as u32).collect();
    let key = |i: u32| {
        let l = &nets[i as usize];
        (l.lat.to_bits(), l.lon.to_bits())
    };
    order.sort_unstable_by_key(|&i| key(i));
    let mut location_of = vec![0u32; nets.len()];
    let mut places: Vec<(f64, f64)> = Vec::new();
    for (n, &i) in order.iter().enumerate() {
        if n == 0 || key(order[n - 1]) != key(i) {
            let l = &nets[i as usize];
            places.push((l.lat, l.lon));
        }
        location_of[i as usize] = (places.len() - 1) as u32;
    }
    (order, location_of, places)
}

/// Puts in `order` the networks in the order of their units' ids (`NETWORK-CLASS`: the
/// network's text, then the class; `-` sorts before every character a network's text goes on
/// with), so that the builder has its units in id order and need not sort a copy of them.
fn in_id_order(nets: &[Located], order: &mut [u32]) {
    let mut texts: Vec<(String, u32)> = nets
        .iter()
        .enumerate()
        .map(|(p, l)| (l.net.to_string(), p as u32))
        .collect();
    texts.sort_unstable();
    for (slot, (_, p)) in order.iter_mut().zip(&texts) {
        *slot = *p;
    }
    drop(texts);
}

/// The clusters' specs with demand: each network its classes' shares, a site credited with
/// its nearest networks'.
fn demand_specs(
    clusters: &[GenCluster],
    sites: &[Site],
    (location_of, lists): (&[u32], &Shortlists),
    classes: &[(usize, f64)],
    networks: usize,
    params: &WorldParams,
) -> Vec<(ClusterSpec, Vec<std::net::IpAddr>)> {
    let used_sites = params.clusters.min(sites.len());
    let network_demand: f64 = classes.iter().map(|&(_, s)| s).sum();
    let mut site_demand = vec![0.0; used_sites];
    for &loc in location_of {
        site_demand[lists.nearest_site[loc as usize] as usize] += network_demand;
    }
    let mut class_demand = [0.0; 3];
    for &(k, share) in classes {
        class_demand[k] = share * networks as f64;
    }
    cluster_specs(clusters, sites, &site_demand, &class_demand, params)
}

/// The located networks of `topology`: each unit's prefixes at its location, one per prefix
/// (the first unit's location where units of one prefix differ), in address order. What
/// [`crate::mmdb::write`] takes to write a world as a MaxMind DB.
pub fn located_networks(topology: &Topology) -> Vec<Located> {
    let instance = &topology.instance;
    let mut out: Vec<Located> = Vec::with_capacity(instance.unit_count());
    for u in 0..instance.unit_count() as cdnmap_mapper::model::UnitIdx {
        let (lat, lon) = instance.unit_location(u);
        out.extend(topology.unit_prefixes(u).iter().map(|&p| Located {
            net: p.trunc(),
            lat,
            lon,
        }));
    }
    out.sort_by_key(|l| l.net);
    out.dedup_by(|b, a| a.net == b.net);
    out
}
