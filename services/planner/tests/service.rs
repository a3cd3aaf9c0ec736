//! The planner service over real sockets: real discovery, a scripted LLM
//! server, the interaction log, and Replan, on both store backends.

#![allow(clippy::unwrap_used)]

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_planner::PlannerConfig;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_testkit::{Backend, ScriptedLlmServer, ScriptedReply, TestDatabase, bind_local, spawn_discovery};
use serde_json::json;
use tonic::Code;

async fn register(url: &str, agent: serde_json::Value) {
    let r = agentmesh_testkit::http_client().post(format!("{url}/api/v1/agents")).json(&agent).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap_or_default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_over_discovery_without_the_caller_or_internal_capabilities_sqlite() {
    plans_over_discovery_without_the_caller_or_internal_capabilities(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_over_discovery_without_the_caller_or_internal_capabilities_postgres() {
    plans_over_discovery_without_the_caller_or_internal_capabilities(Backend::Postgres).await;
}

/// Discovery and the interaction log share the database under test.
async fn plans_over_discovery_without_the_caller_or_internal_capabilities(backend: Backend) {
    let Some(db) = TestDatabase::new(backend).await else { return };
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    register(
        &discovery.url(),
        json!({"id": "my-orchestrator", "base_url": "http://o:1", "skills": [
        {"id": "orchestrate_natural", "description": "Plans and runs natural-language requests",
         "input_schema": {"type": "object", "properties": {"request": {"type": "string"}}}}]}),
    )
    .await;
    register(
        &discovery.url(),
        json!({"id": "ops-agent", "base_url": "http://ops:1", "skills": [
        {"id": "admin_reset", "description": "Resets everything", "internal": true},
        {"id": "status", "description": "Reports service status"}]}),
    )
    .await;
    register(&discovery.url(), json!({"id": "weather-tool-v2", "base_url": "http://w:1", "skills": [
        {"id": "get_current_weather", "description": "Current weather for a location",
         "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]})).await;

    let plan = json!({"reasoning": "look it up", "steps": [{"step_id": "s1", "agent": "weather-tool-v2",
        "capability": "get_current_weather", "instruction": "Chicago weather", "parameters": {"location": "Chicago"}, "depends_on": []}]});
    let fill = json!({"reasoning": "fix", "steps": [
        {"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather", "instruction": "again",
         "parameters": {"location": "Boston"}, "depends_on": []},
        {"step_id": "s2", "agent": "weather-tool-v2", "capability": "get_current_weather",
         "instruction": "near {{s1.output}}", "parameters": {"location": "{{s1.output.nearest_city}}"}, "depends_on": ["s1"]}]});
    let llm = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content(&plan.to_string()),
        ScriptedReply::openai_content(&fill.to_string()),
    ])
    .await
    .unwrap();

    let (planner, mut client) = start_planner(PlannerConfig {
        discovery_url: discovery.url(),
        self_agent_ids: vec!["my-orchestrator".into()],
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted-model".into(),
            llm_base_url: Some(llm.url()),
            llm_structured: "json_schema".into(),
            ..PlannerConfig::default().llm
        },
        ..PlannerConfig::with_database_url(db.url.clone())
    })
    .await;

    let response = client
        .create_plan(pb::CreatePlanRequest {
            request_id: "req_weather".into(),
            query: "Weather in Chicago?".into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    let steps = response.plan.unwrap_or_default().steps;
    assert_eq!(steps.len(), 1);
    assert_eq!(agentmesh_planner::service::parameters_json(&steps[0]), json!({"location": "Chicago"}));
    let stats = response.stats.unwrap_or_default();
    assert_eq!((stats.catalog_size, stats.llm_calls, stats.structured_output_mode.as_str()), (2, 1, "json_schema"));

    // The model saw neither the caller itself nor the internal capability.
    let sent = &llm.requests()[0].body;
    let prompt = sent["messages"].to_string();
    assert!(!prompt.contains("orchestrate_natural") && !prompt.contains("admin_reset"), "{prompt}");
    let agents: Vec<String> = sent["response_format"]["json_schema"]["schema"]["$defs"]["step1"]["anyOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            format!(
                "{}:{}",
                b["properties"]["agent"]["const"].as_str().unwrap(),
                b["properties"]["capability"]["const"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(agents, ["ops-agent:status", "weather-tool-v2:get_current_weather"]);

    let interactions = client
        .list_interactions(pb::ListInteractionsRequest { request_id: "req_weather".into() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner()
        .interactions;
    assert_eq!(interactions.len(), 1);
    assert_eq!(interactions[0].kind, pb::LlmInteractionKind::Plan as i32);
    assert_eq!((interactions[0].prompt_tokens, interactions[0].structured_output_mode.as_str()), (12, "json_schema"));
    assert!(interactions[0].response.contains("get_current_weather"));

    // Replan: the caller itself and unknown agents are rejected with a reason.
    let replan = |agent: &str, capability: &str| pb::ReplanRequest {
        request_id: "req_weather".into(),
        plan: Some(pb::Plan { reasoning: String::new(), steps: steps.clone() }),
        results: vec![pb::StepResult {
            step_id: "s1".into(),
            status: pb::StepStatus::Succeeded as i32,
            ..Default::default()
        }],
        collaboration: Some(pb::CollaborationRequest {
            agent: agent.into(),
            capability: capability.into(),
            query: "Now Boston".into(),
        }),
        ..Default::default()
    };
    let own = client.replan(replan("my-orchestrator", "orchestrate_natural")).await.unwrap().into_inner();
    assert!(own.rejected && own.rejection_reason.contains("calling orchestrator itself"), "{}", own.rejection_reason);
    let internal = client.replan(replan("ops-agent", "admin_reset")).await.unwrap().into_inner();
    assert!(internal.rejected && internal.rejection_reason.contains("not available"), "{}", internal.rejection_reason);
    let filled = client
        .replan(replan("weather-tool-v2", "get_current_weather"))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    assert!(!filled.rejected);
    assert_eq!(filled.steps.len(), 2);
    assert_eq!(filled.steps[0].step_id, "s2", "fresh id after the existing plan's");
    assert_eq!(agentmesh_planner::service::parameters_json(&filled.steps[0]), json!({"location": "Boston"}));
    let second = &filled.steps[1];
    assert_eq!((second.step_id.as_str(), second.depends_on.as_slice()), ("s3", ["s2".to_owned()].as_slice()));
    assert_eq!(second.instruction, "near {{s2.output}}", "references follow the renamed ids");
    assert_eq!(agentmesh_planner::service::parameters_json(second), json!({"location": "{{s2.output.nearest_city}}"}));

    let empty = client.create_plan(pb::CreatePlanRequest { query: "  ".into(), ..Default::default() }).await;
    assert_eq!(empty.err().map(|s| s.code()), Some(Code::InvalidArgument));
    planner.abort();
}

/// A planner over `discovery` and `llm`, and a client once it answers.
async fn start_planner(
    config: PlannerConfig,
) -> (tokio::task::JoinHandle<anyhow::Result<()>>, PlannerServiceClient<tonic::transport::Channel>) {
    // Scripted answers: ranking by meaning (tests/semantic.rs) stays out.
    let config = PlannerConfig { embeddings: "none".into(), ..config };
    let listener = bind_local().await.unwrap();
    let addr = listener.local_addr().unwrap();
    let planner = tokio::spawn(agentmesh_planner::serve_with_listener(config, listener, std::future::pending()));
    loop {
        match PlannerServiceClient::connect(format!("http://{addr}")).await {
            Ok(c) => return (planner, c),
            Err(_) if !planner.is_finished() => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            Err(e) => panic!("planner did not start: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_agents_are_offered_and_inactive_ones_are_named_in_a_zero_step_reason() {
    let Some(db) = TestDatabase::new(Backend::Sqlite).await else { return };
    // Degraded after 3 missed intervals (1.5 s), inactive after 6 (3 s).
    let discovery = spawn_discovery(DiscoveryConfig {
        heartbeat_interval_secs: 0.5,
        ..DiscoveryConfig::with_database_url(db.url.clone())
    })
    .await
    .unwrap();
    register(
        &discovery.url(),
        json!({"id": "clock", "base_url": "http://c:1", "skills": [
        {"id": "now", "description": "The current time in a time zone"}]}),
    )
    .await;
    register(&discovery.url(), json!({"id": "weather-tool-v2", "base_url": "http://w:1", "skills": [
        {"id": "get_current_weather", "description": "Current weather for a location",
         "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]})).await;
    tokio::time::sleep(std::time::Duration::from_millis(3300)).await;
    // The weather agent is back, but says it is struggling; the clock is gone.
    let r = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents/weather-tool-v2/heartbeat", discovery.url()))
        .json(&json!({"status": "degraded"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap_or_default());

    let llm = ScriptedLlmServer::start(vec![ScriptedReply::openai_content(
        r#"{"reasoning": "no listed tool tells the time.", "steps": []}"#,
    )])
    .await
    .unwrap();
    let (planner, mut client) = start_planner(PlannerConfig {
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
    let response = client
        .create_plan(pb::CreatePlanRequest { query: "What time is it in Tokyo?".into(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    let offered = llm.requests()[0].body["response_format"]["json_schema"]["schema"]["$defs"]["step1"].to_string();
    assert!(offered.contains("weather-tool-v2"), "a degraded agent is offered: {offered}");
    assert!(!offered.contains("clock"), "an inactive agent is not: {offered}");
    assert_eq!(
        response.zero_step_reason,
        "no listed tool tells the time; 1 agent was left out as inactive (no recent heartbeat): clock; \
         set include_unhealthy (`agentmesh plan --include-unhealthy`) to plan over it"
    );
    planner.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_names_the_provider_that_answered_and_long_queries_are_refused() {
    let Some(db) = TestDatabase::new(Backend::Sqlite).await else { return };
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    register(&discovery.url(), json!({"id": "weather-tool-v2", "base_url": "http://w:1", "skills": [
        {"id": "get_current_weather", "description": "Current weather for a location",
         "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]})).await;
    let plan = json!({"reasoning": "look it up", "steps": [{"step_id": "s1", "agent": "weather-tool-v2",
        "capability": "get_current_weather", "instruction": "Chicago weather", "parameters": {"location": "Chicago"}, "depends_on": []}]});
    // Anthropic is overloaded; the OpenAI-compatible server behind it answers.
    let llm = ScriptedLlmServer::start(vec![
        ScriptedReply::error(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
        ScriptedReply::openai_content(&plan.to_string()),
    ])
    .await
    .unwrap();
    let (planner, mut client) = start_planner(PlannerConfig {
        discovery_url: discovery.url(),
        max_query_chars: 100,
        llm: agentmesh_planner::LlmSettings {
            llm: "anthropic:sonnet,openai:scripted-model".into(),
            llm_base_url: Some(llm.url()),
            llm_structured: "json_schema".into(),
            llm_retries: 0,
            ..PlannerConfig::default().llm
        },
        ..PlannerConfig::with_database_url(db.url.clone())
    })
    .await;
    let response = client
        .create_plan(pb::CreatePlanRequest {
            request_id: "req_chain".into(),
            query: "Weather in Chicago?".into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    let stats = response.stats.unwrap_or_default();
    assert_eq!((stats.provider.as_str(), stats.model.as_str()), ("openai", "scripted-model"));
    let interactions = client
        .list_interactions(pb::ListInteractionsRequest { request_id: "req_chain".into() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner()
        .interactions;
    let answered: Vec<(&str, &str)> = interactions.iter().map(|i| (i.provider.as_str(), i.model.as_str())).collect();
    assert_eq!(answered, [("openai", "scripted-model")]);

    let long = client.create_plan(pb::CreatePlanRequest { query: "x".repeat(101), ..Default::default() }).await;
    let status = long.err().unwrap_or_else(|| panic!("a 101-character query was planned"));
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("max_query_chars"), "{}", status.message());
    planner.abort();
}
