//! `cdnmap record export`: the demand record written as a trace.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use crate::io::{check_writable, write_atomically};

#[derive(Subcommand, Debug)]
pub(crate) enum RecordCommand {
    /// Write the demand record of [--from, --to) as a trace.
    Export(ExportArgs),
}

#[derive(Args, Debug)]
pub(crate) struct ExportArgs {
    /// Start of the period (Unix ms).
    #[arg(long)]
    from: i64,
    /// End of the period (Unix ms, exclusive).
    #[arg(long)]
    to: i64,
    /// Where to write the trace.
    out: PathBuf,
    /// The running server's HTTP address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: std::net::SocketAddr,
    /// A file holding the running server's Admin token (`/record` needs it; one trailing
    /// newline dropped), or the token in `CDNMAP_ADMIN_TOKEN`: never on the command line,
    /// where `ps` would show it.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Read a stopped server's store instead of asking a running one.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The round length the trace declares.
    #[arg(long, default_value_t = 10_000)]
    round_ms: i64,
}

pub(crate) fn cmd_export(a: &ExportArgs) -> Result<ExitCode> {
    if a.to < a.from {
        bail!("--to {} is before --from {}", a.to, a.from);
    }
    if a.round_ms <= 0 {
        bail!("--round-ms must be > 0, got {}", a.round_ms);
    }
    check_writable(&a.out)?;
    let lines = match &a.data_dir {
        Some(dir) => crate::record::read_store(dir, a.from, a.to)?,
        None => {
            let token = admin_token(a.token_file.as_deref())?;
            crate::record::fetch(a.http, token.as_deref(), a.from, a.to)?
        }
    };
    let (header, records) = crate::record::to_trace(&lines, a.from, a.round_ms)?;
    write_atomically(&a.out, |w| {
        cdnmap_world::trace::write_header(w, &header)?;
        for r in &records {
            cdnmap_world::trace::write_record(w, r)?;
        }
        Ok(())
    })?;
    println!("wrote {}: {} records", a.out.display(), records.len());
    Ok(ExitCode::SUCCESS)
}

/// The Admin token of `--token-file` or `CDNMAP_ADMIN_TOKEN` (not both), if any; a file others
/// may read is warned of on stderr.
fn admin_token(file: Option<&std::path::Path>) -> Result<Option<String>> {
    let env_name = cdnmap_api::config::ADMIN_TOKEN_ENV;
    let from_env = std::env::var(env_name).ok();
    let token = cdnmap_proto::secret::token(cdnmap_proto::secret::Sources {
        inline: None,
        file: file.map(|p| ("--token-file", p)),
        env: from_env.as_deref().map(|v| (env_name, v)),
    })
    .map_err(anyhow::Error::msg)?;
    Ok(token.map(|secret| {
        if let Some(w) = secret.warning {
            eprintln!("warning: {w}");
        }
        secret.value
    }))
}
