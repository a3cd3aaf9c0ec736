//! `agentmesh eval`, as a user runs it, on the sample set against
//! `agentmesh demo --serve`: through the planner and through the gateway,
//! as a table, as JSON and as a Markdown report.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use serde_json::Value;

fn eval(args: &[&str]) -> (bool, String, String) {
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/eval/demo.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .arg("eval")
        .arg(sample)
        .args(args)
        .env_remove("AGENTMESH_CONFIG")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_sample_set_is_measured_through_the_planner_and_the_gateway() {
    let dir = std::env::temp_dir().join(format!("agentmesh-eval-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let demo = common::serve_demo(&dir, &[]);
    let planner = demo.addresses["planner"].clone();
    let gateway = demo.addresses["gateway"].clone();

    let (ok, out, err) = eval(&["--planner", &planner, "--json"]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let run = &report["runs"][0];
    let case = |id: &str| run["cases"].as_array().unwrap().iter().find(|c| c["id"] == id).cloned().unwrap();
    assert_eq!(run["totals"]["cases"], 5);
    assert_eq!(run["totals"]["valid"], 5, "{run}");
    assert_eq!(case("weather")["node_f1"], 1.0);
    // The invented time tool is caught: nothing fits, a zero-step plan.
    assert_eq!(case("time")["zero_step_right"], true);
    // Three tools, the calculator after both lookups.
    assert_eq!((&case("tsla")["node_f1"], &case("tsla")["edge_f1"]), (&Value::from(1.0), &Value::from(1.0)));
    // The demo's plan forgets the stock price (its review finds it later).
    let london = case("london")["node_f1"].as_f64().unwrap();
    assert!((london - 2.0 / 3.0).abs() < 1e-9, "{london}");
    assert_eq!(run["totals"]["repeated_steps"], 0);
    // Tokens come from the planner's interaction log (the demo's scripted model counts none).
    assert!(case("weather")["tokens"].as_u64().is_some(), "{run}");

    // Through the gateway: answers too, as a table and a Markdown report.
    let markdown = dir.join("report.md");
    let (ok, out, err) =
        eval(&["--planner", &planner, "--gateway", &gateway, "--markdown", markdown.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("5 of 5 plans valid"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("weather") && l.contains("yes")), "{out}");
    let report = std::fs::read_to_string(&markdown).unwrap();
    assert!(report.starts_with("# agentmesh eval") && report.contains("| case"), "{report}");
    assert!(report.contains("answers grounded"), "{report}");

    // A file that is not a set of cases says why.
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "- request: x\n  capabilities: [nothing]\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["eval", bad.to_str().unwrap(), "--planner", &planner])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not `agent:capability`"));
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}
