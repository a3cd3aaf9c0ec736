//! The gRPC `ExecutorService`: thin handlers over the engine.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::execution::{ExecutionOptions, ExecutionSpec, ExecutionStatus};
use agentmesh_core::plan::check_structure;
use agentmesh_proto::convert::plan_from_pb;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_server::ExecutorService;
use agentmesh_store::executions::ExecutionFilter;
use futures_util::{Stream, StreamExt as _, TryStreamExt as _};
use tonic::{Request, Response, Status};

use crate::convert::{execution_to_pb, status_from_pb, summary_to_pb, trace_id_of};
use crate::engine::{Accepted, Engine, watch};
use crate::error::ExecutorError;

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The service state.
pub struct ExecutorGrpc {
    pub(crate) engine: Arc<Engine>,
    pub(crate) max_steps: usize,
}

fn invalid(field: &str, problem: impl Into<String>) -> ExecutorError {
    let problem = problem.into();
    ExecutorError::InvalidArgument { message: format!("{field}: {problem}"), violations: vec![(field.into(), problem)] }
}

/// The caller's `traceparent`, when it is well formed (`00-` 32 hex `-` 16
/// hex `-` 2 hex): kept with the execution so that agents continue the
/// caller's trace even when this executor exports none.
fn incoming_traceparent(metadata: &tonic::metadata::MetadataMap) -> String {
    let value = metadata.get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    match parts[..] {
        [version, trace, span, flags] if hex(version, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2) => {
            value.to_owned()
        }
        _ => String::new(),
    }
}

fn valid_execution_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

/// Refuses a caller that neither started the execution `id` (owned by
/// `owner`) nor sees everything.
fn may_act_on(principal: &agentmesh_server::Principal, owner: &str, id: &str) -> Result<(), Status> {
    if principal.owns(owner) {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "`{}` may not read, cancel or extend execution `{id}`: another principal started it",
        principal.name
    )))
}

/// The principal an execution's stored spec names.
fn owner_in(spec: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Owner {
        #[serde(default)]
        principal: String,
    }
    serde_json::from_str::<Owner>(spec).map(|o| o.principal).unwrap_or_default()
}

impl ExecutorGrpc {
    /// Refuses a caller that neither started execution `id` nor sees
    /// everything (`PERMISSION_DENIED`), and any caller when there is none
    /// (`NOT_FOUND`).
    async fn check_owner(&self, principal: &agentmesh_server::Principal, id: &str) -> Result<(), Status> {
        let row = self.engine.store.get(id).await.map_err(ExecutorError::from)?;
        let row = row.ok_or_else(|| ExecutorError::NotFound(id.to_owned()))?;
        may_act_on(principal, &owner_in(&row.spec), id)
    }

    /// Checks an `Execute` request and fills in the defaults.
    fn accept(&self, r: pb::ExecuteRequest) -> Result<Accepted, ExecutorError> {
        let plan = r.plan.as_ref().ok_or_else(|| invalid("plan", "a plan is required (zero steps is a valid plan)"))?;
        if plan.steps.len() > self.max_steps {
            return Err(ExecutorError::ResourceExhausted(format!(
                "the plan has {} steps; this executor accepts at most {} (max_steps_per_plan)",
                plan.steps.len(),
                self.max_steps
            )));
        }
        let mut violations = Vec::new();
        for step in &plan.steps {
            let at = format!("plan.steps[{}]", step.step_id);
            if step.agent.trim().is_empty() {
                violations.push((format!("{at}.agent"), "an agent id is required".to_owned()));
            }
            if step.capability.trim().is_empty() {
                violations.push((format!("{at}.capability"), "a capability id is required".to_owned()));
            }
        }
        if !violations.is_empty() {
            let message = format!(
                "the plan is invalid: {}",
                violations.iter().map(|(f, p)| format!("{f}: {p}")).collect::<Vec<_>>().join("; ")
            );
            return Err(ExecutorError::InvalidArgument { message, violations });
        }
        let plan = plan_from_pb(plan);
        check_structure(&plan).map_err(ExecutorError::InvalidPlan)?;
        let id = if r.execution_id.is_empty() { format!("exe_{:016x}", rand::random::<u64>()) } else { r.execution_id };
        if !valid_execution_id(&id) {
            return Err(invalid("execution_id", "use 1-128 characters of [A-Za-z0-9._:-]"));
        }
        let defaults = self.engine.settings.defaults;
        let options = r.options.unwrap_or_default();
        let options = ExecutionOptions {
            max_concurrency: if options.max_concurrency == 0 {
                defaults.max_concurrency
            } else {
                options.max_concurrency
            },
            step_timeout_ms: if options.step_timeout_ms == 0 {
                defaults.step_timeout_ms
            } else {
                options.step_timeout_ms
            },
            max_retries: options.max_retries.unwrap_or(defaults.max_retries),
            replan_budget: options.replan_budget.unwrap_or(defaults.replan_budget),
        };
        if options.replan_budget > agentmesh_core::execution::MAX_REPLAN_BUDGET {
            return Err(invalid(
                "options.replan_budget",
                format!("at most {}", agentmesh_core::execution::MAX_REPLAN_BUDGET),
            ));
        }
        if options.max_concurrency > agentmesh_core::execution::MAX_EXECUTION_CONCURRENCY {
            return Err(invalid(
                "options.max_concurrency",
                format!("at most {}", agentmesh_core::execution::MAX_EXECUTION_CONCURRENCY),
            ));
        }
        if options.max_retries > 100 {
            return Err(invalid("options.max_retries", "at most 100"));
        }
        if options.step_timeout_ms > 24 * 3600 * 1000 {
            return Err(invalid("options.step_timeout_ms", "at most 86400000 (a day)"));
        }
        let request_id = r.request_id;
        Ok(Accepted {
            id,
            spec: ExecutionSpec {
                request_id,
                plan,
                options,
                query: r.query,
                caller_agent_ids: r.caller_agent_ids,
                exclude_agents: r.exclude_agents,
                allow: r.allow,
                principal: String::new(),
            },
            traceparent: agentmesh_telemetry::propagation::traceparent(&tracing::Span::current()).unwrap_or_default(),
        })
    }
}

impl ExecutorGrpc {
    /// Checks each step's parameters, as written, against its capability's
    /// input schema, so that a wrong field in a hand-written plan is refused
    /// at once, by name, instead of reaching the agent and being retried.
    /// Values holding references are checked once resolved; steps whose
    /// agent or capability is not known now are left to fail when they run.
    async fn check_parameters(&self, plan: &agentmesh_core::plan::Plan) -> Result<(), ExecutorError> {
        let mut violations = Vec::new();
        for step in &plan.steps {
            let Ok(agent) = self.engine.catalog.agent(&step.agent).await else { continue };
            let Some(schema) = agent.capabilities.get(&step.capability).and_then(|c| c.input_schema.as_ref()) else {
                continue;
            };
            for problem in schema.violations_before_references(&step.parameters) {
                let (path, message) = problem.split_once(": ").unwrap_or(("/", problem.as_str()));
                let path = path.trim_start_matches('/').replace('/', ".");
                let field = if path.is_empty() {
                    format!("plan.steps[{}].parameters", step.step_id)
                } else {
                    format!("plan.steps[{}].parameters.{path}", step.step_id)
                };
                violations.push((field, format!("{message} (the input schema of {}/{})", step.agent, step.capability)));
            }
        }
        if violations.is_empty() {
            return Ok(());
        }
        let message = format!(
            "the plan's parameters do not fit their capabilities: {}",
            violations.iter().map(|(f, p)| format!("{f}: {p}")).collect::<Vec<_>>().join("; ")
        );
        Err(ExecutorError::InvalidArgument { message, violations })
    }
}

#[tonic::async_trait]
impl ExecutorService for ExecutorGrpc {
    type ExecuteStream = EventStream<pb::ExecuteResponse>;
    type WatchExecutionStream = EventStream<pb::WatchExecutionResponse>;
    type ExtendExecutionStream = EventStream<pb::ExtendExecutionResponse>;

    async fn execute(&self, request: Request<pb::ExecuteRequest>) -> Result<Response<Self::ExecuteStream>, Status> {
        let request_id = agentmesh_server::call_request_id(request.metadata(), &request.get_ref().request_id)?;
        let incoming = incoming_traceparent(request.metadata());
        // The caller's, or the client's a service of the mesh (the gateway) names.
        let owner = agentmesh_server::auth::acting_for(&request);
        let mut accepted = self.accept(pb::ExecuteRequest { request_id, ..request.into_inner() })?;
        accepted.spec.principal = owner;
        if accepted.traceparent.is_empty() {
            accepted.traceparent = incoming;
        }
        self.check_parameters(&accepted.spec.plan).await?;
        let id = accepted.id.clone();
        tracing::info!(
            operation = "execute",
            request_id = %accepted.spec.request_id,
            execution_id = %id,
            steps = accepted.spec.plan.steps.len(),
            "execution accepted"
        );
        self.engine.create(accepted).await?;
        let events = watch::stream(self.engine.clone(), id, 0);
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(events, |e| {
            e.map(|event| pb::ExecuteResponse { event: Some(event) })
        }))))
    }

    async fn watch_execution(
        &self,
        request: Request<pb::WatchExecutionRequest>,
    ) -> Result<Response<Self::WatchExecutionStream>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let r = request.into_inner();
        self.check_owner(&principal, &r.execution_id).await?;
        let events = watch::stream(self.engine.clone(), r.execution_id, r.from_sequence);
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(events, |e| {
            e.map(|event| pb::WatchExecutionResponse { event: Some(event) })
        }))))
    }

    async fn extend_execution(
        &self,
        request: Request<pb::ExtendExecutionRequest>,
    ) -> Result<Response<Self::ExtendExecutionStream>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let r = request.into_inner();
        self.check_owner(&principal, &r.execution_id).await?;
        if r.steps.is_empty() && r.collaborations.is_empty() {
            return Err(invalid("steps", "at least one step or collaboration is required").into());
        }
        let steps: Vec<_> = r.steps.iter().map(agentmesh_proto::convert::step_from_pb).collect();
        let collaborations: Vec<_> =
            r.collaborations.iter().map(agentmesh_proto::convert::collaboration_from_pb).collect();
        let reason = if r.reason.trim().is_empty() { "extended by request".to_owned() } else { r.reason };
        let preference = (r.model, r.reasoning_effort);
        let respond = |events: EventStream<pb::ExecutionEvent>| -> EventStream<pb::ExtendExecutionResponse> {
            Box::pin(events.map_ok(|event| pb::ExtendExecutionResponse { event: Some(event) }))
        };
        let (engine, id) = (self.engine.clone(), r.execution_id);
        if collaborations.is_empty() {
            let sequence = engine.extend(&id, steps, collaborations, preference, reason).await?;
            return Ok(Response::new(respond(Box::pin(watch::stream(engine, id, sequence - 1)))));
        }
        // Planning collaborations takes as long as the planner's model does:
        // the stream opens at once, and its first event (or its error)
        // follows once they are planned.
        let extended = async move {
            match engine.extend(&id, steps, collaborations, preference, reason).await {
                Ok(sequence) => Box::pin(watch::stream(engine, id, sequence - 1)) as EventStream<pb::ExecutionEvent>,
                Err(e) => Box::pin(futures_util::stream::once(std::future::ready(Err(Status::from(e))))),
            }
        };
        Ok(Response::new(respond(Box::pin(futures_util::stream::once(extended).flatten()))))
    }

    async fn get_execution(
        &self,
        request: Request<pb::GetExecutionRequest>,
    ) -> Result<Response<pb::GetExecutionResponse>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let id = request.into_inner().execution_id;
        let (row, state) = self.engine.load(&id).await?.ok_or_else(|| ExecutorError::NotFound(id.clone()))?;
        may_act_on(&principal, &state.spec.principal, &id)?;
        let execution = execution_to_pb(&id, &state, trace_id_of(&row.traceparent));
        Ok(Response::new(pb::GetExecutionResponse { execution: Some(execution) }))
    }

    async fn cancel_execution(
        &self,
        request: Request<pb::CancelExecutionRequest>,
    ) -> Result<Response<pb::CancelExecutionResponse>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let r = request.into_inner();
        self.check_owner(&principal, &r.execution_id).await?;
        let reason = if r.reason.trim().is_empty() { "cancelled by request".to_owned() } else { r.reason };
        let row = self
            .engine
            .store
            .request_cancel(&r.execution_id, &reason)
            .await
            .map_err(ExecutorError::from)?
            .ok_or_else(|| ExecutorError::NotFound(r.execution_id.clone()))?;
        let finished = row.status.parse::<ExecutionStatus>().is_ok_and(ExecutionStatus::is_final);
        if !finished {
            self.engine.signal_cancel(&r.execution_id, reason);
            // The owner (here, on another replica, or whoever takes it over)
            // records the cancellation; wait a little for it to land.
            self.engine.wait_final(&r.execution_id, Duration::from_secs(10)).await?;
        }
        let (row, state) =
            self.engine.load(&r.execution_id).await?.ok_or_else(|| ExecutorError::NotFound(r.execution_id.clone()))?;
        let execution = execution_to_pb(&r.execution_id, &state, trace_id_of(&row.traceparent));
        Ok(Response::new(pb::CancelExecutionResponse { execution: Some(execution) }))
    }

    async fn list_executions(
        &self,
        request: Request<pb::ListExecutionsRequest>,
    ) -> Result<Response<pb::ListExecutionsResponse>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let r = request.into_inner();
        let size = match r.page_size {
            0 => 50,
            n if n > 500 => return Err(invalid("page_size", "at most 500").into()),
            n => i64::from(n),
        };
        let mut statuses = Vec::new();
        for value in r.statuses {
            if let Some(status) = status_from_pb(value)? {
                statuses.push(status.as_str().to_owned());
            }
        }
        let before = if r.page_token.is_empty() {
            None
        } else {
            let (ms, id) = r
                .page_token
                .split_once(':')
                .and_then(|(ms, id)| Some((ms.parse::<i64>().ok()?, id.to_owned())))
                .ok_or_else(|| invalid("page_token", "not a token from a previous page"))?;
            Some((ms, id))
        };
        // A client lists only what it started.
        let only = (!principal.sees_everything()).then_some(principal.name);
        let filter = ExecutionFilter { statuses, request_id: r.request_id, before, limit: size + 1, principal: only };
        let mut rows = self.engine.store.list(&filter).await.map_err(ExecutorError::from)?;
        let more = rows.len() > usize::try_from(size).unwrap_or(usize::MAX);
        rows.truncate(usize::try_from(size).unwrap_or(usize::MAX));
        let next_page_token = match (more, rows.last()) {
            (true, Some(last)) => format!("{}:{}", last.created_at.timestamp_millis(), last.id),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListExecutionsResponse {
            executions: rows.iter().map(summary_to_pb).collect(),
            next_page_token,
        }))
    }
}
