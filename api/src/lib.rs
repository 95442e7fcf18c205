//! The service edge (issue 4 onwards): so far, its configuration. The mapping loop, the gRPC
//! server, persistence, the DNS front end and the dashboard build on it.

pub mod config;

pub use config::{Config, ConfigError};
