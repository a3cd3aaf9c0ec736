//! The gRPC API over a real socket: every RPC, WatchCatalog events, health
//! and reflection (v1 and v1alpha), on both backends.

mod common;

use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_testkit::Backend;
use common::{Ctx, catalog};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

async fn client(ctx: &Ctx) -> DiscoveryServiceClient<Channel> {
    DiscoveryServiceClient::connect(ctx.svc.url()).await.unwrap_or_else(|e| panic!("connect: {e}"))
}

fn weather_agent(id: &str) -> pb::Agent {
    let def = serde_json::from_value(catalog()[2].clone()).unwrap_or_else(|e| panic!("{e}"));
    let mut agent = agentmesh_discovery::convert::definition_to_pb(&def);
    agent.id = id.to_owned();
    agent
}

async fn rpc_lifecycle(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    let mut c = client(&ctx).await;
    let created = c
        .register_agent(pb::RegisterAgentRequest { agent: Some(weather_agent("weather-tool-v2")) })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    assert!(created.created);
    let again = c.register_agent(pb::RegisterAgentRequest { agent: Some(weather_agent("weather-tool-v2")) }).await;
    assert!(!again.unwrap_or_else(|e| panic!("{e}")).into_inner().created);

    let agent = c
        .get_agent(pb::GetAgentRequest { agent_id: "weather-tool-v2".into() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner()
        .agent
        .unwrap_or_default();
    assert_eq!(agent.skills[0].invocation_target, "weather-tool-v2:skill:get_current_weather");
    assert_eq!(agent.health_status, pb::HealthStatus::Active as i32);
    let schema =
        agentmesh_discovery::convert::struct_to_json(&agent.skills[0].input_schema.clone().unwrap_or_default());
    assert_eq!(schema["required"], json!(["location"]));

    let hb = c
        .heartbeat(pb::HeartbeatRequest {
            agent_id: "weather-tool-v2".into(),
            status: pb::HealthStatus::Degraded as i32,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    assert_eq!(hb.health_status, pb::HealthStatus::Degraded as i32);
    assert_eq!(hb.heartbeat_interval_seconds, 10);

    let missing = c.get_agent(pb::GetAgentRequest { agent_id: "nobody".into() }).await;
    assert_eq!(missing.err().map(|s| s.code()), Some(Code::NotFound));
    c.deregister_agent(pb::DeregisterAgentRequest { agent_id: "weather-tool-v2".into() })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let gone = c.deregister_agent(pb::DeregisterAgentRequest { agent_id: "weather-tool-v2".into() }).await;
    assert_eq!(gone.err().map(|s| s.code()), Some(Code::NotFound));
}

async fn invalid_registration_has_field_details(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    let mut c = client(&ctx).await;
    let mut agent = weather_agent("bad id");
    agent.base_url = "ftp://nowhere".into();
    let status = c
        .register_agent(pb::RegisterAgentRequest { agent: Some(agent) })
        .await
        .err()
        .unwrap_or_else(|| panic!("accepted"));
    assert_eq!(status.code(), Code::InvalidArgument);
    let fields: Vec<String> = status
        .get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default();
    assert_eq!(fields, ["id", "base_url"]);
    let status = c.register_agent(pb::RegisterAgentRequest { agent: None }).await.err().map(|s| s.code());
    assert_eq!(status, Some(Code::InvalidArgument));
}

async fn list_capabilities_structured_and_rendered(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    ctx.register_catalog().await;
    let c = client(&ctx).await;
    let list = |r: pb::ListCapabilitiesRequest| {
        let mut c = c.clone();
        async move { c.list_capabilities(r).await }
    };
    let all = list(pb::ListCapabilitiesRequest::default()).await.unwrap_or_else(|e| panic!("{e}")).into_inner();
    assert_eq!((all.total_agents, all.total_reasoners, all.total_skills), (3, 4, 4));
    assert!(all.rendered.is_empty());
    assert_eq!(all.pagination.map(|p| p.limit), Some(100));
    assert!(all.capabilities.iter().all(|a| a.reasoners.iter().chain(&a.skills).all(|s| s.input_schema.is_none())));

    let filtered = list(pb::ListCapabilitiesRequest {
        reasoner: Some("*research*".into()),
        include_input_schema: true,
        exclude_agents: vec!["agent-ml-002".into()],
        format: pb::RenderFormat::Compact as i32,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .into_inner();
    let ids: Vec<&str> = filtered.capabilities.iter().flat_map(|a| a.reasoners.iter().map(|r| r.id.as_str())).collect();
    assert_eq!(ids, ["deep_research", "web_researcher"]);
    assert!(filtered.capabilities[0].skills.is_empty());
    assert!(filtered.capabilities[0].reasoners[0].input_schema.is_some());
    let compact: serde_json::Value = serde_json::from_str(&filtered.rendered).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compact["reasoners"][0]["target"], "agent-research-001:deep_research");

    let xml = list(pb::ListCapabilitiesRequest { format: pb::RenderFormat::Xml as i32, ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    assert!(xml.rendered.starts_with("<?xml"));
    let internal =
        list(pb::ListCapabilitiesRequest { include_internal: true, skill: Some("orch*".into()), ..Default::default() })
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .into_inner();
    assert!(internal.capabilities[0].skills[0].internal);

    let too_many = list(pb::ListCapabilitiesRequest { limit: 501, ..Default::default() }).await.err();
    assert_eq!(too_many.map(|s| s.code()), Some(Code::InvalidArgument));
    let bad_health = list(pb::ListCapabilitiesRequest { health_status: 42, ..Default::default() }).await.err();
    assert_eq!(bad_health.map(|s| s.code()), Some(Code::InvalidArgument));
}

async fn next_event(stream: &mut tonic::Streaming<pb::WatchCatalogResponse>) -> pb::WatchCatalogResponse {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap_or_else(|_| panic!("no catalog event within 5s"))
        .unwrap_or_else(|| panic!("stream ended"))
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn watch_catalog_streams_every_change(backend: Backend) {
    let Some(ctx) = Ctx::start_with(backend, |c| c.heartbeat_interval_secs = 0.2).await else { return };
    ctx.register(&catalog()[1]).await;
    let mut c = client(&ctx).await;
    let mut stream = c
        .watch_catalog(pb::WatchCatalogRequest { include_snapshot: true })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    let first = next_event(&mut stream).await;
    assert_eq!((first.kind, first.agent_id.as_str()), (pb::CatalogEventKind::Registered as i32, "agent-ml-002"));

    ctx.register(&catalog()[2]).await;
    let e = next_event(&mut stream).await;
    assert_eq!((e.kind, e.agent_id.as_str()), (pb::CatalogEventKind::Registered as i32, "agent-data-003"));
    assert_eq!(e.agent.map(|a| a.skills.len()), Some(1));

    ctx.register(&catalog()[2]).await;
    let e = next_event(&mut stream).await;
    assert_eq!(e.kind, pb::CatalogEventKind::Updated as i32);

    // Silence: the sweep reports the derived change without any write.
    let e = next_event(&mut stream).await;
    assert_eq!(e.kind, pb::CatalogEventKind::HealthChanged as i32);
    assert_eq!(e.health_status, pb::HealthStatus::Degraded as i32);
    let e2 = next_event(&mut stream).await;
    assert_eq!(e2.kind, pb::CatalogEventKind::HealthChanged as i32);
    let degraded: Vec<String> = vec![e.agent_id, e2.agent_id];
    assert!(degraded.contains(&"agent-ml-002".to_owned()) && degraded.contains(&"agent-data-003".to_owned()));

    // A heartbeat brings one back.
    let (status, _) = ctx.post("/api/v1/agents/agent-data-003/heartbeat", &json!({})).await;
    assert!(status.is_success());
    let e = next_event(&mut stream).await;
    assert_eq!(
        (e.kind, e.agent_id.as_str(), e.health_status),
        (pb::CatalogEventKind::HealthChanged as i32, "agent-data-003", pb::HealthStatus::Active as i32)
    );

    assert_eq!(ctx.delete("/api/v1/agents/agent-data-003").await, reqwest::StatusCode::NO_CONTENT);
    loop {
        let e = next_event(&mut stream).await;
        if e.kind == pb::CatalogEventKind::Deregistered as i32 {
            assert_eq!(e.agent_id, "agent-data-003");
            assert!(e.agent.is_none());
            break;
        }
        // agent-ml-002 may go inactive meanwhile.
        assert_eq!((e.kind, e.agent_id.as_str()), (pb::CatalogEventKind::HealthChanged as i32, "agent-ml-002"));
    }
}

async fn health_and_reflection(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    let channel = Channel::from_shared(ctx.svc.url())
        .unwrap_or_else(|e| panic!("{e}"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["agentmesh.v1.DiscoveryService", ""] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest { service: service.into() })
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .into_inner()
            .status;
        assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "{service:?}");
    }

    use tonic_reflection::pb::{v1, v1alpha};
    let mut v1 = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut responses =
        v1.server_reflection_info(tokio_stream::iter([request])).await.unwrap_or_else(|e| panic!("{e}")).into_inner();
    let response = responses.next().await.unwrap_or_else(|| panic!("no reply")).unwrap_or_else(|e| panic!("{e}"));
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) = response.message_response
    else {
        panic!("unexpected v1 reply")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"agentmesh.v1.DiscoveryService".to_owned()), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health".to_owned()), "{names:?}");

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
            "agentmesh.v1.DiscoveryService".into(),
        )),
    };
    let mut responses = alpha
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_inner();
    let response = responses.next().await.unwrap_or_else(|| panic!("no reply")).unwrap_or_else(|e| panic!("{e}"));
    let Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(files)) =
        response.message_response
    else {
        panic!("unexpected v1alpha reply")
    };
    let file: prost_types::FileDescriptorProto =
        prost::Message::decode(files.file_descriptor_proto[0].as_slice()).unwrap_or_default();
    assert_eq!(file.name(), "agentmesh/v1/discovery.proto");
}

/// Answers share one encoded body per query and catalog state; a heartbeat,
/// a write, or the passing of a health boundary must each show at once.
async fn shared_answers_follow_heartbeats_writes_and_health(backend: Backend) {
    let Some(ctx) = Ctx::start_with(backend, |c| c.heartbeat_interval_secs = 0.2).await else {
        return;
    };
    let mut c = client(&ctx).await;
    c.register_agent(pb::RegisterAgentRequest { agent: Some(weather_agent("weather-tool-v2")) })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // On PostgreSQL the write also comes back as a notification; let it land.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut list = async || {
        c.list_capabilities(pb::ListCapabilitiesRequest::default()).await.unwrap_or_else(|e| panic!("{e}")).into_inner()
    };
    let first = list().await;
    let second = list().await;
    assert_eq!(first.capabilities, second.capabilities);
    let at = |r: &pb::ListCapabilitiesResponse| r.discovered_at.map(|t| (t.seconds, t.nanos)).unwrap_or_default();
    assert!(at(&second) > at(&first), "discovered_at is the time of each request, not of the shared body");
    let (_, metrics) = ctx.get("/metrics").await;
    let shared = metrics
        .as_str()
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("agentmesh_discovery_encoded_response_hits_total "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_default();
    assert!(shared >= 1, "the second answer reused the first body");

    // A heartbeat shows in the very next answer.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut c2 = client(&ctx).await;
    c2.heartbeat(pb::HeartbeatRequest { agent_id: "weather-tool-v2".into(), status: pb::HealthStatus::Active as i32 })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let beat = list().await;
    let heard = |r: &pb::ListCapabilitiesResponse| r.capabilities[0].last_heartbeat.map(|t| (t.seconds, t.nanos));
    assert!(heard(&beat) > heard(&first), "the heartbeat is visible");

    // With no write at all, crossing 3 silent intervals turns it degraded.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let silent = list().await;
    assert_eq!(silent.capabilities[0].health_status, pb::HealthStatus::Degraded as i32);
    assert_eq!(list().await.capabilities[0].health_status, pb::HealthStatus::Degraded as i32);

    // A registration shows at once.
    c2.register_agent(pb::RegisterAgentRequest { agent: Some(weather_agent("weather-tool-v3")) })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(list().await.capabilities.len(), 2);
}

/// A shared body depends only on the agents it shows, unless a health filter
/// makes every agent's health decide what it shows.
async fn a_heartbeat_stales_only_the_bodies_that_show_its_agent(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    let mut c = client(&ctx).await;
    for id in ["weather-tool-a", "weather-tool-b"] {
        c.register_agent(pb::RegisterAgentRequest { agent: Some(weather_agent(id)) })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let only_a = || pb::ListCapabilitiesRequest { agent_ids: vec!["weather-tool-a".into()], ..Default::default() };
    let active =
        || pb::ListCapabilitiesRequest { health_status: pb::HealthStatus::Active as i32, ..Default::default() };
    let shared = async || {
        let (_, metrics) = ctx.get("/metrics").await;
        metrics
            .as_str()
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("agentmesh_discovery_encoded_response_hits_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_default()
    };
    let mut ask = async |request: pb::ListCapabilitiesRequest| {
        c.list_capabilities(request).await.unwrap_or_else(|e| panic!("{e}")).into_inner()
    };
    ask(only_a()).await;
    ask(active()).await;
    let before = shared().await;
    let mut beat = client(&ctx).await;
    beat.heartbeat(pb::HeartbeatRequest {
        agent_id: "weather-tool-b".into(),
        status: pb::HealthStatus::Degraded as i32,
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a = ask(only_a()).await;
    assert_eq!(shared().await, before + 1, "agent b's heartbeat left the body showing only agent a shared");
    assert_eq!(a.capabilities.len(), 1);
    let filtered = ask(active()).await;
    assert_eq!(shared().await, before + 1, "the health-filtered body was rebuilt");
    let ids: Vec<&str> = filtered.capabilities.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["weather-tool-a"], "b reported itself degraded");
}

/// An answer naming no agent is shared like the others, but only for one
/// heartbeat interval, and never after an agent it would show registers.
async fn empty_answers_expire_and_follow_registrations(backend: Backend) {
    let Some(ctx) = Ctx::start_with(backend, |c| c.heartbeat_interval_secs = 0.5).await else { return };
    let mut c = client(&ctx).await;
    let late = || pb::ListCapabilitiesRequest { agent_ids: vec!["weather-tool-late".into()], ..Default::default() };
    let shared = async || ctx.metric("agentmesh_discovery_encoded_response_hits_total").await;
    let mut ask = async |request: pb::ListCapabilitiesRequest| {
        c.list_capabilities(request).await.unwrap_or_else(|e| panic!("{e}")).into_inner()
    };
    assert!(ask(late()).await.capabilities.is_empty());
    assert!(ask(late()).await.capabilities.is_empty());
    let before = shared().await;
    assert!(before >= 1.0, "the empty answer was shared");

    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(ask(late()).await.capabilities.is_empty());
    assert_eq!(shared().await, before, "an empty answer older than a heartbeat interval is rebuilt");

    assert!(ask(late()).await.capabilities.is_empty());
    let mut writer = client(&ctx).await;
    writer
        .register_agent(pb::RegisterAgentRequest { agent: Some(weather_agent("weather-tool-late")) })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let found = ask(late()).await;
    let ids: Vec<&str> = found.capabilities.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["weather-tool-late"], "the registration shows at once");
}

/// Open `WatchCatalog` streams are capped by `max_watch_streams`; a stream
/// that ends frees its slot, and the streams already open keep working.
async fn watch_streams_are_limited(backend: Backend) {
    let Some(ctx) = Ctx::start_with(backend, |c| c.max_watch_streams = 2).await else { return };
    // One connection for every stream, so that dropping one stream resets
    // only that stream.
    let c = client(&ctx).await;
    let open = || {
        let mut c = c.clone();
        async move { c.watch_catalog(pb::WatchCatalogRequest { include_snapshot: true }).await }
    };
    let mut first = open().await.unwrap_or_else(|e| panic!("{e}")).into_inner();
    let second = open().await.unwrap_or_else(|e| panic!("{e}")).into_inner();
    let refused = open().await.err().unwrap_or_else(|| panic!("a third stream was accepted over a limit of 2"));
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("max_watch_streams"), "the message names the setting: {}", refused.message());

    drop(second);
    // The server learns of the reset as it arrives.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut third = loop {
        match open().await {
            Ok(stream) => break stream.into_inner(),
            Err(status) if status.code() == Code::ResourceExhausted && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("the slot of the dropped stream was not freed: {status:?}"),
        }
    };

    assert_eq!(ctx.metric("agentmesh_discovery_watch_streams").await, 2.0);
    ctx.register(&catalog()[1]).await;
    for stream in [&mut first, &mut third] {
        let e = next_event(stream).await;
        assert_eq!((e.kind, e.agent_id.as_str()), (pb::CatalogEventKind::Registered as i32, "agent-ml-002"));
    }
}

agentmesh_testkit::both_backends!(
    watch_streams_are_limited,
    a_heartbeat_stales_only_the_bodies_that_show_its_agent,
    empty_answers_expire_and_follow_registrations,
    shared_answers_follow_heartbeats_writes_and_health,
    rpc_lifecycle,
    invalid_registration_has_field_details,
    list_capabilities_structured_and_rendered,
    watch_catalog_streams_every_change,
    health_and_reflection,
);
