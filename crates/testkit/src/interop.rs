//! MCP servers and clients nobody here wrote, for the interop tests:
//! `mcp-server-time` and the official Python `mcp` SDK in one virtualenv,
//! `mcp-server-calculator` in another (it needs `mcp` 1.x), and
//! `@modelcontextprotocol/server-everything` from npm. `.ci/run` installs
//! them under `AGENTMESH_INTEROP_DIR` (default `~/.cache/agentmesh`, with
//! the versions pinned in `tests/interop/`). Under `CI=true` a missing one
//! fails the test; elsewhere the test says so and is skipped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Where `.ci/run` installs them.
pub fn dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AGENTMESH_INTEROP_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("agentmesh")
}

fn found(path: PathBuf, what: &str, test: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let why = format!("{what} is not installed at {} (.ci/run installs it)", path.display());
    assert!(!in_ci(), "{test} needs it under CI: {why}");
    eprintln!("SKIPPED: {test}: {why}");
    None
}

/// The Python with `mcp` 2.x and `mcp-server-time`.
pub fn python(test: &str) -> Option<PathBuf> {
    found(dir().join("interop-venv").join("bin").join("python"), "the interop virtualenv", test)
}

/// The stdio command of the reference time server.
pub fn time_server(test: &str) -> Option<Vec<String>> {
    let python = python(test)?;
    Some(vec![
        python.display().to_string(),
        "-m".into(),
        "mcp_server_time".into(),
        "--local-timezone".into(),
        "UTC".into(),
    ])
}

/// The stdio command of the calculator server.
pub fn calculator_server(test: &str) -> Option<Vec<String>> {
    let python = found(dir().join("calc-venv").join("bin").join("python"), "the calculator's virtualenv", test)?;
    Some(vec![python.display().to_string(), "-m".into(), "mcp_server_calculator".into()])
}

/// `@modelcontextprotocol/server-everything` over streamable HTTP, stopped
/// when dropped.
pub struct Everything {
    child: Child,
    /// Its MCP endpoint, `http://127.0.0.1:PORT/mcp`.
    pub url: String,
}

impl Everything {
    /// Starts it on a free port; `None` when it is not installed outside CI.
    pub async fn start(test: &str) -> Option<Self> {
        let script = found(
            dir().join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
            "@modelcontextprotocol/server-everything",
            test,
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        // A bare environment: its get-env tool would show this one.
        let child = Command::new("node")
            .arg(&script)
            .arg("streamableHttp")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting node {}: {e}", script.display()));
        let server = Self { child, url: format!("http://127.0.0.1:{port}/mcp") };
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "server-everything did not listen within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some(server)
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// Runs a Python script with the interop virtualenv's Python and returns
/// its standard output; panics with its standard error when it fails or
/// takes more than two minutes.
pub async fn run_python(python: &Path, script: &str, args: &[&str]) -> String {
    let running =
        Command::new(python).arg("-c").arg(script).args(args).stdin(Stdio::null()).kill_on_drop(true).output();
    let output = tokio::time::timeout(Duration::from_secs(120), running)
        .await
        .unwrap_or_else(|_| panic!("the Python client did not finish within 120 s"))
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    assert!(
        output.status.success(),
        "the Python client failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The A2A agent of `tests/interop/a2a_agent.py`, written with the official
/// SDK (`a2a-sdk`), stopped when dropped.
pub struct A2aAgent {
    _child: Child,
    /// Its base URL (the card is under `/.well-known/agent-card.json`).
    pub url: String,
    received: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl A2aAgent {
    /// Starts it on a free port, its card declaring protocol `version` (1.0
    /// or 0.3) and whether it streams; `None` when the SDK is not installed
    /// outside CI.
    pub async fn start(test: &str, version: &str, streaming: bool) -> Option<Self> {
        let python = python(test)?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/a2a_agent.py");
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let mut child = Command::new(&python)
            .arg(&script)
            .arg(port.to_string())
            .arg(version)
            .arg(streaming.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", script.display()));
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            let kept = received.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) {
                        kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(value);
                    }
                }
            });
        }
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "the A2A agent did not listen within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some(Self { _child: child, url: format!("http://127.0.0.1:{port}"), received })
    }

    /// The messages it received so far, as the SDK read them.
    pub fn received(&self) -> Vec<serde_json::Value> {
        self.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}
