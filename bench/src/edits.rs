//! `cdnmap bench edits`: what an operator's topology edits cost the running mapper, in process,
//! through the service's own code (`Shared`: the topology writer, the store, the rounds). On a
//! demo world it starts the service on a fresh store (the topology stored, a cold round),
//! then carries out `--edits` cluster-state changes (drain, then undrain, of clusters taken in
//! turn: the operator's most frequent edit), a round after every `--edits-per-round` of them
//! as the loop would run one every cycle, then `--cluster-edits` upserts of a cluster (its
//! capacity changed), as many clusters added and deleted again, and `--unit-edits` upserts of
//! a map unit (its demand changed). It prints
//! each kind's acknowledgement time (median and maximum: the time an Admin call waits), the
//! rounds' persist, the store's size on disk after all of it, and the time a restart on that
//! store takes to serve (the stored topology with every edit, the served map), checked to hold
//! every edit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use cdnmap_api::config::Config;
use cdnmap_api::service::Shared;
use cdnmap_api::topology::Actor;
use cdnmap_api::topology::Change;
use cdnmap_mapper::ClusterState;
use cdnmap_topology::format::{cluster_file, unit_file, ResourcesFile};
use cdnmap_topology::Topology;
use clap::Args;

use crate::solve::BenchWorld;

#[derive(Args, Debug)]
pub struct EditsBenchArgs {
    #[command(flatten)]
    pub world: BenchWorld,
    /// Cluster-state changes (drain, undrain, ...), acknowledged one after the other.
    #[arg(long, default_value_t = 200)]
    pub edits: usize,
    /// A round (solve, publish, persist) after every this many cluster-state changes.
    #[arg(long, default_value_t = 4)]
    pub edits_per_round: usize,
    /// Cluster upserts (a cluster's capacity changed) after the state changes, then as many
    /// clusters added and deleted again.
    #[arg(long, default_value_t = 3)]
    pub cluster_edits: usize,
    /// Map-unit upserts (a unit's demand changed), after the cluster upserts.
    #[arg(long, default_value_t = 3)]
    pub unit_edits: usize,
    /// Map versions the store keeps (the service's `maps_kept`).
    #[arg(long, default_value_t = 64)]
    pub maps_kept: usize,
    /// The store's directory (kept after the run); a temporary one when not given.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::NAN, f64::max)
}

fn line(what: &str, xs: &mut [f64]) {
    if xs.is_empty() {
        println!("{what:<28} (none)");
        return;
    }
    let m = max(xs);
    println!(
        "{what:<28} median {:>9.2} ms   max {:>9.2} ms   ({} of them)",
        median(xs),
        m,
        xs.len()
    );
}

pub fn edits(a: &EditsBenchArgs) -> Result<std::process::ExitCode> {
    ensure!(
        a.edits_per_round >= 1,
        "--edits-per-round must be at least 1"
    );
    ensure!(
        (1..=1024).contains(&a.maps_kept),
        "--maps-kept must be within 1..=1024"
    );
    trace_to_stderr();
    let world = a.world.generate()?;
    let units = world.unit_count();
    let clusters = world.clusters().len();
    ensure!(
        clusters >= 2 && units >= 1,
        "the world needs 2 clusters and a map unit"
    );
    let temp;
    let dir = match &a.data_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir().context("a temporary store directory")?;
            temp.path().join("data")
        }
    };
    ensure!(
        !dir.exists() || std::fs::read_dir(&dir)?.next().is_none(),
        "--data-dir {} is not empty: the bench starts on a fresh store",
        dir.display()
    );
    let config = Config {
        data_dir: dir.clone(),
        maps_kept: a.maps_kept,
        ..Config::default()
    };
    let mut m = Measured::default();
    let rt = runtime()?;
    let enter = rt.enter();

    // The first start: the topology stored, a cold round.
    let t = Instant::now();
    let initial = world.clone();
    let shared = Shared::start(config.clone(), move || Ok(initial))?;
    m.first_start_ms = ms_since(t);
    let t = Instant::now();
    rt.block_on(shared.run_round());
    m.cold_round_ms = ms_since(t);
    m.after_first = crate::serve::dir_size(&dir);

    let expected = state_edits(a, &rt, &shared, &world, &mut m)?;
    cluster_edits(a, &rt, &shared, &world, &mut m)?;
    unit_edits(a, &rt, &shared, units, &mut m)?;
    let t = Instant::now();
    rt.block_on(shared.run_round());
    m.round_ms.push(ms_since(t));
    let live = shared.topology_now();
    shared.stop();
    // As a stop does: the snapshot in progress (if any) finishes before the store lets go.
    rt.block_on(shared.snapshot_written(std::time::Duration::from_secs(600)));
    shared.flush()?;
    m.version = shared.current().map(|s| s.version);
    // Every task holding the store (the topology writer's) ends with the runtime, so the
    // restart can open it.
    drop(shared);
    drop(enter);
    rt.shutdown_timeout(std::time::Duration::from_secs(30));
    m.store_bytes = crate::serve::dir_size(&dir);

    restart(config, &live, &expected, &mut m)?;
    print(a, &mut m);
    Ok(std::process::ExitCode::SUCCESS)
}

/// What the benchmark measured: times in milliseconds, the store's sizes in bytes.
#[derive(Default)]
struct Measured {
    first_start_ms: f64,
    cold_round_ms: f64,
    /// The store after the first round.
    after_first: u64,
    state_ms: Vec<f64>,
    round_ms: Vec<f64>,
    cluster_ms: Vec<f64>,
    add_delete_ms: Vec<f64>,
    unit_ms: Vec<f64>,
    /// The store after every edit and round.
    store_bytes: u64,
    restart_ms: f64,
    estimator_ms: f64,
    /// The map version served when the service stopped.
    version: Option<u64>,
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The service's own lines that say where a start's and a snapshot's time went (the stored
/// map served, with its parts; a snapshot stored), on stderr; RUST_LOG overrides.
fn trace_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,cdnmap_api::service=info,cdnmap_api::topology=info",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("a tokio runtime")
}

fn actor() -> Actor {
    Actor::new(Some("bench"), None, "bench")
}

/// Cluster states: drain cluster i, then set it up again, taking clusters in turn, a round
/// after every `--edits-per-round`. Returns the state each cluster is left in.
fn state_edits(
    a: &EditsBenchArgs,
    rt: &tokio::runtime::Runtime,
    shared: &Arc<Shared>,
    world: &Topology,
    m: &mut Measured,
) -> Result<Vec<ClusterState>> {
    let clusters = world.clusters().len();
    let mut expected = vec![ClusterState::Up; clusters];
    for e in 0..a.edits {
        let c = (e / 2) % clusters;
        let state = if e % 2 == 0 {
            ClusterState::Drained
        } else {
            ClusterState::Up
        };
        let id = world.clusters()[c].id.clone();
        let t = Instant::now();
        rt.block_on(shared.set_cluster_state(&id, state, "bench", actor()))
            .with_context(|| format!("setting cluster {id} {state:?}"))?;
        m.state_ms.push(ms_since(t));
        expected[c] = state;
        if (e + 1) % a.edits_per_round == 0 {
            let t = Instant::now();
            rt.block_on(shared.run_round());
            m.round_ms.push(ms_since(t));
        }
    }
    Ok(expected)
}

/// Cluster upserts (a cluster's capacity raised by 1%), then as many clusters added (a copy
/// of one under a new id) and deleted again: each renumbers the candidates of the clusters
/// after it.
fn cluster_edits(
    a: &EditsBenchArgs,
    rt: &tokio::runtime::Runtime,
    shared: &Arc<Shared>,
    world: &Topology,
    m: &mut Measured,
) -> Result<()> {
    let clusters = world.clusters().len();
    for e in 0..a.cluster_edits {
        let now = shared.topology_now();
        let c = (e * 7 + 1) % clusters;
        let mut file = cluster_file(&now, c as cdnmap_mapper::model::ClusterIdx);
        if let ResourcesFile::Nested(root) = &mut file.resources {
            root.capacity *= 1.01;
        }
        let t = Instant::now();
        rt.block_on(shared.change(Change::UpsertCluster(file)))
            .with_context(|| format!("upserting cluster {}", world.clusters()[c].id))?;
        m.cluster_ms.push(ms_since(t));
    }
    for e in 0..a.cluster_edits {
        let now = shared.topology_now();
        let c = (e * 11 + 3) % clusters;
        let mut file = cluster_file(&now, c as cdnmap_mapper::model::ClusterIdx);
        file.id = format!("{}-bench{e}", file.id);
        let id = file.id.clone();
        let t = Instant::now();
        rt.block_on(shared.change(Change::UpsertCluster(file)))
            .with_context(|| format!("adding cluster {id}"))?;
        m.add_delete_ms.push(ms_since(t));
        let t = Instant::now();
        rt.block_on(shared.change(Change::DeleteCluster(id.clone())))
            .with_context(|| format!("deleting cluster {id}"))?;
        m.add_delete_ms.push(ms_since(t));
    }
    Ok(())
}

/// Map-unit upserts: a unit's demand raised by 1%.
fn unit_edits(
    a: &EditsBenchArgs,
    rt: &tokio::runtime::Runtime,
    shared: &Arc<Shared>,
    units: usize,
    m: &mut Measured,
) -> Result<()> {
    for e in 0..a.unit_edits {
        let now = shared.topology_now();
        let u = ((e as u64 * 7_919 + 13) % units as u64) as cdnmap_mapper::UnitIdx;
        let mut file = unit_file(&now, u);
        file.demand *= 1.01;
        let t = Instant::now();
        rt.block_on(shared.change(Change::UpsertMapUnit(file)))
            .context("upserting a map unit")?;
        m.unit_ms.push(ms_since(t));
    }
    Ok(())
}

/// The restart: the stored topology (every edit, checked against `live` and `expected`) and
/// the served map (checked to be the version served before).
fn restart(
    config: Config,
    live: &Topology,
    expected: &[ClusterState],
    m: &mut Measured,
) -> Result<()> {
    let rt = runtime()?;
    let _enter = rt.enter();
    let t = Instant::now();
    let restarted = Shared::start(config, || anyhow::bail!("the store has a topology"))?;
    m.restart_ms = ms_since(t);
    rt.block_on(restarted.estimator_restored());
    m.estimator_ms = ms_since(t);
    let stored = restarted.topology_now();
    ensure!(
        *stored == *live,
        "the restarted service's topology differs from the one the edits left"
    );
    for (c, want) in expected.iter().enumerate() {
        ensure!(
            stored.clusters()[c].state == *want,
            "cluster {} is {:?} after the restart, not {want:?}",
            stored.clusters()[c].id,
            stored.clusters()[c].state
        );
    }
    let version = m.version;
    ensure!(
        restarted.current().map(|s| s.version) == version,
        "the restart serves version {:?}, not the stored {version:?}",
        restarted.current().map(|s| s.version)
    );
    Ok(())
}

fn print(a: &EditsBenchArgs, m: &mut Measured) {
    let (first_start_ms, cold_round_ms) = (m.first_start_ms, m.cold_round_ms);
    println!(
        "first start (topology stored) {first_start_ms:>9.1} ms; cold round {cold_round_ms:.1} ms"
    );
    line("cluster state, ack", &mut m.state_ms);
    line("cluster upsert, ack", &mut m.cluster_ms);
    line("cluster add / delete, ack", &mut m.add_delete_ms);
    line("map-unit upsert, ack", &mut m.unit_ms);
    line("round (with persist)", &mut m.round_ms);
    println!(
        "store on disk                after the first round {:.1} MB; after {} edits and {} rounds {:.1} MB (maps_kept {})",
        m.after_first as f64 / 1e6,
        a.edits + 3 * a.cluster_edits + a.unit_edits,
        m.round_ms.len() + 1,
        m.store_bytes as f64 / 1e6,
        a.maps_kept
    );
    let (restart_ms, estimator_ms) = (m.restart_ms, m.estimator_ms);
    println!(
        "restart                      {restart_ms:.1} ms to serve version {} with every edit (checked); the estimator restored beside it at {estimator_ms:.1} ms",
        m.version.unwrap_or(0)
    );
    let peak = crate::alloc::peak_bytes();
    println!("peak live heap               {:.1} MB", peak as f64 / 1e6);
}
