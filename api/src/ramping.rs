//! Ramps carried out ([`crate::ramp`] says what one is): started and cancelled by an
//! operator (the dashboard), stepped after each published round by a task of their own.
//!
//! Every round that maps a step is checked against the guard's limits (the overflow risen
//! from the ramp's start, nodes newly full, the round's churn): past one, the ramp is halted
//! and rolled back (the cluster written as it was) and says which limit. An operator may
//! cancel a ramp (the same rollback). A ramp is interrupted, and left where it is, when
//! another change takes its cluster (deleted, set down or drained, its tree edited).
//!
//! A ramp is kept in the change history (each change of it a record, the last one whole), so
//! a restart goes on with it. Only the leader steps ramps (only its rounds are published).

use std::sync::Arc;

use cdnmap_engine::round::Snapshot;
use cdnmap_mapper::{ClusterState, Instance, Map};
use cdnmap_store::edit::{Edit, EditError};
use cdnmap_topology::format::cluster_file;

use crate::guard::{checked, outcome_of, past};
use crate::preview::{nodes_full, Previewed};
use crate::ramp::{
    budget_floor, estimated_move, next_scale, same_capacities, scale_of, written, Baseline, Goal,
    Phase, Ramp, Step, MAX_RAMP_ROUNDS, MAX_STEPS_KEPT,
};
use crate::service::Shared;
use crate::topology::{clean, Actor, Change, ChangeError, Outcome, MAX_REASON_LEN};

/// Ramps stepped, started or cancelled one at a time.
static STEPPING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a ramp reads of a map: the figures it is held to and each cluster's loads.
struct Loads {
    usage: Vec<f64>,
    demand: Vec<f64>,
    total: f64,
    overflow_share: f64,
    nodes_full: u64,
}

impl Loads {
    fn of(inst: &Instance, map: &Map) -> Loads {
        let usage = cdnmap_mapper::map::node_usage(inst, map);
        let nodes_full = nodes_full(inst, &usage);
        let total = inst.total_demand();
        Loads {
            demand: map.demand_per_cluster(inst),
            overflow_share: if total > 0.0 {
                map.total_overflow() / total
            } else {
                0.0
            },
            usage,
            total,
            nodes_full,
        }
    }

    /// Cluster `id`'s nodes in `inst`: (usage, capacity), and the demand placed on it.
    fn cluster(&self, inst: &Instance, id: &str) -> Option<(Vec<f64>, Vec<f64>, f64)> {
        let c = inst.cluster_index(id)?;
        let cl = &inst.clusters()[c as usize];
        let usage = (0..cl.nodes.len())
            .map(|n| self.usage[inst.global_node(c, n as u32)])
            .collect();
        let caps = cl.nodes.iter().map(|n| n.capacity).collect();
        Some((usage, caps, self.demand[c as usize]))
    }
}

/// The loads of `s`, off the async threads (a pass over every map unit).
async fn loads_of(s: &Arc<Snapshot>) -> Result<Loads, ChangeError> {
    let s = Arc::clone(s);
    tokio::task::spawn_blocking(move || Loads::of(&s.topology, &s.map))
        .await
        .map_err(|e| ChangeError::Store(format!("a ramp's loads: {e}")))
}

/// The next step of `r` planned on `s`'s loads: (scale, estimated moved share).
fn plan(r: &Ramp, s: &Snapshot, loads: &Loads) -> (f64, f64) {
    let now = r.scale();
    let Some((usage, caps, demand)) = loads.cluster(&s.topology, &r.cluster) else {
        let next = next_scale(r.goal.scale(), r.rounds, r.steps_written, now, 0.0);
        return (next, 0.0);
    };
    let floor = r.budget.map_or(0.0, |b| {
        budget_floor(&usage, &caps, demand, loads.total, b, now)
    });
    let next = next_scale(r.goal.scale(), r.rounds, r.steps_written, now, floor);
    let moved = estimated_move(&usage, &caps, demand, loads.total, now, next);
    (next, moved)
}

/// Refused, logged as a failed action on the ramp's cluster.
fn refused(why: String) -> ChangeError {
    ChangeError::Edit(EditError::Refused(why))
}

/// Starts a ramp of cluster `id` to `goal` over `rounds` (2..=[`MAX_RAMP_ROUNDS`]), as an
/// operator asks (the dashboard): the cluster must be up and not ramping; with a `[guard]`
/// the goal's preview (`seen`, else made now) is held to its limits (the per-round budget
/// aside: the steps keep to it) unless `force`d with a reason. The first step is written
/// now; the rounds step the rest ([`start_stepping`]).
#[allow(clippy::too_many_arguments)]
pub async fn start(
    shared: &Arc<Shared>,
    id: &str,
    goal: Goal,
    rounds: u32,
    reason: &str,
    actor: Actor,
    force: bool,
    seen: Option<Previewed>,
) -> Result<Ramp, ChangeError> {
    let _one = STEPPING.lock().await;
    let (from, current) = startable(shared, id, goal, rounds)?;
    let last = match goal {
        Goal::Drained => Edit::ClusterState {
            id: id.to_string(),
            state: ClusterState::Drained,
        },
        Goal::Capacity { scale } => Edit::UpsertCluster {
            cluster: from.scaled(scale),
        },
    };
    let mut reason = clean(reason, MAX_REASON_LEN);
    let mut predicted = seen.as_ref().map(outcome_of);
    if let Some((preview, passed)) = checked(shared, id, vec![last], seen, false).await? {
        predicted = Some(outcome_of(&preview));
        reason = past(passed, force, &reason).map_err(ChangeError::Guard)?;
    }
    let loads = loads_of(&current).await?;
    let now = crate::clock::now_unix_ms();
    let mut ramp = Ramp {
        id: shared.activity().next_ramp_id(),
        cluster: id.to_string(),
        goal,
        rounds,
        budget: shared.config().guard.max_moved_share_per_round,
        who: actor.who.clone(),
        remote: actor.remote.clone(),
        via: actor.via.to_string(),
        reason,
        started_at_unix_ms: now,
        from,
        baseline: Baseline {
            version: current.version,
            overflow_share: loads.overflow_share,
            nodes_full: loads.nodes_full,
        },
        predicted,
        steps: Vec::new(),
        steps_written: 0,
        phase: Phase::Running,
        why: None,
        ended_at_unix_ms: None,
        restoring: None,
    };
    // Recorded before its first step is written: killed between the two, the next start has
    // the ramp and takes the step up from the topology (`taken`), never a cluster cut by a
    // ramp nobody knows of.
    shared.activity().keep_ramp(&ramp);
    let (scale, moved) = plan(&ramp, &current, &loads);
    if scale < ramp.scale() {
        if let Err(e) = write_step(shared, &mut ramp, scale, moved).await {
            let why = format!("its first step could not be written: {e}");
            end(shared, &mut ramp, Phase::Interrupted, why, None).await;
            return Err(e);
        }
    }
    shared.activity().log_ramp(&ramp, "ramp_start", None);
    tracing::warn!(cluster = %id, ?goal, rounds, who = %ramp.who, "ramp started");
    Ok(ramp)
}

/// What a ramp of cluster `id` to `goal` over `rounds` starts from, or why it cannot start:
/// `rounds` in 2..=[`MAX_RAMP_ROUNDS`], a capacity goal in (0, 1), the cluster there, up and
/// not ramping, and a map in service. The cluster as it is, and that map.
fn startable(
    shared: &Arc<Shared>,
    id: &str,
    goal: Goal,
    rounds: u32,
) -> Result<(cdnmap_topology::format::ClusterFile, Arc<Snapshot>), ChangeError> {
    if !(2..=MAX_RAMP_ROUNDS).contains(&rounds) {
        return Err(refused(format!(
            "rounds: {rounds} is outside 2..={MAX_RAMP_ROUNDS} (one round: drain it at once)"
        )));
    }
    if let Goal::Capacity { scale } = goal {
        if !(scale.is_finite() && scale > 0.0 && scale < 1.0) {
            return Err(refused(format!(
                "scale: {scale} is outside (0, 1) (a cut to 0 is a drain)"
            )));
        }
    }
    let topology = shared.topology_now();
    let c = topology
        .cluster_index(id)
        .ok_or_else(|| ChangeError::Edit(EditError::NoCluster(id.to_string())))?;
    let from = cluster_file(&topology, c);
    if from.state != ClusterState::Up {
        return Err(refused(format!(
            "cluster {id:?} is {:?}: a ramp starts from an up cluster",
            from.state
        )));
    }
    let ramping = shared.activity().ramps();
    if ramping
        .iter()
        .any(|r| r.cluster == id && r.phase == Phase::Running)
    {
        return Err(refused(format!(
            "cluster {id:?} is ramping already: cancel that ramp first"
        )));
    }
    let current = shared.current().ok_or_else(|| {
        refused("no map yet: a ramp starts once the first round is published".into())
    })?;
    Ok((from, current))
}

/// Writes `r`'s next step (capacity `scale`; a drain's last step at 0) and keeps `r` with it.
async fn write_step(
    shared: &Arc<Shared>,
    r: &mut Ramp,
    scale: f64,
    moved: f64,
) -> Result<(), ChangeError> {
    let state = if r.goal == Goal::Drained && scale <= 0.0 {
        ClusterState::Drained
    } else {
        ClusterState::Up
    };
    shared
        .change(Change::UpsertCluster(written(&r.from, scale, state)))
        .await?;
    r.steps.push(Step {
        scale: if state == ClusterState::Drained {
            0.0
        } else {
            scale
        },
        seq: shared.topology.current_versioned().seq,
        at_unix_ms: crate::clock::now_unix_ms(),
        estimated_moved_share: moved,
        observed: None,
    });
    if r.steps.len() > MAX_STEPS_KEPT {
        r.steps.remove(0);
    }
    r.steps_written += 1;
    shared.activity().keep_ramp(r);
    Ok(())
}

/// Ends `r` in `phase`, saying `why`; `restore`: writes its cluster back as it was (in
/// `state`). Kept and logged.
async fn end(
    shared: &Arc<Shared>,
    r: &mut Ramp,
    phase: Phase,
    why: String,
    restore: Option<ClusterState>,
) {
    // The end is recorded before the cluster is written back: killed between the two, the
    // next start finishes the write-back (`finish_restoring`) rather than step a ramp the
    // operator ended.
    r.phase = phase;
    r.why = Some(why.clone());
    r.ended_at_unix_ms = Some(crate::clock::now_unix_ms());
    r.restoring = restore;
    shared.activity().keep_ramp(r);
    let error = finish_restoring(shared, r).await;
    if let Some(e) = &error {
        r.why = Some(format!("{why}; {e}"));
        shared.activity().keep_ramp(r);
    }
    let action = match phase {
        Phase::Running | Phase::Done => "ramp_done",
        Phase::Cancelled => "ramp_cancel",
        Phase::RolledBack => "ramp_rollback",
        Phase::Interrupted => "ramp_interrupted",
    };
    shared.activity().log_ramp(r, action, error);
    tracing::warn!(cluster = %r.cluster, ?phase, why = ?r.why, "ramp ended");
}

/// Makes `r`'s recorded write-back (`restoring`): its cluster as it was, in that state, when
/// the cluster is still as a step of the ramp left it (else another change took it since, and
/// it is left alone); then records it made. The error, when the write failed (it stays
/// recorded, and is tried again after the next round).
async fn finish_restoring(shared: &Arc<Shared>, r: &mut Ramp) -> Option<String> {
    let state = r.restoring?;
    let topology = shared.topology_now();
    let ours = topology
        .cluster_index(&r.cluster)
        .map(|c| cluster_file(&topology, c))
        .is_some_and(|now| scale_of(&r.from, &now).is_some());
    if ours {
        let mut back = r.from.clone();
        back.state = state;
        if let Err(e) = shared.change(Change::UpsertCluster(back)).await {
            return Some(format!("writing cluster {:?} back failed: {e}", r.cluster));
        }
    }
    r.restoring = None;
    shared.activity().keep_ramp(r);
    None
}

/// Cancels cluster `id`'s running ramp: its cluster written back as it was (up, at its
/// capacities).
pub async fn cancel(
    shared: &Arc<Shared>,
    id: &str,
    reason: &str,
    actor: &Actor,
) -> Result<Ramp, ChangeError> {
    let _one = STEPPING.lock().await;
    let mut r = shared
        .activity()
        .ramps()
        .into_iter()
        .find(|r| r.cluster == id && r.phase == Phase::Running)
        .ok_or_else(|| refused(format!("cluster {id:?} has no running ramp")))?;
    let why = format!(
        "cancelled by {} ({}): {}",
        actor.who,
        actor.via,
        clean(reason, MAX_REASON_LEN)
    );
    end(
        shared,
        &mut r,
        Phase::Cancelled,
        why,
        Some(ClusterState::Up),
    )
    .await;
    Ok(r)
}

/// Steps the running ramps after each published round until the service stops: subscribed
/// now, so no round published after this call is missed.
pub fn start_stepping(shared: &Arc<Shared>) -> tokio::task::JoinHandle<()> {
    let mut published = shared.read.updates.subscribe();
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        loop {
            match published.recv().await {
                Ok(s) => after_round(&shared, &s).await,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

/// After a published round `s`: each running ramp whose last step it maps (it was solved on
/// the topology with that step: the round's journal position, in the round history, is at
/// or past the step's) is observed, held to the guard, and stepped on (or ended).
async fn after_round(shared: &Arc<Shared>, s: &Arc<Snapshot>) {
    let _one = STEPPING.lock().await;
    // Write-backs recorded and not made (a process killed between the two, or a write that
    // failed): made now.
    for mut r in shared.activity().ramps() {
        if r.restoring.is_some() {
            if let Some(e) = finish_restoring(shared, &mut r).await {
                tracing::error!(cluster = %r.cluster, error = %e, "a ramp's write-back failed again");
            }
        }
    }
    let Some(base_seq) = shared.activity().topology_seq_of(s.version) else {
        return;
    };
    let running: Vec<Ramp> = shared
        .activity()
        .ramps()
        .into_iter()
        .filter(|r| r.phase == Phase::Running)
        .filter(|r| r.steps.last().is_none_or(|l| l.seq <= base_seq))
        .collect();
    if running.is_empty() {
        return;
    }
    let loads = match loads_of(s).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "ramps not stepped this round");
            return;
        }
    };
    for mut r in running {
        advance(shared, &mut r, s, &loads).await;
    }
}

/// One running ramp after a round `s` that maps its last step.
async fn advance(shared: &Arc<Shared>, r: &mut Ramp, s: &Snapshot, loads: &Loads) {
    let observed = Outcome {
        version: s.version,
        overflow_share: loads.overflow_share,
        moved_share: s.churn.unwrap_or(0.0),
    };
    let mut fresh = false;
    if let Some(last) = r.steps.last_mut() {
        fresh = last.observed.is_none();
        last.observed.get_or_insert(observed);
    }
    if let Some(why) = held(&shared.config().guard, &r.baseline, loads, observed) {
        let why = format!("halted by the guard at round {}: {why}", s.version);
        return end(shared, r, Phase::RolledBack, why, Some(ClusterState::Up)).await;
    }
    let written = r.steps_written;
    if let Some((why, restore)) = taken(shared, r) {
        return end(shared, r, Phase::Interrupted, why, restore).await;
    }
    if r.steps_written != written {
        // A step taken up from the topology: recorded now, whatever comes next.
        shared.activity().keep_ramp(r);
    }
    if r.scale() <= r.goal.scale() {
        let why = format!(
            "reached in {} steps; round {} mapped it: overflow {:.2}% (from {:.2}%)",
            r.steps_written,
            s.version,
            100.0 * loads.overflow_share,
            100.0 * r.baseline.overflow_share
        );
        return end(shared, r, Phase::Done, why, None).await;
    }
    let (scale, moved) = plan(r, s, loads);
    if scale >= r.scale() {
        // Held back by the budget (a node loaded past its capacity): the next round may
        // let it on; an operator may cancel it meanwhile. What this round observed is kept.
        if fresh {
            shared.activity().keep_ramp(r);
        }
        return;
    }
    if let Err(e) = write_step(shared, r, scale, moved).await {
        let why = format!("its next step could not be written: {e}");
        end(shared, r, Phase::Interrupted, why, None).await;
    }
}

/// The guard's limits a round observed past, against the ramp's start: the overflow risen by
/// more than `max_overflow_points`, more nodes full than `max_nodes_full_added` more, a churn
/// above `max_moved_share`.
fn held(
    guard: &crate::config::GuardConfig,
    base: &Baseline,
    loads: &Loads,
    o: Outcome,
) -> Option<String> {
    let mut out = Vec::new();
    if let Some(most) = guard.max_overflow_points {
        let points = 100.0 * (loads.overflow_share - base.overflow_share);
        if points.is_nan() || points > most {
            out.push(format!(
                "the overflow rose {points:.2} points, from {:.2}% to {:.2}% \
                 (guard.max_overflow_points = {most})",
                100.0 * base.overflow_share,
                100.0 * loads.overflow_share
            ));
        }
    }
    if let Some(most) = guard.max_nodes_full_added {
        let added = loads.nodes_full.saturating_sub(base.nodes_full);
        if added > most {
            out.push(format!(
                "{added} more resource nodes are full, {} in all (guard.max_nodes_full_added = {most})",
                loads.nodes_full
            ));
        }
    }
    if let Some(most) = guard.max_moved_share {
        if o.moved_share.is_nan() || o.moved_share > most {
            out.push(format!(
                "the round moved {:.2}% of the demand (guard.max_moved_share = {most})",
                100.0 * o.moved_share
            ));
        }
    }
    (!out.is_empty()).then(|| out.join("; "))
}

/// Whether another change took `r`'s cluster since its last step: why, and the state to write
/// it back in (its tree as it was) when only its state was changed. The cluster as a step of
/// the ramp left it is the ramp's, whichever step: the topology is the truth, so a step
/// journaled and not recorded (a process killed between the two) is taken up as the ramp's
/// position (`r` gets the step).
fn taken(shared: &Shared, r: &mut Ramp) -> Option<(String, Option<ClusterState>)> {
    let topology = shared.topology_now();
    let Some(c) = topology.cluster_index(&r.cluster) else {
        return Some(("the cluster was deleted".into(), None));
    };
    let now = cluster_file(&topology, c);
    let Some(scale) = scale_of(&r.from, &now) else {
        return Some(("another change edited the cluster's resources".into(), None));
    };
    let at = match now.state {
        // A drain's last step: drained at its own capacities.
        ClusterState::Drained if r.goal == Goal::Drained && (scale - 1.0).abs() <= 1e-9 => 0.0,
        ClusterState::Up => scale,
        other => {
            return Some((
                format!("another change set the cluster {other:?}"),
                Some(other),
            ));
        }
    };
    if !same_capacities(&[at], &[r.scale()]) {
        tracing::warn!(cluster = %r.cluster, recorded = r.scale(), found = at, "a ramp's step found in the topology, not in its record: taken up");
        r.steps.push(Step {
            scale: at,
            seq: shared.topology.current_versioned().seq,
            at_unix_ms: crate::clock::now_unix_ms(),
            estimated_moved_share: 0.0,
            observed: None,
        });
        r.steps_written += 1;
    }
    None
}
