//! `cdnmap dns`: an authoritative DNS front end that answers from a local copy of the map.
//!
//! These tasks share one [`front::Front`]:
//! - a watcher per mapper (the config's `mapper` is a list: the replicas of a highly available
//!   mapper) holds a `WatchMap` stream to it, applies each update with a
//!   [`local::Follower`] lent the version in use ([`in_use`]), indexes a new version on a
//!   blocking thread and, when its identity (epoch, version) is above the one in use, swaps
//!   it in whole; when a stream breaks it reconnects with backoff, asking only for what the
//!   version in use lacks, and the last map keeps answering meanwhile;
//! - hickory's server answers UDP and TCP queries from the published view, with no round trip;
//! - the reporter sends the period's per-prefix query counts through Feedback.ReportDemand to
//!   every mapper at once, in batches of at most 100,000 samples, keeping a batch for the next
//!   period when no mapper took it, and rebuilds bounded-loads selectors over the hostnames
//!   seen.

pub mod answer;
pub mod config;
pub mod cookie;
pub mod demand;
pub mod dnssec;
pub mod dnstap;
pub mod front;
pub mod in_use;
pub mod local;
pub mod rrl;
pub mod service;
mod udp;
mod walk;
mod wire;
pub mod zonedata;

#[cfg(test)]
mod fuzz;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cdnmap_proto::v1 as pb;
use cdnmap_proto::MAX_REPORT_SAMPLES;
use tokio::net::TcpListener;

pub use config::DnsConfig;

use answer::Handler;
use cdnmap_serve::watch::Followed;
use demand::Counts;
use front::{Front, Zones};
use in_use::{InUse, Taken};
use local::{Follower, LocalView};

/// Backoff between reconnection attempts to the mapper. The cap is short because a mapper's
/// restart is what a front end most often waits through (about 12 s at a million map units):
/// with 5 s, `bench serve` saw the stream reopen 4.5 s after the mapper listened again. An
/// attempt on a mapper that is down costs one refused connection.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// The cap while the front end holds no map (it has nothing to answer with but the refusal):
/// started beside a mapper that is starting too, it waits at most this long once the mapper
/// listens.
const RECONNECT_MAX_EMPTY: Duration = Duration::from_millis(250);
/// Response buffer per TCP connection (hickory's).
const TCP_RESPONSE_BUFFER: usize = 64;
/// The longest a demand report may wait for its ack: a mapper that does not answer by then
/// is treated as one that failed (the counts are kept for the next period), so a stuck call
/// never stops the reports after it.
const REPORT_DEADLINE: Duration = Duration::from_secs(10);

/// The wall clock in milliseconds since the Unix epoch: read for the SOA serial and the report
/// periods only.
fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Runs the front end until `shutdown` resolves. Binds UDP and TCP on `config.listen` before
/// returning its first error, so a port in use is reported at once. Port 0 takes a port free for
/// both (and `metrics_listen` port 0 any free port): the log's `listening` line names the
/// addresses bound. Each change of `hangups` (the SIGHUPs the process had, counted) reloads
/// the TLS files of the links to the mappers ([`reload_on_hangup`]).
pub async fn run(
    config: DnsConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    hangups: tokio::sync::watch::Receiver<u64>,
) -> anyhow::Result<()> {
    run_from(config, None, shutdown, hangups).await
}

/// [`run`], the configuration read from `config_file` (then overridden by the command line):
/// on SIGHUP its zone data, DNSSEC keys and cookie secrets are read again from the file and
/// replace those in use ([`reload_zone_data`]).
pub async fn run_from(
    config: DnsConfig,
    config_file: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    hangups: tokio::sync::watch::Receiver<u64>,
) -> anyhow::Result<()> {
    config.validate()?;
    let zones = config.zones()?;
    let following = Arc::new(following(&config)?);
    // The metrics listener is bound (and the recorder installed, before the front registers
    // its counters) first: a port in use stops the start at once.
    let metrics = match config.metrics_listen {
        Some(addr) => {
            let mappers: Vec<String> = following.links.iter().map(|l| l.url.clone()).collect();
            Some(bind_metrics(addr, &mappers).await?)
        }
        None => None,
    };
    let front = Arc::new(front(&config, &zones)?);
    let reloader = tokio::spawn(reload_on_hangup(
        config.clone(),
        config_file,
        Arc::clone(&following),
        Arc::clone(&front),
        hangups,
    ));
    let (metrics_task, metrics_addr) = match metrics {
        Some((listener, prometheus)) => {
            let bound = listener.local_addr()?;
            let task = serve_metrics(
                listener,
                prometheus,
                Arc::clone(&front),
                config.mapper.clone(),
            );
            (Some(task), Some(bound))
        }
        None => (None, None),
    };
    let answering = Answering::start(&config, &front, metrics_addr).await?;
    let watchers: Vec<_> = (0..following.links.len())
        .map(|i| tokio::spawn(watch(Arc::clone(&following), i, Arc::clone(&front))))
        .collect();
    let reporter = tokio::spawn(report(
        config.clone(),
        Arc::clone(&following),
        Arc::clone(&front),
    ));
    shutdown.await;
    for w in &watchers {
        w.abort();
    }
    reporter.abort();
    reloader.abort();
    let stopped = answering.stop(&config, &following, &front).await;
    if let Some(t) = metrics_task {
        t.abort();
    }
    stopped
}

/// What answers queries: the UDP answering loops, hickory's server (TCP) and the dnstap writer
/// both log to.
struct Answering {
    server: hickory_server::Server<dnstap::Tapped<Handler>>,
    udp_threads: Vec<std::thread::JoinHandle<()>>,
    /// Set to stop the UDP loops.
    stop: Arc<std::sync::atomic::AtomicBool>,
    dnstap: Option<dnstap::Dnstap>,
}

impl Answering {
    /// Binds the listeners (`config.listen`; port 0 takes any free port) and starts answering
    /// from `front`: `udp_threads` loops (default one per core), each on its own socket
    /// (SO_REUSEPORT), and hickory's TCP server. Logs the addresses bound (with the metrics
    /// listener's, `metrics`): how tests find them without racing for free ports.
    async fn start(
        config: &DnsConfig,
        front: &Arc<Front>,
        metrics: Option<SocketAddr>,
    ) -> anyhow::Result<Answering> {
        let loops = config
            .udp_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        let (tcp, sockets) = bind(config.listen, loops).await?;
        let listen = tcp.local_addr()?;
        match metrics {
            Some(metrics) => tracing::info!(dns = %listen, metrics = %metrics, "listening"),
            None => tracing::info!(dns = %listen, "listening"),
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let coalesce = Duration::from_micros(config.udp_coalesce_us);
        // dnstap (`dnstap_file`, `dnstap_socket`): a writer thread the answering loops hand to.
        dnstap::register_metrics();
        let dnstap = match dnstap::Settings::from_config(config)? {
            Some(s) => Some(dnstap::Dnstap::start(&s, listen)?),
            None => None,
        };
        let udp_threads = spawn_udp(sockets, front, &stop, coalesce, dnstap.as_ref())?;
        let mut server = hickory_server::Server::new(dnstap::Tapped {
            inner: Handler(Arc::clone(front)),
            tap: dnstap.as_ref().map(dnstap::Dnstap::tcp),
        });
        server.register_listener(
            tcp,
            Duration::from_secs(config.tcp_timeout_secs),
            TCP_RESPONSE_BUFFER,
        );
        tracing::info!(
            listen = %listen,
            mapper = %config.mapper,
            zones = ?config.zones,
            "cdnmap dns serving: try `dig @{} -p {} www.{} A +subnet=1.2.3.0/24`",
            listen.ip(),
            listen.port(),
            config.zones[0].trim_end_matches('.'),
        );
        Ok(Answering {
            server,
            udp_threads,
            stop,
            dnstap,
        })
    }

    /// Stops answering, in an order that loses nothing counted or logged: the UDP loops first
    /// (joined), then a last demand report of what they counted since the previous one, then
    /// the TCP server (its connections finished), then dnstap's last frames and its stream
    /// closed (STOP), once no answer can be logged any more.
    async fn stop(
        self,
        config: &DnsConfig,
        following: &Following,
        front: &Front,
    ) -> anyhow::Result<()> {
        let Answering {
            mut server,
            udp_threads,
            stop,
            dnstap,
        } = self;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in udp_threads {
            let _ = t.join();
        }
        send_demand(config, &following.links, front).await;
        let shut = server.shutdown_gracefully().await;
        drop(server);
        if let Some(d) = dnstap {
            let _ = tokio::task::spawn_blocking(move || d.finish()).await;
        }
        shut?;
        Ok(())
    }
}

/// The links to the configured mappers, none in use yet (a plaintext link beyond loopback is
/// warned of).
fn following(config: &DnsConfig) -> anyhow::Result<Following> {
    let links = config
        .mappers()
        .into_iter()
        .map(|url| MapperLink::new(config, url))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for link in &links {
        if config.mapper_ca_file.is_none() && !config::is_loopback(&link.url) {
            tracing::warn!(mapper = %link.url, "following a mapper beyond loopback in plaintext: use https:// and mapper_ca_file");
        }
    }
    Ok(Following {
        links,
        in_use: Mutex::default(),
    })
}

/// What the answering threads share, from `config` and its `zones`: the zone data (static
/// records, service bindings), the identity, the cookies' secrets, rate limiting and the
/// DNSSEC keys, each read and checked now (an error names its key).
fn front(config: &DnsConfig, zones: &[zonedata::ZoneConfig]) -> anyhow::Result<Front> {
    let statics = config.static_data()?;
    let keyset = config.dnssec_keyset()?;
    if let Some(k) = &keyset {
        tracing::info!(keys = %k.summary(), "DNSSEC: signing answers to queries with the DO bit");
    }
    for z in zones {
        for ns in zonedata::unaddressed(z, &statics) {
            tracing::warn!(zone = %z.apex, nameserver = %ns, "a nameserver inside its zone without an address: give it an A or AAAA record in [[records]] (a delegation checker flags it)");
        }
    }
    let services = config.services()?;
    Ok(Front::new(
        Zones::with_data(zones, config.soa_serial, config.ttl_secs, statics)
            .with_services(services),
        config.ttl_secs,
        config.max_udp_payload,
        now_unix_ms(),
    )
    .with_identity(&config.name)
    .with_cookies(cookies_of(config)?)
    .with_rrl(rrl_of(config))
    .with_dnssec(dnssec::Signing::new(
        keyset,
        config.dnssec_validity(),
        config.dnssec_cache_entries,
    )))
}

/// The server cookies' secrets of `config`, else a random one for this process (logged: its
/// cookies are not valid at other front ends).
fn cookies_of(config: &DnsConfig) -> anyhow::Result<cookie::Cookies> {
    Ok(match config.cookies()? {
        Some(c) => c,
        None => {
            tracing::info!("no cookie_secret: DNS cookies made with a random secret of this process (give the fleet one secret so that its cookies are valid at every front end)");
            cookie::Cookies::random()
        }
    })
}

/// The response rate limiting of `config`, if it is on (logged).
fn rrl_of(config: &DnsConfig) -> Option<rrl::Rrl> {
    let limits = config.rrl();
    let on = rrl::Rrl::new(limits, rand::random())?;
    tracing::info!(
        responses_per_sec = limits.responses_per_sec,
        window_secs = limits.window_secs,
        slip = limits.slip,
        ipv4_prefix = limits.ipv4_prefix,
        ipv6_prefix = limits.ipv6_prefix,
        "response rate limiting on UDP"
    );
    Some(on)
}

/// A thread answering UDP on each of `sockets` until `stop` is set (`udp::serve`), each with
/// its own dnstap handle when `dnstap` is on.
fn spawn_udp(
    sockets: Vec<Arc<std::net::UdpSocket>>,
    front: &Arc<Front>,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    coalesce: Duration,
    dnstap: Option<&dnstap::Dnstap>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let handler = Arc::new(Handler(Arc::clone(front)));
    sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let (handler, stop) = (Arc::clone(&handler), Arc::clone(stop));
            let runtime = tokio::runtime::Handle::current();
            let tap = dnstap.map(dnstap::Dnstap::tap);
            std::thread::Builder::new()
                .name(format!("dns-udp-{i}"))
                .spawn(move || udp::serve(socket, handler, runtime, stop, coalesce, tap))
        })
        .collect()
}

/// How many ports `listen` port 0 tries: each is one the kernel found free for TCP, so it is
/// taken for UDP only by chance.
const ANY_PORT_TRIES: usize = 16;

/// TCP and `loops` UDP sockets on one address: TCP first, so a port in use is reported before
/// any UDP socket takes it, then UDP on the port TCP got. With port 0, a port whose UDP side is
/// in use elsewhere is passed over for another (each held until the end, so the kernel does not
/// hand it out again).
async fn bind(
    listen: SocketAddr,
    loops: usize,
) -> anyhow::Result<(TcpListener, Vec<Arc<std::net::UdpSocket>>)> {
    let mut passed_over = Vec::new();
    loop {
        let tcp = TcpListener::bind(listen)
            .await
            .map_err(|e| anyhow::anyhow!("listen {listen}: TCP: {e}"))?;
        let bound = tcp.local_addr()?;
        match udp::bind(bound, loops) {
            Ok(sockets) => return Ok((tcp, sockets)),
            Err(e)
                if listen.port() == 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && passed_over.len() + 1 < ANY_PORT_TRIES =>
            {
                passed_over.push(tcp);
            }
            Err(e) => return Err(anyhow::anyhow!("listen {listen}: UDP on {bound}: {e}")),
        }
    }
}

/// The HELP text of every metric the front end exports (`promtool check metrics` wants one
/// for each).
fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "cdnmap_dns_responses_total",
        "DNS responses sent, by rcode (NOERROR, NXDOMAIN, REFUSED, SERVFAIL, FORMERR, NOTIMP, BADVERS) and answer (NOERROR: records or nodata; else none)."
    );
    describe_histogram!(
        "cdnmap_dns_udp_batch_duration_seconds",
        Unit::Seconds,
        "Per UDP receive (recvmmsg, up to 32 queries), the time from its return to its responses sent: the longest any of its queries spent in the process (time waiting in the socket buffer not counted)."
    );
    describe_counter!(
        "cdnmap_dns_answers_by_route_total",
        "DNS answers with addresses, by why they name their clusters (mapped, split, backup, overflow, down, unmatched)."
    );
    describe_counter!(
        "cdnmap_dns_dnssec_signatures_total",
        "DNSSEC signatures an answer needed, by cache: hit (found in the signature cache) or miss (made then)."
    );
    describe_counter!(
        "cdnmap_dns_send_errors_total",
        "DNS responses that could not be sent."
    );
    describe_counter!(
        "cdnmap_dns_udp_receives_total",
        "recvmmsg calls that returned datagrams, over all UDP loops (datagrams / receives: the mean batch)."
    );
    describe_counter!(
        "cdnmap_dns_udp_datagrams_total",
        "UDP datagrams received, over all UDP loops."
    );
    describe_counter!(
        "cdnmap_dns_udp_coalescing_waits_total",
        "Times a UDP loop under load waited udp_coalesce_us between receives, to take the next batch whole."
    );
    describe_counter!(
        "cdnmap_dns_reconnects_total",
        "Times the WatchMap stream to a mapper was opened again, by mapper."
    );
    describe_gauge!(
        "cdnmap_dns_mapper_connected",
        "Whether the WatchMap stream to a mapper is open (1) or not (0), by mapper."
    );
    describe_counter!(
        "cdnmap_dns_demand_samples_sent_total",
        "Demand samples (prefix, class, queries) a mapper accepted, by mapper."
    );
    describe_counter!(
        "cdnmap_dns_demand_refused_total",
        "Demand samples a mapper refused, by mapper."
    );
    describe_counter!(
        "cdnmap_dns_demand_dropped_total",
        "Queries not counted as demand because the period's table was full."
    );
    describe_counter!(
        "cdnmap_dns_rrl_dropped_total",
        "UDP responses response rate limiting dropped (over a client prefix's limit)."
    );
    describe_counter!(
        "cdnmap_dns_rrl_slipped_total",
        "UDP responses response rate limiting sent as a slip instead (TC=1, or BADCOOKIE to a query with a cookie)."
    );
    describe_gauge!(
        "cdnmap_dns_map_epoch",
        "Epoch of the map in use (its identity is (epoch, version))."
    );
    describe_gauge!(
        "cdnmap_dns_map_version",
        "Version of the map in use, within its epoch."
    );
}

/// The buckets of the front end's histograms, in seconds: a batch's microseconds up to a
/// stalled one's tenth of a second.
const DNS_SECONDS_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 1.0,
];

/// Every series whose labels are known at start, at 0 (the per-mapper ones for each of
/// `mappers`), so a scrape before the first event reads 0, not nothing. (The responses' are
/// registered with the front end, `front::Counters`; the UDP loops' when they start.)
fn register_metrics(mappers: &[String]) {
    for mapper in mappers {
        metrics::gauge!("cdnmap_dns_mapper_connected", "mapper" => mapper.clone()).set(0.0);
        for name in [
            "cdnmap_dns_reconnects_total",
            "cdnmap_dns_demand_samples_sent_total",
            "cdnmap_dns_demand_refused_total",
        ] {
            metrics::counter!(name, "mapper" => mapper.clone()).increment(0);
        }
    }
    for name in [
        "cdnmap_dns_send_errors_total",
        "cdnmap_dns_demand_dropped_total",
        "cdnmap_dns_udp_receives_total",
        "cdnmap_dns_udp_datagrams_total",
        "cdnmap_dns_udp_coalescing_waits_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    drop(metrics::histogram!("cdnmap_dns_udp_batch_duration_seconds"));
    // No map yet: (epoch, version) (0, 0) until the first is in use.
    metrics::gauge!("cdnmap_dns_map_epoch").set(0.0);
    metrics::gauge!("cdnmap_dns_map_version").set(0.0);
}

/// Installs the Prometheus recorder (its upkeep, HELP texts, build info and the series known
/// at start: the per-mapper ones for each of `mappers`) and binds `addr` for `/metrics` (an
/// error names `metrics_listen` and the address).
async fn bind_metrics(
    addr: SocketAddr,
    mappers: &[String],
) -> anyhow::Result<(TcpListener, metrics_exporter_prometheus::PrometheusHandle)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("metrics_listen {addr}: {e}"))?;
    let prometheus = cdnmap_telemetry::install("dns", DNS_SECONDS_BUCKETS)?;
    describe_metrics();
    register_metrics(mappers);
    Ok((listener, prometheus))
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` (no token for any): alive while
/// the process answers; ready while `front` answers from a map (`mapper`, the URLs followed, is
/// named when it has none). A map that is old still answers, and the front end is ready with
/// it: its age is in the body (and in `cdnmap_dns_map_version` staying put), for an alert
/// rather than for a restart that would leave the front end with no map at all.
fn serve_metrics(
    listener: TcpListener,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
    front: Arc<Front>,
    mapper: String,
) -> tokio::task::JoinHandle<()> {
    use axum::http::StatusCode;
    use axum::Json;
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let p = prometheus.clone();
                async move { cdnmap_telemetry::render(&p) }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(|| async { Json(serde_json::json!({ "alive": true })) }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let view = front.view();
                let mapper = mapper.clone();
                async move {
                    let Some(view) = view else {
                        let body = serde_json::json!({
                            "ready": false,
                            "reason": format!("no map yet: no mapper of {mapper:?} has sent one"),
                        });
                        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
                    };
                    let age_secs = (now_unix_ms() - view.solved_at_unix_ms).max(0) as f64 / 1e3;
                    let body = serde_json::json!({
                        "ready": true,
                        "map": {
                            "epoch": view.epoch,
                            "version": view.version,
                            "solved_at_unix_ms": view.solved_at_unix_ms,
                            "age_secs": age_secs,
                        },
                    });
                    (StatusCode::OK, Json(body))
                }
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    })
}

/// Says, for each change of `hangups` (a SIGHUP), what it reloaded: the zone data of
/// `config_file` when there is one ([`reload_zone_data`]); with TLS to the mappers,
/// each link's TLS files (`mapper_ca_file`, `cert_file`, `key_file`), which the next
/// connection uses (the streams open stay as they are; on an error a link keeps the files it
/// had); the rest of the configuration is read at start only.
async fn reload_on_hangup(
    config: DnsConfig,
    config_file: Option<PathBuf>,
    following: Arc<Following>,
    front: Arc<Front>,
    mut hangups: tokio::sync::watch::Receiver<u64>,
) {
    while hangups.changed().await.is_ok() {
        if let Some(path) = &config_file {
            match reload_zone_data(&config, path, &front) {
                Ok(said) => {
                    tracing::info!(file = %path.display(), "SIGHUP: the zone data reloaded: {said}");
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "SIGHUP: the zone data could not be reloaded; the one in use is kept");
                }
            }
        }
        if config.mapper_ca_file.is_none() {
            if config_file.is_none() {
                tracing::info!(
                    "SIGHUP: nothing to reload (plaintext to the mappers; the configuration is read at start only)"
                );
            } else {
                tracing::info!("SIGHUP: no TLS files to reload (plaintext to the mappers)");
            }
            continue;
        }
        let mut failed = 0;
        for link in &following.links {
            if let Err(e) = link.reload(&config) {
                failed += 1;
                tracing::warn!(mapper = %link.url, error = %e, "SIGHUP: the TLS files could not be reloaded; the link keeps those it had");
            }
        }
        if failed == 0 {
            tracing::info!(
                mappers = following.links.len(),
                "SIGHUP: the TLS files of the links to the mappers reloaded; the next connection uses them"
            );
        }
    }
}

/// Reads `path` again and puts its zone data in use in `front`: its `[[records]]`,
/// `soa_serial`, `[[services]]`, DNSSEC keys (`dnssec_keys`, the key files read again) and
/// cookie secrets (`cookie_secret*`, the file read again), checked against the
/// zones, nameservers and TTLs of `running` (the configuration the front end started with: the
/// other keys are read at start only). An error (the file, its TOML, a record, a key file)
/// leaves the zone data and the keys in use as they were.
pub fn reload_zone_data(running: &DnsConfig, path: &Path, front: &Front) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let file =
        DnsConfig::parse_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let next = DnsConfig {
        records: file.records,
        soa_serial: file.soa_serial,
        services: file.services,
        dnssec_keys: file.dnssec_keys,
        cookie_secret: file.cookie_secret,
        cookie_secret_file: file.cookie_secret_file,
        cookie_secret_previous: file.cookie_secret_previous,
        ..running.clone()
    };
    let statics = next
        .static_data()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let services = next
        .services()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    // The keys are read before anything is replaced: keys that do not load keep the zone
    // data and the keys in use.
    next.validate()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let keyset = next
        .dnssec_keyset()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let keys = keyset
        .as_ref()
        .map_or("no DNSSEC keys".into(), |k| k.summary());
    let cookies = next
        .cookies()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let said = front
        .zones
        .reload(statics, next.soa_serial)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let bindings = services.len();
    front.zones.services.store(Arc::new(services));
    front.dnssec.replace(keyset);
    let cookies = front.cookies.replace(cookies.as_ref());
    Ok(format!(
        "{said}; {bindings} service bindings; DNSSEC: {keys}; {cookies}"
    ))
}

/// How the front end reaches one mapper: its URL, the endpoint (TLS with the configured CA and
/// certificate when the URL is `https://`) and the token its calls carry. Built at start, so
/// a missing or unreadable file is an error before anything is served; its TLS files are read
/// again on SIGHUP ([`MapperLink::reload`]).
#[derive(Clone)]
pub struct MapperLink {
    /// The mapper's URL, as configured: how logs and metrics name it.
    pub url: String,
    endpoint: Arc<arc_swap::ArcSwap<tonic::transport::Endpoint>>,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl MapperLink {
    /// The link to the mapper at `url` (one of `config`'s), with `config`'s TLS and token.
    pub fn new(config: &DnsConfig, url: &str) -> anyhow::Result<MapperLink> {
        let endpoint = Self::endpoint(config, url)?;
        let token = match &config.feedback_token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| anyhow::anyhow!("feedback_token: not a header value"))?,
            ),
            None => None,
        };
        Ok(MapperLink {
            url: url.to_string(),
            endpoint: Arc::new(arc_swap::ArcSwap::from_pointee(endpoint)),
            token,
        })
    }

    /// The endpoint of the mapper at `url`, with `config`'s TLS files read now.
    fn endpoint(config: &DnsConfig, url: &str) -> anyhow::Result<tonic::transport::Endpoint> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true);
        let tls = cdnmap_proto::client_tls::from_config(
            ["mapper_ca_file", "cert_file", "key_file"],
            [
                config.mapper_ca_file.as_deref(),
                config.cert_file.as_deref(),
                config.key_file.as_deref(),
            ],
        )?;
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls)?;
        }
        Ok(endpoint)
    }

    /// Reads `config`'s TLS files again: the connections from now on use them (one open
    /// stays as it is). On an error the link keeps the files it had.
    pub fn reload(&self, config: &DnsConfig) -> anyhow::Result<()> {
        self.endpoint
            .store(Arc::new(Self::endpoint(config, &self.url)?));
        Ok(())
    }

    /// A connection to the mapper.
    pub async fn connect(&self) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        self.endpoint.load().as_ref().clone().connect().await
    }

    /// `message` as a request carrying the feedback token, if there is one.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(t) = &self.token {
            request.metadata_mut().insert("authorization", t.clone());
        }
        request
    }
}

/// The mappers followed and the version in use: what the watchers share. Which version is
/// in use is decided under `in_use`'s lock alone, and the view answered from is swapped under
/// it, so two streams cannot put a lower identity in after a higher one.
struct Following {
    links: Vec<MapperLink>,
    in_use: Mutex<InUse>,
}

impl Following {
    fn in_use(&self) -> std::sync::MutexGuard<'_, InUse> {
        // Nothing under the lock can leave `InUse` half changed.
        self.in_use.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `f` (brought by mapper `from`) and its `view` in use when its identity is above
    /// the one in use; says whether it did.
    fn put_in_use(&self, front: &Front, from: usize, f: &Followed, view: LocalView) -> bool {
        let mut in_use = self.in_use();
        if !in_use.offer(f, from) {
            return false;
        }
        metrics::gauge!("cdnmap_dns_map_epoch").set(f.identity.epoch as f64);
        metrics::gauge!("cdnmap_dns_map_version").set(f.identity.version as f64);
        front.demand.prepare(&view.resolver);
        front.put_view(view);
        true
    }
}

/// Holds the WatchMap stream to mapper `i`, forever: applies its updates, publishes the views
/// above the one in use, reconnects.
async fn watch(following: Arc<Following>, i: usize, front: Arc<Front>) {
    let url = following.links[i].url.clone();
    let connected = metrics::gauge!("cdnmap_dns_mapper_connected", "mapper" => url.clone());
    connected.set(0.0);
    let mut backoff = RECONNECT_MIN;
    loop {
        // The first failure of a run is a warning; the attempts after it, until one works,
        // are counted (`cdnmap_dns_reconnects_total`) and logged at debug.
        let first = backoff == RECONNECT_MIN;
        let mut worked = false;
        let ended = follow(&following, i, &front, &connected, &mut worked).await;
        connected.set(0.0);
        let held = following.in_use().key();
        match ended {
            Ok(()) => {
                tracing::warn!(mapper = %url, "the mapper ended the map stream; reconnecting")
            }
            Err(e) if first => tracing::warn!(mapper = %url, error = %e, ?held,
                "map stream lost; answering from the map in use and reconnecting"),
            Err(e) => {
                tracing::debug!(mapper = %url, error = %e, "reconnecting to the mapper failed")
            }
        }
        if worked {
            backoff = RECONNECT_MIN; // the stream worked for a while
        }
        metrics::counter!("cdnmap_dns_reconnects_total", "mapper" => url.clone()).increment(1);
        tokio::time::sleep(backoff).await;
        let cap = if held.is_some() {
            RECONNECT_MAX
        } else {
            RECONNECT_MAX_EMPTY
        };
        backoff = (backoff * 2).min(cap);
    }
}

/// One stream to mapper `i`: from connection to its end. `worked` is set once a message was
/// taken. Its follower holds only a full map being received; it is lent the version in use
/// for each message, so a stream keeps no map of its own, and what it had half received is
/// dropped with it.
async fn follow(
    following: &Arc<Following>,
    i: usize,
    front: &Arc<Front>,
    connected: &metrics::Gauge,
    worked: &mut bool,
) -> anyhow::Result<()> {
    let link = &following.links[i];
    let channel = link.connect().await?;
    let mut client =
        pb::mapping_client::MappingClient::new(channel).max_decoding_message_size(1 << 30);
    // The version in use, whichever mapper it came from: a mapper that has it sends deltas
    // from it, one that does not a full map.
    let (known_epoch, known_version) = following.in_use().key().unwrap_or((0, 0));
    // With its token, for a mapper that keeps WatchMap to the front ends it knows. Deltas
    // carry only the sections that changed; the follower keeps the others (and takes a
    // mapper's that carry them all, as an older mapper's do).
    let mut stream = client
        .watch_map(link.request(pb::WatchMapRequest {
            known_version,
            known_epoch,
            changed_sections_only: true,
        }))
        .await?
        .into_inner();
    connected.set(1.0);
    tracing::info!(mapper = %link.url, known_epoch, known_version, "following the mapper's map");
    let mut local = Follower::default();
    while let Some(update) = stream.message().await? {
        let (epoch, version, last) = (update.epoch, update.version, !update.more);
        let full = update.full;
        // The copy moves to a blocking thread (applying a delta merges every unit) and back.
        let hosts = front.hot_hosts.load_full();
        // The view in use: the next one shares its prefix index when the units are the same.
        let in_use_view = front.view();
        let lent = following.in_use().followed();
        let mut next = std::mem::take(&mut local);
        let (taken, built, next) = tokio::task::spawn_blocking(move || {
            let taken = in_use::take(&mut next, lent, update);
            let built = match &taken {
                Ok(Taken::New(f)) => {
                    Some(LocalView::build(f, &keys(&hosts), in_use_view.as_deref()))
                }
                _ => None,
            };
            (taken, built, next)
        })
        .await?;
        local = next;
        let f = match taken {
            Ok(Taken::New(f)) => f,
            Ok(Taken::Part) => {
                *worked = true;
                continue;
            }
            Ok(Taken::Passed) => {
                *worked = true;
                // Not above the map in use (a mapper restarted on its stored map, a standby
                // of an older epoch): the map in use keeps answering.
                let held = following.in_use().key();
                log_passed(&link.url, (epoch, version), full && last, held);
                continue;
            }
            Err(e) => anyhow::bail!("update to version {version} of epoch {epoch}: {e}"),
        };
        *worked = true;
        let view = match built {
            Some(Ok(view)) => view,
            // Not answerable: this stream starts again (from a full map, if the mapper has
            // nothing newer); the map in use keeps answering.
            Some(Err(e)) => anyhow::bail!("indexing map version {version} of epoch {epoch}: {e}"),
            None => anyhow::bail!("map version {version} of epoch {epoch} was not indexed"),
        };
        let (units, map_mb) = (
            view.resolver.map().unit_count(),
            view.resolver.map().heap_bytes() / (1 << 20),
        );
        if following.put_in_use(front, i, &f, view) {
            tracing::info!(mapper = %link.url, epoch, version, units, map_mb, "map version in use");
        } else {
            // Another stream put a higher version in use while this one was being built.
            let held = following.in_use().key();
            tracing::debug!(mapper = %link.url, epoch, version, ?held, "a version was passed over for a higher one");
        }
    }
    Ok(())
}

/// Says why update `(epoch, version)` from mapper `url` was passed over, `held` in use:
/// `whole` when it ends a full map.
fn log_passed(url: &str, (epoch, version): (u64, u64), whole: bool, held: Option<(u64, u64)>) {
    if whole && held.is_some_and(|(e, _)| epoch < e) {
        // An identity that went backwards: an older replica, or a mapper that lost its store
        // with its clock behind (a new store's epoch is its clock's, above any before).
        tracing::warn!(
            mapper = %url,
            epoch,
            version,
            ?held,
            "the mapper's map is of an older epoch than the map in use: it is not \
             applied, and this front end keeps answering from the map in use until \
             that mapper's identity passes it (restart this front end to follow \
             that mapper at once)"
        );
    } else if whole {
        tracing::info!(mapper = %url, epoch, version, ?held, "an older map was not applied");
    } else {
        tracing::debug!(mapper = %url, epoch, version, ?held, "an update not above the map in use was passed over");
    }
}

/// Every `report_secs`: the period's demand to the mappers, and bounded-loads selectors
/// rebuilt over the hostnames seen.
async fn report(config: DnsConfig, following: Arc<Following>, front: Arc<Front>) {
    let mut tick = tokio::time::interval(Duration::from_secs(config.report_secs));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        send_demand(&config, &following.links, &front).await;
        // The period's hostnames weigh the bounded-loads selectors until the next period (the
        // watcher builds new map versions with them too).
        let hosts: Arc<Vec<(String, f64)>> = Arc::new(
            front
                .demand
                .take_hosts()
                .into_iter()
                .map(|(h, n)| (h, n as f64))
                .collect(),
        );
        front.hot_hosts.store(Arc::clone(&hosts));
        if let Some(view) = front.view().filter(|v| v.has_bounded) {
            let built_for = Arc::clone(&view);
            let rebuilt =
                tokio::task::spawn_blocking(move || view.build_servers(&keys(&hosts))).await;
            match rebuilt {
                // Put in use only while that view is (a newer one has selectors of its own).
                Ok(Ok(s)) => {
                    front.put_rebuilt(&built_for, s);
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "rebuilding the selectors failed"),
                Err(e) => tracing::warn!(error = %e, "rebuilding the selectors failed"),
            }
        }
    }
}

/// Weighted content keys as the selectors take them.
fn keys(hosts: &[(String, f64)]) -> Vec<(&str, f64)> {
    hosts.iter().map(|(h, w)| (h.as_str(), *w)).collect()
}

/// What one mapper did with one batch of a demand report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Acknowledged.
    Accepted,
    /// Refused as invalid (InvalidArgument): sending it again would fail again.
    Refused,
    /// Not delivered: the mapper unreachable, another error, no ack within
    /// [`REPORT_DEADLINE`], or not sent after an earlier batch failed.
    Failed,
}

/// What becomes of a batch, given what each mapper did with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Some mapper took it.
    Delivered,
    /// None took it and some refused it: dropped.
    Dropped,
    /// Every mapper failed: kept for the next period.
    Kept,
}

/// A batch is kept for the next period only when no mapper answered for it, neither
/// accepting nor refusing it: a batch one mapper took is not sent again (that mapper would
/// count it twice), so a mapper that missed it misses that period's counts.
fn settle(deliveries: impl IntoIterator<Item = Delivery>) -> Settled {
    let mut settled = Settled::Kept;
    for d in deliveries {
        match d {
            Delivery::Accepted => return Settled::Delivered,
            Delivery::Refused => settled = Settled::Dropped,
            Delivery::Failed => {}
        }
    }
    settled
}

/// Sends what was counted since the last report to every mapper at once, in batches (each
/// mapper gets them in order, and none after one that failed); a batch no mapper accepted or
/// refused is put back for the next period ([`settle`]). Every wait is bounded: a connection
/// and each batch by [`REPORT_DEADLINE`].
async fn send_demand(config: &DnsConfig, links: &[MapperLink], front: &Front) {
    let counts = front.demand.take();
    let now = now_unix_ms();
    let start = front
        .period_start_unix_ms
        .swap(now, std::sync::atomic::Ordering::Relaxed);
    if counts.is_empty() {
        return;
    }
    let mut batches: Vec<Counts> = Vec::new();
    let mut rest = counts;
    while !rest.is_empty() {
        let tail = rest.split_off(rest.len().min(MAX_REPORT_SAMPLES));
        batches.push(std::mem::replace(&mut rest, tail));
    }
    let reports: Arc<Vec<pb::DemandReport>> = Arc::new(
        batches
            .iter()
            .map(|batch| pb::DemandReport {
                reporter: config.name.clone(),
                period_start_unix_ms: start,
                period_end_unix_ms: now,
                samples: batch
                    .iter()
                    .map(|((prefix, class), n)| pb::DemandSample {
                        target: Some(pb::demand_sample::Target::Prefix(prefix.to_string())),
                        traffic_class: class.to_string(),
                        queries: *n as f64,
                    })
                    .collect(),
            })
            .collect(),
    );
    let mut sends = tokio::task::JoinSet::new();
    for (m, link) in links.iter().enumerate() {
        let (link, reports) = (link.clone(), Arc::clone(&reports));
        let period = Duration::from_secs(config.report_secs);
        sends.spawn(async move { (m, report_to(&link, &reports, period).await) });
    }
    // By mapper, by batch; a task that did not finish delivered nothing.
    let mut deliveries = vec![vec![Delivery::Failed; batches.len()]; links.len()];
    while let Some(done) = sends.join_next().await {
        match done {
            Ok((m, d)) => deliveries[m] = d,
            Err(e) => tracing::warn!(error = %e, "a demand report task failed"),
        }
    }
    for (b, batch) in batches.into_iter().enumerate() {
        if settle(deliveries.iter().map(|d| d[b])) == Settled::Kept {
            front.demand.restore(batch);
        }
    }
}

/// Sends `reports` to one mapper, in order, until one fails: what became of each.
async fn report_to(
    link: &MapperLink,
    reports: &[pb::DemandReport],
    period: Duration,
) -> Vec<Delivery> {
    let mut out = vec![Delivery::Failed; reports.len()];
    let channel = match tokio::time::timeout(REPORT_DEADLINE, link.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::warn!(mapper = %link.url, error = %e, "demand report: mapper unreachable");
            return out;
        }
        Err(_) => {
            tracing::warn!(mapper = %link.url, "demand report: no connection within the deadline");
            return out;
        }
    };
    let mut client = pb::feedback_client::FeedbackClient::new(channel);
    for (b, report) in reports.iter().enumerate() {
        let sent = std::time::Instant::now();
        let mut request = link.request(report.clone());
        request.set_timeout(REPORT_DEADLINE);
        let outcome =
            match tokio::time::timeout(REPORT_DEADLINE, client.report_demand(request)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "no ack within {} s",
                    REPORT_DEADLINE.as_secs()
                ))),
            };
        let took = sent.elapsed();
        if took > period {
            tracing::warn!(
                mapper = %link.url,
                took_ms = took.as_millis() as u64,
                report_secs = period.as_secs(),
                "a demand report took longer than its period (the mapper's store is slow?)"
            );
        } else {
            tracing::debug!(
                mapper = %link.url,
                took_ms = took.as_millis() as u64,
                samples = report.samples.len(),
                "demand report"
            );
        }
        let mapper = link.url.clone();
        match outcome {
            Ok(ack) => {
                metrics::counter!("cdnmap_dns_demand_samples_sent_total", "mapper" => mapper)
                    .increment(ack.into_inner().accepted);
                out[b] = Delivery::Accepted;
            }
            Err(status) if status.code() == tonic::Code::InvalidArgument => {
                // The mapper refuses the batch (say, a prefix it no longer has): sending it
                // again would fail again.
                tracing::warn!(mapper = %link.url, %status, samples = report.samples.len(), "demand report refused");
                metrics::counter!("cdnmap_dns_demand_refused_total", "mapper" => mapper)
                    .increment(report.samples.len() as u64);
                out[b] = Delivery::Refused;
            }
            Err(status) => {
                tracing::warn!(mapper = %link.url, %status, "demand report failed; the batches left are not sent to this mapper");
                return out;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch is kept only when every mapper failed to take it; one mapper's ack delivers
    /// it, a refusal with no ack drops it.
    #[test]
    fn a_batch_is_kept_only_when_no_mapper_answered_for_it() {
        use Delivery::{Accepted as A, Failed as F, Refused as R};
        let cases: [(&[Delivery], Settled); 8] = [
            (&[], Settled::Kept),
            (&[F], Settled::Kept),
            (&[F, F, F], Settled::Kept),
            (&[A], Settled::Delivered),
            (&[F, A], Settled::Delivered),
            (&[R, A, F], Settled::Delivered),
            (&[R], Settled::Dropped),
            (&[F, R], Settled::Dropped),
        ];
        for (deliveries, want) in cases {
            assert_eq!(settle(deliveries.iter().copied()), want, "{deliveries:?}");
        }
    }
}
