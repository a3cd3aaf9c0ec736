//! `agentmesh agents a2a URL`, as a user runs it, against an agent
//! written with the official A2A SDK (installed by `.ci/run`): the card
//! names the agent, its skills join the catalog, and a URL where no card
//! answers is refused with the reason.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{TestDatabase, interop, spawn_discovery};
use serde_json::Value;

fn agentmesh(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentmesh")).args(args).env_remove("AGENTMESH_CONFIG").output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_agent_joins_from_its_card() {
    let Some(currency) = interop::A2aAgent::start("agentmesh agents a2a", "1.0", true).await else { return };
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let url = discovery.url();

    let out = tokio::task::block_in_place(|| agentmesh(&["agents", "a2a", &currency.url, "--discovery", &url]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        said.trim(),
        "registered currency-agent: Currency Agent (A2A 1.0, streaming), 1 skill: convert_currency",
        "the card's name is the agent id"
    );
    let agent: Value = agentmesh_testkit::http_client()
        .get(format!("{url}/api/v1/agents/currency-agent"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = agent.to_string();
    assert!(text.contains("\"transport\":\"a2a\"") && text.contains("\"version\":\"1.2.0\""), "{text}");

    // --id names it otherwise; a second run updates it.
    let out =
        tokio::task::block_in_place(|| agentmesh(&["agents", "a2a", &currency.url, "--id", "fx", "--discovery", &url]));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("registered fx:"));

    // No card there: refused, saying where it looked.
    let out = tokio::task::block_in_place(|| agentmesh(&["agents", "a2a", "http://127.0.0.1:9", "--discovery", &url]));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(error.contains("http://127.0.0.1:9/.well-known/agent-card.json could not be fetched"), "{error}");
}
