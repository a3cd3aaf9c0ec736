//! The one writer of events: whatever the runners produce while a commit is
//! in flight goes into the next commit, so the store sees one transaction
//! per batch, not per event. An event reaches watchers only after it is
//! stored; a runner that needs an event stored before going on (a step's
//! success, before its dependents start) waits for its acknowledgement.
//!
//! A failed write is retried, in order, until it succeeds: events are never
//! dropped. Events of an execution this replica no longer owns are never
//! written: the store's fence refuses them, and the runner is told.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentmesh_core::execution::{Event, EventKind, ExecutionStatus};
use agentmesh_store::ExecutionStore;
use agentmesh_store::executions::{Append, EventRow};
use tokio::sync::{mpsc, oneshot};

use super::hub::Hub;
use crate::metrics::Metrics;

/// Most events in one transaction.
const MAX_BATCH_EVENTS: usize = 2048;

/// How long events nobody waits for (a step's start, a retry) may wait for
/// company: a fast step's outcome then shares their commit, and the step
/// costs one commit instead of two. Its start still reaches watchers within
/// this time when the step is slow.
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// Whether an entry was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Stored, and published to watchers.
    Stored,
    /// Not stored: another replica owns the execution now.
    Lost,
}

/// Events of one execution to store, in sequence order.
pub struct Entry {
    /// The execution.
    pub execution_id: Arc<str>,
    /// Its next events.
    pub events: Vec<Arc<Event>>,
    /// Its step count, when it changed.
    pub steps: Option<usize>,
    /// Told once the entry is stored (or refused).
    pub ack: Option<oneshot::Sender<Written>>,
}

/// Hands events to the writer.
#[derive(Clone)]
pub struct Journal {
    tx: mpsc::Sender<Entry>,
}

impl Journal {
    /// Starts the writer.
    pub fn spawn(store: Arc<dyn ExecutionStore>, owner: String, hub: Arc<Hub>, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel(16_384);
        tokio::spawn(write(store, owner, hub, metrics, rx));
        Self { tx }
    }

    /// Waits until everything queued before is stored (or refused).
    pub async fn flush(&self) {
        let (ack, stored) = oneshot::channel();
        let marker = Entry { execution_id: Arc::from(""), events: Vec::new(), steps: None, ack: Some(ack) };
        if self.tx.send(marker).await.is_ok() {
            let _ = stored.await;
        }
    }

    /// Queues an entry; waits only when the writer is far behind.
    pub async fn append(&self, entry: Entry) {
        if self.tx.send(entry).await.is_err() {
            tracing::error!("the event writer has stopped; events are not stored");
        }
    }
}

/// The stored form of an event.
pub fn to_row(event: &Event) -> EventRow {
    EventRow {
        sequence: i64::try_from(event.sequence).unwrap_or(i64::MAX),
        kind: event.kind.as_str().to_owned(),
        step_id: event.step_id.clone(),
        attempt: i64::from(event.attempt),
        payload: serde_json::to_string(&event.payload).unwrap_or_else(|_| "{}".into()),
        occurred_at_ms: event.at.timestamp_millis(),
    }
}

/// Adds an entry to the append of its execution.
fn add(append: &mut Append, entry: &Entry) {
    for event in &entry.events {
        append.events.push(to_row(event));
        match event.kind {
            EventKind::StepStarted | EventKind::StepRetrying if append.status.as_deref() != Some("running") => {
                append.status = Some(ExecutionStatus::Running.as_str().to_owned());
            }
            kind => {
                if let Some(status) = kind.final_status() {
                    append.status = Some(status.as_str().to_owned());
                    append.finished_at_ms = Some(event.at.timestamp_millis());
                    append.error = Some(event.payload.error.clone());
                }
            }
        }
    }
    if let Some(steps) = entry.steps {
        append.steps = Some(i64::try_from(steps).unwrap_or(i64::MAX));
    }
}

async fn write(
    store: Arc<dyn ExecutionStore>,
    owner: String,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    mut rx: mpsc::Receiver<Entry>,
) {
    let mut lost: HashSet<Arc<str>> = HashSet::new();
    while let Some(first) = rx.recv().await {
        let mut events = first.events.len();
        let mut entries = vec![first];
        while events < MAX_BATCH_EVENTS {
            match rx.try_recv() {
                Ok(entry) => {
                    events += entry.events.len();
                    entries.push(entry);
                }
                Err(_) => break,
            }
        }
        if entries.iter().all(|e| e.ack.is_none()) {
            let deadline = tokio::time::Instant::now() + LINGER;
            while events < MAX_BATCH_EVENTS {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(entry)) => {
                        let waited_on = entry.ack.is_some();
                        events += entry.events.len();
                        entries.push(entry);
                        if waited_on {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        }
        let mut appends: Vec<Append> = Vec::new();
        let mut position: HashMap<&str, usize> = HashMap::new();
        for entry in entries.iter().filter(|e| !lost.contains(&e.execution_id)) {
            let at = *position.entry(&entry.execution_id).or_insert_with(|| {
                appends.push(Append {
                    execution_id: entry.execution_id.to_string(),
                    events: Vec::new(),
                    status: None,
                    steps: None,
                    finished_at_ms: None,
                    error: None,
                });
                appends.len() - 1
            });
            add(&mut appends[at], entry);
        }
        let started = Instant::now();
        let mut wait = Duration::from_millis(50);
        let refused = loop {
            match store.append(&owner, &appends, chrono::Utc::now().timestamp_millis()).await {
                Ok(refused) => break refused,
                Err(e) => {
                    metrics.event_write_errors.inc();
                    tracing::warn!(error = %e, events, retry_in_ms = wait.as_millis(), "could not store events; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        };
        metrics.event_write_seconds.observe(started.elapsed().as_secs_f64());
        metrics.event_batch_size.observe(events as f64);
        for id in refused {
            if stored_after_all(store.as_ref(), &owner, &appends, &id).await {
                continue;
            }
            tracing::warn!(execution_id = %id, "another replica owns this execution now; its events here are dropped");
            lost.insert(Arc::from(id.as_str()));
        }
        for entry in entries {
            let written = if lost.contains(&entry.execution_id) { Written::Lost } else { Written::Stored };
            if written == Written::Stored {
                hub.publish(&entry.execution_id, &entry.events);
            }
            if let Some(ack) = entry.ack {
                let _ = ack.send(written);
            }
        }
    }
}

/// A write refused after a retry may have been stored by the first try (its
/// commit went through, its answer was lost): then the log ends at our last
/// event and the lease is still ours.
async fn stored_after_all(store: &dyn ExecutionStore, owner: &str, appends: &[Append], id: &str) -> bool {
    let Some(last) = appends.iter().find(|a| a.execution_id == id).and_then(|a| a.events.last()) else {
        return false;
    };
    match store.get(id).await {
        Ok(Some(row)) => row.owner.as_deref() == Some(owner) && row.last_sequence >= last.sequence,
        _ => false,
    }
}
