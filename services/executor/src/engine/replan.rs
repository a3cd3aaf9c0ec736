//! Loop-back: an agent's collaboration request goes to the planner's
//! `Replan`, with the plan as it stands, the results so far, and the
//! original request's constraints (callers, exclusions, allow patterns), so
//! that what comes back is validated like any plan.

use std::time::Duration;

use agentmesh_core::execution::{Collaboration, ExecutionSpec, ExecutionState, StepStatus};
use agentmesh_core::plan::{Plan, PlanStep};
use agentmesh_proto::convert::{plan_to_pb, step_from_pb};
use agentmesh_proto::v1 as pb;

use super::Engine;
use crate::convert::step_result_to_pb;

/// How long the planner may take to answer.
const REPLAN_TIMEOUT: Duration = Duration::from_secs(300);

/// A collaboration request to put to the planner.
pub struct Request {
    /// The originating request.
    pub request_id: String,
    /// The execution.
    pub execution_id: String,
    /// The step whose agent asked.
    pub step_id: String,
    /// What it asked.
    pub collaboration: Collaboration,
    /// The plan as it stands.
    pub plan: Plan,
    /// Results so far.
    pub results: Vec<pb::StepResult>,
    /// The original request.
    pub spec: ExecutionSpec,
    /// Model preference (empty: the planner's default).
    pub model: String,
    /// Reasoning effort (`agentmesh.v1.ReasoningEffort`; 0: unspecified).
    pub reasoning_effort: i32,
}

/// What the planner decided.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplanOutcome {
    /// Steps to append.
    Steps(Vec<PlanStep>),
    /// Why nothing is appended.
    Rejected(String),
}

/// The results of finished steps, for the planner.
pub fn results(state: &ExecutionState) -> Vec<pb::StepResult> {
    state.steps.iter().filter(|s| s.status != StepStatus::Pending).map(step_result_to_pb).collect()
}

/// Turns collaborations into steps for an extension of a finished execution
/// (a review's recovery actions), one after the other, each planned over
/// the plan as the previous ones left it. Returns the steps, and why the
/// others were rejected.
pub async fn plan_all(
    engine: &Engine,
    execution_id: &str,
    state: &ExecutionState,
    collaborations: Vec<Collaboration>,
    (model, reasoning_effort): (String, i32),
) -> (Vec<PlanStep>, Vec<String>) {
    let mut plan = state.plan();
    let (mut steps, mut rejected) = (Vec::new(), Vec::new());
    for collaboration in collaborations {
        let request = Request {
            request_id: state.spec.request_id.clone(),
            execution_id: execution_id.to_owned(),
            step_id: String::new(),
            collaboration: collaboration.clone(),
            plan: plan.clone(),
            results: results(state),
            spec: state.spec.clone(),
            model: model.clone(),
            reasoning_effort,
        };
        match ask(engine, request).await {
            ReplanOutcome::Steps(added) => {
                plan.steps.extend(added.iter().cloned());
                steps.extend(added);
            }
            ReplanOutcome::Rejected(reason) => {
                tracing::info!(
                    execution_id,
                    agent = %collaboration.agent,
                    capability = %collaboration.capability,
                    reason,
                    "collaboration for an extension rejected"
                );
                engine.metrics.replans.with_label_values(&["rejected"]).inc();
                rejected.push(format!("{}:{}: {reason}", collaboration.agent, collaboration.capability));
            }
        }
    }
    (steps, rejected)
}

/// Asks the planner; a failure to ask is a rejection, never a failed step.
pub async fn ask(engine: &Engine, request: Request) -> ReplanOutcome {
    let Some(planner) = engine.planner.clone() else {
        return ReplanOutcome::Rejected("no planner is configured for this executor (--planner)".into());
    };
    let mut planner = planner;
    let c = &request.collaboration;
    let mut call = tonic::Request::new(pb::ReplanRequest {
        request_id: request.request_id.clone(),
        plan: Some(plan_to_pb(&request.plan)),
        results: request.results,
        collaboration: Some(pb::CollaborationRequest {
            agent: c.agent.clone(),
            capability: c.capability.clone(),
            query: c.query.clone(),
        }),
        caller_agent_ids: request.spec.caller_agent_ids.clone(),
        requesting_step_id: request.step_id.clone(),
        execution_id: request.execution_id.clone(),
        query: request.spec.query.clone(),
        exclude_agents: request.spec.exclude_agents.clone(),
        allow: request.spec.allow.clone(),
        model: request.model.clone(),
        reasoning_effort: request.reasoning_effort,
    });
    call.set_timeout(REPLAN_TIMEOUT);
    if let Ok(value) = request.request_id.parse() {
        call.metadata_mut().insert("x-request-id", value);
    }
    agentmesh_server::auth::on_behalf_of(&mut call, &request.spec.principal);
    match planner.replan(call).await {
        Ok(answer) => {
            let answer = answer.into_inner();
            if answer.rejected {
                ReplanOutcome::Rejected(format!("the planner rejected it: {}", answer.rejection_reason))
            } else {
                ReplanOutcome::Steps(answer.steps.iter().map(step_from_pb).collect())
            }
        }
        Err(status) => ReplanOutcome::Rejected(format!(
            "the planner could not be asked ({:?}): {}",
            status.code(),
            status.message()
        )),
    }
}
