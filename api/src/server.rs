//! The listeners of `cdnmap serve`: gRPC (Mapping, Feedback, Admin, health, reflection) and
//! HTTP (`/metrics`, `/healthz`, `/readyz`, `/record`, the dashboard), bound before anything
//! else; the mapping loop, and the graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cdnmap_proto::v1 as pb;

use crate::admin::{AdminAuth, AdminService};
use crate::config::Config;
use crate::feedback::FeedbackService;
use crate::mapping::MappingService;
use crate::service::Shared;

/// `GET /record?from_ms=&to_ms=`: the demand record of a period.
#[derive(Debug, serde::Deserialize)]
pub struct RecordQuery {
    pub from_ms: i64,
    pub to_ms: i64,
}

/// The most bytes of stored reports one `/record` request may cover (about three times that
/// as JSON, streamed: the server holds one segment of the record at a time): ask for a
/// shorter period beyond it.
pub const MAX_RECORD_BYTES: u64 = 256 << 20;

/// Bytes of JSON Lines `/record` sends at a time.
const RECORD_CHUNK: usize = 64 << 10;

/// The stored reports of `[from_ms, to_ms)` as JSON Lines, `{"at_unix_ms": T, "report": {...}}`
/// per line, oldest first, for `cdnmap replay` and offline analysis, streamed in chunks of
/// [`RECORD_CHUNK`] as the record is read. Needs the Admin token (the record says which
/// prefixes ask for what, from whom); a period whose reports pass [`MAX_RECORD_BYTES`] is
/// refused on its head (413), before anything is read.
async fn record(
    shared: &Arc<Shared>,
    gate: &crate::auth::AdminGate,
    headers: &axum::http::HeaderMap,
    remote: Option<std::net::IpAddr>,
    q: Result<RecordQuery, String>,
) -> axum::response::Response {
    use crate::dashboard::ApiError;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    if let Err(e) = crate::dashboard::authorize(gate, headers, remote, "reads of /record") {
        return e.into_response();
    }
    let q = match q {
        Ok(q) => q,
        Err(e) => return ApiError::new(StatusCode::BAD_REQUEST, e).into_response(),
    };
    if q.to_ms < q.from_ms {
        return ApiError::new(StatusCode::BAD_REQUEST, "to_ms is before from_ms").into_response();
    }
    let (from, to) = (q.from_ms, q.to_ms);
    match shared.store.report_bytes_within(from, to) {
        Ok(bytes) if bytes > MAX_RECORD_BYTES => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "{bytes} bytes of reports in that period, more than {MAX_RECORD_BYTES}: ask for a shorter one"
                ),
            )
            .into_response()
        }
        Ok(_) => {}
        Err(e) => {
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
        }
    }
    // The reader on a blocking thread, a few chunks ahead of the client at most.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let store = shared.store.clone();
    tokio::task::spawn_blocking(move || {
        let mut chunk = String::with_capacity(RECORD_CHUNK);
        let mut failed = None;
        let walked = store.for_each_report(from, to, |at, payload| {
            if let Err(e) = cdnmap_store::record::push_json_line(&mut chunk, at, payload) {
                failed = Some(e);
                return false;
            }
            if chunk.len() >= RECORD_CHUNK {
                let full = std::mem::replace(&mut chunk, String::with_capacity(RECORD_CHUNK));
                // The client went away: stop reading.
                return tx.blocking_send(Ok(full.into_bytes())).is_ok();
            }
            true
        });
        let failed = failed.or(walked.err().map(|e| e.to_string()));
        match failed {
            // Headers are sent: a failure ends the body early, which the client sees as an
            // error (never as a complete record).
            Some(e) => {
                tracing::warn!(error = %e, "/record stopped");
                let _ = tx.blocking_send(Err(std::io::Error::other(e)));
            }
            None if !chunk.is_empty() => {
                let _ = tx.blocking_send(Ok(chunk.into_bytes()));
            }
            None => {}
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    ([("content-type", "application/x-ndjson")], body).into_response()
}

/// The largest request body the HTTP listener reads (the dashboard's actions take at most
/// 4 KiB; every other route, none).
pub const MAX_HTTP_BODY_BYTES: usize = 64 << 10;

/// Serves `app` on the connections `conns` brings (`listen::accept`: bounded in number, each
/// past its handshake) until `stop` says so, with hyper's own header-read timeout (a client
/// sending its headers a byte at a time holds its connection that long, no longer), each
/// request answered within `request_timeout` (else 408) and counted on its connection
/// until its body is sent (the connection's deadlines, `listen`). Then the open connections
/// are shut down gracefully (the caller bounds how long it waits).
async fn serve_http(
    mut conns: tokio::sync::mpsc::Receiver<crate::listen::Conn>,
    app: axum::Router,
    header_timeout: Duration,
    request_timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let conn = tokio::select! {
            conn = conns.recv() => conn,
            _ = stop.wait_for(|&s| s) => break,
        };
        let Some(conn) = conn else { break };
        let remote = conn.peer().remote;
        let tracked = Arc::clone(&conn.peer().conn);
        let app = app.clone();
        let service =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(remote));
                let mut app = app.clone();
                // Counted on the connection while it is answered and its body sent (its
                // deadlines, `listen`).
                let open = tracked.request();
                let req = req.map(|body| axum::body::Body::new(open.watch_body(body)));
                async move {
                    let answer =
                        tokio::time::timeout(request_timeout, tower::Service::call(&mut app, req))
                            .await;
                    let response = match answer {
                        Ok(r) => r?,
                        Err(_) => axum::response::IntoResponse::into_response(
                            crate::dashboard::ApiError::new(
                                axum::http::StatusCode::REQUEST_TIMEOUT,
                                format!("the request was not answered within {request_timeout:?}"),
                            ),
                        ),
                    };
                    open.answered(crate::listen::refused_for_credentials(
                        response.status(),
                        response.headers(),
                    ));
                    Ok::<_, std::convert::Infallible>(response.map(|body| {
                        axum::body::Body::new(http_body_util::BodyExt::map_frame(body, move |f| {
                            let _open = &open;
                            f
                        }))
                    }))
                }
            });
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            // A request hyper cannot parse is answered by hyper itself: with a JSON body too
            // (`parse_error`).
            let conn = crate::parse_error::Explained::new(conn);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(conn), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(error = %e, %remote, "an HTTP connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}

/// The buckets of every histogram, in seconds: an RPC's milliseconds up to a slow round's
/// seconds.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The HELP text and unit of every metric the mapper exports (`promtool check metrics` wants
/// one for each).
fn describe_metrics() {
    describe_probe_metrics();
    describe_round_metrics();
    describe_listener_metrics();
    describe_watch_metrics();
}

/// The health checks' and the measured RTTs' metrics.
fn describe_probe_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "cdnmap_health_probes_total",
        "Health probes of the clusters' addresses, by result (ok, failed)."
    );
    describe_gauge!(
        "cdnmap_health_clusters_down",
        "Clusters every address of which the health checks hold down."
    );
    describe_gauge!(
        "cdnmap_health_monitors_fresh",
        "cdnmap monitors heard from within 3 health intervals (their votes count)."
    );
    describe_counter!(
        "cdnmap_rtt_samples_total",
        "RTT samples of acknowledged ReportRtt calls, by result (taken; full: a new pair beyond rtt.max_pairs; no_unit: no map unit covers the prefix)."
    );
    describe_gauge!(
        "cdnmap_rtt_pairs",
        "(map unit, cluster) pairs the RTT table holds."
    );
    describe_gauge!(
        "cdnmap_n1_worst_overflow_ratio",
        "The N-1 view: the share of the demand in overflow after the worst single loss of a cluster or site (the last sweep's; the map's own overflow share before the first sweep and when no loss is worse)."
    );
    describe_gauge!(
        "cdnmap_n1_sweep_seconds",
        "How long the last N-1 sweep took, its exact previews of the worst included."
    );
}

/// The rounds', the maps' and the election's metrics.
fn describe_round_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "cdnmap_rounds_total",
        "Mapping rounds solved (a standby replica's too, which it does not publish)."
    );
    describe_gauge!(
        "cdnmap_leader",
        "1 while this replica leads (publishes), 0 while it is a standby (`--etcd` only)."
    );
    describe_gauge!(
        "cdnmap_leader_epoch",
        "The epoch of the last term this replica led (etcd's leader key revision)."
    );
    describe_gauge!(
        "cdnmap_etcd_reachable",
        "1 when etcd answered this replica's last call, else 0 (`--etcd` only)."
    );
    describe_counter!(
        "cdnmap_rounds_failed_total",
        "Mapping rounds that failed, every kind (the solve, the round's task, storing its map): the last good map stays served."
    );
    describe_counter!(
        "cdnmap_rounds_slow_total",
        "Mapping rounds that took longer than the cycle."
    );
    describe_counter!(
        "cdnmap_proposals_total",
        "Proposals the stable allocation made, over all rounds."
    );
    describe_histogram!(
        "cdnmap_solve_seconds",
        Unit::Seconds,
        "A round's solve alone (its part \"solve\" of cdnmap_round_part_seconds)."
    );
    describe_histogram!(
        "cdnmap_round_seconds",
        Unit::Seconds,
        "A round's whole time, from its start to its map stored (and published), failed rounds too."
    );
    describe_histogram!(
        "cdnmap_round_part_seconds",
        Unit::Seconds,
        "A round's parts (estimator, effective preferences, solve, index, publish, persist)."
    );
    describe_histogram!(
        "cdnmap_estimator_checkpoint_seconds",
        Unit::Seconds,
        "Encoding and storing the estimator's whole state."
    );
    describe_gauge!(
        "cdnmap_churn_ratio",
        "Share of demand the last round moved, 0 to 1 (exactly 0 when nothing moved)."
    );
    describe_gauge!(
        "cdnmap_demand",
        "Total demand the last round mapped, in the topology's demand units."
    );
    describe_gauge!(
        "cdnmap_overflow_ratio",
        "Share of demand the last round left in overflow, 0 to 1."
    );
    // cdnmap_cluster_utilization_ratio is written at each scrape, with its HELP text
    // (`service::render_cluster_utilization`).
    describe_gauge!(
        "cdnmap_classes_unserved",
        "Traffic classes no up cluster serves."
    );
    describe_gauge!("cdnmap_map_version", "Version of the map published.");
    describe_gauge!("cdnmap_map_epoch", "Epoch of the map published.");
    describe_gauge!(
        "cdnmap_map_stored_version",
        "Version of the map last stored."
    );
    describe_gauge!("cdnmap_map_stored_epoch", "Epoch of the map last stored.");
}

/// The listeners', the gRPC calls', the Admin token's, Feedback's refusals' and TLS's
/// metrics.
fn describe_listener_metrics() {
    use metrics::describe_counter;
    describe_counter!(
        "cdnmap_connections_refused_total",
        "Connections closed on arrival, by listener: as many were open as its max_connections."
    );
    describe_counter!(
        "cdnmap_connections_refused_per_source_total",
        "Connections closed on arrival, by listener: as many were open from their source (IPv6: its /64) as max_connections_per_source."
    );
    describe_counter!(
        "cdnmap_handshakes_failed_total",
        "Connections closed before serving, by listener: the TLS handshake failed, or it (in plaintext, the first bytes) and a first answered request did not come within handshake_timeout_secs."
    );
    describe_counter!(
        "cdnmap_connections_idle_closed_total",
        "Connections closed by listener after idle_timeout_secs with no request open."
    );
    describe_counter!(
        "cdnmap_admin_auth_failures_total",
        "Requests that gave no Admin token or a wrong one, by listener (gRPC Admin; HTTP: the dashboard's actions, /record)."
    );
    describe_counter!(
        "cdnmap_admin_auth_refused_total",
        "Requests refused, their token not looked at, by listener: their source failed the Admin token 10 times within a minute."
    );
    describe_counter!(
        "cdnmap_feedback_clipped_total",
        "Demand samples clipped to their bounds (a round's reports give a unit at most feedback_max_demand_ratio times its demand, a source a class at most twice its demand), and units clipped again at a round."
    );
    describe_counter!(
        "cdnmap_feedback_refused_total",
        "Feedback reports refused by their source's budget, by reason (budget, too_large, sources)."
    );
    describe_counter!(
        "cdnmap_tls_reloads_total",
        "TLS certificate and key reloads that took effect."
    );
    describe_counter!(
        "cdnmap_tls_reload_failures_total",
        "TLS reloads refused (the files in use stay)."
    );
    crate::rpc_metrics::register();
}

/// WatchMap's metrics.
fn describe_watch_metrics() {
    use metrics::{describe_counter, describe_gauge, Unit};
    describe_counter!(
        "cdnmap_watch_messages_total",
        "WatchMap messages sent to front ends, by kind."
    );
    describe_counter!(
        "cdnmap_watch_units_total",
        "Map units sent to front ends in WatchMap messages, by kind."
    );
    describe_counter!(
        "cdnmap_watch_bytes_total",
        Unit::Bytes,
        "Encoded bytes of WatchMap messages sent to front ends, by kind."
    );
    describe_gauge!("cdnmap_watch_streams", "WatchMap streams open.");
    describe_gauge!(
        "cdnmap_watch_queued_bytes",
        Unit::Bytes,
        "Encoded bytes of WatchMap messages made and waiting for their connections to take them."
    );
    describe_counter!(
        "cdnmap_watch_streams_dropped_total",
        "WatchMap streams dropped with their connections, by reason (stalled: a message waited watch_stall_secs untaken)."
    );
}

/// Runs the mapper until `shutdown` resolves: the mapping loop, gRPC on `grpc_listen`
/// (Mapping, Feedback, Admin, health, reflection) and `/metrics`, the probes and the dashboard
/// on `http_listen`.
///
/// In this order: both listeners bound (an address in use stops the start before the store is
/// opened), the store opened, HTTP served (alive, not ready), the first round if the store had
/// no map, then gRPC served and the loop started.
///
/// `initial` gives the topology when the store has none (see [`Shared::start`]). Each change
/// of `hangups` (the SIGHUPs the process had, counted) reloads the TLS files (see
/// [`reload_on_hangup`]); one that came before the listeners are set up is handled then.
pub async fn serve(
    config: Config,
    initial: impl FnOnce() -> anyhow::Result<cdnmap_topology::Topology>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    hangups: tokio::sync::watch::Receiver<u64>,
) -> anyhow::Result<()> {
    // The listeners first: a port in use (or an address this host lacks) stops the start at
    // once, before the store is opened or any round runs, naming the setting and the address.
    let (http, grpc_listener) = bind_listeners(&config).await?;
    let prometheus = install_metrics()?;
    // The Admin token's check, one for gRPC, the dashboard and /record (failures counted,
    // logged and rate-limited by source).
    let gate = Arc::new(crate::auth::AdminGate::new(
        config.admin_token.as_deref().map(Arc::from),
    ));
    // The TLS files of the links to etcd and to the leader, read before anything starts (an
    // error names the key and the file).
    let etcd_tls = crate::lead::tls_options(&config)?;
    let peer_tls = peer_tls(&config)?;
    let shared = Shared::start(config, initial)?;
    start_gauges(&shared);
    let election = join_election(&shared, etcd_tls).await?;
    start_health_checks(&shared);
    let (grpc_addr, http_addr) = (grpc_listener.local_addr()?, http.local_addr()?);
    let tls = server_tls(&shared, hangups, grpc_addr, http_addr)?;
    let limits = |max_connections| crate::listen::Limits {
        handshake_timeout: Duration::from_secs(shared.config.handshake_timeout_secs),
        idle_timeout: Duration::from_secs(shared.config.idle_timeout_secs),
        max_connections,
        max_per_source: shared.config.max_connections_per_source,
    };
    // HTTP answers from now on, so an orchestrator sees the process alive (`/healthz`) and not
    // yet ready (`/readyz`) while a first round runs (at millions of map units, a while).
    let http_conns = crate::listen::accept(
        http,
        crate::tls::Listener::Http,
        tls.clone(),
        limits(shared.config.http_max_connections),
        shared.stopping.subscribe(),
    );
    let http_task = tokio::spawn(serve_http(
        http_conns,
        http_app(&shared, &gate, prometheus),
        Duration::from_secs(shared.config.http_header_timeout_secs),
        HTTP_REQUEST_TIMEOUT,
        shared.stopping.subscribe(),
    ));
    tracing::info!(probes = %http_addr, "HTTP answers (/healthz, /readyz, /metrics) before the first map");
    if shared.current().is_none() {
        shared.run_round().await; // the first map before the first query
    }
    let loop_task = tokio::spawn(Arc::clone(&shared).run_loop());
    crate::n1::start(&shared);
    crate::ramping::start_stepping(&shared);
    // Port 0 takes any free port: the bound addresses are logged ("listening"), which is how
    // tests find them without racing for free ports.
    tracing::info!(grpc = %grpc_addr, http = %http_addr, "listening");
    let lead_task =
        election.map(|(lead, events)| campaign(&shared, lead, events, grpc_addr, peer_tls));
    warn_feedback_open(&shared.config, grpc_addr);
    let grpc_conns = crate::listen::accept(
        grpc_listener,
        crate::tls::Listener::Grpc,
        tls,
        limits(shared.config.grpc_max_connections),
        shared.stopping.subscribe(),
    );
    tracing::info!(
        grpc = %grpc_addr,
        http = %http_addr,
        "cdnmap serving: try `grpcurl -plaintext -d '{{\"resolver_ip\": \"1.0.0.1\", \"qname\": \"www.cdn.example.\", \"qtype\": 1}}' {grpc_addr} cdnmap.v1.Mapping/Resolve`"
    );
    let grpc = serve_grpc(&shared, gate, grpc_conns, shutdown).await?;
    stop_in_order(&shared, grpc, http_task, loop_task, lead_task).await
}

/// Binds `http_listen` and `grpc_listen` (in that order); an error names the setting and the
/// address (`grpc_listen 127.0.0.1:50051: Address already in use`). Bound before anything
/// else, so a start that cannot serve stops before it touches the store.
async fn bind_listeners(
    config: &Config,
) -> anyhow::Result<(tokio::net::TcpListener, tokio::net::TcpListener)> {
    let bind = |key: &'static str, addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("{key} {addr}: {e}"))
    };
    let http = bind("http_listen", config.http_listen).await?;
    let grpc = bind("grpc_listen", config.grpc_listen).await?;
    Ok((http, grpc))
}

/// Installs the Prometheus recorder, latencies as histograms (buckets aggregate across
/// replicas; summaries' quantiles do not), and describes every metric.
fn install_metrics() -> anyhow::Result<metrics_exporter_prometheus::PrometheusHandle> {
    let prometheus = cdnmap_telemetry::install("serve", SECONDS_BUCKETS)?;
    describe_metrics();
    register_metrics();
    Ok(prometheus)
}

/// Every series whose labels are known at start, registered at 0 (counters) or set
/// (gauges), so a scrape before the first event reads 0, not nothing: an alert on a rate or
/// an absence can tell them apart. (The round's gauges come with the first round or the map
/// restored, the election's with `--etcd`, the health checks' with `[health]`.)
fn register_metrics() {
    let zero = |name: &'static str, labels: &[(&'static str, &'static str)]| {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, *v))
            .collect();
        metrics::counter!(name, labels).increment(0);
    };
    for name in [
        "cdnmap_rounds_total",
        "cdnmap_rounds_failed_total",
        "cdnmap_rounds_slow_total",
        "cdnmap_proposals_total",
        "cdnmap_feedback_clipped_total",
        "cdnmap_tls_reloads_total",
        "cdnmap_tls_reload_failures_total",
    ] {
        zero(name, &[]);
    }
    for result in ["ok", "failed", "skipped"] {
        zero("cdnmap_health_probes_total", &[("result", result)]);
    }
    for result in ["taken", "full", "no_unit"] {
        zero("cdnmap_rtt_samples_total", &[("result", result)]);
    }
    for reason in ["budget", "too_large", "sources"] {
        zero("cdnmap_feedback_refused_total", &[("reason", reason)]);
    }
    for listener in ["grpc", "http"] {
        for name in [
            "cdnmap_connections_refused_total",
            "cdnmap_connections_refused_per_source_total",
            "cdnmap_handshakes_failed_total",
            "cdnmap_connections_idle_closed_total",
            "cdnmap_admin_auth_failures_total",
            "cdnmap_admin_auth_refused_total",
        ] {
            zero(name, &[("listener", listener)]);
        }
    }
    for kind in ["full", "delta"] {
        for name in [
            "cdnmap_watch_messages_total",
            "cdnmap_watch_units_total",
            "cdnmap_watch_bytes_total",
        ] {
            zero(name, &[("kind", kind)]);
        }
    }
    zero(
        "cdnmap_watch_streams_dropped_total",
        &[("reason", "stalled")],
    );
    metrics::gauge!("cdnmap_watch_streams").set(0.0);
    metrics::gauge!("cdnmap_watch_queued_bytes").set(0.0);
    metrics::gauge!("cdnmap_rtt_pairs").set(0.0);
    for part in crate::service::ROUND_PARTS {
        drop(metrics::histogram!("cdnmap_round_part_seconds", "part" => part));
    }
    for name in [
        "cdnmap_solve_seconds",
        "cdnmap_round_seconds",
        "cdnmap_estimator_checkpoint_seconds",
    ] {
        drop(metrics::histogram!(name));
    }
}

/// The gauges a start knows: the classes no up cluster serves, and the restored map's
/// figures (a restored map is served a whole cycle before the first round).
fn start_gauges(shared: &Shared) {
    let topology = Arc::clone(&shared.topology.current_versioned().topology);
    metrics::gauge!("cdnmap_classes_unserved")
        .set(cdnmap_store::edit::unserved_classes(&topology).len() as f64);
    if let Some(current) = shared.current() {
        crate::service::map_gauges(&current);
        metrics::gauge!("cdnmap_map_stored_version").set(current.version as f64);
        metrics::gauge!("cdnmap_map_stored_epoch").set(current.epoch as f64);
    }
}

/// A replica's coordinator of the election, and its events.
type Election = (
    Arc<crate::lead::Coordinator>,
    tokio::sync::mpsc::Receiver<cdnmap_lead::Event>,
);

/// A replica (`node_id` and `etcd` configured): connects to etcd, sets the service's part in
/// the election and starts following the replicas' edits. Returns the coordinator and its
/// events, whose campaign starts once the listeners are bound ([`campaign`]: it names the
/// address). Alone: `None`.
async fn join_election(
    shared: &Arc<Shared>,
    etcd_tls: Option<etcd_client::TlsOptions>,
) -> anyhow::Result<Option<Election>> {
    let config = &shared.config;
    let Some(node_id) = config.node_id.as_ref().filter(|_| config.replicated()) else {
        return Ok(None);
    };
    // Leases last a cycle: a leader that dies is replaced within about two.
    let ttl = Duration::from_secs(config.cycle_secs);
    if etcd_tls.is_none() && !crate::lead::all_loopback(&config.etcd) {
        tracing::warn!(
            etcd = %config.etcd.join(","),
            "etcd is plaintext beyond loopback: whoever can reach it can read the \
             replicas' keys and append edits every replica applies; use https:// \
             with etcd_ca_file (and a client certificate)"
        );
    }
    let (lead, events) = crate::lead::Coordinator::connect(
        &config.etcd,
        &config.etcd_prefix,
        node_id,
        ttl,
        etcd_tls,
    )
    .await?;
    tracing::info!(
        node_id = %node_id,
        etcd = %config.etcd.join(","),
        ttl_secs = ttl.as_secs(),
        "a replica: publishes only while it leads (elected through etcd)"
    );
    // A standby until the election says otherwise; etcd reachable once a call says so.
    metrics::gauge!("cdnmap_leader").set(0.0);
    metrics::gauge!("cdnmap_leader_epoch").set(0.0);
    metrics::gauge!("cdnmap_etcd_reachable").set(0.0);
    let _ = shared.lead.set(Arc::clone(&lead));
    tokio::spawn(follow_edits(Arc::clone(shared)));
    let (to_share, records) = tokio::sync::mpsc::channel(crate::activity::SHARE_BACKLOG);
    shared.activity().share_with(to_share);
    tokio::spawn(share_history(Arc::clone(&lead), records));
    Ok(Some((lead, events)))
}

/// Replicated: writes each new record of the change history to the replicas' copy in etcd
/// while this replica leads (a standby's own records stay its own), in order; a record etcd
/// does not take is said and left out of the copy (it is in this replica's store).
async fn share_history(
    lead: Arc<crate::lead::Coordinator>,
    mut records: tokio::sync::mpsc::Receiver<Vec<u8>>,
) {
    let mut next: Option<u64> = None;
    while let Some(record) = records.recv().await {
        let Some(term) = lead.term() else {
            next = None;
            continue;
        };
        // Twice at most: a number taken (another leader wrote since) is looked up again.
        for _ in 0..2 {
            let seq = match next {
                Some(n) => n,
                None => match lead.last_history_seq().await {
                    Ok(last) => last + 1,
                    Err(e) => {
                        tracing::warn!(error = %e, "a change history record not shared with the replicas");
                        break;
                    }
                },
            };
            match lead.append_history(&term, seq, &record).await {
                Ok(true) => {
                    next = Some(seq + 1);
                    break;
                }
                Ok(false) => next = None,
                Err(e) => {
                    next = None;
                    tracing::warn!(error = %e, "a change history record not shared with the replicas");
                    break;
                }
            }
        }
    }
}

/// With `[health]`: the health checks' task, probing the current topology's targets.
fn start_health_checks(shared: &Arc<Shared>) {
    if let Some(health) = &shared.health {
        // Nothing held down, no monitor heard from, until the checks say otherwise.
        metrics::gauge!("cdnmap_health_clusters_down").set(0.0);
        metrics::gauge!("cdnmap_health_monitors_fresh").set(0.0);
        let reader = Arc::clone(shared);
        tokio::spawn(crate::health::run(
            Arc::clone(health),
            move || Arc::clone(&reader.topology.current_versioned().topology),
            shared.stopping.subscribe(),
        ));
    }
}

/// The HTTP routes: `/metrics`, `/healthz` and `/readyz` (`probes`), `/record` (Admin token)
/// and the dashboard, with the body limit.
fn http_app(
    shared: &Arc<Shared>,
    gate: &Arc<crate::auth::AdminGate>,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
) -> axum::Router {
    let (record_shared, record_gate) = (Arc::clone(shared), Arc::clone(gate));
    let dashboard = crate::dashboard::router(Arc::clone(shared), Arc::clone(gate));
    axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let p = prometheus.clone();
                async move {
                    let mut body = cdnmap_telemetry::render(&p);
                    crate::service::render_cluster_utilization(&mut body);
                    body
                }
            }),
        )
        .route(
            "/record",
            axum::routing::get(
                move |headers: axum::http::HeaderMap,
                      extensions: axum::http::Extensions,
                      q: Result<
                    axum::extract::Query<RecordQuery>,
                    axum::extract::rejection::QueryRejection,
                >| {
                    let (shared, gate) = (Arc::clone(&record_shared), Arc::clone(&record_gate));
                    let remote = extensions
                        .get::<axum::extract::ConnectInfo<SocketAddr>>()
                        .map(|c| c.0.ip());
                    // The query's problem, as the dashboard's errors say theirs (JSON).
                    let q = q.map(|q| q.0).map_err(|e| e.body_text());
                    async move { record(&shared, &gate, &headers, remote, q).await }
                },
            ),
        )
        .merge(crate::probes::routes(shared))
        .merge(dashboard)
        // A body announced larger than any route takes is refused on the head (413), not
        // waited for (the dashboard's actions take at most 4 KiB).
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            MAX_HTTP_BODY_BYTES,
        ))
}

/// A replica, once its gRPC address is known: follows the leader's maps and campaigns under
/// the address the others reach it at (`advertise_url`, else the bound one). Returns the
/// election's task.
fn campaign(
    shared: &Arc<Shared>,
    lead: Arc<crate::lead::Coordinator>,
    events: tokio::sync::mpsc::Receiver<cdnmap_lead::Event>,
    grpc_addr: SocketAddr,
    peer_tls: Option<tonic::transport::ClientTlsConfig>,
) -> tokio::task::JoinHandle<()> {
    let scheme = if shared.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let advertise = shared
        .config
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{grpc_addr}"));
    if grpc_addr.ip().is_unspecified() && shared.config.advertise_url.is_none() {
        tracing::warn!(%advertise, "listening on every address: set advertise_url to the one the other replicas reach this one at");
    }
    tokio::spawn(follow_leader(
        Arc::clone(shared),
        advertise.clone(),
        peer_tls,
    ));
    tokio::spawn(lead.run(events, shared.stopping.subscribe(), advertise))
}

/// The listeners' TLS, with `[tls]` (reloaded on SIGHUP or when a file changes); without it,
/// says what plaintext means for the bound addresses, and answers SIGHUPs that there is
/// nothing to reload.
fn server_tls(
    shared: &Shared,
    hangups: tokio::sync::watch::Receiver<u64>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
) -> anyhow::Result<Option<Arc<crate::tls::ServerTls>>> {
    let Some(files) = &shared.config.tls else {
        let loopback = grpc_addr.ip().is_loopback() && http_addr.ip().is_loopback();
        if loopback {
            tracing::info!(
                "plaintext gRPC and HTTP, on loopback only (set [tls] to listen beyond)"
            );
        } else {
            tracing::warn!("plaintext gRPC and HTTP beyond loopback: the Admin token and the maps cross the network in clear (set [tls])");
        }
        tokio::spawn(reload_on_hangup(hangups, shared.stopping.subscribe()));
        return Ok(None);
    };
    let tls = crate::tls::ServerTls::load(files.to_files())?;
    tokio::spawn(crate::tls::watch(
        Arc::clone(&tls),
        hangups,
        shared.stopping.subscribe(),
    ));
    tracing::info!(
        cert = %files.cert_file.display(),
        mutual = tls.mutual(),
        "TLS on gRPC and HTTP (reloaded on SIGHUP or when a file changes)"
    );
    Ok(Some(tls))
}

/// Warns when Feedback takes anyone's reports beyond loopback.
fn warn_feedback_open(config: &Config, grpc_addr: SocketAddr) {
    if config.feedback_open
        && !grpc_addr.ip().is_loopback()
        && config.feedback_tokens.is_empty()
        && !config.mutual_tls()
    {
        tracing::warn!("feedback_open: Feedback takes reports from anyone who reaches gRPC beyond loopback (each address within its budget and the bounds)");
    }
}

/// The gRPC server over `conns` (Mapping, Feedback, Admin behind the token's check, health,
/// reflection), until `shutdown` resolves, which asks the service to stop.
async fn serve_grpc(
    shared: &Arc<Shared>,
    gate: Arc<crate::auth::AdminGate>,
    conns: tokio::sync::mpsc::Receiver<crate::listen::Conn>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<impl std::future::Future<Output = Result<(), tonic::transport::Error>>> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::mapping_server::MappingServer<MappingService>>()
        .await;
    // Reflection in both versions: v1, and v1alpha, which grpcurl 1.8 (what many
    // distributions ship), grpcui and Python's grpc_reflection client still ask for.
    let reflecting = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(cdnmap_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = reflecting().build_v1()?;
    let reflection_v1alpha = reflecting().build_v1alpha()?;
    let stopper = Arc::clone(shared);
    // HTTP/2 limits (hyper's, through tonic): streams a connection may have open at once, the
    // headers a request may bring, and keepalive pings that close a connection whose peer
    // stopped answering (a WatchMap client that vanished without a FIN). Each request is
    // counted on its connection (its deadlines, `listen`), and must be answered within
    // GRPC_REQUEST_TIMEOUT (a body that never ends holds no stream longer).
    Ok(tonic::transport::Server::builder()
        .timeout(GRPC_REQUEST_TIMEOUT)
        .layer(crate::listen::TrackRequestsLayer)
        .layer(crate::rpc_metrics::RpcMetricsLayer)
        .max_concurrent_streams(GRPC_MAX_STREAMS)
        .http2_max_header_list_size(GRPC_MAX_HEADER_BYTES)
        .http2_keepalive_interval(Some(GRPC_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(GRPC_KEEPALIVE_TIMEOUT))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(pb::mapping_server::MappingServer::new(MappingService::new(
            Arc::clone(shared),
        )))
        .add_service(pb::feedback_server::FeedbackServer::new(FeedbackService(
            Arc::clone(shared),
        )))
        .add_service(pb::admin_server::AdminServer::with_interceptor(
            AdminService(Arc::clone(shared)),
            AdminAuth(gate),
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::StreamExt::map(
                tokio_stream::wrappers::ReceiverStream::new(conns),
                Ok::<_, std::io::Error>,
            ),
            async move {
                shutdown.await;
                tracing::info!("stopping: finishing the calls in flight and the round in progress");
                stopper.stop();
            },
        ))
}

/// The graceful stop: calls in flight get SHUTDOWN_GRACE to finish (tonic's and axum's
/// graceful shutdowns wait for every connection, which a client that never closes would hold
/// forever); the round in progress always finishes and is stored; the lease is given back;
/// then the store is flushed.
async fn stop_in_order(
    shared: &Shared,
    grpc: impl std::future::Future<Output = Result<(), tonic::transport::Error>>,
    http_task: tokio::task::JoinHandle<std::io::Result<()>>,
    loop_task: tokio::task::JoinHandle<()>,
    lead_task: Option<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<()> {
    let mut stopped = shared.stopping.subscribe();
    let grace = async move {
        let _ = stopped.wait_for(|&s| s).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::pin!(grace);
    tokio::select! {
        r = grpc => r?,
        _ = &mut grace => tracing::warn!(?SHUTDOWN_GRACE, "gRPC calls still open; stopping anyway"),
    }
    tokio::select! {
        r = http_task => r??,
        _ = &mut grace => tracing::warn!(?SHUTDOWN_GRACE, "HTTP connections still open; stopping anyway"),
    }
    loop_task.await?;
    if let Some(task) = lead_task {
        // The lease is given back (another replica leads at once), within a bound.
        if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
            tracing::warn!("the election task did not end; its lease runs out by itself");
        }
    }
    if !shared.snapshot_written(SHUTDOWN_GRACE).await {
        tracing::warn!(?SHUTDOWN_GRACE, "a topology snapshot is still being written; stopping anyway (the journal holds every edit)");
    }
    shared.flush()?;
    tracing::info!("stopped; the store is flushed");
    Ok(())
}

/// Without TLS: says, for each SIGHUP, that there is nothing to reload (the configuration is
/// read at start), until `stop` says so. (With TLS, `tls::watch` reloads the certificate and
/// key on SIGHUP.)
async fn reload_on_hangup(
    mut hangups: tokio::sync::watch::Receiver<u64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            r = hangups.changed() => if r.is_err() { return },
            _ = stop.wait_for(|&s| s) => return,
        }
        tracing::info!(
            "SIGHUP: nothing to reload (no [tls]; the configuration is read at start only)"
        );
    }
}

/// How often a replica looks for the replicas' edits it has not applied.
const EDITS_POLL: Duration = Duration::from_millis(500);

/// Replicated: applies the leader's edits from etcd every [`EDITS_POLL`] until the service
/// stops; a problem is logged once (and again when it changes).
async fn follow_edits(shared: Arc<Shared>) {
    let mut stop = shared.stopping.subscribe();
    let mut last_error = String::new();
    while !*stop.borrow() {
        tokio::select! {
            _ = tokio::time::sleep(EDITS_POLL) => {}
            _ = stop.changed() => return,
        }
        match shared.sync_edits().await {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(edits = n, "applied the replicas' edits");
                }
                last_error.clear();
            }
            Err(e) if e != last_error => {
                tracing::warn!(error = %e, "the replicas' edits could not all be applied");
                last_error = e;
            }
            Err(_) => {}
        }
    }
}

/// The TLS a standby follows the leader with: `[tls] peer_ca_file`, and `peer_cert_file` and
/// `peer_key_file` for a leader that asks for a client certificate. `None` without TLS on
/// the listeners or without `peer_ca_file`.
fn peer_tls(config: &Config) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    let Some(tls) = &config.tls else {
        return Ok(None);
    };
    Ok(cdnmap_proto::client_tls::from_config(
        [
            "tls.peer_ca_file",
            "tls.peer_cert_file",
            "tls.peer_key_file",
        ],
        [
            tls.peer_ca_file.as_deref(),
            tls.peer_cert_file.as_deref(),
            tls.peer_key_file.as_deref(),
        ],
    )?)
}

/// Replicated, as a standby: follows the leader's WatchMap (the first replica in the
/// election, by the URL it campaigns with), holding its last published map in
/// `Shared::leader_map`, which the standby's rounds are seeded from. The leader follows no one.
/// With TLS on the gRPC listeners the leader is followed over TLS (`peer_tls`); without
/// `[tls] peer_ca_file` it is not followed, and the standby seeds from its own maps.
async fn follow_leader(
    shared: Arc<Shared>,
    own: String,
    tls: Option<tonic::transport::ClientTlsConfig>,
) {
    let Some(lead) = shared.lead.get().cloned() else {
        return;
    };
    if shared.config.tls.is_some() && tls.is_none() {
        tracing::warn!(
            "TLS on the listeners and no tls.peer_ca_file: a standby seeds its rounds from its \
             own maps, not the leader's"
        );
        return;
    }
    let mut status = lead.status();
    let mut stop = shared.stopping.subscribe();
    // The last failure said (the leader's URL, the error), so a repeat is not said again.
    let mut last_error = (String::new(), String::new());
    let target = |s: &crate::lead::Status| match s.role {
        Some(cdnmap_lead::Role::Leader { .. }) => None,
        _ => s
            .replica_urls
            .first()
            .filter(|u| !u.is_empty() && **u != own)
            .cloned(),
    };
    while !*stop.borrow() {
        let Some(url) = target(&status.borrow()) else {
            tokio::select! {
                _ = status.changed() => {}
                _ = stop.changed() => {}
            }
            continue;
        };
        let changed = async {
            loop {
                if status.changed().await.is_err()
                    || target(&status.borrow()).as_ref() != Some(&url)
                {
                    return;
                }
            }
        };
        tokio::select! {
            r = watch_leader(&shared, &url, tls.as_ref()) => {
                if let Err(e) = r {
                    // Said once per leader and error until a stream ends well: a certificate
                    // the leader refuses would otherwise leave the standby seeding from its
                    // own maps in silence.
                    let shown = (url.clone(), format!("{e:#}"));
                    if shown != last_error {
                        tracing::warn!(error = %shown.1, leader = %url, "following the leader's map failed (retried every 0.5 s)");
                        last_error = shown;
                    }
                } else {
                    last_error = Default::default();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            _ = changed => {}
            _ = stop.changed() => {}
        }
    }
}

/// One WatchMap stream from the leader at `url`: each new version into `Shared::leader_map`.
async fn watch_leader(
    shared: &Shared,
    url: &str,
    tls: Option<&tonic::transport::ClientTlsConfig>,
) -> anyhow::Result<()> {
    use cdnmap_serve::watch::{Applied, Follower};
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_string())?
        .connect_timeout(Duration::from_secs(2));
    if let Some(tls) = tls {
        // tonic would take an http:// URL with a TLS configuration in plaintext: the URL
        // comes from etcd, so a leader that advertises one is not followed at all.
        anyhow::ensure!(
            url.starts_with("https://"),
            "the leader advertises {url}, not https://: not followed in plaintext"
        );
        endpoint = endpoint.tls_config(tls.clone())?;
    }
    let channel = endpoint.connect().await?;
    let mut client =
        pb::mapping_client::MappingClient::new(channel).max_decoding_message_size(1 << 30);
    let mut stream = client
        .watch_map(pb::WatchMapRequest::default())
        .await?
        .into_inner();
    let mut follower = Follower::default();
    while let Some(update) = stream.message().await? {
        // Applying a delta merges every unit: on a blocking thread.
        let (f, applied) = tokio::task::spawn_blocking(move || {
            let applied = follower.apply(update);
            (follower, applied)
        })
        .await?;
        follower = f;
        match applied? {
            Applied::New => {
                if let Some(held) = follower.held() {
                    shared.round.leader_map.store(Some(Arc::new(held.clone())));
                }
            }
            Applied::Part | Applied::Stale => {}
        }
    }
    Ok(())
}

/// Streams one gRPC connection may have open at once (a front end needs two: WatchMap and a
/// report).
pub const GRPC_MAX_STREAMS: u32 = 128;
/// The most bytes of headers (metadata) a gRPC request may carry.
pub const GRPC_MAX_HEADER_BYTES: u32 = 16 << 10;
/// How long a gRPC request may take to be answered (its response's headers: a WatchMap
/// stream's come at once), its body read included.
pub const GRPC_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an HTTP request may take to be answered (the head of its response), its body
/// read included.
pub const HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// A gRPC connection is pinged after this long without a frame from its peer...
pub const GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// ...and closed when the ping is not answered within this.
pub const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long calls in flight may take to finish once the service is asked to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// The HTTP listener over `listen::accept` with `limits` and `request_timeout`, its routes
    /// `POST /echo` (the body back) and `POST /slow` (its body back after 2 s): its address.
    async fn http_listener(limits: crate::listen::Limits, request_timeout: Duration) -> SocketAddr {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = tcp.local_addr().expect("an address");
        // The sender is kept for as long as the test's runtime: the listener never stops.
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        std::mem::forget(stop_tx);
        let conns =
            crate::listen::accept(tcp, crate::tls::Listener::Http, None, limits, stop.clone());
        let app = axum::Router::new()
            .route(
                "/echo",
                axum::routing::post(|body: axum::body::Bytes| async move { body }),
            )
            .route(
                "/slow",
                axum::routing::post(|body: axum::body::Bytes| async move {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    body
                }),
            );
        tokio::spawn(serve_http(
            conns,
            app,
            Duration::from_secs(10),
            request_timeout,
            stop,
        ));
        addr
    }

    /// Sends `request` on a new connection to `addr`: what came back before the connection
    /// closed or 5 s passed, and after how long.
    async fn ask(addr: SocketAddr, request: &'static [u8]) -> (String, Duration) {
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("a read timeout");
            s.write_all(request).expect("send");
            let started = std::time::Instant::now();
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            (String::from_utf8_lossy(&got).to_string(), started.elapsed())
        })
        .await
        .expect("the client")
    }

    /// A connection's first request sent whole holds the handshake deadline off while it is
    /// answered (a slow answer is not cut), one whose body never comes does not: with a
    /// deadline of 1 s, `/slow` is answered after 2 s, and a request announcing 10 bytes and
    /// sending 1 has its connection closed, unanswered, at about 1 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_first_request_sent_whole_holds_the_deadline_off_and_a_half_sent_one_does_not() {
        let addr = http_listener(
            crate::listen::Limits {
                handshake_timeout: Duration::from_secs(1),
                idle_timeout: Duration::from_secs(10),
                max_connections: 8,
                max_per_source: 8,
            },
            Duration::from_secs(10),
        )
        .await;
        let (answer, took) = ask(
            addr,
            b"POST /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
            "{answer:?}"
        );
        assert!(took >= Duration::from_secs(2), "after {took:?}");
        let (answer, took) = ask(
            addr,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n1",
        )
        .await;
        assert_eq!(answer, "", "a half-sent request answered");
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "closed after {took:?}"
        );
    }

    /// The HTTP listener over `listen::accept` with a request timeout of 1 s: a request whose
    /// body never comes is answered 408 at the timeout (its connection then served, closed
    /// when idle), and one that comes whole is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_http_request_whose_body_never_comes_is_answered_408_at_the_timeout() {
        let addr = http_listener(
            crate::listen::Limits {
                handshake_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(10),
                max_connections: 8,
                max_per_source: 8,
            },
            Duration::from_secs(1),
        )
        .await;
        let (answer, took) = ask(
            addr,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10\r\n\r\n1",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "answered after {took:?}"
        );
        let (answer, _) = ask(
            addr,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");
    }
}
