//! A gRPC client's TLS from PEM files: the CA the server's certificate must chain to, and
//! the client's own certificate and key when the server asks for one (mutual TLS). The DNS
//! front end uses it for its link to the mapper, and the mapper for its links to etcd and to
//! the leading replica, so all read and check their files the same way: each file is read once, when the link is
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

/// What a PEM file must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// Certificates, each one a CA a connection may trust (a trust anchor).
    Anchors,
    /// A certificate chain (the leaf first).
    Chain,
    /// A private key.
    Key,
}

/// The bytes of `file`, checked to hold what `holds` says: at least one item, and every
/// certificate well-formed (tonic would skip a CA it cannot parse, and every connection
/// would then fail to verify for want of it).
pub fn read_pem(file: PemFile<'_>, holds: Holds) -> Result<Vec<u8>, TlsFileError> {
    let named = || format!("{} {}", file.key, file.path.display());
    let bytes = std::fs::read(file.path).map_err(|e| TlsFileError(format!("{}: {e}", named())))?;
    let what = match holds {
        Holds::Key => {
            return match rustls_pki_types::PrivateKeyDer::from_pem_slice(&bytes) {
                Ok(_) => Ok(bytes),
                Err(_) => Err(TlsFileError(format!(
                    "{}: no PEM private key in it",
                    named()
                ))),
            };
        }
        Holds::Anchors | Holds::Chain => "certificate",
    };
    let mut count = 0;
    for (i, cert) in rustls_pki_types::CertificateDer::pem_slice_iter(&bytes).enumerate() {
        let cert =
            cert.map_err(|e| TlsFileError(format!("{}: PEM item {}: {e}", named(), i + 1)))?;
        if holds == Holds::Anchors {
            webpki::anchor_from_trusted_cert(&cert).map_err(|e| {
                TlsFileError(format!(
                    "{}: certificate {} is not one a CA can be trusted by: {e}",
                    named(),
                    i + 1
                ))
            })?;
        }
        count += 1;
    }
    if count == 0 {
        return Err(TlsFileError(format!("{}: no PEM {what} in it", named())));
    }
    Ok(bytes)
}

/// The client TLS trusting `ca`, presenting `cert` and `key` when given (both or neither: one
/// alone is an error naming the other). The whole configuration is built once here (every
/// certificate of each chain and the key parsed, as a connection would), so a file that
/// fails is an error now, not at the first connection.
pub fn config(
    ca: PemFile<'_>,
    cert: Option<PemFile<'_>>,
    key: Option<PemFile<'_>>,
) -> Result<ClientTlsConfig, TlsFileError> {
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem(ca, Holds::Anchors)?));
    let mut keys = ca.key.to_string();
    match (cert, key) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(
                read_pem(cert, Holds::Chain)?,
                read_pem(key, Holds::Key)?,
            ));
            keys = format!("{}, {} and {}", ca.key, cert.key, key.key);
        }
        (Some(cert), None) => {
            return Err(TlsFileError(format!(
                "{} is given without its private key",
                cert.key
            )))
        }
        (None, Some(key)) => {
            return Err(TlsFileError(format!(
                "{} is given without its certificate",
                key.key
            )))
        }
        (None, None) => {}
    }
    tonic::transport::Endpoint::from_static("https://localhost")
        .tls_config(tls.clone())
        .map_err(|e| {
            let source = std::error::Error::source(&e).map_or(String::new(), |s| format!(": {s}"));
            TlsFileError(format!("{keys}: {e}{source}"))
        })?;
    Ok(tls)
}

/// [`config`] for a configuration's three keys (the CA, the certificate, the key) and the
/// paths it gives them: `None` when it gives no CA (plaintext).
pub fn from_config(
    keys: [&str; 3],
    paths: [Option<&Path>; 3],
) -> Result<Option<ClientTlsConfig>, TlsFileError> {
    let [ca, cert, key] = [0, 1, 2].map(|i| paths[i].map(|path| PemFile { key: keys[i], path }));
    ca.map(|ca| config(ca, cert, key)).transpose()
}

/// Whether `url` names a loopback address or `localhost` (where plaintext is no one else's
/// to read).
pub fn is_loopback(url: &str) -> bool {
    let Ok(uri) = url.parse::<tonic::codegen::http::Uri>() else {
        return false;
    };
    match uri.host() {
        Some(h) if h.eq_ignore_ascii_case("localhost") => true,
        Some(h) => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.to_canonical().is_loopback()),
        None => false,
    }
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
        let err = read_pem(file("ca_file", &missing), Holds::Anchors).expect_err("missing");
        assert!(
            err.0.starts_with("ca_file ") && err.0.contains("missing.pem"),
            "{err}"
        );
        let err = read_pem(file("ca_file", &junk), Holds::Chain).expect_err("no certificate");
        assert!(
            err.0.contains("ca_file") && err.0.contains("no PEM certificate"),
            "{err}"
        );
        let err = read_pem(file("key_file", &junk), Holds::Key).expect_err("no key");
        assert!(
            err.0.contains("key_file") && err.0.contains("no PEM private key"),
            "{err}"
        );
        let err = config(file("ca_file", &junk), None, None).expect_err("no CA");
        assert!(err.0.contains("ca_file"), "{err}");
        // PEM of a certificate that is no certificate: tonic would skip it as a CA.
        let bad = dir.join("bad.pem");
        std::fs::write(
            &bad,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        let err = config(file("ca_file", &bad), None, None).expect_err("a bad certificate");
        assert!(
            err.0.starts_with("ca_file ") && err.0.contains("certificate 1 is not one a CA"),
            "{err}"
        );
        // A real CA and a client certificate: the whole configuration builds; the certificate
        // without its key, or the key without its certificate, does not.
        let ca_key = rcgen::KeyPair::generate().expect("a key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = params.self_signed(&ca_key).expect("a CA");
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).expect("write");
        let leaf_key = rcgen::KeyPair::generate().expect("a key");
        let leaf = rcgen::CertificateParams::new(vec!["client.example".to_string()])
            .expect("params")
            .self_signed(&leaf_key)
            .expect("a certificate");
        let (cert, key) = (dir.join("client.pem"), dir.join("client.key"));
        std::fs::write(&cert, leaf.pem()).expect("write");
        std::fs::write(&key, leaf_key.serialize_pem()).expect("write");
        config(
            file("ca_file", &ca),
            Some(file("cert_file", &cert)),
            Some(file("key_file", &key)),
        )
        .expect("a CA, a certificate and its key");
        config(file("ca_file", &ca), None, None).expect("a CA alone");
        let err = config(file("ca_file", &ca), Some(file("cert_file", &cert)), None)
            .expect_err("a certificate without its key");
        assert_eq!(err.0, "cert_file is given without its private key");
        let err = config(file("ca_file", &ca), None, Some(file("key_file", &key)))
            .expect_err("a key without its certificate");
        assert_eq!(err.0, "key_file is given without its certificate");
        // A configuration's keys and paths: none without a CA; the keys named as given.
        let keys = ["ca_file", "cert_file", "key_file"];
        let none = from_config(keys, [None, Some(cert.as_path()), None]).expect("no CA");
        assert!(none.is_none());
        from_config(keys, [Some(&ca), Some(&cert), Some(&key)])
            .expect("all three")
            .expect("TLS");
        let err = from_config(keys, [Some(&ca), Some(&cert), None]).expect_err("no key");
        assert_eq!(err.0, "cert_file is given without its private key");
        // A key file with no key in it.
        let err = config(
            file("ca_file", &ca),
            Some(file("cert_file", &cert)),
            Some(file("key_file", &junk)),
        )
        .expect_err("no key");
        assert!(err.0.contains("key_file"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn loopback_urls_are_told_apart() {
        for url in [
            "http://127.0.0.1:2379",
            "http://127.0.0.2:1",
            "http://localhost:2379",
            "http://LOCALHOST",
            "http://[::1]:2379",
            "http://[::1]",
            "http://[::ffff:127.0.0.1]:2379",
        ] {
            assert!(is_loopback(url), "{url}");
        }
        for url in [
            "http://10.0.0.1:2379",
            "http://etcd.example:2379",
            "http://[2001:db8::1]:2379",
            "not a url at all",
            "http://localhost.example:1",
        ] {
            assert!(!is_loopback(url), "{url}");
        }
    }
}
