//! Who may do what, with authentication on: discovery and the executor
//! read one tokens file (hashed tokens, each a principal with roles). An
//! agent registers, heartbeats and removes only its own id; a client
//! neither registers agents nor reads their addresses as registered; the
//! executor calls discovery with its own service token; a client reads,
//! lists, cancels and extends only the executions it started. Refusals say
//! what was missing and never quote the token; the probes need none.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent};
use common::{Mesh, event_for, options, plan, request, step};
use pb::ExecutionEventKind as Kind;
use serde_json::{Value, json};

const OPERATOR: &str = "op-token-7f3a";
const SHOP: &str = "shop-token-91c2";
const BILLING: &str = "billing-token-5d0e";
const WEATHER: &str = "weather-agent-token-2b8c";
const EXECUTOR: &str = "executor-service-token-c4a1";

fn tokens_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens.toml");
    agentmesh_testkit::write_tokens_file(
        &path,
        &[
            ("ops", "operator", OPERATOR),
            ("shop", "client", SHOP),
            ("billing", "client", BILLING),
            ("weather", "agent:weather-tool-v2", WEATHER),
            ("executor", "service", EXECUTOR),
        ],
    )
    .unwrap();
    path
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

async fn send(method: reqwest::Method, url: &str, token: Option<&str>, body: Option<&Value>) -> (u16, Value) {
    let mut request = agentmesh_testkit::http_client().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn roles_are_enforced_on_discovery_and_the_executor(backend: Backend) {
    let dir = std::env::temp_dir().join(format!("agentmesh-auth-{}-{backend:?}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = tokens_file(&dir);
    let (for_discovery, for_executor) = (tokens.clone(), tokens.clone());
    let Some(mesh) = Mesh::start_configured(
        backend,
        |d| d.service.auth_tokens_file = Some(for_discovery),
        |e| {
            e.service.auth_tokens_file = Some(for_executor);
            e.service.auth_token = Some(EXECUTOR.into());
        },
    )
    .await
    else {
        return;
    };
    let agent = FakeAgent::start(vec![("get_current_weather", Behavior::Always(Answer::ok(json!({"temp_c": 21}))))])
        .await
        .unwrap();
    let agents = format!("{}/api/v1/agents", mesh.discovery.url());
    let weather = json!({"id": "weather-tool-v2", "base_url": agent.url().replace("http://", "http://weather:pw-9@"),
        "skills": [{"id": "get_current_weather"}]});

    // Discovery: no token, a client's, another agent's id: refused, saying why.
    let (status, body) = send(reqwest::Method::POST, &agents, None, Some(&weather)).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("unauthenticated")), "{body}");
    let (status, body) = send(reqwest::Method::POST, &agents, Some("guessed-token"), Some(&weather)).await;
    assert_eq!(status, 401, "{body}");
    assert!(!body.to_string().contains("guessed-token"), "the token is never quoted: {body}");
    let (status, body) = send(reqwest::Method::POST, &agents, Some(SHOP), Some(&weather)).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["message"].as_str().unwrap().contains("`shop` may not make this call"), "{body}");
    let stocks = json!({"id": "stock-quotes", "base_url": agent.url(), "skills": [{"id": "quote"}]});
    let (status, body) = send(reqwest::Method::POST, &agents, Some(WEATHER), Some(&stocks)).await;
    assert_eq!((status, body["error"].as_str()), (403, Some("permission_denied")), "{body}");
    // The agent's own id: registered, heartbeat, and the probes need no token.
    let (status, body) = send(reqwest::Method::POST, &agents, Some(WEATHER), Some(&weather)).await;
    assert_eq!(status, 201, "{body}");
    let (status, _) =
        send(reqwest::Method::POST, &format!("{agents}/weather-tool-v2/heartbeat"), Some(WEATHER), None).await;
    assert_eq!(status, 200);
    let (status, _) = send(reqwest::Method::GET, &format!("{}/healthz", mesh.discovery.url()), None, None).await;
    assert_eq!(status, 200);

    // A client reads the catalog, never an agent's credentials, never the watch.
    let mut discovery = DiscoveryServiceClient::connect(mesh.discovery.url()).await.unwrap();
    let got = discovery
        .get_agent(with_token(pb::GetAgentRequest { agent_id: "weather-tool-v2".into() }, SHOP))
        .await
        .unwrap()
        .into_inner();
    assert!(got.agent.unwrap().base_url.contains("weather:***@"), "a client saw the agent's password");
    let refused = discovery.watch_catalog(with_token(pb::WatchCatalogRequest::default(), SHOP)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let refused = discovery.get_agent(pb::GetAgentRequest { agent_id: "weather-tool-v2".into() }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // The executor finds the agent with its own service token and calls it
    // with the address as registered; the execution is shop's.
    let mut executor = mesh.client.clone();
    let p = plan(vec![step("s1", "weather-tool-v2", "get_current_weather", json!({}), &[])]);
    let refused = executor.execute(request(p.clone(), options(0, 5000))).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut stream = executor.execute(with_token(request(p, options(0, 5000)), SHOP)).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        events.push(item.event.unwrap());
    }
    event_for(&events, Kind::StepSucceeded, "s1");
    assert_eq!(agent.calls_to("get_current_weather").len(), 1);
    let id = events[0].execution_id.clone();

    // Only shop (and operators) read, list and cancel it.
    let get = |token: &'static str| {
        let (mut executor, id) = (executor.clone(), id.clone());
        async move { executor.get_execution(with_token(pb::GetExecutionRequest { execution_id: id }, token)).await }
    };
    assert!(get(SHOP).await.is_ok());
    assert!(get(OPERATOR).await.is_ok());
    let refused = get(BILLING).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("`billing` may not read, cancel or extend"), "{}", refused.message());
    let cancel = pb::CancelExecutionRequest { execution_id: id.clone(), reason: String::new() };
    let refused = executor.cancel_execution(with_token(cancel, BILLING)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let extend = pb::ExtendExecutionRequest {
        execution_id: id.clone(),
        steps: vec![agentmesh_proto::convert::step_to_pb(
            &serde_json::from_value(step("s2", "weather-tool-v2", "get_current_weather", json!({}), &[])).unwrap(),
        )],
        ..Default::default()
    };
    let refused = executor.extend_execution(with_token(extend, BILLING)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let listed = |token: &'static str| {
        let mut executor = executor.clone();
        async move {
            let list = executor.list_executions(with_token(pb::ListExecutionsRequest::default(), token)).await;
            list.unwrap().into_inner().executions.into_iter().map(|e| e.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(SHOP).await, std::slice::from_ref(&id));
    assert!(listed(BILLING).await.is_empty());
    assert_eq!(listed(OPERATOR).await, [id]);
    assert_eq!(agent.calls_to("get_current_weather").len(), 1, "nothing refused reached the agent");
    let _ = std::fs::remove_dir_all(&dir);
}

agentmesh_testkit::both_backends!(roles_are_enforced_on_discovery_and_the_executor);
