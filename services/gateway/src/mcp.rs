//! The mesh as an MCP server: `/mcp` (streamable HTTP) offers the tool
//! `ask`, which orchestrates a request like `Orchestrate`. While it runs,
//! progress notifications carry the plan, each execution event and the
//! answer as it streams; the result is the answer as text, with the
//! review, the request id and the execution id as structured content.
//! The caller is checked like any gateway call (its token, on the HTTP
//! requests of the session) and the orchestration is its own.

use std::sync::Arc;

use agentmesh_proto::v1 as pb;
use pb::orchestrate_response::Event;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};

use crate::json;
use crate::service::Shared;

/// Where the gateway serves MCP.
pub const PATH: &str = "/mcp";

/// The orchestrating tool's name.
const ASK: &str = "ask";

fn object(value: Value) -> Arc<serde_json::Map<String, Value>> {
    Arc::new(value.as_object().cloned().unwrap_or_default())
}

fn ask_tool() -> Tool {
    let input = json!({
        "type": "object",
        "properties": {"query": {"type": "string", "description": "The request, in plain language"}},
        "required": ["query"],
        "additionalProperties": false,
    });
    let output = json!({
        "type": "object",
        "properties": {
            "answer": {"type": "string"},
            "goal_achieved": {"type": "boolean"},
            "request_id": {"type": "string"},
            "execution_id": {"type": "string"},
            "review": {"type": "object"},
        },
        "required": ["answer", "goal_achieved", "request_id"],
    });
    Tool::new(
        ASK,
        "Ask the agent mesh: it finds the agents that can serve the request, plans over them, runs the plan and \
         answers from the results, with a review of whether the goal was achieved.",
        object(input),
    )
    .with_raw_output_schema(object(output))
    .with_annotations(ToolAnnotations::new().read_only(false).open_world(true))
}

/// One line saying what a message of the orchestration is.
fn describe(m: &pb::OrchestrateResponse) -> String {
    match &m.event {
        Some(Event::PlanCreated(p)) => {
            let steps: Vec<String> = p
                .plan
                .iter()
                .flat_map(|plan| &plan.steps)
                .map(|s| format!("{} {}:{}", s.step_id, s.agent, s.capability))
                .collect();
            if steps.is_empty() {
                format!("plan: no step ({})", p.zero_step_reason)
            } else {
                format!("plan: {}", steps.join(", "))
            }
        }
        Some(Event::ExecutionEvent(e)) => {
            let kind = pb::ExecutionEventKind::try_from(e.kind).unwrap_or_default();
            let mut line = kind.as_str_name().trim_start_matches("EXECUTION_EVENT_KIND_").to_ascii_lowercase();
            if !e.step_id.is_empty() {
                line.push(' ');
                line.push_str(&e.step_id);
            }
            if !e.error.is_empty() {
                line.push_str(": ");
                line.push_str(&e.error);
            }
            line
        }
        Some(Event::SynthesisChunk(chunk)) => format!("answer: {chunk}"),
        Some(Event::Review(r)) => format!("review: goal {}", if r.goal_achieved { "achieved" } else { "not achieved" }),
        Some(Event::FinalAnswer(_)) => "answered".into(),
        Some(Event::Error(e)) => format!("error in {}: {}", e.service, e.message),
        None => String::new(),
    }
}

/// The MCP server over the gateway's orchestrations.
#[derive(Clone)]
pub struct MeshServer {
    shared: Arc<Shared>,
}

impl ServerHandler for MeshServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("agentmesh", env!("CARGO_PKG_VERSION")))
            .with_instructions("Call `ask` with a request in plain language; the mesh plans over its agents, runs the plan and answers.")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![ask_tool()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != ASK {
            return Err(ErrorData::invalid_params(format!("no tool `{}`; this server has `ask`", request.name), None));
        }
        let query = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("query"))
            .and_then(Value::as_str)
            .ok_or_else(|| ErrorData::invalid_params("`ask` needs {\"query\": \"…\"}", None))?;
        let principal = context
            .extensions
            .get::<http::request::Parts>()
            .map(|parts| agentmesh_server::auth::principal_of(&parts.extensions))
            .unwrap_or_else(agentmesh_server::Principal::anonymous_operator);
        let request_id = agentmesh_server::new_request_id();
        let orchestrate = pb::OrchestrateRequest { query: query.to_owned(), request_id, ..Default::default() };
        let mut started =
            self.shared.start(orchestrate, None, &principal).await.map_err(|status| match status.code() {
                tonic::Code::InvalidArgument | tonic::Code::AlreadyExists => {
                    ErrorData::invalid_params(status.message().to_owned(), None)
                }
                _ => ErrorData::internal_error(status.message().to_owned(), None),
            })?;
        let token = context.meta.get_progress_token();
        let mut count = 0.0;
        let mut review = Value::Null;
        loop {
            let message = tokio::select! {
                message = started.messages.recv() => message,
                // Dropping the messages stops the orchestration.
                () = context.ct.cancelled() => return Err(ErrorData::internal_error("cancelled by the client", None)),
            };
            let Some(message) = message else {
                return Err(ErrorData::internal_error("the orchestration ended without an answer", None));
            };
            count += 1.0;
            if let Some(token) = &token {
                let note = ProgressNotificationParam::new(token.clone(), count).with_message(describe(&message));
                let _ = context.peer.notify_progress(note).await;
            }
            match &message.event {
                Some(Event::Review(_)) => review = json::message(&message).1["review"].clone(),
                Some(Event::FinalAnswer(answer)) => {
                    let structured = json!({
                        "answer": answer.text,
                        "goal_achieved": answer.goal_achieved,
                        "request_id": started.request_id,
                        "execution_id": answer.execution_id,
                        "review": review,
                    });
                    let mut result = CallToolResult::structured(structured);
                    result.content = vec![ContentBlock::text(answer.text.clone())];
                    return Ok(result.into());
                }
                Some(Event::Error(e)) => {
                    let text = format!("the {} failed ({}): {}", e.service, e.code, e.message);
                    return Ok(CallToolResult::error(vec![ContentBlock::text(text)]).into());
                }
                _ => {}
            }
        }
    }
}

/// The `/mcp` routes.
pub fn router(shared: Arc<Shared>) -> axum::Router {
    // Behind the gateway's own authentication; any Host (the gateway is
    // reached by whatever name its deployment gives it).
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    let server = MeshServer { shared };
    let service = StreamableHttpService::new(move || Ok(server.clone()), LocalSessionManager::default().into(), config);
    axum::Router::new().nest_service(PATH, service)
}
