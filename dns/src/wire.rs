//! The UDP fast path: the common query — one question for the A or AAAA records of a mapped
//! name below a zone's apex, with at most an OPT record carrying at most a client subnet and a
//! DNS cookie (`crate::cookie`: its server cookie is appended to the response's OPT record) —
//! read and answered on the wire, without hickory's message types.
//!
//! Why: at a million map units hickory's decoding of the request and encoding of the response
//! (names as label vectors, records as structs, each allocated and freed, a compression table
//! per message) were about a fifth of the front end's CPU a query, more than the map lookup
//! (`docs/perf/bench-serve.md`, `bench dns` against gdnsd). gdnsd answers from the wire too.
//!
//! **One behaviour.** The fast path answers only what it can answer exactly as the hickory path
//! does, byte for byte, and gives everything else back (`None`): the hickory path then decides
//! as before. Anything unusual gives up before anything is counted: a header flag or count
//! other than a plain query's, a compressed or non-LDH name, another type or class, an OPT
//! record of another version or with any option but one well-formed ECS option (no address
//! bits beyond its source prefix, scope 0) and one well-formed COOKIE option, trailing bytes, a name at an apex, matched by no
//! hostname rule or with static records (`crate::zonedata`), no map yet, an answer with no
//! address (NODATA) or larger than the response may be. A DO query in a signed zone
//! (`crate::dnssec`) is answered here too: the address records followed by their RRSIGs from
//! the signature cache (made on a miss), each owned by a pointer to the first, and DO set in
//! the OPT record, as hickory's path writes them. The test below holds the two paths to the same bytes over generated queries.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use cdnmap_mapper::model::ClassIdx;
use cdnmap_serve::answer::{self, QType, Query, Records, View};
use cdnmap_serve::resolve::{Answer, Route};
use cdnmap_serve::servers::{key_hash_of, Servers, PREFETCH_STEPS};

use super::cookie::{self, Checked, Cookies};
use super::demand::BlockCounts;
use super::front::{Front, Zones, SCRATCH};
use super::walk::{each_option, u16_at};
use super::zonedata::StaticData;

/// Header flags of a query the fast path takes: QR, opcode, AA, TC, RA, Z, AD and RCODE all 0
/// (RD and CD, which the response copies, may be set).
const QUERY_FLAGS_FREE: u16 = 0x0110;
/// The response's flags besides RD and CD: QR and AA.
const RESPONSE_FLAGS: u16 = 0x8400;
const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const TYPE_OPT: u16 = 41;
const TYPE_RRSIG: u16 = 46;
const TYPE_NSEC: u16 = 47;
const CLASS_IN: u16 = 1;
const OPTION_ECS: u16 = 8;
/// Without EDNS a UDP response may be 512 bytes (RFC 1035 §4.2.1).
const PLAIN_UDP: usize = 512;

/// A query's ECS option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ecs {
    /// 1 (IPv4) or 2 (IPv6).
    family: u16,
    source: u8,
    addr: IpAddr,
}

/// The parts of a query the fast path reads.
#[derive(Debug, Clone, Copy)]
struct Parsed<'a> {
    id: [u8; 2],
    flags: u16,
    /// The question section as sent (name, type, class).
    question: &'a [u8],
    /// How many labels the name has.
    labels: u8,
    qtype: u16,
    /// The OPT record's UDP payload size, if the query has one.
    edns_payload: Option<u16>,
    ecs: Option<Ecs>,
    /// The COOKIE option's data, as sent (checked by [`take`]).
    cookie: Option<&'a [u8]>,
    /// The COOKIE option to answer with (the client cookie and ours), set by [`take`].
    cookie_reply: Option<[u8; cookie::REPLY_LEN]>,
    /// The OPT record's DO bit (RFC 3225): in a signed zone, hickory's path answers it
    /// (`crate::dnssec`).
    dnssec_ok: bool,
}

/// The query in `raw`, if it is one the fast path takes (module docs).
fn parse(raw: &[u8]) -> Option<Parsed<'_>> {
    let flags = u16_at(raw, 2)?;
    if flags & !QUERY_FLAGS_FREE != 0 {
        return None;
    }
    let counts = [
        u16_at(raw, 4)?,
        u16_at(raw, 6)?,
        u16_at(raw, 8)?,
        u16_at(raw, 10)?,
    ];
    if counts[..3] != [1, 0, 0] || counts[3] > 1 {
        return None;
    }
    // The name: uncompressed labels of letters, digits, '-' and '_', 255 bytes at most, no
    // label beginning with '-' (hickory shows that one escaped, `\-`: its text, and so the
    // content key, would differ from ours).
    let (mut at, mut labels) = (12, 0usize);
    loop {
        let len = usize::from(*raw.get(at)?);
        if len == 0 {
            break;
        }
        labels += 1;
        if len > 63 {
            return None; // a pointer or an extended label type
        }
        let label = raw.get(at + 1..at + 1 + len)?;
        if label[0] == b'-'
            || !label
                .iter()
                .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            return None;
        }
        at += 1 + len;
    }
    if at == 12 || at + 1 - 12 > 255 {
        return None; // the root, or too long
    }
    let labels = u8::try_from(labels).ok()?; // at most 127 in 255 bytes
    at += 1;
    let qtype = u16_at(raw, at)?;
    if !matches!(qtype, TYPE_A | TYPE_AAAA) || u16_at(raw, at + 2)? != CLASS_IN {
        return None;
    }
    at += 4;
    let question = &raw[12..at];
    let (mut edns_payload, mut ecs, mut cookie, mut dnssec_ok) = (None, None, None, false);
    if counts[3] == 1 {
        // OPT: the root name, type 41, class = payload size, TTL = extended RCODE, version,
        // flags; then its options.
        if *raw.get(at)? != 0 || u16_at(raw, at + 1)? != TYPE_OPT {
            return None;
        }
        edns_payload = Some(u16_at(raw, at + 3)?);
        if *raw.get(at + 5)? != 0 || *raw.get(at + 6)? != 0 {
            return None; // an extended RCODE, or a version other than 0
        }
        dnssec_ok = u16_at(raw, at + 7)? & 0x8000 != 0;
        let rdlen = usize::from(u16_at(raw, at + 9)?);
        at += 11;
        let rdata = raw.get(at..at + rdlen)?;
        at += rdlen;
        (ecs, cookie) = parse_options(rdata)?;
    }
    if at != raw.len() {
        return None;
    }
    Some(Parsed {
        id: [raw[0], raw[1]],
        flags,
        question,
        labels,
        qtype,
        edns_payload,
        ecs,
        cookie,
        cookie_reply: None,
        dnssec_ok,
    })
}

/// An OPT record's options when they are at most one well-formed ECS option and at most one
/// COOKIE option (its data as sent, checked later), in either order.
#[allow(clippy::type_complexity)]
fn parse_options(mut rdata: &[u8]) -> Option<(Option<Ecs>, Option<&[u8]>)> {
    let (mut ecs, mut cookie) = (None, None);
    while !rdata.is_empty() {
        let (code, len) = (u16_at(rdata, 0)?, usize::from(u16_at(rdata, 2)?));
        let data = rdata.get(4..4 + len)?;
        match code {
            OPTION_ECS if ecs.is_none() => ecs = Some(parse_ecs(data)?),
            cookie::OPTION_COOKIE if cookie.is_none() => cookie = Some(data),
            _ => return None,
        }
        rdata = &rdata[4 + len..];
    }
    Some((ecs, cookie))
}

/// An ECS option's data when it is well formed.
fn parse_ecs(rdata: &[u8]) -> Option<Ecs> {
    let family = u16_at(rdata, 0)?;
    let (source, scope) = (*rdata.get(2)?, *rdata.get(3)?);
    if scope != 0 {
        return None;
    }
    // The family, the length and the address bytes (none beyond the source prefix).
    let addr = cdnmap_serve::columns::ecs_address(family, source, &rdata[4..]).ok()?;
    Some(Ecs {
        family,
        source,
        addr,
    })
}

/// Whether each ECS option of `raw`'s OPT record carries exactly the address octets its
/// source prefix needs, with no bit set beyond the prefix (RFC 7871 §6: a server SHOULD
/// answer FORMERR otherwise). hickory reads only the octets the prefix needs and drops the
/// rest, so what the query sent is checked here, on the wire. True when there is no ECS
/// option, or the message cannot be walked (hickory then refuses it itself).
pub(crate) fn ecs_octets_ok(raw: &[u8]) -> bool {
    ecs_options(raw).is_none_or(|options| {
        options.iter().all(|o| {
            o.len() >= 4
                && u16_at(o, 0).is_some_and(|family| {
                    cdnmap_serve::columns::ecs_address(family, o[2], &o[4..]).is_ok()
                })
        })
    })
}

/// The data of every ECS option in `raw`'s OPT record; `None` when the message cannot be
/// walked that far.
fn ecs_options(raw: &[u8]) -> Option<Vec<&[u8]>> {
    let mut found = Vec::new();
    each_option(raw, |code, data| {
        if code == OPTION_ECS {
            found.push(data);
        }
    })?;
    Some(found)
}

/// Writes `question`'s name in lower case as text with its final dot, as hickory shows a
/// `LowerName` of such labels.
fn name_text(question: &[u8], out: &mut String) {
    // The labels' bytes and their dots into `out`'s own buffer, checked as UTF-8 once (`parse`
    // let through only letters, digits, '-' and '_': ASCII).
    let mut bytes = std::mem::take(out).into_bytes();
    bytes.clear();
    let mut at = 0;
    while let Some(&len) = question.get(at) {
        if len == 0 {
            break;
        }
        bytes.extend_from_slice(&question[at + 1..at + 1 + usize::from(len)]);
        bytes.push(b'.');
        at += 1 + usize::from(len);
    }
    bytes.make_ascii_lowercase();
    *out = String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
}

/// Datagrams answered together: their map lookups are started together (the resolver's
/// batch, prefetched), so one query's cache misses overlap the others'.
const BLOCK: usize = 32;

thread_local! {
    /// Each query's name as text, for a block.
    static NAMES: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The responses to `batch` (datagram, source) into `out`, one for each: empty where the
/// fast path does not take it (module docs), for the hickory path to answer. The demand and
/// outcome of each it answers are counted as the hickory path counts them. `out`'s buffers
/// are reused (cleared, their memory kept): a loop answering batch after batch allocates
/// nothing for the responses it writes.
pub(crate) fn answer_batch(front: &Front, batch: &[(&[u8], SocketAddr)], out: &mut Vec<Vec<u8>>) {
    if out.len() < batch.len() {
        out.resize_with(batch.len(), Vec::new);
    }
    out.truncate(batch.len());
    out.iter_mut().for_each(Vec::clear);
    for (block, answers) in batch.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
        answer_block(front, block, answers);
    }
}

/// A query the fast path took: as parsed, as the decision reads it, and its rule's class.
type Taken<'a, 'n> = Option<(Parsed<'a>, Query<'n>, ClassIdx)>;

/// [`answer_batch`] for at most [`BLOCK`] datagrams.
fn answer_block(front: &Front, batch: &[(&[u8], SocketAddr)], out: &mut [Vec<u8>]) {
    let guard = front.live.load();
    let Some(live) = guard.as_deref() else {
        return; // no map yet: SERVFAIL, hickory's
    };
    let view = live.view();
    let Some(servers) = view.servers else {
        return;
    };
    let statics = front.zones.statics.load();
    NAMES.with_borrow_mut(|names| {
        if names.len() < BLOCK {
            names.resize(BLOCK, String::new());
        }
        // 1: what each datagram asks, where the fast path takes it (up to the map).
        let mut taken: [Taken<'_, '_>; BLOCK] = [None; BLOCK];
        for ((t, &(raw, src)), name) in taken.iter_mut().zip(batch).zip(names.iter_mut()) {
            *t = take(
                &front.zones,
                &front.cookies,
                &statics,
                &view,
                raw,
                src,
                name,
            );
        }
        // 2: the map's answers, looked up together.
        let queries: Vec<(IpNet, &str, ClassIdx)> = taken
            .iter()
            .flatten()
            .map(|(_, q, class)| (q.client, q.name, *class))
            .collect();
        let mut answers = Vec::with_capacity(queries.len());
        view.resolver.resolve_classed(&queries, &mut answers);
        // 3: the servers, their reads started together too, then the decisions, the bytes
        // and the counts.
        SCRATCH.with_borrow_mut(|scratch| {
            let mut hashes = [0u64; BLOCK];
            for (h, t) in hashes.iter_mut().zip(&taken) {
                if let Some((_, q, _)) = t {
                    *h = key_hash_of(q.name, &mut scratch.key);
                }
            }
            let demand = front.demand.block(view.resolver);
            for a in &answers {
                demand.prefetch(a);
            }
            prefetch_servers(servers, &taken, &hashes, &answers);
            let block = Block {
                front,
                view: &view,
                statics: &statics,
                taken: &taken,
                hashes: &hashes,
                answers: &answers,
            };
            block.answer(&demand, &mut scratch.addrs, out);
        });
    });
}

/// Starts the reads of the server picks of a block's queries, each step over the block, then
/// the next ([`PREFETCH_STEPS`]).
fn prefetch_servers(
    servers: &Servers,
    taken: &[Taken<'_, '_>],
    hashes: &[u64],
    answers: &[Answer],
) {
    let picks = || {
        taken
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.map(|(q, _, _)| (i, q.qtype == TYPE_AAAA)))
            .zip(answers)
    };
    for step in 0..PREFETCH_STEPS {
        for ((i, v6), a) in picks() {
            for c in a.named() {
                servers.prefetch(c, v6, hashes[i], step);
            }
        }
    }
}

/// A block's queries taken, with their names' selection hashes and the map's answers (in
/// the order of those taken).
struct Block<'b, 'a, 'n> {
    front: &'b Front,
    view: &'b View<'b>,
    statics: &'b StaticData,
    taken: &'b [Taken<'a, 'n>],
    hashes: &'b [u64],
    answers: &'b [Answer],
}

impl Block<'_, '_, '_> {
    /// The decision for each query taken, its bytes into `out` where it is an answer with
    /// addresses routed by the map and fits; its demand and outcome counted as the hickory
    /// path counts them.
    fn answer(&self, demand: &BlockCounts<'_>, addrs: &mut Vec<IpAddr>, out: &mut [Vec<u8>]) {
        let front = self.front;
        // DNSSEC: the keys in use and the clock, read once a block and only when a zone is
        // signed and a query asks (DO).
        let keys = self
            .taken
            .iter()
            .flatten()
            .any(|(p, ..)| p.dnssec_ok)
            .then(|| front.dnssec.keys())
            .flatten();
        let now = keys.as_ref().map_or(0, |_| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
        // The block's answers by route, counted once for the block (a shared counter's
        // atomic add per query is a cache line the answering threads pass between them).
        let mut routed = [0u64; Route::ALL.len()];
        // The demand each answered query counts, added after the block's answers: each
        // add is an atomic read-modify-write, a full barrier on x86, and in the loop it
        // held up the next query's loads behind its cache miss.
        let mut counted: [Option<(IpNet, Answer)>; BLOCK] = [None; BLOCK];
        let mut n_counted = 0;
        let mut answers = self.answers.iter();
        for (i, t) in self.taken.iter().enumerate() {
            let (Some((p, q, _)), Some(a)) = (t, t.and_then(|_| answers.next())) else {
                continue;
            };
            let zones = &front.zones.names;
            let d = answer::from_map(zones, self.view, q, *a, self.hashes[i], addrs);
            let Some(m) = d.mapped.filter(|m| m.route != Route::Bypass) else {
                continue; // the class's last resort: hickory's (a CNAME, perhaps)
            };
            if d.records != Records::Addresses {
                continue; // NODATA: hickory's, with the SOA
            }
            let scope = m.ecs_scope.unwrap_or(0);
            let sig = keys
                .as_deref()
                .filter(|_| p.dnssec_ok)
                .and_then(|k| d.zone.and_then(|z| k.zone(z)))
                .map(|zone| Sig {
                    zone,
                    now,
                    wildcard: crate::dnssec::reply::signed_as_wildcard(
                        self.view.resolver.rules().synthesized_from(q.name),
                        zone,
                        self.statics,
                        q.name,
                    ),
                });
            if !encode(p, front, addrs, scope, sig, &mut out[i]) {
                continue; // truncated: hickory's
            }
            if m.demand {
                counted[n_counted] = Some((m.client, m.answer));
                n_counted += 1;
            }
            if m.count_host {
                front.demand.count_host(q.name);
            }
            routed[m.route as usize] += 1;
        }
        for (client, a) in counted[..n_counted].iter().flatten() {
            demand.count(client, a);
        }
        let answered: u64 = routed.iter().sum();
        if answered > 0 {
            front.counters.answer.increment(answered);
            for (route, n) in Route::ALL.into_iter().zip(routed) {
                if n > 0 {
                    front.counters.route(route).increment(n);
                }
            }
        }
    }
}

/// The labels of a name as on the wire (uncompressed, up to the root).
#[derive(Clone)]
struct WireLabels<'a>(&'a [u8]);

impl<'a> Iterator for WireLabels<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (&len, rest) = self.0.split_first()?;
        if len == 0 {
            return None;
        }
        let (label, rest) = rest.split_at_checked(usize::from(len))?;
        self.0 = rest;
        Some(label)
    }
}

/// The query in `raw` from `src`, as the decision reads it, and its class, if the fast path
/// takes it (module docs: up to the map's answer, the decision's first step); its name as
/// text left in `name`.
fn take<'a, 'n>(
    zones: &Zones,
    cookies: &Cookies,
    statics: &StaticData,
    view: &View<'_>,
    raw: &'a [u8],
    src: SocketAddr,
    name: &'n mut String,
) -> Taken<'a, 'n> {
    let mut p = parse(raw)?;
    if let Some(option) = p.cookie {
        // Malformed: FORMERR, hickory's.
        match cookies.check(option, src.ip(), cookies.now()) {
            Checked::Malformed => return None,
            Checked::Good { reply, .. } => p.cookie_reply = Some(reply),
        }
    }
    name_text(p.question, name);
    let name: &'n String = name;
    let ecs = match p.ecs {
        Some(e) => answer::Ecs::Subnet {
            addr: e.addr,
            source: e.source,
        },
        None => answer::Ecs::Absent,
    };
    let q = Query {
        name,
        place: zones
            .names
            .place(usize::from(p.labels), WireLabels(p.question)),
        class_in: true,                          // `parse` takes class IN only
        qtype: QType::of(p.qtype),               // A or AAAA
        edns_version: p.edns_payload.map(|_| 0), // version 0 only
        ecs,
        client: ecs.client(src.ip()),
    };
    // At an apex, outside the zones or for a name no rule names: hickory's.
    let class = answer::admit(&q, Some(view.resolver.rules())).ok()?;
    // A static name (`crate::zonedata`), even one a rule names: hickory's.
    if statics.get(name).is_some() {
        return None;
    }
    Some((p, q, class))
}

/// The response's bytes into `out` (empty), as hickory encodes it: the question as sent; the
/// first answer's owner the name in lower case, the others a pointer to it; the OPT record
/// with our payload size (the query's within 512 and `max_udp_payload`, as `decide` sets it)
/// and the ECS option echoed with `scope`. False, and `out` left empty, when it would be
/// longer than a response may be: that payload size, or 512 bytes without EDNS (hickory's
/// path then truncates).
fn encode(
    q: &Parsed<'_>,
    front: &Front,
    addrs: &[IpAddr],
    scope: u8,
    sig: Option<Sig<'_>>,
    out: &mut Vec<u8>,
) -> bool {
    let fits = encode_into(q, front, addrs, scope, sig, out);
    if !fits {
        out.clear();
    }
    fits
}

/// A DO query's answer in a signed zone: its zone's keys, now (Unix seconds), and the labels
/// of the wildcard its answer is signed as, if any (`crate::dnssec::reply`).
#[derive(Clone, Copy)]
struct Sig<'k> {
    zone: &'k crate::dnssec::ZoneKeys,
    now: u64,
    wildcard: Option<u8>,
}

/// The RRSIG records of the address records just written to `out` (the first one's owner at
/// `owner`, `name` bytes long, in lower case), each owned by a pointer to it, as hickory's
/// path writes them (`crate::dnssec::reply`); how many. Signed as the wildcard's RRset when
/// `star` is the wildcard's name (wire form) and labels.
fn encode_rrsigs(
    front: &Front,
    sig: Sig<'_>,
    (labels, star): (u8, Option<&[u8]>),
    addrs: &[IpAddr],
    (owner, name): (usize, usize),
    out: &mut Vec<u8>,
) -> u16 {
    let owner_wire = star.map_or_else(|| out[owner..owner + name].to_vec(), <[u8]>::to_vec);
    let octets: Vec<([u8; 16], usize)> = addrs
        .iter()
        .map(|ip| match ip {
            IpAddr::V4(a) => {
                let mut o = [0u8; 16];
                o[..4].copy_from_slice(&a.octets());
                (o, 4)
            }
            IpAddr::V6(a) => (a.octets(), 16),
        })
        .collect();
    let mut rdatas: Vec<&[u8]> = octets.iter().map(|(o, n)| &o[..*n]).collect();
    let rtype = match addrs.first() {
        Some(IpAddr::V6(_)) => TYPE_AAAA,
        _ => TYPE_A,
    };
    let signed = Signed {
        owner: &owner_wire,
        labels,
        rtype,
        ttl: front.ttl,
    };
    write_rrsigs(front, sig, signed, &mut rdatas, owner, out)
}

/// What an RRSIG covers: the RRset's owner as signed (wire form, lower case), its Labels
/// field, type and TTL.
struct Signed<'o> {
    owner: &'o [u8],
    labels: u8,
    rtype: u16,
    ttl: u32,
}

/// The RRSIG records of the RRset `signed` of `rdatas`, each owned by a pointer to `at`;
/// how many.
fn write_rrsigs(
    front: &Front,
    sig: Sig<'_>,
    signed: Signed<'_>,
    rdatas: &mut [&[u8]],
    at: usize,
    out: &mut Vec<u8>,
) -> u16 {
    let mut written = 0;
    front.dnssec.rrsig_rdatas(
        sig.zone,
        signed.owner,
        signed.labels,
        signed.rtype,
        signed.ttl,
        rdatas,
        sig.now,
        |rdata| {
            out.extend_from_slice(&(0xc000 | at as u16).to_be_bytes());
            out.extend_from_slice(&TYPE_RRSIG.to_be_bytes());
            out.extend_from_slice(&CLASS_IN.to_be_bytes());
            out.extend_from_slice(&signed.ttl.to_be_bytes());
            out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            out.extend_from_slice(rdata);
            written += 1;
        },
    );
    written
}

/// A wildcard answer's proof (RFC 4035 §3.1.3.3), after the answer section: the NSEC of
/// [`crate::dnssec::sign::white_lie`] (its owner's first label, then a pointer to the rest
/// of the answer's owner at `owner`, as hickory compresses it) and its RRSIGs; how many
/// records.
fn encode_wildcard_proof(
    front: &Front,
    sig: Sig<'_>,
    (nsec_owner, nsec_rdata): (&[u8], &[u8]),
    owner: usize,
    out: &mut Vec<u8>,
) -> u16 {
    let at = out.len();
    let first = 1 + usize::from(nsec_owner[0]);
    out.extend_from_slice(&nsec_owner[..first]);
    let rest = owner + 1 + usize::from(out[owner]);
    out.extend_from_slice(&(0xc000 | rest as u16).to_be_bytes());
    let ttl = crate::dnssec::reply::NSEC_TTL_DEFAULT;
    out.extend_from_slice(&TYPE_NSEC.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&ttl.to_be_bytes());
    out.extend_from_slice(&(nsec_rdata.len() as u16).to_be_bytes());
    out.extend_from_slice(nsec_rdata);
    let signed = Signed {
        owner: nsec_owner,
        labels: crate::dnssec::sign::wire_labels(nsec_owner),
        rtype: TYPE_NSEC,
        ttl,
    };
    1 + write_rrsigs(front, sig, signed, &mut [nsec_rdata], at, out)
}

/// The RRSIGs of the answer just written to `out` (its owner at `owner`, `name` bytes long, in
/// lower case, `addrs` its addresses), and for a wildcard's answer the NSEC that proves it
/// (`crate::dnssec::reply`): signed as `*.<encloser>`, with a white lie's NSEC in the authority
/// section. The header's counts set; false when they overflow.
fn encode_signatures(
    q: &Parsed<'_>,
    front: &Front,
    addrs: &[IpAddr],
    sig: Sig<'_>,
    (owner, name): (usize, usize),
    out: &mut Vec<u8>,
) -> bool {
    let lower: Vec<u8> = out[owner..owner + name].to_vec();
    let wildcard = sig.wildcard.and_then(|l| {
        let lie = crate::dnssec::sign::white_lie(&lower)?;
        let mut star = vec![1, b'*'];
        star.extend_from_slice(&lower[1 + usize::from(lower[0])..]);
        Some((l, star, lie))
    });
    let (labels, star) = match &wildcard {
        Some((l, star, _)) => (*l, Some(star.as_slice())),
        None => (q.labels, None),
    };
    let rrsigs = encode_rrsigs(front, sig, (labels, star), addrs, (owner, name), out);
    let Some(total) = u16::try_from(addrs.len())
        .ok()
        .and_then(|a| a.checked_add(rrsigs))
    else {
        return false;
    };
    out[6..8].copy_from_slice(&total.to_be_bytes());
    if let Some((_, _, (nsec_owner, nsec_rdata))) = &wildcard {
        let proof = (nsec_owner.as_slice(), nsec_rdata.as_slice());
        let n = encode_wildcard_proof(front, sig, proof, owner, out);
        out[8..10].copy_from_slice(&n.to_be_bytes());
    }
    true
}

/// [`encode`]'s bytes, whether they fit.
fn encode_into(
    q: &Parsed<'_>,
    front: &Front,
    addrs: &[IpAddr],
    scope: u8,
    sig: Option<Sig<'_>>,
    out: &mut Vec<u8>,
) -> bool {
    // `max_udp_payload` is at least 512 (the config's bounds); `max` keeps `clamp` total.
    let payload = q.edns_payload.map(|p| {
        p.clamp(
            PLAIN_UDP as u16,
            front.max_udp_payload.max(PLAIN_UDP as u16),
        )
    });
    let max = payload.map_or(PLAIN_UDP, usize::from);
    out.reserve(max.min(PLAIN_UDP));
    out.extend_from_slice(&q.id);
    out.extend_from_slice(&(RESPONSE_FLAGS | (q.flags & QUERY_FLAGS_FREE)).to_be_bytes());
    let Ok(answers) = u16::try_from(addrs.len()) else {
        return false;
    };
    for count in [1, answers, 0, u16::from(q.edns_payload.is_some())] {
        out.extend_from_slice(&count.to_be_bytes());
    }
    out.extend_from_slice(q.question);
    let owner = out.len();
    let name = &q.question[..q.question.len() - 4];
    for (i, ip) in addrs.iter().enumerate() {
        if i == 0 {
            out.extend(name.iter().map(u8::to_ascii_lowercase));
        } else {
            out.extend_from_slice(&(0xc000 | owner as u16).to_be_bytes());
        }
        let (rtype, rdata): (u16, &[u8]) = match ip {
            IpAddr::V4(a) => (TYPE_A, &a.octets()[..]),
            IpAddr::V6(a) => (TYPE_AAAA, &a.octets()[..]),
        };
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&front.ttl.to_be_bytes());
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(rdata);
    }
    if let Some(sig) = sig {
        if !encode_signatures(q, front, addrs, sig, (owner, name.len()), out) {
            return false;
        }
    }
    if let Some(payload) = payload {
        out.push(0);
        out.extend_from_slice(&TYPE_OPT.to_be_bytes());
        out.extend_from_slice(&payload.to_be_bytes());
        // The DO bit, when the answer is signed (RFC 3225: a signed response copies it).
        let flags: u8 = if sig.is_some() { 0x80 } else { 0 };
        out.extend_from_slice(&[0, 0, flags, 0]);
        // The options, in hickory's order: ECS echoed, then the cookie.
        let ecs_len = q.ecs.map_or(0, |e| 8 + usize::from(e.source).div_ceil(8));
        let cookie_len = q.cookie_reply.map_or(0, |c| 4 + c.len());
        out.extend_from_slice(&((ecs_len + cookie_len) as u16).to_be_bytes());
        if let Some(e) = q.ecs {
            let n = usize::from(e.source).div_ceil(8);
            let mut octets = [0u8; 16];
            match e.addr {
                IpAddr::V4(a) => octets[..4].copy_from_slice(&a.octets()),
                IpAddr::V6(a) => octets = a.octets(),
            }
            out.extend_from_slice(&OPTION_ECS.to_be_bytes());
            out.extend_from_slice(&(4 + n as u16).to_be_bytes());
            out.extend_from_slice(&e.family.to_be_bytes());
            out.extend_from_slice(&[e.source, scope]);
            out.extend_from_slice(&octets[..n]);
        }
        if let Some(c) = q.cookie_reply {
            out.extend_from_slice(&cookie::OPTION_COOKIE.to_be_bytes());
            out.extend_from_slice(&(c.len() as u16).to_be_bytes());
            out.extend_from_slice(&c);
        }
    }
    out.len() <= max
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use cdnmap_mapper::model::{ClassIdx, ClusterIdx, ClusterState};
    use cdnmap_serve::serving::{Builder, ServingCluster};
    use hickory_server::proto::rr::Name;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::answer::Handler;
    use crate::udp::{answer_hickory, Capture};
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// A map of four units over three clusters (one with no IPv6 server), two classes, nested
    /// and split units, IPv4 and IPv6 prefixes; zone `example.`; `www.example` is web,
    /// `*.video.example` video.
    pub(crate) fn front() -> Front {
        let classes: Vec<Arc<str>> = vec![Arc::from("video"), Arc::from("web")];
        let cluster = |id: &str, n: u8, v6: bool| ServingCluster {
            id: id.to_string(),
            addresses: (1..=3)
                .map(|i| IpAddr::V4(Ipv4Addr::new(192, 0, 2, n * 10 + i)))
                .chain((1..=2).filter(|_| v6).map(|i| {
                    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xff, u16::from(n), 0, 0, 0, i))
                }))
                .collect(),
            state: ClusterState::Up,
        };
        let clusters = vec![
            cluster("a", 1, true),
            cluster("b", 2, true),
            cluster("c", 3, false),
        ];
        let mut b = Builder::new(classes, clusters).expect("clusters");
        let net = |s: &str| -> IpNet { s.parse().expect("prefix") };
        type Unit<'a> = (
            &'a str,
            ClassIdx,
            &'a [&'a str],
            &'a [(ClusterIdx, f64)],
            [Option<ClusterIdx>; 2],
        );
        let units: [Unit<'_>; 4] = [
            ("u1", 0, &["10.0.0.0/24"], &[(0, 1.0)], [Some(1), None]),
            (
                "u2",
                1,
                &["10.0.1.0/24", "2001:db8:1::/48"],
                &[(0, 0.5), (1, 0.5)],
                [None, None],
            ),
            ("u3", 1, &["10.0.0.0/16"], &[(2, 1.0)], [Some(0), None]),
            ("u4", 0, &["2001:db8:2::/48"], &[(2, 1.0)], [None, None]),
        ];
        for (id, class, prefixes, shares, backups) in units {
            let prefixes: Vec<IpNet> = prefixes.iter().map(|p| net(p)).collect();
            b.push(
                id,
                class,
                prefixes.iter().copied(),
                shares.iter().copied(),
                0.0,
                backups,
            )
            .expect(id);
        }
        b.set_fallback(&[[Some(1), Some(0)], [Some(0), None]]);
        let m = b.finish();
        let view =
            crate::local::test_view(&m, &[("*.video.example", "video"), ("www.example", "web")]);
        crate::answer::tests::front_of(crate::answer::tests::zones_with_statics(), view)
    }

    fn push16(out: &mut Vec<u8>, v: u16) {
        out.extend_from_slice(&v.to_be_bytes());
    }

    /// A query drawn from what resolvers send and what they should not: mixed case, names in
    /// and out of the zone and its rules, every common type, EDNS or not (other versions,
    /// payloads below 512), ECS options of both families and every prefix length (some with
    /// bits beyond the prefix, a non-zero scope, a cookie beside them), stray header flags and
    /// trailing bytes.
    fn random_query(rng: &mut ChaCha8Rng) -> Vec<u8> {
        let mut q = Vec::new();
        push16(&mut q, rng.random());
        let mut flags = 0u16;
        if rng.random_bool(0.7) {
            flags |= 0x0100; // RD
        }
        if rng.random_bool(0.2) {
            flags |= 0x0010; // CD
        }
        if rng.random_bool(0.05) {
            flags |= 1 << rng.random_range(0..16);
        }
        push16(&mut q, flags);
        let edns = rng.random_bool(0.8);
        let counts = [1u16, 0, 0, u16::from(edns)];
        let counts = if rng.random_bool(0.03) {
            [rng.random_range(0..3), 0, 0, u16::from(edns)]
        } else {
            counts
        };
        for c in counts {
            push16(&mut q, c);
        }
        let names = [
            "www.example",
            "v1.video.example",
            "a.b.video.example",
            "example",
            "nx.example",
            "other.org",
            "video.example",
            "x_y.video.example",
            "a*b.video.example",
        ];
        for label in names[rng.random_range(0..names.len())].split('.') {
            let label: Vec<u8> = label
                .bytes()
                .map(|c| {
                    if rng.random_bool(0.3) {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            q.push(label.len() as u8);
            q.extend_from_slice(&label);
        }
        q.push(0);
        let qtype = [1u16, 1, 1, 28, 28, 15, 16, 6, 2, 255][rng.random_range(0..10)];
        push16(&mut q, qtype);
        push16(&mut q, if rng.random_bool(0.97) { 1 } else { 3 });
        if edns {
            q.push(0);
            push16(&mut q, 41);
            push16(
                &mut q,
                [0u16, 511, 512, 1232, 4096, 65535][rng.random_range(0..6)],
            );
            q.push(0);
            q.push(if rng.random_bool(0.95) { 0 } else { 1 });
            push16(&mut q, if rng.random_bool(0.3) { 0x8000 } else { 0 });
            let mut rdata = Vec::new();
            if rng.random_bool(0.75) {
                let v4 = rng.random_bool(0.7);
                let (addr, source): (Vec<u8>, u8) = if v4 {
                    let addrs = [
                        [10, 0, 0, 7],
                        [10, 0, 1, 200],
                        [10, 0, 9, 1],
                        [192, 0, 2, 1],
                    ];
                    let a = addrs[rng.random_range(0..addrs.len())];
                    (
                        a.to_vec(),
                        [0, 8, 16, 20, 24, 25, 32, 33][rng.random_range(0..8)],
                    )
                } else {
                    let addrs = ["2001:db8:1::5", "2001:db8:2::1", "2001:db8:ffff::1"];
                    let a: Ipv6Addr = addrs[rng.random_range(0..addrs.len())].parse().expect("v6");
                    (
                        a.octets().to_vec(),
                        [0, 32, 44, 48, 56, 64, 128, 129][rng.random_range(0..8)],
                    )
                };
                let n = usize::from(source).div_ceil(8).min(addr.len());
                let mut bytes = addr[..n].to_vec();
                let keep_bits = rng.random_bool(0.1);
                if let Some(last) = bytes.last_mut() {
                    if source % 8 != 0 && !keep_bits {
                        *last &= 0xffu8 << (8 - source % 8);
                    }
                }
                let scope = if rng.random_bool(0.05) { 8 } else { 0 };
                push16(&mut rdata, 8);
                push16(&mut rdata, 4 + bytes.len() as u16);
                push16(&mut rdata, if v4 { 1 } else { 2 });
                rdata.push(source);
                rdata.push(scope);
                rdata.extend_from_slice(&bytes);
            }
            if rng.random_bool(0.05) {
                push16(&mut rdata, 10); // a client cookie
                push16(&mut rdata, 8);
                rdata.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
            }
            push16(&mut q, rdata.len() as u16);
            q.extend_from_slice(&rdata);
        }
        if rng.random_bool(0.02) {
            q.push(0);
        }
        q
    }

    /// An A query for `www.example` with one ECS option: `family`, `source` and exactly the
    /// address octets given (none added or taken away).
    fn query_with_ecs(family: u16, source: u8, octets: &[u8]) -> Vec<u8> {
        let mut q = Vec::new();
        for word in [0x1234u16, 0x0100, 1, 0, 0, 1] {
            push16(&mut q, word);
        }
        for label in ["www", "example"] {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        push16(&mut q, TYPE_A);
        push16(&mut q, CLASS_IN);
        q.push(0); // the OPT record: root owner, type, payload, rcode/version/flags
        push16(&mut q, TYPE_OPT);
        push16(&mut q, 1232);
        q.extend_from_slice(&[0, 0, 0, 0]);
        let option_len = 4 + octets.len() as u16;
        push16(&mut q, 4 + option_len);
        push16(&mut q, OPTION_ECS);
        push16(&mut q, option_len);
        push16(&mut q, family);
        q.extend_from_slice(&[source, 0]);
        q.extend_from_slice(octets);
        q
    }

    /// A query with the DO bit is answered on the fast path, signed once a zone is: the A
    /// RRset, its RRSIG (from the signature cache) and DO in the OPT record, byte for byte as
    /// hickory's path answers it; while no zone is signed, without either. Queries without DO
    /// are answered as before.
    #[test]
    fn do_queries_are_signed_alike_on_both_paths() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let handler = Handler(Arc::new(front()));
        let capture = Capture::default();
        let src: SocketAddr = "192.0.2.77:5353".parse().expect("src");
        let plain = query_with_ecs(1, 24, &[10, 0, 0]);
        let mut with_do = plain.clone();
        // The OPT record after the header and `www.example A IN`; its flags at +7.
        with_do[12 + 17 + 7] |= 0x80;
        assert_eq!(parse(&with_do).map(|p| p.dnssec_ok), Some(true));
        let fast = |raw: &[u8]| -> Vec<u8> {
            let mut out = Vec::new();
            answer_batch(&handler.0, &[(raw, src)], &mut out);
            out.pop().unwrap_or_default()
        };
        let hickory = |raw: &[u8]| -> Vec<u8> {
            answer_hickory(&handler, runtime.handle(), &capture, raw, src).expect("an answer")
        };
        let types = |bytes: &[u8]| -> (Vec<u16>, bool) {
            let msg = hickory_server::proto::op::Message::from_vec(bytes).expect("a message");
            let types = msg
                .answers
                .iter()
                .map(|r| u16::from(r.record_type()))
                .collect();
            (
                types,
                msg.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok),
            )
        };
        let unsigned = fast(&with_do);
        assert_eq!(unsigned, hickory(&with_do), "unsigned");
        assert_eq!(types(&unsigned), (vec![1, 1, 1], false));
        let zones = crate::answer::tests::zones_with_statics_config();
        handler
            .0
            .dnssec
            .replace(Some(crate::dnssec::tests::ed25519_csk("example.", &zones)));
        let signed = fast(&with_do);
        assert_eq!(
            types(&signed),
            (vec![1, 1, 1, 46], true),
            "the RRset, its RRSIG"
        );
        assert_eq!(signed, hickory(&with_do), "the same bytes on both paths");
        assert_eq!(handler.0.dnssec.cache.stats(), (1, 1), "signed once");
        assert_eq!(fast(&plain), hickory(&plain));
        assert_eq!(
            types(&fast(&plain)),
            (vec![1, 1, 1], false),
            "no DO: unsigned"
        );
    }

    /// RFC 7871 §6 (issue 41): an ECS option with more address octets than its source prefix
    /// needs, or with bits set beyond it, is FORMERR on both paths. hickory reads only the
    /// octets the prefix needs, so `/24` with the four octets of `10.0.1.9` was answered as
    /// `10.0.1.0/24` before the wire bytes were checked.
    #[test]
    fn an_ecs_option_with_octets_beyond_its_prefix_is_formerr() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let handler = Handler(Arc::new(front()));
        let capture = Capture::default();
        let src: SocketAddr = "192.0.2.77:5353".parse().expect("src");
        let rcode = |raw: &[u8]| -> u8 {
            let mut fast = Vec::new();
            answer_batch(&handler.0, &[(raw, src)], &mut fast);
            let answer = fast
                .pop()
                .filter(|f| !f.is_empty())
                .or_else(|| answer_hickory(&handler, runtime.handle(), &capture, raw, src))
                .expect("an answer");
            answer[3] & 0x0f
        };
        const NOERROR: u8 = 0;
        const FORMERR: u8 = 1;
        for (what, family, source, octets, want) in [
            ("/24, 3 octets", 1, 24, &[10, 0, 1][..], NOERROR),
            (
                "/24, 4 octets, the 4th zero",
                1,
                24,
                &[10, 0, 1, 0][..],
                FORMERR,
            ),
            (
                "/24, 4 octets, the 4th 9",
                1,
                24,
                &[10, 0, 1, 9][..],
                FORMERR,
            ),
            ("/24, 2 octets", 1, 24, &[10, 0][..], FORMERR),
            (
                "/20, a bit beyond it in the 3rd octet",
                1,
                20,
                &[10, 0, 1][..],
                FORMERR,
            ),
            ("/0, no octet", 1, 0, &[][..], NOERROR),
            ("/0, one octet", 1, 0, &[10][..], FORMERR),
            (
                "v6 /48, 6 octets",
                2,
                48,
                &[0x20, 1, 0xd, 0xb8, 0, 1][..],
                NOERROR,
            ),
            (
                "v6 /48, 16 octets",
                2,
                48,
                &[0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1][..],
                FORMERR,
            ),
        ] {
            let raw = query_with_ecs(family, source, octets);
            assert_eq!(rcode(&raw), want, "{what}: {raw:02x?}");
            assert_eq!(ecs_octets_ok(&raw), want == NOERROR, "{what}");
        }
    }

    /// The oracle: on 20,000 generated queries from three sources, in batches of every size up
    /// to past two blocks, every response the fast path
    /// gives is the hickory path's, byte for byte; it takes those it is for, of every kind
    /// it is for (A and AAAA, with and without EDNS and ECS); and a front end answering through
    /// both paths counts the same demand as one answering through hickory's alone.
    #[test]
    fn the_fast_path_answers_byte_for_byte_as_hickory_and_counts_the_same() {
        fast_and_hickory_agree(false);
    }

    /// The same with the zone signed (an Ed25519 key, whose signatures are the same for the
    /// same data: the two front ends' caches make the same bytes): DO queries, about a
    /// third of those with EDNS, are answered signed on both paths alike.
    #[test]
    fn signed_the_fast_path_answers_byte_for_byte_as_hickory() {
        fast_and_hickory_agree(true);
    }

    fn fast_and_hickory_agree(signed: bool) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let both = Handler(Arc::new(front()));
        let hickory_only = Handler(Arc::new(front()));
        if signed {
            let zones = crate::answer::tests::zones_with_statics_config();
            for h in [&both, &hickory_only] {
                let keys = crate::dnssec::tests::ed25519_csk("example.", &zones);
                h.0.dnssec.replace(Some(keys));
            }
        }
        // `both` counts by its view's slots (as a front end does once the view is in use),
        // `hickory_only` keyed by prefix (as a block on a view just replaced does): the same
        // counts either way.
        let view = both.0.view().expect("a view");
        both.0.demand.prepare(&view.resolver);
        let capture = Capture::default();
        let sources: [SocketAddr; 3] = [
            "127.0.0.1:5353".parse().expect("src"),
            "[::1]:5353".parse().expect("src"),
            "10.0.1.9:5353".parse().expect("src"),
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(16);
        let (mut taken, mut kinds, mut with_cookie) = (0, std::collections::BTreeSet::new(), 0);
        let mut signed_taken = 0;
        let n = 20_000;
        let mut fast = Vec::new();
        let mut i = 0;
        while i < n {
            // Batches of every size up to past a block.
            let size = rng.random_range(1..=2 * BLOCK + 3).min(n - i);
            let raws: Vec<(Vec<u8>, SocketAddr)> = (i..i + size)
                .map(|k| (random_query(&mut rng), sources[k % 3]))
                .collect();
            let batch: Vec<(&[u8], SocketAddr)> =
                raws.iter().map(|(r, s)| (r.as_slice(), *s)).collect();
            answer_batch(&both.0, &batch, &mut fast);
            assert_eq!(fast.len(), size);
            for (k, (&(raw, src), fast)) in batch.iter().zip(&fast).enumerate() {
                let at = i + k;
                let slow = answer_hickory(&hickory_only, runtime.handle(), &capture, raw, src);
                if fast.is_empty() {
                    let again = answer_hickory(&both, runtime.handle(), &capture, raw, src);
                    assert_eq!(again, slow, "query {at}: {raw:02x?}");
                    continue;
                }
                assert_eq!(Some(fast), slow.as_ref(), "query {at}: {raw:02x?}");
                let q = parse(raw).expect("taken, so parsed");
                kinds.insert((q.qtype, q.edns_payload.is_some(), q.ecs.map(|e| e.family)));
                with_cookie += usize::from(q.cookie.is_some());
                taken += 1;
                // A signed answer's address records are followed by an RRSIG.
                if signed && q.dnssec_ok {
                    let msg = hickory_server::proto::op::Message::from_vec(fast).expect("parses");
                    let last = msg.answers.last().map(|r| u16::from(r.record_type()));
                    assert_eq!(last, Some(TYPE_RRSIG), "query {at}: {fast:02x?}");
                    signed_taken += 1;
                }
            }
            i += size;
        }
        // About a sixth of the generated queries are of the kind it is for (a mapped name,
        // A or AAAA, well formed): it must take them, those with a client cookie too.
        assert!(taken > n / 8, "the fast path took only {taken} of {n}");
        assert!(
            with_cookie > 20,
            "the fast path took {with_cookie} with a cookie"
        );
        assert!(
            !signed || signed_taken > n / 50,
            "{signed_taken} signed answers"
        );
        for kind in [
            (TYPE_A, false, None),
            (TYPE_A, true, None),
            (TYPE_A, true, Some(1)),
            (TYPE_A, true, Some(2)),
            (TYPE_AAAA, true, Some(1)),
            (TYPE_AAAA, true, Some(2)),
        ] {
            assert!(kinds.contains(&kind), "no {kind:?} among {kinds:?}");
        }
        let counted = both.0.demand.take();
        assert!(counted.len() >= 3, "{counted:?}");
        assert_eq!(counted, hickory_only.0.demand.take());
        assert_eq!(
            both.0.demand.take_hosts(),
            hickory_only.0.demand.take_hosts()
        );
    }

    /// The name as text is hickory's `LowerName` shown; an apex is not below itself, nor a
    /// name that only ends with its letters.
    #[test]
    fn names_read_as_hickory_shows_them() {
        let mut text = String::new();
        for name in ["WwW.Example.", "a-b_c.x9.example.", "x."] {
            let n = Name::from_ascii(name).expect("name");
            let mut wire = Vec::new();
            for l in n.iter() {
                wire.push(l.len() as u8);
                wire.extend_from_slice(l);
            }
            wire.push(0);
            name_text(&wire, &mut text);
            let lower = hickory_server::proto::rr::LowerName::new(&n);
            assert_eq!(text, lower.to_string());
        }
        // A label beginning with '-' hickory shows escaped: the fast path leaves such a
        // name to hickory's (a fuzz test found the two paths picking other servers for it).
        let labels: [&[u8]; 4] = [b"-", b"b", b"video", b"example"];
        let n = Name::from_labels(labels).expect("name");
        assert!(hickory_server::proto::rr::LowerName::new(&n)
            .to_string()
            .starts_with("\\-"));
        let mut query = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in n.iter() {
            query.push(l.len() as u8);
            query.extend_from_slice(l);
        }
        query.extend_from_slice(&[0, 0, 1, 0, 1]);
        assert!(parse(&query).is_none());
        query[13] = b'a';
        assert!(
            parse(&query).is_some(),
            "the same query with 'a' for '-' is taken"
        );
        // Placed by their wire labels: an apex is not below itself, nor a name that only
        // ends with its letters.
        let place = |name: &str, apex: &str| {
            let n = Name::from_ascii(name).expect("name");
            let mut wire = Vec::new();
            for l in n.iter() {
                wire.push(l.len() as u8);
                wire.extend_from_slice(l);
            }
            wire.push(0);
            answer::Zones::of_text(&[apex]).place(n.iter().len(), WireLabels(&wire))
        };
        use answer::Place::{Apex, Below, Outside};
        assert_eq!(place("www.example.", "example."), Below(Some(0)));
        assert_eq!(place("WWW.Example.", "example."), Below(Some(0)));
        assert_eq!(place("example.", "example."), Apex(0));
        assert_eq!(place("badexample.", "example."), Outside);
        assert_eq!(place("a.", "."), Below(Some(0)));
    }

    /// The world of the table: zone `example.`; clusters a (up, IPv4 and IPv6 servers), b
    /// (down) and c (up, IPv4 only); units mapped, split, on a backup and over IPv6, and per
    /// class one at the down cluster, whose last resort is a CNAME (web), addresses (video)
    /// or a CNAME back into the zone (apps: a loop, not taken).
    fn table_front() -> Front {
        use cdnmap_serve::watch::Bypass;
        let classes: Vec<Arc<str>> = vec![Arc::from("video"), Arc::from("web"), Arc::from("apps")];
        let cluster = |id: &str, state, addresses: &[&str]| ServingCluster {
            id: id.to_string(),
            addresses: addresses
                .iter()
                .map(|a| a.parse().expect("address"))
                .collect(),
            state,
        };
        let mut b = Builder::new(
            classes,
            vec![
                cluster(
                    "a",
                    ClusterState::Up,
                    &["192.0.2.1", "192.0.2.2", "2001:db8::a"],
                ),
                cluster("b", ClusterState::Down, &["192.0.2.11"]),
                cluster("c", ClusterState::Up, &["192.0.2.21", "192.0.2.22"]),
            ],
        )
        .expect("clusters");
        type Unit<'a> = (
            &'a str,
            ClassIdx,
            &'a str,
            &'a [(ClusterIdx, f64)],
            [Option<ClusterIdx>; 2],
        );
        let units: [Unit<'_>; 7] = [
            ("u1", 0, "10.0.0.0/24", &[(0, 1.0)], [Some(2), None]),
            ("u2", 1, "10.0.1.0/24", &[(1, 1.0)], [None, None]),
            ("u3", 0, "10.0.2.0/24", &[(1, 1.0)], [None, None]),
            ("u4", 2, "10.0.3.0/24", &[(1, 1.0)], [None, None]),
            ("u5", 2, "10.0.4.0/24", &[(1, 1.0)], [Some(2), None]),
            ("u6", 1, "10.0.5.0/24", &[(0, 0.5), (2, 0.5)], [None, None]),
            ("u7", 1, "2001:db8:1::/48", &[(0, 1.0)], [Some(2), None]),
        ];
        for (id, class, prefix, shares, backups) in units {
            let prefix: IpNet = prefix.parse().expect("prefix");
            b.push(id, class, [prefix], shares.iter().copied(), 0.0, backups)
                .expect(id);
        }
        b.set_fallback(&[[Some(0), Some(2)], [Some(2), Some(0)], [Some(2), None]]);
        let bypass = [
            ("web", Bypass::cname("web.partner.test").expect("a name")),
            (
                "video",
                Bypass::addresses(&["192.0.2.99".into(), "2001:db8::99".into()])
                    .expect("addresses"),
            ),
            ("apps", Bypass::cname("loop.example").expect("a name")),
        ]
        .map(|(c, b)| (c.to_string(), b));
        let rules = [
            ("*.video.example", "video"),
            ("www.example", "web"),
            ("*.apps.example", "apps"),
        ];
        let view = crate::local::test_view_with(&b.finish(), &rules, &bypass);
        crate::answer::tests::front_of(crate::answer::tests::zones_with_statics(), view)
    }

    /// A query of `qtype` for `name` (as given: its case is kept), with EDNS when `ecs` is
    /// not `None`, and then an ECS option of `Some((addr, source))`.
    fn table_query(name: &str, qtype: u16, ecs: Option<Option<(IpAddr, u8)>>) -> Vec<u8> {
        let mut q = Vec::new();
        let edns = ecs.is_some();
        for word in [0x4321u16, 0x0100, 1, 0, 0, u16::from(edns)] {
            push16(&mut q, word);
        }
        for label in name.trim_end_matches('.').split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        push16(&mut q, qtype);
        push16(&mut q, CLASS_IN);
        if let Some(ecs) = ecs {
            q.push(0);
            push16(&mut q, TYPE_OPT);
            push16(&mut q, 1232);
            q.extend_from_slice(&[0, 0, 0, 0]);
            let mut rdata = Vec::new();
            if let Some((addr, source)) = ecs {
                let (family, octets) = match addr {
                    IpAddr::V4(a) => (1u16, a.octets().to_vec()),
                    IpAddr::V6(a) => (2, a.octets().to_vec()),
                };
                let n = usize::from(source).div_ceil(8);
                push16(&mut rdata, OPTION_ECS);
                push16(&mut rdata, 4 + n as u16);
                push16(&mut rdata, family);
                rdata.extend_from_slice(&[source, 0]);
                rdata.extend_from_slice(&octets[..n]);
            }
            push16(&mut q, rdata.len() as u16);
            q.extend_from_slice(&rdata);
        }
        q
    }

    /// The decision for the table's query, as `cdnmap_serve::answer` makes it from the
    /// front's view: its code, route, addresses, CNAME target and ECS scope.
    type Decided = (u16, Option<Route>, Vec<IpAddr>, Option<String>, Option<u8>);

    fn decided(
        front: &Front,
        name: &str,
        qtype: u16,
        ecs: Option<Option<(IpAddr, u8)>>,
        src: IpAddr,
    ) -> Decided {
        let live = front.live.load_full().expect("a view");
        let view = live.view();
        let zones = &front.zones.names;
        let lower = name.to_ascii_lowercase();
        let (count, labels) = (
            lower.split('.').filter(|l| !l.is_empty()).count(),
            lower
                .split('.')
                .filter(|l| !l.is_empty())
                .map(str::as_bytes),
        );
        let ecs = match ecs.flatten() {
            Some((addr, source)) => answer::Ecs::Subnet { addr, source },
            None => answer::Ecs::Absent,
        };
        let q = Query {
            name: &lower,
            place: zones.place(count, labels),
            class_in: true,
            qtype: QType::of(qtype),
            edns_version: None,
            ecs,
            client: ecs.client(src),
        };
        let (mut key, mut out) = (String::new(), Vec::new());
        let d = answer::decide(zones, Some(&view), &q, &mut key, &mut out);
        let cname = match d.records {
            Records::Cname(t) => Some(t.to_string()),
            _ => None,
        };
        (
            d.rcode.code(),
            d.mapped.map(|m| m.route),
            out,
            cname,
            d.mapped.and_then(|m| m.ecs_scope),
        )
    }

    /// What a response says: its code, the addresses and CNAME target it answers, the ECS
    /// scope it echoes.
    fn said(response: &[u8]) -> (u16, Vec<IpAddr>, Option<String>, Option<u8>) {
        use hickory_server::proto::op::Message;
        use hickory_server::proto::rr::RData;
        let m = Message::from_vec(response).expect("a readable response");
        let (mut addrs, mut cname) = (Vec::new(), None);
        for r in &m.answers {
            match &r.data {
                RData::A(a) => addrs.push(IpAddr::V4(a.0)),
                RData::AAAA(a) => addrs.push(IpAddr::V6(a.0)),
                RData::CNAME(c) => cname = Some(c.0.to_string()),
                _ => {}
            }
        }
        let scope = m.edns.as_ref().and_then(|e| {
            match e.option(hickory_server::proto::rr::rdata::opt::EdnsCode::Subnet)? {
                hickory_server::proto::rr::rdata::opt::EdnsOption::Subnet(s) => {
                    Some(s.scope_prefix())
                }
                _ => None,
            }
        });
        (u16::from(m.metadata.response_code), addrs, cname, scope)
    }

    /// The table: names in and out of the zone and its rules, A, AAAA and other types, ECS of
    /// both families and none, clients mapped and unmapped, units at a down cluster and their
    /// classes' last resorts. Each response, through the fast path or hickory's, is what the
    /// decision says (code, addresses in order, CNAME, ECS scope, as hickory reads it back);
    /// the fast path's bytes are hickory's; the fast path takes exactly the rows it is for
    /// (an A or AAAA answer with addresses that are not a last resort's).
    #[test]
    fn both_paths_encode_the_decision_over_a_table_of_queries() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let handler = Handler(Arc::new(table_front()));
        let capture = Capture::default();
        let ip = |s: &str| -> IpAddr { s.parse().expect("an address") };
        let v4 = |s: &str, n| Some(Some((ip(s), n)));
        let (no_edns, no_ecs) = (None, Some(None));
        let (mapped, unmatched, bypass) = (
            Some(Route::Mapped),
            Some(Route::Unmatched),
            Some(Route::Bypass),
        );
        type Row<'a> = (
            &'a str,
            u16,
            Option<Option<(IpAddr, u8)>>,
            &'a str,
            u16,
            Option<Route>,
            bool,
        );
        let table: Vec<Row<'_>> = vec![
            // name, type, ECS, resolver, rcode, route, the fast path's
            ("www.other.test", 1, no_ecs, "192.0.2.77", 5, None, false),
            ("example", 1, no_ecs, "192.0.2.77", 0, None, false),
            ("example", 6, no_edns, "192.0.2.77", 0, None, false),
            (
                "nx.example",
                1,
                v4("10.0.0.0", 24),
                "192.0.2.77",
                3,
                None,
                false,
            ),
            (
                "v.video.example",
                1,
                v4("10.0.0.0", 24),
                "192.0.2.77",
                0,
                mapped,
                true,
            ),
            (
                "V.Video.Example",
                28,
                v4("10.0.0.0", 24),
                "192.0.2.77",
                0,
                mapped,
                true,
            ),
            ("v.video.example", 1, no_ecs, "10.0.0.9", 0, mapped, true),
            (
                "v.video.example",
                1,
                no_edns,
                "192.0.2.77",
                0,
                unmatched,
                true,
            ),
            (
                "v.video.example",
                1,
                v4("10.0.0.0", 0),
                "2001:db8:1::5",
                0,
                unmatched,
                true,
            ),
            (
                "v.video.example",
                16,
                v4("10.0.0.0", 24),
                "192.0.2.77",
                0,
                mapped,
                false,
            ),
            (
                "v.video.example",
                255,
                no_ecs,
                "192.0.2.77",
                0,
                unmatched,
                false,
            ),
            (
                "www.example",
                28,
                Some(Some((ip("2001:db8:1::"), 48))),
                "192.0.2.77",
                0,
                mapped,
                true,
            ),
            ("www.example", 1, no_ecs, "2001:db8:1::5", 0, mapped, true),
            (
                "www.example",
                1,
                v4("10.0.5.0", 24),
                "192.0.2.77",
                0,
                Some(Route::Split),
                true,
            ),
            (
                "x.apps.example",
                1,
                v4("10.0.4.0", 24),
                "192.0.2.77",
                0,
                Some(Route::Backup),
                true,
            ),
            // A unit at the down cluster: its class's last resort.
            (
                "www.example",
                1,
                v4("10.0.1.0", 24),
                "192.0.2.77",
                0,
                bypass,
                false,
            ),
            (
                "www.example",
                16,
                v4("10.0.1.0", 24),
                "192.0.2.77",
                0,
                bypass,
                false,
            ),
            (
                "v.video.example",
                1,
                v4("10.0.2.0", 24),
                "192.0.2.77",
                0,
                bypass,
                false,
            ),
            (
                "v.video.example",
                28,
                v4("10.0.2.0", 24),
                "192.0.2.77",
                0,
                bypass,
                false,
            ),
            // A CNAME back into the zone is not taken: the class's fallback, the route down.
            (
                "x.apps.example",
                1,
                v4("10.0.3.0", 24),
                "192.0.2.77",
                0,
                Some(Route::Down),
                true,
            ),
        ];
        for (name, qtype, ecs, resolver, rcode, route, fast) in table {
            let what = format!("{name} type {qtype} ECS {ecs:?} from {resolver}");
            let raw = table_query(name, qtype, ecs);
            let src = SocketAddr::new(ip(resolver), 5353);
            let slow =
                answer_hickory(&handler, runtime.handle(), &capture, &raw, src).expect("an answer");
            let mut out = Vec::new();
            answer_batch(&handler.0, &[(&raw, src)], &mut out);
            let taken = !out[0].is_empty();
            assert_eq!(taken, fast, "{what}: the fast path's?");
            if taken {
                assert_eq!(out[0], slow, "{what}");
            }
            let (code, routed, addrs, cname, scope) =
                decided(&handler.0, name, qtype, ecs, ip(resolver));
            assert_eq!((code, routed), (rcode, route), "{what}");
            assert_eq!(said(&slow), (code, addrs, cname, scope), "{what}");
        }
        // Static names (`crate::zonedata`), one a rule names too: the fast path gives them to
        // hickory's, which answers their records (no ECS scope: not the map's).
        type StaticRow<'a> = (
            &'a str,
            u16,
            Option<Option<(IpAddr, u8)>>,
            u16,
            &'a [&'a str],
            Option<&'a str>,
        );
        let statics: Vec<StaticRow<'_>> = vec![
            ("ns1.example", 1, no_ecs, 0, &["192.0.2.53"], None),
            (
                "NS1.Example",
                28,
                v4("10.0.0.0", 24),
                0,
                &["2001:db8::53"],
                None,
            ),
            ("ns1.example", 16, no_edns, 0, &[], None),
            (
                "static.video.example",
                1,
                v4("10.0.0.0", 24),
                0,
                &["198.51.100.7"],
                None,
            ),
            ("static.video.example", 28, no_ecs, 0, &[], None),
            (
                "alias.example",
                1,
                v4("10.0.0.0", 24),
                0,
                &["198.51.100.7"],
                Some("static.video.example."),
            ),
            ("out.example", 28, no_ecs, 0, &[], Some("www.example.org.")),
            ("example", 1, no_ecs, 0, &[], None),
            ("nope.example", 1, no_ecs, 3, &[], None),
        ];
        for (name, qtype, ecs, rcode, addrs, cname) in statics {
            let what = format!("{name} type {qtype} ECS {ecs:?}");
            let raw = table_query(name, qtype, ecs);
            let src = SocketAddr::new(ip("192.0.2.77"), 5353);
            let slow =
                answer_hickory(&handler, runtime.handle(), &capture, &raw, src).expect("an answer");
            let mut out = Vec::new();
            answer_batch(&handler.0, &[(&raw, src)], &mut out);
            assert!(out[0].is_empty(), "{what}: not the fast path's");
            let addrs: Vec<IpAddr> = addrs.iter().map(|a| ip(a)).collect();
            let cname = cname.map(str::to_string);
            assert_eq!(said(&slow), (rcode, addrs, cname, None), "{what}");
        }
    }

    /// An A query for `www.example` from 10.0.0.0/24 (ECS or not) with a COOKIE option of
    /// `cookie`'s bytes.
    fn query_with_cookie(cookie: &[u8], ecs: bool) -> Vec<u8> {
        let mut q = table_query("www.example", TYPE_A, Some(None));
        let mut rdata = Vec::new();
        if ecs {
            rdata.extend_from_slice(&[0, 8, 0, 7, 0, 1, 24, 0, 10, 0, 0]);
        }
        push16(&mut rdata, cookie::OPTION_COOKIE);
        push16(&mut rdata, cookie.len() as u16);
        rdata.extend_from_slice(cookie);
        let at = q.len() - 2;
        q.truncate(at);
        push16(&mut q, rdata.len() as u16);
        q.extend_from_slice(&rdata);
        q
    }

    /// DNS cookies (RFC 7873, RFC 9018) on both paths, byte for byte, the secret and the time
    /// fixed: a client cookie alone, with or without ECS, gets a new server cookie in the
    /// fast path's response too; a valid server cookie is echoed while young, renewed when
    /// older than half an hour; one of another secret or expired is replaced; a malformed
    /// option is FORMERR (hickory's).
    #[test]
    fn cookies_are_answered_alike_on_both_paths() {
        use hickory_server::proto::op::ResponseCode;
        use hickory_server::proto::rr::rdata::opt::{EdnsCode, EdnsOption};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let handler = Handler(Arc::new(table_front()));
        let capture = Capture::default();
        let src: SocketAddr = "192.0.2.77:5353".parse().expect("src");
        let now = handler.0.cookies.now();
        let cc = [0x24, 0x64, 0xc4, 0xab, 0xcf, 0x10, 0xc9, 0x57];
        let secret = [1u8; 16]; // the test front's (`answer::tests::front_of`)
        let with = |server: [u8; 16]| -> Vec<u8> { [&cc[..], &server[..]].concat() };
        let made = |secret: &[u8; 16], at: u32| cookie::server_cookie(secret, &cc, src.ip(), at);
        let fresh = with(made(&secret, now));
        // query cookie, ECS, the server cookie the response must carry (None: FORMERR)
        type Case<'a> = (&'a str, Vec<u8>, bool, Option<Vec<u8>>);
        let cases: Vec<Case<'_>> = vec![
            (
                "client cookie alone",
                cc.to_vec(),
                false,
                Some(fresh.clone()),
            ),
            (
                "client cookie and ECS",
                cc.to_vec(),
                true,
                Some(fresh.clone()),
            ),
            (
                "valid, 10 min old",
                with(made(&secret, now - 600)),
                true,
                Some(with(made(&secret, now - 600))),
            ),
            (
                "valid, 40 min old: renewed",
                with(made(&secret, now - 2400)),
                false,
                Some(fresh.clone()),
            ),
            (
                "expired",
                with(made(&secret, now - 3700)),
                false,
                Some(fresh.clone()),
            ),
            (
                "another secret",
                with(made(&[2; 16], now)),
                true,
                Some(fresh.clone()),
            ),
            ("a client cookie of 7 bytes", cc[..7].to_vec(), false, None),
            (
                "a server cookie of 7 bytes",
                [&cc[..], &[1; 7]].concat(),
                false,
                None,
            ),
            (
                "a server cookie of 33 bytes",
                [&cc[..], &[1; 33]].concat(),
                true,
                None,
            ),
        ];
        for (what, option, ecs, want) in cases {
            let raw = query_with_cookie(&option, ecs);
            let slow =
                answer_hickory(&handler, runtime.handle(), &capture, &raw, src).expect("an answer");
            let mut out = Vec::new();
            answer_batch(&handler.0, &[(&raw, src)], &mut out);
            let m = hickory_server::proto::op::Message::from_vec(&slow).expect("readable");
            let got = m
                .edns
                .as_ref()
                .and_then(|e| match e.option(EdnsCode::Cookie) {
                    Some(EdnsOption::Unknown(_, data)) => Some(data.clone()),
                    _ => None,
                });
            match want {
                Some(want) => {
                    assert_eq!(u16::from(m.metadata.response_code), 0, "{what}");
                    assert_eq!(got, Some(want), "{what}");
                    assert!(!m.answers.is_empty(), "{what}");
                    assert_eq!(out[0], slow, "{what}: the fast path's bytes are hickory's");
                }
                None => {
                    assert_eq!(m.metadata.response_code, ResponseCode::FormErr, "{what}");
                    assert!(out[0].is_empty(), "{what}: hickory's");
                }
            }
        }
        // Two COOKIE options, or one beside another option: hickory's (it reads the first).
        let mut two = query_with_cookie(&cc, false);
        let n = two.len();
        two[n - 13] += 12; // the OPT RDLENGTH's low byte
        two.extend_from_slice(&[0, 10, 0, 8]);
        two.extend_from_slice(&cc);
        let mut out = Vec::new();
        answer_batch(&handler.0, &[(&two, src)], &mut out);
        assert!(out[0].is_empty());
        assert!(answer_hickory(&handler, runtime.handle(), &capture, &two, src).is_some());
        // RFC 7873 §5.4: no question, a client cookie: NOERROR and a server cookie; a
        // malformed one FORMERR; no question and no cookie, FORMERR as before.
        let question_len = "www.example".len() + 2 + 4;
        for (option, rcode) in [(&cc[..], 0), (&cc[..5], 1)] {
            let mut q = query_with_cookie(option, false);
            q.drain(12..12 + question_len);
            q[5] = 0;
            let r = answer_hickory(&handler, runtime.handle(), &capture, &q, src).expect("a reply");
            let m = hickory_server::proto::op::Message::from_vec(&r).expect("readable");
            assert_eq!(u16::from(m.metadata.response_code), rcode, "{q:02x?}");
            assert!(m.queries.is_empty() && m.answers.is_empty());
            let cookie = m
                .edns
                .as_ref()
                .and_then(|e| e.option(EdnsCode::Cookie).cloned());
            let want = (rcode == 0).then(|| EdnsOption::Unknown(10, fresh.clone()));
            assert_eq!(cookie, want);
        }
        let mut q = table_query("www.example", TYPE_A, Some(None));
        q.drain(12..12 + question_len);
        q[5] = 0;
        let r = answer_hickory(&handler, runtime.handle(), &capture, &q, src).expect("a reply");
        assert_eq!(r[3] & 0x0f, 1, "FORMERR");
    }
}
