//! The executor as a process: `kill -9` in the middle of a plan and a
//! restart resume the execution (nothing that succeeded runs again, the
//! step in flight is dispatched again with the same idempotency key, a
//! watcher that reconnects misses nothing and sees nothing twice, and the
//! trace goes on); on PostgreSQL a second replica takes over the
//! executions of one that died, and any replica can be watched.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_testkit::{Backend, Behavior, FakeAgent, OtlpReceiver, ServiceProcess, TestDatabase, spawn_discovery};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

const EXE: &str = env!("CARGO_BIN_EXE_agentmesh");
const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

async fn executor(discovery: &str, database: &str, otlp: &str) -> ServiceProcess {
    executor_with_lease(discovery, database, otlp, "1").await
}

async fn executor_with_lease(discovery: &str, database: &str, otlp: &str, lease_secs: &str) -> ServiceProcess {
    ServiceProcess::spawn(
        Path::new(EXE),
        &["serve", "executor", "--listen", "127.0.0.1:0", "--discovery", discovery, "--database-url", database],
        &[
            ("AGENTMESH_EXECUTOR__LEASE_SECS", lease_secs),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await
    .unwrap()
}

async fn client(process: &ServiceProcess) -> ExecutorServiceClient<Channel> {
    ExecutorServiceClient::connect(process.url()).await.unwrap()
}

fn chain_plan() -> pb::ExecuteRequest {
    let step = |id: &str, capability: &str, deps: &[&str]| {
        json!({"step_id": id, "agent": "worker", "capability": capability, "instruction": id,
               "parameters": {"step": id}, "depends_on": deps})
    };
    let plan: agentmesh_core::plan::Plan = serde_json::from_value(json!({"reasoning": "", "steps": [
        step("s1", "fast", &[]), step("s2", "slow", &["s1"]), step("s3", "fast", &["s2"])]}))
    .unwrap();
    pb::ExecuteRequest {
        request_id: "req_durable".into(),
        plan: Some(agentmesh_proto::convert::plan_to_pb(&plan)),
        execution_id: "exe-durable".into(),
        options: Some(pb::ExecutionOptions { max_retries: Some(0), step_timeout_ms: 30_000, ..Default::default() }),
        ..Default::default()
    }
}

/// Reads events until one matches, returning everything read.
async fn read_until(
    stream: &mut (impl tokio_stream::Stream<Item = Result<pb::ExecutionEvent, tonic::Status>> + Unpin),
    done: impl Fn(&pb::ExecutionEvent) -> bool,
) -> Vec<pb::ExecutionEvent> {
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Ok(Some(item)) = tokio::time::timeout_at(deadline, stream.next()).await {
        let event = item.unwrap();
        let stop = done(&event);
        events.push(event);
        if stop {
            break;
        }
    }
    events
}

fn is_final(e: &pb::ExecutionEvent) -> bool {
    [
        pb::ExecutionEventKind::ExecutionCompleted,
        pb::ExecutionEventKind::ExecutionFailed,
        pb::ExecutionEventKind::ExecutionCancelled,
    ]
    .iter()
    .any(|k| *k as i32 == e.kind)
}

fn started(step: &str) -> impl Fn(&pb::ExecutionEvent) -> bool + '_ {
    move |e| e.kind == pb::ExecutionEventKind::StepStarted as i32 && e.step_id == step
}

async fn watch(client: &mut ExecutorServiceClient<Channel>, after: u64) -> Vec<pb::ExecutionEvent> {
    let stream = client
        .watch_execution(pb::WatchExecutionRequest { execution_id: "exe-durable".into(), from_sequence: after })
        .await
        .unwrap()
        .into_inner()
        .map(|r| r.map(|r| r.event.unwrap()));
    read_until(&mut Box::pin(stream), is_final).await
}

fn assert_gapless(events: &[pb::ExecutionEvent]) {
    let sequences: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(sequences, expected, "every event exactly once");
    assert_eq!(events.last().map(|e| e.kind), Some(pb::ExecutionEventKind::ExecutionCompleted as i32));
}

/// What the agent saw: one call of s1 and s3, two of s2 with one key, all in the caller's trace.
fn assert_agent_calls(agent: &FakeAgent) {
    let calls = agent.calls();
    let of = |step: &str| calls.iter().filter(|c| c.body["step"] == step).collect::<Vec<_>>();
    assert_eq!(of("s1").len(), 1, "a step that succeeded is not called again");
    assert_eq!(of("s3").len(), 1);
    let s2 = of("s2");
    assert_eq!(s2.len(), 2, "the step in flight is dispatched again");
    assert_eq!(s2[0].header("idempotency-key"), Some("exe-durable/s2"));
    assert_eq!(s2[1].header("idempotency-key"), Some("exe-durable/s2"));
    assert_eq!(s2[1].header("x-agentmesh-attempt"), Some("2"));
    for call in &calls {
        let traceparent = call.header("traceparent").unwrap_or_default();
        assert_eq!(
            traceparent.split('-').nth(1),
            Some(TRACE_ID),
            "{traceparent}: the agent call is in the caller's trace"
        );
    }
}

async fn setup(backend: Backend) -> Option<(TestDatabase, agentmesh_testkit::RunningService, FakeAgent, OtlpReceiver)> {
    let db = TestDatabase::new(backend).await?;
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let agent = FakeAgent::start(vec![
        ("fast", Behavior::Echo(Duration::ZERO)),
        ("slow", Behavior::Echo(Duration::from_millis(1500))),
    ])
    .await
    .unwrap();
    let registered = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents", discovery.url()))
        .json(&agent.registration("worker", &[("fast", None), ("slow", None)]))
        .send()
        .await
        .unwrap();
    assert!(registered.status().is_success());
    Some((db, discovery, agent, OtlpReceiver::start().await.unwrap()))
}

fn traced(request: pb::ExecuteRequest) -> tonic::Request<pb::ExecuteRequest> {
    let mut request = tonic::Request::new(request);
    request.metadata_mut().insert("traceparent", format!("00-{TRACE_ID}-b7ad6b7169203331-01").parse().unwrap());
    request
}

async fn a_killed_executor_resumes_its_executions_after_a_restart(backend: Backend) {
    let Some((db, discovery, agent, otlp)) = setup(backend).await else { return };
    let mut first = executor(&discovery.url(), &db.url, &otlp.endpoint()).await;
    let mut client = client(&first).await;
    let stream = client.execute(traced(chain_plan())).await.unwrap().into_inner().map(|r| r.map(|r| r.event.unwrap()));
    let mut seen = read_until(&mut Box::pin(stream), started("s2")).await;
    assert_eq!(seen.last().map(|e| e.step_id.as_str()), Some("s2"));
    // The call to s2 is in flight at the agent when the executor dies.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while agent.calls().iter().all(|c| c.body["step"] != "s2") {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().await.unwrap();

    let second = executor(&discovery.url(), &db.url, &otlp.endpoint()).await;
    let mut client = self::client(&second).await;
    let last_seen = seen.last().unwrap().sequence;
    seen.extend(watch(&mut client, last_seen).await);
    assert_gapless(&seen);
    let resumed = seen
        .iter()
        .find(|e| e.step_id == "s2" && e.kind == pb::ExecutionEventKind::StepStarted as i32 && e.attempt == 2);
    assert!(resumed.is_some(), "s2 dispatched again as attempt 2");
    assert_agent_calls(&agent);
    let execution = client
        .get_execution(pb::GetExecutionRequest { execution_id: "exe-durable".into() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(execution.trace_id, TRACE_ID);
    assert_eq!(execution.status, pb::ExecutionStatus::Completed as i32);
}

async fn a_second_replica_takes_over_and_any_replica_can_be_watched(backend: Backend) {
    assert_eq!(backend, Backend::Postgres, "replicas share PostgreSQL");
    let Some((db, discovery, agent, otlp)) = setup(backend).await else { return };
    let mut a = executor(&discovery.url(), &db.url, &otlp.endpoint()).await;
    let b = executor(&discovery.url(), &db.url, &otlp.endpoint()).await;
    let mut on_a = client(&a).await;
    let mut on_b = client(&b).await;
    let stream = on_a.execute(traced(chain_plan())).await.unwrap().into_inner().map(|r| r.map(|r| r.event.unwrap()));
    let mut from_a = Box::pin(stream);
    let first = read_until(&mut from_a, |_| true).await;
    assert_eq!(first[0].execution_id, "exe-durable");
    // B follows what A runs, live, through the database's notifications.
    let watcher = tokio::spawn({
        let mut on_b = on_b.clone();
        async move { watch(&mut on_b, 0).await }
    });
    read_until(&mut from_a, started("s2")).await;
    let running = on_b
        .get_execution(pb::GetExecutionRequest { execution_id: "exe-durable".into() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(running.status, pb::ExecutionStatus::Running as i32, "any replica answers GetExecution");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while agent.calls().iter().all(|c| c.body["step"] != "s2") {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.kill().await.unwrap();
    let events =
        tokio::time::timeout(Duration::from_secs(30), watcher).await.expect("B finished the execution").unwrap();
    assert_gapless(&events);
    assert_agent_calls(&agent);
    let listed = on_b
        .list_executions(pb::ListExecutionsRequest {
            statuses: vec![pb::ExecutionStatus::Completed as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.executions.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["exe-durable"]);
    assert!(b.logs().iter().any(|l| l.contains("resuming execution")), "B took the execution over");
}

async fn a_stopping_executor_ends_its_streams_and_hands_its_executions_on(backend: Backend) {
    let Some((db, discovery, agent, otlp)) = setup(backend).await else { return };
    // A long lease: the next executor gets the execution at once only if it was handed back.
    let mut first = executor_with_lease(&discovery.url(), &db.url, &otlp.endpoint(), "60").await;
    let mut client = client(&first).await;
    let mut stream =
        Box::pin(client.execute(traced(chain_plan())).await.unwrap().into_inner().map(|r| r.map(|r| r.event.unwrap())));
    let mut seen = read_until(&mut stream, started("s2")).await;
    let stopped = tokio::time::timeout(Duration::from_secs(20), first.terminate()).await;
    assert!(stopped.expect("SIGTERM stops the executor despite an open stream").unwrap().success());
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
    let status = ended.expect("the stream ends with a status").unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("from_sequence"), "{}", status.message());
    let second = executor_with_lease(&discovery.url(), &db.url, &otlp.endpoint(), "60").await;
    let mut client = self::client(&second).await;
    let last = seen.last().unwrap().sequence;
    let rest = tokio::time::timeout(Duration::from_secs(20), watch(&mut client, last)).await;
    seen.extend(rest.expect("the execution resumed at once, not after its 60 s lease"));
    assert_gapless(&seen);
    assert_eq!(agent.calls().iter().filter(|c| c.body["step"] == "s1").count(), 1);
}

mod sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_killed_executor_resumes_its_executions_after_a_restart() {
        super::a_killed_executor_resumes_its_executions_after_a_restart(agentmesh_testkit::Backend::Sqlite).await;
    }
}

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_killed_executor_resumes_its_executions_after_a_restart() {
        super::a_killed_executor_resumes_its_executions_after_a_restart(agentmesh_testkit::Backend::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopping_executor_ends_its_streams_and_hands_its_executions_on() {
        super::a_stopping_executor_ends_its_streams_and_hands_its_executions_on(agentmesh_testkit::Backend::Postgres)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_replica_takes_over_and_any_replica_can_be_watched() {
        super::a_second_replica_takes_over_and_any_replica_can_be_watched(agentmesh_testkit::Backend::Postgres).await;
    }
}

/// Runs the `agentmesh` binary; returns its exit status, stdout and stderr.
async fn cli(args: &[&str]) -> (bool, String, String) {
    let output = tokio::process::Command::new(EXE).args(args).output().await.unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_runs_plans_and_lists_inspects_follows_and_cancels_executions() {
    let Some((db, discovery, _agent, otlp)) = setup(Backend::Sqlite).await else { return };
    let executor = executor(&discovery.url(), &db.url, &otlp.endpoint()).await;
    let url = executor.url();
    let plan = std::env::temp_dir().join(format!("agentmesh-cli-plan-{}.json", std::process::id()));
    std::fs::write(
        &plan,
        json!({"reasoning": "", "steps": [
            {"step_id": "s1", "agent": "worker", "capability": "fast", "instruction": "", "parameters": {"x": 1}, "depends_on": []},
            {"step_id": "s2", "agent": "time-tool-v1", "capability": "now", "instruction": "", "parameters": {}, "depends_on": ["s1"]}]})
        .to_string(),
    )
    .unwrap();
    let (ok, stdout, stderr) =
        cli(&["run", plan.to_str().unwrap(), "--executor", &url, "--execution-id", "exe-cli"]).await;
    // The same command again attaches to the execution it started.
    let (_, again, again_err) =
        cli(&["run", plan.to_str().unwrap(), "--executor", &url, "--execution-id", "exe-cli"]).await;
    let _ = std::fs::remove_file(&plan);
    assert!(!again_err.contains("already exists"), "{again_err}");
    assert_eq!(again, stdout, "the same execution, reported the same");
    assert!(!ok, "a failed execution fails the command");
    let printed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (printed["status"].as_str(), printed["outputs"]["s1"].clone()),
        (Some("failed"), json!({"echo": {"x": 1}}))
    );
    assert!(stderr.contains("s2 failed: agent `time-tool-v1` is not registered"), "{stderr}");
    assert!(stderr.contains("execution failed"), "{stderr}");

    let (ok, listed, _) = cli(&["executions", "list", "--executor", &url, "--status", "failed"]).await;
    assert!(ok && listed.lines().nth(1).is_some_and(|l| l.starts_with("exe-cli") && l.contains("failed")), "{listed}");
    let (ok, got, _) = cli(&["executions", "get", "exe-cli", "--executor", &url]).await;
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert!(ok);
    assert_eq!((got["status"].as_str(), got["steps"][0]["status"].as_str()), (Some("failed"), Some("succeeded")));
    let (ok, _, followed) = cli(&["executions", "watch", "exe-cli", "--executor", &url, "--after", "3"]).await;
    assert!(ok);
    assert!(
        !followed.contains("#3 ") && followed.contains("#4 ") && followed.contains("execution failed"),
        "{followed}"
    );
    let (ok, cancelled, _) = cli(&["executions", "cancel", "exe-cli", "--executor", &url]).await;
    assert!(ok);
    assert_eq!(cancelled.trim(), "exe-cli failed", "a finished execution stays as it was");
    let (ok, _, missing) = cli(&["executions", "get", "exe-nope", "--executor", &url]).await;
    assert!(!ok && missing.contains("(not_found)"), "{missing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_says_how_to_follow_an_execution_whose_executor_died() {
    let Some((db, discovery, _agent, otlp)) = setup(Backend::Sqlite).await else { return };
    let mut executor = executor(&discovery.url(), &db.url, &otlp.endpoint()).await;
    let url = executor.url();
    let plan = std::env::temp_dir().join(format!("agentmesh-cli-dies-{}.json", std::process::id()));
    std::fs::write(
        &plan,
        json!({"steps": [{"step_id": "s1", "agent": "worker", "capability": "slow", "parameters": {}}]}).to_string(),
    )
    .unwrap();
    let run = tokio::process::Command::new(EXE)
        .args(["run", plan.to_str().unwrap(), "--executor", &url, "--execution-id", "exe-dies"])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The slow step is running (1.5 s) when the executor is killed.
    tokio::time::sleep(Duration::from_millis(700)).await;
    executor.kill().await.unwrap();
    let output = run.wait_with_output().await.unwrap();
    let _ = std::fs::remove_file(&plan);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("agentmesh executions watch exe-dies --after 2"), "{stderr}");
}
