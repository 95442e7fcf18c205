//! The mapper's typed errors, and how they show a number ([`shown_number`]). Every message names
//! the input that was wrong and what was wrong with it.

/// Why an instance (or a map checked against one) was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("{what} with an empty id{context}")]
    EmptyId { what: &'static str, context: String },
    #[error("{what} id {shown}{context}: {problem}")]
    BadId {
        what: &'static str,
        /// The id as shown: escaped, cut after [`crate::model::SHOWN_ID_CHARS`] characters.
        shown: String,
        context: String,
        problem: String,
    },
    #[error("duplicate {what} id {id:?}{context}")]
    DuplicateId {
        what: &'static str,
        id: String,
        context: String,
    },
    #[error("{subject}: {field} is {}, {rule}", shown_number(*.value))]
    BadNumber {
        subject: String,
        field: &'static str,
        value: f64,
        rule: &'static str,
    },
    #[error("{subject}: unknown traffic class {class:?}")]
    UnknownClass { subject: String, class: String },
    #[error("map unit {map_unit:?}: unknown cluster {cluster:?}")]
    UnknownCluster { map_unit: String, cluster: String },
    #[error(
        "cluster {cluster:?}: resource node {node:?} is referenced as a child but not defined"
    )]
    UnknownNode { cluster: String, node: String },
    #[error("cluster {cluster:?}: resource tree has a cycle through node {node:?}")]
    TreeCycle { cluster: String, node: String },
    #[error(
        "cluster {cluster:?}: resource node {node:?} is a child of both {first:?} and {second:?}"
    )]
    SharedChild {
        cluster: String,
        node: String,
        first: String,
        second: String,
    },
    #[error("cluster {cluster:?}: resource tree has no nodes")]
    EmptyTree { cluster: String },
    #[error("cluster {cluster:?}: resource tree is deeper than {limit} levels (node {node:?} is at level {level})")]
    TreeTooDeep {
        cluster: String,
        node: String,
        level: usize,
        limit: usize,
    },
    #[error("cluster {cluster:?}: resource tree has several roots ({first:?} and {second:?}); it must have exactly one")]
    SeveralRoots {
        cluster: String,
        first: String,
        second: String,
    },
    #[error("cluster {cluster:?}: class {class:?} is attached to resource node {node:?}, which is not a leaf")]
    ClassNotOnLeaf {
        cluster: String,
        class: String,
        node: String,
    },
    #[error(
        "cluster {cluster:?}: class {class:?} is attached to two leaves, {first:?} and {second:?}"
    )]
    ClassOnTwoLeaves {
        cluster: String,
        class: String,
        first: String,
        second: String,
    },
    #[error("cluster {cluster:?}: claims to serve class {class:?} but no leaf of its resource tree carries it")]
    NoLeafForClass { cluster: String, class: String },
    #[error("map unit {map_unit:?}: candidate cluster {cluster:?} does not serve class {class:?}")]
    ClassNotServed {
        map_unit: String,
        cluster: String,
        class: String,
    },
    #[error("map unit {map_unit:?}: cluster {cluster:?} is a candidate twice")]
    DuplicateCandidate { map_unit: String, cluster: String },
    #[error("{subject}: {count} {what}, more than the limit of {limit}")]
    TooMany {
        subject: String,
        what: &'static str,
        count: usize,
        limit: usize,
    },
    #[error("the map has {map_units} map units but the instance has {instance_units}")]
    MapShape {
        map_units: usize,
        instance_units: usize,
    },
    #[error("{subject}: {problem}")]
    BadName {
        subject: String,
        problem: &'static str,
    },
    #[error("map unit {map_unit:?} appears twice in the assignment")]
    DuplicateAssignment { map_unit: String },
    #[error("assignment names map unit {map_unit:?}, which the instance does not have")]
    UnknownMapUnit { map_unit: String },
}

/// A number as an error shows it: as written for the usual magnitudes, in scientific notation
/// past them (`1e308`, not 309 digits).
pub fn shown_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e15).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}
