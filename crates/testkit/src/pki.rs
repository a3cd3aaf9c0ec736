//! A certificate authority made for one test: server and client
//! certificates it signs, written as PEM files, for TLS and mTLS between
//! real processes.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A test CA and the directory its files go to.
pub struct TestPki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub ca_pem: String,
}

/// A certificate and its key, written as PEM files.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// The certificate chain's file (the certificate, then the CA's).
    pub cert: PathBuf,
    /// The private key's file.
    pub key: PathBuf,
}

impl TestPki {
    /// A new CA named `name`, its files under a fresh temporary directory.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "agentmesh-pki-{name}-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = distinguished(&format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let ca_pem = params.self_signed(&key)?.pem();
        std::fs::write(dir.join("ca.pem"), &ca_pem)?;
        Ok(Self { dir, issuer: Issuer::new(params, key), ca_pem })
    }

    /// The CA certificate's file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A certificate for `localhost` and `127.0.0.1`, good for a server and
    /// as a client, written as `<file>.pem` and `<file>.key`.
    pub fn issue(&self, file: &str) -> anyhow::Result<IssuedCert> {
        let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        params.distinguished_name = distinguished(file);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let issued =
            IssuedCert { cert: self.dir.join(format!("{file}.pem")), key: self.dir.join(format!("{file}.key")) };
        std::fs::write(&issued.cert, format!("{}{}", cert.pem(), self.ca_pem))?;
        std::fs::write(&issued.key, key.serialize_pem())?;
        Ok(issued)
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn distinguished(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}
