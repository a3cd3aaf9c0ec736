//! What can be checked of `deploy/` without a container engine: the files
//! parse, and every command they give the `agentmesh` binary, with the
//! environment they set, is accepted by its own argument and configuration
//! parsing (`--print-config` stops right after it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_norway::Value;

const EXE: &str = env!("CARGO_BIN_EXE_agentmesh");

fn deploy(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(file)
}

fn strings(value: &Value) -> Vec<String> {
    value.as_sequence().map(|s| s.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

/// Compose's `${NAME:-default}` as compose reads it with `NAME` unset.
fn interpolate(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else { break };
        let inner = &rest[start + 2..start + end];
        out.push_str(inner.split_once(":-").map_or("", |(_, default)| default));
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Runs `agentmesh ARGS --print-config` with `env`; returns the printed configuration.
async fn accepted(args: &[String], env: &[(String, String)]) -> String {
    let output = tokio::process::Command::new(EXE)
        .args(args)
        .arg("--print-config")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{args:?} refused: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn the_compose_file_runs_commands_the_binary_accepts() {
    let text = std::fs::read_to_string(deploy("docker-compose.yml")).unwrap();
    let mut compose: Value = serde_norway::from_str(&text).unwrap();
    compose.apply_merge().unwrap();
    let services = compose["services"].as_mapping().unwrap();
    let mut checked = Vec::new();
    for (name, service) in services {
        let name = name.as_str().unwrap();
        let command = strings(&service["command"]);
        if service.get("build").is_none() {
            continue;
        }
        assert!(!command.is_empty(), "{name} builds agentmesh but gives it no command");
        let env: Vec<(String, String)> = service["environment"]
            .as_mapping()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.as_str().unwrap().to_owned(), interpolate(v.as_str().unwrap_or_default())))
                    .collect()
            })
            .unwrap_or_default();
        let config = accepted(&command, &env).await;
        for (key, value) in env.iter().filter(|(k, _)| k.ends_with("__DATABASE_URL")) {
            let shown = agentmesh_server::redact(value);
            assert!(config.contains(&format!("database_url = \"{shown}\"")), "{key} reached {name}'s configuration");
        }
        checked.push(name.to_owned());
    }
    checked.sort();
    assert_eq!(checked, ["discovery-1", "discovery-2", "executor-1", "executor-2", "gateway", "planner", "synthesis"]);
    let prometheus = std::fs::read_to_string(deploy("prometheus.yml")).unwrap();
    let prometheus: Value = serde_norway::from_str(&prometheus).unwrap();
    let targets: Vec<String> = prometheus["scrape_configs"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|job| strings(&job["static_configs"][0]["targets"]))
        .collect();
    for name in &checked {
        assert!(targets.iter().any(|t| t.starts_with(name.as_str())), "Prometheus scrapes {name}");
    }
}

#[tokio::test]
async fn the_kubernetes_manifests_run_commands_the_binary_accepts() {
    let mut containers = 0;
    for file in ["discovery.yaml", "executor.yaml", "planner.yaml", "synthesis.yaml", "gateway.yaml"] {
        let text = std::fs::read_to_string(deploy(&format!("kubernetes/{file}"))).unwrap();
        for document in serde_norway::Deserializer::from_str(&text) {
            let document = Value::deserialize(document).unwrap();
            if document["kind"] != "Deployment" {
                continue;
            }
            for container in document["spec"]["template"]["spec"]["containers"].as_sequence().unwrap() {
                let args = strings(&container["args"]);
                let config = accepted(&args, &[]).await;
                let port = container["ports"][0]["containerPort"].as_u64().unwrap();
                assert!(
                    config.contains(&format!("listen = \"0.0.0.0:{port}\"")),
                    "{file}: the container listens on its port"
                );
                assert_eq!(container["readinessProbe"]["httpGet"]["port"].as_u64(), Some(port), "{file}");
                containers += 1;
            }
        }
    }
    assert_eq!(containers, 5);
}

use serde::Deserialize as _;
