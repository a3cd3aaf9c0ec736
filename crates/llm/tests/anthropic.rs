//! The Anthropic provider against a scripted server speaking the Messages
//! wire format: headers, the system prompt, structured output through a
//! forced tool, extended thinking, streaming events, aliases and errors.

use std::time::Duration;

use agentmesh_llm::anthropic::{Anthropic, AnthropicConfig};
use agentmesh_llm::{
    CompletionRequest, LlmError, LlmProvider, Message, ReasoningEffort, ResponseSchema, RetryPolicy, StructuredMode,
};
use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply};
use serde_json::json;

fn plan_request() -> CompletionRequest {
    CompletionRequest {
        messages: vec![Message::system("You plan."), Message::user("Weather in Chicago?")],
        temperature: Some(0.2),
        max_tokens: Some(256),
        response_schema: Some(ResponseSchema {
            name: "plan".into(),
            schema: json!({"type": "object", "properties": {"steps": {"type": "array"}}, "required": ["steps"]}),
        }),
        ..Default::default()
    }
}

fn provider(server: &ScriptedLlmServer, model: &str) -> Anthropic {
    let mut config = AnthropicConfig::new(server.url(), model);
    config.api_key = Some(secrecy::SecretString::from("sk-ant-test-secret"));
    config.http.retry =
        RetryPolicy { max_retries: 2, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(50) };
    Anthropic::new(config).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn a_schema_is_a_forced_tool_and_the_answer_is_its_input() {
    let server =
        ScriptedLlmServer::start(vec![ScriptedReply::anthropic_tool_use("plan", json!({"steps": []}))]).await.unwrap();
    let p = provider(&server, "sonnet");
    assert_eq!(p.model(), "claude-sonnet-4-5", "aliases resolve in the configuration too");
    let c = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&c.text).ok(), Some(json!({"steps": []})));
    assert_eq!(c.provider, "anthropic");
    assert_eq!(c.model, "claude-scripted");
    assert_eq!(c.structured_mode, Some(StructuredMode::Tool));
    assert_eq!((c.usage.prompt_tokens, c.usage.completion_tokens), (40, 21));

    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some("sk-ant-test-secret"));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert!(sent.header("authorization").is_none());
    let body = &sent.body;
    assert_eq!(body["model"], "claude-sonnet-4-5");
    assert_eq!(body["system"], "You plan.");
    assert_eq!(body["messages"], json!([{"role": "user", "content": "Weather in Chicago?"}]));
    assert_eq!(body["max_tokens"], 256);
    assert_eq!(body["temperature"], json!(0.2f32));
    assert_eq!(body["tools"][0]["name"], "plan");
    assert_eq!(body["tools"][0]["input_schema"]["required"], json!(["steps"]));
    assert_eq!(body["tool_choice"], json!({"type": "tool", "name": "plan"}));
    assert!(body.get("thinking").is_none() && body.get("stream").is_none());
}

#[tokio::test]
async fn reasoning_effort_becomes_a_thinking_budget_without_forced_tool_or_temperature() {
    let server =
        ScriptedLlmServer::start(vec![ScriptedReply::anthropic_tool_use("plan", json!({"steps": []}))]).await.unwrap();
    let p = provider(&server, "claude-opus-4-5");
    let request = CompletionRequest {
        reasoning_effort: Some(ReasoningEffort::High),
        model: Some("haiku".into()),
        ..plan_request()
    };
    p.complete(&request).await.unwrap_or_else(|e| panic!("{e}"));
    let body = &server.requests()[0].body;
    assert_eq!(body["model"], "claude-haiku-4-5", "the request's preference wins");
    assert_eq!(body["thinking"], json!({"type": "enabled", "budget_tokens": 16384}));
    assert_eq!(body["max_tokens"], 256 + 16384, "the budget comes on top of the answer's tokens");
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    assert!(body.get("temperature").is_none());
    assert!(body["system"].as_str().is_some_and(|s| s.contains("calling the tool `plan`")));
}

#[tokio::test]
async fn plain_text_answers_without_a_schema() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::anthropic_text("Hello.")]).await.unwrap();
    let p = provider(&server, "haiku");
    let c = p
        .complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.text, "Hello.");
    assert_eq!(c.structured_mode, None);
    let body = &server.requests()[0].body;
    assert_eq!(body["max_tokens"], 4096, "the API requires a limit; a default is sent");
    assert!(body.get("tools").is_none() && body.get("system").is_none());
}

#[tokio::test]
async fn streaming_reads_text_and_tool_input_deltas() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::anthropic_stream(None, &["Hel", "lo", "."]),
        ScriptedReply::anthropic_stream(Some("plan"), &[r#"{"steps"#, r#"": []}"#]),
    ])
    .await
    .unwrap();
    let p = provider(&server, "sonnet");
    let mut pieces = Vec::new();
    let c = p
        .stream(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }, &mut |t| {
            pieces.push(t.to_owned())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pieces, ["Hel", "lo", "."]);
    assert_eq!(c.text, "Hello.");
    assert_eq!((c.usage.prompt_tokens, c.usage.completion_tokens), (30, 15));
    assert_eq!(server.requests()[0].body["stream"], true);

    let c = p.stream(&plan_request(), &mut |_| {}).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.text, r#"{"steps": []}"#);
    assert_eq!(c.structured_mode, Some(StructuredMode::Tool));
}

#[tokio::test]
async fn overload_is_retried_auth_and_bad_requests_are_not() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::error(529, json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        ScriptedReply::anthropic_text("ok"),
        ScriptedReply::error(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: field required"}})),
        ScriptedReply::error(401, json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}})),
    ])
    .await
    .unwrap();
    let p = provider(&server, "sonnet");
    let hi = CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() };
    assert_eq!(p.complete(&hi).await.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")), "ok");
    let err = p.complete(&hi).await.err().unwrap_or_else(|| panic!("succeeded"));
    assert!(matches!(err, LlmError::BadRequest { status: 400, .. }) && !err.should_fall_back(), "{err}");
    let err = p.complete(&hi).await.err().unwrap_or_else(|| panic!("succeeded"));
    assert!(matches!(err, LlmError::Auth { status: 401 }) && err.should_fall_back(), "{err}");
    assert!(!err.to_string().contains("sk-ant-test-secret"));
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn a_stream_naming_an_absurd_block_index_is_an_error_not_a_panic() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::sse(&[
        (
            Some("message_start"),
            json!({"type": "message_start", "message": {"model": "claude-scripted", "usage": {"input_tokens": 1}}}),
        ),
        (
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": u64::MAX, "content_block": {"type": "text", "text": ""}}),
        ),
        (Some("message_stop"), json!({"type": "message_stop"})),
    ])])
    .await
    .unwrap();
    let p = provider(&server, "sonnet");
    let request = CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() };
    let err = p.stream(&request, &mut |_| {}).await.err().unwrap_or_else(|| panic!("an absurd index was accepted"));
    assert!(err.to_string().contains("index"), "{err}");
}

#[tokio::test]
async fn an_answer_stopped_at_max_tokens_is_marked_truncated() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::ok(json!({
        "id": "msg", "type": "message", "role": "assistant", "model": "claude-scripted",
        "content": [{"type": "text", "text": "{\"steps\": ["}], "stop_reason": "max_tokens",
        "usage": {"input_tokens": 30, "output_tokens": 256}
    }))])
    .await
    .unwrap();
    let p = provider(&server, "sonnet");
    let c = p.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await;
    assert!(c.unwrap_or_else(|e| panic!("{e}")).truncated);
    let config =
        AnthropicConfig { api_key: Some("sk-ant-test-secret".into()), ..AnthropicConfig::new("http://x", "m") };
    assert!(!format!("{config:?}").contains("sk-ant-test-secret"), "keys never appear in Debug output");
}
