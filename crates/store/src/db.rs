//! One database, PostgreSQL or SQLite, for the stores whose SQL is the
//! same on both (the agent registry, the interaction log, the
//! orchestration log). Their queries use `$1`-style parameters, which
//! both backends read, and are written once: [`on_pool!`] compiles one
//! body for each backend's pool. What really differs (how a write is
//! announced, how SQLite serialises writers) asks [`Db::is_postgres`].

use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;

use crate::{StoreError, StoreResult};

/// An open database with its migrations applied.
pub(crate) enum Db {
    /// PostgreSQL, shared by any number of replicas.
    Postgres(PgPool),
    /// SQLite, one process's (or a few processes' on one machine).
    Sqlite(SqlitePool),
}

/// Runs `$body` with `$pool` bound to the database's pool: the same text,
/// compiled once for PostgreSQL's pool type and once for SQLite's.
macro_rules! on_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            $crate::db::Db::Postgres($pool) => $body,
            $crate::db::Db::Sqlite($pool) => $body,
        }
    };
}
pub(crate) use on_pool;

impl Db {
    /// Opens the database a URL names (`postgres://…`, `postgresql://…`,
    /// `sqlite://PATH`, `sqlite::memory:`) and runs its migrations.
    pub(crate) async fn open(url: &str) -> StoreResult<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres(crate::postgres::open(url).await?))
        } else if url.starts_with("sqlite:") {
            Ok(Self::Sqlite(crate::sqlite::open(url).await?))
        } else {
            Err(StoreError::unsupported(url))
        }
    }

    /// Short backend name for logs, traces and health (`postgres`, `sqlite`).
    pub(crate) fn backend(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "postgres",
            Self::Sqlite(_) => "sqlite",
        }
    }

    /// Whether this is PostgreSQL.
    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Self::Postgres(_))
    }

    /// The statement that starts a write transaction: SQLite takes the
    /// write lock up front (`IMMEDIATE`) so that two writers do not both
    /// read and then fail to upgrade.
    pub(crate) fn begin_write(&self) -> &'static str {
        if self.is_postgres() { "BEGIN" } else { "BEGIN IMMEDIATE" }
    }

    /// Checks that the database answers.
    pub(crate) async fn ping(&self) -> StoreResult<()> {
        on_pool!(self, pool => sqlx::query("SELECT 1").execute(pool).await?.rows_affected());
        Ok(())
    }
}
