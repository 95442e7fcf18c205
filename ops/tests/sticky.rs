//! Stickiness on generated worlds: seeded rounds move little demand, and only for a reason.
//! (DESIGN.md "Stickiness"; the figures asserted here were measured with the seeds below and
//! are printed by `cargo test -p cdnmap-ops --test sticky -- --nocapture`.)

use cdnmap_mapper::{
    churn, favour_incumbents, solve, solve_seeded, verify, ClusterState, Instance, Map,
    SolveOptions, Stickiness, UnitIdx,
};
use cdnmap_world::world::{generate, perturb, WorldParams};

fn world(seed: u64) -> cdnmap_topology::Topology {
    let params = WorldParams {
        map_units: 20_000,
        clusters: 80,
        seed,
        ..WorldParams::default()
    };
    match generate(&params, &|_| {}) {
        Ok(w) => w,
        Err(e) => panic!("generating the world: {e:#}"),
    }
}

fn cold(inst: &Instance) -> Map {
    let sol = solve(inst, &SolveOptions::default());
    assert_verified(inst, &sol.map);
    sol.map
}

/// A sticky round: effective preferences from `previous`, solved warm from it, verified against
/// the effective preferences (the ones actually used).
fn sticky(inst: &Instance, previous: &Map, stickiness: &Stickiness) -> Map {
    let effective = match favour_incumbents(inst, previous, stickiness) {
        Ok(e) => e,
        Err(e) => panic!("effective preferences: {e}"),
    };
    let sol = solve_seeded(&effective, previous, &SolveOptions::default());
    assert_verified(&effective, &sol.map);
    assert_eq!(sol.stats.blocking_pairs_left, 0);
    sol.map
}

fn assert_verified(inst: &Instance, map: &Map) {
    let report = verify::verify(inst, map);
    assert!(report.is_ok(), "{}", report.describe(inst, 20));
}

#[test]
fn same_inputs_and_previous_map_give_the_same_map() {
    let inst = world(1);
    let m0 = cold(&inst);
    let m1 = sticky(&inst, &m0, &Stickiness::default());
    let c = churn(&inst, &m0, &m1);
    assert!(c <= 1e-12, "churn {c}"); // float residue of overflow shares only
    for u in 0..inst.unit_count() as UnitIdx {
        let (a0, a1) = (m0.allocations(u), m1.allocations(u));
        let clusters =
            |a: &[cdnmap_mapper::Allocation]| a.iter().map(|x| x.cluster).collect::<Vec<_>>();
        assert_eq!(clusters(a0), clusters(a1), "unit {}", inst.unit_id(u));
        for (x, y) in a0.iter().zip(a1) {
            // Equal up to the float residue a cold solve's partial evictions leave.
            assert!((x.amount - y.amount).abs() <= 1e-9 * inst.unit_demand(u));
        }
        assert!((m0.overflow(u) - m1.overflow(u)).abs() <= 1e-9 * inst.unit_demand(u));
    }
    // The warm start kept every unit that sat wholly at its first choice (most of the demand)
    // and needed no repair; the other units proposed again and landed where they were.
    let effective = favour_incumbents(&inst, &m0, &Stickiness::default()).expect("effective");
    let sol = solve_seeded(&effective, &m0, &SolveOptions::default());
    assert_eq!(sol.stats.repair_rounds, 0);
    assert!(
        sol.stats.seeded_demand >= 0.8 * inst.total_demand(),
        "seeded {} of {}",
        sol.stats.seeded_demand,
        inst.total_demand()
    );
}

#[test]
fn five_percent_noise_moves_far_less_than_a_cold_solve() {
    let base = world(2);
    let m0 = cold(&base);
    let next = perturb(&base, 5.0, 99).expect("perturb");
    let cold_churn = churn(&next, &m0, &cold(&next));
    let warm = sticky(&next, &m0, &Stickiness::default());
    let warm_churn = churn(&next, &m0, &warm);
    eprintln!("±5% noise: cold churn {cold_churn:.4}, sticky churn {warm_churn:.4}");
    assert!(
        warm_churn <= 0.01,
        "sticky churn {warm_churn} above 1% of demand"
    );
    assert!(
        warm_churn * 5.0 <= cold_churn,
        "sticky churn {warm_churn} not 5x below cold churn {cold_churn}"
    );
}

#[test]
fn a_cluster_going_down_moves_only_its_demand_and_what_it_displaces() {
    let inst = world(3);
    let m0 = cold(&inst);
    // The busiest cluster goes down.
    let per_cluster = m0.demand_per_cluster(&inst);
    let (busiest, lost) = per_cluster
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(c, &d)| (c as u32, d))
        .expect("clusters");
    let down = inst.with_cluster_state(busiest, ClusterState::Down);
    let m1 = sticky(&down, &m0, &Stickiness::default());
    assert_eq!(m1.demand_per_cluster(&down)[busiest as usize], 0.0);
    let moved = churn(&down, &m0, &m1) * down.total_demand();
    eprintln!("cluster down: it had {lost:.1}, moved {moved:.1}");
    assert!(moved >= lost * (1.0 - 1e-9), "its own demand must move");
    assert!(moved <= 1.2 * lost, "moved {moved} > 1.2 x {lost}");
}

#[test]
fn stickiness_does_not_strand_demand_a_cold_solve_would_place() {
    for seed in [4, 5, 6] {
        let base = world(seed);
        let m0 = cold(&base);
        let next = perturb(&base, 5.0, seed + 100).expect("perturb");
        let cold_overflow = cold(&next).total_overflow();
        let warm_overflow = sticky(&next, &m0, &Stickiness::default()).total_overflow();
        let total = next.total_demand();
        eprintln!(
            "seed {seed}: overflow cold {:.4}% sticky {:.4}%",
            100.0 * cold_overflow / total,
            100.0 * warm_overflow / total
        );
        // Sticky maps are stable for other preferences, so their overflow may differ; bound it.
        assert!(
            warm_overflow <= cold_overflow + 0.002 * total,
            "sticky overflow {warm_overflow} vs cold {cold_overflow}"
        );
    }
}

#[test]
fn stickiness_zero_is_a_cold_solve() {
    let base = world(7);
    let m0 = cold(&base);
    let next = perturb(&base, 5.0, 7).expect("perturb");
    let effective = favour_incumbents(&next, &m0, &Stickiness::OFF).expect("effective");
    assert_eq!(effective, next.instance);
    assert!(favour_incumbents(&next, &m0, &Stickiness::margin(0.95)).is_err());
    assert!(favour_incumbents(&next, &m0, &Stickiness::margin(f64::NAN)).is_err());
}
