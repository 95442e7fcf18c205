//! `cdnmap monitor`: a health monitor reporting its verdicts to the mappers.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::{dns_config, hangups, init_tracing, shutdown_signal};

#[derive(Args, Debug)]
pub(crate) struct MonitorArgs {
    /// How to reach the mappers: a `cdnmap dns` configuration file (its `mapper`,
    /// `mapper_ca_file`, `cert_file`, `key_file`, `feedback_token` and `name`; the rest is
    /// not used). The flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The mapper's gRPC address, or several, comma-separated (each is reported to).
    #[arg(long)]
    mapper: Option<String>,
    /// The name this monitor reports under (one of the mapper's `[health] monitors`).
    #[arg(long)]
    name: Option<String>,
}

pub(crate) fn cmd_monitor(a: MonitorArgs) -> Result<ExitCode> {
    init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut hup = hangups(&runtime);
    runtime.spawn(async move {
        while hup.changed().await.is_ok() {
            tracing::info!("SIGHUP: nothing to reload (the monitor reads its files at start)");
        }
    });
    let mut config = dns_config(a.config.as_ref())?;
    if let Some(m) = a.mapper {
        config.mapper = m;
    }
    if let Some(n) = a.name {
        config.name = n;
    }
    config.validate().context("the monitor's settings")?;
    let links = config
        .mappers()
        .into_iter()
        .map(|url| cdnmap_dns::MapperLink::new(&config, url))
        .collect::<Result<Vec<_>>>()?;
    tracing::info!(name = %config.name, mappers = links.len(), "monitor started");
    runtime.block_on(crate::monitor::run(
        config.name.clone(),
        links,
        shutdown_signal(),
    ))?;
    Ok(ExitCode::SUCCESS)
}
