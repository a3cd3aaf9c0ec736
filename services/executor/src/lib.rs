//! The agentmesh executor: runs validated plans as DAGs against the agents
//! discovery knows, stores every event before streaming it, and keeps each
//! execution owned by one replica through a lease in the database, so that
//! an execution survives a crash of its executor and moves to another
//! replica when its owner stops. See docs/executor.md and docs/agents.md.

pub mod breaker;
pub mod catalog;
pub mod convert;
pub mod credentials;
pub mod egress;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod service;
pub mod transport;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::execution::ExecutionOptions;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::discovery_service_server::SERVICE_NAME as DISCOVERY_SERVICE;
use agentmesh_proto::v1::executor_service_server::ExecutorServiceServer;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_server::Dependency;
use agentmesh_telemetry::http::RetryPolicy;
use agentmesh_telemetry::rpc::traced_with;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use error::ExecutorError;

pub use agentmesh_server::ServiceSettings;

/// Fully qualified gRPC name of the executor service (for health checks).
pub const SERVICE_NAME: &str = "agentmesh.v1.ExecutorService";

/// Configuration of the executor: the `[executor]` table (`Debug` shows
/// the URLs without their passwords).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", default)]
pub struct ExecutorConfig {
    /// Where it listens, where executions and their events are stored
    /// (replicas sharing a PostgreSQL database share the work), limits
    /// (`request_timeout_secs` bounds unary calls; streams run as long as
    /// their execution), health checks.
    #[serde(flatten, skip_deserializing)]
    pub service: ServiceSettings,
    /// Discovery's address: every agent address comes from there.
    pub discovery_url: String,
    /// The planner's address, for loop-back (collaboration requests); none:
    /// collaboration requests are rejected.
    pub planner_url: Option<String>,
    /// Steps of one execution running at once, unless the request says.
    pub max_concurrency: u32,
    /// Milliseconds one attempt of a step may take, unless the request says.
    pub step_timeout_ms: u64,
    /// Retries of a step after a retryable failure, unless the request says.
    pub max_retries: u32,
    /// Replans per execution, unless the request says.
    pub replan_budget: u32,
    /// Agent calls in flight at once, across every execution.
    pub max_concurrent_steps: usize,
    /// Executions this replica runs at once.
    pub max_concurrent_executions: usize,
    /// Most steps in a plan.
    pub max_steps_per_plan: usize,
    /// Largest agent answer accepted, in bytes; larger answers fail the step.
    pub max_output_bytes: usize,
    /// Milliseconds before the first retry (doubling each time, jittered).
    pub retry_base_ms: u64,
    /// Longest wait between attempts, `Retry-After` included, in milliseconds.
    pub retry_max_ms: u64,
    /// Consecutive failures that open an agent's circuit (0: never).
    pub circuit_failure_threshold: u32,
    /// Seconds an open circuit fails calls fast before one probe goes through.
    pub circuit_open_secs: f64,
    /// Seconds an execution's owner may go without renewing its lease
    /// before another replica takes the execution over.
    pub lease_secs: f64,
    /// Hours finished executions (and their events) are kept.
    pub retention_hours: u64,
    /// Networks agents may not be called in (CIDR): metadata services and
    /// link-local addresses by default.
    #[serde(deserialize_with = "agentmesh_server::list_or_commas")]
    pub egress_deny: Vec<String>,
    /// Networks allowed even when denied above.
    #[serde(deserialize_with = "agentmesh_server::list_or_commas")]
    pub egress_allow: Vec<String>,
    /// Also deny loopback and private networks (`egress::PRIVATE`), for a
    /// mesh whose agents are all public services.
    pub egress_deny_private: bool,
    /// The mesh's other services (`host:port`, such as the gateway and
    /// synthesis), never agent targets; the executor itself, discovery and
    /// the planner are always refused.
    #[serde(deserialize_with = "agentmesh_server::list_or_commas")]
    pub mesh_addresses: Vec<String>,
    /// PEM CA certificates trusted, besides the system's roots, for agents
    /// at `https://` addresses (HTTP and gRPC agents alike).
    pub agent_ca_file: Option<std::path::PathBuf>,
    /// Credentials presented to agents whose registration names one
    /// (`credentials` module: TOML, re-read when it changes); each is sent
    /// only to the agent ids its entry lists.
    pub agent_credentials_file: Option<std::path::PathBuf>,
}

agentmesh_server::flat_settings!(ExecutorConfig { service });

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            service: ServiceSettings {
                max_request_bytes: 8 * 1024 * 1024,
                max_concurrent_requests: 10_000,
                ..ServiceSettings::on_port(7402)
            },
            discovery_url: "http://127.0.0.1:7400".into(),
            planner_url: None,
            max_concurrency: 16,
            step_timeout_ms: 30_000,
            max_retries: 2,
            replan_budget: 3,
            max_concurrent_steps: 1024,
            max_concurrent_executions: 1000,
            max_steps_per_plan: 10_000,
            max_output_bytes: 1024 * 1024,
            retry_base_ms: 100,
            retry_max_ms: 30_000,
            circuit_failure_threshold: 5,
            circuit_open_secs: 10.0,
            lease_secs: 10.0,
            retention_hours: 24 * 7,
            egress_deny: egress::DEFAULT_DENY.iter().map(|s| (*s).to_owned()).collect(),
            egress_allow: Vec::new(),
            egress_deny_private: false,
            mesh_addresses: Vec::new(),
            agent_ca_file: None,
            agent_credentials_file: None,
        }
    }
}

impl ExecutorConfig {
    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.service.validate()?;
        agentmesh_server::check_service_url("discovery_url", &self.discovery_url)?;
        if let Some(planner) = &self.planner_url {
            agentmesh_server::check_service_url("planner_url", planner)?;
        }
        anyhow::ensure!(self.max_concurrency >= 1, "max_concurrency must be at least 1");
        anyhow::ensure!(self.step_timeout_ms >= 1, "step_timeout_ms must be at least 1");
        anyhow::ensure!(self.max_concurrent_steps >= 1, "max_concurrent_steps must be at least 1");
        anyhow::ensure!(self.max_concurrent_executions >= 1, "max_concurrent_executions must be at least 1");
        anyhow::ensure!(self.max_steps_per_plan >= 1, "max_steps_per_plan must be at least 1");
        anyhow::ensure!(
            self.replan_budget <= agentmesh_core::execution::MAX_REPLAN_BUDGET,
            "replan_budget must be at most {}",
            agentmesh_core::execution::MAX_REPLAN_BUDGET
        );
        anyhow::ensure!(
            self.max_concurrency <= agentmesh_core::execution::MAX_EXECUTION_CONCURRENCY,
            "max_concurrency must be at most {}",
            agentmesh_core::execution::MAX_EXECUTION_CONCURRENCY
        );
        anyhow::ensure!(self.max_output_bytes >= 1024, "max_output_bytes must be at least 1024");
        agentmesh_server::check_min_secs("circuit_open_secs", self.circuit_open_secs, 0.001)?;
        agentmesh_server::check_min_secs("lease_secs", self.lease_secs, 0.1)?;
        egress::Egress::new(&self.egress_deny, &self.egress_allow).map_err(|e| anyhow::anyhow!("egress: {e}"))?;
        Ok(())
    }

    /// The egress policy: the denied networks, and the mesh's own services
    /// (this executor at `own`, discovery, the planner and
    /// `mesh_addresses`), resolved now.
    async fn egress(&self, own: std::net::SocketAddr) -> anyhow::Result<egress::Egress> {
        let mut deny = self.egress_deny.clone();
        if self.egress_deny_private {
            deny.extend(egress::PRIVATE.iter().map(|s| (*s).to_owned()));
        }
        let mut mesh = vec![own];
        let urls = std::iter::once(self.discovery_url.clone()).chain(self.planner_url.clone());
        let mut places: Vec<(String, u16)> = urls
            .filter_map(|u| url::Url::parse(&u).ok())
            .filter_map(|u| Some((u.host_str()?.trim_matches(['[', ']']).to_owned(), u.port_or_known_default()?)))
            .collect();
        for address in &self.mesh_addresses {
            let (host, port) = address
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("mesh_addresses: `{address}` is not host:port"))?;
            places.push((host, port));
        }
        for (host, port) in &places {
            match tokio::net::lookup_host((host.as_str(), *port)).await {
                Ok(found) => mesh.extend(found),
                Err(e) => {
                    tracing::warn!(%host, port, error = %e, "a mesh address does not resolve now; guarded by name only")
                }
            }
        }
        Ok(egress::Egress::new(&deny, &self.egress_allow)
            .map_err(anyhow::Error::msg)?
            .with_mesh(mesh)
            .with_mesh_names(places))
    }

    fn settings(&self) -> engine::Settings {
        engine::Settings {
            defaults: ExecutionOptions {
                max_concurrency: self.max_concurrency,
                step_timeout_ms: self.step_timeout_ms,
                max_retries: self.max_retries,
                replan_budget: self.replan_budget,
            },
            max_steps: self.max_steps_per_plan,
            max_concurrent_executions: self.max_concurrent_executions,
            lease: Duration::from_secs_f64(self.lease_secs),
            backoff: RetryPolicy {
                // Each execution says how many; see ExecutionOptions.
                max_retries: self.max_retries,
                base_delay: Duration::from_millis(self.retry_base_ms.max(1)),
                max_delay: Duration::from_millis(self.retry_max_ms.max(1)),
            },
            retention: Duration::from_secs(self.retention_hours.saturating_mul(3600)),
        }
    }
}

/// Binds `listen` and serves until `shutdown` resolves.
pub async fn serve(config: ExecutorConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = agentmesh_server::service::bind("the executor", config.service.listen)?;
    serve_with_listener(config, listener, shutdown).await
}

/// Serves on an already bound listener until `shutdown` resolves.
pub async fn serve_with_listener(
    config: ExecutorConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let store = agentmesh_store::connect_executions(&config.service.database_url).await.with_context(|| {
        format!("opening the execution store at {}", agentmesh_server::redact(&config.service.database_url))
    })?;
    let client_settings = config.service.client_settings()?;
    let discovery_channel = agentmesh_telemetry::rpc::channel("discovery", &config.discovery_url, &client_settings)?;
    let catalog = Arc::new(catalog::Catalog::new(DiscoveryServiceClient::new(traced_with(
        discovery_channel.clone(),
        &client_settings,
    ))));
    let planner = match &config.planner_url {
        Some(url) => Some(PlannerServiceClient::new(traced_with(
            agentmesh_telemetry::rpc::channel("planner", url, &client_settings)?,
            &client_settings,
        ))),
        None => None,
    };
    let egress = Arc::new(config.egress(listener.local_addr()?).await?);
    let metrics = Arc::new(metrics::Metrics::new().context("registering metrics")?);
    let (stop_tx, stop_rx) = watch::channel(false);
    let owner = format!("executor-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
    let agent_ca = match &config.agent_ca_file {
        Some(path) => {
            Some(std::fs::read(path).with_context(|| format!("agent_ca_file: cannot read {}", path.display()))?)
        }
        None => None,
    };
    let engine = engine::Engine::new(engine::Parts {
        settings: config.settings(),
        owner: owner.clone(),
        store: store.clone(),
        catalog: catalog.clone(),
        http: transport::http::HttpTransport::new(egress.clone(), config.max_output_bytes, agent_ca.as_deref())?,
        grpc: transport::grpc::GrpcTransport::new(
            egress,
            config.max_output_bytes,
            agentmesh_telemetry::rpc::ClientSettings { ca_pem: agent_ca, identity: None, bearer: None },
        ),
        credentials: match &config.agent_credentials_file {
            Some(path) => credentials::AgentCredentials::watch(path.clone())?,
            None => credentials::AgentCredentials::default(),
        },
        breakers: breaker::Breakers::new(
            config.circuit_failure_threshold,
            Duration::from_secs_f64(config.circuit_open_secs),
        ),
        planner,
        metrics: metrics.clone(),
        max_concurrent_steps: config.max_concurrent_steps,
        stop: stop_rx.clone(),
    });
    catalog.spawn_watch(stop_rx.clone());
    let leases = engine::ownership::spawn(&engine, stop_rx.clone());

    let service = service::ExecutorGrpc { engine, max_steps: config.max_steps_per_plan };
    let server = ExecutorServiceServer::new(service).max_decoding_message_size(config.service.max_request_bytes);
    tracing::info!(backend = store.backend(), replica = %owner, "executor replica {owner} on {}", store.backend());
    agentmesh_server::Service::new("executor", SERVICE_NAME, tonic::service::Routes::new(server))
        .authorize(agentmesh_server::auth::mesh_callers)
        .metrics(move || metrics.render())
        .depends_on(vec![
            Dependency::store(store, |store| async move { store.ping().await }),
            Dependency::grpc("discovery", DISCOVERY_SERVICE, discovery_channel),
        ])
        .stop_with(stop_tx)
        .serve(&config.service, listener, shutdown)
        .await?;
    // Let the lease keeper store what is queued and hand the executions on.
    if tokio::time::timeout(Duration::from_secs(10), leases).await.is_err() {
        tracing::warn!("executions were not handed on within 10 s; their leases expire on their own");
    }
    tracing::info!("executor stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ExecutorConfig;

    #[test]
    fn debug_hides_passwords_in_urls() {
        let config = ExecutorConfig {
            planner_url: Some("http://planner:hunter3@planner.internal:7401".into()),
            ..ExecutorConfig::with_database_url("postgres://executor:hunter2@db.internal/agentmesh")
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter"), "{shown}");
        assert!(shown.contains("postgres://executor:***@db.internal/agentmesh"), "{shown}");
        assert!(shown.contains("max_concurrent_requests: 10000"), "{shown}");
    }
}
