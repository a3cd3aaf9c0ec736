//! Executions between the domain model, the store and protobuf.

use agentmesh_core::execution::{Event, EventKind, EventPayload, ExecutionState, ExecutionStatus};
use agentmesh_proto::convert::plan_to_pb;
pub use agentmesh_proto::convert::{event_to_pb, step_result_to_pb, timestamp};
use agentmesh_proto::v1 as pb;
use agentmesh_store::executions::{EventRow, ExecutionRow};
use chrono::DateTime;

use crate::error::ExecutorError;

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
