//! W3C trace context (`traceparent`, `tracestate`) and baggage
//! (`request_id`) in and out of HTTP headers and gRPC metadata.

use std::collections::HashMap;

use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The baggage key carrying the request id from hop to hop.
pub const REQUEST_ID_BAGGAGE: &str = "request_id";

/// The trace context and baggage carried by incoming headers.
pub fn extract(headers: &http::HeaderMap) -> Context {
    global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)))
}

/// Writes `span`'s trace context into `headers` (`traceparent`,
/// `tracestate`), with `request_id` as baggage. Nothing is written while
/// traces are not exported, or when the span is not recorded.
pub fn inject(span: &Span, request_id: Option<&str>, headers: &mut http::HeaderMap) {
    if !crate::exporting() {
        return;
    }
    let mut cx = span.context();
    if let Some(id) = request_id.filter(|id| !id.is_empty()) {
        cx = cx.with_baggage([KeyValue::new(REQUEST_ID_BAGGAGE, id.to_owned())]);
    }
    global::get_text_map_propagator(|p| p.inject_context(&cx, &mut HeaderInjector(headers)));
}

/// The request id a context carries as baggage.
pub fn request_id(cx: &Context) -> Option<String> {
    cx.baggage().get(REQUEST_ID_BAGGAGE).map(|v| v.as_str().to_owned()).filter(|v| !v.is_empty())
}

/// `span`'s `traceparent` header value, when it is traced (stored with an
/// execution so that a resumed execution continues the same trace).
pub fn traceparent(span: &Span) -> Option<String> {
    if !crate::exporting() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// The hex trace id of `span`, when it is traced.
pub fn trace_id(span: &Span) -> Option<String> {
    if !crate::exporting() {
        return None;
    }
    let cx = span.context();
    let span_context = cx.span().span_context().clone();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
}

/// Makes `span` a child of the context a stored `traceparent` names; a value
/// that does not parse leaves the span where it is.
pub fn continue_trace(span: &Span, traceparent: &str) {
    if traceparent.is_empty() || !crate::exporting() {
        return;
    }
    let carrier: HashMap<String, String> = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}
