//! `agentmesh agents mcp`: an MCP server joins the mesh. A server reached
//! over streamable HTTP (`--url`) is registered once: discovery lists its
//! tools and keeps the list fresh. A stdio server (the command after `--`)
//! runs as a child of this process, offered over streamable HTTP on a
//! local port, registered, kept alive with heartbeats, started again when
//! it exits, and deregistered when this process stops.

use std::net::SocketAddr;
use std::time::Duration;

use agentmesh_mcp::bridge::{self, Bridge};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use anyhow::Context;
use clap::Args;

/// `agentmesh agents mcp` flags.
#[derive(Args, Debug)]
pub struct McpArgs {
    /// The agent id the server's tools are registered under.
    #[arg(long)]
    id: String,
    /// The server's streamable-HTTP URL, for a server that runs on its own.
    #[arg(long, conflicts_with = "command")]
    url: Option<String>,
    /// Where the local streamable-HTTP endpoint of a stdio server listens.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The URL discovery and the executor should use to reach that
    /// endpoint, when it is not `http://{listen address}/mcp` (another host,
    /// a container).
    #[arg(long)]
    advertise: Option<String>,
    /// The agent's version, shown in the catalog.
    #[arg(long, default_value = "")]
    version: String,
    /// The stdio server to run, after `--`: `-- python -m mcp_server_time`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn registration(id: &str, base_url: &str, version: &str) -> pb::Agent {
    pb::Agent {
        id: id.to_owned(),
        base_url: base_url.to_owned(),
        transport: pb::Transport::Mcp as i32,
        version: version.to_owned(),
        tags: vec!["mcp".to_owned()],
        ..Default::default()
    }
}

async fn register(client: &mut DiscoveryServiceClient<TracedChannel>, agent: &pb::Agent) -> anyhow::Result<pb::Agent> {
    let response = client
        .register_agent(pb::RegisterAgentRequest { agent: Some(agent.clone()) })
        .await
        .map_err(|s| crate::connect::rpc_error(&s))?
        .into_inner();
    response.agent.context("discovery returned no agent")
}

fn describe(agent: &pb::Agent) -> String {
    let tools: Vec<&str> = agent.skills.iter().map(|c| c.id.as_str()).collect();
    format!("{} tool{}: {}", tools.len(), if tools.len() == 1 { "" } else { "s" }, tools.join(", "))
}

/// Runs `agentmesh agents mcp`.
pub async fn run(mut client: DiscoveryServiceClient<TracedChannel>, args: McpArgs) -> anyhow::Result<()> {
    if let Some(url) = &args.url {
        let agent = register(&mut client, &registration(&args.id, url, &args.version)).await?;
        println!("registered {} ({})", args.id, describe(&agent));
        return Ok(());
    }
    if args.command.is_empty() {
        anyhow::bail!(
            "say which MCP server to add: `--url URL` for one that serves streamable HTTP, or the command of a stdio server after `--` (`agentmesh agents mcp --id time -- python -m mcp_server_time`)"
        );
    }
    if args.listen.ip().is_unspecified() && args.advertise.is_none() {
        anyhow::bail!(
            "--listen {} accepts connections on every address, but discovery and the executor need one to call: give it with --advertise http://HOST:{}/mcp",
            args.listen,
            args.listen.port()
        );
    }
    let advertised_host = args
        .advertise
        .as_deref()
        .map(|url| url::Url::parse(url).with_context(|| format!("--advertise `{url}` is not a URL")))
        .transpose()?
        .and_then(|url| url.host_str().map(str::to_owned));
    let bridge = Bridge::start(bridge::Options {
        command: args.command.clone(),
        listen: args.listen,
        allowed_hosts: advertised_host.into_iter().collect(),
    })
    .await?;
    let base_url = args.advertise.clone().unwrap_or_else(|| format!("http://{}{}", bridge.addr(), bridge::PATH));
    let definition = registration(&args.id, &base_url, &args.version);
    let agent = match register(&mut client, &definition).await {
        Ok(agent) => agent,
        Err(e) => {
            bridge.stop().await;
            return Err(e);
        }
    };
    eprintln!(
        "agent {} serves `{}` at {base_url} ({}); Ctrl-C stops it",
        args.id,
        args.command.join(" "),
        describe(&agent)
    );
    let beats = heartbeats(client.clone(), definition, &bridge);
    tokio::select! {
        () = beats => {}
        () = crate::shutdown_signal() => {}
    }
    let deregistered = client.deregister_agent(pb::DeregisterAgentRequest { agent_id: args.id.clone() }).await;
    bridge.stop().await;
    match deregistered {
        Ok(_) => eprintln!("deregistered {}", args.id),
        Err(s) if s.code() == tonic::Code::NotFound => {}
        Err(s) => return Err(crate::connect::rpc_error(&s)),
    }
    Ok(())
}

/// Heartbeats at the interval discovery asks for while the server runs,
/// registering again when discovery no longer knows the agent; failures
/// are logged and the next beat tries again.
async fn heartbeats(mut client: DiscoveryServiceClient<TracedChannel>, definition: pb::Agent, bridge: &Bridge) {
    let mut interval = Duration::from_secs(10);
    loop {
        tokio::time::sleep(interval).await;
        // No beat while the server is down: discovery sees it go quiet.
        if !bridge.running().await {
            continue;
        }
        let beat = client
            .heartbeat(pb::HeartbeatRequest {
                agent_id: definition.id.clone(),
                status: pb::HealthStatus::Active as i32,
            })
            .await;
        match beat {
            Ok(answer) => {
                let seconds = answer.into_inner().heartbeat_interval_seconds;
                if seconds > 0 {
                    interval = Duration::from_secs(u64::from(seconds));
                }
            }
            Err(s) if s.code() == tonic::Code::NotFound => {
                tracing::warn!(agent = %definition.id, "discovery no longer knows the agent; registering again");
                if let Err(e) = register(&mut client, &definition).await {
                    tracing::warn!(agent = %definition.id, error = %e, "registering again failed");
                }
            }
            Err(s) => tracing::warn!(agent = %definition.id, error = %s.message(), "heartbeat failed"),
        }
    }
}
