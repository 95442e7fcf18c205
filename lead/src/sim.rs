//! A deterministic simulation of the election: several [`Elector`]s against a model of etcd's
//! leases, election keys and guarded transactions, over a network that delays, reorders and
//! drops messages, with partitions, paused and crashed processes, drifting clocks and clocks
//! that leap forward, all drawn from one seed. Every run checks the safety properties the service relies on:
//!
//! 1. a publication's transaction succeeds only for the replica whose key leads in etcd;
//! 2. no two replicas ever publish in the same epoch, and the epochs published only grow;
//! 3. a replica's [`Elector::term`] is given only while etcd still holds its lease (so a
//!    replica that lost etcd stops before its lease runs out, whatever its clock drift);
//!
//! and one liveness property: once the faults stop, a leader is elected and publishes.
//!
//! `CDNMAP_SIM_SEEDS=N` runs N seeds instead of the default; a failure names its seed, and
//! `CDNMAP_SIM_SEED=S` replays that one.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Command, Elector, Event, LeaseId, Role};

const TTL_MS: u64 = 10_000;
const CYCLE_MS: u64 = 10_000;
const NODES: usize = 3;
/// Simulated time with faults, then a quiet time in which a leader must publish.
const FAULTY_MS: u64 = 300_000;
const QUIET_MS: u64 = 60_000;

/// What a replica sends etcd.
#[derive(Debug, Clone)]
enum Request {
    Grant {
        sent: u64,
    },
    KeepAlive {
        lease: LeaseId,
        sent: u64,
    },
    Campaign {
        lease: LeaseId,
    },
    Abandon {
        lease: LeaseId,
    },
    Publish {
        epoch: u64,
        key: Vec<u8>,
        version: u64,
    },
}

/// What etcd answers.
#[derive(Debug, Clone)]
enum Answer {
    Event(Event),
    Published { epoch: u64, ok: bool },
}

#[derive(Debug, Clone)]
enum What {
    Tick(usize),
    Round(usize),
    ToEtcd(usize, u64, Request),
    ToNode(usize, u64, Answer),
    EtcdTick,
    Crash(usize),
    /// The replica's clock leaps forward by this much (a monotonic clock never goes back).
    Jump(usize, u64),
    Restart(usize),
}

/// etcd's election as far as the replicas see it: leases with expiry (real time), the keys
/// under the election's prefix with their create revisions, campaigns waiting to lead, and
/// the guarded put.
#[derive(Default)]
struct Etcd {
    rev: u64,
    next_lease: LeaseId,
    /// Expiry of every lease ever granted (only extended while alive).
    expiry: BTreeMap<LeaseId, u64>,
    /// Live keys: key → (create revision, lease).
    keys: BTreeMap<Vec<u8>, (u64, LeaseId)>,
    /// Campaigns waiting: (node, incarnation, lease, key).
    waiting: Vec<(usize, u64, LeaseId, Vec<u8>)>,
}

impl Etcd {
    fn alive(&self, lease: LeaseId, now: u64) -> bool {
        self.expiry.get(&lease).is_some_and(|&e| e > now)
    }

    /// Deletes the keys of expired leases.
    fn expire(&mut self, now: u64) {
        let dead: Vec<Vec<u8>> = self
            .keys
            .iter()
            .filter(|(_, &(_, l))| !self.alive(l, now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in dead {
            self.keys.remove(&k);
            self.rev += 1;
        }
    }

    /// The key that leads: the oldest.
    fn leader(&self) -> Option<(&Vec<u8>, u64)> {
        self.keys
            .iter()
            .min_by_key(|(_, &(rev, _))| rev)
            .map(|(k, &(rev, _))| (k, rev))
    }

    /// Campaigns that now lead or lost their key: their answers.
    fn settle(&mut self) -> Vec<(usize, u64, Answer)> {
        let leader = self.leader().map(|(k, rev)| (k.clone(), rev));
        let mut out = Vec::new();
        self.waiting.retain(|(node, inc, lease, key)| {
            if !self.keys.contains_key(key) {
                out.push((
                    *node,
                    *inc,
                    Answer::Event(Event::Failed {
                        command: Command::Campaign(*lease),
                    }),
                ));
                return false;
            }
            match &leader {
                Some((k, rev)) if k == key => {
                    out.push((
                        *node,
                        *inc,
                        Answer::Event(Event::Elected {
                            lease: *lease,
                            key: key.clone(),
                            epoch: *rev,
                        }),
                    ));
                    false
                }
                _ => true,
            }
        });
        out
    }
}

struct Node {
    elector: Elector,
    /// Local clock: `offset + real * rate`, plus forward jumps.
    offset: f64,
    rate: f64,
    incarnation: u64,
    down: bool,
    /// Stopped (a paused process, a stalled VM) during these (start, end) intervals.
    pauses: Vec<(u64, u64)>,
    /// Cut off from etcd during these (start, end) intervals.
    cut: Vec<(u64, u64)>,
    version: u64,
}

impl Node {
    fn local(&self, real: u64) -> u64 {
        (self.offset + real as f64 * self.rate) as u64
    }

    fn cut_at(&self, real: u64) -> bool {
        self.cut.iter().any(|&(s, e)| s <= real && real < e)
    }

    /// When a pause covering `real` ends.
    fn paused_until(&self, real: u64) -> Option<u64> {
        self.pauses
            .iter()
            .filter(|&&(s, e)| s <= real && real < e)
            .map(|&(_, e)| e)
            .max()
    }
}

struct Sim {
    rng: ChaCha8Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<What>>,
    etcd: Etcd,
    nodes: Vec<Node>,
    /// Successful publications in etcd's order: (real time, node, epoch, version).
    published: Vec<(u64, usize, u64, u64)>,
    /// Who published in each epoch.
    epoch_owner: BTreeMap<u64, usize>,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let nodes = (0..NODES)
            .map(|_| {
                let mut cut = Vec::new();
                for _ in 0..rng.random_range(0..4) {
                    let s = rng.random_range(0..FAULTY_MS);
                    let len = rng.random_range(100..2 * TTL_MS);
                    cut.push((s, (s + len).min(FAULTY_MS)));
                }
                let mut pauses = Vec::new();
                for _ in 0..rng.random_range(0..3) {
                    let s = rng.random_range(0..FAULTY_MS);
                    let len = rng.random_range(100..3 * TTL_MS / 2);
                    pauses.push((s, (s + len).min(FAULTY_MS)));
                }
                Node {
                    elector: Elector::new(Duration::from_millis(TTL_MS)),
                    offset: rng.random_range(0.0..1e9),
                    // ±1% drift, well within the margin of a fifth of the TTL.
                    rate: rng.random_range(0.99..1.01),
                    incarnation: 0,
                    down: false,
                    pauses,
                    cut,
                    version: 0,
                }
            })
            .collect();
        let mut sim = Sim {
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            etcd: Etcd {
                rev: 1,
                next_lease: 0x1000,
                ..Etcd::default()
            },
            nodes,
            published: Vec::new(),
            epoch_owner: BTreeMap::new(),
        };
        for n in 0..NODES {
            let first = sim.rng.random_range(0..1_000);
            sim.at(first, What::Tick(n));
            let round = sim.rng.random_range(0..CYCLE_MS);
            sim.at(round, What::Round(n));
            // Crashes, each with a restart.
            for _ in 0..sim.rng.random_range(0..3) {
                let at = sim.rng.random_range(0..FAULTY_MS);
                let by = sim.rng.random_range(1..2 * TTL_MS);
                sim.at(at, What::Jump(n, by));
            }
            for _ in 0..sim.rng.random_range(0..2) {
                let s = sim.rng.random_range(0..FAULTY_MS);
                let len = sim.rng.random_range(100..3 * TTL_MS);
                sim.at(s, What::Crash(n));
                sim.at((s + len).min(FAULTY_MS), What::Restart(n));
            }
        }
        sim.at(50, What::EtcdTick);
        sim
    }

    fn at(&mut self, time: u64, what: What) {
        self.seq += 1;
        self.events.push(Some(what));
        self.queue
            .push(Reverse((time, self.seq, self.events.len() - 1)));
    }

    /// A message's flight time: mostly short, sometimes long enough to reorder.
    fn delay(&mut self) -> u64 {
        if self.now < FAULTY_MS && self.rng.random_bool(0.02) {
            self.rng.random_range(100..TTL_MS / 2)
        } else {
            self.rng.random_range(1..20)
        }
    }

    /// Whether a message is lost at random (1%, while the faults last).
    fn lost(&mut self) -> bool {
        self.now < FAULTY_MS && self.rng.random_bool(0.01)
    }

    fn send(&mut self, n: usize, commands: Vec<Command>) {
        let inc = self.nodes[n].incarnation;
        let sent = self.nodes[n].local(self.now);
        for c in commands {
            let r = match c {
                Command::Grant => Request::Grant { sent },
                Command::KeepAlive(lease) => Request::KeepAlive { lease, sent },
                Command::Campaign(lease) => Request::Campaign { lease },
                Command::Abandon(lease) => Request::Abandon { lease },
            };
            self.send_etcd(n, inc, r);
        }
    }

    fn send_etcd(&mut self, n: usize, inc: u64, r: Request) {
        if self.nodes[n].cut_at(self.now) || self.lost() {
            // Lost: the elector's in-flight timeout covers it. A lost campaign or
            // publication is answered as failed, as a broken call would be.
            match r {
                Request::Campaign { lease } => {
                    let d = self.delay() + TTL_MS / 2;
                    let ev = Event::Failed {
                        command: Command::Campaign(lease),
                    };
                    self.at(self.now + d, What::ToNode(n, inc, Answer::Event(ev)));
                }
                Request::Publish { .. } => {
                    // The call fails: the service publishes nothing and stays in its term
                    // (only etcd's "no" ends it).
                }
                _ => {}
            }
            return;
        }
        let d = self.delay();
        self.at(self.now + d, What::ToEtcd(n, inc, r));
    }

    fn answer_node(&mut self, n: usize, inc: u64, a: Answer) {
        if self.nodes[n].cut_at(self.now) || self.lost() {
            if let Answer::Event(Event::Elected { lease, .. }) = a {
                // etcd answered but the answer is lost: the call fails for the replica.
                let ev = Event::Failed {
                    command: Command::Campaign(lease),
                };
                self.at(self.now + 1, What::ToNode(n, inc, Answer::Event(ev)));
            }
            // A publication's answer lost: the write happened, the replica does not know and
            // publishes nothing (as the service does when its call fails).
            return;
        }
        let d = self.delay();
        self.at(self.now + d, What::ToNode(n, inc, a));
    }

    fn etcd_handles(&mut self, n: usize, inc: u64, r: Request) -> Result<(), String> {
        let now = self.now;
        self.etcd.expire(now);
        match r {
            Request::Grant { sent } => {
                self.etcd.next_lease += 1;
                let lease = self.etcd.next_lease;
                self.etcd.expiry.insert(lease, now + TTL_MS);
                let ev = Event::Granted {
                    lease,
                    ttl_ms: TTL_MS,
                    sent_ms: sent,
                };
                self.answer_node(n, inc, Answer::Event(ev));
            }
            Request::KeepAlive { lease, sent } => {
                let ttl_ms = if self.etcd.alive(lease, now) {
                    self.etcd.expiry.insert(lease, now + TTL_MS);
                    TTL_MS
                } else {
                    0
                };
                let ev = Event::KeptAlive {
                    lease,
                    ttl_ms,
                    sent_ms: sent,
                };
                self.answer_node(n, inc, Answer::Event(ev));
            }
            Request::Campaign { lease } => {
                if !self.etcd.alive(lease, now) {
                    let ev = Event::Failed {
                        command: Command::Campaign(lease),
                    };
                    self.answer_node(n, inc, Answer::Event(ev));
                } else {
                    let key = format!("cdnmap/leader/{lease:x}").into_bytes();
                    if !self.etcd.keys.contains_key(&key) {
                        self.etcd.rev += 1;
                        self.etcd.keys.insert(key.clone(), (self.etcd.rev, lease));
                    }
                    self.etcd.waiting.push((n, inc, lease, key));
                }
            }
            Request::Abandon { lease } => {
                // A cancelled campaign resigns: its key is deleted.
                let key = format!("cdnmap/leader/{lease:x}").into_bytes();
                if self.etcd.keys.remove(&key).is_some() {
                    self.etcd.rev += 1;
                }
            }
            Request::Publish {
                epoch,
                key,
                version,
            } => {
                let ok = self
                    .etcd
                    .keys
                    .get(&key)
                    .is_some_and(|&(rev, _)| rev == epoch);
                if ok {
                    // Property 1: the key compared is the one that leads.
                    let leads = self.etcd.leader().map(|(k, _)| k.clone());
                    if leads.as_ref() != Some(&key) {
                        return Err(format!(
                            "node {n} published in epoch {epoch} at {now} ms while {leads:?} led"
                        ));
                    }
                    // Property 2: one replica per epoch, epochs only grow.
                    match self.epoch_owner.get(&epoch) {
                        Some(&o) if o != n => {
                            return Err(format!(
                                "epoch {epoch}: node {n} published in node {o}'s epoch"
                            ))
                        }
                        _ => {}
                    }
                    if let Some(&(_, _, last, _)) = self.published.last() {
                        if epoch < last {
                            return Err(format!(
                                "node {n} published epoch {epoch} after epoch {last} at {now} ms"
                            ));
                        }
                    }
                    self.epoch_owner.insert(epoch, n);
                    self.published.push((now, n, epoch, version));
                }
                self.answer_node(n, inc, Answer::Published { epoch, ok });
            }
        }
        self.settle();
        Ok(())
    }

    fn settle(&mut self) {
        for (n, inc, a) in self.etcd.settle() {
            self.answer_node(n, inc, a);
        }
    }

    fn run(&mut self) -> Result<(), String> {
        while let Some(Reverse((time, _, i))) = self.queue.pop() {
            if time > FAULTY_MS + QUIET_MS {
                break;
            }
            self.now = time;
            let Some(what) = self.events[i].take() else {
                continue;
            };
            // A paused process handles nothing until it runs again.
            let node_of = match &what {
                What::Tick(n) | What::Round(n) | What::ToNode(n, _, _) => Some(*n),
                _ => None,
            };
            if let Some(n) = node_of {
                if let Some(until) = self.nodes[n].paused_until(time) {
                    self.seq += 1;
                    self.events[i] = Some(what);
                    self.queue.push(Reverse((until, self.seq, i)));
                    continue;
                }
            }
            match what {
                What::EtcdTick => {
                    self.etcd.expire(time);
                    self.settle();
                    self.at(time + 50, What::EtcdTick);
                }
                What::Tick(n) => {
                    let node = &mut self.nodes[n];
                    if node.down {
                        continue;
                    }
                    let local = node.local(time);
                    let out = node.elector.tick(local);
                    let every = node.elector.tick_every().as_millis() as u64;
                    self.send(n, out);
                    // The check of property 3 at every tick as well as before publishing.
                    self.check_term(n)?;
                    self.at(time + every, What::Tick(n));
                }
                What::Round(n) => {
                    self.at(time + CYCLE_MS, What::Round(n));
                    if self.nodes[n].down {
                        continue;
                    }
                    self.check_term(n)?;
                    let local = self.nodes[n].local(time);
                    if let Some(term) = self.nodes[n].elector.term(local) {
                        self.nodes[n].version += 1;
                        let (inc, version) = (self.nodes[n].incarnation, self.nodes[n].version);
                        let r = Request::Publish {
                            epoch: term.epoch,
                            key: term.key,
                            version,
                        };
                        self.send_etcd(n, inc, r);
                    }
                }
                What::ToEtcd(n, inc, r) => self.etcd_handles(n, inc, r)?,
                What::ToNode(n, inc, a) => {
                    let node = &mut self.nodes[n];
                    if node.down || node.incarnation != inc {
                        continue;
                    }
                    let local = node.local(time);
                    let ev = match a {
                        Answer::Event(ev) => Some(ev),
                        Answer::Published { epoch, ok: false } => Some(Event::Deposed { epoch }),
                        Answer::Published { ok: true, .. } => None,
                    };
                    if let Some(ev) = ev {
                        let out = node.elector.handle(ev, local);
                        self.send(n, out);
                    }
                    self.check_term(n)?;
                }
                What::Jump(n, by) => {
                    self.nodes[n].offset += by as f64;
                    self.check_term(n)?;
                }
                What::Crash(n) => {
                    let node = &mut self.nodes[n];
                    node.down = true;
                    node.incarnation += 1;
                }
                What::Restart(n) => {
                    let node = &mut self.nodes[n];
                    if node.down {
                        node.down = false;
                        node.elector = Elector::new(Duration::from_millis(TTL_MS));
                        // A restarted process's monotonic clock starts elsewhere.
                        node.offset = self.rng.random_range(0.0..1e9) - time as f64 * node.rate;
                        self.at(time, What::Tick(n));
                    }
                }
            }
        }
        // Liveness: after the faults, a leader publishes (within the lease's expiry, a
        // campaign and a round).
        let settled = FAULTY_MS + 2 * TTL_MS + CYCLE_MS;
        if !self.published.iter().any(|&(t, ..)| t >= settled) {
            let nodes: Vec<String> = self
                .nodes
                .iter()
                .map(|n| {
                    format!(
                        "{:?} lease {:?} down {}",
                        n.elector.role(),
                        n.elector.lease(),
                        n.down
                    )
                })
                .collect();
            return Err(format!(
                "no publication after the faults ended (last: {:?}; nodes {nodes:?}; keys {:?}; waiting {:?})",
                self.published.last(),
                self.etcd.keys,
                self.etcd.waiting.iter().map(|w| (w.0, w.2)).collect::<Vec<_>>(),
            ));
        }
        Ok(())
    }

    /// Property 3: a term is given only while etcd holds the lease.
    fn check_term(&self, n: usize) -> Result<(), String> {
        let node = &self.nodes[n];
        let local = node.local(self.now);
        if let (Some(t), Some((lease, _))) = (node.elector.term(local), node.elector.lease()) {
            if !self.etcd.alive(lease, self.now) {
                return Err(format!(
                    "node {n} holds epoch {} at {} ms but etcd let lease {lease:x} go",
                    t.epoch, self.now
                ));
            }
        }
        if let Role::Leader { .. } = node.elector.role() {
            if node.elector.lease().is_none() {
                return Err(format!("node {n} leads without a lease"));
            }
        }
        Ok(())
    }
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("CDNMAP_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("CDNMAP_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    (0..n).collect()
}

#[test]
fn the_election_is_safe_and_live_under_faults() {
    let mut epochs = 0usize;
    let mut publications = 0usize;
    let mut takeovers = 0usize;
    for seed in seeds() {
        let mut sim = Sim::new(seed);
        if let Err(e) = sim.run() {
            panic!("seed {seed}: {e} (replay: CDNMAP_SIM_SEED={seed})");
        }
        epochs += sim.epoch_owner.len();
        publications += sim.published.len();
        takeovers += sim
            .published
            .windows(2)
            .filter(|w| w[0].1 != w[1].1)
            .count();
    }
    // The faults must have made the leadership move, or nothing was tested.
    assert!(
        takeovers > seeds().len() / 2,
        "only {takeovers} takeovers in {} runs ({epochs} epochs, {publications} publications)",
        seeds().len()
    );
}

/// The same seed gives the same run.
#[test]
fn a_run_is_replayed_exactly_from_its_seed() {
    let run = |seed| {
        let mut sim = Sim::new(seed);
        sim.run().map(|()| sim.published.clone())
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}
