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
    /// An MCP server: the capabilities are its tools, called with
    /// `tools/call` on its streamable-HTTP URL (the base URL).
    Mcp,
    /// An A2A agent: the capabilities are the skills of its Agent Card
    /// (`{base_url}/.well-known/agent-card.json`), called by sending a
    /// message in the protocol version the card declares.
    A2a,
}

impl Transport {
    /// Wire name used in REST and storage.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Grpc => "grpc",
            Self::Mcp => "mcp",
            Self::A2a => "a2a",
        }
    }

    /// Whether the agent's capabilities come from the agent itself (its
    /// MCP tools, its Agent Card's skills) rather than the registration,
    /// and each one's endpoint is the name the agent gives it.
    pub fn is_imported(self) -> bool {
        matches!(self, Self::Mcp | Self::A2a)
    }

    /// Parses a wire name.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "http" => Some(Self::Http),
            "grpc" => Some(Self::Grpc),
            "mcp" => Some(Self::Mcp),
            "a2a" => Some(Self::A2a),
            _ => None,
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

/// What calling a capability does to the world, as declared by whoever
/// registered it (MCP tool annotations arrive here). Hints, not guarantees:
/// an undeclared hint says nothing either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hints {
    /// It changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// It may delete or overwrite (meaningful when not read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    /// Calling it again with the same input has no further effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// It reaches outside systems (the web, other services).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
    /// The agent honours the `Idempotency-Key` the executor sends (the same
    /// on every attempt of a step): a call repeated with a key it has seen
    /// answers with the first call's result without doing the work again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<bool>,
}

impl Hints {
    /// Whether a second call after an ambiguous failure (timeout, lost
    /// connection) is safe: read-only or idempotent, or not declared either
    /// way, or the agent honours the idempotency key.
    pub fn retry_safe(hints: Option<&Hints>) -> bool {
        hints
            .is_none_or(|h| h.read_only == Some(true) || h.idempotent != Some(false) || h.idempotency_key == Some(true))
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
    /// What calling it does to the world, when declared (MCP tool annotations
    /// arrive here): the executor does not retry a non-idempotent step after a
    /// timeout or a lost connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints: Option<Hints>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_declared_non_idempotent_write_is_unsafe_to_call_twice() {
        let hints = |read_only, idempotent| Hints { read_only, idempotent, ..Hints::default() };
        assert!(Hints::retry_safe(None), "nothing declared");
        assert!(Hints::retry_safe(Some(&Hints::default())));
        assert!(Hints::retry_safe(Some(&hints(None, Some(true)))));
        assert!(Hints::retry_safe(Some(&hints(Some(true), Some(false)))), "read-only wins");
        assert!(!Hints::retry_safe(Some(&hints(None, Some(false)))));
        assert!(!Hints::retry_safe(Some(&hints(Some(false), Some(false)))));
    }

    #[test]
    fn hints_are_written_only_when_declared() {
        let parse = |value: Value| serde_json::from_value::<Capability>(value);
        let with = parse(serde_json::json!({"id": "charge", "hints": {"idempotent": false, "open_world": true}}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(with.hints, Some(Hints { idempotent: Some(false), open_world: Some(true), ..Hints::default() }));
        let written = serde_json::to_value(&with).unwrap_or_default();
        assert_eq!(written["hints"], serde_json::json!({"idempotent": false, "open_world": true}));
        let without = parse(serde_json::json!({"id": "look"})).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(without.hints, None);
        assert!(serde_json::to_value(&without).unwrap_or_default().get("hints").is_none());
        assert!(parse(serde_json::json!({"id": "x", "hints": {"readOnlyHint": true}})).is_err(), "unknown hint");
    }

    #[test]
    fn transports_have_one_wire_name_each() {
        for transport in [Transport::Http, Transport::Grpc, Transport::Mcp, Transport::A2a] {
            assert_eq!(Transport::parse(transport.as_str()), Some(transport));
            let json = serde_json::to_value(transport).unwrap_or_default();
            assert_eq!(json, Value::String(transport.as_str().to_owned()));
        }
        assert_eq!(Transport::parse("smtp"), None);
    }
}
