//! Property tests over what arrives from outside: model answers parsed as
//! plans, plans validated against a catalog, and references resolved. None
//! may panic, and every plan accepted holds together.

use std::collections::{HashMap, HashSet};

use agentmesh_core::CapabilityKind;
use agentmesh_core::plan::{AllowedCapability, Plan, PlanStep, check_structure, parse_plan, validate_plan};
use agentmesh_core::reference::{self, Piece};
use proptest::prelude::*;
use serde_json::{Value, json};

fn allowed() -> Vec<AllowedCapability> {
    let cap = |agent: &str, capability: &str, schema: Option<Value>| AllowedCapability {
        agent: agent.into(),
        capability: capability.into(),
        kind: CapabilityKind::Skill,
        description: String::new(),
        input_schema: schema,
    };
    vec![
        cap(
            "weather",
            "current",
            Some(json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]})),
        ),
        cap(
            "math",
            "evaluate",
            Some(
                json!({"type": "object", "properties": {"expression": {"type": "string"}, "precision": {"type": "integer"}}}),
            ),
        ),
        cap("notes", "write", None),
    ]
}

/// Strings rich in what the parsers look for.
fn tricky_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("{{".to_owned()),
            Just("}}".to_owned()),
            Just("s1".to_owned()),
            Just("s2".to_owned()),
            Just(".output".to_owned()),
            Just(".outputs".to_owned()),
            Just(".".to_owned()),
            Just("[0]".to_owned()),
            Just("[".to_owned()),
            Just("]".to_owned()),
            Just(" ".to_owned()),
            Just("é".to_owned()),
            "[a-z0-9_]{1,4}",
        ],
        0..12,
    )
    .prop_map(|parts| parts.concat())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        tricky_text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::hash_map("[a-z]{1,8}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Parameters that often fit the catalog's schemas, with references good
/// and bad among them.
fn parameters() -> impl Strategy<Value = Value> {
    let text = prop_oneof![
        Just("Chicago".to_owned()),
        Just("{{s1.output}}".to_owned()),
        Just("{{s2.output.temp_c}}".to_owned()),
        Just("2 * {{s3.output.items[0]}}".to_owned()),
        Just("{{foo}}".to_owned()),
        tricky_text(),
    ];
    prop_oneof![
        3 => (text.clone(), text.clone()).prop_map(|(a, b)| json!({"location": a, "expression": b})),
        1 => text.prop_map(|t| json!({"expression": "1", "precision": t})),
        1 => json_value(),
    ]
}

fn step() -> impl Strategy<Value = PlanStep> {
    let ids = prop_oneof![
        4 => Just("s1"), 4 => Just("s2"), 4 => Just("s3"), 4 => Just("s4"), 1 => Just("bad id"), 1 => Just("")
    ];
    (
        ids.clone(),
        prop_oneof![
            3 => Just(("weather", "current")),
            3 => Just(("math", "evaluate")),
            3 => Just(("notes", "write")),
            1 => Just(("time", "now")),
        ],
        parameters(),
        prop::collection::vec(ids, 0..3),
        tricky_text(),
    )
        .prop_map(|(id, (agent, capability), parameters, depends_on, instruction)| PlanStep {
            step_id: id.into(),
            agent: agent.into(),
            capability: capability.into(),
            instruction,
            parameters,
            depends_on: depends_on.into_iter().map(str::to_owned).collect(),
        })
}

/// Plans shaped like a model's: ids in order, dependencies on earlier
/// steps, parameters that often fit, with references good and bad.
fn plausible_plan() -> impl Strategy<Value = Vec<PlanStep>> {
    prop::collection::vec(
        (
            prop_oneof![Just(("weather", "current")), Just(("math", "evaluate")), Just(("notes", "write"))],
            parameters(),
            any::<u8>(),
            tricky_text(),
        ),
        0..5,
    )
    .prop_map(|steps| {
        steps
            .into_iter()
            .enumerate()
            .map(|(i, ((agent, capability), parameters, mask, instruction))| PlanStep {
                step_id: format!("s{}", i + 1),
                agent: agent.into(),
                capability: capability.into(),
                instruction,
                parameters: if agent == "notes" { json!({}) } else { parameters },
                depends_on: (0..i).filter(|d| mask & (1 << d) != 0).map(|d| format!("s{}", d + 1)).collect(),
            })
            .collect()
    })
}

/// The properties every accepted plan must have.
fn assert_holds_together(plan: &Plan, allowed: &[AllowedCapability]) {
    let ids: HashSet<&str> = plan.steps.iter().map(|s| s.step_id.as_str()).collect();
    assert_eq!(ids.len(), plan.steps.len(), "step ids are unique");
    for step in &plan.steps {
        assert!(allowed.iter().any(|a| a.agent == step.agent && a.capability == step.capability), "only pairs shown");
        assert!(step.parameters.is_object(), "parameters are an object");
        for dep in &step.depends_on {
            assert!(dep != &step.step_id && ids.contains(dep.as_str()), "dependencies exist");
        }
        for found in reference::references_in(&step.parameters) {
            assert!(step.depends_on.contains(&found.step), "references name dependencies");
        }
        assert!(reference::malformed_in(&step.parameters).is_empty(), "no malformed reference");
    }
    // Acyclic: repeatedly removing steps whose dependencies are done empties it.
    let mut done: HashSet<&str> = HashSet::new();
    while done.len() < plan.steps.len() {
        let before = done.len();
        for step in &plan.steps {
            if step.depends_on.iter().all(|d| done.contains(d.as_str())) {
                done.insert(&step.step_id);
            }
        }
        assert!(done.len() > before, "the plan has no cycle");
    }
    assert!(check_structure(plan).is_ok());
}

#[test]
fn every_accepted_plan_holds_together() {
    let allowed = allowed();
    // A fixed seed, so that how many valid plans the generator reaches is
    // the same on every run.
    let config = ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        config,
        proptest::test_runner::TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let accepted_with_steps = std::cell::Cell::new(0u32);
    runner
        .run(&prop_oneof![prop::collection::vec(step(), 0..5), plausible_plan()], |steps| {
            let plan = Plan { reasoning: String::new(), steps };
            let text = serde_json::to_string(&plan).expect("serializes");
            let parsed = parse_plan(&text).expect("a serialized plan parses");
            prop_assert_eq!(&parsed, &plan);
            match validate_plan(&parsed, &allowed) {
                Ok(valid) => {
                    assert_holds_together(&valid, &allowed);
                    accepted_with_steps.set(accepted_with_steps.get() + u32::from(!valid.steps.is_empty()));
                }
                Err(errors) => prop_assert!(!errors.is_empty()),
            }
            let _ = check_structure(&plan);
            Ok(())
        })
        .expect("every accepted plan holds together");
    let accepted = accepted_with_steps.get();
    eprintln!("{accepted} of 2048 generated plans with steps were valid");
    assert!(accepted >= 100, "the generator reaches valid plans: {accepted}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_answer_parses_or_is_rejected_without_panic(answer in "\\PC{0,200}") {
        let _ = parse_plan(&answer);
    }

    #[test]
    fn answers_shaped_like_plans_parse_without_panic(
        prefix in "[a-z ]{0,10}",
        steps in prop::collection::vec(json_value(), 0..4),
        fence in any::<bool>(),
    ) {
        let body = json!({"reasoning": "r", "steps": steps}).to_string();
        let answer = if fence { format!("{prefix}```json\n{body}\n```") } else { format!("{prefix}{body}") };
        let _ = parse_plan(&answer);
    }

    #[test]
    fn references_parse_resolve_and_rename_without_panic(text in tricky_text(), value in json_value()) {
        let pieces = reference::parse(&text);
        let rebuilt: String = pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => *t,
                Piece::Ref(_, raw) => *raw,
            })
            .collect();
        prop_assert_eq!(&rebuilt, &text, "the pieces are the text");
        for piece in &pieces {
            if let Piece::Ref(found, _) = piece {
                let rendered = found.to_string();
                let again = reference::parse(&rendered);
                prop_assert!(matches!(again.as_slice(), [Piece::Ref(r, _)] if r == found), "a reference renders back");
            }
        }
        let outputs: HashMap<&str, Value> = [("s1", value.clone()), ("s2", json!({"output": [1, 2]}))].into();
        let lookup = |step: &str| outputs.get(step);
        let _ = reference::resolve(&Value::String(text.clone()), &lookup);
        let _ = reference::resolve(&value, &lookup);
        let _ = reference::resolve_text(&text, &lookup);
        let _ = reference::malformed_in(&value);
        let renamed = reference::rename_steps(&text, |s| (s == "s1").then_some("s9"));
        let count = |t: &str| reference::parse(t).iter().filter(|p| matches!(p, Piece::Ref(..))).count();
        prop_assert_eq!(count(&renamed), count(&text), "renaming keeps every reference");
    }
}
