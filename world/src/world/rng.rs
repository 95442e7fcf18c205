//! Randomness: one ChaCha8 stream per purpose, and the draws the generator makes from them.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Independent random streams, one per purpose, so that changing how one part draws does not
/// change the others.
pub(super) mod stream {
    pub(in crate::world) const CAPACITY: u64 = 2;
    pub(in crate::world) const PREFIX_CITY: u64 = 3;
    pub(in crate::world) const DEMAND: u64 = 4;
    pub(in crate::world) const UNIT_LOCATION: u64 = 5;
    pub(in crate::world) const PREFIX_FAMILY: u64 = 6;
}

/// Stream `stream` of the ChaCha8 generator seeded from `seed`: equal arguments, equal draws.
pub(super) fn rng_for(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A lognormal draw with median 1.
pub(super) fn lognormal(rng: &mut ChaCha8Rng, sigma: f64) -> f64 {
    (sigma * normal(rng)).exp()
}
