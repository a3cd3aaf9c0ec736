//! `agentmesh agents mcp --id time -- python -m mcp_server_time`, as a
//! user runs it: the reference time server (installed by `.ci/run`) runs as
//! the command's child, its tools join the catalog, a server that dies is
//! started again, and stopping the command removes the agent. And the
//! other way: `agentmesh mcp-stdio` launched by the official Python MCP
//! client, asking `agentmesh demo --serve`.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentmesh_discovery::DiscoveryConfig;
use agentmesh_testkit::{TestDatabase, interop, spawn_discovery};
use serde_json::Value;

async fn agent(discovery: &str, id: &str) -> Option<Value> {
    let response =
        agentmesh_testkit::http_client().get(format!("{discovery}/api/v1/agents/{id}")).send().await.unwrap();
    if response.status() == 404 {
        return None;
    }
    assert!(response.status().is_success(), "{}", response.status());
    Some(response.json().await.unwrap())
}

/// The children of process `pid` (each thread keeps its own list).
fn children(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks
        .flat_map(|task| {
            std::fs::read_to_string(task.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

async fn wait_for(what: &str, said: &Mutex<String>, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what} did not happen within 30 s; the command said:\n{}",
            said.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_joins_is_restarted_and_leaves_with_the_command() {
    let Some(server) = interop::time_server("agentmesh agents mcp") else { return };
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let url = discovery.url();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["agents", "mcp", "--id", "time", "--discovery", &url, "--"])
        .args(&server)
        .env_remove("AGENTMESH_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = Arc::new(Mutex::new(String::new()));
    let sink = said.clone();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push_str(&(line + "\n"));
        }
    });

    wait_for("the registration", &said, async || agent(&url, "time").await.is_some()).await;
    let listed = agent(&url, "time").await.unwrap().to_string();
    assert!(listed.contains("get_current_time") && listed.contains("\"transport\":\"mcp\""), "{listed}");
    wait_for("the banner", &said, async || said.lock().unwrap().contains("2 tools: get_current_time, convert_time"))
        .await;

    // kill -9 the server: the command starts it again.
    let first = children(child.id());
    assert_eq!(first.len(), 1, "one server process: {first:?}");
    assert!(Command::new("kill").args(["-9", &first[0].to_string()]).status().unwrap().success());
    wait_for("the restart", &said, async || {
        let started_again = children(child.id()).iter().any(|pid| !first.contains(pid));
        started_again && said.lock().unwrap().contains("the MCP server runs again")
    })
    .await;

    // SIGTERM: the command deregisters the agent and stops its server.
    let server_pid = children(child.id()).into_iter().find(|pid| !first.contains(pid)).unwrap();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {}", said.lock().unwrap());
    assert!(agent(&url, "time").await.is_none(), "the agent is still registered");
    assert!(said.lock().unwrap().contains("deregistered time"));
    wait_for("the server's exit", &said, async || !std::path::Path::new(&format!("/proc/{server_pid}")).exists()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_is_not_an_mcp_server_is_refused_with_the_reason() {
    let db = TestDatabase::sqlite();
    let discovery = spawn_discovery(DiscoveryConfig::with_database_url(db.url.clone())).await.unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["agents", "mcp", "--id", "nothing", "--discovery", &discovery.url(), "--", "/no/such/program"])
        .env_remove("AGENTMESH_CONFIG")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/no/such/program") && stderr.contains("cannot start it"), "{stderr}");
    assert!(agent(&discovery.url(), "nothing").await.is_none());

    let output = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["agents", "mcp", "--id", "nothing", "--discovery", &discovery.url()])
        .env_remove("AGENTMESH_CONFIG")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--url URL"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_that_launches_mcp_stdio_asks_the_mesh() {
    let Some(python) = interop::python("agentmesh mcp-stdio") else { return };
    let dir = std::env::temp_dir().join(format!("agentmesh-mcp-stdio-{}", std::process::id()));
    let demo = common::serve_demo(&dir, &[]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/ask_mesh.py");
    let gateway = demo.addresses["gateway"].clone();
    let out = interop::run_python(
        &python,
        &std::fs::read_to_string(script).unwrap(),
        &[
            "stdio",
            "What is the weather in Chicago?",
            env!("CARGO_BIN_EXE_agentmesh"),
            "mcp-stdio",
            "--gateway",
            &gateway,
        ],
    )
    .await;
    let out: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(out["tools"][0]["name"], "ask", "{out}");
    assert_eq!(out["text"], "It is 18 °C and partly cloudy in Chicago right now.", "{out}");
    assert_eq!(out["structured"]["goal_achieved"], true, "{out}");
    let progress = out["progress"].to_string();
    assert!(progress.contains("step_succeeded s1"), "{progress}");
    let _ = std::fs::remove_dir_all(dir);
}
