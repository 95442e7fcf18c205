//! `cdnmap bench soak` end to end, for a few seconds: the real `cdnmap serve` and `cdnmap dns`,
//! Debian's dnsperf (installed by the test setup when missing) measuring the peak and then
//! holding a share of it; the report has real numbers. Bad arguments, and dnsperf missing, are
//! refused before anything starts. (The soak itself, ten minutes, is not part of the test
//! suite; its figures are in `docs/perf/soak.md`.)

use std::process::{Command, Output, Stdio};

use cdnmap_tests::{assert_refused, bin, ensure_debian_tool};

fn soak(args: &[&str], path: Option<&str>) -> Output {
    let mut cmd = Command::new(bin!());
    cmd.args(["bench", "soak"]).args(args).stdin(Stdio::null());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    cmd.output().expect("run cdnmap")
}

/// `cdnmap bench soak args...` fails with exit code 2 and `needle` on stderr, before the
/// world is generated.
fn refused(args: &[&str], path: Option<&str>, needle: &str) {
    let all: Vec<&str> = ["bench", "soak"].iter().chain(args).copied().collect();
    let stderr = assert_refused(bin!(), &all, path, needle);
    assert!(
        !stderr.contains("world:"),
        "{args:?}: refused after the world was generated: {stderr}"
    );
}

#[test]
fn bad_arguments_and_a_missing_dnsperf_are_refused_before_anything_starts() {
    refused(&["--minutes", "0"], None, "--minutes 0");
    refused(&["--minutes", "0.001"], None, "less than a second");
    refused(&["--minutes", "5000"], None, "--minutes 5000");
    refused(&["--load", "0"], None, "--load 0");
    refused(&["--load", "1.5"], None, "--load 1.5");
    refused(&["--peak-secs", "0"], None, "--peak-secs 0");
    refused(&["--cycle-secs", "5"], None, "--cycle-secs 5");
    refused(&["--map-units", "0"], None, "--map-units");
    // dnsperf, looked for on the PATH (and in /usr/sbin, /sbin), is named with its package.
    refused(&[], Some("/nonexistent"), "apt-get install dnsperf");
}

/// The number after `key` in `text` (commas between thousands allowed).
fn number_after(text: &str, key: &str) -> f64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in:\n{text}"));
    let digits: String = text[at + key.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '.')
        .filter(|c| *c != ',')
        .collect();
    digits
        .trim_end_matches('.')
        .parse()
        .unwrap_or_else(|_| panic!("no number after {key:?} in:\n{text}"))
}

#[test]
fn a_short_soak_reports_answers_errors_latency_rounds_and_memory() {
    ensure_debian_tool("dnsperf", &["dnsperf"]).unwrap_or_else(|e| panic!("{e}"));
    let out = soak(
        &[
            "--map-units",
            "2000",
            "--clusters",
            "20",
            "--queries",
            "5000",
            "--peak-secs",
            "2",
            "--minutes",
            "0.1",
            "--timeout-secs",
            "120",
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The peak, then the soak's queries: sent, answered, and the errors counted.
    assert!(number_after(&stdout, "peak: ") > 0.0, "{stdout}");
    let line = |start: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?}:\n{stdout}"))
    };
    let queries = line("queries: ");
    let sent = number_after(queries, "sent ");
    let answered = number_after(queries, ", answered ");
    assert!(answered > 0.0 && answered <= sent, "{queries}");
    let lost = number_after(queries, ", lost ");
    let errors = number_after(line("errors: "), "errors: ");
    assert!(errors >= lost, "{stdout}");
    // Every answer's latency is in the histogram; the front end counted the queries it saw.
    let p99 = number_after(line("latency of the answers"), "p99 ");
    assert!(p99 > 0.0 && p99 < 5_000.0, "{stdout}");
    assert!(
        number_after(
            line("the front end's own count"),
            "{rcode=\"NOERROR\",answer=\"records\"} "
        ) > 0.0,
        "{stdout}"
    );
    // A row of the table, the rounds, and both processes' memory with a verdict.
    assert!(stdout.contains("| 1 (0-"), "{stdout}");
    assert!(stdout.contains("rounds during the soak: "), "{stdout}");
    for name in ["cdnmap serve", "cdnmap dns"] {
        let line = line(&format!("memory of {name} "));
        assert!(number_after(line, "start ") > 0.0, "{line}");
        assert!(number_after(line, ", end ") > 0.0, "{line}");
        assert!(
            line.contains(": flat (") || line.contains(": GROWING ("),
            "{line}"
        );
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}
