//! Readiness that follows a service's real dependencies: a background task
//! checks each one on an interval and mirrors the result into
//! `grpc.health.v1` and `/readyz`; `/healthz` (liveness) and `/metrics`
//! (Prometheus text) sit beside them.
//!
//! A dependency is required (readiness follows it) or advisory (reported
//! in `/readyz` with `"required": false`, and in `grpc.health.v1` under its
//! own name, without taking the service out of rotation): a hosted LLM's
//! outage would otherwise empty every replica at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::future::BoxFuture;
use http::{StatusCode, header};
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as ServingStatusPb;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::server::HealthReporter;

/// The result of checking one dependency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Whether it answered.
    pub ok: bool,
    /// What it answered, or why it did not.
    pub detail: String,
    /// Whether readiness follows it.
    pub required: bool,
}

impl Check {
    fn pending(required: bool) -> Self {
        Self { ok: false, detail: "not checked yet".into(), required }
    }
}

/// The last result of every dependency check, by dependency name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Readiness(pub BTreeMap<&'static str, Check>);

impl Readiness {
    /// Whether every required dependency answered.
    pub fn ready(&self) -> bool {
        self.0.values().all(|c| c.ok || !c.required)
    }

    /// One dependency's last result.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.0.get(name)
    }
}

type Probe = Box<dyn Fn() -> BoxFuture<'static, Result<String, String>> + Send + Sync>;

/// One dependency and how to check it: `Ok(detail)` when it answers.
pub struct Dependency {
    name: &'static str,
    probe: Probe,
    required: bool,
    min_interval: Duration,
    last: std::sync::Mutex<Option<(tokio::time::Instant, Check)>>,
}

impl Dependency {
    /// A dependency checked by `probe`.
    pub fn new<F, Fut>(name: &'static str, probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, String>> + Send + 'static,
    {
        Self {
            name,
            probe: Box::new(move || Box::pin(probe())),
            required: true,
            min_interval: Duration::ZERO,
            last: std::sync::Mutex::new(None),
        }
    }

    /// Reported, but readiness does not follow it; its gRPC health is
    /// published under the dependency's name.
    pub fn advisory(mut self) -> Self {
        self.required = false;
        self
    }

    /// Checked at most once per `interval` (a hosted API that rate-limits),
    /// the last result reported in between.
    pub fn at_most_every(mut self, interval: Duration) -> Self {
        self.min_interval = interval;
        self
    }

    /// A gRPC peer that must serve `service` (e.g.
    /// `agentmesh.v1.DiscoveryService`), checked through its
    /// `grpc.health.v1` service for that name. Any answer counts as
    /// reachable (a peer reporting `NOT_SERVING` still answers from what it
    /// holds); the detail says what it reported. A peer that answers but does
    /// not know the service (another agentmesh port given by mistake) is not.
    pub fn grpc(name: &'static str, service: &'static str, channel: agentmesh_telemetry::pool::Pool) -> Self {
        Self::new(name, move || {
            let mut client = HealthClient::new(channel.clone());
            async move {
                match client.check(HealthCheckRequest { service: service.to_owned() }).await {
                    Ok(answer) => {
                        let status =
                            ServingStatusPb::try_from(answer.into_inner().status).unwrap_or(ServingStatusPb::Unknown);
                        Ok(format!("reachable; reports {}", status.as_str_name()))
                    }
                    Err(status) if status.code() == tonic::Code::NotFound => {
                        Err(format!("the peer answers but does not serve {service}: is this the {name} address?"))
                    }
                    Err(status) => Err(format!("unreachable: {}", status.message())),
                }
            }
        })
    }
}

impl Dependency {
    /// A dependency checked by `probe(target)`, the target handed to each
    /// check (an `Arc` of a client or a provider).
    pub fn of<T, F, Fut>(name: &'static str, target: T, probe: F) -> Self
    where
        T: Clone + Send + Sync + 'static,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, String>> + Send + 'static,
    {
        Self::new(name, move || probe(target.clone()))
    }

    /// The service's store, checked by `ping(store)`: `reachable`, or
    /// `unreachable: <why>`.
    pub fn store<T, F, Fut, E>(store: T, ping: F) -> Self
    where
        T: Clone + Send + Sync + 'static,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        Self::new("store", move || {
            let pinged = ping(store.clone());
            async move { pinged.await.map(|()| "reachable".to_owned()).map_err(|e| format!("unreachable: {e}")) }
        })
    }
}

/// Checks a service's dependencies on an interval.
pub struct HealthChecker {
    /// The gRPC service whose health follows the checks (the empty name
    /// follows them too).
    pub service: &'static str,
    /// What to check.
    pub dependencies: Vec<Dependency>,
    /// Receives the gRPC serving status.
    pub reporter: HealthReporter,
    /// Time between checks.
    pub interval: Duration,
    /// Longest wait for one answer.
    pub timeout: Duration,
}

impl HealthChecker {
    /// Checks `dependencies` every `interval`, each allowed as long as the
    /// interval (between 50 ms and 2 s) to answer.
    pub fn every(
        service: &'static str,
        interval: Duration,
        reporter: HealthReporter,
        dependencies: Vec<Dependency>,
    ) -> Self {
        Self {
            service,
            dependencies,
            reporter,
            interval,
            timeout: interval.clamp(Duration::from_millis(50), Duration::from_secs(2)),
        }
    }

    /// Reports `NOT_SERVING` until the first round passes, then checks in the
    /// background until `stop` changes; the receiver holds the last result.
    pub async fn spawn(self, mut stop: watch::Receiver<bool>) -> watch::Receiver<Readiness> {
        self.reporter.set_service_status(self.service, ServingStatus::NotServing).await;
        self.reporter.set_service_status("", ServingStatus::NotServing).await;
        for advisory in self.dependencies.iter().filter(|d| !d.required) {
            self.reporter.set_service_status(advisory.name, ServingStatus::NotServing).await;
        }
        let pending = Readiness(self.dependencies.iter().map(|d| (d.name, Check::pending(d.required))).collect());
        let (tx, rx) = watch::channel(pending);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                let checks = futures_util::future::join_all(self.dependencies.iter().map(|d| self.check(d))).await;
                let now = Readiness(self.dependencies.iter().map(|d| d.name).zip(checks).collect());
                log_changes(self.service, &tx.borrow(), &now);
                let status = if now.ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
                self.reporter.set_service_status(self.service, status).await;
                self.reporter.set_service_status("", status).await;
                for advisory in self.dependencies.iter().filter(|d| !d.required) {
                    let ok = now.get(advisory.name).is_some_and(|c| c.ok);
                    let status = if ok { ServingStatus::Serving } else { ServingStatus::NotServing };
                    self.reporter.set_service_status(advisory.name, status).await;
                }
                tx.send_replace(now);
            }
        });
        rx
    }

    async fn check(&self, dependency: &Dependency) -> Check {
        let now = tokio::time::Instant::now();
        if let Ok(last) = dependency.last.lock()
            && let Some((at, check)) = last.as_ref()
            && now.duration_since(*at) < dependency.min_interval
        {
            return check.clone();
        }
        let required = dependency.required;
        let check = match tokio::time::timeout(self.timeout, (dependency.probe)()).await {
            Ok(Ok(detail)) => Check { ok: true, detail, required },
            Ok(Err(detail)) => Check { ok: false, detail, required },
            Err(_) => {
                Check { ok: false, detail: format!("no answer within {} ms", self.timeout.as_millis()), required }
            }
        };
        if let Ok(mut last) = dependency.last.lock() {
            *last = Some((now, check.clone()));
        }
        check
    }
}

/// Logs a dependency going down or coming back, once per change.
fn log_changes(service: &str, before: &Readiness, now: &Readiness) {
    for (dependency, is) in &now.0 {
        let Some(was) = before.0.get(dependency) else { continue };
        match (was.ok, is.ok) {
            (_, false) if was.detail != is.detail => {
                tracing::warn!(operation = "health_check", service, dependency, detail = %is.detail, "dependency unavailable");
            }
            (false, true) => {
                tracing::info!(operation = "health_check", service, dependency, detail = %is.detail, "dependency available");
            }
            _ => {}
        }
    }
}

/// Renders a service's metrics in the Prometheus text format.
pub type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Clone)]
struct ProbeState {
    metrics: RenderMetrics,
    readiness: watch::Receiver<Readiness>,
}

/// `/metrics` (Prometheus text), `/healthz` (liveness) and `/readyz`
/// (readiness, with the result of each dependency check).
pub fn router(metrics: RenderMetrics, readiness: watch::Receiver<Readiness>) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(ready))
        .with_state(ProbeState { metrics, readiness })
}

async fn render_metrics(State(state): State<ProbeState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], (state.metrics)()).into_response()
}

async fn ready(State(state): State<ProbeState>) -> Response {
    let readiness = state.readiness.borrow().clone();
    let (code, status) =
        if readiness.ready() { (StatusCode::OK, "ready") } else { (StatusCode::SERVICE_UNAVAILABLE, "not_ready") };
    (code, Json(json!({"status": status, "checks": readiness}))).into_response()
}
