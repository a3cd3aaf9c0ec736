//! Loop-back through a real planner: an agent's collaboration request
//! becomes a `Replan` (the planner asks a scripted LLM for the parameters),
//! the new steps are appended and run; the budget and repeat detection
//! bound it, and a refusal never fails the step that asked.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use agentmesh_planner::PlannerConfig;
use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent, ScriptedLlmServer, ScriptedReply, bind_local};
use common::{Mesh, assert_complete_log, event_for, kinds, of_kind, plan, request, step};
use pb::ExecutionEventKind as Kind;
use serde_json::{Value, json};

fn fix_plan() -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"reasoning": "fix it", "steps": [{"step_id": "s1", "agent": "fixer", "capability": "fix",
            "instruction": "Fix SQL injection in auth.py:45", "parameters": {"file": "auth.py"}, "depends_on": []}]})
        .to_string(),
    )
}

fn asks(query: &str) -> Answer {
    Answer::ok(json!({"output": {"verdict": "bug found"},
        "collaborate": {"agent": "fixer", "capability": "fix", "query": query}}))
}

/// The mesh with a planner whose LLM answers from `replies`, and the two agents.
async fn setup(
    backend: Backend,
    replies: Vec<ScriptedReply>,
    reviews: Vec<Answer>,
) -> Option<(Mesh, FakeAgent, ScriptedLlmServer)> {
    setup_with(backend, replies, reviews, |_| {}).await
}

/// [`setup`], the executor's configuration adjusted first.
async fn setup_with(
    backend: Backend,
    replies: Vec<ScriptedReply>,
    reviews: Vec<Answer>,
    adjust: impl FnOnce(&mut agentmesh_executor::ExecutorConfig),
) -> Option<(Mesh, FakeAgent, ScriptedLlmServer)> {
    let llm = ScriptedLlmServer::start(replies).await.unwrap();
    let planner_listener = bind_local().await.unwrap();
    let planner_url = format!("http://{}", planner_listener.local_addr().unwrap());
    let mesh = Mesh::start_with(backend, |c| {
        c.planner_url = Some(planner_url);
        adjust(c);
    })
    .await?;
    let planner_db = agentmesh_testkit::TestDatabase::sqlite();
    let config = PlannerConfig {
        discovery_url: mesh.discovery.url(),
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted-model".into(),
            llm_base_url: Some(llm.url()),
            llm_structured: "json_schema".into(),
            ..PlannerConfig::default().llm
        },
        embeddings: "none".into(),
        ..PlannerConfig::with_database_url(planner_db.url.clone())
    };
    tokio::spawn(async move {
        let _planner_db = planner_db;
        agentmesh_planner::serve_with_listener(config, planner_listener, std::future::pending()).await
    });
    let agent = FakeAgent::start(vec![
        ("review", Behavior::Sequence(reviews)),
        ("fix", Behavior::Always(Answer::ok(json!({"fixed": true})))),
    ])
    .await
    .unwrap();
    mesh.register(
        &json!({"id": "reviewer", "base_url": agent.url(), "skills": [{"id": "review", "description": "Review code"}]}),
    )
    .await;
    mesh.register(&json!({"id": "fixer", "base_url": agent.url(), "skills": [{"id": "fix", "description": "Fix code",
        "input_schema": {"type": "object", "properties": {"file": {"type": "string"}}, "required": ["file"]}}]}))
        .await;
    Some((mesh, agent, llm))
}

fn with_budget(p: Value, budget: u32) -> pb::ExecuteRequest {
    let mut req = request(p, pb::ExecutionOptions { replan_budget: Some(budget), ..Default::default() });
    req.query = "Review auth.py".into();
    req.caller_agent_ids = vec!["orchestrator".into()];
    req
}

async fn a_collaboration_request_extends_the_plan_and_runs(backend: Backend) {
    let Some((mesh, agent, llm)) =
        setup(backend, vec![fix_plan()], vec![asks("Fix SQL injection in auth.py:45")]).await
    else {
        return;
    };
    let events =
        mesh.run_request(with_budget(plan(vec![step("s1", "reviewer", "review", json!({}), &[])]), 3)).await.unwrap();
    assert_complete_log(&events);
    assert_eq!(
        kinds(&events),
        [
            "EXECUTION_STARTED",
            "STEP_STARTED s1",
            "STEP_SUCCEEDED s1",
            "PLAN_EXTENDED s1",
            "STEP_STARTED s2",
            "STEP_SUCCEEDED s2",
            "EXECUTION_COMPLETED"
        ]
    );
    let extended = event_for(&events, Kind::PlanExtended, "s1");
    assert_eq!(extended.added_steps.len(), 1);
    assert_eq!((extended.added_steps[0].step_id.as_str(), extended.added_steps[0].agent.as_str()), ("s2", "fixer"));
    assert_eq!(extended.collaborate.as_ref().unwrap().query, "Fix SQL injection in auth.py:45");
    let fixes = agent.calls_to("fix");
    assert_eq!(fixes.len(), 1);
    assert_eq!(fixes[0].body, json!({"file": "auth.py"}));
    // The planner saw the collaboration's query and only the fixer.
    let asked = llm.requests();
    assert_eq!(asked.len(), 1);
    let prompt = asked[0].body.to_string();
    assert!(prompt.contains("Fix SQL injection in auth.py:45") && prompt.contains("fixer"), "{prompt}");
    assert!(!prompt.contains("reviewer"), "the replan offers only the suggested agent: {prompt}");
    let execution = mesh.get(&events[0].execution_id).await;
    assert_eq!((execution.replans_used, execution.step_results.len()), (1, 2));
}

async fn repeats_and_an_exhausted_budget_are_rejected_without_failing_the_step(backend: Backend) {
    let same = "Fix SQL injection in auth.py:45";
    let Some((mesh, agent, llm)) =
        setup(backend, vec![fix_plan()], vec![asks(same), asks(same), asks("Now fix login.py")]).await
    else {
        return;
    };
    let p = plan(vec![
        step("r1", "reviewer", "review", json!({}), &[]),
        step("r2", "reviewer", "review", json!({}), &["r1"]),
        step("r3", "reviewer", "review", json!({}), &["r2"]),
    ]);
    let events = mesh.run_request(with_budget(p, 2)).await.unwrap();
    assert_complete_log(&events);
    let rejections = of_kind(&events, Kind::ReplanRejected);
    assert_eq!(rejections.len(), 2, "{:?}", kinds(&events));
    let repeat = rejections.iter().find(|e| e.step_id == "r2").unwrap();
    assert!(repeat.error.contains("was already asked for in this execution"), "{}", repeat.error);
    let budget = rejections.iter().find(|e| e.step_id == "r3").unwrap();
    assert_eq!(budget.error, "the replan budget of 2 is used up");
    assert_eq!(events.last().unwrap().kind, Kind::ExecutionCompleted as i32, "rejections do not fail anything");
    assert_eq!(agent.calls_to("fix").len(), 1);
    assert_eq!(llm.requests().len(), 1, "neither rejection asked the planner");
}

async fn what_the_planner_refuses_is_rejected_with_its_reason(backend: Backend) {
    let ghost =
        Answer::ok(json!({"output": {}, "collaborate": {"agent": "ghost", "capability": "x", "query": "haunt"}}));
    let caller = Answer::ok(
        json!({"output": {}, "collaborate": {"agent": "orchestrator", "capability": "run", "query": "again"}}),
    );
    let Some((mesh, _agent, llm)) = setup(backend, vec![], vec![ghost, caller]).await else { return };
    let p = plan(vec![
        step("r1", "reviewer", "review", json!({}), &[]),
        step("r2", "reviewer", "review", json!({}), &["r1"]),
    ]);
    let events = mesh.run_request(with_budget(p, 5)).await.unwrap();
    let error = |s: &str| event_for(&events, Kind::ReplanRejected, s).error.clone();
    assert!(error("r1").starts_with("the planner rejected it: `ghost:x` is not available"), "{}", error("r1"));
    assert!(error("r2").contains("the calling orchestrator itself"), "{}", error("r2"));
    assert_eq!(events.last().unwrap().kind, Kind::ExecutionCompleted as i32);
    assert!(llm.requests().is_empty());
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// A review's recovery actions extend a finished execution through the
/// same loop-back path: each collaboration becomes steps by `Replan`, those
/// refused are left out, and when nothing is left the call says so.
async fn collaborations_extend_a_finished_execution_through_the_planner(backend: Backend) {
    let plain = Answer::ok(json!({"verdict": "bug found"}));
    let Some((mesh, agent, llm)) = setup(backend, vec![fix_plan()], vec![plain]).await else { return };
    let events =
        mesh.run_request(with_budget(plan(vec![step("s1", "reviewer", "review", json!({}), &[])]), 0)).await.unwrap();
    let id = events[0].execution_id.clone();
    let collaboration = |agent: &str, capability: &str, query: &str| pb::CollaborationRequest {
        agent: agent.into(),
        capability: capability.into(),
        query: query.into(),
    };
    let mut client = mesh.client.clone();
    let extend = |collaborations: Vec<pb::CollaborationRequest>| pb::ExtendExecutionRequest {
        execution_id: id.clone(),
        collaborations,
        reason: "review recovery round 1".into(),
        model: "scripted-model".into(),
        ..Default::default()
    };
    let mut stream = client
        .extend_execution(extend(vec![
            collaboration("ghost", "x", "haunt"),
            collaboration("fixer", "fix", "Fix SQL injection in auth.py:45"),
        ]))
        .await
        .unwrap()
        .into_inner();
    let mut more = Vec::new();
    while let Some(item) = tokio_stream::StreamExt::next(&mut stream).await {
        more.push(item.unwrap().event.unwrap());
    }
    assert_eq!(kinds(&more), ["EXECUTION_EXTENDED", "STEP_STARTED s2", "STEP_SUCCEEDED s2", "EXECUTION_COMPLETED"]);
    assert_eq!(more[0].added_steps.iter().map(|s| s.agent.as_str()).collect::<Vec<_>>(), ["fixer"]);
    assert_eq!(agent.calls_to("fix").len(), 1);
    let asked = llm.requests();
    assert_eq!(asked.len(), 1, "the refused collaboration never reached the model");
    assert_eq!(asked[0].body["model"], "scripted-model");

    // Planning takes as long as the model: the stream opens at once and ends with the refusal.
    let mut stream =
        client.extend_execution(extend(vec![collaboration("ghost", "x", "haunt")])).await.unwrap().into_inner();
    let refused = stream.message().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    let reason = tonic_types::StatusExt::get_details_error_info(&refused).map(|i| i.reason);
    assert_eq!(reason.as_deref(), Some("NOTHING_TO_RUN"), "{}", refused.message());
    assert!(refused.message().contains("ghost:x"), "{}", refused.message());
}

async fn an_extension_past_max_steps_per_plan_is_rejected(backend: Backend) {
    let Some((mesh, agent, _llm)) =
        setup_with(backend, vec![fix_plan()], vec![asks("Fix SQL injection in auth.py:45")], |c| {
            c.max_steps_per_plan = 1;
        })
        .await
    else {
        return;
    };
    let events =
        mesh.run_request(with_budget(plan(vec![step("s1", "reviewer", "review", json!({}), &[])]), 3)).await.unwrap();
    assert_complete_log(&events);
    let rejected = event_for(&events, Kind::ReplanRejected, "s1");
    assert!(
        rejected.error.contains("would have 2 steps; this executor accepts at most 1 (max_steps_per_plan)"),
        "{}",
        rejected.error
    );
    assert_eq!(events.last().unwrap().kind, Kind::ExecutionCompleted as i32);
    assert!(agent.calls_to("fix").is_empty());
}

async fn a_replan_budget_past_the_ceiling_is_refused(backend: Backend) {
    let Some((mesh, _agent, _llm)) = setup(backend, vec![], vec![]).await else { return };
    let refused = mesh
        .run_request(with_budget(plan(vec![step("s1", "reviewer", "review", json!({}), &[])]), 11))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("options.replan_budget: at most 10"), "{}", refused.message());
}

agentmesh_testkit::both_backends!(
    an_extension_past_max_steps_per_plan_is_rejected,
    a_replan_budget_past_the_ceiling_is_refused,
    collaborations_extend_a_finished_execution_through_the_planner,
    a_collaboration_request_extends_the_plan_and_runs,
    repeats_and_an_exhausted_budget_are_rejected_without_failing_the_step,
    what_the_planner_refuses_is_rejected_with_its_reason,
);
