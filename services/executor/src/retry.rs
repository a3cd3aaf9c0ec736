//! When to try a step again: exponential backoff with jitter, never less
//! than what the agent asked for with `Retry-After`, never more than a cap.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Backoff settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failed attempt (before jitter).
    pub base: Duration,
    /// Longest delay, `Retry-After` included.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_millis(100), max: Duration::from_secs(30) }
    }
}

impl Backoff {
    /// The wait after failed attempt `attempt` (from 1): `base × 2^(attempt-1)`,
    /// jittered down to half at random so that many steps failing together
    /// do not retry together, at least `retry_after`, at most `max`.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        let full = self.base.saturating_mul(1 << exponent).min(self.max);
        let jittered = full.mul_f64(0.5 + rand::random::<f64>() * 0.5);
        jittered.max(retry_after.unwrap_or_default()).min(self.max)
    }
}

/// A `Retry-After` value: seconds, or an HTTP date. Anything else, negative
/// or absurd values included, is ignored rather than trusted.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds.min(24 * 3600)));
    }
    let at = DateTime::parse_from_rfc2822(value).ok()?;
    let wait = at.with_timezone(&Utc) - now;
    Some(wait.to_std().unwrap_or_default().min(Duration::from_secs(24 * 3600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_jittered_and_capped() {
        let backoff = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(1) };
        for _ in 0..50 {
            let first = backoff.delay(1, None);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100), "{first:?}");
            let third = backoff.delay(3, None);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400), "{third:?}");
            assert!(backoff.delay(30, None) <= Duration::from_secs(1));
        }
        assert_eq!(backoff.delay(1, Some(Duration::from_millis(700))), Duration::from_millis(700));
        assert_eq!(backoff.delay(1, Some(Duration::from_secs(90))), Duration::from_secs(1));
    }

    #[test]
    fn retry_after_takes_seconds_and_dates_and_ignores_nonsense() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").map(|d| d.with_timezone(&Utc)).ok();
        let now = now.unwrap_or_default();
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("Thu, 01 Jan 2026 00:00:03 GMT", now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("Wed, 31 Dec 2025 00:00:00 GMT", now), Some(Duration::ZERO));
        for nonsense in ["1e20", "-5", "soon", "", "99999999999999999999999"] {
            assert_eq!(parse_retry_after(nonsense, now), None, "{nonsense}");
        }
        assert_eq!(parse_retry_after("999999999999", now), Some(Duration::from_secs(24 * 3600)));
    }
}
