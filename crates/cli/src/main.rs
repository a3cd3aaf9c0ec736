//! `agentmesh`: runs the mesh's services and talks to them.

/// mimalloc: faster than the system allocator under many small
/// allocations on many threads, and it returns freed memory.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod a2a;
mod agents;
mod ask;
mod config;
mod connect;
mod demo;
mod eval;
mod executions;
mod mcp;
mod mcp_stdio;
mod plan;
mod token;
mod up;

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// agentmesh: find agents, plan over what exists, run plans, answer.
#[derive(Parser, Debug)]
#[command(name = "agentmesh", version, about)]
struct Cli {
    /// TOML configuration file (defaults < file < AGENTMESH_* environment < flags).
    #[arg(long, global = true, env = "AGENTMESH_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    telemetry: config::TelemetryArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one service.
    Serve {
        #[command(subcommand)]
        service: ServeCommand,
    },
    /// Run the mesh in one process on the embedded default (SQLite in
    /// --data-dir): discovery, the executor, and the planner and synthesis
    /// when an LLM is given.
    Up(config::UpArgs),
    /// See the mesh at work offline: every service in this process, demo
    /// agents, a scripted model, and six stories run end to end (a
    /// hallucinated tool caught, a loop-back, a recovery round…).
    Demo(demo::DemoArgs),
    /// Register, inspect and remove agents in a running discovery service.
    Agents(agents::AgentsArgs),
    /// Ask the gateway: plan, run, answer and review a request, printing
    /// each event as it happens and the answer as it streams.
    Ask(ask::AskArgs),
    /// Serve the mesh to an MCP client that launches a program: MCP on
    /// stdin and stdout, every request passed to the gateway's /mcp.
    McpStdio(mcp_stdio::McpStdioArgs),
    /// Ask a running planner for a plan (a dry run: nothing is executed).
    Plan(plan::PlanArgs),
    /// List the LLM calls the planner made for a request.
    Interactions(plan::InteractionsArgs),
    /// Measure plans (and answers) on a set of requests whose right tools
    /// are known: valid plans, zero-step accuracy, node and edge F1,
    /// repeated steps, grounded answers, latency, tokens.
    Eval(eval::EvalArgs),
    /// Run a plan file on the executor, following its progress; fails unless it completes.
    Run(executions::RunArgs),
    /// List, inspect, follow and cancel executions.
    Executions(executions::ExecutionsArgs),
    /// Make a bearer token for a principal, and print the (hashed) entry
    /// for the services' auth_tokens_file.
    Token(token::TokenArgs),
}

#[derive(Subcommand, Debug)]
enum ServeCommand {
    /// The discovery service (agent registry), gRPC and HTTP on one port.
    Discovery(config::DiscoveryArgs),
    /// The planner service: gRPC, and HTTP (/metrics, /healthz, /readyz) on one port.
    Planner(config::PlannerArgs),
    /// The executor service: runs plans as durable DAGs; gRPC and HTTP on one port.
    Executor(config::ExecutorArgs),
    /// The synthesis service: streams answers and reviews them; gRPC and HTTP on one port.
    Synthesis(config::SynthesisArgs),
    /// The gateway: plan, execute, synthesize and review in one call; gRPC
    /// and REST/SSE on one port.
    Gateway(config::GatewayArgs),
}

/// Ctrl-C or SIGTERM (the wait every agentmesh process shares).
async fn shutdown_signal() {
    agentmesh_agent::shutdown_signal().await;
    tracing::info!("shutting down");
}

impl ServeCommand {
    /// The service's configuration section, the name its traces carry, and
    /// the flags every service takes.
    fn parts(&self) -> (&'static str, &'static str, &config::ServiceArgs) {
        match self {
            Self::Discovery(args) => ("discovery", "agentmesh-discovery", &args.service),
            Self::Planner(args) => ("planner", "agentmesh-planner", &args.service),
            Self::Executor(args) => ("executor", "agentmesh-executor", &args.service),
            Self::Synthesis(args) => ("synthesis", "agentmesh-synthesis", &args.service),
            Self::Gateway(args) => ("gateway", "agentmesh-gateway", &args.service),
        }
    }

    /// The flags given, as configuration overrides.
    fn overrides(&self) -> Vec<config::Override> {
        let section = self.parts().0;
        match self {
            Self::Discovery(args) => config::overrides_of(section, args),
            Self::Planner(args) => config::overrides_of(section, args),
            Self::Executor(args) => config::overrides_of(section, args),
            Self::Synthesis(args) => config::overrides_of(section, args),
            Self::Gateway(args) => config::overrides_of(section, args),
        }
    }
}

impl Command {
    /// The name this process reports in traces.
    fn service_name(&self) -> &'static str {
        match self {
            Command::Serve { service } => service.parts().1,
            Command::Up(_) | Command::Demo(_) => "agentmesh",
            _ => "agentmesh-cli",
        }
    }

    /// The command's flags, as configuration overrides.
    fn overrides(&self) -> Vec<config::Override> {
        match self {
            Command::Serve { service } => service.overrides(),
            Command::Up(args) => args.overrides(),
            _ => Vec::new(),
        }
    }

    /// The command's own defaults, below the configuration file.
    fn defaults(&self) -> Vec<config::Override> {
        match self {
            Command::Up(args) => args.defaults(),
            Command::Demo(_) => demo::DemoArgs::defaults(),
            _ => Vec::new(),
        }
    }

    /// The configuration sections the command uses (`--print-config` shows these).
    fn sections(&self) -> Vec<&'static str> {
        match self {
            Command::Serve { service } => vec![service.parts().0, "telemetry"],
            _ => config::SECTIONS.to_vec(),
        }
    }

    fn prints_config(&self) -> bool {
        match self {
            Command::Serve { service } => service.parts().2.print_config,
            Command::Up(args) => args.print_config,
            _ => false,
        }
    }
}

fn fail(e: &anyhow::Error) -> std::process::ExitCode {
    eprintln!("error: {}", error_text(e));
    std::process::ExitCode::FAILURE
}

/// An error and its causes on one line, each cause said once: libraries
/// often wrap an error in one that repeats its text
/// ("tcp connect error: tcp connect error: …").
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain().map(ToString::to_string) {
        if cause.is_empty() || text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

/// A reader that stops early (`agentmesh executions list | head -1`) closes
/// the pipe: the rest of the output has nowhere to go, which is not an
/// error, so the process ends quietly instead of panicking in `println!`.
fn quiet_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to std") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    quiet_on_closed_pipe();
    let cli = Cli::parse();
    for warning in config::unknown_variables(std::env::vars_os().filter_map(|(name, _)| name.into_string().ok())) {
        eprintln!("warning: {warning}");
    }
    let mut overrides = cli.command.overrides();
    overrides.extend(cli.telemetry.overrides());
    let config = match config::load(cli.config.as_deref(), &cli.command.defaults(), &overrides) {
        Ok(config) => config,
        Err(e) => return fail(&e),
    };
    if cli.command.prints_config() {
        return match config::printable(&config, &cli.command.sections()) {
            // A reader that stops early (`--print-config | head`) is not an error.
            Ok(text) => match writeln!(std::io::stdout().lock(), "{text}") {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::ExitCode::SUCCESS,
                Err(e) => fail(&anyhow::Error::from(e).context("printing the configuration")),
            },
            Err(e) => fail(&e),
        };
    }
    let telemetry = match agentmesh_telemetry::init(cli.command.service_name(), &config.telemetry) {
        Ok(telemetry) => telemetry,
        Err(e) => return fail(&e),
    };
    let result = run(cli.command, config).await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

async fn run(command: Command, config: config::Config) -> anyhow::Result<()> {
    match command {
        Command::Serve { service: ServeCommand::Discovery(_) } => {
            agentmesh_discovery::serve(config.discovery, shutdown_signal()).await
        }
        Command::Up(_) => up::run(config, shutdown_signal()).await,
        Command::Serve { service: ServeCommand::Planner(_) } => {
            agentmesh_planner::serve(config.planner, shutdown_signal()).await
        }
        Command::Serve { service: ServeCommand::Executor(_) } => {
            agentmesh_executor::serve(config.executor, shutdown_signal()).await
        }
        Command::Serve { service: ServeCommand::Synthesis(_) } => {
            agentmesh_synthesis::serve(config.synthesis, shutdown_signal()).await
        }
        Command::Serve { service: ServeCommand::Gateway(_) } => {
            agentmesh_gateway::serve(config.gateway, shutdown_signal()).await
        }
        Command::Demo(args) => demo::run(args, config, shutdown_signal()).await,
        Command::Ask(args) => ask::ask(args).await,
        Command::Run(args) => executions::run(args).await,
        Command::Executions(args) => executions::executions(args).await,
        Command::Agents(args) => agents::run(args).await,
        Command::McpStdio(args) => mcp_stdio::run(args).await,
        Command::Plan(args) => plan::plan(args).await,
        Command::Interactions(args) => plan::interactions(args).await,
        Command::Eval(args) => eval::eval(args).await,
        Command::Token(args) => token::token(&args),
    }
}
