//! The runtime every agentmesh service is built on. A service hands it its
//! gRPC services and HTTP routes and gets one port serving both:
//!
//! - [`net::listen`] binds with a deep accept queue;
//! - [`grpc::router`] adds `grpc.health.v1` and reflection listing only what
//!   the port serves; [`grpc::not_found`] answers every other path;
//! - [`probes`] holds readiness that follows real dependencies, `/healthz`,
//!   `/readyz` and `/metrics`;
//! - [`stack::stack`] wraps it all in the shared tower stack (request ids,
//!   traces, deadlines, a concurrency cap, a body limit);
//! - [`serve`] runs it until shutdown, draining in-flight requests.

pub mod grpc;
pub mod net;
pub mod probes;
pub mod stack;

use std::future::Future;

use anyhow::Context;
use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;

pub use agentmesh_telemetry::redact;
pub use probes::{Check, Dependency, HealthChecker, Readiness};
pub use stack::{Limits, RequestId, error_body, new_request_id, stack};

/// Reads a list setting given either as a list (`["a", "b"]`, TOML or
/// JSON) or as one comma-separated string (`a,b`), as environment variables
/// are most easily written: `AGENTMESH_PLANNER__SELF_AGENT_IDS=me,other`.
/// Use with `#[serde(deserialize_with = "agentmesh_server::list_or_commas")]`.
pub fn list_or_commas<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct ListOrCommas;

    impl<'de> serde::de::Visitor<'de> for ListOrCommas {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of strings or one comma-separated string")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
            Ok(text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
        }

        // An environment value such as `42` arrives as a number.
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
            Ok(vec![n.to_string()])
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
            Ok(vec![n.to_string()])
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<String>()? {
                items.push(item);
            }
            Ok(items)
        }
    }

    deserializer.deserialize_any(ListOrCommas)
}

/// Checks the settings behind [`Limits`] (before they are turned into one:
/// a timeout that is not a finite number cannot be a `Duration`).
pub fn check_limits(
    request_timeout_secs: f64,
    max_concurrent_requests: usize,
    max_request_bytes: usize,
) -> anyhow::Result<()> {
    check_min_secs("request_timeout_secs", request_timeout_secs, 0.001)?;
    anyhow::ensure!(max_concurrent_requests >= 1, "max_concurrent_requests must be at least 1");
    anyhow::ensure!(max_request_bytes >= 1024, "max_request_bytes must be at least 1024");
    Ok(())
}

/// Checks that the setting `name`, in seconds, is a number of at least `min`.
pub fn check_min_secs(name: &str, value: f64, min: f64) -> anyhow::Result<()> {
    anyhow::ensure!(value.is_finite() && value >= min, "{name} must be at least {min}, got {value}");
    Ok(())
}

/// Checks that the setting `name` is an `http://` or `https://` URL with a
/// host, so that a missing scheme fails at start-up with what to write
/// instead of as a transport error later.
pub fn check_service_url(name: &str, url: &str) -> anyhow::Result<()> {
    let Some((scheme, rest)) = url.split_once("://") else {
        anyhow::bail!("{name} `{url}` has no scheme: write http://{url} (or https://…)");
    };
    anyhow::ensure!(matches!(scheme, "http" | "https"), "{name} `{}` must start with http:// or https://", redact(url));
    anyhow::ensure!(!rest.trim_matches('/').is_empty(), "{name} `{url}` has no host");
    Ok(())
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets
/// in-flight requests finish.
pub async fn serve(
    name: &str,
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Small answers go out at once instead of waiting on Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await.with_context(|| format!("serving {name}"))
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://a.db"), "sqlite://a.db");
        assert_eq!(
            redact("postgres://u@h/db?sslmode=off&password=secret"),
            "postgres://u@h/db?sslmode=off&password=***"
        );
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db?SSLPassword=secret"), "postgres://u@h/db?SSLPassword=***");
        assert_eq!(
            redact("https://u:secret@llm.internal/v1?key=secret&model=m&access_token=secret"),
            "https://u:***@llm.internal/v1?key=***&model=m&access_token=***"
        );
    }
}
