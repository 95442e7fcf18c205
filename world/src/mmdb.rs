//! Client networks from a MaxMind DB (the format of GeoIP2/GeoLite2 City and DB-IP): each
//! located network, folded to the granularity of a map unit ([`read`]); and a writer of such
//! databases ([`write`]) for tests, for demos without a licensed database, and for scale runs.
//!
//! **Reading** takes every network the database has a record for whose record holds
//! `location.latitude` and `location.longitude` (networks without are counted, not taken).
//! An IPv4 network longer than /24 is folded into its /24, and an IPv6 network longer than
//! `v6_len` (default /48) into its prefix of that length: the first network of a fold (in
//! address order) gives its location to the whole, the others are counted as folded. The
//! networks of one database are disjoint (leaves of its search tree) and stay so when folded.
//! IPv4 networks of an IPv6 database (under `::/96`) come out as IPv4 networks; the tree's
//! aliases of them (`::ffff:0:0/96`, `2002::/16`) are skipped by the reader.
//!
//! **Writing** follows the MaxMind DB format 2.0 spec: a binary search tree of 32-bit records
//! over IPv6 (IPv4 networks at `::/96`), a data section in which identical records are stored
//! once, and the metadata map. What it writes is read back by the `maxminddb` crate in the
//! tests, the same reader the service uses.

use std::collections::HashMap;

use anyhow::{bail, ensure, Context, Result};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A client network and where it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Located {
    pub net: IpNet,
    pub lat: f64,
    pub lon: f64,
}

/// The longest IPv4 network kept as is: longer ones fold into their /24.
pub const V4_FOLD_LEN: u8 = 24;
/// The default length IPv6 networks fold to.
pub const DEFAULT_V6_FOLD_LEN: u8 = 48;

/// What [`read`] passed over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Networks whose record has no location.
    pub unlocated: u64,
    /// Networks folded into one taken before them.
    pub folded: u64,
}

#[derive(serde::Deserialize)]
struct CityRecord {
    location: Option<Location>,
}

#[derive(serde::Deserialize)]
struct Location {
    latitude: Option<f64>,
    longitude: Option<f64>,
}

/// The located networks of the MaxMind DB in `bytes` (named `what` in errors), folded (module
/// docs), in address order (IPv4 first), appended to `out`; an error past `max_networks` of
/// them (a tree whose records point back into it can make a small file hold more networks
/// than there are addresses).
pub fn read(
    bytes: Vec<u8>,
    what: &str,
    v6_len: u8,
    max_networks: usize,
    out: &mut Vec<Located>,
) -> Result<Skipped> {
    ensure!(
        (1..=128).contains(&v6_len),
        "the IPv6 fold length must be in 1..=128, got {v6_len}"
    );
    let reader = maxminddb::Reader::from_source(bytes)
        .map_err(|e| anyhow::anyhow!("{what}: not a MaxMind DB: {e}"))?;
    let mut skipped = Skipped::default();
    let start = out.len();
    let networks = reader
        .networks(Default::default())
        .map_err(|e| anyhow::anyhow!("{what}: reading its networks: {e}"))?;
    for item in networks {
        let item = item.map_err(|e| anyhow::anyhow!("{what}: reading a network: {e}"))?;
        let seen = (out.len() - start) as u64 + skipped.unlocated + skipped.folded;
        ensure!(
            seen < max_networks as u64,
            "{what}: more than {max_networks} networks"
        );
        let network = item
            .network()
            .map_err(|e| anyhow::anyhow!("{what}: a network: {e}"))?;
        let record: Option<CityRecord> = item
            .decode()
            .map_err(|e| anyhow::anyhow!("{what}: the record of {network}: {e}"))?;
        let located = record
            .and_then(|r| r.location)
            .and_then(|l| Some((l.latitude?, l.longitude?)));
        let Some((lat, lon)) = located else {
            skipped.unlocated += 1;
            continue;
        };
        ensure!(
            lat.is_finite() && (-90.0..=90.0).contains(&lat),
            "{what}: {network}: latitude {lat} out of range"
        );
        ensure!(
            lon.is_finite() && (-180.0..=180.0).contains(&lon),
            "{what}: {network}: longitude {lon} out of range"
        );
        let net = IpNet::new(network.ip(), network.prefix())
            .map_err(|e| anyhow::anyhow!("{what}: network {network}: {e}"))?;
        let net = fold(net, v6_len);
        // Networks come in address order, so the networks of one fold are adjacent.
        if out.len() > start && out.last().is_some_and(|l| l.net == net) {
            skipped.folded += 1;
            continue;
        }
        out.push(Located { net, lat, lon });
    }
    Ok(skipped)
}

/// `net` folded to a map unit's granularity (module docs), truncated.
pub fn fold(net: IpNet, v6_len: u8) -> IpNet {
    // A v4-mapped network is its IPv4 form, as the prefix index has it.
    match cdnmap_topology::canonical(&net) {
        IpNet::V4(n) if n.prefix_len() > V4_FOLD_LEN => {
            IpNet::V4(Ipv4Net::new(n.network(), V4_FOLD_LEN).unwrap_or(n))
        }
        IpNet::V6(n) if n.prefix_len() > v6_len => {
            IpNet::V6(Ipv6Net::new(n.network(), v6_len).unwrap_or(n))
        }
        n => n,
    }
    .trunc()
}

// ---------------------------------------------------------------------------------------------
// The writer.

/// A search tree record: another node, no data, or data at an offset of the data section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rec {
    Node(u32),
    Empty,
    Data(u32),
}

/// The data section's type numbers (MaxMind DB spec, "Output Data Section").
mod kind {
    pub const STRING: u8 = 2;
    pub const DOUBLE: u8 = 3;
    pub const UINT16: u8 = 5;
    pub const UINT32: u8 = 6;
    pub const MAP: u8 = 7;
    pub const UINT64: u8 = 9;
    pub const ARRAY: u8 = 11;
}

/// Encodes the MaxMind DB data types the writer needs.
struct Encoder(Vec<u8>);

impl Encoder {
    /// A control byte (and the extended type and size bytes) for `kind` of `size`.
    fn control(&mut self, kind: u8, size: usize) {
        let (ty, extended) = if kind <= 7 {
            (kind << 5, None)
        } else {
            (0, Some(kind - 7))
        };
        let size_bytes: Vec<u8> = match size {
            0..=28 => {
                self.0.push(ty | size as u8);
                Vec::new()
            }
            29..=284 => {
                self.0.push(ty | 29);
                vec![(size - 29) as u8]
            }
            285..=65_820 => {
                self.0.push(ty | 30);
                ((size - 285) as u16).to_be_bytes().to_vec()
            }
            _ => {
                self.0.push(ty | 31);
                ((size - 65_821) as u32).to_be_bytes()[1..].to_vec()
            }
        };
        if let Some(e) = extended {
            self.0.push(e);
        }
        self.0.extend_from_slice(&size_bytes);
    }

    fn string(&mut self, s: &str) {
        self.control(kind::STRING, s.len());
        self.0.extend_from_slice(s.as_bytes());
    }

    fn double(&mut self, x: f64) {
        self.control(kind::DOUBLE, 8);
        self.0.extend_from_slice(&x.to_be_bytes());
    }

    /// An unsigned integer of `kind` (uint16, uint32 or uint64), in as few bytes as it needs.
    fn uint(&mut self, kind: u8, x: u64) {
        let bytes = x.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        self.control(kind, 8 - skip);
        self.0.extend_from_slice(&bytes[skip..]);
    }

    fn map(&mut self, entries: usize) {
        self.control(kind::MAP, entries);
    }

    fn array(&mut self, items: usize) {
        self.control(kind::ARRAY, items);
    }
}

/// The record of a located network: `{"location": {"latitude": .., "longitude": ..}}`, as
/// GeoIP2 City has it.
fn location_record(lat: f64, lon: f64) -> Vec<u8> {
    let mut e = Encoder(Vec::with_capacity(48));
    e.map(1);
    e.string("location");
    e.map(2);
    e.string("latitude");
    e.double(lat);
    e.string("longitude");
    e.double(lon);
    e.0
}

/// The bits of `net` in the tree's IPv6 space (IPv4 under `::/96`) and its length there.
fn tree_key(net: &IpNet) -> (u128, u8) {
    match net.trunc() {
        IpNet::V4(n) => (u128::from(u32::from(n.network())), 96 + n.prefix_len()),
        IpNet::V6(n) => (u128::from(n.network()), n.prefix_len()),
    }
}

/// Writes a MaxMind DB (`database_type`, e.g. "GeoLite2-City") holding `nets`, each with its
/// location, into `out`. Refuses networks that overlap one another (one inside another), and
/// the IPv4-mapped and 6to4 ranges (readers alias them to the IPv4 networks).
pub fn write(nets: &[Located], database_type: &str, build_epoch: u64) -> Result<Vec<u8>> {
    let mut tree: Vec<[Rec; 2]> = vec![[Rec::Empty; 2]];
    let mut data = Vec::new();
    let mut offsets: HashMap<Vec<u8>, u32> = HashMap::new();
    for l in nets {
        check_network(l)?;
        let record = location_record(l.lat, l.lon);
        let offset = match offsets.get(&record) {
            Some(&o) => o,
            None => {
                let o = u32::try_from(data.len()).context("the data section passed 4 GiB")?;
                data.extend_from_slice(&record);
                offsets.insert(record, o);
                o
            }
        };
        insert(&mut tree, l, offset)?;
    }
    let node_count = u32::try_from(tree.len()).context("too many nodes")?;
    let mut out = Vec::with_capacity(tree.len() * 8 + 16 + data.len() + 512);
    for node in &tree {
        for rec in node {
            let value = match *rec {
                Rec::Node(n) => n,
                Rec::Empty => node_count,
                // Data pointers count from the end of the tree, past its 16-byte separator.
                Rec::Data(o) => node_count
                    .checked_add(16)
                    .and_then(|v| v.checked_add(o))
                    .context("the database passed 4 GiB")?,
            };
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(&data);
    out.extend_from_slice(b"\xAB\xCD\xEFMaxMind.com");
    out.extend_from_slice(&metadata(database_type, build_epoch, node_count));
    Ok(out)
}

/// Refuses a location out of range and an IPv6 network readers would alias to IPv4.
fn check_network(l: &Located) -> Result<()> {
    ensure!(
        l.lat.is_finite()
            && l.lon.is_finite()
            && (-90.0..=90.0).contains(&l.lat)
            && (-180.0..=180.0).contains(&l.lon),
        "{}: location ({}, {}) out of range",
        l.net,
        l.lat,
        l.lon
    );
    if let IpNet::V6(n) = l.net {
        let a = n.network();
        ensure!(
            a.to_ipv4_mapped().is_none() && a.segments()[0] != 0x2002 && n.prefix_len() > 0,
            "{}: an IPv6 network in a range readers alias to IPv4",
            l.net
        );
        ensure!(
            !(u128::from(a) >> 32 == 0 && n.prefix_len() >= 96),
            "{}: write IPv4 networks as IPv4",
            l.net
        );
    }
    Ok(())
}

/// Puts `l`'s network in the search tree, its leaf pointing at data `offset`; refuses one
/// that overlaps a network put there before.
fn insert(tree: &mut Vec<[Rec; 2]>, l: &Located, offset: u32) -> Result<()> {
    let (bits, len) = tree_key(&l.net);
    ensure!(len > 0, "{}: a network of length 0", l.net);
    let mut node = 0usize;
    for depth in 0..len {
        let bit = ((bits >> (127 - depth)) & 1) as usize;
        if depth + 1 == len {
            match tree[node][bit] {
                Rec::Empty => tree[node][bit] = Rec::Data(offset),
                _ => bail!("{}: overlaps a network written before it", l.net),
            }
            break;
        }
        node = match tree[node][bit] {
            Rec::Node(n) => n as usize,
            Rec::Empty => {
                tree.push([Rec::Empty; 2]);
                let n = tree.len() - 1;
                tree[node][bit] = Rec::Node(u32::try_from(n).context("too many nodes")?);
                n
            }
            Rec::Data(_) => bail!("{}: inside a network written before it", l.net),
        };
    }
    Ok(())
}

/// The database's metadata section (after its marker).
fn metadata(database_type: &str, build_epoch: u64, node_count: u32) -> Vec<u8> {
    let mut m = Encoder(Vec::new());
    m.map(9);
    m.string("binary_format_major_version");
    m.uint(kind::UINT16, 2);
    m.string("binary_format_minor_version");
    m.uint(kind::UINT16, 0);
    m.string("build_epoch");
    m.uint(kind::UINT64, build_epoch);
    m.string("database_type");
    m.string(database_type);
    m.string("description");
    m.map(1);
    m.string("en");
    m.string("Located client networks written by cdnmap");
    m.string("ip_version");
    m.uint(kind::UINT16, 6);
    m.string("languages");
    m.array(1);
    m.string("en");
    m.string("node_count");
    m.uint(kind::UINT32, u64::from(node_count));
    m.string("record_size");
    m.uint(kind::UINT16, 32);
    m.0
}

/// Where `ip` is in `nets` as a MaxMind DB reader would find it: the network containing it.
#[cfg(test)]
fn containing(nets: &[Located], ip: std::net::IpAddr) -> Option<&Located> {
    nets.iter().find(|l| l.net.contains(&ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn net(s: &str) -> IpNet {
        s.parse().expect("a network")
    }

    fn located(s: &str, lat: f64, lon: f64) -> Located {
        Located {
            net: net(s),
            lat,
            lon,
        }
    }

    /// Random disjoint networks of both families, some sharing a location.
    fn random_nets(rng: &mut ChaCha8Rng, n: usize) -> Vec<Located> {
        let mut out: Vec<Located> = Vec::new();
        while out.len() < n {
            let candidate = if rng.random_bool(0.8) {
                let len = rng.random_range(8..=32u8);
                let a: u32 = rng.random::<u32>() | 0x0100_0000;
                IpNet::V4(Ipv4Net::new(a.into(), len).expect("len").trunc())
            } else {
                let len = rng.random_range(16..=64u8);
                let a: u128 = (rng.random::<u128>() >> 3) | (0x2u128 << 125);
                IpNet::V6(Ipv6Net::new(a.into(), len).expect("len").trunc())
            };
            let overlaps = out
                .iter()
                .any(|l| l.net.contains(&candidate) || candidate.contains(&l.net));
            if overlaps {
                continue;
            }
            let (lat, lon) = if rng.random_bool(0.3) && !out.is_empty() {
                let l = out[rng.random_range(0..out.len())];
                (l.lat, l.lon)
            } else {
                (
                    rng.random_range(-90.0..=90.0),
                    rng.random_range(-180.0..=180.0),
                )
            };
            out.push(Located {
                net: candidate,
                lat,
                lon,
            });
        }
        out
    }

    /// What the `maxminddb` crate reads from the writer's database: every network with its
    /// location, and lookups of random addresses inside and outside them as the list says.
    #[test]
    fn the_maxminddb_reader_reads_what_is_written() {
        let mut rng = ChaCha8Rng::seed_from_u64(19);
        let nets = random_nets(&mut rng, 400);
        let bytes = write(&nets, "GeoLite2-City", 1_700_000_000).expect("written");
        let reader = maxminddb::Reader::from_source(bytes.clone()).expect("a MaxMind DB");
        assert_eq!(reader.metadata().database_type, "GeoLite2-City");
        for _ in 0..2_000 {
            let ip = match rng.random_range(0..3) {
                0 => IpAddr::V4(rng.random::<u32>().into()),
                1 => {
                    let l = &nets[rng.random_range(0..nets.len())];
                    l.net.hosts().next().unwrap_or(l.net.network())
                }
                _ => IpAddr::V6((rng.random::<u128>() >> 3 | 0x2u128 << 125).into()),
            };
            let found = reader.lookup(ip).expect("a lookup");
            let record: Option<CityRecord> = found.decode().expect("a record");
            let got = record
                .and_then(|r| r.location)
                .and_then(|l| Some((l.latitude?, l.longitude?)));
            let want = containing(&nets, ip).map(|l| (l.lat, l.lon));
            assert_eq!(got, want, "{ip}");
        }
        // Read whole, unfolded (lengths beyond /24 only among IPv4 networks: fold IPv6 at 128).
        let mut read_back = Vec::new();
        let skipped = read(bytes, "test.mmdb", 128, 10_000, &mut read_back).expect("read");
        let mut want: Vec<Located> = nets
            .iter()
            .map(|l| Located {
                net: fold(l.net, 128),
                ..*l
            })
            .collect();
        want.sort_by_key(|l| l.net);
        want.dedup_by(|b, a| a.net == b.net);
        let mut got = read_back.clone();
        got.sort_by_key(|l| l.net);
        assert_eq!(got.len() as u64 + skipped.folded, nets.len() as u64);
        assert_eq!(
            got.iter().map(|l| l.net).collect::<Vec<_>>(),
            want.iter().map(|l| l.net).collect::<Vec<_>>()
        );
        assert_eq!(skipped.unlocated, 0);
    }

    /// Folding: IPv4 beyond /24 into the /24, IPv6 beyond the length into it; the first
    /// network of a fold gives the location; overlapping networks are refused by the writer.
    #[test]
    fn networks_fold_to_map_unit_granularity() {
        let nets = [
            located("10.0.0.0/26", 1.0, 2.0),
            located("10.0.0.64/26", 3.0, 4.0),
            located("10.0.1.0/24", 5.0, 6.0),
            located("10.2.0.0/16", 7.0, 8.0),
            located("2001:db8:1:1::/64", 9.0, 10.0),
            located("2001:db8:1:2::/64", 11.0, 12.0),
            located("2001:db9::/40", 13.0, 14.0),
        ];
        let bytes = write(&nets, "GeoLite2-City", 1).expect("written");
        let mut out = Vec::new();
        let skipped = read(bytes, "t.mmdb", 48, 100, &mut out).expect("read");
        assert_eq!(
            out,
            [
                located("10.0.0.0/24", 1.0, 2.0),
                located("10.0.1.0/24", 5.0, 6.0),
                located("10.2.0.0/16", 7.0, 8.0),
                located("2001:db8:1::/48", 9.0, 10.0),
                located("2001:db9::/40", 13.0, 14.0),
            ]
        );
        assert_eq!(
            skipped,
            Skipped {
                unlocated: 0,
                folded: 2
            }
        );
        let overlapping = [
            located("10.0.0.0/16", 0.0, 0.0),
            located("10.0.1.0/24", 0.0, 0.0),
        ];
        let e = write(&overlapping, "x", 1).expect_err("overlap");
        assert!(e.to_string().contains("10.0.1.0/24"), "{e}");
        let e = write(&[located("10.0.0.0/8", 91.0, 0.0)], "x", 1).expect_err("latitude");
        assert!(e.to_string().contains("out of range"), "{e}");
    }

    /// A database cut short or overwritten anywhere is refused with an error naming it, never
    /// a panic; whatever still reads gives locations in range.
    #[test]
    fn a_cut_or_corrupt_database_is_an_error_naming_it() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let nets = random_nets(&mut rng, 50);
        let bytes = write(&nets, "GeoLite2-City", 1).expect("written");
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 20] {
            let mut out = Vec::new();
            match read(bytes[..cut].to_vec(), "cut.mmdb", 48, 1_000, &mut out) {
                Err(e) => assert!(e.to_string().contains("cut.mmdb"), "{e}"),
                // Only a cut inside the metadata may still read.
                Ok(_) => assert_eq!(cut, bytes.len() - 20),
            }
        }
        for _ in 0..200 {
            let mut bad = bytes.clone();
            for _ in 0..4 {
                let at = rng.random_range(0..bad.len());
                bad[at] = rng.random();
            }
            let mut out = Vec::new();
            match read(bad, "bad.mmdb", 48, 1_000, &mut out) {
                Ok(_) => assert!(out
                    .iter()
                    .all(|l| (-90.0..=90.0).contains(&l.lat) && (-180.0..=180.0).contains(&l.lon))),
                Err(e) => assert!(e.to_string().contains("bad.mmdb"), "{e}"),
            }
        }
    }
}
