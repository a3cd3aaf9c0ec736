//! Storage through sqlx, on PostgreSQL or SQLite: the agent registry
//! ([`AgentStore`], with change notifications so that every discovery
//! replica sharing a database learns of every write), the LLM interaction
//! log and the gateway's orchestration log, each written once for both
//! databases ([`SqlStore`]); and the executor's event-sourced executions,
//! written for each ([`ExecutionStore`]), where the two really differ.
//! Migrations are embedded in the binary and run at start-up.

mod agents;
mod db;
pub mod executions;
mod interactions;
mod migrate;
pub mod orchestrations;
mod postgres;
mod rows;
mod sqlite;
mod traced;

use std::sync::Arc;

use agentmesh_core::{AgentDefinition, AgentRecord, ReportedStatus};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

pub use agents::SqlStore;
pub use executions::{ExecutionStore, PostgresExecutions, SqliteExecutions};
pub use interactions::{InteractionLog, InteractionRecord, Retention};
pub use orchestrations::{OrchestrationEvent, OrchestrationLog};

/// Name of the PostgreSQL notification channel carrying catalog changes.
pub const NOTIFY_CHANNEL: &str = "agentmesh_catalog";

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or could not be reached. Shown as one line: the
    /// error is not also given as a source, which would repeat it.
    #[error("database error: {}", describe(.0))]
    Database(sqlx::Error),
    /// The database could not be opened; the message says why and what to do.
    #[error("{0}")]
    Connect(String),
    /// A stored row could not be decoded.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The database could not be brought up to date.
    #[error("migrating the database: {0}")]
    Migrate(String),
    /// The database URL names no supported backend (its scheme is kept, not
    /// the URL, which may hold a password).
    #[error("unsupported database url scheme `{0}`: use sqlite://PATH, sqlite::memory: or postgres://…")]
    UnsupportedUrl(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

/// One line describing a database error: the database's own message without
/// the server's source line, the I/O error without its wrappers.
pub fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_owned(),
        },
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::PoolTimedOut => {
            "no database connection became free in time (the database is slow or unreachable)".into()
        }
        other => other.to_string(),
    }
}

impl StoreError {
    pub(crate) fn unsupported(url: &str) -> Self {
        Self::UnsupportedUrl(url.split(':').next().unwrap_or_default().to_owned())
    }
}

/// Result alias of the store.
pub type StoreResult<T> = Result<T, StoreError>;

/// What a registration did.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The agent as stored.
    pub record: AgentRecord,
    /// True when the id was new.
    pub created: bool,
}

/// Agents read in bulk, and the stored agents left out of them because
/// their rows could not be decoded.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The agents read, ordered by id.
    pub agents: Vec<AgentRecord>,
    /// The agents left out.
    pub corrupt: Vec<CorruptAgent>,
}

/// A stored agent that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptAgent {
    /// Its id, unless the id itself could not be read.
    pub agent_id: Option<String>,
    /// What is wrong: the column or capability, and why.
    pub reason: String,
}

impl std::fmt::Display for CorruptAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.agent_id {
            Some(id) => write!(f, "agent `{id}`: {}", self.reason),
            None => write!(f, "an agent row whose id cannot be read: {}", self.reason),
        }
    }
}

/// A change to the catalog, as seen by every replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CatalogChange {
    /// A new agent id was registered.
    Registered {
        /// Agent id.
        agent_id: String,
        /// Its new `updated_at`, in milliseconds since the Unix epoch.
        updated_at_ms: i64,
    },
    /// An existing agent was registered again.
    Updated {
        /// Agent id.
        agent_id: String,
        /// Its new `updated_at`, in milliseconds since the Unix epoch.
        updated_at_ms: i64,
    },
    /// An agent heartbeated.
    Heartbeat {
        /// Agent id.
        agent_id: String,
        /// What it reported.
        status: ReportedStatus,
        /// When, in milliseconds since the Unix epoch.
        at_ms: i64,
    },
    /// An agent was removed.
    Deregistered {
        /// Agent id.
        agent_id: String,
    },
    /// Notifications may have been missed (the listener reconnected):
    /// everything cached must be reloaded.
    Resync,
}

/// The agent registry.
#[async_trait]
pub trait AgentStore: Send + Sync + 'static {
    /// Creates or replaces an agent and its capabilities in one transaction.
    async fn register(&self, definition: &AgentDefinition, now: DateTime<Utc>) -> StoreResult<Registered>;
    /// Records a heartbeat; `None` when the agent is unknown.
    async fn heartbeat(
        &self,
        agent_id: &str,
        status: ReportedStatus,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<AgentRecord>>;
    /// Removes an agent; false when it was unknown.
    async fn deregister(&self, agent_id: &str) -> StoreResult<bool>;
    /// One agent by exact id ([`StoreError::Corrupt`] when its rows cannot
    /// be decoded).
    async fn get(&self, agent_id: &str) -> StoreResult<Option<AgentRecord>>;
    /// Several agents by exact id, in one query per 500 ids; unknown ids are
    /// left out, and so are agents whose rows cannot be decoded (listed in
    /// [`Loaded::corrupt`]).
    async fn get_many(&self, agent_ids: &[String]) -> StoreResult<Loaded>;
    /// Every agent with its capabilities, ordered by id, in one query; an
    /// agent whose rows cannot be decoded is left out and listed in
    /// [`Loaded::corrupt`].
    async fn list(&self) -> StoreResult<Loaded>;
    /// Binds agent id `agent_id` to `principal` unless it is bound
    /// already; returns the principal it is bound to (in one statement, so
    /// that of two first registrations racing, one wins).
    async fn bind_agent(&self, agent_id: &str, principal: &str, now: DateTime<Utc>) -> StoreResult<String>;
    /// The principal agent id `agent_id` is bound to, if any.
    async fn agent_binding(&self, agent_id: &str) -> StoreResult<Option<String>>;
    /// Frees agent id `agent_id` for another principal to bind.
    async fn unbind_agent(&self, agent_id: &str) -> StoreResult<()>;
    /// Checks that the database answers.
    async fn ping(&self) -> StoreResult<()>;
    /// Subscribes to catalog changes made by any replica sharing the database.
    fn subscribe(&self) -> broadcast::Receiver<CatalogChange>;
    /// Short backend name for logs and health (`postgres`, `sqlite`).
    fn backend(&self) -> &'static str;
}

/// Opens the agent registry in the database a URL names (running
/// migrations) and starts its notifications. Its calls are traced as child
/// spans of the caller's.
pub async fn connect(url: &str) -> StoreResult<Arc<dyn AgentStore>> {
    Ok(Arc::new(traced::TracedAgentStore(Arc::new(SqlStore::connect(url).await?))))
}

/// Opens the interaction log in the database a URL names (running
/// migrations); its calls are traced.
pub async fn connect_interaction_log(url: &str) -> StoreResult<Arc<dyn InteractionLog>> {
    let store = SqlStore::open(url).await?;
    let backend = store.db.backend();
    Ok(Arc::new(traced::TracedInteractionLog { inner: Arc::new(store), backend }))
}

/// Opens the gateway's orchestration event log in the database a URL names
/// (running migrations).
pub async fn connect_orchestration_log(url: &str) -> StoreResult<Arc<dyn OrchestrationLog>> {
    Ok(Arc::new(SqlStore::open(url).await?))
}

/// Deletes expired interactions every ten minutes until the returned task
/// is aborted (the first pass runs at once).
pub fn spawn_interaction_purge(log: Arc<dyn InteractionLog>) -> tokio::task::JoinHandle<()> {
    every_ten_minutes("LLM interactions", move || {
        let log = log.clone();
        async move { log.purge_expired(Utc::now()).await }
    })
}

/// Deletes expired orchestration events every ten minutes until the
/// returned task is aborted (the first pass runs at once).
pub fn spawn_orchestration_purge(log: Arc<dyn OrchestrationLog>) -> tokio::task::JoinHandle<()> {
    every_ten_minutes("orchestration events", move || {
        let log = log.clone();
        async move { log.purge_expired(Utc::now().timestamp_millis()).await }
    })
}

fn every_ten_minutes<F, Fut>(what: &'static str, purge: F) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = StoreResult<u64>> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(600));
        loop {
            tick.tick().await;
            if let Err(e) = purge().await {
                tracing::warn!(error = %e, "could not purge expired {what}");
            }
        }
    })
}

/// Opens the execution store in the database a URL names (running migrations).
/// Its calls are traced.
pub async fn connect_executions(url: &str) -> StoreResult<Arc<dyn ExecutionStore>> {
    let store: Arc<dyn ExecutionStore> = match db::Db::open(url).await? {
        db::Db::Postgres(pool) => Arc::new(PostgresExecutions::new(pool).await?),
        db::Db::Sqlite(pool) => Arc::new(SqliteExecutions::new(pool)),
    };
    Ok(Arc::new(traced::TracedExecutions(store)))
}

/// Milliseconds since the epoch to a timestamp.
pub(crate) fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}
