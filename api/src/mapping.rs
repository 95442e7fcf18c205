//! The `cdnmap.v1.Mapping` service: Resolve, ResolveBatch and WatchMap, each answered from one
//! published state.
//!
//! **WatchMap's bounds.** A stream's messages are made by a task of its own, one at a time as
//! its queue has room: at most [`WATCH_QUEUE_MESSAGES`] wait for the connection, each at most a
//! part of a full map (`cdnmap_serve::watch::PART_UNITS` units), so a client that does not
//! read holds a bounded number of bytes (their sum is `cdnmap_watch_queued_bytes`). A stream
//! with a message waiting that its connection has taken nothing of for `watch_stall_secs` is
//! dropped with its connection (hyper takes no more from a stream its client gives no window,
//! so the connection is the one thing that can be closed), and what it held returns. At most
//! `watch_max_streams` are open at once (`cdnmap_watch_streams`); `watch_open = false` keeps
//! WatchMap to the front ends the mapper knows.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdnmap_proto::v1 as pb;
use cdnmap_proto::MAX_BATCH_QUERIES;
use cdnmap_serve::answer::{self, Decision, Query, View, Zones};
use cdnmap_serve::resolve::MAX_QNAME_LEN;
use cdnmap_serve::watch::{Bypass, Sections};
use ipnet::IpNet;
use tokio::sync::broadcast;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::service::{invalid, Published, Shared};
use crate::watch::EdgeParts;
use cdnmap_engine::round::Snapshot;

/// The `Mapping` service, and the WatchMap streams it has open.
pub struct MappingService(pub Arc<Shared>, Arc<AtomicUsize>);

impl MappingService {
    pub fn new(shared: Arc<Shared>) -> MappingService {
        MappingService(shared, Arc::default())
    }
}

/// The client subnet of a query: its ECS subnet, else its resolver's address as a host prefix.
fn client_of(q: &pb::ResolveRequest, index: Option<usize>) -> Result<IpNet, Status> {
    let at = index.map_or(String::new(), |i| format!("queries[{i}]."));
    let name = q.qname.strip_suffix('.').unwrap_or(&q.qname);
    if name.is_empty() || name.len() > MAX_QNAME_LEN {
        return Err(invalid(format!(
            "{at}qname: must be 1..={MAX_QNAME_LEN} characters (without the trailing dot), got {}",
            name.len()
        )));
    }
    if !q.client_subnet.is_empty() {
        return q
            .client_subnet
            .parse::<IpNet>()
            .map(|n| n.trunc())
            .map_err(|_| {
                invalid(format!(
                    "{at}client_subnet: {:?} is not an IP prefix",
                    q.client_subnet
                ))
            });
    }
    q.resolver_ip
        .parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| {
            invalid(format!(
                "{at}resolver_ip: {:?} is not an IP address (and client_subnet is empty)",
                q.resolver_ip
            ))
        })
}

impl MappingService {
    fn resolve_one(&self, q: pb::ResolveRequest) -> Result<pb::ResolveResponse, Status> {
        let client = client_of(&q, None)?;
        let p = self.published()?;
        let bypass = self.0.config.bypass_pairs();
        let view = answer_view(&p, &bypass);
        let query = Query::resolve(&q.qname, q.qtype, client);
        let (mut key, mut addrs) = (String::new(), Vec::new());
        let d = answer::decide(&Zones::default(), Some(&view), &query, &mut key, &mut addrs);
        Ok(self.to_pb(&p, &d, &addrs))
    }

    fn resolve_many(
        &self,
        batch: pb::ResolveBatchRequest,
    ) -> Result<pb::ResolveBatchResponse, Status> {
        if batch.queries.len() > MAX_BATCH_QUERIES {
            return Err(invalid(format!(
                "queries: {} in one batch, more than {MAX_BATCH_QUERIES}",
                batch.queries.len()
            )));
        }
        let clients = batch
            .queries
            .iter()
            .enumerate()
            .map(|(i, q)| client_of(q, Some(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let p = self.published()?;
        let bypass = self.0.config.bypass_pairs();
        let view = answer_view(&p, &bypass);
        let queries: Vec<Query<'_>> = clients
            .iter()
            .zip(&batch.queries)
            .map(|(&c, q)| Query::resolve(&q.qname, q.qtype, c))
            .collect();
        let mut out = Vec::with_capacity(queries.len());
        answer::decide_each(&Zones::default(), &view, &queries, |_, d, addrs| {
            out.push(self.to_pb(&p, d, addrs));
        });
        Ok(pb::ResolveBatchResponse { answers: out })
    }

    /// The published map and its selectors, read once per call: every answer of a call comes
    /// from one version.
    fn published(&self) -> Result<Arc<Published>, Status> {
        self.0
            .published()
            .ok_or_else(|| Status::unavailable("no map yet: the first round has not finished"))
    }

    /// The decision `d` (its addresses `addrs`) as Resolve's answer.
    fn to_pb(&self, p: &Published, d: &Decision<'_>, addrs: &[IpAddr]) -> pb::ResolveResponse {
        let s = &p.snapshot;
        let base = pb::ResolveResponse {
            ttl_seconds: self.0.config.ttl_secs,
            map_version: s.version,
            map_epoch: s.epoch,
            rcode: u32::from(d.rcode.code()),
            ..pb::ResolveResponse::default()
        };
        // No map answer: a name no hostname rule names (NXDOMAIN, as the front end answers).
        let Some(m) = d.mapped else {
            return base;
        };
        let a = &m.answer;
        let clusters = s.topology.clusters();
        // The clusters an answer from the map names, to A and AAAA queries (its primary, and
        // a companion: `serve::servers`).
        let cluster_ids = if m.bypass.is_none() && m.asks_addresses {
            a.named().map(|c| clusters[c as usize].id.clone()).collect()
        } else {
            Vec::new()
        };
        pb::ResolveResponse {
            addresses: addrs.iter().map(IpAddr::to_string).collect(),
            scope_prefix_len: u32::from(a.scope_prefix_len),
            cluster_ids,
            map_unit: a
                .unit
                .map_or(String::new(), |u| s.topology.unit_id(u).to_string()),
            traffic_class: s.topology.classes()[usize::from(a.class)].name.clone(),
            route: m.route.as_str().into(),
            cname: match m.bypass {
                Some(Bypass::Cname(target)) => target.clone(),
                _ => String::new(),
            },
            ..base
        }
    }
}

/// What Resolve decides from: the published map and selectors, the classes' last resorts
/// (`bypass`, from the configuration as WatchMap sends them).
fn answer_view<'v>(p: &'v Published, bypass: &'v [(String, Bypass)]) -> View<'v> {
    View {
        resolver: &p.snapshot.resolver,
        servers: p.servers.as_ref(),
        bypass,
        bounded: false,
    }
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<pb::MapUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl pb::mapping_server::Mapping for MappingService {
    async fn resolve(
        &self,
        request: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::ResolveResponse>, Status> {
        self.resolve_one(request.into_inner()).map(Response::new)
    }

    async fn resolve_batch(
        &self,
        request: Request<pb::ResolveBatchRequest>,
    ) -> Result<Response<pb::ResolveBatchResponse>, Status> {
        self.resolve_many(request.into_inner()).map(Response::new)
    }

    type WatchMapStream = UpdateStream;

    async fn watch_map(
        &self,
        request: Request<pb::WatchMapRequest>,
    ) -> Result<Response<Self::WatchMapStream>, Status> {
        may_watch(&self.0.config, &request)?;
        let streams =
            StreamCount::take(&self.1, self.0.config.watch_max_streams).ok_or_else(|| {
                Status::resource_exhausted(format!(
                    "{} WatchMap streams are open, as many as watch_max_streams",
                    self.0.config.watch_max_streams
                ))
            })?;
        // The connection, to close when the stream stalls.
        let peer = crate::listen::peer_of(&request).map(|p| (Arc::clone(&p.conn), p.remote));
        let stall = Duration::from_secs(self.0.config.watch_stall_secs);
        let r = request.into_inner();
        let known = (r.known_epoch, r.known_version);
        let changes_only = r.changed_sections_only;
        let shared = Arc::clone(&self.0);
        let rx = shared.read.updates.subscribe();
        let stop = shared.stopping.subscribe();
        let first = shared.current();
        let stream = watch_stream(stall, move |tx| async move {
            let _streams = streams;
            let ended = follow(&shared, tx, first, known, changes_only, rx, stop).await;
            if let Err(Ended::Stalled) = ended {
                metrics::counter!("cdnmap_watch_streams_dropped_total", "reason" => "stalled")
                    .increment(1);
                if let Some(passed) = STALLS_LOGGED.allow(crate::throttle::now_ms()) {
                    let remote = peer.as_ref().map(|p| p.1);
                    tracing::warn!(
                        ?remote,
                        ?stall,
                        others_since = passed,
                        "a WatchMap client took nothing for watch_stall_secs: its stream and connection dropped"
                    );
                }
                if let Some((conn, _)) = &peer {
                    conn.close();
                }
            }
        });
        Ok(Response::new(stream))
    }
}

/// Who may follow the map: with mutual TLS, a client with a certificate from the operator's
/// CA; else, with `watch_open = false`, a client with a token of `feedback_tokens`; else anyone.
fn may_watch<T>(config: &crate::config::Config, request: &Request<T>) -> Result<(), Status> {
    if config.mutual_tls() {
        let identified = crate::listen::peer_of(request).is_some_and(|p| p.identity.is_some());
        return if identified {
            Ok(())
        } else {
            Err(Status::unauthenticated(
                "WatchMap needs a client certificate from the operator's CA (tls.client_ca_file)",
            ))
        };
    }
    if config.watch_open {
        return Ok(());
    }
    let given = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::bearer_token);
    let known = given.is_some_and(|g| {
        // Every token compared, in constant time each.
        config.feedback_tokens.values().fold(false, |hit, t| {
            crate::auth::constant_time_eq(g.as_bytes(), t.as_bytes()) | hit
        })
    });
    if known {
        Ok(())
    } else {
        Err(Status::unauthenticated(
            "WatchMap needs a front end's token (watch_open = false): \"authorization: Bearer <token>\" with a token of feedback_tokens",
        ))
    }
}

/// How a WatchMap stream ended early.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The client is gone (or the service stops).
    Gone,
    /// The client took nothing for `watch_stall_secs` with a message waiting.
    Stalled,
}

/// Drops of stalled streams, logged at most once every 10 s.
static STALLS_LOGGED: crate::throttle::LogThrottle =
    crate::throttle::LogThrottle::new(Duration::from_secs(10));

/// Feeds one stream: a full map unless the client knows `first` already (`known`), then each
/// published version, as a delta from the one before when there is one. With `changes_only`,
/// a delta carries the map-wide sections that changed since those the client holds, once
/// the stream knows them (a full map or a whole delta sent).
async fn follow(
    shared: &Shared,
    tx: WatchSender,
    first: Option<Arc<Snapshot>>,
    known: (u64, u64),
    changes_only: bool,
    mut rx: broadcast::Receiver<Arc<Snapshot>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), Ended> {
    let mut last: Option<Arc<Snapshot>> = None;
    // The sections the client holds, as this stream sent them (`None`: not known, or the
    // client did not ask for changes only).
    let mut held: Option<Sections> = None;
    let keep = |sections: Sections| changes_only.then_some(sections);
    if let Some(s) = first {
        if (s.epoch, s.version) != known {
            held = keep(send_full(shared, &s, &tx).await?);
        }
        last = Some(s);
    }
    loop {
        let received = tokio::select! {
            r = rx.recv() => r,
            _ = stop.wait_for(|&s| s) => return Err(Ended::Gone),
            () = tx.tx.closed() => return Err(Ended::Gone),
            () = tx.stalled() => return Err(Ended::Stalled),
        };
        // Only what is newer than what the stream sent: the map current when the stream
        // started may come again from the broadcast (published between the subscription
        // and the read of the current map), and sending it twice would leave `held` with the
        // second copy's sections while the client keeps the first's.
        let newer = |s: &Snapshot| {
            last.as_ref()
                .is_none_or(|p| (s.epoch, s.version) > (p.epoch, p.version))
        };
        let next = match received {
            Ok(s) if !newer(&s) => continue,
            Ok(s) => s,
            Err(broadcast::error::RecvError::Lagged(_)) => match shared.current() {
                Some(s) if !newer(&s) => continue,
                Some(s) => {
                    // Fell behind: start again from a full map.
                    held = keep(send_full(shared, &s, &tx).await?);
                    last = Some(s);
                    continue;
                }
                None => continue,
            },
            Err(broadcast::error::RecvError::Closed) => return Err(Ended::Gone),
        };
        let delta = match &last {
            // A later version of the same epoch: usually the next, or the one after a round
            // whose map could not be stored (never published).
            Some(prev) if prev.epoch == next.epoch && prev.version < next.version => {
                delta_update(shared, held.as_mut(), prev, &next)
            }
            _ => None,
        };
        // No delta follows, or one would carry more units than a part of a full map.
        match delta {
            Some(d) => {
                if d.sections.is_none() {
                    held = keep(Sections::of(&d));
                }
                tx.send("delta", d).await?
            }
            None => held = keep(send_full(shared, &next, &tx).await?),
        }
        last = Some(next);
    }
}

/// Messages a WatchMap stream may have waiting for its connection (each at most a part of a
/// full map: about 2 MB at 11 M map units).
pub const WATCH_QUEUE_MESSAGES: usize = 2;

/// The most a stream's producer waits between looks at whether its client stalled.
const STALL_CHECK_MAX: Duration = Duration::from_secs(1);

/// Whether a stream has stalled: a message waiting, and none taken for `limit`.
fn stalled(waiting: usize, since_taken: Duration, limit: Duration) -> bool {
    waiting > 0 && since_taken >= limit
}

/// One WatchMap stream's open count, given back when it ends.
struct StreamCount(Arc<AtomicUsize>);

impl StreamCount {
    /// A place among at most `max` streams, if there is one.
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<StreamCount> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        metrics::gauge!("cdnmap_watch_streams").increment(1.0);
        Some(StreamCount(Arc::clone(count)))
    }
}

impl Drop for StreamCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
        metrics::gauge!("cdnmap_watch_streams").decrement(1.0);
    }
}

/// A stream's queue as its producer and its connection see it.
struct Queue {
    started: Instant,
    /// Messages waiting, not yet taken by the connection.
    waiting: AtomicUsize,
    /// Milliseconds from `started` to when the connection last took a message.
    taken_ms: AtomicU64,
}

impl Queue {
    fn since_taken(&self) -> Duration {
        let taken = Duration::from_millis(self.taken_ms.load(Ordering::Acquire));
        self.started.elapsed().saturating_sub(taken)
    }
}

/// A message in a stream's queue: its bytes are in `cdnmap_watch_queued_bytes` until it is
/// taken by the connection or dropped with the queue.
struct Queued {
    msg: Option<pb::MapUpdate>,
    bytes: usize,
    queue: Arc<Queue>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        metrics::gauge!("cdnmap_watch_queued_bytes").decrement(self.bytes as f64);
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The producer's end of a stream.
struct WatchSender {
    tx: tokio::sync::mpsc::Sender<Queued>,
    queue: Arc<Queue>,
    stall: Duration,
}

impl WatchSender {
    /// Queues `msg` (counted as `kind`) once there is room.
    async fn send(&self, kind: &'static str, msg: pb::MapUpdate) -> Result<(), Ended> {
        let (msg, bytes) = counted(kind, msg);
        self.queue.waiting.fetch_add(1, Ordering::AcqRel);
        metrics::gauge!("cdnmap_watch_queued_bytes").increment(bytes as f64);
        let queued = Queued {
            msg: Some(msg),
            bytes,
            queue: Arc::clone(&self.queue),
        };
        tokio::select! {
            r = self.tx.send(queued) => r.map_err(|_| Ended::Gone),
            () = self.stalled() => Err(Ended::Stalled),
        }
    }

    /// Resolves once the stream has stalled (never while its client takes what it is sent).
    async fn stalled(&self) {
        let every = (self.stall / 4).min(STALL_CHECK_MAX);
        loop {
            tokio::time::sleep(every).await;
            let waiting = self.queue.waiting.load(Ordering::Acquire);
            if stalled(waiting, self.queue.since_taken(), self.stall) {
                return;
            }
        }
    }
}

/// A stream fed by a task (`feed`) through a queue of [`WATCH_QUEUE_MESSAGES`].
fn watch_stream<F, Fut>(stall: Duration, feed: F) -> UpdateStream
where
    F: FnOnce(WatchSender) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(WATCH_QUEUE_MESSAGES);
    let queue = Arc::new(Queue {
        started: Instant::now(),
        waiting: AtomicUsize::new(0),
        taken_ms: AtomicU64::new(0),
    });
    tokio::spawn(feed(WatchSender {
        tx,
        queue: Arc::clone(&queue),
        stall,
    }));
    let taken = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        move |mut q: Queued| {
            let ms = queue.started.elapsed().as_millis() as u64;
            queue.taken_ms.store(ms, Ordering::Release);
            q.msg
                .take()
                .ok_or_else(|| Status::internal("a WatchMap message taken twice"))
        },
    );
    Box::pin(taken)
}

/// Sends the whole map of `s`, part by part (each made when the queue has room, so a stream
/// makes one part at a time); returns the sections its first part carried.
async fn send_full(shared: &Shared, s: &Snapshot, tx: &WatchSender) -> Result<Sections, Ended> {
    let policies = shared.policies(&s.topology);
    let edge = EdgeParts::new(&policies, Some(&shared.intake.server_loads), &shared.config);
    let mut sections = Sections::default();
    for part in 0..crate::watch::full_parts(s) {
        let msg = crate::watch::full_part(&edge, s, part);
        if part == 0 {
            sections = Sections::of(&msg);
        }
        tx.send("full", msg).await?;
    }
    Ok(sections)
}

/// `msg` and its encoded bytes, counted in the WatchMap metrics by `kind` ("full": a part of
/// a whole map, "delta"): messages, map units and encoded bytes sent, so a round's delta size
/// is a metric.
fn counted(kind: &'static str, msg: pb::MapUpdate) -> (pb::MapUpdate, usize) {
    use cdnmap_proto::prost::Message;
    let bytes = msg.encoded_len();
    metrics::counter!("cdnmap_watch_messages_total", "kind" => kind).increment(1);
    metrics::counter!("cdnmap_watch_units_total", "kind" => kind)
        .increment(cdnmap_serve::watch::unit_count(&msg) as u64);
    metrics::counter!("cdnmap_watch_bytes_total", "kind" => kind).increment(bytes as u64);
    (msg, bytes)
}

fn delta_update(
    shared: &Shared,
    held: Option<&mut Sections>,
    prev: &Snapshot,
    next: &Snapshot,
) -> Option<pb::MapUpdate> {
    let policies = shared.policies(&next.topology);
    let edge = EdgeParts::new(&policies, Some(&shared.intake.server_loads), &shared.config);
    crate::watch::delta_update(&edge, held, prev, next)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Config;
    use cdnmap_mapper::{ClusterState, Limits};
    use cdnmap_topology::format::parse_instance;
    use cdnmap_topology::Topology;
    use pb::mapping_server::Mapping;

    /// Four clusters of four servers, 60 units over 10.0.x.0/24 in three classes.
    pub(crate) fn instance() -> Topology {
        let clusters: Vec<String> = (0..4)
            .map(|c| {
                let addresses: Vec<String> =
                    (1..=4).map(|a| format!("\"198.18.{c}.{a}\"")).collect();
                format!(
                    r#"{{"id": "c{c}", "lat": 0, "lon": 0, "addresses": [{}],
                      "resources": {{"name": "r", "kind": "bps", "capacity": 40,
                                     "classes": ["web", "video", "apps"]}}}}"#,
                    addresses.join(",")
                )
            })
            .collect();
        let units: Vec<String> = (0..60)
            .map(|u| {
                let class = ["web", "video", "apps"][u % 3];
                format!(
                    r#"{{"id": "u{u:02}", "class": "{class}", "demand": 2, "prefixes": ["10.0.{u}.0/24"],
                      "lat": 0, "lon": 0, "candidates": [{{"cluster": "c{}", "score": 1}},
                      {{"cluster": "c{}", "score": 2}}, {{"cluster": "c{}", "score": 3}}]}}"#,
                    u % 4,
                    (u + 1) % 4,
                    (u + 2) % 4
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [
                {{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 0}}}},
                {{"name": "video", "priority": 1, "per_unit": {{"bps": 1, "fps": 0}}}},
                {{"name": "apps", "priority": 2, "per_unit": {{"bps": 1, "fps": 0}}}}],
              "clusters": [{}], "map_units": [{}]}}"#,
            clusters.join(","),
            units.join(",")
        );
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    fn query(u: usize) -> pb::ResolveRequest {
        pb::ResolveRequest {
            client_subnet: format!("10.0.{u}.7/32"),
            resolver_ip: String::new(),
            qname: [
                "www.cdn.example.",
                "a.video.cdn.example.",
                "b.apps.cdn.example.",
            ][u % 3]
                .into(),
            qtype: 1,
        }
    }

    /// A stream has stalled when a message waits and none was taken for the limit: not while
    /// nothing waits (a front end indexing a new map takes nothing, and is sent nothing).
    #[test]
    fn a_stream_stalls_only_with_a_message_waiting_untaken_for_the_limit() {
        let s = Duration::from_secs;
        let table = [
            (0, s(3_600), false),
            (1, s(59), false),
            (1, s(60), true),
            (2, s(61), true),
        ];
        for (waiting, since, want) in table {
            assert_eq!(stalled(waiting, since, s(60)), want, "{waiting} {since:?}");
        }
    }

    /// A stream whose messages nobody takes ends after `watch_stall_secs` (its task gone, the
    /// full map it had queued still there to be taken, then the end); one that is read stays
    /// open however long nothing new comes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_stream_nobody_reads_ends_after_the_stall_bound_and_a_read_one_stays() {
        use tokio_stream::StreamExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config {
            data_dir: dir.path().join("data"),
            watch_stall_secs: 1,
            ..Config::default()
        };
        let shared = Shared::start(config, || Ok(instance())).expect("start");
        shared.run_round().await;
        let service = MappingService::new(Arc::clone(&shared));
        let open = || async {
            service
                .watch_map(Request::new(pb::WatchMapRequest::default()))
                .await
                .expect("WatchMap")
                .into_inner()
        };
        let (mut unread, mut read) = (open().await, open().await);
        let full = read.next().await.expect("a message").expect("the full map");
        assert!(full.full);
        assert_eq!(service.1.load(Ordering::Acquire), 2, "two streams open");
        tokio::time::sleep(Duration::from_millis(1_800)).await;
        assert_eq!(service.1.load(Ordering::Acquire), 1, "the unread one ended");
        let queued = unread.next().await.expect("what it had queued");
        assert!(queued.expect("the full map").full);
        let end = tokio::time::timeout(Duration::from_secs(1), unread.next()).await;
        assert!(matches!(end, Ok(None)), "then its end: {end:?}");
        let more = tokio::time::timeout(Duration::from_secs(1), read.next()).await;
        assert!(
            more.is_err(),
            "the read stream waits for the next round: {more:?}"
        );
    }

    /// Rounds publish new versions (a cluster drained or undrained before each, so answers
    /// change) while ResolveBatch runs in a loop: every batch comes from one version, and every
    /// answer is that version's, its addresses chosen by that version's selectors.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn resolve_during_publication_answers_from_one_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        let shared = Shared::start(config, || Ok(instance())).expect("start");
        shared.run_round().await;
        let publisher = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                let mut versions = std::collections::BTreeMap::new();
                for i in 0..30 {
                    let state = if i % 2 == 0 {
                        ClusterState::Drained
                    } else {
                        ClusterState::Up
                    };
                    let actor = crate::topology::Actor::new(Some("test"), None, "test");
                    shared
                        .set_cluster_state(&format!("c{}", i % 4), state, "", actor)
                        .await
                        .expect("state");
                    shared.run_round().await;
                    let p = shared.published().expect("published");
                    versions.insert(p.snapshot.version, p);
                }
                versions
            })
        };
        let service = MappingService::new(Arc::clone(&shared));
        let mut answers = Vec::new();
        while !publisher.is_finished() {
            let batch = pb::ResolveBatchRequest {
                queries: (0..60).map(query).collect(),
            };
            let got = service
                .resolve_batch(Request::new(batch))
                .await
                .expect("ResolveBatch")
                .into_inner()
                .answers;
            answers.push(got);
            tokio::task::yield_now().await;
        }
        let versions = publisher.await.expect("the publisher");
        let mut seen = std::collections::BTreeSet::new();
        for batch in &answers {
            let v = batch[0].map_version;
            seen.insert(v);
            let Some(p) = versions.get(&v) else {
                continue; // the version before the publisher's first
            };
            let s = &p.snapshot;
            for (u, a) in batch.iter().enumerate() {
                assert_eq!(a.map_version, v, "one batch, one version");
                let q = query(u);
                let client: IpNet = q.client_subnet.parse().expect("a prefix");
                let want = s.resolver.resolve(client, &q.qname);
                let ids: Vec<String> = want
                    .named()
                    .map(|c| s.topology.clusters()[c as usize].id.clone())
                    .collect();
                assert_eq!(a.cluster_ids, ids, "version {v}, query {u}");
                let (mut key, mut picked) = (String::new(), Vec::new());
                p.servers.as_ref().expect("selectors").answer(
                    &want,
                    &q.qname,
                    false,
                    &mut key,
                    &mut picked,
                );
                let picked: Vec<String> = picked.iter().map(|a| a.to_string()).collect();
                assert_eq!(a.addresses, picked, "version {v}, query {u}");
            }
        }
        assert!(
            seen.len() >= 10,
            "{} versions seen while publishing",
            seen.len()
        );
    }

    /// A mapper whose classes web and video have a last resort (a CNAME, addresses) and
    /// three of whose four clusters are down, after its first round.
    async fn mapper_with_last_resorts(dir: &std::path::Path) -> Arc<Shared> {
        let mut config = Config {
            data_dir: dir.join("data"),
            ..Config::default()
        };
        let bypass =
            |cname: Option<&str>, addresses: Option<&[&str]>| crate::config::BypassConfig {
                cname: cname.map(str::to_string),
                addresses: addresses.map(|a| a.iter().map(|a| a.to_string()).collect()),
            };
        config
            .bypass
            .insert("web".into(), bypass(Some("web.partner.test."), None));
        config.bypass.insert(
            "video".into(),
            bypass(None, Some(&["192.0.2.99", "2001:db8::99"])),
        );
        let shared = Shared::start(config, || Ok(instance())).expect("start");
        // Three clusters of four down: the units of those alone overflow or are down.
        for c in ["c0", "c1", "c2"] {
            let actor = crate::topology::Actor::new(Some("test"), None, "test");
            shared
                .set_cluster_state(c, ClusterState::Down, "", actor)
                .await
                .expect("state");
        }
        shared.run_round().await;
        shared
    }

    /// The DNS front end's copy of `service`'s map, followed over WatchMap.
    async fn front_end_view(service: &MappingService) -> cdnmap_dns::local::LocalView {
        use cdnmap_serve::watch::{Applied, Follower};
        use tokio_stream::StreamExt;
        let mut stream = service
            .watch_map(Request::new(pb::WatchMapRequest::default()))
            .await
            .expect("WatchMap")
            .into_inner();
        let mut follower = Follower::default();
        loop {
            let update = stream.next().await.expect("a message").expect("an update");
            if follower.apply(update).expect("applies") == Applied::New {
                break;
            }
        }
        cdnmap_dns::local::LocalView::build(follower.held().expect("held"), &[], None)
            .expect("view")
    }

    /// What Resolve answers when `cdnmap_serve::answer` decides `d` (addresses `addrs`) from
    /// `front`, field by field; the routes it takes go into `routes`.
    fn resolve_response_of(
        front: &cdnmap_dns::local::LocalView,
        d: &Decision<'_>,
        addrs: &[IpAddr],
        ttl_seconds: u32,
        routes: &mut std::collections::BTreeSet<String>,
    ) -> pb::ResolveResponse {
        let map = front.resolver.map();
        let mut want = pb::ResolveResponse {
            ttl_seconds,
            map_version: front.version,
            map_epoch: front.epoch,
            rcode: u32::from(d.rcode.code()),
            ..pb::ResolveResponse::default()
        };
        let Some(m) = d.mapped else {
            return want;
        };
        let a = m.answer;
        want.addresses = addrs.iter().map(|a| a.to_string()).collect();
        want.scope_prefix_len = u32::from(a.scope_prefix_len);
        if m.asks_addresses && m.bypass.is_none() {
            want.cluster_ids = a
                .named()
                .map(|c| map.clusters()[c as usize].id.clone())
                .collect();
        }
        want.map_unit = a.unit.map_or(String::new(), |u| map.unit_id(u).into());
        want.traffic_class = map.classes()[usize::from(a.class)].to_string();
        want.route = m.route.as_str().into();
        match m.bypass {
            Some(Bypass::Cname(target)) => {
                want.cname = target.clone();
                routes.insert("bypass to a CNAME".into());
            }
            Some(Bypass::Addresses(_)) if !addrs.is_empty() => {
                routes.insert("bypass to addresses".into());
            }
            _ => {}
        }
        routes.insert(want.route.clone());
        want
    }

    /// Resolve's answers are the decision the DNS front end makes: over a table of queries
    /// (names in and out of the hostname rules, A, AAAA and other types, client subnets of
    /// both families, resolver addresses alone, units mapped and unmatched, units whose every
    /// candidate is down going to their class's last resort: a CNAME or addresses), Resolve's
    /// protobuf says what `cdnmap_serve::answer` decides from the front end's own copy of the
    /// map (followed over WatchMap), field by field.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn resolve_says_what_the_front_ends_decision_says() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = mapper_with_last_resorts(dir.path()).await;
        let service = MappingService::new(Arc::clone(&shared));
        let front = front_end_view(&service).await;
        let view = front.answer_view(front.servers());
        let names = [
            "www.cdn.example.",
            "A.Video.Cdn.Example",
            "b.apps.cdn.example.",
            "nx.nowhere.test.",
        ];
        let clients: Vec<(String, String)> = (0..60)
            .step_by(7)
            .map(|u| (format!("10.0.{u}.7/32"), String::new()))
            .chain([
                ("10.0.9.0/24".into(), String::new()),
                ("192.0.2.0/24".into(), String::new()),
                ("2001:db8::/48".into(), String::new()),
                (String::new(), "10.0.4.9".into()),
                (String::new(), "2001:db8::53".into()),
            ])
            .collect();
        let (mut routes, mut rcodes) = (
            std::collections::BTreeSet::new(),
            std::collections::BTreeSet::new(),
        );
        for (subnet, resolver) in &clients {
            for name in names {
                for qtype in [1, 28, 16, 255, 252] {
                    let q = pb::ResolveRequest {
                        client_subnet: subnet.clone(),
                        resolver_ip: resolver.clone(),
                        qname: name.into(),
                        qtype,
                    };
                    let what = format!("{q:?}");
                    let got = service
                        .resolve(Request::new(q.clone()))
                        .await
                        .expect("Resolve")
                        .into_inner();
                    let client = client_of(&q, None).expect("a client");
                    let query = Query::resolve(name, qtype, client);
                    let (mut key, mut addrs) = (String::new(), Vec::new());
                    let zones = Zones::default();
                    let d = answer::decide(&zones, Some(&view), &query, &mut key, &mut addrs);
                    let want =
                        resolve_response_of(&front, &d, &addrs, got.ttl_seconds, &mut routes);
                    rcodes.insert(want.rcode);
                    assert_eq!(got, want, "{what}");
                }
            }
        }
        for route in [
            "mapped",
            "unmatched",
            "bypass",
            "bypass to a CNAME",
            "bypass to addresses",
        ] {
            assert!(routes.contains(route), "no {route} among {routes:?}");
        }
        assert_eq!(rcodes, [0, 3].into(), "NOERROR and NXDOMAIN");
    }
}
