//! Capability queries over the catalog: the filtering rules of
//! `GET /api/v1/discovery/capabilities` and `ListCapabilities`, in one place.
//!
//! Rules: filters combine with AND. Agent ids are exact. `reasoner` alone
//! returns only reasoners, `skill` alone only skills; with both, each kind is
//! filtered by its own pattern. `tags` matches a capability when any pattern
//! matches any of its tags or of its agent's tags. Internal capabilities are
//! left out unless asked for. When a capability filter (`reasoner`, `skill`,
//! `tags`) is given, agents without a matching capability are left out;
//! without one, every agent passing the agent filters is listed. Pagination
//! is over matching agents ordered by id; totals count every match.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use crate::agent::{AgentRecord, Capability};
use crate::health::HealthStatus;
use crate::pattern::Pattern;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page size.
pub const MAX_LIMIT: usize = 500;

/// A parsed, validated capability query.
#[derive(Debug, Clone)]
pub struct CapabilityQuery {
    /// Exact agent ids; empty means all.
    pub agent_ids: Vec<String>,
    /// Reasoner id pattern.
    pub reasoner: Option<Pattern>,
    /// Skill id pattern.
    pub skill: Option<Pattern>,
    /// Tag patterns.
    pub tags: Vec<Pattern>,
    /// Include input schemas.
    pub include_input_schema: bool,
    /// Include output schemas.
    pub include_output_schema: bool,
    /// Include descriptions.
    pub include_descriptions: bool,
    /// Include examples.
    pub include_examples: bool,
    /// Only agents with this derived health.
    pub health_status: Option<HealthStatus>,
    /// Page size, 1..=500.
    pub limit: usize,
    /// Agents to skip.
    pub offset: usize,
    /// Agents never to return.
    pub exclude_agents: Vec<String>,
    /// Include internal capabilities.
    pub include_internal: bool,
}

impl Default for CapabilityQuery {
    fn default() -> Self {
        Self {
            agent_ids: Vec::new(),
            reasoner: None,
            skill: None,
            tags: Vec::new(),
            include_input_schema: false,
            include_output_schema: false,
            include_descriptions: true,
            include_examples: false,
            health_status: None,
            limit: DEFAULT_LIMIT,
            offset: 0,
            exclude_agents: Vec::new(),
            include_internal: false,
        }
    }
}

/// One agent of a result page with its matching capabilities.
#[derive(Debug, Clone)]
pub struct MatchedAgent<'a> {
    /// The stored agent.
    pub record: &'a AgentRecord,
    /// Health derived at query time.
    pub health: HealthStatus,
    /// Last heartbeat known at query time.
    pub last_heartbeat: DateTime<Utc>,
    /// Matching reasoners.
    pub reasoners: Vec<&'a Capability>,
    /// Matching skills.
    pub skills: Vec<&'a Capability>,
}

/// A page of query results.
#[derive(Debug, Clone)]
pub struct CatalogPage<'a> {
    /// Agents of this page.
    pub agents: Vec<MatchedAgent<'a>>,
    /// Matching agents over all pages.
    pub total_agents: usize,
    /// Matching reasoners over all pages.
    pub total_reasoners: usize,
    /// Matching skills over all pages.
    pub total_skills: usize,
    /// Limit applied.
    pub limit: usize,
    /// Offset applied.
    pub offset: usize,
    /// More agents match after this page.
    pub has_more: bool,
}

impl CapabilityQuery {
    /// Names of the filters in use, for the filter usage metric.
    pub fn filters_used(&self) -> Vec<&'static str> {
        let mut used = Vec::new();
        if !self.agent_ids.is_empty() {
            used.push("agent");
        }
        if self.reasoner.is_some() {
            used.push("reasoner");
        }
        if self.skill.is_some() {
            used.push("skill");
        }
        if !self.tags.is_empty() {
            used.push("tag");
        }
        if self.health_status.is_some() {
            used.push("health_status");
        }
        if !self.exclude_agents.is_empty() {
            used.push("exclude_agents");
        }
        used
    }

    /// True when nothing narrows the catalog: every agent is listed and the
    /// totals are the catalog's.
    pub fn is_unfiltered(&self) -> bool {
        self.agent_ids.is_empty()
            && !self.has_capability_filter()
            && self.health_status.is_none()
            && self.exclude_agents.is_empty()
    }

    /// The page of an unfiltered query, given the agents of that page only
    /// and the catalog's totals (see [`CatalogIndex`](crate::CatalogIndex)).
    pub fn page_unfiltered<'a>(
        &self,
        page_agents: impl IntoIterator<Item = (&'a AgentRecord, HealthStatus, DateTime<Utc>)>,
        total_agents: usize,
        (total_reasoners, total_skills): (usize, usize),
    ) -> CatalogPage<'a> {
        let agents: Vec<MatchedAgent<'a>> = page_agents
            .into_iter()
            .take(self.limit)
            .map(|(record, health, last_heartbeat)| {
                let visible = |list: &'a [Capability]| -> Vec<&'a Capability> {
                    list.iter().filter(|c| self.include_internal || !c.internal).collect()
                };
                let def = &record.definition;
                MatchedAgent {
                    record,
                    health,
                    last_heartbeat,
                    reasoners: visible(&def.reasoners),
                    skills: visible(&def.skills),
                }
            })
            .collect();
        CatalogPage {
            has_more: self.offset + agents.len() < total_agents,
            agents,
            total_agents,
            total_reasoners,
            total_skills,
            limit: self.limit,
            offset: self.offset,
        }
    }

    fn has_capability_filter(&self) -> bool {
        self.reasoner.is_some() || self.skill.is_some() || !self.tags.is_empty()
    }

    fn wants_reasoners(&self) -> bool {
        self.reasoner.is_some() || self.skill.is_none()
    }

    fn wants_skills(&self) -> bool {
        self.skill.is_some() || self.reasoner.is_none()
    }

    fn capability_matches(&self, cap: &Capability, pattern: Option<&Pattern>, agent_tags: &[String]) -> bool {
        if cap.internal && !self.include_internal {
            return false;
        }
        if let Some(pattern) = pattern
            && !pattern.matches(&cap.id)
        {
            return false;
        }
        self.tags.is_empty() || self.tags.iter().any(|p| cap.tags.iter().chain(agent_tags).any(|tag| p.matches(tag)))
    }

    /// Runs the query over agents given in id order, each with its current
    /// health and last heartbeat.
    pub fn run<'a>(
        &self,
        agents: impl IntoIterator<Item = (&'a AgentRecord, HealthStatus, DateTime<Utc>)>,
    ) -> CatalogPage<'a> {
        let wanted: HashSet<&str> = self.agent_ids.iter().map(String::as_str).collect();
        let excluded: HashSet<&str> = self.exclude_agents.iter().map(String::as_str).collect();
        let mut page = CatalogPage {
            agents: Vec::new(),
            total_agents: 0,
            total_reasoners: 0,
            total_skills: 0,
            limit: self.limit,
            offset: self.offset,
            has_more: false,
        };
        for (record, health, last_heartbeat) in agents {
            let id = record.id();
            if (!wanted.is_empty() && !wanted.contains(id))
                || excluded.contains(id)
                || self.health_status.is_some_and(|h| h != health)
            {
                continue;
            }
            let def = &record.definition;
            let reasoners: Vec<&Capability> = if self.wants_reasoners() {
                def.reasoners.iter().filter(|c| self.capability_matches(c, self.reasoner.as_ref(), &def.tags)).collect()
            } else {
                Vec::new()
            };
            let skills: Vec<&Capability> = if self.wants_skills() {
                def.skills.iter().filter(|c| self.capability_matches(c, self.skill.as_ref(), &def.tags)).collect()
            } else {
                Vec::new()
            };
            if self.has_capability_filter() && reasoners.is_empty() && skills.is_empty() {
                continue;
            }
            page.total_agents += 1;
            page.total_reasoners += reasoners.len();
            page.total_skills += skills.len();
            if page.total_agents > self.offset && page.agents.len() < self.limit {
                page.agents.push(MatchedAgent { record, health, last_heartbeat, reasoners, skills });
            } else if page.total_agents > self.offset {
                page.has_more = true;
            }
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentDefinition;
    use crate::health::ReportedStatus;
    use chrono::Utc;
    use serde_json::json;

    fn agent(value: serde_json::Value) -> AgentRecord {
        let now = Utc::now();
        AgentRecord {
            definition: serde_json::from_value::<AgentDefinition>(value).unwrap_or_else(|e| panic!("{e}")),
            registered_at: now,
            updated_at: now,
            last_heartbeat: now,
            reported_status: ReportedStatus::Active,
        }
    }

    fn catalog() -> Vec<AgentRecord> {
        vec![
            agent(json!({"id": "a-research", "base_url": "http://a", "tags": ["agent-tag"],
                "reasoners": [{"id": "deep_research", "tags": ["research", "ml"]}, {"id": "summarize", "tags": ["nlp"]}],
                "skills": [{"id": "web_search", "tags": ["web"]}, {"id": "orchestrate", "internal": true}]})),
            agent(json!({"id": "b-web", "base_url": "http://b",
                "skills": [{"id": "web_scraper", "tags": ["web", "mlops"]}]})),
            agent(json!({"id": "c-empty", "base_url": "http://c"})),
        ]
    }

    fn ids(page: &CatalogPage<'_>) -> Vec<String> {
        page.agents
            .iter()
            .flat_map(|a| a.reasoners.iter().chain(&a.skills).map(move |c| format!("{}:{}", a.record.id(), c.id)))
            .collect()
    }

    fn run(q: &CapabilityQuery, agents: &[AgentRecord]) -> Vec<String> {
        ids(&q.run(agents.iter().map(|a| (a, HealthStatus::Active, a.last_heartbeat))))
    }

    #[test]
    fn no_filter_lists_every_visible_capability_and_every_agent() {
        let agents = catalog();
        let q = CapabilityQuery::default();
        let page = q.run(agents.iter().map(|a| (a, HealthStatus::Active, a.last_heartbeat)));
        assert_eq!(page.total_agents, 3);
        assert_eq!(
            ids(&page),
            ["a-research:deep_research", "a-research:summarize", "a-research:web_search", "b-web:web_scraper"]
        );
        let with_internal = CapabilityQuery { include_internal: true, ..Default::default() };
        assert!(run(&with_internal, &agents).contains(&"a-research:orchestrate".to_owned()));
    }

    #[test]
    fn reasoner_alone_returns_only_reasoners_and_both_filter_each_kind() {
        let agents = catalog();
        let q = CapabilityQuery { reasoner: Some(Pattern::new("*")), ..Default::default() };
        assert_eq!(run(&q, &agents), ["a-research:deep_research", "a-research:summarize"]);
        let q = CapabilityQuery { skill: Some(Pattern::new("web_*")), ..Default::default() };
        assert_eq!(run(&q, &agents), ["a-research:web_search", "b-web:web_scraper"]);
        let q = CapabilityQuery {
            reasoner: Some(Pattern::new("*research*")),
            skill: Some(Pattern::new("*scraper")),
            ..Default::default()
        };
        assert_eq!(run(&q, &agents), ["a-research:deep_research", "b-web:web_scraper"]);
    }

    #[test]
    fn tags_match_any_pattern_against_any_tag() {
        let agents = catalog();
        let q = CapabilityQuery { tags: vec![Pattern::new("ml*")], ..Default::default() };
        assert_eq!(run(&q, &agents), ["a-research:deep_research", "b-web:web_scraper"]);
        let q = CapabilityQuery { tags: vec![Pattern::new("nlp"), Pattern::new("*web")], ..Default::default() };
        assert_eq!(run(&q, &agents), ["a-research:summarize", "a-research:web_search", "b-web:web_scraper"]);
        let q = CapabilityQuery { tags: vec![Pattern::new("agent-tag")], ..Default::default() };
        assert_eq!(run(&q, &agents).len(), 3, "agent tags apply to the agent's capabilities");
    }

    #[test]
    fn agent_filters_are_exact_and_combine_with_and() {
        let agents = catalog();
        let q = CapabilityQuery { agent_ids: vec!["b-web".into()], ..Default::default() };
        assert_eq!(run(&q, &agents), ["b-web:web_scraper"]);
        let q = CapabilityQuery { agent_ids: vec!["b-*".into()], ..Default::default() };
        assert!(run(&q, &agents).is_empty());
        let q = CapabilityQuery {
            agent_ids: vec!["a-research".into(), "b-web".into()],
            tags: vec![Pattern::new("web")],
            exclude_agents: vec!["b-web".into()],
            ..Default::default()
        };
        assert_eq!(run(&q, &agents), ["a-research:web_search"]);
    }

    #[test]
    fn health_filter_uses_the_given_health() {
        let agents = catalog();
        let q = CapabilityQuery { health_status: Some(HealthStatus::Degraded), ..Default::default() };
        let page = q.run(agents.iter().map(|a| {
            (a, if a.id() == "b-web" { HealthStatus::Degraded } else { HealthStatus::Active }, a.last_heartbeat)
        }));
        assert_eq!(ids(&page), ["b-web:web_scraper"]);
    }

    #[test]
    fn pagination_is_over_agents_with_totals_over_all_pages() {
        let agents = catalog();
        let q = CapabilityQuery { limit: 1, offset: 1, ..Default::default() };
        let page = q.run(agents.iter().map(|a| (a, HealthStatus::Active, a.last_heartbeat)));
        assert_eq!(page.agents.len(), 1);
        assert_eq!(page.agents[0].record.id(), "b-web");
        assert_eq!(page.total_agents, 3);
        assert_eq!(page.total_skills, 2);
        assert!(page.has_more);
        let q = CapabilityQuery { limit: 5, offset: 2, ..Default::default() };
        let page = q.run(agents.iter().map(|a| (a, HealthStatus::Active, a.last_heartbeat)));
        assert!(!page.has_more);
        assert_eq!(page.agents.len(), 1);
    }
}
