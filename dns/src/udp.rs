//! The UDP path: the fast path of `crate::wire` for the common query, else hickory's
//! `Request`, our `RequestHandler` and hickory's response encoding (with its truncation),
//! driven by one OS thread per socket that reads a datagram, answers it inline and sends the
//! answer, with blocking system calls (as gdnsd does).
//!
//! hickory's own UDP server spawns a task per datagram and hands each response through a
//! channel to a sender task, and the async socket adds an epoll round per datagram; at a hundred
//! thousand queries per second those hops cost more than the answer itself (measured with
//! dnsperf on this project's machine: 42 k/s through hickory's server, 160–200 k/s here). TCP
//! stays on hickory's server.

use std::future::Future;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::AtomicBool;
#[cfg(not(target_os = "linux"))]
use std::sync::atomic::Ordering;
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

use crate::answer::Handler;

/// The receive buffer asked for on each UDP socket.
const UDP_RECV_BUFFER: usize = 8 << 20;

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
        // Room for a burst: the kernel's default (208 KiB here) holds a millisecond or two of
        // queries at 300 k/s, and `cdnmap bench soak` lost 20 and 51 of 132 M and 162 M
        // queries to it (RcvbufErrors) while other work held the cores. The kernel caps the
        // size at net.core.rmem_max; a refusal leaves the default.
        if let Err(e) = socket.set_recv_buffer_size(UDP_RECV_BUFFER) {
            tracing::warn!(error = %e, "could not enlarge the UDP receive buffer");
        }
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

/// The largest datagram read (queries are small; a larger one is cut and fails to parse).
const MAX_DATAGRAM: usize = 2048;

/// A `ResponseHandler` that encodes the response for UDP and keeps the bytes for the loop to
/// send.
#[derive(Clone, Default)]
pub(crate) struct Capture(Arc<Mutex<Option<Vec<u8>>>>);

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

/// One datagram's answer (where datagrams come one at a time): the fast path's, else
/// hickory's ([`answer_hickory`]); nothing when there is not even a header or nowhere to answer.
#[cfg(not(target_os = "linux"))]
fn answer_datagram(
    handler: &Handler,
    runtime: &tokio::runtime::Handle,
    capture: &Capture,
    raw: &[u8],
    src: SocketAddr,
) -> Option<Vec<u8>> {
    if raw.len() < 12 || src.port() == 0 {
        return None;
    }
    let mut out = Vec::with_capacity(1);
    answer_all(handler, runtime, capture, &[(raw, src)], &mut out);
    out.pop().filter(|o| !o.is_empty())
}

/// The responses to `batch` into `responses`, one each, empty where none is sent: the fast
/// path's for the common queries, taken together (`crate::wire`), hickory's for the rest
/// ([`answer_hickory`]), then response rate limiting's say when it is on ([`limit`]).
fn answer_all(
    handler: &Handler,
    runtime: &tokio::runtime::Handle,
    capture: &Capture,
    batch: &[(&[u8], SocketAddr)],
    responses: &mut Vec<Vec<u8>>,
) {
    crate::wire::answer_batch(&handler.0, batch, responses);
    for (&(raw, src), response) in batch.iter().zip(responses.iter_mut()) {
        if response.is_empty() {
            if let Some(slow) = answer_hickory(handler, runtime, capture, raw, src) {
                *response = slow;
            }
        }
    }
    if let Some(rrl) = handler.0.rrl.as_ref() {
        limit(&handler.0, rrl, batch, responses);
    }
}

/// Applies response rate limiting to `responses`, the answers to `batch`: each is left,
/// emptied (dropped) or replaced by a slip (`crate::rrl`). One clock read for the batch.
fn limit(
    front: &crate::front::Front,
    rrl: &crate::rrl::Rrl,
    batch: &[(&[u8], SocketAddr)],
    responses: &mut [Vec<u8>],
) {
    let now = front.cookies.now();
    for (&(raw, src), response) in batch.iter().zip(responses.iter_mut()) {
        rrl.apply(
            &front.cookies,
            raw,
            src,
            response,
            now,
            front.max_udp_payload,
        );
    }
}

/// One datagram's answer through hickory's `Request` and `handler` (what the fast path,
/// `crate::wire`, does not take): the response's bytes, a bare FORMERR header when the message
/// does not parse, or nothing (a response: never answered). The handler's future completes
/// without waiting on anything (the response is captured, not sent), so it is polled once here;
/// were it ever to wait, the runtime would drive it to the end.
pub(crate) fn answer_hickory<H: RequestHandler>(
    handler: &H,
    runtime: &tokio::runtime::Handle,
    capture: &Capture,
    raw: &[u8],
    src: SocketAddr,
) -> Option<Vec<u8>> {
    if first_name_points(raw) {
        return formerr(raw);
    }
    let request = match Request::from_bytes(raw.to_vec(), src, Protocol::Udp) {
        Ok(r) => r,
        Err(_) => return formerr(raw),
    };
    if request.metadata.message_type == MessageType::Response {
        return None; // never answer a response (reflection)
    }
    let mut answering =
        std::pin::pin!(handler.handle_request::<_, TokioTime>(&request, capture.clone()));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if answering.as_mut().poll(&mut cx).is_pending() {
        runtime.block_on(answering);
    }
    capture.0.lock().ok().and_then(|mut s| s.take())
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Answers datagrams on `socket` until `stop` is set.
///
/// `coalesce` (zero: off) is the receive coalescing of [`mmsg`]: under load, the loop waits that
/// long after answering a batch, so that the next `recvmmsg` finds many datagrams waiting.
/// `tap` (dnstap on) logs each batch's queries and responses once they are sent.
pub fn serve(
    socket: Arc<UdpSocket>,
    handler: Arc<Handler>,
    runtime: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
    coalesce: Duration,
    mut tap: Option<crate::dnstap::Tap>,
) {
    #[cfg(target_os = "linux")]
    {
        mmsg::serve(&socket, &handler, &runtime, &stop, coalesce, &mut tap);
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = coalesce; // one datagram per system call here: nothing to coalesce
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let capture = Capture::default();
        while !stop.load(Ordering::Relaxed) {
            let (n, src) = match socket.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if timed_out(&e) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "receiving a datagram failed");
                    continue;
                }
            };
            let received = std::time::SystemTime::now();
            let out = answer_datagram(&*handler, &runtime, &capture, &buf[..n], src);
            if let Some(out) = &out {
                if let Err(e) = socket.send_to(out, src) {
                    tracing::debug!(error = %e, %src, "sending a response failed");
                }
            }
            if let Some(tap) = tap.as_mut() {
                let now = std::time::SystemTime::now();
                tap.udp(
                    &[(&buf[..n], src)],
                    &[out.unwrap_or_default()],
                    received,
                    now,
                );
            }
        }
    }
}

/// Linux: up to [`BATCH`] datagrams per `recvmmsg`, their answers in one `sendmmsg`, as gdnsd
/// does: under load one system call each way carries many queries.
///
/// **Receive coalescing.** A loop faster than its clients finds one datagram per `recvmmsg`,
/// and pays for each query a system call each way, a sleep and a wakeup, and the wakeup of the
/// client's socket for each answer. So when queries arrive faster than one per `coalesce` (the
/// loop waited less than that for a batch's first datagram, counted across the receive
/// timeouts that only let it look at `stop`), the loop waits `coalesce` after sending a batch's
/// answers: the next call then finds the queries of that interval waiting, and their answers
/// leave in one `sendmmsg`. The cost is at most `coalesce` of added latency under load (a
/// network interface's interrupt coalescing adds as much); below one query per `coalesce` the
/// loop never waits.
#[cfg(target_os = "linux")]
mod mmsg {
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use socket2::{SockAddr, SockAddrStorage};

    use super::{timed_out, Capture, Handler, MAX_DATAGRAM};

    /// Datagrams per system call at most.
    pub const BATCH: usize = 32;

    pub fn serve(
        socket: &UdpSocket,
        handler: &Handler,
        runtime: &tokio::runtime::Handle,
        stop: &AtomicBool,
        coalesce: Duration,
        tap: &mut Option<crate::dnstap::Tap>,
    ) {
        let fd = socket.as_raw_fd();
        let capture = Capture::default();
        let mut bufs = vec![0u8; BATCH * MAX_DATAGRAM];
        // SAFETY: all-zero is a valid sockaddr_storage, iovec and mmsghdr (null pointers and
        // zero lengths); every pointer is set below before a system call reads it.
        let mut names: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; BATCH];
        let mut iovs: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; BATCH];
        let mut hdrs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
        // The responses, reused batch after batch (the fast path writes into them), and for
        // each the datagram (index into `names`) it answers.
        let mut responses: Vec<Vec<u8>> = Vec::with_capacity(BATCH);
        let mut to: Vec<usize> = Vec::with_capacity(BATCH);
        let mut out = Outbox::default();
        // How many datagrams each receive takes (their ratio: the batches coalescing makes).
        let receives = metrics::counter!("cdnmap_dns_udp_receives_total");
        let datagrams = metrics::counter!("cdnmap_dns_udp_datagrams_total");
        let waits = metrics::counter!("cdnmap_dns_udp_coalescing_waits_total");
        let batch_seconds = metrics::histogram!("cdnmap_dns_udp_batch_duration_seconds");
        if !coalesce.is_zero() {
            // The wait is `coalesce`, not that plus the default 50 µs of timer slack a sleep
            // may be stretched by (this thread's only sleep is that wait).
            // SAFETY: PR_SET_TIMERSLACK takes one integer and changes only this thread.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong) };
        }
        // Since when the loop has been waiting for a datagram: across the receive timeouts
        // (which only let it look at `stop`), so that a query that comes just after one does
        // not look like load.
        let mut waiting_since = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            arm(&mut bufs, &mut names, &mut iovs, &mut hdrs);
            // SAFETY: `hdrs` holds BATCH headers, each pointing at its own buffer of
            // MAX_DATAGRAM bytes and its own sockaddr_storage, all alive for the call.
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    hdrs.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if !timed_out(&e) && e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::debug!(error = %e, "recvmmsg failed");
                }
                continue;
            }
            // Under load when the first datagram was already there or came within `coalesce`.
            let received_at = Instant::now();
            let under_load = received_at.duration_since(waiting_since) < coalesce;
            receives.increment(1);
            datagrams.increment(n as u64);
            let batch = received(&bufs, &names, &hdrs, n as usize, &mut to);
            super::answer_all(handler, runtime, &capture, &batch, &mut responses);
            // Each response goes to the address its query came from, as the kernel wrote it.
            let namelen = |i: usize| hdrs[i].msg_hdr.msg_namelen;
            let sent: Vec<(&[u8], &libc::sockaddr_storage, libc::socklen_t)> = responses
                .iter()
                .zip(&to)
                .filter(|(r, _)| !r.is_empty())
                .map(|(r, &i)| (r.as_slice(), &names[i], namelen(i)))
                .collect();
            out.send_all(fd, &sent);
            // One observation per batch, from the two clock reads the loop makes anyway.
            let sent_at = Instant::now();
            batch_seconds.record(sent_at.duration_since(received_at).as_secs_f64());
            // dnstap: the batch's queries and responses, after they left (one branch when off).
            if let Some(tap) = tap.as_mut() {
                let wall = std::time::SystemTime::now();
                let at = |then| crate::dnstap::wall_at(wall, sent_at, then);
                tap.udp(&batch, &responses, at(received_at), at(sent_at));
            }
            if under_load && (n as usize) < BATCH {
                waits.increment(1);
                std::thread::sleep(coalesce);
                waiting_since = Instant::now();
            } else {
                waiting_since = sent_at;
            }
        }
    }

    /// Points each of the BATCH headers at its own buffer of MAX_DATAGRAM bytes in `bufs` and
    /// its own address in `names`, for the next `recvmmsg`.
    fn arm(
        bufs: &mut [u8],
        names: &mut [libc::sockaddr_storage],
        iovs: &mut [libc::iovec],
        hdrs: &mut [libc::mmsghdr],
    ) {
        for i in 0..BATCH {
            iovs[i] = libc::iovec {
                iov_base: bufs[i * MAX_DATAGRAM..].as_mut_ptr().cast(),
                iov_len: MAX_DATAGRAM,
            };
            hdrs[i].msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            hdrs[i].msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdrs[i].msg_hdr.msg_iov = &mut iovs[i];
            hdrs[i].msg_hdr.msg_iovlen = 1;
            hdrs[i].msg_hdr.msg_control = std::ptr::null_mut();
            hdrs[i].msg_hdr.msg_controllen = 0;
            hdrs[i].msg_hdr.msg_flags = 0;
            hdrs[i].msg_len = 0;
        }
    }

    /// The `n` datagrams one `recvmmsg` took, each with its source, leaving out those with
    /// no header or nowhere to answer; `to` gets the index (in `names`) of each one kept.
    fn received<'b>(
        bufs: &'b [u8],
        names: &[libc::sockaddr_storage],
        hdrs: &[libc::mmsghdr],
        n: usize,
        to: &mut Vec<usize>,
    ) -> Vec<(&'b [u8], std::net::SocketAddr)> {
        let mut batch: Vec<(&[u8], std::net::SocketAddr)> = Vec::with_capacity(n);
        to.clear();
        for i in 0..n {
            let mut storage = SockAddrStorage::zeroed();
            // SAFETY: SockAddrStorage is a sockaddr_storage underneath, and the kernel wrote
            // a socket address of msg_namelen bytes into names[i].
            let addr = unsafe {
                *storage.view_as::<libc::sockaddr_storage>() = names[i];
                SockAddr::new(storage, hdrs[i].msg_hdr.msg_namelen)
            };
            let Some(src) = addr.as_socket() else {
                continue;
            };
            let len = (hdrs[i].msg_len as usize).min(MAX_DATAGRAM);
            let raw = &bufs[i * MAX_DATAGRAM..i * MAX_DATAGRAM + len];
            if raw.len() >= 12 && src.port() != 0 {
                batch.push((raw, src)); // else not even a header, or nowhere to answer
                to.push(i);
            }
        }
        batch
    }

    /// The headers of one `sendmmsg` batch, kept from batch to batch (their pointers are set
    /// anew for each).
    #[derive(Default)]
    struct Outbox {
        iovs: Vec<libc::iovec>,
        hdrs: Vec<libc::mmsghdr>,
    }

    impl Outbox {
        /// Sends every response (bytes, address, address length), `sendmmsg` after
        /// `sendmmsg` until all went (or one fails: a UDP answer that cannot be sent is
        /// dropped, as a lost datagram would be).
        fn send_all(
            &mut self,
            fd: libc::c_int,
            answers: &[(&[u8], &libc::sockaddr_storage, libc::socklen_t)],
        ) {
            self.iovs.clear();
            self.iovs
                .extend(answers.iter().map(|(bytes, _, _)| libc::iovec {
                    iov_base: bytes.as_ptr() as *mut libc::c_void,
                    iov_len: bytes.len(),
                }));
            self.hdrs.clear();
            for ((_, to, len), iov) in answers.iter().zip(self.iovs.iter_mut()) {
                // SAFETY: all-zero is a valid mmsghdr; the fields read are set here.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = (*to as *const libc::sockaddr_storage).cast_mut().cast();
                h.msg_hdr.msg_namelen = *len;
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                self.hdrs.push(h);
            }
            let hdrs = &mut self.hdrs;
            let mut sent = 0;
            while sent < hdrs.len() {
                // SAFETY: hdrs[sent..] point at the answers' bytes and addresses, alive for
                // the call (`answers` is borrowed across it).
                let n = unsafe {
                    libc::sendmmsg(
                        fd,
                        hdrs[sent..].as_mut_ptr(),
                        (hdrs.len() - sent) as libc::c_uint,
                        0,
                    )
                };
                if n <= 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    tracing::debug!(error = %e, "sendmmsg failed; answers dropped");
                    sent += 1; // skip the one that failed, send the rest
                    continue;
                }
                sent += n as usize;
            }
            // The pointers into `answers` are not kept past the call.
            self.iovs.clear();
            self.hdrs.clear();
        }
    }
}

/// Whether the first question's name (at offset 12) holds a compression pointer. Nothing
/// comes before it but the header, so such a pointer points into the header (or at itself):
/// hickory reads it, and echoes the question as sent into a response whose header differs,
/// where the pointer then names other bytes and the response is unreadable (found by
/// `fuzz::datagram_mutations`). Such a query is malformed: FORMERR.
fn first_name_points(raw: &[u8]) -> bool {
    if raw.len() < 12 || u16::from_be_bytes([raw[4], raw[5]]) == 0 {
        return false;
    }
    let mut at = 12;
    while let Some(&len) = raw.get(at) {
        match len {
            0 => return false,
            l if l & 0xc0 != 0 => return true, // a pointer, or an extended label type
            l => at += 1 + usize::from(l),
        }
    }
    false
}

/// FORMERR for a datagram whose header parsed but whose body did not: the id and opcode
/// echoed, no sections. Nothing for a datagram whose QR bit says it is a response: two
/// servers answering each other's malformed responses would bounce datagrams forever, and a
/// forged source would make this one a reflector (found by `fuzz::datagram`).
fn formerr(raw: &[u8]) -> Option<Vec<u8>> {
    if raw[2] & 0x80 != 0 {
        return None;
    }
    let mut out = vec![0u8; 12];
    out[..2].copy_from_slice(&raw[..2]);
    out[2] = 0x80 | (raw[2] & 0x78); // QR, the opcode
    out[3] = ResponseCode::FormErr.low();
    crate::front::response_counter("FORMERR", "none").increment(1);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::first_name_points;

    /// The query `fuzz::datagram_mutations` found: its name ends in a pointer to offset 2 (the
    /// header's flags), which a response's other flags turn into an unreadable name.
    #[test]
    fn a_pointer_in_the_first_name_is_malformed() {
        let found = [
            0xf2, 0xa9, 0x01, 0x20, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x77,
            0x77, 0x77, 0x07, 0x65, 0x78, 0x61, 0x6d, 0x8b, 0x7f, 0xab, 0xc0, 0x02, 0xae, 0x68,
            0xb6, 0x70, 0x6c, 0x65, 0x80,
        ];
        assert!(first_name_points(&found));
        let plain = [
            0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, b'w',
            b'w', b'w', 0x07, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 0x00, 0x00, 0x01, 0x00,
            0x01,
        ];
        assert!(!first_name_points(&plain));
        // No question: nothing to look at; a name cut short: hickory's to refuse.
        let mut none = plain;
        none[5] = 0;
        assert!(!first_name_points(&none));
        assert!(!first_name_points(&plain[..18]));
    }
}
