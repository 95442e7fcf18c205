//! The solver: deferred acceptance with capacities over resource trees (being written).

use crate::map::Map;
use crate::model::Instance;

/// Tunables of a solve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SolveOptions {
    /// At most this many repair rounds after the first pass (DESIGN.md, "Allocation semantics").
    pub max_repair_rounds: u32,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions { max_repair_rounds: 16 }
    }
}

/// What a solve did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SolveStats {
    pub proposals: u64,
    pub evictions: u64,
    pub repair_rounds: u32,
    pub blocking_pairs_left: usize,
}

/// A map and how it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct Solution {
    pub map: Map,
    pub stats: SolveStats,
}

/// Solves `instance`.
pub fn solve(instance: &Instance, options: &SolveOptions) -> Solution {
    let _ = (instance, options);
    unimplemented!("being written")
}
