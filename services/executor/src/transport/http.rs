//! Calling agents over HTTP: `POST base_url + endpoint` with the parameters
//! as the JSON body. The headers carry the idempotency key (the same on
//! every attempt), the request id, the step's instruction and the trace
//! context. Retryable: connection failures, timeouts, 429, 502, 503, 504,
//! and any 5xx whose body says `"retryable": true`; never another 4xx.
//! Ambiguous (the agent may have acted on the call): a timeout or an error
//! once the connection was made, and a 502 or 504 from a proxy in between.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_telemetry::http::error_chain;
use async_trait::async_trait;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use super::{AgentTransport, Call, Failure, Reply, read_answer};
use crate::egress::{Egress, EgressResolver, capability_url};
use agentmesh_telemetry::http::parse_retry_after;

/// Header names of the agent contract (see docs/agents.md).
pub mod header {
    /// The same for every attempt of a step: `execution_id/step_id`.
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
    /// The originating request.
    pub const REQUEST_ID: &str = "x-request-id";
    /// The execution.
    pub const EXECUTION_ID: &str = "x-agentmesh-execution-id";
    /// The step.
    pub const STEP_ID: &str = "x-agentmesh-step-id";
    /// The agent addressed.
    pub const AGENT_ID: &str = "x-agentmesh-agent-id";
    /// The attempt number, from 1.
    pub const ATTEMPT: &str = "x-agentmesh-attempt";
    /// The step's instruction, percent-encoded UTF-8.
    pub const INSTRUCTION: &str = "x-agentmesh-instruction";
}

/// The HTTP transport.
pub struct HttpTransport {
    client: reqwest::Client,
    egress: Arc<Egress>,
    max_output_bytes: usize,
}

impl HttpTransport {
    /// A client whose name resolution refuses denied networks.
    pub fn new(egress: Arc<Egress>, max_output_bytes: usize, ca_pem: Option<&[u8]>) -> anyhow::Result<Self> {
        let mut builder = agentmesh_telemetry::http::client_builder();
        if let Some(pem) = ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| anyhow::anyhow!("agent_ca_file is not PEM: {e}"))?;
            anyhow::ensure!(!certs.is_empty(), "agent_ca_file holds no certificate");
            builder = builder.tls_certs_merge(certs);
        }
        let client = builder
            .dns_resolver(Arc::new(EgressResolver(egress.clone())))
            // A redirect would lead the call where the checks above never
            // looked (an IP literal, the metadata service): none is followed.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self { client, egress, max_output_bytes })
    }

    /// The client (shared with the MCP transport: the same egress checks).
    pub fn client(&self) -> reqwest::Client {
        self.client.clone()
    }

    /// The egress policy.
    pub fn egress(&self) -> Arc<Egress> {
        self.egress.clone()
    }
}

/// Characters a header value keeps as they are: RFC 3986's unreserved.
const UNRESERVED: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Percent-encodes text for a header value (unreserved characters kept).
pub fn percent_encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, UNRESERVED).to_string()
}

fn headers(call: &Call<'_>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    set(header::IDEMPOTENCY_KEY, call.idempotency_key());
    set(header::REQUEST_ID, call.request_id.to_owned());
    set(header::EXECUTION_ID, call.execution_id.to_owned());
    set(header::STEP_ID, call.step_id.to_owned());
    set(header::AGENT_ID, call.target.agent_id.clone());
    set(header::ATTEMPT, call.attempt.to_string());
    if !call.instruction.is_empty() {
        set(header::INSTRUCTION, percent_encode(call.instruction));
    }
    // Without traces of its own, the executor passes on the context the
    // execution was started in.
    if !agentmesh_telemetry::exporting() && !call.traceparent.is_empty() {
        set("traceparent", call.traceparent.to_owned());
    }
    agentmesh_telemetry::propagation::inject(&tracing::Span::current(), Some(call.request_id), &mut headers);
    if let Some(credential) = call.credential {
        headers.insert(credential.header.clone(), credential.value.clone());
    }
    headers
}

/// What a non-2xx answer means for retries.
fn classify(status: StatusCode, body: &Value, retry_after: Option<Duration>) -> Failure {
    let said = body
        .get("error")
        .or_else(|| body.get("message"))
        .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
        .unwrap_or_else(|| body.as_str().map_or_else(|| body.to_string(), str::to_owned));
    let said: String = said.chars().take(300).collect();
    let agent_says_retry = body.get("retryable").and_then(Value::as_bool).unwrap_or(false);
    let retryable = match status.as_u16() {
        429 | 502 | 503 | 504 => true,
        500..=599 => agent_says_retry,
        _ => false,
    };
    Failure {
        message: format!("the agent answered HTTP {}: {said}", status.as_u16()),
        retryable,
        retry_after: if retryable { retry_after } else { None },
        agent_fault: status.is_server_error(),
        // A gateway in front of the agent may have passed the call on
        // before it gave up or lost the agent's answer.
        ambiguous: matches!(status.as_u16(), 502 | 504),
    }
}

#[async_trait]
impl AgentTransport for HttpTransport {
    async fn invoke(&self, call: &Call<'_>) -> Result<Reply, Failure> {
        let url = capability_url(&call.target.base_url, &call.target.endpoint).map_err(Failure::fatal)?;
        self.egress.check_call(&url).map_err(|e| Failure::fatal(format!("refused to call {url}: {e}")))?;
        let sent = self
            .client
            .post(url.clone())
            .headers(headers(call))
            .json(call.parameters)
            .timeout(call.timeout)
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(e) if e.is_timeout() && !e.is_connect() => {
                return Err(Failure::unanswered(format!(
                    "no answer from {url} within {} ms",
                    call.timeout.as_millis()
                )));
            }
            Err(e) => {
                let denied = error_chain(&e).contains("in a denied network");
                if denied {
                    return Err(Failure::fatal(format!("refused to call {url}: {}", error_chain(&e))));
                }
                let message = format!("could not reach {url}: {}", error_chain(&e));
                // No connection (refused, unresolvable, timed out connecting):
                // the request never left. Any other error came after it did.
                return Err(if e.is_connect() || e.is_builder() {
                    Failure::unreachable(message)
                } else {
                    Failure::unanswered(message)
                });
            }
        };
        let status = response.status();
        let response_location: Option<String> = response
            .headers()
            .get(http::header::LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).chars().take(300).collect());
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, chrono::Utc::now()));
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > self.max_output_bytes {
                        return Err(Failure::fatal(format!(
                            "the agent's answer is larger than {} bytes (max_output_bytes)",
                            self.max_output_bytes
                        )));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) if e.is_timeout() => {
                    return Err(Failure::unanswered(format!("the answer from {url} timed out while being read")));
                }
                Err(e) => {
                    return Err(Failure::unanswered(format!("reading the answer from {url}: {}", error_chain(&e))));
                }
            }
        }
        if status.is_redirection() {
            let location = response_location.unwrap_or_else(|| "nowhere".into());
            return Err(Failure::fatal(format!(
                "the agent answered HTTP {} redirecting to {location}; calls to agents do not follow redirects",
                status.as_u16()
            )));
        }
        if !status.is_success() {
            let value =
                serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
            return Err(classify(status, &value, retry_after));
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(Failure::fatal(format!("the agent answered HTTP {} with an empty body", status.as_u16())));
        }
        let value: Value = serde_json::from_slice(&body).map_err(|e| {
            Failure::fatal(format!("the agent answered HTTP {} with a body that is not JSON: {e}", status.as_u16()))
        })?;
        read_answer(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_listed_statuses_are_retried() {
        for (status, retryable) in
            [(429, true), (502, true), (503, true), (504, true), (500, false), (400, false), (404, false)]
        {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT);
            assert_eq!(classify(status, &json!({}), None).retryable, retryable, "{status}");
        }
        let said = classify(StatusCode::INTERNAL_SERVER_ERROR, &json!({"error": "db down", "retryable": true}), None);
        assert!(said.retryable && said.agent_fault);
        assert_eq!(said.message, "the agent answered HTTP 500: db down");
        let four = classify(StatusCode::BAD_REQUEST, &json!({"error": "bad", "retryable": true}), None);
        assert!(!four.retryable && !four.agent_fault, "never after another 4xx");
        for (status, ambiguous) in [(429, false), (502, true), (503, false), (504, true), (500, false)] {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT);
            assert_eq!(classify(status, &json!({}), None).ambiguous, ambiguous, "{status}");
        }
    }

    #[test]
    fn instructions_are_percent_encoded() {
        assert_eq!(percent_encode("Get TSLA\n→ now"), "Get%20TSLA%0A%E2%86%92%20now");
    }
}
