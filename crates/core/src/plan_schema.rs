//! The schema sent with a planning call, shaped so that a plan which does
//! not hold together cannot be written under a grammar, and the bounds that
//! size it (and the token budget of the call).

use serde_json::{Map, Value};

use crate::plan::AllowedCapability;

/// How large a plan the planning schema admits, so that any answer that
/// fits it also fits the token budget derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanBounds {
    /// Most steps.
    pub max_steps: usize,
    /// Longest `instruction`, in characters.
    pub instruction_chars: usize,
    /// Longest `reasoning`, in characters.
    pub reasoning_chars: usize,
    /// Longest string parameter whose schema sets no bound of its own.
    pub parameter_chars: usize,
}

impl Default for PlanBounds {
    fn default() -> Self {
        Self { max_steps: 6, instruction_chars: 120, reasoning_chars: 160, parameter_chars: 120 }
    }
}

impl PlanBounds {
    /// Tighter bounds, for a retry after an answer was cut off: half the
    /// steps and text.
    pub fn tighter(self) -> Self {
        Self {
            max_steps: (self.max_steps / 2).max(1),
            instruction_chars: (self.instruction_chars / 2).max(20),
            reasoning_chars: (self.reasoning_chars / 2).max(20),
            parameter_chars: (self.parameter_chars / 2).max(20),
        }
    }

    /// Tokens enough for the longest answer the schema admits over
    /// `allowed`: every character counted as a token for text (the worst
    /// case of a byte-level tokenizer on unusual text is worse, but models
    /// do not write such instructions), plus the JSON around it.
    pub fn max_tokens(&self, allowed: &[AllowedCapability]) -> u32 {
        let largest_step = allowed
            .iter()
            .map(|a| {
                let parameters = a.input_schema.as_ref().map_or(2, |s| schema_size(s, self.parameter_chars, 0));
                a.agent.len() + a.capability.len() + parameters
            })
            .max()
            .unwrap_or(0);
        // Keys, quotes, brackets and a few dependencies per step.
        let per_step = 90 + self.max_steps * 6 + self.instruction_chars + largest_step;
        let total = 40 + self.reasoning_chars + self.max_steps * per_step;
        u32::try_from(total / 2 + 64).unwrap_or(u32::MAX)
    }
}

/// The longest text (in characters) a value fitting `schema` takes, with
/// unbounded strings counted at `string_chars` and unbounded collections at
/// a few items: an estimate for [`PlanBounds::max_tokens`].
fn schema_size(schema: &Value, string_chars: usize, depth: usize) -> usize {
    if depth > 8 {
        return 16;
    }
    let branches = schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(Value::as_array);
    if let Some(branches) = branches {
        return branches.iter().map(|b| schema_size(b, string_chars, depth + 1)).max().unwrap_or(16);
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.iter().map(|v| v.to_string().len()).max().unwrap_or(2);
    }
    if let Some(value) = schema.get("const") {
        return value.to_string().len();
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => {
            schema.get("maxLength").and_then(Value::as_u64).map_or(string_chars, |n| n as usize).min(4 * string_chars)
                + 2
        }
        Some("integer" | "number") => 12,
        Some("boolean") => 5,
        Some("null") => 4,
        Some("array") => {
            let items = schema.get("items").map_or(16, |i| schema_size(i, string_chars, depth + 1));
            let count = schema.get("maxItems").and_then(Value::as_u64).map_or(4, |n| (n as usize).min(8));
            2 + count * (items + 1)
        }
        _ => match properties {
            Some(properties) => {
                2 + properties.iter().map(|(k, v)| k.len() + 4 + schema_size(v, string_chars, depth + 1)).sum::<usize>()
            }
            None => 16,
        },
    }
}

/// The id of the step at 0-based `position`: `s1`, `s2`, …
pub fn step_id_at(position: usize) -> String {
    format!("s{}", position + 1)
}

/// `schema` with every string that has no bound of its own bounded to
/// `chars` (and not empty), so that generation under a grammar ends.
/// (Validation uses the capability's own schema.)
fn bounded(schema: &Value, chars: usize) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out: Map<String, Value> =
                map.iter().map(|(k, v)| (k.clone(), bounded_child(k, v, chars))).collect();
            let is_string = map.get("type").and_then(Value::as_str) == Some("string");
            let free = ["maxLength", "enum", "const", "pattern", "format"].iter().all(|k| !map.contains_key(*k));
            if is_string && free {
                out.insert("maxLength".into(), Value::from(chars));
                // An empty value is what a small model writes when unsure.
                out.entry("minLength").or_insert(Value::from(1));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn bounded_child(key: &str, value: &Value, chars: usize) -> Value {
    match (key, value) {
        ("properties" | "$defs" | "definitions" | "patternProperties", Value::Object(map)) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), bounded(v, chars))).collect())
        }
        ("items" | "additionalProperties" | "not" | "if" | "then" | "else" | "contains", v) => bounded(v, chars),
        ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(items)) => {
            Value::Array(items.iter().map(|v| bounded(v, chars)).collect())
        }
        (_, v) => v.clone(),
    }
}

/// An array that must be empty. (`items` is given because llama.cpp's
/// converter turns an array schema without it into "any JSON array".)
fn empty_array() -> Value {
    serde_json::json!({"type": "array", "items": {"type": "string"}, "maxItems": 0})
}

/// A whole-value reference to the output of one of `earlier` steps.
fn reference_schema(earlier: &[String]) -> Value {
    serde_json::json!({
        "type": "string",
        // Brackets rather than backslash escapes: llama.cpp's grammar parser
        // refuses `\.` in the grammar its converter writes.
        "pattern": format!("^[{{][{{]({})[.]output([.][A-Za-z0-9_]{{1,32}}){{0,3}}[}}][}}]$", earlier.join("|")),
    })
}

/// A capability's parameters for the step at `position`: its input schema,
/// strings bounded, and each top-level property that is not a string also
/// allowed to be a whole reference to an earlier step.
fn step_parameters(capability: &AllowedCapability, earlier: &[String], bounds: &PlanBounds) -> Value {
    let Some(schema) = &capability.input_schema else {
        // Nothing says what it takes: an empty object, so generation ends;
        // the instruction carries the request.
        return serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false});
    };
    let mut schema = bounded(schema, bounds.parameter_chars);
    if earlier.is_empty() {
        return schema;
    }
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for property in properties.values_mut() {
            let is_string = property.get("type").and_then(Value::as_str) == Some("string");
            if !is_string && property.is_object() {
                *property = serde_json::json!({"anyOf": [property.take(), reference_schema(earlier)]});
            }
        }
    }
    schema
}

/// The schema sent with a planning call. Its shape makes a plan that does
/// not hold together impossible to write under a grammar (llama.cpp and
/// servers built on it enforce all of it):
///
/// - `steps` is one of the tuples `[]`, `[step 1]`, `[step 1, step 2]`, …
///   up to `bounds.max_steps` (`prefixItems`: the form llama.cpp's
///   JSON-Schema-to-grammar enforces; it ignores `minItems`/`maxItems`
///   beside `prefixItems`);
/// - the step at position `i` has the id `s<i>` (`const`) and depends only
///   on the ids of earlier steps (`enum`), so self-dependencies, unknown
///   dependencies, duplicate ids and cycles cannot be written;
/// - every step is one of the allowed `(agent, capability)` pairs (`const`),
///   with that capability's input schema as its parameters, a non-string
///   parameter also admitting a whole reference `{{sK.output…}}` to an
///   earlier step;
/// - free text is bounded, so [`PlanBounds::max_tokens`] fits any answer.
///
/// What a grammar cannot express (a reference inside a string naming a
/// step outside `depends_on`) is left to [`crate::plan::validate_plan`], as is
/// everything for providers that enforce less.
pub fn plan_schema(allowed: &[AllowedCapability], bounds: &PlanBounds) -> Value {
    let max_steps = if allowed.is_empty() { 0 } else { bounds.max_steps };
    let mut defs = Map::new();
    for position in 0..max_steps {
        let earlier: Vec<String> = (0..position).map(step_id_at).collect();
        let depends_on = if earlier.is_empty() {
            empty_array()
        } else {
            serde_json::json!({"type": "array", "items": {"type": "string", "enum": earlier}, "maxItems": position})
        };
        let branches: Vec<Value> = allowed
            .iter()
            .map(|a| {
                // Properties in the order a model writes them (grammars keep
                // it): the tool, then its parameters while the request is
                // fresh, then dependencies and the instruction.
                serde_json::json!({
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["step_id", "agent", "capability", "parameters", "depends_on", "instruction"],
                    "properties": {
                        "step_id": {"type": "string", "const": step_id_at(position)},
                        "agent": {"type": "string", "const": a.agent},
                        "capability": {"type": "string", "const": a.capability},
                        "parameters": step_parameters(a, &earlier, bounds),
                        "depends_on": depends_on,
                        "instruction": {"type": "string", "maxLength": bounds.instruction_chars},
                    }
                })
            })
            .collect();
        defs.insert(format!("step{}", position + 1), serde_json::json!({"anyOf": branches}));
    }
    let tuples: Vec<Value> = (0..=max_steps)
        .map(|len| {
            if len == 0 {
                return empty_array();
            }
            let items: Vec<Value> =
                (0..len).map(|i| serde_json::json!({"$ref": format!("#/$defs/step{}", i + 1)})).collect();
            serde_json::json!({"type": "array", "prefixItems": items, "items": false, "minItems": len, "maxItems": len})
        })
        .collect();
    // The steps first: a small model that writes its reasoning first talks
    // itself out of the plan.
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["steps", "reasoning"],
        "properties": {
            "steps": {"anyOf": tuples},
            "reasoning": {"type": "string", "minLength": 1, "maxLength": bounds.reasoning_chars},
        },
        "$defs": defs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::{math, weather};
    use crate::schema::validate_instance;
    use serde_json::json;

    fn schema_errors(schema: &Value, plan: Value) -> Vec<String> {
        validate_instance(schema, &plan)
    }

    fn w(id: &str, deps: &[&str]) -> Value {
        json!({"step_id": id, "agent": "weather-tool-v2", "capability": "get_current_weather", "instruction": "i",
            "parameters": {"location": "Chicago"}, "depends_on": deps})
    }

    #[test]
    fn the_constrained_schema_admits_only_allowed_pairs_with_their_parameters() {
        let schema = plan_schema(&[weather(), math()], &PlanBounds::default());
        let good = json!({"reasoning": "r", "steps": [w("s1", &[])]});
        assert!(schema_errors(&schema, good.clone()).is_empty(), "{:?}", schema_errors(&schema, good.clone()));
        let invented = json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": "time-tool-v1", "capability": "get_current_weather", "instruction": "i", "parameters": {"location": "x"}, "depends_on": []}]});
        assert!(!schema_errors(&schema, invented).is_empty());
        let wrong_params = json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather", "instruction": "i", "parameters": {"expression": "x"}, "depends_on": []}]});
        assert!(!schema_errors(&schema, wrong_params).is_empty());
        let empty = plan_schema(&[], &PlanBounds::default());
        assert!(schema_errors(&empty, json!({"reasoning": "nothing fits", "steps": []})).is_empty());
        assert!(!schema_errors(&empty, good).is_empty(), "no capability: only zero steps fit");
    }

    #[test]
    fn the_constrained_schema_makes_broken_graphs_unwritable() {
        let schema = plan_schema(&[weather(), math()], &PlanBounds { max_steps: 3, ..PlanBounds::default() });
        let plan = |steps: Vec<Value>| json!({"reasoning": "r", "steps": steps});
        assert!(schema_errors(&schema, plan(vec![w("s1", &[]), w("s2", &["s1"]), w("s3", &["s1", "s2"])])).is_empty());
        for (what, steps) in [
            ("self-dependency", vec![w("s1", &["s1"])]),
            ("forward dependency", vec![w("s1", &["s2"]), w("s2", &[])]),
            ("unknown dependency", vec![w("s1", &[]), w("s2", &["s9"])]),
            ("duplicate id", vec![w("s1", &[]), w("s1", &[])]),
            ("ids out of order", vec![w("s2", &[]), w("s1", &[])]),
            ("too many steps", vec![w("s1", &[]), w("s2", &[]), w("s3", &[]), w("s4", &[])]),
        ] {
            assert!(!schema_errors(&schema, plan(steps)).is_empty(), "{what} fits the schema");
        }
        let long = "x".repeat(PlanBounds::default().instruction_chars + 1);
        let mut step = w("s1", &[]);
        step["instruction"] = json!(long);
        assert!(!schema_errors(&schema, plan(vec![step])).is_empty(), "instructions are bounded");
        assert!(!schema_errors(&schema, json!({"reasoning": "", "steps": []})).is_empty(), "zero steps say why");
    }

    #[test]
    fn non_string_parameters_take_whole_references_to_earlier_steps_only() {
        let schema = plan_schema(&[weather(), math()], &PlanBounds::default());
        let calc = |precision: &str, deps: &[&str]| {
            json!({"step_id": "s2", "agent": "calculation-agent", "capability": "evaluate", "instruction": "i",
                "parameters": {"expression": "{{s1.output.temp}} * 2", "precision": precision}, "depends_on": deps})
        };
        let plan = |step: Value| json!({"reasoning": "r", "steps": [w("s1", &[]), step]});
        assert!(schema_errors(&schema, plan(calc("{{s1.output.digits}}", &["s1"]))).is_empty());
        assert!(!schema_errors(&schema, plan(calc("{{s2.output.digits}}", &["s1"]))).is_empty(), "not itself");
        assert!(!schema_errors(&schema, plan(calc("{{foo}}", &["s1"]))).is_empty(), "not a malformed one");
        let first = json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": "calculation-agent",
            "capability": "evaluate", "instruction": "i", "parameters": {"expression": "1", "precision": "{{s1.output}}"},
            "depends_on": []}]});
        assert!(!schema_errors(&schema, first).is_empty(), "the first step has nothing to refer to");
        // llama.cpp's grammar parser refuses the backslash escapes a converted
        // pattern would carry.
        assert!(!schema.to_string().contains('\\'), "no backslash in the schema");
    }

    #[test]
    fn the_token_budget_grows_with_the_bounds() {
        let allowed = [weather(), math()];
        let default = PlanBounds::default();
        let budget = default.max_tokens(&allowed);
        assert!(budget > 400 && budget < 4096, "{budget}");
        assert!(default.tighter().max_tokens(&allowed) < budget);
        assert!(PlanBounds { max_steps: 1, ..default }.max_tokens(&allowed) < budget);
    }
}
