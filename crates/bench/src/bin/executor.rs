//! Executor benchmark: how fast plans run when every event is stored, on
//! SQLite or PostgreSQL, against a no-op agent on loopback, called over
//! HTTP or as an MCP tool (`tools/call` over streamable HTTP). Three
//! processes share the machine: this driver (the gRPC client), the no-op
//! agent, and the mesh (discovery and the executor).
//!
//! `cargo run --release -p agentmesh-bench --bin executor-bench`

/// mimalloc, as in the agentmesh binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentmesh_bench::{Latencies, print_table, rss_mib};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio_stream::StreamExt;

#[derive(Parser)]
struct Args {
    /// Event stores: `sqlite` (a fresh file) and/or a `postgres://…` server URL
    /// (a fresh database is created on it and dropped after).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres://postgres@127.0.0.1:5432/postgres")]
    stores: Vec<String>,
    /// Steps of the fan-out plan (all independent).
    #[arg(long, default_value_t = 1000)]
    fanout: usize,
    /// Steps running at once in the fan-out (the execution's max_concurrency).
    #[arg(long, default_value_t = 256)]
    fanout_concurrency: u32,
    /// Steps of the chain plan (each depends on the one before).
    #[arg(long, default_value_t = 100)]
    chain: usize,
    /// Executions run at once in the concurrent scenario.
    #[arg(long, default_value_t = 100)]
    concurrent: usize,
    /// Steps of each concurrent execution (a chain).
    #[arg(long, default_value_t = 10)]
    concurrent_steps: usize,
    /// How steps reach the no-op agent: `http` (POST /skills/noop) and/or
    /// `mcp` (the tool `noop` of an MCP server, over streamable HTTP).
    #[arg(long, value_delimiter = ',', default_value = "http,mcp")]
    transports: Vec<String>,
    /// Runs of each scenario (after one unmeasured warm-up run).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Discovery and the executor serve TLS (a CA made for the run) with
    /// authentication on: the driver and the executor verify certificates
    /// and send bearer tokens, every call is checked.
    #[arg(long)]
    secure: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Internal: the no-op agent; prints its port.
    Agent,
    /// Internal: discovery and the executor on one store; prints both ports.
    Mesh {
        #[arg(long)]
        database_url: String,
        /// A directory with `server.pem`, `server.key`, `ca.pem`,
        /// `tokens.toml` and `service.token`: TLS and tokens on.
        #[arg(long)]
        secure_dir: Option<std::path::PathBuf>,
    },
}

/// The operator token of a `--secure` run's driver, and its CA.
static SECURE: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();

/// The no-op MCP server: one tool, `noop`, answering `{"ok":true}`.
#[derive(Clone)]
struct NoopTool;

impl rmcp::ServerHandler for NoopTool {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(rmcp::model::ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
        let schema = json!({"type": "object"}).as_object().cloned().unwrap_or_default();
        let tool = rmcp::model::Tool::new("noop", "Does nothing", std::sync::Arc::new(schema));
        Ok(rmcp::model::ListToolsResult::with_all_items(vec![tool]))
    }

    async fn call_tool(
        &self,
        _request: rmcp::model::CallToolRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        Ok(rmcp::model::CallToolResult::structured(json!({"ok": true})).into())
    }
}

/// The no-op agent: `POST /skills/noop` answers `{"ok":true}`, and so does
/// the MCP tool `noop` at `/mcp`.
async fn agent() -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    let listener = agentmesh_server::net::listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    println!("PORT {}", listener.local_addr()?.port());
    let mcp = StreamableHttpService::new(
        || Ok(NoopTool),
        rmcp::transport::streamable_http_server::session::local::LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new()
        .route("/skills/noop", axum::routing::post(|| async { axum::Json(json!({"ok": true})) }))
        .nest_service("/mcp", mcp);
    // As an MCP server should: an SSE answer is written in pieces, which
    // with Nagle's algorithm wait for the client's delayed ACK (40 ms).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}

async fn mesh(database_url: String, secure_dir: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let telemetry = agentmesh_telemetry::init(
        "agentmesh-bench",
        &agentmesh_telemetry::TelemetryConfig { log_filter: Some("warn".into()), ..Default::default() },
    )?;
    let discovery_listener = agentmesh_server::net::listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let executor_listener = agentmesh_server::net::listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let scheme = if secure_dir.is_some() { "https://localhost" } else { "http://127.0.0.1" };
    let discovery_url = format!("{scheme}:{}", discovery_listener.local_addr()?.port());
    let mut discovery_config = agentmesh_discovery::DiscoveryConfig::with_database_url(database_url.clone());
    let mut executor_config = agentmesh_executor::ExecutorConfig {
        discovery_url,
        max_concurrent_steps: 1024,
        max_concurrent_executions: 10_000,
        ..agentmesh_executor::ExecutorConfig::with_database_url(database_url)
    };
    if let Some(dir) = &secure_dir {
        for service in [&mut discovery_config.service, &mut executor_config.service] {
            service.tls_cert_file = Some(dir.join("server.pem"));
            service.tls_key_file = Some(dir.join("server.key"));
            service.tls_ca_file = Some(dir.join("ca.pem"));
            service.auth_tokens_file = Some(dir.join("tokens.toml"));
        }
        executor_config.service.auth_token = Some(std::fs::read_to_string(dir.join("service.token"))?);
    }
    println!("PORTS {} {}", discovery_listener.local_addr()?.port(), executor_listener.local_addr()?.port());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let discovery = agentmesh_discovery::serve_with_listener(discovery_config, discovery_listener, until());
    let executor = agentmesh_executor::serve_with_listener(executor_config, executor_listener, until());
    let stdin = async move {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        let _ = stop.send(true);
        Ok::<(), anyhow::Error>(())
    };
    tokio::try_join!(discovery, executor, stdin)?;
    telemetry.shutdown().await;
    Ok(())
}

/// A child process of this binary that prints a line starting with `prefix`.
async fn child(args: &[&str], prefix: &str) -> anyhow::Result<(tokio::process::Child, Vec<u16>)> {
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).await?;
    let ports = line
        .trim()
        .strip_prefix(prefix)
        .with_context(|| format!("child printed `{line}`"))?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<Vec<u16>, _>>()?;
    Ok((child, ports))
}

fn plan(agent: &str, steps: usize, chained: bool) -> pb::Plan {
    pb::Plan {
        reasoning: String::new(),
        steps: (1..=steps)
            .map(|i| pb::PlanStep {
                step_id: format!("s{i}"),
                agent: agent.into(),
                capability: "noop".into(),
                instruction: String::new(),
                parameters: Some(prost_types::Struct::default()),
                depends_on: if chained && i > 1 { vec![format!("s{}", i - 1)] } else { Vec::new() },
            })
            .collect(),
    }
}

/// Runs one execution to its end; returns its wall time.
async fn execute(
    client: &mut ExecutorServiceClient<tonic::transport::Channel>,
    plan: pb::Plan,
    concurrency: u32,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut request = tonic::Request::new(pb::ExecuteRequest {
        plan: Some(plan),
        options: Some(pb::ExecutionOptions {
            max_concurrency: concurrency,
            max_retries: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    });
    if let Some((token, _)) = SECURE.get() {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
    }
    let mut events = client.execute(request).await?.into_inner();
    let mut last = None;
    while let Some(event) = events.next().await {
        last = event?.event;
    }
    let last = last.context("no events")?;
    anyhow::ensure!(
        last.kind == pb::ExecutionEventKind::ExecutionCompleted as i32,
        "execution ended with {:?}: {}",
        pb::ExecutionEventKind::try_from(last.kind),
        last.error
    );
    Ok(started.elapsed())
}

/// A fresh PostgreSQL database on the server `admin_url` names.
async fn fresh_postgres(admin_url: &str) -> anyhow::Result<(String, String)> {
    use sqlx::Connection;
    let name = format!("agentmesh_bench_{}_{:08x}", std::process::id(), rand::random::<u32>());
    let mut conn = sqlx::PgConnection::connect(admin_url).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(&mut conn).await?;
    Ok((agentmesh_testkit::replace_database(admin_url, &name), name))
}

async fn drop_postgres(admin_url: &str, name: &str) {
    use sqlx::Connection;
    if let Ok(mut conn) = sqlx::PgConnection::connect(admin_url).await {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
            .execute(&mut conn)
            .await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Some(Command::Agent) => return agent().await,
        Some(Command::Mesh { database_url, secure_dir }) => return mesh(database_url, secure_dir).await,
        None => {}
    }
    agentmesh_testkit::install_tls();
    let pki = if args.secure {
        let pki = agentmesh_testkit::TestPki::new("executor-bench")?;
        // Written as server.pem and server.key, where the child reads them.
        pki.issue("server")?;
        let (operator, service) =
            (format!("op-{:016x}", rand::random::<u64>()), format!("svc-{:016x}", rand::random::<u64>()));
        agentmesh_testkit::write_tokens_file(
            &pki.dir().join("tokens.toml"),
            &[("bench", "operator", &operator), ("executor", "service", &service)],
        )?;
        std::fs::write(pki.dir().join("service.token"), &service)?;
        let _ = SECURE.set((operator, pki.ca_pem.clone()));
        Some(pki)
    } else {
        None
    };
    let (_agent, agent_port) = child(&["agent"], "PORT ").await?;
    let agent_url = format!("http://127.0.0.1:{}", agent_port[0]);
    let mut rows = Vec::new();
    for store in &args.stores {
        let (database_url, cleanup) = if store == "sqlite" {
            let path = std::env::temp_dir().join(format!("agentmesh-executor-bench-{}.db", std::process::id()));
            (format!("sqlite://{}", path.display()), None)
        } else {
            let (url, name) = fresh_postgres(store).await?;
            (url, Some(name))
        };
        let backend = if store == "sqlite" { "SQLite" } else { "PostgreSQL" };
        let secure_dir = pki.as_ref().map(|p| p.dir().to_string_lossy().to_string());
        let mut mesh_args = vec!["mesh", "--database-url", &database_url];
        if let Some(dir) = &secure_dir {
            mesh_args.extend(["--secure-dir", dir]);
        }
        let (mut mesh, ports) = child(&mesh_args, "PORTS ").await?;
        let pid = mesh.id().context("mesh pid")?;
        let scheme = if pki.is_some() { "https://localhost" } else { "http://127.0.0.1" };
        let (discovery, executor) = (format!("{scheme}:{}", ports[0]), format!("{scheme}:{}", ports[1]));
        let mut http = agentmesh_telemetry::http::client_builder();
        let mut endpoint = tonic::transport::Endpoint::from_shared(executor)?.tcp_nodelay(true);
        if let Some((token, ca)) = SECURE.get() {
            http = http.tls_certs_only(reqwest::Certificate::from_pem_bundle(ca.as_bytes())?);
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse()?);
            http = http.default_headers(headers);
            endpoint = endpoint.tls_config(
                tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            )?;
        }
        let http = http.build()?;
        let registration = json!({"id": "noop-agent", "base_url": agent_url, "skills": [{"id": "noop", "description": "Does nothing"}]});
        http.post(format!("{discovery}/api/v1/agents")).json(&registration).send().await?.error_for_status()?;
        let registration = json!({"id": "noop-mcp", "base_url": format!("{agent_url}/mcp"), "transport": "mcp"});
        http.post(format!("{discovery}/api/v1/agents")).json(&registration).send().await?.error_for_status()?;
        let channel = endpoint.connect().await?;
        let client = ExecutorServiceClient::new(channel).max_decoding_message_size(64 << 20);
        for transport in &args.transports {
            let agent = match transport.as_str() {
                "http" => "noop-agent",
                "mcp" => "noop-mcp",
                other => anyhow::bail!("--transports: `{other}` is neither http nor mcp"),
            };
            let label = format!("{backend}, {transport}");

            let scenarios: [(&str, usize, bool, u32); 2] =
                [("fan-out", args.fanout, false, args.fanout_concurrency), ("chain", args.chain, true, 1)];
            for (name, steps, chained, concurrency) in scenarios {
                let mut walls = Vec::new();
                for run in 0..=args.runs {
                    let wall = execute(&mut client.clone(), plan(agent, steps, chained), concurrency).await?;
                    if run > 0 {
                        walls.push(wall);
                    }
                }
                walls.sort();
                let median = walls[walls.len() / 2];
                let per_step_us = median.as_secs_f64() * 1e6 / steps as f64;
                let row = vec![
                    label.clone(),
                    format!("{name}, {steps} steps"),
                    if chained { "1".into() } else { concurrency.to_string() },
                    format!("{:.1}", median.as_secs_f64() * 1000.0),
                    format!("{:.0}", steps as f64 / median.as_secs_f64()),
                    format!("{per_step_us:.0}"),
                    walls.iter().map(|w| format!("{:.0}", w.as_secs_f64() * 1000.0)).collect::<Vec<_>>().join(" / "),
                ];
                eprintln!("{}", row.join(" | "));
                rows.push(row);
            }

            // Many executions at once, each a chain.
            for run in 0..=args.runs {
                let started = Instant::now();
                let mut tasks = Vec::new();
                for _ in 0..args.concurrent {
                    let mut client = client.clone();
                    let plan = plan(agent, args.concurrent_steps, true);
                    tasks.push(tokio::spawn(async move { execute(&mut client, plan, 1).await }));
                }
                let mut latencies = Latencies::default();
                for task in tasks {
                    latencies.record(task.await??);
                }
                let wall = started.elapsed();
                if run == 0 {
                    continue;
                }
                let steps = args.concurrent * args.concurrent_steps;
                let row = vec![
                    label.clone(),
                    format!(
                        "{} executions × {}-step chain, at once (run {run})",
                        args.concurrent, args.concurrent_steps
                    ),
                    args.concurrent.to_string(),
                    format!("{:.1}", wall.as_secs_f64() * 1000.0),
                    format!("{:.0}", steps as f64 / wall.as_secs_f64()),
                    format!("{:.0}", wall.as_secs_f64() * 1e6 / steps as f64),
                    format!("p50 {:.0} / p99 {:.0}", latencies.percentile_ms(50.0), latencies.percentile_ms(99.0)),
                ];
                eprintln!("{}", row.join(" | "));
                rows.push(row);
            }
        }
        let metrics = http.get(format!("{scheme}:{}/metrics", ports[1])).send().await?.text().await?;
        let sample = |name: &str| {
            metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).unwrap_or(f64::NAN)
        };
        let batches = sample("agentmesh_executor_event_write_seconds_count");
        eprintln!(
            "{backend}: {batches:.0} event batches, {:.0} µs per batch write, {:.1} events per batch",
            sample("agentmesh_executor_event_write_seconds_sum") * 1e6 / batches,
            sample("agentmesh_executor_event_batch_size_sum") / batches
        );
        let (rss, peak) = rss_mib(pid).unwrap_or((f64::NAN, f64::NAN));
        eprintln!("{backend}: mesh RSS {rss:.1} MiB, peak {peak:.1} MiB");
        drop(mesh.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(10), mesh.wait()).await;
        let _ = mesh.kill().await;
        match cleanup {
            Some(name) => drop_postgres(store, &name).await,
            None => {
                let path = database_url.trim_start_matches("sqlite://");
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
            }
        }
    }
    println!();
    print_table(
        &[
            "events stored in, transport",
            "scenario",
            "concurrency",
            "wall ms (median)",
            "steps/s",
            "µs per step",
            "each run, ms",
        ],
        &rows,
    );
    Ok(())
}
