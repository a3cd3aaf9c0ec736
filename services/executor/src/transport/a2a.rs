//! Calling A2A agents: the step's `message` parameter (else its
//! instruction) is sent as a message to the interface the agent's card
//! names, in the card's protocol version (1.0 or 0.3), streamed when the
//! card says the agent streams. The card is read when the agent is first
//! called and again a minute later, or after a call fails to reach it.
//!
//! How the task ends is the step's outcome: `completed` gives the
//! artifacts as output; `failed`, `rejected` and `canceled` fail the step
//! with the agent's words; `input-required` and `auth-required` fail it
//! with a reason saying the user must answer, which the review turns into
//! an `ask_user` action. Each status the agent reports while it works is
//! a progress report to the step's watchers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentmesh_a2a::client::{self, Ending, Request};
use agentmesh_a2a::{CallError, Card, Event};
use agentmesh_core::execution::StepProgress;
use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::Mutex;

use super::{AgentTransport, Call, Failure, Reply};
use crate::egress::Egress;

/// How long a card read is trusted.
const CARD_TTL: Duration = Duration::from_secs(60);

struct Known {
    base_url: String,
    card: Arc<Card>,
    read_at: Instant,
}

/// The A2A transport.
pub struct A2aTransport {
    http: reqwest::Client,
    egress: Arc<Egress>,
    cards: Mutex<HashMap<String, Known>>,
}

impl A2aTransport {
    /// Calls go through `http` (the HTTP transport's client: the same
    /// egress checks at connection time, no redirects).
    pub fn new(http: reqwest::Client, egress: Arc<Egress>) -> Self {
        Self { http, egress, cards: Mutex::new(HashMap::new()) }
    }

    fn check(&self, url: &str) -> Result<(), Failure> {
        let parsed =
            url::Url::parse(url).map_err(|e| Failure::fatal(format!("the agent's URL `{url}` is not a URL: {e}")))?;
        self.egress.check_call(&parsed).map_err(|e| Failure::fatal(format!("refused to call {parsed}: {e}")))
    }

    async fn card(&self, call: &Call<'_>, timeout: Duration) -> Result<Arc<Card>, Failure> {
        let target = call.target;
        if let Some(known) = self.cards.lock().await.get(&target.agent_id)
            && known.base_url == target.base_url
            && known.read_at.elapsed() < CARD_TTL
        {
            return Ok(known.card.clone());
        }
        self.check(&agentmesh_a2a::card::card_url(&target.base_url))?;
        let card = agentmesh_a2a::card::fetch(&self.http, &target.base_url, timeout).await.map_err(|e| match e {
            agentmesh_a2a::CardError::Unreachable { .. } => Failure::unreachable(e.to_string()),
            agentmesh_a2a::CardError::Invalid { .. } => Failure::fatal(e.to_string()),
        })?;
        self.check(&card.interface.url)?;
        let card = Arc::new(card);
        self.cards.lock().await.insert(
            target.agent_id.clone(),
            Known { base_url: target.base_url.clone(), card: card.clone(), read_at: Instant::now() },
        );
        Ok(card)
    }

    async fn forget(&self, agent_id: &str) {
        self.cards.lock().await.remove(agent_id);
    }
}

/// The message a step sends: its `message` parameter, else its
/// instruction.
fn message_of(call: &Call<'_>) -> Result<String, Failure> {
    match call.parameters.get("message") {
        Some(Value::String(text)) if !text.trim().is_empty() => Ok(text.clone()),
        Some(Value::String(_)) | None if !call.instruction.trim().is_empty() => Ok(call.instruction.to_owned()),
        Some(other) if !other.is_string() => {
            Err(Failure::fatal(format!("an A2A skill takes {{\"message\": string}}; the step's message is {other}")))
        }
        _ => Err(Failure::fatal("an A2A skill needs a message: the step has neither `message` nor an instruction")),
    }
}

#[async_trait]
impl AgentTransport for A2aTransport {
    async fn invoke(&self, call: &Call<'_>) -> Result<Reply, Failure> {
        let text = message_of(call)?;
        let started = Instant::now();
        let card = self.card(call, call.timeout).await?;
        let mut headers = vec![("traceparent".to_owned(), super::traceparent(call))];
        headers.retain(|(_, v)| !v.is_empty());
        if let Some(credential) = call.credential
            && let Ok(value) = credential.value.to_str()
        {
            headers.push((credential.header.as_str().to_owned(), value.to_owned()));
        }
        let message_id = call.idempotency_key();
        let request = Request {
            interface: &card.interface,
            streaming: card.streaming,
            skill: &call.target.endpoint,
            text: &text,
            message_id: &message_id,
            request_id: call.request_id,
            headers: &headers,
            timeout: call.timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(1)),
        };
        let mut reports = 0.0;
        let mut on_event = |event: &Event| {
            if let Event::Status { state, message, .. } = event {
                reports += 1.0;
                let said = message.as_ref().map(|m| agentmesh_a2a::wire::text_of(&m.parts)).unwrap_or_default();
                let state = state.name(agentmesh_a2a::Version::V03);
                let message = if said.is_empty() { state.to_owned() } else { format!("{state}: {said}") };
                call.progress.report(StepProgress { progress: reports, total: None, message });
            }
        };
        let skill = &call.target.endpoint;
        let outcome = match client::send(&self.http, &request, &mut on_event).await {
            Ok(outcome) => outcome,
            Err(error) => return Err(self.failure(call, error).await),
        };
        match client::ending(&outcome) {
            Ending::Output(output) => Ok(Reply { output, collaborate: None }),
            Ending::Failed(reason) | Ending::NeedsUser(reason) => {
                Err(Failure::fatal(format!("`{skill}` of {}: {reason}", call.target.base_url)))
            }
        }
    }
}

impl A2aTransport {
    async fn failure(&self, call: &Call<'_>, error: CallError) -> Failure {
        let at = &call.target.base_url;
        match error {
            CallError::NotSent(reason) => {
                self.forget(&call.target.agent_id).await;
                Failure::unreachable(format!("could not reach the A2A agent at {at}: {reason}"))
            }
            CallError::Lost(reason) => {
                self.forget(&call.target.agent_id).await;
                Failure::unanswered(format!("the message to the A2A agent at {at} got no answer: {reason}"))
            }
            CallError::Refused { status, retry_after, message } => {
                let failure = format!("the A2A agent at {at} answered HTTP {status}: {message}");
                match status {
                    429 | 503 => Failure { retry_after, ..Failure::unreachable(failure) },
                    500..=599 => Failure::unanswered(failure),
                    404 => {
                        // The card may have moved the endpoint: read it again next time.
                        self.forget(&call.target.agent_id).await;
                        Failure::fatal(failure)
                    }
                    _ => Failure::fatal(failure),
                }
            }
            CallError::Rpc { method, code, message } => {
                Failure::fatal(format!("the A2A agent at {at} answered {method} with an error ({code}): {message}"))
            }
            CallError::Invalid(reason) => Failure::fatal(format!("the A2A agent at {at} answered oddly: {reason}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refusals_are_not_retried_and_lost_messages_are_ambiguous() {
        // Classification alone: a transport without cards is enough.
        let transport = A2aTransport::new(
            agentmesh_telemetry::http::client_builder().build().unwrap_or_default(),
            Arc::new(Egress::new(&[], &[]).unwrap_or_else(|e| panic!("{e}"))),
        );
        let target = crate::transport::Target {
            agent_id: "a".into(),
            base_url: "http://a/".into(),
            transport: agentmesh_core::Transport::A2a,
            credential: None,
            capability: "s".into(),
            kind: agentmesh_core::CapabilityKind::Skill,
            endpoint: "s".into(),
            output_schema: None,
            hints: None,
        };
        struct Quiet;
        impl super::super::ProgressReport for Quiet {
            fn report(&self, _: StepProgress) {}
        }
        let call = Call {
            target: &target,
            parameters: &Value::Null,
            instruction: "",
            request_id: "",
            traceparent: "",
            execution_id: "e",
            step_id: "s",
            attempt: 1,
            timeout: Duration::from_secs(1),
            credential: None,
            progress: &Quiet,
        };
        let lost = transport.failure(&call, CallError::Lost("cut".into())).await;
        assert!(lost.retryable && lost.ambiguous);
        let rpc = transport
            .failure(&call, CallError::Rpc { method: "SendMessage".into(), code: -32602, message: "bad".into() })
            .await;
        assert!(!rpc.retryable);
        let busy =
            CallError::Refused { status: 503, retry_after: Some(Duration::from_secs(2)), message: String::new() };
        let busy = transport.failure(&call, busy).await;
        assert!(busy.retryable && !busy.ambiguous && busy.retry_after == Some(Duration::from_secs(2)));
        assert!(message_of(&call).is_err());
    }
}
