//! Secrets stay secret: the whole mesh (`agentmesh up`) runs with a password
//! in its PostgreSQL URL, an API key in the environment, a password and an
//! `api_key` parameter in the LLM's base URL, and an agent registered with
//! credentials in its address; the model server echoes what it was sent in
//! its error bodies, as some do. None of those secrets may appear in the
//! logs, the exported spans, `/metrics`, `--print-config`, the errors a
//! client sees, the interaction log or the catalog.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use agentmesh_testkit::{OtlpReceiver, ScriptedLlmServer, ScriptedReply, ServiceProcess, TestDatabase};
use serde_json::json;

const EXE: &str = env!("CARGO_BIN_EXE_agentmesh");

const API_KEY: &str = "sk-env-secret-key";
const LLM_PASSWORD: &str = "llm-pass-secret";
const LLM_QUERY_KEY: &str = "q-secret-key";
const AGENT_PASSWORD: &str = "agent-pass-secret";

/// The address `up` announced for `service` (`… executor on 127.0.0.1:PORT, …`).
fn announced(logs: &[String], service: &str) -> String {
    let line = logs.iter().find(|l| l.starts_with("agentmesh up: ")).expect("the announcement");
    let after = line.split(&format!("{service} on ")).nth(1).unwrap_or_else(|| panic!("no {service} in {line}"));
    let addr: String = after.chars().take_while(|c| !matches!(c, ' ' | ',' | ';')).collect();
    format!("http://{addr}")
}

/// `url` with `password` for its user, unless it has one (returned then).
fn with_password(url: &str, password: &str) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (user, host) = rest.split_once('@').expect("a user in the test database URL");
    match user.split_once(':') {
        Some((_, given)) => (url.to_owned(), given.to_owned()),
        None => (format!("{scheme}://{user}:{password}@{host}"), password.to_owned()),
    }
}

fn assert_hidden(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!text.contains(secret), "{what} shows the secret `{secret}`:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_is_shown_anywhere_during_a_whole_run() {
    let Some(pg) = TestDatabase::postgres().await else { return };
    let (database_url, pg_password) = with_password(&pg.url, "pg-pass-secret");
    let receiver = OtlpReceiver::start().await.unwrap();
    let echo = format!("bad request: key {API_KEY}, password {LLM_PASSWORD}, api_key={LLM_QUERY_KEY}");
    let plan = json!({"reasoning": "r", "steps": [{"step_id": "s1", "agent": "vault-agent", "capability": "fetch",
        "instruction": "fetch it", "parameters": {}, "depends_on": []}]});
    let mut replies = vec![ScriptedReply::openai_content(&plan.to_string())];
    replies.extend((0..8).map(|_| ScriptedReply::error(400, json!({"error": {"message": echo}}))));
    let llm = ScriptedLlmServer::start(replies).await.unwrap();
    let llm_base = format!("http://llm-user:{LLM_PASSWORD}@{}/v1?api_key={LLM_QUERY_KEY}", llm.addr);
    let secrets = [pg_password.as_str(), API_KEY, LLM_PASSWORD, LLM_QUERY_KEY, AGENT_PASSWORD];

    let dir = std::env::temp_dir().join(format!("agentmesh-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("agentmesh.toml");
    let mut file = String::new();
    for section in ["discovery", "executor", "planner", "synthesis", "gateway"] {
        file.push_str(&format!("[{section}]\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"{database_url}\"\n"));
        if section == "executor" {
            file.push_str("max_retries = 0\n");
        }
    }
    std::fs::write(&config, file).unwrap();
    let config = config.to_string_lossy().to_string();
    let data_dir = dir.join("data").to_string_lossy().to_string();
    let up_args = [
        "--config",
        &config,
        "up",
        "--data-dir",
        &data_dir,
        "--llm",
        "openai:scripted-model",
        "--llm-base-url",
        &llm_base,
        "--llm-structured",
        "json_schema",
    ];
    let endpoint = receiver.endpoint();
    let env = [
        ("OPENAI_API_KEY", API_KEY),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];

    // --print-config shows every setting, no secret.
    let printed =
        tokio::process::Command::new(EXE).args(up_args).arg("--print-config").envs(env).output().await.unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&printed.stdout), String::from_utf8_lossy(&printed.stderr));
    assert!(printed.contains("llm-user:***@"), "{printed}");
    assert_hidden("--print-config", &printed, &secrets);

    let mut up = ServiceProcess::spawn(Path::new(EXE), &up_args, &env).await.unwrap();
    let logs = up.logs();
    let discovery = announced(&logs, "discovery");
    let executor = announced(&logs, "executor");
    let planner = announced(&logs, "planner");
    let synthesis = announced(&logs, "synthesis");
    let gateway = announced(&logs, "gateway");
    let client = agentmesh_testkit::http_client();
    for url in [&discovery, &executor, &planner, &synthesis, &gateway] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !client.get(format!("{url}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
            assert!(tokio::time::Instant::now() < deadline, "{url} did not become ready: {:#?}", up.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // An agent whose address carries credentials (nothing listens there).
    let agent = json!({"id": "vault-agent", "base_url": format!("http://vault:{AGENT_PASSWORD}@127.0.0.1:9/api"),
        "skills": [{"id": "fetch", "description": "Fetches a document from the vault"}]});
    let registered = client.post(format!("{discovery}/api/v1/agents")).json(&agent).send().await.unwrap();
    let status = registered.status();
    let body = registered.text().await.unwrap();
    assert!(status.is_success(), "{status} {body}");
    assert!(body.contains("vault:***@127.0.0.1:9"), "{body}");
    assert_hidden("the registration's answer", &body, &secrets);
    for path in
        ["/api/v1/agents/vault-agent", "/api/v1/discovery/capabilities", "/api/v1/discovery/capabilities?format=xml"]
    {
        let shown = client.get(format!("{discovery}{path}")).send().await.unwrap().text().await.unwrap();
        assert!(shown.contains("vault:***@"), "{path}: {shown}");
        assert_hidden(path, &shown, &secrets);
    }

    // One orchestration: the step fails naming the agent's address, then
    // the model server answers with the secrets it was sent.
    let asked = tokio::process::Command::new(EXE)
        .args(["ask", "Fetch the vault document", "--gateway", &gateway])
        .env_remove("AGENTMESH_CONFIG")
        .output()
        .await
        .unwrap();
    let asked = format!("{}{}", String::from_utf8_lossy(&asked.stdout), String::from_utf8_lossy(&asked.stderr));
    assert!(asked.contains("vault:***@127.0.0.1:9"), "the step's error names the agent: {asked}");
    assert!(asked.contains("key ***, password ***, api_key=***"), "the model's error is shown, scrubbed: {asked}");
    assert_hidden("ask's output", &asked, &secrets);
    let request_id = asked
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("req_"))
        .unwrap_or_else(|| panic!("no request id in {asked}"))
        .to_owned();

    let interactions = tokio::process::Command::new(EXE)
        .args(["interactions", &request_id, "--planner", &planner])
        .env_remove("AGENTMESH_CONFIG")
        .output()
        .await
        .unwrap();
    let interactions = String::from_utf8_lossy(&interactions.stdout).to_string();
    assert!(interactions.contains("error: "), "the failed call is in the interaction log: {interactions}");
    assert_hidden("the interaction log", &interactions, &secrets);

    for url in [&discovery, &executor, &planner, &synthesis, &gateway] {
        let metrics = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
        assert_hidden(&format!("{url}/metrics"), &metrics, &secrets);
    }

    assert!(up.terminate().await.unwrap().success());
    let logs = up.logs().join("\n");
    assert!(logs.contains("***"), "the logs show where secrets were hidden: {logs}");
    assert_hidden("the logs", &logs, &secrets);
    // Only the mesh's own failures: the spans of the request hold the step
    // error and the model's answer.
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| spans.iter().any(|s| s.service == "agentmesh-gateway"))
        .await;
    assert!(!spans.is_empty());
    let exported = format!("{spans:?}");
    assert!(exported.contains(&request_id), "the request's spans were exported");
    assert_hidden("the exported spans", &exported, &secrets);
    let _ = std::fs::remove_dir_all(&dir);
}
