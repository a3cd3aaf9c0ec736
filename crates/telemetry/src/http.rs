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

/// When and how often an outbound call (to a model, to an agent) is tried
/// again; one policy for every caller. Delays grow exponentially from
/// `base_delay`, doubling, each jittered down to as little as half (so that
/// calls failing together do not retry together) and never above
/// `max_delay`; a server's `Retry-After` is waited for when it asks for
/// longer, up to `max_delay` too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Delay before the first retry (before jitter).
    pub base_delay: Duration,
    /// Longest delay, `Retry-After` included.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_retries: 3, base_delay: Duration::from_millis(250), max_delay: Duration::from_secs(20) }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (from 0), at least the server's
    /// `retry_after` and at most `max_delay`. (`max_retries` is the
    /// caller's to count: an execution may allow its own.)
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        use backon::BackoffBuilder;
        // backon jitters upwards, by up to the delay itself: starting from
        // half the delays gives delays between half and the whole of each.
        let backoff = backon::ExponentialBuilder::new()
            .with_min_delay(self.base_delay / 2)
            .with_max_delay(self.max_delay / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(usize::try_from(retry).unwrap_or(usize::MAX))
            .unwrap_or(self.max_delay);
        backoff.max(retry_after.unwrap_or_default()).min(self.max_delay)
    }
}

/// An error and its causes, `a: b: c` (reqwest's `Display` stops at the
/// outermost); a cause whose text is already there is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
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

    #[test]
    fn delays_grow_stay_jittered_and_capped() {
        let policy =
            RetryPolicy { max_retries: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(1) };
        for _ in 0..50 {
            let first = policy.delay(0, None);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100), "{first:?}");
            let third = policy.delay(2, None);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400), "{third:?}");
            let late = policy.delay(30, None);
            assert!(late >= Duration::from_millis(500) && late <= Duration::from_secs(1), "{late:?}");
        }
        assert_eq!(policy.delay(0, Some(Duration::from_millis(700))), Duration::from_millis(700));
        assert_eq!(policy.delay(0, Some(Duration::from_secs(90))), Duration::from_secs(1));
    }
}
