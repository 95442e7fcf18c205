//! The round driver: one step of the mapping loop, from what was observed since the last round
//! to the next snapshot. The service's loop runs it on the real clock (`api/src/service.rs`) and
//! `cdnmap replay` on a simulated one, so a replay exercises the code that runs in production:
//! the same order, the same estimator calls, the same round.
//!
//! A step, in order:
//! 1. the loads measured under the previous map teach the learners and the derater (the flow
//!    through each node is the previous map's shares of the demand observed, or of the demand
//!    planned for units nobody reported);
//! 2. the demand observed over the period feeds the forecasters, at the period's start;
//! 3. the learners age by one round;
//! 4. the round's instance: the topology with the forecast demand for `now`, and — with
//!    learning on — the learned coefficients (once confident) and derated capacities;
//! 5. [`crate::round::round`]: effective preferences, the seeded (or cold) solve, the resolver
//!    (which [`Driver::step_alongside`] builds while the caller stores the map).
//!
//! No I/O and no clock but the timings it reports (measurements only: they change nothing).

use std::sync::Arc;
use std::time::Instant;

use cdnmap_estimator::observed::UnitDemand;
use cdnmap_estimator::state::{through, Estimates};
use cdnmap_mapper::{admitted, ClusterIdx, Instance, ModelError, Rescore, Stickiness, UnitIdx};
use cdnmap_serve::resolve::ClassRules;
use cdnmap_topology::Topology;

use crate::round::{solve_round, RoundError, Snapshot, Solved};

/// What was observed since the last round.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    /// When the observed period began (the previous round's time): the demand is the
    /// forecasters' observation at that time.
    pub at_unix_ms: i64,
    /// Demand per map unit over the period (a column by unit index of the instance the
    /// reports were resolved against; matched by id when the round's topology differs).
    pub demand: UnitDemand,
    /// Measured loads under the previous map: (cluster id, resource node name, load).
    pub loads: Vec<(String, String, f64)>,
    /// Measured RTTs (the estimator's [`cdnmap_estimator::rtt::RttTable`] at the round's
    /// time): (unit, cluster, ms) by index of the round's base topology. The round scores those
    /// candidates by them instead of the topology's estimate.
    pub rtt: Vec<(UnitIdx, ClusterIdx, f32)>,
}

/// How long each part of a step took, in milliseconds (the round's own parts are in the
/// snapshot's [`crate::round::RoundTimings`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimings {
    /// Observing and applying the estimates (steps 1–4).
    pub estimate_ms: f64,
}

/// What a step made (the estimator's state after it, to store with the snapshot, is
/// [`Driver::estimates`]).
#[derive(Debug, Clone)]
pub struct Step {
    pub snapshot: Snapshot,
    pub timings: StepTimings,
}

/// Why a step made no snapshot (the last good one stays published).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    #[error("observing the load reports: {0}")]
    Learn(cdnmap_estimator::learn::LearnError),
    #[error("applying the estimates: {0}")]
    Estimates(ModelError),
    #[error("the hostname rules: {0}")]
    Rules(ModelError),
    #[error("the measured RTTs: {0}")]
    Measured(ModelError),
    #[error(transparent)]
    Round(#[from] RoundError),
}

/// The loop's state between steps: the estimator, and how rounds are solved.
#[derive(Debug, Clone)]
pub struct Driver {
    estimates: Estimates,
    stickiness: Stickiness,
    learning: bool,
    /// Verify every map (debug builds of the service; replays may).
    check: bool,
    /// The most units measured RTTs may reorder in a round ([`cdnmap_mapper::admitted`]).
    max_reordered: usize,
    /// The second chance for overflow ([`crate::round::RoundChance`]; off unless set).
    chance: crate::round::RoundChance,
}

impl Driver {
    pub fn new(estimates: Estimates, stickiness: Stickiness, learning: bool, check: bool) -> Self {
        Driver {
            estimates,
            stickiness,
            learning,
            check,
            max_reordered: cdnmap_estimator::rtt::RttConfig::default().max_reordered_units,
            chance: crate::round::RoundChance::default(),
        }
    }

    /// Rounds give overflow `chance`'s second chance (`[second_chance]`).
    pub fn with_second_chance(mut self, chance: crate::round::RoundChance) -> Self {
        self.chance = chance;
        self
    }

    /// The same driver letting measured RTTs reorder at most `units` map units a round.
    pub fn with_max_reordered(mut self, units: usize) -> Self {
        self.max_reordered = units;
        self
    }

    pub fn estimates(&self) -> &Estimates {
        &self.estimates
    }

    /// How its rounds are solved: the stickiness and the second chance (what a preview
    /// solves with, [`crate::round::preview`]).
    pub fn settings(&self) -> (Stickiness, crate::round::RoundChance) {
        (self.stickiness, self.chance)
    }

    /// One step: `observations` (since `previous` was made) in, the snapshot of `base` for
    /// `now` out, under `epoch`; `rules` gives the hostname rules of the round's instance.
    pub fn step(
        &mut self,
        base: &Topology,
        previous: Option<&Snapshot>,
        observations: &Observations,
        rules: impl FnOnce(&Instance) -> Result<ClassRules, ModelError>,
        epoch: u64,
        now: i64,
    ) -> Result<Step, StepError> {
        self.step_alongside(
            base,
            previous,
            None,
            observations,
            rules,
            epoch,
            now,
            |_, _| (),
        )
        .map(|(step, ())| step)
    }

    /// [`Driver::step`], with `alongside` run on a thread of its own while the map is indexed
    /// ([`Solved::index_alongside`]), given the solved map and the estimator's state after the
    /// step: the service stores the round there. When the index fails (only on a broken
    /// invariant: every topology can be indexed), `alongside` has run and its result is
    /// dropped.
    ///
    /// `served` is the map clients were answered from during the period, in `previous`'s
    /// index space, when it is not `previous`'s own: a standby replica's, whose own maps are
    /// never published, is the leader's. The loads are learned under it and the round is
    /// seeded from it, so a standby's first round as leader moves only what the round brings.
    #[allow(clippy::too_many_arguments)]
    pub fn step_alongside<R: Send>(
        &mut self,
        base: &Topology,
        previous: Option<&Snapshot>,
        served: Option<&cdnmap_mapper::Map>,
        observations: &Observations,
        rules: impl FnOnce(&Instance) -> Result<ClassRules, ModelError>,
        epoch: u64,
        now: i64,
        alongside: impl FnOnce(&Solved, &Estimates) -> R + Send,
    ) -> Result<(Step, R), StepError> {
        let (solved, rules, estimate_ms) =
            self.solve(base, previous, served, observations, rules, epoch, now)?;
        let estimates = &self.estimates;
        let (snapshot, beside) =
            solved.index_alongside(rules, previous, |s| alongside(s, estimates));
        let step = Step {
            snapshot: snapshot?,
            timings: StepTimings { estimate_ms },
        };
        Ok((step, beside))
    }

    /// Steps 1–4 and the solve of step 5: the round's map before it is indexed, the round's
    /// hostname rules, and how long the estimator took.
    #[allow(clippy::too_many_arguments)]
    fn solve(
        &mut self,
        base: &Topology,
        previous: Option<&Snapshot>,
        served: Option<&cdnmap_mapper::Map>,
        observations: &Observations,
        rules: impl FnOnce(&Instance) -> Result<ClassRules, ModelError>,
        epoch: u64,
        now: i64,
    ) -> Result<(Solved, ClassRules, f64), StepError> {
        let started = Instant::now();
        let est = &mut self.estimates;
        if let (Some(prev), false) = (previous, observations.loads.is_empty()) {
            let inst = &prev.topology.instance;
            let loads: Vec<(usize, f64)> = observations
                .loads
                .iter()
                .filter_map(|(c, n, v)| {
                    let ci = inst.cluster_index(c)?;
                    let ni = inst.clusters()[ci as usize]
                        .nodes
                        .iter()
                        .position(|x| x.name == *n)?;
                    Some((inst.global_node(ci, ni as u32), *v))
                })
                .collect();
            let reported = observations.demand.values_for(inst);
            let actual: Vec<Option<f64>> = (0..inst.unit_count() as UnitIdx)
                .map(|u| {
                    let r = reported[u as usize];
                    Some(if r.is_nan() { inst.unit_demand(u) } else { r })
                })
                .collect();
            let flow = through(inst, served.unwrap_or(&prev.map), Some(&actual));
            est.observe_loads(inst, &flow, &loads)
                .map_err(StepError::Learn)?;
        }
        est.observe_demand(base, observations.at_unix_ms, &observations.demand);
        est.next_round();
        let topology = base.with_instance(
            est.apply(base, now, true, self.learning)
                .map_err(StepError::Estimates)?,
        );
        let estimate_ms = started.elapsed().as_secs_f64() * 1e3;
        let rules = rules(&topology).map_err(StepError::Rules)?;
        let measured = Rescore::new(&topology.instance, observations.rtt.iter().copied())
            .map_err(StepError::Measured)?;
        // Against the scores the last round used, when its units and clusters are these (the
        // scores are by index: an added or deleted cluster renumbers the others).
        let same_clusters = |p: &Snapshot| {
            let (a, b) = (p.topology.clusters(), topology.clusters());
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.id == y.id)
        };
        let before = previous
            .filter(|p| p.topology.same_unit_ids(&topology) && same_clusters(p))
            .map(|p| Arc::clone(&p.measured))
            .unwrap_or_default();
        let (measured, held) = admitted(&topology.instance, &measured, &before, self.max_reordered);
        if held > 0 {
            tracing::info!(
                held,
                bound = self.max_reordered,
                "measured RTTs: units whose order would change wait for a later round"
            );
        }
        let solved = solve_round(
            &topology,
            previous,
            served,
            (&self.stickiness, &self.chance),
            Arc::new(measured),
            epoch,
            now,
            self.check,
        )?;
        Ok((solved, rules, estimate_ms))
    }
}
