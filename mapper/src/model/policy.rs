//! Operator policy the allocation honours (issue 46), as part of the topology: so far, **cost
//! with a latency guard**. A price per cluster per unit of Bps; a unit's score at a cluster
//! becomes its latency plus `weight` × the price, except that a cluster is never preferred
//! over one more than `guard_ms` better (`crate::policy` makes the scores; the verifier checks
//! the guard on the map).
//!
//! [`PolicySpec`] is the file form (prices by cluster id), validated against the clusters
//! into [`Policy`] (prices by cluster index); [`Policy::spec`] gives the file form back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::limits::check_number;
use crate::error::ModelError;

/// The largest `weight × price` taken, in ms of score: a price may outweigh any latency, but
/// scores stay finite and measurable.
pub const MAX_COST_SCORE_MS: f64 = 10_000.0;

/// Policy in its file form (`"policy"` of an instance file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostSpec>,
}

/// Cost with a latency guard, in its file form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostSpec {
    /// Milliseconds of score per unit of price (0: prices reported, not used).
    pub weight: f64,
    /// A cluster is never preferred over a candidate more than this many ms better.
    #[serde(default = "default_guard_ms")]
    pub guard_ms: f64,
    /// The price of a cluster the table does not name, per unit of Bps.
    #[serde(default)]
    pub default_price: f64,
    /// Price per unit of Bps, by cluster id.
    #[serde(default)]
    pub prices: BTreeMap<String, f64>,
}

fn default_guard_ms() -> f64 {
    10.0
}

/// Validated policy, by cluster index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    pub cost: Option<CostPolicy>,
}

/// Validated cost policy: each cluster's price, by index.
#[derive(Debug, Clone, PartialEq)]
pub struct CostPolicy {
    pub weight: f64,
    pub guard_ms: f64,
    pub default_price: f64,
    pub price: Vec<f64>,
}

impl CostPolicy {
    /// Whether it changes any score (a weight and a price above 0).
    pub fn scores(&self) -> bool {
        self.weight > 0.0 && self.price.iter().any(|&p| p > 0.0)
    }

    /// What it adds to a score at cluster `c`, in ms.
    pub fn extra_ms(&self, c: usize) -> f64 {
        self.weight * self.price.get(c).copied().unwrap_or(self.default_price)
    }
}

impl Policy {
    /// `spec` validated against the clusters (their ids, in index order): every number finite
    /// and at least 0, every priced cluster known, `weight × price` at most
    /// [`MAX_COST_SCORE_MS`]; an error names the policy and the entry.
    pub fn of(spec: &PolicySpec, clusters: &[&str]) -> Result<Policy, ModelError> {
        let Some(cost) = &spec.cost else {
            return Ok(Policy::default());
        };
        let subject = || "policy.cost".to_string();
        check_number(subject, "weight", cost.weight)?;
        check_number(subject, "guard_ms", cost.guard_ms)?;
        check_number(subject, "default_price", cost.default_price)?;
        let mut price = vec![cost.default_price; clusters.len()];
        for (id, &p) in &cost.prices {
            let Some(c) = clusters.iter().position(|c| c == id) else {
                return Err(ModelError::BadNumber {
                    subject: format!("policy.cost.prices[{id:?}]"),
                    field: "cluster",
                    value: p,
                    rule: "names no cluster of the instance",
                });
            };
            check_number(|| format!("policy.cost.prices[{id:?}]"), "price", p)?;
            price[c] = p;
        }
        let most = price.iter().fold(cost.default_price, |a, &b| a.max(b));
        if cost.weight * most > MAX_COST_SCORE_MS {
            return Err(ModelError::BadNumber {
                subject: subject(),
                field: "weight",
                value: cost.weight,
                rule: "times the highest price must be at most 10000 ms of score",
            });
        }
        Ok(Policy {
            cost: Some(CostPolicy {
                weight: cost.weight,
                guard_ms: cost.guard_ms,
                default_price: cost.default_price,
                price,
            }),
        })
    }

    /// The file form, prices by the clusters' ids (those at the default price left out).
    pub fn spec(&self, clusters: &[&str]) -> PolicySpec {
        PolicySpec {
            cost: self.cost.as_ref().map(|c| CostSpec {
                weight: c.weight,
                guard_ms: c.guard_ms,
                default_price: c.default_price,
                prices: clusters
                    .iter()
                    .zip(&c.price)
                    .filter(|(_, &p)| p.to_bits() != c.default_price.to_bits())
                    .map(|(cl, &p)| (cl.to_string(), p))
                    .collect(),
            }),
        }
    }

    /// This policy over another cluster list (`clusters`' ids, after `old` was edited): each
    /// price follows its cluster by id, a new cluster takes the default price, a deleted one's
    /// goes.
    pub fn carried(&self, old: &[&str], clusters: &[&str]) -> Policy {
        Policy {
            cost: self.cost.as_ref().map(|c| CostPolicy {
                price: clusters
                    .iter()
                    .map(|n| {
                        old.iter()
                            .position(|o| o == n)
                            .and_then(|i| c.price.get(i).copied())
                            .unwrap_or(c.default_price)
                    })
                    .collect(),
                ..c.clone()
            }),
        }
    }
}
