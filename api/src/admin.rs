//! The `cdnmap.v1.Admin` service behind its bearer-token interceptor: status, and every change
//! of the topology through the topology writer.

use std::sync::Arc;

use cdnmap_mapper::model::shown_id;
use cdnmap_mapper::{ClusterState, Instance, UnitIdx};
use cdnmap_proto::v1 as pb;
use cdnmap_store::edit::{Applied, Edit, EditError};
use cdnmap_topology::format::{CandidateFile, ClusterFile, MapUnitFile, NestedNode, ResourcesFile};
use cdnmap_topology::Topology;
use tonic::{Request, Response, Status};

use crate::service::{invalid, Shared};
use crate::topology::{Change, ChangeError};

/// Checks `authorization: Bearer <token>` on every Admin call, through the gate that watches
/// failures (`auth`: counted, logged, and a source that fails too often refused for a while).
#[derive(Clone)]
pub struct AdminAuth(pub Arc<crate::auth::AdminGate>);

impl tonic::service::Interceptor for AdminAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        use crate::auth::Denied;
        let remote = crate::listen::peer_of(&request).map(|p| p.remote.ip());
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match self.0.check(given, remote, "grpc", "Admin") {
            Ok(()) => Ok(request),
            Err(Denied::Disabled) => Err(Status::unauthenticated(
                "Admin is disabled: the server has no admin_token configured",
            )),
            Err(Denied::Wrong) => Err(Status::unauthenticated("wrong admin token")),
            Err(Denied::Missing) => Err(Status::unauthenticated(
                "Admin calls need \"authorization: Bearer <token>\"",
            )),
            Err(Denied::TooMany { retry_after }) => Err(Status::resource_exhausted(format!(
                "too many failed Admin authentications from this address: retry in {} s",
                retry_after.as_secs().max(1)
            ))),
        }
    }
}

/// The `Admin` service.
pub struct AdminService(pub Arc<Shared>);

pub(crate) fn cluster_pb(inst: &Topology, c: usize) -> pb::Cluster {
    let cl = &inst.clusters()[c];
    fn node(inst: &Instance, cl: &cdnmap_mapper::Cluster, i: u32) -> pb::ResourceNode {
        let n = &cl.nodes[i as usize];
        pb::ResourceNode {
            name: n.name.clone(),
            kind: match n.kind {
                cdnmap_mapper::ResourceKind::Bps => "bps".into(),
                cdnmap_mapper::ResourceKind::Fps => "fps".into(),
            },
            capacity: n.capacity,
            classes: n
                .classes
                .iter()
                .map(|&k| inst.classes()[usize::from(k)].name.clone())
                .collect(),
            children: n.children.iter().map(|&ch| node(inst, cl, ch)).collect(),
        }
    }
    pb::Cluster {
        id: cl.id.clone(),
        lat: cl.lat,
        lon: cl.lon,
        addresses: inst
            .cluster_addresses(c as u32)
            .iter()
            .map(|a| a.to_string())
            .collect(),
        state: cdnmap_serve::watch::state_pb(cl.state) as i32,
        resources: Some(node(inst, cl, 0)),
    }
}

pub(crate) fn unit_admin_pb(inst: &Topology, u: UnitIdx) -> pb::MapUnit {
    let (lat, lon) = inst.unit_location(u);
    pb::MapUnit {
        id: inst.unit_id(u).to_string(),
        traffic_class: inst.classes()[usize::from(inst.unit_class(u))].name.clone(),
        demand: inst.unit_demand(u),
        prefixes: inst
            .unit_prefixes(u)
            .iter()
            .map(|p| p.to_string())
            .collect(),
        lat,
        lon,
        candidates: inst
            .candidates(u)
            .map(|c| pb::Candidate {
                cluster: inst.clusters()[c.cluster as usize].id.clone(),
                score: f64::from(c.score),
                cluster_rank: c.explicit_rank.then_some(f64::from(c.rank)),
            })
            .collect(),
    }
}

fn parse_list<T: std::str::FromStr>(items: &[String], field: &str) -> Result<Vec<T>, Status> {
    items
        .iter()
        .enumerate()
        .map(|(i, a)| {
            a.parse()
                .map_err(|_| invalid(format!("{field}[{i}]: {} is not valid", shown_id(a))))
        })
        .collect()
}

/// Refuses a tree deeper than [`cdnmap_mapper::MAX_TREE_DEPTH`] levels or of more than
/// [`cdnmap_mapper::MAX_TREE_NODES`] nodes, walking it without recursion, before
/// [`node_from_pb`] recurses into it (the model refuses both too, naming the cluster; this
/// bounds the conversion's own stack and work first).
fn check_tree_shape(root: &pb::ResourceNode) -> Result<(), Status> {
    use cdnmap_mapper::{MAX_TREE_DEPTH, MAX_TREE_NODES};
    let mut nodes = 0usize;
    let mut stack = vec![(root, 1usize)];
    while let Some((n, level)) = stack.pop() {
        if level > MAX_TREE_DEPTH {
            return Err(invalid(format!(
                "resources: node {} is at level {level}, deeper than the {MAX_TREE_DEPTH} levels a resource tree may have",
                shown_id(&n.name)
            )));
        }
        nodes += 1;
        if nodes > MAX_TREE_NODES {
            return Err(invalid(format!(
                "resources: more than {MAX_TREE_NODES} nodes, the most a resource tree may have"
            )));
        }
        stack.extend(n.children.iter().map(|c| (c, level + 1)));
    }
    Ok(())
}

fn node_from_pb(n: pb::ResourceNode, path: &str) -> Result<NestedNode, Status> {
    let kind = match n.kind.as_str() {
        "bps" => cdnmap_mapper::ResourceKind::Bps,
        "fps" => cdnmap_mapper::ResourceKind::Fps,
        other => {
            return Err(invalid(format!(
                "{path}.kind: {other:?} is not \"bps\" or \"fps\""
            )))
        }
    };
    let children = n
        .children
        .into_iter()
        .enumerate()
        .map(|(i, c)| node_from_pb(c, &format!("{path}.children[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(NestedNode {
        name: n.name,
        kind,
        capacity: n.capacity,
        classes: n.classes,
        children,
    })
}

pub(crate) fn cluster_from_pb(c: pb::Cluster) -> Result<ClusterFile, Status> {
    // A cluster upserted without a state is up.
    let state = match (c.state, cdnmap_serve::watch::state_from_pb(c.state)) {
        (_, Some(s)) => s,
        (0, None) => ClusterState::Up,
        (_, None) => {
            return Err(invalid(format!(
                "state: {} is not a cluster state",
                c.state
            )))
        }
    };
    let root = c
        .resources
        .ok_or_else(|| invalid("resources: a cluster needs a resource tree"))?;
    check_tree_shape(&root)?;
    Ok(ClusterFile {
        id: c.id,
        lat: c.lat,
        lon: c.lon,
        addresses: parse_list(&c.addresses, "addresses")?,
        state,
        classes: None,
        resources: ResourcesFile::Nested(node_from_pb(root, "resources")?),
    })
}

pub(crate) fn unit_from_pb(u: pb::MapUnit) -> Result<MapUnitFile, Status> {
    Ok(MapUnitFile {
        id: u.id,
        class: u.traffic_class,
        demand: u.demand,
        prefixes: parse_list(&u.prefixes, "prefixes")?,
        lat: u.lat,
        lon: u.lon,
        candidates: u
            .candidates
            .into_iter()
            .map(|c| CandidateFile {
                cluster: c.cluster,
                score: c.score,
                cluster_rank: c.cluster_rank,
            })
            .collect(),
    })
}

/// A page of ids after `after` (exclusive), at most `size` (0: 100; at most 1,000).
fn page<'a>(ids: impl Iterator<Item = &'a str>, after: &str, size: u32) -> (Vec<&'a str>, String) {
    let size = match size {
        0 => 100,
        n => n.min(1_000),
    } as usize;
    let mut out: Vec<&str> = ids
        .filter(|id| after.is_empty() || *id > after)
        .take(size + 1)
        .collect();
    let next = if out.len() > size {
        out.truncate(size);
        out.last().map_or(String::new(), |s| s.to_string())
    } else {
        String::new()
    };
    (out, next)
}

impl AdminService {
    /// Carries out `change` through the topology writer: applied, validated like an instance
    /// file, stored, published (the next round solves it), then answered. What the operator
    /// should know (candidates dropped, a traffic class left with no up cluster) travels in
    /// the answer's `cdnmap-warnings` metadata, one warning per entry.
    async fn change(&self, change: Change) -> Result<Applied, Status> {
        let applied = self
            .0
            .topology
            .change(change)
            .await
            .map_err(change_status)?;
        if applied.changed {
            tracing::warn!(warnings = ?applied.warnings, "topology changed by Admin");
        }
        Ok(applied)
    }

    fn topology(&self) -> Arc<Topology> {
        self.0.topology.current()
    }
}

/// The status of a change the topology writer did not carry out.
fn change_status(e: ChangeError) -> Status {
    match e {
        ChangeError::Edit(EditError::NoCluster(_)) => Status::not_found(e.to_string()),
        ChangeError::Edit(_) => invalid(e.to_string()),
        ChangeError::Store(_) | ChangeError::Stopped | ChangeError::Shared(_) => {
            Status::unavailable(e.to_string())
        }
        ChangeError::NotLeader(_) | ChangeError::Guard(_) => {
            Status::failed_precondition(e.to_string())
        }
    }
}

/// `body` as an answer carrying `warnings` in its metadata.
fn with_warnings<T>(body: T, warnings: &[String]) -> Response<T> {
    let mut response = Response::new(body);
    for w in warnings {
        // Metadata values are visible ASCII; a warning is the server's own text, but a cluster
        // or class id in it may not be.
        let ascii: String = w
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(ascii.as_str()) {
            response.metadata_mut().append("cdnmap-warnings", v);
        }
    }
    response
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn get_cluster(
        &self,
        request: Request<pb::GetClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let id = request.into_inner().id;
        let inst = self.topology();
        let c = inst
            .cluster_index(&id)
            .ok_or_else(|| Status::not_found(format!("no cluster {}", shown_id(&id))))?;
        Ok(Response::new(cluster_pb(&inst, c as usize)))
    }

    async fn list_clusters(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListClustersResponse>, Status> {
        let r = request.into_inner();
        let inst = self.topology();
        let (ids, next) = page(
            inst.clusters().iter().map(|c| c.id.as_str()),
            &r.after_id,
            r.page_size,
        );
        let clusters = ids
            .iter()
            .filter_map(|id| inst.cluster_index(id))
            .map(|c| cluster_pb(&inst, c as usize))
            .collect();
        Ok(Response::new(pb::ListClustersResponse {
            clusters,
            next_after_id: next,
        }))
    }

    async fn upsert_cluster(
        &self,
        request: Request<pb::Cluster>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let file = cluster_from_pb(request.into_inner())?;
        let id = file.id.clone();
        let applied = self.change(Change::UpsertCluster(file)).await?;
        let c = applied.topology.cluster_index(&id).unwrap_or_default();
        Ok(with_warnings(
            cluster_pb(&applied.topology, c as usize),
            &applied.warnings,
        ))
    }

    async fn delete_cluster(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let id = request.into_inner().id;
        let applied = self.change(Change::DeleteCluster(id)).await?;
        Ok(with_warnings(
            pb::DeleteResponse {
                deleted: applied.changed,
            },
            &applied.warnings,
        ))
    }

    async fn get_map_unit(
        &self,
        request: Request<pb::GetMapUnitRequest>,
    ) -> Result<Response<pb::MapUnit>, Status> {
        let id = request.into_inner().id;
        let inst = self.topology();
        let u = inst
            .unit_index(&id)
            .ok_or_else(|| Status::not_found(format!("no map unit {id:?}")))?;
        Ok(Response::new(unit_admin_pb(&inst, u)))
    }

    async fn list_map_units(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListMapUnitsResponse>, Status> {
        let r = request.into_inner();
        let inst = self.topology();
        let ids = (0..inst.unit_count() as UnitIdx).map(|u| inst.unit_id(u));
        let (ids, next) = page(ids, &r.after_id, r.page_size);
        let map_units = ids
            .iter()
            .filter_map(|id| inst.unit_index(id))
            .map(|u| unit_admin_pb(&inst, u))
            .collect();
        Ok(Response::new(pb::ListMapUnitsResponse {
            map_units,
            next_after_id: next,
        }))
    }

    async fn upsert_map_unit(
        &self,
        request: Request<pb::MapUnit>,
    ) -> Result<Response<pb::MapUnit>, Status> {
        let file = unit_from_pb(request.into_inner())?;
        let id = file.id.clone();
        let applied = self.change(Change::UpsertMapUnit(file)).await?;
        let u = applied.topology.unit_index(&id).unwrap_or_default();
        Ok(with_warnings(
            unit_admin_pb(&applied.topology, u),
            &applied.warnings,
        ))
    }

    async fn get_policy(
        &self,
        _request: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::Policy>, Status> {
        Ok(Response::new(policy_pb(&self.0.topology_now())))
    }

    async fn set_policy(
        &self,
        request: Request<pb::Policy>,
    ) -> Result<Response<pb::Policy>, Status> {
        let r = request.into_inner();
        let spec = policy_from_json(&r.json)?;
        let applied = crate::guard::set_policy(&self.0, spec, &r.reason, r.force)
            .await
            .map_err(change_status)?;
        Ok(Response::new(policy_pb(&applied.topology)))
    }

    async fn delete_map_unit(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let id = request.into_inner().id;
        let applied = self.change(Change::DeleteMapUnit(id)).await?;
        Ok(with_warnings(
            pb::DeleteResponse {
                deleted: applied.changed,
            },
            &applied.warnings,
        ))
    }

    async fn set_cluster_state(
        &self,
        request: Request<pb::SetClusterStateRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        let actor = crate::topology::Actor::of_grpc(&request);
        let r = request.into_inner();
        let state = cdnmap_serve::watch::state_from_pb(r.state)
            .ok_or_else(|| invalid(format!("state: {} is not UP, DRAINED or DOWN", r.state)))?;
        let applied =
            crate::guard::set_cluster_state(&self.0, &r.id, state, &r.reason, actor, r.force, None)
                .await
                .map_err(change_status)?;
        let c = applied.topology.cluster_index(&r.id).unwrap_or_default();
        Ok(with_warnings(
            cluster_pb(&applied.topology, c as usize),
            &applied.warnings,
        ))
    }

    async fn get_status(
        &self,
        _: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::Status>, Status> {
        let s = self.0.current();
        let status = self
            .0
            .read
            .status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let inst = self.topology();
        let overflow_share = s.as_ref().map_or(0.0, |s| {
            let d = s.topology.total_demand();
            if d > 0.0 {
                s.map.total_overflow() / d
            } else {
                0.0
            }
        });
        Ok(Response::new(pb::Status {
            map_version: s.as_ref().map_or(0, |s| s.version),
            map_epoch: s.as_ref().map_or(0, |s| s.epoch),
            unserved_classes: cdnmap_store::edit::unserved_classes(&inst),
            map_solved_at_unix_ms: s.as_ref().map_or(0, |s| s.solved_at_unix_ms),
            last_round_at_unix_ms: status.last_round_at_unix_ms,
            last_round_failed: status.failed,
            last_round_error: status.error,
            last_solve_ms: status.solve_ms,
            churn: s.as_ref().and_then(|s| s.churn).unwrap_or(0.0),
            overflow_share,
            map_units: inst.unit_count() as u64,
            clusters: inst.clusters().len() as u64,
            replication: self.0.replication(),
        }))
    }

    async fn diff_maps(
        &self,
        request: Request<pb::DiffMapsRequest>,
    ) -> Result<Response<pb::MapDiff>, Status> {
        self.diff_stored(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn preview(
        &self,
        request: Request<pb::PreviewRequest>,
    ) -> Result<Response<pb::PreviewResponse>, Status> {
        self.preview_changes(request.into_inner())
            .await
            .map(Response::new)
    }
}

impl AdminService {
    /// `Admin.DiffMaps` ([`crate::diffs`]).
    async fn diff_stored(&self, r: pb::DiffMapsRequest) -> Result<pb::MapDiff, Status> {
        let rows =
            |n: u32, what: &str| crate::diffs::rows(n).map_err(|e| invalid(format!("{what}: {e}")));
        let (max_flows, max_units) = (
            rows(r.max_flows, "max_flows")?,
            rows(r.max_units, "max_units")?,
        );
        let d = crate::diffs::diff_stored(&self.0, r.from_version, r.to_version, max_units)
            .await
            .map_err(|e| match e {
                crate::diffs::DiffError::Busy => Status::resource_exhausted(e.to_string()),
                crate::diffs::DiffError::NotStored(_) => Status::not_found(e.to_string()),
                crate::diffs::DiffError::Failed(_) => Status::internal(e.to_string()),
            })?;
        Ok(map_diff_pb(d.from, d.to, d.diff, max_flows))
    }

    /// `Admin.Preview` ([`crate::preview`]).
    async fn preview_changes(&self, r: pb::PreviewRequest) -> Result<pb::PreviewResponse, Status> {
        let rows =
            |n: u32, what: &str| crate::diffs::rows(n).map_err(|e| invalid(format!("{what}: {e}")));
        let (max_flows, max_units) = (
            rows(r.max_flows, "max_flows")?,
            rows(r.max_units, "max_units")?,
        );
        let states = r.changes.len();
        if states + r.edits.len() > crate::preview::MAX_CHANGES {
            return Err(invalid(format!(
                "changes and edits: {}; at most {}",
                states + r.edits.len(),
                crate::preview::MAX_CHANGES
            )));
        }
        let mut changes = r
            .changes
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                cdnmap_serve::watch::state_from_pb(c.state)
                    .map(|state| Edit::ClusterState { id: c.id, state })
                    .ok_or_else(|| {
                        invalid(format!(
                            "changes[{i}].state: {} is not UP, DRAINED or DOWN",
                            c.state
                        ))
                    })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        for (i, e) in r.edits.into_iter().enumerate() {
            let at = |s: Status| invalid(format!("edits[{i}]: {}", s.message()));
            changes.push(match e.edit {
                Some(pb::preview_edit::Edit::UpsertCluster(c)) => Edit::UpsertCluster {
                    cluster: cluster_from_pb(c).map_err(at)?,
                },
                Some(pb::preview_edit::Edit::DeleteCluster(id)) => Edit::DeleteCluster { id },
                Some(pb::preview_edit::Edit::UpsertMapUnit(u)) => Edit::UpsertMapUnit {
                    unit: unit_from_pb(u).map_err(at)?,
                },
                Some(pb::preview_edit::Edit::DeleteMapUnit(id)) => Edit::DeleteMapUnit { id },
                Some(pb::preview_edit::Edit::PolicyJson(json)) => Edit::Policy {
                    policy: policy_from_json(&json).map_err(at)?,
                },
                None => return Err(invalid(format!("edits[{i}]: no edit"))),
            });
        }
        use crate::preview::PreviewError as E;
        let p =
            crate::preview::preview_edits(&self.0, changes, max_units, crate::preview::Turn::Now)
                .await
                .map_err(|e| match e {
                    E::Busy => Status::resource_exhausted(e.to_string()),
                    E::NoMap => Status::failed_precondition(e.to_string()),
                    E::Invalid(_) => invalid(e.to_string()),
                    E::NoCluster(..) => Status::not_found(e.to_string()),
                    E::Failed(_) => Status::internal(e.to_string()),
                })?;
        Ok(pb::PreviewResponse {
            based_on_version: p.based_on,
            diff: Some(map_diff_pb(p.based_on, 0, p.diff, max_flows)),
            overflow_before: p.before.overflow,
            overflow_after: p.after.overflow,
            overflow_share_before: p.before.overflow_share,
            overflow_share_after: p.after.overflow_share,
            nodes_full_before: p.before.nodes_full,
            nodes_full_after: p.after.nodes_full,
            mean_rtt_ms_before: p.before.mean_rtt_ms,
            mean_rtt_ms_after: p.after.mean_rtt_ms,
            regions: p
                .regions
                .iter()
                .map(|r| pb::RegionMove {
                    lat: r.lat,
                    lon: r.lon,
                    units: r.units as u64,
                    moved: r.moved,
                })
                .collect(),
        })
    }
}

/// `d`, the diff from version `from` to `to`, as the API gives it: its `max_flows` largest
/// flows.
fn map_diff_pb(
    from: u64,
    to: u64,
    d: cdnmap_mapper::diff::MapDiff,
    max_flows: usize,
) -> pb::MapDiff {
    pb::MapDiff {
        from_version: from,
        to_version: to,
        units_compared: d.units_compared as u64,
        units_changed: d.units_changed as u64,
        units_added: d.units_added as u64,
        units_removed: d.units_removed as u64,
        demand: d.demand,
        moved: d.moved,
        moved_share: d.moved_share(),
        flow_count: d.flows.len() as u64,
        flows: d
            .flows
            .iter()
            .take(max_flows)
            .map(|f| pb::MapFlow {
                from_cluster: f.from.clone(),
                to_cluster: f.to.clone(),
                demand: f.demand,
            })
            .collect(),
        changed_units: d
            .changed
            .into_iter()
            .map(|(map_unit, moved)| pb::ChangedUnit { map_unit, moved })
            .collect(),
    }
}

/// A policy from its JSON file form (`""` is none); INVALID_ARGUMENT naming what is wrong.
fn policy_from_json(json: &str) -> Result<cdnmap_mapper::model::PolicySpec, Status> {
    if json.trim().is_empty() {
        return Ok(cdnmap_mapper::model::PolicySpec::default());
    }
    serde_json::from_str(json).map_err(|e| invalid(format!("policy json: {e}")))
}

/// `topology`'s policy as Admin answers it.
fn policy_pb(topology: &cdnmap_topology::Topology) -> pb::Policy {
    let json = cdnmap_topology::format::policy_file(topology)
        .and_then(|p| serde_json::to_string(&p).ok())
        .unwrap_or_default();
    pb::Policy {
        json,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::{cluster_from_pb, pb};
    use cdnmap_mapper::MAX_TREE_DEPTH;

    /// A cluster whose resource tree is a chain of `levels` nodes, the last serving web.
    fn chain(levels: usize) -> pb::Cluster {
        let node = |i: usize, children| pb::ResourceNode {
            name: format!("n{i}"),
            kind: "bps".into(),
            capacity: 100.0,
            classes: if i == levels {
                vec!["web".into()]
            } else {
                vec![]
            },
            children,
        };
        let mut tree = node(levels, vec![]);
        for i in (1..levels).rev() {
            tree = node(i, vec![tree]);
        }
        pb::Cluster {
            id: "deep".into(),
            lat: 1.0,
            lon: 2.0,
            addresses: vec!["192.0.2.1".into()],
            state: 0,
            resources: Some(tree),
        }
    }

    /// A tree deeper than the model takes is refused by the conversion itself, before it
    /// recurses into it (2,000 levels here; prost would stop at 100 on the wire), naming the
    /// node and the limit; the deepest tree taken converts and the model takes it.
    #[test]
    fn a_tree_too_deep_is_refused_before_the_conversion_recurses() {
        let deepest = cluster_from_pb(chain(MAX_TREE_DEPTH)).expect("the deepest tree taken");
        assert_eq!(deepest.resources.to_specs().len(), MAX_TREE_DEPTH);
        for levels in [MAX_TREE_DEPTH + 1, 62, 2_000] {
            let e = cluster_from_pb(chain(levels)).expect_err("too deep");
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            let level = MAX_TREE_DEPTH + 1;
            assert_eq!(
                e.message(),
                format!(
                    "resources: node \"n{level}\" is at level {level}, deeper than the \
                     {MAX_TREE_DEPTH} levels a resource tree may have"
                ),
                "{levels} levels"
            );
        }
    }
}
