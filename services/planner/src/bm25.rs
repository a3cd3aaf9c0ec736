//! A small BM25 ranking over capability ids, descriptions and tags, to
//! narrow very large catalogs before an LLM sees them.

use std::collections::HashMap;

use agentmesh_core::plan::AllowedCapability;

/// Lowercase word pieces: ids split on `_`, `-`, `.`, `:` and `/` too.
pub fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).map(str::to_lowercase).collect()
}

fn document(c: &AllowedCapability) -> Vec<String> {
    let mut words = tokens(&c.agent);
    words.extend(tokens(&c.capability));
    words.extend(tokens(&c.description));
    words
}

/// Indices of `catalog` ranked by relevance to `query`, best first; ties
/// (and capabilities matching no word) keep catalog order.
pub fn rank(query: &str, catalog: &[AllowedCapability]) -> Vec<(usize, f64)> {
    const K1: f64 = 1.2;
    const B: f64 = 0.75;
    let docs: Vec<Vec<String>> = catalog.iter().map(document).collect();
    let n = docs.len() as f64;
    let avg_len = if docs.is_empty() { 1.0 } else { docs.iter().map(Vec::len).sum::<usize>() as f64 / n };
    let mut df: HashMap<&str, usize> = HashMap::new();
    for doc in &docs {
        let mut seen: Vec<&str> = doc.iter().map(String::as_str).collect();
        seen.sort_unstable();
        seen.dedup();
        for word in seen {
            *df.entry(word).or_default() += 1;
        }
    }
    let query = tokens(query);
    let mut scored: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, doc)| {
            let len = doc.len() as f64;
            let score = query
                .iter()
                .map(|q| {
                    let tf = doc.iter().filter(|w| *w == q).count() as f64;
                    if tf == 0.0 {
                        return 0.0;
                    }
                    let d = *df.get(q.as_str()).unwrap_or(&0) as f64;
                    let idf = ((n - d + 0.5) / (d + 0.5) + 1.0).ln();
                    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avg_len))
                })
                .sum();
            (i, score)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_core::CapabilityKind;

    fn cap(agent: &str, capability: &str, description: &str) -> AllowedCapability {
        AllowedCapability {
            agent: agent.into(),
            capability: capability.into(),
            kind: CapabilityKind::Skill,
            description: description.into(),
            input_schema: None,
        }
    }

    #[test]
    fn ranks_by_shared_words_with_ids_split() {
        let catalog = vec![
            cap("weather-tool-v2", "get_current_weather", "Current weather for a location"),
            cap("calculation-agent", "evaluate", "Evaluates arithmetic expressions"),
            cap("stock-service", "get_quote", "Latest stock price"),
        ];
        let ranked = rank("what is the weather in Chicago", &catalog);
        assert_eq!(ranked[0].0, 0);
        let ranked = rank("calculation of 2+2", &catalog);
        assert_eq!(ranked[0].0, 1);
        assert!(ranked[0].1 > 0.0 && ranked[2].1 == 0.0);
        assert_eq!(tokens("get_current-weather:v2"), ["get", "current", "weather", "v2"]);
    }
}
