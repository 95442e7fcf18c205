//! `GET /api/diff?from=A&to=B&flows=N&units=N`: two stored map versions compared
//! ([`crate::diffs`], the same as gRPC `Admin.DiffMaps`). It needs the Admin token, as the
//! actions do: each diff reads two whole versions back from the store.

use std::net::SocketAddr;

use axum::extract::connect_info::ConnectInfo;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::app::authorize;
use super::app::{query, ApiError, ApiResult, App};
use crate::diffs::{diff_stored, rows, DiffError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DiffQuery {
    /// The older version.
    from: Option<u64>,
    /// The newer version (absent or 0: the newest stored).
    #[serde(default)]
    to: u64,
    /// The most flows and changed units listed (0: 100).
    #[serde(default)]
    flows: u32,
    #[serde(default)]
    units: u32,
}

#[derive(Serialize)]
pub(super) struct FlowRow {
    from: String,
    to: String,
    demand: f64,
}

#[derive(Serialize)]
pub(super) struct UnitRow {
    map_unit: String,
    moved: f64,
}

/// A diff's largest `flows` flows and its changed units as the page shows them (also a
/// preview's).
pub(super) fn rows_of(
    d: cdnmap_mapper::diff::MapDiff,
    flows: usize,
) -> (Vec<FlowRow>, Vec<UnitRow>) {
    let flows = d
        .flows
        .into_iter()
        .take(flows)
        .map(|f| FlowRow {
            from: f.from,
            to: f.to,
            demand: f.demand,
        })
        .collect();
    let units = d
        .changed
        .into_iter()
        .map(|(map_unit, moved)| UnitRow { map_unit, moved })
        .collect();
    (flows, units)
}

#[derive(Serialize)]
pub(super) struct DiffAnswer {
    from: u64,
    to: u64,
    units_compared: usize,
    units_changed: usize,
    units_added: usize,
    units_removed: usize,
    demand: f64,
    moved: f64,
    moved_share: f64,
    /// How many flows there are in all (`flows` lists the largest).
    flow_count: usize,
    flows: Vec<FlowRow>,
    changed_units: Vec<UnitRow>,
}

pub(super) async fn diff(
    State(app): State<App>,
    headers: HeaderMap,
    extensions: Extensions,
    q: Result<Query<DiffQuery>, QueryRejection>,
) -> ApiResult<DiffAnswer> {
    let remote = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip());
    authorize(&app.gate, &headers, remote, "map diffs")?;
    let q = query(q)?;
    let from = q
        .from
        .ok_or_else(|| ApiError::bad("from: missing: the older map version"))?;
    let flows = rows(q.flows).map_err(|e| ApiError::bad(format!("flows: {e}")))?;
    let units = rows(q.units).map_err(|e| ApiError::bad(format!("units: {e}")))?;
    let d = diff_stored(&app.shared, from, q.to, units)
        .await
        .map_err(|e| match e {
            DiffError::Busy => ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
            DiffError::NotStored(_) => ApiError::not_found(e.to_string()),
            DiffError::Failed(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        })?;
    let (from, to, d) = (d.from, d.to, d.diff);
    let (units_compared, units_changed, units_added, units_removed) = (
        d.units_compared,
        d.units_changed,
        d.units_added,
        d.units_removed,
    );
    let (demand, moved, moved_share, flow_count) =
        (d.demand, d.moved, d.moved_share(), d.flows.len());
    let (flows, changed_units) = rows_of(d, flows);
    Ok(Json(DiffAnswer {
        from,
        to,
        units_compared,
        units_changed,
        units_added,
        units_removed,
        demand,
        moved,
        moved_share,
        flow_count,
        flows,
        changed_units,
    }))
}
