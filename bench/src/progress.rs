//! The terminal side of a long computation: a progress bar, and a world generated with one.

use anyhow::Result;
use cdnmap_topology::Topology;
use cdnmap_world::world::{self, WorldParams};
use indicatif::{ProgressBar, ProgressStyle};

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
