//! `agentmesh agents a2a URL`: an A2A agent joins the mesh. The agent's
//! card is read here first (to name the agent when `--id` is not given
//! and to show what it offers), then the agent is registered with
//! transport `a2a`: discovery reads the card itself, turns its skills into
//! capabilities and reads it again at every heartbeat interval.

use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use anyhow::Context;
use clap::Args;

/// `agentmesh agents a2a` flags.
#[derive(Args, Debug)]
pub struct A2aArgs {
    /// The agent's base URL (its card is at `URL/.well-known/agent-card.json`),
    /// or the card's own URL.
    url: String,
    /// The agent id its skills are registered under (default: the card's
    /// name, made an id).
    #[arg(long)]
    id: Option<String>,
}

/// The card's name as an agent id: lower case, runs of other characters
/// as `-`.
fn id_from_name(name: &str) -> Option<String> {
    let mut id = String::new();
    for c in name.trim().chars() {
        if c.is_ascii_alphanumeric() {
            id.push(c.to_ascii_lowercase());
        } else if !id.ends_with('-') && !id.is_empty() {
            id.push('-');
        }
    }
    let id = id.trim_end_matches('-').to_owned();
    agentmesh_core::validate::check_id(&id).is_ok().then_some(id)
}

/// Runs `agentmesh agents a2a`.
pub async fn run(mut client: DiscoveryServiceClient<TracedChannel>, args: A2aArgs) -> anyhow::Result<()> {
    let http = agentmesh_telemetry::http::client_builder().build()?;
    let card = agentmesh_a2a::card::fetch(&http, &args.url, Duration::from_secs(10)).await?;
    let id = match args.id {
        Some(id) => id,
        None => id_from_name(&card.name).with_context(|| {
            format!("the card's name `{}` cannot be made an agent id: give one with --id", card.name)
        })?,
    };
    let agent = pb::Agent {
        id: id.clone(),
        base_url: args.url.clone(),
        transport: pb::Transport::A2a as i32,
        version: card.version.clone(),
        tags: vec!["a2a".to_owned()],
        ..Default::default()
    };
    let response = client
        .register_agent(pb::RegisterAgentRequest { agent: Some(agent) })
        .await
        .map_err(|s| crate::connect::rpc_error(&s))?
        .into_inner();
    let skills: Vec<String> = response.agent.iter().flat_map(|a| &a.skills).map(|c| c.id.clone()).collect();
    println!(
        "{} {id}: {} (A2A {}{}), {} skill{}: {}",
        if response.created { "registered" } else { "updated" },
        card.name,
        card.interface.version.as_str(),
        if card.streaming { ", streaming" } else { "" },
        skills.len(),
        if skills.len() == 1 { "" } else { "s" },
        skills.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_names_become_ids() {
        assert_eq!(id_from_name("Currency Agent").as_deref(), Some("currency-agent"));
        assert_eq!(id_from_name("  Hello, World!  ").as_deref(), Some("hello-world"));
        assert_eq!(id_from_name("!!!"), None);
    }
}
