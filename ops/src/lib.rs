//! The operator's command line: generate worlds, solve and verify instance files, benchmark.
//!
//! Everything here is a thin shell around the pure `cdnmap-mapper` core: read files, call the
//! core, print and write results. Errors carry the file and the problem (`anyhow` context).

pub mod alloc;
pub mod bench;
pub mod bench_dns;
pub mod bench_edits;
pub mod bench_follow;
pub mod bench_grpc;
pub mod bench_loads;
pub mod bench_overflow;
pub mod bench_procs;
pub mod bench_round;
pub mod bench_serve;
pub mod bench_soak;
pub mod cli;
pub mod io;
pub mod monitor;
pub mod record;
pub mod replay;
pub mod report;
pub mod ring;
pub mod simulate;
pub mod store_cmd;

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
