//! Retries with exponential backoff and full jitter.

use std::time::Duration;

/// When and how often to retry a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Delay before the first retry (doubled each time, then jittered).
    pub base_delay: Duration,
    /// Longest delay, also the cap on a server's `Retry-After`.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_retries: 3, base_delay: Duration::from_millis(250), max_delay: Duration::from_secs(20) }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based): the server's
    /// `Retry-After` when given, else a random delay up to the exponential bound.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.max_delay);
        }
        let bound = self.base_delay.saturating_mul(2u32.saturating_pow(retry)).min(self.max_delay);
        bound.mul_f64(rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_bounded_and_honour_retry_after() {
        let p =
            RetryPolicy { max_retries: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(1) };
        for retry in 0..10 {
            let bound = (Duration::from_millis(100) * 2u32.pow(retry.min(8))).min(Duration::from_secs(1));
            assert!(p.delay(retry, None) <= bound);
        }
        assert_eq!(p.delay(0, Some(Duration::from_secs(3))), Duration::from_secs(1));
        assert_eq!(p.delay(0, Some(Duration::from_millis(10))), Duration::from_millis(10));
    }
}
