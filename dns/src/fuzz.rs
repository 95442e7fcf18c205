//! Fuzz targets for the DNS packet path: whatever a datagram holds, the front end answers it
//! the way it answers every datagram (`crate::wire`'s fast path, else hickory's), never
//! panics, and what it sends back is a response a resolver can read.
//!
//! The corpus (`src/__fuzz__/fuzz__datagram/corpus`) is queries as dig 9.18 sends them (A and
//! AAAA, ECS of both families and several prefix lengths, EDNS version 1, no EDNS, DNSSEC OK
//! with a cookie, NSID, padding, SOA, NS, IXFR, MX, TXT, CHAOS), the same without the AD flag
//! and the cookie dig sets by default (`plain-*`: what the fast path takes), three made
//! from them (ANY, AXFR over UDP, a response), and queries of the test zone's static records
//! (`static-*`: glue, a static name a rule names too, a CNAME, TXT at the apex). `cargo bolero test --engine libfuzzer` runs the targets under
//! libFuzzer where a nightly toolchain exists; in `cargo test` each runs its corpus, then
//! random inputs for a second (`cdnmap_tests::fuzz`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cdnmap_tests::fuzz::{corpus, Mutation};
use hickory_server::proto::op::{Message, MessageType};

use crate::answer::Handler;
use crate::udp::{answer_hickory, Capture};
use crate::wire::{answer_batch, tests::front};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/__fuzz__/fuzz__datagram/corpus"
);

/// Two front ends over the test map (`wire::tests::front`): one answering as the server does
/// (fast path, else hickory's), one through hickory's path alone, the oracle.
struct Paths {
    runtime: tokio::runtime::Runtime,
    both: Handler,
    hickory_only: Handler,
    capture: Capture,
    /// Inputs checked, and those the fast path answered: the mutations must reach it.
    checked: AtomicUsize,
    fast: AtomicUsize,
}

impl Paths {
    fn new() -> Paths {
        Paths {
            runtime: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime"),
            both: Handler(Arc::new(front())),
            hickory_only: Handler(Arc::new(front())),
            capture: Capture::default(),
            checked: AtomicUsize::new(0),
            fast: AtomicUsize::new(0),
        }
    }

    /// Answers `raw` as the server would and checks what comes back (module docs).
    fn check(&self, raw: &[u8]) {
        // A client inside a mapped prefix, outside every prefix, and over IPv6.
        let sources: [SocketAddr; 3] = [
            "10.0.1.9:5353".parse().expect("src"),
            "192.0.2.77:53000".parse().expect("src"),
            "[2001:db8:1::9]:5353".parse().expect("src"),
        ];
        let src = sources[raw.len() % sources.len()];
        if raw.len() < 12 {
            return; // not even a header: the socket loop drops it (`udp::serve`)
        }
        self.checked.fetch_add(1, Ordering::Relaxed);
        let handle = self.runtime.handle();
        let mut fast = Vec::new();
        answer_batch(&self.both.0, &[(raw, src)], &mut fast);
        let served = match fast.pop().filter(|f| !f.is_empty()) {
            Some(f) => {
                self.fast.fetch_add(1, Ordering::Relaxed);
                Some(f)
            }
            None => answer_hickory(&self.both, handle, &self.capture, raw, src),
        };
        let oracle = answer_hickory(&self.hickory_only, handle, &self.capture, raw, src);
        assert_eq!(served, oracle, "the two paths differ on {raw:02x?}");
        let Some(response) = served else {
            assert!(raw[2] & 0x80 != 0, "no answer to a query: {raw:02x?}");
            return;
        };
        assert!(raw[2] & 0x80 == 0, "answered a response: {raw:02x?}");
        assert!(response.len() >= 12, "a response shorter than a header");
        assert_eq!(response[..2], raw[..2], "the response's id");
        let message = Message::from_vec(&response).unwrap_or_else(|e| {
            panic!("an unreadable response ({e}) {response:02x?} to {raw:02x?}")
        });
        assert_eq!(message.metadata.message_type, MessageType::Response);
        // At most what the query allows: 512 bytes without EDNS (RFC 1035 §4.2.1), else its
        // payload size, within the front end's own limit (RFC 6891 §6.2.5).
        let limit = match Message::from_vec(raw) {
            Ok(q) => usize::from(q.max_payload()).min(1232),
            Err(_) => 512,
        };
        assert!(
            response.len() <= limit.max(512),
            "a response of {} bytes where {limit} may go, to {raw:02x?}",
            response.len()
        );
    }
}

/// Raw datagrams: the corpus, then random bytes.
#[test]
fn datagram() {
    let paths = Paths::new();
    let paths = std::panic::AssertUnwindSafe(&paths); // a failing input fails the test
    bolero::check!().for_each(|raw: &[u8]| paths.check(raw));
}

/// Mutations of the corpus's queries: bytes set, flipped, cut, put in and spliced.
#[test]
fn datagram_mutations() {
    let paths = Paths::new();
    let paths = std::panic::AssertUnwindSafe(&paths);
    let corpus = corpus(Path::new(CORPUS));
    let tokens: &[&[u8]] = &[
        &[0, 0],
        &[0xff, 0xff],
        &[0xc0, 0x0c],
        &[0, 41],
        &[0, 8],
        &[63],
        &[0x80],
    ];
    bolero::check!()
        .with_type::<Mutation>()
        .for_each(|m| paths.check(&m.apply(&corpus, tokens)));
    let (checked, fast) = (
        paths.checked.load(Ordering::Relaxed),
        paths.fast.load(Ordering::Relaxed),
    );
    // (Replaying one seed checks one input.)
    assert!(
        fast > 0 || checked < 1000,
        "none of {checked} mutations reached the fast path"
    );
}
