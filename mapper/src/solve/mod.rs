//! The solver: deferred acceptance with capacities over resource trees, map units proposing
//! (DESIGN.md, "Allocation semantics"), followed by repair rounds.
//!
//! This file is the algorithm as the textbook has it — queue every unit, let the units propose
//! until none has demand left to offer (`Solver::run`), find the blocking pairs and repair them
//! (`Solver::settle`), read the map out — and the public API. Each technique that makes it fast
//! lives in a module of its own, behind a few `pub(super)` methods of the one `Solver`:
//!
//! - `options`: the public settings and statistics ([`SolveOptions`], [`SolveStats`], ...);
//! - `key`: the cluster's preference packed into a `u64`, and the arrival order it gives;
//! - `state`: the solver's records (per node, per unit, the holdings' slots, the paths) and
//!   the one place holdings change (`add`, `remove`);
//! - `pass`: the proposal pass: an offer, its sizing over the path, the evictions;
//! - `ahead`: the prefetches that hide the memory latency of the units about to propose;
//! - `heap`: the heaps of a seeded solve, which take the seeded keys only when a walk needs them;
//! - `seed`: the warm start's seeding pass (in parts by unit range) and the shedding after it;
//! - `repair`: the blocking-pair scan (reading on several threads first), its `surely_full`
//!   shortcut, and the repair move;
//! - `readout`: the map, read out in parts straight into its columns.
//!
//! # Keys
//!
//! A cluster's preference for a unit is the tuple `(newcomer, class priority, rank, map unit
//! id)`, lower first (`newcomer` is false for every candidate of a plain instance; stickiness
//! marks incumbents). It is packed into a `u64`: 1 + 8 bits for the first two, 31 bits for the
//! rank (a non-negative finite `f32`, whose sign bit is 0 and whose bits order like the number),
//! 24 bits for the unit's index (units are indexed in id order). `key.rs` asserts the layout
//! against the model's limits at compile time.
//!
//! # The pass
//!
//! Every map unit with unplaced demand offers all of it to its best candidate not yet closed to
//! it. The cluster computes, at each node of the unit's path, how much of the unit it could hold
//! if it evicted every holder it likes less (`free + usage of worse holders`, divided by the
//! unit's coefficient there); it accepts the minimum of that over the path, and then evicts, node
//! by node from the leaf up, the holders it likes least until the accepted amount fits (the last
//! one possibly in part). Evicted demand goes back to its owner, which offers it again from its
//! current candidate on. A partial rejection closes the (unit, cluster) pair, so the pass makes at
//! most one closing offer per candidate, plus one offer per eviction.
//!
//! Each node keeps a max-heap of the keys of the units holding capacity there, worst on top.
//! Comparing keys is comparing preferences. Entries are removed lazily: an entry whose unit no
//! longer holds anything at the cluster is dropped when it surfaces. In a seeded solve a node's
//! heap gets the seeded holders' keys only when a walk may reach them (`Solver::heap_above`).
//!
//! # Repair
//!
//! When classes consume Bps and Fps in different proportions a cluster can become *less* picky
//! for some unit after an eviction (freeing Bps at the root by squeezing a Bps-heavy class at an
//! Fps node), so the pass can end with blocking pairs. Repair rounds find them, let each such unit
//! withdraw from the clusters it likes less than the best blocking one, and re-run the pass from
//! there, until none remain or [`SolveOptions::max_repair_rounds`] is reached. The rounds used and
//! the pairs left are reported in [`SolveStats`]. The scan looks only at units whose proposal
//! pointer has moved, and skips candidates that provably still have no room for the unit
//! (`Solver::surely_full`).

mod ahead;
mod heap;
mod key;
mod options;
mod pass;
mod readout;
mod repair;
mod seed;
mod state;

use crate::map::Map;
use crate::model::Instance;
pub use options::{proposal_bound, Arrival, Solution, SolveOptions, SolveStats, EPS_REL};
use state::Solver;

/// Solves `instance` cold: the map-unit-proposing stable allocation, repaired where the single
/// pass leaves blocking pairs. Deterministic.
pub fn solve(instance: &Instance, options: &SolveOptions) -> Solution {
    let mut s = Solver::new(instance);
    s.push_all(options.arrival);
    finish(s, options)
}

/// Solves `instance` warm, starting from `seed` (normally the previous round's map): every unit
/// whose whole demand sat at its first choice (an up cluster) keeps it there, at its new demand;
/// nodes pushed over capacity shed the holders they like least; then every other unit proposes
/// from its first choice (the units the seed left in overflow last), and repair rounds remove
/// any blocking pair left. With stickiness
/// ([`crate::sticky`]) most units' first choice is where they were, so little moves. The result
/// is stable for `instance`'s preferences, like a cold solve's, but it is a stable allocation
/// *near the seed* rather than the map-unit-optimal one. Work: one pass over the units plus the
/// proposals of the units not at their first choice. Entries of `seed` that do not fit
/// `instance` (units beyond its count, other clusters) are ignored.
pub fn solve_seeded(instance: &Instance, seed: &Map, options: &SolveOptions) -> Solution {
    seeded_in_parts(instance, seed, options, None)
}

/// [`solve_seeded`], its passes split into `parts` (by their size when `None`).
fn seeded_in_parts(
    instance: &Instance,
    seed: &Map,
    options: &SolveOptions,
    parts: Option<usize>,
) -> Solution {
    let mut s = Solver::new(instance);
    s.parts = parts;
    s.seed(seed, options.arrival);
    finish(s, options)
}

/// The pass, the repair rounds, and reading out the map.
fn finish(mut s: Solver<'_>, options: &SolveOptions) -> Solution {
    s.settle(options);
    // The heaps are not needed to read the map out: free them first, to lower the peak.
    s.heap = Vec::new();
    s.seeded = Vec::new();
    let map = s.to_map();
    Solution {
        map,
        stats: s.stats,
    }
}

impl Solver<'_> {
    /// The pass and the repair rounds.
    fn settle(&mut self, options: &SolveOptions) {
        self.run();
        let mut left = self.find_blocking();
        while !left.is_empty() && self.stats.repair_rounds < options.max_repair_rounds {
            self.stats.repair_rounds += 1;
            for &(u, j) in &left {
                self.move_up(u, j);
            }
            self.run();
            left = self.find_blocking();
        }
        self.stats.blocking_pairs_left = left.len();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::Limits;
    use crate::testing::parse_instance;

    /// A random two-class world (Bps- and Fps-heavy classes over trees of both kinds), its
    /// units' demand scaled by `scale(u)`: tight enough that some demand overflows.
    pub(crate) fn two_class_world(seed: u64, scale: impl Fn(usize) -> f64) -> Instance {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let clusters: Vec<String> = (0..24)
            .map(|c| {
                let cap = rng.random_range(60.0..140.0f64);
                format!(
                    r#"{{"id": "c{c:02}", "lat": 0, "lon": 0, "resources": {{"name": "root", "kind": "bps", "capacity": {cap}, "children": [
                        {{"name": "f", "kind": "fps", "capacity": {f}, "children": [
                          {{"name": "v", "kind": "bps", "capacity": {v}, "classes": ["video"]}},
                          {{"name": "a", "kind": "fps", "capacity": 1000, "classes": ["apps"]}}]}}]}}}}"#,
                    f = cap * 0.8,
                    v = cap * 0.7
                )
            })
            .collect();
        let units: Vec<String> = (0..4000)
            .map(|u| {
                let k = rng.random_range(1..=8usize);
                let cands = crate::testing::random_candidates(&mut rng, 24, k, 1.0);
                let class = if u % 3 == 0 { "apps" } else { "video" };
                let demand = rng.random_range(0.5..2.0f64) * scale(u);
                format!(
                    r#"{{"id": "u{u:05}", "class": "{class}", "demand": {demand}, "lat": 0, "lon": 0, "candidates": [{cands}]}}"#
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [
                 {{"name": "video", "priority": 1, "per_unit": {{"bps": 1.0, "fps": 0.25}}}},
                 {{"name": "apps", "priority": 0, "per_unit": {{"bps": 0.25, "fps": 1.0}}}}],
               "clusters": [{}], "map_units": [{}]}}"#,
            clusters.join(","),
            units.join(",")
        );
        parse_instance(json.as_bytes(), Limits::default()).expect("valid instance")
    }
}
