//! Geometry: great-circle distances, the RTT estimate, and the unit-vector form of a point used
//! on the hot path.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub use cdnmap_mapper::geo::{
    chord2, chord2_to_km, distance_km, rtt_from_km, rtt_ms, unit_vector, EARTH_RADIUS_KM,
    FIBRE_KM_PER_MS, ROUTE_INFLATION, RTT_BASE_MS,
};

/// A uniformly random point within `radius_km` of (lat, lon) (flat approximation, fine at a few
/// km; longitude wrapped, latitude clamped).
pub(super) fn jitter(rng: &mut ChaCha8Rng, lat: f64, lon: f64, radius_km: f64) -> (f64, f64) {
    let r = radius_km * rng.random::<f64>().sqrt();
    let theta = std::f64::consts::TAU * rng.random::<f64>();
    let km_per_deg = EARTH_RADIUS_KM.to_radians();
    let new_lat = (lat + r * theta.cos() / km_per_deg).clamp(-90.0, 90.0);
    let mut new_lon = lon + r * theta.sin() / (km_per_deg * lat.to_radians().cos().max(0.01));
    if new_lon > 180.0 {
        new_lon -= 360.0;
    } else if new_lon < -180.0 {
        new_lon += 360.0;
    }
    (new_lat, new_lon.clamp(-180.0, 180.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn haversine_sanity() {
        let (lon_lat, lon_lon, ny_lat, ny_lon) = (51.5074, -0.1278, 40.7128, -74.0060);
        let d = distance_km(lon_lat, lon_lon, ny_lat, ny_lon);
        assert!((5_540.0..5_600.0).contains(&d), "{d}");
        let rtt = rtt_ms(lon_lat, lon_lon, ny_lat, ny_lon);
        assert!((70.0..100.0).contains(&rtt), "{rtt}");
        assert_eq!(rtt, rtt_ms(ny_lat, ny_lon, lon_lat, lon_lon));
        assert_eq!(rtt_ms(10.0, 20.0, 10.0, 20.0), RTT_BASE_MS);
        let half = distance_km(0.0, 0.0, 0.0, 180.0);
        assert!((half - std::f64::consts::PI * EARTH_RADIUS_KM).abs() < 1e-6);
        // The chord form used on the hot path agrees with the haversine form.
        for &(a, b, c, e) in &[
            (51.5, -0.1, 40.7, -74.0),
            (1.0, 2.0, 1.0001, 2.0001),
            (-33.9, 151.2, 35.7, 139.7),
        ] {
            let fast = chord2_to_km(chord2(&unit_vector(a, b), &unit_vector(c, e)));
            assert!((fast - distance_km(a, b, c, e)).abs() < 1e-6, "{fast}");
        }
    }
}
