//! The running mapper: its start (the stored topology and map served at once, the estimator
//! restored beside them), the mapping loop (a round per cycle through the engine's driver,
//! stored, then published in one swap), and [`Shared`], the state the loop and every
//! handler share, in parts with one writer each: [`ReadSide`] (what readers see, published
//! by the loop), [`RoundState`] (the loop's own) and [`Intake`] (what Feedback brings the
//! next round). The gRPC handlers (`mapping`, `feedback`, `admin`) and the dashboard read it;
//! it imports none of them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use cdnmap_engine::driver::{Driver, Observations, StepError, StepTimings};
use cdnmap_engine::round::{Snapshot, Solved};
use cdnmap_estimator::rtt::RttTable;
use cdnmap_estimator::state::Estimates;
use cdnmap_mapper::{ClusterIdx, ClusterState, Instance, Limits, UnitIdx};
use cdnmap_serve::resolve::ClassRules;
use cdnmap_serve::servers::Servers;
use cdnmap_store::edit::Applied;
use cdnmap_store::{EstimatorLog, Served, ServedRef, Store};
use cdnmap_topology::Topology;
use tokio::sync::broadcast;
use tonic::Status;

use crate::clock::now_unix_ms;
use crate::config::Config;
use crate::selection::{self, ServerLoads};
use crate::topology::{Change, ChangeError, SharedTopology};

/// The most feedback reports kept.
pub const MAX_REPORTS: usize = 1_000_000;
/// Map updates a slow watcher may fall behind before it gets a full map instead.
pub(crate) const WATCH_BACKLOG: usize = 16;

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

/// The last round (published or not, or the stored map before the first), which Feedback's
/// bounds are relative to (`budget`): its map resolves a prefix to its unit, its demands and
/// its classes' demand bound what the next round's reports may add.
#[derive(Debug)]
pub struct Reference {
    pub snapshot: Arc<Snapshot>,
    pub classes: cdnmap_engine::budget::ClassDemand,
}

/// The state shared by the loop and every handler: what the whole process holds (the
/// configuration, this start's epoch, the store, the topology's writer, the health checks, the
/// election, the stop signal) and three parts, each with one writer:
///
/// - [`ReadSide`]: what the handlers and the dashboard read, published by the loop;
/// - [`RoundState`]: what the round loop owns and nobody else reads (but Admin's status);
/// - [`Intake`]: what the Feedback handlers bring in for the next round.
pub struct Shared {
    pub(crate) config: Config,
    /// This start's epoch (stored before anything is served): a map's identity is
    /// (epoch, version), so a version published before a crash and never stored is not
    /// mistaken for the one the next start publishes under the same number.
    pub(crate) epoch: u64,
    /// The topology the next round solves: one writer, read without a lock.
    pub(crate) topology: SharedTopology,
    /// The health checks' verdicts, with `[health]` configured: each round sets the clusters
    /// they hold down down (where the operator has them up).
    pub(crate) health: Option<Arc<crate::health::Health>>,
    /// This replica's part in the election, with `etcd` configured (set once, at the start of
    /// `server::serve`, before the first round).
    pub(crate) lead: crate::topology::Lead,
    pub(crate) store: Store,
    /// Turns true when the service is asked to stop: the loop ends after its round, and
    /// WatchMap streams end, so in-flight calls can finish.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
    /// What readers see.
    pub(crate) read: ReadSide,
    /// What the round loop owns.
    pub(crate) round: RoundState,
    /// What the reports bring in.
    pub(crate) intake: Intake,
    /// The last N-1 sweep (made by the `n1` module).
    pub(crate) n1: ArcSwapOption<N1View>,
}

/// The last N-1 sweep (the `n1` module makes it; kept here, beside what readers see).
#[derive(Debug, Clone)]
pub struct N1View {
    /// The map version it was made from.
    pub version: u64,
    pub at_unix_ms: i64,
    /// The sweep's time, and the exact previews' after it.
    pub sweep_ms: f64,
    pub exact_ms: f64,
    pub sweep: cdnmap_engine::n1::Sweep,
}

/// The published read side: written by the round loop only (each published round: its history
/// entry, then its map and selectors in one swap, then the watchers' notice; its status after
/// it), read by the gRPC handlers, WatchMap streams and the dashboard. The action log in
/// `activity` is written by the topology writer's log too, in the order of
/// the changes.
pub struct ReadSide {
    /// The published map and its selectors.
    pub(crate) published: ArcSwapOption<Published>,
    /// Each published map, to WatchMap streams.
    pub(crate) updates: broadcast::Sender<Arc<Snapshot>>,
    /// What the last round did.
    pub(crate) status: Mutex<RoundStatus>,
    /// The rounds published and the actions on clusters, recent ones (the dashboard reads them).
    pub(crate) activity: Arc<crate::activity::Activity>,
}

/// What the round loop owns: the driver with its estimator, the last round's map and whether
/// it went out, and the estimator's checkpoint. Written by the loop's rounds (and, once, by the
/// start's estimator restore before the first round runs); read by Admin's status
/// (`last_solved`, `last_published`) and the dashboard (the estimator's state). The one
/// exception is `leader_map`, written by the standby's follower of the leader's WatchMap and
/// read by the rounds.
pub struct RoundState {
    /// The last round's map, published or not: the next round is seeded from it. Alone it is
    /// the published map; a standby replica solves every round and publishes none.
    pub(crate) last_solved: ArcSwapOption<Snapshot>,
    /// Whether the last round's map was published (a standby's is not).
    pub(crate) last_published: std::sync::atomic::AtomicBool,
    /// Replicated, as a standby: the leader's last published map (followed over its
    /// WatchMap), which the standby's rounds are seeded from.
    pub(crate) leader_map: ArcSwapOption<cdnmap_serve::watch::Followed>,
    /// The round driver with the estimator (demand forecasts, learned coefficients,
    /// derating): fed by the reports, run each round; each round's entry is stored with its map
    /// and the whole state checkpointed now and then.
    pub(crate) driver: Mutex<Option<Driver>>,
    /// Turns true once the estimator is restored (or could not be: then `driver` is `None`
    /// and rounds fail saying so). A start serves the stored map first and restores the
    /// estimator on a thread of its own ([`Shared::restore_estimator`]); the first round
    /// waits for it.
    pub(crate) estimator_ready: tokio::sync::watch::Sender<bool>,
    /// The estimator's last stored checkpoint, and whether one is being written.
    pub(crate) checkpoint: Mutex<Checkpointed>,
    /// True while a round solves: the N-1 sweep steps aside meanwhile (the `n1` module's `Gate`).
    pub(crate) solving: std::sync::atomic::AtomicBool,
}

/// The feedback intake: what the Feedback handlers add between two rounds (demand and loads
/// in `pending`, measured RTTs, server loads, each source's budget), which the round loop takes
/// (it drains `pending`, reads the RTT table, and sets `reference`, the round the next
/// reports' bounds are relative to).
pub struct Intake {
    /// What the reports brought since the last round.
    pub(crate) pending: Mutex<Pending>,
    /// Each feedback source's budget.
    pub(crate) budgets: cdnmap_engine::budget::Budgets,
    /// In-cluster selection: the last reported server loads (each publication builds its
    /// selectors with them; WatchMap sends them).
    pub(crate) server_loads: ServerLoads,
    /// Measured RTTs (Feedback's `ReportRtt`), rebuilt from the record at a start: each
    /// round scores the measured candidates by them.
    pub(crate) rtt: Mutex<RttTable>,
    /// The last round's map with its demand by class: what Feedback's bounds are relative to
    /// (set by the loop).
    pub(crate) reference: ArcSwapOption<Reference>,
}

impl ReadSide {
    fn new() -> ReadSide {
        ReadSide {
            published: ArcSwapOption::empty(),
            updates: broadcast::channel(WATCH_BACKLOG).0,
            status: Mutex::new(RoundStatus::default()),
            activity: Arc::new(crate::activity::Activity::default()),
        }
    }

    /// The topology writer's log: each operator's action on a cluster, with its outcome, into
    /// the action log (in the order the writer carries the changes out).
    fn action_log(&self) -> crate::topology::Log {
        let log_to = Arc::clone(&self.activity);
        Arc::new(move |change, result| {
            if let Change::ClusterState {
                id,
                state,
                reason,
                actor,
                predicted,
            } = change
            {
                let outcome = match result {
                    Ok(a) => Ok(a.before),
                    Err(e) => Err(e.to_string()),
                };
                let now = now_unix_ms();
                log_to.log_action(actor, id, *state, reason, outcome, *predicted, now);
            }
        })
    }
}

impl RoundState {
    /// No round yet, and no estimator until the start restores it.
    fn new() -> RoundState {
        RoundState {
            last_solved: ArcSwapOption::empty(),
            last_published: std::sync::atomic::AtomicBool::new(false),
            leader_map: ArcSwapOption::empty(),
            driver: Mutex::new(None),
            estimator_ready: tokio::sync::watch::channel(false).0,
            checkpoint: Mutex::new(Checkpointed::default()),
            solving: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Intake {
    /// Nothing reported yet; the first period begins at `now` (Unix ms).
    fn new(config: &Config, now: i64) -> Intake {
        Intake {
            pending: Mutex::new(Pending {
                since_ms: Some(now),
                ..Pending::default()
            }),
            budgets: cdnmap_engine::budget::Budgets::new(config.feedback_samples_per_sec as f64),
            server_loads: ServerLoads::default(),
            rtt: Mutex::new(RttTable::new(config.rtt)),
            reference: ArcSwapOption::empty(),
        }
    }
}

/// Observations waiting for the next round.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// Queries per map unit, by unit index of the topology they were reported against.
    pub(crate) demand: cdnmap_estimator::observed::UnitDemand,
    /// (cluster, node, load), oldest first.
    pub(crate) loads: std::collections::VecDeque<(String, String, f64)>,
    /// When these observations began to be gathered (Unix ms): the service's start, then
    /// each round's time.
    pub(crate) since_ms: Option<i64>,
    /// What each source has added in this period, and the reports admitted but not yet
    /// stored (`budget::RoundLedger`).
    pub(crate) ledger: cdnmap_engine::budget::RoundLedger,
}

/// The demand of a period of `period_ms` (counts summed over it) as the demand of one cycle
/// of `cycle_ms`, which is what a map unit's demand means: a round that ran long, or the
/// first after a start, must not see more (or less) demand for its period being longer (or
/// shorter). Measured at 11 M map units, rounds of 25–86 s took each period's counts as
/// 2.5–8.6 times the demand, and the map moved by 18% a round. A period within
/// [`PERIOD_SLACK`] of the cycle is a cycle (the timer's ticks are a cycle apart, give or take
/// a round's jitter: their counts are kept exactly as reported); periods under a second count
/// as a second.
pub(crate) fn per_cycle(
    demand: &mut cdnmap_estimator::observed::UnitDemand,
    period_ms: i64,
    cycle_ms: i64,
) {
    let ratio = cycle_ms as f64 / period_ms.max(1_000) as f64;
    if (ratio - 1.0).abs() > PERIOD_SLACK {
        demand.scale(ratio);
    }
}

/// How many times more a publication's transaction is tried when etcd did not answer.
const PUBLISH_TRIES: usize = 3;

/// How far (as a fraction) a round's period may be from the cycle and still count as one.
pub(crate) const PERIOD_SLACK: f64 = 0.1;

/// The most pending observations kept between two rounds (beyond it the oldest loads are
/// dropped from the estimator's input; every report is still in the record).
pub(crate) const MAX_PENDING_LOADS: usize = 1_000_000;

/// A checkpoint of the estimator's whole state is stored at most this many rounds apart (and
/// at once when its units change): between two, each round stores only its entry (the demand
/// it observed and the small learned state), and a start replays the entries onto the last
/// checkpoint. At 1 M map units the whole state is about 250 MB and an entry 8 MB.
pub const CHECKPOINT_ROUNDS: u64 = 30;

/// The estimator's last stored checkpoint: after which record version, for which generation
/// of units; and whether a checkpoint is being written now (one at a time).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Checkpointed {
    pub(crate) stored: Option<(u64, u64)>,
    pub(crate) writing: bool,
}

impl Checkpointed {
    /// Whether the round of record `version`, with the estimator at unit `generation`, should
    /// store a checkpoint.
    fn due(&self, version: u64, generation: u64) -> bool {
        !self.writing
            && match self.stored {
                None => true,
                Some((v, g)) => g != generation || version.saturating_sub(v) >= CHECKPOINT_ROUNDS,
            }
    }
}

/// An INVALID_ARGUMENT status naming what was wrong.
pub(crate) fn invalid(what: impl std::fmt::Display) -> Status {
    Status::invalid_argument(what.to_string())
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
    #[error("the estimator could not be restored or started: {0}")]
    NoEstimator(String),
}

/// What a round made, stored (or not) and to publish.
struct Round {
    snapshot: Snapshot,
    timings: StepTimings,
    stored: Stored,
    /// The topology journal's sequence number of the last edit the round solved with.
    base_seq: u64,
}

/// How storing a round went ([`Shared::store_round`]).
struct Stored {
    /// Why the record was not stored, if it was not: then the round's map is not published
    /// (a client never sees a version the store does not hold) and the round counts as failed.
    error: Option<String>,
    /// How long encoding the estimator's entry and writing the record took, in milliseconds.
    ms: f64,
    /// The estimator's generation of units after the round.
    generation: u64,
}

impl Shared {
    /// Opens the store, takes this start's epoch, and decides the starting state: the stored
    /// topology, and the served map with the estimator's state saved with it (served at once,
    /// before any round, exactly as it was published), else `initial` (stored for next time).
    /// Nothing an acknowledged Admin change did can make a start fail: the served map carries
    /// the instance it was solved with, and a selection override naming a cluster that is gone
    /// is a warning. Nor can a damaged stored file: the start falls back to the newest state
    /// that reads, and says what it skipped (`cdnmap_store`'s `recover`).
    ///
    /// `initial` is called only when the store has no topology (a world of millions of units
    /// takes seconds to generate or read, which a restart then does not spend).
    pub fn start(
        config: Config,
        initial: impl FnOnce() -> anyhow::Result<Topology>,
    ) -> anyhow::Result<Arc<Shared>> {
        let started = Instant::now();
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let store = Store::open(&config.data_dir)?;
        // Above the stored epoch, and above the clock: a store that was lost starts again
        // above every epoch a front end may hold (issue 41).
        let epoch = store.next_epoch(u64::try_from(now_unix_ms()).unwrap_or(0))?;
        let start = start_topology(&store, &config, initial)?;
        check_against_topology(&config, &start.topology)?;
        let topology_ms = ms(started);
        let t = Instant::now();
        let (served, skipped_version) = start_served(&store, &config, &start)?;
        let served_ms = ms(t);
        let (topology, seq, replayed) = (start.topology, start.seq, start.replayed);
        let read = ReadSide::new();
        // The change history, read back before any change can be made.
        read.activity.keep_in(&store);
        let lead = crate::topology::Lead::default();
        let shared = Arc::new(Shared {
            topology: SharedTopology::start(
                store.clone(),
                topology,
                seq,
                replayed,
                read.action_log(),
                Arc::clone(&lead),
            ),
            health: config
                .health
                .clone()
                .map(|h| Arc::new(crate::health::Health::new(h))),
            lead,
            store,
            epoch,
            stopping: tokio::sync::watch::channel(false).0,
            read,
            round: RoundState::new(),
            intake: Intake::new(&config, now_unix_ms()),
            n1: ArcSwapOption::empty(),
            config,
        });
        // Nothing has changed the topology yet: no one can reach Admin before this returns.
        let start_topology = shared.topology.current();
        let mut served = served;
        let inline = served.as_mut().map(|s| std::mem::take(&mut s.estimator));
        let served_version = served.as_ref().map(|s| s.version);
        if let Some(s) = served {
            let timings = (topology_ms, served_ms, seq);
            shared.serve_stored(s, timings)?;
        }
        // The decoded store's columns are freed: hand them back before the estimator is read.
        crate::memory::release();
        // A served record moved aside: the estimator is restored after it still (its
        // checkpoint and entries are files of their own), and the versions start again.
        let after = served_version.or(skipped_version);
        let inline = inline.unwrap_or_default();
        Arc::clone(&shared).spawn_restore(
            start_topology,
            after,
            inline,
            skipped_version.is_some(),
        )?;
        Ok(shared)
    }

    /// Publishes the map of the served record `s` (the stored map, served until the first
    /// round, exactly as it was published), and makes it the round Feedback's bounds are
    /// relative to. `timings`: the start's milliseconds so far (topology, served record) and
    /// the topology's journal sequence number, for the log.
    fn serve_stored(&self, s: Served, timings: (f64, f64, u64)) -> anyhow::Result<()> {
        let (topology_ms, served_ms, seq) = timings;
        let t = Instant::now();
        let rules = self.rules(&s.topology)?;
        let identity = (s.epoch, s.version, s.solved_at_unix_ms);
        let snapshot = Snapshot::restored(identity, s.topology, s.map, rules)?;
        tracing::info!(
            epoch = snapshot.epoch,
            version = snapshot.version,
            topology_ms,
            served_ms,
            index_ms = t.elapsed().as_secs_f64() * 1e3,
            topology_seq = seq,
            "serving the stored map until the first round (the estimator is restored beside it)"
        );
        let snapshot = Arc::new(snapshot);
        self.refer(&snapshot);
        self.publish(snapshot);
        Ok(())
    }

    /// Restores the estimator on a thread of its own, while the stored map is served (at
    /// 11 M map units it is a checkpoint of 1.4 GB and up to 30 entries of 88 MB, about 12 s
    /// of a start): see [`Shared::restore_estimator`].
    fn spawn_restore(
        self: Arc<Self>,
        topology: Arc<Topology>,
        served: Option<u64>,
        inline: EstimatorLog,
        versions_restart: bool,
    ) -> anyhow::Result<()> {
        let restore = move || self.restore_estimator(&topology, served, inline, versions_restart);
        std::thread::Builder::new()
            .name("cdnmap-estimator".into())
            .spawn(restore)
            .map_err(|e| anyhow::anyhow!("no thread to restore the estimator on: {e}"))?;
        Ok(())
    }

    /// Waits until the estimator is restored (a start restores it beside the stored map it
    /// serves; the first round waits for it too).
    pub async fn estimator_restored(&self) {
        let _ = self
            .round
            .estimator_ready
            .subscribe()
            .wait_for(|&ready| ready)
            .await;
    }

    /// Restores the estimator after the round of record `served` (the stored checkpoint, or
    /// the one `inline` in a record of format 03, with the round entries after it read and
    /// replayed one at a time) for `topology`, the topology the start served, or starts it
    /// afresh; installs it as the round driver's and says it is ready. `versions_restart`:
    /// the stored versions were moved aside, so the next round's version starts again and
    /// its checkpoint is due at once (the stored one's version is of the versions before).
    fn restore_estimator(
        &self,
        topology: &Topology,
        served: Option<u64>,
        inline: EstimatorLog,
        versions_restart: bool,
    ) {
        // Serving the stored map comes first: front ends joining a restarted mapper take the
        // whole map while this runs (at 11 M units, seconds of CPU each on a 2-core machine).
        lower_thread_priority();
        self.restore_rtt(now_unix_ms());
        let t = Instant::now();
        let restored = restore_estimates(&self.store, served, inline, topology).or_else(|e| {
            tracing::error!(error = %e, "the estimator's stored state is unreadable: it starts afresh");
            Ok::<_, anyhow::Error>((Estimates::new(topology)?, Checkpointed::default()))
        });
        match restored {
            Ok((estimates, checkpointed)) => {
                let driver = Driver::new(
                    estimates,
                    self.config.stickiness(),
                    self.config.learning,
                    cfg!(debug_assertions),
                )
                .with_max_reordered(self.config.rtt.max_reordered_units)
                .with_second_chance(self.config.round_chance().unwrap_or_default());
                if let Ok(mut d) = self.round.driver.lock() {
                    *d = Some(driver);
                }
                if let Ok(mut c) = self.round.checkpoint.lock() {
                    *c = if versions_restart {
                        Checkpointed::default()
                    } else {
                        checkpointed
                    };
                }
                // The checkpoint's bytes and the replayed entries are freed.
                crate::memory::release();
                tracing::info!(
                    estimator_ms = t.elapsed().as_secs_f64() * 1e3,
                    "the estimator is ready"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "no estimator: every round fails until a restart")
            }
        }
        self.round.estimator_ready.send_replace(true);
    }

    /// Takes the samples of an acknowledged RTT report, received at `at_ms`, into the table
    /// (those of a prefix no map unit covered are only in the record).
    pub(crate) fn take_rtt(&self, body: &cdnmap_store::record::RttBody, at_ms: i64) {
        let Ok(mut table) = self.intake.rtt.lock() else {
            return;
        };
        for s in &body.samples {
            let result = match &s.unit {
                None => "no_unit",
                Some(unit) => match table.record(unit, &s.cluster, s.rtt_ms, s.samples, at_ms) {
                    Ok(()) => "taken",
                    Err(_) => "full",
                },
            };
            metrics::counter!("cdnmap_rtt_samples_total", "result" => result).increment(1);
        }
        metrics::gauge!("cdnmap_rtt_pairs").set(table.pairs() as f64);
    }

    /// The RTT table rebuilt from the record's RTT reports of the last `rtt.max_age_secs`
    /// (what a start does before the first round): told from the other reports by their first
    /// bytes, so the demand reports are not decoded.
    fn restore_rtt(&self, now: i64) {
        let max_age_ms = (self.config.rtt.max_age_secs * 1e3) as i64;
        let mut reports = 0usize;
        let read = self
            .store
            .for_each_report(now.saturating_sub(max_age_ms), i64::MAX, |at, bytes| {
                if cdnmap_store::record::is_rtt(bytes) {
                    match cdnmap_store::record::decode(bytes) {
                        Ok(cdnmap_store::record::RecordedReport {
                            report: cdnmap_store::record::Report::Rtt(body),
                            ..
                        }) => {
                            reports += 1;
                            self.take_rtt(&body, at);
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(at, error = %e, "an RTT report in the record is unreadable"),
                    }
                }
                true
            });
        if let Err(e) = read {
            tracing::error!(error = %e, "reading the record's RTT reports failed: the RTT table starts empty");
        }
        let pairs = self.intake.rtt.lock().map_or(0, |t| t.pairs());
        tracing::info!(reports, pairs, "RTT table rebuilt from the record");
    }

    /// The measured RTTs at `now` by index of `base` (pairs whose unit or cluster is gone
    /// are left out); reports older than `rtt.max_age_secs` are dropped.
    fn measured_rtt(&self, base: &Topology, now: i64) -> Vec<(UnitIdx, ClusterIdx, f32)> {
        let Ok(mut table) = self.intake.rtt.lock() else {
            return Vec::new();
        };
        table.prune(now);
        metrics::gauge!("cdnmap_rtt_pairs").set(table.pairs() as f64);
        let mut out = Vec::new();
        table.for_each_estimate(now, |unit, cluster, e| {
            if let (Some(u), Some(c)) = (base.unit_index(unit), base.cluster_index(cluster)) {
                out.push((u, c, e.rtt_ms));
            }
        });
        out
    }

    fn rules(&self, instance: &Instance) -> Result<ClassRules, cdnmap_mapper::ModelError> {
        ClassRules::for_instance(
            instance,
            &self.config.class_rule_pairs(),
            &self.config.default_class,
        )
    }

    /// The published map version.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.read
            .published
            .load()
            .as_ref()
            .map(|p| Arc::clone(&p.snapshot))
    }

    /// The published map version with its selectors.
    pub fn published(&self) -> Option<Arc<Published>> {
        self.read.published.load_full()
    }

    /// This start's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the round's map `snapshot`, solved in `term` (none: as a standby), goes out:
    /// only if this replica still leads that term (by its lease's deadline) and etcd's
    /// transaction, comparing the leader key's revision, writes the publication. A map not
    /// published is still the next round's seed.
    async fn may_publish(&self, term: Option<&cdnmap_lead::Term>, snapshot: &Snapshot) -> bool {
        let (Some(lead), Some(term)) = (self.lead.get(), term) else {
            return false;
        };
        if lead.term().as_ref() != Some(term) {
            tracing::warn!(
                epoch = term.epoch,
                version = snapshot.version,
                "the term ended during the round: its map is not published"
            );
            return false;
        }
        // A call that etcd did not answer (a member that died, a slow moment) is tried again
        // while the term holds: only etcd's "no" ends it.
        let mut answer = lead.publish(term, snapshot.version).await;
        for _ in 0..PUBLISH_TRIES {
            match &answer {
                Err(e) if lead.term().as_ref() == Some(term) => {
                    tracing::debug!(error = %e, "the publication's transaction again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    answer = lead.publish(term, snapshot.version).await;
                }
                _ => break,
            }
        }
        match answer {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(
                    epoch = term.epoch,
                    version = snapshot.version,
                    "etcd refused the publication (another replica leads): not published"
                );
                false
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    epoch = term.epoch,
                    version = snapshot.version,
                    "the publication could not be written to etcd: not published"
                );
                false
            }
        }
    }

    /// Replicated: applies the replicas' edits (the leader's Admin and dashboard changes, in
    /// etcd) that this replica has not applied yet, in order; how many. An edit already gone
    /// from etcd, or one that does not apply here, is an error (this replica's topology can no
    /// longer follow the leader's: it says so until an operator restarts it on a copy of a
    /// peer's `data_dir`).
    pub(crate) async fn sync_edits(&self) -> Result<usize, String> {
        let Some(lead) = self.lead.get() else {
            return Ok(0);
        };
        let mut applied = 0;
        loop {
            let start = self.topology.current_versioned().seq;
            let mut next = start + 1;
            let edits = lead.edits_from(next).await.map_err(|e| e.to_string())?;
            if edits.is_empty() {
                return Ok(applied);
            }
            for (seq, bytes) in edits {
                if seq > next {
                    return Err(format!(
                        "edit {next} of the replicas' log is no longer in etcd (it keeps the \
                         newest {}): this replica cannot catch up; start it on a copy of \
                         another replica's data_dir",
                        crate::lead::EDITS_KEPT
                    ));
                }
                let edit: cdnmap_store::edit::Edit = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("edit {seq} of the replicas' log: {e}"))?;
                match self.topology.apply_shared(seq, edit).await {
                    Ok(_) => applied += 1,
                    // This replica's own change, journaled meanwhile.
                    Err(ChangeError::Shared(_)) if self.topology.current_versioned().seq >= seq => {
                    }
                    Err(e) => return Err(format!("edit {seq} of the replicas' log: {e}")),
                }
                next = seq + 1;
            }
            // Every read must move the topology on, or the next would read the same edits.
            if self.topology.current_versioned().seq == start {
                return Err(format!(
                    "edit {} of the replicas' log was not applied",
                    start + 1
                ));
            }
        }
    }

    /// Replicated: takes in the replicas' copy of the change history (etcd's, the newest
    /// [`crate::lead::HISTORY_KEPT`] records), those this replica lacks kept as the leader that
    /// wrote them had them; how many were new.
    pub(crate) async fn sync_history(&self) -> Result<usize, String> {
        let Some(lead) = self.lead.get() else {
            return Ok(0);
        };
        let mut records = Vec::new();
        let mut next = 0;
        loop {
            let page = lead.history_from(next).await.map_err(|e| e.to_string())?;
            let Some(&(last, _)) = page.last() else {
                break;
            };
            records.extend(page.into_iter().map(|(_, r)| r));
            next = last + 1;
        }
        Ok(self.read.activity.merge_shared(&records))
    }

    /// This replica's part in the election (Admin status), when replicated.
    pub(crate) fn replication(&self) -> Option<cdnmap_proto::v1::Replication> {
        let lead = self.lead.get()?;
        let status = lead.status().borrow().clone();
        let (role, leader_epoch) = match &status.role {
            Some(cdnmap_lead::Role::Leader { epoch, .. }) => ("leader", *epoch),
            _ => ("standby", 0),
        };
        Some(cdnmap_proto::v1::Replication {
            node_id: lead.node_id().to_string(),
            role: role.to_string(),
            leader_epoch,
            replicas: status.replicas,
            etcd_reachable: status.etcd_reachable,
            etcd_error: status.etcd_error,
            last_solved_version: self
                .round
                .last_solved
                .load()
                .as_ref()
                .map_or(0, |s| s.version),
            last_round_published: self
                .round
                .last_published
                .load(std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// Asks the loop and the WatchMap streams to end (a round in progress finishes first).
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Waits (at most `limit`) until no topology snapshot is being written (`SharedTopology::
    /// snapshot_written`): what a stop does before it flushes the store.
    pub async fn snapshot_written(&self, limit: std::time::Duration) -> bool {
        self.topology.snapshot_written(limit).await
    }

    /// Waits until every write acknowledged so far is on disk.
    pub fn flush(&self) -> Result<(), cdnmap_store::StoreError> {
        self.store.flush_all()
    }

    /// The selection policy of each cluster of `instance`.
    pub(crate) fn policies(&self, instance: &Instance) -> Vec<cdnmap_serve::servers::Policy> {
        self.config.selection.policies(instance)
    }

    /// Publishes `snapshot` with its in-cluster selectors (built with the last reported server
    /// loads), in one swap. A failure to build the selectors (the config's policies are
    /// validated, so only an internal error) leaves answers naming every address of their
    /// clusters, and is logged.
    fn publish(&self, snapshot: Arc<Snapshot>) {
        let clusters = snapshot.resolver.map().clusters();
        let policies = self.policies(&snapshot.topology);
        let built = selection::build(clusters, &policies, &self.intake.server_loads, &[])
            .map_err(|e| e.to_string());
        let servers = match built {
            Ok(servers) => Some(servers),
            Err(e) => {
                tracing::error!(error = %e, "building the in-cluster selectors failed");
                None
            }
        };
        metrics::gauge!("cdnmap_map_version").set(snapshot.version as f64);
        metrics::gauge!("cdnmap_map_epoch").set(snapshot.epoch as f64);
        self.read
            .published
            .store(Some(Arc::new(Published { snapshot, servers })));
    }

    /// Makes `snapshot` the round Feedback's bounds are relative to.
    fn refer(&self, snapshot: &Arc<Snapshot>) {
        let classes = cdnmap_engine::budget::ClassDemand::of(&snapshot.topology);
        self.intake.reference.store(Some(Arc::new(Reference {
            snapshot: Arc::clone(snapshot),
            classes,
        })));
    }

    /// The round Feedback's bounds are relative to: the last one solved, or the stored map
    /// served until the first.
    pub(crate) fn reference(&self) -> Option<Arc<Reference>> {
        self.intake.reference.load_full()
    }

    /// Runs one round now: solve (on a blocking thread), verify in debug builds, store the
    /// record while the map is indexed, publish, notify watchers. A failed round keeps the last
    /// good map and says so.
    pub async fn run_round(self: &Arc<Self>) {
        self.run_round_at(now_unix_ms()).await;
    }

    /// [`Shared::run_round`] at time `now` (the loop passes the clock; tests and replays pass a
    /// simulated one).
    pub async fn run_round_at(self: &Arc<Self>, now: i64) {
        self.round_at(now, true).await;
    }

    /// A round at `now`; `observe` false leaves the reports since the last round for the next
    /// one (the round a replica runs when it wins the election, between two of the replicas'
    /// common instants: the period stays the one every replica's estimator sees).
    async fn round_at(self: &Arc<Self>, now: i64, observe: bool) {
        // A start restores the estimator beside the stored map it serves: the first round
        // waits for it.
        self.estimator_restored().await;
        // Replicated, a round is solved in the term this replica leads (epoch 0 when it is a
        // standby: such a map is never published, only stored and seeded from).
        let term = self.lead.get().map(|c| c.term());
        let epoch = match &term {
            None => self.epoch,
            Some(Some(t)) => t.epoch,
            Some(None) => 0,
        };
        let started = Instant::now();
        let me = Arc::clone(self);
        let solving = &self.round.solving;
        solving.store(true, std::sync::atomic::Ordering::Relaxed);
        let result = tokio::task::spawn_blocking(move || me.solve_round(now, epoch, observe))
            .await
            .unwrap_or_else(|e| Err(LoopError::Task(e.to_string())));
        solving.store(false, std::sync::atomic::Ordering::Relaxed);
        let solve_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut status = self.timed_status(now, solve_ms);
        match result {
            Ok(Round {
                snapshot,
                stored: Stored {
                    error: Some(error), ..
                },
                ..
            }) => self.not_stored(snapshot, &error, &mut status),
            Ok(round) => self.stored(round, term, solve_ms).await,
            Err(e) => {
                metrics::counter!("cdnmap_rounds_failed_total").increment(1);
                tracing::error!(error = %e, "round failed; serving the last good map");
                status.failed = true;
                status.error = e.to_string();
            }
        }
        metrics::histogram!("cdnmap_round_seconds").record(started.elapsed().as_secs_f64());
        if let Ok(mut s) = self.read.status.lock() {
            *s = status;
        }
    }

    /// The status of a round at `now` that took `solve_ms`: a round longer than the cycle is
    /// said (the next starts late: the loop never overlaps rounds; the map served until then
    /// is the previous one).
    fn timed_status(&self, now: i64, solve_ms: f64) -> RoundStatus {
        let mut status = RoundStatus {
            last_round_at_unix_ms: now,
            solve_ms,
            ..RoundStatus::default()
        };
        let cycle_ms = self.config.cycle_secs as f64 * 1e3;
        if solve_ms > cycle_ms {
            metrics::counter!("cdnmap_rounds_slow_total").increment(1);
            tracing::warn!(solve_ms, cycle_ms, "round took longer than the cycle");
            status.error = format!(
                "the last round took {solve_ms:.0} ms, longer than the {cycle_ms:.0} ms cycle"
            );
        }
        status
    }

    /// A round whose record could not be stored: not published, so a client never sees a
    /// version a restart could not serve. The next round is seeded from it all the same (a
    /// standby's unpublished maps are too) and takes the next version: this one may be in the
    /// store in part (its record written, the write after it failed), and a version number is
    /// never written twice. Clients see the version after it, by a delta from the one they
    /// hold. The estimator's entry for it may be missing, which would end a restart's replay
    /// of the entries there: the next stored round writes a whole checkpoint.
    fn not_stored(&self, snapshot: Snapshot, error: &str, status: &mut RoundStatus) {
        let snapshot = Arc::new(snapshot);
        self.round.last_solved.store(Some(Arc::clone(&snapshot)));
        self.refer(&snapshot);
        if let Ok(mut c) = self.round.checkpoint.lock() {
            c.stored = None;
        }
        metrics::counter!("cdnmap_rounds_failed_total").increment(1);
        tracing::error!(
            error = %error,
            epoch = snapshot.epoch,
            version = snapshot.version,
            "storing the round's map failed: not published; the last stored map keeps serving"
        );
        status.failed = true;
        status.error = format!(
            "storing map version {} failed, so it was not published (the last stored map keeps serving): {error}",
            snapshot.version
        );
    }

    /// A stored round: the next round's seed and Feedback's reference; published if this
    /// replica may (alone, or leading `term` still); its parts timed; a checkpoint if due.
    async fn stored(
        self: &Arc<Self>,
        round: Round,
        term: Option<Option<cdnmap_lead::Term>>,
        solve_ms: f64,
    ) {
        let Round {
            snapshot,
            timings: step_timings,
            stored,
            base_seq,
        } = round;
        let snapshot = Arc::new(snapshot);
        self.round.last_solved.store(Some(Arc::clone(&snapshot)));
        self.refer(&snapshot);
        let t = Instant::now();
        let publishing = match term {
            None => true,
            Some(term) => self.may_publish(term.as_ref(), &snapshot).await,
        };
        self.round
            .last_published
            .store(publishing, std::sync::atomic::Ordering::Relaxed);
        if publishing {
            // The round's history entry before its map: whoever sees the map sees it too.
            self.read
                .activity
                .record_round(&snapshot, solve_ms, base_seq);
            self.publish(Arc::clone(&snapshot));
            let _ = self.read.updates.send(Arc::clone(&snapshot));
            // A leader seeds from its own maps: the last leader's is let go.
            self.round.leader_map.store(None);
        }
        let publish_ms = t.elapsed().as_secs_f64() * 1e3;
        let parts = [
            step_timings.estimate_ms,
            snapshot.timings.effective_ms,
            snapshot.timings.solve_ms,
            snapshot.timings.index_ms,
            publish_ms,
            stored.ms,
        ];
        for (part, ms) in ROUND_PARTS.into_iter().zip(parts) {
            metrics::histogram!("cdnmap_round_part_seconds", "part" => part).record(ms / 1e3);
        }
        tracing::info!(
            estimator_ms = step_timings.estimate_ms,
            effective_ms = snapshot.timings.effective_ms,
            solve_ms = snapshot.timings.solve_ms,
            index_ms = snapshot.timings.index_ms,
            publish_ms,
            persist_ms = stored.ms,
            "round parts (persist ran beside index)"
        );
        self.round_metrics(&snapshot, solve_ms, publishing);
        self.checkpoint_if_due(snapshot.version, stored.generation)
            .await;
    }

    /// Stores the record of the round `solved` (from the topology after journal entry
    /// `base_seq`) with the estimator's entry for it, on the round's thread while the map is
    /// indexed. No topology is written: the record names its base by the journal's sequence
    /// number.
    fn store_round(
        &self,
        base_seq: u64,
        solved: &Solved,
        estimates: &Estimates,
        observations: &Observations,
    ) -> Stored {
        let t = Instant::now();
        let entry = estimates.round_entry(observations.at_unix_ms, &observations.demand);
        let result = self.store.put_served(
            &ServedRef {
                epoch: solved.epoch,
                version: solved.version,
                solved_at_unix_ms: solved.solved_at_unix_ms,
                base_seq,
                instance: &solved.topology,
                map: &solved.map,
                round_entry: &entry,
            },
            self.config.maps_kept,
        );
        let error = match result {
            Ok(()) => {
                metrics::gauge!("cdnmap_map_stored_version").set(solved.version as f64);
                metrics::gauge!("cdnmap_map_stored_epoch").set(solved.epoch as f64);
                None
            }
            Err(e) => Some(e.to_string()),
        };
        Stored {
            error,
            ms: t.elapsed().as_secs_f64() * 1e3,
            generation: estimates.generation(),
        }
    }

    /// After the round of record `version` was stored and announced: when a checkpoint is due
    /// (none yet, the estimator's units changed, or [`CHECKPOINT_ROUNDS`] since the last),
    /// encodes the estimator's whole state now, before the next round can change it (awaited,
    /// so the state is exactly the one after `version`), and stores it on a blocking thread of
    /// its own, off the loop: the next round does not wait for the write. One at a time.
    async fn checkpoint_if_due(self: &Arc<Self>, version: u64, generation: u64) {
        match self.round.checkpoint.lock() {
            Ok(mut c) if c.due(version, generation) => c.writing = true,
            _ => return,
        }
        let me = Arc::clone(self);
        let t = Instant::now();
        // Streamed to the file under the driver's lock (the state must be the one after
        // `version`; a copy of it would be as large as the state), synced after the lock is
        // released.
        let pending = tokio::task::spawn_blocking(move || match me.round.driver.lock() {
            Ok(d) => match d.as_ref() {
                Some(d) => me
                    .store
                    .write_checkpoint(version, |w| d.estimates().write_to(w))
                    .map_err(|e| e.to_string()),
                None => Err("there is no estimator".to_string()),
            },
            Err(_) => Err("the round driver's lock is poisoned".to_string()),
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        let encode_ms = t.elapsed().as_secs_f64() * 1e3;
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            let bytes = pending.as_ref().map_or(0, |p| p.bytes());
            let stored = match pending.map(|p| p.commit().map_err(|e| e.to_string())) {
                Ok(Ok(())) => true,
                Ok(Err(e)) | Err(e) => {
                    tracing::error!(error = %e, "storing the estimator's checkpoint failed");
                    false
                }
            };
            let write_ms = t.elapsed().as_secs_f64() * 1e3;
            metrics::histogram!("cdnmap_estimator_checkpoint_seconds")
                .record((encode_ms + write_ms) / 1e3);
            tracing::info!(
                version,
                bytes,
                encode_ms,
                write_ms,
                stored,
                "estimator checkpoint"
            );
            if let Ok(mut c) = me.round.checkpoint.lock() {
                c.writing = false;
                if stored {
                    c.stored = Some((version, generation));
                }
            }
        });
    }

    /// The observations reported since the last round, taken (`observe`; else left for the
    /// next round, and none taken), their demand counted per cycle over the period since the
    /// last round (or since `previous` was solved) until `now`, and held to their bounds again.
    fn take_pending(
        &self,
        now: i64,
        observe: bool,
        previous: Option<&Snapshot>,
    ) -> Result<Pending, LoopError> {
        let mut pending = {
            let mut p = self
                .intake
                .pending
                .lock()
                .map_err(|_| LoopError::Poisoned("pending"))?;
            if observe {
                let taken = std::mem::take(&mut *p);
                p.since_ms = Some(now);
                // Reports admitted and not yet stored land in the next period: they count
                // against its bounds.
                p.ledger = taken.ledger.next_period();
                taken
            } else {
                Pending::default()
            }
        };
        let period_start = pending
            .since_ms
            .or(previous.map(|p| p.solved_at_unix_ms))
            .unwrap_or(now);
        per_cycle(
            &mut pending.demand,
            now.saturating_sub(period_start),
            self.config.cycle_secs as i64 * 1_000,
        );
        // A period shorter than a cycle was scaled up: each unit is held to its bound again.
        if let Some(reference) = self.reference() {
            let clipped = cdnmap_engine::budget::limit_period(
                &mut pending.demand,
                &reference.snapshot.topology,
                &reference.classes,
                self.config.feedback_max_demand_ratio,
            );
            if clipped > 0 {
                metrics::counter!("cdnmap_feedback_clipped_total").increment(clipped as u64);
                tracing::debug!(clipped, "the round's observed demand clipped to its bounds");
            }
        }
        Ok(pending)
    }

    /// A standby seeds from the leader's published map (what clients were answered from),
    /// not from its own unpublished one: the replicas' own maps drift apart (a sticky round
    /// depends on the map it starts from), and a takeover would move the difference. So is a
    /// standby's first round as leader: the leader's map is used while it is newer than what
    /// this replica last published. `None`: the round seeds from `previous`.
    fn leader_seed(&self, previous: Option<&Snapshot>) -> Option<cdnmap_mapper::Map> {
        let published = self.current().map_or((0, 0), |p| (p.epoch, p.version));
        match (previous, self.round.leader_map.load_full()) {
            (Some(prev), Some(leader)) if leader.identity.key() > published => {
                tracing::info!(
                    leader_epoch = leader.identity.epoch,
                    leader_version = leader.identity.version,
                    "the round is seeded from the leader's map"
                );
                Some(cdnmap_engine::round::map_of_shares(
                    &leader.map,
                    &prev.topology,
                ))
            }
            _ => None,
        }
    }

    /// The round itself, on a blocking thread: the observations since the last round through
    /// the round driver (the same step `cdnmap replay` runs), the record stored while the map
    /// is indexed ([`Shared::store_round`]). Returns the new snapshot, the driver's timings and
    /// how storing went.
    fn solve_round(&self, now: i64, epoch: u64, observe: bool) -> Result<Round, LoopError> {
        let versioned = self.topology.current_versioned();
        let (mut base, base_seq) = (Arc::clone(&versioned.topology), versioned.seq);
        if let Some(health) = &self.health {
            base = health.overlay(&base, |cluster, down, why| {
                self.read.activity.log_health(cluster, down, why, now);
                if down {
                    tracing::warn!(cluster, reason = why, "health checks: cluster down");
                } else {
                    tracing::info!(cluster, "health checks: cluster up again");
                }
            });
        }
        // Seeded from the last round's map (a standby's own, unpublished), else the map
        // served since the start.
        let previous = self
            .round
            .last_solved
            .load_full()
            .or_else(|| self.current());
        let pending = self.take_pending(now, observe, previous.as_deref())?;
        let observations = Observations {
            // The reports since the last round describe the period that began with it.
            at_unix_ms: previous.as_ref().map_or(now, |p| p.solved_at_unix_ms),
            demand: pending.demand,
            loads: pending.loads.into_iter().collect(),
            rtt: self.measured_rtt(&base, now),
        };
        let mut driver = self
            .round
            .driver
            .lock()
            .map_err(|_| LoopError::Poisoned("round driver"))?;
        let driver = driver.as_mut().ok_or_else(|| {
            LoopError::NoEstimator("its state and a fresh one both failed (see the log)".into())
        })?;
        let served = self.leader_seed(previous.as_deref());
        let (step, stored) = driver.step_alongside(
            &base,
            previous.as_deref(),
            served.as_ref(),
            &observations,
            |instance| self.rules(instance),
            epoch,
            now,
            |solved, estimates| self.store_round(base_seq, solved, estimates, &observations),
        )?;
        Ok(Round {
            snapshot: step.snapshot,
            timings: step.timings,
            stored,
            base_seq,
        })
    }

    fn round_metrics(&self, snapshot: &Snapshot, solve_ms: f64, published: bool) {
        metrics::counter!("cdnmap_rounds_total").increment(1);
        metrics::histogram!("cdnmap_solve_seconds").record(snapshot.timings.solve_ms / 1e3);
        metrics::counter!("cdnmap_proposals_total").increment(snapshot.stats.proposals);
        let overflow = map_gauges(snapshot);
        if !published {
            tracing::info!(
                epoch = snapshot.epoch,
                version = snapshot.version,
                solve_ms,
                "round solved, not published (a standby)"
            );
            return;
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
        let cycle = Duration::from_secs(self.config.cycle_secs);
        let replicated = self.lead.get().is_some();
        let mut tick = if replicated {
            // Replicas round at the same instants, the multiples of the cycle on the wall
            // clock: their estimators then see the reports through the same periods, and a
            // standby's map is the leader's (measured with noisy reports, rounds of arbitrary
            // phase made takeovers move several times what an ordinary round moves).
            let cycle_ms = cycle.as_millis() as i64;
            let wait = cycle_ms - now_unix_ms().rem_euclid(cycle_ms);
            let mut t = tokio::time::interval_at(
                tokio::time::Instant::now() + Duration::from_millis(wait as u64),
                cycle,
            );
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            t
        } else {
            let mut t = tokio::time::interval(cycle);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        };
        if self.current().is_some() && !replicated {
            tick.tick().await; // a restored map is served until the first full cycle has passed
        }
        // A replica that wins the election runs a round at once (a takeover does not wait
        // for the next tick).
        let mut lead = self.lead.get().map(|c| c.status());
        let mut leading = false;
        while !*stop.borrow() {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
                won = leadership_won(&mut lead, &mut leading) => {
                    if !won {
                        continue;
                    }
                    // The new leader's topology first has every edit its predecessor made,
                    // and its history every action.
                    match self.sync_edits().await {
                        Ok(n) => tracing::info!(edits = n, "elected: a round now"),
                        Err(e) => tracing::error!(error = %e, "elected, with the replicas' edits not all applied: a round now"),
                    }
                    match self.sync_history().await {
                        Ok(n) => tracing::info!(records = n, "elected: the change history taken over"),
                        Err(e) => tracing::error!(error = %e, "elected, with the replicas' change history not all read"),
                    }
                    // It observes nothing new, and the rounds after it keep the replicas'
                    // common schedule: the period's reports go to the next one.
                    self.round_at(now_unix_ms(), false).await;
                    continue;
                }
            }
            // A round in progress finishes (and persists) before the loop looks at `stop`.
            self.run_round().await;
        }
    }
}

/// Waits for the election's next change; true when it made this replica the leader (it was
/// not). Never ready without an election.
async fn leadership_won(
    status: &mut Option<tokio::sync::watch::Receiver<crate::lead::Status>>,
    leading: &mut bool,
) -> bool {
    let Some(rx) = status else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        return std::future::pending().await;
    }
    let leads = matches!(
        rx.borrow_and_update().role,
        Some(cdnmap_lead::Role::Leader { .. })
    );
    let won = leads && !*leading;
    *leading = leads;
    won
}

/// The estimator's state at start: the checkpoint (`inline` in a record of format 03, else the
/// stored one) with the round entries after it up to the served record `served`, each read
/// from the store when it is replayed (the state after the served round, exactly); else a
/// fresh one. Also what the store holds as the last checkpoint (the next round writes one
/// when there is none).
fn restore_estimates(
    store: &Store,
    served: Option<u64>,
    inline: EstimatorLog,
    topology: &Topology,
) -> anyhow::Result<(Estimates, Checkpointed)> {
    let fresh = || -> anyhow::Result<(Estimates, Checkpointed)> {
        Ok((Estimates::new(topology)?, Checkpointed::default()))
    };
    let Some(served) = served else {
        return fresh();
    };
    // The checkpoint is decoded as it is read from its file (at 11 M map units 1.4 GB of
    // bytes that are never beside the state they decode to).
    let read = match inline.checkpoint {
        Some((version, state)) => Some((version, Estimates::from_bytes(&state, topology))),
        None => store.read_estimator_checkpoint(|_, r| Estimates::read_from(r, topology))?,
    };
    let Some((version, read)) = read else {
        return fresh();
    };
    // A round whose write failed ends the entries: the state replays up to it.
    let entries = (version.saturating_add(1)..=served).map_while(|v| match store.estimator_entry(v) {
        Ok(entry) => entry,
        Err(e) => {
            tracing::warn!(error = %e, version = v, "an estimator entry is unreadable: replay stops before it");
            None
        }
    });
    match read.and_then(|est| est.replayed(entries, topology)) {
        Ok((est, replayed, stopped)) => {
            if let Some(e) = stopped {
                tracing::warn!(error = %e, replayed, "the estimator's state is that of an earlier round");
            } else {
                tracing::info!(checkpoint = version, replayed, "estimator state restored");
            }
            let stored = Some((version, est.generation()));
            Ok((
                est,
                Checkpointed {
                    stored,
                    writing: false,
                },
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "the estimator starts afresh");
            fresh()
        }
    }
}

/// The topology a start serves: the stored one (where a stored file is damaged, the newest
/// state that reads, each file or edit skipped said here: `cdnmap_store`'s `recover`), else
/// `initial`'s, whose own error is the start's, as it is (a bad instance file, say).
fn start_topology(
    store: &Store,
    config: &Config,
    initial: impl FnOnce() -> anyhow::Result<Topology>,
) -> anyhow::Result<cdnmap_store::StartTopology> {
    let mut initial_error = None;
    let start = store.start_topology(Limits::default(), || {
        initial().map_err(|e| {
            let said = format!("{e:#}");
            initial_error = Some(e);
            said
        })
    });
    let start = match (start, initial_error) {
        (Err(_), Some(e)) => return Err(e),
        (start, _) => start?,
    };
    for skipped in &start.skipped {
        tracing::error!(data_dir = %config.data_dir.display(), "the start skipped: {skipped}");
    }
    if !start.fresh {
        tracing::info!(
            map_units = start.topology.unit_count(),
            clusters = start.topology.clusters().len(),
            exact = start.exact,
            "serving the stored topology (with every acknowledged edit, unless said above)"
        );
        if let Some(path) = &config.instance {
            tracing::warn!(
                instance = %path.display(),
                data_dir = %config.data_dir.display(),
                "the configured instance file is not read: the store's topology is \
                 served (start on an empty data_dir to serve the file)"
            );
        }
    }
    Ok(start)
}

/// What of the configuration names the topology's parts: every class the name rules, the
/// default class and `bypass` name must be the topology's (refused here, naming it, rather
/// than by every round after the start); a selection override naming a cluster that is gone
/// is a warning.
fn check_against_topology(config: &Config, topology: &Topology) -> anyhow::Result<()> {
    ClassRules::for_instance(
        &topology.instance,
        &config.class_rule_pairs(),
        &config.default_class,
    )
    .map_err(|e| anyhow::anyhow!("the configuration's class_rules and default_class: {e}"))?;
    if let Some(class) = config
        .bypass
        .keys()
        .find(|k| topology.instance.class_index(k).is_none())
    {
        anyhow::bail!(
            "the configuration's bypass.{class}: the topology has no traffic class {class:?}"
        );
    }
    if let Err(e) = config.selection.check_clusters(topology) {
        tracing::warn!(error = %e, "the selection override is not used");
    }
    Ok(())
}

/// The served record a start serves, and the version of one moved aside. Its base is most
/// often the stored topology itself (no edit since): then it is not rebuilt a second time.
/// A damaged record is moved aside, said here: the first round then maps afresh.
fn start_served(
    store: &Store,
    config: &Config,
    start: &cdnmap_store::StartTopology,
) -> anyhow::Result<(Option<Served>, Option<u64>)> {
    let from_store = store.start_served(start)?;
    for skipped in &from_store.skipped {
        tracing::error!(data_dir = %config.data_dir.display(), "the start skipped: {skipped}");
    }
    let served = match from_store.served {
        Some(s) => Some(s),
        None if from_store.skipped_version.is_none() => legacy_served(store, &start.topology),
        None => None,
    };
    Ok((served, from_store.skipped_version))
}

/// The newest map of a store written before the served record existed, read against the
/// stored topology; when an edit since makes it unreadable, the start goes on without it
/// (the first round is then a cold one).
fn legacy_served(store: &Store, topology: &Topology) -> Option<Served> {
    match store.latest_map(topology) {
        Ok(Some((meta, map))) => Some(Served {
            epoch: 0,
            version: meta.version,
            solved_at_unix_ms: meta.solved_at_unix_ms,
            topology: topology.clone(),
            map,
            estimator: EstimatorLog::default(),
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
    /// round maps with it) and logs the action with `actor`. The operators' way in is the
    /// `guard` module's `set_cluster_state`, which holds the change to `[guard]` first; this
    /// is its last step.
    pub async fn set_cluster_state(
        &self,
        id: &str,
        state: ClusterState,
        reason: &str,
        actor: crate::topology::Actor,
    ) -> Result<Applied, ChangeError> {
        self.set_cluster_state_predicted(id, state, reason, actor, None)
            .await
    }

    /// [`Shared::set_cluster_state`] with what the preview it is applied after `predicted`,
    /// for the change history.
    pub async fn set_cluster_state_predicted(
        &self,
        id: &str,
        state: ClusterState,
        reason: &str,
        actor: crate::topology::Actor,
        predicted: Option<crate::topology::Outcome>,
    ) -> Result<Applied, ChangeError> {
        let (who, via) = (actor.who.clone(), actor.via);
        let applied = self
            .topology
            .change(Change::ClusterState {
                id: id.to_string(),
                state,
                reason: reason.to_string(),
                actor,
                predicted,
            })
            .await?;
        tracing::warn!(cluster = %id, before = ?applied.before, ?state, reason = %reason, who = %who, via, "cluster state set");
        Ok(applied)
    }

    /// Carries out `change` through the topology writer (stored, then published), as Admin's
    /// handlers do.
    pub async fn change(&self, change: Change) -> Result<Applied, ChangeError> {
        self.topology.change(change).await
    }

    /// The topology the next round solves (with every change so far).
    pub fn topology_now(&self) -> Arc<Topology> {
        self.topology.current()
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn round_status(&self) -> RoundStatus {
        self.read
            .status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    pub(crate) fn activity(&self) -> &crate::activity::Activity {
        &self.read.activity
    }

    /// Reads the estimator's state (the dashboard shows its coefficients and deratings).
    pub(crate) fn with_estimates<R>(&self, f: impl FnOnce(&Estimates) -> R) -> Option<R> {
        self.round
            .driver
            .lock()
            .ok()
            .and_then(|d| d.as_ref().map(|d| f(d.estimates())))
    }
}

/// Lowers the calling thread's CPU priority to nice 10 at least (about a tenth of a core's time against a
/// thread of the default priority that wants it), for work that must not slow serving. On
/// Linux the nice value is a thread's own (setpriority(2) with a thread id); elsewhere this
/// does nothing. A failure (a sandbox that forbids it) is logged, and the work goes on.
pub fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid, getpriority and setpriority take no pointers and have no
        // preconditions. A thread already below nice 10 stays where it is.
        let tid = unsafe { libc::gettid() } as libc::id_t;
        let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
        let done = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, now.max(10)) };
        if done != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "the thread's priority stays");
        }
    }
}

/// The parts of a round `cdnmap_round_part_seconds{part}` times, in their order.
pub const ROUND_PARTS: [&str; 6] = [
    "estimator",
    "effective_preferences",
    "solve",
    "index",
    "publish",
    "persist",
];

/// Sets the gauges that describe the map of `snapshot` (churn, demand, overflow, each
/// cluster's utilization); returns its overflow. Ratios are exact where the answer is (an
/// unchanged map's churn is 0, a full cluster's utilization 1: `mapper::churn`,
/// `engine::round::utilization`), and the overflow ratio is clamped to [0, 1], which the
/// map's conservation of demand guarantees up to rounding.
pub(crate) fn map_gauges(snapshot: &Snapshot) -> f64 {
    metrics::gauge!("cdnmap_churn_ratio").set(snapshot.churn.unwrap_or(0.0));
    let demand = snapshot.topology.total_demand();
    metrics::gauge!("cdnmap_demand").set(demand);
    let overflow = snapshot.map.total_overflow();
    metrics::gauge!("cdnmap_overflow_ratio").set(if demand > 0.0 {
        (overflow / demand).clamp(0.0, 1.0)
    } else {
        0.0
    });
    let utilization = cdnmap_engine::round::utilization(&snapshot.topology, &snapshot.map);
    let by_cluster = snapshot.topology.clusters().iter().zip(utilization);
    CLUSTER_UTILIZATION.store(Some(Arc::new(
        by_cluster.map(|(c, u)| (c.id.clone(), u)).collect(),
    )));
    overflow
}

/// The last map's utilization of each of its clusters, by id, as [`render_cluster_utilization`]
/// writes it at each scrape. Not a gauge of the recorder: a gauge keeps its last value until
/// the process ends, so a cluster deleted or renamed would read on (and an alert on it fire)
/// with no cluster behind it, and every id ever used would stay a series.
static CLUSTER_UTILIZATION: ArcSwapOption<Vec<(String, f64)>> = ArcSwapOption::const_empty();

/// Appends `cdnmap_cluster_utilization_ratio{cluster}` for the clusters of the last map set by
/// [`map_gauges`] (nothing before the first map) to a scrape's text, `out`.
pub fn render_cluster_utilization(out: &mut String) {
    use std::fmt::Write as _;
    let Some(clusters) = CLUSTER_UTILIZATION.load_full() else {
        return;
    };
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let name = "cdnmap_cluster_utilization_ratio";
    let _ = write!(
        out,
        "# HELP {name} Per cluster of the last round's map, the largest used/capacity over its \
         resource nodes (exactly 1 when full; above 1 only when over capacity).\n\
         # TYPE {name} gauge\n"
    );
    for (id, u) in clusters.iter() {
        let _ = writeln!(
            out,
            "{name}{{cluster=\"{}\"}} {}",
            label_value(id),
            sample_value(*u)
        );
    }
    out.push('\n');
}

/// A label value escaped as the text format asks (backslash, double quote, line feed).
fn label_value(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

/// A sample value as the text format writes it (`NaN`, `+Inf`, `-Inf`, else the number).
fn sample_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_proto::v1 as pb;
    use pb::feedback_server::Feedback;

    /// The thread that lowers its priority has nice 10 (the kernel's own record of it, field
    /// 19 of /proc/thread-self/stat); the thread that called it is untouched.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_lowered_thread_runs_at_nice_10_and_only_it() {
        fn nice() -> i64 {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
            // After the command name in parentheses: state is field 3, nice field 19.
            let rest = &stat[stat.rfind(')').expect("comm") + 2..];
            rest.split(' ')
                .nth(16)
                .expect("nice")
                .parse()
                .expect("a number")
        }
        let before = nice();
        let lowered = std::thread::spawn(|| {
            lower_thread_priority();
            nice()
        })
        .join()
        .expect("thread");
        assert_eq!(lowered, before.max(10));
        assert_eq!(nice(), before);
    }

    /// A period's counts are the demand of a cycle: kept as reported within the slack, scaled
    /// beyond it (a long round's period down, a short one's up), unreported units untouched.
    #[test]
    fn a_period_longer_or_shorter_than_the_cycle_is_counted_as_one_cycle() {
        let inst = crate::mapping::tests::instance();
        let column = |period_ms: i64| {
            let mut d = cdnmap_estimator::observed::UnitDemand::new(&inst);
            d.add(0, 100.0);
            per_cycle(&mut d, period_ms, 10_000);
            d.values_for(&inst).into_owned()
        };
        assert_eq!(column(10_000)[0], 100.0);
        assert_eq!(column(10_900)[0], 100.0, "within the slack");
        assert_eq!(column(25_000)[0], 40.0);
        assert_eq!(column(5_000)[0], 200.0);
        assert_eq!(
            column(10)[0],
            1_000.0,
            "a period under a second is a second"
        );
        assert!(column(25_000)[1..].iter().all(|v| v.is_nan()));
    }

    /// A runtime of two worker threads, as a test of a start and its rounds runs on.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    }

    /// Starts the service on `config`'s store once the last start's store has let go of its
    /// lock (sled releases it a moment after the last handle is dropped).
    fn start(config: &Config) -> Arc<Shared> {
        let started = Instant::now();
        loop {
            match Shared::start(config.clone(), || Ok(crate::mapping::tests::instance())) {
                Ok(s) => return s,
                Err(e) if started.elapsed() < Duration::from_secs(10) => {
                    assert!(e.to_string().contains("lock"), "start: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("start: {e}"),
            }
        }
    }

    /// Demand for most units (a few unreported each round), different every round.
    async fn report(shared: &Arc<Shared>, r: i64) {
        let units = crate::mapping::tests::instance();
        let samples = (0..units.unit_count() as u32)
            .filter(|u| !(u + r as u32).is_multiple_of(7))
            .map(|u| pb::DemandSample {
                target: Some(pb::demand_sample::Target::MapUnit(units.unit_id(u).into())),
                traffic_class: String::new(),
                queries: 1.0 + f64::from(u % 5) * 0.37 + r as f64 * 0.11,
            })
            .collect();
        crate::feedback::FeedbackService(Arc::clone(shared))
            .report_demand(tonic::Request::new(pb::DemandReport {
                reporter: "test".into(),
                period_start_unix_ms: 0,
                period_end_unix_ms: 0,
                samples,
            }))
            .await
            .expect("ReportDemand");
    }

    async fn checkpoint_written(shared: &Shared) -> Option<(u64, u64)> {
        for _ in 0..500 {
            match shared.round.checkpoint.lock() {
                Ok(c) if !c.writing => return c.stored,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        panic!("the checkpoint is still being written after 5 s");
    }

    /// Rounds with demand reports, then a restart: the estimator's state is the one before,
    /// bit for bit, rebuilt from the checkpoint of the first round and the entries of every
    /// round after it; a checkpoint [`CHECKPOINT_ROUNDS`] later covers the entries before it,
    /// and a restart from it is exact too.
    #[test]
    fn a_restart_restores_the_estimators_state_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        let mut rounds = 0i64;
        let mut before: Option<(Vec<u8>, u64)> = None;
        for (run, more) in [(0, 6), (1, CHECKPOINT_ROUNDS as i64 + 2), (2, 1)] {
            let rt = runtime();
            let after = rt.block_on(async {
                let shared = start(&config);
                if let Some((state, version)) = before.take() {
                    // What this start serves (at once) and estimates with (once restored
                    // beside it), before any round of its own.
                    assert_eq!(shared.current().map(|s| s.version), Some(version));
                    shared.estimator_restored().await;
                    let restored = shared.with_estimates(Estimates::to_bytes);
                    assert!(
                        restored == Some(state),
                        "start {run}: another estimator state"
                    );
                    assert_eq!(shared.current().map(|s| s.version), Some(version));
                }
                for _ in 0..more {
                    if rounds > 0 {
                        report(&shared, rounds).await;
                    }
                    shared.run_round_at(rounds * 10_000).await;
                    rounds += 1;
                }
                let stored = checkpoint_written(&shared).await.expect("a checkpoint");
                if run == 1 {
                    assert!(stored.0 > 1, "a later checkpoint: {stored:?}");
                }
                let version = shared.current().expect("a map").version;
                (shared.with_estimates(Estimates::to_bytes), version)
            });
            drop(rt);
            before = Some((after.0.expect("the state"), after.1));
        }
    }

    /// A round whose map cannot be stored is not published (issue 41, finding 6): Status says
    /// the round failed and why, the map served stays the last stored one, a WatchMap client
    /// gets the next stored version as a delta from the one it holds, and a restart serves the
    /// version clients last saw. The store's `values` directory is swapped for a file, so every
    /// value write fails as on a full disk.
    #[test]
    fn a_round_that_cannot_be_stored_is_not_published() {
        use pb::mapping_server::Mapping;
        use tokio_stream::StreamExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        let values = config.data_dir.join("values");
        let away = dir.path().join("values-away");
        let rt = runtime();
        rt.block_on(async {
            let shared = start(&config);
            shared.run_round_at(0).await;
            let first = shared.current().expect("a map");
            let mut watch = crate::mapping::MappingService::new(Arc::clone(&shared))
                .watch_map(tonic::Request::new(pb::WatchMapRequest::default()))
                .await
                .expect("WatchMap")
                .into_inner();
            let full = watch.next().await.expect("a message").expect("a full map");
            assert_eq!((full.full, full.version), (true, first.version));
            let mut more = full.more;
            while more {
                more = watch.next().await.expect("a part").expect("a part").more;
            }

            std::fs::rename(&values, &away).expect("moving values/ away");
            std::fs::write(&values, b"a file where the directory was").expect("a file");
            report(&shared, 1).await;
            shared.run_round_at(10_000).await;
            let status = shared.round_status();
            assert!(status.failed, "{status:?}");
            assert!(
                status.error.contains(&format!(
                    "storing map version {} failed, so it was not published",
                    first.version + 1
                )),
                "{status:?}"
            );
            assert_eq!(shared.current().map(|s| s.version), Some(first.version));

            std::fs::remove_file(&values).expect("removing the file");
            std::fs::rename(&away, &values).expect("values/ back");
            shared.run_round_at(20_000).await;
            let status = shared.round_status();
            assert!(!status.failed, "{status:?}");
            let next = shared.current().expect("a map");
            assert_eq!(next.version, first.version + 2, "a version is never reused");
            let delta = tokio::time::timeout(Duration::from_secs(10), watch.next())
                .await
                .expect("an update within 10 s")
                .expect("a message")
                .expect("a delta");
            assert_eq!(
                (delta.full, delta.base_version, delta.version),
                (false, first.version, next.version)
            );
        });
        drop(rt);
        let rt = runtime();
        rt.block_on(async {
            let shared = start(&config);
            assert_eq!(
                shared.current().map(|s| s.version),
                Some(3),
                "the restart serves the version clients saw last"
            );
        });
    }
}
