//! Opening SQLite, the embedded default: the file (and its directory)
//! created when missing, WAL mode, a busy timeout, foreign keys, and
//! migrations run.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::StoreResult;

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
    // Services of one process (`agentmesh up`, `demo`) open one file one
    // at a time: a fresh file's switch to WAL and its migrations take
    // locks that SQLite may refuse at once ("database is locked") rather
    // than wait for. Another process opening it too is waited out.
    let _one_at_a_time = OPENING.lock().await;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match connect(options.clone(), memory).await {
            Err(e) if attempt < OPEN_ATTEMPTS && locked(&e) => {
                tracing::debug!(error = %e, attempt, "the database is locked; opening it again");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
            other => return other,
        }
    }
}

/// Attempts at opening a database another connection holds locked.
const OPEN_ATTEMPTS: u32 = 10;

/// Opens of SQLite files in this process, one at a time.
static OPENING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether an error is SQLite's `SQLITE_BUSY` ("database is locked").
fn locked(e: &crate::StoreError) -> bool {
    e.to_string().contains("database is locked")
}

async fn connect(options: SqliteConnectOptions, memory: bool) -> StoreResult<SqlitePool> {
    // An in-memory database exists per connection: keep exactly one.
    let pool = SqlitePoolOptions::new()
        .max_connections(if memory { 1 } else { 4 })
        .min_connections(if memory { 1 } else { 0 })
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await?;
    crate::migrate::run(&crate::migrate::SQLITE, &pool).await?;
    Ok(pool)
}
