//! `cdnmap dns`: an authoritative DNS front end that answers from a local copy of the map.
//!
//! Three tasks share one [`answer::Front`]:
//! - the watcher holds a `WatchMap` stream to the mapper, applies each update to its
//!   [`local::Follower`], indexes the new version on a blocking thread and swaps it in whole;
//!   when the stream breaks it reconnects with backoff, asking only for what it lacks, and the
//!   last map keeps answering meanwhile;
//! - hickory's server answers UDP and TCP queries from the published view, with no round trip;
//! - the reporter sends the period's per-prefix query counts through Feedback.ReportDemand in
//!   batches of at most 100,000 samples, keeping what a failed report did not deliver for the
//!   next period, and rebuilds bounded-loads selectors over the hostnames seen.

pub mod answer;
pub mod config;
pub mod demand;
pub mod local;
mod udp;
mod wire;

#[cfg(test)]
mod fuzz;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use cdnmap_proto::v1 as pb;
use cdnmap_proto::MAX_REPORT_SAMPLES;
use tokio::net::TcpListener;

pub use config::DnsConfig;

use answer::{Front, Handler, Zone};
use cdnmap_serve::watch::Applied;
use demand::DemandCounter;
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
/// addresses bound.
pub async fn run(
    config: DnsConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let zones = config.zones()?;
    let link = MapperLink::new(&config)?;
    if config.mapper_ca_file.is_none() && !config.mapper_is_loopback() {
        tracing::warn!(mapper = %config.mapper, "following a mapper beyond loopback in plaintext: use https:// and mapper_ca_file");
    }
    let (metrics_task, metrics_addr) = match config.metrics_listen {
        Some(addr) => {
            let (task, bound) = serve_metrics(addr).await?;
            (Some(task), Some(bound))
        }
        None => (None, None),
    };
    let serial = (now_unix_ms() / 1000).clamp(1, i64::from(u32::MAX)) as u32;
    let front = Arc::new(Front {
        zones: zones
            .iter()
            .map(|z| Zone::new(z, serial, config.ttl_secs))
            .collect(),
        view: ArcSwapOption::empty(),
        servers: ArcSwapOption::empty(),
        ttl: config.ttl_secs,
        max_udp_payload: config.max_udp_payload,
        demand: DemandCounter::default(),
        hot_hosts: arc_swap::ArcSwap::default(),
        period_start_unix_ms: std::sync::atomic::AtomicI64::new(now_unix_ms()),
        counters: answer::Counters::register(),
    });
    // UDP: one answering loop per core, each on its own socket (SO_REUSEPORT); TCP: hickory's
    // server.
    let loops = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (tcp, sockets) = bind(config.listen, loops).await?;
    let listen = tcp.local_addr()?;
    // The addresses bound (port 0 takes any free port), which is how tests find them without
    // racing for free ports.
    match metrics_addr {
        Some(metrics) => tracing::info!(dns = %listen, metrics = %metrics, "listening"),
        None => tracing::info!(dns = %listen, "listening"),
    }
    let handler = Arc::new(Handler(Arc::clone(&front)));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let udp_threads = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let (handler, stop) = (Arc::clone(&handler), Arc::clone(&stop));
            let runtime = tokio::runtime::Handle::current();
            std::thread::Builder::new()
                .name(format!("dns-udp-{i}"))
                .spawn(move || udp::serve(socket, handler, runtime, stop))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut server = hickory_server::Server::new(Handler(Arc::clone(&front)));
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
    let watcher = tokio::spawn(watch(link.clone(), Arc::clone(&front)));
    let reporter = tokio::spawn(report(config.clone(), link.clone(), Arc::clone(&front)));
    shutdown.await;
    watcher.abort();
    reporter.abort();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in udp_threads {
        let _ = t.join();
    }
    // A last report of what was counted since the previous one.
    send_demand(&config, &link, &front).await;
    server.shutdown_gracefully().await?;
    if let Some(t) = metrics_task {
        t.abort();
    }
    Ok(())
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
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "cdnmap_dns_queries_total",
        "DNS queries answered, by outcome (answer, nodata, nxdomain, refused, servfail, formerr, badvers)."
    );
    describe_counter!(
        "cdnmap_dns_send_errors_total",
        "DNS responses that could not be sent."
    );
    describe_counter!(
        "cdnmap_dns_reconnects_total",
        "Times the WatchMap stream to the mapper was opened again."
    );
    describe_counter!(
        "cdnmap_dns_demand_samples_sent_total",
        "Demand samples (prefix, class, queries) reported to the mapper."
    );
    describe_counter!(
        "cdnmap_dns_demand_refused_total",
        "Demand samples the mapper refused."
    );
    describe_counter!(
        "cdnmap_dns_demand_dropped_total",
        "Queries not counted as demand because the period's table was full."
    );
    describe_gauge!("cdnmap_dns_map_version", "Version of the map in use.");
}

/// Installs the Prometheus recorder and serves `/metrics` on `addr`; returns the task and the
/// address bound.
async fn serve_metrics(
    addr: SocketAddr,
) -> anyhow::Result<(tokio::task::JoinHandle<()>, SocketAddr)> {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    describe_metrics();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let p = prometheus.clone();
            async move { p.render() }
        }),
    );
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("metrics_listen {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    });
    Ok((task, bound))
}

/// How the front end reaches its mapper: the endpoint (TLS with the configured CA and
/// certificate when the URL is `https://`) and the token its reports carry. Built once at
/// start, so a missing or unreadable file is an error before anything is served.
#[derive(Clone)]
pub struct MapperLink {
    endpoint: tonic::transport::Endpoint,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

/// The PEM file `path` of config key `key`, checked to hold what it should.
fn read_pem(key: &str, path: &std::path::Path, private_key: bool) -> anyhow::Result<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    let bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("{key} {}: {e}", path.display()))?;
    let holds = if private_key {
        rustls_pki_types::PrivateKeyDer::from_pem_slice(&bytes).is_ok()
    } else {
        rustls_pki_types::CertificateDer::pem_slice_iter(&bytes)
            .next()
            .is_some_and(|c| c.is_ok())
    };
    if !holds {
        let what = if private_key {
            "private key"
        } else {
            "certificate"
        };
        anyhow::bail!("{key} {}: no PEM {what} in it", path.display());
    }
    Ok(bytes)
}

impl MapperLink {
    pub fn new(config: &DnsConfig) -> anyhow::Result<MapperLink> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(config.mapper.clone())?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true);
        if let Some(ca) = &config.mapper_ca_file {
            use tonic::transport::{Certificate, ClientTlsConfig, Identity};
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem(
                "mapper_ca_file",
                ca,
                false,
            )?));
            if let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) {
                tls = tls.identity(Identity::from_pem(
                    read_pem("cert_file", cert, false)?,
                    read_pem("key_file", key, true)?,
                ));
            }
            endpoint = endpoint.tls_config(tls)?;
        }
        let token = match &config.feedback_token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| anyhow::anyhow!("feedback_token: not a header value"))?,
            ),
            None => None,
        };
        Ok(MapperLink { endpoint, token })
    }

    async fn connect(&self) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        self.endpoint.clone().connect().await
    }

    /// `message` as a request carrying the feedback token, if there is one.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(t) = &self.token {
            request.metadata_mut().insert("authorization", t.clone());
        }
        request
    }
}

/// Holds the WatchMap stream, forever: applies updates, publishes views, reconnects.
async fn watch(mapper: MapperLink, front: Arc<Front>) {
    let mut local = Follower::default();
    let mut backoff = RECONNECT_MIN;
    loop {
        let before = local.identity();
        // The first failure of a run is a warning; the attempts after it, until one works,
        // are counted (`cdnmap_dns_reconnects_total`) and logged at debug.
        let first = backoff == RECONNECT_MIN;
        match follow(&mapper, &front, &mut local).await {
            Ok(()) => tracing::warn!("the mapper ended the map stream; reconnecting"),
            Err(e) if first => tracing::warn!(error = %e, held = ?local.identity(),
                "map stream lost; answering from the last map and reconnecting"),
            Err(e) => tracing::debug!(error = %e, "reconnecting to the mapper failed"),
        }
        if local.identity() != before {
            backoff = RECONNECT_MIN; // the stream worked for a while
        }
        metrics::counter!("cdnmap_dns_reconnects_total").increment(1);
        tokio::time::sleep(backoff).await;
        let cap = if local.held().is_some() {
            RECONNECT_MAX
        } else {
            RECONNECT_MAX_EMPTY
        };
        backoff = (backoff * 2).min(cap);
    }
}

/// One stream: from connection to its end.
async fn follow(
    mapper: &MapperLink,
    front: &Arc<Front>,
    local: &mut Follower,
) -> anyhow::Result<()> {
    let channel = mapper.connect().await?;
    let mut client =
        pb::mapping_client::MappingClient::new(channel).max_decoding_message_size(1 << 30);
    let (known_epoch, known_version) = local.identity();
    let mut stream = client
        .watch_map(pb::WatchMapRequest {
            known_version,
            known_epoch,
        })
        .await?
        .into_inner();
    tracing::info!(known_epoch, known_version, "following the mapper's map");
    while let Some(update) = stream.message().await? {
        let (epoch, version) = (update.epoch, update.version);
        // The copy moves to a blocking thread (applying a delta merges every unit) and back;
        // on a failure it keeps the version held and drops a full map half received.
        let hosts = front.hot_hosts.load_full();
        // The view in use: the next one shares its prefix index when the units are the same.
        let in_use = front.view.load_full();
        let mut next = std::mem::take(local);
        let (applied, built, next) = tokio::task::spawn_blocking(move || {
            let applied = next.apply(update);
            let built = match (&applied, next.held()) {
                (Ok(Applied::New), Some(f)) => {
                    Some(LocalView::build(f, &keys(&hosts), in_use.as_deref()))
                }
                _ => None,
            };
            (applied, built, next)
        })
        .await?;
        *local = next;
        match applied {
            Ok(Applied::New) => {}
            Ok(Applied::Part) => continue,
            Ok(Applied::Stale) => {
                // Older than the map held (the mapper restarted and serves what it stored):
                // keep answering from the newer one until the mapper's next round.
                tracing::info!(epoch, version, held = ?local.identity(), "an older map was not applied");
                continue;
            }
            Err(e) => anyhow::bail!("update to version {version} of epoch {epoch}: {e}"),
        }
        match built {
            Some(Ok(view)) => {
                tracing::info!(
                    epoch,
                    version,
                    units = view.resolver.map().unit_count(),
                    map_mb = view.resolver.map().heap_bytes() / (1 << 20),
                    "map version in use"
                );
                metrics::gauge!("cdnmap_dns_map_version").set(version as f64);
                front.view.store(Some(Arc::new(view)));
            }
            Some(Err(e)) => {
                // Held but not answerable: forget it, so the next stream starts whole.
                *local = Follower::default();
                anyhow::bail!("indexing map version {version}: {e}")
            }
            None => anyhow::bail!("map version {version} of epoch {epoch} was not held"),
        }
    }
    Ok(())
}

/// Every `report_secs`: the period's demand to the mapper, and bounded-loads selectors rebuilt
/// over the hostnames seen.
async fn report(config: DnsConfig, link: MapperLink, front: Arc<Front>) {
    let mut tick = tokio::time::interval(Duration::from_secs(config.report_secs));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        send_demand(&config, &link, &front).await;
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
        if let Some(view) = front.view.load_full().filter(|v| v.has_bounded) {
            let rebuilt = tokio::task::spawn_blocking(move || {
                view.build_servers(&keys(&hosts))
                    .map(|s| ((view.epoch, view.version), s))
            })
            .await;
            match rebuilt {
                Ok(Ok(s)) => front.servers.store(Some(Arc::new(s))),
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

/// Sends what was counted since the last report, in batches; what a failed batch held is put
/// back for the next period.
async fn send_demand(config: &DnsConfig, link: &MapperLink, front: &Front) {
    let counts = front.demand.take();
    let now = now_unix_ms();
    let start = front
        .period_start_unix_ms
        .swap(now, std::sync::atomic::Ordering::Relaxed);
    if counts.is_empty() {
        return;
    }
    let channel = match link.connect().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "demand report: mapper unreachable; kept for the next period");
            front.demand.restore(counts);
            return;
        }
    };
    let mut client = pb::feedback_client::FeedbackClient::new(channel);
    let mut rest = counts;
    while !rest.is_empty() {
        let tail = rest.split_off(rest.len().min(MAX_REPORT_SAMPLES));
        let batch = std::mem::replace(&mut rest, tail);
        let report = pb::DemandReport {
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
        };
        let sent = std::time::Instant::now();
        let mut request = link.request(report);
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
        if took > Duration::from_secs(config.report_secs) {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                report_secs = config.report_secs,
                "a demand report took longer than its period (the mapper's store is slow?)"
            );
        } else {
            tracing::debug!(
                took_ms = took.as_millis() as u64,
                samples = batch.len(),
                "demand report"
            );
        }
        match outcome {
            Ok(ack) => {
                metrics::counter!("cdnmap_dns_demand_samples_sent_total")
                    .increment(ack.into_inner().accepted);
            }
            Err(status) if status.code() == tonic::Code::InvalidArgument => {
                // The mapper refuses the batch (say, a prefix it no longer has): sending it
                // again would fail again.
                tracing::warn!(%status, samples = batch.len(), "demand report refused; dropped");
                metrics::counter!("cdnmap_dns_demand_refused_total").increment(batch.len() as u64);
            }
            Err(status) => {
                tracing::warn!(%status, "demand report failed; kept for the next period");
                front.demand.restore(batch);
                front.demand.restore(rest);
                return;
            }
        }
    }
}
