//! The gateway's orchestration events: every message of an orchestration,
//! kept for a while so that a client that lost its stream can resume it
//! (`Last-Event-ID`) from any gateway replica sharing the database.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Database, Encode, QueryBuilder, Type};

use crate::StoreResult;
use crate::db::on_pool;
use crate::rows::StoredRow;

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
    /// Claims `request_id` for a new orchestration, atomically across every
    /// gateway sharing the database: `true` when no orchestration had it,
    /// `false` when one has (kept `retention` from now). The claim is a row
    /// at sequence 0, which readers (from sequence 1) never see, holding
    /// `{"owner": …}`: the principal that started it.
    async fn claim(&self, request_id: &str, owner: &str, now_ms: i64, retention: Duration) -> StoreResult<bool>;
    /// Deletes expired events; returns how many.
    async fn purge_expired(&self, now_ms: i64) -> StoreResult<u64>;
    /// Checks that the database answers.
    async fn ping(&self) -> StoreResult<()>;
}

/// One multi-row INSERT of `events` (not empty), for either backend.
fn insert<DB>(events: &[OrchestrationEvent], retention: Duration) -> QueryBuilder<DB>
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

/// Decodes one selected row.
fn decode<R>(row: &R) -> StoreResult<OrchestrationEvent>
where
    R: StoredRow,
{
    Ok(OrchestrationEvent {
        request_id: row.text("request_id")?,
        sequence: row.int("sequence")?,
        round: row.int("round")?,
        kind: row.text("kind")?,
        data: row.text("data")?,
        created_at_ms: row.int("created_at_ms")?,
    })
}

#[async_trait]
impl OrchestrationLog for crate::SqlStore {
    async fn append(&self, events: &[OrchestrationEvent], retention: Duration) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        on_pool!(&self.db, pool => insert(events, retention).build().execute(pool).await?.rows_affected());
        Ok(())
    }

    async fn claim(&self, request_id: &str, owner: &str, now_ms: i64, retention: Duration) -> StoreResult<bool> {
        let claim = [OrchestrationEvent {
            request_id: request_id.to_owned(),
            sequence: 0,
            round: 0,
            kind: "claimed".into(),
            data: serde_json::json!({ "owner": owner }).to_string(),
            created_at_ms: now_ms,
        }];
        let inserted =
            on_pool!(&self.db, pool => insert(&claim, retention).build().execute(pool).await?.rows_affected());
        Ok(inserted == 1)
    }

    async fn events_after(
        &self,
        request_id: &str,
        after: i64,
        limit: i64,
        now_ms: i64,
    ) -> StoreResult<Vec<OrchestrationEvent>> {
        on_pool!(&self.db, pool => {
            let rows = sqlx::query(
                "SELECT request_id, sequence, round, kind, data, created_at_ms FROM agentmesh_orchestration_events \
                 WHERE request_id = $1 AND sequence > $2 AND expires_at_ms > $3 ORDER BY sequence LIMIT $4",
            )
            .bind(request_id)
            .bind(after)
            .bind(now_ms)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            rows.iter().map(decode).collect()
        })
    }

    async fn purge_expired(&self, now_ms: i64) -> StoreResult<u64> {
        let purge = "DELETE FROM agentmesh_orchestration_events WHERE expires_at_ms <= $1";
        Ok(on_pool!(&self.db, pool => sqlx::query(purge).bind(now_ms).execute(pool).await?.rows_affected()))
    }

    async fn ping(&self) -> StoreResult<()> {
        self.db.ping().await
    }
}
