//! `POST /api/v1/orchestrate`: the gRPC `Orchestrate` for HTTP clients.
//! `Accept: text/event-stream` streams the same messages as server-sent
//! events (`id:` the sequence, `event:` the kind, `data:` the JSON form);
//! otherwise the answer comes in one JSON body once it is complete. Errors
//! use the REST error shape (`error`, `message`, `details`, `request_id`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::json::from_value;
use agentmesh_proto::v1 as pb;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use pb::orchestrate_response::Event;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use crate::json;
use crate::service::Shared;
use agentmesh_server::RequestId;
use agentmesh_telemetry::rpc::code_name;

/// The request body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Body {
    /// The natural-language request.
    pub query: String,
    /// Request id; else the `x-request-id` header's, else a new one.
    #[serde(default)]
    pub request_id: Option<String>,
    /// The calling orchestrator's own agent ids, never planned for.
    #[serde(default)]
    pub caller_agent_ids: Vec<String>,
    /// Preferred model or alias for every LLM stage.
    #[serde(default)]
    pub model: String,
    /// `minimal`, `low`, `medium` or `high`.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// Review-driven recovery rounds allowed.
    #[serde(default)]
    pub review_budget: Option<u32>,
    /// Further tuning.
    #[serde(default)]
    pub options: Options,
}

/// `options` of the request body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// Agent ids never to plan for.
    #[serde(default)]
    pub exclude_agents: Vec<String>,
    /// `agent-pattern:capability-pattern` wildcards the plan may use.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Also plan over inactive agents.
    #[serde(default)]
    pub include_unhealthy: bool,
    /// Skip the review.
    #[serde(default)]
    pub skip_review: bool,
    /// Extra context for planning (a JSON object, treated as data).
    #[serde(default)]
    pub context: Option<serde_json::Map<String, Value>>,
    /// Execution tuning.
    #[serde(default)]
    pub execution: Option<ExecutionOptions>,
}

/// `options.execution` of the request body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionOptions {
    /// Steps run at once.
    #[serde(default)]
    pub max_concurrency: u32,
    /// Milliseconds per step attempt.
    #[serde(default)]
    pub step_timeout_ms: u64,
    /// Retries per step.
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// Loop-back replans allowed.
    #[serde(default)]
    pub replan_budget: Option<u32>,
}

fn effort(name: Option<&str>) -> Result<i32, String> {
    Ok(match name {
        None | Some("") => pb::ReasoningEffort::Unspecified,
        Some("minimal") => pb::ReasoningEffort::Minimal,
        Some("low") => pb::ReasoningEffort::Low,
        Some("medium") => pb::ReasoningEffort::Medium,
        Some("high") => pb::ReasoningEffort::High,
        Some(other) => return Err(format!("reasoning_effort `{other}` must be minimal, low, medium or high")),
    } as i32)
}

impl Body {
    /// The gRPC request it stands for.
    pub fn into_request(self) -> Result<pb::OrchestrateRequest, String> {
        let options = self.options;
        Ok(pb::OrchestrateRequest {
            request_id: self.request_id.unwrap_or_default(),
            query: self.query,
            caller_agent_ids: self.caller_agent_ids,
            model: self.model,
            reasoning_effort: effort(self.reasoning_effort.as_deref())?,
            review_budget: self.review_budget,
            options: Some(pb::OrchestrateOptions {
                execution: options.execution.map(|e| pb::ExecutionOptions {
                    max_concurrency: e.max_concurrency,
                    step_timeout_ms: e.step_timeout_ms,
                    max_retries: e.max_retries,
                    replan_budget: e.replan_budget,
                }),
                exclude_agents: options.exclude_agents,
                allow: options.allow,
                include_unhealthy: options.include_unhealthy,
                skip_review: options.skip_review,
                context: options.context.and_then(|c| agentmesh_proto::json::to_struct(&Value::Object(c))),
            }),
        })
    }
}

fn http_status(code: &str) -> StatusCode {
    match code {
        "INVALID_ARGUMENT" | "OUT_OF_RANGE" => StatusCode::BAD_REQUEST,
        "NOT_FOUND" => StatusCode::NOT_FOUND,
        "FAILED_PRECONDITION" => StatusCode::UNPROCESSABLE_ENTITY,
        "RESOURCE_EXHAUSTED" => StatusCode::TOO_MANY_REQUESTS,
        "DEADLINE_EXCEEDED" => StatusCode::GATEWAY_TIMEOUT,
        "UNAVAILABLE" => StatusCode::SERVICE_UNAVAILABLE,
        "UNAUTHENTICATED" => StatusCode::UNAUTHORIZED,
        "PERMISSION_DENIED" => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_GATEWAY,
    }
}

fn error(status: StatusCode, code: &str, message: &str, details: Option<Value>, request_id: &str) -> Response {
    let body = agentmesh_server::error_body(code, message, details, request_id);
    (status, Json(body)).into_response()
}

/// The handler.
pub async fn orchestrate(
    State(shared): State<Arc<Shared>>,
    request_id: RequestId,
    agentmesh_server::auth::Caller(principal): agentmesh_server::auth::Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let RequestId(request_id) = request_id;
    let parsed: Body = match serde_json::from_slice::<Value>(&body) {
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                &format!("the body is not JSON: {e}"),
                None,
                &request_id,
            );
        }
        Ok(Value::Object(map)) => match serde_json::from_value(Value::Object(map)) {
            Ok(body) => body,
            Err(e) => {
                return error(StatusCode::BAD_REQUEST, "validation_failed", &e.to_string(), None, &request_id);
            }
        },
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "validation_failed",
                "the body must be a JSON object such as {\"query\": \"What is the weather in Chicago?\"}",
                None,
                &request_id,
            );
        }
    };
    if let Some(after) = headers.get("last-event-id") {
        // A reconnect: resume the stream of the request id it names.
        let Some(after) = after.to_str().ok().and_then(|v| v.trim().parse::<i64>().ok()).filter(|n| *n >= 0) else {
            return error(
                StatusCode::BAD_REQUEST,
                "validation_failed",
                "Last-Event-ID must be a sequence number",
                None,
                &request_id,
            );
        };
        let Some(id) = parsed.request_id.clone().filter(|id| !id.is_empty()) else {
            return error(
                StatusCode::BAD_REQUEST,
                "validation_failed",
                "to resume with Last-Event-ID, send the stream's request id in the body's request_id",
                None,
                &request_id,
            );
        };
        return resume_stream(&shared, id, after, &principal).await;
    }
    let request = match parsed.into_request() {
        Ok(request) => request,
        Err(message) => return error(StatusCode::BAD_REQUEST, "validation_failed", &message, None, &request_id),
    };
    if !request.request_id.is_empty()
        && let Err(message) = agentmesh_server::check_request_id(&request.request_id)
    {
        return error(StatusCode::BAD_REQUEST, "validation_failed", &message, None, &request_id);
    }
    let request = pb::OrchestrateRequest {
        request_id: if request.request_id.is_empty() { request_id.clone() } else { request.request_id },
        ..request
    };
    let started = match shared.start(request, None, &principal).await {
        Ok(started) => started,
        Err(status) => {
            let code = code_name(status.code());
            let (http, name) = if code == "ALREADY_EXISTS" {
                (StatusCode::CONFLICT, "already_exists")
            } else {
                (http_status(code), "validation_failed")
            };
            return error(http, name, status.message(), None, &request_id);
        }
    };
    let wants_events = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"));
    let mut response = if wants_events {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(shared.clone().relay(started.request_id.clone(), started.messages, tx));
        let events = ReceiverStream::new(rx).map(|m| {
            let (name, data) = json::message(&m);
            Ok::<_, Infallible>(SseEvent::default().id(m.sequence.to_string()).event(name).data(data.to_string()))
        });
        Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
    } else {
        whole(started.messages, &started.request_id, started.trace_id.as_deref()).await
    };
    if let Some(value) = started.trace_id.and_then(|t| t.parse().ok()) {
        response.headers_mut().insert("x-trace-id", value);
    }
    response
}

/// `GET /api/v1/orchestrations/{request_id}/events`: the stored messages
/// after `Last-Event-ID` (or `?after=N`; else from the start) as
/// server-sent events, then new ones until the last.
pub async fn resume(
    State(shared): State<Arc<Shared>>,
    agentmesh_server::auth::Caller(principal): agentmesh_server::auth::Caller,
    Path(request_id): Path<String>,
    Query(query): Query<ResumeQuery>,
    headers: HeaderMap,
) -> Response {
    let header = headers.get("last-event-id").map(|v| v.to_str().ok().and_then(|v| v.trim().parse::<i64>().ok()));
    let after = match (header, query.after) {
        (Some(Some(n)), _) | (None, Some(n)) if n >= 0 => n,
        (None, None) => 0,
        _ => {
            let id = headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
            return error(
                StatusCode::BAD_REQUEST,
                "validation_failed",
                "Last-Event-ID must be a sequence number",
                None,
                id,
            );
        }
    };
    resume_stream(&shared, request_id, after, &principal).await
}

/// `?after=N` of a resume.
#[derive(Debug, Deserialize)]
pub struct ResumeQuery {
    /// Resume after this sequence number.
    after: Option<i64>,
}

async fn resume_stream(
    shared: &Arc<Shared>,
    request_id: String,
    after: i64,
    principal: &agentmesh_server::Principal,
) -> Response {
    // The id is quoted in answers and logs: held to what a header's must be.
    if let Err(message) = agentmesh_server::check_request_id(&request_id) {
        return error(
            StatusCode::BAD_REQUEST,
            "validation_failed",
            &message,
            None,
            &agentmesh_server::new_request_id(),
        );
    }
    let Some(owner) = shared.owner(&request_id).await else {
        let message = format!(
            "no orchestration `{request_id}` is kept (messages are kept for event_retention_secs after they are sent)"
        );
        return error(StatusCode::NOT_FOUND, "not_found", &message, None, &request_id);
    };
    if !principal.owns(&owner) {
        let message =
            format!("`{}` may not follow orchestration `{request_id}`: another principal started it", principal.name);
        return error(StatusCode::FORBIDDEN, "permission_denied", &message, None, &request_id);
    }
    shared.metrics.resumed.inc();
    tracing::info!(request_id, after, "resuming an orchestration stream");
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let following = shared.follow(&request_id);
    let follow = crate::events::follow(shared.log.clone(), request_id, after, shared.request_timeout, tx);
    tokio::spawn(async move {
        follow.await;
        drop(following);
    });
    let events = ReceiverStream::new(rx)
        .map(|e| Ok::<_, Infallible>(SseEvent::default().id(e.sequence.to_string()).event(e.kind).data(e.data)));
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

/// Reads every message and answers with the outcome in one body.
async fn whole(
    mut messages: tokio::sync::mpsc::Receiver<pb::OrchestrateResponse>,
    request_id: &str,
    trace_id: Option<&str>,
) -> Response {
    let mut plan = Value::Null;
    let mut zero_step_reason = String::new();
    let mut steps: BTreeMap<String, Value> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut review = Value::Null;
    while let Some(m) = messages.recv().await {
        match m.event {
            Some(Event::PlanCreated(p)) => {
                plan = p.plan.as_ref().map_or(Value::Null, json::plan);
                zero_step_reason = p.zero_step_reason;
            }
            Some(Event::ExecutionEvent(e)) => {
                let kind = pb::ExecutionEventKind::try_from(e.kind).unwrap_or_default();
                let status = match kind {
                    pb::ExecutionEventKind::StepStarted | pb::ExecutionEventKind::StepRetrying => "running",
                    pb::ExecutionEventKind::StepSucceeded => "succeeded",
                    pb::ExecutionEventKind::StepFailed => "failed",
                    pb::ExecutionEventKind::StepSkipped => "skipped",
                    pb::ExecutionEventKind::StepCancelled => "cancelled",
                    _ => continue,
                };
                if !steps.contains_key(&e.step_id) {
                    order.push(e.step_id.clone());
                }
                let mut step = json!({"step_id": e.step_id, "status": status, "attempts": e.attempt});
                if let Some(output) = &e.output {
                    step["output"] = from_value(output);
                }
                if !e.error.is_empty() {
                    step["error"] = json!(e.error);
                }
                steps.insert(e.step_id.clone(), step);
            }
            Some(Event::Review(r)) => review = json::review(&r),
            Some(Event::FinalAnswer(a)) => {
                let results: Vec<Value> = order.iter().filter_map(|id| steps.remove(id)).collect();
                return Json(json!({
                    "request_id": request_id,
                    "trace_id": trace_id,
                    "answer": a.text,
                    "goal_achieved": a.goal_achieved,
                    "execution_id": a.execution_id,
                    "plan": plan,
                    "zero_step_reason": zero_step_reason,
                    "steps": results,
                    "review": review,
                }))
                .into_response();
            }
            Some(Event::Error(e)) => {
                return error(
                    http_status(&e.code),
                    &e.code.to_ascii_lowercase(),
                    &e.message,
                    Some(json!({"service": e.service})),
                    request_id,
                );
            }
            Some(Event::SynthesisChunk(_)) | None => {}
        }
    }
    error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the orchestration ended without an answer", None, request_id)
}
