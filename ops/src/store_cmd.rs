//! `cdnmap store list|dump`: the map versions a store keeps, read from its value files alone,
//! so both work beside a running `cdnmap serve` (which holds sled's lock) as well as on a
//! stopped one's directory. `dump` writes a version in the JSON assignment format (and, with
//! `--instance`, the instance it was solved for), which `cdnmap verify` checks.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use cdnmap_store::{RecordKind, StoredMaps};
use cdnmap_topology::format::{write_assignment, write_instance};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::io::write_atomically;

#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// List the stored map versions: epoch, version, when solved, topology, how each is kept
    /// (whole, or a delta against a newer version), its file's size and its bytes before
    /// compression.
    List(StoreArgs),
    /// Write a stored map version in the JSON assignment format (the newest without
    /// --version), to standard output or --out.
    Dump(DumpArgs),
    /// Compare two stored map versions: the demand the newer places where the older did not,
    /// between which clusters it moved, and which map units' answers changed (units and
    /// clusters matched by id, so the versions may be of different topologies).
    Diff(DiffArgs),
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The older version.
    pub from: u64,
    /// The newer version (default: the newest).
    pub to: Option<u64>,
    /// How many of the largest flows (moved demand by cluster pair) to show.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub flows: u32,
    /// How many of the changed units (most demand moved first) to show.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub units: u32,
}

#[derive(Args, Debug)]
pub struct StoreArgs {
    /// The store's directory (the configuration's `data_dir`).
    #[arg(long, default_value = "cdnmap-data")]
    pub data_dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The version to write (default: the newest).
    #[arg(long)]
    pub version: Option<u64>,
    /// Write the assignment here instead of standard output.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the instance the version was solved for (its demands, learned coefficients
    /// and derated capacities) here, as a JSON instance file.
    #[arg(long)]
    pub instance: Option<PathBuf>,
}

/// The assignment's summary: which version of which start it is.
#[derive(Debug, Serialize)]
struct DumpSummary {
    epoch: u64,
    version: u64,
    solved_at_unix_ms: i64,
}

pub fn run(command: &StoreCommand) -> Result<ExitCode> {
    match command {
        StoreCommand::List(a) => list(a),
        StoreCommand::Dump(a) => dump(a),
        StoreCommand::Diff(a) => diff(a),
    }
}

fn open(a: &StoreArgs) -> Result<StoredMaps> {
    StoredMaps::open(&a.data_dir).with_context(|| format!("the store at {}", a.data_dir.display()))
}

fn list(a: &StoreArgs) -> Result<ExitCode> {
    let versions = open(a)?.versions()?;
    if versions.is_empty() {
        println!("no stored map versions in {}", a.data_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>8} {:>10} {:>24} {:>10} {:>12} {:>12} {:>14}",
        "epoch", "version", "solved at (Unix ms)", "topology", "kept as", "bytes", "uncompressed"
    );
    for v in &versions {
        let kind = match v.kind {
            RecordKind::Whole => "whole".to_string(),
            RecordKind::Delta { against } => format!("delta->{against}"),
        };
        println!(
            "{:>8} {:>10} {:>24} {:>10} {:>12} {:>12} {:>14}",
            v.epoch,
            v.version,
            v.solved_at_unix_ms,
            v.base_generation,
            kind,
            v.bytes,
            v.value_bytes
        );
    }
    let total: u64 = versions.iter().map(|v| v.bytes).sum();
    println!(
        "{} versions, {total} bytes on disk ({} whole)",
        versions.len(),
        versions
            .iter()
            .filter(|v| v.kind == RecordKind::Whole)
            .count()
    );
    Ok(ExitCode::SUCCESS)
}

fn dump(a: &DumpArgs) -> Result<ExitCode> {
    let maps = open(&a.store)?;
    let version = match a.version {
        Some(v) => v,
        None => match maps.newest()? {
            Some(v) => v,
            None => bail!("no stored map versions in {}", a.store.data_dir.display()),
        },
    };
    let served = get(&maps, &a.store, version)?;
    let summary = DumpSummary {
        epoch: served.epoch,
        version: served.version,
        solved_at_unix_ms: served.solved_at_unix_ms,
    };
    if let Some(path) = &a.instance {
        write_atomically(path, |w| Ok(write_instance(&served.topology, w)?))?;
        eprintln!("instance       {}", path.display());
    }
    match &a.out {
        Some(path) => {
            write_atomically(path, |w| {
                Ok(write_assignment(
                    &served.topology,
                    &served.map,
                    &summary,
                    w,
                )?)
            })?;
            eprintln!(
                "assignment     {} (epoch {}, version {})",
                path.display(),
                served.epoch,
                served.version
            );
        }
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            write_assignment(&served.topology, &served.map, &summary, &mut out)?;
            writeln!(out)?;
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Stored version `version`, or an error naming the versions kept.
fn get(maps: &StoredMaps, a: &StoreArgs, version: u64) -> Result<cdnmap_store::Served> {
    if let Some(served) = maps.get(version)? {
        return Ok(served);
    }
    let kept: Vec<String> = maps
        .versions()?
        .iter()
        .map(|v| v.version.to_string())
        .collect();
    bail!(
        "map version {version} is not stored in {} (kept: {})",
        a.data_dir.display(),
        if kept.is_empty() {
            "none".to_string()
        } else {
            kept.join(", ")
        }
    );
}

fn diff(a: &DiffArgs) -> Result<ExitCode> {
    let maps = open(&a.store)?;
    let to = match a.to {
        Some(v) => v,
        None => maps
            .newest()?
            .with_context(|| format!("no stored map versions in {}", a.store.data_dir.display()))?,
    };
    let (old, new) = (get(&maps, &a.store, a.from)?, get(&maps, &a.store, to)?);
    let d = cdnmap_mapper::diff::diff(
        (&old.topology, &old.map),
        (&new.topology, &new.map),
        a.units as usize,
    );
    print!("{}", diff_report(&d, (a.from, to), a.flows as usize));
    Ok(ExitCode::SUCCESS)
}

/// What `cdnmap store diff` prints of `d`, versions `from` and `to`, its `flows` largest flows.
fn diff_report(d: &cdnmap_mapper::diff::MapDiff, (from, to): (u64, u64), flows: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "map version {from} -> {to}: {:.1} of {:.1} demand moved ({:.3}%), {} of {} map units changed ({} added, {} removed)",
        d.moved,
        d.demand,
        100.0 * d.moved_share(),
        d.units_changed,
        d.units_compared,
        d.units_added,
        d.units_removed
    );
    if !d.flows.is_empty() {
        let shown = d.flows.len().min(flows);
        let _ = writeln!(
            out,
            "\nmoved demand by cluster pair ({shown} largest of {}):",
            d.flows.len()
        );
        let _ = writeln!(
            out,
            "{:>24} {:>24} {:>12} {:>8}",
            "from", "to", "demand", "share"
        );
        for f in &d.flows[..shown] {
            let _ = writeln!(
                out,
                "{:>24} {:>24} {:>12.2} {:>7.2}%",
                f.from,
                f.to,
                f.demand,
                100.0 * f.demand / d.moved.max(f64::MIN_POSITIVE)
            );
        }
    }
    if !d.changed.is_empty() {
        let _ = writeln!(
            out,
            "\nunits whose answers changed (most moved first, {} shown):",
            d.changed.len()
        );
        for (id, moved) in &d.changed {
            let _ = writeln!(out, "{id:>32} {moved:>12.2}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_estimator::demand_code;
    use cdnmap_mapper::{solve, SolveOptions};
    use cdnmap_store::{ServedRef, Store};
    use cdnmap_topology::Topology;
    use cdnmap_world::world::WorldParams;

    /// Round `r`'s instance on `world` (forecasts as code values moving every round, one unit
    /// in ten at its configured demand) and its solved map.
    fn round(world: &Topology, r: u64) -> (Topology, cdnmap_mapper::Map) {
        let demands = (0..world.unit_count() as u32)
            .map(|u| {
                let d = world.unit_demand(u);
                if u % 10 == 0 {
                    d
                } else {
                    demand_code::round(d * (1.0 + 0.01 * ((u as u64 * 7 + r) % 11) as f64))
                }
            })
            .collect();
        let instance = world.with_instance(world.with_demands(demands).expect("demands"));
        let map = solve(&instance, &SolveOptions::default()).map;
        (instance, map)
    }

    /// `cdnmap store dump --version V` of a version kept as a delta writes exactly the
    /// assignment and the instance of what was solved and put, as it does for the whole one;
    /// `list` shows the deltas.
    #[test]
    fn dumping_an_old_version_gives_exactly_what_was_solved() {
        let dir = tempfile::tempdir().expect("tempdir");
        let world = crate::io::generate_world(&WorldParams {
            map_units: 400,
            clusters: 12,
            seed: 3,
            ..WorldParams::default()
        })
        .expect("world");
        let store = Store::open(dir.path()).expect("open");
        store.put_topology(&world).expect("topology");
        let rounds: Vec<(Topology, cdnmap_mapper::Map)> =
            (1..=5).map(|r| round(&world, r)).collect();
        for (r, (instance, map)) in rounds.iter().enumerate() {
            let version = r as u64 + 1;
            store
                .put_served(
                    &ServedRef {
                        epoch: 2,
                        version,
                        solved_at_unix_ms: 100 * version as i64,
                        base_seq: 0,
                        instance,
                        map,
                        round_entry: b"",
                    },
                    64,
                )
                .expect("put");
        }
        let kinds: Vec<RecordKind> = StoredMaps::open(dir.path())
            .expect("open")
            .versions()
            .expect("list")
            .iter()
            .map(|v| v.kind)
            .collect();
        assert_eq!(
            kinds,
            [2, 3, 4, 5]
                .map(|against| RecordKind::Delta { against })
                .into_iter()
                .chain([RecordKind::Whole])
                .collect::<Vec<_>>()
        );
        let store_args = StoreArgs {
            data_dir: dir.path().to_path_buf(),
        };
        assert_eq!(
            list(&store_args).expect("list"),
            ExitCode::SUCCESS,
            "listed"
        );
        for (r, (instance, map)) in rounds.iter().enumerate() {
            let version = r as u64 + 1;
            let (out, inst) = (dir.path().join("a.json"), dir.path().join("i.json"));
            dump(&DumpArgs {
                store: StoreArgs {
                    data_dir: dir.path().to_path_buf(),
                },
                version: Some(version),
                out: Some(out.clone()),
                instance: Some(inst.clone()),
            })
            .expect("dump");
            let summary = DumpSummary {
                epoch: 2,
                version,
                solved_at_unix_ms: 100 * version as i64,
            };
            let mut want = Vec::new();
            write_assignment(instance, map, &summary, &mut want).expect("assignment");
            assert!(
                std::fs::read(&out).expect("read") == want,
                "version {version}: the dumped assignment"
            );
            let mut want = Vec::new();
            write_instance(instance, &mut want).expect("instance");
            assert!(
                std::fs::read(&inst).expect("read") == want,
                "version {version}: the dumped instance"
            );
        }
        // `diff` of two stored versions (deltas and the whole record) is the diff of the maps
        // that were solved and put.
        let maps = open(&store_args).expect("open");
        for (from, to) in [(1u64, 5u64), (2, 4), (3, 3)] {
            let (old, new) = (
                get(&maps, &store_args, from).expect("stored"),
                get(&maps, &store_args, to).expect("stored"),
            );
            let (a, b) = (&rounds[from as usize - 1], &rounds[to as usize - 1]);
            let want = cdnmap_mapper::diff::diff((&a.0, &a.1), (&b.0, &b.1), 10);
            let got =
                cdnmap_mapper::diff::diff((&old.topology, &old.map), (&new.topology, &new.map), 10);
            assert_eq!(got, want, "{from} -> {to}");
            assert_eq!(want.units_compared, 400);
            assert_eq!(want.moved == 0.0, from == to, "{from} -> {to}: {want:?}");
            let report = diff_report(&got, (from, to), 5);
            assert!(
                report.starts_with(&format!("map version {from} -> {to}: ")),
                "{report}"
            );
        }
        let args = |from, to| DiffArgs {
            store: StoreArgs {
                data_dir: dir.path().to_path_buf(),
            },
            from,
            to,
            flows: 5,
            units: 5,
        };
        assert_eq!(diff(&args(1, None)).expect("diff"), ExitCode::SUCCESS);
        let e = diff(&args(9, Some(5))).expect_err("not stored").to_string();
        assert!(
            e.contains("map version 9 is not stored") && e.contains("kept: 1, 2, 3, 4, 5"),
            "{e}"
        );
    }
}
