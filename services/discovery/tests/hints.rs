//! Capability hints, registered over REST and over gRPC, read back through
//! every rendering: the REST agent view, the JSON, XML and compact
//! listings, `GetAgent` and `ListCapabilities`.

mod common;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_testkit::Backend;
use common::Ctx;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn shop() -> Value {
    json!({
        "id": "shop", "base_url": "http://127.0.0.1:9002",
        "skills": [
            {"id": "charge", "description": "Charges a card", "hints": {"idempotent": false, "open_world": true}},
            {"id": "browse", "description": "Lists products"},
        ],
    })
}

fn charge_hints() -> pb::CapabilityHints {
    pb::CapabilityHints { idempotent: Some(false), open_world: Some(true), ..Default::default() }
}

async fn hints_read_back_everywhere(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    ctx.register(&shop()).await;

    // The REST agent view: hints as registered, absent when undeclared.
    let (status, agent) = ctx.get("/api/v1/agents/shop").await;
    assert_eq!(status, StatusCode::OK, "{agent}");
    assert_eq!(agent["skills"][0]["hints"], json!({"idempotent": false, "open_world": true}));
    assert!(agent["skills"][1].get("hints").is_none(), "{agent}");

    // The listings: JSON and XML show them, compact stays minimal.
    let listed = ctx.discover("agent=shop").await;
    let skills = &listed["capabilities"][0]["skills"];
    assert_eq!(skills[0]["hints"], json!({"idempotent": false, "open_world": true}));
    assert!(skills[1].get("hints").is_none(), "{listed}");
    let xml = ctx.text("/api/v1/discovery/capabilities?agent=shop&format=xml").await;
    assert_eq!(xml.matches("<hints").count(), 1, "{xml}");
    assert!(xml.contains(r#"<hints idempotent="false" open_world="true"/>"#), "{xml}");
    let compact = ctx.discover("agent=shop&format=compact").await;
    assert!(compact["skills"][0].get("hints").is_none(), "{compact}");

    // gRPC: GetAgent and ListCapabilities carry them.
    let mut client = DiscoveryServiceClient::connect(ctx.svc.url()).await.unwrap_or_else(|e| panic!("connect: {e}"));
    let agent = client
        .get_agent(pb::GetAgentRequest { agent_id: "shop".into() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner()
        .agent
        .unwrap_or_default();
    assert_eq!(agent.skills[0].hints, Some(charge_hints()));
    assert_eq!(agent.skills[1].hints, None);
    let listing = client
        .list_capabilities(pb::ListCapabilitiesRequest {
            agent_ids: vec!["shop".into()],
            format: pb::RenderFormat::Json as i32,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    let listed = &listing.capabilities[0];
    assert_eq!((listed.skills[0].hints, listed.skills[1].hints), (Some(charge_hints()), None));
    let rendered: Value = serde_json::from_str(&listing.rendered).unwrap_or_default();
    assert_eq!(rendered["capabilities"][0]["skills"][0]["hints"], json!({"idempotent": false, "open_world": true}));

    // Registered over gRPC, read over REST.
    let mut agent = agent;
    agent.id = "shop-2".into();
    agent.skills[1].hints = Some(pb::CapabilityHints { read_only: Some(true), ..Default::default() });
    client.register_agent(pb::RegisterAgentRequest { agent: Some(agent) }).await.unwrap_or_else(|e| panic!("{e}"));
    let (_, again) = ctx.get("/api/v1/agents/shop-2").await;
    assert_eq!(again["skills"][0]["hints"], json!({"idempotent": false, "open_world": true}));
    assert_eq!(again["skills"][1]["hints"], json!({"read_only": true}));

    // An unknown hint is refused by name.
    let mut bad = shop();
    bad["skills"][0]["hints"] = json!({"readOnlyHint": true});
    let (status, body) = ctx.post("/api/v1/agents", &bad).await;
    assert_eq!((status, body["error"].clone()), (StatusCode::BAD_REQUEST, json!("invalid_json")), "{body}");
    assert_eq!(body["details"]["path"], "skills[0].hints.readOnlyHint", "{body}");
}

agentmesh_testkit::both_backends!(hints_read_back_everywhere);
