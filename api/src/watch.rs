//! WatchMap on the mapper's side: a published [`Snapshot`] as a full map (in parts) or as the
//! delta from the version before. The messages themselves are made by `cdnmap_serve::watch`,
//! the one place that converts WatchMap, from the snapshot's serving map; this module gives
//! them what the service adds (selection policies, server loads, hostname rules).
//!
//! A stream whose caller asked for `changed_sections_only` keeps the map-wide sections it last
//! sent ([`Sections`]: from a full map's first part, or a delta that carried them all) and
//! sends each later delta against them, so a round that changed no cluster, rule, fallback or
//! last resort sends units only. It does not know what a caller that started at a version it
//! already held has (the server loads may be another mapper's), so the first delta it sends
//! such a caller carries every section.

use cdnmap_engine::round::Snapshot;
use cdnmap_proto::v1 as pb;
use cdnmap_serve::servers::Policy;
use cdnmap_serve::watch::{self as wire, Edge, Identity, Sections};

use crate::config::Config;
use crate::selection::ServerLoads;

/// What a message carries besides the snapshot: each cluster's selection policy (by cluster
/// index of the snapshot's instance), the last reported server loads, and the configuration's
/// hostname rules and default class.
pub struct EdgeParts<'a> {
    policies: &'a [Policy],
    loads: Option<&'a ServerLoads>,
    rules: Vec<(String, String)>,
    default_class: &'a str,
    bypass: Vec<(String, cdnmap_serve::watch::Bypass)>,
}

impl<'a> EdgeParts<'a> {
    pub fn new(policies: &'a [Policy], loads: Option<&'a ServerLoads>, config: &'a Config) -> Self {
        EdgeParts {
            policies,
            loads,
            rules: config.class_rule_pairs(),
            default_class: &config.default_class,
            bypass: config.bypass_pairs(),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&Edge<'_>) -> R) -> R {
        let loads = self.loads;
        let load = move |cluster: &str, a| loads.map_or(0.0, |l| l.get(cluster, a));
        f(&Edge {
            policies: self.policies,
            load: &load,
            rules: &self.rules,
            default_class: self.default_class,
            bypass: &self.bypass,
        })
    }
}

/// A snapshot's identity on the wire.
pub fn identity(s: &Snapshot) -> Identity {
    Identity {
        epoch: s.epoch,
        version: s.version,
        solved_at_unix_ms: s.solved_at_unix_ms,
    }
}

/// How many messages the whole map of `s` takes.
pub fn full_parts(s: &Snapshot) -> usize {
    wire::full_parts(s.resolver.map())
}

/// Message `part` of the whole map of `s`: what a front end joining, or fallen behind, starts
/// from.
pub fn full_part(edge: &EdgeParts<'_>, s: &Snapshot, part: usize) -> pb::MapUpdate {
    edge.with(|e| wire::full_part(e, identity(s), s.resolver.map(), part))
}

/// What changed from `prev` to `next` (by map unit id): the units whose answer may differ and
/// the units gone; with `held` (the sections the caller holds, which become `next`'s), the
/// clusters that changed and the other sections that differ; without, every section whole.
/// `None` when a full map is to be sent instead ([`wire::MAX_DELTA_UNITS`]).
pub fn delta_update(
    edge: &EdgeParts<'_>,
    held: Option<&mut Sections>,
    prev: &Snapshot,
    next: &Snapshot,
) -> Option<pb::MapUpdate> {
    edge.with(|e| {
        wire::delta_for(
            e,
            held,
            identity(prev),
            prev.resolver.map(),
            identity(next),
            next.resolver.map(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::sync::Arc;

    use cdnmap_mapper::{Instance, Limits, PerUnit, ResourceKind, Stickiness, TrafficClass};
    use cdnmap_serve::resolve::{ClassRules, Resolver};
    use cdnmap_topology::format::{
        CandidateFile, ClusterFile, InstanceFile, MapUnitFile, NestedNode, ResourcesFile,
    };
    use ipnet::IpNet;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use cdnmap_mapper::ClusterState;
    use cdnmap_serve::watch::{Applied, FollowError, Follower};

    use crate::selection::ServerLoads;

    use cdnmap_dns::local::LocalView;
    use cdnmap_engine::round::round;
    use cdnmap_store::{ServedRef, Store};

    const CLASSES: [&str; 3] = ["web", "video", "apps"];
    const QNAMES: [&str; 3] = [
        "www.cdn.example",
        "edge7.video.cdn.example",
        "api.apps.cdn.example",
    ];

    fn prefix(i: usize) -> IpNet {
        let text = if i % 5 == 4 {
            format!("2001:db8:{:x}::/48", i)
        } else {
            format!("10.{}.{}.0/24", i / 256, i % 256)
        };
        text.parse().expect("a prefix")
    }

    fn unit(rng: &mut ChaCha8Rng, i: usize, clusters: usize) -> MapUnitFile {
        let k = rng.random_range(1..=4usize);
        let mut ids: Vec<usize> = (0..clusters).collect();
        for j in 0..k {
            let x = rng.random_range(j..clusters);
            ids.swap(j, x);
        }
        MapUnitFile {
            id: format!("u{i:04}"),
            class: CLASSES[rng.random_range(0..3)].into(),
            demand: rng.random_range(0.5..3.5),
            prefixes: vec![prefix(i)],
            lat: 0.0,
            lon: 0.0,
            candidates: ids[..k]
                .iter()
                .map(|&c| CandidateFile {
                    cluster: format!("c{c:02}"),
                    score: rng.random_range(1.0..2.0),
                    cluster_rank: None,
                })
                .collect(),
        }
    }

    /// 300 units, 10 clusters of 2 servers, of 20 to 92 units of room (about as much as the
    /// demand): split units, overflow and backups all occur.
    fn world(rng: &mut ChaCha8Rng) -> InstanceFile {
        let clusters = (0..10)
            .map(|c| ClusterFile {
                id: format!("c{c:02}"),
                lat: 0.0,
                lon: 0.0,
                addresses: vec![
                    IpAddr::from([198, 18, c as u8, 1]),
                    IpAddr::from([198, 18, c as u8, 2]),
                ],
                state: ClusterState::Up,
                classes: None,
                resources: ResourcesFile::Nested(NestedNode {
                    name: "r".into(),
                    kind: ResourceKind::Bps,
                    capacity: 20.0 + 8.0 * c as f64,
                    classes: CLASSES.iter().map(|c| c.to_string()).collect(),
                    children: Vec::new(),
                }),
            })
            .collect();
        InstanceFile {
            traffic_classes: CLASSES
                .iter()
                .enumerate()
                .map(|(k, name)| TrafficClass {
                    name: name.to_string(),
                    priority: k as u32,
                    per_unit: PerUnit { bps: 1.0, fps: 0.0 },
                    companion_share: 0.0,
                })
                .collect(),
            clusters,
            map_units: (0..300).map(|i| unit(rng, i, 10)).collect(),
            policy: None,
        }
    }

    /// Some change of the kinds a round brings: demand noise, a cluster's state, a unit gone,
    /// new, or with another class or prefix.
    fn perturb(rng: &mut ChaCha8Rng, file: &mut InstanceFile, next_id: &mut usize) {
        for u in &mut file.map_units {
            u.demand *= rng.random_range(0.8..1.25);
        }
        if rng.random_bool(0.3) {
            let c = rng.random_range(0..file.clusters.len());
            file.clusters[c].state = [ClusterState::Up, ClusterState::Drained, ClusterState::Down]
                [rng.random_range(0..3)];
        }
        if rng.random_bool(0.2) && file.map_units.len() > 1 {
            let i = rng.random_range(0..file.map_units.len());
            file.map_units.remove(i);
        }
        if rng.random_bool(0.2) {
            file.map_units.push(unit(rng, *next_id, 10));
            *next_id += 1;
        }
        if rng.random_bool(0.1) {
            let i = rng.random_range(0..file.map_units.len());
            file.map_units[i].class = CLASSES[rng.random_range(0..3)].into();
        }
        if rng.random_bool(0.1) {
            let i = rng.random_range(0..file.map_units.len());
            file.map_units[i].prefixes = vec![prefix(*next_id)];
            *next_id += 1;
        }
    }

    fn rules(config: &Config, instance: &Instance) -> ClassRules {
        ClassRules::for_instance(instance, &config.class_rule_pairs(), &config.default_class)
            .expect("the default rules")
    }

    /// What a restarted mapper serves: the snapshot through the store and back.
    fn restored(config: &Config, s: &Snapshot, dir: &std::path::Path) -> Snapshot {
        let store = Store::open(dir).expect("open");
        store.put_topology(&s.topology).expect("topology");
        store
            .put_served(
                &ServedRef {
                    epoch: s.epoch,
                    version: s.version,
                    solved_at_unix_ms: s.solved_at_unix_ms,
                    base_seq: 0,
                    instance: &s.topology,
                    map: &s.map,
                    round_entry: &[],
                },
                4,
            )
            .expect("store");
        let served = store.served().expect("read").expect("stored");
        let rules = rules(config, &served.topology);
        let identity = (served.epoch, served.version, served.solved_at_unix_ms);
        Snapshot::restored(identity, served.topology, served.map, rules).expect("index")
    }

    /// Every unit's prefix, a few hosts in it, every class's name: the front end's view and
    /// the mapper's resolver give the same unit, clusters and scope.
    fn assert_same_answers(front: &Follower, s: &Snapshot, step: usize) -> usize {
        assert_eq!(front.identity(), (s.epoch, s.version), "step {step}");
        let held = front.held().expect("a map held");
        let view = LocalView::build(held, &[], None).expect("the front end indexes its copy");
        let (mine, theirs) = (&s.resolver, &view.resolver);
        assert_eq!(
            **mine.map(),
            *held.map,
            "step {step}: the front end's serving map is the mapper's"
        );
        let id =
            |r: &Resolver, c: Option<u32>| c.map(|c| r.map().clusters()[c as usize].id.clone());
        let mut checked = 0;
        for u in 0..s.topology.unit_count() as u32 {
            for p in s.topology.unit_prefixes(u) {
                for host in 0..6u32 {
                    let client: IpNet = match p.network() {
                        IpAddr::V4(a) => IpNet::from(IpAddr::from(std::net::Ipv4Addr::from(
                            u32::from(a) + host * 37,
                        ))),
                        IpAddr::V6(a) => IpNet::from(IpAddr::from(std::net::Ipv6Addr::from(
                            u128::from(a) + u128::from(host) * 9_973,
                        ))),
                    };
                    for q in QNAMES {
                        let (a, b) = (mine.resolve(client, q), theirs.resolve(client, q));
                        let unit_of = |r: &Resolver, x: Option<u32>| {
                            x.map(|u| r.map().unit_id(u).to_string())
                        };
                        assert_eq!(
                            (
                                unit_of(mine, a.unit),
                                id(mine, a.primary),
                                id(mine, a.secondary),
                                a.scope_prefix_len
                            ),
                            (
                                unit_of(theirs, b.unit),
                                id(theirs, b.primary),
                                id(theirs, b.secondary),
                                b.scope_prefix_len
                            ),
                            "step {step}: {client} {q} (unit {}: allocations {:?} overflow {} candidates {:?}, states {:?})",
                            s.topology.unit_id(u),
                            s.map.allocations(u),
                            s.map.overflow(u),
                            s.topology.candidates(u).map(|c| c.cluster).collect::<Vec<_>>(),
                            s.topology.clusters().iter().map(|c| c.state).collect::<Vec<_>>()
                        );
                        checked += 1;
                    }
                }
            }
        }
        checked
    }

    /// A front end following a long random run of rounds, with mapper restarts (a new epoch,
    /// the stored map served first) and falls behind (a delta missed: the stream restarts
    /// from a full map), answers every client exactly like the mapper's `Resolve` at the
    /// same version, after every update.
    #[test]
    fn a_front_end_fed_deltas_and_restarts_answers_like_resolve() {
        let config = Config::default();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rng = ChaCha8Rng::seed_from_u64(15);
        let mut file = world(&mut rng);
        let mut next_id = 300;
        let mut epoch = 1;
        let mut current: Option<Arc<Snapshot>> = None;
        let mut front = Follower::default();
        // The stream's last message, per connection: `None` right after a (re)connect.
        let mut sent: Option<Arc<Snapshot>> = None;
        // The sections the stream sent the front end, as `mapping::follow` keeps them (`None`:
        // not known, after a reconnect to the version held).
        let mut held: Option<Sections> = None;
        let loads = ServerLoads::default();
        let mut sparse = 0;
        let (mut deltas, mut fulls, mut restarts, mut gaps, mut split, mut checked) =
            (0, 0, 0, 0, 0, 0);
        for step in 0..60 {
            perturb(&mut rng, &mut file, &mut next_id);
            let instance = file.build(Limits::default()).expect("a valid world");
            let snapshot = round(
                &instance,
                current.as_deref(),
                &Stickiness::default(),
                rules(&config, &instance),
                epoch,
                step as i64 * 10_000,
                false,
            )
            .expect("a round");
            let mut snapshot = Arc::new(snapshot);
            if step % 13 == 12 {
                // The mapper restarts: it serves what it stored, under its identity, and the
                // next round takes a new epoch; the front end reconnects.
                snapshot = Arc::new(restored(&config, &snapshot, dir.path()));
                epoch += 1;
                restarts += 1;
                sent = None;
                held = None;
            }
            // Cluster c00 picks its servers by load; a load reported every third round.
            let mut policies = config.selection.policies(&snapshot.topology);
            policies[0] = Policy::PowerOfD { vnodes: 10, d: 2 };
            if step % 3 == 0 {
                let a = IpAddr::from([198, 18, 0, 1 + (step % 2) as u8]);
                assert!(loads.set("c00", a, step as f64));
            }
            let edge = EdgeParts::new(&policies, Some(&loads), &config);
            let missed = step % 7 == 5;
            let update = match &sent {
                Some(prev) if prev.version + 1 == snapshot.version => {
                    let d = delta_update(&edge, held.as_mut(), prev, &snapshot)
                        .expect("a round's delta of a small world");
                    if d.sections.is_none() {
                        held = Some(Sections::of(&d));
                    } else {
                        sparse += 1;
                    }
                    d
                }
                _ if front.identity() == (snapshot.epoch, snapshot.version) => {
                    // A reconnect to the version held: nothing is sent.
                    sent = Some(Arc::clone(&snapshot));
                    current = Some(snapshot);
                    continue;
                }
                _ => {
                    // A full map: its parts up to the last, which the loop below applies.
                    let parts = full_parts(&snapshot);
                    held = Some(Sections::of(&full_part(&edge, &snapshot, 0)));
                    for part in 0..parts - 1 {
                        let applied = front.apply(full_part(&edge, &snapshot, part));
                        assert_eq!(applied, Ok(Applied::Part), "step {step}");
                    }
                    full_part(&edge, &snapshot, parts - 1)
                }
            };
            sent = Some(Arc::clone(&snapshot));
            current = Some(Arc::clone(&snapshot));
            if missed && !update.full {
                // This delta never reaches the front end; the next one does not follow what
                // it holds, so the stream restarts from a full map.
                gaps += 1;
                continue;
            }
            match front.apply(update.clone()) {
                Ok(applied) => assert_eq!(applied, Applied::New, "step {step}"),
                Err(FollowError::Gap { .. }) => {
                    held = Some(Sections::of(&full_part(&edge, &snapshot, 0)));
                    for part in 0..full_parts(&snapshot) {
                        front
                            .apply(full_part(&edge, &snapshot, part))
                            .expect("a full map");
                    }
                    fulls += 1;
                }
                Err(e) => panic!("step {step}: {e}"),
            }
            if update.full {
                fulls += 1;
            } else {
                deltas += 1;
            }
            split += (0..snapshot.topology.unit_count() as u32)
                .filter(|&u| snapshot.map.allocations(u).len() > 1)
                .count();
            checked += assert_same_answers(&front, &snapshot, step);
            // What the front end selects servers by is the mapper's: the policies, and the
            // loads of the power-of-d cluster as last reported.
            let x = &front.held().expect("held").extras;
            assert_eq!(x.policies, policies, "step {step}");
            let c00 = &snapshot.resolver.map().clusters()[0];
            let want: Vec<f64> = c00.addresses.iter().map(|&a| loads.get("c00", a)).collect();
            assert_eq!(x.loads[0], want, "step {step}");
        }
        assert!(sparse >= 20, "{sparse} deltas of the changed sections only");
        assert!(
            deltas >= 30 && restarts >= 4 && gaps >= 3,
            "{deltas} deltas, {restarts} restarts, {gaps} gaps"
        );
        assert!(fulls >= restarts, "{fulls} full maps");
        assert!(
            split >= 20,
            "split units (hashed by client and name) are exercised: {split}"
        );
        assert!(checked > 100_000, "{checked}");
    }
}
