//! The encodings of a stored map version: the record (what the round changed of its base
//! topology, and the map, compactly) and the record of the format before, still read.

use cdnmap_mapper::{Instance, Limits, Map};
use cdnmap_topology::Topology;
use serde::{Deserialize, Serialize};

use super::ServedRef;

/// The served record's header: its format and version.
pub(super) const SERVED_MAGIC: &[u8; 8] = b"CDNSRV04";
/// The served record of the format before (the whole estimator state inline), still read.
pub(super) const SERVED_MAGIC_03: &[u8; 8] = b"CDNSRV03";

/// A stored topology (the store's own, or a record's base): the compact form, or the JSON
/// instance file an older build wrote.
pub(super) fn decode_topology(bytes: &[u8], limits: Limits) -> Result<Topology, String> {
    if bytes.starts_with(cdnmap_topology::compact::MAGIC) {
        cdnmap_topology::compact::decode(bytes, limits).map_err(|e| e.to_string())
    } else {
        cdnmap_topology::format::parse_instance(bytes, limits).map_err(|e| e.to_string())
    }
}

/// A record's bytes decoded: the record, and the estimator state a record of format 03
/// carries inline after it.
pub(super) fn decode(bytes: &[u8]) -> Result<(Stored, Option<Vec<u8>>), String> {
    if let Some(body) = bytes.strip_prefix(SERVED_MAGIC.as_slice()) {
        let record: Record = postcard::from_bytes(body).map_err(|e| e.to_string())?;
        return Ok((Stored::Now(record), None));
    }
    let Some(body) = bytes.strip_prefix(SERVED_MAGIC_03.as_slice()) else {
        return Err(format!(
            "its header is not {:?}",
            String::from_utf8_lossy(SERVED_MAGIC)
        ));
    };
    let (record, rest): (Record03, &[u8]) =
        postcard::take_from_bytes(body).map_err(|e| e.to_string())?;
    let (len, state) = rest.split_at(8.min(rest.len()));
    let len = <[u8; 8]>::try_from(len)
        .map(u64::from_le_bytes)
        .map_err(|_| "cut short before the estimator's state".to_string())?;
    if len != state.len() as u64 {
        return Err(format!(
            "the estimator's state is {} bytes where {len} were written",
            state.len()
        ));
    }
    Ok((Stored::Format03(record), Some(state.to_vec())))
}

/// The served record after its header (postcard): what the round changed of its base
/// topology, and the map. The estimator's state is not in it: the round's entry is written
/// beside it in the same batch, and the whole state now and then ([`Store::put_checkpoint`]).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) epoch: u64,
    pub(super) version: u64,
    pub(super) solved_at_unix_ms: i64,
    /// The topology the round was solved from, as the record's file name says: the journal's
    /// sequence number of its last edit (`map-<version>-j<seq>`), or the generation of an
    /// older build's base file (`map-<version>-<generation>`).
    pub(super) base_generation: u64,
    pub(super) demands: Vec<f64>,
    pub(super) per_unit: Vec<cdnmap_mapper::PerUnit>,
    pub(super) capacities: Vec<f64>,
    pub(super) map: CompactMap,
}

impl Record {
    pub(super) fn of(s: &ServedRef<'_>) -> Record {
        let inst = s.instance;
        let demands: Vec<f64> = (0..inst.unit_count() as u32)
            .map(|u| inst.unit_demand(u))
            .collect();
        Record {
            epoch: s.epoch,
            version: s.version,
            solved_at_unix_ms: s.solved_at_unix_ms,
            base_generation: s.base_seq,
            map: CompactMap::of(s.map, Some(&demands)),
            demands,
            per_unit: inst.classes().iter().map(|c| c.per_unit).collect(),
            capacities: inst.capacities(),
        }
    }
}

/// The record of format 03 (read only): the map as [`MapColumns`], the estimator's whole
/// state after it.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(Serialize))]
pub(super) struct Record03 {
    pub(super) epoch: u64,
    pub(super) version: u64,
    pub(super) solved_at_unix_ms: i64,
    pub(super) base_generation: u64,
    pub(super) demands: Vec<f64>,
    pub(super) per_unit: Vec<cdnmap_mapper::PerUnit>,
    pub(super) capacities: Vec<f64>,
    pub(super) map: MapColumns,
}

/// A served record as read, of either format.
pub(super) enum Stored {
    Now(Record),
    Format03(Record03),
}

impl Stored {
    /// (epoch, version, solved at, base generation).
    pub(super) fn identity(&self) -> (u64, u64, i64, u64) {
        match self {
            Stored::Now(r) => (r.epoch, r.version, r.solved_at_unix_ms, r.base_generation),
            Stored::Format03(r) => (r.epoch, r.version, r.solved_at_unix_ms, r.base_generation),
        }
    }

    /// The round's instance (`base` with the round's demands, coefficients and capacities)
    /// and its map, checked against it.
    pub(super) fn instance_and_map(self, base: &Topology) -> Result<(Topology, Map), String> {
        let (demands, per_unit, capacities) = match &self {
            Stored::Now(r) => (r.demands.clone(), &r.per_unit, &r.capacities),
            Stored::Format03(r) => (r.demands.clone(), &r.per_unit, &r.capacities),
        };
        let instance = base
            .with_demands(demands)
            .and_then(|i| i.with_capacities(per_unit, capacities))
            .map_err(|e| format!("its instance: {e}"))?;
        let instance = base.with_instance(instance);
        let map = match &self {
            Stored::Now(r) => r.map.to_map(&instance),
            Stored::Format03(r) => r.map.to_map(&instance),
        }
        .map_err(|e| format!("its map: {e}"))?;
        Ok((instance, map))
    }
}

/// A map, compactly: per unit `count << 1 | whole`, where `whole` says the unit's one
/// allocation is its whole demand (bit for bit, so its amount is not stored: most units at
/// most rounds); the clusters and the other amounts in unit order; overflow only where there
/// is some. About 3 bytes a unit where [`MapColumns`] took 17 or more.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct CompactMap {
    pub(super) count: Vec<u32>,
    pub(super) cluster: Vec<u32>,
    pub(super) amount: Vec<f64>,
    pub(super) overflow: Vec<(u32, f64)>,
}

impl CompactMap {
    /// `map` with `demands` (by unit) to leave whole-demand amounts out; `None` stores every
    /// amount (a map read without its instance).
    pub(super) fn of(map: &Map, demands: Option<&[f64]>) -> CompactMap {
        let n = map.unit_count();
        let mut out = CompactMap {
            count: Vec::with_capacity(n),
            cluster: Vec::with_capacity(n),
            amount: Vec::new(),
            overflow: Vec::new(),
        };
        for u in 0..n as u32 {
            let a = map.allocations(u);
            let overflow = map.overflow(u);
            let whole = match (a, demands.and_then(|d| d.get(u as usize))) {
                ([only], Some(d)) => overflow == 0.0 && only.amount.to_bits() == d.to_bits(),
                _ => false,
            };
            out.count.push((a.len() as u32) << 1 | u32::from(whole));
            out.cluster.extend(a.iter().map(|x| x.cluster));
            if !whole {
                out.amount.extend(a.iter().map(|x| x.amount));
            }
            if overflow != 0.0 || overflow.is_sign_negative() {
                out.overflow.push((u, overflow));
            }
        }
        out
    }

    /// The map, checked against `instance` (whose demands the whole amounts are): one entry
    /// per unit, known clusters, amounts that are numbers, every column used up exactly.
    pub(super) fn to_map(&self, instance: &Instance) -> Result<Map, String> {
        let n = instance.unit_count();
        if self.count.len() != n {
            return Err(format!("{} units, the instance {n}", self.count.len()));
        }
        let clusters = instance.clusters().len() as u32;
        let mut map = Map::with_capacity(n, self.cluster.len());
        let (mut at, mut amounts, mut over) = (0usize, self.amount.iter(), self.overflow.iter());
        let mut next_over = over.next();
        for (u, &c) in self.count.iter().enumerate() {
            let (k, whole) = ((c >> 1) as usize, c & 1 == 1);
            if whole && k != 1 {
                return Err(format!("unit {u}: a whole demand in {k} allocations"));
            }
            let end = at
                .checked_add(k)
                .filter(|&e| e <= self.cluster.len())
                .ok_or_else(|| format!("unit {u}: allocations past the end"))?;
            let mut allocs = Vec::with_capacity(k);
            for &cl in &self.cluster[at..end] {
                let amount = if whole {
                    instance.unit_demand(u as u32)
                } else {
                    *amounts
                        .next()
                        .ok_or_else(|| format!("unit {u}: amounts past the end"))?
                };
                if cl >= clusters || !amount.is_finite() {
                    return Err(format!(
                        "unit {u}: allocation ({cl}, {amount}) is not valid"
                    ));
                }
                allocs.push(cdnmap_mapper::Allocation {
                    cluster: cl,
                    amount,
                });
            }
            let overflow = match next_over {
                Some(&(v, x)) if v as usize == u => {
                    next_over = over.next();
                    if !x.is_finite() {
                        return Err(format!("unit {u}: overflow {x} is not a number"));
                    }
                    x
                }
                _ => 0.0,
            };
            map.push_unit(allocs, overflow);
            at = end;
        }
        if at != self.cluster.len() || amounts.next().is_some() || next_over.is_some() {
            return Err("allocations or overflow left after the last unit".into());
        }
        Ok(map)
    }
}

/// A map as format 03 stored it (read only): per unit its allocation count and overflow; per
/// allocation its cluster index and amount.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct MapColumns {
    pub(super) count: Vec<u32>,
    pub(super) overflow: Vec<f64>,
    pub(super) cluster: Vec<u32>,
    pub(super) amount: Vec<f64>,
}

impl MapColumns {
    /// The map, checked against `instance`: one entry per unit, known clusters, amounts that
    /// are numbers.
    pub(super) fn to_map(&self, instance: &Instance) -> Result<Map, String> {
        let n = instance.unit_count();
        if self.count.len() != n || self.overflow.len() != n {
            return Err(format!("{} units, the instance {n}", self.count.len()));
        }
        if self.cluster.len() != self.amount.len() {
            return Err("allocation columns of different lengths".into());
        }
        let clusters = instance.clusters().len() as u32;
        let mut map = Map::with_capacity(n, self.cluster.len());
        let mut at = 0usize;
        for (u, &k) in self.count.iter().enumerate() {
            let end = at
                .checked_add(k as usize)
                .filter(|&e| e <= self.cluster.len())
                .ok_or_else(|| format!("unit {u}: allocations past the end"))?;
            let mut allocs = Vec::with_capacity(k as usize);
            for i in at..end {
                let (c, x) = (self.cluster[i], self.amount[i]);
                if c >= clusters || !x.is_finite() {
                    return Err(format!("unit {u}: allocation ({c}, {x}) is not valid"));
                }
                allocs.push(cdnmap_mapper::Allocation {
                    cluster: c,
                    amount: x,
                });
            }
            map.push_unit(allocs, self.overflow[u]);
            at = end;
        }
        if at != self.cluster.len() {
            return Err("allocations left after the last unit".into());
        }
        Ok(map)
    }
}
