//! Connections from the CLI to the services, traced like every other client.

use std::time::Duration;

use agentmesh_telemetry::rpc::{TracedChannel, traced};
use anyhow::Context;
use tonic::transport::Endpoint;

/// Connects to the service `what` at `url`; the error says how to start it.
pub async fn connect(url: &str, what: &str, how_to_start: &str) -> anyhow::Result<TracedChannel> {
    if !url.contains("://") {
        anyhow::bail!("`{url}` has no scheme: write http://{url} to reach {what} there");
    }
    let channel = Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("`{url}` is not a valid {what} address"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to {what} at {url}; is it running (`{how_to_start}`)?"))?;
    Ok(traced(channel))
}
