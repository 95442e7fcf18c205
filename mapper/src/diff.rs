//! Two maps compared (`cdnmap store diff`): how much demand the newer places where the older
//! did not, between which clusters it moved, and which map units' answers changed. The maps
//! may be of different instances (a topology edit between them): units and clusters are
//! matched by id.
//!
//! A unit's demand moved is its newer demand times the share of it the newer map places where
//! the older did not (the same measure as [`crate::map::churn`], overflow counting as one
//! more "cluster"); a share that grew by no more than the solver's tolerance is no move. The
//! moved demand of a unit goes from the places whose share shrank to those whose share grew,
//! each pair in proportion to both: `d × shrunk(from) × grown(to) / Σ grown`.

use std::collections::HashMap;

use crate::map::Map;
use crate::model::{Instance, UnitIdx};
use crate::solve::EPS_REL;

/// The name a flow gives overflow, in place of a cluster's id.
pub const OVERFLOW: &str = "(overflow)";

/// Demand that moved from one place to another.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// A cluster's id, or [`OVERFLOW`].
    pub from: String,
    pub to: String,
    pub demand: f64,
}

/// Two maps compared (module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MapDiff {
    /// Units with demand in both maps.
    pub units_compared: usize,
    /// Of those, the units whose demand moved (their answers changed).
    pub units_changed: usize,
    /// Units only the newer map has, and only the older.
    pub units_added: usize,
    pub units_removed: usize,
    /// The compared units' demand (in the newer instance).
    pub demand: f64,
    /// Of it, what the newer map places where the older did not.
    pub moved: f64,
    /// The moved demand by (from, to), most first.
    pub flows: Vec<Flow>,
    /// The changed units (id and demand moved), most moved first, at most the limit asked.
    pub changed: Vec<(String, f64)>,
}

impl MapDiff {
    /// The moved share of the demand compared (the churn between the two maps).
    pub fn moved_share(&self) -> f64 {
        if self.demand > 0.0 {
            (self.moved / self.demand).min(1.0)
        } else {
            0.0
        }
    }
}

/// One unit's shares by place: each cluster's id (or [`OVERFLOW`]) and its share of the unit's
/// total; a cluster named twice counts once.
fn shares<'a>(inst: &'a Instance, map: &Map, u: UnitIdx) -> Vec<(&'a str, f64)> {
    let allocs = map.allocations(u);
    let total: f64 = allocs.iter().map(|a| a.amount).sum::<f64>() + map.overflow(u);
    if total <= 0.0 {
        return Vec::new();
    }
    let mut out: Vec<(&str, f64)> = Vec::with_capacity(allocs.len() + 1);
    let places = allocs
        .iter()
        .map(|a| (inst.clusters()[a.cluster as usize].id.as_str(), a.amount))
        .chain(std::iter::once((OVERFLOW, map.overflow(u))));
    for (place, amount) in places {
        match out.iter_mut().find(|(p, _)| *p == place) {
            Some((_, s)) => *s += amount / total,
            None => out.push((place, amount / total)),
        }
    }
    out
}

/// Compares `old` (a map of `old_inst`) with `new` (of `new_inst`), listing at most
/// `max_units` changed units.
pub fn diff(
    (old_inst, old): (&Instance, &Map),
    (new_inst, new): (&Instance, &Map),
    max_units: usize,
) -> MapDiff {
    let mut out = MapDiff::default();
    let mut flows: HashMap<(&str, &str), f64> = HashMap::new();
    // With the same clusters in the same order, a unit placed alike by index is placed alike
    // by id: most units of two maps a round apart, compared without a lookup or an allocation.
    let same_clusters = old_inst.clusters().len() == new_inst.clusters().len()
        && old_inst
            .clusters()
            .iter()
            .zip(new_inst.clusters())
            .all(|(a, b)| a.id == b.id);
    let mut changed: Vec<(UnitIdx, f64)> = Vec::new();
    // Units are sorted by id in both instances: one merge.
    let (n_old, n_new) = (old_inst.unit_count(), new_inst.unit_count());
    let (mut i, mut j) = (0usize, 0usize);
    while i < n_old || j < n_new {
        let order = match (i < n_old, j < n_new) {
            (true, true) => old_inst
                .unit_id(i as UnitIdx)
                .cmp(new_inst.unit_id(j as UnitIdx)),
            (true, false) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                out.units_removed += 1;
                i += 1;
                continue;
            }
            std::cmp::Ordering::Greater => {
                out.units_added += 1;
                j += 1;
                continue;
            }
            std::cmp::Ordering::Equal => {}
        }
        let (uo, un) = (i as UnitIdx, j as UnitIdx);
        (i, j) = (i + 1, j + 1);
        let d = new_inst.unit_demand(un);
        if same_clusters
            && old.allocations(uo) == new.allocations(un)
            && old.overflow(uo) == new.overflow(un)
        {
            // Nothing moved; counted when it has demand and anything placed or overflowing.
            let placed =
                new.allocations(un).iter().any(|a| a.amount > 0.0) || new.overflow(un) > 0.0;
            if d > 0.0 && placed {
                out.units_compared += 1;
                out.demand += d;
            }
            continue;
        }
        let (before, after) = (shares(old_inst, old, uo), shares(new_inst, new, un));
        if d <= 0.0 || before.is_empty() || after.is_empty() {
            continue;
        }
        out.units_compared += 1;
        out.demand += d;
        let at = |s: &[(&str, f64)], p: &str| s.iter().find(|(q, _)| *q == p).map_or(0.0, |x| x.1);
        let grown: Vec<(&str, f64)> = after
            .iter()
            .map(|&(p, s)| (p, s - at(&before, p)))
            .filter(|&(_, g)| g > EPS_REL)
            .collect();
        let total_grown: f64 = grown.iter().map(|g| g.1).sum();
        if total_grown <= 0.0 {
            continue;
        }
        let moved = d * total_grown.min(1.0);
        out.moved += moved;
        changed.push((un, moved));
        let shrunk: Vec<(&str, f64)> = before
            .iter()
            .map(|&(p, s)| (p, s - at(&after, p)))
            .filter(|&(_, s)| s > 0.0)
            .collect();
        let total_shrunk: f64 = shrunk.iter().map(|s| s.1).sum();
        for &(from, s) in &shrunk {
            for &(to, g) in &grown {
                *flows.entry((from, to)).or_default() +=
                    moved * (s / total_shrunk) * (g / total_grown);
            }
        }
    }
    out.units_changed = changed.len();
    changed.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out.changed = changed
        .into_iter()
        .take(max_units)
        .map(|(u, m)| (new_inst.unit_id(u).to_string(), m))
        .collect();
    let mut flows: Vec<Flow> = flows
        .into_iter()
        .map(|((from, to), demand)| Flow {
            from: from.to_string(),
            to: to.to_string(),
            demand,
        })
        .collect();
    flows.sort_by(|a, b| {
        b.demand
            .total_cmp(&a.demand)
            .then_with(|| (&a.from, &a.to).cmp(&(&b.from, &b.to)))
    });
    out.flows = flows;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::churn;
    use crate::model::ClusterState;
    use crate::solve::tests::two_class_world;
    use crate::solve::{solve, SolveOptions};

    /// Against `churn` (the rounds' own measure) on a world before and after its busiest
    /// cluster goes down: the same moved share; the flows add up to the moved demand, and what
    /// left the down cluster is all it held; a map against itself moves nothing.
    #[test]
    fn a_cluster_down_moves_what_it_held_as_churn_counts_it() {
        let inst = two_class_world(7, |_| 1.0);
        let opts = SolveOptions::default();
        let before = solve(&inst, &opts).map;
        let load = before.demand_per_cluster(&inst);
        let busiest = (0..load.len())
            .max_by(|&a, &b| load[a].total_cmp(&load[b]))
            .expect("clusters");
        let held = load[busiest];
        assert!(held > 0.0);
        let down = inst.with_cluster_state(busiest as u32, ClusterState::Down);
        let after = solve(&down, &opts).map;

        let d = diff((&inst, &before), (&down, &after), 5);
        assert!((d.moved_share() - churn(&down, &before, &after)).abs() < 1e-9);
        let flowed: f64 = d.flows.iter().map(|f| f.demand).sum();
        assert!((flowed - d.moved).abs() < 1e-6 * d.moved.max(1.0));
        let id = &inst.clusters()[busiest].id;
        let left: f64 = d
            .flows
            .iter()
            .filter(|f| &f.from == id)
            .map(|f| f.demand)
            .sum();
        assert!((left - held).abs() < 1e-6 * held, "{left} left of {held}");
        assert!(d.flows.iter().all(|f| &f.to != id && f.from != f.to));
        assert!(d.units_changed > 0 && d.changed.len() == d.units_changed.min(5));
        assert!(d.changed.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!((d.units_added, d.units_removed), (0, 0));

        let same = diff((&inst, &before), (&inst, &before), 5);
        assert_eq!((same.moved, same.units_changed), (0.0, 0));
        assert!(same.flows.is_empty());
    }
}
