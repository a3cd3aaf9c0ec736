//! A scripted LLM server: a real HTTP server that records every request
//! (path, headers, JSON body) and answers from a script, so that provider
//! code is tested against the wire format, not against a mock.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct ScriptedReply {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: Value,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
}

impl ScriptedReply {
    /// A 200 with this body.
    pub fn ok(body: Value) -> Self {
        Self { status: 200, body, headers: Vec::new() }
    }

    /// An error status with this body.
    pub fn error(status: u16, body: Value) -> Self {
        Self { status, body, headers: Vec::new() }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// An OpenAI chat completion whose message content is `content`.
    pub fn openai_content(content: &str) -> Self {
        Self::ok(json!({
            "id": "chatcmpl-scripted", "object": "chat.completion", "created": 1_700_000_000, "model": "scripted-model",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
        }))
    }

    /// An OpenAI chat completion answering with a call of `function`.
    pub fn openai_tool_call(function: &str, arguments: &str) -> Self {
        Self::ok(json!({
            "id": "chatcmpl-scripted", "object": "chat.completion", "created": 1_700_000_000, "model": "scripted-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": function, "arguments": arguments}}]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}
        }))
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Request path.
    pub path: String,
    /// Headers (lowercase names).
    pub headers: Vec<(String, String)>,
    /// JSON body (`Null` when not JSON).
    pub body: Value,
}

impl RecordedRequest {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Script {
    replies: Vec<ScriptedReply>,
    requests: Vec<RecordedRequest>,
}

/// A running scripted server, stopped when dropped.
pub struct ScriptedLlmServer {
    /// Bound address.
    pub addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedLlmServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(script): State<Arc<Mutex<Script>>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(mut script) = script.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    script.requests.push(RecordedRequest {
        path: uri.path().to_owned(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
            .collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    if script.replies.is_empty() {
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": {"message": "script exhausted"}})))
            .into_response();
    }
    let reply = script.replies.remove(0);
    let mut response =
        (StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(reply.body))
            .into_response();
    for (name, value) in reply.headers {
        if let (Ok(name), Ok(value)) =
            (axum::http::HeaderName::from_bytes(name.as_bytes()), axum::http::HeaderValue::from_str(&value))
        {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

impl ScriptedLlmServer {
    /// Starts a server on `127.0.0.1:0` answering with `replies` in order.
    pub async fn start(replies: Vec<ScriptedReply>) -> std::io::Result<Self> {
        let script = Arc::new(Mutex::new(Script { replies, requests: Vec::new() }));
        let listener = crate::bind_local().await?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(answer).with_state(script.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, script, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.script.lock().map(|s| s.requests.clone()).unwrap_or_default()
    }
}
