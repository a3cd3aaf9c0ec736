//! The OpenAI-compatible provider against a scripted server speaking the
//! chat completions wire format: request bodies per structured-output
//! dialect, `auto` fallback, reasoning models, streaming, model aliases,
//! HTTPS, retries and errors.

use std::time::Duration;

use agentmesh_llm::openai::{OpenAiCompatible, OpenAiConfig};
use agentmesh_llm::{
    CompletionRequest, LlmError, LlmProvider, Message, ReasoningEffort, ResponseSchema, RetryPolicy, StructuredMode,
    StructuredSetting,
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
            schema: json!({"type": "object", "properties": {"steps": {"type": "array"}}, "required": ["steps"], "additionalProperties": false}),
        }),
        ..Default::default()
    }
}

fn provider(server: &ScriptedLlmServer, model: &str, structured: StructuredSetting) -> OpenAiCompatible {
    let mut config = OpenAiConfig::new(format!("{}/v1", server.url()), model);
    config.structured = structured;
    config.api_key = Some(secrecy::SecretString::from("sk-test-secret"));
    config.http.retry =
        RetryPolicy { max_retries: 2, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(50) };
    OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn json_schema_mode_sends_strict_response_format_and_reads_usage() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::openai_content(r#"{"steps": []}"#)]).await.unwrap();
    let p = provider(&server, "gpt-4o-mini", StructuredSetting::Fixed(StructuredMode::JsonSchema));
    let c = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.text, r#"{"steps": []}"#);
    assert_eq!((c.usage.prompt_tokens, c.usage.completion_tokens), (12, 7));
    assert_eq!(c.structured_mode, Some(StructuredMode::JsonSchema));
    assert_eq!(c.model, "scripted-model");
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.header("authorization"), Some("Bearer sk-test-secret"));
    assert_eq!(sent.body["model"], "gpt-4o-mini");
    assert_eq!(sent.body["temperature"], json!(0.2f32));
    assert_eq!(sent.body["max_tokens"], 256);
    assert_eq!(sent.body["messages"][0], json!({"role": "system", "content": "You plan."}));
    assert_eq!(sent.body["response_format"]["type"], "json_schema");
    assert_eq!(sent.body["response_format"]["json_schema"]["name"], "plan");
    assert_eq!(sent.body["response_format"]["json_schema"]["strict"], true);
    assert_eq!(sent.body["response_format"]["json_schema"]["schema"]["required"], json!(["steps"]));
}

#[tokio::test]
async fn json_object_mode_uses_the_llama_cpp_python_dialect() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::openai_content("{}")]).await.unwrap();
    let p = provider(&server, "smollm2", StructuredSetting::Fixed(StructuredMode::JsonObject));
    p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    let body = &server.requests()[0].body;
    assert_eq!(body["response_format"]["type"], "json_object");
    assert_eq!(body["response_format"]["schema"]["required"], json!(["steps"]));
    assert!(body.get("tools").is_none());
}

#[tokio::test]
async fn tool_mode_forces_one_function_and_reads_its_arguments() {
    let server =
        ScriptedLlmServer::start(vec![ScriptedReply::openai_tool_call("plan", r#"{"steps": [1]}"#)]).await.unwrap();
    let p = provider(&server, "llama3", StructuredSetting::Fixed(StructuredMode::Tool));
    let c = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.text, r#"{"steps": [1]}"#);
    let body = &server.requests()[0].body;
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "plan");
    assert_eq!(body["tools"][0]["function"]["parameters"]["required"], json!(["steps"]));
    assert_eq!(body["tool_choice"], json!({"type": "function", "function": {"name": "plan"}}));
    assert!(body.get("response_format").is_none());
}

#[tokio::test]
async fn none_mode_describes_the_schema_in_the_prompt_only() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::openai_content("{}")]).await.unwrap();
    let p = provider(&server, "tiny", StructuredSetting::Fixed(StructuredMode::None));
    p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    let body = &server.requests()[0].body;
    assert!(body.get("response_format").is_none() && body.get("tools").is_none());
    let last = body["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
    assert_eq!(last["role"], "system");
    assert!(last["content"].as_str().unwrap_or_default().contains(r#""required":["steps"]"#));
}

#[tokio::test]
async fn auto_falls_back_from_a_rejected_mode_and_remembers_per_server() {
    let rejected =
        json!({"error": {"message": "Unsupported response_format type json_schema", "type": "internal_server_error"}});
    let server = ScriptedLlmServer::start(vec![
        // llama-cpp-python answers json_schema with an HTTP 500 naming response_format.
        ScriptedReply::error(500, rejected),
        ScriptedReply::openai_content(r#"{"steps": []}"#),
        ScriptedReply::openai_content(r#"{"steps": ["again"]}"#),
    ])
    .await
    .unwrap();
    let p = provider(&server, "smollm2", StructuredSetting::Auto);
    let first = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.structured_mode, Some(StructuredMode::JsonObject));
    let second = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(second.text, r#"{"steps": ["again"]}"#);
    let modes: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.body["response_format"]["type"].as_str().unwrap_or("-").to_owned())
        .collect();
    assert_eq!(
        modes,
        ["json_schema", "json_object", "json_object"],
        "a schema refused once is not sent again in that mode"
    );
}

#[tokio::test]
async fn reasoning_models_get_max_completion_tokens_and_effort_without_temperature() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::openai_content("ok")]).await.unwrap();
    let p = provider(&server, "o3-mini", StructuredSetting::Auto);
    let request = CompletionRequest {
        messages: vec![Message::user("hi")],
        temperature: Some(0.7),
        max_tokens: Some(100),
        response_schema: None,
        reasoning_effort: Some(ReasoningEffort::Low),
        model: None,
    };
    p.complete(&request).await.unwrap_or_else(|e| panic!("{e}"));
    let body = &server.requests()[0].body;
    assert_eq!(body["max_completion_tokens"], 100);
    assert_eq!(body["reasoning_effort"], "low");
    assert!(body.get("temperature").is_none() && body.get("max_tokens").is_none());
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried_honouring_retry_after() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::error(429, json!({"error": {"message": "slow down"}})).with_header("retry-after", "0"),
        ScriptedReply::error(503, json!({"error": {"message": "overloaded"}})),
        ScriptedReply::openai_content("fine"),
    ])
    .await
    .unwrap();
    let p = provider(&server, "gpt-4o-mini", StructuredSetting::Auto);
    let c = p.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await;
    assert_eq!(c.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")), "fine");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn exhausted_retries_are_unavailable_and_a_bad_request_is_final() {
    let down = ScriptedLlmServer::start(vec![ScriptedReply::error(502, json!({})); 3]).await.unwrap();
    let p = provider(&down, "gpt-4o-mini", StructuredSetting::Auto);
    let err = p.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await;
    let err = err.err().unwrap_or_else(|| panic!("succeeded"));
    assert!(matches!(err, LlmError::Unavailable { attempts: 3, .. }), "{err}");
    assert!(err.should_fall_back());
    assert_eq!(down.requests().len(), 3);

    let bad = ScriptedLlmServer::start(vec![ScriptedReply::error(
        400,
        json!({"error": {"message": "messages is required"}}),
    )])
    .await
    .unwrap();
    let p = provider(&bad, "gpt-4o-mini", StructuredSetting::Auto);
    let err = p.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await;
    let err = err.err().unwrap_or_else(|| panic!("succeeded"));
    assert!(matches!(err, LlmError::BadRequest { status: 400, .. }), "{err}");
    assert!(!err.should_fall_back(), "a 400 about the request itself never moves down the chain");
    assert_eq!(bad.requests().len(), 1, "not retried");

    let auth = ScriptedLlmServer::start(vec![ScriptedReply::error(401, json!({"error": "bad key"}))]).await.unwrap();
    let p = provider(&auth, "gpt-4o-mini", StructuredSetting::Auto);
    let err = p.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await;
    let err = err.err().unwrap_or_else(|| panic!("succeeded"));
    assert!(matches!(err, LlmError::Auth { status: 401 }));
    assert!(!err.to_string().contains("sk-test-secret"), "keys never appear in errors");
}

#[tokio::test]
async fn streaming_delivers_pieces_in_order_and_reads_usage_from_the_last_chunk() {
    let server =
        ScriptedLlmServer::start(vec![ScriptedReply::openai_stream(&[r#"{"ste"#, r#"ps": "#, "[]}"])]).await.unwrap();
    let p = provider(&server, "gpt-4o-mini", StructuredSetting::Fixed(StructuredMode::JsonSchema));
    let mut pieces = Vec::new();
    let c =
        p.stream(&plan_request(), &mut |piece| pieces.push(piece.to_owned())).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pieces, [r#"{"ste"#, r#"ps": "#, "[]}"]);
    assert_eq!(c.text, r#"{"steps": []}"#);
    assert_eq!((c.usage.prompt_tokens, c.usage.completion_tokens), (12, 7));
    let body = &server.requests()[0].body;
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(body["response_format"]["type"], "json_schema");
}

#[tokio::test]
async fn streaming_in_tool_mode_joins_the_argument_deltas() {
    let chunk = |args: &str| {
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0,
            "delta": {"tool_calls": [{"index": 0, "function": {"arguments": args}}]}, "finish_reason": null}]})
    };
    let server = ScriptedLlmServer::start(vec![ScriptedReply::sse(&[
        (None, chunk(r#"{"steps""#)),
        (None, chunk(r#": []}"#)),
        (None, json!("[DONE]")),
    ])])
    .await
    .unwrap();
    let p = provider(&server, "llama3", StructuredSetting::Fixed(StructuredMode::Tool));
    let c = p.stream(&plan_request(), &mut |_| {}).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.text, r#"{"steps": []}"#);
}

#[tokio::test]
async fn a_request_may_prefer_a_model_by_alias() {
    let server =
        ScriptedLlmServer::start(vec![ScriptedReply::openai_content("ok"), ScriptedReply::openai_content("ok")])
            .await
            .unwrap();
    let mut config = OpenAiConfig::new(format!("{}/v1", server.url()), "gpt-4.1-mini");
    config.family = agentmesh_llm::models::Family::OpenAi;
    let p = OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"));
    let request = CompletionRequest {
        messages: vec![Message::user("hi")],
        temperature: Some(0.3),
        model: Some("fast".into()),
        reasoning_effort: Some(ReasoningEffort::Minimal),
        ..Default::default()
    };
    p.complete(&request).await.unwrap_or_else(|e| panic!("{e}"));
    p.complete(&CompletionRequest { model: None, ..request }).await.unwrap_or_else(|e| panic!("{e}"));
    let sent = server.requests();
    assert_eq!(sent[0].body["model"], "gpt-5-mini");
    assert_eq!(sent[0].body["reasoning_effort"], "minimal", "a reasoning model takes the effort");
    assert!(sent[0].body.get("temperature").is_none());
    assert_eq!(sent[1].body["model"], "gpt-4.1-mini");
    assert_eq!(sent[1].body["temperature"], json!(0.3f32));
    assert!(!p.accepts_model("sonnet") && p.accepts_model("gpt-5"));

    let mut config = OpenAiConfig::new(format!("{}/v1", server.url()), "smart");
    config.family = agentmesh_llm::models::Family::OpenAi;
    let configured = OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(configured.model(), "gpt-5", "an alias as the configured model resolves too");
}

#[tokio::test]
async fn https_works_with_a_trusted_ca_and_fails_clearly_without() {
    let server = ScriptedLlmServer::start_tls(vec![ScriptedReply::openai_content("secure")]).await.unwrap();
    assert!(server.url().starts_with("https://"));
    let ca = std::env::temp_dir().join(format!("agentmesh-test-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, agentmesh_testkit::TEST_CA_PEM).unwrap();

    let mut config = OpenAiConfig::new(format!("{}/v1", server.url()), "gpt-4o-mini");
    config.http.ca_file = Some(ca.clone());
    let p = OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"));
    let c = p.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await;
    assert_eq!(c.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")), "secure");

    let mut config = OpenAiConfig::new(format!("{}/v1", server.url()), "gpt-4o-mini");
    config.http.retry.max_retries = 0;
    let p = OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"));
    let err = p.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await;
    let err = err.err().unwrap_or_else(|| panic!("an unknown CA was trusted"));
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    assert_eq!(server.requests().len(), 1, "the untrusted call never reached the server");
    let _ = std::fs::remove_file(ca);
}

#[tokio::test]
async fn preferences_apply_to_requests_that_set_none() {
    let server =
        ScriptedLlmServer::start(vec![ScriptedReply::openai_content("ok"), ScriptedReply::openai_content("ok")])
            .await
            .unwrap();
    let p = provider(&server, "gpt-4o-mini", StructuredSetting::Auto);
    let preferred = agentmesh_llm::Preferred::new(&p, Some("o4-mini".into()), Some(ReasoningEffort::High));
    preferred.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await.unwrap();
    let own = CompletionRequest {
        messages: vec![Message::user("hi")],
        model: Some("gpt-4.1".into()),
        reasoning_effort: Some(ReasoningEffort::Low),
        ..Default::default()
    };
    preferred.complete(&own).await.unwrap();
    let sent = server.requests();
    assert_eq!((&sent[0].body["model"], &sent[0].body["reasoning_effort"]), (&json!("o4-mini"), &json!("high")));
    assert_eq!(sent[1].body["model"], "gpt-4.1", "a request's own choice stands");
}

#[tokio::test]
async fn no_retry_after_header_makes_the_client_panic_or_sleep_forever() {
    let slow = |value: &str| ScriptedReply::error(429, json!({"error": "slow down"})).with_header("retry-after", value);
    let server = ScriptedLlmServer::start(vec![
        slow("1e20"),
        slow("-1"),
        slow("99999999999999999999999999"),
        slow("NaN"),
        ScriptedReply::openai_content("fine"),
    ])
    .await
    .unwrap();
    let mut config = OpenAiConfig::new(format!("{}/v1", server.url()), "gpt-4o-mini");
    config.http.retry =
        RetryPolicy { max_retries: 4, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(50) };
    let p = OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"));
    let c = p.complete(&CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() }).await;
    assert_eq!(c.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")), "fine");
    assert_eq!(server.requests().len(), 5);
}

#[tokio::test]
async fn an_answer_cut_off_at_the_token_limit_says_so_whole_or_streamed() {
    let cut = ScriptedReply::ok(json!({
        "id": "c", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "{\"steps\": [{\"ag"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 256}
    }));
    let chunk = |content: &str, finish: serde_json::Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]})
    };
    let streamed_cut = ScriptedReply::sse(&[
        (None, chunk("{\"steps\"", serde_json::Value::Null)),
        (None, chunk("", json!("length"))),
        (None, json!("[DONE]")),
    ]);
    let server = ScriptedLlmServer::start(vec![cut, streamed_cut, ScriptedReply::openai_content("{}")]).await.unwrap();
    let p = provider(&server, "gpt-4o-mini", StructuredSetting::Fixed(StructuredMode::JsonObject));
    let c = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(c.truncated, "finish_reason length is a truncated answer");
    let c = p.stream(&plan_request(), &mut |_| {}).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(c.truncated, "a streamed finish_reason length too");
    let c = p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.truncated);
}

#[tokio::test]
async fn an_answer_larger_than_the_limit_is_refused_whole_or_streamed() {
    let huge = "x".repeat(200_000);
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content(&huge),
        ScriptedReply::openai_stream(&[&huge[..100_000], &huge[100_000..]]),
        ScriptedReply::openai_content("small"),
    ])
    .await
    .unwrap();
    let mut config = OpenAiConfig::new(format!("{}/v1", server.url()), "gpt-4o-mini");
    config.http.max_response_bytes = 64 * 1024;
    let p = OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"));
    let hi = CompletionRequest { messages: vec![Message::user("hi")], ..Default::default() };
    let err = p.complete(&hi).await.err().unwrap_or_else(|| panic!("a 200 kB answer was read"));
    assert!(err.to_string().contains("max_response_bytes"), "{err}");
    assert!(!err.should_fall_back(), "{err}");
    let err = p.stream(&hi, &mut |_| {}).await.err().unwrap_or_else(|| panic!("a 200 kB stream was read"));
    assert!(err.to_string().contains("max_response_bytes"), "{err}");
    assert_eq!(p.complete(&hi).await.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")), "small");
}

#[tokio::test]
async fn a_schema_a_server_rejects_does_not_downgrade_other_schemas_or_models() {
    let rejected = || {
        ScriptedReply::error(
            400,
            json!({"error": {"message": "Invalid schema for response_format 'plan': prefixItems is not permitted"}}),
        )
    };
    let ok = || ScriptedReply::openai_content("{}");
    let server = ScriptedLlmServer::start(vec![
        // Schema A: json_schema rejected, json_object works.
        rejected(),
        ok(),
        // Schema B: json_schema still tried first, and works.
        ok(),
        // Schema A again: straight to json_object.
        ok(),
    ])
    .await
    .unwrap();
    let p = provider(&server, "gpt-4o-mini", StructuredSetting::Auto);
    let with_schema = |schema: serde_json::Value| CompletionRequest {
        response_schema: Some(ResponseSchema { name: "plan".into(), schema }),
        ..plan_request()
    };
    let a = with_schema(json!({"type": "object", "properties": {"steps": {"type": "array", "prefixItems": []}}}));
    let b = with_schema(json!({"type": "object", "properties": {"selected": {"type": "array"}}}));
    for request in [&a, &b, &a] {
        p.complete(request).await.unwrap_or_else(|e| panic!("{e}"));
    }
    let modes: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.body["response_format"]["type"].as_str().unwrap_or("-").to_owned())
        .collect();
    assert_eq!(modes, ["json_schema", "json_object", "json_schema", "json_object"]);
    assert_eq!(p.structured_mode(), Some(StructuredMode::JsonSchema), "one schema's rejection is not the server's");
}

#[tokio::test]
async fn a_mode_a_server_never_accepts_is_learned_per_model() {
    let unsupported =
        || ScriptedReply::error(500, json!({"error": {"message": "Unsupported response_format type json_schema"}}));
    let ok = || ScriptedReply::openai_content("{}");
    let server = ScriptedLlmServer::start(vec![unsupported(), ok(), unsupported(), ok(), ok(), ok()]).await.unwrap();
    let small = provider(&server, "smollm2", StructuredSetting::Auto);
    let with_schema = |n: usize| CompletionRequest {
        response_schema: Some(ResponseSchema {
            name: "plan".into(),
            schema: json!({"type": "object", "maxProperties": n}),
        }),
        ..plan_request()
    };
    // Two different schemas rejected, json_schema never accepted: the server
    // does not take it, for this model.
    for n in 1..=3 {
        small.complete(&with_schema(n)).await.unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(small.structured_mode(), Some(StructuredMode::JsonObject));
    let other = provider(&server, "another-model", StructuredSetting::Auto);
    assert_eq!(other.structured_mode(), Some(StructuredMode::JsonSchema), "learned per model");
    other.complete(&with_schema(1)).await.unwrap_or_else(|e| panic!("{e}"));
    let modes: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.body["response_format"]["type"].as_str().unwrap_or("-").to_owned())
        .collect();
    assert_eq!(modes, ["json_schema", "json_object", "json_schema", "json_object", "json_object", "json_schema"]);
}

#[test]
fn the_api_key_never_appears_in_debug_output() {
    let mut config = OpenAiConfig::new("http://127.0.0.1:1/v1", "gpt-4o-mini");
    config.api_key = Some(secrecy::SecretString::from("sk-test-secret"));
    let shown = format!("{config:?}");
    assert!(!shown.contains("sk-test-secret") && shown.contains("api_key"), "{shown}");
}

#[tokio::test]
async fn a_base_url_keeps_its_query_after_the_path_and_its_secrets_out_of_errors() {
    // The server echoes what it was sent, as some do in their error bodies.
    let echo = "invalid request: key sk-test-secret, api_key=q-secret-value, user pw-secret-value";
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content("{}"),
        ScriptedReply::error(400, json!({"error": {"message": echo}})),
        ScriptedReply::error(503, json!({"error": {"message": echo}})),
        ScriptedReply::openai_content("{}"),
    ])
    .await
    .unwrap();
    let base = format!("http://alice:pw-secret-value@{}/v1?api_key=q-secret-value", server.addr);
    let mut config = OpenAiConfig::new(base.clone(), "m");
    config.structured = StructuredSetting::Fixed(StructuredMode::None);
    config.api_key = Some(secrecy::SecretString::from("sk-test-secret"));
    config.http.retry =
        RetryPolicy { max_retries: 0, base_delay: Duration::from_millis(1), max_delay: Duration::from_millis(1) };
    let p = OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"));
    p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    let sent = &server.requests()[0];
    // The query stays a query, after the path; the key stays the bearer.
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.query.as_deref(), Some("api_key=q-secret-value"));
    assert_eq!(sent.header("authorization"), Some("Bearer sk-test-secret"));
    for _ in 0..2 {
        let error = p.complete(&plan_request()).await.expect_err("an error answer").to_string();
        for secret in ["sk-test-secret", "q-secret-value", "pw-secret-value"] {
            assert!(!error.contains(secret), "{secret} in {error}");
        }
        assert!(error.contains("key ***, api_key=***, user ***"), "{error}");
    }

    // Without a key, the user info is HTTP Basic authentication.
    let mut config = OpenAiConfig::new(base, "m");
    config.structured = StructuredSetting::Fixed(StructuredMode::None);
    let p = OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"));
    p.complete(&plan_request()).await.unwrap_or_else(|e| panic!("{e}"));
    let sent = server.requests().pop().expect("a request");
    // base64("alice:pw-secret-value")
    assert_eq!(sent.header("authorization"), Some("Basic YWxpY2U6cHctc2VjcmV0LXZhbHVl"));
}
