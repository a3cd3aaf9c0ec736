//! Connecting to PostgreSQL: a pool, with the first connection made
//! directly so that a failure says why and what to do, migrations run, and
//! listeners for the notifications every replica sends.

use std::str::FromStr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::{StoreError, StoreResult};

/// How long opening the first connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool of connections to the database a `postgres://` URL names.
///
/// One connection is made directly first: a pool retries a refused
/// connection until its timeout and then reports only that it timed out,
/// where the user needs "connection refused" or "database does not exist".
async fn pool(url: &str) -> StoreResult<PgPool> {
    let mut options = PgConnectOptions::from_str(url)?;
    // An IPv6 literal is written in brackets in a URL (`[::1]`), but
    // resolved without them.
    if let Some(bare) = options.get_host().strip_prefix('[').and_then(|h| h.strip_suffix(']')).map(str::to_owned) {
        options = options.host(&bare);
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
        Ok(Ok(mut connection)) => {
            report_encryption(&options, &mut connection).await;
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

/// Says whether the connection is encrypted, never silently plaintext:
/// `sslmode=prefer` (the default) falls back to plaintext when the server
/// offers no TLS. A plaintext connection to another host is a warning.
async fn report_encryption(options: &PgConnectOptions, connection: &mut PgConnection) {
    let (host, port) = (options.get_host(), options.get_port());
    let mode = format!("{:?}", options.get_ssl_mode()).to_ascii_lowercase();
    let encrypted: Option<bool> = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_optional(&mut *connection)
        .await
        .ok()
        .flatten();
    let local = host.starts_with('/')
        || host == "localhost"
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    match encrypted {
        Some(true) => tracing::info!(host, port, sslmode = %mode, "PostgreSQL connection encrypted (TLS)"),
        _ if local => tracing::info!(host, port, sslmode = %mode, "PostgreSQL connection not encrypted (loopback)"),
        _ => tracing::warn!(
            host,
            port,
            sslmode = %mode,
            "PostgreSQL connection not encrypted: the server offered no TLS, or sslmode allows plaintext; \
             set sslmode=verify-full and sslrootcert=CA.pem in the database URL to require TLS and verify the server"
        ),
    }
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
        other => {
            let described = crate::describe(other);
            if matches!(other, sqlx::Error::Tls(_)) || described.contains("certificate") {
                format!(
                    "TLS to PostgreSQL at {host}:{port} failed: {described}; check sslrootcert (the CA that signed \
                     the server's certificate), that the certificate names {host}, and that the server has TLS on"
                )
            } else {
                format!("cannot connect to PostgreSQL at {host}:{port}: {described}")
            }
        }
    }
}

/// A pool of connections to the database a `postgres://` URL names, with
/// migrations run.
pub(crate) async fn open(url: &str) -> StoreResult<PgPool> {
    let pool = pool(url).await?;
    crate::migrate::run(&crate::migrate::POSTGRES, &pool).await?;
    Ok(pool)
}

/// Listens on `channel` and forwards every notification on it to `to`,
/// decoded, until the task is aborted. When notifications may have been
/// missed (the listener lost its connection or failed), `resync` is sent
/// instead, so that readers re-read what they hold.
pub(crate) async fn forward<T>(
    pool: &PgPool,
    channel: &'static str,
    to: broadcast::Sender<T>,
    resync: T,
) -> StoreResult<JoinHandle<()>>
where
    T: DeserializeOwned + Clone + Send + 'static,
{
    let mut listener = PgListener::connect_with(pool).await?;
    // Listening before returning: no notification sent after start-up is missed.
    listener.listen(channel).await?;
    Ok(tokio::spawn(async move {
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => match serde_json::from_str::<T>(notification.payload()) {
                    Ok(message) => {
                        let _ = to.send(message);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, channel, payload = notification.payload(), "ignoring a malformed notification");
                    }
                },
                Ok(None) => {
                    tracing::warn!(channel, "listener reconnected; notifications may have been missed, re-reading");
                    let _ = to.send(resync.clone());
                }
                Err(e) => {
                    tracing::warn!(error = %e, channel, "listener failed; retrying in 1s");
                    let _ = to.send(resync.clone());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }))
}
