//! The estimator as the mapping loop and the replay use it: forecasters per map unit (by id, so
//! topology changes keep them), one learner per resource kind, the derater; observations in,
//! the next round's instance (forecast demand, learned coefficients, derated capacities) out.

use std::collections::HashMap;

use cdnmap_mapper::format::{InstanceFile, NestedNode, ResourcesFile};
use cdnmap_mapper::{Instance, Limits, Map, ModelError, PerUnit, ResourceKind, UnitIdx};

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

/// The estimator's state.
#[derive(Debug, Clone)]
pub struct Estimates {
    pub forecast_config: ForecastConfig,
    pub learn_config: LearnConfig,
    pub derate_config: DerateConfig,
    forecasters: HashMap<String, Forecaster>,
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
            forecasters: HashMap::new(),
            learners,
            derater: Derater::default(),
            configured,
        })
    }

    /// Unit `unit_id`'s demand over the round ending at `t_ms`.
    pub fn observe_demand(&mut self, unit_id: &str, t_ms: i64, demand: f64) {
        let config = self.forecast_config;
        self.forecasters
            .entry(unit_id.to_string())
            .or_default()
            .observe(t_ms, demand, &config);
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
        let coefficients = self.coefficients(false);
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

    /// The coefficients the mapper should use: learned once confident (and `learned_only` is
    /// false or they are), else configured.
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
        let mut file = InstanceFile::of(base);
        if forecast {
            for unit in &mut file.map_units {
                if let Some(d) = self.forecast(&unit.id, t_ms) {
                    unit.demand = d;
                }
            }
        }
        if learning {
            let coefficients = self.coefficients(true);
            for (class, p) in file.traffic_classes.iter_mut().zip(coefficients) {
                class.per_unit = p;
            }
            for cluster in &mut file.clusters {
                let factor = self.derater.factor(&cluster.id);
                if factor < 1.0 {
                    if let ResourcesFile::Nested(root) = &mut cluster.resources {
                        scale(root, factor);
                    }
                }
            }
        }
        file.build(Limits::default())
    }
}

fn scale(n: &mut NestedNode, factor: f64) {
    n.capacity *= factor;
    for c in &mut n.children {
        scale(c, factor);
    }
}
