//! Learning what one unit of demand of each class really costs: the per-class coefficients of
//! one resource kind (Bps or Fps), from measured node loads against the demand the map sent
//! through each node.
//!
//! Model: a node's load is `Σ_k c_k · d_k`, `d_k` the demand of class `k` passing it. Each
//! report adds the observation to recency-weighted normal equations (older observations fade
//! by `forgetting` per round), and the estimate is their non-negative least-squares solution,
//! found exactly over the subsets of active classes (at most [`MAX_LEARNED_CLASSES`]), then
//! bounded to a factor range around the configured coefficients. It is *confident* once the
//! weight of observations and each class's share of them pass thresholds; the mapper should use
//! learned values only then.

/// The most classes one learner handles (the exact solver tries every subset).
pub const MAX_LEARNED_CLASSES: usize = 12;

/// Tunables.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LearnConfig {
    /// Per round, the weight left to what was observed before (0..1; 1 = never forget).
    pub forgetting: f64,
    /// Learned coefficients stay within [low × configured, high × configured].
    pub low: f64,
    pub high: f64,
    /// Confident once the observations weigh this much in all...
    pub min_weight: f64,
    /// ...and every class carries at least this share of the total demand observed.
    pub min_class_share: f64,
}

impl Default for LearnConfig {
    fn default() -> Self {
        LearnConfig {
            forgetting: 0.999,
            low: 0.25,
            high: 4.0,
            min_weight: 50.0,
            min_class_share: 0.01,
        }
    }
}

/// The learned coefficients of one resource kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub coefficients: Vec<f64>,
    pub confident: bool,
    /// The weight of the observations behind it.
    pub weight: f64,
    /// Root-mean-square relative residual of the fit (how well the model explains the loads).
    pub relative_residual: f64,
}

/// Why a learner refused its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LearnError {
    TooManyClasses { classes: usize },
    Shape { expected: usize, got: usize },
    NotFinite,
}

impl std::fmt::Display for LearnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LearnError::TooManyClasses { classes } => write!(
                f,
                "{classes} classes, more than the {MAX_LEARNED_CLASSES} a learner handles"
            ),
            LearnError::Shape { expected, got } => {
                write!(
                    f,
                    "a demand vector has {got} classes, the learner {expected}"
                )
            }
            LearnError::NotFinite => write!(f, "a load or demand is negative or not a number"),
        }
    }
}

impl std::error::Error for LearnError {}

/// Recency-weighted normal equations for one resource kind.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Learner {
    configured: Vec<f64>,
    /// Σ w d dᵀ (row-major K×K), Σ w d L, Σ w L², Σ w, Σ w d.
    ata: Vec<f64>,
    atb: Vec<f64>,
    btb: f64,
    weight: f64,
    demand: Vec<f64>,
}

impl Learner {
    /// How many classes it learns.
    pub fn classes(&self) -> usize {
        self.configured.len()
    }

    /// A learner for classes whose configured coefficients (of this kind) are `configured`.
    pub fn new(configured: Vec<f64>) -> Result<Self, LearnError> {
        let k = configured.len();
        if k > MAX_LEARNED_CLASSES {
            return Err(LearnError::TooManyClasses { classes: k });
        }
        Ok(Learner {
            configured,
            ata: vec![0.0; k * k],
            atb: vec![0.0; k],
            btb: 0.0,
            weight: 0.0,
            demand: vec![0.0; k],
        })
    }

    /// Ages what was observed by one round.
    pub fn next_round(&mut self, config: &LearnConfig) {
        let f = config.forgetting;
        self.ata.iter_mut().for_each(|x| *x *= f);
        self.atb.iter_mut().for_each(|x| *x *= f);
        self.demand.iter_mut().for_each(|x| *x *= f);
        self.btb *= f;
        self.weight *= f;
    }

    /// One node's measured `load` with `demand[k]` of each class passing it.
    pub fn observe(&mut self, demand: &[f64], load: f64) -> Result<(), LearnError> {
        let k = self.configured.len();
        if demand.len() != k {
            return Err(LearnError::Shape {
                expected: k,
                got: demand.len(),
            });
        }
        if !(load.is_finite() && load >= 0.0)
            || demand.iter().any(|d| !(d.is_finite() && *d >= 0.0))
        {
            return Err(LearnError::NotFinite);
        }
        // Weight each node by 1 / its load, so big and small nodes count alike in relative
        // terms (the errors we care about are relative).
        let scale = 1.0 / load.max(1e-9);
        for i in 0..k {
            for j in 0..k {
                self.ata[i * k + j] += demand[i] * demand[j] * scale * scale;
            }
            self.atb[i] += demand[i] * load * scale * scale;
            self.demand[i] += demand[i];
        }
        self.btb += 1.0;
        self.weight += 1.0;
        Ok(())
    }

    /// The current estimate (the configured coefficients while nothing was observed).
    pub fn estimate(&self, config: &LearnConfig) -> Estimate {
        let k = self.configured.len();
        let mut best: Option<(f64, Vec<f64>)> = None;
        // Exact NNLS: the best unconstrained solution on each subset of classes, kept when it
        // is non-negative.
        for mask in 0u32..(1 << k) {
            let idx: Vec<usize> = (0..k).filter(|&i| mask & (1 << i) != 0).collect();
            let Some(sub) = solve(&self.ata, &self.atb, k, &idx) else {
                continue;
            };
            if sub.iter().any(|&x| x < 0.0) {
                continue;
            }
            let mut c = vec![0.0; k];
            for (&i, &x) in idx.iter().zip(&sub) {
                c[i] = x;
            }
            let obj = self.objective(&c);
            if best.as_ref().is_none_or(|(o, _)| obj < *o) {
                best = Some((obj, c));
            }
        }
        let total: f64 = self.demand.iter().sum();
        let observed_class =
            |i: usize| total > 0.0 && self.demand[i] / total >= config.min_class_share;
        let (objective, raw) = best.unwrap_or((self.btb, self.configured.clone()));
        let coefficients = raw
            .iter()
            .zip(&self.configured)
            .enumerate()
            .map(|(i, (&c, &conf))| {
                if observed_class(i) {
                    c.clamp(conf * config.low, conf * config.high)
                } else {
                    conf
                }
            })
            .collect();
        let confident = self.weight >= config.min_weight && (0..k).all(observed_class);
        Estimate {
            coefficients,
            confident,
            weight: self.weight,
            relative_residual: if self.weight > 0.0 {
                (objective.max(0.0) / self.weight).sqrt()
            } else {
                0.0
            },
        }
    }

    /// Σ w (L − c·d)², from the normal equations.
    fn objective(&self, c: &[f64]) -> f64 {
        let k = c.len();
        let mut quad = 0.0;
        for i in 0..k {
            for j in 0..k {
                quad += c[i] * self.ata[i * k + j] * c[j];
            }
        }
        let lin: f64 = (0..k).map(|i| c[i] * self.atb[i]).sum();
        quad - 2.0 * lin + self.btb
    }
}

/// Solves the normal equations restricted to `idx` (Gaussian elimination with partial
/// pivoting); `None` when singular.
fn solve(ata: &[f64], atb: &[f64], k: usize, idx: &[usize]) -> Option<Vec<f64>> {
    let n = idx.len();
    if n == 0 {
        return Some(Vec::new());
    }
    let mut m: Vec<Vec<f64>> = idx
        .iter()
        .map(|&i| {
            let mut row: Vec<f64> = idx.iter().map(|&j| ata[i * k + j]).collect();
            row.push(atb[i]);
            row
        })
        .collect();
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        let scale = m.iter().map(|r| r[col].abs()).fold(0.0, f64::max);
        if m[pivot][col].abs() <= 1e-12 * scale.max(1e-300) {
            return None;
        }
        m.swap(col, pivot);
        let pivot_row = m[col].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| m[i][n] / m[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Nodes with random class mixes, loads from the true coefficients with ±5% noise.
    fn learn(truth: &[f64], configured: &[f64], rounds: usize, seed: u64) -> Estimate {
        let config = LearnConfig::default();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut l = Learner::new(configured.to_vec()).expect("learner");
        for _ in 0..rounds {
            l.next_round(&config);
            for _ in 0..20 {
                let demand: Vec<f64> = truth
                    .iter()
                    .map(|_| rng.random_range(0.0..100.0) * rng.random_range(0.0..1.0f64).powi(2))
                    .collect();
                let load: f64 = truth.iter().zip(&demand).map(|(c, d)| c * d).sum();
                let noisy = load * rng.random_range(0.95..1.05);
                if noisy > 0.0 {
                    l.observe(&demand, noisy).expect("observe");
                }
            }
        }
        l.estimate(&config)
    }

    #[test]
    fn recovers_true_coefficients_within_5_percent() {
        let configured = [1.0, 4.0, 0.25];
        let truth = [1.3, 5.2, 0.2];
        let e = learn(&truth, &configured, 200, 1);
        eprintln!("learned {:?} (true {truth:?})", e.coefficients);
        assert!(e.confident, "{e:?}");
        for (k, (got, want)) in e.coefficients.iter().zip(truth).enumerate() {
            assert!(
                (got - want).abs() <= 0.05 * want,
                "class {k}: learned {got:.4}, true {want}"
            );
        }
        assert!(e.relative_residual < 0.05, "{e:?}");
    }

    #[test]
    fn a_class_that_costs_nothing_is_held_at_its_lower_bound_never_negative() {
        let e = learn(&[0.5, 0.0, 2.0], &[0.5, 0.1, 2.0], 200, 2);
        // 0 is below the bound 0.25 × 0.1: the bound holds it there.
        assert!((e.coefficients[1] - 0.025).abs() < 1e-12, "{e:?}");
        assert!((e.coefficients[0] - 0.5).abs() <= 0.025 && (e.coefficients[2] - 2.0).abs() <= 0.1);
    }

    #[test]
    fn without_data_it_keeps_the_configured_values_and_is_not_confident() {
        let config = LearnConfig::default();
        let l = Learner::new(vec![1.0, 2.0]).expect("learner");
        let e = l.estimate(&config);
        assert_eq!(e.coefficients, vec![1.0, 2.0]);
        assert!(!e.confident);
        // One class never seen: it keeps its configured value and confidence waits.
        let mut l = Learner::new(vec![1.0, 2.0]).expect("learner");
        for i in 0..100 {
            l.observe(&[10.0 + f64::from(i), 0.0], 15.0 + 1.5 * f64::from(i))
                .expect("ok");
        }
        let e = l.estimate(&config);
        assert_eq!(e.coefficients[1], 2.0);
        assert!((e.coefficients[0] - 1.5).abs() < 1e-9);
        assert!(!e.confident);
    }

    #[test]
    fn bad_input_is_refused() {
        let mut l = Learner::new(vec![1.0, 2.0]).expect("learner");
        assert_eq!(
            l.observe(&[1.0], 1.0),
            Err(LearnError::Shape {
                expected: 2,
                got: 1
            })
        );
        assert_eq!(l.observe(&[1.0, f64::NAN], 1.0), Err(LearnError::NotFinite));
        assert_eq!(l.observe(&[1.0, 1.0], -1.0), Err(LearnError::NotFinite));
        assert!(Learner::new(vec![1.0; MAX_LEARNED_CLASSES + 1]).is_err());
    }
}
