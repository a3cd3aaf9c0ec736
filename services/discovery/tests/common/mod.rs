//! Shared helpers of the discovery integration tests: a real discovery
//! service on an ephemeral port over a real database, and a catalog fixture.

#![allow(dead_code)]

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{Backend, RunningService, TestDatabase, spawn_discovery};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A running discovery service and the database it owns.
pub struct Ctx {
    pub svc: RunningService,
    pub http: reqwest::Client,
    pub db: TestDatabase,
}

impl Ctx {
    /// Starts discovery on a fresh database; `None` when PostgreSQL is
    /// unavailable outside CI (the skip is reported).
    pub async fn start(backend: Backend) -> Option<Self> {
        Self::start_with(backend, |_| {}).await
    }

    /// Like [`Ctx::start`], adjusting the configuration first.
    pub async fn start_with(backend: Backend, adjust: impl FnOnce(&mut DiscoveryConfig)) -> Option<Self> {
        let db = TestDatabase::new(backend).await?;
        let mut config = DiscoveryConfig::with_database_url(db.url.clone());
        adjust(&mut config);
        let svc = spawn_discovery(config).await.unwrap_or_else(|e| panic!("discovery did not start: {e:#}"));
        Some(Self { svc, http: agentmesh_testkit::http_client(), db })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.svc.url())
    }

    /// GET, returning status and body (JSON when it parses, else a string).
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.http.get(self.url(path)).send().await.unwrap_or_else(|e| panic!("GET {path}: {e}"));
        read(response).await
    }

    /// GET the capability query with a query string, expecting 200 JSON.
    pub async fn discover(&self, query: &str) -> Value {
        let (status, body) = self.get(&format!("/api/v1/discovery/capabilities?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
        body
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let response =
            self.http.post(self.url(path)).json(body).send().await.unwrap_or_else(|e| panic!("POST {path}: {e}"));
        read(response).await
    }

    pub async fn delete(&self, path: &str) -> StatusCode {
        self.http.delete(self.url(path)).send().await.unwrap_or_else(|e| panic!("DELETE {path}: {e}")).status()
    }

    pub async fn register(&self, agent: &Value) {
        let (status, body) = self.post("/api/v1/agents", agent).await;
        assert!(status.is_success(), "registration failed: {status} {body}");
    }

    /// Registers the fixture catalog.
    pub async fn register_catalog(&self) {
        for agent in catalog() {
            self.register(&agent).await;
        }
    }

    /// The body of a GET of `path`, as text.
    pub async fn text(&self, path: &str) -> String {
        self.http.get(self.url(path)).send().await.unwrap_or_else(|e| panic!("{e}")).text().await.unwrap_or_default()
    }

    /// A counter or gauge from /metrics (summing over labels that match).
    pub async fn metric(&self, name_with_labels: &str) -> f64 {
        let text = self.text("/metrics").await;
        text.lines()
            .filter(|l| l.starts_with(name_with_labels))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    }
}

async fn read(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// `agent_id:capability` of every capability in a JSON discovery response.
pub fn targets(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for agent in body["capabilities"].as_array().into_iter().flatten() {
        for kind in ["reasoners", "skills"] {
            for cap in agent[kind].as_array().into_iter().flatten() {
                out.push(format!(
                    "{}:{}",
                    agent["agent_id"].as_str().unwrap_or_default(),
                    cap["id"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    out
}

/// Agent ids of a JSON discovery response.
pub fn agent_ids(body: &Value) -> Vec<String> {
    body["capabilities"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a["agent_id"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Three agents covering every filter of the PRD.
pub fn catalog() -> Vec<Value> {
    vec![
        json!({
            "id": "agent-research-001", "base_url": "http://agent-research:8080", "version": "2.3.1",
            "tags": ["research-team"],
            "reasoners": [
                {"id": "deep_research", "description": "Performs comprehensive research using multiple sources",
                 "tags": ["research", "ml", "synthesis"],
                 "input_schema": {"type": "object", "properties": {
                     "query": {"type": "string", "description": "Research query or topic"},
                     "depth": {"type": "integer", "minimum": 1, "maximum": 5, "default": 3, "description": "Research depth level"}},
                     "required": ["query"]},
                 "output_schema": {"type": "object", "properties": {"confidence": {"type": "number", "minimum": 0, "maximum": 1}}},
                 "examples": [{"name": "Basic research query", "input": {"query": "Latest advances in quantum computing", "depth": 3}}]},
                {"id": "web_researcher", "description": "Researches the web", "tags": ["research", "web"]}
            ],
            "skills": [
                {"id": "web_search", "description": "Search the web using multiple search engines", "tags": ["web", "search", "data"],
                 "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
                {"id": "orchestrate_natural", "description": "The orchestrator's own entry point", "tags": ["web"], "internal": true}
            ]
        }),
        json!({
            "id": "agent-ml-002", "base_url": "http://agent-ml:8080", "version": "1.0.0",
            "reasoners": [
                {"id": "research_agent", "description": "Agentic research", "tags": ["ml_vision"]},
                {"id": "summarize", "description": "Summaries", "tags": ["nlp"]}
            ],
            "skills": [
                {"id": "web_scraper", "description": "Scrapes pages", "tags": ["web", "mlops"]},
                {"id": "web_parser", "description": "Parses pages", "tags": ["web"]}
            ]
        }),
        json!({
            "id": "agent-data-003", "base_url": "http://agent-data:8080", "version": "0.9.0",
            "skills": [{"id": "get_current_weather", "description": "Current weather for a location", "tags": ["weather", "data"],
                        "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]
        }),
    ]
}
