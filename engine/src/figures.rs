//! What the dashboard shows, computed from one published snapshot: no I/O, no clock, no
//! locks. A [`View`] is built once per map version (one pass over the map); the lookup's
//! explanation ([`explain`]) is computed per request from the view.

use std::collections::BTreeMap;

use cdnmap_mapper::{
    Candidate, ClassIdx, ClusterIdx, ClusterState, Instance, Map, Rescore, UnitIdx,
};
use serde::Serialize;

use crate::round::Snapshot;

/// Regions are cells of this many degrees of latitude and longitude.
pub const REGION_DEG: f64 = 5.0;
/// The most (region → cluster) flows the map draws: the largest.
pub const MAX_FLOWS: usize = 600;
/// The most regions the map draws: those with the most demand (a 5° grid has 2,592 cells).
pub const MAX_REGIONS: usize = 2_592;
/// A node at or above this share of its capacity counts as full.
pub const FULL: f64 = 1.0 - 1e-6;

/// Demand placed at a cluster by map units of one region.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Flow {
    /// Index into [`View::regions`].
    pub region: usize,
    pub cluster: String,
    pub amount: f64,
}

/// Map units grouped by location: a cell of [`REGION_DEG`] degrees, drawn at the
/// demand-weighted centre of its units.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Region {
    pub lat: f64,
    pub lon: f64,
    pub units: usize,
    pub demand: f64,
    pub overflow: f64,
}

/// The figures of one map version.
#[derive(Debug, Clone)]
pub struct View {
    pub version: u64,
    /// What the map places on every node (global node index), in the node's unit.
    pub usage: Vec<f64>,
    /// Demand placed at each cluster.
    pub demand: Vec<f64>,
    /// Each cluster's worst node: used / capacity.
    pub utilization: Vec<f64>,
    /// Per cluster, the map units holding demand there and how much, largest first.
    pub holders: Vec<Vec<(UnitIdx, f64)>>,
    pub regions: Vec<Region>,
    /// The largest flows, largest first.
    pub flows: Vec<Flow>,
    pub mean_rtt_ms: Option<f64>,
}

impl View {
    pub fn new(s: &Snapshot) -> View {
        let (inst, map) = (&s.topology, &s.map);
        let usage = cdnmap_mapper::node_usage(inst, map);
        let demand = map.demand_per_cluster(inst);
        let utilization = crate::round::utilization(inst, map);
        let mut holders: Vec<Vec<(UnitIdx, f64)>> = vec![Vec::new(); inst.clusters().len()];
        let units = inst.unit_count().min(map.unit_count()) as UnitIdx;
        for u in 0..units {
            for a in map.allocations(u) {
                if let Some(h) = holders.get_mut(a.cluster as usize) {
                    h.push((u, a.amount));
                }
            }
        }
        for h in &mut holders {
            h.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        }
        let (regions, flows) = regions_and_flows(inst, map);
        View {
            version: s.version,
            usage,
            demand,
            utilization,
            holders,
            regions,
            flows,
            mean_rtt_ms: mean_score(inst, map, &s.measured),
        }
    }

    /// Node `n` of cluster `c`: (load, capacity).
    pub fn node_load(&self, inst: &Instance, c: ClusterIdx, n: u32) -> (f64, f64) {
        let cap = inst.clusters()[c as usize].nodes[n as usize].capacity;
        (self.usage[inst.global_node(c, n)], cap)
    }
}

/// Moved demand from one region (a cell of [`REGION_DEG`] degrees): where the units whose
/// answers change are.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RegionMove {
    /// The moved-demand-weighted centre of the cell's units.
    pub lat: f64,
    pub lon: f64,
    pub units: usize,
    pub moved: f64,
}

/// `moved` (map units of `inst` by id, with the demand of each that moves) grouped by region,
/// the most moved first, at most `top`; ids `inst` does not have are left out.
pub fn moved_by_region<'a>(
    inst: &Instance,
    moved: impl IntoIterator<Item = (&'a str, f64)>,
    top: usize,
) -> Vec<RegionMove> {
    let mut cells: BTreeMap<(i32, i32), (f64, f64, usize, f64)> = BTreeMap::new();
    for (id, m) in moved {
        let Some(u) = inst.unit_index(id) else {
            continue;
        };
        let (lat, lon) = inst.unit_location(u);
        let e = cells.entry(cell(lat, lon)).or_insert((0.0, 0.0, 0, 0.0));
        e.0 += lat * m;
        e.1 += lon * m;
        e.2 += 1;
        e.3 += m;
    }
    let mut out: Vec<RegionMove> = cells
        .into_values()
        .filter(|v| v.3 > 0.0)
        .map(|(lat, lon, units, moved)| RegionMove {
            lat: lat / moved,
            lon: lon / moved,
            units,
            moved,
        })
        .collect();
    out.sort_by(|a, b| b.moved.total_cmp(&a.moved).then(a.lat.total_cmp(&b.lat)));
    out.truncate(top);
    out
}

/// Region cell of a location.
fn cell(lat: f64, lon: f64) -> (i32, i32) {
    let lat = lat.clamp(-90.0, 90.0);
    let lon = lon.clamp(-180.0, 180.0);
    (
        ((lat + 90.0) / REGION_DEG).floor() as i32,
        ((lon + 180.0) / REGION_DEG).floor() as i32,
    )
}

/// Map units grouped into regions, and the demand each region sends to each cluster.
pub fn regions_and_flows(inst: &Instance, map: &Map) -> (Vec<Region>, Vec<Flow>) {
    #[derive(Default)]
    struct Acc {
        units: usize,
        demand: f64,
        overflow: f64,
        lat_w: f64,
        lon_w: f64,
        lat: f64,
        lon: f64,
        to: BTreeMap<ClusterIdx, f64>,
    }
    let mut cells: BTreeMap<(i32, i32), Acc> = BTreeMap::new();
    for u in 0..inst.unit_count().min(map.unit_count()) as UnitIdx {
        let (lat, lon) = inst.unit_location(u);
        let d = inst.unit_demand(u);
        let acc = cells.entry(cell(lat, lon)).or_default();
        acc.units += 1;
        acc.demand += d;
        acc.overflow += map.overflow(u);
        // Weighted by demand, plus a little so units without demand still place the region.
        let w = d.max(0.0) + 1e-9;
        acc.lat_w += w;
        acc.lat += w * lat;
        acc.lon_w += w;
        acc.lon += w * lon;
        for a in map.allocations(u) {
            *acc.to.entry(a.cluster).or_default() += a.amount;
        }
    }
    let mut accs: Vec<Acc> = cells.into_values().collect();
    // The regions with the most demand (stable: cells are in grid order).
    accs.sort_by(|a, b| b.demand.total_cmp(&a.demand));
    accs.truncate(MAX_REGIONS);
    let mut regions = Vec::with_capacity(accs.len());
    let mut flows = Vec::new();
    for (i, acc) in accs.into_iter().enumerate() {
        regions.push(Region {
            lat: acc.lat / acc.lat_w,
            lon: acc.lon / acc.lon_w,
            units: acc.units,
            demand: acc.demand,
            overflow: acc.overflow,
        });
        for (c, amount) in acc.to {
            if amount > 0.0 {
                flows.push(Flow {
                    region: i,
                    cluster: inst.clusters()[c as usize].id.clone(),
                    amount,
                });
            }
        }
    }
    flows.sort_by(|a, b| {
        b.amount
            .total_cmp(&a.amount)
            .then(a.region.cmp(&b.region))
            .then(a.cluster.cmp(&b.cluster))
    });
    flows.truncate(MAX_FLOWS);
    (regions, flows)
}

/// The demand-weighted mean score of the placed demand (DESIGN.md: a candidate's score is its
/// estimated RTT in ms plus penalties; in the demo world exactly the RTT estimate). `None`
/// when nothing is placed.
///
/// A candidate whose RTT was measured counts with the measured score, as the round used it.
pub fn mean_score(inst: &Instance, map: &Map, measured: &Rescore) -> Option<f64> {
    cdnmap_mapper::map::mean_measured_score(inst, map, |_| Some(1.0), measured)
}

/// A cluster's preference key for a map unit (DESIGN.md: lower first).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
struct Key {
    priority: u32,
    rank: f32,
    unit: UnitIdx,
}

fn key(inst: &Instance, u: UnitIdx, c: ClusterIdx) -> Option<Key> {
    let cand = inst.candidates(u).find(|x| x.cluster == c)?;
    let k = inst.unit_class(u);
    Some(Key {
        priority: inst.classes()[usize::from(k)].priority,
        rank: cand.rank,
        unit: u,
    })
}

/// What a lookup says about one candidate.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CandidateView {
    pub cluster: String,
    /// The score the round used: the measured RTT where `measured`, else `estimate`.
    pub score: f32,
    /// Whether `score` was measured (clients' RTTs, Feedback's `ReportRtt`).
    pub measured: bool,
    /// The topology's estimate (from distance, or as the topology gives it).
    pub estimate: f32,
    pub rank: f32,
    /// The cluster's state in the round that made this map.
    pub state: ClusterState,
    /// Demand of the unit placed there.
    pub amount: f64,
    pub share: f64,
    /// `placed`, `passed over` (preferred to where the demand went, but not used) or
    /// `not needed` (less preferred than where all of it went). A cluster beyond the unit's
    /// list that the second chance placed demand at comes last, `placed`.
    pub verdict: &'static str,
    pub why: String,
}

fn fmt_num(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

fn state_name(s: ClusterState) -> &'static str {
    match s {
        ClusterState::Up => "up",
        ClusterState::Drained => "drained",
        ClusterState::Down => "down",
    }
}

/// Why unit `u`'s demand did not go to candidate cluster `c`, which it prefers to where its
/// demand went: read from the final map, without instrumenting the solver.
pub fn why_not(view: &View, inst: &Instance, u: UnitIdx, c: ClusterIdx) -> String {
    let cl = &inst.clusters()[c as usize];
    if cl.state != ClusterState::Up {
        return format!(
            "cluster {:?} was {} in this round: it takes no demand",
            cl.id,
            state_name(cl.state)
        );
    }
    let k: ClassIdx = inst.unit_class(u);
    let class = &inst.classes()[usize::from(k)];
    let path: Vec<u32> = cl.path(k).collect();
    if path.is_empty() {
        return format!("cluster {:?} does not serve class {:?}", cl.id, class.name);
    }
    // The tightest node of the unit's path.
    let Some((n, load, cap)) = path
        .iter()
        .map(|&n| {
            let (load, cap) = view.node_load(inst, c, n);
            (n, load, cap)
        })
        .max_by(|a, b| ratio(a.1, a.2).total_cmp(&ratio(b.1, b.2)))
    else {
        return String::new();
    };
    let node = &cl.nodes[n as usize];
    let kind = match node.kind {
        cdnmap_mapper::ResourceKind::Bps => "bps",
        cdnmap_mapper::ResourceKind::Fps => "fps",
    };
    if ratio(load, cap) < FULL {
        return format!(
            "not full in this map (tightest node {:?} at {:.0}%): the unit's demand stayed with \
             an incumbent cluster (stickiness margin), or the room appeared after it was placed",
            node.name,
            100.0 * ratio(load, cap)
        );
    }
    let full = format!(
        "resource node {:?} ({kind}) of {:?} is full ({} of {})",
        node.name,
        cl.id,
        fmt_num(load),
        fmt_num(cap)
    );
    // The least preferred holder the cluster kept on that node.
    let worst = view.holders[c as usize]
        .iter()
        .filter(|&&(h, _)| h != u && cl.path(inst.unit_class(h)).any(|m| m == n))
        .filter_map(|&(h, amount)| key(inst, h, c).map(|key| (key, amount)))
        .max_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    let (Some((worst, amount)), Some(mine)) = (worst, key(inst, u, c)) else {
        return full;
    };
    let describe = |key: &Key| {
        let kc = &inst.classes()[usize::from(inst.unit_class(key.unit))];
        format!(
            "{}, priority {}, rank {:.2}",
            kc.name, kc.priority, key.rank
        )
    };
    let holder = inst.unit_id(worst.unit);
    let tie = if (worst.priority, worst.rank) == (mine.priority, mine.rank) {
        "; equal priority and rank: the lower map unit id wins"
    } else {
        ""
    };
    if worst < mine {
        format!(
            "{full}: it keeps demand it prefers; the least preferred it kept is {holder:?} ({}; \
             {} placed) over this unit ({}){tie}",
            describe(&worst),
            fmt_num(amount),
            describe(&mine)
        )
    } else {
        format!(
            "{full}: it kept {holder:?} ({}; {} placed), which it ranks below this unit ({}): \
             an incumbent kept by stickiness (incumbents first)",
            describe(&worst),
            fmt_num(amount),
            describe(&mine)
        )
    }
}

fn ratio(load: f64, cap: f64) -> f64 {
    if cap > 0.0 {
        load / cap
    } else {
        // A node of capacity 0 takes nothing: full.
        1.0
    }
}

/// Unit `u`'s candidates, where its demand went, and why it did not go to those it prefers.
///
/// The candidates as the round saw them: a score measured in `measured` in place of the
/// estimate (and of the rank it stood for), in their order by score.
pub fn explain(
    view: &View,
    inst: &Instance,
    map: &Map,
    u: UnitIdx,
    measured: &Rescore,
) -> Vec<CandidateView> {
    let allocs = map.placed(u);
    let companion = map.companion(u);
    let total: f64 = map.allocations(u).iter().map(|a| a.amount).sum::<f64>() + map.overflow(u);
    let mut cands: Vec<(Candidate, f32, bool)> = inst
        .candidates(u)
        .map(|mut c| {
            let estimate = c.score;
            let m = measured.score(u, c.cluster);
            if let Some(m) = m {
                c.score = m;
                if !c.explicit_rank {
                    c.rank = m;
                }
            }
            (c, estimate, m.is_some())
        })
        .collect();
    if measured.units().binary_search(&u).is_ok() {
        cands.sort_by(|a, b| {
            a.0.score
                .total_cmp(&b.0.score)
                .then(a.0.cluster.cmp(&b.0.cluster))
        });
    }
    // Candidates up to the least preferred one holding demand are "preferred"; with overflow,
    // all of them are.
    let last_placed = cands.iter().rposition(|(c, ..)| {
        allocs
            .iter()
            .any(|a| a.cluster == c.cluster && a.amount > 0.0)
    });
    let preferred_up_to = if map.overflow(u) > 0.0 {
        cands.len()
    } else {
        last_placed.map_or(cands.len(), |i| i + 1)
    };
    cands
        .iter()
        .enumerate()
        .map(|(j, (cand, estimate, is_measured))| {
            let cl = &inst.clusters()[cand.cluster as usize];
            let amount: f64 = allocs
                .iter()
                .filter(|a| a.cluster == cand.cluster)
                .fold(0.0, |sum, a| sum + a.amount); // +0.0 when none (a sum starts at -0.0)
            let reserved = companion.filter(|c| c.cluster == cand.cluster);
            let amount = reserved.map_or(amount, |c| c.amount);
            let share = if total > 0.0 { amount / total } else { 0.0 };
            let why_not = || why_not(view, inst, u, cand.cluster);
            let (verdict, why) = match (reserved, amount > 0.0, j + 1 < preferred_up_to) {
                (Some(_), ..) => (
                    "companion",
                    format!(
                        "its answers' second cluster (its class goes with the winner): {:.1}% of \
                     the demand reserved for the clients that go to it",
                        100.0 * share
                    ),
                ),
                // Part of the demand went further down the list (or overflowed).
                (None, true, true) => (
                    "placed",
                    format!(
                        "holds {:.1}% of the demand; not the rest: {}",
                        100.0 * share,
                        why_not()
                    ),
                ),
                (None, true, false) => (
                    "placed",
                    format!("holds {:.1}% of the demand", 100.0 * share),
                ),
                (None, false, _) if j < preferred_up_to => ("passed over", why_not()),
                (None, false, _) => (
                    "not needed",
                    "less preferred than where all of the demand went".to_string(),
                ),
            };
            CandidateView {
                cluster: cl.id.clone(),
                score: cand.score,
                measured: *is_measured,
                estimate: *estimate,
                rank: cand.rank,
                state: cl.state,
                amount,
                share,
                verdict,
                why,
            }
        })
        .chain(beyond_the_list(inst, u, allocs, total))
        .collect()
}

/// The unit's placements at clusters that are not its candidates (the second chance beyond
/// the lists, `[second_chance]`): each with the RTT the phase estimates for it (the distance
/// model calibrated by the unit's listed scores).
fn beyond_the_list<'a>(
    inst: &'a Instance,
    u: UnitIdx,
    allocs: &'a [cdnmap_mapper::Allocation],
    total: f64,
) -> impl Iterator<Item = CandidateView> + 'a {
    allocs
        .iter()
        .filter(move |a| a.amount > 0.0 && !inst.candidates(u).any(|c| c.cluster == a.cluster))
        .filter_map(move |a| {
            let cl = inst.clusters().get(a.cluster as usize)?;
            let rtt = cdnmap_mapper::second_chance::estimate_beyond(inst, u, a.cluster)? as f32;
            let share = if total > 0.0 { a.amount / total } else { 0.0 };
            Some(CandidateView {
                cluster: cl.id.clone(),
                score: rtt,
                measured: false,
                estimate: rtt,
                rank: rtt,
                state: cl.state,
                amount: a.amount,
                share,
                verdict: "placed",
                why: format!(
                    "holds {:.1}% of the demand, beyond the unit's candidate list: no candidate \
                     had room, and this was the nearest cluster with room (the second chance; \
                     RTT {rtt:.0} ms estimated from distance and the unit's listed scores)",
                    100.0 * share
                ),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::{Limits, Stickiness};
    use cdnmap_serve::resolve::ClassRules;
    use cdnmap_topology::format::parse_instance;
    use cdnmap_topology::Topology;

    /// DESIGN.md's worked example, with a second cluster "far" for what is evicted: "near"
    /// (fps node B of capacity 30 under bps root A) prefers apps; 20 video then 26 apps.
    fn instance(near_state: &str) -> Topology {
        let json = format!(
            r#"{{"traffic_classes": [
                {{"name": "apps", "priority": 0, "per_unit": {{"bps": 0.25, "fps": 1}}}},
                {{"name": "video", "priority": 1, "per_unit": {{"bps": 1, "fps": 0.25}}}}],
              "clusters": [
                {{"id": "near", "lat": 50, "lon": 8, "addresses": ["198.18.0.1"], "state": "{near_state}",
                  "resources": {{"name": "A", "kind": "bps", "capacity": 100, "children": [
                    {{"name": "B", "kind": "fps", "capacity": 30, "children": [
                      {{"name": "v", "kind": "fps", "capacity": 100, "classes": ["video"]}},
                      {{"name": "a", "kind": "fps", "capacity": 100, "classes": ["apps"]}}]}}]}}}},
                {{"id": "far", "lat": 40, "lon": -74, "addresses": ["198.18.1.1"],
                  "resources": {{"name": "r", "kind": "bps", "capacity": 1000, "classes": ["video", "apps"]}}}}],
              "map_units": [
                {{"id": "vid", "class": "video", "demand": 20, "prefixes": ["10.0.1.0/24"], "lat": 51, "lon": 9,
                  "candidates": [{{"cluster": "near", "score": 10}}, {{"cluster": "far", "score": 90}}]}},
                {{"id": "app", "class": "apps", "demand": 26, "prefixes": ["10.0.2.0/24"], "lat": 52, "lon": 9,
                  "candidates": [{{"cluster": "near", "score": 12}}, {{"cluster": "far", "score": 95}}]}}]}}"#
        );
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    fn snapshot(inst: &Topology) -> Snapshot {
        let rules = ClassRules::for_instance(inst, &[], "apps").expect("rules");
        crate::round::round(inst, None, &Stickiness::default(), rules, 1, 0, true).expect("round")
    }

    #[test]
    fn the_worked_example_is_explained_by_the_full_fps_node() {
        let inst = instance("up");
        let s = snapshot(&inst);
        let view = View::new(&s);
        let near = inst.cluster_index("near").expect("near");
        let far = inst.cluster_index("far").expect("far");
        // Loads: B carries 16 × 0.25 + 26 × 1 = 30 fps, full; A 16 + 6.5 bps.
        let b = inst.clusters()[near as usize]
            .nodes
            .iter()
            .position(|n| n.name == "B")
            .expect("B") as u32;
        let (load, cap) = view.node_load(&inst, near, b);
        assert!((load - 30.0).abs() < 1e-9 && cap == 30.0, "{load} {cap}");
        assert!((view.demand[near as usize] - 42.0).abs() < 1e-9);
        assert!((view.demand[far as usize] - 4.0).abs() < 1e-9);
        assert!((view.utilization[near as usize] - 1.0).abs() < 1e-9);
        assert_eq!(view.holders[near as usize].len(), 2);
        // Mean score: (16 × 10 + 26 × 12 + 4 × 90) / 46.
        let mean = view.mean_rtt_ms.expect("placed");
        assert!(
            (mean - (160.0 + 312.0 + 360.0) / 46.0).abs() < 1e-6,
            "{mean}"
        );

        let vid = inst.unit_index("vid").expect("vid");
        let cands = explain(&view, &inst, &s.map, vid, &Rescore::default());
        assert_eq!(cands.len(), 2);
        // video got 16 of 20 at near: both clusters hold some of it.
        assert_eq!((cands[0].verdict, cands[1].verdict), ("placed", "placed"));
        assert!((cands[1].share - 0.2).abs() < 1e-9);
        // Why "near" did not take the rest: B is full, and what it kept is apps.
        let why = &cands[0].why;
        assert!(
            why.starts_with("holds 80.0% of the demand; not the rest: "),
            "{why}"
        );
        assert_eq!(cands[1].why, "holds 20.0% of the demand");
        assert!(why.contains("\"B\" (fps)"), "{why}");
        assert!(
            why.contains("30 of 30") || why.contains("30.0 of 30.0"),
            "{why}"
        );
        assert!(why.contains("prefers"), "{why}");
        assert!(why.contains("(apps, priority 0, rank 12.00; 26.0 placed) over this unit (video, priority 1, rank 10.00)"), "{why}");
    }

    /// A unit the second chance placed beyond its list: its one candidate, full, "passed
    /// over"; then the cluster beyond, "placed", with its share, its RTT by distance and why.
    #[test]
    fn a_placement_beyond_the_list_is_shown_after_the_candidates() {
        let inst = crate::round::tests::overflow_with_room_beside();
        let rules = ClassRules::for_instance(&inst, &[], "web").expect("rules");
        let s = crate::round::solve_round(
            &inst,
            None,
            None,
            (
                &Stickiness::default(),
                &crate::round::RoundChance::beyond_lists(150.0),
            ),
            Default::default(),
            1,
            0,
            true,
        )
        .expect("solved")
        .index(rules, None)
        .expect("indexed");
        let view = View::new(&s);
        let beside = inst.cluster_index("beside").expect("beside");
        let u = (0..2)
            .find(|&u| s.map.allocations(u).iter().any(|a| a.cluster == beside))
            .expect("a unit placed beyond its list");
        let cands = explain(&view, &inst, &s.map, u, &Rescore::default());
        assert_eq!(cands.len(), 2, "{cands:?}");
        assert_eq!(
            (cands[0].cluster.as_str(), cands[0].verdict),
            ("near", "passed over")
        );
        assert_eq!(
            (cands[1].cluster.as_str(), cands[1].verdict),
            ("beside", "placed")
        );
        assert!((cands[1].share - 1.0).abs() < 1e-12);
        // 111 km by the distance model, calibrated by "near"'s score: 10 ms at 0 km.
        let model = |km: f64| cdnmap_mapper::geo::rtt_from_km(km);
        let km = cdnmap_mapper::geo::distance_km(0.0, 0.0, 1.0, 0.0);
        let want = (model(km) - model(0.0) + 10.0) as f32;
        assert!((cands[1].score - want).abs() < 1e-3, "{}", cands[1].score);
        assert!(
            cands[1].why.contains("beyond the unit's candidate list"),
            "{}",
            cands[1].why
        );
    }

    #[test]
    fn a_drained_cluster_is_named_as_the_reason() {
        let inst = instance("drained");
        let s = snapshot(&inst);
        let view = View::new(&s);
        let app = inst.unit_index("app").expect("app");
        let cands = explain(&view, &inst, &s.map, app, &Rescore::default());
        assert_eq!(cands[0].verdict, "passed over");
        assert_eq!(cands[0].state, ClusterState::Drained);
        // Nothing there is +0 (JSON "0.0", not "-0.0").
        assert!(cands[0].amount == 0.0 && cands[0].amount.is_sign_positive());
        assert!(cands[0].share.is_sign_positive());
        assert!(cands[0].why.contains("was drained"), "{}", cands[0].why);
        assert_eq!(cands[1].verdict, "placed");
        assert!((cands[1].share - 1.0).abs() < 1e-12);
        let near = inst.cluster_index("near").expect("near") as usize;
        assert_eq!(view.utilization[near], 0.0);
        assert_eq!(view.demand[near], 0.0);
    }

    #[test]
    fn regions_group_units_and_flows_add_up_to_the_placed_demand() {
        let inst = instance("up");
        let s = snapshot(&inst);
        let view = View::new(&s);
        // Both units are in the cell 50–55°N, 5–10°E.
        assert_eq!(view.regions.len(), 1);
        let r = &view.regions[0];
        assert_eq!(r.units, 2);
        assert!((r.demand - 46.0).abs() < 1e-9);
        assert!(r.lat > 51.0 && r.lat < 52.0 && r.lon == 9.0, "{r:?}");
        let to: f64 = view.flows.iter().map(|f| f.amount).sum();
        assert!((to - s.map.total_allocated()).abs() < 1e-9);
        assert_eq!(view.flows[0].cluster, "near");
        assert!((view.flows[0].amount - 42.0).abs() < 1e-9);
    }
}
