//! The tower stack every service's port runs behind, built in one place
//! ([`stack`]): request ids, traces, deadlines, a concurrency cap and a
//! body limit, each answering in the caller's protocol (a gRPC status for
//! gRPC, the REST error body for HTTP).

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::{Value, json};
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::util::MapRequestLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, SetRequestIdLayer};

/// The request id header, set on every request and echoed on every response.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Limits every request on a port is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest wait for the head of a response (a streaming call's stream
    /// runs on past it); a gRPC client's shorter `grpc-timeout` wins.
    pub request_timeout: Duration,
    /// Requests handled at once; more wait for a free slot, within their deadline.
    pub max_concurrent_requests: usize,
    /// Largest request body, in bytes.
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { request_timeout: Duration::from_secs(60), max_concurrent_requests: 10_000, max_request_bytes: 1 << 20 }
    }
}

/// A fresh request id such as `req_3f9a0c2e7b1d4a58`.
pub fn new_request_id() -> String {
    format!("req_{:016x}", rand::random::<u64>())
}

/// The request id of a request (the stack always sets one), for handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(request_id_of(&parts.headers).unwrap_or_else(new_request_id)))
    }
}

fn request_id_of(headers: &HeaderMap) -> Option<String> {
    headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// The request id of a gRPC call: `given` (the request body's own) when
/// not empty, else the one the stack set on the call (`x-request-id`, the
/// client's or a fresh one), so that a call has one id from the edge on.
pub fn call_request_id(metadata: &tonic::metadata::MetadataMap, given: &str) -> String {
    if !given.is_empty() {
        return given.to_owned();
    }
    request_id_of(metadata.as_ref()).filter(|id| !id.is_empty()).unwrap_or_else(new_request_id)
}

/// The deadline a gRPC client gave its call (`grpc-timeout`), if any.
pub fn call_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    grpc_timeout(metadata.as_ref())
}

/// A client's id is kept when it is 1-128 visible ASCII characters.
fn acceptable_request_id(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
}

#[derive(Debug, Clone, Copy)]
struct NewRequestId;

impl MakeRequestId for NewRequestId {
    fn make_request_id<B>(&mut self, _request: &http::Request<B>) -> Option<tower_http::request_id::RequestId> {
        HeaderValue::from_str(&new_request_id()).ok().map(tower_http::request_id::RequestId::new)
    }
}

/// The REST error body every service answers with:
/// `{"error", "message", "details"?, "request_id"}`.
pub fn error_body(error: &str, message: &str, details: Option<Value>, request_id: &str) -> Value {
    let mut body = json!({"error": error, "message": message, "request_id": request_id});
    if let Some(details) = details {
        body["details"] = details;
    }
    body
}

/// Whether a request or response speaks gRPC.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// A service's port: its HTTP routes and its gRPC routes (with health and
/// reflection, see [`crate::grpc::router`]) in the shared stack, with
/// [`crate::grpc::not_found`] for every other path. Outermost first:
///
/// 1. request ids (`x-request-id`: the client's when acceptable, else a new
///    one; echoed on the response), and an INFO log line for every request
///    refused as the client's fault ([`log_rejections`]);
/// 2. traces: a server span per request, continuing the caller's trace
///    (only while traces are exported);
/// 3. a deadline: the configured timeout or the client's `grpc-timeout`,
///    whichever is shorter, answered with `DEADLINE_EXCEEDED` or a `503`;
/// 4. a cap on concurrent requests (further requests wait for a slot);
/// 5. a body limit: on HTTP routes tower-http's, answered with a `413` in
///    the REST error shape; on gRPC routes the services' own decoding
///    limit (set it to `max_request_bytes`), answered with
///    `RESOURCE_EXHAUSTED` and the setting to raise. (A byte limit on the
///    body would cut a gRPC message mid-frame, before its length is read,
///    and the client would get only `UNKNOWN`.)
pub fn stack(http: Router, grpc: Router, limits: &Limits) -> Router {
    let max = limits.max_request_bytes;
    let http =
        http.layer(RequestBodyLimitLayer::new(max)).layer(middleware::from_fn_with_state(max, payload_too_large));
    let grpc = grpc.layer(middleware::from_fn_with_state(max, grpc_too_large));
    let app = http
        .merge(grpc)
        .fallback(crate::grpc::not_found)
        .layer(GlobalConcurrencyLimitLayer::new(limits.max_concurrent_requests.max(1)))
        .layer(middleware::from_fn_with_state(limits.request_timeout, deadline));
    let app =
        if agentmesh_telemetry::exporting() { app.layer(agentmesh_telemetry::rpc::ServerTraceLayer) } else { app };
    app.layer(middleware::from_fn(log_rejections))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(NewRequestId))
        .layer(MapRequestLayer::new(|mut request: Request| {
            if request.headers().get(REQUEST_ID_HEADER).is_some_and(|v| !acceptable_request_id(v)) {
                request.headers_mut().remove(REQUEST_ID_HEADER);
            }
            request
        }))
}

/// Most refused requests logged per second; the rest are counted and the
/// count is logged with the next one let through.
const REJECTIONS_LOGGED_PER_SECOND: u32 = 20;

/// The gRPC codes that mean the caller sent something the service refused.
fn client_fault(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::ResourceExhausted
    )
}

/// Whether to log one more refused request now; with the number left
/// unlogged since the last one that was.
fn rejection_budget() -> Option<u64> {
    static WINDOW: std::sync::Mutex<(u64, u32, u64)> = std::sync::Mutex::new((0, 0, 0));
    let second = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut window = WINDOW.lock().ok()?;
    let (at, logged, skipped) = &mut *window;
    if *at != second {
        (*at, *logged) = (second, 0);
    }
    if *logged >= REJECTIONS_LOGGED_PER_SECOND {
        *skipped += 1;
        return None;
    }
    *logged += 1;
    Some(std::mem::take(skipped))
}

/// Logs at INFO every request refused as the client's fault (a REST `4xx`,
/// a gRPC status such as `INVALID_ARGUMENT` or `NOT_FOUND`), with its
/// request id, so that an id quoted in a report can be found in the logs.
/// At most [`REJECTIONS_LOGGED_PER_SECOND`] a second. A streaming call that
/// fails after it started answering reports its status in trailers, which
/// this does not see; the services log those themselves.
async fn log_rejections(request: Request, next: Next) -> Response {
    let request_id = request_id_of(request.headers()).unwrap_or_default();
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let response = next.run(request).await;
    let status = response.status();
    if is_grpc(response.headers()) {
        let Some(grpc) = tonic::Status::from_header_map(response.headers()) else { return response };
        if client_fault(grpc.code())
            && let Some(skipped) = rejection_budget()
        {
            tracing::info!(request_id, rpc = %path, code = ?grpc.code(), reason = grpc.message(), skipped,
                "request refused");
        }
        return response;
    }
    if !status.is_client_error() {
        return response;
    }
    let Some(skipped) = rejection_budget() else { return response };
    // The error body, when it is a small JSON document, for its code and
    // message; anything else passes untouched.
    let (parts, body) = response.into_parts();
    let small_json =
        parts.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
            && axum::body::HttpBody::size_hint(&body).upper().is_some_and(|n| n <= 64 * 1024);
    let (body, parsed) = if small_json {
        let bytes = axum::body::to_bytes(body, 64 * 1024).await.unwrap_or_default();
        let parsed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (axum::body::Body::from(bytes), parsed)
    } else {
        (body, Value::Null)
    };
    tracing::info!(
        request_id,
        method = %method,
        path,
        status = status.as_u16(),
        error = parsed["error"].as_str().unwrap_or_default(),
        reason = parsed["message"].as_str().unwrap_or_default(),
        skipped,
        "request refused"
    );
    Response::from_parts(parts, body)
}

/// `grpc-timeout` (`<up to 8 digits><H|M|S|m|u|n>`) as a duration.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

async fn deadline(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    let grpc = is_grpc(request.headers());
    let timeout = grpc_timeout(request.headers()).map_or(timeout, |client| client.min(timeout));
    let request_id = request_id_of(request.headers()).unwrap_or_default();
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let message = format!("no answer within {} ms", timeout.as_millis());
            tracing::warn!(request_id, timeout_ms = timeout.as_millis(), "request timed out");
            if grpc {
                tonic::Status::deadline_exceeded(message).into_http()
            } else {
                let body = error_body("timeout", &message, None, &request_id);
                (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
            }
        }
    }
}

/// The start of the message tonic gives a gRPC request over its size limit.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

/// Gives the body limit's bare `413` the REST error body. A service's own
/// `413` (already JSON) passes.
async fn payload_too_large(State(limit): State<usize>, request: Request, next: Next) -> Response {
    let request_id = request_id_of(request.headers()).unwrap_or_default();
    let response = next.run(request).await;
    let own_body = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if response.status() != StatusCode::PAYLOAD_TOO_LARGE || own_body {
        return response;
    }
    let message = format!("request body exceeds the limit of {limit} bytes");
    let body = error_body("payload_too_large", &message, Some(json!({"limit_bytes": limit})), &request_id);
    (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response()
}

/// A gRPC message over a service's decoding limit: tonic says
/// `OUT_OF_RANGE`; gRPC's convention is `RESOURCE_EXHAUSTED`, and the
/// caller is told which setting to raise.
async fn grpc_too_large(State(limit): State<usize>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let too_large = tonic::Status::from_header_map(response.headers())
        .is_some_and(|s| s.code() == tonic::Code::OutOfRange && s.message().starts_with(TONIC_TOO_LARGE));
    if !too_large {
        return response;
    }
    tonic::Status::resource_exhausted(format!(
        "the request is larger than this service accepts ({limit} bytes); send a smaller one, or raise the service's \
         max_request_bytes"
    ))
    .into_http()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert("grpc-timeout", HeaderValue::from_str(value).unwrap_or(HeaderValue::from_static("")));
        map
    }

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(grpc_timeout(&headers("250m")), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout(&headers("2S")), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout(&headers("1H")), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout(&headers("123456789S")), None, "at most 8 digits");
        assert_eq!(grpc_timeout(&headers("5x")), None);
        assert_eq!(grpc_timeout(&headers("m")), None);
    }

    #[test]
    fn only_reasonable_client_request_ids_are_kept() {
        assert!(acceptable_request_id(&HeaderValue::from_static("req_1")));
        assert!(!acceptable_request_id(&HeaderValue::from_static("")));
        assert!(!acceptable_request_id(&HeaderValue::from_static("has space")));
        let long = "x".repeat(129);
        assert!(!acceptable_request_id(&HeaderValue::from_str(&long).unwrap_or(HeaderValue::from_static(""))));
    }
}
