//! The solve's settings and what it reports: the public types of `solve` and `solve_seeded`
//! (re-exported at `solve::`), and the bounds every pass obeys.
//!
//! Promises: a leaf module (the solver's files import it; it imports none of them).

use crate::map::Map;
use crate::model::Instance;

pub use crate::map::EPS_REL;

/// Tunables of a solve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SolveOptions {
    /// At most this many repair rounds after the first pass (DESIGN.md, "Allocation semantics").
    pub max_repair_rounds: u32,
    /// The order in which map units make their first offers.
    pub arrival: Arrival,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            max_repair_rounds: 16,
            arrival: Arrival::Preference,
        }
    }
}

/// The order in which map units first propose. Where the stable allocation is unique (classes
/// in equal proportions) the order changes only the work, never the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// By the key their first candidate gives them (class priority, rank, id): units clusters
    /// like best come first and are rarely evicted later. The fast default.
    Preference,
    /// By map unit id: the textbook order, with many more evictions.
    Id,
}

/// What a solve did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SolveStats {
    /// Offers made by map units to clusters.
    pub proposals: u64,
    /// Allocations evicted, in whole or in part.
    pub evictions: u64,
    /// Evictions that took a unit's whole holding where a part was asked for, to turn a
    /// rejection rotation in one step (see `Solver::evict`); they can leave room that the
    /// repair rounds then fill.
    pub whole_evictions: u64,
    /// Repair rounds that found blocking pairs and re-ran the pass.
    pub repair_rounds: u32,
    /// Map units still in a blocking pair when the repair rounds ran out (goal: 0).
    pub blocking_pairs_left: usize,
    /// Demand a seeded solve kept where the seed had it (after shedding overloads).
    pub seeded_demand: f64,
    /// Whether a pass hit its proposal bound ([`proposal_bound`]) and stopped early, leaving
    /// the demand it had not placed as overflow. Never seen in tests; a safety net.
    pub proposal_bound_hit: bool,
}

/// The most offers one pass may make: generous (a pass makes at most one closing offer per
/// candidate plus one offer per eviction), but finite.
pub fn proposal_bound(instance: &Instance) -> u64 {
    64 * (instance.total_candidates() as u64 + instance.unit_count() as u64) + 1024
}

/// A map and how it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct Solution {
    pub map: Map,
    pub stats: SolveStats,
}
