//! A stdio MCP server offered over streamable HTTP, so that discovery and
//! the executor reach it like any MCP server. The child process runs under
//! supervision: when it exits it is started again after a pause that
//! doubles from 1 s up to 30 s (back to 1 s once a start has lasted a
//! minute), and every client is told its tool list may have changed.
//!
//! [`serve_stdio`] is the same proxy the other way round: an MCP server on
//! this process's stdin and stdout whose every request goes to an MCP
//! server over streamable HTTP (`agentmesh mcp-stdio` in front of the
//! gateway's `/mcp`), for MCP clients that launch a program.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, Peer, ServerHandler};
use tokio::sync::{RwLock, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::{CallError, Error, Session};

/// An error saying the upstream server could not answer, and whether the
/// call may have reached it: `data` is `{"retryable": true, "ambiguous":
/// …}`, which the executor reads ([`retry_marks`]).
fn unavailable(message: impl Into<String>, ambiguous: bool) -> ErrorData {
    ErrorData::internal_error(message.into(), Some(serde_json::json!({"retryable": true, "ambiguous": ambiguous})))
}

/// The marks [`unavailable`] puts on an error: `Some(ambiguous)` when the
/// call may be tried again.
pub fn retry_marks(error: &ErrorData) -> Option<bool> {
    let data = error.data.as_ref()?;
    (data.get("retryable")? == &serde_json::Value::Bool(true))
        .then(|| data.get("ambiguous").and_then(serde_json::Value::as_bool).unwrap_or(true))
}

/// The path the bridge serves MCP on.
pub const PATH: &str = "/mcp";

/// How long listing the child's tools may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// What to run and where to offer it.
#[derive(Debug, Clone)]
pub struct Options {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Where to listen (port 0 picks one).
    pub listen: SocketAddr,
    /// Host names (with or without port) clients may use besides the
    /// loopback ones, e.g. the host of the advertised URL.
    pub allowed_hosts: Vec<String>,
}

/// The server requests go to (a child process, or the server of
/// [`serve_stdio`]) and the clients to tell about it.
struct Upstream {
    command: Vec<String>,
    session: RwLock<Option<Arc<Session>>>,
    peers: Mutex<Vec<Peer<RoleServer>>>,
    list_changed: mpsc::Sender<()>,
    restarts: std::sync::atomic::AtomicU32,
}

impl Upstream {
    /// The upstream `session` (opened with `list_changed`), and the task
    /// passing the changes it announces on to every client.
    fn start(
        command: Vec<String>,
        session: Session,
        list_changed: mpsc::Sender<()>,
        mut changes: mpsc::Receiver<()>,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let upstream = Arc::new(Self {
            command,
            session: RwLock::new(Some(Arc::new(session))),
            peers: Mutex::new(Vec::new()),
            list_changed,
            restarts: std::sync::atomic::AtomicU32::new(0),
        });
        let announcing = upstream.clone();
        let forwarding = tokio::spawn(async move {
            while changes.recv().await.is_some() {
                announcing.announce().await;
            }
        });
        (upstream, forwarding)
    }

    async fn current(&self) -> Result<Arc<Session>, ErrorData> {
        self.session
            .read()
            .await
            .clone()
            .filter(|s| !s.is_closed())
            .ok_or_else(|| unavailable("the MCP server process is not running; it is being started again", false))
    }

    /// Whether the upstream server runs now.
    async fn running(&self) -> bool {
        self.session.read().await.as_ref().is_some_and(|s| !s.is_closed())
    }

    /// Tells every connected client that the tools may have changed.
    async fn announce(&self) {
        let peers: Vec<Peer<RoleServer>> = match self.peers.lock() {
            Ok(mut peers) => {
                peers.retain(|p| !p.is_transport_closed());
                peers.clone()
            }
            Err(_) => return,
        };
        for peer in peers {
            let _ = peer.notify_tool_list_changed().await;
        }
    }

    /// Starts the child again whenever it exits, until `stop`.
    async fn supervise(self: Arc<Self>, started: Instant, stop: CancellationToken) {
        let mut started = started;
        let mut pause = Duration::from_secs(1);
        loop {
            loop {
                let closed = self.session.read().await.as_ref().is_none_or(|s| s.is_closed());
                if closed {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    () = stop.cancelled() => return self.shut().await,
                }
            }
            if started.elapsed() >= Duration::from_secs(60) {
                pause = Duration::from_secs(1);
            }
            tracing::warn!(command = %self.command.join(" "), ?pause, "the MCP server exited; starting it again");
            self.session.write().await.take();
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stop.cancelled() => return,
            }
            pause = (pause * 2).min(Duration::from_secs(30));
            match Session::spawn(&self.command, Some(self.list_changed.clone())).await {
                Ok(session) => {
                    started = Instant::now();
                    *self.session.write().await = Some(Arc::new(session));
                    self.restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::info!(command = %self.command.join(" "), "the MCP server runs again");
                    self.announce().await;
                }
                Err(e) => tracing::warn!(error = %e, "the MCP server did not start"),
            }
        }
    }

    async fn shut(&self) {
        let session = self.session.write().await.take();
        if let Some(session) = session
            && let Ok(session) = Arc::try_unwrap(session)
        {
            session.close().await;
        }
    }
}

/// One client's view of the upstream server: every request goes there.
#[derive(Clone)]
struct Proxy {
    upstream: Arc<Upstream>,
}

impl ServerHandler for Proxy {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(Implementation::new("agentmesh-mcp-bridge", env!("CARGO_PKG_VERSION")))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Ok(mut peers) = self.upstream.peers.lock() {
            peers.retain(|p| !p.is_transport_closed());
            peers.push(context.peer);
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let session = self.upstream.current().await?;
        let tools = session.tools(LIST_TIMEOUT).await.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let session = self.upstream.current().await?;
        let (progress, mut reports) = mpsc::channel::<crate::Progress>(16);
        let forwarding = context.meta.get_progress_token().map(|token| {
            let peer = context.peer.clone();
            tokio::spawn(async move {
                while let Some(report) = reports.recv().await {
                    let mut param = ProgressNotificationParam::new(token.clone(), report.progress);
                    if let Some(total) = report.total {
                        param = param.with_total(total);
                    }
                    if !report.message.is_empty() {
                        param = param.with_message(report.message);
                    }
                    let _ = peer.notify_progress(param).await;
                }
            })
        });
        // The upstream session numbers its own progress tokens.
        let mut meta = context.meta.0.clone();
        meta.remove("progressToken");
        let call = session.call(&request.name, request.arguments, meta, None, forwarding.is_some().then_some(progress));
        let result = tokio::select! {
            result = call => result,
            () = context.ct.cancelled() => Err(CallError::Lost("the client cancelled the call".into())),
        };
        if let Some(forwarding) = forwarding {
            let _ = forwarding.await;
        }
        match result {
            Ok(result) => Ok(CallToolResponse::Complete(result)),
            Err(CallError::Refused(error)) => Err(error),
            Err(e @ (CallError::NotSent(_) | CallError::Closed)) => Err(unavailable(e.to_string(), false)),
            Err(e @ (CallError::Timeout(_) | CallError::Lost(_))) => Err(unavailable(e.to_string(), true)),
        }
    }
}

/// Serves MCP on stdin and stdout until the client closes them, every
/// request going to the MCP server at `url` with `headers` (a bearer
/// token, say); its progress reports and tool-list changes are passed on.
pub async fn serve_stdio(url: &str, headers: Vec<(http::HeaderName, http::HeaderValue)>) -> Result<(), Error> {
    use rmcp::ServiceExt as _;
    let (list_changed, changes) = mpsc::channel(4);
    let options = crate::client::Options { headers, list_changed: Some(list_changed.clone()), http: None };
    let session = Session::connect(url, options).await?;
    let (upstream, forwarding) = Upstream::start(vec![url.to_owned()], session, list_changed, changes);
    let proxy = Proxy { upstream: upstream.clone() };
    let running = proxy
        .serve(rmcp::transport::io::stdio())
        .await
        .map_err(|e| Error::Connect { target: "stdin and stdout".into(), reason: e.to_string() })?;
    let _ = running.waiting().await;
    forwarding.abort();
    upstream.shut().await;
    Ok(())
}

/// A running bridge.
pub struct Bridge {
    addr: SocketAddr,
    upstream: Arc<Upstream>,
    stop: CancellationToken,
    serving: JoinHandle<()>,
    supervisor: JoinHandle<()>,
    forwarding: JoinHandle<()>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge")
            .field("addr", &self.addr)
            .field("command", &self.upstream.command)
            .finish_non_exhaustive()
    }
}

impl Bridge {
    /// Starts the child, waits for its handshake, then serves. Fails when
    /// the child cannot be started or does not speak MCP.
    pub async fn start(options: Options) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(options.listen).await.map_err(|e| Error::Connect {
            target: options.listen.to_string(),
            reason: format!("cannot listen there: {e}"),
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Connect { target: options.listen.to_string(), reason: e.to_string() })?;
        let (list_changed, changes) = mpsc::channel(4);
        let first = Session::spawn(&options.command, Some(list_changed.clone())).await?;
        let started = Instant::now();
        let (child, forwarding) = Upstream::start(options.command.clone(), first, list_changed, changes);
        let stop = CancellationToken::new();
        let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        hosts.extend(options.allowed_hosts.iter().cloned());
        let config =
            StreamableHttpServerConfig::default().with_allowed_hosts(hosts).with_cancellation_token(stop.child_token());
        let proxy = Proxy { upstream: child.clone() };
        let service =
            StreamableHttpService::new(move || Ok(proxy.clone()), LocalSessionManager::default().into(), config);
        let router = axum::Router::new().nest_service(PATH, service);
        let until = stop.clone();
        // Without TCP_NODELAY an SSE answer written in two pieces waits for
        // the client's delayed ACK: 40 ms per call.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let serving = tokio::spawn(async move {
            let served = axum::serve(listener, router).with_graceful_shutdown(until.cancelled_owned()).await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the MCP bridge stopped serving");
            }
        });
        let supervisor = tokio::spawn(child.clone().supervise(started, stop.clone()));
        Ok(Self { addr, upstream: child, stop, serving, supervisor, forwarding })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many times the child was started again.
    pub fn restarts(&self) -> u32 {
        self.upstream.restarts.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the child runs now (not between a crash and its restart).
    pub async fn running(&self) -> bool {
        self.upstream.running().await
    }

    /// The child's process id while it runs.
    pub async fn child_pid(&self) -> Option<u32> {
        self.upstream.session.read().await.as_ref().filter(|s| !s.is_closed()).and_then(|s| s.pid())
    }

    /// Stops serving and stops the child.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.serving.await;
        let _ = self.supervisor.await;
        self.forwarding.abort();
    }
}
