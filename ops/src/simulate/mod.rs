//! `cdnmap simulate`: the three published load-balancing results cdnmap's second level rests on,
//! reproduced with the project's own selection code (docs/simulate.md).
//!
//! - `balls` — batched, infinite balls-into-bins with d choices (Berenbrink et al.): max load over
//!   time, its steady-state distribution, recovery from a bad start, and the d × λ sweep.
//! - `winner` — Go-With-The-Winner (Liu, Sitaraman, Towsley): users pick k random servers, keep
//!   the one with the best hit rate over a window τ.
//! - `hashing` — round-robin vs consistent hashing vs bounded loads vs power-of-two under node
//!   joins and leaves.
//!
//! Each writes `<kind>.csv` and `<kind>.svg` into `--out` and prints its table; every random
//! choice comes from ChaCha8 seeded by `--seed`, so the same seed gives byte-identical output.

pub mod balls;
pub mod hashing;
pub mod winner;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum SimulateCommand {
    /// Batched infinite balls-into-bins with d choices: max load over time, its steady-state
    /// distribution, recovery from a bad start; --sweep for the d × λ table.
    Balls(balls::BallsArgs),
    /// Go-With-The-Winner: users keep the best (by hit rate over τ) of k random servers with
    /// LRU caches; k = 1 vs k ≥ 2, partial adoption, the effect of τ and α.
    Winner(winner::WinnerArgs),
    /// Round-robin vs consistent hashing vs bounded loads vs power-of-two under node joins and
    /// leaves: max/avg load and keys moved.
    Hashing(hashing::HashingArgs),
}

pub fn run(cmd: &SimulateCommand) -> Result<()> {
    match cmd {
        SimulateCommand::Balls(a) => balls::run(a),
        SimulateCommand::Winner(a) => winner::run(a),
        SimulateCommand::Hashing(a) => hashing::run(a),
    }
}

/// The output directory: `--out`, or `simulate-out/<kind>`; created if missing.
pub(crate) fn out_dir(out: &Option<PathBuf>, kind: &str) -> Result<PathBuf> {
    let dir = out
        .clone()
        .unwrap_or_else(|| Path::new("simulate-out").join(kind));
    std::fs::create_dir_all(&dir).with_context(|| format!("--out {}: creating", dir.display()))?;
    Ok(dir)
}

/// Writes `text` to `dir/name` through a temporary name and a rename.
pub(crate) fn write_text(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    crate::io::write_atomically(&path, |w| {
        use std::io::Write;
        w.write_all(text.as_bytes())?;
        Ok(())
    })?;
    Ok(path)
}

/// One line of a plot.
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel of a plot.
pub(crate) struct Panel<'a> {
    pub title: String,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub series: Vec<Series>,
    /// Where the legend goes (where the lines are not).
    pub legend: Legend,
    /// The palette index of the first series (so a series keeps its colour across panels).
    pub first_color: usize,
}

pub(crate) use cdnmap_bench::stats::fit_line;
pub(crate) use plotters::chart::SeriesLabelPosition as Legend;

/// Draws panels side by side into one SVG (plotters' SVG backend), rendered in memory and
/// written atomically.
pub(crate) fn plot_svg(dir: &Path, name: &str, panels: &[Panel]) -> Result<PathBuf> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| anyhow!("plotting {name}: {e}");
    let mut svg = String::new();
    {
        let width = 760 * panels.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut svg, (width, 460)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let areas = root.split_evenly((1, panels.len().max(1)));
        for (panel, area) in panels.iter().zip(areas) {
            let finite = panel
                .series
                .iter()
                .flat_map(|s| s.points.iter())
                .filter(|p| p.0.is_finite() && p.1.is_finite());
            let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
            for &(x, y) in finite {
                x0 = x0.min(x);
                x1 = x1.max(x);
                y1 = y1.max(y);
            }
            if !x0.is_finite() {
                (x0, x1) = (0.0, 1.0);
            }
            if x1 <= x0 {
                x1 = x0 + 1.0;
            }
            let y1 = if y1 > 0.0 { y1 * 1.05 } else { 1.0 };
            let mut chart = ChartBuilder::on(&area)
                .caption(&panel.title, ("sans-serif", 17))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d(x0..x1, 0.0..y1)
                .map_err(|x| e(&x))?;
            chart
                .configure_mesh()
                .x_desc(panel.x_desc)
                .y_desc(panel.y_desc)
                .draw()
                .map_err(|x| e(&x))?;
            for (i, s) in panel.series.iter().enumerate() {
                let color = Palette99::pick(panel.first_color + i).to_rgba();
                chart
                    .draw_series(LineSeries::new(
                        s.points
                            .iter()
                            .copied()
                            .filter(|p| p.0.is_finite() && p.1.is_finite()),
                        color.stroke_width(2),
                    ))
                    .map_err(|x| e(&x))?
                    .label(s.name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            }
            chart
                .configure_series_labels()
                .position(panel.legend.clone())
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|x| e(&x))?;
        }
        root.present().map_err(|x| e(&x))?;
    }
    write_text(dir, name, &svg)
}

/// A fixed-width text table: a header and rows, columns right-aligned but the first.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < width.len() {
                width[i] = width[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        for (i, c) in cells.enumerate() {
            let w = width.get(i).copied().unwrap_or(0);
            if i == 0 {
                let _ = write!(out, "{c:<w$}");
            } else {
                let _ = write!(out, "  {c:>w$}");
            }
        }
        out.push('\n');
    };
    line(&mut out, &mut header.iter().copied());
    for r in rows {
        line(&mut out, &mut r.iter().map(String::as_str));
    }
    out
}

/// Writes CSV rows (a header, then records) into a string.
pub(crate) fn csv_string(header: &[&str], rows: &[Vec<String>]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(header)?;
    for r in rows {
        w.write_record(r)?;
    }
    let bytes = w.into_inner().map_err(|e| anyhow!("csv: {e}"))?;
    Ok(String::from_utf8(bytes)?)
}

/// A seed for part `part` of a run seeded with `seed` (splitmix64 of both), so parts run in any
/// order or on any thread and still draw the same numbers.
pub(crate) fn sub_seed(seed: u64, part: u64) -> u64 {
    let mut z = seed
        ^ part
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(0x632B_E59B);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Runs `jobs` on up to `threads` threads (a shared counter hands out the next job); results
/// come back in job order, so the output does not depend on scheduling.
pub(crate) fn par_map<T: Sync, R: Send>(
    jobs: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<R>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = threads.clamp(1, jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() {
                    break;
                }
                let r = f(&jobs[i]);
                if let Ok(mut g) = results.lock() {
                    g[i] = Some(r);
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| anyhow!("a simulation thread panicked"))?;
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow!("a simulation job did not finish"))))
        .collect()
}

/// The default number of worker threads: the machine's cores.
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// "yes" / "NO" for a verdict line.
pub(crate) fn held(ok: bool) -> &'static str {
    if ok {
        "HELD"
    } else {
        "NOT HELD"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn par_map_keeps_job_order() {
        let jobs: Vec<u64> = (0..50).collect();
        let out = par_map(&jobs, 4, |&j| Ok(sub_seed(7, j))).expect("ran");
        let serial: Vec<u64> = jobs.iter().map(|&j| sub_seed(7, j)).collect();
        assert_eq!(out, serial);
    }
}
