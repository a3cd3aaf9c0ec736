//! `agentmesh eval FILE`: measures plans (and, through the gateway,
//! answers) on a set of requests whose right tools are known. Each case
//! names the capabilities a right plan uses (`agent:capability`; none: the
//! right plan has no step) and, optionally, which must come before which.
//! Reported per case and in total: valid plans, zero-step accuracy, node
//! and edge F1 (TaskBench's measures: the plan's tools, its dependencies),
//! repeated steps, grounded answers, latency and tokens. `--compare`
//! runs the set a second time with another model, side by side.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use anyhow::Context;
use clap::Args;
use pb::orchestrate_response::Event;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// `agentmesh eval` flags.
#[derive(Args, Debug)]
#[command(after_help = "FILE holds one case per line (JSONL), or a YAML or JSON list of cases:\n  \
    {\"id\": \"weather\", \"request\": \"What is the weather in Chicago?\",\n   \
    \"capabilities\": [\"weather-tool-v2:get_current_weather\"], \"edges\": [[\"a:x\", \"b:y\"]]}\n\
    `capabilities: []` means nothing fits: the right plan has no step. See examples/eval/.")]
pub struct EvalArgs {
    /// The cases (JSONL, YAML or JSON).
    file: PathBuf,
    /// Run each case through the gateway (plan, run, answer, review) instead
    /// of asking the planner for a plan only.
    #[arg(long)]
    gateway: Option<String>,
    /// Planner address (plans; and the tokens each request used).
    #[arg(long, env = "AGENTMESH_PLANNER_URL", default_value = "http://127.0.0.1:7401")]
    planner: String,
    /// Preferred model or alias for the run (default: the services' own).
    #[arg(long)]
    model: Option<String>,
    /// Run the set again with this model, and show both side by side.
    #[arg(long)]
    compare: Option<String>,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write a Markdown report here.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// One request and what a right plan for it uses.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// A short name (default: its position).
    #[serde(default)]
    pub id: String,
    /// The request.
    pub request: String,
    /// `agent:capability` of every tool a right plan uses; empty: nothing fits.
    pub capabilities: Vec<String>,
    /// Pairs `[before, after]` of those tools, when order matters.
    #[serde(default)]
    pub edges: Vec<(String, String)>,
    /// The calling orchestrator's agent ids, if the request comes from one.
    #[serde(default)]
    pub callers: Vec<String>,
}

/// Reads the cases of a file: JSONL, or a JSON or YAML list.
pub fn read_cases(path: &Path) -> anyhow::Result<Vec<Case>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
    let mut cases: Vec<Case> =
        match extension {
            "jsonl" => text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1)))
                .collect::<anyhow::Result<_>>()?,
            "json" => serde_json::from_str(&text)
                .with_context(|| format!("{} is not a JSON list of cases", path.display()))?,
            _ => serde_norway::from_str(&text)
                .with_context(|| format!("{} is not a YAML list of cases", path.display()))?,
        };
    anyhow::ensure!(!cases.is_empty(), "{} holds no case", path.display());
    for (i, case) in cases.iter_mut().enumerate() {
        if case.id.is_empty() {
            case.id = format!("{}", i + 1);
        }
        for tool in case.capabilities.iter().chain(case.edges.iter().flat_map(|(a, b)| [a, b])) {
            anyhow::ensure!(
                tool.split_once(':').is_some_and(|(a, c)| !a.is_empty() && !c.is_empty()),
                "case {}: `{tool}` is not `agent:capability`",
                case.id
            );
        }
    }
    Ok(cases)
}

/// What a run gave for one case.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// The plan's steps: `agent:capability`, its dependencies' step ids, its parameters.
    pub steps: Vec<(String, String, Vec<String>, Value)>,
    /// Why there was no plan (an error), if so.
    pub error: Option<String>,
    /// Whether the answer was grounded (gateway runs only).
    pub grounded: Option<bool>,
    /// Milliseconds from request to plan (planner) or to answer (gateway).
    pub latency_ms: u64,
    /// Tokens the request's LLM calls used, when known.
    pub tokens: Option<u64>,
}

/// The measures of one case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// The case.
    pub id: String,
    /// A plan came back.
    pub valid: bool,
    /// The plan has no step exactly when none is right.
    pub zero_step_right: bool,
    /// F1 of the plan's tools against the right ones.
    pub node_f1: f64,
    /// F1 of its dependencies, when either side has some.
    pub edge_f1: Option<f64>,
    /// Steps that repeat an earlier one (same tool and parameters).
    pub repeated_steps: usize,
    /// Whether the answer states only what the results say (gateway runs).
    pub grounded: Option<bool>,
    /// Milliseconds.
    pub latency_ms: u64,
    /// Tokens, when known.
    pub tokens: Option<u64>,
    /// What went wrong, if the case has no plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn f1(right: &BTreeSet<String>, got: &BTreeSet<String>) -> f64 {
    if right.is_empty() && got.is_empty() {
        return 1.0;
    }
    let hits = right.intersection(got).count() as f64;
    if hits == 0.0 {
        return 0.0;
    }
    let (precision, recall) = (hits / got.len() as f64, hits / right.len() as f64);
    2.0 * precision * recall / (precision + recall)
}

/// Scores what a run gave against the case.
pub fn score(case: &Case, observed: &Observed) -> Score {
    let right: BTreeSet<String> = case.capabilities.iter().cloned().collect();
    let got: BTreeSet<String> = observed.steps.iter().map(|(tool, ..)| tool.clone()).collect();
    let right_edges: BTreeSet<String> = case.edges.iter().map(|(a, b)| format!("{a}>{b}")).collect();
    let ids: Vec<&str> = observed.steps.iter().map(|(_, id, _, _)| id.as_str()).collect();
    let got_edges: BTreeSet<String> = observed
        .steps
        .iter()
        .flat_map(|(tool, _, deps, _)| {
            deps.iter()
                .filter_map(|d| ids.iter().position(|id| id == d))
                .map(move |i| format!("{}>{tool}", observed.steps[i].0))
        })
        .collect();
    let repeated = observed
        .steps
        .iter()
        .enumerate()
        .filter(|(i, (tool, _, _, params))| observed.steps[..*i].iter().any(|(t, _, _, p)| t == tool && p == params))
        .count();
    let valid = observed.error.is_none();
    Score {
        id: case.id.clone(),
        valid,
        zero_step_right: valid && right.is_empty() == got.is_empty(),
        node_f1: if valid { f1(&right, &got) } else { 0.0 },
        edge_f1: (!right_edges.is_empty() || !got_edges.is_empty()).then(|| f1(&right_edges, &got_edges)),
        repeated_steps: repeated,
        grounded: observed.grounded,
        latency_ms: observed.latency_ms,
        tokens: observed.tokens,
        error: observed.error.clone(),
    }
}

/// The measures of a whole set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Totals {
    /// Cases.
    pub cases: usize,
    /// Cases with a plan.
    pub valid: usize,
    /// Share of cases whose plan had steps exactly when some were right.
    pub zero_step_accuracy: f64,
    /// Mean node F1.
    pub node_f1: f64,
    /// Mean edge F1 over the cases where it applies.
    pub edge_f1: Option<f64>,
    /// Steps repeating an earlier one, in all.
    pub repeated_steps: usize,
    /// Grounded answers, of the answers checked.
    pub grounded: Option<(usize, usize)>,
    /// Median latency, milliseconds.
    pub latency_p50_ms: u64,
    /// Tokens in all, when known for every case.
    pub tokens: Option<u64>,
}

/// Sums a set's scores.
pub fn totals(scores: &[Score]) -> Totals {
    let n = scores.len().max(1) as f64;
    let edges: Vec<f64> = scores.iter().filter_map(|s| s.edge_f1).collect();
    let grounded: Vec<bool> = scores.iter().filter_map(|s| s.grounded).collect();
    let mut latencies: Vec<u64> = scores.iter().map(|s| s.latency_ms).collect();
    latencies.sort_unstable();
    Totals {
        cases: scores.len(),
        valid: scores.iter().filter(|s| s.valid).count(),
        zero_step_accuracy: scores.iter().filter(|s| s.zero_step_right).count() as f64 / n,
        node_f1: scores.iter().map(|s| s.node_f1).sum::<f64>() / n,
        edge_f1: (!edges.is_empty()).then(|| edges.iter().sum::<f64>() / edges.len() as f64),
        repeated_steps: scores.iter().map(|s| s.repeated_steps).sum(),
        grounded: (!grounded.is_empty()).then(|| (grounded.iter().filter(|g| **g).count(), grounded.len())),
        latency_p50_ms: latencies.get(latencies.len() / 2).copied().unwrap_or(0),
        tokens: scores.iter().map(|s| s.tokens).sum(),
    }
}

fn steps_of(plan: Option<&pb::Plan>) -> Vec<(String, String, Vec<String>, Value)> {
    plan.map(|p| {
        p.steps
            .iter()
            .map(|s| {
                (
                    format!("{}:{}", s.agent, s.capability),
                    s.step_id.clone(),
                    s.depends_on.clone(),
                    agentmesh_planner::service::parameters_json(s),
                )
            })
            .collect()
    })
    .unwrap_or_default()
}

/// The services a run talks to, connected once.
struct Targets {
    /// The planner (plans, and every request's tokens), when reachable.
    planner: Option<PlannerServiceClient<TracedChannel>>,
    /// The gateway, when cases run through it.
    gateway: Option<TracedChannel>,
}

/// Tokens of a request's LLM calls, from the planner's interaction log.
async fn tokens(planner: Option<&PlannerServiceClient<TracedChannel>>, request_id: &str) -> Option<u64> {
    let mut client = planner?.clone();
    let listed =
        client.list_interactions(pb::ListInteractionsRequest { request_id: request_id.to_owned() }).await.ok()?;
    let calls = listed.into_inner().interactions;
    (!calls.is_empty()).then(|| calls.iter().map(|i| u64::from(i.prompt_tokens) + u64::from(i.completion_tokens)).sum())
}

async fn run_case(targets: &Targets, case: &Case, model: &str) -> Observed {
    let request_id = agentmesh_server::new_request_id();
    let started = Instant::now();
    let mut observed = Observed::default();
    let mut answering_tokens = None;
    if let Some(gateway) = &targets.gateway {
        let request = pb::OrchestrateRequest {
            request_id: request_id.clone(),
            query: case.request.clone(),
            caller_agent_ids: case.callers.clone(),
            model: model.to_owned(),
            ..Default::default()
        };
        match orchestrate(gateway.clone(), request).await {
            Ok((plan, grounded, answering)) => {
                observed.steps = steps_of(plan.as_ref());
                observed.grounded = grounded;
                answering_tokens = answering;
            }
            Err(e) => observed.error = Some(format!("{e:#}")),
        }
    } else {
        let request = pb::CreatePlanRequest {
            request_id: request_id.clone(),
            query: case.request.clone(),
            caller_agent_ids: case.callers.clone(),
            model: model.to_owned(),
            ..Default::default()
        };
        match targets.planner.clone() {
            Some(mut client) => match client.create_plan(request).await {
                Ok(answer) => observed.steps = steps_of(answer.into_inner().plan.as_ref()),
                Err(status) => observed.error = Some(status.message().to_owned()),
            },
            None => observed.error = Some("the planner is not reachable".into()),
        }
    }
    observed.latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    // The planner's calls, and through the gateway the answers' and reviews'.
    let planning = tokens(targets.planner.as_ref(), &request_id).await;
    observed.tokens = match (planning, answering_tokens) {
        (None, None) => None,
        (p, a) => Some(p.unwrap_or(0) + a.unwrap_or(0)),
    };
    observed
}

/// The first plan of an orchestration, whether its answer was grounded
/// (the last review names no unsupported claim), and the tokens its
/// answers and reviews used.
async fn orchestrate(
    channel: TracedChannel,
    request: pb::OrchestrateRequest,
) -> anyhow::Result<(Option<pb::Plan>, Option<bool>, Option<u64>)> {
    let mut stream = agentmesh_proto::v1::gateway_service_client::GatewayServiceClient::new(channel)
        .orchestrate(request)
        .await
        .map_err(|s| crate::connect::rpc_error(&s))?
        .into_inner();
    let (mut plan, mut review, mut answered, mut usage) = (None, None, false, None);
    while let Some(message) = stream.message().await.map_err(|s| crate::connect::rpc_error(&s))? {
        match message.event {
            Some(Event::PlanCreated(created)) if plan.is_none() => plan = Some(created.plan.unwrap_or_default()),
            Some(Event::Review(r)) => review = Some(r),
            Some(Event::FinalAnswer(answer)) => {
                answered = !answer.text.trim().is_empty();
                usage = answer.usage.map(|u| u64::from(u.prompt_tokens) + u64::from(u.completion_tokens));
            }
            Some(Event::Error(e)) => anyhow::bail!("the {} failed ({}): {}", e.service, e.code, e.message),
            _ => {}
        }
    }
    let grounded = review.map(|r| answered && r.unsupported_claims.is_empty());
    Ok((plan, grounded, usage))
}

fn percent(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

fn table(runs: &[(String, Vec<Score>, Totals)], markdown: bool) -> String {
    let mut out = String::new();
    let (open, sep, close) = if markdown { ("| ", " | ", " |") } else { ("", "  ", "") };
    let mut header = vec!["case".to_owned()];
    for (model, ..) in runs {
        let label = if model.is_empty() { String::new() } else { format!(" [{model}]") };
        header.extend(
            ["valid", "nodes F1", "edges F1", "repeats", "grounded", "ms", "tokens"].map(|h| format!("{h}{label}")),
        );
    }
    let rows: Vec<Vec<String>> = runs[0]
        .1
        .iter()
        .enumerate()
        .map(|(i, first)| {
            let mut row = vec![first.id.clone()];
            for (_, scores, _) in runs {
                let s = &scores[i];
                row.extend([
                    if s.valid { "yes".into() } else { "no".into() },
                    format!("{:.2}", s.node_f1),
                    s.edge_f1.map_or("-".into(), |f| format!("{f:.2}")),
                    s.repeated_steps.to_string(),
                    s.grounded.map_or("-".into(), |g| if g { "yes".into() } else { "no".into() }),
                    s.latency_ms.to_string(),
                    s.tokens.map_or("-".into(), |t| t.to_string()),
                ]);
            }
            row
        })
        .collect();
    let mut all = vec![header.clone()];
    all.extend(rows);
    let mut total = vec!["all".to_owned()];
    for (_, _, t) in runs {
        total.extend([
            format!("{}/{}", t.valid, t.cases),
            format!("{:.2}", t.node_f1),
            t.edge_f1.map_or("-".into(), |f| format!("{f:.2}")),
            t.repeated_steps.to_string(),
            t.grounded.map_or("-".into(), |(g, n)| format!("{g}/{n}")),
            format!("p50 {}", t.latency_p50_ms),
            t.tokens.map_or("-".into(), |n| n.to_string()),
        ]);
    }
    all.push(total);
    let widths: Vec<usize> =
        (0..header.len()).map(|c| all.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for (r, row) in all.iter().enumerate() {
        let cells: Vec<String> = row.iter().enumerate().map(|(c, v)| format!("{v:<w$}", w = widths[c])).collect();
        out.push_str(&format!("{open}{}{close}\n", cells.join(sep).trim_end()));
        if markdown && r == 0 {
            out.push_str(&format!("|{}|\n", widths.iter().map(|w| "-".repeat(w + 2)).collect::<Vec<_>>().join("|")));
        }
    }
    for (model, _, t) in runs {
        let label = if model.is_empty() { "the default model".to_owned() } else { format!("`{model}`") };
        out.push_str(&format!(
            "{}{label}: {} of {} plans valid, zero-step accuracy {}, node F1 {:.2}, edge F1 {}, {} repeated steps{}\n",
            if markdown { "\n" } else { "" },
            t.valid,
            t.cases,
            percent(t.zero_step_accuracy),
            t.node_f1,
            t.edge_f1.map_or("-".into(), |f| format!("{f:.2}")),
            t.repeated_steps,
            t.grounded.map_or(String::new(), |(g, n)| format!(", {g} of {n} answers grounded")),
        ));
    }
    out
}

/// Runs `agentmesh eval`.
pub async fn eval(args: EvalArgs) -> anyhow::Result<()> {
    let cases = read_cases(&args.file)?;
    let targets = match &args.gateway {
        Some(url) => Targets {
            // Only for tokens, then: the run goes on without them.
            planner: crate::plan::client(&args.planner).await.ok(),
            gateway: Some(crate::connect::connect(url, "the gateway", "agentmesh up").await?),
        },
        None => Targets { planner: Some(crate::plan::client(&args.planner).await?), gateway: None },
    };
    let mut models = vec![args.model.clone().unwrap_or_default()];
    models.extend(args.compare.clone());
    let mut runs = Vec::new();
    for model in &models {
        let mut scores = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            if !args.json {
                eprint!("\r{}/{} {}", i + 1, cases.len(), case.id);
            }
            scores.push(score(case, &run_case(&targets, case, model).await));
        }
        if !args.json {
            eprintln!();
        }
        let total = totals(&scores);
        runs.push((model.clone(), scores, total));
    }
    if args.json {
        let out: Vec<Value> = runs
            .iter()
            .map(|(model, scores, total)| json!({"model": model, "cases": scores, "totals": total}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({"runs": out}))?);
    } else {
        print!("{}", table(&runs, false));
    }
    if let Some(path) = &args.markdown {
        let target = if args.gateway.is_some() { "the gateway" } else { "the planner" };
        let report = format!(
            "# agentmesh eval\n\n{} cases from `{}`, run through {target}.\n\n{}",
            cases.len(),
            args.file.display(),
            table(&runs, true)
        );
        std::fs::write(path, report).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(capabilities: &[&str], edges: &[(&str, &str)]) -> Case {
        Case {
            id: "c".into(),
            request: "r".into(),
            capabilities: capabilities.iter().map(|s| (*s).to_owned()).collect(),
            edges: edges.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect(),
            callers: Vec::new(),
        }
    }

    fn step(tool: &str, id: &str, deps: &[&str], params: Value) -> (String, String, Vec<String>, Value) {
        (tool.into(), id.into(), deps.iter().map(|d| (*d).to_owned()).collect(), params)
    }

    #[test]
    fn nodes_edges_zero_steps_and_repeats_are_measured() {
        let right = case(
            &["stock:price", "weather:now", "calc:eval"],
            &[("stock:price", "calc:eval"), ("weather:now", "calc:eval")],
        );
        let observed = Observed {
            steps: vec![
                step("stock:price", "s1", &[], json!({"symbol": "TSLA"})),
                step("calc:eval", "s2", &["s1"], json!({"e": "1"})),
                step("stock:price", "s3", &[], json!({"symbol": "TSLA"})),
            ],
            ..Observed::default()
        };
        let s = score(&right, &observed);
        assert!(s.valid && s.zero_step_right);
        // Tools: 2 of 3 right, none wrong: precision 1, recall 2/3.
        assert!((s.node_f1 - 0.8).abs() < 1e-9, "{}", s.node_f1);
        // Edges: 1 of 2 right.
        assert!((s.edge_f1.unwrap_or_default() - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(s.repeated_steps, 1);

        let nothing = case(&[], &[]);
        let empty = score(&nothing, &Observed::default());
        assert!(empty.zero_step_right && (empty.node_f1 - 1.0).abs() < 1e-9 && empty.edge_f1.is_none());
        let wrong = score(&nothing, &observed);
        assert!(!wrong.zero_step_right && wrong.node_f1 == 0.0);
        let failed = score(&right, &Observed { error: Some("down".into()), ..Observed::default() });
        assert!(!failed.valid && !failed.zero_step_right);

        let t = totals(&[s, empty, wrong, failed]);
        assert_eq!((t.cases, t.valid, t.repeated_steps), (4, 3, 2));
        assert!((t.zero_step_accuracy - 0.5).abs() < 1e-9);
    }

    #[test]
    fn cases_are_read_from_jsonl_and_yaml() {
        let dir = std::env::temp_dir().join(format!("agentmesh-eval-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let jsonl = dir.join("cases.jsonl");
        std::fs::write(&jsonl, "{\"request\": \"a\", \"capabilities\": [\"x:y\"]}\n\n{\"id\": \"b\", \"request\": \"b\", \"capabilities\": []}\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let read = read_cases(&jsonl).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!((read[0].id.as_str(), read[1].id.as_str()), ("1", "b"));
        let yaml = dir.join("cases.yaml");
        std::fs::write(&yaml, "- id: w\n  request: weather?\n  capabilities: [\"w:now\"]\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read_cases(&yaml).unwrap_or_else(|e| panic!("{e:#}"))[0].capabilities, ["w:now"]);
        std::fs::write(&yaml, "- request: x\n  capabilities: [\"no-colon\"]\n").unwrap_or_else(|e| panic!("{e}"));
        let error = format!("{:#}", read_cases(&yaml).err().unwrap_or_else(|| anyhow::anyhow!("")));
        assert!(error.contains("is not `agent:capability`"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
