//! Previews before actions: `POST /api/preview` (what the next round would publish after a
//! change of cluster states, [`crate::preview`], the same as gRPC `Admin.Preview`), and the
//! check a confirmed action makes (`POST /api/clusters/{id}/state` with `expect`): the preview
//! is made again on the map in service then, and the change applies only if its effect is
//! still what the operator saw ([`Expect::differs`]), since the map moves every round.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, State};
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::Json;
use cdnmap_mapper::ClusterState;
use serde::{Deserialize, Serialize};

use super::app::authorize;
use super::app::{ApiError, ApiResult, App};
use super::diff::{rows_of, FlowRow, UnitRow};
use crate::preview::{preview_changes, Figures, PreviewError, Previewed, Turn};

/// The flows a preview lists unless asked for fewer.
const PREVIEW_FLOWS: usize = 20;
/// The changed map units a preview lists (those whose demand moves most).
const PREVIEW_UNITS: usize = 10;
/// A confirmed action applies if the overflow it would leave is within this many points (of
/// the demand) of what the operator saw...
pub const OVERFLOW_POINTS: f64 = 0.5;
/// ... and the demand it would move within this share of what they saw, or of the demand.
pub const MOVED_SHARE: f64 = 0.1;
pub const MOVED_OF_DEMAND: f64 = 0.002;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Change {
    cluster: String,
    state: ClusterState,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PreviewBody {
    changes: Vec<Change>,
}

#[derive(Serialize)]
pub(super) struct FiguresRow {
    overflow: f64,
    overflow_share: f64,
    nodes_full: u64,
    mean_rtt_ms: f64,
    /// Under the cost policy (`null`: none).
    cost: Option<f64>,
}

impl From<Figures> for FiguresRow {
    fn from(f: Figures) -> FiguresRow {
        FiguresRow {
            overflow: f.overflow,
            overflow_share: f.overflow_share,
            nodes_full: f.nodes_full,
            mean_rtt_ms: f.mean_rtt_ms,
            cost: f.cost,
        }
    }
}

/// A preview as the page shows it.
#[derive(Serialize)]
pub(crate) struct PreviewAnswer {
    /// The map version it was computed from.
    based_on: u64,
    before: FiguresRow,
    after: FiguresRow,
    demand: f64,
    moved: f64,
    moved_share: f64,
    units_changed: usize,
    flow_count: usize,
    /// The largest flows of moved demand, cluster to cluster ("overflow" for none).
    flows: Vec<FlowRow>,
    /// The moved demand by the region its units are in, the most first.
    regions: Vec<cdnmap_engine::figures::RegionMove>,
    /// The map units whose demand moves most, with how much (the page looks each up).
    changed_units: Vec<UnitRow>,
}

impl PreviewAnswer {
    pub(crate) fn of(p: Previewed) -> PreviewAnswer {
        let d = p.diff;
        let (demand, moved, moved_share) = (d.demand, d.moved, d.moved_share());
        let (units_changed, flow_count) = (d.units_changed, d.flows.len());
        let (flows, changed_units) = rows_of(d, PREVIEW_FLOWS);
        PreviewAnswer {
            based_on: p.based_on,
            before: p.before.into(),
            after: p.after.into(),
            demand,
            moved,
            moved_share,
            units_changed,
            flow_count,
            flows,
            regions: p.regions,
            changed_units,
        }
    }
}

/// What the operator saw in the preview they confirm.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Expect {
    /// The overflow share after the change.
    overflow_share: f64,
    /// The demand the change moves.
    moved: f64,
}

impl Expect {
    /// How `now` (the preview made again) differs from what was seen, beyond the bounds
    /// ([`OVERFLOW_POINTS`], [`MOVED_SHARE`], [`MOVED_OF_DEMAND`]); `None` when it does not.
    fn differs(&self, now: &Previewed) -> Option<String> {
        let mut out = Vec::new();
        let points = 100.0 * (now.after.overflow_share - self.overflow_share);
        if points.is_nan() || points.abs() > OVERFLOW_POINTS {
            out.push(format!(
                "the overflow after it is now {:.2}% (you saw {:.2}%)",
                100.0 * now.after.overflow_share,
                100.0 * self.overflow_share
            ));
        }
        let slack = (MOVED_SHARE * self.moved).max(MOVED_OF_DEMAND * now.diff.demand);
        let off = (now.diff.moved - self.moved).abs();
        if off.is_nan() || off > slack {
            out.push(format!(
                "it now moves {:.1} demand units (you saw {:.1})",
                now.diff.moved, self.moved
            ));
        }
        (!out.is_empty()).then(|| out.join("; "))
    }
}

/// The preview of `changes` on the map in service (an operator's: waits its turn briefly).
async fn previewed(app: &App, changes: Vec<(String, ClusterState)>) -> Result<Previewed, ApiError> {
    preview_changes(&app.shared, changes, PREVIEW_UNITS, Turn::Now)
        .await
        .map_err(preview_error)
}

/// A preview not made, as the page gets it: 429 busy, 503 no map yet, 400 a change that does
/// not apply, 404 an unknown cluster, 500 a failure.
pub(crate) fn preview_error(e: PreviewError) -> ApiError {
    match e {
        PreviewError::Busy => ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
        PreviewError::NoMap => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        PreviewError::Invalid(_) => ApiError::bad(e.to_string()),
        PreviewError::NoCluster(..) => ApiError::not_found(e.to_string()),
        PreviewError::Failed(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `POST /api/preview`, `{"changes": [{"cluster": "fra-1", "state": "drained"}]}`: needs the
/// Admin token (each preview is a solve).
pub(super) async fn preview(
    State(app): State<App>,
    headers: HeaderMap,
    extensions: Extensions,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<PreviewAnswer> {
    let remote = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip());
    authorize(&app.gate, &headers, remote, "previews")?;
    let body = body.map_err(|e| ApiError::new(e.status(), format!("body: {}", e.body_text())))?;
    let body: PreviewBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad(format!(
            "body: {e} (expected {{\"changes\": [{{\"cluster\": \"...\", \"state\": \"up\" | \
             \"drained\" | \"down\"}}]}})"
        ))
    })?;
    let changes = body
        .changes
        .into_iter()
        .map(|c| (c.cluster, c.state))
        .collect();
    Ok(Json(PreviewAnswer::of(previewed(&app, changes).await?)))
}

/// The check of a confirmed action: the preview of setting `cluster` to `state` made again on
/// the map in service (which the guard and the change history then take); a 409 saying what
/// changed when it is no longer what was seen.
pub(crate) async fn still_as_seen(
    app: &App,
    cluster: &str,
    state: ClusterState,
    seen: &Expect,
) -> Result<Previewed, ApiError> {
    let now = previewed(app, vec![(cluster.to_string(), state)]).await?;
    match seen.differs(&now) {
        None => Ok(now),
        Some(what) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "not applied: the map moved since the preview (now map v{}): {what}; \
                 preview it again",
                now.based_on
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(overflow_share: f64, moved: f64) -> Previewed {
        let f = |overflow_share| Figures {
            overflow: 0.0,
            overflow_share,
            nodes_full: 0,
            mean_rtt_ms: 0.0,
            cost: None,
        };
        Previewed {
            based_on: 7,
            diff: cdnmap_mapper::diff::MapDiff {
                demand: 10_000.0,
                moved,
                ..Default::default()
            },
            before: f(0.0),
            after: f(overflow_share),
            regions: Vec::new(),
        }
    }

    /// A confirmed action goes ahead within half a point of overflow and a tenth of the moved
    /// demand (or 0.2% of all of it), and says what changed beyond them.
    #[test]
    fn an_effect_beyond_the_bounds_is_named() {
        let seen = Expect {
            overflow_share: 0.045,
            moved: 1_000.0,
        };
        assert_eq!(seen.differs(&answer(0.049, 1_090.0)), None);
        let over = seen.differs(&answer(0.051, 1_000.0)).expect("differs");
        assert!(
            over.contains("overflow after it is now 5.10% (you saw 4.50%)"),
            "{over}"
        );
        let moved = seen.differs(&answer(0.045, 1_200.0)).expect("differs");
        assert!(
            moved.contains("moves 1200.0 demand units (you saw 1000.0)"),
            "{moved}"
        );
        let small = Expect {
            overflow_share: 0.0,
            moved: 1.0,
        };
        assert_eq!(
            small.differs(&answer(0.0, 15.0)),
            None,
            "0.2% of the demand"
        );
        assert!(small.differs(&answer(0.0, f64::NAN)).is_some());
    }
}
