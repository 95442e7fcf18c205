//! cdnmap's worlds: what the mapper is run on when there is no real network to map.
//!
//! - [`world`]: the realistic world generator (map units where people live, clusters at real
//!   edge sites, latency from great-circle distance), over the city and site files in `data/`,
//!   which are embedded in the library.
//! - [`synth`]: synthetic demand traces of a world (a daily rhythm, noise, a flash crowd, a
//!   cluster failure, true coefficients above the configured ones).
//! - [`mmdb`]: client networks and their locations from a MaxMind DB (GeoIP2/GeoLite2 City,
//!   DB-IP), and a writer of such databases; [`world::from_located`] makes a world of them.
//! - [`czf`]: Traffic Control coverage zone files, and a world of their networks over a
//!   topology's clusters.
//! - [`trace`]: the demand trace format (`docs/trace.md`), a strict reader and a writer.
//!
//! Everything is deterministic given its parameters: the same seed gives the same world and
//! the same trace, byte for byte. No clock, no global randomness, no I/O beyond the writer a
//! caller hands in.

pub mod czf;
pub mod mmdb;
pub mod synth;
pub mod trace;

#[cfg(test)]
mod fuzz;
pub mod world;
