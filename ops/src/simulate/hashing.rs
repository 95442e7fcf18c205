//! `cdnmap simulate hashing`: round-robin vs consistent hashing vs bounded-load consistent
//! hashing vs power-of-two on one key set while nodes join and leave.
//!
//! Every policy but round-robin is the project's own code: [`Ring`] (consistent hashing with
//! virtual nodes), [`BoundedLoads::assign`] and power-of-d as `cdnmap ring` places keys
//! ([`crate::ring::power_of_d_assign`]). Round-robin — key i → node i mod n over the current node
//! list, re-indexed on every join (appended) and leave (removed) — is the only policy
//! implemented here. Each state is placed from scratch, as a restarted balancer would, and the
//! keys moved are counted against the previous state.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use cdnmap_select::{BoundedLoads, Ring, ServerIdx, MAX_D};
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{csv_string, held, out_dir, plot_svg, table, write_text, Legend, Panel, Series};

/// Most nodes at any time.
pub const MAX_NODES: usize = 10_000;
/// Most join/leave events.
pub const MAX_EVENTS: usize = 1_000;
/// Most bounded-load factors compared.
pub const MAX_FACTORS: usize = 8;

#[derive(Args, Debug, Clone)]
pub struct HashingArgs {
    /// Nodes at the start (ids node-0, node-1, ...).
    #[arg(long, default_value_t = 50)]
    pub nodes: usize,
    /// The keys (tasks): a count (generated hostnames, unit weights) or a file with one key per
    /// line, optionally followed by whitespace and a weight.
    #[arg(long, default_value = "100000")]
    pub keys: String,
    /// Virtual nodes per node on the ring.
    #[arg(long, default_value_t = 100)]
    pub vnodes: u32,
    /// Bounded-load factors c (> 1), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1.1,1.25,1.5")]
    pub c: Vec<f64>,
    /// Power-of-d: candidates per key.
    #[arg(long, default_value_t = 2)]
    pub d: usize,
    /// Power-of-d: load reports arrive every this many keys placed.
    #[arg(long, default_value_t = 100)]
    pub report_every: usize,
    /// Join/leave events, alternating (a new node joins, then a random node leaves, ...).
    #[arg(long, default_value_t = 10)]
    pub events: usize,
    /// Random seed (which node leaves).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output directory (default simulate-out/hashing).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What happened before a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Start,
    Join(String),
    Leave(String),
}

impl Event {
    fn describe(&self) -> String {
        match self {
            Event::Start => "start".to_string(),
            Event::Join(id) => format!("join {id}"),
            Event::Leave(id) => format!("leave {id}"),
        }
    }
}

/// One policy in one state.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyState {
    pub policy: String,
    /// For bounded loads, c.
    pub c: Option<f64>,
    pub max: f64,
    pub avg: f64,
    /// Keys whose node differs from the previous state's (0 at the start).
    pub moved: usize,
}

/// One state of the node set.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub event: Event,
    pub nodes: usize,
    pub policies: Vec<PolicyState>,
}

/// The whole run, for printing and for tests.
#[derive(Debug, Clone, PartialEq)]
pub struct HashingRun {
    pub keys: usize,
    pub total_weight: f64,
    pub states: Vec<State>,
}

fn validate(a: &HashingArgs) -> Result<()> {
    if !(1..=MAX_NODES).contains(&a.nodes) {
        bail!("--nodes {}: must be between 1 and {MAX_NODES}", a.nodes);
    }
    if a.events > MAX_EVENTS {
        bail!("--events {}: at most {MAX_EVENTS}", a.events);
    }
    if a.nodes + a.events.div_ceil(2) > MAX_NODES {
        bail!(
            "--nodes {} with --events {}: more than {MAX_NODES} nodes",
            a.nodes,
            a.events
        );
    }
    if a.nodes < 2 && a.events > 1 {
        bail!("--nodes {}: at least 2 so that a node can leave", a.nodes);
    }
    if a.vnodes == 0 || a.vnodes > 10_000 {
        bail!("--vnodes {}: must be between 1 and 10000", a.vnodes);
    }
    if a.c.is_empty() || a.c.len() > MAX_FACTORS {
        bail!("--c: give 1 to {MAX_FACTORS} factors");
    }
    for &c in &a.c {
        if !(c.is_finite() && c > 1.0 && c <= 100.0) {
            bail!("--c {c}: must be in (1, 100]");
        }
    }
    if !(1..=MAX_D).contains(&a.d) {
        bail!("--d {}: must be between 1 and {MAX_D}", a.d);
    }
    if a.report_every == 0 {
        bail!("--report-every 0: must be at least 1");
    }
    Ok(())
}

/// Each key's node (a global node number) under one policy.
type Owners = Vec<u32>;

/// Places the keys on `nodes` (global numbers, in list order) with every policy.
fn place_all(
    nodes: &[u32],
    keys: &[(&str, f64)],
    a: &HashingArgs,
) -> Result<Vec<(String, Option<f64>, Owners)>> {
    let ids: Vec<String> = nodes.iter().map(|n| format!("node-{n}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let ring = Ring::new(&refs, a.vnodes)?;
    let global = |s: ServerIdx| nodes[s as usize];
    let mut out = Vec::new();
    let rr: Owners = (0..keys.len()).map(|i| nodes[i % nodes.len()]).collect();
    out.push(("round-robin".to_string(), None, rr));
    let plain: Owners = keys.iter().map(|k| global(ring.primary(k.0))).collect();
    out.push(("consistent".to_string(), None, plain));
    for &c in &a.c {
        let b: Owners = BoundedLoads::assign(&ring, keys, c)?
            .into_iter()
            .map(global)
            .collect();
        out.push((format!("bounded c={c}"), Some(c), b));
    }
    let p: Owners = crate::ring::power_of_d_assign(&ring, keys, a.d, a.report_every)?
        .into_iter()
        .map(global)
        .collect();
    out.push((format!("power-of-{}", a.d), None, p));
    Ok(out)
}

fn max_avg(nodes: &[u32], owners: &Owners, keys: &[(&str, f64)]) -> (f64, f64) {
    let top = nodes.iter().copied().max().unwrap_or(0) as usize;
    let mut load = vec![0.0f64; top + 1];
    for (&o, &(_, w)) in owners.iter().zip(keys) {
        load[o as usize] += w;
    }
    let max = nodes.iter().map(|&n| load[n as usize]).fold(0.0, f64::max);
    let total: f64 = keys.iter().map(|k| k.1).sum();
    (max, total / nodes.len() as f64)
}

/// Runs the start state and the events.
pub fn simulate(a: &HashingArgs) -> Result<HashingRun> {
    validate(a)?;
    let owned = crate::ring::read_keys(&a.keys)?;
    if owned.is_empty() {
        bail!("--keys {}: no keys", a.keys);
    }
    let keys: Vec<(&str, f64)> = owned.iter().map(|(k, w)| (k.as_str(), *w)).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed);
    let mut nodes: Vec<u32> = (0..a.nodes as u32).collect();
    let mut next_id = a.nodes as u32;
    let mut states = Vec::new();
    let mut previous: Option<Vec<Owners>> = None;
    let bar = crate::io::progress(a.events as u64 + 1, "hashing");
    for e in 0..=a.events {
        let event = if e == 0 {
            Event::Start
        } else if e % 2 == 1 {
            let id = next_id;
            next_id += 1;
            nodes.push(id);
            Event::Join(format!("node-{id}"))
        } else {
            let i = rng.random_range(0..nodes.len());
            let id = nodes.remove(i);
            Event::Leave(format!("node-{id}"))
        };
        let placed = place_all(&nodes, &keys, a)?;
        let policies = placed
            .iter()
            .enumerate()
            .map(|(p, (name, c, owners))| {
                let (max, avg) = max_avg(&nodes, owners, &keys);
                let moved = previous.as_ref().map_or(0, |prev| {
                    prev[p].iter().zip(owners).filter(|(x, y)| x != y).count()
                });
                PolicyState {
                    policy: name.clone(),
                    c: *c,
                    max,
                    avg,
                    moved,
                }
            })
            .collect();
        previous = Some(placed.into_iter().map(|p| p.2).collect());
        states.push(State {
            event,
            nodes: nodes.len(),
            policies,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(HashingRun {
        keys: keys.len(),
        total_weight: keys.iter().map(|k| k.1).sum(),
        states,
    })
}

/// ⌈c × average⌉, the bounded-loads ceiling for unit weights (with the selector's own rounding).
pub fn ceiling(total: f64, nodes: usize, c: f64) -> f64 {
    BoundedLoads::limit(total, nodes, c).ceil()
}

/// Per policy over the run: mean max/avg over all states, worst max/avg, and mean share of keys
/// moved per join and per leave.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySummary {
    pub policy: String,
    pub c: Option<f64>,
    pub mean_ratio: f64,
    pub worst_ratio: f64,
    pub join_moved: f64,
    pub leave_moved: f64,
    /// Bounded loads: every state at most ⌈c × avg⌉.
    pub within_ceiling: Option<bool>,
}

pub fn summarize(run: &HashingRun) -> Vec<PolicySummary> {
    let Some(first) = run.states.first() else {
        return Vec::new();
    };
    let unit = run.total_weight == run.keys as f64;
    (0..first.policies.len())
        .map(|p| {
            let ratios: Vec<f64> = run
                .states
                .iter()
                .map(|s| s.policies[p].max / s.policies[p].avg)
                .collect();
            let moved = |join: bool| {
                let v: Vec<f64> = run
                    .states
                    .iter()
                    .filter(|s| match s.event {
                        Event::Join(_) => join,
                        Event::Leave(_) => !join,
                        Event::Start => false,
                    })
                    .map(|s| s.policies[p].moved as f64 / run.keys as f64)
                    .collect();
                if v.is_empty() {
                    f64::NAN
                } else {
                    v.iter().sum::<f64>() / v.len() as f64
                }
            };
            let c = first.policies[p].c;
            PolicySummary {
                policy: first.policies[p].policy.clone(),
                c,
                mean_ratio: ratios.iter().sum::<f64>() / ratios.len() as f64,
                worst_ratio: ratios.iter().copied().fold(0.0, f64::max),
                join_moved: moved(true),
                leave_moved: moved(false),
                within_ceiling: c.filter(|_| unit).map(|c| {
                    run.states
                        .iter()
                        .all(|s| s.policies[p].max <= ceiling(run.total_weight, s.nodes, c))
                }),
            }
        })
        .collect()
}

pub fn run(a: &HashingArgs) -> Result<()> {
    let r = simulate(a)?;
    let dir = out_dir(&a.out, "hashing")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# hashing under joins and leaves: {} keys, {} nodes at the start, {} vnodes, {} events, seed {}\n",
        r.keys, a.nodes, a.vnodes, a.events, a.seed
    );
    out.push_str(&states_table(&dir, &r)?);
    let sums = summarize(&r);
    out.push_str(&summary_table(&sums));
    out.push_str(&verdicts(&sums, a.nodes));
    print!("{out}");
    write_text(&dir, "hashing.md", &out)?;
    plot(&dir, &r)?;
    eprintln!(
        "wrote {}/hashing.csv, hashing.svg, hashing.md",
        dir.display()
    );
    Ok(())
}

/// Every state's table (returned) and hashing.csv.
fn states_table(dir: &Path, r: &HashingRun) -> Result<String> {
    let mut rows = Vec::new();
    let mut csv_rows = Vec::new();
    for (i, s) in r.states.iter().enumerate() {
        for p in &s.policies {
            let share = p.moved as f64 / r.keys as f64;
            let ceil = p.c.map(|c| ceiling(r.total_weight, s.nodes, c));
            rows.push(vec![
                i.to_string(),
                s.event.describe(),
                s.nodes.to_string(),
                p.policy.clone(),
                format!("{:.0}", p.max),
                format!("{:.1}", p.avg),
                format!("{:.3}", p.max / p.avg),
                ceil.map_or(String::new(), |c| format!("{c:.0}")),
                p.moved.to_string(),
                format!("{:.2}%", 100.0 * share),
            ]);
            csv_rows.push(vec![
                i.to_string(),
                s.event.describe(),
                s.nodes.to_string(),
                p.policy.clone(),
                format!("{}", p.max),
                format!("{:.4}", p.avg),
                format!("{:.5}", p.max / p.avg),
                ceil.map_or(String::new(), |c| format!("{c}")),
                p.moved.to_string(),
                format!("{share:.6}"),
            ]);
        }
    }
    let out = table(
        &[
            "#",
            "event",
            "nodes",
            "policy",
            "max",
            "avg",
            "max/avg",
            "⌈c·avg⌉",
            "moved",
            "moved %",
        ],
        &rows,
    );
    write_text(
        dir,
        "hashing.csv",
        &csv_string(
            &[
                "state",
                "event",
                "nodes",
                "policy",
                "max_load",
                "avg_load",
                "max_over_avg",
                "bounded_ceiling",
                "keys_moved",
                "moved_share",
            ],
            &csv_rows,
        )?,
    )?;

    Ok(out)
}

/// The summary over the run, under its heading.
fn summary_table(sums: &[PolicySummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nsummary over the run:");
    let srows: Vec<Vec<String>> = sums
        .iter()
        .map(|s| {
            vec![
                s.policy.clone(),
                format!("{:.3}", s.mean_ratio),
                format!("{:.3}", s.worst_ratio),
                format!("{:.2}%", 100.0 * s.join_moved),
                format!("{:.2}%", 100.0 * s.leave_moved),
                s.within_ceiling
                    .map_or(String::new(), |w| if w { "yes" } else { "NO" }.to_string()),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "policy",
            "mean max/avg",
            "worst max/avg",
            "moved per join",
            "moved per leave",
            "≤ ⌈c·avg⌉ always",
        ],
        &srows,
    ));
    out
}

/// hashing.svg: keys moved by each event, and max / average load, per policy.
fn plot(dir: &Path, r: &HashingRun) -> Result<()> {
    let policies = &r.states[0].policies;
    let series = |f: &dyn Fn(&PolicyState) -> f64, skip_start: bool| -> Vec<Series> {
        (0..policies.len())
            .map(|p| Series {
                name: policies[p].policy.clone(),
                points: r
                    .states
                    .iter()
                    .enumerate()
                    .skip(usize::from(skip_start))
                    .map(|(i, s)| (i as f64, f(&s.policies[p])))
                    .collect(),
            })
            .collect()
    };
    let keys = r.keys as f64;
    plot_svg(
        dir,
        "hashing.svg",
        &[
            Panel {
                title: "keys moved by each join/leave (share)".to_string(),
                x_desc: "event (odd: join, even: leave)",
                y_desc: "share of keys moved",
                series: series(&|p| p.moved as f64 / keys, true),
                legend: Legend::MiddleRight,
                first_color: 0,
            },
            Panel {
                title: "max / average load per node".to_string(),
                x_desc: "state",
                y_desc: "max / avg",
                series: series(&|p| p.max / p.avg, false),
                legend: Legend::LowerRight,
                first_color: 0,
            },
        ],
    )?;
    Ok(())
}

/// The expected picture, judged from the run (rules in docs/simulate.md): round-robin balanced
/// (worst max/avg ≤ 1.05) but moving nearly everything (≥ 80% per event); consistent hashing
/// moving little (≤ 2 × the ideal 1/n per event) but unbalanced (worst max/avg ≥ 1.1); bounded
/// loads never above ⌈c·avg⌉ while moving at most a quarter of what round-robin moves.
fn verdicts(sums: &[PolicySummary], nodes: usize) -> String {
    let mut out = String::from("\nclaims, judged from this run:\n");
    let find = |name: &str| sums.iter().find(|s| s.policy == name);
    let moved = |s: &PolicySummary| {
        let v: Vec<f64> = [s.join_moved, s.leave_moved]
            .into_iter()
            .filter(|x| x.is_finite())
            .collect();
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let ideal = 1.0 / nodes as f64;
    if let Some(rr) = find("round-robin") {
        let ok = rr.worst_ratio <= 1.05 && moved(rr) >= 0.8;
        let _ = writeln!(
            out,
            "- round-robin is balanced (worst max/avg {:.3} ≤ 1.05) but moves nearly everything ({:.1}% ≥ 80% per event): {}",
            rr.worst_ratio,
            100.0 * moved(rr),
            held(ok)
        );
        if let Some(ch) = find("consistent") {
            let ok = moved(ch) <= 2.0 * ideal && ch.worst_ratio >= 1.1;
            let _ = writeln!(
                out,
                "- consistent hashing moves little ({:.2}% ≤ 2 × 1/n = {:.2}% per event) but is unbalanced (worst max/avg {:.3} ≥ 1.1): {}",
                100.0 * moved(ch),
                200.0 * ideal,
                ch.worst_ratio,
                held(ok)
            );
        }
        for b in sums.iter().filter(|s| s.c.is_some()) {
            let within = b.within_ceiling.unwrap_or(false);
            let ok = within && moved(b) <= 0.25 * moved(rr);
            let _ = writeln!(
                out,
                "- {} gets both: never above ⌈c·avg⌉ ({}) and moves {:.2}% per event ≤ a quarter of round-robin's {:.1}%: {}",
                b.policy,
                match b.within_ceiling {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "weighted keys: not checked",
                },
                100.0 * moved(b),
                100.0 * moved(rr),
                held(ok)
            );
        }
    }
    out
}
