//! The JSON instance and assignment file formats (documented in `docs/formats.md`).
//!
//! Parsing goes JSON → plain serde structs → [`TopologyBuilder`], so every semantic check lives in
//! one place (the model, and the addressing's limits). A key not named here is refused (every
//! struct of the formats denies unknown fields), so a typo (`"stat": "down"`) is an error, not
//! a default silently taken; an error says where: line, column, and the item it is in
//! (`12:9: cluster "fra1": unknown field `stat`, expected one of ...`).
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
    /// Not JSON, or JSON that is not the format (a missing or unknown key, a wrong type):
    /// where (1-based line and column; 0 when serde does not know), in which part of the file
    /// (`cluster "fra1"`, `map unit "u1"`, `traffic_classes[2]`...; empty at the top level),
    /// and serde's message (`unknown field `stat`, expected one of ...`). Shown as
    /// `12:9: cluster "fra1": unknown field ...`; the command line puts the file name before it.
    #[error("{line}:{column}: {at}{message}")]
    Json {
        line: usize,
        column: usize,
        at: String,
        message: String,
    },
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

/// The most characters of serde's message (or of the path to the error) an error repeats:
/// an unknown key is shown whole up to this, so a key of a megabyte is not.
const MAX_SHOWN_CHARS: usize = 512;

/// `text`, cut to [`MAX_SHOWN_CHARS`] characters (with `…` when cut).
fn shown(text: &str) -> String {
    if text.chars().count() <= MAX_SHOWN_CHARS {
        return text.to_string();
    }
    let mut out: String = text.chars().take(MAX_SHOWN_CHARS).collect();
    out.push('…');
    out
}

/// The ids of the lists of an instance or assignment file, read leniently (every other key
/// ignored, an id that is not a string left out), to name the item an error is in.
#[derive(Deserialize)]
struct Ids {
    #[serde(default)]
    traffic_classes: Vec<Id>,
    #[serde(default)]
    clusters: Vec<Id>,
    #[serde(default)]
    map_units: Vec<Id>,
    #[serde(default)]
    assignments: Vec<Id>,
}

#[derive(Deserialize)]
struct Id {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    name: Option<serde_json::Value>,
    #[serde(default)]
    map_unit: Option<serde_json::Value>,
}

/// Which key of an [`Id`] is the item's id.
type IdKey = fn(&Id) -> &Option<serde_json::Value>;

impl Ids {
    /// How an error at `list[index]` names the item: `cluster "fra1"`, or `clusters[3]` when
    /// the item has no string id.
    fn name(&self, list: &str, index: usize) -> Option<String> {
        let (items, what, key): (&[Id], _, IdKey) = match list {
            "traffic_classes" => (&self.traffic_classes, "traffic class", |i| &i.name),
            "clusters" => (&self.clusters, "cluster", |i| &i.id),
            "map_units" => (&self.map_units, "map unit", |i| &i.id),
            "assignments" => (&self.assignments, "assignment of map unit", |i| &i.map_unit),
            _ => return None,
        };
        match key(items.get(index)?) {
            Some(serde_json::Value::String(id)) => {
                Some(format!("{what} {}", cdnmap_mapper::model::shown_id(id)))
            }
            _ => None,
        }
    }
}

/// Parses `bytes` as a `T` of the instance or assignment formats; an error says where (line
/// and column) and in which item of which list (module docs, [`FormatError::Json`]).
fn parse_json<T: de::DeserializeOwned>(bytes: &[u8]) -> Result<T, FormatError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let segments: Vec<_> = e.path().iter().collect();
        json_error(bytes, &segments, e.inner())
    })?;
    // Nothing but white space after the value.
    de.end().map_err(|e| json_error(bytes, &[], &e))?;
    Ok(value)
}

/// A serde error at a path (`segments`) of the file as a [`FormatError::Json`].
fn json_error(
    bytes: &[u8],
    segments: &[&serde_path_to_error::Segment],
    inner: &serde_json::Error,
) -> FormatError {
    use serde_path_to_error::Segment;
    let (line, column) = (inner.line(), inner.column());
    let mut message = inner.to_string();
    // serde_json's message ends with where it is, which the error shows first.
    let suffix = format!(" at line {line} column {column}");
    if let Some(cut) = message.strip_suffix(&suffix) {
        message = cut.to_string();
    }
    // The item of a top-level list the error is in, by its id when it has one.
    let mut at = String::new();
    let mut rest = segments;
    if let [Segment::Map { key }, Segment::Seq { index }, tail @ ..] = segments {
        let named = serde_json::from_slice::<Ids>(bytes)
            .ok()
            .and_then(|ids| ids.name(key, *index));
        at = named.unwrap_or_else(|| format!("{}[{index}]", shown(key)));
        rest = tail;
    }
    // Below the item (or the top level): the path to the value that is wrong. An unknown key
    // is the path's last segment, which the message names: the path shown stops before it.
    if message.starts_with("unknown field") {
        if let [head @ .., Segment::Map { .. }] = rest {
            rest = head;
        }
    }
    let inside: Vec<String> = rest
        .iter()
        .filter(|s| !matches!(s, Segment::Unknown))
        .map(|s| match s {
            Segment::Seq { index } => format!("[{index}]"),
            Segment::Map { key } => format!(".{key}"),
            Segment::Enum { variant } => format!(".{variant}"),
            Segment::Unknown => String::new(),
        })
        .collect();
    let inside = inside.concat();
    let inside = inside.strip_prefix('.').unwrap_or(&inside);
    if !inside.is_empty() {
        if !at.is_empty() {
            at.push_str(", ");
        }
        at.push_str(&shown(inside));
    }
    if !at.is_empty() {
        at.push_str(": ");
    }
    FormatError::Json {
        line,
        column,
        at,
        message: shown(&message),
    }
}

/// The instance file, as serde sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceFile {
    pub traffic_classes: Vec<TrafficClass>,
    pub clusters: Vec<ClusterFile>,
    pub map_units: Vec<MapUnitFile>,
    /// The operator's policy (issue 46): cost with a latency guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<cdnmap_mapper::model::PolicySpec>,
}

/// `topology`'s policy in its file form (`None`: none).
pub fn policy_file(topology: &Topology) -> Option<cdnmap_mapper::model::PolicySpec> {
    let instance = &topology.instance;
    let spec = instance.policy().spec(&instance.cluster_ids());
    (spec != cdnmap_mapper::model::PolicySpec::default()).then_some(spec)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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

    /// Every resource node's capacity, in the file's order (pre-order for a nested tree).
    pub fn capacities(&self) -> Vec<f64> {
        fn walk(n: &NestedNode, out: &mut Vec<f64>) {
            out.push(n.capacity);
            for c in &n.children {
                walk(c, out);
            }
        }
        let mut out = Vec::new();
        match &self.resources {
            ResourcesFile::Nested(n) => walk(n, &mut out),
            ResourcesFile::Flat(v) => out.extend(v.iter().map(|n| n.capacity)),
        }
        out
    }

    /// This cluster with every resource node's capacity times `scale` (a ramp's step: the
    /// tree, classes and addresses as they are).
    pub fn scaled(&self, scale: f64) -> ClusterFile {
        fn walk(n: &mut NestedNode, scale: f64) {
            n.capacity *= scale;
            for c in &mut n.children {
                walk(c, scale);
            }
        }
        let mut out = self.clone();
        match &mut out.resources {
            ResourcesFile::Nested(n) => walk(n, scale),
            ResourcesFile::Flat(v) => v.iter_mut().for_each(|n| n.capacity *= scale),
        }
        out
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
        if let Some(policy) = &self.policy {
            b.set_policy(policy)?;
        }
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
    let file: InstanceFile = parse_json(bytes)?;
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
            policy: policy_file(topology),
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
    let mut st = ser.serialize_struct("Instance", 4)?;
    st.serialize_field("traffic_classes", instance.classes())?;
    st.serialize_field("clusters", &clusters)?;
    st.serialize_field("map_units", &UnitsView(topology))?;
    if let Some(policy) = policy_file(topology) {
        st.serialize_field("policy", &policy)?;
    }
    SerializeStruct::end(st)
}

/// The assignment file, as serde sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignmentFile {
    pub assignments: Vec<AssignmentEntry>,
    #[serde(default)]
    pub summary: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignmentEntry {
    pub map_unit: String,
    /// Where the allocation placed the unit, by preference.
    pub allocations: Vec<AllocationEntry>,
    pub overflow: f64,
    /// Its companion (go with the winner): the cluster its answers name second, and the
    /// demand reserved there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub companion: Option<AllocationEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
            let entry = |a: &Allocation| AllocationEntry {
                cluster: inst.clusters()[a.cluster as usize].id.clone(),
                amount: a.amount,
            };
            seq.serialize_element(&AssignmentEntry {
                map_unit: inst.unit_id(u).to_string(),
                allocations: map.placed(u).iter().map(entry).collect(),
                overflow: map.overflow(u),
                companion: map.companion(u).as_ref().map(entry),
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
    Ok(parse_assignment_with_summary(bytes, instance)?.0)
}

/// [`parse_assignment`], with the file's `summary` (`null` when it has none): what the
/// solve that wrote it reported (its `churn` and `seeded` tell a sticky round's map).
pub fn parse_assignment_with_summary(
    bytes: &[u8],
    instance: &Instance,
) -> Result<(Map, serde_json::Value), FormatError> {
    let file: AssignmentFile = parse_json(bytes)?;
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
        let allocation = |a: &AllocationEntry| {
            let cluster =
                instance
                    .cluster_index(&a.cluster)
                    .ok_or_else(|| ModelError::UnknownCluster {
                        map_unit: instance.unit_id(u as UnitIdx).to_string(),
                        cluster: a.cluster.clone(),
                    })?;
            Ok::<_, ModelError>(Allocation {
                cluster,
                amount: a.amount,
            })
        };
        let allocs = e
            .allocations
            .iter()
            .map(allocation)
            .collect::<Result<Vec<_>, _>>()?;
        let companion = e.companion.as_ref().map(allocation).transpose()?;
        map.push_unit_with(allocs, companion, e.overflow);
    }
    Ok((map, file.summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../docs/example-instance.json");

    /// The error of `text` as an instance file, as shown.
    fn instance_error(text: &str) -> String {
        match parse_instance(text.as_bytes(), Limits::default()) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    /// `EXAMPLE` with `from` (which must occur once) replaced by `to`.
    fn edited(from: &str, to: &str) -> String {
        assert_eq!(EXAMPLE.matches(from).count(), 1, "{from}");
        EXAMPLE.replacen(from, to, 1)
    }

    /// Line and column (1-based, the column just after the key) of `needle`'s end in `text`.
    fn position(text: &str, needle: &str) -> (usize, usize) {
        let at = text.find(needle).expect("needle") + needle.len();
        let before = &text[..at];
        let line = before.matches('\n').count() + 1;
        let column = at - before.rfind('\n').map_or(0, |n| n + 1);
        (line, column)
    }

    #[test]
    fn the_example_parses() {
        parse_instance(EXAMPLE.as_bytes(), Limits::default()).expect("the example parses");
    }

    /// An unknown key anywhere in an instance is refused with its line, column, the item it
    /// is in and the key.
    #[test]
    fn unknown_keys_are_refused_with_where_and_what() {
        // (what is edited, into what, the unknown key, the item, what the message expects)
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "\"state\": \"up\"",
                "\"stat\": \"down\"",
                "cluster \"fra-1\"",
                "unknown field `stat`, expected one of `id`, `lat`, `lon`, `addresses`, `state`, `classes`, `resources`",
            ),
            (
                "\"name\": \"video\",\n      \"priority\": 1",
                "\"name\": \"video\",\n      \"priorty\": 1",
                "traffic class \"video\"",
                "unknown field `priorty`",
            ),
            (
                "\"bps\": 1.0",
                "\"bpz\": 1.0",
                "traffic class \"video\", per_unit",
                "unknown field `bpz`, expected `bps` or `fps`",
            ),
            (
                "\"capacity\": 26.5",
                "\"capacity\": 26.5, \"kapacity\": 1",
                "cluster \"fra-1\", resources",
                "unknown field `kapacity`",
            ),
        ];
        for (from, to, item, expected) in cases {
            let text = edited(from, to);
            let key = expected
                .split('`')
                .nth(1)
                .expect("the message names the key");
            let (line, column) = position(&text, &format!("\"{key}\""));
            let error = instance_error(&text);
            let head = format!("{line}:{column}: {item}: {expected}");
            assert!(error.starts_with(&head), "{error}\nexpected {head}...");
        }
    }

    /// Map units, their candidates and flat resource nodes refuse unknown keys too; an item
    /// without a string id is named by its list and index.
    #[test]
    fn unknown_keys_in_units_candidates_and_flat_nodes() {
        let mut v: serde_json::Value = serde_json::from_str(EXAMPLE).expect("JSON");
        let unit = v["map_units"][0]["id"].as_str().expect("id").to_string();
        v["map_units"][0]["demnd"] = 1.into();
        let error = instance_error(&v.to_string());
        assert!(
            error.contains(&format!(": map unit {unit:?}: unknown field `demnd`")),
            "{error}"
        );

        let mut v: serde_json::Value = serde_json::from_str(EXAMPLE).expect("JSON");
        v["map_units"][0]["candidates"][0]["rank"] = 1.into();
        let error = instance_error(&v.to_string());
        assert!(
            error.contains(&format!(
                ": map unit {unit:?}, candidates[0]: unknown field `rank`"
            )),
            "{error}"
        );

        let mut v: serde_json::Value = serde_json::from_str(EXAMPLE).expect("JSON");
        v["clusters"][1]["resources"][0]["child"] = serde_json::json!([]);
        let error = instance_error(&v.to_string());
        assert!(
            error.contains(": cluster \"ams-1\", resources[0]: unknown field `child`"),
            "{error}"
        );

        let mut v: serde_json::Value = serde_json::from_str(EXAMPLE).expect("JSON");
        v["clusters"][1]["id"] = 7.into();
        v["clusters"][1]["x"] = 7.into();
        let error = instance_error(&v.to_string());
        assert!(error.contains(": clusters[1], id: invalid type"), "{error}");

        let text = EXAMPLE.replacen('{', "{\"comment\": \"hello\",", 1);
        let (line, column) = position(&text, "\"comment\"");
        let error = instance_error(&text);
        let want = format!("{line}:{column}: unknown field `comment`, expected one of");
        assert!(error.starts_with(&want), "{error}");
    }

    /// A value of the wrong type names the key it is the value of.
    #[test]
    fn a_wrong_value_names_its_key() {
        let text = edited("\"capacity\": 26.5", "\"capacity\": \"lots\"");
        let error = instance_error(&text);
        assert!(
            error
                .contains(": cluster \"fra-1\", resources.capacity: invalid type: string \"lots\""),
            "{error}"
        );
    }

    /// A companion (go with the winner) is written apart from the unit's placements, read
    /// back as one, and a class's companion share is kept by the instance file.
    #[test]
    fn companions_and_their_share_survive_the_files() {
        let text = EXAMPLE.replacen(
            "\"name\": \"video\",",
            "\"name\": \"video\", \"companion_share\": 0.25,",
            1,
        );
        let topology = parse_instance(text.as_bytes(), Limits::default()).expect("valid");
        let inst = &topology.instance;
        let video = inst.class_index("video").expect("video");
        assert_eq!(inst.classes()[usize::from(video)].companion_share, 0.25);
        let mut again = Vec::new();
        write_instance(&topology, &mut again).expect("written");
        let back = parse_instance(&again, Limits::default()).expect("valid");
        assert_eq!(back.instance, topology.instance);

        let u = inst.unit_index("u00000001-video").expect("unit");
        let (fra, ams) = (
            inst.cluster_index("fra-1").expect("fra-1"),
            inst.cluster_index("ams-1").expect("ams-1"),
        );
        let mut map = Map::with_capacity(inst.unit_count(), 3);
        for v in 0..inst.unit_count() as UnitIdx {
            let a = |cluster, amount| Allocation { cluster, amount };
            match v == u {
                true => map.push_unit_with([a(fra, 15.0)], Some(a(ams, 5.0)), 0.0),
                false => map.push_unit([], inst.unit_demand(v)),
            }
        }
        let mut file = Vec::new();
        write_assignment(inst, &map, &serde_json::Value::Null, &mut file).expect("written");
        let text = String::from_utf8(file).expect("UTF-8");
        assert!(
            text.contains("\"companion\":{\"cluster\":\"ams-1\",\"amount\":5.0}"),
            "{text}"
        );
        assert_eq!(parse_assignment(text.as_bytes(), inst).expect("valid"), map);
    }

    /// Assignment files refuse unknown keys as instance files do.
    #[test]
    fn assignments_refuse_unknown_keys() {
        let topology = parse_instance(EXAMPLE.as_bytes(), Limits::default()).expect("valid");
        let unit = topology.instance.unit_id(0).to_string();
        let cluster = topology.instance.clusters()[0].id.clone();
        let ok = serde_json::json!({"assignments": [
            {"map_unit": unit, "allocations": [{"cluster": cluster, "amount": 0.0}], "overflow": 0.0}
        ]});
        parse_assignment(ok.to_string().as_bytes(), &topology.instance).expect("valid");
        for (edit, key) in [
            ("/assignments/0", "overflw"),
            ("/assignments/0/allocations/0", "amont"),
            ("", "summry"),
        ] {
            let mut v = ok.clone();
            v.pointer_mut(edit).expect("pointer")[key] = 1.into();
            let error = match parse_assignment(v.to_string().as_bytes(), &topology.instance) {
                Ok(_) => panic!("accepted {key}"),
                Err(e) => e.to_string(),
            };
            assert!(error.contains(&format!("unknown field `{key}`")), "{error}");
            if !edit.is_empty() {
                assert!(
                    error.contains(&format!("assignment of map unit {unit:?}")),
                    "{error}"
                );
            }
        }
    }

    /// An unknown key of a megabyte is shown cut.
    #[test]
    fn a_long_key_is_cut() {
        let key = "k".repeat(1 << 20);
        let error = instance_error(&format!("{{\"{key}\": 1}}"));
        assert!(error.len() < 2 * MAX_SHOWN_CHARS, "{} bytes", error.len());
    }
}
