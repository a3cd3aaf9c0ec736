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
    assert!(err.contains("1 agent, 0 reasoners, 1 skill"), "{err}");
    let (ok, out, _) = agentmesh(&["agents", "--discovery", &url, "list", "--format", "compact"]);
    assert!(ok);
    let compact: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(compact["skills"][0]["target"], "weather-tool-v2:skill:get_current_weather");

    let (ok, out, _) = agentmesh(&["agents", "--discovery", &url, "get", "weather-tool-v2"]);
    assert!(ok);
    let agent: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(agent["skills"][0]["input_schema"]["required"], serde_json::json!(["location"]));
    assert!(agent["updated_at"].as_str().is_some_and(|t| t.ends_with('Z')), "the same fields as REST: {out}");

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
    assert!(out.contains("database_url = \"sqlite://.agentmesh/agentmesh.db\""), "default: {out}");

    let output = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["serve", "discovery", "--heartbeat-interval-secs", "0", "--print-config"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("heartbeat_interval_secs"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn watch_stream_limit_is_configured_like_the_other_limits() {
    let print = |value: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentmesh"));
        command.args(["serve", "discovery", "--print-config"]).env_remove("AGENTMESH_CONFIG");
        if let Some(value) = value {
            command.env("AGENTMESH_DISCOVERY__MAX_WATCH_STREAMS", value);
        }
        command.output().unwrap_or_else(|e| panic!("{e}"))
    };
    let default = print(None);
    assert!(String::from_utf8_lossy(&default.stdout).contains("max_watch_streams = 256"), "{default:?}");
    let set = print(Some("8"));
    assert!(String::from_utf8_lossy(&set.stdout).contains("max_watch_streams = 8"), "{set:?}");
    let zero = print(Some("0"));
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("max_watch_streams must be at least 1"), "{zero:?}");
}

#[test]
fn printed_configuration_and_errors_hide_passwords_and_keys() {
    let dir = std::env::temp_dir().join(format!("agentmesh-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.join("agentmesh.toml");
    std::fs::write(
        &file,
        "[planner]\ndatabase_url = \"postgres://planner:hunter2-file@db.internal/agentmesh\"\n\
         llm_base_url = \"https://llm:hunter2-llm@llm.internal/v1?key=hunter2-key\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_agentmesh"))
            .arg("--config")
            .arg(&file)
            .args(args)
            .env("AGENTMESH_EXECUTOR__DATABASE_URL", "postgres://executor@db.internal/agentmesh?password=hunter2-env")
            .env("OPENAI_API_KEY", "sk-hunter2-openai")
            .env("ANTHROPIC_API_KEY", "sk-ant-hunter2")
            .env_remove("AGENTMESH_CONFIG")
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let flag = "postgres://discovery:hunter2-flag@db.internal/agentmesh";
    for args in [
        &["serve", "discovery", "--database-url", flag, "--print-config"][..],
        &["serve", "planner", "--llm", "openai:gpt-4o,anthropic:sonnet", "--print-config"],
        &["up", "--llm", "openai:gpt-4o", "--data-dir", &dir.join("data").to_string_lossy(), "--print-config"],
    ] {
        let output = run(args);
        let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "{args:?}: {err}");
        assert!(!out.contains("hunter2") && !err.contains("hunter2"), "{args:?} printed a secret:\n{out}{err}");
    }
    let output = run(&["serve", "discovery", "--database-url", flag, "--print-config"]);
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(out.contains("database_url = \"postgres://discovery:***@db.internal/agentmesh\""), "{out}");
    assert!(out.contains("database_url = \"postgres://executor@db.internal/agentmesh?password=***\""), "{out}");
    assert!(out.contains("llm_base_url = \"https://llm:***@llm.internal/v1?key=***\""), "{out}");

    // Refused URLs are named without their password too.
    for url in ["mysql://discovery:hunter2-refused@db.internal/agentmesh", "postgresx://discovery:hunter2-refused@db"] {
        let output = run(&["serve", "discovery", "--listen", "127.0.0.1:0", "--database-url", url]);
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{url} was accepted");
        assert!(!err.contains("hunter2") && !String::from_utf8_lossy(&output.stdout).contains("hunter2"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_and_interactions_commands_talk_to_a_running_planner() {
    use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply};
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig { database_url: db.url.clone(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let registration = serde_json::json!({"id": "weather-tool-v2", "base_url": "http://w:1", "skills": [
        {"id": "get_current_weather", "description": "Current weather",
         "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]});
    let file = std::env::temp_dir().join(format!("agentmesh-cli-plan-{}.json", std::process::id()));
    std::fs::write(&file, registration.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let (ok, _, err) =
        agentmesh(&["agents", "--discovery", &discovery.url(), "register", "-f", &file.to_string_lossy()]);
    assert!(ok, "{err}");
    let _ = std::fs::remove_file(&file);

    let answer = r#"{"reasoning": "r", "steps": [{"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather", "instruction": "i", "parameters": {"location": "Chicago"}, "depends_on": []}]}"#;
    let llm =
        ScriptedLlmServer::start(vec![ScriptedReply::openai_content(answer)]).await.unwrap_or_else(|e| panic!("{e}"));
    let listener = agentmesh_testkit::bind_local().await.unwrap_or_else(|e| panic!("{e}"));
    let planner_url = format!("http://{}", listener.local_addr().unwrap_or_else(|e| panic!("{e}")));
    let config = agentmesh_planner::PlannerConfig {
        discovery_url: discovery.url(),
        database_url: db.url.clone(),
        llm: "openai:scripted".into(),
        llm_base_url: Some(llm.url()),
        ..Default::default()
    };
    let planner = tokio::spawn(agentmesh_planner::serve_with_listener(config, listener, std::future::pending()));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let url = planner_url.clone();
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || agentmesh(&["plan", "--planner", &url, "Weather in Chicago?"]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(plan["steps"][0]["parameters"], serde_json::json!({"location": "Chicago"}));
    let request_id = err.split_whitespace().nth(1).unwrap_or_default().trim_end_matches(':').to_owned();
    assert!(request_id.starts_with("req_"), "{err}");

    let url = planner_url.clone();
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || agentmesh(&["interactions", "--planner", &url, &request_id]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(ok, "{err}");
    assert!(
        out.contains("== plan model=scripted-model mode=json_schema ") && out.contains("get_current_weather"),
        "{out}"
    );
    assert!(!out.contains("LLM_INTERACTION_KIND"), "{out}");
    planner.abort();
}

#[test]
fn up_fails_before_announcing_anything_when_a_port_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = taken.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
    let dir = std::env::temp_dir().join(format!("agentmesh-cli-up-{}", std::process::id()));
    let (ok, _, err) = agentmesh(&["up", "--listen", &addr, "--data-dir", &dir.to_string_lossy()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "{err}");
    assert!(err.contains(&format!("binding discovery to {addr}")), "{err}");
    assert!(!err.contains("agentmesh up:"), "the banner came before the failure: {err}");
}

#[test]
fn text_logs_written_to_a_pipe_have_no_colour_codes() {
    use std::io::BufRead;
    let db = TestDatabase::sqlite();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["serve", "discovery", "--listen", "127.0.0.1:0", "--database-url", &db.url, "--log-format", "text"])
        .env_remove("AGENTMESH_CONFIG")
        .env_remove("AGENTMESH_LOG_FORMAT")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr"));
    let mut seen = String::new();
    for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("listening") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.contains("listening"), "{seen}");
    assert!(!seen.contains('\u{1b}'), "colour codes in a pipe: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_replay_script_plans_offline() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/replay/weather.json");
    assert!(script.exists(), "{} is missing", script.display());
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig { database_url: db.url.clone(), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    // The README's walk-through agent.
    let registration = serde_json::json!({"id": "weather-tool-v2", "base_url": "http://127.0.0.1:9001", "skills": [
        {"id": "get_current_weather", "description": "Current weather for a location",
         "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}]});
    let registered = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents", discovery.url()))
        .json(&registration)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(registered.status().is_success());
    let listener = agentmesh_testkit::bind_local().await.unwrap_or_else(|e| panic!("{e}"));
    let planner_url = format!("http://{}", listener.local_addr().unwrap_or_else(|e| panic!("{e}")));
    let config = agentmesh_planner::PlannerConfig {
        discovery_url: discovery.url(),
        database_url: db.url.clone(),
        llm: format!("replay:{}", script.display()),
        ..Default::default()
    };
    let planner = tokio::spawn(agentmesh_planner::serve_with_listener(config, listener, std::future::pending()));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let url = planner_url.clone();
    let (ok, out, err) =
        tokio::task::spawn_blocking(move || agentmesh(&["plan", "What is the weather in Chicago?", "--planner", &url]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(plan["steps"][0]["agent"], "weather-tool-v2", "{out}");
    assert_eq!(plan["steps"][0]["parameters"], serde_json::json!({"location": "Chicago"}));
    planner.abort();
}

#[test]
fn every_service_keeps_its_data_where_up_does_by_default() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("agentmesh-cli-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["serve", "discovery", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env_remove("AGENTMESH_CONFIG")
        .env_remove("AGENTMESH_DISCOVERY__DATABASE_URL")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr"));
    let mut seen = String::new();
    for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("listening") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let created = dir.join(".agentmesh/agentmesh.db").exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(created, "no .agentmesh/agentmesh.db; logs:\n{seen}");
}

#[test]
fn an_address_without_a_scheme_says_what_to_write() {
    let (ok, _, err) = agentmesh(&["agents", "--discovery", "127.0.0.1:7400", "list"]);
    assert!(!ok);
    assert!(err.contains("`127.0.0.1:7400` has no scheme: write http://127.0.0.1:7400"), "{err}");
    let (ok, _, err) = agentmesh(&[
        "serve",
        "planner",
        "--listen",
        "127.0.0.1:0",
        "--discovery",
        "127.0.0.1:7400",
        "--llm",
        "replay:nowhere.json",
        "--database-url",
        "sqlite::memory:",
    ]);
    assert!(!ok);
    assert!(err.contains("discovery_url `127.0.0.1:7400` has no scheme: write http://127.0.0.1:7400"), "{err}");
}
