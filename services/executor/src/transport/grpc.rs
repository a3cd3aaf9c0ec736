//! Calling agents over gRPC: `agentmesh.v1.AgentService/Invoke` at the
//! agent's base URL, with the request id and idempotency key in metadata
//! and the trace context injected by the traced channel. Retryable:
//! `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`, and an
//! answer whose `error` comes with `retryable: true`. Ambiguous (the agent
//! may have acted on the call): no answer in time, and `DEADLINE_EXCEEDED`;
//! `UNAVAILABLE` is what a refused connection, or a server not taking
//! calls, answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentmesh_core::CapabilityKind;
use agentmesh_core::execution::Collaboration;
use agentmesh_proto::json::{from_value, to_struct};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::agent_service_client::AgentServiceClient;
use agentmesh_telemetry::rpc::{TracedChannel, traced};
use async_trait::async_trait;
use tonic::Code;
use tonic::metadata::MetadataValue;
use url::Url;

use super::http::header;
use super::{AgentTransport, Call, Failure, Reply};
use crate::egress::Egress;

/// The gRPC transport; one channel per agent address, reused.
pub struct GrpcTransport {
    egress: Arc<Egress>,
    max_output_bytes: usize,
    tls: agentmesh_telemetry::rpc::ClientSettings,
    clients: Mutex<HashMap<String, AgentServiceClient<TracedChannel>>>,
}

impl GrpcTransport {
    /// A transport whose addresses pass the egress policy.
    /// Agents at `https://` addresses are called over TLS, trusting `tls`'s CA.
    pub fn new(egress: Arc<Egress>, max_output_bytes: usize, tls: agentmesh_telemetry::rpc::ClientSettings) -> Self {
        Self { egress, max_output_bytes, tls, clients: Mutex::new(HashMap::new()) }
    }

    fn client(&self, base: &Url) -> Result<AgentServiceClient<TracedChannel>, Failure> {
        let base_url = base.as_str();
        let mut clients = self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(client) = clients.get(base_url) {
            return Ok(client.clone());
        }
        // Each connection resolves the agent's name once, checks every
        // address, and connects to an address it checked: no second
        // resolution can lead elsewhere.
        let (egress, checked) = (self.egress.clone(), base.clone());
        let connector = tower::service_fn(move |_: http::Uri| {
            let (egress, checked) = (egress.clone(), checked.clone());
            async move {
                let addresses = egress
                    .resolve(&checked)
                    .await
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
                let mut last = std::io::Error::other("no address");
                for address in addresses {
                    match tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(address)).await {
                        Ok(Ok(stream)) => {
                            stream.set_nodelay(true)?;
                            return Ok(hyper_util::rt::TokioIo::new(stream));
                        }
                        Ok(Err(e)) => last = e,
                        Err(_) => last = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
                    }
                }
                Err(last)
            }
        });
        let mut endpoint = tonic::transport::Endpoint::from_shared(base_url.to_owned())
            .map_err(|e| Failure::fatal(format!("agent base_url `{base_url}` is not a gRPC address: {e}")))?;
        if base.scheme() == "https" {
            // TLS over the checked connection, verified against the name.
            agentmesh_telemetry::http::install_tls_provider();
            endpoint = endpoint
                .tls_config(self.tls.tls_config())
                .map_err(|e| Failure::fatal(format!("TLS to the agent at {base_url}: {e}")))?;
        }
        // Many steps to one agent at once go over several connections.
        let channel = agentmesh_telemetry::pool::Pool::new(base_url, || {
            endpoint.clone().connect_with_connector_lazy(connector.clone())
        });
        // An answer larger than the output limit is refused by the decoder.
        let client = AgentServiceClient::new(traced(channel)).max_decoding_message_size(self.max_output_bytes);
        clients.insert(base_url.to_owned(), client.clone());
        Ok(client)
    }
}

fn retryable(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded)
}

/// A status after which the call may have been carried out.
fn ambiguous(code: Code) -> bool {
    code == Code::DeadlineExceeded
}

#[async_trait]
impl AgentTransport for GrpcTransport {
    async fn invoke(&self, call: &Call<'_>) -> Result<Reply, Failure> {
        let base = Url::parse(&call.target.base_url)
            .map_err(|e| Failure::fatal(format!("agent base_url `{}` is not a URL: {e}", call.target.base_url)))?;
        self.egress.resolve(&base).await.map_err(|e| Failure::fatal(format!("refused to call {base}: {e}")))?;
        let mut client = self.client(&base)?;
        let kind = match call.target.kind {
            CapabilityKind::Reasoner => pb::CapabilityKind::Reasoner,
            CapabilityKind::Skill => pb::CapabilityKind::Skill,
        };
        let mut request = tonic::Request::new(pb::InvokeRequest {
            capability_id: call.target.capability.clone(),
            kind: kind as i32,
            parameters: to_struct(call.parameters),
            instruction: call.instruction.to_owned(),
            request_id: call.request_id.to_owned(),
            step_id: call.step_id.to_owned(),
            execution_id: call.execution_id.to_owned(),
            agent_id: call.target.agent_id.clone(),
        });
        request.set_timeout(call.timeout);
        for (name, value) in [
            (header::REQUEST_ID, call.request_id.to_owned()),
            (header::IDEMPOTENCY_KEY, call.idempotency_key()),
            (header::ATTEMPT, call.attempt.to_string()),
        ] {
            if let Ok(value) = MetadataValue::try_from(value.as_str()) {
                request.metadata_mut().insert(name, value);
            }
        }
        if let Some(credential) = call.credential
            && let Ok(key) = tonic::metadata::MetadataKey::from_bytes(credential.header.as_str().as_bytes())
            && let Ok(value) = MetadataValue::try_from(credential.value.as_bytes())
        {
            request.metadata_mut().insert(key, value);
        }
        // Without traces of its own, the executor passes on the context the
        // execution was started in (the traced channel adds nothing then).
        if !agentmesh_telemetry::exporting()
            && !call.traceparent.is_empty()
            && let Ok(value) = MetadataValue::try_from(call.traceparent)
        {
            request.metadata_mut().insert("traceparent", value);
        }
        let answer = match tokio::time::timeout(call.timeout, client.invoke(request)).await {
            Err(_) => {
                return Err(Failure::unanswered(format!(
                    "no answer from {} within {} ms",
                    call.target.base_url,
                    call.timeout.as_millis()
                )));
            }
            Ok(Err(status)) => {
                let retry = retryable(status.code());
                return Err(Failure {
                    message: format!("the agent answered gRPC {:?}: {}", status.code(), status.message()),
                    retryable: retry,
                    retry_after: None,
                    agent_fault: retry || matches!(status.code(), Code::Internal | Code::Unknown | Code::DataLoss),
                    ambiguous: retry && ambiguous(status.code()),
                });
            }
            Ok(Ok(answer)) => answer.into_inner(),
        };
        if !answer.error.is_empty() {
            return Err(Failure {
                message: format!("the agent reported an error: {}", answer.error),
                retryable: answer.retryable,
                retry_after: None,
                agent_fault: false,
                ambiguous: false,
            });
        }
        let output = answer.output.as_ref().map(from_value).unwrap_or(serde_json::Value::Null);
        let collaborate = answer.collaborate.filter(|c| !c.agent.is_empty()).map(|c| Collaboration {
            agent: c.agent,
            capability: c.capability,
            query: c.query,
        });
        Ok(Reply { output, collaborate })
    }
}
