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
    // Written behind discovery's back, as a hand edit or a faulty tool
    // would; the second, a schema nested deeper than any consumer decodes,
    // as a release before the depth limit would have stored it.
    let deep = format!("{}{}", "{\"properties\":".repeat(40), "{}".to_owned() + &"}".repeat(40));
    let edits = [
        "UPDATE agentmesh_agents SET tags = 'not json' WHERE id = 'agent-ml-002'".to_owned(),
        format!("UPDATE agentmesh_capabilities SET input_schema = '{deep}' WHERE agent_id = 'agent-data-003'"),
    ];
    for edit in &edits {
        match backend {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&ctx.db.url).await.unwrap_or_else(|e| panic!("{e}"));
                sqlx::query(sqlx::AssertSqlSafe(edit.clone()))
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&ctx.db.url).await.unwrap_or_else(|e| panic!("{e}"));
                sqlx::query(sqlx::AssertSqlSafe(edit.clone()))
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
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
    assert_eq!(agent_ids(&body), ["agent-research-001"], "the readable agents are served");

    // Consumers decode what they are sent: the gRPC listing the planner reads works.
    let mut grpc = agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient::connect(fresh.url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let listed = grpc
        .list_capabilities(agentmesh_proto::v1::ListCapabilitiesRequest {
            include_input_schema: true,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("ListCapabilities: {e}"))
        .into_inner();
    let agents: Vec<&str> = listed.capabilities.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(agents, ["agent-research-001"]);

    let (_, metrics) = get("/metrics").await;
    let corrupt = metrics
        .lines()
        .find_map(|l| l.strip_prefix("agentmesh_discovery_corrupt_rows_total "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(corrupt, Some(2.0), "the skipped agents are counted: {metrics}");
}

agentmesh_testkit::both_backends!(a_corrupt_agent_is_skipped_and_counted);
