//! Limits that say so: a schema nested deeper than every consumer can
//! decode is refused at registration (REST and gRPC alike), a message too
//! deep to decode is the client's `INVALID_ARGUMENT`, and the port holds
//! its connections and open calls to their counts, refusing the next one
//! at once instead of leaving it hanging.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_testkit::Backend;
use common::Ctx;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// A schema `levels` objects deep.
fn nested_schema(levels: usize) -> Value {
    let mut schema = json!({"type": "string"});
    for _ in 1..levels.div_ceil(2) {
        schema = json!({"type": "object", "properties": {"a": schema}});
    }
    schema
}

async fn client(ctx: &Ctx) -> DiscoveryServiceClient<Channel> {
    DiscoveryServiceClient::connect(ctx.svc.url()).await.unwrap()
}

fn grpc_registration(id: &str, schema: &Value) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest {
        agent: Some(pb::Agent {
            id: id.into(),
            base_url: "http://deep:1".into(),
            skills: vec![pb::Capability {
                id: "s".into(),
                input_schema: agentmesh_proto::json::to_struct(schema),
                ..Default::default()
            }],
            ..Default::default()
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_too_deep_for_any_consumer_is_refused_and_the_catalog_stays_readable() {
    let Some(ctx) = Ctx::start(Backend::Sqlite).await else { return };
    let depth = agentmesh_core::validate::MAX_JSON_DEPTH;
    // The deepest accepted schema, listed and watched over gRPC with its
    // schema: every consumer decodes it.
    let ok = json!({"id": "deep-ok", "base_url": "http://deep:1",
        "skills": [{"id": "s", "input_schema": nested_schema(depth)}]});
    ctx.register(&ok).await;
    let mut grpc = client(&ctx).await;
    let listed = grpc
        .list_capabilities(pb::ListCapabilitiesRequest { include_input_schema: true, ..Default::default() })
        .await
        .unwrap_or_else(|s| panic!("the catalog cannot be listed: {s:?}"))
        .into_inner();
    assert_eq!(listed.capabilities.len(), 1);
    let mut watch = grpc.watch_catalog(pb::WatchCatalogRequest { include_snapshot: true }).await.unwrap().into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.unwrap();
    assert!(first.is_ok_and(|m| m.is_some()), "the catalog cannot be watched");
    drop(watch);

    // 18 `properties` deep (the depth that once stopped all planning): refused.
    let (status, body) = ctx
        .post(
            "/api/v1/agents",
            &json!({"id": "deep", "base_url": "http://deep:1", "skills": [{"id": "s", "input_schema": nested_schema(37)}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let text = body.to_string();
    assert!(text.contains("skills[0].input_schema") && text.contains(&format!("at most {depth}")), "{text}");
    let refused = grpc.register_agent(grpc_registration("deep", &nested_schema(depth + 2))).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("skills[0].input_schema"), "{}", refused.message());

    // Too deep to decode at all: the client's error, saying what is allowed.
    let undecodable = grpc.register_agent(grpc_registration("deeper", &nested_schema(90))).await.unwrap_err();
    assert_eq!(undecodable.code(), tonic::Code::InvalidArgument, "{undecodable:?}");
    assert!(undecodable.message().contains(&format!("at most {depth} levels")), "{}", undecodable.message());
    let (status, _) = ctx.get("/api/v1/agents/deep").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_max_open_calls_is_refused_at_once_and_probes_still_answer() {
    let Some(ctx) = Ctx::start_with(Backend::Sqlite, |c| c.service.max_open_calls = 1).await else { return };
    let mut grpc = client(&ctx).await;
    // A watch holds its call open.
    let mut watch = grpc.watch_catalog(pb::WatchCatalogRequest { include_snapshot: true }).await.unwrap().into_inner();
    let _ = tokio::time::timeout(Duration::from_secs(5), watch.message()).await;
    let refused = grpc.list_capabilities(pb::ListCapabilitiesRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("max_open_calls"), "{}", refused.message());
    let (status, body) = ctx.get("/api/v1/discovery/capabilities").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "overloaded", "{body}");
    let (status, _) = ctx.get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "probes are never refused");
    // The watch ends: its slot is free again.
    drop(watch);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if grpc.list_capabilities(pb::ListCapabilitiesRequest::default()).await.is_ok() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the watch's slot was never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the server closes `stream` within `within` (it reads EOF or an
/// error; nothing was sent).
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let closed = async {
        let mut byte = [0u8; 1];
        loop {
            if stream.readable().await.is_err() {
                return true;
            }
            match stream.try_read(&mut byte) {
                Ok(0) => return true,
                Ok(_) => return false,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return true,
            }
        }
    };
    tokio::time::timeout(within, closed).await.unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_count_are_closed_at_once_and_silent_ones_after_the_idle_timeout() {
    let Some(ctx) = Ctx::start_with(Backend::Sqlite, |c| {
        c.service.max_connections = 2;
        c.service.idle_timeout_secs = 1.0;
    })
    .await
    else {
        return;
    };
    // spawn_discovery's readiness client may still hold a connection.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let addr = ctx.svc.addr;
    let mut first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut third, Duration::from_millis(900)).await, "the third connection was left hanging");
    // The two silent ones are closed once idle for a second.
    assert!(closed_within(&mut first, Duration::from_secs(5)).await, "an idle connection stayed open");
    assert!(closed_within(&mut second, Duration::from_secs(5)).await, "an idle connection stayed open");
    // Their places are free again.
    let (status, _) = ctx.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

/// A caller whose calls fill a connection's streams opens another
/// connection instead of waiting for a stream without a word: with one
/// stream per connection, three watches over one connection stall the
/// third; over the pool every service uses, all three open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_a_connections_streams_go_over_another_connection() {
    let Some(ctx) = Ctx::start_with(Backend::Sqlite, |c| c.service.max_streams_per_connection = 1).await else {
        return;
    };
    let endpoint = tonic::transport::Endpoint::from_shared(ctx.svc.url()).unwrap();
    async fn open_watches<T>(mut grpc: DiscoveryServiceClient<T>, n: usize) -> usize
    where
        T: tonic::client::GrpcService<tonic::body::Body> + Clone,
        T::Error: Into<tonic::codegen::StdError>,
        T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
        <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
    {
        let mut open = Vec::new();
        for _ in 0..n {
            let watch = grpc.watch_catalog(pb::WatchCatalogRequest { include_snapshot: true });
            match tokio::time::timeout(Duration::from_secs(3), watch).await {
                Ok(Ok(stream)) => open.push(stream.into_inner()),
                _ => break,
            }
        }
        open.len()
    }
    let one_connection = DiscoveryServiceClient::new(endpoint.connect_lazy());
    assert_eq!(open_watches(one_connection, 2).await, 1, "one connection: the second call waits for a stream");
    let pool = agentmesh_telemetry::pool::Pool::with_limits("discovery", 1, 4, || endpoint.connect_lazy());
    let pooled = DiscoveryServiceClient::new(pool.clone());
    assert_eq!(open_watches(pooled, 3).await, 3, "the pool opened a connection per stream: {pool:?}");
}
