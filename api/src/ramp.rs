//! What a ramp is (issue 45): a drain or a capacity cut carried out over rounds instead of at
//! once, and the arithmetic of its steps. Each step writes the cluster again with every
//! resource node's capacity stepped down (an upsert through the one topology writer:
//! journaled, replicated, previewable), so the solve's stickiness moves the least attached
//! demand first; a drain's last step sets the cluster drained with its capacities as they
//! were. The step after a round is the linear one ([`next_scale`]: `rounds` steps in all)
//! unless the per-round movement budget (`guard.max_moved_share_per_round`) holds it back
//! ([`budget_floor`]): then the ramp takes more rounds. `ramping.rs` carries ramps out.

use cdnmap_mapper::ClusterState;
use cdnmap_topology::format::ClusterFile;
use serde::{Deserialize, Serialize};

use crate::topology::Outcome;

/// The most rounds a ramp may be asked to take.
pub const MAX_RAMP_ROUNDS: u32 = 1_000;
/// The most steps a ramp records (a ramp held back by the budget takes more than `rounds`;
/// past this many it goes on, its oldest steps no longer listed).
pub const MAX_STEPS_KEPT: usize = 200;
/// Two capacities are the same when within this relative difference (a journal's JSON may
/// give the last bit back differently).
const SAME: f64 = 1e-9;

/// Where a ramp goes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(tag = "to", rename_all = "snake_case")]
pub enum Goal {
    /// Drained, its demand moved off step by step.
    Drained,
    /// Every resource node at `scale` times its capacity (0 < scale < 1).
    Capacity { scale: f64 },
}

impl Goal {
    /// The capacity scale the last step reaches (0: a drain's, written as the drained state).
    pub fn scale(&self) -> f64 {
        match self {
            Goal::Drained => 0.0,
            Goal::Capacity { scale } => *scale,
        }
    }
}

/// Where a ramp is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Running,
    /// Its goal reached and mapped.
    Done,
    /// Cancelled by an operator: the cluster written back as it was.
    Cancelled,
    /// Halted by the guard: the cluster written back as it was.
    RolledBack,
    /// Another change took its cluster: left as that change left it.
    Interrupted,
}

/// What a map shows before a ramp starts, which its rounds are held to.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Baseline {
    pub version: u64,
    pub overflow_share: f64,
    pub nodes_full: u64,
}

/// One step of a ramp.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Step {
    /// The capacity scale written (0: the drain's last step, the drained state).
    pub scale: f64,
    /// The topology journal's sequence number once it was written: a round solved on that
    /// topology or a later one maps it.
    pub seq: u64,
    pub at_unix_ms: i64,
    /// The share of the demand the step was estimated to move, from the map it was planned on.
    pub estimated_moved_share: f64,
    /// The first round that mapped it: its version, overflow share and churn.
    pub observed: Option<Outcome>,
}

/// A ramp as the history keeps it and the dashboard shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ramp {
    /// Numbers ramps from 1, across restarts.
    pub id: u64,
    pub cluster: String,
    pub goal: Goal,
    /// The rounds asked for (the steps without a budget holding them back).
    pub rounds: u32,
    /// The movement budget in force when it started (`guard.max_moved_share_per_round`).
    pub budget: Option<f64>,
    pub who: String,
    #[serde(default)]
    pub remote: String,
    pub via: String,
    pub reason: String,
    pub started_at_unix_ms: i64,
    /// The cluster as it was before the first step: what a rollback writes back.
    pub from: ClusterFile,
    pub baseline: Baseline,
    /// What the preview of its goal said (with a guard, or confirmed from the page).
    pub predicted: Option<Outcome>,
    /// The steps written, oldest first (at most [`MAX_STEPS_KEPT`]).
    pub steps: Vec<Step>,
    /// Steps written in all.
    pub steps_written: u32,
    pub phase: Phase,
    /// Why it ended, when it did not reach its goal (or how it did).
    pub why: Option<String>,
    pub ended_at_unix_ms: Option<i64>,
    /// An end's write-back of the cluster (in this state) recorded and not yet made: recorded
    /// first, so a process killed between the two finishes it at its next start.
    #[serde(default)]
    pub restoring: Option<ClusterState>,
}

impl Ramp {
    /// The capacity scale its last step wrote (1 before any).
    pub fn scale(&self) -> f64 {
        self.steps.last().map_or(1.0, |s| s.scale)
    }

    /// The state its cluster should be in now: drained once a drain's last step is written.
    pub fn expected_state(&self) -> ClusterState {
        if self.goal == Goal::Drained && self.scale() == 0.0 && !self.steps.is_empty() {
            ClusterState::Drained
        } else {
            ClusterState::Up
        }
    }

    /// The cluster as its last step wrote it.
    pub fn expected(&self) -> ClusterFile {
        written(&self.from, self.scale(), self.expected_state())
    }
}

/// `from` at capacity `scale` in `state` (a drain's last step: drained, at its own capacities).
pub fn written(from: &ClusterFile, scale: f64, state: ClusterState) -> ClusterFile {
    let mut c = if state == ClusterState::Drained {
        from.clone()
    } else {
        from.scaled(scale)
    };
    c.state = state;
    c
}

/// The capacity scale after `done` steps of a ramp to `goal` over `rounds`, at `now`: what is
/// left spread over the steps left (the linear schedule from 1, when on it), raised to `floor`
/// (what the movement budget allows now), never below the goal nor above `now`.
pub fn next_scale(goal: f64, rounds: u32, done: u32, now: f64, floor: f64) -> f64 {
    // What is left, over the steps left (the linear schedule, when on it).
    let left = rounds.saturating_sub(done).max(1);
    let linear = if left == 1 {
        goal
    } else {
        now - (now - goal) / f64::from(left)
    };
    linear.max(floor).max(goal).min(now)
}

/// The lowest capacity scale the budget lets a cluster step to from `now`: its nodes'
/// `usage` against their `capacity` (at scale `now`, in the map planned on), `demand` placed
/// on it of `total`, at most `budget` of `total` to move. A step to scale s' sheds, at each
/// node, the share (u − c·s'/now)/u of the demand through it; the cluster's demand times the
/// largest such share is the estimate (an over-estimate when only a subtree is full). 0 when
/// everything the cluster holds may move in one round.
pub fn budget_floor(
    usage: &[f64],
    capacity: &[f64],
    demand: f64,
    total: f64,
    budget: f64,
    now: f64,
) -> f64 {
    if demand <= 0.0 || total <= 0.0 {
        return 0.0;
    }
    let g = budget * total / demand;
    if g >= 1.0 {
        return 0.0;
    }
    usage
        .iter()
        .zip(capacity)
        .filter(|&(&u, &c)| c > 0.0 && u > 0.0)
        .map(|(&u, &c)| now * u * (1.0 - g) / c)
        .fold(0.0, f64::max)
}

/// The share of `total` a step from scale `now` to `next` is estimated to move (as in
/// [`budget_floor`]); a drain's last step (`next` 0) moves all the cluster holds.
pub fn estimated_move(
    usage: &[f64],
    capacity: &[f64],
    demand: f64,
    total: f64,
    now: f64,
    next: f64,
) -> f64 {
    if total <= 0.0 || demand <= 0.0 || now <= 0.0 {
        return 0.0;
    }
    let shed = usage
        .iter()
        .zip(capacity)
        .filter(|&(&u, &c)| c > 0.0 && u > 0.0)
        .map(|(&u, &c)| ((u - c * next / now) / u).clamp(0.0, 1.0))
        .fold(if next == 0.0 { 1.0 } else { 0.0 }, f64::max);
    shed * demand / total
}

/// The scale `now` is of `from`: every node's capacity the same multiple of its capacity in
/// `from` (within the journal's rounding; a node of capacity 0 stays 0), the trees alike;
/// `None` when they are not (another change edited the tree).
pub fn scale_of(from: &ClusterFile, now: &ClusterFile) -> Option<f64> {
    let (a, b) = (from.capacities(), now.capacities());
    if a.len() != b.len() {
        return None;
    }
    let (i, &base) = a.iter().enumerate().find(|&(_, &x)| x > 0.0)?;
    let s = b[i] / base;
    let scaled: Vec<f64> = a.iter().map(|x| x * s).collect();
    (s.is_finite() && s >= 0.0 && same_capacities(&scaled, &b)).then_some(s)
}

/// Whether two lists of capacities are the same within the journal's rounding.
pub fn same_capacities(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= SAME * x.abs().max(y.abs()).max(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a budget the schedule is linear over the rounds asked, ending at the goal.
    #[test]
    fn the_linear_schedule_reaches_the_goal_in_the_rounds_asked() {
        let mut now = 1.0;
        let mut seen = Vec::new();
        for done in 0..4 {
            now = next_scale(0.0, 4, done, now, 0.0);
            seen.push(now);
        }
        assert_eq!(seen, vec![0.75, 0.5, 0.25, 0.0]);
        let mut now = 1.0;
        for done in 0..5 {
            now = next_scale(0.6, 5, done, now, 0.0);
        }
        assert!((now - 0.6).abs() < 1e-12, "{now}");
        // Past the rounds asked it stays at the goal; from elsewhere (a step taken up from the
        // topology) what is left is spread over the steps left.
        assert_eq!(next_scale(0.6, 5, 9, 0.6, 0.0), 0.6);
        assert_eq!(next_scale(0.0, 4, 0, 0.5, 0.0), 0.375);
        assert_eq!(next_scale(0.2, 100, 99, 0.5, 0.0), 0.2);
    }

    /// The budget's floor keeps the estimated move of a step within the budget, and the
    /// estimate of a step to the floor is the budget itself.
    #[test]
    fn a_step_to_the_budget_floor_moves_the_budget() {
        // A cluster of two nodes, the root full (100 of 100), a leaf at 60 of 80; 100 of
        // 1,000 placed on it; 2% a round may move.
        let (usage, caps) = ([100.0, 60.0], [100.0, 80.0]);
        let floor = budget_floor(&usage, &caps, 100.0, 1000.0, 0.02, 1.0);
        assert!((floor - 0.8).abs() < 1e-12, "{floor}");
        let moved = estimated_move(&usage, &caps, 100.0, 1000.0, 1.0, floor);
        assert!((moved - 0.02).abs() < 1e-12, "{moved}");
        let next = next_scale(0.0, 2, 0, 1.0, floor);
        assert_eq!(next, 0.8, "the linear step (0.5) held back by the budget");
        // Half as loaded at scale 0.8: the next floor goes lower.
        assert!(budget_floor(&[50.0, 30.0], &[80.0, 64.0], 50.0, 1000.0, 0.02, 0.8) < 0.8);
        // Everything it holds within the budget: no floor, and a drain's last step moves it all.
        assert_eq!(budget_floor(&usage, &caps, 10.0, 1000.0, 0.02, 1.0), 0.0);
        let all = estimated_move(&usage, &caps, 10.0, 1000.0, 0.5, 0.0);
        assert!((all - 0.01).abs() < 1e-12, "{all}");
    }

    /// The scale of a cluster's tree against its tree before the ramp is found, within the
    /// journal's rounding; a tree edited otherwise has none.
    #[test]
    fn the_scale_of_a_stepped_cluster_is_found() {
        let from: ClusterFile = serde_json::from_str(
            r#"{"id": "a", "lat": 0, "lon": 0, "resources": {"name": "up", "kind": "bps",
                "capacity": 100, "children": [{"name": "cpu", "kind": "fps", "capacity": 40,
                "classes": ["web"]}]}}"#,
        )
        .expect("a cluster");
        let s = scale_of(&from, &from.scaled(0.37)).expect("a scale");
        assert!((s - 0.37).abs() < 1e-12, "{s}");
        assert_eq!(scale_of(&from, &from), Some(1.0));
        let mut edited = from.scaled(0.5);
        if let cdnmap_topology::format::ResourcesFile::Nested(n) = &mut edited.resources {
            n.children[0].capacity = 30.0;
        }
        assert_eq!(scale_of(&from, &edited), None);
    }

    /// A cluster's capacities scaled by a ramp compare equal within the journal's rounding.
    #[test]
    fn capacities_compare_within_rounding() {
        assert!(same_capacities(&[1e6, 0.3], &[1e6 * (1.0 + 1e-12), 0.3]));
        assert!(!same_capacities(&[1e6, 0.3], &[0.9e6, 0.3]));
        assert!(!same_capacities(&[1.0], &[1.0, 2.0]));
    }
}
