//! The executor's view of the registry: kept current by discovery's
//! `WatchCatalog` stream, asked directly (`GetAgent`) for an agent it does
//! not hold. Every step is dispatched to the address found here at that
//! moment, so an agent that moved, or left, since planning is seen.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use agentmesh_core::schema::Schema;
use agentmesh_core::{CapabilityKind, Hints, Transport};
use agentmesh_proto::json::from_struct;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use tokio::sync::watch;
use tokio_stream::StreamExt;

use crate::transport::Target;

/// One capability of an agent.
#[derive(Debug, Clone, PartialEq)]
pub struct CapabilityEntry {
    /// Reasoner or skill.
    pub kind: CapabilityKind,
    /// HTTP path.
    pub endpoint: String,
    /// Callable over HTTP but never planned for.
    pub internal: bool,
    /// What its output must fit, compiled once per version of the agent.
    pub output_schema: Option<Schema>,
    /// What its parameters must fit, compiled likewise.
    pub input_schema: Option<Schema>,
    /// What calling it does to the world, if declared.
    pub hints: Option<Hints>,
}

/// One agent as discovery describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentEntry {
    /// Agent id.
    pub id: String,
    /// Base URL.
    pub base_url: String,
    /// HTTP, gRPC or MCP.
    pub transport: Transport,
    /// The credential it is called with, by name.
    pub credential: Option<String>,
    /// Capabilities by id.
    pub capabilities: HashMap<String, CapabilityEntry>,
}

impl AgentEntry {
    fn from_pb(agent: &pb::Agent) -> Self {
        let mut capabilities = HashMap::new();
        for (list, kind) in [(&agent.reasoners, CapabilityKind::Reasoner), (&agent.skills, CapabilityKind::Skill)] {
            for c in list {
                let endpoint = if c.endpoint.is_empty() {
                    match kind {
                        CapabilityKind::Reasoner => format!("/reasoners/{}", c.id),
                        CapabilityKind::Skill => format!("/skills/{}", c.id),
                    }
                } else {
                    c.endpoint.clone()
                };
                let entry = CapabilityEntry {
                    kind,
                    endpoint,
                    internal: c.internal,
                    output_schema: c.output_schema.as_ref().map(|s| Schema::compile(&from_struct(s))),
                    input_schema: c.input_schema.as_ref().map(|s| Schema::compile(&from_struct(s))),
                    hints: c.hints.as_ref().map(agentmesh_proto::convert::hints_from_pb),
                };
                capabilities.insert(c.id.clone(), entry);
            }
        }
        let transport = agentmesh_proto::convert::transport_from_pb(agent.transport);
        Self {
            id: agent.id.clone(),
            base_url: agent.base_url.clone(),
            transport,
            credential: (!agent.credential.is_empty()).then(|| agent.credential.clone()),
            capabilities,
        }
    }
}

/// Why a step's target cannot be called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupError {
    /// Not registered (anymore).
    UnknownAgent(String),
    /// Discovery could not be asked; trying again may work.
    Unavailable(String),
}

/// The registry as the executor sees it.
pub struct Catalog {
    agents: RwLock<HashMap<String, Arc<AgentEntry>>>,
    discovery: DiscoveryServiceClient<TracedChannel>,
    synced: watch::Sender<bool>,
}

impl Catalog {
    /// A catalog fed by `discovery`.
    pub fn new(discovery: DiscoveryServiceClient<TracedChannel>) -> Self {
        Self { agents: RwLock::new(HashMap::new()), discovery, synced: watch::channel(false).0 }
    }

    /// Whether the watch stream is connected.
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<AgentEntry>>> {
        self.agents.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Follows discovery's changes until `stop` changes, reconnecting after
    /// a lost stream (starting from a fresh snapshot, so that removals made
    /// while disconnected are not missed).
    pub fn spawn_watch(self: &Arc<Self>, mut stop: watch::Receiver<bool>) {
        let catalog = self.clone();
        tokio::spawn(async move {
            loop {
                let mut client = catalog.discovery.clone();
                let opened = tokio::select! {
                    opened = client.watch_catalog(pb::WatchCatalogRequest { include_snapshot: true }) => opened,
                    _ = stop.changed() => return,
                };
                match opened {
                    Ok(stream) => {
                        catalog.write().clear();
                        catalog.synced.send_replace(true);
                        tracing::info!(operation = "watch_catalog", "following discovery's catalog");
                        let mut stream = stream.into_inner();
                        loop {
                            let next = tokio::select! {
                                next = stream.next() => next,
                                _ = stop.changed() => return,
                            };
                            match next {
                                Some(Ok(change)) => catalog.apply(&change),
                                Some(Err(status)) => {
                                    tracing::warn!(operation = "watch_catalog", error = %status.message(), "catalog stream failed; reconnecting");
                                    break;
                                }
                                None => break,
                            }
                        }
                        catalog.synced.send_replace(false);
                    }
                    Err(status) => {
                        tracing::debug!(operation = "watch_catalog", error = %status.message(), "discovery unreachable; retrying");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => return,
                }
            }
        });
    }

    fn apply(&self, change: &pb::WatchCatalogResponse) {
        let deregistered = change.kind == pb::CatalogEventKind::Deregistered as i32;
        let mut agents = self.write();
        match (&change.agent, deregistered) {
            (_, true) => {
                agents.remove(&change.agent_id);
            }
            (Some(agent), false) => {
                agents.insert(agent.id.clone(), Arc::new(AgentEntry::from_pb(agent)));
            }
            (None, false) => {}
        }
    }

    /// The agent as discovery holds it now (asked within [`LOOKUP_TIMEOUT`]
    /// when the catalog stream has not brought it).
    pub async fn agent(&self, agent_id: &str) -> Result<Arc<AgentEntry>, LookupError> {
        if let Some(entry) = self.agents.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(agent_id) {
            return Ok(entry.clone());
        }
        let mut client = self.discovery.clone();
        let mut request = tonic::Request::new(pb::GetAgentRequest { agent_id: agent_id.to_owned() });
        request.set_timeout(LOOKUP_TIMEOUT);
        match client.get_agent(request).await {
            Ok(answer) => match answer.into_inner().agent {
                Some(agent) => {
                    let entry = Arc::new(AgentEntry::from_pb(&agent));
                    self.write().insert(agent_id.to_owned(), entry.clone());
                    Ok(entry)
                }
                None => Err(LookupError::UnknownAgent(agent_id.to_owned())),
            },
            Err(status) if status.code() == tonic::Code::NotFound => {
                Err(LookupError::UnknownAgent(agent_id.to_owned()))
            }
            Err(status) => Err(LookupError::Unavailable(status.message().to_owned())),
        }
    }
}

/// Longest wait for discovery's answer about one agent: a step waits on it.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The target of a step, or why it may not be called: the agent must be
/// registered, not the caller itself, and offer the capability, which must
/// not be internal.
pub fn target_of(agent: &AgentEntry, capability: &str, callers: &[String]) -> Result<Target, String> {
    if callers.iter().any(|c| c == &agent.id) {
        return Err(format!("agent `{}` is the calling orchestrator itself and is never called", agent.id));
    }
    let Some(entry) = agent.capabilities.get(capability) else {
        let mut offered: Vec<&str> = agent.capabilities.keys().map(String::as_str).collect();
        offered.sort_unstable();
        return Err(format!(
            "agent `{}` has no capability `{capability}` (it offers: {})",
            agent.id,
            if offered.is_empty() { "nothing".to_owned() } else { offered.join(", ") }
        ));
    };
    if entry.internal {
        return Err(format!("capability `{}:{capability}` is internal and cannot be planned for", agent.id));
    }
    Ok(Target {
        agent_id: agent.id.clone(),
        base_url: agent.base_url.clone(),
        transport: agent.transport,
        credential: agent.credential.clone(),
        capability: capability.to_owned(),
        kind: entry.kind,
        endpoint: entry.endpoint.clone(),
        output_schema: entry.output_schema.clone(),
        hints: entry.hints,
    })
}
