//! Agents and their capabilities, as registered and as stored.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::health::ReportedStatus;

/// How an agent is invoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// HTTP POST to the capability's endpoint.
    #[default]
    Http,
    /// `agentmesh.v1.AgentService/Invoke`.
    Grpc,
}

impl Transport {
    /// Wire name used in REST and storage.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Grpc => "grpc",
        }
    }
}

/// How an agent is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentType {
    /// A process that stays up and heartbeats.
    #[default]
    LongRunning,
    /// Started on demand.
    Serverless,
}

impl DeploymentType {
    /// Wire name used in REST and storage.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LongRunning => "long_running",
            Self::Serverless => "serverless",
        }
    }
}

/// Reasoner or skill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapabilityKind {
    /// Target form `agent:reasoner`.
    Reasoner,
    /// Target form `agent:skill:name`.
    Skill,
}

impl CapabilityKind {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reasoner => "reasoner",
            Self::Skill => "skill",
        }
    }
}

/// A JSON document (a schema, an example) kept as compact text: a tenth of
/// the memory of a parsed `Value`, and written out verbatim when rendered.
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// From a parsed value.
    pub fn from_value(value: &Value) -> Self {
        match serde_json::value::to_raw_value(value) {
            Ok(raw) => Self(raw),
            Err(_) => Self::null(),
        }
    }

    /// From JSON text, kept as given.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str::<Box<RawValue>>(text).map(Self)
    }

    fn null() -> Self {
        Self(serde_json::from_str("null").unwrap_or_else(|_| unreachable!("null is JSON")))
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Parses the text into a value.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }

    /// True when the document is a JSON object.
    pub fn is_object(&self) -> bool {
        self.0.get().trim_start().starts_with('{')
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get() || self.to_value() == other.to_value()
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Through a Value, so that any deserializer works and the text is compact.
        Value::deserialize(deserializer).map(|v| Self::from_value(&v))
    }
}

impl From<Value> for RawJson {
    fn from(value: Value) -> Self {
        Self::from_value(&value)
    }
}

/// One reasoner or skill of an agent. Its kind is given by the list it sits in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capability {
    /// Id, unique within the agent across reasoners and skills.
    pub id: String,
    /// What the capability does, for people and planning LLMs.
    #[serde(default)]
    pub description: String,
    /// Free-form tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// JSON Schema of the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<RawJson>,
    /// JSON Schema of the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<RawJson>,
    /// Usage examples (JSON objects).
    #[serde(default)]
    pub examples: Vec<RawJson>,
    /// HTTP path that invokes it; empty means the default for its kind.
    #[serde(default)]
    pub endpoint: String,
    /// Callable, but never shown to a planning LLM or listed by default.
    #[serde(default)]
    pub internal: bool,
}

impl Capability {
    /// The endpoint, or the default `/reasoners/{id}` / `/skills/{id}`.
    pub fn endpoint_or_default(&self, kind: CapabilityKind) -> String {
        if !self.endpoint.is_empty() {
            return self.endpoint.clone();
        }
        match kind {
            CapabilityKind::Reasoner => format!("/reasoners/{}", self.id),
            CapabilityKind::Skill => format!("/skills/{}", self.id),
        }
    }
}

/// What an agent registers: the REST registration document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    /// Agent id.
    pub id: String,
    /// Base URL the agent is invoked at.
    pub base_url: String,
    /// How it is invoked.
    #[serde(default)]
    pub transport: Transport,
    /// Free-form version.
    #[serde(default)]
    pub version: String,
    /// How it is deployed.
    #[serde(default)]
    pub deployment_type: DeploymentType,
    /// Agent-level tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Reasoners.
    #[serde(default)]
    pub reasoners: Vec<Capability>,
    /// Skills.
    #[serde(default)]
    pub skills: Vec<Capability>,
    /// The name of a credential the executor presents when it calls this
    /// agent (one of the executor's `agent_credentials_file` entries):
    /// a reference, never the secret itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

impl AgentDefinition {
    /// Every capability with its kind, reasoners first.
    pub fn capabilities(&self) -> impl Iterator<Item = (CapabilityKind, &Capability)> {
        self.reasoners
            .iter()
            .map(|c| (CapabilityKind::Reasoner, c))
            .chain(self.skills.iter().map(|c| (CapabilityKind::Skill, c)))
    }

    /// Looks a capability up by its exact id.
    pub fn capability(&self, id: &str) -> Option<(CapabilityKind, &Capability)> {
        self.capabilities().find(|(_, c)| c.id == id)
    }
}

/// A stored agent: its definition plus what discovery keeps about it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRecord {
    /// The registered definition.
    pub definition: AgentDefinition,
    /// First registration.
    pub registered_at: DateTime<Utc>,
    /// Last registration (upsert).
    pub updated_at: DateTime<Utc>,
    /// Last heartbeat; a registration counts as one.
    pub last_heartbeat: DateTime<Utc>,
    /// What the agent last said about itself.
    pub reported_status: ReportedStatus,
}

impl AgentRecord {
    /// The agent id.
    pub fn id(&self) -> &str {
        &self.definition.id
    }
}
