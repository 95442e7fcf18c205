//! A real etcd for the tests (Debian's `etcd-server`, unpacked rather than installed: its
//! package would start a system service), started on loopback with one or three members,
//! plaintext or serving its clients over TLS (and then asking for their certificates), and
//! stopped when dropped; and a TCP relay the tests can cut, which stands between one replica
//! and etcd as a network partition would (connections stay open, bytes stop).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long etcd may take to answer its health check after a start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The etcd binary, unpacked from Debian's package under `target/`.
pub fn etcd_bin() -> std::path::PathBuf {
    crate::unpacked_debian_program("etcd-server", "usr/bin/etcd").unwrap_or_else(|e| panic!("{e}"))
}

/// A port that was free a moment ago (etcd cannot listen on port 0 and say where).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The TLS of etcd's client port: its certificate and key, and the CA its clients'
/// certificates must chain to (`--client-cert-auth`: a client without one is refused).
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_ca: std::path::PathBuf,
}

/// One member of a running etcd cluster.
pub struct Member {
    pub name: String,
    pub client: SocketAddr,
    /// Where `/health` answers in plaintext (the client port, or with TLS a metrics port).
    health: SocketAddr,
    child: Option<Child>,
    args: Vec<String>,
    log: std::path::PathBuf,
}

/// An etcd cluster on loopback; every member is killed when dropped.
pub struct Etcd {
    pub members: Vec<Member>,
    tls: bool,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts `n` members (1 or 3) and waits until each answers `/health` with true. etcd
    /// cannot listen on port 0, so its ports are ones found free a moment before: when another
    /// process took one meanwhile (a member exits at once), the cluster is started again on
    /// other ports, up to three times.
    pub fn start(n: usize) -> Etcd {
        Etcd::start_with(n, None)
    }

    /// [`Etcd::start`] with its client port over TLS (`https://`), asking for client
    /// certificates.
    pub fn start_tls(n: usize, tls: &ServerTls) -> Etcd {
        Etcd::start_with(n, Some(tls))
    }

    fn start_with(n: usize, tls: Option<&ServerTls>) -> Etcd {
        let mut last = String::new();
        for _ in 0..3 {
            match Etcd::try_start(n, tls) {
                Ok(etcd) => return etcd,
                Err(e) => last = e,
            }
        }
        panic!("etcd did not start in three tries: {last}")
    }

    fn try_start(n: usize, tls: Option<&ServerTls>) -> Result<Etcd, String> {
        let bin = etcd_bin();
        let dir = tempfile::Builder::new()
            .prefix("cdnmap-etcd-")
            .tempdir()
            .expect("a temporary directory");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        let scheme = if tls.is_some() { "https" } else { "http" };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("e{i}");
            let mut args = vec![
                format!("--name={name}"),
                format!("--data-dir={}", dir.path().join(&name).display()),
                format!("--listen-client-urls={scheme}://127.0.0.1:{client}"),
                format!("--advertise-client-urls={scheme}://127.0.0.1:{client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster={cluster}"),
                "--initial-cluster-state=new".into(),
                "--initial-cluster-token=cdnmap-test".into(),
                // Quick elections among the members, as on one machine.
                "--heartbeat-interval=100".into(),
                "--election-timeout=1000".into(),
            ];
            let client = SocketAddr::from(([127, 0, 0, 1], *client));
            let mut health = client;
            if let Some(t) = tls {
                health = SocketAddr::from(([127, 0, 0, 1], free_port()));
                args.extend([
                    format!("--cert-file={}", t.cert.display()),
                    format!("--key-file={}", t.key.display()),
                    format!("--trusted-ca-file={}", t.client_ca.display()),
                    "--client-cert-auth".into(),
                    format!("--listen-metrics-urls=http://{health}"),
                ]);
            }
            let mut m = Member {
                name: name.clone(),
                client,
                health,
                child: None,
                args,
                log: dir.path().join(format!("{name}.log")),
            };
            m.spawn(&bin);
            members.push(m);
        }
        let mut etcd = Etcd {
            members,
            tls: tls.is_some(),
            _dir: dir,
        };
        for i in 0..etcd.members.len() {
            etcd.members[i].wait_healthy()?;
        }
        Ok(etcd)
    }

    /// The client URLs, comma-separated (`cdnmap serve --etcd`).
    pub fn urls(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) every member: etcd down entirely, as a process
    /// that no longer answers.
    pub fn pause_all(&self, pause: bool) {
        for m in &self.members {
            m.signal(if pause { "STOP" } else { "CONT" });
        }
    }
}

impl Member {
    fn spawn(&mut self, bin: &std::path::Path) {
        let log = std::fs::File::create(&self.log).expect("the etcd log");
        let child = Command::new(bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the etcd log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the member (SIGKILL): the cluster goes on with the others while they are a
    /// quorum.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([format!("-{sig}"), c.id().to_string()])
                .status();
        }
    }

    /// Waits until `/health` says true; an error (with the member's log) when the member
    /// exited or did not get there within the limit.
    pub fn wait_healthy(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Ok(body) = http_get(self.health, "/health") {
                if body.contains("\"health\":\"true\"") {
                    return Ok(());
                }
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Err(format!(
                    "etcd {} exited ({status}):\n{}",
                    self.name,
                    self.log()
                ));
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(format!(
                    "etcd {} not healthy within {READY_TIMEOUT:?}:\n{}",
                    self.name,
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // A paused member must be resumed for SIGKILL's exit to be reaped promptly.
            let _ = c.kill();
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }
}

/// A bare HTTP/1.0 GET on loopback, its body (etcd's `/health`).
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// A TCP relay to `target` that can be cut: cut, it forwards nothing either way and connects
/// nothing new, but closes no connection (as a partition: the replica's calls hang, then time
/// out; healed, what was sent arrives). Its threads end when it is dropped.
pub struct Relay {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
}

impl Relay {
    pub fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a relay port");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("the relay's address");
        let cut = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (c, d) = (Arc::clone(&cut), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !d.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        if c.load(Ordering::Relaxed) {
                            held.push(down); // accepted, never answered
                            continue;
                        }
                        let Ok(up) = TcpStream::connect(target) else {
                            continue;
                        };
                        for (from, to) in [
                            (down.try_clone(), up.try_clone()),
                            (up.try_clone(), down.try_clone()),
                        ] {
                            if let (Ok(from), Ok(to)) = (from, to) {
                                let (c, d) = (Arc::clone(&c), Arc::clone(&d));
                                std::thread::spawn(move || pump(from, to, &c, &d));
                            }
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Relay { addr, cut, done }
    }

    /// Cuts (true) or heals (false) the relay.
    pub fn cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` while not cut (cut, nothing is read: the bytes wait in the kernel's
/// buffers and go on after the cut heals, as TCP's retransmissions would carry them), until
/// either side closes or the relay is dropped.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool, done: &AtomicBool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 16 << 10];
    while !done.load(Ordering::Relaxed) {
        if cut.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
