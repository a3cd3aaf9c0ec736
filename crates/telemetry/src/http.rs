//! The one way to build outgoing HTTP clients: HTTPS through rustls with
//! the `ring` provider, installed once per process before any client exists.

use std::sync::Once;

/// A `reqwest::ClientBuilder`, with the TLS provider installed first. Build
/// every `reqwest::Client` with it (clippy refuses the other ways).
#[allow(clippy::disallowed_methods)]
pub fn client_builder() -> reqwest::ClientBuilder {
    install_tls_provider();
    reqwest::Client::builder()
}

/// Installs rustls' `ring` provider as the process default, once. Every
/// `reqwest::Client` in a process needs it (HTTPS is built without a bundled
/// provider); [`client_builder`] calls it.
pub fn install_tls_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Fails only when the process installed a provider already, which is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
