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
use std::sync::Arc;

use agentmesh_proto::v1::synthesis_service_server::SynthesisServiceServer;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

pub use agentmesh_llm::LlmSettings;
pub use agentmesh_server::ServiceSettings;
pub use engine::{SynthesisSettings, Synthesizer};

/// Fully qualified gRPC name of the synthesis service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.SynthesisService";

/// Configuration of the synthesis service: the `[synthesis]` table
/// (`Debug` hides passwords and keys).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", default)]
pub struct SynthesisConfig {
    /// Where it listens, the interaction log's database, limits, health checks.
    #[serde(flatten, skip_deserializing)]
    pub service: ServiceSettings,
    /// The model and how it is reached (`llm_structured` applies to reviews).
    #[serde(flatten, skip_deserializing)]
    pub llm: LlmSettings,
    /// Discovery's address (the catalog reviews may suggest from).
    pub discovery_url: String,
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
    /// Longest query accepted, in characters.
    pub max_query_chars: usize,
    /// Replace an answer that states values found neither in the step
    /// results nor in the request by an answer made of the results' values
    /// (sent whole instead of streamed). For small models.
    pub replace_ungrounded_answers: bool,
}

agentmesh_server::flat_settings!(SynthesisConfig { service, llm });

impl Default for SynthesisConfig {
    fn default() -> Self {
        let engine = SynthesisSettings::default();
        Self {
            service: ServiceSettings {
                // Step outputs are part of the request.
                max_request_bytes: 16 * 1024 * 1024,
                request_timeout_secs: 600.0,
                ..ServiceSettings::on_port(7403)
            },
            llm: LlmSettings { llm_timeout_secs: 120, ..LlmSettings::default() },
            discovery_url: "http://127.0.0.1:7400".into(),
            answer_max_tokens: engine.answer_max_tokens,
            review_max_tokens: engine.review_max_tokens,
            temperature: engine.temperature,
            max_output_chars: engine.max_output_chars,
            review_retries: engine.review_retries,
            max_query_chars: 4_000,
            replace_ungrounded_answers: engine.replace_ungrounded,
        }
    }
}

impl SynthesisConfig {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.service.validate()?;
        self.llm.validate()?;
        agentmesh_server::check_service_url("discovery_url", &self.discovery_url)?;
        anyhow::ensure!(self.max_query_chars >= 1, "max_query_chars must be at least 1");
        anyhow::ensure!(self.answer_max_tokens >= 16, "answer_max_tokens must be at least 16");
        anyhow::ensure!(self.review_max_tokens >= 64, "review_max_tokens must be at least 64");
        anyhow::ensure!(
            self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature),
            "temperature must be between 0 and 2, got {}",
            self.temperature
        );
        anyhow::ensure!(self.max_output_chars >= 100, "max_output_chars must be at least 100");
        Ok(())
    }

    fn settings(&self) -> SynthesisSettings {
        SynthesisSettings {
            answer_max_tokens: self.answer_max_tokens,
            review_max_tokens: self.review_max_tokens,
            temperature: self.temperature,
            max_output_chars: self.max_output_chars,
            review_retries: self.review_retries,
            replace_ungrounded: self.replace_ungrounded_answers,
            ..SynthesisSettings::default()
        }
    }
}

/// Binds `listen` and serves until `shutdown` resolves.
pub async fn serve(config: SynthesisConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::service::bind("synthesis", config.service.listen)?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: SynthesisConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let reasoning = agentmesh_catalog::Reasoning::open(&config.service, &config.llm, &config.discovery_url).await?;
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let service = service::SynthesisGrpc {
        inner: Arc::new(service::Inner {
            synthesizer: Synthesizer::new(config.settings()),
            llm: reasoning.llm.clone(),
            discovery: reasoning.discovery.clone(),
            log: reasoning.log.clone(),
            retention: reasoning.retention,
            metrics: metrics.clone(),
            max_query_chars: config.max_query_chars,
        }),
    };
    let server = SynthesisServiceServer::new(service).max_decoding_message_size(config.service.max_request_bytes);
    agentmesh_server::Service::new("synthesis", SERVICE_NAME, tonic::service::Routes::new(server))
        .authorize(agentmesh_server::auth::mesh_callers)
        .metrics(move || metrics.render())
        .depends_on(reasoning.dependencies())
        .serve(&config.service, listener, shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_passwords() {
        let mut config = SynthesisConfig::default();
        config.service.database_url = "postgres://app:hunter2@db/agentmesh".into();
        config.llm.llm_base_url = Some("https://user:s3cret@llm.internal/v1?api_key=k3y".into());
        let shown = format!("{config:?}");
        for secret in ["hunter2", "s3cret", "k3y"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("answer_max_tokens"), "{shown}");
    }
}
