//! A read-through snapshot of every agent, kept current by the writes of
//! every replica: a registration or removal replaces the one agent in a new
//! copy of the snapshot, a heartbeat updates it in place, and a full reload
//! happens only at start, after the TTL, or when notifications may have been
//! missed. Concurrent misses share one database query; when the database is
//! unreachable the last snapshot keeps being served.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use agentmesh_core::{AgentRecord, HealthPolicy, HealthStatus, ReportedStatus};
use agentmesh_store::{AgentStore, StoreError};
use chrono::{DateTime, Utc};

use crate::metrics::Metrics;

/// How long a failed load is remembered before the database is tried again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Heartbeat state that changes without copying the snapshot.
#[derive(Debug)]
struct Liveness {
    last_heartbeat_ms: AtomicI64,
    degraded: AtomicBool,
}

impl Liveness {
    fn new(at_ms: i64, status: ReportedStatus) -> Self {
        Self { last_heartbeat_ms: AtomicI64::new(at_ms), degraded: AtomicBool::new(status == ReportedStatus::Degraded) }
    }

    fn copy(&self) -> Self {
        Self {
            last_heartbeat_ms: AtomicI64::new(self.last_heartbeat_ms.load(Ordering::Relaxed)),
            degraded: AtomicBool::new(self.degraded.load(Ordering::Relaxed)),
        }
    }
}

/// A change to apply to a snapshot.
#[derive(Debug, Clone)]
enum Patch {
    Upsert(Arc<AgentRecord>),
    Remove(String),
    Heartbeat { agent_id: String, status: ReportedStatus, at_ms: i64 },
}

/// An immutable list of agents (ordered by id) with a mutable liveness overlay.
#[derive(Debug)]
pub struct Snapshot {
    /// Sorted by id; looked up by binary search.
    agents: Vec<Arc<AgentRecord>>,
    liveness: Vec<Liveness>,
    generation: u64,
    loaded_at: Instant,
    /// Approximate size in bytes of the cached agents.
    pub size_bytes: usize,
}

impl Snapshot {
    fn new(mut agents: Vec<Arc<AgentRecord>>, generation: u64) -> Self {
        agents.sort_by(|a, b| a.id().cmp(b.id()));
        agents.dedup_by(|a, b| a.id() == b.id());
        let liveness =
            agents.iter().map(|a| Liveness::new(a.last_heartbeat.timestamp_millis(), a.reported_status)).collect();
        let size_bytes = agents.iter().map(|a| approximate_size(a)).sum();
        Self { agents, liveness, generation, loaded_at: Instant::now(), size_bytes }
    }

    fn position(&self, id: &str) -> Result<usize, usize> {
        self.agents.binary_search_by(|a| a.id().cmp(id))
    }

    /// Number of agents.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// True when there are no agents.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

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
            (record.as_ref(), policy.derive(at, reported, now), at)
        })
    }

    /// One agent with its liveness applied, and its health at `now`.
    pub fn get(&self, id: &str, policy: HealthPolicy, now: DateTime<Utc>) -> Option<(AgentRecord, HealthStatus)> {
        let i = self.position(id).ok()?;
        let (at, reported) = self.live(i);
        let mut record = self.agents[i].as_ref().clone();
        record.last_heartbeat = at;
        record.reported_status = reported;
        Some((record, policy.derive(at, reported, now)))
    }

    /// Applies a heartbeat in place; false when the agent is not here.
    fn beat(&self, id: &str, status: ReportedStatus, at_ms: i64) -> bool {
        let Ok(i) = self.position(id) else {
            return false;
        };
        let l = &self.liveness[i];
        l.last_heartbeat_ms.fetch_max(at_ms, Ordering::Relaxed);
        l.degraded.store(status == ReportedStatus::Degraded, Ordering::Relaxed);
        true
    }

    /// The stored version (`updated_at`) of an agent, if held.
    pub fn version_of(&self, id: &str) -> Option<DateTime<Utc>> {
        self.position(id).ok().map(|i| self.agents[i].updated_at)
    }

    /// A copy with an agent added, replaced or removed; `None` when nothing
    /// changes (a replacement older than what is held is ignored).
    fn patched(&self, patch: &Patch) -> Option<Self> {
        let mut size_bytes = self.size_bytes;
        let mut agents = self.agents.clone();
        let mut liveness: Vec<Liveness> = self.liveness.iter().map(Liveness::copy).collect();
        match patch {
            Patch::Upsert(record) => {
                let fresh = Liveness::new(record.last_heartbeat.timestamp_millis(), record.reported_status);
                size_bytes += approximate_size(record);
                match self.position(record.id()) {
                    Ok(i) if self.agents[i].updated_at > record.updated_at => return None,
                    Ok(i) => {
                        size_bytes -= approximate_size(&agents[i]);
                        agents[i] = record.clone();
                        liveness[i] = fresh;
                    }
                    Err(i) => {
                        agents.insert(i, record.clone());
                        liveness.insert(i, fresh);
                    }
                }
            }
            Patch::Remove(id) => {
                let i = self.position(id).ok()?;
                size_bytes -= approximate_size(&agents[i]);
                agents.remove(i);
                liveness.remove(i);
            }
            Patch::Heartbeat { .. } => return None,
        }
        Some(Self { agents, liveness, generation: self.generation, loaded_at: self.loaded_at, size_bytes })
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
                + c.tags.iter().map(|t| t.len() + 24).sum::<usize>()
                + [&c.input_schema, &c.output_schema]
                    .iter()
                    .filter_map(|s| s.as_ref())
                    .map(|s| s.get().len())
                    .sum::<usize>()
                + c.examples.iter().map(|e| e.get().len()).sum::<usize>()
                + 200
        })
        .sum();
    def.id.len()
        + def.base_url.len()
        + def.version.len()
        + def.tags.iter().map(|t| t.len() + 24).sum::<usize>()
        + caps
        + 300
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
    /// Bumped when the snapshot can no longer be trusted (missed notifications).
    generation: AtomicU64,
    load_lock: tokio::sync::Mutex<()>,
    /// A background reload is running.
    refreshing: AtomicBool,
    /// Patches seen while a load is running, replayed onto its result.
    pending: Mutex<Option<Vec<Patch>>>,
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
            refreshing: AtomicBool::new(false),
            pending: Mutex::new(None),
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

    fn set_failed(&self, failed: bool) {
        if let Ok(mut at) = self.failed_at.write() {
            *at = failed.then(Instant::now);
        }
    }

    /// The current snapshot. A missing or distrusted snapshot is loaded
    /// (concurrent callers share the load); one that only outlived its TTL is
    /// served while a background reload replaces it.
    pub async fn snapshot(self: &Arc<Self>) -> Result<(Arc<Snapshot>, Source), StoreError> {
        if let Some(s) = self.fresh() {
            self.metrics.cache_hits.inc();
            return Ok((s, Source::Hit));
        }
        if let Some(s) = self.current() {
            if self.recently_failed() {
                self.metrics.cache_stale_served.inc();
                return Ok((s, Source::Stale));
            }
            if s.generation == self.generation.load(Ordering::Acquire) {
                self.refresh_in_background();
                self.metrics.cache_hits.inc();
                return Ok((s, Source::Hit));
            }
        }
        let _guard = self.load_lock.lock().await;
        // Another request may have loaded it while this one waited.
        if let Some(s) = self.fresh() {
            self.metrics.cache_hits.inc();
            return Ok((s, Source::Hit));
        }
        self.metrics.cache_misses.inc();
        match self.load().await {
            Ok(s) => Ok((s, Source::Miss)),
            Err(e) => match self.current() {
                Some(s) => {
                    tracing::warn!(error = %e, agents = s.len(), "database unreachable; serving the last catalog snapshot");
                    self.metrics.cache_stale_served.inc();
                    Ok((s, Source::Stale))
                }
                None => Err(e),
            },
        }
    }

    fn refresh_in_background(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let cache = self.clone();
        tokio::spawn(async move {
            let guard = cache.load_lock.lock().await;
            if cache.fresh().is_none() {
                cache.metrics.cache_misses.inc();
                if let Err(e) = cache.load().await {
                    tracing::warn!(error = %e, "background catalog reload failed; serving the last snapshot");
                }
            }
            drop(guard);
            cache.refreshing.store(false, Ordering::Release);
        });
    }

    /// Loads every agent (the caller holds `load_lock`), replays patches
    /// seen meanwhile, and publishes the result.
    async fn load(&self) -> Result<Arc<Snapshot>, StoreError> {
        let generation = self.generation.load(Ordering::Acquire);
        if let Ok(mut pending) = self.pending.lock() {
            *pending = Some(Vec::new());
        }
        let loaded = self.store.list().await;
        let patches = self.pending.lock().ok().and_then(|mut p| p.take()).unwrap_or_default();
        let agents = match loaded {
            Ok(agents) => agents,
            Err(e) => {
                self.set_failed(true);
                return Err(e);
            }
        };
        let mut snapshot = Snapshot::new(agents.into_iter().map(Arc::new).collect(), generation);
        // Writes noticed during the load may or may not be in it: replaying
        // them is harmless (older replacements are ignored).
        for patch in &patches {
            match patch {
                Patch::Heartbeat { agent_id, status, at_ms } => {
                    snapshot.beat(agent_id, *status, *at_ms);
                }
                other => {
                    if let Some(next) = snapshot.patched(other) {
                        snapshot = next;
                    }
                }
            }
        }
        let snapshot = Arc::new(snapshot);
        self.publish(snapshot.clone());
        self.set_failed(false);
        Ok(snapshot)
    }

    fn publish(&self, snapshot: Arc<Snapshot>) {
        self.metrics.cache_size_bytes.set(i64::try_from(snapshot.size_bytes).unwrap_or(i64::MAX));
        self.metrics.cache_agents.set(i64::try_from(snapshot.len()).unwrap_or(i64::MAX));
        if let Ok(mut current) = self.current.write() {
            *current = Some(snapshot);
        }
    }

    /// The snapshot in memory, without loading (may be stale or absent).
    pub fn peek(&self) -> Option<Arc<Snapshot>> {
        self.current()
    }

    /// Distrusts the snapshot: the next read reloads it.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn patch(&self, patch: Patch) {
        if let Ok(mut pending) = self.pending.lock()
            && let Some(pending) = pending.as_mut()
        {
            pending.push(patch.clone());
        }
        let Ok(mut current) = self.current.write() else {
            return;
        };
        let Some(snapshot) = current.as_ref() else {
            return;
        };
        match &patch {
            Patch::Heartbeat { agent_id, status, at_ms } => {
                if !snapshot.beat(agent_id, *status, *at_ms) {
                    // Not here yet: its registration will bring it.
                    tracing::debug!(agent_id, "heartbeat for an agent not in the snapshot");
                }
            }
            other => {
                if let Some(next) = snapshot.patched(other) {
                    self.metrics.cache_size_bytes.set(i64::try_from(next.size_bytes).unwrap_or(i64::MAX));
                    self.metrics.cache_agents.set(i64::try_from(next.len()).unwrap_or(i64::MAX));
                    *current = Some(Arc::new(next));
                }
            }
        }
    }

    /// Puts a registered or updated agent into the snapshot.
    pub fn upsert(&self, record: AgentRecord) {
        self.patch(Patch::Upsert(Arc::new(record)));
    }

    /// Takes a removed agent out of the snapshot.
    pub fn remove(&self, agent_id: &str) {
        self.patch(Patch::Remove(agent_id.to_owned()));
    }

    /// Applies a heartbeat to the snapshot.
    pub fn heartbeat(&self, agent_id: &str, status: ReportedStatus, at_ms: i64) {
        self.patch(Patch::Heartbeat { agent_id: agent_id.to_owned(), status, at_ms });
    }
}
