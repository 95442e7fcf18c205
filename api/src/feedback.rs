//! The `cdnmap.v1.Feedback` service: demand and load reports, validated, written to the demand
//! record before the ack, and handed to the next round.

use std::net::IpAddr;
use std::sync::Arc;

use cdnmap_mapper::UnitIdx;
use cdnmap_proto::v1 as pb;
use cdnmap_proto::MAX_REPORT_SAMPLES;
use ipnet::IpNet;
use tonic::{Request, Response, Status};

use crate::service::{
    invalid, now_unix_ms, Pending, Reference, Shared, MAX_PENDING_LOADS, MAX_REPORTS, PERIOD_SLACK,
};
use cdnmap_estimator::rtt::RttTable;
use cdnmap_mapper::model::{shown_id, shown_number};
use cdnmap_store::record::{
    self, DemandBody, LoadBody, NodeLoad, RecordedReport, Report, RttBody, RttSample, Sample,
    ServerLoad, Target,
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
    shared: &Shared,
) -> Result<(Vec<Sample>, Vec<cdnmap_engine::budget::Ask>), Status> {
    // Finite is not enough: one sample of 1e308 made every figure of the rounds after it
    // meaningless.
    let period_secs = (period_ms as f64 / 1e3).max(1.0);
    let cycle_ms = shared.config.cycle_secs as i64 * 1_000;
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
        .and_then(crate::admin::bearer_token);
    match given {
        Some(g) => tokens
            .iter()
            // Every token compared, in constant time each: how long it takes says nothing of
            // which token came close.
            .fold(None, |found, (name, t)| {
                let hit = crate::admin::constant_time_eq(g.as_bytes(), t.as_bytes());
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
        let (mut samples, asks) = demand_samples(&r, period_ms, &topology, &reference, &self.0)?;
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
        if r.loads.len() > MAX_REPORT_SAMPLES {
            return Err(invalid(format!(
                "loads: {} in one report, more than {MAX_REPORT_SAMPLES}",
                r.loads.len()
            )));
        }
        if r.servers.len() > MAX_REPORT_SAMPLES {
            return Err(invalid(format!(
                "servers: {} in one report, more than {MAX_REPORT_SAMPLES}",
                r.servers.len()
            )));
        }
        let topology = self.0.topology.current();
        for (i, l) in r.loads.iter().enumerate() {
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
        let mut servers = Vec::with_capacity(r.servers.len());
        for (i, l) in r.servers.iter().enumerate() {
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
            servers.push((l.cluster.as_str(), address, l.load));
        }
        let n = (r.loads.len() + r.servers.len()) as u64;
        let body = LoadBody {
            measured_at_unix_ms: r.measured_at_unix_ms,
            loads: r
                .loads
                .iter()
                .map(|l| NodeLoad {
                    cluster: l.cluster.clone(),
                    node: l.node.clone(),
                    load: l.load,
                })
                .collect(),
            servers: servers
                .iter()
                .map(|&(cluster, address, load)| ServerLoad {
                    cluster: cluster.to_string(),
                    address,
                    load,
                })
                .collect(),
        };
        self.store(&reporter, Report::Load(body)).await?;
        for &(cluster, address, load) in &servers {
            if !self.0.server_loads.set(cluster, address, load) {
                tracing::warn!(cluster, %address, "server load table full; report dropped");
            }
        }
        if let Ok(mut pending) = self.0.pending.lock() {
            for l in &r.loads {
                if pending.loads.len() >= MAX_PENDING_LOADS {
                    pending.loads.pop_front();
                }
                pending
                    .loads
                    .push_back((l.cluster.clone(), l.node.clone(), l.load));
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
        let mut samples = Vec::with_capacity(r.samples.len());
        for (i, s) in r.samples.iter().enumerate() {
            RttTable::check(s.rtt_ms, s.samples)
                .map_err(|e| invalid(format!("samples[{i}].{e}")))?;
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
            let (target, unit, _) =
                resolve_target(&topology, snapshot.as_deref(), asked, &s.traffic_class, i)?;
            samples.push(RttSample {
                target,
                class: s.traffic_class.clone(),
                unit: unit.map(|u| topology.unit_id(u).to_string()),
                cluster: s.cluster.clone(),
                rtt_ms: s.rtt_ms,
                samples: s.samples,
            });
        }
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
        if r.addresses.len() > MAX_REPORT_SAMPLES {
            return Err(invalid(format!(
                "addresses: {} in one report, more than {MAX_REPORT_SAMPLES}",
                r.addresses.len()
            )));
        }
        self.spend(
            &source,
            r.addresses.len().max(1),
            cdnmap_proto::prost::Message::encoded_len(&r),
        )?;
        let mut verdicts = Vec::with_capacity(r.addresses.len());
        for (i, a) in r.addresses.iter().enumerate() {
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
            verdicts.push((a.cluster.clone(), addr, a.up, a.error.clone()));
        }
        let accepted = verdicts.len() as u64;
        health.report(&name, verdicts);
        let config = health.config();
        // The targets, by cluster, in the order they are probed.
        let mut targets: Vec<pb::ProbeTarget> = Vec::new();
        for (cluster, addr, probe) in health.targets() {
            if targets.last().is_none_or(|t| t.cluster != cluster) {
                targets.push(pb::ProbeTarget {
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
            if let Some(t) = targets.last_mut() {
                t.addresses.push(addr.to_string());
            }
        }
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
