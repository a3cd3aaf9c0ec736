//! `agentmesh mcp-stdio`: the mesh for MCP clients that launch a program
//! (desktop assistants, IDEs). It speaks MCP on stdin and stdout and passes
//! every request to the gateway's `/mcp`, with `AGENTMESH_TOKEN` as the
//! bearer token when there is one. Logs go to stderr; stdout is the
//! protocol's.

use anyhow::Context;
use clap::Args;

/// `agentmesh mcp-stdio` flags.
#[derive(Args, Debug)]
pub struct McpStdioArgs {
    /// The gateway's address.
    #[arg(long, env = "AGENTMESH_GATEWAY_URL", default_value = "http://127.0.0.1:7404")]
    gateway: String,
}

/// Runs until the client closes stdin.
pub async fn run(args: McpStdioArgs) -> anyhow::Result<()> {
    let base = args.gateway.trim_end_matches('/');
    anyhow::ensure!(base.contains("://"), "`{base}` has no scheme: write http://{base} to reach the gateway there");
    let mut headers = Vec::new();
    if let Some(token) = std::env::var("AGENTMESH_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        let mut value = http::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .context("AGENTMESH_TOKEN holds characters a header cannot")?;
        value.set_sensitive(true);
        headers.push((http::header::AUTHORIZATION, value));
    }
    agentmesh_mcp::bridge::serve_stdio(&format!("{base}/mcp"), headers)
        .await
        .with_context(|| format!("serving MCP on stdio for the gateway at {base}"))
}
