//! In-cluster server selection at the service edge: the selectors of a published map, over the
//! last reported server loads (their protobuf form is `cdnmap_serve::watch`'s).

use std::net::IpAddr;

use dashmap::DashMap;

use cdnmap_mapper::ClusterIdx;
use cdnmap_serve::servers::{Policy, Servers, ServersError};
use cdnmap_serve::ServingCluster;

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
    clusters: &[ServingCluster],
    policies: &[Policy],
    loads: &ServerLoads,
    keys: &[(&str, f64)],
) -> Result<Servers, ServersError> {
    Servers::build(
        clusters,
        policies,
        |c: ClusterIdx, a| loads.get(&clusters[c as usize].id, a),
        keys,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
