//! The dashboard's HTTP side: the embedded page and the JSON API (`docs/dashboard.md`).
//!
//! Reads need no token. Actions (`POST /api/clusters/{id}/state`) need the Admin token as
//! `Authorization: Bearer <token>`, exactly like the gRPC Admin service, and go through the
//! same function as Admin `SetClusterState` ([`Shared::set_cluster_state`]). Every error is a
//! JSON body `{"error": "..."}` naming the input, with 400, 401, 404 or 503.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, Extensions, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cdnmap_mapper::{ClusterState, Instance, UnitIdx};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::figures::{self, CandidateView, View};
use super::{clean, Actor, MAX_EVENTS, MAX_HISTORY_ROUNDS, MAX_REASON_LEN};
use crate::round::Snapshot;
use crate::service::{constant_time_eq, now_unix_ms, ActionError, Shared};

/// A map older than this many cycles is reported stale.
pub const STALE_AFTER_CYCLES: u64 = 3;
/// Map units listed per cluster in `/api/clusters` unless `top` says otherwise.
pub const DEFAULT_TOP_UNITS: usize = 5;
/// The most map units listed per cluster (`top`).
pub const MAX_TOP_UNITS: usize = 100;
/// The longest lookup query accepted.
pub const MAX_LOOKUP_LEN: usize = 128;
/// Prefixes listed per map unit in a lookup (the count is always given).
pub const MAX_LOOKUP_PREFIXES: usize = 16;
/// The largest action body accepted, bytes.
pub const MAX_ACTION_BODY_BYTES: usize = 4096;
/// Events returned by `/api/events` unless `limit` says otherwise.
pub const DEFAULT_EVENTS: usize = 100;

const INDEX_HTML: &str = include_str!("../../assets/index.html");
const APP_JS: &str = include_str!("../../assets/app.js");
const APP_CSS: &str = include_str!("../../assets/app.css");

#[derive(Clone)]
struct App {
    shared: Arc<Shared>,
    token: Option<Arc<str>>,
}

/// The dashboard's routes: `/`, `/assets/*` and `/api/*`.
pub fn router(shared: Arc<Shared>, token: Option<Arc<str>>) -> Router {
    let api = Router::new()
        .route("/status", get(status))
        .route("/clusters", get(clusters))
        .route("/clusters/{id}", get(cluster))
        .route("/clusters/{id}/state", post(set_state))
        .route("/map", get(world_map))
        .route("/history", get(history))
        .route("/lookup", get(lookup))
        .route("/events", get(events))
        .fallback(|| async { ApiError::not_found("no such API endpoint (see docs/dashboard.md)") })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_ACTION_BODY_BYTES));
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/assets/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .nest("/api", api)
        .with_state(App { shared, token })
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------------
// Errors

/// An error answer: `{"error": message}` with its status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
    fn not_found(message: impl Into<String>) -> ApiError {
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

type ApiResult<T> = Result<Json<T>, ApiError>;

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad(format!("query string: {}", e.body_text())))
}

fn snapshot(app: &App) -> Result<Arc<Snapshot>, ApiError> {
    app.shared.current().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no map yet: the first round has not finished",
        )
    })
}

/// The current snapshot and its figures (computed off the async threads once per version).
async fn view(app: &App) -> Result<(Arc<Snapshot>, Arc<View>), ApiError> {
    let s = snapshot(app)?;
    let (shared, s2) = (Arc::clone(&app.shared), Arc::clone(&s));
    let v = tokio::task::spawn_blocking(move || shared.dash().view(&s2))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((s, v))
}

fn topology(app: &App) -> Result<Instance, ApiError> {
    app.shared
        .topology_now()
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "topology lock poisoned"))
}

// ---------------------------------------------------------------------------------------------
// GET /api/status

#[derive(Serialize)]
struct LastRound {
    at_unix_ms: i64,
    failed: bool,
    error: String,
    solve_ms: f64,
}

#[derive(Serialize, Default)]
struct StateCounts {
    total: usize,
    up: usize,
    drained: usize,
    down: usize,
}

#[derive(Serialize)]
struct StatusBody {
    now_unix_ms: i64,
    map_version: u64,
    map_solved_at_unix_ms: i64,
    map_age_ms: i64,
    cycle_secs: u64,
    stale: bool,
    last_round: LastRound,
    /// What the page shows in its banner, when something is wrong.
    banner: Option<String>,
    clusters: StateCounts,
    map_units: usize,
    demand: f64,
    overflow: f64,
    overflow_share: f64,
    churn: Option<f64>,
    mean_rtt_ms: Option<f64>,
    actions_enabled: bool,
}

async fn status(State(app): State<App>) -> ApiResult<StatusBody> {
    let now = now_unix_ms();
    let cycle_secs = app.shared.config().cycle_secs;
    let round = app.shared.round_status();
    let topo = topology(&app)?;
    let mut counts = StateCounts {
        total: topo.clusters().len(),
        ..StateCounts::default()
    };
    for c in topo.clusters() {
        match c.state {
            ClusterState::Up => counts.up += 1,
            ClusterState::Drained => counts.drained += 1,
            ClusterState::Down => counts.down += 1,
        }
    }
    let s = app.shared.current();
    let last = app.shared.dash().history(1).pop();
    let (version, solved_at) = s
        .as_ref()
        .map_or((0, 0), |s| (s.version, s.solved_at_unix_ms));
    let age = if s.is_some() { now - solved_at } else { 0 };
    let stale = s.is_none() || age > (STALE_AFTER_CYCLES * cycle_secs * 1000) as i64;
    let banner = if s.is_none() {
        Some("no map yet: the first round has not finished".to_string())
    } else if round.failed {
        Some(format!(
            "the last round failed: {}; serving map version {version}",
            round.error
        ))
    } else if stale {
        Some(format!(
            "the map is stale: version {version} is {:.0} s old (the cycle is {cycle_secs} s)",
            age as f64 / 1e3
        ))
    } else if !round.error.is_empty() {
        Some(round.error.clone())
    } else {
        None
    };
    let (demand, overflow) = s.as_ref().map_or((0.0, 0.0), |s| {
        (s.instance.total_demand(), s.map.total_overflow())
    });
    Ok(Json(StatusBody {
        now_unix_ms: now,
        map_version: version,
        map_solved_at_unix_ms: solved_at,
        map_age_ms: age,
        cycle_secs,
        stale,
        last_round: LastRound {
            at_unix_ms: round.last_round_at_unix_ms,
            failed: round.failed,
            error: round.error,
            solve_ms: round.solve_ms,
        },
        banner,
        clusters: counts,
        map_units: topo.unit_count(),
        demand,
        overflow,
        overflow_share: if demand > 0.0 { overflow / demand } else { 0.0 },
        churn: s.as_ref().and_then(|s| s.churn),
        mean_rtt_ms: last
            .filter(|p| Some(p.version) == s.as_ref().map(|s| s.version))
            .and_then(|p| p.mean_rtt_ms),
        actions_enabled: app.token.is_some(),
    }))
}

// ---------------------------------------------------------------------------------------------
// GET /api/clusters, /api/clusters/{id}

#[derive(Serialize)]
struct NodeRow {
    name: String,
    kind: cdnmap_mapper::ResourceKind,
    parent: Option<String>,
    classes: Vec<String>,
    load: f64,
    capacity: f64,
    utilization: f64,
}

#[derive(Serialize)]
struct UnitShare {
    id: String,
    class: String,
    amount: f64,
}

#[derive(Serialize)]
struct ClusterRow {
    id: String,
    lat: f64,
    lon: f64,
    /// The state set now (what the next round maps with).
    state: ClusterState,
    /// The state in the round that made the published map (`null`: not in that map yet).
    map_state: Option<ClusterState>,
    demand: f64,
    utilization: f64,
    /// Map units holding demand here.
    units: usize,
    nodes: Vec<NodeRow>,
    top_units: Vec<UnitShare>,
}

fn cluster_row(topo: &Instance, c: usize, s: &Snapshot, v: &View, top: usize) -> ClusterRow {
    let cl = &topo.clusters()[c];
    let in_map = s.instance.cluster_index(&cl.id);
    let class_name = |k: cdnmap_mapper::ClassIdx| {
        topo.classes()
            .get(usize::from(k))
            .map_or_else(String::new, |c| c.name.clone())
    };
    let nodes = cl
        .nodes
        .iter()
        .map(|node| {
            // The published map's load of the node of the same name (the topology may have
            // changed since).
            let load = in_map
                .and_then(|m| {
                    let mc = &s.instance.clusters()[m as usize];
                    let mn = mc.nodes.iter().position(|x| x.name == node.name)?;
                    Some(v.usage[s.instance.global_node(m, mn as u32)])
                })
                .unwrap_or(0.0);
            NodeRow {
                name: node.name.clone(),
                kind: node.kind,
                parent: node
                    .parent
                    .and_then(|p| cl.nodes.get(p as usize))
                    .map(|p| p.name.clone()),
                classes: node.classes.iter().map(|&k| class_name(k)).collect(),
                load,
                capacity: node.capacity,
                utilization: if node.capacity > 0.0 {
                    load / node.capacity
                } else if load > 0.0 {
                    1.0
                } else {
                    0.0
                },
            }
        })
        .collect();
    let (demand, utilization, units, top_units) = match in_map {
        Some(m) => {
            let m = m as usize;
            let holders = &v.holders[m];
            let top_units = holders
                .iter()
                .take(top)
                .map(|&(u, amount)| UnitShare {
                    id: s.instance.unit_id(u).to_string(),
                    class: s
                        .instance
                        .classes()
                        .get(usize::from(s.instance.unit_class(u)))
                        .map_or_else(String::new, |c| c.name.clone()),
                    amount,
                })
                .collect();
            (v.demand[m], v.utilization[m], holders.len(), top_units)
        }
        None => (0.0, 0.0, 0, Vec::new()),
    };
    ClusterRow {
        id: cl.id.clone(),
        lat: cl.lat,
        lon: cl.lon,
        state: cl.state,
        map_state: in_map.map(|m| s.instance.clusters()[m as usize].state),
        demand,
        utilization,
        units,
        nodes,
        top_units,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClustersQuery {
    sort: Option<String>,
    order: Option<String>,
    limit: Option<usize>,
    top: Option<usize>,
}

#[derive(Serialize)]
struct ClustersBody {
    map_version: u64,
    clusters: Vec<ClusterRow>,
}

fn top_of(top: Option<usize>) -> Result<usize, ApiError> {
    match top {
        None => Ok(DEFAULT_TOP_UNITS),
        Some(t) if t <= MAX_TOP_UNITS => Ok(t),
        Some(t) => Err(ApiError::bad(format!(
            "top: {t} is more than {MAX_TOP_UNITS}"
        ))),
    }
}

async fn clusters(
    State(app): State<App>,
    q: Result<Query<ClustersQuery>, QueryRejection>,
) -> ApiResult<ClustersBody> {
    let q = query(q)?;
    let top = top_of(q.top)?;
    let desc = match q.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(o) => {
            return Err(ApiError::bad(format!(
                "order: {o:?} is not \"asc\" or \"desc\""
            )))
        }
    };
    let (s, v) = view(&app).await?;
    let topo = topology(&app)?;
    let mut rows: Vec<ClusterRow> = (0..topo.clusters().len())
        .map(|c| cluster_row(&topo, c, &s, &v, top))
        .collect();
    let sort = q.sort.as_deref().unwrap_or("id");
    match sort {
        "id" => {} // the topology's order
        "demand" => rows.sort_by(|a, b| a.demand.total_cmp(&b.demand)),
        "utilization" => rows.sort_by(|a, b| a.utilization.total_cmp(&b.utilization)),
        "units" => rows.sort_by_key(|r| r.units),
        "state" => rows.sort_by_key(|r| r.state as u8),
        other => {
            return Err(ApiError::bad(format!(
                "sort: {other:?} is not one of id, demand, utilization, units, state"
            )))
        }
    }
    if desc {
        rows.reverse();
    }
    if let Some(limit) = q.limit {
        rows.truncate(limit);
    }
    Ok(Json(ClustersBody {
        map_version: s.version,
        clusters: rows,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterQuery {
    top: Option<usize>,
}

async fn cluster(
    State(app): State<App>,
    Path(id): Path<String>,
    q: Result<Query<ClusterQuery>, QueryRejection>,
) -> ApiResult<ClusterRow> {
    let top = top_of(query(q)?.top)?;
    let (s, v) = view(&app).await?;
    let topo = topology(&app)?;
    let c = topo
        .cluster_index(&id)
        .ok_or_else(|| ApiError::not_found(format!("no cluster {:?}", clean(&id, 64))))?;
    Ok(Json(cluster_row(&topo, c as usize, &s, &v, top)))
}

// ---------------------------------------------------------------------------------------------
// POST /api/clusters/{id}/state

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StateBody {
    state: ClusterState,
    #[serde(default)]
    reason: String,
}

#[derive(Serialize)]
struct StateAnswer {
    cluster: String,
    state: ClusterState,
    /// When the change reaches the map.
    takes_effect: &'static str,
}

/// Checks `Authorization: Bearer <token>` like the gRPC Admin interceptor.
fn authorize(token: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = token else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "actions are disabled: the server has no admin_token configured",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong admin token")),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "actions need \"Authorization: Bearer <admin token>\"",
        )),
    }
}

async fn set_state(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    extensions: Extensions,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StateAnswer> {
    let remote = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| *a);
    if let Err(e) = authorize(app.token.as_deref(), &headers) {
        tracing::warn!(cluster = %clean(&id, 64), ?remote, error = %e.message, "dashboard action refused");
        return Err(e);
    }
    let body = body.map_err(|e| {
        ApiError::new(
            e.status(),
            format!(
                "body: {} (at most {MAX_ACTION_BODY_BYTES} bytes)",
                e.body_text()
            ),
        )
    })?;
    let body: StateBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad(format!(
            "body: {e} (expected {{\"state\": \"up\" | \"drained\" | \"down\", \"reason\": \"...\"}})"
        ))
    })?;
    let who = headers.get("x-operator").and_then(|v| v.to_str().ok());
    let actor = Actor::new(who, remote, "http");
    let reason = clean(&body.reason, MAX_REASON_LEN);
    app.shared
        .set_cluster_state(&id, body.state, &reason, actor)
        .await
        .map_err(|e| match e {
            ActionError::NoCluster(_) => ApiError::not_found(e.to_string()),
            ActionError::Store(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        })?;
    Ok(Json(StateAnswer {
        cluster: id,
        state: body.state,
        takes_effect: "the next round",
    }))
}

// ---------------------------------------------------------------------------------------------
// GET /api/map

#[derive(Serialize)]
struct MapCluster {
    id: String,
    lat: f64,
    lon: f64,
    state: ClusterState,
    demand: f64,
    utilization: f64,
}

#[derive(Serialize)]
struct MapBody {
    map_version: u64,
    region_deg: f64,
    clusters: Vec<MapCluster>,
    regions: Vec<figures::Region>,
    flows: Vec<figures::Flow>,
}

async fn world_map(State(app): State<App>) -> ApiResult<MapBody> {
    let (s, v) = view(&app).await?;
    let topo = topology(&app)?;
    let clusters = topo
        .clusters()
        .iter()
        .map(|cl| {
            let m = s.instance.cluster_index(&cl.id).map(|m| m as usize);
            MapCluster {
                id: cl.id.clone(),
                lat: cl.lat,
                lon: cl.lon,
                state: cl.state,
                demand: m.map_or(0.0, |m| v.demand[m]),
                utilization: m.map_or(0.0, |m| v.utilization[m]),
            }
        })
        .collect();
    Ok(Json(MapBody {
        map_version: s.version,
        region_deg: figures::REGION_DEG,
        clusters,
        regions: v.regions.clone(),
        flows: v.flows.clone(),
    }))
}

// ---------------------------------------------------------------------------------------------
// GET /api/history, /api/events

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitQuery {
    limit: Option<usize>,
}

fn limit_of(limit: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default),
        Some(0) => Err(ApiError::bad("limit: must be at least 1")),
        Some(l) if l <= max => Ok(l),
        Some(l) => Err(ApiError::bad(format!("limit: {l} is more than {max}"))),
    }
}

async fn history(
    State(app): State<App>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = limit_of(query(q)?.limit, MAX_HISTORY_ROUNDS, MAX_HISTORY_ROUNDS)?;
    Ok(Json(json!({ "rounds": app.shared.dash().history(limit) })))
}

async fn events(
    State(app): State<App>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = limit_of(query(q)?.limit, DEFAULT_EVENTS, MAX_EVENTS)?;
    Ok(Json(json!({ "events": app.shared.dash().events(limit) })))
}

// ---------------------------------------------------------------------------------------------
// GET /api/lookup?q=&class=

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupQuery {
    q: Option<String>,
    class: Option<String>,
}

#[derive(Serialize)]
struct Placed {
    cluster: String,
    amount: f64,
    share: f64,
}

#[derive(Serialize)]
struct UnitLookup {
    id: String,
    class: String,
    demand: f64,
    lat: f64,
    lon: f64,
    /// The length of the unit's prefix that covers the address asked for (`null` when looked
    /// up by id).
    matched_prefix_len: Option<u8>,
    prefix_count: usize,
    prefixes: Vec<String>,
    placed: Vec<Placed>,
    overflow: f64,
    overflow_share: f64,
    candidates: Vec<CandidateView>,
}

#[derive(Serialize)]
struct LookupBody {
    query: String,
    /// The address searched for (`null` when the query was a map unit id).
    address: Option<IpAddr>,
    map_version: u64,
    units: Vec<UnitLookup>,
}

fn unit_lookup(s: &Snapshot, v: &View, u: UnitIdx, len: Option<u8>) -> UnitLookup {
    let inst = &s.instance;
    let (lat, lon) = inst.unit_location(u);
    let allocs = s.map.allocations(u);
    let overflow = s.map.overflow(u);
    let total: f64 = allocs.iter().map(|a| a.amount).sum::<f64>() + overflow;
    let share = |x: f64| if total > 0.0 { x / total } else { 0.0 };
    let prefixes = inst.unit_prefixes(u);
    UnitLookup {
        id: inst.unit_id(u).to_string(),
        class: inst.classes()[usize::from(inst.unit_class(u))].name.clone(),
        demand: inst.unit_demand(u),
        lat,
        lon,
        matched_prefix_len: len,
        prefix_count: prefixes.len(),
        prefixes: prefixes
            .iter()
            .take(MAX_LOOKUP_PREFIXES)
            .map(|p| p.to_string())
            .collect(),
        placed: allocs
            .iter()
            .map(|a| Placed {
                cluster: inst.clusters()[a.cluster as usize].id.clone(),
                amount: a.amount,
                share: share(a.amount),
            })
            .collect(),
        overflow,
        overflow_share: share(overflow),
        candidates: figures::explain(v, inst, &s.map, u),
    }
}

async fn lookup(
    State(app): State<App>,
    q: Result<Query<LookupQuery>, QueryRejection>,
) -> ApiResult<LookupBody> {
    let q = query(q)?;
    let text = q.q.unwrap_or_default();
    let text = text.trim();
    if text.is_empty() {
        return Err(ApiError::bad(
            "q: missing: give an IP address, a prefix or a map unit id",
        ));
    }
    if text.len() > MAX_LOOKUP_LEN {
        return Err(ApiError::bad(format!(
            "q: {} characters, more than {MAX_LOOKUP_LEN}",
            text.len()
        )));
    }
    let (s, v) = view(&app).await?;
    let inst = &s.instance;
    let classes: Vec<cdnmap_mapper::ClassIdx> = match q.class.as_deref() {
        None | Some("") => (0..inst.classes().len() as cdnmap_mapper::ClassIdx).collect(),
        Some(name) => vec![inst.class_index(name).ok_or_else(|| {
            ApiError::bad(format!(
                "class: {:?} is not a traffic class (the classes are {})",
                clean(name, 64),
                inst.classes()
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?],
    };
    let address = text
        .parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<IpNet>().ok().map(|n| n.network()));
    let units: Vec<UnitLookup> = match address {
        Some(ip) => classes
            .iter()
            .filter_map(|&k| s.resolver.unit_for(ip, k))
            .map(|(u, len)| unit_lookup(&s, &v, u, Some(len)))
            .collect(),
        None => match inst.unit_index(text) {
            Some(u) => vec![unit_lookup(&s, &v, u, None)],
            None => {
                return Err(ApiError::bad(format!(
                    "q: {:?} is neither an IP address, a prefix nor a map unit id",
                    clean(text, 64)
                )))
            }
        },
    };
    if units.is_empty() {
        return Err(ApiError::not_found(format!(
            "no map unit covers {} (answers for it come from the fallback cluster)",
            clean(text, 64)
        )));
    }
    Ok(Json(LookupBody {
        query: text.to_string(),
        address,
        map_version: s.version,
        units,
    }))
}
