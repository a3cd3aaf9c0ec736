//! Discovery benchmark: throughput and latency percentiles of capability
//! queries over loopback, gRPC and REST, for several catalog sizes and
//! client counts, plus the server's memory. The server runs in a child
//! process (this binary with `serve`), so its RSS is its own.
//!
//! `cargo run --release -p agentmesh-bench --bin discovery-bench`

/// mimalloc: faster than the system allocator under many small
/// allocations on many threads, and it returns freed memory.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentmesh_bench::{Latencies, cpu_seconds, print_table, rss_mib};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

#[derive(Parser)]
struct Args {
    /// Catalog sizes (agents of 10 capabilities each).
    #[arg(long, value_delimiter = ',', default_value = "100,10000")]
    agents: Vec<usize>,
    /// Concurrent clients, each on its own connection.
    #[arg(long, value_delimiter = ',', default_value = "64,1000")]
    clients: Vec<usize>,
    /// Measured seconds per scenario (after 0.5 s of warm-up).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Also run each client count paced: every client sends one request per
    /// this many milliseconds (an open load of clients × 1000 / N req/s), so
    /// latency shows service time rather than queueing. 0 disables.
    #[arg(long, default_value_t = 1000)]
    paced_interval_ms: u64,
    /// Queries to run: `page`, `filtered`.
    #[arg(long, value_delimiter = ',', default_value = "page,filtered")]
    queries: Vec<String>,
    /// APIs to run: `grpc`, `rest`.
    #[arg(long, value_delimiter = ',', default_value = "grpc,rest")]
    apis: Vec<String>,
    /// gRPC clients share this many HTTP/2 connections (0: one connection
    /// per client), as gRPC clients that multiplex a channel do.
    #[arg(long, default_value_t = 0)]
    grpc_connections: usize,
    /// gRPC clients decode each response into its message types. By default
    /// they read the message bytes and stop there, as the REST clients read
    /// the body without parsing its JSON, so that the rows measure the
    /// server rather than a decoder sharing its cores.
    #[arg(long)]
    grpc_decode: bool,
    /// HTTP/2 max frame size gRPC clients announce, in KiB (16 to 16383; 0
    /// keeps the protocol's default of 16). Larger frames let the server
    /// send a large answer in fewer writes.
    #[arg(long, default_value_t = 0)]
    grpc_max_frame_kib: u32,
    /// Seconds between the server's background catalog reloads (its
    /// `cache_ttl_secs`; 30 by default, as in the service).
    #[arg(long, default_value_t = 30.0)]
    cache_ttl_secs: f64,
    /// Registry database (default: a fresh SQLite file per catalog size).
    #[arg(long)]
    database_url: Option<String>,
    /// Trace export of the server: `off` (no endpoint: the service's
    /// default), `on` (every request sampled and exported over OTLP/gRPC to
    /// a receiver in this process). Each mode runs its own server.
    #[arg(long, value_delimiter = ',', default_value = "off")]
    traces: Vec<String>,
    /// Serve over TLS (a certificate from a CA made for the run) with
    /// authentication on: every client verifies the certificate and sends
    /// a bearer token, every request is checked against the tokens file.
    #[arg(long)]
    secure: bool,
    /// With `--secure`: authentication only, over plaintext (to tell the
    /// cost of tokens from the cost of TLS).
    #[arg(long)]
    no_tls: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Internal: run discovery, print its port, stop when stdin closes.
    Serve {
        #[arg(long)]
        database_url: String,
        #[arg(long)]
        cache_ttl_secs: f64,
        /// OTLP/gRPC endpoint to export every span to.
        #[arg(long)]
        otlp_endpoint: Option<String>,
        /// A directory holding `server.pem`, `server.key` and `tokens.toml`:
        /// serve TLS and require tokens.
        #[arg(long)]
        secure_dir: Option<std::path::PathBuf>,
        /// With `--secure-dir`: tokens only, no TLS.
        #[arg(long)]
        no_tls: bool,
    },
}

/// What the clients of a `--secure` run trust and present.
struct Secure {
    /// The CA to trust; `None`: plaintext.
    ca_pem: Option<String>,
    token: String,
}

/// Set once, for a `--secure` run.
static SECURE: std::sync::OnceLock<Secure> = std::sync::OnceLock::new();

/// An HTTP client for the run: trusting the run's CA and sending its token
/// when secure.
fn http_client() -> anyhow::Result<reqwest::ClientBuilder> {
    let mut builder = agentmesh_llm::client_builder();
    if let Some(secure) = SECURE.get() {
        if let Some(ca) = &secure.ca_pem {
            builder = builder.tls_certs_only(reqwest::Certificate::from_pem_bundle(ca.as_bytes())?);
        }
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", secure.token).parse()?);
        builder = builder.default_headers(headers);
    }
    Ok(builder)
}

/// A gRPC request carrying the run's token when secure.
fn authed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(secure) = SECURE.get()
        && let Ok(value) = format!("Bearer {}", secure.token).parse()
    {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

#[derive(Clone, Copy, PartialEq)]
enum Protocol {
    Grpc,
    Rest,
}

#[derive(Clone, Copy)]
enum Query {
    /// The default page: 100 agents × 10 capabilities, no schemas.
    Page,
    /// A skill pattern and a tag: a few capabilities.
    Filtered,
}

impl Query {
    fn name(self) -> &'static str {
        match self {
            Self::Page => "default page (≤100 agents, no schemas)",
            Self::Filtered => "skill=skill_3&tags=tag-7",
        }
    }
    fn rest(self) -> &'static str {
        match self {
            Self::Page => "",
            Self::Filtered => "skill=skill_3&tags=tag-7",
        }
    }
    fn grpc(self) -> pb::ListCapabilitiesRequest {
        match self {
            Self::Page => pb::ListCapabilitiesRequest::default(),
            Self::Filtered => pb::ListCapabilitiesRequest {
                skill: Some("skill_3".into()),
                tags: vec!["tag-7".into()],
                ..Default::default()
            },
        }
    }
}

fn agent(i: usize) -> serde_json::Value {
    let cap = |kind: &str, j: usize| {
        json!({
            "id": format!("{kind}_{j}"),
            "description": format!("{kind} number {j} of agent {i}: does something useful with its input"),
            "tags": [format!("tag-{}", i % 50), format!("kind-{j}")],
            "input_schema": {"type": "object", "properties": {"query": {"type": "string"}, "n": {"type": "integer"}}, "required": ["query"]},
        })
    };
    json!({
        "id": format!("agent-{i:05}"),
        "base_url": format!("http://10.0.{}.{}:8080", i / 250, i % 250),
        "version": "1.0.0",
        "tags": ["bench"],
        "reasoners": (0..5).map(|j| cap("reason", j)).collect::<Vec<_>>(),
        "skills": (0..5).map(|j| cap("skill", j)).collect::<Vec<_>>(),
    })
}

/// A gRPC codec that encodes the request and reads the response message as
/// bytes, without decoding it (see `--grpc-decode`).
#[derive(Clone, Copy, Default)]
struct RawResponse;

impl tonic::codec::Codec for RawResponse {
    type Encode = pb::ListCapabilitiesRequest;
    type Decode = bytes::Bytes;
    type Encoder = Self;
    type Decoder = Self;
    fn encoder(&mut self) -> Self {
        *self
    }
    fn decoder(&mut self) -> Self {
        *self
    }
}

impl tonic::codec::Encoder for RawResponse {
    type Item = pb::ListCapabilitiesRequest;
    type Error = tonic::Status;
    fn encode(&mut self, item: Self::Item, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        prost::Message::encode(&item, dst).map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl tonic::codec::Decoder for RawResponse {
    type Item = bytes::Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<bytes::Bytes>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// How gRPC clients connect and read.
#[derive(Clone, Copy)]
struct GrpcOptions {
    /// Shared HTTP/2 connections (0: one per client).
    connections: usize,
    /// Decode each response.
    decode: bool,
    /// HTTP/2 max frame size the client announces, in KiB (0: 16, the default).
    max_frame_kib: u32,
}

fn grpc_endpoint(base: &str, max_frame_kib: u32) -> anyhow::Result<tonic::transport::Endpoint> {
    let mut endpoint = tonic::transport::Channel::from_shared(base.to_owned())?;
    if let Some(ca) = SECURE.get().and_then(|s| s.ca_pem.as_ref()) {
        endpoint = endpoint.tls_config(
            tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca)),
        )?;
    }
    Ok(if max_frame_kib == 0 { endpoint } else { endpoint.max_frame_size(max_frame_kib * 1024) })
}

/// One gRPC ListCapabilities call, decoded or not; the number of
/// capabilities is checked on the first answer of each client.
#[derive(Clone)]
enum GrpcCaller {
    Decoded(DiscoveryServiceClient<tonic::transport::Channel>),
    Raw(tonic::client::Grpc<tonic::transport::Channel>),
}

impl GrpcCaller {
    fn new(channel: tonic::transport::Channel, decode: bool) -> Self {
        if decode {
            Self::Decoded(DiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20))
        } else {
            Self::Raw(tonic::client::Grpc::new(channel).max_decoding_message_size(64 << 20))
        }
    }

    /// The answer's capabilities when decoded; `None` for raw reads.
    async fn call(&mut self, request: pb::ListCapabilitiesRequest) -> Result<Option<usize>, tonic::Status> {
        match self {
            Self::Decoded(client) => {
                let response = client.list_capabilities(authed(request)).await?.into_inner();
                Ok(Some(response.capabilities.len()))
            }
            Self::Raw(grpc) => {
                let bytes = raw_list_capabilities(grpc, request).await?;
                if bytes.is_empty() {
                    return Err(tonic::Status::internal("empty ListCapabilitiesResponse"));
                }
                Ok(None)
            }
        }
    }
}

async fn serve_child(
    database_url: String,
    cache_ttl_secs: f64,
    otlp_endpoint: Option<String>,
    secure_dir: Option<std::path::PathBuf>,
    no_tls: bool,
) -> anyhow::Result<()> {
    let telemetry = agentmesh_telemetry::init(
        "agentmesh-discovery",
        &agentmesh_telemetry::TelemetryConfig {
            otlp_protocol: otlp_endpoint.as_ref().map(|_| "grpc".to_owned()),
            otlp_endpoint,
            sampler: Some("always_on".into()),
            log_filter: Some("warn".into()),
            ..Default::default()
        },
    )?;
    let listener = agentmesh_server::net::listen(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
    println!("PORT {}", listener.local_addr()?.port());
    let mut config = agentmesh_discovery::DiscoveryConfig {
        cache_ttl_secs,
        ..agentmesh_discovery::DiscoveryConfig::with_database_url(database_url)
    };
    if let Some(dir) = secure_dir {
        if !no_tls {
            config.service.tls_cert_file = Some(dir.join("server.pem"));
            config.service.tls_key_file = Some(dir.join("server.key"));
        }
        config.service.auth_tokens_file = Some(dir.join("tokens.toml"));
    }
    let served = agentmesh_discovery::serve_with_listener(config, listener, async {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    })
    .await;
    telemetry.shutdown().await;
    served
}

async fn register_all(base: &str, n: usize) -> anyhow::Result<()> {
    let client = http_client()?.build()?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (client, next, base) = (client.clone(), next.clone(), base.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), anyhow::Error>(());
                }
                let r = client.post(format!("{base}/api/v1/agents")).json(&agent(i)).send().await?;
                anyhow::ensure!(r.status().is_success(), "registration failed: {}", r.status());
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The size of one answer to `query`: REST JSON and the gRPC message.
async fn answer_sizes(base: &str, query: Query) -> anyhow::Result<(usize, usize)> {
    let url = format!("{base}/api/v1/discovery/capabilities?{}", query.rest());
    let json = http_client()?.build()?.get(url).send().await?.error_for_status()?.bytes().await?;
    let mut grpc = tonic::client::Grpc::new(grpc_endpoint(base, 0)?.connect().await?);
    let message = raw_list_capabilities(&mut grpc, query.grpc()).await?;
    Ok((json.len(), message.len()))
}

/// One `ListCapabilities` call whose answer is read as bytes, not decoded.
async fn raw_list_capabilities(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    request: pb::ListCapabilitiesRequest,
) -> Result<bytes::Bytes, tonic::Status> {
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(agentmesh_discovery::encoded::PATH);
    Ok(grpc.unary(authed(request), path, RawResponse).await?.into_inner())
}

/// The measured window: it opens after 0.5 s of warm-up.
fn open_window(length: Duration) -> (Instant, Instant) {
    let start = Instant::now() + Duration::from_millis(500);
    (start, start + length)
}

/// Waits for the next paced slot, if pacing.
/// One client's measured calls: `next` paces them and says when the window
/// has closed; `record` keeps those that started inside it and prints the
/// run's first failure once.
struct Measured<'a> {
    window: (Instant, Instant),
    next: Instant,
    paced: Option<Duration>,
    reported: &'a std::sync::atomic::AtomicBool,
    lat: Latencies,
}

impl<'a> Measured<'a> {
    fn new(
        window: (Instant, Instant),
        offset: Duration,
        paced: Option<Duration>,
        reported: &'a std::sync::atomic::AtomicBool,
    ) -> Self {
        Measured { window, next: Instant::now() + offset, paced, reported, lat: Latencies::default() }
    }

    /// When the next call starts, or `None` once the window has closed.
    async fn next(&mut self) -> Option<Instant> {
        if Instant::now() >= self.window.1 {
            return None;
        }
        pace(self.paced, &mut self.next).await;
        let t0 = Instant::now();
        (t0 < self.window.1).then_some(t0)
    }

    fn record(&mut self, t0: Instant, result: Result<(), String>) {
        if let Err(e) = &result
            && !self.reported.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            eprintln!("first error: {e}");
        }
        if t0 >= self.window.0 {
            if result.is_ok() { self.lat.record(t0.elapsed()) } else { self.lat.errors += 1 }
        }
    }
}

async fn pace(interval: Option<Duration>, next: &mut Instant) {
    if let Some(interval) = interval {
        tokio::time::sleep_until((*next).into()).await;
        *next += interval;
    }
}

async fn run_load(
    base: &str,
    protocol: Protocol,
    query: Query,
    clients: usize,
    seconds: f64,
    paced: Option<Duration>,
    grpc: GrpcOptions,
) -> anyhow::Result<(Latencies, f64)> {
    let GrpcOptions { connections: grpc_connections, decode: grpc_decode, .. } = grpc;
    let mut shared = Vec::new();
    if protocol == Protocol::Grpc {
        for _ in 0..grpc_connections {
            shared.push(grpc_endpoint(base, grpc.max_frame_kib)?.connect().await?);
        }
    }
    // Every client connects (and sends one unmeasured request) first; the
    // measured window opens 0.5 s after the last one is ready, so that no
    // measured request competes with other clients' connection handshakes.
    let ready = Arc::new(tokio::sync::Barrier::new(clients));
    let window = Arc::new(std::sync::OnceLock::new());
    let measure = Duration::from_secs_f64(seconds);
    let mut tasks = Vec::with_capacity(clients);
    let reported = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for client_no in 0..clients {
        let base = base.to_owned();
        // Paced clients start spread evenly over one interval.
        let offset = paced.map_or(Duration::ZERO, |p| p.mul_f64(client_no as f64 / clients.max(1) as f64));
        let reported = reported.clone();
        let (ready, window) = (ready.clone(), window.clone());
        let channel = (!shared.is_empty()).then(|| shared[client_no % shared.len()].clone());
        tasks.push(tokio::spawn(async move {
            let lat = match protocol {
                Protocol::Grpc => {
                    let connected = async {
                        let channel = match channel {
                            Some(channel) => channel,
                            None => grpc_endpoint(&base, grpc.max_frame_kib)?.connect().await?,
                        };
                        // Check the answer once, decoded, before the measured calls.
                        let check = GrpcCaller::new(channel.clone(), true).call(query.grpc()).await?;
                        anyhow::ensure!(check.unwrap_or(0) > 0, "the query returned no capabilities");
                        Ok(GrpcCaller::new(channel, grpc_decode))
                    }
                    .await;
                    ready.wait().await;
                    let mut client = connected?;
                    let window = *window.get_or_init(|| open_window(measure));
                    let mut measured = Measured::new(window, offset, paced, &reported);
                    while let Some(t0) = measured.next().await {
                        let result = client.call(query.grpc()).await;
                        measured.record(t0, result.map(drop).map_err(|e| e.to_string()));
                    }
                    measured.lat
                }
                Protocol::Rest => {
                    let client = http_client()?.pool_max_idle_per_host(1).http1_only().build()?;
                    let url = format!("{base}/api/v1/discovery/capabilities?{}", query.rest());
                    // Connect first (one request outside the measurement), as
                    // the gRPC clients do.
                    if let Ok(r) = client.get(&url).send().await {
                        let _ = r.bytes().await;
                    }
                    ready.wait().await;
                    let window = *window.get_or_init(|| open_window(measure));
                    let mut measured = Measured::new(window, offset, paced, &reported);
                    while let Some(t0) = measured.next().await {
                        let result = match client.get(&url).send().await {
                            Ok(r) if r.status().is_success() => r.bytes().await.map(drop).map_err(|e| e.to_string()),
                            other => Err(format!("{:?}", other.map(|r| r.status()))),
                        };
                        measured.record(t0, result);
                    }
                    measured.lat
                }
            };
            Ok::<Latencies, anyhow::Error>(lat)
        }));
    }
    let mut all = Latencies::default();
    for t in tasks {
        all.merge(t.await??);
    }
    #[allow(clippy::cast_precision_loss)]
    let rps = all.count() as f64 / seconds;
    Ok((all, rps))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Serve { database_url, cache_ttl_secs, otlp_endpoint, secure_dir, no_tls }) = args.command {
        return serve_child(database_url, cache_ttl_secs, otlp_endpoint, secure_dir, no_tls).await;
    }
    agentmesh_testkit::install_tls();
    // A secure run's CA, server certificate and tokens file, kept while it runs.
    let pki = if args.secure {
        let pki = agentmesh_testkit::TestPki::new("bench")?;
        // Written as server.pem and server.key, where the child reads them.
        pki.issue("server")?;
        let token = format!("bench-{:016x}", rand::random::<u64>());
        agentmesh_testkit::write_tokens_file(&pki.dir().join("tokens.toml"), &[("bench", "operator", &token)])?;
        let _ = SECURE.set(Secure { ca_pem: (!args.no_tls).then(|| pki.ca_pem.clone()), token });
        Some(pki)
    } else {
        None
    };
    let receiver = if args.traces.iter().any(|t| t == "on") {
        Some(agentmesh_testkit::OtlpReceiver::start_counting().await?)
    } else {
        None
    };
    let exe = std::env::current_exe()?;
    let mut rows = Vec::new();
    let mut memory = Vec::new();
    let runs: Vec<(usize, &str)> =
        args.agents.iter().flat_map(|&n| args.traces.iter().map(move |t| (n, t.as_str()))).collect();
    for (n, traces) in runs {
        anyhow::ensure!(matches!(traces, "on" | "off"), "--traces takes `off` and `on`, got `{traces}`");
        let db_path = std::env::temp_dir().join(format!("agentmesh-bench-{}-{n}-{traces}.db", std::process::id()));
        let database_url = args.database_url.clone().unwrap_or_else(|| format!("sqlite://{}", db_path.display()));
        let mut command = tokio::process::Command::new(&exe);
        command.args(["serve", "--database-url", &database_url, "--cache-ttl-secs", &args.cache_ttl_secs.to_string()]);
        if let (Some(receiver), "on") = (&receiver, traces) {
            command.args(["--otlp-endpoint", &receiver.endpoint()]);
        }
        if let Some(pki) = &pki {
            command.arg("--secure-dir").arg(pki.dir());
            if args.no_tls {
                command.arg("--no-tls");
            }
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the discovery child")?;
        let pid = child.id().context("child pid")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).await?;
        let port: u16 = line.trim().strip_prefix("PORT ").context("child did not print its port")?.parse()?;
        let base = if pki.is_some() && !args.no_tls {
            format!("https://localhost:{port}")
        } else {
            format!("http://127.0.0.1:{port}")
        };
        let loaded = Instant::now();
        register_all(&base, n).await?;
        eprintln!("registered {n} agents in {:.1}s", loaded.elapsed().as_secs_f64());
        // Let the server finish processing the registrations' notifications:
        // the table measures the steady state.
        tokio::time::sleep(Duration::from_secs(3)).await;
        http_client()?
            .build()?
            .get(format!("{base}/api/v1/discovery/capabilities"))
            .send()
            .await?
            .error_for_status()?;
        let (rss_loaded, _) = rss_mib(pid).unwrap_or((f64::NAN, f64::NAN));
        let metrics = http_client()?.build()?.get(format!("{base}/metrics")).send().await?.text().await?;
        let snapshot_mib = metrics
            .lines()
            .find_map(|l| l.strip_prefix("agentmesh_discovery_cache_size_bytes "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(f64::NAN, |b| b / 1_048_576.0);
        for (name, query) in [("default page", Query::Page), ("filtered", Query::Filtered)] {
            let (json, protobuf) = answer_sizes(&base, query).await?;
            eprintln!("{name} answer at {n} agents: {json} bytes of JSON, {protobuf} bytes of protobuf");
        }
        let apis = [("grpc", Protocol::Grpc), ("rest", Protocol::Rest)];
        for (_, protocol) in apis.into_iter().filter(|(name, _)| args.apis.iter().any(|a| a == name)) {
            let paced = (args.paced_interval_ms > 0).then(|| Duration::from_millis(args.paced_interval_ms));
            let modes: Vec<(usize, Option<Duration>)> = args
                .clients
                .iter()
                .flat_map(|&c| [(c, None), (c, paced)])
                // Pace only the largest client counts, where queueing hides service time.
                .filter(|(c, p)| match p {
                    None => true,
                    Some(_) => *c >= 1000,
                })
                .collect::<Vec<_>>()
                .into_iter()
                .enumerate()
                .filter(|(i, (_, p))| p.is_some() || paced.is_some() || i % 2 == 0)
                .map(|(_, mode)| mode)
                .collect();
            for (clients, pacing) in modes {
                let queries = [("page", Query::Page), ("filtered", Query::Filtered)];
                for (_, query) in queries.into_iter().filter(|(name, _)| args.queries.iter().any(|q| q == name)) {
                    let cpu_before = cpu_seconds(pid);
                    let (mut lat, rps) = run_load(
                        &base,
                        protocol,
                        query,
                        clients,
                        args.seconds,
                        pacing,
                        GrpcOptions {
                            connections: args.grpc_connections,
                            decode: args.grpc_decode,
                            max_frame_kib: args.grpc_max_frame_kib,
                        },
                    )
                    .await?;
                    // The server's own CPU per answer: what TLS costs it, whoever
                    // else shares the machine (the load generator does here).
                    let server_us = match (cpu_before, cpu_seconds(pid)) {
                        (Some(before), Some(after)) if lat.count() > 0 => {
                            format!("{:.0}", (after - before) * 1e6 / lat.count() as f64)
                        }
                        _ => "n/a".into(),
                    };
                    let load = match pacing {
                        None => format!("{clients} closed-loop"),
                        Some(p) => format!("{clients} paced, 1 per {} ms", p.as_millis()),
                    };
                    let row = vec![
                        n.to_string(),
                        if traces == "on" { "exported, 100 %".into() } else { "off".into() },
                        match protocol {
                            Protocol::Grpc if args.grpc_decode => "gRPC (decoded)".into(),
                            Protocol::Grpc => "gRPC".into(),
                            Protocol::Rest => "REST".into(),
                        },
                        query.name().into(),
                        load,
                        format!("{rps:.0}"),
                        server_us,
                        format!("{:.2}", lat.percentile_ms(50.0)),
                        format!("{:.2}", lat.percentile_ms(95.0)),
                        format!("{:.2}", lat.percentile_ms(99.0)),
                        format!("{:.2}", lat.percentile_ms(100.0)),
                        lat.errors.to_string(),
                    ];
                    eprintln!("{}", row.join(" | "));
                    rows.push(row);
                }
            }
        }
        let (rss_end, rss_peak) = rss_mib(pid).unwrap_or((f64::NAN, f64::NAN));
        memory.push(vec![
            n.to_string(),
            traces.to_owned(),
            format!("{snapshot_mib:.1}"),
            format!("{rss_loaded:.1}"),
            format!("{rss_end:.1}"),
            format!("{rss_peak:.1}"),
        ]);
        drop(child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        let _ = child.kill().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", db_path.display()));
        }
    }
    println!();
    print_table(
        &[
            "agents",
            "traces",
            "api",
            "query",
            "clients",
            "req/s",
            "server CPU µs/req",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "errors",
        ],
        &rows,
    );
    println!();
    println!("closed-loop: each client sends its next request as soon as the last one answers.");
    if let Some(receiver) = &receiver {
        println!("spans received by the OTLP receiver: {}", receiver.span_count());
    }
    println!();
    print_table(
        &[
            "agents",
            "traces",
            "snapshot estimate (MiB)",
            "server RSS after load (MiB)",
            "RSS after benchmark (MiB)",
            "peak RSS (MiB)",
        ],
        &memory,
    );
    Ok(())
}
