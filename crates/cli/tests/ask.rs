//! `agentmesh ask` against the whole mesh run as processes (`serve planner`,
//! `serve executor`, `serve synthesis`, `serve gateway`, each with its own
//! `service.name`, the LLM a replay script), discovery and a real agent in
//! the test: the events and the answer are printed, and the request is one
//! trace from the CLI through every service to the agent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{Answer, Behavior, FakeAgent, OtlpReceiver, ServiceProcess, TestDatabase, spawn_discovery};
use serde_json::json;

const EXE: &str = env!("CARGO_BIN_EXE_agentmesh");

async fn wait_ready(url: &str) {
    let client = agentmesh_testkit::http_client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if client.get(format!("{url}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{url} did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_prints_the_events_and_the_answer_of_one_traced_orchestration() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let endpoint = receiver.endpoint();
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let agent = FakeAgent::start(vec![("get_current_weather", Behavior::Always(Answer::ok(json!({"temp_c": 21}))))])
        .await
        .unwrap();
    let registration = json!({"id": "weather-tool-v2", "base_url": agent.url(), "skills": [
        {"id": "get_current_weather", "description": "Current weather for a location",
         "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]});
    let registered = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents", discovery.url()))
        .json(&registration)
        .send()
        .await
        .unwrap();
    assert!(registered.status().is_success());

    let plan = json!({"reasoning": "look it up", "steps": [{"step_id": "s1", "agent": "weather-tool-v2",
        "capability": "get_current_weather", "instruction": "Weather in Chicago", "parameters": {"location": "Chicago"},
        "depends_on": []}]});
    let review = json!({"summary": "Answered.", "missing_data": [], "goal_achieved": true, "confidence": 0.9,
        "recovery_actions": []});
    let script = json!([
        {"match": "Tools that recovery may use:", "text": review.to_string()},
        {"match": "Write the answer to the request.", "text": "It is 21 °C in Chicago."},
        {"match": "Capabilities:", "text": plan.to_string()},
    ]);
    let dir = std::env::temp_dir().join(format!("agentmesh-ask-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script_path = dir.join("replay.json");
    std::fs::write(&script_path, script.to_string()).unwrap();
    let llm = format!("replay:{}", script_path.display());

    let exe = Path::new(EXE);
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let discovery_url = discovery.url();
    let listen = ["--listen", "127.0.0.1:0"];
    let service = |args: Vec<String>| {
        let args: Vec<String> = args;
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            ServiceProcess::spawn(exe, &refs, &otel).await.unwrap()
        }
    };
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    let planner = service(own(&[
        &["serve", "planner"][..],
        &listen,
        &["--discovery", &discovery_url, "--database-url", &db.url, "--llm", &llm],
        &["--health-check-interval-secs", "0.1"],
    ]
    .concat()))
    .await;
    let executor = service(own(&[
        &["serve", "executor"][..],
        &listen,
        &["--discovery", &discovery_url, "--database-url", &db.url, "--planner", &planner.url()],
    ]
    .concat()))
    .await;
    let synthesis = service(own(&[
        &["serve", "synthesis"][..],
        &listen,
        &["--discovery", &discovery_url, "--database-url", &db.url, "--llm", &llm],
        &["--health-check-interval-secs", "0.1"],
    ]
    .concat()))
    .await;
    let gateway = service(own(&[
        &["serve", "gateway"][..],
        &listen,
        &["--planner", &planner.url(), "--executor", &executor.url(), "--synthesis", &synthesis.url()],
        &["--database-url", &db.url],
    ]
    .concat()))
    .await;
    for s in [&planner, &executor, &synthesis, &gateway] {
        wait_ready(&s.url()).await;
    }

    let cli = tokio::process::Command::new(exe)
        .args(["ask", "What is the weather in Chicago?", "--gateway", &gateway.url()])
        .envs(otel)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&cli.stdout).to_string();
    let stderr = String::from_utf8_lossy(&cli.stderr).to_string();
    assert!(cli.status.success(), "agentmesh ask failed: {stderr}");
    assert_eq!(stdout.trim(), "It is 21 °C in Chicago.");
    for line in ["plan: s1 weather-tool-v2/get_current_weather", "step_succeeded s1", "review: goal achieved", "done:"]
    {
        assert!(stderr.contains(line), "no `{line}` in:\n{stderr}");
    }
    let trace_id = stderr
        .lines()
        .find_map(|l| l.strip_prefix("trace "))
        .unwrap_or_else(|| panic!("no trace id printed:\n{stderr}"))
        .trim()
        .to_owned();

    // One trace: the CLI, every service, and the agent's call.
    let services =
        ["agentmesh-cli", "agentmesh-gateway", "agentmesh-planner", "agentmesh-executor", "agentmesh-synthesis"];
    let spans = receiver
        .wait_for(Duration::from_secs(15), |spans| {
            let seen: BTreeSet<&str> =
                spans.iter().filter(|s| s.trace_id == trace_id).map(|s| s.service.as_str()).collect();
            services.iter().all(|s| seen.contains(s))
        })
        .await;
    let seen: BTreeSet<&str> = spans.iter().filter(|s| s.trace_id == trace_id).map(|s| s.service.as_str()).collect();
    for s in services {
        assert!(seen.contains(s), "no span of {s} in trace {trace_id}; seen {seen:?}");
    }
    let call = &agent.calls_to("get_current_weather")[0];
    assert!(call.header("traceparent").is_some_and(|t| t.contains(&trace_id)), "{:?}", call.header("traceparent"));
    let _ = std::fs::remove_dir_all(&dir);
}
