//! The process of `cdnmap serve`: the configuration, the published state and the mapping loop
//! (`service`), the one writer of the topology (`topology`), the gRPC handlers (`mapping`,
//! `feedback`, `admin`), the dashboard's HTTP (`dashboard`), the election's I/O against etcd
//! (`lead`), health checks, listeners and TLS, the orchestrators' probes (`probes`), and the
//! wiring of it all (`server`).
//!
//! What a round computes is `cdnmap-engine`'s, what is stored `cdnmap-store`'s, the election's
//! logic `cdnmap-lead`'s: this crate calls them and owns the I/O, the tasks and the wall clock
//! (`clock`). Protobuf stops here.

pub mod activity;
pub mod admin;
pub mod auth;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod diffs;
pub mod feedback;
#[cfg(test)]
mod fuzz;
pub mod guard;
pub mod health;
pub mod lead;
pub mod listen;
pub mod mapping;
pub mod memory;
pub mod n1;
pub mod parse_error;
pub mod preview;
mod probes;
pub mod ramp;
pub mod ramping;
pub mod rpc_metrics;
pub mod selection;
pub mod server;
pub mod service;
pub mod throttle;
pub mod tls;
pub mod topology;
pub mod watch;

pub use config::{Config, ConfigError};
