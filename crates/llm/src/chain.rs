//! Building the LLM provider from `--llm provider:model[,provider:model…]`:
//! a list is a fallback chain that moves on after unavailability and auth
//! failures, never after a bad request. A request's model preference puts
//! the providers that serve it first.

use std::path::Path;

use crate::OnText;
use crate::anthropic::{ANTHROPIC_BASE_URL, Anthropic, AnthropicConfig};
use crate::gemini::{GEMINI_BASE_URL, Gemini, GeminiConfig};
use crate::models::Family;
use crate::openai::{OPENAI_BASE_URL, OpenAiCompatible, OpenAiConfig};
use crate::replay::ReplayProvider;
use crate::{Completion, CompletionRequest, HttpSettings, LlmError, LlmProvider, StructuredMode, StructuredSetting};
use async_trait::async_trait;
use secrecy::SecretString;

/// Tries providers in order.
pub struct FallbackChain {
    providers: Vec<Box<dyn LlmProvider>>,
}

impl FallbackChain {
    /// The providers in the order to try for `request`: those serving its
    /// preferred model first, the rest after, each group in configured order.
    fn order(&self, request: &CompletionRequest) -> Vec<&dyn LlmProvider> {
        let (mut first, rest): (Vec<&dyn LlmProvider>, Vec<&dyn LlmProvider>) = self
            .providers
            .iter()
            .map(Box::as_ref)
            .partition(|p| request.model.as_deref().is_none_or(|m| p.accepts_model(m)));
        first.extend(rest);
        first
    }
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

    async fn generate(&self, request: &CompletionRequest, on_text: OnText<'_>) -> Result<Completion, LlmError> {
        self.run(request, on_text).await
    }

    fn accepts_model(&self, name: &str) -> bool {
        self.providers.iter().any(|p| p.accepts_model(name))
    }

    /// Reachable when any provider of the chain is; the detail names each.
    async fn probe(&self) -> Result<String, String> {
        let (mut ok, mut details) = (false, Vec::new());
        for provider in &self.providers {
            let answer = provider.probe().await;
            ok |= answer.is_ok();
            details.push(format!("{}:{}: {}", provider.name(), provider.model(), answer.unwrap_or_else(|e| e)));
        }
        let detail = details.join("; ");
        if ok { Ok(detail) } else { Err(detail) }
    }
}

impl FallbackChain {
    async fn run(&self, request: &CompletionRequest, mut on_text: OnText<'_>) -> Result<Completion, LlmError> {
        let mut last = LlmError::Config("no LLM provider configured; pass --llm provider:model".into());
        let order = self.order(request);
        let count = order.len();
        for (i, provider) in order.into_iter().enumerate() {
            let result = match on_text.as_deref_mut() {
                Some(on_text) => crate::generate_traced(provider, request, Some(on_text)).await,
                None => crate::generate_traced(provider, request, None).await,
            };
            match result {
                Ok(c) => return Ok(c),
                Err(e) if e.should_fall_back() && i + 1 < count => {
                    tracing::warn!(provider = provider.name(), model = provider.model(), error = %e, "LLM provider failed; trying the next");
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }
}

/// Every provider name `--llm` accepts.
pub const PROVIDER_NAMES: &str = "openai, openai-compatible, anthropic, gemini, google, ollama, vllm, llamacpp, replay";

/// A hosted provider's public endpoint needs a key: say which variable is
/// missing at start-up, not a DNS or 401 failure at the first request.
/// `setting` is where another base URL is given (`--llm-base-url`).
pub(crate) fn require_key(
    (spec, setting): (&str, &str),
    base_url: &str,
    public: &str,
    key: Option<&SecretString>,
    variables: &str,
) -> Result<(), LlmError> {
    if key.is_none() && base_url.trim_end_matches('/') == public {
        return Err(LlmError::Config(format!(
            "`{spec}` uses {public}, which needs an API key: no {variables} is set. Set it, or point \
             {setting} at a server that needs none (e.g. a local OpenAI-compatible server)"
        )));
    }
    Ok(())
}

/// A base URL must name its scheme: `127.0.0.1:8000/v1` would otherwise
/// fail at the first request with an error that does not say why.
pub(crate) fn with_scheme(url: String) -> Result<String, LlmError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(url);
    }
    // Without a scheme, anything before an `@` may be a password: left out.
    let shown = url.rsplit_once('@').map_or(url.as_str(), |(_, host)| host);
    Err(LlmError::Config(format!("the base URL `{shown}` has no http:// or https:// scheme: write http://{shown}")))
}

/// How to reach the providers named in `--llm`.
#[derive(Debug, Clone, Default)]
pub struct ProviderOptions {
    /// Base URL for every provider in the chain (else each one's usual
    /// environment variable, else its public endpoint).
    pub base_url: Option<String>,
    /// `auto`, `json_schema`, `json_object`, `tool` or `none` (OpenAI-compatible servers).
    pub structured: String,
    /// Timeouts, retries, extra CA.
    pub http: HttpSettings,
}

pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Ollama's `OLLAMA_HOST` is `host:port` or a URL, without `/v1`.
pub(crate) fn ollama_base() -> String {
    let host = env("OLLAMA_HOST").unwrap_or_else(|| "127.0.0.1:11434".into());
    let host = if host.contains("://") { host } else { format!("http://{host}") };
    format!("{}/v1", host.trim_end_matches('/'))
}

/// Builds the provider chain from a spec such as `openai:gpt-4o-mini`,
/// `anthropic:sonnet,gemini:flash` or `replay:demo/replay.json`. API keys
/// come only from the environment (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`,
/// `GEMINI_API_KEY` or `GOOGLE_API_KEY`) and are never logged.
pub fn build(spec: &str, options: &ProviderOptions) -> Result<FallbackChain, LlmError> {
    let structured: StructuredSetting = options.structured.parse().map_err(LlmError::Config)?;
    let mut providers: Vec<Box<dyn LlmProvider>> = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (kind, rest) = entry.split_once(':').ok_or_else(|| {
            LlmError::Config(format!("`{entry}` must have the form provider:model ({PROVIDER_NAMES})"))
        })?;
        let base = |var: &str, default: &str| {
            options.base_url.clone().or_else(|| env(var)).unwrap_or_else(|| default.to_owned())
        };
        match kind {
            "openai" | "openai-compatible" | "ollama" | "vllm" | "llamacpp" => {
                let url = match kind {
                    "ollama" => options.base_url.clone().unwrap_or_else(ollama_base),
                    _ => base("OPENAI_BASE_URL", OPENAI_BASE_URL),
                };
                let mut config = OpenAiConfig::new(with_scheme(url)?, rest);
                config.api_key = env("OPENAI_API_KEY").map(SecretString::from);
                require_key(
                    (entry, "--llm-base-url"),
                    &config.base_url,
                    OPENAI_BASE_URL,
                    config.api_key.as_ref(),
                    "OPENAI_API_KEY",
                )?;
                config.structured = structured;
                config.family = if kind == "openai" && config.base_url == OPENAI_BASE_URL {
                    Family::OpenAi
                } else {
                    Family::Compatible
                };
                config.http = options.http.clone();
                providers.push(Box::new(OpenAiCompatible::new(config)?));
            }
            "anthropic" => {
                let mut config =
                    AnthropicConfig::new(with_scheme(base("ANTHROPIC_BASE_URL", ANTHROPIC_BASE_URL))?, rest);
                config.api_key = env("ANTHROPIC_API_KEY").map(SecretString::from);
                require_key(
                    (entry, "--llm-base-url"),
                    &config.base_url,
                    ANTHROPIC_BASE_URL,
                    config.api_key.as_ref(),
                    "ANTHROPIC_API_KEY",
                )?;
                config.http = options.http.clone();
                providers.push(Box::new(Anthropic::new(config)?));
            }
            "gemini" | "google" => {
                let mut config = GeminiConfig::new(with_scheme(base("GOOGLE_GEMINI_BASE_URL", GEMINI_BASE_URL))?, rest);
                config.api_key = env("GEMINI_API_KEY").or_else(|| env("GOOGLE_API_KEY")).map(SecretString::from);
                require_key(
                    (entry, "--llm-base-url"),
                    &config.base_url,
                    GEMINI_BASE_URL,
                    config.api_key.as_ref(),
                    "GEMINI_API_KEY (or GOOGLE_API_KEY)",
                )?;
                config.http = options.http.clone();
                providers.push(Box::new(Gemini::new(config)?));
            }
            "replay" => providers.push(Box::new(ReplayProvider::from_file(Path::new(rest))?)),
            other => {
                return Err(LlmError::Config(format!(
                    "unknown LLM provider `{other}`; available: {PROVIDER_NAMES} \
                     (openai-compatible, ollama, vllm and llamacpp: any OpenAI-compatible server with --llm-base-url)"
                )));
            }
        }
    }
    Ok(FallbackChain { providers })
}
