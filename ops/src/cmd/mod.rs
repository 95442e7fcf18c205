//! The commands of the command line, one module each, and what the long-running ones share
//! (logging, SIGHUP, the stop signal).

pub(crate) mod dns;
pub(crate) mod monitor;
pub(crate) mod record;
pub(crate) mod replay;
pub(crate) mod serve;
pub(crate) mod solve;
pub(crate) mod world;

pub(crate) use dns::dns_config;

/// Logs to stderr at `RUST_LOG`'s level (info by default).
pub(crate) fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
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
