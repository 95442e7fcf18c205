//! What the commands share for files and the terminal: reading an instance file, writing a
//! file through a temporary name and a rename, progress bars, a world generated with one. A
//! leaf of the crate: the subcommands and benchmarks use it, it uses none of them.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use cdnmap_mapper::Limits;
use cdnmap_topology::format::parse_instance;
use cdnmap_topology::Topology;
use cdnmap_world::world::{self, WorldParams};
use indicatif::{ProgressBar, ProgressStyle};

/// Reads and validates an instance file; errors name the file.
pub fn read_instance(path: &Path, limits: Limits) -> Result<Topology> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_instance(&bytes, limits).with_context(|| format!("{}", path.display()))
}

/// A progress bar on stderr for `len` steps (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({eta} left)")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Generates a world with a progress bar.
pub fn generate_world(params: &WorldParams) -> Result<Topology> {
    let bar = progress(params.map_units as u64, "world");
    let inst = world::generate(params, &|done| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    Ok(inst)
}

/// Refuses an output path whose directory does not exist, before any long work is done.
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.is_dir() {
        Ok(())
    } else {
        bail!(
            "cannot write {}: no directory {}",
            path.display(),
            dir.display()
        )
    }
}

/// Writes a file through a temporary sibling (`.NAME.tmp-PID`) and a rename, so a failed write
/// never leaves a half-written file under the real name and never touches another file.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    check_writable(path)?;
    let name = path
        .file_name()
        .with_context(|| format!("cannot write {}: not a file name", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::new(file);
        write(&mut w)?;
        w.flush()?;
        drop(w);
        std::fs::rename(&tmp, path)?;
        Ok::<_, anyhow::Error>(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing {}", path.display()))
}
