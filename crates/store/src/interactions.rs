//! The LLM interaction log: every call the planner makes, kept for a while
//! and listed by request id.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Database, Decode, Encode, QueryBuilder, Row, Type};

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
    /// The unexpired calls of a request, oldest first.
    async fn interactions(&self, request_id: &str, now: DateTime<Utc>) -> StoreResult<Vec<InteractionRecord>>;
    /// Deletes expired calls; returns how many.
    async fn purge_expired(&self, now: DateTime<Utc>) -> StoreResult<u64>;
    /// Checks that the database answers.
    async fn ping(&self) -> StoreResult<()>;
}

/// The columns, in insertion order.
const COLUMNS: &str = "request_id, kind, prompt, response, model, provider, structured_mode, \
prompt_tokens, completion_tokens, latency_ms, error, created_at_ms, expires_at_ms";

/// One multi-row INSERT of `records` (not empty), for either backend.
pub(crate) fn insert<DB>(records: &[InteractionRecord], retention: Retention) -> QueryBuilder<DB>
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
            .push_bind(retention.expires_at_ms(r));
    });
    insert
}

/// Decodes one row selected with `id`, the columns above but `expires_at_ms`.
pub(crate) fn decode<R>(row: &R) -> StoreResult<InteractionRecord>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(InteractionRecord {
        id: row.try_get("id")?,
        request_id: row.try_get("request_id")?,
        kind: row.try_get("kind")?,
        prompt: row.try_get("prompt")?,
        response: row.try_get("response")?,
        model: row.try_get("model")?,
        provider: row.try_get("provider")?,
        structured_mode: row.try_get("structured_mode")?,
        prompt_tokens: row.try_get("prompt_tokens")?,
        completion_tokens: row.try_get("completion_tokens")?,
        latency_ms: row.try_get("latency_ms")?,
        error: row.try_get("error")?,
        created_at: from_ms(row.try_get("created_at_ms")?),
    })
}
