//! The front end's copy of the map: the [`Follower`] of `cdnmap_serve::watch` applies the
//! WatchMap stream into a serving map, and per version a [`LocalView`] indexes it for queries
//! with the same `Resolver` and `Servers` the mapper answers `Resolve` with, so both answer
//! every query alike. The class fallbacks come from the mapper, which knows the room left in
//! each cluster.

use std::sync::Arc;

use cdnmap_mapper::{ClassIdx, ClusterIdx};
use cdnmap_serve::resolve::{ClassRules, Resolver};
use cdnmap_serve::servers::{Policy, Servers};
use cdnmap_serve::watch::{Extras, FollowError, Followed};

pub use cdnmap_serve::watch::Follower;

/// Why a version could not be indexed.
pub type LocalError = FollowError;

fn invalid(field: &str, problem: impl ToString) -> LocalError {
    FollowError::Invalid {
        field: field.to_string(),
        problem: problem.to_string(),
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
    pub resolver: Resolver,
    extras: Arc<Extras>,
    servers: Option<Servers>,
}

impl LocalView {
    /// Indexes a followed version; `keys` are the hostnames (content keys) bounded-loads
    /// selectors place, with their weights.
    pub fn build(f: &Followed, keys: &[(&str, f64)]) -> Result<LocalView, LocalError> {
        let rules = ClassRules::new(f.map.classes(), &f.extras.rules, &f.extras.default_class)
            .map_err(|e| invalid("class_rules", e))?;
        let resolver = Resolver::new(Arc::clone(&f.map), rules)?;
        let mut view = LocalView {
            epoch: f.identity.epoch,
            version: f.identity.version,
            solved_at_unix_ms: f.identity.solved_at_unix_ms,
            has_bounded: f
                .extras
                .policies
                .iter()
                .any(|p| matches!(p, Policy::BoundedLoads { .. })),
            resolver,
            extras: Arc::clone(&f.extras),
            servers: None,
        };
        view.servers = Some(view.build_servers(keys)?);
        Ok(view)
    }

    /// The selectors, built over `keys` (weighted content keys, for bounded loads).
    pub fn build_servers(&self, keys: &[(&str, f64)]) -> Result<Servers, LocalError> {
        let clusters = self.resolver.map().clusters();
        let loads = &self.extras.loads;
        Servers::build(
            clusters,
            &self.extras.policies,
            |c: ClusterIdx, a| {
                let c = c as usize;
                clusters[c]
                    .addresses
                    .iter()
                    .position(|&x| x == a)
                    .and_then(|i| loads[c].get(i).copied())
                    .unwrap_or(0.0)
            },
            keys,
        )
        .map_err(|e| invalid("clusters", e))
    }

    /// The selectors built with the view.
    pub fn servers(&self) -> Option<&Servers> {
        self.servers.as_ref()
    }

    pub fn class_name(&self, k: ClassIdx) -> &str {
        self.resolver
            .map()
            .classes()
            .get(usize::from(k))
            .map_or("", |n| n)
    }

    pub fn class_arc(&self, k: ClassIdx) -> Option<Arc<str>> {
        self.resolver.map().classes().get(usize::from(k)).cloned()
    }
}
