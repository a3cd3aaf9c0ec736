//! The catalog's vectors for semantic pre-selection. Each capability is
//! embedded once per version (its name, agent and description: any change
//! is a new version) and kept while its agent is registered: a task follows
//! discovery's `WatchCatalog` stream, embedding agents as they register or
//! change and forgetting them when they leave, so that a request only
//! embeds itself. A capability the stream has not brought yet (or one whose
//! text changed) is embedded when a request first needs it.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentmesh_core::hybrid::capability_text;
use agentmesh_core::plan::AllowedCapability;
use agentmesh_llm::LlmError;
use agentmesh_llm::embeddings::{Embedder, similarity};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;

/// A capability's vector, and the version of its text it was made from.
struct Entry {
    version: u64,
    vector: Arc<[f32]>,
}

/// Vectors of the catalog, by agent and capability.
pub struct Semantic {
    embedder: Arc<dyn Embedder>,
    cache: Mutex<HashMap<(String, String), Entry>>,
}

fn version(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

impl Semantic {
    /// An empty index over `embedder`'s vectors.
    pub fn new(embedder: Arc<dyn Embedder>) -> Self {
        Self { embedder, cache: Mutex::new(HashMap::new()) }
    }

    /// The embedder's name (`local:all-MiniLM-L6-v2`).
    pub fn name(&self) -> &str {
        self.embedder.name()
    }

    /// Capabilities with a vector.
    pub fn len(&self) -> usize {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no capability has a vector yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Vectors of `catalog`, in order: those cached at the same version
    /// as is, the others embedded together and kept.
    pub async fn vectors(&self, catalog: &[AllowedCapability]) -> Result<Vec<Arc<[f32]>>, LlmError> {
        let texts: Vec<String> = catalog.iter().map(capability_text).collect();
        let versions: Vec<u64> = texts.iter().map(|t| version(t)).collect();
        let mut out: Vec<Option<Arc<[f32]>>> = {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            catalog
                .iter()
                .zip(&versions)
                .map(|(c, v)| {
                    cache
                        .get(&(c.agent.clone(), c.capability.clone()))
                        .filter(|e| e.version == *v)
                        .map(|e| e.vector.clone())
                })
                .collect()
        };
        let missing: Vec<usize> = (0..catalog.len()).filter(|&i| out[i].is_none()).collect();
        if !missing.is_empty() {
            let batch: Vec<String> = missing.iter().map(|&i| texts[i].clone()).collect();
            let vectors = self.embedder.embed(&batch).await?;
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            for (&i, vector) in missing.iter().zip(vectors) {
                let vector: Arc<[f32]> = vector.into();
                let c = &catalog[i];
                cache.insert(
                    (c.agent.clone(), c.capability.clone()),
                    Entry { version: versions[i], vector: vector.clone() },
                );
                out[i] = Some(vector);
            }
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// The cosine similarity of `query` with each capability of `catalog`.
    pub async fn similarities(&self, query: &str, catalog: &[AllowedCapability]) -> Result<Vec<f32>, LlmError> {
        let mut all = self.similarities_of(&[query.to_owned()], catalog).await?;
        all.pop().ok_or_else(|| LlmError::InvalidResponse("no vector for the request".into()))
    }

    /// For each of `texts`, its cosine similarity with each capability of
    /// `catalog` (the texts embedded together).
    pub async fn similarities_of(
        &self,
        texts: &[String],
        catalog: &[AllowedCapability],
    ) -> Result<Vec<Vec<f32>>, LlmError> {
        let vectors = self.vectors(catalog).await?;
        let queries = self.embedder.embed(texts).await?;
        if queries.len() != texts.len() {
            return Err(LlmError::InvalidResponse(format!("{} vectors for {} texts", queries.len(), texts.len())));
        }
        Ok(queries.iter().map(|q| vectors.iter().map(|v| similarity(q, v)).collect()).collect())
    }

    /// Drops an agent's vectors (it left the catalog).
    pub fn forget(&self, agent: &str) {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner).retain(|(a, _), _| a != agent);
    }

    /// Embeds a registered agent's capabilities (the ones a plan may use),
    /// dropping those it no longer has.
    async fn learn(&self, agent: &pb::Agent) -> Result<(), LlmError> {
        let capabilities: Vec<AllowedCapability> = agentmesh_catalog::plannable(agent).collect();
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(a, c), _| a != &agent.id || capabilities.iter().any(|k| &k.capability == c));
        self.vectors(&capabilities).await.map(drop)
    }

    /// Follows discovery's catalog changes until the process ends,
    /// reconnecting after a broken stream (with a growing pause, at most
    /// 30 s).
    pub async fn follow(self: Arc<Self>, discovery: DiscoveryServiceClient<TracedChannel>) {
        let mut pause = Duration::from_millis(500);
        loop {
            let mut request = tonic::Request::new(pb::WatchCatalogRequest { include_snapshot: true });
            request.set_timeout(Duration::from_secs(365 * 24 * 3600));
            match discovery.clone().watch_catalog(request).await {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    loop {
                        match stream.message().await {
                            Ok(Some(event)) => {
                                pause = Duration::from_millis(500);
                                self.apply(event).await;
                            }
                            Ok(None) => break,
                            Err(status) => {
                                tracing::debug!(error = %status.message(), "the catalog stream broke; following it again");
                                break;
                            }
                        }
                    }
                }
                Err(status) => {
                    tracing::debug!(error = %status.message(), "cannot follow the catalog yet; the vectors are made on demand meanwhile");
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
    }

    async fn apply(&self, event: pb::WatchCatalogResponse) {
        match pb::CatalogEventKind::try_from(event.kind).unwrap_or_default() {
            pb::CatalogEventKind::Deregistered => self.forget(&event.agent_id),
            pb::CatalogEventKind::Registered | pb::CatalogEventKind::Updated => {
                if let Some(agent) = &event.agent
                    && let Err(e) = self.learn(agent).await
                {
                    tracing::warn!(agent = %agent.id, error = %e, "embedding an agent's capabilities failed; retried when a request needs them");
                }
            }
            _ => {}
        }
    }
}
