//! The DNS load during the rounds: dnsperf when it is installed, else a small generator of the bench's own.

use super::*;

/// The DNS load during the rounds: dnsperf, or the built-in generator on a thread.
pub(crate) enum DnsLoad {
    Dnsperf { proc: Proc, out: PathBuf },
    Own(std::thread::JoinHandle<Result<OwnRun>>),
}

/// What the DNS load measured.
#[derive(Debug, Clone)]
pub(crate) struct DnsFigures {
    pub(crate) tool: String,
    pub(crate) qps: f64,
    pub(crate) noerror_pct: f64,
    pub(crate) lost: f64,
    pub(crate) latency_ms: f64,
}

/// The built-in generator's tally.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OwnRun {
    pub(crate) sent: u64,
    pub(crate) answered: u64,
    pub(crate) noerror: u64,
    pub(crate) lost: u64,
    pub(crate) secs: f64,
}

/// dnsperf's options, for the command and for the report.
pub(crate) fn dnsperf_args(target: SocketAddr, queries: &Path, secs: u64, qps: u64) -> Vec<String> {
    let mut args: Vec<String> = [
        "-s",
        "127.0.0.1",
        "-p",
        &target.port().to_string(),
        "-B",
        "-d",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(queries.display().to_string());
    args.extend(["-l", &secs.to_string(), "-c", "8", "-q", "200"].map(String::from));
    if qps > 0 {
        args.extend(["-Q".to_string(), qps.to_string()]);
    }
    args
}

pub(crate) fn start_dns_load(
    target: SocketAddr,
    queries: &Path,
    secs: u64,
    qps: u64,
    dir: &Path,
) -> Result<DnsLoad> {
    if let Ok(dnsperf) = program("dnsperf") {
        let out = dir.join("dnsperf.out");
        let args = dnsperf_args(target, queries, secs, qps);
        eprintln!("dns load: dnsperf {}", args.join(" "));
        let proc = spawn(Command::new(dnsperf).args(&args), &out, "dnsperf")?;
        return Ok(DnsLoad::Dnsperf { proc, out });
    }
    eprintln!(
        "dns load: dnsperf is not installed (Debian: apt-get install dnsperf); the built-in \
         generator ({OWN_LOAD_WINDOW} in flight, one socket) for {secs} s"
    );
    let messages = read_queries(queries)?;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let handle = std::thread::Builder::new()
        .name("bench-dns-load".into())
        .spawn(move || own_load(target, &messages, deadline, qps))?;
    Ok(DnsLoad::Own(handle))
}

/// The query file's messages (each prefixed by its 2-byte length).
pub(crate) fn read_queries(path: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let mut at = 0;
    while at + 2 <= bytes.len() {
        let len = usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
        let Some(m) = bytes.get(at + 2..at + 2 + len) else {
            bail!("{}: a message runs past the end", path.display());
        };
        out.push(m.to_vec());
        at += 2 + len;
    }
    if out.is_empty() {
        bail!("{}: no query", path.display());
    }
    Ok(out)
}

/// The built-in generator: `OWN_LOAD_WINDOW` queries in flight on one UDP socket, the next
/// sent for each answer, the window counted lost and sent again after 100 ms without one;
/// at most `qps` a second (0: no limit), until `deadline`.
pub(crate) fn own_load(
    target: SocketAddr,
    messages: &[Vec<u8>],
    deadline: Instant,
    qps: u64,
) -> Result<OwnRun> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.connect(target)?;
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
    let started = Instant::now();
    let mut run = OwnRun::default();
    let mut in_flight = 0usize;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let budget = if qps == 0 {
            u64::MAX
        } else {
            (qps as f64 * started.elapsed().as_secs_f64()) as u64
        };
        while in_flight < OWN_LOAD_WINDOW && run.sent < budget {
            let m = &messages[(run.sent % messages.len() as u64) as usize];
            run.sent += 1;
            if socket.send(m).is_ok() {
                in_flight += 1;
            }
        }
        if in_flight == 0 {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        match socket.recv(&mut buf) {
            Ok(n) => {
                run.answered += 1;
                in_flight -= 1;
                if n >= 4 && buf[3] & 0x0f == 0 {
                    run.noerror += 1;
                }
            }
            Err(_) => {
                run.lost += in_flight as u64;
                in_flight = 0;
            }
        }
    }
    run.secs = started.elapsed().as_secs_f64();
    Ok(run)
}

/// Waits for the DNS load to end (bounded by `timeout`) and reads its figures.
pub(crate) fn finish_dns_load(load: DnsLoad, timeout: Duration) -> Result<DnsFigures> {
    match load {
        DnsLoad::Dnsperf { mut proc, out } => {
            let started = Instant::now();
            while proc.0.try_wait()?.is_none() {
                if started.elapsed() > timeout || INTERRUPTED.load(Ordering::Relaxed) {
                    bail!("dnsperf did not end within {timeout:?}");
                }
                std::thread::sleep(POLL);
            }
            let text = std::fs::read_to_string(&out)
                .with_context(|| format!("reading {}", out.display()))?;
            let run = parse_dnsperf(&text).with_context(|| format!("dnsperf: {text}"))?;
            Ok(DnsFigures {
                tool: "dnsperf (-c 8 -q 200)".into(),
                qps: run.qps,
                noerror_pct: run.noerror_pct,
                lost: run.lost,
                latency_ms: run.latency_ms,
            })
        }
        DnsLoad::Own(handle) => {
            let run = handle
                .join()
                .map_err(|_| anyhow::anyhow!("the DNS load generator panicked"))??;
            Ok(DnsFigures {
                tool: format!("the built-in generator ({OWN_LOAD_WINDOW} in flight, one socket)"),
                qps: run.answered as f64 / run.secs.max(1e-9),
                noerror_pct: 100.0 * run.noerror as f64 / (run.answered.max(1)) as f64,
                lost: run.lost as f64,
                latency_ms: f64::NAN,
            })
        }
    }
}
