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
        ..Default::default()
    });
    call.set_timeout(REPLAN_TIMEOUT);
    if let Ok(value) = request.request_id.parse() {
        call.metadata_mut().insert("x-request-id", value);
    }
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
