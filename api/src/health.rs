//! Health checks: the mapper probes every cluster's addresses (TCP connect, or an HTTP GET
//! with an expected status) and a cluster none of whose addresses answers goes down in the
//! next round by itself, as gdnsd, PowerDNS and Traffic Control take a dead site out.
//!
//! - **Anti-flap** ([`Flap`]): an address is down after `fall` failures in a row and up again
//!   after `rise` successes in a row (gdnsd's thresholds); one probe either way changes
//!   nothing, so a flapping server does not flap the map. Addresses start up.
//! - **A cluster is down** when every address probed is down; the reason names the last
//!   failure of each. A cluster with some addresses down answers from the others only: the
//!   round's topology holds its up addresses, so in-cluster selection moves only the failed
//!   servers' keys.
//! - **Operators win**: the probes' verdict is applied at round time ([`Health::overlay`])
//!   only to clusters the operator has up; an operator's drain or down stays as set, and the
//!   topology (what Admin edits and the store keep) never holds the probes' state.
//! - **Bounded**: at most [`MAX_IN_FLIGHT`] probes at once, each within `timeout_ms`, reading
//!   at most [`MAX_STATUS_LINE`] bytes of an HTTP answer.
//!
//! Only addresses the operator configured are probed (the topology's cluster addresses, at the
//! configured port): nothing else on the network.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cdnmap_mapper::model::{ClusterIdx, ClusterState};
use cdnmap_topology::Topology;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::{HealthConfig, ProbeKind};

/// Most probes in flight at once.
pub const MAX_IN_FLIGHT: usize = 256;
/// Most bytes of an HTTP answer read for its status line.
pub const MAX_STATUS_LINE: usize = 256;

/// One address's verdict through the thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flap {
    pub up: bool,
    /// Probes in a row against the current verdict.
    against: u32,
}

impl Default for Flap {
    fn default() -> Self {
        Flap {
            up: true,
            against: 0,
        }
    }
}

impl Flap {
    /// Takes one probe's result; says whether the verdict changed.
    pub fn observe(&mut self, ok: bool, fall: u32, rise: u32) -> bool {
        if ok == self.up {
            self.against = 0;
            return false;
        }
        self.against += 1;
        let needed = if self.up { fall } else { rise };
        if self.against >= needed.max(1) {
            self.up = ok;
            self.against = 0;
            return true;
        }
        false
    }
}

/// How one cluster is probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub kind: ProbeKind,
    pub port: u16,
    pub path: String,
    pub expect_status: u16,
}

impl HealthConfig {
    /// How cluster `id` is probed (`None`: not at all).
    pub fn probe_of(&self, id: &str) -> Option<Probe> {
        let o = self.clusters.get(id);
        if o.and_then(|o| o.enabled) == Some(false) {
            return None;
        }
        Some(Probe {
            kind: o.and_then(|o| o.kind).unwrap_or(self.kind),
            port: o.and_then(|o| o.port).unwrap_or(self.port),
            path: o
                .and_then(|o| o.path.clone())
                .unwrap_or_else(|| self.path.clone()),
            expect_status: o
                .and_then(|o| o.expect_status)
                .unwrap_or(self.expect_status),
        })
    }
}

/// One address's state.
#[derive(Debug, Clone)]
struct Address {
    addr: SocketAddr,
    flap: Flap,
    /// The last probe's failure.
    last_error: Option<String>,
}

/// What is probed: a cluster's id, one of its addresses (at the probe's port), and how.
pub type Target = (String, SocketAddr, Probe);

/// A monitor's last report: when it came, and its verdict per (cluster, address) with the
/// last failure.
#[derive(Debug, Clone)]
struct Peer {
    at: std::time::Instant,
    verdicts: std::collections::HashMap<(String, SocketAddr), (bool, String)>,
}

/// One address's verdict by the voters: up, or down with the down votes' reasons.
#[derive(Debug, Clone, PartialEq)]
struct Verdict {
    addr: SocketAddr,
    up: bool,
    /// "voter: reason", one per down vote.
    against: Vec<String>,
}

/// The probes' verdicts, by cluster id: the mapper's own (with `local`) and the monitors'
/// reports, combined per address by the quorum.
#[derive(Debug)]
pub struct Health {
    config: HealthConfig,
    /// The mapper's own probes' state (with `local`), or a monitor's.
    clusters: Mutex<BTreeMap<String, Vec<Address>>>,
    /// What the last topology seen has to be probed.
    targets: Mutex<Vec<Target>>,
    /// The monitors' last reports, by name (only names `monitors` lists).
    peers: Mutex<BTreeMap<String, Peer>>,
    /// The clusters the last overlay took down (those the operator had up).
    taken_down: Mutex<std::collections::BTreeSet<String>>,
    /// The last overlay: the topology it was made of, the verdicts, the topology made. A
    /// round with the same topology and verdicts gets the same one (a new addressing each
    /// round would make the serving map compare every unit's prefixes to see them unchanged).
    last: Mutex<Option<Overlaid>>,
}

/// What [`Health::overlay`] made last.
type Overlaid = (
    Arc<Topology>,
    BTreeMap<String, String>,
    BTreeMap<String, Vec<SocketAddr>>,
    Arc<Topology>,
);

impl Health {
    pub fn new(config: HealthConfig) -> Self {
        Health {
            config,
            clusters: Mutex::default(),
            targets: Mutex::default(),
            peers: Mutex::default(),
            taken_down: Mutex::default(),
            last: Mutex::default(),
        }
    }

    pub fn config(&self) -> &HealthConfig {
        &self.config
    }

    /// What the last topology seen has to be probed (what a monitor is told).
    pub fn targets(&self) -> Vec<Target> {
        self.targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Takes monitor `name`'s report: its verdict per (cluster, address) and the last failure,
    /// replacing its report before. Verdicts on what is not probed are dropped, so a monitor
    /// holds at most one entry per target.
    pub fn report(&self, name: &str, verdicts: Vec<(String, SocketAddr, bool, String)>) {
        let probed: HashSet<(String, SocketAddr)> =
            self.targets().into_iter().map(|(c, a, _)| (c, a)).collect();
        let verdicts = verdicts
            .into_iter()
            .map(|(c, a, up, e)| ((c, a), (up, e)))
            .filter(|(key, _)| probed.contains(key))
            .collect();
        let peer = Peer {
            at: std::time::Instant::now(),
            verdicts,
        };
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), peer);
    }

    /// This process's own verdicts, after the thresholds: what a monitor reports.
    pub fn own_verdicts(&self) -> Vec<(String, SocketAddr, bool, String)> {
        self.clusters()
            .iter()
            .flat_map(|(id, addrs)| {
                addrs.iter().map(move |a| {
                    (
                        id.clone(),
                        a.addr,
                        a.flap.up,
                        a.last_error.clone().unwrap_or_default(),
                    )
                })
            })
            .collect()
    }

    /// Every probed address's verdict, by cluster: down when at least `quorum` voters (the
    /// mapper's own probes with `local`, each monitor heard from within 3 intervals) hold it
    /// down.
    fn verdicts(&self) -> BTreeMap<String, Vec<Verdict>> {
        let targets = self.targets();
        let local = self.clusters();
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let fresh_for = Duration::from_millis(3 * self.config.interval_ms);
        let fresh: Vec<(&String, &Peer)> = peers
            .iter()
            .filter(|(_, p)| p.at.elapsed() <= fresh_for)
            .collect();
        metrics::gauge!("cdnmap_health_monitors_fresh").set(fresh.len() as f64);
        let quorum = self.config.quorum();
        let mut out: BTreeMap<String, Vec<Verdict>> = BTreeMap::new();
        for (id, addr, _) in targets {
            let mut against = Vec::new();
            if self.config.local {
                if let Some(a) = local
                    .get(&id)
                    .and_then(|a| a.iter().find(|a| a.addr == addr))
                    .filter(|a| !a.flap.up)
                {
                    against.push(format!(
                        "mapper: {}",
                        a.last_error.as_deref().unwrap_or("failed")
                    ));
                }
            }
            for (name, p) in &fresh {
                if let Some((false, e)) = p.verdicts.get(&(id.clone(), addr)) {
                    let e = if e.is_empty() { "failed" } else { e.as_str() };
                    against.push(format!("{name}: {e}"));
                }
            }
            out.entry(id).or_default().push(Verdict {
                addr,
                up: against.len() < quorum,
                against,
            });
        }
        let down = out.values().filter(|v| all_down(v)).count();
        metrics::gauge!("cdnmap_health_clusters_down").set(down as f64);
        out
    }

    fn clusters(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<Address>>> {
        self.clusters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Clusters the probes hold down, with the reason.
    pub fn down(&self) -> BTreeMap<String, String> {
        self.down_of(&self.verdicts())
    }

    /// [`Self::down`] of these verdicts.
    fn down_of(&self, verdicts: &BTreeMap<String, Vec<Verdict>>) -> BTreeMap<String, String> {
        let (voters, quorum) = (self.config.voters(), self.config.quorum());
        verdicts
            .iter()
            .filter(|(_, v)| all_down(v))
            .map(|(id, addrs)| {
                let why: Vec<String> = addrs
                    .iter()
                    .map(|v| format!("{}: {}", v.addr, v.against.join(", ")))
                    .collect();
                let votes = if voters > 1 {
                    format!(" by {quorum} of {voters} voters")
                } else {
                    String::new()
                };
                (
                    id.clone(),
                    format!(
                        "health checks: every address failed {} probes in a row{votes} ({})",
                        self.config.fall,
                        why.join("; ")
                    ),
                )
            })
            .collect()
    }

    /// `topology` as the probes see it: the clusters they hold down set down, where the
    /// operator has them up; of a cluster some of whose addresses are down, only the others
    /// (in-cluster selection then places only the failed servers' keys elsewhere). The same
    /// topology when the probes find nothing down.
    ///
    /// `changed` hears each cluster the operator has up that the probes take down (with the
    /// reason) or let back since the last overlay: the dashboard's events.
    pub fn overlay(
        &self,
        topology: &Arc<Topology>,
        mut changed: impl FnMut(&str, bool, &str),
    ) -> Arc<Topology> {
        let verdicts = self.verdicts();
        let down = self.down_of(&verdicts);
        {
            let mut taken = self.taken_down.lock().unwrap_or_else(|e| e.into_inner());
            let now: std::collections::BTreeSet<String> = topology
                .instance
                .clusters()
                .iter()
                .filter(|c| c.state == ClusterState::Up && down.contains_key(&c.id))
                .map(|c| c.id.clone())
                .collect();
            for id in now.difference(&taken) {
                changed(id, true, &down[id]);
            }
            for id in taken.difference(&now) {
                changed(id, false, "health checks: an address answers again");
            }
            *taken = now;
        }
        let failing = failing_of(&verdicts);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((base, d, f, out)) = last.as_ref() {
            // The reasons' texts may change from sweep to sweep; the clusters matter.
            if Arc::ptr_eq(base, topology) && d.keys().eq(down.keys()) && *f == failing {
                return Arc::clone(out);
            }
        }
        let out = self.overlaid(topology, &down, &failing);
        *last = Some((Arc::clone(topology), down, failing, Arc::clone(&out)));
        out
    }

    fn overlaid(
        &self,
        topology: &Arc<Topology>,
        down: &BTreeMap<String, String>,
        failing: &BTreeMap<String, Vec<SocketAddr>>,
    ) -> Arc<Topology> {
        let mut out = Arc::clone(topology);
        for (c, cluster) in topology.instance.clusters().iter().enumerate() {
            let c = c as ClusterIdx;
            if down.contains_key(&cluster.id) {
                if cluster.state == ClusterState::Up {
                    out = Arc::new(out.with_cluster_state(c, ClusterState::Down));
                }
            } else if let Some(failed) = failing.get(&cluster.id) {
                let port = self.config.probe_of(&cluster.id).map_or(0, |p| p.port);
                let kept: Vec<IpAddr> = topology
                    .cluster_addresses(c)
                    .iter()
                    .copied()
                    .filter(|&ip| !failed.contains(&SocketAddr::new(ip, port)))
                    .collect();
                if !kept.is_empty() {
                    out = Arc::new(out.with_cluster_addresses(c, kept));
                }
            }
        }
        out
    }

    /// Per cluster with some addresses down (not all), those addresses.
    #[cfg(test)]
    fn failing(&self) -> BTreeMap<String, Vec<SocketAddr>> {
        failing_of(&self.verdicts())
    }

    /// What `topology` has to be probed: every address of every probed cluster.
    pub fn targets_of(&self, topology: &Topology) -> Vec<Target> {
        let mut targets = Vec::new();
        for (c, cluster) in topology.instance.clusters().iter().enumerate() {
            let Some(probe) = self.config.probe_of(&cluster.id) else {
                continue;
            };
            for &ip in topology.cluster_addresses(c as ClusterIdx) {
                targets.push((
                    cluster.id.clone(),
                    SocketAddr::new(ip, probe.port),
                    probe.clone(),
                ));
            }
        }
        targets
    }

    /// One sweep of `topology`: its targets become what is probed (and what monitors are
    /// told), and with `local` the mapper probes them ([`Self::sweep_targets`]).
    pub async fn sweep(&self, topology: &Topology) {
        let targets = self.targets_of(topology);
        if self.config.local {
            self.sweep_targets(targets).await;
        } else {
            *self.targets.lock().unwrap_or_else(|e| e.into_inner()) = targets;
        }
    }

    /// Probes every target, at most [`MAX_IN_FLIGHT`] at once, and takes the results through
    /// the thresholds into this process's own verdicts. Clusters no longer among the targets
    /// are forgotten; an address a cluster no longer has too.
    pub async fn sweep_targets(&self, targets: Vec<Target>) {
        *self.targets.lock().unwrap_or_else(|e| e.into_inner()) = targets.clone();
        let timeout = Duration::from_millis(self.config.timeout_ms);
        let gate = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        // A probe not begun within the interval is skipped (no verdict), so a sweep lasts at
        // most an interval and a timeout however many addresses time out at once.
        let start_by = tokio::time::Instant::now() + Duration::from_millis(self.config.interval_ms);
        let mut probes = tokio::task::JoinSet::new();
        for (id, addr, probe) in targets.iter().cloned() {
            let gate = Arc::clone(&gate);
            probes.spawn(async move {
                let Ok(Ok(_permit)) = tokio::time::timeout_at(start_by, gate.acquire_owned()).await
                else {
                    return (id, addr, None);
                };
                let result = match tokio::time::timeout(timeout, probe_once(addr, &probe)).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
                };
                (id, addr, Some(result))
            });
        }
        let mut results: BTreeMap<(String, SocketAddr), Result<(), String>> = BTreeMap::new();
        let mut skipped = 0usize;
        while let Some(done) = probes.join_next().await {
            match done {
                Ok((id, addr, Some(result))) => {
                    results.insert((id, addr), result);
                }
                Ok((_, _, None)) => skipped += 1,
                Err(_) => {}
            }
        }
        if skipped > 0 {
            metrics::counter!("cdnmap_health_probes_total", "result" => "skipped")
                .increment(skipped as u64);
            tracing::warn!(
                skipped,
                addresses = targets.len(),
                in_flight = MAX_IN_FLIGHT,
                "health: probes not begun within the interval were skipped (too many addresses time out for the interval)"
            );
        }
        let (fall, rise) = (self.config.fall, self.config.rise);
        let mut clusters = self.clusters();
        let mut kept: BTreeMap<String, Vec<Address>> = BTreeMap::new();
        for (id, addr, _) in targets {
            let before = clusters
                .get(&id)
                .and_then(|a| a.iter().find(|a| a.addr == addr))
                .cloned();
            let mut a = before.unwrap_or(Address {
                addr,
                flap: Flap::default(),
                last_error: None,
            });
            match results.remove(&(id.clone(), addr)) {
                Some(Ok(())) => {
                    metrics::counter!("cdnmap_health_probes_total", "result" => "ok").increment(1);
                    if a.flap.observe(true, fall, rise) {
                        tracing::info!(cluster = %id, %addr, "health: address up");
                    }
                }
                Some(Err(e)) => {
                    metrics::counter!("cdnmap_health_probes_total", "result" => "failed")
                        .increment(1);
                    if a.flap.observe(false, fall, rise) {
                        tracing::warn!(cluster = %id, %addr, error = %e, "health: address down");
                    }
                    a.last_error = Some(e);
                }
                None => {} // the probe's task failed: no verdict
            }
            kept.entry(id).or_default().push(a);
        }
        *clusters = kept;
    }
}

/// Per cluster with some addresses down (not all) in `verdicts`, those addresses.
fn failing_of(verdicts: &BTreeMap<String, Vec<Verdict>>) -> BTreeMap<String, Vec<SocketAddr>> {
    verdicts
        .iter()
        .filter_map(|(id, addrs)| {
            let failed: Vec<SocketAddr> = addrs.iter().filter(|v| !v.up).map(|v| v.addr).collect();
            (!failed.is_empty() && failed.len() < addrs.len()).then(|| (id.clone(), failed))
        })
        .collect()
}

/// Whether a cluster's probed addresses are all down (a cluster with none probed is not).
fn all_down(addresses: &[Verdict]) -> bool {
    !addresses.is_empty() && addresses.iter().all(|v| !v.up)
}

/// One probe of `addr`.
async fn probe_once(addr: SocketAddr, probe: &Probe) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    if probe.kind == ProbeKind::Tcp {
        return Ok(());
    }
    let host = match addr.ip() {
        IpAddr::V6(a) => format!("[{a}]"),
        v4 => v4.to_string(),
    };
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: cdnmap-health\r\nConnection: close\r\n\r\n",
        probe.path
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("sending the request: {e}"))?;
    let mut buf = vec![0u8; MAX_STATUS_LINE];
    let mut got = 0;
    while got < buf.len() && !buf[..got].contains(&b'\n') {
        let n = stream
            .read(&mut buf[got..])
            .await
            .map_err(|e| format!("reading the answer: {e}"))?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let line = String::from_utf8_lossy(&buf[..got]);
    let line = line.lines().next().unwrap_or("");
    let status: Option<u16> = line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|s| s.parse().ok());
    match status {
        Some(s) if s == probe.expect_status => Ok(()),
        Some(s) => Err(format!("HTTP {s}, expected {}", probe.expect_status)),
        None => Err(format!(
            "not an HTTP answer: {:?}",
            line.chars().take(40).collect::<String>()
        )),
    }
}

/// Sweeps every `interval_ms` until the service stops, over the topology the next round solves.
pub async fn run(
    health: Arc<Health>,
    topology: impl Fn() -> Arc<Topology>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(health.config.interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => health.sweep(&topology()).await,
            _ = stopping.changed() => return,
        }
        if *stopping.borrow() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The votes: the mapper's own probe and two monitors, two down votes needed.
    #[test]
    fn a_quorum_of_down_votes_takes_an_address_down() {
        let config: HealthConfig = toml::from_str(
            "port = 80\nmonitors = [\"m1\", \"m2\"]\ninterval_ms = 60000\ntimeout_ms = 1000",
        )
        .expect("a [health]");
        assert_eq!((config.voters(), config.quorum()), (3, 2));
        let h = Health::new(config);
        let probe = h.config.probe_of("b").expect("probed");
        let (x, y): (SocketAddr, SocketAddr) = (
            "127.0.0.3:80".parse().expect("addr"),
            "127.0.0.4:80".parse().expect("addr"),
        );
        *h.targets.lock().expect("lock") =
            vec![("b".into(), x, probe.clone()), ("b".into(), y, probe)];
        let down = |up| Flap {
            up,
            ..Flap::default()
        };
        // The mapper's own probes hold x down, y up.
        h.clusters().insert(
            "b".into(),
            vec![
                Address {
                    addr: x,
                    flap: down(false),
                    last_error: Some("connect: refused".into()),
                },
                Address {
                    addr: y,
                    flap: down(true),
                    last_error: None,
                },
            ],
        );
        assert!(h.down().is_empty(), "one vote of three");
        assert!(h.failing().is_empty());
        // m1 agrees on x: x is down, y is not (b answers from y).
        h.report("m1", vec![("b".into(), x, false, "timeout".into())]);
        assert!(h.down().is_empty());
        assert_eq!(h.failing().get("b"), Some(&vec![x]));
        // m1 and m2 hold y down too, the mapper not: two of three, b is down.
        h.report(
            "m1",
            vec![
                ("b".into(), x, false, "timeout".into()),
                ("b".into(), y, false, "timeout".into()),
            ],
        );
        h.report("m2", vec![("b".into(), y, false, String::new())]);
        let why = h.down().remove("b").expect("b down");
        assert!(why.contains("by 2 of 3 voters"), "{why}");
        assert!(
            why.contains("mapper: connect: refused") && why.contains("m2: failed"),
            "{why}"
        );
        // m2 changes its mind: y is back up.
        h.report("m2", vec![("b".into(), y, true, String::new())]);
        assert!(h.down().is_empty());
    }

    /// Down after `fall` failures in a row, up after `rise` successes in a row; an
    /// alternation never changes the verdict.
    #[test]
    fn the_thresholds_hold_a_flapping_address_still() {
        let mut f = Flap::default();
        let (fall, rise) = (3, 2);
        assert!(!f.observe(false, fall, rise));
        assert!(!f.observe(false, fall, rise));
        assert!(f.observe(false, fall, rise), "down at the third failure");
        assert!(!f.up);
        assert!(!f.observe(true, fall, rise));
        assert!(!f.observe(false, fall, rise), "a failure resets the climb");
        assert!(!f.observe(true, fall, rise));
        assert!(
            f.observe(true, fall, rise),
            "up at the second success in a row"
        );
        for i in 0..100 {
            assert!(!f.observe(i % 2 == 0, fall, rise), "flapping at {i}");
        }
        assert!(f.up);
    }
}
