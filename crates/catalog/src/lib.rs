//! The catalog a request may plan over, as the services that reason over
//! it (the planner, synthesis's reviews) fetch it from discovery: never the
//! calling orchestrator's own agents, never internal capabilities, narrowed
//! further by allow patterns. Ranking it is `agentmesh_core::bm25`.
//! [`Reasoning`] is what such a service starts with: the model, the
//! interaction log and discovery, and the readiness they make.
//!
//! Health: `active` and `degraded` agents are offered. A degraded agent has
//! missed a few heartbeats or said it is struggling, but is most likely
//! still there (a pause, a slow network); planning without it would answer
//! "nothing can do this" when something can, and the executor's retries and
//! circuit breaker deal with an agent that does fail. `inactive` agents
//! (no heartbeat for six intervals) are left out unless the request asks
//! for them (`include_unhealthy`), and the ones left out are counted so
//! that a zero-step answer can say so.

mod reasoning;

use std::collections::HashSet;

use agentmesh_core::plan::AllowedCapability;
use agentmesh_core::{CapabilityKind, Pattern};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;

pub use reasoning::Reasoning;

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

    /// Parses every pattern of a request; the first bad one is the error.
    pub fn parse_all(texts: &[String]) -> Result<Vec<Self>, String> {
        texts.iter().map(|t| Self::parse(t)).collect()
    }

    /// Whether a capability is allowed by this pattern.
    pub fn matches(&self, c: &AllowedCapability) -> bool {
        self.agent.matches(&c.agent) && self.kind.is_none_or(|k| k == c.kind) && self.capability.matches(&c.capability)
    }
}

/// The capabilities a request may use, and the agents left out for health.
#[derive(Debug, Default)]
pub struct Catalog {
    /// What may be planned over.
    pub capabilities: Vec<AllowedCapability>,
    /// Inactive agents left out (their ids, sorted).
    pub inactive: Vec<String>,
    /// The capabilities declared destructive (`hints.destructive`, and not
    /// read-only), as `(agent, capability)`, of every agent (inactive ones
    /// too).
    pub destructive: HashSet<(String, String)>,
}

impl Catalog {
    /// A sentence for a zero-step answer when agents were left out for
    /// health (empty when none was).
    pub fn health_note(&self) -> String {
        if self.inactive.is_empty() {
            return String::new();
        }
        let shown: Vec<&str> = self.inactive.iter().take(5).map(String::as_str).collect();
        let more = self.inactive.len() - shown.len();
        format!(
            "{} {} left out as inactive (no recent heartbeat): {}{}; set include_unhealthy \
             (`agentmesh plan --include-unhealthy`) to plan over {}",
            self.inactive.len(),
            if self.inactive.len() == 1 { "agent was" } else { "agents were" },
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() },
            if self.inactive.len() == 1 { "it" } else { "them" },
        )
    }
}

/// The capabilities of `agent` a plan may use (all but internal ones),
/// reasoners first.
pub fn plannable(agent: &pb::Agent) -> impl Iterator<Item = AllowedCapability> + '_ {
    [(CapabilityKind::Reasoner, &agent.reasoners), (CapabilityKind::Skill, &agent.skills)].into_iter().flat_map(
        move |(kind, list)| {
            list.iter().filter(|c| !c.internal).map(move |c| AllowedCapability {
                agent: agent.id.clone(),
                capability: c.id.clone(),
                kind,
                description: c.description.clone(),
                input_schema: c.input_schema.as_ref().map(agentmesh_proto::json::from_struct),
            })
        },
    )
}

/// Fetches every capability the request may use.
pub async fn fetch(
    discovery: &mut DiscoveryServiceClient<TracedChannel>,
    excluded: &[String],
    include_unhealthy: bool,
    request_id: &str,
) -> Result<Catalog, tonic::Status> {
    let mut out = Catalog::default();
    let mut offset = 0;
    loop {
        let mut request = tonic::Request::new(pb::ListCapabilitiesRequest {
            include_input_schema: true,
            include_internal: false,
            exclude_agents: excluded.to_vec(),
            limit: 500,
            offset,
            ..Default::default()
        });
        if let Ok(value) = request_id.parse() {
            request.metadata_mut().insert("x-request-id", value);
        }
        let page = discovery.list_capabilities(request).await?.into_inner();
        for agent in &page.capabilities {
            // Known for every agent, offered or not: an agent that hung
            // mid-call may be inactive by the time its step is reviewed.
            for c in agent.reasoners.iter().chain(&agent.skills) {
                if c.hints.as_ref().is_some_and(|h| h.destructive == Some(true) && h.read_only != Some(true)) {
                    out.destructive.insert((agent.id.clone(), c.id.clone()));
                }
            }
            if !include_unhealthy && agent.health_status == pb::HealthStatus::Inactive as i32 {
                out.inactive.push(agent.id.clone());
                continue;
            }
            out.capabilities.extend(plannable(agent));
        }
        let has_more = page.pagination.is_some_and(|p| p.has_more);
        if !has_more || page.capabilities.is_empty() {
            out.inactive.sort();
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
    fn the_health_note_names_what_was_left_out() {
        assert_eq!(Catalog::default().health_note(), "");
        let one = Catalog { inactive: vec!["clock".into()], ..Default::default() };
        assert!(one.health_note().starts_with("1 agent was left out as inactive (no recent heartbeat): clock;"));
        let many = Catalog { inactive: (0..7).map(|i| format!("a{i}")).collect(), ..Default::default() };
        assert!(many.health_note().contains("a0, a1, a2, a3, a4 and 2 more; set include_unhealthy"));
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
