//! OpenAI chat completions, and every server that speaks the same API.
//!
//! Servers take a schema in different ways; [`StructuredSetting::Auto`]
//! tries them strongest first ([`StructuredMode::AUTO_ORDER`]) and moves to
//! the next when a server rejects one. What it learns is kept per base URL
//! and model, for the whole process: a mode rejected for one schema is
//! skipped for that schema only (a server may refuse a keyword in one schema
//! and take the others); a mode the server has never accepted and has
//! refused for two different schemas is taken as unsupported and skipped
//! from then on. Each change is logged once.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::OnText;
use crate::http::{BaseUrl, Failure, Http, HttpSettings, Post, count, event_json, truncate};
use crate::models::{self, Family};
use crate::{
    Completion, CompletionRequest, LlmError, LlmProvider, Message, StructuredMode, StructuredSetting, Usage,
    schema_instruction,
};

/// Default base URL of OpenAI's API.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// Settings of an OpenAI-compatible provider (`Debug` never shows the key).
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Base URL, up to and without `/chat/completions`.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// Bearer token (read from the environment by the caller; never logged).
    pub api_key: Option<SecretString>,
    /// How to ask for JSON that fits a schema.
    pub structured: StructuredSetting,
    /// Treat the model as a reasoning model (`max_completion_tokens`,
    /// `reasoning_effort`, no temperature); `None`: decide from its name.
    pub reasoning: Option<bool>,
    /// OpenAI's own models, or a self-hosted server's (for model aliases).
    pub family: Family,
    /// Timeouts, retries, extra CA.
    pub http: HttpSettings,
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
            family: Family::Compatible,
            http: HttpSettings::default(),
        }
    }
}

/// What `auto` learned about one server and model.
#[derive(Default)]
struct Learned {
    /// Modes the server accepted at least once.
    accepted: HashSet<StructuredMode>,
    /// Per mode, fingerprints of the schemas it was refused for.
    refused: HashMap<StructuredMode, HashSet<u64>>,
}

/// Schemas remembered as refused, per mode, before the memory starts over.
const MAX_REFUSED_SCHEMAS: usize = 1024;

impl Learned {
    /// A mode the server has never accepted and refused for two schemas.
    fn unsupported(&self, mode: StructuredMode) -> bool {
        !self.accepted.contains(&mode) && self.refused.get(&mode).is_some_and(|s| s.len() >= 2)
    }

    /// The strongest mode worth trying for any schema.
    fn best(&self) -> StructuredMode {
        StructuredMode::AUTO_ORDER.into_iter().find(|m| !self.unsupported(*m)).unwrap_or(StructuredMode::None)
    }

    /// Whether to skip `mode` for the schema with this fingerprint.
    fn skip(&self, mode: StructuredMode, schema: u64) -> bool {
        self.unsupported(mode) || self.refused.get(&mode).is_some_and(|s| s.contains(&schema))
    }
}

/// What `auto` learned, per base URL and model, for this process.
fn learned() -> &'static Mutex<HashMap<(String, String), Learned>> {
    static LEARNED: OnceLock<Mutex<HashMap<(String, String), Learned>>> = OnceLock::new();
    LEARNED.get_or_init(Mutex::default)
}

fn fingerprint(schema: &Value) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    schema.to_string().hash(&mut hasher);
    hasher.finish()
}

/// A provider for OpenAI's chat completions API and compatible servers.
pub struct OpenAiCompatible {
    config: OpenAiConfig,
    base: BaseUrl,
    endpoint: String,
    headers: Vec<(&'static str, String)>,
    http: Http,
}

impl OpenAiCompatible {
    /// A provider with the given settings.
    pub fn new(mut config: OpenAiConfig) -> Result<Self, LlmError> {
        let base = BaseUrl::parse(&config.base_url)?;
        let http = Http::new(&config.http, &base, config.api_key.as_ref().map(|k| k.expose_secret()))?;
        // The configured model may itself be an alias (`--llm openai:fast`).
        config.model = models::choose(config.family, &config.model, Some(&config.model));
        let endpoint = base.join("/chat/completions", None);
        let headers =
            config.api_key.iter().map(|key| ("authorization", format!("Bearer {}", key.expose_secret()))).collect();
        Ok(Self { config, base, endpoint, headers, http })
    }

    fn is_reasoning_model(&self, model: &str) -> bool {
        self.config.reasoning.unwrap_or_else(|| {
            let m = model.to_ascii_lowercase();
            ["o1", "o3", "o4", "gpt-5"].iter().any(|p| m.starts_with(p))
        })
    }

    /// The request body for a mode (`None`: no schema asked).
    pub fn body(&self, request: &CompletionRequest, mode: Option<StructuredMode>, stream: bool) -> Value {
        let mut messages = request.messages.clone();
        let model = models::choose(self.config.family, &self.config.model, request.model.as_deref());
        let mut body = json!({"model": model});
        if self.is_reasoning_model(&model) {
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
                StructuredMode::None => messages.push(Message::system(schema_instruction(schema))),
            }
        }
        body["messages"] = json!(messages);
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    /// One call in one mode, whole or streamed.
    async fn call(
        &self,
        request: &CompletionRequest,
        mode: Option<StructuredMode>,
        sink: &mut OnText<'_>,
        started: Instant,
    ) -> Result<Completion, Failure> {
        let body = self.body(request, mode, sink.is_some());
        let post = Post { url: &self.endpoint, headers: &self.headers, body: &body, mode_sensitive: mode.is_some() };
        let mut completion = Completion {
            text: String::new(),
            provider: "openai".into(),
            model: body["model"].as_str().unwrap_or(&self.config.model).to_owned(),
            structured_mode: mode,
            usage: Usage::default(),
            latency: started.elapsed(),
            truncated: false,
        };
        match sink {
            None => {
                let response = self.http.post_json(&post).await?;
                read(&response, mode, &mut completion).map_err(Failure::Fatal)?;
            }
            Some(on_text) => {
                let mut on_event = |event: crate::http::SseEvent| {
                    if event.data.trim() == "[DONE]" {
                        return Ok(());
                    }
                    read_chunk(&event_json(&event)?, &mut completion, &mut **on_text)
                };
                self.http.post_events(&post, &mut on_event).await?;
            }
        }
        completion.latency = started.elapsed();
        Ok(completion)
    }

    async fn run(&self, request: &CompletionRequest, mut sink: OnText<'_>) -> Result<Completion, LlmError> {
        let started = Instant::now();
        if request.response_schema.is_none() {
            return self.call(request, None, &mut sink, started).await.map_err(|f| f.into_error(1));
        }
        let schema = request.response_schema.as_ref().map(|s| fingerprint(&s.schema)).unwrap_or_default();
        let model = models::choose(self.config.family, &self.config.model, request.model.as_deref());
        let key = (self.config.base_url.clone(), model);
        let modes: Vec<StructuredMode> = match self.config.structured {
            StructuredSetting::Fixed(mode) => vec![mode],
            StructuredSetting::Auto => {
                let learned = learned().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let known = learned.get(&key);
                StructuredMode::AUTO_ORDER.into_iter().filter(|m| known.is_none_or(|l| !l.skip(*m, schema))).collect()
            }
        };
        let mut rejected = Vec::new();
        for mode in modes {
            match self.call(request, Some(mode), &mut sink, started).await {
                Ok(completion) => {
                    if self.config.structured == StructuredSetting::Auto {
                        let mut learned = learned().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        if learned.entry(key.clone()).or_default().accepted.insert(mode) {
                            tracing::info!(base_url = %self.base.shown(), model = %key.1, mode = %mode, rejected = ?rejected, "structured output: the server accepts this mode");
                        }
                    }
                    return Ok(completion);
                }
                Err(Failure::ModeRejected { status, .. }) if self.config.structured == StructuredSetting::Auto => {
                    tracing::debug!(mode = %mode, status, "server rejected the structured-output mode for this schema; trying the next");
                    rejected.push(mode.as_str());
                    let mut learned = learned().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let entry = learned.entry(key.clone()).or_default();
                    let refused = entry.refused.entry(mode).or_default();
                    if refused.len() >= MAX_REFUSED_SCHEMAS {
                        refused.clear();
                    }
                    if refused.insert(schema) && refused.len() == 2 && entry.unsupported(mode) {
                        tracing::info!(base_url = %self.base.shown(), model = %key.1, mode = %mode, "structured output: the server does not take this mode; skipping it from now on");
                    }
                }
                Err(failure) => return Err(failure.into_error(1)),
            }
        }
        Err(LlmError::BadRequest {
            status: 400,
            body: format!("the server rejected every structured-output mode tried: {rejected:?}"),
        })
    }
}

/// Reads a whole chat completion.
fn read(response: &Value, mode: Option<StructuredMode>, completion: &mut Completion) -> Result<(), LlmError> {
    let message = &response["choices"][0]["message"];
    let text = if mode == Some(StructuredMode::Tool) {
        message["tool_calls"][0]["function"]["arguments"].as_str()
    } else {
        None
    }
    .or_else(|| message["content"].as_str())
    .ok_or_else(|| LlmError::InvalidResponse(format!("no message content in {}", truncate(&response.to_string()))))?;
    completion.text = text.to_owned();
    completion.truncated = response["choices"][0]["finish_reason"].as_str() == Some("length");
    read_usage(response, completion);
    Ok(())
}

fn read_usage(response: &Value, completion: &mut Completion) {
    if let Some(model) = response["model"].as_str() {
        completion.model = model.to_owned();
    }
    if response["usage"].is_object() {
        completion.usage = Usage {
            prompt_tokens: count(&response["usage"]["prompt_tokens"]),
            completion_tokens: count(&response["usage"]["completion_tokens"]),
        };
    }
}

/// Reads one `chat.completion.chunk` of a stream.
fn read_chunk(
    chunk: &Value,
    completion: &mut Completion,
    on_text: &mut (dyn for<'t> FnMut(&'t str) + Send),
) -> Result<(), LlmError> {
    if let Some(error) = chunk.get("error") {
        return Err(LlmError::InvalidResponse(format!(
            "the stream reported an error: {}",
            truncate(&error.to_string())
        )));
    }
    if chunk["choices"][0]["finish_reason"].as_str() == Some("length") {
        completion.truncated = true;
    }
    let delta = &chunk["choices"][0]["delta"];
    let piece = delta["content"].as_str().or_else(|| delta["tool_calls"][0]["function"]["arguments"].as_str());
    if let Some(piece) = piece.filter(|p| !p.is_empty()) {
        completion.text.push_str(piece);
        on_text(piece);
    }
    read_usage(chunk, completion);
    Ok(())
}

/// Reads `events` as the chunks of one stream and each as a whole answer
/// (property tests).
#[cfg(test)]
pub(crate) fn read_all(events: &[Value]) {
    let completion = || Completion {
        text: String::new(),
        provider: "openai".into(),
        model: "m".into(),
        structured_mode: None,
        usage: Usage::default(),
        latency: std::time::Duration::ZERO,
        truncated: false,
    };
    let mut streamed = completion();
    for data in events {
        let _ = read_chunk(data, &mut streamed, &mut |_| {});
        for mode in [None, Some(StructuredMode::Tool)] {
            let _ = read(data, mode, &mut completion());
        }
    }
}

#[async_trait]
impl LlmProvider for OpenAiCompatible {
    fn name(&self) -> &str {
        "openai"
    }

    async fn probe(&self) -> Result<String, String> {
        self.http.probe(self.base.root()).await
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
                    .and_then(|l| l.get(&(self.config.base_url.clone(), self.config.model.clone())).map(Learned::best))
                    .unwrap_or(StructuredMode::JsonSchema),
            ),
        }
    }

    async fn generate(&self, request: &CompletionRequest, on_text: OnText<'_>) -> Result<Completion, LlmError> {
        self.run(request, on_text).await
    }

    fn accepts_model(&self, name: &str) -> bool {
        models::accepts(self.config.family, name)
    }
}
