//! Statistics the benchmarks and the simulations share.

/// Least-squares fit `y = a + b x`: `(a, b, r²)`; `None` with fewer than 3 points or no spread.
pub fn fit_line(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    if sxx <= 0.0 || syy <= 0.0 {
        return None;
    }
    let b = sxy / sxx;
    let a = my - b * mx;
    Some((a, b, sxy * sxy / (sxx * syy)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_line_recovers_a_line_and_rejects_degenerate_input() {
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 + 2.0 * f64::from(i)))
            .collect();
        let (a, b, r2) = fit_line(&pts).expect("fit");
        assert!((a - 3.0).abs() < 1e-9 && (b - 2.0).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-9);
        assert!(fit_line(&pts[..2]).is_none());
        assert!(fit_line(&[(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]).is_none());
    }
}
