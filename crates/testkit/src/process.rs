//! A service running as its own process (the `agentmesh` binary), for
//! tests that need what only a process has: its own trace resource, a
//! `kill -9`, a restart. It listens on `127.0.0.1:0`; the address is read
//! from its own "listening" log line (JSON logs), never guessed.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// A running service process; killed when dropped.
pub struct ServiceProcess {
    /// The address it listens on.
    pub addr: SocketAddr,
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
}

impl ServiceProcess {
    /// Runs `program args…` (with `--log-format json` added) and waits until
    /// it logs the address it listens on.
    pub async fn spawn(program: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut command = Command::new(program);
        command
            .args(args)
            .args(["--log-format", "json"])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info,sqlx=warn,h2=warn,hyper=warn,tower=warn");
        }
        let mut child = command.spawn().with_context(|| format!("starting {}", program.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (found_tx, found_rx) = oneshot::channel::<SocketAddr>();
        let sink = logs.clone();
        tokio::spawn(async move {
            let mut found = Some(found_tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = listening_addr(&line)
                    && let Some(found) = found.take()
                {
                    let _ = found.send(addr);
                }
                if let Ok(mut logs) = sink.lock() {
                    logs.push(line);
                }
            }
        });
        let addr = match tokio::time::timeout(Duration::from_secs(60), found_rx).await {
            Ok(Ok(addr)) => addr,
            outcome => {
                let status = child.try_wait().ok().flatten();
                let logs = logs.lock().map(|l| l.join("\n")).unwrap_or_default();
                anyhow::bail!(
                    "{} {args:?} did not report a listening address ({}; exit {status:?}); its logs:\n{logs}",
                    program.display(),
                    if outcome.is_err() { "timed out" } else { "stderr closed" }
                );
            }
        };
        Ok(Self { addr, child, logs })
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// `kill -9`: the process gets no chance to clean up.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("killing the service")
    }

    /// `SIGTERM`, then waits for a graceful exit (it flushes its spans).
    pub async fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let pid = self.child.id().context("the service has exited already")?;
        let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
        anyhow::ensure!(status.success(), "kill -TERM {pid} failed");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .context("the service did not stop within 30 s of SIGTERM")?
            .context("waiting for the service")
    }
}

/// The `addr` of a JSON log line announcing where a service listens.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    let value: Value = serde_json::from_str(line).ok()?;
    let message = value.get("message").and_then(Value::as_str)?;
    if !message.contains("listening") {
        return None;
    }
    value.get("addr").and_then(Value::as_str)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::listening_addr;

    #[test]
    fn the_listening_line_gives_the_address() {
        let line =
            r#"{"timestamp":"t","level":"INFO","message":"planner listening (gRPC and HTTP)","addr":"127.0.0.1:4312"}"#;
        assert_eq!(listening_addr(line).map(|a| a.port()), Some(4312));
        assert_eq!(listening_addr(r#"{"message":"hello","addr":"127.0.0.1:1"}"#), None);
        assert_eq!(listening_addr("not json"), None);
    }
}
