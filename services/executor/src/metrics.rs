//! The executor's Prometheus metrics, served at `/metrics`.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Every metric of the executor.
pub struct Metrics {
    registry: Registry,
    /// Steps that reached a final state, by agent and status.
    pub steps: IntCounterVec,
    /// Time from a step's dispatch to its outcome, by agent.
    pub step_duration: HistogramVec,
    /// Retried attempts, by agent.
    pub retries: IntCounterVec,
    /// Circuit state per agent: 0 closed, 1 half-open, 2 open.
    pub circuit: IntGaugeVec,
    /// Executions this replica is running.
    pub running: IntGauge,
    /// Executions that ended here, by status.
    pub executions: IntCounterVec,
    /// Collaboration requests handled, by outcome (`extended`, `rejected`).
    pub replans: IntCounterVec,
    /// Time to store one batch of events.
    pub event_write_seconds: Histogram,
    /// Events per stored batch.
    pub event_batch_size: Histogram,
    /// Failed attempts to store a batch (each is retried).
    pub event_write_errors: IntCounter,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let steps = IntCounterVec::new(
            Opts::new("agentmesh_executor_steps_total", "Steps that reached a final state"),
            &["agent", "status"],
        )?;
        let step_duration = HistogramVec::new(
            HistogramOpts::new(
                "agentmesh_executor_step_duration_seconds",
                "Time from a step's dispatch to its outcome",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]),
            &["agent"],
        )?;
        let retries =
            IntCounterVec::new(Opts::new("agentmesh_executor_retries_total", "Step attempts retried"), &["agent"])?;
        let circuit = IntGaugeVec::new(
            Opts::new("agentmesh_executor_circuit_state", "Circuit per agent: 0 closed, 1 half-open, 2 open"),
            &["agent"],
        )?;
        let running = IntGauge::new("agentmesh_executor_executions_running", "Executions this replica is running")?;
        let executions = IntCounterVec::new(
            Opts::new("agentmesh_executor_executions_total", "Executions that ended on this replica"),
            &["status"],
        )?;
        let replans = IntCounterVec::new(
            Opts::new("agentmesh_executor_replans_total", "Collaboration requests handled"),
            &["outcome"],
        )?;
        let event_write_seconds = Histogram::with_opts(
            HistogramOpts::new("agentmesh_executor_event_write_seconds", "Time to store one batch of events")
                .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]),
        )?;
        let event_batch_size = Histogram::with_opts(
            HistogramOpts::new("agentmesh_executor_event_batch_size", "Events per stored batch")
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0]),
        )?;
        let event_write_errors = IntCounter::new(
            "agentmesh_executor_event_write_errors_total",
            "Failed attempts to store a batch of events",
        )?;
        registry.register(Box::new(steps.clone()))?;
        registry.register(Box::new(step_duration.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(circuit.clone()))?;
        registry.register(Box::new(running.clone()))?;
        registry.register(Box::new(executions.clone()))?;
        registry.register(Box::new(replans.clone()))?;
        registry.register(Box::new(event_write_seconds.clone()))?;
        registry.register(Box::new(event_batch_size.clone()))?;
        registry.register(Box::new(event_write_errors.clone()))?;
        Ok(Self {
            registry,
            steps,
            step_duration,
            retries,
            circuit,
            running,
            executions,
            replans,
            event_write_seconds,
            event_batch_size,
            event_write_errors,
        })
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
