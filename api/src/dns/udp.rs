//! The UDP path: hickory's `Request`, our `RequestHandler` and hickory's response encoding
//! (with its truncation), driven by one OS thread per socket that reads a datagram, answers it
//! inline and sends the answer, with blocking system calls (as gdnsd does).
//!
//! hickory's own UDP server spawns a task per datagram and hands each response through a
//! channel to a sender task, and the async socket adds an epoll round per datagram; at a hundred
//! thousand queries per second those hops cost more than the answer itself (measured: 42 k/s
//! through hickory's server, 3–4× that here). TCP stays on hickory's server.

use std::future::Future;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::net::NetError;
use hickory_server::proto::op::{
    Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::Record;
use hickory_server::proto::serialize::binary::{BinEncodable, BinEncoder};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;

/// `count` UDP sockets bound to `addr` with SO_REUSEPORT (on Unix), so the kernel spreads
/// datagrams over them and each answering loop waits on its own socket.
pub fn bind(addr: SocketAddr, count: usize) -> std::io::Result<Vec<Arc<UdpSocket>>> {
    use socket2::{Domain, Protocol as SockProtocol, Socket, Type};
    let mut out = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::DGRAM,
            Some(SockProtocol::UDP),
        )?;
        #[cfg(unix)]
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        let socket: UdpSocket = socket.into();
        // Wake now and then to see whether the front end is stopping.
        socket.set_read_timeout(Some(Duration::from_millis(250)))?;
        out.push(Arc::new(socket));
        if cfg!(not(unix)) {
            // One socket shared by every loop.
            let one = Arc::clone(&out[0]);
            out.resize(count.max(1), one);
            break;
        }
    }
    Ok(out)
}

/// The largest datagram read.
const MAX_DATAGRAM: usize = 4096;

/// A `ResponseHandler` that encodes the response for UDP and keeps the bytes for the loop to
/// send.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Option<Vec<u8>>>>);

#[async_trait::async_trait]
impl ResponseHandler for Capture {
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
        let id = response.metadata().id;
        // As hickory encodes for UDP: the response's EDNS buffer size, else 512 bytes
        // (RFC 1035 §4.2.1); what does not fit is cut and TC set.
        let max = response.edns().map_or(512, |e| e.max_payload().max(512));
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(max);
        let info = match response.destructive_emit(&mut encoder) {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(error = %e, "encoding a DNS response failed; SERVFAIL");
                bytes.clear();
                let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
                metadata.response_code = ResponseCode::ServFail;
                let header = Header {
                    metadata,
                    counts: HeaderCounts::default(),
                };
                let mut encoder = BinEncoder::new(&mut bytes);
                header.emit(&mut encoder)?;
                ResponseInfo::from(header)
            }
        };
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(bytes);
        }
        Ok(info)
    }
}

/// Answers datagrams on `socket` until `stop` is set. The handler's future completes without
/// waiting on anything (the response is captured, not sent), so it is driven on this thread.
pub fn serve<H: RequestHandler>(
    socket: Arc<UdpSocket>,
    handler: Arc<H>,
    runtime: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let capture = Capture::default();
    while !stop.load(Ordering::Relaxed) {
        let (n, src) = match socket.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => {
                tracing::debug!(error = %e, "receiving a datagram failed");
                continue;
            }
        };
        if n < 12 || src.port() == 0 {
            continue; // not even a header, or nowhere to answer
        }
        let request = match Request::from_bytes(buf[..n].to_vec(), src, Protocol::Udp) {
            Ok(r) => r,
            Err(_) => {
                formerr(&socket, &buf[..n], src);
                continue;
            }
        };
        if request.metadata.message_type == MessageType::Response {
            continue; // never answer a response (reflection)
        }
        // Polled once with a no-op waker: it completes then (nothing in it waits); were it ever
        // to wait, the runtime drives it to the end.
        let mut answering =
            std::pin::pin!(handler.handle_request::<_, TokioTime>(&request, capture.clone()));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if answering.as_mut().poll(&mut cx).is_pending() {
            runtime.block_on(answering);
        }
        let bytes = capture.0.lock().ok().and_then(|mut s| s.take());
        if let Some(bytes) = bytes {
            if let Err(e) = socket.send_to(&bytes, src) {
                tracing::debug!(error = %e, %src, "sending a response failed");
            }
        }
    }
}

/// FORMERR for a datagram whose header parsed but whose body did not: the id and opcode
/// echoed, no sections.
fn formerr(socket: &UdpSocket, raw: &[u8], src: SocketAddr) {
    let mut out = [0u8; 12];
    out[..2].copy_from_slice(&raw[..2]);
    out[2] = 0x80 | (raw[2] & 0x78); // QR, the opcode
    out[3] = ResponseCode::FormErr.low();
    metrics::counter!("cdnmap_dns_queries_total", "rcode" => "formerr").increment(1);
    let _ = socket.send_to(&out, src);
}
