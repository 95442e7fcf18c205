//! The front end's copy of the map: the [`Follower`] of `cdnmap_serve::watch` applies the
//! WatchMap stream into a serving map, and per version a [`LocalView`] indexes it for queries
//! with the same `Resolver` and `Servers` the mapper answers `Resolve` with, so both answer
//! every query alike. The class fallbacks come from the mapper, which knows the room left in
//! each cluster.

use std::sync::Arc;

use cdnmap_mapper::{ClassIdx, ClusterIdx};
use cdnmap_serve::answer::View;
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
    /// selectors place, with their weights. `previous` is the view in use, if any: when the
    /// version has the same map units (the usual case: a round changes the map, not the
    /// units) its prefix index is shared instead of built a second time beside it.
    pub fn build(
        f: &Followed,
        keys: &[(&str, f64)],
        previous: Option<&LocalView>,
    ) -> Result<LocalView, LocalError> {
        let rules = ClassRules::new(f.map.classes(), &f.extras.rules, &f.extras.default_class)
            .map_err(|e| invalid("class_rules", e))?;
        let resolver =
            Resolver::new_after(Arc::clone(&f.map), rules, previous.map(|v| &v.resolver))?;
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

    /// The view as `cdnmap_serve::answer` decides from it, answering with `servers`.
    pub fn answer_view<'v>(&'v self, servers: Option<&'v Servers>) -> View<'v> {
        View {
            resolver: &self.resolver,
            servers,
            bypass: &self.extras.bypass,
            bounded: self.has_bounded,
        }
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

/// What the front end answers from: one view and the selectors answering with it, swapped as
/// one (`crate::front::Front::live`), so no query reads a view with selectors of another.
#[derive(Debug)]
pub struct Live {
    pub view: Arc<LocalView>,
    /// Selectors rebuilt over the last report period's hostnames (bounded loads), in place of
    /// those built with the view.
    rebuilt: Option<Servers>,
}

impl Live {
    /// `view`, answering with the selectors built with it.
    pub fn new(view: Arc<LocalView>) -> Live {
        Live {
            view,
            rebuilt: None,
        }
    }

    /// `view`, answering with `servers` (rebuilt for it).
    pub fn rebuilt(view: Arc<LocalView>, servers: Servers) -> Live {
        Live {
            view,
            rebuilt: Some(servers),
        }
    }

    /// The selectors answering.
    pub fn servers(&self) -> Option<&Servers> {
        self.rebuilt.as_ref().or(self.view.servers())
    }

    /// What `cdnmap_serve::answer` decides from.
    pub fn view(&self) -> View<'_> {
        self.view.answer_view(self.servers())
    }
}

/// A view of `m` for this crate's tests: every cluster with the default policy, hostname
/// `rules` (pattern, class), default class "web", version 1 of epoch 1.
#[cfg(test)]
pub(crate) fn test_view(m: &cdnmap_serve::ServingMap, rules: &[(&str, &str)]) -> LocalView {
    test_view_with(m, rules, &[])
}

/// [`test_view`] with the classes' last resorts `bypass` (class name, last resort).
#[cfg(test)]
pub(crate) fn test_view_with(
    m: &cdnmap_serve::ServingMap,
    rules: &[(&str, &str)],
    bypass: &[(String, cdnmap_serve::watch::Bypass)],
) -> LocalView {
    use cdnmap_serve::watch::{full_part, Applied, Edge, Identity};
    let policies = vec![Policy::default(); m.clusters().len()];
    let rules: Vec<(String, String)> = rules
        .iter()
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect();
    let load = |_: &str, _: std::net::IpAddr| 0.5;
    let edge = Edge {
        policies: &policies,
        load: &load,
        rules: &rules,
        default_class: "web",
        bypass,
    };
    let id = Identity {
        epoch: 1,
        version: 1,
        solved_at_unix_ms: 7,
    };
    let mut f = Follower::default();
    let applied = f
        .apply(full_part(&edge, id, m, 0))
        .expect("the map applies");
    assert_eq!(applied, Applied::New);
    LocalView::build(f.held().expect("a map held"), &[], None).expect("the view indexes")
}

#[cfg(test)]
/// A map for this crate's tests: two clusters (a, b, each one address, up), classes video
/// and web; units `(id, class, prefix, share at cluster a)` (the rest at b).
pub(crate) fn test_map(units: &[(&str, ClassIdx, &str, f64)]) -> cdnmap_serve::ServingMap {
    use cdnmap_mapper::model::ClusterState;
    use cdnmap_serve::serving::{Builder, ServingCluster};
    use std::net::IpAddr;
    let classes: Vec<Arc<str>> = vec![Arc::from("video"), Arc::from("web")];
    let clusters = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, id)| ServingCluster {
            id: id.to_string(),
            addresses: vec![IpAddr::from([192, 0, 2, i as u8 + 1])],
            state: ClusterState::Up,
        })
        .collect();
    let mut b = Builder::new(classes, clusters).expect("clusters");
    for &(id, class, prefix, at_a) in units {
        let prefix: ipnet::IpNet = prefix.parse().expect("prefix");
        let shares = [(0, at_a), (1, 1.0 - at_a)]
            .into_iter()
            .filter(|s| s.1 > 0.0);
        b.push(id, class, [prefix], shares, 0.0, [None, None])
            .expect("a valid unit");
    }
    b.set_fallback(&[[Some(1), None], [Some(1), None]]);
    b.finish()
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use cdnmap_serve::serving::ServingMap;
    use cdnmap_serve::watch::{delta_update, full_part, Applied, Edge, Identity};
    use ipnet::IpNet;

    use super::*;

    /// The version held after each map of `maps` (a full map, then deltas), its view built
    /// after the one before, and a view of it built afresh.
    fn follow(maps: &[ServingMap]) -> Vec<(LocalView, LocalView)> {
        let policies = vec![cdnmap_serve::servers::Policy::default(); 2];
        let rules = vec![("*.video.example".to_string(), "video".to_string())];
        let load = |_: &str, _: IpAddr| 0.5;
        let edge = Edge {
            policies: &policies,
            load: &load,
            rules: &rules,
            default_class: "web",
            bypass: &[],
        };
        let id = |version| Identity {
            epoch: 1,
            version,
            solved_at_unix_ms: 0,
        };
        let mut f = Follower::default();
        let mut views: Vec<(LocalView, LocalView)> = Vec::new();
        for (i, m) in maps.iter().enumerate() {
            let v = i as u64 + 1;
            let update = match i {
                0 => full_part(&edge, id(v), m, 0),
                _ => delta_update(&edge, id(v - 1), &maps[i - 1], id(v), m).expect("a small delta"),
            };
            assert_eq!(f.apply(update).expect("applies"), Applied::New);
            let held = f.held().expect("held");
            let after = LocalView::build(held, &[], views.last().map(|v| &v.0)).expect("after");
            let fresh = LocalView::build(held, &[], None).expect("fresh");
            views.push((after, fresh));
        }
        views
    }

    /// A version of the same units shares the view in use's prefix index and answers as a
    /// view built afresh; a version with a unit added builds its own.
    #[test]
    fn a_view_of_the_same_units_shares_the_index_of_the_one_in_use() {
        let units = [("u1", 0, "10.0.0.0/24", 1.0), ("u2", 1, "10.0.0.0/16", 0.5)];
        let mut moved = units;
        moved[0].3 = 0.0;
        moved[1].3 = 0.25;
        let mut more = moved.to_vec();
        more.push(("u3", 1, "10.0.0.0/24", 1.0));
        let views = follow(&[test_map(&units), test_map(&moved), test_map(&more)]);
        assert!(views[1].0.resolver.shares_index_with(&views[0].0.resolver));
        assert!(!views[2].0.resolver.shares_index_with(&views[1].0.resolver));
        for (after, fresh) in &views {
            for client in ["10.0.0.7/32", "10.0.9.1/32", "10.0.0.0/24", "192.0.2.9/32"] {
                let client: IpNet = client.parse().expect("client");
                for i in 0..50 {
                    for name in [format!("h{i}.video.example"), format!("h{i}.example")] {
                        let (a, b) = (
                            after.resolver.resolve(client, &name),
                            fresh.resolver.resolve(client, &name),
                        );
                        assert_eq!(a, b, "{client} {name}");
                    }
                }
            }
        }
        // The moved shares are answered: u1 now wholly at b.
        let client: IpNet = "10.0.0.7/32".parse().expect("client");
        assert_eq!(
            views[1]
                .0
                .resolver
                .resolve(client, "x.video.example")
                .primary,
            Some(1)
        );
    }
}
