//! Leadership among replicas of the mapper (`cdnmap serve --etcd`): which one publishes.
//!
//! Every replica runs every round; only the leader publishes its map. Leadership is etcd's
//! election (`v3election`) on a lease of this replica's: `Campaign` returns once the replica's
//! key (`<election>/<lease id>`) is the oldest under the election's prefix, and the key's
//! create revision is the **epoch** of the term, stamped on every map published in it. The key
//! lives as long as the lease, which the replica keeps alive; when the lease ends (the replica
//! died, or could not reach etcd for a TTL) etcd deletes the key and the next-oldest campaign
//! wins, with a higher revision: epochs only grow.
//!
//! A replica publishes only if two things hold (`Elector::term`, then the etcd transaction of
//! the service's `Coordinator::publish`, `api/src/lead.rs`):
//! - by its own clock its lease is still alive, with a margin: the deadline is counted from
//!   the moment the last successful keepalive was *sent* (etcd counts the TTL from when it got
//!   it, which is later), so a replica that cannot renew stops believing it leads before etcd
//!   lets another lead;
//! - the publication goes through a transaction that compares the leader key's create
//!   revision with the epoch, so a replica whose key is gone never publishes, whatever its
//!   clock or scheduler did between the check and the write.
//!
//! The logic is the pure state machine [`Elector`]: events and the time in, commands out, no
//! I/O and no clock of its own (this crate depends on nothing but `std`). The service
//! (`api/src/lead.rs`) drives it against a real etcd; the tests in `sim.rs` drive it against a
//! model of etcd's election under seeded partitions, delays, message loss, pauses and clock
//! drift, and check the safety properties on every run.

#[cfg(test)]
mod sim;

use std::time::Duration;

/// A lease's identity as etcd gives it.
pub type LeaseId = i64;

/// What the elector asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Grant a lease of the elector's TTL (answer: [`Event::Granted`] or [`Event::Failed`]).
    Grant,
    /// Renew the lease (answer: [`Event::KeptAlive`] or [`Event::Failed`]).
    KeepAlive(LeaseId),
    /// Campaign with the lease: the answer ([`Event::Elected`]) comes when it leads.
    Campaign(LeaseId),
    /// Stop campaigning with this lease (it is lost): the driver drops the call in flight.
    Abandon(LeaseId),
}

/// What the driver tells the elector. `sent_ms` is the driver's clock when the request was
/// sent: a lease is alive for its TTL from then at the latest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Granted {
        lease: LeaseId,
        ttl_ms: u64,
        sent_ms: u64,
    },
    /// A keepalive's answer: `ttl_ms` 0 means etcd no longer has the lease.
    KeptAlive {
        lease: LeaseId,
        ttl_ms: u64,
        sent_ms: u64,
    },
    /// The campaign with `lease` won: `key` leads, created at revision `epoch`.
    Elected {
        lease: LeaseId,
        key: Vec<u8>,
        epoch: u64,
    },
    /// A publication's transaction found the leader key gone or another's (the term is over).
    Deposed { epoch: u64 },
    /// The request of `command` failed (unreachable, timed out, refused).
    Failed { command: Command },
}

/// A replica's role, as the service shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Not leading: runs the rounds, publishes nothing.
    Standby,
    /// Leading the term `epoch` through the key `key`.
    Leader { epoch: u64, key: Vec<u8> },
}

/// The lease held, by the elector's clock.
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: LeaseId,
    /// Alive until at least this time (the last renewal's send time plus the TTL granted).
    deadline_ms: u64,
}

/// A request in flight and when it was sent: one of each kind at a time, and a grant or a
/// renewal that gets no answer within a third of the TTL counts as failed (a driver may lose
/// an answer).
#[derive(Debug, Clone, Copy, Default)]
struct InFlight {
    grant: Option<u64>,
    keepalive: Option<u64>,
    campaign: Option<u64>,
}

/// The election's state machine (see the module docs). Time is an argument in milliseconds
/// of the driver's monotonic clock.
#[derive(Debug, Clone)]
pub struct Elector {
    ttl_ms: u64,
    /// A term is used for a publication only while at least this much of the lease is left.
    margin_ms: u64,
    lease: Option<Lease>,
    role: Role,
    in_flight: InFlight,
    next_keepalive_ms: u64,
}

/// The term a publication may go out under: the epoch and the leader key its transaction
/// compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub epoch: u64,
    pub key: Vec<u8>,
}

impl Elector {
    /// An elector whose leases last `ttl` (renewed every third of it); a term is used for a
    /// publication only while more than a fifth of the TTL is left.
    pub fn new(ttl: Duration) -> Elector {
        let ttl_ms = (ttl.as_millis() as u64).max(1_000);
        Elector {
            ttl_ms,
            margin_ms: ttl_ms / 5,
            lease: None,
            role: Role::Standby,
            in_flight: InFlight::default(),
            next_keepalive_ms: 0,
        }
    }

    /// The lease's TTL in milliseconds.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// How often the driver should call [`Elector::tick`].
    pub fn tick_every(&self) -> Duration {
        Duration::from_millis((self.ttl_ms / 10).max(50))
    }

    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The lease held and its deadline by this clock.
    pub fn lease(&self) -> Option<(LeaseId, u64)> {
        self.lease.map(|l| (l.id, l.deadline_ms))
    }

    /// The term a publication may go out under at `now_ms`: leading, with more than the
    /// margin of the lease left.
    pub fn term(&self, now_ms: u64) -> Option<Term> {
        match (&self.role, self.lease) {
            (Role::Leader { epoch, key }, Some(l))
                if now_ms.saturating_add(self.margin_ms) < l.deadline_ms =>
            {
                Some(Term {
                    epoch: *epoch,
                    key: key.clone(),
                })
            }
            _ => None,
        }
    }

    /// Advances to `now_ms`: a lease past its deadline is given up (and leadership with it),
    /// requests that got no answer within the TTL count as failed, and what is due is asked
    /// for: a lease when there is none, its renewal every third of the TTL, a campaign.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Command> {
        let mut out = Vec::new();
        // A grant or renewal unanswered for a renewal period is given up and asked again (a
        // lost one must not cost the lease, which one more period would).
        let stale = |sent: Option<u64>| sent.is_some_and(|s| now_ms >= s + self.ttl_ms / 3);
        if stale(self.in_flight.grant) {
            self.in_flight.grant = None;
        }
        if stale(self.in_flight.keepalive) {
            self.in_flight.keepalive = None;
        }
        if let Some(l) = self.lease {
            if now_ms >= l.deadline_ms {
                self.lose_lease(&mut out);
            }
        }
        match self.lease {
            None => {
                if self.in_flight.grant.is_none() {
                    self.in_flight.grant = Some(now_ms);
                    out.push(Command::Grant);
                }
            }
            Some(l) => {
                if self.in_flight.keepalive.is_none() && now_ms >= self.next_keepalive_ms {
                    self.in_flight.keepalive = Some(now_ms);
                    self.next_keepalive_ms = now_ms + self.ttl_ms / 3;
                    out.push(Command::KeepAlive(l.id));
                }
                if self.role == Role::Standby && self.in_flight.campaign.is_none() {
                    self.in_flight.campaign = Some(now_ms);
                    out.push(Command::Campaign(l.id));
                }
            }
        }
        out
    }

    /// Takes what the driver reports at `now_ms`; may ask for more at once.
    pub fn handle(&mut self, event: Event, now_ms: u64) -> Vec<Command> {
        let mut out = Vec::new();
        match event {
            Event::Granted {
                lease,
                ttl_ms,
                sent_ms,
            } => {
                self.in_flight.grant = None;
                if self.lease.is_some() || ttl_ms == 0 {
                    // A grant answered after another: that lease is left to expire unused.
                    return out;
                }
                self.lease = Some(Lease {
                    id: lease,
                    deadline_ms: sent_ms + ttl_ms.min(self.ttl_ms),
                });
                self.next_keepalive_ms = now_ms + self.ttl_ms / 3;
                out.extend(self.tick(now_ms));
            }
            Event::KeptAlive {
                lease,
                ttl_ms,
                sent_ms,
            } => {
                if self.lease.map(|l| l.id) != Some(lease) {
                    return out;
                }
                self.in_flight.keepalive = None;
                if ttl_ms == 0 {
                    // etcd has let the lease go: the key with it.
                    self.lose_lease(&mut out);
                    out.extend(self.tick(now_ms));
                } else if let Some(l) = &mut self.lease {
                    l.deadline_ms = l.deadline_ms.max(sent_ms + ttl_ms.min(self.ttl_ms));
                }
            }
            Event::Elected { lease, key, epoch } => {
                if self.lease.map(|l| l.id) != Some(lease) {
                    return out; // a campaign of a lease given up
                }
                self.in_flight.campaign = None;
                if self.lease.is_some_and(|l| now_ms < l.deadline_ms) {
                    self.role = Role::Leader { epoch, key };
                }
            }
            Event::Deposed { epoch } => {
                if matches!(self.role, Role::Leader { epoch: e, .. } if e == epoch) {
                    // The key is gone (the lease expired in etcd before it did here, say): the
                    // lease cannot be trusted either; start over with a new one.
                    self.lose_lease(&mut out);
                    out.extend(self.tick(now_ms));
                }
            }
            Event::Failed { command } => match command {
                Command::Grant => self.in_flight.grant = None,
                Command::KeepAlive(id) if self.lease.map(|l| l.id) == Some(id) => {
                    // Retried at the next tick, not a renewal period later: the lease has only
                    // so many periods (an etcd member that died takes some calls with it).
                    self.in_flight.keepalive = None;
                    self.next_keepalive_ms = now_ms;
                }
                Command::Campaign(id) if self.lease.map(|l| l.id) == Some(id) => {
                    self.in_flight.campaign = None;
                }
                _ => {}
            },
        }
        out
    }

    /// Gives the lease up (and the role with it): the campaign in flight is abandoned.
    fn lose_lease(&mut self, out: &mut Vec<Command>) {
        if let Some(l) = self.lease.take() {
            if self.in_flight.campaign.take().is_some() {
                out.push(Command::Abandon(l.id));
            }
        }
        self.in_flight.keepalive = None;
        self.role = Role::Standby;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn granted(e: &mut Elector, lease: LeaseId, at: u64) -> Vec<Command> {
        e.handle(
            Event::Granted {
                lease,
                ttl_ms: 10_000,
                sent_ms: at,
            },
            at,
        )
    }

    /// An elector that leads term `epoch` on lease 7 (granted at 0, elected at 10 ms).
    fn leading(epoch: u64) -> Elector {
        let mut e = Elector::new(TTL);
        e.tick(0);
        granted(&mut e, 7, 0);
        e.handle(
            Event::Elected {
                lease: 7,
                key: b"k".to_vec(),
                epoch,
            },
            10,
        );
        e
    }

    #[test]
    fn asks_for_a_lease_then_campaigns_and_keeps_it_alive() {
        let mut e = Elector::new(TTL);
        assert_eq!(e.tick(0), vec![Command::Grant]);
        assert_eq!(e.tick(100), vec![], "one grant in flight at a time");
        assert_eq!(granted(&mut e, 7, 100), vec![Command::Campaign(7)]);
        assert_eq!(e.tick(3_000), vec![]);
        assert_eq!(e.tick(3_434), vec![Command::KeepAlive(7)]);
        e.handle(
            Event::KeptAlive {
                lease: 7,
                ttl_ms: 10_000,
                sent_ms: 3_434,
            },
            3_500,
        );
        assert_eq!(e.lease(), Some((7, 13_434)));
    }

    #[test]
    fn leads_only_while_the_lease_has_more_than_the_margin_left() {
        let mut e = leading(42);
        assert_eq!(e.term(5_000).map(|t| t.epoch), Some(42));
        // The lease ends at 10 s by this clock; the margin is 2 s.
        assert_eq!(e.term(7_999).map(|t| t.epoch), Some(42));
        assert_eq!(e.term(8_000), None);
        // Past the deadline with no renewal: the lease and the role are given up.
        let out = e.tick(10_000);
        assert_eq!(e.role(), &Role::Standby);
        assert_eq!(out, vec![Command::Grant]);
    }

    #[test]
    fn an_answer_for_a_lease_given_up_changes_nothing() {
        let mut e = Elector::new(TTL);
        e.tick(0);
        granted(&mut e, 7, 0);
        assert_eq!(e.tick(10_000), vec![Command::Abandon(7), Command::Grant]);
        granted(&mut e, 8, 10_100);
        e.handle(
            Event::Elected {
                lease: 7,
                key: b"old".to_vec(),
                epoch: 3,
            },
            10_200,
        );
        assert_eq!(e.role(), &Role::Standby);
        e.handle(
            Event::KeptAlive {
                lease: 7,
                ttl_ms: 10_000,
                sent_ms: 10_150,
            },
            10_200,
        );
        assert_eq!(e.lease().map(|l| l.0), Some(8));
    }

    #[test]
    fn a_refused_publication_ends_the_term_and_the_lease() {
        let mut e = leading(42);
        assert_eq!(
            e.handle(Event::Deposed { epoch: 41 }, 20),
            vec![],
            "another term's refusal"
        );
        assert_eq!(
            e.handle(Event::Deposed { epoch: 42 }, 30),
            vec![Command::Grant]
        );
        assert_eq!(e.role(), &Role::Standby);
        assert_eq!(e.term(40), None);
    }

    #[test]
    fn a_lease_etcd_no_longer_has_is_given_up() {
        let mut e = Elector::new(TTL);
        e.tick(0);
        granted(&mut e, 7, 0);
        let out = e.handle(
            Event::KeptAlive {
                lease: 7,
                ttl_ms: 0,
                sent_ms: 4_000,
            },
            4_010,
        );
        assert_eq!(out, vec![Command::Abandon(7), Command::Grant]);
        assert_eq!(e.lease(), None);
    }
}
