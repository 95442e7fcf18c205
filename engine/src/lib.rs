//! The round engine: what a mapping round computes, without I/O, a task or a clock of its
//! own (the time and the previous snapshot are arguments).
//!
//! - [`round`]: one round, the round's topology and the previous [`round::Snapshot`] in, the
//!   next snapshot (the map and its resolver) out.
//! - [`driver`]: one step of the mapping loop, from what was observed since the last round to
//!   the next snapshot (the estimator taught and asked, then the round). The service's loop and
//!   `cdnmap replay` run the same step.
//! - [`budget`]: what feedback may add to a round's observations (the sources' budgets and
//!   the bounds per round's period), time an argument.
//! - [`figures`]: what the dashboard shows of a snapshot (loads, flows, a unit's "why").
//!
//! It depends on the pure crates only (mapper, estimator, serve, topology): nothing here
//! stores, serves or speaks protobuf. The clock is read for the timings a round reports
//! (measurements only: they change nothing).

pub mod budget;
pub mod driver;
pub mod figures;
pub mod n1;
pub mod round;
