//! The registry logic both APIs call: writes go to the store and invalidate
//! the cache; reads come from the cache snapshot with health derived at
//! query time; one background task follows catalog changes from every
//! replica and turns them into watch events, another watches the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::{
    AgentDefinition, AgentRecord, Capability, CapabilityQuery, CatalogPage, FieldError, HealthPolicy, HealthStatus,
    ReportedStatus, Transport, validate_definition,
};
use agentmesh_server::Principal;
use agentmesh_store::{AgentStore, CatalogChange};
use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, mpsc, watch};
use tracing::Instrument;

use crate::cache::{CatalogCache, Encoded, Observed, Snapshot, Source};
use crate::error::DiscoveryError;
use crate::metrics::Metrics;

/// What happened to an agent, for WatchCatalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// New agent id.
    Registered,
    /// Existing agent registered again.
    Updated,
    /// Derived health changed.
    HealthChanged,
    /// Agent removed.
    Deregistered,
}

/// A catalog change as streamed to watchers.
#[derive(Debug, Clone)]
pub struct CatalogEvent {
    /// What happened.
    pub kind: EventKind,
    /// The agent concerned.
    pub agent_id: String,
    /// The agent after the change (absent when removed or unreadable),
    /// shared by every watcher.
    pub agent: Option<Arc<AgentRecord>>,
    /// Health after the change.
    pub health: Option<HealthStatus>,
    /// When the change was observed.
    pub at: DateTime<Utc>,
}

/// The agent registry.
pub struct Registry {
    store: Arc<dyn AgentStore>,
    cache: Arc<CatalogCache>,
    policy: HealthPolicy,
    metrics: Arc<Metrics>,
    events: broadcast::Sender<CatalogEvent>,
    store_healthy: watch::Sender<bool>,
    mcp: crate::mcp::Importer,
    a2a: crate::a2a::CardReader,
    /// Agents whose MCP server said its tools changed (taken by the
    /// background task).
    mcp_changes: std::sync::Mutex<Option<mpsc::Receiver<String>>>,
}

impl Registry {
    /// A registry over `store`.
    pub fn new(store: Arc<dyn AgentStore>, policy: HealthPolicy, cache_ttl: Duration, metrics: Arc<Metrics>) -> Self {
        let (events, _) = broadcast::channel(4096);
        let (store_healthy, _) = watch::channel(true);
        let (mcp, mcp_changes) = crate::mcp::Importer::new();
        Self {
            mcp,
            a2a: crate::a2a::CardReader::default(),
            mcp_changes: std::sync::Mutex::new(Some(mcp_changes)),
            cache: Arc::new(CatalogCache::new(store.clone(), cache_ttl, metrics.clone())),
            store,
            policy,
            metrics,
            events,
            store_healthy,
        }
    }

    /// The heartbeat rules in force.
    pub fn policy(&self) -> HealthPolicy {
        self.policy
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether the store answered its last check.
    pub fn store_healthy(&self) -> watch::Receiver<bool> {
        self.store_healthy.subscribe()
    }

    /// Whether `principal` may register (`register`), heartbeat or remove
    /// agent `id`: an operator or a holder of `agent:<id>` always; a holder
    /// of `agent:*` when the id is bound to it, a registration binding an
    /// id nobody holds.
    pub async fn authorize(&self, principal: &Principal, id: &str, register: bool) -> Result<(), DiscoveryError> {
        if principal.may_manage_agent(id) {
            return Ok(());
        }
        if !principal.claims_agents() {
            return Err(DiscoveryError::denied(
                principal,
                id,
                format!("it needs the role agent:{id}, agent:* or operator"),
            ));
        }
        let bound = if register {
            Some(self.store.bind_agent(id, &principal.name, Utc::now()).await?)
        } else {
            self.store.agent_binding(id).await?
        };
        match bound {
            Some(owner) if owner == principal.name => Ok(()),
            Some(_) => Err(DiscoveryError::denied(
                principal,
                id,
                "the id is bound to the principal that registered it first; an operator removing the agent frees it",
            )),
            None => Err(DiscoveryError::denied(
                principal,
                id,
                format!("`{}` did not register it (agent:* acts on the ids it registered)", principal.name),
            )),
        }
    }

    /// Validates and stores a registration made by `principal`; true when
    /// the id was new.
    pub async fn register(
        &self,
        principal: &Principal,
        mut definition: AgentDefinition,
    ) -> Result<(AgentRecord, bool), DiscoveryError> {
        if let Err(errors) = validate_definition(&definition) {
            self.metrics.writes.with_label_values(&["register", "invalid"]).inc();
            return Err(DiscoveryError::Validation(errors));
        }
        if definition.transport.is_imported() {
            if !(definition.reasoners.is_empty() && definition.skills.is_empty()) {
                self.metrics.writes.with_label_values(&["register", "invalid"]).inc();
                let message = if definition.transport == Transport::Mcp {
                    "an mcp agent's capabilities are its server's tools (tools/list): leave reasoners and skills out"
                } else {
                    "an a2a agent's capabilities are its Agent Card's skills: leave reasoners and skills out"
                };
                return Err(DiscoveryError::Validation(vec![FieldError {
                    field: "skills".into(),
                    message: message.into(),
                }]));
            }
            self.authorize(principal, &definition.id, true).await?;
            definition.skills = self.imported_skills(&definition).await.inspect_err(|_| {
                self.metrics.writes.with_label_values(&["register", "error"]).inc();
            })?;
            if let Err(errors) = validate_definition(&definition) {
                self.metrics.writes.with_label_values(&["register", "invalid"]).inc();
                return Err(DiscoveryError::Validation(errors));
            }
        } else {
            self.authorize(principal, &definition.id, true).await?;
        }
        let result = self.store.register(&definition, Utc::now()).await;
        self.count("register", result.is_ok());
        let registered = result?;
        self.cache.upsert(registered.record.clone());
        tracing::info!(operation = "register", agent_id = %definition.id, created = registered.created,
            capabilities = definition.reasoners.len() + definition.skills.len(), "agent registered");
        Ok((registered.record, registered.created))
    }

    /// Records a heartbeat; returns the health after it and the interval.
    pub async fn heartbeat(
        &self,
        principal: &Principal,
        agent_id: &str,
        status: ReportedStatus,
    ) -> Result<AgentRecord, DiscoveryError> {
        self.authorize(principal, agent_id, false).await?;
        let now = Utc::now();
        let result = self.store.heartbeat(agent_id, status, now).await;
        self.count("heartbeat", result.is_ok());
        let record = result?.ok_or_else(|| DiscoveryError::NotFound(agent_id.to_owned()))?;
        self.cache.heartbeat(agent_id, status, now.timestamp_millis());
        tracing::debug!(operation = "heartbeat", agent_id, status = status.as_str(), "heartbeat");
        Ok(record)
    }

    /// Removes an agent. Removed by an operator, its id is freed for
    /// another `agent:*` principal; removed by the agent itself, it stays
    /// bound (so that a restart can register it again and nobody else can).
    pub async fn deregister(&self, principal: &Principal, agent_id: &str) -> Result<(), DiscoveryError> {
        self.authorize(principal, agent_id, false).await?;
        if principal.has(agentmesh_server::auth::Kind::Operator) {
            self.store.unbind_agent(agent_id).await?;
        }
        let result = self.store.deregister(agent_id).await;
        self.count("deregister", result.is_ok());
        if !result? {
            return Err(DiscoveryError::NotFound(agent_id.to_owned()));
        }
        self.cache.remove(agent_id);
        tracing::info!(operation = "deregister", agent_id, "agent deregistered");
        Ok(())
    }

    fn count(&self, operation: &str, ok: bool) {
        self.metrics.writes.with_label_values(&[operation, if ok { "ok" } else { "error" }]).inc();
    }

    /// One agent with every capability and its current health.
    pub async fn get(&self, agent_id: &str) -> Result<(AgentRecord, HealthStatus), DiscoveryError> {
        let (snapshot, _) = self.cache.snapshot().await?;
        snapshot.get(agent_id, self.policy, Utc::now()).ok_or_else(|| DiscoveryError::NotFound(agent_id.to_owned()))
    }

    /// Runs a capability query and hands the page to `render`.
    pub async fn query<R>(
        &self,
        query: &CapabilityQuery,
        render: impl FnOnce(&CatalogPage<'_>, DateTime<Utc>) -> R,
    ) -> Result<(R, Source), DiscoveryError> {
        let span = query_span(query);
        let (snapshot, source) = self.snapshot_for(query).instrument(span.clone()).await?;
        let now = Utc::now();
        let page = span.in_scope(|| snapshot.query(query, self.policy, now));
        if !span.is_disabled() {
            span.record("source", tracing::field::debug(source));
            span.record("agents", page.total_agents);
            span.record("reasoners", page.total_reasoners);
            span.record("skills", page.total_skills);
        }
        tracing::debug!(
            cache = ?source,
            filters = ?query.filters_used(),
            matched_agents = page.total_agents,
            matched_reasoners = page.total_reasoners,
            matched_skills = page.total_skills,
            "filters applied"
        );
        Ok((render(&page, now), source))
    }

    /// The snapshot to answer `query` from, counting the filters it uses.
    async fn snapshot_for(&self, query: &CapabilityQuery) -> Result<(Arc<Snapshot>, Source), DiscoveryError> {
        for filter in query.filters_used() {
            self.metrics.filter_usage.with_label_values(&[filter]).inc();
        }
        self.cache.snapshot().await.map_err(|e| {
            tracing::error!(error = %e, "catalog snapshot unavailable");
            DiscoveryError::from(e)
        })
    }

    /// Like [`Registry::query`], for a response that does not depend on the
    /// time of the request: the encoded body is built once per `key` and
    /// catalog state, and shared until a write, a heartbeat or a health
    /// change of an agent it shows makes it stale (see
    /// [`Snapshot::answer_encoded`]). The flag says whether it was shared.
    pub async fn query_encoded(
        &self,
        query: &CapabilityQuery,
        key: String,
        build: impl FnOnce(&CatalogPage<'_>) -> Encoded,
    ) -> Result<(Encoded, Source, bool), DiscoveryError> {
        let span = query_span(query);
        let (snapshot, source) = self.snapshot_for(query).instrument(span.clone()).await?;
        let (encoded, shared) = span.in_scope(|| snapshot.answer_encoded(key, query, self.policy, Utc::now(), build));
        if shared {
            self.metrics.encoded_hits.inc();
        }
        if !span.is_disabled() {
            let [agents, reasoners, skills] = encoded.counts;
            span.record("source", tracing::field::debug(source));
            span.record("shared_answer", shared);
            span.record("agents", agents);
            span.record("reasoners", reasoners);
            span.record("skills", skills);
        }
        Ok((encoded, source, shared))
    }

    /// Every agent in the current snapshot, in id order, with its health:
    /// the records are shared with the snapshot, not copied.
    pub async fn observed(&self) -> Result<Vec<Observed>, DiscoveryError> {
        let (snapshot, _) = self.cache.snapshot().await?;
        Ok(snapshot.observed_shared(self.policy, Utc::now()))
    }

    /// Subscribes to catalog events.
    pub fn subscribe(&self) -> broadcast::Receiver<CatalogEvent> {
        self.events.subscribe()
    }

    /// Starts the background tasks, checking the store every
    /// `store_check_interval`; they stop when `shutdown` resolves.
    pub fn spawn_background(self: &Arc<Self>, shutdown: watch::Receiver<bool>, store_check_interval: Duration) {
        tokio::spawn(self.clone().follow_changes(shutdown.clone()));
        tokio::spawn(self.clone().refresh_imported(shutdown.clone()));
        tokio::spawn(self.clone().watch_store(shutdown, store_check_interval));
    }

    /// The capabilities an MCP or A2A agent offers now: its server's
    /// tools, its card's skills.
    async fn imported_skills(&self, definition: &AgentDefinition) -> Result<Vec<Capability>, DiscoveryError> {
        let agent = definition.id.clone();
        match definition.transport {
            Transport::A2a => {
                self.a2a.skills(definition).await.map_err(|reason| DiscoveryError::A2aAgent { agent, reason })
            }
            _ => self.mcp.skills(definition).await.map_err(|reason| DiscoveryError::McpServer { agent, reason }),
        }
    }

    /// Lists the MCP agents' tools and reads the A2A agents' cards at every
    /// heartbeat interval, and an MCP agent's tools as soon as its server
    /// says they changed.
    async fn refresh_imported(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let Some(mut changes) = self.mcp_changes.lock().ok().and_then(|mut c| c.take()) else {
            return;
        };
        let mut tick = tokio::time::interval(self.policy.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let only = tokio::select! {
                _ = tick.tick() => None,
                changed = changes.recv() => match changed {
                    Some(id) => Some(id),
                    None => return,
                },
                _ = shutdown.changed() => return,
            };
            let Ok(agents) = self.observed().await else {
                continue;
            };
            let registered: Vec<String> = agents.iter().map(|a| a.record.id().to_owned()).collect();
            self.mcp.retain(&registered).await;
            let due = agents
                .iter()
                .filter(|a| a.record.definition.transport.is_imported())
                .filter(|a| only.as_deref().is_none_or(|id| id == a.record.id()));
            futures_util::future::join_all(due.map(|a| self.refresh_one(&a.record))).await;
        }
    }

    /// Lists one MCP agent's tools (reads one A2A agent's card): a new list
    /// is stored (a registration), the same list counts as a heartbeat, no
    /// answer as nothing.
    async fn refresh_one(&self, record: &AgentRecord) {
        let id = record.id();
        let skills = match self.imported_skills(&record.definition).await {
            Ok(skills) => skills,
            Err(error) => {
                tracing::warn!(agent_id = id, %error, "an agent's capabilities could not be read from it");
                return;
            }
        };
        if skills == record.definition.skills {
            let now = Utc::now();
            match self.store.heartbeat(id, ReportedStatus::Active, now).await {
                Ok(Some(_)) => self.cache.heartbeat(id, ReportedStatus::Active, now.timestamp_millis()),
                Ok(None) => {}
                Err(e) => tracing::warn!(agent_id = id, error = %e, "an imported agent's heartbeat was not stored"),
            }
            return;
        }
        let mut definition = record.definition.clone();
        definition.skills = skills;
        if let Err(errors) = validate_definition(&definition) {
            tracing::warn!(
                agent_id = id,
                ?errors,
                "an imported agent's new capabilities are not a valid registration; kept the old ones"
            );
            return;
        }
        match self.store.register(&definition, Utc::now()).await {
            Ok(registered) => {
                self.cache.upsert(registered.record);
                tracing::info!(
                    agent_id = id,
                    capabilities = definition.skills.len(),
                    "an imported agent's capabilities changed"
                );
            }
            Err(e) => tracing::warn!(agent_id = id, error = %e, "an imported agent's new capabilities were not stored"),
        }
    }

    async fn watch_store(self: Arc<Self>, mut shutdown: watch::Receiver<bool>, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let healthy = match tokio::time::timeout(Duration::from_secs(2), self.store.ping()).await {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, backend = self.store.backend(), "agent store is unreachable");
                    false
                }
                Err(_) => {
                    tracing::warn!(backend = self.store.backend(), "agent store did not answer within 2s");
                    false
                }
            };
            self.store_healthy.send_if_modified(|current| std::mem::replace(current, healthy) != healthy);
        }
    }

    async fn follow_changes(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut changes = self.store.subscribe();
        let mut known: HashMap<String, HealthStatus> = HashMap::new();
        let sweep_every = (self.policy.heartbeat_interval / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        let mut sweep = tokio::time::interval(sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Ok(first) => {
                        // Take whatever else is queued: a burst of writes is
                        // read back in one query and applied in one copy.
                        let mut batch = vec![first];
                        while batch.len() < 1000 {
                            match changes.try_recv() {
                                Ok(change) => batch.push(change),
                                Err(broadcast::error::TryRecvError::Lagged(missed)) => self.lagged(missed),
                                Err(_) => break,
                            }
                        }
                        self.apply_changes(batch, &mut known).await;
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => self.lagged(missed),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = sweep.tick() => self.sweep_health(&mut known).await,
                _ = shutdown.changed() => return,
            }
        }
    }

    fn lagged(&self, missed: u64) {
        tracing::warn!(missed, "catalog change stream lagged; reloading the snapshot");
        self.cache.invalidate();
    }

    fn emit(&self, kind: EventKind, agent_id: &str, agent: Option<AgentRecord>, health: Option<HealthStatus>) {
        let agent = agent.map(Arc::new);
        let _ = self.events.send(CatalogEvent { kind, agent_id: agent_id.to_owned(), agent, health, at: Utc::now() });
    }

    /// Applies a batch of changes from any replica to the cache, then emits
    /// one watch event per change, in order.
    async fn apply_changes(&self, batch: Vec<CatalogChange>, known: &mut HashMap<String, HealthStatus>) {
        // The last write per agent decides its state; agents whose newest
        // version the snapshot does not hold yet are read back in one query.
        let held = self.cache.peek();
        let mut last: HashMap<&str, &CatalogChange> = HashMap::new();
        for change in &batch {
            match change {
                CatalogChange::Registered { agent_id, .. }
                | CatalogChange::Updated { agent_id, .. }
                | CatalogChange::Deregistered { agent_id } => {
                    last.insert(agent_id.as_str(), change);
                }
                CatalogChange::Heartbeat { .. } => {}
                CatalogChange::Resync => self.cache.invalidate(),
            }
        }
        let mut need = Vec::new();
        let mut removals = Vec::new();
        for (agent_id, change) in &last {
            match change {
                CatalogChange::Registered { updated_at_ms, .. } | CatalogChange::Updated { updated_at_ms, .. } => {
                    let version = DateTime::from_timestamp_millis(*updated_at_ms).unwrap_or_default();
                    let is_held = held.as_ref().and_then(|s| s.version_of(agent_id)).is_some_and(|v| v >= version);
                    if !is_held {
                        need.push((*agent_id).to_owned());
                    }
                }
                _ => removals.push((*agent_id).to_owned()),
            }
        }
        let mut fetched: HashMap<String, AgentRecord> = HashMap::new();
        if !need.is_empty() {
            match self.store.get_many(&need).await {
                Ok(loaded) => {
                    // Left out like a full load leaves them out: the agent
                    // is taken out of the snapshot below.
                    self.metrics.corrupt_rows.inc_by(u64::try_from(loaded.corrupt.len()).unwrap_or(u64::MAX));
                    fetched = loaded.agents.into_iter().map(|a| (a.id().to_owned(), a)).collect();
                    // Read back but gone: removed again since (its notification follows).
                    removals.extend(need.iter().filter(|id| !fetched.contains_key(*id)).cloned());
                }
                Err(e) => {
                    // Kept as they are: a snapshot served while the database
                    // is down must not lose the agents it could not re-read.
                    tracing::warn!(error = %e, agents = need.len(), "could not read changed agents; reloading the catalog");
                    self.cache.invalidate();
                }
            }
        }
        if !fetched.is_empty() || !removals.is_empty() {
            self.cache.apply_batch(fetched.values().cloned().collect(), removals);
        }

        let now = Utc::now();
        let snapshot = self.cache.peek();
        for change in batch {
            // The store knows whether the write created the agent; what this
            // replica has seen may already include it (a reload or a health
            // sweep can run before the notification arrives).
            let created = matches!(change, CatalogChange::Registered { .. });
            match change {
                CatalogChange::Registered { agent_id, .. } | CatalogChange::Updated { agent_id, .. } => {
                    let kind = if created { EventKind::Registered } else { EventKind::Updated };
                    let agent = fetched
                        .get(&agent_id)
                        .cloned()
                        .or_else(|| snapshot.as_ref().and_then(|s| s.get(&agent_id, self.policy, now)).map(|(a, _)| a));
                    let health = agent.as_ref().map(|a| self.policy.derive(a.last_heartbeat, a.reported_status, now));
                    if let Some(h) = health {
                        known.insert(agent_id.clone(), h);
                    }
                    self.emit(kind, &agent_id, agent, health);
                }
                CatalogChange::Heartbeat { agent_id, status, at_ms } => {
                    self.cache.heartbeat(&agent_id, status, at_ms);
                    let at = DateTime::from_timestamp_millis(at_ms).unwrap_or_default();
                    let health = self.policy.derive(at, status, now);
                    if known.insert(agent_id.clone(), health).is_some_and(|before| before != health) {
                        let agent = self.cache.peek().and_then(|s| s.get(&agent_id, self.policy, now)).map(|(a, _)| a);
                        self.emit(EventKind::HealthChanged, &agent_id, agent, Some(health));
                    }
                }
                CatalogChange::Deregistered { agent_id } => {
                    known.remove(&agent_id);
                    self.emit(EventKind::Deregistered, &agent_id, None, None);
                }
                CatalogChange::Resync => {}
            }
        }
    }

    /// Emits HEALTH_CHANGED for agents whose derived health moved with time.
    async fn sweep_health(&self, known: &mut HashMap<String, HealthStatus>) {
        let Ok((snapshot, _)) = self.cache.snapshot().await else {
            return;
        };
        let now = Utc::now();
        let mut changed = Vec::new();
        for (record, health, _) in snapshot.observed(self.policy, now) {
            match known.insert(record.id().to_owned(), health) {
                Some(before) if before != health => changed.push(record.id().to_owned()),
                _ => {}
            }
        }
        for id in changed {
            let current = snapshot.get(&id, self.policy, now);
            let health = current.as_ref().map(|(_, h)| *h);
            tracing::info!(agent_id = %id, health = health.map(HealthStatus::as_str), "agent health changed");
            self.emit(EventKind::HealthChanged, &id, current.map(|(a, _)| a), health);
        }
    }
}

/// A child span of the request for one catalog query: its filters, then
/// where the answer came from and how many agents and capabilities matched.
fn query_span(query: &CapabilityQuery) -> tracing::Span {
    tracing::debug_span!(
        "discovery.query",
        filters = ?query.filters_used(),
        source = tracing::field::Empty,
        shared_answer = tracing::field::Empty,
        agents = tracing::field::Empty,
        reasoners = tracing::field::Empty,
        skills = tracing::field::Empty,
    )
}
