//! References from a step's parameters (or instruction) to the output of a
//! step it depends on: `{{s1.output}}`, `{{s1.output.temp_c}}`,
//! `{{s1.output.items.0.name}}` or `{{s1.output.items[0].name}}`.
//!
//! A value that is exactly one reference becomes the referenced JSON value,
//! type kept; a reference inside a longer string becomes its text (a string
//! as it is, anything else as compact JSON). Braces that do not hold
//! `<step>.output…` are left as they are.

use std::fmt;

use serde_json::Value;

/// One `{{step.output…}}` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The step whose output is referenced.
    pub step: String,
    /// Field names and array indices below `output`.
    pub path: Vec<String>,
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{{{}.output", self.step)?;
        for segment in &self.path {
            write!(f, ".{segment}")?;
        }
        write!(f, "}}}}")
    }
}

/// A piece of a template string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Literal text.
    Text(&'a str),
    /// A reference, and its text as written (braces included).
    Ref(Reference, &'a str),
}

/// True when the inside of `{{…}}` reads as an attempt at a reference: no
/// spaces inside, starting with a name (`foo`, `s1.outputs.x`, `s1[0]`).
/// Such text that is not a valid reference is an error in a plan, where
/// double braces are reserved for references; other braces (`{{ a | b }}`)
/// are literal text.
fn looks_like_reference(inner: &str) -> bool {
    let inner = inner.trim();
    let name_end = inner.find(['.', '[']).unwrap_or(inner.len());
    name_end > 0
        && !inner.contains(char::is_whitespace)
        && inner[..name_end].chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Parses the inside of `{{…}}`; `None` when it is not a step output reference.
fn parse_inner(inner: &str) -> Option<Reference> {
    let inner = inner.trim();
    let (step, rest) = inner.split_once('.')?;
    let rest = rest.strip_prefix("output")?;
    if step.is_empty() || !step.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return None;
    }
    let mut path = Vec::new();
    let mut rest = rest;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() {
                return None;
            }
            path.push(name.to_owned());
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let close = after.find(']')?;
            let index = after[..close].trim();
            if index.is_empty() || !index.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            path.push(index.to_owned());
            rest = &after[close + 1..];
        } else {
            // `{{s1.outputs}}`, `{{s1.output_x}}`: not a reference.
            return None;
        }
    }
    Some(Reference { step: step.to_owned(), path })
}

/// Splits `text` into literal pieces and references.
pub fn parse(text: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut rest = text;
    let mut literal_start = 0;
    let mut offset = 0;
    while let Some(open) = rest.find("{{") {
        let Some(close) = rest[open + 2..].find("}}") else { break };
        let inner = &rest[open + 2..open + 2 + close];
        let end = open + 2 + close + 2;
        if let Some(reference) = parse_inner(inner) {
            if offset + open > literal_start {
                pieces.push(Piece::Text(&text[literal_start..offset + open]));
            }
            pieces.push(Piece::Ref(reference, &text[offset + open..offset + end]));
            literal_start = offset + end;
        }
        offset += end;
        rest = &rest[end..];
    }
    if literal_start < text.len() {
        pieces.push(Piece::Text(&text[literal_start..]));
    }
    pieces
}

/// Every reference in a JSON value (strings at any depth).
pub fn references_in(value: &Value) -> Vec<Reference> {
    let mut out = Vec::new();
    each_string(value, &mut |s| {
        out.extend(parse(s).into_iter().filter_map(|p| match p {
            Piece::Ref(r, _) => Some(r),
            Piece::Text(_) => None,
        }));
    });
    out
}

/// Double-braced text in a JSON value's strings that reads as a reference
/// but is not one (`{{foo}}`, `{{s1.outputs.x}}`, `{{s1.output.}}`), as
/// written.
pub fn malformed_in(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    each_string(value, &mut |s| {
        for piece in parse(s) {
            let Piece::Text(text) = piece else { continue };
            let mut rest = text;
            while let Some(open) = rest.find("{{") {
                let Some(close) = rest[open + 2..].find("}}") else { break };
                let inner = &rest[open + 2..open + 2 + close];
                if looks_like_reference(inner) {
                    out.push(rest[open..open + 2 + close + 2].to_owned());
                }
                rest = &rest[open + 2 + close + 2..];
            }
        }
    });
    out
}

/// True when `text` is exactly one reference (it becomes the referenced
/// value, type kept, so a schema cannot check it before the run).
pub fn is_whole_reference(text: &str) -> bool {
    matches!(parse(text).as_slice(), [Piece::Ref(..)])
}

/// `text` with the step of each reference renamed by `rename` (`None`: kept).
/// Everything else, references to other steps included, stays as written.
pub fn rename_steps<'n>(text: &str, rename: impl Fn(&str) -> Option<&'n str>) -> String {
    let mut out = String::with_capacity(text.len());
    for piece in parse(text) {
        match piece {
            Piece::Ref(mut reference, raw) => match rename(&reference.step) {
                Some(new) => {
                    new.clone_into(&mut reference.step);
                    out.push_str(&reference.to_string());
                }
                None => out.push_str(raw),
            },
            Piece::Text(t) => out.push_str(t),
        }
    }
    out
}

fn each_string(value: &Value, f: &mut impl FnMut(&str)) {
    match value {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter().for_each(|v| each_string(v, f)),
        Value::Object(map) => map.values().for_each(|v| each_string(v, f)),
        _ => {}
    }
}

/// Why a reference could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveError {
    /// The reference.
    pub reference: String,
    /// What is missing.
    pub reason: String,
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot resolve `{}`: {}", self.reference, self.reason)
    }
}

impl std::error::Error for ResolveError {}

/// The value a reference points at, given the outputs of finished steps.
pub fn lookup<'v>(
    reference: &Reference,
    outputs: &impl Fn(&str) -> Option<&'v Value>,
) -> Result<&'v Value, ResolveError> {
    let error = |reason: String| ResolveError { reference: reference.to_string(), reason };
    let mut value =
        outputs(&reference.step).ok_or_else(|| error(format!("step `{}` has no output", reference.step)))?;
    let mut at = "output".to_owned();
    for segment in &reference.path {
        value = match value {
            Value::Object(map) => map.get(segment).ok_or_else(|| error(format!("`{at}` has no field `{segment}`")))?,
            Value::Array(items) => {
                let index: usize =
                    segment.parse().map_err(|_| error(format!("`{at}` is an array; `{segment}` is not an index")))?;
                items
                    .get(index)
                    .ok_or_else(|| error(format!("`{at}` has {} items; index {index} is out of range", items.len())))?
            }
            other => return Err(error(format!("`{at}` is {}, not an object or array", kind(other)))),
        };
        at = format!("{at}.{segment}");
    }
    Ok(value)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `text` with every reference replaced by the referenced value's text.
pub fn resolve_text<'v>(text: &str, outputs: &impl Fn(&str) -> Option<&'v Value>) -> Result<String, ResolveError> {
    let mut out = String::with_capacity(text.len());
    for piece in parse(text) {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Ref(r, _) => match lookup(&r, outputs)? {
                Value::String(s) => out.push_str(s),
                other => out.push_str(&other.to_string()),
            },
        }
    }
    Ok(out)
}

/// `value` with every reference resolved: a string that is exactly one
/// reference becomes the referenced value, type kept; references inside
/// longer strings become text.
pub fn resolve<'v>(value: &Value, outputs: &impl Fn(&str) -> Option<&'v Value>) -> Result<Value, ResolveError> {
    Ok(match value {
        Value::String(s) => {
            let pieces = parse(s);
            match pieces.as_slice() {
                [Piece::Ref(r, _)] => lookup(r, outputs)?.clone(),
                _ if pieces.iter().any(|p| matches!(p, Piece::Ref(..))) => Value::String(resolve_text(s, outputs)?),
                _ => value.clone(),
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| resolve(v, outputs)).collect::<Result<_, _>>()?),
        Value::Object(map) => Value::Object(
            map.iter().map(|(k, v)| Ok((k.clone(), resolve(v, outputs)?))).collect::<Result<_, ResolveError>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outputs(step: &str) -> Option<&'static Value> {
        static S1: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
        let s1 = S1.get_or_init(|| json!({"price": 251.5, "name": "TSLA", "items": [{"n": 1}, {"n": 2}], "ok": true}));
        (step == "s1").then_some(s1)
    }

    #[test]
    fn a_whole_value_keeps_its_type() {
        assert_eq!(resolve(&json!("{{s1.output.price}}"), &outputs).ok(), Some(json!(251.5)));
        assert_eq!(resolve(&json!("{{ s1.output.items[1].n }}"), &outputs).ok(), Some(json!(2)));
        assert_eq!(resolve(&json!("{{s1.output.items.0}}"), &outputs).ok(), Some(json!({"n": 1})));
        assert_eq!(resolve(&json!("{{s1.output.ok}}"), &outputs).ok(), Some(json!(true)));
    }

    #[test]
    fn inside_text_a_reference_becomes_text() {
        let resolved = resolve(&json!({"e": "100 * {{s1.output.price}} for {{s1.output.name}}"}), &outputs);
        assert_eq!(resolved.ok(), Some(json!({"e": "100 * 251.5 for TSLA"})));
        let resolved = resolve(&json!(["{{s1.output.items}}!"]), &outputs);
        assert_eq!(resolved.ok(), Some(json!([r#"[{"n":1},{"n":2}]!"#])));
    }

    #[test]
    fn what_is_not_a_reference_is_left_alone() {
        for text in ["{{foo}}", "{{s1.outputs.x}}", "{{s1.output_x}}", "{{ }}", "a {{ b", "{{s1.output.}}"] {
            assert_eq!(resolve(&json!(text), &outputs).ok(), Some(json!(text)), "{text}");
        }
    }

    #[test]
    fn attempts_at_references_that_are_not_ones_are_found() {
        let found = malformed_in(&json!({
            "a": "{{foo}} and {{s1.outputs.x}}",
            "b": ["{{s1.output.}}", "{{s1.output.ok}}", "{{ a | upper }}", "{{ }}", "{{s1[0]}}"],
            "c": 5,
        }));
        assert_eq!(found, ["{{foo}}", "{{s1.outputs.x}}", "{{s1.output.}}", "{{s1[0]}}"]);
        assert!(malformed_in(&json!("{{s1.output}} costs {{ s2.output.price }}")).is_empty());
    }

    #[test]
    fn whole_references_and_renaming_keep_what_is_written() {
        assert!(is_whole_reference("{{ s1.output.x }}"));
        assert!(!is_whole_reference(" {{s1.output}}"));
        assert!(!is_whole_reference("{{foo}}"));
        let renamed =
            rename_steps("{{ s1.output.items[0] }} + {{s2.output.items[0]}} {{s1}}", |s| (s == "s1").then_some("s9"));
        assert_eq!(renamed, "{{s9.output.items.0}} + {{s2.output.items[0]}} {{s1}}");
    }

    #[test]
    fn an_unresolvable_path_names_itself() {
        let e = resolve(&json!("{{s1.output.volume}}"), &outputs).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("cannot resolve `{{s1.output.volume}}`: `output` has no field `volume`"));
        let e = resolve(&json!("x {{s1.output.items.5}}"), &outputs).err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("cannot resolve `{{s1.output.items.5}}`: `output.items` has 2 items; index 5 is out of range")
        );
        let e = resolve(&json!("{{s1.output.price.x}}"), &outputs).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("`output.price` is a number")));
        let e = resolve(&json!("{{s2.output}}"), &outputs).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("step `s2` has no output")));
    }

    #[test]
    fn references_are_found_at_any_depth() {
        let found = references_in(&json!({"a": ["{{s1.output.x}} and {{s2.output}}"], "b": {"c": "{{s3.output[0]}}"}}));
        let names: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["{{s1.output.x}}", "{{s2.output}}", "{{s3.output.0}}"]);
    }
}
