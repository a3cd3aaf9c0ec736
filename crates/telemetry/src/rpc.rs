//! One tower layer for every server (a span per gRPC call or HTTP request,
//! continuing the caller's trace) and one for every gRPC client channel (a
//! client span whose context is injected into the call). A span lives as
//! long as the response body, so a streaming call is one span from its
//! first byte to its last, and the gRPC status is read from the trailers.
//!
//! While traces are not exported, both layers pass calls through untouched.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::extract::MatchedPath;
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::propagation;

/// Paths never traced: probes, metrics, health checks and reflection, so
/// that a collector sees requests, not their monitoring.
const UNTRACED: [&str; 6] =
    ["/grpc.health.v1.Health/", "/grpc.reflection.", "/metrics", "/healthz", "/readyz", "/favicon.ico"];

/// Which end of a call a span describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Server,
    Client,
}

/// Traces every request a server receives.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerTraceLayer;

impl<S> Layer<S> for ServerTraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced { inner, side: Side::Server, authorization: None }
    }
}

/// Traces every call made through a gRPC client channel.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientTraceLayer;

impl<S> Layer<S> for ClientTraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced { inner, side: Side::Client, authorization: None }
    }
}

/// How this process calls other services: at `https://` addresses, the CA
/// that signed their certificates (trusted besides the system's roots) and
/// the certificate it presents to services that ask for one (mTLS); and
/// the bearer token it authenticates with, where they require one.
#[derive(Clone, Default)]
pub struct ClientSettings {
    /// PEM CA certificates.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate chain and private key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Bearer token sent on every call ([`traced_with`]).
    pub bearer: Option<String>,
}

impl std::fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSettings")
            .field("ca", &self.ca_pem.is_some())
            .field("identity", &self.identity.is_some())
            .field("bearer", &self.bearer.as_ref().map(|_| "***"))
            .finish()
    }
}

impl ClientSettings {
    /// tonic's TLS settings: the system's roots, the CA, the identity.
    pub fn tls_config(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = &self.ca_pem {
            config = config.ca_certificate(tonic::transport::Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &self.identity {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        config
    }
}

/// Connections to the service `name` at `url`, each connected on first use
/// (so a service may start before the ones it calls) and opened as calls
/// need them ([`crate::pool`]), giving up on a connection attempt after
/// 5 s; over TLS for an `https://` address.
pub fn channel(name: &str, url: &str, tls: &ClientSettings) -> anyhow::Result<crate::pool::Pool> {
    let endpoint = endpoint(name, url, tls)?;
    Ok(crate::pool::Pool::new(name, || endpoint.connect_lazy()))
}

/// One connection's settings.
fn endpoint(name: &str, url: &str, tls: &ClientSettings) -> anyhow::Result<tonic::transport::Endpoint> {
    use anyhow::Context as _;
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("{name} url `{url}`"))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .tcp_nodelay(true);
    if url.starts_with("https://") {
        crate::http::install_tls_provider();
        endpoint = endpoint.tls_config(tls.tls_config()).with_context(|| format!("TLS to {name} at `{url}`"))?;
    }
    Ok(endpoint)
}

/// The canonical name of a gRPC status code (`INVALID_ARGUMENT`), as
/// metrics label it and logs print it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A gRPC channel whose calls are traced and carry the trace context.
pub type TracedChannel = Traced<crate::pool::Pool>;

/// Wraps a channel so that its calls are traced.
pub fn traced(channel: crate::pool::Pool) -> TracedChannel {
    ClientTraceLayer.layer(channel)
}

/// Wraps a channel so that its calls are traced and carry `client`'s
/// bearer token, when it has one.
pub fn traced_with(channel: crate::pool::Pool, client: &ClientSettings) -> TracedChannel {
    let mut traced = traced(channel);
    traced.authorization =
        client.bearer.as_deref().and_then(|token| http::HeaderValue::from_str(&format!("Bearer {token}")).ok()).map(
            |mut value| {
                value.set_sensitive(true);
                value
            },
        );
    traced
}

/// A service whose calls are traced (see [`ServerTraceLayer`], [`ClientTraceLayer`]).
#[derive(Clone)]
pub struct Traced<S> {
    inner: S,
    side: Side,
    /// Sent as `authorization` on every call (client side).
    authorization: Option<http::HeaderValue>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Traced<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traced").field("inner", &self.inner).field("side", &self.side).finish_non_exhaustive()
    }
}

impl<S, B, RB> Service<http::Request<B>> for Traced<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = http::Response<TracedBody<RB>>;
    type Error = S::Error;
    type Future = TraceFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(value) = &self.authorization
            && !request.headers().contains_key(http::header::AUTHORIZATION)
        {
            request.headers_mut().insert(http::header::AUTHORIZATION, value.clone());
        }
        let span = if crate::exporting() {
            match self.side {
                Side::Server => server_span(&request),
                Side::Client => client_span(&mut request),
            }
        } else {
            None
        };
        let inner = match &span {
            Some(span) => span.in_scope(|| self.inner.call(request)),
            None => self.inner.call(request),
        };
        TraceFuture { inner, span, side: self.side }
    }
}

fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// `/pkg.Service/Method` → (`pkg.Service`, `Method`).
fn rpc_name(path: &str) -> (&str, &str) {
    let trimmed = path.trim_start_matches('/');
    trimmed.split_once('/').unwrap_or((trimmed, ""))
}

fn header<B>(request: &http::Request<B>, name: &str) -> Option<String> {
    request.headers().get(name).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty()).map(str::to_owned)
}

fn server_span<B>(request: &http::Request<B>) -> Option<Span> {
    let path = request.uri().path();
    if UNTRACED.iter().any(|p| path.starts_with(p)) {
        return None;
    }
    let parent = propagation::extract(request.headers());
    let request_id = propagation::request_id(&parent).or_else(|| header(request, "x-request-id"));
    let span = if is_grpc(request.headers()) {
        let (service, method) = rpc_name(path);
        tracing::info_span!(
            "grpc.server",
            otel.name = %format_args!("{service}/{method}"),
            otel.kind = "server",
            otel.status_code = Empty,
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
            rpc.grpc.status_code = Empty,
            request_id = Empty,
        )
    } else {
        let route = request.extensions().get::<MatchedPath>().map_or(path, MatchedPath::as_str);
        tracing::info_span!(
            "http.server",
            otel.name = %format_args!("{} {route}", request.method()),
            otel.kind = "server",
            otel.status_code = Empty,
            http.request.method = %request.method(),
            http.route = %route,
            url.path = %path,
            http.response.status_code = Empty,
            request_id = Empty,
        )
    };
    if let Some(id) = request_id {
        span.record("request_id", id);
    }
    let _ = span.set_parent(parent);
    Some(span)
}

fn client_span<B>(request: &mut http::Request<B>) -> Option<Span> {
    let path = request.uri().path().to_owned();
    if path.starts_with("/grpc.health.v1.Health/") {
        return None;
    }
    let (service, method) = rpc_name(&path);
    // Host and port only: never the user info an address may carry.
    let authority = request
        .uri()
        .authority()
        .map(|a| a.port().map_or_else(|| a.host().to_owned(), |port| format!("{}:{port}", a.host())))
        .unwrap_or_default();
    let span = tracing::info_span!(
        "grpc.client",
        otel.name = %format_args!("{service}/{method}"),
        otel.kind = "client",
        otel.status_code = Empty,
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
        rpc.grpc.status_code = Empty,
        server.address = %authority,
    );
    let request_id = header(request, "x-request-id");
    propagation::inject(&span, request_id.as_deref(), request.headers_mut());
    Some(span)
}

/// Whether a gRPC status code marks the span as failed: on a server only
/// the codes that mean the server failed, on a client every non-OK code.
fn grpc_failed(side: Side, code: i64) -> bool {
    match side {
        Side::Client => code != 0,
        // UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS
        Side::Server => matches!(code, 2 | 4 | 12 | 13 | 14 | 15),
    }
}

fn record_grpc_status(span: &Span, side: Side, headers: &http::HeaderMap) -> bool {
    let Some(code) = headers.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i64>().ok())
    else {
        return false;
    };
    span.record("rpc.grpc.status_code", code);
    if grpc_failed(side, code) {
        span.record("otel.status_code", "ERROR");
    }
    true
}

pin_project_lite::pin_project! {
    /// The response future of a [`Traced`] service.
    pub struct TraceFuture<F> {
        #[pin]
        inner: F,
        span: Option<Span>,
        side: Side,
    }
}

impl<F, RB, E> Future for TraceFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<TracedBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.span.as_ref().map(Span::enter);
            ready!(this.inner.poll(cx))
        };
        let span = this.span.take();
        let side = *this.side;
        Poll::Ready(match result {
            Ok(response) => {
                let mut done = false;
                if let Some(span) = &span {
                    if is_grpc(response.headers()) {
                        done = record_grpc_status(span, side, response.headers());
                    } else {
                        span.record("http.response.status_code", response.status().as_u16());
                        if response.status().is_server_error() {
                            span.record("otel.status_code", "ERROR");
                        }
                    }
                }
                // A trailers-only gRPC answer is complete: the span ends now.
                let span = if done { None } else { span };
                Ok(response.map(|inner| TracedBody { inner, span, side }))
            }
            Err(error) => {
                if let Some(span) = &span {
                    span.record("otel.status_code", "ERROR");
                }
                Err(error)
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its call's span open until its last frame.
    pub struct TracedBody<B> {
        #[pin]
        inner: B,
        span: Option<Span>,
        side: Side,
    }
}

impl<B: Body> Body for TracedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = {
            let _entered = this.span.as_ref().map(Span::enter);
            ready!(this.inner.poll_frame(cx))
        };
        match &frame {
            Some(Ok(frame)) => {
                if let (Some(span), Some(trailers)) = (this.span.as_ref(), frame.trailers_ref()) {
                    record_grpc_status(span, *this.side, trailers);
                }
            }
            Some(Err(_)) => {
                if let Some(span) = this.span.take() {
                    span.record("otel.status_code", "ERROR");
                }
            }
            None => {
                this.span.take();
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_names_split_service_and_method() {
        assert_eq!(rpc_name("/agentmesh.v1.PlannerService/CreatePlan"), ("agentmesh.v1.PlannerService", "CreatePlan"));
        assert_eq!(rpc_name("/odd"), ("odd", ""));
    }

    #[test]
    fn server_spans_fail_only_on_server_faults() {
        assert!(!grpc_failed(Side::Server, 3), "INVALID_ARGUMENT is the caller's fault");
        assert!(!grpc_failed(Side::Server, 5), "NOT_FOUND is an answer");
        assert!(grpc_failed(Side::Server, 14));
        assert!(grpc_failed(Side::Client, 5));
    }
}
