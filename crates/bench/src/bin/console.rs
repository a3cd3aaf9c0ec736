//! Console benchmark: how fast its heaviest pages become usable in a real
//! browser (headless Chromium over WebDriver, as the console's tests run
//! it). Discovery, the executor and the gateway run in this process on
//! SQLite, with a no-op HTTP agent; the benchmark first runs `--executions`
//! one-step executions and one plan of `--steps` steps (layers of 100, each
//! step after one of the layer before), then loads, `--repeat` times each:
//!
//! - `/executions`: first contentful paint, the first page of 50 rows, and
//!   every row (pressing **More** until the list ends);
//! - `/executions/{the big one}`: first contentful paint, and the DAG fully
//!   drawn (every step's box in the SVG, one animation frame later).
//!
//! Times are the page's own clock (`performance.now()`, from the start of
//! navigation), read in the page, so WebDriver's round trips do not count.
//!
//! `cargo run --release -p agentmesh-bench --bin console-bench`
//! (needs `chromium` and `chromedriver`, e.g. Debian's `chromium chromium-driver`).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Duration, Instant};

use agentmesh_bench::{print_table, spawn};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_testkit::{Answer, Behavior, FakeAgent};
use anyhow::Context;
use clap::Parser;
use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    /// One-step executions listed on the executions page.
    #[arg(long, default_value_t = 1000)]
    executions: usize,
    /// Steps of the plan drawn on the execution page.
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Page loads measured per page.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// The browser.
    #[arg(long, default_value = "chromium")]
    chromium: String,
    /// The WebDriver server.
    #[arg(long, default_value = "chromedriver")]
    chromedriver: String,
}

fn plan(steps: usize) -> pb::Plan {
    let steps: Vec<Value> = (0..steps)
        .map(|i| {
            let depends_on = if i < 100 { vec![] } else { vec![format!("s{}", i - 100 + (i * 7) % 3)] };
            json!({"step_id": format!("s{i}"), "agent": "noop", "capability": "work", "parameters": {"i": i},
                "depends_on": depends_on})
        })
        .collect();
    let plan: agentmesh_core::plan::Plan =
        serde_json::from_value(json!({"reasoning": "a benchmark", "steps": steps})).unwrap_or_default();
    agentmesh_proto::convert::plan_to_pb(&plan)
}

async fn execute(
    executor: &mut ExecutorServiceClient<tonic::transport::Channel>,
    plan: pb::Plan,
) -> anyhow::Result<String> {
    let request = pb::ExecuteRequest {
        request_id: format!("req_bench_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff),
        plan: Some(plan),
        options: Some(pb::ExecutionOptions { max_concurrency: 64, ..Default::default() }),
        ..Default::default()
    };
    let mut stream = executor.execute(request).await?.into_inner();
    let mut id = String::new();
    while let Some(message) = tokio_stream::StreamExt::next(&mut stream).await {
        if let Some(event) = message?.event {
            id = event.execution_id;
        }
    }
    Ok(id)
}

/// Milliseconds from the start of navigation until `selector` finds
/// `count` elements, one animation frame later.
const WAIT_FOR: &str = r#"
const [selector, count, done] = arguments;
const check = () => {
  if (document.querySelectorAll(selector).length >= count) requestAnimationFrame(() => done(performance.now()));
  else setTimeout(check, 2);
};
check();
"#;

/// Presses More until the list stops growing; milliseconds it took.
const LOAD_ALL: &str = r#"
const [done] = arguments;
const start = performance.now();
const rows = () => document.querySelectorAll('#executions tr[data-execution]').length;
const step = (before) => {
  const more = [...document.querySelectorAll('button')].find((b) => b.textContent === 'More' && !b.hidden);
  if (!more) { requestAnimationFrame(() => done([performance.now() - start, rows()])); return; }
  more.click();
  const wait = () => (rows() > before ? step(rows()) : setTimeout(wait, 2));
  wait();
};
step(rows());
"#;

const FCP: &str = r#"
const [done] = arguments;
const read = () => {
  const paint = performance.getEntriesByName('first-contentful-paint')[0];
  if (paint) done(paint.startTime); else setTimeout(read, 5);
};
read();
"#;

/// A program named without a directory, found in `PATH` (the browser's
/// binary must be given to chromedriver as a path).
fn in_path(program: &str) -> String {
    if program.contains('/') {
        return program.to_owned();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .map_or_else(|| program.to_owned(), |path| path.display().to_string())
}

async fn script(client: &Client, code: &str, args: Vec<Value>) -> anyhow::Result<Value> {
    Ok(client.execute_async(code, args).await?)
}

fn summary(values: &mut [f64]) -> (String, String) {
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(f64::NAN);
    let max = values.last().copied().unwrap_or(f64::NAN);
    (format!("{median:.0}"), format!("{max:.0}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("agentmesh-console-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = |name: &str| format!("sqlite://{}", dir.join(format!("{name}.db")).display());
    let pending = std::future::pending::<()>;
    let discovery_config = agentmesh_discovery::DiscoveryConfig::with_database_url(db("discovery"));
    let discovery = spawn(|l| agentmesh_discovery::serve_with_listener(discovery_config, l, pending())).await?;
    let agent = FakeAgent::start(vec![("work", Behavior::Always(Answer::ok(json!({"done": true}))))]).await?;
    agentmesh_llm::client_builder()
        .build()?
        .post(format!("http://{discovery}/api/v1/agents"))
        .json(&agent.registration("noop", &[("work", None)]))
        .send()
        .await?
        .error_for_status()?;
    let executor_config = agentmesh_executor::ExecutorConfig {
        discovery_url: format!("http://{discovery}"),
        ..agentmesh_executor::ExecutorConfig::with_database_url(db("executor"))
    };
    let executor = spawn(|l| agentmesh_executor::serve_with_listener(executor_config, l, pending())).await?;
    let gateway_config = agentmesh_gateway::GatewayConfig {
        executor_url: format!("http://{executor}"),
        discovery_url: format!("http://{discovery}"),
        ..agentmesh_gateway::GatewayConfig::with_database_url(db("gateway"))
    };
    let gateway = spawn(|l| agentmesh_gateway::serve_with_listener(gateway_config, l, pending())).await?;

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{executor}"))?.connect().await?;
    let client = ExecutorServiceClient::new(channel);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let mut client = client.clone();
        let n = args.executions / 8 + usize::from(worker < args.executions % 8);
        tasks.spawn(async move {
            for _ in 0..n {
                execute(&mut client, plan(1)).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let big = execute(&mut client.clone(), plan(args.steps)).await?;
    eprintln!(
        "ran {} executions and one of {} steps in {:.1}s",
        args.executions,
        args.steps,
        started.elapsed().as_secs_f64()
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut driver = tokio::process::Command::new(&args.chromedriver)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", args.chromedriver))?;
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({"binary": in_path(&args.chromium), "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", "--window-size=1280,900"]}),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let browser = loop {
        match ClientBuilder::new(connector.clone())
            .capabilities(capabilities.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(client) => break client,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => anyhow::bail!("no browser session: {e}"),
        }
    };
    browser
        .update_timeouts(fantoccini::wd::TimeoutConfiguration::new(Some(Duration::from_secs(300)), None, None))
        .await?;

    let base = format!("http://{gateway}");
    let (mut list_fcp, mut list_first, mut list_all, mut rows_loaded) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let (mut dag_fcp, mut dag_drawn) = (Vec::new(), Vec::new());
    for _ in 0..args.repeat {
        browser.goto(&format!("{base}/executions")).await?;
        list_fcp.push(script(&browser, FCP, vec![]).await?.as_f64().unwrap_or(f64::NAN));
        list_first.push(
            script(&browser, WAIT_FOR, vec![json!("#executions tr[data-execution]"), json!(50)])
                .await?
                .as_f64()
                .unwrap_or(f64::NAN),
        );
        let all = script(&browser, LOAD_ALL, vec![]).await?;
        list_all.push(all[0].as_f64().unwrap_or(f64::NAN));
        rows_loaded = all[1].as_u64().unwrap_or(0);

        browser.goto(&format!("{base}/executions/{big}")).await?;
        dag_fcp.push(script(&browser, FCP, vec![]).await?.as_f64().unwrap_or(f64::NAN));
        dag_drawn.push(
            script(&browser, WAIT_FOR, vec![json!("#dag g.node"), json!(args.steps)])
                .await?
                .as_f64()
                .unwrap_or(f64::NAN),
        );
    }
    browser.close().await?;
    let _ = driver.kill().await;

    let row = |page: String, what: &str, values: &mut Vec<f64>| {
        let (median, max) = summary(values);
        vec![page, what.to_owned(), median, max]
    };
    let list = format!("/executions ({} executions)", args.executions + 1);
    let one = format!("/executions/{{id}} ({} steps)", args.steps);
    let rows = vec![
        row(list.clone(), "first contentful paint", &mut list_fcp),
        row(list.clone(), "first 50 rows drawn (from navigation)", &mut list_first),
        row(list, &format!("every row ({rows_loaded}) loaded with More (from the first page)"), &mut list_all),
        row(one.clone(), "first contentful paint", &mut dag_fcp),
        row(one, "DAG fully drawn (from navigation)", &mut dag_drawn),
    ];
    println!();
    print_table(&["page", "measure", &format!("median ms ({} loads)", args.repeat), "max ms"], &rows);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
