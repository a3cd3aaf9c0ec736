//! Semantic pre-selection with all-MiniLM-L6-v2 on its real weights: a
//! request nothing relevant serves gets a zero-step plan without a model
//! call; a paraphrase is offered its capability first; the catalog's
//! vectors follow a real discovery's watch stream.
//!
//! Needs the model's files (`AGENTMESH_EMBEDDINGS_DIR` or the default
//! directory; `.ci/run` provides them). Under `CI=true` their absence fails
//! these tests; elsewhere they are reported and skipped.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::plan::AllowedCapability;
use agentmesh_discovery::DiscoveryConfig;
use agentmesh_llm::embeddings::Embedder;
use agentmesh_llm::openai::{OpenAiCompatible, OpenAiConfig};
use agentmesh_llm::{RetryPolicy, StructuredMode, StructuredSetting};
use agentmesh_planner::semantic::Semantic;
use agentmesh_planner::{Planner, PlannerSettings};
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply, TestDatabase, spawn_discovery};
use serde_json::{Value, json};

fn model(test: &str) -> Option<Arc<dyn Embedder>> {
    agentmesh_testkit::llama::minilm(test).map(|m| Arc::new(m) as Arc<dyn Embedder>)
}

fn cap(agent: &str, capability: &str, description: &str) -> AllowedCapability {
    let schema = json!({"type": "object", "properties": {"value": {"type": "string"}}});
    AllowedCapability { input_schema: Some(schema), ..AllowedCapability::skill(agent, capability, description) }
}

/// 24 capabilities, some near neighbours: pre-selection runs above 20.
fn catalog() -> Vec<AllowedCapability> {
    let mut c = vec![
        cap("units", "convert_temperature", "Converts a temperature between Celsius and Fahrenheit"),
        cap("units", "convert_length", "Converts a length between metric and imperial units"),
        cap("money", "convert_currency", "Converts an amount of money between currencies"),
        cap("dictionary", "define", "Defines an English word"),
        cap("weather-tool-v2", "get_current_weather", "Current weather for a location"),
    ];
    let others = [
        ("flights", "search_flights", "Searches flights to a city"),
        ("hotels", "search_hotels", "Searches hotels in a city"),
        ("music", "lyrics", "Finds the lyrics of a song"),
        ("sports", "scores", "Latest scores of a team"),
        ("notes", "save_note", "Saves a note"),
        ("todo", "add_task", "Adds a task to a todo list"),
        ("shipping", "track_parcel", "Tracks a parcel by number"),
        ("movies", "showtimes", "Movie showtimes in a city"),
        ("traffic", "traffic_report", "Traffic report for a road"),
        ("jokes", "tell_joke", "Tells a joke about a subject"),
        ("astronomy", "moon_phase", "Moon phase on a date"),
        ("health", "bmi", "Body mass index from weight and height"),
        ("wiki", "summary", "Summary of an encyclopedia article"),
        ("timer", "start_timer", "Starts a countdown timer"),
        ("quotes", "famous_quote", "A famous quote about a topic"),
        ("news-agent", "headlines", "Latest news headlines about a topic"),
        ("stock-service", "get_quote", "Latest stock price for a ticker symbol"),
        ("maps", "route", "Driving route between two places"),
        ("recipes", "find_recipe", "Finds a recipe with an ingredient"),
    ];
    c.extend(others.iter().map(|(a, k, d)| cap(a, k, d)));
    c
}

fn llm(server: &ScriptedLlmServer) -> OpenAiCompatible {
    let mut config = OpenAiConfig::new(server.url(), "scripted");
    config.structured = StructuredSetting::Fixed(StructuredMode::JsonSchema);
    config.http.retry =
        RetryPolicy { max_retries: 1, base_delay: Duration::from_millis(1), max_delay: Duration::from_millis(5) };
    OpenAiCompatible::new(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_nothing_relevant_serves_is_a_zero_step_plan_without_asking_the_model() {
    let Some(embedder) = model("the nothing-fits test") else { return };
    let server = ScriptedLlmServer::start(Vec::new()).await.unwrap();
    let planner = Planner::new(PlannerSettings::default()).with_semantic(Arc::new(Semantic::new(embedder)));
    for query in ["Order a pizza for me", "Repair my bicycle"] {
        // Small catalogs too: the gate does not wait for pre-selection.
        for catalog in [catalog(), catalog()[..5].to_vec()] {
            let outcome = planner.plan(&llm(&server), query, &catalog).await.unwrap();
            assert!(outcome.plan.steps.is_empty(), "{query}: {:?}", outcome.plan);
            let reason = &outcome.plan.reasoning;
            assert!(reason.contains("none of the available capabilities is relevant"), "{reason}");
            assert!(reason.contains("min_relevance of 0.22"), "{reason}");
            assert_eq!(outcome.stats.llm_calls, 0);
        }
    }
    assert!(server.requests().is_empty(), "the model was asked");
    // Turned off (0), the model decides.
    let server = ScriptedLlmServer::start(vec![ScriptedReply::openai_content(
        &json!({"reasoning": "nothing listed orders food", "steps": []}).to_string(),
    )])
    .await
    .unwrap();
    let embedder = model("the nothing-fits test").unwrap();
    let off = Planner::new(PlannerSettings { min_relevance: 0.0, ..Default::default() })
        .with_semantic(Arc::new(Semantic::new(embedder)));
    let outcome = off.plan(&llm(&server), "Order a pizza for me", &catalog()[..5]).await.unwrap();
    assert_eq!(outcome.plan.reasoning, "nothing listed orders food");
    assert_eq!(server.requests().len(), 1);
}

fn offered(body: &Value) -> Vec<String> {
    let schema = &body["response_format"]["json_schema"]["schema"];
    schema["properties"]["selected"]["items"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paraphrase_is_offered_its_capability_first_among_few() {
    let Some(embedder) = model("the paraphrase test") else { return };
    let semantic = Arc::new(Semantic::new(embedder));
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::openai_content(&json!({"selected": ["money/convert_currency"]}).to_string()),
        ScriptedReply::openai_content(
            &json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": "money", "capability": "convert_currency",
                "instruction": "convert", "parameters": {"value": "50 USD"}, "depends_on": []}]})
            .to_string(),
        ),
        ScriptedReply::openai_content(&json!({"selected": ["units/convert_length"]}).to_string()),
    ])
    .await
    .unwrap();
    let planner = Planner::new(PlannerSettings::default()).with_semantic(semantic.clone());
    let outcome = planner.plan(&llm(&server), "How much is 50 US dollars in euros?", &catalog()).await.unwrap();
    assert_eq!(outcome.plan.steps[0].capability, "convert_currency");
    let candidates = offered(&server.requests()[0].body);
    assert_eq!(candidates[0], "money/convert_currency", "{candidates:?}");
    assert_eq!(candidates.len(), 10, "the ten most relevant, not the whole catalog");
    assert_eq!(semantic.len(), catalog().len(), "a vector kept for each capability");
    // Words alone share none with the request: the whole catalog is offered.
    let words = Planner::new(PlannerSettings::default());
    let _ = words.plan(&llm(&server), "How many kilometres are 26.2 miles?", &catalog()).await;
    let by_words = offered(&server.requests()[2].body);
    assert_eq!(by_words.len(), catalog().len(), "words alone offer every candidate up to lexical_limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_vectors_follow_discoverys_watch_stream() {
    let Some(embedder) = model("the watch-stream test") else { return };
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let channel = agentmesh_telemetry::rpc::channel("discovery", &discovery.url(), &Default::default()).unwrap();
    let client = DiscoveryServiceClient::new(agentmesh_telemetry::rpc::traced(channel));
    let semantic = Arc::new(Semantic::new(embedder));
    let follower = tokio::spawn(semantic.clone().follow(client));
    let http = agentmesh_testkit::http_client();
    let register = |skills: Value| {
        let http = http.clone();
        let url = format!("{}/api/v1/agents", discovery.url());
        async move {
            let agent = json!({"id": "money", "base_url": "http://m:1", "skills": skills});
            let r = http.post(url).json(&agent).send().await.unwrap();
            assert!(r.status().is_success(), "{}", r.text().await.unwrap_or_default());
        }
    };
    let wait_for = |n: usize| {
        let semantic = semantic.clone();
        async move {
            for _ in 0..200 {
                if semantic.len() == n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("{} vectors, expected {n}", semantic.len());
        }
    };
    register(json!([
        {"id": "convert_currency", "description": "Converts money between currencies"},
        {"id": "rates", "description": "Exchange rates of a currency"},
        {"id": "audit", "description": "Internal audit", "internal": true}
    ]))
    .await;
    // Embedded as it registered, before any request; internal ones are never planned with.
    wait_for(2).await;
    // Registered again without one of them: that one is dropped.
    register(json!([{"id": "convert_currency", "description": "Converts money between currencies"}])).await;
    wait_for(1).await;
    let r = http.delete(format!("{}/api/v1/agents/money", discovery.url())).send().await.unwrap();
    assert!(r.status().is_success());
    wait_for(0).await;
    follower.abort();
}
