//! Helpers shared by the end-to-end tests of the `cdnmap` binary (in `tests/tests/`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

pub mod mapper;

/// The `cdnmap` binary, built on first use.
pub fn cdnmap_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("CDNMAP_BIN") {
        Some(p) => PathBuf::from(p),
        None => build_binary(),
    })
}

pub fn workspace_root() -> PathBuf {
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
/// executable comes from: `<target>[/<triple>]/<profile>/deps/<test>-<hash>`.
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

/// The path of `program`, installing Debian's `packages` with apt-get first when it is not on
/// the machine (a fresh machine has only the Rust toolchain, gcc and Python; the tests bring
/// their peers: dig, chromium, ...). Installs run one at a time within this process and wait
/// for another process's apt lock. Errors say what was missing and what apt-get printed.
pub fn ensure_debian_tool(program: &str, packages: &[&str]) -> Result<PathBuf, String> {
    static APT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = APT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = find_program(program) {
        return Ok(found);
    }
    let apt = |args: &[&str]| -> Result<(), String> {
        let out = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "-q", "-y"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{program} is missing and apt-get could not run: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} is missing and `apt-get {}` failed:\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    let mut install = vec!["install", "--no-install-recommends"];
    install.extend_from_slice(packages);
    // The package lists of a fresh machine may be empty or stale: update once, then retry.
    if apt(&install).is_err() {
        apt(&["update"])?;
        apt(&install)?;
    }
    find_program(program).ok_or_else(|| {
        format!(
            "{program} is still missing after installing {}",
            packages.join(" ")
        )
    })
}

/// `program` on `PATH` (or in /usr/sbin and /sbin, where Debian puts daemons).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// A `cdnmap` process a test started, its output (stdout and stderr) in a log file; killed and
/// reaped when dropped.
pub struct Running {
    child: std::process::Child,
    log: PathBuf,
    what: String,
}

impl Running {
    /// Starts `cdnmap ARGS` in `dir` (`RUST_LOG=info`, no colours), logging to `log`.
    pub fn cdnmap<I, S>(dir: &Path, args: I, log: PathBuf) -> Running
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let args: Vec<std::ffi::OsString> =
            args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let what = format!(
            "cdnmap {}",
            args.first()
                .map_or(String::new(), |a| a.to_string_lossy().into_owned())
        );
        let out = std::fs::File::create(&log).expect("create the process log");
        let err = out.try_clone().expect("clone the log handle");
        let child = Command::new(cdnmap_bin())
            .current_dir(dir)
            .args(&args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        Running { child, log, what }
    }

    /// What the process logged so far, for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(no log: {e})"))
    }

    /// Panics (with the log) if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited with {status}:\n{}", self.what, self.log());
        }
    }

    /// Sends SIGTERM (how systemd and Kubernetes stop a service).
    pub fn send_sigterm(&mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap_or_else(|e| panic!("run kill -TERM {pid}: {e}"));
        assert!(sent.success(), "kill -TERM {pid} failed");
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// What it is, for messages.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Kills the process (as a crash would) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}
