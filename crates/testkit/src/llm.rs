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
use futures_util::StreamExt;
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct ScriptedReply {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: Value,
    /// A `text/event-stream` body sent instead of `body`, in these chunks
    /// (each flushed on its own, so clients see a real stream).
    pub events: Option<Vec<String>>,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
}

impl ScriptedReply {
    /// A 200 with this body.
    pub fn ok(body: Value) -> Self {
        Self { status: 200, body, events: None, headers: Vec::new() }
    }

    /// An error status with this body.
    pub fn error(status: u16, body: Value) -> Self {
        Self { status, body, events: None, headers: Vec::new() }
    }

    /// A 200 streaming these server-sent events: `(event name, data)`; a
    /// JSON string as data is sent as it is (e.g. `[DONE]`).
    pub fn sse(events: &[(Option<&str>, Value)]) -> Self {
        let chunks = events
            .iter()
            .map(|(name, data)| {
                let data = data.as_str().map_or_else(|| data.to_string(), str::to_owned);
                match name {
                    Some(name) => format!("event: {name}\ndata: {data}\n\n"),
                    None => format!("data: {data}\n\n"),
                }
            })
            .collect();
        Self { status: 200, body: Value::Null, events: Some(chunks), headers: Vec::new() }
    }

    /// An OpenAI chat completion streamed in `pieces`, usage in the last chunk.
    pub fn openai_stream(pieces: &[&str]) -> Self {
        let chunk = |delta: Value, finish: Value| {
            json!({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1_700_000_000,
                "model": "scripted-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let mut events = vec![(None, chunk(json!({"role": "assistant", "content": ""}), Value::Null))];
        events.extend(pieces.iter().map(|p| (None, chunk(json!({"content": p}), Value::Null))));
        events.push((None, chunk(json!({}), json!("stop"))));
        events.push((
            None,
            json!({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "scripted-model", "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}),
        ));
        events.push((None, json!("[DONE]")));
        Self::sse(&events)
    }

    /// An Anthropic message answering with text.
    pub fn anthropic_text(text: &str) -> Self {
        Self::ok(json!({
            "id": "msg_scripted", "type": "message", "role": "assistant", "model": "claude-scripted",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 30, "output_tokens": 11}
        }))
    }

    /// An Anthropic message answering with a call of `tool` (after a thinking block).
    pub fn anthropic_tool_use(tool: &str, input: Value) -> Self {
        Self::ok(json!({
            "id": "msg_scripted", "type": "message", "role": "assistant", "model": "claude-scripted",
            "content": [
                {"type": "thinking", "thinking": "The user wants weather.", "signature": "c2lnbmF0dXJl"},
                {"type": "tool_use", "id": "toolu_1", "name": tool, "input": input}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 40, "output_tokens": 21}
        }))
    }

    /// An Anthropic message streamed: a text block in `text` pieces, or, with
    /// `tool`, a tool_use block whose input JSON arrives in those pieces.
    pub fn anthropic_stream(tool: Option<&str>, pieces: &[&str]) -> Self {
        let block = match tool {
            Some(name) => json!({"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}),
            None => json!({"type": "text", "text": ""}),
        };
        let delta = |piece: &str| match tool {
            Some(_) => json!({"type": "input_json_delta", "partial_json": piece}),
            None => json!({"type": "text_delta", "text": piece}),
        };
        let mut events = vec![
            (
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_scripted", "type": "message",
                "role": "assistant", "model": "claude-scripted", "content": [], "stop_reason": null,
                "usage": {"input_tokens": 30, "output_tokens": 1}}}),
            ),
            (Some("content_block_start"), json!({"type": "content_block_start", "index": 0, "content_block": block})),
            (Some("ping"), json!({"type": "ping"})),
        ];
        events.extend(pieces.iter().map(|p| {
            (Some("content_block_delta"), json!({"type": "content_block_delta", "index": 0, "delta": delta(p)}))
        }));
        events.extend([
            (Some("content_block_stop"), json!({"type": "content_block_stop", "index": 0})),
            (
                Some("message_delta"),
                json!({"type": "message_delta",
                "delta": {"stop_reason": if tool.is_some() { "tool_use" } else { "end_turn" }, "stop_sequence": null},
                "usage": {"output_tokens": 15}}),
            ),
            (Some("message_stop"), json!({"type": "message_stop"})),
        ]);
        Self::sse(&events)
    }

    /// A Gemini `GenerateContentResponse` whose answer is `text` (after a thought summary).
    pub fn gemini_text(text: &str) -> Self {
        Self::ok(json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "Thinking about the request.", "thought": true}, {"text": text}]},
                "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 12, "thoughtsTokenCount": 8,
                "totalTokenCount": 70},
            "modelVersion": "gemini-2.5-flash", "responseId": "scripted"
        }))
    }

    /// A Gemini answer streamed over SSE in `pieces`, usage in the last chunk.
    pub fn gemini_stream(pieces: &[&str]) -> Self {
        let last = pieces.len().saturating_sub(1);
        let events: Vec<(Option<&str>, Value)> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut chunk = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": p}]}, "index": 0}],
                    "modelVersion": "gemini-2.5-flash"});
                if i == last {
                    chunk["candidates"][0]["finishReason"] = json!("STOP");
                    chunk["usageMetadata"] =
                        json!({"promptTokenCount": 50, "candidatesTokenCount": 12, "totalTokenCount": 62});
                }
                (None, chunk)
            })
            .collect();
        Self::sse(&events)
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
    /// Query string, if any.
    pub query: Option<String>,
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
    tls: bool,
}

impl Drop for ScriptedLlmServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    State(script): State<Arc<Mutex<Script>>>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // A model list, as the services' readiness probes ask for: answered as
    // a model server would, neither recorded nor taken from the script.
    if method == axum::http::Method::GET && uri.path().ends_with("/models") {
        return axum::Json(json!({"object": "list", "data": [{"id": "scripted-model", "object": "model"}]}))
            .into_response();
    }
    let Ok(mut script) = script.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    script.requests.push(RecordedRequest {
        path: uri.path().to_owned(),
        query: uri.query().map(str::to_owned),
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
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = match reply.events {
        Some(chunks) => {
            let stream = futures_util::stream::iter(chunks).then(|chunk| async move {
                // Apart in time, so each chunk reaches the client on its own.
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                Ok::<_, std::convert::Infallible>(chunk)
            });
            let mut response = (status, axum::body::Body::from_stream(stream)).into_response();
            response
                .headers_mut()
                .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("text/event-stream"));
            response
        }
        None => (status, axum::Json(reply.body)).into_response(),
    };
    for (name, value) in reply.headers {
        if let (Ok(name), Ok(value)) =
            (axum::http::HeaderName::from_bytes(name.as_bytes()), axum::http::HeaderValue::from_str(&value))
        {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// The test CA (PEM) that signed the scripted server's HTTPS certificate
/// for `localhost` and `127.0.0.1`; a client must trust it explicitly.
pub const TEST_CA_PEM: &str = include_str!("../certs/ca.pem");
const TEST_CERT_PEM: &str = include_str!("../certs/localhost.pem");
const TEST_KEY_PEM: &str = include_str!("../certs/localhost.key");

/// A listener that completes a TLS handshake on each accepted connection.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else { continue };
            match self.acceptor.accept(stream).await {
                Ok(tls) => return (tls, addr),
                Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

fn tls_acceptor() -> std::io::Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let invalid = |e: &dyn std::fmt::Display| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(TEST_CERT_PEM.as_bytes())
        .chain(CertificateDer::pem_slice_iter(TEST_CA_PEM.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(&e))?;
    let key = PrivateKeyDer::from_pem_slice(TEST_KEY_PEM.as_bytes()).map_err(|e| invalid(&e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(&e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| invalid(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
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
        Ok(Self { addr, script, task, tls: false })
    }

    /// Like [`start`](Self::start), over HTTPS with a certificate signed by
    /// [`TEST_CA_PEM`].
    pub async fn start_tls(replies: Vec<ScriptedReply>) -> std::io::Result<Self> {
        let script = Arc::new(Mutex::new(Script { replies, requests: Vec::new() }));
        let tcp = crate::bind_local().await?;
        let addr = tcp.local_addr()?;
        let listener = TlsListener { tcp, acceptor: tls_acceptor()? };
        let app = Router::new().fallback(answer).with_state(script.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, script, task, tls: true })
    }

    /// `http://127.0.0.1:PORT` (`https://127.0.0.1:PORT` over TLS).
    pub fn url(&self) -> String {
        if self.tls { format!("https://{}", self.addr) } else { format!("http://{}", self.addr) }
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.script.lock().map(|s| s.requests.clone()).unwrap_or_default()
    }
}
