//! Executions as event logs: what was asked ([`ExecutionSpec`]), what
//! happened ([`Event`], numbered from 1 without gaps), and the state both
//! fold into ([`ExecutionState`]). The executor applies each event to its
//! state as it records it, a resumed execution folds its stored log the same
//! way, and `GetExecution` on any replica does too: one fold, one truth.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::plan::{Plan, PlanStep};

/// The overall state of an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    /// Accepted, no step started yet.
    Pending,
    /// At least one step started and not all finished.
    Running,
    /// Every step finished and none failed.
    Completed,
    /// Every step finished and at least one failed or was skipped.
    Failed,
    /// Cancelled before it finished.
    Cancelled,
}

impl ExecutionStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether nothing more will happen.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

impl FromStr for ExecutionStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            other => return Err(format!("unknown execution status `{other}`")),
        })
    }
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The execution was accepted.
    ExecutionStarted,
    /// A step was dispatched.
    StepStarted,
    /// An attempt failed retryably; another follows.
    StepRetrying,
    /// A step succeeded.
    StepSucceeded,
    /// A step failed for good.
    StepFailed,
    /// A step will not run: a dependency did not succeed.
    StepSkipped,
    /// A cancellation stopped a running or pending step.
    StepCancelled,
    /// Steps were appended after a replan.
    PlanExtended,
    /// A collaboration request was not turned into steps.
    ReplanRejected,
    /// Every step finished and none failed.
    ExecutionCompleted,
    /// Every step finished and at least one failed or was skipped.
    ExecutionFailed,
    /// The execution was cancelled.
    ExecutionCancelled,
    /// A finished execution was given more steps and runs again.
    ExecutionExtended,
    /// A running step's agent reported how far it has got.
    StepProgress,
}

const KINDS: [(EventKind, &str); 14] = [
    (EventKind::ExecutionStarted, "execution_started"),
    (EventKind::StepStarted, "step_started"),
    (EventKind::StepRetrying, "step_retrying"),
    (EventKind::StepSucceeded, "step_succeeded"),
    (EventKind::StepFailed, "step_failed"),
    (EventKind::StepSkipped, "step_skipped"),
    (EventKind::StepCancelled, "step_cancelled"),
    (EventKind::PlanExtended, "plan_extended"),
    (EventKind::ReplanRejected, "replan_rejected"),
    (EventKind::ExecutionCompleted, "execution_completed"),
    (EventKind::ExecutionFailed, "execution_failed"),
    (EventKind::ExecutionCancelled, "execution_cancelled"),
    (EventKind::ExecutionExtended, "execution_extended"),
    (EventKind::StepProgress, "step_progress"),
];

impl EventKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        KINDS.iter().find(|(k, _)| *k == self).map_or("unknown", |(_, name)| name)
    }

    /// The execution status this event ends in, when it ends it.
    pub fn final_status(self) -> Option<ExecutionStatus> {
        match self {
            Self::ExecutionCompleted => Some(ExecutionStatus::Completed),
            Self::ExecutionFailed => Some(ExecutionStatus::Failed),
            Self::ExecutionCancelled => Some(ExecutionStatus::Cancelled),
            _ => None,
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KINDS.iter().find(|(_, name)| *name == s).map(|(k, _)| *k).ok_or_else(|| format!("unknown event kind `{s}`"))
    }
}

/// A request, made by an agent's answer, to involve another capability.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Collaboration {
    /// The agent suggested.
    pub agent: String,
    /// Its capability (empty: let the planner pick).
    #[serde(default)]
    pub capability: String,
    /// What to do.
    pub query: String,
}

/// How a plan is run; defaults filled in when the execution is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionOptions {
    /// Steps running at once.
    pub max_concurrency: u32,
    /// Timeout of one attempt, in milliseconds.
    pub step_timeout_ms: u64,
    /// Retries after a retryable failure.
    pub max_retries: u32,
    /// Replans allowed.
    pub replan_budget: u32,
}

/// Most replans (loop-backs) one execution may be given: each one costs a
/// planning call and new steps.
pub const MAX_REPLAN_BUDGET: u32 = 10;

/// Most concurrent steps one execution may ask for.
pub const MAX_EXECUTION_CONCURRENCY: u32 = 1_000;

/// What was asked: stored once, when the execution is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionSpec {
    /// The originating request.
    pub request_id: String,
    /// The plan as submitted (replans add to it through events).
    pub plan: Plan,
    /// Options in effect.
    pub options: ExecutionOptions,
    /// The user's query.
    #[serde(default)]
    pub query: String,
    /// The calling orchestrator's own agent ids.
    #[serde(default)]
    pub caller_agent_ids: Vec<String>,
    /// Agents the original request excluded.
    #[serde(default)]
    pub exclude_agents: Vec<String>,
    /// Allow patterns of the original request.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Who started it (the principal's name; empty when the executor ran
    /// without authentication): only they, services and operators may
    /// read, cancel or extend it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub principal: String,
}

/// The time now, in whole milliseconds: what the store keeps, so that an
/// event streamed live and the same event read back are equal.
pub fn now_ms() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now)
}

/// One event of an execution.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Position in the log, from 1.
    pub sequence: u64,
    /// What happened.
    pub kind: EventKind,
    /// The step concerned (empty for execution events).
    pub step_id: String,
    /// Attempt number (step events).
    pub attempt: u32,
    /// When.
    pub at: DateTime<Utc>,
    /// Everything else, by kind.
    pub payload: EventPayload,
}

/// The parts of an event that only some kinds carry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventPayload {
    /// The agent a step calls.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent_id: String,
    /// A step's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// What went wrong, or why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// Steps appended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added_steps: Vec<PlanStep>,
    /// A collaboration asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collaborate: Option<Collaboration>,
    /// Wait before the next attempt.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_delay_ms: u64,
    /// Time since the step started.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duration_ms: u64,
    /// How far a running step has got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<StepProgress>,
}

/// How far a running step has got, as its agent reported it (an MCP
/// tool's progress notifications).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepProgress {
    /// Done so far; grows with each report.
    pub progress: f64,
    /// The total, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// What it is doing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The state of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepStatus {
    /// Waiting for dependencies or a slot.
    Pending,
    /// Dispatched.
    Running,
    /// Done, output kept.
    Succeeded,
    /// Failed for good.
    Failed,
    /// Not run.
    Skipped,
    /// Stopped by a cancellation.
    Cancelled,
}

impl StepStatus {
    /// Whether the step will not change again.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Pending | Self::Running)
    }
}

/// One step and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepState {
    /// The step as planned.
    pub step: PlanStep,
    /// Where it stands.
    pub status: StepStatus,
    /// Attempts made (the last attempt number seen).
    pub attempts: u32,
    /// Attempts that failed retryably.
    pub retries: u32,
    /// Its output, once succeeded.
    pub output: Option<Value>,
    /// Why it failed, was skipped or cancelled.
    pub error: String,
    /// When it was first dispatched.
    pub started_at: Option<DateTime<Utc>>,
    /// When it reached a final state.
    pub finished_at: Option<DateTime<Utc>>,
    /// Collaboration its agent asked for.
    pub collaborate: Option<Collaboration>,
    /// Whether that collaboration was handled (extended or rejected).
    pub collaboration_handled: bool,
}

impl StepState {
    fn new(step: PlanStep) -> Self {
        Self {
            step,
            status: StepStatus::Pending,
            attempts: 0,
            retries: 0,
            output: None,
            error: String::new(),
            started_at: None,
            finished_at: None,
            collaborate: None,
            collaboration_handled: false,
        }
    }
}

/// An execution's state: its spec with every event applied.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionState {
    /// What was asked.
    pub spec: ExecutionSpec,
    /// Every step, planned and appended, in order.
    pub steps: Vec<StepState>,
    index: HashMap<String, usize>,
    /// Overall status.
    pub status: ExecutionStatus,
    /// The last event applied.
    pub last_sequence: u64,
    /// Replans made (accepted or rejected after asking the planner).
    pub replans_used: u32,
    /// Collaborations already asked for (repeat detection).
    pub seen_collaborations: HashSet<Collaboration>,
    /// Why it failed or was cancelled.
    pub error: String,
    /// When it was accepted.
    pub created_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
}

impl ExecutionState {
    /// The state before any event.
    pub fn new(spec: ExecutionSpec) -> Self {
        let steps: Vec<StepState> = spec.plan.steps.iter().cloned().map(StepState::new).collect();
        let index = steps.iter().enumerate().map(|(i, s)| (s.step.step_id.clone(), i)).collect();
        Self {
            spec,
            steps,
            index,
            status: ExecutionStatus::Pending,
            last_sequence: 0,
            replans_used: 0,
            seen_collaborations: HashSet::new(),
            error: String::new(),
            created_at: None,
            finished_at: None,
        }
    }

    /// The position of a step.
    pub fn position(&self, step_id: &str) -> Option<usize> {
        self.index.get(step_id).copied()
    }

    /// A step by id.
    pub fn step(&self, step_id: &str) -> Option<&StepState> {
        self.position(step_id).map(|i| &self.steps[i])
    }

    /// The plan as it stands, appended steps included.
    /// The state a client following an execution's events starts from,
    /// knowing only the plan it sent: applying the events it receives gives
    /// the plan as run (added steps included) and every step's result.
    pub fn following(plan: Plan) -> Self {
        Self::new(ExecutionSpec {
            request_id: String::new(),
            plan,
            options: ExecutionOptions { max_concurrency: 0, step_timeout_ms: 0, max_retries: 0, replan_budget: 0 },
            query: String::new(),
            caller_agent_ids: Vec::new(),
            exclude_agents: Vec::new(),
            allow: Vec::new(),
            principal: String::new(),
        })
    }

    /// The plan as it stands, added steps included.
    pub fn plan(&self) -> Plan {
        Plan { reasoning: self.spec.plan.reasoning.clone(), steps: self.steps.iter().map(|s| s.step.clone()).collect() }
    }

    /// The output of a succeeded step.
    pub fn output(&self, step_id: &str) -> Option<&Value> {
        self.step(step_id).filter(|s| s.status == StepStatus::Succeeded).and_then(|s| s.output.as_ref())
    }

    /// Applies one event. Events must come in sequence order; one already
    /// applied is ignored.
    pub fn apply(&mut self, event: &Event) {
        if event.sequence <= self.last_sequence {
            return;
        }
        self.last_sequence = event.sequence;
        let step = self.position(&event.step_id);
        match event.kind {
            EventKind::ExecutionStarted => self.created_at = Some(event.at),
            EventKind::StepStarted | EventKind::StepRetrying => {
                if self.status == ExecutionStatus::Pending {
                    self.status = ExecutionStatus::Running;
                }
                if let Some(i) = step {
                    let s = &mut self.steps[i];
                    s.status = StepStatus::Running;
                    s.attempts = s.attempts.max(event.attempt);
                    s.started_at.get_or_insert(event.at);
                    if event.kind == EventKind::StepRetrying {
                        s.retries += 1;
                        s.error.clone_from(&event.payload.error);
                    }
                }
            }
            EventKind::StepSucceeded | EventKind::StepFailed | EventKind::StepSkipped | EventKind::StepCancelled => {
                if let Some(i) = step {
                    let s = &mut self.steps[i];
                    s.status = match event.kind {
                        EventKind::StepSucceeded => StepStatus::Succeeded,
                        EventKind::StepFailed => StepStatus::Failed,
                        EventKind::StepSkipped => StepStatus::Skipped,
                        _ => StepStatus::Cancelled,
                    };
                    s.attempts = s.attempts.max(event.attempt);
                    s.output.clone_from(&event.payload.output);
                    s.error = if event.kind == EventKind::StepSucceeded {
                        String::new()
                    } else {
                        event.payload.error.clone()
                    };
                    s.collaborate.clone_from(&event.payload.collaborate);
                    s.finished_at = Some(event.at);
                }
            }
            EventKind::PlanExtended | EventKind::ReplanRejected => {
                if let Some(i) = step {
                    self.steps[i].collaboration_handled = true;
                }
                if let Some(c) = &event.payload.collaborate {
                    self.seen_collaborations.insert(c.clone());
                }
                self.replans_used += 1;
                for added in &event.payload.added_steps {
                    if !self.index.contains_key(&added.step_id) {
                        self.index.insert(added.step_id.clone(), self.steps.len());
                        self.steps.push(StepState::new(added.clone()));
                    }
                }
            }
            EventKind::ExecutionExtended => {
                for added in &event.payload.added_steps {
                    if !self.index.contains_key(&added.step_id) {
                        self.index.insert(added.step_id.clone(), self.steps.len());
                        self.steps.push(StepState::new(added.clone()));
                    }
                }
                self.status = ExecutionStatus::Running;
                self.error.clear();
                self.finished_at = None;
            }
            // Progress changes no state: it is for watchers.
            EventKind::StepProgress => {}
            EventKind::ExecutionCompleted | EventKind::ExecutionFailed | EventKind::ExecutionCancelled => {
                self.status = event.kind.final_status().unwrap_or(self.status);
                self.error.clone_from(&event.payload.error);
                self.finished_at = Some(event.at);
            }
        }
    }

    /// Collaborations asked for by succeeded steps and not yet handled.
    pub fn pending_collaborations(&self) -> Vec<(String, Collaboration)> {
        self.steps
            .iter()
            .filter(|s| s.status == StepStatus::Succeeded && !s.collaboration_handled)
            .filter_map(|s| s.collaborate.clone().map(|c| (s.step.step_id.clone(), c)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(id: &str, deps: &[&str]) -> PlanStep {
        PlanStep {
            step_id: id.into(),
            agent: "a".into(),
            capability: "c".into(),
            instruction: String::new(),
            parameters: json!({}),
            depends_on: deps.iter().map(|d| (*d).to_owned()).collect(),
        }
    }

    fn event(sequence: u64, kind: EventKind, step_id: &str, payload: EventPayload) -> Event {
        Event { sequence, kind, step_id: step_id.into(), attempt: 1, at: Utc::now(), payload }
    }

    #[test]
    fn kinds_and_statuses_round_trip() {
        for (kind, name) in KINDS {
            assert_eq!(name.parse::<EventKind>().ok(), Some(kind));
            assert_eq!(kind.as_str(), name);
        }
        for status in [ExecutionStatus::Pending, ExecutionStatus::Failed, ExecutionStatus::Cancelled] {
            assert_eq!(status.as_str().parse::<ExecutionStatus>().ok(), Some(status));
        }
    }

    #[test]
    fn the_fold_follows_steps_replans_and_the_end() {
        let spec = ExecutionSpec {
            request_id: "r".into(),
            plan: Plan { reasoning: String::new(), steps: vec![step("s1", &[]), step("s2", &["s1"])] },
            options: ExecutionOptions { max_concurrency: 4, step_timeout_ms: 1000, max_retries: 1, replan_budget: 3 },
            query: String::new(),
            caller_agent_ids: Vec::new(),
            exclude_agents: Vec::new(),
            allow: Vec::new(),
            principal: String::new(),
        };
        let mut state = ExecutionState::new(spec);
        let collaborate = Collaboration { agent: "fixer".into(), capability: "fix".into(), query: "fix it".into() };
        let events = [
            event(1, EventKind::ExecutionStarted, "", EventPayload::default()),
            event(2, EventKind::StepStarted, "s1", EventPayload::default()),
            event(
                3,
                EventKind::StepSucceeded,
                "s1",
                EventPayload {
                    output: Some(json!({"x": 1})),
                    collaborate: Some(collaborate.clone()),
                    ..Default::default()
                },
            ),
        ];
        events.iter().for_each(|e| state.apply(e));
        assert_eq!(state.status, ExecutionStatus::Running);
        assert_eq!(state.output("s1"), Some(&json!({"x": 1})));
        assert_eq!(state.pending_collaborations(), vec![("s1".to_owned(), collaborate.clone())]);
        state.apply(&event(
            4,
            EventKind::PlanExtended,
            "s1",
            EventPayload {
                added_steps: vec![step("s3", &["s1"])],
                collaborate: Some(collaborate.clone()),
                ..Default::default()
            },
        ));
        assert!(state.pending_collaborations().is_empty());
        assert_eq!(state.replans_used, 1);
        assert!(state.seen_collaborations.contains(&collaborate));
        assert_eq!(state.plan().steps.len(), 3);
        state.apply(&event(5, EventKind::StepSkipped, "s2", EventPayload { error: "x".into(), ..Default::default() }));
        state.apply(&event(5, EventKind::StepSucceeded, "s2", EventPayload::default()));
        assert_eq!(state.step("s2").map(|s| s.status), Some(StepStatus::Skipped), "a repeated sequence is ignored");
        state.apply(&event(
            6,
            EventKind::ExecutionFailed,
            "",
            EventPayload { error: "s2 skipped".into(), ..Default::default() },
        ));
        assert_eq!(
            (state.status, state.error.as_str(), state.last_sequence),
            (ExecutionStatus::Failed, "s2 skipped", 6)
        );
    }
}
