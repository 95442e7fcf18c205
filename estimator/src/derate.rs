//! Derating: a cluster whose measured load runs ahead of what the model predicts (with the
//! learned coefficients) gets its effective capacity lowered, so the mapper stops sending it
//! more than it can take, until the model catches up; an operator can see why.
//!
//! Each round, for each cluster, the worst node's ratio `measured / predicted` is taken. Above
//! `1 + tolerance` the cluster's capacity factor moves toward `1 / ratio`; otherwise it recovers
//! toward 1. Both moves are smoothed, and the factor never goes below `floor`.

use std::collections::BTreeMap;

/// Tunables.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DerateConfig {
    /// Measured may exceed predicted by this share before derating starts.
    pub tolerance: f64,
    /// Per round, the share of the way to the target factor taken.
    pub speed: f64,
    /// The lowest capacity factor.
    pub floor: f64,
}

impl Default for DerateConfig {
    fn default() -> Self {
        DerateConfig {
            tolerance: 0.05,
            speed: 0.3,
            floor: 0.25,
        }
    }
}

/// Why a cluster is derated: its worst node this round.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reason {
    pub node: String,
    pub measured: f64,
    pub predicted: f64,
}

/// One cluster's derating state.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Derating {
    /// Multiply the cluster's capacities by this (in `[floor, 1]`).
    pub factor: f64,
    pub reason: Option<Reason>,
}

impl Default for Derating {
    fn default() -> Self {
        Derating {
            factor: 1.0,
            reason: None,
        }
    }
}

/// Derating of every cluster, by id.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Derater {
    clusters: BTreeMap<String, Derating>,
}

impl Derater {
    /// One round for `cluster`: its nodes' `(name, measured, predicted)` loads.
    pub fn observe(&mut self, cluster: &str, nodes: &[(String, f64, f64)], config: &DerateConfig) {
        let worst = nodes
            .iter()
            .filter(|(_, m, p)| m.is_finite() && p.is_finite() && *m >= 0.0 && *p > 0.0)
            .max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)));
        let d = self.clusters.entry(cluster.to_string()).or_default();
        let (target, reason) = match worst {
            Some((node, m, p)) if m / p > 1.0 + config.tolerance => (
                (p / m).max(config.floor),
                Some(Reason {
                    node: node.clone(),
                    measured: *m,
                    predicted: *p,
                }),
            ),
            _ => (1.0, None),
        };
        d.factor = (d.factor + config.speed * (target - d.factor)).clamp(config.floor, 1.0);
        if (d.factor - 1.0).abs() < 1e-3 && reason.is_none() {
            d.factor = 1.0;
        }
        if reason.is_some() || d.factor >= 1.0 {
            d.reason = reason;
        }
    }

    /// The capacity factor of `cluster` (1 if it was never derated).
    pub fn factor(&self, cluster: &str) -> f64 {
        self.clusters.get(cluster).map_or(1.0, |d| d.factor)
    }

    /// The derated clusters, with why.
    pub fn derated(&self) -> impl Iterator<Item = (&str, &Derating)> {
        self.clusters
            .iter()
            .filter(|(_, d)| d.factor < 1.0)
            .map(|(c, d)| (c.as_str(), d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(m: f64, p: f64) -> Vec<(String, f64, f64)> {
        vec![("cpu".into(), m, p), ("uplink".into(), p * 0.5, p)]
    }

    #[test]
    fn a_hot_cluster_is_derated_with_its_reason_and_recovers() {
        let config = DerateConfig::default();
        let mut d = Derater::default();
        for _ in 0..30 {
            d.observe("fra-1", &node(130.0, 100.0), &config);
            d.observe("ams-1", &node(100.0, 100.0), &config);
        }
        let f = d.factor("fra-1");
        assert!((f - 100.0 / 130.0).abs() < 0.01, "factor {f}");
        assert_eq!(d.factor("ams-1"), 1.0);
        let derated: Vec<_> = d.derated().collect();
        assert_eq!(derated.len(), 1);
        let reason = derated[0].1.reason.as_ref().expect("a reason");
        assert_eq!((reason.node.as_str(), reason.measured), ("cpu", 130.0));
        // The model catches up: the factor goes back to 1.
        for _ in 0..40 {
            d.observe("fra-1", &node(100.0, 100.0), &config);
        }
        assert_eq!(d.factor("fra-1"), 1.0);
        assert_eq!(d.derated().count(), 0);
    }

    #[test]
    fn within_tolerance_and_bad_numbers_change_nothing() {
        let config = DerateConfig::default();
        let mut d = Derater::default();
        d.observe("a", &node(104.0, 100.0), &config);
        d.observe(
            "b",
            &[("x".into(), f64::NAN, 1.0), ("y".into(), 5.0, 0.0)],
            &config,
        );
        assert_eq!(d.factor("a"), 1.0);
        assert_eq!(d.factor("b"), 1.0);
        assert_eq!(d.factor("never-seen"), 1.0);
        // Never below the floor.
        for _ in 0..100 {
            d.observe("c", &node(1e9, 1.0), &config);
        }
        assert!((d.factor("c") - config.floor).abs() < 1e-12);
    }
}
