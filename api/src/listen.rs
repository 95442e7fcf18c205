//! Accepting connections on the mapper's listeners, one mechanism for gRPC and HTTP: a bound
//! on the connections open at once, a deadline for the TLS handshake (or, in plaintext, for a
//! client's first bytes), and the peer's address and identity carried with the connection.
//!
//! The accept loop never waits on a client: each handshake runs in its own task, and what
//! comes through it goes to the server over a bounded channel. A connection past the bound is
//! closed as soon as it is accepted and counted
//! (`cdnmap_connections_refused_total{listener}`); one whose handshake does not finish in time
//! is closed and counted (`cdnmap_handshakes_failed_total{listener}`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;

use crate::tls::{Listener, ServerTls};

/// Who is at the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub remote: SocketAddr,
    /// The identity of the client's verified certificate (`tls::identity_of`), if it gave one.
    pub identity: Option<Arc<str>>,
}

/// The peer of a gRPC request (tonic puts it in the request's extensions).
pub fn peer_of<T>(request: &tonic::Request<T>) -> Option<&Peer> {
    request.extensions().get::<Peer>()
}

/// What one listener's connections may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The TLS handshake, or in plaintext the client's first bytes, must come within this.
    pub handshake_timeout: Duration,
    /// Connections open at once, at most.
    pub max_connections: usize,
}

/// A connection, plaintext or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// An accepted connection: its stream, its peer, and its place under the listener's bound
/// (given back when it is dropped).
pub struct Conn {
    stream: Stream,
    peer: Peer,
    _permit: OwnedSemaphorePermit,
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
        match &mut self.get_mut().stream {
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
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().stream {
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
        match &mut self.get_mut().stream {
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

/// Accepts on `tcp` until `stop` says so, each connection under `limits` and through `tls`
/// when it is given: the connections ready to serve, in the order their handshakes end.
pub fn accept(
    tcp: TcpListener,
    listener: Listener,
    tls: Option<Arc<ServerTls>>,
    limits: Limits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::sync::mpsc::Receiver<Conn> {
    let (ready, out) = tokio::sync::mpsc::channel(READY_QUEUE);
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let what = name(listener);
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
            let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                metrics::counter!("cdnmap_connections_refused_total", "listener" => what)
                    .increment(1);
                drop(stream);
                continue;
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
                let conn = Conn {
                    stream,
                    peer: Peer { remote, identity },
                    _permit: permit,
                };
                let _ = ready.send(conn).await;
            });
        }
    });
    out
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
