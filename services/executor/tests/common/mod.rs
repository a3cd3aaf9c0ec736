//! The executor's test harness: discovery and the executor on ephemeral
//! ports over one real database, agents as real HTTP servers, and helpers
//! to run plans and read their events.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_executor::ExecutorConfig;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_testkit::{Backend, RunningService, TestDatabase, bind_local, spawn_discovery};
use serde_json::Value;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// Discovery and an executor sharing a fresh database.
pub struct Mesh {
    pub discovery: RunningService,
    pub executor: SocketAddr,
    executor_task: tokio::task::JoinHandle<anyhow::Result<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub client: ExecutorServiceClient<Channel>,
    pub db: TestDatabase,
}

impl Drop for Mesh {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.executor_task.abort();
    }
}

/// Starts an executor with `config` on an ephemeral port; returns its address.
pub async fn spawn_executor(
    config: ExecutorConfig,
) -> (SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>, tokio::sync::oneshot::Sender<()>) {
    let listener = bind_local().await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agentmesh_executor::serve_with_listener(config, listener, async move {
        let _ = stopped.await;
    }));
    let http = agentmesh_testkit::http_client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while http.get(format!("http://{addr}/healthz")).send().await.is_err() {
        assert!(!task.is_finished(), "the executor exited at start");
        assert!(tokio::time::Instant::now() < deadline, "the executor did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (addr, task, stop)
}

impl Mesh {
    /// Starts the mesh; `None` when PostgreSQL is unavailable outside CI.
    pub async fn start(backend: Backend) -> Option<Self> {
        Self::start_with(backend, |_| {}).await
    }

    /// Like [`Mesh::start`], adjusting the executor's configuration first.
    pub async fn start_with(backend: Backend, adjust: impl FnOnce(&mut ExecutorConfig)) -> Option<Self> {
        Self::start_configured(backend, |_| {}, adjust).await
    }

    /// Like [`Mesh::start`], adjusting discovery's and the executor's
    /// configurations first.
    pub async fn start_configured(
        backend: Backend,
        adjust_discovery: impl FnOnce(&mut DiscoveryConfig),
        adjust: impl FnOnce(&mut ExecutorConfig),
    ) -> Option<Self> {
        agentmesh_testkit::init_tracing();
        let db = TestDatabase::new(backend).await?;
        let mut discovery_config = DiscoveryConfig::with_database_url(db.url.clone());
        adjust_discovery(&mut discovery_config);
        let discovery =
            spawn_discovery(discovery_config).await.unwrap_or_else(|e| panic!("discovery did not start: {e:#}"));
        let mut config = ExecutorConfig {
            discovery_url: discovery.url(),
            retry_base_ms: 20,
            retry_max_ms: 2_000,
            lease_secs: 2.0,
            ..ExecutorConfig::with_database_url(db.url.clone())
        };
        adjust(&mut config);
        let (executor, executor_task, stop) = spawn_executor(config).await;
        let client = ExecutorServiceClient::connect(format!("http://{executor}")).await.unwrap();
        Some(Self { discovery, executor, executor_task, stop: Some(stop), client, db })
    }

    /// Registers an agent with discovery over REST.
    pub async fn register(&self, registration: &Value) {
        let response = agentmesh_testkit::http_client()
            .post(format!("{}/api/v1/agents", self.discovery.url()))
            .json(registration)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.text().await.unwrap_or_default());
    }

    /// Removes an agent from discovery.
    pub async fn deregister(&self, id: &str) {
        let response = agentmesh_testkit::http_client()
            .delete(format!("{}/api/v1/agents/{id}", self.discovery.url()))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
    }

    /// Executes a plan (JSON in the plan format) and collects every event.
    pub async fn run(
        &self,
        plan: Value,
        options: pb::ExecutionOptions,
    ) -> Result<Vec<pb::ExecutionEvent>, tonic::Status> {
        self.run_request(request(plan, options)).await
    }

    /// Executes a request and collects every event until the stream ends.
    pub async fn run_request(&self, request: pb::ExecuteRequest) -> Result<Vec<pb::ExecutionEvent>, tonic::Status> {
        let mut client = self.client.clone();
        let mut stream = client.execute(request).await?.into_inner();
        let mut events = Vec::new();
        while let Some(item) = stream.next().await {
            events.push(item?.event.unwrap());
        }
        Ok(events)
    }

    /// The execution as the executor reports it.
    pub async fn get(&self, id: &str) -> pb::Execution {
        let mut client = self.client.clone();
        client
            .get_execution(pb::GetExecutionRequest { execution_id: id.into() })
            .await
            .unwrap()
            .into_inner()
            .execution
            .unwrap()
    }

    /// The executor's `/metrics`.
    pub async fn metrics(&self) -> String {
        agentmesh_testkit::http_client()
            .get(format!("http://{}/metrics", self.executor))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// An `ExecuteRequest` for a plan in the JSON plan format.
pub fn request(plan: Value, options: pb::ExecutionOptions) -> pb::ExecuteRequest {
    let plan: agentmesh_core::plan::Plan = serde_json::from_value(plan).unwrap();
    pb::ExecuteRequest {
        request_id: "req_test".into(),
        plan: Some(agentmesh_proto::convert::plan_to_pb(&plan)),
        options: Some(options),
        ..Default::default()
    }
}

/// A plan step in the JSON plan format.
pub fn step(id: &str, agent: &str, capability: &str, parameters: Value, depends_on: &[&str]) -> Value {
    serde_json::json!({"step_id": id, "agent": agent, "capability": capability, "instruction": format!("do {id}"),
        "parameters": parameters, "depends_on": depends_on})
}

/// A plan of these steps.
pub fn plan(steps: Vec<Value>) -> Value {
    serde_json::json!({"reasoning": "test", "steps": steps})
}

/// Event kinds, in order, as short names (`STEP_STARTED s1`).
pub fn kinds(events: &[pb::ExecutionEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let kind = pb::ExecutionEventKind::try_from(e.kind).map(|k| k.as_str_name()).unwrap_or("?");
            let kind = kind.trim_start_matches("EXECUTION_EVENT_KIND_");
            if e.step_id.is_empty() { kind.to_owned() } else { format!("{kind} {}", e.step_id) }
        })
        .collect()
}

/// The events of one kind.
pub fn of_kind(events: &[pb::ExecutionEvent], kind: pb::ExecutionEventKind) -> Vec<&pb::ExecutionEvent> {
    events.iter().filter(|e| e.kind == kind as i32).collect()
}

/// The single event of a kind for a step.
pub fn event_for<'a>(
    events: &'a [pb::ExecutionEvent],
    kind: pb::ExecutionEventKind,
    step: &str,
) -> &'a pb::ExecutionEvent {
    events
        .iter()
        .find(|e| e.kind == kind as i32 && e.step_id == step)
        .unwrap_or_else(|| panic!("no {kind:?} for {step} in {:?}", kinds(events)))
}

/// Options with every default but these.
pub fn options(max_retries: u32, step_timeout_ms: u64) -> pb::ExecutionOptions {
    pb::ExecutionOptions { max_retries: Some(max_retries), step_timeout_ms, ..Default::default() }
}

/// Sequence numbers are 1, 2, 3… without gaps, and the last event is final.
pub fn assert_complete_log(events: &[pb::ExecutionEvent]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.sequence, i as u64 + 1, "{:?}", kinds(events));
    }
    let last = events.last().map(|e| e.kind).unwrap_or_default();
    assert!(
        [
            pb::ExecutionEventKind::ExecutionCompleted as i32,
            pb::ExecutionEventKind::ExecutionFailed as i32,
            pb::ExecutionEventKind::ExecutionCancelled as i32
        ]
        .contains(&last),
        "{:?}",
        kinds(events)
    );
}

/// The output of a step, from its success event.
pub fn output(events: &[pb::ExecutionEvent], step: &str) -> Value {
    let event = event_for(events, pb::ExecutionEventKind::StepSucceeded, step);
    event.output.as_ref().map(agentmesh_proto::json::from_value).unwrap_or(Value::Null)
}
