//! MCP servers nobody here wrote, joined to the whole mesh: the reference
//! time server and the calculator (stdio, offered over streamable HTTP by
//! the bridge `agentmesh agents mcp` runs), `server-everything` over
//! streamable HTTP, and a server on the official Python SDK whose tool
//! list changes. Each is registered with transport `mcp`, its tools become
//! the catalog, a scripted LLM plans over them and the executor calls them.
//! The servers are installed by `.ci/run` (see `agentmesh_testkit::interop`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use agentmesh_e2e::{Mesh, Options, execution_events, kind, outcome};
use agentmesh_mcp::bridge::{self, Bridge};
use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Backend, ScriptedReply, interop};
use pb::orchestrate_response::Event;
use serde_json::{Value, json};

fn plan(agent: &str, steps: &[(&str, &str, Value)]) -> ScriptedReply {
    let steps: Vec<Value> = steps
        .iter()
        .map(|(id, capability, parameters)| {
            json!({"step_id": id, "agent": agent, "capability": capability, "instruction": format!("call {capability}"),
                "parameters": parameters, "depends_on": []})
        })
        .collect();
    ScriptedReply::openai_content(&json!({"steps": steps, "reasoning": "the tools answer it"}).to_string())
}

fn review() -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"summary": "Answered from the tools.", "goal_achieved": true, "confidence": 0.9,
            "missing_data": [], "recovery_actions": []})
        .to_string(),
    )
}

async fn start_bridge(command: Vec<String>) -> Bridge {
    Bridge::start(bridge::Options { command, listen: "127.0.0.1:0".parse().unwrap(), allowed_hosts: Vec::new() })
        .await
        .unwrap()
}

fn mcp_registration(id: &str, url: &str) -> Value {
    json!({"id": id, "base_url": url, "transport": "mcp"})
}

fn skill_ids(agent: &Value) -> Vec<String> {
    let skills = agent.pointer("/agent/skills").or_else(|| agent.get("skills")).cloned().unwrap_or_default();
    let mut ids: Vec<String> =
        skills.as_array().into_iter().flatten().filter_map(|s| s["id"].as_str().map(str::to_owned)).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_time_server_tells_the_time_in_tokyo() {
    let Some(command) = interop::time_server("the time server test") else { return };
    let replies = vec![
        plan("time", &[("s1", "get_current_time", json!({"timezone": "Asia/Tokyo"}))]),
        ScriptedReply::openai_stream(&["It is evening ", "in Tokyo."]),
        review(),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let bridge = start_bridge(command).await;
    mesh.register(&mcp_registration("time", &format!("http://{}/mcp", bridge.addr()))).await;

    // The catalog holds the server's tools with their schemas and annotations.
    let listed = mesh.agent("time").await;
    assert_eq!(skill_ids(&listed), ["convert_time", "get_current_time"], "{listed}");
    let text = listed.to_string();
    assert!(text.contains("\"read_only\":true") && text.contains("\"idempotent\":true"), "{text}");
    assert!(text.contains("IANA timezone name"), "the input schema is kept: {text}");

    let messages = mesh.orchestrate("What time is it in Tokyo?").await;
    let output = outcome(&messages, "s1").unwrap();
    assert_eq!(output["timezone"], "Asia/Tokyo", "{output}");
    assert!(output["datetime"].as_str().is_some_and(|d| d.ends_with("+09:00")), "{output}");
    // Synthesis was given the real tool's answer.
    let requests = mesh.llm.requests();
    assert!(requests[1].body["messages"].to_string().contains("Asia/Tokyo"));
    assert!(matches!(messages.last().and_then(|m| m.event.as_ref()), Some(Event::FinalAnswer(_))));
    bridge.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_calculator_multiplies() {
    let Some(command) = interop::calculator_server("the calculator test") else { return };
    let replies = vec![
        plan("calculator", &[("s1", "calculate", json!({"expression": "100 * 3.5"}))]),
        ScriptedReply::openai_stream(&["100 × 3.5 = 350."]),
        review(),
    ];
    let Some(mesh) = Mesh::start(Backend::Postgres, replies, Options::default()).await else { return };
    let bridge = start_bridge(command).await;
    mesh.register(&mcp_registration("calculator", &format!("http://{}/mcp", bridge.addr()))).await;
    assert_eq!(skill_ids(&mesh.agent("calculator").await), ["calculate"]);

    let messages = mesh.orchestrate("What is 100 × 3.5?").await;
    assert_eq!(outcome(&messages, "s1").unwrap(), json!({"result": "350.0"}));
    bridge.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_gives_structured_output_errors_and_progress() {
    let Some(everything) = interop::Everything::start("the server-everything test").await else { return };
    let replies = vec![
        plan(
            "everything",
            &[
                ("weather", "get-structured-content", json!({"location": "Chicago"})),
                ("research", "simulate-research-query", json!({"topic": "tides"})),
                ("slow", "trigger-long-running-operation", json!({"duration": 0.9, "steps": 3})),
            ],
        ),
        ScriptedReply::openai_stream(&["36 °C in Chicago."]),
        review(),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    mesh.register(&mcp_registration("everything", &everything.url)).await;
    let listed = mesh.agent("everything").await;
    let ids = skill_ids(&listed);
    for tool in ["echo", "get-structured-content", "get-sum", "trigger-long-running-operation"] {
        assert!(ids.iter().any(|id| id == tool), "{tool} missing from {ids:?}");
    }

    let messages = mesh.orchestrate("How warm is it in Chicago, and what about the tides?").await;
    // structuredContent is the output (and fits the tool's outputSchema).
    assert_eq!(
        outcome(&messages, "weather").unwrap(),
        json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82})
    );
    // An isError result fails the step with the tool's text.
    let error = outcome(&messages, "research").unwrap_err();
    assert!(error.contains("reported an error:") && error.contains("requires task augmentation"), "{error}");
    let attempts = execution_events(&messages)
        .into_iter()
        .filter(|e| e.step_id == "research" && e.kind == pb::ExecutionEventKind::StepStarted as i32)
        .count();
    assert_eq!(attempts, 1, "an isError result is not retried");
    // Progress notifications arrive as STEP_PROGRESS events through the gateway.
    let progress: Vec<&pb::StepProgress> = execution_events(&messages)
        .into_iter()
        .filter(|e| e.kind == pb::ExecutionEventKind::StepProgress as i32 && e.step_id == "slow")
        .filter_map(|e| e.progress.as_ref())
        .collect();
    assert!(!progress.is_empty(), "no progress: {:?}", messages.iter().map(kind).collect::<Vec<_>>());
    assert!(progress.iter().all(|p| p.total == Some(3.0) && p.progress >= 1.0 && p.progress <= 3.0), "{progress:?}");
    assert!(outcome(&messages, "slow").unwrap()["text"].as_str().is_some_and(|t| t.contains("Steps: 3")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_a_servers_tool_list_and_the_bridge_restarts_a_server_that_dies() {
    let Some(python) = interop::python("the tool-list test") else { return };
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/changing_tools.py");
    let command = vec![python.display().to_string(), script.display().to_string()];
    let replies = vec![
        plan("changing", &[("s1", "rename_lookup", json!({}))]),
        ScriptedReply::openai_stream(&["Done."]),
        review(),
    ];
    // Discovery's own refresh is a minute away: what follows comes from the
    // server's notifications.
    let options = Options { heartbeat_interval_secs: Some(60.0), ..Options::default() };
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, options).await else { return };
    let bridge = start_bridge(command).await;
    mesh.register(&mcp_registration("changing", &format!("http://{}/mcp", bridge.addr()))).await;
    assert_eq!(skill_ids(&mesh.agent("changing").await), ["lookup", "rename_lookup"]);

    // The tool replaces `lookup` and says the list changed: discovery lists
    // the tools again at once.
    let messages = mesh.orchestrate("Rename the lookup tool").await;
    assert!(outcome(&messages, "s1").is_ok());
    let until = |expected: [&'static str; 2], within: u64| {
        let mesh = &mesh;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(within);
            loop {
                let ids = skill_ids(&mesh.agent("changing").await);
                if ids == expected {
                    return;
                }
                assert!(tokio::time::Instant::now() < deadline, "still {ids:?}, expected {expected:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    until(["lookup_v2", "rename_lookup"], 5).await;

    // kill -9 the server: the bridge starts it again after a pause (its
    // tools as at start, a Python start takes seconds here) and says the
    // list changed; discovery follows.
    let pid = bridge.child_pid().await.unwrap();
    assert!(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    until(["lookup", "rename_lookup"], 20).await;
    assert_eq!(bridge.restarts(), 1);
    assert_ne!(bridge.child_pid().await, Some(pid));
    bridge.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_asks_the_mesh_over_mcp() {
    let Some(python) = interop::python("the MCP client test") else { return };
    let replies = vec![
        ScriptedReply::openai_content(
            &json!({"steps": [{"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather",
                "instruction": "Weather in Chicago", "parameters": {"location": "Chicago"}, "depends_on": []}],
                "reasoning": "one lookup"})
            .to_string(),
        ),
        ScriptedReply::openai_stream(&["It is ", "21 °C in Chicago."]),
        review(),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let agent = agentmesh_testkit::FakeAgent::start(vec![(
        "get_current_weather",
        agentmesh_testkit::Behavior::Always(agentmesh_testkit::Answer::ok(json!({"temp_c": 21}))),
    )])
    .await
    .unwrap();
    mesh.register(&agent.registration("weather-tool-v2", &[("get_current_weather", None)])).await;

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/ask_mesh.py");
    let url = format!("http://{}/mcp", mesh.gateway);
    let out = interop::run_python(
        &python,
        &std::fs::read_to_string(script).unwrap(),
        &["http", &url, "What is the weather in Chicago?"],
    )
    .await;
    let out: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(out["tools"], json!([{"name": "ask", "output_schema": true}]), "{out}");
    assert_eq!(out["is_error"], false, "{out}");
    assert_eq!(out["text"], "It is 21 °C in Chicago.");
    let structured = &out["structured"];
    assert_eq!(structured["answer"], "It is 21 °C in Chicago.");
    assert_eq!(structured["goal_achieved"], true);
    assert!(structured["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{structured}");
    assert_eq!(structured["review"]["summary"], "Answered from the tools.");
    // Progress carried the plan, the step and the answer as it streamed.
    let progress: Vec<&str> = out["progress"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(progress.contains(&"plan: s1 weather-tool-v2:get_current_weather"), "{progress:?}");
    assert!(progress.contains(&"step_succeeded s1"), "{progress:?}");
    assert!(progress.contains(&"answer: 21 °C in Chicago."), "{progress:?}");
    assert_eq!(agent.calls_to("get_current_weather").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_are_tools_on_the_meshs_mcp_when_enabled() {
    let Some(python) = interop::python("the capability tools test") else { return };
    let options = Options { mcp_capability_tools: true, ..Options::default() };
    let Some(mesh) = Mesh::start(Backend::Sqlite, Vec::new(), options).await else { return };
    let agent = agentmesh_testkit::FakeAgent::start(vec![
        (
            "get_current_weather",
            agentmesh_testkit::Behavior::Always(agentmesh_testkit::Answer::ok(json!({"temp_c": 21}))),
        ),
        (
            "book_table",
            agentmesh_testkit::Behavior::Always(agentmesh_testkit::Answer::ok(
                json!({"error": "no table free", "retryable": false}),
            )),
        ),
    ])
    .await
    .unwrap();
    let schema = json!({"type": "object", "properties": {"temp_c": {"type": "number"}}});
    mesh.register(&agent.registration("weather", &[("get_current_weather", Some(schema)), ("book_table", None)])).await;

    let script =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/ask_mesh.py")).unwrap();
    let url = format!("http://{}/mcp", mesh.gateway);
    let call = |tool: &'static str| {
        let (python, script, url) = (python.clone(), script.clone(), url.clone());
        async move {
            let out = interop::run_python(&python, &script, &["tool", &url, tool, r#"{"location": "Chicago"}"#]).await;
            serde_json::from_str::<Value>(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
        }
    };
    let out = call("weather.get_current_weather").await;
    let tools: Vec<&str> = out["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(tools, ["ask", "weather.get_current_weather", "weather.book_table"], "{out}");
    // The capability's output schema is the tool's.
    assert_eq!((&out["tools"][1]["output_schema"], &out["tools"][2]["output_schema"]), (&json!(true), &json!(false)));
    assert_eq!(out["is_error"], false, "{out}");
    assert_eq!(out["structured"], json!({"temp_c": 21}));
    let progress: Vec<&str> = out["progress"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(progress.contains(&"step_succeeded s1"), "{progress:?}");
    // Run by the executor: an execution of one step, named in `_meta`.
    let execution_id = out["meta"]["dev.agentmesh/execution_id"].as_str().unwrap().to_owned();
    let mut executor = mesh.executor().await;
    let execution = executor
        .get_execution(pb::GetExecutionRequest { execution_id: execution_id.clone() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(execution.status, pb::ExecutionStatus::Completed as i32, "{execution:?}");
    assert_eq!(agent.calls_to("get_current_weather").len(), 1);
    assert!(agent.calls_to("get_current_weather")[0].body.to_string().contains("Chicago"));

    // A step that fails is a tool error with the step's error.
    let out = call("weather.book_table").await;
    assert_eq!(out["is_error"], true, "{out}");
    assert!(out["text"].as_str().unwrap().contains("no table free"), "{out}");
}
