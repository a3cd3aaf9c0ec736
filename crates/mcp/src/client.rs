//! One connection to one MCP server, over streamable HTTP or to a child
//! process's stdio: list its tools, call one with its progress reported,
//! hear when its tool list changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientRequest,
    Implementation, MetaObject, ProgressNotificationParam, ProgressToken, RequestMetaObject, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use agentmesh_telemetry::http::error_chain;

/// Where a tool call stands, as the server reported it.
pub use agentmesh_core::execution::StepProgress as Progress;

/// Why a session could not be opened or a list read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing answered, or the handshake failed.
    #[error("cannot open an MCP session with {target}: {reason}")]
    Connect {
        /// The URL or command.
        target: String,
        /// What went wrong.
        reason: String,
    },
    /// A request after the handshake failed.
    #[error("the MCP server at {target} did not answer {method}: {reason}")]
    Request {
        /// The URL or command.
        target: String,
        /// The request.
        method: &'static str,
        /// What went wrong.
        reason: String,
    },
}

/// Why a tool call has no result.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The server refused the request itself (an unknown tool, arguments
    /// it rejects): calling again does not help.
    #[error("the MCP server refused the call: {}", .0.message)]
    Refused(rmcp::ErrorData),
    /// No answer in time: the tool may have run.
    #[error("the MCP server did not answer within {0:?}")]
    Timeout(Duration),
    /// The connection failed before the answer: whether the call reached
    /// the server is unknown.
    #[error("the connection to the MCP server failed: {0}")]
    Lost(String),
    /// The request could not be sent (nothing accepts connections there):
    /// the tool did not run.
    #[error("the MCP server cannot be reached: {0}")]
    NotSent(String),
    /// The request never left (the session is closed).
    #[error("the MCP session is closed")]
    Closed,
}

/// Receives what the server sends on its own: progress of calls in
/// flight (by token) and tool-list changes.
#[derive(Clone, Default)]
struct Handler {
    progress: Arc<Mutex<HashMap<ProgressToken, mpsc::Sender<Progress>>>>,
    list_changed: Option<mpsc::Sender<()>>,
}

impl ClientHandler for Handler {
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        let sender = self.progress.lock().ok().and_then(|map| map.get(&params.progress_token).cloned());
        if let Some(sender) = sender {
            // A full channel drops the report: the next one says more.
            let report = Progress {
                progress: params.progress,
                total: params.total,
                message: params.message.unwrap_or_default(),
            };
            let _ = sender.try_send(report);
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(sender) = &self.list_changed {
            let _ = sender.try_send(());
        }
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("agentmesh", env!("CARGO_PKG_VERSION")))
    }
}

/// Whether an error comes from a connection that could not be opened (the
/// request never left).
fn never_connected(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = source {
        if cause.downcast_ref::<reqwest::Error>().is_some_and(reqwest::Error::is_connect) {
            return true;
        }
        source = cause.source();
    }
    false
}

/// What a failed request means for the call.
fn call_error(e: ServiceError) -> CallError {
    match e {
        ServiceError::McpError(error) => CallError::Refused(error),
        ServiceError::Timeout { timeout } => CallError::Timeout(timeout),
        ServiceError::TransportClosed => CallError::Closed,
        ServiceError::TransportSend(ref sent) if never_connected(sent) => CallError::NotSent(error_chain(&e)),
        other => CallError::Lost(error_chain(&other)),
    }
}

/// Tells the server a call was given up (the step was cancelled or timed
/// out here), unless it was answered.
struct Unanswered {
    peer: Option<rmcp::Peer<RoleClient>>,
    id: rmcp::model::RequestId,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(peer) = self.peer.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let note = rmcp::model::CancelledNotificationParam::new(Some(self.id.clone()), Some("cancelled".into()));
            runtime.spawn(async move {
                let _ = peer.notify_cancelled(note).await;
            });
        }
    }
}

/// Takes a progress subscription back when the call ends.
struct Subscribed<'a> {
    handler: &'a Handler,
    token: ProgressToken,
}

impl Drop for Subscribed<'_> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.handler.progress.lock() {
            map.remove(&self.token);
        }
    }
}

/// An open session.
pub struct Session {
    target: String,
    pid: Option<u32>,
    service: RunningService<RoleClient, Handler>,
    handler: Handler,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("target", &self.target).finish_non_exhaustive()
    }
}

/// How to open a session.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Headers sent with every HTTP request (a credential, say).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Told when the server says its tool list changed.
    pub list_changed: Option<mpsc::Sender<()>>,
    /// The HTTP client to use (default: a new one).
    pub http: Option<reqwest::Client>,
}

/// How long the handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Session {
    /// Opens a session with the server at `url` (streamable HTTP).
    pub async fn connect(url: &str, options: Options) -> Result<Self, Error> {
        let target = agentmesh_telemetry::secrets::redact(url);
        let connect_error = |reason: String| Error::Connect { target: target.clone(), reason };
        let http = match options.http {
            Some(http) => http,
            None => agentmesh_telemetry::http::client_builder()
                .build()
                .map_err(|e| connect_error(format!("cannot build an HTTP client: {e}")))?,
        };
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
        config.custom_headers = options.headers.into_iter().collect();
        let transport = StreamableHttpClientTransport::with_client(http, config);
        let handler = Handler { progress: Arc::default(), list_changed: options.list_changed };
        let service = tokio::time::timeout(CONNECT_TIMEOUT, handler.clone().serve(transport))
            .await
            .map_err(|_| connect_error(format!("no answer to `initialize` within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| connect_error(error_chain(&e)))?;
        Ok(Self { target, pid: None, service, handler })
    }

    /// Starts `command` and opens a session over its stdin and stdout; its
    /// stderr is this process's.
    pub async fn spawn(command: &[String], list_changed: Option<mpsc::Sender<()>>) -> Result<Self, Error> {
        let target = command.join(" ");
        let connect_error = |reason: String| Error::Connect { target: target.clone(), reason };
        let (program, args) = command.split_first().ok_or_else(|| connect_error("no command given".into()))?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args);
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|e| connect_error(format!("cannot start it: {e}")))?;
        let pid = transport.id();
        let handler = Handler { progress: Arc::default(), list_changed };
        let service = tokio::time::timeout(CONNECT_TIMEOUT, handler.clone().serve(transport))
            .await
            .map_err(|_| connect_error(format!("no answer to `initialize` within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| connect_error(e.to_string()))?;
        Ok(Self { target, pid, service, handler })
    }

    /// The URL or command of the server.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The child process's id, for a session with a child.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Whether the session has ended (the server went away).
    pub fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.peer().is_transport_closed()
    }

    /// Every tool, page after page.
    pub async fn tools(&self, timeout: Duration) -> Result<Vec<Tool>, Error> {
        let request = |reason: String| Error::Request { target: self.target.clone(), method: "tools/list", reason };
        tokio::time::timeout(timeout, self.service.peer().list_all_tools())
            .await
            .map_err(|_| request(format!("no answer within {timeout:?}")))?
            .map_err(|e| request(e.to_string()))
    }

    /// Calls `tool`; `meta` travels in the request's `_meta` (trace
    /// context, request id); each progress report goes to `progress`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Option<Map<String, Value>>,
        meta: MetaObject,
        timeout: Option<Duration>,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> Result<CallToolResult, CallError> {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let mut options = PeerRequestOptions::default();
        options.timeout = timeout;
        options.meta = Some(RequestMetaObject(meta));
        let handle = self.service.peer().send_request_with_option(request, options).await.map_err(call_error)?;
        let mut unanswered = Unanswered { peer: Some(self.service.peer().clone()), id: handle.id.clone() };
        let _subscribed = progress.map(|sender| {
            if let Ok(mut map) = self.handler.progress.lock() {
                map.insert(handle.progress_token.clone(), sender);
            }
            Subscribed { handler: &self.handler, token: handle.progress_token.clone() }
        });
        let answer = handle.await_response().await;
        // Answered, or timed out (rmcp tells the server itself).
        unanswered.peer = None;
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(_) => Err(CallError::Refused(rmcp::ErrorData::internal_error(
                "the server answered with something other than a tool result (tasks and input requests are not supported)",
                None,
            ))),
            Err(ServiceError::TransportClosed) => Err(CallError::Lost("the session closed before the answer".into())),
            Err(other) => Err(call_error(other)),
        }
    }

    /// Ends the session (and stops a child process).
    pub async fn close(mut self) {
        let _ = self.service.close_with_timeout(Duration::from_secs(2)).await;
    }
}
