//! What answering a query needs, on both sides of WatchMap: the resolver over one published
//! map version (prefix tables, hostname class rules, the split of a unit over its clusters,
//! the fallback) and the in-cluster server selection over it. The mapper's `Resolve` and the
//! DNS front end both answer through this crate, so they answer alike by construction.
//!
//! No I/O, no async, no clock reads: a resolver is built once per map version and then only
//! read.

pub mod columns;
pub mod follow_error;
pub mod limits;
pub mod resolve;
pub mod servers;
pub mod serving;
pub mod watch;

pub use serving::{ServeError, ServingCluster, ServingMap};
