//! Health derived from heartbeats, so that no query shows a stale status.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Derived health of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// Heartbeating and healthy.
    Active,
    /// Reported degraded, or silent for 3 heartbeat intervals.
    Degraded,
    /// Silent for 6 heartbeat intervals.
    Inactive,
}

impl HealthStatus {
    /// Lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Degraded => "degraded",
            Self::Inactive => "inactive",
        }
    }

    /// Parses a wire name exactly (`active`, `degraded`, `inactive`).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "active" => Some(Self::Active),
            "degraded" => Some(Self::Degraded),
            "inactive" => Some(Self::Inactive),
            _ => None,
        }
    }
}

/// What an agent says about itself in a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReportedStatus {
    /// Healthy.
    #[default]
    Active,
    /// Working, but impaired.
    Degraded,
}

impl ReportedStatus {
    /// Lowercase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Degraded => "degraded",
        }
    }

    /// Parses a stored or reported value.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "active" => Some(Self::Active),
            "degraded" => Some(Self::Degraded),
            _ => None,
        }
    }
}

/// The heartbeat rules: silence for 3 intervals degrades, for 6 deactivates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Expected time between heartbeats.
    pub heartbeat_interval: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self { heartbeat_interval: Duration::from_secs(10) }
    }
}

impl HealthPolicy {
    /// Missed intervals after which an agent is degraded.
    pub const DEGRADED_AFTER: u32 = 3;
    /// Missed intervals after which an agent is inactive.
    pub const INACTIVE_AFTER: u32 = 6;

    /// Health at `now` of an agent last heard from at `last_heartbeat`.
    pub fn derive(&self, last_heartbeat: DateTime<Utc>, reported: ReportedStatus, now: DateTime<Utc>) -> HealthStatus {
        let silent = (now - last_heartbeat).to_std().unwrap_or(Duration::ZERO);
        if silent >= self.heartbeat_interval * Self::INACTIVE_AFTER {
            HealthStatus::Inactive
        } else if silent >= self.heartbeat_interval * Self::DEGRADED_AFTER {
            HealthStatus::Degraded
        } else {
            match reported {
                ReportedStatus::Active => HealthStatus::Active,
                ReportedStatus::Degraded => HealthStatus::Degraded,
            }
        }
    }

    /// The next instant after `now` at which the derived health of an agent
    /// last heard from at `last_heartbeat` changes, if it ever does.
    pub fn next_transition(&self, last_heartbeat: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        [Self::DEGRADED_AFTER, Self::INACTIVE_AFTER]
            .into_iter()
            .filter_map(|n| chrono::Duration::from_std(self.heartbeat_interval * n).ok())
            .map(|d| last_heartbeat + d)
            .find(|at| *at > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap_or_default()
    }

    #[test]
    fn health_follows_missed_intervals() {
        let policy = HealthPolicy::default();
        let last = at(0);
        assert_eq!(policy.derive(last, ReportedStatus::Active, at(29)), HealthStatus::Active);
        assert_eq!(policy.derive(last, ReportedStatus::Active, at(30)), HealthStatus::Degraded);
        assert_eq!(policy.derive(last, ReportedStatus::Active, at(59)), HealthStatus::Degraded);
        assert_eq!(policy.derive(last, ReportedStatus::Active, at(60)), HealthStatus::Inactive);
        assert_eq!(policy.derive(last, ReportedStatus::Degraded, at(1)), HealthStatus::Degraded);
        // A clock step backwards is not silence.
        assert_eq!(policy.derive(at(10), ReportedStatus::Active, at(0)), HealthStatus::Active);
    }

    #[test]
    fn next_transition_points_at_the_next_threshold() {
        let policy = HealthPolicy::default();
        assert_eq!(policy.next_transition(at(0), at(5)), Some(at(30)));
        assert_eq!(policy.next_transition(at(0), at(30)), Some(at(60)));
        assert_eq!(policy.next_transition(at(0), at(61)), None);
    }
}
