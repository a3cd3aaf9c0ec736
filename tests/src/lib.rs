//! The whole mesh for end-to-end tests: discovery, planner, executor,
//! synthesis and the gateway, each a real server on its own ephemeral port,
//! sharing one database; a scripted LLM server behind the planner and
//! synthesis; agents registered over REST. Everything stops when dropped.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::net::SocketAddr;
use std::time::Duration;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_executor::ExecutorConfig;
use agentmesh_gateway::GatewayConfig;
use agentmesh_planner::PlannerConfig;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_proto::v1::gateway_service_client::GatewayServiceClient;
use agentmesh_synthesis::SynthesisConfig;
use agentmesh_testkit::{
    Backend, RunningService, ScriptedLlmServer, ScriptedReply, TestDatabase, bind_local, spawn_discovery,
};
use serde_json::Value;
use tokio::task::JoinHandle;

/// A server task of the mesh, aborted when dropped.
struct Task(JoinHandle<anyhow::Result<()>>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The running mesh.
pub struct Mesh {
    /// Discovery.
    pub discovery: RunningService,
    /// The LLM server behind the planner and synthesis.
    pub llm: ScriptedLlmServer,
    /// The planner's address.
    pub planner: SocketAddr,
    /// The executor's address.
    pub executor: SocketAddr,
    /// The gateway's address.
    pub gateway: SocketAddr,
    tasks: Vec<Task>,
    _db: TestDatabase,
    /// The operator token registrations are made with, when authentication is on.
    operator_token: Option<String>,
}

/// How to start the mesh.
#[derive(Default)]
pub struct Options {
    /// The planner's address for the gateway, instead of the real one (to
    /// test a planner that is down).
    pub planner_url: Option<String>,
    /// The gateway's `resume_grace_secs`.
    pub resume_grace_secs: Option<f64>,
    /// A real model server (OpenAI-compatible base URL and model) instead
    /// of the scripted one, with limits that suit a small local model.
    pub real_llm: Option<(String, String)>,
    /// Authentication on every service: the tokens file, the token the
    /// services call each other with (listed there as `service`), and an
    /// operator's token (for registrations).
    pub auth: Option<(std::path::PathBuf, String, String)>,
    /// Discovery's `heartbeat_interval_secs` (default 10).
    pub heartbeat_interval_secs: Option<f64>,
    /// Offer the catalog's capabilities as tools on the gateway's `/mcp`.
    pub mcp_capability_tools: bool,
}

async fn spawn<F>(serve: impl FnOnce(tokio::net::TcpListener) -> F) -> (SocketAddr, Task)
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let listener = bind_local().await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(serve(listener));
    let http = agentmesh_testkit::http_client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while http.get(format!("http://{addr}/healthz")).send().await.is_err() {
        assert!(!task.is_finished(), "a service exited at start: {:?}", task.await);
        assert!(tokio::time::Instant::now() < deadline, "a service did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (addr, Task(task))
}

impl Mesh {
    /// Starts the mesh with an LLM server answering `replies` in order
    /// (planner and synthesis calls alike); `None` when PostgreSQL is
    /// wanted but unavailable outside CI.
    pub async fn start(backend: Backend, replies: Vec<ScriptedReply>, options: Options) -> Option<Self> {
        agentmesh_testkit::init_tracing();
        let db = TestDatabase::new(backend).await?;
        let secure = |service: &mut agentmesh_server::ServiceSettings| {
            if let Some((tokens, token, _)) = &options.auth {
                service.auth_tokens_file = Some(tokens.clone());
                service.auth_token = Some(token.clone());
            }
        };
        let mut discovery_config = DiscoveryConfig::with_database_url(db.url.clone());
        if let Some(interval) = options.heartbeat_interval_secs {
            discovery_config.heartbeat_interval_secs = interval;
        }
        secure(&mut discovery_config.service);
        let discovery = spawn_discovery(discovery_config).await.unwrap();
        let llm = ScriptedLlmServer::start(replies).await.unwrap();
        let pending = std::future::pending::<()>;
        let (base, model, structured, timeout) = match &options.real_llm {
            Some((base, model)) => (base.clone(), model.clone(), "auto", 300),
            None => (llm.url(), "scripted-model".to_owned(), "json_schema", 60),
        };
        let mut planner_config = PlannerConfig {
            discovery_url: discovery.url(),
            llm: agentmesh_planner::LlmSettings {
                llm: format!("openai:{model}"),
                llm_base_url: Some(base.clone()),
                llm_structured: structured.into(),
                llm_timeout_secs: timeout,
                llm_retries: 0,
                ..PlannerConfig::default().llm
            },
            // Scripted models answer scripted plans: ranking by meaning is
            // for the real one (its gate would answer some requests itself).
            embeddings: if options.real_llm.is_some() { "local".into() } else { "none".into() },
            ..PlannerConfig::with_database_url(db.url.clone())
        };
        secure(&mut planner_config.service);
        let (planner, planner_task) =
            spawn(|l| agentmesh_planner::serve_with_listener(planner_config, l, pending())).await;
        let mut executor_config = ExecutorConfig {
            discovery_url: discovery.url(),
            planner_url: Some(format!("http://{planner}")),
            retry_base_ms: 20,
            retry_max_ms: 200,
            ..ExecutorConfig::with_database_url(db.url.clone())
        };
        secure(&mut executor_config.service);
        let (executor, executor_task) =
            spawn(|l| agentmesh_executor::serve_with_listener(executor_config, l, pending())).await;
        let mut synthesis_config = SynthesisConfig {
            discovery_url: discovery.url(),
            llm: agentmesh_synthesis::LlmSettings {
                llm: format!("openai:{model}"),
                llm_base_url: Some(base),
                llm_structured: structured.into(),
                llm_timeout_secs: timeout,
                llm_retries: 0,
                ..SynthesisConfig::default().llm
            },
            ..SynthesisConfig::with_database_url(db.url.clone())
        };
        if options.real_llm.is_some() {
            synthesis_config.answer_max_tokens = 160;
            synthesis_config.review_max_tokens = 300;
            // A 135M model does not keep to the results: answers it invents are replaced.
            synthesis_config.replace_ungrounded_answers = true;
        }
        secure(&mut synthesis_config.service);
        let (synthesis, synthesis_task) =
            spawn(|l| agentmesh_synthesis::serve_with_listener(synthesis_config, l, pending())).await;
        let mut gateway_config = GatewayConfig {
            planner_url: options.planner_url.unwrap_or_else(|| format!("http://{planner}")),
            executor_url: format!("http://{executor}"),
            synthesis_url: format!("http://{synthesis}"),
            resume_grace_secs: options.resume_grace_secs.unwrap_or(30.0),
            discovery_url: discovery.url(),
            mcp_capability_tools: options.mcp_capability_tools,
            ..GatewayConfig::with_database_url(db.url.clone())
        };
        secure(&mut gateway_config.service);
        let (gateway, gateway_task) =
            spawn(|l| agentmesh_gateway::serve_with_listener(gateway_config, l, pending())).await;
        Some(Self {
            discovery,
            llm,
            planner,
            executor,
            gateway,
            tasks: vec![planner_task, executor_task, synthesis_task, gateway_task],
            _db: db,
            operator_token: options.auth.map(|(_, _, operator)| operator),
        })
    }

    /// Registers an agent with discovery over REST.
    pub async fn register(&self, registration: &Value) {
        let mut request =
            agentmesh_testkit::http_client().post(format!("{}/api/v1/agents", self.discovery.url())).json(registration);
        if let Some(token) = &self.operator_token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.text().await.unwrap_or_default());
    }

    /// A gRPC client of the gateway.
    pub async fn gateway(&self) -> GatewayServiceClient<tonic::transport::Channel> {
        GatewayServiceClient::connect(format!("http://{}", self.gateway)).await.unwrap()
    }

    /// A gRPC client of the executor.
    pub async fn executor(&self) -> ExecutorServiceClient<tonic::transport::Channel> {
        ExecutorServiceClient::connect(format!("http://{}", self.executor)).await.unwrap()
    }

    /// Orchestrates `query` over gRPC and collects every message.
    pub async fn orchestrate(&self, query: &str) -> Vec<pb::OrchestrateResponse> {
        let mut client = self.gateway().await;
        let mut stream = client
            .orchestrate(pb::OrchestrateRequest { query: query.into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        let mut messages = Vec::new();
        while let Some(m) = stream.message().await.unwrap() {
            messages.push(m);
        }
        messages
    }

    /// How many servers of the mesh are running.
    pub fn running(&self) -> usize {
        self.tasks.iter().filter(|t| !t.0.is_finished()).count()
    }

    /// An agent as discovery's REST API shows it.
    pub async fn agent(&self, id: &str) -> Value {
        let response = agentmesh_testkit::http_client()
            .get(format!("{}/api/v1/agents/{id}", self.discovery.url()))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.json().await.unwrap()
    }
}

/// Tokens of a mesh with authentication on: the services', an operator's
/// and two clients' (`shop` and `billing`), written to a tokens file.
pub struct Tokens {
    /// Options starting the mesh with them.
    pub options: Options,
    /// The client `shop`'s token.
    pub shop: String,
    /// The client `billing`'s token.
    pub billing: String,
    /// The operator's token.
    pub operator: String,
}

impl Tokens {
    /// Tokens named after `tag` (one per test).
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("agentmesh-{tag}-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tokens.toml");
        let [service, operator, shop, billing] = ["svc", "op", "shop", "billing"].map(|who| format!("{who}-tok-{tag}"));
        let entries = [
            ("mesh", "service", service.as_str()),
            ("ops", "operator", operator.as_str()),
            ("shop", "client", shop.as_str()),
            ("billing", "client", billing.as_str()),
        ];
        agentmesh_testkit::write_tokens_file(&file, &entries).unwrap();
        let options = Options { auth: Some((file, service, operator.clone())), ..Options::default() };
        Self { options, shop, billing, operator }
    }
}

/// The executor's events among an orchestration's messages.
pub fn execution_events(messages: &[pb::OrchestrateResponse]) -> Vec<&pb::ExecutionEvent> {
    messages
        .iter()
        .filter_map(|m| match &m.event {
            Some(pb::orchestrate_response::Event::ExecutionEvent(e)) => Some(e),
            _ => None,
        })
        .collect()
}

/// A step's output, or its error, from an orchestration's messages.
pub fn outcome(messages: &[pb::OrchestrateResponse], step: &str) -> Result<Value, String> {
    let events = execution_events(messages);
    let last = events
        .iter()
        .rev()
        .find(|e| {
            e.step_id == step
                && [pb::ExecutionEventKind::StepSucceeded, pb::ExecutionEventKind::StepFailed]
                    .contains(&pb::ExecutionEventKind::try_from(e.kind).unwrap_or_default())
        })
        .unwrap_or_else(|| panic!("{step} did not finish: {:?}", messages.iter().map(kind).collect::<Vec<_>>()));
    match &last.output {
        Some(output) if last.kind == pb::ExecutionEventKind::StepSucceeded as i32 => {
            Ok(agentmesh_proto::json::from_value(output))
        }
        _ => Err(last.error.clone()),
    }
}

/// The kind of a message, as in the SSE `event:` field.
pub fn kind(m: &pb::OrchestrateResponse) -> String {
    use pb::orchestrate_response::Event;
    match &m.event {
        Some(Event::PlanCreated(_)) => "plan_created".into(),
        Some(Event::ExecutionEvent(e)) => format!(
            "execution:{}",
            pb::ExecutionEventKind::try_from(e.kind)
                .unwrap_or_default()
                .as_str_name()
                .trim_start_matches("EXECUTION_EVENT_KIND_")
                .to_ascii_lowercase()
        ),
        Some(Event::SynthesisChunk(_)) => "synthesis_chunk".into(),
        Some(Event::Review(_)) => "review".into(),
        Some(Event::FinalAnswer(_)) => "final_answer".into(),
        Some(Event::Error(_)) => "error".into(),
        None => "none".into(),
    }
}
