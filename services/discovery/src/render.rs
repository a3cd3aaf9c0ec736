//! The three REST renderings of a capability page (json, xml, compact) and
//! the JSON view of a single agent.

use std::fmt::Write as _;

use agentmesh_core::{
    AgentRecord, Capability, CapabilityKind, CapabilityQuery, CatalogPage, HealthStatus, Hints, InvocationTarget,
    RawJson,
};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;

/// Output format of a capability query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The full JSON document.
    Json,
    /// XML, suited to LLM prompts.
    Xml,
    /// Minimal JSON: ids, targets and tags.
    Compact,
}

impl Format {
    /// Allowed names.
    pub const NAMES: [&'static str; 3] = ["json", "xml", "compact"];

    /// Parses a format name exactly.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "json" => Some(Self::Json),
            "xml" => Some(Self::Xml),
            "compact" => Some(Self::Compact),
            _ => None,
        }
    }

    /// Lowercase name (metrics label).
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// HTTP content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Xml => "application/xml; charset=utf-8",
            _ => "application/json",
        }
    }
}

/// RFC 3339 with second precision, as the PRD shows.
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Renders a page in the requested format.
pub fn render(format: Format, page: &CatalogPage<'_>, query: &CapabilityQuery, now: DateTime<Utc>) -> String {
    match format {
        Format::Json => serde_json::to_string(&json_document(page, query, now)).unwrap_or_default(),
        Format::Compact => serde_json::to_string(&compact_document(page, now)).unwrap_or_default(),
        Format::Xml => xml_document(page, query, now),
    }
}

#[derive(Serialize)]
struct JsonDocument<'a> {
    discovered_at: String,
    total_agents: usize,
    total_reasoners: usize,
    total_skills: usize,
    pagination: Pagination,
    capabilities: Vec<JsonAgent<'a>>,
}

#[derive(Serialize)]
struct Pagination {
    limit: usize,
    offset: usize,
    has_more: bool,
}

#[derive(Serialize)]
struct JsonAgent<'a> {
    agent_id: &'a str,
    base_url: std::borrow::Cow<'a, str>,
    version: &'a str,
    health_status: &'static str,
    deployment_type: &'static str,
    last_heartbeat: String,
    reasoners: Vec<JsonCapability<'a>>,
    skills: Vec<JsonCapability<'a>>,
}

#[derive(Serialize)]
struct JsonCapability<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    tags: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    input_schema: Option<&'a RawJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_schema: Option<&'a RawJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    examples: Option<&'a [RawJson]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hints: Option<&'a Hints>,
    invocation_target: String,
}

fn target(agent: &str, kind: CapabilityKind, cap: &Capability) -> String {
    InvocationTarget::new(agent, kind, cap.id.as_str()).to_string()
}

fn json_capability<'a>(
    agent: &str,
    kind: CapabilityKind,
    cap: &'a Capability,
    q: &CapabilityQuery,
) -> JsonCapability<'a> {
    JsonCapability {
        id: &cap.id,
        description: q.include_descriptions.then_some(cap.description.as_str()),
        tags: &cap.tags,
        input_schema: if q.include_input_schema { cap.input_schema.as_ref() } else { None },
        output_schema: if q.include_output_schema { cap.output_schema.as_ref() } else { None },
        examples: q.include_examples.then_some(cap.examples.as_slice()),
        hints: cap.hints.as_ref(),
        invocation_target: target(agent, kind, cap),
    }
}

fn json_document<'a>(page: &'a CatalogPage<'a>, q: &CapabilityQuery, now: DateTime<Utc>) -> JsonDocument<'a> {
    JsonDocument {
        discovered_at: timestamp(now),
        total_agents: page.total_agents,
        total_reasoners: page.total_reasoners,
        total_skills: page.total_skills,
        pagination: Pagination { limit: page.limit, offset: page.offset, has_more: page.has_more },
        capabilities: page
            .agents
            .iter()
            .map(|m| {
                let def = &m.record.definition;
                JsonAgent {
                    agent_id: &def.id,
                    base_url: agentmesh_server::redacted(&def.base_url),
                    version: &def.version,
                    health_status: m.health.as_str(),
                    deployment_type: def.deployment_type.as_str(),
                    last_heartbeat: timestamp(m.last_heartbeat),
                    reasoners: m
                        .reasoners
                        .iter()
                        .map(|c| json_capability(&def.id, CapabilityKind::Reasoner, c, q))
                        .collect(),
                    skills: m.skills.iter().map(|c| json_capability(&def.id, CapabilityKind::Skill, c, q)).collect(),
                }
            })
            .collect(),
    }
}

#[derive(Serialize)]
struct CompactDocument<'a> {
    discovered_at: String,
    reasoners: Vec<CompactCapability<'a>>,
    skills: Vec<CompactCapability<'a>>,
}

#[derive(Serialize)]
struct CompactCapability<'a> {
    id: &'a str,
    agent_id: &'a str,
    target: String,
    tags: &'a [String],
}

fn compact_document<'a>(page: &'a CatalogPage<'a>, now: DateTime<Utc>) -> CompactDocument<'a> {
    let mut doc = CompactDocument { discovered_at: timestamp(now), reasoners: Vec::new(), skills: Vec::new() };
    for m in &page.agents {
        let agent = m.record.id();
        let compact = |kind, c: &'a Capability| CompactCapability {
            id: &c.id,
            agent_id: agent,
            target: target(agent, kind, c),
            tags: &c.tags,
        };
        doc.reasoners.extend(m.reasoners.iter().map(|c| compact(CapabilityKind::Reasoner, c)));
        doc.skills.extend(m.skills.iter().map(|c| compact(CapabilityKind::Skill, c)));
    }
    doc
}

/// Escapes text for XML content and attribute values.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 forbids are dropped rather than emitted.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => {}
            c => out.push(c),
        }
    }
    out
}

fn xml_document(page: &CatalogPage<'_>, q: &CapabilityQuery, now: DateTime<Utc>) -> String {
    let mut x = String::with_capacity(256 + page.agents.len() * 512);
    let _ = writeln!(x, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(x, r#"<discovery discovered_at="{}">"#, timestamp(now));
    let _ = writeln!(
        x,
        r#"  <summary total_agents="{}" total_reasoners="{}" total_skills="{}"/>"#,
        page.total_agents, page.total_reasoners, page.total_skills
    );
    let _ =
        writeln!(x, r#"  <pagination limit="{}" offset="{}" has_more="{}"/>"#, page.limit, page.offset, page.has_more);
    x.push_str("  <capabilities>\n");
    for m in &page.agents {
        let def = &m.record.definition;
        let _ = writeln!(
            x,
            r#"    <agent id="{}" base_url="{}" version="{}" health_status="{}" deployment_type="{}" last_heartbeat="{}">"#,
            xml_escape(&def.id),
            xml_escape(&agentmesh_server::redacted(&def.base_url)),
            xml_escape(&def.version),
            m.health.as_str(),
            def.deployment_type.as_str(),
            timestamp(m.last_heartbeat)
        );
        for (kind, caps) in [(CapabilityKind::Reasoner, &m.reasoners), (CapabilityKind::Skill, &m.skills)] {
            let _ = writeln!(x, "      <{}s>", kind.as_str());
            for cap in caps.iter() {
                xml_capability(&mut x, &def.id, kind, cap, q);
            }
            let _ = writeln!(x, "      </{}s>", kind.as_str());
        }
        x.push_str("    </agent>\n");
    }
    x.push_str("  </capabilities>\n</discovery>\n");
    x
}

fn xml_capability(x: &mut String, agent: &str, kind: CapabilityKind, cap: &Capability, q: &CapabilityQuery) {
    let _ = writeln!(
        x,
        r#"        <{} id="{}" target="{}">"#,
        kind.as_str(),
        xml_escape(&cap.id),
        xml_escape(&target(agent, kind, cap))
    );
    if q.include_descriptions {
        let _ = writeln!(x, "          <description>{}</description>", xml_escape(&cap.description));
    }
    x.push_str("          <tags>");
    for tag in &cap.tags {
        let _ = write!(x, "<tag>{}</tag>", xml_escape(tag));
    }
    x.push_str("</tags>\n");
    if let Some(hints) = &cap.hints {
        xml_hints(x, hints);
    }
    if q.include_input_schema
        && let Some(schema) = &cap.input_schema
    {
        xml_schema(x, "input_schema", &schema.to_value());
    }
    if q.include_output_schema
        && let Some(schema) = &cap.output_schema
    {
        xml_schema(x, "output_schema", &schema.to_value());
    }
    if q.include_examples && !cap.examples.is_empty() {
        x.push_str("          <examples>\n");
        for example in &cap.examples {
            let _ = writeln!(x, "            <example>{}</example>", xml_escape(example.get()));
        }
        x.push_str("          </examples>\n");
    }
    let _ = writeln!(x, "        </{}>", kind.as_str());
}

/// The declared hints as the attributes of one `<hints/>` element.
fn xml_hints(x: &mut String, hints: &Hints) {
    x.push_str("          <hints");
    for (name, value) in [
        ("read_only", hints.read_only),
        ("destructive", hints.destructive),
        ("idempotent", hints.idempotent),
        ("open_world", hints.open_world),
        ("idempotency_key", hints.idempotency_key),
    ] {
        if let Some(value) = value {
            let _ = write!(x, r#" {name}="{value}""#);
        }
    }
    x.push_str("/>\n");
}

/// A schema as `<field>` elements: one per top-level property with its
/// type, whether it is required, its bounds and default.
fn xml_schema(x: &mut String, element: &str, schema: &Value) {
    let _ = writeln!(x, "          <{element}>");
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let _ = write!(x, r#"            <field name="{}""#, xml_escape(name));
            if let Some(t) = prop.get("type") {
                let t = t.as_str().map_or_else(|| t.to_string(), str::to_owned);
                let _ = write!(x, r#" type="{}""#, xml_escape(&t));
            }
            if required.contains(&name.as_str()) {
                x.push_str(r#" required="true""#);
            }
            for (key, attr) in [("minimum", "min"), ("maximum", "max"), ("default", "default"), ("enum", "enum")] {
                if let Some(v) = prop.get(key) {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    let _ = write!(x, r#" {attr}="{}""#, xml_escape(&v));
                }
            }
            let description = prop.get("description").and_then(Value::as_str).unwrap_or_default();
            let _ = writeln!(x, ">{}</field>", xml_escape(description));
        }
    }
    let _ = writeln!(x, "          </{element}>");
}

/// The full JSON view of one agent (GET /api/v1/agents/{id}, registration responses).
pub fn agent_json(record: &AgentRecord, health: HealthStatus) -> Value {
    let def = &record.definition;
    let caps = |kind: CapabilityKind, list: &[Capability]| -> Vec<Value> {
        list.iter()
            .map(|c| {
                let mut v = serde_json::to_value(c).unwrap_or(Value::Null);
                v["endpoint"] = Value::String(c.endpoint_or_default(kind));
                v["invocation_target"] = Value::String(target(&def.id, kind, c));
                v
            })
            .collect()
    };
    let mut agent = serde_json::json!({
        "id": def.id,
        "base_url": agentmesh_server::redact(&def.base_url),
        "transport": def.transport.as_str(),
        "version": def.version,
        "deployment_type": def.deployment_type.as_str(),
        "tags": def.tags,
        "health_status": health.as_str(),
        "last_heartbeat": timestamp(record.last_heartbeat),
        "registered_at": timestamp(record.registered_at),
        "updated_at": timestamp(record.updated_at),
        "reasoners": caps(CapabilityKind::Reasoner, &def.reasoners),
        "skills": caps(CapabilityKind::Skill, &def.skills),
    });
    if let Some(credential) = &def.credential {
        agent["credential"] = Value::String(credential.clone());
    }
    agent
}
