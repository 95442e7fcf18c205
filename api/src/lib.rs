//! The service edge (issue 4 onwards): so far, its configuration and one mapping round (pure:
//! the clock and the previous snapshot are passed in). The loop that runs rounds, the gRPC
//! server, persistence, the DNS front end and the dashboard build on it.

pub mod config;
pub mod round;

pub use config::{Config, ConfigError};
pub use round::{round, RoundError, Snapshot};
