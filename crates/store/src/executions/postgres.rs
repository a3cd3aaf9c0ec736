//! Executions on PostgreSQL: leases taken with `FOR UPDATE SKIP LOCKED`,
//! batches written with three statements whatever their size, and every
//! change announced with `pg_notify` in the transaction that makes it.

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::{
    Append, Created, EXECUTIONS_CHANNEL, EventRow, ExecutionFilter, ExecutionNotice, ExecutionRow, ExecutionStore,
    NewExecution, UNFINISHED, decode_event, decode_execution, select_executions,
};
use crate::StoreResult;
use crate::rows::to_json;

/// Executions in PostgreSQL, shared by any number of executor replicas.
pub struct PostgresExecutions {
    pool: PgPool,
    notices: broadcast::Sender<ExecutionNotice>,
    listener: JoinHandle<()>,
}

impl Drop for PostgresExecutions {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PostgresExecutions {
    /// Uses a migrated pool and starts listening for changes.
    pub(crate) async fn new(pool: PgPool) -> StoreResult<Self> {
        let (notices, _) = broadcast::channel(16_384);
        let listener =
            crate::postgres::forward(&pool, EXECUTIONS_CHANNEL, notices.clone(), ExecutionNotice::Resync).await?;
        Ok(Self { pool, notices, listener })
    }
}

/// Inserts events of one or more executions with one statement.
async fn insert_events(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, rows: &[(&str, &EventRow)]) -> StoreResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = rows.iter().map(|(id, _)| *id).collect();
    let sequences: Vec<i64> = rows.iter().map(|(_, e)| e.sequence).collect();
    let kinds: Vec<&str> = rows.iter().map(|(_, e)| e.kind.as_str()).collect();
    let steps: Vec<&str> = rows.iter().map(|(_, e)| e.step_id.as_str()).collect();
    let attempts: Vec<i64> = rows.iter().map(|(_, e)| e.attempt).collect();
    let payloads: Vec<&str> = rows.iter().map(|(_, e)| e.payload.as_str()).collect();
    let times: Vec<i64> = rows.iter().map(|(_, e)| e.occurred_at_ms).collect();
    sqlx::query(
        "INSERT INTO agentmesh_execution_events (execution_id, sequence, kind, step_id, attempt, payload, occurred_at_ms) \
         SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bigint[])",
    )
    .bind(&ids)
    .bind(&sequences)
    .bind(&kinds)
    .bind(&steps)
    .bind(&attempts)
    .bind(&payloads)
    .bind(&times)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn notify(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, notices: &[ExecutionNotice]) -> StoreResult<()> {
    let payloads: Vec<String> = notices.iter().map(to_json).collect();
    sqlx::query("SELECT pg_notify($1, payload) FROM UNNEST($2::text[]) AS payload")
        .bind(EXECUTIONS_CHANNEL)
        .bind(&payloads)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[async_trait]
impl ExecutionStore for PostgresExecutions {
    async fn create(&self, execution: &NewExecution, owner: &str, lease_expires_at_ms: i64) -> StoreResult<Created> {
        let mut tx = self.pool.begin().await?;
        let now_ms = execution.first_event.occurred_at_ms;
        let inserted = sqlx::query(
            "INSERT INTO agentmesh_executions (id, request_id, status, spec, traceparent, last_sequence, steps, owner, \
             lease_expires_at_ms, created_at_ms, updated_at_ms, principal) \
             VALUES ($1, $2, 'pending', $3, $4, $5, $6, $7, $8, $9, $9, $10) \
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
        .bind(&execution.principal)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            tx.rollback().await?;
            return match self.get(&execution.id).await? {
                Some(row) => Ok(Created::Existing(Box::new(row))),
                // Created and purged in between: vanishingly rare; report it as existing nothing.
                None => Err(crate::StoreError::Corrupt(format!("execution {} vanished while created", execution.id))),
            };
        }
        insert_events(&mut tx, &[(execution.id.as_str(), &execution.first_event)]).await?;
        notify(
            &mut tx,
            &[ExecutionNotice::Appended { id: execution.id.clone(), last_sequence: execution.first_event.sequence }],
        )
        .await?;
        tx.commit().await?;
        Ok(Created::New)
    }

    async fn append(&self, owner: &str, batch: &[Append], now_ms: i64) -> StoreResult<Vec<String>> {
        let batch: Vec<&Append> = batch.iter().filter(|a| !a.events.is_empty()).collect();
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = batch.iter().map(|a| a.execution_id.as_str()).collect();
        let first: Vec<i64> = batch.iter().map(|a| a.events[0].sequence).collect();
        let last: Vec<i64> = batch.iter().map(|a| a.events.last().map_or(0, |e| e.sequence)).collect();
        let statuses: Vec<Option<&str>> = batch.iter().map(|a| a.status.as_deref()).collect();
        let steps: Vec<Option<i64>> = batch.iter().map(|a| a.steps).collect();
        let finished: Vec<Option<i64>> = batch.iter().map(|a| a.finished_at_ms).collect();
        let errors: Vec<Option<&str>> = batch.iter().map(|a| a.error.as_deref()).collect();
        let rows: Vec<(&str, &EventRow)> =
            batch.iter().flat_map(|a| a.events.iter().map(move |e| (a.execution_id.as_str(), e))).collect();
        // One statement, so one round trip and one implicit transaction: the
        // fence (only executions still ours, unfinished, whose log ends right
        // before this batch; its row locks keep a claimer out until commit),
        // the events of the executions it kept, and a notification for each.
        let kept: Vec<String> = sqlx::query_scalar(
            "WITH v AS ( \
               SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[], $7::text[]) \
                 AS v(id, first_seq, last_seq, status, steps, finished_at_ms, error) \
             ), kept AS ( \
               UPDATE agentmesh_executions e SET last_sequence = v.last_seq, status = COALESCE(v.status, e.status), \
                 steps = COALESCE(v.steps, e.steps), finished_at_ms = COALESCE(v.finished_at_ms, e.finished_at_ms), \
                 error = COALESCE(v.error, e.error), updated_at_ms = $8 \
               FROM v WHERE e.id = v.id AND e.owner = $9 AND e.last_sequence = v.first_seq - 1 \
                 AND e.status IN ('pending', 'running') \
               RETURNING e.id, v.last_seq \
             ), inserted AS ( \
               INSERT INTO agentmesh_execution_events (execution_id, sequence, kind, step_id, attempt, payload, occurred_at_ms) \
               SELECT x.* FROM UNNEST($10::text[], $11::bigint[], $12::text[], $13::text[], $14::bigint[], $15::text[], $16::bigint[]) \
                 AS x(execution_id, sequence, kind, step_id, attempt, payload, occurred_at_ms) \
               WHERE x.execution_id IN (SELECT id FROM kept) \
             ) \
             SELECT kept.id FROM kept, LATERAL (SELECT pg_notify($17, json_build_object( \
               'kind', 'appended', 'id', kept.id, 'last_sequence', kept.last_seq)::text)) AS notified",
        )
        .bind(&ids)
        .bind(&first)
        .bind(&last)
        .bind(&statuses)
        .bind(&steps)
        .bind(&finished)
        .bind(&errors)
        .bind(now_ms)
        .bind(owner)
        .bind(rows.iter().map(|(id, _)| *id).collect::<Vec<&str>>())
        .bind(rows.iter().map(|(_, e)| e.sequence).collect::<Vec<i64>>())
        .bind(rows.iter().map(|(_, e)| e.kind.as_str()).collect::<Vec<&str>>())
        .bind(rows.iter().map(|(_, e)| e.step_id.as_str()).collect::<Vec<&str>>())
        .bind(rows.iter().map(|(_, e)| e.attempt).collect::<Vec<i64>>())
        .bind(rows.iter().map(|(_, e)| e.payload.as_str()).collect::<Vec<&str>>())
        .bind(rows.iter().map(|(_, e)| e.occurred_at_ms).collect::<Vec<i64>>())
        .bind(EXECUTIONS_CHANNEL)
        .fetch_all(&self.pool)
        .await?;
        Ok(batch.iter().filter(|a| !kept.contains(&a.execution_id)).map(|a| a.execution_id.clone()).collect())
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
        // One statement, as for appends: the fence, the event and the notification.
        let reopened: Option<String> = sqlx::query_scalar(
            "WITH kept AS ( \
               UPDATE agentmesh_executions SET status = 'running', last_sequence = $1, steps = $2, \
                 finished_at_ms = NULL, error = '', owner = $3, lease_expires_at_ms = $4, updated_at_ms = $5 \
               WHERE id = $6 AND last_sequence = $1 - 1 AND status IN ('completed', 'failed') \
               RETURNING id \
             ), inserted AS ( \
               INSERT INTO agentmesh_execution_events (execution_id, sequence, kind, step_id, attempt, payload, occurred_at_ms) \
               SELECT id, $1, $7, $8, $9, $10, $11 FROM kept \
             ) \
             SELECT kept.id FROM kept, LATERAL (SELECT pg_notify($12, json_build_object( \
               'kind', 'appended', 'id', kept.id, 'last_sequence', $1::bigint)::text)) AS notified",
        )
        .bind(event.sequence)
        .bind(steps)
        .bind(owner)
        .bind(lease_expires_at_ms)
        .bind(now_ms)
        .bind(id)
        .bind(&event.kind)
        .bind(&event.step_id)
        .bind(event.attempt)
        .bind(&event.payload)
        .bind(event.occurred_at_ms)
        .bind(EXECUTIONS_CHANNEL)
        .fetch_optional(&self.pool)
        .await?;
        Ok(reopened.is_some())
    }

    async fn get(&self, id: &str) -> StoreResult<Option<ExecutionRow>> {
        let row =
            sqlx::query(concat!(select_executions!(), " WHERE id = $1")).bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(decode_execution).transpose()
    }

    async fn events_after(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<EventRow>> {
        let rows = sqlx::query(
            "SELECT sequence, kind, step_id, attempt, payload, occurred_at_ms FROM agentmesh_execution_events \
             WHERE execution_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
        )
        .bind(id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(decode_event).collect()
    }

    async fn list(&self, filter: &ExecutionFilter) -> StoreResult<Vec<ExecutionRow>> {
        let (before_ms, before_id) = filter.before.clone().unwrap_or((i64::MAX, String::new()));
        let rows = sqlx::query(concat!(
            select_executions!(),
            " WHERE (cardinality($1::text[]) = 0 OR status = ANY($1)) AND ($2 = '' OR request_id = $2) \
               AND ($3 = '' AND created_at_ms <= $4 OR (created_at_ms, id) < ($4, $3)) \
               AND (NOT $6 OR principal = $7) \
             ORDER BY created_at_ms DESC, id DESC LIMIT $5"
        ))
        .bind(&filter.statuses)
        .bind(&filter.request_id)
        .bind(&before_id)
        .bind(before_ms)
        .bind(filter.limit)
        .bind(filter.principal.is_some())
        .bind(filter.principal.as_deref().unwrap_or_default())
        .fetch_all(&self.pool)
        .await?;
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
        let ids = sqlx::query_scalar(
            "UPDATE agentmesh_executions SET owner = $1, lease_expires_at_ms = $2 WHERE id IN ( \
               SELECT id FROM agentmesh_executions WHERE status IN ('pending', 'running') \
                 AND (owner IS NULL OR lease_expires_at_ms < $3 OR $5 OR owner = $1) \
               ORDER BY created_at_ms LIMIT $4 FOR UPDATE SKIP LOCKED) \
             RETURNING id",
        )
        .bind(owner)
        .bind(lease_expires_at_ms)
        .bind(now_ms)
        .bind(limit)
        .bind(everything)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids)
    }

    async fn renew(&self, owner: &str, lease_expires_at_ms: i64) -> StoreResult<Vec<String>> {
        let ids = sqlx::query_scalar(
            "UPDATE agentmesh_executions SET lease_expires_at_ms = $2 \
             WHERE owner = $1 AND status IN ('pending', 'running') RETURNING id",
        )
        .bind(owner)
        .bind(lease_expires_at_ms)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids)
    }

    async fn release(&self, owner: &str, ids: &[String]) -> StoreResult<()> {
        sqlx::query(
            "UPDATE agentmesh_executions SET owner = NULL, lease_expires_at_ms = NULL WHERE owner = $1 AND id = ANY($2)",
        )
        .bind(owner)
        .bind(ids)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn release_all(&self, owner: &str) -> StoreResult<u64> {
        let released = sqlx::query(
            "UPDATE agentmesh_executions SET owner = NULL, lease_expires_at_ms = NULL \
             WHERE owner = $1 AND status IN ('pending', 'running')",
        )
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(released.rows_affected())
    }

    async fn request_cancel(&self, id: &str, reason: &str) -> StoreResult<Option<ExecutionRow>> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE agentmesh_executions SET cancel_requested = COALESCE(cancel_requested, $2) \
             WHERE id = $1 AND status = ANY($3)",
        )
        .bind(id)
        .bind(reason)
        .bind(&UNFINISHED[..])
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() > 0 {
            notify(&mut tx, &[ExecutionNotice::CancelRequested { id: id.to_owned() }]).await?;
        }
        tx.commit().await?;
        self.get(id).await
    }

    async fn purge_finished(&self, before_ms: i64) -> StoreResult<u64> {
        let result = sqlx::query("DELETE FROM agentmesh_executions WHERE finished_at_ms < $1")
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
        "postgres"
    }

    fn shared(&self) -> bool {
        true
    }
}
