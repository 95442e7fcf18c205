//! Helpers shared by the end-to-end tests of the `cdnmap` binary: the workspace's `tests/*.rs`,
//! which are the root package's integration tests, so Cargo builds the binary before them and
//! tells them where it is (`CARGO_BIN_EXE_cdnmap`, at compile time). This library cannot see
//! that variable (Cargo sets it for integration tests only): each test hands the path in,
//! through [`bin!`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub mod config_doc;
pub mod dns;
pub mod etcd;
pub mod fuzz;
pub mod mapper;
pub mod pki;

/// The path of the `cdnmap` binary Cargo built for the calling test, a `&'static Path`:
/// `env!("CARGO_BIN_EXE_cdnmap")`, expanded in the test crate (where Cargo sets it).
#[macro_export]
macro_rules! bin {
    () => {
        ::std::path::Path::new(::std::env!("CARGO_BIN_EXE_cdnmap"))
    };
}

/// The address named `field` (`grpc`, `http`, `dns`, `metrics`) in the `listening` line a
/// `cdnmap serve` or `cdnmap dns` logs once it has bound its sockets, if it has: servers in the
/// tests listen on port 0, and this is how a test learns where.
pub fn listening_addr(log: &str, field: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains(" listening "))?;
    let key = format!(" {field}=");
    let at = line.find(&key)? + key.len();
    line[at..].split_whitespace().next()?.parse().ok()
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace")
        .to_path_buf()
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
        let mut all = vec!["-o", "DPkg::Lock::Timeout=600", "-q", "-y"];
        all.extend_from_slice(args);
        run_tool("apt-get", &all, None).map_err(|e| format!("{program} is missing and {e}"))
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

/// `path` (inside Debian's `package`, such as `usr/bin/promtool`), from the package downloaded
/// and unpacked, not installed, under the workspace's `target/debian-unpacked/<package>`: for
/// a tool whose package would also install and start a service (prometheus's promtool, whose
/// package starts a Prometheus server on port 9090).
pub fn unpacked_debian_program(package: &str, path: &str) -> Result<PathBuf, String> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = workspace_root()
        .join("target")
        .join("debian-unpacked")
        .join(package);
    let program = dir.join(path);
    if program.is_file() {
        return Ok(program);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let run = |cmd: &str, args: &[&str]| run_tool(cmd, args, Some(&dir));
    // The package lists of a fresh machine may be empty or stale: update once, then retry.
    if run("apt-get", &["-q", "download", package]).is_err() {
        run("apt-get", &["-q", "-y", "update"])?;
        run("apt-get", &["-q", "download", package])?;
    }
    let deb = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| {
            format!(
                "apt-get download {package} left no .deb in {}",
                dir.display()
            )
        })?;
    let deb = deb
        .to_str()
        .ok_or("a .deb path that is not UTF-8")?
        .to_string();
    run("dpkg-deb", &["-x", &deb, "."])?;
    if program.is_file() {
        Ok(program)
    } else {
        Err(format!("{package} holds no {path}"))
    }
}

/// Runs `cmd args` (in `dir`, if given) with no input, non-interactively; an error says what
/// failed and what it printed.
fn run_tool(cmd: &str, args: &[&str], dir: Option<&Path>) -> Result<(), String> {
    let mut command = Command::new(cmd);
    command
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let out = command
        .output()
        .map_err(|e| format!("`{cmd}` could not run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{cmd} {}` failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `promtool check metrics` (Prometheus's own linter) on a `/metrics` body: `Err` with what
/// it printed when it finds anything (no HELP text, a `_total` gauge, ...).
pub fn promtool_check_metrics(body: &str) -> Result<(), String> {
    use std::io::Write as _;
    let promtool = unpacked_debian_program("prometheus", "usr/bin/promtool")?;
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool could not run: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("promtool's stdin")?
        .write_all(body.as_bytes())
        .map_err(|e| format!("writing to promtool: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("promtool: {e}"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("promtool check metrics ({}):\n{said}", out.status))
    }
}

/// Runs `cdnmap args...` (with `PATH` set to `path`, if given) and asserts it is refused: exit
/// code 2, `needle` on stderr, no panic. Returns stderr, for further checks.
pub fn assert_refused(bin: &Path, args: &[&str], path: Option<&str>, needle: &str) -> String {
    let mut cmd = Command::new(bin);
    cmd.args(args).stdin(Stdio::null());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let out = cmd.output().expect("run cdnmap");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: stderr should mention {needle:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
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
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts the `cdnmap` binary `bin` (see [`bin!`]) with `ARGS` in `dir` (`RUST_LOG=info`,
    /// no colours), logging to `log`.
    pub fn cdnmap<I, S>(bin: &Path, dir: &Path, args: I, log: PathBuf) -> Running
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
        let child = Command::new(bin)
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
        self.send_signal("TERM");
    }

    /// Sends the signal named `name` (`kill -NAME`: "TERM", "HUP").
    pub fn send_signal(&mut self, name: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .unwrap_or_else(|e| panic!("run kill -{name} {pid}: {e}"));
        assert!(sent.success(), "kill -{name} {pid} failed");
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
