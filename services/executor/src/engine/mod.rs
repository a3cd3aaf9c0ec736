//! The execution engine: accepts executions, runs each in its own
//! [`runner`], stores every event through the [`journal`], streams them
//! through the [`hub`] and [`watch`], and keeps executions owned, resumed
//! and taken over through leases in the store ([`ownership`]).

pub mod hub;
pub mod journal;
pub mod ownership;
pub mod replan;
pub mod runner;
pub mod step;
pub mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentmesh_core::execution::{
    Event, EventKind, EventPayload, ExecutionOptions, ExecutionSpec, ExecutionState, ExecutionStatus,
};
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_store::ExecutionStore;
use agentmesh_store::executions::{Created, NewExecution, lease_end};
use agentmesh_telemetry::rpc::TracedChannel;
use tokio::sync::{Semaphore, watch as signal};
use tracing::Instrument;

use crate::breaker::Breakers;
use crate::catalog::Catalog;
use crate::convert::event_from_row;
use crate::credentials::AgentCredentials;
use crate::error::ExecutorError;
use crate::metrics::Metrics;
use crate::transport::a2a::A2aTransport;
use crate::transport::grpc::GrpcTransport;
use crate::transport::http::HttpTransport;
use crate::transport::mcp::McpTransport;
use agentmesh_telemetry::http::RetryPolicy;
use hub::Hub;
use journal::{Journal, to_row};
use runner::{Runner, Stopped};

/// Limits and defaults of the engine.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Options of executions that set none.
    pub defaults: ExecutionOptions,
    /// Most steps in a plan (replans included).
    pub max_steps: usize,
    /// Most executions this replica runs at once.
    pub max_concurrent_executions: usize,
    /// How long an owner holds an execution without renewing.
    pub lease: Duration,
    /// Retry delays.
    pub backoff: RetryPolicy,
    /// How long finished executions are kept.
    pub retention: Duration,
}

/// A running execution on this replica.
struct Running {
    cancel: signal::Sender<Option<String>>,
    task: tokio::task::JoinHandle<()>,
}

/// The engine.
pub struct Engine {
    pub(crate) settings: Settings,
    pub(crate) owner: String,
    pub(crate) store: Arc<dyn ExecutionStore>,
    pub(crate) journal: Journal,
    pub(crate) hub: Arc<Hub>,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) http: HttpTransport,
    pub(crate) grpc: GrpcTransport,
    pub(crate) mcp: McpTransport,
    pub(crate) a2a: A2aTransport,
    pub(crate) credentials: AgentCredentials,
    pub(crate) breakers: Breakers,
    pub(crate) planner: Option<PlannerServiceClient<TracedChannel>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) step_permits: Semaphore,
    running: Mutex<HashMap<String, Running>>,
    pub(crate) stop: signal::Receiver<bool>,
}

/// What is needed to build an engine.
pub struct Parts {
    /// Limits and defaults.
    pub settings: Settings,
    /// This replica's owner id in leases.
    pub owner: String,
    /// Where executions are stored.
    pub store: Arc<dyn ExecutionStore>,
    /// The registry.
    pub catalog: Arc<Catalog>,
    /// HTTP agents.
    pub http: HttpTransport,
    /// gRPC agents.
    pub grpc: GrpcTransport,
    /// What agents that need a credential are sent.
    pub credentials: AgentCredentials,
    /// Circuits per agent.
    pub breakers: Breakers,
    /// The planner, for loop-back.
    pub planner: Option<PlannerServiceClient<TracedChannel>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Agent calls in flight at once, over every execution.
    pub max_concurrent_steps: usize,
    /// Changes when the service stops.
    pub stop: signal::Receiver<bool>,
}

/// A new execution, validated.
pub struct Accepted {
    /// Its id.
    pub id: String,
    /// What was asked.
    pub spec: ExecutionSpec,
    /// The trace to continue when it resumes.
    pub traceparent: String,
}

impl Engine {
    /// Builds the engine and starts its journal.
    pub fn new(parts: Parts) -> Arc<Self> {
        let hub = Arc::new(Hub::default());
        let journal = Journal::spawn(parts.store.clone(), parts.owner.clone(), hub.clone(), parts.metrics.clone());
        Arc::new(Self {
            settings: parts.settings,
            owner: parts.owner,
            store: parts.store,
            journal,
            hub,
            catalog: parts.catalog,
            mcp: McpTransport::new(parts.http.client(), parts.http.egress()),
            a2a: A2aTransport::new(parts.http.client(), parts.http.egress()),
            http: parts.http,
            grpc: parts.grpc,
            credentials: parts.credentials,
            breakers: parts.breakers,
            planner: parts.planner,
            metrics: parts.metrics,
            step_permits: Semaphore::new(parts.max_concurrent_steps.max(1)),
            running: Mutex::new(HashMap::new()),
            stop: parts.stop,
        })
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this replica runs the execution.
    pub fn runs(&self, id: &str) -> bool {
        self.running().contains_key(id)
    }

    /// Executions this replica runs.
    pub fn running_count(&self) -> usize {
        self.running().len()
    }

    /// Stores a new execution and starts it here; for an id already taken,
    /// says whether the request is the same one (then the caller attaches).
    pub async fn create(self: &Arc<Self>, accepted: Accepted) -> Result<(), ExecutorError> {
        if self.running_count() >= self.settings.max_concurrent_executions {
            return Err(ExecutorError::ResourceExhausted(format!(
                "this executor already runs {} executions (max_concurrent_executions); retry later or raise the limit",
                self.settings.max_concurrent_executions
            )));
        }
        let spec_json = serde_json::to_string(&accepted.spec).map_err(|e| ExecutorError::Internal(e.to_string()))?;
        let first = Event {
            sequence: 1,
            kind: EventKind::ExecutionStarted,
            step_id: String::new(),
            attempt: 0,
            at: agentmesh_core::execution::now_ms(),
            payload: EventPayload::default(),
        };
        let new = NewExecution {
            id: accepted.id.clone(),
            request_id: accepted.spec.request_id.clone(),
            spec: spec_json,
            traceparent: accepted.traceparent.clone(),
            steps: i64::try_from(accepted.spec.plan.steps.len()).unwrap_or(i64::MAX),
            first_event: to_row(&first),
            principal: accepted.spec.principal.clone(),
        };
        let lease = lease_end(chrono::Utc::now(), self.settings.lease);
        match self.store.create(&new, &self.owner, lease).await? {
            Created::New => {
                let mut state = ExecutionState::new(accepted.spec);
                state.apply(&first);
                self.start(accepted.id, state, &accepted.traceparent);
                Ok(())
            }
            Created::Existing(row) => {
                let stored: ExecutionSpec = serde_json::from_str(&row.spec)
                    .map_err(|e| ExecutorError::Internal(format!("stored execution {} is corrupt: {e}", row.id)))?;
                let same = stored.plan == accepted.spec.plan
                    && stored.options == accepted.spec.options
                    && stored.request_id == accepted.spec.request_id;
                if same { Ok(()) } else { Err(ExecutorError::AlreadyExists(row.id.clone())) }
            }
        }
    }

    /// Runs an execution here from `state` (which holds its stored events).
    fn start(self: &Arc<Self>, id: String, state: ExecutionState, traceparent: &str) {
        let mut running = self.running();
        if running.contains_key(&id) {
            return;
        }
        let span = tracing::info_span!(
            "execution",
            otel.name = %format_args!("execution {id}"),
            request_id = %state.spec.request_id,
            execution_id = %id,
            steps = state.steps.len(),
        );
        // A resumed execution continues the trace of the request that started it.
        agentmesh_telemetry::propagation::continue_trace(&span, traceparent);
        let (cancel, cancelled) = signal::channel(None);
        let runner = Runner::new(self.clone(), Arc::from(id.as_str()), state, Arc::from(traceparent));
        let engine = self.clone();
        let key = id.clone();
        let stop = self.stop.clone();
        self.metrics.running.inc();
        let task = tokio::spawn(
            async move {
                let stopped = runner.run(cancelled, stop).await;
                engine.running().remove(&key);
                engine.metrics.running.dec();
                if stopped == Stopped::Lost {
                    tracing::warn!(execution_id = %key, "execution taken over by another replica");
                }
            }
            .instrument(span),
        );
        running.insert(id, Running { cancel, task });
    }

    /// Loads a stored execution: its row and its state with every event applied.
    pub async fn load(
        &self,
        id: &str,
    ) -> Result<Option<(agentmesh_store::executions::ExecutionRow, ExecutionState)>, ExecutorError> {
        let Some(row) = self.store.get(id).await? else { return Ok(None) };
        let spec: ExecutionSpec = serde_json::from_str(&row.spec)
            .map_err(|e| ExecutorError::Internal(format!("stored execution {id} is corrupt: {e}")))?;
        let mut state = ExecutionState::new(spec);
        let mut after = 0;
        loop {
            let rows = self.store.events_after(id, after, 1000).await?;
            for event in &rows {
                state.apply(&event_from_row(event)?);
            }
            match rows.last() {
                Some(last) if rows.len() == 1000 => after = last.sequence,
                _ => break,
            }
        }
        Ok(Some((row, state)))
    }

    /// Resumes an execution this replica just claimed.
    pub async fn resume(self: &Arc<Self>, id: &str) -> Result<(), ExecutorError> {
        let Some((row, state)) = self.load(id).await? else { return Ok(()) };
        if state.status.is_final() {
            return Ok(());
        }
        tracing::info!(
            execution_id = id,
            request_id = %state.spec.request_id,
            last_sequence = state.last_sequence,
            "resuming execution"
        );
        self.start(id.to_owned(), state, &row.traceparent);
        if let Some(reason) = row.cancel_requested {
            self.signal_cancel(id, reason);
        }
        Ok(())
    }

    /// Gives a finished (completed or failed) execution more steps and runs
    /// them here; returns the sequence of the `execution_extended` event.
    pub async fn extend(
        self: &Arc<Self>,
        id: &str,
        mut steps: Vec<agentmesh_core::plan::PlanStep>,
        collaborations: Vec<agentmesh_core::execution::Collaboration>,
        preference: (String, i32),
        reason: String,
    ) -> Result<u64, ExecutorError> {
        let Some((row, mut state)) = self.load(id).await? else { return Err(ExecutorError::NotFound(id.to_owned())) };
        match state.status {
            ExecutionStatus::Completed | ExecutionStatus::Failed => {}
            ExecutionStatus::Cancelled => {
                return Err(ExecutorError::FailedPrecondition(format!(
                    "execution `{id}` was cancelled; a cancelled execution is not extended"
                )));
            }
            _ => {
                return Err(ExecutorError::FailedPrecondition(format!(
                    "execution `{id}` is still running; extend it once it has finished"
                )));
            }
        }
        if !collaborations.is_empty() {
            let (planned, rejected) = replan::plan_all(self, id, &state, collaborations, preference).await;
            if steps.is_empty() && planned.is_empty() {
                return Err(ExecutorError::NothingToRun(format!(
                    "the planner turned none of the collaborations into a step ({})",
                    rejected.join("; ")
                )));
            }
            steps.extend(planned);
        }
        let mut extended = state.plan();
        extended.steps.extend(steps.iter().cloned());
        if extended.steps.len() > self.settings.max_steps {
            return Err(ExecutorError::ResourceExhausted(format!(
                "the execution would have {} steps; this executor accepts at most {} (max_steps_per_plan)",
                extended.steps.len(),
                self.settings.max_steps
            )));
        }
        agentmesh_core::plan::check_structure(&extended).map_err(ExecutorError::InvalidPlan)?;
        // The runner that recorded the end may still be leaving; a new one
        // starts only once it is gone.
        let leaving = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.runs(id) && tokio::time::Instant::now() < leaving {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let event = Event {
            sequence: state.last_sequence + 1,
            kind: EventKind::ExecutionExtended,
            step_id: String::new(),
            attempt: 0,
            at: agentmesh_core::execution::now_ms(),
            payload: EventPayload { added_steps: steps, error: reason, ..Default::default() },
        };
        let now = chrono::Utc::now();
        let steps = i64::try_from(extended.steps.len()).unwrap_or(i64::MAX);
        let lease = lease_end(now, self.settings.lease);
        if !self.store.reopen(id, &to_row(&event), steps, &self.owner, lease, now.timestamp_millis()).await? {
            return Err(ExecutorError::FailedPrecondition(format!(
                "execution `{id}` changed while it was being extended; read it again and retry"
            )));
        }
        state.apply(&event);
        tracing::info!(
            execution_id = id,
            request_id = %state.spec.request_id,
            added = event.payload.added_steps.len(),
            reason = %event.payload.error,
            "execution extended"
        );
        self.start(id.to_owned(), state, &row.traceparent);
        Ok(event.sequence)
    }

    /// Tells the local runner, if any, to cancel.
    pub fn signal_cancel(&self, id: &str, reason: String) -> bool {
        match self.running().get(id) {
            Some(running) => {
                running.cancel.send_replace(Some(reason));
                true
            }
            None => false,
        }
    }

    /// Stops local runners whose lease went elsewhere.
    pub fn drop_lost(&self, still_held: &[String]) {
        let mut running = self.running();
        let lost: Vec<String> = running.keys().filter(|id| !still_held.contains(id)).cloned().collect();
        for id in lost {
            if let Some(r) = running.remove(&id) {
                tracing::warn!(execution_id = %id, "lease lost; stopping here");
                r.task.abort();
                self.metrics.running.dec();
            }
        }
    }

    /// Waits until an execution reaches a final state, or `timeout` passes.
    pub async fn wait_final(&self, id: &str, timeout: Duration) -> Result<(), ExecutorError> {
        let mut live = self.hub.subscribe(id);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let Some(row) = self.store.get(id).await? else { return Err(ExecutorError::NotFound(id.to_owned())) };
            if row.status.parse::<ExecutionStatus>().is_ok_and(ExecutionStatus::is_final) {
                return Ok(());
            }
            let wait = deadline.saturating_duration_since(tokio::time::Instant::now()).min(Duration::from_millis(200));
            if wait.is_zero() {
                return Ok(());
            }
            let _ = tokio::time::timeout(wait, live.recv()).await;
        }
    }
}
