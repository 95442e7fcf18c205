//! `cdnmap replay`: a demand trace replayed through the estimator and the mapper.

use std::fs::File;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cdnmap_mapper::Limits;
use clap::Args;

use crate::io::{progress, read_instance};
use crate::replay::Row;
use cdnmap_world::trace::Header;

#[derive(Args, Debug)]
pub(crate) struct ReplayArgs {
    /// The instance (topology, candidates; its demands are the first round's).
    instance: PathBuf,
    /// The trace (JSON Lines, docs/trace.md).
    trace: PathBuf,
    /// The report's directory.
    #[arg(long)]
    out: PathBuf,
    /// Another setting to run beside the default, as NAME:key=value,... with keys stickiness
    /// (a number), learning (on/off) and forecast (on/off); repeatable.
    #[arg(long = "compare", value_name = "SETTING")]
    compare: Vec<String>,
    /// Rounds after which capacity violations are counted as "after warm-up" in the report.
    #[arg(long, default_value_t = 60)]
    warmup: usize,
    /// Print a line for the round at every this many simulated minutes, as it is done (0:
    /// every round).
    #[arg(long, default_value_t = 60, value_name = "MINUTES")]
    every: u64,
}

/// A file read with its progress shown (bytes).
struct Reading<'a, R> {
    inner: R,
    done: u64,
    bar: &'a crate::io::Progress,
}

impl<R: std::io::Read> std::io::Read for Reading<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        self.bar.set_position(self.done);
        Ok(n)
    }
}

/// One round as `replay` prints it while it runs: the setting, the simulated time since the
/// trace's start, and the round's figures.
fn round_line(setting: &str, header: &Header, row: &Row, total: usize) -> String {
    let minutes = (row.t_ms - header.start_ms) / 60_000;
    format!(
        "{setting:<14} {:>3}:{:02} round {}/{total}: churn {:.3}%, overflow {:.3}%, \
         max util {:.3} bps {:.3} fps, {} capacity violations, solve {:.0} ms",
        minutes / 60,
        minutes % 60,
        row.round + 1,
        100.0 * row.churn,
        100.0 * row.overflow_share,
        row.max_util_bps,
        row.max_util_fps,
        row.violations,
        row.solve_ms
    )
}

pub(crate) fn cmd_replay(a: &ReplayArgs) -> Result<ExitCode> {
    use crate::replay::{replay, write_report, Setting};
    let instance = read_instance(&a.instance, Limits::default())?;
    let file = File::open(&a.trace).with_context(|| format!("reading {}", a.trace.display()))?;
    let name = a.trace.display().to_string();
    let started = std::time::Instant::now();
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = progress(size, "trace (bytes)");
    let reading = Reading {
        inner: file,
        done: 0,
        bar: &bar,
    };
    let (header, records) =
        cdnmap_world::trace::read(std::io::BufReader::with_capacity(1 << 20, reading), &name)?;
    bar.finish_and_clear();
    println!(
        "read {name}: {} records, {size} bytes in {:.1} s",
        records.len(),
        started.elapsed().as_secs_f64()
    );
    let mut settings = vec![Setting::default()];
    for spec in &a.compare {
        settings.push(Setting::parse(spec)?);
    }
    let mut results = Vec::with_capacity(settings.len());
    let every_ms = i64::try_from(a.every.saturating_mul(60_000)).unwrap_or(i64::MAX);
    for setting in settings {
        let bar = progress(0, &setting.name);
        let due = std::cell::Cell::new(header.start_ms);
        let rows = replay(&instance, &header, &records, &setting, &|row, total| {
            bar.set_length(total as u64);
            bar.set_position(row.round as u64 + 1);
            let last = row.round + 1 == total;
            if row.t_ms >= due.get() || last {
                bar.suspend(|| println!("{}", round_line(&setting.name, &header, row, total)));
                due.set(row.t_ms.saturating_add(every_ms.max(1)));
            }
        })
        .with_context(|| format!("{name}: setting {:?}", setting.name))?;
        bar.finish_and_clear();
        let late: usize = rows.iter().skip(a.warmup).map(|r| r.violations).sum();
        println!(
            "{:<14} {} rounds, {} capacity violations after round {}",
            setting.name,
            rows.len(),
            late,
            a.warmup
        );
        results.push((setting, rows));
    }
    write_report(&a.out, &results, a.warmup)?;
    println!("report         {}", a.out.join("report.md").display());
    Ok(ExitCode::SUCCESS)
}
