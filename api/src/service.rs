//! The running mapper: the mapping loop, atomic map publication, and the gRPC services
//! (`cdnmap.v1.Mapping`, `Feedback`, `Admin`, plus `grpc.health.v1` and server reflection).
//!
//! Handlers are thin (house style): validate → convert → call the core → map errors to a
//! `Status`. Protobuf stops here.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use cdnmap_estimator::state::Estimates;
use cdnmap_mapper::format::{CandidateFile, ClusterFile, MapUnitFile, NestedNode, ResourcesFile};
use cdnmap_mapper::resolve::{ClassRules, MAX_QNAME_LEN};
use cdnmap_mapper::servers::Servers;
use cdnmap_mapper::{ClusterState, Instance, Limits, UnitIdx};
use cdnmap_proto::v1 as pb;
use cdnmap_proto::{MAX_BATCH_QUERIES, MAX_REPORT_SAMPLES};
use ipnet::IpNet;
use tokio::sync::broadcast;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::config::Config;
use crate::driver::{Driver, Observations, StepError, StepTimings};
use crate::round::Snapshot;
use crate::selection::{self, ServerLoads};
use crate::store::{Served, ServedRef, Store};
use crate::topology::{Applied, Change, ChangeError, Topology};

/// The most addresses one answer carries.
pub const MAX_ANSWER_ADDRESSES: usize = 8;
/// The most feedback reports kept.
pub const MAX_REPORTS: usize = 1_000_000;
/// Map updates a slow watcher may fall behind before it gets a full map instead.
const WATCH_BACKLOG: usize = 16;

/// What the last round did, for Admin.GetStatus and the logs.
#[derive(Debug, Clone, Default)]
pub struct RoundStatus {
    pub last_round_at_unix_ms: i64,
    pub failed: bool,
    pub error: String,
    pub solve_ms: f64,
}

/// Everything a query reads, published as one value: the map version and the in-cluster
/// selectors built for it. It is swapped whole, so no query sees parts of two versions.
#[derive(Debug)]
pub struct Published {
    pub snapshot: Arc<Snapshot>,
    /// `None` when building them failed (answers then name every address of their clusters).
    pub servers: Option<Servers>,
}

/// The state shared by the loop and every handler.
pub struct Shared {
    config: Config,
    /// This start's epoch (stored before anything is served): a map's identity is
    /// (epoch, version), so a version published before a crash and never stored is not
    /// mistaken for the one the next start publishes under the same number.
    epoch: u64,
    /// The topology the next round solves: one writer, read without a lock.
    topology: Topology,
    /// The published map and its selectors.
    published: ArcSwapOption<Published>,
    status: Mutex<RoundStatus>,
    store: Store,
    updates: broadcast::Sender<Arc<Snapshot>>,
    /// The round driver with the estimator (demand forecasts, learned coefficients,
    /// derating): fed by the reports, run each round, its state saved with each map.
    driver: Mutex<Driver>,
    /// What the reports brought since the last round.
    pending: Mutex<Pending>,
    /// In-cluster selection: the last reported server loads.
    server_loads: Mutex<ServerLoads>,
    /// The topology the last stored record's round started from, and its generation: the
    /// store writes the topology with a record only when it changed.
    stored_base: Mutex<(Option<Arc<Instance>>, u64)>,
    /// The dashboard's round history, action log and per-version figures.
    dash: Arc<crate::dashboard::DashState>,
    /// Turns true when the service is asked to stop: the loop ends after its round, and
    /// WatchMap streams end, so in-flight calls can finish.
    stopping: tokio::sync::watch::Sender<bool>,
}

/// Observations waiting for the next round.
#[derive(Debug, Default)]
struct Pending {
    /// Queries per map unit id.
    demand: HashMap<String, f64>,
    /// (cluster, node, load), oldest first.
    loads: std::collections::VecDeque<(String, String, f64)>,
}

/// The most pending observations kept between two rounds (beyond it the oldest loads are
/// dropped from the estimator's input; every report is still in the record).
const MAX_PENDING_LOADS: usize = 1_000_000;

pub fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Why the round failed (the last good map stays published).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoopError {
    #[error("{0} lock poisoned")]
    Poisoned(&'static str),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error("the round's task failed: {0}")]
    Task(String),
}

impl Shared {
    /// Opens the store, takes this start's epoch, and decides the starting state: the stored
    /// topology, and the served map with the estimator's state saved with it (served at once,
    /// before any round, exactly as it was published), else `initial` (stored for next time).
    /// Nothing an acknowledged Admin change did can make a start fail: the served map carries
    /// the instance it was solved with, and a selection override naming a cluster that is gone
    /// is a warning.
    pub fn start(config: Config, initial: Instance) -> anyhow::Result<Arc<Shared>> {
        let store = Store::open(&config.data_dir)?;
        let epoch = store.next_epoch()?;
        let topology = match store.topology(Limits::default())? {
            Some(stored) => stored,
            None => {
                store.put_topology(&initial)?;
                initial
            }
        };
        if let Err(e) = config.selection.check_clusters(&topology) {
            tracing::warn!(error = %e, "the selection override is not used");
        }
        let served = match store.served()? {
            Some(s) => Some(s),
            None => legacy_served(&store, &topology),
        };
        let estimates = match served
            .as_ref()
            .map(|s| Estimates::from_bytes(&s.estimates, &topology))
        {
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the estimator starts afresh");
                Estimates::new(&topology)?
            }
            None => Estimates::new(&topology)?,
        };
        let (updates, _) = broadcast::channel(WATCH_BACKLOG);
        let dash = Arc::new(crate::dashboard::DashState::default());
        let log_to = Arc::clone(&dash);
        let log: crate::topology::Log = Arc::new(move |change, result| {
            if let Change::ClusterState {
                id,
                state,
                reason,
                actor,
            } = change
            {
                log_to.log_action(actor, id, *state, reason, result, now_unix_ms());
            }
        });
        let driver = Driver::new(
            estimates,
            config.stickiness(),
            config.learning,
            cfg!(debug_assertions),
        );
        let shared = Arc::new(Shared {
            driver: Mutex::new(driver),
            pending: Mutex::new(Pending::default()),
            server_loads: Mutex::new(ServerLoads::default()),
            topology: Topology::start(store.clone(), topology, log),
            published: ArcSwapOption::empty(),
            status: Mutex::new(RoundStatus::default()),
            store,
            updates,
            config,
            epoch,
            stored_base: Mutex::new((None, 0)),
            dash,
            stopping: tokio::sync::watch::channel(false).0,
        });
        if let Some(s) = served {
            let rules = shared.rules(&s.instance)?;
            let resolver = cdnmap_mapper::resolve::Resolver::new(&s.instance, &s.map, rules)?;
            tracing::info!(
                epoch = s.epoch,
                version = s.version,
                "serving the stored map until the first round"
            );
            shared.publish(Arc::new(Snapshot {
                epoch: s.epoch,
                version: s.version,
                solved_at_unix_ms: s.solved_at_unix_ms,
                instance: s.instance,
                map: s.map,
                resolver,
                stats: Default::default(),
                churn: None,
                timings: Default::default(),
            }));
        }
        Ok(shared)
    }

    fn rules(&self, instance: &Instance) -> Result<ClassRules, cdnmap_mapper::ModelError> {
        ClassRules::new(
            instance,
            &self.config.class_rule_pairs(),
            &self.config.default_class,
        )
    }

    /// The published map version.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.published
            .load()
            .as_ref()
            .map(|p| Arc::clone(&p.snapshot))
    }

    /// The published map version with its selectors.
    pub fn published(&self) -> Option<Arc<Published>> {
        self.published.load_full()
    }

    /// This start's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Asks the loop and the WatchMap streams to end (a round in progress finishes first).
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Waits until every write acknowledged so far is on disk.
    pub fn flush(&self) -> Result<(), crate::store::StoreError> {
        self.store.flush_all()
    }

    /// The selection policy of each cluster of `instance`.
    fn policies(&self, instance: &Instance) -> Vec<cdnmap_mapper::servers::Policy> {
        self.config.selection.policies(instance)
    }

    /// Publishes `snapshot` with its in-cluster selectors (built with the last reported server
    /// loads), in one swap. A failure to build the selectors (the config's policies are
    /// validated, so only an internal error) leaves answers naming every address of their
    /// clusters, and is logged.
    fn publish(&self, snapshot: Arc<Snapshot>) {
        let instance = &snapshot.instance;
        let built = match self.server_loads.lock() {
            Ok(loads) => selection::build(instance, &self.policies(instance), &loads, &[])
                .map_err(|e| e.to_string()),
            Err(_) => Err("server load lock poisoned".to_string()),
        };
        let servers = match built {
            Ok(servers) => Some(servers),
            Err(e) => {
                tracing::error!(error = %e, "building the in-cluster selectors failed");
                None
            }
        };
        metrics::gauge!("cdnmap_map_version").set(snapshot.version as f64);
        metrics::gauge!("cdnmap_map_epoch").set(snapshot.epoch as f64);
        self.published
            .store(Some(Arc::new(Published { snapshot, servers })));
    }

    /// Runs one round now: solve (on a blocking thread), verify in debug builds, publish,
    /// persist, notify watchers. A failed round keeps the last good map and says so.
    pub async fn run_round(self: &Arc<Self>) {
        self.run_round_at(now_unix_ms()).await;
    }

    /// [`Shared::run_round`] at time `now` (the loop passes the clock; tests and replays pass a
    /// simulated one).
    pub async fn run_round_at(self: &Arc<Self>, now: i64) {
        let started = Instant::now();
        let me = Arc::clone(self);
        let result = tokio::task::spawn_blocking(move || me.solve_round(now))
            .await
            .unwrap_or_else(|e| Err(LoopError::Task(e.to_string())));
        let solve_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut status = RoundStatus {
            last_round_at_unix_ms: now,
            solve_ms,
            ..RoundStatus::default()
        };
        let cycle_ms = self.config.cycle_secs as f64 * 1e3;
        if solve_ms > cycle_ms {
            // The next round starts late (the loop never overlaps rounds); the map served until
            // then is the previous one.
            metrics::counter!("cdnmap_rounds_slow_total").increment(1);
            tracing::warn!(solve_ms, cycle_ms, "round took longer than the cycle");
            status.error = format!(
                "the last round took {solve_ms:.0} ms, longer than the {cycle_ms:.0} ms cycle"
            );
        }
        match result {
            Ok((base, snapshot, step_timings, estimates)) => {
                let snapshot = Arc::new(snapshot);
                // The round's history entry before its map: whoever sees the map sees it too.
                self.dash.record_round(&snapshot, solve_ms);
                let t = Instant::now();
                self.publish(Arc::clone(&snapshot));
                let publish_ms = t.elapsed().as_secs_f64() * 1e3;
                let t = Instant::now();
                let store = self.store.clone();
                let keep = self.config.maps_kept;
                let to_store = Arc::clone(&snapshot);
                // The base topology is written with the record only when it changed (and is
                // remembered as stored only once the write succeeded).
                let (write_base, base_generation) = match self.stored_base.lock() {
                    Ok(last) if last.0.as_ref().is_some_and(|b| Arc::ptr_eq(b, &base)) => {
                        (false, last.1)
                    }
                    Ok(last) => (true, last.1 + 1),
                    Err(_) => (true, 0),
                };
                let stored_base = Arc::clone(&base);
                let stored = tokio::task::spawn_blocking(move || {
                    store.put_served(
                        &ServedRef {
                            epoch: to_store.epoch,
                            version: to_store.version,
                            solved_at_unix_ms: to_store.solved_at_unix_ms,
                            base: &base,
                            base_generation,
                            write_base,
                            instance: &to_store.instance,
                            map: &to_store.map,
                            estimates: &estimates,
                        },
                        keep,
                    )
                })
                .await;
                match stored {
                    Ok(Ok(())) => {
                        if let (true, Ok(mut last)) = (write_base, self.stored_base.lock()) {
                            *last = (Some(stored_base), base_generation);
                        }
                        metrics::gauge!("cdnmap_map_stored_version").set(snapshot.version as f64);
                        metrics::gauge!("cdnmap_map_stored_epoch").set(snapshot.epoch as f64);
                    }
                    Ok(Err(e)) => tracing::error!(error = %e, "persisting the map failed"),
                    Err(e) => tracing::error!(error = %e, "persisting the map failed"),
                }
                let persist_ms = t.elapsed().as_secs_f64() * 1e3 + step_timings.encode_estimates_ms;
                let _ = self.updates.send(Arc::clone(&snapshot));
                let parts = [
                    ("estimator", step_timings.estimate_ms),
                    ("effective_preferences", snapshot.timings.effective_ms),
                    ("solve", snapshot.timings.solve_ms),
                    ("index", snapshot.timings.index_ms),
                    ("publish", publish_ms),
                    ("persist", persist_ms),
                ];
                for (part, ms) in parts {
                    metrics::histogram!("cdnmap_round_part_seconds", "part" => part)
                        .record(ms / 1e3);
                }
                tracing::info!(
                    estimator_ms = step_timings.estimate_ms,
                    effective_ms = snapshot.timings.effective_ms,
                    solve_ms = snapshot.timings.solve_ms,
                    index_ms = snapshot.timings.index_ms,
                    publish_ms,
                    persist_ms,
                    "round parts"
                );
                self.round_metrics(&snapshot, solve_ms);
            }
            Err(e) => {
                metrics::counter!("cdnmap_rounds_failed_total").increment(1);
                tracing::error!(error = %e, "round failed; serving the last good map");
                status.failed = true;
                status.error = e.to_string();
            }
        }
        if let Ok(mut s) = self.status.lock() {
            *s = status;
        }
    }

    /// The round itself, on a blocking thread: the observations since the last round through
    /// the round driver (the same step `cdnmap replay` runs). Returns the new snapshot, the
    /// driver's timings and the estimator's state to save with it.
    #[allow(clippy::type_complexity)]
    fn solve_round(
        &self,
        now: i64,
    ) -> Result<(Arc<Instance>, Snapshot, StepTimings, Vec<u8>), LoopError> {
        let base = self.topology.current();
        let previous = self.current();
        let pending = std::mem::take(
            &mut *self
                .pending
                .lock()
                .map_err(|_| LoopError::Poisoned("pending"))?,
        );
        let observations = Observations {
            // The reports since the last round describe the period that began with it.
            at_unix_ms: previous.as_ref().map_or(now, |p| p.solved_at_unix_ms),
            demand: pending.demand,
            loads: pending.loads.into_iter().collect(),
        };
        let mut driver = self
            .driver
            .lock()
            .map_err(|_| LoopError::Poisoned("round driver"))?;
        let step = driver.step(
            &base,
            previous.as_deref(),
            &observations,
            |instance| self.rules(instance),
            self.epoch,
            now,
        )?;
        let t = Instant::now();
        let estimates = driver.estimates().to_bytes();
        let mut timings = step.timings;
        timings.encode_estimates_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok((base, step.snapshot, timings, estimates))
    }

    fn round_metrics(&self, snapshot: &Snapshot, solve_ms: f64) {
        metrics::counter!("cdnmap_rounds_total").increment(1);
        metrics::histogram!("cdnmap_solve_seconds").record(solve_ms / 1e3);
        metrics::gauge!("cdnmap_churn").set(snapshot.churn.unwrap_or(0.0));
        metrics::counter!("cdnmap_proposals_total").increment(snapshot.stats.proposals);
        let demand = snapshot.instance.total_demand();
        metrics::gauge!("cdnmap_demand_total").set(demand);
        let overflow = snapshot.map.total_overflow();
        metrics::gauge!("cdnmap_overflow_share").set(if demand > 0.0 {
            overflow / demand
        } else {
            0.0
        });
        let utilization = crate::round::utilization(&snapshot.instance, &snapshot.map);
        for (c, u) in snapshot.instance.clusters().iter().zip(utilization) {
            metrics::gauge!("cdnmap_cluster_utilization", "cluster" => c.id.clone()).set(u);
        }
        tracing::info!(
            epoch = snapshot.epoch,
            version = snapshot.version,
            solve_ms,
            churn = snapshot.churn.unwrap_or(0.0),
            overflow,
            "round published"
        );
    }

    /// The mapping loop: a round every `cycle_secs`, until [`Shared::stop`].
    pub async fn run_loop(self: Arc<Self>) {
        let mut stop = self.stopping.subscribe();
        let mut tick = tokio::time::interval(Duration::from_secs(self.config.cycle_secs));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if self.current().is_some() {
            tick.tick().await; // a restored map is served until the first full cycle has passed
        }
        while !*stop.borrow() {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            // A round in progress finishes (and persists) before the loop looks at `stop`.
            self.run_round().await;
        }
    }
}

/// The newest map of a store written before the served record existed, read against the
/// stored topology; when an edit since makes it unreadable, the start goes on without it
/// (the first round is then a cold one).
fn legacy_served(store: &Store, topology: &Instance) -> Option<Served> {
    match store.latest_map(topology) {
        Ok(Some((meta, map))) => Some(Served {
            epoch: 0,
            version: meta.version,
            solved_at_unix_ms: meta.solved_at_unix_ms,
            instance: topology.clone(),
            map,
            estimates: Vec::new(),
        }),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "the stored map is not served; the first round starts cold");
            None
        }
    }
}

impl Shared {
    /// Sets cluster `id`'s state through the topology writer (stored, then published: the next
    /// round maps with it) and logs the action with `actor`: the one code path of Admin
    /// `SetClusterState` and the dashboard's actions.
    pub async fn set_cluster_state(
        &self,
        id: &str,
        state: ClusterState,
        reason: &str,
        actor: crate::dashboard::Actor,
    ) -> Result<Applied, ChangeError> {
        let (who, via) = (actor.who.clone(), actor.via);
        let applied = self
            .topology
            .change(Change::ClusterState {
                id: id.to_string(),
                state,
                reason: reason.to_string(),
                actor,
            })
            .await?;
        tracing::warn!(cluster = %id, before = ?applied.before, ?state, reason = %reason, who = %who, via, "cluster state set");
        Ok(applied)
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn round_status(&self) -> RoundStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The topology the next round solves (with every Admin change so far).
    pub(crate) fn topology_now(&self) -> Arc<Instance> {
        self.topology.current()
    }

    pub(crate) fn dash(&self) -> &crate::dashboard::DashState {
        &self.dash
    }

    /// Reads the estimator's state (the dashboard shows its coefficients and deratings).
    pub(crate) fn with_estimates<R>(&self, f: impl FnOnce(&Estimates) -> R) -> Option<R> {
        self.driver.lock().ok().map(|d| f(d.estimates()))
    }
}

// ---------------------------------------------------------------------------------------------
// Mapping

/// The `Mapping` service.
pub struct MappingService(pub Arc<Shared>);

fn invalid(what: impl std::fmt::Display) -> Status {
    Status::invalid_argument(what.to_string())
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
        let answer = p.snapshot.resolver.resolve(client, &q.qname);
        Ok(self.to_pb(&p, q.qtype, &answer, &q.qname))
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
        let s = &p.snapshot;
        let pairs: Vec<(IpNet, &str)> = clients
            .iter()
            .zip(&batch.queries)
            .map(|(&c, q)| (c, q.qname.as_str()))
            .collect();
        let mut answers = Vec::with_capacity(pairs.len());
        s.resolver.resolve_batch(&pairs, &mut answers);
        let out = answers
            .iter()
            .zip(&batch.queries)
            .map(|(a, q)| self.to_pb(&p, q.qtype, a, &q.qname))
            .collect();
        Ok(pb::ResolveBatchResponse { answers: out })
    }

    /// The published map and its selectors, read once per call: every answer of a call comes
    /// from one version.
    fn published(&self) -> Result<Arc<Published>, Status> {
        self.0
            .published()
            .ok_or_else(|| Status::unavailable("no map yet: the first round has not finished"))
    }

    fn to_pb(
        &self,
        p: &Published,
        qtype: u32,
        answer: &cdnmap_mapper::resolve::Answer,
        qname: &str,
    ) -> pb::ResolveResponse {
        let s = &p.snapshot;
        let clusters = s.instance.clusters();
        let want_v6 = qtype == 28;
        let mut addresses = Vec::new();
        let mut cluster_ids = Vec::new();
        if qtype == 1 || want_v6 {
            match &p.servers {
                // The selectors' servers for the hostname.
                Some(servers) => {
                    let (mut key, mut picked) = (String::new(), Vec::new());
                    servers.answer(answer, qname, want_v6, &mut key, &mut picked);
                    addresses.extend(picked.iter().map(|a| a.to_string()));
                }
                // No selectors for this version: every address of both clusters.
                None => {
                    for c in [answer.primary, answer.secondary].into_iter().flatten() {
                        addresses.extend(
                            clusters[c as usize]
                                .addresses
                                .iter()
                                .filter(|a| a.is_ipv6() == want_v6)
                                .map(|a| a.to_string()),
                        );
                    }
                }
            }
            for c in [answer.primary, answer.secondary].into_iter().flatten() {
                cluster_ids.push(clusters[c as usize].id.clone());
            }
        }
        addresses.truncate(MAX_ANSWER_ADDRESSES);
        pb::ResolveResponse {
            addresses,
            ttl_seconds: self.0.config.ttl_secs,
            scope_prefix_len: u32::from(answer.scope_prefix_len),
            cluster_ids,
            map_version: s.version,
            map_epoch: s.epoch,
            map_unit: answer
                .unit
                .map_or(String::new(), |u| s.instance.unit_id(u).to_string()),
            traffic_class: s.instance.classes()[usize::from(answer.class)].name.clone(),
        }
    }
}

/// Counts an RPC by method and outcome, and times it.
fn record_rpc<T>(method: &'static str, started: Instant, result: &Result<T, Status>) {
    let code = match result {
        Ok(_) => "ok",
        Err(s) if s.code() == tonic::Code::InvalidArgument => "invalid_argument",
        Err(s) if s.code() == tonic::Code::Unavailable => "unavailable",
        Err(_) => "error",
    };
    metrics::counter!("cdnmap_rpc_total", "method" => method, "code" => code).increment(1);
    metrics::histogram!("cdnmap_rpc_seconds", "method" => method)
        .record(started.elapsed().as_secs_f64());
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<pb::MapUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl pb::mapping_server::Mapping for MappingService {
    async fn resolve(
        &self,
        request: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::ResolveResponse>, Status> {
        let started = Instant::now();
        let result = self.resolve_one(request.into_inner());
        record_rpc("Resolve", started, &result);
        result.map(Response::new)
    }

    async fn resolve_batch(
        &self,
        request: Request<pb::ResolveBatchRequest>,
    ) -> Result<Response<pb::ResolveBatchResponse>, Status> {
        let started = Instant::now();
        let result = self.resolve_many(request.into_inner());
        record_rpc("ResolveBatch", started, &result);
        result.map(Response::new)
    }

    type WatchMapStream = UpdateStream;

    async fn watch_map(
        &self,
        request: Request<pb::WatchMapRequest>,
    ) -> Result<Response<Self::WatchMapStream>, Status> {
        let r = request.into_inner();
        let known = (r.known_epoch, r.known_version);
        let shared = Arc::clone(&self.0);
        let mut rx = shared.updates.subscribe();
        let mut stop = shared.stopping.subscribe();
        let first = shared.current();
        let stream = async_stream(move |tx| async move {
            let mut last: Option<Arc<Snapshot>> = None;
            if let Some(s) = first {
                if (s.epoch, s.version) != known
                    && tx.send(Ok(full_update(&shared, &s))).await.is_err()
                {
                    return;
                }
                last = Some(s);
            }
            loop {
                let received = tokio::select! {
                    r = rx.recv() => r,
                    _ = stop.wait_for(|&s| s) => return,
                };
                let next = match received {
                    Ok(s) => s,
                    Err(broadcast::error::RecvError::Lagged(_)) => match shared.current() {
                        Some(s) => {
                            // Fell behind: start again from a full map.
                            if tx.send(Ok(full_update(&shared, &s))).await.is_err() {
                                return;
                            }
                            last = Some(s);
                            continue;
                        }
                        None => continue,
                    },
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let update = match &last {
                    Some(prev) if prev.version + 1 == next.version => {
                        delta_update(&shared, prev, &next)
                    }
                    _ => full_update(&shared, &next),
                };
                if tx.send(Ok(update)).await.is_err() {
                    return;
                }
                last = Some(next);
            }
        });
        Ok(Response::new(stream))
    }
}

/// A stream fed by a task through a bounded channel.
fn async_stream<F, Fut>(f: F) -> UpdateStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<pb::MapUpdate, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The edge settings a WatchMap message carries besides the snapshot.
fn edge_of<'a>(
    shared: &'a Shared,
    s: &Snapshot,
    loads: Option<&'a ServerLoads>,
) -> (
    Vec<cdnmap_mapper::servers::Policy>,
    Option<&'a ServerLoads>,
    &'a Config,
) {
    (shared.policies(&s.instance), loads, &shared.config)
}

fn full_update(shared: &Shared, s: &Snapshot) -> pb::MapUpdate {
    let loads = shared.server_loads.lock().ok();
    let (policies, loads, config) = edge_of(shared, s, loads.as_deref());
    crate::watch::full_update(&crate::watch::Edge::new(&policies, loads, config), s)
}

fn delta_update(shared: &Shared, prev: &Snapshot, next: &Snapshot) -> pb::MapUpdate {
    let loads = shared.server_loads.lock().ok();
    let (policies, loads, config) = edge_of(shared, next, loads.as_deref());
    crate::watch::delta_update(
        &crate::watch::Edge::new(&policies, loads, config),
        prev,
        next,
    )
}

// ---------------------------------------------------------------------------------------------
// Feedback

/// The `Feedback` service: validated reports go to the demand record (durable before the ack).
pub struct FeedbackService(pub Arc<Shared>);

#[derive(serde::Serialize)]
struct StoredReport<'a> {
    kind: &'a str,
    reporter: &'a str,
    body: serde_json::Value,
}

impl FeedbackService {
    async fn store(
        &self,
        kind: &str,
        reporter: &str,
        body: serde_json::Value,
    ) -> Result<(), Status> {
        let bytes = serde_json::to_vec(&StoredReport {
            kind,
            reporter,
            body,
        })
        .map_err(|e| Status::internal(e.to_string()))?;
        let shared = Arc::clone(&self.0);
        let retain_ms = shared.config.record_retention_hours as i64 * 3_600_000;
        tokio::task::spawn_blocking(move || {
            shared
                .store
                .append_report(now_unix_ms(), &bytes, retain_ms, MAX_REPORTS)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::feedback_server::Feedback for FeedbackService {
    async fn report_demand(
        &self,
        request: Request<pb::DemandReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let r = request.into_inner();
        if r.samples.len() > MAX_REPORT_SAMPLES {
            return Err(invalid(format!(
                "samples: {} in one report, more than {MAX_REPORT_SAMPLES}",
                r.samples.len()
            )));
        }
        if r.period_end_unix_ms < r.period_start_unix_ms {
            return Err(invalid("period_end_unix_ms: before period_start_unix_ms"));
        }
        let topology = self.0.topology.current();
        let snapshot = self.0.current();
        let mut samples = Vec::with_capacity(r.samples.len());
        let mut observed: Vec<(String, f64)> = Vec::with_capacity(r.samples.len());
        for (i, s) in r.samples.iter().enumerate() {
            let class = topology.class_index(&s.traffic_class);
            if !(s.queries.is_finite() && s.queries >= 0.0) {
                return Err(invalid(format!(
                    "samples[{i}].queries: {} is not a count >= 0",
                    s.queries
                )));
            }
            let target = match &s.target {
                Some(pb::demand_sample::Target::MapUnit(u)) if !u.is_empty() => {
                    let unit = topology.unit_index(u).ok_or_else(|| {
                        invalid(format!("samples[{i}].map_unit: no map unit {u:?}"))
                    })?;
                    let own = topology.unit_class(unit);
                    if !s.traffic_class.is_empty() && class != Some(own) {
                        return Err(invalid(format!(
                            "samples[{i}].traffic_class: {:?} is not the class of map unit {u:?} ({:?})",
                            s.traffic_class,
                            topology.classes()[usize::from(own)].name
                        )));
                    }
                    observed.push((u.clone(), s.queries));
                    serde_json::json!({"map_unit": u})
                }
                Some(pb::demand_sample::Target::Prefix(p)) => {
                    if class.is_none() {
                        return Err(invalid(format!(
                            "samples[{i}].traffic_class: {:?} is not a traffic class (a prefix sample needs one)",
                            s.traffic_class
                        )));
                    }
                    let p: IpNet = p.parse().map_err(|_| {
                        invalid(format!("samples[{i}].prefix: {p:?} is not an IP prefix"))
                    })?;
                    // For the estimator: the map unit of that prefix and class, if the map has one
                    // (the sample is in the record either way).
                    if let (Some(snap), Some(k)) = (&snapshot, class) {
                        if let Some((u, _)) = snap.resolver.unit_for(p.network(), k) {
                            observed.push((snap.instance.unit_id(u).to_string(), s.queries));
                        }
                    }
                    serde_json::json!({"prefix": p.trunc().to_string()})
                }
                _ => {
                    return Err(invalid(format!(
                        "samples[{i}]: needs a map_unit or a prefix"
                    )))
                }
            };
            samples.push(serde_json::json!({
                "target": target, "class": s.traffic_class, "queries": s.queries
            }));
        }
        let n = samples.len() as u64;
        let body = serde_json::json!({
            "period_start_unix_ms": r.period_start_unix_ms,
            "period_end_unix_ms": r.period_end_unix_ms,
            "samples": samples,
        });
        self.store("demand", &r.reporter, body).await?;
        if let Ok(mut pending) = self.0.pending.lock() {
            for (unit, q) in observed {
                *pending.demand.entry(unit).or_insert(0.0) += q;
            }
        }
        Ok(Response::new(pb::ReportAck { accepted: n }))
    }

    async fn report_load(
        &self,
        request: Request<pb::LoadReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let r = request.into_inner();
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
                invalid(format!("loads[{i}].cluster: no cluster {:?}", l.cluster))
            })?;
            let nodes = &topology.clusters()[cluster as usize].nodes;
            if !nodes.iter().any(|n| n.name == l.node) {
                return Err(invalid(format!(
                    "loads[{i}].node: cluster {:?} has no resource node {:?}",
                    l.cluster, l.node
                )));
            }
            if !(l.load.is_finite() && l.load >= 0.0) {
                return Err(invalid(format!(
                    "loads[{i}].load: {} is not a load >= 0",
                    l.load
                )));
            }
        }
        let mut servers = Vec::with_capacity(r.servers.len());
        for (i, l) in r.servers.iter().enumerate() {
            let cluster = topology.cluster_index(&l.cluster).ok_or_else(|| {
                invalid(format!("servers[{i}].cluster: no cluster {:?}", l.cluster))
            })?;
            let address: IpAddr = l.address.parse().map_err(|_| {
                invalid(format!(
                    "servers[{i}].address: {:?} is not an IP address",
                    l.address
                ))
            })?;
            if !topology.clusters()[cluster as usize]
                .addresses
                .contains(&address)
            {
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
        let mut body = serde_json::json!({
            "measured_at_unix_ms": r.measured_at_unix_ms,
            "loads": r.loads.iter().map(|l| serde_json::json!({
                "cluster": l.cluster, "node": l.node, "load": l.load
            })).collect::<Vec<_>>(),
        });
        if !servers.is_empty() {
            body["servers"] = servers
                .iter()
                .map(|(c, a, l)| serde_json::json!({"cluster": c, "address": a, "load": l}))
                .collect();
        }
        self.store("load", &r.reporter, body).await?;
        if let Ok(mut table) = self.0.server_loads.lock() {
            for &(cluster, address, load) in &servers {
                if !table.set(cluster, address, load) {
                    tracing::warn!(cluster, %address, "server load table full; report dropped");
                }
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
}

// ---------------------------------------------------------------------------------------------
// Admin

/// Checks `authorization: Bearer <token>` on every Admin call.
#[derive(Clone)]
pub struct AdminAuth(pub Option<Arc<str>>);

impl tonic::service::Interceptor for AdminAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else {
            return Err(Status::unauthenticated(
                "Admin is disabled: the server has no admin_token configured",
            ));
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated("wrong admin token")),
            None => Err(Status::unauthenticated(
                "Admin calls need \"authorization: Bearer <token>\"",
            )),
        }
    }
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `Admin` service.
pub struct AdminService(pub Arc<Shared>);

fn cluster_pb(inst: &Instance, c: usize) -> pb::Cluster {
    let cl = &inst.clusters()[c];
    fn node(inst: &Instance, cl: &cdnmap_mapper::Cluster, i: u32) -> pb::ResourceNode {
        let n = &cl.nodes[i as usize];
        pb::ResourceNode {
            name: n.name.clone(),
            kind: match n.kind {
                cdnmap_mapper::ResourceKind::Bps => "bps".into(),
                cdnmap_mapper::ResourceKind::Fps => "fps".into(),
            },
            capacity: n.capacity,
            classes: n
                .classes
                .iter()
                .map(|&k| inst.classes()[usize::from(k)].name.clone())
                .collect(),
            children: n.children.iter().map(|&ch| node(inst, cl, ch)).collect(),
        }
    }
    pb::Cluster {
        id: cl.id.clone(),
        lat: cl.lat,
        lon: cl.lon,
        addresses: cl.addresses.iter().map(|a| a.to_string()).collect(),
        state: crate::watch::state_pb(cl.state) as i32,
        resources: Some(node(inst, cl, 0)),
    }
}

fn unit_admin_pb(inst: &Instance, u: UnitIdx) -> pb::MapUnit {
    let (lat, lon) = inst.unit_location(u);
    pb::MapUnit {
        id: inst.unit_id(u).to_string(),
        traffic_class: inst.classes()[usize::from(inst.unit_class(u))].name.clone(),
        demand: inst.unit_demand(u),
        prefixes: inst
            .unit_prefixes(u)
            .iter()
            .map(|p| p.to_string())
            .collect(),
        lat,
        lon,
        candidates: inst
            .candidates(u)
            .map(|c| pb::Candidate {
                cluster: inst.clusters()[c.cluster as usize].id.clone(),
                score: f64::from(c.score),
                cluster_rank: c.explicit_rank.then_some(f64::from(c.rank)),
            })
            .collect(),
    }
}

fn parse_list<T: std::str::FromStr>(items: &[String], field: &str) -> Result<Vec<T>, Status> {
    items
        .iter()
        .enumerate()
        .map(|(i, a)| {
            a.parse()
                .map_err(|_| invalid(format!("{field}[{i}]: {a:?} is not valid")))
        })
        .collect()
}

fn node_from_pb(n: pb::ResourceNode, path: &str) -> Result<NestedNode, Status> {
    let kind = match n.kind.as_str() {
        "bps" => cdnmap_mapper::ResourceKind::Bps,
        "fps" => cdnmap_mapper::ResourceKind::Fps,
        other => {
            return Err(invalid(format!(
                "{path}.kind: {other:?} is not \"bps\" or \"fps\""
            )))
        }
    };
    let children = n
        .children
        .into_iter()
        .enumerate()
        .map(|(i, c)| node_from_pb(c, &format!("{path}.children[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(NestedNode {
        name: n.name,
        kind,
        capacity: n.capacity,
        classes: n.classes,
        children,
    })
}

fn cluster_from_pb(c: pb::Cluster) -> Result<ClusterFile, Status> {
    // A cluster upserted without a state is up.
    let state = match (c.state, crate::watch::state_from_pb(c.state)) {
        (_, Some(s)) => s,
        (0, None) => ClusterState::Up,
        (_, None) => {
            return Err(invalid(format!(
                "state: {} is not a cluster state",
                c.state
            )))
        }
    };
    let root = c
        .resources
        .ok_or_else(|| invalid("resources: a cluster needs a resource tree"))?;
    Ok(ClusterFile {
        id: c.id,
        lat: c.lat,
        lon: c.lon,
        addresses: parse_list(&c.addresses, "addresses")?,
        state,
        classes: None,
        resources: ResourcesFile::Nested(node_from_pb(root, "resources")?),
    })
}

fn unit_from_pb(u: pb::MapUnit) -> Result<MapUnitFile, Status> {
    Ok(MapUnitFile {
        id: u.id,
        class: u.traffic_class,
        demand: u.demand,
        prefixes: parse_list(&u.prefixes, "prefixes")?,
        lat: u.lat,
        lon: u.lon,
        candidates: u
            .candidates
            .into_iter()
            .map(|c| CandidateFile {
                cluster: c.cluster,
                score: c.score,
                cluster_rank: c.cluster_rank,
            })
            .collect(),
    })
}

/// A page of ids after `after` (exclusive), at most `size` (0: 100; at most 1,000).
fn page<'a>(ids: impl Iterator<Item = &'a str>, after: &str, size: u32) -> (Vec<&'a str>, String) {
    let size = match size {
        0 => 100,
        n => n.min(1_000),
    } as usize;
    let mut out: Vec<&str> = ids
        .filter(|id| after.is_empty() || *id > after)
        .take(size + 1)
        .collect();
    let next = if out.len() > size {
        out.truncate(size);
        out.last().map_or(String::new(), |s| s.to_string())
    } else {
        String::new()
    };
    (out, next)
}

impl AdminService {
    /// Carries out `change` through the topology writer: applied, validated like an instance
    /// file, stored, published (the next round solves it), then answered. What the operator
    /// should know (candidates dropped, a traffic class left with no up cluster) travels in
    /// the answer's `cdnmap-warnings` metadata, one warning per entry.
    async fn change(&self, change: Change) -> Result<Applied, Status> {
        let applied = self
            .0
            .topology
            .change(change)
            .await
            .map_err(change_status)?;
        if applied.changed {
            tracing::warn!(warnings = ?applied.warnings, "topology changed by Admin");
        }
        Ok(applied)
    }

    fn topology(&self) -> Arc<Instance> {
        self.0.topology.current()
    }
}

/// The status of a change the topology writer did not carry out.
fn change_status(e: ChangeError) -> Status {
    match e {
        ChangeError::NoCluster(_) => Status::not_found(e.to_string()),
        ChangeError::Refused(_) => invalid(e.to_string()),
        ChangeError::Store(_) | ChangeError::Stopped => Status::unavailable(e.to_string()),
    }
}

/// `body` as an answer carrying `warnings` in its metadata.
fn with_warnings<T>(body: T, warnings: &[String]) -> Response<T> {
    let mut response = Response::new(body);
    for w in warnings {
        // Metadata values are visible ASCII; a warning is the server's own text, but a cluster
        // or class id in it may not be.
        let ascii: String = w
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(ascii.as_str()) {
            response.metadata_mut().append("cdnmap-warnings", v);
        }
    }
    response
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn get_cluster(
        &self,
        request: Request<pb::GetClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let id = request.into_inner().id;
        let inst = self.topology();
        let c = inst
            .cluster_index(&id)
            .ok_or_else(|| Status::not_found(format!("no cluster {id:?}")))?;
        Ok(Response::new(cluster_pb(&inst, c as usize)))
    }

    async fn list_clusters(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
        let r = request.into_inner();
        let inst = self.topology();
        let (ids, next) = page(
            inst.clusters().iter().map(|c| c.id.as_str()),
            &r.after_id,
            r.page_size,
        );
        let clusters = ids
            .iter()
            .filter_map(|id| inst.cluster_index(id))
            .map(|c| cluster_pb(&inst, c as usize))
            .collect();
        Ok(Response::new(pb::ListClustersResponse {
            clusters,
            next_after_id: next,
        }))
    }

    async fn upsert_cluster(
        &self,
        request: Request<pb::Cluster>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let file = cluster_from_pb(request.into_inner())?;
        let id = file.id.clone();
        let applied = self.change(Change::UpsertCluster(file)).await?;
        let c = applied.topology.cluster_index(&id).unwrap_or_default();
        Ok(with_warnings(
            cluster_pb(&applied.topology, c as usize),
            &applied.warnings,
        ))
    }

    async fn delete_cluster(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let id = request.into_inner().id;
        let applied = self.change(Change::DeleteCluster(id)).await?;
        Ok(with_warnings(
            pb::DeleteResponse {
                deleted: applied.changed,
            },
            &applied.warnings,
        ))
    }

    async fn get_map_unit(
        &self,
        request: Request<pb::GetMapUnitRequest>,
    ) -> Result<Response<pb::MapUnit>, Status> {
        let id = request.into_inner().id;
        let inst = self.topology();
        let u = inst
            .unit_index(&id)
            .ok_or_else(|| Status::not_found(format!("no map unit {id:?}")))?;
        Ok(Response::new(unit_admin_pb(&inst, u)))
    }

    async fn list_map_units(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListMapUnitsResponse>, Status> {
        let r = request.into_inner();
        let inst = self.topology();
        let ids = (0..inst.unit_count() as UnitIdx).map(|u| inst.unit_id(u));
        let (ids, next) = page(ids, &r.after_id, r.page_size);
        let map_units = ids
            .iter()
            .filter_map(|id| inst.unit_index(id))
            .map(|u| unit_admin_pb(&inst, u))
            .collect();
        Ok(Response::new(pb::ListMapUnitsResponse {
            map_units,
            next_after_id: next,
        }))
    }

    async fn upsert_map_unit(
        &self,
        request: Request<pb::MapUnit>,
    ) -> Result<Response<pb::MapUnit>, Status> {
        let file = unit_from_pb(request.into_inner())?;
        let id = file.id.clone();
        let applied = self.change(Change::UpsertMapUnit(file)).await?;
        let u = applied.topology.unit_index(&id).unwrap_or_default();
        Ok(with_warnings(
            unit_admin_pb(&applied.topology, u),
            &applied.warnings,
        ))
    }

    async fn delete_map_unit(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let id = request.into_inner().id;
        let applied = self.change(Change::DeleteMapUnit(id)).await?;
        Ok(with_warnings(
            pb::DeleteResponse {
                deleted: applied.changed,
            },
            &applied.warnings,
        ))
    }

    async fn set_cluster_state(
        &self,
        request: Request<pb::SetClusterStateRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let actor = crate::dashboard::Actor::of_grpc(&request);
        let r = request.into_inner();
        let state = crate::watch::state_from_pb(r.state)
            .ok_or_else(|| invalid(format!("state: {} is not UP, DRAINED or DOWN", r.state)))?;
        let applied = self
            .0
            .set_cluster_state(&r.id, state, &r.reason, actor)
            .await
            .map_err(change_status)?;
        let c = applied.topology.cluster_index(&r.id).unwrap_or_default();
        Ok(with_warnings(
            cluster_pb(&applied.topology, c as usize),
            &applied.warnings,
        ))
    }

    async fn get_status(
        &self,
        _: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::Status>, Status> {
        let s = self.0.current();
        let status = self.0.status.lock().map(|s| s.clone()).unwrap_or_default();
        let inst = self.topology();
        let overflow_share = s.as_ref().map_or(0.0, |s| {
            let d = s.instance.total_demand();
            if d > 0.0 {
                s.map.total_overflow() / d
            } else {
                0.0
            }
        });
        Ok(Response::new(pb::Status {
            map_version: s.as_ref().map_or(0, |s| s.version),
            map_epoch: s.as_ref().map_or(0, |s| s.epoch),
            unserved_classes: crate::topology::unserved_classes(&inst),
            map_solved_at_unix_ms: s.as_ref().map_or(0, |s| s.solved_at_unix_ms),
            last_round_at_unix_ms: status.last_round_at_unix_ms,
            last_round_failed: status.failed,
            last_round_error: status.error,
            last_solve_ms: status.solve_ms,
            churn: s.as_ref().and_then(|s| s.churn).unwrap_or(0.0),
            overflow_share,
            map_units: inst.unit_count() as u64,
            clusters: inst.clusters().len() as u64,
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// Serving

/// `GET /record?from_ms=&to_ms=`: the demand record of a period.
#[derive(Debug, serde::Deserialize)]
pub struct RecordQuery {
    pub from_ms: i64,
    pub to_ms: i64,
}

/// The most reports one `/record` request returns (ask for a shorter period beyond it).
pub const MAX_RECORD_REPORTS: usize = 1_000_000;

/// The stored reports of `[from_ms, to_ms)` as JSON Lines, `{"at_unix_ms": T, "report": {...}}`
/// each (`cdnmap record export` turns them into a trace).
async fn record(shared: &Arc<Shared>, q: &RecordQuery) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    if q.to_ms < q.from_ms {
        return (StatusCode::BAD_REQUEST, "to_ms is before from_ms\n").into_response();
    }
    let (from, to) = (q.from_ms, q.to_ms);
    let store = shared.store.clone();
    let reports = tokio::task::spawn_blocking(move || store.reports(from, to)).await;
    let reports = match reports {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    };
    if reports.len() > MAX_RECORD_REPORTS {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} reports in that period, more than {MAX_RECORD_REPORTS}: ask for a shorter one\n",
                reports.len()
            ),
        )
            .into_response();
    }
    let mut body = String::new();
    for (at, bytes) in reports {
        let report = String::from_utf8_lossy(&bytes);
        body.push_str(&format!("{{\"at_unix_ms\":{at},\"report\":{report}}}\n"));
    }
    ([("content-type", "application/x-ndjson")], body).into_response()
}

/// Runs the mapper until `shutdown` resolves: the mapping loop, gRPC on `grpc_listen`
/// (Mapping, Feedback, Admin, health, reflection) and `/metrics` on `http_listen`.
pub async fn serve(
    config: Config,
    initial: Instance,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let grpc_addr: SocketAddr = config.grpc_listen;
    let http_addr: SocketAddr = config.http_listen;
    let token: Option<Arc<str>> = config.admin_token.as_deref().map(Arc::from);
    let shared = Shared::start(config, initial)?;
    if shared.current().is_none() {
        shared.run_round().await; // the first map before the first query
    }
    let loop_task = tokio::spawn(Arc::clone(&shared).run_loop());

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::mapping_server::MappingServer<MappingService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cdnmap_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;

    let record_shared = Arc::clone(&shared);
    let dashboard = crate::dashboard::router(Arc::clone(&shared), token.clone());
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let p = prometheus.clone();
                async move { p.render() }
            }),
        )
        .route(
            "/record",
            axum::routing::get(move |q: axum::extract::Query<RecordQuery>| {
                let shared = Arc::clone(&record_shared);
                async move { record(&shared, &q).await }
            }),
        )
        .merge(dashboard);
    let http = tokio::net::TcpListener::bind(http_addr).await?;
    let mut http_stop = shared.stopping.subscribe();
    let http_task = tokio::spawn(async move {
        axum::serve(
            http,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = http_stop.wait_for(|&s| s).await;
        })
        .await
    });
    tracing::info!(
        grpc = %grpc_addr,
        http = %http_addr,
        "cdnmap serving: try `grpcurl -plaintext -d '{{\"resolver_ip\": \"1.0.0.1\", \"qname\": \"www.cdn.example.\", \"qtype\": 1}}' {grpc_addr} cdnmap.v1.Mapping/Resolve`"
    );
    let stopper = Arc::clone(&shared);
    let grpc = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(pb::mapping_server::MappingServer::new(MappingService(
            Arc::clone(&shared),
        )))
        .add_service(pb::feedback_server::FeedbackServer::new(FeedbackService(
            Arc::clone(&shared),
        )))
        .add_service(pb::admin_server::AdminServer::with_interceptor(
            AdminService(Arc::clone(&shared)),
            AdminAuth(token),
        ))
        .serve_with_shutdown(grpc_addr, async move {
            shutdown.await;
            tracing::info!("stopping: finishing the calls in flight and the round in progress");
            stopper.stop();
        });
    // Calls in flight get SHUTDOWN_GRACE to finish (tonic's and axum's graceful shutdowns wait
    // for every connection, which a client that never closes would hold forever); the round in
    // progress always finishes and is stored, then the store is flushed.
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
    shared.flush()?;
    tracing::info!("stopped; the store is flushed");
    Ok(())
}

/// How long calls in flight may take to finish once the service is asked to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::format::parse_instance;
    use pb::mapping_server::Mapping;

    /// Four clusters of four servers, 60 units over 10.0.x.0/24 in three classes.
    fn instance() -> Instance {
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
        let shared = Shared::start(config, instance()).expect("start");
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
                    let actor = crate::dashboard::Actor::new(Some("test"), None, "test");
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
        let service = MappingService(Arc::clone(&shared));
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
                let ids: Vec<String> = [want.primary, want.secondary]
                    .into_iter()
                    .flatten()
                    .map(|c| s.instance.clusters()[c as usize].id.clone())
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
}
