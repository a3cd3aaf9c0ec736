//! What an MCP server's tools are in the catalog, and what a tool's answer
//! is as a step's output.

use agentmesh_core::import::{Imported, capability_id, shortened};
use agentmesh_core::validate::MAX_DESCRIPTION_LEN;
use agentmesh_core::{Capability, Hints, RawJson, Transport};
use rmcp::model::{CallToolResult, Tool};
use serde_json::{Map, Value};

/// The tag every imported tool carries.
pub const TAG: &str = "mcp";

/// Turns `tools/list`'s answer into skills: a tool the catalog cannot hold
/// (a schema that is not one, too deeply nested, past the 1,000th) is left
/// out with the reason, and the others are kept.
pub fn import(tools: &[Tool]) -> Imported {
    let mut imported = Imported::new(Transport::Mcp);
    for tool in tools {
        let Some(id) = capability_id(&tool.name) else {
            imported.skip(&tool.name, "its name cannot be made a capability id");
            continue;
        };
        let description = match (&tool.description, &tool.title) {
            (Some(d), _) if !d.trim().is_empty() => d.trim(),
            (_, Some(title)) => title.trim(),
            _ => "",
        };
        let capability = Capability {
            id,
            description: shortened(description, MAX_DESCRIPTION_LEN),
            tags: vec![TAG.to_owned()],
            input_schema: Some(RawJson::from_value(&Value::Object((*tool.input_schema).clone()))),
            output_schema: tool.output_schema.as_ref().map(|s| RawJson::from_value(&Value::Object((**s).clone()))),
            examples: Vec::new(),
            endpoint: tool.name.to_string(),
            internal: false,
            hints: hints(tool),
        };
        imported.add(&tool.name, capability);
    }
    imported
}

/// The tool's annotations with MCP's defaults made explicit: a tool that
/// says nothing is not read-only, may be destructive, is not idempotent
/// (so it is not called twice after a timeout) and reaches the open world.
/// A read-only tool is idempotent and not destructive unless it says so.
fn hints(tool: &Tool) -> Option<Hints> {
    let annotations = tool.annotations.as_ref();
    let read_only = annotations.and_then(|a| a.read_only_hint).unwrap_or(false);
    Some(Hints {
        read_only: Some(read_only),
        destructive: Some(annotations.and_then(|a| a.destructive_hint).unwrap_or(!read_only)),
        idempotent: Some(annotations.and_then(|a| a.idempotent_hint).unwrap_or(read_only)),
        open_world: Some(annotations.and_then(|a| a.open_world_hint).unwrap_or(true)),
        idempotency_key: None,
    })
}

/// A tool's answer as a step's outcome: its `structuredContent` when it
/// has one, else its text as `{"text": …}`; an answer marked `isError`
/// is the error its text says.
pub fn read_result(result: CallToolResult) -> Result<Value, String> {
    let text: Vec<&str> = result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.as_str())).collect();
    if result.is_error == Some(true) {
        let message = if text.is_empty() {
            result
                .structured_content
                .map_or_else(|| "the tool reported an error without a message".into(), |v| v.to_string())
        } else {
            text.join("\n")
        };
        return Err(message);
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    let mut output = Map::new();
    output.insert("text".into(), Value::String(text.join("\n")));
    let others: Vec<Value> =
        result.content.iter().filter(|c| c.as_text().is_none()).filter_map(|c| serde_json::to_value(c).ok()).collect();
    if !others.is_empty() {
        output.insert("content".into(), Value::Array(others));
    }
    Ok(Value::Object(output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ContentBlock as Content, ToolAnnotations};
    use serde_json::json;
    use std::sync::Arc;

    fn tool(name: &str, annotations: Option<ToolAnnotations>) -> Tool {
        let mut tool = Tool::new(
            name.to_owned(),
            "Get the time",
            Arc::new(
                json!({"type": "object", "properties": {"timezone": {"type": "string"}}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
        );
        tool.annotations = annotations;
        tool
    }

    #[test]
    fn tools_become_skills_with_their_schema_and_hints() {
        let read_only = ToolAnnotations::new().read_only(true);
        let mut broken = tool("broken", None);
        broken.input_schema = Arc::new(json!({"type": "strng"}).as_object().cloned().unwrap_or_default());
        let imported =
            import(&[tool("get_current_time", Some(read_only)), tool("send mail!", None), tool("???", None), broken]);
        assert_eq!(imported.skills.len(), 2);
        let time = &imported.skills[0];
        assert_eq!((time.id.as_str(), time.endpoint.as_str()), ("get_current_time", "get_current_time"));
        assert_eq!(time.tags, vec!["mcp".to_owned()]);
        assert_eq!(time.hints.map(|h| (h.read_only, h.idempotent)), Some((Some(true), Some(true))));
        assert!(time.input_schema.as_ref().is_some_and(|s| s.get().contains("timezone")));
        let mail = &imported.skills[1];
        assert_eq!((mail.id.as_str(), mail.endpoint.as_str()), ("send_mail_", "send mail!"));
        // Said nothing: not read-only, not idempotent (no second call after a timeout).
        assert_eq!(
            mail.hints.map(|h| (h.read_only, h.idempotent, h.destructive, h.open_world)),
            Some((Some(false), Some(false), Some(true), Some(true)))
        );
        // A tool the catalog cannot hold is left out, the others kept.
        let skipped: Vec<&str> = imported.skipped.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(skipped, ["???", "broken"]);
        assert!(imported.skipped[1].1.contains("input_schema"), "{:?}", imported.skipped);
    }

    #[test]
    fn answers_are_structured_content_else_text_and_errors_fail() {
        let mut structured = CallToolResult::success(vec![Content::text("{\"temp\":21}")]);
        structured.structured_content = Some(json!({"temp": 21}));
        assert_eq!(read_result(structured), Ok(json!({"temp": 21})));
        let text = CallToolResult::success(vec![Content::text("350.0")]);
        assert_eq!(read_result(text), Ok(json!({"text": "350.0"})));
        let error = CallToolResult::error(vec![Content::text("unknown timezone")]);
        assert_eq!(read_result(error), Err("unknown timezone".to_owned()));
    }
}
