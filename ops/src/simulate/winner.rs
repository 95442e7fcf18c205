//! `cdnmap simulate winner`: Go-With-The-Winner (Liu, Sitaraman, Towsley), the web case.
//!
//! The model (our reading of the paper; docs/simulate.md says where it is a choice):
//!
//! - `servers` servers, each with an LRU cache of `cache` objects.
//! - `users` users. Each user requests its own content set (a site) of `objects` objects, each
//!   request an object drawn from Zipf(α); with `--sites` below `users`, users share sites.
//!   A cache holds `cache / objects` sites whole, so a server can give every one of its users a
//!   100% hit rate exactly when it serves at most that many distinct sites.
//! - Time runs in steps; every user that has arrived sends one request per step. Users arrive
//!   at uniform random steps in the first `arrival` steps.
//! - On arrival a user picks k distinct servers at random and tries them in turn (request r goes
//!   to candidate r mod k) until each has served τ of its requests; it then stays for good with
//!   the one that had the fewest misses — the least "loaded" by misses, chosen with power-of-d's
//!   own rule [`cdnmap_select::least_loaded`] (ties: the earliest candidate).
//! - A user is *at 100%* when its last `judge` requests since choosing all hit.
//!
//! Reported per scenario, over `runs` seeds: the share of users at 100% over time, the runs in
//! which every user ended at 100% (the failure rate is the rest), the step at which that
//! happened, and the worst user's hit rate over its last `judge` requests.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use cdnmap_select::{least_loaded, ServerIdx};
use clap::Args;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    csv_string, default_threads, held, out_dir, par_map, plot_svg, sub_seed, table, write_text,
    Legend, Panel, Series,
};

pub const MAX_SERVERS: usize = 10_000;
pub const MAX_USERS: usize = 100_000;
pub const MAX_OBJECTS: usize = 10_000;
pub const MAX_STEPS: u64 = 1_000_000;
pub const MAX_RUNS: usize = 1_000;
pub const MAX_K: usize = 8;
/// The judge window is a 128-bit history.
pub const MAX_JUDGE: u32 = 128;
/// Most user-requests (users × steps × runs, summed over scenarios) one command may simulate.
pub const MAX_WORK: f64 = 2e10;
/// Points on a time series.
const SAMPLES: u64 = 200;

#[derive(Args, Debug, Clone)]
pub struct WinnerArgs {
    /// Servers.
    #[arg(long, default_value_t = 100)]
    pub servers: usize,
    /// Users.
    #[arg(long, default_value_t = 200)]
    pub users: usize,
    /// Content sets (sites); users are spread over them evenly (default: one per user).
    #[arg(long)]
    pub sites: Option<usize>,
    /// Objects per site.
    #[arg(long, default_value_t = 20)]
    pub objects: usize,
    /// LRU cache size of a server, in objects (default: 5 sites' objects).
    #[arg(long)]
    pub cache: Option<usize>,
    /// Zipf exponent α of object popularity within a site.
    #[arg(long, default_value_t = 1.0)]
    pub alpha: f64,
    /// History window τ: requests each candidate serves before the user chooses.
    #[arg(long, default_value_t = 200)]
    pub tau: u32,
    /// The choice counts compared, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub k: Vec<usize>,
    /// Partial adoption: this share of users use k = 2, the rest k = 1 (0: no such scenario).
    #[arg(long, default_value_t = 0.7)]
    pub adoption: f64,
    /// τ values for the effect of τ (k = 2), comma-separated (empty: skip).
    #[arg(long, value_delimiter = ',', default_value = "10,50,200,500")]
    pub taus: Vec<u32>,
    /// α values for the effect of α (k = 1 and k = 2), comma-separated (empty: skip).
    #[arg(long, value_delimiter = ',', default_value = "0.6,1.0,1.4")]
    pub alphas: Vec<f64>,
    /// Load multipliers (users × m) for k = 1's worst hit rate, comma-separated (empty: skip).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub loads: Vec<usize>,
    /// Steps simulated.
    #[arg(long, default_value_t = 6000)]
    pub steps: u64,
    /// Users arrive in the first this many steps (default: a third of --steps).
    #[arg(long)]
    pub arrival: Option<u64>,
    /// A user is at 100% when its last this many requests all hit (at most 128).
    #[arg(long, default_value_t = 100)]
    pub judge: u32,
    /// Independent runs per scenario.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output directory (default simulate-out/winner).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// One scenario's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WinnerParams {
    pub servers: usize,
    pub users: usize,
    pub sites: usize,
    pub objects: usize,
    pub cache: usize,
    pub alpha: f64,
    pub tau: u32,
    /// Users use `k`, except that with `adoption < 1` a user uses k with that probability
    /// and 1 otherwise.
    pub k: usize,
    pub adoption: f64,
    pub steps: u64,
    pub arrival: u64,
    pub judge: u32,
}

impl WinnerParams {
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_SERVERS).contains(&self.servers) {
            bail!(
                "--servers {}: must be between 1 and {MAX_SERVERS}",
                self.servers
            );
        }
        if !(1..=MAX_USERS).contains(&self.users) {
            bail!(
                "--users {}: must be between 1 and {MAX_USERS} (with the load multiplier)",
                self.users
            );
        }
        if !(1..=self.users).contains(&self.sites) {
            bail!(
                "--sites {}: must be between 1 and --users {}",
                self.sites,
                self.users
            );
        }
        if !(1..=MAX_OBJECTS).contains(&self.objects) {
            bail!(
                "--objects {}: must be between 1 and {MAX_OBJECTS}",
                self.objects
            );
        }
        if self.cache == 0 || self.cache > 100_000_000 {
            bail!("--cache {}: must be between 1 and 100000000", self.cache);
        }
        if (self.sites * self.objects).saturating_mul(self.servers) > 500_000_000 {
            bail!(
                "--sites × --objects × --servers = {}: at most 500000000 (the caches' index)",
                self.sites * self.objects * self.servers
            );
        }
        if !(self.alpha.is_finite() && (0.0..=5.0).contains(&self.alpha)) {
            bail!("--alpha {}: must be in [0, 5]", self.alpha);
        }
        if !(1..=100_000).contains(&self.tau) {
            bail!("--tau {}: must be between 1 and 100000", self.tau);
        }
        if !(1..=MAX_K).contains(&self.k) || self.k > self.servers {
            bail!(
                "--k {}: must be between 1 and min({MAX_K}, --servers)",
                self.k
            );
        }
        if !(self.adoption > 0.0 && self.adoption <= 1.0) {
            bail!("--adoption {}: must be in (0, 1]", self.adoption);
        }
        if !(1..=MAX_STEPS).contains(&self.steps) {
            bail!("--steps {}: must be between 1 and {MAX_STEPS}", self.steps);
        }
        if self.arrival == 0 || self.arrival > self.steps {
            bail!(
                "--arrival {}: must be between 1 and --steps {}",
                self.arrival,
                self.steps
            );
        }
        if !(1..=MAX_JUDGE).contains(&self.judge) {
            bail!("--judge {}: must be between 1 and {MAX_JUDGE}", self.judge);
        }
        Ok(())
    }
}

/// An LRU cache over object ids `0..objects`: a doubly linked list over slots, and an index
/// from object to slot.
struct Lru {
    capacity: u32,
    slot_of: Vec<u32>,
    object: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
}

const NONE: u32 = u32::MAX;

impl Lru {
    fn new(capacity: usize, objects: usize) -> Lru {
        Lru {
            capacity: capacity.min(objects).max(1) as u32,
            slot_of: vec![NONE; objects],
            object: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            head: NONE,
            tail: NONE,
        }
    }

    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p == NONE {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NONE {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_front(&mut self, s: u32) {
        self.prev[s as usize] = NONE;
        self.next[s as usize] = self.head;
        if self.head != NONE {
            self.prev[self.head as usize] = s;
        }
        self.head = s;
        if self.tail == NONE {
            self.tail = s;
        }
    }

    /// Requests `obj`: true on a hit. A miss brings it in, evicting the least recently used.
    fn access(&mut self, obj: u32) -> bool {
        let s = self.slot_of[obj as usize];
        if s != NONE {
            if self.head != s {
                self.unlink(s);
                self.push_front(s);
            }
            return true;
        }
        let s = if (self.object.len() as u32) < self.capacity {
            self.object.push(obj);
            self.prev.push(NONE);
            self.next.push(NONE);
            self.object.len() as u32 - 1
        } else {
            let s = self.tail;
            self.unlink(s);
            self.slot_of[self.object[s as usize] as usize] = NONE;
            self.object[s as usize] = obj;
            s
        };
        self.slot_of[obj as usize] = s;
        self.push_front(s);
        false
    }
}

/// A user's state.
struct User {
    site: u32,
    arrive: u64,
    k: usize,
    cand: [ServerIdx; MAX_K],
    /// Misses per candidate during the trial.
    misses: [u32; MAX_K],
    /// Trial requests sent so far.
    tried: u32,
    chosen: Option<ServerIdx>,
    /// Outcomes since choosing, newest in bit 0 (1 = hit).
    history: u128,
    since: u32,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct WinnerRun {
    /// (step, share of all users at 100%).
    pub series: Vec<(u64, f64)>,
    /// Share of users at 100% at the end.
    pub final_share: f64,
    /// First sampled step after every arrival at which every user was at 100% and stayed so
    /// to the end.
    pub converged_at: Option<u64>,
    /// Lowest hit rate over the last `judge` requests among users who have chosen.
    pub worst_hit_rate: f64,
}

/// Zipf(α) over `objects` ranks: the cumulative distribution.
fn zipf_cdf(objects: usize, alpha: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=objects).map(|r| (r as f64).powf(-alpha)).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    w.iter()
        .map(|x| {
            acc += x / total;
            acc
        })
        .collect()
}

/// Runs one scenario with one seed.
pub fn simulate(p: &WinnerParams, seed: u64) -> Result<WinnerRun> {
    p.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cdf = zipf_cdf(p.objects, p.alpha);
    let total_objects = p.sites * p.objects;
    let mut caches: Vec<Lru> = (0..p.servers)
        .map(|_| Lru::new(p.cache, total_objects))
        .collect();
    let mut users = users_of(p, &mut rng);
    let stride = p.steps.div_ceil(SAMPLES).max(1);
    let mask: u128 = if p.judge == 128 {
        u128::MAX
    } else {
        (1u128 << p.judge) - 1
    };
    let mut series = Vec::new();
    let mut last_bad_sample: Option<u64> = None;
    let at_full = |u: &User| u.since >= p.judge && u.history & mask == mask;
    for step in 0..p.steps {
        for u in users.iter_mut() {
            if u.arrive > step {
                continue;
            }
            access(p, &cdf, &mut caches, u, &mut rng);
        }
        if (step + 1) % stride == 0 || step + 1 == p.steps {
            let full = users.iter().filter(|u| at_full(u)).count();
            if full < users.len() {
                last_bad_sample = Some(step + 1);
            }
            series.push((step + 1, full as f64 / users.len() as f64));
        }
    }
    let final_share = series.last().map_or(0.0, |s| s.1);
    let converged_at = if final_share >= 1.0 {
        let after = last_bad_sample.unwrap_or(0);
        series.iter().map(|s| s.0).find(|&s| s > after)
    } else {
        None
    };
    let worst_hit_rate = worst_hit_rate(p, &users);
    Ok(WinnerRun {
        series,
        final_share,
        converged_at,
        worst_hit_rate,
    })
}

/// The users: each with its site, arrival step and candidates (k of them, or 1 for a user
/// that has not adopted k choices), drawn from `rng`.
fn users_of(p: &WinnerParams, rng: &mut ChaCha8Rng) -> Vec<User> {
    (0..p.users)
        .map(|u| {
            let k = if p.adoption >= 1.0 || rng.random_bool(p.adoption) {
                p.k
            } else {
                1
            };
            let mut cand = [0; MAX_K];
            for (i, s) in sample(&mut *rng, p.servers, k).into_iter().enumerate() {
                cand[i] = s as ServerIdx;
            }
            User {
                site: (u % p.sites) as u32,
                arrive: rng.random_range(0..p.arrival),
                k,
                cand,
                misses: [0; MAX_K],
                tried: 0,
                chosen: None,
                history: 0,
                since: 0,
            }
        })
        .collect()
}

/// One access of user `u`: an object of its site drawn by popularity, from its chosen server,
/// or while it still tries, from its next candidate (choosing after τ tries of each).
fn access(p: &WinnerParams, cdf: &[f64], caches: &mut [Lru], u: &mut User, rng: &mut ChaCha8Rng) {
    let r: f64 = rng.random();
    let rank = cdf.partition_point(|&c| c < r).min(p.objects - 1);
    let obj = u.site * p.objects as u32 + rank as u32;
    match u.chosen {
        Some(s) => {
            let hit = caches[s as usize].access(obj);
            u.history = (u.history << 1) | u128::from(hit);
            u.since = u.since.saturating_add(1);
        }
        None => {
            let i = (u.tried as usize) % u.k;
            let hit = caches[u.cand[i] as usize].access(obj);
            u.misses[i] += u32::from(!hit);
            u.tried += 1;
            if u.tried >= p.tau * u.k as u32 {
                // Positions 0..k compete on misses: the fewest wins, the earliest on ties.
                let pos: [ServerIdx; MAX_K] = std::array::from_fn(|i| i as ServerIdx);
                let best = least_loaded(&pos[..u.k], &u.misses[..u.k]).unwrap_or(0);
                u.chosen = Some(u.cand[best as usize]);
            }
        }
    }
}

/// The worst hit rate of a user that has chosen, over its judge window.
fn worst_hit_rate(p: &WinnerParams, users: &[User]) -> f64 {
    users
        .iter()
        .filter(|u| u.chosen.is_some() && u.since > 0)
        .map(|u| {
            let w = u.since.min(p.judge);
            let m = if w == 128 {
                u128::MAX
            } else {
                (1u128 << w) - 1
            };
            f64::from((u.history & m).count_ones()) / f64::from(w)
        })
        .fold(1.0, f64::min)
}

/// A scenario of the report and what its runs gave.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub group: &'static str,
    pub name: String,
    pub params: WinnerParams,
    pub runs: Vec<WinnerRun>,
}

impl Scenario {
    pub fn converged_runs(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| r.converged_at.is_some())
            .count()
    }
    pub fn failure_rate(&self) -> f64 {
        1.0 - self.converged_runs() as f64 / self.runs.len().max(1) as f64
    }
    pub fn mean_final_share(&self) -> f64 {
        self.runs.iter().map(|r| r.final_share).sum::<f64>() / self.runs.len().max(1) as f64
    }
    /// Mean step of convergence over the runs that converged.
    pub fn mean_converged_at(&self) -> Option<f64> {
        let v: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|r| r.converged_at)
            .map(|s| s as f64)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
    pub fn mean_worst_hit_rate(&self) -> f64 {
        self.runs.iter().map(|r| r.worst_hit_rate).sum::<f64>() / self.runs.len().max(1) as f64
    }
    /// The share of users at 100% over time, averaged over the runs.
    pub fn mean_series(&self) -> Vec<(f64, f64)> {
        let Some(first) = self.runs.first() else {
            return Vec::new();
        };
        (0..first.series.len())
            .map(|i| {
                let y =
                    self.runs.iter().map(|r| r.series[i].1).sum::<f64>() / self.runs.len() as f64;
                (first.series[i].0 as f64, y)
            })
            .collect()
    }
}

fn base_params(a: &WinnerArgs) -> WinnerParams {
    WinnerParams {
        servers: a.servers,
        users: a.users,
        sites: a.sites.unwrap_or(a.users),
        objects: a.objects,
        cache: a.cache.unwrap_or(5 * a.objects),
        alpha: a.alpha,
        tau: a.tau,
        k: 1,
        adoption: 1.0,
        steps: a.steps,
        arrival: a.arrival.unwrap_or((a.steps / 3).max(1)),
        judge: a.judge,
    }
}

/// The scenarios of the report: the k policies and partial adoption at the base setting, the
/// effect of τ (k = 2), of α (k = 1 and 2), and k = 1 under growing load.
pub fn scenarios(a: &WinnerArgs) -> Result<Vec<(&'static str, String, WinnerParams)>> {
    let base = base_params(a);
    if a.k.is_empty() || a.k.len() > MAX_K {
        bail!("--k: give 1 to {MAX_K} values");
    }
    if a.taus.len() > 16 || a.alphas.len() > 16 || a.loads.len() > 16 {
        bail!("--taus, --alphas, --loads: at most 16 values each");
    }
    if !(a.adoption >= 0.0 && a.adoption <= 1.0) {
        bail!("--adoption {}: must be in [0, 1]", a.adoption);
    }
    if !(1..=MAX_RUNS).contains(&a.runs) {
        bail!("--runs {}: must be between 1 and {MAX_RUNS}", a.runs);
    }
    let mut out = Vec::new();
    for &k in &a.k {
        out.push((
            "policy",
            format!("k={k}"),
            WinnerParams { k, ..base.clone() },
        ));
    }
    if a.adoption > 0.0 && a.adoption < 1.0 {
        out.push((
            "policy",
            format!("{:.0}% k=2", 100.0 * a.adoption),
            WinnerParams {
                k: 2,
                adoption: a.adoption,
                ..base.clone()
            },
        ));
    }
    for &tau in &a.taus {
        out.push((
            "tau",
            format!("k=2 τ={tau}"),
            WinnerParams {
                k: 2,
                tau,
                ..base.clone()
            },
        ));
    }
    for &alpha in &a.alphas {
        for k in [1, 2] {
            out.push((
                "alpha",
                format!("k={k} α={alpha}"),
                WinnerParams {
                    k,
                    alpha,
                    ..base.clone()
                },
            ));
        }
    }
    for &m in &a.loads {
        if m == 0 || m > 1000 {
            bail!("--loads {m}: must be between 1 and 1000");
        }
        let users = a.users.saturating_mul(m);
        out.push((
            "load",
            format!("k=1 users×{m}"),
            WinnerParams {
                k: 1,
                users,
                sites: a.sites.map_or(users, |s| s.saturating_mul(m)),
                ..base.clone()
            },
        ));
    }
    let mut work = 0.0;
    for (_, name, p) in &out {
        p.validate()
            .map_err(|e| anyhow::anyhow!("scenario {name}: {e}"))?;
        work += p.users as f64 * p.steps as f64 * a.runs as f64;
    }
    if work > MAX_WORK {
        bail!("{work:.2e} user-requests in all: at most {MAX_WORK:.0e}; lower --runs, --steps, --users or --loads");
    }
    Ok(out)
}

/// Runs every scenario `runs` times (in parallel; the results do not depend on the threads).
pub fn run_scenarios(a: &WinnerArgs, threads: usize) -> Result<Vec<Scenario>> {
    let list = scenarios(a)?;
    let jobs: Vec<(usize, usize)> = (0..list.len())
        .flat_map(|s| (0..a.runs).map(move |r| (s, r)))
        .collect();
    let bar = crate::io::progress(jobs.len() as u64, "winner");
    let results = par_map(&jobs, threads, |&(s, r)| {
        let out = simulate(&list[s].2, sub_seed(a.seed, r as u64));
        bar.inc(1);
        out
    })?;
    bar.finish_and_clear();
    let mut scen: Vec<Scenario> = list
        .into_iter()
        .map(|(group, name, params)| Scenario {
            group,
            name,
            params,
            runs: Vec::new(),
        })
        .collect();
    for (&(s, _), r) in jobs.iter().zip(results) {
        scen[s].runs.push(r);
    }
    Ok(scen)
}

pub fn run(a: &WinnerArgs) -> Result<()> {
    let threads = a.threads.unwrap_or_else(default_threads);
    if threads == 0 || threads > 256 {
        bail!("--threads {threads}: must be between 1 and 256");
    }
    scenarios(a)?; // refuse bad arguments before anything is created on disk
    let dir = out_dir(&a.out, "winner")?;
    let scen = run_scenarios(a, threads)?;
    let mut out = heading(a);
    out.push_str(&scenario_table(&scen));
    out.push_str(&verdicts(&scen));
    print!("{out}");
    write_text(&dir, "winner.md", &out)?;
    write_csvs(&dir, &scen)?;
    plot(&dir, &scen)?;
    eprintln!(
        "wrote {}/winner.csv, winner-summary.csv, winner.svg, winner.md",
        dir.display()
    );
    Ok(())
}

/// The report's heading: the settings every scenario starts from.
fn heading(a: &WinnerArgs) -> String {
    let base = base_params(a);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Go-With-The-Winner (web): {} servers with LRU caches of {} objects ({} sites whole), {} users, {} objects per site, Zipf α = {}, τ = {}, {} steps (arrivals in the first {}), judge window {}, {} runs per scenario, seed {}\n",
        base.servers,
        base.cache,
        base.cache / base.objects,
        base.users,
        base.objects,
        base.alpha,
        base.tau,
        base.steps,
        base.arrival,
        base.judge,
        a.runs,
        a.seed
    );
    out
}

/// One row per scenario: how many users ended at 100%, how often and when all did.
fn scenario_table(scen: &[Scenario]) -> String {
    let rows: Vec<Vec<String>> = scen
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.params.users.to_string(),
                format!("{:.2}%", 100.0 * s.mean_final_share()),
                format!("{}/{}", s.converged_runs(), s.runs.len()),
                format!("{:.0}%", 100.0 * s.failure_rate()),
                s.mean_converged_at()
                    .map_or("-".to_string(), |x| format!("{x:.0}")),
                format!("{:.3}", s.mean_worst_hit_rate()),
            ]
        })
        .collect();
    table(
        &[
            "scenario",
            "users",
            "users at 100% (end)",
            "runs all 100%",
            "failure rate",
            "mean step all 100%",
            "worst user's hit rate",
        ],
        &rows,
    )
}

/// winner.csv (each scenario's mean series) and winner-summary.csv.
fn write_csvs(dir: &Path, scen: &[Scenario]) -> Result<()> {
    let mut csv_rows = Vec::new();
    for s in scen {
        for (step, share) in s.mean_series() {
            csv_rows.push(vec![
                s.group.to_string(),
                s.name.clone(),
                format!("{step}"),
                format!("{share:.6}"),
            ]);
        }
    }
    write_text(
        dir,
        "winner.csv",
        &csv_string(&["group", "scenario", "step", "share_at_100"], &csv_rows)?,
    )?;
    let summary_rows: Vec<Vec<String>> = scen
        .iter()
        .map(|s| {
            vec![
                s.group.to_string(),
                s.name.clone(),
                s.params.k.to_string(),
                s.params.adoption.to_string(),
                s.params.tau.to_string(),
                s.params.alpha.to_string(),
                s.params.users.to_string(),
                s.runs.len().to_string(),
                format!("{:.6}", s.mean_final_share()),
                s.converged_runs().to_string(),
                format!("{:.4}", s.failure_rate()),
                s.mean_converged_at()
                    .map_or(String::new(), |x| format!("{x:.1}")),
                format!("{:.5}", s.mean_worst_hit_rate()),
            ]
        })
        .collect();
    write_text(
        dir,
        "winner-summary.csv",
        &csv_string(
            &[
                "group",
                "scenario",
                "k",
                "adoption",
                "tau",
                "alpha",
                "users",
                "runs",
                "mean_share_at_100_end",
                "runs_all_100",
                "failure_rate",
                "mean_step_all_100",
                "mean_worst_hit_rate",
            ],
            &summary_rows,
        )?,
    )?;
    Ok(())
}

/// winner.svg: the share of users at 100% over the steps, per group of scenarios.
fn plot(dir: &Path, scen: &[Scenario]) -> Result<()> {
    let panel = |group: &str, title: &str| Panel {
        title: title.to_string(),
        x_desc: "step",
        y_desc: "share of users at 100%",
        series: scen
            .iter()
            .filter(|s| s.group == group)
            .map(|s| Series {
                name: s.name.clone(),
                points: s.mean_series(),
            })
            .collect(),
        legend: Legend::LowerRight,
        first_color: 0,
    };
    let mut panels = vec![panel("policy", "users at 100% hit rate: k choices")];
    if scen.iter().any(|s| s.group == "tau") {
        panels.push(panel("tau", "effect of the history window τ"));
    }
    if scen.iter().any(|s| s.group == "alpha") {
        panels.push(panel("alpha", "effect of Zipf α"));
    }
    plot_svg(dir, "winner.svg", &panels)?;
    Ok(())
}

/// The published claims, judged from the run (rules in docs/simulate.md).
pub fn verdicts(scen: &[Scenario]) -> String {
    let mut out = String::from("\nclaims, judged from this run:\n");
    let find = |name: &str| scen.iter().find(|s| s.name == name);
    for k in 2..=MAX_K {
        if let Some(s) = find(&format!("k={k}")) {
            let _ = writeln!(
                out,
                "- k = {k} converges to every user at 100% w.h.p. (≥ 90% of runs): {} ({}/{} runs)",
                held(s.failure_rate() <= 0.1),
                s.converged_runs(),
                s.runs.len()
            );
        }
    }
    k1_verdicts(&mut out, scen);
    if let Some(s) = scen
        .iter()
        .find(|s| s.group == "policy" && s.params.adoption < 1.0)
    {
        let share = s.mean_final_share();
        let _ = writeln!(
            out,
            "- with {:.0}% of users at k = 2, about 95% of users reach 100% (within 5 points): {} ({:.2}%)",
            100.0 * s.params.adoption,
            held((share - 0.95).abs() <= 0.05),
            100.0 * share
        );
    }
    tau_verdicts(&mut out, scen);
    let alphas: Vec<&Scenario> = scen
        .iter()
        .filter(|s| s.group == "alpha" && s.params.k == 2)
        .collect();
    if alphas.len() >= 2 {
        let times: Vec<Option<f64>> = alphas.iter().map(|s| s.mean_converged_at()).collect();
        let faster = times.iter().all(Option::is_some) && times.windows(2).all(|w| w[1] <= w[0]);
        let _ = writeln!(
            out,
            "- a larger α (more skewed popularity) converges sooner (k = 2; mean step all 100%: {}): {}",
            alphas
                .iter()
                .zip(&times)
                .map(|(s, t)| format!(
                    "α={}: {}",
                    s.params.alpha,
                    t.map_or("never".to_string(), |t| format!("{t:.0}"))
                ))
                .collect::<Vec<_>>()
                .join(", "),
            held(faster)
        );
    }
    out
}

/// Where k = 1 fails and k = 2 does not, and k = 1's worst user as load grows.
fn k1_verdicts(out: &mut String, scen: &[Scenario]) {
    let find = |name: &str| scen.iter().find(|s| s.name == name);
    if let (Some(k1), Some(k2)) = (find("k=1"), find("k=2")) {
        let loads: Vec<&Scenario> = scen.iter().filter(|s| s.group == "load").collect();
        let falling = loads.len() >= 2
            && loads
                .windows(2)
                .all(|w| w[1].mean_worst_hit_rate() < w[0].mean_worst_hit_rate());
        let _ = writeln!(
            out,
            "- k = 1 fails where k = 2 does not (failure rate {:.0}% vs {:.0}%): {}",
            100.0 * k1.failure_rate(),
            100.0 * k2.failure_rate(),
            held(k1.failure_rate() > k2.failure_rate())
        );
        if !loads.is_empty() {
            let _ = writeln!(
                out,
                "- with k = 1 the worst user's hit rate falls as load grows ({}): {}",
                loads
                    .iter()
                    .map(|s| format!("{} users: {:.3}", s.params.users, s.mean_worst_hit_rate()))
                    .collect::<Vec<_>>()
                    .join(", "),
                held(falling)
            );
        }
    }
}

/// What a longer history window τ does to failures and convergence.
fn tau_verdicts(out: &mut String, scen: &[Scenario]) {
    let taus: Vec<&Scenario> = scen.iter().filter(|s| s.group == "tau").collect();
    if taus.len() >= 2 {
        let fewer = taus
            .windows(2)
            .all(|w| w[1].failure_rate() <= w[0].failure_rate());
        let _ = writeln!(
            out,
            "- a longer τ fails no more often (k = 2; failure rates {}): {}",
            taus.iter()
                .map(|s| format!("τ={}: {:.0}%", s.params.tau, 100.0 * s.failure_rate()))
                .collect::<Vec<_>>()
                .join(", "),
            held(fewer)
        );
        let times: Vec<Option<f64>> = taus.iter().map(|s| s.mean_converged_at()).collect();
        let slower = times.iter().all(Option::is_some) && times.windows(2).all(|w| w[1] >= w[0]);
        let _ = writeln!(
            out,
            "- a longer τ converges later (mean step all 100%: {}): {}",
            taus.iter()
                .zip(&times)
                .map(|(s, t)| format!(
                    "τ={}: {}",
                    s.params.tau,
                    t.map_or("never".to_string(), |t| format!("{t:.0}"))
                ))
                .collect::<Vec<_>>()
                .join(", "),
            held(slower)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// The linked-list LRU against the obvious one (a queue, most recent at the back).
    #[test]
    fn lru_matches_a_naive_lru() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for capacity in [1usize, 2, 5, 17] {
            let objects = 40;
            let mut lru = Lru::new(capacity, objects);
            let mut naive: VecDeque<u32> = VecDeque::new();
            for _ in 0..5_000 {
                // Skewed, so there are hits and misses.
                let obj =
                    (rng.random_range(0..objects as u32)).min(rng.random_range(0..objects as u32));
                let hit = match naive.iter().position(|&o| o == obj) {
                    Some(i) => {
                        naive.remove(i);
                        true
                    }
                    None => {
                        if naive.len() == capacity {
                            naive.pop_front();
                        }
                        false
                    }
                };
                naive.push_back(obj);
                assert_eq!(lru.access(obj), hit, "capacity {capacity}, object {obj}");
            }
        }
    }

    #[test]
    fn zipf_cdf_is_a_distribution_skewed_by_alpha() {
        let flat = zipf_cdf(10, 0.0);
        assert!((flat[0] - 0.1).abs() < 1e-12 && (flat[9] - 1.0).abs() < 1e-12);
        let skewed = zipf_cdf(10, 1.4);
        assert!(skewed[0] > 0.4 && (skewed[9] - 1.0).abs() < 1e-12);
        assert!(skewed.windows(2).all(|w| w[0] < w[1]));
    }
}
