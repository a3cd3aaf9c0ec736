//! A small BM25 ranking over capability ids and descriptions: it orders the
//! candidates of pre-selection (most likely first) and narrows very large
//! catalogs before an LLM sees them. Words are lowercased, split on
//! punctuation (so ids split too), stripped of common English endings
//! (`calculate` and `calculation` meet), and function words and bare
//! numbers in the request are ignored (numbers there are data, not tools).

use std::collections::HashMap;

use crate::plan::AllowedCapability;

/// Lowercase word pieces: ids split on `_`, `-`, `.`, `:` and `/` too.
pub fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).map(|t| stem(&t.to_lowercase())).collect()
}

/// Whether a request joins several asks (`… and …`, `then`, `also`,
/// `plus`), so that it may well need several tools.
pub fn joins_several_asks(query: &str) -> bool {
    query
        .split(|c: char| !c.is_alphanumeric())
        .any(|w| ["and", "then", "also", "plus"].iter().any(|j| w.eq_ignore_ascii_case(j)))
}

/// Whether a request may name several items for one tool: it joins
/// several asks, or lists with commas or semicolons ("email Bob, Alice
/// and Carol").
pub fn names_several(query: &str) -> bool {
    joins_several_asks(query) || query.contains([',', ';'])
}

/// The asks a request joins (`… and …`, `then`, `also`, `plus`), each
/// as written; the request itself when it joins none.
pub fn asks(query: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    for word in query.split_inclusive(char::is_whitespace) {
        let bare = word.trim().trim_matches(|c: char| !c.is_alphanumeric());
        if ["and", "then", "also", "plus"].iter().any(|j| bare.eq_ignore_ascii_case(j)) {
            parts.push(String::new());
        } else if let Some(last) = parts.last_mut() {
            last.push_str(word);
        }
    }
    let parts: Vec<String> = parts
        .into_iter()
        .map(|p| p.trim().trim_matches(|c: char| c == ',' || c == ';').trim().to_owned())
        .filter(|p| p.chars().any(char::is_alphanumeric))
        .collect();
    if parts.len() < 2 { vec![query.trim().to_owned()] } else { parts }
}

/// Words that say nothing about which tool is wanted.
const STOP_WORDS: [&str; 40] = [
    "a", "an", "and", "are", "at", "be", "by", "can", "do", "for", "from", "give", "how", "i", "in", "is", "it", "me",
    "my", "now", "of", "on", "or", "please", "right", "tell", "that", "the", "this", "to", "what", "when", "where",
    "which", "who", "why", "will", "with", "you", "your",
];

/// How many of a request's words are worth matching (function words and
/// bare numbers left out).
pub fn word_count(query: &str) -> usize {
    query_tokens(query).len()
}

/// The request's words worth matching.
fn query_tokens(query: &str) -> Vec<String> {
    query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty() && !t.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_lowercase)
        .filter(|t| !STOP_WORDS.contains(&t.as_str()))
        .map(|t| stem(&t))
        .collect()
}

/// A crude English stem: the word without its longest common ending, when
/// at least three letters remain.
fn stem(word: &str) -> String {
    const ENDINGS: [&str; 18] = [
        "ational", "ations", "ation", "ators", "ator", "ating", "ated", "ates", "ings", "ate", "ing", "ers", "ies",
        "er", "es", "ed", "ly", "s",
    ];
    for ending in ENDINGS {
        if let Some(stem) = word.strip_suffix(ending)
            && stem.chars().count() >= 3
        {
            return stem.to_owned();
        }
    }
    word.to_owned()
}

fn document(c: &AllowedCapability) -> Vec<String> {
    let mut words = tokens(&c.agent);
    words.extend(tokens(&c.capability));
    words.extend(tokens(&c.description));
    words
}

/// How well one capability matches a request's words.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Lexical {
    /// The BM25 score (0: no word shared).
    pub score: f64,
    /// The share of the request's words (weighted by how rare they are in
    /// the catalog) that the capability contains: 0 to 1.
    pub coverage: f64,
}

/// Each capability's match with `query`, in catalog order.
pub fn score(query: &str, catalog: &[AllowedCapability]) -> Vec<Lexical> {
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
    let mut query = query_tokens(query);
    query.sort_unstable();
    query.dedup();
    let idf = |q: &str| {
        let d = *df.get(q).unwrap_or(&0) as f64;
        ((n - d + 0.5) / (d + 0.5) + 1.0).ln()
    };
    let total_idf: f64 = query.iter().map(|q| idf(q)).sum();
    docs.iter()
        .map(|doc| {
            let len = doc.len() as f64;
            let mut lexical = Lexical::default();
            for q in &query {
                let tf = doc.iter().filter(|w| *w == q).count() as f64;
                if tf == 0.0 {
                    continue;
                }
                let weight = idf(q);
                lexical.score += weight * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avg_len));
                lexical.coverage += weight;
            }
            if total_idf > 0.0 {
                lexical.coverage /= total_idf;
            }
            lexical
        })
        .collect()
}

/// Indices of `catalog` ranked by relevance to `query`, best first; ties
/// (and capabilities matching no word) keep catalog order.
pub fn rank(query: &str, catalog: &[AllowedCapability]) -> Vec<(usize, f64)> {
    let mut scored: Vec<(usize, f64)> = score(query, catalog).into_iter().map(|l| l.score).enumerate().collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(agent: &str, capability: &str, description: &str) -> AllowedCapability {
        AllowedCapability::skill(agent, capability, description)
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
        assert_eq!(tokens("get_current-weather:v2"), ["get", "current", "weath", "v2"]);
        assert_eq!(query_tokens("Calculate 17 * 23 for me"), ["calcul"]);
        assert!(joins_several_asks("Weather in Paris and 2 * 3?") && !joins_several_asks("Band names"));
        assert_eq!(
            asks("What is the weather in Chicago, and then what is 100 * 3?"),
            ["What is the weather in Chicago", "what is 100 * 3?"]
        );
        assert_eq!(asks("Band names"), ["Band names"]);
        assert!(names_several("Email Bob, Alice") && names_several("Paris and Rome") && !names_several("Email Bob"));
        assert_eq!((word_count("London?"), word_count("what is 100 * 3?"), word_count("the latest news")), (1, 0, 2));
        assert_eq!(asks("and"), ["and"]);
        assert_eq!(tokens("calculation-agent evaluates"), ["calcul", "agent", "evalu"]);
    }
}
