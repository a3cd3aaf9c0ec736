//! The console in a real browser: headless Chromium from Debian's packages,
//! driven over WebDriver (chromedriver), against `agentmesh demo --serve`.
//! A question asked on the Ask page runs to its answer with the DAG
//! reaching `succeeded`; a failing step shows as failed and its dependant
//! as skipped; an output holding HTML shows as text; an agent that stops
//! heartbeating shows as inactive. Screenshots of every page are written
//! to `$CARGO_TARGET_TMPDIR/console-screenshots/`.
//!
//! Needs `chromium` and `chromedriver` (Debian: `chromium chromium-driver`;
//! `.ci/run` installs them). Under `CI=true` a missing one is a failure;
//! elsewhere the test says it was skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Answer, Behavior, FakeAgent};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

/// Kills a child process when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn find(name: &str, variable: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(variable) {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

fn start_chromedriver(chromedriver: &Path) -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Child(
        Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (child, format!("http://127.0.0.1:{port}"))
}

async fn browser(webdriver: &str, chromium: &Path) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--no-first-run"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match ClientBuilder::new(connector.clone()).capabilities(capabilities.clone()).connect(webdriver).await {
            Ok(client) => return client,
            Err(_) if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("cannot start a browser session with chromedriver at {webdriver}: {e}"),
        }
    }
}

/// Waits until `css` finds an element (the page renders asynchronously).
async fn wait_for(client: &Client, css: &str, within: Duration) -> fantoccini::elements::Element {
    let found = client.wait().at_most(within).every(Duration::from_millis(100)).for_element(Locator::Css(css)).await;
    match found {
        Ok(element) => element,
        Err(e) => {
            let source = client.source().await.unwrap_or_default();
            panic!("no `{css}` within {within:?}: {e}\n{source}");
        }
    }
}

async fn screenshot(client: &Client, dir: &Path, name: &str) {
    let png = client.screenshot().await.unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser_shows_what_the_mesh_does() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let (Some(chromium), Some(chromedriver)) = (
        find("chromium", "AGENTMESH_CHROMIUM").or_else(|| find("chromium-browser", "AGENTMESH_CHROMIUM")),
        find("chromedriver", "AGENTMESH_CHROMEDRIVER"),
    ) else {
        assert!(!ci, "chromium and chromedriver are needed under CI=true (apt-get install chromium chromium-driver)");
        eprintln!("skipped: no chromium or chromedriver (apt-get install chromium chromium-driver)");
        return;
    };
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let dir = std::env::temp_dir().join(format!("agentmesh-console-browser-{}", std::process::id()));
    // Heartbeats every second, so that an agent that stops is inactive after 6 s.
    let demo = common::serve_demo(&dir, &[("AGENTMESH_DISCOVERY__HEARTBEAT_INTERVAL_SECS", "1")]);
    let addresses = &demo.addresses;
    let gateway = addresses["gateway"].clone();
    let discovery = addresses["discovery"].clone();
    let (_driver, webdriver) = start_chromedriver(&chromedriver);
    let client = browser(&webdriver, &chromium).await;

    // Ask: the plan drawn, its step reaching succeeded, the answer streamed in.
    client.goto(&format!("{gateway}/")).await.unwrap();
    let query = wait_for(&client, "#query", Duration::from_secs(10)).await;
    query.send_keys("What is the weather in Chicago?").await.unwrap();
    client.find(Locator::Css("#send")).await.unwrap().click().await.unwrap();
    wait_for(&client, "#answer[data-done='true']", Duration::from_secs(60)).await;
    wait_for(&client, "#dag g.node[data-step='s1'][data-state='succeeded']", Duration::from_secs(5)).await;
    let answer = client.find(Locator::Css("#answer")).await.unwrap().text().await.unwrap();
    assert!(answer.contains("Chicago"), "{answer}");
    let status = client.find(Locator::Css("#status")).await.unwrap().text().await.unwrap();
    assert_eq!(status.trim(), "completed");
    let execution_link = wait_for(&client, "#execution-link", Duration::from_secs(5)).await;
    assert!(execution_link.text().await.unwrap().starts_with("exe_"));
    screenshot(&client, &shots, "ask").await;

    // The recovery story: the review finds the stock price missing, a recovery
    // round adds its step (retried once) in place, and the answer is written again.
    let query = client.find(Locator::Css("#query")).await.unwrap();
    query.clear().await.unwrap();
    query.send_keys("What is the weather in London and the AAPL stock price?").await.unwrap();
    client.find(Locator::Css("#send")).await.unwrap().click().await.unwrap();
    wait_for(&client, "#answer[data-done='true'][data-round='1']", Duration::from_secs(60)).await;
    wait_for(&client, "#dag g.node[data-step='s1'][data-state='succeeded']", Duration::from_secs(5)).await;
    wait_for(&client, "#dag g.node[data-step='s2'][data-state='succeeded']", Duration::from_secs(5)).await;
    let answer = client.find(Locator::Css("#answer")).await.unwrap().text().await.unwrap();
    assert!(answer.contains("AAPL") && answer.contains("London"), "{answer}");
    let review = client.find(Locator::Css("#review")).await.unwrap().text().await.unwrap();
    assert!(review.contains("Both the London weather and the AAPL price are answered"), "{review}");
    assert!(
        review.contains("the AAPL stock price is missing") && review.contains("add_step"),
        "the first review stays: {review}"
    );
    assert!(review.contains("Review after recovery round 1"), "{review}");
    screenshot(&client, &shots, "ask-recovery").await;
    let link = client.find(Locator::Css("#execution-link")).await.unwrap().attr("href").await.unwrap().unwrap();
    client.goto(&format!("{gateway}{link}")).await.unwrap();
    wait_for(&client, "#timeline li", Duration::from_secs(10)).await;
    wait_for(&client, "#steps tr[data-step='s2']", Duration::from_secs(5)).await;
    let retried = client.find(Locator::Css("#steps tr[data-step='s2']")).await.unwrap().text().await.unwrap();
    assert!(
        retried.contains("succeeded") && !retried.contains("timed out"),
        "a retry's error goes once it succeeds: {retried}"
    );
    assert_eq!(client.find_all(Locator::Css("#dag g.node")).await.unwrap().len(), 2, "each step drawn once");

    // A plan run directly: an output holding HTML, a failing step, its dependant.
    let agent = FakeAgent::start(vec![
        ("render", Behavior::Always(Answer::ok(json!({"html": "<script>alert(1)</script><b>bold</b>"})))),
        ("broken", Behavior::Always(Answer::status(400, json!({"error": "no such city"})))),
        ("after", Behavior::Always(Answer::ok(json!({"ok": true})))),
    ])
    .await
    .unwrap();
    let registration = agent.registration("browser-test-agent", &[("render", None), ("broken", None), ("after", None)]);
    let http = agentmesh_testkit::http_client();
    let registered = http.post(format!("{discovery}/api/v1/agents")).json(&registration).send().await.unwrap();
    assert!(registered.status().is_success());
    let plan: agentmesh_core::plan::Plan = serde_json::from_value(json!({"reasoning": "a browser test", "steps": [
        {"step_id": "s1", "agent": "browser-test-agent", "capability": "render", "parameters": {}},
        {"step_id": "s2", "agent": "browser-test-agent", "capability": "broken", "parameters": {}},
        {"step_id": "s3", "agent": "browser-test-agent", "capability": "after", "parameters": {}, "depends_on": ["s2"]},
    ]}))
    .unwrap();
    let mut executor =
        pb::executor_service_client::ExecutorServiceClient::connect(addresses["executor"].clone()).await.unwrap();
    let request = pb::ExecuteRequest {
        request_id: "req_browser_failures".into(),
        plan: Some(agentmesh_proto::convert::plan_to_pb(&plan)),
        options: Some(pb::ExecutionOptions { max_retries: Some(0), ..Default::default() }),
        ..Default::default()
    };
    let mut stream = executor.execute(request).await.unwrap().into_inner();
    let mut execution_id = String::new();
    while let Some(Ok(message)) = tokio_stream::StreamExt::next(&mut stream).await {
        if let Some(event) = message.event {
            execution_id = event.execution_id;
        }
    }
    client.goto(&format!("{gateway}/executions/{execution_id}")).await.unwrap();
    wait_for(&client, "#dag g.node[data-step='s2'][data-state='failed']", Duration::from_secs(10)).await;
    wait_for(&client, "#dag g.node[data-step='s3'][data-state='skipped']", Duration::from_secs(5)).await;
    wait_for(&client, "#execution-status .state[data-state='failed']", Duration::from_secs(5)).await;
    let output = client.find(Locator::Css("#steps tr[data-step='s1']")).await.unwrap().text().await.unwrap();
    assert!(output.contains("<script>alert(1)</script><b>bold</b>"), "the output shows as text: {output}");
    assert!(client.find_all(Locator::Css("#steps b, #steps script")).await.unwrap().is_empty(), "no markup was made");
    let failed = client.find(Locator::Css("#steps tr[data-step='s2']")).await.unwrap().text().await.unwrap();
    assert!(failed.contains("no such city"), "{failed}");
    screenshot(&client, &shots, "execution").await;

    // The executions list, newest first.
    client.goto(&format!("{gateway}/executions")).await.unwrap();
    wait_for(&client, &format!("#executions tr[data-execution='{execution_id}']"), Duration::from_secs(10)).await;
    screenshot(&client, &shots, "executions").await;

    // An agent that never heartbeats goes inactive; the page follows.
    let ghost = json!({"id": "ghost-agent", "base_url": "http://127.0.0.1:9", "skills": [{"id": "boo", "description": "never answers"}]});
    assert!(http.post(format!("{discovery}/api/v1/agents")).json(&ghost).send().await.unwrap().status().is_success());
    client.goto(&format!("{gateway}/agents")).await.unwrap();
    wait_for(
        &client,
        "[data-agent='weather-tool-v2'] .agent-health .state[data-state='active']",
        Duration::from_secs(10),
    )
    .await;
    wait_for(
        &client,
        "[data-agent='ghost-agent'] .agent-health .state[data-state='inactive']",
        Duration::from_secs(30),
    )
    .await;
    screenshot(&client, &shots, "agents").await;

    // The LLM calls of the request asked on the Ask page.
    let requests = http.get(format!("{gateway}/console/api/executions")).send().await.unwrap();
    let listed: serde_json::Value = requests.json().await.unwrap();
    let asked = listed["executions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["request_id"] != "req_browser_failures")
        .map(|e| e["request_id"].as_str().unwrap().to_owned())
        .unwrap();
    client.goto(&format!("{gateway}/requests/{asked}")).await.unwrap();
    wait_for(&client, "section[data-kind='plan']", Duration::from_secs(10)).await;
    screenshot(&client, &shots, "request").await;

    client.close().await.unwrap();
    eprintln!("screenshots in {}", shots.display());
    let _ = std::fs::remove_dir_all(&dir);
}
