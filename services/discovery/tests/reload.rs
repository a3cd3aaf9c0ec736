//! The TTL reload, on both backends: a reload that finds the catalog as it
//! was keeps the snapshot and its shared answers; one that finds a change
//! made outside discovery shows it.

mod common;

use std::time::{Duration, Instant};

use agentmesh_testkit::Backend;
use common::Ctx;
use sqlx::Connection;

const TTL_SECS: f64 = 0.3;

/// Waits until a background reload has completed: the miss counter moved.
async fn reloaded(ctx: &Ctx, misses_before: f64) {
    let started = Instant::now();
    loop {
        // A query after the TTL starts the reload; the expired snapshot is
        // served meanwhile.
        let _ = ctx.discover("reasoner=deep_research").await;
        if ctx.metric("agentmesh_discovery_cache_misses_total").await > misses_before {
            // The miss is counted when the reload starts: give it time to publish.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no reload after the TTL");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn reload_keeps_an_unchanged_catalog_and_shows_an_outside_change(backend: Backend) {
    let Some(ctx) = Ctx::start_with(backend, |c| c.cache_ttl_secs = TTL_SECS).await else { return };
    ctx.register_catalog().await;
    let query = "reasoner=deep_research";
    let first = ctx.discover(query).await;
    assert_eq!(
        first["capabilities"][0]["reasoners"][0]["description"],
        "Performs comprehensive research using multiple sources"
    );

    // Nothing changed: the reloaded catalog is the one held, so the answer
    // encoded before the reload is still shared after it.
    tokio::time::sleep(Duration::from_secs_f64(TTL_SECS + 0.1)).await;
    let misses = ctx.metric("agentmesh_discovery_cache_misses_total").await;
    reloaded(&ctx, misses).await;
    let hits = ctx.metric("agentmesh_discovery_encoded_response_hits_total").await;
    let again = ctx.discover(query).await;
    assert_eq!(again["capabilities"], first["capabilities"]);
    assert_eq!(
        ctx.metric("agentmesh_discovery_encoded_response_hits_total").await,
        hits + 1.0,
        "the answer encoded before an unchanged reload is shared after it"
    );

    // A change made in the database behind discovery's back (no
    // notification, no new version) shows after the next reload.
    let edit = "UPDATE agentmesh_capabilities SET description = 'Edited by hand' WHERE id = 'deep_research'";
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
    let started = Instant::now();
    loop {
        let body = ctx.discover(query).await;
        if body["capabilities"][0]["reasoners"][0]["description"] == "Edited by hand" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the outside change never showed: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reload_keeps_an_unchanged_catalog_and_shows_an_outside_change() {
    reload_keeps_an_unchanged_catalog_and_shows_an_outside_change(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reload_keeps_an_unchanged_catalog_and_shows_an_outside_change() {
    reload_keeps_an_unchanged_catalog_and_shows_an_outside_change(Backend::Postgres).await;
}
