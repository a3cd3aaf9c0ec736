//! The crates' layering (ARCHITECTURE.md), checked against what Cargo
//! resolves: a service never depends on another service, and the crates
//! below the services depend on none of them. Dev-dependencies are free:
//! a service's tests may start the services it talks to.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

/// Which workspace crates each library below the services may depend on.
const BELOW_SERVICES: [(&str, &[&str]); 11] = [
    ("agentmesh-core", &[]),
    ("agentmesh-proto", &["agentmesh-core"]),
    ("agentmesh-telemetry", &[]),
    ("agentmesh-store", &["agentmesh-core"]),
    ("agentmesh-llm", &["agentmesh-core", "agentmesh-telemetry"]),
    ("agentmesh-mcp", &["agentmesh-core", "agentmesh-telemetry"]),
    ("agentmesh-a2a", &["agentmesh-core", "agentmesh-telemetry"]),
    (
        "agentmesh-catalog",
        &[
            "agentmesh-core",
            "agentmesh-llm",
            "agentmesh-proto",
            "agentmesh-server",
            "agentmesh-store",
            "agentmesh-telemetry",
        ],
    ),
    ("agentmesh-server", &["agentmesh-core", "agentmesh-proto", "agentmesh-telemetry"]),
    // Agents are clients of the mesh: the SDK and the demo agents know
    // only its contracts, never a service.
    ("agentmesh-agent-sdk", &["agentmesh-proto", "agentmesh-telemetry"]),
    ("agentmesh-demo-agents", &["agentmesh-agent-sdk"]),
];

/// Every workspace package with the workspace crates it depends on
/// (normal and build dependencies, not dev-dependencies), and whether it
/// is a service (its manifest under `services/`).
fn workspace() -> BTreeMap<String, (bool, Vec<String>)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("cargo metadata: {e}"));
    assert!(output.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("cargo metadata: {e}"));
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let names: Vec<String> = packages.iter().filter_map(|p| p["name"].as_str().map(str::to_owned)).collect();
    packages
        .iter()
        .map(|package| {
            let name = package["name"].as_str().unwrap_or_default().to_owned();
            let manifest = package["manifest_path"].as_str().unwrap_or_default();
            let is_service = manifest.contains("/services/");
            let deps = package["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .filter_map(|d| d["name"].as_str())
                .filter(|d| names.iter().any(|n| n == d))
                .map(str::to_owned)
                .collect();
            (name, (is_service, deps))
        })
        .collect()
}

#[test]
fn no_service_depends_on_another_service() {
    let workspace = workspace();
    let services: Vec<&String> = workspace.iter().filter(|(_, (service, _))| *service).map(|(n, _)| n).collect();
    assert_eq!(services.len(), 5, "the five services: {services:?}");
    let mut wrong = Vec::new();
    for (name, (is_service, deps)) in &workspace {
        if !is_service {
            continue;
        }
        for dep in deps.iter().filter(|d| services.contains(d)) {
            wrong.push(format!("{name} depends on {dep}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "a service depends on another service; move what they share into a crate below both \
         (see ARCHITECTURE.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_crates_below_the_services_depend_only_downwards() {
    let workspace = workspace();
    let mut wrong = Vec::new();
    for (name, allowed) in BELOW_SERVICES {
        let Some((_, deps)) = workspace.get(name) else {
            wrong.push(format!("{name} is not in the workspace any more: update this test and ARCHITECTURE.md"));
            continue;
        };
        for dep in deps.iter().filter(|d| !allowed.contains(&d.as_str())) {
            wrong.push(format!("{name} depends on {dep}, which is not below it"));
        }
    }
    assert!(wrong.is_empty(), "the layering of ARCHITECTURE.md is broken:\n{}", wrong.join("\n"));
}
