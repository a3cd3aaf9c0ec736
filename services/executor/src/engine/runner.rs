//! One execution's DAG: a step starts the moment its last dependency's
//! success is stored (no waves, no polling), up to the execution's
//! concurrency; a failure skips what depends on it and lets independent
//! branches go on; a collaboration request becomes a replan, within a
//! budget and never twice the same. Every change is an event, recorded in
//! the execution's state and handed to the journal in sequence order.
//!
//! A runner starts from an [`ExecutionState`]: a new execution's, or a
//! stored log folded after a crash or a takeover. Succeeded steps are never
//! called again; steps that were in flight are dispatched again, as the
//! next attempt, with the same idempotency key.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::execution::{
    Collaboration, Event, EventKind, EventPayload, ExecutionState, ExecutionStatus, StepProgress, StepStatus,
};
use agentmesh_core::plan::{PlanStep, check_structure};
use agentmesh_core::reference;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::Engine;
use super::journal::{Entry, Written};
use super::replan::{self, ReplanOutcome};
use super::step::{self, StepJob};
use crate::transport::Reply;

/// What step and replan tasks tell the runner.
pub enum Msg {
    /// An attempt failed retryably; another follows after `delay`.
    Retrying {
        /// Step position.
        index: usize,
        /// The attempt that failed.
        attempt: u32,
        /// Why.
        error: String,
        /// Wait before the next attempt.
        delay: Duration,
    },
    /// A running attempt's agent reported how far it has got.
    Progress {
        /// Step position.
        index: usize,
        /// The attempt.
        attempt: u32,
        /// What it said.
        progress: StepProgress,
    },
    /// The step's last attempt is over.
    Finished {
        /// Step position.
        index: usize,
        /// The last attempt.
        attempt: u32,
        /// The answer, or why the step failed.
        result: Result<Reply, String>,
        /// Since the step's dispatch.
        duration: Duration,
    },
    /// The planner answered a collaboration request.
    Replanned {
        /// The step whose agent asked.
        step_id: String,
        /// What it asked.
        collaboration: Collaboration,
        /// Steps to append, or why not.
        outcome: ReplanOutcome,
    },
}

/// What a stored event unblocks.
enum Then {
    /// The step's dependents may start; its collaboration may be handled.
    Release(usize),
    /// The execution is over.
    End,
}

/// Why a runner stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It reached a final state.
    Finished,
    /// Another replica owns the execution now.
    Lost,
    /// The executor is shutting down (the execution resumes elsewhere or later).
    Shutdown,
}

/// The runner of one execution.
pub struct Runner {
    engine: Arc<Engine>,
    id: Arc<str>,
    request_id: Arc<str>,
    /// The trace context the execution was started in, for agents when
    /// this executor exports no traces of its own.
    traceparent: Arc<str>,
    callers: Arc<[String]>,
    state: ExecutionState,
    dependents: Vec<Vec<usize>>,
    waiting: Vec<usize>,
    ready: VecDeque<usize>,
    running: HashMap<usize, JoinHandle<()>>,
    replans: Vec<JoinHandle<()>>,
    /// Collaborations asked of the planner and not yet answered.
    asking: Vec<Collaboration>,
    commits: FuturesUnordered<futures_util::future::BoxFuture<'static, (Then, Written)>>,
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
}

impl Runner {
    /// A runner for `state`, which holds every stored event of the execution.
    pub fn new(engine: Arc<Engine>, id: Arc<str>, state: ExecutionState, traceparent: Arc<str>) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        let request_id: Arc<str> = Arc::from(state.spec.request_id.as_str());
        let callers: Arc<[String]> = state.spec.caller_agent_ids.clone().into();
        let mut runner = Self {
            engine,
            id,
            request_id,
            traceparent,
            callers,
            state,
            dependents: Vec::new(),
            waiting: Vec::new(),
            ready: VecDeque::new(),
            running: HashMap::new(),
            replans: Vec::new(),
            asking: Vec::new(),
            commits: FuturesUnordered::new(),
            tx,
            rx,
        };
        runner.index_from(0);
        runner
    }

    /// Links steps from `first` on to their dependencies, and queues those
    /// whose dependencies all succeeded.
    fn index_from(&mut self, first: usize) {
        for i in first..self.state.steps.len() {
            self.dependents.push(Vec::new());
            let deps: Vec<usize> =
                self.state.steps[i].step.depends_on.iter().filter_map(|d| self.state.position(d)).collect();
            for &d in &deps {
                self.dependents[d].push(i);
            }
            let unmet = deps.iter().filter(|&&d| self.state.steps[d].status != StepStatus::Succeeded).count();
            self.waiting.push(unmet);
            let status = self.state.steps[i].status;
            if status == StepStatus::Running || (status == StepStatus::Pending && unmet == 0) {
                self.ready.push_back(i);
            }
        }
    }

    /// Runs until the execution ends, the lease is lost, or `stop` asks.
    pub async fn run(
        mut self,
        mut cancel: watch::Receiver<Option<String>>,
        mut stop: watch::Receiver<bool>,
    ) -> Stopped {
        // What a crash left half done: skips not yet recorded, collaborations
        // not yet handled.
        for i in 0..self.state.steps.len() {
            if matches!(self.state.steps[i].status, StepStatus::Failed | StepStatus::Skipped | StepStatus::Cancelled) {
                self.skip_dependents(i).await;
            }
        }
        for (step_id, collaboration) in self.state.pending_collaborations() {
            self.collaborate(step_id, collaboration).await;
        }
        let requested = cancel.borrow_and_update().clone();
        if let Some(reason) = requested {
            return self.cancel(reason).await;
        }
        loop {
            self.dispatch_ready().await;
            if self.idle() {
                return self.finish().await;
            }
            tokio::select! {
                changed = cancel.changed() => {
                    let reason = cancel.borrow().clone();
                    match (changed, reason) {
                        (Ok(()), Some(reason)) => return self.cancel(reason).await,
                        (Ok(()), None) => {}
                        (Err(_), _) => return self.abandon(Stopped::Shutdown),
                    }
                }
                _ = stop.changed() => return self.abandon(Stopped::Shutdown),
                Some((then, written)) = self.commits.next(), if !self.commits.is_empty() => {
                    if written == Written::Lost {
                        return self.abandon(Stopped::Lost);
                    }
                    if let Then::Release(i) = then {
                        self.release(i).await;
                    }
                }
                Some(msg) = self.rx.recv() => self.handle(msg).await,
            }
        }
    }

    /// Nothing runs, nothing waits: every step is final.
    fn idle(&self) -> bool {
        self.running.is_empty()
            && self.ready.is_empty()
            && self.commits.is_empty()
            && self.asking.is_empty()
            && self.state.steps.iter().all(|s| s.status.is_final())
    }

    fn next_event(&self, kind: EventKind, step_id: &str, attempt: u32, payload: EventPayload) -> Event {
        Event {
            sequence: self.state.last_sequence + 1,
            kind,
            step_id: step_id.to_owned(),
            attempt,
            at: agentmesh_core::execution::now_ms(),
            payload,
        }
    }

    /// Records an event and hands it to the journal; `then` runs once it is stored.
    async fn emit(&mut self, kind: EventKind, step_id: &str, attempt: u32, payload: EventPayload, then: Option<Then>) {
        let event = self.next_event(kind, step_id, attempt, payload);
        self.state.apply(&event);
        let ack = then.map(|then| {
            let (ack, stored) = oneshot::channel();
            self.commits.push(Box::pin(async move { (then, stored.await.unwrap_or(Written::Lost)) }));
            ack
        });
        let steps = (kind == EventKind::PlanExtended).then_some(self.state.steps.len());
        let entry = Entry { execution_id: self.id.clone(), events: vec![Arc::new(event)], steps, ack };
        self.engine.journal.append(entry).await;
    }

    async fn dispatch_ready(&mut self) {
        let limit = usize::try_from(self.state.spec.options.max_concurrency.max(1)).unwrap_or(usize::MAX);
        while self.running.len() < limit {
            let Some(i) = self.ready.pop_front() else { break };
            if self.state.steps[i].status.is_final() {
                continue;
            }
            self.dispatch(i).await;
        }
    }

    async fn dispatch(&mut self, i: usize) {
        let step = self.state.steps[i].step.clone();
        let attempt = self.state.steps[i].attempts + 1;
        let agent_id = step.agent.clone();
        let outputs = |id: &str| self.state.output(id);
        let resolved = reference::resolve(&step.parameters, &outputs)
            .and_then(|parameters| Ok((parameters, reference::resolve_text(&step.instruction, &outputs)?)));
        let (parameters, instruction) = match resolved {
            Ok(resolved) => resolved,
            Err(e) => {
                let payload = EventPayload { agent_id, error: e.to_string(), ..Default::default() };
                self.emit(EventKind::StepFailed, &step.step_id, attempt, payload, None).await;
                self.count(i, "failed");
                self.skip_dependents(i).await;
                return;
            }
        };
        let payload = EventPayload { agent_id: agent_id.clone(), ..Default::default() };
        self.emit(EventKind::StepStarted, &step.step_id, attempt, payload, None).await;
        let options = self.state.spec.options;
        let job = StepJob {
            execution_id: self.id.clone(),
            request_id: self.request_id.clone(),
            traceparent: self.traceparent.clone(),
            index: i,
            step_id: step.step_id,
            agent: agent_id,
            capability: step.capability,
            parameters,
            instruction,
            callers: self.callers.clone(),
            first_attempt: attempt,
            retries_left: options.max_retries.saturating_sub(self.state.steps[i].retries),
            timeout: Duration::from_millis(options.step_timeout_ms.max(1)),
        };
        let task = tokio::spawn(step::run(self.engine.clone(), job, self.tx.clone()).in_current_span());
        self.running.insert(i, task);
    }

    async fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Retrying { index, attempt, error, delay } => {
                let step_id = self.state.steps[index].step.step_id.clone();
                let payload = EventPayload {
                    agent_id: self.state.steps[index].step.agent.clone(),
                    error,
                    retry_delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    ..Default::default()
                };
                self.emit(EventKind::StepRetrying, &step_id, attempt, payload, None).await;
            }
            Msg::Progress { index, attempt, progress } => {
                // A report that lost the race with the step's outcome is dropped.
                if self.running.contains_key(&index) {
                    let step = &self.state.steps[index].step;
                    let (step_id, agent_id) = (step.step_id.clone(), step.agent.clone());
                    let payload = EventPayload { agent_id, progress: Some(progress), ..Default::default() };
                    self.emit(EventKind::StepProgress, &step_id, attempt, payload, None).await;
                }
            }
            Msg::Finished { index, attempt, result, duration } => {
                self.running.remove(&index);
                let step = &self.state.steps[index].step;
                let (step_id, agent_id) = (step.step_id.clone(), step.agent.clone());
                self.engine
                    .metrics
                    .step_duration
                    .with_label_values(&[agent_id.as_str()])
                    .observe(duration.as_secs_f64());
                let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
                match result {
                    Ok(reply) => {
                        let payload = EventPayload {
                            agent_id,
                            output: Some(reply.output),
                            collaborate: reply.collaborate,
                            duration_ms,
                            ..Default::default()
                        };
                        self.emit(EventKind::StepSucceeded, &step_id, attempt, payload, Some(Then::Release(index)))
                            .await;
                        self.count(index, "succeeded");
                    }
                    Err(error) => {
                        let payload = EventPayload { agent_id, error, duration_ms, ..Default::default() };
                        self.emit(EventKind::StepFailed, &step_id, attempt, payload, None).await;
                        self.count(index, "failed");
                        self.skip_dependents(index).await;
                    }
                }
            }
            Msg::Replanned { step_id, collaboration, outcome } => {
                if let Some(at) = self.asking.iter().position(|c| *c == collaboration) {
                    self.asking.remove(at);
                }
                match outcome {
                    ReplanOutcome::Steps(steps) => self.extend(step_id, collaboration, steps).await,
                    ReplanOutcome::Rejected(reason) => self.reject(&step_id, collaboration, reason).await,
                }
            }
        }
    }

    fn count(&self, i: usize, status: &str) {
        let agent = self.state.steps[i].step.agent.as_str();
        self.engine.metrics.steps.with_label_values(&[agent, status]).inc();
    }

    /// A step's success is stored: its dependents may start, and its
    /// collaboration request is handled.
    async fn release(&mut self, i: usize) {
        for d in self.dependents[i].clone() {
            self.waiting[d] = self.waiting[d].saturating_sub(1);
            if self.waiting[d] == 0 && self.state.steps[d].status == StepStatus::Pending {
                self.ready.push_back(d);
            }
        }
        let step = &self.state.steps[i];
        if let (Some(collaboration), false) = (step.collaborate.clone(), step.collaboration_handled) {
            self.collaborate(step.step.step_id.clone(), collaboration).await;
        }
    }

    /// Skips every step that depends, directly or not, on step `i`.
    async fn skip_dependents(&mut self, i: usize) {
        let mut stack = vec![i];
        while let Some(j) = stack.pop() {
            let cause = &self.state.steps[j];
            let reason = match cause.status {
                StepStatus::Failed => format!("dependency {} failed", cause.step.step_id),
                StepStatus::Cancelled => format!("dependency {} was cancelled", cause.step.step_id),
                _ => format!("dependency {} was skipped", cause.step.step_id),
            };
            for d in self.dependents[j].clone() {
                if self.state.steps[d].status != StepStatus::Pending {
                    continue;
                }
                let step_id = self.state.steps[d].step.step_id.clone();
                let payload = EventPayload {
                    agent_id: self.state.steps[d].step.agent.clone(),
                    error: reason.clone(),
                    ..Default::default()
                };
                self.emit(EventKind::StepSkipped, &step_id, 0, payload, None).await;
                self.count(d, "skipped");
                stack.push(d);
            }
        }
    }

    /// Handles a collaboration request: within the budget and not a repeat,
    /// the planner is asked (in the background); otherwise it is rejected.
    async fn collaborate(&mut self, step_id: String, collaboration: Collaboration) {
        let budget = self.state.spec.options.replan_budget;
        let in_flight = u32::try_from(self.asking.len()).unwrap_or(u32::MAX);
        if self.state.replans_used.saturating_add(in_flight) >= budget {
            let reason = if budget == 0 {
                "loop-back is disabled for this execution (replan_budget 0)".to_owned()
            } else {
                format!("the replan budget of {budget} is used up")
            };
            return self.reject(&step_id, collaboration, reason).await;
        }
        if self.state.seen_collaborations.contains(&collaboration) || self.asking.contains(&collaboration) {
            let reason = format!(
                "the same collaboration (agent `{}`, capability `{}`, query \"{}\") was already asked for in this execution",
                collaboration.agent, collaboration.capability, collaboration.query
            );
            return self.reject(&step_id, collaboration, reason).await;
        }
        let request = replan::Request {
            request_id: self.request_id.to_string(),
            execution_id: self.id.to_string(),
            step_id,
            collaboration,
            plan: self.state.plan(),
            results: replan::results(&self.state),
            spec: self.state.spec.clone(),
            // The execution's request carried no model preference.
            model: String::new(),
            reasoning_effort: 0,
        };
        let engine = self.engine.clone();
        let tx = self.tx.clone();
        self.replans.retain(|r| !r.is_finished());
        self.asking.push(request.collaboration.clone());
        self.replans.push(tokio::spawn(
            async move {
                let (step_id, collaboration) = (request.step_id.clone(), request.collaboration.clone());
                let outcome = replan::ask(&engine, request).await;
                let _ = tx.send(Msg::Replanned { step_id, collaboration, outcome }).await;
            }
            .in_current_span(),
        ));
    }

    async fn reject(&mut self, step_id: &str, collaboration: Collaboration, reason: String) {
        tracing::info!(execution_id = %self.id, step_id, reason, "collaboration request rejected");
        self.engine.metrics.replans.with_label_values(&["rejected"]).inc();
        let payload = EventPayload { error: reason, collaborate: Some(collaboration), ..Default::default() };
        self.emit(EventKind::ReplanRejected, step_id, 0, payload, None).await;
    }

    /// Appends the planner's steps, once they fit the plan.
    async fn extend(&mut self, step_id: String, collaboration: Collaboration, steps: Vec<PlanStep>) {
        if steps.is_empty() {
            return self.reject(&step_id, collaboration, "the planner returned no steps".into()).await;
        }
        let mut extended = self.state.plan();
        extended.steps.extend(steps.iter().cloned());
        let max_steps = self.engine.settings.max_steps;
        if extended.steps.len() > max_steps {
            let reason = format!(
                "the execution would have {} steps; this executor accepts at most {max_steps} (max_steps_per_plan)",
                extended.steps.len()
            );
            return self.reject(&step_id, collaboration, reason).await;
        }
        if let Err(errors) = check_structure(&extended) {
            let problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
            let reason = format!("the planner's steps do not fit the plan: {}", problems.join("; "));
            return self.reject(&step_id, collaboration, reason).await;
        }
        self.engine.metrics.replans.with_label_values(&["extended"]).inc();
        let first = self.state.steps.len();
        let payload = EventPayload { added_steps: steps, collaborate: Some(collaboration), ..Default::default() };
        self.emit(EventKind::PlanExtended, &step_id, 0, payload, None).await;
        self.index_from(first);
        // A new step that depends on a step that did not succeed never runs.
        let blockers: Vec<usize> = (first..self.state.steps.len())
            .flat_map(|i| self.state.steps[i].step.depends_on.clone())
            .filter_map(|d| self.state.position(&d))
            .filter(|&d| self.state.steps[d].status.is_final() && self.state.steps[d].status != StepStatus::Succeeded)
            .collect();
        for d in blockers {
            self.skip_dependents(d).await;
        }
    }

    /// Records the end: completed when every step succeeded.
    async fn finish(mut self) -> Stopped {
        // A step that did not succeed is made good when an extension (a
        // review's retry, a recovery round) later ran the same capability
        // of the same agent successfully.
        let planned = self.state.spec.plan.steps.len();
        let steps = &self.state.steps;
        let made_good = |i: usize| {
            let (agent, capability) = (&steps[i].step.agent, &steps[i].step.capability);
            steps.iter().enumerate().skip(planned.max(i + 1)).any(|(_, later)| {
                later.status == StepStatus::Succeeded
                    && &later.step.agent == agent
                    && &later.step.capability == capability
            })
        };
        let problems: Vec<String> = self
            .state
            .steps
            .iter()
            .enumerate()
            .filter(|(i, s)| s.status != StepStatus::Succeeded && !made_good(*i))
            .map(|(_, s)| s)
            .map(|s| {
                let what = match s.status {
                    StepStatus::Failed => "failed",
                    StepStatus::Skipped => "skipped",
                    _ => "cancelled",
                };
                format!("{} {what}: {}", s.step.step_id, s.error)
            })
            .collect();
        let (kind, error, status) = if problems.is_empty() {
            (EventKind::ExecutionCompleted, String::new(), ExecutionStatus::Completed)
        } else {
            let total = self.state.steps.len();
            let error = format!("{} of {total} steps did not succeed: {}", problems.len(), problems.join("; "));
            (EventKind::ExecutionFailed, error, ExecutionStatus::Failed)
        };
        self.end(kind, error, status).await
    }

    async fn end(&mut self, kind: EventKind, error: String, status: ExecutionStatus) -> Stopped {
        let payload = EventPayload { error, ..Default::default() };
        self.emit(kind, "", 0, payload, Some(Then::End)).await;
        // Wait for everything still unacknowledged, the final event included.
        while let Some((_, written)) = self.commits.next().await {
            if written == Written::Lost {
                return Stopped::Lost;
            }
        }
        self.engine.metrics.executions.with_label_values(&[status.as_str()]).inc();
        tracing::info!(
            execution_id = %self.id,
            request_id = %self.request_id,
            status = status.as_str(),
            steps = self.state.steps.len(),
            "execution finished"
        );
        Stopped::Finished
    }

    /// Stops in-flight calls and records every unfinished step as cancelled.
    async fn cancel(mut self, reason: String) -> Stopped {
        for (_, task) in self.running.drain() {
            task.abort();
        }
        for task in self.replans.drain(..) {
            task.abort();
        }
        let reason = if reason.is_empty() { "cancelled by request".to_owned() } else { reason };
        for i in 0..self.state.steps.len() {
            if self.state.steps[i].status.is_final() {
                continue;
            }
            let step = &self.state.steps[i];
            let (step_id, attempt) = (step.step.step_id.clone(), step.attempts);
            let payload = EventPayload {
                agent_id: step.step.agent.clone(),
                error: format!("cancelled: {reason}"),
                ..Default::default()
            };
            self.emit(EventKind::StepCancelled, &step_id, attempt, payload, None).await;
            self.count(i, "cancelled");
        }
        self.end(EventKind::ExecutionCancelled, reason, ExecutionStatus::Cancelled).await
    }

    /// Stops without recording anything more: the execution goes on under
    /// another owner, or after a restart.
    fn abandon(mut self, why: Stopped) -> Stopped {
        for (_, task) in self.running.drain() {
            task.abort();
        }
        for task in self.replans.drain(..) {
            task.abort();
        }
        why
    }
}
