//! One orchestration: plan, execute, synthesize, review, each stage's
//! events passed on as they happen, numbered without gaps. Both front
//! doors (gRPC and REST/SSE) run this and read what it sends.
//!
//! How it ends: the last message is a `final_answer`, or an `error` naming
//! the stage that failed and its gRPC code. A client that goes away, or a
//! deadline that passes, cancels the execution it started.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentmesh_core::execution::ExecutionState;
use agentmesh_core::plan::Plan;
use agentmesh_proto::convert::{event_from_pb, plan_from_pb, plan_to_pb, step_result_to_pb};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_proto::v1::synthesis_service_client::SynthesisServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use agentmesh_telemetry::rpc::code_name;
use pb::orchestrate_response::Event;
use tokio::sync::mpsc;
use tonic::{Code, Status};

use crate::events::EventWriter;
use crate::metrics::Metrics;

/// The services an orchestration calls.
#[derive(Clone)]
pub struct Clients {
    /// The planner.
    pub planner: PlannerServiceClient<TracedChannel>,
    /// The executor.
    pub executor: ExecutorServiceClient<TracedChannel>,
    /// Synthesis and review.
    pub synthesis: SynthesisServiceClient<TracedChannel>,
}

/// Recovery rounds when the request sets no `review_budget`.
pub const DEFAULT_REVIEW_BUDGET: u32 = 1;

/// Most recovery rounds a request may ask for: each one is a replan, new
/// steps, a synthesis and a review.
pub const MAX_REVIEW_BUDGET: u32 = 10;

/// Why an orchestration stopped before its final answer.
#[derive(Debug)]
enum Stop {
    /// The client went away: nobody to tell.
    Gone,
    /// A stage failed: the client is told.
    Failed { service: &'static str, status: Status },
}

impl Stop {
    fn failed(service: &'static str) -> impl FnOnce(Status) -> Self {
        move |status| Self::Failed { service, status }
    }
}

/// A running orchestration: where its messages go and how long it may take.
pub struct Orchestration {
    clients: Clients,
    request_id: String,
    round: u32,
    sequence: u64,
    tx: mpsc::Sender<pb::OrchestrateResponse>,
    deadline: Instant,
    execution_id: String,
    execution_finished: bool,
    /// Tokens of the answers and reviews so far.
    usage: pb::TokenUsage,
    /// The execution as its streamed events tell it.
    run: ExecutionState,
    metrics: Arc<Metrics>,
    events: EventWriter,
    started: Instant,
    /// The principal that started it, named to the executor, which makes
    /// it the execution's owner.
    owner: String,
}

impl Orchestration {
    /// An orchestration sending to `tx`, allowed `timeout`.
    pub fn new(
        clients: Clients,
        request_id: String,
        tx: mpsc::Sender<pb::OrchestrateResponse>,
        timeout: Duration,
        metrics: Arc<Metrics>,
        events: EventWriter,
    ) -> Self {
        Self {
            metrics,
            events,
            started: Instant::now(),
            clients,
            request_id,
            round: 0,
            sequence: 0,
            tx,
            deadline: Instant::now() + timeout,
            execution_id: String::new(),
            execution_finished: false,
            usage: pb::TokenUsage::default(),
            run: ExecutionState::following(Plan::default()),
            owner: String::new(),
        }
    }

    async fn emit(&mut self, event: Event) -> Result<(), Stop> {
        self.sequence += 1;
        let message = pb::OrchestrateResponse {
            request_id: self.request_id.clone(),
            round: self.round,
            event: Some(event),
            sequence: self.sequence,
        };
        self.events.record(&message);
        self.tx.send(message).await.map_err(|_| Stop::Gone)
    }

    /// The orchestration started by `owner` (a principal's name).
    pub fn owned_by(mut self, owner: String) -> Self {
        self.owner = owner;
        self
    }

    /// A request to a stage, with the request id, the client it is made
    /// for and the time left.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Ok(value) = self.request_id.parse() {
            request.metadata_mut().insert("x-request-id", value);
        }
        agentmesh_server::auth::on_behalf_of(&mut request, &self.owner);
        request.set_timeout(self.deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)));
        request
    }

    /// Runs the orchestration to its end; the last message sent is the
    /// final answer or an error.
    pub async fn run(mut self, request: pb::OrchestrateRequest) {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let outcome = match tokio::time::timeout(left, self.drive(&request)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Stop::Failed {
                service: "gateway",
                status: Status::deadline_exceeded(format!(
                    "the orchestration did not finish within {} ms (the client's grpc-timeout or the gateway's \
                     request_timeout_secs)",
                    left.as_millis()
                )),
            }),
        };
        self.metrics.duration.observe(self.started.elapsed().as_secs_f64());
        let stop = match outcome {
            Ok(()) => {
                self.metrics.orchestrations.with_label_values(&["answered"]).inc();
                tracing::info!(
                    request_id = %self.request_id,
                    messages = self.sequence,
                    duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "orchestration answered"
                );
                return;
            }
            Err(stop) => stop,
        };
        self.cancel_execution(match &stop {
            Stop::Gone => "the client went away",
            Stop::Failed { .. } => "the orchestration stopped",
        })
        .await;
        match stop {
            Stop::Gone => {
                self.metrics.orchestrations.with_label_values(&["gone"]).inc();
                tracing::info!(request_id = %self.request_id, "the client went away; orchestration stopped");
                // Nobody to tell now, but a later resume ends on this.
                self.sequence += 1;
                self.events.record(&pb::OrchestrateResponse {
                    request_id: self.request_id.clone(),
                    round: self.round,
                    sequence: self.sequence,
                    event: Some(Event::Error(pb::OrchestrateError {
                        code: code_name(Code::Cancelled).to_owned(),
                        message: "the client went away; the orchestration stopped and its execution was cancelled"
                            .to_owned(),
                        service: "gateway".to_owned(),
                    })),
                });
            }
            Stop::Failed { service, status } => {
                self.metrics.orchestrations.with_label_values(&["failed"]).inc();
                self.metrics.failures.with_label_values(&[service, code_name(status.code())]).inc();
                tracing::warn!(
                    request_id = %self.request_id,
                    service,
                    code = code_name(status.code()),
                    error = %status.message(),
                    "orchestration failed"
                );
                let error = pb::OrchestrateError {
                    code: code_name(status.code()).to_owned(),
                    message: status.message().to_owned(),
                    service: service.to_owned(),
                };
                let _ = self.emit(Event::Error(error)).await;
            }
        }
    }

    /// Cancels the execution this orchestration started, if it is still running.
    async fn cancel_execution(&mut self, reason: &str) {
        if self.execution_id.is_empty() || self.execution_finished {
            return;
        }
        let mut executor = self.clients.executor.clone();
        let mut request = tonic::Request::new(pb::CancelExecutionRequest {
            execution_id: self.execution_id.clone(),
            reason: reason.to_owned(),
        });
        request.set_timeout(Duration::from_secs(5));
        match executor.cancel_execution(request).await {
            Ok(_) => {
                tracing::info!(request_id = %self.request_id, execution_id = %self.execution_id, reason, "execution cancelled")
            }
            Err(status) => tracing::warn!(
                request_id = %self.request_id,
                execution_id = %self.execution_id,
                error = %status.message(),
                "could not cancel the execution"
            ),
        }
    }

    async fn drive(&mut self, r: &pb::OrchestrateRequest) -> Result<(), Stop> {
        let options = r.options.clone().unwrap_or_default();
        let mut planner = self.clients.planner.clone();
        let created = planner
            .create_plan(self.request(pb::CreatePlanRequest {
                request_id: self.request_id.clone(),
                query: r.query.clone(),
                caller_agent_ids: r.caller_agent_ids.clone(),
                model: r.model.clone(),
                reasoning_effort: r.reasoning_effort,
                exclude_agents: options.exclude_agents.clone(),
                allow: options.allow.clone(),
                include_unhealthy: options.include_unhealthy,
                context: options.context.clone(),
            }))
            .await
            .map_err(Stop::failed("planner"))?
            .into_inner();
        let plan = created.plan.clone().unwrap_or_default();
        let zero_step_reason = created.zero_step_reason.clone();
        self.emit(Event::PlanCreated(pb::PlanCreated {
            plan: Some(plan.clone()),
            zero_step_reason: zero_step_reason.clone(),
            stats: created.stats,
        }))
        .await?;

        let (ran_plan, results) = if plan.steps.is_empty() {
            (plan.clone(), Vec::new())
        } else {
            self.execute(r, &options, plan.clone()).await?
        };

        let mut answer = self.synthesize(r, ran_plan.clone(), results.clone(), zero_step_reason).await?;

        let mut goal_achieved = false;
        if !options.skip_review && !plan.steps.is_empty() {
            let mut review = self.review(r, &ran_plan, &results, &answer).await?;
            let mut rounds_left = r.review_budget.unwrap_or(DEFAULT_REVIEW_BUDGET);
            let mut answer_now = answer;
            while !review.goal_achieved && rounds_left > 0 && !self.execution_id.is_empty() {
                // Every action that can be acted on carries its collaboration;
                // the executor plans them as it plans an agent's loop-back.
                let collaborations: Vec<pb::CollaborationRequest> =
                    review.recovery_actions.iter().filter_map(|a| a.collaboration.clone()).collect();
                if collaborations.is_empty() {
                    tracing::info!(request_id = %self.request_id, "no recovery action can be acted on; the answer stands");
                    break;
                }
                // The round's events carry its number; a round the planner
                // found nothing for has none.
                self.round += 1;
                let (ran_plan, results) = match self.extend(r, collaborations).await {
                    Ok(outcome) => outcome,
                    Err(Stop::Failed { status, .. }) if nothing_to_run(&status) => {
                        tracing::info!(
                            request_id = %self.request_id,
                            reason = %status.message(),
                            "no recovery action could be planned; the answer stands"
                        );
                        self.round -= 1;
                        break;
                    }
                    Err(stop) => return Err(stop),
                };
                rounds_left -= 1;
                answer_now = self.synthesize(r, ran_plan.clone(), results.clone(), String::new()).await?;
                review = self.review(r, &ran_plan, &results, &answer_now).await?;
            }
            goal_achieved = review.goal_achieved;
            answer = answer_now;
        }
        let final_answer = pb::FinalAnswer {
            text: answer,
            goal_achieved,
            execution_id: self.execution_id.clone(),
            usage: Some(self.usage),
        };
        self.emit(Event::FinalAnswer(final_answer)).await
    }

    /// Runs the plan on the executor, passing its events on; returns the
    /// plan as run (steps added by loop-back included) and the step results.
    async fn execute(
        &mut self,
        r: &pb::OrchestrateRequest,
        options: &pb::OrchestrateOptions,
        plan: pb::Plan,
    ) -> Result<(pb::Plan, Vec<pb::StepResult>), Stop> {
        self.run = ExecutionState::following(plan_from_pb(&plan));
        let mut executor = self.clients.executor.clone();
        let stream = executor
            .execute(self.request(pb::ExecuteRequest {
                request_id: self.request_id.clone(),
                plan: Some(plan),
                options: options.execution,
                caller_agent_ids: r.caller_agent_ids.clone(),
                query: r.query.clone(),
                execution_id: String::new(),
                exclude_agents: options.exclude_agents.clone(),
                allow: options.allow.clone(),
            }))
            .await
            .map_err(Stop::failed("executor"))?
            .into_inner();
        self.forward(stream, |m: pb::ExecuteResponse| m.event).await?;
        Ok(self.outcome())
    }

    /// Runs more steps in the execution (a recovery round), passing its
    /// events on; returns the plan as run and the step results.
    async fn extend(
        &mut self,
        r: &pb::OrchestrateRequest,
        collaborations: Vec<pb::CollaborationRequest>,
    ) -> Result<(pb::Plan, Vec<pb::StepResult>), Stop> {
        let mut executor = self.clients.executor.clone();
        let stream = executor
            .extend_execution(self.request(pb::ExtendExecutionRequest {
                execution_id: self.execution_id.clone(),
                steps: Vec::new(),
                reason: format!("review recovery round {}", self.round),
                collaborations,
                model: r.model.clone(),
                reasoning_effort: r.reasoning_effort,
            }))
            .await
            .map_err(Stop::failed("executor"))?
            .into_inner();
        self.execution_finished = false;
        self.forward(stream, |m: pb::ExtendExecutionResponse| m.event).await?;
        Ok(self.outcome())
    }

    /// Passes the executor's events on until the execution finishes.
    async fn forward<T>(
        &mut self,
        mut stream: tonic::Streaming<T>,
        event_of: impl Fn(T) -> Option<pb::ExecutionEvent>,
    ) -> Result<(), Stop> {
        loop {
            let message = tokio::select! {
                message = stream.message() => message.map_err(Stop::failed("executor"))?,
                () = self.tx.closed() => return Err(Stop::Gone),
            };
            let Some(event) = message.and_then(&event_of) else { break };
            if self.execution_id.is_empty() {
                self.execution_id.clone_from(&event.execution_id);
            }
            if let Some(known) = event_from_pb(&event) {
                self.run.apply(&known);
            }
            let kind = pb::ExecutionEventKind::try_from(event.kind).unwrap_or_default();
            if matches!(
                kind,
                pb::ExecutionEventKind::ExecutionCompleted
                    | pb::ExecutionEventKind::ExecutionFailed
                    | pb::ExecutionEventKind::ExecutionCancelled
            ) {
                self.execution_finished = true;
            }
            self.emit(Event::ExecutionEvent(event)).await?;
        }
        if self.execution_finished {
            Ok(())
        } else {
            Err(Stop::Failed {
                service: "executor",
                status: Status::unavailable("the execution stream ended before the execution finished"),
            })
        }
    }

    /// The execution as its events told it: its plan (added steps
    /// included) and results.
    fn outcome(&self) -> (pb::Plan, Vec<pb::StepResult>) {
        (plan_to_pb(&self.run.plan()), self.run.steps.iter().map(step_result_to_pb).collect())
    }

    fn add_usage(&mut self, usage: Option<&pb::TokenUsage>) {
        if let Some(u) = usage {
            self.usage.prompt_tokens = self.usage.prompt_tokens.saturating_add(u.prompt_tokens);
            self.usage.completion_tokens = self.usage.completion_tokens.saturating_add(u.completion_tokens);
            self.usage.total_tokens = self.usage.total_tokens.saturating_add(u.total_tokens);
        }
    }

    /// Reviews the answer and passes the review on.
    async fn review(
        &mut self,
        r: &pb::OrchestrateRequest,
        plan: &pb::Plan,
        results: &[pb::StepResult],
        answer: &str,
    ) -> Result<pb::Review, Stop> {
        let mut synthesis = self.clients.synthesis.clone();
        let review = synthesis
            .review(self.request(pb::ReviewRequest {
                request_id: self.request_id.clone(),
                query: r.query.clone(),
                plan: Some(plan.clone()),
                results: results.to_vec(),
                answer: answer.to_owned(),
                model: r.model.clone(),
                reasoning_effort: r.reasoning_effort,
            }))
            .await
            .map_err(Stop::failed("synthesis"))?
            .into_inner();
        self.add_usage(review.usage.as_ref());
        let review = review.review.unwrap_or_default();
        self.emit(Event::Review(review.clone())).await?;
        Ok(review)
    }

    /// Streams the answer, passing each chunk on; returns the whole text.
    async fn synthesize(
        &mut self,
        r: &pb::OrchestrateRequest,
        plan: pb::Plan,
        results: Vec<pb::StepResult>,
        zero_step_reason: String,
    ) -> Result<String, Stop> {
        let mut synthesis = self.clients.synthesis.clone();
        let mut stream = synthesis
            .synthesize(self.request(pb::SynthesizeRequest {
                request_id: self.request_id.clone(),
                query: r.query.clone(),
                plan: Some(plan),
                results,
                zero_step_reason,
                model: r.model.clone(),
                reasoning_effort: r.reasoning_effort,
            }))
            .await
            .map_err(Stop::failed("synthesis"))?
            .into_inner();
        let mut answer = String::new();
        loop {
            let message = tokio::select! {
                message = stream.message() => message.map_err(Stop::failed("synthesis"))?,
                () = self.tx.closed() => return Err(Stop::Gone),
            };
            match message.and_then(|m| m.chunk) {
                Some(pb::synthesize_response::Chunk::Text(text)) => {
                    answer.push_str(&text);
                    self.emit(Event::SynthesisChunk(text)).await?;
                }
                Some(pb::synthesize_response::Chunk::Done(done)) => {
                    self.add_usage(done.usage.as_ref());
                    return Ok(answer);
                }
                None => {
                    return Err(Stop::Failed {
                        service: "synthesis",
                        status: Status::unavailable("the answer stream ended without its done message"),
                    });
                }
            }
        }
    }
}

/// Whether the executor refused an extension because the planner turned
/// none of its collaborations into a step.
fn nothing_to_run(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition
        && tonic_types::StatusExt::get_details_error_info(status).is_some_and(|info| info.reason == "NOTHING_TO_RUN")
}
