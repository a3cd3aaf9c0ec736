//! The agentmesh discovery service: the agent registry over gRPC and REST on
//! one listening address, backed by PostgreSQL or SQLite.
//!
//! [`serve`] binds the configured address; [`serve_with_listener`] takes a
//! listener bound by the caller (tests bind `127.0.0.1:0`).

pub mod cache;
pub mod convert;
pub mod encoded;
pub mod error;
pub mod grpc;
pub mod metrics;
pub mod params;
pub mod registry;
pub mod render;
pub mod rest;
pub mod snapshot;
pub mod watch_catalog;

use std::future::Future;
use std::net::SocketAddr;
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

/// Configuration of the discovery service. `Debug` shows `database_url`
/// without its password.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Address serving gRPC and HTTP.
    pub listen: SocketAddr,
    /// `sqlite://PATH`, `sqlite::memory:` or `postgres://…`.
    pub database_url: String,
    /// Expected seconds between agent heartbeats; 3 missed → degraded, 6 → inactive.
    pub heartbeat_interval_secs: f64,
    /// Seconds a catalog snapshot is served before it is reloaded.
    pub cache_ttl_secs: f64,
    /// Largest accepted request body (REST or gRPC), in bytes.
    pub max_request_bytes: usize,
    /// Seconds a request may take to be answered (a shorter `grpc-timeout` wins).
    pub request_timeout_secs: f64,
    /// Requests handled at once; more wait for a slot.
    pub max_concurrent_requests: usize,
    /// `WatchCatalog` streams open at once; more are refused with `RESOURCE_EXHAUSTED`.
    pub max_watch_streams: usize,
}

impl std::fmt::Debug for DiscoveryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured so that a new field cannot be left out unnoticed.
        let Self {
            listen,
            database_url,
            heartbeat_interval_secs,
            cache_ttl_secs,
            max_request_bytes,
            request_timeout_secs,
            max_concurrent_requests,
            max_watch_streams,
        } = self;
        f.debug_struct("DiscoveryConfig")
            .field("listen", listen)
            .field("database_url", &redact(database_url))
            .field("heartbeat_interval_secs", heartbeat_interval_secs)
            .field("cache_ttl_secs", cache_ttl_secs)
            .field("max_request_bytes", max_request_bytes)
            .field("request_timeout_secs", request_timeout_secs)
            .field("max_concurrent_requests", max_concurrent_requests)
            .field("max_watch_streams", max_watch_streams)
            .finish()
    }
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            database_url: "sqlite://.agentmesh/agentmesh.db".to_owned(),
            heartbeat_interval_secs: 10.0,
            cache_ttl_secs: 30.0,
            max_request_bytes: 1024 * 1024,
            request_timeout_secs: 30.0,
            max_concurrent_requests: 10_000,
            max_watch_streams: 256,
        }
    }
}

impl DiscoveryConfig {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.heartbeat_interval_secs.is_finite() && self.heartbeat_interval_secs >= 0.01,
            "heartbeat_interval_secs must be at least 0.01, got {}",
            self.heartbeat_interval_secs
        );
        anyhow::ensure!(
            self.cache_ttl_secs.is_finite() && self.cache_ttl_secs >= 0.0,
            "cache_ttl_secs must be zero or more, got {}",
            self.cache_ttl_secs
        );
        agentmesh_server::check_limits(
            self.request_timeout_secs,
            self.max_concurrent_requests,
            self.max_request_bytes,
        )?;
        anyhow::ensure!(self.max_watch_streams >= 1, "max_watch_streams must be at least 1");
        anyhow::ensure!(
            self.database_url.starts_with("sqlite:") || self.database_url.starts_with("postgres"),
            "database_url must start with sqlite: or postgres://, got `{}`",
            redact(&self.database_url)
        );
        Ok(())
    }

    /// The limits of the shared server stack.
    pub fn limits(&self) -> agentmesh_server::Limits {
        agentmesh_server::Limits {
            request_timeout: Duration::from_secs_f64(self.request_timeout_secs),
            max_concurrent_requests: self.max_concurrent_requests,
            max_request_bytes: self.max_request_bytes,
        }
    }

    fn policy(&self) -> HealthPolicy {
        HealthPolicy { heartbeat_interval: Duration::from_secs_f64(self.heartbeat_interval_secs) }
    }
}

/// Binds `config.listen` and serves until `shutdown` resolves.
pub async fn serve(config: DiscoveryConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::net::listen(config.listen)
        .with_context(|| format!("binding discovery to {}", config.listen))?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: DiscoveryConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let store = agentmesh_store::connect(&config.database_url)
        .await
        .with_context(|| format!("opening the agent store at {}", redact(&config.database_url)))?;
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let registry = Arc::new(Registry::new(
        store.clone(),
        config.policy(),
        Duration::from_secs_f64(config.cache_ttl_secs),
        metrics,
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    registry.spawn_background(stop_rx.clone());
    let app = router(registry.clone(), &config, stop_rx).await?;
    tracing::info!(addr = %listener.local_addr()?, backend = store.backend(), "discovery listening (gRPC and HTTP)");
    agentmesh_server::serve("discovery", listener, app, async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    })
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
        DiscoveryServiceServer::from_arc(discovery.clone()).max_decoding_message_size(config.max_request_bytes);
    let grpc = agentmesh_server::grpc::router(tonic::service::Routes::new(server), &[SERVICE_NAME], health_service)?
        .route_service(encoded::PATH, encoded::ListCapabilitiesRoute(discovery));
    let rest = rest::router(rest::RestState { registry, max_body_bytes: config.max_request_bytes });
    Ok(agentmesh_server::stack(rest, grpc, &config.limits()))
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

pub use agentmesh_server::redact;

#[cfg(test)]
mod tests {
    use super::DiscoveryConfig;

    #[test]
    fn debug_hides_the_database_password() {
        let config = DiscoveryConfig {
            database_url: "postgres://agentmesh:hunter2@db.internal/agentmesh?password=hunter3".into(),
            ..DiscoveryConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter"), "{shown}");
        assert!(shown.contains("postgres://agentmesh:***@db.internal/agentmesh?password=***"), "{shown}");
        assert!(shown.contains("max_watch_streams: 256"), "{shown}");
    }
}
