//! One step, attempt after attempt: find its agent in discovery, pass its
//! circuit, call it within the timeout, check the output, and retry what
//! may succeed on a second try, unless the call may have reached a
//! capability declared not idempotent. The runner hears of each retry and
//! of the outcome through its channel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentmesh_core::Hints;
use agentmesh_core::execution::StepProgress;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::Engine;
use super::runner::Msg;
use crate::catalog::{LookupError, target_of};
use crate::transport::{AgentTransport, Call, Failure, ProgressReport, Reply};

/// Progress reports closer than this to the last one passed on are
/// dropped (one that completes the work never is).
const MIN_PROGRESS_GAP: Duration = Duration::from_millis(100);

/// Passes one attempt's progress reports to the runner, which records
/// them as STEP_PROGRESS events.
struct Reporter<'a> {
    tx: &'a mpsc::Sender<Msg>,
    index: usize,
    attempt: u32,
    last: std::sync::Mutex<Option<Instant>>,
}

impl ProgressReport for Reporter<'_> {
    fn report(&self, progress: StepProgress) {
        let done = progress.total.is_some_and(|total| progress.progress >= total);
        let now = Instant::now();
        let Ok(mut last) = self.last.lock() else { return };
        if !done && last.is_some_and(|at| now.duration_since(at) < MIN_PROGRESS_GAP) {
            return;
        }
        *last = Some(now);
        // A runner too busy to take it now will hear of the next one.
        let _ = self.tx.try_send(Msg::Progress { index: self.index, attempt: self.attempt, progress });
    }
}

/// What a step task needs.
pub struct StepJob {
    /// The execution.
    pub execution_id: Arc<str>,
    /// The originating request.
    pub request_id: Arc<str>,
    /// The trace context the execution was started in.
    pub traceparent: Arc<str>,
    /// Position of the step in the runner's list.
    pub index: usize,
    /// The step.
    pub step_id: String,
    /// Its agent.
    pub agent: String,
    /// Its capability.
    pub capability: String,
    /// Parameters, references resolved.
    pub parameters: Value,
    /// Instruction, references resolved.
    pub instruction: String,
    /// The caller's own agents, never called.
    pub callers: Arc<[String]>,
    /// Number of the first attempt made here.
    pub first_attempt: u32,
    /// Retries still allowed.
    pub retries_left: u32,
    /// Timeout of each attempt.
    pub timeout: Duration,
}

/// Runs the step to its outcome; the runner aborts the task to cancel it.
pub async fn run(engine: Arc<Engine>, job: StepJob, tx: mpsc::Sender<Msg>) {
    let started = Instant::now();
    let mut attempt = job.first_attempt;
    let mut retries_left = job.retries_left;
    loop {
        let span = tracing::debug_span!(
            "step",
            otel.name = %format_args!("step {} {}:{}", job.step_id, job.agent, job.capability),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            request_id = %job.request_id,
            execution_id = %job.execution_id,
            step_id = %job.step_id,
            agent_id = %job.agent,
            capability = %job.capability,
            attempt,
            error = tracing::field::Empty,
        );
        let progress = Reporter { tx: &tx, index: job.index, attempt, last: std::sync::Mutex::new(None) };
        let outcome = attempt_once(&engine, &job, attempt, retries_left > 0, &progress).instrument(span.clone()).await;
        if let Err(failure) = &outcome {
            span.record("otel.status_code", "ERROR");
            span.record("error", failure.message.as_str());
        }
        match outcome {
            Err(failure) if failure.retryable && retries_left > 0 => {
                let delay = engine.settings.backoff.delay(attempt.saturating_sub(1), failure.retry_after);
                engine.metrics.retries.with_label_values(&[&job.agent]).inc();
                let retrying = Msg::Retrying { index: job.index, attempt, error: failure.message, delay };
                if tx.send(retrying).await.is_err() {
                    return;
                }
                tokio::time::sleep(delay).await;
                attempt += 1;
                retries_left -= 1;
            }
            outcome => {
                let result = outcome.map_err(|f| {
                    if f.retryable && job.retries_left > 0 {
                        format!("{} (after {} attempts)", f.message, attempt - job.first_attempt + 1)
                    } else {
                        f.message
                    }
                });
                let _ = tx.send(Msg::Finished { index: job.index, attempt, result, duration: started.elapsed() }).await;
                return;
            }
        }
    }
}

/// One attempt. When `may_retry`, a failure that may have left the call
/// carried out comes back retryable only if the capability is safe to call
/// twice ([`Hints::retry_safe`]).
async fn attempt_once(
    engine: &Engine,
    job: &StepJob,
    attempt: u32,
    may_retry: bool,
    progress: &dyn ProgressReport,
) -> Result<Reply, Failure> {
    let agent = match engine.catalog.agent(&job.agent).await {
        Ok(agent) => agent,
        Err(LookupError::UnknownAgent(id)) => {
            return Err(Failure::fatal(format!(
                "agent `{id}` is not registered (it may have been deregistered since the plan was made)"
            )));
        }
        Err(LookupError::Unavailable(message)) => {
            return Err(Failure {
                message: format!("discovery is unavailable, so the agent's address is unknown: {message}"),
                retryable: true,
                retry_after: None,
                agent_fault: false,
                ambiguous: false,
            });
        }
    };
    let target = target_of(&agent, &job.capability, &job.callers).map_err(Failure::fatal)?;
    let admitted = crate::breaker::Admitted::new(&engine.breakers, &job.agent).map_err(Failure::fatal)?;
    let credential = match &target.credential {
        Some(name) => Some(engine.credentials.for_agent(name, &target.agent_id).map_err(Failure::fatal)?),
        None => None,
    };
    let _permit = engine.step_permits.acquire().await.map_err(|_| Failure::fatal("the executor is stopping"))?;
    let call = Call {
        target: &target,
        parameters: &job.parameters,
        instruction: &job.instruction,
        request_id: &job.request_id,
        traceparent: &job.traceparent,
        execution_id: &job.execution_id,
        step_id: &job.step_id,
        attempt,
        timeout: job.timeout,
        credential: credential.as_ref(),
        progress,
    };
    let transport: &dyn AgentTransport = match target.transport {
        agentmesh_core::Transport::Http => &engine.http,
        agentmesh_core::Transport::Grpc => &engine.grpc,
        agentmesh_core::Transport::Mcp => &engine.mcp,
        agentmesh_core::Transport::A2a => &engine.a2a,
    };
    // A step error names the agent's address: never with its password or
    // a secret query parameter, whatever the transport wrote, nor with the
    // credential an agent echoed back.
    let result = transport.invoke(&call).await.map_err(|mut failure| {
        let mut secrets = agentmesh_telemetry::secrets::url_secrets(&target.base_url);
        secrets.extend(credential.iter().map(|c| c.secret.clone()));
        failure.message = agentmesh_telemetry::secrets::scrub(&failure.message, &secrets);
        if may_retry && failure.retryable && failure.ambiguous && !Hints::retry_safe(target.hints.as_ref()) {
            failure.retryable = false;
            failure.message = format!(
                "{} (not retried: `{}:{}` is not idempotent, and the call may have reached it)",
                failure.message, target.agent_id, target.capability
            );
        }
        failure
    });
    let fault = result.as_ref().err().is_some_and(|f| f.agent_fault);
    let circuit = admitted.record(fault);
    engine.metrics.circuit.with_label_values(&[&job.agent]).set(circuit.gauge());
    let reply = result?;
    if let Some(schema) = &target.output_schema {
        let violations = schema.violations(&reply.output);
        if !violations.is_empty() {
            return Err(Failure::fatal(format!(
                "the output does not fit the output schema of {}:{}: {}",
                job.agent,
                job.capability,
                violations.join("; ")
            )));
        }
    }
    Ok(reply)
}
