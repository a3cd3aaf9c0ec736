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
    let svc =
        spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap_or_else(|e| panic!("{e:#}"));
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

    // What REST refuses, the CLI refuses the same way, naming each field,
    // instead of registering the agent without the parts that do not fit.
    let lossy = dir.join("lossy.json");
    let body = r#"{"id": "lossy-tool", "base_url": "http://127.0.0.1:9001",
        "skills": [{"id": "s", "output_schema": "nope", "input_schema": [1, 2], "examples": [1, "x"]}]}"#;
    std::fs::write(&lossy, body).unwrap_or_else(|e| panic!("{e}"));
    let (ok, out, err) = agentmesh(&["agents", "--discovery", &url, "register", "-f", &lossy.to_string_lossy()]);
    assert!(!ok, "registered: {out}");
    for field in
        ["skills[0].input_schema:", "skills[0].output_schema:", "skills[0].examples[0]:", "skills[0].examples[1]:"]
    {
        assert!(err.contains(field), "{field} is named: {err}");
    }
    let rest = agentmesh_testkit::http_client()
        .post(format!("{url}/api/v1/agents"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rest.status().as_u16(), 400);
    let rest: serde_json::Value = rest.json().await.unwrap_or_else(|e| panic!("{e}"));
    let rest_fields: Vec<&str> =
        rest["details"]["errors"].as_array().into_iter().flatten().filter_map(|e| e["field"].as_str()).collect();
    assert_eq!(rest_fields.len(), 4, "{rest}");
    for field in rest_fields {
        assert!(err.contains(&format!("{field}:")), "REST names {field}, so does the CLI: {err}");
    }
    let array = dir.join("array.json");
    std::fs::write(&array, "[]").unwrap_or_else(|e| panic!("{e}"));
    let (ok, _, err) = agentmesh(&["agents", "--discovery", &url, "register", "-f", &array.to_string_lossy()]);
    assert!(!ok && err.contains("must be a JSON object"), "{err}");
    let (_, _, err) = agentmesh(&["agents", "--discovery", &url, "get", "lossy-tool"]);
    assert!(err.contains("agent `lossy-tool` is not registered (not_found)"), "nothing was registered: {err}");

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

/// `up --config` honours the file's database (its data directory is only a
/// default), `--print-config` of one service shows only its sections, a
/// list setting can be written with commas, and a variable with one
/// underscore too few is pointed out.
#[test]
fn up_honours_the_file_and_the_environment_speaks_plainly() {
    let dir = std::env::temp_dir().join(format!("agentmesh-config-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.join("agentmesh.toml");
    std::fs::write(&file, "[discovery]\ndatabase_url = \"sqlite:///var/lib/agentmesh/registry.db\"\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentmesh"));
        command.args(args).env_remove("AGENTMESH_CONFIG");
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().unwrap_or_else(|e| panic!("{e}"));
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let data = dir.join("data");
    let (out, _) =
        run(&["--config", &file.to_string_lossy(), "up", "--data-dir", &data.to_string_lossy(), "--print-config"], &[]);
    let section = |name: &str| {
        out.split(&format!("[{name}]")).nth(1).and_then(|rest| rest.split("\n[").next()).unwrap_or_default().to_owned()
    };
    assert!(section("discovery").contains("database_url = \"sqlite:///var/lib/agentmesh/registry.db\""), "{out}");
    let embedded = format!("database_url = \"sqlite://{}\"", data.join("agentmesh.db").display());
    assert!(section("planner").contains(&embedded), "what the file leaves out uses --data-dir: {out}");

    let (out, _) = run(&["serve", "discovery", "--print-config"], &[]);
    assert!(out.contains("[discovery]") && out.contains("[telemetry]"), "{out}");
    for other in ["[planner]", "[executor]", "[synthesis]", "[gateway]"] {
        assert!(!out.contains(other), "discovery does not use {other}: {out}");
    }

    let (out, err) = run(
        &["serve", "planner", "--print-config"],
        &[
            ("AGENTMESH_PLANNER__SELF_AGENT_IDS", "me, other"),
            ("AGENTMESH_DISCOVERY_DATABASE_URL", "sqlite://x.db"),
            // Read by name (the CLI's token, the tests' harness): no warning.
            ("AGENTMESH_TOKEN", "t"),
            ("AGENTMESH_INTEROP_DIR", "/tmp"),
        ],
    );
    assert!(!err.contains("AGENTMESH_TOKEN") && !err.contains("AGENTMESH_INTEROP_DIR"), "{err}");
    assert!(out.contains("self_agent_ids = [\n    \"me\",\n    \"other\",\n]"), "{out}");
    assert!(
        err.contains("AGENTMESH_DISCOVERY_DATABASE_URL is not read")
            && err.contains("did you mean AGENTMESH_DISCOVERY__DATABASE_URL?"),
        "{err}"
    );
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
    let output = run(&["up", "--data-dir", &dir.join("data").to_string_lossy(), "--print-config"]);
    let out = String::from_utf8_lossy(&output.stdout);
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
    let discovery =
        spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap_or_else(|e| panic!("{e:#}"));
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
        llm: agentmesh_planner::LlmSettings {
            llm: "openai:scripted".into(),
            llm_base_url: Some(llm.url()),
            ..agentmesh_planner::PlannerConfig::default().llm
        },
        ..agentmesh_planner::PlannerConfig::with_database_url(db.url.clone())
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
    assert!(err.contains(": 1 step over 1 capability offered to the model; 1 LLM call ("), "{err}");

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
    let discovery =
        spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap_or_else(|e| panic!("{e:#}"));
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
        llm: agentmesh_planner::LlmSettings {
            llm: format!("replay:{}", script.display()),
            ..agentmesh_planner::PlannerConfig::default().llm
        },
        ..agentmesh_planner::PlannerConfig::with_database_url(db.url.clone())
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

/// Each failure is one line saying what is wrong and what to do: no cause
/// repeated, no gRPC status prose, no server source lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_clear_line() {
    let closed = agentmesh_testkit::bind_local().await.unwrap_or_else(|e| panic!("{e}"));
    let port = closed.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
    drop(closed);
    let url = format!("http://127.0.0.1:{port}");
    let (ok, _, err) = agentmesh(&["agents", "--discovery", &url, "list"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&format!("nothing is listening at {url} (connection refused)")), "{err}");
    assert!(!err.contains("tcp connect error: tcp connect error"), "{err}");

    let db = TestDatabase::sqlite();
    let svc =
        spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap_or_else(|e| panic!("{e:#}"));
    let (ok, _, err) = agentmesh(&["agents", "--discovery", &svc.url(), "get", "nobody"]);
    assert!(!ok);
    assert_eq!(err.trim(), "error: agent `nobody` is not registered (not_found)");

    let Some(pg) = TestDatabase::postgres().await else { return };
    let missing = agentmesh_testkit::replace_database(&pg.url, "agentmesh_cli_missing_db");
    let (ok, _, err) = agentmesh(&["serve", "discovery", "--listen", "127.0.0.1:0", "--database-url", &missing]);
    assert!(!ok);
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: ") && last.contains("createdb"), "{err}");
    assert_eq!(err.matches("agentmesh_cli_missing_db\"").count(), 1, "said once: {err}");
}

/// A hosted provider without its key stops at start-up naming the missing
/// variable, not at the first request with a DNS or 401 error; an unknown
/// provider's message lists every accepted name.
#[test]
fn llm_settings_that_cannot_work_stop_the_start() {
    let start = |llm: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
            .args(["serve", "planner", "--listen", "127.0.0.1:0", "--database-url", "sqlite::memory:", "--llm"])
            .args(llm.split(' '))
            .env_remove("AGENTMESH_CONFIG")
            .env_remove("AGENTMESH_PLANNER__LLM_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_BASE_URL")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!output.status.success(), "{llm} started");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let err = start("openai:gpt-4.1-mini");
    assert!(err.contains("no OPENAI_API_KEY is set"), "{err}");
    let err = start("anthropic:sonnet");
    assert!(err.contains("no ANTHROPIC_API_KEY is set"), "{err}");
    let err = start("openai:x --llm-base-url 127.0.0.1:8000/v1");
    assert!(
        err.contains("`127.0.0.1:8000/v1` has no http:// or https:// scheme: write http://127.0.0.1:8000/v1"),
        "{err}"
    );
    let err = start("mistral:large");
    for name in ["openai", "openai-compatible", "anthropic", "gemini", "ollama", "vllm", "llamacpp", "replay"] {
        assert!(err.contains(name), "{name} is listed: {err}");
    }
}

/// The first `request refused` log line of `process` mentioning `needle`.
async fn refused_line(process: &agentmesh_testkit::ServiceProcess, needle: &str) -> serde_json::Value {
    for _ in 0..200 {
        let found = process
            .logs()
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|line| line["message"] == "request refused" && line.to_string().contains(needle));
        if let Some(line) = found {
            return line;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("no `request refused` line with {needle}; logs:\n{}", process.logs().join("\n"));
}

/// A refused request leaves an INFO line with its request id, so the id a
/// client quotes can be found in the logs; REST and gRPC alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_logged_with_their_request_id() {
    let discovery = agentmesh_testkit::ServiceProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_agentmesh")),
        &["serve", "discovery", "--listen", "127.0.0.1:0", "--database-url", "sqlite::memory:"],
        &[],
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let answer = agentmesh_testkit::http_client()
        .get(format!("{}/api/v1/agents/nobody", discovery.url()))
        .header("x-request-id", "req_quoted_in_a_report")
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.status().as_u16(), 404);
    let line = refused_line(&discovery, "req_quoted_in_a_report").await;
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!((line["status"].as_u64(), line["error"].as_str()), (Some(404), Some("not_found")), "{line}");
    assert_eq!(line["reason"], "agent `nobody` is not registered", "{line}");

    let url = discovery.url();
    let (ok, _, _) =
        tokio::task::spawn_blocking(move || agentmesh(&["agents", "--discovery", &url, "get", "nobody-over-grpc"]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(!ok);
    let line = refused_line(&discovery, "nobody-over-grpc").await;
    assert_eq!((line["level"].as_str(), line["code"].as_str()), (Some("INFO"), Some("NotFound")), "{line}");
    assert!(line["request_id"].as_str().is_some_and(|id| id.starts_with("req_")), "{line}");
}

/// An agent gone quiet is left out of planning: the summary shows that the
/// model was offered nothing and the reason says how to plan anyway, which
/// `--include-unhealthy` does. A plan that fails for want of a model server
/// names its request id, and the failed call is there to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_says_what_the_model_saw_and_a_failed_plan_can_be_followed_up() {
    use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply};
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig {
        heartbeat_interval_secs: 0.05,
        ..DiscoveryConfig::with_database_url(db.url.clone())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let registration = serde_json::json!({"id": "weather-tool-v2", "base_url": "http://w:1", "skills": [
        {"id": "get_current_weather", "description": "Current weather"}]});
    let response = agentmesh_testkit::http_client()
        .post(format!("{}/api/v1/agents", discovery.url()))
        .json(&registration)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(response.status().is_success());
    // Six missed intervals of 50 ms: inactive.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;

    let answer = r#"{"reasoning": "r", "steps": [{"step_id": "s1", "agent": "weather-tool-v2", "capability": "get_current_weather", "instruction": "i", "parameters": {}, "depends_on": []}]}"#;
    let llm =
        ScriptedLlmServer::start(vec![ScriptedReply::openai_content(answer)]).await.unwrap_or_else(|e| panic!("{e}"));
    let spawn = |llm_base_url: String| async {
        let listener = agentmesh_testkit::bind_local().await.unwrap_or_else(|e| panic!("{e}"));
        let url = format!("http://{}", listener.local_addr().unwrap_or_else(|e| panic!("{e}")));
        let config = agentmesh_planner::PlannerConfig {
            discovery_url: discovery.url(),
            llm: agentmesh_planner::LlmSettings {
                llm: "openai:scripted".into(),
                llm_base_url: Some(llm_base_url),
                llm_retries: 0,
                ..agentmesh_planner::PlannerConfig::default().llm
            },
            ..agentmesh_planner::PlannerConfig::with_database_url(db.url.clone())
        };
        (url, tokio::spawn(agentmesh_planner::serve_with_listener(config, listener, std::future::pending())))
    };
    let (planner_url, planner) = spawn(llm.url()).await;
    let plan = |args: Vec<String>| async move {
        tokio::task::spawn_blocking(move || agentmesh(&args.iter().map(String::as_str).collect::<Vec<_>>()))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let args = |extra: &[&str], url: &str| {
        let mut args = vec!["plan".to_owned(), "--planner".to_owned(), url.to_owned()];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args.push("What is the weather in Chicago?".to_owned());
        args
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (ok, out, err) = plan(args(&[], &planner_url)).await;
    assert!(ok, "{err}");
    assert!(err.contains(": 0 steps over 0 capabilities offered to the model; 0 LLM calls"), "{err}");
    assert!(err.contains("left out as inactive") && err.contains("--include-unhealthy"), "{err}");
    assert!(out.contains("\"steps\": []"), "{out}");
    let (ok, out, err) = plan(args(&["--include-unhealthy"], &planner_url)).await;
    assert!(ok, "{err}");
    assert!(err.contains(": 1 step over 1 capability offered to the model"), "{err}");
    assert!(out.contains("get_current_weather"), "{out}");
    planner.abort();

    // No model server behind the planner.
    let closed = agentmesh_testkit::bind_local().await.unwrap_or_else(|e| panic!("{e}"));
    let nowhere = format!("http://{}/v1", closed.local_addr().unwrap_or_else(|e| panic!("{e}")));
    drop(closed);
    let (planner_url, planner) = spawn(nowhere.clone()).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (ok, _, err) = plan(args(&["--include-unhealthy"], &planner_url)).await;
    assert!(!ok);
    let request_id = err
        .split_whitespace()
        .find(|w| w.starts_with("req_"))
        .unwrap_or_else(|| panic!("no request id: {err}"))
        .trim_end_matches(['`', ')', ':'])
        .to_owned();
    assert!(err.contains(&format!("agentmesh interactions {request_id}")), "{err}");
    assert!(err.contains("(unavailable)") && !err.contains("The service is currently unavailable"), "{err}");
    let (ok, out, err) = plan(vec!["interactions".into(), "--planner".into(), planner_url.clone(), request_id]).await;
    assert!(ok, "{err}");
    assert!(out.contains("== plan model=scripted") && out.contains("error: "), "the failed call is kept: {out}");
    assert!(out.contains(&nowhere.replace("/v1", "")), "its error says where it went: {out}");
    planner.abort();
}

/// `--print-config | head -1`: the reader leaving early is no error.
#[test]
fn printing_the_configuration_into_a_closed_pipe_is_quiet() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["up", "--print-config"])
        .env_remove("AGENTMESH_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    drop(child.stdout.take());
    let mut err = String::new();
    child.stderr.take().map(|mut s| s.read_to_string(&mut err));
    let status = child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success() && !err.contains("panicked"), "{status}: {err}");
}

/// The start-up line naming the trace collector hides its password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_address_is_logged_without_its_password() {
    let discovery = agentmesh_testkit::ServiceProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_agentmesh")),
        &[
            "serve",
            "discovery",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "sqlite::memory:",
            "--otlp-endpoint",
            "http://tracer:hunter2@127.0.0.1:9/v1/traces?token=hunter3",
        ],
        &[],
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let logs = discovery.logs().join("\n");
    assert!(logs.contains("http://tracer:***@127.0.0.1:9/v1/traces?token=***"), "{logs}");
    assert!(!logs.contains("hunter"), "{logs}");
}

#[test]
fn demo_runs_every_story_and_says_how_each_ended() {
    let (ok, out, err) = agentmesh(&["demo"]);
    assert!(ok, "the demo failed:\n{out}\n{err}");
    assert!(out.contains("SCRIPTED"), "the scripted model is not announced: {out}");
    let verdicts: Vec<&str> = out.lines().skip_while(|l| *l != "verdicts:").skip(1).collect();
    for story in ["weather", "time", "tsla", "tokyo", "review", "recovery"] {
        assert!(verdicts.iter().any(|l| l.starts_with(&format!("  ✔ {story}: "))), "{story}: {out}");
    }
    assert_eq!(verdicts.len(), 6, "{out}");
    // What happened is shown, not only judged.
    for shown in ["time-tool-v1", "calculation-agent", "step_retrying", "plan_extended", "[round 1]", "answer: "] {
        assert!(out.contains(shown) || err.contains(shown), "`{shown}` not shown:\n{out}\n{err}");
    }
    let (ok, _, err) = agentmesh(&["demo", "--story", "nope"]);
    assert!(!ok);
    assert!(err.contains("no story `nope`; the stories are weather, time, tsla, tokyo, review, recovery"), "{err}");
}

#[test]
fn up_without_a_model_says_how_to_give_one() {
    let dir = std::env::temp_dir().join(format!("agentmesh-up-nollm-{}", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["up", "--data-dir", dir.to_str().unwrap_or_default(), "--listen", "127.0.0.1:0"])
        .env_remove("AGENTMESH_CONFIG")
        .env("AGENTMESH_EXECUTOR__LISTEN", "127.0.0.1:0")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let stderr = child.stderr.take().unwrap_or_else(|| panic!("no stderr"));
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    let said = lines.by_ref().take(2).map(|l| l.unwrap_or_default()).collect::<Vec<_>>().join("\n");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(said.contains("planning needs a model") && said.contains("agentmesh demo"), "{said}");
}

#[test]
fn a_mistyped_key_or_section_is_named_with_what_was_meant() {
    let dir = std::env::temp_dir().join(format!("agentmesh-typo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let key = dir.join("key.toml");
    std::fs::write(&key, "[discovery]\nlisten_addr = \"127.0.0.1:7400\"\n").unwrap_or_else(|e| panic!("{e}"));
    let section = dir.join("section.toml");
    std::fs::write(&section, "[discovry]\nlisten = \"127.0.0.1:7400\"\n").unwrap_or_else(|e| panic!("{e}"));
    let (ok, _, err) =
        agentmesh(&["--config", key.to_str().unwrap_or_default(), "serve", "discovery", "--print-config"]);
    assert!(!ok);
    assert!(err.contains("[discovery] unknown setting `listen_addr`; did you mean `listen`?"), "{err}");
    assert!(!err.contains("default."), "{err}");
    let (ok, _, err) =
        agentmesh(&["--config", section.to_str().unwrap_or_default(), "serve", "discovery", "--print-config"]);
    assert!(!ok);
    assert!(err.contains("unknown section [discovry]; did you mean [discovery]?"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plan_files_are_read_strictly() {
    let dir = std::env::temp_dir().join(format!("agentmesh-planfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let list = dir.join("list.json");
    std::fs::write(&list, r#"[{"step_id": "s1", "agent": "a", "capability": "c"}]"#).unwrap_or_else(|e| panic!("{e}"));
    let wrapped = dir.join("wrapped.json");
    std::fs::write(&wrapped, r#"{"plan": {"steps": []}}"#).unwrap_or_else(|e| panic!("{e}"));
    // Refused before any executor is asked (none listens at this address).
    for (file, says) in [(&list, "it is a list"), (&wrapped, "wrapped in `plan`")] {
        let (ok, _, err) = agentmesh(&["run", file.to_str().unwrap_or_default(), "--executor", "http://127.0.0.1:9"]);
        assert!(!ok);
        assert!(err.contains("is not a plan") && err.contains(says), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    use std::io::BufRead as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["demo", "--story", "recovery"])
        .env_remove("AGENTMESH_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut first = String::new();
    std::io::BufReader::new(stdout).read_line(&mut first).unwrap_or_else(|e| panic!("{e}"));
    // The pipe is closed here, as `| head -1` closes it.
    let output = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
}

#[test]
fn a_new_token_comes_with_its_hashed_entry_and_a_wrong_role_is_named() {
    let (ok, out, err) =
        agentmesh(&["token", "--principal", "shop", "--role", "client", "--role", "agent:weather-tool-v2"]);
    assert!(ok, "{err}");
    let token = out.trim();
    assert!(token.starts_with("am_") && token.len() == 67, "{out}");
    let entry = format!(
        "[[token]]\nprincipal = \"shop\"\nroles = [\"client\", \"agent:weather-tool-v2\"]\nsha256 = \"{}\"",
        agentmesh_server::auth::token_hash(token)
    );
    assert!(err.contains(&entry), "{err}");
    assert!(!err.contains(token), "the token is printed once, on standard output");
    let (ok, _, err) = agentmesh(&["token", "--principal", "x", "--role", "root"]);
    assert!(!ok);
    assert!(err.contains("unknown role `root`: the roles are operator, client, service and agent:<id>"), "{err}");
    // A client certificate instead of a token: its entry, by fingerprint.
    let pki = agentmesh_testkit::TestPki::new("cli-token").unwrap_or_else(|e| panic!("{e}"));
    let issued = pki.issue("executor").unwrap_or_else(|e| panic!("{e}"));
    let cert = issued.cert.to_string_lossy().to_string();
    let (ok, out, err) = agentmesh(&["token", "--principal", "executor", "--role", "service", "--cert", &cert]);
    assert!(ok, "{err}");
    let pem = std::fs::read(&issued.cert).unwrap_or_else(|e| panic!("{e}"));
    let hash = agentmesh_server::auth::certificate_hash(&pem).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out, format!("[[certificate]]\nprincipal = \"executor\"\nroles = [\"service\"]\nsha256 = \"{hash}\"\n"));
}
