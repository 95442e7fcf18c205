//! The commands of the command line, one module each, and what the long-running ones share
//! (logging in text or JSON, SIGHUP, the stop signal).

pub(crate) mod dns;
pub(crate) mod monitor;
pub(crate) mod record;
pub(crate) mod replay;
pub(crate) mod serve;
pub(crate) mod solve;
pub(crate) mod world;

pub(crate) use dns::dns_config;

/// How the long-running commands log: `text` (for people; coloured only on a terminal) or
/// `json` (one object a line, for journald's and Kubernetes' collectors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("{other:?} is not a log format (text or json)")),
        }
    }
}

/// The environment variable `--log-format` falls back to.
pub(crate) const LOG_FORMAT_ENV: &str = "CDNMAP_LOG_FORMAT";

/// The format chosen once, by the command line (see [`set_log_format`]).
static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Chooses the log format: `flag` (`--log-format`), else `CDNMAP_LOG_FORMAT` (empty: unset),
/// else text. A value that is neither is an error naming where it came from.
pub(crate) fn set_log_format(flag: Option<LogFormat>) -> anyhow::Result<()> {
    let format = match flag {
        Some(f) => f,
        None => match std::env::var(LOG_FORMAT_ENV) {
            Ok(v) if v.is_empty() => LogFormat::Text,
            Ok(v) => v
                .parse()
                .map_err(|e| anyhow::anyhow!("{LOG_FORMAT_ENV}: {e}"))?,
            Err(std::env::VarError::NotPresent) => LogFormat::Text,
            Err(std::env::VarError::NotUnicode(v)) => {
                anyhow::bail!("{LOG_FORMAT_ENV}: {v:?} is not a log format (text or json)")
            }
        },
    };
    let _ = LOG_FORMAT.set(format);
    Ok(())
}

/// Whether text logs are coloured: only when they go to a terminal, and `NO_COLOR` is unset or
/// empty (no-color.org). Under systemd, in a container or into a file: never.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Logs to stdout at `RUST_LOG`'s level (info by default), in the chosen format
/// ([`set_log_format`]).
pub(crate) fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match LOG_FORMAT.get().copied().unwrap_or_default() {
        LogFormat::Text => builder.with_ansi(colour()).init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// Says yes or no for a secret, never the secret.
pub(crate) fn configured<T>(secret: &Option<T>) -> &'static str {
    if secret.is_some() {
        "yes"
    } else {
        "no"
    }
}

/// SIGHUPs from now on, counted: what a long-running command watches to reload what it can
/// (each says in its log what it reloaded). Installed as a command starts, so a SIGHUP never
/// kills it, even one that comes while the store is read; one that comes before the command
/// watches is seen when it starts to. Without a handler (it could not be installed, or not
/// on Unix) the count never changes.
pub(crate) fn hangups(runtime: &tokio::runtime::Runtime) -> tokio::sync::watch::Receiver<u64> {
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let _entered = runtime.enter();
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                runtime.spawn(async move {
                    while hup.recv().await.is_some() {
                        tx.send_modify(|n| *n += 1);
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler: SIGHUP would stop this process")
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (runtime, tx);
    rx
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutting down");
}
