//! Keeping every orchestration message in the store, so that a client can
//! resume a lost stream (`Last-Event-ID`) on any gateway replica sharing the
//! database, and reading them back.
//!
//! Messages are written in the background, in batches of whatever is
//! waiting, so that a streaming answer is never slowed by the database; a
//! resumed stream polls the store, so it also follows an orchestration
//! running on another replica.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_store::{OrchestrationEvent, OrchestrationLog};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// The most events written in one statement.
const BATCH: usize = 500;

/// Messages waiting for the writer at most: past that the store is far
/// behind, and further messages are counted as lost rather than held.
const QUEUE: usize = 10_000;

/// Hands messages to the background writer.
#[derive(Clone)]
pub struct EventWriter {
    tx: mpsc::Sender<OrchestrationEvent>,
    metrics: Arc<Metrics>,
}

/// A message in its stored (and SSE) form.
pub fn stored(m: &pb::OrchestrateResponse) -> OrchestrationEvent {
    let (kind, data) = crate::json::message(m);
    OrchestrationEvent {
        request_id: m.request_id.clone(),
        sequence: i64::try_from(m.sequence).unwrap_or(i64::MAX),
        round: i64::from(m.round),
        kind: kind.to_owned(),
        data: data.to_string(),
        created_at_ms: chrono::Utc::now().timestamp_millis(),
    }
}

/// Whether a message kind ends an orchestration.
pub fn is_last(kind: &str) -> bool {
    matches!(kind, "final_answer" | "error")
}

impl EventWriter {
    /// Starts the writer.
    pub fn spawn(log: Arc<dyn OrchestrationLog>, retention: Duration, metrics: Arc<Metrics>) -> Self {
        let (tx, mut rx) = mpsc::channel::<OrchestrationEvent>(QUEUE);
        let counted = metrics.clone();
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(BATCH);
            while let Some(first) = rx.recv().await {
                batch.push(first);
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(event) => batch.push(event),
                        Err(_) => break,
                    }
                }
                if let Err(e) = log.append(&batch, retention).await {
                    metrics.events_lost.inc_by(batch.len() as u64);
                    tracing::warn!(
                        error = %e,
                        events = batch.len(),
                        "could not store orchestration events; those streams cannot be resumed past them"
                    );
                }
                batch.clear();
            }
        });
        Self { tx, metrics: counted }
    }

    /// Queues a message for the store; when the store is too far behind,
    /// the message is counted as lost (the stream itself goes on).
    pub fn record(&self, message: &pb::OrchestrateResponse) {
        if let Err(mpsc::error::TrySendError::Full(event)) = self.tx.try_send(stored(message)) {
            self.metrics.events_lost.inc();
            tracing::debug!(request_id = %event.request_id, sequence = event.sequence,
                "the orchestration event log is {QUEUE} messages behind; this one is not kept");
        }
    }
}

/// Streams the stored events of `request_id` after `after` into `tx`,
/// following new ones until the last message, until the client goes away,
/// or until nothing new has come for `idle`.
pub async fn follow(
    log: Arc<dyn OrchestrationLog>,
    request_id: String,
    mut after: i64,
    idle: Duration,
    tx: mpsc::Sender<OrchestrationEvent>,
) {
    // Resumed right after the last message: nothing more will come.
    if after > 0 {
        let now = chrono::Utc::now().timestamp_millis();
        if let Ok(rows) = log.events_after(&request_id, after - 1, 1, now).await
            && rows.first().is_some_and(|e| e.sequence == after && is_last(&e.kind))
        {
            return;
        }
    }
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        let rows = match log.events_after(&request_id, after, 500, now).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(request_id, error = %e, "could not read orchestration events");
                Vec::new()
            }
        };
        let before = after;
        for row in rows {
            if row.sequence != after + 1 {
                // The writer is behind (or lost an event): read again later.
                break;
            }
            after = row.sequence;
            let last = is_last(&row.kind);
            if tx.send(row).await.is_err() || last {
                return;
            }
        }
        if after > before {
            quiet_since = tokio::time::Instant::now();
            continue;
        }
        if quiet_since.elapsed() >= idle || tx.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
