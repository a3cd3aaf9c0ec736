//! Agents registered with transport `mcp`: their capabilities are the MCP
//! server's tools. Discovery lists them when the agent registers, again at
//! every heartbeat interval and as soon as the server says its list
//! changed. A listing that answers counts as the agent's heartbeat, so a
//! server that stops answering goes stale, then inactive, like any agent;
//! a tool that disappears leaves the catalog like a removed capability.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::{AgentDefinition, Capability, Transport};
use agentmesh_mcp::Session;
use tokio::sync::{Mutex, mpsc};

/// How long one listing may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

struct Open {
    base_url: String,
    session: Arc<Session>,
    /// Forwards the session's list-changed notices, tagged with the agent.
    forwarding: tokio::task::JoinHandle<()>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.forwarding.abort();
    }
}

/// The sessions with the MCP agents' servers.
pub struct Importer {
    sessions: Mutex<HashMap<String, Open>>,
    changed: mpsc::Sender<String>,
}

impl Importer {
    /// An importer, and the ids of agents whose server said its tools
    /// changed.
    pub fn new() -> (Self, mpsc::Receiver<String>) {
        let (changed, receiver) = mpsc::channel(64);
        (Self { sessions: Mutex::new(HashMap::new()), changed }, receiver)
    }

    /// The server's tools as skills, logging the tools left out.
    pub async fn skills(&self, definition: &AgentDefinition) -> Result<Vec<Capability>, String> {
        debug_assert_eq!(definition.transport, Transport::Mcp);
        let session = self.session(&definition.id, &definition.base_url).await?;
        let tools = match session.tools(LIST_TIMEOUT).await {
            Ok(tools) => tools,
            Err(e) => {
                self.forget(&definition.id).await;
                return Err(e.to_string());
            }
        };
        let imported = agentmesh_mcp::tools::import(&tools);
        for (tool, why) in &imported.skipped {
            tracing::warn!(agent_id = %definition.id, tool, why, "an MCP tool was left out of the catalog");
        }
        Ok(imported.skills)
    }

    async fn session(&self, agent_id: &str, base_url: &str) -> Result<Arc<Session>, String> {
        {
            let sessions = self.sessions.lock().await;
            if let Some(open) = sessions.get(agent_id)
                && open.base_url == base_url
                && !open.session.is_closed()
            {
                return Ok(open.session.clone());
            }
        }
        let (notices, mut received) = mpsc::channel(1);
        let options = agentmesh_mcp::client::Options { list_changed: Some(notices), ..Default::default() };
        let session = Arc::new(Session::connect(base_url, options).await.map_err(|e| e.to_string())?);
        let changed = self.changed.clone();
        let id = agent_id.to_owned();
        let forwarding = tokio::spawn(async move {
            while received.recv().await.is_some() {
                if changed.send(id.clone()).await.is_err() {
                    return;
                }
            }
        });
        self.sessions
            .lock()
            .await
            .insert(agent_id.to_owned(), Open { base_url: base_url.to_owned(), session: session.clone(), forwarding });
        Ok(session)
    }

    /// Closes the session with an agent's server (it failed, or the agent
    /// is gone).
    pub async fn forget(&self, agent_id: &str) {
        self.sessions.lock().await.remove(agent_id);
    }

    /// Closes the sessions of agents no longer registered.
    pub async fn retain(&self, registered: &[String]) {
        self.sessions.lock().await.retain(|id, _| registered.contains(id));
    }
}
