//! What a service that reasons over the catalog with a model starts with:
//! the model (a provider chain), the interaction log every call of it is
//! kept in, and discovery; and its readiness, which follows discovery and
//! the store and reports the model without following it.

use std::sync::Arc;

use agentmesh_llm::{LlmProvider, LlmSettings, PROBE_INTERVAL};
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::discovery_service_server::SERVICE_NAME as DISCOVERY_SERVICE;
use agentmesh_server::{Dependency, ServiceSettings};
use agentmesh_store::{InteractionLog, Retention};
use agentmesh_telemetry::rpc::TracedChannel;
use anyhow::Context;
use tokio::task::JoinHandle;

/// The model, the interaction log and discovery of a reasoning service.
pub struct Reasoning {
    /// The provider chain the LLM settings name.
    pub llm: Arc<dyn LlmProvider>,
    /// Where every LLM call is kept.
    pub log: Arc<dyn InteractionLog>,
    /// How long they are kept.
    pub retention: Retention,
    /// Discovery, for the catalog.
    pub discovery: DiscoveryServiceClient<TracedChannel>,
    discovery_channel: agentmesh_telemetry::pool::Pool,
    purge: JoinHandle<()>,
}

impl Drop for Reasoning {
    fn drop(&mut self) {
        self.purge.abort();
    }
}

impl Reasoning {
    /// Builds the provider chain, opens the interaction log in the
    /// service's database (deleting expired calls in the background while
    /// this lives) and a channel to discovery (connected on first use).
    pub async fn open(service: &ServiceSettings, llm: &LlmSettings, discovery_url: &str) -> anyhow::Result<Self> {
        let chain = Arc::new(llm.build()?);
        let log = agentmesh_store::connect_interaction_log(&service.database_url)
            .await
            .context("opening the interaction log")?;
        let client = service.client_settings()?;
        let discovery_channel = agentmesh_telemetry::rpc::channel("discovery", discovery_url, &client)?;
        tracing::info!(llm = %llm.llm, "the model is {}", llm.llm);
        Ok(Self {
            llm: chain,
            purge: agentmesh_store::spawn_interaction_purge(log.clone()),
            log,
            retention: Retention::from(llm.retention()),
            discovery: DiscoveryServiceClient::new(agentmesh_telemetry::rpc::traced_with(
                discovery_channel.clone(),
                &client,
            )),
            discovery_channel,
        })
    }

    /// Readiness: discovery and the store are required; the model is
    /// reported, never required (see docs/observability.md#readiness), and
    /// probed at most every [`PROBE_INTERVAL`].
    pub fn dependencies(&self) -> Vec<Dependency> {
        vec![
            Dependency::grpc("discovery", DISCOVERY_SERVICE, self.discovery_channel.clone()),
            Dependency::store(self.log.clone(), |log| async move { log.ping().await }),
            Dependency::of("llm", self.llm.clone(), |llm| async move { llm.probe().await })
                .advisory()
                .at_most_every(PROBE_INTERVAL),
        ]
    }
}
