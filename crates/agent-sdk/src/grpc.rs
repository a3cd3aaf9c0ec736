//! The gRPC transport: `agentmesh.v1.AgentService/Invoke`.

use std::future::Future;
use std::sync::Arc;

use agentmesh_proto::json;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use tonic::{Request, Response, Status};

use crate::Server;
use crate::capability::{Call, Kind, Outcome};

/// Serves `AgentService` on `listener` until `shutdown`.
pub(crate) async fn serve(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let result = tonic::transport::Server::builder()
        .add_service(AgentServiceServer::new(Grpc(server)))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "the agent's gRPC server stopped");
    }
}

struct Grpc(Arc<Server>);

fn metadata(request: &Request<pb::InvokeRequest>, name: &str) -> String {
    request.metadata().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

#[tonic::async_trait]
impl AgentService for Grpc {
    async fn invoke(&self, request: Request<pb::InvokeRequest>) -> Result<Response<pb::InvokeResponse>, Status> {
        if !self.0.admits(request.metadata().get("authorization").map(|v| v.as_bytes())) {
            return Err(Status::unauthenticated(format!("agent {} needs its credential", self.0.agent_id)));
        }
        let parent = agentmesh_telemetry::propagation::extract(&request.metadata().clone().into_headers());
        let idempotency_key = metadata(&request, "idempotency-key");
        let attempt = metadata(&request, "x-agentmesh-attempt").parse().unwrap_or(1);
        let header_request_id = metadata(&request, "x-request-id");
        let traceparent = metadata(&request, "traceparent");
        let invoke = request.into_inner();
        let kind = if invoke.kind == pb::CapabilityKind::Reasoner as i32 { Kind::Reasoner } else { Kind::Skill };
        let call = Call {
            request_id: if invoke.request_id.is_empty() { header_request_id } else { invoke.request_id.clone() },
            execution_id: invoke.execution_id.clone(),
            step_id: invoke.step_id.clone(),
            instruction: invoke.instruction.clone(),
            idempotency_key,
            attempt,
            traceparent,
            ..Call::default()
        };
        let parameters = invoke.parameters.as_ref().map_or_else(|| serde_json::json!({}), json::from_struct);
        let outcome = self.0.call(kind, &invoke.capability_id, call, parameters, parent).await.ok_or_else(|| {
            Status::not_found(format!("agent {} has no capability `{}`", self.0.agent_id, invoke.capability_id))
        })?;
        Ok(Response::new(match outcome {
            Outcome::Done { output, collaborate } => pb::InvokeResponse {
                output: Some(json::to_value(&output)),
                collaborate: collaborate.map(|c| pb::CollaborationRequest {
                    agent: c.agent,
                    capability: c.capability,
                    query: c.query,
                }),
                ..Default::default()
            },
            Outcome::BadInput(message) => return Err(Status::invalid_argument(message)),
            Outcome::Failed(e) => pb::InvokeResponse { error: e.message, retryable: e.retryable, ..Default::default() },
        }))
    }
}
