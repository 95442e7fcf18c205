//! Go with the winner through the round engine on a generated world: rounds with companions
//! (web's companion share 0.3), the second chance beyond the lists on, and the engine's own
//! check (the independent verifier) on every map: cold, then warm rounds seeded from the one
//! before, which keep the companions where they were.

use std::sync::Arc;

use cdnmap_engine::round::{solve_round, RoundChance, Snapshot};
use cdnmap_mapper::{Rescore, Stickiness};
use cdnmap_serve::resolve::ClassRules;
use cdnmap_world::world::{generate, WorldParams};

fn world() -> cdnmap_topology::Topology {
    let params = WorldParams {
        map_units: 20_000,
        clusters: 80,
        seed: 3,
        headroom: 1.3,
        ..WorldParams::default()
    };
    let w = generate(&params, &|_| {}).expect("a world");
    let shares: Vec<f64> = w
        .instance
        .classes()
        .iter()
        .map(|k| if k.name == "web" { 0.3 } else { 0.0 })
        .collect();
    let instance = w.instance.with_companion_shares(&shares).expect("shares");
    w.with_instance(instance)
}

fn round(t: &cdnmap_topology::Topology, previous: Option<&Snapshot>, now: i64) -> Snapshot {
    let chance = RoundChance::beyond_lists_at_default_bound();
    let solved = solve_round(
        t,
        previous,
        None,
        (&Stickiness::default(), &chance),
        Arc::new(Rescore::default()),
        1,
        now,
        true, // the verifier, in every build
    )
    .unwrap_or_else(|e| panic!("round at {now}: {e}"));
    let rules = ClassRules::for_instance(t, &[], "web").expect("rules");
    solved.index(rules, previous).expect("indexed")
}

#[test]
fn rounds_with_companions_verify_and_keep_them() {
    let t = world();
    let first = round(&t, None, 0);
    let companions = |s: &Snapshot| s.map.companion_units().len();
    let web = (0..t.instance.unit_count() as u32)
        .filter(|&u| t.instance.classes()[usize::from(t.instance.unit_class(u))].name == "web")
        .count();
    assert!(
        companions(&first) * 2 >= web,
        "{} of {web} web units have a companion",
        companions(&first)
    );
    let second = round(&t, Some(&first), 10_000);
    let third = round(&t, Some(&second), 20_000);
    // The same inputs: warm rounds keep every companion where it was.
    let kept = third
        .map
        .companion_units()
        .iter()
        .filter(|&&u| third.map.companion(u) == second.map.companion(u))
        .count();
    assert_eq!(
        kept,
        companions(&second),
        "companions moved between equal rounds"
    );
    eprintln!(
        "{} of {web} web units with a companion; {kept} kept over a warm round",
        companions(&third)
    );
}
