//! The gateway end to end: one request in over gRPC or HTTP, the whole mesh
//! behind it (planner, executor, synthesis and discovery as real servers),
//! a real HTTP agent and a scripted LLM server.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use agentmesh_e2e::{Mesh, Options, kind};
use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent, ScriptedReply};
use pb::orchestrate_response::Event;
use serde_json::{Value, json};

fn weather_plan() -> String {
    json!({"steps": [{"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather",
        "instruction": "Weather in Chicago", "parameters": {"location": "Chicago"}, "depends_on": []}],
        "reasoning": "one lookup answers it"})
    .to_string()
}

fn review(achieved: bool) -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"summary": "The weather in Chicago is known.", "missing_data": [], "goal_achieved": achieved,
            "confidence": 0.9, "recovery_actions": []})
        .to_string(),
    )
}

async fn weather_agent(mesh: &Mesh, behavior: Behavior) -> FakeAgent {
    let agent = FakeAgent::start(vec![("get_current_weather", behavior)]).await.unwrap();
    mesh.register(&agent.registration("weather-tool-v2", &[("get_current_weather", None)])).await;
    agent
}

fn sunny() -> Behavior {
    Behavior::Always(Answer::ok(json!({"temp_c": 21, "sky": "sunny"})))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_streams_its_plan_events_answer_and_review_sqlite() {
    a_request_streams_its_plan_events_answer_and_review(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_streams_its_plan_events_answer_and_review_postgres() {
    a_request_streams_its_plan_events_answer_and_review(Backend::Postgres).await;
}

async fn a_request_streams_its_plan_events_answer_and_review(backend: Backend) {
    let replies = vec![
        ScriptedReply::openai_content(&weather_plan()),
        ScriptedReply::openai_stream(&["It is ", "21 °C and sunny ", "in Chicago."]),
        review(true),
    ];
    let Some(mesh) = Mesh::start(backend, replies, Options::default()).await else { return };
    let agent = weather_agent(&mesh, sunny()).await;

    let messages = mesh.orchestrate("What is the weather in Chicago?").await;
    let kinds: Vec<String> = messages.iter().map(kind).collect();
    assert_eq!(kinds.first().map(String::as_str), Some("plan_created"), "{kinds:?}");
    for expected in ["execution:execution_started", "execution:step_succeeded", "execution:execution_completed"] {
        assert!(kinds.iter().any(|k| k == expected), "{expected} missing from {kinds:?}");
    }
    assert_eq!(
        &kinds[kinds.len() - 5..],
        ["synthesis_chunk", "synthesis_chunk", "synthesis_chunk", "review", "final_answer"]
    );
    let sequences: Vec<u64> = messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, (1..=messages.len() as u64).collect::<Vec<_>>());
    let request_id = &messages[0].request_id;
    assert!(request_id.starts_with("req_") && messages.iter().all(|m| &m.request_id == request_id && m.round == 0));

    let Some(Event::FinalAnswer(answer)) = &messages.last().unwrap().event else { panic!("no final answer") };
    assert_eq!(answer.text, "It is 21 °C and sunny in Chicago.");
    assert!(answer.goal_achieved);
    assert!(answer.execution_id.starts_with("exe_") || !answer.execution_id.is_empty());
    // The review's tokens (the scripted completion's 12 + 7) at least.
    let usage = answer.usage.unwrap_or_default();
    assert!(usage.total_tokens >= 19 && usage.prompt_tokens >= 12, "{usage:?}");

    // The agent was called with the planned parameters and the request id;
    // synthesis saw its output.
    let calls = agent.calls_to("get_current_weather");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].header("x-request-id"), Some(request_id.as_str()));
    let requests = mesh.llm.requests();
    assert_eq!(requests.len(), 3, "plan, answer, review");
    assert!(requests[1].body["messages"].to_string().contains("temp_c"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hallucinated_tool_ends_in_an_explained_zero_step_answer() {
    let invented = json!({"steps": [{"step_id": "s1", "agent": "time-tool-v1", "capability": "get_time",
        "instruction": "time in Tokyo", "parameters": {}, "depends_on": []}], "reasoning": "use the clock"})
    .to_string();
    let nothing = json!({"steps": [], "reasoning": "No registered tool tells the time."}).to_string();
    let replies = vec![ScriptedReply::openai_content(&invented), ScriptedReply::openai_content(&nothing)];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let _agent = weather_agent(&mesh, sunny()).await;

    let messages = mesh.orchestrate("What time is it in Tokyo?").await;
    let kinds: Vec<String> = messages.iter().map(kind).collect();
    assert_eq!(kinds.first().map(String::as_str), Some("plan_created"));
    assert_eq!(kinds.last().map(String::as_str), Some("final_answer"));
    assert!(!kinds.iter().any(|k| k.starts_with("execution:") || k == "review"), "{kinds:?}");
    let Some(Event::PlanCreated(created)) = &messages[0].event else { panic!() };
    assert!(created.stats.as_ref().unwrap().hallucinations_detected >= 1);
    let Some(Event::FinalAnswer(answer)) = &messages.last().unwrap().event else { panic!() };
    assert!(answer.text.contains("No registered tool tells the time"), "{}", answer.text);
    assert!(!answer.goal_achieved && answer.execution_id.is_empty());
    assert_eq!(mesh.llm.requests().len(), 2, "the zero-step answer needs no model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_that_is_down_is_named_in_the_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let options = Options { planner_url: Some(format!("http://{closed}")), ..Options::default() };
    let Some(mesh) = Mesh::start(Backend::Sqlite, vec![], options).await else { return };
    let messages = mesh.orchestrate("What is the weather in Chicago?").await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    let Some(Event::Error(error)) = &messages[0].event else { panic!("{messages:?}") };
    assert_eq!((error.service.as_str(), error.code.as_str()), ("planner", "UNAVAILABLE"));
    assert_eq!(messages[0].sequence, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_its_execution() {
    let replies = vec![ScriptedReply::openai_content(&weather_plan())];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let agent = weather_agent(&mesh, Behavior::Hang).await;
    let mut client = mesh.gateway().await;
    let mut stream = client
        .orchestrate(pb::OrchestrateRequest { query: "Weather in Chicago?".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let mut execution_id = String::new();
    while let Some(m) = stream.message().await.unwrap() {
        if let Some(Event::ExecutionEvent(e)) = &m.event {
            execution_id.clone_from(&e.execution_id);
            if e.kind == pb::ExecutionEventKind::StepStarted as i32 {
                break;
            }
        }
    }
    assert!(!execution_id.is_empty());
    drop(stream);
    drop(client);

    let mut executor = mesh.executor().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let execution = executor
            .get_execution(pb::GetExecutionRequest { execution_id: execution_id.clone() })
            .await
            .unwrap()
            .into_inner()
            .execution
            .unwrap();
        if execution.status == pb::ExecutionStatus::Cancelled as i32 {
            assert!(execution.error.contains("the client went away"), "{}", execution.error);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not cancelled: {execution:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(agent.calls_to("get_current_weather").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_answers_in_one_json_body_or_as_server_sent_events() {
    let replies = vec![
        ScriptedReply::openai_content(&weather_plan()),
        ScriptedReply::openai_stream(&["It is ", "21 °C."]),
        review(true),
        ScriptedReply::openai_content(&weather_plan()),
        ScriptedReply::openai_stream(&["Sunny, ", "21 °C."]),
        review(true),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let _agent = weather_agent(&mesh, sunny()).await;
    let http = agentmesh_testkit::http_client();
    let url = format!("http://{}/api/v1/orchestrate", mesh.gateway);

    let response = http
        .post(&url)
        .header("x-request-id", "req_rest_json")
        .json(&json!({"query": "What is the weather in Chicago?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["request_id"], "req_rest_json");
    assert_eq!(body["answer"], "It is 21 °C.");
    assert_eq!(body["goal_achieved"], true);
    assert_eq!(body["plan"]["steps"][0]["agent"], "weather-tool-v2");
    assert_eq!(
        body["steps"],
        json!([{"step_id": "s1", "status": "succeeded", "attempts": 1,
        "output": {"temp_c": 21, "sky": "sunny"}}])
    );
    assert_eq!(body["review"]["summary"], "The weather in Chicago is known.");

    let response = http
        .post(&url)
        .header("accept", "text/event-stream")
        .json(&json!({"query": "What is the weather in Chicago?", "options": {"skip_review": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = response.text().await.unwrap();
    let events: Vec<(u64, String, Value)> = text
        .split("\n\n")
        .filter(|block| block.contains("data:"))
        .map(|block| {
            let field = |name: &str| {
                block.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim_start().to_owned()).unwrap_or_default()
            };
            (field("id:").parse().unwrap(), field("event:"), serde_json::from_str(&field("data:")).unwrap())
        })
        .collect();
    let ids: Vec<u64> = events.iter().map(|e| e.0).collect();
    assert_eq!(ids, (1..=events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[0].1, "plan_created");
    let (_, last, data) = events.last().unwrap();
    assert_eq!(last, "final_answer");
    assert_eq!(data["final_answer"]["text"], "Sunny, 21 °C.");
    assert!(!events.iter().any(|e| e.1 == "review"), "review was skipped");
    let chunks: Vec<&Value> =
        events.iter().filter(|e| e.1 == "synthesis_chunk").map(|e| &e.2["synthesis_chunk"]["text"]).collect();
    assert_eq!(chunks, [&json!("Sunny, "), &json!("21 °C.")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_errors_use_the_error_shape() {
    let Some(mesh) = Mesh::start(Backend::Sqlite, vec![], Options::default()).await else { return };
    let http = agentmesh_testkit::http_client();
    let url = format!("http://{}/api/v1/orchestrate", mesh.gateway);
    for (body, error, says) in [
        ("[]", "validation_failed", "must be a JSON object"),
        ("{\"query\": \"  \"}", "validation_failed", "query must not be empty"),
        ("{\"query\": \"x\", \"colour\": 1}", "validation_failed", "unknown field `colour`"),
        ("{nope", "invalid_json", "not JSON"),
    ] {
        let response = http.post(&url).header("content-type", "application/json").body(body).send().await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["error"], error, "{body}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains(says), "{body}: {answer}");
        assert!(answer["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{answer}");
    }
    // Ids, budgets and nesting are held to what the mesh can carry.
    let mut deep = json!({"leaf": 1});
    for _ in 0..40 {
        deep = json!({"a": deep});
    }
    for (body, says) in [
        (json!({"query": "x", "request_id": "req\r\nforged line"}), "request_id holds a space, a control"),
        (json!({"query": "x", "request_id": "r".repeat(200)}), "request_id is 200 bytes long"),
        (json!({"query": "x", "review_budget": 11}), "review_budget is 11; at most 10"),
        (json!({"query": "x", "options": {"context": deep}}), "options.context nests objects and arrays"),
    ] {
        let response = http.post(&url).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["error"], "validation_failed", "{answer}");
        assert!(answer["message"].as_str().unwrap().contains(says), "{answer}");
        assert!(!answer.to_string().contains("forged"), "the id is never echoed: {answer}");
    }
    let mut gateway = mesh.gateway().await;
    let refused = gateway
        .orchestrate(pb::OrchestrateRequest { request_id: "a\nb".into(), query: "x".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert_eq!(mesh.running(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_orchestrations_with_one_request_id_never_both_start() {
    let Some(mesh) = Mesh::start(Backend::Sqlite, vec![], Options::default()).await else { return };
    let http = agentmesh_testkit::http_client();
    let url = format!("http://{}/api/v1/orchestrate", mesh.gateway);
    for round in 0..2 {
        let body = json!({"query": "What is the weather in Chicago?", "request_id": format!("req_same_{round}")});
        let send = || http.post(&url).json(&body).send();
        let (a, b, c) = tokio::join!(send(), send(), send());
        let statuses: Vec<u16> = [a, b, c].into_iter().map(|r| r.unwrap().status().as_u16()).collect();
        assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 2, "round {round}: {statuses:?}");
    }
}

fn not_achieved_add_time() -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"summary": "The weather is known; the local time is not.", "missing_data": ["local time"],
            "goal_achieved": false, "confidence": 0.8, "recovery_actions": [
                {"kind": "add_step", "agent": "tz-agent", "capability": "local_time", "step_id": "",
                 "query": "Local time in Chicago", "reason": "the time was asked for"}]})
        .to_string(),
    )
}

fn time_steps() -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"steps": [{"step_id": "s1", "agent": "tz-agent", "capability": "local_time",
            "instruction": "Local time in Chicago", "parameters": {"city": "Chicago"}, "depends_on": []}],
            "reasoning": "the clock knows"})
        .to_string(),
    )
}

async fn weather_and_clock(mesh: &Mesh) -> (FakeAgent, FakeAgent) {
    let weather = weather_agent(mesh, sunny()).await;
    let clock =
        FakeAgent::start(vec![("local_time", Behavior::Always(Answer::ok(json!({"time": "09:00"}))))]).await.unwrap();
    mesh.register(&clock.registration("tz-agent", &[("local_time", None)])).await;
    (weather, clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_that_is_not_satisfied_runs_one_recovery_round_in_the_same_execution() {
    let replies = vec![
        ScriptedReply::openai_content(&weather_plan()),
        ScriptedReply::openai_stream(&["It is 21 °C."]),
        not_achieved_add_time(),
        time_steps(),
        ScriptedReply::openai_stream(&["It is 21 °C ", "and 09:00."]),
        review(true),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let (_weather, clock) = weather_and_clock(&mesh).await;

    let messages = mesh.orchestrate("Weather and local time in Chicago?").await;
    let kinds: Vec<String> = messages.iter().map(kind).collect();
    let sequences: Vec<u64> = messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, (1..=messages.len() as u64).collect::<Vec<_>>());
    let reviews: Vec<usize> = kinds.iter().enumerate().filter(|(_, k)| *k == "review").map(|(i, _)| i).collect();
    assert_eq!(reviews.len(), 2, "{kinds:?}");
    assert!(messages[..=reviews[0]].iter().all(|m| m.round == 0));
    assert!(messages[reviews[0] + 1..].iter().all(|m| m.round == 1), "{kinds:?}");
    assert_eq!(kinds[reviews[0] + 1], "execution:execution_extended", "{kinds:?}");

    // The new step ran in the same execution, continuing its sequence.
    let events: Vec<&pb::ExecutionEvent> = messages
        .iter()
        .filter_map(|m| if let Some(Event::ExecutionEvent(e)) = &m.event { Some(e) } else { None })
        .collect();
    assert!(events.iter().all(|e| e.execution_id == events[0].execution_id));
    let executor_sequences: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(executor_sequences, (1..=events.len() as u64).collect::<Vec<_>>());
    assert_eq!(clock.calls_to("local_time").len(), 1);
    assert_eq!(clock.calls_to("local_time")[0].body, json!({"city": "Chicago"}));

    let Some(Event::FinalAnswer(answer)) = &messages.last().unwrap().event else { panic!() };
    assert_eq!(answer.text, "It is 21 °C and 09:00.");
    assert!(answer.goal_achieved);
    assert_eq!(answer.execution_id, events[0].execution_id);
    let second_answer = &mesh.llm.requests()[4].body["messages"].to_string();
    assert!(second_answer.contains("09:00"), "the second answer saw the new step's output");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_budget_bounds_recovery_rounds() {
    let replies = vec![
        ScriptedReply::openai_content(&weather_plan()),
        ScriptedReply::openai_stream(&["It is 21 °C."]),
        not_achieved_add_time(),
        time_steps(),
        ScriptedReply::openai_stream(&["Still only the weather."]),
        not_achieved_add_time(),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let _agents = weather_and_clock(&mesh).await;
    let messages = mesh.orchestrate("Weather and local time in Chicago?").await;
    let kinds: Vec<String> = messages.iter().map(kind).collect();
    assert_eq!(kinds.iter().filter(|k| *k == "review").count(), 2, "{kinds:?}");
    assert_eq!(messages.last().unwrap().round, 1, "one round, the default budget");
    let Some(Event::FinalAnswer(answer)) = &messages.last().unwrap().event else { panic!("{kinds:?}") };
    assert!(!answer.goal_achieved);
    assert_eq!(answer.text, "Still only the weather.");
    assert_eq!(mesh.llm.requests().len(), 6, "no third round");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_budget_of_zero_reviews_without_recovering() {
    let replies = vec![
        ScriptedReply::openai_content(&weather_plan()),
        ScriptedReply::openai_stream(&["It is 21 °C."]),
        not_achieved_add_time(),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let _agents = weather_and_clock(&mesh).await;
    let mut client = mesh.gateway().await;
    let mut stream = client
        .orchestrate(pb::OrchestrateRequest {
            query: "Weather and local time in Chicago?".into(),
            review_budget: Some(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut messages = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        messages.push(m);
    }
    let kinds: Vec<String> = messages.iter().map(kind).collect();
    assert_eq!(&kinds[kinds.len() - 2..], ["review", "final_answer"], "{kinds:?}");
    let Some(Event::FinalAnswer(answer)) = &messages.last().unwrap().event else { panic!() };
    assert!(!answer.goal_achieved);
    assert!(messages.iter().all(|m| m.round == 0));
    assert_eq!(mesh.llm.requests().len(), 3);
}

/// Reads server-sent events from `response` until `stop` says so or the
/// stream ends: `(id, event, data)`.
async fn read_events(
    mut response: reqwest::Response,
    stop: impl Fn(&[(u64, String, Value)]) -> bool,
) -> Vec<(u64, String, Value)> {
    let mut buffer = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if !block.contains("data:") {
                continue;
            }
            let field = |name: &str| {
                block.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim_start().to_owned()).unwrap_or_default()
            };
            events.push((
                field("id:").parse().unwrap(),
                field("event:"),
                serde_json::from_str(&field("data:")).unwrap(),
            ));
            if stop(&events) {
                return events;
            }
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_stream_resumes_from_last_event_id() {
    let replies = vec![
        ScriptedReply::openai_content(&weather_plan()),
        ScriptedReply::openai_stream(&["It is ", "21 °C."]),
        review(true),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let _agent =
        weather_agent(&mesh, Behavior::Always(Answer::ok(json!({"temp_c": 21})).after(Duration::from_millis(800))))
            .await;
    let http = agentmesh_testkit::http_client();
    let url = format!("http://{}/api/v1/orchestrate", mesh.gateway);
    let body = json!({"query": "What is the weather in Chicago?", "request_id": "req_resume"});

    // The first connection drops after two events, while the agent works.
    let response = http.post(&url).header("accept", "text/event-stream").json(&body).send().await.unwrap();
    let first = read_events(response, |events| events.len() == 2).await;
    assert_eq!(first.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2]);

    // The reconnect names the request and the last event seen.
    let response = http
        .post(&url)
        .header("accept", "text/event-stream")
        .header("last-event-id", "2")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let rest = read_events(response, |_| false).await;
    let ids: Vec<u64> = rest.iter().map(|e| e.0).collect();
    assert_eq!(ids, (3..3 + rest.len() as u64).collect::<Vec<_>>(), "{rest:?}");
    let (_, last, data) = rest.last().unwrap();
    assert_eq!(last, "final_answer", "{rest:?}");
    assert_eq!(data["final_answer"]["text"], "It is 21 °C.");
    assert_eq!(data["final_answer"]["goal_achieved"], true, "the execution was not cancelled");

    // Later, the whole stream again from the store; and its end right away.
    let replay =
        http.get(format!("http://{}/api/v1/orchestrations/req_resume/events", mesh.gateway)).send().await.unwrap();
    let all = read_events(replay, |_| false).await;
    assert_eq!(all.len() as u64, 2 + rest.len() as u64);
    let ended = http
        .get(format!("http://{}/api/v1/orchestrations/req_resume/events?after={}", mesh.gateway, all.len()))
        .send()
        .await
        .unwrap();
    assert!(read_events(ended, |_| false).await.is_empty());

    // A request id already used is not run again; an unknown one cannot be resumed.
    let again = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(again.status(), 409);
    let unknown =
        http.get(format!("http://{}/api/v1/orchestrations/req_nope/events", mesh.gateway)).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    let answer: Value = unknown.json().await.unwrap();
    assert_eq!(answer["error"], "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_client_that_does_not_come_back_has_its_execution_cancelled() {
    let replies = vec![ScriptedReply::openai_content(&weather_plan())];
    let options = Options { resume_grace_secs: Some(0.3), ..Options::default() };
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, options).await else { return };
    let _agent = weather_agent(&mesh, Behavior::Hang).await;
    let http = agentmesh_testkit::http_client();
    let response = http
        .post(format!("http://{}/api/v1/orchestrate", mesh.gateway))
        .header("accept", "text/event-stream")
        .json(&json!({"query": "Weather?"}))
        .send()
        .await
        .unwrap();
    let seen =
        read_events(response, |events| events.iter().any(|e| e.2["execution_event"]["kind"] == "step_started")).await;
    let execution_id = seen.last().unwrap().2["execution_event"]["execution_id"].as_str().unwrap().to_owned();
    let mut executor = mesh.executor().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let execution = executor
            .get_execution(pb::GetExecutionRequest { execution_id: execution_id.clone() })
            .await
            .unwrap()
            .into_inner()
            .execution
            .unwrap();
        if execution.status == pb::ExecutionStatus::Cancelled as i32 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not cancelled after the grace period");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A late resume replays what was sent and ends on why it stopped.
    let request_id = seen[0].2["request_id"].as_str().unwrap().to_owned();
    let late =
        http.get(format!("http://{}/api/v1/orchestrations/{request_id}/events", mesh.gateway)).send().await.unwrap();
    let replayed = tokio::time::timeout(Duration::from_secs(10), read_events(late, |_| false)).await.unwrap();
    let (_, last, data) = replayed.last().unwrap();
    assert_eq!(last, "error", "{replayed:?}");
    assert_eq!(data["error"]["code"], "CANCELLED");
    assert!(replayed.len() > seen.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_the_orchestration_and_cancels_its_execution() {
    let replies = vec![ScriptedReply::openai_content(&weather_plan())];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let _agent = weather_agent(&mesh, Behavior::Hang).await;
    let mut client = mesh.gateway().await;
    let mut request = tonic::Request::new(pb::OrchestrateRequest { query: "Weather?".into(), ..Default::default() });
    request.set_timeout(Duration::from_millis(1500));
    let started = tokio::time::Instant::now();
    let mut stream = client.orchestrate(request).await.unwrap().into_inner();
    let mut messages = Vec::new();
    while let Ok(Some(m)) = stream.message().await {
        messages.push(m);
    }
    let elapsed = started.elapsed();
    let Some(Event::Error(error)) = &messages.last().unwrap().event else { panic!("{messages:?}") };
    assert_eq!((error.service.as_str(), error.code.as_str()), ("gateway", "DEADLINE_EXCEEDED"), "{error:?}");
    assert!(elapsed >= Duration::from_millis(1400) && elapsed < Duration::from_secs(10), "{elapsed:?}");
    let execution_id = messages
        .iter()
        .find_map(|m| if let Some(Event::ExecutionEvent(e)) = &m.event { Some(e.execution_id.clone()) } else { None })
        .unwrap();
    let execution = mesh
        .executor()
        .await
        .get_execution(pb::GetExecutionRequest { execution_id })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(execution.status, pb::ExecutionStatus::Cancelled as i32, "{execution:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_steps_feed_a_typed_reference() {
    let step = |id: &str, city: &str| {
        json!({"step_id": id, "agent": "weather-tool-v2", "capability": "get_current_weather",
            "instruction": format!("Weather in {city}"), "parameters": {"location": city}, "depends_on": []})
    };
    let plan = json!({"reasoning": "two lookups, then the difference", "steps": [step("s1", "Chicago"), step("s2", "Paris"),
        {"step_id": "s3", "agent": "calculation-agent", "capability": "evaluate", "instruction": "difference",
         "parameters": {"a": "{{s1.output.temp_c}}", "b": "{{s2.output.temp_c}}", "text": "{{s1.output.temp_c}} vs {{s2.output.temp_c}}"},
         "depends_on": ["s1", "s2"]}]});
    let replies = vec![
        ScriptedReply::openai_content(&plan.to_string()),
        ScriptedReply::openai_stream(&["Chicago is ", "3 °C warmer."]),
        review(true),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let weather = weather_agent(
        &mesh,
        Behavior::Sequence(vec![
            Answer::ok(json!({"temp_c": 21})).after(Duration::from_millis(300)),
            Answer::ok(json!({"temp_c": 18})).after(Duration::from_millis(300)),
        ]),
    )
    .await;
    let calculator = FakeAgent::start(vec![("evaluate", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    mesh.register(&calculator.registration("calculation-agent", &[("evaluate", None)])).await;

    let messages = mesh.orchestrate("How much warmer is Chicago than Paris?").await;
    let kinds: Vec<String> = messages.iter().map(kind).collect();
    assert_eq!(kinds.last().map(String::as_str), Some("final_answer"), "{kinds:?}");
    assert_eq!(weather.max_in_flight(), 2, "s1 and s2 ran at once");
    let calls = calculator.calls_to("evaluate");
    assert_eq!(calls.len(), 1);
    let (a, b) = (&calls[0].body["a"], &calls[0].body["b"]);
    assert!(a.is_number() && b.is_number(), "references keep their type: {}", calls[0].body);
    let mut pair = [a.as_i64().unwrap(), b.as_i64().unwrap()];
    pair.sort_unstable();
    assert_eq!(pair, [18, 21]);
    assert!(calls[0].body["text"].as_str().unwrap().contains(" vs "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_asks_for_help_loops_back_through_the_planner() {
    let replies = vec![
        ScriptedReply::openai_content(&weather_plan()),
        time_steps(),
        ScriptedReply::openai_stream(&["21 °C at 09:00."]),
        review(true),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    let asks = Answer::ok(json!({"output": {"temp_c": 21}, "collaborate": {"agent": "tz-agent",
        "capability": "local_time", "query": "Local time in Chicago"}}));
    let weather = weather_agent(&mesh, Behavior::Always(asks)).await;
    let clock =
        FakeAgent::start(vec![("local_time", Behavior::Always(Answer::ok(json!({"time": "09:00"}))))]).await.unwrap();
    mesh.register(&clock.registration("tz-agent", &[("local_time", None)])).await;

    let messages = mesh.orchestrate("Weather in Chicago?").await;
    let kinds: Vec<String> = messages.iter().map(kind).collect();
    assert!(kinds.iter().any(|k| k == "execution:plan_extended"), "{kinds:?}");
    assert_eq!(weather.calls_to("get_current_weather").len(), 1);
    assert_eq!(clock.calls_to("local_time").len(), 1);
    let Some(Event::FinalAnswer(answer)) = &messages.last().unwrap().event else { panic!("{kinds:?}") };
    assert_eq!(answer.text, "21 °C at 09:00.");
    assert!(messages.iter().all(|m| m.round == 0), "loop-back is not a recovery round");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_on_a_client_orchestrates_and_only_it_follows_its_orchestration() {
    let tokens = agentmesh_e2e::Tokens::new("gateway");
    let (shop, billing, operator) = (tokens.shop.as_str(), tokens.billing.as_str(), tokens.operator.as_str());
    let options = tokens.options;
    let replies = vec![
        ScriptedReply::openai_content(&weather_plan()),
        ScriptedReply::openai_stream(&["It is 21 °C."]),
        review(true),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, options).await else { return };
    let agent = weather_agent(&mesh, sunny()).await;
    let http = agentmesh_testkit::http_client();
    let url = format!("http://{}/api/v1/orchestrate", mesh.gateway);
    let body = json!({"query": "What is the weather in Chicago?", "request_id": "req_auth_1"});

    let refused = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    // Planning, execution, synthesis and review all pass with the services' own token.
    let answered = http.post(&url).bearer_auth(shop).json(&body).send().await.unwrap();
    assert_eq!(answered.status(), 200);
    let answer: Value = answered.json().await.unwrap();
    assert!(answer.to_string().contains("21 °C"), "{answer}");
    assert_eq!(agent.calls_to("get_current_weather").len(), 1);

    let events = format!("http://{}/api/v1/orchestrations/req_auth_1/events", mesh.gateway);
    let resumed = http.get(&events).bearer_auth(billing).send().await.unwrap();
    assert_eq!(resumed.status(), 403);
    let said: Value = resumed.json().await.unwrap();
    assert!(said["message"].as_str().unwrap().contains("`billing` may not follow"), "{said}");
    let resumed = http.get(&events).bearer_auth(shop).send().await.unwrap();
    assert_eq!(resumed.status(), 200);
    // The execution the gateway ran is shop's, not the gateway's.
    let execution_id = answer["execution_id"].as_str().unwrap_or_default().to_owned();
    let mut executor = agentmesh_proto::v1::executor_service_client::ExecutorServiceClient::connect(format!(
        "http://{}",
        mesh.executor
    ))
    .await
    .unwrap();
    let get = |token: &str| {
        let mut request = tonic::Request::new(pb::GetExecutionRequest { execution_id: execution_id.clone() });
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        request
    };
    let own = executor.get_execution(get(shop)).await;
    assert!(own.is_ok(), "{own:?} {answer}");
    let refused = executor.get_execution(get(billing)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");

    // The LLM calls made for shop's request are shop's to read, not billing's.
    let planner =
        agentmesh_proto::v1::planner_service_client::PlannerServiceClient::connect(format!("http://{}", mesh.planner))
            .await
            .unwrap();
    let interactions = async |token: &str| {
        let mut request = tonic::Request::new(pb::ListInteractionsRequest { request_id: "req_auth_1".into() });
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        let listed = planner.clone().list_interactions(request).await.unwrap().into_inner().interactions;
        listed.iter().map(|i| i.kind).collect::<Vec<_>>()
    };
    let shops = interactions(shop).await;
    assert_eq!(shops.len(), 3, "the plan, the answer and the review: {shops:?}");
    assert!(interactions(billing).await.is_empty(), "another client sees none of them");
    assert_eq!(interactions(operator).await, shops, "an operator sees them all");
}
