//! The service edge (issue 4 onwards): so far, its configuration, one mapping round (pure: the
//! clock and the previous snapshot are passed in) and the sled store. The loop that runs
//! rounds, the gRPC server, the DNS front end and the dashboard build on them.

pub mod config;
pub mod dashboard;
pub mod dns;
pub mod round;
pub mod selection;
pub mod service;
pub mod store;

pub use config::{Config, ConfigError};
pub use round::{round, RoundError, Snapshot};
pub use store::{Store, StoreError};
