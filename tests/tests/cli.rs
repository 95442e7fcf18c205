//! End-to-end tests of the real `cdnmap` binary: generate a world, solve it, verify the
//! assignment, catch tampered assignments, refuse bad input with exit code 2 and a message that
//! names the file and the problem (never a panic), and reproduce DESIGN.md's worked example.
//!
//! Exit codes (ARCHITECTURE.md, `ops/`): 0 success, 1 violations found, 2 error.
//!
//! The binary belongs to the root package, so Cargo does not hand this package a
//! `CARGO_BIN_EXE_cdnmap`, and `cargo test --workspace` builds `cdnmap` only as a unit-test
//! harness, never as `target/<profile>/cdnmap`. So the first test to need it runs
//! `cargo build --bin cdnmap` once, for the profile and target directory this test executable was
//! built in (a no-op when the binary is up to date, so it is never stale), and takes the
//! binary's path from Cargo's JSON messages. `CDNMAP_BIN=/path/to/cdnmap` skips the build.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Finding (building) the binary.

/// The `cdnmap` binary, built on first use.
fn cdnmap_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("CDNMAP_BIN") {
        Some(p) => PathBuf::from(p),
        None => build_binary(),
    })
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
}

fn cargo() -> PathBuf {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("cargo"))
}

/// `cargo build --bin cdnmap` for the profile (and target directory and triple) this test
/// executable comes from: `<target>[/<triple>]/<profile>/deps/cli-<hash>`.
fn build_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in <target>/<profile>/deps");
    let profile = profile_dir
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("debug")
        .to_string();

    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace_root())
        .args(["build", "--bin", "cdnmap", "--message-format=json"])
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"));
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    // Cargo marks the root of a target directory with CACHEDIR.TAG; one level further up means
    // the executable was built for an explicit `--target <triple>`.
    if let Some(up) = profile_dir.parent() {
        if up.join("CACHEDIR.TAG").is_file() {
            cmd.arg("--target-dir").arg(up);
        } else if let (Some(root), Some(triple)) = (up.parent(), up.file_name()) {
            if root.join("CACHEDIR.TAG").is_file() {
                cmd.arg("--target-dir")
                    .arg(root)
                    .arg("--target")
                    .arg(triple);
            }
        }
    }
    let fallback = profile_dir.join(format!("cdnmap{}", std::env::consts::EXE_SUFFIX));
    let out = match cmd.stdin(Stdio::null()).output() {
        Ok(out) => out,
        Err(e) if fallback.is_file() => {
            eprintln!("could not run cargo ({e}); using {}", fallback.display());
            return fallback;
        }
        Err(e) => panic!("could not run cargo to build cdnmap: {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo build --bin cdnmap failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        stdout
    );
    let exe = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "cdnmap")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or(fallback);
    assert!(exe.is_file(), "no cdnmap binary at {}", exe.display());
    exe
}

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
    let out = Command::new(cdnmap_bin())
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
    cdnmap(d, &["solve", "garbage.json"]).assert_error(&["garbage.json", "not a valid file"]);
    cdnmap(d, &["verify", example, "garbage.json"])
        .assert_error(&["garbage.json", "not a valid file"]);

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

/// `FormatError::Json` (mapper/src/format.rs) prints its serde error in its own message
/// (`"not a valid file: {0}"`) and also returns it as its `source()` (`#[from]`), so the binary's
/// `{:#}` chain prints the cause twice: `error: g.json: not a valid file: expected value at
/// line 1 column 1: expected value at line 1 column 1`.
#[test]
fn json_error_cause_is_printed_once() {
    let dir = tempdir();
    std::fs::write(dir.path().join("garbage.json"), "this is not json {").expect("write");
    let run = cdnmap(dir.path(), &["solve", "garbage.json"]);
    run.assert_error(&["garbage.json", "not a valid file"]);
    let cause = "expected ident at line 1 column 2";
    assert_eq!(run.stderr.matches(cause).count(), 1, "{}", run.show());
}
