//! What telemetry a process emits: the log format and filter, and whether
//! and where traces are exported. Values set here (TOML `[telemetry]`,
//! `AGENTMESH_TELEMETRY__*`, flags) win over the standard `OTEL_*`
//! variables, which are read when a value is not set.

use anyhow::{Context, bail};
use opentelemetry_sdk::trace::Sampler;
use serde::{Deserialize, Serialize};

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Telemetry settings shared by every service and the CLI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Log line format.
    pub log_format: LogFormat,
    /// Which log lines are written, in `RUST_LOG` syntax (`RUST_LOG` wins);
    /// unset: `info,sqlx=warn,h2=warn,hyper=warn,tower=warn`.
    pub log_filter: Option<String>,
    /// OTLP collector receiving traces, e.g. `http://127.0.0.1:4317` (gRPC)
    /// or `http://127.0.0.1:4318` (HTTP). Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
    /// then `OTEL_EXPORTER_OTLP_ENDPOINT`; none of them: traces are not exported.
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf`. Unset: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`,
    /// then `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc` for an endpoint on port
    /// 4317 and `http/protobuf` otherwise.
    pub otlp_protocol: Option<String>,
    /// Sampler, as `OTEL_TRACES_SAMPLER` names it: `always_on`, `always_off`,
    /// `traceidratio`, `parentbased_always_on` (the default),
    /// `parentbased_always_off`, `parentbased_traceidratio`.
    pub sampler: Option<String>,
    /// The ratio of the `*traceidratio` samplers, 0 to 1 (`OTEL_TRACES_SAMPLER_ARG`).
    pub sampler_arg: Option<f64>,
    /// Extra resource attributes, `key=value,key=value`, added to
    /// `OTEL_RESOURCE_ATTRIBUTES`.
    pub resource_attributes: Option<String>,
    /// Record LLM prompts and completions on the LLM call spans (they may hold
    /// personal data; off by default).
    pub capture_llm_content: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Text,
            log_filter: None,
            otlp_endpoint: None,
            otlp_protocol: None,
            sampler: None,
            sampler_arg: None,
            resource_attributes: None,
            capture_llm_content: false,
        }
    }
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318 by convention).
    HttpProtobuf,
}

impl Protocol {
    /// The name `OTEL_EXPORTER_OTLP_PROTOCOL` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }

    fn parse(value: &str, origin: &str) -> anyhow::Result<Self> {
        match value.trim() {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" | "http" => Ok(Self::HttpProtobuf),
            "http/json" => bail!("{origin}: `http/json` is not supported; use `grpc` or `http/protobuf`"),
            other => bail!("{origin}: unknown OTLP protocol `{other}`; use `grpc` or `http/protobuf`"),
        }
    }
}

/// Where traces go, once every source has been read.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The endpoint as configured, for logs.
    pub endpoint: String,
    /// `Some` when set here (then used as given, `/v1/traces` added for HTTP
    /// when it has no path); `None` when the exporter reads the `OTEL_*`
    /// variables itself, with their per-signal rules.
    pub configured_endpoint: Option<String>,
    /// Transport.
    pub protocol: Protocol,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

impl TelemetryConfig {
    /// Where to export traces; `None` when no endpoint is configured anywhere
    /// or `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none`.
    pub fn export(&self) -> anyhow::Result<Option<Export>> {
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(exporter) = env("OTEL_TRACES_EXPORTER") {
            match exporter.as_str() {
                "none" => return Ok(None),
                "otlp" => {}
                other => bail!("OTEL_TRACES_EXPORTER: only `otlp` and `none` are supported, got `{other}`"),
            }
        }
        let configured = self.otlp_endpoint.clone().map(|e| e.trim().to_owned()).filter(|e| !e.is_empty());
        let from_env = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let Some(endpoint) = configured.clone().or(from_env) else { return Ok(None) };
        anyhow::ensure!(
            endpoint.starts_with("http://") || endpoint.starts_with("https://"),
            "OTLP endpoint `{endpoint}` must start with http:// or https://"
        );
        let protocol = match (&self.otlp_protocol, env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")) {
            (Some(p), _) => Protocol::parse(p, "otlp_protocol")?,
            (None, Some(p)) => Protocol::parse(&p, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")?,
            (None, None) => match env("OTEL_EXPORTER_OTLP_PROTOCOL") {
                Some(p) => Protocol::parse(&p, "OTEL_EXPORTER_OTLP_PROTOCOL")?,
                None if port_of(&endpoint) == Some(4317) => Protocol::Grpc,
                None => Protocol::HttpProtobuf,
            },
        };
        Ok(Some(Export { endpoint, configured_endpoint: configured, protocol }))
    }

    /// The sampler: the configured one, else `OTEL_TRACES_SAMPLER`, else
    /// parent-based always-on. An unknown name or a ratio outside 0..=1 is
    /// an error, not a silent fallback.
    pub fn sampler(&self) -> anyhow::Result<Sampler> {
        let name = self.sampler.clone().or_else(|| env("OTEL_TRACES_SAMPLER"));
        let arg = match self.sampler_arg {
            Some(arg) => Some(arg),
            None => env("OTEL_TRACES_SAMPLER_ARG")
                .map(|v| v.parse::<f64>().with_context(|| format!("OTEL_TRACES_SAMPLER_ARG `{v}` is not a number")))
                .transpose()?,
        };
        let ratio = || -> anyhow::Result<f64> {
            let ratio = arg.unwrap_or(1.0);
            anyhow::ensure!((0.0..=1.0).contains(&ratio), "the sampler ratio must be between 0 and 1, got {ratio}");
            Ok(ratio)
        };
        Ok(match name.as_deref().unwrap_or("parentbased_always_on") {
            "always_on" => Sampler::AlwaysOn,
            "always_off" => Sampler::AlwaysOff,
            "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
            "parentbased_always_on" => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            "parentbased_traceidratio" => Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio()?))),
            other => bail!(
                "unknown sampler `{other}`; use always_on, always_off, traceidratio, parentbased_always_on, \
                 parentbased_always_off or parentbased_traceidratio"
            ),
        })
    }

    /// `resource_attributes` as pairs; an entry without `=` is an error.
    pub fn extra_resource_attributes(&self) -> anyhow::Result<Vec<(String, String)>> {
        let Some(text) = &self.resource_attributes else { return Ok(Vec::new()) };
        text.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|entry| {
                let (key, value) = entry
                    .split_once('=')
                    .with_context(|| format!("resource attribute `{entry}` must have the form key=value"))?;
                Ok((key.trim().to_owned(), value.trim().to_owned()))
            })
            .collect()
    }
}

/// The port of an `http(s)://host:port/…` URL, when it names one.
fn port_of(url: &str) -> Option<u16> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let (_, port) = authority.rsplit_once(':')?;
    port.parse().ok()
}

/// An HTTP endpoint as given, with the traces path added when it has none
/// (the exporter uses a programmatic endpoint verbatim).
pub(crate) fn http_traces_url(endpoint: &str) -> String {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    if rest.contains('/') && !rest.ends_with('/') {
        endpoint.to_owned()
    } else {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conventional_port_picks_the_protocol() {
        assert_eq!(port_of("http://collector:4317"), Some(4317));
        assert_eq!(port_of("http://collector:4318/v1/traces"), Some(4318));
        assert_eq!(port_of("http://collector"), None);
    }

    #[test]
    fn http_endpoints_get_the_traces_path_only_when_they_have_none() {
        assert_eq!(http_traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(http_traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(http_traces_url("http://c:4318/custom/traces"), "http://c:4318/custom/traces");
    }

    #[test]
    fn bad_samplers_and_protocols_are_errors() {
        let config = TelemetryConfig { sampler: Some("sometimes".into()), ..Default::default() };
        assert!(config.sampler().is_err());
        let config =
            TelemetryConfig { sampler: Some("traceidratio".into()), sampler_arg: Some(1.5), ..Default::default() };
        assert!(config.sampler().is_err());
        assert!(Protocol::parse("http/json", "x").is_err());
        assert_eq!(Protocol::parse("http/protobuf", "x").ok(), Some(Protocol::HttpProtobuf));
    }

    #[test]
    fn resource_attributes_parse() {
        let config = TelemetryConfig { resource_attributes: Some("a=1, b = two".into()), ..Default::default() };
        assert_eq!(
            config.extra_resource_attributes().ok(),
            Some(vec![("a".into(), "1".into()), ("b".into(), "two".into())])
        );
        let config = TelemetryConfig { resource_attributes: Some("nope".into()), ..Default::default() };
        assert!(config.extra_resource_attributes().is_err());
    }
}
