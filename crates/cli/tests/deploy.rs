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

/// A stand-in for the value of each secret key the Kubernetes manifests read.
fn secret_stand_in(key: &str) -> &'static str {
    match key {
        "url" => "postgres://agentmesh:secret@db/agentmesh",
        "llm" => "openai:gpt-4.1-mini",
        "openai-base-url" => "http://llm.example:8080/v1",
        _ => "secret",
    }
}

/// Kubernetes's `$(NAME)` in an `env` value, from the variables defined before it.
fn expand(value: &str, env: &[(String, String)]) -> String {
    env.iter().fold(value.to_owned(), |value, (name, known)| value.replace(&format!("$({name})"), known))
}

/// The environment a container of the Kubernetes base gets: the shared
/// ConfigMap (`envFrom`), then its own `env`, with stand-ins for secrets
/// and pod fields.
fn kubernetes_env(container: &Value, config: &Value) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for source in container["envFrom"].as_sequence().into_iter().flatten() {
        assert_eq!(
            source["configMapRef"]["name"].as_str(),
            Some("agentmesh-config"),
            "only the shared ConfigMap is read whole"
        );
        for (key, value) in config["data"].as_mapping().unwrap() {
            env.push((key.as_str().unwrap().to_owned(), value.as_str().unwrap().to_owned()));
        }
    }
    for variable in container["env"].as_sequence().into_iter().flatten() {
        let name = variable["name"].as_str().unwrap().to_owned();
        let value = if let Some(value) = variable["value"].as_str() {
            expand(value, &env)
        } else if let Some(key) = variable["valueFrom"]["secretKeyRef"]["key"].as_str() {
            secret_stand_in(key).to_owned()
        } else {
            // A pod field (metadata.name, metadata.namespace).
            "agentmesh".to_owned()
        };
        env.push((name, value));
    }
    env
}

#[tokio::test]
async fn the_kubernetes_manifests_run_commands_the_binary_accepts() {
    let config = std::fs::read_to_string(deploy("kubernetes/base/config.yaml")).unwrap();
    let config: Value = serde_norway::from_str(&config).unwrap();
    assert_eq!(config["metadata"]["name"].as_str(), Some("agentmesh-config"));
    assert!(
        config["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"].as_str().is_some_and(|e| e.starts_with("http://")),
        "the shared ConfigMap names the OTLP endpoint"
    );
    let files = [
        ("discovery.yaml", agentmesh_discovery::SERVICE_NAME),
        ("executor.yaml", agentmesh_executor::SERVICE_NAME),
        ("planner.yaml", agentmesh_planner::SERVICE_NAME),
        ("synthesis.yaml", agentmesh_synthesis::SERVICE_NAME),
        ("gateway.yaml", agentmesh_gateway::SERVICE_NAME),
    ];
    let mut containers = 0;
    for (file, grpc_service) in files {
        let text = std::fs::read_to_string(deploy(&format!("kubernetes/base/{file}"))).unwrap();
        for document in serde_norway::Deserializer::from_str(&text) {
            let document = Value::deserialize(document).unwrap();
            if document["kind"] != "Deployment" {
                continue;
            }
            for container in document["spec"]["template"]["spec"]["containers"].as_sequence().unwrap() {
                let args = strings(&container["args"]);
                let env = kubernetes_env(container, &config);
                assert!(
                    env.iter().any(|(k, _)| k == "OTEL_EXPORTER_OTLP_ENDPOINT"),
                    "{file}: the OTLP endpoint is wired in"
                );
                let printed = accepted(&args, &env).await;
                let port = container["ports"][0]["containerPort"].as_u64().unwrap();
                assert!(
                    printed.contains(&format!("listen = \"0.0.0.0:{port}\"")),
                    "{file}: the container listens on its port"
                );
                for (key, value) in env.iter().filter(|(k, _)| k.ends_with("__DATABASE_URL")) {
                    let shown = agentmesh_server::redact(value);
                    assert!(
                        printed.contains(&format!("database_url = \"{shown}\"")),
                        "{file}: {key} reached the configuration"
                    );
                }
                for (key, value) in env.iter().filter(|(k, _)| k.ends_with("__LLM")) {
                    assert!(printed.contains(&format!("llm = \"{value}\"")), "{file}: {key} reached the configuration");
                }
                let readiness = &container["readinessProbe"]["grpc"];
                assert_eq!(readiness["port"].as_u64(), Some(port), "{file}: gRPC readiness on the container's port");
                assert_eq!(
                    readiness["service"].as_str(),
                    Some(grpc_service),
                    "{file}: readiness asks for the service's health"
                );
                let liveness = &container["livenessProbe"]["httpGet"];
                assert_eq!(liveness["path"].as_str(), Some("/healthz"), "{file}: liveness is /healthz");
                assert_eq!(liveness["port"].as_u64(), Some(port), "{file}: liveness on the container's port");
                containers += 1;
            }
        }
    }
    assert_eq!(containers, 5);
}

use serde::Deserialize as _;
