//! What answering a query needs, on both sides of WatchMap: the resolver over one published
//! map version (prefix tables, hostname class rules, the split of a unit over its clusters,
//! the fallback) and the in-cluster server selection over it, and the one decision of what a
//! query is answered with (`answer`). The mapper's `Resolve` and both paths of the DNS front
//! end decide through this crate and only encode its decision, so they answer alike by
//! construction.
//!
//! No I/O, no async, no clock reads: a resolver is built once per map version and then only
//! read.

pub mod answer;
pub mod columns;
pub mod follow_error;
pub mod limits;
pub mod resolve;
pub mod servers;
pub mod serving;
pub mod watch;

pub use serving::{ServeError, ServingCluster, ServingMap};
