//! `cdnmap dns`: an authoritative DNS front end following the mapper's map.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::{configured, hangups, init_tracing, shutdown_signal};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct DnsArgs {
    #[command(subcommand)]
    command: Option<DnsCommand>,
    /// The configuration file (TOML; see the dns crate's config module). The flags below
    /// override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The mapper's gRPC address, e.g. http://127.0.0.1:50051, or several, comma-separated
    /// (the replicas of a highly available mapper: the highest map identity is followed).
    #[arg(long)]
    mapper: Option<String>,
    /// Where to answer DNS, UDP and TCP (port 0: any port free for both; the log's
    /// `listening` line names it).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// A zone to be authoritative for (repeatable; replaces the config's list).
    #[arg(long = "zone", value_name = "ZONE")]
    zones: Vec<String>,
    /// TTL of A/AAAA answers, seconds.
    #[arg(long)]
    ttl: Option<u32>,
    /// The name this front end reports demand under.
    #[arg(long)]
    name: Option<String>,
    /// Seconds between demand reports.
    #[arg(long)]
    report_secs: Option<u64>,
    /// Serve Prometheus /metrics here (queries by outcome, map version, reconnects, reports;
    /// port 0: any free port, named in the log's `listening` line).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// UDP answering loops, each a thread with its own socket (default: one per core).
    #[arg(long)]
    udp_threads: Option<usize>,
    /// Under load (queries closer than this), how long a UDP loop waits between receives so
    /// that each takes a batch, microseconds (default 50; 0: never waits).
    #[arg(long)]
    udp_coalesce_us: Option<u64>,
}

#[derive(clap::Subcommand, Debug)]
enum DnsCommand {
    /// Print the DS records (SHA-256, digest type 2) to give the parent zone, as
    /// `dnssec-dsfromkey -2` prints them: of the keys given, else of the key-signing keys
    /// (or combined keys) in the configuration's `dnssec_keys`.
    Ds(DsArgs),
}

#[derive(Args, Debug)]
pub(crate) struct DsArgs {
    /// The front end's configuration file, whose `dnssec_keys` are read.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Key files' base paths (`Kcdn.example.+013+12345`, or the `.key` file): their DS
    /// records, whatever their flags, instead of the configuration's.
    keys: Vec<PathBuf>,
}

/// `cdnmap dns ds`: the DS records of the keys given, or of the configuration's key-signing
/// keys (each zone's SEP keys; a zone without any: all its keys, a CSK set).
fn cmd_ds(a: &DsArgs) -> Result<ExitCode> {
    let mut lines = Vec::new();
    if a.keys.is_empty() {
        let config = dns_file(a.config.as_ref())?;
        config.validate().context("the DNS front end's settings")?;
        let Some(set) = config.dnssec_keyset()? else {
            anyhow::bail!("no dnssec_keys in the configuration: nothing is signed, no DS to give");
        };
        let keys: Vec<&cdnmap_dns::dnssec::keys::Key> = set.keys().collect();
        for k in &keys {
            let sep_in_zone = keys.iter().any(|o| o.zone == k.zone && o.is_sep());
            if k.is_sep() || !sep_in_zone {
                lines.push(k.ds_text());
            }
        }
    } else {
        for path in &a.keys {
            lines.push(cdnmap_dns::dnssec::keys::Key::load(path)?.ds_text());
        }
    }
    for line in lines {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// A `cdnmap dns` (or `cdnmap monitor`) configuration: the file's, or the defaults, with the
/// token kept outside it (`feedback_token_file`, `CDNMAP_FEEDBACK_TOKEN`) read in; checked
/// once the command line's overrides are in (by the caller).
pub(crate) fn dns_config(path: Option<&PathBuf>) -> Result<cdnmap_dns::DnsConfig> {
    let mut config = dns_file(path)?;
    let warnings = config
        .load_secrets(&|name| std::env::var(name).ok())
        .context("the configuration's secrets")?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(config)
}

/// The configuration file's settings, or the defaults.
fn dns_file(path: Option<&PathBuf>) -> Result<cdnmap_dns::DnsConfig> {
    Ok(match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            cdnmap_dns::DnsConfig::parse_toml(&text)
                .with_context(|| format!("{}", path.display()))?
        }
        None => cdnmap_dns::DnsConfig::default(),
    })
}

pub(crate) fn cmd_dns(a: DnsArgs) -> Result<ExitCode> {
    if let Some(DnsCommand::Ds(ds)) = &a.command {
        return cmd_ds(ds);
    }
    init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let hangups = hangups(&runtime);
    let mut config = dns_config(a.config.as_ref())?;
    if let Some(m) = a.mapper {
        config.mapper = m;
    }
    if let Some(l) = a.listen {
        config.listen = l;
    }
    if !a.zones.is_empty() {
        config.zones = a.zones;
    }
    if let Some(t) = a.ttl {
        config.ttl_secs = t;
    }
    if let Some(n) = a.name {
        config.name = n;
    }
    if let Some(r) = a.report_secs {
        config.report_secs = r;
    }
    if let Some(m) = a.metrics_listen {
        config.metrics_listen = Some(m);
    }
    if let Some(n) = a.udp_threads {
        config.udp_threads = Some(n);
    }
    if let Some(us) = a.udp_coalesce_us {
        config.udp_coalesce_us = us;
    }
    config.validate().context("the DNS front end's settings")?;
    log_start(&config);
    runtime.block_on(cdnmap_dns::run_from(
        config,
        a.config,
        shutdown_signal(),
        hangups,
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// The start's first line: the version and what the configuration says, the token as yes/no.
fn log_start(config: &cdnmap_dns::DnsConfig) {
    let metrics_listen = config.metrics_listen.map(|a| a.to_string());
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %config.listen,
        metrics_listen = metrics_listen.as_deref().unwrap_or("none"),
        mapper = %config.mapper,
        zones = %config.zones.join(","),
        name = %config.name,
        report_secs = config.report_secs,
        tls = config.mapper_ca_file.is_some(),
        feedback_token = configured(&config.feedback_token),
        "cdnmap dns starting"
    );
}
