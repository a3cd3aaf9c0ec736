//! TLS on a service's port: its certificate and key (gRPC and HTTP on one
//! port, ALPN `h2` and `http/1.1`), optionally a CA whose client
//! certificates are required (mTLS), all re-read when the files change so
//! that a renewed certificate is served without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// How often the files are looked at for a change.
const RELOAD_CHECK: Duration = Duration::from_secs(5);

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
    fn paths(&self) -> Vec<&Path> {
        [Some(self.cert.as_path()), Some(self.key.as_path()), self.client_ca.as_deref()].into_iter().flatten().collect()
    }

    /// When each file last changed (and its size), to notice a renewal.
    fn stamp(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.paths()
            .into_iter()
            .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
            .collect()
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
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
}

impl ServerTls {
    /// Loads `files` (an error names the setting at fault), then looks at
    /// them every few seconds and loads them again once they change, for as
    /// long as this value or a clone lives; a change that does not load
    /// keeps the configuration served, and is logged.
    pub fn watch(files: TlsFiles, name: &'static str) -> anyhow::Result<Self> {
        let current = Arc::new(RwLock::new(files.load()?));
        let tls = Self { current: current.clone() };
        let weak = Arc::downgrade(&current);
        tokio::spawn(async move {
            let mut seen = files.stamp();
            loop {
                tokio::time::sleep(RELOAD_CHECK).await;
                let Some(current) = weak.upgrade() else { return };
                let now = files.stamp();
                if now == seen {
                    continue;
                }
                seen = now;
                match files.load() {
                    Ok(config) => {
                        *current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = config;
                        tracing::info!(service = name, cert = %files.cert.display(), "TLS certificate reloaded");
                    }
                    Err(e) => tracing::warn!(service = name, error = %format!("{e:#}"),
                        "the TLS files changed but cannot be loaded; serving the previous certificate"),
                }
            }
        });
        Ok(tls)
    }

    /// An acceptor for one connection, with the configuration of now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
    }
}
