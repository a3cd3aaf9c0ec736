//! Plans between the domain model and protobuf, in one place for every
//! service and client.

use agentmesh_core::ReasoningEffort;
use agentmesh_core::plan::{Plan, PlanStep};
use serde_json::Value;

use crate::json::{from_struct, to_struct};
use crate::v1 as pb;

/// A plan step to protobuf.
pub fn step_to_pb(s: &PlanStep) -> pb::PlanStep {
    pb::PlanStep {
        step_id: s.step_id.clone(),
        agent: s.agent.clone(),
        capability: s.capability.clone(),
        instruction: s.instruction.clone(),
        parameters: to_struct(&s.parameters),
        depends_on: s.depends_on.clone(),
    }
}

/// A plan to protobuf.
pub fn plan_to_pb(plan: &Plan) -> pb::Plan {
    pb::Plan { reasoning: plan.reasoning.clone(), steps: plan.steps.iter().map(step_to_pb).collect() }
}

/// A protobuf plan step (absent parameters are `{}`).
pub fn step_from_pb(s: &pb::PlanStep) -> PlanStep {
    PlanStep {
        step_id: s.step_id.clone(),
        agent: s.agent.clone(),
        capability: s.capability.clone(),
        instruction: s.instruction.clone(),
        parameters: s.parameters.as_ref().map_or_else(|| Value::Object(serde_json::Map::new()), from_struct),
        depends_on: s.depends_on.clone(),
    }
}

/// A protobuf plan.
pub fn plan_from_pb(plan: &pb::Plan) -> Plan {
    Plan { reasoning: plan.reasoning.clone(), steps: plan.steps.iter().map(step_from_pb).collect() }
}

/// A request's `reasoning_effort`, `None` when unspecified (or unknown).
pub fn effort_from_pb(value: i32) -> Option<ReasoningEffort> {
    match pb::ReasoningEffort::try_from(value).unwrap_or_default() {
        pb::ReasoningEffort::Unspecified => None,
        pb::ReasoningEffort::Minimal => Some(ReasoningEffort::Minimal),
        pb::ReasoningEffort::Low => Some(ReasoningEffort::Low),
        pb::ReasoningEffort::Medium => Some(ReasoningEffort::Medium),
        pb::ReasoningEffort::High => Some(ReasoningEffort::High),
    }
}
