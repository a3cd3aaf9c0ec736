//! Anthropic's Messages API (`POST /v1/messages`).
//!
//! - The system prompt travels apart from the conversation (`system`).
//! - A schema is enforced through a forced tool: one tool whose
//!   `input_schema` is the schema and `tool_choice` naming it; the answer is
//!   the tool call's `input`.
//! - Reasoning effort becomes an extended-thinking budget. Anthropic refuses
//!   a forced tool and a temperature while thinking, so a thinking request
//!   offers the tool with `tool_choice: auto` and asks for it in the prompt.
//! - Streaming reads the `message_start` / `content_block_delta` /
//!   `message_delta` events.

use std::time::Instant;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::OnText;
use crate::http::{BaseUrl, Failure, Http, HttpSettings, Post, SseEvent, count, event_json, truncate};
use crate::models::{self, Family};
use crate::{Completion, CompletionRequest, LlmError, LlmProvider, ReasoningEffort, Role, StructuredMode, Usage};

/// Default base URL of Anthropic's API.
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";

/// The API version this provider speaks (`anthropic-version`).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Tokens to generate when the request sets no limit (the API requires one).
const DEFAULT_MAX_TOKENS: u32 = 4096;

/// Settings of the Anthropic provider (`Debug` never shows the key).
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// Base URL, up to and without `/v1/messages`.
    pub base_url: String,
    /// Model name or alias (`sonnet`, `opus`, `haiku`).
    pub model: String,
    /// API key (`x-api-key`; read from the environment by the caller, never logged).
    pub api_key: Option<SecretString>,
    /// Timeouts, retries, extra CA.
    pub http: HttpSettings,
}

impl AnthropicConfig {
    /// Settings for `model` at `base_url`, with the defaults.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self { base_url: base_url.into(), model: model.into(), api_key: None, http: HttpSettings::default() }
    }
}

/// The extended-thinking budget for an effort (`None`: no thinking).
pub fn thinking_budget(effort: ReasoningEffort) -> Option<u32> {
    match effort {
        ReasoningEffort::Minimal => None,
        ReasoningEffort::Low => Some(1024),
        ReasoningEffort::Medium => Some(4096),
        ReasoningEffort::High => Some(16_384),
    }
}

/// A provider for Anthropic's Messages API.
pub struct Anthropic {
    model: String,
    endpoint: String,
    headers: Vec<(&'static str, String)>,
    http: Http,
}

impl Anthropic {
    /// A provider with the given settings.
    pub fn new(config: AnthropicConfig) -> Result<Self, LlmError> {
        let base = BaseUrl::parse(&config.base_url)?;
        let http = Http::new(&config.http, &base, config.api_key.as_ref().map(|k| k.expose_secret()))?;
        let endpoint = base.join("/v1/messages", None);
        let mut headers = vec![("anthropic-version", ANTHROPIC_VERSION.to_owned())];
        if let Some(key) = &config.api_key {
            headers.push(("x-api-key", key.expose_secret().to_owned()));
        }
        // The configured model may itself be an alias (`--llm anthropic:sonnet`).
        let model = models::choose(Family::Anthropic, &config.model, Some(&config.model));
        Ok(Self { model, endpoint, headers, http })
    }

    /// The request body.
    pub fn body(&self, request: &CompletionRequest, stream: bool) -> Value {
        let model = models::choose(Family::Anthropic, &self.model, request.model.as_deref());
        let budget = request.reasoning_effort.and_then(thinking_budget);
        let max_tokens = request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS) + budget.unwrap_or(0);
        let mut messages: Vec<Value> = request
            .turns()
            .map(
                |m| json!({"role": if m.role == Role::Assistant { "assistant" } else { "user" }, "content": m.content}),
            )
            .collect();
        if messages.is_empty() {
            messages.push(json!({"role": "user", "content": "Answer now."}));
        }
        let mut system = request.system_text();
        let mut body = json!({"model": model, "max_tokens": max_tokens, "messages": messages});
        if let Some(schema) = &request.response_schema {
            body["tools"] = json!([{"name": schema.name,
                "description": "Give the answer as the input of this tool.", "input_schema": schema.schema}]);
            body["tool_choice"] = if budget.is_some() {
                let ask = format!("Answer by calling the tool `{}`.", schema.name);
                system = Some(system.map_or(ask.clone(), |s| format!("{s}\n\n{ask}")));
                json!({"type": "auto"})
            } else {
                json!({"type": "tool", "name": schema.name})
            };
        }
        if let Some(system) = system {
            body["system"] = json!(system);
        }
        match budget {
            Some(budget) => body["thinking"] = json!({"type": "enabled", "budget_tokens": budget}),
            None => {
                if let Some(t) = request.temperature {
                    body["temperature"] = json!(t);
                }
            }
        }
        if stream {
            body["stream"] = json!(true);
        }
        body
    }
}

/// Content blocks read from one streamed answer (an answer holds a few:
/// thinking, text, tool use).
const MAX_BLOCKS: usize = 256;

/// What has been read of an answer, whole or streamed.
#[derive(Default)]
struct Answer {
    text: String,
    tool_input: Option<String>,
    model: Option<String>,
    usage: Usage,
    stop_reason: Option<String>,
    /// Type of each content block by index, while streaming.
    blocks: Vec<String>,
}

impl Answer {
    fn read_message(&mut self, message: &Value) -> Result<(), LlmError> {
        let content = message["content"]
            .as_array()
            .ok_or_else(|| LlmError::InvalidResponse(format!("no content in {}", truncate(&message.to_string()))))?;
        for block in content {
            match block["type"].as_str() {
                Some("text") => self.text.push_str(block["text"].as_str().unwrap_or_default()),
                Some("tool_use") if self.tool_input.is_none() => self.tool_input = Some(block["input"].to_string()),
                _ => {}
            }
        }
        self.model = message["model"].as_str().map(str::to_owned);
        self.stop_reason = message["stop_reason"].as_str().map(str::to_owned);
        self.usage = Usage {
            prompt_tokens: count(&message["usage"]["input_tokens"]),
            completion_tokens: count(&message["usage"]["output_tokens"]),
        };
        Ok(())
    }

    fn read_event(
        &mut self,
        event: &SseEvent,
        structured: bool,
        on_text: &mut (dyn for<'t> FnMut(&'t str) + Send),
    ) -> Result<(), LlmError> {
        let data = event_json(event)?;
        match data["type"].as_str().unwrap_or_default() {
            "message_start" => {
                self.model = data["message"]["model"].as_str().map(str::to_owned);
                self.usage.prompt_tokens = count(&data["message"]["usage"]["input_tokens"]);
                self.usage.completion_tokens = count(&data["message"]["usage"]["output_tokens"]);
            }
            "content_block_start" => {
                let index = data["index"].as_u64().unwrap_or_default();
                let index = usize::try_from(index).ok().filter(|i| *i < MAX_BLOCKS).ok_or_else(|| {
                    LlmError::InvalidResponse(format!(
                        "the stream names content block index {index}; at most {MAX_BLOCKS} are read"
                    ))
                })?;
                if self.blocks.len() <= index {
                    self.blocks.resize(index + 1, String::new());
                }
                let kind = data["content_block"]["type"].as_str().unwrap_or_default().to_owned();
                if kind == "tool_use" && self.tool_input.is_none() {
                    self.tool_input = Some(String::new());
                }
                self.blocks[index] = kind;
            }
            "content_block_delta" => {
                let delta = &data["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        let piece = delta["text"].as_str().unwrap_or_default();
                        self.text.push_str(piece);
                        if !structured {
                            on_text(piece);
                        }
                    }
                    Some("input_json_delta") => {
                        let piece = delta["partial_json"].as_str().unwrap_or_default();
                        if let Some(input) = &mut self.tool_input {
                            input.push_str(piece);
                            on_text(piece);
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                self.stop_reason = data["delta"]["stop_reason"].as_str().map(str::to_owned);
                if let Some(n) = data["usage"]["output_tokens"].as_u64() {
                    self.usage.completion_tokens = u32::try_from(n).unwrap_or(u32::MAX);
                }
            }
            "message_stop" => {
                // A forced tool with no arguments streams no delta at all.
                if let Some(input) = &mut self.tool_input
                    && input.is_empty()
                {
                    input.push_str("{}");
                    on_text("{}");
                }
                if structured && self.tool_input.is_none() && !self.text.is_empty() {
                    on_text(&self.text);
                }
            }
            "error" => {
                return Err(LlmError::Unavailable {
                    attempts: 1,
                    message: format!("the stream reported an error: {}", truncate(&data["error"].to_string())),
                });
            }
            _ => {}
        }
        Ok(())
    }
}

/// Reads `events` as a stream and each as a whole message (property tests).
#[cfg(test)]
pub(crate) fn read_all(events: &[Value]) {
    for structured in [true, false] {
        let mut answer = Answer::default();
        for data in events {
            let event = SseEvent { event: None, data: data.to_string() };
            let _ = answer.read_event(&event, structured, &mut |_| {});
            let _ = Answer::default().read_message(data);
        }
    }
}

#[async_trait]
impl LlmProvider for Anthropic {
    fn name(&self) -> &str {
        "anthropic"
    }

    async fn probe(&self) -> Result<String, String> {
        self.http.probe(&self.endpoint).await
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn structured_mode(&self) -> Option<StructuredMode> {
        Some(StructuredMode::Tool)
    }

    async fn generate(&self, request: &CompletionRequest, sink: OnText<'_>) -> Result<Completion, LlmError> {
        let started = Instant::now();
        let body = self.body(request, sink.is_some());
        let post = Post { url: &self.endpoint, headers: &self.headers, body: &body, mode_sensitive: false };
        let structured = request.response_schema.is_some();
        let mut answer = Answer::default();
        match sink {
            None => {
                let response = self.http.post_json(&post).await.map_err(|f| f.into_error(1))?;
                answer.read_message(&response)?;
            }
            Some(on_text) => {
                let mut on_event = |event: SseEvent| answer.read_event(&event, structured, &mut *on_text);
                self.http.post_events(&post, &mut on_event).await.map_err(|f: Failure| f.into_error(1))?;
            }
        }
        let text = if structured && answer.tool_input.is_some() {
            answer.tool_input.unwrap_or_default()
        } else if answer.text.is_empty() && answer.tool_input.is_none() {
            return Err(LlmError::InvalidResponse(format!(
                "the answer holds neither text nor a tool call (stop reason: {})",
                answer.stop_reason.as_deref().unwrap_or("none")
            )));
        } else {
            answer.text
        };
        Ok(Completion {
            text,
            provider: "anthropic".into(),
            model: answer.model.unwrap_or_else(|| body["model"].as_str().unwrap_or(&self.model).to_owned()),
            structured_mode: structured.then_some(StructuredMode::Tool),
            usage: answer.usage,
            latency: started.elapsed(),
            truncated: answer.stop_reason.as_deref() == Some("max_tokens"),
        })
    }

    fn accepts_model(&self, name: &str) -> bool {
        models::accepts(Family::Anthropic, name)
    }
}
