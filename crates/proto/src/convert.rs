//! Plans and executions between the domain model and protobuf, in one place for every
//! service and client.

use agentmesh_core::execution::{Collaboration, Event, EventKind, EventPayload, StepState, StepStatus};
use agentmesh_core::plan::{Plan, PlanStep};
use agentmesh_core::{Hints, ReasoningEffort, Transport};
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::json::{from_struct, from_value, to_struct, to_value};
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

/// A timestamp to protobuf.
pub fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: at.timestamp(), nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0) }
}

/// A transport to protobuf.
pub fn transport_to_pb(transport: Transport) -> pb::Transport {
    match transport {
        Transport::Http => pb::Transport::Http,
        Transport::Grpc => pb::Transport::Grpc,
        Transport::Mcp => pb::Transport::Mcp,
        Transport::A2a => pb::Transport::A2a,
    }
}

/// A protobuf transport; unspecified (or unknown) is HTTP.
pub fn transport_from_pb(value: i32) -> Transport {
    match pb::Transport::try_from(value) {
        Ok(pb::Transport::Grpc) => Transport::Grpc,
        Ok(pb::Transport::Mcp) => Transport::Mcp,
        Ok(pb::Transport::A2a) => Transport::A2a,
        Ok(pb::Transport::Http | pb::Transport::Unspecified) | Err(_) => Transport::Http,
    }
}

/// Capability hints to protobuf.
pub fn hints_to_pb(hints: &Hints) -> pb::CapabilityHints {
    pb::CapabilityHints {
        read_only: hints.read_only,
        destructive: hints.destructive,
        idempotent: hints.idempotent,
        open_world: hints.open_world,
        idempotency_key: hints.idempotency_key,
    }
}

/// Capability hints from protobuf.
pub fn hints_from_pb(hints: &pb::CapabilityHints) -> Hints {
    Hints {
        read_only: hints.read_only,
        destructive: hints.destructive,
        idempotent: hints.idempotent,
        open_world: hints.open_world,
        idempotency_key: hints.idempotency_key,
    }
}

/// Execution event kinds in the domain and in protobuf.
const KINDS: [(EventKind, pb::ExecutionEventKind); 14] = [
    (EventKind::ExecutionStarted, pb::ExecutionEventKind::ExecutionStarted),
    (EventKind::StepStarted, pb::ExecutionEventKind::StepStarted),
    (EventKind::StepRetrying, pb::ExecutionEventKind::StepRetrying),
    (EventKind::StepSucceeded, pb::ExecutionEventKind::StepSucceeded),
    (EventKind::StepFailed, pb::ExecutionEventKind::StepFailed),
    (EventKind::StepSkipped, pb::ExecutionEventKind::StepSkipped),
    (EventKind::StepCancelled, pb::ExecutionEventKind::StepCancelled),
    (EventKind::PlanExtended, pb::ExecutionEventKind::PlanExtended),
    (EventKind::ReplanRejected, pb::ExecutionEventKind::ReplanRejected),
    (EventKind::ExecutionCompleted, pb::ExecutionEventKind::ExecutionCompleted),
    (EventKind::ExecutionFailed, pb::ExecutionEventKind::ExecutionFailed),
    (EventKind::ExecutionCancelled, pb::ExecutionEventKind::ExecutionCancelled),
    (EventKind::ExecutionExtended, pb::ExecutionEventKind::ExecutionExtended),
    (EventKind::StepProgress, pb::ExecutionEventKind::StepProgress),
];

fn kind_to_pb(kind: EventKind) -> pb::ExecutionEventKind {
    KINDS.iter().find(|(k, _)| *k == kind).map_or(pb::ExecutionEventKind::Unspecified, |(_, p)| *p)
}

fn kind_from_pb(kind: i32) -> Option<EventKind> {
    KINDS.iter().find(|(_, p)| *p as i32 == kind).map(|(k, _)| *k)
}

fn collaboration_to_pb(c: &Collaboration) -> pb::CollaborationRequest {
    pb::CollaborationRequest { agent: c.agent.clone(), capability: c.capability.clone(), query: c.query.clone() }
}

/// A collaboration request from protobuf.
pub fn collaboration_from_pb(c: &pb::CollaborationRequest) -> Collaboration {
    Collaboration { agent: c.agent.clone(), capability: c.capability.clone(), query: c.query.clone() }
}

/// An event to protobuf.
pub fn event_to_pb(execution_id: &str, event: &Event) -> pb::ExecutionEvent {
    let p = &event.payload;
    pb::ExecutionEvent {
        execution_id: execution_id.to_owned(),
        sequence: event.sequence,
        kind: kind_to_pb(event.kind) as i32,
        step_id: event.step_id.clone(),
        attempt: event.attempt,
        output: p.output.as_ref().map(to_value),
        error: p.error.clone(),
        added_steps: p.added_steps.iter().map(step_to_pb).collect(),
        occurred_at: Some(timestamp(event.at)),
        agent_id: p.agent_id.clone(),
        retry_delay_ms: p.retry_delay_ms,
        collaborate: p.collaborate.as_ref().map(collaboration_to_pb),
        duration_ms: p.duration_ms,
        progress: p.progress.as_ref().map(|p| pb::StepProgress {
            progress: p.progress,
            total: p.total,
            message: p.message.clone(),
        }),
    }
}

fn step_status_to_pb(status: StepStatus) -> pb::StepStatus {
    match status {
        StepStatus::Pending => pb::StepStatus::Pending,
        StepStatus::Running => pb::StepStatus::Running,
        StepStatus::Succeeded => pb::StepStatus::Succeeded,
        StepStatus::Failed => pb::StepStatus::Failed,
        StepStatus::Skipped => pb::StepStatus::Skipped,
        StepStatus::Cancelled => pb::StepStatus::Cancelled,
    }
}

/// One step's result to protobuf.
pub fn step_result_to_pb(s: &StepState) -> pb::StepResult {
    let duration_ms = match (s.started_at, s.finished_at) {
        (Some(start), Some(end)) => u64::try_from((end - start).num_milliseconds()).unwrap_or_default(),
        _ => 0,
    };
    pb::StepResult {
        step_id: s.step.step_id.clone(),
        status: step_status_to_pb(s.status) as i32,
        output: s.output.as_ref().map(to_value),
        error: s.error.clone(),
        attempts: s.attempts,
        started_at: s.started_at.map(timestamp),
        finished_at: s.finished_at.map(timestamp),
        duration_ms,
        collaborate: s.collaborate.as_ref().map(collaboration_to_pb),
    }
}

/// An event from protobuf, as a client that followed an execution folds
/// it into the execution's state ([`ExecutionState::apply`]); `None` for a
/// kind this build does not know.
pub fn event_from_pb(e: &pb::ExecutionEvent) -> Option<Event> {
    Some(Event {
        sequence: e.sequence,
        kind: kind_from_pb(e.kind)?,
        step_id: e.step_id.clone(),
        attempt: e.attempt,
        at: e
            .occurred_at
            .and_then(|t| DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0)))
            .unwrap_or_default(),
        payload: EventPayload {
            agent_id: e.agent_id.clone(),
            output: e.output.as_ref().map(from_value),
            error: e.error.clone(),
            added_steps: e.added_steps.iter().map(step_from_pb).collect(),
            collaborate: e.collaborate.as_ref().map(collaboration_from_pb),
            retry_delay_ms: e.retry_delay_ms,
            duration_ms: e.duration_ms,
            progress: e.progress.as_ref().map(|p| agentmesh_core::execution::StepProgress {
                progress: p.progress,
                total: p.total,
                message: p.message.clone(),
            }),
        },
    })
}

#[cfg(test)]
mod tests {
    use agentmesh_core::execution::ExecutionState;
    use serde_json::json;

    use super::*;

    fn step(id: &str) -> PlanStep {
        serde_json::from_value(json!({"step_id": id, "agent": "a", "capability": "c", "parameters": {"x": 1}}))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn events_come_back_from_protobuf_as_they_went() {
        let at = DateTime::from_timestamp_millis(1_700_000_000_123).unwrap_or_default();
        let event = Event {
            sequence: 7,
            kind: EventKind::StepSucceeded,
            step_id: "s1".into(),
            attempt: 2,
            at,
            payload: EventPayload {
                agent_id: "a".into(),
                output: Some(json!({"temp_c": 21.5})),
                error: String::new(),
                added_steps: vec![step("s9")],
                collaborate: Some(Collaboration { agent: "f".into(), capability: "fix".into(), query: "q".into() }),
                retry_delay_ms: 0,
                duration_ms: 40,
                progress: None,
            },
        };
        assert_eq!(event_from_pb(&event_to_pb("exe", &event)), Some(event.clone()));
        let progress = Event {
            kind: EventKind::StepProgress,
            payload: EventPayload {
                progress: Some(agentmesh_core::execution::StepProgress {
                    progress: 2.0,
                    total: Some(3.0),
                    message: "indexing".into(),
                }),
                ..EventPayload::default()
            },
            ..event
        };
        assert_eq!(event_from_pb(&event_to_pb("exe", &progress)), Some(progress));
        let unknown = pb::ExecutionEvent { kind: 999, ..Default::default() };
        assert_eq!(event_from_pb(&unknown), None);
    }

    #[test]
    fn a_follower_folds_streamed_events_into_results() {
        let mut run = ExecutionState::following(Plan { reasoning: String::new(), steps: vec![step("s1")] });
        let at = DateTime::from_timestamp_millis(1_700_000_000_000).unwrap_or_default();
        let event = |sequence, kind, step_id: &str, added_steps| Event {
            sequence,
            kind,
            step_id: step_id.into(),
            attempt: 1,
            at,
            payload: EventPayload { added_steps, output: Some(json!(1)), ..EventPayload::default() },
        };
        for e in [
            event(1, EventKind::ExecutionStarted, "", vec![]),
            event(2, EventKind::StepSucceeded, "s1", vec![]),
            event(3, EventKind::PlanExtended, "s1", vec![step("s2")]),
        ] {
            run.apply(&event_from_pb(&event_to_pb("exe", &e)).unwrap_or_else(|| panic!("known kind")));
        }
        let results: Vec<pb::StepResult> = run.steps.iter().map(step_result_to_pb).collect();
        assert_eq!(run.plan().steps.len(), 2, "the added step is in the plan");
        assert_eq!(results[0].status, pb::StepStatus::Succeeded as i32);
        assert_eq!(results[0].output.as_ref().map(from_value), Some(json!(1)));
        assert_eq!(results[1].status, pb::StepStatus::Pending as i32);
    }
}
