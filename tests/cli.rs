//! End-to-end tests of the real `cdnmap` binary: generate a world, solve it, verify the
//! assignment, catch tampered assignments, refuse bad input with exit code 2 and a message that
//! names the file and the problem (never a panic), and reproduce DESIGN.md's worked example.
//!
//! Exit codes (ARCHITECTURE.md, `ops/`): 0 success, 1 violations found, 2 error.
//!
//! Cargo builds the binary before these tests (they are the root package's integration tests)
//! and hands them its path at compile time (`CARGO_BIN_EXE_cdnmap`, through
//! `cdnmap_tests::bin!`): the binary is always the one built from this checkout, in the same
//! profile and target directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cdnmap_tests::{bin, workspace_root};
use serde_json::Value;
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Running it.

/// One run of the binary.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn from(out: Output) -> Self {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Everything printed, for assertion messages.
    fn show(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "{}", self.show());
        assert!(
            !self.stderr.contains("panicked"),
            "the binary panicked:\n{}",
            self.show()
        );
        self
    }

    /// Asserts an error exit (2) whose stderr contains every one of `needles`.
    fn assert_error(&self, needles: &[&str]) -> &Self {
        self.assert_code(2);
        for n in needles {
            assert!(
                self.stderr.contains(n),
                "stderr should mention {n:?}:\n{}",
                self.show()
            );
        }
        self
    }
}

/// Runs `cdnmap args...` in `dir`.
fn cdnmap(dir: &Path, args: &[&str]) -> Run {
    let out = Command::new(bin!())
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run cdnmap");
    Run::from(out)
}

fn tempdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("cdnmap-cli-")
        .tempdir()
        .expect("a temporary directory")
}

fn read_json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).expect("serialise"))
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn example_instance() -> PathBuf {
    workspace_root().join("docs").join("example-instance.json")
}

/// Generates the 3,000-unit world and solves it: `w.json` and `a.json` in `dir`.
fn world_and_assignment(dir: &Path) -> (Value, Value) {
    cdnmap(
        dir,
        &[
            "world",
            "--map-units",
            "3000",
            "--clusters",
            "40",
            "--seed",
            "3",
            "--out",
            "w.json",
        ],
    )
    .assert_code(0);
    cdnmap(dir, &["solve", "w.json", "--out", "a.json"]).assert_code(0);
    (
        read_json(&dir.join("w.json")),
        read_json(&dir.join("a.json")),
    )
}

fn f64_of(v: &Value) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("expected a number, got {v}"))
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
fn world_is_deterministic_per_seed() {
    let dir = tempdir();
    let world = |seed: &str, out: &str| {
        cdnmap(
            dir.path(),
            &[
                "world",
                "--map-units",
                "3000",
                "--clusters",
                "40",
                "--seed",
                seed,
                "--out",
                out,
            ],
        )
        .assert_code(0);
        std::fs::read(dir.path().join(out)).expect("the world file")
    };
    let first = world("3", "w.json");
    let again = world("3", "w2.json");
    let other = world("4", "w4.json");

    let w: Value = serde_json::from_slice(&first).expect("the world file is JSON");
    assert_eq!(w["map_units"].as_array().map(Vec::len), Some(3000));
    assert_eq!(w["clusters"].as_array().map(Vec::len), Some(40));
    assert!(first == again, "the same seed gave different world files");
    assert!(first != other, "seeds 3 and 4 gave the same world file");
}

/// A world written compact (`--format compact`) is the same instance: `solve` gives the same
/// assignment as from its JSON, `verify` accepts it against either, and a damaged compact
/// file is refused naming it.
#[test]
fn a_compact_instance_file_is_the_same_instance_as_its_json() {
    let dir = tempdir();
    let d = dir.path();
    let world = |out: &str, format: &str| {
        cdnmap(
            d,
            &[
                "world",
                "--map-units",
                "3000",
                "--clusters",
                "40",
                "--seed",
                "5",
                "--out",
                out,
                "--format",
                format,
            ],
        )
        .assert_code(0);
    };
    world("w.json", "json");
    world("w.cdntop", "compact");
    let json_len = std::fs::metadata(d.join("w.json")).expect("json").len();
    let compact_len = std::fs::metadata(d.join("w.cdntop"))
        .expect("compact")
        .len();
    assert!(
        compact_len * 5 < json_len,
        "compact {compact_len} bytes against JSON's {json_len}"
    );
    cdnmap(d, &["solve", "w.json", "--out", "a.json"]).assert_code(0);
    cdnmap(d, &["solve", "w.cdntop", "--out", "b.json"]).assert_code(0);
    let (mut a, mut b) = (read_json(&d.join("a.json")), read_json(&d.join("b.json")));
    for v in [&mut a, &mut b] {
        v["summary"]["solve_ms"] = Value::Null;
    }
    assert_eq!(a, b, "the same assignment from either file");
    cdnmap(d, &["verify", "w.cdntop", "a.json"]).assert_code(0);
    // A byte changed inside the compressed frame: its checksum (or the frame) refuses it.
    let mut bytes = std::fs::read(d.join("w.cdntop")).expect("read");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(d.join("bad.cdntop"), &bytes).expect("write");
    cdnmap(d, &["solve", "bad.cdntop"]).assert_error(&["bad.cdntop"]);
    // Cut short.
    std::fs::write(d.join("cut.cdntop"), &bytes[..at]).expect("write");
    cdnmap(d, &["solve", "cut.cdntop"]).assert_error(&["cut.cdntop"]);
    cdnmap(d, &["world", "--out", "x", "--format", "yaml"]).assert_error(&["yaml"]);
}

#[test]
fn solve_conserves_demand_and_verify_accepts() {
    let dir = tempdir();
    cdnmap(
        dir.path(),
        &[
            "world",
            "--map-units",
            "3000",
            "--clusters",
            "40",
            "--seed",
            "3",
            "--out",
            "w.json",
        ],
    )
    .assert_code(0);
    let run = cdnmap(dir.path(), &["solve", "w.json", "--out", "a.json"]);
    run.assert_code(0);
    for line in [
        "map units",
        "demand",
        "allocated",
        "overflow",
        "blocking pairs",
        "solve time",
        "proposals",
    ] {
        assert!(
            run.stdout.lines().any(|l| l.contains(line)),
            "the summary lacks {line:?}:\n{}",
            run.show()
        );
    }

    let w = read_json(&dir.path().join("w.json"));
    let a = read_json(&dir.path().join("a.json"));
    let assignments = a["assignments"].as_array().expect("assignments");
    assert_eq!(assignments.len(), 3000);
    let demand: std::collections::HashMap<&str, f64> = w["map_units"]
        .as_array()
        .expect("map_units")
        .iter()
        .map(|u| (u["id"].as_str().expect("id"), f64_of(&u["demand"])))
        .collect();
    for e in assignments {
        let id = e["map_unit"].as_str().expect("map_unit");
        let d = *demand
            .get(id)
            .unwrap_or_else(|| panic!("assignment for unknown map unit {id}"));
        let allocated: f64 = e["allocations"]
            .as_array()
            .expect("allocations")
            .iter()
            .map(|x| f64_of(&x["amount"]))
            .sum();
        let total = allocated + f64_of(&e["overflow"]);
        assert!(
            (total - d).abs() <= 1e-6 * d.max(1e-12),
            "{id}: demand {d}, allocated {allocated} + overflow = {total}"
        );
    }

    let run = cdnmap(dir.path(), &["verify", "w.json", "a.json"]);
    run.assert_code(0);
    assert!(run.stdout.contains("ok"), "{}", run.show());
}

#[test]
fn verify_catches_tampered_assignments() {
    let dir = tempdir();
    let (w, a) = world_and_assignment(dir.path());
    let units = w["map_units"].as_array().expect("map_units");
    let clusters: Vec<&str> = w["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| c["id"].as_str().expect("cluster id"))
        .collect();
    let assignments = a["assignments"].as_array().expect("assignments");
    // A unit with demand placed at some cluster, and a cluster that is not its candidate.
    let (i, entry) = assignments
        .iter()
        .enumerate()
        .find(|(_, e)| {
            e["allocations"]
                .as_array()
                .is_some_and(|x| !x.is_empty() && f64_of(&x[0]["amount"]) > 1.0)
        })
        .expect("some unit has demand placed");
    let uid = entry["map_unit"].as_str().expect("map_unit").to_string();
    let placed_at = entry["allocations"][0]["cluster"]
        .as_str()
        .expect("cluster")
        .to_string();
    let unit = units
        .iter()
        .find(|u| u["id"] == uid.as_str())
        .expect("the unit is in the world");
    let candidates: Vec<&str> = unit["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .map(|c| c["cluster"].as_str().expect("cluster"))
        .collect();
    let stranger = *clusters
        .iter()
        .find(|c| !candidates.contains(c))
        .expect("some cluster is not a candidate");

    let verify = |name: &str, tampered: &Value| {
        write_json(&dir.path().join(name), tampered);
        let run = cdnmap(
            dir.path(),
            &["verify", "w.json", name, "--max-lines", "10000"],
        );
        run.assert_code(1);
        run
    };

    // Demand moved to a cluster that is not a candidate.
    let mut t = a.clone();
    t["assignments"][i]["allocations"][0]["cluster"] = Value::from(stranger);
    let run = verify("moved.json", &t);
    let line = run
        .stdout
        .lines()
        .find(|l| l.contains("not one of its candidates"))
        .unwrap_or_else(|| panic!("no candidate violation reported:\n{}", run.show()));
    assert!(
        line.contains(&format!("{uid:?}")) && line.contains(&format!("{stranger:?}")),
        "the line should name map unit {uid} and cluster {stranger}: {line}"
    );

    // An allocation inflated past the cluster's capacity (and past the unit's demand).
    let mut t = a.clone();
    let amount = f64_of(&t["assignments"][i]["allocations"][0]["amount"]);
    t["assignments"][i]["allocations"][0]["amount"] = Value::from(amount * 1000.0 + 1e7);
    let run = verify("inflated.json", &t);
    let prefix = format!("cluster {placed_at:?} node ");
    let line = run
        .stdout
        .lines()
        .find(|l| l.contains(&prefix))
        .unwrap_or_else(|| panic!("no capacity violation at {placed_at}:\n{}", run.show()));
    assert!(line.contains("capacity"), "{line}");
    assert!(
        run.stdout
            .lines()
            .any(|l| l.contains(&format!("map unit {uid:?}")) && l.contains("demand")),
        "the inflated unit's conservation should be reported:\n{}",
        run.show()
    );

    // A unit dropped from the assignment: its demand is lost.
    let mut t = a.clone();
    t["assignments"]
        .as_array_mut()
        .expect("assignments")
        .remove(i);
    let run = verify("dropped.json", &t);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.contains(&format!("map unit {uid:?}")) && l.contains("demand")),
        "the dropped unit's lost demand should be reported:\n{}",
        run.show()
    );

    // Overflow shrunk: demand silently disappears.
    let mut t = a.clone();
    let (j, e) = assignments
        .iter()
        .enumerate()
        .find(|(_, e)| f64_of(&e["overflow"]) > 1.0)
        .expect("the tight world overflows somewhere");
    let over_id = e["map_unit"].as_str().expect("map_unit");
    t["assignments"][j]["overflow"] = Value::from(0.0);
    let run = verify("lost.json", &t);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.contains(&format!("map unit {over_id:?}")) && l.contains("demand")),
        "the lost overflow of {over_id} should be reported:\n{}",
        run.show()
    );
}

#[test]
fn bad_input_is_an_error_naming_file_and_problem() {
    let dir = tempdir();
    let d = dir.path();
    let example = example_instance();
    let example = example.to_str().expect("a UTF-8 path");

    // A missing file.
    cdnmap(d, &["solve", "missing.json"]).assert_error(&["missing.json"]);
    cdnmap(d, &["verify", example, "missing-assignment.json"])
        .assert_error(&["missing-assignment.json"]);

    // Not JSON.
    std::fs::write(d.join("garbage.json"), "this is not json {").expect("write");
    cdnmap(d, &["solve", "garbage.json"])
        .assert_error(&["garbage.json", "garbage.json:1:2: expected ident"]);
    cdnmap(d, &["verify", example, "garbage.json"])
        .assert_error(&["garbage.json", "garbage.json:1:2: expected ident"]);

    let base = read_json(Path::new(example));

    // A valid JSON instance with a negative demand.
    let mut v = base.clone();
    v["map_units"][0]["demand"] = Value::from(-3.0);
    let uid = v["map_units"][0]["id"].as_str().expect("id").to_string();
    write_json(&d.join("negative.json"), &v);
    cdnmap(d, &["solve", "negative.json"]).assert_error(&[
        "negative.json",
        &format!("map unit {uid:?}"),
        "demand",
    ]);

    // A candidate naming a cluster the instance does not have.
    let mut v = base.clone();
    v["map_units"][0]["candidates"][0]["cluster"] = Value::from("nowhere-9");
    write_json(&d.join("unknown-cluster.json"), &v);
    cdnmap(d, &["solve", "unknown-cluster.json"]).assert_error(&[
        "unknown-cluster.json",
        &format!("map unit {uid:?}"),
        "unknown cluster \"nowhere-9\"",
    ]);

    // An assignment naming a map unit the instance does not have.
    let ghost = serde_json::json!({
        "assignments": [
            {"map_unit": "u99999999-ghost", "allocations": [{"cluster": "fra-1", "amount": 1.0}],
             "overflow": 0.0}
        ]
    });
    write_json(&d.join("ghost.json"), &ghost);
    cdnmap(d, &["verify", example, "ghost.json"])
        .assert_error(&["ghost.json", "\"u99999999-ghost\""]);

    // An assignment naming a cluster the instance does not have.
    let stray = serde_json::json!({
        "assignments": [
            {"map_unit": uid, "allocations": [{"cluster": "nowhere-9", "amount": 1.0}],
             "overflow": 0.0}
        ]
    });
    write_json(&d.join("stray.json"), &stray);
    cdnmap(d, &["verify", example, "stray.json"]).assert_error(&["stray.json", "\"nowhere-9\""]);
}

#[test]
fn solve_into_a_missing_directory_fails_without_leaving_a_file() {
    let dir = tempdir();
    let d = dir.path();
    let example = example_instance();
    let run = cdnmap(
        d,
        &[
            "solve",
            example.to_str().expect("a UTF-8 path"),
            "--out",
            "no/such/dir/a.json",
        ],
    );
    run.assert_error(&["no/such/dir/a"]);
    assert!(
        !d.join("no").exists(),
        "solve created the missing directory"
    );
    let left: Vec<_> = std::fs::read_dir(d)
        .expect("read the temp dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "solve left files behind: {left:?}");
}

/// The policy example (`docs/examples/policy.json`, issue 46): `solve` reports the map's cost
/// with the guard unbroken, `verify` accepts its map and says the cost, the map costs less
/// than the same world's with a weight of 0; a map that breaks the guard is refused by
/// `verify`; a policy naming an unknown cluster is an error naming it.
#[test]
fn the_policy_example_solves_verifies_and_costs_less_than_without() {
    let dir = tempdir();
    let example = workspace_root()
        .join("docs")
        .join("examples")
        .join("policy.json");
    let example = example.to_str().expect("a UTF-8 path");
    let run = cdnmap(dir.path(), &["solve", example, "--out", "p.json"]);
    run.assert_code(0);
    assert!(
        run.stdout.contains("latency guard broken by 0 placements"),
        "{}",
        run.show()
    );
    let cost_of = |summary: &Value| f64_of(&summary["cost"]);
    let priced = cost_of(&read_json(&dir.path().join("p.json"))["summary"]);
    let v = cdnmap(dir.path(), &["verify", example, "p.json"]);
    v.assert_code(0);
    assert!(
        v.stdout.contains("cost policy: the map costs") && v.stdout.contains("broken by 0"),
        "{}",
        v.show()
    );
    let mut world = read_json(Path::new(example));
    world["policy"]["cost"]["weight"] = Value::from(0.0);
    std::fs::write(dir.path().join("w0.json"), world.to_string()).expect("write");
    cdnmap(dir.path(), &["solve", "w0.json", "--out", "p0.json"]).assert_code(0);
    let plain = cost_of(&read_json(&dir.path().join("p0.json"))["summary"]);
    assert!(priced < 0.9 * plain, "{priced} vs {plain}");
    // The weight-0 map, checked against the priced world, breaks the guard nowhere but is not
    // stable under its preferences: refused.
    let v = cdnmap(dir.path(), &["verify", example, "p0.json"]);
    v.assert_code(1);
    world["policy"]["cost"]["prices"]["nope"] = Value::from(1.0);
    std::fs::write(dir.path().join("bad.json"), world.to_string()).expect("write");
    cdnmap(dir.path(), &["solve", "bad.json"]).assert_error(&[
        "bad.json",
        r#"policy.cost.prices["nope"]"#,
        "names no cluster",
    ]);
}

#[test]
fn example_instance_gives_designs_worked_example() {
    let dir = tempdir();
    let example = example_instance();
    let example = example.to_str().expect("a UTF-8 path");
    cdnmap(dir.path(), &["solve", example]).assert_code(0);
    cdnmap(dir.path(), &["solve", example, "--out", "ex.json"]).assert_code(0);
    let a = read_json(&dir.path().join("ex.json"));
    let placed = |unit: &str| -> (Vec<(String, f64)>, f64) {
        let e = a["assignments"]
            .as_array()
            .expect("assignments")
            .iter()
            .find(|e| e["map_unit"] == unit)
            .unwrap_or_else(|| panic!("no assignment for {unit}"));
        let allocs = e["allocations"]
            .as_array()
            .expect("allocations")
            .iter()
            .map(|x| {
                (
                    x["cluster"].as_str().expect("cluster").to_string(),
                    f64_of(&x["amount"]),
                )
            })
            .collect();
        (allocs, f64_of(&e["overflow"]))
    };
    let close = |got: &[(String, f64)], want: &[(&str, f64)]| {
        got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|((c, x), (wc, wx))| c == wc && (x - wx).abs() <= 1e-9)
    };
    let (video, over) = placed("u00000001-video");
    assert!(
        close(&video, &[("fra-1", 16.0), ("ams-1", 4.0)]) && over == 0.0,
        "u00000001-video: {video:?}, overflow {over}"
    );
    let (apps, over) = placed("u00000001-apps");
    assert!(
        close(&apps, &[("fra-1", 26.0)]) && over == 0.0,
        "u00000001-apps: {apps:?}, overflow {over}"
    );
    cdnmap(dir.path(), &["verify", example, "ex.json"]).assert_code(0);
}

/// A unit whose demand is near `f64::MAX` (issue 41, a nit): `solve`'s summary showed its
/// overflow as "(inf%)" (100 × 1e308 overflowed before the division) and its allocated
/// demand as "-0.0" (an empty float sum). Now 100.00% and 0.0.
#[test]
fn a_huge_demand_is_shown_as_a_percentage() {
    let dir = tempdir();
    let mut instance = read_json(&example_instance());
    let units = instance["map_units"].as_array_mut().expect("map_units");
    units.truncate(1);
    units[0]["demand"] = serde_json::json!(1e308);
    write_json(&dir.path().join("huge.json"), &instance);
    let run = cdnmap(dir.path(), &["solve", "huge.json"]);
    run.assert_code(0);
    let line = |label: &str| {
        run.stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line:\n{}", run.stdout))
            .to_string()
    };
    assert!(line("overflow").ends_with("(100.00%)"), "{}", run.stdout);
    assert!(
        line("allocated").contains(" 0.0   (0.00%)"),
        "{}",
        run.stdout
    );
    assert!(
        !run.stdout.contains("inf") && !run.stdout.contains("-0.0"),
        "{}",
        run.stdout
    );
}

#[test]
fn demo_verifies_clean() {
    let dir = tempdir();
    let run = cdnmap(
        dir.path(),
        &["demo", "--map-units", "3000", "--clusters", "40"],
    );
    run.assert_code(0);
    let line = run
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("verifier"))
        .unwrap_or_else(|| panic!("no verifier line:\n{}", run.show()));
    let violations: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        violations.get(1..),
        Some(&["0", "violations"][..]),
        "{line}"
    );
}

/// A file that is not JSON is refused with the file, line and column before serde's message,
/// once (the position is not repeated at the end, and the cause is not printed twice).
#[test]
fn json_error_cause_is_printed_once() {
    let dir = tempdir();
    std::fs::write(dir.path().join("garbage.json"), "this is not json {").expect("write");
    let run = cdnmap(dir.path(), &["solve", "garbage.json"]);
    run.assert_error(&["error: garbage.json:1:2: expected ident\n"]);
    assert_eq!(
        run.stderr.matches("expected ident").count(),
        1,
        "{}",
        run.show()
    );
}

// ---------------------------------------------------------------------------------------------
// Sticky rounds (docs/solver.md, "Stickiness"): perturbed worlds, --previous, --stickiness,
// --down, --drain, and the demo's second round.

/// Runs `cdnmap world` for the 3,000-unit, 40-cluster world of seed 5 with `extra` arguments.
fn world_seed5(dir: &Path, out: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "world",
        "--map-units",
        "3000",
        "--clusters",
        "40",
        "--seed",
        "5",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--out", out]);
    cdnmap(dir, &args)
}

/// `w0.json` (seed 5), `w1.json` (the same with ±5% noise, perturbation seed 9) and `a0.json`
/// (the cold map of `w0.json`) in `dir`.
fn sticky_fixture(dir: &Path) -> (Value, Value, Value) {
    world_seed5(dir, "w0.json", &[]).assert_code(0);
    world_seed5(dir, "w1.json", &["--perturb", "5", "--perturb-seed", "9"]).assert_code(0);
    cdnmap(dir, &["solve", "w0.json", "--out", "a0.json"]).assert_code(0);
    (
        read_json(&dir.join("w0.json")),
        read_json(&dir.join("w1.json")),
        read_json(&dir.join("a0.json")),
    )
}

fn str_of(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

fn array_of(v: &Value) -> &Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {v}"))
}

/// Map unit id → demand, in file order.
fn demands(world: &Value) -> Vec<(String, f64)> {
    array_of(&world["map_units"])
        .iter()
        .map(|u| (str_of(&u["id"]).to_string(), f64_of(&u["demand"])))
        .collect()
}

/// DESIGN.md's shares: map unit id → (cluster, or `None` for overflow) → fraction of the
/// unit's placed-plus-overflow demand.
fn shares(assignment: &Value) -> HashMap<String, HashMap<Option<String>, f64>> {
    array_of(&assignment["assignments"])
        .iter()
        .map(|e| {
            let allocs = array_of(&e["allocations"]);
            let over = f64_of(&e["overflow"]);
            let total = allocs.iter().map(|x| f64_of(&x["amount"])).sum::<f64>() + over;
            let mut s: HashMap<Option<String>, f64> = HashMap::new();
            if total > 0.0 {
                for x in allocs {
                    *s.entry(Some(str_of(&x["cluster"]).to_string()))
                        .or_default() += f64_of(&x["amount"]) / total;
                }
                if over > 0.0 {
                    *s.entry(None).or_default() += over / total;
                }
            }
            (str_of(&e["map_unit"]).to_string(), s)
        })
        .collect()
}

/// DESIGN.md's churn, computed from the files: Σ d·(1 − Σ_c min(s_old, s_new)) / Σ d over the
/// map units of `world` (the new round's demands d), overflow counting as one more cluster.
fn churn_of(world: &Value, old: &Value, new: &Value) -> f64 {
    let (old, new) = (shares(old), shares(new));
    let none = HashMap::new();
    let (mut moved, mut total) = (0.0, 0.0);
    for (id, d) in demands(world) {
        if d <= 0.0 {
            continue;
        }
        total += d;
        let so = old.get(&id).unwrap_or(&none);
        let sn = new.get(&id).unwrap_or(&none);
        let kept: f64 = sn
            .iter()
            .filter_map(|(c, s)| so.get(c).map(|o| s.min(*o)))
            .sum();
        moved += d * (1.0 - kept.min(1.0));
    }
    if total > 0.0 {
        moved / total
    } else {
        0.0
    }
}

fn total_demand(world: &Value) -> f64 {
    demands(world).iter().map(|(_, d)| d).sum()
}

/// Demand placed at each cluster.
fn demand_per_cluster(assignment: &Value) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for e in array_of(&assignment["assignments"]) {
        for x in array_of(&e["allocations"]) {
            *out.entry(str_of(&x["cluster"]).to_string()).or_default() += f64_of(&x["amount"]);
        }
    }
    out
}

/// The churn a `solve --previous` printed, as a fraction (`churn   1.530%   of demand ...`).
fn printed_churn(run: &Run) -> f64 {
    let line = run
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("churn"))
        .unwrap_or_else(|| panic!("no churn line:\n{}", run.show()));
    let pct = line
        .split_whitespace()
        .nth(1)
        .and_then(|t| t.strip_suffix('%'))
        .and_then(|t| t.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("the churn line has no percentage: {line}"));
    pct / 100.0
}

/// Asserts `run` printed a churn line that matches `churn` (a fraction) to the printed
/// precision (three decimals of a percent) plus 1e-6 percentage points.
fn assert_printed_churn(run: &Run, churn: f64) {
    let printed = printed_churn(run);
    assert!(
        (100.0 * printed - 100.0 * churn).abs() <= 0.0005 + 1e-6,
        "printed churn {:.4}%, computed from the files {:.6}%",
        100.0 * printed,
        100.0 * churn
    );
}

#[test]
fn perturbed_world_keeps_the_shape_and_moves_numbers_by_at_most_pct() {
    let dir = tempdir();
    let d = dir.path();
    world_seed5(d, "w0.json", &[]).assert_code(0);
    world_seed5(d, "w1.json", &["--perturb", "5", "--perturb-seed", "9"]).assert_code(0);
    let w0 = read_json(&d.join("w0.json"));
    let w1 = read_json(&d.join("w1.json"));

    let ids = |w: &Value, key: &str| -> Vec<String> {
        array_of(&w[key])
            .iter()
            .map(|x| str_of(&x["id"]).to_string())
            .collect()
    };
    assert_eq!(ids(&w0, "clusters"), ids(&w1, "clusters"), "cluster ids");
    assert_eq!(ids(&w0, "map_units"), ids(&w1, "map_units"), "map unit ids");
    assert_eq!(ids(&w0, "map_units").len(), 3000);

    // ±5%, plus slack for scores stored as f32 (relative 2^-24) and printed back.
    let within = |a: f64, b: f64| (b - a).abs() <= (0.05 + 1e-6) * a.abs();
    let (mut demand_changed, mut score_changed, mut scores) = (0, 0, 0);
    for (u0, u1) in array_of(&w0["map_units"])
        .iter()
        .zip(array_of(&w1["map_units"]))
    {
        let id = str_of(&u0["id"]);
        let (d0, d1) = (f64_of(&u0["demand"]), f64_of(&u1["demand"]));
        assert!(within(d0, d1), "{id}: demand {d0} became {d1}");
        demand_changed += usize::from(d0 != d1);

        let candidates = |u: &Value| -> HashMap<String, f64> {
            array_of(&u["candidates"])
                .iter()
                .map(|c| (str_of(&c["cluster"]).to_string(), f64_of(&c["score"])))
                .collect()
        };
        let (c0, c1) = (candidates(u0), candidates(u1));
        assert_eq!(
            c0.len(),
            array_of(&u0["candidates"]).len(),
            "{id}: a cluster twice"
        );
        let mut k0: Vec<&String> = c0.keys().collect();
        let mut k1: Vec<&String> = c1.keys().collect();
        k0.sort();
        k1.sort();
        assert_eq!(k0, k1, "{id}: the candidate clusters changed");
        for (cluster, &s0) in &c0 {
            let s1 = c1[cluster];
            assert!(within(s0, s1), "{id} at {cluster}: score {s0} became {s1}");
            score_changed += usize::from(s0 != s1);
            scores += 1;
        }
    }
    assert!(
        demand_changed > 1500,
        "only {demand_changed} of 3000 demands changed"
    );
    assert!(
        score_changed > scores / 2,
        "only {score_changed} of {scores} scores changed"
    );
}

/// `world::perturb` refuses 150 with `pct must be a percentage in [0, 100], got 150`: the exit
/// code is right, but the message names an internal parameter (`pct`), not `--perturb`.
#[test]
fn perturb_out_of_range_is_an_error_naming_the_perturbation() {
    let dir = tempdir();
    let run = world_seed5(dir.path(), "w2.json", &["--perturb", "150"]);
    run.assert_code(2);
    assert!(
        run.stderr.contains("--perturb") && run.stderr.contains("150"),
        "stderr should name --perturb and 150:\n{}",
        run.show()
    );
    assert!(
        !dir.path().join("w2.json").exists(),
        "a refused world was written"
    );
}

#[test]
fn perturb_out_of_range_exits_2_without_writing() {
    let dir = tempdir();
    let run = world_seed5(dir.path(), "w2.json", &["--perturb", "150"]);
    run.assert_error(&["150"]);
    assert!(
        !dir.path().join("w2.json").exists(),
        "a refused world was written"
    );
}

/// `verify` of a sticky map without `--previous`: a summary first (violations by kind, the
/// map's totals), the hint that a sticky map needs `--previous` before the examples, at most
/// `--max-lines` examples, exit 1. The hint is given when the file's summary says the map was
/// solved warm (or has no summary), and not for a cold map's file; with `--previous`, exit 0.
#[test]
fn verify_summarises_and_says_when_a_sticky_map_needs_previous() {
    let dir = tempdir();
    let d = dir.path();
    sticky_fixture(d);
    cdnmap(
        d,
        &[
            "solve",
            "w1.json",
            "--previous",
            "a0.json",
            "--out",
            "a1.json",
        ],
    )
    .assert_code(0);
    let hint = "hint: a sticky map is stable with respect to the preferences of its round: \
                give the previous map with --previous";

    let all = cdnmap(
        d,
        &["verify", "w1.json", "a1.json", "--max-lines", "1000000"],
    );
    all.assert_code(1);
    let pairs = all
        .stdout
        .lines()
        .filter(|l| l.starts_with("blocking pair: "))
        .count();
    assert!(pairs > 3, "{}", all.show());
    let counted = |run: &Run, kind: &str| -> usize {
        let line = run
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(kind))
            .unwrap_or_else(|| panic!("no {kind:?} line:\n{}", run.show()));
        line.trim_start()[kind.len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line:?}"))
    };
    assert_eq!(counted(&all, "blocking pairs"), pairs, "{}", all.show());
    assert_eq!(counted(&all, "violations:"), pairs, "{}", all.show());
    assert_eq!(counted(&all, "capacity (nodes over capacity)"), 0);
    assert_eq!(counted(&all, "conservation of demand"), 0);
    // The totals, against the files.
    let a1 = read_json(&d.join("a1.json"));
    let placed: f64 = array_of(&a1["assignments"])
        .iter()
        .flat_map(|e| array_of(&e["allocations"]).iter())
        .map(|x| f64_of(&x["amount"]))
        .sum();
    let map_line = all
        .stdout
        .lines()
        .find(|l| l.starts_with("map: 3000 map units, 40 clusters (40 up); demand "))
        .unwrap_or_else(|| panic!("no map line:\n{}", all.show()));
    let shown: f64 = map_line
        .split("placed ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no placed amount in {map_line:?}"));
    assert!(
        (shown - placed).abs() <= 1e-6 * placed,
        "{shown} vs {placed}"
    );

    // Twenty examples by default, after the summary and the hint.
    let run = cdnmap(d, &["verify", "w1.json", "a1.json"]);
    run.assert_code(1);
    let lines: Vec<&str> = run.stdout.lines().collect();
    let at = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line:\n{}", run.show()))
    };
    assert!(at("violations: ") < at("map: ") && at("map: ") < at(hint));
    assert!(at(hint) < at("blocking pair: "), "{}", run.show());
    let examples = lines
        .iter()
        .filter(|l| l.starts_with("blocking pair: "))
        .count();
    assert_eq!(examples, 20, "{}", run.show());
    assert!(
        run.stdout.contains(&format!("... and {} more", pairs - 20)),
        "{}",
        run.show()
    );

    // A file without a summary cannot tell: the hint is given.
    let mut bare = a1.clone();
    bare.as_object_mut().expect("an object").remove("summary");
    write_json(&d.join("bare.json"), &bare);
    let run = cdnmap(d, &["verify", "w1.json", "bare.json"]);
    run.assert_code(1);
    assert!(run.stdout.contains(hint), "{}", run.show());
    // A cold map's file (its summary has no churn and no seeding): no hint.
    let mut cold = a1.clone();
    let summary = cold["summary"].as_object_mut().expect("a summary");
    summary.remove("churn");
    summary.remove("seeded");
    write_json(&d.join("cold.json"), &cold);
    let run = cdnmap(d, &["verify", "w1.json", "cold.json"]);
    run.assert_code(1);
    assert!(!run.stdout.contains("hint:"), "{}", run.show());

    let run = cdnmap(
        d,
        &["verify", "w1.json", "a1.json", "--previous", "a0.json"],
    );
    run.assert_code(0);
    assert!(!run.stdout.contains("hint:"), "{}", run.show());
}

#[test]
fn sticky_round_churns_less_than_a_cold_round() {
    let dir = tempdir();
    let d = dir.path();
    let (_, w1, a0) = sticky_fixture(d);

    let run = cdnmap(
        d,
        &[
            "solve",
            "w1.json",
            "--previous",
            "a0.json",
            "--out",
            "a1.json",
        ],
    );
    run.assert_code(0);
    let printed = printed_churn(&run);
    assert!(printed < 0.02, "sticky churn {:.3}% ≥ 2%", 100.0 * printed);

    cdnmap(d, &["solve", "w1.json", "--out", "c1.json"]).assert_code(0);
    let a1 = read_json(&d.join("a1.json"));
    let c1 = read_json(&d.join("c1.json"));
    let sticky = churn_of(&w1, &a0, &a1);
    let cold = churn_of(&w1, &a0, &c1);
    assert!(
        3.0 * sticky <= cold,
        "sticky churn {:.3}% is not 3× below the cold churn {:.3}%",
        100.0 * sticky,
        100.0 * cold
    );
    assert_printed_churn(&run, sticky);
    let in_file = f64_of(&a1["summary"]["churn"]);
    assert!(
        (in_file - sticky).abs() <= 1e-6,
        "a1.json's summary.churn {in_file}, computed from the files {sticky}"
    );

    // Checked against the effective preferences the solve used.
    let run = cdnmap(
        d,
        &["verify", "w1.json", "a1.json", "--previous", "a0.json"],
    );
    run.assert_code(0);
    assert!(run.stdout.contains("ok"), "{}", run.show());
}

/// docs/solver.md: "`margin = 0` is a cold solve"; the `--stickiness` help: "0 = a
/// cold solve". With `--previous`, `solve` still runs the warm start (`solve_seeded`) on the
/// unchanged instance: it reaches the same stable map, but its amounts differ from the cold
/// solve's in the last bits (about 80 of this world's 3,000 units, ~1e-12 relative), and its
/// proposals and evictions differ, so the file is not the cold map's. The next test checks
/// that it is the same map to 1e-9.
#[test]
fn stickiness_zero_is_exactly_the_cold_map() {
    let dir = tempdir();
    let d = dir.path();
    sticky_fixture(d);
    cdnmap(d, &["solve", "w1.json", "--out", "c1.json"]).assert_code(0);
    cdnmap(
        d,
        &[
            "solve",
            "w1.json",
            "--previous",
            "a0.json",
            "--stickiness",
            "0",
            "--out",
            "s0.json",
        ],
    )
    .assert_code(0);
    let cold = read_json(&d.join("c1.json"));
    let zero = read_json(&d.join("s0.json"));
    let differ: Vec<(&Value, &Value)> = array_of(&cold["assignments"])
        .iter()
        .zip(array_of(&zero["assignments"]))
        .filter(|(c, z)| c != z)
        .collect();
    assert!(
        differ.is_empty() && cold["assignments"] == zero["assignments"],
        "--stickiness 0 did not give the cold map: {} units differ, first: cold {} vs {}",
        differ.len(),
        differ.first().map_or(Value::Null, |d| d.0.clone()),
        differ.first().map_or(Value::Null, |d| d.1.clone()),
    );
    // The summary, but for timing and the figures only a round with a previous map has.
    for (k, v) in cold["summary"].as_object().expect("summary") {
        if k != "solve_ms" {
            assert_eq!(&zero["summary"][k], v, "summary.{k}");
        }
    }
}

#[test]
fn stickiness_zero_gives_the_cold_stable_map_up_to_rounding() {
    let dir = tempdir();
    let d = dir.path();
    let (_, w1, a0) = sticky_fixture(d);
    cdnmap(d, &["solve", "w1.json", "--out", "c1.json"]).assert_code(0);
    let run = cdnmap(
        d,
        &[
            "solve",
            "w1.json",
            "--previous",
            "a0.json",
            "--stickiness",
            "0",
            "--out",
            "s0.json",
        ],
    );
    run.assert_code(0);
    let cold = read_json(&d.join("c1.json"));
    let zero = read_json(&d.join("s0.json"));
    let (ec, ez) = (
        array_of(&cold["assignments"]),
        array_of(&zero["assignments"]),
    );
    assert_eq!(ec.len(), ez.len());
    let close = |a: &Value, b: &Value| {
        let (a, b) = (f64_of(a), f64_of(b));
        (a - b).abs() <= 1e-9 * a.abs().max(1.0)
    };
    for (c, z) in ec.iter().zip(ez) {
        let id = str_of(&c["map_unit"]);
        assert_eq!(c["map_unit"], z["map_unit"]);
        let (xc, xz) = (array_of(&c["allocations"]), array_of(&z["allocations"]));
        assert!(
            xc.len() == xz.len()
                && xc
                    .iter()
                    .zip(xz)
                    .all(|(p, q)| p["cluster"] == q["cluster"] && close(&p["amount"], &q["amount"]))
                && close(&c["overflow"], &z["overflow"]),
            "{id}: cold {c}, --stickiness 0 {z}"
        );
    }
    // Its churn is the cold map's.
    assert_printed_churn(&run, churn_of(&w1, &a0, &cold));
}

#[test]
fn stickiness_out_of_range_is_an_error_naming_stickiness() {
    let dir = tempdir();
    let d = dir.path();
    sticky_fixture(d);
    for bad in ["2", "nan"] {
        let run = cdnmap(
            d,
            &[
                "solve",
                "w1.json",
                "--previous",
                "a0.json",
                "--stickiness",
                bad,
            ],
        );
        run.assert_error(&["stickiness"]);
        assert!(
            run.stderr.to_lowercase().contains(bad),
            "stderr should name the value {bad}:\n{}",
            run.show()
        );
        cdnmap(
            d,
            &[
                "verify",
                "w0.json",
                "a0.json",
                "--previous",
                "a0.json",
                "--stickiness",
                bad,
            ],
        )
        .assert_error(&["stickiness"]);
    }
}

/// `solve --previous a0.json` of `w0.json` with one cluster `flag`ged (`--down` / `--drain`):
/// the cluster ends up empty, about its demand moves, and `verify` with the same round options
/// accepts the map.
fn failover_moves_only_the_clusters_demand(flag: &str) {
    let dir = tempdir();
    let d = dir.path();
    let (w0, _, a0) = sticky_fixture(d);
    let before = demand_per_cluster(&a0);
    let (busiest, had) = before
        .iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(c, x)| (c.clone(), *x))
        .expect("a0.json places demand");
    assert!(had > 0.0);

    let run = cdnmap(
        d,
        &[
            "solve",
            "w0.json",
            "--previous",
            "a0.json",
            flag,
            &busiest,
            "--out",
            "d.json",
        ],
    );
    run.assert_code(0);
    let after = read_json(&d.join("d.json"));
    let left = demand_per_cluster(&after)
        .get(&busiest)
        .copied()
        .unwrap_or(0.0);
    assert!(left == 0.0, "{flag} {busiest}: {left} demand left there");

    let churn = churn_of(&w0, &a0, &after);
    assert_printed_churn(&run, churn);
    let moved = churn * total_demand(&w0);
    assert!(
        moved >= had * (1.0 - 1e-9),
        "{flag} {busiest}: only {moved} moved of its {had}"
    );
    assert!(
        moved <= 1.2 * had,
        "{flag} {busiest}: {moved} demand moved, {:.2}× the {had} it had",
        moved / had
    );

    let run = cdnmap(
        d,
        &[
            "verify",
            "w0.json",
            "d.json",
            "--previous",
            "a0.json",
            flag,
            &busiest,
        ],
    );
    run.assert_code(0);

    // A cluster the instance does not have.
    cdnmap(
        d,
        &[
            "solve",
            "w0.json",
            "--previous",
            "a0.json",
            flag,
            "no-such-cluster",
        ],
    )
    .assert_error(&["w0.json", "no-such-cluster"]);
    cdnmap(
        d,
        &["verify", "w0.json", "a0.json", flag, "no-such-cluster"],
    )
    .assert_error(&["w0.json", "no-such-cluster"]);
}

#[test]
fn down_cluster_moves_only_its_demand() {
    failover_moves_only_the_clusters_demand("--down");
}

#[test]
fn drained_cluster_moves_only_its_demand() {
    failover_moves_only_the_clusters_demand("--drain");
}

#[test]
fn previous_with_an_unknown_map_unit_is_an_error_naming_the_file() {
    let dir = tempdir();
    let d = dir.path();
    let (_, _, a0) = sticky_fixture(d);
    let mut ghost = a0.clone();
    ghost["assignments"][5]["map_unit"] = Value::from("u99999999-ghost");
    write_json(&d.join("ghost.json"), &ghost);
    cdnmap(d, &["solve", "w1.json", "--previous", "ghost.json"])
        .assert_error(&["ghost.json", "\"u99999999-ghost\""]);
    cdnmap(
        d,
        &["verify", "w1.json", "a0.json", "--previous", "ghost.json"],
    )
    .assert_error(&["ghost.json", "\"u99999999-ghost\""]);
}

/// `--previous` with an allocation of amount 0 (no incumbent), a tiny one (an incumbent) or a
/// negative one (refused, exit 2, naming the file and the unit), for `solve` and `verify`:
/// never a panic (a 0 or negative amount used to shift every later unit's preferences).
#[test]
fn previous_with_zero_tiny_or_negative_amounts() {
    let dir = tempdir();
    let d = dir.path();
    let (_, _, a0) = sticky_fixture(d);
    let with_amount = |name: &str, amount: f64| -> String {
        let mut v = a0.clone();
        let mut unit = String::new();
        for (i, e) in array_of(&v["assignments"]).clone().iter().enumerate() {
            if !array_of(&e["allocations"]).is_empty() && i % 7 == 3 {
                v["assignments"][i]["allocations"][0]["amount"] = Value::from(amount);
                if unit.is_empty() {
                    unit = str_of(&e["map_unit"]).to_string();
                }
            }
        }
        write_json(&d.join(name), &v);
        unit
    };
    for (name, amount) in [("zero.json", 0.0), ("tiny.json", 1e-300)] {
        with_amount(name, amount);
        let out = format!("from-{name}");
        cdnmap(d, &["solve", "w1.json", "--previous", name, "--out", &out]).assert_code(0);
        cdnmap(d, &["verify", "w1.json", &out, "--previous", name]).assert_code(0);
    }
    let unit = with_amount("negative.json", -0.5);
    let quoted = format!("{unit:?}");
    cdnmap(d, &["solve", "w1.json", "--previous", "negative.json"]).assert_error(&[
        "negative.json",
        &quoted,
        "amount",
    ]);
    cdnmap(
        d,
        &[
            "verify",
            "w1.json",
            "a0.json",
            "--previous",
            "negative.json",
        ],
    )
    .assert_error(&["negative.json", &quoted, "amount"]);
}

#[test]
fn demo_runs_a_sticky_second_round() {
    let dir = tempdir();
    let run = cdnmap(
        dir.path(),
        &["demo", "--map-units", "3000", "--clusters", "40"],
    );
    run.assert_code(0);
    assert!(
        run.stdout.lines().any(|l| l.starts_with("round 2")),
        "no round 2:\n{}",
        run.show()
    );
    let churn = printed_churn(&run);
    assert!((0.0..=1.0).contains(&churn), "churn {churn}");
    let verifier: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("verifier"))
        .map(|l| l.split_whitespace().skip(1).collect())
        .collect();
    assert_eq!(
        verifier,
        vec![vec!["0", "violations"]; 2],
        "both rounds should verify clean:\n{}",
        run.show()
    );
}

/// A configuration whose name rules or default class name a class the world does not have is
/// refused at the start (exit 2, naming the class and the keys), instead of passing and then
/// failing every round.
#[test]
fn serve_refuses_classes_the_world_does_not_have() {
    for (top, rules, class) in [
        ("default_class = \"nosuch\"\n", "", "nosuch"),
        (
            "",
            "[[class_rules]]\npattern = \"*.gone.cdn.example\"\nclass = \"gone\"\n",
            "gone",
        ),
    ] {
        let dir = tempdir();
        let data = dir.path().join("data");
        let config = dir.path().join("cdnmap.toml");
        std::fs::write(
            &config,
            format!(
                "grpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n{top}\
                 [demo]\nmap_units = 2000\nclusters = 20\nseed = 1\n\n{rules}",
                data.to_str().expect("a UTF-8 temporary path"),
            ),
        )
        .expect("write the config");
        let config = config.to_str().expect("a UTF-8 path");
        cdnmap(dir.path(), &["serve", "--config", config])
            .assert_error(&[class, "class_rules and default_class"]);
    }
}

/// A bad file, a command that reads it, and the exact error line the command prints (after
/// `error: `), exiting 2 without a panic.
struct BadFile {
    name: &'static str,
    content: Vec<u8>,
    args: &'static [&'static str],
    error: String,
}

/// Bad input on the file surface, as a table: instance files (JSON and compact), demand traces
/// and assignments that are missing, empty, cut, damaged, of the wrong shape, or hold hostile
/// values (a negative demand, a latitude of 1e308, a number past f64, an id with NUL or a
/// bidirectional override, an id of a megabyte, a duplicate id, an unparsable prefix). Each
/// is refused with exactly the error written here: naming the file, the line or the record,
/// the field, and the value (ids and numbers shown short).
#[test]
fn bad_files_are_refused_with_exact_errors() {
    let dir = tempdir();
    let d = dir.path();
    let base = read_json(&example_instance());
    let unit = str_of(&base["map_units"][0]["id"]).to_string();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        edit(&mut v);
        serde_json::to_vec(&v).expect("JSON")
    };
    // A compact world, damaged in the middle and cut in half.
    cdnmap(
        d,
        &[
            "world",
            "--map-units",
            "12",
            "--clusters",
            "4",
            "--seed",
            "7",
            "--format",
            "compact",
            "--out",
            "w.top",
        ],
    )
    .assert_code(0);
    let compact = std::fs::read(d.join("w.top")).expect("the compact world");
    let mut flipped = compact.clone();
    flipped[compact.len() / 2] ^= 1;
    let header = r#"{"header": {"round_ms": 10000, "start_ms": 1764460800000}}"#;
    let trace = |lines: &[String]| format!("{header}\n{}\n", lines.join("\n")).into_bytes();
    let unit_line =
        |t: i64, demand: &str| format!(r#"{{"t": {t}, "map_unit": "{unit}", "demand": {demand}}}"#);
    let solve: &[&str] = &["solve", "{}"];
    let replay: &[&str] = &["replay", "--out", "report", "instance.json", "{}"];
    let verify: &[&str] = &["verify", "instance.json", "{}"];
    std::fs::write(d.join("instance.json"), with(&|_| {})).expect("write");
    let rows = vec![
        BadFile {
            name: "empty.json",
            content: vec![],
            args: solve,
            error: "empty.json:1:0: EOF while parsing a value".into(),
        },
        BadFile {
            name: "negative.json",
            content: with(&|v| v["map_units"][0]["demand"] = Value::from(-3.0)),
            args: solve,
            error: format!(
                "negative.json: map unit {unit:?}: demand is -3, must be a finite number >= 0"
            ),
        },
        BadFile {
            name: "far.json",
            content: with(&|v| v["clusters"][0]["lat"] = Value::from(1e308)),
            args: solve,
            error: "far.json: cluster \"fra-1\": lat is 1e308, must be a latitude in [-90, 90]"
                .into(),
        },
        BadFile {
            name: "past-f64.json",
            content: String::from_utf8(with(&|v| v["map_units"][0]["demand"] = Value::from(7.5)))
                .expect("UTF-8")
                .replacen("7.5", "1e309", 1)
                .into_bytes(),
            args: solve,
            error: format!("past-f64.json:1:715: map unit {unit:?}, demand: number out of range"),
        },
        BadFile {
            name: "nul.json",
            content: with(&|v| v["map_units"][0]["id"] = Value::from("a\u{0}b")),
            args: solve,
            error: "nul.json: map unit id \"a\\0b\" (map unit #0): character U+0000 (a control \
                    or bidirectional formatting character) is not allowed"
                .into(),
        },
        BadFile {
            name: "bidi.json",
            content: with(&|v| v["map_units"][0]["id"] = Value::from("x\u{202e}y")),
            args: solve,
            error: "bidi.json: map unit id \"x\\u{202e}y\" (map unit #0): character U+202E (a \
                    control or bidirectional formatting character) is not allowed"
                .into(),
        },
        BadFile {
            name: "long-id.json",
            content: with(&|v| v["map_units"][0]["id"] = Value::from("a".repeat(1 << 20))),
            args: solve,
            error: format!(
                "long-id.json: map unit id {:?}… (1048576 bytes) (map unit #0): 1048576 bytes, \
                 at most 256",
                "a".repeat(64)
            ),
        },
        BadFile {
            name: "duplicate.json",
            content: with(&|v| v["map_units"][1]["id"] = Value::from(unit.as_str())),
            args: solve,
            error: format!("duplicate.json: duplicate map unit id {unit:?}"),
        },
        BadFile {
            name: "prefix.json",
            content: with(&|v| v["map_units"][0]["prefixes"] = serde_json::json!(["10.0.0.1/33"])),
            args: solve,
            error: format!("prefix.json:1:782: map unit {unit:?}, prefixes[0]: invalid IP address syntax"),
        },
        BadFile {
            name: "damaged.top",
            content: flipped,
            args: solve,
            error: "damaged.top: the compressed compact topology is damaged: Restored data \
                    doesn't match checksum"
                .into(),
        },
        BadFile {
            name: "cut.top",
            content: compact[..compact.len() / 2].to_vec(),
            args: solve,
            error: "cut.top: the compressed compact topology is damaged: incomplete frame".into(),
        },
        BadFile {
            name: "backwards.jsonl",
            content: trace(&[unit_line(20_000, "1"), unit_line(10_000, "1")]),
            args: replay,
            error: "backwards.jsonl:3: time 10000 is before the previous record's 20000"
                .into(),
        },
        BadFile {
            name: "headless.jsonl",
            content: format!("{}\n", unit_line(1, "1")).into_bytes(),
            args: replay,
            error: "headless.jsonl:1: the first line must be the header".into(),
        },
        BadFile {
            name: "negative.jsonl",
            content: trace(&[unit_line(1, "-1e308")]),
            args: replay,
            error: "negative.jsonl:2: demand is -1e308, must be a finite number >= 0".into(),
        },
        BadFile {
            name: "classless.jsonl",
            content: trace(&[r#"{"t": 1, "prefix": "1.2.3.0/24", "demand": 1}"#.into()]),
            args: replay,
            error: "classless.jsonl:2: a prefix record needs a \"class\"".into(),
        },
        BadFile {
            name: "not-an-assignment.json",
            content: with(&|_| {}),
            args: verify,
            error: "not-an-assignment.json:1:11: unknown field `clusters`, expected `assignments` or \
                    `summary`"
                .into(),
        },
        BadFile {
            name: "stat.json",
            content: with(&|v| {
                let c = v["clusters"][0].as_object_mut().expect("a cluster");
                c.remove("state");
                c.insert("stat".into(), "down".into());
            }),
            args: solve,
            error: "stat.json:1:367: cluster \"fra-1\": unknown field `stat`, expected one of \
                    `id`, `lat`, `lon`, `addresses`, `state`, `classes`, `resources`"
                .into(),
        },
        BadFile {
            name: "unit-key.json",
            content: with(&|v| v["map_units"][0]["demnd"] = Value::from(1)),
            args: solve,
            error: format!(
                "unit-key.json:1:720: map unit {unit:?}: unknown field `demnd`, expected one of \
                 `id`, `class`, `demand`, `prefixes`, `lat`, `lon`, `candidates`"
            ),
        },
        BadFile {
            name: "class-key.json",
            content: with(&|v| v["traffic_classes"][0]["per_unit"]["rtt"] = Value::from(1)),
            args: solve,
            error: "class-key.json:1:1020: traffic class \"video\", per_unit: unknown field `rtt`, expected \
                    `bps` or `fps`"
                .into(),
        },
        BadFile {
            name: "assignment-key.json",
            content: br#"{"assignments": [], "sumary": {}}"#.to_vec(),
            args: verify,
            error: "assignment-key.json:1:28: unknown field `sumary`, expected `assignments` or \
                    `summary`"
                .into(),
        },
        BadFile {
            name: "record-key.jsonl",
            content: trace(&[format!(r#"{{"t": 1, "map_unit": "{unit}", "demand": 1, "dmand": 2}}"#)]),
            args: replay,
            error: "record-key.jsonl:2:60: unknown field `dmand`, expected one of `header`, `t`, \
                    `map_unit`, `prefix`, `class`, `demand`, `load`, `state`"
                .into(),
        },
        BadFile {
            name: "header-key.jsonl",
            content: br#"{"header": {"round_ms": 10000, "start_ms": 0, "round_s": 10}}"#.to_vec(),
            args: replay,
            error: "header-key.jsonl:1:55: unknown field `round_s`, expected one of `round_ms`, \
                    `start_ms`, `true_per_unit`"
                .into(),
        },
    ];
    let mut wrong = Vec::new();
    for row in rows {
        std::fs::write(d.join(row.name), &row.content).expect("write the bad file");
        let args: Vec<&str> = row
            .args
            .iter()
            .map(|a| if *a == "{}" { row.name } else { a })
            .collect();
        let run = cdnmap(d, &args);
        run.assert_code(2);
        let line = run
            .stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or("");
        let shown = line.strip_prefix("error: ").unwrap_or(line);
        if shown != row.error {
            wrong.push(format!(
                "{}:\n  shown    {shown}\n  expected {}\n{}",
                row.name,
                row.error,
                run.show()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Nothing missing or unreadable is taken for an empty input.
    for (path, error) in [
        (
            "missing.json",
            "reading missing.json: No such file or directory (os error 2)",
        ),
        (".", "reading .: Is a directory (os error 21)"),
    ] {
        let run = cdnmap(d, &["solve", path]);
        run.assert_code(2);
        assert!(
            run.stderr.contains(&format!("error: {error}")),
            "{}",
            run.show()
        );
    }
}

/// Runs `cdnmap args...` in `dir`, killing it after `secs` (a server given a configuration
/// it should have refused would otherwise serve on and hang the test).
fn cdnmap_within(dir: &Path, args: &[&str], secs: u64) -> Run {
    let mut cmd = Command::new(bin!());
    cmd.current_dir(dir).args(args);
    run_within(cmd, secs)
}

/// Runs `cmd` (stdin closed, stdout and stderr kept), killing it after `secs`.
fn run_within(mut cmd: Command, secs: u64) -> Run {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cdnmap");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().expect("wait for cdnmap").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Run::from(child.wait_with_output().expect("cdnmap's output"))
}

/// Bad input on the configuration surface, as a table: `cdnmap serve` and `cdnmap dns`
/// configurations with an unknown key, a value of the wrong type or out of its range, a
/// token too short, a class no world has, a certificate that is missing or not PEM, a mapper
/// URL of another scheme (alone or in a list), a list of mappers with an empty entry, one
/// listed twice or too many, `https://` without the CA to trust, a CA or a token for a plaintext
/// mapper beyond loopback, no zones or a malformed one. Each is refused at start with exactly
/// the error written here (the parser's message once, not again as its own cause), exiting 2.
#[test]
fn bad_configs_are_refused_with_exact_errors() {
    let dir = tempdir();
    let d = dir.path();
    let serve_base = "grpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\
                      data_dir = \"data\"\ncycle_secs = 10\n";
    let demo = "[demo]\nmap_units = 200\nclusters = 8\nseed = 1\n";
    let dns_base = "listen = \"127.0.0.1:0\"\nzones = [\"cdn.example.\"]\n";
    let front = "the DNS front end's settings";
    let rows: Vec<(&str, String, String)> = vec![
        (
            "serve",
            format!("nonsense_key = 1\n{serve_base}{demo}"),
            "serve.toml: TOML parse error at line 1, column 1\n  |\n1 | nonsense_key = 1\n  | \
             ^^^^^^^^^^^^\nunknown field `nonsense_key`, expected one of `cycle_secs`, \
             `grpc_listen`, `http_listen`, `data_dir`, `maps_kept`, `ttl_secs`, `admin_token`, \
             `admin_token_file`, `learning`, `record_retention_hours`, `record_max_mb`, `instance`, \
             `http_header_timeout_secs`, `http_max_connections`, `grpc_max_connections`, \
             `handshake_timeout_secs`, `idle_timeout_secs`, `max_connections_per_source`, \
             `watch_open`, `watch_stall_secs`, `watch_max_streams`, `etcd`, `node_id`, \
             `etcd_prefix`, `etcd_ca_file`, \
             `etcd_cert_file`, `etcd_key_file`, `advertise_url`, `tls`, \
             `feedback_tokens`, `feedback_tokens_file`, `feedback_samples_per_sec`, \
             `feedback_max_demand_ratio`, `feedback_open`, `default_class`, `class_rules`, `stickiness`, \
             `second_chance`, `guard`, `n1`, `selection`, `demo`, `mmdb`, `health`, `bypass`, `rtt`"
                .into(),
        ),
        (
            "serve",
            format!("{serve_base}[mmdb]\nfiles = [\"w.mmdb\"]\nclass_mix = \"web\"\n"),
            "the configuration's mmdb.class_mix \"web\": class mix \"web\": \"web\" is not \
             CLASS=SHARE"
                .into(),
        ),
        (
            "serve",
            format!("{serve_base}etcd = [\"http://127.0.0.1:2379\"]\n{demo}"),
            "serve.toml: node_id: is needed with etcd: each replica's own name (--node-id)".into(),
        ),
        (
            "serve",
            format!("{serve_base}etcd = [\"127.0.0.1:2379\"]\nnode_id = \"m1\"\n{demo}"),
            "serve.toml: etcd[0]: \"127.0.0.1:2379\" is not an http:// or https:// URL".into(),
        ),
        (
            "serve",
            format!("{serve_base}etcd = [\"https://127.0.0.1:2379\"]\nnode_id = \"m1\"\n{demo}"),
            "serve.toml: etcd_ca_file: is needed with https:// etcd: the CA its certificate must \
             chain to"
                .into(),
        ),
        (
            "serve",
            format!(
                "{serve_base}etcd = [\"https://127.0.0.1:2379\", \"http://127.0.0.1:2380\"]\n\
                 node_id = \"m1\"\netcd_ca_file = \"ca.crt\"\n{demo}"
            ),
            "serve.toml: etcd[1]: \"http://127.0.0.1:2380\": etcd[0] is https://, and every entry \
             must be too"
                .into(),
        ),
        (
            "serve",
            format!("{serve_base}grpc_max_connections = 0\n{demo}"),
            "serve.toml: grpc_max_connections: 0 is outside 1..=100000".into(),
        ),
        (
            "serve",
            format!("{serve_base}feedback_max_demand_ratio = -1.0\n{demo}"),
            "serve.toml: feedback_max_demand_ratio: -1 is outside 1..=1000000".into(),
        ),
        (
            "serve",
            format!("{serve_base}admin_token = \"short\"\n{demo}"),
            "serve.toml: admin_token: must be at least 8 characters, without spaces or control \
             characters"
                .into(),
        ),
        (
            "serve",
            format!("{serve_base}{demo}[feedback_tokens]\nfe1 = \"abc\"\n"),
            "serve.toml: feedback_tokens.\"fe1\": must be at least 8 characters, without spaces \
             or control characters"
                .into(),
        ),
        (
            "serve",
            format!("{serve_base}default_class = \"nosuch\"\n{demo}"),
            "the configuration's class_rules and default_class: default class: unknown traffic \
             class \"nosuch\""
                .into(),
        ),
        (
            "serve",
            format!("{serve_base}{demo}[tls]\ncert_file = \"serve.toml\"\nkey_file = \"serve.toml\"\n"),
            "tls.cert_file serve.toml: no PEM certificate in it".into(),
        ),
        (
            "dns",
            format!("mapper = \"ftp://127.0.0.1:1\"\n{dns_base}"),
            format!("{front}: mapper: \"ftp://127.0.0.1:1\" must be a URL such as http://127.0.0.1:50051"),
        ),
        (
            "dns",
            format!("mapper = \"https://127.0.0.1:1\"\n{dns_base}"),
            format!(
                "{front}: mapper_ca_file: \"https://127.0.0.1:1\" is https://: name the CA its \
                 certificate must chain to"
            ),
        ),
        (
            "dns",
            format!("mapper = \"http://127.0.0.1:1\"\nmapper_ca_file = \"dns.toml\"\n{dns_base}"),
            format!(
                "{front}: mapper_ca_file: is given but the mapper \"http://127.0.0.1:1\" is \
                 plaintext (http://, beyond loopback for a token): use https://"
            ),
        ),
        (
            "dns",
            format!("mapper = \"http://192.0.2.1:1\"\nfeedback_token = \"abcdefghijk\"\n{dns_base}"),
            format!(
                "{front}: feedback_token: is given but the mapper \"http://192.0.2.1:1\" is \
                 plaintext (http://, beyond loopback for a token): use https://"
            ),
        ),
        // A list of mappers (issue 18): each entry checked, named by its position.
        (
            "dns",
            format!("mapper = \"http://127.0.0.1:1, ftp://127.0.0.1:2\"\n{dns_base}"),
            format!("{front}: mapper[1]: \"ftp://127.0.0.1:2\" must be a URL such as http://127.0.0.1:50051"),
        ),
        (
            "dns",
            format!("mapper = \"http://127.0.0.1:1,,http://127.0.0.1:2\"\n{dns_base}"),
            format!(
                "{front}: mapper[1]: an empty entry in \"http://127.0.0.1:1,,http://127.0.0.1:2\" \
                 (a comma too many?)"
            ),
        ),
        (
            "dns",
            format!("mapper = \"http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:1\"\n{dns_base}"),
            format!("{front}: mapper[2]: \"http://127.0.0.1:1\" is listed twice"),
        ),
        (
            "dns",
            format!(
                "mapper = \"{}\"\n{dns_base}",
                (1..=17).map(|p| format!("http://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
            ),
            format!("{front}: mapper: 17 mappers; at most 16"),
        ),
        (
            "dns",
            format!("mapper = \"http://127.0.0.1:1,https://127.0.0.1:2\"\n{dns_base}"),
            format!(
                "{front}: mapper_ca_file: \"https://127.0.0.1:2\" (mapper[1]) is https://: name \
                 the CA its certificate must chain to"
            ),
        ),
        (
            "dns",
            "mapper = \"http://127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\nzones = []\n".into(),
            format!("{front}: zones: 0 zones; 1 to 64 are allowed"),
        ),
        (
            "serve",
            format!("{serve_base}{demo}[second_chance]\nmode = \"sometimes\"\n"),
            "serve.toml: second_chance.mode: \"sometimes\" is not a second chance: off, \
             within-lists or beyond-lists"
                .into(),
        ),
        (
            "dns",
            format!("mapper = \"http://127.0.0.1:1\"\n{dns_base}max_udp_payload = 100\n"),
            format!("{front}: max_udp_payload: 100 is outside 512..=4096"),
        ),
    ];
    for (command, config, error) in rows {
        let file = format!("{command}.toml");
        std::fs::write(d.join(&file), &config).expect("write the configuration");
        let run = cdnmap_within(d, &[command, "--config", &file], 30);
        run.assert_code(2);
        let at = run.stderr.find("error: ").unwrap_or(0);
        let shown = run.stderr[at..].trim_end();
        let shown = shown.strip_prefix("error: ").unwrap_or(shown);
        assert_eq!(shown, error, "{file}:\n{config}\n{}", run.show());
    }
}

/// A Traffic Control coverage zone file imported over the example instance's clusters: each
/// network a unit per class of the mix, the group's cluster first; the import says which
/// groups the mapping misses; the instance solves and verifies. A bad CIDR, an unknown
/// cluster and a groups file with a stray key are refused naming what is wrong.
#[test]
fn a_coverage_zone_file_imports_as_units_over_an_instances_clusters() {
    let dir = tempdir();
    let d = dir.path();
    let base = read_json(&example_instance());
    let clusters: Vec<String> = base["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| c["id"].as_str().expect("an id").to_string())
        .collect();
    let classes: Vec<String> = base["traffic_classes"]
        .as_array()
        .expect("traffic_classes")
        .iter()
        .map(|c| c["name"].as_str().expect("a name").to_string())
        .collect();
    let czf = serde_json::json!({
        "coverageZones": {
            "one": {"network": ["192.0.2.0/24", "198.51.100.0/24"], "network6": ["2001:db8::/48"],
                    "coordinates": {"latitude": 50.1, "longitude": 8.7}},
            "two": {"network": ["203.0.113.0/24"]},
            "stray": {"network": ["10.9.0.0/16"], "coordinates": {"latitude": 52.3, "longitude": 4.9}}
        }
    });
    write_json(&d.join("czf.json"), &czf);
    let last = clusters.last().expect("a cluster");
    std::fs::write(
        d.join("groups.toml"),
        format!("[groups]\none = {last:?}\ntwo = {:?}\n", clusters[0]),
    )
    .expect("write");
    let mix = format!("{}=1", classes[0]);
    let base_path = example_instance();
    let base_arg = base_path.to_str().expect("utf-8");
    let run = cdnmap(
        d,
        &[
            "import",
            "czf",
            "czf.json",
            "--clusters",
            base_arg,
            "--groups",
            "groups.toml",
            "--class-mix",
            &mix,
            "--out",
            "z.json",
        ],
    );
    run.assert_code(0);
    assert!(run.stdout.contains("5 networks taken"), "{}", run.show());
    assert!(run.stdout.contains("stray (1 networks)"), "{}", run.show());
    let z = read_json(&d.join("z.json"));
    let units = z["map_units"].as_array().expect("map_units");
    assert_eq!(units.len(), 5);
    let first_of = |id: &str| -> String {
        let u = units
            .iter()
            .find(|u| u["id"] == id)
            .unwrap_or_else(|| panic!("no {id}"));
        u["candidates"][0]["cluster"]
            .as_str()
            .expect("a cluster")
            .to_string()
    };
    assert_eq!(first_of(&format!("192.0.2.0/24-{}", classes[0])), *last);
    assert_eq!(first_of(&format!("2001:db8::/48-{}", classes[0])), *last);
    assert_eq!(
        first_of(&format!("203.0.113.0/24-{}", classes[0])),
        clusters[0]
    );
    cdnmap(d, &["solve", "z.json", "--out", "za.json"]).assert_code(0);
    cdnmap(d, &["verify", "z.json", "za.json"]).assert_code(0);

    // Refusals, each naming what is wrong.
    let import = |czf: &str, groups: &str| {
        let args = [
            "import",
            "czf",
            czf,
            "--clusters",
            base_arg,
            "--groups",
            groups,
            "--class-mix",
            &mix,
            "--out",
            "x.json",
        ];
        cdnmap(d, &args)
    };
    let bad = serde_json::json!({"coverageZones": {"one": {"network": ["192.0.2.0/24", "192.0.2.300/24"]}}});
    write_json(&d.join("bad.json"), &bad);
    import("bad.json", "groups.toml").assert_error(&[
        "bad.json",
        "coverageZones.one.network[1]",
        "192.0.2.300/24",
    ]);
    std::fs::write(
        d.join("nogroup.toml"),
        "[groups]\none = \"no-such-cluster\"\n",
    )
    .expect("write");
    import("czf.json", "nogroup.toml").assert_error(&["no-such-cluster", "\"one\""]);
    std::fs::write(d.join("stray.toml"), "[groups]\none = \"a\"\n[other]\n").expect("write");
    import("czf.json", "stray.toml").assert_error(&["stray.toml", "other"]);
    assert!(!d.join("x.json").exists(), "nothing written on a refusal");
}

/// Runs `cdnmap args...` in `dir` with `env` set (and `NO_COLOR` and `CDNMAP_*` unset, so
/// only what the test gives counts), killed after `secs`.
fn cdnmap_env(dir: &Path, args: &[&str], env: &[(&str, &str)], secs: u64) -> Run {
    let mut cmd = Command::new(bin!());
    cmd.current_dir(dir)
        .args(args)
        .env_remove("NO_COLOR")
        .env_remove("CDNMAP_LOG_FORMAT")
        .env_remove("CDNMAP_ADMIN_TOKEN")
        .env_remove("CDNMAP_FEEDBACK_TOKEN")
        .env_remove("CDNMAP_FEEDBACK_TOKENS")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied());
    run_within(cmd, secs)
}

/// A `cdnmap serve` configuration in `dir` whose gRPC address is `grpc` (one the test holds,
/// so the start logs its first line and stops at the bind), with `extra` keys.
fn serve_config_on(dir: &Path, grpc: std::net::SocketAddr, extra: &str) -> PathBuf {
    let data = dir.join("data");
    let text = format!(
        "grpc_listen = \"{grpc}\"\nhttp_listen = \"127.0.0.1:0\"\ndata_dir = {data:?}\n{extra}\n\
         [demo]\nmap_units = 300\nclusters = 10\n"
    );
    let path = dir.join("serve.toml");
    std::fs::write(&path, text).expect("write the config");
    path
}

/// The logs: text has no colour codes when it does not go to a terminal (with `NO_COLOR`
/// unset); `--log-format json` or `CDNMAP_LOG_FORMAT=json` writes one JSON object a line, the
/// first the start's: the version, the addresses, the data directory and whether an Admin token
/// is configured, never the token. A format that is neither, from the flag or the
/// environment, is an error naming it (exit 2).
#[test]
fn logs_are_plain_or_json_and_the_first_line_says_version_and_settings() {
    let dir = tempdir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let grpc = taken.local_addr().expect("its address");
    let secret = "the-admin-secret-1234";
    let config = serve_config_on(dir.path(), grpc, &format!("admin_token = {secret:?}"));
    let config = config.to_str().expect("a UTF-8 path");
    let version = env!("CARGO_PKG_VERSION");

    let text = cdnmap_env(dir.path(), &["serve", "--config", config], &[], 30);
    text.assert_error(&[&format!("grpc_listen {grpc}")]);
    assert!(
        !text.stdout.contains('\x1b'),
        "colour codes:\n{}",
        text.show()
    );
    assert!(
        text.stdout.contains("cdnmap serve starting")
            && text.stdout.contains(&format!("version=\"{version}\""))
            && text.stdout.contains("admin_token=\"yes\""),
        "no start line with the version:\n{}",
        text.show()
    );
    assert!(!text.stdout.contains(secret), "{}", text.show());

    let by_flag = cdnmap_env(
        dir.path(),
        &["--log-format", "json", "serve", "--config", config],
        &[],
        30,
    );
    let by_env = cdnmap_env(
        dir.path(),
        &["serve", "--config", config],
        &[("CDNMAP_LOG_FORMAT", "json")],
        30,
    );
    for run in [&by_flag, &by_env] {
        run.assert_error(&[&format!("grpc_listen {grpc}")]);
        let lines: Vec<Value> = run
            .stdout
            .lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}\n{}", run.show()))
            })
            .collect();
        let first = &lines.first().expect("a log line")["fields"];
        assert_eq!(first["message"], "cdnmap serve starting", "{}", run.show());
        assert_eq!(first["version"], version, "{}", run.show());
        assert_eq!(first["grpc_listen"], grpc.to_string(), "{}", run.show());
        assert_eq!(first["admin_token"], "yes", "{}", run.show());
        assert_eq!(first["instance"], "demo", "{}", run.show());
        assert!(!run.stdout.contains(secret), "{}", run.show());
    }

    cdnmap_env(
        dir.path(),
        &["serve", "--config", config],
        &[("CDNMAP_LOG_FORMAT", "xml")],
        30,
    )
    .assert_error(&[
        "CDNMAP_LOG_FORMAT",
        "\"xml\" is not a log format (text or json)",
    ]);
    cdnmap_env(
        dir.path(),
        &["--log-format", "yaml", "serve", "--config", config],
        &[],
        30,
    )
    .assert_error(&[
        "--log-format",
        "\"yaml\" is not a log format (text or json)",
    ]);
    drop(taken);
}

/// A token given twice (inline and in the environment) stops `serve` and `dns` at start,
/// naming both sources; `record export` has no `--token` (a secret on the command line), and
/// names what to use instead.
#[test]
fn a_token_given_twice_is_refused_and_no_token_flag_exists() {
    let dir = tempdir();
    let d = dir.path();
    let serve = d.join("serve.toml");
    std::fs::write(&serve, "admin_token = \"inline-admin-token\"\n").expect("write");
    cdnmap_env(
        d,
        &["serve", "--config", serve.to_str().expect("UTF-8")],
        &[("CDNMAP_ADMIN_TOKEN", "env-admin-token")],
        30,
    )
    .assert_error(&["admin_token: the token is given by admin_token and CDNMAP_ADMIN_TOKEN"]);
    let dns = d.join("dns.toml");
    std::fs::write(&dns, "feedback_token = \"inline-front-token\"\n").expect("write");
    cdnmap_env(
        d,
        &["dns", "--config", dns.to_str().expect("UTF-8")],
        &[("CDNMAP_FEEDBACK_TOKEN", "env-front-token")],
        30,
    )
    .assert_error(&[
        "feedback_token: the token is given by feedback_token and CDNMAP_FEEDBACK_TOKEN",
    ]);
    // The mapper's front-end tokens from the environment: a pair that is not NAME=TOKEN is
    // refused naming the variable, and never shown (it may be a token).
    let run = cdnmap_env(
        d,
        &["serve", "--config", serve.to_str().expect("UTF-8")],
        &[(
            "CDNMAP_FEEDBACK_TOKENS",
            "fe-1=front-end-1-token a-bare-secret-1",
        )],
        30,
    );
    run.assert_error(&[
        "CDNMAP_FEEDBACK_TOKENS: pair 2 is not NAME=TOKEN (pairs separated by white space)",
    ]);
    assert!(!run.stderr.contains("a-bare-secret-1"), "{}", run.show());
    let missing = d.join("no-such-token");
    let run = cdnmap_env(
        d,
        &[
            "record",
            "export",
            "--from",
            "0",
            "--to",
            "1",
            "--http",
            "127.0.0.1:1",
            "--token-file",
            missing.to_str().expect("UTF-8"),
            "out.jsonl",
        ],
        &[],
        30,
    );
    run.assert_error(&[&format!("--token-file {}: ", missing.display())]);
    let run = cdnmap_env(
        d,
        &[
            "record", "export", "--from", "0", "--to", "1", "--token", "x", "o.jsonl",
        ],
        &[],
        30,
    );
    run.assert_error(&["--token"]);
}

// ---------------------------------------------------------------------------------------------
// Long work: replay's streamed rounds, progress lines when stderr is not a terminal.

/// `replay` prints a line for a round as soon as the round is done, not all at the end: the
/// first round's line is read while the report (written after the last round) does not exist
/// yet. With `--every 5`, a line at every 5 simulated minutes and one for the last round; on
/// stderr (a pipe, not a terminal), plain progress lines, the last at 100%.
#[test]
fn replay_streams_a_line_per_round_as_it_goes() {
    use std::io::{BufRead, BufReader, Read};
    let dir = tempdir();
    let d = dir.path();
    cdnmap(
        d,
        &[
            "world",
            "--map-units",
            "300",
            "--clusters",
            "10",
            "--seed",
            "3",
            "--trace",
            "0.25",
            "--out",
            "w.json",
            "--out-trace",
            "t.jsonl",
        ],
    )
    .assert_code(0);
    let mut child = Command::new(bin!())
        .current_dir(d)
        .args([
            "replay", "w.json", "t.jsonl", "--out", "report", "--every", "5",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cdnmap replay");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    // The trace's line, then the first round's.
    let mut read = String::new();
    stdout.read_line(&mut read).expect("read a line");
    let mut first = String::new();
    stdout.read_line(&mut first).expect("read a line");
    let report_then = d.join("report").join("report.md").exists();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("read the rest");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    let show = format!("--- stdout\n{read}{first}{rest}--- stderr\n{stderr}");
    assert!(status.success(), "{show}");
    assert!(read.starts_with("read t.jsonl: 27002 records, "), "{show}");
    assert!(
        first.starts_with("default          0:00 round 1/90: churn "),
        "{show}"
    );
    assert!(
        !report_then,
        "the report was written before the first line was read\n{show}"
    );
    // 90 rounds of 10 s: rounds 1, 31 and 61 start at 0, 5 and 10 minutes, and the last.
    let numbers: Vec<String> = std::iter::once(first.as_str())
        .chain(rest.lines())
        .filter(|l| l.contains(": churn "))
        .filter_map(|l| l.split(" round ").nth(1))
        .filter_map(|r| r.split(':').next())
        .map(str::to_string)
        .collect();
    assert_eq!(numbers, ["1/90", "31/90", "61/90", "90/90"], "{show}");
    assert!(rest.contains("default        90 rounds, "), "{show}");
    assert!(stderr.contains("default: 90/90 (100%), "), "{show}");
}

/// A trace estimated past `--trace-max-bytes` is refused before anything is written, with
/// the estimate and the `--trace-round-ms` that fits; with that round it is written, within
/// the bound.
#[test]
fn a_trace_past_its_byte_bound_is_refused_before_it_is_written() {
    let dir = tempdir();
    let d = dir.path();
    let world = |extra: &[&str]| {
        let mut args = vec![
            "world",
            "--map-units",
            "300",
            "--clusters",
            "10",
            "--seed",
            "3",
            "--trace",
            "2",
            "--trace-max-bytes",
            "2000000",
            "--out",
            "w.json",
            "--out-trace",
            "t.jsonl",
        ];
        args.extend_from_slice(extra);
        cdnmap(d, &args)
    };
    let run = world(&[]);
    run.assert_error(&[
        "error: --trace 2 would write about 14 MB (720 rounds of 10000 ms, 300 map units, ",
        "more than --trace-max-bytes 2000000: give --trace-round-ms 80000 (or more), fewer \
         hours, or a larger --trace-max-bytes",
    ]);
    assert!(!d.join("w.json").exists() && !d.join("t.jsonl").exists());

    world(&["--trace-round-ms", "80000"]).assert_code(0);
    let size = std::fs::metadata(d.join("t.jsonl"))
        .expect("the trace")
        .len();
    assert!(size <= 2_000_000, "{size} bytes");
    let text = std::fs::read_to_string(d.join("t.jsonl")).expect("the trace");
    let header: Value = serde_json::from_str(text.lines().next().expect("a header")).expect("JSON");
    assert_eq!(header["header"]["round_ms"], Value::from(80_000));

    // A round that cannot be: refused before the instance is written, naming the flags.
    let (d, _gone) = (
        d.join("bad-round"),
        std::fs::create_dir(d.join("bad-round")),
    );
    for round in ["0", "9000000"] {
        let run = cdnmap(
            &d,
            &[
                "world",
                "--map-units",
                "300",
                "--clusters",
                "10",
                "--trace",
                "2",
                "--trace-round-ms",
                round,
                "--out",
                "w.json",
                "--out-trace",
                "t.jsonl",
            ],
        );
        run.assert_error(&[&format!("--trace 2 with --trace-round-ms {round}: ")]);
        assert!(
            !d.join("w.json").exists() && !d.join("t.jsonl").exists(),
            "{round}"
        );
    }
}
