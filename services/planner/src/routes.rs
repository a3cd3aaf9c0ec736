//! The layer that counts and times planner RPCs for `/metrics`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tonic::Code;

use crate::SERVICE_NAME;
use crate::metrics::Metrics;

/// The planner's RPCs, by their gRPC method name; anything else is `other`
/// so that unknown paths cannot grow the label set.
fn rpc_label(path: &str) -> Option<&'static str> {
    let method = path.strip_prefix('/')?.strip_prefix(SERVICE_NAME)?.strip_prefix('/')?;
    Some(match method {
        "CreatePlan" => "CreatePlan",
        "Replan" => "Replan",
        "ListInteractions" => "ListInteractions",
        _ => "other",
    })
}

/// Counts and times planner RPCs by method and gRPC status. Every planner
/// RPC is unary and tonic answers errors "trailers-only", so the status is
/// in the response headers; a response without one succeeded.
pub async fn observe_rpc(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let Some(rpc) = rpc_label(request.uri().path()) else {
        return next.run(request).await;
    };
    let started = Instant::now();
    let response = next.run(request).await;
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(Code::Ok, Code::from_i32);
    metrics.request_duration.with_label_values(&[rpc]).observe(started.elapsed().as_secs_f64());
    metrics.requests.with_label_values(&[rpc, agentmesh_telemetry::rpc::code_name(code)]).inc();
    response
}

#[cfg(test)]
mod tests {
    use super::rpc_label;

    #[test]
    fn only_planner_methods_are_labelled() {
        assert_eq!(rpc_label("/agentmesh.v1.PlannerService/CreatePlan"), Some("CreatePlan"));
        assert_eq!(rpc_label("/agentmesh.v1.PlannerService/Nope"), Some("other"));
        assert_eq!(rpc_label("/grpc.health.v1.Health/Check"), None);
        assert_eq!(rpc_label("/metrics"), None);
    }
}
