//! The agentmesh discovery service: the agent registry over gRPC and REST on
//! one listening address, backed by PostgreSQL or SQLite.
//!
//! [`serve`] binds the configured address; [`serve_with_listener`] takes a
//! listener bound by the caller (tests bind `127.0.0.1:0`).

pub mod a2a;
pub mod cache;
pub mod convert;
pub mod encoded;
pub mod error;
pub mod grpc;
pub mod mcp;
pub mod metrics;
pub mod params;
pub mod registry;
pub mod render;
pub mod rest;
pub mod snapshot;
pub mod watch_catalog;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::HealthPolicy;
use agentmesh_proto::v1::discovery_service_server::DiscoveryServiceServer;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::ServingStatus;

pub use error::DiscoveryError;
pub use registry::Registry;

/// Fully qualified gRPC name of the discovery service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.DiscoveryService";

/// Configuration of the discovery service: the `[discovery]` table
/// (`Debug` shows `database_url` without its password).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", default)]
pub struct DiscoveryConfig {
    /// Where it listens, the registry's database, limits, health checks.
    #[serde(flatten, skip_deserializing)]
    pub service: ServiceSettings,
    /// Expected seconds between agent heartbeats; 3 missed → degraded, 6 → inactive.
    pub heartbeat_interval_secs: f64,
    /// Seconds a catalog snapshot is served before it is reloaded.
    pub cache_ttl_secs: f64,
    /// `WatchCatalog` streams open at once; more are refused with `RESOURCE_EXHAUSTED`.
    pub max_watch_streams: usize,
}

agentmesh_server::flat_settings!(DiscoveryConfig { service });

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            service: ServiceSettings { max_concurrent_requests: 10_000, ..ServiceSettings::on_port(7400) },
            heartbeat_interval_secs: 10.0,
            cache_ttl_secs: 30.0,
            max_watch_streams: 256,
        }
    }
}

impl DiscoveryConfig {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.service.validate()?;
        agentmesh_server::check_min_secs("heartbeat_interval_secs", self.heartbeat_interval_secs, 0.01)?;
        anyhow::ensure!(
            self.cache_ttl_secs.is_finite() && self.cache_ttl_secs >= 0.0,
            "cache_ttl_secs must be zero or more, got {}",
            self.cache_ttl_secs
        );
        anyhow::ensure!(self.max_watch_streams >= 1, "max_watch_streams must be at least 1");
        Ok(())
    }

    fn policy(&self) -> HealthPolicy {
        HealthPolicy { heartbeat_interval: Duration::from_secs_f64(self.heartbeat_interval_secs) }
    }
}

/// Binds `listen` and serves until `shutdown` resolves.
pub async fn serve(config: DiscoveryConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::service::bind("discovery", config.service.listen)?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: DiscoveryConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let store = agentmesh_store::connect(&config.service.database_url)
        .await
        .with_context(|| format!("opening the agent store at {}", redact(&config.service.database_url)))?;
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let registry = Arc::new(Registry::new(
        store.clone(),
        config.policy(),
        Duration::from_secs_f64(config.cache_ttl_secs),
        metrics,
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    registry.spawn_background(stop_rx.clone(), config.service.health_check_interval());
    let app = router(registry.clone(), &config, stop_rx).await?;
    let tls = config.service.server_tls("discovery")?;
    let over = if tls.is_some() { "gRPC and HTTP over TLS" } else { "gRPC and HTTP" };
    tracing::info!(addr = %listener.local_addr()?, backend = store.backend(), "discovery listening ({over})");
    let limits = config.service.connection_limits();
    agentmesh_server::serve(
        "discovery",
        listener,
        app,
        async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        },
        limits,
        tls,
    )
    .await?;
    tracing::info!("discovery stopped");
    Ok(())
}

/// The whole service: gRPC discovery (with its hand-framed
/// `ListCapabilities`), health and reflection beside the REST routes, in
/// the shared stack.
async fn router(
    registry: Arc<Registry>,
    config: &DiscoveryConfig,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<axum::Router> {
    let (health_reporter, health_service) = agentmesh_server::grpc::health();
    health_reporter.set_service_status(SERVICE_NAME, ServingStatus::Serving).await;
    tokio::spawn(mirror_store_health(registry.store_healthy(), health_reporter, stop));

    let discovery = Arc::new(grpc::DiscoveryGrpc::new(registry.clone(), config.max_watch_streams));
    let server =
        DiscoveryServiceServer::from_arc(discovery.clone()).max_decoding_message_size(config.service.max_request_bytes);
    let grpc = agentmesh_server::grpc::router(tonic::service::Routes::new(server), &[SERVICE_NAME], health_service)?
        .route_service(encoded::PATH, encoded::ListCapabilitiesRoute(discovery));
    let rest = rest::router(rest::RestState { registry, max_body_bytes: config.service.max_request_bytes });
    let auth = config
        .service
        .authenticator("discovery")
        .await?
        .map(|authenticator| agentmesh_server::stack::Auth { authenticator, rules: access });
    config.service.warn_if_open("discovery");
    Ok(agentmesh_server::stack(rest, grpc, &config.service.limits(), auth))
}

/// Which roles each call needs when authentication is on: only agents (for
/// their own id, checked by the handlers) and operators change the
/// registry; only services and operators read agent addresses as
/// registered (`WatchCatalog`; `GetAgent` redacts them for anyone else).
fn access(method: &http::Method, path: &str) -> agentmesh_server::auth::Access {
    use agentmesh_server::auth::{Access, Kind};
    const CHANGES: &[&str] = &[
        "/agentmesh.v1.DiscoveryService/RegisterAgent",
        "/agentmesh.v1.DiscoveryService/Heartbeat",
        "/agentmesh.v1.DiscoveryService/DeregisterAgent",
    ];
    if CHANGES.contains(&path) || (path.starts_with("/api/v1/agents") && *method != http::Method::GET) {
        return Access::Roles(&[Kind::Operator, Kind::Agent]);
    }
    if path == "/agentmesh.v1.DiscoveryService/WatchCatalog" {
        return Access::Roles(&[Kind::Operator, Kind::Service]);
    }
    Access::Authenticated
}

async fn mirror_store_health(
    mut healthy: watch::Receiver<bool>,
    reporter: tonic_health::server::HealthReporter,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let status = if *healthy.borrow_and_update() { ServingStatus::Serving } else { ServingStatus::NotServing };
        reporter.set_service_status(SERVICE_NAME, status).await;
        reporter.set_service_status("", status).await;
        tokio::select! {
            changed = healthy.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}

pub use agentmesh_server::ServiceSettings;
use agentmesh_server::redact;

#[cfg(test)]
mod tests {
    use super::DiscoveryConfig;

    #[test]
    fn debug_hides_the_database_password() {
        let mut config = DiscoveryConfig::default();
        config.service.database_url = "postgres://agentmesh:hunter2@db.internal/agentmesh?password=hunter3".into();
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter"), "{shown}");
        assert!(shown.contains("postgres://agentmesh:***@db.internal/agentmesh?password=***"), "{shown}");
        assert!(shown.contains("max_watch_streams: 256"), "{shown}");
    }
}
