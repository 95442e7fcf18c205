//! In-cluster server selection at the service edge: the policies from the configuration, the
//! last reported server loads, and their protobuf form in `WatchMap` (so every front end builds
//! the same selectors as the mapper's own `Resolve`).

use std::net::IpAddr;

use dashmap::DashMap;

use cdnmap_mapper::{ClusterIdx, Instance};
use cdnmap_proto::v1 as pb;
use cdnmap_serve::servers::{Policy, Servers, ServersError};

/// The most (cluster, server) loads remembered; beyond it new servers' reports are refused.
pub const MAX_SERVER_LOADS: usize = 1_000_000;

/// The last reported load of each server, by (cluster id, address). Concurrent: load reports
/// from many front ends write it while WatchMap conversions and publication read it, each
/// locking one shard for one entry (under one mutex, a full map's conversion held every
/// report back for its whole length).
#[derive(Debug, Default)]
pub struct ServerLoads {
    loads: DashMap<(String, IpAddr), f64>,
}

impl ServerLoads {
    /// Records `load` for a server; `false` (and nothing recorded) when the table is full and
    /// the server is new. (Writers racing at the bound may pass it by one entry each.)
    pub fn set(&self, cluster: &str, server: IpAddr, load: f64) -> bool {
        let key = (cluster.to_string(), server);
        if let Some(mut known) = self.loads.get_mut(&key) {
            *known = load;
            return true;
        }
        if self.loads.len() >= MAX_SERVER_LOADS {
            return false;
        }
        self.loads.insert(key, load);
        true
    }

    pub fn get(&self, cluster: &str, server: IpAddr) -> f64 {
        // Lookups by borrowed parts would need a custom key type; the table is read once per
        // server per map version, so the small allocation does not matter.
        self.loads
            .get(&(cluster.to_string(), server))
            .map_or(0.0, |l| *l)
    }

    pub fn len(&self) -> usize {
        self.loads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.loads.is_empty()
    }
}

/// Selectors built for one map version.
#[derive(Debug)]
pub struct Published {
    pub version: u64,
    pub servers: Servers,
}

/// Builds the selectors of `instance`'s clusters. The mapper has no hostname weights, so its
/// bounded-loads selectors answer like the plain ring; front ends build theirs over the
/// hostnames they see.
pub fn build(
    instance: &Instance,
    policies: &[Policy],
    loads: &ServerLoads,
    keys: &[(&str, f64)],
) -> Result<Servers, ServersError> {
    let clusters = instance.clusters();
    Servers::build(
        instance,
        policies,
        |c: ClusterIdx, a| loads.get(&clusters[c as usize].id, a),
        keys,
    )
}

pub fn policy_pb(policy: &Policy) -> pb::ServerSelection {
    let mut out = pb::ServerSelection {
        policy: policy.name().to_string(),
        vnodes: policy.vnodes(),
        c: 0.0,
        d: 0,
    };
    match *policy {
        Policy::Consistent { .. } => {}
        Policy::BoundedLoads { c, .. } => out.c = c,
        Policy::PowerOfD { d, .. } => out.d = d,
    }
    out
}

/// The policy a `WatchMap` cluster carries; an absent selection is the default policy.
pub fn policy_from_pb(s: Option<&pb::ServerSelection>) -> Result<Policy, String> {
    let Some(s) = s else {
        return Ok(Policy::default());
    };
    let policy = match s.policy.as_str() {
        "consistent" => Policy::Consistent { vnodes: s.vnodes },
        "bounded" => Policy::BoundedLoads {
            vnodes: s.vnodes,
            c: s.c,
        },
        "power-of-d" => Policy::PowerOfD {
            vnodes: s.vnodes,
            d: s.d,
        },
        other => {
            return Err(format!(
                "unknown policy {other:?} (consistent, bounded or power-of-d)"
            ))
        }
    };
    policy.validate().map_err(|e| e.to_string())?;
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_survive_the_wire() {
        for p in [
            Policy::Consistent { vnodes: 7 },
            Policy::BoundedLoads { vnodes: 9, c: 1.5 },
            Policy::PowerOfD { vnodes: 3, d: 4 },
        ] {
            assert_eq!(policy_from_pb(Some(&policy_pb(&p))), Ok(p));
        }
        assert_eq!(policy_from_pb(None), Ok(Policy::default()));
        let bad = pb::ServerSelection {
            policy: "random".into(),
            ..Default::default()
        };
        assert!(policy_from_pb(Some(&bad)).unwrap_err().contains("random"));
        let bad = pb::ServerSelection {
            policy: "bounded".into(),
            vnodes: 10,
            c: 0.5,
            d: 0,
        };
        assert!(policy_from_pb(Some(&bad)).unwrap_err().contains("c is 0.5"));
    }

    #[test]
    fn the_load_table_is_bounded() {
        let t = ServerLoads::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(t.set("x", a, 3.0));
        assert_eq!(t.get("x", a), 3.0);
        assert_eq!(t.get("y", a), 0.0);
        assert!(t.set("x", a, 4.0));
        assert_eq!((t.len(), t.get("x", a)), (1, 4.0));
    }
}
