//! `demo-agent`: runs demo agents on their own, registered with a running
//! discovery (or, with `--no-register`, only serving, for a registration
//! made by hand as in the README's walk-through).

use std::net::SocketAddr;

use agentmesh_agent::Options;
use clap::Parser;

/// Runs demo agents until Ctrl-C or SIGTERM, then deregisters them.
#[derive(Parser, Debug)]
#[command(name = "demo-agent")]
struct Args {
    /// Agents to run: weather, stocks, calculator, travel, reviewer, fixer [default: all].
    names: Vec<String>,
    /// Discovery's URL.
    #[arg(long, env = "AGENTMESH_DISCOVERY_URL", default_value = "http://127.0.0.1:7400")]
    discovery: String,
    /// The gateway the travel orchestrator asks.
    #[arg(long, env = "AGENTMESH_GATEWAY_URL", default_value = "http://127.0.0.1:7404")]
    gateway: String,
    /// Where to listen (one agent only); default: a free local port each.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Serve without registering (register it yourself, e.g. with
    /// `agentmesh agents register -f examples/agents/weather.json`).
    #[arg(long)]
    no_register: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = agentmesh_agent::init_telemetry("demo-agent")?;
    let names = if args.names.is_empty() {
        vec!["weather", "stocks", "calculator", "travel", "reviewer", "fixer"].into_iter().map(str::to_owned).collect()
    } else {
        args.names.clone()
    };
    let mut picked = Vec::new();
    for name in &names {
        let agent = match name.as_str() {
            "weather" => agentmesh_demo_agents::weather(),
            "stocks" => agentmesh_demo_agents::stocks(),
            "calculator" => agentmesh_demo_agents::calculator(),
            "travel" => agentmesh_demo_agents::travel(args.gateway.clone()),
            "reviewer" => agentmesh_demo_agents::reviewer(),
            "fixer" => agentmesh_demo_agents::fixer(),
            other => anyhow::bail!(
                "no demo agent `{other}`; choose among weather, stocks, calculator, travel, reviewer, fixer"
            ),
        };
        picked.push(agent);
    }
    anyhow::ensure!(args.listen.is_none() || picked.len() == 1, "--listen takes one agent; name one");
    let mut running = Vec::new();
    for agent in picked {
        // AGENTMESH_AGENT_URL and AGENTMESH_AGENT_LISTEN apply; the flags win.
        let mut options = Options { discovery_url: args.discovery.clone(), ..Options::from_env() };
        if let Some(listen) = args.listen {
            options.listen = listen;
        }
        options.register = !args.no_register;
        let agent = agent.start(options).await?;
        let registered =
            if args.no_register { "not registered".to_owned() } else { format!("registered with {}", args.discovery) };
        eprintln!("{} serving at {} ({registered})", agent.id(), agent.base_url());
        running.push(agent);
    }
    agentmesh_agent::shutdown_signal().await;
    for agent in running {
        if let Err(e) = agent.stop().await {
            eprintln!("{e}");
        }
    }
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
    Ok(())
}
