//! The dashboard API's state and errors, shared by its handlers (`http.rs`, `clusters.rs`):
//! the app state, the JSON error answer, and the extractors every handler uses.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cdnmap_topology::Topology;
use serde_json::json;

use crate::service::Shared;
use cdnmap_engine::figures::View;
use cdnmap_engine::round::Snapshot;

/// The largest action body accepted, bytes.
pub(super) const MAX_ACTION_BODY_BYTES: usize = 4096;

#[derive(Clone)]
pub(super) struct App {
    pub(super) shared: Arc<Shared>,
    /// The Admin token's check (actions).
    pub(super) gate: Arc<crate::auth::AdminGate>,
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
    let (shared, s2) = (Arc::clone(&app.shared), Arc::clone(&s));
    let v = tokio::task::spawn_blocking(move || shared.dash().view(&s2))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((s, v))
}

pub(super) fn topology(app: &App) -> Result<Arc<Topology>, ApiError> {
    Ok(app.shared.topology_now())
}
