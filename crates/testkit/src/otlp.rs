//! A real OTLP trace receiver: the collector's `TraceService/Export` over
//! gRPC and `POST /v1/traces` over HTTP/protobuf, on one ephemeral port,
//! keeping every span it is sent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::IntoResponse;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue as AnyValueMessage, KeyValue};
use prost::Message;
use serde_json::Value;

/// One span as the receiver got it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// Span name.
    pub name: String,
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex parent span id (empty for a root).
    pub parent_span_id: String,
    /// OTLP span kind (1 internal, 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    /// Attributes.
    pub attributes: BTreeMap<String, Value>,
    /// Events, each with its attributes in the order sent.
    pub events: Vec<ReceivedEvent>,
    /// Status code (0 unset, 1 ok, 2 error).
    pub status_code: i32,
}

/// One span event.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedEvent {
    /// Event name.
    pub name: String,
    /// Attributes, in the order sent.
    pub attributes: Vec<(String, Value)>,
}

impl ReceivedSpan {
    /// An attribute as a string (numbers and booleans rendered), if present.
    pub fn attribute(&self, key: &str) -> Option<String> {
        self.attributes.get(key).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
    }
}

/// OTLP span kinds.
pub mod kind {
    /// A server span.
    pub const SERVER: i32 = 2;
    /// A client span.
    pub const CLIENT: i32 = 3;
}

#[derive(Default)]
struct Received {
    /// Keep the spans (else only count them).
    keep: bool,
    spans: Mutex<Vec<ReceivedSpan>>,
    counted: AtomicU64,
    grpc_exports: AtomicU64,
    http_exports: AtomicU64,
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    received: Arc<Received>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json_of(value: Option<&AnyValueMessage>) -> Value {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => Value::String(s.clone()),
        Some(AnyValue::BoolValue(b)) => Value::Bool(*b),
        Some(AnyValue::IntValue(i)) => Value::from(*i),
        Some(AnyValue::DoubleValue(d)) => Value::from(*d),
        Some(AnyValue::ArrayValue(a)) => Value::Array(a.values.iter().map(|v| json_of(Some(v))).collect()),
        Some(AnyValue::KvlistValue(list)) => {
            Value::Object(list.values.iter().map(|kv| (kv.key.clone(), json_of(kv.value.as_ref()))).collect())
        }
        Some(AnyValue::BytesValue(b)) => Value::String(hex(b)),
        _ => Value::Null,
    }
}

fn pairs(attributes: &[KeyValue]) -> Vec<(String, Value)> {
    attributes.iter().map(|kv| (kv.key.clone(), json_of(kv.value.as_ref()))).collect()
}

impl Received {
    fn keep(&self, request: &ExportTraceServiceRequest) {
        let count = request.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len() as u64).sum();
        self.counted.fetch_add(count, Ordering::Relaxed);
        if !self.keep {
            return;
        }
        let mut kept = Vec::new();
        for resource_spans in &request.resource_spans {
            let resource = resource_spans.resource.as_ref().map(|r| pairs(&r.attributes)).unwrap_or_default();
            let service = resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .and_then(|(_, v)| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            for span in resource_spans.scope_spans.iter().flat_map(|s| &s.spans) {
                kept.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: pairs(&span.attributes).into_iter().collect(),
                    events: span
                        .events
                        .iter()
                        .map(|e| ReceivedEvent { name: e.name.clone(), attributes: pairs(&e.attributes) })
                        .collect(),
                    status_code: span.status.as_ref().map_or(0, |s| s.code),
                });
            }
        }
        if let Ok(mut spans) = self.spans.lock() {
            spans.extend(kept);
        }
    }
}

struct GrpcReceiver(Arc<Received>);

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.grpc_exports.fetch_add(1, Ordering::Relaxed);
        self.0.keep(request.get_ref());
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

async fn http_export(State(received): State<Arc<Received>>, body: Bytes) -> axum::response::Response {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            received.http_exports.fetch_add(1, Ordering::Relaxed);
            received.keep(&request);
            let answer = ExportTraceServiceResponse { partial_success: None }.encode_to_vec();
            ([(axum::http::header::CONTENT_TYPE, "application/x-protobuf")], answer).into_response()
        }
        Err(e) => (axum::http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

impl OtlpReceiver {
    /// Starts the receiver on an ephemeral loopback port.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(true).await
    }

    /// A receiver that only counts what it is sent (for benchmarks, where
    /// keeping millions of spans would cost more than receiving them).
    pub async fn start_counting() -> anyhow::Result<Self> {
        Self::start_with(false).await
    }

    async fn start_with(keep: bool) -> anyhow::Result<Self> {
        let listener = crate::bind_local().await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Received { keep, ..Default::default() });
        let app = tonic::service::Routes::new(TraceServiceServer::new(GrpcReceiver(received.clone())))
            .into_axum_router()
            .route("/v1/traces", axum::routing::post(http_export).with_state(received.clone()));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, received, task })
    }

    /// `http://127.0.0.1:PORT`: the endpoint for both protocols (the HTTP
    /// exporter adds `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Spans received (kept or only counted).
    pub fn span_count(&self) -> u64 {
        self.received.counted.load(Ordering::Relaxed)
    }

    /// Export calls received over gRPC and over HTTP.
    pub fn exports(&self) -> (u64, u64) {
        (self.received.grpc_exports.load(Ordering::Relaxed), self.received.http_exports.load(Ordering::Relaxed))
    }

    /// Waits until `done` holds for the spans received, or `timeout`
    /// passes; returns the spans either way.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || tokio::time::Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
