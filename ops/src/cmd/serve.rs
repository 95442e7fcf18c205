//! `cdnmap serve`: the mapper as a process (the configuration read, the service started, the
//! listeners and the election), until a signal stops it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cdnmap_mapper::Limits;
use clap::Args;

use crate::io::read_instance;
use cdnmap_world::world::{self, WorldParams};

use super::{configured, hangups, init_tracing, shutdown_signal};

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// The configuration file (TOML; see the api crate's config module). Absent: defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// etcd's client URLs, comma-separated (the config's `etcd`): this mapper is then one
    /// replica of several, and publishes only while it leads. `https://` URLs need the
    /// config's `etcd_ca_file` (and `etcd_cert_file`, `etcd_key_file` for client
    /// certificates).
    #[arg(long, value_delimiter = ',', value_name = "URL[,URL...]")]
    etcd: Vec<String>,
    /// This replica's name among the replicas (the config's `node_id`).
    #[arg(long)]
    node_id: Option<String>,
}

pub(crate) fn cmd_serve(a: &ServeArgs) -> Result<ExitCode> {
    init_tracing();
    // SIGHUP's handler first, before the store (which may take a while) is read: SIGHUP
    // reloads, and never kills.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let hangups = hangups(&runtime);
    let mut config = match &a.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            cdnmap_api::Config::parse_toml(&text).with_context(|| format!("{}", path.display()))?
        }
        None => cdnmap_api::Config::default(),
    };
    // The secrets kept outside the file (token files, CDNMAP_ADMIN_TOKEN,
    // CDNMAP_FEEDBACK_TOKENS), before the file's values are checked: a check may need them
    // (`watch_open = false` needs front ends' tokens).
    let warnings = config
        .load_secrets(&|name| std::env::var(name).ok())
        .context("the configuration's secrets")?;
    if let Some(path) = &a.config {
        config
            .validate()
            .with_context(|| format!("{}", path.display()))?;
    }
    for w in warnings {
        tracing::warn!("{w}");
    }
    // The flags override the file's keys, and are checked as the file's are.
    if !a.etcd.is_empty() {
        config.etcd = a.etcd.clone();
    }
    if let Some(id) = &a.node_id {
        config.node_id = Some(id.clone());
    }
    config
        .validate()
        .context("the configuration with --etcd and --node-id")?;
    log_start(&config);
    // Checked at every start, not only the first (when the store has no topology yet and the
    // networks are read).
    if let Some(m) = &config.mmdb {
        m.class_mix
            .parse::<world::ClassMix>()
            .with_context(|| format!("the configuration's mmdb.class_mix {:?}", m.class_mix))?;
    }
    // The topology to start from when the store has none (a restart keeps the stored one,
    // with every acknowledged edit, and does not read or generate this).
    let (instance_file, demo) = (config.instance.clone(), config.demo.clone());
    let mmdb = config.mmdb.clone();
    let initial = move || match (&instance_file, &mmdb) {
        (Some(path), _) => read_instance(path, Limits::default()),
        (None, Some(m)) => {
            let source = crate::io::MmdbSource {
                files: m.files.clone(),
                sites: m.sites.clone(),
                class_mix: m.class_mix.parse().context("mmdb.class_mix")?,
                v6_fold_len: m.v6_fold_len,
            };
            let params = WorldParams {
                clusters: m.clusters,
                seed: m.seed,
                ..WorldParams::default()
            };
            let (topology, summary) = crate::io::mmdb_world(&source, &params, &|_| {})?;
            tracing::info!(
                map_units = topology.instance.unit_count(),
                clusters = params.clusters,
                "the world of the [mmdb] networks:\n{summary}"
            );
            Ok(topology)
        }
        (None, None) => {
            let params = WorldParams {
                map_units: demo.map_units,
                clusters: demo.clusters,
                seed: demo.seed,
                headroom: demo.headroom,
                ..WorldParams::default()
            };
            tracing::info!(
                map_units = params.map_units,
                clusters = params.clusters,
                "no instance configured: serving the demo world"
            );
            let topology = world::generate(&params, &|_| {})?;
            with_companions(topology, &demo.companion)
        }
    };
    runtime.block_on(cdnmap_api::server::serve(
        config,
        initial,
        async {
            shutdown_signal().await;
            tracing::info!("shutting down");
        },
        hangups,
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// `topology` with the companion shares of `shares` (by class name: `[demo] companion`); an
/// error names a class the topology does not have.
fn with_companions(
    topology: cdnmap_topology::Topology,
    shares: &std::collections::BTreeMap<String, f64>,
) -> anyhow::Result<cdnmap_topology::Topology> {
    if shares.is_empty() {
        return Ok(topology);
    }
    let classes = topology.instance.classes();
    for name in shares.keys() {
        if !classes.iter().any(|k| &k.name == name) {
            let known: Vec<&str> = classes.iter().map(|k| k.name.as_str()).collect();
            anyhow::bail!(
                "demo.companion.{name}: the demo world has no class {name:?} (its classes: {})",
                known.join(", ")
            );
        }
    }
    let each: Vec<f64> = classes
        .iter()
        .map(|k| shares.get(&k.name).copied().unwrap_or(0.0))
        .collect();
    let instance = topology
        .instance
        .with_companion_shares(&each)
        .context("demo.companion")?;
    Ok(topology.with_instance(instance))
}

/// The start's first line: the version and what the configuration says, secrets as yes/no.
fn log_start(config: &cdnmap_api::Config) {
    let instance = match (&config.instance, &config.mmdb) {
        (Some(path), _) => format!("file {}", path.display()),
        (None, Some(_)) => "mmdb".to_string(),
        (None, None) => "demo".to_string(),
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        grpc_listen = %config.grpc_listen,
        http_listen = %config.http_listen,
        cycle_secs = config.cycle_secs,
        data_dir = %config.data_dir.display(),
        instance = %instance,
        tls = config.tls.is_some(),
        replicated = config.replicated(),
        node_id = config.node_id.as_deref().unwrap_or(""),
        admin_token = configured(&config.admin_token),
        feedback_tokens = config.feedback_tokens.len(),
        "cdnmap serve starting"
    );
}
