//! TLS on a service's port: its certificate and key (gRPC and HTTP on one
//! port, ALPN `h2` and `http/1.1`), optionally a CA whose client
//! certificates are required (mTLS), all re-read when the files change so
//! that a renewed certificate is served without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// The files of a port's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the service's own certificate first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA certificates whose client certificates are required (mTLS);
    /// without it clients present none.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> Vec<PathBuf> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()].into_iter().flatten().cloned().collect()
    }

    /// A server configuration from the files as they are now.
    pub fn load(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = read_certs(&self.cert, "tls_cert_file")?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .with_context(|| format!("tls_key_file {} holds no PEM private key", self.key.display()))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match &self.client_ca {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certs(path, "tls_client_ca_file")? {
                    roots.add(cert).with_context(|| format!("tls_client_ca_file {}", path.display()))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .with_context(|| format!("tls_client_ca_file {}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).with_context(|| {
            format!("tls_cert_file {} and tls_key_file {} do not match", self.cert.display(), self.key.display())
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Every certificate of a PEM file, at least one.
fn read_certs(path: &Path, setting: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("{setting}: cannot read {}", path.display()))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{setting} {} is not PEM", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{setting} {} holds no certificate", path.display());
    Ok(certs)
}

/// A port's TLS configuration, replaced when its files change.
#[derive(Clone)]
pub struct ServerTls {
    current: crate::reload::Reloaded<Arc<rustls::ServerConfig>>,
}

impl ServerTls {
    /// Loads `files` (an error names the setting at fault), then loads them
    /// again whenever they change ([`crate::reload`]), for as long as this
    /// value or a clone lives.
    pub fn watch(files: TlsFiles, name: &'static str) -> anyhow::Result<Self> {
        let current = crate::reload::load_and_watch(files.paths(), "the TLS certificate", name, move || files.load())?;
        Ok(Self { current })
    }

    /// An acceptor for one connection, with the configuration of now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(crate::reload::current(&self.current))
    }
}
