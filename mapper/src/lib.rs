//! cdnmap's pure core: the model and its validation, the capacitated stable-allocation solver,
//! and the verifier that checks a map against its instance.
//!
//! No I/O, no async, no clock reads, no global randomness: the same input gives the same map,
//! byte for byte. See `ARCHITECTURE.md` for the invariants this crate keeps.

pub mod beyond;
pub mod companion;
pub mod diff;
pub mod error;
pub mod geo;
pub mod map;
pub mod mem;
pub mod model;
mod parts;
pub mod policy;
pub mod rescore;
pub mod second_chance;
pub mod solve;
pub mod sticky;
#[cfg(test)]
mod testing;
pub mod verify;

pub use error::ModelError;
pub use map::{churn, node_usage, Allocation, Map};
pub use model::{
    Candidate, CandidateSpec, ClassIdx, Cluster, ClusterIdx, ClusterSpec, ClusterState, Instance,
    InstanceBuilder, Limits, MapUnitSpec, PerUnit, ResourceKind, ResourceNode, ResourceNodeSpec,
    TrafficClass, UnitIdx, MAX_TREE_DEPTH, MAX_TREE_NODES,
};
pub use rescore::{admitted, Rescore};
pub use second_chance::{
    second_chance, second_chance_seeded, Beyond, SecondChance, SecondChanceParams,
    SecondChanceReport,
};
pub use solve::{solve, solve_seeded, Arrival, Solution, SolveOptions, SolveStats};
pub use sticky::{
    effective_preferences, favour_incumbents, Stickiness, DEFAULT_STICKINESS, MAX_STICKINESS,
};
pub use verify::{
    verify, verify_with, BlockingPair, CapacityViolation, CompanionViolation,
    ConservationViolation, Placement, Report, ShapeMismatch, Tolerances,
};
