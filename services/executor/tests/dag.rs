//! Running plans against real HTTP agents, on SQLite and PostgreSQL:
//! scheduling, references, retries, timeouts, circuits, output checks,
//! cancellation, watching, attaching, and what is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent};
use common::{Mesh, assert_complete_log, event_for, kinds, of_kind, options, output, plan, request, step};
use pb::ExecutionEventKind as Kind;
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic_types::StatusExt;

async fn independent_steps_overlap_and_dependents_wait(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![("work", Behavior::Echo(Duration::from_millis(300)))]).await.unwrap();
    mesh.register(&agent.registration("worker", &[("work", None)])).await;
    let p = plan(vec![
        step("s1", "worker", "work", json!({"n": 1}), &[]),
        step("s2", "worker", "work", json!({"n": 2}), &[]),
        step("s3", "worker", "work", json!({"n": 3}), &[]),
        step("s4", "worker", "work", json!({"n": 4}), &["s1", "s2", "s3"]),
    ]);
    let events = mesh.run(p, options(0, 5_000)).await.unwrap();
    assert_complete_log(&events);
    assert_eq!(events.last().unwrap().kind, Kind::ExecutionCompleted as i32, "{:?}", kinds(&events));
    assert_eq!(agent.max_in_flight(), 3, "the three independent steps ran at once");
    let calls = agent.calls();
    let last = calls.iter().find(|c| c.body["n"] == 4).unwrap();
    for first in calls.iter().filter(|c| c.body["n"] != 4) {
        assert!(last.started >= first.ended.unwrap(), "s4 starts only after each dependency answered");
    }
    // The critical path is two calls long; run one after another they would be four.
    let span = last.ended.unwrap() - calls.iter().map(|c| c.started).min().unwrap();
    assert!(span < Duration::from_millis(4 * 300), "{span:?}");
}

async fn references_keep_their_type_or_become_text(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![
        ("quote", Behavior::Always(Answer::ok(json!({"price": 251.5, "name": "TSLA", "tags": ["ev", "auto"]})))),
        ("math", Behavior::Echo(Duration::ZERO)),
    ])
    .await
    .unwrap();
    mesh.register(&agent.registration("stocks", &[("quote", None), ("math", None)])).await;
    let mut s2 = step(
        "s2",
        "stocks",
        "math",
        json!({"n": "{{s1.output.price}}", "text": "{{s1.output.name}} costs {{s1.output.price}}",
               "first": "{{ s1.output.tags[0] }}", "all": "{{s1.output.tags}}", "literal": "{{not a reference}}"}),
        &["s1"],
    );
    s2["instruction"] = json!("Multiply 100 by {{s1.output.price}}");
    let s3 = step("s3", "stocks", "math", json!({"volume": "{{s1.output.volume}}"}), &["s1"]);
    let events = mesh
        .run(plan(vec![step("s1", "stocks", "quote", json!({"symbol": "TSLA"}), &[]), s2, s3]), options(0, 5_000))
        .await
        .unwrap();
    let math = agent.calls_to("math");
    assert_eq!(math.len(), 1, "s3 never reached the agent");
    assert_eq!(
        math[0].body,
        json!({"n": 251.5, "text": "TSLA costs 251.5", "first": "ev", "all": ["ev", "auto"], "literal": "{{not a reference}}"})
    );
    assert_eq!(math[0].header("x-agentmesh-instruction"), Some("Multiply%20100%20by%20251.5"));
    let failed = event_for(&events, Kind::StepFailed, "s3");
    assert_eq!(failed.error, "cannot resolve `{{s1.output.volume}}`: `output` has no field `volume`");
    assert_eq!(output(&events, "s2")["echo"]["n"], json!(251.5));
}

async fn retryable_failures_are_retried_with_one_idempotency_key(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![(
        "flaky",
        Behavior::Sequence(vec![
            Answer::status(503, json!({"error": "warming up"})).with_header("retry-after", "1"),
            Answer::status(502, json!({"error": "bad gateway"})),
            Answer::ok(json!({"ok": true})),
        ]),
    )])
    .await
    .unwrap();
    mesh.register(&agent.registration("flaky-agent", &[("flaky", None)])).await;
    let events =
        mesh.run(plan(vec![step("s1", "flaky-agent", "flaky", json!({}), &[])]), options(3, 5_000)).await.unwrap();
    assert_eq!(
        kinds(&events),
        [
            "EXECUTION_STARTED",
            "STEP_STARTED s1",
            "STEP_RETRYING s1",
            "STEP_RETRYING s1",
            "STEP_SUCCEEDED s1",
            "EXECUTION_COMPLETED"
        ]
    );
    let retries = of_kind(&events, Kind::StepRetrying);
    assert_eq!((retries[0].attempt, retries[1].attempt), (1, 2));
    assert!(retries[0].retry_delay_ms >= 1_000, "Retry-After: 1 is honoured: {}", retries[0].retry_delay_ms);
    assert!(retries[0].error.contains("HTTP 503: warming up"), "{}", retries[0].error);
    assert_eq!(event_for(&events, Kind::StepSucceeded, "s1").attempt, 3);
    let calls = agent.calls();
    let execution_id = &events[0].execution_id;
    assert_eq!(calls.len(), 3);
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call.header("idempotency-key"), Some(format!("{execution_id}/s1").as_str()));
        assert_eq!(call.header("x-request-id"), Some("req_test"));
        assert_eq!(call.header("x-agentmesh-attempt"), Some((i + 1).to_string().as_str()));
    }
}

async fn client_errors_are_not_retried_and_failures_skip_only_dependents(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![
        ("bad", Behavior::Always(Answer::status(400, json!({"error": "location is required"})))),
        ("ok", Behavior::Echo(Duration::ZERO)),
    ])
    .await
    .unwrap();
    mesh.register(&agent.registration("a", &[("bad", None), ("ok", None)])).await;
    let p = plan(vec![
        step("s1", "a", "bad", json!({}), &[]),
        step("s2", "a", "ok", json!({}), &["s1"]),
        step("s3", "a", "ok", json!({}), &["s2"]),
        step("s4", "a", "ok", json!({}), &[]),
    ]);
    let events = mesh.run(p, options(3, 5_000)).await.unwrap();
    assert_complete_log(&events);
    assert_eq!(agent.calls_to("bad").len(), 1, "a 400 is never retried");
    assert_eq!(event_for(&events, Kind::StepFailed, "s1").error, "the agent answered HTTP 400: location is required");
    assert_eq!(event_for(&events, Kind::StepSkipped, "s2").error, "dependency s1 failed");
    assert_eq!(event_for(&events, Kind::StepSkipped, "s3").error, "dependency s2 was skipped");
    event_for(&events, Kind::StepSucceeded, "s4");
    let end = events.last().unwrap();
    assert_eq!(end.kind, Kind::ExecutionFailed as i32);
    assert!(end.error.starts_with("3 of 4 steps did not succeed: s1 failed"), "{}", end.error);
    let execution = mesh.get(&end.execution_id).await;
    let statuses: Vec<i32> = execution.step_results.iter().map(|r| r.status).collect();
    use pb::StepStatus as S;
    assert_eq!(statuses, [S::Failed as i32, S::Skipped as i32, S::Skipped as i32, S::Succeeded as i32]);
    assert_eq!(execution.status, pb::ExecutionStatus::Failed as i32);
    assert_eq!(execution.last_sequence, end.sequence);
}

async fn a_step_that_outlasts_its_timeout_fails(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![("slow", Behavior::Always(Answer::ok(json!({})).after(Duration::from_secs(3))))])
        .await
        .unwrap();
    mesh.register(&agent.registration("slowpoke", &[("slow", None)])).await;
    let events = mesh.run(plan(vec![step("s1", "slowpoke", "slow", json!({}), &[])]), options(1, 200)).await.unwrap();
    let retry = event_for(&events, Kind::StepRetrying, "s1");
    assert!(retry.error.contains("within 200 ms"), "{}", retry.error);
    let failed = event_for(&events, Kind::StepFailed, "s1");
    assert!(failed.error.contains("within 200 ms") && failed.error.contains("after 2 attempts"), "{}", failed.error);
    assert_eq!(failed.attempt, 2);
}

async fn an_agent_that_keeps_failing_opens_its_circuit_until_a_probe_succeeds(backend: Backend) {
    let Some(mesh) = Mesh::start_with(backend, |c| {
        c.circuit_failure_threshold = 2;
        c.circuit_open_secs = 0.5;
    })
    .await
    else {
        return;
    };
    let agent = FakeAgent::start(vec![("call", Behavior::Always(Answer::status(503, json!({"error": "down"}))))])
        .await
        .unwrap();
    mesh.register(&agent.registration("shaky", &[("call", None)])).await;
    let one = || plan(vec![step("s1", "shaky", "call", json!({}), &[])]);
    mesh.run(one(), options(1, 2_000)).await.unwrap();
    assert_eq!(agent.calls().len(), 2);
    assert!(mesh.metrics().await.contains(r#"agentmesh_executor_circuit_state{agent="shaky"} 2"#));
    let events = mesh.run(one(), options(0, 2_000)).await.unwrap();
    let failed = event_for(&events, Kind::StepFailed, "s1");
    assert!(
        failed.error.starts_with("circuit open for agent `shaky` after 2 consecutive failures"),
        "{}",
        failed.error
    );
    assert_eq!(agent.calls().len(), 2, "an open circuit fails fast, without calling the agent");
    agent.set("call", Behavior::Always(Answer::ok(json!({"back": true}))));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let events = mesh.run(one(), options(0, 2_000)).await.unwrap();
    assert_eq!(output(&events, "s1"), json!({"back": true}), "the probe went through");
    assert!(mesh.metrics().await.contains(r#"agentmesh_executor_circuit_state{agent="shaky"} 0"#));
}

async fn outputs_are_checked_before_anything_depends_on_them(backend: Backend) {
    let Some(mesh) = Mesh::start_with(backend, |c| c.max_output_bytes = 2048).await else { return };
    let schema = json!({"type": "object", "required": ["temp_c"], "properties": {"temp_c": {"type": "number"}}});
    let agent = FakeAgent::start(vec![
        ("weather", Behavior::Always(Answer::ok(json!({"temp": "hot"})))),
        ("empty", Behavior::Always(Answer::ok(Value::Null))),
        ("huge", Behavior::Always(Answer::ok(json!({"text": "x".repeat(4096)})))),
        ("next", Behavior::Echo(Duration::ZERO)),
    ])
    .await
    .unwrap();
    mesh.register(
        &agent.registration("w", &[("weather", Some(schema)), ("empty", None), ("huge", None), ("next", None)]),
    )
    .await;
    let p = plan(vec![
        step("s1", "w", "weather", json!({}), &[]),
        step("s2", "w", "next", json!({"t": "{{s1.output.temp_c}}"}), &["s1"]),
        step("s3", "w", "empty", json!({}), &[]),
        step("s4", "w", "huge", json!({}), &[]),
    ]);
    let events = mesh.run(p, options(2, 5_000)).await.unwrap();
    let s1 = event_for(&events, Kind::StepFailed, "s1");
    assert!(s1.error.starts_with("the output does not fit the output schema of w:weather"), "{}", s1.error);
    assert!(s1.error.contains("temp_c"), "{}", s1.error);
    assert_eq!(event_for(&events, Kind::StepSkipped, "s2").error, "dependency s1 failed");
    assert!(event_for(&events, Kind::StepFailed, "s3").error.contains("empty body"));
    assert!(event_for(&events, Kind::StepFailed, "s4").error.contains("larger than 2048 bytes"));
    assert!(agent.calls_to("next").is_empty());
    assert_eq!(agent.calls_to("weather").len(), 1, "a wrong output is not retried");
}

async fn cancel_stops_in_flight_calls_and_pending_steps(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent =
        FakeAgent::start(vec![("hang", Behavior::Hang), ("after", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    mesh.register(&agent.registration("h", &[("hang", None), ("after", None)])).await;
    let mut req = request(
        plan(vec![step("s1", "h", "hang", json!({}), &[]), step("s2", "h", "after", json!({}), &["s1"])]),
        options(0, 60_000),
    );
    req.execution_id = "exe-cancel".into();
    let mut client = mesh.client.clone();
    let mut stream = client.execute(req).await.unwrap().into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while agent.calls().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the agent was never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = client
        .cancel_execution(pb::CancelExecutionRequest {
            execution_id: "exe-cancel".into(),
            reason: "user gave up".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(cancelled.status, pb::ExecutionStatus::Cancelled as i32);
    assert_eq!(cancelled.error, "user gave up");
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        events.push(item.unwrap().event.unwrap());
    }
    assert_complete_log(&events);
    assert_eq!(event_for(&events, Kind::StepCancelled, "s1").error, "cancelled: user gave up");
    event_for(&events, Kind::StepCancelled, "s2");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !agent.calls()[0].abandoned {
        assert!(tokio::time::Instant::now() < deadline, "the in-flight call was not stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(agent.calls_to("after").is_empty());
    // Cancelling again changes nothing.
    let again = client
        .cancel_execution(pb::CancelExecutionRequest { execution_id: "exe-cancel".into(), reason: "again".into() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!((again.status, again.error.as_str()), (pb::ExecutionStatus::Cancelled as i32, "user gave up"));
}

async fn watching_from_a_sequence_gives_every_later_event_once(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![("work", Behavior::Echo(Duration::from_millis(150)))]).await.unwrap();
    mesh.register(&agent.registration("w", &[("work", None)])).await;
    let p = plan(vec![
        step("s1", "w", "work", json!({}), &[]),
        step("s2", "w", "work", json!({}), &["s1"]),
        step("s3", "w", "work", json!({}), &["s2"]),
    ]);
    // Read the first events, hang up, and come back with the last sequence seen.
    let mut client = mesh.client.clone();
    let mut stream = client.execute(request(p, options(0, 5_000))).await.unwrap().into_inner();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(stream.next().await.unwrap().unwrap().event.unwrap());
    }
    drop(stream);
    let id = seen[0].execution_id.clone();
    let mut rest = client
        .watch_execution(pb::WatchExecutionRequest { execution_id: id.clone(), from_sequence: seen[2].sequence })
        .await
        .unwrap()
        .into_inner();
    while let Some(item) = rest.next().await {
        seen.push(item.unwrap().event.unwrap());
    }
    assert_complete_log(&seen);
    assert_eq!(seen.last().unwrap().kind, Kind::ExecutionCompleted as i32);
    // After the end, a watch replays from where it is asked to.
    let mut replay = client
        .watch_execution(pb::WatchExecutionRequest { execution_id: id.clone(), from_sequence: 4 })
        .await
        .unwrap()
        .into_inner();
    let mut tail = Vec::new();
    while let Some(item) = replay.next().await {
        tail.push(item.unwrap().event.unwrap());
    }
    assert_eq!(tail, seen[4..]);
    let missing =
        client.watch_execution(pb::WatchExecutionRequest { execution_id: "exe-nope".into(), from_sequence: 0 }).await;
    assert_eq!(missing.err().map(|s| s.code()), Some(tonic::Code::NotFound));
}

async fn a_resent_execute_attaches_instead_of_running_twice(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![("work", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    mesh.register(&agent.registration("w", &[("work", None)])).await;
    let mut req = request(plan(vec![step("s1", "w", "work", json!({"x": 1}), &[])]), options(0, 5_000));
    req.execution_id = "exe-once".into();
    let first = mesh.run_request(req.clone()).await.unwrap();
    let second = mesh.run_request(req.clone()).await.unwrap();
    assert_eq!(first, second, "the same events, replayed");
    assert_eq!(agent.calls().len(), 1, "the agent was called once");
    req.plan.as_mut().unwrap().steps[0].instruction = "something else".into();
    let clash = mesh.run_request(req).await.unwrap_err();
    assert_eq!(clash.code(), tonic::Code::AlreadyExists);
    assert!(clash.message().contains("exe-once"), "{}", clash.message());
}

async fn invalid_requests_are_refused_with_what_to_change(backend: Backend) {
    let Some(mesh) = Mesh::start_with(backend, |c| c.max_steps_per_plan = 3).await else { return };
    let cyclic = plan(vec![
        step("s1", "a", "x", json!({}), &["s2"]),
        step("s2", "a", "x", json!({}), &["s1"]),
        step("s3", "a", "x", json!({"v": "{{s1.output}}"}), &["s9"]),
    ]);
    let status = mesh.run(cyclic, options(0, 1_000)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let fields: Vec<String> =
        status.get_details_bad_request().unwrap().field_violations.into_iter().map(|v| v.field).collect();
    assert!(fields.contains(&"plan.steps".to_owned()), "{fields:?}");
    assert!(fields.contains(&"plan.steps[s3].depends_on".to_owned()), "{fields:?}");
    assert!(fields.contains(&"plan.steps[s3].parameters".to_owned()), "{fields:?}");
    let too_big = plan((1..=4).map(|i| step(&format!("s{i}"), "a", "x", json!({}), &[])).collect());
    let status = mesh.run(too_big, options(0, 1_000)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("max_steps_per_plan"), "{}", status.message());
    let mut req = request(plan(vec![]), options(0, 1_000));
    req.execution_id = "bad id!".into();
    assert_eq!(mesh.run_request(req).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let req = pb::ExecuteRequest { plan: None, ..Default::default() };
    let status = mesh.run_request(req).await.unwrap_err();
    assert!(status.message().contains("a plan is required"), "{}", status.message());
    // Zero steps is a valid plan: it completes at once.
    let events = mesh.run(plan(vec![]), options(0, 1_000)).await.unwrap();
    assert_eq!(kinds(&events), ["EXECUTION_STARTED", "EXECUTION_COMPLETED"]);
}

async fn only_registered_callable_agents_are_ever_called(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![("work", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    mesh.register(&agent.registration("weather-tool-v2", &[("work", None)])).await;
    mesh.register(&agent.registration("my-orchestrator", &[("work", None)])).await;
    let mut with_internal = agent.registration("secretive", &[("work", None)]);
    with_internal["skills"][0]["internal"] = json!(true);
    mesh.register(&with_internal).await;
    let mut metadata = agent.registration("metadata", &[("work", None)]);
    metadata["base_url"] = json!("http://169.254.169.254:80");
    mesh.register(&metadata).await;
    let gone = FakeAgent::start(vec![("work", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    mesh.register(&gone.registration("gone", &[("work", None)])).await;
    mesh.deregister("gone").await;
    // The executor hears of a removal through discovery's watch stream, a
    // moment after it is made: wait for that moment.
    let started = std::time::Instant::now();
    loop {
        let events = mesh.run(plan(vec![step("s1", "gone", "work", json!({}), &[])]), options(0, 2_000)).await.unwrap();
        if !of_kind(&events, Kind::StepFailed).is_empty() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the executor still calls a deregistered agent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let p = plan(vec![
        step("s1", "time-tool-v1", "get_current_time", json!({}), &[]),
        step("s2", "my-orchestrator", "work", json!({}), &[]),
        step("s3", "secretive", "work", json!({}), &[]),
        step("s4", "metadata", "work", json!({}), &[]),
        step("s5", "gone", "work", json!({}), &[]),
        step("s6", "weather-tool-v2", "nope", json!({}), &[]),
        step("s7", "weather-tool-v2", "work", json!({}), &[]),
    ]);
    let mut req = request(p, options(2, 2_000));
    req.caller_agent_ids = vec!["my-orchestrator".into()];
    let events = mesh.run_request(req).await.unwrap();
    let error = |s: &str| event_for(&events, Kind::StepFailed, s).error.clone();
    assert_eq!(
        error("s1"),
        "agent `time-tool-v1` is not registered (it may have been deregistered since the plan was made)"
    );
    assert_eq!(error("s2"), "agent `my-orchestrator` is the calling orchestrator itself and is never called");
    assert_eq!(error("s3"), "capability `secretive:work` is internal and cannot be planned for");
    assert!(error("s4").contains("169.254.169.254 is in a denied network"), "{}", error("s4"));
    assert!(error("s5").contains("`gone` is not registered"), "{}", error("s5"));
    assert_eq!(error("s6"), "agent `weather-tool-v2` has no capability `nope` (it offers: work)");
    event_for(&events, Kind::StepSucceeded, "s7");
    assert_eq!(agent.calls().len(), 1, "only s7 reached an agent");
    for s in ["s1", "s2", "s3", "s4", "s5", "s6"] {
        assert_eq!(event_for(&events, Kind::StepFailed, s).attempt, 1, "{s} is not retried");
    }
}

async fn executions_are_listed_newest_first_by_status_and_request(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![
        ("ok", Behavior::Echo(Duration::ZERO)),
        ("bad", Behavior::Always(Answer::status(400, json!({})))),
    ])
    .await
    .unwrap();
    mesh.register(&agent.registration("a", &[("ok", None), ("bad", None)])).await;
    for (i, capability) in ["ok", "bad", "ok"].iter().enumerate() {
        let mut req = request(plan(vec![step("s1", "a", capability, json!({}), &[])]), options(0, 2_000));
        req.execution_id = format!("exe-list-{i}");
        req.request_id = if i == 2 { "req_other".into() } else { "req_list".into() };
        mesh.run_request(req).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut client = mesh.client.clone();
    let list = |statuses: Vec<pb::ExecutionStatus>, request_id: &str, page_size: u32, page_token: String| {
        let request = pb::ListExecutionsRequest {
            statuses: statuses.into_iter().map(|s| s as i32).collect(),
            request_id: request_id.into(),
            page_size,
            page_token,
        };
        let mut client = client.clone();
        async move { client.list_executions(request).await.unwrap().into_inner() }
    };
    let all = list(vec![], "", 0, String::new()).await;
    let ids: Vec<&str> = all.executions.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["exe-list-2", "exe-list-1", "exe-list-0"]);
    let failed = list(vec![pb::ExecutionStatus::Failed], "", 0, String::new()).await;
    assert_eq!(failed.executions.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["exe-list-1"]);
    let by_request = list(vec![], "req_list", 1, String::new()).await;
    assert_eq!(by_request.executions[0].id, "exe-list-1");
    let next = list(vec![], "req_list", 1, by_request.next_page_token.clone()).await;
    assert_eq!(next.executions[0].id, "exe-list-0");
    assert!(next.next_page_token.is_empty());
    let bad =
        client.list_executions(pb::ListExecutionsRequest { page_token: "nonsense".into(), ..Default::default() }).await;
    assert_eq!(bad.err().map(|s| s.code()), Some(tonic::Code::InvalidArgument));
    let metrics = mesh.metrics().await;
    assert!(metrics.contains(r#"agentmesh_executor_steps_total{agent="a",status="succeeded"} 2"#), "{metrics}");
    assert!(metrics.contains(r#"agentmesh_executor_executions_total{status="failed"} 1"#), "{metrics}");
    assert!(metrics.contains("agentmesh_executor_event_write_seconds_count"), "{metrics}");
}

async fn limits_refuse_with_the_setting_to_change(backend: Backend) {
    let Some(mesh) = Mesh::start_with(backend, |c| {
        c.max_concurrent_executions = 1;
        c.service.max_request_bytes = 4096;
    })
    .await
    else {
        return;
    };
    let agent = FakeAgent::start(vec![("hang", Behavior::Hang)]).await.unwrap();
    mesh.register(&agent.registration("h", &[("hang", None)])).await;
    let mut client = mesh.client.clone();
    let mut busy = request(plan(vec![step("s1", "h", "hang", json!({}), &[])]), options(0, 60_000));
    busy.execution_id = "exe-busy".into();
    let _running = client.execute(busy).await.unwrap().into_inner();
    let second = mesh.run(plan(vec![step("s1", "h", "hang", json!({}), &[])]), options(0, 60_000)).await.unwrap_err();
    assert_eq!(second.code(), tonic::Code::ResourceExhausted);
    assert!(second.message().contains("max_concurrent_executions"), "{}", second.message());
    let huge = plan(vec![step("s1", "h", "hang", json!({"text": "x".repeat(8192)}), &[])]);
    let too_big = mesh.run(huge, options(0, 1_000)).await.unwrap_err();
    assert_eq!(too_big.code(), tonic::Code::ResourceExhausted, "{too_big:?}");
    assert!(too_big.message().contains("max_request_bytes"), "{}", too_big.message());
    client
        .cancel_execution(pb::CancelExecutionRequest { execution_id: "exe-busy".into(), reason: String::new() })
        .await
        .unwrap();
}

async fn parameters_that_do_not_fit_the_input_schema_are_refused_by_name(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![("weather", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    let mut registration = agent.registration("w", &[("weather", None)]);
    registration["skills"][0]["input_schema"] = json!({"type": "object",
        "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}, "required": ["location"]});
    mesh.register(&registration).await;
    let wrong = plan(vec![step("s1", "w", "weather", json!({"city": "Chicago", "days": "two"}), &[])]);
    let status = mesh.run(wrong, options(0, 5_000)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let fields: Vec<String> =
        status.get_details_bad_request().unwrap().field_violations.into_iter().map(|v| v.field).collect();
    assert!(fields.contains(&"plan.steps[s1].parameters".to_owned()), "the missing `location`: {fields:?}");
    assert!(fields.contains(&"plan.steps[s1].parameters.days".to_owned()), "{fields:?}");
    assert!(status.message().contains("location") && status.message().contains("w/weather"), "{}", status.message());
    assert!(agent.calls().is_empty(), "the agent was called with parameters that cannot fit");
    // A reference is checked once resolved, not as written.
    let referenced = plan(vec![
        step("s1", "w", "weather", json!({"location": "Chicago"}), &[]),
        step("s2", "w", "weather", json!({"location": "Tokyo", "days": "{{s1.output.n}}"}), &["s1"]),
    ]);
    let events = mesh.run(referenced, options(0, 5_000)).await.unwrap();
    assert!(kinds(&events).iter().any(|k| k == "STEP_SUCCEEDED s1"), "{:?}", kinds(&events));
}

async fn the_callers_trace_context_reaches_agents_without_an_exporter(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    assert!(!agentmesh_telemetry::exporting(), "this test runs an executor that exports no traces");
    let agent = FakeAgent::start(vec![("work", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    mesh.register(&agent.registration("w", &[("work", None)])).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut call = tonic::Request::new(request(plan(vec![step("s1", "w", "work", json!({}), &[])]), options(0, 5_000)));
    call.metadata_mut().insert("traceparent", traceparent.parse().unwrap());
    let mut stream = mesh.client.clone().execute(call).await.unwrap().into_inner();
    while stream.next().await.is_some() {}
    let calls = agent.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].header("traceparent"), Some(traceparent), "the caller's trace context was dropped");
}

agentmesh_testkit::both_backends!(
    the_callers_trace_context_reaches_agents_without_an_exporter,
    parameters_that_do_not_fit_the_input_schema_are_refused_by_name,
    limits_refuse_with_the_setting_to_change,
    independent_steps_overlap_and_dependents_wait,
    references_keep_their_type_or_become_text,
    retryable_failures_are_retried_with_one_idempotency_key,
    client_errors_are_not_retried_and_failures_skip_only_dependents,
    a_step_that_outlasts_its_timeout_fails,
    an_agent_that_keeps_failing_opens_its_circuit_until_a_probe_succeeds,
    outputs_are_checked_before_anything_depends_on_them,
    cancel_stops_in_flight_calls_and_pending_steps,
    watching_from_a_sequence_gives_every_later_event_once,
    a_resent_execute_attaches_instead_of_running_twice,
    invalid_requests_are_refused_with_what_to_change,
    only_registered_callable_agents_are_ever_called,
    executions_are_listed_newest_first_by_status_and_request,
);
