//! The Gemini provider against a scripted server speaking the
//! `generateContent` wire format: the key header, `systemInstruction`,
//! `responseSchema`, `thinkingConfig`, SSE streaming, aliases and errors.

use std::time::Duration;

use agentmesh_llm::gemini::{Gemini, GeminiConfig};
use agentmesh_llm::{
    CompletionRequest, LlmError, LlmProvider, Message, ReasoningEffort, ResponseSchema, RetryPolicy, StructuredMode,
};
use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply};
use serde_json::json;

fn plan_request() -> CompletionRequest {
    CompletionRequest {
        messages: vec![
            Message::system("You plan."),
            Message::user("Weather in Chicago?"),
            Message { role: agentmesh_llm::Role::Assistant, content: "{}".into() },
            Message::user("Again, with steps."),
        ],
        temperature: Some(0.2),
        max_tokens: Some(256),
        response_schema: Some(ResponseSchema {
            name: "plan".into(),
            schema: json!({"type": "object", "additionalProperties": false, "required": ["steps"],
                "properties": {"steps": {"type": "array", "items": {"anyOf": [
                    {"type": "object", "properties": {"agent": {"const": "weather-tool-v2"}}}]}}}}),
        }),
        ..Default::default()
    }
}

fn provider(server: &ScriptedLlmServer, model: &str) -> Gemini {
    let mut config = GeminiConfig::new(server.url(), model);
    config.api_key = Some(secrecy::SecretString::from("gemini-test-secret"));
    config.http.retry =
        RetryPolicy { max_retries: 2, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(50) };
    Gemini::new(config).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn generate_content_sends_the_schema_and_reads_the_answer_without_thoughts() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::gemini_text(r#"{"steps": []}"#)]).await.unwrap();
    let p = provider(&server, "flash");
    let c = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.text, r#"{"steps": []}"#, "thought summaries are not part of the answer");
    assert_eq!(c.provider, "gemini");
    assert_eq!(c.model, "gemini-2.5-flash");
    assert_eq!(c.structured_mode, Some(StructuredMode::JsonSchema));
    assert_eq!((c.usage.prompt_tokens, c.usage.completion_tokens), (50, 20), "thinking tokens count as output");

    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(sent.header("x-goog-api-key"), Some("gemini-test-secret"));
    assert!(sent.query.is_none(), "the key never travels in the URL");
    let body = &sent.body;
    assert_eq!(body["systemInstruction"], json!({"parts": [{"text": "You plan."}]}));
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "Weather in Chicago?"}]},
            {"role": "model", "parts": [{"text": "{}"}]},
            {"role": "user", "parts": [{"text": "Again, with steps."}]}
        ])
    );
    let config = &body["generationConfig"];
    assert_eq!(config["temperature"], json!(0.2f32));
    assert_eq!(config["maxOutputTokens"], 256);
    assert_eq!(config["responseMimeType"], "application/json");
    assert_eq!(
        config["responseSchema"],
        json!({"type": "OBJECT", "required": ["steps"], "properties": {"steps": {"type": "ARRAY",
            "items": {"anyOf": [{"type": "OBJECT", "properties": {"agent": {"type": "STRING", "enum": ["weather-tool-v2"]}}}]}}}})
    );
    assert!(config.get("thinkingConfig").is_none());
}

#[tokio::test]
async fn effort_and_model_preference_pick_the_thinking_config_and_the_path() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::gemini_text("ok")]).await.unwrap();
    let p = provider(&server, "gemini-2.5-flash");
    let request = CompletionRequest {
        messages: vec![Message::user("hi")],
        reasoning_effort: Some(ReasoningEffort::Medium),
        model: Some("pro".into()),
        ..Default::default()
    };
    p.complete(&request).await.unwrap_or_else(|e| panic!("{e}"));
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-pro:generateContent");
    assert_eq!(sent.body["generationConfig"]["thinkingConfig"], json!({"thinkingBudget": 8192}));
    assert!(p.accepts_model("flash") && !p.accepts_model("opus"));
}

#[tokio::test]
async fn streaming_uses_sse_and_delivers_each_chunk() {
    let server =
        ScriptedLlmServer::start(vec![ScriptedReply::gemini_stream(&[r#"{"steps""#, ": [", "]}"])]).await.unwrap();
    let p = provider(&server, "flash");
    let mut pieces = Vec::new();
    let c = p.stream(&plan_request(), &mut |t| pieces.push(t.to_owned())).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pieces, [r#"{"steps""#, ": [", "]}"]);
    assert_eq!(c.text, r#"{"steps": []}"#);
    assert_eq!(c.usage.prompt_tokens, 50);
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:streamGenerateContent");
    assert_eq!(sent.query.as_deref(), Some("alt=sse"));
}

#[tokio::test]
async fn blocked_prompts_and_errors_are_reported() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::ok(json!({"promptFeedback": {"blockReason": "SAFETY"}, "modelVersion": "gemini-2.5-flash"})),
        ScriptedReply::error(
            503,
            json!({"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}),
        ),
        ScriptedReply::gemini_text("ok"),
        ScriptedReply::error(
            400,
            json!({"error": {"code": 400, "message": "Invalid JSON payload", "status": "INVALID_ARGUMENT"}}),
        ),
    ])
    .await
    .unwrap();
    let p = provider(&server, "flash");
    let hi = CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() };
    let err = p.complete(&hi).await.err().unwrap_or_else(|| panic!("succeeded"));
    assert!(matches!(&err, LlmError::InvalidResponse(m) if m.contains("SAFETY")), "{err}");
    assert_eq!(p.complete(&hi).await.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")), "ok", "503 retried");
    let err = p.complete(&hi).await.err().unwrap_or_else(|| panic!("succeeded"));
    assert!(matches!(err, LlmError::BadRequest { status: 400, .. }), "{err}");
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn an_answer_stopped_at_max_tokens_is_marked_truncated() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::ok(json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": "{\"steps\": ["}]},
            "finishReason": "MAX_TOKENS", "index": 0}],
        "modelVersion": "gemini-2.5-flash"
    }))])
    .await
    .unwrap();
    let p = provider(&server, "flash");
    let c = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(c.truncated);
    let config = GeminiConfig { api_key: Some("gemini-test-secret".into()), ..GeminiConfig::new("http://x", "m") };
    assert!(!format!("{config:?}").contains("gemini-test-secret"), "keys never appear in Debug output");
}
