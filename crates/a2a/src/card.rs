//! Agent Cards: where an A2A agent is called and in which protocol
//! version, whether it streams, and its skills, which become capabilities.
//!
//! A card of protocol 1.0 lists `supportedInterfaces` (each a URL, a
//! binding and a version); a card of 0.3 has one `url`, its
//! `protocolVersion` and `preferredTransport`, and `additionalInterfaces`.
//! The mesh calls over JSON-RPC, preferring 1.0 when the card offers both.

use std::time::Duration;

use agentmesh_core::import::{Imported, capability_id, shortened};
use agentmesh_core::validate::MAX_DESCRIPTION_LEN;
use agentmesh_core::{Capability, RawJson, Transport};
use serde_json::{Value, json};

use crate::wire::Version;

/// Where an agent's card is, under its base URL.
pub const WELL_KNOWN_PATH: &str = "/.well-known/agent-card.json";

/// The tag every imported skill carries.
pub const TAG: &str = "a2a";

/// Most examples kept per skill.
const MAX_EXAMPLES: usize = 5;

/// Largest card read.
const MAX_CARD_BYTES: usize = 4 << 20;

/// Where and how an agent is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// The JSON-RPC endpoint.
    pub url: String,
    /// The protocol version spoken there.
    pub version: Version,
}

/// A skill as the card describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Skill {
    /// Its id, as the agent spells it.
    pub id: String,
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its tags.
    pub tags: Vec<String>,
    /// Example requests.
    pub examples: Vec<String>,
}

/// What the mesh reads of an Agent Card.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    /// The agent's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its version.
    pub version: String,
    /// Where the mesh calls it.
    pub interface: Interface,
    /// Whether it streams a task's events (`SendStreamingMessage`).
    pub streaming: bool,
    /// Its skills.
    pub skills: Vec<Skill>,
}

/// Why a card could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    /// Nothing answered, or not in time.
    #[error("the Agent Card at {url} could not be fetched: {reason}")]
    Unreachable {
        /// Where.
        url: String,
        /// Why.
        reason: String,
    },
    /// Something answered that is not a card the mesh can use.
    #[error("the Agent Card at {url} cannot be used: {reason}")]
    Invalid {
        /// Where.
        url: String,
        /// Why.
        reason: String,
    },
}

/// The card's URL for an agent registered at `base_url`: the URL itself
/// when it names a `.json` file, else the well-known path under it.
pub fn card_url(base_url: &str) -> String {
    if base_url.split(['?', '#']).next().is_some_and(|path| path.ends_with(".json")) {
        return base_url.to_owned();
    }
    format!("{}{WELL_KNOWN_PATH}", base_url.trim_end_matches('/'))
}

/// Fetches and reads the card of the agent at `base_url`.
pub async fn fetch(http: &reqwest::Client, base_url: &str, timeout: Duration) -> Result<Card, CardError> {
    let url = card_url(base_url);
    let unreachable = |reason: String| CardError::Unreachable { url: url.clone(), reason };
    let response = http
        .get(&url)
        .header(reqwest::header::ACCEPT, "application/json")
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| unreachable(agentmesh_telemetry::http::error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(unreachable(format!("HTTP {status}")));
    }
    let body = crate::client::read_body(response, MAX_CARD_BYTES).await.map_err(|e| match e {
        crate::client::ReadError::Cut(_) => unreachable(e.to_string()),
        crate::client::ReadError::TooLarge(_) => CardError::Invalid { url: url.clone(), reason: e.to_string() },
    })?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| CardError::Invalid { url: url.clone(), reason: format!("not JSON: {e}") })?;
    read(&value, &url).map_err(|reason| CardError::Invalid { url, reason })
}

/// Reads a card fetched from `card_url` (relative interface URLs are
/// taken against it).
pub fn read(card: &Value, card_url: &str) -> Result<Card, String> {
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default().trim().to_owned();
    if !card.is_object() {
        return Err("not a JSON object".into());
    }
    let absolute = |url: &str| -> Option<String> {
        let base = url::Url::parse(card_url).ok()?;
        base.join(url).ok().filter(|u| matches!(u.scheme(), "http" | "https")).map(String::from)
    };
    let mut offered: Vec<(String, Option<String>, String)> = Vec::new();
    for interface in card.get("supportedInterfaces").and_then(Value::as_array).into_iter().flatten() {
        offered.push((
            text(interface, "url"),
            Some(interface.get("protocolVersion").and_then(Value::as_str).unwrap_or("1.0").to_owned()),
            text(interface, "protocolBinding"),
        ));
    }
    // 0.3: the main URL, and the others under `additionalInterfaces`.
    let declared = card.get("protocolVersion").and_then(Value::as_str).map(str::to_owned);
    if !text(card, "url").is_empty() {
        let binding = card.get("preferredTransport").and_then(Value::as_str).unwrap_or("JSONRPC");
        offered.push((text(card, "url"), declared.clone(), binding.to_owned()));
    }
    for interface in card.get("additionalInterfaces").and_then(Value::as_array).into_iter().flatten() {
        offered.push((text(interface, "url"), declared.clone(), text(interface, "transport")));
    }
    let mut usable: Vec<Interface> = offered
        .iter()
        .filter(|(_, _, binding)| binding.eq_ignore_ascii_case("JSONRPC"))
        .filter_map(|(url, version, _)| {
            Some(Interface { url: absolute(url)?, version: Version::parse(version.as_deref().unwrap_or("0.3"))? })
        })
        .collect();
    usable.sort_by_key(|i| i.version != Version::V1);
    let Some(interface) = usable.into_iter().next() else {
        let seen: Vec<String> = offered
            .iter()
            .map(|(url, version, binding)| format!("{binding} {} at {url}", version.as_deref().unwrap_or("?")))
            .collect();
        return Err(format!(
            "it offers no JSON-RPC interface in protocol 1.0 or 0.3 (offered: {})",
            if seen.is_empty() { "nothing".to_owned() } else { seen.join(", ") }
        ));
    };
    let skills = card
        .get("skills")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|skill| Skill {
            id: text(skill, "id"),
            name: text(skill, "name"),
            description: text(skill, "description"),
            tags: strings(skill.get("tags")),
            examples: strings(skill.get("examples")),
        })
        .collect();
    Ok(Card {
        name: text(card, "name"),
        description: text(card, "description"),
        version: text(card, "version"),
        interface,
        streaming: card.pointer("/capabilities/streaming").and_then(Value::as_bool).unwrap_or(false),
        skills,
    })
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The input every imported skill takes: the message sent to the agent.
pub fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"message": {"type": "string", "description": "What to ask the agent, in plain language"}},
        "required": ["message"],
    })
}

/// The card's skills as capabilities: input `{"message": string}`, the
/// skill's examples as example inputs, tagged `a2a` and with the skill's
/// own tags; a skill the catalog cannot hold is left out with the reason.
pub fn import(card: &Card) -> Imported {
    let mut imported = Imported::new(Transport::A2a);
    let schema = RawJson::from_value(&input_schema());
    for skill in &card.skills {
        let Some(id) = capability_id(&skill.id) else {
            imported.skip(&skill.id, "its id cannot be made a capability id");
            continue;
        };
        let description = match (skill.description.as_str(), skill.name.as_str()) {
            ("", name) => name.to_owned(),
            (description, "") => description.to_owned(),
            (description, name) => format!("{name}: {description}"),
        };
        let mut tags = vec![TAG.to_owned()];
        tags.extend(skill.tags.iter().filter(|t| !t.is_empty() && **t != TAG).cloned());
        let capability = Capability {
            id,
            description: shortened(&description, MAX_DESCRIPTION_LEN),
            tags,
            input_schema: Some(schema.clone()),
            output_schema: None,
            examples: skill
                .examples
                .iter()
                .take(MAX_EXAMPLES)
                .map(|example| RawJson::from_value(&json!({"message": example})))
                .collect(),
            endpoint: skill.id.clone(),
            internal: false,
            hints: None,
        };
        imported.add(&skill.id, capability);
    }
    imported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_urls() {
        assert_eq!(card_url("http://a:1"), "http://a:1/.well-known/agent-card.json");
        assert_eq!(card_url("http://a:1/x/"), "http://a:1/x/.well-known/agent-card.json");
        assert_eq!(card_url("http://a:1/card.json"), "http://a:1/card.json");
    }

    #[test]
    fn a_1_0_card_is_called_over_its_json_rpc_interface() {
        // As an a2a-sdk 1.x agent serves it (both versions, 1.0 preferred).
        let card = json!({
            "name": "Currency", "description": "Converts money", "version": "1.0.0",
            "supportedInterfaces": [
                {"url": "http://127.0.0.1:9/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "/rpc03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
                {"url": "/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            ],
            "capabilities": {"streaming": true},
            "skills": [{"id": "convert", "name": "Convert", "description": "Converts an amount", "tags": ["money"],
                        "examples": ["100 USD in EUR"]}],
        });
        let read = read(&card, "http://127.0.0.1:9/.well-known/agent-card.json").map_err(|e| panic!("{e}")).ok();
        let Some(read) = read else { return };
        assert_eq!(read.interface, Interface { url: "http://127.0.0.1:9/".into(), version: Version::V1 });
        assert!(read.streaming);
        let imported = import(&read);
        assert!(imported.skipped.is_empty(), "{:?}", imported.skipped);
        let skill = &imported.skills[0];
        assert_eq!((skill.id.as_str(), skill.endpoint.as_str()), ("convert", "convert"));
        assert_eq!(skill.description, "Convert: Converts an amount");
        assert_eq!(skill.tags, ["a2a", "money"]);
        assert_eq!(skill.examples[0].to_value(), json!({"message": "100 USD in EUR"}));
    }

    #[test]
    fn a_0_3_card_is_called_in_0_3() {
        // The shape of the 0.3 specification's example card.
        let card = json!({
            "protocolVersion": "0.3.0", "name": "GeoSpatial Route Planner Agent",
            "description": "Provides advanced route planning.", "url": "https://georoute-agent.example.com/a2a/v1",
            "preferredTransport": "JSONRPC",
            "additionalInterfaces": [{"url": "https://georoute-agent.example.com/a2a/grpc", "transport": "GRPC"}],
            "capabilities": {"streaming": false},
            "skills": [{"id": "route-optimizer-traffic", "name": "Traffic-Aware Route Optimizer",
                        "description": "Calculates the optimal driving route.", "tags": ["maps"],
                        "examples": ["Plan a route from A to B"]}],
        });
        let read = read(&card, "https://georoute-agent.example.com/.well-known/agent-card.json");
        let Ok(read) = read else { panic!("{read:?}") };
        assert_eq!(read.interface.version, Version::V03);
        assert_eq!(read.interface.url, "https://georoute-agent.example.com/a2a/v1");
        assert!(!read.streaming);
        assert_eq!(import(&read).skills[0].id, "route-optimizer-traffic");
    }

    #[test]
    fn a_card_without_a_usable_interface_says_what_it_offers() {
        let card = json!({"name": "x", "supportedInterfaces": [{"url": "http://a/", "protocolBinding": "GRPC", "protocolVersion": "1.0"}]});
        let error = read(&card, "http://a/.well-known/agent-card.json").err().unwrap_or_default();
        assert!(error.contains("no JSON-RPC interface") && error.contains("GRPC 1.0 at http://a/"), "{error}");
        assert!(read(&json!([1]), "http://a/").is_err());
        let old = json!({"name": "x", "url": "http://a/", "protocolVersion": "0.2.5"});
        assert!(read(&old, "http://a/").is_err());
    }
}
