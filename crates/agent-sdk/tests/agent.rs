//! The SDK against the real services: an agent registers with discovery,
//! serves the executor's calls (idempotency, retryable errors,
//! collaboration requests), heartbeats, and deregisters when stopped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use agentmesh_agent::{Agent, AgentError, Call, Capability, Options};
use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{TestDatabase, spawn_discovery};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize, JsonSchema)]
struct Text {
    text: String,
}

#[derive(Serialize, JsonSchema)]
struct Count {
    words: usize,
}

fn counter(calls: Arc<AtomicU32>) -> Agent {
    Agent::new("word-counter").skill("count_words", "Counts the words in a text", move |call: Call, input: Text| {
        let calls = calls.clone();
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            if input.text == "flaky" && call.attempt == 1 {
                return Err(AgentError::retryable("busy"));
            }
            if input.text.contains("help") {
                call.collaborate("fixer", "fix_code", "Fix it");
            }
            let _ = n;
            Ok(Count { words: input.text.split_whitespace().count() })
        }
    })
}

#[tokio::test]
async fn an_agent_registers_serves_and_deregisters() {
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let running = counter(calls.clone()).start(Options::discovery(discovery.url())).await.unwrap();
    let http = agentmesh_testkit::http_client();

    // Registered with schemas derived from the types.
    let stored: serde_json::Value =
        http.get(format!("{}/api/v1/agents/word-counter", discovery.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(stored["base_url"], running.base_url());
    let skill = &stored["skills"][0];
    assert_eq!(skill["input_schema"]["required"], json!(["text"]));
    assert_eq!(skill["output_schema"]["properties"]["words"]["type"], "integer");

    // A call as the executor makes it; the same idempotency key again gets
    // the first answer without running the handler.
    let call = |body: serde_json::Value, key: &str, attempt: &str| {
        http.post(format!("{}/skills/count_words", running.base_url()))
            .header("idempotency-key", key)
            .header("x-agentmesh-attempt", attempt)
            .json(&body)
            .send()
    };
    let first: serde_json::Value = call(json!({"text": "a b c"}), "exe_1/s1", "1").await.unwrap().json().await.unwrap();
    assert_eq!(first, json!({"output": {"words": 3}}));
    let again: serde_json::Value = call(json!({"text": "a b c"}), "exe_1/s1", "2").await.unwrap().json().await.unwrap();
    assert_eq!(again, first);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a repeated key ran the handler again");

    // Retryable errors, collaboration requests, bad input.
    let flaky: serde_json::Value = call(json!({"text": "flaky"}), "exe_1/s2", "1").await.unwrap().json().await.unwrap();
    assert_eq!(flaky, json!({"error": "busy", "retryable": true}));
    let helped: serde_json::Value =
        call(json!({"text": "help me"}), "exe_1/s3", "1").await.unwrap().json().await.unwrap();
    assert_eq!(helped["collaborate"], json!({"agent": "fixer", "capability": "fix_code", "query": "Fix it"}));
    let bad = call(json!({"txt": 1}), "exe_1/s4", "1").await.unwrap();
    assert_eq!(bad.status(), 400);
    let bad: serde_json::Value = bad.json().await.unwrap();
    assert_eq!(bad["retryable"], false);
    assert!(bad["error"].as_str().unwrap().contains("text"), "{bad}");

    // Stopping deregisters.
    running.stop().await.unwrap();
    let gone = http.get(format!("{}/api/v1/agents/word-counter", discovery.url())).send().await.unwrap();
    assert_eq!(gone.status(), 404);
}

#[tokio::test]
async fn hints_say_what_a_capability_does_to_the_world() {
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let send = Capability::skill("send_email", "Sends an email", |_: Call, input: Text| async move {
        Ok(Count { words: input.text.split_whitespace().count() })
    })
    .destructive()
    .idempotent(false)
    .honours_idempotency_key();
    let look = Capability::skill("count", "Counts words", |_: Call, input: Text| async move {
        Ok(Count { words: input.text.split_whitespace().count() })
    })
    .read_only();
    let running = Agent::new("mailer")
        .capability(send)
        .capability(look)
        .start(Options::discovery(discovery.url()))
        .await
        .unwrap();
    let http = agentmesh_testkit::http_client();
    let stored: serde_json::Value =
        http.get(format!("{}/api/v1/agents/mailer", discovery.url())).send().await.unwrap().json().await.unwrap();
    let hints = |i: usize| stored["skills"][i]["hints"].clone();
    assert_eq!(
        hints(0),
        json!({"destructive": true, "read_only": false, "idempotent": false, "idempotency_key": true}),
        "{stored}"
    );
    assert_eq!(hints(1), json!({"read_only": true}), "{stored}");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn an_unreachable_discovery_is_a_clear_error() {
    let closed = agentmesh_testkit::bind_local().await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = counter(Arc::default()).start(Options::discovery(url.clone())).await.unwrap_err().to_string();
    assert!(err.contains(&format!("cannot reach discovery at {url}")), "{err}");
    assert!(err.contains("AGENTMESH_DISCOVERY_URL"), "{err}");
}

#[tokio::test]
async fn a_forgotten_agent_registers_again_at_the_next_heartbeat() {
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let running = counter(Arc::default())
        .heartbeat_interval(std::time::Duration::from_millis(100))
        .start(Options::discovery(discovery.url()))
        .await
        .unwrap();
    let http = agentmesh_testkit::http_client();
    let agent_url = format!("{}/api/v1/agents/word-counter", discovery.url());
    assert_eq!(http.delete(&agent_url).send().await.unwrap().status(), 204);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while http.get(&agent_url).send().await.unwrap().status() != 200 {
        assert!(tokio::time::Instant::now() < deadline, "the agent did not register again");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_grpc_agent_answers_invoke_by_the_same_contract() {
    use agentmesh_proto::v1 as pb;
    use agentmesh_proto::v1::agent_service_client::AgentServiceClient;

    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let running = counter(calls.clone()).grpc().start(Options::discovery(discovery.url())).await.unwrap();
    let stored: serde_json::Value = agentmesh_testkit::http_client()
        .get(format!("{}/api/v1/agents/word-counter", discovery.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stored["transport"], "grpc");
    let mut client = AgentServiceClient::connect(running.base_url().to_owned()).await.unwrap();
    let invoke = |text: &str, step: &str| {
        let mut request = tonic::Request::new(pb::InvokeRequest {
            capability_id: "count_words".into(),
            kind: pb::CapabilityKind::Skill as i32,
            parameters: agentmesh_proto::json::to_struct(&json!({"text": text})),
            step_id: step.into(),
            execution_id: "exe_1".into(),
            ..Default::default()
        });
        request.metadata_mut().insert("idempotency-key", format!("exe_1/{step}").parse().unwrap());
        request
    };
    let answer = client.invoke(invoke("a b", "s1")).await.unwrap().into_inner();
    assert_eq!(answer.output.as_ref().map(agentmesh_proto::json::from_value), Some(json!({"words": 2})));
    let again = client.invoke(invoke("a b", "s1")).await.unwrap().into_inner();
    assert_eq!(again, answer);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a repeated key ran the handler again");
    let flaky = client.invoke(invoke("flaky", "s2")).await.unwrap().into_inner();
    assert_eq!((flaky.error.as_str(), flaky.retryable), ("busy", true));
    let helped = client.invoke(invoke("help me", "s3")).await.unwrap().into_inner();
    assert_eq!(helped.collaborate.map(|c| c.agent), Some("fixer".to_owned()));
    let mut bad = invoke("x", "s4");
    bad.get_mut().parameters = agentmesh_proto::json::to_struct(&json!({"txt": 1}));
    assert_eq!(client.invoke(bad).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn an_agent_with_a_credential_answers_only_calls_that_carry_it() {
    use agentmesh_proto::v1 as pb;
    use agentmesh_proto::v1::agent_service_client::AgentServiceClient;

    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let secret = "word-counter-secret-31";
    let http_agent = counter(Arc::default()).credential("counter-key", secret);
    let stored = http_agent.registration("http://x");
    assert_eq!(stored["credential"], "counter-key");
    assert!(!stored.to_string().contains(secret), "the registration never carries the secret");
    assert!(!format!("{http_agent:?}").contains(secret), "nor does Debug");
    let running = http_agent.start(Options::discovery(discovery.url())).await.unwrap();
    let http = agentmesh_testkit::http_client();
    let listed: serde_json::Value =
        http.get(format!("{}/api/v1/agents/word-counter", discovery.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["credential"], "counter-key");
    let url = format!("{}/skills/count_words", running.base_url());
    let call = |token: Option<&str>| {
        let mut request = http.post(&url).json(&json!({"text": "a b c"}));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    assert_eq!(call(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(call(Some("guess")).await.unwrap().status().as_u16(), 401);
    let answered = call(Some(secret)).await.unwrap();
    assert_eq!(answered.status().as_u16(), 200);
    assert_eq!(answered.json::<serde_json::Value>().await.unwrap()["output"], json!({"words": 3}));
    running.stop().await.unwrap();

    let running = counter(Arc::default())
        .credential("counter-key", secret)
        .grpc()
        .start(Options::discovery(discovery.url()))
        .await;
    let running = running.unwrap();
    let mut client = AgentServiceClient::connect(running.base_url().to_owned()).await.unwrap();
    let invoke = |token: Option<&str>| {
        let mut request = tonic::Request::new(pb::InvokeRequest {
            capability_id: "count_words".into(),
            kind: pb::CapabilityKind::Skill as i32,
            parameters: agentmesh_proto::json::to_struct(&json!({"text": "a b"})),
            ..Default::default()
        });
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    assert_eq!(client.invoke(invoke(None)).await.unwrap_err().code(), tonic::Code::Unauthenticated);
    assert!(client.invoke(invoke(Some(secret))).await.is_ok());
    running.stop().await.unwrap();
}
