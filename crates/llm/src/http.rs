//! The HTTP side every provider shares: one client (HTTPS through rustls
//! with the system's roots plus an optional extra CA), one way to classify a
//! failed exchange, retries with backoff, and server-sent events (read by
//! `sse-stream`).

use std::path::PathBuf;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use serde_json::Value;

use agentmesh_telemetry::http::error_chain;

use crate::{LlmError, RetryPolicy};

/// HTTP settings common to all providers.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Per-attempt timeout (for a stream: the whole stream).
    pub timeout: Duration,
    /// Retries on 429, 5xx, timeouts and connection errors.
    pub retry: RetryPolicy,
    /// A PEM file of extra trusted root certificates (a private CA in front
    /// of a self-hosted model server), on top of the system's.
    pub ca_file: Option<PathBuf>,
    /// Largest answer read from the server, whole or streamed; a larger one
    /// is refused rather than held in memory.
    pub max_response_bytes: usize,
}

/// Default of [`HttpSettings::max_response_bytes`]: far above any answer a
/// planner asks for, far below what would hurt the process.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            ca_file: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

/// One HTTP exchange's failure, before retries decide.
pub(crate) enum Failure {
    /// Worth retrying (429, 5xx, timeouts, connection errors).
    Transient { message: String, retry_after: Option<Duration> },
    /// The server does not accept the structured-output mode asked for.
    ModeRejected { status: u16, body: String },
    /// Final.
    Fatal(LlmError),
}

impl Failure {
    /// The error a caller sees when no retry or fallback is left.
    pub(crate) fn into_error(self, attempts: u32) -> LlmError {
        match self {
            Self::Fatal(e) => e,
            Self::ModeRejected { status, body } => LlmError::BadRequest { status, body },
            Self::Transient { message, .. } => LlmError::Unavailable { attempts, message },
        }
    }
}

/// What a 404 from the model server means: the URL called, and the
/// missing `/v1` that is its usual cause.
fn not_found(url: &str, body: &str) -> String {
    let path = reqwest::Url::parse(url).map(|u| u.path().to_owned()).unwrap_or_default();
    let hint = if path.starts_with("/v1") || path.contains("/v1/") || path.contains("/v1beta/") {
        String::new()
    } else {
        "; OpenAI-compatible servers (Ollama, llama.cpp, vLLM) serve under /v1: \
         give a base URL that ends in /v1, e.g. http://127.0.0.1:11434/v1"
            .to_owned()
    };
    let body = body.trim();
    let body = if body.is_empty() { String::new() } else { format!(" ({body})") };
    format!("the model server has nothing at {url}{body}{hint}")
}

/// Longest wait for a readiness probe's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Words in an error body that say the server disliked the structured-output
/// part of the request rather than the request as a whole.
const MODE_WORDS: [&str; 5] = ["response_format", "json_schema", "tool_choice", "tools", "schema"];

/// A provider's HTTP client.
pub(crate) struct Http {
    client: reqwest::Client,
    retry: RetryPolicy,
    max_response_bytes: usize,
    /// Texts never shown: the API key, the base URL's password and secret
    /// query parameters; hidden in every message this client writes.
    secrets: Vec<String>,
    /// User name and password from the base URL, sent as HTTP Basic
    /// authentication when no API key is configured.
    basic: Option<(String, Option<String>)>,
}

/// A provider's base URL taken apart: where requests go (no user info), the
/// query parameters every request carries (`?api_key=…` stays a query
/// parameter, after the path), and the user info.
#[derive(Debug, Clone)]
pub(crate) struct BaseUrl {
    /// Scheme, host, port and path, without a trailing `/`.
    root: String,
    /// The query as written, without `?`.
    query: Option<String>,
    /// The user info, percent-decoded.
    user: Option<(String, Option<String>)>,
    /// The URL as given, for [`agentmesh_telemetry::secrets::url_secrets`].
    given: String,
}

impl BaseUrl {
    /// Takes `raw` apart; an unparsable URL is a configuration error.
    pub(crate) fn parse(raw: &str) -> Result<Self, LlmError> {
        let mut url = reqwest::Url::parse(raw.trim()).map_err(|e| {
            LlmError::Config(format!("the LLM base URL {} is not a URL: {e}", agentmesh_telemetry::redact(raw)))
        })?;
        let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
        let user = (!url.username().is_empty()).then(|| (decode(url.username()), url.password().map(decode)));
        let query = url.query().filter(|q| !q.is_empty()).map(str::to_owned);
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.set_query(None);
        url.set_fragment(None);
        Ok(Self { root: url.as_str().trim_end_matches('/').to_owned(), query, user, given: raw.to_owned() })
    }

    /// The URL of `path` (which starts with `/`) under the base, with the
    /// base's query parameters and then `extra` (`alt=sse`).
    pub(crate) fn join(&self, path: &str, extra: Option<&str>) -> String {
        let query: Vec<&str> = self.query.as_deref().into_iter().chain(extra).collect();
        if query.is_empty() {
            format!("{}{path}", self.root)
        } else {
            format!("{}{path}?{}", self.root, query.join("&"))
        }
    }

    /// Where requests go, for the readiness probe (host and port only).
    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    /// The base URL as shown in logs: secrets replaced by `***`.
    pub(crate) fn shown(&self) -> String {
        agentmesh_telemetry::redact(&self.given)
    }
}

/// A request: where, with which headers, what body.
pub(crate) struct Post<'a> {
    pub url: &'a str,
    pub headers: &'a [(&'static str, String)],
    pub body: &'a Value,
    /// Whether a 4xx naming the structured-output part is a [`Failure::ModeRejected`].
    pub mode_sensitive: bool,
}

pub use agentmesh_telemetry::http::{client_builder, install_tls_provider, parse_retry_after};

impl Http {
    /// A client for the server at `base`, authenticating with `key` when
    /// given (the provider sends it in its own header) or else with the base
    /// URL's user info.
    pub(crate) fn new(settings: &HttpSettings, base: &BaseUrl, key: Option<&str>) -> Result<Self, LlmError> {
        let mut builder = client_builder().timeout(settings.timeout);
        if let Some(path) = &settings.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| LlmError::Config(format!("cannot read the CA file {}: {e}", path.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| LlmError::Config(format!("the CA file {} is not PEM: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(LlmError::Config(format!("the CA file {} holds no certificate", path.display())));
            }
            builder = builder.tls_certs_merge(certs);
        }
        let client = builder.build().map_err(|e| LlmError::Config(format!("building the HTTP client: {e}")))?;
        let mut secrets = agentmesh_telemetry::secrets::url_secrets(&base.given);
        secrets.extend(key.map(str::to_owned));
        if let Some((user, Some(_))) = &base.user {
            // With a password, the user name may be part of the credential.
            secrets.push(user.clone());
        }
        let basic = if key.is_none() { base.user.clone() } else { None };
        Ok(Self { client, retry: settings.retry, max_response_bytes: settings.max_response_bytes, secrets, basic })
    }

    /// `text` without any of this client's secrets.
    fn scrub(&self, text: &str) -> String {
        agentmesh_telemetry::secrets::scrub(text, &self.secrets)
    }

    /// A failure with every message scrubbed of this client's secrets.
    fn scrubbed(&self, failure: Failure) -> Failure {
        match failure {
            Failure::Transient { message, retry_after } => {
                Failure::Transient { message: self.scrub(&message), retry_after }
            }
            Failure::ModeRejected { status, body } => Failure::ModeRejected { status, body: self.scrub(&body) },
            Failure::Fatal(e) => Failure::Fatal(match e {
                LlmError::BadRequest { status, body } => LlmError::BadRequest { status, body: self.scrub(&body) },
                LlmError::Unavailable { attempts, message } => {
                    LlmError::Unavailable { attempts, message: self.scrub(&message) }
                }
                LlmError::InvalidResponse(message) => LlmError::InvalidResponse(self.scrub(&message)),
                LlmError::Config(message) => LlmError::Config(self.scrub(&message)),
                auth @ LlmError::Auth { .. } => auth,
            }),
        }
    }

    async fn attempt(&self, post: &Post<'_>) -> Result<reqwest::Response, Failure> {
        self.attempt_once(post).await.map_err(|f| self.scrubbed(f))
    }

    async fn attempt_once(&self, post: &Post<'_>) -> Result<reqwest::Response, Failure> {
        let mut http = self.client.post(post.url).json(post.body);
        for (name, value) in post.headers {
            http = http.header(*name, value);
        }
        if let Some((user, password)) = &self.basic {
            http = http.basic_auth(user, password.as_ref());
        }
        let response = match http.send().await {
            Ok(r) => r,
            Err(e) if e.is_builder() => {
                return Err(Failure::Fatal(LlmError::Config(format!("cannot call {}: {e}", post.url))));
            }
            Err(e) => return Err(Failure::Transient { message: error_chain(&e), retry_after: None }),
        };
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, chrono::Utc::now()));
        // An error body matters only for its first lines.
        let text = self.read_body(response, 64 * 1024).await.unwrap_or_default();
        let snippet: String = text.chars().take(2000).collect();
        let names_mode = MODE_WORDS.iter().any(|word| snippet.contains(word));
        Err(match status {
            401 | 403 => Failure::Fatal(LlmError::Auth { status }),
            _ if post.mode_sensitive && names_mode && status >= 400 && status != 429 => {
                Failure::ModeRejected { status, body: snippet }
            }
            // 529: Anthropic's "overloaded".
            408 | 429 | 500..=599 => Failure::Transient { message: format!("HTTP {status}: {snippet}"), retry_after },
            // A wrong base URL: say what was called, and the usual cause.
            404 => Failure::Fatal(LlmError::BadRequest { status, body: not_found(post.url, &snippet) }),
            _ => Failure::Fatal(LlmError::BadRequest { status, body: snippet }),
        })
    }

    /// Whether the server behind `url` accepts connections. Only a TCP
    /// connection is opened, no request sent: some model servers
    /// (llama-cpp-python among them) interrupt the generation in progress
    /// when another request arrives, even one for the model list.
    pub(crate) async fn probe(&self, url: &str) -> Result<String, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url} is not a URL: {e}"))?;
        let host = parsed.host_str().ok_or_else(|| format!("{url} names no host"))?.to_owned();
        let port = parsed.port_or_known_default().ok_or_else(|| format!("{url} names no port"))?;
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect((host.as_str(), port))).await {
            Ok(Ok(_)) => Ok(format!("{host}:{port} accepts connections")),
            Ok(Err(e)) => Err(format!("{host}:{port} unreachable: {e}")),
            Err(_) => Err(format!("{host}:{port} did not answer within {} s", PROBE_TIMEOUT.as_secs())),
        }
    }

    /// Retries `op` on transient failures with the policy's backoff.
    async fn with_retries<T, F, Fut>(&self, url: &str, mut op: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut retry = 0;
        loop {
            match op().await {
                Err(Failure::Transient { message, retry_after }) if retry < self.retry.max_retries => {
                    let wait = self.retry.delay(retry, retry_after);
                    tracing::warn!(endpoint = %self.scrub(url), retry = retry + 1, wait_ms = wait.as_millis() as u64, error = %message, "LLM call failed; retrying");
                    tokio::time::sleep(wait).await;
                    retry += 1;
                }
                Err(Failure::Transient { message, .. }) => {
                    return Err(Failure::Fatal(LlmError::Unavailable { attempts: retry + 1, message }));
                }
                other => return other,
            }
        }
    }

    /// Reads a body of at most `limit` bytes (text, lossily decoded).
    async fn read_body(&self, mut response: reqwest::Response, limit: usize) -> Result<String, Failure> {
        let mut body = Vec::new();
        while let Some(chunk) =
            response.chunk().await.map_err(|e| Failure::Transient { message: error_chain(&e), retry_after: None })?
        {
            if body.len() + chunk.len() > limit {
                return Err(Failure::Fatal(too_large(limit)));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// POSTs and reads a JSON answer, retrying transient failures.
    pub(crate) async fn post_json(&self, post: &Post<'_>) -> Result<Value, Failure> {
        self.post_json_once(post).await.map_err(|f| self.scrubbed(f))
    }

    async fn post_json_once(&self, post: &Post<'_>) -> Result<Value, Failure> {
        self.with_retries(post.url, || async {
            let response = self.attempt(post).await?;
            let text = self.read_body(response, self.max_response_bytes).await?;
            serde_json::from_str(&text)
                .map_err(|e| Failure::Fatal(LlmError::InvalidResponse(format!("body is not JSON: {e}"))))
        })
        .await
    }

    /// POSTs and hands each server-sent event to `on_event` as it arrives.
    /// Failures before the first byte are retried; a stream cut midway is not
    /// (part of the answer was already delivered).
    pub(crate) async fn post_events(
        &self,
        post: &Post<'_>,
        on_event: &mut (dyn FnMut(SseEvent) -> Result<(), LlmError> + Send),
    ) -> Result<(), Failure> {
        self.post_events_once(post, on_event).await.map_err(|f| self.scrubbed(f))
    }

    async fn post_events_once(
        &self,
        post: &Post<'_>,
        on_event: &mut (dyn FnMut(SseEvent) -> Result<(), LlmError> + Send),
    ) -> Result<(), Failure> {
        let response = self.with_retries(post.url, || self.attempt(post)).await?;
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        if !content_type.is_empty() && !content_type.contains("event-stream") {
            return Err(Failure::Fatal(LlmError::InvalidResponse(format!(
                "asked for a stream, the server answered with `{content_type}`; it may not support streaming"
            ))));
        }
        let limit = self.max_response_bytes;
        let mut read = 0usize;
        let body = futures_util::stream::try_unfold(response, |mut response| async move {
            Ok::<_, ReadError>(response.chunk().await.map_err(ReadError::Cut)?.map(|chunk| (chunk, response)))
        })
        .and_then(move |chunk| {
            read += chunk.len();
            std::future::ready(if read > limit { Err(ReadError::TooLarge) } else { Ok(chunk) })
        });
        let mut events = std::pin::pin!(sse_events(body));
        while let Some(event) = events.next().await {
            on_event(event.map_err(|e| Failure::Fatal(stream_failure(&e, limit)))?).map_err(Failure::Fatal)?;
        }
        Ok(())
    }
}

/// Why reading a streamed answer stopped.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("stream cut: {}", error_chain(.0))]
    Cut(reqwest::Error),
    #[error("too large")]
    TooLarge,
}

/// What a failed event stream means for the call.
fn stream_failure(e: &sse_stream::Error, limit: usize) -> LlmError {
    match e {
        sse_stream::Error::Body(cause) => match cause.downcast_ref::<ReadError>() {
            Some(ReadError::TooLarge) => too_large(limit),
            Some(cut @ ReadError::Cut(_)) => LlmError::Unavailable { attempts: 1, message: cut.to_string() },
            None => LlmError::Unavailable { attempts: 1, message: format!("stream cut: {cause}") },
        },
        other => LlmError::InvalidResponse(format!("the event stream cannot be read: {other}")),
    }
}

fn too_large(limit: usize) -> LlmError {
    LlmError::InvalidResponse(format!(
        "the LLM server's answer is larger than max_response_bytes ({limit} bytes); \
         raise it if such answers are expected"
    ))
}

/// The server-sent events of a body read chunk by chunk: every event that
/// carries data, the last one too when the server ended the stream without
/// a blank line.
pub(crate) fn sse_events<S, E>(body: S) -> impl futures_util::Stream<Item = Result<SseEvent, sse_stream::Error>>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Send,
    E: std::error::Error + Send + Sync + 'static,
{
    let body = body.chain(futures_util::stream::once(std::future::ready(Ok(bytes::Bytes::from_static(b"\n\n")))));
    sse_stream::SseByteStream::new(Box::pin(body))
        .try_filter_map(|e| std::future::ready(Ok(e.data.map(|data| SseEvent { event: e.event, data }))))
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined by newlines.
    pub data: String,
}

/// Parses an event's data as JSON.
pub(crate) fn event_json(event: &SseEvent) -> Result<Value, LlmError> {
    serde_json::from_str(&event.data)
        .map_err(|e| LlmError::InvalidResponse(format!("stream event is not JSON ({e}): {}", truncate(&event.data))))
}

/// The first few hundred characters of a text, for error messages.
pub(crate) fn truncate(text: &str) -> String {
    text.chars().take(300).collect()
}

/// A token count from a JSON number.
pub(crate) fn count(value: &Value) -> u32 {
    value.as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    /// The events of a body arriving in `chunks`.
    fn events_of(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
            chunks.iter().map(|c| Ok(bytes::Bytes::copy_from_slice(c))).collect();
        let events = sse_events(futures_util::stream::iter(chunks)).collect::<Vec<_>>().now_or_never();
        events.unwrap_or_default().into_iter().filter_map(Result::ok).collect()
    }

    #[test]
    fn a_missing_v1_is_named_with_the_url_called() {
        let said = not_found("http://127.0.0.1:11434/chat/completions", "404 page not found");
        assert!(said.contains("nothing at http://127.0.0.1:11434/chat/completions (404 page not found)"), "{said}");
        assert!(said.contains("ends in /v1"), "{said}");
        let said = not_found("http://127.0.0.1:8000/v1/chat/completions", "");
        assert_eq!(said, "the model server has nothing at http://127.0.0.1:8000/v1/chat/completions");
    }

    #[test]
    fn sse_events_split_across_chunks_and_lines() {
        let events = events_of(&[
            b"event: message_start\ndata: {\"a\"",
            b":1}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n\ndata: [DONE]",
        ]);
        assert_eq!(
            events,
            vec![
                SseEvent { event: Some("message_start".into()), data: "{\"a\":1}".into() },
                SseEvent { event: None, data: "x\ny".into() },
                SseEvent { event: None, data: "[DONE]".into() },
            ]
        );
    }

    #[test]
    fn a_lone_carriage_return_ends_a_line() {
        let events = events_of(&[b"data: one\r\rdata: two\r", b"\r"]);
        assert_eq!(events.iter().map(|e| e.data.as_str()).collect::<Vec<_>>(), ["one", "two"]);
    }
}
