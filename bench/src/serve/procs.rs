//! The processes: their configurations, starting and waiting for them, and what is read of them from outside (peak resident memory, the store's size, `/metrics`). Every child is killed when its guard drops.

use super::*;

/// The child processes; each is killed (SIGKILL) and reaped when dropped, on every exit path.
#[derive(Default)]
pub(crate) struct Children {
    pub(crate) procs: Vec<(Option<Proc>, PathBuf)>,
}

/// The last lines of a log, for an error message (the temporary directory goes with the bench).
pub(crate) fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<String> = text.lines().rev().take(5).map(strip_ansi).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n    ")
}

impl Children {
    /// Adds `p`, which logs to `log`.
    pub(crate) fn add(&mut self, p: Proc, log: &Path) -> usize {
        self.procs.push((Some(p), log.to_path_buf()));
        self.procs.len() - 1
    }

    pub(crate) fn pid(&self, i: usize) -> Option<u32> {
        self.procs.get(i)?.0.as_ref().map(|p| p.0.id())
    }

    /// `kill -9` of child `i`, reaped.
    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(p) = self.procs.get_mut(i) {
            drop(p.0.take());
        }
    }

    /// Fails, naming the process and the logs, if one that was not killed has exited, or
    /// when the bench was interrupted.
    pub(crate) fn check(&mut self, dir: &Path) -> Result<()> {
        if INTERRUPTED.load(Ordering::Relaxed) {
            bail!("interrupted; the servers are stopped");
        }
        for (p, log) in &mut self.procs {
            let Some(p) = p else { continue };
            if let Ok(Some(status)) = p.0.try_wait() {
                bail!(
                    "{} exited with {status}; the end of its log ({}; all logs in {}):\n    {}",
                    p.1,
                    log.display(),
                    dir.display(),
                    log_tail(log)
                );
            }
        }
        Ok(())
    }
}

/// Waits for `f` to give a value, failing after `timeout` or if a child exits; prints a
/// progress line now and then.
pub(crate) fn wait_for<T>(
    what: &str,
    timeout: Duration,
    kids: &mut Children,
    dir: &Path,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T> {
    let started = Instant::now();
    let mut said = Instant::now();
    loop {
        if let Some(x) = f() {
            return Ok(x);
        }
        kids.check(dir)?;
        if started.elapsed() > timeout {
            bail!(
                "no {what} within {timeout:?}; see the logs in {}",
                dir.display()
            );
        }
        if said.elapsed() > PROGRESS_EVERY {
            eprintln!(
                "  ... waiting for {what} ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        std::thread::sleep(POLL);
    }
}

/// The mapper's configuration (`grpc` may name a fixed address, else port 0), its store in
/// `dir`.
pub(crate) fn serve_config(a: &ServeBenchArgs, dir: &Path, grpc: Option<SocketAddr>) -> String {
    let grpc = grpc.map_or_else(|| "127.0.0.1:0".to_string(), |g| g.to_string());
    format!(
        "grpc_listen = \"{grpc}\"\nhttp_listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n\
         cycle_secs = {}\n[demo]\nmap_units = {}\nclusters = {}\nseed = {}\n",
        dir.join("data").display().to_string(),
        a.cycle_secs,
        a.map_units,
        a.clusters,
        a.seed
    )
}

/// Writes the mapper's configuration into `dir` as `name`.
pub(crate) fn write_serve_config(
    a: &ServeBenchArgs,
    dir: &Path,
    name: &str,
    grpc: Option<SocketAddr>,
) -> Result<PathBuf> {
    let conf = dir.join(name);
    std::fs::write(&conf, serve_config(a, dir, grpc))
        .with_context(|| format!("writing {}", conf.display()))?;
    Ok(conf)
}

pub(crate) fn spawn_serve(exe: &Path, conf: &Path, log: &Path) -> Result<Proc> {
    spawn(
        Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(conf)
            .env("NO_COLOR", "1"),
        log,
        "cdnmap serve",
    )
}

/// A front end following `grpc`, answering DNS and serving `/metrics` on port 0 (its log's
/// `listening` line names both); its own demand reports every 10 s when `reports`, else hourly.
pub(crate) fn spawn_dns(
    exe: &Path,
    grpc: SocketAddr,
    (log, name): (&Path, &'static str),
    reports: bool,
) -> Result<Proc> {
    let report_secs = if reports { "10" } else { "3600" };
    spawn(
        Command::new(exe)
            .arg("dns")
            .args(["--report-secs", report_secs])
            .args(["--mapper", &format!("http://{grpc}")])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--zone", "cdn.example."])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1"),
        log,
        name,
    )
}

/// A process's peak resident memory (`VmHWM`), MB.
pub(crate) fn peak_rss_mb(pid: Option<u32>) -> Option<f64> {
    crate::procs::memory_mb(pid?).map(|(peak, _)| peak)
}

/// Bytes of the files under `dir`.
pub(crate) fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The store's value files by kind, the part of each name before its first `-` (`map`: whole
/// records, `mapd`: deltas, `topology`, `estimator`, `round`), with their counts and bytes,
/// in name order.
pub(crate) fn store_values(dir: &Path) -> Vec<(String, usize, u64)> {
    let mut kinds: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(kind) = name.split('-').next().filter(|k| !k.is_empty()) else {
            continue;
        };
        if let Ok(m) = e.metadata() {
            let k = kinds.entry(kind.to_string()).or_default();
            k.0 += 1;
            k.1 += m.len();
        }
    }
    kinds.into_iter().map(|(k, (n, b))| (k, n, b)).collect()
}

pub(crate) use crate::procs::http_get;

/// The value of an unlabelled metric in a Prometheus text page.
pub(crate) fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Every series of metric `name` in a Prometheus text page: its labels as written (`""` for
/// none, else `{reason="budget"}`) and its value. A counter never incremented is absent.
pub(crate) fn metric_series(page: &str, name: &str) -> Vec<(String, f64)> {
    page.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, value) = r.split_once('}')?;
                    (format!("{{{labels}}}"), value)
                }
                None => (String::new(), rest.strip_prefix(' ')?),
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}
