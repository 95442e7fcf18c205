//! The processes a benchmark starts and the directory it keeps their logs in: finding a
//! program, a free loopback port, starting a process with its output in a log (killed when
//! dropped), failing when one has exited, and its CPU time and memory from /proc (Linux).

use std::fs::File;
use std::io::{Read, Write};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

/// A child process killed when dropped.
pub(crate) struct Proc(pub(crate) Child, pub(crate) &'static str);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn program(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not installed (Debian: apt-get install {name})"))
}

pub(crate) fn free_port() -> Result<u16> {
    for _ in 0..50 {
        let u = UdpSocket::bind("127.0.0.1:0")?;
        let port = u.local_addr()?.port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no port free for both UDP and TCP on 127.0.0.1")
}

/// Fails, naming the process and the logs, if any of `procs` has exited.
pub(crate) fn check_running(procs: &mut [&mut Proc], dir: &Path) -> Result<()> {
    for p in procs.iter_mut() {
        if let Ok(Some(status)) = p.0.try_wait() {
            bail!(
                "{} exited with {status}; see the logs in {}",
                p.1,
                dir.display()
            );
        }
    }
    Ok(())
}

pub(crate) fn spawn(cmd: &mut Command, log: &Path, name: &'static str) -> Result<Proc> {
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    Ok(Proc(child, name))
}

/// CPU seconds (user + system) a process has used, from /proc (Linux; `None` elsewhere).
pub(crate) fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ is 100 on Linux
}

/// Where a benchmark's files go: `out` (`--out`), else a temporary directory named after
/// `prefix` (returned, to be kept while the servers run).
pub(crate) fn out_dir(out: Option<&Path>, prefix: &str) -> Result<(PathBuf, Scratch)> {
    Ok(match out {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            (d.to_path_buf(), Scratch::default())
        }
        None => {
            let temp = tempfile::Builder::new().prefix(prefix).tempdir()?;
            (temp.path().to_path_buf(), Scratch::new(temp))
        }
    })
}

/// A benchmark's temporary directory: removed once the benchmark has succeeded
/// ([`Scratch::done`]), kept, and named on stderr, when it ends any other way (an error, a
/// panic): its logs are what the error points at. Declared before the processes it holds the
/// logs of, it is dropped after them.
#[derive(Default)]
pub(crate) struct Scratch {
    temp: Option<tempfile::TempDir>,
    done: bool,
}

impl Scratch {
    fn new(temp: tempfile::TempDir) -> Scratch {
        Scratch {
            temp: Some(temp),
            done: false,
        }
    }

    /// The benchmark succeeded: the directory goes.
    pub(crate) fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            if !self.done {
                eprintln!(
                    "kept {} (the logs of the run that failed)",
                    temp.keep().display()
                );
            }
        }
    }
}

/// A process's memory from /proc, in MB: (peak resident, resident now).
pub(crate) fn memory_mb(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// The most bytes read from an HTTP answer (`/metrics`).
const MAX_HTTP_BYTES: u64 = 64 << 20;

/// `GET path` over HTTP/1.1, the body.
pub(crate) fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.take(MAX_HTTP_BYTES).read_to_string(&mut text)?;
    let (_, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path} from {addr}: no HTTP answer"))?;
    Ok(body.to_string())
}
