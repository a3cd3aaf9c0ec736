//! What operators see of the planner: Prometheus counters at `/metrics`, the
//! `llm.hallucination_*` events in the request span, and health that follows
//! discovery and the interaction-log store.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_planner::PlannerConfig;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply, TcpProxy, TestDatabase, bind_local, spawn_discovery};
use serde_json::{Value, json};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Every log line of this test binary, as JSON.
fn captured() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter("info,h2=warn,hyper=warn,tower=warn,sqlx=warn")
            .with_writer(move || SharedWriter(sink.clone()))
            .try_init();
        logs
    })
}

struct SharedWriter(Arc<Mutex<Vec<u8>>>);

impl Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_lines() -> Vec<Value> {
    let logs = captured().lock().unwrap().clone();
    String::from_utf8_lossy(&logs).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

async fn register_weather(url: &str) {
    let agent = json!({"id": "weather-tool-v2", "base_url": "http://w:1", "skills": [
        {"id": "get_current_weather", "description": "Current weather for a location",
         "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]});
    let r = agentmesh_testkit::http_client().post(format!("{url}/api/v1/agents")).json(&agent).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap_or_default());
}

fn plan_with(agent: &str, capability: &str, parameters: Value) -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": agent, "capability": capability,
            "instruction": "do it", "parameters": parameters, "depends_on": []}]})
        .to_string(),
    )
}

/// Starts the planner on an ephemeral port; returns its address once it accepts connections.
async fn spawn_planner(config: PlannerConfig) -> (SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>) {
    // Scripted answers: ranking by meaning (tests/semantic.rs) stays out.
    let config = PlannerConfig { embeddings: "none".into(), ..config };
    let listener = bind_local().await.unwrap();
    let addr = listener.local_addr().unwrap();
    let planner = tokio::spawn(agentmesh_planner::serve_with_listener(config, listener, std::future::pending()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while agentmesh_testkit::http_client().get(format!("http://{addr}/healthz")).send().await.is_err() {
        assert!(!planner.is_finished(), "planner exited at start");
        assert!(tokio::time::Instant::now() < deadline, "planner did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (addr, planner)
}

/// The value of one sample in a Prometheus text exposition.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_hallucination_is_counted_and_reported_as_span_events() {
    captured();
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    register_weather(&discovery.url()).await;
    let llm = ScriptedLlmServer::start(vec![
        plan_with("time-tool-v1", "get_time", json!({"timezone": "UTC"})),
        plan_with("weather-tool-v2", "get_current_weather", json!({"location": "Chicago"})),
    ])
    .await
    .unwrap();
    let (addr, planner) = spawn_planner(PlannerConfig {
        discovery_url: discovery.url(),
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted-model".into(),
            llm_base_url: Some(llm.url()),
            llm_structured: "json_schema".into(),
            ..PlannerConfig::default().llm
        },
        ..PlannerConfig::with_database_url(db.url.clone())
    })
    .await;
    let mut client = PlannerServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let response = client
        .create_plan(pb::CreatePlanRequest {
            request_id: "req_recovered".into(),
            query: "Weather in Chicago?".into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    assert_eq!(response.plan.unwrap_or_default().steps.len(), 1);
    let rejected = client.create_plan(pb::CreatePlanRequest { query: " ".into(), ..Default::default() }).await;
    assert!(rejected.is_err());

    let metrics = agentmesh_testkit::http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let expected = [
        (r#"agentmesh_planner_requests_total{rpc="CreatePlan",status="OK"}"#, 1.0),
        (r#"agentmesh_planner_requests_total{rpc="CreatePlan",status="INVALID_ARGUMENT"}"#, 1.0),
        (r#"agentmesh_planner_request_duration_seconds_count{rpc="CreatePlan"}"#, 2.0),
        (r#"agentmesh_planner_llm_calls_total{kind="plan",status="ok"}"#, 1.0),
        (r#"agentmesh_planner_llm_calls_total{kind="hallucination_retry",status="ok"}"#, 1.0),
        (r#"agentmesh_planner_llm_call_duration_seconds_count{kind="plan"}"#, 1.0),
        ("agentmesh_planner_hallucinations_detected_total", 1.0),
        ("agentmesh_planner_hallucinations_recovered_total", 1.0),
        ("agentmesh_planner_hallucinations_unrecoverable_total", 0.0),
        (r#"agentmesh_planner_retries_total{kind="hallucination"}"#, 1.0),
        (r#"agentmesh_planner_retries_total{kind="parse"}"#, 0.0),
        ("agentmesh_planner_parse_errors_total", 0.0),
        ("agentmesh_planner_preselection_fallbacks_total", 0.0),
        ("agentmesh_planner_preselection_empty_total", 0.0),
    ];
    for (series, value) in expected {
        assert_eq!(sample(&metrics, series), Some(value), "{series} in\n{metrics}");
    }

    // The events carry the request id themselves and sit in the request span.
    let lines = log_lines();
    for name in ["llm.hallucination_detected", "llm.hallucination_recovered"] {
        let event = lines
            .iter()
            .find(|l| l["fields"]["message"] == name && l["fields"]["request_id"] == "req_recovered")
            .unwrap_or_else(|| panic!("no {name} event for req_recovered"));
        assert_eq!(event["span"]["name"], "create_plan", "{event}");
        assert_eq!(event["span"]["request_id"], "req_recovered", "{event}");
        assert_eq!(event["span"]["operation"], "create_plan", "{event}");
    }
    let detected = lines.iter().find(|l| l["fields"]["message"] == "llm.hallucination_detected").unwrap();
    assert_eq!(detected["fields"]["invented"], "agent `time-tool-v1`");
    assert_eq!(detected["level"], "WARN");
    planner.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_inventing_counts_as_unrecoverable() {
    captured();
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    register_weather(&discovery.url()).await;
    let llm = ScriptedLlmServer::start(vec![
        plan_with("time-tool-v1", "get_time", json!({})),
        plan_with("time-tool-v1", "get_time", json!({})),
    ])
    .await
    .unwrap();
    let (addr, planner) = spawn_planner(PlannerConfig {
        discovery_url: discovery.url(),
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted-model".into(),
            llm_base_url: Some(llm.url()),
            llm_structured: "json_schema".into(),
            ..PlannerConfig::default().llm
        },
        ..PlannerConfig::with_database_url(db.url.clone())
    })
    .await;
    let mut client = PlannerServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let failed = client
        .create_plan(pb::CreatePlanRequest {
            request_id: "req_unrecoverable".into(),
            query: "What time is it?".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(failed.err().map(|s| s.code()), Some(tonic::Code::FailedPrecondition));
    let metrics = agentmesh_testkit::http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (series, value) in [
        (r#"agentmesh_planner_requests_total{rpc="CreatePlan",status="FAILED_PRECONDITION"}"#, 1.0),
        ("agentmesh_planner_hallucinations_detected_total", 2.0),
        ("agentmesh_planner_hallucinations_recovered_total", 0.0),
        ("agentmesh_planner_hallucinations_unrecoverable_total", 1.0),
        (r#"agentmesh_planner_llm_calls_total{kind="hallucination_retry",status="ok"}"#, 1.0),
    ] {
        assert_eq!(sample(&metrics, series), Some(value), "{series} in\n{metrics}");
    }
    let lines = log_lines();
    let event = lines
        .iter()
        .find(|l| {
            l["fields"]["message"] == "llm.hallucination_unrecoverable"
                && l["fields"]["request_id"] == "req_unrecoverable"
        })
        .unwrap_or_else(|| panic!("no llm.hallucination_unrecoverable event"));
    assert_eq!(event["level"], "ERROR");
    assert_eq!(event["span"]["request_id"], "req_unrecoverable");
    planner.abort();
}

async fn grpc_status(addr: SocketAddr, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).ok()?.connect().await.ok()?;
    let mut client = HealthClient::new(channel);
    let answer = client.check(HealthCheckRequest { service: service.into() }).await.ok()?;
    ServingStatus::try_from(answer.into_inner().status).ok()
}

async fn readyz(addr: SocketAddr) -> (u16, Value) {
    let r = agentmesh_testkit::http_client().get(format!("http://{addr}/readyz")).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// Waits until the planner's gRPC health reports `want`; panics after 15 s.
async fn wait_for(addr: SocketAddr, want: ServingStatus) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let status = grpc_status(addr, "agentmesh.v1.PlannerService").await;
        if status == Some(want) {
            assert_eq!(grpc_status(addr, "").await, Some(want), "overall status follows the service");
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "health stayed {status:?}, wanted {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_discovery() {
    captured();
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let proxy = TcpProxy::start(discovery.addr).await.unwrap();
    let (addr, planner) = spawn_planner(PlannerConfig {
        discovery_url: format!("http://{}", proxy.addr),
        service: agentmesh_planner::ServiceSettings {
            database_url: db.url.clone(),
            health_check_interval_secs: 0.1,
            ..PlannerConfig::default().service
        },
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted-model".into(),
            llm_base_url: Some("http://127.0.0.1:9".into()),
            ..PlannerConfig::default().llm
        },
        ..Default::default()
    })
    .await;
    wait_for(addr, ServingStatus::Serving).await;
    let (code, body) = readyz(addr).await;
    assert_eq!((code, body["status"].as_str()), (200, Some("ready")), "{body}");
    assert_eq!(body["checks"]["discovery"]["ok"], true, "{body}");
    // Nothing listens at the LLM's address: reported, not required.
    assert_eq!((&body["checks"]["llm"]["ok"], &body["checks"]["llm"]["required"]), (&json!(false), &json!(false)));
    let detail = body["checks"]["llm"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("127.0.0.1:9 unreachable"), "{detail}");
    assert_eq!(grpc_status(addr, "llm").await, Some(ServingStatus::NotServing));

    proxy.cut();
    wait_for(addr, ServingStatus::NotServing).await;
    let (code, body) = readyz(addr).await;
    assert_eq!((code, body["status"].as_str()), (503, Some("not_ready")), "{body}");
    assert_eq!((&body["checks"]["discovery"]["ok"], &body["checks"]["store"]["ok"]), (&json!(false), &json!(true)));
    let live = agentmesh_testkit::http_client().get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(live.status().as_u16(), 200, "liveness does not depend on discovery");

    proxy.restore();
    wait_for(addr, ServingStatus::Serving).await;
    assert_eq!(readyz(addr).await.0, 200);
    planner.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_interaction_store() {
    captured();
    let Some(db) = TestDatabase::postgres().await else { return };
    let discovery_db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(discovery_db.url.clone())).await.unwrap();
    let url = url::Url::parse(&db.url).unwrap();
    let target = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let proxy = TcpProxy::start(tokio::net::lookup_host(target).await.unwrap().next().unwrap()).await.unwrap();
    let mut proxied = url.clone();
    proxied.set_host(Some("127.0.0.1")).unwrap();
    proxied.set_port(Some(proxy.addr.port())).unwrap();
    let (addr, planner) = spawn_planner(PlannerConfig {
        discovery_url: discovery.url(),
        service: agentmesh_planner::ServiceSettings {
            database_url: proxied.to_string(),
            health_check_interval_secs: 0.1,
            ..PlannerConfig::default().service
        },
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted-model".into(),
            llm_base_url: Some("http://127.0.0.1:9".into()),
            ..PlannerConfig::default().llm
        },
        ..Default::default()
    })
    .await;
    wait_for(addr, ServingStatus::Serving).await;

    proxy.cut();
    wait_for(addr, ServingStatus::NotServing).await;
    let (code, body) = readyz(addr).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!((&body["checks"]["discovery"]["ok"], &body["checks"]["store"]["ok"]), (&json!(true), &json!(false)));

    proxy.restore();
    wait_for(addr, ServingStatus::Serving).await;
    planner.abort();
}

/// A planner whose `--discovery` is another agentmesh port (here another
/// planner) is not ready, and `/readyz` says what is wrong; a model server
/// that answers is reported as reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_is_not_discovery_is_named_as_such() {
    captured();
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let llm = ScriptedLlmServer::start(Vec::new()).await.unwrap();
    let config = |discovery_url: String| PlannerConfig {
        discovery_url,
        service: agentmesh_planner::ServiceSettings {
            database_url: db.url.clone(),
            health_check_interval_secs: 0.1,
            ..PlannerConfig::default().service
        },
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted-model".into(),
            llm_base_url: Some(llm.url()),
            ..PlannerConfig::default().llm
        },
        ..Default::default()
    };
    let (first, first_task) = spawn_planner(config(discovery.url())).await;
    wait_for(first, ServingStatus::Serving).await;
    let (code, body) = readyz(first).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["checks"]["llm"]["ok"], true, "the scripted server answers: {body}");
    assert_eq!(grpc_status(first, "llm").await, Some(ServingStatus::Serving));

    let (second, second_task) = spawn_planner(config(format!("http://{first}"))).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let body = loop {
        let (code, body) = readyz(second).await;
        if body["checks"]["discovery"]["detail"] != "not checked yet" {
            assert_eq!(code, 503, "{body}");
            break body;
        }
        assert!(tokio::time::Instant::now() < deadline, "never checked: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let detail = body["checks"]["discovery"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("does not serve agentmesh.v1.DiscoveryService"), "{detail}");
    assert_eq!(grpc_status(second, "agentmesh.v1.PlannerService").await, Some(ServingStatus::NotServing));
    // A request says what went wrong too, not an empty message.
    let mut client = PlannerServiceClient::connect(format!("http://{second}")).await.unwrap();
    let status = client
        .create_plan(pb::CreatePlanRequest { query: "Weather in Chicago?".into(), ..Default::default() })
        .await
        .err()
        .unwrap_or_else(|| panic!("planned without discovery"));
    assert!(
        status.message().contains("does not serve /agentmesh.v1.DiscoveryService/ListCapabilities"),
        "{}",
        status.message()
    );
    first_task.abort();
    second_task.abort();
}

/// With no model server, a failed plan is still followed up: the failed
/// call is in the interaction log with its error, and with one provider
/// the log does not speak of a next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_llm_call_is_recorded_with_its_error() {
    captured();
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    register_weather(&discovery.url()).await;
    let (addr, planner) = spawn_planner(PlannerConfig {
        discovery_url: discovery.url(),
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted-model".into(),
            llm_base_url: Some("http://127.0.0.1:9".into()),
            llm_retries: 0,
            ..PlannerConfig::default().llm
        },
        ..PlannerConfig::with_database_url(db.url.clone())
    })
    .await;
    let mut client = PlannerServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let status = client
        .create_plan(pb::CreatePlanRequest {
            request_id: "req_no_model".into(),
            query: "Weather in Chicago?".into(),
            ..Default::default()
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("planned without a model"));
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let recorded = client
        .list_interactions(pb::ListInteractionsRequest { request_id: "req_no_model".into() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner()
        .interactions;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(recorded[0].error.contains("127.0.0.1:9"), "the error is kept: {:?}", recorded[0].error);
    assert!(recorded[0].prompt.contains("Weather in Chicago?"), "and the prompt that was sent");
    assert_eq!(recorded[0].provider, "openai");
    let mentions_next = log_lines().iter().any(|line| {
        line["fields"]["message"].as_str().is_some_and(|m| m.contains("trying the next"))
            && line.to_string().contains("scripted-model")
    });
    assert!(!mentions_next, "a single provider has no next one");
    planner.abort();
}
