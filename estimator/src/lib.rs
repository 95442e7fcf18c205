//! Demand and capacity estimation (issue 5): the pure core. No I/O, no clock reads (times are
//! arguments), no global randomness.
//!
//! - [`forecast`]: per map unit demand forecasts from reported query counts (smoothing with a
//!   daily season, robust to gaps and spikes, floored).
//! - [`learn`]: the per-class resource coefficients (Fps and Bps per unit of demand) learned
//!   from measured node loads against the demand the map sent there (recency-weighted,
//!   non-negative least squares), with a confidence and bounds.
//! - [`derate`]: clusters whose measured load runs ahead of what the model predicts get their
//!   effective capacity lowered until the model catches up, with the reason kept.
//! - [`observed`]: the demand reported per map unit over a period, as a column by unit index.
//! - [`demand_code`]: a demand in 16 bits (9 significant): what each forecast is rounded to
//!   before it reaches the instance, so the store keeps a round's demands in 2 bytes a unit.
//! - [`rtt`]: measured round-trip times per (map unit, cluster), a robust decayed median each,
//!   which the rounds use as scores where measured.
//! - [`state`]: all three together as the mapping loop and the replay use them: observations
//!   in, the next round's instance out.

pub mod demand_code;
pub mod derate;
pub mod forecast;
pub mod learn;
pub mod observed;
pub mod rtt;
pub mod state;
