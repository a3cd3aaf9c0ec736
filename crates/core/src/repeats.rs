//! Steps a plan repeats. A step that calls the same capability of the same
//! agent with the same parameters as an earlier step would do the same
//! work a second time: a second email sent, a meeting booked twice. Such a
//! step is merged into the first one: the steps that waited on it wait on
//! the first, and its `{{id.output…}}` references name the first.
//!
//! A step that calls the same capability with other parameters is merged
//! too when the request names one item and does not ask for it: none of
//! the values it adds (strings and numbers not in the earlier call) is
//! named in the request. "How many kilometres are 26.2 miles?" planned as a
//! conversion of 26.2 and then of 10.58 keeps one (10.58 is not named). A
//! request naming several items (`and`, `then`, commas…) keeps its calls,
//! however the plan writes the items ("German" as "de"), and a step whose
//! parameters read another step's output is data-driven: neither is merged
//! this way.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::plan::{Plan, PlanStep};

/// A step merged into an earlier, identical one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The step removed.
    pub removed: String,
    /// The step kept in its place.
    pub kept: String,
    /// Its agent.
    pub agent: String,
    /// Its capability.
    pub capability: String,
}

/// The steps `step` waits on, directly or not.
fn waits_on<'a>(plan: &'a Plan, step: &'a str) -> HashSet<&'a str> {
    let by_id: HashMap<&str, &Vec<String>> = plan.steps.iter().map(|s| (s.step_id.as_str(), &s.depends_on)).collect();
    let mut seen = HashSet::new();
    let mut next = vec![step];
    while let Some(id) = next.pop() {
        for dependency in by_id.get(id).into_iter().flat_map(|d| d.iter()) {
            if seen.insert(dependency.as_str()) {
                next.push(dependency);
            }
        }
    }
    seen
}

/// The string and number values of `value` at any depth, lowercased.
fn values(value: &Value, out: &mut HashSet<String>) {
    match value {
        Value::String(s) if !s.trim().is_empty() => {
            out.insert(s.trim().to_lowercase());
        }
        Value::Number(n) => {
            out.insert(n.to_string());
        }
        Value::Array(items) => items.iter().for_each(|v| values(v, out)),
        Value::Object(map) => map.values().for_each(|v| values(v, out)),
        _ => {}
    }
}

/// Whether `step` repeats `kept`'s call without the request asking for it:
/// the same agent and capability, no reference to another step's output,
/// and no value of its own that the request names.
fn unasked(kept: &PlanStep, step: &PlanStep, request: &str) -> bool {
    if kept.agent != step.agent || kept.capability != step.capability {
        return false;
    }
    // A request naming several items may name them otherwise than the
    // plan writes them ("German" planned as "de").
    if crate::bm25::names_several(request) || !crate::reference::references_in(&step.parameters).is_empty() {
        return false;
    }
    let (mut earlier, mut own) = (HashSet::new(), HashSet::new());
    values(&kept.parameters, &mut earlier);
    values(&step.parameters, &mut own);
    let request = request.to_lowercase();
    !own.difference(&earlier).any(|v| request.contains(v.as_str()))
}

/// Merges every step that repeats an earlier one (same agent, capability
/// and parameters, once references to merged steps are renamed, or other
/// parameters that `request` does not name: see the module docs) into that
/// earlier step, and says which were merged. A step is not merged into one
/// that waits on it.
pub fn merge_repeated_steps(plan: &mut Plan, request: &str) -> Vec<Merged> {
    let mut merged = Vec::new();
    let mut renamed: HashMap<String, String> = HashMap::new();
    let mut index = 0;
    while index < plan.steps.len() {
        plan.steps[index].rename_steps(&renamed);
        let step = &plan.steps[index];
        let earlier = plan.steps[..index].iter().find(|kept| {
            kept.agent == step.agent
                && kept.capability == step.capability
                && (kept.parameters == step.parameters || unasked(kept, step, request))
                && !waits_on(plan, &kept.step_id).contains(step.step_id.as_str())
        });
        match earlier {
            Some(kept) => {
                merged.push(Merged {
                    removed: step.step_id.clone(),
                    kept: kept.step_id.clone(),
                    agent: step.agent.clone(),
                    capability: step.capability.clone(),
                });
                renamed.insert(step.step_id.clone(), kept.step_id.clone());
                plan.steps.remove(index);
            }
            None => index += 1,
        }
    }
    if merged.is_empty() {
        return merged;
    }
    for step in &mut plan.steps {
        step.rename_steps(&renamed);
        let mut seen = HashSet::new();
        let own = step.step_id.clone();
        step.depends_on.retain(|d| *d != own && seen.insert(d.clone()));
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(steps: serde_json::Value) -> Plan {
        serde_json::from_value(json!({"reasoning": "r", "steps": steps})).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_same_call_twice_is_made_once_and_its_dependants_rewired() {
        // "Email alice ... the subject 'notes'" planned send_email twice.
        let mut p = plan(json!([
            {"step_id": "s1", "agent": "mail", "capability": "send_email", "parameters": {"to": "alice", "subject": "notes"}},
            {"step_id": "s2", "agent": "mail", "capability": "send_email", "parameters": {"to": "alice", "subject": "notes"}},
            {"step_id": "s3", "agent": "log", "capability": "record", "parameters": {"what": "{{s2.output.id}}"}, "depends_on": ["s2"]},
        ]));
        let merged = merge_repeated_steps(&mut p, "");
        assert_eq!(
            merged,
            vec![Merged {
                removed: "s2".into(),
                kept: "s1".into(),
                agent: "mail".into(),
                capability: "send_email".into()
            }]
        );
        let ids: Vec<&str> = p.steps.iter().map(|s| s.step_id.as_str()).collect();
        assert_eq!(ids, ["s1", "s3"]);
        assert_eq!(p.steps[1].depends_on, ["s1"]);
        assert_eq!(p.steps[1].parameters, json!({"what": "{{s1.output.id}}"}));
    }

    #[test]
    fn six_bookings_become_one_and_different_parameters_stay() {
        let booking = |id: &str, title: &str| json!({"step_id": id, "agent": "calendar", "capability": "create_event", "parameters": {"title": title}});
        let mut p = plan(json!([
            booking("s1", "standup"),
            booking("s2", "standup"),
            booking("s3", "standup"),
            booking("s4", "standup"),
            booking("s5", "review"),
            booking("s6", "standup"),
        ]));
        let merged = merge_repeated_steps(&mut p, "Book the standup and the review");
        assert_eq!(merged.len(), 4);
        let ids: Vec<&str> = p.steps.iter().map(|s| s.step_id.as_str()).collect();
        assert_eq!(ids, ["s1", "s5"]);
    }

    #[test]
    fn repeats_that_become_equal_through_a_merge_are_merged_too_and_dependencies_stay_single() {
        let mut p = plan(json!([
            {"step_id": "a", "agent": "geo", "capability": "locate", "parameters": {"q": "Paris"}},
            {"step_id": "b", "agent": "geo", "capability": "locate", "parameters": {"q": "Paris"}},
            {"step_id": "c", "agent": "w", "capability": "now", "parameters": {"at": "{{a.output}}"}, "depends_on": ["a"]},
            {"step_id": "d", "agent": "w", "capability": "now", "parameters": {"at": "{{b.output}}"}, "depends_on": ["b"]},
            {"step_id": "e", "agent": "sum", "capability": "join", "parameters": {}, "depends_on": ["c", "d", "a"]},
        ]));
        let merged = merge_repeated_steps(&mut p, "");
        assert_eq!(merged.iter().map(|m| m.removed.as_str()).collect::<Vec<_>>(), ["b", "d"]);
        assert_eq!(p.steps.last().map(|s| s.depends_on.clone()), Some(vec!["c".to_owned(), "a".to_owned()]));
    }

    #[test]
    fn other_parameters_stay_only_when_the_request_names_them() {
        let weather = |id: &str, city: &str| json!({"step_id": id, "agent": "w", "capability": "now", "parameters": {"location": city}});
        let mut p = plan(json!([weather("s1", "Paris"), weather("s2", "Berlin")]));
        let merged = merge_repeated_steps(&mut p, "Weather in Paris?");
        assert_eq!(merged.iter().map(|m| m.removed.as_str()).collect::<Vec<_>>(), ["s2"]);
        let mut p = plan(json!([weather("s1", "Paris"), weather("s2", "Berlin")]));
        assert!(merge_repeated_steps(&mut p, "Weather in Paris? Berlin too").is_empty(), "Berlin is named");
        // Several items, written otherwise than the request names them: kept.
        let translate = |id: &str, to: &str| json!({"step_id": id, "agent": "t", "capability": "translate", "parameters": {"target": to}});
        let mut p = plan(json!([translate("s1", "es"), translate("s2", "de")]));
        assert!(merge_repeated_steps(&mut p, "Translate hello into Spanish and German").is_empty());
        let convert = |id: &str, value: f64| json!({"step_id": id, "agent": "units", "capability": "convert_length", "parameters": {"value": value}});
        let mut second = convert("s2", 10.58);
        second["depends_on"] = json!(["s1"]);
        let mut p = plan(json!([convert("s1", 26.2), second]));
        assert_eq!(merge_repeated_steps(&mut p, "How many kilometres are 26.2 miles?").len(), 1);
        assert_eq!(p.steps.len(), 1);
        // Reading another step's output: a data-driven repeat, kept.
        let mut p = plan(json!([
            {"step_id": "s1", "agent": "web", "capability": "search", "parameters": {"q": "rust"}},
            {"step_id": "s2", "agent": "web", "capability": "search", "parameters": {"q": "{{s1.output.next}}"}, "depends_on": ["s1"]},
        ]));
        assert!(merge_repeated_steps(&mut p, "search rust twice").is_empty());
    }

    #[test]
    fn a_step_is_not_merged_into_one_that_waits_on_it() {
        let mut p = plan(json!([
            {"step_id": "s1", "agent": "x", "capability": "poll", "parameters": {}, "depends_on": ["s2"]},
            {"step_id": "s2", "agent": "x", "capability": "poll", "parameters": {}},
        ]));
        assert!(merge_repeated_steps(&mut p, "").is_empty());
        assert_eq!(p.steps.len(), 2);
    }
}
