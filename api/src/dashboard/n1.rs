//! `GET /api/n1?limit=`: the N-1 view ([`crate::n1`]): the worst single losses of a cluster and
//! of a site the last sweep found, worst first.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use cdnmap_engine::n1::Loss;
use serde::Serialize;

use super::app::{limit_of, query, ApiResult, App, LimitQuery};

/// Rows listed of each kind unless `limit` says otherwise, and the most.
const DEFAULT_ROWS: usize = 20;
const MAX_ROWS: usize = 1_000;

#[derive(Serialize)]
pub(super) struct LossRow {
    name: String,
    /// The demand there now.
    demand: f64,
    overflow: f64,
    overflow_share: f64,
    nodes_full_added: u64,
    rtt_shift_ms: f64,
    /// Previewed with the rounds' own code, not estimated.
    exact: bool,
}

impl LossRow {
    fn of(l: &Loss) -> LossRow {
        LossRow {
            name: l.name.clone(),
            demand: l.demand,
            overflow: l.overflow,
            overflow_share: l.overflow_share,
            nodes_full_added: l.nodes_full_added,
            rtt_shift_ms: l.rtt_shift_ms,
            exact: l.exact,
        }
    }
}

#[derive(Serialize)]
pub(super) struct N1Body {
    /// Whether a sweep has finished yet (the first comes `n1.every_secs` after the start).
    ready: bool,
    /// The map version swept, and when.
    version: u64,
    at_unix_ms: i64,
    sweep_ms: f64,
    exact_ms: f64,
    /// Whether every cluster and site was tried within the budget.
    complete: bool,
    /// The map's overflow share as it is.
    overflow_share: f64,
    cluster_count: usize,
    site_count: usize,
    clusters: Vec<LossRow>,
    sites: Vec<LossRow>,
}

pub(super) async fn n1(
    State(app): State<App>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> ApiResult<N1Body> {
    let limit = limit_of(query(q)?.limit, DEFAULT_ROWS, MAX_ROWS)?;
    let Some(v) = app.shared.n1.load_full() else {
        return Ok(Json(N1Body {
            ready: false,
            version: 0,
            at_unix_ms: 0,
            sweep_ms: 0.0,
            exact_ms: 0.0,
            complete: false,
            overflow_share: 0.0,
            cluster_count: 0,
            site_count: 0,
            clusters: Vec::new(),
            sites: Vec::new(),
        }));
    };
    let s = &v.sweep;
    let rows = |l: &[Loss]| l.iter().take(limit).map(LossRow::of).collect();
    Ok(Json(N1Body {
        ready: true,
        version: v.version,
        at_unix_ms: v.at_unix_ms,
        sweep_ms: v.sweep_ms,
        exact_ms: v.exact_ms,
        complete: s.complete,
        overflow_share: s.overflow_share,
        cluster_count: s.clusters.len(),
        site_count: s.sites.len(),
        clusters: rows(&s.clusters),
        sites: rows(&s.sites),
    }))
}
