//! The map version in use when the front end follows several mappers (the replicas of a highly
//! available mapper, issue 18): the highest identity (epoch, version) any stream has brought.
//!
//! One version is held whole, the one in use; the streams do not keep their own. Each stream
//! has a [`Follower`] for what only it receives (the parts of a full map, a delta being
//! applied), and for each message it is lent the version in use ([`take`]): a delta based on
//! it applies whichever mapper sent the version, a full map not above it is passed over, and
//! the follower gives the version back after the message, so a stream never pins an old map.
//! Which version is in use is decided in one place, [`InUse::offer`], under one lock: a
//! version is taken only when its identity is above the one in use, so two streams cannot
//! put a lower identity in after a higher one, and a mapper that comes back with an older
//! map (its store's, or a lower epoch's) never replaces the newer one.
//!
//! This relies on the contract of the mappers' epochs: each leadership term (each start of a
//! standalone mapper) has an epoch above every one before, so an identity names one map
//! whichever replica sent it. Pure: no I/O, no clock.

use cdnmap_proto::v1 as pb;
use cdnmap_serve::watch::{Applied, FollowError, Followed, Follower};

/// A map version's identity: (epoch, version), ordered as a pair.
pub type Key = (u64, u64);

/// The version in use and the mapper (by position in the list) that brought it.
#[derive(Default)]
pub struct InUse {
    followed: Option<Followed>,
    from: usize,
}

impl InUse {
    /// The version in use (cheap: its map and extras are shared).
    pub fn followed(&self) -> Option<Followed> {
        self.followed.clone()
    }

    /// The identity in use, if any.
    pub fn key(&self) -> Option<Key> {
        self.followed.as_ref().map(|f| f.identity.key())
    }

    /// The mapper the version in use came from.
    pub fn from(&self) -> Option<usize> {
        self.followed.as_ref().map(|_| self.from)
    }

    /// Puts `f`, brought by mapper `from`, in use if its identity is above the one in use;
    /// says whether it did. Equal or lower: nothing changes.
    pub fn offer(&mut self, f: &Followed, from: usize) -> bool {
        if self.key().is_some_and(|k| f.identity.key() <= k) {
            return false;
        }
        self.followed = Some(f.clone());
        self.from = from;
        true
    }
}

/// What a stream's message came to.
#[derive(Debug)]
pub enum Taken {
    /// A new version, above the one in use when the message was taken (offer it: another
    /// stream may have put a higher one in use meanwhile).
    New(Followed),
    /// A part of a full map; more are to come.
    Part,
    /// It cannot lead above the version in use (a full map, or a delta to an identity, not
    /// above it): passed over, and the stream goes on. A full map being received is dropped.
    Passed,
}

/// Applies `update` to a stream's `follower`, lending it `in_use` for the message: a delta
/// must be based on the version in use (else [`FollowError::Gap`]: that stream alone starts
/// again), a full map is built against it. On error the follower keeps nothing.
pub fn take(
    follower: &mut Follower,
    in_use: Option<Followed>,
    update: pb::MapUpdate,
) -> Result<Taken, FollowError> {
    let key = (update.epoch, update.version);
    if in_use.as_ref().is_some_and(|f| key <= f.identity.key()) {
        // A full map's parts all carry its identity and the one in use only grows, so once
        // its first part is passed over, so are the others; a map whose first part came
        // before a higher version was put in use is dropped here.
        *follower = Follower::default();
        return Ok(Taken::Passed);
    }
    follower.hold(in_use);
    let applied = follower.apply(update);
    // Given back, whatever happened: between messages a stream holds nothing.
    let held = follower.hold(None);
    match applied? {
        Applied::New => held.map(Taken::New).ok_or_else(|| FollowError::Invalid {
            field: "version".into(),
            problem: "applied but not held".into(),
        }),
        Applied::Part => Ok(Taken::Part),
        // Not above the version in use when its first part came: see above.
        Applied::Stale => Ok(Taken::Passed),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cdnmap_serve::watch::{delta_update, full_part, Edge, Identity};
    use cdnmap_serve::ServingMap;

    use super::*;
    use crate::local::test_map;

    fn id(epoch: u64, version: u64) -> Identity {
        Identity {
            epoch,
            version,
            solved_at_unix_ms: 0,
        }
    }

    fn with_edge<R>(f: impl FnOnce(&Edge<'_>) -> R) -> R {
        let policies = vec![cdnmap_serve::servers::Policy::default(); 2];
        let load = |_: &str, _: std::net::IpAddr| 0.5;
        let rules = vec![("*.video.example".to_string(), "video".to_string())];
        f(&Edge {
            policies: &policies,
            load: &load,
            rules: &rules,
            default_class: "web",
            bypass: &[],
        })
    }

    fn full(m: &ServingMap, at: (u64, u64)) -> pb::MapUpdate {
        with_edge(|e| full_part(e, id(at.0, at.1), m, 0))
    }

    fn delta(
        prev: &ServingMap,
        from: (u64, u64),
        next: &ServingMap,
        to: (u64, u64),
    ) -> pb::MapUpdate {
        with_edge(|e| delta_update(e, id(from.0, from.1), prev, id(to.0, to.1), next))
            .expect("a small delta")
    }

    /// A front end following `n` mappers, one [`Follower`] each, deciding as `lib.rs` does.
    struct Front {
        in_use: InUse,
        streams: Vec<Follower>,
    }

    impl Front {
        fn new(n: usize) -> Front {
            Front {
                in_use: InUse::default(),
                streams: (0..n).map(|_| Follower::default()).collect(),
            }
        }

        /// Mapper `s`'s message: what it came to, and whether it was put in use.
        fn message(
            &mut self,
            s: usize,
            update: pb::MapUpdate,
        ) -> Result<(String, bool), FollowError> {
            let taken = take(&mut self.streams[s], self.in_use.followed(), update)?;
            Ok(match taken {
                Taken::New(f) => ("new".into(), self.in_use.offer(&f, s)),
                Taken::Part => ("part".into(), false),
                Taken::Passed => ("passed".into(), false),
            })
        }

        fn in_use(&self) -> (Option<Key>, Option<usize>) {
            (self.in_use.key(), self.in_use.from())
        }

        fn map(&self) -> Arc<ServingMap> {
            Arc::clone(&self.in_use.followed().expect("a version in use").map)
        }
    }

    /// Four maps that differ in where their units are placed.
    fn maps() -> Vec<ServingMap> {
        let units = |a: f64, b: f64| {
            test_map(&[
                ("u1", 0, "10.0.0.0/24", a),
                ("u2", 1, "10.0.1.0/24", b),
                ("u3", 1, "10.1.0.0/16", 1.0),
            ])
        };
        vec![
            units(1.0, 1.0),
            units(0.5, 1.0),
            units(0.0, 0.25),
            units(1.0, 0.0),
        ]
    }

    /// The choice alone: only a higher identity is put in use, from whichever mapper.
    #[test]
    fn only_a_higher_identity_is_put_in_use() {
        let m = maps();
        let followed = |at: (u64, u64), k: usize| {
            let mut f = Follower::default();
            assert!(matches!(f.apply(full(&m[k], at)), Ok(Applied::New)));
            f.hold(None).expect("held")
        };
        let mut in_use = InUse::default();
        assert_eq!((in_use.key(), in_use.from()), (None, None));
        // (offered, by mapper, taken?, in use after)
        let steps = [
            ((5, 40), 0, true, (5, 40)),
            ((5, 40), 1, false, (5, 40)),
            ((5, 39), 1, false, (5, 40)),
            ((4, 900), 1, false, (5, 40)),
            ((5, 41), 1, true, (5, 41)),
            ((9, 1), 0, true, (9, 1)),
            ((5, 42), 1, false, (9, 1)),
            ((9, 1), 1, false, (9, 1)),
            ((9, 2), 0, true, (9, 2)),
        ];
        for (i, &(at, from, taken, after)) in steps.iter().enumerate() {
            assert_eq!(
                in_use.offer(&followed(at, i % 4), from),
                taken,
                "step {i}: {at:?}"
            );
            assert_eq!(in_use.key(), Some(after), "step {i}");
        }
        assert_eq!(in_use.from(), Some(0));
    }

    /// Mapper A leads (epoch 5), B stands by (an older epoch); A dies; B leads with epoch 9
    /// and sends version 1 as a full map: the front end takes it, follows B's deltas, and
    /// never takes A's stored (5, 40) when A comes back, nor A's deltas of epoch 5. A delta
    /// not based on the version in use is a gap for its stream only.
    #[test]
    fn the_highest_identity_of_all_streams_is_followed() {
        let m = maps();
        let (a, b) = (0, 1);
        let mut fe = Front::new(2);
        // A's full map, then its deltas.
        assert_eq!(
            fe.message(a, full(&m[0], (5, 38))),
            Ok(("new".into(), true))
        );
        assert_eq!(
            fe.message(a, delta(&m[0], (5, 38), &m[1], (5, 39))),
            Ok(("new".into(), true))
        );
        assert_eq!(fe.in_use(), (Some((5, 39)), Some(a)));
        assert_eq!(*fe.map(), m[1]);
        // B, a standby holding an older epoch's map: its full map and its deltas are passed
        // over, its stream going on.
        assert_eq!(
            fe.message(b, full(&m[2], (3, 7))),
            Ok(("passed".into(), false))
        );
        assert_eq!(
            fe.message(b, delta(&m[2], (3, 7), &m[3], (3, 8))),
            Ok(("passed".into(), false))
        );
        // A delta from A still applies: B's stream holds nothing of its own.
        assert_eq!(
            fe.message(a, delta(&m[1], (5, 39), &m[2], (5, 40))),
            Ok(("new".into(), true))
        );
        assert_eq!(*fe.map(), m[2]);
        // A delta based on a version not in use, to a higher identity: a gap, that stream's.
        let gap = fe.message(b, delta(&m[3], (3, 8), &m[0], (6, 1)));
        assert!(matches!(gap, Err(FollowError::Gap { .. })), "{gap:?}");
        assert_eq!(fe.in_use(), (Some((5, 40)), Some(a)));
        // A dies (its stream ends; nothing changes). B leads with epoch 9: a full map.
        assert_eq!(fe.message(b, full(&m[3], (9, 1))), Ok(("new".into(), true)));
        assert_eq!(fe.in_use(), (Some((9, 1)), Some(b)));
        assert_eq!(*fe.map(), m[3]);
        assert_eq!(
            fe.message(b, delta(&m[3], (9, 1), &m[0], (9, 2))),
            Ok(("new".into(), true))
        );
        // A comes back with its stored (5, 40) and goes on with epoch 5's deltas (as a
        // standby that missed the election would): never applied.
        assert_eq!(
            fe.message(a, full(&m[2], (5, 40))),
            Ok(("passed".into(), false))
        );
        assert_eq!(
            fe.message(a, delta(&m[2], (5, 40), &m[1], (5, 41))),
            Ok(("passed".into(), false))
        );
        assert_eq!(fe.in_use(), (Some((9, 2)), Some(b)));
        assert_eq!(*fe.map(), m[0]);
        // A, once a follower of B again, asks with the version in use and gets B's deltas
        // from it: they apply on A's stream.
        assert_eq!(
            fe.message(a, delta(&m[0], (9, 2), &m[1], (9, 3))),
            Ok(("new".into(), true))
        );
        assert_eq!(fe.in_use(), (Some((9, 3)), Some(a)));
        assert_eq!(*fe.map(), m[1]);
        // Between messages, no stream holds a version of its own.
        assert!(fe.streams.iter().all(|s| s.held().is_none()));
    }

    /// Two streams that each bring a new version from the same base: whichever is offered
    /// last, the higher stays in use.
    #[test]
    fn two_streams_cannot_put_a_lower_version_in_after_a_higher_one() {
        let m = maps();
        for higher_first in [true, false] {
            let mut fe = Front::new(2);
            assert_eq!(fe.message(0, full(&m[0], (7, 1))), Ok(("new".into(), true)));
            let base = fe.in_use.followed();
            let lower = take(
                &mut fe.streams[0],
                base.clone(),
                delta(&m[0], (7, 1), &m[1], (7, 2)),
            );
            let higher = take(
                &mut fe.streams[1],
                base,
                delta(&m[0], (7, 1), &m[2], (8, 1)),
            );
            let (Ok(Taken::New(lower)), Ok(Taken::New(higher))) = (lower, higher) else {
                panic!("both apply against the version in use");
            };
            let order = if higher_first {
                [(&higher, 1), (&lower, 0)]
            } else {
                [(&lower, 0), (&higher, 1)]
            };
            for (f, s) in order {
                fe.in_use.offer(f, s);
            }
            assert_eq!(
                fe.in_use(),
                (Some((8, 1)), Some(1)),
                "higher first: {higher_first}"
            );
            assert_eq!(*fe.map(), m[2]);
        }
    }
}
