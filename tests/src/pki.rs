//! A small PKI for the TLS tests, made with rcgen: certificate authorities and the leaf
//! certificates they sign, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority whose key stays in memory; its certificate is written to `cert`.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub cert: PathBuf,
}

/// A leaf certificate's files.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: String,
}

impl Ca {
    /// A new CA named `name`, its certificate written to `dir/<name>-ca.crt`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a CA certificate");
        let cert = dir.join(format!("{name}-ca.crt"));
        std::fs::write(&cert, issuer.pem()).expect("write the CA");
        Ca { issuer, cert }
    }

    /// A leaf for `names` (DNS names or IP addresses; the first DNS name is a client's
    /// identity), for a server (`server`) or a client, written to `dir/<file>.crt|.key`.
    pub fn leaf(&self, dir: &Path, file: &str, names: &[&str], server: bool) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("a leaf");
        let leaf = Leaf {
            cert: dir.join(format!("{file}.crt")),
            key: dir.join(format!("{file}.key")),
            cert_pem: cert.pem(),
        };
        std::fs::write(&leaf.key, key.serialize_pem()).expect("write the key");
        std::fs::write(&leaf.cert, &leaf.cert_pem).expect("write the certificate");
        leaf
    }
}
