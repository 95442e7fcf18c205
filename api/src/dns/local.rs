//! The front end's copy of the map: `WatchMap` updates applied to a table of map units, and,
//! per version, a [`LocalView`] indexed for queries by the same `Resolver` and `Servers` the
//! mapper answers `Resolve` with, so both answer every query alike.
//!
//! The view is an `Instance` rebuilt from what the stream carries: each cluster with its
//! addresses, state and selection policy (and a nominal resource tree, since a front end needs
//! no capacities); each map unit with its prefixes, class and, as candidates in order, the
//! clusters holding its demand and then its backup cluster; the map holds its shares. The class
//! fallbacks come from the mapper, which knows the room left in each cluster.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use cdnmap_mapper::format::{
    CandidateFile, ClusterFile, InstanceFile, MapUnitFile, NestedNode, ResourcesFile,
};
use cdnmap_mapper::{
    Allocation, ClassIdx, ClusterIdx, Limits, Map, PerUnit, ResourceKind, TrafficClass,
};
use cdnmap_proto::v1 as pb;
use cdnmap_serve::resolve::{ClassRules, Resolver};
use cdnmap_serve::servers::{Policy, Servers};
use ipnet::IpNet;

/// Most map units a front end holds.
pub const MAX_LOCAL_UNITS: usize = 10_000_000;
/// Most clusters a front end holds.
pub const MAX_LOCAL_CLUSTERS: usize = 100_000;

/// Why an update could not be applied (the copy is then unchanged; the stream is restarted
/// with a full map).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    #[error("a delta against version {base:?} (epoch, version) arrived while holding {held:?}")]
    Gap { base: (u64, u64), held: (u64, u64) },
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> LocalError {
    LocalError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

/// The map as the stream has brought it so far.
#[derive(Debug, Default, Clone)]
pub struct LocalMap {
    epoch: u64,
    version: u64,
    solved_at_unix_ms: i64,
    units: HashMap<String, pb::UnitMapping>,
    clusters: Vec<pb::ClusterAddresses>,
    rules: Vec<pb::ClassRule>,
    default_class: String,
    fallbacks: Vec<pb::ClassFallback>,
}

impl LocalMap {
    /// The version held (0: none yet).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The epoch of the version held.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The identity of the map held, (epoch, version): ordered as a pair.
    pub fn identity(&self) -> (u64, u64) {
        (self.epoch, self.version)
    }

    pub fn unit_count(&self) -> usize {
        self.units.len()
    }

    /// Applies one update: a full map replaces everything, a delta must follow the map held
    /// (its base is the identity held). A full map older than the one held (a lower
    /// (epoch, version)) is not applied: `Ok(false)`. On error nothing changes.
    pub fn apply(&mut self, update: pb::MapUpdate) -> Result<bool, LocalError> {
        let held = self.identity();
        if !update.full && (update.base_epoch, update.base_version) != held {
            return Err(LocalError::Gap {
                base: (update.base_epoch, update.base_version),
                held,
            });
        }
        if update.full && self.version != 0 && (update.epoch, update.version) < held {
            return Ok(false);
        }
        if update.clusters.len() > MAX_LOCAL_CLUSTERS {
            return Err(invalid(
                "clusters",
                format!(
                    "{} clusters, at most {MAX_LOCAL_CLUSTERS}",
                    update.clusters.len()
                ),
            ));
        }
        let added = if update.full {
            update.units.len()
        } else {
            self.units.len() + update.units.len()
        };
        if added > MAX_LOCAL_UNITS {
            return Err(invalid(
                "units",
                format!("{added} map units, at most {MAX_LOCAL_UNITS}"),
            ));
        }
        if update.full {
            self.units.clear();
        }
        for id in &update.removed_units {
            self.units.remove(id);
        }
        for u in update.units {
            self.units.insert(u.id.clone(), u);
        }
        self.epoch = update.epoch;
        self.version = update.version;
        self.solved_at_unix_ms = update.solved_at_unix_ms;
        self.clusters = update.clusters;
        self.rules = update.class_rules;
        self.default_class = update.default_class;
        self.fallbacks = update.fallbacks;
        Ok(true)
    }

    /// Indexes the copy for queries; `keys` are the hostnames (content keys) bounded-loads
    /// selectors place, with their weights.
    pub fn build(&self, keys: &[(&str, f64)]) -> Result<LocalView, LocalError> {
        // Classes: every name the stream mentions, in name order.
        let mut names: BTreeSet<&str> = BTreeSet::new();
        names.insert(&self.default_class);
        names.extend(self.units.values().map(|u| u.traffic_class.as_str()));
        names.extend(self.rules.iter().map(|r| r.traffic_class.as_str()));
        names.extend(self.fallbacks.iter().map(|f| f.traffic_class.as_str()));
        let class_names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let traffic_classes = class_names
            .iter()
            .map(|n| TrafficClass {
                name: n.clone(),
                priority: 0,
                per_unit: PerUnit { bps: 1.0, fps: 0.0 },
            })
            .collect();

        let mut policies: HashMap<&str, Policy> = HashMap::new();
        let mut clusters = Vec::with_capacity(self.clusters.len());
        for (i, c) in self.clusters.iter().enumerate() {
            let field = |f: &str| format!("clusters[{i}] ({:?}).{f}", c.id);
            let addresses = c
                .addresses
                .iter()
                .map(|a| {
                    a.parse::<IpAddr>().map_err(|_| {
                        invalid(field("addresses"), format!("{a:?} is not an address"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let state = crate::watch::state_from_pb(c.state)
                .ok_or_else(|| invalid(field("state"), format!("{} is not a state", c.state)))?;
            let policy = crate::selection::policy_from_pb(c.selection.as_ref())
                .map_err(|e| invalid(field("selection"), e))?;
            policies.insert(&c.id, policy);
            clusters.push(ClusterFile {
                id: c.id.clone(),
                lat: 0.0,
                lon: 0.0,
                addresses,
                state,
                classes: None,
                resources: ResourcesFile::Nested(NestedNode {
                    name: "local".into(),
                    kind: ResourceKind::Bps,
                    capacity: 1.0,
                    classes: class_names.clone(),
                    children: Vec::new(),
                }),
            });
        }

        let mut units = Vec::with_capacity(self.units.len());
        for u in self.units.values() {
            let field = |f: &str| format!("units[{:?}].{f}", u.id);
            let prefixes = u
                .prefixes
                .iter()
                .map(|p| {
                    p.parse::<IpNet>()
                        .map_err(|_| invalid(field("prefixes"), format!("{p:?} is not a prefix")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut candidates: Vec<CandidateFile> = Vec::with_capacity(u.shares.len() + 1);
            for s in &u.shares {
                if !(s.share.is_finite() && s.share > 0.0 && s.share <= 1.0 + 1e-9) {
                    return Err(invalid(
                        field("shares"),
                        format!("share {} is not in (0, 1]", s.share),
                    ));
                }
                candidates.push(CandidateFile {
                    cluster: s.cluster.clone(),
                    score: candidates.len() as f64,
                    cluster_rank: None,
                });
            }
            if !u.backup_cluster.is_empty() {
                candidates.push(CandidateFile {
                    cluster: u.backup_cluster.clone(),
                    score: candidates.len() as f64,
                    cluster_rank: None,
                });
            }
            units.push(MapUnitFile {
                id: u.id.clone(),
                class: u.traffic_class.clone(),
                demand: 1.0,
                prefixes,
                lat: 0.0,
                lon: 0.0,
                candidates,
            });
        }
        let file = InstanceFile {
            traffic_classes,
            clusters,
            map_units: units,
        };
        let limits = Limits {
            max_candidates: cdnmap_mapper::model::MAX_CANDIDATES_CEILING,
        };
        let instance = file
            .build(limits)
            .map_err(|e| invalid("map", e.to_string()))?;

        // The shares, in the order the stream gave them (the unit's preference order).
        let mut map = Map::with_capacity(instance.unit_count(), instance.unit_count());
        for u in 0..instance.unit_count() as u32 {
            let mapping = &self.units[instance.unit_id(u)];
            let allocs = mapping.shares.iter().filter_map(|s| {
                instance.cluster_index(&s.cluster).map(|c| Allocation {
                    cluster: c,
                    amount: s.share,
                })
            });
            map.push_unit(allocs, mapping.overflow_share.max(0.0));
        }

        let pairs: Vec<(String, String)> = self
            .rules
            .iter()
            .map(|r| (r.pattern.clone(), r.traffic_class.clone()))
            .collect();
        let rules = ClassRules::new(&instance, &pairs, &self.default_class)
            .map_err(|e| invalid("class_rules", e.to_string()))?;
        let mut fallback = vec![[None, None]; class_names.len()];
        for f in &self.fallbacks {
            let Some(k) = instance.class_index(&f.traffic_class) else {
                continue;
            };
            let ids: Vec<Option<ClusterIdx>> = f
                .clusters
                .iter()
                .map(|c| instance.cluster_index(c))
                .collect();
            fallback[usize::from(k)] = [
                ids.first().copied().flatten(),
                ids.get(1).copied().flatten(),
            ];
        }
        let resolver = Resolver::new(&instance, &map, rules)
            .map_err(|e| invalid("map", e.to_string()))?
            .with_fallbacks(fallback);
        let policies: Vec<Policy> = resolver
            .instance()
            .clusters()
            .iter()
            .map(|c| policies.get(c.id.as_str()).copied().unwrap_or_default())
            .collect();
        let mut loads = HashMap::new();
        for c in &self.clusters {
            let Some(ci) = resolver.instance().cluster_index(&c.id) else {
                continue;
            };
            for (a, &l) in c.addresses.iter().zip(&c.server_loads) {
                if let (Ok(a), true) = (a.parse::<IpAddr>(), l.is_finite() && l >= 0.0) {
                    loads.insert((ci, a), l);
                }
            }
        }
        let mut view = LocalView {
            epoch: self.epoch,
            version: self.version,
            solved_at_unix_ms: self.solved_at_unix_ms,
            has_bounded: policies
                .iter()
                .any(|p| matches!(p, Policy::BoundedLoads { .. })),
            class_names: class_names.iter().map(|n| Arc::from(n.as_str())).collect(),
            resolver,
            policies,
            loads,
            servers: None,
        };
        view.servers = Some(view.build_servers(keys)?);
        Ok(view)
    }
}

/// One map version, indexed for queries.
#[derive(Debug)]
pub struct LocalView {
    pub epoch: u64,
    pub version: u64,
    pub solved_at_unix_ms: i64,
    /// Some cluster selects with bounded loads (the front end then counts hostnames).
    pub has_bounded: bool,
    /// Class names by class index.
    pub class_names: Vec<Arc<str>>,
    pub resolver: Resolver,
    /// Per cluster index, its selection policy; per (cluster, server), its last reported load.
    policies: Vec<Policy>,
    loads: HashMap<(ClusterIdx, IpAddr), f64>,
    servers: Option<Servers>,
}

impl LocalView {
    /// The selectors, built over `keys` (weighted content keys, for bounded loads).
    pub fn build_servers(&self, keys: &[(&str, f64)]) -> Result<Servers, LocalError> {
        Servers::build(
            self.resolver.instance(),
            &self.policies,
            |c, a| self.loads.get(&(c, a)).copied().unwrap_or(0.0),
            keys,
        )
        .map_err(|e| invalid("clusters", e.to_string()))
    }

    /// The selectors built with the view.
    pub fn servers(&self) -> Option<&Servers> {
        self.servers.as_ref()
    }

    pub fn class_name(&self, k: ClassIdx) -> &str {
        self.class_names.get(usize::from(k)).map_or("", |n| n)
    }

    pub fn class_arc(&self, k: ClassIdx) -> Option<Arc<str>> {
        self.class_names.get(usize::from(k)).cloned()
    }
}
