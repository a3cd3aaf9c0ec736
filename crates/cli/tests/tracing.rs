//! One request, one trace: discovery, the planner and the CLI run as their
//! own processes (each with its own `service.name`), export to a real OTLP
//! receiver (discovery over HTTP/protobuf, the others over gRPC), and the
//! test reads back what arrived.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use agentmesh_testkit::{
    OtlpReceiver, ReceivedSpan, ScriptedLlmServer, ScriptedReply, ServiceProcess, TestDatabase, span_kind,
};
use serde_json::{Value, json};

const EXE: &str = env!("CARGO_BIN_EXE_agentmesh");

fn plan_with(agent: &str, capability: &str, parameters: Value) -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": agent, "capability": capability,
            "instruction": "do it", "parameters": parameters, "depends_on": []}]})
        .to_string(),
    )
}

fn one<'a>(spans: &'a [ReceivedSpan], what: &str, test: impl Fn(&ReceivedSpan) -> bool) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| test(s)).collect();
    assert!(!found.is_empty(), "no span {what} among:\n{}", summary(spans));
    found[0]
}

fn summary(spans: &[ReceivedSpan]) -> String {
    spans
        .iter()
        .map(|s| {
            format!(
                "{} {} {} trace={} id={} parent={}",
                s.service, s.kind, s.name, s.trace_id, s.span_id, s.parent_span_id
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

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
async fn one_request_is_one_trace_from_the_cli_through_the_planner_to_discovery() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let endpoint = receiver.endpoint();
    let registry = TestDatabase::sqlite();
    let log = TestDatabase::sqlite();
    let llm = ScriptedLlmServer::start(vec![
        plan_with("time-tool-v1", "get_time", json!({"timezone": "UTC"})),
        plan_with("weather-tool-v2", "get_current_weather", json!({"location": "Chicago"})),
    ])
    .await
    .unwrap();
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let exe = Path::new(EXE);
    let mut discovery = ServiceProcess::spawn(
        exe,
        &["serve", "discovery", "--listen", "127.0.0.1:0", "--database-url", &registry.url],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"), env[0]],
    )
    .await
    .unwrap();

    // A REST call carrying a W3C traceparent continues the caller's trace.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let agent = json!({"id": "weather-tool-v2", "base_url": "http://127.0.0.1:9", "skills": [
        {"id": "get_current_weather", "description": "Current weather for a location",
         "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]});
    let registered = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents", discovery.url()))
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .json(&agent)
        .send()
        .await
        .unwrap();
    assert!(registered.status().is_success());

    let discovery_url = discovery.url();
    let mut planner = ServiceProcess::spawn(
        exe,
        &[
            "serve",
            "planner",
            "--listen",
            "127.0.0.1:0",
            "--discovery",
            &discovery_url,
            "--database-url",
            &log.url,
            "--llm",
            "openai:scripted-model",
            "--llm-base-url",
            &llm.url(),
            "--llm-structured",
            "json_schema",
            "--health-check-interval-secs",
            "0.1",
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "grpc",
        ],
        &env,
    )
    .await
    .unwrap();
    wait_ready(&planner.url()).await;

    let cli = tokio::process::Command::new(exe)
        .args(["plan", "What is the weather in Chicago?", "--planner", &planner.url(), "--otlp-endpoint", &endpoint])
        .args(["--otlp-protocol", "grpc"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&cli.stderr).to_string();
    assert!(cli.status.success(), "agentmesh plan failed: {stderr}");
    let request_id = stderr
        .split_whitespace()
        .skip_while(|w| *w != "request")
        .nth(1)
        .map(|w| w.trim_end_matches(':').to_owned())
        .unwrap_or_else(|| panic!("no request id in {stderr}"));
    // Some more health checks happen while the services run on.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(planner.terminate().await.unwrap().success());
    assert!(discovery.terminate().await.unwrap().success());

    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            spans.iter().any(|s| s.service == "agentmesh-discovery" && s.name.ends_with("ListCapabilities"))
                && spans.iter().any(|s| s.service == "agentmesh-cli")
        })
        .await;

    // The CLI's call is the root; every hop below it is in its trace.
    let cli_call = one(&spans, "CLI CreatePlan client", |s| {
        s.service == "agentmesh-cli"
            && s.kind == span_kind::CLIENT
            && s.name == "agentmesh.v1.PlannerService/CreatePlan"
    });
    let trace = cli_call.trace_id.clone();
    let planner_server = one(&spans, "planner CreatePlan server", |s| {
        s.service == "agentmesh-planner" && s.kind == span_kind::SERVER && s.name.ends_with("/CreatePlan")
    });
    assert_eq!(planner_server.trace_id, trace);
    assert_eq!(planner_server.parent_span_id, cli_call.span_id, "the server span is the child of the client span");
    assert_eq!(planner_server.attribute("rpc.system").as_deref(), Some("grpc"));
    assert_eq!(planner_server.attribute("rpc.service").as_deref(), Some("agentmesh.v1.PlannerService"));
    assert_eq!(planner_server.attribute("rpc.method").as_deref(), Some("CreatePlan"));
    assert_eq!(planner_server.attribute("rpc.grpc.status_code").as_deref(), Some("0"));
    assert_eq!(planner_server.attribute("request_id"), Some(request_id.clone()), "request_id crosses as baggage");

    let planner_call = one(&spans, "planner ListCapabilities client", |s| {
        s.service == "agentmesh-planner" && s.kind == span_kind::CLIENT && s.name.ends_with("/ListCapabilities")
    });
    assert_eq!(planner_call.trace_id, trace);
    let discovery_server = one(&spans, "discovery ListCapabilities server", |s| {
        s.service == "agentmesh-discovery" && s.kind == span_kind::SERVER && s.name.ends_with("/ListCapabilities")
    });
    assert_eq!(discovery_server.trace_id, trace);
    assert_eq!(discovery_server.parent_span_id, planner_call.span_id);
    assert_eq!(discovery_server.attribute("request_id"), Some(request_id.clone()));
    let query = one(&spans, "discovery.query", |s| s.service == "agentmesh-discovery" && s.name == "discovery.query");
    assert_eq!(query.trace_id, trace);
    assert_eq!(query.parent_span_id, discovery_server.span_id);
    assert_eq!(query.attribute("agents").as_deref(), Some("1"));

    // The hallucination and its recovery are events on the planner's span,
    // with the request id first and the attributes operators search by.
    let planning = one(&spans, "planner span with hallucination events", |s| {
        s.service == "agentmesh-planner" && s.events.iter().any(|e| e.name == "llm.hallucination_detected")
    });
    assert_eq!(planning.trace_id, trace);
    let detected = planning.events.iter().find(|e| e.name == "llm.hallucination_detected").unwrap();
    assert_eq!(detected.attributes[0], ("request_id".to_owned(), json!(request_id)), "{detected:?}");
    let attribute = |name: &str| detected.attributes.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(attribute("hallucinated_agent"), Some(json!("time-tool-v1")));
    assert_eq!(attribute("allowed_agent_count"), Some(json!(1)));
    assert_eq!(detected.attributes.iter().filter(|(k, _)| k == "request_id").count(), 1, "one event, not two");
    assert_eq!(attribute("hall_retry"), Some(json!(1)));
    assert_eq!(attribute("max_hall_retries"), Some(json!(1)));
    assert_eq!(attribute("attempt"), Some(json!(1)));
    let recovered = planning.events.iter().find(|e| e.name == "llm.hallucination_recovered").expect("recovered event");
    assert_eq!(recovered.attributes[0], ("request_id".to_owned(), json!(request_id)));

    // Each LLM call is a GenAI client span; the store write is a child span.
    let chats: Vec<&ReceivedSpan> =
        spans.iter().filter(|s| s.service == "agentmesh-planner" && s.name == "chat scripted-model").collect();
    assert_eq!(chats.len(), 2, "{}", summary(&spans));
    for chat in &chats {
        assert_eq!(chat.trace_id, trace);
        assert_eq!(chat.kind, span_kind::CLIENT);
        assert_eq!(chat.attribute("gen_ai.system").as_deref(), Some("openai"));
        assert_eq!(chat.attribute("gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(chat.attribute("gen_ai.request.model").as_deref(), Some("scripted-model"));
        assert!(chat.attribute("gen_ai.usage.input_tokens").is_some(), "{chat:?}");
        assert!(chat.attribute("gen_ai.prompt").is_none(), "prompts are recorded only when asked for");
    }
    let stored = one(&spans, "interaction log write", |s| s.name == "record_interactions sqlite");
    assert_eq!(stored.trace_id, trace);
    assert_eq!(stored.attribute("db.rows").as_deref(), Some("2"));

    // The REST registration continued the caller's trace.
    let rest =
        one(&spans, "REST registration", |s| s.service == "agentmesh-discovery" && s.name == "POST /api/v1/agents");
    assert_eq!((rest.trace_id.as_str(), rest.parent_span_id.as_str()), (caller_trace, caller_span));
    assert_eq!(rest.kind, span_kind::SERVER);
    assert_eq!(rest.attribute("http.response.status_code").as_deref(), Some("201"));
    let write = one(&spans, "registration store write", |s| s.name == "register sqlite");
    assert_eq!(write.parent_span_id, rest.span_id);

    // Health checks and probes ran all along and left nothing behind.
    let monitoring: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| {
            s.attribute("rpc.service").as_deref() == Some("grpc.health.v1.Health")
                || s.name.contains("Health/Check")
                || s.name.contains("/readyz")
        })
        .collect();
    assert!(monitoring.is_empty(), "health checks were exported: {monitoring:?}");
    let (grpc_exports, http_exports) = receiver.exports();
    assert!(grpc_exports > 0 && http_exports > 0, "both protocols used: {grpc_exports} gRPC, {http_exports} HTTP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_exported_and_bad_settings_are_refused() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let registry = TestDatabase::sqlite();
    let exe = Path::new(EXE);
    // No endpoint anywhere: the service runs, and exports nothing.
    let mut discovery = ServiceProcess::spawn(
        exe,
        &["serve", "discovery", "--listen", "127.0.0.1:0", "--database-url", &registry.url],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await
    .unwrap();
    let answer =
        agentmesh_testkit::http_client().get(format!("{}/api/v1/discovery/capabilities", discovery.url())).send().await;
    assert!(answer.unwrap().status().is_success());
    assert!(discovery.terminate().await.unwrap().success());
    assert!(receiver.spans().is_empty());

    let refused = tokio::process::Command::new(exe)
        .args(["agents", "list", "--otlp-endpoint", &receiver.endpoint(), "--trace-sampler", "sometimes"])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("unknown sampler `sometimes`"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_run_is_one_trace_from_the_cli_through_the_executor_to_the_agent() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let endpoint = receiver.endpoint();
    let db = TestDatabase::sqlite();
    let exe = Path::new(EXE);
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "100"), ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let discovery =
        ServiceProcess::spawn(exe, &["serve", "discovery", "--listen", "127.0.0.1:0", "--database-url", &db.url], &env)
            .await
            .unwrap();
    let agent = agentmesh_testkit::FakeAgent::start(vec![(
        "get_current_weather",
        agentmesh_testkit::Behavior::Echo(std::time::Duration::ZERO),
    )])
    .await
    .unwrap();
    let registered = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents", discovery.url()))
        .json(&agent.registration("weather-tool-v2", &[("get_current_weather", None)]))
        .send()
        .await
        .unwrap();
    assert!(registered.status().is_success());
    let mut executor = ServiceProcess::spawn(
        exe,
        &["serve", "executor", "--listen", "127.0.0.1:0", "--discovery", &discovery.url(), "--database-url", &db.url],
        &env,
    )
    .await
    .unwrap();
    let plan_file = std::env::temp_dir().join(format!("agentmesh-trace-plan-{}.json", std::process::id()));
    std::fs::write(
        &plan_file,
        json!({"reasoning": "one call", "steps": [{"step_id": "s1", "agent": "weather-tool-v2",
            "capability": "get_current_weather", "instruction": "Weather in Chicago",
            "parameters": {"location": "Chicago"}, "depends_on": []}]})
        .to_string(),
    )
    .unwrap();
    let run = tokio::process::Command::new(exe)
        .args(["run", plan_file.to_str().unwrap(), "--executor", &executor.url(), "--otlp-endpoint", &endpoint])
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_file(&plan_file);
    assert!(run.status.success(), "agentmesh run failed: {}", String::from_utf8_lossy(&run.stderr));
    let printed: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(printed["status"], "completed");
    assert_eq!(printed["outputs"]["s1"], json!({"echo": {"location": "Chicago"}}));
    assert!(executor.terminate().await.unwrap().success());

    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| spans.iter().any(|s| s.name.starts_with("execution ")))
        .await;
    let cli_call = one(&spans, "CLI Execute client", |s| {
        s.service == "agentmesh-cli" && s.kind == span_kind::CLIENT && s.name == "agentmesh.v1.ExecutorService/Execute"
    });
    let trace = cli_call.trace_id.clone();
    let server = one(&spans, "executor Execute server", |s| {
        s.service == "agentmesh-executor" && s.kind == span_kind::SERVER && s.name.ends_with("/Execute")
    });
    assert_eq!((server.trace_id.as_str(), server.parent_span_id.as_str()), (trace.as_str(), cli_call.span_id.as_str()));
    let execution =
        one(&spans, "execution span", |s| s.service == "agentmesh-executor" && s.name.starts_with("execution "));
    assert_eq!(execution.trace_id, trace);
    assert_eq!(execution.attribute("request_id").as_deref(), printed["request_id"].as_str());
    let step = one(&spans, "step span", |s| s.service == "agentmesh-executor" && s.name.starts_with("step s1"));
    assert_eq!((step.trace_id.as_str(), step.parent_span_id.as_str()), (trace.as_str(), execution.span_id.as_str()));
    for field in ["request_id", "execution_id", "step_id", "agent_id"] {
        assert!(step.attribute(field).is_some_and(|v| !v.is_empty()), "step span has {field}: {step:?}");
    }
    let created = one(&spans, "execution stored", |s| s.name == "create_execution sqlite");
    assert_eq!((created.trace_id.as_str(), created.parent_span_id.as_str()), (trace.as_str(), server.span_id.as_str()));
    assert!(
        !spans.iter().any(|s| s.name.starts_with("append_events")),
        "batched event writes serve many requests and make no span of their own"
    );
    // The agent's call carries the step's context: same trace, the step span as parent.
    let call = &agent.calls()[0];
    let traceparent: Vec<&str> = call.header("traceparent").unwrap_or_default().split('-').collect();
    assert_eq!((traceparent[1], traceparent[2]), (trace.as_str(), step.span_id.as_str()));
    assert_eq!(
        call.header("baggage"),
        Some(format!("request_id={}", printed["request_id"].as_str().unwrap()).as_str())
    );
    drop(discovery);
}
