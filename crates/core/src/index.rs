//! An index over a catalog snapshot, so that queries with exact filters
//! (agent ids, capability ids, tags without `*`) look at the few agents that
//! can match instead of scanning every capability, and unfiltered queries
//! take their totals without a scan.

use std::collections::HashMap;

use crate::agent::AgentRecord;
use crate::query::CapabilityQuery;

/// Positions (in id order) of agents by capability id and by tag, and the
/// catalog's capability totals.
#[derive(Debug, Default, Clone)]
pub struct CatalogIndex {
    by_capability: HashMap<String, Vec<usize>>,
    by_tag: HashMap<String, Vec<usize>>,
    /// Reasoners and skills that are not internal.
    visible: (usize, usize),
    /// All reasoners and skills.
    all: (usize, usize),
}

fn push_once(list: &mut Vec<usize>, position: usize) {
    if list.last() != Some(&position) {
        list.push(position);
    }
}

impl CatalogIndex {
    /// Indexes agents given in id order.
    pub fn build<'a>(agents: impl IntoIterator<Item = &'a AgentRecord>) -> Self {
        let mut index = Self::default();
        for (position, agent) in agents.into_iter().enumerate() {
            let def = &agent.definition;
            for tag in &def.tags {
                push_once(index.by_tag.entry(tag.clone()).or_default(), position);
            }
            for (kind, cap) in def.capabilities() {
                push_once(index.by_capability.entry(cap.id.clone()).or_default(), position);
                for tag in &cap.tags {
                    push_once(index.by_tag.entry(tag.clone()).or_default(), position);
                }
                let reasoner = kind == crate::agent::CapabilityKind::Reasoner;
                if reasoner {
                    index.all.0 += 1
                } else {
                    index.all.1 += 1
                }
                if !cap.internal {
                    if reasoner { index.visible.0 += 1 } else { index.visible.1 += 1 }
                }
            }
        }
        index
    }

    /// Reasoner and skill totals of the whole catalog.
    pub fn totals(&self, include_internal: bool) -> (usize, usize) {
        if include_internal { self.all } else { self.visible }
    }

    /// The positions of the only agents that can match `query`, in order,
    /// or `None` when its filters need a full scan. A superset: the query
    /// still checks each candidate.
    pub fn candidates(
        &self,
        query: &CapabilityQuery,
        position_of: impl Fn(&str) -> Option<usize>,
    ) -> Option<Vec<usize>> {
        let mut narrowed: Option<Vec<usize>> = None;
        let mut narrow = |list: Vec<usize>| {
            narrowed = Some(match narrowed.take() {
                None => list,
                Some(current) => current.into_iter().filter(|p| list.binary_search(p).is_ok()).collect(),
            });
        };
        if !query.agent_ids.is_empty() {
            let mut positions: Vec<usize> = query.agent_ids.iter().filter_map(|id| position_of(id)).collect();
            positions.sort_unstable();
            positions.dedup();
            narrow(positions);
        }
        let exact_ids: Option<Vec<&str>> = match (&query.reasoner, &query.skill) {
            (None, None) => None,
            (r, s) => [r, s].into_iter().flatten().map(|p| p.is_exact().then_some(p.as_str())).collect(),
        };
        if let Some(ids) = exact_ids {
            narrow(self.union(ids.iter().map(|id| self.by_capability.get(*id))));
        }
        if !query.tags.is_empty() && query.tags.iter().all(|t| t.is_exact()) {
            narrow(self.union(query.tags.iter().map(|t| self.by_tag.get(t.as_str()))));
        }
        narrowed
    }

    fn union<'a>(&self, lists: impl Iterator<Item = Option<&'a Vec<usize>>>) -> Vec<usize> {
        let mut all: Vec<usize> = lists.flatten().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}
