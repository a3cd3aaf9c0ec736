//! Every REST error is the JSON error body, whatever part of the request is
//! wrong: an agent id in the path that is not valid UTF-8, a registration
//! that is not a JSON object.

#![allow(clippy::unwrap_used)]

mod common;

use agentmesh_testkit::Backend;
use common::Ctx;
use reqwest::StatusCode;
use serde_json::Value;

async fn send(ctx: &Ctx, method: reqwest::Method, path: &str, body: Option<&str>) -> (StatusCode, String, Value) {
    let mut request = ctx.http.request(method, ctx.url(path));
    if let Some(body) = body {
        request = request.header("content-type", "application/json").body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let text = response.text().await.unwrap();
    (status, content_type, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_paths_and_bodies_get_the_json_error_body() {
    let Some(ctx) = Ctx::start(Backend::Sqlite).await else { return };
    for (method, path) in [
        (reqwest::Method::GET, "/api/v1/agents/%FF%FE"),
        (reqwest::Method::DELETE, "/api/v1/agents/%FF%FE"),
        (reqwest::Method::POST, "/api/v1/agents/%FF%FE/heartbeat"),
    ] {
        let (status, content_type, body) = send(&ctx, method.clone(), path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {body}");
        assert!(content_type.starts_with("application/json"), "{method} {path}: {content_type} {body}");
        assert_eq!(body["error"], "invalid_parameter", "{body}");
        assert!(body["message"].as_str().unwrap().contains("agent id"), "{body}");
        assert!(body["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{body}");
    }
    for registration in ["[]", "[\"weather\", \"http://w:1\"]", "\"weather\"", "42"] {
        let (status, content_type, body) =
            send(&ctx, reqwest::Method::POST, "/api/v1/agents", Some(registration)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{registration}: {body}");
        assert!(content_type.starts_with("application/json"));
        assert_eq!(body["error"], "invalid_json", "{registration}: {body}");
        assert!(body["message"].as_str().unwrap().contains("must be a JSON object"), "{registration}: {body}");
    }
    let (status, _, _) = send(&ctx, reqwest::Method::GET, "/api/v1/agents/weather", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the array was not registered as agent `weather`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_with_a_null_status_is_refused_naming_the_field() {
    let Some(ctx) = Ctx::start(Backend::Sqlite).await else { return };
    ctx.register(&serde_json::json!({"id": "beating", "base_url": "http://b:1"})).await;
    let (status, _, body) =
        send(&ctx, reqwest::Method::POST, "/api/v1/agents/beating/heartbeat", Some("{\"status\": null}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        (body["error"].as_str(), body["details"]["parameter"].as_str()),
        (Some("invalid_parameter"), Some("status"))
    );
    assert!(body["message"].as_str().unwrap().contains("leave it out to report active"), "{body}");
    for accepted in ["", "{}", "{\"status\": \"degraded\"}"] {
        let (status, _, body) =
            send(&ctx, reqwest::Method::POST, "/api/v1/agents/beating/heartbeat", Some(accepted)).await;
        assert_eq!(status, StatusCode::OK, "{accepted}: {body}");
    }
}
