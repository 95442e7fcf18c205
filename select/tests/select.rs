//! Properties of in-cluster server selection (`mapper::select`) on thousands of random cases:
//!
//! - removing a server moves only that server's keys; adding one moves only keys that now belong
//!   to it; the ring does not depend on the order the servers are given in;
//! - bounded loads never exceed `⌈c × average⌉` with unit weights, and stay below
//!   `c × average + max weight` with weights; the assignment is deterministic;
//! - every policy names two distinct servers when the cluster has at least two;
//! - power-of-d picks the least loaded of the key's first d distinct ring servers;
//! - the balance of consistent hashing (max / average load) improves with more virtual nodes.

use cdnmap_select::{BoundedLoads, PowerOfD, Ring, Selector, ServerIdx};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn server_ids(seed: u64, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("srv{i}-{:x}", seed % 997)).collect()
}

fn keys(seed: u64, m: usize) -> Vec<String> {
    (0..m).map(|i| format!("host{i}.s{seed}.example")).collect()
}

fn ring_of(ids: &[String], vnodes: u32) -> Ring {
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    Ring::new(&refs, vnodes).expect("valid ring")
}

/// The owner id of each key.
fn owners<'r>(ring: &'r Ring, keys: &[String]) -> Vec<&'r str> {
    keys.iter().map(|k| ring.id(ring.primary(k))).collect()
}

fn unit_keys(keys: &[String]) -> Vec<(&str, f64)> {
    keys.iter().map(|k| (k.as_str(), 1.0)).collect()
}

fn loads(assignment: &[ServerIdx], weights: &[f64], servers: usize) -> Vec<f64> {
    let mut load = vec![0.0; servers];
    for (&s, &w) in assignment.iter().zip(weights) {
        load[s as usize] += w;
    }
    load
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn removing_a_server_moves_only_its_keys(
        seed in any::<u64>(), n in 2usize..12, vnodes in 1u32..64, m in 0usize..200, r in any::<prop::sample::Index>(),
    ) {
        let ids = server_ids(seed, n);
        let removed = r.index(n);
        let mut rest = ids.clone();
        rest.remove(removed);
        let ks = keys(seed, m);
        let full = ring_of(&ids, vnodes);
        let less = ring_of(&rest, vnodes);
        for (before, after) in owners(&full, &ks).into_iter().zip(owners(&less, &ks)) {
            prop_assert_ne!(after, ids[removed].as_str());
            if before != ids[removed] {
                prop_assert_eq!(before, after);
            }
        }
    }

    #[test]
    fn adding_a_server_moves_only_keys_that_now_belong_to_it(
        seed in any::<u64>(), n in 1usize..12, vnodes in 1u32..64, m in 0usize..200,
    ) {
        let ids = server_ids(seed, n + 1);
        let added = ids[n].as_str();
        let before_ring = ring_of(&ids[..n], vnodes);
        let after_ring = ring_of(&ids, vnodes);
        let ks = keys(seed, m);
        for (before, after) in owners(&before_ring, &ks).into_iter().zip(owners(&after_ring, &ks)) {
            prop_assert!(before == after || after == added, "{before} -> {after}");
        }
    }

    #[test]
    fn the_ring_does_not_depend_on_server_order(
        seed in any::<u64>(), n in 1usize..12, vnodes in 1u32..32, m in 0usize..100,
    ) {
        let ids = server_ids(seed, n);
        let mut shuffled = ids.clone();
        shuffled.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        let ks = keys(seed, m);
        let (a, b) = (ring_of(&ids, vnodes), ring_of(&shuffled, vnodes));
        prop_assert_eq!(owners(&a, &ks), owners(&b, &ks));
    }

    #[test]
    fn bounded_loads_stay_within_the_ceiling(
        seed in any::<u64>(), n in 1usize..12, vnodes in 1u32..32, m in 0usize..300, num in 101u64..300,
    ) {
        // c = num / 100: decimal factors, judged in exact integer arithmetic.
        let c = num as f64 / 100.0;
        let ring = ring_of(&server_ids(seed, n), vnodes);
        let ks = keys(seed, m);
        let unit = unit_keys(&ks);
        let assignment = BoundedLoads::assign(&ring, &unit, c).expect("valid");
        prop_assert_eq!(assignment.len(), m);
        prop_assert_eq!(&assignment, &BoundedLoads::assign(&ring, &unit, c).expect("valid"));
        let ceiling = exact_ceiling(num, 100, m as u64, n as u64) as f64;
        for load in loads(&assignment, &vec![1.0; m], n) {
            prop_assert!(load <= ceiling, "load {load} over ⌈c × average⌉ = {ceiling}");
        }
    }

    #[test]
    fn weighted_bounded_loads_stay_below_the_weighted_bound(
        seed in any::<u64>(), n in 1usize..12, vnodes in 1u32..32, m in 1usize..300, c in 1.01f64..3.0,
    ) {
        let ring = ring_of(&server_ids(seed, n), vnodes);
        let ks = keys(seed, m);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let weights: Vec<f64> = (0..m).map(|_| rng.random_range(0.01..10.0)).collect();
        let weighted: Vec<(&str, f64)> = ks.iter().map(String::as_str).zip(weights.iter().copied()).collect();
        let assignment = BoundedLoads::assign(&ring, &weighted, c).expect("valid");
        let total: f64 = weights.iter().sum();
        let max_w = weights.iter().copied().fold(0.0, f64::max);
        let bound = c * total / n as f64 + max_w;
        for load in loads(&assignment, &weights, n) {
            prop_assert!(load < bound, "load {load} not below c × average + max weight = {bound}");
        }
    }

    #[test]
    fn answers_name_distinct_servers(
        seed in any::<u64>(), n in 1usize..12, vnodes in 1u32..32, m in 1usize..50, d in 1usize..4, want in 1usize..6,
    ) {
        let ring = ring_of(&server_ids(seed, n), vnodes);
        let ks = keys(seed, m);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let load: Vec<f64> = (0..n).map(|_| f64::from(rng.random_range(0u32..4))).collect();
        let bounded = BoundedLoads::build(ring.clone(), &unit_keys(&ks), 1.25).expect("valid");
        let pod = PowerOfD::new(ring.clone(), d, load).expect("valid");
        let policies: [&dyn Selector; 3] = [&ring, &bounded, &pod];
        for key in &ks {
            for policy in policies {
                let mut out = vec![ServerIdx::MAX; want];
                let got = policy.pick(key, &mut out);
                prop_assert_eq!(got, want.min(n));
                let mut distinct = out[..got].to_vec();
                distinct.sort_unstable();
                distinct.dedup();
                prop_assert_eq!(distinct.len(), got);
                prop_assert!(out[..got].iter().all(|&s| (s as usize) < n));
            }
        }
    }

    #[test]
    fn power_of_d_picks_the_least_loaded_candidate(
        seed in any::<u64>(), n in 1usize..12, vnodes in 1u32..32, m in 1usize..50, d in 1usize..5,
    ) {
        let ring = ring_of(&server_ids(seed, n), vnodes);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let load: Vec<f64> = (0..n).map(|_| f64::from(rng.random_range(0u32..4))).collect();
        let pod = PowerOfD::new(ring.clone(), d, load.clone()).expect("valid");
        for key in keys(seed, m) {
            let mut cand = vec![0; d];
            let k = ring.pick(&key, &mut cand);
            // Reference: the first candidate (ring order) with the least load.
            let best = cand[..k]
                .iter()
                .copied()
                .reduce(|a, b| if load[b as usize] < load[a as usize] { b } else { a })
                .expect("at least one candidate");
            let mut out = [0; 1];
            prop_assert_eq!(pod.pick(&key, &mut out), 1);
            prop_assert_eq!(out[0], best);
        }
    }

    #[test]
    fn bounded_selector_answers_the_assignment_first(
        seed in any::<u64>(), n in 1usize..8, vnodes in 1u32..16, m in 1usize..100,
    ) {
        let ring = ring_of(&server_ids(seed, n), vnodes);
        let ks = keys(seed, m);
        let unit = unit_keys(&ks);
        let assignment = BoundedLoads::assign(&ring, &unit, 1.1).expect("valid");
        let bounded = BoundedLoads::build(ring, &unit, 1.1).expect("valid");
        for (key, &s) in ks.iter().zip(&assignment) {
            let mut out = [0; 2];
            bounded.pick(key, &mut out);
            prop_assert_eq!(out[0], s);
        }
    }
}

/// Max / average load of plain consistent hashing, averaged over seeds.
fn mean_imbalance(vnodes: u32, servers: usize, keys_per_seed: usize, seeds: u64) -> f64 {
    let mut sum = 0.0;
    for seed in 0..seeds {
        let ring = ring_of(&server_ids(seed, servers), vnodes);
        let mut load = vec![0usize; servers];
        for key in keys(seed, keys_per_seed) {
            load[ring.primary(&key) as usize] += 1;
        }
        let max = *load.iter().max().expect("servers") as f64;
        sum += max / (keys_per_seed as f64 / servers as f64);
    }
    sum / seeds as f64
}

/// `⌈c × average⌉` in exact integer arithmetic, c = num / den.
fn exact_ceiling(num: u64, den: u64, keys: u64, servers: u64) -> u64 {
    (num * keys).div_ceil(den * servers)
}

/// Decimal factors whose `c × average` lands on an integer, where rounding in floating point
/// could otherwise let a server over the ceiling.
#[test]
fn bounded_loads_ceiling_table() {
    for (num, den) in [(11u64, 10u64), (5, 4), (3, 2), (2, 1), (101, 100)] {
        for (servers, m) in [(100usize, 100_000usize), (10, 1000), (7, 700), (3, 10)] {
            let ring = ring_of(&server_ids(1, servers), 50);
            let ks = keys(2, m);
            let c = num as f64 / den as f64;
            let assignment = BoundedLoads::assign(&ring, &unit_keys(&ks), c).expect("valid");
            let ceiling = exact_ceiling(num, den, m as u64, servers as u64) as f64;
            let max = loads(&assignment, &vec![1.0; m], servers)
                .into_iter()
                .fold(0.0, f64::max);
            assert!(
                max <= ceiling,
                "c = {c}, {servers} servers, {m} keys: max {max} over {ceiling}"
            );
        }
    }
}

#[test]
fn balance_improves_with_more_virtual_nodes() {
    let one = mean_imbalance(1, 10, 10_000, 20);
    let ten = mean_imbalance(10, 10, 10_000, 20);
    let hundred = mean_imbalance(100, 10, 10_000, 20);
    assert!(
        one > ten && ten > hundred,
        "max/avg: 1 vnode {one:.3}, 10 {ten:.3}, 100 {hundred:.3}"
    );
    assert!(hundred < 1.3, "100 vnodes max/avg {hundred:.3}");
}

#[test]
fn bad_inputs_are_refused() {
    assert!(Ring::new(&[], 10).is_err());
    assert!(Ring::new(&["a", "a"], 10).is_err());
    assert!(Ring::new(&["a", ""], 10).is_err());
    assert!(Ring::new(&["a"], 0).is_err());
    assert!(Ring::weighted(&[("a", f64::NAN)], 10).is_err());
    let ring = Ring::new(&["a", "b"], 10).expect("valid");
    assert!(BoundedLoads::assign(&ring, &[("k", 1.0)], 1.0).is_err());
    assert!(BoundedLoads::assign(&ring, &[("k", -1.0)], 1.5).is_err());
    assert!(PowerOfD::new(ring.clone(), 0, vec![0.0, 0.0]).is_err());
    assert!(PowerOfD::new(ring.clone(), 2, vec![0.0]).is_err());
    assert!(PowerOfD::new(ring, 2, vec![0.0, f64::INFINITY]).is_err());
}

#[test]
fn weights_scale_the_share_of_keys() {
    let ring = Ring::weighted(&[("small", 1.0), ("big", 3.0)], 200).expect("valid");
    assert_eq!(ring.points(), 800);
    let mut load = [0usize; 2];
    for key in keys(7, 20_000) {
        load[ring.primary(&key) as usize] += 1;
    }
    let share = load[1] as f64 / 20_000.0;
    assert!(
        (0.65..0.85).contains(&share),
        "big server's share {share:.3}"
    );
}
