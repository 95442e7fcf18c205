//! The gRPC half of `cdnmap bench resolve`: Resolve and ResolveBatch over loopback against the
//! real `Mapping` service, and the same load against a bare tonic "echo" service of the same
//! proto that answers every call with a constant (the cost of gRPC itself), measured the same
//! way in the same run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cdnmap_api::mapping::MappingService;
use cdnmap_api::service::Shared;
use cdnmap_api::Config;
use cdnmap_proto::v1 as pb;
use cdnmap_topology::Topology;
use ipnet::IpNet;
use tonic::{Request, Response, Status};

/// The baseline: answers without looking at the query.
struct Echo;

fn echo_answer() -> pb::ResolveResponse {
    pb::ResolveResponse {
        addresses: vec!["198.18.0.1".into(), "198.18.0.2".into()],
        ttl_seconds: 20,
        scope_prefix_len: 24,
        cluster_ids: vec!["echo-1".into()],
        map_version: 1,
        map_epoch: 1,
        map_unit: "echo".into(),
        traffic_class: "web".into(),
        rcode: 0,
        route: "mapped".into(),
        cname: String::new(),
    }
}

#[tonic::async_trait]
impl pb::mapping_server::Mapping for Echo {
    async fn resolve(
        &self,
        _: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::ResolveResponse>, Status> {
        Ok(Response::new(echo_answer()))
    }

    async fn resolve_batch(
        &self,
        request: Request<pb::ResolveBatchRequest>,
    ) -> Result<Response<pb::ResolveBatchResponse>, Status> {
        let n = request.into_inner().queries.len();
        Ok(Response::new(pb::ResolveBatchResponse {
            answers: vec![echo_answer(); n],
        }))
    }

    type WatchMapStream = tokio_stream::Empty<Result<pb::MapUpdate, Status>>;

    async fn watch_map(
        &self,
        _: Request<pb::WatchMapRequest>,
    ) -> Result<Response<Self::WatchMapStream>, Status> {
        Err(Status::unimplemented("the echo service has no map"))
    }
}

/// Serves `svc` on an ephemeral loopback port; returns the address.
async fn spawn<S: pb::mapping_server::Mapping>(svc: S) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::mapping_server::MappingServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Ok(addr)
}

/// One load run's result: queries answered, wall time, per-call latencies (sorted).
struct Run {
    queries: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.queries as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn quantile(&self, q: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies.get(i).copied().unwrap_or_default()
    }
}

/// `calls` calls of `batch` queries each (1: Resolve, more: ResolveBatch), `concurrency` in
/// flight over `connections` HTTP/2 connections.
async fn load(
    addr: SocketAddr,
    queries: Arc<Vec<pb::ResolveRequest>>,
    calls: usize,
    batch: usize,
    concurrency: usize,
) -> Result<Run> {
    const CONNECTIONS: usize = 4;
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        clients.push(pb::mapping_client::MappingClient::new(channel));
    }
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for t in 0..concurrency {
        let mut client = clients[t % CONNECTIONS].clone();
        let queries = Arc::clone(&queries);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut call = t;
            while call < calls {
                let at = (call * batch) % queries.len();
                let t0 = Instant::now();
                if batch == 1 {
                    client.resolve(queries[at].clone()).await?;
                } else {
                    let qs = (0..batch)
                        .map(|k| queries[(at + k) % queries.len()].clone())
                        .collect();
                    client
                        .resolve_batch(pb::ResolveBatchRequest { queries: qs })
                        .await?;
                }
                latencies.push(t0.elapsed());
                call += concurrency;
            }
            Ok::<_, Status>(latencies)
        }));
    }
    let mut latencies = Vec::with_capacity(calls);
    for t in tasks {
        latencies.extend(t.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Run {
        queries: calls * batch,
        elapsed,
        latencies,
    })
}

/// Runs the gRPC half and prints it.
pub fn run(
    instance: &Topology,
    config: Config,
    clients: &[(IpNet, String)],
    calls: usize,
    batch: usize,
    concurrency: usize,
) -> Result<()> {
    let queries: Vec<pb::ResolveRequest> = clients
        .iter()
        .map(|(client, name)| {
            let host = client.prefix_len() == client.max_prefix_len();
            pb::ResolveRequest {
                client_subnet: if host {
                    String::new()
                } else {
                    client.to_string()
                },
                resolver_ip: if host {
                    client.addr().to_string()
                } else {
                    String::new()
                },
                qname: name.clone(),
                qtype: if client.addr().is_ipv6() { 28 } else { 1 },
            }
        })
        .collect();
    let queries = Arc::new(queries);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let shared = Shared::start(config, || Ok(instance.clone()))?;
        shared.run_round().await;
        let mapper = spawn(MappingService::new(Arc::clone(&shared))).await?;
        let echo = spawn(Echo).await?;
        let batch_calls = (calls / batch).max(1);
        println!(
            "grpc           loopback, {concurrency} calls in flight over 4 connections, both services in this process"
        );
        let mut resolve_rates = [0.0; 2];
        for (i, (name, addr)) in [("echo", echo), ("cdnmap", mapper)].into_iter().enumerate() {
            // A short warm-up, then the measured runs.
            load(addr, Arc::clone(&queries), 1_000, 1, concurrency).await?;
            let one = load(addr, Arc::clone(&queries), calls, 1, concurrency).await?;
            let many = load(addr, Arc::clone(&queries), batch_calls, batch, concurrency).await?;
            resolve_rates[i] = one.rate();
            for (what, r) in [("Resolve", &one), ("ResolveBatch", &many)] {
                println!(
                    "  {name:<6} {what:<12} {:>9.0} queries/s   p50 {:>7.1} us   p99 {:>7.1} us per call   ({} calls{})",
                    r.rate(),
                    r.quantile(0.5).as_secs_f64() * 1e6,
                    r.quantile(0.99).as_secs_f64() * 1e6,
                    r.latencies.len(),
                    if what == "Resolve" { String::new() } else { format!(" of {batch}") }
                );
            }
        }
        let ratio = resolve_rates[1] / resolve_rates[0].max(1e-9);
        println!(
            "grpc ratio     cdnmap Resolve / echo Resolve = {ratio:.2} (target >= 0.8): {}",
            if ratio >= 0.8 { "met" } else { "NOT met" }
        );
        Ok::<_, anyhow::Error>(())
    })
}
