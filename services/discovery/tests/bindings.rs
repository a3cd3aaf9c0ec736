//! An agent id bound to its first registration: a principal with the role
//! `agent:*` registers ids nobody holds, and the id is then its alone
//! (operators aside), over REST and gRPC, on both backends; the binding
//! outlives the agent's own deregistration and goes when an operator
//! removes it. Two first registrations racing: one wins.

mod common;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_testkit::Backend;
use common::Ctx;
use serde_json::{Value, json};

const OPERATOR: &str = "op-token-5e1d";
const TEAM_A: &str = "team-a-agents-token-19fa";
const TEAM_B: &str = "team-b-agents-token-7c02";

fn tokens_file(backend: Backend) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("agentmesh-bindings-{}-{backend:?}.toml", std::process::id()));
    let entries = [("ops", "operator", OPERATOR), ("team-a", "agent:*", TEAM_A), ("team-b", "agent:*", TEAM_B)];
    agentmesh_testkit::write_tokens_file(&path, &entries).unwrap_or_else(|e| panic!("{e}"));
    path
}

fn agent(id: &str) -> Value {
    json!({"id": id, "base_url": "http://10.0.0.7:9001", "skills": [{"id": "s", "description": "does s"}]})
}

async fn send(ctx: &Ctx, method: reqwest::Method, path: &str, token: &str, body: Option<&Value>) -> (u16, Value) {
    let mut request = ctx.http.request(method, ctx.url(path)).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn the_first_registration_binds_an_agent_id(backend: Backend) {
    let tokens = tokens_file(backend);
    let Some(ctx) = Ctx::start_with(backend, |c| c.service.auth_tokens_file = Some(tokens)).await else { return };
    use reqwest::Method;

    // Team A claims `weather`; team B can neither replace, heartbeat nor remove it.
    let (status, body) = send(&ctx, Method::POST, "/api/v1/agents", TEAM_A, Some(&agent("weather"))).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = send(&ctx, Method::POST, "/api/v1/agents", TEAM_B, Some(&agent("weather"))).await;
    assert_eq!(status, 403, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("`team-b` may not") && message.contains("bound to the principal"), "{body}");
    assert!(!body.to_string().contains(TEAM_B), "the token is never echoed: {body}");
    let (status, _) = send(&ctx, Method::POST, "/api/v1/agents/weather/heartbeat", TEAM_B, None).await;
    assert_eq!(status, 403);
    let (status, _) = send(&ctx, Method::DELETE, "/api/v1/agents/weather", TEAM_B, None).await;
    assert_eq!(status, 403);
    // The same over gRPC.
    let mut grpc = DiscoveryServiceClient::connect(ctx.svc.url()).await.unwrap_or_else(|e| panic!("{e}"));
    let with = |token: &str, id: &str| {
        let mut request = tonic::Request::new(pb::HeartbeatRequest { agent_id: id.into(), ..Default::default() });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap_or_else(|e| panic!("{e}")));
        request
    };
    let refused = grpc.heartbeat(with(TEAM_B, "weather")).await.err().map(|s| s.code());
    assert_eq!(refused, Some(tonic::Code::PermissionDenied));
    assert!(grpc.heartbeat(with(TEAM_A, "weather")).await.is_ok());

    // Team A deregisters (a shutdown) and registers again (a restart); B still cannot take the id.
    let (status, _) = send(&ctx, Method::DELETE, "/api/v1/agents/weather", TEAM_A, None).await;
    assert_eq!(status, 204);
    let (status, _) = send(&ctx, Method::POST, "/api/v1/agents", TEAM_B, Some(&agent("weather"))).await;
    assert_eq!(status, 403, "the id stays bound after its agent went away");
    let (status, _) = send(&ctx, Method::POST, "/api/v1/agents", TEAM_A, Some(&agent("weather"))).await;
    assert_eq!(status, 201);

    // An operator removing it frees the id.
    let (status, _) = send(&ctx, Method::DELETE, "/api/v1/agents/weather", OPERATOR, None).await;
    assert_eq!(status, 204);
    let (status, body) = send(&ctx, Method::POST, "/api/v1/agents", TEAM_B, Some(&agent("weather"))).await;
    assert_eq!(status, 201, "{body}");

    // An id registered by an operator is bound to nobody: agent:* cannot act on it.
    let (status, _) = send(&ctx, Method::POST, "/api/v1/agents", OPERATOR, Some(&agent("stocks"))).await;
    assert_eq!(status, 201);
    let (status, body) = send(&ctx, Method::POST, "/api/v1/agents/stocks/heartbeat", TEAM_A, None).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("did not register it"), "{body}");

    // Two first registrations of one id at once: exactly one wins.
    let contested = agent("contested");
    let (a, b) = tokio::join!(
        send(&ctx, Method::POST, "/api/v1/agents", TEAM_A, Some(&contested)),
        send(&ctx, Method::POST, "/api/v1/agents", TEAM_B, Some(&contested)),
    );
    let mut statuses = [a.0, b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 403], "{a:?} {b:?}");

    // An invalid registration binds nothing.
    let mut invalid = agent("fresh");
    invalid["base_url"] = json!("ftp://x");
    let (status, _) = send(&ctx, Method::POST, "/api/v1/agents", TEAM_A, Some(&invalid)).await;
    assert_eq!(status, 400);
    let (status, body) = send(&ctx, Method::POST, "/api/v1/agents", TEAM_B, Some(&agent("fresh"))).await;
    assert_eq!(status, 201, "{body}");
}

agentmesh_testkit::both_backends!(the_first_registration_binds_an_agent_id);
