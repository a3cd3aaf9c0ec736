//! The console over HTTP, against the whole mesh: its pages and assets
//! under a strict Content-Security-Policy, and the JSON they read, taken
//! from the services' public APIs with the caller's own token.

#![allow(clippy::unwrap_used)]

use agentmesh_e2e::{Mesh, Options};
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent, ScriptedReply};
use serde_json::{Value, json};

fn weather_plan() -> String {
    json!({"steps": [{"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather",
        "instruction": "Weather in Chicago", "parameters": {"location": "Chicago"}, "depends_on": []}],
        "reasoning": "one lookup answers it"})
    .to_string()
}

fn review() -> ScriptedReply {
    ScriptedReply::openai_content(
        &json!({"summary": "The weather in Chicago is known.", "missing_data": [], "goal_achieved": true,
            "confidence": 0.9, "recovery_actions": []})
        .to_string(),
    )
}

fn replies() -> Vec<ScriptedReply> {
    vec![ScriptedReply::openai_content(&weather_plan()), ScriptedReply::openai_stream(&["It is 21 °C."]), review()]
}

async fn get(url: &str, token: Option<&str>) -> (u16, reqwest::header::HeaderMap, String) {
    let mut request = agentmesh_testkit::http_client().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

async fn get_json(url: &str, token: Option<&str>) -> (u16, Value) {
    let (status, _, body) = get(url, token).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

async fn orchestrate(mesh: &Mesh, request_id: &str, token: Option<&str>) -> Value {
    let mut request = agentmesh_testkit::http_client()
        .post(format!("http://{}/api/v1/orchestrate", mesh.gateway))
        .json(&json!({"query": "What is the weather in Chicago?", "request_id": request_id}));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_serves_its_pages_and_the_mesh_as_json() {
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies(), Options::default()).await else { return };
    let agent = FakeAgent::start(vec![(
        "get_current_weather",
        // An output holding markup: the JSON carries it as text, for the page to show as text.
        Behavior::Always(Answer::ok(json!({"temp_c": 21, "note": "<script>alert(1)</script>"}))),
    )])
    .await
    .unwrap();
    mesh.register(&agent.registration("weather-tool-v2", &[("get_current_weather", None)])).await;
    let answer = orchestrate(&mesh, "req_console_1", None).await;
    let execution_id = answer["execution_id"].as_str().unwrap().to_owned();
    let base = format!("http://{}", mesh.gateway);

    // Pages: the shell, naming its page, under a policy that allows this origin only.
    for (path, page) in [
        ("/", "ask"),
        ("/executions", "executions"),
        (&format!("/executions/{execution_id}") as &str, "execution"),
        ("/agents", "agents"),
        ("/requests/req_console_1", "request"),
    ] {
        let (status, headers, body) = get(&format!("{base}{path}"), None).await;
        assert_eq!(status, 200, "{path}");
        assert!(headers["content-type"].to_str().unwrap().starts_with("text/html"), "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'self'"), "{csp}");
        assert!(body.contains(&format!(r#"data-page="{page}""#)), "{path}: {body}");
        assert!(!body.contains("http://") || body.contains("data-trace-url=\"http://localhost:16686"), "{body}");
    }
    let (status, headers, script) = get(&format!("{base}/console/assets/console.js"), None).await;
    assert_eq!(status, 200);
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/javascript"));
    assert!(!script.contains("innerHTML"), "the script renders text, never markup");
    let (_, _, styles) = get(&format!("{base}/console/assets/console.css"), None).await;
    // The page weight budget: everything but the data under 150 KiB.
    assert!(script.len() + styles.len() < 150 * 1024, "{} bytes", script.len() + styles.len());

    // Executions.
    let (status, list) = get_json(&format!("{base}/console/api/executions"), None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["executions"][0]["id"], execution_id.as_str());
    assert_eq!(list["executions"][0]["status"], "completed");
    let (_, filtered) = get_json(&format!("{base}/console/api/executions?status=failed"), None).await;
    assert_eq!(filtered["executions"], json!([]));
    let (status, bad) = get_json(&format!("{base}/console/api/executions?status=nonsense"), None).await;
    assert_eq!((status, bad["error"].as_str()), (400, Some("invalid_argument")));

    // One execution: its plan, every event, the layout.
    let (status, one) = get_json(&format!("{base}/console/api/executions/{execution_id}"), None).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["execution"]["request_id"], "req_console_1");
    assert_eq!(one["execution"]["plan"]["steps"][0]["step_id"], "s1");
    let kinds: Vec<&str> = one["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"execution_started"));
    assert_eq!(kinds.last(), Some(&"execution_completed"));
    let succeeded = one["events"].as_array().unwrap().iter().find(|e| e["kind"] == "step_succeeded").unwrap();
    assert_eq!(succeeded["output"]["note"], "<script>alert(1)</script>");
    assert_eq!(one["layout"]["nodes"][0]["id"], "s1");
    let (status, _) = get_json(&format!("{base}/console/api/executions/exe_nope"), None).await;
    assert_eq!(status, 404);

    // The catalog, with health.
    let (status, agents) = get_json(&format!("{base}/console/api/agents"), None).await;
    assert_eq!(status, 200, "{agents}");
    assert_eq!(agents["agents"][0]["agent_id"], "weather-tool-v2");
    assert_eq!(agents["agents"][0]["health_status"], "active");
    assert_eq!(agents["agents"][0]["skills"][0]["invocation_target"], "weather-tool-v2:skill:get_current_weather");

    // Catalog changes as they happen: ids and health, never an address.
    let mut watch = agentmesh_testkit::http_client()
        .get(format!("{base}/console/api/agents/events"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    mesh.register(&json!({"id": "late-agent", "base_url": "http://user:pw@127.0.0.1:9", "skills": [{"id": "x"}]}))
        .await;
    let mut seen = String::new();
    while !seen.contains("late-agent") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), watch.chunk()).await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(seen.contains("event: catalog_event") && seen.contains(r#""kind":"registered""#), "{seen}");
    assert!(!seen.contains("127.0.0.1:9") && !seen.contains("pw"), "{seen}");
    drop(watch);

    // The planner's interaction log of the request.
    let (status, interactions) =
        get_json(&format!("{base}/console/api/requests/req_console_1/interactions"), None).await;
    assert_eq!(status, 200, "{interactions}");
    let kinds: Vec<&str> =
        interactions["interactions"].as_array().unwrap().iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"plan"), "{kinds:?}");

    // A layout of a thousand steps.
    let steps: Vec<Value> = (0..1000)
        .map(|i| json!({"step_id": format!("s{i}"), "depends_on": if i == 0 { vec![] } else { vec![format!("s{}", i / 2)] }}))
        .collect();
    let laid = agentmesh_testkit::http_client()
        .post(format!("{base}/console/api/layout"))
        .json(&json!({"steps": steps}))
        .send()
        .await
        .unwrap();
    assert_eq!(laid.status(), 200);
    let laid: Value = laid.json().await.unwrap();
    assert_eq!(laid["nodes"].as_array().unwrap().len(), 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_on_pages_load_and_the_data_is_the_callers_own() {
    let tokens = agentmesh_e2e::Tokens::new("console");
    let (shop, billing, operator) = (tokens.shop.as_str(), tokens.billing.as_str(), tokens.operator.as_str());
    let options = tokens.options;
    let Some(mesh) = Mesh::start(Backend::Sqlite, replies(), options).await else { return };
    let agent = FakeAgent::start(vec![("get_current_weather", Behavior::Always(Answer::ok(json!({"temp_c": 21}))))])
        .await
        .unwrap();
    mesh.register(&agent.registration("weather-tool-v2", &[("get_current_weather", None)])).await;
    let answer = orchestrate(&mesh, "req_console_2", Some(shop)).await;
    let execution_id = answer["execution_id"].as_str().unwrap().to_owned();
    let base = format!("http://{}", mesh.gateway);

    let (status, _, _) = get(&format!("{base}/executions/{execution_id}"), None).await;
    assert_eq!(status, 200, "a page needs no token");
    let (status, refused) = get_json(&format!("{base}/console/api/executions"), None).await;
    assert_eq!(status, 401, "{refused}");
    let (_, own) = get_json(&format!("{base}/console/api/executions"), Some(shop)).await;
    assert_eq!(own["executions"][0]["id"], execution_id.as_str());
    let (_, others) = get_json(&format!("{base}/console/api/executions"), Some(billing)).await;
    assert_eq!(others["executions"], json!([]), "another client sees none of shop's executions");
    let (status, _) = get_json(&format!("{base}/console/api/executions/{execution_id}"), Some(billing)).await;
    assert_eq!(status, 403);
    let (status, _) = get_json(&format!("{base}/console/api/executions/{execution_id}"), Some(operator)).await;
    assert_eq!(status, 200);
    let (_, calls) = get_json(&format!("{base}/console/api/requests/req_console_2/interactions"), Some(billing)).await;
    assert_eq!(calls["interactions"], json!([]));
    let (_, calls) = get_json(&format!("{base}/console/api/requests/req_console_2/interactions"), Some(shop)).await;
    assert_eq!(calls["interactions"].as_array().map(Vec::len), Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_setting_turns_the_console_off() {
    let db = agentmesh_testkit::TestDatabase::sqlite();
    let listener = agentmesh_testkit::bind_local().await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = agentmesh_gateway::GatewayConfig {
        console: false,
        ..agentmesh_gateway::GatewayConfig::with_database_url(db.url.clone())
    };
    let task = tokio::spawn(agentmesh_gateway::serve_with_listener(config, listener, std::future::pending::<()>()));
    let http = agentmesh_testkit::http_client();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while http.get(format!("http://{addr}/healthz")).send().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline && !task.is_finished(), "the gateway did not start");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for path in ["/", "/executions", "/console/assets/console.js", "/console/api/executions"] {
        let (status, _, _) = get(&format!("http://{addr}{path}"), None).await;
        assert_eq!(status, 404, "{path}");
    }
    task.abort();
}
