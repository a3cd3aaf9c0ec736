//! The agentmesh planner: turns a request into a plan over the capabilities
//! that really exist. [`engine::Planner`] holds the planning loop
//! (pre-selection, generation with a constrained schema, parsing, validation
//! against the set shown, and recovery); [`serve`] runs it as the gRPC
//! `PlannerService`, with the catalog from discovery and the interaction log
//! in the store, and `/metrics`, `/healthz` and `/readyz` on the same port.

pub mod engine;
pub mod metrics;
pub mod prompt;
/// The provider chain (`--llm a:m,b:m`), shared with the other LLM services.
pub use agentmesh_llm::chain as providers;
pub mod routes;
pub mod semantic;
pub mod service;

use std::future::Future;
use std::sync::Arc;

use agentmesh_core::plan::PlanBounds;
use agentmesh_proto::v1::planner_service_server::PlannerServiceServer;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

/// Fully qualified gRPC name of the planner service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.PlannerService";

pub use agentmesh_llm::LlmSettings;
pub use agentmesh_server::ServiceSettings;
pub use engine::{Interaction, InteractionKind, PlanOutcome, PlanStats, Planner, PlannerSettings, PlanningError};

/// Configuration of the planner service: the `[planner]` table (`Debug`
/// hides passwords and keys).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", default)]
pub struct PlannerConfig {
    /// Where it listens, the interaction log's database, limits, health checks.
    #[serde(flatten, skip_deserializing)]
    pub service: ServiceSettings,
    /// The model and how it is reached.
    #[serde(flatten, skip_deserializing)]
    pub llm: LlmSettings,
    /// Discovery's address.
    pub discovery_url: String,
    /// The orchestrator's own agent ids: never planned for.
    #[serde(deserialize_with = "agentmesh_server::list_or_commas")]
    pub self_agent_ids: Vec<String>,
    /// Pre-selection runs above this many capabilities.
    pub preselect_threshold: usize,
    /// Retries after an answer that is not a plan.
    pub parse_retries: u32,
    /// Retries after a hallucinated agent or capability.
    pub hallucination_retries: u32,
    /// Longest query accepted, in characters (`INVALID_ARGUMENT` above it).
    pub max_query_chars: usize,
    /// Most steps a plan may have (the planning schema's bound).
    pub max_plan_steps: usize,
    /// Embeddings for ranking capabilities by meaning as well as by words:
    /// `local` (all-MiniLM-L6-v2 in process, from `AGENTMESH_EMBEDDINGS_DIR`
    /// or `~/.cache/agentmesh/models/all-MiniLM-L6-v2`; words only when its
    /// files are not there), `local:DIR`, `openai:MODEL` (and `vllm`,
    /// `llamacpp`, `ollama`), `gemini:MODEL`, or `none`.
    pub embeddings: String,
    /// Base URL of the embedding server (else the provider's environment variable).
    pub embeddings_base_url: Option<String>,
    /// With embeddings: the relevance (0 to 1) under which no capability
    /// fits and the plan has no step; 0 turns it off.
    pub min_relevance: f64,
}

agentmesh_server::flat_settings!(PlannerConfig { service, llm });

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            service: ServiceSettings {
                max_request_bytes: 4 * 1024 * 1024,
                // Planning with retries against a slow model takes minutes.
                request_timeout_secs: 600.0,
                ..ServiceSettings::on_port(7401)
            },
            llm: LlmSettings::default(),
            discovery_url: "http://127.0.0.1:7400".into(),
            self_agent_ids: Vec::new(),
            preselect_threshold: 20,
            parse_retries: 2,
            hallucination_retries: 1,
            max_query_chars: 4_000,
            max_plan_steps: PlanBounds::default().max_steps,
            embeddings: "local".into(),
            embeddings_base_url: None,
            min_relevance: engine::DEFAULT_MIN_RELEVANCE,
        }
    }
}

impl PlannerConfig {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.service.validate()?;
        self.llm.validate()?;
        agentmesh_server::check_service_url("discovery_url", &self.discovery_url)?;
        anyhow::ensure!(self.max_query_chars >= 1, "max_query_chars must be at least 1");
        anyhow::ensure!(
            (1..=50).contains(&self.max_plan_steps),
            "max_plan_steps must be between 1 and 50, got {}",
            self.max_plan_steps
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.min_relevance),
            "min_relevance must be between 0 and 1, got {}",
            self.min_relevance
        );
        Ok(())
    }
}

/// Binds `listen` and serves until `shutdown` resolves.
pub async fn serve(config: PlannerConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::service::bind("planner", config.service.listen)?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: PlannerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let reasoning = agentmesh_catalog::Reasoning::open(&config.service, &config.llm, &config.discovery_url).await?;
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let settings = PlannerSettings {
        preselect_threshold: config.preselect_threshold,
        parse_retries: config.parse_retries,
        hallucination_retries: config.hallucination_retries,
        bounds: PlanBounds { max_steps: config.max_plan_steps, ..PlanBounds::default() },
        min_relevance: config.min_relevance,
        ..Default::default()
    };
    let mut planner = Planner::new(settings);
    // The catalog stream ends with the planner: an open stream would hold
    // discovery's graceful shutdown (in one process, `agentmesh up`).
    let (stop, stopped) = tokio::sync::watch::channel(false);
    if let Some(semantic) = semantic(&config)? {
        let follow = semantic.clone().follow(reasoning.discovery.clone());
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = follow => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
        planner = planner.with_semantic(semantic);
    }
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    let service = service::PlannerGrpc {
        planner,
        llm: reasoning.llm.clone(),
        discovery: reasoning.discovery.clone(),
        log: reasoning.log.clone(),
        retention: reasoning.retention,
        self_agent_ids: config.self_agent_ids.clone(),
        metrics: metrics.clone(),
        max_query_chars: config.max_query_chars,
    };
    let server = PlannerServiceServer::new(service).max_decoding_message_size(config.service.max_request_bytes);
    let observed = metrics.clone();
    agentmesh_server::Service::new("planner", SERVICE_NAME, tonic::service::Routes::new(server))
        .authorize(access)
        .layer_grpc(move |grpc| grpc.layer(axum::middleware::from_fn_with_state(observed, routes::observe_rpc)))
        .metrics(move || metrics.render())
        .depends_on(reasoning.dependencies())
        .serve(&config.service, listener, shutdown)
        .await
}

/// The catalog's vector index, when `embeddings` is on (and, for the
/// default `local`, its files are there).
fn semantic(config: &PlannerConfig) -> anyhow::Result<Option<Arc<semantic::Semantic>>> {
    use agentmesh_llm::embeddings::{self, Built, EmbeddingOptions};
    let options = EmbeddingOptions {
        base_url: config.embeddings_base_url.clone(),
        http: agentmesh_llm::HttpSettings {
            timeout: std::time::Duration::from_secs(config.llm.llm_timeout_secs),
            ca_file: config.llm.llm_ca_file.clone(),
            ..Default::default()
        },
    };
    match embeddings::build(&config.embeddings, &options).context("embeddings")? {
        Built::On(embedder) => {
            tracing::info!(
                embedder = embedder.name(),
                min_relevance = config.min_relevance,
                "ranking capabilities by words and meaning"
            );
            Ok(Some(Arc::new(semantic::Semantic::new(embedder))))
        }
        Built::Off => {
            tracing::info!("embeddings off: ranking capabilities by words only");
            Ok(None)
        }
        Built::Missing(why) => {
            tracing::warn!("{why}; ranking capabilities by words only");
            Ok(None)
        }
    }
}

/// Which roles each call needs when authentication is on: clients,
/// services and operators; `ListInteractions` shows a client only the
/// calls made for it (its own requests, through the gateway or directly).
fn access(method: &axum::http::Method, path: &str) -> agentmesh_server::auth::Access {
    agentmesh_server::auth::mesh_callers(method, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_passwords() {
        let mut config = PlannerConfig::default();
        config.service.database_url = "postgres://app:hunter2@db/agentmesh".into();
        config.llm.llm_base_url = Some("https://user:s3cret@llm.internal/v1?api_key=k3y".into());
        let shown = format!("{config:?}");
        for secret in ["hunter2", "s3cret", "k3y"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("max_query_chars"), "{shown}");
    }
}
