//! JSON Schema checks: registered schemas must be JSON objects that compile,
//! and instances (such as plan parameters) are validated against them.

use serde_json::Value;

/// Checks that `schema` is a JSON object that compiles as a JSON Schema.
/// The error says what is wrong, without the field name.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err(format!("must be a JSON object, got {}", json_type_name(schema)));
    }
    jsonschema::validator_for(schema).map(|_| ()).map_err(|e| format!("is not a valid JSON Schema: {e}"))
}

/// Validates `instance` against `schema`; returns every violation as
/// `"<json pointer>: <message>"`, empty when valid. A schema that does not
/// compile is reported as a single error.
pub fn validate_instance(schema: &Value, instance: &Value) -> Vec<String> {
    match jsonschema::validator_for(schema) {
        Ok(validator) => validator
            .iter_errors(instance)
            .map(|e| {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() { "/".to_owned() } else { path };
                format!("{path}: {e}")
            })
            .collect(),
        Err(e) => vec![format!("schema does not compile: {e}")],
    }
}

/// The JSON type name of a value, as JSON Schema spells it.
pub fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_objects_that_compile() {
        let schema =
            json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]});
        assert_eq!(check_schema(&schema), Ok(()));
        assert_eq!(check_schema(&json!({})), Ok(()));
    }

    #[test]
    fn rejects_non_objects_and_broken_schemas() {
        assert!(check_schema(&json!("string")).unwrap_err().contains("JSON object"));
        assert!(check_schema(&json!([1])).unwrap_err().contains("array"));
        assert!(check_schema(&json!({"type": "strng"})).unwrap_err().contains("not a valid JSON Schema"));
        assert!(check_schema(&json!({"minimum": "five"})).is_err());
    }

    #[test]
    fn instance_errors_name_the_path() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        assert!(validate_instance(&schema, &json!({"n": 5})).is_empty());
        let errors = validate_instance(&schema, &json!({"n": "five"}));
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("/n:"), "{errors:?}");
        assert_eq!(validate_instance(&schema, &json!({})).len(), 1);
    }
}
