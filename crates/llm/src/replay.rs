//! The replay provider: answers from a file of scripted responses, for tests
//! and the offline demo. It never pretends to be a model: it logs a warning
//! when created and every completion names `replay` as provider and model.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;
use serde::Deserialize;

use crate::OnText;
use crate::{Completion, CompletionRequest, LlmError, LlmProvider, Role, StructuredMode, Usage};

/// One text, or several, that a prompt must (or must not) contain.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(untagged)]
pub enum Texts {
    /// None given.
    #[default]
    None,
    /// One text.
    One(String),
    /// Several texts.
    All(Vec<String>),
}

impl Texts {
    fn iter(&self) -> impl Iterator<Item = &str> {
        let texts: &[String] = match self {
            Self::None => &[],
            Self::One(one) => std::slice::from_ref(one),
            Self::All(all) => all,
        };
        texts.iter().map(String::as_str)
    }
}

/// One scripted answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ReplayEntry {
    /// Answered in turn.
    Text(String),
    /// Answered when the user messages contain every text of `match` and
    /// none of `unless` (or in turn without either).
    Scripted {
        /// Text (or texts, all of them) of the user messages that select this answer.
        #[serde(default, rename = "match")]
        matches: Texts,
        /// Text (or texts) that rule this answer out when any appears.
        #[serde(default)]
        unless: Texts,
        /// The answer.
        text: String,
        /// Serve it every time it matches instead of once.
        #[serde(default)]
        repeat: bool,
    },
}

impl ReplayEntry {
    /// Whether the entry answers `prompt`.
    fn fits(&self, prompt: &str) -> bool {
        match self {
            Self::Text(_) => true,
            Self::Scripted { matches, unless, .. } => {
                matches.iter().all(|m| prompt.contains(m)) && !unless.iter().any(|u| prompt.contains(u))
            }
        }
    }

    fn text(&self) -> &str {
        match self {
            Self::Text(text) | Self::Scripted { text, .. } => text,
        }
    }

    fn repeats(&self) -> bool {
        matches!(self, Self::Scripted { repeat: true, .. })
    }
}

/// Scripted completions from a JSON file: an array of entries (strings, or
/// objects with `text` and optional `match` and `repeat`).
pub struct ReplayProvider {
    source: PathBuf,
    entries: Vec<ReplayEntry>,
    used: Mutex<Vec<bool>>,
}

impl ReplayProvider {
    /// Loads a script file.
    pub fn from_file(path: &Path) -> Result<Self, LlmError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| LlmError::Config(format!("cannot read replay script {}: {e}", path.display())))?;
        let entries: Vec<ReplayEntry> = serde_json::from_str(&text).map_err(|e| {
            LlmError::Config(format!("replay script {} is not a JSON array of answers: {e}", path.display()))
        })?;
        Ok(Self::new(path.to_owned(), entries))
    }

    /// A provider over entries held in memory (`source` names them in logs).
    pub fn new(source: PathBuf, entries: Vec<ReplayEntry>) -> Self {
        tracing::warn!(source = %source.display(), answers = entries.len(), "replay LLM provider: answers are scripted, no model is called");
        let used = Mutex::new(vec![false; entries.len()]);
        Self { source, entries, used }
    }
}

#[async_trait]
impl LlmProvider for ReplayProvider {
    fn name(&self) -> &str {
        "replay"
    }

    fn model(&self) -> &str {
        "replay"
    }

    fn structured_mode(&self) -> Option<StructuredMode> {
        None
    }

    async fn generate(&self, request: &CompletionRequest, on_text: OnText<'_>) -> Result<Completion, LlmError> {
        let started = Instant::now();
        let prompt: String = request
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let mut used = self.used.lock().map_err(|_| LlmError::Config("replay state poisoned".into()))?;
        let pick =
            self.entries.iter().enumerate().find(|(i, entry)| (entry.repeats() || !used[*i]) && entry.fits(&prompt));
        let Some((i, entry)) = pick else {
            return Err(LlmError::InvalidResponse(format!(
                "replay script {} has no answer left for this request",
                self.source.display()
            )));
        };
        used[i] = true;
        let text = entry.text();
        // Streamed a word at a time, like a model, so that streaming clients
        // show it arriving.
        if let Some(on_text) = on_text {
            for piece in text.split_inclusive(' ') {
                on_text(piece);
            }
        }
        Ok(Completion {
            text: text.to_owned(),
            provider: "replay".into(),
            model: "replay".into(),
            structured_mode: None,
            usage: Usage::default(),
            latency: started.elapsed(),
            truncated: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    fn ask(p: &ReplayProvider, text: &str) -> Result<String, LlmError> {
        let request = CompletionRequest { messages: vec![Message::user(text)], ..Default::default() };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| LlmError::Config(e.to_string()))?
            .block_on(p.complete(&request))
            .map(|c| c.text)
    }

    #[test]
    fn answers_in_turn_by_match_and_says_when_exhausted() {
        let entries: Vec<ReplayEntry> = serde_json::from_str(
            r#"["first", {"match": "weather", "text": "sunny", "repeat": true}, {"text": "second"}]"#,
        )
        .unwrap();
        let p = ReplayProvider::new("inline".into(), entries);
        assert_eq!(ask(&p, "weather in Chicago").unwrap(), "first");
        assert_eq!(ask(&p, "weather in Chicago").unwrap(), "sunny");
        assert_eq!(ask(&p, "weather again").unwrap(), "sunny");
        assert_eq!(ask(&p, "something else").unwrap(), "second");
        let err = ask(&p, "more").unwrap_err().to_string();
        assert!(err.contains("no answer left"), "{err}");
    }

    #[test]
    fn matches_every_text_and_none_it_must_not() {
        let entries: Vec<ReplayEntry> = serde_json::from_str(
            r#"[{"match": ["review", "Chicago"], "unless": ") failed", "text": "achieved", "repeat": true},
                {"match": "review", "unless": ["nothing", "never"], "text": "not achieved", "repeat": true}]"#,
        )
        .unwrap();
        let p = ReplayProvider::new("inline".into(), entries);
        assert_eq!(ask(&p, "review: weather in Chicago, s1 succeeded").unwrap(), "achieved");
        assert_eq!(ask(&p, "review: weather in Chicago, s1 (weather) failed").unwrap(), "not achieved");
        assert_eq!(ask(&p, "review: weather in Tokyo").unwrap(), "not achieved");
        assert!(ask(&p, "review: nothing").is_err());
    }

    #[test]
    fn streams_a_word_at_a_time() {
        let p = ReplayProvider::new("inline".into(), vec![ReplayEntry::Text("It is 21 °C in Chicago.".into())]);
        let request = CompletionRequest { messages: vec![Message::user("weather")], ..Default::default() };
        let mut pieces = Vec::new();
        let completion = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(p.stream(&request, &mut |t: &str| pieces.push(t.to_owned())))
            .unwrap();
        assert_eq!(pieces, ["It ", "is ", "21 ", "°C ", "in ", "Chicago."]);
        assert_eq!(completion.text, pieces.concat());
    }
}
