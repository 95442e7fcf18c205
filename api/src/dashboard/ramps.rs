//! The dashboard's ramp endpoints ([`crate::ramp`], carried out by [`crate::ramping`]):
//! `GET /api/ramps` (the ramps, running and ended, newest first, with the movement budget),
//! `POST /api/clusters/{id}/ramp` (start one: a drain or a capacity cut over rounds) and
//! `POST /api/clusters/{id}/ramp/cancel`. The two actions need the Admin token, like every
//! action.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{Extensions, HeaderMap};
use axum::Json;
use cdnmap_mapper::ClusterState;
use serde::{Deserialize, Serialize};

use super::app::{ApiError, ApiResult, App};
use super::clusters::{actor_of, body_of, change_error};
use crate::ramp::{Goal, Ramp};

#[derive(Serialize)]
pub(super) struct RampsBody {
    /// `guard.max_moved_share_per_round` (`null`: no budget).
    budget: Option<f64>,
    ramps: Vec<Ramp>,
}

/// `GET /api/ramps`.
pub(super) async fn ramps(State(app): State<App>) -> ApiResult<RampsBody> {
    let mut ramps = app.shared.activity().ramps();
    ramps.reverse();
    Ok(Json(RampsBody {
        budget: app.shared.config().guard.max_moved_share_per_round,
        ramps,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RampAsk {
    /// `"drained"` or `"capacity"` (then `scale`).
    to: String,
    #[serde(default)]
    scale: Option<f64>,
    rounds: u32,
    #[serde(default)]
    reason: String,
    /// A drain's preview as the operator saw it (as for `POST /api/clusters/{id}/state`).
    #[serde(default)]
    expect: Option<super::preview::Expect>,
    #[serde(default)]
    force: bool,
}

const RAMP_BODY: &str = r#"{"to": "drained" | "capacity", "scale": 0.5 (with "capacity"), "rounds": 2.., "reason": "..."}"#;

/// `POST /api/clusters/{id}/ramp`.
pub(super) async fn start(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    extensions: Extensions,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Ramp> {
    let actor = actor_of(&app, &id, &headers, &extensions)?;
    let ask: RampAsk = body_of(body, RAMP_BODY)?;
    let goal = match (ask.to.as_str(), ask.scale) {
        ("drained", None) => Goal::Drained,
        ("capacity", Some(scale)) => Goal::Capacity { scale },
        _ => {
            return Err(ApiError::bad(format!(
                "body: to {:?} with scale {:?} (expected {RAMP_BODY})",
                ask.to, ask.scale
            )))
        }
    };
    let seen = match (&ask.expect, goal) {
        (Some(seen), Goal::Drained) => {
            Some(super::preview::still_as_seen(&app, &id, ClusterState::Drained, seen).await?)
        }
        (Some(_), Goal::Capacity { .. }) => {
            return Err(ApiError::bad(
                "body: expect: the page previews drains only; leave it out for a capacity cut",
            ))
        }
        (None, _) => None,
    };
    let ramp = crate::ramping::start(
        &app.shared,
        &id,
        goal,
        ask.rounds,
        &ask.reason,
        actor,
        ask.force,
        seen,
    )
    .await
    .map_err(change_error)?;
    Ok(Json(ramp))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelAsk {
    #[serde(default)]
    reason: String,
}

/// `POST /api/clusters/{id}/ramp/cancel`.
pub(super) async fn cancel(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    extensions: Extensions,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Ramp> {
    let actor = actor_of(&app, &id, &headers, &extensions)?;
    let ask: CancelAsk = body_of(body, r#"{"reason": "..."}"#)?;
    let ramp = crate::ramping::cancel(&app.shared, &id, &ask.reason, &actor)
        .await
        .map_err(change_error)?;
    Ok(Json(ramp))
}
