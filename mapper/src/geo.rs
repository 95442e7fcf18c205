//! The distance model: great-circle distances and the RTT they suggest. The world generator
//! scores candidates with it, and the second chance estimates the RTT to a cluster beyond a
//! unit's candidate list with it (calibrated by the unit's listed scores). A leaf module.

/// Mean Earth radius (IUGG), km.
pub const EARTH_RADIUS_KM: f64 = 6371.0088;
/// Fibre routes are longer than the great circle by about this factor.
pub const ROUTE_INFLATION: f64 = 1.5;
/// Light in fibre covers about 200 km per ms (refractive index ~1.5).
pub const FIBRE_KM_PER_MS: f64 = 200.0;
/// Fixed RTT overhead (last mile, queueing, server), ms.
pub const RTT_BASE_MS: f64 = 2.0;

/// Great-circle distance in km (haversine formula, mean Earth radius).
pub fn distance_km(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let dp = p2 - p1;
    let dl = (lon2 - lon1).to_radians();
    let a = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_KM * a.sqrt().min(1.0).asin()
}

/// RTT estimate for a great-circle distance: `RTT_BASE_MS + 2 × km × ROUTE_INFLATION /
/// FIBRE_KM_PER_MS`, i.e. 2 ms plus 0.015 ms per km (London–New York, 5,570 km: about 85.6 ms).
pub fn rtt_from_km(km: f64) -> f64 {
    RTT_BASE_MS + 2.0 * km * ROUTE_INFLATION / FIBRE_KM_PER_MS
}

/// RTT estimate in ms between two points: [`rtt_from_km`] of their haversine [`distance_km`].
pub fn rtt_ms(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    rtt_from_km(distance_km(lat1, lon1, lat2, lon2))
}

/// A point as a unit vector: the chord between two of them gives the same distance as the
/// haversine formula (`d = 2R asin(chord / 2)`), with one `asin` per pair.
pub fn unit_vector(lat: f64, lon: f64) -> [f64; 3] {
    let (p, l) = (lat.to_radians(), lon.to_radians());
    [p.cos() * l.cos(), p.cos() * l.sin(), p.sin()]
}

/// The squared chord between two unit vectors.
pub fn chord2(a: &[f64; 3], b: &[f64; 3]) -> f64 {
    let (x, y, z) = (a[0] - b[0], a[1] - b[1], a[2] - b[2]);
    x * x + y * y + z * z
}

/// The great-circle distance in km of a squared chord.
pub fn chord2_to_km(c2: f64) -> f64 {
    2.0 * EARTH_RADIUS_KM * (c2.sqrt() / 2.0).min(1.0).asin()
}
