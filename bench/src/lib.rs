//! The benchmark harnesses behind `cdnmap bench ...`: one module per benchmark, each with its
//! clap arguments and its entry point, which `cdnmap-ops` parses and calls. Each prints time,
//! memory and the quality of the result, and measures a baseline in the same run where it
//! compares with one.
//!
//! Beside them, what they share: [`procs`] (the processes a benchmark starts), [`alloc`] (the
//! binary's counting allocator), [`report`] (the figures a solve is judged by), [`progress`]
//! and [`stats`]; the command line uses these too.

pub mod alloc;
pub mod cost;
pub mod dns;
mod dns_query;
pub mod edits;
pub mod follow;
pub mod grpc;
pub mod knot;
pub mod loads;
pub mod n1;
pub mod overflow;
pub mod preview;
pub mod procs;
pub mod progress;
pub mod report;
pub mod round;
pub mod serve;
pub mod soak;
pub mod solve;
pub mod stats;
