//! The agent registry, written once for PostgreSQL and SQLite. Every write
//! is announced to every replica: on PostgreSQL with `pg_notify` in the
//! write's own transaction (each replica, this one included, hears it
//! through `LISTEN` once it commits); on SQLite in-process, after the
//! commit (other processes sharing the file learn of it through the cache
//! TTL).

use agentmesh_core::{AgentDefinition, AgentRecord, ReportedStatus};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Row};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::db::{Db, on_pool};
use crate::rows::{CAPABILITY_COLUMNS, capability_rows, collect_agents, decode_agents, select_agents, to_json};
use crate::{AgentStore, CatalogChange, Loaded, NOTIFY_CHANNEL, Registered, StoreResult, from_ms};

/// The registry's upsert; each backend adds what it returns.
macro_rules! upsert_agent {
    () => {
        "INSERT INTO agentmesh_agents (id, base_url, transport, version, deployment_type, tags, reported_status, \
         registered_at_ms, updated_at_ms, last_heartbeat_ms, credential) \
         VALUES ($1, $2, $3, $4, $5, $6, 'active', $7, $7, $7, $8) \
         ON CONFLICT (id) DO UPDATE SET base_url = excluded.base_url, transport = excluded.transport, \
         version = excluded.version, deployment_type = excluded.deployment_type, tags = excluded.tags, \
         credential = excluded.credential, \
         reported_status = 'active', updated_at_ms = excluded.updated_at_ms, \
         last_heartbeat_ms = excluded.last_heartbeat_ms RETURNING registered_at_ms"
    };
}

/// A heartbeat: the latest time wins, whatever order heartbeats arrive in.
macro_rules! heartbeat {
    () => {
        "UPDATE agentmesh_agents SET last_heartbeat_ms = CASE WHEN last_heartbeat_ms > $1 THEN last_heartbeat_ms \
         ELSE $1 END, reported_status = $2 WHERE id = $3 RETURNING id"
    };
}

/// A removal (its capabilities go with it: `ON DELETE CASCADE`).
macro_rules! deregister {
    () => {
        "DELETE FROM agentmesh_agents WHERE id = $1 RETURNING id"
    };
}

/// On PostgreSQL, a write that touched a row notifies in the same
/// statement, one round trip: `$n` and `$n+1` are the channel and payload.
macro_rules! and_notify {
    ($write:expr, $channel:literal, $payload:literal) => {
        concat!("WITH w AS (", $write, ") SELECT pg_notify(", $channel, ", ", $payload, ") FROM w")
    };
}

/// The agent registry, the LLM interaction log and the gateway's
/// orchestration log on one database.
pub struct SqlStore {
    pub(crate) db: Db,
    changes: broadcast::Sender<CatalogChange>,
    /// SQLite has one writer at a time: this process's writers queue here
    /// instead of failing with `SQLITE_BUSY`.
    write_lock: tokio::sync::Mutex<()>,
    listener: Option<JoinHandle<()>>,
}

impl Drop for SqlStore {
    fn drop(&mut self) {
        if let Some(listener) = &self.listener {
            listener.abort();
        }
    }
}

impl SqlStore {
    /// Opens the database a URL names and runs migrations: the
    /// interaction and orchestration logs.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let (changes, _) = broadcast::channel(4096);
        Ok(Self { db: Db::open(url).await?, changes, write_lock: tokio::sync::Mutex::new(()), listener: None })
    }

    /// Opens the agent registry: the database, and on PostgreSQL a listener
    /// for every replica's changes ([`AgentStore::subscribe`]).
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let mut store = Self::open(url).await?;
        if let Db::Postgres(pool) = &store.db {
            let changes = store.changes.clone();
            store.listener =
                Some(crate::postgres::forward(pool, NOTIFY_CHANNEL, changes, CatalogChange::Resync).await?);
        }
        Ok(store)
    }

    /// Waits for this process's turn to write, on SQLite.
    pub(crate) async fn writer(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.db {
            Db::Postgres(_) => None,
            Db::Sqlite(_) => Some(self.write_lock.lock().await),
        }
    }

    /// Announces a committed change in-process, on SQLite (PostgreSQL's
    /// replicas hear of it through `pg_notify`).
    fn announce(&self, change: CatalogChange) {
        if !self.db.is_postgres() {
            let _ = self.changes.send(change);
        }
    }
}

#[async_trait]
impl AgentStore for SqlStore {
    async fn register(&self, def: &AgentDefinition, now: DateTime<Utc>) -> StoreResult<Registered> {
        // Stored in whole milliseconds: the record returned is the one a
        // later read gives back.
        let now = from_ms(now.timestamp_millis());
        let now_ms = now.timestamp_millis();
        let postgres = self.db.is_postgres();
        let _writer = self.writer().await;
        let (created, registered_at_ms) = on_pool!(&self.db, pool => {
            let mut tx = pool.begin_with(self.db.begin_write()).await?;
            // PostgreSQL says whether the row is new (`xmax = 0`); SQLite,
            // holding the write lock, is asked first.
            let existing: Option<i64> = if postgres {
                None
            } else {
                sqlx::query_scalar("SELECT registered_at_ms FROM agentmesh_agents WHERE id = $1")
                    .bind(&def.id)
                    .fetch_optional(&mut *tx)
                    .await?
            };
            let sql = if postgres { concat!(upsert_agent!(), ", (xmax = 0) AS created") } else { upsert_agent!() };
            let row = sqlx::query(sql)
                .bind(&def.id)
                .bind(&def.base_url)
                .bind(def.transport.as_str())
                .bind(&def.version)
                .bind(def.deployment_type.as_str())
                .bind(to_json(&def.tags))
                .bind(now_ms)
                .bind(def.credential.clone())
                .fetch_one(&mut *tx)
                .await?;
            let registered_at_ms: i64 = row.try_get("registered_at_ms")?;
            let created = if postgres { row.try_get("created")? } else { existing.is_none() };
            sqlx::query("DELETE FROM agentmesh_capabilities WHERE agent_id = $1").bind(&def.id).execute(&mut *tx).await?;
            if def.capabilities().next().is_some() {
                let mut insert = QueryBuilder::new(format!("INSERT INTO agentmesh_capabilities ({CAPABILITY_COLUMNS}) "));
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
                        .push_bind(cap.internal)
                        .push_bind(cap.hints.as_ref().map(to_json));
                });
                insert.build().execute(&mut *tx).await?;
            }
            if postgres {
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(NOTIFY_CHANNEL)
                    .bind(to_json(&registration_change(def, created, now_ms)))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            (created, registered_at_ms)
        });
        self.announce(registration_change(def, created, now_ms));
        Ok(Registered {
            record: AgentRecord {
                definition: def.clone(),
                registered_at: from_ms(registered_at_ms),
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
        let change = CatalogChange::Heartbeat { agent_id: agent_id.to_owned(), status, at_ms };
        let postgres = self.db.is_postgres();
        let writer = self.writer().await;
        let touched = on_pool!(&self.db, pool => {
            let sql = if postgres { and_notify!(heartbeat!(), "$4", "$5") } else { heartbeat!() };
            let query = sqlx::query(sql).bind(at_ms).bind(status.as_str()).bind(agent_id);
            let query = if postgres { query.bind(NOTIFY_CHANNEL).bind(to_json(&change)) } else { query };
            query.fetch_optional(pool).await?.is_some()
        });
        drop(writer);
        if !touched {
            return Ok(None);
        }
        self.announce(change);
        self.get(agent_id).await
    }

    async fn deregister(&self, agent_id: &str) -> StoreResult<bool> {
        let change = CatalogChange::Deregistered { agent_id: agent_id.to_owned() };
        let postgres = self.db.is_postgres();
        let writer = self.writer().await;
        let deleted = on_pool!(&self.db, pool => {
            let sql = if postgres { and_notify!(deregister!(), "$2", "$3") } else { deregister!() };
            let query = sqlx::query(sql).bind(agent_id);
            let query = if postgres { query.bind(NOTIFY_CHANNEL).bind(to_json(&change)) } else { query };
            query.fetch_optional(pool).await?.is_some()
        });
        drop(writer);
        if deleted {
            self.announce(change);
        }
        Ok(deleted)
    }

    async fn bind_agent(&self, agent_id: &str, principal: &str, now: DateTime<Utc>) -> StoreResult<String> {
        let writer = self.writer().await;
        let bound = on_pool!(&self.db, pool => {
            sqlx::query(
                "INSERT INTO agentmesh_agent_bindings (agent_id, principal, bound_at_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (agent_id) DO NOTHING",
            )
            .bind(agent_id)
            .bind(principal)
            .bind(now.timestamp_millis())
            .execute(pool)
            .await?;
            sqlx::query_scalar::<_, String>("SELECT principal FROM agentmesh_agent_bindings WHERE agent_id = $1")
                .bind(agent_id)
                .fetch_one(pool)
                .await?
        });
        drop(writer);
        Ok(bound)
    }

    async fn agent_binding(&self, agent_id: &str) -> StoreResult<Option<String>> {
        Ok(on_pool!(&self.db, pool => {
            sqlx::query_scalar::<_, String>("SELECT principal FROM agentmesh_agent_bindings WHERE agent_id = $1")
                .bind(agent_id)
                .fetch_optional(pool)
                .await?
        }))
    }

    async fn unbind_agent(&self, agent_id: &str) -> StoreResult<()> {
        let writer = self.writer().await;
        on_pool!(&self.db, pool => {
            sqlx::query("DELETE FROM agentmesh_agent_bindings WHERE agent_id = $1").bind(agent_id).execute(pool).await?.rows_affected()
        });
        drop(writer);
        Ok(())
    }

    async fn get(&self, agent_id: &str) -> StoreResult<Option<AgentRecord>> {
        on_pool!(&self.db, pool => {
            let rows = sqlx::query(concat!(select_agents!(), " WHERE a.id = $1 ORDER BY a.id, c.position"))
                .bind(agent_id)
                .fetch_all(pool)
                .await?;
            decode_agents(&rows).single()
        })
    }

    async fn get_many(&self, agent_ids: &[String]) -> StoreResult<Loaded> {
        let mut loaded = Loaded::default();
        for chunk in agent_ids.chunks(500) {
            // PostgreSQL takes the ids as one array (one statement to
            // prepare, whatever their number); SQLite has no arrays.
            let part = match &self.db {
                Db::Postgres(pool) => {
                    let rows =
                        sqlx::query(concat!(select_agents!(), " WHERE a.id = ANY($1) ORDER BY a.id, c.position"))
                            .bind(chunk)
                            .fetch_all(pool)
                            .await?;
                    decode_agents(&rows)
                }
                Db::Sqlite(pool) => {
                    let mut query = QueryBuilder::new(concat!(select_agents!(), " WHERE a.id IN ("));
                    let mut ids = query.separated(", ");
                    for id in chunk {
                        ids.push_bind(id.clone());
                    }
                    query.push(") ORDER BY a.id, c.position");
                    decode_agents(&query.build().fetch_all(pool).await?)
                }
            };
            loaded.extend(part);
        }
        Ok(loaded)
    }

    async fn list(&self) -> StoreResult<Loaded> {
        on_pool!(&self.db, pool => {
            collect_agents(sqlx::query(concat!(select_agents!(), " ORDER BY a.id, c.position")).fetch(pool)).await
        })
    }

    async fn ping(&self) -> StoreResult<()> {
        self.db.ping().await
    }

    fn subscribe(&self) -> broadcast::Receiver<CatalogChange> {
        self.changes.subscribe()
    }

    fn backend(&self) -> &'static str {
        self.db.backend()
    }
}

/// What a registration changed.
fn registration_change(def: &AgentDefinition, created: bool, now_ms: i64) -> CatalogChange {
    let agent_id = def.id.clone();
    if created {
        CatalogChange::Registered { agent_id, updated_at_ms: now_ms }
    } else {
        CatalogChange::Updated { agent_id, updated_at_ms: now_ms }
    }
}
