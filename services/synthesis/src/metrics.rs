//! Prometheus metrics of the synthesis service, counted by the handlers
//! (Synthesize streams, so its outcome is known only at the end).

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

/// Every metric the synthesis service exports.
pub struct Metrics {
    registry: Registry,
    /// RPCs by method and outcome (`ok` or the gRPC code name).
    pub requests: IntCounterVec,
    /// RPC latency by method, the whole stream for Synthesize.
    pub request_duration: HistogramVec,
    /// LLM calls by kind (`synthesis`, `review`) and result.
    pub llm_calls: IntCounterVec,
    /// Answers written without the model (zero-step plans, nothing succeeded).
    pub direct_answers: IntCounter,
    /// Review recovery actions dropped as not actionable.
    pub actions_dropped: IntCounter,
    /// Reviews by verdict (`achieved`, `not_achieved`).
    pub reviews: IntCounterVec,
    /// Answers that stated values found neither in the results nor in the
    /// request, by what was done (`flagged` in a review, `replaced`).
    pub unsupported_answers: IntCounterVec,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("agentmesh_synthesis_requests_total", "Synthesis RPCs by method and outcome"),
            &["rpc", "status"],
        )?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new("agentmesh_synthesis_request_duration_seconds", "Synthesis RPC latency, whole streams")
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]),
            &["rpc"],
        )?;
        let llm_calls = IntCounterVec::new(
            Opts::new("agentmesh_synthesis_llm_calls_total", "LLM calls by kind and result"),
            &["kind", "status"],
        )?;
        let direct_answers = IntCounter::new(
            "agentmesh_synthesis_direct_answers_total",
            "Answers written without the model: zero-step plans and runs where no step succeeded",
        )?;
        let actions_dropped = IntCounter::new(
            "agentmesh_synthesis_review_actions_dropped_total",
            "Recovery actions dropped for naming a tool outside the catalog or a step that did not fail",
        )?;
        let reviews =
            IntCounterVec::new(Opts::new("agentmesh_synthesis_reviews_total", "Reviews by verdict"), &["verdict"])?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_duration.clone()))?;
        registry.register(Box::new(llm_calls.clone()))?;
        registry.register(Box::new(direct_answers.clone()))?;
        registry.register(Box::new(actions_dropped.clone()))?;
        registry.register(Box::new(reviews.clone()))?;
        let unsupported_answers = IntCounterVec::new(
            Opts::new(
                "agentmesh_synthesis_unsupported_answers_total",
                "Answers stating values found neither in the results nor in the request, by action (flagged, replaced)",
            ),
            &["action"],
        )?;
        registry.register(Box::new(unsupported_answers.clone()))?;
        Ok(Self {
            registry,
            requests,
            request_duration,
            llm_calls,
            direct_answers,
            actions_dropped,
            reviews,
            unsupported_answers,
        })
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
