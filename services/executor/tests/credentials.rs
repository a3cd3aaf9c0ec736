//! Per-agent credentials: a registration names a credential, the executor
//! holds the secret (agent_credentials_file) and presents it only to the
//! agents its entry lists. The catalog shows the name, never the secret;
//! a step error never quotes it, even when the agent echoes it back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent};
use common::{Mesh, event_for, options, plan, step};
use pb::ExecutionEventKind as Kind;
use serde_json::json;

const SECRET: &str = "weather-secret-8d41c0";

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Place {
    location: String,
}

#[derive(serde::Serialize, schemars::JsonSchema)]
struct Forecast {
    summary: String,
}

async fn the_executor_presents_a_named_credential_only_to_its_agents(backend: Backend) {
    let dir = std::env::temp_dir().join(format!("agentmesh-agent-credentials-{}-{backend:?}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("weather-api");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    let file = dir.join("credentials.toml");
    std::fs::write(
        &file,
        format!(
            "[[credential]]\nname = \"weather-api\"\nagents = [\"weather-tool-v2\", \"echoer\", \"grpc-weather\"]\nfile = \"{}\"\n",
            secret.display()
        ),
    )
    .unwrap();
    let Some(mesh) = Mesh::start_with(backend, |e| e.agent_credentials_file = Some(file)).await else { return };

    let weather = FakeAgent::start(vec![("get_current_weather", Behavior::Always(Answer::ok(json!({"temp_c": 21}))))])
        .await
        .unwrap();
    let mut registration = weather.registration("weather-tool-v2", &[("get_current_weather", None)]);
    registration["credential"] = json!("weather-api");
    mesh.register(&registration).await;

    // An agent the entry does not list names the same credential: it is never sent there.
    let thief = FakeAgent::start(vec![("get_current_weather", Behavior::Always(Answer::ok(json!({"temp_c": 0}))))])
        .await
        .unwrap();
    let mut stolen = thief.registration("thief", &[("get_current_weather", None)]);
    stolen["credential"] = json!("weather-api");
    mesh.register(&stolen).await;

    // A gRPC agent built with the SDK, expecting the same secret as metadata.
    let grpc_agent = agentmesh_agent::Agent::new("grpc-weather")
        .credential("weather-api", SECRET)
        .skill("forecast", "Tomorrow's weather", |_call, input: Place| async move {
            Ok::<_, agentmesh_agent::AgentError>(Forecast { summary: format!("sunny in {}", input.location) })
        })
        .grpc();
    let running = grpc_agent
        .clone()
        .start(agentmesh_agent::Options { register: false, ..agentmesh_agent::Options::default() })
        .await
        .unwrap();
    mesh.register(&grpc_agent.registration(running.base_url())).await;

    // An agent that refuses and echoes what it was sent.
    let echoer = FakeAgent::start(vec![(
        "echo",
        Behavior::Always(Answer::status(401, json!({"error": format!("bad credential Bearer {SECRET}")}))),
    )])
    .await
    .unwrap();
    let mut echoing = echoer.registration("echoer", &[("echo", None)]);
    echoing["credential"] = json!("weather-api");
    mesh.register(&echoing).await;

    let events = mesh
        .run(
            plan(vec![
                step("s1", "weather-tool-v2", "get_current_weather", json!({"location": "Paris"}), &[]),
                step("s2", "thief", "get_current_weather", json!({"location": "Paris"}), &[]),
                step("s3", "echoer", "echo", json!({}), &[]),
                step("s4", "grpc-weather", "forecast", json!({"location": "Paris"}), &[]),
            ]),
            options(0, 5_000),
        )
        .await
        .unwrap();
    event_for(&events, Kind::StepSucceeded, "s1");
    let calls = weather.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].header("authorization"), Some(format!("Bearer {SECRET}").as_str()));

    let refused = event_for(&events, Kind::StepFailed, "s2");
    assert!(refused.error.contains("may not be sent to agent `thief`"), "{}", refused.error);
    assert!(thief.calls().is_empty(), "the thief was called");

    let s4 = events.iter().find(|e| e.step_id == "s4" && e.kind != Kind::StepStarted as i32);
    assert_eq!(s4.map(|e| e.kind), Some(Kind::StepSucceeded as i32), "{s4:?}");
    running.stop().await.unwrap();

    let echoed = event_for(&events, Kind::StepFailed, "s3");
    assert!(echoed.error.contains("HTTP 401"), "{}", echoed.error);
    assert_eq!(echoer.calls().len(), 1);
    for event in &events {
        assert!(!format!("{event:?}").contains(SECRET), "an event quotes the secret: {event:?}");
    }

    // The catalog shows the credential's name, never the secret.
    let agent = agentmesh_testkit::http_client()
        .get(format!("{}/api/v1/agents/weather-tool-v2", mesh.discovery.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let agent: serde_json::Value = serde_json::from_str(&agent).unwrap();
    assert_eq!(agent["credential"], "weather-api", "{agent}");

    // A registration cannot carry a secret-looking value where the name goes.
    let mut bad = weather.registration("weather-tool-v2", &[("get_current_weather", None)]);
    bad["credential"] = json!("Bearer abc def");
    let response = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents", mesh.discovery.url()))
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let body = response.text().await.unwrap();
    assert!(body.contains("credential") && body.contains("never the secret itself"), "{body}");
}

#[tokio::test]
async fn the_executor_presents_a_named_credential_only_to_its_agents_sqlite() {
    the_executor_presents_a_named_credential_only_to_its_agents(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_executor_presents_a_named_credential_only_to_its_agents_postgres() {
    the_executor_presents_a_named_credential_only_to_its_agents(Backend::Postgres).await;
}
