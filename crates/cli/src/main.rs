//! `agentmesh`: runs the mesh's services and talks to them.

/// mimalloc: faster than the system allocator under many small
/// allocations on many threads, and it returns freed memory.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod agents;
mod config;
mod plan;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

/// agentmesh: find agents, plan over what exists, run plans, answer.
#[derive(Parser, Debug)]
#[command(name = "agentmesh", version, about)]
struct Cli {
    /// TOML configuration file (defaults < file < AGENTMESH_* environment < flags).
    #[arg(long, global = true, env = "AGENTMESH_CONFIG")]
    config: Option<PathBuf>,
    /// Log output format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "AGENTMESH_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one service.
    Serve {
        #[command(subcommand)]
        service: ServeCommand,
    },
    /// Run the mesh in one process on the embedded default (SQLite in --data-dir).
    Up(config::UpArgs),
    /// Register, inspect and remove agents in a running discovery service.
    Agents(agents::AgentsArgs),
    /// Ask a running planner for a plan (a dry run: nothing is executed).
    Plan(plan::PlanArgs),
    /// List the LLM calls the planner made for a request.
    Interactions(plan::InteractionsArgs),
}

#[derive(Subcommand, Debug)]
enum ServeCommand {
    /// The discovery service (agent registry), gRPC and HTTP on one port.
    Discovery(config::DiscoveryArgs),
    /// The planner service: gRPC, and HTTP (/metrics, /healthz, /readyz) on one port.
    Planner(config::PlannerArgs),
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,h2=warn,hyper=warn,tower=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down");
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { service: ServeCommand::Discovery(args) } => {
            let config = config::load(cli.config.as_deref(), &args.overrides())?;
            if args.print_config {
                println!("{}", toml::to_string_pretty(&config).context("printing config")?);
                return Ok(());
            }
            agentmesh_discovery::serve(config.discovery, shutdown_signal()).await
        }
        Command::Up(args) => {
            let config = config::load(cli.config.as_deref(), &args.overrides()?)?;
            if args.print_config {
                println!("{}", toml::to_string_pretty(&config).context("printing config")?);
                return Ok(());
            }
            eprintln!(
                "agentmesh up: discovery on {} (gRPC and HTTP), registry {}",
                config.discovery.listen,
                agentmesh_discovery::redact(&config.discovery.database_url)
            );
            agentmesh_discovery::serve(config.discovery, shutdown_signal()).await
        }
        Command::Serve { service: ServeCommand::Planner(args) } => {
            let config = config::load(cli.config.as_deref(), &args.overrides())?;
            if args.print_config {
                println!("{}", toml::to_string_pretty(&config).context("printing config")?);
                return Ok(());
            }
            agentmesh_planner::serve(config.planner, shutdown_signal()).await
        }
        Command::Agents(args) => agents::run(args).await,
        Command::Plan(args) => plan::plan(args).await,
        Command::Interactions(args) => plan::interactions(args).await,
    }
}
