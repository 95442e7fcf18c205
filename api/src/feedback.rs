//! The `cdnmap.v1.Feedback` service: demand and load reports, validated, written to the demand
//! record before the ack, and handed to the next round.

use std::net::IpAddr;
use std::sync::Arc;

use cdnmap_estimator::rtt::RttTable;
use cdnmap_mapper::model::{shown_id, shown_number};
use cdnmap_mapper::UnitIdx;
use cdnmap_proto::v1 as pb;
use cdnmap_proto::MAX_REPORT_SAMPLES;
use cdnmap_store::record::{
    self, DemandBody, LoadBody, NodeLoad, RecordedReport, Report, RttBody, RttSample, Sample,
    ServerLoad, Target,
};
use ipnet::IpNet;
use tonic::{Request, Response, Status};

use crate::clock::now_unix_ms;
use crate::service::{
    invalid, Pending, Reference, Shared, MAX_PENDING_LOADS, MAX_REPORTS, PERIOD_SLACK,
};

/// The `Feedback` service: validated reports go to the demand record (durable before the ack).
pub struct FeedbackService(pub Arc<Shared>);

impl FeedbackService {
    /// Takes a report of `samples` samples in `bytes` bytes from `source`'s budget, or refuses
    /// it (RESOURCE_EXHAUSTED, counted; the sender keeps it for later).
    fn spend(&self, source: &str, samples: usize, bytes: usize) -> Result<(), Status> {
        use cdnmap_engine::budget::Refusal;
        let now = budget_clock();
        let refused = match self
            .0
            .intake
            .budgets
            .take(source, samples as f64, bytes as f64, now)
        {
            Ok(()) => return Ok(()),
            Err(r) => r,
        };
        let (reason, message) = match refused {
            Refusal::Spent { retry_secs } => (
                "budget",
                format!(
                    "this source has spent its feedback budget ({} samples a second): retry in {retry_secs:.1} s",
                    self.0.config.feedback_samples_per_sec
                ),
            ),
            Refusal::TooLarge => (
                "too_large",
                format!(
                    "a report of {samples} samples ({bytes} bytes) is more than a source's whole budget"
                ),
            ),
            Refusal::TooManySources => (
                "sources",
                "too many feedback sources at once: retry later".to_string(),
            ),
        };
        metrics::counter!("cdnmap_feedback_refused_total", "reason" => reason).increment(1);
        Err(Status::resource_exhausted(message))
    }

    /// The first steps of a demand or RTT report: who it is recorded under (see
    /// [`identify`]), its samples (`of` gives the claimed reporter and the count) no more than
    /// [`MAX_REPORT_SAMPLES`], its cost taken from its source's budget. Returns the reporter,
    /// the source (the key of its budget and bounds) and the report.
    fn accept<T: cdnmap_proto::prost::Message>(
        &self,
        request: Request<T>,
        of: impl Fn(&T) -> (&String, usize),
    ) -> Result<(String, String, T), Status> {
        let identity = identify(&self.0, &request)?;
        let source = budget_source(identity.as_deref(), &request);
        let r = request.into_inner();
        let (claimed, count) = of(&r);
        let reporter = reporter_of(identity, claimed)?;
        if count > MAX_REPORT_SAMPLES {
            return Err(invalid(format!(
                "samples: {count} in one report, more than {MAX_REPORT_SAMPLES}"
            )));
        }
        self.spend(&source, count, r.encoded_len())?;
        Ok((reporter, source, r))
    }

    /// Writes `report` from `reporter` to the demand record; durable when it returns, with the
    /// time it is recorded as received.
    async fn store(&self, reporter: &str, report: Report) -> Result<i64, Status> {
        let bytes = record::encode(&RecordedReport {
            reporter: reporter.to_string(),
            report,
        });
        let shared = Arc::clone(&self.0);
        let bounds = cdnmap_store::ReportBounds {
            retain_ms: shared.config.record_retention_hours as i64 * 3_600_000,
            max_reports: MAX_REPORTS,
            max_bytes: shared.config.record_max_mb << 20,
        };
        let at = now_unix_ms();
        tokio::task::spawn_blocking(move || shared.store.append_report(at, &bytes, bounds))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(at)
    }
}

/// `pending`'s observed demand by unit index of `topology`, the one a report was resolved
/// against.
fn realign(pending: &mut Pending, topology: &cdnmap_topology::Topology) {
    if !pending
        .demand
        .units()
        .is_some_and(|u| u.same_unit_ids(topology))
    {
        pending.demand = std::mem::take(&mut pending.demand).realigned(topology);
    }
}

/// A demand report admitted within the bounds ([`cdnmap_engine::budget::RoundLedger::admit`]) and
/// not yet settled: settled when dropped, adding what it admitted to the round's observed
/// demand when it was `stored`, else giving its share of the bounds back (a failed store, or
/// a call cancelled before its ack).
struct Held<'a> {
    shared: &'a Shared,
    topology: &'a cdnmap_topology::Topology,
    ticket: u64,
    stored: bool,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut pending = self
            .shared
            .intake
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let adds = pending.ledger.settle(self.ticket, self.stored);
        if adds.is_empty() {
            return;
        }
        realign(&mut pending, self.topology);
        for (unit, q) in adds {
            pending.demand.add(unit, q);
        }
    }
}

impl FeedbackService {
    /// Admits what `source`'s demand samples `asks` (resolved against `topology`) may add
    /// within the bounds of this round's period, relative to `reference`
    /// ([`cdnmap_engine::budget::RoundLedger::admit`]); held until settled ([`Held`]).
    fn admit(
        &self,
        source: &str,
        asks: &[cdnmap_engine::budget::Ask],
        topology: &cdnmap_topology::Topology,
        reference: &Reference,
    ) -> Result<cdnmap_engine::budget::Admitted, Status> {
        let mut pending = self
            .0
            .intake
            .pending
            .lock()
            .map_err(|_| Status::internal("the pending reports' lock is poisoned"))?;
        realign(&mut pending, topology);
        let now = now_unix_ms();
        let cycle_ms = self.0.config.cycle_secs as i64 * 1_000;
        let bounds = cdnmap_engine::budget::Bounds {
            ratio: self.0.config.feedback_max_demand_ratio,
            cycles: cdnmap_engine::budget::period_cycles(
                pending.since_ms.unwrap_or(now),
                now,
                cycle_ms,
            ),
            classes: &reference.classes,
        };
        let Pending { demand, ledger, .. } = &mut *pending;
        ledger
            .admit(source, asks, &bounds, |u| demand.get(u).unwrap_or(0.0))
            .map_err(|_| {
                metrics::counter!("cdnmap_feedback_refused_total", "reason" => "sources")
                    .increment(1);
                Status::resource_exhausted("too many feedback sources in this round: retry later")
            })
    }
}

/// A demand report's samples, checked (a count >= 0, at most [`MAX_SAMPLE_QPS`] over the
/// report's period of `period_ms`, a target that resolves): each as recorded (its queries
/// weighed by the period, until the bounds admit them), and what it asks of the bounds — its unit in `topology`, that unit's demand and
/// class in the last round (`reference`; a unit that round did not have is bounded by its
/// class's mean there), its queries weighed by the period.
fn demand_samples(
    r: &pb::DemandReport,
    period_ms: i64,
    topology: &cdnmap_topology::Topology,
    reference: &Reference,
    cycle_ms: i64,
) -> Result<(Vec<Sample>, Vec<cdnmap_engine::budget::Ask>), Status> {
    // Finite is not enough: one sample of 1e308 made every figure of the rounds after it
    // meaningless.
    let period_secs = (period_ms as f64 / 1e3).max(1.0);
    let weight = cdnmap_engine::budget::period_weight(period_ms, cycle_ms, PERIOD_SLACK);
    let snap = &reference.snapshot;
    let mut samples = Vec::with_capacity(r.samples.len());
    let mut asks = Vec::with_capacity(r.samples.len());
    for (i, s) in r.samples.iter().enumerate() {
        if !(s.queries.is_finite() && s.queries >= 0.0) {
            return Err(invalid(format!(
                "samples[{i}].queries: {} is not a count >= 0",
                shown_number(s.queries)
            )));
        }
        if s.queries / period_secs > MAX_SAMPLE_QPS {
            return Err(invalid(format!(
                "samples[{i}].queries: {} in {period_secs} s is more than {MAX_SAMPLE_QPS} queries a second from one prefix",
                shown_number(s.queries)
            )));
        }
        let asked = match &s.target {
            Some(pb::demand_sample::Target::MapUnit(u)) => Asked::Unit(u),
            Some(pb::demand_sample::Target::Prefix(p)) => Asked::Prefix(p),
            None => Asked::Nothing,
        };
        let (target, unit, reference_unit) =
            resolve_target(topology, Some(snap.as_ref()), asked, &s.traffic_class, i)?;
        let bound_by = match (unit, reference_unit) {
            (_, Some(u)) => Some((snap.topology.unit_demand(u), snap.topology.unit_class(u))),
            (Some(u), None) => {
                let class = &topology.classes()[usize::from(topology.unit_class(u))].name;
                snap.topology.class_index(class).map(|k| (0.0, k))
            }
            (None, None) => None,
        };
        asks.push(cdnmap_engine::budget::Ask {
            unit,
            reference: bound_by,
            queries: s.queries * weight,
        });
        samples.push(Sample {
            target,
            class: s.traffic_class.clone(),
            queries: s.queries * weight,
        });
    }
    Ok((samples, asks))
}

/// Seconds on a monotonic clock, for the budgets (module `budget` takes time as an argument).
fn budget_clock() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// The name a Feedback request is recorded under, when the service knows its front ends
/// (mutual TLS, or `feedback_tokens`): its certificate's name, or its token's; refused
/// (UNAUTHENTICATED) without either. `Ok(None)` when the service takes reports from anyone
/// (neither is configured: the loopback default), under the name the report gives.
pub(crate) fn identify<T>(shared: &Shared, request: &Request<T>) -> Result<Option<String>, Status> {
    if let Some(name) = crate::listen::peer_of(request).and_then(|p| p.identity.as_deref()) {
        return Ok(Some(name.to_string()));
    }
    let tokens = &shared.config.feedback_tokens;
    if tokens.is_empty() && !shared.config.mutual_tls() {
        return Ok(None);
    }
    let given = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::bearer_token);
    match given {
        Some(g) => tokens
            .iter()
            // Every token compared, in constant time each: how long it takes says nothing of
            // which token came close.
            .fold(None, |found, (name, t)| {
                let hit = crate::auth::constant_time_eq(g.as_bytes(), t.as_bytes());
                found.or(hit.then(|| name.clone()))
            })
            .map(Some)
            .ok_or_else(|| Status::unauthenticated("unknown feedback token")),
        None => Err(Status::unauthenticated(
            "Feedback needs a front end's identity: a client certificate from tls.client_ca_file, or \"authorization: Bearer <token>\" with a token of feedback_tokens",
        )),
    }
}

/// The key of a request's budget: its identity, or (when the service takes reports from
/// anyone, and the name a report gives proves nothing) the address it came from.
fn budget_source<T>(identity: Option<&str>, request: &Request<T>) -> String {
    match identity {
        Some(name) => format!("id:{name}"),
        None => crate::listen::peer_of(request)
            .map_or_else(|| "unknown".into(), |p| format!("ip:{}", p.remote.ip())),
    }
}

/// The reporter a report is recorded under: the identity `identify` found, or else the name
/// the report gives (checked as an id is, when it gives one).
fn reporter_of(identity: Option<String>, claimed: &str) -> Result<String, Status> {
    match identity {
        Some(name) => Ok(name),
        None if claimed.is_empty() => Ok(String::new()),
        None => {
            cdnmap_mapper::model::check_id("reporter", claimed, String::new)
                .map_err(|e| invalid(e.to_string()))?;
            Ok(claimed.to_string())
        }
    }
}

/// The longest failure text a monitor may give with a verdict.
pub const MAX_HEALTH_ERROR: usize = 200;

/// What a sample names as its clients.
enum Asked<'a> {
    Unit(&'a str),
    Prefix(&'a str),
    Nothing,
}

/// Sample `i`'s target, checked: as recorded, its map unit in `topology` (what the next round
/// maps) and in `snapshot`'s map (the published one, which bounds demand), where there is
/// one. A map unit must exist (and be of `traffic_class`, when one is given); a prefix needs a
/// class and is mapped to the unit covering it in the published map (none: recorded all the
/// same, for no unit).
fn resolve_target(
    topology: &cdnmap_topology::Topology,
    snapshot: Option<&cdnmap_engine::round::Snapshot>,
    asked: Asked<'_>,
    traffic_class: &str,
    i: usize,
) -> Result<(Target, Option<UnitIdx>, Option<UnitIdx>), Status> {
    let class = topology.class_index(traffic_class);
    match asked {
        Asked::Unit(u) if !u.is_empty() => {
            let unit = topology.unit_index(u).ok_or_else(|| {
                invalid(format!(
                    "samples[{i}].map_unit: no map unit {}",
                    shown_id(u)
                ))
            })?;
            let own = topology.unit_class(unit);
            if !traffic_class.is_empty() && class != Some(own) {
                return Err(invalid(format!(
                    "samples[{i}].traffic_class: {} is not the class of map unit {u:?} ({:?})",
                    shown_id(traffic_class),
                    topology.classes()[usize::from(own)].name
                )));
            }
            let published_unit = snapshot.and_then(|snap| {
                if snap.topology.same_unit_ids(topology) {
                    Some(unit)
                } else {
                    snap.topology.unit_index(u)
                }
            });
            Ok((Target::MapUnit(u.to_string()), Some(unit), published_unit))
        }
        Asked::Prefix(p) => {
            let Some(k) = class else {
                return Err(invalid(format!(
                    "samples[{i}].traffic_class: {} is not a traffic class (a prefix sample needs one)",
                    shown_id(traffic_class)
                )));
            };
            let p: IpNet = p.parse().map_err(|_| {
                invalid(format!(
                    "samples[{i}].prefix: {} is not an IP prefix",
                    shown_id(p)
                ))
            })?;
            // The map unit of that prefix and class, if the map has one (the sample is in the
            // record either way).
            let mut units = (None, None);
            if let Some(snap) = snapshot {
                if let Some((u, _)) = snap.resolver.unit_for(p.network(), k) {
                    // The map's units are the topology's unless an edit came since.
                    let unit = if snap.topology.same_unit_ids(topology) {
                        Some(u)
                    } else {
                        topology.unit_index(snap.topology.unit_id(u))
                    };
                    units = (unit, Some(u));
                }
            }
            Ok((Target::Prefix(p.trunc()), units.0, units.1))
        }
        _ => Err(invalid(format!(
            "samples[{i}]: needs a map_unit or a prefix"
        ))),
    }
}

/// At most [`MAX_REPORT_SAMPLES`] entries of `what` in one report.
fn check_count(what: &str, n: usize) -> Result<(), Status> {
    if n > MAX_REPORT_SAMPLES {
        return Err(invalid(format!(
            "{what}: {n} in one report, more than {MAX_REPORT_SAMPLES}"
        )));
    }
    Ok(())
}

/// A load report's node loads, checked against `topology` (a node of a cluster it has; a
/// load >= 0 and at most [`MAX_LOAD_OF_CAPACITY`] times the node's capacity), as recorded.
fn node_loads(
    topology: &cdnmap_topology::Topology,
    loads: &[pb::NodeLoad],
) -> Result<Vec<NodeLoad>, Status> {
    for (i, l) in loads.iter().enumerate() {
        let cluster = topology.cluster_index(&l.cluster).ok_or_else(|| {
            invalid(format!(
                "loads[{i}].cluster: no cluster {}",
                shown_id(&l.cluster)
            ))
        })?;
        let nodes = &topology.clusters()[cluster as usize].nodes;
        let Some(node) = nodes.iter().find(|n| n.name == l.node) else {
            return Err(invalid(format!(
                "loads[{i}].node: cluster {:?} has no resource node {}",
                l.cluster,
                shown_id(&l.node)
            )));
        };
        if !(l.load.is_finite() && l.load >= 0.0) {
            return Err(invalid(format!(
                "loads[{i}].load: {} is not a load >= 0",
                shown_number(l.load)
            )));
        }
        let capacity = node.capacity;
        if l.load > MAX_LOAD_OF_CAPACITY * capacity.max(1.0) {
            return Err(invalid(format!(
                "loads[{i}].load: {} is more than {MAX_LOAD_OF_CAPACITY} times the node's capacity ({})",
                shown_number(l.load),
                shown_number(capacity)
            )));
        }
    }
    Ok(loads
        .iter()
        .map(|l| NodeLoad {
            cluster: l.cluster.clone(),
            node: l.node.clone(),
            load: l.load,
        })
        .collect())
}

/// A load report's server loads, checked against `topology` (an address of a cluster it has;
/// a load >= 0), as recorded.
fn server_loads(
    topology: &cdnmap_topology::Topology,
    servers: &[pb::ServerLoad],
) -> Result<Vec<ServerLoad>, Status> {
    let mut out = Vec::with_capacity(servers.len());
    for (i, l) in servers.iter().enumerate() {
        let cluster = topology.cluster_index(&l.cluster).ok_or_else(|| {
            invalid(format!(
                "servers[{i}].cluster: no cluster {}",
                shown_id(&l.cluster)
            ))
        })?;
        let address: IpAddr = l.address.parse().map_err(|_| {
            invalid(format!(
                "servers[{i}].address: {} is not an IP address",
                shown_id(&l.address)
            ))
        })?;
        if !topology.cluster_addresses(cluster).contains(&address) {
            return Err(invalid(format!(
                "servers[{i}].address: cluster {:?} has no server {address}",
                l.cluster
            )));
        }
        if !(l.load.is_finite() && l.load >= 0.0) {
            return Err(invalid(format!(
                "servers[{i}].load: {} is not a load >= 0",
                l.load
            )));
        }
        out.push(ServerLoad {
            cluster: l.cluster.clone(),
            address,
            load: l.load,
        });
    }
    Ok(out)
}

/// An RTT report's samples, checked (an RTT and a count [`RttTable::check`] takes, a cluster
/// `topology` has, a target that resolves against it and `snapshot`'s map), as recorded.
fn rtt_samples(
    topology: &cdnmap_topology::Topology,
    snapshot: Option<&cdnmap_engine::round::Snapshot>,
    samples: &[pb::RttSample],
) -> Result<Vec<RttSample>, Status> {
    let mut out = Vec::with_capacity(samples.len());
    for (i, s) in samples.iter().enumerate() {
        RttTable::check(s.rtt_ms, s.samples).map_err(|e| invalid(format!("samples[{i}].{e}")))?;
        if topology.cluster_index(&s.cluster).is_none() {
            return Err(invalid(format!(
                "samples[{i}].cluster: no cluster {}",
                shown_id(&s.cluster)
            )));
        }
        let asked = match &s.target {
            Some(pb::rtt_sample::Target::MapUnit(u)) => Asked::Unit(u),
            Some(pb::rtt_sample::Target::Prefix(p)) => Asked::Prefix(p),
            None => Asked::Nothing,
        };
        let (target, unit, _) = resolve_target(topology, snapshot, asked, &s.traffic_class, i)?;
        out.push(RttSample {
            target,
            class: s.traffic_class.clone(),
            unit: unit.map(|u| topology.unit_id(u).to_string()),
            cluster: s.cluster.clone(),
            rtt_ms: s.rtt_ms,
            samples: s.samples,
        });
    }
    Ok(out)
}

/// A monitor's verdict on one address: (cluster, address, up, the failure's text).
type Verdict = (String, std::net::SocketAddr, bool, String);

/// A health report's verdicts, checked (an IP:port, a failure text of at most
/// [`MAX_HEALTH_ERROR`] bytes, a cluster id as ids are checked).
fn verdicts(addresses: &[pb::AddressHealth]) -> Result<Vec<Verdict>, Status> {
    let mut out = Vec::with_capacity(addresses.len());
    for (i, a) in addresses.iter().enumerate() {
        let addr: std::net::SocketAddr = a.address.parse().map_err(|_| {
            invalid(format!(
                "addresses[{i}].address: {} is not an IP:port",
                shown_id(&a.address)
            ))
        })?;
        if a.error.len() > MAX_HEALTH_ERROR {
            return Err(invalid(format!(
                "addresses[{i}].error: {} bytes, more than {MAX_HEALTH_ERROR}",
                a.error.len()
            )));
        }
        cdnmap_mapper::model::check_id("cluster", &a.cluster, String::new)
            .map_err(|e| invalid(format!("addresses[{i}].cluster: {e}")))?;
        out.push((a.cluster.clone(), addr, a.up, a.error.clone()));
    }
    Ok(out)
}

/// The probe targets a monitor is sent, by cluster, in the order they are probed.
fn probe_targets(targets: Vec<crate::health::Target>) -> Vec<pb::ProbeTarget> {
    let mut out: Vec<pb::ProbeTarget> = Vec::new();
    for (cluster, addr, probe) in targets {
        if out.last().is_none_or(|t| t.cluster != cluster) {
            out.push(pb::ProbeTarget {
                cluster,
                addresses: Vec::new(),
                kind: match probe.kind {
                    crate::config::ProbeKind::Tcp => "tcp".into(),
                    crate::config::ProbeKind::Http => "http".into(),
                },
                path: probe.path,
                expect_status: u32::from(probe.expect_status),
            });
        }
        if let Some(t) = out.last_mut() {
            t.addresses.push(addr.to_string());
        }
    }
    out
}

/// The most queries a second one demand sample (one prefix or map unit, one class) may
/// report: a /24 of clients does not send ten million queries a second to one name's
/// resolvers, and a report beyond it is refused rather than allowed to swamp the map.
pub const MAX_SAMPLE_QPS: f64 = 1e7;

/// The most a node's reported load may be, in multiples of its capacity (a load is measured
/// on the node: it can exceed its capacity, not by a hundredfold).
pub const MAX_LOAD_OF_CAPACITY: f64 = 100.0;

#[tonic::async_trait]
impl pb::feedback_server::Feedback for FeedbackService {
    async fn report_demand(
        &self,
        request: Request<pb::DemandReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let (reporter, source, r) = self.accept(request, |r| (&r.reporter, r.samples.len()))?;
        let period_ms =
            cdnmap_engine::budget::report_period_ms(r.period_start_unix_ms, r.period_end_unix_ms)
                .map_err(|e| invalid(e.to_string()))?;
        let topology = self.0.topology.current();
        // The bounds are relative to the last round: before there is one, nothing is taken
        // (the front end keeps its counts and sends them again).
        let reference = self.0.reference().ok_or_else(|| {
            Status::unavailable("no round yet to bound reported demand by: send it again later")
        })?;
        let (mut samples, asks) = demand_samples(
            &r,
            period_ms,
            &topology,
            &reference,
            self.0.config.cycle_secs as i64 * 1_000,
        )?;
        let admitted = self.admit(&source, &asks, &topology, &reference)?;
        // Until it is settled, the report holds its share of the bounds; a call dropped
        // before then gives it back.
        let mut held = Held {
            shared: &self.0,
            topology: &topology,
            ticket: admitted.ticket,
            stored: false,
        };
        if admitted.clipped > 0 {
            metrics::counter!("cdnmap_feedback_clipped_total").increment(admitted.clipped as u64);
            tracing::debug!(reporter = %shown_id(&reporter), clipped = admitted.clipped, "demand samples clipped to their bounds");
        }
        for (s, &q) in samples.iter_mut().zip(&admitted.queries) {
            s.queries = q;
        }
        let n = samples.len() as u64;
        let body = DemandBody {
            period_start_unix_ms: r.period_start_unix_ms,
            period_end_unix_ms: r.period_end_unix_ms,
            samples,
        };
        self.store(&reporter, Report::Demand(body)).await?;
        held.stored = true;
        drop(held);
        Ok(Response::new(pb::ReportAck { accepted: n }))
    }

    async fn report_load(
        &self,
        request: Request<pb::LoadReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let identity = identify(&self.0, &request)?;
        let source = budget_source(identity.as_deref(), &request);
        let r = request.into_inner();
        let reporter = reporter_of(identity, &r.reporter)?;
        self.spend(
            &source,
            r.loads.len() + r.servers.len(),
            cdnmap_proto::prost::Message::encoded_len(&r),
        )?;
        check_count("loads", r.loads.len())?;
        check_count("servers", r.servers.len())?;
        let topology = self.0.topology.current();
        let loads = node_loads(&topology, &r.loads)?;
        let servers = server_loads(&topology, &r.servers)?;
        let n = (loads.len() + servers.len()) as u64;
        let body = LoadBody {
            measured_at_unix_ms: r.measured_at_unix_ms,
            loads,
            servers,
        };
        self.store(&reporter, Report::Load(body.clone())).await?;
        for l in &body.servers {
            if !self
                .0
                .intake
                .server_loads
                .set(&l.cluster, l.address, l.load)
            {
                tracing::warn!(cluster = %l.cluster, address = %l.address, "server load table full; report dropped");
            }
        }
        if let Ok(mut pending) = self.0.intake.pending.lock() {
            for l in body.loads {
                if pending.loads.len() >= MAX_PENDING_LOADS {
                    pending.loads.pop_front();
                }
                pending.loads.push_back((l.cluster, l.node, l.load));
            }
        }
        Ok(Response::new(pb::ReportAck { accepted: n }))
    }

    async fn report_rtt(
        &self,
        request: Request<pb::RttReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let (reporter, _, r) = self.accept(request, |r| (&r.reporter, r.samples.len()))?;
        let topology = self.0.topology.current();
        let published = self.0.published();
        let snapshot = published.as_ref().map(|p| Arc::clone(&p.snapshot));
        let samples = rtt_samples(&topology, snapshot.as_deref(), &r.samples)?;
        let n = samples.len() as u64;
        let body = RttBody {
            measured_at_unix_ms: r.measured_at_unix_ms,
            samples,
        };
        // Durable first; the table is what a restart rebuilds from the record.
        // The time the record holds, so that a restart's rebuild and this take are one report.
        let at = self.store(&reporter, Report::Rtt(body.clone())).await?;
        self.0.take_rtt(&body, at);
        Ok(Response::new(pb::ReportAck { accepted: n }))
    }

    async fn report_health(
        &self,
        request: Request<pb::HealthReport>,
    ) -> Result<Response<pb::HealthAck>, Status> {
        let identity = identify(&self.0, &request)?;
        let source = budget_source(identity.as_deref(), &request);
        let r = request.into_inner();
        let Some(health) = &self.0.health else {
            return Err(Status::failed_precondition(
                "this mapper has no [health]: it takes no monitor's report",
            ));
        };
        let name = reporter_of(identity, &r.monitor)?;
        if !health.config().monitors.contains(&name) {
            return Err(Status::permission_denied(format!(
                "monitor {}: not one of [health] monitors",
                shown_id(&name)
            )));
        }
        check_count("addresses", r.addresses.len())?;
        self.spend(
            &source,
            r.addresses.len().max(1),
            cdnmap_proto::prost::Message::encoded_len(&r),
        )?;
        let verdicts = verdicts(&r.addresses)?;
        let accepted = verdicts.len() as u64;
        health.report(&name, verdicts);
        let config = health.config();
        let targets = probe_targets(health.targets());
        Ok(Response::new(pb::HealthAck {
            accepted,
            interval_ms: config.interval_ms,
            timeout_ms: config.timeout_ms,
            fall: config.fall,
            rise: config.rise,
            targets,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::tests::instance;

    /// The message of a refusal, or "ok".
    fn said<T>(r: Result<T, Status>) -> String {
        match r {
            Ok(_) => "ok".into(),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
                e.message().to_string()
            }
        }
    }

    #[test]
    fn counts_beyond_the_bound_are_refused() {
        for (n, want) in [
            (0, "ok".to_string()),
            (MAX_REPORT_SAMPLES, "ok".to_string()),
            (
                MAX_REPORT_SAMPLES + 1,
                format!(
                    "loads: {} in one report, more than {MAX_REPORT_SAMPLES}",
                    MAX_REPORT_SAMPLES + 1
                ),
            ),
        ] {
            assert_eq!(said(check_count("loads", n)), want, "{n}");
        }
    }

    #[test]
    fn node_loads_name_a_node_and_a_load_it_can_carry() {
        let topology = instance();
        let load = |cluster: &str, node: &str, load: f64| pb::NodeLoad {
            cluster: cluster.into(),
            node: node.into(),
            load,
        };
        for (l, want) in [
            (load("c0", "r", 0.0), "ok"),
            (load("c3", "r", 4_000.0), "ok"),
            (load("c9", "r", 1.0), "loads[0].cluster: no cluster \"c9\""),
            (
                load("c0", "x", 1.0),
                "loads[0].node: cluster \"c0\" has no resource node \"x\"",
            ),
            (
                load("c0", "r", -1.0),
                "loads[0].load: -1 is not a load >= 0",
            ),
            (
                load("c0", "r", f64::NAN),
                "loads[0].load: NaN is not a load >= 0",
            ),
            (
                load("c0", "r", 4_001.0),
                "loads[0].load: 4001 is more than 100 times the node's capacity (40)",
            ),
        ] {
            assert_eq!(
                said(node_loads(&topology, std::slice::from_ref(&l))),
                want,
                "{l:?}"
            );
        }
        let ok = node_loads(&topology, &[load("c1", "r", 3.5)]).expect("valid");
        assert_eq!(
            ok,
            vec![NodeLoad {
                cluster: "c1".into(),
                node: "r".into(),
                load: 3.5
            }]
        );
    }

    #[test]
    fn server_loads_name_a_server_of_the_cluster() {
        let topology = instance();
        let load = |cluster: &str, address: &str, load: f64| pb::ServerLoad {
            cluster: cluster.into(),
            address: address.into(),
            load,
        };
        for (l, want) in [
            (load("c1", "198.18.1.4", 0.5), "ok"),
            (
                load("c9", "198.18.1.4", 0.5),
                "servers[0].cluster: no cluster \"c9\"",
            ),
            (
                load("c1", "not-an-ip", 0.5),
                "servers[0].address: \"not-an-ip\" is not an IP address",
            ),
            (
                load("c1", "198.18.0.1", 0.5),
                "servers[0].address: cluster \"c1\" has no server 198.18.0.1",
            ),
            (
                load("c1", "198.18.1.1", f64::INFINITY),
                "servers[0].load: inf is not a load >= 0",
            ),
        ] {
            assert_eq!(
                said(server_loads(&topology, std::slice::from_ref(&l))),
                want,
                "{l:?}"
            );
        }
        let ok = server_loads(&topology, &[load("c2", "198.18.2.3", 0.25)]).expect("valid");
        assert_eq!(
            ok,
            vec![ServerLoad {
                cluster: "c2".into(),
                address: "198.18.2.3".parse().expect("an address"),
                load: 0.25
            }]
        );
    }

    #[test]
    fn rtt_samples_name_a_cluster_and_a_target() {
        let topology = instance();
        let sample =
            |cluster: &str, target: Option<pb::rtt_sample::Target>, class: &str| pb::RttSample {
                cluster: cluster.into(),
                target,
                traffic_class: class.into(),
                rtt_ms: 20.0,
                samples: 5,
            };
        let unit = |u: &str| Some(pb::rtt_sample::Target::MapUnit(u.into()));
        let prefix = |p: &str| Some(pb::rtt_sample::Target::Prefix(p.into()));
        for (s, want) in [
            (sample("c0", unit("u00"), ""), "ok"),
            (sample("c0", unit("u00"), "web"), "ok"),
            (sample("c0", prefix("10.0.3.0/24"), "web"), "ok"),
            (sample("c9", unit("u00"), ""), "samples[0].cluster: no cluster \"c9\""),
            (sample("c0", unit("u99"), ""), "samples[0].map_unit: no map unit \"u99\""),
            (
                sample("c0", unit("u00"), "video"),
                "samples[0].traffic_class: \"video\" is not the class of map unit \"u00\" (\"web\")",
            ),
            (
                sample("c0", prefix("10.0.3.0/24"), ""),
                "samples[0].traffic_class: \"\" is not a traffic class (a prefix sample needs one)",
            ),
            (
                sample("c0", prefix("10.0.3.0/33"), "web"),
                "samples[0].prefix: \"10.0.3.0/33\" is not an IP prefix",
            ),
            (sample("c0", None, "web"), "samples[0]: needs a map_unit or a prefix"),
        ] {
            assert_eq!(said(rtt_samples(&topology, None, std::slice::from_ref(&s))), want, "{s:?}");
        }
        let bad_rtt = pb::RttSample {
            rtt_ms: -1.0,
            ..sample("c0", unit("u00"), "")
        };
        assert!(said(rtt_samples(&topology, None, &[bad_rtt])).starts_with("samples[0]."));
        // Without a map, a prefix sample is recorded for no unit; a unit sample names its unit.
        let ok = rtt_samples(
            &topology,
            None,
            &[
                sample("c1", prefix("10.0.3.0/24"), "web"),
                sample("c1", unit("u05"), ""),
            ],
        )
        .expect("valid");
        assert_eq!(ok[0].unit, None);
        assert_eq!(ok[1].unit.as_deref(), Some("u05"));
    }

    #[test]
    fn verdicts_name_an_address_and_a_short_error() {
        let verdict = |cluster: &str, address: &str, error: String| pb::AddressHealth {
            cluster: cluster.into(),
            address: address.into(),
            up: error.is_empty(),
            error,
        };
        let long = "e".repeat(MAX_HEALTH_ERROR + 1);
        for (v, want) in [
            (
                verdict("c0", "198.18.0.1:53", String::new()),
                "ok".to_string(),
            ),
            (
                verdict("c0", "198.18.0.1:53", "e".repeat(MAX_HEALTH_ERROR)),
                "ok".to_string(),
            ),
            (
                verdict("c0", "198.18.0.1", String::new()),
                "addresses[0].address: \"198.18.0.1\" is not an IP:port".to_string(),
            ),
            (
                verdict("c0", "198.18.0.1:53", long),
                format!(
                    "addresses[0].error: {} bytes, more than {MAX_HEALTH_ERROR}",
                    MAX_HEALTH_ERROR + 1
                ),
            ),
        ] {
            assert_eq!(said(verdicts(std::slice::from_ref(&v))), want, "{v:?}");
        }
        assert!(
            said(verdicts(&[verdict("", "198.18.0.1:53", String::new())]))
                .starts_with("addresses[0].cluster: ")
        );
    }

    #[test]
    fn a_reporter_is_its_identity_or_a_valid_claimed_name() {
        for (identity, claimed, want) in [
            (Some("fe1"), "other", Ok("fe1")),
            (None, "", Ok("")),
            (None, "fe2", Ok("fe2")),
            (None, "bad name\n", Err(())),
        ] {
            let got = reporter_of(identity.map(String::from), claimed);
            assert_eq!(
                got.as_deref().map_err(|_| ()),
                want,
                "{identity:?} {claimed:?}"
            );
        }
    }
}
