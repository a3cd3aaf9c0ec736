//! A stored agent that cannot be read, on both backends: it is left out of
//! the catalog and counted, and the rest of the catalog is served.

mod common;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{Backend, spawn_discovery};
use common::{Ctx, agent_ids};
use sqlx::Connection;

async fn a_corrupt_agent_is_skipped_and_counted(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    ctx.register_catalog().await;
    // Written behind discovery's back, as a hand edit or a faulty tool would.
    let edit = "UPDATE agentmesh_agents SET tags = 'not json' WHERE id = 'agent-ml-002'";
    match backend {
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&ctx.db.url).await.unwrap_or_else(|e| panic!("{e}"));
            sqlx::query(edit).execute(&mut conn).await.unwrap_or_else(|e| panic!("{e}"));
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&ctx.db.url).await.unwrap_or_else(|e| panic!("{e}"));
            sqlx::query(edit).execute(&mut conn).await.unwrap_or_else(|e| panic!("{e}"));
        }
    }

    // A replica starting now loads the whole catalog from the database.
    let config = DiscoveryConfig::with_database_url(ctx.db.url.clone());
    let fresh = spawn_discovery(config).await.unwrap_or_else(|e| panic!("discovery did not start: {e:#}"));
    let get = async |path: &str| {
        let response =
            ctx.http.get(format!("{}{path}", fresh.url())).send().await.unwrap_or_else(|e| panic!("GET {path}: {e}"));
        (response.status(), response.text().await.unwrap_or_default())
    };
    let (status, body) = get("/api/v1/discovery/capabilities").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(agent_ids(&body), ["agent-data-003", "agent-research-001"], "the readable agents are served");

    let (_, metrics) = get("/metrics").await;
    let corrupt = metrics
        .lines()
        .find_map(|l| l.strip_prefix("agentmesh_discovery_corrupt_rows_total "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(corrupt, Some(1.0), "the skipped agent is counted: {metrics}");
}

agentmesh_testkit::both_backends!(a_corrupt_agent_is_skipped_and_counted);
