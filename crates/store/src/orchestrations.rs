//! The gateway's orchestration events: every message of an orchestration,
//! kept for a while so that a client that lost its stream can resume it
//! (`Last-Event-ID`) from any gateway replica sharing the database.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, QueryBuilder, Row, Type};

use crate::StoreResult;

/// One stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrchestrationEvent {
    /// The orchestration's request id.
    pub request_id: String,
    /// Its position, from 1.
    pub sequence: i64,
    /// Its recovery round.
    pub round: i64,
    /// The message kind (`plan_created`, `final_answer`, …).
    pub kind: String,
    /// The message, as JSON.
    pub data: String,
    /// When it was sent, in milliseconds since the epoch.
    pub created_at_ms: i64,
}

/// Storage of orchestration events.
#[async_trait]
pub trait OrchestrationLog: Send + Sync + 'static {
    /// Stores events (a repeated `(request_id, sequence)` is ignored), kept
    /// for `retention`.
    async fn append(&self, events: &[OrchestrationEvent], retention: Duration) -> StoreResult<()>;
    /// Up to `limit` unexpired events of a request after `after`, in order.
    async fn events_after(
        &self,
        request_id: &str,
        after: i64,
        limit: i64,
        now_ms: i64,
    ) -> StoreResult<Vec<OrchestrationEvent>>;
    /// Deletes expired events; returns how many.
    async fn purge_expired(&self, now_ms: i64) -> StoreResult<u64>;
    /// Checks that the database answers.
    async fn ping(&self) -> StoreResult<()>;
}

/// One multi-row INSERT of `events` (not empty), for either backend.
pub(crate) fn insert<DB>(events: &[OrchestrationEvent], retention: Duration) -> QueryBuilder<DB>
where
    DB: Database,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let keep = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut insert = QueryBuilder::new(
        "INSERT INTO agentmesh_orchestration_events \
         (request_id, sequence, round, kind, data, created_at_ms, expires_at_ms) ",
    );
    insert.push_values(events, |mut b, e| {
        b.push_bind(e.request_id.clone())
            .push_bind(e.sequence)
            .push_bind(e.round)
            .push_bind(e.kind.clone())
            .push_bind(e.data.clone())
            .push_bind(e.created_at_ms)
            .push_bind(e.created_at_ms.saturating_add(keep));
    });
    insert.push(" ON CONFLICT (request_id, sequence) DO NOTHING");
    insert
}

/// The SELECT of [`OrchestrationLog::events_after`] on PostgreSQL.
pub(crate) const SELECT_POSTGRES: &str = "SELECT request_id, sequence, round, kind, data, created_at_ms \
    FROM agentmesh_orchestration_events WHERE request_id = $1 AND sequence > $2 AND expires_at_ms > $3 \
    ORDER BY sequence LIMIT $4";

/// The same on SQLite.
pub(crate) const SELECT_SQLITE: &str = "SELECT request_id, sequence, round, kind, data, created_at_ms \
    FROM agentmesh_orchestration_events WHERE request_id = ?1 AND sequence > ?2 AND expires_at_ms > ?3 \
    ORDER BY sequence LIMIT ?4";

/// Decodes one selected row.
pub(crate) fn decode<R>(row: &R) -> StoreResult<OrchestrationEvent>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(OrchestrationEvent {
        request_id: row.try_get("request_id")?,
        sequence: row.try_get("sequence")?,
        round: row.try_get("round")?,
        kind: row.try_get("kind")?,
        data: row.try_get("data")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}
