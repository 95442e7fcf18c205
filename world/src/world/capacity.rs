//! How big the clusters are: capacity sized against the demand per class (see the module
//! documentation of [`crate::world`], "Capacity sizing"), and each cluster's resource tree.

use std::collections::BTreeMap;

use std::net::IpAddr;

use cdnmap_mapper::{ClusterSpec, ClusterState, ResourceKind, ResourceNodeSpec};

use super::classes::CLASSES;
use super::clusters::{cluster_addresses, GenCluster};
use super::data::Site;
use super::rng::{lognormal, rng_for, stream};
use super::WorldParams;

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
pub(super) fn cluster_specs(
    clusters: &[GenCluster],
    sites: &[Site],
    voronoi_population: &[f64],
    class_demand: &[f64; 3],
    params: &WorldParams,
) -> Vec<(ClusterSpec, Vec<IpAddr>)> {
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
            let spec = ClusterSpec {
                id: c.id.clone(),
                lat: c.lat,
                lon: c.lon,
                state: ClusterState::Up,
                serves: None,
                resources: resource_tree(u * uplink_scale, cpu, leaves),
            };
            (spec, cluster_addresses(j))
        })
        .collect()
}
