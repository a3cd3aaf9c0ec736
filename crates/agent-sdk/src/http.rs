//! The HTTP transport: `POST /skills/{id}` and `POST /reasoners/{id}`, the
//! headers and answers of `docs/agents.md`.

use std::future::Future;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use crate::Server;
use crate::capability::{Call, Kind, Outcome};

/// Serves the agent's capabilities on `listener` until `shutdown`.
pub(crate) async fn serve(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let router = axum::Router::new().route("/{kind}/{id}", post(invoke)).with_state(server);
    if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(shutdown).await {
        tracing::error!(error = %e, "the agent's HTTP server stopped");
    }
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

/// The call as the executor's headers describe it.
fn call_of(headers: &HeaderMap) -> Call {
    let instruction = header(headers, "x-agentmesh-instruction");
    Call {
        request_id: header(headers, "x-request-id"),
        execution_id: header(headers, "x-agentmesh-execution-id"),
        step_id: header(headers, "x-agentmesh-step-id"),
        instruction: percent_encoding::percent_decode_str(&instruction).decode_utf8_lossy().into_owned(),
        idempotency_key: header(headers, "idempotency-key"),
        attempt: header(headers, "x-agentmesh-attempt").parse().unwrap_or(1),
        traceparent: header(headers, "traceparent"),
        ..Call::default()
    }
}

fn refuse(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message, "retryable": false }))).into_response()
}

async fn invoke(
    State(server): State<Arc<Server>>,
    Path((kind, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !server.admits(headers.get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes())) {
        return refuse(StatusCode::UNAUTHORIZED, format!("agent {} needs its credential", server.agent_id));
    }
    let kind = match kind.as_str() {
        "skills" => Kind::Skill,
        "reasoners" => Kind::Reasoner,
        _ => return refuse(StatusCode::NOT_FOUND, format!("no such path: /{kind}/{id}")),
    };
    let parameters: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(value @ Value::Object(_)) => value,
            Ok(_) => return refuse(StatusCode::BAD_REQUEST, "the body must be a JSON object of parameters".into()),
            Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("the body is not JSON: {e}")),
        }
    };
    let parent = agentmesh_telemetry::propagation::extract(&headers);
    match server.call(kind, &id, call_of(&headers), parameters, parent).await {
        None => refuse(StatusCode::NOT_FOUND, format!("agent {} has no capability `{id}`", server.agent_id)),
        Some(outcome @ Outcome::BadInput(_)) => (StatusCode::BAD_REQUEST, Json(outcome.envelope())).into_response(),
        Some(outcome) => Json(outcome.envelope()).into_response(),
    }
}
