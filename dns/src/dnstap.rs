//! dnstap: the queries answered and their responses, logged in the field's standard format
//! (<https://dnstap.info>): each a `Dnstap` protobuf message (`proto/dnstap/dnstap.proto`,
//! `AUTH_QUERY` and `AUTH_RESPONSE`) in a Frame Streams data frame, to a file or to a unix
//! socket a collector listens on (`dnstap_file`, `dnstap_socket`).
//!
//! **Nothing waits on it.** An answering loop hands each batch's sampled queries and responses
//! (their bytes, copied once, the client's address and the batch's times) to one writer thread
//! through a bounded queue ([`QUEUE_BATCHES`] batches, [`QUEUE_BYTES`] bytes): when it is full,
//! the batch is dropped and counted (`cdnmap_dns_dnstap_dropped_total`), and the loop goes on.
//! The writer encodes the frames and writes them (`cdnmap_dns_dnstap_written_total`). With
//! dnstap off, the loops have no [`Tap`]: one branch per batch, nothing else.
//!
//! **Sampling.** `dnstap_sample = N` logs one query of every N each loop answers (the first,
//! the N+1st, ...: a count, not a draw), with its response.
//!
//! **Frame Streams** ([`fstrm`]). A file is the unidirectional form: a START control frame
//! naming the content type `protobuf:dnstap.Dnstap`, the data frames, a STOP frame when the
//! front end stops. A socket is the bidirectional form: READY, the reader's ACCEPT, START, the
//! data frames, and STOP answered by FINISH. When the reader goes away (or never was there) the
//! writer connects again, with a backoff from [`RECONNECT_MIN`] to [`RECONNECT_MAX`], and what
//! comes meanwhile is dropped and counted.

use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cdnmap_proto::dnstap as pb;
use cdnmap_proto::prost::bytes::Bytes;
use cdnmap_proto::prost::Message as _;
use hickory_server::net::runtime::Time;
use hickory_server::net::xfer::Protocol;
use hickory_server::net::NetError;
use hickory_server::proto::op::{MessageType, Metadata, ResponseCode};
use hickory_server::proto::rr::Record;
use hickory_server::proto::serialize::binary::BinEncoder;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder};

use crate::config::{invalid, ConfigError};
pub use crate::config::{
    Messages, Settings, Sink, DNSTAP_IDENTITY_BYTES as IDENTITY_BYTES,
    DNSTAP_MAX_SOCKET_PATH as MAX_SOCKET_PATH, DNSTAP_SAMPLE as SAMPLE,
};

/// Batches waiting for the writer at most (a UDP batch holds up to 32 queries).
pub const QUEUE_BATCHES: usize = 1024;
/// Bytes of DNS messages waiting for the writer at most.
pub const QUEUE_BYTES: usize = 16 << 20;
/// The backoff between connections to a socket's reader.
pub const RECONNECT_MIN: Duration = Duration::from_millis(100);
pub const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// How long the handshake and each write on a socket may take before the reader is taken
/// for gone.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(2);
/// With nothing queued for this long, the writer flushes what it buffered.
const IDLE_FLUSH: Duration = Duration::from_millis(200);
/// The writer's naps between looks at the queue: the shortest while batches come, doubling
/// to the longest while none does.
const POLL_MIN: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(50);
/// Under load the writer flushes at least this often.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// The longest a stopping front end waits for the writer to drain and close.
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// The frame formats of Frame Streams (fstrm, <https://farsightsec.github.io/fstrm/>): a data
/// frame is its length (4 bytes, big-endian, not 0) and its payload; a control frame is an
/// escape (a length of 0), its own length, its type and its fields, each field its type, its
/// length and its bytes, all big-endian.
pub mod fstrm {
    use std::io::Read;

    /// The reader accepts the content type (bidirectional).
    pub const ACCEPT: u32 = 0x01;
    /// The data frames begin.
    pub const START: u32 = 0x02;
    /// The data frames end.
    pub const STOP: u32 = 0x03;
    /// The writer is ready, with the content types it offers (bidirectional).
    pub const READY: u32 = 0x04;
    /// The reader took the STOP (bidirectional).
    pub const FINISH: u32 = 0x05;
    /// The field that names a content type.
    pub const FIELD_CONTENT_TYPE: u32 = 0x01;
    /// dnstap's content type.
    pub const DNSTAP: &[u8] = b"protobuf:dnstap.Dnstap";
    /// The longest control frame read (fstrm's own limit is 512 bytes).
    pub const MAX_CONTROL: usize = 512;

    /// Appends a control frame of `kind`, with a content type field when given.
    pub fn control(kind: u32, content_type: Option<&[u8]>, out: &mut Vec<u8>) {
        let fields = content_type.map_or(0, |t| 8 + t.len());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&((4 + fields) as u32).to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        if let Some(t) = content_type {
            out.extend_from_slice(&FIELD_CONTENT_TYPE.to_be_bytes());
            out.extend_from_slice(&(t.len() as u32).to_be_bytes());
            out.extend_from_slice(t);
        }
    }

    /// A control frame read: its type and its content types.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Control {
        pub kind: u32,
        pub content_types: Vec<Vec<u8>>,
    }

    fn u32_at(b: &[u8], at: usize) -> Option<u32> {
        let four = b.get(at..at + 4)?;
        Some(u32::from_be_bytes([four[0], four[1], four[2], four[3]]))
    }

    /// Reads one control frame from `r`; an error says what was wrong with it.
    pub fn read_control(r: &mut impl Read) -> std::io::Result<Control> {
        let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let mut head = [0u8; 8];
        r.read_exact(&mut head)?;
        let escape = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        if escape != 0 {
            return Err(bad(format!(
                "a data frame of {escape} bytes where a control frame was due"
            )));
        }
        let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
        if !(4..=MAX_CONTROL).contains(&len) {
            return Err(bad(format!(
                "a control frame of {len} bytes (4 to {MAX_CONTROL})"
            )));
        }
        let mut frame = vec![0u8; len];
        r.read_exact(&mut frame)?;
        parse_control(&frame).ok_or_else(|| bad("a control frame's fields overrun it".into()))
    }

    /// A control frame's body (type and fields), `None` when a field overruns it.
    pub fn parse_control(frame: &[u8]) -> Option<Control> {
        let kind = u32_at(frame, 0)?;
        let mut content_types = Vec::new();
        let mut at = 4;
        while at < frame.len() {
            let field = u32_at(frame, at)?;
            let len = u32_at(frame, at + 4)? as usize;
            let value = frame.get(at + 8..(at + 8).checked_add(len)?)?;
            if field == FIELD_CONTENT_TYPE {
                content_types.push(value.to_vec());
            }
            at += 8 + len;
        }
        Some(Control {
            kind,
            content_types,
        })
    }
}

/// A sampled query (and its response) as an answering loop hands it over: its client and where
/// its bytes are in [`Batch::bytes`].
#[derive(Debug, Clone)]
struct Entry {
    client: SocketAddr,
    query: std::ops::Range<usize>,
    /// Empty: no response was sent.
    response: std::ops::Range<usize>,
}

/// One handing over: the sampled queries of a receive, with the times of the receive and of
/// the send.
#[derive(Debug)]
struct Batch {
    protocol: Protocol,
    received: SystemTime,
    sent: SystemTime,
    bytes: Vec<u8>,
    entries: Vec<Entry>,
}

/// The wall clock at instant `then`, given the wall clock `now_wall` read at `now`.
pub fn wall_at(now_wall: SystemTime, now: Instant, then: Instant) -> SystemTime {
    now_wall
        .checked_sub(now.saturating_duration_since(then))
        .unwrap_or(now_wall)
}

fn seconds_and_nanos(t: SystemTime) -> (u64, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

/// Appends `ip`'s octets (4 or 16) to `bytes`: its family and where they are.
fn push_address(ip: IpAddr, bytes: &mut Vec<u8>) -> (pb::SocketFamily, Range<usize>) {
    let at = bytes.len();
    let family = match ip {
        IpAddr::V4(a) => {
            bytes.extend_from_slice(&a.octets());
            pb::SocketFamily::Inet
        }
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            // A v4 client on a dual-stack socket is a v4 client.
            Some(v4) => {
                bytes.extend_from_slice(&v4.octets());
                pb::SocketFamily::Inet
            }
            None => {
                bytes.extend_from_slice(&a.octets());
                pb::SocketFamily::Inet6
            }
        },
    };
    (family, at..bytes.len())
}

/// What every frame of a front end carries.
#[derive(Debug, Clone)]
pub struct Origin {
    pub identity: Bytes,
    pub version: Bytes,
    /// Where queries are answered (the responder's address), when it is a specific address.
    pub local: Option<SocketAddr>,
    pub messages: Messages,
}

/// Appends the data frames of `batch` to `out`: an `AUTH_QUERY` and an `AUTH_RESPONSE` for
/// each entry, as `origin.messages` says (no response frame for a query not answered).
/// Returns the frames appended.
fn encode_batch(origin: &Origin, batch: Batch, out: &mut Vec<u8>) -> u64 {
    let Batch {
        protocol,
        received,
        sent,
        mut bytes,
        entries,
    } = batch;
    // The addresses go into the batch's buffer too: every field a slice of one allocation.
    let local = origin.local.map(|l| push_address(l.ip(), &mut bytes).1);
    let clients: Vec<_> = entries
        .iter()
        .map(|e| push_address(e.client.ip(), &mut bytes))
        .collect();
    let bytes = Bytes::from(bytes);
    let (q_sec, q_nsec) = seconds_and_nanos(received);
    let (r_sec, r_nsec) = seconds_and_nanos(sent);
    let socket_protocol = match protocol {
        Protocol::Tcp => pb::SocketProtocol::Tcp,
        _ => pb::SocketProtocol::Udp,
    };
    let response_address = local.map(|r| bytes.slice(r));
    let response_port = origin.local.map(|l| u32::from(l.port()));
    let mut frames = 0;
    for (e, (family, client)) in entries.into_iter().zip(clients) {
        let client = bytes.slice(client);
        let base = pb::Message {
            r#type: 0,
            socket_family: Some(family as i32),
            socket_protocol: Some(socket_protocol as i32),
            query_address: Some(client),
            response_address: response_address.clone(),
            query_port: Some(u32::from(e.client.port())),
            response_port,
            query_time_sec: Some(q_sec),
            query_time_nsec: Some(q_nsec),
            ..Default::default()
        };
        if origin.messages.queries() {
            let m = pb::Message {
                r#type: pb::message::Type::AuthQuery as i32,
                query_message: Some(bytes.slice(e.query.clone())),
                ..base.clone()
            };
            frame(origin, m, out);
            frames += 1;
        }
        if origin.messages.responses() && !e.response.is_empty() {
            let m = pb::Message {
                r#type: pb::message::Type::AuthResponse as i32,
                response_time_sec: Some(r_sec),
                response_time_nsec: Some(r_nsec),
                response_message: Some(bytes.slice(e.response.clone())),
                ..base
            };
            frame(origin, m, out);
            frames += 1;
        }
    }
    frames
}

/// Appends one data frame holding `message`.
fn frame(origin: &Origin, message: pb::Message, out: &mut Vec<u8>) {
    let d = pb::Dnstap {
        identity: Some(origin.identity.clone()),
        version: Some(origin.version.clone()),
        extra: None,
        r#type: pb::dnstap::Type::Message as i32,
        message: Some(message),
    };
    let len = d.encoded_len();
    out.reserve(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    // A Vec grows as needed: encoding into it does not fail.
    let _ = d.encode(out);
}

/// What the answering loops and the writer share.
struct Shared {
    sample: u64,
    messages: Messages,
    /// Bytes of DNS messages queued ([`QUEUE_BYTES`] at most).
    queued_bytes: AtomicUsize,
    dropped: metrics::Counter,
    /// Set when the front end stops: the writer drains the queue and closes.
    closing: AtomicBool,
}

impl Shared {
    /// Hands `batch` to the writer, or drops it (counted) when the queue is full.
    fn hand_over(&self, tx: &SyncSender<Batch>, batch: Batch) {
        let size = batch.bytes.len();
        let frames = self.frames_of(&batch);
        if self.queued_bytes.fetch_add(size, Ordering::Relaxed) + size > QUEUE_BYTES {
            self.queued_bytes.fetch_sub(size, Ordering::Relaxed);
            self.dropped.increment(frames);
            return;
        }
        if let Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) = tx.try_send(batch) {
            self.queued_bytes
                .fetch_sub(b.bytes.len(), Ordering::Relaxed);
            self.dropped.increment(frames);
        }
    }

    /// The frames `batch` makes.
    fn frames_of(&self, batch: &Batch) -> u64 {
        let q = u64::from(self.messages.queries()) * batch.entries.len() as u64;
        let r = if self.messages.responses() {
            batch
                .entries
                .iter()
                .filter(|e| !e.response.is_empty())
                .count() as u64
        } else {
            0
        };
        q + r
    }
}

/// An answering loop's handle: its own sampling count and sender.
pub struct Tap {
    shared: Arc<Shared>,
    tx: SyncSender<Batch>,
    /// Queries this loop has seen (the sampling count).
    seen: u64,
}

impl Tap {
    /// Whether the next query is sampled (one of every `dnstap_sample`, the first included).
    fn sampled(&mut self) -> bool {
        let take = self.seen.is_multiple_of(self.shared.sample);
        self.seen = self.seen.wrapping_add(1);
        take
    }

    /// Logs a UDP batch: `queries` (bytes, client) and their `responses` (empty: none sent),
    /// received at `received` and sent at `sent` (wall clock).
    pub fn udp(
        &mut self,
        queries: &[(&[u8], SocketAddr)],
        responses: &[Vec<u8>],
        received: SystemTime,
        sent: SystemTime,
    ) {
        let mut batch: Option<Batch> = None;
        // The queries sampled, about: what the buffers are made for.
        let expected = (queries.len() as u64 / self.shared.sample) as usize + 1;
        for (i, &(query, client)) in queries.iter().enumerate() {
            if !self.sampled() {
                continue;
            }
            let response = responses.get(i).map_or(&[][..], Vec::as_slice);
            let b = batch.get_or_insert_with(|| Batch {
                protocol: Protocol::Udp,
                received,
                sent,
                bytes: Vec::with_capacity(expected * 256),
                entries: Vec::with_capacity(expected),
            });
            b.push(client, query, response);
        }
        if let Some(b) = batch {
            self.shared.hand_over(&self.tx, b);
        }
    }
}

impl Batch {
    fn push(&mut self, client: SocketAddr, query: &[u8], response: &[u8]) {
        let q = self.bytes.len();
        self.bytes.extend_from_slice(query);
        let r = self.bytes.len();
        self.bytes.extend_from_slice(response);
        self.entries.push(Entry {
            client,
            query: q..r,
            response: r..self.bytes.len(),
        });
    }
}

/// The front end's dnstap: the writer thread and what the loops share with it. Started once
/// ([`Dnstap::start`]), stopped with [`Dnstap::finish`].
pub struct Dnstap {
    shared: Arc<Shared>,
    tx: SyncSender<Batch>,
    writer: std::thread::JoinHandle<()>,
}

/// Registers dnstap's counters at 0 (present from start, dnstap on or not) and describes them.
pub fn register_metrics() {
    metrics::describe_counter!(
        "cdnmap_dns_dnstap_written_total",
        "dnstap messages (AUTH_QUERY, AUTH_RESPONSE) written to the dnstap file or socket."
    );
    metrics::describe_counter!(
        "cdnmap_dns_dnstap_dropped_total",
        "dnstap messages dropped: the writer's queue was full, or the socket's reader was away."
    );
    metrics::counter!("cdnmap_dns_dnstap_written_total").increment(0);
    metrics::counter!("cdnmap_dns_dnstap_dropped_total").increment(0);
}

impl Dnstap {
    /// Starts the writer for `settings`, with `local` the address queries are answered on. A
    /// file is created (emptied) and its START frame written here, so a path that cannot be
    /// written stops the start (the error names `dnstap_file`); a socket is connected by the
    /// writer, again and again until a reader listens.
    pub fn start(settings: &Settings, local: SocketAddr) -> Result<Dnstap, ConfigError> {
        let key = match &settings.sink {
            Sink::File(_) => "dnstap_file",
            Sink::Socket(_) => "dnstap_socket",
        };
        let out = match &settings.sink {
            Sink::File(path) => Output::file(path)
                .map_err(|e| invalid("dnstap_file", format!("{}: {e}", path.display())))?,
            Sink::Socket(path) => Output::socket(path.clone()),
        };
        let origin = Origin {
            identity: Bytes::from(settings.identity.clone().into_bytes()),
            version: Bytes::from(format!("cdnmap {}", env!("CARGO_PKG_VERSION")).into_bytes()),
            local: (!local.ip().is_unspecified()).then_some(local),
            messages: settings.messages,
        };
        let shared = Arc::new(Shared {
            sample: u64::from(settings.sample.max(1)),
            messages: settings.messages,
            queued_bytes: AtomicUsize::new(0),
            dropped: metrics::counter!("cdnmap_dns_dnstap_dropped_total"),
            closing: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::sync_channel(QUEUE_BATCHES);
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("dns-dnstap".into())
                .spawn(move || write_loop(&shared, &rx, out, &origin))
                .map_err(|e| invalid(key, format!("the writer thread: {e}")))?
        };
        tracing::info!(sink = ?settings.sink, sample = settings.sample, messages = ?settings.messages, "dnstap on");
        Ok(Dnstap { shared, tx, writer })
    }

    /// A handle for one answering loop.
    pub fn tap(&self) -> Tap {
        Tap {
            shared: Arc::clone(&self.shared),
            tx: self.tx.clone(),
            seen: 0,
        }
    }

    /// The TCP side: `inner`'s answers, logged.
    pub fn tcp(&self) -> Arc<TcpTap> {
        Arc::new(TcpTap {
            tap: Mutex::new(self.tap()),
        })
    }

    /// Stops: the writer drains the queue, writes STOP (on a socket, waits for FINISH) and
    /// closes, within [`FINISH_WAIT`].
    pub fn finish(self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        drop(self.tx);
        let deadline = Instant::now() + FINISH_WAIT;
        while !self.writer.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.writer.is_finished() {
            let _ = self.writer.join();
        } else {
            tracing::warn!("the dnstap writer did not finish in time; its last frames may be lost");
        }
    }
}

/// The writer: takes batches until the front end stops, writing their frames to `out`.
///
/// Frames count as written once flushed: those buffered when a write or a flush fails (the
/// socket's reader went away) count as dropped, with those that could not be written.
fn write_loop(shared: &Shared, rx: &Receiver<Batch>, mut out: Output, origin: &Origin) {
    let written = metrics::counter!("cdnmap_dns_dnstap_written_total");
    let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut last_flush = Instant::now();
    // Frames buffered since the last flush.
    let mut pending = 0u64;
    let flush = |out: &mut Output, pending: &mut u64| {
        if out.flush() {
            written.increment(*pending);
        } else {
            shared.dropped.increment(*pending);
        }
        *pending = 0;
    };
    let mut last_data = Instant::now();
    let mut nap = POLL_MIN;
    loop {
        // Everything queued, then a nap: the loops' sends find no waiting receiver to wake (a
        // wakeup a batch would cost the answering threads a system call each).
        let closing = shared.closing.load(Ordering::Relaxed);
        let mut took = false;
        let gone = loop {
            match rx.try_recv() {
                Ok(batch) => {
                    took = true;
                    shared
                        .queued_bytes
                        .fetch_sub(batch.bytes.len(), Ordering::Relaxed);
                    buf.clear();
                    let frames = encode_batch(origin, batch, &mut buf);
                    if out.write(&buf) {
                        pending += frames;
                    } else {
                        shared.dropped.increment(pending + frames);
                        pending = 0;
                    }
                }
                Err(TryRecvError::Empty) => break false,
                Err(TryRecvError::Disconnected) => break true,
            }
        };
        let now = Instant::now();
        if took {
            last_data = now;
            nap = POLL_MIN;
        } else {
            nap = (nap * 2).min(POLL_MAX);
        }
        let idle = now.duration_since(last_data) >= IDLE_FLUSH;
        if pending > 0 && (idle || now.duration_since(last_flush) >= FLUSH_EVERY) {
            flush(&mut out, &mut pending);
            last_flush = now;
        }
        if gone || (closing && !took) {
            break;
        }
        std::thread::sleep(nap);
    }
    flush(&mut out, &mut pending);
    out.close();
}

/// Where the writer writes: a file, or a socket (connected when a reader listens).
enum Output {
    File {
        path: PathBuf,
        w: Option<BufWriter<std::fs::File>>,
    },
    #[cfg(unix)]
    Socket {
        path: PathBuf,
        w: Option<BufWriter<std::os::unix::net::UnixStream>>,
        next_try: Instant,
        backoff: Duration,
    },
}

const WRITE_BUFFER: usize = 256 << 10;

impl Output {
    /// The file at `path`, created or emptied, its START frame written.
    fn file(path: &Path) -> std::io::Result<Output> {
        let mut w = BufWriter::with_capacity(WRITE_BUFFER, std::fs::File::create(path)?);
        let mut start = Vec::new();
        fstrm::control(fstrm::START, Some(fstrm::DNSTAP), &mut start);
        w.write_all(&start)?;
        w.flush()?;
        Ok(Output::File {
            path: path.to_path_buf(),
            w: Some(w),
        })
    }

    #[cfg(unix)]
    fn socket(path: PathBuf) -> Output {
        Output::Socket {
            path,
            w: None,
            next_try: Instant::now(),
            backoff: RECONNECT_MIN,
        }
    }

    #[cfg(not(unix))]
    fn socket(path: PathBuf) -> Output {
        tracing::warn!(path = %path.display(), "dnstap_socket: unix sockets exist on Unix only; nothing is logged");
        Output::File { path, w: None }
    }

    /// Writes (buffers) `frames`; false when they were lost, with what was buffered before.
    fn write(&mut self, frames: &[u8]) -> bool {
        match self {
            Output::File { path, w } => match w {
                Some(f) => match f.write_all(frames) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "writing the dnstap file failed");
                        false
                    }
                },
                None => false,
            },
            #[cfg(unix)]
            Output::Socket {
                path,
                w,
                next_try,
                backoff,
            } => {
                if w.is_none() && Instant::now() >= *next_try {
                    match connect(path) {
                        Ok(s) => {
                            tracing::info!(path = %path.display(), "dnstap: connected to the socket's reader");
                            *w = Some(BufWriter::with_capacity(WRITE_BUFFER, s));
                            *backoff = RECONNECT_MIN;
                        }
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, retry_ms = backoff.as_millis() as u64, "dnstap: no reader on the socket; dropping messages until one listens");
                            *next_try = Instant::now() + *backoff;
                            *backoff = (*backoff * 2).min(RECONNECT_MAX);
                        }
                    }
                }
                let Some(s) = w else { return false };
                match s.write_all(frames) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "dnstap: the socket's reader went away; connecting again");
                        *w = None;
                        *next_try = Instant::now() + *backoff;
                        false
                    }
                }
            }
        }
    }

    /// Flushes what is buffered; false when it was lost (a socket is then connected again).
    fn flush(&mut self) -> bool {
        let failed = match self {
            Output::File { w: Some(f), .. } => f.flush().err(),
            #[cfg(unix)]
            Output::Socket { w: Some(s), .. } => s.flush().err(),
            _ => None,
        };
        let Some(e) = failed else { return true };
        tracing::warn!(error = %e, "dnstap: flushing failed");
        #[cfg(unix)]
        if let Output::Socket { w, .. } = self {
            *w = None;
        }
        false
    }

    /// Ends the stream: STOP, and on a socket the reader's FINISH (waited for a little).
    fn close(self) {
        let mut stop = Vec::new();
        fstrm::control(fstrm::STOP, None, &mut stop);
        match self {
            Output::File { path, w } => {
                if let Some(mut f) = w {
                    if let Err(e) = f.write_all(&stop).and_then(|()| f.flush()) {
                        tracing::warn!(path = %path.display(), error = %e, "closing the dnstap file failed");
                    }
                }
            }
            #[cfg(unix)]
            Output::Socket { w: Some(mut s), .. } => {
                let finished = s.write_all(&stop).and_then(|()| s.flush()).and_then(|()| {
                    let mut stream = s.into_inner().map_err(|e| e.into_error())?;
                    fstrm::read_control(&mut stream)
                });
                match finished {
                    Ok(c) if c.kind == fstrm::FINISH => {}
                    Ok(c) => tracing::debug!(
                        kind = c.kind,
                        "dnstap: the reader answered STOP with another frame than FINISH"
                    ),
                    Err(e) => tracing::debug!(error = %e, "dnstap: no FINISH from the reader"),
                }
            }
            #[cfg(unix)]
            Output::Socket { w: None, .. } => {}
        }
    }
}

/// Connects to the reader at `path` and makes the bidirectional handshake: READY offering
/// dnstap's content type, the reader's ACCEPT (which must name it), START.
#[cfg(unix)]
fn connect(path: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(SOCKET_TIMEOUT))?;
    s.set_write_timeout(Some(SOCKET_TIMEOUT))?;
    let mut ready = Vec::new();
    fstrm::control(fstrm::READY, Some(fstrm::DNSTAP), &mut ready);
    s.write_all(&ready)?;
    let accept = fstrm::read_control(&mut s)?;
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    if accept.kind != fstrm::ACCEPT {
        return Err(bad(format!(
            "the reader answered READY with control frame {} (not ACCEPT)",
            accept.kind
        )));
    }
    if !accept.content_types.is_empty() && !accept.content_types.iter().any(|t| t == fstrm::DNSTAP)
    {
        return Err(bad(
            "the reader does not accept protobuf:dnstap.Dnstap".into()
        ));
    }
    let mut start = Vec::new();
    fstrm::control(fstrm::START, Some(fstrm::DNSTAP), &mut start);
    s.write_all(&start)?;
    Ok(s)
}

/// Logs the TCP queries hickory's server answers (a wrapper of its `RequestHandler`): each
/// sampled query's bytes, and the response as encoded for TCP.
pub struct TcpTap {
    tap: Mutex<Tap>,
}

impl TcpTap {
    fn sampled(&self) -> bool {
        self.tap.lock().map(|mut t| t.sampled()).unwrap_or(false)
    }

    fn record(&self, client: SocketAddr, query: &[u8], response: &[u8], received: SystemTime) {
        let mut batch = Batch {
            protocol: Protocol::Tcp,
            received,
            sent: SystemTime::now(),
            bytes: Vec::with_capacity(query.len() + response.len()),
            entries: Vec::with_capacity(1),
        };
        batch.push(client, query, response);
        if let Ok(t) = self.tap.lock() {
            t.shared.hand_over(&t.tx, batch);
        }
    }
}

/// hickory's handler `H` with TCP queries logged when `tap` is set (one branch per query
/// otherwise).
#[derive(Clone)]
pub struct Tapped<H> {
    pub inner: H,
    pub tap: Option<Arc<TcpTap>>,
}

#[async_trait::async_trait]
impl<H: RequestHandler> RequestHandler for Tapped<H> {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        response: R,
    ) -> ResponseInfo {
        let Some(tap) = self.tap.as_ref().filter(|t| t.sampled()) else {
            return self.inner.handle_request::<R, T>(request, response).await;
        };
        let logged = Logged {
            inner: response,
            tap: Arc::clone(tap),
            client: request.src(),
            query: Bytes::copy_from_slice(request.as_slice()),
            received: SystemTime::now(),
            protocol: request.protocol(),
        };
        self.inner.handle_request::<_, T>(request, logged).await
    }
}

/// A `ResponseHandler` that encodes the response, logs it with its query, and sends it
/// through `inner`.
#[derive(Clone)]
struct Logged<R> {
    inner: R,
    tap: Arc<TcpTap>,
    client: SocketAddr,
    query: Bytes,
    received: SystemTime,
    protocol: Protocol,
}

#[async_trait::async_trait]
impl<R: ResponseHandler> ResponseHandler for Logged<R> {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        // Encoded as hickory encodes for a stream (no size limit but the message's), then read
        // back into a response to send: a `MessageResponse` is consumed by its encoding.
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(u16::MAX);
        let emitted = response.destructive_emit(&mut encoder);
        let parsed = emitted
            .ok()
            .and_then(|_| Request::from_bytes(bytes.clone(), self.client, self.protocol).ok());
        let Some(parsed) = parsed else {
            // As hickory does with a response it cannot encode.
            tracing::warn!(client = %self.client, "a TCP response could not be encoded (or read back for dnstap): SERVFAIL");
            return self.servfail().await;
        };
        let sent = {
            let builder = MessageResponseBuilder::from_message_request(&parsed);
            let again = builder.build(
                parsed.metadata,
                parsed.answers.iter(),
                parsed.authorities.iter(),
                std::iter::empty(),
                parsed.additionals.iter(),
            );
            self.inner.send_response(again).await
        };
        if sent.is_ok() {
            self.tap
                .record(self.client, &self.query, &bytes, self.received);
        }
        sent
    }
}

impl<R: ResponseHandler> Logged<R> {
    /// SERVFAIL to the query (which parsed: hickory handed it over), not logged.
    async fn servfail(&mut self) -> Result<ResponseInfo, NetError> {
        let query = Request::from_bytes(self.query.to_vec(), self.client, self.protocol)
            .map_err(|e| NetError::from(format!("re-reading a query: {e}")))?;
        let mut metadata = Metadata::response_from_request(&query.metadata);
        metadata.message_type = MessageType::Response;
        metadata.response_code = ResponseCode::ServFail;
        let response =
            MessageResponseBuilder::from_message_request(&query).build_no_records(metadata);
        self.inner.send_response(response).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DnsConfig;
    use std::io::Read;

    fn origin(messages: Messages) -> Origin {
        Origin {
            identity: Bytes::from_static(b"dns-1"),
            version: Bytes::from_static(b"cdnmap test"),
            local: Some("127.0.0.1:53".parse().expect("addr")),
            messages,
        }
    }

    /// The data frames of a buffer: each a 4-byte big-endian length and its payload.
    fn data_frames(mut b: &[u8]) -> Vec<pb::Dnstap> {
        let mut out = Vec::new();
        while b.len() >= 4 {
            let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
            assert_ne!(len, 0, "a control frame among the data frames");
            out.push(pb::Dnstap::decode(&b[4..4 + len]).expect("a Dnstap message"));
            b = &b[4 + len..];
        }
        assert!(b.is_empty(), "a frame cut short");
        out
    }

    /// Control frames are byte for byte what fstrm writes: START with dnstap's content type,
    /// STOP bare; and they read back.
    #[test]
    fn control_frames_are_fstrms() {
        let mut start = Vec::new();
        fstrm::control(fstrm::START, Some(fstrm::DNSTAP), &mut start);
        let mut want = vec![0, 0, 0, 0, 0, 0, 0, 34, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 22];
        want.extend_from_slice(b"protobuf:dnstap.Dnstap");
        assert_eq!(start, want);
        let mut stop = Vec::new();
        fstrm::control(fstrm::STOP, None, &mut stop);
        assert_eq!(stop, [0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 3]);
        let read = fstrm::read_control(&mut start.as_slice()).expect("reads");
        assert_eq!(read.kind, fstrm::START);
        assert_eq!(read.content_types, vec![fstrm::DNSTAP.to_vec()]);
        assert_eq!(
            fstrm::read_control(&mut stop.as_slice()).expect("reads"),
            fstrm::Control {
                kind: fstrm::STOP,
                content_types: vec![]
            }
        );
    }

    /// A control frame that is a data frame, too long, too short or whose field overruns it
    /// is refused, and no read goes beyond the bound.
    #[test]
    fn bad_control_frames_are_refused() {
        let cases: [&[u8]; 4] = [
            &[0, 0, 0, 9, 0, 0, 0, 4],
            &[0, 0, 0, 0, 0, 0, 2, 1],
            &[0, 0, 0, 0, 0, 0, 0, 2, 0, 0],
            &[0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 9],
        ];
        for c in cases {
            assert!(fstrm::read_control(&mut &c[..]).is_err(), "{c:?}");
        }
        assert!(fstrm::read_control(&mut &[0u8, 0, 0][..]).is_err());
    }

    /// A batch makes an AUTH_QUERY and an AUTH_RESPONSE a query, with the client, the times
    /// and the bytes verbatim; no response frame for a query not answered; `messages` picks.
    #[test]
    fn batches_make_query_and_response_frames() {
        let t0 = UNIX_EPOCH + Duration::new(1_780_000_000, 123_456_789);
        let t1 = t0 + Duration::from_micros(40);
        let make = || {
            let mut b = Batch {
                protocol: Protocol::Udp,
                received: t0,
                sent: t1,
                bytes: Vec::new(),
                entries: Vec::new(),
            };
            b.push(
                "192.0.2.7:5300".parse().expect("addr"),
                b"query-1",
                b"response-1",
            );
            b.push(
                "[2001:db8::9]:53000".parse().expect("addr"),
                b"query-2",
                b"",
            );
            b
        };
        let mut out = Vec::new();
        assert_eq!(encode_batch(&origin(Messages::Both), make(), &mut out), 3);
        let frames = data_frames(&out);
        assert_eq!(frames.len(), 3);
        let m: Vec<&pb::Message> = frames
            .iter()
            .map(|f| f.message.as_ref().expect("message"))
            .collect();
        assert_eq!(frames[0].identity.as_deref(), Some(&b"dns-1"[..]));
        assert_eq!(frames[0].r#type, pb::dnstap::Type::Message as i32);
        assert_eq!(m[0].r#type, pb::message::Type::AuthQuery as i32);
        assert_eq!(m[0].query_address.as_deref(), Some(&[192, 0, 2, 7][..]));
        assert_eq!(m[0].query_port, Some(5300));
        assert_eq!(m[0].socket_family, Some(pb::SocketFamily::Inet as i32));
        assert_eq!(m[0].socket_protocol, Some(pb::SocketProtocol::Udp as i32));
        assert_eq!(m[0].response_address.as_deref(), Some(&[127, 0, 0, 1][..]));
        assert_eq!(m[0].response_port, Some(53));
        assert_eq!(m[0].query_message.as_deref(), Some(&b"query-1"[..]));
        assert_eq!(
            (m[0].query_time_sec, m[0].query_time_nsec),
            (Some(1_780_000_000), Some(123_456_789))
        );
        assert_eq!(m[1].r#type, pb::message::Type::AuthResponse as i32);
        assert_eq!(m[1].response_message.as_deref(), Some(&b"response-1"[..]));
        assert_eq!(
            (m[1].response_time_sec, m[1].response_time_nsec),
            (Some(1_780_000_000), Some(123_496_789))
        );
        assert_eq!(m[1].query_message, None);
        assert_eq!(m[2].r#type, pb::message::Type::AuthQuery as i32);
        assert_eq!(m[2].socket_family, Some(pb::SocketFamily::Inet6 as i32));
        assert_eq!(m[2].query_address.as_ref().map(|a| a.len()), Some(16));
        for (messages, want) in [(Messages::Queries, 2), (Messages::Responses, 1)] {
            let mut out = Vec::new();
            assert_eq!(encode_batch(&origin(messages), make(), &mut out), want);
            assert_eq!(data_frames(&out).len(), want as usize);
        }
    }

    fn tap(sample: u64, capacity: usize) -> (Tap, Receiver<Batch>) {
        let (tx, rx) = mpsc::sync_channel(capacity);
        let shared = Arc::new(Shared {
            sample,
            messages: Messages::Both,
            queued_bytes: AtomicUsize::new(0),
            dropped: metrics::Counter::noop(),
            closing: AtomicBool::new(false),
        });
        (
            Tap {
                shared,
                tx,
                seen: 0,
            },
            rx,
        )
    }

    /// One query of every N is taken, the first included, counted across batches; a batch
    /// with none sampled hands nothing over; a full queue drops, never waits.
    #[test]
    fn sampling_counts_and_a_full_queue_drops() {
        let (mut t, rx) = tap(3, 2);
        let q: Vec<(&[u8], SocketAddr)> = (0..10)
            .map(|_| (&b"q"[..], "127.0.0.1:1000".parse().expect("addr")))
            .collect();
        let r = vec![b"r".to_vec(); 10];
        let now = SystemTime::now();
        t.udp(&q[..4], &r[..4], now, now); // 0 and 3
        t.udp(&q[..1], &r[..1], now, now); // 4: none
        t.udp(&q[..6], &r[..6], now, now); // 5..10: 6 and 9
        let got: Vec<usize> = rx.try_iter().map(|b| b.entries.len()).collect();
        assert_eq!(got, vec![2, 2]);
        // The queue holds 2: the third batch is dropped at once.
        for _ in 0..3 {
            t.udp(&q[..1], &r[..1], now, now);
            t.seen = 0;
        }
        assert_eq!(rx.try_iter().count(), 2);
        // Bytes queued (the writer counts them down; this receiver does not): 2 + 2 bytes
        // for each of the first two batches, 2 for each of the two taken after; none for the
        // one dropped.
        assert_eq!(t.shared.queued_bytes.load(Ordering::Relaxed), 12);
    }

    /// A file gets START, the data frames, and STOP when the writer finishes.
    #[test]
    fn a_file_is_a_unidirectional_stream() {
        let dir = std::env::temp_dir().join(format!("cdnmap-dnstap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("a.dnstap");
        let settings = Settings {
            sink: Sink::File(path.clone()),
            sample: 1,
            identity: "dns-1".into(),
            messages: Messages::Both,
        };
        let d = Dnstap::start(&settings, "127.0.0.1:53".parse().expect("addr")).expect("starts");
        let mut t = d.tap();
        let now = SystemTime::now();
        t.udp(
            &[(&b"query"[..], "127.0.0.1:1000".parse().expect("addr"))],
            &[b"answer".to_vec()],
            now,
            now,
        );
        drop(t);
        d.finish();
        let bytes = std::fs::read(&path).expect("read");
        let start = fstrm::read_control(&mut &bytes[..]).expect("START");
        assert_eq!(start.kind, fstrm::START);
        let body = &bytes[42..bytes.len() - 12];
        assert_eq!(data_frames(body).len(), 2);
        assert_eq!(
            &bytes[bytes.len() - 12..],
            &[0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 3]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// On a socket: READY, the reader's ACCEPT, START, frames, STOP and the reader's FINISH;
    /// a reader that goes away is connected to again.
    #[cfg(unix)]
    #[test]
    fn a_socket_is_a_bidirectional_stream_connected_again() {
        use std::os::unix::net::UnixListener;
        let dir = std::env::temp_dir().join(format!("cdnmap-dnstap-s-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("s");
        let listener = UnixListener::bind(&path).expect("bind");
        // A reader: the handshake (then `connected` is set), then the data frames until STOP
        // (answered by FINISH) or `frames` of them (then it hangs up).
        let connected = AtomicBool::new(false);
        let reader = |listener: &UnixListener, frames: Option<usize>| -> (usize, bool) {
            let (mut s, _) = listener.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let ready = fstrm::read_control(&mut s).expect("READY");
            assert_eq!(ready.kind, fstrm::READY);
            assert_eq!(ready.content_types, vec![fstrm::DNSTAP.to_vec()]);
            let mut accept = Vec::new();
            fstrm::control(fstrm::ACCEPT, Some(fstrm::DNSTAP), &mut accept);
            s.write_all(&accept).expect("ACCEPT");
            let start = fstrm::read_control(&mut s).expect("START");
            assert_eq!(start.kind, fstrm::START);
            connected.store(true, Ordering::Relaxed);
            let mut n = 0;
            loop {
                if frames == Some(n) {
                    return (n, false);
                }
                let mut len = [0u8; 4];
                s.read_exact(&mut len).expect("a frame");
                let len = u32::from_be_bytes(len) as usize;
                if len == 0 {
                    let mut rest = [0u8; 8];
                    s.read_exact(&mut rest).expect("STOP");
                    assert_eq!(rest, [0, 0, 0, 4, 0, 0, 0, 3]);
                    let mut finish = Vec::new();
                    fstrm::control(fstrm::FINISH, None, &mut finish);
                    s.write_all(&finish).expect("FINISH");
                    return (n, true);
                }
                let mut payload = vec![0u8; len];
                s.read_exact(&mut payload).expect("payload");
                pb::Dnstap::decode(payload.as_slice()).expect("a Dnstap message");
                n += 1;
            }
        };
        let settings = Settings {
            sink: Sink::Socket(path.clone()),
            sample: 1,
            identity: "dns-1".into(),
            messages: Messages::Both,
        };
        let d = Dnstap::start(&settings, "127.0.0.1:53".parse().expect("addr")).expect("starts");
        let mut t = d.tap();
        let q = [(&b"query"[..], "127.0.0.1:1000".parse().expect("addr"))];
        let r = [b"answer".to_vec()];
        let send = |t: &mut Tap| t.udp(&q, &r, SystemTime::now(), SystemTime::now());
        send(&mut t);
        assert_eq!(reader(&listener, Some(2)), (2, false));
        connected.store(false, Ordering::Relaxed);
        // The first reader hung up: writes fail (frames dropped) until the writer connects
        // again, which the second reader sees; it then gets what is sent, and STOP.
        let second = std::thread::scope(|s| {
            let r2 = s.spawn(|| reader(&listener, None));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !connected.load(Ordering::Relaxed) && Instant::now() < deadline {
                send(&mut t);
                std::thread::sleep(Duration::from_millis(20));
            }
            send(&mut t);
            drop(t);
            d.finish();
            r2.join().expect("reader")
        });
        assert!(second.1, "the second reader got STOP");
        assert!(second.0 >= 2, "the second reader got frames: {second:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The configuration's keys: a destination or nothing; the other keys only with one; each
    /// error names its key.
    #[test]
    fn settings_refuse_nonsense_naming_the_key() {
        let c = |f: &dyn Fn(&mut DnsConfig)| {
            let mut c = DnsConfig::default();
            f(&mut c);
            Settings::from_config(&c).map_err(|e| e.to_string())
        };
        assert_eq!(c(&|_| {}), Ok(None));
        let on = c(&|c| c.dnstap_file = Some("/tmp/x.dnstap".into()))
            .expect("valid")
            .expect("on");
        assert_eq!(
            (on.sample, on.identity.as_str(), on.messages),
            (1, "cdnmap-dns", Messages::Both)
        );
        type Edit<'a> = &'a dyn Fn(&mut DnsConfig);
        let refused: [(Edit, &str); 6] = [
            (
                &|c| c.dnstap_sample = Some(10),
                "dnstap_sample: is given without",
            ),
            (
                &|c| c.dnstap_messages = Some(Messages::Queries),
                "dnstap_messages: is given without",
            ),
            (
                &|c| {
                    c.dnstap_file = Some("a".into());
                    c.dnstap_socket = Some("b".into());
                },
                "dnstap_socket: is given with dnstap_file",
            ),
            (
                &|c| {
                    c.dnstap_file = Some("a".into());
                    c.dnstap_sample = Some(0);
                },
                "dnstap_sample: 0 is outside",
            ),
            (
                &|c| {
                    c.dnstap_socket = Some("/".repeat(200).into());
                },
                "dnstap_socket: ",
            ),
            (
                &|c| c.dnstap_file = Some("".into()),
                "dnstap_file: is empty",
            ),
        ];
        for (f, want) in refused {
            let got = c(f).expect_err(want);
            assert!(
                got.starts_with(want),
                "{got:?} does not start with {want:?}"
            );
        }
    }
}
