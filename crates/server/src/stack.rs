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
    /// Calls open at once, from their request to the last byte of their
    /// answer: streams (a watch, an execution's events, an SSE follower)
    /// count for as long as they stay open. One more is refused at once.
    pub max_open_calls: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(60),
            max_concurrent_requests: 10_000,
            max_request_bytes: 1 << 20,
            max_open_calls: 10_000,
        }
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
/// A body's id is held to what a header's must be ([`check_request_id`]):
/// `INVALID_ARGUMENT` otherwise.
pub fn call_request_id(metadata: &tonic::metadata::MetadataMap, given: &str) -> Result<String, tonic::Status> {
    if !given.is_empty() {
        check_request_id(given).map_err(tonic::Status::invalid_argument)?;
        return Ok(given.to_owned());
    }
    Ok(request_id_of(metadata.as_ref()).filter(|id| !id.is_empty()).unwrap_or_else(new_request_id))
}

/// Longest request id kept, from a header or a body.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// A request id taken from a body or a path is what a client's
/// `x-request-id` must be: 1-128 visible ASCII characters, so that it can
/// never forge a log line or fill one. The error never quotes the id.
pub fn check_request_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("request_id is empty".into());
    }
    if id.len() > MAX_REQUEST_ID_LEN {
        return Err(format!(
            "request_id is {} bytes long; at most {MAX_REQUEST_ID_LEN} visible ASCII characters are accepted",
            id.len()
        ));
    }
    if let Some(at) = id.bytes().position(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "request_id holds a space, a control or a non-ASCII character at byte {at}; \
             only visible ASCII characters are accepted"
        ));
    }
    Ok(())
}

/// The deadline a gRPC client gave its call (`grpc-timeout`), if any.
pub fn call_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    grpc_timeout(metadata.as_ref())
}

/// A client's id is kept when it is 1-128 visible ASCII characters.
fn acceptable_request_id(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_REQUEST_ID_LEN && bytes.iter().all(|b| b.is_ascii_graphic())
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
pub fn stack(http: Router, grpc: Router, limits: &Limits, auth: Option<Auth>) -> Router {
    let max = limits.max_request_bytes;
    let http =
        http.layer(RequestBodyLimitLayer::new(max)).layer(middleware::from_fn_with_state(max, payload_too_large));
    let grpc = grpc.layer(middleware::from_fn_with_state(max, fix_grpc_status));
    let app = http
        .merge(grpc)
        .fallback(crate::grpc::not_found)
        .layer(GlobalConcurrencyLimitLayer::new(limits.max_concurrent_requests.max(1)))
        .layer(middleware::from_fn_with_state(limits.request_timeout, deadline))
        .layer(middleware::from_fn_with_state(OpenCalls::new(limits.max_open_calls), open_calls));
    let app =
        if agentmesh_telemetry::exporting() { app.layer(agentmesh_telemetry::rpc::ServerTraceLayer) } else { app };
    let app = match auth {
        Some(auth) => app.layer(middleware::from_fn_with_state(std::sync::Arc::new(auth), authenticate)),
        None => app,
    };
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

/// Authentication on a port: who the callers are, and the service's rules
/// for what each call needs.
#[derive(Clone)]
pub struct Auth {
    /// The tokens.
    pub authenticator: crate::auth::Authenticator,
    /// The roles each call needs.
    pub rules: crate::auth::Rules,
}

/// Authenticates every call but the probes and reflection, checks the role
/// it needs, and hands the handler its [`crate::auth::Principal`]; refuses
/// with `UNAUTHENTICATED`/`PERMISSION_DENIED` (gRPC) or `401`/`403` (REST),
/// saying what was missing, never quoting the token.
async fn authenticate(State(auth): State<std::sync::Arc<Auth>>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if is_probe(path) || path.starts_with("/grpc.reflection.") {
        return next.run(request).await;
    }
    let access = (auth.rules)(request.method(), path);
    if access == crate::auth::Access::Public {
        return next.run(request).await;
    }
    let peer = request.extensions().get::<crate::auth::PeerCertificate>().copied();
    let refusal = match auth.authenticator.check(request.headers(), peer.as_ref(), access) {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            return next.run(request).await;
        }
        Err(refusal) => refusal,
    };
    let grpc = is_grpc(request.headers());
    let request_id = request_id_of(request.headers()).unwrap_or_default();
    let (status, code, message) = match refusal {
        crate::auth::Refusal::Unauthenticated(m) => (StatusCode::UNAUTHORIZED, "unauthenticated", m),
        crate::auth::Refusal::Denied(m) => (StatusCode::FORBIDDEN, "permission_denied", m),
    };
    if grpc {
        let status = if status == StatusCode::UNAUTHORIZED {
            tonic::Status::unauthenticated(message)
        } else {
            tonic::Status::permission_denied(message)
        };
        return status.into_http();
    }
    let mut response = (status, axum::Json(error_body(code, &message, None, &request_id))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// The slots of open calls ([`Limits::max_open_calls`]).
#[derive(Clone)]
struct OpenCalls {
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    limit: usize,
}

impl OpenCalls {
    fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        Self { slots: std::sync::Arc::new(tokio::sync::Semaphore::new(limit)), limit }
    }
}

/// Whether a path is a probe: never counted or refused, so that an
/// overloaded service can still say so.
fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics") || path.starts_with("/grpc.health.v1.Health/")
}

/// Holds a slot from the request until the answer's last byte (or until
/// the client goes away), streams included; refuses a call over the count
/// at once: `RESOURCE_EXHAUSTED` for gRPC, `503` with the REST error body.
async fn open_calls(State(open): State<OpenCalls>, request: Request, next: Next) -> Response {
    if is_probe(request.uri().path()) {
        return next.run(request).await;
    }
    let Ok(slot) = open.slots.clone().try_acquire_owned() else {
        let message =
            format!("{} calls are open on this service, streams included (max_open_calls); retry shortly", open.limit);
        if is_grpc(request.headers()) {
            return tonic::Status::resource_exhausted(message).into_http();
        }
        let request_id = request_id_of(request.headers()).unwrap_or_default();
        let body = error_body("overloaded", &message, Some(json!({"max_open_calls": open.limit})), &request_id);
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    };
    next.run(request).await.map(|body| axum::body::Body::new(Holding { inner: body, _slot: slot }))
}

pin_project_lite::pin_project! {
    /// An answer's body holding its call's slot until it is dropped.
    struct Holding {
        #[pin]
        inner: axum::body::Body,
        _slot: tokio::sync::OwnedSemaphorePermit,
    }
}

impl http_body::Body for Holding {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
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

/// The start of the message tonic gives a request it cannot decode (a
/// `Struct` nested past the decoder's recursion limit among them).
const TONIC_UNDECODABLE: &str = "failed to decode Protobuf message";

/// Longest gRPC status message sent: far below the 16 KiB of headers a
/// client reads by default (a longer one arrives as `RESOURCE_EXHAUSTED`,
/// its own message lost).
pub const MAX_STATUS_MESSAGE_BYTES: usize = 4096;

/// Fixes the statuses gRPC clients would misread:
/// - a message over the decoding limit: tonic says `OUT_OF_RANGE`; gRPC's
///   convention is `RESOURCE_EXHAUSTED`, and the caller is told which
///   setting to raise;
/// - a request tonic cannot decode is the client's error: `INVALID_ARGUMENT`
///   (tonic says `INTERNAL`), saying how deep JSON values may nest;
/// - a message longer than [`MAX_STATUS_MESSAGE_BYTES`] is cut, saying so.
async fn fix_grpc_status(State(limit): State<usize>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let Some(status) = tonic::Status::from_header_map(response.headers()) else { return response };
    let fixed = if status.code() == tonic::Code::OutOfRange && status.message().starts_with(TONIC_TOO_LARGE) {
        tonic::Status::resource_exhausted(format!(
            "the request is larger than this service accepts ({limit} bytes); send a smaller one, or raise the \
             service's max_request_bytes"
        ))
    } else if status.code() == tonic::Code::Internal && status.message().starts_with(TONIC_UNDECODABLE) {
        tonic::Status::invalid_argument(format!(
            "the request could not be decoded ({}); JSON values (google.protobuf.Struct) may nest objects and \
             arrays at most {} levels deep",
            status.message(),
            agentmesh_core::validate::MAX_JSON_DEPTH
        ))
    } else if status.message().len() > MAX_STATUS_MESSAGE_BYTES {
        let cut = status.message().floor_char_boundary(MAX_STATUS_MESSAGE_BYTES - 64);
        let message = format!("{}… ({} more bytes not shown)", &status.message()[..cut], status.message().len() - cut);
        tonic::Status::with_details(status.code(), message, status.details().to_vec().into())
    } else {
        return response;
    };
    let (mut parts, body) = response.into_parts();
    let (fixed_parts, _) = fixed.into_http::<axum::body::Body>().into_parts();
    for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
        parts.headers.remove(name);
    }
    parts.headers.extend(fixed_parts.headers);
    Response::from_parts(parts, body)
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
