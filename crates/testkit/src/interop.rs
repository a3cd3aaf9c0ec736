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
