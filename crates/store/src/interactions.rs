//! The LLM interaction log: every call the planner makes, kept for a while
//! and listed by request id.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, QueryBuilder, Type};

use crate::db::on_pool;
use crate::rows::StoredRow;
use crate::{StoreResult, from_ms};

/// One recorded LLM call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InteractionRecord {
    /// Row id (ignored when recording).
    pub id: i64,
    /// Request it served.
    pub request_id: String,
    /// `preselection`, `plan`, `plan_retry`, `hallucination_retry`, `replan`.
    pub kind: String,
    /// Messages sent.
    pub prompt: String,
    /// Answer.
    pub response: String,
    /// Model.
    pub model: String,
    /// Provider.
    pub provider: String,
    /// Structured-output mode (empty: none).
    pub structured_mode: String,
    /// Prompt tokens.
    pub prompt_tokens: i64,
    /// Completion tokens.
    pub completion_tokens: i64,
    /// Latency in milliseconds.
    pub latency_ms: i64,
    /// Error, if the call failed.
    pub error: Option<String>,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// The client it was made for (empty: a caller without authentication).
    pub principal: String,
}

/// How long interactions are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Successful calls.
    pub ok: Duration,
    /// Failed calls.
    pub error: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self { ok: Duration::from_secs(24 * 3600), error: Duration::from_secs(7 * 24 * 3600) }
    }
}

/// `(ok, error)`, as the LLM settings give them.
impl From<(Duration, Duration)> for Retention {
    fn from((ok, error): (Duration, Duration)) -> Self {
        Self { ok, error }
    }
}

impl Retention {
    /// Expiry, in milliseconds since the epoch, of a record.
    pub(crate) fn expires_at_ms(&self, record: &InteractionRecord) -> i64 {
        let keep = if record.error.is_some() { self.error } else { self.ok };
        record.created_at.timestamp_millis().saturating_add(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
    }
}

/// Storage of the interaction log.
#[async_trait]
pub trait InteractionLog: Send + Sync + 'static {
    /// Records calls, in order.
    async fn record(&self, records: &[InteractionRecord], retention: Retention) -> StoreResult<()>;
    /// The unexpired calls of a request, oldest first; with `principal`,
    /// only those made for that client.
    async fn interactions(
        &self,
        request_id: &str,
        principal: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<InteractionRecord>>;
    /// Deletes expired calls; returns how many.
    async fn purge_expired(&self, now: DateTime<Utc>) -> StoreResult<u64>;
    /// Checks that the database answers.
    async fn ping(&self) -> StoreResult<()>;
}

/// The columns, in insertion order.
const COLUMNS: &str = "request_id, kind, prompt, response, model, provider, structured_mode, \
prompt_tokens, completion_tokens, latency_ms, error, created_at_ms, expires_at_ms, principal";

/// One multi-row INSERT of `records` (not empty), for either backend.
fn insert<DB>(records: &[InteractionRecord], retention: Retention) -> QueryBuilder<DB>
where
    DB: Database,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let mut insert = QueryBuilder::new(format!("INSERT INTO agentmesh_llm_interactions ({COLUMNS}) "));
    insert.push_values(records, |mut b, r| {
        b.push_bind(r.request_id.clone())
            .push_bind(r.kind.clone())
            .push_bind(r.prompt.clone())
            .push_bind(r.response.clone())
            .push_bind(r.model.clone())
            .push_bind(r.provider.clone())
            .push_bind(r.structured_mode.clone())
            .push_bind(r.prompt_tokens)
            .push_bind(r.completion_tokens)
            .push_bind(r.latency_ms)
            .push_bind(r.error.clone())
            .push_bind(r.created_at.timestamp_millis())
            .push_bind(retention.expires_at_ms(r))
            .push_bind(r.principal.clone());
    });
    insert
}

/// Decodes one row selected with `id`, the columns above but `expires_at_ms`.
fn decode<R>(row: &R) -> StoreResult<InteractionRecord>
where
    R: StoredRow,
{
    Ok(InteractionRecord {
        id: row.int("id")?,
        request_id: row.text("request_id")?,
        kind: row.text("kind")?,
        prompt: row.text("prompt")?,
        response: row.text("response")?,
        model: row.text("model")?,
        provider: row.text("provider")?,
        structured_mode: row.text("structured_mode")?,
        prompt_tokens: row.int("prompt_tokens")?,
        completion_tokens: row.int("completion_tokens")?,
        latency_ms: row.int("latency_ms")?,
        error: row.maybe_text("error")?,
        created_at: from_ms(row.int("created_at_ms")?),
        principal: row.text("principal")?,
    })
}

#[async_trait]
impl InteractionLog for crate::SqlStore {
    async fn record(&self, records: &[InteractionRecord], retention: Retention) -> StoreResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        on_pool!(&self.db, pool => insert(records, retention).build().execute(pool).await?.rows_affected());
        Ok(())
    }

    async fn interactions(
        &self,
        request_id: &str,
        principal: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<InteractionRecord>> {
        on_pool!(&self.db, pool => {
            let rows = sqlx::query(
                "SELECT id, request_id, kind, prompt, response, model, provider, structured_mode, prompt_tokens, \
                 completion_tokens, latency_ms, error, created_at_ms, principal FROM agentmesh_llm_interactions \
                 WHERE request_id = $1 AND expires_at_ms > $2 AND ($3 = 0 OR principal = $4) ORDER BY id",
            )
            .bind(request_id)
            .bind(now.timestamp_millis())
            .bind(i64::from(principal.is_some()))
            .bind(principal.unwrap_or_default())
            .fetch_all(pool)
            .await?;
            rows.iter().map(decode).collect()
        })
    }

    async fn purge_expired(&self, now: DateTime<Utc>) -> StoreResult<u64> {
        let purge = "DELETE FROM agentmesh_llm_interactions WHERE expires_at_ms <= $1";
        Ok(
            on_pool!(&self.db, pool => sqlx::query(purge).bind(now.timestamp_millis()).execute(pool).await?.rows_affected()),
        )
    }

    async fn ping(&self) -> StoreResult<()> {
        self.db.ping().await
    }
}
