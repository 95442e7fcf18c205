//! Property tests of the solver on random instances, judged by the independent verifier.
//!
//! The instances mix everything the model allows: classes consuming Bps and Fps in different
//! proportions (zeros included), tied and distinct priorities, resource trees of several shapes
//! (a single node, per-class or shared leaves, an optional Fps middle node) with capacities that
//! may be 0, demands that may be 0, candidate lists with tied scores and optional `cluster_rank`s,
//! and clusters that are drained or down. On every one:
//!
//! - the verifier accepts the map (capacity, conservation, candidates, liveness, no blocking
//!   pair), and the solver reports no blocking pair left and no proposal bound hit;
//! - no demand is lost (allocated + overflow = demand, per unit and in total), nothing is placed
//!   at a drained or down cluster or outside the candidates, and each unit's allocations are
//!   listed in its preference order;
//! - the solve is deterministic: twice on the same instance, and once on the instance rebuilt from
//!   the same clusters, units and candidates given in a shuffled order, it gives the same map.
//!
//! Each instance is solved in the default arrival order and in id order (the textbook order, in
//! which a single pass over mixed proportions most often leaves blocking pairs), and with repair
//! switched off the solver's own blocking-pair check must see whatever the verifier sees.
//!
//! When every class consumes Bps and Fps in the same proportion a single pass is already stable
//! (DESIGN.md, "Allocation semantics"), so no repair round may run, and both arrival orders find
//! the same (unique, map-unit-optimal) allocation. Seeded world-like instances of a few hundred
//! map units with tight capacities make sure evictions and overflow really happen.
//!
//! Known solver bugs are pinned by `#[ignore]`d tests at the end of the file.

use cdnmap_mapper::solve::Arrival;
use cdnmap_mapper::{
    companion, second_chance, second_chance_seeded, SecondChance, SecondChanceParams,
};
use cdnmap_mapper::{
    effective_preferences, favour_incumbents, solve, solve_seeded, verify, Allocation, Candidate,
    CandidateSpec, ClusterSpec, ClusterState, Instance, InstanceBuilder, Limits, Map, MapUnitSpec,
    PerUnit, Rescore, ResourceKind, ResourceNodeSpec, Solution, SolveOptions, Stickiness,
    TrafficClass, UnitIdx,
};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const CLASS_NAMES: [&str; 3] = ["web", "video", "apps"];

// ---------------------------------------------------------------------------------------------
// A random instance as plain data, so that proptest can shrink it and print it.

/// One traffic class: priority and per-unit coefficients.
#[derive(Debug, Clone)]
struct ClassGen {
    priority: u32,
    bps: f64,
    fps: f64,
    /// Go with the winner's share (0: none).
    companion: f64,
}

/// One cluster.
///
/// `depth` 1: the root is the only node and carries every class the cluster serves.
/// `depth` 2: leaves directly under the root.
/// `depth` 3: an Fps middle node under the root; leaf slot `s` hangs under it when
/// `under_mid[s]`, else directly under the root.
/// Class `k` (when served) sits on leaf slot `leaf_of[k]`: equal slots share a leaf.
#[derive(Debug, Clone)]
struct ClusterGen {
    depth: u8,
    root_kind: ResourceKind,
    leaf_kind: ResourceKind,
    root_cap: f64,
    mid_cap: f64,
    leaf_caps: [f64; 3],
    leaf_of: [usize; 3],
    under_mid: [bool; 3],
    serves: [bool; 3],
    state: ClusterState,
}

/// One candidate: cluster index, score, optional cluster_rank.
type CandGen = (usize, f64, Option<f64>);

/// One map unit: class index, demand, candidates (already restricted to existing clusters that
/// serve the class, each cluster at most once).
#[derive(Debug, Clone)]
struct UnitGen {
    class: usize,
    demand: f64,
    cands: Vec<CandGen>,
}

#[derive(Debug, Clone)]
struct Gen {
    /// Multiplies every capacity: from scarce (most demand overflows) to roomy.
    cap_scale: f64,
    classes: Vec<ClassGen>,
    clusters: Vec<ClusterGen>,
    units: Vec<UnitGen>,
}

fn coefficient() -> impl Strategy<Value = f64> {
    prop_oneof![
        2 => Just(0.0),
        3 => prop::sample::select(vec![0.25, 0.5, 1.0, 2.0, 4.0]),
        3 => 0.0f64..4.0,
    ]
}

fn capacity() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(0.0),
        4 => 0.0f64..30.0,
        3 => (1u32..20).prop_map(f64::from),
        1 => Just(1e6),
    ]
}

fn demand() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(0.0),
        4 => 0.0f64..10.0,
        3 => (1u32..8).prop_map(f64::from),
    ]
}

fn score() -> impl Strategy<Value = f64> {
    // Small integers give plenty of ties (broken by cluster id).
    prop_oneof![
        3 => (0u32..4).prop_map(f64::from),
        2 => 0.0f64..50.0,
    ]
}

fn rank() -> impl Strategy<Value = Option<f64>> {
    prop::option::weighted(
        0.3,
        prop_oneof![(0u32..3).prop_map(f64::from), 0.0f64..10.0],
    )
}

fn kind() -> impl Strategy<Value = ResourceKind> {
    prop_oneof![Just(ResourceKind::Bps), Just(ResourceKind::Fps)]
}

fn state() -> impl Strategy<Value = ClusterState> {
    prop_oneof![
        8 => Just(ClusterState::Up),
        1 => Just(ClusterState::Drained),
        1 => Just(ClusterState::Down),
    ]
}

fn cluster_gen() -> impl Strategy<Value = ClusterGen> {
    (
        (
            1u8..=3,
            prop_oneof![4 => Just(ResourceKind::Bps), 1 => Just(ResourceKind::Fps)],
            kind(),
        ),
        (capacity(), capacity(), [capacity(), capacity(), capacity()]),
        [0usize..3, 0usize..3, 0usize..3],
        [any::<bool>(), any::<bool>(), any::<bool>()],
        [
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.8),
        ],
        state(),
    )
        .prop_map(
            |(
                (depth, root_kind, leaf_kind),
                (root_cap, mid_cap, leaf_caps),
                leaf_of,
                under_mid,
                serves,
                state,
            )| {
                ClusterGen {
                    depth,
                    root_kind,
                    leaf_kind,
                    root_cap,
                    mid_cap,
                    leaf_caps,
                    leaf_of,
                    under_mid,
                    serves,
                    state,
                }
            },
        )
}

/// How big the random instances get.
#[derive(Debug, Clone)]
struct Sizes {
    clusters: std::ops::RangeInclusive<usize>,
    units: std::ops::RangeInclusive<usize>,
    /// Candidates drawn per unit (before dropping repeats and clusters without the class).
    cands: std::ops::Range<usize>,
}

/// 1–40 map units, 1–6 clusters, up to 7 candidates.
fn small() -> Sizes {
    Sizes {
        clusters: 1..=6,
        units: 1..=40,
        cands: 0..8,
    }
}

/// Random instances with classes built by `classes`.
fn gen_with(classes: BoxedStrategy<Vec<ClassGen>>, sizes: Sizes) -> impl Strategy<Value = Gen> {
    let cand = (0usize..6, score(), rank());
    let unit = (
        0usize..3,
        demand(),
        prop::collection::vec(cand, sizes.cands),
    );
    (
        prop::sample::select(vec![1.0, 3.0, 10.0]),
        classes,
        prop::collection::vec(cluster_gen(), sizes.clusters),
        prop::collection::vec(unit, sizes.units),
    )
        .prop_map(|(cap_scale, classes, clusters, units)| {
            let units = units
                .into_iter()
                .map(|(class, demand, cands)| {
                    let class = class % classes.len();
                    let mut seen = Vec::new();
                    let cands = cands
                        .into_iter()
                        .map(|(c, score, rank)| (c % clusters.len(), score, rank))
                        .filter(|&(c, _, _)| {
                            let ok = clusters[c].serves[class] && !seen.contains(&c);
                            seen.push(c);
                            ok
                        })
                        .collect();
                    UnitGen {
                        class,
                        demand,
                        cands,
                    }
                })
                .collect();
            Gen {
                cap_scale,
                classes,
                clusters,
                units,
            }
        })
}

/// 1–3 classes with independent (mixed) coefficients and priorities (ties likely).
fn mixed_classes() -> BoxedStrategy<Vec<ClassGen>> {
    prop::collection::vec(
        (0u32..3, coefficient(), coefficient()).prop_map(|(priority, bps, fps)| ClassGen {
            priority,
            bps,
            fps,
            companion: 0.0,
        }),
        1..=3,
    )
    .boxed()
}

/// [`mixed_classes`], most of them going with the winner (a companion share in (0, 0.5]).
fn companion_classes() -> BoxedStrategy<Vec<ClassGen>> {
    let share = prop_oneof![1 => Just(0.0), 1 => Just(0.5), 3 => 0.01f64..0.5];
    prop::collection::vec(
        (0u32..3, coefficient(), coefficient(), share).prop_map(|(priority, bps, fps, s)| {
            ClassGen {
                priority,
                bps,
                fps,
                companion: s,
            }
        }),
        1..=3,
    )
    .boxed()
}

/// 1–3 classes that all consume Bps and Fps in the same proportion: class k has
/// `(a_k, ratio × a_k)` with one `ratio` for all.
fn proportional_classes() -> BoxedStrategy<Vec<ClassGen>> {
    (
        prop_oneof![
            3 => Just(1.0),
            1 => Just(0.0),
            1 => Just(0.5),
            1 => Just(2.0),
            1 => 0.1f64..4.0,
        ],
        prop::collection::vec((0u32..3, coefficient()), 1..=3),
    )
        .prop_map(|(ratio, v)| {
            v.into_iter()
                .map(|(priority, a)| ClassGen {
                    priority,
                    bps: a,
                    fps: ratio * a,
                    companion: 0.0,
                })
                .collect()
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Building instances.

fn node(name: &str, kind: ResourceKind, capacity: f64) -> ResourceNodeSpec {
    ResourceNodeSpec {
        name: name.into(),
        kind,
        capacity,
        classes: vec![],
        children: vec![],
    }
}

fn cluster_id(i: usize) -> String {
    format!("c{i}")
}

fn unit_id(m: usize) -> String {
    // Not in generation order once sorted ("u10" < "u2"), so the builder's sort matters.
    format!("u{m}")
}

impl ClusterGen {
    fn spec(&self, id: String, n_classes: usize, scale: f64) -> ClusterSpec {
        let served: Vec<usize> = (0..n_classes).filter(|&k| self.serves[k]).collect();
        let mut nodes = vec![node("root", self.root_kind, scale * self.root_cap)];
        if self.depth == 1 {
            nodes[0].classes = served.iter().map(|&k| CLASS_NAMES[k].into()).collect();
        } else {
            if self.depth == 3 {
                nodes[0].children.push("mid".into());
                nodes.push(node("mid", ResourceKind::Fps, scale * self.mid_cap));
            }
            let mut slots: Vec<usize> = served.iter().map(|&k| self.leaf_of[k]).collect();
            slots.sort_unstable();
            slots.dedup();
            for s in slots {
                let name = format!("leaf{s}");
                let mut leaf = node(&name, self.leaf_kind, scale * self.leaf_caps[s]);
                leaf.classes = served
                    .iter()
                    .filter(|&&k| self.leaf_of[k] == s)
                    .map(|&k| CLASS_NAMES[k].into())
                    .collect();
                let parent = if self.depth == 3 && self.under_mid[s] {
                    1
                } else {
                    0
                };
                nodes[parent].children.push(name);
                nodes.push(leaf);
            }
        }
        ClusterSpec {
            id,
            lat: 0.0,
            lon: 0.0,
            state: self.state,
            serves: None,
            resources: nodes,
        }
    }
}

impl Gen {
    fn classes(&self) -> Vec<TrafficClass> {
        self.classes
            .iter()
            .enumerate()
            .map(|(k, c)| TrafficClass {
                name: CLASS_NAMES[k].into(),
                priority: c.priority,
                per_unit: PerUnit {
                    bps: c.bps,
                    fps: c.fps,
                },
                companion_share: c.companion,
            })
            .collect()
    }

    /// The instance, with clusters, map units and each unit's candidates pushed in the order
    /// given by `shuffle` (`None`: generation order).
    fn build(&self, shuffle: Option<u64>) -> Instance {
        let mut rng = ChaCha8Rng::seed_from_u64(shuffle.unwrap_or(0));
        let mut clusters: Vec<ClusterSpec> = self
            .clusters
            .iter()
            .enumerate()
            .map(|(i, c)| c.spec(cluster_id(i), self.classes.len(), self.cap_scale))
            .collect();
        let mut order: Vec<usize> = (0..self.units.len()).collect();
        if shuffle.is_some() {
            clusters.shuffle(&mut rng);
            order.shuffle(&mut rng);
        }
        let mut b = InstanceBuilder::new(self.classes(), clusters, Limits::default())
            .expect("valid classes and clusters");
        let ids: Vec<String> = (0..self.units.len()).map(unit_id).collect();
        let cluster_ids: Vec<String> = (0..self.clusters.len()).map(cluster_id).collect();
        for m in order {
            let u = &self.units[m];
            let mut cands: Vec<CandidateSpec<'_>> = u
                .cands
                .iter()
                .map(|&(c, score, cluster_rank)| CandidateSpec {
                    cluster: &cluster_ids[c],
                    score,
                    cluster_rank,
                })
                .collect();
            if shuffle.is_some() {
                cands.shuffle(&mut rng);
            }
            b.push_unit(&MapUnitSpec {
                id: &ids[m],
                class: CLASS_NAMES[u.class],
                demand: u.demand,
                lat: 0.0,
                lon: 0.0,
                candidates: &cands,
            })
            .expect("valid map unit");
        }
        b.finish().expect("valid instance")
    }
}

// ---------------------------------------------------------------------------------------------
// The properties.

/// Everything a solve must satisfy on any instance.
fn check_solution(inst: &Instance, sol: &Solution) -> Result<(), TestCaseError> {
    let report = verify::verify(inst, &sol.map);
    prop_assert!(
        report.is_ok(),
        "verifier: {}\nstats: {:?}",
        report.describe(inst, 20),
        sol.stats
    );
    prop_assert_eq!(sol.stats.blocking_pairs_left, 0, "stats: {:?}", sol.stats);
    prop_assert!(!sol.stats.proposal_bound_hit, "stats: {:?}", sol.stats);
    prop_assert_eq!(sol.map.unit_count(), inst.unit_count());

    // No demand lost, in total...
    let total = inst.total_demand();
    let placed = sol.map.total_allocated() + sol.map.total_overflow();
    prop_assert!(
        (placed - total).abs() <= 1e-9 * total,
        "demand {} but allocated {} + overflow {}",
        total,
        sol.map.total_allocated(),
        sol.map.total_overflow()
    );
    // ... and per unit; only at Up candidates, in the unit's preference order.
    for u in 0..inst.unit_count() as UnitIdx {
        let id = inst.unit_id(u);
        let d = inst.unit_demand(u);
        let over = sol.map.overflow(u);
        prop_assert!(over.is_finite() && over >= 0.0, "{}: overflow {}", id, over);
        let mut sum = over;
        let mut last_pos: Option<usize> = None;
        for a in sol.map.allocations(u) {
            prop_assert!(
                a.amount.is_finite() && a.amount > 0.0,
                "{}: amount {}",
                id,
                a.amount
            );
            sum += a.amount;
            let cluster = &inst.clusters()[a.cluster as usize];
            prop_assert_eq!(
                cluster.state,
                ClusterState::Up,
                "{}: {} placed at {} cluster {}",
                id,
                a.amount,
                format!("{:?}", cluster.state),
                &cluster.id
            );
            let pos = inst.candidates(u).position(|c| c.cluster == a.cluster);
            prop_assert!(pos.is_some(), "{}: not a candidate: {}", id, &cluster.id);
            prop_assert!(
                last_pos < pos,
                "{}: allocations not in preference order",
                id
            );
            last_pos = pos;
        }
        prop_assert!(
            (sum - d).abs() <= 1e-9 * d,
            "{}: demand {} but allocated + overflow = {}",
            id,
            d,
            sum
        );
    }
    Ok(())
}

/// Solves `g` with the default options, checks the solution, and checks determinism (the same
/// instance twice; the instance rebuilt from a shuffled input order).
fn check_gen(g: &Gen, shuffle_seed: u64) -> Result<(Instance, Solution), TestCaseError> {
    let inst = g.build(None);
    let opts = SolveOptions::default();
    let sol = solve(&inst, &opts);
    check_solution(&inst, &sol)?;

    let again = solve(&inst, &opts);
    prop_assert!(again.map == sol.map, "solving twice gave different maps");
    prop_assert_eq!(again.stats, sol.stats);

    let shuffled = g.build(Some(shuffle_seed));
    prop_assert!(
        shuffled == inst,
        "the builder did not normalise a shuffled input order"
    );
    let sol2 = solve(&shuffled, &opts);
    prop_assert!(
        sol2.map == sol.map,
        "a shuffled input order gave a different map"
    );
    prop_assert_eq!(sol2.stats.proposals, sol.stats.proposals);
    prop_assert_eq!(sol2.stats.evictions, sol.stats.evictions);
    prop_assert_eq!(sol2.stats.repair_rounds, sol.stats.repair_rounds);
    Ok((inst, sol))
}

/// The round's sequence for classes that go with the winner: `inst` solved (seeded from
/// `previous`'s placements when given), its companions reserved (`previous`'s first) and the
/// rest solved again around them, combined; and the count of units that got one.
fn solve_with_companions(inst: &Instance, previous: Option<&Map>) -> (Map, usize) {
    let opts = SolveOptions::default();
    let mut sol = match previous {
        Some(p) => solve_seeded(inst, &p.without_companions(), &opts),
        None => solve(inst, &opts),
    };
    match companion::reserve(inst, inst, previous, &mut sol, &opts).expect("reservable") {
        Some(r) => (
            companion::combine(&sol.map, &r.companions),
            r.companions.len(),
        ),
        None => (sol.map, 0),
    }
}

/// The textbook arrival order (by map unit id): many more evictions than the default, and the
/// order in which a single pass over mixed proportions most often leaves blocking pairs.
fn by_id() -> SolveOptions {
    SolveOptions {
        arrival: Arrival::Id,
        ..SolveOptions::default()
    }
}

/// Map units that the verifier finds in a blocking pair.
fn blocking_units(inst: &Instance, sol: &Solution) -> usize {
    let mut units: Vec<UnitIdx> = verify::verify(inst, &sol.map)
        .blocking_pairs
        .iter()
        .map(|b| b.map_unit)
        .collect();
    units.dedup();
    units.len()
}

/// With no repair round allowed, the solver's own blocking-pair check (what drives the repair
/// rounds) must see every unit the verifier finds blocking; otherwise repair would stop early.
fn check_detector(inst: &Instance, options: SolveOptions) -> Result<(), TestCaseError> {
    let single = solve(
        inst,
        &SolveOptions {
            max_repair_rounds: 0,
            ..options
        },
    );
    prop_assert_eq!(single.stats.repair_rounds, 0);
    let seen = blocking_units(inst, &single);
    prop_assert!(
        single.stats.blocking_pairs_left >= seen,
        "single pass: the solver reports {} units in blocking pairs, the verifier finds {}:\n{}",
        single.stats.blocking_pairs_left,
        seen,
        verify::verify(inst, &single.map).describe(inst, 20)
    );
    Ok(())
}

/// Per unit, the amount at each candidate (in preference order) and the overflow.
fn amounts(inst: &Instance, sol: &Solution, u: UnitIdx) -> Vec<f64> {
    let mut v: Vec<f64> = inst
        .candidates(u)
        .map(|c| {
            sol.map
                .allocations(u)
                .iter()
                .find(|a| a.cluster == c.cluster)
                .map_or(0.0, |a| a.amount)
        })
        .collect();
    v.push(sol.map.overflow(u));
    v
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Go with the winner: with companions reserved, the map verifies (each companion the
    /// class's share of its unit's demand at an up candidate outside the unit's placements,
    /// every node within capacity over the whole map, the rest a stable allocation of what the
    /// companions leave), cold and in a next round seeded from it; and no demand is lost.
    #[test]
    fn maps_with_companions_verify(g in gen_with(companion_classes(), small())) {
        let inst = g.build(None);
        let (map, _) = solve_with_companions(&inst, None);
        let report = verify::verify(&inst, &map);
        prop_assert!(report.is_ok(), "cold: {}", report.describe(&inst, 20));
        let (next, _) = solve_with_companions(&inst, Some(&map));
        let report = verify::verify(&inst, &next);
        prop_assert!(report.is_ok(), "seeded: {}", report.describe(&inst, 20));
        let total = inst.total_demand();
        let placed = next.total_allocated() + next.total_overflow();
        prop_assert!((placed - total).abs() <= 1e-9 * total, "{placed} of {total}");
        for &u in next.companion_units() {
            let c = next.companion(u).map(|a| a.cluster);
            prop_assert!(next.placed(u).iter().all(|a| Some(a.cluster) != c));
        }
    }
}

proptest! {
    // A failure prints its shrunk input; make it a named test rather than a regressions file.
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Mixed Bps/Fps proportions: the map is feasible, stable, conserving and deterministic, in
    /// the default arrival order and in id order; and the solver's blocking-pair check sees
    /// whatever a single pass leaves.
    #[test]
    fn mixed_instances_solve_to_verified_maps(
        g in gen_with(mixed_classes(), small()),
        shuffle_seed in any::<u64>(),
    ) {
        let (inst, _) = check_gen(&g, shuffle_seed)?;
        let textbook = solve(&inst, &by_id());
        check_solution(&inst, &textbook)?;
        check_detector(&inst, SolveOptions::default())?;
        check_detector(&inst, by_id())?;
    }

    /// Every class consumes Bps and Fps in the same proportion: clusters only ever get pickier,
    /// so the single pass is stable and no repair round runs, in either arrival order (unless
    /// a rejection rotation was turned by whole evictions, which can leave room behind); and
    /// the stable allocation is then the unique map-unit-optimal one, so both orders find the
    /// same.
    #[test]
    fn proportional_instances_need_no_repair(
        g in gen_with(proportional_classes(), small()),
        shuffle_seed in any::<u64>(),
    ) {
        let (inst, sol) = check_gen(&g, shuffle_seed)?;
        if sol.stats.whole_evictions == 0 {
            prop_assert_eq!(sol.stats.repair_rounds, 0, "stats: {:?}", sol.stats);
        }
        let textbook = solve(&inst, &by_id());
        check_solution(&inst, &textbook)?;
        if textbook.stats.whole_evictions == 0 {
            prop_assert_eq!(
                textbook.stats.repair_rounds, 0, "by id: stats: {:?}", textbook.stats
            );
        }
        for u in 0..inst.unit_count() as UnitIdx {
            let (a, b) = (amounts(&inst, &sol, u), amounts(&inst, &textbook, u));
            let tol = 1e-9 * inst.unit_demand(u).max(1.0);
            prop_assert!(
                a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= tol),
                "unit {}: default order {:?}, id order {:?}",
                inst.unit_id(u),
                a,
                b
            );
        }
    }
}

/// The effective preferences written out directly: each candidate the previous map used gets
/// the bonus on its score and explicit rank (and the incumbent mark, with incumbents first);
/// then the unit's order is (score, cluster id) again. Independent of `favour_incumbents`,
/// which keeps the difference from the instance instead.
fn effective_oracle(
    inst: &Instance,
    previous: Option<&Map>,
    stickiness: &Stickiness,
    rescore: &Rescore,
    u: UnitIdx,
) -> Vec<Candidate> {
    let factor = (1.0 - stickiness.margin) as f32;
    let held = |c| {
        stickiness.margin > 0.0
            && previous.is_some_and(|p| {
                p.allocations(u)
                    .iter()
                    .any(|a| a.cluster == c && a.amount > 0.0)
            })
    };
    let mut out: Vec<Candidate> = inst
        .candidates(u)
        .map(|mut c| {
            c.incumbent = false;
            // A measured score replaces the estimate, and the rank it stood for.
            if let Some(m) = rescore.score(u, c.cluster) {
                c.score = m;
                if !c.explicit_rank {
                    c.rank = m;
                }
            }
            if held(c.cluster) {
                c.score *= factor;
                c.rank = if c.explicit_rank {
                    c.rank * factor
                } else {
                    c.score
                };
                c.incumbent = stickiness.incumbents_first;
            }
            c
        })
        .collect();
    out.sort_by(|a, b| a.score.total_cmp(&b.score).then(a.cluster.cmp(&b.cluster)));
    out
}

fn check_effective(
    inst: &Instance,
    previous: &Map,
    stickiness: &Stickiness,
) -> Result<Instance, TestCaseError> {
    let eff = favour_incumbents(inst, previous, stickiness)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    check_against_oracle(inst, &eff, Some(previous), stickiness, &Rescore::default())?;
    Ok(eff)
}

fn check_against_oracle(
    inst: &Instance,
    eff: &Instance,
    previous: Option<&Map>,
    stickiness: &Stickiness,
    rescore: &Rescore,
) -> Result<(), TestCaseError> {
    for u in 0..inst.unit_count() as UnitIdx {
        let got: Vec<Candidate> = eff.candidates(u).collect();
        let want = effective_oracle(inst, previous, stickiness, rescore, u);
        prop_assert_eq!(&got, &want, "unit {}", inst.unit_id(u));
        for (j, c) in want.iter().enumerate() {
            prop_assert_eq!(eff.candidate(u, j), *c);
        }
    }
    Ok(())
}

/// Random measured scores for some of `inst`'s (unit, candidate) pairs, a few of them of
/// clusters that are no candidate of the unit (left out).
fn random_measurements(inst: &Instance, seed: u64) -> Vec<(UnitIdx, u32, f32)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let clusters = inst.clusters().len() as u32;
    let mut out = Vec::new();
    for u in 0..inst.unit_count() as UnitIdx {
        if rng.random_range(0..3u8) != 0 {
            continue;
        }
        for c in inst.candidates(u) {
            if rng.random_bool(0.5) {
                // Sometimes equal to another's, so that ties go by cluster id.
                let score = if rng.random_bool(0.2) {
                    7.0
                } else {
                    rng.random_range(0.5..300.0)
                };
                out.push((u, c.cluster, score));
            }
        }
        if clusters > 0 && rng.random_bool(0.2) {
            let c = rng.random_range(0..clusters);
            if !out.iter().any(|&(x, y, _)| (x, y) == (u, c)) {
                out.push((u, c, 50.0));
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Stickiness's effective preferences, kept as a difference from the instance (promoted
    /// incumbents, reordered units copied aside), read back exactly as the preferences written
    /// out directly; derived once more from themselves as well. A seeded solve of them
    /// verifies against them.
    #[test]
    fn effective_preferences_equal_the_written_out_ones(
        g in gen_with(mixed_classes(), small()),
        margin in 0.01f64..0.9,
        incumbents_first in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let inst = g.build(None);
        let previous = solve(&inst, &SolveOptions::default()).map;
        let stickiness = Stickiness { margin, incumbents_first };
        let eff = check_effective(&inst, &previous, &stickiness)?;
        // A previous map that split most units over several candidates (a cluster named
        // twice, too), so that several incumbents move at once; some amounts are 0 (no
        // incumbent) or tiny (an incumbent all the same).
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut split = Map::with_capacity(inst.unit_count(), 0);
        let mut picks_of = Vec::new();
        for u in 0..inst.unit_count() as UnitIdx {
            let cands: Vec<Candidate> = inst.candidates(u).collect();
            let mut picks = Vec::new();
            for _ in 0..rng.random_range(0..4usize) {
                if let Some(c) = cands.get(rng.random_range(0..cands.len().max(1))) {
                    let amount = match rng.random_range(0..8u8) {
                        0 => 0.0,
                        1 => 5e-324,
                        2 => 1e-12,
                        _ => rng.random_range(0.0..2.0),
                    };
                    picks.push(Allocation { cluster: c.cluster, amount });
                }
            }
            split.push_unit(picks.iter().copied(), 0.0);
            picks_of.push(picks);
        }
        let eff_split = check_effective(&inst, &split, &stickiness)?;
        let from_split = solve_seeded(&eff_split, &split, &SolveOptions::default());
        let report = verify(&eff_split, &from_split.map);
        prop_assert!(report.is_ok(), "{}", report.describe(&eff_split, 5));
        // An amount that is no amount (negative, infinite, NaN) is refused, naming its unit.
        let held: Vec<usize> = (0..picks_of.len()).filter(|&u| !picks_of[u].is_empty()).collect();
        if !held.is_empty() {
            let bad_unit = held[rng.random_range(0..held.len())];
            let bad = [-1.0, -5e-324, f64::INFINITY, f64::NAN][rng.random_range(0..4usize)];
            let mut broken = Map::with_capacity(inst.unit_count(), 0);
            for (u, picks) in picks_of.iter().enumerate() {
                let mut picks = picks.clone();
                if u == bad_unit {
                    let k = rng.random_range(0..picks.len());
                    picks[k].amount = bad;
                }
                broken.push_unit(picks, 0.0);
            }
            let err = favour_incumbents(&inst, &broken, &stickiness)
                .expect_err("a previous map with a bad amount");
            let unit = inst.unit_id(bad_unit as UnitIdx);
            prop_assert!(err.to_string().contains(&format!("{unit:?}")), "{}", err);
        }
        let warm = solve_seeded(&eff, &previous, &SolveOptions::default());
        let report = verify(&eff, &warm.map);
        prop_assert!(report.is_ok(), "{}", report.describe(&eff, 5));
        // Preferences derived from derived ones: the first bonus is part of the scores now.
        check_effective(&eff, &warm.map, &stickiness)?;
    }

    /// Measured scores (issue 19's RTT) in the effective preferences, with stickiness and
    /// without a previous map, read back as the preferences written out directly: each
    /// measured score in place of the estimate, the unit's order by it. A solve of them
    /// verifies against them.
    #[test]
    fn measured_scores_equal_the_written_out_ones(
        g in gen_with(mixed_classes(), small()),
        margin in 0.0f64..0.9,
        incumbents_first in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let inst = g.build(None);
        let measured = random_measurements(&inst, seed);
        let rescore = Rescore::new(&inst, measured.iter().copied())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let outside = measured
            .iter()
            .filter(|&&(u, c, _)| !inst.candidates(u).any(|x| x.cluster == c))
            .count();
        prop_assert_eq!(rescore.not_candidates(), outside);
        prop_assert_eq!(rescore.len(), measured.len() - outside);
        let stickiness = Stickiness { margin, incumbents_first };
        // Cold: measured scores alone.
        let cold_pref = effective_preferences(&inst, None, &stickiness, &rescore)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_against_oracle(&inst, &cold_pref, None, &stickiness, &rescore)?;
        let cold = solve(&cold_pref, &SolveOptions::default());
        let report = verify(&cold_pref, &cold.map);
        prop_assert!(report.is_ok(), "{}", report.describe(&cold_pref, 5));
        // Seeded from a map solved without the measurements, favouring its incumbents.
        let previous = solve(&inst, &SolveOptions::default()).map;
        let warm_pref = effective_preferences(&inst, Some(&previous), &stickiness, &rescore)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_against_oracle(&inst, &warm_pref, Some(&previous), &stickiness, &rescore)?;
        let warm = solve_seeded(&warm_pref, &previous, &SolveOptions::default());
        let report = verify(&warm_pref, &warm.map);
        prop_assert!(report.is_ok(), "{}", report.describe(&warm_pref, 5));
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// `with_demands` and `with_costs` (what a round's estimates change, sharing the other
    /// columns) give the instance the file form rebuilds with the same changes, and the same
    /// map; bad numbers are refused naming their unit, class or cluster.
    #[test]
    fn edits_equal_the_rebuild_through_the_file_form(
        g in gen_with(mixed_classes(), small()),
        seed in any::<u64>(),
    ) {
        use cdnmap_topology::format::{InstanceFile, NestedNode, ResourcesFile};
        fn scale(n: &mut NestedNode, f: f64) {
            n.capacity *= f;
            n.children.iter_mut().for_each(|c| scale(c, f));
        }
        let inst = g.build(None);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let demands: Vec<f64> = (0..inst.unit_count())
            .map(|_| if rng.random_bool(0.1) { 0.0 } else { rng.random_range(0.0..50.0) })
            .collect();
        let per_unit: Vec<PerUnit> = inst
            .classes()
            .iter()
            .map(|_| PerUnit { bps: rng.random_range(0.0..3.0), fps: rng.random_range(0.0..3.0) })
            .collect();
        let factors: Vec<f64> = inst
            .clusters()
            .iter()
            .map(|_| if rng.random_bool(0.5) { 1.0 } else { rng.random_range(0.25..1.0) })
            .collect();
        let edited = inst
            .with_demands(demands.clone())
            .and_then(|i| i.with_costs(&per_unit, &factors))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut file = InstanceFile::of(&cdnmap_topology::Topology::bare(inst.clone()));
        for (u, d) in file.map_units.iter_mut().zip(&demands) {
            u.demand = *d;
        }
        for (c, p) in file.traffic_classes.iter_mut().zip(&per_unit) {
            c.per_unit = *p;
        }
        for (c, &f) in file.clusters.iter_mut().zip(&factors) {
            if let ResourcesFile::Nested(root) = &mut c.resources {
                scale(root, f);
            }
        }
        let rebuilt = file.build(Limits::default()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&edited, &rebuilt.instance);
        let (a, b) = (solve(&edited, &SolveOptions::default()), solve(&rebuilt, &SolveOptions::default()));
        prop_assert_eq!(a.map, b.map);
        if inst.unit_count() > 0 {
            let mut bad = demands.clone();
            let u = rng.random_range(0..bad.len());
            bad[u] = [-1.0, f64::NAN, f64::INFINITY][rng.random_range(0..3usize)];
            let err = inst.with_demands(bad).expect_err("a bad demand");
            prop_assert!(err.to_string().contains(&format!("{:?}", inst.unit_id(u as UnitIdx))), "{}", err);
        }
        let mut bad = factors.clone();
        bad[0] = -0.5;
        let err = inst.with_costs(&per_unit, &bad).expect_err("a bad factor");
        prop_assert!(err.to_string().contains(&inst.clusters()[0].id), "{}", err);
    }
}

/// The generators are not vacuous: a fixed sample of 256 instances from each contains, in a
/// good share of cases, evictions, units split over several clusters, overflow at units with
/// `Up` candidates (full clusters), and demand whose candidates include drained or down ones.
#[test]
fn generators_reach_the_interesting_cases() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let strategies = [
        ("mixed", gen_with(mixed_classes(), small()).boxed()),
        (
            "proportional",
            gen_with(proportional_classes(), small()).boxed(),
        ),
    ];
    for (name, strategy) in strategies {
        let mut runner = TestRunner::deterministic();
        let (mut evicted, mut split, mut full, mut not_up) = (0, 0, 0, 0);
        for _ in 0..256 {
            let g = strategy
                .new_tree(&mut runner)
                .expect("a generated instance")
                .current();
            let inst = g.build(None);
            let sol = solve(&inst, &by_id());
            let units = 0..inst.unit_count() as UnitIdx;
            let up = |c: cdnmap_mapper::Candidate| {
                inst.clusters()[c.cluster as usize].state == ClusterState::Up
            };
            evicted += usize::from(sol.stats.evictions > 0);
            split += usize::from(units.clone().any(|u| sol.map.allocations(u).len() > 1));
            full += usize::from(
                units
                    .clone()
                    .any(|u| sol.map.overflow(u) > 0.0 && inst.candidates(u).any(up)),
            );
            not_up += usize::from(
                units
                    .clone()
                    .any(|u| inst.unit_demand(u) > 0.0 && inst.candidates(u).any(|c| !up(c))),
            );
        }
        for (what, count) in [
            ("evictions", evicted),
            ("split units", split),
            ("overflow at full candidates", full),
            ("drained or down candidates", not_up),
        ] {
            assert!(
                count >= 25,
                "{name}: only {count} of 256 instances have {what}"
            );
        }
    }
}

/// A single pass over mixed proportions can leave a blocking pair, and repair removes it. One
/// cluster: Bps root (11.78) over one shared Fps leaf (28.77). Class `web` (priority 1) takes
/// Bps 3.2 and Fps 0.25; `video` (priority 2) Fps 0.5 only; `apps` (priority 0) Fps 4 only. In
/// id order: u0 (web) fills the root; u1 (video) and u2 (apps) fill the leaf; u3 (web, liked more
/// than u0) then evicts, leaf first, the leaf's worst holder (u1) and, at the root, u0 — whose
/// departure frees leaf room too, so u1 was evicted for nothing: (u1, c0) blocks. The solver
/// must detect it (the verifier sees it) and the repaired map must verify.
#[test]
fn repair_fixes_leaf_first_over_eviction() {
    let g = Gen {
        cap_scale: 1.0,
        classes: vec![
            ClassGen {
                priority: 1,
                bps: 3.2025839744576334,
                fps: 0.25,
                companion: 0.0,
            },
            ClassGen {
                priority: 2,
                bps: 0.0,
                fps: 0.5,
                companion: 0.0,
            },
            ClassGen {
                priority: 0,
                bps: 0.0,
                fps: 4.0,
                companion: 0.0,
            },
        ],
        clusters: vec![ClusterGen {
            depth: 2,
            root_kind: ResourceKind::Bps,
            leaf_kind: ResourceKind::Fps,
            root_cap: 11.779330329606033,
            mid_cap: 0.0,
            leaf_caps: [0.0, 0.0, 28.76626509495902],
            leaf_of: [2, 2, 2],
            under_mid: [false; 3],
            serves: [true; 3],
            state: ClusterState::Up,
        }],
        units: vec![
            UnitGen {
                class: 0,
                demand: 5.107269258226914,
                cands: vec![(0, 1.0, None)],
            },
            UnitGen {
                class: 1,
                demand: 9.45121617632907,
                cands: vec![(0, 0.0, None)],
            },
            UnitGen {
                class: 2,
                demand: 6.242824966425776,
                cands: vec![(0, 0.0, None)],
            },
            UnitGen {
                class: 0,
                demand: 9.256933207342609,
                cands: vec![(0, 0.0, None)],
            },
        ],
    };
    let inst = g.build(None);
    for options in [SolveOptions::default(), by_id()] {
        let single = solve(
            &inst,
            &SolveOptions {
                max_repair_rounds: 0,
                ..options
            },
        );
        let seen = blocking_units(&inst, &single);
        assert!(
            single.stats.blocking_pairs_left >= seen,
            "{options:?}: solver {} < verifier {seen}",
            single.stats.blocking_pairs_left
        );
        let sol = solve(&inst, &options);
        if let Err(e) = check_solution(&inst, &sol) {
            panic!("{options:?}: {e}");
        }
        if seen > 0 {
            assert!(sol.stats.repair_rounds >= 1, "{options:?}: {:?}", sol.stats);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// World-like instances at a few hundred map units.

/// A world-like instance as plain data (so a failing case can be cut down and written out).
#[derive(Debug, Clone)]
struct World {
    classes: Vec<TrafficClass>,
    clusters: Vec<ClusterSpec>,
    units: Vec<WorldUnit>,
}

/// A world map unit: id, class index, demand, candidates (cluster index, score, cluster_rank).
#[derive(Debug, Clone)]
struct WorldUnit {
    id: String,
    class: usize,
    demand: f64,
    cands: Vec<CandGen>,
}

impl World {
    fn instance(&self) -> Instance {
        let mut b = InstanceBuilder::new(
            self.classes.clone(),
            self.clusters.clone(),
            Limits::default(),
        )
        .expect("valid clusters");
        for u in &self.units {
            let cands: Vec<CandidateSpec<'_>> = u
                .cands
                .iter()
                .map(|&(c, score, cluster_rank)| CandidateSpec {
                    cluster: &self.clusters[c].id,
                    score,
                    cluster_rank,
                })
                .collect();
            b.push_unit(&MapUnitSpec {
                id: &u.id,
                class: &self.classes[u.class].name,
                demand: u.demand,
                lat: 0.0,
                lon: 0.0,
                candidates: &cands,
            })
            .expect("valid map unit");
        }
        b.finish().expect("valid instance")
    }
}

/// The world's traffic classes: web (bps 1, fps 0.5), video (bps 4, fps 0.25) and apps
/// (bps 0.25, fps 1); clusters like apps best and video least.
fn world_classes() -> Vec<TrafficClass> {
    let class = |name: &str, priority, bps, fps| TrafficClass {
        name: name.into(),
        priority,
        per_unit: PerUnit { bps, fps },
        companion_share: 0.0,
    };
    vec![
        class("web", 1, 1.0, 0.5),
        class("video", 2, 4.0, 0.25),
        class("apps", 0, 0.25, 1.0),
    ]
}

/// A world-like instance: 20 clusters (bps uplink, fps cpu, one fps leaf per class) at random
/// positions, `units` map units of the world's classes with 3–8 candidates among the nearest
/// clusters (scores in whole milliseconds, so ties happen; a few explicit ranks), some clusters
/// drained or down. Total uplink and cpu capacity are `headroom` × what the demand needs, so
/// with `headroom < 1` overflow is certain.
fn world_like(seed: u64, units: usize, headroom: f64) -> World {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let classes = world_classes();
    let n_clusters = 20;
    let pos: Vec<(f64, f64)> = (0..n_clusters)
        .map(|_| (rng.random_range(0.0..100.0), rng.random_range(0.0..100.0)))
        .collect();
    let mut us = Vec::with_capacity(units);
    let (mut bps_need, mut fps_need) = (0.0, 0.0);
    for m in 0..units {
        let class = rng.random_range(0..3usize);
        let demand = rng.random_range(0.5..20.0f64);
        bps_need += demand * classes[class].per_unit.bps;
        fps_need += demand * classes[class].per_unit.fps;
        let (x, y): (f64, f64) = (rng.random_range(0.0..100.0), rng.random_range(0.0..100.0));
        let mut near: Vec<(f64, usize)> = pos
            .iter()
            .enumerate()
            .map(|(c, &(cx, cy))| (((cx - x).powi(2) + (cy - y).powi(2)).sqrt(), c))
            .collect();
        near.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let k = rng.random_range(3..=8usize);
        let cands = near[..k]
            .iter()
            .map(|&(d, c)| {
                let score = (d + rng.random_range(0.0..5.0)).round();
                let rank = rng
                    .random_bool(0.1)
                    .then(|| f64::from(rng.random_range(0..5u32)));
                (c, score, rank)
            })
            .collect();
        us.push(WorldUnit {
            id: format!("m{m:04}-{}", classes[class].name),
            class,
            demand,
            cands,
        });
    }
    let per_cluster_bps = headroom * bps_need / n_clusters as f64;
    let per_cluster_fps = headroom * fps_need / n_clusters as f64;
    let clusters = (0..n_clusters)
        .map(|i| {
            let size = rng.random_range(0.5..1.5);
            let mut root = node("uplink", ResourceKind::Bps, size * per_cluster_bps);
            let mut cpu = node("cpu", ResourceKind::Fps, size * per_cluster_fps);
            root.children.push("cpu".into());
            let mut nodes = vec![root];
            for name in CLASS_NAMES {
                let leaf_name = format!("{name}-leaf");
                cpu.children.push(leaf_name.clone());
                let mut leaf = node(
                    &leaf_name,
                    ResourceKind::Fps,
                    size * per_cluster_fps * rng.random_range(0.3..0.8),
                );
                leaf.classes.push(name.into());
                nodes.push(leaf);
            }
            nodes.insert(1, cpu);
            let state = match rng.random_range(0..20) {
                0 => ClusterState::Drained,
                1 => ClusterState::Down,
                _ => ClusterState::Up,
            };
            ClusterSpec {
                id: format!("c{i:02}"),
                lat: 0.0,
                lon: 0.0,
                state,
                serves: None,
                resources: nodes,
            }
        })
        .collect();
    World {
        classes,
        clusters,
        units: us,
    }
}

/// Solves a world-like instance and checks everything `check_solution` checks.
fn solve_world(inst: &Instance) -> Solution {
    let sol = solve(inst, &SolveOptions::default());
    if let Err(e) = check_solution(inst, &sol) {
        panic!("{e}");
    }
    sol
}

/// Seeded world-like cases with less uplink capacity than demand: evictions and overflow both
/// happen, and the map still verifies.
#[test]
fn world_like_tight_capacity_evicts_and_overflows() {
    for seed in 0..6 {
        let inst = world_like(seed, 400, 0.8).instance();
        let sol = solve_world(&inst);
        assert!(
            sol.stats.evictions > 0,
            "seed {seed}: no eviction: {:?}",
            sol.stats
        );
        assert!(
            sol.map.total_overflow() > 0.0,
            "seed {seed}: no overflow: {:?}",
            sol.stats
        );
    }
}

/// World-like instances around the capacity limit (from roomy to short), in both arrival
/// orders. The worlds are drawn from a fixed seed rather than by proptest: random worlds now and
/// then hit the solver bug pinned by `world_like_first_pass_stays_within_proposal_bound` (twice
/// in the first ~2,000 random solves), and a known bug must not make CI flaky.
#[test]
fn world_like_instances_verify() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x00C0_FFEE);
    for _ in 0..24 {
        let seed: u64 = rng.random();
        let units = rng.random_range(200..=400usize);
        let headroom = rng.random_range(0.5..1.5);
        let inst = world_like(seed, units, headroom).instance();
        for options in [SolveOptions::default(), by_id()] {
            let sol = solve(&inst, &options);
            if let Err(e) = check_solution(&inst, &sol) {
                panic!("world_like({seed}, {units}, {headroom}), {options:?}: {e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Known bugs: each test states the correct behaviour and is ignored until the solver is fixed.

/// Four map units of one class and three single-node clusters of capacity 1 (the
/// hospitals/residents setting with a divisible demand):
///
/// | unit | demand | candidates (best first) |   | cluster | prefers     |
/// |------|--------|-------------------------|---|---------|-------------|
/// | a    | 1      | x, y                    |   | x       | d > c > a   |
/// | b    | 1      | y, z                    |   | y       | a > b       |
/// | c    | 1      | z, x                    |   | z       | b > c       |
/// | d    | δ      | x                       |   |         |             |
///
/// d displaces δ of a at x; a takes δ from b at y, b from c at z, c from a at x, and round it
/// goes: a rejection rotation that moves exactly δ per turn. The unique stable allocation is
/// a → y, b → z, c → x (1 − δ, overflow δ), d → x (δ); the pass needs about 3/δ offers to
/// reach it.
fn rotation_instance(delta: f64) -> Instance {
    let classes = vec![TrafficClass {
        name: "web".into(),
        priority: 0,
        per_unit: PerUnit { bps: 1.0, fps: 1.0 },
        companion_share: 0.0,
    }];
    let cluster = |id: &str| ClusterSpec {
        id: id.into(),
        lat: 0.0,
        lon: 0.0,
        state: ClusterState::Up,
        serves: None,
        resources: vec![ResourceNodeSpec {
            classes: vec!["web".into()],
            ..node("root", ResourceKind::Bps, 1.0)
        }],
    };
    let clusters = vec![cluster("x"), cluster("y"), cluster("z")];
    let mut b = InstanceBuilder::new(classes, clusters, Limits::default()).expect("valid clusters");
    let cand = |cluster, score, rank| CandidateSpec {
        cluster,
        score,
        cluster_rank: Some(rank),
    };
    let units = [
        ("a", 1.0, vec![cand("x", 1.0, 2.0), cand("y", 2.0, 1.0)]),
        ("b", 1.0, vec![cand("y", 1.0, 2.0), cand("z", 2.0, 1.0)]),
        ("c", 1.0, vec![cand("z", 1.0, 2.0), cand("x", 2.0, 1.0)]),
        ("d", delta, vec![cand("x", 1.0, 0.0)]),
    ];
    for (id, demand, cands) in &units {
        b.push_unit(&MapUnitSpec {
            id,
            class: "web",
            demand: *demand,
            lat: 0.0,
            lon: 0.0,
            candidates: cands,
        })
        .expect("valid map unit");
    }
    b.finish().expect("valid instance")
}

/// Checks the rotation instance's map against its unique stable allocation.
fn check_rotation(delta: f64, options: SolveOptions) -> Result<(), TestCaseError> {
    let inst = rotation_instance(delta);
    let sol = solve(&inst, &options);
    check_solution(&inst, &sol)?;
    let expect = [
        ("a", vec![("y", 1.0)], 0.0),
        ("b", vec![("z", 1.0)], 0.0),
        ("c", vec![("x", 1.0 - delta)], delta),
        ("d", vec![("x", delta)], 0.0),
    ];
    for (id, allocs, overflow) in expect {
        let u = inst.unit_index(id).expect("unit");
        let got: Vec<(&str, f64)> = sol
            .map
            .allocations(u)
            .iter()
            .map(|a| (inst.clusters()[a.cluster as usize].id.as_str(), a.amount))
            .collect();
        prop_assert_eq!(got.len(), allocs.len(), "{}: {:?}", id, got);
        for ((c, x), (wc, wx)) in got.iter().zip(&allocs) {
            prop_assert!(
                c == wc && (x - wx).abs() <= 1e-9,
                "{}: got {:?}, want {:?}",
                id,
                got,
                allocs
            );
        }
        prop_assert!((sol.map.overflow(u) - overflow).abs() <= 1e-9);
    }
    // One class: clusters only get pickier, so no repair round should be needed either.
    prop_assert_eq!(sol.stats.repair_rounds, 0, "stats: {:?}", sol.stats);
    Ok(())
}

/// The rotation with a displacement that is not tiny: solved correctly today.
#[test]
fn rejection_rotation_is_followed_to_the_stable_allocation() {
    for options in [SolveOptions::default(), by_id()] {
        if let Err(e) = check_rotation(0.01, options) {
            panic!("{options:?}: {e}");
        }
    }
}

/// With δ = 1e-4 the first pass runs into its proposal bound (64 × (candidates + units) + 1024
/// = 1728 offers, where the rotation needs ~30,000), leaving demand as overflow; each of the 16
/// repair rounds gets the same budget and runs out too, and the map returned has a blocking pair
/// the verifier reports: (c, x), x could take 1e-4 more of c. Even at δ = 1e-3 the bound is hit
/// (a repair round then finishes the job). The pass is not linear in the candidate lists, as
/// docs/solver.md ("Cost") and DESIGN.md claim: evicted demand re-offered to a unit's current
/// candidate moves along a rejection rotation one displaced amount at a time, so the number of
/// offers grows like demand / δ.
#[test]
fn rejection_rotation_of_a_tiny_displacement_terminates_stable() {
    let mut failures = Vec::new();
    for delta in [1e-3, 1e-4] {
        for options in [SolveOptions::default(), by_id()] {
            if let Err(e) = check_rotation(delta, options) {
                failures.push(format!("δ = {delta}, {:?} arrival: {e}", options.arrival));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same bug in world-like instances (a three-unit web rotation; found by the property
/// tests): the first pass hits its proposal bound (~93,000 offers for 224 map units). Repair
/// rounds happen to recover a stable map here, but the pass costs 64 × (candidates + units)
/// offers, and `proposal_bound_hit` is documented as never seen.
#[test]
fn world_like_first_pass_stays_within_proposal_bound() {
    let cases = [
        (
            3_049_586_609_187_122_150u64,
            224usize,
            0.518_716_808_159_345_1,
            SolveOptions::default(),
        ),
        (
            15_245_858_525_009_966_709,
            241,
            1.003_607_254_605_079_4,
            by_id(),
        ),
    ];
    let mut failures = Vec::new();
    for (seed, units, headroom, options) in cases {
        let inst = world_like(seed, units, headroom).instance();
        let sol = solve(&inst, &options);
        if let Err(e) = check_solution(&inst, &sol) {
            failures.push(format!(
                "world_like({seed}, {units}, {headroom}), {:?} arrival: {e}",
                options.arrival
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The second chance (issue 20) keeps a stable map feasible: no node over its capacity,
    /// every unit's demand conserved, only candidates at up clusters; it never leaves more in
    /// overflow than it found, and every blocking pair the verifier finds after it involves a
    /// unit or a cluster it touched (the stable map had none).
    #[test]
    fn the_second_chance_keeps_the_map_feasible(g in gen_with(mixed_classes(), small())) {
        let inst = g.build(None);
        let stable = solve(&inst, &SolveOptions::default()).map;
        prop_assert!(verify(&inst, &stable).is_ok());
        let (map, report) = second_chance(
            &inst,
            &stable,
            SecondChance::WithinLists,
            &SecondChanceParams::default(),
        );
        let checked = verify(&inst, &map);
        prop_assert!(
            checked.capacity.is_empty()
                && checked.conservation.is_empty()
                && checked.not_candidate.is_empty()
                && checked.unavailable.is_empty(),
            "{}",
            checked.describe(&inst, 5)
        );
        prop_assert!(map.total_overflow() <= stable.total_overflow() * (1.0 + 1e-9) + 1e-9);
        prop_assert!(
            (stable.total_overflow() - map.total_overflow() - report.placed).abs()
                <= 1e-6 * (1.0 + report.placed)
        );
        let (_, other) = report.split(&checked.blocking_pairs);
        prop_assert!(other.is_empty(), "blocking pairs it did not make: {:?}", other);
        // Off is the map as it was.
        let (same, none) = second_chance(&inst, &stable, SecondChance::Off, &SecondChanceParams::default());
        prop_assert_eq!(&same, &stable);
        prop_assert_eq!(none.placements, 0);
    }

    /// Beyond the lists without chains: feasible; the verifier's "not a candidate"
    /// placements are exactly the ones the report lists, each at an up cluster within the
    /// bound of the unit's best listed score; and the map stays stable (the room taken was
    /// room no listed unit wanted).
    #[test]
    fn beyond_the_lists_alone_keeps_the_map_stable(g in gen_with(mixed_classes(), small())) {
        let inst = g.build(None);
        let stable = solve(&inst, &SolveOptions::default()).map;
        prop_assert!(verify(&inst, &stable).is_ok());
        let params = SecondChanceParams {
            max_expansions: 0,
            ..SecondChanceParams::default()
        };
        let (map, report) = second_chance(&inst, &stable, SecondChance::BeyondLists, &params);
        let checked = verify(&inst, &map);
        prop_assert!(feasible_and_stable(&checked), "{}", checked.describe(&inst, 5));
        let mut listed: Vec<(u32, u32)> = report.beyond.iter().map(|b| (b.unit, b.cluster)).collect();
        listed.sort_unstable();
        listed.dedup();
        let found: Vec<(u32, u32)> =
            checked.not_candidate.iter().map(|p| (p.map_unit, p.cluster)).collect();
        prop_assert_eq!(found, listed);
        for b in &report.beyond {
            // The estimate the rest of the system counts such a placement at is the phase's.
            let est = cdnmap_mapper::beyond::estimate_beyond(&inst, b.unit, b.cluster);
            prop_assert!(est.is_some_and(|e| (e as f32 - b.estimate_ms).abs() <= 1e-3 * (1.0 + e as f32)));
            let best = inst.candidates(b.unit).map(|c| c.score).fold(f32::INFINITY, f32::min);
            prop_assert!(b.estimate_ms <= best + params.max_beyond_ms + 1e-3);
            prop_assert!(inst.clusters()[b.cluster as usize].state == ClusterState::Up);
        }
        prop_assert!(
            (stable.total_overflow() - map.total_overflow() - report.placed).abs()
                <= 1e-6 * (1.0 + report.placed)
        );
        // The next round, nothing changed: seeded with this map, the phase gives it back
        // (each unit gets its clusters beyond the list back, in the order it took them).
        let (again, _) =
            second_chance_seeded(&inst, &stable, Some(&map), SecondChance::BeyondLists, &params);
        prop_assert_eq!(&again, &map);
        // A cluster down: still feasible and stable, nothing at the cluster down.
        if let Some(c) = report.clusters.first() {
            let down = inst.with_cluster_state(*c, ClusterState::Down);
            let seeded = solve(&down, &SolveOptions::default()).map;
            let (after, _) =
                second_chance_seeded(&down, &seeded, Some(&map), SecondChance::BeyondLists, &params);
            let checked = verify(&down, &after);
            prop_assert!(feasible_and_stable(&checked), "{}", checked.describe(&down, 5));
        }
    }
}

/// The verifier found every node within capacity, every unit's demand conserved, nothing at a
/// cluster that is not up, and no blocking pair.
fn feasible_and_stable(checked: &cdnmap_mapper::verify::Report) -> bool {
    checked.capacity.is_empty()
        && checked.conservation.is_empty()
        && checked.unavailable.is_empty()
        && checked.blocking_pairs.is_empty()
}
