//! The operator's policy as scores (issue 46): **cost with a latency guard**. With a cost
//! policy ([`crate::model::CostPolicy`]), a unit's score at a cluster is its latency (the
//! measured one when measured, else the instance's estimate) plus `weight` × the cluster's
//! price, raised where needed so that a cluster is never ranked above a candidate more than
//! `guard_ms` better:
//!
//! ```text
//! f(c) = max( rtt(c) + weight·price(c),  just above max { f(b) : rtt(b) + guard_ms < rtt(c) } )
//! ```
//!
//! computed over the unit's candidates in order of latency. The scores order the unit's
//! candidates; its clusters still rank it by latency (the cost is the unit's preference among
//! clusters, and a cluster goes on preferring the units it serves best). They go to the round
//! as measured scores do ([`crate::Rescore`], with those ranks, applied where stickiness
//! applies its bonus), so the solver and the stability verifier see them like any preference; [`guard_violations`] checks
//! the guard on a map by itself, from the latencies alone. Stickiness's margin applies on top,
//! as it does to latencies: a round may keep an incumbent within its margin.

use crate::model::{ClusterIdx, Instance, UnitIdx};
use crate::{Map, Rescore};

/// The latency of unit `u` at cluster `c`: measured when `measured` has it, else `estimate`.
fn latency(measured: &Rescore, u: UnitIdx, c: ClusterIdx, estimate: f32) -> f32 {
    measured.score(u, c).unwrap_or(estimate)
}

/// The smallest f32 above `x` (finite, at least 0).
fn just_above(x: f32) -> f32 {
    f32::from_bits(x.max(0.0).to_bits() + 1)
}

/// The policy's scores of every unit of `instance` (its latencies from `measured` where
/// measured), as measured scores; `None` when the policy changes no score (no cost policy, a
/// weight of 0, or no price above 0). The units in two halves, one on another thread, when
/// there are enough of them (`crate::parts`); the result does not depend on it.
pub fn rescore(instance: &Instance, measured: &Rescore) -> Option<Rescore> {
    let n = instance.unit_count();
    rescore_in_parts(
        instance,
        measured,
        crate::parts::parts_for(n, crate::parts::PARALLEL_ITEMS),
    )
}

/// [`rescore`], the units split into `parts` ranges.
fn rescore_in_parts(instance: &Instance, measured: &Rescore, parts: usize) -> Option<Rescore> {
    let cost = instance.policy().cost.as_ref().filter(|c| c.scores())?;
    let n = instance.unit_count();
    let done = crate::parts::in_parts(n, parts, |r| {
        scores_of(
            instance,
            measured,
            cost,
            r.start as UnitIdx..r.end as UnitIdx,
        )
    });
    let mut units = Vec::with_capacity(n);
    let mut start = Vec::with_capacity(n + 1);
    let mut scores: Vec<(ClusterIdx, f32)> = Vec::with_capacity(instance.total_candidates());
    let mut ranks: Vec<f32> = Vec::with_capacity(instance.total_candidates());
    for part in done {
        let base = scores.len() as u32;
        units.extend(part.units);
        start.extend(part.start.iter().map(|&s| s + base));
        scores.extend(part.scores);
        ranks.extend(part.ranks);
    }
    if units.is_empty() {
        return None;
    }
    start.push(scores.len() as u32);
    Some(Rescore::from_parts(units, start, scores, Some(ranks)))
}

/// The policy's scores of a range of units: the units, where each one's scores start (from 0
/// for the range), and the scores, each unit's in cluster order, with the ranks its clusters
/// give it: its latencies (the cost is the unit's preference among clusters; a cluster still
/// prefers the units it serves best).
struct Scored {
    units: Vec<UnitIdx>,
    start: Vec<u32>,
    scores: Vec<(ClusterIdx, f32)>,
    ranks: Vec<f32>,
}

fn scores_of(
    instance: &Instance,
    measured: &Rescore,
    cost: &crate::model::CostPolicy,
    range: std::ops::Range<UnitIdx>,
) -> Scored {
    let guard = cost.guard_ms as f32;
    let mut out = Scored {
        units: Vec::with_capacity(range.len()),
        start: Vec::with_capacity(range.len()),
        scores: Vec::new(),
        ranks: Vec::new(),
    };
    // (latency, cluster, policy score), per unit.
    let mut by_latency: Vec<(f32, ClusterIdx, f32)> = Vec::new();
    for u in range {
        by_latency.clear();
        by_latency.extend(instance.candidates(u).map(|c| {
            let rtt = latency(measured, u, c.cluster, c.score);
            let f = (f64::from(rtt) + cost.extra_ms(c.cluster as usize)) as f32;
            (rtt, c.cluster, f)
        }));
        if by_latency.is_empty() {
            continue;
        }
        by_latency.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        // `best`: the highest score of the candidates more than the guard better than this one.
        let (mut p, mut best) = (0, f32::NEG_INFINITY);
        for j in 0..by_latency.len() {
            let rtt = by_latency[j].0;
            while p < j && by_latency[p].0 + guard < rtt {
                best = best.max(by_latency[p].2);
                p += 1;
            }
            if by_latency[j].2 <= best {
                by_latency[j].2 = just_above(best);
            }
        }
        by_latency.sort_unstable_by_key(|x| x.1);
        out.units.push(u);
        out.start.push(out.scores.len() as u32);
        out.scores.extend(by_latency.iter().map(|&(_, c, f)| {
            (
                c,
                f.clamp(f32::MIN_POSITIVE, crate::rescore::MAX_MEASURED_SCORE),
            )
        }));
        out.ranks.extend(by_latency.iter().map(|&(rtt, _, _)| rtt));
    }
    out
}

/// How many (unit, cluster) placements of `map` break the cost policy's guard: the unit has
/// demand at cluster `a` while `preferences` (the instance the map was solved with) ranks `a`
/// before a candidate `b` whose latency is more than `guard_ms` lower. Latencies are
/// `instance`'s estimates, or `measured`'s where measured. 0 without a cost policy. With the
/// map stable under `preferences` (the stability verifier's part), 0 here means no unit is
/// placed at a cluster while one more than the guard better had room for it.
pub fn guard_violations(
    instance: &Instance,
    measured: &Rescore,
    preferences: &Instance,
    map: &Map,
) -> usize {
    let Some(cost) = instance.policy().cost.as_ref() else {
        return 0;
    };
    let guard = cost.guard_ms as f32;
    let units = instance.unit_count().min(map.unit_count()) as UnitIdx;
    let mut broken = 0;
    for u in 0..units {
        let rtt: Vec<(ClusterIdx, f32)> = instance
            .candidates(u)
            .map(|c| (c.cluster, latency(measured, u, c.cluster, c.score)))
            .collect();
        let order: Vec<ClusterIdx> = preferences.candidates(u).map(|c| c.cluster).collect();
        let at = |c: ClusterIdx| order.iter().position(|&x| x == c);
        for a in map.allocations(u).iter().filter(|a| a.amount > 0.0) {
            let Some(ra) = rtt.iter().find(|x| x.0 == a.cluster).map(|x| x.1) else {
                continue;
            };
            let pa = at(a.cluster);
            broken += rtt
                .iter()
                .filter(|&&(b, rb)| rb + guard < ra && b != a.cluster)
                .filter(|&&(b, _)| match (at(b), pa) {
                    (Some(pb), Some(pa)) => pb > pa,
                    _ => true,
                })
                .count();
        }
    }
    broken
}

/// The cost of `map` under `instance`'s cost policy: each cluster's price times the Bps its
/// placed demand uses there (the classes' `per_unit.bps`); `None` without a cost policy.
pub fn map_cost(instance: &Instance, map: &Map) -> Option<f64> {
    let cost = instance.policy().cost.as_ref()?;
    let units = instance.unit_count().min(map.unit_count()) as UnitIdx;
    let mut total = 0.0;
    for u in 0..units {
        let bps = instance.classes()[usize::from(instance.unit_class(u))]
            .per_unit
            .bps;
        for a in map.allocations(u) {
            total += a.amount * bps * cost.price.get(a.cluster as usize).copied().unwrap_or(0.0);
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CostSpec, Limits, PolicySpec};
    use crate::{solve, verify, SolveOptions};
    use rand::{Rng, SeedableRng};

    /// A world of `clusters` one-node clusters of capacity `capacity` and `units` units of
    /// demand 1, each with 2–6 candidates scored in [1, 100) ms.
    fn world(seed: u64, clusters: usize, units: usize, capacity: f64) -> Instance {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let cl: Vec<String> = (0..clusters)
            .map(|c| {
                format!(
                    r#"{{"id": "c{c:02}", "lat": 0, "lon": 0, "resources":
                        {{"name": "root", "kind": "bps", "capacity": {capacity}, "classes": ["web"]}}}}"#
                )
            })
            .collect();
        let us: Vec<String> = (0..units)
            .map(|u| {
                let k = rng.random_range(2..=6.min(clusters));
                let mut ids: Vec<usize> = (0..clusters).collect();
                for i in 0..k {
                    let j = rng.random_range(i..clusters);
                    ids.swap(i, j);
                }
                let cands: Vec<String> = ids[..k]
                    .iter()
                    .map(|c| {
                        let score = rng.random_range(1.0..100.0f64);
                        format!(r#"{{"cluster": "c{c:02}", "score": {score}}}"#)
                    })
                    .collect();
                format!(
                    r#"{{"id": "u{u:04}", "class": "web", "demand": 1, "lat": 0, "lon": 0,
                        "candidates": [{}]}}"#,
                    cands.join(",")
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [{{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 0}}}}],
                "clusters": [{}], "map_units": [{}]}}"#,
            cl.join(","),
            us.join(",")
        );
        crate::testing::parse_instance(json.as_bytes(), Limits::default()).expect("a world")
    }

    fn priced(inst: &Instance, seed: u64, weight: f64, guard_ms: f64) -> Instance {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let prices = inst
            .clusters()
            .iter()
            .map(|c| (c.id.clone(), rng.random_range(0.0..10.0f64)))
            .collect();
        let spec = PolicySpec {
            cost: Some(CostSpec {
                weight,
                guard_ms,
                default_price: 0.0,
                prices,
            }),
        };
        inst.with_policy(&spec).expect("a valid policy")
    }

    /// The order `scores` give unit `u` (lower first, ties by cluster index).
    fn order(inst: &Instance, scores: &Rescore, u: UnitIdx) -> Vec<ClusterIdx> {
        let mut o: Vec<(f32, ClusterIdx)> = inst
            .candidates(u)
            .map(|c| (scores.score(u, c.cluster).expect("scored"), c.cluster))
            .collect();
        o.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        o.into_iter().map(|x| x.1).collect()
    }

    /// The oracle: the policy's scores by a fixed point over every pair (no sorting, no
    /// prefix maximum), in f64.
    fn oracle(inst: &Instance, u: UnitIdx) -> Vec<ClusterIdx> {
        let cost = inst.policy().cost.as_ref().expect("a cost policy");
        let c: Vec<(ClusterIdx, f64)> = inst
            .candidates(u)
            .map(|c| (c.cluster, f64::from(c.score)))
            .collect();
        let mut f: Vec<f64> = c
            .iter()
            .map(|&(k, r)| r + cost.extra_ms(k as usize))
            .collect();
        loop {
            let mut changed = false;
            for i in 0..c.len() {
                for j in 0..c.len() {
                    if c[j].1 + cost.guard_ms < c[i].1 && f[i] <= f[j] {
                        f[i] = f[j] + 1e-6;
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        let mut o: Vec<(f64, ClusterIdx)> = f.iter().zip(&c).map(|(&x, &(k, _))| (x, k)).collect();
        o.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        o.into_iter().map(|x| x.1).collect()
    }

    /// The scores do not depend on how the units are split between threads.
    #[test]
    fn the_scores_are_the_same_in_one_part_or_several() {
        let inst = priced(&world(7, 12, 300, 10.0), 7, 3.0, 10.0);
        let one = rescore_in_parts(&inst, &Rescore::default(), 1).expect("scores");
        for parts in [2, 3, 7] {
            assert_eq!(
                rescore_in_parts(&inst, &Rescore::default(), parts),
                Some(one.clone()),
                "{parts} parts"
            );
        }
    }

    /// Every unit's policy order is the oracle's, and keeps the guard: a candidate more than
    /// `guard_ms` better always comes first.
    #[test]
    fn the_policy_order_is_the_oracles_and_keeps_the_guard() {
        for seed in 0..20 {
            let inst = priced(&world(seed, 12, 200, 10.0), seed, 3.0, 10.0);
            let scores = rescore(&inst, &Rescore::default()).expect("scores");
            for u in 0..inst.unit_count() as UnitIdx {
                let got = order(&inst, &scores, u);
                assert_eq!(got, oracle(&inst, u), "seed {seed}, unit {u}");
                let rtt = |k: ClusterIdx| {
                    inst.candidates(u)
                        .find(|c| c.cluster == k)
                        .map(|c| c.score)
                        .expect("a candidate")
                };
                for (i, &a) in got.iter().enumerate() {
                    for &b in &got[i + 1..] {
                        assert!(rtt(b) + 10.0 >= rtt(a), "seed {seed}, unit {u}: {got:?}");
                    }
                }
            }
        }
    }

    /// A cold solve with the policy verifies (capacity, stability under the policy's
    /// preferences) and breaks no guard; weight 0 changes no score and no map; a higher weight
    /// costs less and is slower (mean latency), on these worlds.
    #[test]
    fn a_solve_with_costs_verifies_keeps_the_guard_and_trades_latency_for_cost() {
        for seed in 0..10 {
            let base = world(seed, 10, 300, 40.0);
            let none = priced(&base, seed, 0.0, 10.0);
            assert!(rescore(&none, &Rescore::default()).is_none());
            let plain = solve(&base, &SolveOptions::default()).map;
            let mut last: Option<(f64, f64)> = None;
            for weight in [0.0, 1.0, 5.0] {
                let inst = priced(&base, seed, weight, 10.0);
                let scores = rescore(&inst, &Rescore::default());
                let prefs = match &scores {
                    Some(s) => {
                        crate::effective_preferences(&inst, None, &crate::Stickiness::default(), s)
                            .expect("preferences")
                    }
                    None => inst.clone(),
                };
                let map = solve(&prefs, &SolveOptions::default()).map;
                let report = verify::verify(&prefs, &map);
                assert!(
                    report.is_ok(),
                    "seed {seed}, weight {weight}: {}",
                    report.describe(&prefs, 5)
                );
                assert_eq!(
                    guard_violations(&inst, &Rescore::default(), &prefs, &map),
                    0
                );
                if weight == 0.0 {
                    assert_eq!(map, plain, "seed {seed}: weight 0 is no policy");
                }
                let cost = map_cost(&inst, &map).expect("a cost");
                let mut rtt = 0.0;
                for u in 0..inst.unit_count() as UnitIdx {
                    for a in map.allocations(u) {
                        let s = inst
                            .candidates(u)
                            .find(|c| c.cluster == a.cluster)
                            .map(|c| c.score);
                        rtt += a.amount * f64::from(s.expect("a candidate"));
                    }
                }
                if let Some((c0, r0)) = last {
                    assert!(
                        cost <= c0 + 1e-9 && rtt >= r0 - 1e-9,
                        "seed {seed}, weight {weight}: cost {c0} → {cost}, latency {r0} → {rtt}"
                    );
                }
                last = Some((cost, rtt));
            }
        }
    }

    /// A guard broken on purpose is found: preferences that rank a unit's worst candidate
    /// first, and a map placing it there, while its best is more than the guard better.
    #[test]
    fn a_placement_past_the_guard_is_counted() {
        let inst = priced(&world(1, 4, 1, 10.0), 1, 0.0, 0.0);
        let u = 0;
        let cands: Vec<_> = inst.candidates(u).collect();
        let (best, worst) = (cands[0], cands[cands.len() - 1]);
        assert!(best.score < worst.score);
        // Preferences in the reverse order of the latencies.
        let reversed = Rescore::new(&inst, cands.iter().map(|c| (u, c.cluster, 200.0 - c.score)))
            .expect("scores");
        let prefs =
            crate::effective_preferences(&inst, None, &crate::Stickiness::default(), &reversed)
                .expect("preferences");
        assert_eq!(
            prefs.candidates(u).next().map(|c| c.cluster),
            Some(worst.cluster)
        );
        let mut map = Map::with_capacity(1, 1);
        map.push_unit(
            [crate::Allocation {
                cluster: worst.cluster,
                amount: 1.0,
            }],
            0.0,
        );
        let broken = guard_violations(&inst, &Rescore::default(), &prefs, &map);
        assert_eq!(
            broken,
            cands.len() - 1,
            "every better candidate ranked after it"
        );
        // Placed at its best, nothing is broken.
        let mut fine = Map::with_capacity(1, 1);
        fine.push_unit(
            [crate::Allocation {
                cluster: best.cluster,
                amount: 1.0,
            }],
            0.0,
        );
        assert_eq!(
            guard_violations(&inst, &Rescore::default(), &inst, &fine),
            0
        );
    }

    /// A bad policy is refused naming the policy and its entry; a cluster deleted takes its
    /// price with it, and one added takes the default price.
    #[test]
    fn bad_policies_are_named_and_prices_follow_their_clusters() {
        let inst = world(3, 4, 5, 10.0);
        let spec = |weight: f64, prices: &[(&str, f64)]| PolicySpec {
            cost: Some(CostSpec {
                weight,
                guard_ms: 10.0,
                default_price: 1.0,
                prices: prices.iter().map(|&(c, p)| (c.to_string(), p)).collect(),
            }),
        };
        let e = inst
            .with_policy(&spec(1.0, &[("nope", 2.0)]))
            .expect_err("unknown cluster");
        assert!(
            e.to_string().contains(r#"policy.cost.prices["nope"]"#),
            "{e}"
        );
        let e = inst
            .with_policy(&spec(-1.0, &[]))
            .expect_err("negative weight");
        assert!(
            e.to_string().contains("policy.cost") && e.to_string().contains("weight"),
            "{e}"
        );
        let e = inst
            .with_policy(&spec(1.0, &[("c01", f64::NAN)]))
            .expect_err("NaN price");
        assert!(e.to_string().contains(r#"prices["c01"]"#), "{e}");
        let e = inst
            .with_policy(&spec(1e6, &[("c01", 1.0)]))
            .expect_err("too heavy");
        assert!(e.to_string().contains("10000 ms"), "{e}");
        let priced = inst
            .with_policy(&spec(2.0, &[("c01", 5.0)]))
            .expect("valid");
        let back = priced.policy().spec(&priced.cluster_ids());
        assert_eq!(back, spec(2.0, &[("c01", 5.0)]));
        let cost = priced.policy().cost.as_ref().expect("cost");
        assert_eq!(cost.extra_ms(1), 10.0);
        assert_eq!(cost.extra_ms(0), 2.0);
        // c03 deleted: its price goes; c04 added: the default price.
        let fewer = world(3, 3, 5, 10.0);
        let carried = priced
            .policy()
            .carried(&priced.cluster_ids(), &fewer.cluster_ids());
        assert_eq!(carried.cost.expect("cost").price, vec![1.0, 5.0, 1.0]);
        let more = world(3, 5, 5, 10.0);
        let carried = priced
            .policy()
            .carried(&priced.cluster_ids(), &more.cluster_ids());
        assert_eq!(
            carried.cost.expect("cost").price,
            vec![1.0, 5.0, 1.0, 1.0, 1.0]
        );
    }
}
