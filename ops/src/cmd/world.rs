//! `cdnmap world` and `cdnmap import czf`: instance files generated or brought in, and the
//! shape of a generated world ([`WorldShape`]), an argument group `demo` shares.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use cdnmap_mapper::Limits;
use clap::{Args, Subcommand};

use crate::io::{check_writable, generate_world, progress, read_instance, write_atomically};
use cdnmap_world::synth;
use cdnmap_world::world::{self, WorldParams};

#[derive(Args, Debug, Clone)]
pub(crate) struct WorldShape {
    /// Number of map units (prefix × traffic class).
    #[arg(long, default_value_t = 30_000)]
    pub map_units: usize,
    /// Number of clusters, placed at real sites.
    #[arg(long, default_value_t = 120)]
    pub clusters: usize,
    /// Random seed: the same seed gives the same world.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// At most this many candidates per map unit.
    #[arg(long, default_value_t = WorldParams::default().candidates)]
    pub candidates: usize,
    /// At most this many of a map unit's candidates at one site.
    #[arg(long, default_value_t = WorldParams::default().max_per_site)]
    pub max_per_site: usize,
    /// Clusters farther than this RTT are not candidates.
    #[arg(long, default_value_t = WorldParams::default().max_rtt_ms)]
    pub max_rtt_ms: f64,
    /// Total capacity over total demand.
    #[arg(long, default_value_t = WorldParams::default().headroom)]
    pub headroom: f64,
}

impl WorldShape {
    pub(crate) fn params(&self) -> WorldParams {
        WorldParams {
            map_units: self.map_units,
            clusters: self.clusters,
            seed: self.seed,
            candidates: self.candidates,
            max_per_site: self.max_per_site,
            max_rtt_ms: self.max_rtt_ms,
            headroom: self.headroom,
        }
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum ImportCommand {
    /// An Apache Traffic Control coverage zone file (coverageZones, deepCoverageZones): every
    /// network becomes map units over the clusters of an instance, the group's cluster (from
    /// --groups) first and the others by distance from the zone's coordinates. Prints what
    /// it took, the groups --groups does not name and those it left out.
    Czf(CzfArgs),
}

#[derive(Args, Debug)]
pub(crate) struct CzfArgs {
    /// The coverage zone file (JSON).
    czf: PathBuf,
    /// An instance file whose clusters and classes the map units go over (its own map units
    /// are not taken).
    #[arg(long, value_name = "INSTANCE")]
    clusters: PathBuf,
    /// The mapping of each cache group to its cluster: a TOML file with a [groups] table,
    /// `"group" = "cluster-id"`.
    #[arg(long, value_name = "GROUPS.toml")]
    groups: PathBuf,
    /// The classes of each network's map units and their shares of its demand.
    #[arg(
        long,
        value_name = "CLASS=SHARE,...",
        default_value = "web=0.5,video=0.35,apps=0.15"
    )]
    class_mix: world::ClassMix,
    /// At most this many candidates per map unit.
    #[arg(long, default_value_t = WorldParams::default().candidates)]
    candidates: usize,
    /// Clusters farther than this RTT estimate are not candidates (the group's always is).
    #[arg(long, default_value_t = WorldParams::default().max_rtt_ms)]
    max_rtt_ms: f64,
    /// Where to write the instance.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "json")]
    format: crate::io::InstanceFormat,
}

/// The groups file of `import czf`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupsFile {
    groups: std::collections::BTreeMap<String, String>,
}

/// The largest coverage zone or groups file read (a full CDN's zone file is tens of MB).
const MAX_IMPORT_BYTES: u64 = 1 << 30;

pub(crate) fn read_bounded(path: &Path) -> Result<String> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if size > MAX_IMPORT_BYTES {
        bail!(
            "{}: {size} bytes, at most {MAX_IMPORT_BYTES}",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

pub(crate) fn cmd_import_czf(a: &CzfArgs) -> Result<ExitCode> {
    check_writable(&a.out)?;
    let zones = cdnmap_world::czf::parse(&read_bounded(&a.czf)?, &a.czf.display().to_string())?;
    let groups: GroupsFile = toml::from_str(&read_bounded(&a.groups)?)
        .with_context(|| format!("{}", a.groups.display()))?;
    let base = read_instance(&a.clusters, Limits::default())?;
    let params = cdnmap_world::czf::ZoneParams {
        mix: a.class_mix.clone(),
        candidates: a.candidates,
        max_rtt_ms: a.max_rtt_ms,
    };
    let (inst, report) = cdnmap_world::czf::world_of(&zones, &base, &groups.groups, &params)?;
    write_atomically(&a.out, |w| crate::io::write_instance_as(&inst, a.format, w))?;
    println!(
        "{report}\nwrote {}: {} map units, {} clusters, {} candidates",
        a.out.display(),
        inst.instance.unit_count(),
        inst.instance.clusters().len(),
        inst.instance.total_candidates()
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub(crate) struct WorldArgs {
    #[command(flatten)]
    shape: WorldShape,
    /// Write the same world with every demand and score multiplied by an independent factor
    /// in [1 - PCT/100, 1 + PCT/100].
    #[arg(long, value_name = "PCT")]
    perturb: Option<f64>,
    /// Seed of the perturbation (default: the world seed + 1).
    #[arg(long)]
    perturb_seed: Option<u64>,
    /// Where to write the instance.
    #[arg(long)]
    out: PathBuf,
    /// The instance file's format: JSON, or compact (the store's columns in a zstd frame with
    /// a checksum; every command that reads an instance reads either).
    #[arg(long, value_enum, default_value = "json")]
    format: crate::io::InstanceFormat,
    /// Also write a synthetic demand trace of this many hours (fractional allowed, at most
    /// 336) for the written world: a daily rhythm by time zone, noise, a flash crowd, a
    /// cluster failure and true costs above the configured ones (see docs/trace.md). Needs
    /// --out-trace.
    #[arg(long, value_name = "HOURS")]
    trace: Option<f64>,
    /// Where to write the trace (JSON Lines). Needs --trace.
    #[arg(long, value_name = "TRACE.jsonl")]
    out_trace: Option<PathBuf>,
    /// Seed of the trace (default: the world seed + 2).
    #[arg(long)]
    trace_seed: Option<u64>,
    /// The trace's round, in ms: one demand record per map unit per round (a longer round,
    /// a smaller trace: 60000 writes a sixth of the default's).
    #[arg(long, default_value_t = synth::DEFAULT_ROUND_MS, value_name = "MS")]
    trace_round_ms: i64,
    /// The most bytes the trace may take: a trace estimated larger is refused before it is
    /// written (with the --trace-round-ms that would fit), and the writing stops with an error
    /// past it. A trace holds one line (about 60 bytes) per map unit per round: two weeks of
    /// 3,000 units at 10 s rounds would take 23 GB.
    #[arg(long, default_value_t = DEFAULT_TRACE_MAX_BYTES, value_name = "BYTES")]
    trace_max_bytes: u64,
    /// Map units from the located networks of this MaxMind DB (GeoIP2/GeoLite2 City, DB-IP
    /// City) instead of generated ones: one per network and class of --class-mix, at the
    /// network's location, with the world's clusters and candidate model (--map-units does
    /// not apply). May be given several times; a network in two files is taken from the first.
    #[arg(long, value_name = "CITY.mmdb")]
    mmdb: Vec<PathBuf>,
    /// With --mmdb: the edge sites the clusters are laid out on, in the format of
    /// data/pop-sites.csv (iata,metro,country,lat,lon,timezone,metro_population). Default:
    /// the built-in 240 sites.
    #[arg(long, value_name = "SITES.csv", requires = "mmdb")]
    sites: Option<PathBuf>,
    /// With --mmdb: the classes of each network's map units and their shares of its demand.
    #[arg(
        long,
        value_name = "CLASS=SHARE,...",
        default_value = "web=0.5,video=0.35,apps=0.15"
    )]
    class_mix: world::ClassMix,
    /// With --mmdb: IPv6 networks longer than this fold into their prefix of this length
    /// (IPv4 ones longer than /24 into their /24).
    #[arg(long, default_value_t = cdnmap_world::mmdb::DEFAULT_V6_FOLD_LEN, value_parser = clap::value_parser!(u8).range(1..=128))]
    v6_fold_len: u8,
    /// Also write the world's networks, each at its location, as a MaxMind DB (what --mmdb
    /// reads: a generated world as a database, for trying the real-data path without a
    /// licensed one).
    #[arg(long, value_name = "OUT.mmdb")]
    write_mmdb: Option<PathBuf>,
}

impl WorldArgs {
    /// The trace to write, if any: `--trace` and `--out-trace` come together.
    fn trace(&self) -> Result<Option<(synth::TraceParams, &Path)>> {
        match (self.trace, &self.out_trace) {
            (Some(hours), Some(path)) => {
                synth::check_hours(hours)?;
                if path == self.out.as_path() {
                    bail!(
                        "--out-trace {} is the instance's --out: give the trace its own file",
                        path.display()
                    );
                }
                let seed = self.trace_seed.unwrap_or(self.shape.seed.wrapping_add(2));
                let mut params = synth::TraceParams::new(hours, seed);
                params.round_ms = self.trace_round_ms;
                // Every setting checked before anything is written.
                params.validate().with_context(|| {
                    format!(
                        "--trace {hours} with --trace-round-ms {}",
                        self.trace_round_ms
                    )
                })?;
                Ok(Some((params, path)))
            }
            (Some(hours), None) => {
                bail!("--trace {hours} needs --out-trace TRACE.jsonl (where to write the trace)")
            }
            (None, Some(path)) => bail!(
                "--out-trace {} needs --trace HOURS (how long a trace to write)",
                path.display()
            ),
            (None, None) => {
                if self.trace_seed.is_some() {
                    bail!("--trace-seed needs --trace HOURS and --out-trace TRACE.jsonl");
                }
                Ok(None)
            }
        }
    }
}

/// `--trace-max-bytes`'s default: 4 GiB, a day and a half of 3,000 units at 10 s rounds
/// (or two weeks of them at 60 s rounds).
const DEFAULT_TRACE_MAX_BYTES: u64 = 4 << 30;

/// A writer that refuses to write past `max` bytes (the trace's bound).
struct Bounded<W> {
    inner: W,
    written: u64,
    max: u64,
}

impl<W: std::io::Write> std::io::Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let after = self.written.saturating_add(buf.len() as u64);
        if after > self.max {
            return Err(std::io::Error::other(format!(
                "the trace passed --trace-max-bytes {} (it was cut there and not kept)",
                self.max
            )));
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A writer that only counts.
#[derive(Default)]
struct Counting(u64);

impl std::io::Write for Counting {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Refuses a trace that would take more than `max` bytes, before any of it is written: its
/// size is estimated as its first round's (written to nowhere) times its rounds.
fn check_trace_size(
    inst: &cdnmap_topology::Topology,
    params: &synth::TraceParams,
    max: u64,
) -> Result<()> {
    let rounds = params.rounds();
    let mut first = params.clone();
    // One round and a half: one whole round.
    first.hours = 1.5 * params.round_ms as f64 / 3.6e6;
    first.flash_start_h = None;
    first.failure_start_h = None;
    let mut counted = Counting::default();
    if synth::write_trace(inst, &first, &mut counted, &|_| {}).is_err() {
        // No estimate: the bound is still kept as the trace is written.
        return Ok(());
    }
    let estimate = counted.0.saturating_mul(rounds);
    if estimate <= max {
        return Ok(());
    }
    // The round (a whole number of 10 s) that would fit, when it is shorter than an hour.
    let factor = estimate.div_ceil(max.max(1));
    let fits_ms = (params.round_ms as u64)
        .saturating_mul(factor)
        .div_ceil(10_000)
        .saturating_mul(10_000);
    let longer_round = if fits_ms <= 3_600_000 {
        format!("--trace-round-ms {fits_ms} (or more), ")
    } else {
        String::new()
    };
    bail!(
        "--trace {} would write about {} MB ({rounds} rounds of {} ms, {} map units, {} \
         bytes a round), more than --trace-max-bytes {max}: give {longer_round}fewer hours, \
         or a larger --trace-max-bytes",
        params.hours,
        estimate / 1_000_000,
        params.round_ms,
        inst.unit_count(),
        counted.0
    )
}

pub(crate) fn cmd_world(a: &WorldArgs) -> Result<ExitCode> {
    check_writable(&a.out)?;
    let trace = a.trace()?;
    if let Some((params, path)) = &trace {
        params
            .validate()
            .with_context(|| format!("--trace {}", params.hours))?;
        check_writable(path)?;
    }
    if let Some(path) = &a.write_mmdb {
        check_writable(path)?;
    }
    let mut inst = if a.mmdb.is_empty() {
        generate_world(&a.shape.params())?
    } else {
        let source = crate::io::MmdbSource {
            files: a.mmdb.clone(),
            sites: a.sites.clone(),
            class_mix: a.class_mix.clone(),
            v6_fold_len: a.v6_fold_len,
        };
        let bar = progress(0, "world");
        let started = std::time::Instant::now();
        let (inst, summary) = crate::io::mmdb_world(&source, &a.shape.params(), &|done| {
            bar.set_length(done as u64);
            bar.set_position(done as u64)
        })?;
        bar.finish_and_clear();
        println!(
            "{summary}\nmade the world in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        inst
    };
    if let Some(pct) = a.perturb {
        let seed = a.perturb_seed.unwrap_or(a.shape.seed.wrapping_add(1));
        inst = world::perturb(&inst, pct, seed).with_context(|| format!("--perturb {pct}"))?;
    }
    if let Some((params, _)) = &trace {
        // Before anything is written.
        check_trace_size(&inst, params, a.trace_max_bytes)?;
    }
    write_atomically(&a.out, |w| crate::io::write_instance_as(&inst, a.format, w))?;
    if let Some(path) = &a.write_mmdb {
        let nets = world::located_networks(&inst);
        // Build epoch 0: the same world gives the same bytes.
        let bytes = cdnmap_world::mmdb::write(&nets, "GeoLite2-City", 0)?;
        write_atomically(path, |w| Ok(std::io::Write::write_all(w, &bytes)?))?;
        println!(
            "wrote {}: {} networks at their locations, {} bytes",
            path.display(),
            nets.len(),
            bytes.len()
        );
    }
    println!(
        "wrote {}: {} map units, {} clusters, {} candidates, demand {:.1}",
        a.out.display(),
        inst.unit_count(),
        inst.clusters().len(),
        inst.total_candidates(),
        inst.total_demand()
    );
    if let Some((params, path)) = &trace {
        let bar = progress(params.rounds(), "trace");
        let mut summary = None;
        write_atomically(path, |w| {
            let mut bounded = Bounded {
                inner: w,
                written: 0,
                max: a.trace_max_bytes,
            };
            summary = Some(synth::write_trace(&inst, params, &mut bounded, &|r| {
                bar.set_position(r)
            })?);
            Ok(())
        })?;
        bar.finish_and_clear();
        let summary = summary.context("the trace writer returned no summary")?;
        println!("wrote {}\n{summary}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::Bounded;

    /// The trace's writer stops with an error at its bound, having written what fitted.
    #[test]
    fn the_bounded_writer_refuses_past_its_bound() {
        let mut out = Vec::new();
        let mut w = Bounded {
            inner: &mut out,
            written: 0,
            max: 10,
        };
        w.write_all(b"0123456789").expect("within the bound");
        let e = w.write_all(b"x").expect_err("past the bound");
        assert_eq!(
            e.to_string(),
            "the trace passed --trace-max-bytes 10 (it was cut there and not kept)"
        );
        assert_eq!(out, b"0123456789");
    }
}
