//! The operator's policy on the dashboard (issue 46, `docs/policy.md`): `GET /api/policy`
//! (the policy in its file form, and what it does to the published map: its cost beside its
//! mean RTT) and `POST /api/policy` (the Admin token): `{"policy": {...}, "preview": true}`
//! previews replacing it (the rounds' own code, as any change), without `preview` replaces it
//! through the topology writer (journaled, shared with the replicas, the next round maps it),
//! held to the `[guard]` first like a change of cluster states (`force` with a `reason`).
//! A bad policy is a 400 naming the entry.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{Extensions, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cdnmap_mapper::model::PolicySpec;
use cdnmap_store::edit::Edit;
use serde::{Deserialize, Serialize};

use super::app::{ApiError, ApiResult, App};
use super::clusters::{actor_of, body_of, change_error};
use super::preview::{preview_error, PreviewAnswer};
use crate::preview::{preview_edits, Turn};

#[derive(Serialize)]
pub(super) struct PolicyBody {
    /// The policy of the topology the next round maps (`null`: none).
    policy: Option<PolicySpec>,
    /// The published map's version, cost under it and mean RTT.
    map_version: u64,
    cost: Option<f64>,
    mean_rtt_ms: Option<f64>,
}

/// `GET /api/policy`.
pub(super) async fn policy(State(app): State<App>) -> ApiResult<PolicyBody> {
    let topology = app.shared.topology_now();
    let spec = cdnmap_topology::format::policy_file(&topology);
    let point = app.shared.activity().history(1).pop();
    Ok(Json(PolicyBody {
        policy: spec,
        map_version: point.as_ref().map_or(0, |p| p.version),
        cost: point.as_ref().and_then(|p| p.cost),
        mean_rtt_ms: point.and_then(|p| p.mean_rtt_ms),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyAsk {
    policy: PolicySpec,
    #[serde(default)]
    preview: bool,
    /// Past the guard (`[guard]`), with a reason.
    #[serde(default)]
    force: bool,
    #[serde(default)]
    reason: String,
}

/// `POST /api/policy`: a preview (200 with the preview) or the change (200 with the policy now).
pub(super) async fn set_policy(
    State(app): State<App>,
    headers: HeaderMap,
    extensions: Extensions,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let actor = actor_of(&app, "policy", &headers, &extensions)?;
    let ask: PolicyAsk = body_of(
        body,
        r#"{"policy": {"cost": {"weight": 2, "guard_ms": 10, "prices": {"<cluster>": 1.5}}}, "preview": true}"#,
    )?;
    if ask.preview {
        // A bad policy does not apply: 400, naming the entry.
        let edits = vec![Edit::Policy { policy: ask.policy }];
        let p = preview_edits(&app.shared, edits, 10, Turn::Now)
            .await
            .map_err(preview_error)?;
        return Ok(Json(PreviewAnswer::of(p)).into_response());
    }
    crate::guard::set_policy(&app.shared, ask.policy, &ask.reason, ask.force)
        .await
        .map_err(change_error)?;
    tracing::warn!(who = %actor.who, via = actor.via, reason = %ask.reason, "policy replaced");
    Ok(policy(State(app)).await?.into_response())
}
