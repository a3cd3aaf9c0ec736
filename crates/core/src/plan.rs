//! Plans (the plan JSON contract): parsing that tolerates Markdown fences and
//! prose around the JSON, and validation against the exact set of
//! capabilities shown to the model for this request.

use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::agent::CapabilityKind;
use crate::reference;
use crate::schema::validate_instance;

/// A plan: what the planning LLM must emit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Short reasoning, or why nothing can be done (zero steps).
    #[serde(default)]
    pub reasoning: String,
    /// Steps; none is a valid plan ("nothing available can do this").
    #[serde(default)]
    pub steps: Vec<PlanStep>,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStep {
    /// Unique id within the plan.
    pub step_id: String,
    /// Agent id (exact).
    pub agent: String,
    /// Reasoner or skill id of that agent (exact).
    pub capability: String,
    /// What the step should achieve.
    #[serde(default)]
    pub instruction: String,
    /// Input, validated against the capability's input schema.
    #[serde(default = "empty_object")]
    pub parameters: Value,
    /// Steps that must succeed first.
    #[serde(default)]
    pub depends_on: Vec<String>,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

impl PlanStep {
    /// Renames steps this step mentions: its own id, its dependencies, and
    /// the `{{id.output…}}` references in its instruction and parameters.
    /// Ids missing from `renamed` stay as they are.
    pub fn rename_steps(&mut self, renamed: &HashMap<String, String>) {
        if let Some(new) = renamed.get(&self.step_id) {
            self.step_id.clone_from(new);
        }
        for dependency in &mut self.depends_on {
            if let Some(new) = renamed.get(dependency) {
                dependency.clone_from(new);
            }
        }
        self.instruction = rename_in_text(&self.instruction, renamed);
        rename_in_value(&mut self.parameters, renamed);
    }
}

fn rename_in_value(value: &mut Value, renamed: &HashMap<String, String>) {
    match value {
        Value::String(s) => *s = rename_in_text(s, renamed),
        Value::Array(items) => items.iter_mut().for_each(|v| rename_in_value(v, renamed)),
        Value::Object(map) => map.values_mut().for_each(|v| rename_in_value(v, renamed)),
        _ => {}
    }
}

fn rename_in_text(text: &str, renamed: &HashMap<String, String>) -> String {
    reference::rename_steps(text, |step| renamed.get(step).map(String::as_str))
}

/// Why an answer is not a plan at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanParseError {
    /// No JSON object anywhere in the answer.
    #[error("the answer contains no JSON object; reply with the plan as one JSON object")]
    NoJson,
    /// The JSON is malformed.
    #[error("the plan is not valid JSON: {0}")]
    Syntax(String),
    /// Valid JSON, wrong shape.
    #[error("the plan does not have the expected shape at `{path}`: {message}")]
    Shape {
        /// Where.
        path: String,
        /// What.
        message: String,
    },
}

/// The JSON object in an answer: inside a Markdown fence, or the outermost
/// `{…}` of the text when there is prose around it.
pub fn extract_json(answer: &str) -> Option<&str> {
    if let Some(start) = answer.find("```") {
        let after = &answer[start + 3..];
        let body_start = after.find('\n').map_or(0, |i| i + 1);
        if let Some(end) = after[body_start..].find("```") {
            let fenced = after[body_start..body_start + end].trim();
            if fenced.starts_with('{') {
                return Some(fenced);
            }
        }
    }
    let start = answer.find('{')?;
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in answer[start..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '{' if !in_string => depth += 1,
            '}' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    return Some(&answer[start..start + i + 1]);
                }
            }
            _ => {}
        }
    }
    None
}

/// Parses a plan from a model's answer.
pub fn parse_plan(answer: &str) -> Result<Plan, PlanParseError> {
    let json = extract_json(answer).ok_or(PlanParseError::NoJson)?;
    let value: Value = serde_json::from_str(json).map_err(|e| PlanParseError::Syntax(e.to_string()))?;
    serde_path_to_error::deserialize(value)
        .map_err(|e| PlanParseError::Shape { path: e.path().to_string(), message: e.inner().to_string() })
}

/// A capability the model was shown, and may therefore use.
#[derive(Debug, Clone, PartialEq)]
pub struct AllowedCapability {
    /// Agent id.
    pub agent: String,
    /// Capability id.
    pub capability: String,
    /// Reasoner or skill.
    pub kind: CapabilityKind,
    /// What it does.
    pub description: String,
    /// Its input schema.
    pub input_schema: Option<Value>,
}

/// One way a plan is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The agent was not in the set shown.
    UnknownAgent {
        /// Step.
        step: String,
        /// Agent named.
        agent: String,
        /// An allowed agent differing only in case.
        did_you_mean: Option<String>,
    },
    /// The agent was shown, but not with this capability.
    UnknownCapability {
        /// Step.
        step: String,
        /// Agent.
        agent: String,
        /// Capability named.
        capability: String,
        /// The agent's allowed capabilities.
        available: Vec<String>,
    },
    /// A step id is empty, too long, or has characters outside `[A-Za-z0-9_-]`.
    InvalidStepId {
        /// Step id.
        step: String,
    },
    /// Two steps share an id.
    DuplicateStepId {
        /// Step id.
        step: String,
    },
    /// A step depends on itself.
    SelfDependency {
        /// Step.
        step: String,
    },
    /// A step depends on a step that does not exist.
    UnknownDependency {
        /// Step.
        step: String,
        /// Dependency named.
        dependency: String,
    },
    /// The steps depend on each other in a loop.
    Cycle {
        /// Steps on or behind the loop.
        steps: Vec<String>,
    },
    /// Parameters do not fit the capability's input schema.
    InvalidParameters {
        /// Step.
        step: String,
        /// Each violation, `"<pointer>: <message>"`.
        errors: Vec<String>,
    },
    /// Double-braced text that reads as a reference but is not one
    /// (`{{foo}}`, `{{s1.outputs.x}}`): it would reach the agent as literal
    /// text.
    MalformedReference {
        /// Step.
        step: String,
        /// The text as written.
        text: String,
    },
    /// A `{{step.output…}}` reference names a step outside `depends_on`.
    ReferenceOutsideDependencies {
        /// Step.
        step: String,
        /// The reference.
        reference: String,
    },
}

impl PlanError {
    /// True for a model naming an agent or capability it was not shown.
    pub fn is_hallucination(&self) -> bool {
        matches!(self, Self::UnknownAgent { .. } | Self::UnknownCapability { .. })
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownAgent { step, agent, did_you_mean: Some(exact) } => write!(
                f,
                "step {step}: agent `{agent}` is not available; ids are case-sensitive, did you mean `{exact}`?"
            ),
            Self::UnknownAgent { step, agent, did_you_mean: None } => {
                write!(f, "step {step}: agent `{agent}` is not available; use only the agents listed")
            }
            Self::UnknownCapability { step, agent, capability, available } => write!(
                f,
                "step {step}: agent `{agent}` has no capability `{capability}`; it offers: {}",
                available.join(", ")
            ),
            Self::InvalidStepId { step } => {
                write!(f, "step id `{step}` must be 1-64 characters of letters, digits, `_` or `-`")
            }
            Self::DuplicateStepId { step } => write!(f, "step id `{step}` is used more than once"),
            Self::SelfDependency { step } => write!(f, "step {step} depends on itself"),
            Self::UnknownDependency { step, dependency } => {
                write!(f, "step {step} depends on `{dependency}`, which is not a step of this plan")
            }
            Self::Cycle { steps } => write!(f, "steps {} depend on each other in a cycle", steps.join(", ")),
            Self::InvalidParameters { step, errors } => {
                write!(f, "step {step}: parameters do not match the input schema: {}", errors.join("; "))
            }
            Self::MalformedReference { step, text } => write!(
                f,
                "step {step}: `{text}` is not a reference; write `{{{{<step_id>.output}}}}` or \
                 `{{{{<step_id>.output.<field>}}}}` naming a step in depends_on, or put the value itself"
            ),
            Self::ReferenceOutsideDependencies { step, reference } => {
                write!(f, "step {step} uses `{{{{{reference}}}}}` but does not list that step in depends_on")
            }
        }
    }
}

/// Pointers of values that are exactly one reference (their type is known
/// only at run time, so the schema cannot check them).
fn exact_reference_pointers(value: &Value, pointer: String, out: &mut Vec<String>) {
    match value {
        Value::String(s) if reference::is_whole_reference(s) => {
            out.push(if pointer.is_empty() { "/".into() } else { pointer });
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                exact_reference_pointers(v, format!("{pointer}/{i}"), out);
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                exact_reference_pointers(v, format!("{pointer}/{}", k.replace('~', "~0").replace('/', "~1")), out);
            }
        }
        _ => {}
    }
}

/// Safe coercions: `"5"` to 5 where the schema says integer or number,
/// `"true"` to true where it says boolean; top-level properties only.
fn coerce(parameters: &mut Value, schema: &Value) {
    let (Some(params), Some(props)) = (parameters.as_object_mut(), schema.get("properties").and_then(Value::as_object))
    else {
        return;
    };
    for (name, value) in params.iter_mut() {
        let (Some(text), Some(kind)) =
            (value.as_str(), props.get(name).and_then(|p| p.get("type")).and_then(Value::as_str))
        else {
            continue;
        };
        let text = text.trim();
        let coerced = match kind {
            "integer" => text.parse::<i64>().ok().map(Value::from),
            "number" => text.parse::<f64>().ok().filter(|n| n.is_finite()).and_then(|n| {
                if n.fract() == 0.0 && text.parse::<i64>().is_ok() {
                    text.parse::<i64>().ok().map(Value::from)
                } else {
                    serde_json::Number::from_f64(n).map(Value::Number)
                }
            }),
            "boolean" => match text {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            _ => None,
        };
        if let Some(coerced) = coerced {
            *value = coerced;
        }
    }
}

fn valid_step_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Validates a plan against the capabilities shown for this request; on
/// success returns it with parameters safely coerced. Every error is
/// reported, hallucinations first.
pub fn validate_plan(plan: &Plan, allowed: &[AllowedCapability]) -> Result<Plan, Vec<PlanError>> {
    let mut errors = Vec::new();
    let mut plan = plan.clone();
    let by_pair: HashMap<(&str, &str), &AllowedCapability> =
        allowed.iter().map(|a| ((a.agent.as_str(), a.capability.as_str()), a)).collect();
    let agents: HashSet<&str> = allowed.iter().map(|a| a.agent.as_str()).collect();
    for step in plan.steps.iter_mut() {
        let id = step.step_id.clone();
        match by_pair.get(&(step.agent.as_str(), step.capability.as_str())) {
            None if !agents.contains(step.agent.as_str()) => errors.push(PlanError::UnknownAgent {
                step: id.clone(),
                did_you_mean: agents.iter().find(|a| a.eq_ignore_ascii_case(&step.agent)).map(|a| (*a).to_owned()),
                agent: step.agent.clone(),
            }),
            None => errors.push(PlanError::UnknownCapability {
                step: id.clone(),
                agent: step.agent.clone(),
                capability: step.capability.clone(),
                available: allowed.iter().filter(|a| a.agent == step.agent).map(|a| a.capability.clone()).collect(),
            }),
            Some(cap) => {
                if !step.parameters.is_object() {
                    errors.push(PlanError::InvalidParameters {
                        step: id.clone(),
                        errors: vec!["/: parameters must be a JSON object".into()],
                    });
                } else if let Some(schema) = &cap.input_schema {
                    coerce(&mut step.parameters, schema);
                    let mut skip = Vec::new();
                    exact_reference_pointers(&step.parameters, String::new(), &mut skip);
                    let violations: Vec<String> = validate_instance(schema, &step.parameters)
                        .into_iter()
                        .filter(|e| !skip.iter().any(|p| e.starts_with(&format!("{p}:"))))
                        .collect();
                    if !violations.is_empty() {
                        errors.push(PlanError::InvalidParameters { step: id.clone(), errors: violations });
                    }
                }
            }
        }
    }
    errors.extend(structure_errors(&plan.steps));
    errors.sort_by_key(|e| !e.is_hallucination());
    if errors.is_empty() { Ok(plan) } else { Err(errors) }
}

/// Checks what holds whatever the capabilities: step ids valid and unique,
/// dependencies on existing steps other than itself, no cycle, and
/// references only to steps depended on. The executor checks every plan it
/// is given, and every extension, with it.
pub fn check_structure(plan: &Plan) -> Result<(), Vec<PlanError>> {
    let errors = structure_errors(&plan.steps);
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

fn structure_errors(steps: &[PlanStep]) -> Vec<PlanError> {
    let mut errors = Vec::new();
    let step_ids: HashSet<&str> = steps.iter().map(|s| s.step_id.as_str()).collect();
    let mut seen = HashSet::new();
    for step in steps {
        if !valid_step_id(&step.step_id) {
            errors.push(PlanError::InvalidStepId { step: step.step_id.clone() });
        } else if !seen.insert(step.step_id.as_str()) {
            errors.push(PlanError::DuplicateStepId { step: step.step_id.clone() });
        }
    }
    for step in steps {
        let id = &step.step_id;
        for dep in &step.depends_on {
            if dep == id {
                errors.push(PlanError::SelfDependency { step: id.clone() });
            } else if !step_ids.contains(dep.as_str()) {
                errors.push(PlanError::UnknownDependency { step: id.clone(), dependency: dep.clone() });
            }
        }
        for found in reference::references_in(&step.parameters) {
            if !step.depends_on.contains(&found.step) {
                let reference = found.to_string();
                let reference = reference[2..reference.len() - 2].to_owned();
                errors.push(PlanError::ReferenceOutsideDependencies { step: id.clone(), reference });
            }
        }
        for text in reference::malformed_in(&step.parameters) {
            errors.push(PlanError::MalformedReference { step: id.clone(), text });
        }
    }
    if let Some(cycle) = cycle(steps) {
        errors.push(PlanError::Cycle { steps: cycle });
    }
    errors
}

/// Steps left over by a topological sort (a cycle and what hangs on it),
/// ignoring self-dependencies and unknown ones (reported separately).
/// Kahn's algorithm: linear in steps and dependencies, so that a plan of
/// thousands of steps is checked at once.
fn cycle(steps: &[PlanStep]) -> Option<Vec<String>> {
    let index: HashMap<&str, usize> = steps.iter().enumerate().map(|(i, s)| (s.step_id.as_str(), i)).collect();
    let mut waiting = vec![0usize; steps.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (i, step) in steps.iter().enumerate() {
        let mut deps: Vec<usize> = step
            .depends_on
            .iter()
            .filter(|d| **d != step.step_id)
            .filter_map(|d| index.get(d.as_str()).copied())
            .collect();
        deps.sort_unstable();
        deps.dedup();
        waiting[i] = deps.len();
        for d in deps {
            dependents[d].push(i);
        }
    }
    let mut ready: Vec<usize> = (0..steps.len()).filter(|&i| waiting[i] == 0).collect();
    let mut done = 0;
    while let Some(i) = ready.pop() {
        done += 1;
        for &d in &dependents[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.push(d);
            }
        }
    }
    if done == steps.len() {
        return None;
    }
    let mut left: Vec<String> =
        steps.iter().enumerate().filter(|(i, _)| waiting[*i] > 0).map(|(_, s)| s.step_id.clone()).collect();
    left.sort();
    left.dedup();
    Some(left)
}

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
/// step outside `depends_on`) is left to [`validate_plan`], as is
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
    use serde_json::json;

    fn weather() -> AllowedCapability {
        AllowedCapability {
            agent: "weather-tool-v2".into(),
            capability: "get_current_weather".into(),
            kind: CapabilityKind::Skill,
            description: "Current weather for a location".into(),
            input_schema: Some(
                json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"], "additionalProperties": false}),
            ),
        }
    }

    fn math() -> AllowedCapability {
        AllowedCapability {
            agent: "calculation-agent".into(),
            capability: "evaluate".into(),
            kind: CapabilityKind::Reasoner,
            description: "Evaluates arithmetic".into(),
            input_schema: Some(
                json!({"type": "object", "properties": {"expression": {"type": "string"}, "precision": {"type": "integer"}, "exact": {"type": "boolean"}}, "required": ["expression"]}),
            ),
        }
    }

    fn step(id: &str, agent: &str, capability: &str, parameters: Value, depends_on: &[&str]) -> PlanStep {
        PlanStep {
            step_id: id.into(),
            agent: agent.into(),
            capability: capability.into(),
            instruction: String::new(),
            parameters,
            depends_on: depends_on.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn errors(steps: Vec<PlanStep>) -> Vec<PlanError> {
        validate_plan(&Plan { reasoning: String::new(), steps }, &[weather(), math()]).expect_err("invalid")
    }

    #[test]
    fn a_hallucinated_agent_is_rejected_against_the_set_shown() {
        let e = errors(vec![step("s1", "time-tool-v1", "get_time", json!({}), &[])]);
        assert_eq!(e.len(), 1);
        assert!(e[0].is_hallucination());
        assert!(e[0].to_string().contains("`time-tool-v1` is not available"), "{}", e[0]);
        let e = errors(vec![step("s1", "weather-tool-v2", "get_forecast", json!({}), &[])]);
        assert!(
            matches!(&e[0], PlanError::UnknownCapability { available, .. } if available == &["get_current_weather"])
        );
    }

    #[test]
    fn ids_are_exact_case_with_a_hint() {
        let e = errors(vec![step("s1", "Weather-Tool-V2", "get_current_weather", json!({"location": "x"}), &[])]);
        assert_eq!(
            e[0],
            PlanError::UnknownAgent {
                step: "s1".into(),
                agent: "Weather-Tool-V2".into(),
                did_you_mean: Some("weather-tool-v2".into())
            }
        );
    }

    #[test]
    fn parameters_are_checked_and_safely_coerced() {
        let e = errors(vec![step("s1", "weather-tool-v2", "get_current_weather", json!({"expression": "2+2"}), &[])]);
        let PlanError::InvalidParameters { errors: violations, .. } = &e[0] else { panic!("{e:?}") };
        assert!(violations.iter().any(|m| m.contains("location")), "{violations:?}");
        let ok = validate_plan(
            &Plan {
                reasoning: String::new(),
                steps: vec![step(
                    "s1",
                    "calculation-agent",
                    "evaluate",
                    json!({"expression": "1/3", "precision": "5", "exact": "true"}),
                    &[],
                )],
            },
            &[math()],
        )
        .expect("coerced");
        assert_eq!(ok.steps[0].parameters, json!({"expression": "1/3", "precision": 5, "exact": true}));
        let e = errors(vec![step(
            "s1",
            "calculation-agent",
            "evaluate",
            json!({"expression": "x", "precision": "five"}),
            &[],
        )]);
        assert!(matches!(&e[0], PlanError::InvalidParameters { .. }));
        let e = errors(vec![step("s1", "calculation-agent", "evaluate", json!("x"), &[])]);
        assert!(matches!(&e[0], PlanError::InvalidParameters { .. }));
    }

    #[test]
    fn graph_errors_self_dependency_cycles_unknown_and_duplicates() {
        let w = |id: &str, deps: &[&str]| {
            step(id, "weather-tool-v2", "get_current_weather", json!({"location": "Chicago"}), deps)
        };
        assert_eq!(errors(vec![w("s1", &["s1"])]), [PlanError::SelfDependency { step: "s1".into() }]);
        assert_eq!(
            errors(vec![w("s1", &["s2"]), w("s2", &["s1"])]),
            [PlanError::Cycle { steps: vec!["s1".into(), "s2".into()] }]
        );
        assert_eq!(
            errors(vec![w("s1", &["s9"])]),
            [PlanError::UnknownDependency { step: "s1".into(), dependency: "s9".into() }]
        );
        assert_eq!(errors(vec![w("s1", &[]), w("s1", &[])]), [PlanError::DuplicateStepId { step: "s1".into() }]);
        assert_eq!(errors(vec![w("step one", &[])]), [PlanError::InvalidStepId { step: "step one".into() }]);
    }

    #[test]
    fn renaming_steps_follows_ids_dependencies_and_references() {
        let mut step = PlanStep {
            step_id: "s2".into(),
            agent: "a".into(),
            capability: "c".into(),
            instruction: "Summarise {{ s1.output }} and {{s9.output.x}}".into(),
            parameters: json!({"text": "{{s1.output.body}}", "list": ["{{s1.output}} and {{s3.output}}"], "n": 3}),
            depends_on: vec!["s1".into(), "s3".into()],
        };
        let renamed: HashMap<String, String> =
            [("s1", "s7"), ("s2", "s8")].into_iter().map(|(a, b)| (a.to_owned(), b.to_owned())).collect();
        step.rename_steps(&renamed);
        assert_eq!(step.step_id, "s8");
        assert_eq!(step.depends_on, ["s7", "s3"]);
        assert_eq!(step.instruction, "Summarise {{s7.output}} and {{s9.output.x}}");
        assert_eq!(
            step.parameters,
            json!({"text": "{{s7.output.body}}", "list": ["{{s7.output}} and {{s3.output}}"], "n": 3})
        );
    }

    #[test]
    fn references_must_name_dependencies_and_are_not_type_checked() {
        let s1 = step("s1", "weather-tool-v2", "get_current_weather", json!({"location": "Chicago"}), &[]);
        let uses = |deps: &[&str]| {
            step(
                "s2",
                "calculation-agent",
                "evaluate",
                json!({"expression": "{{s1.output.temp_c}} * 9 / 5 + 32", "precision": "{{s1.output.digits}}"}),
                deps,
            )
        };
        let e = errors(vec![s1.clone(), uses(&[])]);
        assert!(e.iter().all(|e| matches!(e, PlanError::ReferenceOutsideDependencies { .. })), "{e:?}");
        assert_eq!(e.len(), 2);
        let ok =
            validate_plan(&Plan { reasoning: String::new(), steps: vec![s1, uses(&["s1"])] }, &[weather(), math()]);
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn text_that_reads_as_a_reference_but_is_not_one_is_rejected() {
        let s1 = step("s1", "weather-tool-v2", "get_current_weather", json!({"location": "Chicago"}), &[]);
        for bad in ["{{foo}}", "{{s1.outputs.x}}", "{{s1.output.}}"] {
            let s2 =
                step("s2", "calculation-agent", "evaluate", json!({"expression": "1+1", "precision": bad}), &["s1"]);
            let result =
                validate_plan(&Plan { reasoning: String::new(), steps: vec![s1.clone(), s2] }, &[weather(), math()]);
            let errors = result.expect_err(bad);
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            assert!(text.iter().any(|e| e.contains(&format!("`{bad}` is not a reference"))), "{text:?}");
        }
        let s2 = step("s2", "calculation-agent", "evaluate", json!({"expression": "x {{foo}}"}), &["s1"]);
        assert!(
            validate_plan(&Plan { reasoning: String::new(), steps: vec![s1.clone(), s2] }, &[weather(), math()])
                .is_err()
        );
        let literal = step("s2", "calculation-agent", "evaluate", json!({"expression": "{{ a | b }}"}), &["s1"]);
        assert!(
            validate_plan(&Plan { reasoning: String::new(), steps: vec![s1, literal] }, &[weather(), math()]).is_ok()
        );
    }

    #[test]
    fn zero_steps_is_a_valid_plan() {
        let plan = parse_plan(r#"{"reasoning": "nothing available tells the time", "steps": []}"#).unwrap();
        assert_eq!(validate_plan(&plan, &[weather()]).unwrap().reasoning, "nothing available tells the time");
    }

    #[test]
    fn parsing_tolerates_fences_prose_and_key_order() {
        let fenced = "Here is the plan:\n```json\n{\"steps\": [{\"depends_on\": [], \"parameters\": {\"location\": \"Chicago\"}, \"capability\": \"get_current_weather\", \"agent\": \"weather-tool-v2\", \"step_id\": \"s1\"}], \"reasoning\": \"r\"}\n```\nDone.";
        let plan = parse_plan(fenced).unwrap();
        assert_eq!(plan.steps[0].agent, "weather-tool-v2");
        let prose = "Sure! {\"steps\": [], \"reasoning\": \"a } in a string\"} hope this helps";
        assert_eq!(parse_plan(prose).unwrap().reasoning, "a } in a string");
    }

    #[test]
    fn parse_errors_say_what_is_wrong() {
        assert_eq!(parse_plan("The weather in Chicago is sunny."), Err(PlanParseError::NoJson));
        assert!(matches!(parse_plan("{\"steps\": [}"), Err(PlanParseError::NoJson | PlanParseError::Syntax(_))));
        match parse_plan(r#"{"steps": [{"step_id": "s1", "capability": "x"}]}"#) {
            Err(PlanParseError::Shape { path, message }) => {
                assert_eq!(path, "steps[0]");
                assert!(message.contains("agent"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        match parse_plan(r#"{"steps": [{"step_id": "s1", "agent": "a", "capability": "c", "depends_on": "s0"}]}"#) {
            Err(PlanParseError::Shape { path, .. }) => assert_eq!(path, "steps[0].depends_on"),
            other => panic!("{other:?}"),
        }
    }

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
