//! The reports the bench sends through Feedback: demand samples at a steady rate, and every resource node's load with each map version its client applies.

use super::*;

/// What the reporters did.
#[derive(Default)]
pub(crate) struct ReportStats {
    pub(crate) demand_reports: AtomicU64,
    pub(crate) samples: AtomicU64,
    pub(crate) load_reports: AtomicU64,
    pub(crate) loads: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// Demand ticks skipped: `MAX_REPORTS_IN_FLIGHT` calls were still open.
    pub(crate) skipped: AtomicU64,
    pub(crate) latency_us_max: AtomicU64,
    pub(crate) first_error: Mutex<Option<String>>,
}

impl ReportStats {
    pub(crate) fn note<T>(&self, result: std::result::Result<T, String>, started: Instant) -> bool {
        let us = started.elapsed().as_micros() as u64;
        self.latency_us_max.fetch_max(us, Ordering::Relaxed);
        match result {
            Ok(_) => true,
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                lock(&self.first_error).get_or_insert(e);
                false
            }
        }
    }
}

pub(crate) async fn feedback_client(
    grpc: SocketAddr,
) -> Result<pb::feedback_client::FeedbackClient<tonic::transport::Channel>> {
    Ok(pb::feedback_client::FeedbackClient::connect(format!("http://{grpc}")).await?)
}

/// One demand report sent (at most `RPC_TIMEOUT`), its outcome counted.
pub(crate) async fn send_demand(
    mut client: pb::feedback_client::FeedbackClient<tonic::transport::Channel>,
    report: pb::DemandReport,
    stats: Arc<ReportStats>,
) {
    let started = Instant::now();
    let sent = tokio::time::timeout(RPC_TIMEOUT, client.report_demand(report)).await;
    let result = match sent {
        Ok(Ok(ack)) => Ok(ack.into_inner().accepted),
        Ok(Err(status)) => Err(format!("ReportDemand: {status}")),
        Err(_) => Err(format!("ReportDemand: no answer within {RPC_TIMEOUT:?}")),
    };
    if let Ok(accepted) = &result {
        stats.samples.fetch_add(*accepted, Ordering::Relaxed);
        stats.demand_reports.fetch_add(1, Ordering::Relaxed);
    }
    stats.note(result, started);
}

/// Demand reports at `rate` samples a second until `until`: a report every `REPORT_TICK`,
/// at most `MAX_REPORTS_IN_FLIGHT` calls at once (a tick with that many is skipped, and
/// counted); unit after unit, each its configured demand with ±`noise`% of noise.
pub(crate) async fn report_demand(
    grpc: SocketAddr,
    inst: Arc<Instance>,
    (rate, noise, seed): (u64, f64, u64),
    until: Instant,
    stats: Arc<ReportStats>,
) {
    let client = match feedback_client(grpc).await {
        Ok(c) => c,
        Err(e) => {
            stats.note::<()>(Err(format!("connecting: {e:#}")), Instant::now());
            return;
        }
    };
    let per_tick =
        ((rate as f64 * REPORT_TICK.as_secs_f64()).round() as usize).clamp(1, MAX_REPORT_SAMPLES);
    let n = inst.unit_count() as UnitIdx;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfeed);
    let mut next: UnitIdx = 0;
    let mut calls = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(REPORT_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let ticks = until
        .saturating_duration_since(Instant::now())
        .as_millis()
        .div_ceil(REPORT_TICK.as_millis()) as usize;
    for _ in 0..ticks {
        tick.tick().await;
        while calls.try_join_next().is_some() {}
        if Instant::now() >= until {
            break;
        }
        if calls.len() >= MAX_REPORTS_IN_FLIGHT {
            stats.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let samples = (0..per_tick)
            .map(|_| {
                let u = next;
                next = (next + 1) % n.max(1);
                let x = 1.0 + noise / 100.0 * rng.random_range(-1.0..1.0);
                pb::DemandSample {
                    target: Some(pb::demand_sample::Target::MapUnit(inst.unit_id(u).into())),
                    traffic_class: inst.classes()[usize::from(inst.unit_class(u))].name.clone(),
                    queries: inst.unit_demand(u) * x,
                }
            })
            .collect::<Vec<_>>();
        let end = now_unix_ms() as i64;
        let report = pb::DemandReport {
            reporter: "bench-serve".into(),
            period_start_unix_ms: end - REPORT_TICK.as_millis() as i64,
            period_end_unix_ms: end,
            samples,
        };
        calls.spawn(send_demand(client.clone(), report, Arc::clone(&stats)));
    }
    let drain = async { while calls.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(RPC_TIMEOUT, drain).await;
}

/// The load every resource node of `inst` carries under `map` with each unit's configured
/// demand and the configured coefficients (what the estimator predicts): (cluster, node, load).
pub(crate) fn node_loads(inst: &Instance, map: &ServingMap) -> Vec<pb::NodeLoad> {
    let clusters: Vec<Option<u32>> = map
        .clusters()
        .iter()
        .map(|c| inst.cluster_index(&c.id))
        .collect();
    let n = map.unit_count();
    let aligned = n == inst.unit_count()
        && n > 0
        && map.unit_id(0) == inst.unit_id(0)
        && map.unit_id(n as UnitIdx - 1) == inst.unit_id(n as UnitIdx - 1);
    let mut used = vec![0.0; inst.node_count()];
    for u in 0..n as UnitIdx {
        let iu = if aligned {
            Some(u)
        } else {
            inst.unit_index(map.unit_id(u))
        };
        let Some(iu) = iu else { continue };
        let k = inst.unit_class(iu);
        let per_unit = inst.classes()[usize::from(k)].per_unit;
        let demand = inst.unit_demand(iu);
        let (cs, shares) = map.shares(u);
        for (&c, &s) in cs.iter().zip(shares) {
            let Some(ic) = clusters.get(c as usize).copied().flatten() else {
                continue;
            };
            let cluster = &inst.clusters()[ic as usize];
            for node in cluster.path(k) {
                let kind = cluster.nodes[node as usize].kind;
                used[inst.global_node(ic, node)] += demand * s * per_unit.get(kind);
            }
        }
    }
    let mut out = Vec::with_capacity(used.len());
    for (ci, cluster) in inst.clusters().iter().enumerate() {
        for (ni, node) in cluster.nodes.iter().enumerate() {
            out.push(pb::NodeLoad {
                cluster: cluster.id.clone(),
                node: node.name.clone(),
                load: used[inst.global_node(ci as u32, ni as u32)],
            });
        }
    }
    out
}

/// A load report for every map version the bench's WatchMap client applies, sent as soon as
/// it has it (so the loads the next round learns from are those under the map it replaces),
/// until `until`: every node's load under that map.
pub(crate) async fn report_loads(
    grpc: SocketAddr,
    inst: Arc<Instance>,
    watched: Arc<Watched>,
    until: Instant,
    stats: Arc<ReportStats>,
) {
    let mut client = match feedback_client(grpc).await {
        Ok(c) => c,
        Err(e) => {
            stats.note::<()>(Err(format!("connecting: {e:#}")), Instant::now());
            return;
        }
    };
    let mut versions = watched.version.subscribe();
    versions.mark_changed(); // the map held now first
    let deadline = tokio::time::Instant::from_std(until);
    for _ in 0..MAX_UPDATES {
        match tokio::time::timeout_at(deadline, versions.changed()).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        let Some(map) = lock(&watched.map).clone() else {
            continue;
        };
        let inst = Arc::clone(&inst);
        let Ok(loads) = tokio::task::spawn_blocking(move || node_loads(&inst, &map)).await else {
            continue;
        };
        for chunk in loads.chunks(MAX_REPORT_SAMPLES) {
            let report = pb::LoadReport {
                reporter: "bench-serve".into(),
                measured_at_unix_ms: now_unix_ms() as i64,
                loads: chunk.to_vec(),
                servers: Vec::new(),
            };
            let started = Instant::now();
            let sent = tokio::time::timeout(RPC_TIMEOUT, client.report_load(report)).await;
            let result = match sent {
                Ok(Ok(ack)) => Ok(ack.into_inner().accepted),
                Ok(Err(status)) => Err(format!("ReportLoad: {status}")),
                Err(_) => Err(format!("ReportLoad: no answer within {RPC_TIMEOUT:?}")),
            };
            if let Ok(accepted) = &result {
                stats.loads.fetch_add(*accepted, Ordering::Relaxed);
                stats.load_reports.fetch_add(1, Ordering::Relaxed);
            }
            stats.note(result, started);
        }
    }
}
