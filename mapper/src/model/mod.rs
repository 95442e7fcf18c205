//! The domain model: traffic classes, clusters with resource trees, map units with candidates.
//!
//! An [`Instance`] is built once through an [`InstanceBuilder`], which validates every input and
//! refuses bad input with a [`ModelError`] naming it. After that the instance is immutable and
//! indexed: clusters and map units are sorted by id, so an index order *is* the id order that the
//! preference tie-breaks use, and each map unit's candidates are sorted by the unit's preference
//! (score, then cluster id).
//!
//! Map units are stored column-wise (one vector per field, candidates in one flat arena) so that
//! ten million of them fit in a few GB: see `docs/solver.md` and `docs/perf/solver.md`.
//!
//! Its parts, whose items are re-exported here (every path stays `model::...`):
//! - `limits`: the named limits, the index types, and the number checks validation shares;
//! - `topology`: classes, clusters and resource trees, and the validation of a cluster;
//! - `builder`: [`InstanceBuilder`], validating map units as they are pushed;
//! - `columns`: the unit columns and the candidate arena with each unit's head;
//! - `instance`: [`Instance`], its accessors and the instances derived from it;
//! - `favour`: stickiness's changes to the preferences, kept beside the candidate arena;
//! - `candidates`: the candidate accessors, which apply them;
//! - `policy`: the operator's policy (cost with a latency guard), part of the topology.
//!
//! [`ModelError`]: crate::error::ModelError

mod builder;
mod candidates;
mod columns;
mod favour;
mod instance;
mod limits;
mod policy;
mod splice;
mod topology;

pub use crate::error::shown_number;
pub use builder::{CandidateSpec, IndexedCandidate, IndexedUnitSpec, InstanceBuilder, MapUnitSpec};
pub use candidates::Candidate;
pub(crate) use columns::{CandidateColumns, Head, NO_RANK};
pub(crate) use favour::{Favour, FirstCandidate};
pub use instance::Instance;
pub use limits::{check_id, shown_id, too_many, MAX_ID_BYTES, SHOWN_ID_CHARS};
pub use limits::{
    ClassIdx, ClusterIdx, Limits, UnitIdx, DEFAULT_MAX_CANDIDATES, MAX_CANDIDATES_CEILING,
    MAX_CLASSES, MAX_CLUSTERS, MAX_COMPANION_SHARE, MAX_MAP_UNITS, MAX_TREE_DEPTH, MAX_TREE_NODES,
};
pub use policy::{CostPolicy, CostSpec, Policy, PolicySpec, MAX_COST_SCORE_MS};
pub use splice::Piece;
pub use topology::{
    Cluster, ClusterSpec, ClusterState, PerUnit, ResourceKind, ResourceNode, ResourceNodeSpec,
    TrafficClass,
};
