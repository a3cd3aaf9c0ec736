//! The agentmesh gateway: the one entry point. `Orchestrate` plans a
//! natural-language request, runs the plan, streams the answer and reviews
//! it, passing on everything that happens as it happens; over gRPC
//! (`GatewayService`) and over HTTP (`POST /api/v1/orchestrate`, JSON or
//! server-sent events) on the same port, beside `/metrics`, `/healthz` and
//! `/readyz`.

pub mod events;
pub mod json;
pub mod metrics;
pub mod orchestrate;
pub mod rest;
pub mod service;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_proto::v1::gateway_service_server::GatewayServiceServer;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_proto::v1::synthesis_service_client::SynthesisServiceClient;
use agentmesh_server::{Dependency, HealthChecker};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Fully qualified gRPC name of the gateway service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.GatewayService";

/// Configuration of the gateway.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address serving gRPC and HTTP (the REST API, `/metrics`, `/healthz`, `/readyz`).
    pub listen: SocketAddr,
    /// The planner's address.
    pub planner_url: String,
    /// The executor's address.
    pub executor_url: String,
    /// The synthesis service's address.
    pub synthesis_url: String,
    /// Longest query accepted, in characters.
    pub max_query_chars: usize,
    /// Seconds an orchestration may take (a shorter `grpc-timeout` wins).
    pub request_timeout_secs: f64,
    /// Requests handled at once; more wait for a slot.
    pub max_concurrent_requests: usize,
    /// Largest accepted request, in bytes.
    pub max_request_bytes: usize,
    /// Seconds between checks of the planner, executor, synthesis and the store.
    pub health_check_interval_secs: f64,
    /// Database keeping every orchestration's messages for resuming
    /// (`sqlite://…` or `postgres://…`).
    pub database_url: String,
    /// Seconds an orchestration's messages are kept for resuming.
    pub event_retention_secs: u64,
    /// Seconds an orchestration streamed over SSE goes on after its client
    /// disconnects, waiting for it to resume (then as long as a resumed
    /// stream follows it); without a resume, its execution is cancelled.
    pub resume_grace_secs: f64,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            listen,
            planner_url,
            executor_url,
            synthesis_url,
            max_query_chars,
            request_timeout_secs,
            max_concurrent_requests,
            max_request_bytes,
            health_check_interval_secs,
            database_url,
            event_retention_secs,
            resume_grace_secs,
        } = self;
        f.debug_struct("GatewayConfig")
            .field("listen", listen)
            .field("planner_url", planner_url)
            .field("executor_url", executor_url)
            .field("synthesis_url", synthesis_url)
            .field("max_query_chars", max_query_chars)
            .field("request_timeout_secs", request_timeout_secs)
            .field("max_concurrent_requests", max_concurrent_requests)
            .field("max_request_bytes", max_request_bytes)
            .field("health_check_interval_secs", health_check_interval_secs)
            .field("database_url", &agentmesh_server::redact(database_url))
            .field("event_retention_secs", event_retention_secs)
            .field("resume_grace_secs", resume_grace_secs)
            .finish()
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7404)),
            planner_url: "http://127.0.0.1:7401".into(),
            executor_url: "http://127.0.0.1:7402".into(),
            synthesis_url: "http://127.0.0.1:7403".into(),
            max_query_chars: 4_000,
            request_timeout_secs: 900.0,
            max_concurrent_requests: 1_000,
            max_request_bytes: 1024 * 1024,
            health_check_interval_secs: 2.0,
            database_url: "sqlite://.agentmesh/agentmesh.db".into(),
            event_retention_secs: 3600,
            resume_grace_secs: 30.0,
        }
    }
}

impl GatewayConfig {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, url) in [
            ("planner_url", &self.planner_url),
            ("executor_url", &self.executor_url),
            ("synthesis_url", &self.synthesis_url),
        ] {
            agentmesh_server::check_service_url(name, url)?;
        }
        agentmesh_server::check_limits(
            self.request_timeout_secs,
            self.max_concurrent_requests,
            self.max_request_bytes,
        )?;
        agentmesh_server::check_min_secs("health_check_interval_secs", self.health_check_interval_secs, 0.05)?;
        anyhow::ensure!(self.max_query_chars >= 1, "max_query_chars must be at least 1");
        anyhow::ensure!(self.event_retention_secs >= 1, "event_retention_secs must be at least 1");
        anyhow::ensure!(
            self.resume_grace_secs.is_finite() && self.resume_grace_secs >= 0.0,
            "resume_grace_secs must be 0 or more, got {}",
            self.resume_grace_secs
        );
        Ok(())
    }

    /// The limits of the shared server stack. The stack's deadline covers
    /// only the start of a streamed answer; the orchestration keeps its own.
    pub fn limits(&self) -> agentmesh_server::Limits {
        agentmesh_server::Limits {
            request_timeout: Duration::from_secs_f64(self.request_timeout_secs),
            max_concurrent_requests: self.max_concurrent_requests,
            max_request_bytes: self.max_request_bytes,
        }
    }
}

fn channel(name: &str, url: &str) -> anyhow::Result<tonic::transport::Channel> {
    Ok(tonic::transport::Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("{name} url `{url}`"))?
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// Binds `config.listen` and serves until `shutdown` resolves.
pub async fn serve(config: GatewayConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::net::listen(config.listen)
        .with_context(|| format!("binding the gateway to {}", config.listen))?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: GatewayConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let planner = channel("planner", &config.planner_url)?;
    let executor = channel("executor", &config.executor_url)?;
    let synthesis = channel("synthesis", &config.synthesis_url)?;
    let traced = agentmesh_telemetry::rpc::traced;
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let log = agentmesh_store::connect_orchestration_log(&config.database_url)
        .await
        .context("opening the orchestration event log")?;
    let retention = Duration::from_secs(config.event_retention_secs);
    let events = events::EventWriter::spawn(log.clone(), retention, metrics.clone());
    let shared = Arc::new(service::Shared {
        clients: orchestrate::Clients {
            planner: PlannerServiceClient::new(traced(planner.clone())),
            executor: ExecutorServiceClient::new(traced(executor.clone())),
            synthesis: SynthesisServiceClient::new(traced(synthesis.clone())),
        },
        max_query_chars: config.max_query_chars,
        request_timeout: Duration::from_secs_f64(config.request_timeout_secs),
        metrics: metrics.clone(),
        events,
        log: log.clone(),
        resume_grace: Duration::from_secs_f64(config.resume_grace_secs),
        followers: std::sync::Mutex::new(std::collections::HashMap::new()),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let (health_reporter, health_service) = agentmesh_server::grpc::health();
    let interval = Duration::from_secs_f64(config.health_check_interval_secs);
    let pinged = log.clone();
    let readiness = HealthChecker::every(
        SERVICE_NAME,
        interval,
        health_reporter,
        vec![
            Dependency::grpc("planner", agentmesh_proto::v1::planner_service_server::SERVICE_NAME, planner),
            Dependency::grpc("executor", agentmesh_proto::v1::executor_service_server::SERVICE_NAME, executor),
            Dependency::grpc("synthesis", agentmesh_proto::v1::synthesis_service_server::SERVICE_NAME, synthesis),
            Dependency::ping("store", move || {
                let log = pinged.clone();
                async move { log.ping().await }
            }),
        ],
    )
    .spawn(stop_rx)
    .await;
    let server = GatewayServiceServer::new(service::GatewayGrpc { shared: shared.clone() })
        .max_decoding_message_size(config.max_request_bytes);
    let grpc = agentmesh_server::grpc::router(tonic::service::Routes::new(server), &[SERVICE_NAME], health_service)?;
    let render: agentmesh_server::probes::RenderMetrics = Arc::new(move || metrics.render());
    let rest = axum::Router::new()
        .route("/api/v1/orchestrate", axum::routing::post(rest::orchestrate))
        .route("/api/v1/orchestrations/{request_id}/events", axum::routing::get(rest::resume))
        .with_state(shared);
    let http = agentmesh_server::probes::router(render, readiness).merge(rest);
    let app = agentmesh_server::stack(http, grpc, &config.limits());
    let purge = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(600));
        loop {
            tick.tick().await;
            if let Err(e) = log.purge_expired(chrono::Utc::now().timestamp_millis()).await {
                tracing::warn!(error = %e, "could not purge expired orchestration events");
            }
        }
    });
    tracing::info!(addr = %listener.local_addr()?, "gateway listening (gRPC and HTTP)");
    let result = agentmesh_server::serve("gateway", listener, app, async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    })
    .await;
    purge.abort();
    result
}
