//! The world's traffic classes, and the demand of a map unit of each.

use cdnmap_mapper::{PerUnit, TrafficClass};
use rand_chacha::ChaCha8Rng;

use super::rng::lognormal;

/// One unit of demand per this many inhabitants.
pub const PEOPLE_PER_DEMAND_UNIT: f64 = 1000.0;
/// σ of the lognormal (mean 1) noise on each map unit's demand.
pub const DEMAND_SIGMA: f64 = 0.4;

pub(super) struct ClassDef {
    pub(super) name: &'static str,
    pub(super) priority: u32,
    pub(super) bps: f64,
    pub(super) fps: f64,
    /// Share of a prefix's demand.
    pub(super) share: f64,
}

pub(super) const CLASSES: [ClassDef; 3] = [
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
pub(super) const ID_ORDER: [usize; 3] = [2, 1, 0];

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
            companion_share: 0.0,
        })
        .collect()
}

/// Demand of one map unit; draws one normal from `rng` (the demand stream).
pub(super) fn unit_demand(
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
pub(super) fn prefix_classes(p: usize, prefixes: usize, map_units: usize) -> &'static [usize] {
    if p + 1 == prefixes && !map_units.is_multiple_of(3) {
        &ID_ORDER[..map_units % 3]
    } else {
        &ID_ORDER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_order_is_name_order() {
        let names: Vec<&str> = ID_ORDER.iter().map(|&k| CLASSES[k].name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(names.len(), CLASSES.len());
    }
}
