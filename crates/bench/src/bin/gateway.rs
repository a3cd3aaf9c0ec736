//! Gateway overhead benchmark: what the gateway adds to an orchestration,
//! beyond the stages it calls.
//!
//! The whole mesh runs in this process on loopback ports (discovery,
//! planner, executor, synthesis, gateway, each on SQLite in a temporary
//! directory), with the `replay` LLM provider answering at once (a 3-step
//! plan, a short answer streamed a word at a time, a review judging the
//! goal achieved) and a no-op HTTP agent. It measures, per request:
//!
//! - `Orchestrate` over gRPC, to the final answer;
//! - `POST /api/v1/orchestrate` as server-sent events, to the last event;
//! - the same stages called directly, one after the other, by the client:
//!   `CreatePlan`, `Execute` (to its last event), `GetExecution`,
//!   `Synthesize` (to its done message) and `Review`.
//!
//! The gateway's own overhead is the difference between an orchestration
//! and the direct chain.
//!
//! `cargo run --release -p agentmesh-bench --bin gateway-bench`

/// The same allocator as the other benchmarks.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::time::Instant;

use agentmesh_bench::{Latencies, print_table, spawn};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_proto::v1::gateway_service_client::GatewayServiceClient;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_proto::v1::synthesis_service_client::SynthesisServiceClient;
use agentmesh_testkit::{Answer, Behavior, FakeAgent};
use anyhow::Context;
use clap::Parser;
use serde_json::json;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    /// Measured orchestrations per scenario (after 10% of warm-up).
    #[arg(long, default_value_t = 300)]
    iterations: usize,
}

const QUERY: &str = "What is the weather in Chicago, in Paris and in Rome?";

struct Mesh {
    planner: SocketAddr,
    executor: SocketAddr,
    synthesis: SocketAddr,
    gateway: SocketAddr,
    _agent: FakeAgent,
}

async fn mesh(dir: &std::path::Path) -> anyhow::Result<Mesh> {
    let db = |name: &str| format!("sqlite://{}", dir.join(format!("{name}.db")).display());
    let pending = std::future::pending::<()>;
    let discovery_config = agentmesh_discovery::DiscoveryConfig::with_database_url(db("discovery"));
    let discovery = spawn(|l| agentmesh_discovery::serve_with_listener(discovery_config, l, pending())).await?;
    let agent = FakeAgent::start(vec![("get_current_weather", Behavior::Always(Answer::ok(json!({"temp_c": 21}))))])
        .await
        .context("starting the agent")?;
    let schema = json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]});
    let registration = json!({"id": "weather-tool-v2", "base_url": agent.url(), "skills": [
        {"id": "get_current_weather", "description": "Current weather for a location", "input_schema": schema}]});
    agentmesh_llm::client_builder()
        .build()?
        .post(format!("http://{discovery}/api/v1/agents"))
        .json(&registration)
        .send()
        .await?
        .error_for_status()?;

    let step = |id: &str, city: &str| {
        json!({"step_id": id, "agent": "weather-tool-v2", "capability": "get_current_weather",
            "instruction": format!("Weather in {city}"), "parameters": {"location": city}, "depends_on": []})
    };
    let plan = json!({"steps": [step("s1", "Chicago"), step("s2", "Paris"), step("s3", "Rome")],
        "reasoning": "three lookups"});
    let review = json!({"summary": "All three are known.", "missing_data": [], "goal_achieved": true,
        "confidence": 0.9, "recovery_actions": []});
    let script = json!([
        {"match": "Tools that recovery may use:", "text": review.to_string(), "repeat": true},
        {"match": "Write the answer to the request.", "text": "It is 21 °C in Chicago, Paris and Rome.", "repeat": true},
        {"match": "Capabilities:", "text": plan.to_string(), "repeat": true},
    ]);
    let script_path = dir.join("replay.json");
    std::fs::write(&script_path, script.to_string())?;
    let llm = format!("replay:{}", script_path.display());

    let planner_config = agentmesh_planner::PlannerConfig {
        discovery_url: format!("http://{discovery}"),
        llm: agentmesh_planner::LlmSettings { llm: llm.clone(), ..agentmesh_planner::PlannerConfig::default().llm },
        // The replayed plans are for these requests whatever their relevance.
        embeddings: "none".into(),
        ..agentmesh_planner::PlannerConfig::with_database_url(db("planner"))
    };
    let planner = spawn(|l| agentmesh_planner::serve_with_listener(planner_config, l, pending())).await?;
    let executor_config = agentmesh_executor::ExecutorConfig {
        discovery_url: format!("http://{discovery}"),
        ..agentmesh_executor::ExecutorConfig::with_database_url(db("executor"))
    };
    let executor = spawn(|l| agentmesh_executor::serve_with_listener(executor_config, l, pending())).await?;
    let synthesis_config = agentmesh_synthesis::SynthesisConfig {
        discovery_url: format!("http://{discovery}"),
        llm: agentmesh_synthesis::LlmSettings { llm, ..agentmesh_synthesis::SynthesisConfig::default().llm },
        ..agentmesh_synthesis::SynthesisConfig::with_database_url(db("synthesis"))
    };
    let synthesis = spawn(|l| agentmesh_synthesis::serve_with_listener(synthesis_config, l, pending())).await?;
    let gateway_config = agentmesh_gateway::GatewayConfig {
        planner_url: format!("http://{planner}"),
        executor_url: format!("http://{executor}"),
        synthesis_url: format!("http://{synthesis}"),
        discovery_url: format!("http://{discovery}"),
        ..agentmesh_gateway::GatewayConfig::with_database_url(db("gateway"))
    };
    let gateway = spawn(|l| agentmesh_gateway::serve_with_listener(gateway_config, l, pending())).await?;
    Ok(Mesh { planner, executor, synthesis, gateway, _agent: agent })
}

async fn channel(addr: SocketAddr) -> anyhow::Result<Channel> {
    Ok(tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect().await?)
}

/// One orchestration over gRPC; checks that it ends with a reviewed answer.
async fn orchestrate(client: &mut GatewayServiceClient<Channel>) -> anyhow::Result<()> {
    let mut stream =
        client.orchestrate(pb::OrchestrateRequest { query: QUERY.into(), ..Default::default() }).await?.into_inner();
    let mut last = None;
    while let Some(m) = stream.message().await? {
        last = m.event;
    }
    match last {
        Some(pb::orchestrate_response::Event::FinalAnswer(a)) if a.goal_achieved => Ok(()),
        other => anyhow::bail!("the orchestration ended with {other:?}"),
    }
}

/// One orchestration over SSE, read to the last event.
async fn orchestrate_sse(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let mut response = http
        .post(url)
        .header("accept", "text/event-stream")
        .json(&json!({"query": QUERY}))
        .send()
        .await?
        .error_for_status()?;
    let mut body = String::new();
    while let Some(chunk) = response.chunk().await? {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    anyhow::ensure!(body.contains("event: final_answer"), "no final answer in {body}");
    Ok(())
}

#[derive(Clone)]
struct Direct {
    planner: PlannerServiceClient<Channel>,
    executor: ExecutorServiceClient<Channel>,
    synthesis: SynthesisServiceClient<Channel>,
}

/// The same stages, called one after the other by the client.
async fn direct(d: &mut Direct) -> anyhow::Result<()> {
    let created =
        d.planner.create_plan(pb::CreatePlanRequest { query: QUERY.into(), ..Default::default() }).await?.into_inner();
    let mut events = d
        .executor
        .execute(pb::ExecuteRequest { plan: created.plan, query: QUERY.into(), ..Default::default() })
        .await?
        .into_inner();
    let mut execution_id = String::new();
    while let Some(m) = events.message().await? {
        if let Some(e) = m.event {
            execution_id = e.execution_id;
        }
    }
    let execution = d
        .executor
        .get_execution(pb::GetExecutionRequest { execution_id })
        .await?
        .into_inner()
        .execution
        .context("no execution")?;
    let mut answer = String::new();
    let mut chunks = d
        .synthesis
        .synthesize(pb::SynthesizeRequest {
            query: QUERY.into(),
            plan: execution.plan.clone(),
            results: execution.step_results.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    while let Some(m) = chunks.message().await? {
        if let Some(pb::synthesize_response::Chunk::Text(t)) = m.chunk {
            answer.push_str(&t);
        }
    }
    let review = d
        .synthesis
        .review(pb::ReviewRequest {
            query: QUERY.into(),
            plan: execution.plan,
            results: execution.step_results,
            answer,
            ..Default::default()
        })
        .await?
        .into_inner();
    anyhow::ensure!(review.review.is_some_and(|r| r.goal_achieved), "the review was not satisfied");
    Ok(())
}

async fn measure<F, Fut>(iterations: usize, mut run: F) -> anyhow::Result<Latencies>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut lat = Latencies::default();
    for i in 0..iterations + iterations / 10 {
        let t0 = Instant::now();
        run().await?;
        if i >= iterations / 10 {
            lat.record(t0.elapsed());
        }
    }
    Ok(lat)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = agentmesh_telemetry::init(
        "agentmesh-gateway",
        &agentmesh_telemetry::TelemetryConfig { log_filter: Some("error".into()), ..Default::default() },
    )?;
    let dir = std::env::temp_dir().join(format!("agentmesh-gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let m = mesh(&dir).await?;
    let gateway = GatewayServiceClient::new(channel(m.gateway).await?);
    let http = agentmesh_llm::client_builder().build()?;
    let sse_url = format!("http://{}/api/v1/orchestrate", m.gateway);
    let d = Direct {
        planner: PlannerServiceClient::new(channel(m.planner).await?),
        executor: ExecutorServiceClient::new(channel(m.executor).await?),
        synthesis: SynthesisServiceClient::new(channel(m.synthesis).await?),
    };
    // Interleaved rounds, so that a slow spell of the machine (the database
    // files growing, another process) falls on every scenario alike.
    let (mut grpc, mut sse, mut chain) = (Latencies::default(), Latencies::default(), Latencies::default());
    let rounds = 10;
    let per_round = args.iterations.div_ceil(rounds);
    for _ in 0..rounds {
        chain.merge(
            measure(per_round, || {
                let mut d = d.clone();
                async move { direct(&mut d).await }
            })
            .await?,
        );
        grpc.merge(
            measure(per_round, || {
                let mut gateway = gateway.clone();
                async move { orchestrate(&mut gateway).await }
            })
            .await?,
        );
        sse.merge(measure(per_round, || orchestrate_sse(&http, &sse_url)).await?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    telemetry.shutdown().await;
    let base = (chain.percentile_ms(50.0), chain.percentile_ms(99.0));
    let mut rows = Vec::new();
    for (what, lat) in [
        ("stages called directly (no gateway)", &mut chain),
        ("Orchestrate over gRPC", &mut grpc),
        ("POST /api/v1/orchestrate, SSE", &mut sse),
    ] {
        let (p50, p99) = (lat.percentile_ms(50.0), lat.percentile_ms(99.0));
        rows.push(vec![
            what.to_owned(),
            lat.count().to_string(),
            format!("{p50:.2}"),
            format!("{p99:.2}"),
            format!("{:+.2}", p50 - base.0),
            format!("{:+.2}", p99 - base.1),
        ]);
    }
    println!();
    print_table(&["measured", "orchestrations", "p50 ms", "p99 ms", "p50 vs direct", "p99 vs direct"], &rows);
    Ok(())
}
