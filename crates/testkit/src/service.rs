//! Services started for real on `127.0.0.1:0`, stopped when dropped.

use std::net::SocketAddr;

use agentmesh_discovery::DiscoveryConfig;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A service running in this process on an ephemeral loopback port.
pub struct RunningService {
    /// Bound address.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl RunningService {
    /// `http://127.0.0.1:PORT`, for REST and for gRPC clients alike.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the service and waits for it to finish; returns its result.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningService {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Logs of the code under test, shown by the test runner on failure
/// (`RUST_LOG` selects what).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// Starts discovery with `config` (its `listen` is ignored) on an ephemeral
/// port and waits until it answers.
pub async fn spawn_discovery(config: DiscoveryConfig) -> anyhow::Result<RunningService> {
    init_tracing();
    let tls = config.service.tls_cert_file.is_some();
    let listener = crate::bind_local().await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agentmesh_discovery::serve_with_listener(config, listener, async move {
        let _ = stopped.await;
    }));
    let service = RunningService { addr, stop: Some(stop), task: Some(task) };
    if tls {
        // Its port is bound: requests wait in the accept queue until it serves.
        return Ok(service);
    }
    let client = crate::http_client();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if client.get(format!("{}/healthz", service.url())).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok(service);
        }
        if service.task.as_ref().is_some_and(JoinHandle::is_finished) {
            let mut service = service;
            return match service.task.take() {
                Some(task) => Err(task.await?.err().unwrap_or_else(|| anyhow::anyhow!("discovery exited at start"))),
                None => Err(anyhow::anyhow!("discovery exited at start")),
            };
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "discovery did not answer within 30s");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
