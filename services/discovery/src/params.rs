//! Parsing of the capability query string, strictly: every parameter,
//! alias, default and limit of the discovery API, and a 400 naming the
//! parameter for anything else.

use agentmesh_core::query::MAX_LIMIT;
use agentmesh_core::{CapabilityQuery, HealthStatus, Pattern};

use crate::error::DiscoveryError;
use crate::render::Format;

/// Every accepted parameter name.
pub const PARAMETERS: [&str; 18] = [
    "agent",
    "node_id",
    "agent_ids",
    "node_ids",
    "reasoner",
    "skill",
    "tags",
    "include_input_schema",
    "include_output_schema",
    "include_descriptions",
    "include_examples",
    "format",
    "health_status",
    "limit",
    "offset",
    "exclude_agents",
    "include_internal",
    "request_id",
];

const HEALTH_NAMES: [&str; 3] = ["active", "inactive", "degraded"];

fn parse_bool(name: &str, value: &str) -> Result<bool, DiscoveryError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(DiscoveryError::InvalidParameter {
            parameter: name.to_owned(),
            provided: value.to_owned(),
            message: format!("Invalid {name} parameter. Must be true or false"),
            allowed: Some(vec!["true".into(), "false".into()]),
        }),
    }
}

fn parse_count(name: &str, value: &str, min: usize, max: usize) -> Result<usize, DiscoveryError> {
    // Digits only: `10abc`, `+5`, ` 5` and `5.0` are all rejected.
    let parsed =
        (!value.is_empty() && value.bytes().all(|b| b.is_ascii_digit())).then(|| value.parse::<usize>().ok()).flatten();
    match parsed {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(DiscoveryError::invalid(
            name,
            value,
            format!("Invalid {name} parameter. Must be an integer between {min} and {max}"),
        )),
    }
}

fn split_list(value: &str) -> impl Iterator<Item = String> + '_ {
    value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned)
}

/// Parses a raw query string into a query and a format.
pub fn parse_query(raw: &str) -> Result<(CapabilityQuery, Format), DiscoveryError> {
    let mut q = CapabilityQuery::default();
    let mut format = Format::Json;
    let mut seen: Vec<String> = Vec::new();
    for (name, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        let (name, value) = (name.as_ref(), value.trim());
        if !PARAMETERS.contains(&name) {
            return Err(DiscoveryError::InvalidParameter {
                parameter: name.to_owned(),
                provided: value.to_owned(),
                message: format!("Unknown parameter {name}. Known parameters: {}", PARAMETERS.join(", ")),
                allowed: Some(PARAMETERS.iter().map(|s| (*s).to_owned()).collect()),
            });
        }
        let repeatable = matches!(name, "agent" | "node_id" | "agent_ids" | "node_ids" | "tags" | "exclude_agents");
        if !repeatable && seen.iter().any(|s| s == name) {
            return Err(DiscoveryError::invalid(name, value, format!("Parameter {name} is given more than once")));
        }
        seen.push(name.to_owned());
        if value.is_empty() {
            // An empty value means the parameter is not set.
            continue;
        }
        match name {
            "agent" | "node_id" | "agent_ids" | "node_ids" => q.agent_ids.extend(split_list(value)),
            "exclude_agents" => q.exclude_agents.extend(split_list(value)),
            "tags" => q.tags.extend(split_list(value).map(|t| Pattern::new(&t))),
            "reasoner" => q.reasoner = Some(Pattern::new(value)),
            "skill" => q.skill = Some(Pattern::new(value)),
            "include_input_schema" => q.include_input_schema = parse_bool(name, value)?,
            "include_output_schema" => q.include_output_schema = parse_bool(name, value)?,
            "include_descriptions" => q.include_descriptions = parse_bool(name, value)?,
            "include_examples" => q.include_examples = parse_bool(name, value)?,
            "include_internal" => q.include_internal = parse_bool(name, value)?,
            "format" => {
                format = Format::parse(value).ok_or_else(|| DiscoveryError::not_one_of(name, value, &Format::NAMES))?;
            }
            "health_status" => {
                q.health_status = Some(
                    HealthStatus::parse(value).ok_or_else(|| DiscoveryError::not_one_of(name, value, &HEALTH_NAMES))?,
                );
            }
            "limit" => q.limit = parse_count(name, value, 1, MAX_LIMIT)?,
            "offset" => q.offset = parse_count(name, value, 0, u32::MAX as usize)?,
            // A client-supplied request id is taken from the header or here.
            _ => {}
        }
    }
    Ok((q, format))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(raw: &str) -> (String, String) {
        match parse_query(raw) {
            Err(DiscoveryError::InvalidParameter { parameter, provided, .. }) => (parameter, provided),
            other => panic!("{raw}: expected an invalid parameter, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let (q, f) = parse_query("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f, Format::Json);
        assert_eq!((q.limit, q.offset), (100, 0));
        assert!(q.include_descriptions && !q.include_input_schema && !q.include_output_schema && !q.include_examples);
        assert!(!q.include_internal);
    }

    #[test]
    fn aliases_lists_and_patterns() {
        let (q, f) = parse_query("agent=a&node_ids=b,c&tags=ml*,*research&reasoner=*x*&format=xml&limit=50&offset=5")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q.agent_ids, ["a", "b", "c"]);
        assert_eq!(q.tags.len(), 2);
        assert_eq!(q.reasoner.as_ref().map(Pattern::as_str), Some("*x*"));
        assert_eq!((f, q.limit, q.offset), (Format::Xml, 50, 5));
        let (q, _) = parse_query("node_id=z&agent_ids=y").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q.agent_ids, ["z", "y"]);
    }

    #[test]
    fn strict_values() {
        assert_eq!(err("limit=10abc"), ("limit".into(), "10abc".into()));
        assert_eq!(err("limit=501").0, "limit");
        assert_eq!(err("limit=0").0, "limit");
        assert_eq!(err("limit=-1").0, "limit");
        assert_eq!(err("offset=x").0, "offset");
        assert_eq!(err("format=yaml"), ("format".into(), "yaml".into()));
        assert_eq!(err("include_input_schema=maybe").0, "include_input_schema");
        assert_eq!(err("health_status=sleeping").0, "health_status");
        assert_eq!(err("limitt=5").0, "limitt");
        assert_eq!(err("format=json&format=xml").0, "format");
        assert!(parse_query("limit=500&include_input_schema=TRUE&include_descriptions=0").is_ok());
    }
}
