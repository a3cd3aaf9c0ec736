//! OpenAI chat completions, and every server that speaks the same API.
//!
//! Servers take a schema in different ways; [`StructuredSetting::Auto`]
//! tries them strongest first ([`StructuredMode::AUTO_ORDER`]) when a server
//! rejects one, remembers what worked per base URL for the whole process,
//! and logs the choice once.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::{
    Completion, CompletionRequest, LlmError, LlmProvider, Message, RetryPolicy, StructuredMode, StructuredSetting,
    Usage,
};

/// Default base URL of OpenAI's API.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// Settings of an OpenAI-compatible provider.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Base URL, up to and without `/chat/completions`.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// Bearer token (read from the environment by the caller; never logged).
    pub api_key: Option<String>,
    /// How to ask for JSON that fits a schema.
    pub structured: StructuredSetting,
    /// Treat the model as a reasoning model (`max_completion_tokens`,
    /// `reasoning_effort`, no temperature); `None`: decide from its name.
    pub reasoning: Option<bool>,
    /// Per-attempt timeout.
    pub timeout: Duration,
    /// Retries on 429, 5xx and timeouts.
    pub retry: RetryPolicy,
}

impl OpenAiConfig {
    /// Settings for `model` at `base_url`, with the defaults.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            structured: StructuredSetting::Auto,
            reasoning: None,
            timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
        }
    }
}

/// What `auto` learned, per base URL, for this process.
fn learned() -> &'static Mutex<HashMap<String, StructuredMode>> {
    static LEARNED: OnceLock<Mutex<HashMap<String, StructuredMode>>> = OnceLock::new();
    LEARNED.get_or_init(Mutex::default)
}

/// A provider for OpenAI's chat completions API and compatible servers.
pub struct OpenAiCompatible {
    config: OpenAiConfig,
    endpoint: String,
    client: reqwest::Client,
}

/// One HTTP exchange's failure, before retries decide.
enum Failure {
    /// Worth retrying (429, 5xx, timeouts, connection errors).
    Transient { message: String, retry_after: Option<Duration> },
    /// The server does not accept this structured-output mode.
    ModeRejected { status: u16, body: String },
    /// Final.
    Fatal(LlmError),
}

impl OpenAiCompatible {
    /// A provider with the given settings.
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmError> {
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| LlmError::Config(format!("building the HTTP client: {e}")))?;
        let endpoint = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        Ok(Self { config, endpoint, client })
    }

    fn is_reasoning_model(&self) -> bool {
        self.config.reasoning.unwrap_or_else(|| {
            let m = self.config.model.to_ascii_lowercase();
            ["o1", "o3", "o4", "gpt-5"].iter().any(|p| m.starts_with(p))
        })
    }

    /// The request body for a mode (`None`: no schema asked).
    pub fn body(&self, request: &CompletionRequest, mode: Option<StructuredMode>) -> Value {
        let mut messages = request.messages.clone();
        let mut body = json!({"model": self.config.model});
        if self.is_reasoning_model() {
            if let Some(max) = request.max_tokens {
                body["max_completion_tokens"] = json!(max);
            }
            if let Some(effort) = request.reasoning_effort {
                body["reasoning_effort"] = json!(effort.as_str());
            }
        } else {
            if let Some(t) = request.temperature {
                body["temperature"] = json!(t);
            }
            if let Some(max) = request.max_tokens {
                body["max_tokens"] = json!(max);
            }
        }
        if let (Some(mode), Some(schema)) = (mode, &request.response_schema) {
            match mode {
                StructuredMode::JsonSchema => {
                    body["response_format"] = json!({"type": "json_schema",
                        "json_schema": {"name": schema.name, "schema": schema.schema, "strict": true}});
                }
                StructuredMode::JsonObject => {
                    body["response_format"] = json!({"type": "json_object", "schema": schema.schema});
                }
                StructuredMode::Tool => {
                    body["tools"] = json!([{"type": "function", "function": {
                        "name": schema.name, "description": "Give the answer as the arguments of this function.",
                        "parameters": schema.schema}}]);
                    body["tool_choice"] = json!({"type": "function", "function": {"name": schema.name}});
                }
                StructuredMode::None => {
                    // A large schema costs more prompt than it helps: the
                    // caller's prompt already describes the format.
                    let text = schema.schema.to_string();
                    messages.push(Message::system(if text.len() <= 2_000 {
                        format!("Answer with one JSON value only, no prose, that validates against this JSON Schema:\n{text}")
                    } else {
                        "Answer with one JSON object only, no prose, in the format described above.".to_owned()
                    }));
                }
            }
        }
        body["messages"] = json!(messages);
        body
    }

    async fn attempt(&self, body: &Value, mode: Option<StructuredMode>) -> Result<Value, Failure> {
        let mut http = self.client.post(&self.endpoint).json(body);
        if let Some(key) = &self.config.api_key {
            http = http.bearer_auth(key);
        }
        let response = match http.send().await {
            Ok(r) => r,
            Err(e) if e.is_builder() => {
                return Err(Failure::Fatal(LlmError::Config(format!("cannot call {}: {e}", self.endpoint))));
            }
            Err(e) => return Err(Failure::Transient { message: e.to_string(), retry_after: None }),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        let text =
            response.text().await.map_err(|e| Failure::Transient { message: e.to_string(), retry_after: None })?;
        if (200..300).contains(&status) {
            return serde_json::from_str(&text)
                .map_err(|e| Failure::Fatal(LlmError::InvalidResponse(format!("body is not JSON: {e}"))));
        }
        let snippet: String = text.chars().take(2000).collect();
        let names_mode = ["response_format", "json_schema", "tool_choice", "tools", "schema"]
            .iter()
            .any(|word| snippet.contains(word));
        match status {
            401 | 403 => Err(Failure::Fatal(LlmError::Auth { status })),
            _ if mode.is_some_and(|m| m != StructuredMode::None) && names_mode && (status >= 400) && status != 429 => {
                Err(Failure::ModeRejected { status, body: snippet })
            }
            408 | 429 | 500..=599 => {
                Err(Failure::Transient { message: format!("HTTP {status}: {snippet}"), retry_after })
            }
            _ => Err(Failure::Fatal(LlmError::BadRequest { status, body: snippet })),
        }
    }

    /// Sends one request in one mode, retrying transient failures.
    async fn send(&self, request: &CompletionRequest, mode: Option<StructuredMode>) -> Result<Value, Failure> {
        let body = self.body(request, mode);
        let mut retry = 0;
        loop {
            match self.attempt(&body, mode).await {
                Err(Failure::Transient { message, retry_after }) if retry < self.config.retry.max_retries => {
                    let wait = self.config.retry.delay(retry, retry_after);
                    tracing::warn!(endpoint = %self.endpoint, retry = retry + 1, wait_ms = wait.as_millis() as u64, error = %message, "LLM call failed; retrying");
                    tokio::time::sleep(wait).await;
                    retry += 1;
                }
                Err(Failure::Transient { message, .. }) => {
                    return Err(Failure::Fatal(LlmError::Unavailable { attempts: retry + 1, message }));
                }
                other => return other,
            }
        }
    }

    fn read(&self, response: &Value, mode: Option<StructuredMode>, started: Instant) -> Result<Completion, LlmError> {
        let message = &response["choices"][0]["message"];
        let text = if mode == Some(StructuredMode::Tool) {
            message["tool_calls"][0]["function"]["arguments"].as_str().map(str::to_owned)
        } else {
            None
        }
        .or_else(|| message["content"].as_str().map(str::to_owned))
        .ok_or_else(|| LlmError::InvalidResponse(format!("no message content in {}", truncate(response))))?;
        let usage = Usage {
            prompt_tokens: response["usage"]["prompt_tokens"].as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
            completion_tokens: response["usage"]["completion_tokens"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
        };
        Ok(Completion {
            text,
            provider: "openai".into(),
            model: response["model"].as_str().unwrap_or(&self.config.model).to_owned(),
            structured_mode: mode,
            usage,
            latency: started.elapsed(),
        })
    }
}

fn truncate(value: &Value) -> String {
    value.to_string().chars().take(300).collect()
}

#[async_trait]
impl LlmProvider for OpenAiCompatible {
    fn name(&self) -> &str {
        "openai"
    }

    fn model(&self) -> &str {
        &self.config.model
    }

    fn structured_mode(&self) -> Option<StructuredMode> {
        match self.config.structured {
            StructuredSetting::Fixed(mode) => Some(mode),
            StructuredSetting::Auto => Some(
                learned()
                    .lock()
                    .ok()
                    .and_then(|l| l.get(&self.config.base_url).copied())
                    .unwrap_or(StructuredMode::JsonSchema),
            ),
        }
    }

    async fn complete(&self, request: &CompletionRequest) -> Result<Completion, LlmError> {
        let started = Instant::now();
        if request.response_schema.is_none() {
            return match self.send(request, None).await {
                Ok(response) => self.read(&response, None, started),
                Err(failure) => Err(fatal(failure)),
            };
        }
        let modes: Vec<StructuredMode> = match self.config.structured {
            StructuredSetting::Fixed(mode) => vec![mode],
            StructuredSetting::Auto => {
                let first = self.structured_mode().unwrap_or(StructuredMode::JsonSchema);
                StructuredMode::AUTO_ORDER.into_iter().skip_while(|m| *m != first).collect()
            }
        };
        let mut rejected = Vec::new();
        for mode in modes {
            match self.send(request, Some(mode)).await {
                Ok(response) => {
                    if self.config.structured == StructuredSetting::Auto
                        && let Ok(mut learned) = learned().lock()
                        && learned.insert(self.config.base_url.clone(), mode) != Some(mode)
                    {
                        tracing::info!(base_url = %self.config.base_url, mode = %mode, rejected = ?rejected, "structured output: using this mode for this server");
                    }
                    return self.read(&response, Some(mode), started);
                }
                Err(Failure::ModeRejected { status, body }) if self.config.structured == StructuredSetting::Auto => {
                    tracing::debug!(mode = %mode, status, "server rejected the structured-output mode; trying the next");
                    rejected.push(mode.as_str());
                    let _ = body;
                }
                Err(failure) => return Err(fatal(failure)),
            }
        }
        Err(LlmError::BadRequest {
            status: 400,
            body: format!("the server rejected every structured-output mode tried: {rejected:?}"),
        })
    }
}

fn fatal(failure: Failure) -> LlmError {
    match failure {
        Failure::Fatal(e) => e,
        Failure::ModeRejected { status, body } => LlmError::BadRequest { status, body },
        Failure::Transient { message, .. } => LlmError::Unavailable { attempts: 1, message },
    }
}
