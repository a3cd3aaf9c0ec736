//! SQLite store, the embedded default. Changes are announced in-process;
//! separate processes sharing one file learn of them through the cache TTL.

use std::str::FromStr;
use std::time::Duration;

use agentmesh_core::{AgentDefinition, AgentRecord, ReportedStatus};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{QueryBuilder, Sqlite};
use tokio::sync::broadcast;

use crate::interactions::{InteractionLog, InteractionRecord, Retention};
use crate::migrate::{CREATE_MIGRATIONS_TABLE, MIGRATIONS};
use crate::rows::{CAPABILITY_COLUMNS, capability_rows, collect_agents, decode_agents, select_agents, to_json};
use crate::{AgentStore, CatalogChange, Loaded, Registered, StoreResult, from_ms};

/// Agent registry in a SQLite file (or in memory).
pub struct SqliteStore {
    pool: SqlitePool,
    changes: broadcast::Sender<CatalogChange>,
    /// SQLite has one writer at a time: writers of this process queue here
    /// instead of failing with SQLITE_BUSY, and take the write lock up front
    /// (`BEGIN IMMEDIATE`) against other processes sharing the file.
    write_lock: tokio::sync::Mutex<()>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database a `sqlite:` URL names and
    /// runs migrations. `sqlite::memory:` keeps everything in memory.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let pool = open(url).await?;
        let (changes, _) = broadcast::channel(4096);
        Ok(Self { pool, changes, write_lock: tokio::sync::Mutex::new(()) })
    }

    /// The connection pool (for other tables sharing the database).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn announce(&self, change: CatalogChange) {
        let _ = self.changes.send(change);
    }
}

/// Opens (creating if missing) the database a `sqlite:` URL names, in WAL
/// mode, and runs migrations. `sqlite::memory:` keeps everything in memory.
pub(crate) async fn open(url: &str) -> StoreResult<SqlitePool> {
    let memory = url.contains(":memory:") || url.contains("mode=memory");
    let options = SqliteConnectOptions::from_str(url)?;
    // The file is created when missing, and so is its directory (the
    // default `.agentmesh/agentmesh.db` of every command).
    if !memory
        && let Some(dir) = options.get_filename().parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(|e| {
            sqlx::Error::Io(std::io::Error::new(
                e.kind(),
                format!("cannot create the directory {} for the database: {e}", dir.display()),
            ))
        })?;
    }
    let options = options
        .create_if_missing(true)
        .journal_mode(if memory { SqliteJournalMode::Memory } else { SqliteJournalMode::Wal })
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true);
    // An in-memory database exists per connection: keep exactly one.
    let pool = SqlitePoolOptions::new()
        .max_connections(if memory { 1 } else { 4 })
        .min_connections(if memory { 1 } else { 0 })
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await?;
    migrate(&pool).await?;
    Ok(pool)
}

async fn migrate(pool: &SqlitePool) -> StoreResult<()> {
    // Take the write lock up front: two stores opening one file at once
    // (`agentmesh up` opens it for discovery and the executor) would
    // otherwise both read, then fail to upgrade to writing.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query(CREATE_MIGRATIONS_TABLE).execute(&mut *tx).await?;
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM agentmesh_schema_migrations").fetch_all(&mut *tx).await?;
    for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        sqlx::raw_sql(m.sqlite).execute(&mut *tx).await?;
        sqlx::query("INSERT INTO agentmesh_schema_migrations (version, description, applied_at_ms) VALUES (?, ?, ?)")
            .bind(m.version)
            .bind(m.description)
            .bind(Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await?;
        tracing::info!(version = m.version, description = m.description, "applied sqlite migration");
    }
    tx.commit().await?;
    Ok(())
}

#[async_trait]
impl AgentStore for SqliteStore {
    async fn register(&self, def: &AgentDefinition, now: DateTime<Utc>) -> StoreResult<Registered> {
        // Stored in whole milliseconds: the record returned is the one a
        // later read gives back.
        let now = from_ms(now.timestamp_millis());
        let now_ms = now.timestamp_millis();
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let existing: Option<i64> = sqlx::query_scalar("SELECT registered_at_ms FROM agentmesh_agents WHERE id = ?")
            .bind(&def.id)
            .fetch_optional(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO agentmesh_agents (id, base_url, transport, version, deployment_type, tags, reported_status, \
             registered_at_ms, updated_at_ms, last_heartbeat_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'active', ?7, ?7, ?7) \
             ON CONFLICT (id) DO UPDATE SET base_url = excluded.base_url, transport = excluded.transport, \
             version = excluded.version, deployment_type = excluded.deployment_type, tags = excluded.tags, \
             reported_status = 'active', updated_at_ms = excluded.updated_at_ms, last_heartbeat_ms = excluded.last_heartbeat_ms",
        )
        .bind(&def.id)
        .bind(&def.base_url)
        .bind(def.transport.as_str())
        .bind(&def.version)
        .bind(def.deployment_type.as_str())
        .bind(to_json(&def.tags))
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM agentmesh_capabilities WHERE agent_id = ?").bind(&def.id).execute(&mut *tx).await?;
        if def.capabilities().next().is_some() {
            let mut insert: QueryBuilder<Sqlite> =
                QueryBuilder::new(format!("INSERT INTO agentmesh_capabilities ({CAPABILITY_COLUMNS}) "));
            insert.push_values(capability_rows(def), |mut b, (position, kind, cap)| {
                b.push_bind(def.id.clone())
                    .push_bind(cap.id.clone())
                    .push_bind(kind.as_str())
                    .push_bind(position)
                    .push_bind(cap.description.clone())
                    .push_bind(to_json(&cap.tags))
                    .push_bind(cap.input_schema.as_ref().map(to_json))
                    .push_bind(cap.output_schema.as_ref().map(to_json))
                    .push_bind(to_json(&cap.examples))
                    .push_bind(cap.endpoint.clone())
                    .push_bind(cap.internal);
            });
            insert.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        let created = existing.is_none();
        self.announce(if created {
            CatalogChange::Registered { agent_id: def.id.clone(), updated_at_ms: now_ms }
        } else {
            CatalogChange::Updated { agent_id: def.id.clone(), updated_at_ms: now_ms }
        });
        Ok(Registered {
            record: AgentRecord {
                definition: def.clone(),
                registered_at: existing.map_or(now, from_ms),
                updated_at: now,
                last_heartbeat: now,
                reported_status: ReportedStatus::Active,
            },
            created,
        })
    }

    async fn heartbeat(
        &self,
        agent_id: &str,
        status: ReportedStatus,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<AgentRecord>> {
        let at_ms = now.timestamp_millis();
        let writer = self.write_lock.lock().await;
        let result = sqlx::query(
            "UPDATE agentmesh_agents SET last_heartbeat_ms = MAX(last_heartbeat_ms, ?1), reported_status = ?2 WHERE id = ?3",
        )
        .bind(at_ms)
        .bind(status.as_str())
        .bind(agent_id)
        .execute(&self.pool)
        .await?;
        drop(writer);
        if result.rows_affected() == 0 {
            return Ok(None);
        }
        self.announce(CatalogChange::Heartbeat { agent_id: agent_id.to_owned(), status, at_ms });
        self.get(agent_id).await
    }

    async fn deregister(&self, agent_id: &str) -> StoreResult<bool> {
        let _writer = self.write_lock.lock().await;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("DELETE FROM agentmesh_capabilities WHERE agent_id = ?").bind(agent_id).execute(&mut *tx).await?;
        let result = sqlx::query("DELETE FROM agentmesh_agents WHERE id = ?").bind(agent_id).execute(&mut *tx).await?;
        tx.commit().await?;
        let deleted = result.rows_affected() > 0;
        if deleted {
            self.announce(CatalogChange::Deregistered { agent_id: agent_id.to_owned() });
        }
        Ok(deleted)
    }

    async fn get(&self, agent_id: &str) -> StoreResult<Option<AgentRecord>> {
        let rows = sqlx::query(concat!(select_agents!(), " WHERE a.id = ? ORDER BY a.id, c.position"))
            .bind(agent_id)
            .fetch_all(&self.pool)
            .await?;
        decode_agents(&rows).single()
    }

    async fn get_many(&self, agent_ids: &[String]) -> StoreResult<Loaded> {
        let mut loaded = Loaded::default();
        for chunk in agent_ids.chunks(500) {
            let mut query: QueryBuilder<Sqlite> = QueryBuilder::new(concat!(select_agents!(), " WHERE a.id IN ("));
            let mut ids = query.separated(", ");
            for id in chunk {
                ids.push_bind(id.clone());
            }
            query.push(") ORDER BY a.id, c.position");
            let rows = query.build().fetch_all(&self.pool).await?;
            loaded.extend(decode_agents(&rows));
        }
        Ok(loaded)
    }

    async fn list(&self) -> StoreResult<Loaded> {
        let rows = sqlx::query(concat!(select_agents!(), " ORDER BY a.id, c.position")).fetch(&self.pool);
        collect_agents(rows).await
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn subscribe(&self) -> broadcast::Receiver<CatalogChange> {
        self.changes.subscribe()
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }
}

#[async_trait]
impl InteractionLog for SqliteStore {
    async fn record(&self, records: &[InteractionRecord], retention: Retention) -> StoreResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        crate::interactions::insert::<Sqlite>(records, retention).build().execute(&self.pool).await?;
        Ok(())
    }

    async fn interactions(&self, request_id: &str, now: DateTime<Utc>) -> StoreResult<Vec<InteractionRecord>> {
        let rows = sqlx::query(
            "SELECT id, request_id, kind, prompt, response, model, provider, structured_mode, prompt_tokens, \
             completion_tokens, latency_ms, error, created_at_ms FROM agentmesh_llm_interactions \
             WHERE request_id = ?1 AND expires_at_ms > ?2 ORDER BY id",
        )
        .bind(request_id)
        .bind(now.timestamp_millis())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(crate::interactions::decode).collect()
    }

    async fn purge_expired(&self, now: DateTime<Utc>) -> StoreResult<u64> {
        let result = sqlx::query("DELETE FROM agentmesh_llm_interactions WHERE expires_at_ms <= ?1")
            .bind(now.timestamp_millis())
            .execute(&self.pool)
            .await?;
        Ok(result.rows_affected())
    }

    async fn ping(&self) -> StoreResult<()> {
        AgentStore::ping(self).await
    }
}

#[async_trait]
impl crate::orchestrations::OrchestrationLog for SqliteStore {
    async fn append(
        &self,
        events: &[crate::orchestrations::OrchestrationEvent],
        retention: std::time::Duration,
    ) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        crate::orchestrations::insert::<Sqlite>(events, retention).build().execute(&self.pool).await?;
        Ok(())
    }

    async fn events_after(
        &self,
        request_id: &str,
        after: i64,
        limit: i64,
        now_ms: i64,
    ) -> StoreResult<Vec<crate::orchestrations::OrchestrationEvent>> {
        let rows = sqlx::query(crate::orchestrations::SELECT_SQLITE)
            .bind(request_id)
            .bind(after)
            .bind(now_ms)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(crate::orchestrations::decode).collect()
    }

    async fn purge_expired(&self, now_ms: i64) -> StoreResult<u64> {
        let result = sqlx::query("DELETE FROM agentmesh_orchestration_events WHERE expires_at_ms <= ?1")
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        Ok(result.rows_affected())
    }

    async fn ping(&self) -> StoreResult<()> {
        AgentStore::ping(self).await
    }
}
