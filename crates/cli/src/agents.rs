//! `agentmesh agents …`: a gRPC client of the discovery service.

use std::path::PathBuf;

use agentmesh_discovery::convert::{agent_pb_to_json, definition_to_pb, health_name};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

/// `agentmesh agents` flags.
#[derive(Args, Debug)]
pub struct AgentsArgs {
    /// Discovery service address.
    #[arg(long, global = true, env = "AGENTMESH_DISCOVERY_URL", default_value = "http://127.0.0.1:7400")]
    discovery: String,
    #[command(subcommand)]
    command: AgentsCommand,
}

#[derive(Subcommand, Debug)]
enum AgentsCommand {
    /// List agents and their capabilities.
    List {
        /// Only capabilities with a tag matching one of these patterns (comma-separated).
        #[arg(long)]
        tags: Option<String>,
        /// Only agents in this health state.
        #[arg(long)]
        health: Option<String>,
        /// Include internal capabilities.
        #[arg(long)]
        include_internal: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t = ListFormat::Table)]
        format: ListFormat,
    },
    /// Show one agent with its schemas, as JSON.
    Get {
        /// Agent id.
        id: String,
    },
    /// Register (or replace) an agent from a JSON registration file.
    Register {
        /// Registration document, as for POST /api/v1/agents (`-` for stdin).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Add an MCP server's tools to the mesh: a stdio server run here
    /// (`agentmesh agents mcp --id time -- python -m mcp_server_time`), or
    /// one reached over streamable HTTP (`--url`).
    Mcp(crate::mcp::McpArgs),
    /// Add an A2A agent's skills to the mesh, from its Agent Card
    /// (`agentmesh agents a2a http://localhost:9999`).
    A2a(crate::a2a::A2aArgs),
    /// Remove an agent.
    Deregister {
        /// Agent id.
        id: String,
    },
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum ListFormat {
    /// One line per capability.
    Table,
    /// The discovery JSON document.
    Json,
    /// The discovery XML document.
    Xml,
    /// The compact JSON document.
    Compact,
}

async fn client(url: &str) -> anyhow::Result<DiscoveryServiceClient<TracedChannel>> {
    Ok(DiscoveryServiceClient::new(crate::connect::connect(url, "discovery", "agentmesh up").await?))
}

/// A registration refused before it is sent, worded like discovery's own
/// answer: every invalid field on its own line.
fn registration_error(file: &std::path::Path, error: agentmesh_discovery::DiscoveryError) -> anyhow::Error {
    match error {
        agentmesh_discovery::DiscoveryError::Validation(errors) => {
            let fields: String = errors.iter().map(|e| format!("\n  {}: {}", e.field, e.message)).collect();
            anyhow::anyhow!("{} is not a valid registration (validation_failed):{fields}", file.display())
        }
        other => anyhow::anyhow!("{} is not a valid registration: {other}", file.display()),
    }
}

/// Runs an `agents` command.
pub async fn run(args: AgentsArgs) -> anyhow::Result<()> {
    let mut client = client(&args.discovery).await?;
    match args.command {
        AgentsCommand::List { tags, health, include_internal, format } => {
            let health_status = match health.as_deref() {
                None => pb::HealthStatus::Unspecified,
                Some("active") => pb::HealthStatus::Active,
                Some("degraded") => pb::HealthStatus::Degraded,
                Some("inactive") => pb::HealthStatus::Inactive,
                Some(other) => anyhow::bail!("--health must be active, degraded or inactive, got `{other}`"),
            };
            let render = match format {
                ListFormat::Table => pb::RenderFormat::Unspecified,
                ListFormat::Json => pb::RenderFormat::Json,
                ListFormat::Xml => pb::RenderFormat::Xml,
                ListFormat::Compact => pb::RenderFormat::Compact,
            };
            let response = client
                .list_capabilities(pb::ListCapabilitiesRequest {
                    tags: tags.map(|t| t.split(',').map(str::to_owned).collect()).unwrap_or_default(),
                    health_status: health_status as i32,
                    include_internal,
                    format: render as i32,
                    limit: 500,
                    ..Default::default()
                })
                .await
                .map_err(|s| crate::connect::rpc_error(&s))?
                .into_inner();
            if !matches!(format, ListFormat::Table) {
                println!("{}", response.rendered);
                return Ok(());
            }
            println!("{:<32} {:<9} {:<48} DESCRIPTION", "AGENT", "HEALTH", "TARGET");
            for agent in &response.capabilities {
                let health = health_name(agent.health_status);
                if agent.reasoners.is_empty() && agent.skills.is_empty() {
                    println!("{:<32} {:<9} {:<48}", agent.id, health, "-");
                }
                for cap in agent.reasoners.iter().chain(&agent.skills) {
                    println!("{:<32} {:<9} {:<48} {}", agent.id, health, cap.invocation_target, cap.description);
                }
            }
            eprintln!(
                "{}, {}, {}",
                count(u64::from(response.total_agents), "agent", "agents"),
                count(u64::from(response.total_reasoners), "reasoner", "reasoners"),
                count(u64::from(response.total_skills), "skill", "skills")
            );
        }
        AgentsCommand::Get { id } => {
            let agent = client
                .get_agent(pb::GetAgentRequest { agent_id: id })
                .await
                .map_err(|s| crate::connect::rpc_error(&s))?
                .into_inner()
                .agent
                .context("discovery returned no agent")?;
            println!("{}", serde_json::to_string_pretty(&agent_pb_to_json(&agent))?);
        }
        AgentsCommand::Register { file } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading stdin")?
            } else {
                std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?
            };
            // Checked here exactly as `POST /api/v1/agents` checks it: the
            // protobuf form cannot carry a schema that is not an object.
            let definition = agentmesh_discovery::rest::parse_registration(text.as_bytes())
                .map_err(|e| registration_error(&file, e))?;
            let response = client
                .register_agent(pb::RegisterAgentRequest { agent: Some(definition_to_pb(&definition)) })
                .await
                .map_err(|s| crate::connect::rpc_error(&s))?
                .into_inner();
            println!("{} {}", if response.created { "registered" } else { "updated" }, definition.id);
        }
        AgentsCommand::Mcp(mcp) => return crate::mcp::run(client, mcp).await,
        AgentsCommand::A2a(a2a) => return crate::a2a::run(client, a2a).await,
        AgentsCommand::Deregister { id } => {
            client
                .deregister_agent(pb::DeregisterAgentRequest { agent_id: id.clone() })
                .await
                .map_err(|s| crate::connect::rpc_error(&s))?;
            println!("deregistered {id}");
        }
    }
    Ok(())
}

/// `1 agent`, `2 agents`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
