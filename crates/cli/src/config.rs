//! Configuration layering: defaults (a command's own among them, such as
//! `up --data-dir`), then an optional TOML file, then `AGENTMESH_*`
//! environment variables (`__` separates sections, e.g.
//! `AGENTMESH_DISCOVERY__DATABASE_URL`), then command-line flags; the result
//! is validated once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_executor::ExecutorConfig;
use agentmesh_gateway::GatewayConfig;
use agentmesh_planner::PlannerConfig;
use agentmesh_synthesis::SynthesisConfig;
use agentmesh_telemetry::TelemetryConfig;
use anyhow::Context;
use clap::Args;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[discovery]` section.
    pub discovery: DiscoveryConfig,
    /// `[planner]` section.
    pub planner: PlannerConfig,
    /// `[executor]` section.
    pub executor: ExecutorConfig,
    /// `[synthesis]` section.
    pub synthesis: SynthesisConfig,
    /// `[gateway]` section.
    pub gateway: GatewayConfig,
    /// `[telemetry]` section: logs and trace export, for every command.
    pub telemetry: TelemetryConfig,
}

/// A flag that overrides one configuration key (`section.key`).
pub type Override = (String, figment::value::Value);

/// The sections of the configuration.
pub const SECTIONS: [&str; 6] = ["discovery", "planner", "executor", "synthesis", "gateway", "telemetry"];

/// The sections that configure a service.
pub const SERVICES: [&str; 5] = ["discovery", "planner", "executor", "synthesis", "gateway"];

/// Loads the layered configuration: `defaults` are a command's own defaults
/// (below the file), `overrides` its flags (above everything).
pub fn load(file: Option<&Path>, defaults: &[Override], overrides: &[Override]) -> anyhow::Result<Config> {
    let mut figment = Figment::from(Serialized::defaults(Config::default()));
    for (key, value) in defaults {
        figment = figment.merge(Serialized::default(key, value.clone()));
    }
    if let Some(file) = file {
        anyhow::ensure!(file.exists(), "config file {} does not exist", file.display());
        figment = figment.merge(Toml::file(file));
    }
    figment = figment.merge(Env::prefixed("AGENTMESH_").filter(|key| section_of(key.as_str()).is_some()).split("__"));
    for (key, value) in overrides {
        figment = figment.merge(Serialized::default(key, value.clone()));
    }
    let config: Config = figment.extract().map_err(|e| anyhow::anyhow!("invalid configuration: {}", explain(e)))?;
    config.discovery.validate()?;
    Ok(config)
}

/// A configuration error in words a user can act on: where it comes from
/// (the file, the environment, a flag), the section and key, and for an
/// unknown section the one probably meant; not figment's profile prefix
/// (`default.`).
fn explain(errors: figment::Error) -> String {
    errors
        .into_iter()
        .map(|e| {
            let key: Vec<&str> = e.path.iter().map(String::as_str).filter(|p| *p != "default").collect();
            let message = match &e.kind {
                figment::error::Kind::UnknownField(field, _) if key.len() <= 1 => {
                    let meant = agentmesh_server::settings::closest(field, &SECTIONS)
                        .map(|s| format!("did you mean [{s}]? "))
                        .unwrap_or_default();
                    format!("unknown section [{field}]; {meant}the sections are {}", SECTIONS.join(", "))
                }
                kind => kind.to_string(),
            };
            let place = match key.as_slice() {
                [] => String::new(),
                [section] => format!("[{section}] "),
                [section, rest @ ..] => format!("[{section}] {}: ", rest.join(".")),
            };
            let place = if matches!(&e.kind, figment::error::Kind::UnknownField(..)) && key.len() <= 1 {
                String::new()
            } else {
                place
            };
            let source = e
                .metadata
                .as_ref()
                .map(|m| match &m.source {
                    Some(figment::Source::File(path)) => format!(" (in {})", path.display()),
                    _ => format!(" (from {})", m.name),
                })
                .unwrap_or_default();
            format!("{place}{message}{source}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The section an environment key (after `AGENTMESH_`) sets, if any:
/// `DISCOVERY__DATABASE_URL` sets `discovery`.
fn section_of(key: &str) -> Option<&'static str> {
    let (section, _) = key.split_once("__")?;
    SECTIONS.into_iter().find(|s| s.eq_ignore_ascii_case(section))
}

/// Variables starting with `AGENTMESH_` that the CLI reads by name, beside
/// the `AGENTMESH_<SECTION>__<KEY>` settings (the test suite's own are
/// listed so that its runs stay quiet).
const KNOWN_VARIABLES: [&str; 23] = [
    "AGENTMESH_CONFIG",
    "AGENTMESH_TOKEN",
    "AGENTMESH_AGENT_LISTEN",
    "AGENTMESH_AGENT_URL",
    "AGENTMESH_AGENT_TOKEN",
    "AGENTMESH_BLESS",
    "AGENTMESH_LOG_FORMAT",
    "AGENTMESH_DISCOVERY_URL",
    "AGENTMESH_PLANNER_URL",
    "AGENTMESH_EXECUTOR_URL",
    "AGENTMESH_GATEWAY_URL",
    "AGENTMESH_EMBEDDINGS_DIR",
    "AGENTMESH_TEST_DATABASE_URL",
    "AGENTMESH_LLAMA_URL",
    "AGENTMESH_SMOLLM2_GGUF",
    "AGENTMESH_REAL_MODEL_FULL",
    "AGENTMESH_REAL_MODEL_ONLY",
    "AGENTMESH_REAL_MODEL_RUNS",
    "AGENTMESH_REAL_MODEL_VERBOSE",
    "AGENTMESH_REAL_MODEL_REPEAT",
    "AGENTMESH_INTEROP_DIR",
    "AGENTMESH_CHROMIUM",
    "AGENTMESH_CHROMEDRIVER",
];

/// A warning for each `AGENTMESH_` variable that sets nothing (such as
/// `AGENTMESH_DISCOVERY_DATABASE_URL` with one underscore), saying what was
/// probably meant.
pub fn unknown_variables(variables: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut warnings = Vec::new();
    for name in variables {
        let Some(key) = name.strip_prefix("AGENTMESH_") else { continue };
        if KNOWN_VARIABLES.contains(&name.as_str()) || section_of(key).is_some() {
            continue;
        }
        let meant = SECTIONS.iter().find_map(|section| {
            let rest = key.get(section.len()..)?;
            (key[..section.len()].eq_ignore_ascii_case(section) && rest.starts_with('_') && rest.len() > 1)
                .then(|| format!("AGENTMESH_{}__{}", &key[..section.len()], &rest[1..]))
        });
        warnings.push(match meant {
            Some(meant) => format!(
                "{name} is not read: a setting is AGENTMESH_<SECTION>__<KEY>, with two underscores; did you mean {meant}?"
            ),
            None => format!(
                "{name} is not read: settings are AGENTMESH_<SECTION>__<KEY> (sections: {}); see `--print-config`",
                SECTIONS.join(", ")
            ),
        });
    }
    warnings
}

/// The configuration as `--print-config` shows it, only the `sections` the
/// command uses, with every secret hidden by the rule `Debug` follows
/// ([`agentmesh_telemetry::secrets::hide_secrets`]): URLs without their
/// passwords or keys, settings named for a secret as `***`.
pub fn printable(config: &Config, sections: &[&str]) -> anyhow::Result<String> {
    let mut value = serde_json::to_value(config).context("printing config")?;
    if let serde_json::Value::Object(table) = &mut value {
        table.retain(|section, _| sections.contains(&section.as_str()));
    }
    agentmesh_telemetry::secrets::hide_secrets(&mut value);
    drop_nulls(&mut value);
    let value = toml::Value::try_from(value).context("printing config")?;
    toml::to_string_pretty(&value).context("printing config")
}

/// Unset settings (JSON `null`) are left out: TOML has no null.
fn drop_nulls(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(fields) => {
            fields.retain(|_, v| !v.is_null());
            fields.values_mut().for_each(drop_nulls);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// A command-line value that may hold a password (a database or server
/// URL): `Debug` shows it redacted; it is passed on whole.
#[derive(Clone, Serialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&agentmesh_telemetry::redact(&self.0), f)
    }
}

/// The flags given, as overrides of `section`: each flag sets the key its
/// field is named (or renamed) for; flags not given set nothing.
pub fn overrides_of(section: &str, flags: &impl Serialize) -> Vec<Override> {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(flags) else { return Vec::new() };
    let mut out = Vec::new();
    for (key, value) in fields.into_iter().filter(|(_, value)| !value.is_null()) {
        push(&mut out, section, &key, Some(value));
    }
    out
}

/// Adds the override `section.key = value` when a value is given.
fn push<T: Serialize>(out: &mut Vec<Override>, section: &str, key: &str, value: Option<T>) {
    if let Some(value) = value
        && let Ok(value) = figment::value::Value::serialize(value)
    {
        out.push((format!("{section}.{key}"), value));
    }
}

/// Log and trace flags, accepted by every command.
#[derive(Args, Debug)]
pub struct TelemetryArgs {
    /// Log output format [default: text].
    #[arg(long, global = true, value_enum, env = "AGENTMESH_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// OTLP collector receiving traces, e.g. http://127.0.0.1:4317 (gRPC) or
    /// http://127.0.0.1:4318 (HTTP); else OTEL_EXPORTER_OTLP_ENDPOINT; none: no export.
    #[arg(long, global = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP protocol: grpc or http/protobuf [default: grpc on port 4317, else http/protobuf].
    #[arg(long, global = true, value_parser = ["grpc", "http/protobuf"])]
    pub otlp_protocol: Option<String>,
    /// Trace sampler, as OTEL_TRACES_SAMPLER names it [default: parentbased_always_on].
    #[arg(long, global = true)]
    pub trace_sampler: Option<String>,
    /// Ratio of the traceidratio samplers, 0 to 1.
    #[arg(long, global = true)]
    pub trace_sampler_arg: Option<f64>,
    /// Record LLM prompts and completions on the LLM call spans.
    #[arg(long, global = true)]
    pub trace_llm_content: bool,
}

/// Log line formats.
#[derive(Copy, Clone, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl TelemetryArgs {
    /// The flags given, as configuration overrides.
    pub fn overrides(&self) -> Vec<Override> {
        let mut out = Vec::new();
        let format = self.log_format.map(|f| match f {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        });
        push(&mut out, "telemetry", "log_format", format);
        push(&mut out, "telemetry", "otlp_endpoint", self.otlp_endpoint.clone());
        push(&mut out, "telemetry", "otlp_protocol", self.otlp_protocol.clone());
        push(&mut out, "telemetry", "sampler", self.trace_sampler.clone());
        push(&mut out, "telemetry", "sampler_arg", self.trace_sampler_arg);
        if self.trace_llm_content {
            push(&mut out, "telemetry", "capture_llm_content", Some(true));
        }
        out
    }
}

/// Flags every `serve` command takes, for the settings every service has.
#[derive(Args, Debug, Serialize)]
pub struct ServiceArgs {
    /// Address serving gRPC and HTTP (/metrics, /healthz, /readyz) [default: 127.0.0.1:7400 discovery,
    /// 7401 planner, 7402 executor, 7403 synthesis, 7404 gateway].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// The service's database: `sqlite://PATH`, `sqlite::memory:` or `postgres://USER@HOST/DB`
    /// [default: sqlite://.agentmesh/agentmesh.db].
    #[arg(long)]
    pub database_url: Option<SecretUrl>,
    /// Seconds a request may take [default: 30; planner and synthesis 600, gateway 900 (an orchestration)].
    #[arg(long, value_name = "SECONDS")]
    pub request_timeout_secs: Option<f64>,
    /// Seconds between checks of the service's dependencies for readiness [default: 2].
    #[arg(long, value_name = "SECONDS")]
    pub health_check_interval_secs: Option<f64>,
    /// Print the resulting configuration and exit.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
}

/// Flags of the services that call a model (and of `up`, which passes
/// them to both).
#[derive(Args, Debug, Serialize)]
pub struct LlmArgs {
    /// `provider:model[,provider:model…]`, a fallback chain: openai, anthropic,
    /// gemini, ollama, vllm, llamacpp (any OpenAI-compatible server, with
    /// --llm-base-url) or `replay:FILE`. Keys come from OPENAI_API_KEY,
    /// ANTHROPIC_API_KEY, GEMINI_API_KEY. For `up`, the planner and synthesis
    /// run only with one.
    #[arg(long)]
    pub llm: Option<String>,
    /// Base URL of the LLM server, e.g. http://127.0.0.1:8000/v1.
    #[arg(long)]
    pub llm_base_url: Option<SecretUrl>,
    /// Structured output (the planner's plans, synthesis's reviews): auto,
    /// json_schema, json_object, tool or none [default: auto].
    #[arg(long)]
    pub llm_structured: Option<String>,
    /// Seconds each LLM call may take [default: 60 planner, 120 synthesis].
    #[arg(long, value_name = "SECONDS")]
    #[serde(rename = "llm_timeout_secs")]
    pub llm_timeout: Option<u64>,
    /// Retries after 429, 5xx and timeouts [default: 3].
    #[arg(long)]
    pub llm_retries: Option<u32>,
    /// PEM file of extra trusted CAs for HTTPS to the LLM server.
    #[arg(long)]
    pub llm_ca_file: Option<std::path::PathBuf>,
}

/// Flags of `agentmesh serve discovery`.
#[derive(Args, Debug, Serialize)]
pub struct DiscoveryArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub service: ServiceArgs,
    /// Expected seconds between agent heartbeats [default: 10].
    #[arg(long)]
    pub heartbeat_interval_secs: Option<f64>,
    /// Seconds a catalog snapshot is served before reloading [default: 30].
    #[arg(long)]
    pub cache_ttl_secs: Option<f64>,
}

/// Flags of `agentmesh up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Discovery's address, gRPC and HTTP [default: 127.0.0.1:7400].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    #[command(flatten)]
    pub llm: LlmArgs,
    /// Directory of the embedded SQLite database, used by every service
    /// whose `database_url` the file or the environment does not set.
    #[arg(long, default_value = ".agentmesh")]
    pub data_dir: PathBuf,
    /// Print the resulting configuration and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl UpArgs {
    /// The embedded default, SQLite in the data directory, as a default:
    /// a `database_url` in the file or the environment wins over it.
    pub fn defaults(&self) -> Vec<Override> {
        let embedded = format!("sqlite://{}", self.data_dir.join("agentmesh.db").display());
        let mut out = Vec::new();
        for section in SERVICES {
            push(&mut out, section, "database_url", Some(embedded.clone()));
        }
        out
    }

    /// The flags given, as configuration overrides.
    pub fn overrides(&self) -> Vec<Override> {
        let mut out = Vec::new();
        push(&mut out, "discovery", "listen", self.listen.map(|a| a.to_string()));
        out.extend(overrides_of("planner", &self.llm));
        out.extend(overrides_of("synthesis", &self.llm));
        out
    }
}

/// Flags of `agentmesh serve planner`.
#[derive(Args, Debug, Serialize)]
pub struct PlannerArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub llm: LlmArgs,
    /// Discovery's address [default: http://127.0.0.1:7400].
    #[arg(long)]
    #[serde(rename = "discovery_url")]
    pub discovery: Option<String>,
    /// The orchestrator's own agent ids, never planned for (repeatable).
    #[arg(long = "self-agent-id")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub self_agent_ids: Vec<String>,
}

/// Flags of `agentmesh serve synthesis`.
#[derive(Args, Debug, Serialize)]
pub struct SynthesisArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub llm: LlmArgs,
    /// Discovery's address, for the catalog reviews suggest from [default: http://127.0.0.1:7400].
    #[arg(long)]
    #[serde(rename = "discovery_url")]
    pub discovery: Option<String>,
    /// Most tokens of an answer [default: 1024].
    #[arg(long)]
    pub answer_max_tokens: Option<u32>,
}

/// Flags of `agentmesh serve gateway`.
#[derive(Args, Debug, Serialize)]
pub struct GatewayArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub service: ServiceArgs,
    /// The planner's address [default: http://127.0.0.1:7401].
    #[arg(long)]
    #[serde(rename = "planner_url")]
    pub planner: Option<String>,
    /// The executor's address [default: http://127.0.0.1:7402].
    #[arg(long)]
    #[serde(rename = "executor_url")]
    pub executor: Option<String>,
    /// The synthesis service's address [default: http://127.0.0.1:7403].
    #[arg(long)]
    #[serde(rename = "synthesis_url")]
    pub synthesis: Option<String>,
    /// Discovery's address, for the console's agents page [default: http://127.0.0.1:7400].
    #[arg(long)]
    #[serde(rename = "discovery_url")]
    pub discovery: Option<String>,
    /// Serve the console at `/` [default: true].
    #[arg(long)]
    pub console: Option<bool>,
}

/// Flags of `agentmesh serve executor`.
#[derive(Args, Debug, Serialize)]
pub struct ExecutorArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub service: ServiceArgs,
    /// Discovery's address [default: http://127.0.0.1:7400].
    #[arg(long)]
    #[serde(rename = "discovery_url")]
    pub discovery: Option<String>,
    /// The planner's address, for loop-back [default: none: collaboration requests are rejected].
    #[arg(long)]
    #[serde(rename = "planner_url")]
    pub planner: Option<String>,
    /// Steps of one execution running at once [default: 16].
    #[arg(long)]
    pub max_concurrency: Option<u32>,
    /// Milliseconds one attempt of a step may take [default: 30000].
    #[arg(long)]
    pub step_timeout_ms: Option<u64>,
    /// Retries after a retryable failure [default: 2].
    #[arg(long)]
    pub max_retries: Option<u32>,
    /// Seconds before another replica takes over the executions of one that stopped [default: 10].
    #[arg(long)]
    pub lease_secs: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_holding_urls_show_redacted_in_debug() {
        let args = DiscoveryArgs {
            service: ServiceArgs {
                listen: None,
                database_url: Some(SecretUrl::from("postgres://u:hunter2@db/agentmesh".to_owned())),
                request_timeout_secs: None,
                health_check_interval_secs: None,
                print_config: false,
            },
            heartbeat_interval_secs: None,
            cache_ttl_secs: None,
        };
        let shown = format!("{args:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("postgres://u:***@db/agentmesh"), "{shown}");
        let overrides = format!("{:?}", overrides_of("discovery", &args));
        assert!(overrides.contains("hunter2"), "the flag's value itself is passed on whole: {overrides}");
    }

    #[test]
    fn each_flag_sets_its_key_and_flags_not_given_set_nothing() {
        use clap::Parser;
        #[derive(Parser)]
        struct Planner {
            #[command(flatten)]
            flags: PlannerArgs,
        }
        #[derive(Parser)]
        struct Executor {
            #[command(flatten)]
            flags: ExecutorArgs,
        }
        let keys = |overrides: Vec<Override>| -> Vec<String> {
            overrides.into_iter().map(|(key, value)| format!("{key}={}", serde_json::json!(value))).collect()
        };
        let planner = Planner::parse_from([
            "x",
            "--discovery",
            "http://d:1",
            "--llm-timeout",
            "7",
            "--self-agent-id",
            "me",
            "--health-check-interval-secs",
            "0.5",
        ]);
        assert_eq!(
            keys(overrides_of("planner", &planner.flags)),
            [
                "planner.health_check_interval_secs=0.5",
                "planner.llm_timeout_secs=7",
                "planner.discovery_url=\"http://d:1\"",
                "planner.self_agent_ids=[\"me\"]"
            ]
        );
        let executor = Executor::parse_from(["x", "--planner", "http://p:2", "--print-config"]);
        assert!(executor.flags.service.print_config);
        assert_eq!(keys(overrides_of("executor", &executor.flags)), ["executor.planner_url=\"http://p:2\""]);
        assert!(overrides_of("planner", &Planner::parse_from(["x"]).flags).is_empty());
    }

    #[test]
    fn printed_configuration_hides_secrets_by_key() {
        let mut config = Config::default();
        config.planner.llm.llm_base_url = Some("https://u:hunter2@llm/v1?key=hunter3".into());
        config.telemetry.otlp_endpoint = Some("https://u:hunter4@collector:4318".into());
        let printed = printable(&config, &SECTIONS).unwrap_or_default();
        assert!(!printed.contains("hunter"), "{printed}");
        assert!(printed.contains("llm_base_url = \"https://u:***@llm/v1?key=***\""), "{printed}");
    }
}
