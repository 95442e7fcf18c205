//! `cdnmap bench serve` refuses bad arguments, with exit code 2 and a message naming the
//! argument, before it generates a world or starts a process. (The benchmark itself runs for
//! minutes, at least ten cycles of 10 s: it is not part of the test suite; its figures are in
//! `docs/perf/bench-serve.md`.)

use cdnmap_tests::{assert_refused, bin};

/// `cdnmap bench serve args...` fails with exit code 2 and `needle` on stderr.
fn refused(args: &[&str], needle: &str) {
    let all: Vec<&str> = ["bench", "serve"].iter().chain(args).copied().collect();
    assert_refused(bin!(), &all, None, needle);
}

#[test]
fn bad_arguments_are_refused_before_anything_starts() {
    refused(&["--rounds", "3"], "--rounds 3");
    refused(&["--rounds", "100000"], "--rounds 100000");
    refused(&["--cycle-secs", "5"], "--cycle-secs 5");
    refused(&["--map-units", "0"], "--map-units");
    refused(&["--clusters", "0"], "--clusters");
    refused(&["--report-rate", "2000000"], "--report-rate 2000000");
    refused(&["--noise", "80"], "--noise 80");
    refused(&["--queries", "0"], "--queries 0");
    refused(
        &["--exe", "/nonexistent/cdnmap"],
        "--exe /nonexistent/cdnmap",
    );
    refused(&["--rounds", "ten"], "--rounds");
}
