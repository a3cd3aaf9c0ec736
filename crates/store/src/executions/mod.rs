//! Execution records and their event logs, for the executor: created with
//! their first event, appended to in batches (one transaction, one commit
//! for many events), owned by one executor replica at a time through a
//! lease, and announced to every replica when they change.
//!
//! Ownership is fenced: a batch only writes the events of executions this
//! replica still owns and whose log ends where the batch begins, so a
//! replica that lost its lease can never interleave events with the new
//! owner's.

mod postgres;
mod sqlite;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

pub use postgres::PostgresExecutions;
pub use sqlite::SqliteExecutions;

use crate::StoreResult;
use crate::rows::StoredRow;

/// Name of the PostgreSQL notification channel carrying execution changes.
pub const EXECUTIONS_CHANNEL: &str = "agentmesh_executions";

/// An execution as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionRow {
    /// Execution id.
    pub id: String,
    /// Originating request.
    pub request_id: String,
    /// `pending`, `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// What was asked, as JSON.
    pub spec: String,
    /// W3C `traceparent` of the request that started it (empty: untraced).
    pub traceparent: String,
    /// Sequence of the last stored event.
    pub last_sequence: i64,
    /// Steps in the plan, replans included.
    pub steps: i64,
    /// Replica holding the lease.
    pub owner: Option<String>,
    /// When the lease runs out, in milliseconds since the epoch.
    pub lease_expires_at_ms: Option<i64>,
    /// Why a cancellation was asked for, when it was.
    pub cancel_requested: Option<String>,
    /// Failure or cancellation description.
    pub error: String,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// Position in the execution's log, from 1.
    pub sequence: i64,
    /// Event kind name.
    pub kind: String,
    /// Step concerned (empty for execution events).
    pub step_id: String,
    /// Attempt number.
    pub attempt: i64,
    /// The rest, as JSON.
    pub payload: String,
    /// When, in milliseconds since the epoch.
    pub occurred_at_ms: i64,
}

/// A new execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewExecution {
    /// Execution id.
    pub id: String,
    /// Originating request.
    pub request_id: String,
    /// What was asked, as JSON.
    pub spec: String,
    /// Trace context to continue.
    pub traceparent: String,
    /// Steps in the plan.
    pub steps: i64,
    /// Its first event (sequence 1).
    pub first_event: EventRow,
    /// The client that started it (empty: a caller without authentication).
    pub principal: String,
}

/// What `create` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// A new execution, owned by the caller.
    New,
    /// The id was taken: the stored execution.
    Existing(Box<ExecutionRow>),
}

/// Events of one execution to append, and what they change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Append {
    /// Execution id.
    pub execution_id: String,
    /// Events in sequence order, continuing the stored log.
    pub events: Vec<EventRow>,
    /// New status, if it changes.
    pub status: Option<String>,
    /// New step count, if it changes.
    pub steps: Option<i64>,
    /// Set when the execution ends.
    pub finished_at_ms: Option<i64>,
    /// Failure or cancellation description, when it ends.
    pub error: Option<String>,
}

/// Which executions to list, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutionFilter {
    /// Only these statuses (empty: any).
    pub statuses: Vec<String>,
    /// Only this request (empty: any).
    pub request_id: String,
    /// Only executions older than this `(created_at_ms, id)` (the previous page's last).
    pub before: Option<(i64, String)>,
    /// At most this many.
    pub limit: i64,
    /// Only those this client started (`None`: anyone's).
    pub principal: Option<String>,
}

/// A change another replica (or this one) made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExecutionNotice {
    /// Events were appended up to `last_sequence`.
    Appended {
        /// Execution id.
        id: String,
        /// Its last sequence now.
        last_sequence: i64,
    },
    /// A cancellation was asked for.
    CancelRequested {
        /// Execution id.
        id: String,
    },
    /// Notifications may have been missed: re-read what matters.
    Resync,
}

/// Storage of executions.
#[async_trait]
pub trait ExecutionStore: Send + Sync + 'static {
    /// Creates an execution with its first event, leased to `owner` until
    /// `lease_expires_at_ms`; when the id is taken, returns the stored one.
    async fn create(&self, execution: &NewExecution, owner: &str, lease_expires_at_ms: i64) -> StoreResult<Created>;
    /// Appends a batch in one transaction. Only executions still owned by
    /// `owner`, unfinished, and whose log ends right before their first
    /// event are written; the ids of the others are returned (their events
    /// are not written).
    async fn append(&self, owner: &str, batch: &[Append], now_ms: i64) -> StoreResult<Vec<String>>;
    /// One execution.
    async fn get(&self, id: &str) -> StoreResult<Option<ExecutionRow>>;
    /// Up to `limit` events after `after`, in order.
    async fn events_after(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<EventRow>>;
    /// Executions, newest first.
    async fn list(&self, filter: &ExecutionFilter) -> StoreResult<Vec<ExecutionRow>>;
    /// Leases up to `limit` unfinished executions that nobody holds (or
    /// whose lease ran out before `now_ms`) to `owner`; with `everything`,
    /// every unfinished one whoever held it (one executor per database).
    async fn claim(
        &self,
        owner: &str,
        lease_expires_at_ms: i64,
        now_ms: i64,
        limit: i64,
        everything: bool,
    ) -> StoreResult<Vec<String>>;
    /// Extends `owner`'s leases; returns the unfinished executions it still holds.
    async fn renew(&self, owner: &str, lease_expires_at_ms: i64) -> StoreResult<Vec<String>>;
    /// Gives up `owner`'s leases on `ids`, so another replica may take them at once.
    async fn release(&self, owner: &str, ids: &[String]) -> StoreResult<()>;
    /// Gives up every lease `owner` holds (it is stopping).
    async fn release_all(&self, owner: &str) -> StoreResult<u64>;
    /// Reopens a completed or failed execution whose log ends right before
    /// `event`: appends it, sets the status to `running` and the step count
    /// to `steps`, clears the end, and leases it to `owner`. False when the
    /// execution is unknown, unfinished, cancelled, or its log moved on.
    async fn reopen(
        &self,
        id: &str,
        event: &EventRow,
        steps: i64,
        owner: &str,
        lease_expires_at_ms: i64,
        now_ms: i64,
    ) -> StoreResult<bool>;
    /// Records that a cancellation is asked for an unfinished execution and
    /// announces it; returns the execution as it stands (`None`: unknown).
    async fn request_cancel(&self, id: &str, reason: &str) -> StoreResult<Option<ExecutionRow>>;
    /// Deletes executions that ended before `before_ms`, with their events.
    async fn purge_finished(&self, before_ms: i64) -> StoreResult<u64>;
    /// Checks that the database answers.
    async fn ping(&self) -> StoreResult<()>;
    /// Changes made by any replica sharing the database.
    fn subscribe(&self) -> broadcast::Receiver<ExecutionNotice>;
    /// `postgres` or `sqlite`.
    fn backend(&self) -> &'static str;
    /// Whether several executors may share the database (leases matter).
    fn shared(&self) -> bool;
}

/// A lease ending `lease` from now.
pub fn lease_end(now: DateTime<Utc>, lease: Duration) -> i64 {
    now.timestamp_millis().saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX))
}

/// The unfinished statuses, as stored.
pub(crate) const UNFINISHED: [&str; 2] = ["pending", "running"];

/// `SELECT` of every column [`decode_execution`] reads, `FROM` the table.
macro_rules! select_executions {
    () => {
        "SELECT id, request_id, status, spec, traceparent, last_sequence, steps, owner, lease_expires_at_ms, \
         cancel_requested, error, created_at_ms, finished_at_ms FROM agentmesh_executions"
    };
}
pub(crate) use select_executions;

pub(crate) fn decode_execution<R>(row: &R) -> StoreResult<ExecutionRow>
where
    R: StoredRow,
{
    Ok(ExecutionRow {
        id: row.text("id")?,
        request_id: row.text("request_id")?,
        status: row.text("status")?,
        spec: row.text("spec")?,
        traceparent: row.text("traceparent")?,
        last_sequence: row.int("last_sequence")?,
        steps: row.int("steps")?,
        owner: row.maybe_text("owner")?,
        lease_expires_at_ms: row.maybe_int("lease_expires_at_ms")?,
        cancel_requested: row.maybe_text("cancel_requested")?,
        error: row.text("error")?,
        created_at: crate::from_ms(row.int("created_at_ms")?),
        finished_at: row.maybe_int("finished_at_ms")?.map(crate::from_ms),
    })
}

pub(crate) fn decode_event<R>(row: &R) -> StoreResult<EventRow>
where
    R: StoredRow,
{
    Ok(EventRow {
        sequence: row.int("sequence")?,
        kind: row.text("kind")?,
        step_id: row.text("step_id")?,
        attempt: row.int("attempt")?,
        payload: row.text("payload")?,
        occurred_at_ms: row.int("occurred_at_ms")?,
    })
}
