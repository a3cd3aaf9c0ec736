//! The planning loop against a scripted LLM server speaking the OpenAI wire
//! format: the seed failure cases, recovery, and what each retry sends.

use std::time::Duration;

use agentmesh_core::CapabilityKind;
use agentmesh_core::plan::AllowedCapability;
use agentmesh_llm::openai::{OpenAiCompatible, OpenAiConfig};
use agentmesh_llm::{RetryPolicy, StructuredMode, StructuredSetting};
use agentmesh_planner::{InteractionKind, Planner, PlannerSettings, PlanningError};
use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply};
use serde_json::{Value, json};

fn cap(agent: &str, capability: &str, description: &str, schema: Value) -> AllowedCapability {
    AllowedCapability {
        agent: agent.into(),
        capability: capability.into(),
        kind: CapabilityKind::Skill,
        description: description.into(),
        input_schema: Some(schema),
    }
}

fn weather() -> AllowedCapability {
    cap(
        "weather-tool-v2",
        "get_current_weather",
        "Current weather for a location",
        json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"], "additionalProperties": false}),
    )
}

fn calculator() -> AllowedCapability {
    cap(
        "calculation-agent",
        "evaluate",
        "Evaluates arithmetic calculation expressions",
        json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
    )
}

/// 26 capabilities: enough for pre-selection to run.
fn big_catalog() -> Vec<AllowedCapability> {
    let mut catalog = vec![weather(), calculator()];
    for i in 0..24 {
        catalog.push(cap(
            &format!("filler-{i:02}"),
            "do_thing",
            &format!("Unrelated tool number {i}"),
            json!({"type": "object"}),
        ));
    }
    catalog
}

fn llm(server: &ScriptedLlmServer) -> OpenAiCompatible {
    let mut config = OpenAiConfig::new(server.url(), "scripted");
    config.structured = StructuredSetting::Fixed(StructuredMode::JsonSchema);
    config.http.retry =
        RetryPolicy { max_retries: 1, base_delay: Duration::from_millis(1), max_delay: Duration::from_millis(5) };
    OpenAiCompatible::new(config).unwrap_or_else(|e| panic!("{e}"))
}

fn plan_with(agent: &str, capability: &str, parameters: Value) -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": agent, "capability": capability,
            "instruction": "do it", "parameters": parameters, "depends_on": []}]})
        .to_string(),
    )
}

fn user_message(body: &Value) -> String {
    body["messages"][1]["content"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn an_invented_time_tool_is_caught_and_the_retry_ends_in_a_zero_step_plan() {
    let server = ScriptedLlmServer::start(vec![
        plan_with("time-tool-v1", "get_time", json!({"timezone": "UTC"})),
        ScriptedReply::openai_content(r#"{"reasoning": "no listed tool tells the time", "steps": []}"#),
    ])
    .await
    .unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "What time is it?", &[weather()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(outcome.plan.steps.is_empty());
    assert_eq!(outcome.plan.reasoning, "no listed tool tells the time");
    assert_eq!(outcome.stats.hallucinations_detected, 1);
    let kinds: Vec<InteractionKind> = outcome.interactions.iter().map(|i| i.kind).collect();
    assert_eq!(kinds, [InteractionKind::Plan, InteractionKind::HallucinationRetry]);
    let requests = server.requests();
    let retry = user_message(&requests[1].body);
    assert!(
        retry.starts_with("Your previous answer was rejected:\n- step s1: agent `time-tool-v1` is not available"),
        "{retry}"
    );
    assert!(requests[1].body["temperature"].as_f64() <= requests[0].body["temperature"].as_f64(), "never warmer");
    // The schema sent only admits the weather tool.
    let branches = &requests[0].body["response_format"]["json_schema"]["schema"]["$defs"]["step1"]["anyOf"];
    assert_eq!(branches.as_array().map(Vec::len), Some(1));
    assert_eq!(branches[0]["properties"]["agent"]["const"], "weather-tool-v2");
}

#[tokio::test]
async fn a_model_that_keeps_inventing_gets_an_actionable_error() {
    let server = ScriptedLlmServer::start(vec![
        plan_with("time-tool-v1", "get_time", json!({})),
        plan_with("time-tool-v1", "get_time", json!({})),
    ])
    .await
    .unwrap();
    let err = Planner::new(PlannerSettings::default()).plan(&llm(&server), "What time is it?", &[weather()]).await;
    let err = err.err().unwrap_or_else(|| panic!("planned"));
    assert!(matches!(err, PlanningError::Hallucination { .. }));
    let message = err.to_string();
    assert!(
        message.contains("agent `time-tool-v1`") && message.contains("weather-tool-v2:get_current_weather"),
        "{message}"
    );
}

#[tokio::test]
async fn the_retry_pre_selection_finds_the_calculation_capability() {
    let server = ScriptedLlmServer::start(vec![
        // Pre-selection picks the wrong tool and invents one (dropped).
        ScriptedReply::openai_content(r#"{"selected": ["weather-tool-v2/get_current_weather", "made-up/tool"]}"#),
        // The model plans with an agent it was not shown.
        plan_with("calculation-agent", "calculate", json!({"expression": "2+2"})),
        // Pre-selection again, with the hint of what the model tried.
        ScriptedReply::openai_content(r#"{"selected": ["calculation-agent/evaluate"]}"#),
        plan_with("calculation-agent", "evaluate", json!({"expression": "2+2"})),
    ])
    .await
    .unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "What is 2+2?", &big_catalog())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.plan.steps[0].agent, "calculation-agent");
    assert_eq!(outcome.plan.steps[0].capability, "evaluate");
    assert_eq!((outcome.stats.hallucinations_detected, outcome.stats.hallucinations_recovered), (1, 1));
    assert_eq!(outcome.stats.catalog_size, 26);
    let kinds: Vec<InteractionKind> = outcome.interactions.iter().map(|i| i.kind).collect();
    assert_eq!(
        kinds,
        [
            InteractionKind::Preselection,
            InteractionKind::Plan,
            InteractionKind::Preselection,
            InteractionKind::HallucinationRetry
        ]
    );
    let requests = server.requests();
    assert!(user_message(&requests[2].body).contains("calculation-agent calculate"), "the hint carries what was tried");
    let offered = user_message(&requests[3].body);
    assert!(offered.contains("capability: evaluate") && !offered.contains("get_current_weather"), "{offered}");
}

#[tokio::test]
async fn an_empty_pre_selection_is_a_zero_step_plan_without_a_planning_call() {
    let server = ScriptedLlmServer::start(vec![ScriptedReply::openai_content(r#"{"selected": []}"#)]).await.unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "Book me a flight", &big_catalog())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(outcome.plan.steps.is_empty());
    assert!(!outcome.plan.reasoning.is_empty());
    assert_eq!(outcome.stats.preselected, Some(0));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_failed_pre_selection_falls_back_to_the_catalog_with_a_count() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content("The weather tool, I think."),
        plan_with("weather-tool-v2", "get_current_weather", json!({"location": "Chicago"})),
    ])
    .await
    .unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "Weather in Chicago?", &big_catalog())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.stats.preselection_fallbacks, 1);
    assert_eq!(outcome.stats.preselected, Some(26));
    assert_eq!(outcome.plan.steps[0].parameters, json!({"location": "Chicago"}));
}

#[tokio::test]
async fn wrong_parameters_are_fed_back_exactly_and_prose_is_retried() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content("The weather in Chicago is sunny and 22 degrees."),
        plan_with("weather-tool-v2", "get_current_weather", json!({"expression": "Chicago"})),
        ScriptedReply::openai_content(&format!(
            "```json\n{}\n```",
            json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather",
                "instruction": "i", "parameters": {"location": "Chicago"}, "depends_on": []}]})
        )),
    ])
    .await
    .unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "Weather in Chicago?", &[weather(), calculator()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.plan.steps.len(), 1);
    assert_eq!(outcome.stats.retries, 2);
    let requests = server.requests();
    assert!(user_message(&requests[1].body).contains("no JSON object"), "parse error fed back");
    let feedback = user_message(&requests[2].body);
    assert!(
        feedback.contains("step s1: parameters do not match the input schema") && feedback.contains("location"),
        "{feedback}"
    );
}

#[tokio::test]
async fn a_self_dependency_is_rejected_and_exhaustion_is_reported() {
    let looped = json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather",
        "instruction": "i", "parameters": {"location": "Chicago"}, "depends_on": ["s1"]}]})
    .to_string();
    let server = ScriptedLlmServer::start(vec![ScriptedReply::openai_content(&looped); 3]).await.unwrap();
    let err = Planner::new(PlannerSettings::default()).plan(&llm(&server), "Weather?", &[weather()]).await;
    match err {
        Err(PlanningError::Exhausted { attempts, problems, .. }) => {
            assert_eq!(attempts, 3);
            assert!(problems.contains("depends on itself"), "{problems}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_zero_step_plan_always_comes_with_a_reason() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content(r#"{"steps": []}"#),
        ScriptedReply::openai_content(r#"{"reasoning": "", "steps": []}"#),
        ScriptedReply::openai_content(r#"{"steps": []}"#),
    ])
    .await
    .unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "What time is it?", &[weather()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(outcome.plan.steps.is_empty());
    assert!(!outcome.plan.reasoning.is_empty(), "a reason is always given");
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "asked for a reason while retries lasted");
    assert!(user_message(&requests[1].body).contains("must say in `reasoning` why"));
}

#[tokio::test]
async fn an_auth_failure_in_pre_selection_is_reported_not_planned_around() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::error(401, json!({"error": {"message": "invalid api key"}})),
        plan_with("weather-tool-v2", "get_current_weather", json!({"location": "Chicago"})),
    ])
    .await
    .unwrap();
    let result =
        Planner::new(PlannerSettings::default()).plan(&llm(&server), "Weather in Chicago?", &big_catalog()).await;
    match result {
        Err(PlanningError::Llm { error, interactions, .. }) => {
            assert!(error.to_string().contains("credentials"), "{error}");
            assert_eq!(interactions.len(), 1, "the refused call is kept for the log");
            assert!(interactions[0].error.as_deref().is_some_and(|e| e.contains("credentials")), "{interactions:?}");
        }
        other => panic!("an auth failure was planned around: {other:?}"),
    }
    assert_eq!(server.requests().len(), 1, "no planning call after the credentials were refused");
}

#[tokio::test]
async fn pre_selection_offers_the_lexically_best_candidates_first_and_bounds_the_choice() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content(r#"{"selected": ["calculation-agent/evaluate"]}"#),
        plan_with("calculation-agent", "evaluate", json!({"expression": "17*23"})),
    ])
    .await
    .unwrap();
    let settings = PlannerSettings { preselect_max: 3, ..PlannerSettings::default() };
    Planner::new(settings)
        .plan(&llm(&server), "Calculate 17 * 23", &big_catalog())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let body = &server.requests()[0].body;
    let selected = &body["response_format"]["json_schema"]["schema"]["properties"]["selected"];
    assert_eq!(selected["maxItems"], 3);
    assert_eq!(selected["items"]["enum"][0], "calculation-agent/evaluate", "the best lexical match comes first");
    let tools = user_message(body);
    assert!(tools.find("calculation-agent/evaluate") < tools.find("weather-tool-v2"), "{tools}");
}

fn cut_off(text: &str) -> ScriptedReply {
    ScriptedReply::ok(json!({
        "id": "c", "object": "chat.completion", "model": "scripted",
        "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 300}
    }))
}

#[tokio::test]
async fn an_answer_cut_off_at_the_token_limit_is_asked_again_shorter() {
    let server = ScriptedLlmServer::start(vec![
        cut_off(r#"{"reasoning": "first the weather, then", "steps": [{"step_id": "s1", "agent": "weather-to"#),
        plan_with("weather-tool-v2", "get_current_weather", json!({"location": "Chicago"})),
    ])
    .await
    .unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "Weather in Chicago?", &[weather(), calculator()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.plan.steps.len(), 1);
    assert_eq!(outcome.stats.truncated_answers, 1);
    let requests = server.requests();
    let (first, second) = (&requests[0].body, &requests[1].body);
    assert!(second["max_tokens"].as_u64() < first["max_tokens"].as_u64(), "the retry's bound is tighter");
    let tuples = |body: &Value| {
        body["response_format"]["json_schema"]["schema"]["properties"]["steps"]["anyOf"].as_array().map(Vec::len)
    };
    assert!(tuples(second) < tuples(first), "and so is the schema's");
    let feedback = user_message(second);
    assert!(feedback.contains("cut off") && !feedback.contains("no JSON object"), "{feedback}");
}

#[tokio::test]
async fn answers_that_keep_being_cut_off_end_in_an_error_that_says_so() {
    let server = ScriptedLlmServer::start(vec![cut_off(r#"{"reasoning": "#); 3]).await.unwrap();
    let err = Planner::new(PlannerSettings::default()).plan(&llm(&server), "Weather?", &[weather()]).await;
    match err {
        Err(PlanningError::Exhausted { problems, stats, .. }) => {
            assert!(problems.contains("cut off at the token limit"), "{problems}");
            assert_eq!(stats.truncated_answers, 3);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_planning_schema_fixes_ids_and_earlier_dependencies_and_sizes_the_token_budget() {
    let server = ScriptedLlmServer::start(vec![plan_with(
        "weather-tool-v2",
        "get_current_weather",
        json!({"location": "Chicago"}),
    )])
    .await
    .unwrap();
    Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "Weather in Chicago?", &[weather(), calculator()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let body = &server.requests()[0].body;
    let schema = &body["response_format"]["json_schema"]["schema"];
    let second = &schema["$defs"]["step2"]["anyOf"][0]["properties"];
    assert_eq!(second["step_id"]["const"], "s2");
    assert_eq!(second["depends_on"]["items"]["enum"], json!(["s1"]));
    let max_tokens = body["max_tokens"].as_u64().unwrap_or_default();
    assert!(max_tokens > 300 && max_tokens <= 2048, "{max_tokens}");
}

#[tokio::test]
async fn a_malformed_reference_is_fed_back_to_the_model() {
    let two = |expression: &str| {
        ScriptedReply::openai_content(
            &json!({"reasoning": "r", "steps": [
                {"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather", "instruction": "i",
                 "parameters": {"location": "Chicago"}, "depends_on": []},
                {"step_id": "s2", "agent": "calculation-agent", "capability": "evaluate", "instruction": "i",
                 "parameters": {"expression": expression}, "depends_on": ["s1"]}]})
            .to_string(),
        )
    };
    let server =
        ScriptedLlmServer::start(vec![two("{{s1.outputs.temp}} * 9 / 5 + 32"), two("{{s1.output.temp}} * 9 / 5 + 32")])
            .await
            .unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "Chicago's temperature in Fahrenheit?", &[weather(), calculator()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.plan.steps[1].parameters, json!({"expression": "{{s1.output.temp}} * 9 / 5 + 32"}));
    let feedback = user_message(&server.requests()[1].body);
    assert!(feedback.contains("`{{s1.outputs.temp}}` is not a reference"), "{feedback}");
}

#[tokio::test]
async fn further_picks_must_share_a_word_with_the_request_unless_it_joins_several_asks() {
    let picks = r#"{"selected": ["calculation-agent/evaluate", "weather-tool-v2/get_current_weather"]}"#;
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content(picks),
        plan_with("calculation-agent", "evaluate", json!({"expression": "17*23"})),
        ScriptedReply::openai_content(picks),
        plan_with("calculation-agent", "evaluate", json!({"expression": "100*3"})),
    ])
    .await
    .unwrap();
    let planner = Planner::new(PlannerSettings::default());
    for query in ["Calculate 17 * 23", "What is the weather in Chicago and what is 100 * 3?"] {
        planner.plan(&llm(&server), query, &big_catalog()).await.unwrap_or_else(|e| panic!("{e}"));
    }
    let requests = server.requests();
    let offered = |body: &Value| {
        body["response_format"]["json_schema"]["schema"]["$defs"]["step1"]["anyOf"]
            .as_array()
            .map(|branches| branches.iter().map(|b| b["properties"]["agent"]["const"].to_string()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(offered(&requests[1].body), ["\"calculation-agent\""], "the weather pick shares no word");
    assert_eq!(
        offered(&requests[3].body),
        ["\"calculation-agent\"", "\"weather-tool-v2\""],
        "a request joining two asks keeps both, in the model's order"
    );
    assert!(user_message(&requests[3].body).contains("The likeliest fit is calculation-agent/evaluate."));
}

#[tokio::test]
async fn a_call_the_model_repeats_is_made_once() {
    // "What is the weather in Paris?" planned the same lookup twice.
    let twice = json!({"reasoning": "r", "steps": [
        {"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather",
         "instruction": "weather in Paris", "parameters": {"location": "Paris"}, "depends_on": []},
        {"step_id": "s2", "agent": "weather-tool-v2", "capability": "get_current_weather",
         "instruction": "weather in Paris again", "parameters": {"location": "Paris"}, "depends_on": []},
        {"step_id": "s3", "agent": "weather-tool-v2", "capability": "get_current_weather",
         "instruction": "weather in Lyon", "parameters": {"location": "Lyon"}, "depends_on": []}]});
    let server = ScriptedLlmServer::start(vec![ScriptedReply::openai_content(&twice.to_string())]).await.unwrap();
    let outcome = Planner::new(PlannerSettings::default())
        .plan(&llm(&server), "What is the weather in Paris and in Lyon?", &[weather()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let steps: Vec<(&str, &Value)> = outcome.plan.steps.iter().map(|s| (s.step_id.as_str(), &s.parameters)).collect();
    assert_eq!(steps, [("s1", &json!({"location": "Paris"})), ("s3", &json!({"location": "Lyon"}))]);
    assert_eq!(outcome.stats.repeated_steps_merged, 1);
    assert_eq!(server.requests().len(), 1, "merged, not asked again");
}
