//! cdnmap's topology as operators describe it: the mapper's [`Instance`] (classes, clusters with
//! their resource trees, map units with demand and candidates) together with its
//! [`Addressing`] (each unit's client networks, each cluster's server addresses), and the JSON
//! instance and assignment file formats (documented in `docs/formats.md`) that carry both.
//!
//! The split is the crate's reason to be: allocation reads the instance only, answering reads
//! the addressing too, so `cdnmap-mapper` knows nothing of prefixes or addresses and the
//! serving side ([`cdnmap-serve`]) takes them from here.
//!
//! Promises: a [`Topology`]'s addressing has an entry for each unit and cluster of its
//! instance, at the same index ([`Addressing::fits`]); every way to a topology but
//! [`Topology::with_instance`] (which keeps the units and clusters) goes through
//! [`TopologyBuilder`], which validates both halves: no two units of one class claim one
//! client network.

pub mod addressing;
pub mod compact;
pub mod format;

#[cfg(test)]
mod fuzz;

use std::net::IpAddr;
use std::sync::Arc;

use cdnmap_mapper::model::too_many;
use cdnmap_mapper::{
    ClusterIdx, ClusterSpec, ClusterState, Instance, InstanceBuilder, Limits, MapUnitSpec,
    ModelError, TrafficClass, UnitIdx,
};
use ipnet::IpNet;

pub use addressing::{canonical, Addressing, MAX_ADDRESSES, MAX_PREFIXES_PER_UNIT};

/// Why a topology was refused: its instance, or its addressing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(
        "client network {prefix} is claimed by two map units of class {class:?}, {first:?} and {second:?}"
    )]
    PrefixClaimedTwice {
        prefix: String,
        class: String,
        first: String,
        second: String,
    },
}

/// Clusters with their addresses as the instance builder and the addressing take them apart:
/// the specs, and each cluster's addresses by id (at most [`MAX_ADDRESSES`] each).
type Split = (Vec<ClusterSpec>, Vec<(String, Vec<IpAddr>)>);

fn split_clusters(clusters: Vec<(ClusterSpec, Vec<IpAddr>)>) -> Result<Split, ModelError> {
    let mut specs = Vec::with_capacity(clusters.len());
    let mut addresses = Vec::with_capacity(clusters.len());
    for (spec, a) in clusters {
        too_many(
            || format!("cluster {:?}", spec.id),
            "addresses",
            a.len(),
            MAX_ADDRESSES,
        )?;
        addresses.push((spec.id.clone(), a));
        specs.push(spec);
    }
    Ok((specs, addresses))
}

/// Refuses a unit with more than [`MAX_PREFIXES_PER_UNIT`] client networks, naming it.
fn check_prefixes(unit: &str, prefixes: &[IpNet]) -> Result<(), ModelError> {
    too_many(
        || format!("map unit {unit:?}"),
        "prefixes",
        prefixes.len(),
        MAX_PREFIXES_PER_UNIT,
    )
}

impl TopologyError {
    /// Client network `prefix` claimed by units `a` and `b` (of one class) of `instance`.
    fn claimed_twice(instance: &Instance, prefix: IpNet, a: UnitIdx, b: UnitIdx) -> TopologyError {
        TopologyError::PrefixClaimedTwice {
            prefix: prefix.to_string(),
            class: instance.classes()[usize::from(instance.unit_class(a))]
                .name
                .clone(),
            first: instance.unit_id(a).to_string(),
            second: instance.unit_id(b).to_string(),
        }
    }
}

/// An instance and its addressing: one topology, as the service publishes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub instance: Instance,
    pub addressing: Arc<Addressing>,
}

impl Topology {
    /// `instance` with no prefixes and no addresses: for what is only solved, never answered
    /// from.
    pub fn bare(instance: Instance) -> Topology {
        let addressing = Arc::new(Addressing::none_for(&instance));
        Topology {
            instance,
            addressing,
        }
    }

    /// This topology's addressing beside `instance`, an instance derived from this one that
    /// kept its units and clusters in their order (a cluster's state, a round's demand).
    ///
    /// # Panics
    ///
    /// When `instance` has other units or clusters (by id, in order): a caller's bug, not bad
    /// input.
    pub fn with_instance(&self, instance: Instance) -> Topology {
        let same_clusters = || {
            let (a, b) = (self.instance.clusters(), instance.clusters());
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.id == y.id)
        };
        // A pointer comparison for an instance derived from this one, the ids otherwise.
        assert!(
            self.addressing.fits(&instance)
                && self.instance.same_unit_ids(&instance)
                && same_clusters(),
            "with_instance: the instance has other units or clusters than its addressing"
        );
        Topology {
            instance,
            addressing: Arc::clone(&self.addressing),
        }
    }

    /// The topology with cluster `c` in `state` (the instance's
    /// [`Instance::with_cluster_state`], the addressing shared).
    pub fn with_cluster_state(&self, c: ClusterIdx, state: ClusterState) -> Topology {
        self.with_instance(self.instance.with_cluster_state(c, state))
    }

    /// The topology with cluster `c`'s addresses replaced by `addresses` (at most
    /// `MAX_ADDRESSES` are kept), everything else shared: what a round answers from when
    /// some of a cluster's servers fail their health checks.
    pub fn with_cluster_addresses(&self, c: ClusterIdx, mut addresses: Vec<IpAddr>) -> Topology {
        addresses.truncate(MAX_ADDRESSES);
        Topology {
            instance: self.instance.clone(),
            addressing: Arc::new(self.addressing.with_cluster_addresses(c, addresses)),
        }
    }

    /// The topology with cluster `spec.id` replaced by `spec` and its `addresses`, the units
    /// and their prefixes shared ([`Instance::with_cluster_replaced`]); `None` when the
    /// units cannot stay as they are (a new cluster, or one that would serve other classes).
    pub fn with_cluster_replaced(
        &self,
        spec: ClusterSpec,
        addresses: Vec<IpAddr>,
    ) -> Result<Option<Topology>, TopologyError> {
        too_many(
            || format!("cluster {:?}", spec.id),
            "addresses",
            addresses.len(),
            MAX_ADDRESSES,
        )?;
        let id = spec.id.clone();
        let Some(instance) = self.instance.with_cluster_replaced(spec)? else {
            return Ok(None);
        };
        // The instance replaced the cluster of this id, so it has one.
        let Some(c) = instance.cluster_index(&id) else {
            return Ok(None);
        };
        Ok(Some(Topology {
            instance,
            addressing: Arc::new(self.addressing.with_cluster_addresses(c, addresses)),
        }))
    }

    /// The topology with `clusters` (each with its addresses) as its whole cluster list, the
    /// map units and their prefixes kept ([`Instance::with_clusters`]: candidates follow
    /// their cluster, those of a cluster gone or no longer serving their unit's class are
    /// dropped); also the candidate entries dropped and the units they belonged to.
    pub fn with_clusters(
        &self,
        clusters: Vec<(ClusterSpec, Vec<IpAddr>)>,
        limits: Limits,
    ) -> Result<(Topology, usize, usize), TopologyError> {
        let (specs, addresses) = split_clusters(clusters)?;
        let (instance, dropped, units) = self.instance.with_clusters(specs, limits)?;
        let addressing = Arc::new(self.addressing.with_clusters(&instance, addresses));
        Ok((
            Topology {
                instance,
                addressing,
            },
            dropped,
            units,
        ))
    }

    /// The topology with the map units of `upserts` (each with its client networks;
    /// replacing the unit of its id, or added) and without those of `deletes` (ids), through
    /// [`Instance::with_units_edited`]: the new units validated as a file's are (a network
    /// another unit of its class claims is refused, naming both), every other unit's columns
    /// and prefixes copied over. Equal to the topology built from the edited file.
    pub fn with_units_edited(
        &self,
        upserts: &[(MapUnitSpec<'_>, &[IpNet])],
        deletes: &[&str],
        limits: Limits,
    ) -> Result<Topology, TopologyError> {
        for (spec, prefixes) in upserts {
            check_prefixes(spec.id, prefixes)?;
        }
        let specs: Vec<MapUnitSpec<'_>> = upserts.iter().map(|(s, _)| *s).collect();
        let (instance, pieces) = self.instance.with_units_edited(&specs, deletes, limits)?;
        let addressing = self.addressing.spliced(&pieces, |i| upserts[i].1);
        // The new units' indices in the edited instance, in order.
        let mut fresh = Vec::new();
        let mut u = 0 as UnitIdx;
        for piece in &pieces {
            match piece {
                cdnmap_mapper::model::Piece::Kept(r) => u += r.end - r.start,
                cdnmap_mapper::model::Piece::New(_) => {
                    fresh.push(u);
                    u += 1;
                }
            }
        }
        if let Some((prefix, a, b)) = addressing::claimed_twice_by(&instance, &addressing, &fresh) {
            return Err(TopologyError::claimed_twice(&instance, prefix, a, b));
        }
        Ok(Topology {
            instance,
            addressing: Arc::new(addressing),
        })
    }

    /// Unit `u`'s client networks.
    pub fn unit_prefixes(&self, u: UnitIdx) -> &[IpNet] {
        self.addressing.unit_prefixes(u)
    }

    /// Cluster `c`'s server addresses.
    pub fn cluster_addresses(&self, c: ClusterIdx) -> &[IpAddr] {
        self.addressing.cluster_addresses(c)
    }
}

/// A topology reads as its instance, so what allocates takes `&topology` where it takes
/// `&Instance` and only what answers asks for the addressing.
impl std::ops::Deref for Topology {
    type Target = Instance;
    fn deref(&self) -> &Instance {
        &self.instance
    }
}

/// Builds a [`Topology`]: the mapper's [`InstanceBuilder`], with the prefixes of each unit and
/// the addresses of each cluster kept beside it and put in the instance's order at the end.
#[derive(Debug)]
pub struct TopologyBuilder {
    instance: InstanceBuilder,
    addressing: addressing::Collector,
}

impl TopologyBuilder {
    /// Validates the classes and clusters (each cluster with its addresses).
    pub fn new(
        classes: Vec<TrafficClass>,
        clusters: Vec<(ClusterSpec, Vec<IpAddr>)>,
        limits: Limits,
    ) -> Result<TopologyBuilder, ModelError> {
        let (specs, addresses) = split_clusters(clusters)?;
        Ok(TopologyBuilder {
            instance: InstanceBuilder::new(classes, specs, limits)?,
            addressing: addressing::Collector::new(addresses),
        })
    }

    /// Reserves room for `units` more units with `candidates` and `prefixes` among them.
    /// Sets the operator's policy, validated against the clusters.
    pub fn set_policy(
        &mut self,
        spec: &cdnmap_mapper::model::PolicySpec,
    ) -> Result<(), cdnmap_mapper::ModelError> {
        self.instance.set_policy(spec)
    }

    pub fn reserve(&mut self, units: usize, candidates: usize, prefixes: usize) {
        self.instance.reserve(units, candidates);
        self.addressing.reserve(units, prefixes);
    }

    pub fn cluster_index(&self, id: &str) -> Option<ClusterIdx> {
        self.instance.cluster_index(id)
    }

    /// Validates one map unit with its client networks and appends it. On error nothing is
    /// appended.
    pub fn push_unit(
        &mut self,
        spec: &MapUnitSpec<'_>,
        prefixes: &[IpNet],
    ) -> Result<(), ModelError> {
        check_prefixes(spec.id, prefixes)?;
        self.instance.push_unit(spec)?;
        self.addressing.push_unit(prefixes);
        Ok(())
    }

    /// [`Self::push_unit`] with the class and clusters by this builder's indices
    /// ([`InstanceBuilder::push_unit_indexed`]): the compact form's decoding.
    pub fn push_unit_indexed(
        &mut self,
        spec: &cdnmap_mapper::model::IndexedUnitSpec<'_>,
        prefixes: &[IpNet],
    ) -> Result<(), ModelError> {
        check_prefixes(spec.id, prefixes)?;
        self.instance.push_unit_indexed(spec)?;
        self.addressing.push_unit(prefixes);
        Ok(())
    }

    /// The index of traffic class `name` in the topology being built.
    pub fn class_index(&self, name: &str) -> Option<cdnmap_mapper::ClassIdx> {
        self.instance.class_index(name)
    }

    /// The topology: units in id order (duplicates refused), their prefixes with them; a
    /// client network claimed by two units of one class is refused.
    pub fn finish(self) -> Result<Topology, TopologyError> {
        let (instance, order) = self.instance.finish_with_order()?;
        let addressing = Arc::new(self.addressing.finish(&instance, order.as_deref()));
        if let Some((prefix, a, b)) = addressing::claimed_twice(&instance, &addressing) {
            return Err(TopologyError::claimed_twice(&instance, prefix, a, b));
        }
        Ok(Topology {
            instance,
            addressing,
        })
    }
}
