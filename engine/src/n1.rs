//! The N-1 view (issue 45): for every cluster and every site (the clusters at one place), what
//! its loss would do to the map in service — the overflow after, the clusters' nodes pushed
//! full, the mean RTT's shift — ranked, so an operator knows which single failure would hurt
//! before it happens.
//!
//! A sweep estimates each loss without solving: the lost clusters' demand goes, unit by unit
//! in index order, to each unit's next candidates by preference (up, not lost) as far as the
//! room the map leaves on every node of the path allows, and the rest overflows. No demand is
//! moved out of the way (a round would evict lower-priority classes and move others along
//! their lists), so an estimate is what the room left can absorb: the service checks the worst
//! few with the round's own code ([`crate::round::preview`]) and shows those exact figures
//! (`docs/perf/n1.md` measures the estimate against them). One pass over the lost clusters'
//! allocations and their units' candidates each: the whole sweep touches every allocation of
//! the map about once per cluster it sits at.
//!
//! Promises: no I/O, no clock (`go_on` says when to stop, and a stopped sweep says so);
//! deterministic (clusters in index order, sites in order of their first cluster, units in
//! index order).

use std::collections::HashMap;

use cdnmap_mapper::map::node_usage;
use cdnmap_mapper::model::{ClusterIdx, ClusterState, UnitIdx};
use cdnmap_mapper::{Instance, Map};

/// A node is full at this share of its capacity (as the dashboard's figures count it).
const FULL: f64 = 0.999;

/// What one loss would do (an estimate, or exact when `exact`).
#[derive(Debug, Clone, PartialEq)]
pub struct Loss {
    /// The cluster's id, or the site's: its first cluster's id and how many ("sha-1 and 31
    /// more at its site").
    pub name: String,
    /// The clusters lost, by index and by id.
    pub clusters: Vec<ClusterIdx>,
    pub ids: Vec<String>,
    /// The demand the map places there now.
    pub demand: f64,
    /// The map's overflow after the loss, and its share of the demand.
    pub overflow: f64,
    pub overflow_share: f64,
    /// Resource nodes (of the other clusters) the loss would push to full.
    pub nodes_full_added: u64,
    /// The demand-weighted mean RTT's change, in ms (the moved demand at its new candidates'
    /// scores against the lost ones', over all the demand placed).
    pub rtt_shift_ms: f64,
    /// Made by the round's own code (a preview), not estimated.
    pub exact: bool,
}

/// A sweep over the clusters and sites of one map.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sweep {
    /// Each cluster's loss, worst first ([`rank`]).
    pub clusters: Vec<Loss>,
    /// Each site's (two clusters or more at one place), worst first.
    pub sites: Vec<Loss>,
    /// The map's overflow share as it is.
    pub overflow_share: f64,
    /// Whether every cluster and site was tried (`go_on` may stop a sweep early).
    pub complete: bool,
}

/// The losses of every up cluster of `inst` with demand in `map`, then of every site, asking
/// `go_on` before each: it stops the sweep when it says no (a time budget).
pub fn sweep(inst: &Instance, map: &Map, go_on: &mut dyn FnMut() -> bool) -> Sweep {
    let room = Room::of(inst, map);
    let at = placed_at(inst, map);
    let demand = inst.total_demand();
    let mut out = Sweep {
        overflow_share: share(map.total_overflow(), demand),
        complete: true,
        ..Sweep::default()
    };
    let clusters = inst.clusters();
    let lost: Vec<Vec<ClusterIdx>> = (0..clusters.len() as ClusterIdx)
        .filter(|&c| clusters[c as usize].state == ClusterState::Up && !at[c as usize].is_empty())
        .map(|c| vec![c])
        .collect();
    let sites = sites(inst);
    for (group, is_site) in lost
        .iter()
        .map(|g| (g, false))
        .chain(sites.iter().map(|g| (g, true)))
    {
        if !go_on() {
            out.complete = false;
            break;
        }
        let loss = room.loss(inst, map, &at, group);
        if is_site {
            out.sites.push(loss);
        } else {
            out.clusters.push(loss);
        }
    }
    rank(&mut out.clusters);
    rank(&mut out.sites);
    out
}

/// Worst first: the most overflow after, then the most nodes pushed full, then the largest RTT
/// shift, then by name.
pub fn rank(losses: &mut [Loss]) {
    losses.sort_by(|a, b| {
        b.overflow
            .total_cmp(&a.overflow)
            .then(b.nodes_full_added.cmp(&a.nodes_full_added))
            .then(b.rtt_shift_ms.total_cmp(&a.rtt_shift_ms))
            .then_with(|| a.name.cmp(&b.name))
    });
}

fn share(x: f64, of: f64) -> f64 {
    if of > 0.0 {
        x / of
    } else {
        0.0
    }
}

/// Per cluster, the units with demand there and how much (companions included).
fn placed_at(inst: &Instance, map: &Map) -> Vec<Vec<(UnitIdx, f64)>> {
    let mut at = vec![Vec::new(); inst.clusters().len()];
    for u in 0..inst.unit_count().min(map.unit_count()) as UnitIdx {
        for a in map.allocations(u) {
            if a.amount > 0.0 {
                at[a.cluster as usize].push((u, a.amount));
            }
        }
    }
    at
}

/// The sites: the up clusters at one place (the same coordinates), two or more, in order of
/// their first cluster.
fn sites(inst: &Instance) -> Vec<Vec<ClusterIdx>> {
    let mut by_place: Vec<((u64, u64), Vec<ClusterIdx>)> = Vec::new();
    let mut index: HashMap<(u64, u64), usize> = HashMap::new();
    for (c, cl) in inst.clusters().iter().enumerate() {
        if cl.state != ClusterState::Up {
            continue;
        }
        let place = (cl.lat.to_bits(), cl.lon.to_bits());
        let i = *index.entry(place).or_insert_with(|| {
            by_place.push((place, Vec::new()));
            by_place.len() - 1
        });
        by_place[i].1.push(c as ClusterIdx);
    }
    by_place
        .into_iter()
        .map(|(_, g)| g)
        .filter(|g| g.len() > 1)
        .collect()
}

/// The room the map leaves on every node.
struct Room {
    free: Vec<f64>,
    capacity: Vec<f64>,
    placed: f64,
}

impl Room {
    fn of(inst: &Instance, map: &Map) -> Room {
        let capacity = inst.capacities();
        let used = node_usage(inst, map);
        let free = capacity.iter().zip(&used).map(|(c, u)| c - u).collect();
        Room {
            free,
            capacity,
            placed: map.total_allocated(),
        }
    }

    /// What losing `group` would do, estimated (module docs).
    fn loss(
        &self,
        inst: &Instance,
        map: &Map,
        at: &[Vec<(UnitIdx, f64)>],
        group: &[ClusterIdx],
    ) -> Loss {
        let clusters = inst.clusters();
        let mut taken: HashMap<usize, f64> = HashMap::new();
        let (mut lost, mut overflow, mut rtt) = (0.0, 0.0, 0.0);
        for &c in group {
            for &(u, amount) in &at[c as usize] {
                lost += amount;
                let k = inst.unit_class(u);
                let per_unit = inst.classes()[usize::from(k)].per_unit;
                let from = inst
                    .candidates(u)
                    .find(|x| x.cluster == c)
                    .map(|x| f64::from(x.score));
                let mut left = amount;
                for cand in inst.candidates(u) {
                    if left <= 0.0 {
                        break;
                    }
                    let cl = &clusters[cand.cluster as usize];
                    if group.contains(&cand.cluster)
                        || cl.state != ClusterState::Up
                        || !cl.serves(k)
                    {
                        continue;
                    }
                    let mut fits = left;
                    for n in cl.path(k) {
                        let coef = per_unit.get(cl.nodes[n as usize].kind);
                        if coef > 0.0 {
                            let g = inst.global_node(cand.cluster, n);
                            let free = self.free[g] - taken.get(&g).copied().unwrap_or(0.0);
                            fits = fits.min(free.max(0.0) / coef);
                        }
                    }
                    if fits <= 0.0 {
                        continue;
                    }
                    for n in cl.path(k) {
                        let coef = per_unit.get(cl.nodes[n as usize].kind);
                        let g = inst.global_node(cand.cluster, n);
                        *taken.entry(g).or_insert(0.0) += fits * coef;
                    }
                    if let Some(from) = from {
                        rtt += fits * (f64::from(cand.score) - from);
                    }
                    left -= fits;
                }
                overflow += left.max(0.0);
            }
        }
        let nodes_full_added = taken
            .iter()
            .filter(|&(&g, &t)| {
                let cap = self.capacity[g];
                cap > 0.0
                    && self.free[g] > (1.0 - FULL) * cap
                    && self.free[g] - t <= (1.0 - FULL) * cap
            })
            .count() as u64;
        let overflow = map.total_overflow() + overflow;
        let demand = inst.total_demand();
        let ids: Vec<String> = group
            .iter()
            .map(|&c| clusters[c as usize].id.clone())
            .collect();
        Loss {
            name: match ids.as_slice() {
                [one] => one.clone(),
                [first, rest @ ..] => format!("{first} and {} more at its site", rest.len()),
                [] => String::new(),
            },
            ids,
            clusters: group.to_vec(),
            demand: lost,
            overflow,
            overflow_share: share(overflow, demand),
            nodes_full_added,
            rtt_shift_ms: share(rtt, self.placed),
            exact: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::solve::{solve, SolveOptions};

    fn instance() -> Instance {
        let v = serde_json::json!({
            "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1.0, "fps": 0.0}}],
            "clusters": [
                {"id": "a", "lat": 1.0, "lon": 1.0, "resources": {"name": "r", "kind": "bps", "capacity": 10.0, "classes": ["web"]}},
                {"id": "b", "lat": 1.0, "lon": 1.0, "resources": {"name": "r", "kind": "bps", "capacity": 10.0, "classes": ["web"]}},
                {"id": "c", "lat": 5.0, "lon": 5.0, "resources": {"name": "r", "kind": "bps", "capacity": 6.0, "classes": ["web"]}}
            ],
            "map_units": [
                {"id": "u1", "class": "web", "demand": 8.0, "lat": 0.0, "lon": 0.0,
                 "candidates": [{"cluster": "a", "score": 5.0}, {"cluster": "c", "score": 25.0}]},
                {"id": "u2", "class": "web", "demand": 6.0, "lat": 0.0, "lon": 0.0,
                 "candidates": [{"cluster": "b", "score": 5.0}, {"cluster": "a", "score": 10.0}]}
            ]
        });
        cdnmap_topology::format::parse_instance(v.to_string().as_bytes(), Default::default())
            .expect("an instance")
            .instance
    }

    /// Losing a: u1's 8 go to c (room 6), 2 overflow, c pushed full, RTT +20 ms on 6 of the 14
    /// placed. Losing b: u2's 6 go to a (room 2), 4 overflow. The site (a and b at one place):
    /// u1's 6 to c, all of u2's overflows (its only other candidate is lost too).
    #[test]
    fn each_loss_is_what_the_room_left_absorbs() {
        let inst = instance();
        let map = solve(&inst, &SolveOptions::default()).map;
        let s = sweep(&inst, &map, &mut || true);
        assert!(s.complete);
        let by = |name: &str| {
            s.clusters
                .iter()
                .chain(&s.sites)
                .find(|l| l.name == name)
                .cloned()
        };
        let a = by("a").expect("a");
        assert_eq!((a.demand, a.overflow, a.nodes_full_added), (8.0, 2.0, 1));
        assert!((a.rtt_shift_ms - 6.0 * 20.0 / 14.0).abs() < 1e-9, "{a:?}");
        let b = by("b").expect("b");
        assert_eq!((b.demand, b.overflow, b.nodes_full_added), (6.0, 4.0, 1));
        let site = by("a and 1 more at its site").expect("the site");
        assert_eq!(site.ids, ["a", "b"]);
        assert_eq!((site.demand, site.overflow), (14.0, 8.0));
        assert_eq!(s.clusters[0].name, "b", "worst first");
        assert!(by("c").is_none(), "c holds no demand");
        let mut asked = 0;
        let stopped = sweep(&inst, &map, &mut || {
            asked += 1;
            asked < 2
        });
        assert!(!stopped.complete);
        assert_eq!(stopped.clusters.len() + stopped.sites.len(), 1);
    }
}
