//! A read-through snapshot of every agent. Any write on any replica
//! invalidates it at once (heartbeats patch it in place instead, so they do
//! not force reloads); concurrent misses share one database query; when the
//! database is unreachable the last snapshot keeps being served.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use agentmesh_core::{AgentRecord, HealthPolicy, HealthStatus, ReportedStatus};
use agentmesh_store::{AgentStore, StoreError};
use chrono::{DateTime, Utc};

use crate::metrics::Metrics;

/// How long a failed load is remembered before the database is tried again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Heartbeat state that changes without reloading the snapshot.
#[derive(Debug)]
struct Liveness {
    last_heartbeat_ms: AtomicI64,
    degraded: AtomicBool,
}

/// An immutable list of agents (ordered by id) with a mutable liveness overlay.
#[derive(Debug)]
pub struct Snapshot {
    agents: Vec<AgentRecord>,
    index: HashMap<String, usize>,
    liveness: Vec<Liveness>,
    generation: u64,
    loaded_at: Instant,
    /// Approximate size in bytes of the cached agents.
    pub size_bytes: usize,
}

impl Snapshot {
    fn new(mut agents: Vec<AgentRecord>, generation: u64) -> Self {
        agents.sort_by(|a, b| a.id().cmp(b.id()));
        let index = agents.iter().enumerate().map(|(i, a)| (a.id().to_owned(), i)).collect();
        let liveness = agents
            .iter()
            .map(|a| Liveness {
                last_heartbeat_ms: AtomicI64::new(a.last_heartbeat.timestamp_millis()),
                degraded: AtomicBool::new(a.reported_status == ReportedStatus::Degraded),
            })
            .collect();
        let size_bytes = agents.iter().map(approximate_size).sum();
        Self { agents, index, liveness, generation, loaded_at: Instant::now(), size_bytes }
    }

    /// Number of agents.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// True when there are no agents.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Last heartbeat and reported status of the agent at `i`.
    fn live(&self, i: usize) -> (DateTime<Utc>, ReportedStatus) {
        let l = &self.liveness[i];
        let at = DateTime::from_timestamp_millis(l.last_heartbeat_ms.load(Ordering::Relaxed)).unwrap_or_default();
        let status = if l.degraded.load(Ordering::Relaxed) { ReportedStatus::Degraded } else { ReportedStatus::Active };
        (at, status)
    }

    /// Every agent in id order with its health at `now` and last heartbeat.
    pub fn observed(
        &self,
        policy: HealthPolicy,
        now: DateTime<Utc>,
    ) -> impl Iterator<Item = (&AgentRecord, HealthStatus, DateTime<Utc>)> {
        self.agents.iter().enumerate().map(move |(i, record)| {
            let (at, reported) = self.live(i);
            (record, policy.derive(at, reported, now), at)
        })
    }

    /// One agent with its liveness applied, health at `now`.
    pub fn get(&self, id: &str, policy: HealthPolicy, now: DateTime<Utc>) -> Option<(AgentRecord, HealthStatus)> {
        let i = *self.index.get(id)?;
        let (at, reported) = self.live(i);
        let mut record = self.agents[i].clone();
        record.last_heartbeat = at;
        record.reported_status = reported;
        Some((record, policy.derive(at, reported, now)))
    }

    /// Applies a heartbeat; false when the agent is not in this snapshot.
    fn apply_heartbeat(&self, id: &str, status: ReportedStatus, at_ms: i64) -> bool {
        let Some(&i) = self.index.get(id) else {
            return false;
        };
        let l = &self.liveness[i];
        l.last_heartbeat_ms.fetch_max(at_ms, Ordering::Relaxed);
        l.degraded.store(status == ReportedStatus::Degraded, Ordering::Relaxed);
        true
    }
}

fn approximate_size(a: &AgentRecord) -> usize {
    let def = &a.definition;
    let caps: usize = def
        .capabilities()
        .map(|(_, c)| {
            c.id.len()
                + c.description.len()
                + c.endpoint.len()
                + c.tags.iter().map(String::len).sum::<usize>()
                + [&c.input_schema, &c.output_schema]
                    .iter()
                    .filter_map(|s| s.as_ref())
                    .map(|s| s.to_string().len())
                    .sum::<usize>()
                + c.examples.iter().map(|e| e.to_string().len()).sum::<usize>()
                + 128
        })
        .sum();
    def.id.len() + def.base_url.len() + def.version.len() + def.tags.iter().map(String::len).sum::<usize>() + caps + 256
}

/// Where a snapshot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Served from the cache.
    Hit,
    /// Loaded from the database for this request (or a concurrent one).
    Miss,
    /// The database failed: the last snapshot was served.
    Stale,
}

/// The catalog cache.
pub struct CatalogCache {
    store: Arc<dyn AgentStore>,
    ttl: Duration,
    current: RwLock<Option<Arc<Snapshot>>>,
    generation: AtomicU64,
    load_lock: tokio::sync::Mutex<()>,
    failed_at: RwLock<Option<Instant>>,
    metrics: Arc<Metrics>,
}

impl CatalogCache {
    /// A cache over `store` with the given TTL.
    pub fn new(store: Arc<dyn AgentStore>, ttl: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            ttl,
            current: RwLock::new(None),
            generation: AtomicU64::new(0),
            load_lock: tokio::sync::Mutex::new(()),
            failed_at: RwLock::new(None),
            metrics,
        }
    }

    fn current(&self) -> Option<Arc<Snapshot>> {
        self.current.read().ok().and_then(|c| c.clone())
    }

    fn fresh(&self) -> Option<Arc<Snapshot>> {
        let snapshot = self.current()?;
        let valid =
            snapshot.generation == self.generation.load(Ordering::Acquire) && snapshot.loaded_at.elapsed() < self.ttl;
        valid.then_some(snapshot)
    }

    fn recently_failed(&self) -> bool {
        self.failed_at.read().ok().and_then(|f| *f).is_some_and(|at| at.elapsed() < RETRY_AFTER_FAILURE)
    }

    /// The current snapshot, loading it when missing, expired or invalidated.
    pub async fn snapshot(&self) -> Result<(Arc<Snapshot>, Source), StoreError> {
        if let Some(s) = self.fresh() {
            self.metrics.cache_hits.inc();
            return Ok((s, Source::Hit));
        }
        if self.recently_failed()
            && let Some(s) = self.current()
        {
            self.metrics.cache_stale_served.inc();
            return Ok((s, Source::Stale));
        }
        let _guard = self.load_lock.lock().await;
        // Another request may have loaded it while this one waited.
        if let Some(s) = self.fresh() {
            self.metrics.cache_hits.inc();
            return Ok((s, Source::Hit));
        }
        self.metrics.cache_misses.inc();
        let generation = self.generation.load(Ordering::Acquire);
        match self.store.list().await {
            Ok(agents) => {
                let snapshot = Arc::new(Snapshot::new(agents, generation));
                self.metrics.cache_size_bytes.set(i64::try_from(snapshot.size_bytes).unwrap_or(i64::MAX));
                self.metrics.cache_agents.set(i64::try_from(snapshot.len()).unwrap_or(i64::MAX));
                if let Ok(mut current) = self.current.write() {
                    *current = Some(snapshot.clone());
                }
                if let Ok(mut failed) = self.failed_at.write() {
                    *failed = None;
                }
                Ok((snapshot, Source::Miss))
            }
            Err(e) => {
                if let Ok(mut failed) = self.failed_at.write() {
                    *failed = Some(Instant::now());
                }
                match self.current() {
                    Some(s) => {
                        tracing::warn!(error = %e, agents = s.len(), "database unreachable; serving the last catalog snapshot");
                        self.metrics.cache_stale_served.inc();
                        Ok((s, Source::Stale))
                    }
                    None => Err(e),
                }
            }
        }
    }

    /// The snapshot in memory, without loading (may be stale or absent).
    pub fn peek(&self) -> Option<Arc<Snapshot>> {
        self.current()
    }

    /// Forgets the snapshot: the next read reloads it.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Patches a heartbeat into the snapshot, or invalidates it when the
    /// agent is not there.
    pub fn apply_heartbeat(&self, agent_id: &str, status: ReportedStatus, at_ms: i64) {
        let applied = self.current().is_some_and(|s| s.apply_heartbeat(agent_id, status, at_ms));
        if !applied {
            self.invalidate();
        }
    }
}
