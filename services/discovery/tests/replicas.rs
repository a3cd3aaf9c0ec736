//! Replicas sharing one PostgreSQL database, and a database that goes away.

mod common;

use std::time::{Duration, Instant};

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{TcpProxy, TestDatabase, spawn_discovery};
use common::{Ctx, agent_ids, catalog};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Polls `check` on a fresh query every millisecond; returns how long it
/// took to hold, failing after 5 s.
async fn until(ctx: &Ctx, query: &str, check: impl Fn(&Value) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if check(&ctx.discover(query).await) {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{query}: not visible after 5s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `host:port` of a PostgreSQL URL (port 5432 when absent).
fn host_and_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    if authority.contains(':') { authority.to_owned() } else { format!("{authority}:5432") }
}

async fn replica(db: &TestDatabase) -> Ctx {
    let config = DiscoveryConfig::with_database_url(db.url.clone());
    let svc = spawn_discovery(config).await.unwrap_or_else(|e| panic!("{e:#}"));
    Ctx { svc, http: agentmesh_testkit::http_client(), db: TestDatabase::sqlite() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_one_replica_are_visible_on_another_within_100ms() {
    let Some(db) = TestDatabase::postgres().await else { return };
    let a = replica(&db).await;
    let b = replica(&db).await;
    // Warm b's cache so that only invalidation can make changes visible.
    assert_eq!(b.discover("").await["total_agents"], 0);
    assert_eq!(b.discover("").await["total_agents"], 0);

    a.register(&catalog()[2]).await;
    let registration = until(&b, "", |body| agent_ids(body) == ["agent-data-003"]).await;

    let (status, _) = a.post("/api/v1/agents/agent-data-003/heartbeat", &json!({"status": "degraded"})).await;
    assert_eq!(status, StatusCode::OK);
    let heartbeat = until(&b, "health_status=degraded", |body| agent_ids(body) == ["agent-data-003"]).await;

    let mut updated = catalog()[2].clone();
    updated["skills"][0]["id"] = json!("get_forecast");
    a.register(&updated).await;
    let update = until(&b, "skill=get_forecast", |body| agent_ids(body) == ["agent-data-003"]).await;

    assert_eq!(a.delete("/api/v1/agents/agent-data-003").await, StatusCode::NO_CONTENT);
    let removal = until(&b, "", |body| body["total_agents"] == 0).await;

    for (what, took) in
        [("registration", registration), ("heartbeat", heartbeat), ("update", update), ("removal", removal)]
    {
        eprintln!("{what} visible on the other replica after {took:?}");
        assert!(took < Duration::from_millis(100), "{what} took {took:?} to reach the other replica");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_serves_the_last_snapshot_and_reports_unhealthy() {
    let Some(db) = TestDatabase::postgres().await else { return };
    // Route the service's connections through a proxy that can be cut.
    let authority = host_and_port(&db.url);
    let target = tokio::net::lookup_host(&authority)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("cannot resolve {authority}"));
    let proxy = TcpProxy::start(target).await.unwrap_or_else(|e| panic!("{e}"));
    let url = db.url.replacen(&authority, &proxy.addr.to_string(), 1);
    let config = DiscoveryConfig { cache_ttl_secs: 0.0, ..DiscoveryConfig::with_database_url(url) };
    let svc = spawn_discovery(config).await.unwrap_or_else(|e| panic!("{e:#}"));
    let ctx = Ctx { svc, http: agentmesh_testkit::http_client(), db };
    ctx.register_catalog().await;
    assert_eq!(ctx.discover("").await["total_agents"], 3);

    proxy.cut();
    // With a TTL of zero every query wants a reload: once one has failed,
    // answers come from the last snapshot, flagged with a Warning header.
    let started = Instant::now();
    loop {
        let response =
            ctx.http.get(ctx.url("/api/v1/discovery/capabilities")).send().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(response.status(), StatusCode::OK, "served throughout the outage");
        if response.headers().contains_key("warning") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never flagged as stale");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..5 {
        let response =
            ctx.http.get(ctx.url("/api/v1/discovery/capabilities")).send().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().contains_key("warning"));
        let body: Value = response.json().await.unwrap_or_default();
        assert_eq!(body["total_agents"], 3);
    }
    assert!(ctx.metric("agentmesh_discovery_cache_stale_served_total").await >= 5.0);
    let (status, body) = ctx.post("/api/v1/agents", &catalog()[0]).await;
    assert_eq!((status, body["error"].clone()), (StatusCode::SERVICE_UNAVAILABLE, json!("unavailable")));

    // Readiness and gRPC health follow the store.
    let started = Instant::now();
    loop {
        let (status, _) = ctx.get("/readyz").await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "readiness never reported the outage");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let channel = tonic::transport::Channel::from_shared(ctx.svc.url())
        .unwrap_or_else(|e| panic!("{e}"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let check = tonic_health::pb::HealthCheckRequest { service: "agentmesh.v1.DiscoveryService".into() };
    let status = health.check(check.clone()).await.unwrap_or_else(|e| panic!("{e}")).into_inner().status;
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::NotServing as i32);

    proxy.restore();
    let started = Instant::now();
    loop {
        let (status, _) = ctx.get("/readyz").await;
        if status == StatusCode::OK {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "readiness never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = health.check(check).await.unwrap_or_else(|e| panic!("{e}")).into_inner().status;
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    ctx.register(&json!({"id": "after-outage", "base_url": "http://x:1"})).await;
    assert_eq!(ctx.discover("agent=after-outage").await["total_agents"], 1);
}
