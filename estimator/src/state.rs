//! The estimator as the mapping loop and the replay use it: forecasters per map unit (by id, so
//! topology changes keep them), one learner per resource kind, the derater; observations in,
//! the next round's instance (forecast demand, learned coefficients, derated capacities) out.

use std::collections::HashMap;

use rustc_hash::FxHashMap;

use cdnmap_mapper::{Instance, Map, ModelError, PerUnit, ResourceKind, UnitIdx};

use crate::derate::{DerateConfig, Derater};
use crate::forecast::{ForecastConfig, Forecaster};
use crate::learn::{LearnConfig, LearnError, Learner};

const KINDS: [ResourceKind; 2] = [ResourceKind::Bps, ResourceKind::Fps];

/// Demand per class passing each resource node (global index) under a map.
pub type Through = Vec<Vec<f64>>;

/// What `map` (of `instance`, scaled by `actual / planned` demand per unit when given) sends
/// through every node, per class.
pub fn through(instance: &Instance, map: &Map, actual: Option<&[Option<f64>]>) -> Through {
    let classes = instance.classes().len();
    let mut out = vec![vec![0.0; classes]; instance.node_count()];
    for u in 0..instance.unit_count().min(map.unit_count()) as UnitIdx {
        let scale = match actual {
            None => 1.0,
            Some(a) => match a.get(u as usize).copied().flatten() {
                None => continue,
                Some(x) => {
                    let planned = instance.unit_demand(u);
                    if planned > 0.0 {
                        x / planned
                    } else {
                        0.0
                    }
                }
            },
        };
        let k = instance.unit_class(u);
        for a in map.allocations(u) {
            let Some(cl) = instance.clusters().get(a.cluster as usize) else {
                continue;
            };
            for n in cl.path(k) {
                out[instance.global_node(a.cluster, n)][usize::from(k)] += a.amount * scale;
            }
        }
    }
    out
}

/// The estimator's state. It is saved with every published map ([`Estimates::to_bytes`]) and
/// read back at start ([`Estimates::from_bytes`]), so a restart forgets nothing.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimates {
    pub forecast_config: ForecastConfig,
    pub learn_config: LearnConfig,
    pub derate_config: DerateConfig,
    /// By unit id (Fx hashing: a round looks up every unit, twice).
    forecasters: FxHashMap<Box<str>, Forecaster>,
    learners: Vec<Learner>,
    derater: Derater,
    configured: Vec<PerUnit>,
}

impl Estimates {
    /// Starts from `instance`'s configured coefficients.
    pub fn new(instance: &Instance) -> Result<Self, LearnError> {
        let configured: Vec<PerUnit> = instance.classes().iter().map(|c| c.per_unit).collect();
        let learners = KINDS
            .iter()
            .map(|&kind| Learner::new(configured.iter().map(|p| p.get(kind)).collect()))
            .collect::<Result<_, _>>()?;
        Ok(Estimates {
            forecast_config: ForecastConfig::default(),
            learn_config: LearnConfig::default(),
            derate_config: DerateConfig::default(),
            forecasters: FxHashMap::default(),
            learners,
            derater: Derater::default(),
            configured,
        })
    }

    /// The whole state, encoded (postcard: compact, numbers bit for bit).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain numbers, strings and maps cannot fail; an empty result is read
        // back as an error, never as a state.
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// A state saved by [`Estimates::to_bytes`], for `instance`: refused (with the reason)
    /// when it does not fit the instance's traffic classes. When the configured coefficients
    /// changed since it was saved, the learners start afresh from the new ones (the forecasts
    /// and deratings are kept).
    pub fn from_bytes(bytes: &[u8], instance: &Instance) -> Result<Self, String> {
        let mut est: Estimates =
            postcard::from_bytes(bytes).map_err(|e| format!("the saved estimator state: {e}"))?;
        let classes = instance.classes().len();
        if est.configured.len() != classes
            || est.learners.len() != KINDS.len()
            || est.learners.iter().any(|l| l.classes() != classes)
        {
            return Err(format!(
                "the saved estimator state has {} traffic classes, the topology {classes}",
                est.configured.len()
            ));
        }
        let configured: Vec<PerUnit> = instance.classes().iter().map(|c| c.per_unit).collect();
        if configured != est.configured {
            let fresh = Estimates::new(instance).map_err(|e| e.to_string())?;
            est.learners = fresh.learners;
            est.configured = fresh.configured;
        }
        Ok(est)
    }

    /// Unit `unit_id`'s demand over the round ending at `t_ms`.
    pub fn observe_demand(&mut self, unit_id: &str, t_ms: i64, demand: f64) {
        let config = self.forecast_config;
        // Most units were seen before: look up without allocating the key.
        match self.forecasters.get_mut(unit_id) {
            Some(f) => {
                f.observe(t_ms, demand, &config);
            }
            None => {
                self.forecasters
                    .entry(unit_id.into())
                    .or_default()
                    .observe(t_ms, demand, &config);
            }
        }
    }

    /// The demand forecast of `unit_id` at `t_ms`, if it was ever observed.
    pub fn forecast(&self, unit_id: &str, t_ms: i64) -> Option<f64> {
        self.forecasters
            .get(unit_id)
            .filter(|f| f.observations() > 0)
            .map(|f| f.forecast(t_ms, &self.forecast_config))
    }

    /// Measured loads of `instance`'s nodes `(global node, load)`, with `through` the demand
    /// per class that passed each node: the learners learn, and each cluster with a measured
    /// node is derated (or recovers) by measured vs predicted.
    pub fn observe_loads(
        &mut self,
        instance: &Instance,
        through: &Through,
        loads: &[(usize, f64)],
    ) -> Result<(), LearnError> {
        // Predict with what the mapper uses (learned only once confident): a cluster stays
        // derated until the coefficients that explain its load are in the map.
        let coefficients = self.coefficients(true);
        let mut per_cluster: HashMap<usize, Vec<(String, f64, f64)>> = HashMap::new();
        let mut owner = Vec::with_capacity(instance.node_count());
        for (c, cl) in instance.clusters().iter().enumerate() {
            for n in 0..cl.nodes.len() {
                owner.push((c, n));
            }
        }
        for &(g, load) in loads {
            let Some(&(c, n)) = owner.get(g) else {
                continue;
            };
            let node = &instance.clusters()[c].nodes[n];
            let demand = &through[g];
            if !demand.iter().any(|&d| d > 0.0) {
                continue;
            }
            let kind = usize::from(node.kind == ResourceKind::Fps);
            self.learners[kind].observe(demand, load)?;
            let predicted: f64 = demand
                .iter()
                .zip(&coefficients)
                .map(|(d, p)| d * p.get(node.kind))
                .sum();
            per_cluster
                .entry(c)
                .or_default()
                .push((node.name.clone(), load, predicted));
        }
        let config = self.derate_config;
        for (c, nodes) in per_cluster {
            self.derater
                .observe(&instance.clusters()[c].id, &nodes, &config);
        }
        Ok(())
    }

    /// Ages the learners' observations by one round.
    pub fn next_round(&mut self) {
        let config = self.learn_config;
        self.learners.iter_mut().for_each(|l| l.next_round(&config));
    }

    /// Whether every learner is confident.
    pub fn confident(&self) -> bool {
        self.learners
            .iter()
            .all(|l| l.estimate(&self.learn_config).confident)
    }

    /// The coefficients: learned, or — when `require_confidence` is set and the learners are
    /// not yet confident — the configured ones (what the mapper uses).
    pub fn coefficients(&self, require_confidence: bool) -> Vec<PerUnit> {
        let estimates: Vec<_> = self
            .learners
            .iter()
            .map(|l| l.estimate(&self.learn_config))
            .collect();
        if require_confidence && !estimates.iter().all(|e| e.confident) {
            return self.configured.clone();
        }
        (0..self.configured.len())
            .map(|k| PerUnit {
                bps: estimates[0].coefficients[k],
                fps: estimates[1].coefficients[k],
            })
            .collect()
    }

    pub fn derater(&self) -> &Derater {
        &self.derater
    }

    /// `base` as the next round (at `t_ms`) should see it: forecast demand for the units that
    /// were ever observed (`forecast`), the learned coefficients once confident and derated
    /// capacities (`learning`).
    pub fn apply(
        &self,
        base: &Instance,
        t_ms: i64,
        forecast: bool,
        learning: bool,
    ) -> Result<Instance, ModelError> {
        // Nothing to change (no unit observed, nothing learned or derated yet): the base itself,
        // without rebuilding it.
        let changes_demand = forecast && !self.forecasters.is_empty();
        let changes_costs =
            learning && (self.confident() || self.derater.derated().next().is_some());
        if !changes_demand && !changes_costs {
            return Ok(base.clone());
        }
        // Edits of the columns that change, sharing the rest (no rebuild through the file
        // form: at 1 M units that took 3-4 s a round).
        let mut next = base.clone();
        if changes_demand {
            let demands = (0..base.unit_count() as UnitIdx)
                .map(|u| {
                    self.forecast(base.unit_id(u), t_ms)
                        .unwrap_or_else(|| base.unit_demand(u))
                })
                .collect();
            next = next.with_demands(demands)?;
        }
        if learning {
            let factors: Vec<f64> = base
                .clusters()
                .iter()
                .map(|c| self.derater.factor(&c.id).min(1.0))
                .collect();
            next = next.with_costs(&self.coefficients(true), &factors)?;
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::format::parse_instance;
    use cdnmap_mapper::Limits;

    fn instance() -> Instance {
        let json = r#"{
          "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 0.5}}],
          "clusters": [{"id": "a", "lat": 0, "lon": 0, "resources":
            {"name": "up", "kind": "bps", "capacity": 100, "children": [
              {"name": "cpu", "kind": "fps", "capacity": 40, "classes": ["web"]}]}}],
          "map_units": [
            {"id": "u1", "class": "web", "demand": 10, "lat": 0, "lon": 0, "candidates": [{"cluster": "a", "score": 1}]},
            {"id": "u2", "class": "web", "demand": 20, "lat": 0, "lon": 0, "candidates": [{"cluster": "a", "score": 1}]}]
        }"#;
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    #[test]
    fn nothing_observed_leaves_the_instance_as_it_is() {
        let inst = instance();
        let est = Estimates::new(&inst).expect("estimates");
        assert_eq!(est.apply(&inst, 0, true, true).expect("apply"), inst);
    }

    #[test]
    fn observed_demand_replaces_the_configured_demand_of_that_unit_only() {
        let inst = instance();
        let mut est = Estimates::new(&inst).expect("estimates");
        est.observe_demand("u1", 10_000, 55.0);
        let next = est.apply(&inst, 20_000, true, true).expect("apply");
        let (u1, u2) = (
            next.unit_index("u1").expect("u1"),
            next.unit_index("u2").expect("u2"),
        );
        assert!((next.unit_demand(u1) - 55.0).abs() < 1e-9);
        assert_eq!(next.unit_demand(u2), 20.0);
        // Without forecasting, the configured demand stays.
        let same = est.apply(&inst, 20_000, false, true).expect("apply");
        assert_eq!(same.unit_demand(u1), 10.0);
    }

    #[test]
    fn loads_above_the_prediction_derate_the_cluster() {
        let inst = instance();
        let map = cdnmap_mapper::solve(&inst, &cdnmap_mapper::SolveOptions::default()).map;
        let flow = through(&inst, &map, None);
        let mut est = Estimates::new(&inst).expect("estimates");
        // The cpu node (global 1) measures twice what the configured 0.5 Fps per unit predicts.
        let predicted = 0.5 * 30.0;
        for _ in 0..20 {
            est.observe_loads(&inst, &flow, &[(1, 2.0 * predicted)])
                .expect("observe");
            est.next_round();
        }
        assert!(
            est.derater().factor("a") < 0.6,
            "{}",
            est.derater().factor("a")
        );
        let next = est.apply(&inst, 0, true, true).expect("apply");
        assert!(next.clusters()[0].nodes[1].capacity < 40.0 * 0.6);
    }

    #[test]
    fn the_saved_state_reads_back_equal_and_forecasts_alike() {
        let inst = instance();
        let map = cdnmap_mapper::solve(&inst, &cdnmap_mapper::SolveOptions::default()).map;
        let flow = through(&inst, &map, None);
        let mut est = Estimates::new(&inst).expect("estimates");
        for r in 0..30i64 {
            est.observe_demand("u1", r * 10_000, 40.0 + (r % 7) as f64 * 1.37);
            est.observe_demand("u2", r * 10_000, 0.1 + r as f64 / 3.0);
            est.observe_loads(&inst, &flow, &[(1, 19.3 + r as f64 * 0.01)])
                .expect("observe");
            est.next_round();
        }
        let back = Estimates::from_bytes(&est.to_bytes(), &inst).expect("read back");
        assert_eq!(back, est);
        assert_eq!(
            back.apply(&inst, 300_000, true, true).expect("apply"),
            est.apply(&inst, 300_000, true, true).expect("apply")
        );
        // Another set of classes: refused, naming what does not fit.
        let other = instance_with_two_classes();
        let err = Estimates::from_bytes(&est.to_bytes(), &other).expect_err("two classes");
        assert!(err.contains("traffic classes"), "{err}");
        assert!(Estimates::from_bytes(b"{", &inst).is_err());
    }

    fn instance_with_two_classes() -> Instance {
        let json = r#"{
          "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 0.5}},
                              {"name": "video", "priority": 1, "per_unit": {"bps": 4, "fps": 0.1}}],
          "clusters": [{"id": "a", "lat": 0, "lon": 0, "resources":
            {"name": "up", "kind": "bps", "capacity": 100, "classes": ["web", "video"]}}],
          "map_units": []
        }"#;
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }
}
