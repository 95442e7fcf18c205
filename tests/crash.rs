//! A kill -9 campaign (issue 17, point 7): one `cdnmap serve` on loopback is killed with
//! SIGKILL [`KILLS`] times, each time at a random moment while clients are writing, and
//! restarted on the same store each time. Nothing it acknowledged may be lost, and every
//! restart must serve.
//!
//! The writers, all at once: Admin clients, each changing only its own clusters and map units
//! (a cluster's state through Admin.SetClusterState and through the dashboard's POST, a
//! cluster replaced by Admin.UpsertCluster with another capacity and state, a unit's demand
//! edited, a unit deleted and put back), and front ends sending Feedback.ReportDemand with
//! their `feedback_tokens`. Each writes one change at a time and waits for its answer. A change
//! whose answer came back OK is *acknowledged*; the one whose answer did not come (the server
//! died under it, or before it was sent) is *in flight*: its outcome is unknown. An error
//! while the server is up fails the test.
//!
//! After every restart:
//! - each Admin key (a cluster's state and root capacity, a unit's demand or its absence)
//!   holds the last value acknowledged for it, or, when the change in flight at the kill was
//!   to that key, that change's value; what is found is what the next check starts from;
//! - the demand record (`GET /record`) holds every acknowledged report exactly once, under
//!   the name of its front end's token (not the name the report claims) and with the units it
//!   named, in order (each report's period end is a marker no other report has); a report in
//!   flight at most once, and found there (or not) it stays so at every later check; no
//!   report that was never sent;
//! - the server serves: it is healthy, Resolve answers for a unit no one edits, WatchMap's
//!   first message is a whole map a front end accepts, and that map is never older (epoch,
//!   version) than the one the restart before served, nor than any map a WatchMap stream saw
//!   published before the kill (a round stores its record before it publishes: a front end
//!   never sees a map a restart forgets).
//!
//! Most kills come within [`KILL_WINDOW_MS`] of the writers starting. Every
//! [`ROUND_KILL_EVERY`]th comes around the restarted server's first round instead, from
//! [`ROUND_KILL_BEFORE_MS`] before it is due to [`ROUND_KILL_AFTER_MS`] after (with the
//! writers going, a round of the demo world takes about 100 ms on two cores: solving,
//! storing its record, publishing, writing the estimator's checkpoint); no round runs in the
//! other phases, a restart serving its stored map for a whole cycle. And now and then a start
//! is killed within [`START_KILL_WINDOW_MS`] of its launch, before or just after it listens
//! (the first start too, whose first round stores the first map). The moments and the
//! changes are drawn from a seeded generator: the seed is printed, and `CDNMAP_CRASH_SEED=N`
//! replays its choices (the processes' timing is the machine's).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdnmap_proto::v1 as pb;
use cdnmap_proto::v1::admin_client::AdminClient;
use cdnmap_proto::v1::feedback_client::FeedbackClient;
use cdnmap_tests::bin;
use cdnmap_tests::mapper::{
    all_clusters, all_units, authed, ok, resolves, status, try_http_post, unit_sample, Server,
    Setup, CYCLE_SECS, TOKEN,
};
use serde_json::Value as Json;
use tonic::transport::Channel;

/// Kills while clients write (kills of a start come on top).
const KILLS: usize = 30;
/// A kill comes up to this long after the writers start.
const KILL_WINDOW_MS: u64 = 1_500;
/// Every this many kills, the kill comes around the restarted server's first round, which is
/// due [`CYCLE_SECS`] after the server listens: from this long before...
const ROUND_KILL_EVERY: usize = 6;
const ROUND_KILL_BEFORE_MS: u64 = 20;
/// ... to this long after.
const ROUND_KILL_AFTER_MS: u64 = 300;
/// In those phases, each client starts a write at most this often (elsewhere, one as soon
/// as the last is answered): their record and journal stay as large whatever the machine's
/// speed, and so do the checks' reads.
const ROUND_PHASE_WRITE_INTERVAL_MS: u64 = 10;
/// One start in this many is killed, up to [`START_KILL_WINDOW_MS`] after its launch.
const START_KILL_ONE_IN: u64 = 5;
const START_KILL_WINDOW_MS: u64 = 400;
/// How long a restarted server may take to stream its map, and a client to give up once the
/// server is dead.
const ANSWER_WAIT: Duration = Duration::from_secs(30);

const ADMIN_CLIENTS: usize = 3;
/// Each Admin client's own clusters and map units.
const CLUSTERS_EACH: usize = 3;
const UNITS_EACH: usize = 4;
const FRONT_ENDS: usize = 2;
/// Map units each front end reports on (its own, none of them edited).
const UNITS_REPORTED_EACH: usize = 200;
const SAMPLES_PER_REPORT_MAX: u64 = 6;
/// The most changes (or reports) one client makes between two kills.
const CHANGES_PER_PHASE_MAX: usize = 20_000;
/// The period end of the first report; each report's is its own (the marker that finds it in
/// the record).
const MARKER_BASE_MS: i64 = 1_800_000_000_000;
const SEED_VAR: &str = "CDNMAP_CRASH_SEED";

/// A cluster's states with the dashboard's names for them.
const STATES: [(pb::ClusterState, &str); 3] = [
    (pb::ClusterState::Up, "up"),
    (pb::ClusterState::Drained, "drained"),
    (pb::ClusterState::Down, "down"),
];

/// SplitMix64 (Steele, Lea and Flood, 2014): a small seeded generator, enough to draw the
/// campaign's moments and changes (the test crate has no `rand`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (the modulo's bias is far below anything a test could see).
    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next() % n
    }

    fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// A generator of its own for a client, drawn from this one.
    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
}

/// The seed: `CDNMAP_CRASH_SEED`, or the clock's nanoseconds.
fn seed() -> u64 {
    match std::env::var(SEED_VAR) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{SEED_VAR}={s:?} is not a u64: {e}")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    }
}

/// What an Admin client writes: a cluster or a map unit, by id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Cluster(String),
    Unit(String),
}

/// What a key holds.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    /// A cluster's state and its resource tree's root capacity.
    Cluster(i32, f64),
    /// A map unit's demand; `None` once deleted.
    Unit(Option<f64>),
}

/// One Admin client's keys: its clusters and map units as first listed (what its changes are
/// made from) and the value each holds as far as the client knows.
struct Owner {
    clusters: BTreeMap<String, pb::Cluster>,
    units: BTreeMap<String, pb::MapUnit>,
    known: BTreeMap<Key, Value>,
}

fn root_capacity(c: &pb::Cluster) -> f64 {
    c.resources.as_ref().map_or(f64::NAN, |r| r.capacity)
}

/// What one client did between two kills.
#[derive(Default)]
struct Phase {
    acknowledged: usize,
    /// An Admin client's change in flight at the kill.
    change: Option<(Key, Value)>,
    /// A front end's reports: acknowledged, and the one in flight at the kill.
    reports: Vec<i64>,
    report: Option<i64>,
    sent: BTreeMap<i64, Sent>,
    /// An error while the server was up.
    unexpected: Option<String>,
}

/// A report as the record must hold it: the front end's name and the units, in order.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    reporter: String,
    units: Vec<String>,
}

/// What the record must say of a report.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Present,
    Absent,
    /// In flight at a kill, not looked for since.
    Unknown,
}

/// What the clients of one phase share: the flag set just before the kill, and the least time
/// between the starts of two writes of one client (zero: none).
#[derive(Clone)]
struct Turn {
    killed: Arc<AtomicBool>,
    interval: Duration,
}

impl Turn {
    fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// Waits until write `i` of a client that began at `began` may start.
    async fn pace(&self, began: tokio::time::Instant, i: usize) {
        if !self.interval.is_zero() {
            tokio::time::sleep_until(began + self.interval * i as u32).await;
        }
    }
}

/// Makes one change of `owner`'s at random: the key, the value it then holds, and whether the
/// server acknowledged it (an error says what came back).
async fn change(
    admin: &mut AdminClient<Channel>,
    http: SocketAddr,
    owner: &Owner,
    rng: &mut Rng,
    reason: String,
) -> (Key, Value, Result<(), String>) {
    let grpc =
        |r: Result<(), tonic::Status>| r.map_err(|s| format!("{:?} {:?}", s.code(), s.message()));
    if rng.below(2) == 0 {
        let ids: Vec<&String> = owner.clusters.keys().collect();
        let id = ids[rng.index(ids.len())].clone();
        let key = Key::Cluster(id.clone());
        let Some(&Value::Cluster(_, capacity)) = owner.known.get(&key) else {
            panic!("cluster {id} has no known value");
        };
        let (state, name) = STATES[rng.index(STATES.len())];
        match rng.below(3) {
            0 => {
                let r = admin
                    .set_cluster_state(authed(
                        pb::SetClusterStateRequest {
                            id: id.clone(),
                            state: state as i32,
                            reason,
                            force: false,
                        },
                        Some(TOKEN),
                    ))
                    .await
                    .map(|_| ());
                (key, Value::Cluster(state as i32, capacity), grpc(r))
            }
            1 => {
                let path = format!("/api/clusters/{id}/state");
                let body = format!("{{\"state\": \"{name}\", \"reason\": \"{reason}\"}}");
                let posted = tokio::task::spawn_blocking(move || {
                    let auth = format!("Bearer {TOKEN}");
                    try_http_post(http, &path, &[("Authorization", &auth)], &body)
                })
                .await
                .expect("the POST's thread");
                let r = match posted {
                    Ok((line, _)) if line.contains(" 200 ") => Ok(()),
                    Ok((line, body)) => Err(format!("POST: {line:?} {body}")),
                    Err(e) => Err(format!("POST: {e}")),
                };
                (key, Value::Cluster(state as i32, capacity), r)
            }
            _ => {
                let mut c = owner.clusters[&id].clone();
                let capacity = root_capacity(&c) * (1 + rng.below(4)) as f64;
                c.state = state as i32;
                if let Some(root) = c.resources.as_mut() {
                    root.capacity = capacity;
                }
                let r = admin
                    .upsert_cluster(authed(c, Some(TOKEN)))
                    .await
                    .map(|_| ());
                (key, Value::Cluster(state as i32, capacity), grpc(r))
            }
        }
    } else {
        let ids: Vec<&String> = owner.units.keys().collect();
        let id = ids[rng.index(ids.len())].clone();
        let key = Key::Unit(id.clone());
        let present = matches!(owner.known.get(&key), Some(Value::Unit(Some(_))));
        if present && rng.below(4) == 0 {
            let r = admin
                .delete_map_unit(authed(pb::DeleteRequest { id }, Some(TOKEN)))
                .await
                .map(|_| ());
            (key, Value::Unit(None), grpc(r))
        } else {
            let mut u = owner.units[&id].clone();
            u.demand = rng.below(100_000) as f64 + 0.25;
            let demand = u.demand;
            let r = admin
                .upsert_map_unit(authed(u, Some(TOKEN)))
                .await
                .map(|_| ());
            (key, Value::Unit(Some(demand)), grpc(r))
        }
    }
}

/// An Admin client: changes one at a time until one is not answered (or the phase's limit).
async fn admin_client(
    mut admin: AdminClient<Channel>,
    http: SocketAddr,
    mut owner: Owner,
    mut rng: Rng,
    tag: String,
    turn: Turn,
) -> (Owner, Phase) {
    let mut phase = Phase::default();
    let began = tokio::time::Instant::now();
    for i in 0..CHANGES_PER_PHASE_MAX {
        turn.pace(began, i).await;
        let reason = format!("crash {tag}/{i}");
        let (key, value, r) = change(&mut admin, http, &owner, &mut rng, reason).await;
        match r {
            Ok(()) => {
                owner.known.insert(key, value);
                phase.acknowledged += 1;
            }
            Err(e) => {
                if !turn.killed() {
                    phase.unexpected = Some(format!("{key:?} := {value:?}: {e}"));
                }
                phase.change = Some((key, value));
                break;
            }
        }
    }
    (owner, phase)
}

/// A front end: demand reports one at a time, each of 1 to [`SAMPLES_PER_REPORT_MAX`] samples
/// of units of `pool`, each marked by its period end (`first_marker`, then up), until one is
/// not answered (or the phase's limit).
async fn front_end(
    mut feedback: FeedbackClient<Channel>,
    name: String,
    token: String,
    pool: Arc<Vec<pb::MapUnit>>,
    mut rng: Rng,
    first_marker: i64,
    turn: Turn,
) -> Phase {
    let mut phase = Phase::default();
    let began = tokio::time::Instant::now();
    for i in 0..CHANGES_PER_PHASE_MAX {
        turn.pace(began, i).await;
        let marker = first_marker + i as i64;
        let n = 1 + rng.below(SAMPLES_PER_REPORT_MAX);
        let picked: Vec<&pb::MapUnit> = (0..n).map(|_| &pool[rng.index(pool.len())]).collect();
        let samples = picked
            .iter()
            .map(|u| unit_sample(u, (1 + rng.below(50)) as f64))
            .collect();
        phase.sent.insert(
            marker,
            Sent {
                reporter: name.clone(),
                units: picked.iter().map(|u| u.id.clone()).collect(),
            },
        );
        let report = pb::DemandReport {
            // The token names the front end, whatever the report claims.
            reporter: format!("claims-to-be-{name}"),
            period_start_unix_ms: marker - CYCLE_SECS as i64 * 1_000,
            period_end_unix_ms: marker,
            samples,
        };
        match feedback.report_demand(authed(report, Some(&token))).await {
            Ok(ack) if ack.get_ref().accepted == n => {
                phase.reports.push(marker);
                phase.acknowledged += 1;
            }
            Ok(ack) => {
                phase.unexpected = Some(format!(
                    "report {marker}: {} of {n} samples accepted",
                    ack.get_ref().accepted
                ));
                break;
            }
            Err(s) => {
                if !turn.killed() {
                    phase.unexpected =
                        Some(format!("report {marker}: {:?} {:?}", s.code(), s.message()));
                }
                phase.report = Some(marker);
                break;
            }
        }
    }
    phase
}

/// The front ends' names and tokens (`feedback_tokens`).
fn front_ends() -> Vec<(String, String)> {
    (0..FRONT_ENDS)
        .map(|f| (format!("fe-crash-{f}"), format!("fe-crash-{f}-token-9c1e")))
        .collect()
}

/// The last `n` lines of a server's log, for a failure's message.
fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// How long ago the server said where it listens, by the time of day (UTC) its log line
/// begins with and the clock's; `None` when the line has no such time.
fn since_listening(log: &str) -> Option<Duration> {
    let line = log.lines().find(|l| l.contains(" listening "))?;
    let time = line.split_whitespace().next()?.split_once('T')?.1;
    let mut hms = time.strip_suffix('Z')?.split(':');
    let mut next = || hms.next()?.parse::<f64>().ok();
    let said = next()? * 3_600.0 + next()? * 60.0 + next()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some(Duration::from_secs_f64((now - said).rem_euclid(86_400.0)))
}

/// Follows WatchMap on `server` until the stream ends (the server is killed): the newest map
/// (epoch, version) it saw published.
fn watch_published(server: &Server) -> tokio::task::JoinHandle<Option<(u64, u64)>> {
    let mut mapping = server.mapping();
    tokio::spawn(async move {
        let mut newest = None;
        let Ok(stream) = mapping.watch_map(pb::WatchMapRequest::default()).await else {
            return newest;
        };
        let mut stream = stream.into_inner();
        while let Ok(Some(update)) = stream.message().await {
            newest = newest.max(Some((update.epoch, update.version)));
        }
        newest
    })
}

/// Everything the campaign knows, and the checks after a restart.
struct Campaign {
    seed: u64,
    owners: Vec<Owner>,
    /// Each Admin client's change in flight at the last kill.
    changes: Vec<Option<(Key, Value)>>,
    /// Every report sent, by marker, with what the record must say of it.
    reports: BTreeMap<i64, (Sent, Fate)>,
    /// A map unit no one edits or reports on.
    probe: pb::MapUnit,
    /// The map the last restart served first.
    served: Option<(u64, u64)>,
    /// Changes and reports in flight at a kill: (found holding their value, looked for).
    changes_applied: (usize, usize),
    reports_recorded: (usize, usize),
}

impl Campaign {
    /// The checks after restart `kill` (0: the first start), before which a WatchMap stream
    /// saw map `published` (the newest).
    async fn check(&mut self, server: &Server, kill: usize, published: Option<(u64, u64)>) {
        let seed = self.seed;
        let at = format!("seed {seed} ({SEED_VAR}), after kill {kill}");
        // Admin: each key holds its last acknowledged value, or its change in flight.
        let clusters: BTreeMap<String, Value> = all_clusters(server)
            .await
            .into_iter()
            .map(|c| (c.id.clone(), Value::Cluster(c.state, root_capacity(&c))))
            .collect();
        let units: BTreeMap<String, f64> = all_units(server)
            .await
            .into_iter()
            .map(|u| (u.id, u.demand))
            .collect();
        for (owner, in_flight) in self.owners.iter_mut().zip(&mut self.changes) {
            let in_flight = in_flight.take();
            for (key, known) in owner.known.iter_mut() {
                let found = match key {
                    Key::Cluster(id) => clusters
                        .get(id)
                        .unwrap_or_else(|| panic!("{at}: cluster {id} is gone"))
                        .clone(),
                    Key::Unit(id) => Value::Unit(units.get(id).copied()),
                };
                let also = in_flight.as_ref().filter(|(k, _)| k == key).map(|(_, v)| v);
                assert!(
                    found == *known || Some(&found) == also,
                    "{at}: {key:?} holds {found:?}; acknowledged {known:?}, in flight {also:?}\n{}",
                    tail(&server.log(), 40)
                );
                if also.is_some() {
                    self.changes_applied.1 += 1;
                    self.changes_applied.0 += usize::from(Some(&found) == also);
                }
                *known = found;
            }
        }

        // The demand record: every acknowledged report once, nothing never sent.
        let (line, body) = server.http_get_authed("/record?from_ms=0&to_ms=9223372036854775807");
        assert!(line.contains(" 200 "), "{at}: GET /record: {line}\n{body}");
        let mut recorded: BTreeMap<i64, Sent> = BTreeMap::new();
        for l in body.lines() {
            let j: Json =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{at}: a record line: {e}: {l}"));
            let demand = &j["report"]["demand"];
            let marker = demand["period_end_unix_ms"]
                .as_i64()
                .unwrap_or_else(|| panic!("{at}: a demand report with a period end: {l}"));
            let sent = Sent {
                reporter: j["reporter"].as_str().unwrap_or_default().to_string(),
                units: demand["samples"]
                    .as_array()
                    .map(|s| {
                        s.iter()
                            .map(|s| s["target"]["map_unit"].as_str().unwrap_or("?").into())
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            let before = recorded.insert(marker, sent);
            assert!(before.is_none(), "{at}: report {marker} is recorded twice");
        }
        for (marker, got) in &recorded {
            let Some((sent, _)) = self.reports.get(marker) else {
                panic!("{at}: the record holds report {marker}, which was never sent: {got:?}");
            };
            assert_eq!(got, sent, "{at}: report {marker} as recorded");
        }
        for (marker, (_, fate)) in self.reports.iter_mut() {
            let there = recorded.contains_key(marker);
            match *fate {
                Fate::Present => assert!(
                    there,
                    "{at}: report {marker} was acknowledged (or found before) and is not in the \
                     record ({} reports are)\n{}",
                    recorded.len(),
                    tail(&server.log(), 40)
                ),
                Fate::Absent => assert!(
                    !there,
                    "{at}: report {marker} was not in the record, now it is"
                ),
                Fate::Unknown => {
                    self.reports_recorded.1 += 1;
                    self.reports_recorded.0 += usize::from(there);
                    *fate = if there { Fate::Present } else { Fate::Absent };
                }
            }
        }

        // It serves: Resolve, and a whole map no older than the last restart's.
        let answer = resolves(server, &self.probe).await;
        assert!(answer.map_version > 0, "{at}: {answer:?}");
        let mut stream = server
            .mapping()
            .watch_map(pb::WatchMapRequest::default())
            .await
            .unwrap_or_else(|s| panic!("{at}: WatchMap: {s:?}"))
            .into_inner();
        let first = tokio::time::timeout(ANSWER_WAIT, stream.message())
            .await
            .unwrap_or_else(|_| panic!("{at}: no map within {ANSWER_WAIT:?}"))
            .unwrap_or_else(|s| panic!("{at}: WatchMap: {s:?}"))
            .unwrap_or_else(|| panic!("{at}: WatchMap ended before a map"));
        let map = cdnmap_serve::watch::readable(first)
            .unwrap_or_else(|e| panic!("{at}: the map served is not readable: {e}"));
        assert!(
            map.full && !map.units.is_empty(),
            "{at}: {} units",
            map.units.len()
        );
        let served = (map.epoch, map.version);
        assert!(
            self.served.is_none_or(|before| served >= before),
            "{at}: serves map {served:?}, older than {:?}, which the restart before served",
            self.served
        );
        assert!(
            published.is_none_or(|p| served >= p),
            "{at}: serves map {served:?}, older than {published:?}, published before the kill"
        );
        self.served = Some(served);
    }

    /// Takes in what the clients of the phase before kill `kill` did; returns (changes and
    /// reports acknowledged, clients with one in flight).
    fn take_in(
        &mut self,
        kill: usize,
        admin: Vec<(Owner, Phase)>,
        fed: Vec<Phase>,
    ) -> (usize, usize) {
        let at = format!("seed {} ({SEED_VAR}), before kill {kill}", self.seed);
        let (mut acknowledged, mut in_flight) = (0, 0);
        self.owners.clear();
        for (i, (owner, phase)) in admin.into_iter().enumerate() {
            if let Some(e) = phase.unexpected {
                panic!("{at}: Admin client {i} failed while the server was up: {e}");
            }
            acknowledged += phase.acknowledged;
            in_flight += usize::from(phase.change.is_some());
            self.owners.push(owner);
            self.changes[i] = phase.change;
        }
        for (f, phase) in fed.into_iter().enumerate() {
            if let Some(e) = phase.unexpected {
                panic!("{at}: front end {f} failed while the server was up: {e}");
            }
            acknowledged += phase.acknowledged;
            in_flight += usize::from(phase.report.is_some());
            let mut sent = phase.sent;
            for marker in phase.reports {
                let s = sent
                    .remove(&marker)
                    .expect("an acknowledged report was sent");
                self.reports.insert(marker, (s, Fate::Present));
            }
            if let Some(marker) = phase.report {
                let s = sent.remove(&marker).expect("the report in flight was sent");
                self.reports.insert(marker, (s, Fate::Unknown));
            }
            assert!(
                sent.is_empty(),
                "{at}: reports neither acknowledged nor in flight"
            );
        }
        (acknowledged, in_flight)
    }
}

/// Starts the server, after killing a start one time in [`START_KILL_ONE_IN`];
/// returns it and whether a start was killed.
async fn start(setup: &mut Setup, rng: &mut Rng) -> (Server, bool) {
    let killed = rng.below(START_KILL_ONE_IN) == 0;
    if killed {
        let mut early = setup.spawn();
        tokio::time::sleep(Duration::from_millis(rng.below(START_KILL_WINDOW_MS))).await;
        early.kill();
    }
    (setup.start().await, killed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_a_kill_minus_9_campaign_and_every_restart_serves() {
    let seed = seed();
    println!("kill -9 campaign: seed {seed} (replay with {SEED_VAR}={seed})");
    let mut rng = Rng(seed);
    let started = Instant::now();
    let tokens: String = front_ends()
        .iter()
        .map(|(name, token)| format!("{name:?} = {token:?}\n"))
        .collect();
    let mut setup = Setup::with_extra(bin!(), true, &format!("[feedback_tokens]\n{tokens}"));
    let (mut server, start_kills_first) = start(&mut setup, &mut rng).await;
    let mut start_kills = usize::from(start_kills_first);

    // Each Admin client's clusters and units, the front ends' units, and a unit for Resolve:
    // no two share one.
    let clusters = all_clusters(&server).await;
    let units = all_units(&server).await;
    let needed = ADMIN_CLIENTS * UNITS_EACH + FRONT_ENDS * UNITS_REPORTED_EACH + 1;
    assert!(units.len() >= needed && clusters.len() >= ADMIN_CLIENTS * CLUSTERS_EACH);
    let owners = (0..ADMIN_CLIENTS)
        .map(|a| {
            let clusters: BTreeMap<String, pb::Cluster> = clusters
                .iter()
                .skip(a)
                .step_by(ADMIN_CLIENTS)
                .take(CLUSTERS_EACH)
                .map(|c| (c.id.clone(), c.clone()))
                .collect();
            let units: BTreeMap<String, pb::MapUnit> = units[a * UNITS_EACH..][..UNITS_EACH]
                .iter()
                .map(|u| (u.id.clone(), u.clone()))
                .collect();
            let known = clusters
                .values()
                .map(|c| {
                    let v = Value::Cluster(c.state, root_capacity(c));
                    (Key::Cluster(c.id.clone()), v)
                })
                .chain(
                    units
                        .values()
                        .map(|u| (Key::Unit(u.id.clone()), Value::Unit(Some(u.demand)))),
                )
                .collect();
            Owner {
                clusters,
                units,
                known,
            }
        })
        .collect();
    let reported_from = ADMIN_CLIENTS * UNITS_EACH;
    let pools: Vec<Arc<Vec<pb::MapUnit>>> = (0..FRONT_ENDS)
        .map(|f| {
            let from = reported_from + f * UNITS_REPORTED_EACH;
            Arc::new(units[from..from + UNITS_REPORTED_EACH].to_vec())
        })
        .collect();
    let mut campaign = Campaign {
        seed,
        owners,
        changes: vec![None; ADMIN_CLIENTS],
        reports: BTreeMap::new(),
        probe: units[needed - 1].clone(),
        served: None,
        changes_applied: (0, 0),
        reports_recorded: (0, 0),
    };
    campaign.check(&server, 0, None).await;
    let mut ready = Instant::now();

    let (mut acknowledged, mut kills_in_flight, mut round_kills) = (0, 0, 0);
    let (mut rounds_published, mut rounds_stored) = (0, 0);
    for kill in 1..=KILLS {
        // What a front end following the map sees published until the kill.
        let watcher = watch_published(&server);
        let round_kill = kill % ROUND_KILL_EVERY == 0;
        let turn = Turn {
            killed: Arc::new(AtomicBool::new(false)),
            interval: if round_kill {
                Duration::from_millis(ROUND_PHASE_WRITE_INTERVAL_MS)
            } else {
                Duration::ZERO
            },
        };
        let admin: Vec<_> = std::mem::take(&mut campaign.owners)
            .into_iter()
            .enumerate()
            .map(|(a, owner)| {
                tokio::spawn(admin_client(
                    server.admin(),
                    server.http,
                    owner,
                    rng.fork(),
                    format!("{kill}/{a}"),
                    turn.clone(),
                ))
            })
            .collect();
        let fed: Vec<_> = front_ends()
            .into_iter()
            .enumerate()
            .map(|(f, (name, token))| {
                let first_marker =
                    MARKER_BASE_MS + ((kill * FRONT_ENDS + f) * CHANGES_PER_PHASE_MAX) as i64;
                tokio::spawn(front_end(
                    server.feedback(),
                    name,
                    token,
                    Arc::clone(&pools[f]),
                    rng.fork(),
                    first_marker,
                    turn.clone(),
                ))
            })
            .collect();

        // The moment: a random one soon, or around the first round after the restart.
        let restored = campaign.served;
        let how = if round_kill {
            round_kills += 1;
            let since = since_listening(&server.log()).unwrap_or_else(|| ready.elapsed());
            let offset_ms = rng.below(ROUND_KILL_BEFORE_MS + ROUND_KILL_AFTER_MS) as i64
                - ROUND_KILL_BEFORE_MS as i64;
            let due_ms = (CYCLE_SECS * 1_000) as i64 + offset_ms - since.as_millis() as i64;
            tokio::time::sleep(Duration::from_millis(due_ms.max(0) as u64)).await;
            format!("{offset_ms:+} ms from the first round's tick")
        } else {
            let ms = rng.below(KILL_WINDOW_MS);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            format!("{ms} ms in")
        };
        turn.killed.store(true, Ordering::SeqCst);
        server.kill();

        let mut admin_done = Vec::new();
        for j in admin {
            let done = tokio::time::timeout(ANSWER_WAIT, j)
                .await
                .unwrap_or_else(|_| {
                    panic!("seed {seed}: an Admin client still busy after kill {kill}")
                })
                .expect("an Admin client");
            admin_done.push(done);
        }
        let mut fed_done = Vec::new();
        for j in fed {
            let done = tokio::time::timeout(ANSWER_WAIT, j)
                .await
                .unwrap_or_else(|_| panic!("seed {seed}: a front end still busy after kill {kill}"))
                .expect("a front end");
            fed_done.push(done);
        }
        let published = tokio::time::timeout(ANSWER_WAIT, watcher)
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: WatchMap still open after kill {kill}"))
            .expect("the WatchMap follower");
        let (acked, in_flight) = campaign.take_in(kill, admin_done, fed_done);
        acknowledged += acked;
        kills_in_flight += usize::from(in_flight > 0);

        let (restarted, start_killed) = start(&mut setup, &mut rng).await;
        server = restarted;
        ready = Instant::now();
        start_kills += usize::from(start_killed);
        campaign.check(&server, kill, published).await;
        let round = if !round_kill {
            ""
        } else if published > restored {
            rounds_published += 1;
            "; the round was published"
        } else if campaign.served > restored {
            rounds_stored += 1;
            "; the round was stored (not seen published)"
        } else {
            "; the round was not stored"
        };
        let early = if start_killed { "; a start killed" } else { "" };
        println!(
            "kill {kill}: {how}, {acked} writes acknowledged, {in_flight} in flight{round}{early}"
        );
    }
    server.terminate().await;

    let (applied, changes) = campaign.changes_applied;
    let (recorded, reports) = campaign.reports_recorded;
    let first = if start_kills_first {
        ", the first one among them"
    } else {
        ""
    };
    println!(
        "seed {seed}: {KILLS} kills in {:.1} s ({round_kills} around a round: \
         {rounds_published} after it published, {rounds_stored} after it stored, not seen \
         published; {start_kills} starts killed besides{first}); {acknowledged} writes \
         acknowledged; in flight at a kill: {changes} Admin changes ({applied} found holding \
         their value), {reports} reports ({recorded} found recorded)",
        started.elapsed().as_secs_f64()
    );
    // The campaign did what it says: writes were acknowledged, and most kills came with some
    // in flight.
    assert!(
        acknowledged >= 10 * KILLS,
        "seed {seed}: only {acknowledged} writes acknowledged in {KILLS} phases"
    );
    assert!(
        kills_in_flight >= KILLS / 2,
        "seed {seed}: only {kills_in_flight} of {KILLS} kills came with a write in flight"
    );
}

/// Waits until `/metrics` says a map of version `version` or above is stored.
async fn stored_at_least(server: &Server, version: u64) {
    let started = Instant::now();
    loop {
        let (_, body) = server.http_get("/metrics");
        let stored = body
            .lines()
            .find_map(|l| l.strip_prefix("cdnmap_map_stored_version "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if stored.is_some_and(|s| s >= version as f64) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3 * CYCLE_SECS),
            "map version {version} not stored ({stored:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Flips one byte in the middle of each file of `values` whose name starts with `prefix`
/// (past the value's 24-byte header); their names.
fn damage(values: &std::path::Path, prefix: &str) -> Vec<String> {
    let mut damaged = Vec::new();
    for entry in std::fs::read_dir(values).expect("the store's values") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let Some(name) = name.filter(|n| n.starts_with(prefix) && !n.ends_with(".tmp")) else {
            continue;
        };
        let mut bytes = std::fs::read(&path).expect("a value file");
        let at = 24 + (bytes.len() - 24) / 2;
        bytes[at] ^= 0x55;
        std::fs::write(&path, &bytes).expect("damage it");
        damaged.push(name);
    }
    damaged.sort();
    damaged
}

/// Issue 41 (8): one damaged byte in the newest map file (every older version a delta of it),
/// or in the only topology snapshot, made every start exit 2. Killed, damaged and restarted,
/// the server serves: a damaged map file is moved aside, said in the log, and the first round
/// maps afresh under a new epoch; a damaged snapshot is replaced by the configured topology
/// (the demo world, which the header of the damaged file shows to be what it held) with the
/// journal's edits replayed, so the acknowledged edit is kept and the stored map served.
#[tokio::test]
async fn a_damaged_map_file_or_snapshot_is_skipped_and_the_restart_serves() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let values = setup.dir.path().join("data").join("values");
    let damaged_dir = setup.dir.path().join("data").join("damaged");
    let units = all_units(&server).await;
    let drained = all_clusters(&server).await.remove(0).id;
    set_state(&server, &drained, pb::ClusterState::Drained).await;
    let before = status(&server).await;
    stored_at_least(&server, before.map_version).await;
    let is_drained = |server: &Server| {
        let (server, drained) = (server.admin(), drained.clone());
        async move {
            let mut admin = server;
            let c = ok(
                admin
                    .get_cluster(authed(pb::GetClusterRequest { id: drained }, Some(TOKEN)))
                    .await,
                "GetCluster",
            );
            c.state == pb::ClusterState::Drained as i32
        }
    };
    server.kill();

    // The newest map file damaged.
    let maps = damage(&values, "map-");
    assert_eq!(maps.len(), 1, "one whole record: {maps:?}");
    let server = setup.start().await;
    resolves(&server, &units[0]).await;
    let after = status(&server).await;
    assert!(after.map_epoch > before.map_epoch, "a new epoch");
    assert!(is_drained(&server).await, "the acknowledged edit is kept");
    let log = server.log();
    assert!(
        log.contains("the start skipped: the served map") && log.contains(&maps[0]),
        "the skipped file is said:\n{}",
        tail(&log, 20)
    );
    assert!(
        damaged_dir.join(&maps[0]).exists(),
        "moved to {}",
        damaged_dir.display()
    );
    stored_at_least(&server, after.map_version).await;
    server.kill();

    // Every topology snapshot damaged (the only one, edit 0's).
    let snapshots = damage(&values, "topology-");
    assert!(!snapshots.is_empty());
    let server = setup.start().await;
    resolves(&server, &units[0]).await;
    let again = status(&server).await;
    assert_eq!(
        again.map_version, after.map_version,
        "the stored map is served"
    );
    assert!(is_drained(&server).await, "the journal replayed");
    let log = server.log();
    assert!(
        log.contains("written again") && log.contains(&snapshots[0]),
        "{}",
        tail(&log, 20)
    );
    server.kill();
    // And the next start reads what this one wrote, with nothing to skip.
    let server = setup.start().await;
    resolves(&server, &units[0]).await;
    assert!(
        !server.log().contains("the start skipped"),
        "{}",
        tail(&server.log(), 20)
    );

    // Two more edits, the first of them damaged in the journal: the start replays the edits
    // before it, says the edits from it on are lost, keeps the damaged bytes, and the journal
    // goes on (an edit after it is acknowledged and survives the next start).
    let clusters = all_clusters(&server).await;
    let (second, third) = (clusters[1].id.clone(), clusters[2].id.clone());
    for id in [&second, &third] {
        set_state(&server, id, pb::ClusterState::Drained).await;
    }
    server.kill();
    let journal = setup.dir.path().join("data").join("journal");
    let lost = damage_journal_entry(&journal, 1);
    let server = setup.start().await;
    resolves(&server, &units[0]).await;
    let log = server.log();
    assert!(
        log.contains(&format!(
            "the acknowledged edits from {lost} on cannot be replayed"
        )),
        "{}",
        tail(&log, 20)
    );
    assert!(
        is_drained(&server).await,
        "the edit before the damage is kept"
    );
    assert_eq!(
        clusters_now(&server, &second).await,
        pb::ClusterState::Up as i32,
        "lost"
    );
    assert_eq!(
        clusters_now(&server, &third).await,
        pb::ClusterState::Up as i32,
        "lost"
    );
    assert!(
        std::fs::read_dir(&damaged_dir)
            .expect("damaged/")
            .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("journal-seg-"))),
        "the damaged segment is kept in {}",
        damaged_dir.display()
    );
    set_state(&server, &third, pb::ClusterState::Down).await;
    server.kill();
    let server = setup.start().await;
    resolves(&server, &units[0]).await;
    assert!(
        !server.log().contains("the start skipped"),
        "{}",
        tail(&server.log(), 20)
    );
    assert_eq!(
        clusters_now(&server, &third).await,
        pb::ClusterState::Down as i32
    );
}

/// Sets cluster `id`'s state through Admin (acknowledged, so journaled).
async fn set_state(server: &Server, id: &str, state: pb::ClusterState) {
    ok(
        server
            .admin()
            .set_cluster_state(authed(
                pb::SetClusterStateRequest {
                    id: id.to_string(),
                    state: state as i32,
                    reason: "issue 41".into(),
                    force: false,
                },
                Some(TOKEN),
            ))
            .await,
        "SetClusterState",
    );
}

/// Cluster `id`'s state as Admin says.
async fn clusters_now(server: &Server, id: &str) -> i32 {
    ok(
        server
            .admin()
            .get_cluster(authed(
                pb::GetClusterRequest { id: id.to_string() },
                Some(TOKEN),
            ))
            .await,
        "GetCluster",
    )
    .state
}

/// Flips a byte in the middle of the journal's entry `back` places before its last (the
/// journal's frames: length, xxh3, time, sequence number, payload); that entry's number.
fn damage_journal_entry(journal: &std::path::Path, back: usize) -> u64 {
    let mut segments: Vec<_> = std::fs::read_dir(journal)
        .expect("the journal")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seg-"))
        })
        .collect();
    segments.sort();
    let last = segments.last().expect("a journal segment");
    let mut bytes = std::fs::read(last).expect("the segment");
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 28 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let seq = u64::from_le_bytes(bytes[at + 20..at + 28].try_into().expect("8 bytes"));
        frames.push((at, len, seq));
        at += 28 + len;
    }
    let (start, len, seq) = frames[frames.len() - 1 - back];
    bytes[start + 28 + len / 2] ^= 0x55;
    std::fs::write(last, &bytes).expect("damage it");
    seq
}
