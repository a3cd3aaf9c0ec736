//! Planner overhead benchmark: the time the planner adds to a request, not
//! counting the model. The LLM answers at once, and honestly: pre-selection
//! keeps the first tools it is offered, and the plan uses the first
//! capability the plan schema allows, with its required parameters filled.
//!
//! For each catalog size it measures, per request:
//! - the engine alone (`Planner::plan` over an in-memory catalog);
//! - the catalog fetch from discovery that every request makes;
//! - the whole gRPC `CreatePlan`: catalog from a real discovery (SQLite),
//!   planning, and the interaction log (SQLite), with the `replay` provider
//!   answering from a script.
//!
//! It then prints the size of the planning prompt at the largest catalog with
//! and without pre-selection.
//!
//! `cargo run --release -p agentmesh-bench --bin planner-bench`

/// The same allocator as the discovery benchmark.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use agentmesh_bench::{Latencies, print_table};
use agentmesh_core::CapabilityKind;
use agentmesh_core::plan::AllowedCapability;
use agentmesh_llm::{Completion, CompletionRequest, LlmError, LlmProvider, StructuredMode, Usage};
use agentmesh_planner::{Planner, PlannerConfig, PlannerSettings};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use anyhow::Context;
use async_trait::async_trait;
use clap::Parser;
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    /// Catalog sizes, in capabilities (agents of 10 capabilities each).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    capabilities: Vec<usize>,
    /// Measured engine runs per catalog size (after 10% of warm-up).
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Measured gRPC CreatePlan calls per catalog size (after 10% of warm-up).
    #[arg(long, default_value_t = 300)]
    grpc_iterations: usize,
    /// Tools the pre-selection answer keeps.
    #[arg(long, default_value_t = 5)]
    keep: usize,
    /// The request planned.
    #[arg(long, default_value = "What is the weather in Chicago right now?")]
    query: String,
    /// The gRPC planner's `embeddings` (`none`: ranking by words, as the
    /// figures in docs/benchmarks.md; `local` adds embedding the request;
    /// see `preselect-bench` for what ranking by meaning costs).
    #[arg(long, default_value = "none")]
    embeddings: String,
    /// Export every span (100 % sampling) over OTLP/gRPC to a receiver in
    /// this process, to measure what tracing costs.
    #[arg(long)]
    export_traces: bool,
}

const WEATHER: [(&str, &str); 5] = [
    ("get_current_weather", "Current weather for a location"),
    ("get_forecast", "Weather forecast for the next days at a location"),
    ("get_weather_alerts", "Severe weather alerts for a location"),
    ("get_air_quality", "Air quality index for a location"),
    ("get_historical_weather", "Past weather observations for a location"),
];
const VERBS: [&str; 12] = [
    "Summarizes",
    "Translates",
    "Converts",
    "Validates",
    "Searches",
    "Ranks",
    "Extracts",
    "Classifies",
    "Schedules",
    "Monitors",
    "Audits",
    "Archives",
];
const OBJECTS: [&str; 16] = [
    "invoices",
    "emails",
    "support tickets",
    "contracts",
    "images",
    "server logs",
    "orders",
    "shipments",
    "calendars",
    "documents",
    "social posts",
    "metrics",
    "repositories",
    "payments",
    "recipes",
    "flights",
];
const QUALIFIERS: [&str; 8] = [
    "in bulk",
    "for a customer",
    "by date",
    "above a threshold",
    "across regions",
    "for an account",
    "in real time",
    "from an uploaded file",
];

/// One capability of the generated catalog: (id, kind, description, input schema).
fn capability(agent: usize, j: usize) -> (String, CapabilityKind, String, Value) {
    if agent == 0 && j < WEATHER.len() {
        let schema = json!({"type": "object", "properties": {"location": {"type": "string"},
            "units": {"type": "string", "enum": ["metric", "imperial"]}}, "required": ["location"]});
        return (WEATHER[j].0.into(), CapabilityKind::Skill, WEATHER[j].1.into(), schema);
    }
    let k = agent * 10 + j;
    let description = format!(
        "{} {} {}",
        VERBS[k % VERBS.len()],
        OBJECTS[(k / VERBS.len()) % OBJECTS.len()],
        QUALIFIERS[(k / 7) % QUALIFIERS.len()]
    );
    let schema = json!({"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"]});
    let (kind, id) =
        if j.is_multiple_of(2) { (CapabilityKind::Skill, "skill") } else { (CapabilityKind::Reasoner, "reason") };
    (format!("{id}_{j}"), kind, description, schema)
}

fn agent_id(i: usize) -> String {
    format!("agent-{i:05}")
}

/// The catalog as the planner holds it after fetching it from discovery.
fn allowed(n: usize) -> Vec<AllowedCapability> {
    (0..n)
        .map(|k| {
            let (capability, kind, description, schema) = capability(k / 10, k % 10);
            AllowedCapability { agent: agent_id(k / 10), capability, kind, description, input_schema: Some(schema) }
        })
        .collect()
}

/// The same catalog as registrations for discovery.
fn registrations(n: usize) -> Vec<Value> {
    (0..n.div_ceil(10))
        .map(|i| {
            let (mut reasoners, mut skills) = (Vec::new(), Vec::new());
            for j in 0..(n - i * 10).min(10) {
                let (id, kind, description, schema) = capability(i, j);
                let entry = json!({"id": id, "description": description, "input_schema": schema});
                if kind == CapabilityKind::Skill { skills.push(entry) } else { reasoners.push(entry) }
            }
            json!({"id": agent_id(i), "base_url": format!("http://10.0.0.{}:8080", i % 250), "version": "1.0.0",
                "reasoners": reasoners, "skills": skills})
        })
        .collect()
}

/// A value that fits a property schema.
fn example(schema: &Value) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("integer") => json!(1),
        Some("number") => json!(1.5),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => json!({}),
        _ => json!("Chicago"),
    }
}

/// Sizes of one request an LLM received.
#[derive(Debug, Clone)]
struct Sent {
    schema_name: String,
    message_bytes: usize,
    schema_bytes: usize,
}

/// An LLM that answers at once with a valid answer for what it is offered.
struct InstantLlm {
    keep: usize,
    sent: Option<Mutex<Vec<Sent>>>,
}

impl InstantLlm {
    fn answer(&self, request: &CompletionRequest) -> Result<String, String> {
        let schema = request.response_schema.as_ref().ok_or("the planner sent no schema")?;
        match schema.name.as_str() {
            "selection" => {
                let ids = schema.schema["properties"]["selected"]["items"]["enum"].as_array().ok_or("no tool ids")?;
                Ok(json!({"selected": ids.iter().take(self.keep).collect::<Vec<_>>()}).to_string())
            }
            "plan" => {
                let branch = &schema.schema["properties"]["steps"]["items"]["anyOf"][0]["properties"];
                let parameters = &branch["parameters"];
                let filled: serde_json::Map<String, Value> = parameters["required"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|p| (p.to_owned(), example(&parameters["properties"][p])))
                    .collect();
                Ok(json!({"reasoning": "one step answers it", "steps": [{"step_id": "s1",
                    "agent": branch["agent"]["const"], "capability": branch["capability"]["const"],
                    "instruction": "answer the request", "parameters": filled, "depends_on": []}]})
                .to_string())
            }
            other => Err(format!("unexpected schema `{other}`")),
        }
    }
}

#[async_trait]
impl LlmProvider for InstantLlm {
    fn name(&self) -> &str {
        "instant"
    }

    fn model(&self) -> &str {
        "instant"
    }

    fn structured_mode(&self) -> Option<StructuredMode> {
        Some(StructuredMode::JsonSchema)
    }

    async fn generate(
        &self,
        request: &CompletionRequest,
        _on_text: agentmesh_llm::OnText<'_>,
    ) -> Result<Completion, LlmError> {
        let started = Instant::now();
        if let (Some(sent), Some(schema)) = (&self.sent, &request.response_schema)
            && let Ok(mut sent) = sent.lock()
        {
            sent.push(Sent {
                schema_name: schema.name.clone(),
                message_bytes: request.messages.iter().map(|m| m.content.len()).sum(),
                schema_bytes: schema.schema.to_string().len(),
            });
        }
        let text = self.answer(request).map_err(LlmError::InvalidResponse)?;
        Ok(Completion {
            text,
            provider: "instant".into(),
            model: "instant".into(),
            structured_mode: Some(StructuredMode::JsonSchema),
            usage: Usage::default(),
            latency: started.elapsed(),
            truncated: false,
        })
    }
}

/// `Planner::plan` alone, `iterations` times after a warm-up.
async fn bench_engine(catalog: &[AllowedCapability], args: &Args) -> anyhow::Result<Latencies> {
    let planner = Planner::new(PlannerSettings::default());
    let llm = InstantLlm { keep: args.keep, sent: None };
    let mut lat = Latencies::default();
    for i in 0..args.iterations + args.iterations / 10 {
        let t0 = Instant::now();
        let outcome = planner.plan(&llm, &args.query, catalog).await;
        let took = t0.elapsed();
        match outcome {
            Ok(o) if o.plan.steps.len() == 1 && o.stats.hallucinations_detected == 0 && o.stats.retries == 0 => {
                if i >= args.iterations / 10 {
                    lat.record(took);
                }
            }
            Ok(o) => anyhow::bail!("unexpected outcome: {:?} {:?}", o.plan, o.stats),
            Err(e) => anyhow::bail!("planning failed: {e}"),
        }
    }
    Ok(lat)
}

/// The whole `CreatePlan` over gRPC, with discovery and the interaction log;
/// also the catalog fetch from discovery alone, which every request makes.
async fn bench_grpc(n: usize, args: &Args, dir: &std::path::Path) -> anyhow::Result<(Latencies, Latencies)> {
    let discovery_db = format!("sqlite://{}", dir.join(format!("discovery-{n}.db")).display());
    let discovery_listener = agentmesh_server::net::listen(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let discovery_url = format!("http://{}", discovery_listener.local_addr()?);
    let (stop_discovery, discovery_stopped) = tokio::sync::oneshot::channel::<()>();
    let discovery = tokio::spawn(agentmesh_discovery::serve_with_listener(
        agentmesh_discovery::DiscoveryConfig::with_database_url(discovery_db),
        discovery_listener,
        async move {
            let _ = discovery_stopped.await;
        },
    ));
    let http = agentmesh_llm::client_builder().build()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(format!("{discovery_url}/healthz")).send().await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "discovery did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for agent in registrations(n) {
        http.post(format!("{discovery_url}/api/v1/agents")).json(&agent).send().await?.error_for_status()?;
    }
    let mut discovery_client = DiscoveryServiceClient::new(agentmesh_telemetry::rpc::traced(
        agentmesh_telemetry::rpc::channel("discovery", &discovery_url, &Default::default())?,
    ));
    let mut fetches = Latencies::default();
    for i in 0..args.grpc_iterations + args.grpc_iterations / 10 {
        let t0 = Instant::now();
        let fetched = agentmesh_catalog::fetch(&mut discovery_client, &[], false, "bench").await?.capabilities;
        let took = t0.elapsed();
        anyhow::ensure!(fetched.len() == n, "discovery returned {} capabilities, not {n}", fetched.len());
        if i >= args.grpc_iterations / 10 {
            fetches.record(took);
        }
    }

    // The replay script: pre-selection keeps the weather tools, the plan
    // uses the first of them. Both are valid for what the planner offers.
    let weather_ids: Vec<String> =
        WEATHER.iter().take(args.keep.min(WEATHER.len())).map(|(id, _)| format!("{}/{id}", agent_id(0))).collect();
    let plan = json!({"reasoning": "one step answers it", "steps": [{"step_id": "s1", "agent": agent_id(0),
        "capability": WEATHER[0].0, "instruction": "answer the request", "parameters": {"location": "Chicago"},
        "depends_on": []}]});
    let script = json!([
        {"match": "\n\nTools:\n", "text": json!({"selected": weather_ids}).to_string(), "repeat": true},
        {"match": "\n\nCapabilities:\n", "text": plan.to_string(), "repeat": true},
    ]);
    let script_path = dir.join(format!("replay-{n}.json"));
    std::fs::write(&script_path, script.to_string())?;

    let planner_listener = agentmesh_server::net::listen(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let planner_url = format!("http://{}", planner_listener.local_addr()?);
    let config = PlannerConfig {
        discovery_url,
        llm: agentmesh_planner::LlmSettings {
            llm: format!("replay:{}", script_path.display()),
            ..PlannerConfig::default().llm
        },
        embeddings: args.embeddings.clone(),
        ..PlannerConfig::with_database_url(format!("sqlite://{}", dir.join(format!("planner-{n}.db")).display()))
    };
    let (stop_planner, planner_stopped) = tokio::sync::oneshot::channel::<()>();
    let planner = tokio::spawn(agentmesh_planner::serve_with_listener(config, planner_listener, async move {
        let _ = planner_stopped.await;
    }));
    let mut client = loop {
        match PlannerServiceClient::connect(planner_url.clone()).await {
            Ok(client) => break client,
            Err(_) if Instant::now() < deadline && !planner.is_finished() => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => anyhow::bail!("planner did not start: {e}"),
        }
    };
    let mut lat = Latencies::default();
    for i in 0..args.grpc_iterations + args.grpc_iterations / 10 {
        let request = pb::CreatePlanRequest { query: args.query.clone(), ..Default::default() };
        let t0 = Instant::now();
        let response = client.create_plan(request).await;
        let took = t0.elapsed();
        let response = response.map_err(|s| anyhow::anyhow!("CreatePlan failed: {s}"))?.into_inner();
        let steps = response.plan.map_or(0, |p| p.steps.len());
        let stats = response.stats.unwrap_or_default();
        anyhow::ensure!(
            steps == 1 && stats.hallucinations_detected == 0 && stats.retries == 0,
            "unexpected answer: {steps} steps, {stats:?}"
        );
        if i >= args.grpc_iterations / 10 {
            lat.record(took);
        }
    }
    let _ = stop_planner.send(());
    let _ = stop_discovery.send(());
    planner.await.context("planner task")??;
    discovery.await.context("discovery task")??;
    Ok((lat, fetches))
}

/// Requests the LLM receives for one plan over `catalog`.
async fn prompt_sizes(
    catalog: &[AllowedCapability],
    settings: PlannerSettings,
    args: &Args,
) -> anyhow::Result<Vec<Sent>> {
    let llm = InstantLlm { keep: args.keep, sent: Some(Mutex::new(Vec::new())) };
    Planner::new(settings).plan(&llm, &args.query, catalog).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(llm.sent.map(|s| s.into_inner().unwrap_or_default()).unwrap_or_default())
}

fn size_row(mode: &str, sent: &Sent) -> Vec<String> {
    let total = sent.message_bytes + sent.schema_bytes;
    vec![
        mode.into(),
        if sent.schema_name == "selection" { "pre-selection".into() } else { "planning".into() },
        sent.message_bytes.to_string(),
        sent.schema_bytes.to_string(),
        total.to_string(),
        (total / 4).to_string(),
    ]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let receiver =
        if args.export_traces { Some(agentmesh_testkit::OtlpReceiver::start_counting().await?) } else { None };
    let telemetry = agentmesh_telemetry::init(
        "agentmesh-planner",
        &agentmesh_telemetry::TelemetryConfig {
            otlp_endpoint: receiver.as_ref().map(agentmesh_testkit::OtlpReceiver::endpoint),
            otlp_protocol: Some("grpc".into()),
            sampler: Some("always_on".into()),
            log_filter: Some("error".into()),
            ..Default::default()
        },
    )?;
    let dir = std::env::temp_dir().join(format!("agentmesh-planner-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    for &n in &args.capabilities {
        let catalog = allowed(n);
        let mut engine = bench_engine(&catalog, &args).await?;
        let (mut grpc, mut fetch) = bench_grpc(n, &args, &dir).await?;
        let preselected = if n > PlannerSettings::default().preselect_threshold { "yes" } else { "no" };
        let measured = [
            ("engine (Planner::plan)", &mut engine),
            ("catalog fetch from discovery alone", &mut fetch),
            ("gRPC CreatePlan, discovery + log", &mut grpc),
        ];
        for (what, lat) in measured {
            let row = vec![
                n.to_string(),
                preselected.into(),
                what.into(),
                lat.count().to_string(),
                format!("{:.3}", lat.percentile_ms(50.0)),
                format!("{:.3}", lat.percentile_ms(99.0)),
            ];
            eprintln!("{}", row.join(" | "));
            rows.push(row);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    telemetry.shutdown().await;
    println!();
    print_table(&["capabilities", "pre-selection", "measured", "requests", "p50 ms", "p99 ms"], &rows);
    if let Some(receiver) = &receiver {
        println!("traces exported (100 % sampled); spans received: {}", receiver.span_count());
    }

    let largest = args.capabilities.iter().copied().max().unwrap_or(1000);
    let catalog = allowed(largest);
    let with = prompt_sizes(&catalog, PlannerSettings::default(), &args).await?;
    let without =
        prompt_sizes(&catalog, PlannerSettings { preselect_threshold: usize::MAX, ..Default::default() }, &args)
            .await?;
    let mut sizes: Vec<Vec<String>> = with.iter().map(|s| size_row("with pre-selection", s)).collect();
    sizes.extend(without.iter().map(|s| size_row("without pre-selection", s)));
    println!();
    println!("Prompt sizes at {largest} capabilities (tokens estimated as bytes / 4):");
    println!();
    print_table(&["mode", "call", "message bytes", "schema bytes", "total bytes", "est. tokens"], &sizes);
    let planning = |sent: &[Sent]| {
        sent.iter().filter(|s| s.schema_name == "plan").map(|s| s.message_bytes + s.schema_bytes).sum::<usize>()
    };
    let (small, full) = (planning(&with), planning(&without));
    #[allow(clippy::cast_precision_loss)]
    let ratio = 100.0 * small as f64 / full.max(1) as f64;
    println!();
    println!("pre-selected planning prompt: {small} of {full} bytes ({ratio:.1}% of the full-catalog prompt)");
    Ok(())
}
