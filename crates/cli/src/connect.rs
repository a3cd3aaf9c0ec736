//! Connections from the CLI to the services, traced like every other client,
//! and the one way the CLI words a failed call.

use std::time::Duration;

use agentmesh_telemetry::rpc::{TracedChannel, traced_with};
use tonic::transport::Endpoint;

/// Connects to the service `what` at `url`; the error says how to start it.
pub async fn connect(url: &str, what: &str, how_to_start: &str) -> anyhow::Result<TracedChannel> {
    if !url.contains("://") {
        anyhow::bail!("`{url}` has no scheme: write http://{url} to reach {what} there");
    }
    let mut endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| anyhow::anyhow!("`{url}` is not a valid {what} address: {}", root_cause(&e)))?;
    let client = client_settings()?;
    if url.starts_with("https://") {
        agentmesh_telemetry::http::install_tls_provider();
        endpoint = endpoint.tls_config(client.tls_config())?;
    }
    let channel = endpoint.connect_timeout(Duration::from_secs(5)).connect().await.map_err(|e| {
        match io_kind(&e) {
            Some(std::io::ErrorKind::ConnectionRefused) => anyhow::anyhow!(
                "nothing is listening at {url} (connection refused); start {what} with `{how_to_start}`, or pass its address"
            ),
            _ => anyhow::anyhow!("cannot reach {what} at {url}: {}; is it running (`{how_to_start}`)?", root_cause(&e)),
        }
    })?;
    Ok(traced_with(agentmesh_telemetry::pool::Pool::single(what, channel), &client))
}

/// How the CLI calls services: over TLS at `https://` addresses, with
/// `AGENTMESH_TLS_CA_FILE` trusted besides the system's roots and
/// `AGENTMESH_TLS_CERT_FILE` with `AGENTMESH_TLS_KEY_FILE` presented to
/// services that ask for a client certificate; with `AGENTMESH_TOKEN` as
/// its bearer token where services require one.
fn client_settings() -> anyhow::Result<agentmesh_telemetry::rpc::ClientSettings> {
    let read = |var: &str| -> anyhow::Result<Option<Vec<u8>>> {
        match std::env::var_os(var) {
            None => Ok(None),
            Some(path) => std::fs::read(&path)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("{var}: cannot read {}: {e}", std::path::Path::new(&path).display())),
        }
    };
    let identity = match (read("AGENTMESH_TLS_CERT_FILE")?, read("AGENTMESH_TLS_KEY_FILE")?) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => anyhow::bail!("AGENTMESH_TLS_CERT_FILE and AGENTMESH_TLS_KEY_FILE go together"),
    };
    let bearer = std::env::var("AGENTMESH_TOKEN").ok().filter(|t| !t.trim().is_empty());
    Ok(agentmesh_telemetry::rpc::ClientSettings { ca_pem: read("AGENTMESH_TLS_CA_FILE")?, identity, bearer })
}

/// The innermost error's text: the one that says what happened, without
/// the wrappers that repeat it ("transport error: tcp connect error: …").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cause = c.source();
    }
    None
}

/// A failed call as one line: the service's message and the status code
/// in its short name (`not_found`), then one line per field the service
/// named as wrong.
pub fn rpc_error(status: &tonic::Status) -> anyhow::Error {
    let fields: String = tonic_types::StatusExt::get_details_bad_request(status)
        .map(|b| b.field_violations.iter().map(|v| format!("\n  {}: {}", v.field, v.description)).collect())
        .unwrap_or_default();
    let message = if status.message().is_empty() { status.code().description() } else { status.message() };
    anyhow::anyhow!("{message} ({}){fields}", agentmesh_telemetry::rpc::code_name(status.code()).to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_reads_as_one_line_with_its_short_code() {
        let status = tonic::Status::failed_precondition("the plan names an unknown step");
        assert_eq!(rpc_error(&status).to_string(), "the plan names an unknown step (failed_precondition)");
        let empty = tonic::Status::new(tonic::Code::Unimplemented, "");
        assert_eq!(rpc_error(&empty).to_string(), "Operation is not implemented or not supported (unimplemented)");
    }
}
