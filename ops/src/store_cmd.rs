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
    let Some(served) = maps.get(version)? else {
        let kept: Vec<String> = maps
            .versions()?
            .iter()
            .map(|v| v.version.to_string())
            .collect();
        bail!(
            "map version {version} is not stored in {} (kept: {})",
            a.store.data_dir.display(),
            if kept.is_empty() {
                "none".to_string()
            } else {
                kept.join(", ")
            }
        );
    };
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
    }
}
