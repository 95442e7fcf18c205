//! The encodings of a stored map version: the record (what the round changed of its base
//! topology, and the map, compactly), the delta that an older version of the history is
//! kept as (what differs from the next newer record, [`Delta`]), and the records of the
//! formats before, still read.

use cdnmap_estimator::demand_code;
use cdnmap_mapper::{companion, Instance, Limits, Map, PerUnit};
use cdnmap_topology::Topology;
use serde::{Deserialize, Serialize};

use super::ServedRef;

/// The served record's header: its format and version.
pub(super) const SERVED_MAGIC: &[u8; 8] = b"CDNSRV06";
/// The record of the format before (the same layout; no unit has a companion, the count
/// word's bit 31, [`CompactMap`]), still read.
pub(super) const SERVED_MAGIC_05: &[u8; 8] = b"CDNSRV05";
/// The record of the format before (the demands as `f64`s), still read.
pub(super) const SERVED_MAGIC_04: &[u8; 8] = b"CDNSRV04";
/// The served record of the format before that (the whole estimator state inline), still read.
pub(super) const SERVED_MAGIC_03: &[u8; 8] = b"CDNSRV03";
/// A delta record's header ([`Delta`]).
pub(super) const DELTA_MAGIC: &[u8; 8] = b"CDNDLT01";

/// A stored topology (the store's own, or a record's base): the compact form, or the JSON
/// instance file an older build wrote.
pub(super) fn decode_topology(bytes: &[u8], limits: Limits) -> Result<Topology, String> {
    if bytes.starts_with(cdnmap_topology::compact::MAGIC) {
        cdnmap_topology::compact::decode(bytes, limits).map_err(|e| e.to_string())
    } else {
        cdnmap_topology::format::parse_instance(bytes, limits).map_err(|e| e.to_string())
    }
}

/// Writes `record` as a record file holds it: its header, then postcard.
pub(super) fn write(record: &Record, w: &mut dyn std::io::Write) -> std::io::Result<()> {
    w.write_all(SERVED_MAGIC)?;
    cdnmap_topology::compact::postcard_to_io(record, w)
}

/// Writes `delta` ([`Delta`], or [`DeltaOf`]: the same bytes) as a delta file holds it: its
/// header, then postcard.
pub(super) fn write_delta(
    delta: &impl Serialize,
    w: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    w.write_all(DELTA_MAGIC)?;
    cdnmap_topology::compact::postcard_to_io(delta, w)
}

/// A record's bytes decoded: the record, and the estimator state a record of format 03
/// carries inline after it.
pub(super) fn decode(bytes: &[u8]) -> Result<(Stored, Option<Vec<u8>>), String> {
    let now = bytes
        .strip_prefix(SERVED_MAGIC.as_slice())
        .or_else(|| bytes.strip_prefix(SERVED_MAGIC_05.as_slice()));
    if let Some(body) = now {
        let record: Record = postcard::from_bytes(body).map_err(|e| e.to_string())?;
        return Ok((Stored::Now(record), None));
    }
    if let Some(body) = bytes.strip_prefix(SERVED_MAGIC_04.as_slice()) {
        let record: Record04 = postcard::from_bytes(body).map_err(|e| e.to_string())?;
        return Ok((Stored::Now(record.into()), None));
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

/// A delta file's bytes decoded.
pub(super) fn decode_delta(bytes: &[u8]) -> Result<Delta, String> {
    let body = bytes.strip_prefix(DELTA_MAGIC.as_slice()).ok_or_else(|| {
        format!(
            "its header is not {:?}",
            String::from_utf8_lossy(DELTA_MAGIC)
        )
    })?;
    postcard::from_bytes(body).map_err(|e| e.to_string())
}

/// Epoch, version, solved at, base generation: what a record or a delta says of itself
/// first, in every format.
pub(super) type Identity = (u64, u64, i64, u64);

/// A record's or a delta's [`Identity`] and, for a delta, the version it is read against.
pub(super) fn identity(bytes: &[u8]) -> Result<(Identity, Option<u64>), String> {
    for magic in [
        SERVED_MAGIC,
        SERVED_MAGIC_05,
        SERVED_MAGIC_04,
        SERVED_MAGIC_03,
    ] {
        if let Some(body) = bytes.strip_prefix(magic.as_slice()) {
            let (id, _): (Identity, _) =
                postcard::take_from_bytes(body).map_err(|e| e.to_string())?;
            return Ok((id, None));
        }
    }
    if let Some(body) = bytes.strip_prefix(DELTA_MAGIC.as_slice()) {
        let ((id, against), _): ((Identity, u64), _) =
            postcard::take_from_bytes(body).map_err(|e| e.to_string())?;
        return Ok((id, Some(against)));
    }
    Err(format!(
        "its header is not {:?} nor {:?}",
        String::from_utf8_lossy(SERVED_MAGIC),
        String::from_utf8_lossy(DELTA_MAGIC)
    ))
}

/// The served record after its header (postcard): what the round changed of its base
/// topology, and the map. The estimator's state is not in it: the round's entry is written
/// beside it, and the whole state now and then ([`super::Store::put_checkpoint`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) epoch: u64,
    pub(super) version: u64,
    pub(super) solved_at_unix_ms: i64,
    /// The topology the round was solved from, as the record's file name says: the journal's
    /// sequence number of its last edit (`map-<version>-j<seq>`), or the generation of an
    /// older build's base file (`map-<version>-<generation>`).
    pub(super) base_generation: u64,
    pub(super) per_unit: Vec<PerUnit>,
    pub(super) capacities: Vec<f64>,
    pub(super) demands: Demands,
    pub(super) map: CompactMap,
}

impl Record {
    pub(super) fn of(s: &ServedRef<'_>) -> Record {
        let inst = s.instance;
        let demands = inst.demands();
        Record {
            epoch: s.epoch,
            version: s.version,
            solved_at_unix_ms: s.solved_at_unix_ms,
            base_generation: s.base_seq,
            map: CompactMap::of(s.map, Some(inst)),
            demands: Demands::of(demands),
            per_unit: inst.classes().iter().map(|c| c.per_unit).collect(),
            capacities: inst.capacities(),
        }
    }
}

/// A round's demands by unit, exactly: each demand that is the value of its 16-bit code
/// ([`demand_code`]: every forecast, since the estimator rounds them so) as that code, the
/// others (a configured demand of a unit never observed may be any `f64`) as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Demands {
    /// Per unit, its demand's code; 0 for a unit of `exceptions`.
    pub(super) codes: Codes,
    /// The units whose demand is not a code's value, in unit order: each the difference to
    /// the one before (the first: its index), so a run of them is a run of ones.
    pub(super) exception_units: Vec<u32>,
    /// Their demands, bit for bit.
    pub(super) exceptions: Vec<f64>,
}

impl Demands {
    pub(super) fn of(demands: &[f64]) -> Demands {
        let exact = |(c, d): (u16, &f64)| demand_code::decode(c).to_bits() == d.to_bits();
        let codes: Vec<u16> = demands.iter().map(|&d| demand_code::code(d)).collect();
        // Counted first, so that the columns are allocated once (at 11 M units of configured
        // demands, growing them was a second of a round).
        let n = codes
            .iter()
            .zip(demands)
            .filter(|&x| !exact((*x.0, x.1)))
            .count();
        let mut out = Demands {
            codes: Codes(codes),
            exception_units: Vec::with_capacity(n),
            exceptions: Vec::with_capacity(n),
        };
        if n == 0 {
            return out;
        }
        let mut last = 0u32;
        for (u, (c, d)) in out.codes.0.iter_mut().zip(demands).enumerate() {
            if !exact((*c, d)) {
                *c = 0;
                out.exception_units.push(u as u32 - last);
                out.exceptions.push(*d);
                last = u as u32;
            }
        }
        out
    }

    /// The demand of each unit; a code that is no demand's, or exceptions out of order or
    /// past the last unit, are refused.
    pub(super) fn to_vec(&self) -> Result<Vec<f64>, String> {
        if self.exception_units.len() != self.exceptions.len() {
            return Err(format!(
                "{} exceptions' units but {} demands",
                self.exception_units.len(),
                self.exceptions.len()
            ));
        }
        let mut out = Vec::with_capacity(self.codes.0.len());
        for (u, &c) in self.codes.0.iter().enumerate() {
            if c > demand_code::MAX_CODE {
                return Err(format!("unit {u}: demand code {c:#06x} is not a demand's"));
            }
            out.push(demand_code::decode(c));
        }
        for (u, d) in exception_indices(&self.exception_units, out.len())?
            .into_iter()
            .zip(&self.exceptions)
        {
            out[u] = *d;
        }
        Ok(out)
    }
}

/// The unit indices of exceptions stored as differences (each after the one before, the
/// first from 0), checked to be in order and below `units`; and as many as `values`.
fn exception_indices(gaps: &[u32], units: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(gaps.len());
    let mut at = 0usize;
    for (i, &g) in gaps.iter().enumerate() {
        if i > 0 && g == 0 {
            return Err(format!("exception {i} repeats the unit before it"));
        }
        at = at
            .checked_add(g as usize)
            .filter(|&u| u < units)
            .ok_or_else(|| format!("exception {i} is past the last unit ({units})"))?;
        out.push(at);
    }
    Ok(out)
}

/// A column of 16-bit values stored as two byte planes, every value's low byte and then every
/// value's high byte: the high bytes (a demand code's exponent; a small difference's zero)
/// repeat, and zstd takes them away when they are not mixed with the low ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Codes(pub(super) Vec<u16>);

impl Serialize for Codes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut planes = Vec::with_capacity(2 * self.0.len());
        planes.extend(self.0.iter().map(|c| *c as u8));
        planes.extend(self.0.iter().map(|c| (c >> 8) as u8));
        s.serialize_bytes(&planes)
    }
}

impl<'de> Deserialize<'de> for Codes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Codes, D::Error> {
        struct Planes;
        impl serde::de::Visitor<'_> for Planes {
            type Value = Codes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("two byte planes of equal length")
            }
            fn visit_bytes<E: serde::de::Error>(self, b: &[u8]) -> Result<Codes, E> {
                if !b.len().is_multiple_of(2) {
                    return Err(E::custom(format!(
                        "byte planes of {} bytes, not two of one length",
                        b.len()
                    )));
                }
                let (lo, hi) = b.split_at(b.len() / 2);
                Ok(Codes(
                    lo.iter()
                        .zip(hi)
                        .map(|(&l, &h)| u16::from(l) | u16::from(h) << 8)
                        .collect(),
                ))
            }
        }
        d.deserialize_bytes(Planes)
    }
}

/// `x` with its sign in the lowest bit (0, -1, 1, -2 ... → 0, 1, 2, 3 ...): a small
/// difference either way is a small number.
fn zigzag16(x: u16) -> u16 {
    let x = x as i16;
    ((x << 1) ^ (x >> 15)) as u16
}

fn unzigzag16(z: u16) -> u16 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

fn zigzag32(x: u32) -> u32 {
    let x = x as i32;
    ((x << 1) ^ (x >> 31)) as u32
}

fn unzigzag32(z: u32) -> u32 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

/// An older version of the history as stored: what differs between its record and the next
/// newer one's (`against`), column by column, so that zstd takes away what is the same
/// (zeros). [`Delta::apply`] to the newer record gives the older record back bit for bit,
/// whatever the two hold (a topology edit between them may have moved every unit: the delta
/// is then as large as a record, and as right). The newest record is always whole; version
/// `v − k` is read by applying `k` deltas to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Delta {
    /// The older record's identity, as its own record said it.
    pub(super) epoch: u64,
    pub(super) version: u64,
    pub(super) solved_at_unix_ms: i64,
    pub(super) base_generation: u64,
    /// The version of the record this is read against (newer).
    pub(super) against: u64,
    /// The older record's coefficients and capacities (a few numbers: stored as they are).
    pub(super) per_unit: Vec<PerUnit>,
    pub(super) capacities: Vec<f64>,
    /// Per unit of the older record: its demand code minus the newer's of the same index (0
    /// past the newer's last unit), wrapping, zigzagged. Its length is the older unit count.
    pub(super) codes: Codes,
    /// The older record's exceptions' units, as its record has them.
    pub(super) exception_units: Vec<u32>,
    /// Each of those demands' bits XOR the newer's demand's of the same unit (0 past its
    /// end): 0 for a configured demand that did not change.
    pub(super) exceptions: Vec<u64>,
    /// Per unit: the older map's count word XOR the newer's (0 past its end).
    pub(super) count: Vec<u32>,
    /// Per allocation of the older map: its cluster minus the newer's at the same unit and
    /// position (0 where the newer has none), wrapping, zigzagged.
    pub(super) cluster: Vec<u32>,
    /// The older map's amounts and overflow as they are (split and overflowing units only:
    /// few).
    pub(super) amount: Vec<f64>,
    pub(super) overflow: Vec<(u32, f64)>,
}

/// The newer record's demand bits of each unit in `units` (increasing), 0 past its end.
fn demand_bits_at(newer: &Demands, units: &[usize]) -> Result<Vec<u64>, String> {
    let theirs = exception_indices(&newer.exception_units, newer.codes.0.len())?;
    let mut at = theirs.iter().zip(&newer.exceptions).peekable();
    let mut out = Vec::with_capacity(units.len());
    for &u in units {
        while at.next_if(|(v, _)| **v < u).is_some() {}
        let bits = match at.peek() {
            Some((v, d)) if **v == u => d.to_bits(),
            _ => newer
                .codes
                .0
                .get(u)
                .map_or(0, |&c| demand_code::decode(c).to_bits()),
        };
        out.push(bits);
    }
    Ok(out)
}

impl Delta {
    /// `older` as a delta against `newer`, in memory: what [`DeltaOf`] writes without
    /// gathering it (the tests hold the two to the same bytes); an error when a record's
    /// columns do not fit together.
    #[cfg(test)]
    pub(super) fn between(older: &Record, newer: &Record) -> Result<Delta, String> {
        let new_codes = &newer.demands.codes.0;
        let codes = older
            .demands
            .codes
            .0
            .iter()
            .enumerate()
            .map(|(u, &c)| zigzag16(c.wrapping_sub(new_codes.get(u).copied().unwrap_or(0))))
            .collect();
        let units = exception_indices(&older.demands.exception_units, older.demands.codes.0.len())?;
        let exceptions = demand_bits_at(&newer.demands, &units)?
            .into_iter()
            .zip(&older.demands.exceptions)
            .map(|(theirs, d)| d.to_bits() ^ theirs)
            .collect();
        let (om, nm) = (&older.map, &newer.map);
        let mut count = Vec::with_capacity(om.count.len());
        let mut cluster = Vec::with_capacity(om.cluster.len());
        let (mut at_old, mut at_new) = (0usize, 0usize);
        for (u, &c) in om.count.iter().enumerate() {
            let theirs = nm.count.get(u).copied().unwrap_or(0);
            count.push(c ^ theirs);
            let (k, k_new) = (count_of(c), count_of(theirs));
            for i in 0..k {
                let mine = om
                    .cluster
                    .get(at_old + i)
                    .ok_or("the older map's clusters end early")?;
                let base = if i < k_new {
                    *nm.cluster
                        .get(at_new + i)
                        .ok_or("the newer map's clusters end early")?
                } else {
                    0
                };
                cluster.push(zigzag32(mine.wrapping_sub(base)));
            }
            at_old += k;
            at_new += k_new;
        }
        Ok(Delta {
            epoch: older.epoch,
            version: older.version,
            solved_at_unix_ms: older.solved_at_unix_ms,
            base_generation: older.base_generation,
            against: newer.version,
            per_unit: older.per_unit.clone(),
            capacities: older.capacities.clone(),
            codes: Codes(codes),
            exception_units: older.demands.exception_units.clone(),
            exceptions,
            count,
            cluster,
            amount: om.amount.clone(),
            overflow: om.overflow.clone(),
        })
    }

    /// The older record, from `newer` (the record of version [`Delta::against`]). A delta
    /// whose columns do not fit together, or the newer record's, is refused, never a panic.
    pub(super) fn apply(&self, newer: &Record) -> Result<Record, String> {
        if newer.version != self.against {
            return Err(format!(
                "it is against version {}, not {}",
                self.against, newer.version
            ));
        }
        let n = self.codes.0.len();
        if self.count.len() != n {
            return Err(format!(
                "{n} demands but {} allocation counts",
                self.count.len()
            ));
        }
        let new_codes = &newer.demands.codes.0;
        let codes: Vec<u16> = self
            .codes
            .0
            .iter()
            .enumerate()
            .map(|(u, &z)| {
                new_codes
                    .get(u)
                    .copied()
                    .unwrap_or(0)
                    .wrapping_add(unzigzag16(z))
            })
            .collect();
        if self.exception_units.len() != self.exceptions.len() {
            return Err("exception columns of different lengths".into());
        }
        let units = exception_indices(&self.exception_units, n)?;
        let exceptions = demand_bits_at(&newer.demands, &units)?
            .into_iter()
            .zip(&self.exceptions)
            .map(|(theirs, x)| f64::from_bits(x ^ theirs))
            .collect();
        let nm = &newer.map;
        let mut count = Vec::with_capacity(n);
        let mut cluster = Vec::with_capacity(self.cluster.len());
        let mut deltas = self.cluster.iter();
        let mut at_new = 0usize;
        for (u, &x) in self.count.iter().enumerate() {
            let theirs = nm.count.get(u).copied().unwrap_or(0);
            let c = x ^ theirs;
            count.push(c);
            let (k, k_new) = (count_of(c), count_of(theirs));
            for i in 0..k {
                let z = deltas
                    .next()
                    .ok_or_else(|| format!("unit {u}: allocations past the end"))?;
                let base = if i < k_new {
                    *nm.cluster
                        .get(at_new + i)
                        .ok_or("the newer map's clusters end early")?
                } else {
                    0
                };
                cluster.push(base.wrapping_add(unzigzag32(*z)));
            }
            at_new += k_new;
        }
        if deltas.next().is_some() {
            return Err("allocations left after the last unit".into());
        }
        Ok(Record {
            epoch: self.epoch,
            version: self.version,
            solved_at_unix_ms: self.solved_at_unix_ms,
            base_generation: self.base_generation,
            per_unit: self.per_unit.clone(),
            capacities: self.capacities.clone(),
            demands: Demands {
                codes: Codes(codes),
                exception_units: self.exception_units.clone(),
                exceptions,
            },
            map: CompactMap {
                count,
                cluster,
                amount: self.amount.clone(),
                overflow: self.overflow.clone(),
            },
        })
    }
}

/// [`Delta::between`]`(older, newer)` as it is serialized, computed while it is written: the
/// same bytes, without the columns in memory (at 11 M units about 100 MB a round).
pub(super) struct DeltaOf<'a> {
    older: &'a Record,
    newer: &'a Record,
    /// The older record's exceptions' units (absolute).
    units: Vec<usize>,
}

impl<'a> DeltaOf<'a> {
    /// `older` against `newer`, once their columns are checked to fit together (each map's
    /// allocation counts add up to its clusters; exceptions in order and within the units):
    /// an error otherwise (the older one is then kept whole).
    pub(super) fn new(older: &'a Record, newer: &'a Record) -> Result<DeltaOf<'a>, String> {
        for (which, r) in [("older", older), ("newer", newer)] {
            let k: u64 = r.map.count.iter().map(|&c| count_of(c) as u64).sum();
            if k != r.map.cluster.len() as u64 {
                return Err(format!(
                    "the {which} map counts {k} allocations in {} clusters",
                    r.map.cluster.len()
                ));
            }
            if r.demands.exception_units.len() != r.demands.exceptions.len() {
                return Err(format!("the {which} record's exception columns differ"));
            }
        }
        exception_indices(&newer.demands.exception_units, newer.demands.codes.0.len())?;
        let units = exception_indices(&older.demands.exception_units, older.demands.codes.0.len())?;
        Ok(DeltaOf {
            older,
            newer,
            units,
        })
    }
}

/// A sequence serialized from an iterator of known length.
struct Seq<I>(std::cell::Cell<Option<I>>, usize);

impl<T: Serialize, I: Iterator<Item = T>> Serialize for Seq<I> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let items = self
            .0
            .take()
            .ok_or_else(|| S::Error::custom("serialized twice"))?;
        let mut seq = s.serialize_seq(Some(self.1))?;
        for x in items {
            seq.serialize_element(&x)?;
        }
        seq.end()
    }
}

fn seq<T: Serialize, I: Iterator<Item = T>>(items: I, len: usize) -> Seq<I> {
    Seq(std::cell::Cell::new(Some(items)), len)
}

impl Serialize for DeltaOf<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let (older, newer) = (self.older, self.newer);
        let (old_codes, new_codes) = (&older.demands.codes.0, &newer.demands.codes.0);
        let code =
            |u: usize| zigzag16(old_codes[u].wrapping_sub(new_codes.get(u).copied().unwrap_or(0)));
        let n = old_codes.len();
        // The two byte planes as a sequence of bytes: the bytes `Codes` is serialized as.
        let planes = seq(
            (0..n)
                .map(move |u| code(u) as u8)
                .chain((0..n).map(move |u| (code(u) >> 8) as u8)),
            2 * n,
        );
        let theirs = exception_indices(&newer.demands.exception_units, new_codes.len())
            .map_err(serde::ser::Error::custom)?;
        let mut their = theirs.iter().zip(&newer.demands.exceptions).peekable();
        let exceptions = seq(
            self.units
                .iter()
                .zip(&older.demands.exceptions)
                .map(move |(&u, d)| {
                    while their.next_if(|(v, _)| **v < u).is_some() {}
                    let bits = match their.peek() {
                        Some((v, x)) if **v == u => x.to_bits(),
                        _ => new_codes
                            .get(u)
                            .map_or(0, |&c| demand_code::decode(c).to_bits()),
                    };
                    d.to_bits() ^ bits
                }),
            self.units.len(),
        );
        let (om, nm) = (&older.map, &newer.map);
        let count = seq(
            om.count
                .iter()
                .enumerate()
                .map(|(u, &c)| c ^ nm.count.get(u).copied().unwrap_or(0)),
            om.count.len(),
        );
        // Per unit, its allocations against the newer's at the same positions (the offsets
        // walk both maps; the counts were checked to add up).
        let mut at_new = 0usize;
        let clusters = seq(
            om.count
                .iter()
                .enumerate()
                .scan(0usize, move |at_old, (u, &c)| {
                    let theirs = nm.count.get(u).copied().unwrap_or(0);
                    let (k, k_new) = (count_of(c), count_of(theirs));
                    let (from, base) = (*at_old, at_new);
                    *at_old += k;
                    at_new += k_new;
                    Some((0..k).map(move |i| {
                        let mine = om.cluster.get(from + i).copied().unwrap_or(0);
                        let base = if i < k_new {
                            nm.cluster.get(base + i).copied().unwrap_or(0)
                        } else {
                            0
                        };
                        zigzag32(mine.wrapping_sub(base))
                    }))
                })
                .flatten(),
            om.cluster.len(),
        );
        let mut st = s.serialize_struct("Delta", 14)?;
        st.serialize_field("epoch", &older.epoch)?;
        st.serialize_field("version", &older.version)?;
        st.serialize_field("solved_at_unix_ms", &older.solved_at_unix_ms)?;
        st.serialize_field("base_generation", &older.base_generation)?;
        st.serialize_field("against", &newer.version)?;
        st.serialize_field("per_unit", &older.per_unit)?;
        st.serialize_field("capacities", &older.capacities)?;
        st.serialize_field("codes", &planes)?;
        st.serialize_field("exception_units", &older.demands.exception_units)?;
        st.serialize_field("exceptions", &exceptions)?;
        st.serialize_field("count", &count)?;
        st.serialize_field("cluster", &clusters)?;
        st.serialize_field("amount", &om.amount)?;
        st.serialize_field("overflow", &om.overflow)?;
        st.end()
    }
}

/// The record of format 04 (read only): the demands as `f64`s.
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(Serialize))]
pub(super) struct Record04 {
    pub(super) epoch: u64,
    pub(super) version: u64,
    pub(super) solved_at_unix_ms: i64,
    pub(super) base_generation: u64,
    pub(super) demands: Vec<f64>,
    pub(super) per_unit: Vec<PerUnit>,
    pub(super) capacities: Vec<f64>,
    pub(super) map: CompactMap,
}

impl From<Record04> for Record {
    fn from(r: Record04) -> Record {
        Record {
            epoch: r.epoch,
            version: r.version,
            solved_at_unix_ms: r.solved_at_unix_ms,
            base_generation: r.base_generation,
            per_unit: r.per_unit,
            capacities: r.capacities,
            demands: Demands::of(&r.demands),
            map: r.map,
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
    pub(super) per_unit: Vec<PerUnit>,
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
            Stored::Now(r) => (
                r.demands
                    .to_vec()
                    .map_err(|e| format!("its demands: {e}"))?,
                &r.per_unit,
                &r.capacities,
            ),
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

/// A unit's allocation count, from its count word ([`CompactMap`]).
fn count_of(word: u32) -> usize {
    ((word & !COMPANION) >> 1) as usize
}

/// The count word's bit that says the unit's last allocation is its companion.
const COMPANION: u32 = 1 << 31;

/// A map, compactly: per unit `companion << 31 | count << 1 | whole`, where `companion` says
/// the last of the unit's allocations is its companion (format 06; never set before), and
/// `whole` says the unit's one allocation is its whole demand (bit for bit), or with a
/// companion, that its two are the demand split as [`companion::split`] splits it: their
/// amounts are not stored (most units at most rounds). The clusters and the other amounts in
/// unit order; overflow only where there is some. About 3 bytes a unit where [`MapColumns`]
/// took 17 or more.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct CompactMap {
    pub(super) count: Vec<u32>,
    pub(super) cluster: Vec<u32>,
    pub(super) amount: Vec<f64>,
    pub(super) overflow: Vec<(u32, f64)>,
}

/// What unit `u` of `instance` has in whole: its demand, or with a companion the demand split.
fn whole_amounts(instance: &Instance, u: u32, companion: bool) -> [f64; 2] {
    let d = instance.unit_demand(u);
    if companion {
        let k = usize::from(instance.unit_class(u));
        let (rest, reserved) = companion::split(instance.classes()[k].companion_share, d);
        [rest, reserved]
    } else {
        [d, 0.0]
    }
}

impl CompactMap {
    /// `map` with `instance`'s demands to leave whole-demand amounts out; `None` stores every
    /// amount (a map read without its instance).
    pub(super) fn of(map: &Map, instance: Option<&Instance>) -> CompactMap {
        let n = map.unit_count();
        let mut out = CompactMap {
            count: Vec::with_capacity(n),
            cluster: Vec::with_capacity(n),
            amount: Vec::new(),
            overflow: Vec::new(),
        };
        let bits = |x: &[f64]| x.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
        for u in 0..n as u32 {
            let a = map.allocations(u);
            let overflow = map.overflow(u);
            let with = map.companion(u).is_some();
            let whole = instance
                .filter(|i| (u as usize) < i.unit_count() && overflow == 0.0)
                .is_some_and(|i| {
                    let [rest, reserved] = whole_amounts(i, u, with);
                    let amounts: Vec<f64> = a.iter().map(|x| x.amount).collect();
                    match with {
                        true => bits(&amounts) == bits(&[rest, reserved]),
                        false => bits(&amounts) == bits(&[rest]),
                    }
                });
            let companion = if with { COMPANION } else { 0 };
            out.count
                .push(companion | (a.len() as u32) << 1 | u32::from(whole));
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
            let (k, whole, companion) = (count_of(c), c & 1 == 1, c & COMPANION != 0);
            if whole && k != 1 + usize::from(companion) {
                return Err(format!("unit {u}: a whole demand in {k} allocations"));
            }
            if companion && k == 0 {
                return Err(format!("unit {u}: a companion in {k} allocations"));
            }
            let end = at
                .checked_add(k)
                .filter(|&e| e <= self.cluster.len())
                .ok_or_else(|| format!("unit {u}: allocations past the end"))?;
            let mut allocs = Vec::with_capacity(k);
            let amounts_whole = whole_amounts(instance, u as u32, companion);
            for (i, &cl) in self.cluster[at..end].iter().enumerate() {
                let amount = if whole {
                    amounts_whole[i]
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
            let last = if companion { allocs.pop() } else { None };
            map.push_unit_with(allocs, last, overflow);
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
