//! `cdnmap replay`: a demand trace replayed through the estimator and the mapper.

use std::fs::File;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cdnmap_mapper::Limits;
use clap::Args;

use crate::io::{progress, read_instance};

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
}

pub(crate) fn cmd_replay(a: &ReplayArgs) -> Result<ExitCode> {
    use crate::replay::{replay, write_report, Setting};
    let instance = read_instance(&a.instance, Limits::default())?;
    let file = File::open(&a.trace).with_context(|| format!("reading {}", a.trace.display()))?;
    let name = a.trace.display().to_string();
    let (header, records) = cdnmap_world::trace::read(std::io::BufReader::new(file), &name)?;
    let mut settings = vec![Setting::default()];
    for spec in &a.compare {
        settings.push(Setting::parse(spec)?);
    }
    let mut results = Vec::with_capacity(settings.len());
    for setting in settings {
        let bar = progress(0, &setting.name);
        let rows = replay(&instance, &header, &records, &setting, &|done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
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
