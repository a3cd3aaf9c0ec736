//! Readiness of the planner: a background task checks discovery and the
//! interaction-log store every few seconds and mirrors the result into
//! `grpc.health.v1` and `/readyz`.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_store::InteractionLog;
use serde::Serialize;
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as ServingStatusPb;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::server::HealthReporter;

/// Fully qualified gRPC name of the planner service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.PlannerService";

/// The result of checking one dependency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Whether it answered.
    pub ok: bool,
    /// What it answered, or why it did not.
    pub detail: String,
}

impl Check {
    fn pending() -> Self {
        Self { ok: false, detail: "not checked yet".into() }
    }
}

/// The last result of every dependency check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// Discovery, where every catalog comes from.
    pub discovery: Check,
    /// The interaction-log database.
    pub store: Check,
}

impl Readiness {
    /// Whether the planner can serve requests.
    pub fn ready(&self) -> bool {
        self.discovery.ok && self.store.ok
    }
}

/// Checks the planner's dependencies on an interval.
pub struct HealthChecker {
    /// Discovery's channel (the one the planner uses for catalogs).
    pub discovery: Channel,
    /// The interaction log.
    pub log: Arc<dyn InteractionLog>,
    /// Receives the gRPC serving status.
    pub reporter: HealthReporter,
    /// Time between checks.
    pub interval: Duration,
    /// Longest wait for one answer.
    pub timeout: Duration,
}

impl HealthChecker {
    /// Starts checking in the background; the receiver holds the last result.
    pub fn spawn(self, mut stop: watch::Receiver<bool>) -> watch::Receiver<Readiness> {
        let (tx, rx) = watch::channel(Readiness { discovery: Check::pending(), store: Check::pending() });
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                let (discovery, store) = tokio::join!(self.check_discovery(), self.check_store());
                let now = Readiness { discovery, store };
                let before = tx.borrow().clone();
                log_changes(&before, &now);
                let status = if now.ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
                self.reporter.set_service_status(SERVICE_NAME, status).await;
                self.reporter.set_service_status("", status).await;
                tx.send_replace(now);
            }
        });
        rx
    }

    async fn check_discovery(&self) -> Check {
        let mut client = HealthClient::new(self.discovery.clone());
        let check = client.check(HealthCheckRequest { service: String::new() });
        match tokio::time::timeout(self.timeout, check).await {
            Ok(Ok(answer)) => {
                // Discovery answers from its catalog snapshot even while its own
                // database is down, so any answer means catalogs can be fetched.
                let status = ServingStatusPb::try_from(answer.into_inner().status).unwrap_or(ServingStatusPb::Unknown);
                Check { ok: true, detail: format!("reachable; reports {}", status.as_str_name()) }
            }
            Ok(Err(status)) => Check { ok: false, detail: format!("unreachable: {}", status.message()) },
            Err(_) => Check { ok: false, detail: format!("no answer within {} ms", self.timeout.as_millis()) },
        }
    }

    async fn check_store(&self) -> Check {
        match tokio::time::timeout(self.timeout, self.log.ping()).await {
            Ok(Ok(())) => Check { ok: true, detail: "reachable".into() },
            Ok(Err(e)) => Check { ok: false, detail: format!("unreachable: {e}") },
            Err(_) => Check { ok: false, detail: format!("no answer within {} ms", self.timeout.as_millis()) },
        }
    }
}

/// Logs a dependency going down or coming back, once per change.
fn log_changes(before: &Readiness, now: &Readiness) {
    for (dependency, was, is) in
        [("discovery", &before.discovery, &now.discovery), ("interaction_store", &before.store, &now.store)]
    {
        match (was.ok, is.ok) {
            (true, false) | (false, false) if was.detail != is.detail => {
                tracing::warn!(operation = "health_check", dependency, detail = %is.detail, "dependency unavailable");
            }
            (false, true) => {
                tracing::info!(operation = "health_check", dependency, detail = %is.detail, "dependency available");
            }
            _ => {}
        }
    }
}
