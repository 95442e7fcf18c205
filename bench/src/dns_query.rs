//! The query files and the DNS exchanges of `cdnmap bench dns` and its peers' setups
//! (`crate::knot`): a query as dnsperf sends it (ECS, the DO bit, a client cookie), the query
//! file drawn from a world by demand, one question asked and answered, and the wait for a
//! server to answer.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cdnmap_dns::config::fqdn;
use cdnmap_mapper::UnitIdx;
use cdnmap_topology::Topology;
use hickory_server::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_server::proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
use hickory_server::proto::rr::RecordType;
use ipnet::IpNet;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::procs::{check_running, Proc};

/// Content names per class in the query file.
pub(crate) const NAMES_PER_CLASS: u32 = 1000;
/// How long a server may take to start answering (at 11 M units the mapper's first map and a
/// front end's join take minutes; a server that exits fails the wait at once).
pub(crate) const READY: Duration = Duration::from_secs(900);

/// What every query of a query file carries besides its question and ECS option.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QueryFlags {
    /// The DO bit (RFC 3225).
    pub dnssec_ok: bool,
    /// A client cookie of its own (RFC 7873).
    pub cookies: bool,
}

/// One query, encoded, with the DO bit of `flags` and a COOKIE option of the client cookie
/// `cookie` when given.
pub(crate) fn query(
    id: u16,
    name: &str,
    qtype: RecordType,
    subnet: Option<IpNet>,
    flags: QueryFlags,
    cookie: Option<[u8; 8]>,
) -> Result<Vec<u8>> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    let name = fqdn("query", name).map_err(|e| anyhow::anyhow!("{e}"))?;
    m.add_query(Query::query(name, qtype));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    edns.set_dnssec_ok(flags.dnssec_ok);
    if let Some(net) = subnet {
        edns.options_mut()
            .insert(EdnsOption::Subnet(ClientSubnet::from(net)));
    }
    if let Some(c) = cookie {
        let code = cdnmap_dns::cookie::OPTION_COOKIE;
        edns.options_mut()
            .insert(EdnsOption::Unknown(code, c.to_vec()));
    }
    m.set_edns(edns);
    Ok(m.to_vec()?)
}

/// `addr`'s answer to the query `q` (encoded), if one came within 300 ms.
pub(crate) fn ask(addr: SocketAddr, q: &[u8]) -> Option<Message> {
    let socket = UdpSocket::bind("127.0.0.1:0").ok()?;
    socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .ok()?;
    socket.send_to(q, addr).ok()?;
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).ok()?;
    Message::from_vec(&buf[..n]).ok()
}

/// Whether `addr` answers `www.<zone> A` with NOERROR and an address.
pub(crate) fn answers(addr: SocketAddr, zone: &str) -> bool {
    query(
        7,
        &format!("www.{zone}"),
        RecordType::A,
        None,
        QueryFlags::default(),
        None,
    )
    .ok()
    .and_then(|q| ask(addr, &q))
    .is_some_and(|m| m.metadata.response_code == ResponseCode::NoError && !m.answers.is_empty())
}

pub(crate) fn wait_answering(addr: SocketAddr, procs: &mut [&mut Proc], dir: &Path) -> Result<()> {
    let started = Instant::now();
    while !answers(addr, "cdn.example.") {
        check_running(procs, dir)?;
        if started.elapsed() > READY {
            bail!(
                "{addr} did not answer within {READY:?}; see the logs in {}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// A host address inside `net` at `offset` (wrapped into the host part).
fn host(net: IpNet, offset: u128) -> IpAddr {
    match net {
        IpNet::V4(n) => {
            let span = 1u64 << (32 - u32::from(n.prefix_len()));
            let a = u64::from(u32::from(n.network())) + (offset as u64 % span);
            IpAddr::V4(Ipv4Addr::from(a as u32))
        }
        IpNet::V6(n) => {
            let bits = 128 - u32::from(n.prefix_len());
            let span = if bits >= 128 {
                u128::MAX
            } else {
                (1u128 << bits) - 1
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) | (offset & span)))
        }
    }
}

/// Writes the query file, every query with what `flags` says (the DO bit, a client cookie of
/// its own): the same queries otherwise; returns how many queries of each type it holds.
pub(crate) fn write_queries(
    instance: &Topology,
    n: usize,
    seed: u64,
    path: &Path,
    flags: QueryFlags,
) -> Result<(usize, usize)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xd115);
    let units: Vec<UnitIdx> = (0..instance.unit_count() as UnitIdx)
        .filter(|&u| !instance.unit_prefixes(u).is_empty() && instance.unit_demand(u) > 0.0)
        .collect();
    if units.is_empty() {
        bail!("the world has no map unit with a prefix and demand");
    }
    let mut cum = Vec::with_capacity(units.len());
    let mut total = 0.0;
    for &u in &units {
        total += instance.unit_demand(u);
        cum.push(total);
    }
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::new(file);
    let (mut a, mut aaaa) = (0, 0);
    for i in 0..n {
        let x = rng.random::<f64>() * total;
        let u = units[cum.partition_point(|&c| c <= x).min(units.len() - 1)];
        let prefixes = instance.unit_prefixes(u);
        let net = prefixes[rng.random_range(0..prefixes.len())];
        let class = &instance.classes()[usize::from(instance.unit_class(u))].name;
        let k = rng.random_range(0..NAMES_PER_CLASS);
        let name = match class.as_str() {
            "video" => format!("v{k}.video.cdn.example."),
            "apps" => format!("api{k}.apps.cdn.example."),
            _ if k % 2 == 0 => "www.cdn.example.".to_string(),
            _ => format!("c{k}.web.cdn.example."),
        };
        let (qtype, len) = match net {
            IpNet::V4(_) => {
                a += 1;
                (RecordType::A, net.prefix_len().min(24))
            }
            IpNet::V6(_) => {
                aaaa += 1;
                (RecordType::AAAA, net.prefix_len().min(56))
            }
        };
        let client = IpNet::new(host(net, rng.random::<u128>()), len)?.trunc();
        let cookie = flags.cookies.then(|| rng.random::<[u8; 8]>());
        let bytes = query(i as u16, &name, qtype, Some(client), flags, cookie)?;
        w.write_all(&(bytes.len() as u16).to_be_bytes())?;
        w.write_all(&bytes)?;
    }
    w.flush()?;
    Ok((a, aaaa))
}

/// The names of the query file and the traffic class each stands for.
pub(crate) const NAMES: [(&str, &str); 4] = [
    ("www", "web"),
    ("*.web", "web"),
    ("*.video", "video"),
    ("*.apps", "apps"),
];
