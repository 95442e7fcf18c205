//! `cdnmap store list|dump`: the map versions a store keeps, read from its value files alone,
//! so both work beside a running `cdnmap serve` (which holds sled's lock) as well as on a
//! stopped one's directory. `dump` writes a version in the JSON assignment format (and, with
//! `--instance`, the instance it was solved for), which `cdnmap verify` checks.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use cdnmap_api::store::StoredMaps;
use cdnmap_topology::format::{write_assignment, write_instance};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::io::write_atomically;

#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// List the stored map versions: epoch, version, when solved, topology, size.
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
        "{:>8} {:>10} {:>24} {:>10} {:>12}",
        "epoch", "version", "solved at (Unix ms)", "topology", "bytes"
    );
    for v in &versions {
        println!(
            "{:>8} {:>10} {:>24} {:>10} {:>12}",
            v.epoch, v.version, v.solved_at_unix_ms, v.base_generation, v.bytes
        );
    }
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
