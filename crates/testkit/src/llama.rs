//! The real model of the real-model tests: SmolLM2-135M-Instruct behind
//! llama-cpp-python's OpenAI-compatible server.
//!
//! One server is shared by every real-model test when `AGENTMESH_LLAMA_URL`
//! names one (`.ci/run` starts it once); otherwise each test starts its own
//! from `AGENTMESH_SMOLLM2_GGUF` with `python3 -m llama_cpp.server`. Under
//! `CI=true`, a model that cannot be had fails the test; elsewhere it is
//! reported and the test is skipped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The model name the tests ask for (the server serves whatever it loaded).
pub const MODEL: &str = "smollm2-135m-instruct";

/// A model server: shared, or a child process stopped when dropped.
pub struct LlamaServer {
    child: Option<Child>,
    /// Its OpenAI-compatible base URL (`http://127.0.0.1:PORT/v1`).
    pub base_url: String,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Waits until `base` answers `/models`.
async fn ready(base: &str, within: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        if crate::http_client().get(format!("{base}/models")).send().await.is_ok_and(|r| r.status().is_success()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// The model server for a test named `what`; `None` (after saying why) when
/// there is none outside CI.
pub async fn start(what: &str) -> Option<LlamaServer> {
    if let Some(base) = std::env::var("AGENTMESH_LLAMA_URL").ok().filter(|u| !u.trim().is_empty()) {
        let base = base.trim_end_matches('/').to_owned();
        assert!(ready(&base, Duration::from_secs(180)).await, "AGENTMESH_LLAMA_URL={base} does not answer /models");
        return Some(LlamaServer { child: None, base_url: base });
    }
    let model = std::env::var("AGENTMESH_SMOLLM2_GGUF").ok().filter(|p| std::path::Path::new(p).exists());
    let server = Command::new("python3").args(["-c", "import llama_cpp.server"]).status().is_ok_and(|s| s.success());
    let found = model.is_some();
    let Some(model) = model.filter(|_| server) else {
        let why = format!(
            "model file {}, llama_cpp.server {}",
            if found { "found" } else { "missing (set AGENTMESH_SMOLLM2_GGUF)" },
            if server { "importable" } else { "missing (pip install 'llama-cpp-python[server]')" }
        );
        assert!(!in_ci(), "{what} is required under CI: {why}");
        eprintln!("SKIPPED: {what}: {why}");
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let child = Command::new("python3")
        .args(["-m", "llama_cpp.server", "--model", &model, "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--n_ctx", "8192", "--n_threads", "2", "--verbose", "false"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting llama_cpp.server: {e}"));
    let server = LlamaServer { child: Some(child), base_url: format!("http://127.0.0.1:{port}/v1") };
    assert!(ready(&server.base_url, Duration::from_secs(180)).await, "llama_cpp.server did not start within 180 s");
    Some(server)
}

/// The in-process embedding model of the semantic tests (all-MiniLM-L6-v2,
/// from `AGENTMESH_EMBEDDINGS_DIR` or the planner's default directory).
/// Under `CI=true` its absence fails `test`; elsewhere it is reported and
/// `None` tells the test to skip.
pub fn minilm(test: &str) -> Option<agentmesh_llm::embeddings::MiniLm> {
    let dir = agentmesh_llm::embeddings::default_local_dir();
    if !dir.join("model.safetensors").is_file() {
        let why = format!("{test} needs the all-MiniLM-L6-v2 files in {} (.ci/run fetches them)", dir.display());
        assert!(!in_ci(), "{why}");
        eprintln!("skipped: {why}");
        return None;
    }
    Some(agentmesh_llm::embeddings::MiniLm::load(&dir).unwrap_or_else(|e| panic!("{test}: {e}")))
}
