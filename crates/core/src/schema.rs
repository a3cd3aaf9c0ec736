//! JSON Schema checks: registered schemas must be JSON objects that compile,
//! and instances (such as plan parameters) are validated against them.

use std::sync::Arc;

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
/// compile is reported as a single error. To validate many instances
/// against one schema, compile it once ([`Schema`]).
pub fn validate_instance(schema: &Value, instance: &Value) -> Vec<String> {
    Schema::compile(schema).violations(instance)
}

/// A JSON Schema compiled once (when a capability's version is first
/// seen), to validate many instances against.
#[derive(Clone)]
pub struct Schema {
    source: Value,
    compiled: Result<Arc<jsonschema::Validator>, String>,
}

impl Schema {
    /// Compiles `schema`; one that does not compile reports so on every
    /// validation.
    pub fn compile(schema: &Value) -> Self {
        Self {
            source: schema.clone(),
            compiled: jsonschema::validator_for(schema).map(Arc::new).map_err(|e| e.to_string()),
        }
    }

    /// The schema as written.
    pub fn source(&self) -> &Value {
        &self.source
    }

    /// Every violation of `instance`, as `"<json pointer>: <message>"`;
    /// empty when it fits.
    pub fn violations(&self, instance: &Value) -> Vec<String> {
        match &self.compiled {
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
}

impl Schema {
    /// The violations of parameters as a plan writes them, before its
    /// references are resolved: a value that holds a reference
    /// (`{{s1.output…}}`) is checked only once resolved, so a violation
    /// found at one is left out.
    pub fn violations_before_references(&self, instance: &Value) -> Vec<String> {
        let Ok(validator) = &self.compiled else { return self.violations(instance) };
        validator
            .iter_errors(instance)
            .filter_map(|e| {
                let path = e.instance_path().to_string();
                let at = instance.pointer(&path);
                if at.and_then(Value::as_str).is_some_and(|s| s.contains("{{")) {
                    return None;
                }
                let path = if path.is_empty() { "/".to_owned() } else { path };
                Some(format!("{path}: {e}"))
            })
            .collect()
    }
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Schema").field(&self.source).finish()
    }
}

/// Schemas are equal when they were written alike.
impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
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

    #[test]
    fn a_schema_compiled_once_checks_many_instances() {
        let schema = Schema::compile(&json!({"type": "object", "properties": {"temp_c": {"type": "number"}}}));
        assert!(schema.violations(&json!({"temp_c": 21.5})).is_empty());
        let wrong = schema.violations(&json!({"temp_c": "warm"}));
        assert_eq!(wrong.len(), 1);
        assert!(wrong[0].starts_with("/temp_c: "), "{wrong:?}");
        let broken = Schema::compile(&json!({"type": 12}));
        assert!(broken.violations(&json!({}))[0].starts_with("schema does not compile"));
        assert_eq!(schema, Schema::compile(schema.source()));
    }
}
