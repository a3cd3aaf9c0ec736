//! Credentials the executor presents to agents that need one. A
//! registration names a credential (`"credential": "weather-api"`); the
//! secret itself stays with the executor, in `agent_credentials_file`
//! (TOML, re-read when it changes), and is sent only to the agents the
//! entry lists:
//!
//! ```toml
//! [[credential]]
//! name = "weather-api"           # what registrations name
//! agents = ["weather-tool-v2"]   # the agent ids it may be sent to ("*": any)
//! env = "WEATHER_API_TOKEN"      # the secret: an environment variable,
//! # file = "/run/secrets/weather-api"   # or a file (trailing newline dropped)
//! header = "authorization"       # default
//! scheme = "Bearer"              # default for `authorization`; "" sends the secret alone
//! ```
//!
//! HTTP agents receive it as that header, gRPC agents as that metadata.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use http::{HeaderName, HeaderValue};
use serde::Deserialize;

/// What an agent call carries to authenticate the executor.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// Header (HTTP) or metadata key (gRPC), lowercase.
    pub header: HeaderName,
    /// Its value, marked sensitive (never logged by the HTTP stack).
    pub value: HeaderValue,
    /// The secret alone, to scrub from anything an agent echoes back.
    pub secret: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential({}: <redacted>)", self.header)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    credential: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    agents: Vec<String>,
    env: Option<String>,
    file: Option<PathBuf>,
    header: Option<String>,
    scheme: Option<String>,
}

/// One loaded entry.
struct Loaded {
    agents: Vec<String>,
    credential: Credential,
}

impl Loaded {
    fn may_go_to(&self, agent_id: &str) -> bool {
        self.agents.iter().any(|a| a == "*" || a == agent_id)
    }
}

type Table = Arc<HashMap<String, Loaded>>;

/// The executor's agent credentials: none, or those of a file.
#[derive(Clone, Default)]
pub struct AgentCredentials {
    table: Option<agentmesh_server::reload::Reloaded<Table>>,
}

impl AgentCredentials {
    /// Loads `path` (an error names the entry at fault) and again whenever
    /// it, or a secret file it names, changes.
    pub fn watch(path: PathBuf) -> anyhow::Result<Self> {
        let mut watched = vec![path.clone()];
        watched.extend(secret_files(&path)?);
        let table =
            agentmesh_server::reload::load_and_watch(watched, "agent_credentials_file", "executor", move || {
                load(&path)
            })?;
        Ok(Self { table: Some(table) })
    }

    /// The credential to present to `agent_id`, which names `name`; an
    /// error says why the call cannot be made (the step fails with it).
    pub fn for_agent(&self, name: &str, agent_id: &str) -> Result<Credential, String> {
        let Some(table) = &self.table else {
            return Err(format!(
                "agent `{agent_id}` needs the credential `{name}`, and this executor has no agent_credentials_file"
            ));
        };
        let table = agentmesh_server::reload::current(table);
        let Some(entry) = table.get(name) else {
            return Err(format!(
                "agent `{agent_id}` needs the credential `{name}`, which agent_credentials_file does not hold"
            ));
        };
        if !entry.may_go_to(agent_id) {
            return Err(format!(
                "the credential `{name}` may not be sent to agent `{agent_id}`: its entry in agent_credentials_file \
                 lists the agents it is for"
            ));
        }
        Ok(entry.credential.clone())
    }
}

/// The secret files the entries of `path` name, to watch for rotation.
fn secret_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(parse(path)?.credential.into_iter().filter_map(|e| e.file).collect())
}

fn parse(path: &Path) -> anyhow::Result<File> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("agent_credentials_file: cannot read {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("agent_credentials_file {} is not valid", path.display()))
}

fn load(path: &Path) -> anyhow::Result<Table> {
    let mut table = HashMap::new();
    for (i, entry) in parse(path)?.credential.into_iter().enumerate() {
        let at = format!("agent_credentials_file {}, credential {} (`{}`)", path.display(), i + 1, entry.name);
        agentmesh_core::validate::check_id(&entry.name).map_err(|e| anyhow::anyhow!("{at}: name {e}"))?;
        anyhow::ensure!(
            !entry.agents.is_empty(),
            "{at}: list the agent ids it may be sent to in `agents` (\"*\": any)"
        );
        let secret = match (&entry.env, &entry.file) {
            (Some(var), None) => std::env::var(var).with_context(|| format!("{at}: the variable {var} is not set"))?,
            (None, Some(file)) => std::fs::read_to_string(file)
                .with_context(|| format!("{at}: cannot read {}", file.display()))?
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
            _ => anyhow::bail!("{at}: give the secret as exactly one of `env` or `file`"),
        };
        anyhow::ensure!(!secret.is_empty(), "{at}: the secret is empty");
        let header = entry.header.as_deref().unwrap_or("authorization").to_ascii_lowercase();
        let header = HeaderName::from_bytes(header.as_bytes())
            .with_context(|| format!("{at}: `{header}` is not a header name"))?;
        let scheme = entry
            .scheme
            .unwrap_or_else(|| if header == http::header::AUTHORIZATION { "Bearer".into() } else { String::new() });
        let text = if scheme.is_empty() { secret.clone() } else { format!("{scheme} {secret}") };
        let mut value =
            HeaderValue::from_str(&text).with_context(|| format!("{at}: the secret cannot be sent in a header"))?;
        value.set_sensitive(true);
        let loaded = Loaded { agents: entry.agents, credential: Credential { header, value, secret } };
        anyhow::ensure!(table.insert(entry.name.clone(), loaded).is_none(), "{at}: the name is used twice");
    }
    Ok(Arc::new(table))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("agentmesh-credentials-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("credentials.toml");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        (dir, path)
    }

    #[tokio::test]
    async fn a_credential_goes_only_to_the_agents_it_lists() {
        let (dir, path) = file("");
        let secret = dir.join("weather");
        std::fs::write(&secret, "s3cret\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            &path,
            format!(
                "[[credential]]\nname = \"weather-api\"\nagents = [\"weather-tool-v2\"]\nfile = \"{}\"\n\n\
                 [[credential]]\nname = \"stocks\"\nagents = [\"*\"]\nfile = \"{}\"\nheader = \"X-Api-Key\"\n",
                secret.display(),
                secret.display()
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let credentials = AgentCredentials::watch(path).unwrap_or_else(|e| panic!("{e:#}"));
        let weather = credentials.for_agent("weather-api", "weather-tool-v2").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(weather.header, "authorization");
        assert_eq!(weather.value, "Bearer s3cret");
        assert_eq!(format!("{weather:?}"), "Credential(authorization: <redacted>)");
        let refused = credentials.for_agent("weather-api", "attacker").err().unwrap_or_default();
        assert!(refused.contains("may not be sent to agent `attacker`"), "{refused}");
        let stocks = credentials.for_agent("stocks", "anyone").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((stocks.header.as_str(), stocks.value.to_str().unwrap_or_default()), ("x-api-key", "s3cret"));
        let unknown = credentials.for_agent("nope", "anyone").err().unwrap_or_default();
        assert!(unknown.contains("does not hold") && !unknown.contains("s3cret"), "{unknown}");
        let none = AgentCredentials::default().for_agent("weather-api", "weather-tool-v2").err().unwrap_or_default();
        assert!(none.contains("no agent_credentials_file"), "{none}");
    }

    #[test]
    fn a_bad_file_says_which_entry() {
        for (text, says) in [
            ("[[credential]]\nname = \"a\"\nagents = []\nenv = \"HOME\"\n", "list the agent ids"),
            ("[[credential]]\nname = \"a\"\nagents = [\"*\"]\n", "exactly one of `env` or `file`"),
            ("[[credential]]\nname = \"a\"\nagents = [\"*\"]\nenv = \"AGENTMESH_SURELY_UNSET_VAR\"\n", "is not set"),
            (
                "[[credential]]\nname = \"bad name\"\nagents = [\"*\"]\nenv = \"HOME\"\n",
                "credential 1 (`bad name`): name",
            ),
            ("[[credential]]\nnome = \"a\"\n", "is not valid"),
        ] {
            let (_dir, path) = file(text);
            let error = load(&path).err().map(|e| format!("{e:#}")).unwrap_or_default();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }
}
