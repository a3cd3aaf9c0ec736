//! Store calls as child spans of the request that made them: the backend,
//! the operation and how many rows came back. A call made outside any span
//! (health pings, background reloads, the executor's batched event writes,
//! which serve many requests at once) makes no span: a trace of its own per
//! timer tick or batch would bury the requests.

use std::future::Future;
use std::sync::Arc;

use agentmesh_core::{AgentDefinition, AgentRecord, ReportedStatus};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::broadcast;
use tracing::Instrument;
use tracing::field::Empty;

use crate::executions::{
    Append, Created, EventRow, ExecutionFilter, ExecutionNotice, ExecutionRow, ExecutionStore, NewExecution,
};
use crate::{AgentStore, CatalogChange, InteractionLog, InteractionRecord, Loaded, Registered, Retention, StoreResult};

/// Runs one store call in a `db.system`/`db.operation` span; `rows` counts
/// what it returned.
pub(crate) async fn in_span<T>(
    backend: &'static str,
    operation: &'static str,
    call: impl Future<Output = StoreResult<T>>,
    rows: impl FnOnce(&T) -> usize,
) -> StoreResult<T> {
    if tracing::Span::current().is_none() {
        return call.await;
    }
    // The semantic conventions' name for PostgreSQL.
    let system = if backend == "postgres" { "postgresql" } else { backend };
    let span = tracing::debug_span!(
        "store",
        otel.name = %format_args!("{operation} {backend}"),
        otel.kind = "client",
        otel.status_code = Empty,
        db.system = system,
        db.operation = operation,
        db.rows = Empty,
        error = Empty,
    );
    let result = call.instrument(span.clone()).await;
    match &result {
        Ok(value) => {
            span.record("db.rows", rows(value));
        }
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            span.record("error", tracing::field::display(e));
        }
    }
    result
}

/// An agent store whose calls are traced.
pub(crate) struct TracedAgentStore(pub Arc<dyn AgentStore>);

#[async_trait]
impl AgentStore for TracedAgentStore {
    async fn register(&self, definition: &AgentDefinition, now: DateTime<Utc>) -> StoreResult<Registered> {
        in_span(self.0.backend(), "register", self.0.register(definition, now), |_| 1).await
    }

    async fn heartbeat(
        &self,
        agent_id: &str,
        status: ReportedStatus,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<AgentRecord>> {
        in_span(self.0.backend(), "heartbeat", self.0.heartbeat(agent_id, status, now), |r| usize::from(r.is_some()))
            .await
    }

    async fn deregister(&self, agent_id: &str) -> StoreResult<bool> {
        in_span(self.0.backend(), "deregister", self.0.deregister(agent_id), |d| usize::from(*d)).await
    }

    async fn get(&self, agent_id: &str) -> StoreResult<Option<AgentRecord>> {
        in_span(self.0.backend(), "get_agent", self.0.get(agent_id), |r| usize::from(r.is_some())).await
    }

    async fn get_many(&self, agent_ids: &[String]) -> StoreResult<Loaded> {
        in_span(self.0.backend(), "get_agents", self.0.get_many(agent_ids), |l| l.agents.len()).await
    }

    async fn list(&self) -> StoreResult<Loaded> {
        in_span(self.0.backend(), "list_agents", self.0.list(), |l| l.agents.len()).await
    }

    async fn bind_agent(&self, agent_id: &str, principal: &str, now: DateTime<Utc>) -> StoreResult<String> {
        in_span(self.0.backend(), "bind_agent", self.0.bind_agent(agent_id, principal, now), |_| 1).await
    }

    async fn agent_binding(&self, agent_id: &str) -> StoreResult<Option<String>> {
        in_span(self.0.backend(), "agent_binding", self.0.agent_binding(agent_id), |b| usize::from(b.is_some())).await
    }

    async fn unbind_agent(&self, agent_id: &str) -> StoreResult<()> {
        in_span(self.0.backend(), "unbind_agent", self.0.unbind_agent(agent_id), |()| 1).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.0.ping().await
    }

    fn subscribe(&self) -> broadcast::Receiver<CatalogChange> {
        self.0.subscribe()
    }

    fn backend(&self) -> &'static str {
        self.0.backend()
    }
}

/// An interaction log whose calls are traced.
pub(crate) struct TracedInteractionLog {
    pub inner: Arc<dyn InteractionLog>,
    pub backend: &'static str,
}

#[async_trait]
impl InteractionLog for TracedInteractionLog {
    async fn record(&self, records: &[InteractionRecord], retention: Retention) -> StoreResult<()> {
        in_span(self.backend, "record_interactions", self.inner.record(records, retention), |()| records.len()).await
    }

    async fn interactions(
        &self,
        request_id: &str,
        principal: Option<&str>,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<InteractionRecord>> {
        in_span(self.backend, "list_interactions", self.inner.interactions(request_id, principal, now), Vec::len).await
    }

    async fn purge_expired(&self, now: DateTime<Utc>) -> StoreResult<u64> {
        in_span(self.backend, "purge_interactions", self.inner.purge_expired(now), |n| {
            usize::try_from(*n).unwrap_or(usize::MAX)
        })
        .await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }
}

/// An execution store whose calls are traced (lease upkeep and pings are
/// left out: they run on timers, outside any request).
pub(crate) struct TracedExecutions(pub Arc<dyn ExecutionStore>);

#[async_trait]
impl ExecutionStore for TracedExecutions {
    async fn create(&self, execution: &NewExecution, owner: &str, lease_expires_at_ms: i64) -> StoreResult<Created> {
        in_span(self.0.backend(), "create_execution", self.0.create(execution, owner, lease_expires_at_ms), |c| {
            usize::from(*c == Created::New)
        })
        .await
    }

    async fn append(&self, owner: &str, batch: &[Append], now_ms: i64) -> StoreResult<Vec<String>> {
        let events = batch.iter().map(|a| a.events.len()).sum::<usize>();
        in_span(self.0.backend(), "append_events", self.0.append(owner, batch, now_ms), |_| events).await
    }

    async fn get(&self, id: &str) -> StoreResult<Option<ExecutionRow>> {
        in_span(self.0.backend(), "get_execution", self.0.get(id), |r| usize::from(r.is_some())).await
    }

    async fn events_after(&self, id: &str, after: i64, limit: i64) -> StoreResult<Vec<EventRow>> {
        in_span(self.0.backend(), "read_events", self.0.events_after(id, after, limit), Vec::len).await
    }

    async fn list(&self, filter: &ExecutionFilter) -> StoreResult<Vec<ExecutionRow>> {
        in_span(self.0.backend(), "list_executions", self.0.list(filter), Vec::len).await
    }

    async fn claim(
        &self,
        owner: &str,
        lease_expires_at_ms: i64,
        now_ms: i64,
        limit: i64,
        everything: bool,
    ) -> StoreResult<Vec<String>> {
        self.0.claim(owner, lease_expires_at_ms, now_ms, limit, everything).await
    }

    async fn renew(&self, owner: &str, lease_expires_at_ms: i64) -> StoreResult<Vec<String>> {
        self.0.renew(owner, lease_expires_at_ms).await
    }

    async fn release(&self, owner: &str, ids: &[String]) -> StoreResult<()> {
        self.0.release(owner, ids).await
    }

    async fn release_all(&self, owner: &str) -> StoreResult<u64> {
        self.0.release_all(owner).await
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
        in_span(self.0.backend(), "reopen", self.0.reopen(id, event, steps, owner, lease_expires_at_ms, now_ms), |r| {
            usize::from(*r)
        })
        .await
    }

    async fn request_cancel(&self, id: &str, reason: &str) -> StoreResult<Option<ExecutionRow>> {
        in_span(self.0.backend(), "request_cancel", self.0.request_cancel(id, reason), |r| usize::from(r.is_some()))
            .await
    }

    async fn purge_finished(&self, before_ms: i64) -> StoreResult<u64> {
        self.0.purge_finished(before_ms).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.0.ping().await
    }

    fn subscribe(&self) -> broadcast::Receiver<ExecutionNotice> {
        self.0.subscribe()
    }

    fn backend(&self) -> &'static str {
        self.0.backend()
    }

    fn shared(&self) -> bool {
        self.0.shared()
    }
}
