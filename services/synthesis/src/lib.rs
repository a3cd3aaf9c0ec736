//! The agentmesh synthesis service: turns the results of a run into an
//! answer streamed from the model, and reviews whether the user's goal was
//! met. [`engine`] holds the prompts (with every piece of outside text
//! fenced as data) and the tolerant, checked reading of reviews; [`serve`]
//! runs it as the gRPC `SynthesisService`, with the review's catalog from
//! discovery, the interaction log in the store, and `/metrics`, `/healthz`
//! and `/readyz` on the same port.

pub mod engine;
pub mod metrics;
pub mod service;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_llm::chain::ProviderOptions;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::synthesis_service_server::SynthesisServiceServer;
use agentmesh_server::{Dependency, HealthChecker};
use agentmesh_store::Retention;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use engine::{SynthesisSettings, Synthesizer};

/// Fully qualified gRPC name of the synthesis service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.SynthesisService";

/// How often the LLM's server is probed for `/readyz` (a TCP connection,
/// no request).
const LLM_PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// Configuration of the synthesis service (`Debug` hides the passwords in
/// its URLs).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SynthesisConfig {
    /// Address serving gRPC and HTTP (`/metrics`, `/healthz`, `/readyz`).
    pub listen: SocketAddr,
    /// Discovery's address (the catalog reviews may suggest from).
    pub discovery_url: String,
    /// Database for the interaction log (`sqlite://…` or `postgres://…`).
    pub database_url: String,
    /// `provider:model[,provider:model…]`, as for the planner.
    pub llm: String,
    /// Base URL overriding each provider's default (and its environment variable).
    pub llm_base_url: Option<String>,
    /// `auto`, `json_schema`, `json_object`, `tool` or `none` (reviews).
    pub llm_structured: String,
    /// Seconds each LLM call may take (per attempt).
    pub llm_timeout_secs: u64,
    /// Retries of an LLM call after 429, 5xx and timeouts.
    pub llm_retries: u32,
    /// PEM file of extra trusted CAs for HTTPS to the LLM server.
    pub llm_ca_file: Option<std::path::PathBuf>,
    /// Largest answer read from an LLM server, whole or streamed, in bytes.
    pub llm_max_response_bytes: usize,
    /// Most tokens of an answer.
    pub answer_max_tokens: u32,
    /// Most tokens of a review.
    pub review_max_tokens: u32,
    /// Sampling temperature of answers (reviews use 0).
    pub temperature: f32,
    /// Longest step output shown to the model, in characters.
    pub max_output_chars: usize,
    /// Further attempts after a review that could not be read.
    pub review_retries: u32,
    /// Hours successful LLM calls are kept in the log.
    pub interaction_retention_hours: u64,
    /// Hours failed LLM calls are kept in the log.
    pub interaction_error_retention_hours: u64,
    /// Seconds between checks of discovery and the interaction-log store.
    pub health_check_interval_secs: f64,
    /// Largest accepted request, in bytes (step outputs included).
    pub max_request_bytes: usize,
    /// Seconds a request may take (a shorter `grpc-timeout` wins).
    pub request_timeout_secs: f64,
    /// Requests handled at once; more wait for a slot.
    pub max_concurrent_requests: usize,
    /// Longest query accepted, in characters.
    pub max_query_chars: usize,
}

impl std::fmt::Debug for SynthesisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
            llm_max_response_bytes,
            answer_max_tokens,
            review_max_tokens,
            temperature,
            max_output_chars,
            review_retries,
            interaction_retention_hours,
            interaction_error_retention_hours,
            health_check_interval_secs,
            max_request_bytes,
            request_timeout_secs,
            max_concurrent_requests,
            max_query_chars,
        } = self;
        f.debug_struct("SynthesisConfig")
            .field("listen", listen)
            .field("discovery_url", discovery_url)
            .field("database_url", &agentmesh_server::redact(database_url))
            .field("llm", llm)
            .field("llm_base_url", &llm_base_url.as_deref().map(agentmesh_server::redact))
            .field("llm_structured", llm_structured)
            .field("llm_timeout_secs", llm_timeout_secs)
            .field("llm_retries", llm_retries)
            .field("llm_ca_file", llm_ca_file)
            .field("llm_max_response_bytes", llm_max_response_bytes)
            .field("answer_max_tokens", answer_max_tokens)
            .field("review_max_tokens", review_max_tokens)
            .field("temperature", temperature)
            .field("max_output_chars", max_output_chars)
            .field("review_retries", review_retries)
            .field("interaction_retention_hours", interaction_retention_hours)
            .field("interaction_error_retention_hours", interaction_error_retention_hours)
            .field("health_check_interval_secs", health_check_interval_secs)
            .field("max_request_bytes", max_request_bytes)
            .field("request_timeout_secs", request_timeout_secs)
            .field("max_concurrent_requests", max_concurrent_requests)
            .field("max_query_chars", max_query_chars)
            .finish()
    }
}

impl Default for SynthesisConfig {
    fn default() -> Self {
        let engine = SynthesisSettings::default();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7403)),
            discovery_url: "http://127.0.0.1:7400".into(),
            database_url: "sqlite://.agentmesh/agentmesh.db".into(),
            llm: String::new(),
            llm_base_url: None,
            llm_structured: "auto".into(),
            llm_timeout_secs: 120,
            llm_retries: 3,
            llm_ca_file: None,
            llm_max_response_bytes: agentmesh_llm::DEFAULT_MAX_RESPONSE_BYTES,
            answer_max_tokens: engine.answer_max_tokens,
            review_max_tokens: engine.review_max_tokens,
            temperature: engine.temperature,
            max_output_chars: engine.max_output_chars,
            review_retries: engine.review_retries,
            interaction_retention_hours: 24,
            interaction_error_retention_hours: 24 * 7,
            health_check_interval_secs: 2.0,
            max_request_bytes: 16 * 1024 * 1024,
            request_timeout_secs: 600.0,
            max_concurrent_requests: 1_000,
            max_query_chars: 4_000,
        }
    }
}

impl SynthesisConfig {
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
        anyhow::ensure!(self.answer_max_tokens >= 16, "answer_max_tokens must be at least 16");
        anyhow::ensure!(self.review_max_tokens >= 64, "review_max_tokens must be at least 64");
        anyhow::ensure!(
            self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature),
            "temperature must be between 0 and 2, got {}",
            self.temperature
        );
        anyhow::ensure!(self.max_output_chars >= 100, "max_output_chars must be at least 100");
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
    pub fn provider_options(&self) -> ProviderOptions {
        ProviderOptions {
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

    fn settings(&self) -> SynthesisSettings {
        SynthesisSettings {
            answer_max_tokens: self.answer_max_tokens,
            review_max_tokens: self.review_max_tokens,
            temperature: self.temperature,
            max_output_chars: self.max_output_chars,
            review_retries: self.review_retries,
            ..SynthesisSettings::default()
        }
    }
}

/// Binds `config.listen` and serves until `shutdown` resolves.
pub async fn serve(config: SynthesisConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::net::listen(config.listen)
        .with_context(|| format!("binding synthesis to {}", config.listen))?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: SynthesisConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let llm = Arc::new(agentmesh_llm::chain::build(&config.llm, &config.provider_options())?);
    let log =
        agentmesh_store::connect_interaction_log(&config.database_url).await.context("opening the interaction log")?;
    let discovery_channel = tonic::transport::Endpoint::from_shared(config.discovery_url.clone())
        .with_context(|| format!("discovery url `{}`", config.discovery_url))?
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy();
    let discovery = DiscoveryServiceClient::new(agentmesh_telemetry::rpc::traced(discovery_channel.clone()));
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let service = service::SynthesisGrpc {
        inner: Arc::new(service::Inner {
            synthesizer: Synthesizer::new(config.settings()),
            llm: llm.clone(),
            discovery,
            log: log.clone(),
            retention: Retention {
                ok: Duration::from_secs(config.interaction_retention_hours * 3600),
                error: Duration::from_secs(config.interaction_error_retention_hours * 3600),
            },
            metrics: metrics.clone(),
            max_query_chars: config.max_query_chars,
        }),
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
    let server = SynthesisServiceServer::new(service).max_decoding_message_size(config.max_request_bytes);
    let grpc = agentmesh_server::grpc::router(tonic::service::Routes::new(server), &[SERVICE_NAME], health_service)?;
    let render: agentmesh_server::probes::RenderMetrics = Arc::new(move || metrics.render());
    let app = agentmesh_server::stack(agentmesh_server::probes::router(render, readiness), grpc, &config.limits());
    tracing::info!(addr = %listener.local_addr()?, llm = %config.llm, "synthesis listening (gRPC and HTTP)");
    let result = agentmesh_server::serve("synthesis", listener, app, async move {
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
        let config = SynthesisConfig {
            database_url: "postgres://app:hunter2@db/agentmesh".into(),
            llm_base_url: Some("https://user:s3cret@llm.internal/v1?api_key=k3y".into()),
            ..SynthesisConfig::default()
        };
        let shown = format!("{config:?}");
        for secret in ["hunter2", "s3cret", "k3y"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("answer_max_tokens"), "{shown}");
    }
}
