//! The gRPC PlannerService: thin handlers over the planning engine.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use agentmesh_llm::{LlmProvider, Preferred};
use agentmesh_proto::convert::{effort_from_pb, plan_to_pb, step_to_pb};
use agentmesh_proto::json::from_struct;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::planner_service_server::PlannerService;
use agentmesh_store::{InteractionLog, InteractionRecord, Retention};
use agentmesh_telemetry::rpc::TracedChannel;
use chrono::Utc;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::engine::{Interaction, PlanOutcome, PlanStats, Planner, PlanningError, with_request_id};
use crate::metrics::Metrics;
use agentmesh_catalog::{self as catalog, AllowPattern};

/// The service state.
pub struct PlannerGrpc {
    pub(crate) planner: Planner,
    pub(crate) llm: Arc<dyn LlmProvider>,
    pub(crate) discovery: DiscoveryServiceClient<TracedChannel>,
    pub(crate) log: Arc<dyn InteractionLog>,
    pub(crate) retention: Retention,
    pub(crate) self_agent_ids: Vec<String>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) max_query_chars: usize,
}

fn kind_pb(kind: &str) -> pb::LlmInteractionKind {
    match kind {
        "preselection" => pb::LlmInteractionKind::Preselection,
        "plan" => pb::LlmInteractionKind::Plan,
        "plan_retry" => pb::LlmInteractionKind::PlanRetry,
        "hallucination_retry" => pb::LlmInteractionKind::HallucinationRetry,
        "replan" => pb::LlmInteractionKind::Replan,
        "synthesis" => pb::LlmInteractionKind::Synthesis,
        "review" => pb::LlmInteractionKind::Review,
        _ => pb::LlmInteractionKind::Unspecified,
    }
}

fn stats_to_pb(
    stats: &PlanStats,
    interactions: &[Interaction],
    llm: &dyn LlmProvider,
    started: Instant,
) -> pb::PlanningStats {
    let last = interactions.iter().rev().find(|i| i.error.is_none());
    pb::PlanningStats {
        llm_calls: stats.llm_calls,
        retries: stats.retries,
        hallucinations_detected: stats.hallucinations_detected,
        hallucinations_recovered: stats.hallucinations_recovered,
        preselected_capabilities: stats.preselected.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        catalog_size: u32::try_from(stats.catalog_size).unwrap_or(u32::MAX),
        latency_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        model: last.map_or_else(|| llm.model().to_owned(), |i| i.model.clone()),
        structured_output_mode: last.and_then(|i| i.structured_mode).map(|m| m.to_string()).unwrap_or_default(),
        provider: last.map_or_else(|| llm.name().to_owned(), |i| i.provider.clone()),
    }
}

impl PlannerGrpc {
    async fn record(&self, request_id: &str, principal: &str, interactions: &[Interaction]) {
        let now = Utc::now();
        let records: Vec<InteractionRecord> = interactions
            .iter()
            .map(|i| InteractionRecord {
                id: 0,
                request_id: request_id.to_owned(),
                kind: crate::metrics::kind_label(i.kind).to_owned(),
                prompt: i.prompt.clone(),
                response: i.response.clone(),
                model: i.model.clone(),
                provider: i.provider.clone(),
                structured_mode: i.structured_mode.map(|m| m.to_string()).unwrap_or_default(),
                prompt_tokens: i64::from(i.prompt_tokens),
                completion_tokens: i64::from(i.completion_tokens),
                latency_ms: i64::try_from(i.latency.as_millis()).unwrap_or(i64::MAX),
                error: i.error.clone(),
                created_at: now,
                principal: principal.to_owned(),
            })
            .collect();
        if let Err(e) = self.log.record(&records, self.retention).await {
            tracing::warn!(request_id, error = %e, "could not record LLM interactions");
        }
    }

    fn excluded(&self, callers: &[String], more: &[String]) -> Vec<String> {
        let mut excluded: Vec<String> = self.self_agent_ids.iter().chain(callers).chain(more).cloned().collect();
        excluded.sort();
        excluded.dedup();
        excluded
    }

    async fn planning_failed(&self, request_id: &str, principal: &str, error: PlanningError) -> Status {
        let interactions = match &error {
            PlanningError::Hallucination { interactions, stats, .. }
            | PlanningError::Exhausted { interactions, stats, .. }
            | PlanningError::Llm { interactions, stats, .. } => {
                self.metrics.observe_planning(stats, interactions);
                interactions.clone()
            }
        };
        if matches!(error, PlanningError::Hallucination { .. }) {
            self.metrics.hallucinations_unrecoverable.inc();
        }
        self.record(request_id, principal, &interactions).await;
        tracing::warn!(request_id, operation = "create_plan", error = %error, "no plan");
        match error {
            PlanningError::Llm { error, .. } if error.should_fall_back() => Status::unavailable(error.to_string()),
            PlanningError::Llm { error, .. } => Status::failed_precondition(error.to_string()),
            other => Status::failed_precondition(other.to_string()),
        }
    }
}

#[tonic::async_trait]
impl PlannerService for PlannerGrpc {
    async fn create_plan(
        &self,
        request: Request<pb::CreatePlanRequest>,
    ) -> Result<Response<pb::CreatePlanResponse>, Status> {
        let started = Instant::now();
        let request_id = agentmesh_server::call_request_id(request.metadata(), &request.get_ref().request_id)?;
        let principal = agentmesh_server::auth::acting_for(&request);
        let r = request.into_inner();
        if r.query.trim().is_empty() {
            return Err(Status::invalid_argument("query must not be empty"));
        }
        let length = r.query.chars().count();
        if length > self.max_query_chars {
            return Err(Status::invalid_argument(format!(
                "query is {length} characters; the planner accepts at most {} (max_query_chars)",
                self.max_query_chars
            )));
        }
        let allow = AllowPattern::parse_all(&r.allow).map_err(Status::invalid_argument)?;
        let excluded = self.excluded(&r.caller_agent_ids, &r.exclude_agents);
        let mut discovery = self.discovery.clone();
        let fetched = catalog::fetch(&mut discovery, &excluded, r.include_unhealthy, &request_id)
            .await
            .map_err(|s| Status::unavailable(format!("discovery is unavailable: {}", s.message())))?;
        let mut catalog = fetched.capabilities.clone();
        if !allow.is_empty() {
            catalog.retain(|c| allow.iter().any(|p| p.matches(c)));
        }
        tracing::info!(request_id, operation = "create_plan", catalog = catalog.len(), "planning");
        let span = tracing::info_span!("create_plan", request_id = %request_id, operation = "create_plan");
        let llm = Preferred::new(self.llm.as_ref(), Some(r.model.clone()), effort_from_pb(r.reasoning_effort));
        let planning = self.planner.plan(&llm, &r.query, &catalog);
        match with_request_id(&request_id, planning).instrument(span).await {
            Ok(PlanOutcome { mut plan, stats, interactions }) => {
                let note = fetched.health_note();
                if plan.steps.is_empty() && !note.is_empty() {
                    plan.reasoning = format!("{}; {note}", plan.reasoning.trim_end_matches(['.', ' ']));
                }
                self.metrics.observe_planning(&stats, &interactions);
                self.record(&request_id, &principal, &interactions).await;
                let stats = stats_to_pb(&stats, &interactions, self.llm.as_ref(), started);
                tracing::info!(
                    request_id,
                    operation = "create_plan",
                    steps = plan.steps.len(),
                    llm_calls = stats.llm_calls,
                    duration_ms = stats.latency_ms,
                    "plan ready"
                );
                Ok(Response::new(pb::CreatePlanResponse {
                    zero_step_reason: if plan.steps.is_empty() { plan.reasoning.clone() } else { String::new() },
                    plan: Some(plan_to_pb(&plan)),
                    request_id,
                    stats: Some(stats),
                }))
            }
            Err(e) => Err(self.planning_failed(&request_id, &principal, e).await),
        }
    }

    async fn replan(&self, request: Request<pb::ReplanRequest>) -> Result<Response<pb::ReplanResponse>, Status> {
        let started = Instant::now();
        let request_id = agentmesh_server::call_request_id(request.metadata(), &request.get_ref().request_id)?;
        let principal = agentmesh_server::auth::acting_for(&request);
        let r = request.into_inner();
        let Some(collab) = r.collaboration else {
            return Err(Status::invalid_argument("collaboration is required"));
        };
        let rejected = |reason: String| {
            Ok(Response::new(pb::ReplanResponse {
                steps: Vec::new(),
                rejected: true,
                rejection_reason: reason,
                stats: None,
            }))
        };
        let allow = AllowPattern::parse_all(&r.allow).map_err(Status::invalid_argument)?;
        if self.excluded(&r.caller_agent_ids, &[]).contains(&collab.agent) {
            return rejected(format!("agent `{}` is the calling orchestrator itself", collab.agent));
        }
        if r.exclude_agents.contains(&collab.agent) {
            return rejected(format!("agent `{}` was excluded by the original request", collab.agent));
        }
        let excluded = self.excluded(&r.caller_agent_ids, &r.exclude_agents);
        let mut discovery = self.discovery.clone();
        let catalog = catalog::fetch(&mut discovery, &excluded, false, &request_id)
            .await
            .map_err(|s| Status::unavailable(format!("discovery is unavailable: {}", s.message())))?
            .capabilities;
        let allowed: Vec<_> = catalog
            .into_iter()
            .filter(|c| c.agent == collab.agent && (collab.capability.is_empty() || c.capability == collab.capability))
            .collect();
        if !allowed.is_empty() && !allow.is_empty() && !allowed.iter().any(|c| allow.iter().any(|p| p.matches(c))) {
            return rejected(format!(
                "`{}:{}` is not allowed by the original request's allow patterns",
                collab.agent, collab.capability
            ));
        }
        let allowed: Vec<_> =
            allowed.into_iter().filter(|c| allow.is_empty() || allow.iter().any(|p| p.matches(c))).collect();
        if allowed.is_empty() {
            return rejected(format!(
                "`{}:{}` is not available: no such active agent or capability, or it is internal",
                collab.agent, collab.capability
            ));
        }
        let span = tracing::info_span!("replan", request_id = %request_id, operation = "replan");
        let llm = Preferred::new(self.llm.as_ref(), Some(r.model.clone()), effort_from_pb(r.reasoning_effort));
        let planning = self.planner.replan(&llm, &collab.query, &allowed);
        let outcome = match with_request_id(&request_id, planning).instrument(span).await {
            Ok(outcome) => outcome,
            Err(e) => return Err(self.planning_failed(&request_id, &principal, e).await),
        };
        self.metrics.observe_planning(&outcome.stats, &outcome.interactions);
        self.record(&request_id, &principal, &outcome.interactions).await;
        // Fresh ids after the existing plan's; dependencies only on new steps
        // or on steps that already succeeded.
        let existing: HashSet<String> =
            r.plan.as_ref().map(|p| p.steps.iter().map(|s| s.step_id.clone()).collect()).unwrap_or_default();
        let succeeded: HashSet<String> = r
            .results
            .iter()
            .filter(|res| res.status == pb::StepStatus::Succeeded as i32)
            .map(|res| res.step_id.clone())
            .collect();
        let mut next = existing.len() + 1;
        let mut renamed = HashMap::new();
        for step in &outcome.plan.steps {
            while existing.contains(&format!("s{next}")) {
                next += 1;
            }
            renamed.insert(step.step_id.clone(), format!("s{next}"));
            next += 1;
        }
        let steps = outcome
            .plan
            .steps
            .iter()
            .map(|s| {
                let mut step = s.clone();
                step.depends_on.retain(|d| renamed.contains_key(d) || succeeded.contains(d));
                step.rename_steps(&renamed);
                step_to_pb(&step)
            })
            .collect();
        let stats = stats_to_pb(&outcome.stats, &outcome.interactions, self.llm.as_ref(), started);
        Ok(Response::new(pb::ReplanResponse {
            steps,
            rejected: false,
            rejection_reason: String::new(),
            stats: Some(stats),
        }))
    }

    async fn list_interactions(
        &self,
        request: Request<pb::ListInteractionsRequest>,
    ) -> Result<Response<pb::ListInteractionsResponse>, Status> {
        // A client reads the calls made for it; operators and services every call.
        let principal = agentmesh_server::principal_of(request.extensions());
        let only = (!principal.sees_everything()).then_some(principal.name.as_str());
        let request_id = request.into_inner().request_id;
        if request_id.is_empty() {
            return Err(Status::invalid_argument("request_id is required"));
        }
        let records = self
            .log
            .interactions(&request_id, only, Utc::now())
            .await
            .map_err(|e| Status::unavailable(format!("interaction log unavailable: {e}")))?;
        let interactions = records
            .into_iter()
            .map(|r| pb::LlmInteraction {
                id: r.id.to_string(),
                request_id: r.request_id,
                kind: kind_pb(&r.kind) as i32,
                prompt: r.prompt,
                response: r.response,
                model: r.model,
                provider: r.provider,
                structured_output_mode: r.structured_mode,
                prompt_tokens: u32::try_from(r.prompt_tokens).unwrap_or(0),
                completion_tokens: u32::try_from(r.completion_tokens).unwrap_or(0),
                latency_ms: u64::try_from(r.latency_ms).unwrap_or(0),
                error: r.error.unwrap_or_default(),
                created_at: Some(prost_types::Timestamp {
                    seconds: r.created_at.timestamp(),
                    nanos: i32::try_from(r.created_at.timestamp_subsec_nanos()).unwrap_or(0),
                }),
            })
            .collect();
        Ok(Response::new(pb::ListInteractionsResponse { interactions }))
    }
}

/// Parameters of a step as JSON (for clients).
pub fn parameters_json(step: &pb::PlanStep) -> serde_json::Value {
    step.parameters.as_ref().map_or_else(|| serde_json::json!({}), from_struct)
}
