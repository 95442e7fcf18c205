//! Accepting connections on the mapper's listeners, one mechanism for gRPC and HTTP: bounds on
//! the connections open at once (in all, and from one source), deadlines that close a
//! connection which is not served, and the peer's address and identity carried with the
//! connection.
//!
//! The accept loop never waits on a client: each handshake runs in its own task, and what
//! comes through it goes to the server over a bounded channel. A connection past the bound is
//! closed as soon as it is accepted and counted (`cdnmap_connections_refused_total{listener}`;
//! past its source's share, `cdnmap_connections_refused_per_source_total{listener}`).
//!
//! **Deadlines.** A connection must, within `handshake_timeout` of its arrival, finish its TLS
//! handshake (in plaintext: send its first bytes) and then have a request answered: the whole
//! HTTP/2 preface, the SETTINGS, a request's headers and its body. A request refused for want
//! of credentials (gRPC's UNAUTHENTICATED or PERMISSION_DENIED, HTTP's 401 or 403) does not
//! count, so with mutual TLS a client without a certificate keeps its connection only by
//! asking for what anonymous clients may have. A request sent whole and still being answered
//! holds the deadline off (the client did its part: a report waiting on the store's fsync
//! is not cut). One that misses the deadline is closed and counted
//! (`cdnmap_handshakes_failed_total{listener}`). Once served, a connection is closed
//! when it has had no request open (no call in progress, no WatchMap stream) for
//! `idle_timeout` (`cdnmap_connections_idle_closed_total{listener}`): a client that asks for
//! something cheap and then only answers HTTP/2 pings holds its slot no longer. A stream open
//! for hours (a front end's WatchMap) is never idle.
//!
//! Each listener has a reaper task that looks at its connections every [`REAP_EVERY`] and
//! closes those past a deadline ([`verdict`], pure: time is its argument). Closing makes the
//! connection's reads and writes fail, which ends it in hyper (tonic serves the gRPC
//! connections itself, so nothing else can reach into them); its place is given back when it
//! is dropped. The handlers' requests are counted on the connection through [`Peer::conn`]:
//! [`TrackRequestsLayer`] for gRPC, [`track_request`] for HTTP.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::tls::{Listener, ServerTls};

/// Who is at the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub remote: SocketAddr,
    /// The identity of the client's verified certificate (`tls::identity_of`), if it gave one.
    pub identity: Option<Arc<str>>,
    /// The connection's requests, counted for its deadlines.
    pub conn: Arc<Tracked>,
}

/// The peer of a gRPC request (tonic puts it in the request's extensions).
pub fn peer_of<T>(request: &tonic::Request<T>) -> Option<&Peer> {
    request.extensions().get::<Peer>()
}

/// What one listener's connections may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From its arrival, a connection's handshake and first answered request must come within
    /// this (module docs).
    pub handshake_timeout: Duration,
    /// A served connection with no request open for this long is closed.
    pub idle_timeout: Duration,
    /// Connections open at once, at most.
    pub max_connections: usize,
    /// Connections open at once from one source ([`source_of`]), at most.
    pub max_per_source: usize,
}

/// How often a listener's reaper looks at its connections' deadlines (a deadline is kept to
/// within this).
pub const REAP_EVERY: Duration = Duration::from_millis(250);

/// The key a source's share is counted under: its IPv4 address (an IPv4-mapped IPv6 address
/// is one), or the /64 of its IPv6 address (what one host is usually given).
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// As many connections are open as the listener takes.
    Full,
    /// As many are open from this source as one source may hold.
    Source,
}

/// The connections open on a listener, in all and by source: whether one more may come in.
/// Holds at most `cap` sources (each with a connection open).
#[derive(Debug)]
pub struct Shares {
    cap: usize,
    per_source: usize,
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

impl Shares {
    pub fn new(cap: usize, per_source: usize) -> Shares {
        Shares {
            cap,
            per_source: per_source.min(cap),
            total: 0,
            by_source: HashMap::new(),
        }
    }

    /// Counts a connection from `source` in, unless it is one too many.
    pub fn admit(&mut self, source: IpAddr) -> Result<(), Refused> {
        if self.total >= self.cap {
            return Err(Refused::Full);
        }
        let held = self.by_source.entry(source).or_insert(0);
        if *held >= self.per_source {
            return Err(Refused::Source);
        }
        *held += 1;
        self.total += 1;
        Ok(())
    }

    /// Counts a connection from `source` out (one that [`Shares::admit`] let in).
    pub fn release(&mut self, source: IpAddr) {
        if let Some(held) = self.by_source.get_mut(&source) {
            *held -= 1;
            if *held == 0 {
                self.by_source.remove(&source);
            }
            self.total -= 1;
        }
    }

    /// Connections open, in all.
    pub fn open(&self) -> usize {
        self.total
    }
}

/// What the reaper knows of a connection at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Since it arrived.
    pub age: Duration,
    /// Whether a request of it was answered (and not refused for want of credentials).
    pub answered: bool,
    /// Requests in progress (streams open).
    pub open: usize,
    /// Requests in progress sent whole (their body ended), not yet answered.
    pub asked: usize,
    /// Since its last request ended (or, with none yet, since it arrived).
    pub quiet: Duration,
}

/// What to do with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Not served within the handshake deadline.
    NotServed,
    /// Served, but no request open for the idle timeout.
    Idle,
}

/// What to do with the connection `seen` under `limits`.
pub fn verdict(seen: Seen, limits: &Limits) -> Verdict {
    if !seen.answered {
        if seen.age >= limits.handshake_timeout && seen.asked == 0 {
            return Verdict::NotServed;
        }
        return Verdict::Keep;
    }
    if seen.open == 0 && seen.quiet >= limits.idle_timeout {
        return Verdict::Idle;
    }
    Verdict::Keep
}

/// One connection's requests and deadlines, shared by its stream ([`Conn`]), its requests
/// (through [`Peer::conn`]) and its listener's reaper.
pub struct Tracked {
    arrived: Instant,
    answered: AtomicBool,
    open: AtomicUsize,
    /// Requests sent whole and not yet answered.
    asked: AtomicUsize,
    /// Milliseconds from `arrived` to the end of the last request.
    quiet_since_ms: AtomicU64,
    closing: AtomicBool,
    /// Set once its handshake is done and the server has it (before, the accept task's
    /// deadline is the one that counts).
    serving: AtomicBool,
    /// The tasks waiting to read and to write, woken when the connection is closed.
    wakers: Mutex<[Option<Waker>; 2]>,
}

impl std::fmt::Debug for Tracked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracked")
            .field("answered", &self.answered.load(Ordering::Relaxed))
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Tracked {
    fn new(arrived: Instant) -> Tracked {
        Tracked {
            arrived,
            answered: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            asked: AtomicUsize::new(0),
            quiet_since_ms: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            wakers: Mutex::new([None, None]),
        }
    }

    /// A request begins: it is open until the guard is dropped (with its response's body).
    pub fn request(self: &Arc<Self>) -> RequestGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        RequestGuard {
            conn: Arc::clone(self),
            state: Arc::new(AtomicU8::new(BODY_COMING)),
        }
    }

    fn seen(&self, now: Instant) -> Seen {
        let age = now.saturating_duration_since(self.arrived);
        // `open` first: a request's end stores its time before it lowers `open`, so seeing
        // it lowered means seeing that time.
        let open = self.open.load(Ordering::Acquire);
        let quiet_since = Duration::from_millis(self.quiet_since_ms.load(Ordering::Acquire));
        Seen {
            age,
            answered: self.answered.load(Ordering::Acquire),
            open,
            asked: self.asked.load(Ordering::Acquire),
            quiet: age.saturating_sub(quiet_since),
        }
    }

    /// Makes the connection's reads and writes fail from now on, waking whoever waits on them
    /// (hyper then ends it, and it is dropped).
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let wakers =
            std::mem::take(&mut *self.wakers.lock().unwrap_or_else(PoisonError::into_inner));
        for w in wakers.into_iter().flatten() {
            w.wake();
        }
    }

    /// The error a read (`slot` 0) or write (1) ends with when the connection is closed;
    /// otherwise `None`, the waker kept to be woken when it is.
    fn poll_closed(&self, cx: &Context<'_>, slot: usize) -> Option<std::io::Error> {
        {
            let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
            match &mut wakers[slot] {
                Some(w) if w.will_wake(cx.waker()) => {}
                w => *w = Some(cx.waker().clone()),
            }
        }
        self.closing.load(Ordering::Acquire).then(|| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "closed by the listener: not served in time, or idle",
            )
        })
    }
}

/// Where a request is: its body still coming, sent whole and waiting for its answer (counted
/// in `Tracked::asked`), or answered (or gone).
const BODY_COMING: u8 = 0;
const ASKED: u8 = 1;
const ANSWERED: u8 = 2;

/// An open request of a connection; its end (the drop) starts the connection's idle time when
/// it was the last one open.
pub struct RequestGuard {
    conn: Arc<Tracked>,
    state: Arc<AtomicU8>,
}

impl RequestGuard {
    /// The request was answered: the connection is served (unless `refused`, for want of
    /// credentials).
    pub fn answered(&self, refused: bool) {
        self.finish();
        if !refused {
            self.conn.answered.store(true, Ordering::Release);
        }
    }

    /// The request's body, watched: when it ends the request counts as sent whole.
    pub fn watch_body<B: http_body::Body + Unpin>(&self, body: B) -> WatchedBody<B> {
        let watched = WatchedBody {
            inner: body,
            state: Arc::clone(&self.state),
            conn: Arc::clone(&self.conn),
        };
        if watched.inner.is_end_stream() {
            watched.sent_whole();
        }
        watched
    }

    /// No longer waiting for an answer.
    fn finish(&self) {
        if self.state.swap(ANSWERED, Ordering::AcqRel) == ASKED {
            self.conn.asked.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A request's body that tells its connection when it has come whole.
pub struct WatchedBody<B> {
    inner: B,
    state: Arc<AtomicU8>,
    conn: Arc<Tracked>,
}

impl<B> WatchedBody<B> {
    fn sent_whole(&self) {
        let asked =
            self.state
                .compare_exchange(BODY_COMING, ASKED, Ordering::AcqRel, Ordering::Acquire);
        if asked.is_ok() {
            self.conn.asked.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for WatchedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            this.sent_whole();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.finish();
        let c = &self.conn;
        let now_ms = c.arrived.elapsed().as_millis() as u64;
        c.quiet_since_ms.store(now_ms, Ordering::Release);
        c.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a response refuses its request for want of credentials: HTTP 401 or 403, or
/// gRPC's UNAUTHENTICATED (16) or PERMISSION_DENIED (7) in its headers (a call that fails at
/// once answers with its status there).
pub fn refused_for_credentials(
    status: axum::http::StatusCode,
    headers: &axum::http::HeaderMap,
) -> bool {
    use axum::http::StatusCode;
    status == StatusCode::UNAUTHORIZED
        || status == StatusCode::FORBIDDEN
        || headers
            .get("grpc-status")
            .is_some_and(|v| v.as_bytes() == b"16" || v.as_bytes() == b"7")
}

/// Counts each gRPC request on its connection (the [`Peer`] in its extensions) from its
/// arrival until its response's body is done, and marks the connection served by the first
/// answer not refused for want of credentials ([`refused_for_credentials`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackRequestsLayer;

impl<S> tower::Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests(inner)
    }
}

/// The service of [`TrackRequestsLayer`].
#[derive(Debug, Clone)]
pub struct TrackRequests<S>(S);

type GrpcRequest = axum::http::Request<tonic::body::Body>;
type GrpcResponse = axum::http::Response<tonic::body::Body>;

impl<S> tower::Service<GrpcRequest> for TrackRequests<S>
where
    S: tower::Service<GrpcRequest, Response = GrpcResponse>,
    S::Future: Send + 'static,
{
    type Response = GrpcResponse;
    type Error = S::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<GrpcResponse, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: GrpcRequest) -> Self::Future {
        let guard = request.extensions().get::<Peer>().map(|p| p.conn.request());
        let request = match &guard {
            Some(g) => request.map(|body| tonic::body::Body::new(g.watch_body(body))),
            None => request,
        };
        let answer = self.0.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let Some(guard) = guard else {
                return Ok(response);
            };
            guard.answered(refused_for_credentials(
                response.status(),
                response.headers(),
            ));
            // The body holds the guard: the request is open while its stream is.
            Ok(response.map(|body| {
                tonic::body::Body::new(http_body_util::BodyExt::map_frame(body, move |f| {
                    let _open = &guard;
                    f
                }))
            }))
        })
    }
}

/// A connection, plaintext or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// An accepted connection: its stream, its peer, and its place under the listener's bounds
/// (given back when it is dropped). Its reads and writes fail once the listener closes it.
pub struct Conn {
    stream: Stream,
    peer: Peer,
    _ticket: Ticket,
}

impl Conn {
    pub fn peer(&self) -> &Peer {
        &self.peer
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.peer.conn.poll_closed(cx, 0) {
            return Poll::Ready(Err(e));
        }
        match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.peer.conn.poll_closed(cx, 1) {
            return Poll::Ready(Err(e));
        }
        match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.peer.conn.poll_closed(cx, 1) {
            return Poll::Ready(Err(e));
        }
        match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.peer.conn.poll_closed(cx, 1) {
            return Poll::Ready(Err(e));
        }
        match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Handshakes in progress that may wait for the server to take their connection.
const READY_QUEUE: usize = 64;

/// The name of `listener` in metrics and logs.
fn name(listener: Listener) -> &'static str {
    match listener {
        Listener::Grpc => "grpc",
        Listener::Http => "http",
    }
}

/// A listener's connections: their shares of its bounds, and each one's requests for the
/// reaper.
struct Listening {
    what: &'static str,
    limits: Limits,
    inner: Mutex<Open>,
}

struct Open {
    shares: Shares,
    conns: HashMap<u64, Weak<Tracked>>,
    next_id: u64,
}

impl Listening {
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // Nothing under the lock can leave `Open` half changed.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection from `remote` arriving now, or why there is none.
    fn admit(self: &Arc<Self>, remote: IpAddr, now: Instant) -> Result<Ticket, Refused> {
        let source = source_of(remote);
        let mut open = self.lock();
        open.shares.admit(source)?;
        let id = open.next_id;
        open.next_id += 1;
        let tracked = Arc::new(Tracked::new(now));
        open.conns.insert(id, Arc::downgrade(&tracked));
        Ok(Ticket {
            listening: Arc::clone(self),
            id,
            source,
            tracked,
        })
    }

    /// Closes the connections past a deadline at `now` (counted and logged at debug).
    fn reap(&self, now: Instant) {
        let open = self.lock();
        for tracked in open.conns.values().filter_map(Weak::upgrade) {
            if tracked.closing.load(Ordering::Acquire) || !tracked.serving.load(Ordering::Acquire) {
                continue;
            }
            let seen = tracked.seen(now);
            match verdict(seen, &self.limits) {
                Verdict::Keep => continue,
                Verdict::NotServed => {
                    metrics::counter!("cdnmap_handshakes_failed_total", "listener" => self.what)
                        .increment(1);
                    tracing::debug!(
                        listener = self.what,
                        ?seen,
                        "a connection not served in time closed"
                    );
                }
                Verdict::Idle => {
                    metrics::counter!("cdnmap_connections_idle_closed_total", "listener" => self.what)
                        .increment(1);
                    tracing::debug!(listener = self.what, ?seen, "an idle connection closed");
                }
            }
            tracked.close();
        }
    }
}

/// A connection's place under its listener's bounds, given back when dropped.
struct Ticket {
    listening: Arc<Listening>,
    id: u64,
    source: IpAddr,
    tracked: Arc<Tracked>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.listening.lock();
        open.conns.remove(&self.id);
        open.shares.release(self.source);
    }
}

/// Accepts on `tcp` until `stop` says so, each connection under `limits` and through `tls`
/// when it is given: the connections ready to serve, in the order their handshakes end. A
/// reaper closes those past their deadlines (module docs).
pub fn accept(
    tcp: TcpListener,
    listener: Listener,
    tls: Option<Arc<ServerTls>>,
    limits: Limits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::sync::mpsc::Receiver<Conn> {
    let (ready, out) = tokio::sync::mpsc::channel(READY_QUEUE);
    let what = name(listener);
    let listening = Arc::new(Listening {
        what,
        limits,
        inner: Mutex::new(Open {
            shares: Shares::new(limits.max_connections, limits.max_per_source),
            conns: HashMap::new(),
            next_id: 0,
        }),
    });
    tokio::spawn(reaper(Arc::downgrade(&listening), stop.clone()));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = tcp.accept() => accepted,
                _ = stop.wait_for(|&s| s) => return,
                () = ready.closed() => return,
            };
            let (stream, remote) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors, say: wait a little rather than spin on it.
                    tracing::debug!(error = %e, listener = what, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let ticket = match listening.admit(remote.ip(), Instant::now()) {
                Ok(t) => t,
                Err(Refused::Full) => {
                    metrics::counter!("cdnmap_connections_refused_total", "listener" => what)
                        .increment(1);
                    drop(stream);
                    continue;
                }
                Err(Refused::Source) => {
                    metrics::counter!("cdnmap_connections_refused_per_source_total", "listener" => what)
                        .increment(1);
                    tracing::debug!(%remote, listener = what, "a source past its share of connections refused");
                    drop(stream);
                    continue;
                }
            };
            let (tls, ready) = (tls.clone(), ready.clone());
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let shaken = tokio::time::timeout(
                    limits.handshake_timeout,
                    handshake(stream, tls.as_deref(), listener),
                )
                .await;
                let (stream, identity) = match shaken {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        metrics::counter!("cdnmap_handshakes_failed_total", "listener" => what)
                            .increment(1);
                        tracing::debug!(error = %e, %remote, listener = what, "handshake failed");
                        return;
                    }
                    Err(_) => {
                        metrics::counter!("cdnmap_handshakes_failed_total", "listener" => what)
                            .increment(1);
                        tracing::debug!(%remote, listener = what, "handshake timed out");
                        return;
                    }
                };
                ticket.tracked.serving.store(true, Ordering::Release);
                let conn = Conn {
                    stream,
                    peer: Peer {
                        remote,
                        identity,
                        conn: Arc::clone(&ticket.tracked),
                    },
                    _ticket: ticket,
                };
                let _ = ready.send(conn).await;
            });
        }
    });
    out
}

/// Every [`REAP_EVERY`], closes the connections of `listening` past their deadlines, until
/// `stop` says so or the listener is gone.
async fn reaper(listening: Weak<Listening>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(REAP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|&s| s) => return,
        }
        let Some(listening) = listening.upgrade() else {
            return;
        };
        listening.reap(Instant::now());
    }
}

/// The TLS handshake (with the client's identity), or in plaintext the wait for the client's
/// first bytes.
async fn handshake(
    stream: TcpStream,
    tls: Option<&ServerTls>,
    listener: Listener,
) -> std::io::Result<(Stream, Option<Arc<str>>)> {
    match tls {
        None => {
            // `readable` may report a new socket ready before a byte came (tokio's readiness
            // starts optimistic); `peek` waits for a byte (or the end) for real.
            stream.peek(&mut [0u8; 1]).await?;
            Ok((Stream::Plain(stream), None))
        }
        Some(tls) => {
            let s = tls.acceptor(listener).accept(stream).await?;
            let identity = s
                .get_ref()
                .1
                .peer_certificates()
                .and_then(crate::tls::identity_of);
            Ok((Stream::Tls(Box::new(s)), identity))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        handshake_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
        max_connections: 4,
        max_per_source: 2,
    };

    fn seen(age_s: u64, answered: bool, open: usize, quiet_s: u64) -> Seen {
        Seen {
            age: Duration::from_secs(age_s),
            answered,
            open,
            asked: 0,
            quiet: Duration::from_secs(quiet_s),
        }
    }

    /// The deadlines as a table: (what the reaper saw, what it does).
    #[test]
    fn a_connection_is_kept_while_served_or_within_its_deadlines() {
        use Verdict::*;
        let table = [
            (seen(9, false, 0, 9), Keep),
            (seen(10, false, 0, 10), NotServed),
            // A request in progress whose body has not come whole is no answer...
            (seen(11, false, 1, 11), NotServed),
            // ...one sent whole and still being answered holds the deadline off.
            (
                Seen {
                    asked: 1,
                    ..seen(11, false, 1, 11)
                },
                Keep,
            ),
            (seen(11, true, 0, 11), Keep),
            (seen(500, true, 0, 119), Keep),
            (seen(500, true, 0, 120), Idle),
            // A stream open for hours is never idle.
            (seen(36_000, true, 1, 36_000), Keep),
        ];
        for (s, want) in table {
            assert_eq!(verdict(s, &LIMITS), want, "{s:?}");
        }
    }

    #[test]
    fn a_source_holds_at_most_its_share_and_the_listener_its_cap() {
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "192.0.2.1".parse().expect("an address"),
            "192.0.2.2".parse().expect("an address"),
            "192.0.2.3".parse().expect("an address"),
        );
        let mut shares = Shares::new(LIMITS.max_connections, LIMITS.max_per_source);
        assert_eq!(shares.admit(a), Ok(()));
        assert_eq!(shares.admit(a), Ok(()));
        assert_eq!(shares.admit(a), Err(Refused::Source));
        assert_eq!(shares.admit(b), Ok(()));
        assert_eq!(shares.admit(b), Ok(()));
        assert_eq!(shares.admit(c), Err(Refused::Full));
        shares.release(a);
        assert_eq!(shares.admit(c), Ok(()));
        assert_eq!(shares.admit(a), Err(Refused::Full));
        for s in [a, b, b, c] {
            shares.release(s);
        }
        assert_eq!(shares.open(), 0);
        assert!(shares.by_source.is_empty(), "{:?}", shares.by_source);
        // Releasing what was never admitted changes nothing.
        shares.release(c);
        assert_eq!(shares.open(), 0);
        // A share above the cap is the cap.
        let mut one = Shares::new(1, 256);
        assert_eq!(one.admit(a), Ok(()));
        assert_eq!(one.admit(a), Err(Refused::Full));
    }

    #[test]
    fn an_ipv6_source_is_its_64_and_a_mapped_ipv4_address_is_itself() {
        let source = |s: &str| source_of(s.parse().expect("an address")).to_string();
        assert_eq!(source("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(source("2001:db8:1:2:ffff::9"), "2001:db8:1:2::");
        assert_eq!(source("2001:db8:1:3::1"), "2001:db8:1:3::");
        assert_eq!(source("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(source("192.0.2.7"), "192.0.2.7");
    }
}
