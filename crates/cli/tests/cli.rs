//! The `agentmesh` binary against a real discovery service.

use std::process::Command;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{TestDatabase, spawn_discovery};

fn agentmesh(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(args)
        .env_remove("AGENTMESH_CONFIG")
        .output()
        .unwrap_or_else(|e| panic!("running agentmesh: {e}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_commands_register_list_get_and_deregister() {
    let db = TestDatabase::sqlite();
    let svc = spawn_discovery(DiscoveryConfig { database_url: db.url.clone(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let url = svc.url();
    let dir = std::env::temp_dir().join(format!("agentmesh-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.join("weather.json");
    std::fs::write(
        &file,
        r#"{"id": "weather-tool-v2", "base_url": "http://127.0.0.1:9001", "tags": ["weather"],
            "skills": [{"id": "get_current_weather", "description": "Current weather for a location",
                        "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let file = file.to_string_lossy().into_owned();

    let (ok, out, err) = agentmesh(&["agents", "--discovery", &url, "register", "-f", &file]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "registered weather-tool-v2");
    let (ok, out, _) = agentmesh(&["agents", "--discovery", &url, "register", "-f", &file]);
    assert!(ok);
    assert_eq!(out.trim(), "updated weather-tool-v2");

    let (ok, out, err) = agentmesh(&["agents", "--discovery", &url, "list"]);
    assert!(ok, "{err}");
    assert!(out.contains("weather-tool-v2:skill:get_current_weather") && out.contains("active"), "{out}");
    assert!(err.contains("1 agents, 0 reasoners, 1 skills"), "{err}");
    let (ok, out, _) = agentmesh(&["agents", "--discovery", &url, "list", "--format", "compact"]);
    assert!(ok);
    let compact: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(compact["skills"][0]["target"], "weather-tool-v2:skill:get_current_weather");

    let (ok, out, _) = agentmesh(&["agents", "--discovery", &url, "get", "weather-tool-v2"]);
    assert!(ok);
    let agent: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(agent["skills"][0]["input_schema"]["required"], serde_json::json!(["location"]));

    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"id": "bad id", "base_url": "ftp://x"}"#).unwrap_or_else(|e| panic!("{e}"));
    let (ok, _, err) = agentmesh(&["agents", "--discovery", &url, "register", "-f", &bad.to_string_lossy()]);
    assert!(!ok);
    assert!(err.contains("id:") && err.contains("base_url:"), "field errors are shown: {err}");

    let (ok, out, _) = agentmesh(&["agents", "--discovery", &url, "deregister", "weather-tool-v2"]);
    assert!(ok);
    assert_eq!(out.trim(), "deregistered weather-tool-v2");
    let (ok, _, err) = agentmesh(&["agents", "--discovery", &url, "get", "weather-tool-v2"]);
    assert!(!ok);
    assert!(err.contains("not registered"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn configuration_layers_defaults_file_environment_and_flags() {
    let dir = std::env::temp_dir().join(format!("agentmesh-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.join("agentmesh.toml");
    std::fs::write(
        &file,
        "[discovery]\nlisten = \"127.0.0.1:9000\"\ncache_ttl_secs = 5.0\nheartbeat_interval_secs = 2.0\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let output = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args([
            "--config",
            &file.to_string_lossy(),
            "serve",
            "discovery",
            "--listen",
            "127.0.0.1:9100",
            "--print-config",
        ])
        .env("AGENTMESH_DISCOVERY__CACHE_TTL_SECS", "7")
        .env("AGENTMESH_TEST_DATABASE_URL", "postgres://ignored")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(out.contains("listen = \"127.0.0.1:9100\""), "flag wins: {out}");
    assert!(out.contains("cache_ttl_secs = 7.0"), "environment beats the file: {out}");
    assert!(out.contains("heartbeat_interval_secs = 2.0"), "file beats defaults: {out}");
    assert!(out.contains("database_url = \"sqlite://agentmesh.db\""), "default: {out}");

    let output = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["serve", "discovery", "--heartbeat-interval-secs", "0", "--print-config"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("heartbeat_interval_secs"));
    let _ = std::fs::remove_dir_all(&dir);
}
