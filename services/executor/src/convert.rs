//! Executions between the domain model, the store and protobuf.

use agentmesh_core::execution::{
    Collaboration, Event, EventKind, EventPayload, ExecutionState, ExecutionStatus, StepState, StepStatus,
};
use agentmesh_proto::convert::{plan_to_pb, step_to_pb};
use agentmesh_proto::json::to_value;
use agentmesh_proto::v1 as pb;
use agentmesh_store::executions::{EventRow, ExecutionRow};
use chrono::{DateTime, Utc};

use crate::error::ExecutorError;

/// A timestamp to protobuf.
pub fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: at.timestamp(), nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0) }
}

/// A stored event.
pub fn event_from_row(row: &EventRow) -> Result<Event, ExecutorError> {
    let kind: EventKind = row.kind.parse().map_err(ExecutorError::Internal)?;
    let payload: EventPayload = serde_json::from_str(&row.payload)
        .map_err(|e| ExecutorError::Internal(format!("event {} is corrupt: {e}", row.sequence)))?;
    Ok(Event {
        sequence: u64::try_from(row.sequence).unwrap_or_default(),
        kind,
        step_id: row.step_id.clone(),
        attempt: u32::try_from(row.attempt).unwrap_or_default(),
        at: DateTime::from_timestamp_millis(row.occurred_at_ms).unwrap_or_default(),
        payload,
    })
}

fn kind_to_pb(kind: EventKind) -> pb::ExecutionEventKind {
    match kind {
        EventKind::ExecutionStarted => pb::ExecutionEventKind::ExecutionStarted,
        EventKind::StepStarted => pb::ExecutionEventKind::StepStarted,
        EventKind::StepRetrying => pb::ExecutionEventKind::StepRetrying,
        EventKind::StepSucceeded => pb::ExecutionEventKind::StepSucceeded,
        EventKind::StepFailed => pb::ExecutionEventKind::StepFailed,
        EventKind::StepSkipped => pb::ExecutionEventKind::StepSkipped,
        EventKind::StepCancelled => pb::ExecutionEventKind::StepCancelled,
        EventKind::PlanExtended => pb::ExecutionEventKind::PlanExtended,
        EventKind::ReplanRejected => pb::ExecutionEventKind::ReplanRejected,
        EventKind::ExecutionCompleted => pb::ExecutionEventKind::ExecutionCompleted,
        EventKind::ExecutionFailed => pb::ExecutionEventKind::ExecutionFailed,
        EventKind::ExecutionCancelled => pb::ExecutionEventKind::ExecutionCancelled,
        EventKind::ExecutionExtended => pb::ExecutionEventKind::ExecutionExtended,
    }
}

fn collaboration_to_pb(c: &Collaboration) -> pb::CollaborationRequest {
    pb::CollaborationRequest { agent: c.agent.clone(), capability: c.capability.clone(), query: c.query.clone() }
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
    }
}

/// A status to protobuf.
pub fn status_to_pb(status: ExecutionStatus) -> pb::ExecutionStatus {
    match status {
        ExecutionStatus::Pending => pb::ExecutionStatus::Pending,
        ExecutionStatus::Running => pb::ExecutionStatus::Running,
        ExecutionStatus::Completed => pb::ExecutionStatus::Completed,
        ExecutionStatus::Failed => pb::ExecutionStatus::Failed,
        ExecutionStatus::Cancelled => pb::ExecutionStatus::Cancelled,
    }
}

/// A protobuf status filter; `None` for UNSPECIFIED.
pub fn status_from_pb(value: i32) -> Result<Option<ExecutionStatus>, ExecutorError> {
    Ok(match pb::ExecutionStatus::try_from(value) {
        Ok(pb::ExecutionStatus::Unspecified) => None,
        Ok(pb::ExecutionStatus::Pending) => Some(ExecutionStatus::Pending),
        Ok(pb::ExecutionStatus::Running) => Some(ExecutionStatus::Running),
        Ok(pb::ExecutionStatus::Completed) => Some(ExecutionStatus::Completed),
        Ok(pb::ExecutionStatus::Failed) => Some(ExecutionStatus::Failed),
        Ok(pb::ExecutionStatus::Cancelled) => Some(ExecutionStatus::Cancelled),
        Err(_) => {
            return Err(ExecutorError::InvalidArgument {
                message: format!("unknown execution status {value}"),
                violations: vec![("statuses".into(), format!("{value} is not an ExecutionStatus"))],
            });
        }
    })
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

/// Options to protobuf.
pub fn options_to_pb(o: &agentmesh_core::execution::ExecutionOptions) -> pb::ExecutionOptions {
    pb::ExecutionOptions {
        max_concurrency: o.max_concurrency,
        step_timeout_ms: o.step_timeout_ms,
        max_retries: Some(o.max_retries),
        replan_budget: Some(o.replan_budget),
    }
}

/// An execution's state to protobuf.
pub fn execution_to_pb(id: &str, state: &ExecutionState, trace_id: String) -> pb::Execution {
    pb::Execution {
        id: id.to_owned(),
        request_id: state.spec.request_id.clone(),
        status: status_to_pb(state.status) as i32,
        plan: Some(plan_to_pb(&state.plan())),
        step_results: state.steps.iter().map(step_result_to_pb).collect(),
        options: Some(options_to_pb(&state.spec.options)),
        last_sequence: state.last_sequence,
        replans_used: state.replans_used,
        error: state.error.clone(),
        created_at: state.created_at.map(timestamp),
        finished_at: state.finished_at.map(timestamp),
        trace_id,
        query: state.spec.query.clone(),
        caller_agent_ids: state.spec.caller_agent_ids.clone(),
    }
}

/// A stored execution, summarized.
pub fn summary_to_pb(row: &ExecutionRow) -> pb::ExecutionSummary {
    let status = row.status.parse::<ExecutionStatus>().map_or(pb::ExecutionStatus::Unspecified, status_to_pb);
    pb::ExecutionSummary {
        id: row.id.clone(),
        request_id: row.request_id.clone(),
        status: status as i32,
        steps: u32::try_from(row.steps).unwrap_or_default(),
        last_sequence: u64::try_from(row.last_sequence).unwrap_or_default(),
        error: row.error.clone(),
        created_at: Some(timestamp(row.created_at)),
        finished_at: row.finished_at.map(timestamp),
    }
}

/// The trace id inside a `traceparent` (`00-<trace id>-<span id>-<flags>`).
pub fn trace_id_of(traceparent: &str) -> String {
    traceparent.split('-').nth(1).unwrap_or_default().to_owned()
}
