//! `agentmesh demo`: the whole mesh in this process on a SQLite file in a
//! temporary directory, the demo agents (`examples/agents`), and a scripted
//! model (the `replay` provider with `examples/replay/demo.json`). Each
//! story is one request through the gateway, shown as it happens and
//! judged by what really happened: the plan, the events, the answer and
//! the review.

use std::path::PathBuf;
use std::time::Duration;

use agentmesh_proto::v1 as pb;
use clap::Args;
use pb::ExecutionEventKind as K;

use crate::ask::{Transcript, follow};
use crate::config::Config;

/// The scripted model's answers.
const SCRIPT: &str = include_str!("../../../examples/replay/demo.json");

/// `agentmesh demo` flags.
#[derive(Args, Debug)]
#[command(after_help = "Exit status: 0 when every story ran ends as it should, 1 otherwise.")]
pub struct DemoArgs {
    /// Run only this story: weather, time, tsla, tokyo, review or recovery.
    #[arg(long)]
    story: Option<String>,
    /// Keep the mesh and the agents running (on the usual ports: discovery
    /// 7400 … gateway 7404) for other clients until Ctrl-C, after the
    /// story given with --story (none by default).
    #[arg(long)]
    serve: bool,
    /// Keep the demo's database here instead of a temporary directory
    /// removed at exit.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

impl DemoArgs {
    /// The demo's own defaults, below the file and the environment: quiet
    /// logs (the demo prints what happens).
    pub fn defaults() -> Vec<crate::config::Override> {
        vec![("telemetry.log_filter".into(), figment::value::Value::from("error"))]
    }
}

/// One story: a request and what must be true when it has run.
struct Story {
    name: &'static str,
    title: &'static str,
    query: &'static str,
    callers: &'static [&'static str],
    /// What should happen, told before it runs.
    expect: &'static str,
    check: fn(&Transcript, &[pb::LlmInteraction]) -> Result<String, String>,
}

fn kind(e: &pb::ExecutionEvent) -> K {
    K::try_from(e.kind).unwrap_or_default()
}

/// The agents of the steps of every plan.
fn planned_agents(t: &Transcript) -> Vec<String> {
    let mut agents: Vec<String> = t
        .plans
        .iter()
        .flat_map(|(_, p)| p.plan.iter().flat_map(|plan| plan.steps.iter().map(|s| s.agent.clone())))
        .collect();
    agents.extend(t.events.iter().flat_map(|(_, e)| e.added_steps.iter().map(|s| s.agent.clone())));
    agents
}

fn succeeded_on(t: &Transcript, agent: &str) -> Option<pb::ExecutionEvent> {
    t.events.iter().map(|(_, e)| e).find(|e| kind(e) == K::StepSucceeded && e.agent_id == agent).cloned()
}

fn goal(t: &Transcript) -> Result<(), String> {
    match &t.finished {
        Some(f) if f.goal_achieved => Ok(()),
        Some(_) => Err("the review judged the goal not achieved".into()),
        None => Err("no final answer".into()),
    }
}

fn hallucinations(t: &Transcript) -> u32 {
    t.plans.iter().filter_map(|(_, p)| p.stats.as_ref()).map(|s| s.hallucinations_detected).sum()
}

fn check_weather(t: &Transcript, _: &[pb::LlmInteraction]) -> Result<String, String> {
    goal(t)?;
    let step = succeeded_on(t, "weather-tool-v2").ok_or("the weather step did not succeed")?;
    if !t.answer.contains("18") {
        return Err(format!("the answer does not give the 18 °C the step returned: {}", t.answer));
    }
    Ok(format!("one step on weather-tool-v2 in {} ms, the answer quotes its 18 °C, goal achieved", step.duration_ms))
}

fn check_time(t: &Transcript, calls: &[pb::LlmInteraction]) -> Result<String, String> {
    if hallucinations(t) == 0 || !calls.iter().any(|c| c.response.contains("time-tool-v1")) {
        return Err("the model's invented time-tool-v1 was not caught".into());
    }
    if planned_agents(t).iter().any(|a| a == "time-tool-v1") {
        return Err("a plan kept the invented time-tool-v1".into());
    }
    if !t.events.is_empty() {
        return Err("something ran, though nothing can tell the time".into());
    }
    let finished = t.finished.as_ref().ok_or("no final answer")?;
    if !finished.text.contains("tells the time") {
        return Err(format!("the answer does not say that no tool tells the time: {}", finished.text));
    }
    if finished.goal_achieved {
        return Err("the review claims the goal achieved".into());
    }
    Ok("time-tool-v1 was invented, caught and never run; the answer says no available tool tells the time".into())
}

fn check_tsla(t: &Transcript, _: &[pb::LlmInteraction]) -> Result<String, String> {
    goal(t)?;
    if hallucinations(t) == 0 || planned_agents(t).iter().any(|a| a == "calculation-agent") {
        return Err("calculation-agent was not caught and replaced".into());
    }
    let calc = succeeded_on(t, "calculator").ok_or("the calculator did not run")?;
    let result = calc
        .output
        .as_ref()
        .map(agentmesh_proto::json::from_value)
        .and_then(|o| o["result"].as_f64())
        .ok_or("the calculator gave no result")?;
    if (result - 450_000.0).abs() > 1e-6 {
        return Err(format!("100 × 250 × 18 should be 450000, the calculator said {result}"));
    }
    // Both lookups start before either finishes: they run in parallel.
    let events: Vec<&pb::ExecutionEvent> = t.events.iter().map(|(_, e)| e).collect();
    let lookups = ["stock-quotes", "weather-tool-v2"];
    let started = |agent: &str| events.iter().position(|e| kind(e) == K::StepStarted && e.agent_id == agent);
    let first_end = events.iter().position(|e| {
        matches!(kind(e), K::StepSucceeded | K::StepFailed | K::StepRetrying) && lookups.contains(&e.agent_id.as_str())
    });
    match (started(lookups[0]), started(lookups[1]), first_end) {
        (Some(a), Some(b), Some(end)) if a < end && b < end => {}
        _ => return Err("the two lookups did not run in parallel".into()),
    }
    let retried = events.iter().any(|e| kind(e) == K::StepRetrying);
    Ok(format!(
        "calculation-agent caught, the calculator used; the lookups ran in parallel{}; 100 × 250 × 18 = {result}",
        if retried { " (the quote retried after a timeout)" } else { "" }
    ))
}

fn check_tokyo(t: &Transcript, calls: &[pb::LlmInteraction]) -> Result<String, String> {
    goal(t)?;
    if calls.is_empty() {
        return Err("the planner's calls were not recorded".into());
    }
    if calls.iter().any(|c| c.prompt.contains("travel-orchestrator") || c.prompt.contains("orchestrate_request")) {
        return Err("the planner offered the orchestrator to the model".into());
    }
    if planned_agents(t).iter().any(|a| a == "travel-orchestrator") {
        return Err("the orchestrator was planned to call itself".into());
    }
    succeeded_on(t, "weather-tool-v2").ok_or("the weather step did not succeed")?;
    Ok(format!(
        "travel-orchestrator asked; none of the {} recorded model prompts offered it or its orchestrate_request",
        calls.len()
    ))
}

fn check_review(t: &Transcript, _: &[pb::LlmInteraction]) -> Result<String, String> {
    goal(t)?;
    let extended = t.events.iter().any(|(_, e)| kind(&e.clone()) == K::PlanExtended);
    succeeded_on(t, "code-reviewer").ok_or("the review step did not succeed")?;
    succeeded_on(t, "fixer").ok_or("the fixer did not run")?;
    if !extended {
        return Err("the plan was not extended by the reviewer's collaboration request".into());
    }
    Ok("code-reviewer found a SQL injection and asked for the fixer; the plan grew a fixer step that ran".into())
}

fn check_recovery(t: &Transcript, _: &[pb::LlmInteraction]) -> Result<String, String> {
    goal(t)?;
    let first = t.reviews.first().ok_or("no review")?;
    if first.1.goal_achieved || first.1.missing_data.is_empty() {
        return Err("the first review did not find the missing stock price".into());
    }
    let recovered =
        t.events.iter().any(|(round, e)| *round > 0 && kind(e) == K::StepSucceeded && e.agent_id == "stock-quotes");
    if !recovered {
        return Err("no recovery round looked the price up".into());
    }
    Ok(format!(
        "the review found \"{}\" missing; a recovery round looked it up; the second review: goal achieved",
        first.1.missing_data.join(", ")
    ))
}

const STORIES: [Story; 6] = [
    Story {
        name: "weather",
        title: "the weather in Chicago",
        query: "What is the weather in Chicago?",
        callers: &[],
        expect: "one step, an answer quoting the step's numbers, a review",
        check: check_weather,
    },
    Story {
        name: "time",
        title: "a tool that does not exist",
        query: "What time is it in CST?",
        callers: &[],
        expect: "the model invents time-tool-v1; the planner refuses it and asks again; nothing fits, so nothing runs, and the answer says why",
        check: check_time,
    },
    Story {
        name: "tsla",
        title: "an invented calculator, two lookups in parallel",
        query: "What is 100 times the TSLA stock price times the temperature in Chicago?",
        callers: &[],
        expect: "the model invents calculation-agent; the planner catches it and the retry finds the calculator; the stock and weather lookups run at once (the quote feed times out once and is retried), then the calculator",
        check: check_tsla,
    },
    Story {
        name: "tokyo",
        title: "an orchestrator that is never offered itself",
        query: "I am planning a trip to Tokyo next week: what is the weather there?",
        callers: &["travel-orchestrator"],
        expect: "asked by travel-orchestrator, whose own orchestrate_request is registered as internal: the planner offers neither it nor the caller",
        check: check_tokyo,
    },
    Story {
        name: "review",
        title: "a code review that loops back to the fixer",
        query: "Review auth.py for security bugs",
        callers: &[],
        expect: "code-reviewer finds a SQL injection and asks for the fixer; the executor loops back through the planner and runs it",
        check: check_review,
    },
    Story {
        name: "recovery",
        title: "a review that finds missing data",
        query: "What is the weather in London and the AAPL stock price?",
        callers: &[],
        expect: "the plan forgets the stock price; the review says it is missing and proposes a step; a recovery round runs it and the second review is satisfied",
        check: check_recovery,
    },
];

/// Names of the stories, for errors.
fn story_names() -> String {
    STORIES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

/// A temporary directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the demo; fails unless every story ran ends as it should.
pub async fn run(
    args: DemoArgs,
    mut config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let stories: Vec<&Story> = match &args.story {
        Some(name) => vec![
            STORIES
                .iter()
                .find(|s| s.name == name)
                .ok_or_else(|| anyhow::anyhow!("no story `{name}`; the stories are {}", story_names()))?,
        ],
        None if args.serve => Vec::new(),
        None => STORIES.iter().collect(),
    };
    let (dir, _temporary) = match &args.data_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let dir = std::env::temp_dir().join(format!("agentmesh-demo-{:016x}", rand::random::<u64>()));
            (dir.clone(), Some(TempDir(dir)))
        }
    };
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let script = dir.join("replay.json");
    std::fs::write(&script, SCRIPT).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", script.display()))?;
    let database = format!("sqlite://{}", dir.join("agentmesh.db").display());
    let llm = format!("replay:{}", script.display());
    for url in [
        &mut config.discovery.service.database_url,
        &mut config.planner.service.database_url,
        &mut config.executor.service.database_url,
        &mut config.synthesis.service.database_url,
        &mut config.gateway.service.database_url,
    ] {
        url.clone_from(&database);
    }
    config.planner.llm.llm.clone_from(&llm);
    config.synthesis.llm.llm.clone_from(&llm);
    // The stories are the scripted model's: ranking by meaning would answer
    // "What time is it in CST?" before the model could invent time-tool-v1,
    // and whether it does must not depend on the model files being here.
    config.planner.embeddings = "none".into();
    if !args.serve {
        // Any free ports: a demo runs beside a mesh that is already up.
        let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        for listen in [
            &mut config.discovery.service.listen,
            &mut config.planner.service.listen,
            &mut config.executor.service.listen,
            &mut config.synthesis.service.listen,
            &mut config.gateway.service.listen,
        ] {
            *listen = any;
        }
    }
    let listeners = crate::up::bind(&mut config)?;
    let discovery_url = format!("http://{}", config.discovery.service.listen);
    let gateway_url = format!("http://{}", config.gateway.service.listen);
    let planner_url = format!("http://{}", config.planner.service.listen);
    let addresses = [
        ("discovery", config.discovery.service.listen),
        ("planner", config.planner.service.listen),
        ("executor", config.executor.service.listen),
        ("synthesis", config.synthesis.service.listen),
        ("gateway", config.gateway.service.listen),
    ];
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut mesh = tokio::spawn(crate::up::run_bound(config, listeners, async move {
        let mut stopped = stopped;
        let _ = stopped.wait_for(|s| *s).await;
    }));
    wait_ready(&gateway_url, &mut mesh).await?;
    println!(
        "agentmesh demo: the model is SCRIPTED (a replay of examples/replay/demo.json as built into this binary): \
         no model is called."
    );
    println!("  Every plan is still checked, every step really runs on the demo agents, every event is stored.");
    println!("  data in {}", dir.display());
    if agentmesh_telemetry::exporting() {
        println!("  traces: exported; each story is one trace, its id shown after the request id");
    } else {
        println!(
            "  traces: not exported (add --otlp-endpoint http://127.0.0.1:4317 to see each story as one trace in Jaeger)"
        );
    }
    let mut agents = Vec::new();
    for agent in agentmesh_demo_agents::all(&gateway_url) {
        let running = agent.start(agentmesh_agent::Options::discovery(discovery_url.clone())).await?;
        agents.push(running);
    }
    println!(
        "  agents: {}",
        agents.iter().map(|a| format!("{} at {}", a.id(), a.base_url())).collect::<Vec<_>>().join(", ")
    );
    let channel = crate::connect::connect(&gateway_url, "the gateway", "agentmesh demo").await?;
    let mut verdicts = Vec::new();
    for (n, story) in stories.iter().enumerate() {
        println!("\n── story {}/{}: {} ({})", n + 1, stories.len(), story.title, story.name);
        println!("   \"{}\"", story.query);
        println!("   expected: {}", story.expect);
        let request = pb::OrchestrateRequest {
            query: story.query.to_owned(),
            caller_agent_ids: story.callers.iter().map(|c| (*c).to_owned()).collect(),
            ..Default::default()
        };
        let verdict = match follow(channel.clone(), request, "   ").await {
            Ok(transcript) => {
                let calls = model_calls(&planner_url, &transcript.request_id).await;
                let kept = planned_agents(&transcript);
                for call in calls.iter().filter(|c| c.kind == pb::LlmInteractionKind::Plan as i32) {
                    let invented = invented_agents(&call.response, &kept);
                    if !invented.is_empty() {
                        println!(
                            "   the model's first plan used {}: not registered, so the planner refused it and asked again",
                            invented.join(", ")
                        );
                    }
                }
                (story.check)(&transcript, &calls)
            }
            Err(e) => Err(crate::error_text(&e)),
        };
        match &verdict {
            Ok(what) => println!("   ✔ {}: {what}", story.name),
            Err(why) => println!("   ✘ {}: {why}", story.name),
        }
        verdicts.push((story.name, verdict));
    }
    if !verdicts.is_empty() {
        println!("\nverdicts:");
        for (name, verdict) in &verdicts {
            match verdict {
                Ok(what) => println!("  ✔ {name}: {what}"),
                Err(why) => println!("  ✘ {name}: {why}"),
            }
        }
    }
    if args.serve {
        println!("\nthe mesh and the demo agents keep running until Ctrl-C:");
        for (name, addr) in addresses {
            println!("  {name:<10} http://{addr}");
        }
        let gateway = addresses[4].1;
        let flag = if gateway.port() == 7404 { String::new() } else { format!(" --gateway http://{gateway}") };
        println!("  try: agentmesh ask{flag} \"What is the weather in Chicago?\"");
        println!("  the console: http://{gateway}/ (ask there and watch each plan run; docs/console.md)");
        println!("  the stories' questions, to ask in the console or with agentmesh ask:");
        for story in STORIES {
            println!("    {}", story.query);
        }
        tokio::select! {
            () = shutdown => {}
            result = &mut mesh => return result.map_err(anyhow::Error::from).and_then(|r| r),
        }
    }
    for agent in agents {
        let _ = agent.stop().await;
    }
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), mesh).await;
    let failed = verdicts.iter().filter(|(_, v)| v.is_err()).count();
    anyhow::ensure!(failed == 0, "{failed} of {} stories did not end as they should", verdicts.len());
    Ok(())
}

/// The planner's recorded LLM calls for a request (none when it cannot
/// be asked: the checks that need them then fail and say so).
async fn model_calls(planner_url: &str, request_id: &str) -> Vec<pb::LlmInteraction> {
    let Ok(mut planner) = crate::plan::client(planner_url).await else { return Vec::new() };
    planner
        .list_interactions(pb::ListInteractionsRequest { request_id: request_id.to_owned() })
        .await
        .map(|r| r.into_inner().interactions)
        .unwrap_or_default()
}

/// The agents a model's plan answer names that the accepted plans do not.
fn invented_agents(answer: &str, kept: &[String]) -> Vec<String> {
    let plan: serde_json::Value = serde_json::from_str(answer).unwrap_or_default();
    let mut invented: Vec<String> = plan["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["agent"].as_str())
        .filter(|a| !kept.iter().any(|k| k == a))
        .map(str::to_owned)
        .collect();
    invented.dedup();
    invented
}

/// Waits until the gateway answers `/readyz` (it is ready when the
/// services behind it are).
async fn wait_ready(gateway_url: &str, mesh: &mut tokio::task::JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    let http = agentmesh_telemetry::http::client_builder().timeout(Duration::from_secs(2)).build()?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if mesh.is_finished() {
            return match mesh.await {
                Ok(Err(e)) => Err(e.context("the demo mesh stopped at start")),
                other => anyhow::bail!("the demo mesh stopped at start: {other:?}"),
            };
        }
        if let Ok(response) = http.get(format!("{gateway_url}/readyz")).send().await
            && response.status().is_success()
        {
            return Ok(());
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the demo mesh was not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
