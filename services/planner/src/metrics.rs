//! Prometheus metrics of the planner. Planning counters are fed from each
//! request's [`PlanStats`] and LLM interactions once it is answered, so the
//! engine itself stays free of metrics.

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

use crate::engine::{Interaction, InteractionKind, PlanStats};

/// Every metric the planner exports.
pub struct Metrics {
    registry: Registry,
    /// Planner RPCs by method and gRPC status.
    pub requests: IntCounterVec,
    /// Planner RPC latency by method.
    pub request_duration: HistogramVec,
    /// LLM calls by kind and result.
    pub llm_calls: IntCounterVec,
    /// LLM call latency by kind (successful calls).
    pub llm_duration: HistogramVec,
    /// Plans rejected for naming an agent or capability that was not offered.
    pub hallucinations_detected: IntCounter,
    /// Hallucinations followed by a valid plan.
    pub hallucinations_recovered: IntCounter,
    /// Requests that failed because the model kept hallucinating.
    pub hallucinations_unrecoverable: IntCounter,
    /// Answers that were not a plan.
    pub parse_errors: IntCounter,
    /// Planning retries by cause (`parse`, `validation`, `hallucination`).
    pub retries: IntCounterVec,
    /// Pre-selections that failed and fell back to every candidate.
    pub preselection_fallbacks: IntCounter,
    /// Pre-selections that kept nothing (answered with a zero-step plan).
    pub preselection_empty: IntCounter,
    /// Answers cut off at the token limit.
    pub truncated_answers: IntCounter,
    /// Steps merged into an earlier, identical step.
    pub repeated_steps_merged: IntCounter,
}

/// The interaction kind as a label value.
pub fn kind_label(kind: InteractionKind) -> &'static str {
    match kind {
        InteractionKind::Preselection => "preselection",
        InteractionKind::Plan => "plan",
        InteractionKind::PlanRetry => "plan_retry",
        InteractionKind::HallucinationRetry => "hallucination_retry",
        InteractionKind::Replan => "replan",
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("agentmesh_planner_requests_total", "Planner RPCs by method and gRPC status"),
            &["rpc", "status"],
        )?;
        let request_duration = HistogramVec::new(
            HistogramOpts::new("agentmesh_planner_request_duration_seconds", "Planner RPC latency, LLM calls included")
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]),
            &["rpc"],
        )?;
        let llm_calls = IntCounterVec::new(
            Opts::new("agentmesh_planner_llm_calls_total", "LLM calls by kind and result"),
            &["kind", "status"],
        )?;
        let llm_duration = HistogramVec::new(
            HistogramOpts::new("agentmesh_planner_llm_call_duration_seconds", "Latency of successful LLM calls")
                .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0]),
            &["kind"],
        )?;
        let hallucinations_detected = IntCounter::new(
            "agentmesh_planner_hallucinations_detected_total",
            "Plans rejected for naming an agent or capability that was not offered",
        )?;
        let hallucinations_recovered = IntCounter::new(
            "agentmesh_planner_hallucinations_recovered_total",
            "Hallucinations followed by a valid plan in the same request",
        )?;
        let hallucinations_unrecoverable = IntCounter::new(
            "agentmesh_planner_hallucinations_unrecoverable_total",
            "Requests that failed because the model kept naming what was not offered",
        )?;
        let parse_errors =
            IntCounter::new("agentmesh_planner_parse_errors_total", "LLM answers that could not be parsed as a plan")?;
        let retries =
            IntCounterVec::new(Opts::new("agentmesh_planner_retries_total", "Planning retries by cause"), &["kind"])?;
        let preselection_fallbacks = IntCounter::new(
            "agentmesh_planner_preselection_fallbacks_total",
            "Pre-selection calls that failed, so planning saw every candidate",
        )?;
        let preselection_empty = IntCounter::new(
            "agentmesh_planner_preselection_empty_total",
            "Pre-selections that kept no capability (answered with a zero-step plan)",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_duration.clone()))?;
        registry.register(Box::new(llm_calls.clone()))?;
        registry.register(Box::new(llm_duration.clone()))?;
        registry.register(Box::new(hallucinations_detected.clone()))?;
        registry.register(Box::new(hallucinations_recovered.clone()))?;
        registry.register(Box::new(hallucinations_unrecoverable.clone()))?;
        registry.register(Box::new(parse_errors.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(preselection_fallbacks.clone()))?;
        registry.register(Box::new(preselection_empty.clone()))?;
        let truncated_answers = IntCounter::new(
            "agentmesh_planner_truncated_answers_total",
            "LLM answers cut off at the token limit (asked again with a tighter bound)",
        )?;
        registry.register(Box::new(truncated_answers.clone()))?;
        let repeated_steps_merged = IntCounter::new(
            "agentmesh_planner_repeated_steps_merged_total",
            "plan steps that repeated an earlier one (same agent, capability and parameters) and were merged into it",
        )?;
        registry.register(Box::new(repeated_steps_merged.clone()))?;
        Ok(Self {
            registry,
            requests,
            request_duration,
            llm_calls,
            llm_duration,
            hallucinations_detected,
            hallucinations_recovered,
            hallucinations_unrecoverable,
            parse_errors,
            retries,
            preselection_fallbacks,
            preselection_empty,
            truncated_answers,
            repeated_steps_merged,
        })
    }

    /// Counts what one planning run did, whether or not it produced a plan.
    pub fn observe_planning(&self, stats: &PlanStats, interactions: &[Interaction]) {
        for i in interactions {
            let kind = kind_label(i.kind);
            let status = if i.error.is_some() { "error" } else { "ok" };
            self.llm_calls.with_label_values(&[kind, status]).inc();
            if i.error.is_none() {
                self.llm_duration.with_label_values(&[kind]).observe(i.latency.as_secs_f64());
            }
        }
        self.hallucinations_detected.inc_by(u64::from(stats.hallucinations_detected));
        self.hallucinations_recovered.inc_by(u64::from(stats.hallucinations_recovered));
        self.parse_errors.inc_by(u64::from(stats.parse_errors));
        self.retries.with_label_values(&["parse"]).inc_by(u64::from(stats.parse_retries));
        self.retries.with_label_values(&["validation"]).inc_by(u64::from(stats.validation_retries));
        self.retries.with_label_values(&["hallucination"]).inc_by(u64::from(stats.hallucination_retries));
        self.preselection_fallbacks.inc_by(u64::from(stats.preselection_fallbacks));
        self.truncated_answers.inc_by(u64::from(stats.truncated_answers));
        self.repeated_steps_merged.inc_by(u64::from(stats.repeated_steps_merged));
        // Pre-selection kept nothing and no plan was asked for: a zero-step plan.
        let planned = interactions.iter().any(|i| i.kind != InteractionKind::Preselection);
        if stats.preselected == Some(0) && !planned {
            self.preselection_empty.inc();
        }
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
