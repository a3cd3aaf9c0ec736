//! Google's Gemini API: `models/{model}:generateContent`, and
//! `:streamGenerateContent?alt=sse` for streaming.
//!
//! - The system prompt travels as `systemInstruction`; assistant turns have
//!   the role `model`.
//! - A schema goes in `generationConfig.responseSchema` with
//!   `responseMimeType: application/json`. That field takes the OpenAPI
//!   subset of JSON Schema, so [`response_schema`] translates: `const`
//!   becomes a one-value `enum`, `oneOf` becomes `anyOf`, nullable types
//!   become `nullable`, `$ref`s to `$defs` are inlined, a tuple
//!   (`prefixItems`) becomes an array of exactly that many items, each any
//!   of the tuple's schemas, and keywords Gemini does not know are dropped
//!   (validation after parsing still checks them).
//! - Reasoning effort becomes `thinkingConfig`: a `thinkingLevel` for Gemini
//!   3 models, a `thinkingBudget` for the 2.5 family.

use std::time::Instant;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value, json};

use crate::OnText;
use crate::http::{BaseUrl, Http, HttpSettings, Post, SseEvent, count, event_json, truncate};
use crate::models::{self, Family};
use crate::{Completion, CompletionRequest, LlmError, LlmProvider, ReasoningEffort, Role, StructuredMode, Usage};

/// Default base URL of the Gemini API.
pub const GEMINI_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// Settings of the Gemini provider (`Debug` never shows the key).
#[derive(Debug, Clone)]
pub struct GeminiConfig {
    /// Base URL, up to and without `/v1beta/models/…`.
    pub base_url: String,
    /// Model name or alias (`flash`, `pro`).
    pub model: String,
    /// API key (`x-goog-api-key`; read from the environment by the caller, never logged).
    pub api_key: Option<SecretString>,
    /// Timeouts, retries, extra CA.
    pub http: HttpSettings,
}

impl GeminiConfig {
    /// Settings for `model` at `base_url`, with the defaults.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self { base_url: base_url.into(), model: model.into(), api_key: None, http: HttpSettings::default() }
    }
}

/// `thinkingConfig` for a model and an effort.
pub fn thinking_config(model: &str, effort: ReasoningEffort) -> Value {
    if model.contains("gemini-3") {
        let level = match effort {
            ReasoningEffort::Minimal | ReasoningEffort::Low => "low",
            ReasoningEffort::Medium | ReasoningEffort::High => "high",
        };
        return json!({"thinkingLevel": level});
    }
    let budget = match effort {
        // Flash models can switch thinking off; Pro models think at least 128 tokens.
        ReasoningEffort::Minimal if model.contains("flash") => 0,
        ReasoningEffort::Minimal => 128,
        ReasoningEffort::Low => 1024,
        ReasoningEffort::Medium => 8192,
        ReasoningEffort::High => 24_576,
    };
    json!({"thinkingBudget": budget})
}

/// Keywords copied as they are into a Gemini schema.
const KEPT: [&str; 13] = [
    "description",
    "title",
    "nullable",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minProperties",
    "maxProperties",
    "propertyOrdering",
];

/// Translates a JSON Schema into the OpenAPI subset `responseSchema` takes.
pub fn response_schema(schema: &Value) -> Value {
    translate(schema, schema.get("$defs").and_then(Value::as_object), 0)
}

/// Deepest `$ref` chain inlined (a recursive schema stops there).
const MAX_DEPTH: usize = 32;

fn translate(schema: &Value, defs: Option<&Map<String, Value>>, depth: usize) -> Value {
    let Some(object) = schema.as_object() else { return json!({}) };
    if depth > MAX_DEPTH {
        return json!({});
    }
    if let Some(target) = object.get("$ref").and_then(Value::as_str) {
        let found = target.strip_prefix("#/$defs/").and_then(|name| defs.and_then(|d| d.get(name)));
        return found.map_or_else(|| json!({}), |s| translate(s, defs, depth + 1));
    }
    let response_schema = |s: &Value| translate(s, defs, depth + 1);
    let mut out = Map::new();
    match object.get("type") {
        Some(Value::String(t)) => {
            out.insert("type".into(), json!(t.to_ascii_uppercase()));
        }
        Some(Value::Array(types)) => {
            let named: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
            if named.contains(&"null") {
                out.insert("nullable".into(), json!(true));
            }
            if let Some(t) = named.iter().find(|t| **t != "null") {
                out.insert("type".into(), json!(t.to_ascii_uppercase()));
            }
        }
        _ => {}
    }
    for key in KEPT {
        if let Some(value) = object.get(key) {
            out.insert(key.into(), value.clone());
        }
    }
    match object.get("const") {
        Some(Value::String(s)) => {
            out.insert("type".into(), json!("STRING"));
            out.insert("enum".into(), json!([s]));
        }
        Some(n @ Value::Number(_)) => {
            out.insert("type".into(), json!(if n.is_f64() { "NUMBER" } else { "INTEGER" }));
            out.insert("minimum".into(), n.clone());
            out.insert("maximum".into(), n.clone());
        }
        Some(Value::Bool(_)) => {
            out.insert("type".into(), json!("BOOLEAN"));
        }
        _ => {}
    }
    if let Some(values) = object.get("enum").and_then(Value::as_array)
        && values.iter().all(Value::is_string)
    {
        out.insert("type".into(), json!("STRING"));
        out.insert("enum".into(), json!(values));
    }
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        let converted: Map<String, Value> =
            properties.iter().map(|(name, s)| (name.clone(), response_schema(s))).collect();
        out.entry("type").or_insert(json!("OBJECT"));
        out.insert("properties".into(), Value::Object(converted));
        if let Some(required) = object.get("required") {
            out.insert("required".into(), required.clone());
        }
    }
    if let Some(tuple) = object.get("prefixItems").and_then(Value::as_array) {
        out.insert("type".into(), json!("ARRAY"));
        out.insert("minItems".into(), json!(tuple.len()));
        out.insert("maxItems".into(), json!(tuple.len()));
        if !tuple.is_empty() {
            out.insert("items".into(), json!({"anyOf": tuple.iter().map(response_schema).collect::<Vec<_>>()}));
        }
    } else if let Some(items) = object.get("items").filter(|i| i.is_object()) {
        out.entry("type").or_insert(json!("ARRAY"));
        out.insert("items".into(), response_schema(items));
    }
    if let Some(branches) = object.get("anyOf").or_else(|| object.get("oneOf")).and_then(Value::as_array) {
        out.insert("anyOf".into(), Value::Array(branches.iter().map(response_schema).collect()));
    }
    Value::Object(out)
}

/// A provider for the Gemini API.
pub struct Gemini {
    base: BaseUrl,
    model: String,
    headers: Vec<(&'static str, String)>,
    http: Http,
}

impl Gemini {
    /// A provider with the given settings.
    pub fn new(config: GeminiConfig) -> Result<Self, LlmError> {
        let base = BaseUrl::parse(&config.base_url)?;
        let http = Http::new(&config.http, &base, config.api_key.as_ref().map(|k| k.expose_secret()))?;
        let headers = config.api_key.iter().map(|key| ("x-goog-api-key", key.expose_secret().to_owned())).collect();
        let model = models::choose(Family::Gemini, &config.model, Some(&config.model));
        Ok(Self { base, model, headers, http })
    }

    fn url(&self, model: &str, stream: bool) -> String {
        let model = model.strip_prefix("models/").unwrap_or(model);
        if stream {
            self.base.join(&format!("/v1beta/models/{model}:streamGenerateContent"), Some("alt=sse"))
        } else {
            self.base.join(&format!("/v1beta/models/{model}:generateContent"), None)
        }
    }

    /// The model a request is served by.
    pub fn request_model(&self, request: &CompletionRequest) -> String {
        models::choose(Family::Gemini, &self.model, request.model.as_deref())
    }

    /// The request body.
    pub fn body(&self, request: &CompletionRequest) -> Value {
        let model = self.request_model(request);
        let contents: Vec<Value> = request
            .turns()
            .map(|m| json!({"role": if m.role == Role::Assistant { "model" } else { "user" }, "parts": [{"text": m.content}]}))
            .collect();
        let mut config = Map::new();
        if let Some(t) = request.temperature {
            config.insert("temperature".into(), json!(t));
        }
        if let Some(max) = request.max_tokens {
            config.insert("maxOutputTokens".into(), json!(max));
        }
        if let Some(schema) = &request.response_schema {
            config.insert("responseMimeType".into(), json!("application/json"));
            config.insert("responseSchema".into(), response_schema(&schema.schema));
        }
        if let Some(effort) = request.reasoning_effort {
            config.insert("thinkingConfig".into(), thinking_config(&model, effort));
        }
        let mut body = json!({"contents": contents, "generationConfig": config});
        if let Some(system) = request.system_text() {
            body["systemInstruction"] = json!({"parts": [{"text": system}]});
        }
        body
    }
}

/// What has been read of an answer: one response, or the chunks of a stream
/// (each a whole `GenerateContentResponse` holding the next piece).
#[derive(Default)]
struct Answer {
    text: String,
    model: String,
    usage: Usage,
    finish_reason: Option<String>,
    blocked: Option<String>,
}

impl Answer {
    fn read(&mut self, response: &Value, on_text: &mut (dyn FnMut(&str) + Send)) -> Result<(), LlmError> {
        if let Some(error) = response.get("error") {
            return Err(LlmError::InvalidResponse(format!(
                "Gemini reported an error: {}",
                truncate(&error.to_string())
            )));
        }
        if let Some(reason) = response["promptFeedback"]["blockReason"].as_str() {
            self.blocked = Some(reason.to_owned());
        }
        let candidate = &response["candidates"][0];
        for part in candidate["content"]["parts"].as_array().into_iter().flatten() {
            // Thought summaries are not the answer.
            if part["thought"].as_bool() == Some(true) {
                continue;
            }
            if let Some(piece) = part["text"].as_str().filter(|p| !p.is_empty()) {
                self.text.push_str(piece);
                on_text(piece);
            }
        }
        if let Some(reason) = candidate["finishReason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
        }
        if let Some(version) = response["modelVersion"].as_str() {
            self.model = version.to_owned();
        }
        let usage = &response["usageMetadata"];
        if usage.is_object() {
            self.usage = Usage {
                prompt_tokens: count(&usage["promptTokenCount"]),
                completion_tokens: count(&usage["candidatesTokenCount"]) + count(&usage["thoughtsTokenCount"]),
            };
        }
        Ok(())
    }
}

/// Reads `events` as the chunks of one stream (property tests).
#[cfg(test)]
pub(crate) fn read_all(events: &[Value]) {
    let mut answer = Answer::default();
    for data in events {
        let _ = answer.read(data, &mut |_| {});
        let _ = response_schema(data);
    }
}

#[async_trait]
impl LlmProvider for Gemini {
    fn name(&self) -> &str {
        "gemini"
    }

    async fn probe(&self) -> Result<String, String> {
        self.http.probe(self.base.root()).await
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn structured_mode(&self) -> Option<StructuredMode> {
        Some(StructuredMode::JsonSchema)
    }

    async fn generate(&self, request: &CompletionRequest, sink: OnText<'_>) -> Result<Completion, LlmError> {
        let started = Instant::now();
        let model = self.request_model(request);
        let body = self.body(request);
        let url = self.url(&model, sink.is_some());
        let post = Post { url: &url, headers: &self.headers, body: &body, mode_sensitive: false };
        let mut answer = Answer { model, ..Answer::default() };
        match sink {
            None => {
                let response = self.http.post_json(&post).await.map_err(|f| f.into_error(1))?;
                answer.read(&response, &mut |_| {})?;
            }
            Some(on_text) => {
                let mut on_event = |event: SseEvent| answer.read(&event_json(&event)?, &mut *on_text);
                self.http.post_events(&post, &mut on_event).await.map_err(|f| f.into_error(1))?;
            }
        }
        if answer.text.is_empty() {
            return Err(LlmError::InvalidResponse(match answer.blocked {
                Some(reason) => format!("Gemini blocked the prompt ({reason})"),
                None => format!(
                    "the answer holds no text (finish reason: {})",
                    answer.finish_reason.as_deref().unwrap_or("none")
                ),
            }));
        }
        Ok(Completion {
            text: answer.text,
            provider: "gemini".into(),
            model: answer.model,
            structured_mode: request.response_schema.is_some().then_some(StructuredMode::JsonSchema),
            usage: answer.usage,
            latency: started.elapsed(),
            truncated: answer.finish_reason.as_deref() == Some("MAX_TOKENS"),
        })
    }

    fn accepts_model(&self, name: &str) -> bool {
        models::accepts(Family::Gemini, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_schema_becomes_the_openapi_subset() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object", "additionalProperties": false, "required": ["steps"],
            "properties": {
                "reasoning": {"type": ["string", "null"], "maxLength": 300},
                "steps": {"type": "array", "maxItems": 20, "items": {"oneOf": [
                    {"type": "object", "properties": {
                        "agent": {"const": "weather-tool-v2"},
                        "retries": {"const": 2},
                        "unit": {"enum": ["c", "f"], "default": "c"}}}]}}
            }
        });
        assert_eq!(
            response_schema(&schema),
            json!({
                "type": "OBJECT", "required": ["steps"],
                "properties": {
                    "reasoning": {"type": "STRING", "nullable": true, "maxLength": 300},
                    "steps": {"type": "ARRAY", "maxItems": 20, "items": {"anyOf": [
                        {"type": "OBJECT", "properties": {
                            "agent": {"type": "STRING", "enum": ["weather-tool-v2"]},
                            "retries": {"type": "INTEGER", "minimum": 2, "maximum": 2},
                            "unit": {"type": "STRING", "enum": ["c", "f"]}}}]}}
                }
            })
        );
    }

    #[test]
    fn references_are_inlined_and_tuples_become_bounded_arrays() {
        let schema = json!({
            "type": "object",
            "properties": {"steps": {"anyOf": [
                {"type": "array", "items": {"type": "string"}, "maxItems": 0},
                {"type": "array", "prefixItems": [{"$ref": "#/$defs/step1"}, {"$ref": "#/$defs/step2"}], "items": false}
            ]}},
            "$defs": {"step1": {"type": "string", "const": "a"}, "step2": {"$ref": "#/$defs/missing"}}
        });
        assert_eq!(
            response_schema(&schema)["properties"]["steps"]["anyOf"],
            json!([
                {"type": "ARRAY", "items": {"type": "STRING"}, "maxItems": 0},
                {"type": "ARRAY", "minItems": 2, "maxItems": 2,
                    "items": {"anyOf": [{"type": "STRING", "enum": ["a"]}, {}]}}
            ])
        );
        let looping = json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}});
        assert_eq!(response_schema(&looping), json!({}));
    }

    #[test]
    fn effort_maps_to_each_model_generation() {
        assert_eq!(thinking_config("gemini-2.5-flash", ReasoningEffort::Minimal), json!({"thinkingBudget": 0}));
        assert_eq!(thinking_config("gemini-2.5-pro", ReasoningEffort::Minimal), json!({"thinkingBudget": 128}));
        assert_eq!(thinking_config("gemini-2.5-pro", ReasoningEffort::High), json!({"thinkingBudget": 24_576}));
        assert_eq!(thinking_config("gemini-3-pro-preview", ReasoningEffort::Medium), json!({"thinkingLevel": "high"}));
    }
}
