//! Go with the winner (issue 44): a traffic class whose answers name a second cluster.
//!
//! A client that gets two clusters' addresses does not always use the first: resolvers rotate
//! an answer's addresses, and go-with-the-winner clients connect to several and keep the
//! fastest. So an answer that names a second cluster sends it a share of the unit's clients,
//! and that share must be in the map, or no capacity account sees it. A class with a
//! `companion_share` `s` > 0 gets, for every unit the map places, a **companion**: the unit's
//! most preferred up candidate outside its own allocations with room for `s × demand` on every
//! node of its path (the previous round's companion first, so a companion is as sticky as a
//! placement). That share is **reserved** there, and the rest of the map is solved again with
//! the reservations taken out: the unit's demand less its companion's share, each node's
//! capacity less what the companions use on it ([`reserved`]). The map is then the residual
//! instance's stable allocation with the companions added ([`Map::push_unit_with`]), which is
//! how the verifier checks it too ([`crate::verify`]).
//!
//! A unit without a candidate that has room for its companion gets none: its answers name only
//! the clusters it is placed at, so its accounts hold all the same.
//!
//! Promises: the companions fit the residual capacity of the map they were chosen from (so the
//! residual instance can place at least what that map placed); a companion is an up candidate
//! of its unit and none of its allocations; deterministic (units in index order).

use crate::map::{node_usage, Allocation, Map};
use crate::model::{ClassIdx, ClusterIdx, ClusterState, Instance, UnitIdx};
use crate::solve::{solve_seeded, Solution, SolveOptions};
use crate::ModelError;

/// Relative slack when comparing a companion's load with a node's room.
const EPS: f64 = 1e-9;

/// The companions a map was given, and the instance they leave: what the rest of the map is a
/// stable allocation of.
pub struct Reserved {
    /// The instance with the companions reserved ([`reserved`]).
    pub instance: Instance,
    /// The companions, by unit, ascending.
    pub companions: Vec<(UnitIdx, Allocation)>,
}

/// The round's step for companions: `sol` (a solve of `preferences`, the effective preferences
/// of `instance`) given its companions ([`choose`], `previous`'s first), and solved again from
/// itself on `preferences` with them reserved ([`reserved`]); [`combine`] then adds them to
/// the map (after anything else done to it on the reserved instance, such as the second
/// chance). `None` (and `sol` as it was) when no class has companions or no unit got one.
pub fn reserve(
    instance: &Instance,
    preferences: &Instance,
    previous: Option<&Map>,
    sol: &mut Solution,
    options: &SolveOptions,
) -> Result<Option<Reserved>, ModelError> {
    let companions = choose(instance, preferences, &sol.map, previous);
    if companions.is_empty() {
        return Ok(None);
    }
    let instance = reserved(instance, &companions)?;
    let preferences = reserved(preferences, &companions)?;
    *sol = solve_seeded(&preferences, &sol.map, options);
    Ok(Some(Reserved {
        instance,
        companions,
    }))
}

/// A unit of `demand` in a class of companion share `share`: what is left to place, and what
/// its companion reserves. The one definition (the round and the store's compact map both
/// compute it, so a unit placed whole beside its companion is stored without its amounts).
pub fn split(share: f64, demand: f64) -> (f64, f64) {
    let reserved = share * demand;
    ((demand - reserved).max(0.0), reserved)
}

/// Whether any class of `instance` has companions.
pub fn any(instance: &Instance) -> bool {
    instance.classes().iter().any(|k| k.companion_share > 0.0)
}

/// The companions of `map`'s units (`map` has none yet; `instance` its capacities, `order` the
/// preferences a unit's candidates are tried in, which may be the round's effective ones),
/// each unit's previous companion (in `previous`, by the same unit index) tried first. In unit
/// order, one per unit at most.
pub fn choose(
    instance: &Instance,
    order: &Instance,
    map: &Map,
    previous: Option<&Map>,
) -> Vec<(UnitIdx, Allocation)> {
    if !any(instance) {
        return Vec::new();
    }
    let mut residual: Vec<f64> = instance.capacities();
    for (r, used) in residual.iter_mut().zip(node_usage(instance, map)) {
        *r -= used;
    }
    let mut out = Vec::new();
    for u in 0..instance.unit_count().min(map.unit_count()) as UnitIdx {
        let k = instance.unit_class(u);
        let share = instance.classes()[usize::from(k)].companion_share;
        let placed = map.placed(u);
        let (_, amount) = split(share, instance.unit_demand(u));
        if share == 0.0 || placed.is_empty() || amount <= 0.0 {
            continue;
        }
        let own = |c: ClusterIdx| placed.iter().any(|a| a.cluster == c);
        let listed = |c: ClusterIdx| order.candidates(u).any(|x| x.cluster == c);
        let before = previous
            .and_then(|p| (u < p.unit_count() as UnitIdx).then(|| p.companion(u)))
            .flatten()
            .map(|a| a.cluster)
            .filter(|&c| listed(c));
        let found = before
            .into_iter()
            .chain(order.candidates(u).map(|x| x.cluster))
            .find(|&c| !own(c) && room(instance, &residual, k, c) >= amount * (1.0 + EPS));
        if let Some(cluster) = found {
            load(instance, &mut residual, k, cluster, amount);
            out.push((u, Allocation { cluster, amount }));
        }
    }
    out
}

/// How much demand of class `k` fits at cluster `c` with `residual` room on its nodes.
fn room(instance: &Instance, residual: &[f64], k: ClassIdx, c: ClusterIdx) -> f64 {
    let cl = &instance.clusters()[c as usize];
    if cl.state != ClusterState::Up || !cl.serves(k) {
        return 0.0;
    }
    let per_unit = instance.classes()[usize::from(k)].per_unit;
    let mut room = f64::INFINITY;
    for n in cl.path(k) {
        let coef = per_unit.get(cl.nodes[n as usize].kind);
        if coef > 0.0 {
            room = room.min(residual[instance.global_node(c, n)].max(0.0) / coef);
        }
    }
    room
}

/// Takes `amount` of class `k` at `c` out of `residual`.
fn load(instance: &Instance, residual: &mut [f64], k: ClassIdx, c: ClusterIdx, amount: f64) {
    let cl = &instance.clusters()[c as usize];
    let per_unit = instance.classes()[usize::from(k)].per_unit;
    for n in cl.path(k) {
        residual[instance.global_node(c, n)] -= amount * per_unit.get(cl.nodes[n as usize].kind);
    }
}

/// `instance` with `companions` reserved: each unit's demand less its companion's amount, each
/// node's capacity less what the companions use on it (never below 0). The rest of the map is
/// the stable allocation of this instance.
pub fn reserved(
    instance: &Instance,
    companions: &[(UnitIdx, Allocation)],
) -> Result<Instance, ModelError> {
    let mut demands = instance.demands().to_vec();
    let mut reservations = Map::with_capacity(instance.unit_count(), companions.len());
    let mut next = companions.iter().peekable();
    for u in 0..instance.unit_count() as UnitIdx {
        match next.next_if(|(v, _)| *v == u) {
            Some(&(_, a)) => {
                demands[u as usize] = (demands[u as usize] - a.amount).max(0.0);
                debug_assert_eq!(
                    demands[u as usize].to_bits(),
                    split(
                        instance.classes()[usize::from(instance.unit_class(u))].companion_share,
                        instance.unit_demand(u)
                    )
                    .0
                    .to_bits()
                );
                reservations.push_unit([a], 0.0);
            }
            None => reservations.push_unit([], 0.0),
        }
    }
    let capacities: Vec<f64> = instance
        .capacities()
        .into_iter()
        .zip(node_usage(instance, &reservations))
        .map(|(c, used)| (c - used).max(0.0))
        .collect();
    let per_unit: Vec<_> = instance.classes().iter().map(|k| k.per_unit).collect();
    instance
        .with_demands(demands)?
        .with_capacities(&per_unit, &capacities)
}

/// The map of `placed` (the residual instance's, without companions) with `companions` added.
/// A companion at a cluster the unit is now placed at (the solve of the residual instance moved
/// it there) is dropped into that placement: the unit's answers name that cluster anyway; one
/// of a unit the residual instance left wholly in overflow becomes its placement.
pub fn combine(placed: &Map, companions: &[(UnitIdx, Allocation)]) -> Map {
    let mut out = Map::with_capacity(
        placed.unit_count(),
        placed.allocation_count() + companions.len(),
    );
    let mut next = companions.iter().peekable();
    for u in 0..placed.unit_count() as UnitIdx {
        let own = placed.allocations(u);
        match next.next_if(|(v, _)| *v == u) {
            Some(&(_, c)) if own.is_empty() => out.push_unit([c], placed.overflow(u)),
            Some(&(_, c)) if own.iter().any(|a| a.cluster == c.cluster) => {
                let merged = own.iter().map(|a| Allocation {
                    cluster: a.cluster,
                    amount: a.amount
                        + if a.cluster == c.cluster {
                            c.amount
                        } else {
                            0.0
                        },
                });
                out.push_unit(merged, placed.overflow(u));
            }
            Some(&(_, c)) => out.push_unit_with(own.iter().copied(), Some(c), placed.overflow(u)),
            None => out.push_unit(own.iter().copied(), placed.overflow(u)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Limits;
    use crate::solve::solve;
    use crate::testing::parse_instance;
    use crate::verify::verify;
    use serde_json::{json, Value};

    fn cluster(id: &str, capacity: f64) -> Value {
        json!({"id": id, "lat": 50.0, "lon": 8.0, "state": "up",
               "resources": {"name": "up", "kind": "bps", "capacity": capacity,
                             "classes": ["web", "apps"]}})
    }

    fn unit(id: &str, class: &str, demand: f64, cands: &[&str]) -> Value {
        let cands: Vec<Value> = cands
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"cluster": c, "score": 10.0 * (i + 1) as f64}))
            .collect();
        json!({"id": id, "class": class, "demand": demand, "lat": 50.0, "lon": 8.0,
               "candidates": cands})
    }

    /// web (companion share `share`, preferred by clusters) and apps (none); clusters a, b
    /// (capacity 10 each) and c (capacity `c`); `units`.
    fn instance(share: f64, c: f64, units: Vec<Value>) -> Instance {
        let v = json!({
            "traffic_classes": [
                {"name": "web", "priority": 0, "per_unit": {"bps": 1.0, "fps": 0.0},
                 "companion_share": share},
                {"name": "apps", "priority": 1, "per_unit": {"bps": 1.0, "fps": 0.0}},
            ],
            "clusters": [cluster("a", 10.0), cluster("b", 10.0), cluster("c", c)],
            "map_units": units,
        });
        parse_instance(v.to_string().as_bytes(), Limits::default()).expect("a valid instance")
    }

    /// The round's sequence: solve, reserve, combine.
    fn solved(inst: &Instance, previous: Option<&Map>) -> Map {
        let options = SolveOptions::default();
        let mut sol = match previous {
            Some(p) => solve_seeded(inst, &p.without_companions(), &options),
            None => solve(inst, &options),
        };
        match reserve(inst, inst, previous, &mut sol, &options).expect("reserved") {
            Some(r) => combine(&sol.map, &r.companions),
            None => sol.map,
        }
    }

    fn at(inst: &Instance, map: &Map, u: &str) -> Vec<(String, f64)> {
        let u = inst.unit_index(u).expect("a unit");
        map.allocations(u)
            .iter()
            .map(|a| (inst.clusters()[a.cluster as usize].id.clone(), a.amount))
            .collect()
    }

    /// web unit x (demand 10, a then b) fills a; apps unit y (5, a only) is left over. x's
    /// companion takes half of it to b, which frees 5 at a: the rest solved again around the
    /// reservation gives that room to y. Combining the companion with the first map instead
    /// would leave y in overflow beside room it wants: a blocking pair the verifier sees.
    #[test]
    fn the_rest_is_solved_again_around_the_companions() {
        let inst = instance(
            0.5,
            10.0,
            vec![
                unit("x", "web", 10.0, &["a", "b"]),
                unit("y", "apps", 5.0, &["a"]),
            ],
        );
        let map = solved(&inst, None);
        assert_eq!(at(&inst, &map, "x"), [("a".into(), 5.0), ("b".into(), 5.0)]);
        assert_eq!(at(&inst, &map, "y"), [("a".into(), 5.0)]);
        let x = inst.unit_index("x").expect("x");
        assert_eq!(map.companion(x).map(|a| a.amount), Some(5.0));
        assert_eq!(map.placed(x).len(), 1);
        assert!(
            verify(&inst, &map).is_ok(),
            "{}",
            verify(&inst, &map).describe(&inst, 9)
        );

        // The first map with x's demand there scaled down to make room for its companion.
        let first = solve(&inst, &SolveOptions::default()).map;
        let companions = choose(&inst, &inst, &first, None);
        let mut naive = Map::with_capacity(2, 3);
        for u in 0..2 {
            let scaled = first.allocations(u).iter().map(|a| Allocation {
                cluster: a.cluster,
                amount: if u == x { a.amount * 0.5 } else { a.amount },
            });
            let companion = companions.iter().find(|c| c.0 == u).map(|c| c.1);
            naive.push_unit_with(scaled, companion, first.overflow(u));
        }
        let report = verify(&inst, &naive);
        assert_eq!(
            report.blocking_pairs.len(),
            1,
            "{}",
            report.describe(&inst, 9)
        );
    }

    /// A companion needs room for its whole share at one cluster: with b full and c too small,
    /// x gets none, and its demand stays where it was placed.
    #[test]
    fn no_room_no_companion() {
        let inst = instance(
            0.3,
            2.0,
            vec![
                unit("x", "web", 10.0, &["a", "b", "c"]),
                unit("z", "web", 10.0, &["b"]),
            ],
        );
        let map = solved(&inst, None);
        let x = inst.unit_index("x").expect("x");
        assert_eq!(map.companion(x), None);
        assert_eq!(at(&inst, &map, "x"), [("a".into(), 10.0)]);
        assert!(
            verify(&inst, &map).is_ok(),
            "{}",
            verify(&inst, &map).describe(&inst, 9)
        );
    }

    /// The previous companion comes first while it has room, though another candidate is
    /// preferred; a companion never sits where its unit is placed.
    #[test]
    fn companions_stay_where_they_were() {
        let inst = instance(0.25, 10.0, vec![unit("x", "web", 8.0, &["a", "b", "c"])]);
        let map = solved(&inst, None);
        let x = inst.unit_index("x").expect("x");
        let (b, c) = (1, 2);
        assert_eq!(map.companion(x).map(|a| a.cluster), Some(b));
        let mut moved = Map::with_capacity(1, 2);
        moved.push_unit_with(
            map.placed(x).iter().copied(),
            Some(Allocation {
                cluster: c,
                amount: 2.0,
            }),
            0.0,
        );
        let again = solved(&inst, Some(&moved));
        assert_eq!(again.companion(x).map(|a| a.cluster), Some(c));
        assert_eq!(
            at(&inst, &again, "x"),
            [("a".into(), 6.0), ("c".into(), 2.0)]
        );
    }

    /// The verifier holds a companion to its rule: the class's share, an up candidate, not
    /// one of the unit's placements, in a class that has companions.
    #[test]
    fn the_verifier_names_a_forged_companion() {
        let inst = instance(0.25, 10.0, vec![unit("x", "web", 8.0, &["a", "b"])]);
        let forged = |placed: &[(u32, f64)], companion: (u32, f64)| {
            let mut m = Map::with_capacity(1, 3);
            let a = |&(cluster, amount): &(u32, f64)| Allocation { cluster, amount };
            m.push_unit_with(placed.iter().map(a), Some(a(&companion)), 0.0);
            let report = verify(&inst, &m);
            report
                .companions
                .iter()
                .map(|v| v.problem)
                .collect::<Vec<_>>()
        };
        assert!(forged(&[(0, 6.0)], (1, 2.0)).is_empty());
        assert_eq!(
            forged(&[(0, 4.0)], (1, 4.0)),
            ["not the class's share of its demand"]
        );
        assert_eq!(forged(&[(0, 6.0)], (2, 2.0)), ["not one of its candidates"]);
        assert_eq!(
            forged(&[(0, 3.0), (1, 3.0)], (1, 2.0)),
            ["also one of its placements"]
        );
        let none = instance(0.0, 10.0, vec![unit("x", "web", 8.0, &["a", "b"])]);
        let mut m = Map::with_capacity(1, 2);
        m.push_unit_with(
            [Allocation {
                cluster: 0,
                amount: 6.0,
            }],
            Some(Allocation {
                cluster: 1,
                amount: 2.0,
            }),
            0.0,
        );
        let problems: Vec<_> = verify(&none, &m)
            .companions
            .iter()
            .map(|v| v.problem)
            .collect();
        assert_eq!(problems, ["its class has no companions"]);
    }
}
