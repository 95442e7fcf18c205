//! The election's I/O: the [`Elector`] (`cdnmap-lead`, the pure state machine) driven against a
//! real etcd (`etcd-client`): a task that ticks it, carries
//! out its commands as etcd calls (each bounded in time but the campaign, which etcd answers
//! when the campaign leads) and hands the answers back; and the guarded publication.
//!
//! Keys (all under the configured prefix, `cdnmap/` by default):
//! - `<prefix>leader/<lease id in hex>`: the election's candidates (etcd's `v3election`), each
//!   holding its replica's node id; the oldest leads, and its create revision is the epoch;
//! - `<prefix>published`: the last publication, `{"epoch":..,"version":..,"node":..}`,
//!   written only by a transaction that compares the leader key's create revision;
//! - `<prefix>edits/<sequence, 20 digits>`: the topology's edits (Admin, the dashboard), each
//!   the journal's JSON of one `Edit`, appended by the leader through a transaction that
//!   compares the leader key and that the sequence number is not taken; every replica applies
//!   them in order. The newest [`EDITS_KEPT`] are kept.
//! - `<prefix>history/<sequence, 20 digits>`: the change history's records (the actions, what
//!   came of them, the ramps), appended by the leader the same way; a replica that wins the
//!   election takes in those it lacks first. The newest [`HISTORY_KEPT`] are kept.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseGrantOptions, TlsOptions, Txn,
    TxnOp,
};
use tokio::sync::{mpsc, watch};

use cdnmap_lead::{Command, Elector, Event, LeaseId, Role, Term};

/// How long one etcd call but a campaign may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How many answers may wait for the elector (a handful are ever in flight).
const EVENTS: usize = 64;
/// Edits kept in etcd: appending one deletes the one this many before it. A replica further
/// behind than this cannot catch up from etcd (it says so; start it on a copy of a peer's
/// `data_dir`).
pub const EDITS_KEPT: u64 = 100_000;
/// Records of the change history kept in etcd (the newest): what a new leader takes over.
pub const HISTORY_KEPT: u64 = 10_000;
/// The most edits read from etcd at once.
pub const EDITS_PER_READ: i64 = 256;

/// What Admin status, the dashboard and `/metrics` show of the election.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub role: Option<Role>,
    /// The replicas campaigning, oldest (the leader) first: their node ids.
    pub replicas: Vec<String>,
    /// Their gRPC URLs, as each advertises it (in the same order).
    pub replica_urls: Vec<String>,
    /// Whether the last etcd call answered, and when one last did (ms since the start).
    pub etcd_reachable: bool,
    pub etcd_last_ok_ms: Option<u64>,
    pub etcd_error: String,
}

/// Why a publication's transaction could not say yes or no.
#[derive(Debug, thiserror::Error)]
#[error("etcd: {0}")]
pub struct EtcdError(String);

/// The TLS to etcd that `config` asks for: `None` for `http://` URLs; for `https://` ones,
/// the CA (`etcd_ca_file`) and this replica's certificate and key when given. Each file is
/// read and checked now: an error names its key and path.
pub fn tls_options(config: &crate::config::Config) -> anyhow::Result<Option<TlsOptions>> {
    Ok(cdnmap_proto::client_tls::from_config(
        ["etcd_ca_file", "etcd_cert_file", "etcd_key_file"],
        [
            config.etcd_ca_file.as_deref(),
            config.etcd_cert_file.as_deref(),
            config.etcd_key_file.as_deref(),
        ],
    )?)
}

/// Whether every etcd URL is on loopback (plaintext there is no one else's to read).
pub fn all_loopback(urls: &[String]) -> bool {
    urls.iter()
        .all(|u| cdnmap_proto::client_tls::is_loopback(u))
}

/// This replica's part in the election.
pub struct Coordinator {
    client: Client,
    node_id: String,
    election: String,
    published_key: String,
    edits: String,
    history: String,
    /// What this replica campaigns with: its node id and the URL of its gRPC listener.
    campaign_value: std::sync::OnceLock<String>,
    elector: Mutex<Elector>,
    /// The clock the elector's times are read from.
    started: Instant,
    events: mpsc::Sender<Event>,
    status: watch::Sender<Status>,
}

impl Coordinator {
    /// A coordinator for `node_id` on the etcd cluster at `endpoints` (URLs), keys under
    /// `prefix`, leases of `ttl`, over `tls` when given ([`tls_options`]; the URLs are then
    /// `https://`). No call is made yet (an etcd that is down at the start is retried by
    /// [`Coordinator::run`]; one whose certificate does not chain to the CA, or that refuses
    /// this replica's, is like one that is down, its error in the status).
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        node_id: &str,
        ttl: Duration,
        tls: Option<TlsOptions>,
    ) -> anyhow::Result<(Arc<Coordinator>, mpsc::Receiver<Event>)> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), CALL_TIMEOUT);
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| anyhow::anyhow!("etcd {}: {e}", endpoints.join(",")))?;
        let (events, rx) = mpsc::channel(EVENTS);
        Ok((
            Arc::new(Coordinator {
                client,
                node_id: node_id.to_string(),
                election: format!("{prefix}leader"),
                published_key: format!("{prefix}published"),
                edits: format!("{prefix}edits/"),
                history: format!("{prefix}history/"),
                campaign_value: std::sync::OnceLock::new(),
                elector: Mutex::new(Elector::new(ttl)),
                started: Instant::now(),
                events,
                status: watch::channel(Status::default()).0,
            }),
            rx,
        ))
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The term a publication may go out under now (leading, with the lease's margin left).
    pub fn term(&self) -> Option<Term> {
        let now = self.now_ms();
        self.elector.lock().ok().and_then(|e| e.term(now))
    }

    /// The election's state, for the status pages; changes are announced.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// Writes the publication of `version` in `term` through a transaction that compares the
    /// leader key's create revision with the epoch: `Ok(false)` when the key is gone or
    /// another's (the term is over, and the elector is told), an error when etcd did not
    /// answer (nothing is known: the caller does not publish).
    pub async fn publish(&self, term: &Term, version: u64) -> Result<bool, EtcdError> {
        let value = format!(
            "{{\"epoch\":{},\"version\":{version},\"node\":{:?}}}",
            term.epoch, self.node_id
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                term.key.clone(),
                CompareOp::Equal,
                term.epoch as i64,
            )])
            .and_then([TxnOp::put(self.published_key.clone(), value, None)]);
        let mut kv = self.client.kv_client();
        let ok = self.call(kv.txn(txn)).await?.succeeded();
        if !ok {
            let _ = self.events.try_send(Event::Deposed { epoch: term.epoch });
        }
        Ok(ok)
    }

    /// Appends `edit` (its journal JSON) as the replicas' edit number `seq`, in `term`:
    /// `Ok(false)` when the term is over or edit `seq` exists already (another leader's, or
    /// one this replica has not applied yet); nothing is written then.
    pub async fn append_edit(&self, term: &Term, seq: u64, edit: &[u8]) -> Result<bool, EtcdError> {
        self.append(&self.edits, EDITS_KEPT, term, seq, edit).await
    }

    /// The replicas' edits from number `from` on (at most [`EDITS_PER_READ`]), in order:
    /// (sequence number, the edit's JSON).
    pub async fn edits_from(&self, from: u64) -> Result<Vec<(u64, Vec<u8>)>, EtcdError> {
        self.read_from(&self.edits, from, etcd_client::SortOrder::Ascend)
            .await
    }

    /// Appends a record of the change history (the `activity` module's JSON) as number `seq`
    /// of the replicas' copy, in `term`: `Ok(false)` when the term is over or `seq` is taken.
    pub async fn append_history(
        &self,
        term: &Term,
        seq: u64,
        record: &[u8],
    ) -> Result<bool, EtcdError> {
        self.append(&self.history, HISTORY_KEPT, term, seq, record)
            .await
    }

    /// The replicas' copy of the change history from number `from` on (at most
    /// [`EDITS_PER_READ`]), in order.
    pub async fn history_from(&self, from: u64) -> Result<Vec<(u64, Vec<u8>)>, EtcdError> {
        self.read_from(&self.history, from, etcd_client::SortOrder::Ascend)
            .await
    }

    /// The number of the newest record of the replicas' copy of the change history (0: none).
    pub async fn last_history_seq(&self) -> Result<u64, EtcdError> {
        let newest = self
            .read_from(&self.history, 0, etcd_client::SortOrder::Descend)
            .await?;
        Ok(newest.first().map_or(0, |(seq, _)| *seq))
    }

    /// `value` as number `seq` of the log under `log` (keys `<log><seq, 20 digits>`), in
    /// `term`, the one `kept` numbers before it deleted; `Ok(false)` when the term is over or
    /// `seq` is taken.
    async fn append(
        &self,
        log: &str,
        kept: u64,
        term: &Term,
        seq: u64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        let key = format!("{log}{seq:020}");
        let mut ops = vec![TxnOp::put(key.clone(), value.to_vec(), None)];
        if seq > kept {
            ops.push(TxnOp::delete(format!("{log}{:020}", seq - kept), None));
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(term.key.clone(), CompareOp::Equal, term.epoch as i64),
                Compare::create_revision(key, CompareOp::Equal, 0),
            ])
            .and_then(ops);
        let mut kv = self.client.kv_client();
        Ok(self.call(kv.txn(txn)).await?.succeeded())
    }

    /// The entries of the log under `log` from number `from` on (at most [`EDITS_PER_READ`]),
    /// in `order` of their numbers: (number, value).
    async fn read_from(
        &self,
        log: &str,
        from: u64,
        order: etcd_client::SortOrder,
    ) -> Result<Vec<(u64, Vec<u8>)>, EtcdError> {
        // Every key of the log sorts below its prefix's end: '/' + 1 is '0'.
        let end = format!("{}0", log.trim_end_matches('/'));
        let options = GetOptions::new()
            .with_range(end)
            .with_limit(EDITS_PER_READ)
            .with_sort(etcd_client::SortTarget::Key, order);
        let mut kv = self.client.kv_client();
        let got = self
            .call(kv.get(format!("{log}{from:020}"), Some(options)))
            .await?;
        let mut out = Vec::new();
        for kv in got.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let seq = key
                .strip_prefix(log)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| EtcdError(format!("a key that is not {log}<number>: {key}")))?;
            out.push((seq, kv.value().to_vec()));
        }
        Ok(out)
    }

    /// The node id of the replica that leads, as far as this one knows.
    pub fn leader_name(&self) -> Option<String> {
        self.status.borrow().replicas.first().cloned()
    }

    /// One etcd call, bounded by [`CALL_TIMEOUT`]; whether etcd answered is recorded.
    async fn call<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, EtcdError> {
        let answered = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| EtcdError(format!("no answer within {CALL_TIMEOUT:?}")))
            .and_then(|r| r.map_err(|e| EtcdError(e.to_string())));
        self.note(answered.as_ref().err().map(|e| e.0.clone()));
        answered
    }

    /// Records whether etcd answered.
    fn note(&self, error: Option<String>) {
        let now = self.now_ms();
        self.status.send_modify(|s| match error {
            None => {
                s.etcd_reachable = true;
                s.etcd_last_ok_ms = Some(now);
                s.etcd_error.clear();
            }
            Some(e) => {
                s.etcd_reachable = false;
                s.etcd_error = e;
            }
        });
    }

    /// Drives the elector until `stop` turns true; then gives the lease back, so another
    /// replica leads at once instead of after the TTL. `advertise` is the URL of this
    /// replica's gRPC listener, which the others follow while it leads.
    pub async fn run(
        self: Arc<Self>,
        mut events: mpsc::Receiver<Event>,
        mut stop: watch::Receiver<bool>,
        advertise: String,
    ) {
        let _ = self
            .campaign_value
            .set(format!("{} {advertise}", self.node_id));
        let every = match self.elector.lock() {
            Ok(e) => e.tick_every(),
            Err(_) => return,
        };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut campaigns: Vec<(LeaseId, tokio::task::AbortHandle)> = Vec::new();
        let mut members = tokio::time::interval(every * 3);
        members.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !*stop.borrow() {
            let commands = tokio::select! {
                _ = tick.tick() => {
                    let now = self.now_ms();
                    self.elector.lock().map(|mut e| e.tick(now)).unwrap_or_default()
                }
                Some(event) = events.recv() => {
                    let now = self.now_ms();
                    self.elector.lock().map(|mut e| e.handle(event, now)).unwrap_or_default()
                }
                _ = members.tick() => {
                    // On a task of its own: a slow etcd must not hold the renewals back.
                    let me = Arc::clone(&self);
                    tokio::spawn(async move { me.list_replicas().await });
                    Vec::new()
                }
                changed = stop.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    continue;
                }
            };
            campaigns.retain(|(_, h)| !h.is_finished());
            for command in commands {
                self.execute(command, &mut campaigns);
            }
            self.show_role();
        }
        for (_, h) in campaigns {
            h.abort();
        }
        let lease = self.elector.lock().ok().and_then(|e| e.lease());
        if let Some((id, _)) = lease {
            let mut leases = self.client.lease_client();
            match tokio::time::timeout(CALL_TIMEOUT, leases.revoke(id)).await {
                Ok(Ok(_)) => tracing::info!(lease = format!("{id:x}"), "gave the lease back"),
                _ => tracing::warn!("could not give the lease back: it runs out by itself"),
            }
        }
    }

    /// The role, announced when it changed (logged, and in `/metrics`).
    fn show_role(&self) {
        let role = match self.elector.lock() {
            Ok(e) => e.role().clone(),
            Err(_) => return,
        };
        let changed = self.status.borrow().role.as_ref() != Some(&role);
        if changed {
            match &role {
                Role::Leader { epoch, .. } => {
                    tracing::info!(epoch, node = %self.node_id, "leading: this replica publishes");
                    metrics::gauge!("cdnmap_leader").set(1.0);
                    metrics::gauge!("cdnmap_leader_epoch").set(*epoch as f64);
                }
                Role::Standby => {
                    tracing::info!(node = %self.node_id, "standby: this replica does not publish");
                    metrics::gauge!("cdnmap_leader").set(0.0);
                }
            }
            self.status.send_modify(|s| s.role = Some(role));
        }
    }

    /// The node ids of the replicas campaigning, oldest first.
    async fn list_replicas(&self) {
        let mut kv = self.client.kv_client();
        let prefix = format!("{}/", self.election);
        let options = GetOptions::new().with_prefix().with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        );
        let got = tokio::time::timeout(CALL_TIMEOUT, kv.get(prefix, Some(options))).await;
        match got {
            Ok(Ok(r)) => {
                // Each value is "<node id> <gRPC URL>".
                let (replicas, urls) = r
                    .kvs()
                    .iter()
                    .map(|kv| {
                        let value = String::from_utf8_lossy(kv.value()).into_owned();
                        match value.split_once(' ') {
                            Some((id, url)) => (id.to_string(), url.to_string()),
                            None => (value, String::new()),
                        }
                    })
                    .unzip();
                self.note(None);
                self.status.send_modify(|s| {
                    s.replicas = replicas;
                    s.replica_urls = urls;
                });
            }
            Ok(Err(e)) => self.note(Some(e.to_string())),
            Err(_) => self.note(Some(format!("no answer within {CALL_TIMEOUT:?}"))),
        }
        metrics::gauge!("cdnmap_etcd_reachable").set(if self.status.borrow().etcd_reachable {
            1.0
        } else {
            0.0
        });
    }

    /// Carries out one command on a task of its own; the answer comes back as an event.
    fn execute(
        self: &Arc<Self>,
        command: Command,
        campaigns: &mut Vec<(LeaseId, tokio::task::AbortHandle)>,
    ) {
        let me = Arc::clone(self);
        let ttl_secs = match self.elector.lock() {
            Ok(e) => (e.ttl_ms() / 1000) as i64,
            Err(_) => return,
        };
        match command {
            Command::Grant => {
                tokio::spawn(async move {
                    let sent_ms = me.now_ms();
                    let mut leases = me.client.lease_client();
                    let granted = tokio::time::timeout(
                        CALL_TIMEOUT,
                        leases.grant(ttl_secs, None::<LeaseGrantOptions>),
                    )
                    .await;
                    let event = match granted {
                        Ok(Ok(r)) => {
                            me.note(None);
                            Event::Granted {
                                lease: r.id(),
                                ttl_ms: r.ttl().max(0) as u64 * 1000,
                                sent_ms,
                            }
                        }
                        Ok(Err(e)) => me.failed(Command::Grant, e.to_string()),
                        Err(_) => me.failed(Command::Grant, "no answer".into()),
                    };
                    let _ = me.events.send(event).await;
                });
            }
            Command::KeepAlive(lease) => {
                let ttl_ms = ttl_secs as u64 * 1000;
                tokio::spawn(async move {
                    let sent_ms = me.now_ms();
                    let mut leases = me.client.lease_client();
                    // etcd-client's `keep_alive` opens the stream, sends one keepalive and
                    // reads its answer: a lease etcd no longer has is its error.
                    let kept = tokio::time::timeout(CALL_TIMEOUT, leases.keep_alive(lease)).await;
                    let event = match kept {
                        Ok(Ok(_)) => {
                            me.note(None);
                            Event::KeptAlive {
                                lease,
                                ttl_ms,
                                sent_ms,
                            }
                        }
                        Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                            me.note(None);
                            Event::KeptAlive {
                                lease,
                                ttl_ms: 0,
                                sent_ms,
                            }
                        }
                        Ok(Err(e)) => me.failed(Command::KeepAlive(lease), e.to_string()),
                        Err(_) => me.failed(Command::KeepAlive(lease), "no answer".into()),
                    };
                    let _ = me.events.send(event).await;
                });
            }
            Command::Campaign(lease) => {
                let task = tokio::spawn(async move {
                    let mut election = me.client.election_client();
                    let name = me.election.clone();
                    let value = me
                        .campaign_value
                        .get()
                        .cloned()
                        .unwrap_or_else(|| me.node_id.clone());
                    let event = match election.campaign(name, value, lease).await {
                        Ok(mut r) => match r.take_leader() {
                            Some(leader) => Event::Elected {
                                lease,
                                key: leader.key().to_vec(),
                                epoch: leader.rev().max(0) as u64,
                            },
                            None => me.failed(Command::Campaign(lease), "no leader key".into()),
                        },
                        Err(e) => {
                            // Not a hot loop: the elector campaigns again at its next tick.
                            me.failed(Command::Campaign(lease), e.to_string())
                        }
                    };
                    let _ = me.events.send(event).await;
                });
                campaigns.push((lease, task.abort_handle()));
            }
            Command::Abandon(lease) => {
                for (_, h) in campaigns.iter().filter(|(l, _)| *l == lease) {
                    h.abort();
                }
            }
        }
    }

    fn failed(&self, command: Command, error: String) -> Event {
        tracing::debug!(?command, %error, "etcd call failed");
        self.note(Some(error));
        Event::Failed { command }
    }
}

#[cfg(test)]
mod tests {
    use super::all_loopback;

    #[test]
    fn plaintext_is_quiet_only_when_every_member_is_on_loopback() {
        let urls = |list: &[&str]| list.iter().map(|u| u.to_string()).collect::<Vec<_>>();
        assert!(all_loopback(&urls(&["http://127.0.0.1:2379"])));
        assert!(all_loopback(&urls(&[
            "http://localhost:2379/",
            "http://[::1]:2379",
            "http://127.0.0.2:2379"
        ])));
        assert!(!all_loopback(&urls(&["http://10.0.0.1:2379"])));
        assert!(!all_loopback(&urls(&[
            "http://127.0.0.1:2379",
            "http://etcd-2.example:2379"
        ])));
        assert!(!all_loopback(&urls(&["http://[2001:db8::1]:2379"])));
    }
}
