//! The catalog cache: the current [`Snapshot`], loaded read-through from the
//! store and kept current by the writes of every replica. A registration or
//! removal replaces the one agent in a new copy of the snapshot, a heartbeat
//! updates it in place, and a full reload happens only at start, after the
//! TTL, or when notifications may have been missed. Concurrent misses share
//! one database query; when the database is unreachable the last snapshot
//! keeps being served.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use agentmesh_core::{AgentRecord, ReportedStatus};
use agentmesh_store::{AgentStore, StoreError};

use crate::metrics::Metrics;
pub use crate::snapshot::{Encoded, Observed, Snapshot};
use crate::snapshot::{Patch, coalesce, replay_heartbeats};

/// `snapshot` with `patches` applied: registrations and removals in one
/// copy (if any), heartbeats in place.
fn patched(snapshot: Arc<Snapshot>, patches: &[Patch]) -> Arc<Snapshot> {
    let changes = coalesce(patches);
    let snapshot = if changes.is_empty() { snapshot } else { Arc::new(snapshot.merged(changes)) };
    replay_heartbeats(&snapshot, patches);
    snapshot
}

/// How long a failed load is remembered before the database is tried again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

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
        let valid = snapshot.generation == self.generation.load(Ordering::Acquire) && snapshot.age() < self.ttl;
        valid.then_some(snapshot)
    }

    fn recently_failed(&self) -> bool {
        self.failed_at.read().ok().and_then(|f| *f).is_some_and(|at| at.elapsed() < RETRY_AFTER_FAILURE)
    }

    /// The last load failed and none has succeeded since.
    fn failing(&self) -> bool {
        self.failed_at.read().ok().is_some_and(|f| f.is_some())
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
            let trusted = s.generation == self.generation.load(Ordering::Acquire);
            if trusted && !self.recently_failed() {
                // Only expired: serve it while a background reload replaces it.
                self.refresh_in_background();
            }
            if trusted || self.recently_failed() {
                if self.failing() {
                    self.metrics.cache_stale_served.inc();
                    return Ok((s, Source::Stale));
                }
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

    /// Loads every agent (the caller holds `load_lock`), replays the writes
    /// seen meanwhile, and publishes the result. A load that finds the
    /// catalog unchanged keeps the current snapshot, with its index and
    /// shared bodies, and restarts its TTL.
    async fn load(&self) -> Result<Arc<Snapshot>, StoreError> {
        let generation = self.generation.load(Ordering::Acquire);
        if let Ok(mut pending) = self.pending.lock() {
            *pending = Some(Vec::new());
        }
        let held = self.current().filter(|c| c.generation == generation);
        let mut agents = match self.store.list().await {
            Ok(loaded) => {
                // Each is logged by the store, with what is wrong.
                self.metrics.corrupt_rows.inc_by(u64::try_from(loaded.corrupt.len()).unwrap_or(u64::MAX));
                loaded.agents
            }
            Err(e) => {
                self.take_pending();
                self.set_failed(true);
                return Err(e);
            }
        };
        // Writes noticed during the load may or may not be in it: replay
        // them in one pass (older versions are ignored).
        let early = self.pending.lock().ok().and_then(|mut p| p.as_mut().map(std::mem::take)).unwrap_or_default();
        let unchanged = match &held {
            Some(held) if early.is_empty() => held.holds_same(&agents).await,
            _ => false,
        };
        let fresh =
            |agents: Vec<AgentRecord>| Arc::new(Snapshot::new(agents.into_iter().map(Arc::new).collect(), generation));
        let built = (!unchanged).then(|| patched(fresh(std::mem::take(&mut agents)), &early));
        // Publish under the lock that writes take, with the writes noticed
        // since `early`: each is either replayed here or applied to the
        // published snapshot after it (applying one twice changes nothing).
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let late = self.take_pending();
        if built.is_none()
            && late.is_empty()
            && let Some(held) = held
            && current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &held))
        {
            drop(current);
            held.renew(&agents);
            self.set_failed(false);
            return Ok(held);
        }
        let snapshot = patched(built.unwrap_or_else(|| fresh(agents)), &late);
        self.publish(&mut current, snapshot.clone());
        drop(current);
        self.set_failed(false);
        Ok(snapshot)
    }

    /// Stops recording writes for a load, returning those recorded.
    fn take_pending(&self) -> Vec<Patch> {
        self.pending.lock().ok().and_then(|mut p| p.take()).unwrap_or_default()
    }

    /// The snapshot in memory, without loading (may be stale or absent).
    pub fn peek(&self) -> Option<Arc<Snapshot>> {
        self.current()
    }

    /// Distrusts the snapshot: the next read reloads it.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Applies patches to the snapshot: heartbeats in place, the others in
    /// one new copy.
    fn apply(&self, patches: Vec<Patch>) {
        if let Ok(mut pending) = self.pending.lock()
            && let Some(pending) = pending.as_mut()
        {
            pending.extend(patches.iter().cloned());
        }
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(snapshot) = current.clone() {
            self.publish(&mut current, patched(snapshot, &patches));
        }
    }

    /// Makes `snapshot` the current one (the caller holds the write lock).
    fn publish(&self, current: &mut Option<Arc<Snapshot>>, snapshot: Arc<Snapshot>) {
        self.metrics.cache_size_bytes.set(i64::try_from(snapshot.size_bytes).unwrap_or(i64::MAX));
        self.metrics.cache_agents.set(i64::try_from(snapshot.len()).unwrap_or(i64::MAX));
        *current = Some(snapshot);
    }

    /// Applies registrations (newest version wins) and removals in one copy.
    pub fn apply_batch(&self, upserts: Vec<AgentRecord>, removals: Vec<String>) {
        let patches = upserts
            .into_iter()
            .map(|r| Patch::Upsert(Arc::new(r)))
            .chain(removals.into_iter().map(Patch::Remove))
            .collect();
        self.apply(patches);
    }

    /// Puts a registered or updated agent into the snapshot.
    pub fn upsert(&self, record: AgentRecord) {
        self.apply(vec![Patch::Upsert(Arc::new(record))]);
    }

    /// Takes a removed agent out of the snapshot.
    pub fn remove(&self, agent_id: &str) {
        self.apply(vec![Patch::Remove(agent_id.to_owned())]);
    }

    /// Applies a heartbeat to the snapshot.
    pub fn heartbeat(&self, agent_id: &str, status: ReportedStatus, at_ms: i64) {
        self.apply(vec![Patch::Heartbeat { agent_id: agent_id.to_owned(), status, at_ms }]);
    }
}
