//! The LLM settings of every service that calls a model (the planner and
//! synthesis), defined once and read from the service's own table
//! (`[planner] llm = "openai:gpt-4o"`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::chain::ProviderOptions;
use crate::{DEFAULT_MAX_RESPONSE_BYTES, HttpSettings, RetryPolicy};

/// Which model to call, how to reach it, and how long its calls are logged.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LlmSettings {
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
    pub llm_ca_file: Option<PathBuf>,
    /// Largest answer read from an LLM server, whole or streamed, in bytes.
    pub llm_max_response_bytes: usize,
    /// Hours successful LLM calls are kept in the interaction log.
    pub interaction_retention_hours: u64,
    /// Hours failed LLM calls are kept in the interaction log.
    pub interaction_error_retention_hours: u64,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            llm: String::new(),
            llm_base_url: None,
            llm_structured: "auto".into(),
            llm_timeout_secs: 60,
            llm_retries: 3,
            llm_ca_file: None,
            llm_max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            interaction_retention_hours: 24,
            interaction_error_retention_hours: 24 * 7,
        }
    }
}

impl std::fmt::Debug for LlmSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        agentmesh_telemetry::secrets::debug_settings("LlmSettings", self, f)
    }
}

impl LlmSettings {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.llm.trim().is_empty(),
            "no LLM configured: pass --llm openai:MODEL (with --llm-base-url) or --llm replay:FILE"
        );
        anyhow::ensure!(self.llm_max_response_bytes >= 1024, "llm_max_response_bytes must be at least 1024");
        Ok(())
    }

    /// How to reach the providers of the chain.
    pub fn provider_options(&self) -> ProviderOptions {
        ProviderOptions {
            base_url: self.llm_base_url.clone(),
            structured: self.llm_structured.clone(),
            http: HttpSettings {
                timeout: Duration::from_secs(self.llm_timeout_secs.max(1)),
                retry: RetryPolicy { max_retries: self.llm_retries, ..RetryPolicy::default() },
                ca_file: self.llm_ca_file.clone(),
                max_response_bytes: self.llm_max_response_bytes,
            },
        }
    }

    /// The provider chain these settings name.
    pub fn build(&self) -> anyhow::Result<crate::chain::FallbackChain> {
        Ok(crate::chain::build(&self.llm, &self.provider_options())?)
    }

    /// How long successful and failed calls are kept in the interaction log.
    pub fn retention(&self) -> (Duration, Duration) {
        let hours = |h: u64| Duration::from_secs(h.saturating_mul(3600));
        (hours(self.interaction_retention_hours), hours(self.interaction_error_retention_hours))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_passwords_in_the_base_url() {
        let settings = LlmSettings {
            llm_base_url: Some("https://user:s3cret@llm.internal/v1?api_key=k3y".into()),
            ..LlmSettings::default()
        };
        let shown = format!("{settings:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("k3y"), "{shown}");
        assert!(shown.contains("llm_max_response_bytes"), "{shown}");
    }

    #[test]
    fn a_missing_model_is_refused_with_what_to_pass() {
        let missing = LlmSettings::default().validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(missing.contains("--llm openai:MODEL"), "{missing}");
    }
}
