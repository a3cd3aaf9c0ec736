//! The agentmesh planner: turns a request into a plan over the capabilities
//! that really exist. [`engine::Planner`] holds the planning loop
//! (pre-selection, generation with a constrained schema, parsing, validation
//! against the set shown, and recovery); [`serve`] runs it as the gRPC
//! `PlannerService`, with the catalog from discovery and the interaction log
//! in the store, and `/metrics`, `/healthz` and `/readyz` on the same port.

pub mod bm25;
pub mod catalog;
pub mod engine;
pub mod metrics;
pub mod prompt;
/// The provider chain (`--llm a:m,b:m`), shared with the other LLM services.
pub use agentmesh_llm::chain as providers;
pub mod routes;
pub mod service;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::plan::PlanBounds;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::planner_service_server::PlannerServiceServer;
use agentmesh_server::{Dependency, HealthChecker};
use agentmesh_store::Retention;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Fully qualified gRPC name of the planner service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.PlannerService";

/// How often the LLM's server is probed for `/readyz` (a TCP connection,
/// no request).
const LLM_PROBE_INTERVAL: Duration = Duration::from_secs(30);

pub use engine::{Interaction, InteractionKind, PlanOutcome, PlanStats, Planner, PlannerSettings, PlanningError};

/// Configuration of the planner service (`Debug` hides the passwords in
/// its URLs).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlannerConfig {
    /// Address serving gRPC and HTTP (`/metrics`, `/healthz`, `/readyz`).
    pub listen: SocketAddr,
    /// Discovery's address.
    pub discovery_url: String,
    /// Database for the interaction log (`sqlite://…` or `postgres://…`).
    pub database_url: String,
    /// `provider:model[,provider:model…]`, a fallback chain: `openai:MODEL`,
    /// `anthropic:MODEL`, `gemini:MODEL`, `ollama:MODEL`, `vllm:MODEL`,
    /// `llamacpp:MODEL` (any OpenAI-compatible server, with `llm_base_url`),
    /// `replay:FILE`. Models may be aliases (`sonnet`, `flash`, `fast`…).
    pub llm: String,
    /// Base URL overriding each provider's default (and its environment variable).
    pub llm_base_url: Option<String>,
    /// `auto`, `json_schema`, `json_object`, `tool` or `none`.
    pub llm_structured: String,
    /// Seconds each LLM call may take (per attempt).
    pub llm_timeout_secs: u64,
    /// Retries of an LLM call after 429, 5xx and timeouts (exponential
    /// backoff with jitter, honouring `Retry-After`).
    pub llm_retries: u32,
    /// PEM file of extra trusted CAs for HTTPS to the LLM server.
    pub llm_ca_file: Option<std::path::PathBuf>,
    /// The orchestrator's own agent ids: never planned for.
    #[serde(deserialize_with = "agentmesh_server::list_or_commas")]
    pub self_agent_ids: Vec<String>,
    /// Pre-selection runs above this many capabilities.
    pub preselect_threshold: usize,
    /// Retries after an answer that is not a plan.
    pub parse_retries: u32,
    /// Retries after a hallucinated agent or capability.
    pub hallucination_retries: u32,
    /// Hours successful LLM calls are kept in the log.
    pub interaction_retention_hours: u64,
    /// Hours failed LLM calls are kept in the log.
    pub interaction_error_retention_hours: u64,
    /// Seconds between checks of discovery and the interaction-log store.
    pub health_check_interval_secs: f64,
    /// Largest accepted request, in bytes.
    pub max_request_bytes: usize,
    /// Seconds a request may take to be answered (a shorter `grpc-timeout`
    /// wins); planning with retries against a slow model takes minutes.
    pub request_timeout_secs: f64,
    /// Requests handled at once; more wait for a slot.
    pub max_concurrent_requests: usize,
    /// Longest query accepted, in characters (`INVALID_ARGUMENT` above it).
    pub max_query_chars: usize,
    /// Most steps a plan may have (the planning schema's bound).
    pub max_plan_steps: usize,
    /// Largest answer read from an LLM server, whole or streamed, in bytes.
    pub llm_max_response_bytes: usize,
}

impl std::fmt::Debug for PlannerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured so that a new field cannot be left out unnoticed.
        let Self {
            listen,
            discovery_url,
            database_url,
            llm,
            llm_base_url,
            llm_structured,
            llm_timeout_secs,
            llm_retries,
            llm_ca_file,
            self_agent_ids,
            preselect_threshold,
            parse_retries,
            hallucination_retries,
            interaction_retention_hours,
            interaction_error_retention_hours,
            health_check_interval_secs,
            max_request_bytes,
            request_timeout_secs,
            max_concurrent_requests,
            max_query_chars,
            max_plan_steps,
            llm_max_response_bytes,
        } = self;
        f.debug_struct("PlannerConfig")
            .field("listen", listen)
            .field("discovery_url", discovery_url)
            .field("database_url", &agentmesh_server::redact(database_url))
            .field("llm", llm)
            .field("llm_base_url", &llm_base_url.as_deref().map(agentmesh_server::redact))
            .field("llm_structured", llm_structured)
            .field("llm_timeout_secs", llm_timeout_secs)
            .field("llm_retries", llm_retries)
            .field("llm_ca_file", llm_ca_file)
            .field("self_agent_ids", self_agent_ids)
            .field("preselect_threshold", preselect_threshold)
            .field("parse_retries", parse_retries)
            .field("hallucination_retries", hallucination_retries)
            .field("interaction_retention_hours", interaction_retention_hours)
            .field("interaction_error_retention_hours", interaction_error_retention_hours)
            .field("health_check_interval_secs", health_check_interval_secs)
            .field("max_request_bytes", max_request_bytes)
            .field("request_timeout_secs", request_timeout_secs)
            .field("max_concurrent_requests", max_concurrent_requests)
            .field("max_query_chars", max_query_chars)
            .field("max_plan_steps", max_plan_steps)
            .field("llm_max_response_bytes", llm_max_response_bytes)
            .finish()
    }
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7401)),
            discovery_url: "http://127.0.0.1:7400".into(),
            database_url: "sqlite://.agentmesh/agentmesh.db".into(),
            llm: String::new(),
            llm_base_url: None,
            llm_structured: "auto".into(),
            llm_timeout_secs: 60,
            llm_retries: 3,
            llm_ca_file: None,
            self_agent_ids: Vec::new(),
            preselect_threshold: 20,
            parse_retries: 2,
            hallucination_retries: 1,
            interaction_retention_hours: 24,
            interaction_error_retention_hours: 24 * 7,
            health_check_interval_secs: 2.0,
            max_request_bytes: 4 * 1024 * 1024,
            request_timeout_secs: 600.0,
            max_concurrent_requests: 1_000,
            max_query_chars: 4_000,
            max_plan_steps: PlanBounds::default().max_steps,
            llm_max_response_bytes: agentmesh_llm::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl PlannerConfig {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        agentmesh_server::check_service_url("discovery_url", &self.discovery_url)?;
        anyhow::ensure!(
            !self.llm.is_empty(),
            "no LLM configured: pass --llm openai:MODEL (with --llm-base-url) or --llm replay:FILE"
        );
        agentmesh_server::check_min_secs("health_check_interval_secs", self.health_check_interval_secs, 0.05)?;
        agentmesh_server::check_limits(
            self.request_timeout_secs,
            self.max_concurrent_requests,
            self.max_request_bytes,
        )?;
        anyhow::ensure!(self.max_query_chars >= 1, "max_query_chars must be at least 1");
        anyhow::ensure!(
            (1..=50).contains(&self.max_plan_steps),
            "max_plan_steps must be between 1 and 50, got {}",
            self.max_plan_steps
        );
        anyhow::ensure!(self.llm_max_response_bytes >= 1024, "llm_max_response_bytes must be at least 1024");
        Ok(())
    }

    /// The limits of the shared server stack.
    pub fn limits(&self) -> agentmesh_server::Limits {
        agentmesh_server::Limits {
            request_timeout: Duration::from_secs_f64(self.request_timeout_secs),
            max_concurrent_requests: self.max_concurrent_requests,
            max_request_bytes: self.max_request_bytes,
        }
    }

    /// How to reach the LLM providers.
    pub fn provider_options(&self) -> providers::ProviderOptions {
        providers::ProviderOptions {
            base_url: self.llm_base_url.clone(),
            structured: self.llm_structured.clone(),
            http: agentmesh_llm::HttpSettings {
                timeout: Duration::from_secs(self.llm_timeout_secs.max(1)),
                retry: agentmesh_llm::RetryPolicy { max_retries: self.llm_retries, ..Default::default() },
                ca_file: self.llm_ca_file.clone(),
                max_response_bytes: self.llm_max_response_bytes,
            },
        }
    }
}

/// Binds `config.listen` and serves until `shutdown` resolves.
pub async fn serve(config: PlannerConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::net::listen(config.listen)
        .with_context(|| format!("binding planner to {}", config.listen))?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: PlannerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let llm = Arc::new(providers::build(&config.llm, &config.provider_options())?);
    let log =
        agentmesh_store::connect_interaction_log(&config.database_url).await.context("opening the interaction log")?;
    let discovery_channel = tonic::transport::Endpoint::from_shared(config.discovery_url.clone())
        .with_context(|| format!("discovery url `{}`", config.discovery_url))?
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy();
    let discovery = DiscoveryServiceClient::new(agentmesh_telemetry::rpc::traced(discovery_channel.clone()));
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let settings = PlannerSettings {
        preselect_threshold: config.preselect_threshold,
        parse_retries: config.parse_retries,
        hallucination_retries: config.hallucination_retries,
        bounds: PlanBounds { max_steps: config.max_plan_steps, ..PlanBounds::default() },
        ..Default::default()
    };
    let service = service::PlannerGrpc {
        planner: Planner::new(settings),
        llm: llm.clone(),
        discovery,
        log: log.clone(),
        retention: Retention {
            ok: Duration::from_secs(config.interaction_retention_hours * 3600),
            error: Duration::from_secs(config.interaction_error_retention_hours * 3600),
        },
        self_agent_ids: config.self_agent_ids.clone(),
        metrics: metrics.clone(),
        max_query_chars: config.max_query_chars,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let (health_reporter, health_service) = agentmesh_server::grpc::health();
    let interval = Duration::from_secs_f64(config.health_check_interval_secs);
    let store = log.clone();
    let readiness = HealthChecker::every(
        SERVICE_NAME,
        interval,
        health_reporter,
        vec![
            Dependency::grpc(
                "discovery",
                agentmesh_proto::v1::discovery_service_server::SERVICE_NAME,
                discovery_channel,
            ),
            Dependency::ping("store", move || {
                let store = store.clone();
                async move { store.ping().await }
            }),
            // Reported, not required: see docs/observability.md#readiness.
            Dependency::new("llm", move || {
                let llm = llm.clone();
                async move { agentmesh_llm::LlmProvider::probe(llm.as_ref()).await }
            })
            .advisory()
            .at_most_every(LLM_PROBE_INTERVAL),
        ],
    )
    .spawn(stop_rx)
    .await;
    let purge = agentmesh_store::spawn_interaction_purge(log);
    let server = PlannerServiceServer::new(service).max_decoding_message_size(config.max_request_bytes);
    let grpc = agentmesh_server::grpc::router(tonic::service::Routes::new(server), &[SERVICE_NAME], health_service)?
        .layer(axum::middleware::from_fn_with_state(metrics.clone(), routes::observe_rpc));
    let render: agentmesh_server::probes::RenderMetrics = Arc::new(move || metrics.render());
    let app = agentmesh_server::stack(agentmesh_server::probes::router(render, readiness), grpc, &config.limits());
    tracing::info!(addr = %listener.local_addr()?, llm = %config.llm, "planner listening (gRPC and HTTP)");
    let result = agentmesh_server::serve("planner", listener, app, async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    })
    .await;
    purge.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_passwords() {
        let config = PlannerConfig {
            database_url: "postgres://app:hunter2@db/agentmesh".into(),
            llm_base_url: Some("https://user:s3cret@llm.internal/v1?api_key=k3y".into()),
            ..PlannerConfig::default()
        };
        let shown = format!("{config:?}");
        for secret in ["hunter2", "s3cret", "k3y"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("max_query_chars"), "{shown}");
    }
}
