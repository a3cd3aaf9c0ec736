//! Prometheus metrics of the discovery service.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// Every metric discovery exports.
pub struct Metrics {
    registry: Registry,
    /// Capability queries by format and status.
    pub requests: IntCounterVec,
    /// Capability query latency by format.
    pub duration: HistogramVec,
    /// Snapshot served from cache.
    pub cache_hits: IntCounter,
    /// Snapshot loaded from the database.
    pub cache_misses: IntCounter,
    /// Last snapshot served because the database failed.
    pub cache_stale_served: IntCounter,
    /// Approximate bytes held by the snapshot.
    pub cache_size_bytes: IntGauge,
    /// Agents held by the snapshot.
    pub cache_agents: IntGauge,
    /// Responses served from an already encoded body.
    pub encoded_hits: IntCounter,
    /// Filters used by capability queries.
    pub filter_usage: IntCounterVec,
    /// Registry writes by operation and result.
    pub writes: IntCounterVec,
    /// `WatchCatalog` streams open.
    pub watch_streams: IntGauge,
    /// Stored agents left out of a read because their rows could not be decoded.
    pub corrupt_rows: IntCounter,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("agentmesh_discovery_requests_total", "Capability discovery requests"),
            &["format", "status"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new("agentmesh_discovery_request_duration_seconds", "Capability discovery latency")
                .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]),
            &["format"],
        )?;
        let cache_hits = IntCounter::new("agentmesh_discovery_cache_hits_total", "Catalog cache hits")?;
        let cache_misses = IntCounter::new("agentmesh_discovery_cache_misses_total", "Catalog cache misses")?;
        let cache_stale_served = IntCounter::new(
            "agentmesh_discovery_cache_stale_served_total",
            "Requests served from the last snapshot because the database was unreachable",
        )?;
        let cache_size_bytes =
            IntGauge::new("agentmesh_discovery_cache_size_bytes", "Approximate size of the catalog snapshot")?;
        let cache_agents = IntGauge::new("agentmesh_discovery_cache_agents", "Agents in the catalog snapshot")?;
        let encoded_hits = IntCounter::new(
            "agentmesh_discovery_encoded_response_hits_total",
            "Responses served from a body already encoded for the same query and catalog state",
        )?;
        let filter_usage = IntCounterVec::new(
            Opts::new("agentmesh_discovery_filter_usage_total", "Filters used by capability queries"),
            &["filter_type"],
        )?;
        let writes = IntCounterVec::new(
            Opts::new("agentmesh_discovery_writes_total", "Registrations, heartbeats and removals"),
            &["operation", "result"],
        )?;
        let watch_streams = IntGauge::new("agentmesh_discovery_watch_streams", "WatchCatalog streams open")?;
        let corrupt_rows = IntCounter::new(
            "agentmesh_discovery_corrupt_rows_total",
            "Stored agents left out of a catalog read because their rows could not be decoded",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(cache_hits.clone()))?;
        registry.register(Box::new(cache_misses.clone()))?;
        registry.register(Box::new(cache_stale_served.clone()))?;
        registry.register(Box::new(cache_size_bytes.clone()))?;
        registry.register(Box::new(cache_agents.clone()))?;
        registry.register(Box::new(encoded_hits.clone()))?;
        registry.register(Box::new(filter_usage.clone()))?;
        registry.register(Box::new(writes.clone()))?;
        registry.register(Box::new(watch_streams.clone()))?;
        registry.register(Box::new(corrupt_rows.clone()))?;
        Ok(Self {
            registry,
            requests,
            duration,
            cache_hits,
            cache_misses,
            cache_stale_served,
            cache_size_bytes,
            cache_agents,
            encoded_hits,
            filter_usage,
            writes,
            watch_streams,
            corrupt_rows,
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
