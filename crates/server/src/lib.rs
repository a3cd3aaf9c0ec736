//! The runtime every agentmesh service is built on. A service hands it its
//! gRPC services and HTTP routes and gets one port serving both:
//!
//! - [`net::listen`] binds with a deep accept queue;
//! - [`grpc::router`] adds `grpc.health.v1` and reflection listing only what
//!   the port serves; [`grpc::not_found`] answers every other path;
//! - [`probes`] holds readiness that follows real dependencies, `/healthz`,
//!   `/readyz` and `/metrics`;
//! - [`stack::stack`] wraps it all in the shared tower stack (request ids,
//!   traces, deadlines, a concurrency cap, a body limit);
//! - [`serve`] runs it until shutdown, draining in-flight requests, every
//!   connection held to limits ([`conn`]);
//! - [`settings`] holds the settings every service shares, and
//!   [`Service`] assembles a service's port from all of the above.

pub mod auth;
pub mod conn;
pub mod grpc;
pub mod jwt;
pub mod net;
pub mod probes;
pub mod reload;
pub mod service;
pub mod settings;
pub mod stack;
pub mod tls;

pub use agentmesh_telemetry::redact;
pub use agentmesh_telemetry::secrets::redacted;
pub use auth::{Principal, principal_of};
pub use conn::{ConnectionLimits, serve};
pub use probes::{Check, Dependency, HealthChecker, Readiness};
pub use service::Service;
pub use settings::{ServiceSettings, check_min_secs, check_service_url, list_or_commas};
pub use stack::{
    Limits, RequestId, call_request_id, call_timeout, check_request_id, error_body, new_request_id, stack,
};
