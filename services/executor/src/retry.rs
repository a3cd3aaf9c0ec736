//! When to try a step again: exponential backoff with jitter, never less
//! than what the agent asked for with `Retry-After`, never more than a cap.

use std::time::Duration;

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

pub use agentmesh_telemetry::http::parse_retry_after;

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
}
