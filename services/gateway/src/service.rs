//! The gRPC GatewayService, and what it shares with the REST front door:
//! checking a request and starting its orchestration.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::gateway_service_server::GatewayService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::events::EventWriter;
use crate::metrics::Metrics;
use crate::orchestrate::{Clients, Orchestration};
use agentmesh_store::OrchestrationLog;

/// What every orchestration shares.
pub struct Shared {
    /// The stages.
    pub clients: Clients,
    /// Longest query accepted, in characters.
    pub max_query_chars: usize,
    /// Longest an orchestration may take (a shorter client deadline wins).
    pub request_timeout: Duration,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Stores every message for resuming.
    pub events: EventWriter,
    /// Where the messages are stored.
    pub log: Arc<dyn OrchestrationLog>,
    /// How long messages (and a request id's claim) are kept.
    pub retention: Duration,
    /// How long an SSE orchestration waits for its client to come back.
    pub resume_grace: Duration,
    /// Resumed streams following each request id, in this process.
    pub followers: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// A resumed stream following a request id; counted while it lives.
pub struct Following {
    shared: Arc<Shared>,
    request_id: String,
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut followers = self.shared.followers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = followers.get_mut(&self.request_id) {
            *n -= 1;
            if *n == 0 {
                followers.remove(&self.request_id);
            }
        }
    }
}

impl Shared {
    /// Counts a resumed stream of `request_id` until the guard is dropped.
    pub fn follow(self: &Arc<Self>, request_id: &str) -> Following {
        let mut followers = self.followers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *followers.entry(request_id.to_owned()).or_default() += 1;
        Following { shared: self.clone(), request_id: request_id.to_owned() }
    }

    /// Whether a resumed stream follows `request_id` here.
    pub fn followed(&self, request_id: &str) -> bool {
        self.followers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(request_id)
    }

    /// Passes an orchestration's messages to an SSE client. When the client
    /// goes away, the orchestration goes on for the resume grace period, and
    /// then as long as a resumed stream follows it; otherwise the messages
    /// are dropped, which stops it and cancels its execution.
    pub async fn relay(
        self: Arc<Self>,
        request_id: String,
        mut from: mpsc::Receiver<pb::OrchestrateResponse>,
        to: mpsc::Sender<pb::OrchestrateResponse>,
    ) {
        loop {
            tokio::select! {
                message = from.recv() => match message {
                    Some(message) => {
                        if to.send(message).await.is_err() {
                            break;
                        }
                    }
                    None => return,
                },
                () = to.closed() => break,
            }
        }
        tracing::info!(
            request_id,
            grace_ms = u64::try_from(self.resume_grace.as_millis()).unwrap_or(u64::MAX),
            "the SSE client went away; waiting for it to resume"
        );
        let mut deadline = tokio::time::Instant::now() + self.resume_grace;
        loop {
            tokio::select! {
                message = from.recv() => if message.is_none() { return },
                () = tokio::time::sleep_until(deadline) => {
                    if !self.followed(&request_id) {
                        return;
                    }
                    deadline = tokio::time::Instant::now() + Duration::from_secs(1);
                }
            }
        }
    }
}

/// A started orchestration.
pub struct Started {
    /// Its request id.
    pub request_id: String,
    /// Its trace id, while traces are exported.
    pub trace_id: Option<String>,
    /// Its messages, ending with the final answer or an error.
    pub messages: mpsc::Receiver<pb::OrchestrateResponse>,
}

impl Shared {
    /// Checks `request` and starts its orchestration in the background; it
    /// stops when the receiver of its messages is dropped.
    pub async fn start(
        &self,
        mut request: pb::OrchestrateRequest,
        client_timeout: Option<Duration>,
        principal: &agentmesh_server::Principal,
    ) -> Result<Started, Status> {
        if request.query.trim().is_empty() {
            return Err(Status::invalid_argument("query must not be empty"));
        }
        let length = request.query.chars().count();
        if length > self.max_query_chars {
            return Err(Status::invalid_argument(format!(
                "query is {length} characters; the gateway accepts at most {} (max_query_chars)",
                self.max_query_chars
            )));
        }
        if let Some(budget) = request.review_budget.filter(|b| *b > crate::orchestrate::MAX_REVIEW_BUDGET) {
            return Err(Status::invalid_argument(format!(
                "review_budget is {budget}; at most {} recovery rounds are allowed",
                crate::orchestrate::MAX_REVIEW_BUDGET
            )));
        }
        if let Some(context) = request.options.as_ref().and_then(|o| o.context.as_ref()) {
            // Forwarded inside the planner's request: it must decode there too.
            agentmesh_core::validate::check_json_depth(&agentmesh_proto::json::from_struct(context))
                .map_err(|e| Status::invalid_argument(format!("options.context {e}")))?;
        }
        if request.request_id.is_empty() {
            // Callers pass the id the stack gave the call; this is for callers without one.
            request.request_id = agentmesh_server::new_request_id();
        }
        // Without the log the orchestration still streams (it cannot be
        // resumed, as with every message the log fails to keep).
        let claimed = match self
            .log
            .claim(&request.request_id, &principal.name, chrono::Utc::now().timestamp_millis(), self.retention)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(request_id = %request.request_id, error = %e, "could not claim the request id in the orchestration event log");
                true
            }
        };
        if !claimed {
            return Err(Status::already_exists(format!(
                "request id `{}` belongs to an orchestration already; resume its stream with Last-Event-ID \
                 (GET /api/v1/orchestrations/{}/events) or send a new request id",
                request.request_id, request.request_id
            )));
        }
        let request_id = request.request_id.clone();
        let timeout = client_timeout.map_or(self.request_timeout, |t| t.min(self.request_timeout));
        let span = tracing::info_span!("orchestrate", request_id = %request_id, operation = "orchestrate");
        let trace_id = agentmesh_telemetry::propagation::trace_id(&span);
        let (tx, rx) = mpsc::channel(64);
        let orchestration = Orchestration::new(
            self.clients.clone(),
            request_id.clone(),
            tx,
            timeout,
            self.metrics.clone(),
            self.events.clone(),
        )
        .owned_by(principal.name.clone());
        tracing::info!(parent: &span, request_id = %request_id, "orchestration started");
        tokio::spawn(orchestration.run(request).instrument(span));
        Ok(Started { request_id, trace_id, messages: rx })
    }
}

impl Shared {
    /// Whether an orchestration with this request id was started (its
    /// claim, at sequence 0, counts: its first message may not be stored
    /// yet), and who started it (`Some("")`: nobody known, authentication
    /// off then, or the claim not kept).
    pub async fn owner(&self, request_id: &str) -> Option<String> {
        let now = chrono::Utc::now().timestamp_millis();
        let rows = self.log.events_after(request_id, -1, 1, now).await.ok()?;
        let first = rows.first()?;
        if first.sequence != 0 {
            return Some(String::new());
        }
        let data: serde_json::Value = serde_json::from_str(&first.data).unwrap_or_default();
        Some(data["owner"].as_str().unwrap_or_default().to_owned())
    }
}

/// A call to another service made with the caller's own bearer token
/// (`authorization`, when it sent one), so that the service applies its
/// own rules to the caller, allowed `timeout`.
pub fn as_caller<T>(authorization: Option<&str>, message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(value) = authorization.and_then(|v| v.parse().ok()) {
        request.metadata_mut().insert("authorization", value);
    }
    request.set_timeout(timeout);
    request
}

/// The gRPC service.
pub struct GatewayGrpc {
    /// Shared with REST.
    pub shared: Arc<Shared>,
}

type Messages = Pin<Box<dyn Stream<Item = Result<pb::OrchestrateResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GatewayService for GatewayGrpc {
    type OrchestrateStream = Messages;

    async fn orchestrate(
        &self,
        request: Request<pb::OrchestrateRequest>,
    ) -> Result<Response<Self::OrchestrateStream>, Status> {
        let timeout = agentmesh_server::call_timeout(request.metadata());
        let request_id = agentmesh_server::call_request_id(request.metadata(), &request.get_ref().request_id)?;
        let principal = agentmesh_server::principal_of(request.extensions());
        let started = self
            .shared
            .start(pb::OrchestrateRequest { request_id, ..request.into_inner() }, timeout, &principal)
            .await?;
        let stream: Messages = Box::pin(ReceiverStream::new(started.messages).map(Ok));
        let mut response = Response::new(stream);
        if let Ok(value) = started.request_id.parse() {
            response.metadata_mut().insert("x-request-id", value);
        }
        if let Some(value) = started.trace_id.and_then(|t| t.parse().ok()) {
            response.metadata_mut().insert("x-trace-id", value);
        }
        Ok(response)
    }
}
