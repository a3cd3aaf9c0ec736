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
//! - [`serve`] runs it until shutdown, draining in-flight requests;
//! - [`settings`] holds the settings every service shares, and
//!   [`Service`] assembles a service's port from all of the above.

pub mod grpc;
pub mod net;
pub mod probes;
pub mod service;
pub mod settings;
pub mod stack;

use std::future::Future;

use anyhow::Context;
use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;

pub use agentmesh_telemetry::redact;
pub use probes::{Check, Dependency, HealthChecker, Readiness};
pub use service::Service;
pub use settings::{ServiceSettings, check_min_secs, check_service_url, list_or_commas};
pub use stack::{Limits, RequestId, call_request_id, call_timeout, error_body, new_request_id, stack};

/// Serves `app` on `listener` until `shutdown` resolves, then lets
/// in-flight requests finish.
pub async fn serve(
    name: &str,
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Small answers go out at once instead of waiting on Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await.with_context(|| format!("serving {name}"))
}
