//! Agents registered with transport `a2a`: their capabilities are the
//! skills of their Agent Card (`{base_url}/.well-known/agent-card.json`).
//! Discovery reads the card when the agent registers and again at every
//! heartbeat interval: a card that answers counts as the agent's
//! heartbeat, and a skill that disappears leaves the catalog like a
//! removed capability.

use std::time::Duration;

use agentmesh_core::{AgentDefinition, Capability, Transport};

/// How long reading one card may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads A2A agents' cards.
pub struct CardReader {
    http: reqwest::Client,
}

impl Default for CardReader {
    fn default() -> Self {
        // No redirects: a card is read where the registration says.
        let http = agentmesh_telemetry::http::client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self { http }
    }
}

impl CardReader {
    /// The card's skills as capabilities, logging the skills left out.
    pub async fn skills(&self, definition: &AgentDefinition) -> Result<Vec<Capability>, String> {
        debug_assert_eq!(definition.transport, Transport::A2a);
        let card = agentmesh_a2a::card::fetch(&self.http, &definition.base_url, READ_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        let imported = agentmesh_a2a::card::import(&card);
        for (skill, why) in &imported.skipped {
            tracing::warn!(agent_id = %definition.id, skill, why, "an A2A skill was left out of the catalog");
        }
        Ok(imported.skills)
    }
}
