//! The gRPC side of a port: the service's own RPCs, `grpc.health.v1` and
//! reflection (v1 and v1alpha) listing only what the port serves, and an
//! answer for every path that is not served.

use axum::Router;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use crate::stack::{REQUEST_ID_HEADER, error_body, is_grpc, new_request_id};

/// The health service's name, listed by reflection.
const HEALTH: &str = "grpc.health.v1.Health";
/// The reflection services' names.
const REFLECTION: [&str; 2] = ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"];

/// A `grpc.health.v1` service and the handle that sets its statuses.
pub fn health() -> (HealthReporter, HealthServer<HealthService>) {
    let reporter = HealthReporter::new();
    let service = HealthService::from_health_reporter(reporter.clone());
    (reporter, HealthServer::new(service))
}

/// `routes` (the service's own gRPC services, named in `served`) with
/// health and reflection added, as a router. Reflection lists `served`,
/// health and reflection: a client never sees a service this port does not
/// answer.
pub fn router(
    routes: tonic::service::Routes,
    served: &[&str],
    health: HealthServer<HealthService>,
) -> anyhow::Result<Router> {
    let reflection = || {
        let mut builder = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(agentmesh_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
        for name in served.iter().copied().chain([HEALTH]).chain(REFLECTION) {
            builder = builder.with_service_name(name);
        }
        builder
    };
    Ok(routes
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .into_axum_router())
}

/// Unknown paths: `UNIMPLEMENTED` for gRPC clients, a JSON `404` otherwise.
pub async fn not_found(request: Request) -> Response {
    let path = request.uri().path().to_owned();
    if is_grpc(request.headers()) {
        return tonic::Status::unimplemented(format!(
            "this port does not serve {path}; is the address the right service's?"
        ))
        .into_http();
    }
    let request_id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map_or_else(new_request_id, str::to_owned);
    let body = error_body("not_found", &format!("no route {path}"), Some(json!({"path": path})), &request_id);
    (http::StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}
