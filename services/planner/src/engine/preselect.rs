//! Pre-selection: ranking the catalog for a request (by words, and by
//! meaning with embeddings), the relevance gate, and the model's pick among
//! the best candidates. The planning loop ([`super`]) plans over what this
//! keeps.

use std::collections::{HashMap, HashSet};

use agentmesh_core::plan::AllowedCapability;
use agentmesh_core::{bm25, hybrid};
use agentmesh_llm::{Completion, LlmError, ResponseSchema};
use serde_json::{Value, json};

use super::{InteractionKind, Planner, PlanningError, Run, current_request_id};
use crate::prompt::{pair_id, preselect_messages};

/// With embeddings, how much less relevant than the model's first pick a
/// further pick of a single-ask request may be and still be kept.
const SECOND_PICK_MARGIN: f64 = 0.05;

/// Candidates ranked for a request.
struct Ranking {
    /// Every capability, best first.
    candidates: Vec<hybrid::Candidate>,
    /// Whether meaning counted (embeddings on and answering).
    by_meaning: bool,
    /// For a request joining several asks, each ask and its best
    /// capability (catalog index) when relevant enough.
    ask_best: Vec<(String, usize)>,
}

impl Planner {
    /// Each capability's scores for `query`, best first: by words and
    /// meaning when embeddings are on and answer, by words otherwise. A
    /// request joining several asks ("the weather in Paris and the news")
    /// is ranked ask by ask too, each capability keeping its best relevance,
    /// so that the second ask's tool is not drowned by the first's.
    async fn rank(&self, query: &str, catalog: &[AllowedCapability]) -> Ranking {
        let by_words =
            || Ranking { candidates: hybrid::rank(query, catalog, None), by_meaning: false, ask_best: Vec::new() };
        let Some(semantic) = &self.semantic else { return by_words() };
        // An ask of one word ("… in Paris and London?") is a list, not an ask.
        let mut asks: Vec<String> = bm25::asks(query).into_iter().filter(|a| bm25::word_count(a) >= 2).collect();
        if asks.len() < 2 {
            asks.clear();
        }
        let texts: Vec<String> = std::iter::once(query.to_owned()).chain(asks.iter().cloned()).collect();
        let similarities = match semantic.similarities_of(&texts, catalog).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(embedder = semantic.name(), error = %e, "embedding failed; ranking by words only");
                return by_words();
            }
        };
        let mut candidates = hybrid::rank(query, catalog, Some(&similarities[0]));
        let mut ask_best = Vec::new();
        if !asks.is_empty() {
            let mut best_of: Vec<f64> = vec![0.0; catalog.len()];
            for c in &candidates {
                best_of[c.index] = c.relevance;
            }
            for (ask, similarities) in asks.iter().zip(&similarities[1..]) {
                let ranked = hybrid::rank(ask, catalog, Some(similarities));
                if let Some(top) = ranked.first()
                    && top.relevance >= self.settings.min_relevance
                {
                    ask_best.push((ask.clone(), top.index));
                }
                for c in ranked {
                    best_of[c.index] = best_of[c.index].max(c.relevance);
                }
            }
            for c in &mut candidates {
                c.relevance = best_of[c.index];
            }
            candidates.sort_by(|a, b| {
                b.relevance.total_cmp(&a.relevance).then(b.fused.total_cmp(&a.fused)).then(a.index.cmp(&b.index))
            });
        }
        Ranking { candidates, by_meaning: true, ask_best }
    }

    /// Narrows `catalog` for `query` when above the threshold: a lexical
    /// ranking orders the candidates (best first, the most relevant only
    /// when very large), then the model picks among their ids, constrained
    /// to them. `Ok(empty)` means "nothing fits". A pre-selection that fails
    /// for another reason than the LLM being unreachable or refusing the
    /// credentials falls back to the candidates.
    pub(super) async fn preselect(
        &self,
        run: &mut Run<'_>,
        query: &str,
        catalog: &[AllowedCapability],
    ) -> Result<Vec<AllowedCapability>, PlanningError> {
        // A new pre-selection (after a hallucination) replaces the asks of the first.
        run.asks.clear();
        let semantic = self.semantic.is_some();
        if !semantic && catalog.len() <= self.settings.preselect_threshold {
            return Ok(catalog.to_vec());
        }
        let Ranking { candidates: ranked, by_meaning, ask_best } = self.rank(query, catalog).await;
        if !by_meaning && catalog.len() <= self.settings.preselect_threshold {
            // Embeddings failed: as without them.
            return Ok(catalog.to_vec());
        }
        if by_meaning {
            let best = ranked.iter().max_by(|a, b| a.relevance.total_cmp(&b.relevance));
            if let Some(best) = best
                && best.relevance < self.settings.min_relevance
            {
                let closest = &catalog[best.index];
                let reason = format!(
                    "none of the available capabilities is relevant to this request (the closest, {}:{}, \
                     scores {:.2}, under the planner's min_relevance of {:.2})",
                    closest.agent, closest.capability, best.relevance, self.settings.min_relevance
                );
                tracing::info!(
                    request_id = current_request_id(),
                    best = %pair_id(closest),
                    relevance = best.relevance,
                    min_relevance = self.settings.min_relevance,
                    "nothing relevant enough: a zero-step plan without asking the model"
                );
                run.nothing_fits = Some(reason);
                run.stats.preselected = Some(0);
                return Ok(Vec::new());
            }
            if catalog.len() <= self.settings.preselect_threshold {
                // Small catalogs are shown whole, best first.
                return Ok(ranked.iter().map(|c| catalog[c.index].clone()).collect());
            }
        }
        let limit = if by_meaning { self.settings.semantic_limit } else { self.settings.lexical_limit };
        let ranked: Vec<hybrid::Candidate> = ranked.into_iter().take(limit).collect();
        let candidates: Vec<AllowedCapability> = ranked.iter().map(|c| catalog[c.index].clone()).collect();
        let shares_a_word: HashSet<String> =
            ranked.iter().filter(|c| c.bm25 > 0.0).map(|c| pair_id(&catalog[c.index])).collect();
        let ids: Vec<String> = candidates.iter().map(pair_id).collect();
        let schema = ResponseSchema {
            name: "selection".into(),
            schema: json!({"type": "object", "additionalProperties": false, "required": ["selected"],
                "properties": {"selected": {"type": "array", "items": {"type": "string", "enum": ids},
                    "maxItems": self.settings.preselect_max}}}),
        };
        // Ids of about 40 characters, quoted, at most `preselect_max` of them.
        let max_tokens = u32::try_from(32 + self.settings.preselect_max * 40).unwrap_or(512);
        let answer = match run
            .call(InteractionKind::Preselection, preselect_messages(query, &candidates), Some(schema), 0.0, max_tokens)
            .await
        {
            Ok(completion) => selection(&completion),
            Err(e @ (LlmError::Auth { .. } | LlmError::Config(_) | LlmError::Unavailable { .. })) => {
                return Err(e.into());
            }
            Err(e) => Err(e.to_string()),
        };
        let selected = match answer {
            Ok(selected) => selected,
            Err(e) => {
                tracing::warn!(error = %e, candidates = candidates.len(), "pre-selection failed; planning over every candidate");
                run.stats.preselection_fallbacks += 1;
                run.stats.preselected = Some(candidates.len());
                return Ok(candidates);
            }
        };
        let wanted: HashSet<&str> = selected.iter().map(String::as_str).collect();
        let invented: Vec<&String> = selected.iter().filter(|s| !ids.contains(s)).collect();
        if !invented.is_empty() {
            tracing::warn!(invented = ?invented, "pre-selection named tools that were not listed; dropped");
        }
        // In the model's order: its first pick is its best guess. A further
        // pick must share a word with the request, or the request must join
        // several asks: small models pad their answer with whatever is
        // listed next, and a plan then uses it.
        // By meaning, it must also be about as relevant as the first pick.
        let first = selected.iter().find(|s| ids.contains(s));
        let several = bm25::joins_several_asks(query);
        let relevance: HashMap<String, f64> =
            ranked.iter().map(|c| (pair_id(&catalog[c.index]), c.relevance)).collect();
        let first_relevance = first.and_then(|f| relevance.get(f)).copied().unwrap_or(0.0);
        let close_to_first =
            |id: &str| !by_meaning || relevance.get(id).is_some_and(|r| *r >= first_relevance - SECOND_PICK_MARGIN);
        let mut kept: Vec<AllowedCapability> = candidates
            .into_iter()
            .filter(|c| {
                let id = pair_id(c);
                wanted.contains(id.as_str())
                    && (Some(&id) == first || several || (shares_a_word.contains(&id) && close_to_first(&id)))
            })
            .collect();
        if kept.len() + invented.len() < selected.len() {
            tracing::debug!(selected = ?selected, kept = kept.len(), "pre-selection picks sharing no word with the request dropped");
        }
        kept.sort_by_key(|c| selected.iter().position(|s| *s == pair_id(c)));
        // Each ask of the request brings its best match: small models
        // often pick for the first ask only.
        for (ask, i) in ask_best {
            let best = &catalog[i];
            if !kept.iter().any(|k| k.agent == best.agent && k.capability == best.capability) {
                tracing::debug!(capability = %pair_id(best), "added as the best match of one of the request's asks");
                kept.push(best.clone());
            }
            run.asks.push((ask, best.clone()));
        }
        run.stats.preselected = Some(kept.len());
        Ok(kept)
    }
}

/// The ids a pre-selection answer lists.
fn selection(completion: &Completion) -> Result<Vec<String>, String> {
    if completion.truncated {
        return Err("the answer was cut off at the token limit".into());
    }
    let json = agentmesh_core::plan::extract_json(&completion.text).ok_or("no JSON object in the answer")?;
    let value: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    value["selected"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect::<Vec<_>>())
        .ok_or_else(|| "no `selected` list".to_owned())
}
