//! Settings every service shares, defined once: [`ServiceSettings`] (where
//! it listens, its database, its limits, how often it checks its
//! dependencies), and the machinery that lets a service's configuration
//! embed such groups while staying one flat table in the file and the
//! environment (`[planner] listen = …` beside `[planner] max_plan_steps = …`).
//!
//! Serde's `flatten` and `deny_unknown_fields` do not mix, so a service's
//! configuration does not use them together: [`flat_settings!`] reads the
//! table once, refuses a key no group and no field of the service knows
//! (listing the ones it does), and hands each group the keys it reads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::Limits;

/// The default database of every service: an embedded SQLite file.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://.agentmesh/agentmesh.db";

/// Settings every service has. Each service chooses its own defaults
/// (its port, how long its requests may take).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceSettings {
    /// Address serving gRPC and HTTP (`/metrics`, `/healthz`, `/readyz`).
    pub listen: SocketAddr,
    /// `sqlite://PATH`, `sqlite::memory:` or `postgres://…`.
    pub database_url: String,
    /// Largest accepted request, in bytes (REST or gRPC).
    pub max_request_bytes: usize,
    /// Seconds a request may take to be answered (a shorter `grpc-timeout` wins).
    pub request_timeout_secs: f64,
    /// Requests handled at once; more wait for a slot.
    pub max_concurrent_requests: usize,
    /// Seconds between checks of the service's dependencies (its store, the
    /// services it calls) for readiness.
    pub health_check_interval_secs: f64,
    /// Connections open at once; one more is closed as soon as it is
    /// accepted (and logged), never left hanging.
    pub max_connections: usize,
    /// Seconds a connection may stay silent before it is closed; live
    /// HTTP/2 connections are pinged, so quiet streams stay open.
    pub idle_timeout_secs: f64,
    /// Concurrent calls one HTTP/2 connection may carry (a client that
    /// multiplexes everything over one connection is held to it).
    pub max_streams_per_connection: u32,
    /// Calls open at once, streams and SSE followers included for as long
    /// as they stay open; one more is refused at once (`RESOURCE_EXHAUSTED`,
    /// HTTP 503), never left waiting.
    pub max_open_calls: usize,
    /// PEM certificate chain the port serves TLS with (with
    /// `tls_key_file`); also presented to services that ask for a client
    /// certificate. Re-read when it changes.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates: when set, every client must present a
    /// certificate they signed (mTLS).
    pub tls_client_ca_file: Option<PathBuf>,
    /// PEM CA certificates trusted, besides the system's, for the services
    /// this one calls at `https://` addresses.
    pub tls_ca_file: Option<PathBuf>,
    /// The tokens callers authenticate with (TOML, hashed; see
    /// [`crate::auth`]): when set, every call but the probes needs one.
    pub auth_tokens_file: Option<PathBuf>,
    /// This service's own bearer token, sent on its calls to the other
    /// services (they list it with the role `service`).
    pub auth_token: Option<String>,
    /// Where an identity provider publishes the keys of the JWTs callers
    /// may present (with `auth_jwt_issuer` and `auth_jwt_audience`).
    pub auth_jwks_url: Option<String>,
    /// The `iss` a JWT must carry.
    pub auth_jwt_issuer: Option<String>,
    /// A value a JWT's `aud` must hold.
    pub auth_jwt_audience: Option<String>,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url: DEFAULT_DATABASE_URL.into(),
            max_request_bytes: 1024 * 1024,
            request_timeout_secs: 30.0,
            max_concurrent_requests: 1_000,
            health_check_interval_secs: 2.0,
            max_connections: 10_000,
            idle_timeout_secs: 120.0,
            max_streams_per_connection: 1_000,
            max_open_calls: 10_000,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            tls_ca_file: None,
            auth_tokens_file: None,
            auth_token: None,
            auth_jwks_url: None,
            auth_jwt_issuer: None,
            auth_jwt_audience: None,
        }
    }
}

impl std::fmt::Debug for ServiceSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug("ServiceSettings", self, f)
    }
}

impl ServiceSettings {
    /// The defaults, listening on `127.0.0.1:port`.
    pub fn on_port(port: u16) -> Self {
        Self { listen: SocketAddr::from(([127, 0, 0, 1], port)), ..Self::default() }
    }

    /// Checks the values once at start-up.
    pub fn validate(&self) -> anyhow::Result<()> {
        check_min_secs("request_timeout_secs", self.request_timeout_secs, 0.001)?;
        anyhow::ensure!(self.max_concurrent_requests >= 1, "max_concurrent_requests must be at least 1");
        anyhow::ensure!(self.max_request_bytes >= 1024, "max_request_bytes must be at least 1024");
        check_min_secs("health_check_interval_secs", self.health_check_interval_secs, 0.05)?;
        anyhow::ensure!(self.max_connections >= 1, "max_connections must be at least 1");
        check_min_secs("idle_timeout_secs", self.idle_timeout_secs, 1.0)?;
        anyhow::ensure!(self.max_streams_per_connection >= 1, "max_streams_per_connection must be at least 1");
        anyhow::ensure!(self.max_open_calls >= 1, "max_open_calls must be at least 1");
        anyhow::ensure!(
            self.tls_cert_file.is_some() == self.tls_key_file.is_some(),
            "tls_cert_file and tls_key_file go together: set both to serve TLS, or neither"
        );
        anyhow::ensure!(
            self.tls_client_ca_file.is_none() || self.tls_cert_file.is_some(),
            "tls_client_ca_file asks clients for certificates over TLS: set tls_cert_file and tls_key_file too"
        );
        if let Some(url) = &self.auth_jwks_url {
            check_service_url("auth_jwks_url", url)?;
            anyhow::ensure!(
                self.auth_jwt_issuer.is_some() && self.auth_jwt_audience.is_some(),
                "auth_jwks_url needs auth_jwt_issuer and auth_jwt_audience: a JWT is accepted only from its issuer, for this audience"
            );
        }
        anyhow::ensure!(
            self.database_url.starts_with("sqlite:") || self.database_url.starts_with("postgres"),
            "database_url must start with sqlite: or postgres://, got `{}`",
            crate::redact(&self.database_url)
        );
        Ok(())
    }

    /// The limits of the shared server stack.
    pub fn limits(&self) -> Limits {
        Limits {
            request_timeout: Duration::from_secs_f64(self.request_timeout_secs),
            max_concurrent_requests: self.max_concurrent_requests,
            max_request_bytes: self.max_request_bytes,
            max_open_calls: self.max_open_calls,
        }
    }

    /// The limits on the port's connections.
    pub fn connection_limits(&self) -> crate::ConnectionLimits {
        crate::ConnectionLimits {
            max_connections: self.max_connections,
            idle_timeout: Duration::from_secs_f64(self.idle_timeout_secs),
            max_streams_per_connection: self.max_streams_per_connection,
        }
    }

    /// The port's TLS, when `tls_cert_file` and `tls_key_file` are set:
    /// loaded now (a bad file fails start-up, naming the setting), re-read
    /// when the files change.
    pub fn server_tls(&self, name: &'static str) -> anyhow::Result<Option<crate::tls::ServerTls>> {
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else { return Ok(None) };
        let files =
            crate::tls::TlsFiles { cert: cert.clone(), key: key.clone(), client_ca: self.tls_client_ca_file.clone() };
        crate::tls::ServerTls::watch(files, name).map(Some)
    }

    /// How this service calls others: at `https://` addresses with
    /// `tls_ca_file` trusted and its own certificate presented when asked
    /// for; with `auth_token` as its bearer token.
    pub fn client_settings(&self) -> anyhow::Result<agentmesh_telemetry::rpc::ClientSettings> {
        let read = |setting: &str, path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("{setting}: cannot read {}", path.display()))
        };
        let ca_pem = self.tls_ca_file.as_ref().map(|p| read("tls_ca_file", p)).transpose()?;
        let identity = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some((read("tls_cert_file", cert)?, read("tls_key_file", key)?)),
            _ => None,
        };
        let bearer = self.auth_token.clone().filter(|t| !t.trim().is_empty());
        Ok(agentmesh_telemetry::rpc::ClientSettings { ca_pem, identity, bearer })
    }

    /// Who may call, when `auth_tokens_file` or `auth_jwks_url` is set:
    /// loaded now (a bad file or an unreachable key set fails start-up,
    /// saying what is wrong), kept fresh after.
    pub async fn authenticator(&self, name: &'static str) -> anyhow::Result<Option<crate::auth::Authenticator>> {
        let tokens =
            self.auth_tokens_file.clone().map(|path| crate::auth::Authenticator::watch(path, name)).transpose()?;
        let jwt = match (&self.auth_jwks_url, &self.auth_jwt_issuer, &self.auth_jwt_audience) {
            (Some(url), Some(issuer), Some(audience)) => Some(
                crate::jwt::JwtVerifier::start(
                    crate::jwt::JwtSettings {
                        jwks_url: url.clone(),
                        issuer: issuer.clone(),
                        audience: audience.clone(),
                    },
                    name,
                )
                .await?,
            ),
            _ => None,
        };
        Ok(match (tokens, jwt) {
            (None, None) => None,
            (tokens, jwt) => {
                let authenticator = tokens.unwrap_or_else(crate::auth::Authenticator::without_tokens);
                Some(match jwt {
                    Some(jwt) => authenticator.with_jwt(jwt),
                    None => authenticator,
                })
            }
        })
    }

    /// Says loudly, once, that a port any other host can reach takes every
    /// call from anyone: `auth_tokens_file` is not set.
    pub fn warn_if_open(&self, name: &str) {
        if self.auth_tokens_file.is_none() && self.auth_jwks_url.is_none() && !self.listen.ip().is_loopback() {
            tracing::warn!(
                service = name,
                listen = %self.listen,
                "AUTHENTICATION IS OFF on a port other hosts can reach: anyone who reaches {} may make every call \
                 (register or re-point agents, read or cancel executions). Set auth_tokens_file \
                 (docs/security.md#identities)",
                self.listen
            );
        }
    }

    /// How often dependencies are checked.
    pub fn health_check_interval(&self) -> Duration {
        Duration::from_secs_f64(self.health_check_interval_secs)
    }
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
    anyhow::ensure!(
        matches!(scheme, "http" | "https"),
        "{name} `{}` must start with http:// or https://",
        crate::redact(url)
    );
    anyhow::ensure!(!rest.trim_matches('/').is_empty(), "{name} `{url}` has no host");
    Ok(())
}

/// Reads a list setting given either as a list (`["a", "b"]`, TOML or
/// JSON) or as one comma-separated string (`a,b`), as environment variables
/// are most easily written: `AGENTMESH_PLANNER__SELF_AGENT_IDS=me,other`.
/// Use with `#[serde(deserialize_with = "agentmesh_server::settings::list_or_commas")]`.
pub fn list_or_commas<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
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

/// A service's settings table as read: every key the service knows, with
/// its default where the input gave none.
pub struct FlatTable(Value);

impl FlatTable {
    /// Reads a table and lays it over `defaults` (the service's whole
    /// configuration, groups included). A key that `defaults` lacks is
    /// refused, naming the keys there are.
    pub fn read<'de, D: Deserializer<'de>>(deserializer: D, defaults: &impl Serialize) -> Result<Self, D::Error> {
        let given = Map::<String, Value>::deserialize(deserializer)?;
        let mut table = match serde_json::to_value(defaults) {
            Ok(Value::Object(table)) => table,
            Ok(_) => return Err(D::Error::custom("settings must serialize as a table")),
            Err(e) => return Err(D::Error::custom(e)),
        };
        for (key, value) in given {
            let Some(slot) = table.get_mut(&key) else {
                let known: Vec<&str> = table.keys().map(String::as_str).collect();
                let meant = closest(&key, &known).map(|k| format!("did you mean `{k}`? ")).unwrap_or_default();
                return Err(D::Error::custom(format!(
                    "unknown setting `{key}`; {meant}the settings are {}",
                    known.join(", ")
                )));
            };
            *slot = value;
        }
        Ok(Self(Value::Object(table)))
    }

    /// Reads one group of settings (or the service's own fields) from the
    /// table, naming the key at fault when a value does not fit.
    pub fn group<T: DeserializeOwned, E: serde::de::Error>(&self) -> Result<T, E> {
        serde_path_to_error::deserialize(&self.0).map_err(|e| {
            let key = e.path().to_string();
            E::custom(format!("`{key}`: {}", e.into_inner()))
        })
    }
}

/// Gives a service's configuration its `Serialize`, `Deserialize` and a
/// `Debug` that hides secrets, with setting groups (such as
/// [`ServiceSettings`]) flattened into its own table.
///
/// The configuration derives both traits as `remote = "Self"`, marks each
/// group `flatten, skip_deserializing` (the first one the
/// [`ServiceSettings`] named `service`), and implements `Default` (the
/// service's defaults, groups included). It also gains
/// `with_database_url(url)`, the defaults with another database:
///
/// ```ignore
/// #[derive(Clone, PartialEq, Serialize, Deserialize)]
/// #[serde(remote = "Self", default)]
/// pub struct PlannerConfig {
///     #[serde(flatten, skip_deserializing)]
///     pub service: ServiceSettings,
///     pub max_plan_steps: usize,
/// }
/// agentmesh_server::flat_settings!(PlannerConfig { service });
/// ```
#[macro_export]
macro_rules! flat_settings {
    ($config:ident { service $(, $group:ident)* $(,)? }) => {
        impl ::serde::Serialize for $config {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> ::std::result::Result<S::Ok, S::Error> {
                $config::serialize(self, serializer)
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $config {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> ::std::result::Result<Self, D::Error> {
                let defaults = <$config as ::std::default::Default>::default();
                let table = $crate::settings::FlatTable::read(deserializer, &defaults)?;
                let own: $config = table.group::<$crate::settings::Own<$config>, D::Error>()?.0;
                Ok($config { service: table.group::<_, D::Error>()?, $($group: table.group::<_, D::Error>()?,)* ..own })
            }
        }

        impl $crate::settings::RemoteDeserialize for $config {
            fn deserialize_own<'de, D: ::serde::Deserializer<'de>>(deserializer: D) -> ::std::result::Result<Self, D::Error> {
                $config::deserialize(deserializer)
            }
        }

        impl ::std::fmt::Debug for $config {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                $crate::settings::debug(stringify!($config), self, f)
            }
        }

        impl $config {
            /// The defaults, keeping data in the database at `url`.
            pub fn with_database_url(url: impl Into<String>) -> Self {
                let mut config = <Self as ::std::default::Default>::default();
                config.service.database_url = url.into();
                config
            }
        }
    };
}

/// `Debug` for settings, secrets hidden (see [`agentmesh_telemetry::secrets`]).
pub fn debug(name: &str, settings: &impl Serialize, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    agentmesh_telemetry::secrets::debug_settings(name, settings, f)
}

/// The fields a configuration's derive reads itself (not its groups).
#[doc(hidden)]
pub trait RemoteDeserialize: Sized {
    /// The derived (`remote = "Self"`) deserializer.
    fn deserialize_own<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}

/// A configuration read by its derived deserializer only.
#[doc(hidden)]
pub struct Own<T>(pub T);

impl<'de, T: RemoteDeserialize> Deserialize<'de> for Own<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize_own(deserializer).map(Own)
    }
}

/// The candidate `name` was most likely meant to be: the nearest by edit
/// distance (letters added, dropped or changed, case ignored), when it is
/// near enough to be a slip rather than another word.
pub fn closest<'c>(name: &str, candidates: &[&'c str]) -> Option<&'c str> {
    fn distance(a: &str, b: &str) -> usize {
        let (a, b): (Vec<char>, Vec<char>) = (a.to_lowercase().chars().collect(), b.to_lowercase().chars().collect());
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.iter().enumerate() {
            let mut diagonal = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let substitution = diagonal + usize::from(ca != cb);
                diagonal = row[j + 1];
                row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
            }
        }
        row[b.len()]
    }
    let limit = (name.chars().count() / 3).max(2);
    candidates
        .iter()
        .map(|c| (distance(name, c), *c))
        .filter(|(d, c)| *d <= limit || (c.len() > 3 && name.contains(*c)))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, Serialize, Deserialize)]
    #[serde(remote = "Self", default)]
    struct Example {
        #[serde(flatten, skip_deserializing)]
        service: ServiceSettings,
        discovery_url: String,
        #[serde(deserialize_with = "list_or_commas")]
        ids: Vec<String>,
    }

    impl Default for Example {
        fn default() -> Self {
            Self {
                service: ServiceSettings { request_timeout_secs: 600.0, ..ServiceSettings::on_port(7401) },
                discovery_url: "http://127.0.0.1:7400".into(),
                ids: Vec::new(),
            }
        }
    }

    crate::flat_settings!(Example { service });

    #[test]
    fn one_flat_table_fills_the_groups_and_keeps_the_service_defaults() {
        let example: Example =
            toml::from_str("database_url = \"postgres://u:hunter2@db/a\"\nids = \"a, b\"\nmax_request_bytes = 4096\n")
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(example.service.database_url, "postgres://u:hunter2@db/a");
        assert_eq!(example.service.max_request_bytes, 4096);
        assert_eq!(example.service.listen.port(), 7401, "the service's own default port");
        assert_eq!(example.service.request_timeout_secs, 600.0);
        assert_eq!(example.ids, ["a", "b"]);
        assert_eq!(example.discovery_url, "http://127.0.0.1:7400");
        assert_eq!(Example::with_database_url("sqlite::memory:").service.database_url, "sqlite::memory:");
        let written = toml::to_string(&example).unwrap_or_default();
        assert!(written.contains("listen = \"127.0.0.1:7401\"") && written.contains("discovery_url"), "{written}");
        let shown = format!("{example:?}");
        assert!(shown.starts_with("Example { listen: \"127.0.0.1:7401\""), "{shown}");
        assert!(!shown.contains("hunter2") && shown.contains("postgres://u:***@db/a"), "{shown}");
    }

    #[test]
    fn the_closest_key_is_suggested_only_when_near() {
        let keys = ["listen", "database_url", "max_request_bytes"];
        assert_eq!(closest("listen_addr", &keys), Some("listen"));
        assert_eq!(closest("databse_url", &keys), Some("database_url"));
        assert_eq!(closest("DATABASE_URL", &keys), Some("database_url"));
        assert_eq!(closest("colour", &keys), None);
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_refused_by_name() {
        let unknown = toml::from_str::<Example>("databse_url = \"sqlite::memory:\"\n").err().map(|e| e.to_string());
        let unknown = unknown.unwrap_or_default();
        assert!(unknown.contains("unknown setting `databse_url`; did you mean `database_url`?"), "{unknown}");
        assert!(unknown.contains("database_url") && unknown.contains("discovery_url"), "the known keys: {unknown}");
        let wrong = toml::from_str::<Example>("max_request_bytes = \"many\"\n").err().map(|e| e.to_string());
        let wrong = wrong.unwrap_or_default();
        assert!(wrong.contains("`max_request_bytes`") && wrong.contains("invalid type"), "{wrong}");
        let wrong_own = toml::from_str::<Example>("discovery_url = 7\n").err().map(|e| e.to_string());
        assert!(wrong_own.unwrap_or_default().contains("`discovery_url`"));
    }

    #[test]
    fn service_urls_need_a_scheme_and_a_host() {
        assert!(check_service_url("u", "http://a:1").is_ok());
        let missing = check_service_url("discovery_url", "127.0.0.1:7400").err().map(|e| e.to_string());
        assert!(missing.unwrap_or_default().contains("write http://127.0.0.1:7400"));
        assert!(check_service_url("u", "ftp://a").is_err());
        assert!(check_service_url("u", "http://").is_err());
    }

    #[test]
    fn limits_are_checked() {
        let settings = ServiceSettings { request_timeout_secs: f64::NAN, ..ServiceSettings::default() };
        assert!(settings.validate().is_err());
        let settings = ServiceSettings { database_url: "mysql://x".into(), ..ServiceSettings::default() };
        assert!(settings.validate().is_err_and(|e| e.to_string().contains("sqlite: or postgres://")));
        assert!(ServiceSettings::default().validate().is_ok());
    }
}
