//! The second level of mapping: which servers of the chosen clusters an answer names.
//!
//! Each cluster has a selection [`Policy`] (from the configuration); [`Servers`] builds, once per
//! map version, one [`Selector`] per cluster and address family over the cluster's addresses
//! (a server is an address; its ring id is the address's text), then answers without
//! allocating. The key is the hostname (content), lower-cased, without the trailing dot, so
//! every name lands on the same servers, and every front end (and the mapper's own `Resolve`)
//! that holds the same map and policies names the same servers.
//!
//! An answer names up to [`ANSWER_SERVERS`] servers of its primary cluster, the one the map
//! gives the client's unit (a split unit's client: the one its hash picked), and no other
//! cluster's: resolvers reorder an answer's addresses and clients mostly connect to the first,
//! so an address of another cluster would send that cluster demand the allocation never gave
//! it (through Debian's unbound, 38% of first addresses did when answers named a server of the
//! second cluster third). The one exception is a unit whose class goes with the winner: the
//! map reserved a share of its demand at a companion cluster for the clients that go there,
//! and its answers name [`ANSWER_SERVERS`] − 1 servers of the primary, then one of the
//! companion's ([`COMPANION_SERVERS`]).

use std::net::IpAddr;

use cdnmap_mapper::model::ClusterIdx;
use cdnmap_select::{BoundedLoads, PowerOfD, Ring, SelectError, Selector, ServerIdx};

use crate::resolve::{Answer, MAX_QNAME_LEN};
use crate::serving::ServingCluster;

/// Servers an answer names, all of its primary cluster.
pub const ANSWER_SERVERS: usize = 3;
/// The servers of its companion an answer names when it has one (out of [`ANSWER_SERVERS`]).
pub const COMPANION_SERVERS: usize = 1;
/// Most weighted keys a bounded-loads selector is built over.
pub const MAX_WEIGHTED_KEYS: usize = 100_000;
/// Most virtual nodes per server.
pub const MAX_VNODES: u32 = 1_000;

/// A cluster's in-cluster selection policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// Consistent hashing with `vnodes` points per server.
    Consistent { vnodes: u32 },
    /// Consistent hashing with bounded loads (factor `c` > 1) over the weighted keys given to
    /// [`Servers::build`]; other keys get the plain ring answer.
    BoundedLoads { vnodes: u32, c: f64 },
    /// The least loaded (by the last reported server loads) of the key's first `d` servers.
    PowerOfD { vnodes: u32, d: u32 },
}

impl Default for Policy {
    fn default() -> Self {
        Policy::Consistent { vnodes: 100 }
    }
}

impl Policy {
    pub fn vnodes(&self) -> u32 {
        match *self {
            Policy::Consistent { vnodes }
            | Policy::BoundedLoads { vnodes, .. }
            | Policy::PowerOfD { vnodes, .. } => vnodes,
        }
    }

    /// The policy's name as configured: `consistent`, `bounded`, `power-of-d`.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Consistent { .. } => "consistent",
            Policy::BoundedLoads { .. } => "bounded",
            Policy::PowerOfD { .. } => "power-of-d",
        }
    }

    /// Checks the numbers; the error names the field.
    pub fn validate(&self) -> Result<(), SelectError> {
        let bad = |field: &'static str, value: f64, rule: &'static str| SelectError::BadNumber {
            subject: format!("{} policy", self.name()),
            field,
            value,
            rule,
        };
        let vnodes = self.vnodes();
        if !(1..=MAX_VNODES).contains(&vnodes) {
            return Err(bad("vnodes", f64::from(vnodes), "must be in 1..=1000"));
        }
        match *self {
            Policy::Consistent { .. } => Ok(()),
            Policy::BoundedLoads { c, .. } if !(c.is_finite() && c > 1.0 && c <= 100.0) => {
                Err(bad("c", c, "must be above 1 and at most 100"))
            }
            Policy::BoundedLoads { .. } => Ok(()),
            Policy::PowerOfD { d, .. } if !(1..=cdnmap_select::MAX_D as u32).contains(&d) => {
                Err(bad("d", f64::from(d), "must be in 1..=16"))
            }
            Policy::PowerOfD { .. } => Ok(()),
        }
    }
}

/// One cluster's servers of one address family, with their selector.
struct Family {
    addresses: Vec<IpAddr>,
    selector: Option<Box<dyn Selector + Send + Sync>>,
}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Family")
            .field("addresses", &self.addresses)
            .finish_non_exhaustive()
    }
}

/// Every cluster's selectors for one map version.
#[derive(Debug)]
pub struct Servers {
    /// Per cluster: IPv4, IPv6.
    families: Vec<[Family; 2]>,
}

/// Why [`Servers::build`] refused its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServersError {
    #[error("cluster {cluster:?}: {source}")]
    Select {
        cluster: String,
        #[source]
        source: SelectError,
    },
    #[error("{got} policies for {clusters} clusters")]
    PolicyCount { got: usize, clusters: usize },
    #[error("{got} weighted keys, at most {MAX_WEIGHTED_KEYS}")]
    TooManyKeys { got: usize },
}

/// The selection key of a hostname: lower-cased, without the trailing dot (at most
/// [`MAX_QNAME_LEN`] bytes are used). A name that already is its key (a front end's names come
/// in lower case) is returned as it is; any other is written to `buf` and read from there.
pub fn content_key<'a>(qname: &'a str, buf: &'a mut String) -> &'a str {
    let name = qname.strip_suffix('.').unwrap_or(qname);
    let mut end = name.len().min(MAX_QNAME_LEN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let name = &name[..end];
    if !name.bytes().any(|b| b.is_ascii_uppercase()) {
        return name;
    }
    buf.clear();
    buf.push_str(name);
    buf.make_ascii_lowercase();
    buf
}

/// The steps of [`Servers::prefetch`].
pub const PREFETCH_STEPS: u8 = 4;

/// The selection hash of hostname `qname`: its [`content_key`] (written to `key_buf` when it
/// is not the name itself), hashed.
pub fn key_hash_of(qname: &str, key_buf: &mut String) -> u64 {
    cdnmap_select::key_hash(content_key(qname, key_buf))
}

impl Servers {
    /// Builds each cluster's selectors. `policies[c]` is cluster `c`'s policy; `load(c, addr)`
    /// the last reported load of a server (power-of-d; 0 when none was reported); `keys` the
    /// weighted hostnames bounded loads place (content keys, see [`content_key`]).
    pub fn build(
        clusters: &[ServingCluster],
        policies: &[Policy],
        load: impl Fn(ClusterIdx, IpAddr) -> f64,
        keys: &[(&str, f64)],
    ) -> Result<Servers, ServersError> {
        if policies.len() != clusters.len() {
            return Err(ServersError::PolicyCount {
                got: policies.len(),
                clusters: clusters.len(),
            });
        }
        if keys.len() > MAX_WEIGHTED_KEYS {
            return Err(ServersError::TooManyKeys { got: keys.len() });
        }
        let mut families = Vec::with_capacity(clusters.len());
        for (ci, (cluster, policy)) in clusters.iter().zip(policies).enumerate() {
            let err = |source| ServersError::Select {
                cluster: cluster.id.clone(),
                source,
            };
            policy.validate().map_err(err)?;
            let family = |v6: bool| -> Result<Family, ServersError> {
                let addresses: Vec<IpAddr> = cluster
                    .addresses
                    .iter()
                    .copied()
                    .filter(|a| a.is_ipv6() == v6)
                    .collect();
                if addresses.is_empty() {
                    return Ok(Family {
                        addresses,
                        selector: None,
                    });
                }
                let ids: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
                let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                let ring = Ring::new(&id_refs, policy.vnodes()).map_err(err)?;
                let selector: Box<dyn Selector + Send + Sync> = match *policy {
                    Policy::Consistent { .. } => Box::new(ring),
                    Policy::BoundedLoads { c, .. } => {
                        Box::new(BoundedLoads::build(ring, keys, c).map_err(err)?)
                    }
                    Policy::PowerOfD { d, .. } => {
                        let loads = addresses.iter().map(|&a| load(ci as ClusterIdx, a));
                        Box::new(PowerOfD::new(ring, d as usize, loads.collect()).map_err(err)?)
                    }
                };
                Ok(Family {
                    addresses,
                    selector: Some(selector),
                })
            };
            families.push([family(false)?, family(true)?]);
        }
        Ok(Servers { families })
    }

    /// Fills `out` with up to `max` servers of `cluster` (addresses of the family `v6` asks
    /// for) for the content key whose hash is `hash` ([`key_hash_of`]), most preferred first,
    /// skipping any already in `out`.
    fn pick_hashed_into(
        &self,
        cluster: ClusterIdx,
        v6: bool,
        hash: u64,
        max: usize,
        out: &mut Vec<IpAddr>,
    ) {
        let Some(family) = self.families.get(cluster as usize) else {
            return;
        };
        let family = &family[usize::from(v6)];
        let Some(selector) = &family.selector else {
            return;
        };
        let mut picked = [0 as ServerIdx; ANSWER_SERVERS + 1];
        let want = (max + 1).min(picked.len()).min(family.addresses.len());
        let n = selector.pick_hashed(hash, &mut picked[..want]);
        let mut added = 0;
        for &s in &picked[..n] {
            if added == max {
                break;
            }
            let a = family.addresses[s as usize];
            if !out.contains(&a) {
                out.push(a);
                added += 1;
            }
        }
    }

    /// The servers an answer names for `qname` (an A query if `!v6`, AAAA if `v6`): up to
    /// [`ANSWER_SERVERS`] of the primary cluster (none of the secondary's but a companion's:
    /// the module's doc).
    /// `key_buf` is scratch space for the content key.
    pub fn answer(
        &self,
        answer: &Answer,
        qname: &str,
        v6: bool,
        key_buf: &mut String,
        out: &mut Vec<IpAddr>,
    ) {
        self.answer_hashed(answer, key_hash_of(qname, key_buf), v6, out);
    }

    /// [`Self::answer`] for the hostname whose content key hashes to `hash` ([`key_hash_of`]).
    pub fn answer_hashed(&self, answer: &Answer, hash: u64, v6: bool, out: &mut Vec<IpAddr>) {
        out.clear();
        let companion = answer.secondary.filter(|_| answer.companion);
        let primary = ANSWER_SERVERS - companion.map_or(0, |_| COMPANION_SERVERS);
        if let Some(p) = answer.primary {
            self.pick_hashed_into(p, v6, hash, primary, out);
        }
        if let Some(c) = companion {
            self.pick_hashed_into(c, v6, hash, COMPANION_SERVERS, out);
        }
    }

    /// Starts loading what picking for `hash` among `cluster`'s servers of family `v6` reads,
    /// step `step` of [`PREFETCH_STEPS`]: the cluster's entry; its selector and addresses; the
    /// ring's index entry; the ring's first point. A caller answering many queries runs each
    /// step over all of them before the next (each step reads what the one before loaded),
    /// then picks: the cache misses of one query overlap the others'. Only a hint: no result
    /// depends on it.
    pub fn prefetch(&self, cluster: ClusterIdx, v6: bool, hash: u64, step: u8) {
        use cdnmap_mapper::mem::{prefetch, prefetch_whole};
        let c = cluster as usize;
        if step == 0 {
            // Both families' entries (with the selectors' pointers): two cache lines.
            if let Some(f) = self.families.get(c) {
                prefetch_whole(f);
            }
            return;
        }
        let Some(family) = self.families.get(c).map(|f| &f[usize::from(v6)]) else {
            return;
        };
        let Some(selector) = &family.selector else {
            return;
        };
        match step {
            1 => {
                // The ring's columns and top-level shift: more than one cache line.
                prefetch_whole(selector.ring());
                prefetch(&family.addresses, 0);
            }
            2 => {
                let (index, i) = selector.ring().index_entry(hash);
                prefetch(index, i);
            }
            _ => {
                let (hashes, owners, p) = selector.ring().first_point(hash);
                prefetch(hashes, p);
                prefetch(owners, p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::model::Limits;
    use cdnmap_topology::format::parse_instance;
    use cdnmap_topology::Topology;

    fn instance() -> Topology {
        let cluster = |id: &str, addrs: &[&str]| {
            serde_json::json!({
                "id": id, "lat": 0.0, "lon": 0.0, "addresses": addrs,
                "resources": {"name": "r", "kind": "bps", "capacity": 10.0, "classes": ["web"]}
            })
        };
        let doc = serde_json::json!({
            "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1.0, "fps": 0.0}}],
            "clusters": [
                cluster("a", &["192.0.2.1", "192.0.2.2", "192.0.2.3", "2001:db8::1"]),
                cluster("b", &["198.51.100.1"]),
            ],
            "map_units": [{"id": "u", "class": "web", "demand": 1.0,
                           "prefixes": ["10.0.0.0/8"], "lat": 0.0, "lon": 0.0,
                           "candidates": [{"cluster": "a", "score": 1.0}]}]
        });
        parse_instance(doc.to_string().as_bytes(), Limits::default()).expect("valid instance")
    }

    fn answer(primary: u32, secondary: Option<u32>) -> Answer {
        Answer {
            class: 0,
            unit: Some(0),
            scope_prefix_len: 8,
            prefix_len: 8,
            primary: Some(primary),
            secondary,
            companion: false,
            slot: Some(0),
            route: crate::resolve::Route::Mapped,
        }
    }

    /// A name's content key, read in place or copied and lower-cased, is the name lower-cased
    /// without its final dot and cut to the length bound at a character boundary, whatever the
    /// case; its hash is that key's.
    #[test]
    fn the_content_key_is_the_name_lower_cased_without_its_dot() {
        let long = format!("{}.example.", "a".repeat(300));
        let long_upper = format!("{}.example.", "É".repeat(200));
        for name in [
            "www.example.com.",
            "www.example.com",
            "WWW.Example.com.",
            "v-1_x.video.example.",
            ".",
            "",
            long.as_str(),
            long_upper.as_str(),
            "ÉCOLE.example.",
            "école.example",
        ] {
            let bare = name.strip_suffix('.').unwrap_or(name);
            let mut end = bare.len().min(MAX_QNAME_LEN);
            while !bare.is_char_boundary(end) {
                end -= 1;
            }
            let expected = bare[..end].to_ascii_lowercase();
            let mut buf = String::from("left over");
            assert_eq!(content_key(name, &mut buf), expected, "{name}");
            assert_eq!(
                key_hash_of(name, &mut buf),
                cdnmap_select::key_hash(&expected),
                "{name}"
            );
        }
    }

    /// An answer names distinct servers of its primary cluster only, of the query's family,
    /// three at most: never the secondary's (a resolver may put it first).
    #[test]
    fn answers_name_distinct_servers_of_the_primary_only() {
        let inst = instance();
        for policy in [
            Policy::Consistent { vnodes: 50 },
            Policy::BoundedLoads {
                vnodes: 50,
                c: 1.25,
            },
            Policy::PowerOfD { vnodes: 50, d: 2 },
        ] {
            let s = Servers::build(
                &ServingCluster::of_topology(&inst),
                &[policy; 2],
                |_, _| 0.0,
                &[("www.x", 1.0)],
            )
            .expect("builds");
            let (mut buf, mut out) = (String::new(), Vec::new());
            s.answer(&answer(0, Some(1)), "WWW.X.", false, &mut buf, &mut out);
            assert_eq!(out.len(), 3, "{policy:?}: {out:?}");
            assert!(out.iter().all(|a| a.to_string().starts_with("192.0.2.")));
            let mut distinct = out.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), 3, "{out:?}");
            // The key ignores case and the trailing dot.
            let mut again = Vec::new();
            s.answer(&answer(0, Some(1)), "www.x", false, &mut buf, &mut again);
            assert_eq!(out, again);
            // AAAA: the one IPv6 server; cluster b has none.
            s.answer(&answer(0, Some(1)), "www.x", true, &mut buf, &mut out);
            assert_eq!(out, vec!["2001:db8::1".parse::<IpAddr>().unwrap()]);
            // A primary with one server of the family: that one, nothing of the secondary's.
            s.answer(&answer(1, Some(0)), "www.x", false, &mut buf, &mut out);
            assert_eq!(out, vec!["198.51.100.1".parse::<IpAddr>().unwrap()]);
            // A companion (go with the winner): two of the primary's, then one of its.
            let with = Answer {
                companion: true,
                ..answer(0, Some(1))
            };
            s.answer(&with, "www.x", false, &mut buf, &mut out);
            assert_eq!(out.len(), 3, "{out:?}");
            assert!(out[..2]
                .iter()
                .all(|a| a.to_string().starts_with("192.0.2.")));
            assert_eq!(out[..2], again[..2], "the primary's picks, less the last");
            assert_eq!(out[2], "198.51.100.1".parse::<IpAddr>().unwrap());
            // Its AAAA: the primary's one; the companion has no IPv6 server.
            s.answer(&with, "www.x", true, &mut buf, &mut out);
            assert_eq!(out, vec!["2001:db8::1".parse::<IpAddr>().unwrap()]);
        }
    }

    #[test]
    fn power_of_d_avoids_the_loaded_server() {
        let inst = instance();
        let loaded: IpAddr = "192.0.2.1".parse().unwrap();
        let s = Servers::build(
            &ServingCluster::of_topology(&inst),
            &[Policy::PowerOfD { vnodes: 50, d: 3 }; 2],
            |c, a| if c == 0 && a == loaded { 100.0 } else { 1.0 },
            &[],
        )
        .expect("builds");
        let (mut buf, mut out) = (String::new(), Vec::new());
        for i in 0..200 {
            s.answer(
                &answer(0, None),
                &format!("n{i}.x"),
                false,
                &mut buf,
                &mut out,
            );
            assert_ne!(
                out[0], loaded,
                "d = all servers: the loaded one is never first"
            );
        }
    }

    #[test]
    fn bad_policies_and_counts_are_refused() {
        let inst = instance();
        let e = Servers::build(
            &ServingCluster::of_topology(&inst),
            &[Policy::default()],
            |_, _| 0.0,
            &[],
        )
        .unwrap_err();
        assert_eq!(
            e,
            ServersError::PolicyCount {
                got: 1,
                clusters: 2
            }
        );
        let bad = [
            Policy::BoundedLoads { vnodes: 10, c: 1.0 },
            Policy::default(),
        ];
        let e =
            Servers::build(&ServingCluster::of_topology(&inst), &bad, |_, _| 0.0, &[]).unwrap_err();
        assert!(e.to_string().contains("cluster \"a\"") && e.to_string().contains("c is 1"));
        let bad = [Policy::PowerOfD { vnodes: 0, d: 2 }, Policy::default()];
        assert!(
            Servers::build(&ServingCluster::of_topology(&inst), &bad, |_, _| 0.0, &[]).is_err()
        );
    }
}
