//! `cdnmap bench round`: the service's round with demand reports flowing, in process, part by
//! part: the round driver (estimator, effective preferences, solve, index) that `cdnmap serve`
//! runs each cycle, with persistence (the served record in a store of its own) beside the index
//! as the service runs it, then publication (the in-cluster selectors). `total` is the round's
//! wall-clock time: less than the sum of the parts, since persist and index overlap. Every
//! round observes a demand report for every map unit (the configured demand with ±`noise`% of
//! deterministic noise), as a fleet of front ends would send; the first round is cold, the
//! others warm. Prints the median and the maximum of each
//! part over the timed rounds, and the peak of live heap bytes.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use cdnmap_api::selection::{self, ServerLoads};
use cdnmap_engine::driver::{Driver, Observations};
use cdnmap_engine::round::{Snapshot, Solved};
use cdnmap_estimator::observed::UnitDemand;
use cdnmap_estimator::state::Estimates;
use cdnmap_mapper::{Stickiness, UnitIdx};
use cdnmap_serve::resolve::ClassRules;
use cdnmap_store::{RecordKind, ServedRef, Store};
use cdnmap_topology::Topology;
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::alloc;
use crate::solve::BenchWorld;

#[derive(Args, Debug)]
pub struct RoundBenchArgs {
    #[command(flatten)]
    pub world: BenchWorld,
    /// Timed warm rounds (after one cold round and one untimed warm round).
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// Demand noise of the reports, in percent of each unit's configured demand.
    #[arg(long, default_value_t = 5.0)]
    pub noise: f64,
    /// Skip persisting (to time the rest alone).
    #[arg(long)]
    pub no_persist: bool,
    /// Map versions the store keeps (the service's `maps_kept`; the older ones are deltas).
    #[arg(long, default_value_t = 4)]
    pub maps_kept: usize,
    /// Rounds with the service's `[second_chance] mode = "beyond-lists"` (at its default
    /// bound): overflow placed at the nearest clusters with room beyond the units' lists, its
    /// cost inside the solve's part.
    #[arg(long)]
    pub beyond_lists: bool,
}

const PARTS: [&str; 7] = [
    "estimator",
    "effective preferences",
    "solve",
    "index",
    "publish",
    "persist",
    "total",
];

/// The reports of the round before round `r`: every unit, its demand with `noise` percent of
/// noise (none before the first round).
fn observations(
    base: &Topology,
    r: usize,
    noise: f64,
    rng: &mut ChaCha8Rng,
    round_ms: i64,
) -> Observations {
    Observations {
        at_unix_ms: (r as i64 - 1) * round_ms,
        demand: {
            let mut d = UnitDemand::new(base);
            if r > 0 {
                for u in 0..base.unit_count() as UnitIdx {
                    let x = 1.0 + noise / 100.0 * rng.random_range(-1.0..1.0);
                    d.add(u, base.unit_demand(u) * x);
                }
            }
            d
        },
        loads: Vec::new(),
        rtt: Vec::new(),
    }
}

/// Writes the record of `s` with its estimator entry (its base the stored topology, with no
/// edit journaled), as the service does while the map is indexed; returns the time it took,
/// encoding the entry included.
fn persist(
    store: &Store,
    maps_kept: usize,
    estimates: &Estimates,
    s: &Solved,
    observations: &Observations,
) -> Result<f64> {
    let t = Instant::now();
    let entry = estimates.round_entry(observations.at_unix_ms, &observations.demand);
    store.put_served(
        &ServedRef {
            epoch: 1,
            version: s.version,
            solved_at_unix_ms: s.solved_at_unix_ms,
            base_seq: 0,
            instance: &s.topology,
            map: &s.map,
            round_entry: &entry,
        },
        maps_kept,
    )?;
    Ok(ms(t))
}

/// The estimator's checkpoint, as the service writes it every
/// [`cdnmap_api::service::CHECKPOINT_ROUNDS`] rounds off the round: (encode ms, write ms,
/// bytes).
/// Encoding is the state streamed to its unsynced file (what the service does under the
/// driver's lock), writing the sync and rename after it.
fn checkpoint(store: &Store, driver: &Driver, version: u64) -> Result<(f64, f64, usize)> {
    let t = Instant::now();
    let pending = store.write_checkpoint(version, |w| driver.estimates().write_to(w))?;
    let (encode_ms, bytes) = (ms(t), pending.bytes() as usize);
    let t = Instant::now();
    pending.commit()?;
    Ok((encode_ms, ms(t), bytes))
}

/// One round's line: its parts' times and its churn.
fn print_round(r: usize, parts: &[f64; 7], churn: Option<f64>) {
    let kind = if r == 0 { "cold" } else { "warm" };
    println!(
        "round {r:>3} ({kind})  {}  churn {:.3}%",
        PARTS
            .iter()
            .zip(parts)
            .map(|(p, v)| format!("{p} {v:.0} ms"))
            .collect::<Vec<_>>()
            .join(", "),
        100.0 * churn.unwrap_or(0.0)
    );
}

/// The median and max of each part over the timed warm rounds.
fn print_medians(times: &[[f64; 7]], units: usize) {
    println!(
        "warm rounds    {} timed (after a cold and an untimed warm round), reports for all {} map units each",
        times.len(),
        units
    );
    for (i, part) in PARTS.iter().enumerate() {
        let mut v: Vec<f64> = times.iter().map(|t| t[i]).collect();
        v.sort_by(f64::total_cmp);
        println!(
            "  {part:<22} median {:>8.1} ms   max {:>8.1} ms",
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
}

/// Baselines from before the estimator edited columns and the store wrote columns, measured
/// once in the same run on the last round's instance: the rebuild through the file form that
/// `Estimates::apply` did every round, and the JSON the store wrote every round. Then the base
/// topology as the store keeps it (the compact form) against the JSON instance file it kept
/// before: size, encoding and decoding (what a restart reads).
fn print_baselines(s: &Snapshot, base: &Topology) -> Result<()> {
    let limits = cdnmap_mapper::Limits::default();
    let t = Instant::now();
    let compact = cdnmap_topology::compact::encode(base);
    let compact_encode_ms = ms(t);
    let t = Instant::now();
    let back = cdnmap_topology::compact::decode(&compact, limits)?;
    let compact_decode_ms = ms(t);
    ensure!(
        back == *base,
        "the compact topology did not decode to the base"
    );
    drop(back);
    println!(
        "base topology  compact {:.0} MB, encode {compact_encode_ms:.0} ms, decode {compact_decode_ms:.0} ms",
        compact.len() as f64 / 1e6,
    );
    drop(compact);
    if base.unit_count() > JSON_BASELINE_MAX_UNITS {
        // At 11 M units the JSON instance alone is about 8 GB, and parsing it back took the
        // process past the machine's 24 GB.
        println!(
            "baselines      JSON left out above {JSON_BASELINE_MAX_UNITS} map units (JSON files are for small worlds)"
        );
        return Ok(());
    }
    let t = Instant::now();
    let rebuilt = cdnmap_topology::format::InstanceFile::of(&s.topology).build(limits)?;
    let rebuild_ms = ms(t);
    drop(std::hint::black_box(rebuilt));
    let t = Instant::now();
    let mut json = Vec::new();
    cdnmap_topology::format::write_instance(&s.topology, &mut json)?;
    cdnmap_topology::format::write_assignment(&s.topology, &s.map, &s.version, &mut json)?;
    let json_ms = ms(t);
    println!(
        "baselines      the old estimator's rebuild through the file form {rebuild_ms:.0} ms; \
         encoding the round's instance and map as JSON (the old served record) {json_ms:.0} ms, {:.0} MB",
        json.len() as f64 / 1e6
    );
    drop(json);
    let t = Instant::now();
    let mut json = Vec::new();
    cdnmap_topology::format::write_instance(base, &mut json)?;
    let json_encode_ms = ms(t);
    let t = Instant::now();
    let back = cdnmap_topology::format::parse_instance(&json, limits)?;
    let json_decode_ms = ms(t);
    drop(std::hint::black_box(back));
    println!(
        "base topology  JSON (before) {:.0} MB, encode {json_encode_ms:.0} ms, parse {json_decode_ms:.0} ms",
        json.len() as f64 / 1e6
    );
    Ok(())
}

/// The largest world whose JSON baselines [`print_baselines`] measures.
const JSON_BASELINE_MAX_UNITS: usize = 2_000_000;

pub fn round(a: &RoundBenchArgs) -> Result<std::process::ExitCode> {
    ensure!(a.rounds >= 1, "--rounds must be at least 1");
    ensure!(
        a.noise.is_finite() && (0.0..=50.0).contains(&a.noise),
        "--noise {}: must be in [0, 50]",
        a.noise
    );
    let base = a.world.generate()?;
    let dir = tempfile::Builder::new()
        .prefix("cdnmap-bench-round-")
        .tempdir()
        .context("a temporary store")?;
    let store = Store::open(dir.path())?;
    if !a.no_persist {
        // The service's first start stores the topology once; every record names it.
        let t = Instant::now();
        store.put_topology(&base)?;
        println!("topology       stored in {:.1} ms", ms(t));
    }
    let mut driver = driver_for(a, &base)?;
    let default_class = base
        .classes()
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let policies = vec![Default::default(); base.clusters().len()];
    let loads = ServerLoads::default();
    let mut rng = ChaCha8Rng::seed_from_u64(a.world.seed ^ 0x5eed);
    let mut previous: Option<Snapshot> = None;
    let mut times: Vec<[f64; 7]> = Vec::new();
    let mut checkpoints = Vec::new();
    let round_ms = 10_000i64;
    alloc::reset_peak();
    let live_before = alloc::live_bytes();
    for r in 0..a.rounds + 2 {
        let observations = observations(&base, r, a.noise, &mut rng, round_ms);
        let t = Instant::now();
        let (step, persisted) = driver
            .step_alongside(
                &base,
                previous.as_ref(),
                None,
                &observations,
                |i| ClassRules::for_instance(i, &[], &default_class),
                1,
                r as i64 * round_ms,
                |solved, estimates| {
                    (!a.no_persist)
                        .then(|| persist(&store, a.maps_kept, estimates, solved, &observations))
                },
            )
            .context("a round")?;
        let persist_ms = persisted.transpose()?.unwrap_or(0.0);
        let driver_ms = ms(t);
        let s = step.snapshot;
        let t = Instant::now();
        let servers = selection::build(s.resolver.map().clusters(), &policies, &loads, &[])?;
        std::hint::black_box(&servers);
        let publish_ms = ms(t);
        // The service writes its first checkpoint after the first round with observations;
        // here, after the last timed round too (the one the store then restarts from).
        if !a.no_persist && (r == 1 || r == a.rounds + 1) {
            checkpoints.push(checkpoint(&store, &driver, s.version)?);
        }
        let parts = [
            step.timings.estimate_ms,
            s.timings.effective_ms,
            s.timings.solve_ms,
            s.timings.index_ms,
            publish_ms,
            persist_ms,
            driver_ms + publish_ms,
        ];
        print_round(r, &parts, s.churn);
        if r >= 2 {
            times.push(parts);
        }
        previous = Some(s);
    }
    print_medians(&times, base.unit_count());
    print_overflow_checkpoints_memory(a, previous.as_ref(), &checkpoints, live_before);
    let size: u64 = walk_size(dir.path());
    println!("store          {:.1} MB on disk", size as f64 / 1e6);
    if !a.no_persist {
        print_records(&store)?;
    }
    // After the rounds' figures: the baselines' JSON is not the rounds' memory.
    if let Some(s) = &previous {
        print_baselines(s, &base)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The round driver the service runs (stickiness, the verifier on), with the second chance
/// beyond the lists when asked for.
fn driver_for(a: &RoundBenchArgs, base: &Topology) -> Result<Driver> {
    let estimates = Estimates::new(base).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut driver = Driver::new(estimates, Stickiness::default(), true, false);
    if a.beyond_lists {
        driver = driver
            .with_second_chance(cdnmap_engine::round::RoundChance::beyond_lists_at_default_bound());
    }
    Ok(driver)
}

/// The last round's overflow, each checkpoint's cost, and the peak live heap.
fn print_overflow_checkpoints_memory(
    a: &RoundBenchArgs,
    previous: Option<&Snapshot>,
    checkpoints: &[(f64, f64, usize)],
    live_before: usize,
) {
    if let Some(s) = previous {
        println!(
            "overflow       {:.3}% of the last round's demand (second chance: {})",
            100.0 * s.map.total_overflow() / s.topology.total_demand().max(f64::MIN_POSITIVE),
            if a.beyond_lists {
                "beyond the lists"
            } else {
                "off"
            }
        );
    }
    for (encode_ms, write_ms, bytes) in checkpoints {
        println!(
            "checkpoint     the estimator's whole state, {:.0} MB: encode {encode_ms:.0} ms, write {write_ms:.0} ms \
             (off the round, at most every {} rounds)",
            *bytes as f64 / 1e6,
            cdnmap_api::service::CHECKPOINT_ROUNDS
        );
    }
    if alloc::installed() {
        println!(
            "memory         peak {:.0} MB live heap above the {:.0} MB before the rounds",
            alloc::peak_bytes().saturating_sub(live_before) as f64 / 1e6,
            live_before as f64 / 1e6
        );
    }
}

/// The kept map versions' sizes on disk: the served record (whole) and the older ones (deltas
/// against the next).
fn print_records(store: &Store) -> Result<()> {
    let versions = store.maps().versions()?;
    let mb = |b: u64| b as f64 / 1e6;
    let (mut deltas, mut wholes) = (Vec::new(), Vec::new());
    for v in &versions {
        match v.kind {
            RecordKind::Whole => wholes.push((v.bytes, v.value_bytes)),
            RecordKind::Delta { .. } => deltas.push((v.bytes, v.value_bytes)),
        }
    }
    deltas.sort_unstable();
    if let Some((bytes, raw)) = wholes.last() {
        println!(
            "records        {} kept; the served one whole: {:.2} MB on disk ({:.2} MB before zstd)",
            versions.len(),
            mb(*bytes),
            mb(*raw)
        );
    }
    if let (Some(mid), Some(max)) = (deltas.get(deltas.len() / 2), deltas.last()) {
        println!(
            "               {} older ones as deltas: median {:.2} MB on disk ({:.2} MB before zstd), max {:.2} MB",
            deltas.len(),
            mb(mid.0),
            mb(mid.1),
            mb(max.0)
        );
    }
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn walk_size(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => walk_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
