//! The REST API: registration, heartbeat, removal, lookup and the
//! capability query of the discovery API, plus /metrics and health probes.

use std::sync::Arc;
use std::time::Instant;

use agentmesh_core::{AgentDefinition, ReportedStatus};
use agentmesh_server::RequestId;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use crate::cache::{Encoded, Source};
use crate::encoded::Pieces;
use crate::error::DiscoveryError;
use crate::params::parse_query;
use crate::registry::Registry;
use crate::render::{agent_json, render, timestamp};

/// Shared state of the REST handlers.
#[derive(Clone)]
pub struct RestState {
    /// The registry.
    pub registry: Arc<Registry>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
}

/// An error with the request id it answers.
struct ApiError(DiscoveryError, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let ApiError(error, request_id) = self;
        let status = error.http_status();
        if status.is_server_error() {
            tracing::error!(request_id, error = %error, "request failed");
        } else {
            tracing::debug!(request_id, error = %error, "request rejected");
        }
        (status, Json(error.body(&request_id))).into_response()
    }
}

/// The REST routes.
pub fn router(state: RestState) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/api/v1/discovery/capabilities", get(capabilities))
        .route("/api/v1/agents", post(register))
        .route("/api/v1/agents/{id}", get(get_agent).delete(deregister))
        .route("/api/v1/agents/{id}/heartbeat", post(heartbeat))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(ready))
        // Bodies are read as bytes so that the limit answers in the API's shape.
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn capabilities(
    State(state): State<RestState>,
    RequestId(request_id): RequestId,
    RawQuery(raw): RawQuery,
) -> Response {
    let started = Instant::now();
    let metrics = state.registry.metrics();
    tracing::debug!(
        request_id,
        operation = "list_capabilities",
        filters = raw.as_deref().unwrap_or_default(),
        "discovery request received"
    );
    let (query, format) = match parse_query(raw.as_deref().unwrap_or_default()) {
        Ok(parsed) => parsed,
        Err(e) => {
            metrics.requests.with_label_values(&["json", "error"]).inc();
            return ApiError(e, request_id).into_response();
        }
    };
    // The body is rendered once per query and catalog state with a
    // placeholder time; each request puts its own `discovered_at` in.
    let result = state
        .registry
        .query_encoded(&query, format!("rest {} {query:?}", format.as_str()), |page| Encoded {
            body: render(format, page, &query, PLACEHOLDER_TIME).into(),
            counts: Encoded::counts_of(page),
        })
        .await;
    let elapsed = started.elapsed();
    metrics.duration.with_label_values(&[format.as_str()]).observe(elapsed.as_secs_f64());
    match result {
        Ok((Encoded { body, counts: [agents, reasoners, skills] }, source, shared)) => {
            let body = with_time(body, &timestamp(Utc::now()));
            metrics.requests.with_label_values(&[format.as_str(), "success"]).inc();
            tracing::info!(
                request_id,
                operation = "list_capabilities",
                filters = raw.as_deref().unwrap_or_default(),
                format = format.as_str(),
                agents,
                reasoners,
                skills,
                duration_ms = elapsed.as_secs_f64() * 1000.0,
                cache_hit = source == Source::Hit,
                shared_body = shared,
                "discovery request completed"
            );
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
            if source == Source::Stale {
                headers.insert(
                    "warning",
                    HeaderValue::from_static("110 - \"catalog served from cache: database unreachable\""),
                );
            }
            (StatusCode::OK, headers, body).into_response()
        }
        Err(e) => {
            metrics.requests.with_label_values(&[format.as_str(), "error"]).inc();
            ApiError(e, request_id).into_response()
        }
    }
}

/// The `discovered_at` a shared body is rendered with. Every format puts
/// `discovered_at` before anything else that holds a time, so the first
/// occurrence of this value is where the request's own time goes.
const PLACEHOLDER_TIME: DateTime<Utc> = DateTime::UNIX_EPOCH;

/// A shared body with the placeholder time replaced by `time`, sent without
/// copying the shared parts.
fn with_time(body: Bytes, time: &str) -> axum::body::Body {
    let placeholder = timestamp(PLACEHOLDER_TIME);
    let at = body.windows(placeholder.len()).position(|w| w == placeholder.as_bytes());
    let pieces = match at {
        Some(at) => Pieces::new([
            body.slice(..at),
            Bytes::copy_from_slice(time.as_bytes()),
            body.slice(at + placeholder.len()..),
        ]),
        None => Pieces::new([body]),
    };
    axum::body::Body::new(pieces)
}

/// Parses a JSON body into `T`, naming the path of the first problem.
fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, DiscoveryError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        DiscoveryError::InvalidJson { message: format!("{path}: {}", e.inner()), path }
    })
}

fn body_or_error(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, DiscoveryError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => DiscoveryError::PayloadTooLarge(limit),
        _ => DiscoveryError::InvalidJson { message: rejection.body_text(), path: ".".into() },
    })
}

/// The agent id of the path, or the error body saying what is wrong with it.
/// The agent id of a path (`/api/v1/agents/{id}…`) with the request's id;
/// a path that does not decode is refused in the REST error shape.
struct AgentPath {
    id: String,
    request_id: String,
    principal: agentmesh_server::Principal,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for AgentPath {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Response> {
        let RequestId(request_id) = RequestId::from_request_parts(parts, state).await.unwrap_or_else(|e| match e {});
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(Self { id, request_id, principal: agentmesh_server::principal_of(&parts.extensions) }),
            Err(rejection) => {
                let message = format!("the agent id in the path is not valid: {}", rejection.body_text());
                Err(ApiError(DiscoveryError::invalid("agent_id", "", message), request_id).into_response())
            }
        }
    }
}

/// A registration must be a JSON object: serde would also read an array as
/// the fields in order.
fn require_object(body: &[u8]) -> Result<(), DiscoveryError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        _ => Err(DiscoveryError::InvalidJson {
            message: "a registration must be a JSON object, such as {\"id\": \"weather-tool-v2\", \"base_url\": \"http://…\", \"skills\": […]}".into(),
            path: ".".into(),
        }),
    }
}

/// Reads and validates a registration document exactly as
/// `POST /api/v1/agents` does: a JSON object, every field of the right
/// type (the first wrong one named by its path), then every rule checked
/// at once. The CLI's `agents register` uses it too.
pub fn parse_registration(body: &[u8]) -> Result<AgentDefinition, DiscoveryError> {
    let definition = parse_document(body)?;
    agentmesh_core::validate_definition(&definition).map_err(DiscoveryError::Validation)?;
    Ok(definition)
}

/// A registration document read, not yet validated (the registry validates
/// and counts what it refuses).
fn parse_document(body: &[u8]) -> Result<AgentDefinition, DiscoveryError> {
    require_object(body)?;
    parse_body(body)
}

async fn register(
    State(state): State<RestState>,
    RequestId(request_id): RequestId,
    agentmesh_server::auth::Caller(principal): agentmesh_server::auth::Caller,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let body = body_or_error(body, state.max_body_bytes)?;
        let definition = parse_document(&body)?;
        state.registry.register(&principal, definition).await
    }
    .await;
    match result {
        Ok((record, created)) => {
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            let health =
                state.registry.policy().derive(record.last_heartbeat, record.reported_status, chrono::Utc::now());
            (status, Json(agent_json(&record, health))).into_response()
        }
        Err(e) => ApiError(e, request_id).into_response(),
    }
}

async fn get_agent(State(state): State<RestState>, AgentPath { id, request_id, .. }: AgentPath) -> Response {
    match state.registry.get(&id).await {
        Ok((record, health)) => Json(agent_json(&record, health)).into_response(),
        Err(e) => ApiError(e, request_id).into_response(),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody {
    /// Absent: `active`. Present: what the agent reports; `null` is refused
    /// rather than guessed at (it is neither a status nor "no change").
    #[serde(default, deserialize_with = "present")]
    status: Option<Option<ReportedStatus>>,
}

/// A field that is present, even as `null` (`Some(None)`), as opposed to
/// absent (`None`, through `default`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

async fn heartbeat(
    State(state): State<RestState>,
    AgentPath { id, request_id, principal }: AgentPath,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let body = body_or_error(body, state.max_body_bytes)?;
        let parsed: HeartbeatBody =
            if body.iter().all(u8::is_ascii_whitespace) { HeartbeatBody::default() } else { parse_body(&body)? };
        let status = match parsed.status {
            None => ReportedStatus::default(),
            Some(Some(status)) => status,
            Some(None) => {
                return Err(DiscoveryError::invalid(
                    "status",
                    "null",
                    "status must be \"active\" or \"degraded\"; leave it out to report active",
                ));
            }
        };
        state.registry.heartbeat(&principal, &id, status).await
    }
    .await;
    match result {
        Ok(record) => {
            let policy = state.registry.policy();
            let health = policy.derive(record.last_heartbeat, record.reported_status, chrono::Utc::now());
            Json(json!({
                "agent_id": id,
                "health_status": health.as_str(),
                "last_heartbeat": timestamp(record.last_heartbeat),
                "heartbeat_interval_seconds": policy.heartbeat_interval.as_secs_f64(),
            }))
            .into_response()
        }
        Err(e) => ApiError(e, request_id).into_response(),
    }
}

async fn deregister(State(state): State<RestState>, AgentPath { id, request_id, principal }: AgentPath) -> Response {
    match state.registry.deregister(&principal, &id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => ApiError(e, request_id).into_response(),
    }
}

async fn metrics(State(state): State<RestState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.registry.metrics().render()).into_response()
}

async fn ready(State(state): State<RestState>) -> Response {
    if *state.registry.store_healthy().borrow() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "not_ready", "reason": "agent store unreachable"})))
            .into_response()
    }
}
