//! An agentmesh agent in a few lines.
//!
//! An agent is a service that registers its capabilities with discovery
//! and answers the executor's calls. This crate does the contract of
//! `docs/agents.md` for you: the input and output schemas come from your
//! Rust types, the capabilities are served over HTTP (or gRPC), the agent
//! registers with discovery, heartbeats, registers again if discovery
//! forgot it, and deregisters when stopped. Each call runs in a span that
//! continues the caller's trace, with the request id, execution, step,
//! attempt and idempotency key at hand; a repeated call (the same
//! idempotency key) gets the first successful answer again.
//!
//! ```no_run
//! use agentmesh_agent::{Agent, AgentError, Call, Options};
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Where {
//!     /// A city name.
//!     location: String,
//! }
//!
//! #[derive(Serialize, JsonSchema)]
//! struct Weather {
//!     temp_c: f64,
//!     conditions: String,
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), agentmesh_agent::SdkError> {
//!     Agent::new("weather")
//!         .skill("get_current_weather", "Current weather for a city", |_call: Call, input: Where| async move {
//!             if input.location.is_empty() {
//!                 return Err(AgentError::new("no location given"));
//!             }
//!             Ok(Weather { temp_c: 21.5, conditions: "clear".into() })
//!         })
//!         // Discovery at AGENTMESH_DISCOVERY_URL (default http://127.0.0.1:7400),
//!         // listening on AGENTMESH_AGENT_LISTEN (default 127.0.0.1:0).
//!         .serve(Options::from_env())
//!         .await
//! }
//! ```
//!
//! A handler may ask for another agent's help with
//! [`Call::collaborate`]; it answers [`AgentError::retryable`] for a
//! failure that may pass and [`AgentError::new`] for one that will not.

mod capability;
mod grpc;
mod http;
mod registration;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A `reqwest::ClientBuilder` with HTTPS ready (for handlers that call
/// other services).
pub use agentmesh_telemetry::http::client_builder as http_client_builder;
pub use capability::{AgentError, Call, Capability, Collaboration, Kind, output_schema_for, schema_for};
use capability::{Outcome, Outcome::Done};

/// How the executor reaches the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// JSON over HTTP: `POST /skills/{id}` and `POST /reasoners/{id}`.
    #[default]
    Http,
    /// gRPC: `agentmesh.v1.AgentService/Invoke`.
    Grpc,
}

/// Why an agent could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// Discovery could not be reached or refused the registration.
    #[error("{0}")]
    Discovery(String),
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The agent's definition is not usable.
    #[error("{0}")]
    Definition(String),
}

/// Where the agent listens and registers.
#[derive(Clone)]
pub struct Options {
    /// Discovery's base URL, e.g. `http://127.0.0.1:7400`.
    pub discovery_url: String,
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// The URL the executor should call, when it is not the listening
    /// address (behind a proxy, in a container); default
    /// `http://{listen address}`.
    pub advertise_url: Option<String>,
    /// Register with discovery (and heartbeat, and deregister when
    /// stopped); `false` only serves, for a registration made elsewhere.
    pub register: bool,
    /// The bearer token sent to discovery, when discovery requires one (a
    /// token with the role `agent:<this agent's id>`).
    pub token: Option<String>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("discovery_url", &self.discovery_url)
            .field("listen", &self.listen)
            .field("advertise_url", &self.advertise_url)
            .field("register", &self.register)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            discovery_url: "http://127.0.0.1:7400".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise_url: None,
            register: true,
            token: None,
        }
    }
}

impl Options {
    /// Options for discovery at `discovery_url`, listening on a free local port.
    pub fn discovery(discovery_url: impl Into<String>) -> Self {
        Self { discovery_url: discovery_url.into(), ..Self::default() }
    }

    /// The defaults, overridden by `AGENTMESH_DISCOVERY_URL` (the variable
    /// the `agentmesh` CLI reads too), `AGENTMESH_AGENT_LISTEN` (an
    /// `IP:PORT`), `AGENTMESH_AGENT_URL` and `AGENTMESH_AGENT_TOKEN`.
    /// A listening address that does not parse is reported and the default
    /// kept.
    pub fn from_env() -> Self {
        let mut options = Self::default();
        if let Ok(url) = std::env::var("AGENTMESH_DISCOVERY_URL")
            && !url.trim().is_empty()
        {
            options.discovery_url = url.trim().to_owned();
        }
        if let Ok(listen) = std::env::var("AGENTMESH_AGENT_LISTEN") {
            match listen.trim().parse() {
                Ok(addr) => options.listen = addr,
                Err(e) => tracing::warn!(%listen, error = %e, "AGENTMESH_AGENT_LISTEN is not an IP:PORT; ignored"),
            }
        }
        if let Ok(url) = std::env::var("AGENTMESH_AGENT_URL")
            && !url.trim().is_empty()
        {
            options.advertise_url = Some(url.trim().to_owned());
        }
        if let Ok(token) = std::env::var("AGENTMESH_AGENT_TOKEN")
            && !token.trim().is_empty()
        {
            options.token = Some(token.trim().to_owned());
        }
        options
    }
}

/// An agent: an id and its capabilities. Build it, then [`Agent::serve`]
/// (until Ctrl-C or SIGTERM) or [`Agent::start`] (for a handle).
#[derive(Debug, Clone)]
pub struct Agent {
    id: String,
    version: String,
    tags: Vec<String>,
    transport: Transport,
    heartbeat: Option<Duration>,
    capabilities: Vec<Capability>,
    credential: Option<(String, Secret)>,
}

/// A secret the agent expects, never shown by `Debug`.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Agent {
    /// An agent with this id (unique in the mesh; registering the same id
    /// again replaces the registration).
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            version: String::new(),
            tags: Vec::new(),
            transport: Transport::Http,
            heartbeat: None,
            capabilities: Vec::new(),
            credential: None,
        }
    }

    /// Accepts only calls that carry `authorization: Bearer <secret>`
    /// (HTTP header or gRPC metadata), and registers naming the credential
    /// `name`: the executor's `agent_credentials_file` holds the same
    /// secret under that name and presents it. Other calls are refused
    /// with 401 / `UNAUTHENTICATED`.
    #[must_use]
    pub fn credential(mut self, name: impl Into<String>, secret: impl Into<String>) -> Self {
        self.credential = Some((name.into(), Secret(secret.into())));
        self
    }

    /// The agent's version, free-form.
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Agent-level tags.
    #[must_use]
    pub fn tags<S: Into<String>>(mut self, tags: impl IntoIterator<Item = S>) -> Self {
        self.tags.extend(tags.into_iter().map(Into::into));
        self
    }

    /// Serve over gRPC (`agentmesh.v1.AgentService`) instead of HTTP.
    #[must_use]
    pub fn grpc(mut self) -> Self {
        self.transport = Transport::Grpc;
        self
    }

    /// Time between heartbeats. By default the agent follows the interval
    /// discovery answers the registration with (10 s unless configured).
    #[must_use]
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat = Some(interval);
        self
    }

    /// Adds a skill (see [`Capability::skill`]).
    #[must_use]
    pub fn skill<I, O, F, Fut>(self, id: impl Into<String>, description: impl Into<String>, handler: F) -> Self
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(Call, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, AgentError>> + Send + 'static,
    {
        self.capability(Capability::skill(id, description, handler))
    }

    /// Adds a reasoner (see [`Capability::reasoner`]).
    #[must_use]
    pub fn reasoner<I, O, F, Fut>(self, id: impl Into<String>, description: impl Into<String>, handler: F) -> Self
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(Call, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, AgentError>> + Send + 'static,
    {
        self.capability(Capability::reasoner(id, description, handler))
    }

    /// Adds a capability built with [`Capability`] (for tags, `internal`
    /// or hints such as `destructive`).
    #[must_use]
    pub fn capability(mut self, capability: Capability) -> Self {
        self.capabilities.push(capability);
        self
    }

    /// The agent's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The registration document for `POST /api/v1/agents`, with the
    /// executor calling `base_url`.
    pub fn registration(&self, base_url: &str) -> Value {
        let of_kind = |kind: Kind| -> Vec<Value> {
            self.capabilities.iter().filter(|c| c.kind == kind).map(Capability::registration).collect()
        };
        let mut registration = json!({
            "id": self.id,
            "base_url": base_url,
            "transport": match self.transport { Transport::Http => "http", Transport::Grpc => "grpc" },
            "version": self.version,
            "deployment_type": "long_running",
            "tags": self.tags,
            "skills": of_kind(Kind::Skill),
            "reasoners": of_kind(Kind::Reasoner),
        });
        if let Some((name, _)) = &self.credential {
            registration["credential"] = json!(name);
        }
        registration
    }

    fn check(&self) -> Result<(), SdkError> {
        if self.id.trim().is_empty() {
            return Err(SdkError::Definition("an agent needs an id".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &self.capabilities {
            if !seen.insert(c.id.as_str()) {
                return Err(SdkError::Definition(format!(
                    "agent {}: capability `{}` is defined twice (ids are unique across skills and reasoners)",
                    self.id, c.id
                )));
            }
        }
        Ok(())
    }

    /// Starts serving, registers with discovery and heartbeats in the
    /// background; the handle stops it all and deregisters. Fails, serving
    /// nothing, when discovery cannot be reached or refuses the agent.
    pub async fn start(self, options: Options) -> Result<RunningAgent, SdkError> {
        self.check()?;
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|source| SdkError::Listen { addr: options.listen, source })?;
        let addr = listener.local_addr().map_err(|source| SdkError::Listen { addr: options.listen, source })?;
        let base_url = options.advertise_url.clone().unwrap_or_else(|| format!("http://{addr}"));
        let registration = self.registration(&base_url);
        let discovery = if options.register {
            Some(registration::Discovery::new(&options.discovery_url, &self.id, options.token.as_deref())?)
        } else {
            None
        };
        // Serving first, so that the executor can call the agent the
        // moment discovery lists it.
        let (stop, stopped) = watch::channel(false);
        let server = Arc::new(Server::new(&self));
        let serving = match self.transport {
            Transport::Http => tokio::spawn(http::serve(server, listener, until(stopped.clone()))),
            Transport::Grpc => tokio::spawn(grpc::serve(server, listener, until(stopped.clone()))),
        };
        let Some(discovery) = discovery else {
            let heartbeats = tokio::spawn(async {});
            return Ok(RunningAgent { id: self.id, addr, base_url, discovery: None, stop, serving, heartbeats });
        };
        if let Err(e) = discovery.register(&registration).await {
            let _ = stop.send(true);
            serving.abort();
            return Err(e);
        }
        tracing::info!(agent = %self.id, %base_url, discovery = %options.discovery_url, "agent registered");
        let heartbeats =
            tokio::spawn(discovery.clone().heartbeat_loop(registration, self.heartbeat, until(stopped.clone())));
        Ok(RunningAgent { id: self.id, addr, base_url, discovery: Some(discovery), stop, serving, heartbeats })
    }

    /// Starts (as [`Agent::start`]) and runs until Ctrl-C or SIGTERM, then
    /// deregisters. Logs and traces are set up first ([`init_telemetry`])
    /// unless the program has done it.
    pub async fn serve(self, options: Options) -> Result<(), SdkError> {
        let telemetry = init_telemetry(&self.id)?;
        let running = self.start(options).await?;
        eprintln!("agent {} serving at {}; Ctrl-C stops it", running.id, running.base_url);
        shutdown_signal().await;
        let stopped = running.stop().await;
        if let Some(telemetry) = telemetry {
            telemetry.shutdown().await;
        }
        stopped
    }
}

async fn until(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// Sets up logs (`RUST_LOG`, INFO by default) and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` names a collector, traces exported over
/// OTLP with the W3C propagator, so that each call's `agent.call` span
/// continues the caller's trace. `None` when the program set up `tracing`
/// already (then it owns both). Shut the handle down before exiting so
/// that the last spans are sent.
pub fn init_telemetry(service_name: &str) -> Result<Option<agentmesh_telemetry::Telemetry>, SdkError> {
    if tracing::dispatcher::has_been_set() {
        return Ok(None);
    }
    let config = agentmesh_telemetry::TelemetryConfig::default();
    agentmesh_telemetry::init(service_name, &config)
        .map(Some)
        .map_err(|e| SdkError::Definition(format!("cannot set up logs and traces: {e:#}")))
}

/// Waits for Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// A running agent. [`RunningAgent::stop`] deregisters it and stops
/// serving; dropping it stops serving and heartbeats without deregistering
/// (discovery then sees it go quiet).
#[derive(Debug)]
pub struct RunningAgent {
    id: String,
    addr: SocketAddr,
    base_url: String,
    discovery: Option<registration::Discovery>,
    stop: watch::Sender<bool>,
    serving: JoinHandle<()>,
    heartbeats: JoinHandle<()>,
}

impl RunningAgent {
    /// The agent's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL it registered.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Deregisters from discovery, stops heartbeats, and stops serving
    /// once the calls in progress have answered.
    pub async fn stop(mut self) -> Result<(), SdkError> {
        let _ = self.stop.send(true);
        self.heartbeats.abort();
        let deregistered = match &self.discovery {
            Some(discovery) => discovery.deregister().await,
            None => Ok(()),
        };
        let _ = (&mut self.serving).await;
        deregistered
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.heartbeats.abort();
    }
}

/// How many answers are kept for repeated calls.
const REMEMBERED_ANSWERS: usize = 4096;

/// One idempotency key's answer: set once by the first call; a call with
/// the same key while it runs waits for it.
type Answer = Arc<tokio::sync::OnceCell<Outcome>>;

/// What the transports share: the capabilities by path, and the answers
/// given by idempotency key.
pub(crate) struct Server {
    agent_id: String,
    /// `Bearer <secret>`, when calls must carry it.
    expected_authorization: Option<String>,
    capabilities: HashMap<(Kind, String), Capability>,
    answers: Mutex<(HashMap<String, Answer>, VecDeque<String>)>,
}

impl Server {
    /// Whether a call with this `authorization` value may go on: always,
    /// unless the agent expects a credential. Compared in constant time.
    pub(crate) fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(expected) = &self.expected_authorization else { return true };
        let given = authorization.unwrap_or_default();
        given.len() == expected.len()
            && given.iter().zip(expected.as_bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    fn new(agent: &Agent) -> Self {
        Self {
            agent_id: agent.id.clone(),
            expected_authorization: agent.credential.as_ref().map(|(_, secret)| format!("Bearer {}", secret.0)),
            capabilities: agent.capabilities.iter().map(|c| ((c.kind, c.id.clone()), c.clone())).collect(),
            answers: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// The answer slot of `key`, made when it is new (the oldest forgotten
    /// beyond [`REMEMBERED_ANSWERS`]).
    fn answer_slot(&self, key: &str) -> Answer {
        let mut answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (by_key, order) = &mut *answers;
        if let Some(slot) = by_key.get(key) {
            return slot.clone();
        }
        let slot = Answer::default();
        by_key.insert(key.to_owned(), slot.clone());
        order.push_back(key.to_owned());
        while order.len() > REMEMBERED_ANSWERS {
            if let Some(oldest) = order.pop_front() {
                by_key.remove(&oldest);
            }
        }
        slot
    }

    fn forget(&self, key: &str) {
        let mut answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        answers.0.remove(key);
    }

    /// Runs a call of `kind`/`id` in a span continuing `parent` (the
    /// caller's trace context); `None` when no such capability exists. A
    /// call with an idempotency key already answered successfully gets that
    /// answer again without running the handler, and one arriving while the
    /// first still runs waits for it; a failed answer is not kept, so that
    /// a retry runs again.
    pub(crate) async fn call(
        &self,
        kind: Kind,
        id: &str,
        call: Call,
        parameters: Value,
        parent: opentelemetry::Context,
    ) -> Option<Outcome> {
        use tracing::Instrument as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;

        let capability = self
            .capabilities
            .get(&(kind, id.to_owned()))
            .or_else(|| self.capabilities.iter().find(|((_, c), _)| c == id).map(|(_, c)| c))?;
        let span = tracing::info_span!(
            "agent.call",
            otel.kind = "server",
            agent = %self.agent_id,
            capability = id,
            request_id = %call.request_id,
            execution_id = %call.execution_id,
            step_id = %call.step_id,
            attempt = call.attempt,
        );
        let _ = span.set_parent(parent);
        if call.idempotency_key.is_empty() {
            return Some(capability.run(call, parameters).instrument(span).await);
        }
        let key = format!("{}\n{id}", call.idempotency_key);
        let slot = self.answer_slot(&key);
        let mut ran = false;
        let outcome = slot
            .get_or_init(|| {
                ran = true;
                capability.run(call.clone(), parameters).instrument(span)
            })
            .await
            .clone();
        if !ran {
            tracing::debug!(capability = id, idempotency_key = %call.idempotency_key, "a repeated call: the first answer again");
        }
        if !matches!(outcome, Done { .. }) {
            self.forget(&key);
        }
        Some(outcome)
    }
}
