//! The store contract, run against both backends on real databases.

use std::time::Duration;

use agentmesh_core::{AgentDefinition, ReportedStatus};
use agentmesh_store::{CatalogChange, connect};
use agentmesh_testkit::{Backend, TestDatabase};
use chrono::{DateTime, Utc};
use serde_json::json;

fn definition(id: &str, skills: &[&str]) -> AgentDefinition {
    serde_json::from_value(json!({
        "id": id,
        "base_url": "http://127.0.0.1:9001",
        "version": "1.0.0",
        "tags": ["t1"],
        "reasoners": [{"id": "plan", "description": "plans", "tags": ["r"], "examples": [{"input": {"q": 1}}]}],
        "skills": skills.iter().map(|s| json!({
            "id": s, "description": format!("does {s}"), "tags": ["s"],
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            "internal": *s == "internal_one",
        })).collect::<Vec<_>>(),
    }))
    .unwrap_or_else(|e| panic!("{e}"))
}

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap_or_default()
}

async fn next_change(rx: &mut tokio::sync::broadcast::Receiver<CatalogChange>) -> CatalogChange {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no change notification within 5s"))
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn contract(backend: Backend) {
    let Some(db) = TestDatabase::new(backend).await else { return };
    let store = connect(&db.url).await.unwrap_or_else(|e| panic!("{e}"));
    let mut changes = store.subscribe();

    // Registration creates, then replaces; capabilities keep their order.
    let first = store.register(&definition("b-agent", &["x", "y"]), at(0)).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(first.created);
    assert_eq!(
        next_change(&mut changes).await,
        CatalogChange::Registered { agent_id: "b-agent".into(), updated_at_ms: at(0).timestamp_millis() }
    );
    store.register(&definition("a-agent", &["internal_one"]), at(1)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        next_change(&mut changes).await,
        CatalogChange::Registered { agent_id: "a-agent".into(), updated_at_ms: at(1).timestamp_millis() }
    );
    let replaced = store.register(&definition("b-agent", &["z"]), at(10)).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!replaced.created);
    assert_eq!(replaced.record.registered_at, at(0), "first registration time is kept");
    assert_eq!(
        next_change(&mut changes).await,
        CatalogChange::Updated { agent_id: "b-agent".into(), updated_at_ms: at(10).timestamp_millis() }
    );

    let all = store.list().await.unwrap_or_else(|e| panic!("{e}")).agents;
    assert_eq!(all.iter().map(|a| a.id()).collect::<Vec<_>>(), ["a-agent", "b-agent"]);
    let b = &all[1];
    assert_eq!(b.definition, definition("b-agent", &["z"]), "stored definition round-trips exactly");
    assert_eq!(b.updated_at, at(10));
    assert!(all[0].definition.skills[0].internal);

    // The record a registration returns is the one a read gives back, even
    // when the clock has sub-millisecond precision.
    let precise = at(20) + chrono::Duration::microseconds(123);
    let returned = store.register(&definition("c-agent", &["x"]), precise).await.unwrap_or_else(|e| panic!("{e}"));
    let _ = next_change(&mut changes).await;
    let read = store.list().await.unwrap_or_else(|e| panic!("{e}")).agents;
    assert_eq!(read.iter().find(|a| a.id() == "c-agent"), Some(&returned.record));
    assert!(store.deregister("c-agent").await.unwrap_or_else(|e| panic!("{e}")));
    let _ = next_change(&mut changes).await;

    // Heartbeats move forward only and record the reported status.
    let hb = store.heartbeat("b-agent", ReportedStatus::Degraded, at(20)).await.unwrap_or_else(|e| panic!("{e}"));
    let hb = hb.unwrap_or_else(|| panic!("b-agent exists"));
    assert_eq!((hb.last_heartbeat, hb.reported_status), (at(20), ReportedStatus::Degraded));
    assert_eq!(
        next_change(&mut changes).await,
        CatalogChange::Heartbeat {
            agent_id: "b-agent".into(),
            status: ReportedStatus::Degraded,
            at_ms: at(20).timestamp_millis()
        }
    );
    let late = store.heartbeat("b-agent", ReportedStatus::Active, at(15)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(late.map(|r| r.last_heartbeat), Some(at(20)), "an older heartbeat does not move time back");
    let _ = next_change(&mut changes).await;
    assert!(
        store.heartbeat("nobody", ReportedStatus::Active, at(30)).await.unwrap_or_else(|e| panic!("{e}")).is_none()
    );

    // Removal cascades to capabilities.
    assert!(store.deregister("b-agent").await.unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(next_change(&mut changes).await, CatalogChange::Deregistered { agent_id: "b-agent".into() });
    assert!(!store.deregister("b-agent").await.unwrap_or_else(|e| panic!("{e}")));
    assert!(store.get("b-agent").await.unwrap_or_else(|e| panic!("{e}")).is_none());
    store.register(&definition("b-agent", &[]), at(40)).await.unwrap_or_else(|e| panic!("{e}"));
    let b = store.get("b-agent").await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("registered"));
    assert!(b.definition.skills.is_empty(), "old capabilities did not survive removal");
    assert_eq!(b.definition.reasoners.len(), 1);
    store.ping().await.unwrap_or_else(|e| panic!("{e}"));
    let many = store
        .get_many(&["b-agent".into(), "nobody".into(), "a-agent".into()])
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .agents;
    assert_eq!(many.iter().map(|a| a.id()).collect::<Vec<_>>(), ["a-agent", "b-agent"]);
    assert_eq!(many[1].definition.reasoners.len(), 1);

    // Migrations are idempotent: a second connection to the same database works.
    let again = connect(&db.url).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.list().await.unwrap_or_else(|e| panic!("{e}")).agents.len(), 2);
}

#[tokio::test]
async fn sqlite_store_contract() {
    contract(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_store_contract() {
    contract(Backend::Postgres).await;
}

#[tokio::test]
async fn postgres_notifications_reach_every_store_sharing_the_database() {
    let Some(db) = TestDatabase::postgres().await else { return };
    let writer = connect(&db.url).await.unwrap_or_else(|e| panic!("{e}"));
    let reader = connect(&db.url).await.unwrap_or_else(|e| panic!("{e}"));
    let mut changes = reader.subscribe();
    writer.register(&definition("w", &["x"]), at(0)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        next_change(&mut changes).await,
        CatalogChange::Registered { agent_id: "w".into(), updated_at_ms: at(0).timestamp_millis() }
    );
    writer.heartbeat("w", ReportedStatus::Active, at(5)).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(next_change(&mut changes).await, CatalogChange::Heartbeat { .. }));
    writer.deregister("w").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(next_change(&mut changes).await, CatalogChange::Deregistered { agent_id: "w".into() });
}

#[tokio::test]
async fn unsupported_urls_are_rejected_with_guidance() {
    let err = connect("mysql://x").await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("sqlite://") && err.contains("postgres://"), "{err}");
}

/// Each way of failing to reach PostgreSQL is one line saying what is wrong
/// and what to do, not the pool's "timed out" or the server's source line.
#[tokio::test]
async fn postgres_connection_failures_say_what_to_do() {
    let Some(db) = TestDatabase::postgres().await else { return };
    let missing = agentmesh_testkit::replace_database(&db.url, "agentmesh_no_such_database");
    let err = connect(&missing).await.err().map(|e| format!("{:#}", anyhow::Error::from(e))).unwrap_or_default();
    assert!(err.contains("no database \"agentmesh_no_such_database\""), "{err}");
    assert!(err.contains("createdb"), "says how to create it: {err}");
    assert!(!err.contains("at line"), "no server source line: {err}");
    assert_eq!(err.matches("agentmesh_no_such_database\"").count(), 1, "said once: {err}");

    // A port nothing listens on: refused at once, and said so.
    let closed = agentmesh_testkit::bind_local().await.unwrap_or_else(|e| panic!("{e}"));
    let port = closed.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
    drop(closed);
    let err = connect(&format!("postgres://postgres@127.0.0.1:{port}/x"))
        .await
        .err()
        .map(|e| format!("{:#}", anyhow::Error::from(e)))
        .unwrap_or_default();
    assert!(err.contains("connection refused") && err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("timed out"), "{err}");
}

async fn interaction_log(backend: Backend) {
    use agentmesh_store::{InteractionRecord, Retention, connect_interaction_log};
    let Some(db) = TestDatabase::new(backend).await else { return };
    let log = connect_interaction_log(&db.url).await.unwrap_or_else(|e| panic!("{e}"));
    let record = |kind: &str, error: Option<&str>, created: DateTime<Utc>| InteractionRecord {
        id: 0,
        request_id: "req_1".into(),
        kind: kind.into(),
        prompt: "[System]\nplan".into(),
        response: "{}".into(),
        model: "m".into(),
        provider: "openai".into(),
        structured_mode: "json_schema".into(),
        prompt_tokens: 12,
        completion_tokens: 7,
        latency_ms: 30,
        error: error.map(str::to_owned),
        created_at: created,
        principal: if kind == "plan" { "shop".into() } else { "billing".into() },
    };
    let retention = Retention { ok: Duration::from_secs(10), error: Duration::from_secs(100) };
    log.record(&[record("plan", None, at(0)), record("plan_retry", Some("timeout"), at(1))], retention)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let listed = log.interactions("req_1", None, at(2)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(listed.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(), ["plan", "plan_retry"]);
    assert_eq!((listed[0].prompt_tokens, listed[1].error.as_deref()), (12, Some("timeout")));
    assert_eq!(listed[0].principal, "shop");
    assert!(log.interactions("other", None, at(2)).await.unwrap_or_else(|e| panic!("{e}")).is_empty());
    // A client sees the calls made for it only.
    let shop = log.interactions("req_1", Some("shop"), at(2)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(shop.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(), ["plan"]);
    assert!(log.interactions("req_1", Some("nobody"), at(2)).await.unwrap_or_else(|e| panic!("{e}")).is_empty());
    // Successful calls expire after 10 s, errors after 100 s.
    assert_eq!(log.purge_expired(at(20_000)).await.unwrap_or_else(|e| panic!("{e}")), 1);
    let left = log.interactions("req_1", None, at(20_000)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(left.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(), ["plan_retry"]);
}

#[tokio::test]
async fn sqlite_interaction_log() {
    interaction_log(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_interaction_log() {
    interaction_log(Backend::Postgres).await;
}

/// Runs SQL on the test database behind the store's back, as a hand edit,
/// a faulty tool or an earlier release would.
async fn execute(db: &TestDatabase, backend: Backend, sql: &'static str) {
    try_execute(db, backend, sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn try_execute(db: &TestDatabase, backend: Backend, sql: &'static str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    match backend {
        Backend::Sqlite => {
            let options: sqlx::sqlite::SqliteConnectOptions = db.url.parse()?;
            let mut conn = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true)).await?;
            sqlx::raw_sql(sql).execute(&mut conn).await?;
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await?;
            sqlx::raw_sql(sql).execute(&mut conn).await?;
        }
    }
    Ok(())
}

/// A database an earlier release made (its tables, its own record of the
/// migrations applied, no sqlx record) is brought up to date with its data;
/// one whose applied script was changed since is refused.
async fn databases_of_earlier_releases_are_migrated(backend: Backend) {
    let Some(db) = TestDatabase::new(backend).await else { return };
    let scripts: [&'static str; 4] = match backend {
        Backend::Postgres => [
            include_str!("../migrations/postgres/0001_agents.sql"),
            include_str!("../migrations/postgres/0002_llm_interactions.sql"),
            include_str!("../migrations/postgres/0003_executions.sql"),
            include_str!("../migrations/postgres/0004_orchestration_events.sql"),
        ],
        Backend::Sqlite => [
            include_str!("../migrations/sqlite/0001_agents.sql"),
            include_str!("../migrations/sqlite/0002_llm_interactions.sql"),
            include_str!("../migrations/sqlite/0003_executions.sql"),
            include_str!("../migrations/sqlite/0004_orchestration_events.sql"),
        ],
    };
    for script in scripts {
        execute(&db, backend, script).await;
    }
    execute(
        &db,
        backend,
        "CREATE TABLE agentmesh_schema_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         applied_at_ms BIGINT NOT NULL); \
         INSERT INTO agentmesh_schema_migrations VALUES (1, 'agents', 0), (2, 'log', 0), (3, 'executions', 0), (4, 'events', 0); \
         INSERT INTO agentmesh_agents VALUES ('old-agent', 'http://127.0.0.1:9', 'http', '1', 'long_running', '[]', \
         'active', 5, 5, 5)",
    )
    .await;

    let store = connect(&db.url).await.unwrap_or_else(|e| panic!("an earlier release's database: {e}"));
    let old = store.get("old-agent").await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(old.map(|a| a.definition.base_url), Some("http://127.0.0.1:9".to_owned()), "data is kept");
    drop(store);
    let old_record = try_execute(&db, backend, "SELECT * FROM agentmesh_schema_migrations").await;
    assert!(old_record.is_err(), "the earlier record of migrations is dropped");
    connect(&db.url).await.unwrap_or_else(|e| panic!("opening it again: {e}"));

    let tamper = match backend {
        Backend::Postgres => "UPDATE _sqlx_migrations SET checksum = '\\x00'::bytea WHERE version = 2",
        Backend::Sqlite => "UPDATE _sqlx_migrations SET checksum = x'00' WHERE version = 2",
    };
    execute(&db, backend, tamper).await;
    let refused = connect(&db.url).await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.contains("migrating the database") && refused.contains("2"), "{refused}");
}

/// A stored agent whose rows cannot be read is left out of bulk reads
/// instead of failing them: every other agent still loads, whole.
async fn corrupt_rows_are_skipped(backend: Backend) {
    let Some(db) = TestDatabase::new(backend).await else { return };
    let store = connect(&db.url).await.unwrap_or_else(|e| panic!("{e}"));
    let ids = ["a-agent", "b-agent", "c-agent", "d-agent", "e-agent", "f-agent"];
    for id in ids {
        store.register(&definition(id, &["x", "y"]), at(0)).await.unwrap_or_else(|e| panic!("{e}"));
    }
    // An agent column, a later capability row, the first capability row.
    execute(&db, backend, "UPDATE agentmesh_agents SET transport = 'carrier-pigeon' WHERE id = 'b-agent'").await;
    execute(
        &db,
        backend,
        "UPDATE agentmesh_capabilities SET input_schema = '{not json' WHERE agent_id = 'c-agent' AND id = 'y'",
    )
    .await;
    execute(
        &db,
        backend,
        "UPDATE agentmesh_capabilities SET kind = 'wizard' WHERE agent_id = 'e-agent' AND id = 'plan'",
    )
    .await;
    if backend == Backend::Sqlite {
        // SQLite keeps whatever type it is given.
        execute(&db, backend, "UPDATE agentmesh_agents SET registered_at_ms = 'yesterday' WHERE id = 'f-agent'").await;
    }
    let corrupt: &[&str] = if backend == Backend::Sqlite {
        &["b-agent", "c-agent", "e-agent", "f-agent"]
    } else {
        &["b-agent", "c-agent", "e-agent"]
    };
    let readable: Vec<&str> = ids.iter().copied().filter(|id| !corrupt.contains(id)).collect();

    let listed = store.list().await.unwrap_or_else(|e| panic!("a corrupt row failed the whole load: {e}"));
    assert_eq!(listed.agents.iter().map(|a| a.id()).collect::<Vec<_>>(), readable);
    for agent in &listed.agents {
        assert_eq!(agent.definition, definition(agent.id(), &["x", "y"]), "readable agents load whole");
    }
    let skipped: Vec<&str> = listed.corrupt.iter().filter_map(|c| c.agent_id.as_deref()).collect();
    assert_eq!(skipped, corrupt, "each corrupt agent is named once");
    let reason = |id: &str| {
        listed.corrupt.iter().find(|c| c.agent_id.as_deref() == Some(id)).map(|c| c.reason.clone()).unwrap_or_default()
    };
    assert!(reason("b-agent").contains("unknown transport `carrier-pigeon`"), "{}", reason("b-agent"));
    assert!(reason("c-agent").starts_with("capability `y`: cap_input_schema"), "{}", reason("c-agent"));
    assert!(reason("e-agent").contains("capability `plan`: unknown capability kind `wizard`"), "{}", reason("e-agent"));
    if backend == Backend::Sqlite {
        assert!(reason("f-agent").contains("registered_at_ms"), "{}", reason("f-agent"));
    }

    let all: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
    let many = store.get_many(&all).await.unwrap_or_else(|e| panic!("a corrupt row failed get_many: {e}"));
    assert_eq!(many.agents.iter().map(|a| a.id()).collect::<Vec<_>>(), readable);
    assert_eq!(many.corrupt.len(), corrupt.len());
    let one = store.get("b-agent").await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(one.contains("agent `b-agent`: unknown transport"), "reading one corrupt agent says why: {one}");

    // Registering it again rewrites its rows.
    store.register(&definition("c-agent", &["x", "y"]), at(1)).await.unwrap_or_else(|e| panic!("{e}"));
    let listed = store.list().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(listed.agents.iter().any(|a| a.id() == "c-agent"));
}

/// The `hints` column of `agent_id`'s capabilities, in order, as stored.
async fn stored_hints(db: &TestDatabase, backend: Backend, agent_id: &str) -> Vec<Option<String>> {
    use sqlx::Connection;
    const SQL: &str = "SELECT hints FROM agentmesh_capabilities WHERE agent_id = $1 ORDER BY position";
    let read = match backend {
        Backend::Sqlite => match sqlx::SqliteConnection::connect(&db.url).await {
            Ok(mut conn) => sqlx::query_scalar(SQL).bind(agent_id).fetch_all(&mut conn).await,
            Err(e) => Err(e),
        },
        Backend::Postgres => match sqlx::PgConnection::connect(&db.url).await {
            Ok(mut conn) => sqlx::query_scalar(SQL).bind(agent_id).fetch_all(&mut conn).await,
            Err(e) => Err(e),
        },
    };
    read.unwrap_or_else(|e| panic!("{SQL}: {e}"))
}

/// An MCP agent and the hints of its capabilities come back as registered;
/// a capability without hints stores NULL and reads back without them.
async fn hints_and_the_mcp_transport_round_trip(backend: Backend) {
    let Some(db) = TestDatabase::new(backend).await else { return };
    let store = connect(&db.url).await.unwrap_or_else(|e| panic!("{e}"));
    let shop: AgentDefinition = serde_json::from_value(json!({
        "id": "shop", "base_url": "http://127.0.0.1:9002/mcp", "transport": "mcp",
        "skills": [
            {"id": "charge", "hints": {"idempotent": false, "destructive": true}},
            {"id": "search", "hints": {"read_only": true, "open_world": true}},
            {"id": "plain"},
        ],
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    store.register(&shop, at(0)).await.unwrap_or_else(|e| panic!("{e}"));
    let read = store.get("shop").await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("registered"));
    assert_eq!(read.definition, shop, "read by id");
    assert_eq!(read.definition.transport, agentmesh_core::Transport::Mcp);
    let listed = store.list().await.unwrap_or_else(|e| panic!("{e}")).agents;
    assert_eq!(listed.iter().map(|a| &a.definition).collect::<Vec<_>>(), [&shop], "read in bulk");
    let charge = read.definition.skills[0].hints.unwrap_or_default();
    assert_eq!((charge.idempotent, charge.destructive, charge.read_only), (Some(false), Some(true), None));
    assert_eq!(
        stored_hints(&db, backend, "shop").await,
        [
            Some(r#"{"destructive":true,"idempotent":false}"#.to_owned()),
            Some(r#"{"read_only":true,"open_world":true}"#.to_owned()),
            None
        ]
    );

    // Registering again without hints clears them.
    let mut plain = shop.clone();
    for skill in &mut plain.skills {
        skill.hints = None;
    }
    store.register(&plain, at(1)).await.unwrap_or_else(|e| panic!("{e}"));
    let read = store.get("shop").await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|| panic!("registered"));
    assert_eq!(read.definition, plain);
    assert_eq!(stored_hints(&db, backend, "shop").await, [None, None, None]);

    // Hints that do not decode make the agent unreadable, and say where.
    execute(&db, backend, "UPDATE agentmesh_capabilities SET hints = '{\"sometimes\": true}' WHERE id = 'plain'").await;
    let error = store.get("shop").await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("capability `plain`: hints"), "{error}");
}

agentmesh_testkit::both_backends!(
    corrupt_rows_are_skipped,
    databases_of_earlier_releases_are_migrated,
    hints_and_the_mcp_transport_round_trip
);
