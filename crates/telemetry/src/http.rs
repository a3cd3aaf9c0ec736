//! The one way to build outgoing HTTP clients: HTTPS through rustls with
//! the `ring` provider, installed once per process before any client exists.

use std::sync::Once;
use std::time::Duration;

use chrono::{DateTime, Utc};

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

/// Longest wait a `Retry-After` may ask for.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A `Retry-After` header value: whole seconds, or an HTTP date, capped at a
/// day. Anything else (negative, fractional, exponent or absurd values) is
/// ignored rather than trusted, so that no header can make a client panic
/// or sleep forever.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds).min(LONGEST_RETRY_AFTER));
    }
    let at = DateTime::parse_from_rfc2822(value).ok()?;
    let wait = at.with_timezone(&Utc) - now;
    Some(wait.to_std().unwrap_or_default().min(LONGEST_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates_and_ignores_nonsense() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").map(|d| d.with_timezone(&Utc)).ok();
        let now = now.unwrap_or_default();
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(" 2 ", now), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("Thu, 01 Jan 2026 00:00:03 GMT", now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("Wed, 31 Dec 2025 00:00:00 GMT", now), Some(Duration::ZERO));
        for nonsense in ["1e20", "-5", "soon", "", "99999999999999999999999", "NaN", "inf", "1.5"] {
            assert_eq!(parse_retry_after(nonsense, now), None, "{nonsense}");
        }
        assert_eq!(parse_retry_after("999999999999", now), Some(LONGEST_RETRY_AFTER));
    }
}
