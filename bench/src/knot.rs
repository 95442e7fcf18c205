//! Knot DNS (Debian's `knot` and `knot-module-geoip`, Knot 3.2) as peers of `cdnmap bench
//! dns`: its configurations, its start, and the check of its answers before the runs.
//!
//! - **knot-static** serves the query file's names from a static zone, the same records as
//!   gdnsd-static (no lookup at all).
//! - **knot-geoip** answers them through `mod-geoip` in `mode: subnet`: a view per map-unit
//!   prefix of the world, each with the addresses of the unit's first candidate cluster (A and
//!   AAAA, a stand-in for a family the cluster has none of), so each query is a longest-prefix
//!   match over the world's prefixes of its class, answered with the matched net's length as the
//!   ECS scope: the job gdnsd-geoip does. The module takes wildcard owners (its lookup is
//!   `trie_get_try_wildcard`), so the query file's thousand names a class are four owners, as in
//!   the gdnsd zone: `www` and `*.web` (both of class web, each with the class's views),
//!   `*.video` and `*.apps`. The zone holds a default for each name (a client outside every view
//!   gets it, with scope 0). The views are bounded ([`MAX_VIEWS`]): Knot reads them from a text
//!   file at its start and keeps each as records of its own.
//! - **knot-geoip-signed** is knot-geoip plus `mod-onlinesign`: online DNSSEC (ECDSA P-256,
//!   algorithm 13, one CSK made by Knot's own KASP at its first start, in the bench's out dir),
//!   measured with the query file's twin whose queries set the DO bit. Every geo answer is signed
//!   afresh: Knot has no signature cache.
//!
//! Each runs as a child process (`knotd -c`, in the foreground, killed when dropped) with its
//! rundir, storage and keys under `dir/NAME`, `udp-workers` the bench's `--udp-threads`, one TCP
//! and one background worker, and `edns-client-subnet: on` (the geo module reads the option only
//! then; the static zone echoes it with scope 0, as gdnsd does).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use cdnmap_mapper::UnitIdx;
use cdnmap_topology::Topology;
use hickory_server::proto::op::{Message, ResponseCode};
use hickory_server::proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use hickory_server::proto::rr::RecordType;
use ipnet::IpNet;

use crate::dns_query::{ask, wait_answering, NAMES};
use crate::procs::{spawn, Proc};

/// The most views (prefix × owner name) knot-geoip is given: its configuration is a text file
/// Knot parses at its start, a few hundred bytes of memory a view. A world beyond this skips the
/// Knot geo servers rather than waiting minutes for them.
pub(crate) const MAX_VIEWS: usize = 2_000_000;

/// Queries of the query file whose answers are checked before the runs.
pub(crate) const CHECKED: usize = 500;

/// The addresses a zone's default records hold, the answer of a static zone and of a geo name
/// for a client outside every view.
const DEFAULT_V4: [&str; 3] = ["198.18.0.1", "198.18.0.2", "198.18.0.3"];
const DEFAULT_V6: [&str; 2] = ["2001:db8::1", "2001:db8::2"];
/// The stand-ins for a family a cluster has no address of (as gdnsd-geoip's).
const STAND_IN_V4: &str = "198.18.0.1";
const STAND_IN_V6: &str = "2001:db8::1";

/// `knotd`, or an error saying which packages bring it.
pub(crate) fn knotd() -> Result<PathBuf> {
    crate::procs::program("knotd")
        .context("Knot DNS: apt-get install knot knot-module-geoip (never start its service)")
}

/// The Knot setups measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Setup {
    Static,
    Geoip,
    GeoipSigned,
}

/// Writes Knot's configuration (`knot.conf`), zone and geo views (for the geo setups, from
/// `world`) in `dir`, listening on `port` with `udp_workers`. Returns the views written (0 for
/// the static zone), or `None`, writing nothing, when the world has more than [`MAX_VIEWS`].
pub(crate) fn write_config(
    dir: &Path,
    (port, udp_workers): (u16, usize),
    setup: Setup,
    world: &Topology,
) -> Result<Option<usize>> {
    for sub in ["run", "storage"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut modules = String::new();
    let mut zone_modules = Vec::new();
    let mut views = 0;
    if setup != Setup::Static {
        let wanted = views_of(world);
        if wanted > MAX_VIEWS {
            return Ok(None);
        }
        let geo = dir.join("geo.conf");
        views = write_views(&geo, world)?;
        modules.push_str(&format!(
            "mod-geoip:\n  - id: geo\n    config-file: \"{}\"\n    ttl: 20\n    mode: subnet\n",
            geo.display()
        ));
        zone_modules.push("mod-geoip/geo");
    }
    if setup == Setup::GeoipSigned {
        modules.push_str(
            "policy:\n  - id: online\n    algorithm: ecdsap256sha256\n    single-type-signing: on\n    \
             rrsig-lifetime: 25h\n    rrsig-refresh: 20h\n\
             mod-onlinesign:\n  - id: online\n    policy: online\n    nsec-bitmap: [ A, AAAA ]\n",
        );
        zone_modules.push("mod-onlinesign/online");
    }
    let storage = dir.join("storage");
    let module_line = if zone_modules.is_empty() {
        String::new()
    } else {
        format!("    module: [ {} ]\n", zone_modules.join(", "))
    };
    let conf = format!(
        "server:\n    rundir: \"{}\"\n    listen: 127.0.0.1@{port}\n    udp-workers: {udp_workers}\n    \
         tcp-workers: 1\n    background-workers: 1\n    edns-client-subnet: on\n\
         database:\n    storage: \"{1}\"\n\
         log:\n  - target: stderr\n    any: info\n\
         {modules}\
         template:\n  - id: default\n    storage: \"{1}\"\n    file: \"%s.zone\"\n\
         zone:\n  - domain: cdn.example.\n{module_line}",
        dir.join("run").display(),
        storage.display(),
    );
    std::fs::write(dir.join("knot.conf"), conf)?;
    let mut zone = String::from(
        "$ORIGIN cdn.example.\n$TTL 20\n@ SOA ns1 hostmaster 1 3600 600 86400 60\n@ NS ns1\n@ NS ns2\n\
         ns1 A 127.0.0.1\nns2 A 127.0.0.1\n",
    );
    for (name, _) in NAMES {
        for a in DEFAULT_V4 {
            zone.push_str(&format!("{name} A {a}\n"));
        }
        for a in DEFAULT_V6 {
            zone.push_str(&format!("{name} AAAA {a}\n"));
        }
    }
    std::fs::write(storage.join("cdn.example.zone"), zone)?;
    Ok(Some(views))
}

/// The views knot-geoip would get from `world`: each prefix of a unit with a candidate, once per
/// owner name of the unit's class.
fn views_of(world: &Topology) -> usize {
    let owners = |class: &str| NAMES.iter().filter(|(_, c)| *c == class).count();
    let per_class: Vec<usize> = world.classes().iter().map(|c| owners(&c.name)).collect();
    (0..world.unit_count() as UnitIdx)
        .filter(|&u| world.candidates(u).next().is_some())
        .map(|u| world.unit_prefixes(u).len() * per_class[usize::from(world.unit_class(u))])
        .sum()
}

/// The addresses of `family` (IPv4 when `v4`) of the first candidate of unit `u` (its answer
/// in the geo setups), or the stand-in when it has none; `None` for a unit without candidates.
fn unit_answer(world: &Topology, u: UnitIdx, v4: bool) -> Option<Vec<String>> {
    let first = world.candidates(u).next()?.cluster;
    let list: Vec<String> = world
        .cluster_addresses(first)
        .iter()
        .filter(|a| a.is_ipv4() == v4)
        .map(IpAddr::to_string)
        .collect();
    Some(if list.is_empty() {
        vec![if v4 { STAND_IN_V4 } else { STAND_IN_V6 }.to_string()]
    } else {
        list
    })
}

/// Writes `mod-geoip`'s views file: for each owner name of the query file, every prefix of a
/// unit of its class with the unit's answer. Returns the views written.
fn write_views(path: &Path, world: &Topology) -> Result<usize> {
    let mut w =
        BufWriter::new(File::create(path).with_context(|| format!("creating {}", path.display()))?);
    let mut views = 0;
    for (name, class) in NAMES {
        let Some(c) = world.class_index(class) else {
            continue;
        };
        writeln!(w, "{name}.cdn.example.:")?;
        for u in 0..world.unit_count() as UnitIdx {
            if world.unit_class(u) != c {
                continue;
            }
            let (Some(v4), Some(v6)) = (unit_answer(world, u, true), unit_answer(world, u, false))
            else {
                continue;
            };
            for net in world.unit_prefixes(u) {
                writeln!(
                    w,
                    "  - net: {net}\n    A: [ {} ]\n    AAAA: [ {} ]",
                    v4.join(", "),
                    v6.join(", ")
                )?;
                views += 1;
            }
        }
    }
    w.flush()?;
    Ok(views)
}

/// Starts knotd on its configuration in `dir/NAME` (`name` also names its log in `dir`) and
/// waits until it answers on `port`.
pub(crate) fn start(
    knotd: &Path,
    dir: &Path,
    name: &'static str,
    port: u16,
) -> Result<(Proc, SocketAddr)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut peer = spawn(
        Command::new(knotd)
            .arg("-c")
            .arg(dir.join(name).join("knot.conf")),
        &dir.join(format!("{name}.log")),
        name,
    )?;
    wait_answering(addr, &mut [&mut peer], dir)?;
    Ok((peer, addr))
}

/// What a checked query must get: its addresses (sorted) and ECS scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    pub(crate) addrs: Vec<String>,
    pub(crate) scope: u8,
}

/// A query of the query file: its bytes, name, type and client subnet.
struct Asked {
    raw: Vec<u8>,
    name: String,
    qtype: RecordType,
    subnet: IpNet,
}

/// The first `n` queries of the query file at `path`.
fn read_queries(path: &Path, n: usize) -> Result<Vec<Asked>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let mut at = 0;
    while at + 2 <= bytes.len() && out.len() < n {
        let len = usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
        let raw = bytes
            .get(at + 2..at + 2 + len)
            .with_context(|| format!("{} is cut short", path.display()))?;
        at += 2 + len;
        let m = Message::from_vec(raw)
            .with_context(|| format!("a query of {} does not parse", path.display()))?;
        let q = m.queries.first().context("a query without a question")?;
        let Some(EdnsOption::Subnet(s)) = m.edns.as_ref().and_then(|e| e.option(EdnsCode::Subnet))
        else {
            bail!("a query of {} without ECS", path.display());
        };
        out.push(Asked {
            raw: raw.to_vec(),
            name: q.name().to_ascii(),
            qtype: q.query_type(),
            subnet: IpNet::new(s.addr(), s.source_prefix())?,
        });
    }
    Ok(out)
}

/// The traffic class of the query file's name `qname` (by [`NAMES`]).
fn class_of(qname: &str) -> Option<&'static str> {
    let rel = qname.strip_suffix(".cdn.example.")?;
    NAMES.iter().find_map(|&(pattern, class)| {
        let hit = match pattern.strip_prefix("*.") {
            Some(parent) => rel
                .strip_suffix(parent)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            None => rel == pattern,
        };
        hit.then_some(class)
    })
}

/// The answers knot-geoip must give to the first `n` queries of the query file at `path`: the
/// longest of its class's prefixes that holds the client's address gives the unit, whose first
/// candidate's addresses of the query's family are the answer and the prefix's length the
/// scope (the zone's defaults, scope 0, when none holds it). One pass over the world.
pub(crate) fn expected_geo(world: &Topology, path: &Path, n: usize) -> Result<Vec<Expected>> {
    let asked = read_queries(path, n)?;
    // Every prefix that could hold each client's address, to the queries it would answer.
    let mut could: HashMap<(cdnmap_mapper::ClassIdx, IpNet), Vec<usize>> = HashMap::new();
    for (i, q) in asked.iter().enumerate() {
        let class = class_of(&q.name)
            .and_then(|c| world.class_index(c))
            .with_context(|| format!("the query file's name {} has no class", q.name))?;
        let bits = if q.subnet.addr().is_ipv4() { 32 } else { 128 };
        for len in 0..=bits {
            let net = IpNet::new(q.subnet.addr(), len)?.trunc();
            could.entry((class, net)).or_default().push(i);
        }
    }
    let mut best: Vec<Option<(u8, UnitIdx)>> = vec![None; asked.len()];
    for u in 0..world.unit_count() as UnitIdx {
        if world.candidates(u).next().is_none() {
            continue;
        }
        let class = world.unit_class(u);
        for net in world.unit_prefixes(u) {
            for &i in could.get(&(class, *net)).into_iter().flatten() {
                if best[i].is_none_or(|(len, _)| net.prefix_len() > len) {
                    best[i] = Some((net.prefix_len(), u));
                }
            }
        }
    }
    asked
        .iter()
        .zip(best)
        .map(|(q, best)| {
            let v4 = q.qtype == RecordType::A;
            let (mut addrs, scope) = match best {
                Some((len, u)) => (unit_answer(world, u, v4).unwrap_or_default(), len),
                None => {
                    let d: &[&str] = if v4 { &DEFAULT_V4 } else { &DEFAULT_V6 };
                    (d.iter().map(|a| a.to_string()).collect(), 0)
                }
            };
            addrs.sort();
            Ok(Expected { addrs, scope })
        })
        .collect()
}

/// What Knot said: the response code, the addresses (sorted), the ECS scope, and whether an
/// RRSIG came with the addresses.
#[derive(Debug)]
struct Said {
    rcode: ResponseCode,
    addrs: Vec<String>,
    scope: Option<u8>,
    signed: bool,
}

fn says(addr: SocketAddr, raw: &[u8]) -> Option<Said> {
    let m = ask(addr, raw)?;
    let mut addrs: Vec<String> = m
        .answers
        .iter()
        .filter_map(|r| r.data.ip_addr())
        .map(|a| a.to_string())
        .collect();
    addrs.sort();
    let signed = m
        .answers
        .iter()
        .any(|r| r.record_type() == RecordType::RRSIG);
    let scope = m
        .edns
        .as_ref()
        .and_then(|e| match e.option(EdnsCode::Subnet) {
            Some(EdnsOption::Subnet(s)) => Some(s.scope_prefix()),
            _ => None,
        });
    Some(Said {
        rcode: m.metadata.response_code,
        addrs,
        scope,
        signed,
    })
}

/// Checks Knot's answers (at `addr`, set up as `setup`) to the first queries of the query file
/// at `path`: NOERROR with addresses and the ECS option echoed; for the geo setups the addresses
/// and scope of `expected` (from [`expected_geo`], for the same queries); signed, an RRSIG with
/// them. Returns how many were checked.
pub(crate) fn check_answers(
    addr: SocketAddr,
    setup: Setup,
    path: &Path,
    expected: &[Expected],
) -> Result<usize> {
    let n = if setup == Setup::Static {
        CHECKED
    } else {
        expected.len()
    };
    let asked = read_queries(path, n)?;
    for (i, q) in asked.iter().enumerate() {
        let said = says(addr, &q.raw)
            .with_context(|| format!("no answer to {} {} (ECS {})", q.name, q.qtype, q.subnet))?;
        let wrong = |what: String| {
            anyhow::anyhow!(
                "query {i} of {}, {} {} (ECS {}): {what}",
                path.display(),
                q.name,
                q.qtype,
                q.subnet
            )
        };
        if said.rcode != ResponseCode::NoError || said.addrs.is_empty() {
            return Err(wrong(format!("{said:?}, not NOERROR with addresses")));
        }
        let Some(scope) = said.scope else {
            return Err(wrong("no ECS option in the answer".into()));
        };
        if setup != Setup::Static {
            let want = expected
                .get(i)
                .context("fewer expected answers than queries")?;
            if said.addrs != want.addrs || scope != want.scope {
                return Err(wrong(format!(
                    "{:?} scope {scope}, where the world says {:?} scope {}",
                    said.addrs, want.addrs, want.scope
                )));
            }
        }
        if (setup == Setup::GeoipSigned) != said.signed {
            return Err(wrong(format!(
                "signed {}, set up as {setup:?}",
                said.signed
            )));
        }
    }
    Ok(asked.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_world::world::WorldParams;

    /// Knot, started on each setup for a small world, gives the query file's first queries the
    /// answers the world says (the geo setups: the unit's first candidate's addresses, the
    /// prefix's length as the scope; signed: with an RRSIG), and the check fails on an answer
    /// that is not so. (A real Knot, installed from Debian when missing.)
    #[test]
    fn knot_answers_the_query_file_as_the_world_says() {
        let world = cdnmap_world::world::generate(
            &WorldParams {
                map_units: 300,
                clusters: 10,
                seed: 5,
                ..WorldParams::default()
            },
            &|_| {},
        )
        .expect("world");
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = dir.path().join("q.bin");
        let signed = dir.path().join("q-do.bin");
        crate::dns_query::write_queries(&world, 300, 5, &plain, Default::default())
            .expect("queries");
        crate::dns_query::write_queries(
            &world,
            300,
            5,
            &signed,
            crate::dns_query::QueryFlags {
                dnssec_ok: true,
                cookies: false,
            },
        )
        .expect("DO queries");
        let expected = expected_geo(&world, &plain, 300).expect("expected answers");
        let scoped = expected.iter().filter(|e| e.scope > 0).count();
        assert!(scoped >= 290, "only {scoped} of 300 queries in a view");
        let knotd = cdnmap_tests::ensure_debian_tool("knotd", &["knot", "knot-module-geoip"])
            .expect("knotd");
        let setups = [
            (Setup::Static, "knot-static", &plain),
            (Setup::Geoip, "knot-geoip", &plain),
            (Setup::GeoipSigned, "knot-geoip-signed", &signed),
        ];
        let mut peers = Vec::new();
        for (setup, name, queries) in setups {
            let port = crate::procs::free_port().expect("port");
            let views = write_config(&dir.path().join(name), (port, 1), setup, &world)
                .expect("config")
                .expect("within the bound");
            assert_eq!(views == 0, setup == Setup::Static);
            let (peer, addr) = start(&knotd, dir.path(), name, port).expect("knotd answers");
            let want = if setup == Setup::Static {
                &[][..]
            } else {
                &expected
            };
            let n = check_answers(addr, setup, queries, want)
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_eq!(
                n,
                if setup == Setup::Static {
                    300
                } else {
                    expected.len()
                }
            );
            peers.push((setup, addr, peer));
        }
        // The checks can fail: unsigned answers where signed ones are due, and answers of
        // another world.
        let (_, geo, _) = &peers[1];
        assert!(check_answers(*geo, Setup::GeoipSigned, &plain, &expected).is_err());
        let mut wrong = expected.clone();
        wrong[7].addrs = vec!["192.0.2.99".to_string()];
        assert!(check_answers(*geo, Setup::Geoip, &plain, &wrong).is_err());
        let mut wrong = expected.clone();
        wrong[9].scope = 5;
        assert!(check_answers(*geo, Setup::Geoip, &plain, &wrong).is_err());
    }

    #[test]
    fn names_map_to_their_class() {
        assert_eq!(class_of("www.cdn.example."), Some("web"));
        assert_eq!(class_of("c7.web.cdn.example."), Some("web"));
        assert_eq!(class_of("v1.video.cdn.example."), Some("video"));
        assert_eq!(class_of("api9.apps.cdn.example."), Some("apps"));
        assert_eq!(class_of("video.cdn.example."), None);
        assert_eq!(class_of("xvideo.cdn.example."), None);
        assert_eq!(class_of("v1.video.other.example."), None);
    }
}
