//! The mesh as an MCP server: `/mcp` (streamable HTTP) offers the tool
//! `ask`, which orchestrates a request like `Orchestrate`. While it runs,
//! progress notifications carry the plan, each execution event and the
//! answer as it streams; the result is the answer as text, with the
//! review, the request id and the execution id as structured content.
//! The caller is checked like any gateway call (its token, on the HTTP
//! requests of the session) and the orchestration is its own.
//!
//! With `mcp_capability_tools` on, every healthy capability in the catalog
//! is a tool too, named `{agent}.{capability}`, with the capability's
//! input and output schemas and its hints as annotations. Calling one runs
//! a one-step plan through the executor, owned by the caller: durable,
//! retried and traced like any step, its events as progress notifications,
//! its output as the result (structured content when it is an object), the
//! execution's id in the result's `_meta`.

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

use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;

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

/// The `_meta` key of a capability tool's result naming its execution.
pub const EXECUTION_ID_META: &str = "dev.agentmesh/execution_id";

/// Longest tool name MCP clients are asked to accept.
const MAX_TOOL_NAME: usize = 128;

/// Most capabilities listed as tools.
const MAX_CAPABILITY_TOOLS: u32 = 500;

/// The MCP server over the gateway's orchestrations.
#[derive(Clone)]
pub struct MeshServer {
    shared: Arc<Shared>,
    /// Where the catalog is read, when capabilities are offered as tools.
    catalog: Option<DiscoveryServiceClient<TracedChannel>>,
}

/// A capability offered as a tool.
struct CapabilityTool {
    tool: Tool,
    agent: String,
    capability: String,
}

/// Who calls, and the token they called with (passed on to discovery and
/// the executor).
fn caller(context: &RequestContext<RoleServer>) -> (agentmesh_server::Principal, Option<String>) {
    let parts = context.extensions.get::<http::request::Parts>();
    let principal = parts
        .map(|parts| agentmesh_server::auth::principal_of(&parts.extensions))
        .unwrap_or_else(agentmesh_server::Principal::anonymous_operator);
    let token =
        parts.and_then(|p| p.headers.get(http::header::AUTHORIZATION)).and_then(|v| v.to_str().ok()).map(str::to_owned);
    (principal, token)
}

fn schema_object(schema: Option<&prost_types::Struct>) -> Option<Value> {
    schema.map(agentmesh_proto::json::from_struct).filter(|s| s["type"] == "object")
}

impl MeshServer {
    /// The catalog's healthy capabilities as tools, as the caller may see
    /// them; names that collide or are too long are left out.
    async fn capability_tools(&self, token: Option<&str>) -> Result<Vec<CapabilityTool>, ErrorData> {
        let Some(catalog) = &self.catalog else { return Ok(Vec::new()) };
        let listing = pb::ListCapabilitiesRequest {
            include_input_schema: true,
            include_output_schema: true,
            include_descriptions: Some(true),
            health_status: pb::HealthStatus::Active as i32,
            limit: MAX_CAPABILITY_TOOLS,
            ..Default::default()
        };
        let request = crate::service::as_caller(token, listing, std::time::Duration::from_secs(10));
        let answer = catalog
            .clone()
            .list_capabilities(request)
            .await
            .map_err(|s| ErrorData::internal_error(format!("the catalog cannot be read: {}", s.message()), None))?
            .into_inner();
        let mut tools: Vec<CapabilityTool> = Vec::new();
        for agent in &answer.capabilities {
            for capability in agent.reasoners.iter().chain(&agent.skills) {
                let name = format!("{}.{}", agent.id, capability.id);
                if name.len() > MAX_TOOL_NAME || name == ASK || tools.iter().any(|t| t.tool.name == name) {
                    tracing::debug!(
                        tool = name,
                        "a capability is not offered as an MCP tool: its name is too long or taken"
                    );
                    continue;
                }
                let input =
                    schema_object(capability.input_schema.as_ref()).unwrap_or_else(|| json!({"type": "object"}));
                let mut tool = Tool::new(name, capability.description.clone(), object(input));
                if let Some(output) = schema_object(capability.output_schema.as_ref()) {
                    tool = tool.with_raw_output_schema(object(output));
                }
                if let Some(hints) = &capability.hints {
                    let mut annotations = ToolAnnotations::new();
                    if let Some(v) = hints.read_only {
                        annotations = annotations.read_only(v);
                    }
                    if let Some(v) = hints.destructive {
                        annotations = annotations.destructive(v);
                    }
                    if let Some(v) = hints.idempotent {
                        annotations = annotations.idempotent(v);
                    }
                    if let Some(v) = hints.open_world {
                        annotations = annotations.open_world(v);
                    }
                    tool = tool.with_annotations(annotations);
                }
                tools.push(CapabilityTool { tool, agent: agent.id.clone(), capability: capability.id.clone() });
            }
        }
        Ok(tools)
    }

    /// Runs one capability as a one-step plan, owned by the caller.
    async fn run_capability(
        &self,
        chosen: &CapabilityTool,
        arguments: Option<serde_json::Map<String, Value>>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (principal, _) = caller(context);
        let plan = json!({
            "reasoning": format!("`{}` called as an MCP tool", chosen.tool.name),
            "steps": [{"step_id": "s1", "agent": chosen.agent, "capability": chosen.capability,
                "instruction": format!("MCP tool call of {}", chosen.tool.name),
                "parameters": Value::Object(arguments.unwrap_or_default()), "depends_on": []}],
        });
        let plan: agentmesh_core::plan::Plan =
            serde_json::from_value(plan).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let request_id = agentmesh_server::new_request_id();
        let mut request = tonic::Request::new(pb::ExecuteRequest {
            request_id: request_id.clone(),
            plan: Some(agentmesh_proto::convert::plan_to_pb(&plan)),
            ..Default::default()
        });
        if let Ok(value) = request_id.parse() {
            request.metadata_mut().insert("x-request-id", value);
        }
        // Like an orchestration's: the gateway calls, for the caller, who owns the execution.
        agentmesh_server::auth::on_behalf_of(&mut request, &principal.name);
        request.set_timeout(self.shared.request_timeout);
        let mut events = self
            .shared
            .clients
            .executor
            .clone()
            .execute(request)
            .await
            .map_err(|s| match s.code() {
                tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition | tonic::Code::NotFound => {
                    ErrorData::invalid_params(s.message().to_owned(), None)
                }
                _ => ErrorData::internal_error(format!("the executor: {}", s.message()), None),
            })?
            .into_inner();
        let token = context.meta.get_progress_token();
        let (mut count, mut execution_id, mut outcome) = (0.0, String::new(), None);
        loop {
            let event = tokio::select! {
                event = events.message() => event,
                // Dropping the stream leaves the execution running; cancel it.
                () = context.ct.cancelled() => {
                    self.cancel(&execution_id, &principal.name).await;
                    return Err(ErrorData::internal_error("cancelled by the client", None));
                }
            };
            let event = match event {
                Ok(Some(response)) => match response.event {
                    Some(event) => event,
                    None => continue,
                },
                Ok(None) => break,
                Err(status) => {
                    return Err(ErrorData::internal_error(format!("the executor: {}", status.message()), None));
                }
            };
            execution_id.clone_from(&event.execution_id);
            count += 1.0;
            if let Some(token) = &token {
                let line = json::describe("execution_event", &json::execution_event(&event));
                let note = ProgressNotificationParam::new(token.clone(), count).with_message(line);
                let _ = context.peer.notify_progress(note).await;
            }
            match pb::ExecutionEventKind::try_from(event.kind).unwrap_or_default() {
                pb::ExecutionEventKind::StepSucceeded => {
                    outcome =
                        Some(Ok(event.output.as_ref().map(agentmesh_proto::json::from_value).unwrap_or(Value::Null)));
                }
                pb::ExecutionEventKind::StepFailed | pb::ExecutionEventKind::StepSkipped => {
                    outcome = Some(Err(event.error.clone()));
                }
                _ => {}
            }
        }
        let mut result = match outcome {
            Some(Ok(output)) if output.is_object() => CallToolResult::structured(output),
            Some(Ok(output)) => CallToolResult::success(vec![ContentBlock::text(output.to_string())]),
            Some(Err(error)) => CallToolResult::error(vec![ContentBlock::text(error)]),
            None => CallToolResult::error(vec![ContentBlock::text("the step ended without a result")]),
        };
        let mut meta = rmcp::model::MetaObject::new();
        meta.insert(EXECUTION_ID_META.into(), Value::String(execution_id));
        result.meta = Some(meta);
        Ok(result.into())
    }

    async fn cancel(&self, execution_id: &str, owner: &str) {
        if execution_id.is_empty() {
            return;
        }
        let mut request = tonic::Request::new(pb::CancelExecutionRequest {
            execution_id: execution_id.to_owned(),
            ..Default::default()
        });
        agentmesh_server::auth::on_behalf_of(&mut request, owner);
        if let Err(status) = self.shared.clients.executor.clone().cancel_execution(request).await {
            tracing::warn!(execution_id, error = %status.message(), "a cancelled MCP tool call's execution was not cancelled");
        }
    }
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
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (_, token) = caller(&context);
        let mut tools = vec![ask_tool()];
        tools.extend(self.capability_tools(token.as_deref()).await?.into_iter().map(|t| t.tool));
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != ASK {
            let (_, token) = caller(&context);
            let tools = self.capability_tools(token.as_deref()).await?;
            let Some(chosen) = tools.iter().find(|t| t.tool.name == request.name) else {
                let offered = if self.catalog.is_some() { "`ask` and the healthy capabilities" } else { "`ask`" };
                return Err(ErrorData::invalid_params(
                    format!("no tool `{}`; this server has {offered}", request.name),
                    None,
                ));
            };
            return self.run_capability(chosen, request.arguments, &context).await;
        }
        let query = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("query"))
            .and_then(Value::as_str)
            .ok_or_else(|| ErrorData::invalid_params("`ask` needs {\"query\": \"…\"}", None))?;
        let (principal, _) = caller(&context);
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

/// The `/mcp` routes; `catalog` is where capabilities are read when they
/// are offered as tools too.
pub fn router(shared: Arc<Shared>, catalog: Option<DiscoveryServiceClient<TracedChannel>>) -> axum::Router {
    // Behind the gateway's own authentication; any Host (the gateway is
    // reached by whatever name its deployment gives it).
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    let server = MeshServer { shared, catalog };
    let service = StreamableHttpService::new(move || Ok(server.clone()), LocalSessionManager::default().into(), config);
    axum::Router::new().nest_service(PATH, service)
}
