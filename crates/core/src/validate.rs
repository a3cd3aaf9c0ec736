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
/// Longest version string.
pub const MAX_VERSION_LEN: usize = 64;

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
            check_capability(&field, cap, &mut errors);
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

fn check_capability(field: &str, cap: &Capability, errors: &mut Vec<FieldError>) {
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
        if let Some(schema) = schema
            && let Err(e) = check_schema(&schema.to_value())
        {
            errors.push(FieldError::new(format!("{field}.{name}"), e));
        }
    }
    for (i, example) in cap.examples.iter().enumerate() {
        if !example.is_object() {
            errors.push(FieldError::new(format!("{field}.examples[{i}]"), "must be a JSON object"));
        }
    }
    if !cap.endpoint.is_empty() && (!cap.endpoint.starts_with('/') || cap.endpoint.contains(char::is_whitespace)) {
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
