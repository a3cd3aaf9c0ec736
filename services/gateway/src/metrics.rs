//! Prometheus metrics of the gateway.

use prometheus::{Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    /// Orchestrations by how they ended: `answered`, `failed`, `gone` (the
    /// client went away).
    pub orchestrations: IntCounterVec,
    /// Time from the request to the last message.
    pub duration: Histogram,
    /// Failed orchestrations by the stage that failed and its gRPC code.
    pub failures: IntCounterVec,
    /// Messages that could not be stored (their streams cannot be resumed past them).
    pub events_lost: IntCounter,
    /// Streams resumed with `Last-Event-ID`.
    pub resumed: IntCounter,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let orchestrations = IntCounterVec::new(
            Opts::new("agentmesh_gateway_orchestrations_total", "Orchestrations by how they ended"),
            &["outcome"],
        )?;
        let duration = Histogram::with_opts(
            HistogramOpts::new("agentmesh_gateway_orchestration_duration_seconds", "Time to the last message")
                .buckets(vec![0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]),
        )?;
        let failures = IntCounterVec::new(
            Opts::new("agentmesh_gateway_failures_total", "Failed orchestrations by stage and gRPC code"),
            &["service", "code"],
        )?;
        registry.register(Box::new(orchestrations.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        let events_lost = IntCounter::new(
            "agentmesh_gateway_events_lost_total",
            "Orchestration messages that could not be stored for resuming",
        )?;
        let resumed = IntCounter::new("agentmesh_gateway_resumed_streams_total", "Streams resumed with Last-Event-ID")?;
        registry.register(Box::new(failures.clone()))?;
        registry.register(Box::new(events_lost.clone()))?;
        registry.register(Box::new(resumed.clone()))?;
        Ok(Self { registry, orchestrations, duration, failures, events_lost, resumed })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buffer) {
            tracing::warn!(error = %e, "could not encode metrics");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}
