//! A2A both ways, against the official SDK (`a2a-sdk`, installed by
//! `.ci/run`): an agent written with it joins the mesh from its Agent Card
//! and serves a plan, in protocol 1.0 (streaming) and 0.3; and the SDK's
//! client calls the mesh's own A2A endpoint, in 1.0 and 0.3, sending,
//! streaming, reading and cancelling tasks.

#![allow(clippy::unwrap_used)]

use agentmesh_e2e::{Mesh, Options, execution_events, outcome};
use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Backend, ScriptedReply, interop};
use pb::orchestrate_response::Event;
use serde_json::{Value, json};

fn plan(agent: &str, steps: &[(&str, &str)]) -> ScriptedReply {
    let steps: Vec<Value> = steps
        .iter()
        .map(|(id, message)| {
            json!({"step_id": id, "agent": agent, "capability": "convert_currency", "instruction": "convert it",
                "parameters": {"message": message}, "depends_on": []})
        })
        .collect();
    ScriptedReply::openai_content(&json!({"steps": steps, "reasoning": "the currency agent answers it"}).to_string())
}

fn review() -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"summary": "Converted.", "goal_achieved": true, "confidence": 0.9,
            "missing_data": [], "recovery_actions": []})
        .to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_sdk_agent_serves_a_plan_streaming_in_1_0() {
    let Some(currency) = interop::A2aAgent::start("the A2A agent test", "1.0", true).await else { return };
    let replies = vec![
        plan("currency", &[("s1", "100 USD in EUR"), ("s2", "100 XXX in EUR"), ("s3", "convert my savings")]),
        ScriptedReply::openai_stream(&["100 USD is 92.00 EUR."]),
        review(),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    // Registered over REST with transport `a2a`: the card's skills become the capabilities.
    mesh.register(&json!({"id": "currency", "base_url": currency.url, "transport": "a2a"})).await;
    let listed = mesh.agent("currency").await;
    let skill = listed.pointer("/skills/0").or_else(|| listed.pointer("/agent/skills/0")).cloned().unwrap();
    assert_eq!(skill["id"], "convert_currency", "{listed}");
    assert_eq!(skill["endpoint"], "convert_currency");
    assert_eq!(skill["tags"], json!(["a2a", "money", "currency"]));
    assert_eq!(skill["examples"][0], json!({"message": "100 USD in EUR"}));
    assert_eq!(skill["input_schema"]["required"], json!(["message"]));

    // The request names all three conversions: none is an unasked repeat.
    let messages = mesh.orchestrate("Convert 100 USD in EUR, 100 XXX in EUR, and then convert my savings").await;
    // Completed: the artifact's text and data are the output.
    let output = outcome(&messages, "s1").unwrap();
    assert_eq!(output["text"], "100 USD = 92.00 EUR", "{output}");
    assert_eq!(output["data"][0]["result"].as_f64(), Some(92.0), "{output}");
    // Failed: the agent's words are the step's error, not retried.
    let failed = outcome(&messages, "s2").unwrap_err();
    assert!(failed.contains("the A2A task failed: XXX is not a currency I can price"), "{failed}");
    // Input required: a reason the review can turn into asking the user.
    let asked = outcome(&messages, "s3").unwrap_err();
    assert!(asked.contains("needs more input from the user: Which currencies?"), "{asked}");
    let starts = |step: &str| {
        execution_events(&messages)
            .iter()
            .filter(|e| e.step_id == step && e.kind == pb::ExecutionEventKind::StepStarted as i32)
            .count()
    };
    assert_eq!((starts("s2"), starts("s3")), (1, 1), "an agent's refusal is not retried");
    // Streamed: the statuses the agent reported arrive as step progress
    // (at most one per 100 ms: the agent's next one, as quick, is dropped).
    let progress: Vec<String> = execution_events(&messages)
        .iter()
        .filter(|e| e.step_id == "s1" && e.kind == pb::ExecutionEventKind::StepProgress as i32)
        .filter_map(|e| e.progress.as_ref().map(|p| p.message.clone()))
        .collect();
    assert_eq!(progress.first().map(String::as_str), Some("working: reading the amount"), "{progress:?}");
    assert!(matches!(messages.last().and_then(|m| m.event.as_ref()), Some(Event::FinalAnswer(_))));

    // What the agent received: 1.0's streaming method, the request id and the chosen skill.
    let received = currency.received();
    let calls: Vec<&Value> = received.iter().filter(|r| r.get("call").is_some()).collect();
    assert!(calls.iter().all(|c| c["call"] == "SendStreamingMessage" && c["version"] == "1.0"), "{calls:?}");
    let first = received.iter().find_map(|r| r.get("received")).unwrap();
    assert_eq!(first["metadata"]["dev.agentmesh/skill"], "convert_currency", "{first}");
    assert!(first["metadata"]["dev.agentmesh/request_id"].as_str().is_some_and(|id| !id.is_empty()), "{first}");
    assert!(first["messageId"].as_str().is_some_and(|id| id.ends_with("/s1") || id.contains('/')), "{first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_sdk_agent_registered_over_grpc_is_called_in_0_3() {
    let Some(currency) = interop::A2aAgent::start("the A2A 0.3 agent test", "0.3", false).await else { return };
    let replies =
        vec![plan("legacy", &[("s1", "20 GBP in JPY")]), ScriptedReply::openai_stream(&["3822.78 yen."]), review()];
    let Some(mesh) = Mesh::start(Backend::Postgres, replies, Options::default()).await else { return };
    let mut discovery =
        pb::discovery_service_client::DiscoveryServiceClient::connect(mesh.discovery.url()).await.unwrap();
    let registered = discovery
        .register_agent(pb::RegisterAgentRequest {
            agent: Some(pb::Agent {
                id: "legacy".into(),
                base_url: currency.url.clone(),
                transport: pb::Transport::A2a as i32,
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let skills: Vec<&str> = registered.agent.iter().flat_map(|a| &a.skills).map(|s| s.id.as_str()).collect();
    assert_eq!(skills, ["convert_currency"]);
    // A registration naming skills of its own is refused: they come from the card.
    let mut own = registered.agent.clone().unwrap();
    own.skills[0].id = "made_up".into();
    let refused = discovery.register_agent(pb::RegisterAgentRequest { agent: Some(own) }).await.unwrap_err();
    assert!(refused.message().contains("Agent Card"), "{}", refused.message());

    let messages = mesh.orchestrate("How many yen is 20 GBP?").await;
    let output = outcome(&messages, "s1").unwrap();
    assert_eq!(output["text"], "20 GBP = 3822.78 JPY", "{output}");
    let calls: Vec<Value> = currency.received().into_iter().filter(|r| r.get("call").is_some()).collect();
    assert!(
        !calls.is_empty() && calls.iter().all(|c| c["call"] == "message/send" && c["version"] == "0.3"),
        "{calls:?}"
    );

    // An agent whose card cannot be read is refused with the reason.
    let gone = discovery
        .register_agent(pb::RegisterAgentRequest {
            agent: Some(pb::Agent {
                id: "gone".into(),
                base_url: "http://127.0.0.1:9".into(),
                transport: pb::Transport::A2a as i32,
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::Unavailable, "{gone:?}");
    assert!(gone.message().contains("Agent Card"), "{}", gone.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_a2a_sdk_client_asks_the_mesh_in_1_0_and_0_3() {
    let Some(python) = interop::python("the A2A client test") else { return };
    let Some(currency) = interop::A2aAgent::start("the A2A client test", "1.0", false).await else { return };
    let answered = || {
        vec![
            plan("currency", &[("s1", "100 USD in EUR")]),
            ScriptedReply::openai_stream(&["100 USD is ", "92.00 EUR."]),
            review(),
        ]
    };
    let mut replies: Vec<ScriptedReply> = (0..3).flat_map(|_| answered()).collect();
    replies.push(plan("currency", &[("s1", "100 USD in EUR slowly")]));
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, Options::default()).await else { return };
    mesh.register(&json!({"id": "currency", "base_url": currency.url, "transport": "a2a"})).await;

    let script =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/a2a_client.py"))
            .unwrap();
    let out = interop::run_python(&python, &script, &[&format!("http://{}", mesh.gateway)]).await;
    let seen: Value =
        serde_json::from_str(out.trim().lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {out}"));

    // The card: streaming, one JSON-RPC interface in 1.0, the catalog as skills.
    assert_eq!(seen["card"]["name"], "agentmesh", "{seen}");
    assert_eq!(seen["card"]["streaming"], true);
    assert_eq!(seen["card"]["interfaces"], json!([["JSONRPC", "1.0", format!("http://{}/a2a", mesh.gateway)]]));
    assert_eq!(seen["card"]["skills"], json!(["ask", "currency.convert_currency"]));
    // Sent and waited for, in 1.0: the answer as an artifact, the review beside it.
    let sent = &seen["v1_send"];
    assert_eq!(sent["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(sent["answer"], "100 USD is 92.00 EUR.");
    assert_eq!(sent["data"][0]["goal_achieved"], true);
    assert_eq!(sent["data"][0]["review"]["summary"], "Converted.");
    assert_eq!(sent["data"][0]["request_id"], sent["id"]);
    // Read back by its id: the orchestration's stored messages.
    assert_eq!(seen["v1_get"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(seen["v1_get"]["answer"], "100 USD is 92.00 EUR.");
    // Streamed: the task first, a status per plan and step event, the answer in pieces, the end.
    let stream = &seen["v1_stream"];
    assert_eq!(stream["kinds"][0], "task", "{stream}");
    assert!(stream["kinds"].as_array().unwrap().iter().any(|k| k == "artifact_update"), "{stream}");
    assert!(stream["states"].as_array().unwrap().iter().any(|s| s == "TASK_STATE_WORKING"), "{stream}");
    assert_eq!(stream["states"].as_array().unwrap().last().unwrap(), "TASK_STATE_COMPLETED");
    assert_eq!(stream["answer"], "100 USD is 92.00 EUR.");
    // In 0.3, the same.
    assert_eq!(seen["v03_send"]["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(seen["v03_send"]["answer"], "100 USD is 92.00 EUR.");
    assert_eq!(seen["v03_get"]["state"], "TASK_STATE_COMPLETED");
    // Sent without waiting, then cancelled while its step ran: the execution is cancelled.
    assert!(matches!(seen["started"].as_str(), Some("TASK_STATE_SUBMITTED" | "TASK_STATE_WORKING")), "{seen}");
    assert_eq!(seen["cancel"], "TASK_STATE_CANCELED", "{seen}");
    assert_eq!(seen["cancelled_later"], "TASK_STATE_CANCELED", "read back, it stays cancelled: {seen}");
    let mut executor = mesh.executor().await;
    let listed = executor.list_executions(pb::ListExecutionsRequest::default()).await.unwrap().into_inner();
    let states: Vec<i32> = listed.executions.iter().map(|e| e.status).collect();
    assert!(states.contains(&(pb::ExecutionStatus::Cancelled as i32)), "{states:?}");
    assert!(seen["missing"].as_str().is_some_and(|m| m.contains("no task")), "{seen}");
}

async fn rpc(base: &str, token: Option<&str>, version: &str, body: Value) -> (u16, Value) {
    let mut request =
        agentmesh_testkit::http_client().post(format!("{base}/a2a")).header("A2A-Version", version).json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_the_card_shows_only_ask_and_tasks_are_their_callers() {
    use agentmesh_testkit::{Answer, Behavior, FakeAgent};
    let tokens = agentmesh_e2e::Tokens::new("a2a");
    let (shop, billing) = (tokens.shop.clone(), tokens.billing.clone());
    let (shop, billing) = (shop.as_str(), billing.as_str());
    let replies = vec![
        ScriptedReply::openai_content(
            &json!({"steps": [{"step_id": "s1", "agent": "weather", "capability": "get_current_weather",
                "instruction": "Weather in Chicago", "parameters": {"location": "Chicago"}, "depends_on": []}],
                "reasoning": "one lookup"})
            .to_string(),
        ),
        ScriptedReply::openai_stream(&["It is 21 °C in Chicago."]),
        review(),
    ];
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies, tokens.options).await else { return };
    let agent = FakeAgent::start(vec![("get_current_weather", Behavior::Always(Answer::ok(json!({"temp_c": 21}))))])
        .await
        .unwrap();
    mesh.register(&agent.registration("weather", &[("get_current_weather", None)])).await;
    let base = format!("http://{}", mesh.gateway);

    // The public card needs no token and shows no catalog.
    let card: Value = agentmesh_testkit::http_client()
        .get(format!("{base}/.well-known/agent-card.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(card["skills"].as_array().unwrap().len(), 1, "{card}");
    assert_eq!(card["skills"][0]["id"], "ask");
    assert_eq!(card["capabilities"]["extendedAgentCard"], true);
    // `/a2a` needs one; the extended card lists the catalog as the caller sees it.
    let (status, _) =
        rpc(&base, None, "1.0", json!({"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard"})).await;
    assert_eq!(status, 401);
    let (_, extended) =
        rpc(&base, Some(shop), "1.0", json!({"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard"})).await;
    let skills: Vec<&str> =
        extended["result"]["skills"].as_array().unwrap().iter().filter_map(|s| s["id"].as_str()).collect();
    assert_eq!(skills, ["ask", "weather.get_current_weather"], "{extended}");

    let send = json!({"jsonrpc": "2.0", "id": "a", "method": "SendMessage", "params": {"message": {
        "messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "What is the weather in Chicago?"}]}}});
    let (_, sent) = rpc(&base, Some(shop), "1.0", send).await;
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "It is 21 °C in Chicago.");
    let id = task["id"].as_str().unwrap();
    // Read back in 0.3 by its caller; another client does not find it.
    let get = |method: &str| json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": {"id": id}});
    let (_, own) = rpc(&base, Some(shop), "0.3", get("tasks/get")).await;
    assert_eq!((&own["result"]["kind"], &own["result"]["status"]["state"]), (&json!("task"), &json!("completed")));
    let (_, other) = rpc(&base, Some(billing), "1.0", get("GetTask")).await;
    assert_eq!(other["error"]["code"], -32001, "{other}");
    let (_, other) = rpc(&base, Some(billing), "1.0", get("CancelTask")).await;
    assert_eq!(other["error"]["code"], -32001, "{other}");
    // An ended task cannot be cancelled.
    let (_, ended) = rpc(&base, Some(shop), "1.0", get("CancelTask")).await;
    assert_eq!(ended["error"]["code"], -32002, "{ended}");
    // Wrong calls get JSON-RPC's answers.
    let (_, unknown) = rpc(&base, Some(shop), "1.0", json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/list"})).await;
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    let (_, version) = rpc(&base, Some(shop), "2.0", get("GetTask")).await;
    assert_eq!(version["error"]["code"], -32009, "{version}");
    let empty = json!({"jsonrpc": "2.0", "id": 4, "method": "SendMessage", "params": {"message": {
        "messageId": "m2", "role": "ROLE_USER", "parts": []}}});
    let (_, empty) = rpc(&base, Some(shop), "1.0", empty).await;
    assert_eq!(empty["error"]["code"], -32602, "{empty}");
}
