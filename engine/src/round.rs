//! One mapping round, without I/O or a clock: the instance of the round and the previous
//! snapshot in, the next snapshot out. The service's loop calls it (through the driver) every
//! `cycle_secs`, publishes the result atomically and persists it; tests and replays call it
//! directly with a simulated clock.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use cdnmap_mapper::{
    churn, companion, effective_preferences, second_chance_seeded, solve, solve_seeded, verify,
    Allocation, Beyond, Instance, Map, ModelError, Rescore, SecondChance, SecondChanceParams,
    Solution, SolveOptions, SolveStats, Stickiness, UnitIdx,
};
use cdnmap_serve::resolve::{ClassRules, Resolver};
use cdnmap_serve::ServeError;
use cdnmap_topology::Topology;

/// One published map version: everything a query needs, never changed after it is built.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The epoch of the start that published it; a map's identity is (epoch, version), ordered
    /// as a pair.
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    /// The round's topology: its instance (real preferences, the cluster states and demand
    /// of the round) and the addressing it was answered with.
    pub topology: Topology,
    pub map: Map,
    pub resolver: Resolver,
    pub stats: SolveStats,
    /// Churn against the previous snapshot (`None` for the first).
    pub churn: Option<f64>,
    /// How long the round's parts took (zero for a snapshot read back from the store).
    pub timings: RoundTimings,
    /// The measured scores (RTT) the round used in place of the topology's estimates (none
    /// for a snapshot read back from the store).
    pub measured: Arc<Rescore>,
}

/// How long each part of [`round`] took, in milliseconds: measurements only (the clock is
/// read for them and for nothing else).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoundTimings {
    /// Stickiness's effective preferences.
    pub effective_ms: f64,
    /// The solve (seeded or cold), with the verifier when it runs.
    pub solve_ms: f64,
    /// Indexing the map for queries (the resolver).
    pub index_ms: f64,
}

fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl Snapshot {
    /// A snapshot read back from the store, as it was published: its identity (`epoch`,
    /// `version`, `solved_at_unix_ms`), the round's topology and the map, indexed with `rules`
    /// (no stats, churn or timings: no round made it here).
    pub fn restored(
        (epoch, version, solved_at_unix_ms): (u64, u64, i64),
        topology: Topology,
        map: Map,
        rules: ClassRules,
    ) -> Result<Snapshot, ServeError> {
        let resolver = Resolver::of_solution(&topology, &map, rules)?;
        Ok(Snapshot {
            epoch,
            version,
            solved_at_unix_ms,
            topology,
            map,
            resolver,
            stats: SolveStats::default(),
            churn: None,
            timings: RoundTimings::default(),
            measured: Arc::default(),
        })
    }
}

/// The second chance a round gives what the stable pass leaves in overflow (issue 20,
/// `[second_chance]` in the service's configuration): `Off`, or the nearest clusters with
/// room beyond a unit's list ([`cdnmap_mapper::second_chance`]; no chains: at 100 k–1 M units
/// they cost 90–560× the solve, `docs/perf/overflow.md`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RoundChance {
    pub mode: SecondChance,
    pub params: SecondChanceParams,
}

impl RoundChance {
    /// [`RoundChance::beyond_lists`] at the default bound
    /// ([`SecondChanceParams::max_beyond_ms`]'s default, the configuration's too).
    pub fn beyond_lists_at_default_bound() -> RoundChance {
        RoundChance::beyond_lists(SecondChanceParams::default().max_beyond_ms)
    }

    /// Beyond the lists within `max_beyond_ms` of a unit's best listed score, no chains.
    pub fn beyond_lists(max_beyond_ms: f32) -> RoundChance {
        RoundChance {
            mode: SecondChance::BeyondLists,
            params: SecondChanceParams {
                max_expansions: 0,
                max_beyond_ms,
                ..SecondChanceParams::default()
            },
        }
    }
}

/// Why a round produced no map (the last good one stays published).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoundError {
    #[error("building the round's preferences: {0}")]
    Model(#[from] ModelError),
    #[error("indexing the map for queries: {0}")]
    Serve(#[from] ServeError),
    #[error("the map failed verification: {0}")]
    Verify(String),
}

/// A round's map, solved and not yet indexed for queries: everything of a [`Snapshot`] but its
/// resolver, which is what the store keeps of a round.
#[derive(Debug, Clone)]
pub struct Solved {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    pub topology: Topology,
    pub map: Map,
    pub stats: SolveStats,
    pub churn: Option<f64>,
    /// The effective preferences and the solve (the index is timed by [`Solved::index`]).
    pub timings: RoundTimings,
    /// The measured scores used (see [`Snapshot::measured`]).
    pub measured: Arc<Rescore>,
}

/// Solves one round and indexes it for queries: [`solve_round`], then [`Solved::index`].
pub fn round(
    topology: &Topology,
    previous: Option<&Snapshot>,
    stickiness: &Stickiness,
    rules: ClassRules,
    epoch: u64,
    now_unix_ms: i64,
    check: bool,
) -> Result<Snapshot, RoundError> {
    solve_round(
        topology,
        previous,
        None,
        (stickiness, &RoundChance::default()),
        Arc::default(),
        epoch,
        now_unix_ms,
        check,
    )?
    .index(rules, previous)
}

/// Solves one round: seeded from `previous` (sticky) when there is one, cold otherwise; from
/// `served` instead of `previous`'s own map when given (the map clients were answered from,
/// in `previous`'s index space: a standby replica's is the leader's). The scores measured in
/// `measured` (of `topology`'s units) replace the topology's estimates
/// ([`effective_preferences`]). The map is checked by the independent verifier against the
/// preferences it was solved with when `check` is set (the service sets it in debug builds;
/// it costs about a solve). Then `chance`, the second chance for overflow: beyond the lists,
/// a unit first gets back the clusters beyond its list it had in the seed.
#[allow(clippy::too_many_arguments)]
pub fn solve_round(
    topology: &Topology,
    previous: Option<&Snapshot>,
    served: Option<&Map>,
    (stickiness, chance): (&Stickiness, &RoundChance),
    measured: Arc<Rescore>,
    epoch: u64,
    now_unix_ms: i64,
    check: bool,
) -> Result<Solved, RoundError> {
    let instance = &topology.instance;
    let mut timings = RoundTimings::default();
    let seed =
        previous.map(|prev| carry_over(&prev.topology, served.unwrap_or(&prev.map), instance));
    let t = std::time::Instant::now();
    let (preferences, sticky) = preferences(instance, seed.as_deref(), stickiness, &measured)?;
    timings.effective_ms = ms_since(t);
    let t = std::time::Instant::now();
    let (sol, beyond) = solve_preferences(
        instance,
        &preferences,
        sticky,
        chance,
        &SolveOptions::default(),
    );
    if check {
        checked(&preferences, &sol.map, &beyond)?;
    }
    timings.solve_ms = ms_since(t);
    let churn_now = seed.as_ref().map(|seed| churn(instance, seed, &sol.map));
    Ok(Solved {
        epoch,
        version: previous.map_or(1, |p| p.version + 1),
        solved_at_unix_ms: now_unix_ms,
        topology: topology.clone(),
        map: sol.map,
        stats: sol.stats,
        churn: churn_now,
        timings,
        measured,
    })
}

/// What the next round would publish were `topology` its input (the map in service's
/// topology with an operator's change): solved as the rounds solve (`settings`: the driver's
/// stickiness and second chance), seeded from `previous`, the map in service, with the scores
/// it measured. Nothing is published or stored, and the estimator is not stepped: previews
/// (`Admin.Preview`) run the rounds' own code on the forecast the last round used.
pub fn preview(
    topology: &Topology,
    previous: &Snapshot,
    settings: (&Stickiness, &RoundChance),
    now_unix_ms: i64,
) -> Result<Solved, RoundError> {
    solve_round(
        topology,
        Some(previous),
        None,
        settings,
        Arc::clone(&previous.measured),
        previous.epoch,
        now_unix_ms,
        false,
    )
}

/// A round's effective preferences, and the map it is solved from: seeded from `seed` (the
/// previous map, in `instance`'s index space) when sticky (a margin above 0), its incumbents
/// favoured; a cold solve's otherwise. The scores measured in `measured` replace the
/// instance's estimates ([`effective_preferences`]), and the operator's cost policy scores
/// them ([`cdnmap_mapper::policy`]). The service's round and the command line's `solve` and
/// `demo` all make their preferences here.
pub fn preferences<'m>(
    instance: &Instance,
    seed: Option<&'m Map>,
    stickiness: &Stickiness,
    measured: &Rescore,
) -> Result<(Instance, Option<&'m Map>), ModelError> {
    let sticky = seed.filter(|_| stickiness.margin > 0.0);
    // Incumbents are where the seed placed a unit, not its companion (chosen after the solve).
    let placed = sticky.map(Map::without_companions);
    // The operator's cost policy scores every unit from its latencies (measured or not).
    let policy = cdnmap_mapper::policy::rescore(instance, measured);
    let scores = policy.as_ref().unwrap_or(measured);
    let preferences = effective_preferences(instance, placed.as_deref(), stickiness, scores)?;
    Ok((preferences, sticky))
}

/// Solves `preferences` (made by [`preferences`]): seeded from `sticky` when given (where it
/// placed each unit: its companions are chosen again), cold otherwise, with `options`; the
/// companions of the classes that go with the winner reserved and the rest solved again around
/// them ([`cdnmap_mapper::companion`]); then `chance`, the second chance for overflow, which
/// works with `instance`'s own scores (its bound and estimates are RTTs) over the same
/// capacities and candidates, and gives a unit back first the clusters beyond its list it had
/// in the seed. The solution, and the placements the second chance made beyond the lists.
pub fn solve_preferences(
    instance: &Instance,
    preferences: &Instance,
    sticky: Option<&Map>,
    chance: &RoundChance,
    options: &SolveOptions,
) -> (Solution, Vec<Beyond>) {
    let seed = sticky.map(Map::without_companions);
    let mut sol = match seed.as_deref() {
        Some(seed) => solve_seeded(preferences, seed, options),
        None => solve(preferences, options),
    };
    let reserved = companion::reserve(instance, preferences, sticky, &mut sol, options)
        .unwrap_or_else(|e| {
            // Not reachable (the reservations leave finite, non-negative demands and
            // capacities); the map is then served without companions, its accounts whole.
            tracing::error!(error = %e, "round: the companions could not be reserved");
            None
        });
    let (instance, companions) = match &reserved {
        Some(r) => (&r.instance, r.companions.as_slice()),
        None => (instance, &[][..]),
    };
    let mut beyond = Vec::new();
    if chance.mode != SecondChance::Off {
        let (map, report) = second_chance_seeded(
            instance,
            &sol.map,
            seed.as_deref(),
            chance.mode,
            &chance.params,
        );
        if !report.beyond.is_empty() || report.moves > 0 {
            tracing::debug!(
                placed = report.placed,
                beyond = report.beyond.len(),
                moves = report.moves,
                "round: the second chance for overflow"
            );
        }
        sol.map = map;
        beyond = report.beyond;
    }
    if !companions.is_empty() {
        sol.map = companion::combine(&sol.map, companions);
    }
    (sol, beyond)
}

impl Solved {
    /// The snapshot: the map indexed for queries. The previous round's prefix index and unit
    /// columns are reused when the units are the same (they are unless the topology's units
    /// changed): only the answers are computed again. A [`Topology`] can always be indexed
    /// (its builder refuses what the index would), so this fails only on a broken invariant.
    pub fn index(
        self,
        rules: ClassRules,
        previous: Option<&Snapshot>,
    ) -> Result<Snapshot, RoundError> {
        let t = std::time::Instant::now();
        let resolver = self.resolver(rules, previous)?;
        Ok(self.with_resolver(resolver, ms_since(t)))
    }

    /// [`Solved::index`], with `alongside` run on a thread of its own meanwhile: the service
    /// stores the map while it is indexed, so a round costs the longer of the two, not their
    /// sum. `alongside`'s result comes back even when the index fails; a panic in it is
    /// resumed here.
    pub fn index_alongside<R: Send>(
        self,
        rules: ClassRules,
        previous: Option<&Snapshot>,
        alongside: impl FnOnce(&Solved) -> R + Send,
    ) -> (Result<Snapshot, RoundError>, R) {
        let (indexed, beside) = std::thread::scope(|scope| {
            let beside = scope.spawn(|| alongside(&self));
            let t = std::time::Instant::now();
            let resolver = self.resolver(rules, previous);
            (resolver.map(|r| (r, ms_since(t))), beside.join())
        });
        let beside = beside.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let snapshot = match indexed {
            Ok((resolver, index_ms)) => Ok(self.with_resolver(resolver, index_ms)),
            Err(e) => Err(e.into()),
        };
        (snapshot, beside)
    }

    fn resolver(
        &self,
        rules: ClassRules,
        previous: Option<&Snapshot>,
    ) -> Result<Resolver, ServeError> {
        Resolver::of_solution_after(
            &self.topology,
            &self.map,
            rules,
            previous.map(|p| &p.resolver),
        )
    }

    fn with_resolver(self, resolver: Resolver, index_ms: f64) -> Snapshot {
        Snapshot {
            epoch: self.epoch,
            version: self.version,
            solved_at_unix_ms: self.solved_at_unix_ms,
            topology: self.topology,
            map: self.map,
            resolver,
            stats: self.stats,
            churn: self.churn,
            timings: RoundTimings {
                index_ms,
                ..self.timings
            },
            measured: self.measured,
        }
    }
}

/// The verifier's word on `map`, where the placements outside the units' lists must be
/// exactly the second chance's (`beyond`): those are its design, anything else a fault.
fn checked(instance: &Instance, map: &Map, beyond: &[Beyond]) -> Result<(), RoundError> {
    let mut report = verify::verify(instance, map);
    let mut made: Vec<(UnitIdx, u32)> = beyond.iter().map(|b| (b.unit, b.cluster)).collect();
    made.sort_unstable();
    made.dedup();
    let mut found: Vec<(UnitIdx, u32)> = report
        .not_candidate
        .iter()
        .map(|p| (p.map_unit, p.cluster))
        .collect();
    found.sort_unstable();
    found.dedup();
    if found == made {
        report.not_candidate.clear();
    }
    if report.is_ok() {
        Ok(())
    } else {
        Err(RoundError::Verify(report.describe(instance, 5)))
    }
}

/// `map` (of `from`) re-indexed for `to` by map unit and cluster id: units and clusters that
/// are gone are dropped, new units start with nothing placed. When the two instances have the
/// same units and clusters this is the map itself, borrowed (the usual round: at 11 M map
/// units, a copy of the map and a comparison of every unit id were a tenth of a warm round).
pub fn carry_over<'a>(from: &Instance, map: &'a Map, to: &Instance) -> Cow<'a, Map> {
    let same_units = from.shares_units(to)
        || from.unit_count() == to.unit_count()
            && (0..to.unit_count() as UnitIdx).all(|u| from.unit_id(u) == to.unit_id(u));
    let same_clusters = from.clusters().len() == to.clusters().len()
        && from
            .clusters()
            .iter()
            .zip(to.clusters())
            .all(|(a, b)| a.id == b.id);
    if same_units && same_clusters && map.unit_count() == to.unit_count() {
        return Cow::Borrowed(map);
    }
    let cluster_of: HashMap<u32, u32> = from
        .clusters()
        .iter()
        .enumerate()
        .filter_map(|(i, c)| to.cluster_index(&c.id).map(|j| (i as u32, j)))
        .collect();
    let mut out = Map::with_capacity(to.unit_count(), to.unit_count());
    for u in 0..to.unit_count() as UnitIdx {
        match from
            .unit_index(to.unit_id(u))
            .filter(|&f| (f as usize) < map.unit_count())
        {
            Some(f) => {
                let to = |a: &Allocation| {
                    cluster_of.get(&a.cluster).map(|&c| Allocation {
                        cluster: c,
                        amount: a.amount,
                    })
                };
                let companion = map.companion(f).and_then(|a| to(&a));
                out.push_unit_with(
                    map.placed(f).iter().filter_map(to),
                    companion,
                    map.overflow(f),
                );
            }
            None => out.push_unit([], 0.0),
        }
    }
    Cow::Owned(out)
}

/// A map as WatchMap carries it (`serving`: each unit's shares of its demand, by cluster id)
/// as allocations of `to`'s units: each share times the unit's demand in `to`, by unit and
/// cluster id, in the order the shares come (the unit's preference order where it was
/// solved); units `serving` does not have start with nothing placed, clusters `to` does not
/// have are dropped. A standby replica seeds its rounds with the leader's published map this
/// way.
pub fn map_of_shares(serving: &cdnmap_serve::ServingMap, to: &Instance) -> Map {
    let cluster_of: Vec<Option<u32>> = serving
        .clusters()
        .iter()
        .map(|c| to.cluster_index(&c.id))
        .collect();
    let mut out = Map::with_capacity(to.unit_count(), to.unit_count());
    for u in 0..to.unit_count() as UnitIdx {
        let demand = to.unit_demand(u);
        match serving.unit_index(to.unit_id(u)) {
            Some(v) => {
                let (clusters, shares) = serving.shares(v);
                let allocs = clusters.iter().zip(shares).filter_map(|(&c, &s)| {
                    cluster_of
                        .get(c as usize)
                        .copied()
                        .flatten()
                        .map(|c| Allocation {
                            cluster: c,
                            amount: s * demand,
                        })
                });
                out.push_unit(allocs, serving.overflow(v) * demand);
            }
            None => out.push_unit([], 0.0),
        }
    }
    out
}

/// Per cluster, its utilization under `map`: the largest used/capacity over its resource nodes
/// (0 for a cluster with nothing placed; a node of capacity 0 with load counts as 1). A node
/// filled to its capacity within the solver's tolerance (`EPS_REL` × capacity) reads exactly
/// 1, so `> 1` means over capacity, never rounding error.
pub fn utilization(instance: &Instance, map: &Map) -> Vec<f64> {
    let used = cdnmap_mapper::map::node_usage(instance, map);
    instance
        .clusters()
        .iter()
        .enumerate()
        .map(|(c, cl)| {
            cl.nodes
                .iter()
                .enumerate()
                .map(|(n, node)| {
                    let u = used[instance.global_node(c as u32, n as u32)];
                    // The solver fills a node up to its capacity within its tolerance; the
                    // usage summed again here, in another order, lands an ulp or so either
                    // side of it. Within that tolerance the node is full: exactly 1.
                    let full_within = cdnmap_mapper::solve::EPS_REL * node.capacity.max(1.0);
                    if node.capacity > 0.0 && (u - node.capacity).abs() <= full_within {
                        1.0
                    } else if node.capacity > 0.0 {
                        u / node.capacity
                    } else if u > 0.0 {
                        1.0
                    } else {
                        0.0
                    }
                })
                .fold(0.0, f64::max)
        })
        .collect()
}

/// The map units of `new` whose answer may differ from `old`'s, and the ids of `old`'s units
/// that `new` no longer has: what a WatchMap delta carries (`cdnmap_serve::watch` compares).
pub fn changed_units(old: &Snapshot, new: &Snapshot) -> (Vec<UnitIdx>, Vec<String>) {
    cdnmap_serve::watch::changed_units(old.resolver.map(), new.resolver.map())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use cdnmap_mapper::{ClusterState, Limits};
    use cdnmap_topology::format::parse_instance;

    /// Four units, two clusters; "far" is everyone's second choice.
    fn instance() -> Topology {
        instance_with_room("3")
    }

    /// [`instance`] with `near`'s capacity `near` (2.5 splits a unit between the two).
    fn instance_with_room(near: &str) -> Topology {
        two_clusters(4, "1", near)
    }

    /// `units` units of demand `demand`, each preferring "near" (capacity `near`) to "far"
    /// (capacity 10).
    fn two_clusters(units: usize, demand: &str, near: &str) -> Topology {
        let units: Vec<String> = (1..=units)
            .map(|i| {
                format!(
                    r#"{{"id": "u{i}", "class": "web", "demand": {demand}, "prefixes": ["10.0.{i}.0/24"], "lat": 0, "lon": 0,
                  "candidates": [{{"cluster": "near", "score": 1}}, {{"cluster": "far", "score": 5}}]}}"#
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [{{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 1}}}}],
              "clusters": [
                {{"id": "near", "lat": 0, "lon": 0, "addresses": ["198.18.0.1"],
                  "resources": {{"name": "r", "kind": "bps", "capacity": {near}, "classes": ["web"]}}}},
                {{"id": "far", "lat": 0, "lon": 0, "addresses": ["198.18.1.1"],
                  "resources": {{"name": "r", "kind": "bps", "capacity": 10, "classes": ["web"]}}}}],
              "map_units": [{}]}}"#,
            units.join(", ")
        );
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    fn rules(inst: &Instance) -> ClassRules {
        ClassRules::for_instance(inst, &[], "web").expect("rules")
    }

    /// A map sent as shares (what a standby follows of the leader) and read back as
    /// allocations of the same topology is the map: each amount and overflow within 1e-9 of
    /// the unit's demand, in the same order.
    #[test]
    fn a_map_read_back_from_its_shares_is_the_map() {
        let inst = instance_with_room("2.5");
        let sol = cdnmap_mapper::solve(&inst, &SolveOptions::default());
        assert!(
            (0..inst.unit_count() as UnitIdx).any(|u| sol.map.allocations(u).len() > 1),
            "a unit is split: shares other than 1 are read back"
        );
        let serving = cdnmap_serve::ServingMap::of_solution(&inst, &sol.map).expect("served");
        let back = map_of_shares(&serving, &inst);
        assert_eq!(back.unit_count(), sol.map.unit_count());
        for u in 0..inst.unit_count() as UnitIdx {
            let d = inst.unit_demand(u);
            let (a, b) = (sol.map.allocations(u), back.allocations(u));
            assert_eq!(a.len(), b.len(), "unit {u}");
            for (x, y) in a.iter().zip(b) {
                assert_eq!(x.cluster, y.cluster, "unit {u}");
                assert!(
                    (x.amount - y.amount).abs() <= 1e-9 * d,
                    "unit {u}: {x:?} {y:?}"
                );
            }
            assert!(
                (sol.map.overflow(u) - back.overflow(u)).abs() <= 1e-9 * d,
                "unit {u}"
            );
        }
    }

    /// Indexing beside another job gives the snapshot indexing alone gives, hands the job the
    /// solved map, and returns its result; a panic in the job is the caller's.
    #[test]
    fn a_map_indexed_alongside_is_the_map_indexed_alone() {
        let inst = instance();
        let solved = || {
            solve_round(
                &inst,
                None,
                None,
                (&Stickiness::default(), &RoundChance::default()),
                Arc::default(),
                1,
                1_000,
                true,
            )
            .expect("solved")
        };
        let alone = solved().index(rules(&inst), None).expect("alone");
        let (beside, seen) = solved().index_alongside(rules(&inst), None, |s| {
            (s.version, s.map.clone(), s.topology.unit_count())
        });
        let beside = beside.expect("beside");
        assert_eq!(seen, (1, alone.map.clone(), 4));
        assert_eq!(beside.map, alone.map);
        assert_eq!(beside.version, alone.version);
        for u in 0..inst.unit_count() as UnitIdx {
            assert_eq!(
                beside.resolver.map().shares(u),
                alone.resolver.map().shares(u)
            );
        }
        let panicked = std::panic::catch_unwind(|| {
            solved().index_alongside(rules(&inst), None, |_| panic!("the job failed"))
        });
        assert!(panicked.is_err());
    }

    /// Three units of demand 0.1 fill "near" (capacity 0.3) exactly: its utilization reads
    /// exactly 1 (0.1 + 0.1 + 0.1 is 0.30000000000000004 in floats), "far" reads 0.
    #[test]
    fn a_full_cluster_reads_exactly_one() {
        let inst = two_clusters(3, "0.1", "0.3");
        let sol = cdnmap_mapper::solve(&inst, &SolveOptions::default());
        let near = inst
            .clusters()
            .iter()
            .position(|c| c.id == "near")
            .expect("near");
        let used = cdnmap_mapper::map::node_usage(&inst, &sol.map);
        let near_used = used[inst.global_node(near as u32, 0)];
        assert_ne!(
            near_used, 0.3,
            "the sum is off by an ulp: the case is a real one"
        );
        let utilization = utilization(&inst, &sol.map);
        assert_eq!(utilization[near], 1.0);
        assert_eq!(utilization[1 - near], 0.0);
    }

    /// A map against itself moved nothing: churn exactly 0, with splits whose shares do not
    /// sum to exactly 1 in floats; a real move still counts.
    #[test]
    fn an_unchanged_map_has_churn_exactly_zero() {
        let inst = instance();
        let a = |cluster, amount| Allocation { cluster, amount };
        let mut map = Map::with_capacity(4, 8);
        // 0.1/0.6 + 0.3/0.6 + 0.2/0.6 is 1 − 2.2e-16 in floats.
        map.push_unit([a(0, 0.1), a(1, 0.3)], 0.2);
        map.push_unit([a(0, 0.3), a(1, 0.6)], 0.1);
        map.push_unit([a(1, 1.0 / 3.0), a(0, 1.0 / 3.0)], 1.0 / 3.0);
        map.push_unit([a(0, 0.7), a(1, 0.1)], 0.2);
        assert_eq!(cdnmap_mapper::churn(&inst, &map, &map), 0.0);
        // The same split re-derived through other arithmetic (its last bits differ, as a
        // sticky round's do): no move either; a move of a millionth of a unit is one.
        let mut rederived = Map::with_capacity(4, 8);
        rederived.push_unit([a(0, 0.1 * (1.0 + 1e-15)), a(1, 0.3)], 0.2 * (1.0 - 1e-15));
        for u in 1..4 {
            rederived.push_unit(map.allocations(u).iter().copied(), map.overflow(u));
        }
        assert_eq!(cdnmap_mapper::churn(&inst, &map, &rederived), 0.0);
        let mut nudged = Map::with_capacity(4, 8);
        nudged.push_unit([a(0, 0.1 + 6e-7), a(1, 0.3)], 0.2 - 6e-7);
        for u in 1..4 {
            nudged.push_unit(map.allocations(u).iter().copied(), map.overflow(u));
        }
        let churn = cdnmap_mapper::churn(&inst, &map, &nudged);
        assert!((churn - 1e-6 / 4.0).abs() < 1e-12, "{churn}");
        // The last unit's 0.7 moves from one cluster to the other: 0.7 of 4 units' demand.
        let mut moved = Map::with_capacity(4, 8);
        for u in 0..3 {
            moved.push_unit(map.allocations(u).iter().copied(), map.overflow(u));
        }
        moved.push_unit([a(1, 0.8)], 0.2);
        let churn = cdnmap_mapper::churn(&inst, &map, &moved);
        assert!((churn - 0.175).abs() < 1e-12, "{churn}");
    }

    #[test]
    fn rounds_count_versions_and_an_unchanged_round_changes_nothing() {
        let inst = instance();
        let s1 = round(
            &inst,
            None,
            &Stickiness::default(),
            rules(&inst),
            1,
            1_000,
            true,
        )
        .expect("first round");
        assert_eq!(
            (s1.version, s1.churn, s1.solved_at_unix_ms),
            (1, None, 1_000)
        );
        let s2 = round(
            &inst,
            Some(&s1),
            &Stickiness::default(),
            rules(&inst),
            1,
            11_000,
            true,
        )
        .expect("second round");
        assert_eq!(s2.version, 2);
        assert_eq!(s2.churn, Some(0.0));
        assert_eq!(changed_units(&s1, &s2), (vec![], vec![]));
        // The same units: the second round's resolver kept the first's prefix index.
        assert!(s2.resolver.shares_index_with(&s1.resolver));
    }

    /// Two web units at (0, 0), u1 (10.0.1.0/24) and u2 (10.0.2.0/24), whose one candidate,
    /// "near" (score 10), has room for one; "beside", at (1, 0), 111 km away, with room for
    /// both, is no unit's candidate.
    pub(crate) fn overflow_with_room_beside() -> Topology {
        let unit = |id: &str, prefix: &str| {
            format!(
                r#"{{"id": "{id}", "class": "web", "demand": 1, "prefixes": ["{prefix}"], "lat": 0, "lon": 0,
                  "candidates": [{{"cluster": "near", "score": 10}}]}}"#
            )
        };
        let json = format!(
            r#"{{"traffic_classes": [{{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 1}}}}],
              "clusters": [
                {{"id": "near", "lat": 0, "lon": 0, "addresses": ["198.18.0.1"],
                  "resources": {{"name": "r", "kind": "bps", "capacity": 1, "classes": ["web"]}}}},
                {{"id": "beside", "lat": 1, "lon": 0, "addresses": ["198.18.1.1"],
                  "resources": {{"name": "r", "kind": "bps", "capacity": 10, "classes": ["web"]}}}}],
              "map_units": [{}, {}]}}"#,
            unit("u1", "10.0.1.0/24"),
            unit("u2", "10.0.2.0/24"),
        );
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    /// Two units whose one candidate, "near", has room for one; "beside" (111 km away, room
    /// for both) is no unit's candidate. Off: one unit overflows. Beyond the lists: it is
    /// placed at "beside" (the verifier, checking the round, takes that placement as the
    /// phase's), `Resolve` answers its clients from there, and the next round keeps it there.
    #[test]
    fn a_round_with_the_second_chance_places_overflow_beyond_the_lists() {
        let inst = overflow_with_room_beside();
        let solved = |previous: Option<&Snapshot>, chance: &RoundChance| {
            solve_round(
                &inst,
                previous,
                None,
                (&Stickiness::default(), chance),
                Arc::default(),
                1,
                0,
                true,
            )
            .expect("solved, and verified")
            .index(rules(&inst), previous)
            .expect("indexed")
        };
        let off = solved(None, &RoundChance::default());
        assert_eq!(off.map.total_overflow(), 1.0);
        let chance = RoundChance::beyond_lists(150.0);
        let s1 = solved(None, &chance);
        assert_eq!(s1.map.total_overflow(), 0.0);
        let beside = inst.cluster_index("beside").expect("beside");
        let placed: Vec<UnitIdx> = (0..2)
            .filter(|&u| s1.map.allocations(u).iter().any(|a| a.cluster == beside))
            .collect();
        assert_eq!(placed.len(), 1, "{:?}", s1.map);
        let prefix = ["10.0.1.1/32", "10.0.2.1/32"][placed[0] as usize];
        let answer = s1
            .resolver
            .resolve(prefix.parse().expect("net"), "www.cdn.example.");
        assert_eq!(answer.primary, Some(beside));
        // The next round, seeded: the same map, nothing moved.
        let s2 = solved(Some(&s1), &chance);
        assert_eq!(s2.map, s1.map);
        assert_eq!(s2.churn, Some(0.0));
    }

    #[test]
    fn draining_a_cluster_moves_its_units_and_only_them() {
        let inst = instance();
        let s1 = round(
            &inst,
            None,
            &Stickiness::default(),
            rules(&inst),
            1,
            0,
            true,
        )
        .expect("r1");
        let near = inst.cluster_index("near").expect("near");
        let drained = inst.with_cluster_state(near, ClusterState::Drained);
        let s2 = round(
            &drained,
            Some(&s1),
            &Stickiness::default(),
            rules(&drained),
            1,
            0,
            true,
        )
        .expect("r2");
        let (changed, removed) = changed_units(&s1, &s2);
        assert!(removed.is_empty());
        assert!(s2.resolver.shares_index_with(&s1.resolver));
        // Three units sat at "near" (its capacity); they move, the fourth stays at "far" but
        // loses "near" as its backup: all four change for a front end, one of them only there.
        assert_eq!(changed.len(), 4);
        let backup_only: Vec<&str> = changed
            .iter()
            .filter(|&&u| s2.map.allocations(u) == s1.map.allocations(u))
            .map(|&u| s2.topology.unit_id(u))
            .collect();
        assert_eq!(backup_only.len(), 1, "{backup_only:?}");
        assert_eq!(
            s2.resolver
                .backup(s2.topology.unit_index(backup_only[0]).expect("unit")),
            None
        );
        assert!((s2.churn.expect("churn") - 0.75).abs() < 1e-12);
        let client = "10.0.1.7/32".parse().expect("net");
        let answer = s2.resolver.resolve(client, "www.cdn.example");
        assert_eq!(answer.primary, inst.cluster_index("far"));
    }

    #[test]
    fn a_topology_change_carries_the_map_over_by_id() {
        let inst = instance();
        let s1 = round(
            &inst,
            None,
            &Stickiness::default(),
            rules(&inst),
            1,
            0,
            true,
        )
        .expect("r1");
        // The next round's instance lacks u4 (re-read from a file: ids, not indices, match).
        let mut file = serde_json_file(&inst);
        file.map_units.retain(|u| u.id != "u4");
        let smaller = file.build(Limits::default()).expect("valid");
        let s2 = round(
            &smaller,
            Some(&s1),
            &Stickiness::default(),
            rules(&smaller),
            1,
            0,
            true,
        )
        .expect("r2");
        let (changed, removed) = changed_units(&s1, &s2);
        assert_eq!(removed, vec!["u4".to_string()]);
        // Other units: indexed again, and u4's prefix no longer answers.
        assert!(!s2.resolver.shares_index_with(&s1.resolver));
        let client = "10.0.4.1/32".parse().expect("net");
        assert_eq!(s2.resolver.resolve(client, "www.cdn.example").unit, None);
        // u4 was at "far"; with it gone nobody has a reason to move.
        assert!(changed.is_empty(), "{changed:?}");
    }

    fn serde_json_file(inst: &Topology) -> cdnmap_topology::format::InstanceFile {
        let mut bytes = Vec::new();
        cdnmap_topology::format::write_instance(inst, &mut bytes).expect("write");
        serde_json::from_slice(&bytes).expect("read back")
    }
}
