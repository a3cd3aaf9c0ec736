//! Building the LLM provider from `--llm provider:model[,provider:model…]`:
//! a list is a fallback chain that moves on after unavailability and auth
//! failures, never after a bad request.

use std::path::Path;

use agentmesh_llm::openai::{OPENAI_BASE_URL, OpenAiCompatible, OpenAiConfig};
use agentmesh_llm::replay::ReplayProvider;
use agentmesh_llm::{Completion, CompletionRequest, LlmError, LlmProvider, StructuredMode, StructuredSetting};
use async_trait::async_trait;

/// Tries providers in order.
pub struct FallbackChain {
    providers: Vec<Box<dyn LlmProvider>>,
}

#[async_trait]
impl LlmProvider for FallbackChain {
    fn name(&self) -> &str {
        self.providers.first().map_or("none", |p| p.name())
    }

    fn model(&self) -> &str {
        self.providers.first().map_or("none", |p| p.model())
    }

    fn structured_mode(&self) -> Option<StructuredMode> {
        self.providers.first().and_then(|p| p.structured_mode())
    }

    async fn complete(&self, request: &CompletionRequest) -> Result<Completion, LlmError> {
        let mut last = LlmError::Config("no LLM provider configured; pass --llm provider:model".into());
        for provider in &self.providers {
            match provider.complete(request).await {
                Ok(c) => return Ok(c),
                Err(e) if e.should_fall_back() => {
                    tracing::warn!(provider = provider.name(), model = provider.model(), error = %e, "LLM provider failed; trying the next");
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }
}

/// Builds the provider chain from a spec such as `openai:gpt-4o-mini` or
/// `replay:demo/replay.json`. API keys come only from the environment
/// (`OPENAI_API_KEY`); the base URL from `base_url`, else `OPENAI_BASE_URL`.
pub fn build(spec: &str, base_url: Option<&str>, structured: &str) -> Result<FallbackChain, LlmError> {
    let structured: StructuredSetting = structured.parse().map_err(LlmError::Config)?;
    let mut providers: Vec<Box<dyn LlmProvider>> = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (kind, rest) = entry.split_once(':').ok_or_else(|| {
            LlmError::Config(format!("`{entry}` must have the form provider:model (openai:MODEL or replay:FILE)"))
        })?;
        match kind {
            "openai" | "openai-compatible" | "ollama" | "vllm" | "llamacpp" => {
                let base =
                    base_url.map(str::to_owned).or_else(|| std::env::var("OPENAI_BASE_URL").ok()).unwrap_or_else(
                        || if kind == "ollama" { "http://127.0.0.1:11434/v1".into() } else { OPENAI_BASE_URL.into() },
                    );
                let mut config = OpenAiConfig::new(base, rest);
                config.api_key = std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty());
                config.structured = structured;
                providers.push(Box::new(OpenAiCompatible::new(config)?));
            }
            "replay" => providers.push(Box::new(ReplayProvider::from_file(Path::new(rest))?)),
            other => {
                return Err(LlmError::Config(format!(
                    "unknown LLM provider `{other}`; available here: openai (and OpenAI-compatible servers), replay"
                )));
            }
        }
    }
    Ok(FallbackChain { providers })
}
