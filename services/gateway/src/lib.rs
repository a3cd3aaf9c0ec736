//! The agentmesh gateway: the one entry point. `Orchestrate` plans a
//! natural-language request, runs the plan, streams the answer and reviews
//! it, passing on everything that happens as it happens; over gRPC
//! (`GatewayService`) and over HTTP (`POST /api/v1/orchestrate`, JSON or
//! server-sent events) on the same port, beside `/metrics`, `/healthz` and
//! `/readyz`.

pub mod a2a;
pub mod console;
pub mod events;
pub mod json;
pub mod mcp;
pub mod metrics;
pub mod orchestrate;
pub mod rest;
pub mod service;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_proto::v1::gateway_service_server::GatewayServiceServer;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_proto::v1::synthesis_service_client::SynthesisServiceClient;
use agentmesh_server::Dependency;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

pub use agentmesh_server::ServiceSettings;

/// Fully qualified gRPC name of the gateway service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.GatewayService";

/// Configuration of the gateway: the `[gateway]` table.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", default)]
pub struct GatewayConfig {
    /// Where it listens (the REST API beside gRPC), the database keeping
    /// every orchestration's messages for resuming, limits
    /// (`request_timeout_secs`: how long an orchestration may take; a
    /// shorter `grpc-timeout` wins), health checks.
    #[serde(flatten, skip_deserializing)]
    pub service: ServiceSettings,
    /// The planner's address.
    pub planner_url: String,
    /// The executor's address.
    pub executor_url: String,
    /// The synthesis service's address.
    pub synthesis_url: String,
    /// Longest query accepted, in characters.
    pub max_query_chars: usize,
    /// Seconds an orchestration's messages are kept for resuming.
    pub event_retention_secs: u64,
    /// Seconds an orchestration streamed over SSE goes on after its client
    /// disconnects, waiting for it to resume (then as long as a resumed
    /// stream follows it); without a resume, its execution is cancelled.
    pub resume_grace_secs: f64,
    /// Discovery's address, for the console's agents page.
    pub discovery_url: String,
    /// Serve the console (the mesh in a browser) at `/`.
    pub console: bool,
    /// Serve MCP at `/mcp` (streamable HTTP): the tool `ask` orchestrates.
    pub mcp: bool,
    /// On `/mcp`, offer every healthy capability as a tool too
    /// (`{agent}.{capability}`), run as a one-step plan by the executor.
    pub mcp_capability_tools: bool,
    /// Serve A2A: the Agent Card at `/.well-known/agent-card.json`, and
    /// `/a2a` (JSON-RPC, protocol 1.0 and 0.3), where a message orchestrates.
    pub a2a: bool,
    /// The gateway's address as its callers reach it (`https://mesh.example.com`),
    /// when a proxy stands in front of it; the Agent Card's URLs are made
    /// from it. Empty: the `Host` a caller names.
    pub public_url: String,
    /// Where the console links a trace id, `{trace_id}` replaced (Jaeger's
    /// UI by default); empty: no link.
    pub console_trace_url: String,
}

agentmesh_server::flat_settings!(GatewayConfig { service });

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            service: ServiceSettings { request_timeout_secs: 900.0, ..ServiceSettings::on_port(7404) },
            planner_url: "http://127.0.0.1:7401".into(),
            executor_url: "http://127.0.0.1:7402".into(),
            synthesis_url: "http://127.0.0.1:7403".into(),
            max_query_chars: 4_000,
            event_retention_secs: 3600,
            resume_grace_secs: 30.0,
            discovery_url: "http://127.0.0.1:7400".into(),
            console: true,
            mcp: true,
            mcp_capability_tools: false,
            a2a: true,
            public_url: String::new(),
            console_trace_url: "http://localhost:16686/trace/{trace_id}".into(),
        }
    }
}

impl GatewayConfig {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.service.validate()?;
        for (name, url) in [
            ("planner_url", &self.planner_url),
            ("executor_url", &self.executor_url),
            ("synthesis_url", &self.synthesis_url),
            ("discovery_url", &self.discovery_url),
        ] {
            agentmesh_server::check_service_url(name, url)?;
        }
        anyhow::ensure!(self.max_query_chars >= 1, "max_query_chars must be at least 1");
        anyhow::ensure!(self.event_retention_secs >= 1, "event_retention_secs must be at least 1");
        anyhow::ensure!(
            self.resume_grace_secs.is_finite() && self.resume_grace_secs >= 0.0,
            "resume_grace_secs must be 0 or more, got {}",
            self.resume_grace_secs
        );
        if !self.public_url.is_empty() {
            agentmesh_server::check_service_url("public_url", &self.public_url)?;
        }
        Ok(())
    }
}

/// Which roles each call needs when authentication is on: clients,
/// services and operators; the console's pages and assets anyone (the JSON
/// they read is checked like any call).
fn access(method: &axum::http::Method, path: &str) -> agentmesh_server::auth::Access {
    if console::is_public(path) || a2a::is_public(path) {
        return agentmesh_server::auth::Access::Public;
    }
    agentmesh_server::auth::mesh_callers(method, path)
}

/// Binds `listen` and serves until `shutdown` resolves.
pub async fn serve(config: GatewayConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::service::bind("the gateway", config.service.listen)?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: GatewayConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let tls = config.service.client_settings()?;
    let channel = |name: &str, url: &str| agentmesh_telemetry::rpc::channel(name, url, &tls);
    let planner = channel("planner", &config.planner_url)?;
    let executor = channel("executor", &config.executor_url)?;
    let synthesis = channel("synthesis", &config.synthesis_url)?;
    let traced = |channel| agentmesh_telemetry::rpc::traced_with(channel, &tls);
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let log = agentmesh_store::connect_orchestration_log(&config.service.database_url)
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
        request_timeout: Duration::from_secs_f64(config.service.request_timeout_secs),
        metrics: metrics.clone(),
        events,
        log: log.clone(),
        retention,
        resume_grace: Duration::from_secs_f64(config.resume_grace_secs),
        followers: std::sync::Mutex::new(std::collections::HashMap::new()),
    });
    let pinged = log.clone();
    let server = GatewayServiceServer::new(service::GatewayGrpc { shared: shared.clone() })
        .max_decoding_message_size(config.service.max_request_bytes);
    let mut rest = axum::Router::new()
        .route("/api/v1/orchestrate", axum::routing::post(rest::orchestrate))
        .route("/api/v1/orchestrations/{request_id}/events", axum::routing::get(rest::resume))
        .with_state(shared.clone());
    let discovery = DiscoveryServiceClient::new(traced(channel("discovery", &config.discovery_url)?));
    if config.mcp {
        rest = rest.merge(mcp::router(shared.clone(), config.mcp_capability_tools.then(|| discovery.clone())));
    }
    if config.a2a {
        rest = rest.merge(a2a::router(Arc::new(a2a::A2a {
            shared: shared.clone(),
            discovery: discovery.clone(),
            tls: config.service.tls_cert_file.is_some(),
            public_url: (!config.public_url.is_empty()).then(|| config.public_url.clone()),
            authenticated: config.service.auth_tokens_file.is_some() || config.service.auth_jwks_url.is_some(),
            skills: tokio::sync::Mutex::new(None),
        })));
    }
    if config.console {
        rest = rest.merge(console::router(Arc::new(console::Console {
            executor: shared.clients.executor.clone(),
            planner: shared.clients.planner.clone(),
            discovery,
            trace_url: config.console_trace_url.clone(),
        })));
    }
    let purge = agentmesh_store::spawn_orchestration_purge(log);
    let result = agentmesh_server::Service::new("gateway", SERVICE_NAME, tonic::service::Routes::new(server))
        .authorize(access)
        .http(rest)
        .metrics(move || metrics.render())
        .depends_on(vec![
            Dependency::grpc("planner", agentmesh_proto::v1::planner_service_server::SERVICE_NAME, planner),
            Dependency::grpc("executor", agentmesh_proto::v1::executor_service_server::SERVICE_NAME, executor),
            Dependency::grpc("synthesis", agentmesh_proto::v1::synthesis_service_server::SERVICE_NAME, synthesis),
            Dependency::store(pinged, |log| async move { log.ping().await }),
        ])
        .serve(&config.service, listener, shutdown)
        .await;
    purge.abort();
    result
}
