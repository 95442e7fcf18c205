//! The JSON instance and assignment file formats (documented in `docs/formats.md`).
//!
//! Parsing goes JSON → plain serde structs → [`TopologyBuilder`], so every semantic check lives in
//! one place (the model, and the addressing's limits). Fields not named here are ignored, so files may carry extra fields.
//! Writing streams map units one at a time, so a large world never exists twice in memory.

use std::fmt;
use std::io::Write;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use cdnmap_mapper::error::ModelError;
use cdnmap_mapper::map::{Allocation, Map};
use cdnmap_mapper::model::{
    CandidateSpec, ClusterSpec, ClusterState, Instance, Limits, MapUnitSpec, ResourceKind,
    ResourceNodeSpec, TrafficClass, UnitIdx,
};

use crate::{Topology, TopologyBuilder, TopologyError};

/// Why a file could not be read as an instance or an assignment.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("not a valid file")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Topology(TopologyError),
}

/// A topology's model error is the file's model error (one variant for each error, however
/// it was found).
impl From<TopologyError> for FormatError {
    fn from(e: TopologyError) -> FormatError {
        match e {
            TopologyError::Model(e) => FormatError::Model(e),
            e => FormatError::Topology(e),
        }
    }
}

/// The instance file, as serde sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstanceFile {
    pub traffic_classes: Vec<TrafficClass>,
    pub clusters: Vec<ClusterFile>,
    pub map_units: Vec<MapUnitFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterFile {
    pub id: String,
    pub lat: f64,
    pub lon: f64,
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    #[serde(default)]
    pub state: ClusterState,
    /// Classes the cluster claims to serve (optional; each must have a leaf).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<String>>,
    pub resources: ResourcesFile,
}

/// A resource tree, either nested (`{"name", ..., "children": [{...}]}`) or flat
/// (`[{"name", ..., "children": ["child name", ...]}, ...]`).
#[derive(Debug, Clone, PartialEq)]
pub enum ResourcesFile {
    Nested(NestedNode),
    Flat(Vec<FlatNode>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NestedNode {
    pub name: String,
    pub kind: ResourceKind,
    pub capacity: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<NestedNode>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlatNode {
    pub name: String,
    pub kind: ResourceKind,
    pub capacity: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
}

impl Serialize for ResourcesFile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ResourcesFile::Nested(n) => n.serialize(s),
            ResourcesFile::Flat(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ResourcesFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ResourcesFile;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a resource tree: a node object, or an array of nodes")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                NestedNode::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ResourcesFile::Nested)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::<FlatNode>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(ResourcesFile::Flat)
            }
        }
        d.deserialize_any(V)
    }
}

impl ResourcesFile {
    /// The flat list of node specs the model validates (nested trees are flattened; a name that
    /// appears twice is then refused by the model as a duplicate).
    pub fn to_specs(&self) -> Vec<ResourceNodeSpec> {
        match self {
            ResourcesFile::Flat(nodes) => nodes
                .iter()
                .map(|n| ResourceNodeSpec {
                    name: n.name.clone(),
                    kind: n.kind,
                    capacity: n.capacity,
                    classes: n.classes.clone(),
                    children: n.children.clone(),
                })
                .collect(),
            ResourcesFile::Nested(root) => {
                let mut out = Vec::new();
                let mut stack = vec![root];
                while let Some(n) = stack.pop() {
                    out.push(ResourceNodeSpec {
                        name: n.name.clone(),
                        kind: n.kind,
                        capacity: n.capacity,
                        classes: n.classes.clone(),
                        children: n.children.iter().map(|c| c.name.clone()).collect(),
                    });
                    stack.extend(n.children.iter().rev());
                }
                out
            }
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MapUnitFile {
    pub id: String,
    pub class: String,
    pub demand: f64,
    #[serde(default)]
    pub prefixes: Vec<IpNet>,
    pub lat: f64,
    pub lon: f64,
    pub candidates: Vec<CandidateFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CandidateFile {
    pub cluster: String,
    pub score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_rank: Option<f64>,
}

impl MapUnitFile {
    /// The unit's candidates as the builder takes them (borrowing this file), in `out`
    /// (cleared first: one buffer serves a file's units).
    pub fn candidate_specs<'a>(&'a self, out: &mut Vec<CandidateSpec<'a>>) {
        out.clear();
        out.extend(self.candidates.iter().map(|c| CandidateSpec {
            cluster: &c.cluster,
            score: c.score,
            cluster_rank: c.cluster_rank,
        }));
    }

    /// The unit as the builder takes it, its candidates being `candidates`
    /// ([`Self::candidate_specs`]).
    pub fn spec<'a>(&'a self, candidates: &'a [CandidateSpec<'a>]) -> MapUnitSpec<'a> {
        MapUnitSpec {
            id: &self.id,
            class: &self.class,
            demand: self.demand,
            lat: self.lat,
            lon: self.lon,
            candidates,
        }
    }
}

impl ClusterFile {
    pub fn to_spec(&self) -> ClusterSpec {
        ClusterSpec {
            id: self.id.clone(),
            lat: self.lat,
            lon: self.lon,
            state: self.state,
            serves: self.classes.clone(),
            resources: self.resources.to_specs(),
        }
    }
}

impl InstanceFile {
    /// Validates and indexes the file's contents.
    pub fn build(&self, limits: Limits) -> Result<Topology, TopologyError> {
        let clusters = self
            .clusters
            .iter()
            .map(|c| (c.to_spec(), c.addresses.clone()))
            .collect();
        let mut b = TopologyBuilder::new(self.traffic_classes.clone(), clusters, limits)?;
        let total: usize = self.map_units.iter().map(|u| u.candidates.len()).sum();
        let prefixes: usize = self.map_units.iter().map(|u| u.prefixes.len()).sum();
        b.reserve(self.map_units.len(), total, prefixes);
        let mut cands = Vec::new();
        for u in &self.map_units {
            u.candidate_specs(&mut cands);
            b.push_unit(&u.spec(&cands), &u.prefixes)?;
        }
        b.finish()
    }
}

/// Parses and validates an instance file.
pub fn parse_instance(bytes: &[u8], limits: Limits) -> Result<Topology, FormatError> {
    let file: InstanceFile = serde_json::from_slice(bytes)?;
    Ok(file.build(limits)?)
}

/// The nested form of a validated cluster's tree.
fn nested(cluster: &cdnmap_mapper::model::Cluster, i: u32, instance: &Instance) -> NestedNode {
    let n = &cluster.nodes[i as usize];
    NestedNode {
        name: n.name.clone(),
        kind: n.kind,
        capacity: n.capacity,
        classes: n
            .classes
            .iter()
            .map(|&k| instance.classes()[usize::from(k)].name.clone())
            .collect(),
        children: n
            .children
            .iter()
            .map(|&c| nested(cluster, c, instance))
            .collect(),
    }
}

struct UnitsView<'a>(&'a Topology);
struct UnitView<'a>(&'a Topology, UnitIdx);

impl Serialize for UnitsView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = self.0.instance.unit_count();
        let mut seq = s.serialize_seq(Some(n))?;
        for u in 0..n as UnitIdx {
            seq.serialize_element(&UnitView(self.0, u))?;
        }
        seq.end()
    }
}

impl Serialize for UnitView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        unit_file(self.0, self.1).serialize(s)
    }
}

/// A validated cluster in the file form (its tree nested).
pub fn cluster_file(topology: &Topology, ci: cdnmap_mapper::model::ClusterIdx) -> ClusterFile {
    let instance = &topology.instance;
    let c = &instance.clusters()[ci as usize];
    ClusterFile {
        id: c.id.clone(),
        lat: c.lat,
        lon: c.lon,
        addresses: topology.cluster_addresses(ci).to_vec(),
        state: c.state,
        classes: None,
        resources: ResourcesFile::Nested(nested(c, 0, instance)),
    }
}

/// A validated map unit in the file form.
pub fn unit_file(topology: &Topology, u: UnitIdx) -> MapUnitFile {
    let instance = &topology.instance;
    let (lat, lon) = instance.unit_location(u);
    MapUnitFile {
        id: instance.unit_id(u).to_string(),
        class: instance.classes()[usize::from(instance.unit_class(u))]
            .name
            .clone(),
        demand: instance.unit_demand(u),
        prefixes: topology.unit_prefixes(u).to_vec(),
        lat,
        lon,
        candidates: instance
            .candidates(u)
            .map(|c| CandidateFile {
                cluster: instance.clusters()[c.cluster as usize].id.clone(),
                score: f64::from(c.score),
                cluster_rank: c.explicit_rank.then_some(f64::from(c.rank)),
            })
            .collect(),
    }
}

impl InstanceFile {
    /// The file form of a validated topology (to edit and build again).
    pub fn of(topology: &Topology) -> InstanceFile {
        let instance = &topology.instance;
        InstanceFile {
            traffic_classes: instance.classes().to_vec(),
            clusters: (0..instance.clusters().len() as cdnmap_mapper::model::ClusterIdx)
                .map(|c| cluster_file(topology, c))
                .collect(),
            map_units: (0..instance.unit_count() as UnitIdx)
                .map(|u| unit_file(topology, u))
                .collect(),
        }
    }
}

/// Writes `topology` in the instance file format, streaming the map units.
pub fn write_instance<W: Write>(topology: &Topology, w: W) -> Result<(), serde_json::Error> {
    let instance = &topology.instance;
    let clusters: Vec<ClusterFile> = (0..instance.clusters().len()
        as cdnmap_mapper::model::ClusterIdx)
        .map(|c| cluster_file(topology, c))
        .collect();
    let mut ser = serde_json::Serializer::new(w);
    let mut st = ser.serialize_struct("Instance", 3)?;
    st.serialize_field("traffic_classes", instance.classes())?;
    st.serialize_field("clusters", &clusters)?;
    st.serialize_field("map_units", &UnitsView(topology))?;
    SerializeStruct::end(st)
}

/// The assignment file, as serde sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssignmentFile {
    pub assignments: Vec<AssignmentEntry>,
    #[serde(default)]
    pub summary: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssignmentEntry {
    pub map_unit: String,
    pub allocations: Vec<AllocationEntry>,
    pub overflow: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllocationEntry {
    pub cluster: String,
    pub amount: f64,
}

struct AssignmentsView<'a>(&'a Instance, &'a Map);

impl Serialize for AssignmentsView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (inst, map) = (self.0, self.1);
        let mut seq = s.serialize_seq(Some(map.unit_count()))?;
        for u in 0..map.unit_count() as UnitIdx {
            seq.serialize_element(&AssignmentEntry {
                map_unit: inst.unit_id(u).to_string(),
                allocations: map
                    .allocations(u)
                    .iter()
                    .map(|a| AllocationEntry {
                        cluster: inst.clusters()[a.cluster as usize].id.clone(),
                        amount: a.amount,
                    })
                    .collect(),
                overflow: map.overflow(u),
            })?;
        }
        seq.end()
    }
}

/// Writes `map` in the assignment file format with `summary` beside it.
pub fn write_assignment<W: Write, T: Serialize>(
    instance: &Instance,
    map: &Map,
    summary: &T,
    w: W,
) -> Result<(), serde_json::Error> {
    let mut ser = serde_json::Serializer::new(w);
    let mut st = ser.serialize_struct("Assignment", 2)?;
    st.serialize_field("assignments", &AssignmentsView(instance, map))?;
    st.serialize_field("summary", summary)?;
    SerializeStruct::end(st)
}

/// Reads an assignment file against `instance`. Map units the file omits get no allocation and
/// no overflow (the verifier then reports their demand as lost); unknown ids are refused.
pub fn parse_assignment(bytes: &[u8], instance: &Instance) -> Result<Map, FormatError> {
    let file: AssignmentFile = serde_json::from_slice(bytes)?;
    let n = instance.unit_count();
    let mut per_unit: Vec<Option<&AssignmentEntry>> = vec![None; n];
    for e in &file.assignments {
        let u = instance
            .unit_index(&e.map_unit)
            .ok_or_else(|| ModelError::UnknownMapUnit {
                map_unit: e.map_unit.clone(),
            })?;
        if per_unit[u as usize].replace(e).is_some() {
            return Err(ModelError::DuplicateAssignment {
                map_unit: e.map_unit.clone(),
            }
            .into());
        }
    }
    let mut map = Map::with_capacity(n, n);
    for (u, entry) in per_unit.iter().enumerate() {
        let Some(e) = entry else {
            map.push_unit([], 0.0);
            continue;
        };
        let mut allocs = Vec::with_capacity(e.allocations.len());
        for a in &e.allocations {
            let cluster =
                instance
                    .cluster_index(&a.cluster)
                    .ok_or_else(|| ModelError::UnknownCluster {
                        map_unit: instance.unit_id(u as UnitIdx).to_string(),
                        cluster: a.cluster.clone(),
                    })?;
            allocs.push(Allocation {
                cluster,
                amount: a.amount,
            });
        }
        map.push_unit(allocs, e.overflow);
    }
    Ok(map)
}
