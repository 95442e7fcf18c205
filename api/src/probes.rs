//! `/healthz` and `/readyz` on the HTTP listener, for orchestrators (Kubernetes' probes,
//! systemd watchers, load balancers' health checks). Neither needs a token, and neither is
//! behind the dashboard's routes: each answers JSON.
//!
//! - `/healthz`, alive: 200 while the process answers HTTP and has not been asked to stop (then
//!   503 "stopping": it finishes its round and exits). A round that runs long does not make it
//!   fail: a restart would not make that round shorter.
//! - `/readyz`, ready: 200 while a map is served (Resolve and WatchMap answer from it), with its
//!   identity and age, this replica's role and whether the last round failed; 503 otherwise,
//!   the body saying why (no map yet and the first round still running, no map and the last
//!   round failed with its error, a standby with no map, stopping).
//!
//! A standby replica answers Resolve and WatchMap from the map it holds (the stored one it
//! started with, or the last it published while it led; it publishes none of its own rounds),
//! so it is ready while it holds one, and its body says `"role": "standby"` and the map's age:
//! front ends follow the highest map identity, which is the leader's. A standby that never held
//! a map is not ready.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::service::Shared;

/// The two routes, over `shared`.
pub(crate) fn routes(shared: &Arc<Shared>) -> axum::Router {
    let (alive, ready) = (Arc::clone(shared), Arc::clone(shared));
    axum::Router::new()
        .route(
            "/healthz",
            axum::routing::get(move || {
                let shared = Arc::clone(&alive);
                async move { healthz(&shared) }
            }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let shared = Arc::clone(&ready);
                async move { readyz(&shared, crate::clock::now_unix_ms()) }
            }),
        )
}

fn healthz(shared: &Shared) -> Response {
    if *shared.stopping.borrow() {
        let body = json!({ "alive": false, "reason": "stopping" });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    (StatusCode::OK, Json(json!({ "alive": true }))).into_response()
}

/// This replica's role: `alone` (not replicated), `leader` or `standby`.
fn role(shared: &Shared) -> &'static str {
    match shared.lead.get() {
        None => "alone",
        Some(lead) => match lead.status().borrow().role {
            Some(cdnmap_lead::Role::Leader { .. }) => "leader",
            _ => "standby",
        },
    }
}

fn readyz(shared: &Shared, now_unix_ms: i64) -> Response {
    let role = role(shared);
    let last = shared.round_status();
    let last_round = (last.last_round_at_unix_ms > 0).then(|| {
        json!({
            "at_unix_ms": last.last_round_at_unix_ms,
            "failed": last.failed,
            "error": last.error,
        })
    });
    let stopping = *shared.stopping.borrow();
    let Some(map) = shared.current().filter(|_| !stopping) else {
        let reason = if stopping {
            "stopping".to_string()
        } else if last.failed {
            format!("no map: the last round failed: {}", last.error)
        } else if role == "standby" {
            "no map: a standby serves only a map it stored or published while it led, and holds none"
                .to_string()
        } else {
            "no map yet: the first round has not finished".to_string()
        };
        let body = json!({
            "ready": false,
            "reason": reason,
            "role": role,
            "last_round": last_round,
        });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    };
    let age_secs = (now_unix_ms - map.solved_at_unix_ms).max(0) as f64 / 1e3;
    let body = json!({
        "ready": true,
        "role": role,
        "map": {
            "epoch": map.epoch,
            "version": map.version,
            "solved_at_unix_ms": map.solved_at_unix_ms,
            "age_secs": age_secs,
        },
        "last_round": last_round,
    });
    (StatusCode::OK, Json(body)).into_response()
}
