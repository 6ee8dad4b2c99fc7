//! Certificates made for a test: a CA, a server certificate for 127.0.0.1 and client
//! certificates by common name, as PEM files in a temp dir (rcgen).

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA with `ca.pem`, and `server.pem`/`server-key.pem` for 127.0.0.1 and localhost.
pub struct Pki {
    dir: tempfile::TempDir,
    ca: Issuer<'static, KeyPair>,
}

impl Pki {
    /// A new CA and its server certificate.
    ///
    /// # Panics
    /// When a key or certificate cannot be made or written.
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("CA params: {e}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, "podstream test CA");
        let cert = params
            .self_signed(&key)
            .unwrap_or_else(|e| panic!("CA certificate: {e}"));
        let pki = Pki {
            dir,
            ca: Issuer::new(params, key),
        };
        pki.write("ca.pem", &cert.pem());
        pki.leaf(
            "server",
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        pki
    }

    /// Writes `<name>.pem` and `<name>-key.pem`: a client certificate with common name
    /// `name` (PostgreSQL's `cert` authentication takes the user from it).
    pub fn client(&self, name: &str) {
        self.leaf(
            name,
            vec![name.to_owned()],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
    }

    fn leaf(&self, name: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose) {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("key: {e}"));
        let mut params = CertificateParams::new(sans).unwrap_or_else(|e| panic!("params: {e}"));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let cert = params
            .signed_by(&key, &self.ca)
            .unwrap_or_else(|e| panic!("certificate {name}: {e}"));
        self.write(&format!("{name}.pem"), &cert.pem());
        self.write(&format!("{name}-key.pem"), &key.serialize_pem());
    }

    /// Writes `<name>-key.pem` and `<name>-pub.pem`: a bare key pair (a token signer's), the
    /// private key in PKCS#8 and the public one as SubjectPublicKeyInfo.
    ///
    /// # Panics
    /// When the key cannot be made or written.
    pub fn key_pair(&self, name: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("key {name}: {e}"));
        (
            self.write(&format!("{name}-key.pem"), &key.serialize_pem()),
            self.write(&format!("{name}-pub.pem"), &key.public_key_pem()),
        )
    }

    /// A file in the PKI's dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` to `name` in the PKI's dir; its path.
    ///
    /// # Panics
    /// When it cannot be written.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {name}: {e}"));
        path
    }
}

impl Default for Pki {
    fn default() -> Pki {
        Pki::new()
    }
}
