//! `cdnmap simulate balls`: the batched, infinite balls-into-bins process of Berenbrink et al.
//! ("Self-stabilizing balls & bins in batches").
//!
//! Each round Poisson(λ·n) balls arrive at once. Each ball looks at d bins drawn uniformly (with
//! replacement) and joins the least loaded of them by the loads *as they were at the start of the
//! round* — it knows nothing of the other balls of its round — with power-of-d's own rule,
//! [`cdnmap_select::least_loaded`]. Then every non-empty bin finishes one ball. The
//! max load is read at the end of a round.
//!
//! Two engines run this process:
//!
//! - [`PerBall`] does exactly that, ball by ball: O(n + λ·n·d) per round. It is the oracle.
//! - [`Histogram`] keeps only how many bins sit at each load level and is exact in distribution.
//!   A ball's d choices have minimum load ≥ L with probability s_L^d, where s_L is the share of
//!   bins at load ≥ L, so it joins level L with probability p_L = s_L^d − s_{L+1}^d, uniformly
//!   among that level's c_L bins (they are exchangeable). With Poisson(λn) arrivals, splitting
//!   makes the counts that land on each bin independent Poisson(μ_L = λ·n·p_L / c_L); so the
//!   number of level-L bins getting j balls is multinomial(c_L; Poisson(μ_L) pmf), drawn as a
//!   chain of binomials (or bin by bin when c_L is small). Work per round is O(occupied levels),
//!   independent of n, so a spike of 10^6 balls or n = 10^6 bins costs no more than a few levels.
//!
//! `ops/tests/simulate.rs` checks that the two agree statistically on small n.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use cdnmap_select::{least_loaded, ServerIdx, MAX_D};
use clap::{Args, ValueEnum};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Binomial, Distribution, Poisson};

use super::{
    csv_string, default_threads, fit_line, held, out_dir, par_map, plot_svg, sub_seed, table,
    write_text, Legend, Panel, Series,
};

/// Most bins a run takes (the histogram engine's state does not grow with n, but the initial
/// `uniform:` load is drawn bin by bin).
pub const MAX_BINS: u64 = 10_000_000;
/// Most bins the per-ball engine takes (it keeps two arrays of n loads).
pub const MAX_BINS_PER_BALL: u64 = 1_000_000;
/// Most rounds a run takes.
pub const MAX_ROUNDS: u64 = 100_000_000;
/// Most balls a bin may start with.
pub const MAX_INITIAL_LOAD: u64 = 1_000_000_000;
/// Most points on a time-series plot / rows in the time-series CSV.
const MAX_SAMPLES: u64 = 2_000;
/// Levels with at most this many bins are drawn bin by bin, larger ones as binomials.
const BIN_BY_BIN: u64 = 48;
/// Batches of the measured rounds for the stationarity check.
const BATCHES: usize = 20;
/// The sweep of the issue: d × λ.
pub const SWEEP_D: [u32; 3] = [1, 2, 3];
pub const SWEEP_LAMBDA: [f64; 5] = [0.5, 0.75, 0.9, 0.99, 0.999];

#[derive(Args, Debug, Clone)]
pub struct BallsArgs {
    /// Bins (servers). With --sweep a comma-separated list (default 1000,10000); else one
    /// number (default 1000).
    #[arg(long, value_delimiter = ',')]
    pub bins: Vec<u64>,
    /// Arrival rate λ in (0, 1): Poisson(λ·n) balls per round (the sweep sets its own).
    #[arg(long, default_value_t = 0.99, conflicts_with = "sweep")]
    pub lambda: f64,
    /// Choices per ball (1 to 16; the sweep sets its own).
    #[arg(long, default_value_t = 2, conflicts_with = "sweep")]
    pub d: u32,
    /// Rounds to run (per point with --sweep).
    #[arg(long, default_value_t = 100_000)]
    pub rounds: u64,
    /// Rounds before the steady state is measured (default: a fifth of --rounds).
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Random seed: the same seed gives the same output, byte for byte.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The load at round 0: `empty`, `all:X` (every bin X), `spike:X` (one bin X, the rest
    /// empty) or `uniform:X` (each bin uniform in 0..=X).
    #[arg(long, default_value = "empty")]
    pub initial_load: String,
    /// `histogram` (exact in distribution, O(levels) per round) or `per-ball` (the oracle).
    #[arg(long, value_enum, default_value_t = EngineKind::Histogram)]
    pub engine: EngineKind,
    /// Run the table d ∈ {1,2,3} × λ ∈ {0.5, 0.75, 0.9, 0.99, 0.999} for each --bins, with
    /// fits of the max load against the published shapes.
    #[arg(long)]
    pub sweep: bool,
    /// Output directory (default simulate-out/balls).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Worker threads for independent runs (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Histogram,
    PerBall,
}

/// The load at round 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initial {
    Empty,
    /// Every bin at X.
    All(u64),
    /// One bin at X, the others empty.
    Spike(u64),
    /// Each bin uniform in 0..=X.
    Uniform(u64),
}

impl Initial {
    pub fn parse(s: &str) -> Result<Initial> {
        let bad = |why: &str| anyhow::anyhow!("--initial-load {s}: {why}");
        if s == "empty" {
            return Ok(Initial::Empty);
        }
        let (kind, x) = s
            .split_once(':')
            .ok_or_else(|| bad("expected empty, all:X, spike:X or uniform:X"))?;
        let x: u64 = x
            .parse()
            .map_err(|_| bad("X must be a non-negative integer"))?;
        if x > MAX_INITIAL_LOAD {
            return Err(bad(&format!("X must be at most {MAX_INITIAL_LOAD}")));
        }
        match kind {
            "all" => Ok(Initial::All(x)),
            "spike" => Ok(Initial::Spike(x)),
            "uniform" => Ok(Initial::Uniform(x)),
            _ => Err(bad("expected empty, all:X, spike:X or uniform:X")),
        }
    }

    /// The initial loads as (load, bins) pairs, ascending, counts > 0.
    fn levels(self, n: u64, rng: &mut ChaCha8Rng) -> Vec<(u64, u64)> {
        let mut m: BTreeMap<u64, u64> = BTreeMap::new();
        match self {
            Initial::Empty => {
                m.insert(0, n);
            }
            Initial::All(x) => {
                m.insert(x, n);
            }
            Initial::Spike(x) => {
                *m.entry(x).or_default() += 1;
                if n > 1 {
                    *m.entry(0).or_default() += n - 1;
                }
            }
            Initial::Uniform(x) => {
                for _ in 0..n {
                    *m.entry(rng.random_range(0..=x)).or_default() += 1;
                }
            }
        }
        m.into_iter().filter(|&(_, c)| c > 0).collect()
    }
}

/// One run's settings, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BallsParams {
    pub bins: u64,
    pub lambda: f64,
    pub d: u32,
    pub rounds: u64,
    pub warmup: u64,
    pub seed: u64,
    pub initial: Initial,
    pub engine: EngineKind,
}

impl BallsParams {
    /// Refuses settings out of range, naming the argument.
    pub fn validate(&self) -> Result<()> {
        if !(self.lambda > 0.0 && self.lambda < 1.0) {
            bail!("--lambda {}: must be in (0, 1)", self.lambda);
        }
        if !(1..=MAX_D as u32).contains(&self.d) {
            bail!("--d {}: must be between 1 and {MAX_D}", self.d);
        }
        let max_bins = match self.engine {
            EngineKind::Histogram => MAX_BINS,
            EngineKind::PerBall => MAX_BINS_PER_BALL,
        };
        if !(1..=max_bins).contains(&self.bins) {
            bail!(
                "--bins {}: must be between 1 and {max_bins} for the {:?} engine",
                self.bins,
                self.engine
            );
        }
        if !(1..=MAX_ROUNDS).contains(&self.rounds) {
            bail!(
                "--rounds {}: must be between 1 and {MAX_ROUNDS}",
                self.rounds
            );
        }
        if self.warmup >= self.rounds {
            bail!(
                "--warmup {}: must be below --rounds {}",
                self.warmup,
                self.rounds
            );
        }
        Ok(())
    }
}

/// One step of the process; both engines implement it.
pub trait Engine {
    /// One round: arrivals, then every non-empty bin finishes one ball.
    fn step(&mut self, rng: &mut ChaCha8Rng);
    /// The largest load.
    fn max_load(&self) -> u64;
    /// Balls in the system.
    fn total(&self) -> u64;
    /// `out[l]` = bins with load ≥ l + 1.
    fn at_least(&self, out: &mut [u64]);
}

/// The oracle: every ball draws its d bins and joins the least loaded by the round's start loads.
pub struct PerBall {
    lambda_n: f64,
    d: usize,
    load: Vec<u64>,
    start: Vec<u64>,
    arrivals: Option<Poisson<f64>>,
}

impl PerBall {
    pub fn new(p: &BallsParams, rng: &mut ChaCha8Rng) -> Result<PerBall> {
        p.validate()?;
        let mut load = Vec::with_capacity(p.bins as usize);
        for (level, count) in p.initial.levels(p.bins, rng) {
            load.extend(std::iter::repeat_n(level, count as usize));
        }
        let lambda_n = p.lambda * p.bins as f64;
        Ok(PerBall {
            lambda_n,
            d: p.d as usize,
            start: load.clone(),
            load,
            arrivals: Poisson::new(lambda_n).ok(),
        })
    }
}

impl Engine for PerBall {
    fn step(&mut self, rng: &mut ChaCha8Rng) {
        self.start.copy_from_slice(&self.load);
        let arrivals = self.arrivals.as_ref().map_or(0, |a| a.sample(rng) as u64);
        debug_assert!(self.lambda_n > 0.0);
        let n = self.load.len() as u32;
        let mut cand = [0 as ServerIdx; MAX_D];
        for _ in 0..arrivals {
            for c in &mut cand[..self.d] {
                *c = rng.random_range(0..n);
            }
            if let Some(b) = least_loaded(&cand[..self.d], &self.start) {
                self.load[b as usize] += 1;
            }
        }
        for l in &mut self.load {
            *l = l.saturating_sub(1);
        }
    }

    fn max_load(&self) -> u64 {
        self.load.iter().copied().max().unwrap_or(0)
    }

    fn total(&self) -> u64 {
        self.load.iter().sum()
    }

    fn at_least(&self, out: &mut [u64]) {
        out.fill(0);
        let len = out.len() as u64;
        for &l in &self.load {
            for o in out.iter_mut().take(l.min(len) as usize) {
                *o += 1;
            }
        }
    }
}

/// Exact in distribution over the load histogram (module docs).
pub struct Histogram {
    n: u64,
    lambda: f64,
    d: i32,
    /// (load, bins), ascending by load, bins > 0.
    levels: Vec<(u64, u64)>,
    next: Vec<(u64, u64)>,
    /// `ge[i]`: bins at load ≥ `levels[i].0`.
    ge: Vec<u64>,
    /// Poisson pmf and tails for the current μ, and bin-by-bin thresholds.
    mu: f64,
    pmf: Vec<f64>,
    tail: Vec<f64>,
    thr: Vec<u64>,
    /// Bins of the current level receiving j balls.
    occ: Vec<u64>,
}

/// Poisson terms beyond this many are never needed (μ ≤ d·λ < 16).
const MAX_TERMS: usize = 256;

impl Histogram {
    pub fn new(p: &BallsParams, rng: &mut ChaCha8Rng) -> Result<Histogram> {
        p.validate()?;
        Ok(Histogram {
            n: p.bins,
            lambda: p.lambda,
            d: p.d as i32,
            levels: p.initial.levels(p.bins, rng),
            next: Vec::new(),
            ge: Vec::new(),
            mu: f64::NAN,
            pmf: Vec::new(),
            tail: Vec::new(),
            thr: Vec::new(),
            occ: Vec::new(),
        })
    }

    /// The pmf, tails and thresholds of Poisson(μ), cut at the first term past the mean below
    /// 1e-30 (at most `MAX_TERMS` terms).
    fn table(&mut self, mu: f64) {
        if mu == self.mu {
            return;
        }
        self.mu = mu;
        self.pmf.clear();
        let mut q = (-mu).exp();
        let mut j = 0usize;
        loop {
            self.pmf.push(q);
            j += 1;
            q *= mu / j as f64;
            if (j as f64 > mu && q < 1e-30) || j >= MAX_TERMS {
                break;
            }
        }
        let terms = self.pmf.len();
        self.tail.clear();
        self.tail.resize(terms + 1, 0.0);
        for j in (0..terms).rev() {
            self.tail[j] = self.tail[j + 1] + self.pmf[j];
        }
        // P(X > j) = tail[j + 1] / tail[0]; bin by bin, X > j when a uniform u64 is at or
        // above u64::MAX − P(X > j)·2^64.
        let total = self.tail[0];
        self.thr.clear();
        for j in 0..terms {
            let above = (self.tail[j + 1] / total * 18_446_744_073_709_551_616.0) as u64;
            self.thr.push(u64::MAX - above);
        }
    }

    /// `occ[j]` = how many of `bins` bins receive j balls, each an independent Poisson(μ);
    /// `occ` is cut after its last non-zero entry.
    fn occupancy(&mut self, bins: u64, mu: f64, rng: &mut ChaCha8Rng) {
        self.occ.clear();
        if mu <= 0.0 {
            self.occ.push(bins);
            return;
        }
        self.table(mu);
        let terms = self.pmf.len();
        if bins <= BIN_BY_BIN {
            // Inversion: X > j while the draw is at or above thr[j]. Counts land in a stack
            // array; the rare X ≥ 32 (μ ≤ d·λ < 16) goes to `occ` directly.
            let thr = &self.thr[..terms - 1];
            let mut local = [0u64; 32];
            let mut top = 0;
            for _ in 0..bins {
                let v = rng.next_u64();
                // Thresholds ascend, so X is the number at or below v: branch-free over the
                // first eight (X ≥ 8 is rare), then a loop.
                let head = &thr[..thr.len().min(8)];
                let mut j = head.iter().map(|&t| usize::from(v >= t)).sum::<usize>();
                if j == 8 {
                    j += thr[8..].iter().take_while(|&&t| v >= t).count();
                }
                if j < local.len() {
                    local[j] += 1;
                } else {
                    if j >= self.occ.len() {
                        self.occ.resize(j + 1, 0);
                    }
                    self.occ[j] += 1;
                }
                top = top.max(j);
            }
            if top >= self.occ.len() {
                self.occ.resize(top + 1, 0);
            }
            for (o, &c) in self.occ.iter_mut().zip(&local) {
                *o += c;
            }
        } else {
            // A multinomial as a chain of binomials: of the bins not yet given a count, each
            // gets exactly j with probability pmf[j] / tail[j].
            let mut rest = bins;
            for j in 0..terms {
                if rest == 0 {
                    break;
                }
                let q = if j + 1 == terms {
                    1.0
                } else {
                    (self.pmf[j] / self.tail[j]).clamp(0.0, 1.0)
                };
                let k = if q >= 1.0 {
                    rest
                } else {
                    match Binomial::new(rest, q) {
                        Ok(b) => b.sample(rng),
                        Err(_) => {
                            debug_assert!(false, "binomial({rest}, {q})");
                            0
                        }
                    }
                };
                self.occ.push(k);
                rest -= k;
            }
        }
    }

    /// The histogram: (load, bins), ascending.
    pub fn levels(&self) -> &[(u64, u64)] {
        &self.levels
    }
}

/// Adds `bins` at `level` to an ascending (level, bins) list whose tail may lie above `level`.
fn insert_level(v: &mut Vec<(u64, u64)>, level: u64, bins: u64) {
    let mut i = v.len();
    while i > 0 && v[i - 1].0 > level {
        i -= 1;
    }
    if i > 0 && v[i - 1].0 == level {
        v[i - 1].1 += bins;
    } else {
        v.insert(i, (level, bins));
    }
}

impl Engine for Histogram {
    fn step(&mut self, rng: &mut ChaCha8Rng) {
        let len = self.levels.len();
        self.ge.clear();
        self.ge.resize(len + 1, 0);
        for i in (0..len).rev() {
            self.ge[i] = self.ge[i + 1] + self.levels[i].1;
        }
        let n = self.n as f64;
        let mut next = std::mem::take(&mut self.next);
        next.clear();
        for i in 0..len {
            let (load, bins) = self.levels[i];
            let mu = if self.d == 1 {
                // p_L = c_L / n exactly: every bin gets Poisson(λ).
                self.lambda
            } else {
                let hi = (self.ge[i] as f64 / n).powi(self.d);
                let lo = (self.ge[i + 1] as f64 / n).powi(self.d);
                (self.lambda * n * (hi - lo) / bins as f64).max(0.0)
            };
            self.occupancy(bins, mu, rng);
            for (j, &k) in self.occ.iter().enumerate() {
                if k > 0 {
                    let after = load + j as u64;
                    insert_level(&mut next, after.saturating_sub(1), k);
                }
            }
        }
        debug_assert_eq!(next.iter().map(|l| l.1).sum::<u64>(), self.n);
        debug_assert!(next.windows(2).all(|w| w[0].0 < w[1].0));
        self.next = std::mem::replace(&mut self.levels, next);
    }

    fn max_load(&self) -> u64 {
        self.levels.last().map_or(0, |l| l.0)
    }

    fn total(&self) -> u64 {
        self.levels.iter().map(|&(l, c)| l * c).sum()
    }

    fn at_least(&self, out: &mut [u64]) {
        // n minus the bins below each level; only the first few levels are read.
        let mut below = 0;
        let mut it = self.levels.iter().peekable();
        for (l, o) in out.iter_mut().enumerate() {
            while let Some(&&(load, c)) = it.peek() {
                if load > l as u64 {
                    break;
                }
                below += c;
                it.next();
            }
            *o = self.n - below;
        }
    }
}

/// One sample of the time series.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub round: u64,
    /// Max load at the end of this round.
    pub max_load: u64,
    /// Largest end-of-round max load since the previous sample.
    pub window_max: u64,
    /// Balls per bin.
    pub mean_load: f64,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    pub params: BallsParams,
    pub samples: Vec<Sample>,
    /// End-of-round max load → rounds, over the rounds after the warm-up.
    pub max_dist: BTreeMap<u64, u64>,
    /// Mean of the max load over each of 20 equal batches of the measured rounds.
    pub batch_means: Vec<f64>,
    /// Mean over the measured rounds of the share of bins at load ≥ L, L = 1..=8.
    pub tail_shares: [f64; 8],
    /// First round whose max load was at most the recovery target, if one was given.
    pub recovered_at: Option<u64>,
    /// The largest max load after that round.
    pub max_after_recovery: Option<u64>,
}

impl RunStats {
    pub fn measured_rounds(&self) -> u64 {
        self.max_dist.values().sum()
    }

    pub fn mean_max(&self) -> f64 {
        let n = self.measured_rounds().max(1) as f64;
        self.max_dist
            .iter()
            .map(|(&m, &c)| m as f64 * c as f64)
            .sum::<f64>()
            / n
    }

    /// The q-quantile of the measured max load (q in [0, 1]).
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.measured_rounds();
        let want = ((q * total as f64).ceil() as u64).clamp(1, total.max(1));
        let mut seen = 0;
        for (&m, &c) in &self.max_dist {
            seen += c;
            if seen >= want {
                return m;
            }
        }
        0
    }

    pub fn max_seen(&self) -> u64 {
        self.max_dist.keys().next_back().copied().unwrap_or(0)
    }

    /// Stationary enough to be measured, judged on the 20 batch means of the measured rounds:
    /// a run still climbing (or falling) towards its steady state shows a monotone trend
    /// (Kendall's τ over the batch means beyond ±0.5, about 3 standard deviations for
    /// independent batches) that moves the mean by more than 2% from the first five batches
    /// to the last five. d = 1 near λ = 1, whose relaxation time grows like 1/(1−λ)², fails
    /// this within 100,000 rounds.
    pub fn stationary(&self) -> bool {
        let m = &self.batch_means;
        if m.len() < 10 {
            return true;
        }
        let mut s = 0i64;
        for i in 0..m.len() {
            for j in i + 1..m.len() {
                s += match m[j].partial_cmp(&m[i]) {
                    Some(std::cmp::Ordering::Greater) => 1,
                    Some(std::cmp::Ordering::Less) => -1,
                    _ => 0,
                };
            }
        }
        let pairs = (m.len() * (m.len() - 1) / 2) as f64;
        let tau = s as f64 / pairs;
        let first = m[..5].iter().sum::<f64>() / 5.0;
        let last = m[m.len() - 5..].iter().sum::<f64>() / 5.0;
        let drift = (last - first).abs() / first.max(1.0);
        !(tau.abs() > 0.5 && drift > 0.02)
    }

    /// Kendall's τ and the relative drift behind [`RunStats::stationary`], for reports.
    pub fn trend(&self) -> String {
        let m = &self.batch_means;
        if m.len() < 10 {
            return "too few rounds to judge".to_string();
        }
        let first = m[..5].iter().sum::<f64>() / 5.0;
        let last = m[m.len() - 5..].iter().sum::<f64>() / 5.0;
        format!("mean max {first:.2} in the first quarter of the measured rounds, {last:.2} in the last")
    }
}

/// Runs one process; `tick(rounds)` is called now and then with rounds done since the last call.
pub fn simulate(p: &BallsParams, recover_to: Option<u64>, tick: &dyn Fn(u64)) -> Result<RunStats> {
    p.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    match p.engine {
        EngineKind::Histogram => {
            let mut e = Histogram::new(p, &mut rng)?;
            Ok(drive(&mut e, p, recover_to, &mut rng, tick))
        }
        EngineKind::PerBall => {
            let mut e = PerBall::new(p, &mut rng)?;
            Ok(drive(&mut e, p, recover_to, &mut rng, tick))
        }
    }
}

fn drive(
    e: &mut dyn Engine,
    p: &BallsParams,
    recover_to: Option<u64>,
    rng: &mut ChaCha8Rng,
    tick: &dyn Fn(u64),
) -> RunStats {
    let stride = p.rounds.div_ceil(MAX_SAMPLES).max(1);
    let measured = p.rounds - p.warmup;
    let mut samples = Vec::new();
    let mut max_dist = BTreeMap::new();
    let batches = BATCHES.min(measured as usize);
    let mut batch_sum = vec![0.0f64; batches];
    let mut batch_len = vec![0u64; batches];
    let mut tail_sum = [0.0f64; 8];
    let mut tail_now = [0u64; 8];
    let mut recovered_at = None;
    let mut max_after_recovery = None;
    let mut window_max = 0;
    let mut since_tick = 0;
    let n = p.bins as f64;
    if let Some(t) = recover_to {
        if e.max_load() <= t {
            recovered_at = Some(0);
        }
    }
    for round in 1..=p.rounds {
        e.step(rng);
        let m = e.max_load();
        window_max = window_max.max(m);
        if recovered_at.is_some() {
            max_after_recovery = Some(max_after_recovery.map_or(m, |x: u64| x.max(m)));
        } else if recover_to.is_some_and(|t| m <= t) {
            recovered_at = Some(round);
        }
        if round > p.warmup {
            *max_dist.entry(m).or_insert(0u64) += 1;
            let b = (((round - p.warmup - 1) * batches as u64) / measured) as usize;
            batch_sum[b] += m as f64;
            batch_len[b] += 1;
            e.at_least(&mut tail_now);
            for (s, &c) in tail_sum.iter_mut().zip(&tail_now) {
                *s += c as f64 / n;
            }
        }
        if round % stride == 0 || round == p.rounds {
            samples.push(Sample {
                round,
                max_load: m,
                window_max,
                mean_load: e.total() as f64 / n,
            });
            window_max = 0;
        }
        since_tick += 1;
        if since_tick == 4096 {
            tick(since_tick);
            since_tick = 0;
        }
    }
    tick(since_tick);
    let batch_means = batch_sum
        .iter()
        .zip(&batch_len)
        .map(|(s, &n)| s / n.max(1) as f64)
        .collect();
    let tail_shares = tail_sum.map(|s| s / measured as f64);
    RunStats {
        params: *p,
        samples,
        max_dist,
        batch_means,
        tail_shares,
        recovered_at,
        max_after_recovery,
    }
}

fn params(a: &BallsArgs, bins: u64) -> Result<BallsParams> {
    let p = BallsParams {
        bins,
        lambda: a.lambda,
        d: a.d,
        rounds: a.rounds,
        warmup: a.warmup.unwrap_or(a.rounds / 5),
        seed: a.seed,
        initial: Initial::parse(&a.initial_load)?,
        engine: a.engine,
    };
    p.validate()?;
    Ok(p)
}

pub fn run(a: &BallsArgs) -> Result<()> {
    let threads = a.threads.unwrap_or_else(default_threads);
    if threads == 0 || threads > 256 {
        bail!("--threads {threads}: must be between 1 and 256");
    }
    // Refuse bad arguments before anything is created on disk.
    if a.sweep {
        for &n in &a.bins {
            params(a, n)?;
        }
        params(a, 1000)?;
    } else {
        single_params(a)?;
    }
    let dir = out_dir(&a.out, "balls")?;
    let t = Instant::now();
    let report = if a.sweep {
        sweep(a, &dir, threads)?
    } else {
        single(a, &dir)?
    };
    print!("{report}");
    write_text(&dir, "balls.md", &report)?;
    eprintln!(
        "wrote {}/balls.csv, balls.svg, balls.md in {:.1} s",
        dir.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The predicted shapes: d = 1 grows like ln n / (1−λ), d ≥ 2 like ln(n / (1−λ)).
pub fn shape_d1(n: u64, lambda: f64) -> f64 {
    (n as f64).ln() / (1.0 - lambda)
}
pub fn shape_d2(n: u64, lambda: f64) -> f64 {
    (n as f64 / (1.0 - lambda)).ln()
}

fn single(a: &BallsArgs, dir: &std::path::Path) -> Result<String> {
    let bins = match a.bins.as_slice() {
        [] => 1000,
        [n] => *n,
        _ => bail!("--bins: give one number without --sweep"),
    };
    let p = params(a, bins)?;
    let (main, reference) = single_runs(&p)?;
    let out = single_report(a, &p, &main, reference.as_ref());
    single_files(a, dir, &p, &main, reference.as_ref())?;
    Ok(out)
}

/// The run of `p`, and from a bad start the reference run from empty (another seed) that
/// fixes the steady-state band the run must recover to.
fn single_runs(p: &BallsParams) -> Result<(RunStats, Option<RunStats>)> {
    let p = *p;
    let bar = crate::io::progress(0, "balls");
    // From a bad start, a reference run from empty (another seed) fixes the steady-state band.
    let reference = BallsParams {
        initial: Initial::Empty,
        seed: sub_seed(p.seed, 1),
        ..p
    };
    let bad_start = p.initial != Initial::Empty;
    bar.set_length(p.rounds * if bad_start { 2 } else { 1 });
    let tick = |k: u64| bar.inc(k);
    let (main, reference) = if bad_start {
        let band = simulate(&reference, None, &tick)?;
        let target = band.quantile(0.99);
        let main = simulate(&p, Some(target), &tick)?;
        (main, Some(band))
    } else {
        (simulate(&p, None, &tick)?, None)
    };
    bar.finish_and_clear();
    Ok((main, reference))
}

/// The report of a single run: the steady state, the max-load distribution, the tail, and
/// from a bad start the recovery.
fn single_report(
    a: &BallsArgs,
    p: &BallsParams,
    main: &RunStats,
    reference: Option<&RunStats>,
) -> String {
    let bad_start = p.initial != Initial::Empty;
    let steady = reference.unwrap_or(main);
    let total = steady.measured_rounds().max(1) as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# balls-into-bins in batches: n = {}, λ = {}, d = {}, {} rounds (warm-up {}), seed {}, engine {:?}, start {}\n",
        p.bins, p.lambda, p.d, p.rounds, p.warmup, p.seed, p.engine, a.initial_load
    );
    let _ = writeln!(
        out,
        "steady state (rounds {}..{} of a run from empty{}):",
        p.warmup + 1,
        p.rounds,
        if bad_start {
            ", seed derived from --seed"
        } else {
            ""
        }
    );
    let rows = vec![vec![
        format!("{:.3}", steady.mean_max()),
        steady.quantile(0.01).to_string(),
        steady.quantile(0.5).to_string(),
        steady.quantile(0.99).to_string(),
        steady.max_seen().to_string(),
        if steady.stationary() { "yes" } else { "NO" }.to_string(),
        format!("{:.1}", shape_d1(p.bins, p.lambda)),
        format!("{:.2}", shape_d2(p.bins, p.lambda)),
    ]];
    out.push_str(&table(
        &[
            "mean max",
            "p1",
            "p50",
            "p99",
            "max",
            "stationary",
            "ln n/(1-λ)",
            "ln(n/(1-λ))",
        ],
        &rows,
    ));
    let _ = writeln!(
        out,
        "\nmax-load distribution (end of round, measured rounds):"
    );
    let dist_rows: Vec<Vec<String>> = steady
        .max_dist
        .iter()
        .map(|(&m, &c)| {
            vec![
                m.to_string(),
                c.to_string(),
                format!("{:.4}", c as f64 / total),
            ]
        })
        .collect();
    if dist_rows.len() <= 40 {
        out.push_str(&table(&["max load", "rounds", "share"], &dist_rows));
    } else {
        let _ = writeln!(out, "({} values; see balls-maxdist.csv)", dist_rows.len());
    }
    let _ = writeln!(
        out,
        "\nmean share of bins with load ≥ L, L = 1..8: {}",
        steady
            .tail_shares
            .iter()
            .map(|s| format!("{s:.5}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if bad_start {
        recovery_report(&mut out, a, p, main, steady);
    }
    if !steady.stationary() {
        let _ = writeln!(
            out,
            "\nnote: the steady-state run had not settled ({}): give more --rounds.",
            steady.trend()
        );
    }

    out
}

/// From a bad start: the target, when (whether) the run recovered, and after.
fn recovery_report(
    out: &mut String,
    a: &BallsArgs,
    p: &BallsParams,
    main: &RunStats,
    steady: &RunStats,
) {
    let target = steady.quantile(0.99);
    let _ = writeln!(
        out,
        "\nrecovery from `{}` (initial max load {}): target = the steady state's p99 max load, {target}",
        a.initial_load,
        match p.initial {
            Initial::Empty => 0,
            Initial::All(x) | Initial::Spike(x) | Initial::Uniform(x) => x,
        }
    );
    match main.recovered_at {
        Some(r) => {
            let _ = writeln!(out, "recovered after {r} rounds");
        }
        None => {
            let _ = writeln!(out, "not recovered within {} rounds", p.rounds);
        }
    }
    let _ = writeln!(
        out,
        "claim (self-stabilizing: from any start the max load returns to the steady-state band): {} in this run",
        held(main.recovered_at.is_some())
    );
    if let Some(m) = main.max_after_recovery {
        let _ = writeln!(
            out,
            "largest max load after recovery: {m} (steady-state max seen {})",
            steady.max_seen()
        );
    }
}

/// balls.csv (every run's time series), balls-maxdist.csv and balls.svg.
fn single_files(
    a: &BallsArgs,
    dir: &std::path::Path,
    p: &BallsParams,
    main: &RunStats,
    reference: Option<&RunStats>,
) -> Result<()> {
    let steady = reference.unwrap_or(main);
    let total = steady.measured_rounds().max(1) as f64;
    // CSV: the time series of every run; the distribution beside it.
    let mut rows = Vec::new();
    for (name, r) in [("main", Some(&main)), ("reference", reference.as_ref())] {
        let Some(r) = r else { continue };
        for s in &r.samples {
            rows.push(vec![
                name.to_string(),
                s.round.to_string(),
                s.max_load.to_string(),
                s.window_max.to_string(),
                format!("{:.4}", s.mean_load),
            ]);
        }
    }
    write_text(
        dir,
        "balls.csv",
        &csv_string(
            &["run", "round", "max_load", "window_max", "mean_load"],
            &rows,
        )?,
    )?;
    let dist: Vec<Vec<String>> = steady
        .max_dist
        .iter()
        .map(|(&m, &c)| vec![m.to_string(), c.to_string()])
        .collect();
    write_text(
        dir,
        "balls-maxdist.csv",
        &csv_string(&["max_load", "rounds"], &dist)?,
    )?;
    let mut series = vec![Series {
        name: format!("start {}", a.initial_load),
        points: main
            .samples
            .iter()
            .map(|s| (s.round as f64, s.window_max as f64))
            .collect(),
    }];
    if let Some(r) = &reference {
        series.push(Series {
            name: "start empty".to_string(),
            points: r
                .samples
                .iter()
                .map(|s| (s.round as f64, s.window_max as f64))
                .collect(),
        });
    }
    plot_svg(
        dir,
        "balls.svg",
        &[
            Panel {
                title: format!(
                    "max load over time (n = {}, λ = {}, d = {})",
                    p.bins, p.lambda, p.d
                ),
                x_desc: "round",
                y_desc: "max load",
                series,
                legend: Legend::UpperRight,
                first_color: 0,
            },
            Panel {
                title: "steady-state max load distribution".to_string(),
                x_desc: "max load",
                y_desc: "share of rounds",
                series: vec![Series {
                    name: "share".to_string(),
                    points: steady
                        .max_dist
                        .iter()
                        .map(|(&m, &c)| (m as f64, c as f64 / total))
                        .collect(),
                }],
                legend: Legend::UpperRight,
                first_color: 0,
            },
        ],
    )?;
    Ok(())
}

/// One point of the sweep.
#[derive(Debug, Clone, Copy)]
struct Point {
    bins: u64,
    d: u32,
    lambda_idx: usize,
}

fn sweep(a: &BallsArgs, dir: &std::path::Path, threads: usize) -> Result<String> {
    let bins = sweep_sizes(a)?;
    let points = sweep_points(&bins);
    let base = params(a, bins[0])?;
    for &n in &bins {
        BallsParams { bins: n, ..base }.validate()?;
    }
    let by_point = sweep_runs(&base, &points, threads)?;
    let mut out = sweep_table(dir, &base, &by_point)?;
    out.push_str(&verdicts(&bins, &by_point));
    sweep_plot(dir, &bins, &by_point)?;
    Ok(out)
}

/// The sweep's numbers of bins (`--bins`, by default 1,000 and 10,000): at most 8, and a
/// sweep starts from empty.
fn sweep_sizes(a: &BallsArgs) -> Result<Vec<u64>> {
    let bins: Vec<u64> = if a.bins.is_empty() {
        vec![1000, 10_000]
    } else {
        a.bins.clone()
    };
    if bins.len() > 8 {
        bail!("--bins: at most 8 sizes in a sweep, got {}", bins.len());
    }
    if a.initial_load != "empty" {
        bail!(
            "--initial-load {}: the sweep starts from empty (run a single point to study recovery)",
            a.initial_load
        );
    }
    Ok(bins)
}

/// Every point of the sweep: each n, d and λ.
fn sweep_points(bins: &[u64]) -> Vec<Point> {
    let mut points = Vec::new();
    for &n in bins {
        for &d in &SWEEP_D {
            for l in 0..SWEEP_LAMBDA.len() {
                points.push(Point {
                    bins: n,
                    d,
                    lambda_idx: l,
                });
            }
        }
    }
    points
}

/// Runs every point (on `threads` threads), in point order.
fn sweep_runs(
    base: &BallsParams,
    points: &[Point],
    threads: usize,
) -> Result<Vec<(Point, RunStats)>> {
    let base = *base;
    // The costliest first (d = 1, λ near 1, large n), so two threads finish together.
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&i| {
        let p = points[i];
        (
            p.d != 1,
            std::cmp::Reverse(p.lambda_idx),
            std::cmp::Reverse(p.bins),
        )
    });
    let bar = crate::io::progress(base.rounds * points.len() as u64, "balls sweep");
    let jobs: Vec<Point> = order.iter().map(|&i| points[i]).collect();
    let results = par_map(&jobs, threads, |pt| {
        let p = BallsParams {
            bins: pt.bins,
            d: pt.d,
            lambda: SWEEP_LAMBDA[pt.lambda_idx],
            seed: sub_seed(
                base.seed,
                pt.bins ^ (u64::from(pt.d) << 40) ^ ((pt.lambda_idx as u64) << 48),
            ),
            ..base
        };
        simulate(&p, None, &|k| bar.inc(k))
    })?;
    bar.finish_and_clear();
    let mut by_point: Vec<(Point, RunStats)> = jobs.into_iter().zip(results).collect();
    by_point.sort_by_key(|(p, _)| (p.bins, p.d, p.lambda_idx));
    Ok(by_point)
}

/// The sweep's table (returned, under its heading) and balls.csv.
fn sweep_table(
    dir: &std::path::Path,
    base: &BallsParams,
    by_point: &[(Point, RunStats)],
) -> Result<String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# balls-into-bins in batches: sweep d × λ, {} rounds per point (warm-up {}), seed {}, engine {:?}\n",
        base.rounds, base.warmup, base.seed, base.engine
    );
    let header = [
        "n",
        "d",
        "λ",
        "mean max",
        "p99",
        "max",
        "stationary",
        "ln n/(1-λ)",
        "ln(n/(1-λ))",
    ];
    let mut rows = Vec::new();
    let mut csv_rows = Vec::new();
    for (pt, r) in by_point {
        let l = SWEEP_LAMBDA[pt.lambda_idx];
        rows.push(vec![
            pt.bins.to_string(),
            pt.d.to_string(),
            l.to_string(),
            format!("{:.3}", r.mean_max()),
            r.quantile(0.99).to_string(),
            r.max_seen().to_string(),
            if r.stationary() { "yes" } else { "NO" }.to_string(),
            format!("{:.1}", shape_d1(pt.bins, l)),
            format!("{:.2}", shape_d2(pt.bins, l)),
        ]);
        csv_rows.push(vec![
            pt.bins.to_string(),
            pt.d.to_string(),
            l.to_string(),
            r.params.rounds.to_string(),
            r.params.warmup.to_string(),
            r.params.seed.to_string(),
            format!("{:.4}", r.mean_max()),
            r.quantile(0.5).to_string(),
            r.quantile(0.99).to_string(),
            r.max_seen().to_string(),
            r.stationary().to_string(),
            format!("{:.4}", shape_d1(pt.bins, l)),
            format!("{:.4}", shape_d2(pt.bins, l)),
        ]);
    }
    out.push_str(&table(&header, &rows));
    write_text(
        dir,
        "balls.csv",
        &csv_string(
            &[
                "n",
                "d",
                "lambda",
                "rounds",
                "warmup",
                "seed",
                "mean_max",
                "p50_max",
                "p99_max",
                "max_seen",
                "stationary",
                "ln_n_over_1_minus_lambda",
                "ln_of_n_over_1_minus_lambda",
            ],
            &csv_rows,
        )?,
    )?;

    Ok(out)
}

/// balls.svg: per n, the mean max load over ln(1/(1-λ)) for every d, and for d ≥ 2 alone.
fn sweep_plot(dir: &std::path::Path, bins: &[u64], by_point: &[(Point, RunStats)]) -> Result<()> {
    // Per n: every d, and d ≥ 2 alone (d = 1's scale flattens it).
    let mut panels = Vec::new();
    for &n in bins {
        for (title, first) in [("", 0), (" (d ≥ 2)", 1)] {
            let ds = &SWEEP_D[first..];
            panels.push(Panel {
                title: format!("mean max load, n = {n}{title}"),
                x_desc: "ln(1/(1-λ))",
                y_desc: "mean max load",
                series: ds
                    .iter()
                    .map(|&d| Series {
                        name: format!("d = {d}"),
                        points: by_point
                            .iter()
                            .filter(|(p, _)| p.bins == n && p.d == d)
                            .map(|(p, r)| {
                                let l = SWEEP_LAMBDA[p.lambda_idx];
                                ((1.0 / (1.0 - l)).ln(), r.mean_max())
                            })
                            .collect(),
                    })
                    .collect(),
                legend: Legend::UpperLeft,
                first_color: first,
            });
        }
    }
    plot_svg(dir, "balls.svg", &panels)?;
    Ok(())
}

/// The verdicts, computed from the run. How "matches" is judged (docs/simulate.md): over the
/// stationary points of one n and d, fit mean max load = a + b·x by least squares for both
/// shapes x = ln n/(1−λ) and x = ln(n/(1−λ)); the expected shape matches when its slope is
/// positive, its R² ≥ 0.95, and it fits at least as well as the other shape.
fn verdicts(bins: &[u64], by_point: &[(Point, RunStats)]) -> String {
    let mut out = String::from("\nclaims, judged from this run:\n");
    for &n in bins {
        for (d, expected) in [(1u32, 1usize), (2, 2)] {
            let pts: Vec<(f64, f64, f64)> = by_point
                .iter()
                .filter(|(p, r)| p.bins == n && p.d == d && r.stationary())
                .map(|(p, r)| {
                    let l = SWEEP_LAMBDA[p.lambda_idx];
                    (shape_d1(n, l), shape_d2(n, l), r.mean_max())
                })
                .collect();
            let skipped = SWEEP_LAMBDA.len() - pts.len();
            let f1 = fit_line(&pts.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>());
            let f2 = fit_line(&pts.iter().map(|p| (p.1, p.2)).collect::<Vec<_>>());
            let r2 = |f: Option<(f64, f64, f64)>| f.map_or(f64::NAN, |f| f.2);
            let (name, mine, other) = if expected == 1 {
                ("ln n/(1-λ)", f1, f2)
            } else {
                ("ln(n/(1-λ))", f2, f1)
            };
            let ok = match (mine, other) {
                (Some((_, b, r)), Some((_, _, ro))) => b > 0.0 && r >= 0.95 && r >= ro,
                _ => false,
            };
            let _ = writeln!(
                out,
                "- n = {n}, d = {d}: max load grows like {name}: {} (R² {:.4} for ln n/(1-λ), {:.4} for ln(n/(1-λ)); slope {:.4}; {} stationary points{})",
                held(ok),
                r2(f1),
                r2(f2),
                mine.map_or(f64::NAN, |f| f.1),
                pts.len(),
                if skipped > 0 {
                    format!(", {skipped} not yet stationary left out")
                } else {
                    String::new()
                }
            );
        }
        for (l_idx, &l) in SWEEP_LAMBDA.iter().enumerate() {
            if l < 0.99 {
                continue;
            }
            let get = |d: u32| {
                by_point
                    .iter()
                    .find(|(p, _)| p.bins == n && p.d == d && p.lambda_idx == l_idx)
                    .map(|(_, r)| r.mean_max())
            };
            if let (Some(m1), Some(m2)) = (get(1), get(2)) {
                let _ = writeln!(
                    out,
                    "- n = {n}, λ = {l}: d = 2's max load ({m2:.2}) well below d = 1's ({m1:.2}), i.e. at most half: {}",
                    held(m2 <= 0.5 * m1)
                );
            }
        }
    }
    out
}

/// Parses and validates the arguments of a single run (for tests and the CLI).
pub fn single_params(a: &BallsArgs) -> Result<BallsParams> {
    let bins = match a.bins.as_slice() {
        [] => 1000,
        [n] => *n,
        _ => bail!("--bins: give one number without --sweep"),
    };
    params(a, bins)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(d: u32) -> Histogram {
        let p = BallsParams {
            bins: 1000,
            lambda: 0.9,
            d,
            rounds: 1,
            warmup: 0,
            seed: 1,
            initial: Initial::Empty,
            engine: EngineKind::Histogram,
        };
        Histogram::new(&p, &mut ChaCha8Rng::seed_from_u64(0)).expect("engine")
    }

    /// Both ways of drawing a level's occupancy — bin by bin, and a chain of binomials — give
    /// Poisson(μ) counts: compare the share of bins getting j balls with the pmf.
    #[test]
    fn occupancy_draws_poisson_counts_both_ways() {
        let mut h = engine(2);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for mu in [0.05, 0.9, 2.7] {
            for (bins, reps) in [(BIN_BY_BIN, 20_000u64), (100_000, 10)] {
                let mut count = vec![0u64; 40];
                for _ in 0..reps {
                    h.occupancy(bins, mu, &mut rng);
                    assert_eq!(h.occ.iter().sum::<u64>(), bins);
                    for (j, &k) in h.occ.iter().enumerate() {
                        count[j] += k;
                    }
                }
                let total = (bins * reps) as f64;
                let mut pmf = (-mu).exp();
                for (j, &c) in count.iter().enumerate().take(8) {
                    let share = c as f64 / total;
                    // Four standard errors of a share estimated from `total` draws.
                    let tol = 4.0 * (pmf * (1.0 - pmf) / total).sqrt() + 1e-9;
                    assert!(
                        (share - pmf).abs() <= tol,
                        "μ {mu}, {bins} bins: P(X = {j}) drawn {share:.6}, Poisson {pmf:.6}"
                    );
                    pmf *= mu / (j + 1) as f64;
                }
            }
        }
    }

    #[test]
    fn a_round_conserves_bins_and_keeps_levels_sorted() {
        for d in [1, 2, 3] {
            let mut h = engine(d);
            let mut rng = ChaCha8Rng::seed_from_u64(d.into());
            for _ in 0..200 {
                h.step(&mut rng);
                assert_eq!(h.levels().iter().map(|l| l.1).sum::<u64>(), 1000);
                assert!(h.levels().windows(2).all(|w| w[0].0 < w[1].0));
                assert!(h.levels().iter().all(|l| l.1 > 0));
            }
        }
    }

    #[test]
    fn insert_level_merges_and_keeps_order() {
        let mut v = vec![(1, 2), (4, 1)];
        insert_level(&mut v, 3, 5);
        insert_level(&mut v, 4, 1);
        insert_level(&mut v, 0, 1);
        insert_level(&mut v, 9, 1);
        assert_eq!(v, vec![(0, 1), (1, 2), (3, 5), (4, 2), (9, 1)]);
    }
}
