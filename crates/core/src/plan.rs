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

pub use crate::plan_schema::{PlanBounds, plan_schema, step_id_at};

/// A plan: what the planning LLM must emit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// `json` with raw control characters inside its strings escaped (`\n`,
/// `\t`, `\u0001`…): models often put a raw line break in a string, which
/// JSON forbids but which means nothing else.
pub fn escape_control_in_strings(json: &str) -> std::borrow::Cow<'_, str> {
    if !json.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        match c {
            _ if escaped => {
                escaped = false;
                out.push(c);
            }
            '\\' if in_string => {
                escaped = true;
                out.push(c);
            }
            '"' => {
                in_string = !in_string;
                out.push(c);
            }
            '\n' if in_string => out.push_str("\\n"),
            '\r' if in_string => out.push_str("\\r"),
            '\t' if in_string => out.push_str("\\t"),
            c if in_string && c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Parses a plan from a model's answer.
pub fn parse_plan(answer: &str) -> Result<Plan, PlanParseError> {
    let json = extract_json(answer).ok_or(PlanParseError::NoJson)?;
    let value: Value = serde_json::from_str(json).map_err(|e| PlanParseError::Syntax(e.to_string()))?;
    serde_path_to_error::deserialize(value)
        .map_err(|e| PlanParseError::Shape { path: e.path().to_string(), message: e.inner().to_string() })
}

/// Parses a plan document written by hand (a plan file): one JSON object
/// with `steps` (and optionally `reasoning`), every key known, every
/// `parameters` an object. The error names what is wrong and where. The
/// tolerant [`parse_plan`] is for model answers only: a file that is a
/// bare list of steps, or a plan wrapped in `{"plan": …}`, must not run
/// as a plan of no steps.
pub fn parse_plan_document(text: &str) -> Result<Plan, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Document {
        #[serde(default)]
        reasoning: String,
        steps: Vec<Step>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Step {
        step_id: String,
        agent: String,
        capability: String,
        #[serde(default)]
        instruction: String,
        #[serde(default = "empty_object")]
        parameters: Value,
        #[serde(default)]
        depends_on: Vec<String>,
    }
    let value: Value = serde_json::from_str(text).map_err(|e| format!("it is not valid JSON: {e}"))?;
    match &value {
        Value::Array(_) => {
            return Err("it is a list; a plan is an object with the list as its steps: \
                 {\"reasoning\": \"…\", \"steps\": [ … ]}"
                .into());
        }
        Value::Object(map) if !map.contains_key("steps") && map.contains_key("plan") => {
            return Err(
                "the plan is wrapped in `plan`: write the object inside it (with `steps`) at the top level".into()
            );
        }
        Value::Object(map) if !map.contains_key("steps") => {
            return Err("`steps` is missing: a plan is {\"reasoning\": \"…\", \"steps\": [ … ]} \
                 (a plan that does nothing has \"steps\": [])"
                .into());
        }
        Value::Object(_) => {}
        _ => return Err("a plan is a JSON object with `steps`".into()),
    }
    let document: Document = serde_path_to_error::deserialize(value).map_err(|e| match e.path().to_string() {
        path if path == "." => e.inner().to_string(),
        path => format!("at `{path}`: {}", e.inner()),
    })?;
    let mut steps = Vec::with_capacity(document.steps.len());
    for (i, s) in document.steps.into_iter().enumerate() {
        if !s.parameters.is_object() {
            return Err(format!("at `steps[{i}].parameters`: parameters are a JSON object of named values"));
        }
        steps.push(PlanStep {
            step_id: s.step_id,
            agent: s.agent,
            capability: s.capability,
            instruction: s.instruction,
            parameters: s.parameters,
            depends_on: s.depends_on,
        });
    }
    Ok(Plan { reasoning: document.reasoning, steps })
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

impl AllowedCapability {
    /// A skill without an input schema (what a ranking reads: ids and description).
    pub fn skill(agent: &str, capability: &str, description: &str) -> Self {
        Self {
            agent: agent.into(),
            capability: capability.into(),
            kind: CapabilityKind::Skill,
            description: description.into(),
            input_schema: None,
        }
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plan_files_are_read_strictly_and_say_what_is_wrong() {
        let step = r#"{"step_id": "s1", "agent": "a", "capability": "c", "parameters": {"x": 1}}"#;
        let plan = parse_plan_document(&format!(r#"{{"reasoning": "r", "steps": [{step}]}}"#)).unwrap();
        assert_eq!(plan.steps[0].parameters, json!({"x": 1}));
        assert!(parse_plan_document(r#"{"steps": []}"#).unwrap().steps.is_empty());
        for (text, says) in [
            (format!("[{step}]"), "it is a list"),
            (format!(r#"{{"plan": {{"steps": [{step}]}}}}"#), "wrapped in `plan`"),
            (r#"{"reasoning": "r"}"#.to_owned(), "`steps` is missing"),
            (
                r#"{"steps": [{"step_id": "s1", "agent": "a", "capability": "c", "tool": 1}]}"#.to_owned(),
                "at `steps[0].tool`: unknown field `tool`",
            ),
            (r#"{"steps": [{"step_id": "s1", "agent": "a"}]}"#.to_owned(), "missing field `capability`"),
            (
                r#"{"steps": [{"step_id": "s1", "agent": "a", "capability": "c", "parameters": [1]}]}"#.to_owned(),
                "`steps[0].parameters`",
            ),
            ("{".to_owned(), "not valid JSON"),
        ] {
            let err = parse_plan_document(&text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn raw_control_characters_in_strings_are_escaped() {
        let raw = "{\"summary\": \"line one\nline\ttwo\u{1}\",\n \"ok\": true}";
        let fixed = escape_control_in_strings(raw);
        let value: Value = serde_json::from_str(&fixed).unwrap();
        assert_eq!(value["summary"], "line one\nline\ttwo\u{1}");
        assert!(matches!(escape_control_in_strings("{\"a\": 1}"), std::borrow::Cow::Borrowed(_)));
    }

    pub(crate) fn weather() -> AllowedCapability {
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

    pub(crate) fn math() -> AllowedCapability {
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
}
