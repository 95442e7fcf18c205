//! What both of cdnmap's processes (`cdnmap serve`, `cdnmap dns`) export on `/metrics` beside
//! their own metrics: the standard `process_*` metrics, read from `/proc/self` at each scrape
//! (the names and meanings of Prometheus's client libraries' process collector), and
//! `cdnmap_build_info{version, component} 1`.
//!
//! The `process_*` lines are rendered here as text and appended to the recorder's output
//! ([`render`]): `process_cpu_seconds_total` is a counter of fractional seconds, which the
//! `metrics` crate's integer counters cannot carry. Off Linux (no `/proc/self`) they are left
//! out.

use std::fmt::Write as _;

/// The version the build was made from (the workspace's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Registers `cdnmap_build_info{version, component} 1` and its HELP text; `component` is the
/// process (`serve`, `dns`).
pub fn build_info(component: &'static str) {
    metrics::describe_gauge!(
        "cdnmap_build_info",
        "Always 1; its labels say the version built and the process (component: serve, dns)."
    );
    metrics::gauge!("cdnmap_build_info", "version" => VERSION, "component" => component).set(1.0);
}

/// How often [`spawn_upkeep`] drains the histograms' samples into their buckets.
pub const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Drains the recorder's histogram samples into their buckets every [`UPKEEP_EVERY`], on a
/// task of the current tokio runtime, for as long as it runs. Without it (`install_recorder`
/// leaves it to its caller) every sample recorded waits in memory for the next scrape: the
/// DNS front end records one per UDP batch, so with no scrape the memory would grow without
/// bound; with it, a histogram holds at most [`UPKEEP_EVERY`]'s samples.
pub fn spawn_upkeep(handle: metrics_exporter_prometheus::PrometheusHandle) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
}

/// Installs the process's Prometheus recorder, its histograms with `buckets` (seconds), with
/// its upkeep ([`spawn_upkeep`], on the current tokio runtime) and `cdnmap_build_info` for
/// `component`: what both processes do before describing and registering their own metrics.
pub fn install(
    component: &'static str,
    buckets: &[f64],
) -> Result<metrics_exporter_prometheus::PrometheusHandle, metrics_exporter_prometheus::BuildError>
{
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(buckets)?
        .install_recorder()?;
    spawn_upkeep(handle.clone());
    build_info(component);
    Ok(handle)
}

/// The recorder's metrics followed by the `process_*` ones: what `/metrics` answers.
pub fn render(handle: &metrics_exporter_prometheus::PrometheusHandle) -> String {
    let mut out = handle.render();
    if let Some(p) = Process::read() {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        p.render(&mut out);
    }
    out
}

/// The process's figures, one scrape's worth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Process {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub max_fds: u64,
    pub start_time_seconds: f64,
}

/// The most entries of `/proc/self/fd` counted (a process past it reads as that many).
const MAX_FDS_COUNTED: u64 = 1 << 20;

impl Process {
    /// This process's figures from `/proc/self` (`None` where there is none, or it does not
    /// read as documented in proc(5)).
    pub fn read() -> Option<Process> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()?
            .take(MAX_FDS_COUNTED as usize)
            .count() as u64;
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if ticks <= 0 || page <= 0 {
            return None;
        }
        Process::parse(&stat, &boot, &limits, open_fds, ticks as u64, page as u64)
    }

    /// The figures from the text of `/proc/self/stat`, `/proc/stat` and `/proc/self/limits`,
    /// with `open_fds` counted, `ticks` per second and pages of `page` bytes.
    pub fn parse(
        stat: &str,
        boot: &str,
        limits: &str,
        open_fds: u64,
        ticks: u64,
        page: u64,
    ) -> Option<Process> {
        // The command name, field 2, is in parentheses and may hold spaces: the fields
        // counted from after its last ')' start at field 3 (state).
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().take(22).collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let (utime, stime, start, vsize, rss) =
            (field(14)?, field(15)?, field(22)?, field(23)?, field(24)?);
        let boot_time = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse::<u64>()
            .ok()?;
        let max_fds = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))?
            .split_whitespace()
            .nth(3)
            .and_then(|soft| soft.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        Some(Process {
            cpu_seconds: (utime + stime) as f64 / ticks as f64,
            resident_bytes: rss.saturating_mul(page),
            virtual_bytes: vsize,
            open_fds,
            max_fds,
            start_time_seconds: boot_time as f64 + start as f64 / ticks as f64,
        })
    }

    /// The figures in Prometheus's text format, with HELP and TYPE.
    pub fn render(&self, out: &mut String) {
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n\n"
            );
        };
        metric(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            self.cpu_seconds,
        );
        metric(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            self.resident_bytes as f64,
        );
        metric(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            self.virtual_bytes as f64,
        );
        metric(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            self.open_fds as f64,
        );
        metric(
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors (the soft limit; unlimited reads as 2^64).",
            self.max_fds as f64,
        );
        metric(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            self.start_time_seconds,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (cdnmap serve) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 50 0 0 20 0 9 0 1000 123456789 3000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn proc_files_read_as_documented() {
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        let p = Process::parse(STAT, boot, limits, 12, 100, 4096).expect("parsed");
        assert_eq!(
            p,
            Process {
                cpu_seconds: 3.0,
                resident_bytes: 3000 * 4096,
                virtual_bytes: 123456789,
                open_fds: 12,
                max_fds: 1024,
                start_time_seconds: 1700000010.0,
            }
        );
        let mut text = String::new();
        p.render(&mut text);
        assert!(text
            .contains("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n"));
        assert!(text.contains("process_start_time_seconds 1700000010\n"));
    }

    #[test]
    fn a_truncated_stat_is_refused() {
        assert_eq!(
            Process::parse("4242 (x) S 1 2", "btime 1\n", "", 0, 100, 4096),
            None
        );
    }

    /// This process's own figures are sane: some memory, some open files, started after boot.
    #[test]
    fn this_process_reads() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let p = Process::read().expect("read");
        assert!(p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes);
        assert!(p.open_fds > 0 && p.open_fds <= p.max_fds);
        assert!(p.start_time_seconds > 1e9);
    }
}
