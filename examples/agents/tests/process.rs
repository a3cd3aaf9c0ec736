//! The demo agents as a process, as a user runs them: `demo-agent`
//! registers with discovery, serves, and deregisters on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{TestDatabase, spawn_discovery};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_agent_registers_serves_and_deregisters_on_sigterm() {
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_demo-agent"))
        .args(["weather", "--discovery", &discovery.url()])
        .env_remove("AGENTMESH_AGENT_URL")
        .env_remove("AGENTMESH_AGENT_LISTEN")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = agentmesh_testkit::http_client();
    let agent_url = format!("{}/api/v1/agents/weather-tool-v2", discovery.url());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let stored: serde_json::Value = loop {
        let answer = http.get(&agent_url).send().await.unwrap();
        if answer.status() == 200 {
            break answer.json().await.unwrap();
        }
        assert!(tokio::time::Instant::now() < deadline, "demo-agent did not register");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // It serves the contract at the address it registered.
    let base = stored["base_url"].as_str().unwrap();
    let answer: serde_json::Value = http
        .post(format!("{base}/skills/get_current_weather"))
        .json(&serde_json::json!({"location": "Chicago"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["output"]["temp_c"], 18.0);
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(http.get(&agent_url).send().await.unwrap().status(), 404, "not deregistered on SIGTERM");
}
