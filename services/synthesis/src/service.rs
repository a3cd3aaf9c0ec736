//! The gRPC SynthesisService: Synthesize streams an answer from the
//! provider's own streaming; Review asks for a schema-constrained judgement
//! and keeps only what can be acted on. Every LLM call goes to the
//! interaction log (kinds `synthesis` and `review`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentmesh_core::fence::Fence;
use agentmesh_llm::{Completion, CompletionRequest, LlmError, LlmProvider, Message, Preferred, Role};
use agentmesh_proto::convert::{effort_from_pb, step_from_pb};
use agentmesh_proto::json::from_value;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::synthesis_service_server::SynthesisService;
use agentmesh_store::{InteractionLog, InteractionRecord, Retention};
use agentmesh_telemetry::rpc::TracedChannel;
use chrono::Utc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::engine::{Action, AnswerPlan, RunOutcome, StepOutcome, StepState, Synthesizer, Verdict};
use crate::metrics::Metrics;

/// What every request shares.
pub struct Inner {
    pub(crate) synthesizer: Synthesizer,
    pub(crate) llm: Arc<dyn LlmProvider>,
    pub(crate) discovery: DiscoveryServiceClient<TracedChannel>,
    pub(crate) log: Arc<dyn InteractionLog>,
    pub(crate) retention: Retention,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) max_query_chars: usize,
}

/// The service.
#[derive(Clone)]
pub struct SynthesisGrpc {
    pub(crate) inner: Arc<Inner>,
}

/// The steps of `plan` joined with their latest results; results of steps
/// the plan does not name (added while running) come last.
pub fn run_outcome(
    query: &str,
    plan: Option<&pb::Plan>,
    results: &[pb::StepResult],
    zero_step_reason: &str,
) -> RunOutcome {
    let state = |status: i32| match pb::StepStatus::try_from(status).unwrap_or_default() {
        pb::StepStatus::Succeeded => StepState::Succeeded,
        pb::StepStatus::Failed => StepState::Failed,
        pb::StepStatus::Skipped => StepState::Skipped,
        pb::StepStatus::Cancelled => StepState::Cancelled,
        _ => StepState::Unfinished,
    };
    let outcome_of = |step: agentmesh_core::plan::PlanStep| {
        let result = results.iter().rev().find(|r| r.step_id == step.step_id);
        StepOutcome {
            state: result.map_or(StepState::Unfinished, |r| state(r.status)),
            output: result.and_then(|r| r.output.as_ref()).map(from_value),
            error: result.map(|r| r.error.clone()).unwrap_or_default(),
            step,
        }
    };
    let mut steps: Vec<StepOutcome> =
        plan.map(|p| p.steps.iter().map(step_from_pb).map(outcome_of).collect()).unwrap_or_default();
    for r in results {
        if !steps.iter().any(|s| s.step.step_id == r.step_id) {
            steps.push(outcome_of(agentmesh_core::plan::PlanStep {
                step_id: r.step_id.clone(),
                agent: "unknown".into(),
                capability: "unknown".into(),
                instruction: String::new(),
                parameters: serde_json::json!({}),
                depends_on: Vec::new(),
            }));
        }
    }
    RunOutcome { query: query.to_owned(), steps, zero_step_reason: zero_step_reason.to_owned() }
}

fn render(messages: &[Message]) -> String {
    messages.iter().map(|m| format!("[{:?}]\n{}", m.role, m.content)).collect::<Vec<_>>().join("\n\n")
}

fn llm_status(error: &LlmError) -> Status {
    if error.should_fall_back() {
        Status::unavailable(error.to_string())
    } else {
        Status::failed_precondition(error.to_string())
    }
}

fn usage(completion: &Completion) -> pb::TokenUsage {
    pb::TokenUsage {
        prompt_tokens: completion.usage.prompt_tokens,
        completion_tokens: completion.usage.completion_tokens,
        total_tokens: completion.usage.prompt_tokens.saturating_add(completion.usage.completion_tokens),
    }
}

fn code_label(status: &Status) -> &'static str {
    match status.code() {
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        _ => "OTHER",
    }
}

impl Inner {
    fn check_query(&self, query: &str) -> Result<(), Status> {
        if query.trim().is_empty() {
            return Err(Status::invalid_argument("query must not be empty"));
        }
        let length = query.chars().count();
        if length > self.max_query_chars {
            return Err(Status::invalid_argument(format!(
                "query is {length} characters; synthesis accepts at most {} (max_query_chars)",
                self.max_query_chars
            )));
        }
        Ok(())
    }

    /// Records one LLM call, made for `principal`, in the interaction log.
    async fn record(
        &self,
        (request_id, principal): (&str, &str),
        kind: &str,
        request: &CompletionRequest,
        result: Result<&Completion, String>,
        latency: Duration,
    ) {
        let status = if result.is_ok() { "ok" } else { "error" };
        self.metrics.llm_calls.with_label_values(&[kind, status]).inc();
        let (response, model, provider, mode, tokens, error) = match result {
            Ok(c) => (
                c.text.clone(),
                c.model.clone(),
                c.provider.clone(),
                c.structured_mode.map(|m| m.to_string()).unwrap_or_default(),
                c.usage,
                None,
            ),
            Err(e) => (
                String::new(),
                request.model.clone().unwrap_or_else(|| self.llm.model().to_owned()),
                self.llm.name().to_owned(),
                String::new(),
                agentmesh_llm::Usage::default(),
                Some(e),
            ),
        };
        let record = InteractionRecord {
            id: 0,
            request_id: request_id.to_owned(),
            kind: kind.to_owned(),
            prompt: render(&request.messages),
            response,
            model,
            provider,
            structured_mode: mode,
            prompt_tokens: i64::from(tokens.prompt_tokens),
            completion_tokens: i64::from(tokens.completion_tokens),
            latency_ms: i64::try_from(latency.as_millis()).unwrap_or(i64::MAX),
            error,
            created_at: Utc::now(),
            principal: principal.to_owned(),
        };
        if let Err(e) = self.log.record(&[record], self.retention).await {
            tracing::warn!(request_id, error = %e, "could not record an LLM interaction");
        }
    }

    fn finish(&self, rpc: &str, started: Instant, outcome: Result<(), &Status>) {
        let label = outcome.map_or_else(code_label, |()| "OK");
        self.metrics.requests.with_label_values(&[rpc, label]).inc();
        self.metrics.request_duration.with_label_values(&[rpc]).observe(started.elapsed().as_secs_f64());
    }

    /// Streams the model's answer into `tx`, then the footer and the done
    /// message; stops early when the client goes away. With `grounding`,
    /// the answer is held until it is whole and checked against it: one
    /// that states values the results do not contain is replaced by an
    /// answer made of the facts.
    async fn stream_answer(
        self: Arc<Self>,
        request_id: String,
        principal: String,
        request: CompletionRequest,
        footer: Option<String>,
        grounding: Option<crate::engine::Grounding>,
        tx: mpsc::UnboundedSender<Result<pb::SynthesizeResponse, Status>>,
    ) {
        let started = Instant::now();
        let chunks = tx.clone();
        let held = grounding.is_some();
        let mut on_text = move |text: &str| {
            if !text.is_empty() && !held {
                let _ = chunks.send(Ok(pb::SynthesizeResponse {
                    chunk: Some(pb::synthesize_response::Chunk::Text(text.to_owned())),
                }));
            }
        };
        let result = tokio::select! {
            result = self.llm.stream(&request, &mut on_text) => Some(result),
            () = tx.closed() => None,
        };
        let latency = started.elapsed();
        match result {
            None => {
                tracing::info!(request_id, "the client went away; synthesis stopped");
                self.record(
                    (&request_id, &principal),
                    "synthesis",
                    &request,
                    Err("the client went away".into()),
                    latency,
                )
                .await;
                self.finish("Synthesize", started, Err(&Status::cancelled("client went away")));
            }
            Some(Err(e)) => {
                tracing::warn!(request_id, error = %e, "synthesis failed");
                self.record((&request_id, &principal), "synthesis", &request, Err(e.to_string()), latency).await;
                let status = llm_status(&e);
                self.finish("Synthesize", started, Err(&status));
                let _ = tx.send(Err(status));
            }
            Some(Ok(completion)) => {
                self.record((&request_id, &principal), "synthesis", &request, Ok(&completion), latency).await;
                if let Some(grounding) = &grounding {
                    let claims = grounding.unsupported_claims(&completion.text);
                    let text = if claims.is_empty() && grounding.uses_facts(&completion.text) {
                        completion.text.clone()
                    } else {
                        self.metrics.unsupported_answers.with_label_values(&["replaced"]).inc();
                        tracing::warn!(request_id, claims = ?claims,
                            "the answer stated values the results do not contain, or none they do; answered with the facts instead");
                        agentmesh_core::grounding::extractive_answer(&grounding.facts)
                    };
                    let _ =
                        tx.send(Ok(pb::SynthesizeResponse { chunk: Some(pb::synthesize_response::Chunk::Text(text)) }));
                }
                let mut tail = String::new();
                if completion.truncated {
                    tracing::warn!(request_id, "the answer was cut off at the token limit (answer_max_tokens)");
                    tail.push_str(" …\n(The answer was cut off at its length limit.)");
                }
                if let Some(footer) = footer {
                    tail.push_str(&footer);
                }
                if !tail.is_empty() {
                    let _ =
                        tx.send(Ok(pb::SynthesizeResponse { chunk: Some(pb::synthesize_response::Chunk::Text(tail)) }));
                }
                let done = pb::SynthesisDone {
                    usage: Some(usage(&completion)),
                    model: completion.model.clone(),
                    provider: completion.provider.clone(),
                };
                let _ = tx.send(Ok(pb::SynthesizeResponse { chunk: Some(pb::synthesize_response::Chunk::Done(done)) }));
                self.finish("Synthesize", started, Ok(()));
                tracing::info!(
                    request_id,
                    chars = completion.text.len(),
                    duration_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
                    "answer streamed"
                );
            }
        }
    }

    /// The catalog, or `None` when discovery does not answer.
    async fn catalog(&self, request_id: &str) -> Option<agentmesh_catalog::Catalog> {
        let mut discovery = self.discovery.clone();
        match agentmesh_catalog::fetch(&mut discovery, &[], false, request_id).await {
            Ok(catalog) => Some(catalog),
            Err(status) => {
                tracing::warn!(
                    request_id,
                    error = %status.message(),
                    "discovery is unavailable; the review judges without a catalog, suggests no new steps and \
                     retries nothing without the user"
                );
                None
            }
        }
    }

    async fn review(
        &self,
        r: pb::ReviewRequest,
        request_id: &str,
        principal: &str,
    ) -> Result<pb::ReviewResponse, Status> {
        let outcome = run_outcome(&r.query, r.plan.as_ref(), &r.results, "");
        let (catalog, destructive) = match self.catalog(request_id).await {
            Some(c) => (c.capabilities, Some(c.destructive)),
            None => (Vec::new(), None),
        };
        let candidates = self.synthesizer.review_candidates(&r.query, &catalog);
        let fence = Fence::with_nonce(&format!("{:016x}", rand::random::<u64>()));
        let base = self.synthesizer.review_request(&outcome, &r.answer, &candidates, &fence);
        let llm = Preferred::new(self.llm.as_ref(), Some(r.model.clone()), effort_from_pb(r.reasoning_effort));
        let mut request = base.clone();
        let mut total = pb::TokenUsage::default();
        let attempts = self.synthesizer.settings().review_retries + 1;
        let mut last_problem = String::new();
        for attempt in 1..=attempts {
            let started = Instant::now();
            let result = llm.complete(&request).await;
            let latency = started.elapsed();
            let completion = match result {
                Ok(c) => c,
                Err(e) => {
                    self.record((request_id, principal), "review", &request, Err(e.to_string()), latency).await;
                    return Err(llm_status(&e));
                }
            };
            self.record((request_id, principal), "review", &request, Ok(&completion), latency).await;
            let u = usage(&completion);
            total.prompt_tokens = total.prompt_tokens.saturating_add(u.prompt_tokens);
            total.completion_tokens = total.completion_tokens.saturating_add(u.completion_tokens);
            total.total_tokens = total.total_tokens.saturating_add(u.total_tokens);
            match self.synthesizer.read_review(&completion.text, &outcome, &catalog) {
                Ok(mut verdict) => {
                    let turned = crate::engine::guard_destructive(&mut verdict, &outcome, destructive.as_ref());
                    if turned > 0 {
                        tracing::warn!(
                            request_id,
                            turned,
                            "the review proposed running a destructive capability again: asking the user instead"
                        );
                    }
                    // Compared, not judged by the model.
                    let grounding = crate::engine::Grounding::of(&outcome, self.synthesizer.settings().max_facts);
                    verdict.unsupported_claims = grounding.unsupported_claims(&r.answer);
                    if !verdict.unsupported_claims.is_empty() {
                        self.metrics.unsupported_answers.with_label_values(&["flagged"]).inc();
                        tracing::warn!(request_id, claims = ?verdict.unsupported_claims,
                            "the answer states values found neither in the results nor in the request");
                    }
                    return Ok(pb::ReviewResponse {
                        review: Some(self.verdict_to_pb(request_id, verdict, &outcome)),
                        usage: Some(total),
                    });
                }
                Err(problem) => {
                    let problem = if completion.truncated {
                        format!("{problem} (the answer was cut off at the token limit, review_max_tokens)")
                    } else {
                        problem
                    };
                    tracing::info!(request_id, attempt, problem = %problem, "the review could not be read; asking again");
                    request = base.clone();
                    if completion.truncated {
                        // The cut answer would only use up the room again: ask for a shorter one.
                        request.messages.push(Message::user(
                            "Your last answer was too long and was cut off. Answer again with one short JSON object: \
                             a one-sentence summary, goal_achieved, confidence, at most two short missing_data \
                             items, and recovery_actions."
                                .to_owned(),
                        ));
                    } else {
                        request.messages.push(Message { role: Role::Assistant, content: completion.text.clone() });
                        request.messages.push(Message::user(format!(
                            "That answer could not be used: {problem}. Answer again with one JSON object with the \
                             fields summary, goal_achieved, confidence, missing_data and recovery_actions."
                        )));
                    }
                    last_problem = problem;
                }
            }
        }
        Err(Status::failed_precondition(format!(
            "the review could not be read after {attempts} attempts: {last_problem}; see `agentmesh interactions {request_id}`"
        )))
    }

    /// The review as sent: a `retry_step` carries the collaboration that
    /// runs its step again (same agent and capability, the step's
    /// instruction), so that every recovery action is acted on one way.
    fn verdict_to_pb(&self, request_id: &str, verdict: Verdict, outcome: &RunOutcome) -> pb::Review {
        for why in &verdict.dropped {
            tracing::info!(request_id, reason = %why, "review suggestion dropped");
        }
        self.metrics.actions_dropped.inc_by(verdict.dropped.len() as u64);
        let label = if verdict.goal_achieved { "achieved" } else { "not_achieved" };
        self.metrics.reviews.with_label_values(&[label]).inc();
        let recovery_actions = verdict
            .actions
            .into_iter()
            .map(|action| match action {
                Action::AddStep { agent, capability, query, reason } => pb::RecoveryAction {
                    kind: pb::RecoveryActionKind::AddStep as i32,
                    collaboration: Some(pb::CollaborationRequest { agent, capability, query }),
                    reason,
                    step_id: String::new(),
                },
                Action::RetryStep { step_id, reason } => pb::RecoveryAction {
                    kind: pb::RecoveryActionKind::RetryStep as i32,
                    collaboration: outcome.steps.iter().find(|s| s.step.step_id == step_id).map(|s| {
                        pb::CollaborationRequest {
                            agent: s.step.agent.clone(),
                            capability: s.step.capability.clone(),
                            query: if s.step.instruction.is_empty() {
                                reason.clone()
                            } else {
                                s.step.instruction.clone()
                            },
                        }
                    }),
                    reason,
                    step_id,
                },
                Action::AskUser { reason } => pb::RecoveryAction {
                    kind: pb::RecoveryActionKind::AskUser as i32,
                    collaboration: None,
                    reason,
                    step_id: String::new(),
                },
            })
            .collect();
        pb::Review {
            goal_achieved: verdict.goal_achieved,
            confidence: verdict.confidence,
            summary: verdict.summary,
            missing_data: verdict.missing_data,
            recovery_actions,
            unsupported_claims: verdict.unsupported_claims,
        }
    }
}

#[tonic::async_trait]
impl SynthesisService for SynthesisGrpc {
    type SynthesizeStream = UnboundedReceiverStream<Result<pb::SynthesizeResponse, Status>>;

    async fn synthesize(
        &self,
        request: Request<pb::SynthesizeRequest>,
    ) -> Result<Response<Self::SynthesizeStream>, Status> {
        let started = Instant::now();
        let request_id = agentmesh_server::call_request_id(request.metadata(), &request.get_ref().request_id)?;
        let principal = agentmesh_server::auth::acting_for(&request);
        let r = request.into_inner();
        let inner = self.inner.clone();
        if let Err(status) = inner.check_query(&r.query) {
            inner.finish("Synthesize", started, Err(&status));
            return Err(status);
        }
        let outcome = run_outcome(&r.query, r.plan.as_ref(), &r.results, &r.zero_step_reason);
        let fence = Fence::with_nonce(&format!("{:016x}", rand::random::<u64>()));
        let (tx, rx) = mpsc::unbounded_channel();
        match inner.synthesizer.answer(&outcome, &fence) {
            AnswerPlan::Direct(text) => {
                inner.metrics.direct_answers.inc();
                tracing::info!(request_id, steps = outcome.steps.len(), "answered without the model");
                let _ = tx.send(Ok(pb::SynthesizeResponse { chunk: Some(pb::synthesize_response::Chunk::Text(text)) }));
                let done = pb::SynthesisDone {
                    usage: Some(pb::TokenUsage::default()),
                    model: String::new(),
                    provider: "agentmesh".into(),
                };
                let _ = tx.send(Ok(pb::SynthesizeResponse { chunk: Some(pb::synthesize_response::Chunk::Done(done)) }));
                inner.finish("Synthesize", started, Ok(()));
            }
            AnswerPlan::Model { mut request, footer, grounding } => {
                if !r.model.trim().is_empty() {
                    request.model = Some(r.model.clone());
                }
                request.reasoning_effort = effort_from_pb(r.reasoning_effort);
                let span = tracing::info_span!("synthesize", request_id = %request_id, operation = "synthesize");
                let grounding = inner.synthesizer.settings().replace_ungrounded.then_some(grounding);
                tokio::spawn(
                    inner.stream_answer(request_id, principal, *request, footer, grounding, tx).instrument(span),
                );
            }
        }
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }

    async fn review(&self, request: Request<pb::ReviewRequest>) -> Result<Response<pb::ReviewResponse>, Status> {
        let started = Instant::now();
        let request_id = agentmesh_server::call_request_id(request.metadata(), &request.get_ref().request_id)?;
        let principal = agentmesh_server::auth::acting_for(&request);
        let r = request.into_inner();
        let inner = self.inner.clone();
        if let Err(status) = inner.check_query(&r.query) {
            inner.finish("Review", started, Err(&status));
            return Err(status);
        }
        let span = tracing::info_span!("review", request_id = %request_id, operation = "review");
        let result = inner.review(r, &request_id, &principal).instrument(span).await;
        inner.finish("Review", started, result.as_ref().map(|_| ()));
        match &result {
            Ok(response) => {
                let review = response.review.as_ref();
                tracing::info!(
                    request_id,
                    goal_achieved = review.is_some_and(|r| r.goal_achieved),
                    actions = review.map_or(0, |r| r.recovery_actions.len()),
                    "review ready"
                );
            }
            Err(status) => tracing::warn!(request_id, error = %status.message(), "no review"),
        }
        result.map(Response::new)
    }
}
