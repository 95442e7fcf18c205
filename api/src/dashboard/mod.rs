//! The operator dashboard: a page served by `cdnmap serve` next to `/metrics`, and the
//! JSON API behind it (`/api/...`, documented in `docs/dashboard.md`). It reads the service
//! (the published snapshot, the topology, the [`crate::activity`] of recent rounds and
//! actions) and acts through the topology writer, as Admin does; nothing else in the service
//! depends on it.
//!
//! - What the page shows of a snapshot is computed by `cdnmap_engine::figures` (per-cluster
//!   demand, node loads and utilization, the map units each cluster holds, demand flows from
//!   regions to clusters, the demand-weighted mean RTT, and a map unit's "why"), without I/O
//!   or a clock, once per map version on first request (`app.rs` keeps them).
//! - [`http`] is the axum router: the embedded page (`api/assets/`), the read-only API, and the
//!   actions (drain / undrain / down), which need the Admin token and go through the same code
//!   path as the gRPC Admin `SetClusterState`; ramps of a drain or a capacity cut
//!   ([`crate::ramp`]) are started, listed and cancelled by `ramps.rs`.

mod app;
mod clusters;
mod diff;
pub mod http;
mod n1;
mod policy;
mod preview;
mod ramps;

pub(crate) use app::authorize;
pub(crate) use app::ApiError;
pub use http::router;
