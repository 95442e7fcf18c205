//! The bench's own WatchMap client, behind a TCP relay on loopback that counts the bytes coming back: the whole map's and each delta's size on the wire.

use super::*;

/// One WatchMap message as the bench's client saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpdateRec {
    pub(crate) at: Instant,
    pub(crate) version: u64,
    pub(crate) full: bool,
    pub(crate) more: bool,
    pub(crate) units: usize,
    pub(crate) removed: usize,
    /// Bytes from the mapper on the wire since the message before (HTTP/2 framing included).
    pub(crate) wire_bytes: u64,
}

/// What the client shares with the rest of the bench.
pub(crate) struct Watched {
    pub(crate) updates: Mutex<Vec<UpdateRec>>,
    pub(crate) map: Mutex<Option<Arc<ServingMap>>>,
    /// The version of `map`, announced as each is applied (the load reports follow it).
    pub(crate) version: tokio::sync::watch::Sender<u64>,
    pub(crate) wire: AtomicU64,
    pub(crate) error: Mutex<Option<String>>,
}

impl Watched {
    pub(crate) fn new() -> Self {
        Watched {
            updates: Mutex::default(),
            map: Mutex::default(),
            version: tokio::sync::watch::channel(0).0,
            wire: AtomicU64::new(0),
            error: Mutex::default(),
        }
    }
}

/// A TCP relay on loopback to `upstream` that counts the bytes coming back; returns its
/// address. Each connection is two threads that end with it.
pub(crate) fn relay(upstream: SocketAddr, watched: Arc<Watched>) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("bench-relay".into())
        .spawn(move || {
            for down in listener.incoming().take(MAX_RELAY_CONNECTIONS).flatten() {
                let Ok(up) = TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = up.set_nodelay(true);
                let _ = down.set_nodelay(true);
                let (Ok(up2), Ok(down2)) = (up.try_clone(), down.try_clone()) else {
                    continue;
                };
                let _ = std::thread::Builder::new().spawn(move || copy(down, up, None));
                let w = Arc::clone(&watched);
                let _ = std::thread::Builder::new().spawn(move || copy(up2, down2, Some(&w.wire)));
            }
        })?;
    Ok(addr)
}

pub(crate) fn copy(mut from: TcpStream, mut to: TcpStream, count: Option<&AtomicU64>) {
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(c) = count {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Follows the map from version 0 through `relay` (applied as a front end applies it, with
/// the front end's own code), noting every message, until the stream ends or
/// `MAX_UPDATES` messages.
pub(crate) async fn watch_map(relay: SocketAddr, watched: Arc<Watched>) {
    if let Err(e) = follow(relay, &watched).await {
        *lock(&watched.error) = Some(format!("{e:#}"));
    }
}

pub(crate) async fn follow(relay: SocketAddr, watched: &Arc<Watched>) -> Result<()> {
    let mut client = pb::mapping_client::MappingClient::connect(format!("http://{relay}"))
        .await?
        .max_decoding_message_size(1 << 30);
    let mut stream = client
        .watch_map(pb::WatchMapRequest {
            // As `cdnmap dns` asks: deltas of the changed sections only.
            changed_sections_only: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut follower = Follower::default();
    let mut wire_before = 0;
    for _ in 0..MAX_UPDATES {
        let Some(update) = stream.message().await? else {
            return Ok(());
        };
        let wire = watched.wire.load(Ordering::Relaxed);
        let rec = UpdateRec {
            at: Instant::now(),
            version: update.version,
            full: update.full,
            more: update.more,
            units: cdnmap_serve::watch::unit_count(&update),
            removed: update.removed_units.len(),
            wire_bytes: wire - wire_before,
        };
        wire_before = wire;
        lock(&watched.updates).push(rec);
        let (f, applied) = tokio::task::spawn_blocking(move || {
            let applied = follower.apply(update);
            (follower, applied)
        })
        .await?;
        follower = f;
        if applied.map_err(|e| anyhow::anyhow!("{e}"))? == Applied::New {
            *lock(&watched.map) = follower.held().map(|h| Arc::clone(&h.map));
            watched.version.send_replace(follower.identity().1);
        }
    }
    Ok(())
}
