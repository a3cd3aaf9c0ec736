//! PostgreSQL store. Every write sends `pg_notify` in its own transaction,
//! so each replica listening on the channel learns of it once it commits.

use std::str::FromStr;
use std::time::Duration;

use agentmesh_core::{AgentDefinition, AgentRecord, ReportedStatus};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::{Connection, Postgres, QueryBuilder, Row};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::interactions::{InteractionLog, InteractionRecord, Retention};
use crate::migrate::{CREATE_MIGRATIONS_TABLE, MIGRATIONS};
use crate::rows::{CAPABILITY_COLUMNS, capability_rows, collect_agents, decode_agents, select_agents, to_json};
use crate::{AgentStore, CatalogChange, Loaded, NOTIFY_CHANNEL, Registered, StoreError, StoreResult};

/// Agent registry on PostgreSQL.
pub struct PostgresStore {
    pool: PgPool,
    changes: broadcast::Sender<CatalogChange>,
    listener: JoinHandle<()>,
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PostgresStore {
    /// Connects, runs migrations and starts listening for notifications.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        Self::from_pool(pool(url).await?).await
    }

    /// Uses an existing pool; runs migrations and starts listening.
    pub async fn from_pool(pool: PgPool) -> StoreResult<Self> {
        migrate(&pool).await?;
        let (changes, _) = broadcast::channel(4096);
        let listener = tokio::spawn(forward_notifications(listen(&pool, NOTIFY_CHANNEL).await?, changes.clone()));
        Ok(Self { pool, changes, listener })
    }

    /// The connection pool (for other tables sharing the database).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// How long opening the first connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool of connections to the database a `postgres://` URL names.
///
/// One connection is made directly first: a pool retries a refused
/// connection until its timeout and then reports only that it timed out,
/// where the user needs "connection refused" or "database does not exist".
async fn pool(url: &str) -> StoreResult<PgPool> {
    let options = PgConnectOptions::from_str(url)?;
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
        }
        Ok(Err(e)) => return Err(StoreError::Connect(connect_failure(&options, &e))),
        Err(_) => {
            return Err(StoreError::Connect(format!(
                "PostgreSQL at {}:{} did not answer within {} s",
                options.get_host(),
                options.get_port(),
                CONNECT_TIMEOUT.as_secs()
            )));
        }
    }
    Ok(PgPoolOptions::new().max_connections(16).acquire_timeout(CONNECT_TIMEOUT).connect_with(options).await?)
}

/// Why the first connection failed, in one line, with what to do.
fn connect_failure(options: &PgConnectOptions, e: &sqlx::Error) -> String {
    let (host, port) = (options.get_host(), options.get_port());
    let user = options.get_username();
    let database = options.get_database().unwrap_or(user);
    match e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("3D000") => format!(
            "PostgreSQL at {host}:{port} has no database \"{database}\"; create it with: createdb -h {host} -p {port} -U {user} {database}"
        ),
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("28P01" | "28000")) => format!(
            "PostgreSQL at {host}:{port} refused user \"{user}\": {}; check the user and password in the database URL",
            db.message()
        ),
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => format!(
            "nothing accepts connections at {host}:{port} (connection refused); is PostgreSQL running there, and is the port right?"
        ),
        other => format!("cannot connect to PostgreSQL at {host}:{port}: {}", crate::describe(other)),
    }
}

/// A pool of connections to the database a `postgres://` URL names, with
/// migrations run.
pub(crate) async fn open(url: &str) -> StoreResult<PgPool> {
    let pool = pool(url).await?;
    migrate(&pool).await?;
    Ok(pool)
}

/// A listener on `channel`, listening before it is returned so that no
/// notification sent after start-up is missed.
pub(crate) async fn listen(pool: &PgPool, channel: &str) -> StoreResult<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

pub(crate) async fn migrate(pool: &PgPool) -> StoreResult<()> {
    let mut tx = pool.begin().await?;
    // Serialise migrations between replicas starting together.
    sqlx::query("SELECT pg_advisory_xact_lock(7245611)").execute(&mut *tx).await?;
    sqlx::query(CREATE_MIGRATIONS_TABLE).execute(&mut *tx).await?;
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM agentmesh_schema_migrations").fetch_all(&mut *tx).await?;
    for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        sqlx::raw_sql(m.postgres).execute(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO agentmesh_schema_migrations (version, description, applied_at_ms) VALUES ($1, $2, $3)",
        )
        .bind(m.version)
        .bind(m.description)
        .bind(Utc::now().timestamp_millis())
        .execute(&mut *tx)
        .await?;
        tracing::info!(version = m.version, description = m.description, "applied postgres migration");
    }
    tx.commit().await?;
    Ok(())
}

async fn forward_notifications(mut listener: PgListener, changes: broadcast::Sender<CatalogChange>) {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => match serde_json::from_str::<CatalogChange>(notification.payload()) {
                Ok(change) => {
                    let _ = changes.send(change);
                }
                Err(e) => {
                    tracing::warn!(error = %e, payload = notification.payload(), "ignoring malformed catalog notification")
                }
            },
            Ok(None) => {
                // The connection was lost and re-established: notifications
                // in between are gone, so everyone must reload.
                tracing::warn!("catalog listener reconnected; asking caches to reload");
                let _ = changes.send(CatalogChange::Resync);
            }
            Err(e) => {
                tracing::warn!(error = %e, "catalog listener failed; retrying in 1s");
                let _ = changes.send(CatalogChange::Resync);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[async_trait]
impl AgentStore for PostgresStore {
    async fn register(&self, def: &AgentDefinition, now: DateTime<Utc>) -> StoreResult<Registered> {
        // Stored in whole milliseconds: the record returned is the one a
        // later read gives back.
        let now = crate::from_ms(now.timestamp_millis());
        let now_ms = now.timestamp_millis();
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "INSERT INTO agentmesh_agents (id, base_url, transport, version, deployment_type, tags, reported_status, \
             registered_at_ms, updated_at_ms, last_heartbeat_ms) VALUES ($1, $2, $3, $4, $5, $6, 'active', $7, $7, $7) \
             ON CONFLICT (id) DO UPDATE SET base_url = EXCLUDED.base_url, transport = EXCLUDED.transport, \
             version = EXCLUDED.version, deployment_type = EXCLUDED.deployment_type, tags = EXCLUDED.tags, \
             reported_status = 'active', updated_at_ms = EXCLUDED.updated_at_ms, last_heartbeat_ms = EXCLUDED.last_heartbeat_ms \
             RETURNING (xmax = 0) AS created, registered_at_ms",
        )
        .bind(&def.id)
        .bind(&def.base_url)
        .bind(def.transport.as_str())
        .bind(&def.version)
        .bind(def.deployment_type.as_str())
        .bind(to_json(&def.tags))
        .bind(now_ms)
        .fetch_one(&mut *tx)
        .await?;
        let created: bool = row.try_get("created")?;
        let registered_at_ms: i64 = row.try_get("registered_at_ms")?;
        sqlx::query("DELETE FROM agentmesh_capabilities WHERE agent_id = $1").bind(&def.id).execute(&mut *tx).await?;
        if def.capabilities().next().is_some() {
            let mut insert: QueryBuilder<Postgres> =
                QueryBuilder::new(format!("INSERT INTO agentmesh_capabilities ({CAPABILITY_COLUMNS}) "));
            insert.push_values(capability_rows(def), |mut b, (position, kind, cap)| {
                b.push_bind(&def.id)
                    .push_bind(&cap.id)
                    .push_bind(kind.as_str())
                    .push_bind(position)
                    .push_bind(&cap.description)
                    .push_bind(to_json(&cap.tags))
                    .push_bind(cap.input_schema.as_ref().map(to_json))
                    .push_bind(cap.output_schema.as_ref().map(to_json))
                    .push_bind(to_json(&cap.examples))
                    .push_bind(&cap.endpoint)
                    .push_bind(cap.internal);
            });
            insert.build().execute(&mut *tx).await?;
        }
        let change = if created {
            CatalogChange::Registered { agent_id: def.id.clone(), updated_at_ms: now_ms }
        } else {
            CatalogChange::Updated { agent_id: def.id.clone(), updated_at_ms: now_ms }
        };
        notify(&mut tx, &change).await?;
        tx.commit().await?;
        Ok(Registered {
            record: AgentRecord {
                definition: def.clone(),
                registered_at: crate::from_ms(registered_at_ms),
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
        // One round trip: update, and notify only when a row was updated.
        let updated = sqlx::query(
            "WITH u AS (UPDATE agentmesh_agents SET last_heartbeat_ms = GREATEST(last_heartbeat_ms, $1), \
             reported_status = $2 WHERE id = $3 RETURNING id) SELECT pg_notify($4, $5) FROM u",
        )
        .bind(at_ms)
        .bind(status.as_str())
        .bind(agent_id)
        .bind(NOTIFY_CHANNEL)
        .bind(to_json(&change))
        .fetch_optional(&self.pool)
        .await?;
        if updated.is_none() {
            return Ok(None);
        }
        self.get(agent_id).await
    }

    async fn deregister(&self, agent_id: &str) -> StoreResult<bool> {
        let change = CatalogChange::Deregistered { agent_id: agent_id.to_owned() };
        let deleted = sqlx::query(
            "WITH d AS (DELETE FROM agentmesh_agents WHERE id = $1 RETURNING id) SELECT pg_notify($2, $3) FROM d",
        )
        .bind(agent_id)
        .bind(NOTIFY_CHANNEL)
        .bind(to_json(&change))
        .fetch_optional(&self.pool)
        .await?;
        Ok(deleted.is_some())
    }

    async fn get(&self, agent_id: &str) -> StoreResult<Option<AgentRecord>> {
        let rows = sqlx::query(concat!(select_agents!(), " WHERE a.id = $1 ORDER BY a.id, c.position"))
            .bind(agent_id)
            .fetch_all(&self.pool)
            .await?;
        decode_agents(&rows).single()
    }

    async fn get_many(&self, agent_ids: &[String]) -> StoreResult<Loaded> {
        let mut loaded = Loaded::default();
        for chunk in agent_ids.chunks(500) {
            let rows = sqlx::query(concat!(select_agents!(), " WHERE a.id = ANY($1) ORDER BY a.id, c.position"))
                .bind(chunk)
                .fetch_all(&self.pool)
                .await?;
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
        "postgres"
    }
}

async fn notify(tx: &mut sqlx::Transaction<'_, Postgres>, change: &CatalogChange) -> StoreResult<()> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(to_json(change)).execute(&mut **tx).await?;
    Ok(())
}

#[async_trait]
impl InteractionLog for PostgresStore {
    async fn record(&self, records: &[InteractionRecord], retention: Retention) -> StoreResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        crate::interactions::insert::<Postgres>(records, retention).build().execute(&self.pool).await?;
        Ok(())
    }

    async fn interactions(&self, request_id: &str, now: DateTime<Utc>) -> StoreResult<Vec<InteractionRecord>> {
        let rows = sqlx::query(
            "SELECT id, request_id, kind, prompt, response, model, provider, structured_mode, prompt_tokens, \
             completion_tokens, latency_ms, error, created_at_ms FROM agentmesh_llm_interactions \
             WHERE request_id = $1 AND expires_at_ms > $2 ORDER BY id",
        )
        .bind(request_id)
        .bind(now.timestamp_millis())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(crate::interactions::decode).collect()
    }

    async fn purge_expired(&self, now: DateTime<Utc>) -> StoreResult<u64> {
        let result = sqlx::query("DELETE FROM agentmesh_llm_interactions WHERE expires_at_ms <= $1")
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
impl crate::orchestrations::OrchestrationLog for PostgresStore {
    async fn append(
        &self,
        events: &[crate::orchestrations::OrchestrationEvent],
        retention: std::time::Duration,
    ) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        crate::orchestrations::insert::<Postgres>(events, retention).build().execute(&self.pool).await?;
        Ok(())
    }

    async fn events_after(
        &self,
        request_id: &str,
        after: i64,
        limit: i64,
        now_ms: i64,
    ) -> StoreResult<Vec<crate::orchestrations::OrchestrationEvent>> {
        let rows = sqlx::query(crate::orchestrations::SELECT_POSTGRES)
            .bind(request_id)
            .bind(after)
            .bind(now_ms)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(crate::orchestrations::decode).collect()
    }

    async fn purge_expired(&self, now_ms: i64) -> StoreResult<u64> {
        let result = sqlx::query("DELETE FROM agentmesh_orchestration_events WHERE expires_at_ms <= $1")
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        Ok(result.rows_affected())
    }

    async fn ping(&self) -> StoreResult<()> {
        AgentStore::ping(self).await
    }
}
