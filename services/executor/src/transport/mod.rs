//! How a step reaches its agent: HTTP ([`http::HttpTransport`]), the
//! gRPC `AgentService` ([`grpc::GrpcTransport`]), MCP ([`mcp::McpTransport`])
//! or A2A ([`a2a::A2aTransport`]), at the address discovery
//! holds for the agent at dispatch time, never one taken from a plan.

pub mod a2a;
pub mod grpc;
pub mod http;
pub mod mcp;

use std::time::Duration;

use agentmesh_core::execution::Collaboration;
use agentmesh_core::{CapabilityKind, Transport};
use async_trait::async_trait;
use serde_json::Value;

/// One capability of one agent, as discovery describes it right now.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Agent id.
    pub agent_id: String,
    /// The agent's registered base URL.
    pub base_url: String,
    /// How it is called.
    pub transport: Transport,
    /// The name of the credential it is called with, if it needs one.
    pub credential: Option<String>,
    /// Reasoner or skill id.
    pub capability: String,
    /// Reasoner or skill.
    pub kind: CapabilityKind,
    /// HTTP path of the capability on the agent.
    pub endpoint: String,
    /// What its output must fit, if declared (compiled).
    pub output_schema: Option<agentmesh_core::schema::Schema>,
    /// What calling it does to the world, if declared: whether a call that
    /// may have reached it can be made again.
    pub hints: Option<agentmesh_core::Hints>,
}

/// Where a running attempt's progress reports go (the step's watchers).
pub trait ProgressReport: Send + Sync {
    /// One report; reports may be dropped when they come too fast.
    fn report(&self, progress: agentmesh_core::execution::StepProgress);
}

/// One attempt of one step.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    /// Where.
    pub target: &'a Target,
    /// Parameters, references resolved.
    pub parameters: &'a Value,
    /// The step's instruction, references resolved.
    pub instruction: &'a str,
    /// The originating request.
    pub request_id: &'a str,
    /// The trace context the execution was started in: passed on as it
    /// came when this executor exports no traces (else the step's own
    /// span is the parent).
    pub traceparent: &'a str,
    /// The execution.
    pub execution_id: &'a str,
    /// The step.
    pub step_id: &'a str,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// How long the attempt may take.
    pub timeout: Duration,
    /// What authenticates the executor to the agent, if it needs it.
    pub credential: Option<&'a crate::credentials::Credential>,
    /// Where the agent's progress reports go.
    pub progress: &'a dyn ProgressReport,
}

impl Call<'_> {
    /// The same for every attempt of a step: an agent that sees it twice
    /// may answer the second call with the first call's result.
    pub fn idempotency_key(&self) -> String {
        format!("{}/{}", self.execution_id, self.step_id)
    }
}

/// What an agent answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The capability's output.
    pub output: Value,
    /// A collaboration it asks for.
    pub collaborate: Option<Collaboration>,
}

/// Why an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What happened, for the step's error.
    pub message: String,
    /// Whether trying again may succeed.
    pub retryable: bool,
    /// How long the agent asked the caller to wait.
    pub retry_after: Option<Duration>,
    /// Whether the failure says the agent is unwell (counts for its circuit).
    pub agent_fault: bool,
    /// Whether the call may have reached the agent and done its work
    /// although no answer says so (a timeout, a connection lost after the
    /// request was sent): a second call may do it twice. False when the
    /// call is known not to have been taken (no connection, an answer
    /// asking to come back later) or when the agent itself answered.
    pub ambiguous: bool,
}

impl Failure {
    /// A failure retrying cannot fix, not the agent's fault.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self { message: message.into(), retryable: false, retry_after: None, agent_fault: false, ambiguous: false }
    }

    /// The agent could not be reached: the call never got to it.
    pub fn unreachable(message: impl Into<String>) -> Self {
        Self { message: message.into(), retryable: true, retry_after: None, agent_fault: true, ambiguous: false }
    }

    /// The call went out but no answer came back (a timeout, a connection
    /// lost mid-call): the agent may have acted on it.
    pub fn unanswered(message: impl Into<String>) -> Self {
        Self { ambiguous: true, ..Self::unreachable(message) }
    }
}

/// A way of calling agents.
#[async_trait]
pub trait AgentTransport: Send + Sync {
    /// Makes one attempt.
    async fn invoke(&self, call: &Call<'_>) -> Result<Reply, Failure>;
}

/// The trace context to send: this step's span when the executor exports
/// traces, else the one the execution was started in.
pub(crate) fn traceparent(call: &Call<'_>) -> String {
    let mut headers = ::http::HeaderMap::new();
    agentmesh_telemetry::propagation::inject(&tracing::Span::current(), None, &mut headers);
    headers.get("traceparent").and_then(|v| v.to_str().ok()).map_or_else(|| call.traceparent.to_owned(), str::to_owned)
}

/// An agent's answer body: either the output itself, or an envelope
/// `{"output": …, "collaborate": {…}}` / `{"error": "…", "retryable": bool}`
/// (an object whose keys are only these).
pub fn read_answer(body: Value) -> Result<Reply, Failure> {
    const ENVELOPE: [&str; 4] = ["output", "collaborate", "error", "retryable"];
    let is_envelope = body.as_object().is_some_and(|o| {
        !o.is_empty()
            && o.keys().all(|k| ENVELOPE.contains(&k.as_str()))
            && (o.contains_key("output") || o.contains_key("error"))
    });
    if !is_envelope {
        return Ok(Reply { output: body, collaborate: None });
    }
    let Value::Object(mut envelope) = body else { return Err(Failure::fatal("unreachable")) };
    if let Some(error) = envelope.get("error").filter(|e| !e.is_null()) {
        let message = error.as_str().map_or_else(|| error.to_string(), str::to_owned);
        let retryable = envelope.get("retryable").and_then(Value::as_bool).unwrap_or(false);
        return Err(Failure {
            message: format!("the agent reported an error: {message}"),
            retryable,
            retry_after: None,
            agent_fault: false,
            ambiguous: false,
        });
    }
    let collaborate = match envelope.remove("collaborate") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            serde_json::from_value::<Collaboration>(value)
                .map_err(|e| Failure::fatal(format!("the agent's `collaborate` is malformed: {e}")))?,
        ),
    };
    Ok(Reply { output: envelope.remove("output").unwrap_or(Value::Null), collaborate })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_are_outputs_or_envelopes() {
        let plain = read_answer(json!({"temp_c": 21.5}));
        assert_eq!(plain.ok().map(|r| r.output), Some(json!({"temp_c": 21.5})));
        let wrapped = read_answer(
            json!({"output": {"x": 1}, "collaborate": {"agent": "fixer", "capability": "fix", "query": "q"}}),
        )
        .ok();
        assert_eq!(wrapped.as_ref().map(|r| r.output.clone()), Some(json!({"x": 1})));
        assert_eq!(wrapped.and_then(|r| r.collaborate).map(|c| c.agent), Some("fixer".to_owned()));
        let error = read_answer(json!({"error": "quota exceeded", "retryable": true})).err();
        assert_eq!(
            error.map(|f| (f.retryable, f.message)),
            Some((true, "the agent reported an error: quota exceeded".into()))
        );
        // An output that merely has an `output` field among others is an output.
        let other = read_answer(json!({"output": 1, "unit": "C"}));
        assert_eq!(other.ok().map(|r| r.output), Some(json!({"output": 1, "unit": "C"})));
        assert!(read_answer(json!({"output": 1, "collaborate": "nope"})).is_err());
    }
}
