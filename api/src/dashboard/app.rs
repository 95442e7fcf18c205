//! The dashboard API's state and errors, shared by its handlers (`http.rs`, `clusters.rs`):
//! the app state, the JSON error answer, and the extractors every handler uses.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cdnmap_engine::figures::View;
use cdnmap_engine::round::Snapshot;
use cdnmap_topology::Topology;
use serde::Deserialize;
use serde_json::json;

use crate::auth::{AdminGate, Denied};

use crate::service::Shared;

/// The largest action body accepted, bytes.
pub(super) const MAX_ACTION_BODY_BYTES: usize = 4096;

#[derive(Clone)]
pub(super) struct App {
    pub(super) shared: Arc<Shared>,
    /// The Admin token's check (actions).
    pub(super) gate: Arc<crate::auth::AdminGate>,
    /// The figures of the newest map version asked for.
    pub(super) views: Arc<Views>,
}

/// The figures of the newest map version asked for, computed once per version on first
/// request.
#[derive(Default)]
pub(super) struct Views(Mutex<Option<Arc<View>>>);

impl Views {
    /// The figures of `snapshot`, computed once per version.
    fn of(&self, snapshot: &Snapshot) -> Arc<View> {
        if let Ok(v) = self.0.lock() {
            if let Some(v) = v.as_ref().filter(|v| v.version == snapshot.version) {
                return Arc::clone(v);
            }
        }
        let view = Arc::new(View::new(snapshot));
        if let Ok(mut v) = self.0.lock() {
            // Keep the newest version (two requests may compute concurrently).
            if v.as_ref().is_none_or(|old| old.version <= view.version) {
                *v = Some(Arc::clone(&view));
            }
        }
        view
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

/// An error answer: `{"error": message}` with its status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    pub(super) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
    pub(super) fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
    pub(super) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

pub(super) type ApiResult<T> = Result<Json<T>, ApiError>;

pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad(format!("query string: {}", e.body_text())))
}

pub(super) fn snapshot(app: &App) -> Result<Arc<Snapshot>, ApiError> {
    app.shared.current().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no map yet: the first round has not finished",
        )
    })
}

/// The current snapshot and its figures (computed off the async threads once per version).
pub(super) async fn view(app: &App) -> Result<(Arc<Snapshot>, Arc<View>), ApiError> {
    let s = snapshot(app)?;
    let (views, s2) = (Arc::clone(&app.views), Arc::clone(&s));
    let v = tokio::task::spawn_blocking(move || views.of(&s2))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((s, v))
}

pub(super) fn topology(app: &App) -> Result<Arc<Topology>, ApiError> {
    Ok(app.shared.topology_now())
}

/// Checks `Authorization: Bearer <token>` like the gRPC Admin interceptor, through the same
/// gate (the dashboard's actions and `/record`; `remote`: who asks): a source that failed too
/// often is refused with 429.
///
/// `what` names what was asked for in the refusal ("actions", "/record").
pub(crate) fn authorize(
    gate: &AdminGate,
    headers: &HeaderMap,
    remote: Option<IpAddr>,
    what: &str,
) -> Result<(), ApiError> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match gate.check(given, remote, "http", what) {
        Ok(()) => Ok(()),
        Err(Denied::Disabled) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("{what} are disabled: the server has no admin_token configured"),
        )),
        Err(Denied::Wrong) => Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong admin token")),
        Err(Denied::Missing) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("{what} need \"Authorization: Bearer <admin token>\""),
        )),
        Err(Denied::TooMany { retry_after }) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many failed Admin authentications from this address: retry in {} s",
                retry_after.as_secs().max(1)
            ),
        )),
    }
}

/// `?limit=` of a list endpoint.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitQuery {
    pub(super) limit: Option<usize>,
}

pub(super) fn limit_of(
    limit: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default),
        Some(0) => Err(ApiError::bad("limit: must be at least 1")),
        Some(l) if l <= max => Ok(l),
        Some(l) => Err(ApiError::bad(format!("limit: {l} is more than {max}"))),
    }
}
