//! The provider chain built from `--llm`: providers tried in order, moving on
//! after unavailability but not after a bad request, and a request's model
//! preference putting the providers that serve it first.

use std::time::Duration;

use agentmesh_llm::{CompletionRequest, HttpSettings, LlmError, LlmProvider, Message, RetryPolicy};
use agentmesh_planner::providers::{ProviderOptions, build};
use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply};
use serde_json::json;

fn options(server: &ScriptedLlmServer) -> ProviderOptions {
    ProviderOptions {
        base_url: Some(server.url()),
        structured: "auto".into(),
        http: HttpSettings {
            timeout: Duration::from_secs(5),
            retry: RetryPolicy { max_retries: 0, ..Default::default() },
            ca_file: None,
            max_response_bytes: agentmesh_llm::DEFAULT_MAX_RESPONSE_BYTES,
        },
    }
}

fn hi(model: Option<&str>) -> CompletionRequest {
    CompletionRequest { messages: vec![Message::user("hi")], model: model.map(str::to_owned), ..Default::default() }
}

#[tokio::test]
async fn the_chain_moves_on_after_an_outage_but_not_after_a_bad_request() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::error(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
        ScriptedReply::gemini_text("from gemini"),
        ScriptedReply::error(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}),
        ),
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let chain = build("anthropic:sonnet, gemini:flash", &options(&server)).unwrap_or_else(|e| panic!("{e}"));
    let c = chain.complete(&hi(None)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((c.provider.as_str(), c.text.as_str()), ("gemini", "from gemini"));
    let err = chain.complete(&hi(None)).await.err().unwrap_or_else(|| panic!("succeeded"));
    assert!(matches!(err, LlmError::BadRequest { status: 400, .. }), "{err}");
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/messages", "/v1beta/models/gemini-2.5-flash:generateContent", "/v1/messages"]);
}

#[tokio::test]
async fn a_model_preference_tries_the_provider_serving_it_first() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::gemini_text("pro answered"),
        ScriptedReply::anthropic_text("opus answered"),
        ScriptedReply::anthropic_text("default"),
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let chain = build("anthropic:sonnet,gemini:flash", &options(&server)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        chain.complete(&hi(Some("pro"))).await.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")),
        "pro answered"
    );
    assert_eq!(
        chain.complete(&hi(Some("opus"))).await.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")),
        "opus answered"
    );
    assert_eq!(chain.complete(&hi(Some("auto"))).await.map(|c| c.text).unwrap_or_else(|e| panic!("{e}")), "default");
    let sent = server.requests();
    assert_eq!(sent[0].path, "/v1beta/models/gemini-2.5-pro:generateContent");
    assert_eq!(sent[1].body["model"], "claude-opus-4-5");
    assert_eq!(sent[2].body["model"], "claude-sonnet-4-5");
}

#[tokio::test]
async fn unknown_providers_and_malformed_specs_are_explained() {
    let server = ScriptedLlmServer::start(Vec::new()).await.unwrap_or_else(|e| panic!("{e}"));
    let err = build("mistral:large", &options(&server)).err().unwrap_or_else(|| panic!("built"));
    assert!(err.to_string().contains("unknown LLM provider `mistral`"), "{err}");
    let err = build("gpt-4o", &options(&server)).err().unwrap_or_else(|| panic!("built"));
    assert!(err.to_string().contains("provider:model"), "{err}");
    let mut bad_structured = options(&server);
    bad_structured.structured = "grammar".into();
    assert!(build("openai:x", &bad_structured).is_err());
}
