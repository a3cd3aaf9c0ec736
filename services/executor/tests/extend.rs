//! Extending a finished execution (`ExtendExecution`, used by the gateway's
//! recovery rounds), on SQLite and PostgreSQL: the new steps run in the same
//! execution, continue its sequence and read its earlier outputs; running
//! and cancelled executions are not extended; a watch from the start sees
//! every round.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent};
use common::{Mesh, event_for, kinds, options, plan, step};
use pb::ExecutionEventKind as Kind;
use serde_json::{Value, json};
use tokio_stream::StreamExt;

fn steps(values: Vec<Value>) -> Vec<pb::PlanStep> {
    let plan: agentmesh_core::plan::Plan = serde_json::from_value(plan(values)).unwrap();
    agentmesh_proto::convert::plan_to_pb(&plan).steps
}

async fn extend(mesh: &Mesh, id: &str, new: Vec<pb::PlanStep>) -> Result<Vec<pb::ExecutionEvent>, tonic::Status> {
    let mut client = mesh.client.clone();
    let mut stream = client
        .extend_execution(pb::ExtendExecutionRequest {
            execution_id: id.into(),
            steps: new,
            reason: "review recovery round 1".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        events.push(item?.event.unwrap());
    }
    Ok(events)
}

async fn a_finished_execution_runs_more_steps_in_the_same_log(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![
        ("quote", Behavior::Always(Answer::ok(json!({"price": 251.5})))),
        ("news", Behavior::Always(Answer::status(503, json!({"error": "down"})))),
        ("math", Behavior::Echo(Duration::ZERO)),
    ])
    .await
    .unwrap();
    mesh.register(&agent.registration("stocks", &[("quote", None), ("news", None), ("math", None)])).await;
    let first = mesh
        .run(
            plan(vec![
                step("s1", "stocks", "quote", json!({"symbol": "TSLA"}), &[]),
                step("s2", "stocks", "news", json!({}), &[]),
            ]),
            options(0, 5_000),
        )
        .await
        .unwrap();
    assert_eq!(first.last().unwrap().kind, Kind::ExecutionFailed as i32, "{:?}", kinds(&first));
    let id = first[0].execution_id.clone();
    let last = first.last().unwrap().sequence;

    let more =
        extend(&mesh, &id, steps(vec![step("s3", "stocks", "math", json!({"n": "{{s1.output.price}}"}), &["s1"])]))
            .await
            .unwrap();
    assert_eq!(more[0].kind, Kind::ExecutionExtended as i32, "{:?}", kinds(&more));
    assert_eq!(more[0].error, "review recovery round 1");
    assert_eq!(more[0].added_steps[0].step_id, "s3");
    let sequences: Vec<u64> = more.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, (last + 1..=last + more.len() as u64).collect::<Vec<_>>());
    let s3 = event_for(&more, Kind::StepSucceeded, "s3");
    assert_eq!(s3.output.as_ref().map(agentmesh_proto::json::from_value).unwrap()["echo"]["n"], json!(251.5));
    // s2 still failed, so the execution ends failed again, with s3 in it.
    assert_eq!(more.last().unwrap().kind, Kind::ExecutionFailed as i32, "{:?}", kinds(&more));
    assert!(!more.iter().any(|e| e.step_id == "s1" || e.step_id == "s2"), "finished steps ran again");
    let execution = mesh.get(&id).await;
    assert_eq!(execution.plan.unwrap().steps.len(), 3);
    assert_eq!(execution.last_sequence, more.last().unwrap().sequence);
    assert_eq!(execution.status, pb::ExecutionStatus::Failed as i32);

    // A watch from the start sees both rounds, in one gapless log.
    let mut client = mesh.client.clone();
    let watched: Vec<pb::ExecutionEvent> = client
        .watch_execution(pb::WatchExecutionRequest { execution_id: id.clone(), from_sequence: 0 })
        .await
        .unwrap()
        .into_inner()
        .map(|e| e.unwrap().event.unwrap())
        .collect()
        .await;
    let all: Vec<u64> = watched.iter().map(|e| e.sequence).collect();
    assert_eq!(all, (1..=execution.last_sequence).collect::<Vec<_>>(), "{:?}", kinds(&watched));
}

async fn only_finished_uncancelled_executions_are_extended(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![("hang", Behavior::Hang), ("ok", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    mesh.register(&agent.registration("h", &[("hang", None), ("ok", None)])).await;
    let mut client = mesh.client.clone();
    let mut running = common::request(plan(vec![step("s1", "h", "hang", json!({}), &[])]), options(0, 60_000));
    running.execution_id = "exe-running".into();
    let _stream = client.execute(running).await.unwrap().into_inner();
    let more = || steps(vec![step("s9", "h", "ok", json!({}), &[])]);
    let error = extend(&mesh, "exe-running", more()).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::FailedPrecondition, "{error:?}");
    assert!(error.message().contains("still running"), "{}", error.message());

    client
        .cancel_execution(pb::CancelExecutionRequest { execution_id: "exe-running".into(), reason: "stop".into() })
        .await
        .unwrap();
    let error = extend(&mesh, "exe-running", more()).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::FailedPrecondition);
    assert!(error.message().contains("cancelled"), "{}", error.message());

    let error = extend(&mesh, "exe-nope", more()).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::NotFound);
    let done = mesh.run(plan(vec![step("s1", "h", "ok", json!({}), &[])]), options(0, 5_000)).await.unwrap();
    let id = done[0].execution_id.clone();
    let error = extend(&mesh, &id, vec![]).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let clash = extend(&mesh, &id, steps(vec![step("s1", "h", "ok", json!({}), &[])])).await.unwrap_err();
    assert_eq!(clash.code(), tonic::Code::InvalidArgument, "{clash:?}");
    let dangling = extend(&mesh, &id, steps(vec![step("s2", "h", "ok", json!({}), &["s7"])])).await.unwrap_err();
    assert_eq!(dangling.code(), tonic::Code::InvalidArgument, "{dangling:?}");
}

async fn a_failed_step_made_good_by_a_recovery_retry_completes_the_execution(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![(
        "quote",
        Behavior::Sequence(vec![Answer::status(400, json!({"error": "feed glitch"})), Answer::ok(json!({"price": 1}))]),
    )])
    .await
    .unwrap();
    mesh.register(&agent.registration("stocks", &[("quote", None)])).await;
    let first = mesh.run(plan(vec![step("s1", "stocks", "quote", json!({}), &[])]), options(0, 5_000)).await.unwrap();
    assert_eq!(first.last().unwrap().kind, Kind::ExecutionFailed as i32, "{:?}", kinds(&first));
    let id = first[0].execution_id.clone();
    // The review's retry of s1 is a new step of the same capability.
    let more = extend(&mesh, &id, steps(vec![step("s2", "stocks", "quote", json!({}), &[])])).await.unwrap();
    event_for(&more, Kind::StepSucceeded, "s2");
    assert_eq!(more.last().unwrap().kind, Kind::ExecutionCompleted as i32, "{:?}", kinds(&more));
    assert_eq!(mesh.get(&id).await.status, pb::ExecutionStatus::Completed as i32);
}

agentmesh_testkit::both_backends!(
    a_failed_step_made_good_by_a_recovery_retry_completes_the_execution,
    a_finished_execution_runs_more_steps_in_the_same_log,
    only_finished_uncancelled_executions_are_extended,
);
