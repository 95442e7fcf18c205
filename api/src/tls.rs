//! TLS on the mapper's listeners (rustls): the certificate and key files of the config, an
//! optional CA of front ends (mutual TLS), and reloading them without dropping a connection.
//!
//! A [`ServerTls`] holds the rustls configuration of each listener behind an `ArcSwap`: a
//! handshake takes the one current when it starts, so a reload (SIGHUP, or a file's change
//! seen by [`watch`]) replaces what new connections get and leaves open connections alone.
//! A reload that fails (a half-written key, a certificate that does not match it) keeps the
//! configuration in use and says why in the log.
//!
//! **Identity.** With `client_ca_file`, a client may present a certificate; rustls verifies it
//! against that CA during the handshake (a certificate from another CA fails the handshake).
//! A verified certificate's first DNS name (subjectAltName) is the client's identity
//! ([`identity_of`]): the front end's name in the demand record and the key of its budget.
//! Clients without a certificate still connect (the dashboard's browser, an operator's
//! grpcurl with the Admin token); the services that need an identity refuse them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS could not be set up: which file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key} {}: {problem}", path.display())]
    File {
        key: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error("tls: {0}")]
    Rustls(String),
}

/// The files of `[tls]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA whose certificates identify front ends (mutual TLS); `None`: no client
    /// certificates are asked for.
    pub client_ca_file: Option<PathBuf>,
}

/// Which listener a configuration is for (they differ in the protocols offered by ALPN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// HTTP/2 only.
    Grpc,
    /// HTTP/2 and HTTP/1.1 (browsers, curl, Prometheus).
    Http,
}

/// The certificates of `path` (PEM), at least one.
pub fn read_certs(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |problem: String| TlsError::File {
        key,
        path: path.to_path_buf(),
        problem,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The private key of `path` (PEM: PKCS#8, PKCS#1 or SEC1).
pub fn read_key(key: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        key,
        path: path.to_path_buf(),
        problem: match e {
            rustls_pki_types::pem::Error::NoItemsFound => "no PEM private key in it".into(),
            e => e.to_string(),
        },
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls server configuration of `files` for `listener`.
fn server_config(files: &TlsFiles, listener: Listener) -> Result<ServerConfig, TlsError> {
    let certs = read_certs("tls.cert_file", &files.cert_file)?;
    let key = read_key("tls.key_file", &files.key_file)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = match &files.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs("tls.client_ca_file", ca)? {
                roots.add(cert).map_err(|e| TlsError::File {
                    key: "tls.client_ca_file",
                    path: ca.clone(),
                    problem: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                // Clients without a certificate connect; the services needing an identity
                // refuse them (module docs).
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::File {
            key: "tls.key_file",
            path: files.key_file.clone(),
            problem: format!("does not go with tls.cert_file: {e}"),
        })?;
    config.alpn_protocols = match listener {
        Listener::Grpc => vec![b"h2".to_vec()],
        Listener::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    };
    Ok(config)
}

/// What a file looked like when last read: its modification time and length.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The TLS configurations of the mapper's listeners, reloadable.
pub struct ServerTls {
    files: TlsFiles,
    grpc: ArcSwap<ServerConfig>,
    http: ArcSwap<ServerConfig>,
    /// The files' stamps when last loaded (what [`watch`] compares with).
    stamps: Mutex<Vec<Stamp>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads `files`; an error names the file and what is wrong with it.
    pub fn load(files: TlsFiles) -> Result<Arc<ServerTls>, TlsError> {
        let stamps = Self::stamps_of(&files);
        let grpc = server_config(&files, Listener::Grpc)?;
        let http = server_config(&files, Listener::Http)?;
        Ok(Arc::new(ServerTls {
            files,
            grpc: ArcSwap::from_pointee(grpc),
            http: ArcSwap::from_pointee(http),
            stamps: Mutex::new(stamps),
        }))
    }

    fn stamps_of(files: &TlsFiles) -> Vec<Stamp> {
        [
            Some(&files.cert_file),
            Some(&files.key_file),
            files.client_ca_file.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|p| stamp(p))
        .collect()
    }

    /// Whether client certificates are verified (mutual TLS).
    pub fn mutual(&self) -> bool {
        self.files.client_ca_file.is_some()
    }

    /// Reads the files again and, if they make a configuration, puts it in use for the
    /// handshakes from now on (open connections keep theirs). On an error nothing changes.
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamps = Self::stamps_of(&self.files);
        let grpc = server_config(&self.files, Listener::Grpc)?;
        let http = server_config(&self.files, Listener::Http)?;
        self.grpc.store(Arc::new(grpc));
        self.http.store(Arc::new(http));
        if let Ok(mut s) = self.stamps.lock() {
            *s = stamps;
        }
        metrics::counter!("cdnmap_tls_reloads_total").increment(1);
        Ok(())
    }

    /// Whether a file changed since it was last loaded.
    fn changed(&self) -> bool {
        let now = Self::stamps_of(&self.files);
        self.stamps.lock().is_ok_and(|s| *s != now)
    }

    /// The acceptor of a handshake starting now on `listener`.
    pub fn acceptor(&self, listener: Listener) -> tokio_rustls::TlsAcceptor {
        let config = match listener {
            Listener::Grpc => self.grpc.load_full(),
            Listener::Http => self.http.load_full(),
        };
        tokio_rustls::TlsAcceptor::from(config)
    }
}

/// How often [`watch`] looks at the files' modification times.
pub const RELOAD_CHECK: Duration = Duration::from_secs(2);

/// Reloads `tls` on SIGHUP (each change of `hangups`, the SIGHUPs counted) and when one of
/// its files changes, until `stop` says so.
pub async fn watch(
    tls: Arc<ServerTls>,
    mut hangups: tokio::sync::watch::Receiver<u64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut hup_open = true;
    loop {
        let why = tokio::select! {
            _ = stop.wait_for(|&s| s) => return,
            r = hangups.changed(), if hup_open => {
                if r.is_err() {
                    // No SIGHUP handler (the process's caller said so): files only.
                    hup_open = false;
                    continue;
                }
                "SIGHUP"
            }
            () = tokio::time::sleep(RELOAD_CHECK) => {
                if !tls.changed() {
                    continue;
                }
                "a file changed"
            }
        };
        match tls.reload() {
            Ok(()) => tracing::info!(
                why,
                "{}TLS certificate and key reloaded; new connections use them",
                if why == "SIGHUP" { "SIGHUP: " } else { "" }
            ),
            Err(e) => {
                metrics::counter!("cdnmap_tls_reload_failures_total").increment(1);
                tracing::warn!(why, error = %e, "TLS reload failed; the files in use stay")
            }
        }
    }
}

/// The identity of a client that presented `certs` (verified by the handshake): the first DNS
/// name of its certificate's subjectAltName.
pub fn identity_of(certs: &[CertificateDer<'_>]) -> Option<Arc<str>> {
    let cert = webpki::EndEntityCert::try_from(certs.first()?).ok()?;
    cert.valid_dns_names().next().map(Arc::from)
}
