//! The mesh as an A2A agent. Its Agent Card, at
//! `/.well-known/agent-card.json`, declares one JSON-RPC endpoint, `/a2a`,
//! in protocol 1.0 (and, for 0.3 clients, the same URL as the card's
//! `url`), streaming, and a skill per healthy capability in the catalog
//! after the general one, `ask`.
//!
//! A message is a request: sending it (`SendMessage`, `message/send`)
//! orchestrates it and answers with the task when the orchestration ends
//! (at once, still working, when the caller asks not to wait); streaming
//! it (`SendStreamingMessage`, `message/stream`) sends the task, a status
//! update per plan and step event, the answer as an artifact as it is
//! written, and the final status. The task's id is the orchestration's
//! request id: `GetTask` reads the orchestration's stored messages, and
//! `CancelTask` cancels its execution. Tasks are the caller's own: another
//! principal's task is not found.

use std::convert::Infallible;
use std::sync::Arc;

use agentmesh_a2a::wire::{self, Artifact, Event, Message, Method, Part, Role, State, Task, Version, code};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_server::Principal;
use agentmesh_telemetry::rpc::TracedChannel;
use axum::extract::State as With;
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use crate::service::Shared;

/// Where the card is served.
pub const CARD_PATH: &str = agentmesh_a2a::card::WELL_KNOWN_PATH;

/// Where A2A requests are answered.
pub const PATH: &str = "/a2a";

/// Most capability skills listed on the card.
const MAX_CARD_SKILLS: usize = 200;

/// Most stored messages read back for one task.
const MAX_TASK_EVENTS: i64 = 10_000;

/// The artifact the answer is written to.
const ANSWER_ARTIFACT: &str = "answer";

/// What the A2A front door uses.
pub struct A2a {
    /// Orchestrations.
    pub shared: Arc<Shared>,
    /// The catalog, for the card's skills.
    pub discovery: DiscoveryServiceClient<TracedChannel>,
    /// Whether the gateway serves TLS (the card's URLs say `https`).
    pub tls: bool,
    /// The gateway's address as its callers reach it (`public_url`), when
    /// it is not the `Host` they name (a proxy in front of it).
    pub public_url: Option<String>,
    /// Whether callers authenticate: the public card then lists only
    /// `ask`, and the catalog's skills are on the extended card, read with
    /// the caller's token.
    pub authenticated: bool,
    /// The catalog's skills as last read for the public card, and when.
    pub skills: tokio::sync::Mutex<Option<(std::time::Instant, Vec<Value>)>>,
}

/// How long the public card's skills are reused.
const SKILLS_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// The card is public, like any agent's; `/a2a` is checked like any call.
pub fn is_public(path: &str) -> bool {
    path == CARD_PATH
}

/// The A2A routes.
pub fn router(a2a: Arc<A2a>) -> axum::Router {
    axum::Router::new().route(CARD_PATH, get(card)).route(PATH, post(rpc)).with_state(a2a)
}

/// The gateway's A2A endpoint: under `public_url` when set, else at the
/// `Host` the caller named.
fn endpoint(a2a: &A2a, headers: &HeaderMap) -> String {
    if let Some(public) = &a2a.public_url {
        return format!("{}{PATH}", public.trim_end_matches('/'));
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    format!("{}://{host}{PATH}", if a2a.tls { "https" } else { "http" })
}

fn ask_skill() -> Value {
    json!({
        "id": "ask",
        "name": "Ask the mesh",
        "description": "Any request in plain language: the mesh finds the agents that can serve it, plans over \
                        them, runs the plan and answers from the results, with a review of whether the goal was met.",
        "tags": ["orchestration"],
        "examples": ["What time is it in Tokyo?"],
    })
}

/// The catalog's healthy capabilities as skills (ids and descriptions,
/// never addresses), read with `token` (else as the gateway).
async fn catalog_skills(a2a: &A2a, token: Option<&str>) -> Vec<Value> {
    let listing = pb::ListCapabilitiesRequest {
        include_descriptions: Some(true),
        health_status: pb::HealthStatus::Active as i32,
        limit: u32::try_from(MAX_CARD_SKILLS).unwrap_or(200),
        ..Default::default()
    };
    let request = crate::service::as_caller(token, listing, std::time::Duration::from_secs(5));
    let mut skills = Vec::new();
    match a2a.discovery.clone().list_capabilities(request).await {
        Ok(answer) => {
            for agent in &answer.into_inner().capabilities {
                for capability in agent.reasoners.iter().chain(&agent.skills).take(MAX_CARD_SKILLS - skills.len()) {
                    skills.push(json!({
                        "id": format!("{}.{}", agent.id, capability.id),
                        "name": format!("{} ({})", capability.id, agent.id),
                        "description": capability.description,
                        "tags": capability.tags,
                    }));
                }
            }
        }
        Err(status) => {
            tracing::warn!(error = %status.message(), "the Agent Card lists no capabilities: the catalog did not answer");
        }
    }
    skills
}

/// The card, with `skills` after `ask`.
fn card_with(a2a: &A2a, headers: &HeaderMap, skills: Vec<Value>) -> Value {
    let url = endpoint(a2a, headers);
    let mut all = vec![ask_skill()];
    all.extend(skills);
    json!({
        "name": "agentmesh",
        "description": "An agent mesh: it plans over the agents it knows, runs the plan durably and answers with a \
                        reviewed, synthesized result.",
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [{"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": true, "pushNotifications": false, "extendedAgentCard": a2a.authenticated},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": all,
        // For 0.3 clients: the same endpoint answers 0.3's methods.
        "url": url,
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
        "supportsAuthenticatedExtendedCard": a2a.authenticated,
    })
}

/// The public card: with authentication on, only `ask` (the catalog is
/// on the extended card); without, the catalog's skills too, read at most
/// every five seconds.
async fn card(With(a2a): With<Arc<A2a>>, headers: HeaderMap) -> Response {
    let skills = if a2a.authenticated {
        Vec::new()
    } else {
        let mut kept = a2a.skills.lock().await;
        match &*kept {
            Some((at, skills)) if at.elapsed() < SKILLS_TTL => skills.clone(),
            _ => {
                let skills = catalog_skills(&a2a, None).await;
                *kept = Some((std::time::Instant::now(), skills.clone()));
                skills
            }
        }
    };
    ([(header::CACHE_CONTROL, "no-cache")], Json(card_with(&a2a, &headers, skills))).into_response()
}

/// A JSON-RPC error answer (HTTP 200, as JSON-RPC over HTTP answers).
fn refuse(id: &Value, code: i64, message: impl AsRef<str>) -> Response {
    Json(wire::error(id, code, message.as_ref())).into_response()
}

async fn rpc(
    With(a2a): With<Arc<A2a>>,
    agentmesh_server::auth::Caller(principal): agentmesh_server::auth::Caller,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return refuse(&Value::Null, code::PARSE_ERROR, "the request is not JSON");
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return refuse(&id, code::INVALID_REQUEST, "not a JSON-RPC 2.0 request");
    }
    let name = request.get("method").and_then(Value::as_str).unwrap_or_default();
    if matches!(name, "GetExtendedAgentCard" | "agent/getAuthenticatedExtendedCard") {
        // The catalog as this caller may read it.
        let token = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let skills = catalog_skills(&a2a, token).await;
        return Json(wire::result(&id, card_with(&a2a, &headers, skills))).into_response();
    }
    let Some((method, version)) = Method::parse(name) else {
        return refuse(
            &id,
            code::METHOD_NOT_FOUND,
            format!(
                "no method `{name}`: this agent answers SendMessage, SendStreamingMessage, GetTask and CancelTask \
                 (A2A 1.0) and message/send, message/stream, tasks/get and tasks/cancel (A2A 0.3)"
            ),
        );
    };
    if let Some(asked) = headers.get(wire::VERSION_HEADER).and_then(|v| v.to_str().ok())
        && Version::parse(asked).is_none()
    {
        return refuse(
            &id,
            code::VERSION_NOT_SUPPORTED,
            format!("A2A version `{asked}` is not spoken here: 1.0 or 0.3"),
        );
    }
    let params = request.get("params").cloned().unwrap_or(Value::Null);
    match method {
        Method::Send | Method::Stream => send(a2a, principal, id, version, method == Method::Stream, &params).await,
        Method::GetTask => get_task(&a2a, &principal, &id, version, &params).await,
        Method::CancelTask => cancel_task(&a2a, &principal, &id, version, &params, &headers).await,
    }
}

/// The request a message makes: its text, and its data parts as JSON.
fn query_of(message: &Message) -> String {
    let mut lines = vec![wire::text_of(&message.parts)];
    lines.extend(message.parts.iter().filter_map(|p| match p {
        Part::Data(data) => Some(data.to_string()),
        _ => None,
    }));
    lines.retain(|l| !l.trim().is_empty());
    lines.join("\n")
}

fn agent_says(text: impl Into<String>, task_id: &str, context_id: &str) -> Message {
    Message {
        message_id: agentmesh_server::new_request_id(),
        context_id: Some(context_id.to_owned()),
        task_id: Some(task_id.to_owned()),
        role: Role::Agent,
        parts: vec![Part::Text(text.into())],
        metadata: None,
    }
}

/// Where an orchestration is, as a task.
struct Progress {
    task: Task,
    answer: String,
    details: Value,
    /// The recovery round the answer being written belongs to.
    round: i64,
}

impl Progress {
    fn new(task_id: &str, context_id: &str) -> Self {
        Self {
            task: Task {
                id: task_id.to_owned(),
                context_id: context_id.to_owned(),
                state: State::Submitted,
                status_message: None,
                timestamp: Some(chrono::Utc::now().to_rfc3339()),
                artifacts: Vec::new(),
            },
            answer: String::new(),
            details: json!({"request_id": task_id}),
            round: 0,
        }
    }

    /// Takes in one orchestration message (its stored JSON form); returns
    /// the events a stream sends for it.
    fn take(&mut self, kind: &str, data: &Value) -> Vec<Event> {
        let (id, context) = (self.task.id.clone(), self.task.context_id.clone());
        let status = |state: State, text: String, last: bool| Event::Status {
            task_id: id.clone(),
            context_id: context.clone(),
            state,
            message: (!text.is_empty()).then(|| agent_says(text, &id, &context)),
            last,
        };
        let payload = &data[kind];
        if self.task.state.is_final() {
            // Ended (a cancelled execution ends the task even if the
            // orchestration goes on to answer from what it had).
            return Vec::new();
        }
        self.task.timestamp = Some(chrono::Utc::now().to_rfc3339());
        let round = data["round"].as_i64().unwrap_or(0);
        match kind {
            "synthesis_chunk" => {
                let chunk = payload["text"].as_str().unwrap_or_default();
                if round != self.round {
                    // A recovery round writes the answer anew.
                    self.round = round;
                    self.answer.clear();
                }
                let append = !self.answer.is_empty();
                self.answer.push_str(chunk);
                vec![Event::Artifact {
                    task_id: id.clone(),
                    context_id: context.clone(),
                    artifact: Artifact {
                        artifact_id: ANSWER_ARTIFACT.into(),
                        name: Some(ANSWER_ARTIFACT.into()),
                        parts: vec![Part::Text(chunk.to_owned())],
                    },
                    append,
                }]
            }
            "review" => {
                self.details["review"] = payload.clone();
                Vec::new()
            }
            "final_answer" => {
                let text = payload["text"].as_str().unwrap_or_default().to_owned();
                self.details["goal_achieved"] = payload["goal_achieved"].clone();
                self.details["execution_id"] = payload["execution_id"].clone();
                let streamed = !self.answer.is_empty();
                self.answer = text.clone();
                self.task.state = State::Completed;
                self.task.artifacts = vec![self.artifact()];
                let mut events = Vec::new();
                // The answer's text went out in chunks; the details go with the end.
                let parts = if streamed {
                    vec![Part::Data(self.details.clone())]
                } else {
                    vec![Part::Text(text), Part::Data(self.details.clone())]
                };
                events.push(Event::Artifact {
                    task_id: id.clone(),
                    context_id: context.clone(),
                    artifact: Artifact {
                        artifact_id: ANSWER_ARTIFACT.into(),
                        name: Some(ANSWER_ARTIFACT.into()),
                        parts,
                    },
                    append: streamed,
                });
                events.push(status(State::Completed, String::new(), true));
                events
            }
            "error" => {
                let message = format!(
                    "the {} failed ({}): {}",
                    payload["service"].as_str().unwrap_or("mesh"),
                    payload["code"].as_str().unwrap_or("error"),
                    payload["message"].as_str().unwrap_or_default()
                );
                let cancelled = payload["code"].as_str() == Some("CANCELLED")
                    || payload["message"].as_str().is_some_and(|m| m.contains("cancel"));
                self.task.state = if cancelled { State::Canceled } else { State::Failed };
                self.task.status_message = Some(agent_says(message.clone(), &id, &context));
                vec![status(self.task.state, message, true)]
            }
            "execution_event" if payload["kind"] == "execution_cancelled" => {
                let message = "the execution was cancelled".to_owned();
                self.task.state = State::Canceled;
                self.task.status_message = Some(agent_says(message.clone(), &id, &context));
                vec![status(State::Canceled, message, true)]
            }
            _ => {
                if let Some(execution_id) = payload["execution_id"].as_str().filter(|e| !e.is_empty()) {
                    self.details["execution_id"] = json!(execution_id);
                }
                self.task.state = State::Working;
                let line = crate::json::describe(kind, payload);
                self.task.status_message = Some(agent_says(line.clone(), &id, &context));
                vec![status(State::Working, line, false)]
            }
        }
    }

    fn artifact(&self) -> Artifact {
        Artifact {
            artifact_id: ANSWER_ARTIFACT.into(),
            name: Some(ANSWER_ARTIFACT.into()),
            parts: vec![Part::Text(self.answer.clone()), Part::Data(self.details.clone())],
        }
    }
}

async fn send(
    a2a: Arc<A2a>,
    principal: Principal,
    id: Value,
    version: Version,
    stream: bool,
    params: &Value,
) -> Response {
    let Some(message) = params.get("message").and_then(Message::read) else {
        return refuse(&id, code::INVALID_PARAMS, "params.message must be a message with `role` and `parts`");
    };
    let query = query_of(&message);
    if query.trim().is_empty() {
        return refuse(&id, code::INVALID_PARAMS, "the message has no text to ask");
    }
    if message.task_id.is_some() {
        return refuse(
            &id,
            code::UNSUPPORTED_OPERATION,
            "a message continues no task here: each message is a new request (leave taskId out)",
        );
    }
    let configuration = params.get("configuration");
    let wait = match version {
        Version::V1 => {
            !configuration.and_then(|c| c.get("returnImmediately")).and_then(Value::as_bool).unwrap_or(false)
        }
        Version::V03 => configuration.and_then(|c| c.get("blocking")).and_then(Value::as_bool).unwrap_or(true),
    };
    let request_id = agentmesh_server::new_request_id();
    let context_id = message.context_id.clone().unwrap_or_else(|| request_id.clone());
    let orchestrate = pb::OrchestrateRequest { query, request_id: request_id.clone(), ..Default::default() };
    let mut started = match a2a.shared.start(orchestrate, None, &principal).await {
        Ok(started) => started,
        Err(status) => {
            let code = match status.code() {
                tonic::Code::InvalidArgument | tonic::Code::AlreadyExists => code::INVALID_PARAMS,
                _ => code::INTERNAL,
            };
            return refuse(&id, code, status.message());
        }
    };
    tracing::info!(request_id, version = version.as_str(), stream, "an A2A message started an orchestration");
    let mut progress = Progress::new(&started.request_id, &context_id);
    if stream {
        let (tx, rx) = tokio::sync::mpsc::channel::<Value>(64);
        let first = Event::Task(progress.task.clone());
        tokio::spawn(async move {
            if tx.send(wire::result(&id, first.write(version))).await.is_err() {
                return;
            }
            // Dropping the messages (the caller went away, or the task
            // ended) stops the orchestration.
            while let Some(m) = started.messages.recv().await {
                let (kind, data) = crate::json::message(&m);
                for event in progress.take(kind, &data) {
                    if tx.send(wire::result(&id, event.write(version))).await.is_err() {
                        return;
                    }
                }
                if progress.task.state.is_final() {
                    return;
                }
            }
        });
        let events = tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|answer| Ok::<_, Infallible>(SseEvent::default().data(answer.to_string())));
        return Sse::new(events).keep_alive(KeepAlive::default()).into_response();
    }
    let submitted = progress.task.clone();
    let run = async move {
        while let Some(m) = started.messages.recv().await {
            let (kind, data) = crate::json::message(&m);
            progress.take(kind, &data);
            if progress.task.state.is_final() {
                break;
            }
        }
        progress.task
    };
    if !wait {
        // The orchestration goes on without the caller, who reads the task later.
        tokio::spawn(run);
        return Json(wire::result(&id, Event::Task(submitted).write(version))).into_response();
    }
    Json(wire::result(&id, Event::Task(run.await).write(version))).into_response()
}

/// The task named in `params.id`, if it is the caller's: read back from
/// the orchestration's stored messages.
async fn read_task(a2a: &A2a, principal: &Principal, params: &Value) -> Result<Progress, (i64, String)> {
    let task_id = params.get("id").and_then(Value::as_str).unwrap_or_default();
    let not_found = || (code::TASK_NOT_FOUND, format!("no task `{task_id}` (tasks are kept for event_retention_secs)"));
    if agentmesh_server::check_request_id(task_id).is_err() {
        return Err(not_found());
    }
    // Another principal's task is not found, rather than refused: its id tells nothing.
    match a2a.shared.owner(task_id).await {
        Some(owner) if principal.owns(&owner) => {}
        _ => return Err(not_found()),
    }
    let now = chrono::Utc::now().timestamp_millis();
    let rows = a2a
        .shared
        .log
        .events_after(task_id, 0, MAX_TASK_EVENTS, now)
        .await
        .map_err(|e| (code::INTERNAL, format!("the task's messages cannot be read: {e}")))?;
    let mut progress = Progress::new(task_id, task_id);
    progress.task.state = State::Working;
    let last_at = rows.last().map_or(now, |r| r.created_at_ms);
    for row in rows {
        let data: Value = serde_json::from_str(&row.data).unwrap_or_default();
        progress.take(&row.kind, &data);
    }
    let quiet = u128::try_from(now.saturating_sub(last_at)).unwrap_or(0);
    if !progress.task.state.is_final() && quiet > a2a.shared.request_timeout.as_millis() {
        // Nothing for longer than an orchestration may take: its gateway stopped.
        progress.task.state = State::Failed;
        let said = "the orchestration stopped without an answer (its gateway went away)";
        progress.task.status_message = Some(agent_says(said, task_id, task_id));
    }
    Ok(progress)
}

async fn get_task(a2a: &A2a, principal: &Principal, id: &Value, version: Version, params: &Value) -> Response {
    match read_task(a2a, principal, params).await {
        Ok(progress) => Json(wire::result(id, progress.task.write(version))).into_response(),
        Err((code, message)) => refuse(id, code, message),
    }
}

async fn cancel_task(
    a2a: &A2a,
    principal: &Principal,
    id: &Value,
    version: Version,
    params: &Value,
    headers: &HeaderMap,
) -> Response {
    let progress = match read_task(a2a, principal, params).await {
        Ok(progress) => progress,
        Err((code, message)) => return refuse(id, code, message),
    };
    if progress.task.state.is_final() {
        return refuse(
            id,
            code::TASK_NOT_CANCELABLE,
            format!("the task has ended ({})", progress.task.state.name(version)),
        );
    }
    let Some(execution_id) = progress.details["execution_id"].as_str().filter(|e| !e.is_empty()) else {
        return refuse(id, code::TASK_NOT_CANCELABLE, "the task is still being planned: nothing runs yet to cancel");
    };
    let cancel = pb::CancelExecutionRequest { execution_id: execution_id.to_owned(), ..Default::default() };
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let request = crate::service::as_caller(authorization, cancel, std::time::Duration::from_secs(30));
    if let Err(status) = a2a.shared.clients.executor.clone().cancel_execution(request).await {
        return refuse(id, code::TASK_NOT_CANCELABLE, format!("the execution was not cancelled: {}", status.message()));
    }
    let mut task = progress.task;
    task.state = State::Canceled;
    task.status_message = Some(agent_says("cancelled at the caller's request", &task.id, &task.context_id));
    Json(wire::result(id, task.write(version))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orchestration_reads_as_a_task() {
        let mut progress = Progress::new("req_1", "ctx");
        let plan =
            json!({"plan_created": {"plan": {"steps": [{"step_id": "s1", "agent": "weather", "capability": "now"}]}}});
        let events = progress.take("plan_created", &plan);
        assert!(matches!(&events[..], [Event::Status { state: State::Working, last: false, .. }]));
        progress.take("synthesis_chunk", &json!({"synthesis_chunk": {"text": "It is "}}));
        let chunk = progress.take("synthesis_chunk", &json!({"synthesis_chunk": {"text": "21 °C."}}));
        assert!(matches!(&chunk[..], [Event::Artifact { append: true, .. }]));
        progress.take("review", &json!({"review": {"goal_achieved": true}}));
        let end = progress.take(
            "final_answer",
            &json!({"final_answer": {"text": "It is 21 °C.", "goal_achieved": true, "execution_id": "exe_1"}}),
        );
        assert!(matches!(end.last(), Some(Event::Status { state: State::Completed, last: true, .. })));
        assert_eq!(progress.task.state, State::Completed);
        let parts = &progress.task.artifacts[0].parts;
        assert_eq!(parts[0], Part::Text("It is 21 °C.".into()));
        assert_eq!(
            parts[1],
            Part::Data(
                json!({"request_id": "req_1", "review": {"goal_achieved": true}, "goal_achieved": true, "execution_id": "exe_1"})
            )
        );
        // A recovery round writes the answer anew: the artifact is replaced.
        let mut again = Progress::new("req_4", "req_4");
        again.take("synthesis_chunk", &json!({"round": 0, "synthesis_chunk": {"text": "Not sure."}}));
        let fresh = again.take("synthesis_chunk", &json!({"round": 1, "synthesis_chunk": {"text": "21 °C."}}));
        assert!(matches!(&fresh[..], [Event::Artifact { append: false, .. }]));
        assert_eq!(again.answer, "21 °C.");
        // A cancelled execution ends the task, whatever the orchestration says next.
        let mut cancelled = Progress::new("req_3", "req_3");
        let step = json!({"execution_event": {"kind": "step_started", "execution_id": "exe_3", "step_id": "s1"}});
        cancelled.take("execution_event", &step);
        let end = cancelled.take(
            "execution_event",
            &json!({"execution_event": {"kind": "execution_cancelled", "execution_id": "exe_3"}}),
        );
        assert!(matches!(&end[..], [Event::Status { state: State::Canceled, last: true, .. }]));
        assert!(cancelled.take("final_answer", &json!({"final_answer": {"text": "From what there was."}})).is_empty());
        assert_eq!(cancelled.task.state, State::Canceled);
        let mut failed = Progress::new("req_2", "req_2");
        failed.take("error", &json!({"error": {"service": "planner", "code": "UNAVAILABLE", "message": "down"}}));
        assert_eq!(failed.task.state, State::Failed);
    }
}
