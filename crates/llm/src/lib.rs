//! LLM providers. An [`LlmProvider`] completes a chat, optionally asking the
//! model for JSON that fits a schema; providers differ in how (or whether)
//! they can enforce it, which [`StructuredMode`] names.
//!
//! - [`openai::OpenAiCompatible`]: OpenAI chat completions and every server
//!   speaking the same API (vLLM, Ollama, llama.cpp, llama-cpp-python,
//!   LM Studio, Groq, DeepSeek…), with each structured-output dialect and
//!   automatic fallback between them.
//! - [`anthropic::Anthropic`]: Anthropic's Messages API, structured output
//!   through a forced tool, extended thinking.
//! - [`gemini::Gemini`]: Google's `generateContent`, with `responseSchema`
//!   and `thinkingConfig`.
//! - [`replay::ReplayProvider`]: scripted answers from a file, for tests and
//!   the offline demo; it says so in its logs and in every completion.
//!
//! Every provider also streams ([`LlmProvider::stream`]) over server-sent
//! events, and shares one HTTP client setup ([`HttpSettings`]: HTTPS with the
//! system's roots, timeouts, retries with backoff and jitter).

pub mod anthropic;
pub mod chain;
pub mod embeddings;
#[cfg(test)]
mod fuzz;
pub mod gemini;
mod http;
pub mod models;
pub mod openai;
pub mod replay;
pub mod settings;
mod traced;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use agentmesh_telemetry::http::RetryPolicy;
pub use http::{DEFAULT_MAX_RESPONSE_BYTES, HttpSettings, client_builder, install_tls_provider};
pub use settings::LlmSettings;
pub use traced::generate_traced;

/// How a provider makes the model answer in JSON that fits a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredMode {
    /// OpenAI's `response_format: {"type": "json_schema", "json_schema": {...}}` (strict).
    JsonSchema,
    /// `response_format: {"type": "json_object", "schema": {...}}` (llama-cpp-python and others).
    JsonObject,
    /// A forced call of one function whose parameters are the schema.
    Tool,
    /// No enforcement: the schema is only described in the prompt.
    None,
}

impl StructuredMode {
    /// The order `auto` tries modes in, strongest first.
    pub const AUTO_ORDER: [Self; 4] = [Self::JsonSchema, Self::JsonObject, Self::Tool, Self::None];

    /// Lowercase name, as in `--llm-structured`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::JsonSchema => "json_schema",
            Self::JsonObject => "json_object",
            Self::Tool => "tool",
            Self::None => "none",
        }
    }
}

impl fmt::Display for StructuredMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which structured-output mode to use: one, or the first a server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StructuredSetting {
    /// Try [`StructuredMode::AUTO_ORDER`], remembering what works per base URL.
    #[default]
    Auto,
    /// Always this mode.
    Fixed(StructuredMode),
}

impl std::str::FromStr for StructuredSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "json_schema" => Ok(Self::Fixed(StructuredMode::JsonSchema)),
            "json_object" => Ok(Self::Fixed(StructuredMode::JsonObject)),
            "tool" => Ok(Self::Fixed(StructuredMode::Tool)),
            "none" => Ok(Self::Fixed(StructuredMode::None)),
            other => Err(format!(
                "unknown structured-output mode `{other}`; use auto, json_schema, json_object, tool or none"
            )),
        }
    }
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The request.
    User,
    /// An earlier answer.
    Assistant,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub content: String,
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self { role: Role::System, content: content.into() }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self { role: Role::User, content: content.into() }
    }
}

pub use agentmesh_core::ReasoningEffort;

/// A schema the answer must fit.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseSchema {
    /// A short name (`[A-Za-z0-9_-]`), e.g. `plan`.
    pub name: String,
    /// The JSON Schema.
    pub schema: Value,
}

/// A completion request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CompletionRequest {
    /// The conversation, system message first.
    pub messages: Vec<Message>,
    /// Sampling temperature (ignored by reasoning models).
    pub temperature: Option<f32>,
    /// Most tokens to generate.
    pub max_tokens: Option<u32>,
    /// JSON the answer must fit, when wanted.
    pub response_schema: Option<ResponseSchema>,
    /// Reasoning effort, for models that take one.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Preferred model, by name or alias (see [`models`]); `None`: the
    /// provider's configured model.
    pub model: Option<String>,
}

impl CompletionRequest {
    /// The system messages, joined, for APIs that take them apart from the
    /// conversation.
    pub fn system_text(&self) -> Option<String> {
        let parts: Vec<&str> =
            self.messages.iter().filter(|m| m.role == Role::System).map(|m| m.content.as_str()).collect();
        (!parts.is_empty()).then(|| parts.join("\n\n"))
    }

    /// The conversation without the system messages.
    pub fn turns(&self) -> impl Iterator<Item = &Message> {
        self.messages.iter().filter(|m| m.role != Role::System)
    }
}

/// Tokens used by a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
}

/// A completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The answer (for the tool mode, the function arguments).
    pub text: String,
    /// Provider name (`openai`, `replay`, …).
    pub provider: String,
    /// Model that answered.
    pub model: String,
    /// Structured-output mode used, if a schema was asked for.
    pub structured_mode: Option<StructuredMode>,
    /// Token usage, when reported.
    pub usage: Usage,
    /// Wall time of the call, retries included.
    pub latency: Duration,
    /// The model stopped at the token limit (`finish_reason: length`,
    /// `stop_reason: max_tokens`, `MAX_TOKENS`): the answer is cut off.
    pub truncated: bool,
}

/// Where a streamed answer's text goes as it arrives, when the caller wants it.
pub type OnText<'a> = Option<&'a mut (dyn for<'t> FnMut(&'t str) + Send)>;

/// How often readiness checks probe an LLM's server (a TCP connection, no
/// request): a hosted API is not asked every few seconds.
pub const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a completion failed.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The server rejected the request itself (4xx other than 401/403/408/429):
    /// retrying or moving to another provider will not help.
    #[error("the LLM server rejected the request (HTTP {status}): {body}")]
    BadRequest {
        /// HTTP status.
        status: u16,
        /// Response body (truncated).
        body: String,
    },
    /// Credentials missing or refused.
    #[error("the LLM server refused the credentials (HTTP {status}); check the API key environment variable")]
    Auth {
        /// HTTP status.
        status: u16,
    },
    /// Rate limiting, server errors or timeouts that outlasted the retries.
    #[error("the LLM server is unavailable after {attempts} attempts: {message}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// Last failure.
        message: String,
    },
    /// The answer could not be read.
    #[error("the LLM answer could not be read: {0}")]
    InvalidResponse(String),
    /// Configuration problem.
    #[error("LLM configuration: {0}")]
    Config(String),
}

impl LlmError {
    /// Whether a fallback chain should try the next provider: timeouts, 5xx
    /// and auth failures, never a request the server called bad.
    pub fn should_fall_back(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Auth { .. })
    }
}

/// A source of completions.
#[async_trait]
pub trait LlmProvider: Send + Sync {
    /// Provider name (`openai`, `replay`, …).
    fn name(&self) -> &str;
    /// Model used when the request names none.
    fn model(&self) -> &str;
    /// The structured-output mode this provider will use next for a schema
    /// (after `auto` has settled, the one that worked).
    fn structured_mode(&self) -> Option<StructuredMode>;
    /// Completes a chat. With `on_text` it streams: each piece of the answer
    /// goes to `on_text` as the server produces it (a provider that cannot
    /// stream delivers the answer in one piece), and the whole completion is
    /// returned at the end.
    async fn generate(&self, request: &CompletionRequest, on_text: OnText<'_>) -> Result<Completion, LlmError>;

    /// Completes a chat.
    async fn complete(&self, request: &CompletionRequest) -> Result<Completion, LlmError> {
        self.generate(request, None).await
    }

    /// Completes a chat, streaming the answer to `on_text`.
    async fn stream(
        &self,
        request: &CompletionRequest,
        on_text: &mut (dyn for<'t> FnMut(&'t str) + Send),
    ) -> Result<Completion, LlmError> {
        self.generate(request, Some(on_text)).await
    }

    /// Whether the provider's server can be reached now, without spending a
    /// token: `Ok(what it answered)` or `Err(why not)`. Used by readiness
    /// checks, at most every [`PROBE_INTERVAL`]; the default (a provider
    /// with no server) always answers.
    async fn probe(&self) -> Result<String, String> {
        Ok("no server to reach".into())
    }

    /// Whether this provider can serve the model `name` (a name or an alias),
    /// so a fallback chain can try first the providers that serve a preference.
    fn accepts_model(&self, name: &str) -> bool {
        let _ = name;
        true
    }
}

/// The prompt line that asks for JSON when nothing can enforce it: the schema
/// itself when it is small, else a pointer to the format described above.
pub(crate) fn schema_instruction(schema: &ResponseSchema) -> String {
    let text = schema.schema.to_string();
    if text.len() <= 2_000 {
        format!("Answer with one JSON value only, no prose, that validates against this JSON Schema:\n{text}")
    } else {
        "Answer with one JSON object only, no prose, in the format described above.".to_owned()
    }
}

/// A provider with a caller's preferences (model, reasoning effort) applied
/// to every request that does not set its own; one per planning request.
pub struct Preferred<'a> {
    inner: &'a dyn LlmProvider,
    model: Option<String>,
    reasoning_effort: Option<ReasoningEffort>,
}

impl<'a> Preferred<'a> {
    /// `inner` with these preferences (empty model: none).
    pub fn new(inner: &'a dyn LlmProvider, model: Option<String>, reasoning_effort: Option<ReasoningEffort>) -> Self {
        Self { inner, model: model.filter(|m| !m.trim().is_empty()), reasoning_effort }
    }

    fn apply(&self, request: &CompletionRequest) -> CompletionRequest {
        let mut request = request.clone();
        if request.model.is_none() {
            request.model.clone_from(&self.model);
        }
        if request.reasoning_effort.is_none() {
            request.reasoning_effort = self.reasoning_effort;
        }
        request
    }
}

#[async_trait]
impl LlmProvider for Preferred<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn structured_mode(&self) -> Option<StructuredMode> {
        self.inner.structured_mode()
    }

    async fn generate(&self, request: &CompletionRequest, on_text: OnText<'_>) -> Result<Completion, LlmError> {
        self.inner.generate(&self.apply(request), on_text).await
    }

    fn accepts_model(&self, name: &str) -> bool {
        self.inner.accepts_model(name)
    }
}
