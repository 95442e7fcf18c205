//! The dashboard's cluster endpoints: the cluster list and one cluster (`GET /api/clusters`,
//! `/api/clusters/{id}`), the operator's action on a cluster (`POST
//! /api/clusters/{id}/state`, token-checked) and the world map (`GET /api/map`).

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::Json;
use cdnmap_engine::figures::{self, View};
use cdnmap_engine::round::Snapshot;
use cdnmap_mapper::model::shown_id;
use cdnmap_mapper::{ClusterState, Instance};
use cdnmap_store::edit::EditError;
use serde::{Deserialize, Serialize};

use super::app::{
    authorize, query, topology, view, ApiError, ApiResult, App, MAX_ACTION_BODY_BYTES,
};
use crate::topology::{clean, Actor, ChangeError, MAX_REASON_LEN};

/// Map units listed per cluster in `/api/clusters` unless `top` says otherwise.
pub const DEFAULT_TOP_UNITS: usize = 5;
/// The most map units listed per cluster (`top`).
pub const MAX_TOP_UNITS: usize = 100;

// ---------------------------------------------------------------------------------------------
// GET /api/clusters, /api/clusters/{id}

#[derive(Serialize)]
pub(super) struct NodeRow {
    name: String,
    kind: cdnmap_mapper::ResourceKind,
    parent: Option<String>,
    classes: Vec<String>,
    load: f64,
    /// The capacity the published map was solved with (the estimator may have derated it).
    capacity: f64,
    /// The capacity in the topology.
    configured_capacity: f64,
    utilization: f64,
}

#[derive(Serialize)]
pub(super) struct UnitShare {
    id: String,
    class: String,
    amount: f64,
}

#[derive(Serialize)]
pub(super) struct ClusterRow {
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
    /// The estimator's capacity factor (1: not derated); the capacities above include it from
    /// the round after it changed.
    capacity_factor: f64,
    /// Why the cluster is derated (its node whose measured load ran ahead of the model).
    derated_because: Option<String>,
    /// Why the health checks hold the cluster down (`null`: they do not, or none run); the
    /// next round maps it down if the operator has it up.
    health_down: Option<String>,
}

/// The clusters the health checks hold down, by id, with why.
pub(super) fn health_down(app: &App) -> std::collections::BTreeMap<String, String> {
    app.shared
        .health
        .as_ref()
        .map(|h| h.down())
        .unwrap_or_default()
}

/// The derated clusters by id: (capacity factor, why).
type Deratings = HashMap<String, (f64, Option<String>)>;

pub(super) fn deratings(app: &App) -> Deratings {
    app.shared
        .with_estimates(|e| {
            e.derater()
                .derated()
                .map(|(id, d)| {
                    let why = d.reason.as_ref().map(|r| {
                        format!(
                            "node {:?} measured {:.3} against {:.3} predicted ({:.2}x)",
                            r.node,
                            r.measured,
                            r.predicted,
                            if r.predicted > 0.0 {
                                r.measured / r.predicted
                            } else {
                                0.0
                            }
                        )
                    });
                    (id.to_string(), (d.factor, why))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn cluster_row(
    topo: &Instance,
    c: usize,
    s: &Snapshot,
    v: &View,
    top: usize,
    derated: &Deratings,
    health: &std::collections::BTreeMap<String, String>,
) -> ClusterRow {
    let cl = &topo.clusters()[c];
    let (capacity_factor, derated_because) = derated.get(&cl.id).cloned().unwrap_or((1.0, None));
    let in_map = s.topology.cluster_index(&cl.id);
    let class_name = |k: cdnmap_mapper::ClassIdx| {
        topo.classes()
            .get(usize::from(k))
            .map_or_else(String::new, |c| c.name.clone())
    };
    let nodes = cl
        .nodes
        .iter()
        .map(|node| {
            // The published map's load and capacity (derated by the estimator, if so) of the
            // node of the same name (the topology may have changed since).
            let (load, capacity) = in_map
                .and_then(|m| {
                    let mc = &s.topology.clusters()[m as usize];
                    let mn = mc.nodes.iter().position(|x| x.name == node.name)?;
                    Some((
                        v.usage[s.topology.global_node(m, mn as u32)],
                        mc.nodes[mn].capacity,
                    ))
                })
                .unwrap_or((0.0, node.capacity));
            NodeRow {
                name: node.name.clone(),
                kind: node.kind,
                parent: node
                    .parent
                    .and_then(|p| cl.nodes.get(p as usize))
                    .map(|p| p.name.clone()),
                classes: node.classes.iter().map(|&k| class_name(k)).collect(),
                load,
                capacity,
                configured_capacity: node.capacity,
                utilization: if capacity > 0.0 {
                    load / capacity
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
                    id: s.topology.unit_id(u).to_string(),
                    class: s
                        .topology
                        .classes()
                        .get(usize::from(s.topology.unit_class(u)))
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
        map_state: in_map.map(|m| s.topology.clusters()[m as usize].state),
        demand,
        utilization,
        units,
        nodes,
        top_units,
        capacity_factor,
        derated_because,
        health_down: health.get(&cl.id).cloned(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClustersQuery {
    sort: Option<String>,
    order: Option<String>,
    limit: Option<usize>,
    top: Option<usize>,
}

#[derive(Serialize)]
pub(super) struct ClustersBody {
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

pub(super) async fn clusters(
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
    let derated = deratings(&app);
    let health = health_down(&app);
    let mut rows: Vec<ClusterRow> = (0..topo.clusters().len())
        .map(|c| cluster_row(&topo, c, &s, &v, top, &derated, &health))
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
pub(super) struct ClusterQuery {
    top: Option<usize>,
}

pub(super) async fn cluster(
    State(app): State<App>,
    Path(id): Path<String>,
    q: Result<Query<ClusterQuery>, QueryRejection>,
) -> ApiResult<ClusterRow> {
    let top = top_of(query(q)?.top)?;
    let (s, v) = view(&app).await?;
    let topo = topology(&app)?;
    let c = topo
        .cluster_index(&id)
        .ok_or_else(|| ApiError::not_found(format!("no cluster {}", shown_id(&id))))?;
    Ok(Json(cluster_row(
        &topo,
        c as usize,
        &s,
        &v,
        top,
        &deratings(&app),
        &health_down(&app),
    )))
}

// ---------------------------------------------------------------------------------------------
// POST /api/clusters/{id}/state

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StateBody {
    state: ClusterState,
    #[serde(default)]
    reason: String,
    /// What the operator saw in the preview they confirm: the change applies only if the
    /// preview made again now is within its bounds (`super::preview`). The page always sends
    /// it; a script may leave it out.
    #[serde(default)]
    expect: Option<super::preview::Expect>,
    /// Past the guard (`[guard]`), with a reason.
    #[serde(default)]
    force: bool,
}

#[derive(Serialize)]
pub(super) struct StateAnswer {
    cluster: String,
    state: ClusterState,
    /// When the change reaches the map.
    takes_effect: &'static str,
    /// What the operator should know (for example: a traffic class no up cluster serves).
    warnings: Vec<String>,
}

pub(super) async fn set_state(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    extensions: Extensions,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StateAnswer> {
    let actor = actor_of(&app, &id, &headers, &extensions)?;
    let body: StateBody = body_of(
        body,
        r#"{"state": "up" | "drained" | "down", "reason": "..."}"#,
    )?;
    let seen = match &body.expect {
        Some(seen) => Some(super::preview::still_as_seen(&app, &id, body.state, seen).await?),
        None => None,
    };
    let reason = clean(&body.reason, MAX_REASON_LEN);
    let applied = crate::guard::set_cluster_state(
        &app.shared,
        &id,
        body.state,
        &reason,
        actor,
        body.force,
        seen,
    )
    .await
    .map_err(change_error)?;
    Ok(Json(StateAnswer {
        cluster: id,
        state: body.state,
        takes_effect: "the next round",
        warnings: applied.warnings,
    }))
}

/// A refused or failed change as the page gets it: 404 for a cluster that is not there, 400
/// for an edit that does not apply, 409 for the guard and a standby, 503 when the change
/// could not be stored or shared.
pub(super) fn change_error(e: ChangeError) -> ApiError {
    match e {
        ChangeError::Edit(EditError::NoCluster(_)) => ApiError::not_found(e.to_string()),
        ChangeError::Edit(_) => ApiError::bad(e.to_string()),
        ChangeError::Store(_) | ChangeError::Stopped | ChangeError::Shared(_) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
        ChangeError::NotLeader(_) | ChangeError::Guard(_) => {
            ApiError::new(StatusCode::CONFLICT, e.to_string())
        }
    }
}

/// The remote address of a request, and whether it may act (the Admin token); a refusal is
/// logged with `cluster`.
pub(super) fn actor_of(
    app: &App,
    cluster: &str,
    headers: &HeaderMap,
    extensions: &Extensions,
) -> Result<Actor, ApiError> {
    let remote = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| *a);
    if let Err(e) = authorize(&app.gate, headers, remote.map(|a| a.ip()), "actions") {
        tracing::warn!(cluster = %shown_id(cluster), ?remote, error = %e.message, "dashboard action refused");
        return Err(e);
    }
    let who = headers.get("x-operator").and_then(|v| v.to_str().ok());
    Ok(Actor::new(who, remote, "http"))
}

/// A JSON action body of at most [`MAX_ACTION_BODY_BYTES`], `expected` said in the error.
pub(super) fn body_of<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    expected: &str,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        ApiError::new(
            e.status(),
            format!(
                "body: {} (at most {MAX_ACTION_BODY_BYTES} bytes)",
                e.body_text()
            ),
        )
    })?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad(format!("body: {e} (expected {expected})")))
}

// ---------------------------------------------------------------------------------------------
// GET /api/map

#[derive(Serialize)]
pub(super) struct MapCluster {
    id: String,
    lat: f64,
    lon: f64,
    state: ClusterState,
    demand: f64,
    utilization: f64,
}

#[derive(Serialize)]
pub(super) struct MapBody {
    map_version: u64,
    region_deg: f64,
    clusters: Vec<MapCluster>,
    regions: Vec<figures::Region>,
    flows: Vec<figures::Flow>,
}

pub(super) async fn world_map(State(app): State<App>) -> ApiResult<MapBody> {
    let (s, v) = view(&app).await?;
    let topo = topology(&app)?;
    let clusters = topo
        .clusters()
        .iter()
        .map(|cl| {
            let m = s.topology.cluster_index(&cl.id).map(|m| m as usize);
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
