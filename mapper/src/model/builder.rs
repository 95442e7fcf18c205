//! The builder: the only way to an [`Instance`] but deriving one from another. Classes and
//! clusters first, then map units one at a time, each validated as it is pushed.
//!
//! Promises: an input refused leaves the builder as it was; `finish` gives map units in id
//! order (no duplicate id), clusters in id order, each unit's candidates in its preference
//! order `(score, cluster id)`, each unit's head written with its candidates, and the demand
//! column apart from the other unit columns.

use std::collections::HashMap;
use std::sync::Arc;

use super::columns::{CandidateColumns, MapUnits, NO_RANK};
use super::instance::Instance;
use super::limits::{
    check_companion_share, check_f32, check_id, check_location, check_number, too_many, ClassIdx,
    ClusterIdx, Limits, MAX_CANDIDATES_CEILING, MAX_CLASSES, MAX_CLUSTERS, MAX_MAP_UNITS,
};
use super::topology::{build_cluster, Cluster, ClusterSpec, Topology, TrafficClass};
use crate::error::ModelError;

/// A candidate as given in input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CandidateSpec<'a> {
    pub cluster: &'a str,
    pub score: f64,
    pub cluster_rank: Option<f64>,
}

/// A map unit as given in input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MapUnitSpec<'a> {
    pub id: &'a str,
    pub class: &'a str,
    pub demand: f64,
    pub lat: f64,
    pub lon: f64,
    pub candidates: &'a [CandidateSpec<'a>],
}

/// A candidate by the builder's cluster index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexedCandidate {
    pub cluster: ClusterIdx,
    pub score: f64,
    pub cluster_rank: Option<f64>,
}

/// A map unit whose class and candidates are given by the builder's indices
/// ([`InstanceBuilder::push_unit_indexed`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexedUnitSpec<'a> {
    pub id: &'a str,
    pub class: ClassIdx,
    pub demand: f64,
    pub lat: f64,
    pub lon: f64,
    pub candidates: &'a [IndexedCandidate],
}

/// What [`InstanceBuilder`] needs of a unit, however it names its class and clusters: the one
/// validation serves both ([`MapUnitSpec`] by name, [`IndexedUnitSpec`] by index).
trait UnitInput {
    fn id(&self) -> &str;
    /// (demand, latitude, longitude)
    fn numbers(&self) -> (f64, f64, f64);
    fn class(&self, b: &InstanceBuilder) -> Result<ClassIdx, ModelError>;
    fn candidate_count(&self) -> usize;
    /// Candidate `i`: (cluster index, score, explicit rank).
    fn candidate(
        &self,
        i: usize,
        b: &InstanceBuilder,
    ) -> Result<(ClusterIdx, f64, Option<f64>), ModelError>;
}

impl UnitInput for MapUnitSpec<'_> {
    fn id(&self) -> &str {
        self.id
    }
    fn numbers(&self) -> (f64, f64, f64) {
        (self.demand, self.lat, self.lon)
    }
    fn class(&self, b: &InstanceBuilder) -> Result<ClassIdx, ModelError> {
        b.class_by_name
            .get(self.class)
            .copied()
            .ok_or_else(|| ModelError::UnknownClass {
                subject: format!("map unit {:?}", self.id),
                class: self.class.to_string(),
            })
    }
    fn candidate_count(&self) -> usize {
        self.candidates.len()
    }
    fn candidate(
        &self,
        i: usize,
        b: &InstanceBuilder,
    ) -> Result<(ClusterIdx, f64, Option<f64>), ModelError> {
        let cand = &self.candidates[i];
        let c = *b
            .cluster_by_id
            .get(cand.cluster)
            .ok_or_else(|| ModelError::UnknownCluster {
                map_unit: self.id.to_string(),
                cluster: cand.cluster.to_string(),
            })?;
        Ok((c, cand.score, cand.cluster_rank))
    }
}

impl UnitInput for IndexedUnitSpec<'_> {
    fn id(&self) -> &str {
        self.id
    }
    fn numbers(&self) -> (f64, f64, f64) {
        (self.demand, self.lat, self.lon)
    }
    fn class(&self, b: &InstanceBuilder) -> Result<ClassIdx, ModelError> {
        if usize::from(self.class) < b.classes.len() {
            Ok(self.class)
        } else {
            Err(ModelError::UnknownClass {
                subject: format!("map unit {:?}", self.id),
                class: format!("#{}", self.class),
            })
        }
    }
    fn candidate_count(&self) -> usize {
        self.candidates.len()
    }
    fn candidate(
        &self,
        i: usize,
        b: &InstanceBuilder,
    ) -> Result<(ClusterIdx, f64, Option<f64>), ModelError> {
        let cand = &self.candidates[i];
        if (cand.cluster as usize) < b.clusters.len() {
            Ok((cand.cluster, cand.score, cand.cluster_rank))
        } else {
            Err(ModelError::UnknownCluster {
                map_unit: self.id.to_string(),
                cluster: format!("#{}", cand.cluster),
            })
        }
    }
}

/// Builds an [`Instance`], validating as it goes. Classes and clusters come first (so candidates
/// can be resolved by cluster id); map units are then pushed one at a time, so a generator or a
/// streaming parser never needs a second copy of them.
#[derive(Debug)]
pub struct InstanceBuilder {
    limits: Limits,
    classes: Vec<TrafficClass>,
    clusters: Vec<Cluster>,
    node_offset: Vec<u32>,
    class_by_name: HashMap<String, ClassIdx>,
    cluster_by_id: HashMap<String, ClusterIdx>,
    units: MapUnits,
    cands: CandidateColumns,
    /// Per cluster, the `push_unit` call that last named it as a candidate: finds duplicates.
    seen_stamp: Vec<u32>,
    /// Counts `push_unit` calls (refused ones too, so their marks never match a later call).
    stamp: u32,
    scratch: Vec<(f32, ClusterIdx, f32)>,
    policy: super::policy::Policy,
}

impl InstanceBuilder {
    /// Validates the classes and clusters.
    pub fn new(
        classes: Vec<TrafficClass>,
        clusters: Vec<ClusterSpec>,
        limits: Limits,
    ) -> Result<Self, ModelError> {
        too_many(
            || "limits".into(),
            "candidates per map unit allowed",
            limits.max_candidates,
            MAX_CANDIDATES_CEILING,
        )?;
        too_many(
            || "instance".into(),
            "traffic classes",
            classes.len(),
            MAX_CLASSES,
        )?;
        too_many(
            || "instance".into(),
            "clusters",
            clusters.len(),
            MAX_CLUSTERS,
        )?;
        let mut class_by_name = HashMap::with_capacity(classes.len());
        for (i, class) in classes.iter().enumerate() {
            check_id("traffic class", &class.name, String::new)?;
            let subject = || format!("traffic class {:?}", class.name);
            check_number(subject, "per_unit.bps", class.per_unit.bps)?;
            check_number(subject, "per_unit.fps", class.per_unit.fps)?;
            check_companion_share(subject, class.companion_share)?;
            if class_by_name
                .insert(class.name.clone(), i as ClassIdx)
                .is_some()
            {
                return Err(ModelError::DuplicateId {
                    what: "traffic class",
                    id: class.name.clone(),
                    context: String::new(),
                });
            }
        }
        let mut clusters: Vec<Cluster> = clusters
            .into_iter()
            .map(|spec| build_cluster(spec, &class_by_name))
            .collect::<Result<_, _>>()?;
        clusters.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(w) = clusters.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(ModelError::DuplicateId {
                what: "cluster",
                id: w[0].id.clone(),
                context: String::new(),
            });
        }
        let cluster_by_id = clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), i as ClusterIdx))
            .collect();
        let mut node_offset = Vec::with_capacity(clusters.len() + 1);
        let mut total = 0u32;
        for c in &clusters {
            node_offset.push(total);
            total += c.nodes.len() as u32;
        }
        node_offset.push(total);
        let mut units = MapUnits::default();
        units.cand_start.push(0);
        Ok(InstanceBuilder {
            limits,
            seen_stamp: vec![0; clusters.len()],
            stamp: 0,
            classes,
            clusters,
            node_offset,
            class_by_name,
            cluster_by_id,
            units,
            cands: CandidateColumns::default(),
            scratch: Vec::new(),
            policy: super::policy::Policy::default(),
        })
    }

    /// Sets the operator's policy (validated against the clusters: [`super::Policy::of`]).
    pub fn set_policy(&mut self, spec: &super::policy::PolicySpec) -> Result<(), ModelError> {
        let ids: Vec<&str> = self.clusters.iter().map(|c| c.id.as_str()).collect();
        self.policy = super::policy::Policy::of(spec, &ids)?;
        Ok(())
    }

    /// A builder of units for `topology`'s classes and clusters, which were validated when it
    /// was built (they are not checked again): how an instance's units are edited
    /// ([`Instance::with_units_edited`]), each new unit validated as any other.
    pub(super) fn on(topology: &Topology, limits: Limits) -> InstanceBuilder {
        let mut units = MapUnits::default();
        units.cand_start.push(0);
        InstanceBuilder {
            limits,
            seen_stamp: vec![0; topology.clusters.len()],
            stamp: 0,
            classes: topology.classes.clone(),
            clusters: topology.clusters.clone(),
            node_offset: topology.node_offset.clone(),
            class_by_name: topology.class_by_name.clone(),
            cluster_by_id: topology.cluster_by_id.clone(),
            units,
            cands: CandidateColumns::default(),
            scratch: Vec::new(),
            policy: topology.policy.clone(),
        }
    }

    /// Reserves room for `units` more map units with `candidates` candidates in all.
    pub fn reserve(&mut self, units: usize, candidates: usize) {
        let u = &mut self.units;
        u.ids.reserve_exact(units, 0);
        u.class.reserve_exact(units);
        u.building_demand.reserve_exact(units);
        u.lat.reserve_exact(units);
        u.lon.reserve_exact(units);
        u.cand_start.reserve_exact(units);
        self.cands.cluster.reserve_exact(candidates);
        self.cands.score.reserve_exact(candidates);
        self.cands.head.reserve_exact(units);
    }

    pub fn cluster_index(&self, id: &str) -> Option<ClusterIdx> {
        self.cluster_by_id.get(id).copied()
    }

    /// Validates one map unit and appends it. On error nothing is appended.
    pub fn push_unit(&mut self, spec: &MapUnitSpec<'_>) -> Result<(), ModelError> {
        self.push(spec)
    }

    /// [`Self::push_unit`] for a unit whose class and candidates' clusters are given by this
    /// builder's indices ([`Self::class_index`], [`Self::cluster_index`]): how a compact
    /// topology is decoded, without looking a name up per candidate (176 M lookups at 11 M
    /// map units). Validated alike; an index out of range is refused naming it.
    pub fn push_unit_indexed(&mut self, spec: &IndexedUnitSpec<'_>) -> Result<(), ModelError> {
        self.push(spec)
    }

    /// The index of traffic class `name`.
    pub fn class_index(&self, name: &str) -> Option<ClassIdx> {
        self.class_by_name.get(name).copied()
    }

    fn push(&mut self, spec: &impl UnitInput) -> Result<(), ModelError> {
        let id = spec.id();
        check_id("map unit", id, || {
            format!(" (map unit #{})", self.units.ids.len())
        })?;
        let unit_index = self.units.ids.len();
        too_many(
            || "instance".into(),
            "map units",
            unit_index + 1,
            MAX_MAP_UNITS,
        )?;
        if !self.units.ids.fits(id) {
            return Err(ModelError::TooMany {
                subject: "instance".into(),
                what: "bytes of map unit ids",
                count: self.units.ids.text_len().saturating_add(id.len()),
                limit: u32::MAX as usize,
            });
        }
        let subject = || format!("map unit {id:?}");
        let class = spec.class(self)?;
        let (demand, lat, lon) = spec.numbers();
        check_number(subject, "demand", demand)?;
        check_location(subject, lat, lon)?;
        too_many(
            subject,
            "candidates",
            spec.candidate_count(),
            self.limits.max_candidates,
        )?;
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.seen_stamp.fill(0);
            self.stamp = 1;
        }
        let stamp = self.stamp;
        self.scratch.clear();
        let mut any_rank = false;
        for i in 0..spec.candidate_count() {
            let (c, score, cluster_rank) = spec.candidate(i, self)?;
            let cluster = || self.clusters[c as usize].id.clone();
            if self.seen_stamp[c as usize] == stamp {
                return Err(ModelError::DuplicateCandidate {
                    map_unit: id.to_string(),
                    cluster: cluster(),
                });
            }
            if !self.clusters[c as usize].serves(class) {
                return Err(ModelError::ClassNotServed {
                    map_unit: id.to_string(),
                    cluster: cluster(),
                    class: self.classes[usize::from(class)].name.clone(),
                });
            }
            let cand_subject = || format!("map unit {id:?}: candidate {:?}", cluster());
            let score = check_f32(cand_subject, "score", score)?;
            let rank = match cluster_rank {
                Some(r) => {
                    any_rank = true;
                    check_f32(cand_subject, "cluster_rank", r)?
                }
                None => NO_RANK,
            };
            self.seen_stamp[c as usize] = stamp;
            self.scratch.push((score, c, rank));
        }
        // A map unit prefers lower score; ties broken by cluster id (= cluster index).
        self.scratch
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));

        let u = &mut self.units;
        let cands = &mut self.cands;
        if any_rank && cands.rank.is_none() {
            let mut ranks = Vec::with_capacity(cands.cluster.capacity());
            ranks.resize(cands.cluster.len(), NO_RANK);
            cands.rank = Some(ranks);
        }
        let start = cands.cluster.len();
        for &(score, c, rank) in &self.scratch {
            cands.cluster.push(c);
            cands.score.push(score);
            if let Some(ranks) = cands.rank.as_mut() {
                ranks.push(rank);
            }
        }
        cands.push_head(start);
        u.cand_start.push(cands.cluster.len() as u32);
        // Checked with the unit's other limits, before anything was appended.
        let _fits = u.ids.push(id);
        u.class.push(class);
        u.building_demand.push(demand + 0.0);
        u.lat.push(lat as f32);
        u.lon.push(lon as f32);
        Ok(())
    }

    /// Sorts the map units by id (a no-op when they came sorted) and refuses duplicates.
    pub fn finish(self) -> Result<Instance, ModelError> {
        self.finish_with_order().map(|(instance, _)| instance)
    }

    /// [`Self::finish`], and the order the units were sorted into: `order[u]` is the push
    /// (0 for the first `push_unit` that was accepted) that became unit `u`; `None` when they
    /// came in id order. What lets a caller keep columns of its own beside the instance's.
    pub fn finish_with_order(self) -> Result<(Instance, Option<Vec<u32>>), ModelError> {
        let (mut units, mut cands) = (self.units, self.cands);
        let ids = &units.ids;
        let sorted = (1..ids.len()).all(|i| ids.get(i - 1) <= ids.get(i));
        let mut order = None;
        if !sorted {
            let by_id;
            (units, cands, by_id) = sort_units(units, cands);
            order = Some(by_id);
        }
        let ids = &units.ids;
        if let Some(i) = (1..ids.len()).find(|&i| ids.get(i - 1) == ids.get(i)) {
            return Err(ModelError::DuplicateId {
                what: "map unit",
                id: ids.get(i).to_string(),
                context: String::new(),
            });
        }
        // The demand column lives apart in an instance (`Instance::demand`).
        let demand = Arc::new(std::mem::take(&mut units.building_demand));
        let instance = Instance {
            topology: Arc::new(Topology {
                classes: self.classes,
                clusters: self.clusters,
                node_offset: self.node_offset,
                class_by_name: self.class_by_name,
                cluster_by_id: self.cluster_by_id,
                policy: self.policy,
            }),
            units: Arc::new(units),
            demand,
            cands: Arc::new(cands),
            favour: None,
        };
        Ok((instance, order))
    }
}

/// Reorders the columns of `units` into id order; also returns the order (old index by new).
fn sort_units(units: MapUnits, cands: CandidateColumns) -> (MapUnits, CandidateColumns, Vec<u32>) {
    let n = units.ids.len();
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by(|&a, &b| units.ids.get(a as usize).cmp(units.ids.get(b as usize)));
    let mut out = MapUnits::default();
    out.ids.reserve_exact(n, units.ids.heap_bytes());
    let mut out_cands = CandidateColumns {
        rank: cands
            .rank
            .as_ref()
            .map(|_| Vec::with_capacity(cands.cluster.len())),
        ..CandidateColumns::default()
    };
    out.cand_start.push(0);
    for &i in &order {
        let i = i as usize;
        let (c0, c1) = (
            units.cand_start[i] as usize,
            units.cand_start[i + 1] as usize,
        );
        out_cands.head.push(cands.head[i]);
        out_cands.cluster.extend_from_slice(&cands.cluster[c0..c1]);
        out_cands.score.extend_from_slice(&cands.score[c0..c1]);
        if let (Some(dst), Some(src)) = (out_cands.rank.as_mut(), cands.rank.as_ref()) {
            dst.extend_from_slice(&src[c0..c1]);
        }
        out.cand_start.push(out_cands.cluster.len() as u32);
        // Never past u32::MAX bytes: the same names as the columns being sorted.
        out.ids.push(units.ids.get(i));
        out.class.push(units.class[i]);
        out.building_demand.push(units.building_demand[i]);
        out.lat.push(units.lat[i]);
        out.lon.push(units.lon[i]);
    }
    (out, out_cands, order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::UnitIdx;
    use crate::testing::{parse_instance, random_candidates};
    use rand::SeedableRng;

    /// Units pushed by index build the same instance as by name, and an index out of range,
    /// or a duplicate, is refused as by name, naming the unit.
    #[test]
    fn units_by_index_build_what_units_by_name_build() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let clusters: Vec<String> = (0..12)
            .map(|c| {
                format!(
                    r#"{{"id": "c{c:02}", "lat": 0, "lon": 0, "resources": {{"name": "r", "kind": "bps",
                       "capacity": 10, "classes": ["web", "video"]}}}}"#
                )
            })
            .collect();
        let units: Vec<String> = (0..200)
            .map(|u| {
                format!(
                    r#"{{"id": "u{u:03}", "class": "{}", "demand": {}, "lat": 1, "lon": 2,
                        "candidates": [{}]}}"#,
                    ["web", "video"][u % 2],
                    u % 9,
                    random_candidates(&mut rng, 12, 1 + u % 8, 0.1)
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [
                {{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 0}}}},
                {{"name": "video", "priority": 1, "per_unit": {{"bps": 1, "fps": 0}}}}],
              "clusters": [{}], "map_units": [{}]}}"#,
            clusters.join(","),
            units.join(",")
        );
        let by_name = parse_instance(json.as_bytes(), Limits::default()).expect("valid");
        let mut b = InstanceBuilder::on(&by_name.topology, Limits::default());
        let indexed = |u: UnitIdx| -> Vec<IndexedCandidate> {
            by_name
                .candidates(u)
                .map(|c| IndexedCandidate {
                    cluster: c.cluster,
                    score: f64::from(c.score),
                    cluster_rank: c.explicit_rank.then_some(f64::from(c.rank)),
                })
                .collect()
        };
        for u in 0..by_name.unit_count() as UnitIdx {
            let cands = indexed(u);
            let (lat, lon) = by_name.unit_location(u);
            b.push_unit_indexed(&IndexedUnitSpec {
                id: by_name.unit_id(u),
                class: by_name.unit_class(u),
                demand: by_name.unit_demand(u),
                lat,
                lon,
                candidates: &cands,
            })
            .expect("valid");
        }
        assert_eq!(b.finish().expect("built"), by_name);

        let mut b = InstanceBuilder::on(&by_name.topology, Limits::default());
        let cand = |cluster| IndexedCandidate {
            cluster,
            score: 1.0,
            cluster_rank: None,
        };
        let unit = |class, candidates| IndexedUnitSpec {
            id: "x",
            class,
            demand: 1.0,
            lat: 0.0,
            lon: 0.0,
            candidates,
        };
        let err = b.push_unit_indexed(&unit(2, &[])).expect_err("no class 2");
        assert!(err.to_string().contains("#2"), "{err}");
        let twelve = [cand(12)];
        let err = b
            .push_unit_indexed(&unit(0, &twelve))
            .expect_err("no cluster 12");
        assert!(err.to_string().contains("#12"), "{err}");
        let twice = [cand(3), cand(3)];
        let by_index = b.push_unit_indexed(&unit(0, &twice)).expect_err("twice");
        let names = [CandidateSpec {
            cluster: "c03",
            score: 1.0,
            cluster_rank: None,
        }; 2];
        let by_name_err = b
            .push_unit(&MapUnitSpec {
                id: "x",
                class: "web",
                demand: 1.0,
                lat: 0.0,
                lon: 0.0,
                candidates: &names,
            })
            .expect_err("twice");
        assert_eq!(by_index, by_name_err);
    }
}
