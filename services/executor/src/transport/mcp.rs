//! Calling MCP servers: `tools/call` of the capability's tool (its
//! endpoint) with the step's parameters as arguments, over one session per
//! agent kept open between steps and opened again after it fails. The
//! request's `_meta` carries the trace context and the request id; the
//! server's progress reports go to the step's watchers.
//!
//! The answer: `structuredContent` (checked against the output schema like
//! any output), else the text as `{"text": …}`; `isError` fails the step
//! with its text. A refused request (unknown tool, rejected arguments) is
//! not retried; no answer in time or a lost connection is retried like an
//! HTTP call, unless the tool is not idempotent (see `Hints`).

use std::collections::HashMap;
use std::sync::Arc;

use agentmesh_mcp::{CallError, Session};
use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::Mutex;

use super::{AgentTransport, Call, Failure, Reply};
use crate::egress::Egress;

/// One open session, and what it was opened with.
struct Open {
    base_url: String,
    /// The credential's header and value: a rotated secret opens a new session.
    credential: Option<(http::HeaderName, http::HeaderValue)>,
    session: Arc<Session>,
}

/// The MCP transport.
pub struct McpTransport {
    http: reqwest::Client,
    egress: Arc<Egress>,
    sessions: Mutex<HashMap<String, Open>>,
}

impl McpTransport {
    /// Calls go through `http` (the HTTP transport's client: the same
    /// egress checks at connection time, no redirects).
    pub fn new(http: reqwest::Client, egress: Arc<Egress>) -> Self {
        Self { http, egress, sessions: Mutex::new(HashMap::new()) }
    }

    /// The agent's open session, or a new one.
    async fn session(&self, call: &Call<'_>) -> Result<Arc<Session>, Failure> {
        let target = call.target;
        let credential = call.credential.map(|c| (c.header.clone(), c.value.clone()));
        {
            let sessions = self.sessions.lock().await;
            if let Some(open) = sessions.get(&target.agent_id)
                && open.base_url == target.base_url
                && open.credential == credential
                && !open.session.is_closed()
            {
                return Ok(open.session.clone());
            }
        }
        let url = url::Url::parse(&target.base_url)
            .map_err(|e| Failure::fatal(format!("the agent's URL `{}` is not a URL: {e}", target.base_url)))?;
        self.egress.check_call(&url).map_err(|e| Failure::fatal(format!("refused to call {url}: {e}")))?;
        let options = agentmesh_mcp::client::Options {
            headers: credential.clone().into_iter().collect(),
            list_changed: None,
            http: Some(self.http.clone()),
        };
        let session = Session::connect(&target.base_url, options).await.map_err(|e| {
            let message = e.to_string();
            if message.contains("in a denied network") {
                Failure::fatal(format!("refused to call {url}: {message}"))
            } else {
                // The session did not open: no tool ran.
                Failure::unreachable(message)
            }
        })?;
        let session = Arc::new(session);
        self.sessions.lock().await.insert(
            target.agent_id.clone(),
            Open { base_url: target.base_url.clone(), credential, session: session.clone() },
        );
        Ok(session)
    }

    async fn forget(&self, agent_id: &str) {
        self.sessions.lock().await.remove(agent_id);
    }
}

#[async_trait]
impl AgentTransport for McpTransport {
    async fn invoke(&self, call: &Call<'_>) -> Result<Reply, Failure> {
        let arguments = match call.parameters {
            Value::Object(map) => Some(map.clone()),
            Value::Null => None,
            other => {
                return Err(Failure::fatal(format!(
                    "an MCP tool takes an object as its arguments, the step's parameters are {other}"
                )));
            }
        };
        // Opening a session counts against the step's timeout.
        let started = tokio::time::Instant::now();
        let session = tokio::time::timeout(call.timeout, self.session(call)).await.map_err(|_| {
            Failure::unreachable(format!(
                "no MCP session with {} within {} ms",
                call.target.base_url,
                call.timeout.as_millis()
            ))
        })??;
        let meta = agentmesh_mcp::call_meta(&super::traceparent(call), call.request_id);
        let tool = &call.target.endpoint;
        let left = call.timeout.saturating_sub(started.elapsed()).max(std::time::Duration::from_millis(1));
        let (reports, mut reported) = tokio::sync::mpsc::channel(16);
        let calling = session.call(tool, arguments, meta, Some(left), Some(reports));
        tokio::pin!(calling);
        let answer = loop {
            tokio::select! {
                answer = &mut calling => break answer,
                Some(progress) = reported.recv() => call.progress.report(progress),
            }
        };
        while let Ok(progress) = reported.try_recv() {
            call.progress.report(progress);
        }
        match answer {
            Ok(result) => agentmesh_mcp::tools::read_result(result)
                .map(|output| Reply { output, collaborate: None })
                .map_err(|text| Failure::fatal(format!("the tool `{tool}` reported an error: {text}"))),
            Err(CallError::Refused(error)) => {
                let message = format!("the MCP server refused the call to `{tool}`: {}", error.message);
                // A bridge whose server is down says whether to try again.
                match agentmesh_mcp::bridge::retry_marks(&error) {
                    Some(true) => Err(Failure::unanswered(message)),
                    Some(false) => Err(Failure::unreachable(message)),
                    None => Err(Failure::fatal(message)),
                }
            }
            Err(CallError::NotSent(reason)) => {
                self.forget(&call.target.agent_id).await;
                Err(Failure::unreachable(format!("could not reach {}: {reason}", call.target.base_url)))
            }
            Err(CallError::Timeout(_)) => {
                self.forget(&call.target.agent_id).await;
                Err(Failure::unanswered(format!(
                    "no answer from the tool `{tool}` at {} within {} ms",
                    call.target.base_url,
                    started.elapsed().as_millis()
                )))
            }
            Err(CallError::Closed) => {
                // Nothing was sent: open a new session and try again.
                self.forget(&call.target.agent_id).await;
                Err(Failure::unreachable("the MCP session had closed"))
            }
            Err(CallError::Lost(reason)) => {
                self.forget(&call.target.agent_id).await;
                Err(Failure::unanswered(format!(
                    "the call to the tool `{tool}` at {} failed: {reason}",
                    call.target.base_url
                )))
            }
        }
    }
}
