//! Validation of a registration: every problem is reported with the field
//! it concerns, all at once.

use std::collections::HashSet;

use serde::Serialize;

use crate::agent::{AgentDefinition, Capability, CapabilityKind};
use crate::schema::check_schema;

/// Longest agent or capability id.
pub const MAX_ID_LEN: usize = 128;
/// Most capabilities one agent may register.
pub const MAX_CAPABILITIES: usize = 1_000;
/// Most tags on an agent or capability.
pub const MAX_TAGS: usize = 64;
/// Longest tag.
pub const MAX_TAG_LEN: usize = 64;
/// Longest description.
pub const MAX_DESCRIPTION_LEN: usize = 8_192;
/// Longest MCP tool name an `mcp` agent's endpoint may hold.
pub const MAX_TOOL_NAME_LEN: usize = 256;
/// Longest version string.
pub const MAX_VERSION_LEN: usize = 64;

/// Deepest nesting of objects and arrays accepted in a schema, an example
/// or any JSON a client sends (`1` for `{}`). Every consumer must be able
/// to decode what is accepted: carried as a protobuf `Struct`, each JSON
/// level costs two or three of the 100 levels a protobuf decoder allows,
/// and messages around it a few more.
pub const MAX_JSON_DEPTH: usize = 24;

/// How deeply `value` nests objects and arrays (`0` for a scalar).
/// Iterative: safe on any value, however deep.
pub fn json_depth(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(value, 1usize)];
    while let Some((value, depth)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
            serde_json::Value::Object(fields) => Box::new(fields.values()),
            serde_json::Value::Array(items) => Box::new(items.iter()),
            _ => continue,
        };
        deepest = deepest.max(depth);
        pending.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

/// How deeply JSON text nests objects and arrays, read off its brackets
/// (outside strings) without parsing it: what [`json_depth`] says of the
/// value, for text known to be JSON.
pub fn json_text_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for byte in text.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// `value`'s nesting checked against [`MAX_JSON_DEPTH`]: the message names
/// the limit, for an `INVALID_ARGUMENT` or a field error.
pub fn check_json_depth(value: &serde_json::Value) -> Result<(), String> {
    let depth = json_depth(value);
    if depth > MAX_JSON_DEPTH {
        return Err(format!("nests objects and arrays {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted"));
    }
    Ok(())
}

/// One problem with one field of a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// Path of the field, e.g. `skills[2].input_schema`.
    pub field: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl FieldError {
    /// Builds a field error.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// Checks an id: 1–128 characters of `[A-Za-z0-9._-]`, starting with a
/// letter or digit. Returns what is wrong.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("must not be empty".into());
    }
    if id.len() > MAX_ID_LEN {
        return Err(format!("must be at most {MAX_ID_LEN} characters, got {}", id.len()));
    }
    if !id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must start with a letter or digit".into());
    }
    if let Some(bad) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!("may contain only letters, digits, '.', '_' and '-', found {bad:?}"));
    }
    Ok(())
}

/// Validates a registration; returns every error found.
pub fn validate_definition(def: &AgentDefinition) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    if let Err(e) = check_id(&def.id) {
        errors.push(FieldError::new("id", e));
    }
    check_base_url(&def.base_url, &mut errors);
    if def.version.len() > MAX_VERSION_LEN {
        errors.push(FieldError::new("version", format!("must be at most {MAX_VERSION_LEN} characters")));
    }
    check_tags("tags", &def.tags, &mut errors);
    if let Some(credential) = &def.credential
        && let Err(e) = check_id(credential)
    {
        errors.push(FieldError::new(
            "credential",
            format!("{e}: it names one of the executor's agent credentials, never the secret itself"),
        ));
    }
    let count = def.reasoners.len() + def.skills.len();
    if count > MAX_CAPABILITIES {
        errors.push(FieldError::new(
            "skills",
            format!("an agent may register at most {MAX_CAPABILITIES} capabilities, got {count}"),
        ));
    }
    let mut seen = HashSet::new();
    for (kind, list) in [(CapabilityKind::Reasoner, &def.reasoners), (CapabilityKind::Skill, &def.skills)] {
        for (i, cap) in list.iter().enumerate() {
            let field = format!("{}s[{i}]", kind.as_str());
            if !seen.insert(cap.id.as_str()) {
                errors.push(FieldError::new(
                    format!("{field}.id"),
                    format!("capability id `{}` is used twice; ids must be unique across reasoners and skills", cap.id),
                ));
            }
            check_capability(&field, cap, def.transport, &mut errors);
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

fn check_base_url(base_url: &str, errors: &mut Vec<FieldError>) {
    match url::Url::parse(base_url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some_and(|h| !h.is_empty()) => {}
        Ok(url) if !matches!(url.scheme(), "http" | "https") => errors
            .push(FieldError::new("base_url", format!("must be an http or https URL, got scheme `{}`", url.scheme()))),
        Ok(_) => errors.push(FieldError::new("base_url", "must name a host")),
        Err(e) => errors.push(FieldError::new("base_url", format!("must be an http or https URL: {e}"))),
    }
}

fn check_tags(field: &str, tags: &[String], errors: &mut Vec<FieldError>) {
    if tags.len() > MAX_TAGS {
        errors.push(FieldError::new(field, format!("at most {MAX_TAGS} tags are allowed")));
    }
    for (i, tag) in tags.iter().enumerate() {
        if tag.is_empty() || tag.len() > MAX_TAG_LEN || tag.contains(',') {
            errors.push(FieldError::new(
                format!("{field}[{i}]"),
                format!("tags must be 1-{MAX_TAG_LEN} characters without commas"),
            ));
        }
    }
}

fn check_capability(field: &str, cap: &Capability, transport: crate::Transport, errors: &mut Vec<FieldError>) {
    if let Err(e) = check_id(&cap.id) {
        errors.push(FieldError::new(format!("{field}.id"), e));
    }
    if cap.description.len() > MAX_DESCRIPTION_LEN {
        errors.push(FieldError::new(
            format!("{field}.description"),
            format!("must be at most {MAX_DESCRIPTION_LEN} bytes"),
        ));
    }
    check_tags(&format!("{field}.tags"), &cap.tags, errors);
    for (name, schema) in [("input_schema", &cap.input_schema), ("output_schema", &cap.output_schema)] {
        if let Some(schema) = schema {
            let schema = schema.to_value();
            if let Err(e) = check_json_depth(&schema).and_then(|()| check_schema(&schema)) {
                errors.push(FieldError::new(format!("{field}.{name}"), e));
            }
        }
    }
    for (i, example) in cap.examples.iter().enumerate() {
        let example = example.to_value();
        if !example.is_object() {
            errors.push(FieldError::new(format!("{field}.examples[{i}]"), "must be a JSON object"));
        } else if let Err(e) = check_json_depth(&example) {
            errors.push(FieldError::new(format!("{field}.examples[{i}]"), e));
        }
    }
    if transport.is_imported() {
        // An MCP tool's or an A2A skill's endpoint is its name, as the agent spells it.
        if cap.endpoint.is_empty() || cap.endpoint.len() > MAX_TOOL_NAME_LEN || cap.endpoint.contains(char::is_control)
        {
            errors.push(FieldError::new(
                format!("{field}.endpoint"),
                format!(
                    "must be the MCP tool's or A2A skill's name: 1-{MAX_TOOL_NAME_LEN} bytes without control characters"
                ),
            ));
        }
    } else if !cap.endpoint.is_empty() && (!cap.endpoint.starts_with('/') || cap.endpoint.contains(char::is_whitespace))
    {
        errors.push(FieldError::new(format!("{field}.endpoint"), "must be an absolute path such as /skills/my_skill"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn definition(value: serde_json::Value) -> AgentDefinition {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_design_example_is_valid() {
        let def = definition(json!({
            "id": "weather-tool-v2", "base_url": "http://127.0.0.1:9001", "transport": "http",
            "version": "2.0.0", "deployment_type": "long_running", "tags": ["weather"], "reasoners": [],
            "skills": [{"id": "get_current_weather", "description": "Current weather for a location",
                "tags": ["weather", "data"],
                "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
                "output_schema": {"type": "object", "properties": {"temp_c": {"type": "number"}}},
                "internal": false}]
        }));
        assert_eq!(validate_definition(&def), Ok(()));
    }

    #[test]
    fn every_error_names_its_field() {
        let def = definition(json!({
            "id": "bad id!", "base_url": "ftp://x",
            "reasoners": [{"id": "dup"}],
            "skills": [{"id": "dup", "input_schema": {"type": "strng"}, "output_schema": [1], "endpoint": "nope"}]
        }));
        let errors = validate_definition(&def).expect_err("invalid");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "id",
                "base_url",
                "skills[0].id",
                "skills[0].input_schema",
                "skills[0].output_schema",
                "skills[0].endpoint"
            ]
        );
    }

    #[test]
    fn schemas_and_examples_nested_too_deep_for_any_consumer_are_refused() {
        fn nested(levels: usize) -> serde_json::Value {
            let mut schema = serde_json::json!({"type": "string"});
            // Each `properties` level adds two objects.
            for _ in 1..levels.div_ceil(2) {
                schema = serde_json::json!({"type": "object", "properties": {"a": schema}});
            }
            schema
        }
        assert_eq!(json_depth(&nested(MAX_JSON_DEPTH)), MAX_JSON_DEPTH - 1);
        assert_eq!(json_depth(&serde_json::json!([[1], {"a": {}}])), 3);
        assert_eq!(json_depth(&serde_json::json!(1)), 0);
        let ok = definition(serde_json::json!({"id": "a", "base_url": "http://a:1",
            "skills": [{"id": "s", "input_schema": nested(MAX_JSON_DEPTH)}]}));
        assert_eq!(validate_definition(&ok), Ok(()));
        let mut example = serde_json::json!(1);
        for _ in 0..25 {
            example = serde_json::json!([example]);
        }
        let deep = definition(serde_json::json!({"id": "a", "base_url": "http://a:1",
            "skills": [{"id": "s", "input_schema": nested(40), "examples": [{"x": example}]}]}));
        let errors = validate_definition(&deep).expect_err("too deep");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["skills[0].input_schema", "skills[0].examples[0]"]);
        assert!(errors[0].message.contains("at most 24"), "{}", errors[0].message);
    }

    #[test]
    fn an_mcp_server_registers_without_capabilities_and_hints_are_accepted() {
        // An MCP agent's capabilities are its tools, listed by the server.
        let def = definition(json!({"id": "files", "base_url": "http://127.0.0.1:9002/mcp", "transport": "mcp"}));
        assert_eq!(def.transport, crate::agent::Transport::Mcp);
        assert_eq!(validate_definition(&def), Ok(()));
        let hinted = definition(json!({"id": "shop", "base_url": "http://a:1",
            "skills": [{"id": "charge", "hints": {"read_only": false, "destructive": false, "idempotent": false}}]}));
        assert_eq!(validate_definition(&hinted), Ok(()));
        // A tool's endpoint is its name, spelled as the server does.
        let tool = |endpoint: &str| {
            definition(json!({"id": "t", "base_url": "http://a:1/mcp", "transport": "mcp",
                "skills": [{"id": "send_mail_", "endpoint": endpoint}]}))
        };
        assert_eq!(validate_definition(&tool("send mail!")), Ok(()));
        let fields = |def| validate_definition(&def).err().map(|e| e.into_iter().map(|e| e.field).collect::<Vec<_>>());
        assert_eq!(fields(tool("")), Some(vec!["skills[0].endpoint".to_owned()]));
        assert_eq!(fields(tool("bell\u{7}")), Some(vec!["skills[0].endpoint".to_owned()]));
    }

    #[test]
    fn ids() {
        assert!(check_id("agent-research-001").is_ok());
        assert!(check_id("a.b_c-d").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id("-lead").is_err());
        assert!(check_id("has space").is_err());
        assert!(check_id("colon:no").is_err());
        assert!(check_id(&"x".repeat(129)).is_err());
    }

    #[test]
    fn base_url_needs_http_and_a_host() {
        for (url, ok) in [
            ("https://a.example:8443/x", true),
            ("http://127.0.0.1:1", true),
            ("file:///etc", false),
            ("not a url", false),
            ("", false),
        ] {
            let def =
                AgentDefinition { base_url: url.into(), ..definition(json!({"id": "a", "base_url": "http://x"})) };
            assert_eq!(validate_definition(&def).is_ok(), ok, "{url}");
        }
    }
}
