//! The guard (issue 45): an operator's change of cluster states whose preview exceeds the
//! configured limits (`[guard]`: the overflow rising by more than so many points, more than a
//! share of the demand moving, resource nodes newly full) is refused, unless the operator
//! forces it with a reason; the refusal and the forcing both name the limit, in the action's
//! event and in the answer. Off unless a limit is configured. The check is the preview the
//! dashboard shows ([`crate::preview`]): the rounds' own code on the map in service.

use serde::Deserialize;

use crate::preview::Previewed;

/// `[guard]`: each limit off when absent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// The most the overflow share may rise, in points of the demand (1.0: from 1.2% to 2.2%).
    pub max_overflow_points: Option<f64>,
    /// The largest share of the demand one change may move (0.1: a tenth).
    pub max_moved_share: Option<f64>,
    /// The most resource nodes a change may newly fill (to 99.9% of their capacity or more).
    pub max_nodes_full_added: Option<u64>,
}

impl GuardConfig {
    /// Whether any limit is set.
    pub fn is_on(&self) -> bool {
        self.max_overflow_points.is_some()
            || self.max_moved_share.is_some()
            || self.max_nodes_full_added.is_some()
    }

    /// A limit out of its range, named (`[guard]`'s keys); `None` when all are fine.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if let Some(p) = self.max_overflow_points {
            if !(p.is_finite() && (0.0..=100.0).contains(&p)) {
                return Some((
                    "guard.max_overflow_points",
                    format!("{p} is outside 0..=100"),
                ));
            }
        }
        if let Some(s) = self.max_moved_share {
            if !(s.is_finite() && (0.0..=1.0).contains(&s)) {
                return Some(("guard.max_moved_share", format!("{s} is outside 0..=1")));
            }
        }
        None
    }

    /// The limits `p` exceeds, said with the figures; `None` when it keeps them all.
    pub fn exceeded(&self, p: &Previewed) -> Option<String> {
        let mut out = Vec::new();
        if let Some(most) = self.max_overflow_points {
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
        if let Some(most) = self.max_moved_share {
            let moved = p.diff.moved_share();
            if moved.is_nan() || moved > most {
                out.push(format!(
                    "it would move {:.2}% of the demand (guard.max_moved_share = {most})",
                    100.0 * moved
                ));
            }
        }
        if let Some(most) = self.max_nodes_full_added {
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
        }
    }

    /// Each limit refuses what exceeds it and names itself with the figures; an unset limit
    /// never refuses, and a preview within every limit passes.
    #[test]
    fn the_guard_names_each_limit_exceeded() {
        let off = GuardConfig::default();
        assert!(!off.is_on());
        assert_eq!(off.exceeded(&previewed(0.0, 0.9, 100.0, (0, 50))), None);
        let on = GuardConfig {
            max_overflow_points: Some(2.0),
            max_moved_share: Some(0.1),
            max_nodes_full_added: Some(0),
        };
        assert!(on.is_on());
        assert_eq!(on.exceeded(&previewed(0.012, 0.030, 10.0, (4, 4))), None);
        let all = on
            .exceeded(&previewed(0.012, 0.045, 12.0, (4, 6)))
            .expect("exceeded");
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
        assert!(on
            .exceeded(&previewed(f64::NAN, 0.0, 0.0, (0, 0)))
            .is_some());
        let bad = GuardConfig {
            max_moved_share: Some(1.5),
            ..GuardConfig::default()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("guard.max_moved_share"));
    }
}
