//! The operator's command line: generate worlds, solve and verify instance files, run the
//! service and the front end, and the `bench` commands (whose harnesses are `cdnmap-bench`).
//!
//! Everything here is a thin shell around the pure `cdnmap-mapper` core: read files, call the
//! core, print and write results. Errors carry the file and the problem (`anyhow` context).

pub mod bench;
pub mod cli;
mod cmd;
pub mod io;
pub mod monitor;
pub mod record;
pub mod replay;
pub mod ring;
pub mod simulate;
pub mod store_cmd;

// What the command line shares with the benchmarks (the binary installs `alloc::Counting`).
pub use cdnmap_bench::{alloc, report};

use std::process::ExitCode;

/// Runs the command line and turns its outcome into an exit code: 0 success, 1 a verification
/// found violations, 2 an error (bad input, unreadable file).
pub fn main() -> ExitCode {
    match cli::run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
