//! Test harness shared by agentmesh's tests: a uniquely named database per
//! test on the real PostgreSQL server (or a fresh SQLite file), and
//! listeners on `127.0.0.1:0` to hand to servers.
//!
//! Policy (see DEVELOPERS.md): tests that need PostgreSQL create and drop
//! their own database. The server is `AGENTMESH_TEST_DATABASE_URL` when set,
//! else `postgres://postgres@127.0.0.1:5432/postgres`. Under `CI=true` a
//! server that does not answer fails the test; elsewhere the test reports
//! that it was skipped, loudly, and returns.

mod agent;
pub mod interop;
pub mod llama;
mod llm;
mod otlp;
mod pki;
mod process;
mod proxy;
mod service;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use agent::{Answer, Behavior, FakeAgent, ReceivedCall};
pub use llm::{RecordedRequest, ScriptedLlmServer, ScriptedReply, TEST_CA_PEM};
pub use otlp::{OtlpReceiver, ReceivedEvent, ReceivedSpan, kind as span_kind};
pub use pki::{IssuedCert, TestPki};
pub use process::ServiceProcess;
pub use proxy::TcpProxy;
pub use service::{RunningService, init_tracing, spawn_discovery};

/// Makes HTTPS usable in this process: HTTPS is built without a bundled
/// crypto provider, so a process must install one before it builds any
/// `reqwest::Client` ([`http_client`] does it).
pub use agentmesh_llm::install_tls_provider as install_tls;

/// An HTTP client for tests.
pub fn http_client() -> reqwest::Client {
    agentmesh_llm::client_builder().build().unwrap_or_else(|e| panic!("building an HTTP client: {e}"))
}

/// A `reqwest::ClientBuilder` for tests that need other settings.
pub use agentmesh_llm::client_builder as http_client_builder;

use anyhow::Context;
use sqlx::{Connection, PgConnection};

/// Default admin URL of the test PostgreSQL server.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A store backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh SQLite file.
    Sqlite,
    /// A fresh database on the PostgreSQL server.
    Postgres,
}

/// A database that exists for the life of one test and is dropped after it.
pub struct TestDatabase {
    /// URL to connect to it.
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    File(PathBuf),
    Postgres { admin_url: String, name: String },
}

fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}_{}_{}_{:08x}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed), rand::random::<u32>())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

impl TestDatabase {
    /// A fresh database of the given backend; `None` (after saying so on
    /// stderr) when PostgreSQL is not reachable outside CI.
    pub async fn new(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Sqlite => Some(Self::sqlite()),
            Backend::Postgres => Self::postgres().await,
        }
    }

    /// A fresh SQLite file in the temp directory.
    pub fn sqlite() -> Self {
        let path = std::env::temp_dir().join(format!("{}.db", unique_name("agentmesh_test")));
        Self { url: format!("sqlite://{}", path.display()), cleanup: Cleanup::File(path) }
    }

    /// A fresh, uniquely named PostgreSQL database. Panics under CI when the
    /// server does not answer; elsewhere reports the skip and returns `None`.
    pub async fn postgres() -> Option<Self> {
        let admin_url = std::env::var("AGENTMESH_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned());
        match Self::create_postgres(&admin_url).await {
            Ok(db) => Some(db),
            Err(e) if !in_ci() => {
                eprintln!(
                    "SKIPPED: PostgreSQL at {admin_url} is not usable ({e:#}); start it with \
                     `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
                     or set AGENTMESH_TEST_DATABASE_URL"
                );
                None
            }
            Err(e) => panic!("PostgreSQL at {admin_url} is required under CI=true: {e:#}"),
        }
    }

    async fn create_postgres(admin_url: &str) -> anyhow::Result<Self> {
        let name = unique_name("agentmesh_test");
        let mut conn = PgConnection::connect(admin_url).await.context("connecting")?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .context("creating database")?;
        conn.close().await.ok();
        Ok(Self {
            url: replace_database(admin_url, &name),
            cleanup: Cleanup::Postgres { admin_url: admin_url.to_owned(), name },
        })
    }
}

/// Replaces the database name in a PostgreSQL URL, keeping any query string.
pub fn replace_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::File(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Cleanup::Postgres { admin_url, name } => {
                let (admin_url, name) = (admin_url.clone(), name.clone());
                // Drop may run inside a runtime: use a thread with its own.
                let _ = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                        return;
                    };
                    rt.block_on(async {
                        if let Ok(mut conn) = PgConnection::connect(&admin_url).await {
                            let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                            if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await {
                                eprintln!("could not drop test database {name}: {e}");
                            }
                        }
                    });
                })
                .join();
            }
        }
    }
}

/// A listener on an ephemeral loopback port, to hand to a server.
pub async fn bind_local() -> std::io::Result<tokio::net::TcpListener> {
    agentmesh_server::net::listen(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// Declares one test per backend for an async case `fn(Backend)`, in
/// modules `sqlite` and `postgres`.
#[macro_export]
macro_rules! both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case($crate::Backend::Sqlite).await })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case($crate::Backend::Postgres).await })*
        }
    };
}

/// Writes an `auth_tokens_file` at `path` giving each `(principal, role,
/// token)` its entry (the token's SHA-256, never the token).
pub fn write_tokens_file(path: &Path, entries: &[(&str, &str, &str)]) -> std::io::Result<()> {
    let text: String = entries
        .iter()
        .map(|(principal, role, token)| {
            format!(
                "[[token]]\nprincipal = \"{principal}\"\nroles = [\"{role}\"]\nsha256 = \"{}\"\n\n",
                agentmesh_server::auth::token_hash(token)
            )
        })
        .collect();
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(replace_database("postgres://u@h:5432/postgres", "x"), "postgres://u@h:5432/x");
        assert_eq!(replace_database("postgres://u@h/db?sslmode=disable", "x"), "postgres://u@h/x?sslmode=disable");
        assert_eq!(replace_database("postgres://u@h:5432", "x"), "postgres://u@h:5432/x");
    }
}
