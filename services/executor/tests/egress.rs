//! Egress that holds, one case per bypass found from outside: a redirect
//! to the metadata service, the mesh's own services registered as agents,
//! IPv6 spellings of denied IPv4 addresses, an endpoint that climbs out of
//! the base path, and a name that resolves into a denied network (over
//! HTTP and gRPC). Each case is refused at dispatch, naming why, and the
//! place it pointed at is never called.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent};
use common::{Mesh, event_for, options, plan, step};
use pb::ExecutionEventKind as Kind;
use serde_json::json;

fn failure(events: &[pb::ExecutionEvent], step: &str) -> String {
    event_for(events, Kind::StepFailed, step).error.clone()
}

async fn redirects_are_never_followed(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let elsewhere = FakeAgent::start(vec![("work", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    let agent = FakeAgent::start(vec![
        (
            "metadata",
            Behavior::Always(
                Answer::status(307, json!({})).with_header("location", "http://169.254.169.254/latest/meta-data/"),
            ),
        ),
        (
            "moved",
            Behavior::Always(
                Answer::status(302, json!({})).with_header("location", &format!("{}/skills/work", elsewhere.url())),
            ),
        ),
    ])
    .await
    .unwrap();
    mesh.register(&agent.registration("redirecting", &[("metadata", None), ("moved", None)])).await;
    let p = plan(vec![
        step("s1", "redirecting", "metadata", json!({}), &[]),
        step("s2", "redirecting", "moved", json!({}), &[]),
    ]);
    let events = mesh.run(p, options(2, 5_000)).await.unwrap();
    let s1 = failure(&events, "s1");
    assert!(s1.contains("HTTP 307 redirecting to http://169.254.169.254/latest/meta-data/"), "{s1}");
    assert!(s1.contains("do not follow redirects"), "{s1}");
    assert!(failure(&events, "s2").contains("HTTP 302"), "{events:?}");
    assert_eq!(agent.calls().len(), 2, "a redirect is final: not retried");
    assert!(elsewhere.calls().is_empty(), "a redirect was followed");
}

async fn the_mesh_itself_is_never_called_as_an_agent(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    // Discovery's own registration API, and the executor's own port.
    mesh.register(&json!({"id": "registrar", "base_url": mesh.discovery.url(), "skills": [
        {"id": "register", "description": "Registers", "endpoint": "/api/v1/agents"}]}))
        .await;
    mesh.register(&json!({"id": "myself", "base_url": format!("http://{}", mesh.executor), "skills": [
        {"id": "x", "description": "x"}]}))
        .await;
    let p = plan(vec![
        step("s1", "registrar", "register", json!({"id": "planted", "base_url": "http://evil.example"}), &[]),
        step("s2", "myself", "x", json!({}), &[]),
    ]);
    let events = mesh.run(p, options(0, 5_000)).await.unwrap();
    for s in ["s1", "s2"] {
        let error = failure(&events, s);
        assert!(error.contains("one of the mesh's own services"), "{s}: {error}");
    }
    let planted = agentmesh_testkit::http_client()
        .get(format!("{}/api/v1/agents/planted", mesh.discovery.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(planted.status(), 404, "step parameters became a registration");
}

async fn ipv6_spellings_of_denied_addresses_are_denied(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    for (id, base_url) in [
        ("compatible", "http://[::169.254.169.254]:80"),
        ("nat64", "http://[64:ff9b::a9fe:a9fe]:80"),
        ("mapped", "http://[::ffff:169.254.169.254]:80"),
    ] {
        mesh.register(&json!({"id": id, "base_url": base_url, "skills": [{"id": "x", "description": "x"}]})).await;
    }
    let p = plan(vec![
        step("s1", "compatible", "x", json!({}), &[]),
        step("s2", "nat64", "x", json!({}), &[]),
        step("s3", "mapped", "x", json!({}), &[]),
    ]);
    let events = mesh.run(p, options(0, 5_000)).await.unwrap();
    for s in ["s1", "s2", "s3"] {
        let error = failure(&events, s);
        assert!(error.contains("denied network"), "{s}: {error}");
    }
}

async fn an_endpoint_never_climbs_out_of_the_base_path(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let agent = FakeAgent::start(vec![("x", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    let registered = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents", mesh.discovery.url()))
        .json(&json!({"id": "tenant-a", "base_url": format!("{}/tenant/a/", agent.url()), "skills": [
            {"id": "x", "description": "x", "endpoint": "/../../admin"}]}))
        .send()
        .await
        .unwrap();
    if registered.status().is_success() {
        let events =
            mesh.run(plan(vec![step("s1", "tenant-a", "x", json!({}), &[])]), options(0, 5_000)).await.unwrap();
        let error = failure(&events, "s1");
        assert!(error.contains("`.` or `..` segments"), "{error}");
    }
    assert!(agent.calls().is_empty(), "a call left the base path");
}

async fn names_resolving_into_denied_networks_are_refused_over_http_and_grpc(backend: Backend) {
    // Loopback denied too: `localhost` resolves into it.
    let Some(mesh) = Mesh::start_with(backend, |c| c.egress_deny_private = true).await else { return };
    let agent = FakeAgent::start(vec![("x", Behavior::Echo(Duration::ZERO))]).await.unwrap();
    let port = agent.url().rsplit(':').next().unwrap().to_owned();
    for (id, transport) in [("by-name-http", "http"), ("by-name-grpc", "grpc")] {
        mesh.register(&json!({"id": id, "base_url": format!("http://localhost:{port}"), "transport": transport,
            "skills": [{"id": "x", "description": "x"}]}))
            .await;
    }
    let p =
        plan(vec![step("s1", "by-name-http", "x", json!({}), &[]), step("s2", "by-name-grpc", "x", json!({}), &[])]);
    let events = mesh.run(p, options(0, 5_000)).await.unwrap();
    for s in ["s1", "s2"] {
        let error = failure(&events, s);
        assert!(error.contains("denied network"), "{s}: {error}");
    }
    assert!(agent.calls().is_empty());
}

agentmesh_testkit::both_backends!(
    redirects_are_never_followed,
    the_mesh_itself_is_never_called_as_an_agent,
    ipv6_spellings_of_denied_addresses_are_denied,
    an_endpoint_never_climbs_out_of_the_base_path,
    names_resolving_into_denied_networks_are_refused_over_http_and_grpc,
);
