//! A service's port, assembled in one place: its gRPC services with health
//! and reflection, its HTTP routes beside `/metrics`, `/healthz` and
//! `/readyz`, readiness that follows its dependencies, all in the shared
//! stack and served until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::probes::RenderMetrics;
use crate::{Dependency, HealthChecker, ServiceSettings};

/// Binds the address service `name` listens on, saying which service
/// could not bind it.
pub fn bind(name: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    crate::net::listen(addr).with_context(|| format!("binding {name} to {addr}"))
}

/// What a service puts on its port.
pub struct Service {
    name: &'static str,
    grpc_name: &'static str,
    grpc: tonic::service::Routes,
    grpc_layer: Box<dyn FnOnce(Router) -> Router + Send>,
    http: Router,
    metrics: RenderMetrics,
    dependencies: Vec<Dependency>,
    stop: Option<watch::Sender<bool>>,
    rules: crate::auth::Rules,
}

impl Service {
    /// Service `name` (`planner`), serving the gRPC service `grpc_name`
    /// (`agentmesh.v1.PlannerService`, reported by health and reflection)
    /// with `grpc`.
    pub fn new(name: &'static str, grpc_name: &'static str, grpc: tonic::service::Routes) -> Self {
        Self {
            name,
            grpc_name,
            grpc,
            grpc_layer: Box::new(|router| router),
            http: Router::new(),
            metrics: Arc::new(String::new),
            dependencies: Vec::new(),
            stop: None,
            rules: crate::auth::any_authenticated,
        }
    }

    /// The roles each call needs when authentication is on (every
    /// authenticated caller may make every call by default).
    pub fn authorize(mut self, rules: crate::auth::Rules) -> Self {
        self.rules = rules;
        self
    }

    /// HTTP routes served beside the probes.
    pub fn http(mut self, routes: Router) -> Self {
        self.http = routes;
        self
    }

    /// What `/metrics` shows.
    pub fn metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Arc::new(render);
        self
    }

    /// The dependencies readiness follows (or reports, when advisory).
    pub fn depends_on(mut self, dependencies: Vec<Dependency>) -> Self {
        self.dependencies = dependencies;
        self
    }

    /// Wraps the gRPC routes (health and reflection included), e.g. in a
    /// metrics middleware.
    pub fn layer_grpc(mut self, layer: impl FnOnce(Router) -> Router + Send + 'static) -> Self {
        self.grpc_layer = Box::new(layer);
        self
    }

    /// Signals `stop` with `true` when shutdown begins, for the service's
    /// own background work; the health checks stop with it.
    pub fn stop_with(mut self, stop: watch::Sender<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Serves on `listener` until `shutdown` resolves, then lets in-flight
    /// requests finish.
    pub async fn serve(
        self,
        settings: &ServiceSettings,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stop = self.stop.unwrap_or_else(|| watch::channel(false).0);
        let (reporter, health) = crate::grpc::health();
        let readiness =
            HealthChecker::every(self.grpc_name, settings.health_check_interval(), reporter, self.dependencies)
                .spawn(stop.subscribe())
                .await;
        let grpc = (self.grpc_layer)(crate::grpc::router(self.grpc, &[self.grpc_name], health)?);
        let http = crate::probes::router(self.metrics, readiness).merge(self.http);
        let auth = settings
            .authenticator(self.name)
            .await?
            .map(|authenticator| crate::stack::Auth { authenticator, rules: self.rules });
        settings.warn_if_open(self.name);
        let app = crate::stack(http, grpc, &settings.limits(), auth);
        let tls = settings.server_tls(self.name)?;
        let over = if tls.is_some() { "gRPC and HTTP over TLS" } else { "gRPC and HTTP" };
        tracing::info!(addr = %listener.local_addr()?, service = self.name, "{} listening ({over})", self.name);
        crate::serve(
            self.name,
            listener,
            app,
            async move {
                shutdown.await;
                let _ = stop.send(true);
            },
            settings.connection_limits(),
            tls,
        )
        .await
    }
}
