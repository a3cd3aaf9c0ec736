//! Whether an answer is grounded in what the steps returned. The values an
//! answer states (numbers, dates and times, names) must be found in the
//! step outputs or in the request; a value found in neither is an
//! unsupported claim. And the other way: step outputs as a short list of
//! facts, for the model to use and, when its answer cannot be trusted, for
//! an answer made of the facts alone.

use serde_json::Value;

/// One value a step returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// The step.
    pub step_id: String,
    /// Where in its output (`temp_c`, `data[0].result`; empty: the output itself).
    pub path: String,
    /// The value, as text.
    pub value: String,
}

/// Longest value text kept in a fact.
const MAX_FACT_CHARS: usize = 120;

/// Words that are capitalised without being names a result must contain.
const NOT_NAMES: &[&str] = &[
    "The",
    "This",
    "That",
    "These",
    "Those",
    "There",
    "Here",
    "It",
    "Its",
    "In",
    "On",
    "At",
    "For",
    "From",
    "With",
    "And",
    "But",
    "Or",
    "If",
    "As",
    "By",
    "Of",
    "To",
    "A",
    "An",
    "I",
    "You",
    "We",
    "They",
    "He",
    "She",
    "Yes",
    "No",
    "Not",
    "Step",
    "Steps",
    "Result",
    "Results",
    "Answer",
    "Note",
    "Sorry",
    "Celsius",
    "Fahrenheit",
    "Kelvin",
    "AM",
    "PM",
    "OK",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
    "Today",
    "Tomorrow",
    "Yesterday",
    "However",
    "Also",
    "Currently",
    "According",
    "Based",
    "Unfortunately",
];

/// The leaf values of the steps' outputs, in step order, at most `max`.
pub fn facts(outputs: &[(&str, &Value)], max: usize) -> Vec<Fact> {
    fn walk(step: &str, path: String, value: &Value, out: &mut Vec<Fact>, max: usize) {
        if out.len() >= max {
            return;
        }
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                    walk(step, path, child, out, max);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(step, format!("{path}[{i}]"), child, out, max);
                }
            }
            Value::Null => {}
            Value::String(text) if text.trim().is_empty() => {}
            Value::String(text) => {
                let value: String = text.chars().take(MAX_FACT_CHARS).collect();
                out.push(Fact { step_id: step.to_owned(), path, value });
            }
            other => out.push(Fact { step_id: step.to_owned(), path, value: other.to_string() }),
        }
    }
    let mut out = Vec::new();
    for (step, output) in outputs {
        walk(step, String::new(), output, &mut out, max);
    }
    out
}

/// The facts as prompt lines: `- s1 temp_c: 21`.
pub fn fact_lines(facts: &[Fact]) -> String {
    facts
        .iter()
        .map(|f| {
            if f.path.is_empty() {
                format!("- {}: {}", f.step_id, f.value)
            } else {
                format!("- {} {}: {}", f.step_id, f.path, f.value)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// An answer made of the facts alone, for when the model's answer states
/// what the results do not say.
pub fn extractive_answer(facts: &[Fact]) -> String {
    if facts.is_empty() {
        return "The steps returned no values to answer with.".into();
    }
    let said: Vec<String> = facts
        .iter()
        .map(|f| {
            let last = f.path.rsplit('.').next().unwrap_or_default();
            let name = last.split('[').next().unwrap_or_default().replace('_', " ");
            if name.is_empty() { f.value.clone() } else { format!("{name}: {}", f.value) }
        })
        .collect();
    format!("From the results: {}.", said.join("; "))
}

/// A number as written: its value and how many decimals it shows.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Number {
    value: f64,
    decimals: i32,
}

/// The numbers in a text: `3,822.78` is one number, `1,2` two; the digits
/// of dates and times (`2026-11-26`, `09:00`) are numbers each.
fn numbers(text: &str) -> Vec<(usize, String, Number)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        // Digits after a letter are part of a name (`s1`, `utf8`), except a
        // time after a date's `T` (`2026-11-26T09:00`).
        let after_letter = i > 0
            && (bytes[i - 1].is_ascii_alphabetic() || bytes[i - 1] == b'_')
            && !(bytes[i - 1] == b'T' && i >= 2 && bytes[i - 2].is_ascii_digit());
        if !bytes[i].is_ascii_digit() || after_letter {
            i += 1;
            continue;
        }
        let start = i;
        let mut digits = String::new();
        while i < bytes.len() {
            let b = bytes[i];
            if b.is_ascii_digit() {
                digits.push(b as char);
                i += 1;
            } else if b == b','
                && !digits.contains('.')
                && bytes.get(i + 1..i + 4).is_some_and(|d| d.iter().all(u8::is_ascii_digit))
                && !bytes.get(i + 4).is_some_and(u8::is_ascii_digit)
            {
                i += 1;
            } else if b == b'.' && !digits.contains('.') && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
                digits.push('.');
                i += 1;
            } else {
                break;
            }
        }
        let decimals = digits.split_once('.').map_or(0, |(_, fraction)| i32::try_from(fraction.len()).unwrap_or(0));
        if let Ok(value) = digits.parse::<f64>() {
            out.push((start, text[start..i].to_owned(), Number { value, decimals }));
        }
    }
    out
}

fn supports(source: Number, claim: Number) -> bool {
    if (source.value - claim.value).abs() < 1e-9 {
        return true;
    }
    // The answer may round what the step returned (21.46 said as 21.5 or 21).
    let scale = 10f64.powi(claim.decimals);
    ((source.value * scale).round() / scale - claim.value).abs() < 1e-9
}

/// Whether the number starting at `start` is a list marker (`1.` or `2)`
/// at the start of a line).
fn is_list_marker(text: &str, start: usize, written: &str) -> bool {
    let before = text[..start].trim_end_matches([' ', '\t']);
    let after = text[start + written.len()..].chars().next();
    (before.is_empty() || before.ends_with('\n')) && matches!(after, Some('.' | ')'))
}

/// The capitalised words of a text that are not at the start of a
/// sentence and not common words: the names it mentions.
fn names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut sentence_start = true;
    for raw in text.split_whitespace() {
        let word = raw.trim_matches(|c: char| !c.is_alphanumeric());
        let starts_upper = word.chars().next().is_some_and(char::is_uppercase);
        if starts_upper
            && !sentence_start
            && word.chars().count() >= 3
            && word.chars().all(char::is_alphabetic)
            && !NOT_NAMES.contains(&word)
        {
            out.push(word.to_owned());
        }
        sentence_start = raw.ends_with(['.', '!', '?', ':']) || raw.ends_with(".\"");
    }
    out
}

/// Whether `text` holds a number (a date or time counts).
pub fn has_number(text: &str) -> bool {
    !numbers(text).is_empty()
}

/// Whether `answer` states `fact`'s value: one of its numbers (rounded
/// as the answer writes it), or its text.
pub fn states(answer: &str, fact: &Fact) -> bool {
    let in_fact: Vec<Number> = numbers(&fact.value).into_iter().map(|(_, _, n)| n).collect();
    if in_fact.is_empty() {
        let value = fact.value.trim().to_lowercase();
        return !value.is_empty() && answer.to_lowercase().contains(&value);
    }
    let said: Vec<Number> = numbers(answer).into_iter().map(|(_, _, n)| n).collect();
    in_fact.iter().any(|f| said.iter().any(|n| supports(*f, *n)))
}

/// The values `answer` states that none of `sources` (the step outputs as
/// text, the request) contains: numbers (dates and times by their parts),
/// and names. Each is returned once, as written.
pub fn unsupported_claims(answer: &str, sources: &[&str]) -> Vec<String> {
    let known: Vec<Number> = sources.iter().flat_map(|s| numbers(s)).map(|(_, _, n)| n).collect();
    let lower: Vec<String> = sources.iter().map(|s| s.to_lowercase()).collect();
    let mut claims: Vec<String> = Vec::new();
    for (start, written, number) in numbers(answer) {
        if is_list_marker(answer, start, &written) {
            continue;
        }
        if !known.iter().any(|k| supports(*k, number)) && !claims.contains(&written) {
            claims.push(written);
        }
    }
    for name in names(answer) {
        let needle = name.to_lowercase();
        if !lower.iter().any(|s| s.contains(&needle)) && !claims.contains(&name) {
            claims.push(name);
        }
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_grounded_answer_has_no_unsupported_claim() {
        let output =
            json!({"location": "Chicago", "temp_c": 21.46, "observed": "2026-11-26T09:00:00-06:00"}).to_string();
        let request = "What is the weather in Chicago?";
        for answer in [
            "It is 21.5 °C in Chicago, as of 09:00 on 2026-11-26.",
            "In Chicago it is 21 °C.",
            "The temperature in Chicago is 21.46 degrees Celsius.",
        ] {
            assert_eq!(unsupported_claims(answer, &[&output, request]), Vec::<String>::new(), "{answer}");
        }
    }

    #[test]
    fn invented_values_and_names_are_unsupported() {
        let output = json!({"temp_c": 21}).to_string();
        let request = "What is the weather in Chicago?";
        let claims = unsupported_claims("In Chicago it is 25 °C with winds from Lake Michigan.", &[&output, request]);
        assert_eq!(claims, ["25", "Lake", "Michigan"]);
        // Money written with separators, lists numbered by the model.
        let money = json!({"result": 3822.78, "to": "JPY"}).to_string();
        assert!(unsupported_claims("20 GBP is 3,822.78 JPY.", &[&money, "How many yen is 20 GBP?"]).is_empty());
        let listed = "Results:\n1. 21 °C\n2. sunny";
        assert!(unsupported_claims(listed, &[&json!({"temp_c": 21, "sky": "sunny"}).to_string()]).is_empty());
    }

    #[test]
    fn an_answer_states_a_fact_by_its_number_or_its_text() {
        let fact = |value: &str| Fact { step_id: "s1".into(), path: "x".into(), value: value.into() };
        assert!(states("It is 21.5 °C.", &fact("21.46")));
        assert!(!states("It is warm.", &fact("21.46")));
        assert!(states("The sky is Sunny.", &fact("sunny")));
        assert!(!states("The sky is clear.", &fact("sunny")));
    }

    #[test]
    fn facts_are_the_outputs_leaves_and_make_an_answer() {
        let a = json!({"temp_c": 21, "conditions": "sunny", "extra": null});
        let b = json!({"data": [{"result": 92.0}]});
        let facts = facts(&[("s1", &a), ("s2", &b)], 10);
        assert_eq!(fact_lines(&facts), "- s1 temp_c: 21\n- s1 conditions: sunny\n- s2 data[0].result: 92.0");
        assert_eq!(extractive_answer(&facts), "From the results: temp c: 21; conditions: sunny; result: 92.0.");
        assert!(unsupported_claims(&extractive_answer(&facts), &[&a.to_string(), &b.to_string()]).is_empty());
    }
}
