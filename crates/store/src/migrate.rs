//! Migrations: one directory of numbered SQL scripts per backend
//! (`migrations/postgres`, `migrations/sqlite`), embedded in the binary and
//! applied by sqlx's migrator, which records each in `_sqlx_migrations`
//! with its checksum (a script changed after it was applied is refused)
//! and refuses a database left half-migrated.
//!
//! The list is built here rather than by `sqlx::migrate!`: the macro
//! would compile both database drivers a second time, for the compiler,
//! in every build. `tests::every_script_is_listed` keeps the list and the
//! directories the same.

use std::borrow::Cow;
use std::sync::LazyLock;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr};

use crate::{StoreError, StoreResult};

/// One backend's migrator: the scripts of its directory, in order. Both
/// directories hold the same numbered scripts, each in its database's SQL.
macro_rules! migrator {
    ($dir:literal) => {
        Migrator::with_migrations(migrator!(@scripts $dir:
            1 "0001_agents",
            2 "0002_llm_interactions",
            3 "0003_executions",
            4 "0004_orchestration_events",
            5 "0005_sqlx_migrations",
            6 "0006_principals",
            7 "0007_capability_hints",
        ))
    };
    (@scripts $dir:literal: $($version:literal $name:literal,)+) => {
        vec![$(
            Migration::new(
                $version,
                Cow::Borrowed($name),
                MigrationType::Simple,
                AssertSqlSafe(include_str!(concat!("../migrations/", $dir, "/", $name, ".sql"))).into_sql_str(),
                false,
            ),
        )+]
    };
}

/// PostgreSQL's migrations.
pub(crate) static POSTGRES: LazyLock<Migrator> = LazyLock::new(|| migrator!("postgres"));

/// SQLite's migrations.
pub(crate) static SQLITE: LazyLock<Migrator> = LazyLock::new(|| migrator!("sqlite"));

/// Stores opening one database at once in this process (`agentmesh up`
/// opens one SQLite file for every service) migrate it one at a time.
static MIGRATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Brings the database behind `pool` up to date. PostgreSQL's migrator
/// locks out other replicas itself; SQLite has no such lock, so a run that
/// lost a race with another process (which applied the same script first)
/// is run again, and then finds it applied.
pub(crate) async fn run<'a, A>(migrator: &Migrator, pool: A) -> StoreResult<()>
where
    A: sqlx::Acquire<'a> + Copy,
    <A::Connection as std::ops::Deref>::Target: sqlx::migrate::Migrate,
{
    let _one_at_a_time = MIGRATING.lock().await;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match migrator.run(pool).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 3 && !refused(&e) => {
                tracing::warn!(error = %e, attempt, "migrating the database failed; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(100 * attempt)).await;
            }
            Err(e) => return Err(StoreError::Migrate(e.to_string())),
        }
    }
}

/// A database the migrator refuses, where trying again cannot help.
fn refused(e: &sqlx::migrate::MigrateError) -> bool {
    use sqlx::migrate::MigrateError;
    matches!(e, MigrateError::VersionMismatch(_) | MigrateError::VersionMissing(_) | MigrateError::Dirty(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_listed() {
        for (dir, migrator) in [("postgres", &*POSTGRES), ("sqlite", &*SQLITE)] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(dir);
            let on_disk = sqlx::migrate::resolve_blocking(&path).unwrap_or_else(|e| panic!("{dir}: {e}"));
            let on_disk: Vec<(i64, Vec<u8>)> = on_disk.iter().map(|(m, _)| (m.version, m.checksum.to_vec())).collect();
            let listed: Vec<(i64, Vec<u8>)> = migrator.iter().map(|m| (m.version, m.checksum.to_vec())).collect();
            assert_eq!(
                listed,
                on_disk,
                "the {dir} scripts listed in migrate.rs are not the ones in {}",
                path.display()
            );
        }
    }
}
