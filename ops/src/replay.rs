//! `cdnmap replay`: recorded (or synthetic) demand through the estimator and the mapper, round
//! by round on a simulated clock (no sleeping), with what would have happened measured each
//! round: solve time, churn, overflow, demand-weighted RTT, true utilization per resource kind,
//! capacity violations, forecast error.
//!
//! Each round `r` (time `t_r`):
//! 1. cluster state changes of the round apply;
//! 2. the service's round driver (`cdnmap_engine::driver`, the same step `cdnmap serve` runs)
//!    takes what was observed in round `r − 1` and maps the *forecast* demand (what the mapper
//!    would have known), with the learned coefficients once confident and derated capacities
//!    (learning on), seeded from the previous map (stickiness on);
//! 3. the round's *observed* demand lands on the map's shares; the true load of every node is
//!    computed with the trace's true coefficients (or the configured ones when it has none) and
//!    compared with its capacity (violations, utilization);
//! 4. the observed demand and the measured loads are the next round's observations.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cdnmap_engine::driver::{Driver, Observations};
use cdnmap_engine::round::Snapshot;
use cdnmap_estimator::forecast::ForecastConfig;
use cdnmap_estimator::observed::UnitDemand;
use cdnmap_estimator::state::{through, Estimates, Through};
use cdnmap_mapper::{ClassIdx, ClusterState, Map, PerUnit, ResourceKind, Stickiness, UnitIdx};
use cdnmap_serve::resolve::ClassRules;
use cdnmap_topology::Topology;
use ipnet::IpNet;

use cdnmap_world::trace::{Header, Record};

/// One way of running the pipeline; several can be compared in one report.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub name: String,
    /// 0: every round a cold solve.
    pub stickiness: f64,
    /// Learn coefficients and derate from the measured loads.
    pub learning: bool,
    /// Map the forecast (on) or last round's observed demand (off).
    pub forecast: bool,
    /// Overflow placed beyond the units' lists (on) or left in overflow (off): the service's
    /// `[second_chance]` at its default bound.
    pub beyond_lists: bool,
}

impl Default for Setting {
    fn default() -> Self {
        Setting {
            name: "default".into(),
            stickiness: cdnmap_mapper::DEFAULT_STICKINESS,
            learning: true,
            forecast: true,
            beyond_lists: false,
        }
    }
}

impl Setting {
    /// Parses `NAME:key=value,key=value` (keys: stickiness, learning, forecast,
    /// beyond_lists).
    pub fn parse(spec: &str) -> Result<Setting> {
        let (name, rest) = spec
            .split_once(':')
            .with_context(|| format!("--compare {spec:?}: expected NAME:key=value,..."))?;
        let mut s = Setting {
            name: name.to_string(),
            ..Setting::default()
        };
        for kv in rest.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--compare {spec:?}: {kv:?} is not key=value"))?;
            let on = || match v {
                "on" | "true" => Ok(true),
                "off" | "false" => Ok(false),
                _ => bail!("--compare {spec:?}: {k} must be on or off, got {v:?}"),
            };
            match k {
                "stickiness" => {
                    s.stickiness = v
                        .parse()
                        .with_context(|| format!("--compare {spec:?}: stickiness {v:?}"))?
                }
                "learning" => s.learning = on()?,
                "forecast" => s.forecast = on()?,
                "beyond_lists" => s.beyond_lists = on()?,
                _ => {
                    bail!(
                        "--compare {spec:?}: unknown key {k:?} (stickiness, learning, forecast, beyond_lists)"
                    )
                }
            }
        }
        Stickiness::margin(s.stickiness)
            .validate()
            .with_context(|| format!("--compare {spec:?}"))?;
        Ok(s)
    }
}

/// What one round did.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub round: usize,
    pub t_ms: i64,
    pub solve_ms: f64,
    pub churn: f64,
    pub overflow_share: f64,
    pub mean_rtt_ms: f64,
    pub max_util_bps: f64,
    pub max_util_fps: f64,
    /// Nodes whose true load exceeded their true capacity.
    pub violations: usize,
    /// Σ |forecast − observed| / Σ observed over the units observed this round.
    pub forecast_error: f64,
    pub learned_confident: bool,
    pub derated_clusters: usize,
}

/// The trace's records, per round, resolved to map units and clusters (any unknown name is an
/// error, never skipped).
struct Rounds {
    demand: Vec<Vec<(UnitIdx, f64)>>,
    states: Vec<Vec<(u32, ClusterState)>>,
}

fn index(instance: &Topology, header: &Header, records: &[Record]) -> Result<Rounds> {
    let by_prefix: HashMap<(IpNet, ClassIdx), UnitIdx> = (0..instance.unit_count() as UnitIdx)
        .flat_map(|u| {
            instance
                .unit_prefixes(u)
                .iter()
                .map(move |p| ((p.trunc(), instance.unit_class(u)), u))
        })
        .collect();
    let last = records.last().map_or(header.start_ms, Record::t);
    let n = ((last - header.start_ms) / header.round_ms + 1).max(0) as usize;
    let mut rounds = Rounds {
        demand: vec![Vec::new(); n],
        states: vec![Vec::new(); n],
    };
    for (i, r) in records.iter().enumerate() {
        let t = r.t();
        if t < header.start_ms {
            bail!(
                "record {}: time {t} is before the trace's start {}",
                i + 1,
                header.start_ms
            );
        }
        let round = ((t - header.start_ms) / header.round_ms) as usize;
        match r {
            Record::Unit {
                map_unit, demand, ..
            } => {
                let u = instance.unit_index(map_unit).with_context(|| {
                    format!("record {}: no map unit {map_unit:?} in the instance", i + 1)
                })?;
                rounds.demand[round].push((u, *demand));
            }
            Record::Prefix {
                prefix,
                class,
                demand,
                ..
            } => {
                let k = instance
                    .class_index(class)
                    .with_context(|| format!("record {}: no traffic class {class:?}", i + 1))?;
                let u = by_prefix.get(&(*prefix, k)).with_context(|| {
                    format!(
                        "record {}: no map unit of class {class:?} has prefix {prefix}",
                        i + 1
                    )
                })?;
                rounds.demand[round].push((*u, *demand));
            }
            Record::Load { .. } => {} // measured loads are recomputed from the true coefficients
            Record::State { state, .. } => {
                let c = instance
                    .cluster_index(&state.cluster)
                    .with_context(|| format!("record {}: no cluster {:?}", i + 1, state.cluster))?;
                rounds.states[round].push((c, state.to));
            }
        }
    }
    Ok(rounds)
}

/// Runs one setting over the whole trace. `progress` is called after every round with the
/// round's row and the number of rounds (so a caller can show each round as it is done).
pub fn replay(
    base: &Topology,
    header: &Header,
    records: &[Record],
    setting: &Setting,
    progress: &dyn Fn(&Row, usize),
) -> Result<Vec<Row>> {
    replay_with(base, header, records, setting, progress, &mut |_, _| {})
}

/// [`replay`], handing each round's snapshot and what was then observed (the next round's
/// input) to `sink`: how a test feeds the same observations to the service's loop.
/// The service's round driver for `setting`: the estimator (without forecasting, the last
/// observed value) and the stickiness.
fn driver(base: &Topology, setting: &Setting) -> Result<Driver> {
    let mut est = Estimates::new(base).map_err(|e| anyhow::anyhow!("{e}"))?;
    if !setting.forecast {
        // The last observed value, as a forecaster that forgets at once.
        est.forecast_config = ForecastConfig {
            alpha: 1.0,
            beta: 0.0,
            gamma: 0.0,
            ..ForecastConfig::default()
        };
    }
    let stickiness = if setting.stickiness > 0.0 {
        Stickiness::margin(setting.stickiness)
    } else {
        Stickiness::OFF
    };
    let driver = Driver::new(est, stickiness, setting.learning, false);
    Ok(if setting.beyond_lists {
        driver
            .with_second_chance(cdnmap_engine::round::RoundChance::beyond_lists_at_default_bound())
    } else {
        driver
    })
}

/// What the resource nodes carried: the violations of capacity, the highest utilisation per
/// kind (bps, fps), the loads (cluster id, node name, load).
struct NodeLoads {
    violations: usize,
    max_util: [f64; 2],
    loads: Vec<(String, String, f64)>,
}

/// The loads of `flow` (demand per node and class) with the true coefficients `truth`.
fn node_loads(base: &Topology, truth: &[PerUnit], flow: &Through) -> NodeLoads {
    let (mut violations, mut max_util) = (0usize, [0.0f64; 2]);
    let mut loads = Vec::new();
    for (ci, cl) in base.clusters().iter().enumerate() {
        for (n, node) in cl.nodes.iter().enumerate() {
            let g = base.global_node(ci as u32, n as u32);
            let load: f64 = flow[g]
                .iter()
                .zip(truth)
                .map(|(d, p)| d * p.get(node.kind))
                .sum();
            let util = if node.capacity > 0.0 {
                load / node.capacity
            } else if load > 0.0 {
                f64::INFINITY
            } else {
                0.0
            };
            if util > 1.0 + 1e-9 {
                violations += 1;
            }
            let kind = usize::from(node.kind == ResourceKind::Fps);
            max_util[kind] = max_util[kind].max(util);
            loads.push((cl.id.clone(), node.name.clone(), load));
        }
    }
    NodeLoads {
        violations,
        max_util,
        loads,
    }
}

/// The mean RTT of the observed demand on the map's shares (0 with none placed).
fn mean_rtt_ms(base: &Topology, instance: &Topology, map: &Map, observed: &[Option<f64>]) -> f64 {
    let units = base.unit_count();
    cdnmap_mapper::map::mean_score(instance, map, |u| {
        let actual = observed.get(u as usize).copied().flatten()?;
        let planned = instance.unit_demand(u);
        Some(if planned > 0.0 { actual / planned } else { 0.0 }).filter(|_| (u as usize) < units)
    })
    .unwrap_or(0.0)
}

/// The forecast error (relative to the observed total) and the observed demand by unit id.
fn forecast_error(
    base: &Topology,
    instance: &Topology,
    observed: &[Option<f64>],
) -> (f64, UnitDemand) {
    let (mut err, mut total) = (0.0, 0.0);
    let mut column = UnitDemand::new(base);
    for (u, obs) in observed.iter().enumerate() {
        if let Some(actual) = *obs {
            let u = u as UnitIdx;
            err += (instance.unit_demand(u) - actual).abs();
            total += actual;
            column.add(u, actual);
        }
    }
    (if total > 0.0 { err / total } else { 0.0 }, column)
}

pub fn replay_with(
    base: &Topology,
    header: &Header,
    records: &[Record],
    setting: &Setting,
    progress: &dyn Fn(&Row, usize),
    sink: &mut dyn FnMut(&Snapshot, &Observations),
) -> Result<Vec<Row>> {
    let rounds = index(base, header, records)?;
    let classes = base.classes();
    let truth: Vec<PerUnit> = classes
        .iter()
        .map(|c| {
            header
                .true_per_unit
                .get(&c.name)
                .copied()
                .unwrap_or(c.per_unit)
        })
        .collect();
    // The service's round driver: the same step, on a simulated clock.
    let mut driver = driver(base, setting)?;
    let default_class = classes.first().map(|c| c.name.clone()).unwrap_or_default();
    let mut current = base.clone();
    let mut previous: Option<Snapshot> = None;
    let mut observed_before = Observations::default();
    let mut rows = Vec::with_capacity(rounds.demand.len());
    for (r, (demand, changes)) in rounds.demand.iter().zip(&rounds.states).enumerate() {
        let t = header.start_ms + r as i64 * header.round_ms;
        for &(c, s) in changes {
            current = current.with_cluster_state(c, s);
        }
        let started = Instant::now();
        let step = driver
            .step(
                &current,
                previous.as_ref(),
                &observed_before,
                |instance| ClassRules::for_instance(instance, &[], &default_class),
                1,
                t,
            )
            .context("the round")?;
        let solve_ms = started.elapsed().as_secs_f64() * 1e3;
        let confident = setting.learning && driver.estimates().confident();
        let snapshot = step.snapshot;
        let (instance, map) = (&snapshot.topology, &snapshot.map);

        // What really happened: the observed demand on the map's shares, true coefficients.
        let mut observed = vec![None::<f64>; base.unit_count()];
        for &(u, d) in demand {
            *observed[u as usize].get_or_insert(0.0) += d;
        }
        let flow = through(instance, map, Some(&observed));
        let NodeLoads {
            violations,
            max_util,
            loads,
        } = node_loads(base, &truth, &flow);
        let mean_rtt_ms = mean_rtt_ms(base, instance, map, &observed);
        // Forecast error; the observations go to the next round's step.
        let (forecast_error, column) = forecast_error(base, instance, &observed);
        observed_before = Observations {
            at_unix_ms: t,
            demand: column,
            loads: if setting.learning { loads } else { Vec::new() },
            // The trace holds no RTT measurements: the topology's scores stand.
            rtt: Vec::new(),
        };
        let demand_total = instance.total_demand();
        rows.push(Row {
            round: r,
            t_ms: t,
            solve_ms,
            churn: snapshot.churn.unwrap_or(0.0),
            overflow_share: if demand_total > 0.0 {
                map.total_overflow() / demand_total
            } else {
                0.0
            },
            mean_rtt_ms,
            max_util_bps: max_util[0],
            max_util_fps: max_util[1],
            violations,
            forecast_error,
            learned_confident: confident,
            derated_clusters: driver.estimates().derater().derated().count(),
        });
        sink(&snapshot, &observed_before);
        previous = Some(snapshot);
        if let Some(row) = rows.last() {
            progress(row, rounds.demand.len());
        }
    }
    Ok(rows)
}

/// Writes `rounds.csv`, `report.md` and one SVG plot per measure into `dir`.
pub fn write_report(dir: &Path, results: &[(Setting, Vec<Row>)], warmup: usize) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut csv = String::from(
        "setting,round,t_ms,solve_ms,churn,overflow_share,mean_rtt_ms,max_util_bps,max_util_fps,violations,forecast_error,learned_confident,derated_clusters\n",
    );
    for (s, rows) in results {
        for r in rows {
            let _ = writeln!(
                csv,
                "{},{},{},{:.3},{:.6},{:.6},{:.3},{:.4},{:.4},{},{:.5},{},{}",
                s.name,
                r.round,
                r.t_ms,
                r.solve_ms,
                r.churn,
                r.overflow_share,
                r.mean_rtt_ms,
                r.max_util_bps,
                r.max_util_fps,
                r.violations,
                r.forecast_error,
                r.learned_confident,
                r.derated_clusters
            );
        }
    }
    std::fs::write(dir.join("rounds.csv"), csv).context("writing rounds.csv")?;

    let mut md = String::from("# Replay report\n\n");
    let _ = writeln!(
        md,
        "| setting | rounds | mean solve ms | mean churn | mean overflow | mean RTT ms | max util bps | max util fps | violations (all) | violations after round {warmup} | mean forecast error |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (s, rows) in results {
        let n = rows.len().max(1) as f64;
        let mean = |f: &dyn Fn(&Row) -> f64| rows.iter().map(f).sum::<f64>() / n;
        let max = |f: &dyn Fn(&Row) -> f64| rows.iter().map(f).fold(0.0, f64::max);
        let late: usize = rows.iter().skip(warmup).map(|r| r.violations).sum();
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.3}% | {:.2}% | {:.1} | {:.2} | {:.2} | {} | {} | {:.2}% |",
            s.name,
            rows.len(),
            mean(&|r| r.solve_ms),
            100.0 * mean(&|r| r.churn),
            100.0 * mean(&|r| r.overflow_share),
            mean(&|r| r.mean_rtt_ms),
            max(&|r| r.max_util_bps),
            max(&|r| r.max_util_fps),
            rows.iter().map(|r| r.violations).sum::<usize>(),
            late,
            100.0 * mean(&|r| r.forecast_error),
        );
    }
    md.push_str("\nPlots: churn.svg, overflow.svg, utilization.svg (Fps), utilization_bps.svg, violations.svg, forecast_error.svg, solve_ms.svg; all figures per round in rounds.csv.\n");
    std::fs::write(dir.join("report.md"), md).context("writing report.md")?;

    type Get = fn(&Row) -> f64;
    let plots: [(&str, &str, Get); 7] = [
        ("churn", "churn (share of demand)", |r| r.churn),
        ("overflow", "overflow (share of demand)", |r| {
            r.overflow_share
        }),
        ("utilization", "max true utilization of Fps nodes", |r| {
            r.max_util_fps
        }),
        (
            "utilization_bps",
            "max true utilization of Bps nodes",
            |r| r.max_util_bps,
        ),
        ("violations", "nodes over true capacity", |r| {
            r.violations as f64
        }),
        ("forecast_error", "forecast error (share)", |r| {
            r.forecast_error
        }),
        ("solve_ms", "solve time (ms)", |r| r.solve_ms),
    ];
    for (file, title, get) in plots {
        plot(&dir.join(format!("{file}.svg")), title, results, get)?;
    }
    Ok(())
}

fn plot(
    path: &Path,
    title: &str,
    results: &[(Setting, Vec<Row>)],
    get: fn(&Row) -> f64,
) -> Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let rounds = results
        .iter()
        .map(|(_, r)| r.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let top = results
        .iter()
        .flat_map(|(_, rows)| rows.iter().map(get))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0..rounds, 0.0..top)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("round")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, (s, rows)) in results.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                rows.iter().map(|r| (r.round, get(r).min(top))),
                color,
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
