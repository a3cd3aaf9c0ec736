//! The catalog a request may plan over, from discovery: never the calling
//! orchestrator's own agents, never internal capabilities, healthy agents
//! only unless asked, narrowed further by allow patterns.

use agentmesh_core::plan::AllowedCapability;
use agentmesh_core::{CapabilityKind, Pattern};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;

/// An allow pattern `agent-pattern:capability-pattern` (`weather-*:*`,
/// `*:skill:web_*`).
#[derive(Debug, Clone)]
pub struct AllowPattern {
    agent: Pattern,
    kind: Option<CapabilityKind>,
    capability: Pattern,
}

impl AllowPattern {
    /// Parses a pattern; the error says what form is expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split(':').collect();
        match parts.as_slice() {
            [agent, capability] => {
                Ok(Self { agent: Pattern::new(agent), kind: None, capability: Pattern::new(capability) })
            }
            [agent, "skill", capability] => Ok(Self {
                agent: Pattern::new(agent),
                kind: Some(CapabilityKind::Skill),
                capability: Pattern::new(capability),
            }),
            _ => Err(format!(
                "allow pattern `{text}` must be `agent:capability` or `agent:skill:name` (with `*` wildcards)"
            )),
        }
    }

    /// Whether a capability is allowed by this pattern.
    pub fn matches(&self, c: &AllowedCapability) -> bool {
        self.agent.matches(&c.agent) && self.kind.is_none_or(|k| k == c.kind) && self.capability.matches(&c.capability)
    }
}

/// Fetches every capability the request may use.
pub async fn fetch(
    discovery: &mut DiscoveryServiceClient<TracedChannel>,
    excluded: &[String],
    include_unhealthy: bool,
    request_id: &str,
) -> Result<Vec<AllowedCapability>, tonic::Status> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let mut request = tonic::Request::new(pb::ListCapabilitiesRequest {
            include_input_schema: true,
            include_internal: false,
            exclude_agents: excluded.to_vec(),
            health_status: if include_unhealthy { 0 } else { pb::HealthStatus::Active as i32 },
            limit: 500,
            offset,
            ..Default::default()
        });
        if let Ok(value) = request_id.parse() {
            request.metadata_mut().insert("x-request-id", value);
        }
        let page = discovery.list_capabilities(request).await?.into_inner();
        for agent in &page.capabilities {
            for (kind, list) in [(CapabilityKind::Reasoner, &agent.reasoners), (CapabilityKind::Skill, &agent.skills)] {
                for c in list.iter().filter(|c| !c.internal) {
                    out.push(AllowedCapability {
                        agent: agent.id.clone(),
                        capability: c.id.clone(),
                        kind,
                        description: c.description.clone(),
                        input_schema: c.input_schema.as_ref().map(agentmesh_proto::json::from_struct),
                    });
                }
            }
        }
        let has_more = page.pagination.is_some_and(|p| p.has_more);
        if !has_more || page.capabilities.is_empty() {
            return Ok(out);
        }
        offset += u32::try_from(page.capabilities.len()).unwrap_or(u32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(agent: &str, kind: CapabilityKind, capability: &str) -> AllowedCapability {
        AllowedCapability {
            agent: agent.into(),
            capability: capability.into(),
            kind,
            description: String::new(),
            input_schema: None,
        }
    }

    #[test]
    fn allow_patterns() {
        let weather = cap("weather-tool-v2", CapabilityKind::Skill, "get_current_weather");
        let web = cap("research", CapabilityKind::Skill, "web_search");
        let reasoner = cap("research", CapabilityKind::Reasoner, "web_summarize");
        let p = AllowPattern::parse("weather-*:*").unwrap();
        assert!(p.matches(&weather) && !p.matches(&web));
        let p = AllowPattern::parse("*:skill:web_*").unwrap();
        assert!(p.matches(&web) && !p.matches(&reasoner) && !p.matches(&weather));
        assert!(AllowPattern::parse("nocolon").is_err());
        assert!(AllowPattern::parse("a:reasoner:b").is_err());
    }
}
