//! The console: the mesh in a browser, served by the gateway. Pages are one
//! small HTML shell and one script, embedded in the binary; the script
//! reads the JSON under `/console/api/`, which the gateway answers by
//! calling the services' public APIs with the caller's own token (so a
//! client sees what it would see calling them itself), and renders it with
//! text nodes only. A strict Content-Security-Policy allows nothing but
//! this origin. `console = false` turns it all off.

pub mod layout;

use std::sync::Arc;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use crate::json;

/// The script, the styles and the page shell.
const SCRIPT: &str = include_str!("assets/console.js");
const STYLES: &str = include_str!("assets/console.css");

/// Nothing but this origin: no inline script or style, no frames, no
/// requests elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Most steps laid out in one request.
const MAX_LAYOUT_STEPS: usize = 10_000;

/// What the console calls.
pub struct Console {
    /// Executions.
    pub executor: ExecutorServiceClient<TracedChannel>,
    /// The interaction log.
    pub planner: PlannerServiceClient<TracedChannel>,
    /// The catalog.
    pub discovery: DiscoveryServiceClient<TracedChannel>,
    /// Where a trace id links (`{trace_id}` replaced); empty: no link.
    pub trace_url: String,
}

/// The console's routes: pages, assets, and the JSON they read.
pub fn router(console: Arc<Console>) -> axum::Router {
    axum::Router::new()
        .route("/", get(page_ask))
        .route("/executions", get(page_executions))
        .route("/executions/{id}", get(page_execution))
        .route("/agents", get(page_agents))
        .route("/requests/{id}", get(page_request))
        .route("/console/assets/console.js", get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/console/assets/console.css", get(|| async { asset(STYLES, "text/css; charset=utf-8") }))
        .route("/console/api/executions", get(list_executions))
        .route("/console/api/executions/{id}", get(get_execution))
        .route("/console/api/executions/{id}/follow", get(follow_execution))
        .route("/console/api/executions/{id}/cancel", post(cancel_execution))
        .route("/console/api/agents", get(list_agents))
        .route("/console/api/agents/events", get(agent_events))
        .route("/console/api/requests/{id}/interactions", get(list_interactions))
        .route("/console/api/layout", post(lay_out))
        .with_state(console)
}

/// Pages and assets need no token (a browser cannot send one when it
/// navigates); the JSON under `/console/api/` is checked like any call.
pub fn is_public(path: &str) -> bool {
    matches!(path, "/" | "/executions" | "/agents")
        || path.starts_with("/console/assets/")
        || (path.starts_with("/executions/") && !path[1..].contains("/api/"))
        || path.starts_with("/requests/")
}

fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    secured(([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response())
}

/// Escapes text for an HTML attribute or element.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page shell: the script renders `page` (with `arg`, an id).
fn shell(console: &Console, page: &str, arg: &str, title: &str) -> Response {
    let link = |href: &str, name: &str, this: &str| {
        let current = if this == page { r#" aria-current="page""# } else { "" };
        format!(r#"<a href="{href}"{current}>{name}</a>"#)
    };
    let html = format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · agentmesh</title>
<link rel="stylesheet" href="/console/assets/console.css">
<script type="module" src="/console/assets/console.js"></script>
</head>
<body>
<header><strong>agentmesh</strong><nav>{ask}{executions}{agents}</nav><div id="auth"></div></header>
<main id="page" data-page="{page}" data-arg="{arg}" data-trace-url="{trace}"><noscript>The console needs JavaScript.</noscript></main>
</body>
</html>
"#,
        title = escape(title),
        ask = link("/", "Ask", "ask"),
        executions = link("/executions", "Executions", "executions"),
        agents = link("/agents", "Agents", "agents"),
        page = escape(page),
        arg = escape(arg),
        trace = escape(&console.trace_url),
    );
    secured(
        ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], html)
            .into_response(),
    )
}

async fn page_ask(State(c): State<Arc<Console>>) -> Response {
    shell(&c, "ask", "", "Ask")
}

async fn page_executions(State(c): State<Arc<Console>>) -> Response {
    shell(&c, "executions", "", "Executions")
}

async fn page_execution(State(c): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    shell(&c, "execution", &id, &format!("Execution {id}"))
}

async fn page_agents(State(c): State<Arc<Console>>) -> Response {
    shell(&c, "agents", "", "Agents")
}

async fn page_request(State(c): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    shell(&c, "request", &id, &format!("Request {id}"))
}

/// A call to a service made with the caller's own credentials, so that
/// the service applies its own rules to the caller.
fn as_caller<T>(headers: &HeaderMap, message: T) -> tonic::Request<T> {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    crate::service::as_caller(authorization, message, std::time::Duration::from_secs(30))
}

/// A failed call, in the REST error shape.
fn failed(status: &tonic::Status) -> Response {
    let code = match status.code() {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    let name = agentmesh_telemetry::rpc::code_name(status.code()).to_ascii_lowercase();
    (code, Json(json!({"error": name, "message": status.message()}))).into_response()
}

fn bad_request(message: impl Into<String>) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": "invalid_argument", "message": message.into()}))).into_response()
}

fn timestamp(t: Option<&prost_types::Timestamp>) -> Value {
    t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0)))
        .map_or(Value::Null, |t| json!(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)))
}

fn status_name(value: i32) -> String {
    pb::ExecutionStatus::try_from(value)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("EXECUTION_STATUS_")
        .to_ascii_lowercase()
}

#[derive(Debug, Default, Deserialize)]
struct ExecutionsQuery {
    #[serde(default)]
    status: String,
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    page_token: String,
}

async fn list_executions(
    State(c): State<Arc<Console>>,
    headers: HeaderMap,
    Query(q): Query<ExecutionsQuery>,
) -> Response {
    let mut statuses = Vec::new();
    if !q.status.is_empty() {
        let name = format!("EXECUTION_STATUS_{}", q.status.to_ascii_uppercase());
        match pb::ExecutionStatus::from_str_name(&name) {
            Some(status) if status != pb::ExecutionStatus::Unspecified => statuses.push(status as i32),
            _ => return bad_request(format!("unknown status `{}`", q.status)),
        }
    }
    let request =
        pb::ListExecutionsRequest { statuses, request_id: q.request_id, page_size: 50, page_token: q.page_token };
    match c.executor.clone().list_executions(as_caller(&headers, request)).await {
        Ok(answer) => {
            let answer = answer.into_inner();
            let executions: Vec<Value> = answer
                .executions
                .iter()
                .map(|e| {
                    json!({
                        "id": e.id,
                        "request_id": e.request_id,
                        "status": status_name(e.status),
                        "steps": e.steps,
                        "error": e.error,
                        "created_at": timestamp(e.created_at.as_ref()),
                        "finished_at": timestamp(e.finished_at.as_ref()),
                    })
                })
                .collect();
            Json(json!({"executions": executions, "next_page_token": answer.next_page_token})).into_response()
        }
        Err(status) => failed(&status),
    }
}

/// The layout of a plan's steps.
fn layout_of(steps: &[pb::PlanStep]) -> layout::Layout {
    layout::layout(steps.iter().map(|s| (s.step_id.as_str(), s.depends_on.as_slice())))
}

async fn get_execution(State(c): State<Arc<Console>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let mut executor = c.executor.clone();
    let execution =
        match executor.get_execution(as_caller(&headers, pb::GetExecutionRequest { execution_id: id.clone() })).await {
            Ok(answer) => answer.into_inner().execution.unwrap_or_default(),
            Err(status) => return failed(&status),
        };
    // Its events so far: the watch from the start, up to the last one stored.
    let mut events = Vec::new();
    if execution.last_sequence > 0 {
        let watch = pb::WatchExecutionRequest { execution_id: id.clone(), from_sequence: 0 };
        let mut stream = match executor.watch_execution(as_caller(&headers, watch)).await {
            Ok(stream) => stream.into_inner(),
            Err(status) => return failed(&status),
        };
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(item) => item.event,
                Err(status) => return failed(&status),
            };
            let Some(event) = event else { continue };
            let sequence = event.sequence;
            events.push(json::execution_event(&event));
            if sequence >= execution.last_sequence {
                break;
            }
        }
    }
    let plan = execution.plan.clone().unwrap_or_default();
    let body = json!({
        "execution": {
            "id": execution.id,
            "request_id": execution.request_id,
            "status": status_name(execution.status),
            "plan": json::plan(&plan),
            "last_sequence": execution.last_sequence,
            "replans_used": execution.replans_used,
            "error": execution.error,
            "created_at": timestamp(execution.created_at.as_ref()),
            "finished_at": timestamp(execution.finished_at.as_ref()),
            "trace_id": execution.trace_id,
            "query": execution.query,
        },
        "events": events,
        // The plan as made; steps added since are in the events.
        "layout": layout_of(&plan.steps),
    });
    Json(body).into_response()
}

#[derive(Debug, Default, Deserialize)]
struct FollowQuery {
    #[serde(default)]
    after: u64,
}

async fn follow_execution(
    State(c): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<FollowQuery>,
) -> Response {
    let watch = pb::WatchExecutionRequest { execution_id: id, from_sequence: q.after };
    let mut request = as_caller(&headers, watch);
    // A watch lasts as long as its execution.
    request.set_timeout(std::time::Duration::from_secs(24 * 3600));
    let stream = match c.executor.clone().watch_execution(request).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return failed(&status),
    };
    let events = stream.filter_map(|item| {
        let event = item.ok()?.event?;
        let data = json::execution_event(&event);
        Some(Ok::<_, std::convert::Infallible>(
            SseEvent::default().event("execution_event").id(event.sequence.to_string()).data(data.to_string()),
        ))
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

async fn cancel_execution(State(c): State<Arc<Console>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let request = pb::CancelExecutionRequest { execution_id: id, ..Default::default() };
    match c.executor.clone().cancel_execution(as_caller(&headers, request)).await {
        Ok(_) => Json(json!({"cancelled": true})).into_response(),
        Err(status) => failed(&status),
    }
}

#[derive(Debug, Default, Deserialize)]
struct AgentsQuery {
    #[serde(default)]
    skill: String,
    #[serde(default)]
    reasoner: String,
    #[serde(default)]
    tags: String,
    #[serde(default)]
    health_status: String,
}

fn health_name(value: i32) -> String {
    pb::HealthStatus::try_from(value)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("HEALTH_STATUS_")
        .to_ascii_lowercase()
}

async fn list_agents(State(c): State<Arc<Console>>, headers: HeaderMap, Query(q): Query<AgentsQuery>) -> Response {
    let health_status = match q.health_status.as_str() {
        "" => pb::HealthStatus::Unspecified,
        other => match pb::HealthStatus::from_str_name(&format!("HEALTH_STATUS_{}", other.to_ascii_uppercase())) {
            Some(h) => h,
            None => return bad_request(format!("unknown health status `{other}`: active, degraded or inactive")),
        },
    };
    let request = pb::ListCapabilitiesRequest {
        skill: (!q.skill.is_empty()).then_some(q.skill),
        reasoner: (!q.reasoner.is_empty()).then_some(q.reasoner),
        tags: q.tags.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect(),
        include_input_schema: true,
        include_output_schema: true,
        include_descriptions: Some(true),
        health_status: health_status as i32,
        limit: 500,
        ..Default::default()
    };
    match c.discovery.clone().list_capabilities(as_caller(&headers, request)).await {
        Ok(answer) => {
            let answer = answer.into_inner();
            let capability = |cap: &pb::Capability| {
                json!({
                    "id": cap.id,
                    "description": cap.description,
                    "tags": cap.tags,
                    "invocation_target": cap.invocation_target,
                    "input_schema": cap.input_schema.as_ref().map(agentmesh_proto::json::from_struct),
                    "output_schema": cap.output_schema.as_ref().map(agentmesh_proto::json::from_struct),
                })
            };
            let agents: Vec<Value> = answer
                .capabilities
                .iter()
                .map(|a| {
                    json!({
                        "agent_id": a.id,
                        "version": a.version,
                        "health_status": health_name(a.health_status),
                        "last_heartbeat": timestamp(a.last_heartbeat.as_ref()),
                        "tags": a.tags,
                        "reasoners": a.reasoners.iter().map(capability).collect::<Vec<_>>(),
                        "skills": a.skills.iter().map(capability).collect::<Vec<_>>(),
                    })
                })
                .collect();
            Json(json!({"agents": agents, "total_agents": answer.total_agents})).into_response()
        }
        Err(status) => failed(&status),
    }
}

/// Discovery's catalog changes as server-sent events (`catalog_event`:
/// `{"kind", "agent_id", "health_status"}`), for the agents page to follow
/// health as it changes. `WatchCatalog` is for services, so the gateway
/// asks with its own credential, and passes on only what any caller may
/// read in the catalog: ids and health.
async fn agent_events(State(c): State<Arc<Console>>) -> Response {
    let mut request = tonic::Request::new(pb::WatchCatalogRequest { include_snapshot: false });
    request.set_timeout(std::time::Duration::from_secs(24 * 3600));
    let stream = match c.discovery.clone().watch_catalog(request).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return failed(&status),
    };
    let events = stream.filter_map(|item| {
        let event = item.ok()?;
        let kind = pb::CatalogEventKind::try_from(event.kind).unwrap_or_default();
        let data = json!({
            "kind": kind.as_str_name().trim_start_matches("CATALOG_EVENT_KIND_").to_ascii_lowercase(),
            "agent_id": event.agent_id,
            "health_status": health_name(event.health_status),
            "occurred_at": timestamp(event.occurred_at.as_ref()),
        });
        Some(Ok::<_, std::convert::Infallible>(SseEvent::default().event("catalog_event").data(data.to_string())))
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

async fn list_interactions(State(c): State<Arc<Console>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let request = pb::ListInteractionsRequest { request_id: id };
    match c.planner.clone().list_interactions(as_caller(&headers, request)).await {
        Ok(answer) => {
            let interactions: Vec<Value> = answer
                .into_inner()
                .interactions
                .iter()
                .map(|i| {
                    let kind = pb::LlmInteractionKind::try_from(i.kind).unwrap_or_default();
                    json!({
                        "kind": kind.as_str_name().trim_start_matches("LLM_INTERACTION_KIND_").to_ascii_lowercase(),
                        "prompt": i.prompt,
                        "response": i.response,
                        "model": i.model,
                        "provider": i.provider,
                        "prompt_tokens": i.prompt_tokens,
                        "completion_tokens": i.completion_tokens,
                        "latency_ms": i.latency_ms,
                        "error": i.error,
                        "created_at": timestamp(i.created_at.as_ref()),
                    })
                })
                .collect();
            Json(json!({"interactions": interactions})).into_response()
        }
        Err(status) => failed(&status),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutRequest {
    steps: Vec<LayoutStep>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutStep {
    step_id: String,
    #[serde(default)]
    depends_on: Vec<String>,
}

async fn lay_out(body: Result<Json<LayoutRequest>, axum::extract::rejection::JsonRejection>) -> Response {
    let Ok(Json(request)) = body else {
        return bad_request("the body must be {\"steps\": [{\"step_id\": …, \"depends_on\": […]}]}");
    };
    if request.steps.len() > MAX_LAYOUT_STEPS {
        return bad_request(format!("at most {MAX_LAYOUT_STEPS} steps are laid out at once"));
    }
    Json(layout::layout(request.steps.iter().map(|s| (s.step_id.as_str(), s.depends_on.as_slice())))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_assets_are_public_and_the_data_is_not() {
        for public in
            ["/", "/executions", "/executions/exe_1", "/agents", "/requests/req_1", "/console/assets/console.js"]
        {
            assert!(is_public(public), "{public}");
        }
        for private in ["/console/api/executions", "/console/api/layout", "/api/v1/orchestrate", "/metrics"] {
            assert!(!is_public(private), "{private}");
        }
    }

    #[test]
    fn text_in_the_shell_is_escaped() {
        assert_eq!(
            escape(r#"<script>"x" & 'y'</script>"#),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;"
        );
    }
}
