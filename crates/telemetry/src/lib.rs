//! Telemetry for every agentmesh process: log lines (text or JSON, filtered
//! by `RUST_LOG`), OpenTelemetry traces exported over OTLP (gRPC or
//! HTTP/protobuf) when an endpoint is configured, and W3C trace-context
//! propagation across every hop.
//!
//! A process calls [`init`] once at start-up and [`Telemetry::shutdown`] on
//! its way out, which flushes spans not yet exported. With no endpoint
//! configured nothing is exported, no span exists for export's sake, and the
//! layers in [`rpc`] pass calls through untouched.

pub mod config;
mod filter;
pub mod http;
pub mod pool;
pub mod propagation;
pub mod rpc;
pub mod secrets;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use opentelemetry::KeyValue;
use opentelemetry::propagation::TextMapCompositePropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use config::{Export, LogFormat, Protocol, TelemetryConfig};
pub use secrets::redact;

/// The log filter when `RUST_LOG` is not set.
pub const DEFAULT_LOG_FILTER: &str = "info,sqlx=warn,h2=warn,hyper=warn,tower=warn";

static EXPORTING: AtomicBool = AtomicBool::new(false);
static CAPTURE_LLM_CONTENT: AtomicBool = AtomicBool::new(false);

/// Whether this process exports traces (an endpoint was configured).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Whether LLM prompts and completions are recorded on spans.
pub fn capture_llm_content() -> bool {
    CAPTURE_LLM_CONTENT.load(Ordering::Relaxed)
}

/// The running telemetry of a process.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    export: Option<Export>,
}

impl Telemetry {
    /// Where traces go, when they are exported.
    pub fn export(&self) -> Option<&Export> {
        self.export.as_ref()
    }

    /// Exports the spans not yet sent and stops the exporter.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else { return };
        // Shutting down waits for the export task on the runtime; wait
        // off the runtime's own threads.
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = flushed {
            eprintln!("telemetry: could not flush the last spans: {e}");
        }
    }
}

/// Installs logging and, when configured, trace export for a process named
/// `service_name` (`agentmesh-discovery`, …; `OTEL_SERVICE_NAME` wins).
/// Call once, inside the Tokio runtime.
pub fn init(service_name: &str, config: &TelemetryConfig) -> anyhow::Result<Telemetry> {
    let export = config.export()?;
    let sampler = config.sampler()?;
    let extra = config.extra_resource_attributes()?;
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    let provider = match &export {
        Some(export) => Some(
            tracer_provider(service_name, export, sampler, extra)
                .with_context(|| format!("configuring OTLP export to {}", export.endpoint))?,
        ),
        None => None,
    };

    let log_filter = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(_) => {
            let directives = config.log_filter.as_deref().unwrap_or(DEFAULT_LOG_FILTER);
            tracing_subscriber::EnvFilter::try_new(directives)
                .with_context(|| format!("log_filter `{directives}` is not a valid filter"))?
        }
    };
    let logs = match config.log_format {
        // Colours only on a terminal: a file or a pipe gets plain text.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(log_filter);
    let traces = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer("agentmesh")).with_filter(filter::Exported)
    });
    tracing_subscriber::registry().with(logs).with(traces).try_init().context("installing the log subscriber")?;

    EXPORTING.store(provider.is_some(), Ordering::Relaxed);
    CAPTURE_LLM_CONTENT.store(config.capture_llm_content, Ordering::Relaxed);
    if let Some(export) = &export {
        tracing::info!(
            endpoint = %redact(&export.endpoint),
            protocol = export.protocol.as_str(),
            service = service_name,
            "exporting traces over OTLP"
        );
    }
    Ok(Telemetry { provider, export })
}

fn tracer_provider(
    service_name: &str,
    export: &Export,
    sampler: opentelemetry_sdk::trace::Sampler,
    extra: Vec<(String, String)>,
) -> anyhow::Result<SdkTracerProvider> {
    let exporter = match export.protocol {
        Protocol::Grpc => {
            let mut builder = SpanExporter::builder().with_tonic();
            if let Some(endpoint) = &export.configured_endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()?
        }
        Protocol::HttpProtobuf => {
            let client = http::client_builder().build().context("building the OTLP HTTP client")?;
            let mut builder = SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_http_client(client);
            if let Some(endpoint) = &export.configured_endpoint {
                builder = builder.with_endpoint(config::http_traces_url(endpoint));
            }
            builder.build()?
        }
    };
    let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(resource(service_name, extra))
        .build())
}

/// `service.name` (ours unless the environment names one), `service.version`,
/// `OTEL_RESOURCE_ATTRIBUTES` and the configured extras.
fn resource(service_name: &str, extra: Vec<(String, String)>) -> Resource {
    let named_by_env = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let mut builder = Resource::builder();
    if !named_by_env {
        builder = builder.with_service_name(service_name.to_owned());
    }
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_attributes(extra.into_iter().map(|(k, v)| KeyValue::new(k, v)))
        .build()
}

/// The target of log lines that repeat a span event added with
/// [`span_event`]; they are logged, never exported a second time.
pub const EVENT_LOG_TARGET: &str = "agentmesh::events";

/// The value of a span event attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    /// Text.
    Str(String),
    /// A whole number.
    Int(i64),
    /// A flag.
    Bool(bool),
}

impl From<&str> for Attr {
    fn from(value: &str) -> Self {
        Self::Str(value.to_owned())
    }
}

impl From<String> for Attr {
    fn from(value: String) -> Self {
        Self::Str(value)
    }
}

impl From<bool> for Attr {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

impl From<i64> for Attr {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

impl From<u32> for Attr {
    fn from(value: u32) -> Self {
        Self::Int(i64::from(value))
    }
}

impl From<usize> for Attr {
    fn from(value: usize) -> Self {
        Self::Int(i64::try_from(value).unwrap_or(i64::MAX))
    }
}

/// Adds an event named `name` to the current span, with its attributes in
/// the order given (operators search by the first: put `request_id` there).
/// Nothing happens while traces are not exported. Log the same event with
/// `target: EVENT_LOG_TARGET` so that it is not exported twice.
pub fn span_event(name: &'static str, attributes: Vec<(&'static str, Attr)>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if !exporting() {
        return;
    }
    let attributes = attributes
        .into_iter()
        .map(|(key, value)| match value {
            Attr::Str(s) => KeyValue::new(key, s),
            Attr::Int(i) => KeyValue::new(key, i),
            Attr::Bool(b) => KeyValue::new(key, b),
        })
        .collect();
    tracing::Span::current().add_event(name, attributes);
}
