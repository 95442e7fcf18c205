//! A gRPC client's TLS from PEM files: the CA the server's certificate must chain to, and
//! the client's own certificate and key when the server asks for one (mutual TLS). The DNS
//! front end uses it for its link to the mapper, and the mapper for its link to etcd, so
//! both read and check their files the same way: each file is read once, when the link is
//! built, and an unreadable file or one without the PEM item it should hold is an error
//! naming the configuration key and the path.

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A PEM file named in a configuration: the key that names it, and its path.
#[derive(Debug, Clone, Copy)]
pub struct PemFile<'a> {
    pub key: &'a str,
    pub path: &'a Path,
}

/// Why a PEM file could not be used; the message names its key and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFileError(pub String);

impl std::fmt::Display for TlsFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsFileError {}

/// The bytes of `file`, checked to hold a certificate (the first item of a chain) or, with
/// `private_key`, a private key.
pub fn read_pem(file: PemFile<'_>, private_key: bool) -> Result<Vec<u8>, TlsFileError> {
    let named = || format!("{} {}", file.key, file.path.display());
    let bytes = std::fs::read(file.path).map_err(|e| TlsFileError(format!("{}: {e}", named())))?;
    let holds = if private_key {
        rustls_pki_types::PrivateKeyDer::from_pem_slice(&bytes).is_ok()
    } else {
        rustls_pki_types::CertificateDer::pem_slice_iter(&bytes)
            .next()
            .is_some_and(|c| c.is_ok())
    };
    if !holds {
        let what = if private_key {
            "private key"
        } else {
            "certificate"
        };
        return Err(TlsFileError(format!("{}: no PEM {what} in it", named())));
    }
    Ok(bytes)
}

/// The client TLS trusting `ca`, presenting `identity` (certificate, key) when given.
pub fn config(
    ca: PemFile<'_>,
    identity: Option<(PemFile<'_>, PemFile<'_>)>,
) -> Result<ClientTlsConfig, TlsFileError> {
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem(ca, false)?));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            read_pem(cert, false)?,
            read_pem(key, true)?,
        ));
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missing file, and files without the item they should hold, are errors naming the
    /// key and the path; never a panic.
    #[test]
    fn bad_files_are_errors_naming_the_key_and_the_path() {
        let dir = std::env::temp_dir().join(format!("cdnmap-client-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not PEM at all\n").expect("write");
        let missing = dir.join("missing.pem");
        let file = |key, path| PemFile { key, path };
        let err = read_pem(file("ca_file", &missing), false).expect_err("missing");
        assert!(
            err.0.starts_with("ca_file ") && err.0.contains("missing.pem"),
            "{err}"
        );
        let err = read_pem(file("ca_file", &junk), false).expect_err("no certificate");
        assert!(
            err.0.contains("ca_file") && err.0.contains("no PEM certificate"),
            "{err}"
        );
        let err = read_pem(file("key_file", &junk), true).expect_err("no key");
        assert!(
            err.0.contains("key_file") && err.0.contains("no PEM private key"),
            "{err}"
        );
        let err = config(file("ca_file", &junk), None).expect_err("no CA");
        assert!(err.0.contains("ca_file"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
