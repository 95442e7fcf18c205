//! The compact binary form of a [`Topology`]: what the store keeps, and what `cdnmap world
//! --compact` writes, instead of the JSON instance file (about 900 MB at a million map units,
//! and seconds to parse).
//!
//! Layout: the header `CDNTOP01`, then one postcard value of [`Columns`]: the traffic classes
//! and clusters as a small JSON head (an instance file without map units: a few thousand
//! clusters, whose resource trees already have a file form), then the map units as columns
//! (ids, classes, demands, locations, candidates by cluster index, prefixes as packed bytes).
//! Decoding goes through [`TopologyBuilder`], so a decoded topology is validated exactly as a
//! parsed instance file is; a cut or damaged encoding is an error naming what was wrong, never
//! a panic. (The store's value files add a length and a checksum around it.)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cdnmap_mapper::model::{IndexedCandidate, IndexedUnitSpec};
use cdnmap_mapper::{ClassIdx, ClusterIdx, Limits, UnitIdx};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::format::{cluster_file, InstanceFile};
use crate::{Topology, TopologyBuilder, TopologyError};

/// The header of the compact form: its format and version.
pub const MAGIC: &[u8; 8] = b"CDNTOP01";

/// Why bytes are not a compact topology.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompactError {
    #[error(
        "not a compact topology: the header is not {:?}",
        String::from_utf8_lossy(MAGIC)
    )]
    Header,
    #[error("the compact topology is cut short or damaged: {0}")]
    Encoding(String),
    #[error("the compact topology's classes and clusters: {0}")]
    Head(serde_json::Error),
    #[error("the compact topology's {what}: {problem}")]
    Shape { what: String, problem: String },
    #[error(transparent)]
    Topology(#[from] TopologyError),
}

/// The encoded value after the header.
#[derive(Debug, Serialize, Deserialize)]
struct Columns {
    /// `{"traffic_classes": [...], "clusters": [...], "map_units": []}`, clusters in id order.
    head: Vec<u8>,
    /// Unit `u`'s id is `ids[id_end[u - 1]..id_end[u]]` (from 0 for the first).
    ids: String,
    id_end: Vec<u32>,
    class: Vec<u16>,
    demand: Vec<f64>,
    lat: Vec<f32>,
    lon: Vec<f32>,
    /// Unit `u`'s candidates are entries `cand_end[u - 1]..cand_end[u]`.
    cand_end: Vec<u32>,
    cand_cluster: Vec<u32>,
    cand_score: Vec<f32>,
    /// The entries with an explicit `cluster_rank`: (entry, rank).
    cand_rank: Vec<(u32, f32)>,
    /// Unit `u`'s prefixes are `prefix_end[u - 1]..prefix_end[u]` of the packed prefixes:
    /// each a family byte (4 or 6), a length byte, then 4 or 16 address bytes.
    prefix_end: Vec<u32>,
    prefixes: Vec<u8>,
}

/// `topology` in the compact form.
pub fn encode(topology: &Topology) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = encode_to(topology, &mut out);
    out
}

/// `topology` in the compact form, written to `out` as it is made: no column is gathered in
/// memory first (at 11 M map units the columns and their encoding were gigabytes beside the
/// topology itself). The bytes are [`encode`]'s; the wire layout is [`Columns`]'s.
pub fn encode_to(topology: &Topology, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    out.write_all(MAGIC)?;
    postcard_to_io(&View(topology), out)
}

/// `value` in postcard, written to `out` in chunks of 64 KiB. postcard's own `to_io` hands
/// every byte to the writer with a call of its own (a varint per map unit, through a `dyn
/// Write`). The bytes are postcard's, as `postcard::to_stdvec` makes them.
pub fn postcard_to_io<T: Serialize + ?Sized>(
    value: &T,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let mut error = None;
    let flavor = Chunked {
        buf: Vec::with_capacity(CHUNK),
        out,
        error: &mut error,
    };
    match postcard::serialize_with_flavor(value, flavor) {
        Ok(()) => Ok(()),
        Err(e) => Err(error.unwrap_or_else(|| std::io::Error::other(e))),
    }
}

/// The chunk [`postcard_to_io`] gathers before it writes.
const CHUNK: usize = 1 << 16;

/// A postcard flavor writing to an `io::Write` in chunks; a write's error is kept in `error`
/// (postcard's own error cannot carry it).
struct Chunked<'a> {
    buf: Vec<u8>,
    out: &'a mut dyn std::io::Write,
    error: &'a mut Option<std::io::Error>,
}

impl Chunked<'_> {
    fn write(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.out.write_all(bytes).map_err(|e| {
            *self.error = Some(e);
            postcard::Error::SerializeBufferFull
        })
    }

    fn flush(&mut self) -> postcard::Result<()> {
        let buf = std::mem::take(&mut self.buf);
        let written = self.write(&buf);
        self.buf = buf;
        self.buf.clear();
        written
    }
}

impl postcard::ser_flavors::Flavor for Chunked<'_> {
    type Output = ();

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        if self.buf.len() == CHUNK {
            self.flush()?;
        }
        self.buf.push(byte);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        // A varint (at most 10 bytes, most of what a map is): byte by byte, not a call to
        // memcpy for each.
        if bytes.len() <= 10 {
            return bytes.iter().try_for_each(|&b| self.try_push(b));
        }
        if self.buf.len() + bytes.len() > CHUNK {
            self.flush()?;
            if bytes.len() > CHUNK {
                return self.write(bytes);
            }
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<()> {
        self.flush()
    }
}

/// [`Columns`] of a topology, serialized straight from it.
struct View<'a>(&'a Topology);

/// A column of `len` items made by a fresh run of the iterator `items` (postcard writes the
/// length first). An iterator that yields another number of items is an error, not a column
/// the decoder would misread.
struct Column<F>(usize, F);

impl<T, I, F> Serialize for Column<F>
where
    T: Serialize,
    I: Iterator<Item = T>,
    F: Fn() -> I,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let mut seq = s.serialize_seq(Some(self.0))?;
        let mut n = 0;
        for item in (self.1)() {
            n += 1;
            seq.serialize_element(&item)?;
        }
        if n != self.0 {
            return Err(S::Error::custom(format!(
                "a column of {n} items where {} were counted",
                self.0
            )));
        }
        seq.end()
    }
}

/// The column of each of `n` units' end in a column of entries `lens(u)` long each.
struct Ends<'a>(usize, &'a dyn Fn(UnitIdx) -> usize);

impl Serialize for Ends<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Ends(n, lens) = *self;
        Column(n, || {
            let mut end = 0usize;
            (0..n as UnitIdx).map(move |u| {
                end += lens(u);
                end as u32
            })
        })
        .serialize(s)
    }
}

impl Serialize for View<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let topology = self.0;
        let inst = &topology.instance;
        let head = InstanceFile {
            traffic_classes: inst.classes().to_vec(),
            clusters: (0..inst.clusters().len() as ClusterIdx)
                .map(|c| cluster_file(topology, c))
                .collect(),
            map_units: Vec::new(),
            policy: crate::format::policy_file(topology),
        };
        // Serializing plain structs of strings and numbers to a Vec cannot fail.
        let head = serde_json::to_vec(&head).unwrap_or_default();
        let n = inst.unit_count();
        let units = move || 0..n as UnitIdx;
        let (ids, id_end) = inst.unit_id_column();
        let cands = move || units().flat_map(move |u| inst.candidates(u));
        let total = units().map(|u| inst.candidates(u).len()).sum::<usize>();
        let ranked = cands().filter(|c| c.explicit_rank).count();
        let prefixes = move || units().flat_map(move |u| topology.unit_prefixes(u));
        let packed_len = |p: &IpNet| if p.addr().is_ipv4() { 6 } else { 18 };
        let prefix_bytes = prefixes().map(packed_len).sum::<usize>();
        let cand_lens = |u| inst.candidates(u).len();
        let prefix_lens = |u| topology.unit_prefixes(u).iter().map(packed_len).sum();
        let mut st = s.serialize_struct("Columns", 14)?;
        st.serialize_field("head", &head)?;
        st.serialize_field("ids", ids)?;
        st.serialize_field("id_end", id_end)?;
        st.serialize_field("class", &Column(n, || units().map(|u| inst.unit_class(u))))?;
        st.serialize_field(
            "demand",
            &Column(n, || units().map(|u| inst.unit_demand(u))),
        )?;
        let location = move |u| inst.unit_location(u);
        st.serialize_field("lat", &Column(n, || units().map(|u| location(u).0 as f32)))?;
        st.serialize_field("lon", &Column(n, || units().map(|u| location(u).1 as f32)))?;
        st.serialize_field("cand_end", &Ends(n, &cand_lens))?;
        st.serialize_field(
            "cand_cluster",
            &Column(total, || cands().map(|c| c.cluster)),
        )?;
        st.serialize_field("cand_score", &Column(total, || cands().map(|c| c.score)))?;
        st.serialize_field(
            "cand_rank",
            &Column(ranked, || {
                cands()
                    .enumerate()
                    .filter(|(_, c)| c.explicit_rank)
                    .map(|(e, c)| (e as u32, c.rank))
            }),
        )?;
        st.serialize_field("prefix_end", &Ends(n, &prefix_lens))?;
        st.serialize_field(
            "prefixes",
            &Column(prefix_bytes, || prefixes().flat_map(packed)),
        )?;
        st.end()
    }
}

/// Decodes and validates a compact topology (as [`crate::format::parse_instance`] does a
/// file).
pub fn decode(bytes: &[u8], limits: Limits) -> Result<Topology, CompactError> {
    let body = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or(CompactError::Header)?;
    let c: Columns =
        postcard::from_bytes(body).map_err(|e| CompactError::Encoding(e.to_string()))?;
    let head: InstanceFile = serde_json::from_slice(&c.head).map_err(CompactError::Head)?;
    let n = check_lengths(&c)?;
    let clusters = head
        .clusters
        .iter()
        .map(|c| (c.to_spec(), c.addresses.clone()))
        .collect();
    let mut b = TopologyBuilder::new(head.traffic_classes.clone(), clusters, limits)
        .map_err(TopologyError::from)?;
    if let Some(policy) = &head.policy {
        b.set_policy(policy).map_err(TopologyError::from)?;
    }
    // At most one prefix per six packed bytes (an IPv4 prefix's size).
    b.reserve(n, c.cand_cluster.len(), c.prefixes.len() / 6);
    // The head's classes and clusters by the builder's indices, looked up once (not per
    // candidate: 176 M lookups at 11 M map units).
    let class_of: Vec<Option<ClassIdx>> = head
        .traffic_classes
        .iter()
        .map(|k| b.class_index(&k.name))
        .collect();
    let cluster_of: Vec<Option<ClusterIdx>> = head
        .clusters
        .iter()
        .map(|c| b.cluster_index(&c.id))
        .collect();
    let mut ranks = c.cand_rank.iter().peekable();
    let (mut id_at, mut cand_at, mut prefix_at) = (0usize, 0usize, 0usize);
    let mut cands = Vec::new();
    let mut prefixes = Vec::new();
    for u in 0..n {
        let ids = next_range(&mut id_at, c.id_end[u], c.ids.len(), "ids", u)?;
        let id = c.ids.get(ids).ok_or_else(|| {
            shape(
                "ids",
                format!("map unit {u}'s id does not end on a character boundary"),
            )
        })?;
        let class = class_of
            .get(usize::from(c.class[u]))
            .copied()
            .flatten()
            .ok_or_else(|| {
                shape(
                    "classes",
                    format!("map unit {id:?} has class {}", c.class[u]),
                )
            })?;
        let entries = next_range(
            &mut cand_at,
            c.cand_end[u],
            c.cand_cluster.len(),
            "candidates",
            format_args!("{id:?}"),
        )?;
        unit_candidates(&c, entries, &cluster_of, &mut ranks, id, &mut cands)?;
        let packed = next_range(
            &mut prefix_at,
            c.prefix_end[u],
            c.prefixes.len(),
            "prefixes",
            format_args!("{id:?}"),
        )?;
        unpack_all(&c.prefixes[packed], &mut prefixes)
            .map_err(|p| shape("prefixes", format!("map unit {id:?}: {p}")))?;
        let spec = IndexedUnitSpec {
            id,
            class,
            demand: c.demand[u],
            lat: f64::from(c.lat[u]),
            lon: f64::from(c.lon[u]),
            candidates: &cands,
        };
        b.push_unit_indexed(&spec, &prefixes)
            .map_err(TopologyError::from)?;
    }
    if let Some((at, _)) = ranks.next() {
        return Err(shape(
            "candidate ranks",
            format!("entry {at} is not a candidate in order"),
        ));
    }
    Ok(b.finish()?)
}

/// The number of map units, once every per-unit column has one entry for each and every
/// candidate a score.
fn check_lengths(c: &Columns) -> Result<usize, CompactError> {
    let n = c.id_end.len();
    for (what, len) in [
        ("classes", c.class.len()),
        ("demands", c.demand.len()),
        ("latitudes", c.lat.len()),
        ("longitudes", c.lon.len()),
        ("candidate lists", c.cand_end.len()),
        ("prefix lists", c.prefix_end.len()),
    ] {
        if len != n {
            return Err(shape(what, format!("{len} entries for {n} map units")));
        }
    }
    if c.cand_score.len() != c.cand_cluster.len() {
        return Err(shape(
            "candidate scores",
            format!(
                "{} for {} candidates",
                c.cand_score.len(),
                c.cand_cluster.len()
            ),
        ));
    }
    Ok(n)
}

/// Map unit `id`'s candidates, the columns' `entries`, into `cands` (cleared first): each
/// cluster by the builder's index, its rank when the ranks' next entry is this candidate.
fn unit_candidates(
    c: &Columns,
    entries: std::ops::Range<usize>,
    cluster_of: &[Option<ClusterIdx>],
    ranks: &mut std::iter::Peekable<std::slice::Iter<'_, (u32, f32)>>,
    id: &str,
    cands: &mut Vec<IndexedCandidate>,
) -> Result<(), CompactError> {
    cands.clear();
    for e in entries {
        let cluster = cluster_of
            .get(c.cand_cluster[e] as usize)
            .copied()
            .flatten()
            .ok_or_else(|| {
                shape(
                    "candidates",
                    format!("map unit {id:?} names cluster {}", c.cand_cluster[e]),
                )
            })?;
        let cluster_rank = match ranks.peek() {
            Some(&&(at, rank)) if at as usize == e => {
                ranks.next();
                Some(f64::from(rank))
            }
            _ => None,
        };
        cands.push(IndexedCandidate {
            cluster,
            score: f64::from(c.cand_score[e]),
            cluster_rank,
        });
    }
    Ok(())
}

/// Every prefix packed in `packed`, into `prefixes` (cleared first).
fn unpack_all(mut packed: &[u8], prefixes: &mut Vec<IpNet>) -> Result<(), String> {
    prefixes.clear();
    while !packed.is_empty() {
        prefixes.push(unpack(&mut packed)?);
    }
    Ok(())
}

fn shape(what: &str, problem: String) -> CompactError {
    CompactError::Shape {
        what: what.to_string(),
        problem,
    }
}

/// The next entries of a column with offsets, `*at..end`, checked to lie within the column's
/// `len` (a forged end is an error naming `unit`, never a panic); `*at` moves past them.
fn next_range(
    at: &mut usize,
    end: u32,
    len: usize,
    what: &str,
    unit: impl std::fmt::Display,
) -> Result<std::ops::Range<usize>, CompactError> {
    let end = end as usize;
    if end < *at || end > len {
        return Err(shape(
            what,
            format!("map unit {unit} ends at {end}, outside {}..={len}", *at),
        ));
    }
    Ok(std::mem::replace(at, end)..end)
}

/// A prefix packed: its family byte (4 or 6), its length byte, then its 4 or 16 address bytes.
fn packed(p: &IpNet) -> impl Iterator<Item = u8> {
    let mut b = [0u8; 18];
    let size = match p {
        IpNet::V4(n) => {
            b[..2].copy_from_slice(&[4, n.prefix_len()]);
            b[2..6].copy_from_slice(&n.addr().octets());
            6
        }
        IpNet::V6(n) => {
            b[..2].copy_from_slice(&[6, n.prefix_len()]);
            b[2..].copy_from_slice(&n.addr().octets());
            18
        }
    };
    b.into_iter().take(size)
}

/// The next packed prefix of `packed` (advancing it).
fn unpack(packed: &mut &[u8]) -> Result<IpNet, String> {
    let (family, len, size) = match packed {
        [4, len, ..] => (4, *len, 4),
        [6, len, ..] => (6, *len, 16),
        [f, ..] => return Err(format!("unknown address family byte {f}")),
        [] => return Err("cut short".into()),
    };
    let bytes = packed
        .get(2..2 + size)
        .ok_or_else(|| format!("an IPv{family} prefix cut short"))?;
    let addr = if family == 4 {
        let mut a = [0u8; 4];
        a.copy_from_slice(bytes);
        IpAddr::V4(Ipv4Addr::from(a))
    } else {
        let mut a = [0u8; 16];
        a.copy_from_slice(bytes);
        IpAddr::V6(Ipv6Addr::from(a))
    };
    *packed = &packed[2 + size..];
    IpNet::new(addr, len).map_err(|_| format!("{addr}/{len} is not a prefix"))
}
