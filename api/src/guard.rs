//! The guard (issue 45): an operator's change of cluster states whose preview exceeds the
//! configured limits (`[guard]`: the overflow rising by more than so many points, more than a
//! share of the demand moving, resource nodes newly full) is refused, unless the operator
//! forces it with a reason; the refusal and the forcing both name the limit, in the action's
//! event and in the answer. Off unless a limit is configured. The check is the preview the
//! dashboard shows ([`crate::preview`]): the rounds' own code on the map in service.

use std::sync::Arc;

use cdnmap_mapper::ClusterState;
use cdnmap_store::edit::{Applied, Edit, EditError};

pub use crate::config::GuardConfig;
use crate::preview::{preview_edits, PreviewError, Previewed, Turn};
use crate::service::Shared;
use crate::topology::Outcome;
use crate::topology::{Actor, ChangeError};

/// Sets cluster `id`'s state as an operator asks (Admin `SetClusterState`, the dashboard, a
/// script): with a `[guard]`, previewed first and refused past a limit ([`ChangeError::Guard`],
/// logged as a failed action) unless `force`d, which needs a reason; the event of a forced
/// change says which limit it passed. `seen`: the preview of this change the caller just made
/// (a confirmation from the page), which the guard then takes instead of making its own. Then
/// [`Shared::set_cluster_state_predicted`], with what the preview said for the history.
pub async fn set_cluster_state(
    shared: &Arc<Shared>,
    id: &str,
    state: ClusterState,
    reason: &str,
    actor: Actor,
    force: bool,
    seen: Option<Previewed>,
) -> Result<Applied, ChangeError> {
    let mut reason = reason.to_string();
    let mut predicted = seen.as_ref().map(outcome_of);
    let edit = Edit::ClusterState {
        id: id.to_string(),
        state,
    };
    if let Some((preview, passed)) = checked(shared, id, vec![edit], seen, true).await? {
        predicted = Some(outcome_of(&preview));
        match past(passed, force, &reason) {
            Ok(r) => reason = r,
            Err(why) => {
                let outcome = Err(why.clone());
                let now = crate::clock::now_unix_ms();
                shared
                    .activity()
                    .log_action(&actor, id, state, &reason, outcome, predicted, now);
                return Err(ChangeError::Guard(why));
            }
        }
    }
    shared
        .set_cluster_state_predicted(id, state, &reason, actor, predicted)
        .await
}

/// Replaces the operator's policy (issue 46) as an operator asks (Admin `SetPolicy`, the
/// dashboard): validated against the clusters, then, with a `[guard]`, previewed and refused
/// past a limit (a policy change is made at once, so the per-round budget applies too) unless
/// `force`d with a reason; then through the topology writer.
pub async fn set_policy(
    shared: &Arc<Shared>,
    spec: cdnmap_mapper::model::PolicySpec,
    reason: &str,
    force: bool,
) -> Result<Applied, ChangeError> {
    if let Err(e) = shared.topology_now().instance.with_policy(&spec) {
        return Err(ChangeError::Edit(EditError::Refused(format!(
            "policy: {e}"
        ))));
    }
    let edit = Edit::Policy {
        policy: spec.clone(),
    };
    if let Some((_, passed)) = checked(shared, "policy", vec![edit], None, true).await? {
        let forced = passed.is_some();
        let reason = past(passed, force, reason).map_err(ChangeError::Guard)?;
        if forced {
            tracing::warn!(reason, "policy forced past the guard");
        }
    }
    shared.change(crate::topology::Change::Policy(spec)).await
}

/// What an operator's change may do past the limits `passed` (`None`: within them all): go
/// on with `reason` (said forced past the guard, when it was: that needs `force` and a
/// reason), or be refused, saying why.
pub fn past(passed: Option<String>, force: bool, reason: &str) -> Result<String, String> {
    let Some(passed) = passed else {
        return Ok(reason.to_string());
    };
    if !force {
        return Err(format!(
            "refused by the guard: {passed}; force it with a reason"
        ));
    }
    if reason.trim().is_empty() {
        return Err(format!("a forced change needs a reason: {passed}"));
    }
    Ok(format!("{reason} [forced past the guard: {passed}]"))
}

/// What a preview says a change would do, as the change history keeps it.
pub fn outcome_of(p: &Previewed) -> Outcome {
    Outcome {
        version: p.based_on,
        overflow_share: p.after.overflow_share,
        moved_share: p.diff.moved_share(),
    }
}

/// With a `[guard]`: the preview of `edits` (of cluster `id`) on the map in service (`seen`,
/// else made now, queued behind other previews) and the limits it passes (`None`: within
/// every one; `at_once`: see [`exceeded`]); `None` without a guard or without a map yet.
pub async fn checked(
    shared: &Arc<Shared>,
    id: &str,
    edits: Vec<Edit>,
    seen: Option<Previewed>,
    at_once: bool,
) -> Result<Option<(Previewed, Option<String>)>, ChangeError> {
    let guard = &shared.config().guard;
    if !guard.is_on() {
        return Ok(None);
    }
    let made = match seen {
        Some(p) => Ok(p),
        None => preview_edits(shared, edits, 0, Turn::Queue).await,
    };
    match made {
        Ok(p) => {
            let passed = exceeded(guard, &p, at_once);
            Ok(Some((p, passed)))
        }
        Err(PreviewError::NoMap) => Ok(None),
        Err(PreviewError::NoCluster(..)) => {
            Err(ChangeError::Edit(EditError::NoCluster(id.to_string())))
        }
        Err(e) => Err(ChangeError::Guard(format!(
            "the guard could not preview it: {e}"
        ))),
    }
}

/// The limits of `guard` that `p` exceeds, said with the figures; `None` when it keeps them
/// all (or none is set). `at_once`: the change is made in one round, so the per-round
/// movement budget applies to all it moves (a ramp's steps keep within it themselves).
pub fn exceeded(guard: &GuardConfig, p: &Previewed, at_once: bool) -> Option<String> {
    let mut out = Vec::new();
    if let Some(budget) = guard.max_moved_share_per_round.filter(|_| at_once) {
        let moved = p.diff.moved_share();
        if moved.is_nan() || moved > budget {
            out.push(format!(
                "it would move {:.2}% of the demand in one round, more than the budget \
                 (guard.max_moved_share_per_round = {budget}): ramp it over {} rounds or more",
                100.0 * moved,
                rounds_for(moved, budget)
            ));
        }
    }
    if let Some(most) = guard.max_overflow_points {
        let points = 100.0 * (p.after.overflow_share - p.before.overflow_share);
        if points.is_nan() || points > most {
            out.push(format!(
                "the overflow would rise {points:.2} points, from {:.2}% to {:.2}% \
                 (guard.max_overflow_points = {most})",
                100.0 * p.before.overflow_share,
                100.0 * p.after.overflow_share
            ));
        }
    }
    if let Some(most) = guard.max_moved_share {
        let moved = p.diff.moved_share();
        if moved.is_nan() || moved > most {
            out.push(format!(
                "it would move {:.2}% of the demand (guard.max_moved_share = {most})",
                100.0 * moved
            ));
        }
    }
    if let Some(most) = guard.max_nodes_full_added {
        let added = p.after.nodes_full.saturating_sub(p.before.nodes_full);
        if added > most {
            out.push(format!(
                "{added} more resource nodes would be full, {} in all \
                 (guard.max_nodes_full_added = {most})",
                p.after.nodes_full
            ));
        }
    }
    (!out.is_empty()).then(|| out.join("; "))
}

/// The rounds a ramp needs to move `moved` (a share of the demand) within `budget` a round.
pub fn rounds_for(moved: f64, budget: f64) -> u64 {
    if !(moved.is_finite() && budget > 0.0) {
        return 2;
    }
    ((moved / budget).ceil() as u64).max(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preview::Figures;
    use cdnmap_mapper::diff::MapDiff;

    fn previewed(before: f64, after: f64, moved: f64, full: (u64, u64)) -> Previewed {
        let f = |overflow_share, nodes_full| Figures {
            overflow: 0.0,
            overflow_share,
            nodes_full,
            mean_rtt_ms: 0.0,
            cost: None,
        };
        Previewed {
            based_on: 1,
            diff: MapDiff {
                demand: 100.0,
                moved,
                ..MapDiff::default()
            },
            before: f(before, full.0),
            after: f(after, full.1),
            regions: Vec::new(),
        }
    }

    /// Each limit refuses what exceeds it and names itself with the figures; an unset limit
    /// never refuses, and a preview within every limit passes.
    #[test]
    fn the_guard_names_each_limit_exceeded() {
        let off = GuardConfig::default();
        assert!(!off.is_on());
        assert_eq!(
            exceeded(&off, &previewed(0.0, 0.9, 100.0, (0, 50)), true),
            None
        );
        let on = GuardConfig {
            max_overflow_points: Some(2.0),
            max_moved_share: Some(0.1),
            max_nodes_full_added: Some(0),
            max_moved_share_per_round: None,
        };
        assert!(on.is_on());
        assert_eq!(
            exceeded(&on, &previewed(0.012, 0.030, 10.0, (4, 4)), true),
            None
        );
        let all = exceeded(&on, &previewed(0.012, 0.045, 12.0, (4, 6)), true).expect("exceeded");
        assert!(
            all.contains("rise 3.30 points, from 1.20% to 4.50% (guard.max_overflow_points = 2)"),
            "{all}"
        );
        assert!(
            all.contains("move 12.00% of the demand (guard.max_moved_share = 0.1)"),
            "{all}"
        );
        assert!(
            all.contains("2 more resource nodes would be full, 6 in all"),
            "{all}"
        );
        assert!(exceeded(&on, &previewed(f64::NAN, 0.0, 0.0, (0, 0)), true).is_some());
        let bad = GuardConfig {
            max_moved_share: Some(1.5),
            ..GuardConfig::default()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("guard.max_moved_share"));
    }

    /// The per-round budget refuses a change made at once that moves more than it, saying
    /// how many rounds a ramp needs; a ramp's final preview is not held to it.
    #[test]
    fn the_budget_refuses_at_once_and_names_the_ramp_it_needs() {
        let budget = GuardConfig {
            max_moved_share_per_round: Some(0.02),
            ..GuardConfig::default()
        };
        assert!(budget.is_on());
        let p = previewed(0.0, 0.0, 4.5, (0, 0));
        let why = exceeded(&budget, &p, true).expect("over the budget");
        assert!(
            why.contains("move 4.50% of the demand in one round"),
            "{why}"
        );
        assert!(why.contains("ramp it over 3 rounds or more"), "{why}");
        assert_eq!(exceeded(&budget, &p, false), None);
        assert_eq!(
            exceeded(&budget, &previewed(0.0, 0.0, 2.0, (0, 0)), true),
            None
        );
        assert_eq!(rounds_for(0.001, 0.02), 2);
        let zero = GuardConfig {
            max_moved_share_per_round: Some(0.0),
            ..GuardConfig::default()
        };
        assert_eq!(
            zero.problem().map(|p| p.0),
            Some("guard.max_moved_share_per_round")
        );
    }
}
