//! The service edge: the configuration, one mapping round (pure: the clock and the previous
//! snapshot are passed in), the sled store, the running mapper (`service`: the loop, gRPC,
//! HTTP), the operator dashboard, in-cluster selection at the edge, and the DNS front end.

pub mod admin;
pub mod auth;
pub mod config;
pub mod dashboard;
pub mod feedback;
#[cfg(test)]
mod fuzz;
pub mod health;
pub mod lead;
pub mod listen;
pub mod mapping;
pub mod memory;
pub mod parse_error;
pub mod selection;
pub mod server;
pub mod service;
pub mod throttle;
pub mod tls;
pub mod topology;
pub mod watch;

pub use config::{Config, ConfigError};
