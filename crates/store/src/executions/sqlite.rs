//! Executions in SQLite, the embedded default: one executor owns every
//! execution in the file; changes are announced in-process.

use async_trait::async_trait;
use sqlx::sqlite::SqlitePool;
use sqlx::{QueryBuilder, Sqlite};
use tokio::sync::broadcast;

use super::{
    Append, Created, EventRow, ExecutionFilter, ExecutionNotice, ExecutionRow, ExecutionStore, NewExecution,
    decode_event, decode_execution, select_executions,
};
use crate::StoreResult;

/// Executions in a SQLite file (or in memory).
pub struct SqliteExecutions {
    pool: SqlitePool,
    notices: broadcast::Sender<ExecutionNotice>,
    /// One writer at a time, queued here rather than failing with SQLITE_BUSY.
    write_lock: tokio::sync::Mutex<()>,
}

impl SqliteExecutions {
    /// Uses a migrated pool.
    pub(crate) fn new(pool: SqlitePool) -> Self {
        let (notices, _) = broadcast::channel(16_384);
        Self { pool, notices, write_lock: tokio::sync::Mutex::new(()) }
    }

    fn announce(&self, notice: ExecutionNotice) {
        let _ = self.notices.send(notice);
    }
}

/// Inserts events in statements of at most 500 rows (7 variables each).
async fn insert_events(conn: &mut sqlx::SqliteConnection, rows: &[(&str, &EventRow)]) -> StoreResult<()> {
    for chunk in rows.chunks(500) {
        let mut insert: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO agentmesh_execution_events (execution_id, sequence, kind, step_id, attempt, payload, occurred_at_ms) ",
        );
        insert.push_values(chunk, |mut b, (id, e)| {
            b.push_bind(*id)
                .push_bind(e.sequence)
                .push_bind(&e.kind)
                .push_bind(&e.step_id)
                .push_bind(e.attempt)
                .push_bind(&e.payload)
                .push_bind(e.occurred_at_ms);
        });
        insert.build().execute(&mut *conn).await?;
    }
    Ok(())
}

#[async_trait]
impl ExecutionStore for SqliteExecutions {
    async fn create(&self, execution: &NewExecution, owner: &str, lease_expires_at_ms: i64) -> StoreResult<Created> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let now_ms = execution.first_event.occurred_at_ms;
        let inserted = sqlx::query(
            "INSERT INTO agentmesh_executions (id, request_id, status, spec, traceparent, last_sequence, steps, owner, \
             lease_expires_at_ms, created_at_ms, updated_at_ms, principal) VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&execution.id)
        .bind(&execution.request_id)
        .bind(&execution.spec)
        .bind(&execution.traceparent)
        .bind(execution.first_event.sequence)
        .bind(execution.steps)
        .bind(owner)
        .bind(lease_expires_at_ms)
        .bind(now_ms)
        .bind(now_ms)
        .bind(&execution.principal)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            tx.rollback().await?;
            return match self.get(&execution.id).await? {
                Some(row) => Ok(Created::Existing(Box::new(row))),
                None => Err(crate::StoreError::Corrupt(format!("execution {} vanished while created", execution.id))),
            };
        }
        insert_events(&mut tx, &[(execution.id.as_str(), &execution.first_event)]).await?;
        tx.commit().await?;
        self.announce(ExecutionNotice::Appended {
            id: execution.id.clone(),
            last_sequence: execution.first_event.sequence,
        });
        Ok(Created::New)
    }

    async fn append(&self, owner: &str, batch: &[Append], now_ms: i64) -> StoreResult<Vec<String>> {
        let batch: Vec<&Append> = batch.iter().filter(|a| !a.events.is_empty()).collect();
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut kept = Vec::new();
        let mut lost = Vec::new();
        for a in &batch {
            let first = a.events[0].sequence;
            let last = a.events.last().map_or(first, |e| e.sequence);
            let updated = sqlx::query(
                "UPDATE agentmesh_executions SET last_sequence = ?, status = COALESCE(?, status), \
                 steps = COALESCE(?, steps), finished_at_ms = COALESCE(?, finished_at_ms), \
                 error = COALESCE(?, error), updated_at_ms = ? \
                 WHERE id = ? AND owner = ? AND last_sequence = ? AND status IN ('pending', 'running')",
            )
            .bind(last)
            .bind(a.status.as_deref())
            .bind(a.steps)
            .bind(a.finished_at_ms)
            .bind(a.error.as_deref())
            .bind(now_ms)
            .bind(&a.execution_id)
            .bind(owner)
            .bind(first - 1)
            .execute(&mut *tx)
            .await?;
            if updated.rows_affected() == 1 { kept.push(*a) } else { lost.push(a.execution_id.clone()) }
        }
        let rows: Vec<(&str, &EventRow)> =
            kept.iter().flat_map(|a| a.events.iter().map(move |e| (a.execution_id.as_str(), e))).collect();
        insert_events(&mut tx, &rows).await?;
        tx.commit().await?;
        for a in kept {
            self.announce(ExecutionNotice::Appended {
                id: a.execution_id.clone(),
                last_sequence: a.events.last().map_or(0, |e| e.sequence),
            });
        }
        Ok(lost)
    }

    async fn reopen(
        &self,
        id: &str,
        event: &EventRow,
        steps: i64,
        owner: &str,
        lease_expires_at_ms: i64,
        now_ms: i64,
    ) -> StoreResult<bool> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let updated = sqlx::query(
            "UPDATE agentmesh_executions SET status = 'running', last_sequence = ?, steps = ?, \
             finished_at_ms = NULL, error = '', owner = ?, lease_expires_at_ms = ?, updated_at_ms = ? \
             WHERE id = ? AND last_sequence = ? AND status IN ('completed', 'failed')",
        )
        .bind(event.sequence)
        .bind(steps)
        .bind(owner)
        .bind(lease_expires_at_ms)
        .bind(now_ms)
        .bind(id)
        .bind(event.sequence - 1)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            return Ok(false);
        }
        insert_events(&mut tx, &[(id, event)]).await?;
        tx.commit().await?;
        self.announce(ExecutionNotice::Appended { id: id.to_owned(), last_sequence: event.sequence });
        Ok(true)
    }

    async fn get(&self, id: &str) -> StoreResult<Option<ExecutionRow>> {
        let row =
            sqlx::query(concat!(select_executions!(), " WHERE id = ?")).bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(decode_execution).transpose()
    }

    async fn events_after(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<EventRow>> {
        let rows = sqlx::query(
            "SELECT sequence, kind, step_id, attempt, payload, occurred_at_ms FROM agentmesh_execution_events \
             WHERE execution_id = ? AND sequence > ? ORDER BY sequence LIMIT ?",
        )
        .bind(id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(decode_event).collect()
    }

    async fn list(&self, filter: &ExecutionFilter) -> StoreResult<Vec<ExecutionRow>> {
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new(concat!(select_executions!(), " WHERE 1 = 1"));
        if !filter.statuses.is_empty() {
            query.push(" AND status IN (");
            let mut list = query.separated(", ");
            for status in &filter.statuses {
                list.push_bind(status);
            }
            list.push_unseparated(")");
        }
        if !filter.request_id.is_empty() {
            query.push(" AND request_id = ").push_bind(&filter.request_id);
        }
        if let Some(principal) = &filter.principal {
            query.push(" AND principal = ").push_bind(principal);
        }
        if let Some((ms, id)) = &filter.before {
            query.push(" AND (created_at_ms < ").push_bind(*ms);
            query.push(" OR (created_at_ms = ").push_bind(*ms).push(" AND id < ").push_bind(id).push("))");
        }
        query.push(" ORDER BY created_at_ms DESC, id DESC LIMIT ").push_bind(filter.limit);
        let rows = query.build().fetch_all(&self.pool).await?;
        rows.iter().map(decode_execution).collect()
    }

    async fn claim(
        &self,
        owner: &str,
        lease_expires_at_ms: i64,
        now_ms: i64,
        limit: i64,
        everything: bool,
    ) -> StoreResult<Vec<String>> {
        let _writer = self.write_lock.lock().await;
        let ids = sqlx::query_scalar(
            "UPDATE agentmesh_executions SET owner = ?, lease_expires_at_ms = ? WHERE id IN ( \
               SELECT id FROM agentmesh_executions WHERE status IN ('pending', 'running') \
                 AND (owner IS NULL OR lease_expires_at_ms < ? OR ? OR owner = ?) \
               ORDER BY created_at_ms LIMIT ?) \
             RETURNING id",
        )
        .bind(owner)
        .bind(lease_expires_at_ms)
        .bind(now_ms)
        .bind(everything)
        .bind(owner)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids)
    }

    async fn renew(&self, owner: &str, lease_expires_at_ms: i64) -> StoreResult<Vec<String>> {
        let _writer = self.write_lock.lock().await;
        let ids = sqlx::query_scalar(
            "UPDATE agentmesh_executions SET lease_expires_at_ms = ? \
             WHERE owner = ? AND status IN ('pending', 'running') RETURNING id",
        )
        .bind(lease_expires_at_ms)
        .bind(owner)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids)
    }

    async fn release(&self, owner: &str, ids: &[String]) -> StoreResult<()> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for id in ids {
            sqlx::query(
                "UPDATE agentmesh_executions SET owner = NULL, lease_expires_at_ms = NULL WHERE owner = ? AND id = ?",
            )
            .bind(owner)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn release_all(&self, owner: &str) -> StoreResult<u64> {
        let _writer = self.write_lock.lock().await;
        let released = sqlx::query(
            "UPDATE agentmesh_executions SET owner = NULL, lease_expires_at_ms = NULL \
             WHERE owner = ? AND status IN ('pending', 'running')",
        )
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(released.rows_affected())
    }

    async fn request_cancel(&self, id: &str, reason: &str) -> StoreResult<Option<ExecutionRow>> {
        let updated = {
            let _writer = self.write_lock.lock().await;
            sqlx::query(
                "UPDATE agentmesh_executions SET cancel_requested = COALESCE(cancel_requested, ?) \
                 WHERE id = ? AND status IN ('pending', 'running')",
            )
            .bind(reason)
            .bind(id)
            .execute(&self.pool)
            .await?
        };
        if updated.rows_affected() > 0 {
            self.announce(ExecutionNotice::CancelRequested { id: id.to_owned() });
        }
        self.get(id).await
    }

    async fn purge_finished(&self, before_ms: i64) -> StoreResult<u64> {
        let _writer = self.write_lock.lock().await;
        let result = sqlx::query("DELETE FROM agentmesh_executions WHERE finished_at_ms < ?")
            .bind(before_ms)
            .execute(&self.pool)
            .await?;
        Ok(result.rows_affected())
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn subscribe(&self) -> broadcast::Receiver<ExecutionNotice> {
        self.notices.subscribe()
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn shared(&self) -> bool {
        false
    }
}
