//! In-cluster server selection (DESIGN.md, "Within a cluster"): which servers of the chosen
//! cluster a DNS answer names for a hostname.
//!
//! Every policy implements one small trait, [`Selector`], and follows build → immutable → query:
//! a policy is built once from the cluster's servers (and, for power-of-d, the last reported
//! loads) and then answers lookups without allocating. Keys (hostnames) are hashed with xxh3.
//!
//! - [`Ring`]: consistent hashing with virtual nodes. Each server is placed `vnodes` times (times
//!   its weight) on a 64-bit ring, at `xxh3(id ‖ 0xff ‖ replica)`; a key belongs to the first
//!   point clockwise from `xxh3(key)`; further picks are the next distinct servers clockwise.
//!   Points are ordered by (hash, server id), never by server index, so ownership depends only
//!   on the ids present: adding a server takes keys only from its ring neighbours, removing one
//!   moves only its own keys.
//! - [`BoundedLoads`]: consistent hashing with bounded loads (factor c > 1) over a known,
//!   weighted key set. Keys are placed in the order given; a server accepts a key while its load
//!   is below `c × average`, else the key walks on clockwise. With unit weights no server ends
//!   above `⌈c × average⌉`; with weights no server ends at or above `c × average + max weight`.
//! - [`PowerOfD`]: the least loaded (by the last reported loads) of the key's first `d` distinct
//!   servers clockwise on the ring; ties go to ring order.

use xxhash_rust::xxh3::xxh3_64;

/// A server's index within one selector: its position in the list the selector was built from.
pub type ServerIdx = u32;

/// Most servers a ring takes.
pub const MAX_SERVERS: usize = 1 << 16;
/// Most points (virtual nodes over all servers) a ring takes.
pub const MAX_POINTS: usize = 1 << 24;
/// Most candidates power-of-d compares.
pub const MAX_D: usize = 16;

/// Why a selector could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    #[error("ring: no servers")]
    NoServers,
    #[error("ring: {count} servers, at most {MAX_SERVERS} allowed")]
    TooManyServers { count: usize },
    #[error("ring: server with an empty id (position {position})")]
    EmptyId { position: usize },
    #[error("ring: duplicate server id {id:?}")]
    DuplicateId { id: String },
    #[error("ring: vnodes is 0, must be at least 1")]
    ZeroVnodes,
    #[error("ring: {points} points, at most {MAX_POINTS} allowed")]
    TooManyPoints { points: usize },
    #[error("{subject}: {field} is {value}, {rule}")]
    BadNumber {
        subject: String,
        field: &'static str,
        value: f64,
        rule: &'static str,
    },
    #[error("power-of-d: {got} loads for {servers} servers")]
    LoadCount { got: usize, servers: usize },
}

/// One in-cluster selection policy: built once, then queried.
pub trait Selector {
    /// Fills `out` with up to `out.len()` distinct servers for `key`, most preferred first, and
    /// returns how many it wrote: `min(out.len(), servers)`.
    fn pick(&self, key: &str, out: &mut [ServerIdx]) -> usize {
        self.pick_hashed(key_hash(key), out)
    }

    /// [`Selector::pick`] for the key whose [`key_hash`] is `hash` (a caller answering many
    /// keys hashes each once, and can prefetch what the pick reads: [`Selector::ring`]).
    fn pick_hashed(&self, hash: u64, out: &mut [ServerIdx]) -> usize;

    /// The ring every policy walks.
    fn ring(&self) -> &Ring;
}

/// The least loaded of `candidates` by `loads[candidate]`, the earliest candidate on ties; `None`
/// when there are no candidates. Power-of-d's rule, kept apart so that `cdnmap simulate` drives
/// the balls-into-bins process with exactly the rule the selector uses.
///
/// Every candidate must index `loads`. Loads that do not compare (NaN) never win a comparison.
#[inline]
pub fn least_loaded<L: PartialOrd + Copy>(
    candidates: &[ServerIdx],
    loads: &[L],
) -> Option<ServerIdx> {
    let (&first, rest) = candidates.split_first()?;
    let mut best = first;
    let mut best_load = loads[first as usize];
    for &c in rest {
        let l = loads[c as usize];
        if l < best_load {
            best = c;
            best_load = l;
        }
    }
    Some(best)
}

/// The hash of a key (hostname) on the ring.
#[inline]
pub fn key_hash(key: &str) -> u64 {
    xxh3_64(key.as_bytes())
}

/// The ring position of replica `replica` of server `id`.
fn point_hash(buf: &mut Vec<u8>, id: &str, replica: u32) -> u64 {
    buf.clear();
    buf.extend_from_slice(id.as_bytes());
    buf.push(0xff); // never in UTF-8, so (id, replica) → bytes is injective
    buf.extend_from_slice(&replica.to_le_bytes());
    xxh3_64(buf)
}

/// Consistent hashing with virtual nodes.
#[derive(Debug, Clone)]
pub struct Ring {
    ids: Vec<String>,
    /// Point hashes, ascending (ties by server id).
    hashes: Vec<u64>,
    /// `owners[i]` owns point `hashes[i]`.
    owners: Vec<ServerIdx>,
    /// `index[b]` is the first point whose top bits are `>= b`; `index.len() = 2^bits + 1`.
    index: Vec<u32>,
    /// `64 - bits`.
    shift: u32,
}

impl Ring {
    /// A ring with every server placed `vnodes` times.
    pub fn new(ids: &[&str], vnodes: u32) -> Result<Ring, SelectError> {
        let servers: Vec<(&str, f64)> = ids.iter().map(|&id| (id, 1.0)).collect();
        Ring::weighted(&servers, vnodes)
    }

    /// A ring with server `(id, weight)` placed `max(1, round(weight × vnodes))` times.
    pub fn weighted(servers: &[(&str, f64)], vnodes: u32) -> Result<Ring, SelectError> {
        if servers.is_empty() {
            return Err(SelectError::NoServers);
        }
        if servers.len() > MAX_SERVERS {
            return Err(SelectError::TooManyServers {
                count: servers.len(),
            });
        }
        if vnodes == 0 {
            return Err(SelectError::ZeroVnodes);
        }
        let mut seen = std::collections::HashSet::with_capacity(servers.len());
        let mut counts = Vec::with_capacity(servers.len());
        let mut total: usize = 0;
        for (position, &(id, weight)) in servers.iter().enumerate() {
            if id.is_empty() {
                return Err(SelectError::EmptyId { position });
            }
            if !seen.insert(id) {
                return Err(SelectError::DuplicateId { id: id.to_string() });
            }
            if !(weight.is_finite() && weight > 0.0) {
                return Err(SelectError::BadNumber {
                    subject: format!("ring server {id:?}"),
                    field: "weight",
                    value: weight,
                    rule: "must be finite and positive",
                });
            }
            let points = (weight * f64::from(vnodes)).round();
            if points > MAX_POINTS as f64 {
                return Err(SelectError::TooManyPoints {
                    points: MAX_POINTS + 1,
                });
            }
            let points = (points as usize).max(1);
            total += points;
            if total > MAX_POINTS {
                return Err(SelectError::TooManyPoints { points: total });
            }
            counts.push(points as u32);
        }

        let ids: Vec<String> = servers.iter().map(|&(id, _)| id.to_string()).collect();
        let mut points: Vec<(u64, ServerIdx)> = Vec::with_capacity(total);
        let mut buf = Vec::new();
        for (s, (&count, id)) in counts.iter().zip(&ids).enumerate() {
            for replica in 0..count {
                points.push((point_hash(&mut buf, id, replica), s as ServerIdx));
            }
        }
        points.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| ids[a.1 as usize].cmp(&ids[b.1 as usize]))
        });
        let hashes: Vec<u64> = points.iter().map(|p| p.0).collect();
        let owners: Vec<ServerIdx> = points.iter().map(|p| p.1).collect();

        // About one point per bucket of the top-level index.
        let bits = total.next_power_of_two().trailing_zeros().clamp(1, 24);
        let shift = 64 - bits;
        let buckets = 1usize << bits;
        let mut index = Vec::with_capacity(buckets + 1);
        let mut p = 0usize;
        for b in 0..buckets {
            while p < hashes.len() && ((hashes[p] >> shift) as usize) < b {
                p += 1;
            }
            index.push(p as u32);
        }
        index.push(hashes.len() as u32);

        let ring = Ring {
            ids,
            hashes,
            owners,
            index,
            shift,
        };
        debug_assert!(ring.hashes.windows(2).all(|w| w[0] <= w[1]));
        debug_assert_eq!(ring.index.len(), buckets + 1);
        Ok(ring)
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.ids.len()
    }

    /// Number of points (virtual nodes) on the ring.
    pub fn points(&self) -> usize {
        self.hashes.len()
    }

    /// The id of server `s`.
    pub fn id(&self, s: ServerIdx) -> &str {
        &self.ids[s as usize]
    }

    /// All server ids, in index order.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The point a hash belongs to: the first point clockwise (`>= hash`, wrapping to 0).
    #[inline]
    pub fn position(&self, hash: u64) -> usize {
        let b = (hash >> self.shift) as usize;
        let lo = self.index[b] as usize;
        let hi = self.index[b + 1] as usize;
        let p = lo + self.hashes[lo..hi].partition_point(|&x| x < hash);
        if p == self.hashes.len() {
            0
        } else {
            p
        }
    }

    /// Where a pick for `hash` reads, in order: the top-level index's entry (`index()[i]`),
    /// then the points from `hashes()[p]` and `owners()[p]` on, `p` being `first_point`'s
    /// (which reads the index): for a caller that prefetches them.
    pub fn index_entry(&self, hash: u64) -> (&[u32], usize) {
        (&self.index, (hash >> self.shift) as usize)
    }

    /// The first point a pick for `hash` reads (see [`Ring::index_entry`]), with the two
    /// columns it reads there.
    pub fn first_point(&self, hash: u64) -> (&[u64], &[ServerIdx], usize) {
        let p = self.index[(hash >> self.shift) as usize] as usize;
        (&self.hashes, &self.owners, p)
    }

    /// The owner of point `position`.
    #[inline]
    pub fn owner_at(&self, position: usize) -> ServerIdx {
        self.owners[position]
    }

    /// The server a hash belongs to.
    #[inline]
    pub fn primary_hash(&self, hash: u64) -> ServerIdx {
        self.owners[self.position(hash)]
    }

    /// The server a key belongs to.
    #[inline]
    pub fn primary(&self, key: &str) -> ServerIdx {
        self.primary_hash(key_hash(key))
    }

    /// Distinct servers clockwise from point `start` (the owner of `start` first) into `out`;
    /// returns how many were written: `min(out.len(), servers)`.
    pub fn walk_from(&self, start: usize, out: &mut [ServerIdx]) -> usize {
        self.walk_after(start, out, 0)
    }

    /// Like [`Ring::walk_from`], keeping the `filled` servers already at the front of `out`
    /// (distinct) and adding the next distinct ones clockwise from `start`.
    pub fn walk_after(&self, start: usize, out: &mut [ServerIdx], filled: usize) -> usize {
        let want = out.len().min(self.ids.len());
        let mut n = filled.min(want);
        let len = self.owners.len();
        let mut p = start;
        // Every server owns a point, so one turn of the ring finds `want` servers.
        for _ in 0..len {
            if n == want {
                break;
            }
            let s = self.owners[p];
            if !out[..n].contains(&s) {
                out[n] = s;
                n += 1;
            }
            p += 1;
            if p == len {
                p = 0;
            }
        }
        debug_assert_eq!(n, want);
        n
    }
}

impl Selector for Ring {
    #[inline]
    fn pick_hashed(&self, hash: u64, out: &mut [ServerIdx]) -> usize {
        if out.len() == 1 {
            out[0] = self.primary_hash(hash);
            return 1;
        }
        self.walk_from(self.position(hash), out)
    }

    fn ring(&self) -> &Ring {
        self
    }
}

/// Consistent hashing with bounded loads over a known, weighted key set.
#[derive(Debug, Clone)]
pub struct BoundedLoads {
    ring: Ring,
    /// Key hash → assigned server, sorted by hash for binary search.
    assigned: Vec<(u64, ServerIdx)>,
}

impl BoundedLoads {
    /// The load limit: a server accepts a key while its load is below `c × total / servers`.
    /// A limit within a relative 1e-12 of an integer is snapped to it, so that rounding in
    /// `c × total / servers` (1.1 × 100000 / 100 = 1100.0000000000002) cannot let a unit-weight
    /// server reach `⌈c × average⌉ + 1`.
    pub fn limit(total_weight: f64, servers: usize, c: f64) -> f64 {
        let limit = c * total_weight / servers as f64;
        let nearest = limit.round();
        if (limit - nearest).abs() <= 1e-12 * nearest.abs().max(1.0) {
            nearest
        } else {
            limit
        }
    }

    /// Assigns each key, in the order given, to the first server clockwise from the key whose
    /// load is below [`BoundedLoads::limit`]. Deterministic in the key order.
    ///
    /// Bounds: with unit weights no server ends above `⌈c × average⌉`; with weights no server
    /// ends at or above `c × average + max weight`. Such a server always exists: before a key is
    /// placed the placed weight is below the total, which is below `servers × limit`.
    pub fn assign(
        ring: &Ring,
        keys: &[(&str, f64)],
        c: f64,
    ) -> Result<Vec<ServerIdx>, SelectError> {
        // Above 1 by more than the limit's snapping tolerance, so a server below it always exists.
        if !(c.is_finite() && c >= 1.0 + 1e-9) {
            return Err(SelectError::BadNumber {
                subject: "bounded loads".to_string(),
                field: "c",
                value: c,
                rule: "must be finite and at least 1 + 1e-9",
            });
        }
        let mut total = 0.0;
        for &(key, w) in keys {
            if !(w.is_finite() && w > 0.0) {
                return Err(SelectError::BadNumber {
                    subject: format!("bounded loads key {key:?}"),
                    field: "weight",
                    value: w,
                    rule: "must be finite and positive",
                });
            }
            total += w;
        }
        let limit = BoundedLoads::limit(total, ring.servers(), c);
        let mut load = vec![0.0f64; ring.servers()];
        let mut out = Vec::with_capacity(keys.len());
        let len = ring.points();
        for &(key, w) in keys {
            let mut p = ring.position(key_hash(key));
            let mut chosen = None;
            for _ in 0..len {
                let s = ring.owner_at(p);
                if load[s as usize] < limit {
                    chosen = Some(s);
                    break;
                }
                p += 1;
                if p == len {
                    p = 0;
                }
            }
            let s = chosen.expect("some server is below the limit while weight is unplaced");
            load[s as usize] += w;
            out.push(s);
        }
        let max_w = keys.iter().map(|k| k.1).fold(0.0, f64::max);
        assert!(load.iter().all(|&l| l < limit + max_w || l == 0.0));
        Ok(out)
    }

    /// A selector answering the assigned server of each key in `keys` first, then the ring's
    /// next distinct servers; keys outside the set get the plain ring answer.
    pub fn build(ring: Ring, keys: &[(&str, f64)], c: f64) -> Result<BoundedLoads, SelectError> {
        let servers = BoundedLoads::assign(&ring, keys, c)?;
        let mut assigned: Vec<(u64, ServerIdx)> = keys
            .iter()
            .zip(&servers)
            .map(|(&(key, _), &s)| (key_hash(key), s))
            .collect();
        // A repeated key keeps its first assignment.
        assigned.sort_by_key(|a| a.0);
        assigned.dedup_by_key(|a| a.0);
        Ok(BoundedLoads { ring, assigned })
    }
}

impl Selector for BoundedLoads {
    fn ring(&self) -> &Ring {
        &self.ring
    }

    fn pick_hashed(&self, h: u64, out: &mut [ServerIdx]) -> usize {
        let Ok(i) = self.assigned.binary_search_by_key(&h, |a| a.0) else {
            return self.ring.walk_from(self.ring.position(h), out);
        };
        if out.is_empty() {
            return 0;
        }
        out[0] = self.assigned[i].1;
        // The rest: the ring's distinct servers clockwise from the key, skipping the first.
        self.ring.walk_after(self.ring.position(h), out, 1)
    }
}

/// Power-of-d choices: the least loaded of the key's first `d` distinct servers clockwise.
#[derive(Debug, Clone)]
pub struct PowerOfD {
    ring: Ring,
    d: usize,
    loads: Vec<f64>,
}

impl PowerOfD {
    /// `loads[s]` is server `s`'s last reported load (any unit, finite, non-negative).
    pub fn new(ring: Ring, d: usize, loads: Vec<f64>) -> Result<PowerOfD, SelectError> {
        if !(1..=MAX_D).contains(&d) {
            return Err(SelectError::BadNumber {
                subject: "power-of-d".to_string(),
                field: "d",
                value: d as f64,
                rule: "must be between 1 and 16",
            });
        }
        if loads.len() != ring.servers() {
            return Err(SelectError::LoadCount {
                got: loads.len(),
                servers: ring.servers(),
            });
        }
        for (s, &l) in loads.iter().enumerate() {
            if !(l.is_finite() && l >= 0.0) {
                return Err(SelectError::BadNumber {
                    subject: format!("power-of-d server {:?}", ring.ids()[s]),
                    field: "load",
                    value: l,
                    rule: "must be finite and non-negative",
                });
            }
        }
        // -0.0 → +0.0, so that `total_cmp` (the sort below) and `<` (`least_loaded`) agree.
        let loads = loads.into_iter().map(|l| l + 0.0).collect();
        Ok(PowerOfD { ring, d, loads })
    }
}

impl Selector for PowerOfD {
    fn ring(&self) -> &Ring {
        &self.ring
    }

    fn pick_hashed(&self, hash: u64, out: &mut [ServerIdx]) -> usize {
        let start = self.ring.position(hash);
        let want = self.d.max(out.len());
        if want <= MAX_D {
            let mut cand = [0 as ServerIdx; MAX_D];
            let n = self.ring.walk_from(start, &mut cand[..want]);
            let k = n.min(self.d);
            if out.len() == 1 {
                // One answer: the least loaded candidate, the rule `cdnmap simulate` also runs.
                match least_loaded(&cand[..k], &self.loads) {
                    Some(s) => out[0] = s,
                    None => return 0,
                }
                return 1;
            }
            // The first `d` candidates compete on load; a stable sort keeps ring order on ties,
            // so the first is `least_loaded`'s pick.
            cand[..k].sort_by(|&a, &b| self.loads[a as usize].total_cmp(&self.loads[b as usize]));
            let m = n.min(out.len());
            out[..m].copy_from_slice(&cand[..m]);
            m
        } else {
            // More answers wanted than MAX_D (so more than d): walk straight into `out`.
            let n = self.ring.walk_from(start, out);
            let k = n.min(self.d);
            out[..k].sort_by(|&a, &b| self.loads[a as usize].total_cmp(&self.loads[b as usize]));
            n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_loaded_takes_the_earliest_of_the_lightest() {
        let loads = [3u32, 1, 1, 0, 5];
        assert_eq!(least_loaded(&[], &loads), None);
        assert_eq!(least_loaded(&[4], &loads), Some(4));
        assert_eq!(least_loaded(&[0, 2, 1], &loads), Some(2));
        assert_eq!(least_loaded(&[4, 3, 0], &loads), Some(3));
        assert_eq!(least_loaded(&[1, 1], &[f64::NAN, 0.0]), Some(1));
    }

    #[test]
    fn power_of_d_single_answer_is_the_head_of_the_full_answer() {
        let ids: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let ring = Ring::new(&refs, 40).expect("ring");
        // Many ties (loads mod 3), and a -0.0 beside +0.0.
        let mut loads: Vec<f64> = (0..20).map(|i| f64::from(i % 3)).collect();
        loads[4] = -0.0;
        for d in 1..=4 {
            let p = PowerOfD::new(ring.clone(), d, loads.clone()).expect("power-of-d");
            for k in 0..500 {
                let key = format!("obj{k}.example");
                let (mut one, mut all) = ([0; 1], [0; 4]);
                assert_eq!(p.pick(&key, &mut one), 1);
                p.pick(&key, &mut all);
                assert_eq!(one[0], all[0], "key {key}, d {d}");
            }
        }
    }
}
