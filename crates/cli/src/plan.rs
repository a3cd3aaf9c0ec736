//! `agentmesh plan` and `agentmesh interactions`: clients of the planner.

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::planner_service_client::PlannerServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use clap::Args;
use serde_json::json;

/// `agentmesh plan` flags.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The request, in natural language.
    query: String,
    /// Planner address.
    #[arg(long, env = "AGENTMESH_PLANNER_URL", default_value = "http://127.0.0.1:7401")]
    planner: String,
    /// The calling orchestrator's own agent ids (repeatable).
    #[arg(long = "caller")]
    callers: Vec<String>,
    /// Only capabilities matching these `agent:capability` patterns (repeatable).
    #[arg(long)]
    allow: Vec<String>,
    /// Preferred model or alias (flash, pro, sonnet, opus, haiku, fast, smart, auto).
    #[arg(long)]
    model: Option<String>,
    /// Reasoning effort: minimal, low, medium or high.
    #[arg(long, value_parser = ["minimal", "low", "medium", "high"])]
    reasoning_effort: Option<String>,
    /// Also plan over inactive agents (no recent heartbeat); active and
    /// degraded agents are always offered.
    #[arg(long)]
    include_unhealthy: bool,
}

/// `agentmesh interactions` flags.
#[derive(Args, Debug)]
pub struct InteractionsArgs {
    /// Request id (printed by `agentmesh plan`).
    request_id: String,
    /// Planner address.
    #[arg(long, env = "AGENTMESH_PLANNER_URL", default_value = "http://127.0.0.1:7401")]
    planner: String,
}

pub(crate) async fn client(url: &str) -> anyhow::Result<PlannerServiceClient<TracedChannel>> {
    Ok(PlannerServiceClient::new(crate::connect::connect(url, "the planner", "agentmesh serve planner").await?))
}

/// Prints a plan for a request.
pub async fn plan(args: PlanArgs) -> anyhow::Result<()> {
    // Chosen here so that it can be printed whatever the outcome.
    let request_id = agentmesh_server::new_request_id();
    let mut request = tonic::Request::new(pb::CreatePlanRequest {
        request_id: request_id.clone(),
        query: args.query,
        caller_agent_ids: args.callers,
        allow: args.allow,
        include_unhealthy: args.include_unhealthy,
        model: args.model.unwrap_or_default(),
        reasoning_effort: args
            .reasoning_effort
            .and_then(|e| pb::ReasoningEffort::from_str_name(&format!("REASONING_EFFORT_{}", e.to_uppercase())))
            .map_or(0, |e| e as i32),
        ..Default::default()
    });
    if let Ok(value) = request_id.parse() {
        request.metadata_mut().insert("x-request-id", value);
    }
    let response = client(&args.planner)
        .await?
        .create_plan(request)
        .await
        .map_err(|s| {
            crate::connect::rpc_error(&s)
                .context(format!("request {request_id} (its LLM calls: `agentmesh interactions {request_id}`)"))
        })?
        .into_inner();
    let plan = response.plan.unwrap_or_default();
    let steps: Vec<serde_json::Value> = plan
        .steps
        .iter()
        .map(|s| {
            json!({"step_id": s.step_id, "agent": s.agent, "capability": s.capability, "instruction": s.instruction,
                   "parameters": agentmesh_planner::service::parameters_json(s), "depends_on": s.depends_on})
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&json!({"reasoning": plan.reasoning, "steps": steps}))?);
    let stats = response.stats.unwrap_or_default();
    eprintln!("{}", summary(&response.request_id, plan.steps.len(), &stats));
    if plan.steps.is_empty() && !response.zero_step_reason.is_empty() {
        eprintln!("no steps: {}", response.zero_step_reason);
    }
    Ok(())
}

/// What the planner did, in one line: the steps, what the model was offered
/// (the catalog after health and `--allow` filtering, and how many of those
/// pre-selection kept), the calls made.
fn summary(request_id: &str, steps: usize, stats: &pb::PlanningStats) -> String {
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let offered = plural(u64::from(stats.catalog_size), "capability", "capabilities");
    let preselected = if stats.preselected_capabilities > 0 && stats.preselected_capabilities < stats.catalog_size {
        format!(", {} pre-selected", stats.preselected_capabilities)
    } else {
        String::new()
    };
    format!(
        "request {request_id}: {} over {offered} offered to the model{preselected}; {} ({} retries, {} hallucinations caught), model {} via {}, {} ms",
        plural(steps as u64, "step", "steps"),
        plural(u64::from(stats.llm_calls), "LLM call", "LLM calls"),
        stats.retries,
        stats.hallucinations_detected,
        stats.model,
        stats.provider,
        stats.latency_ms
    )
}

/// Prints the LLM calls of a request.
pub async fn interactions(args: InteractionsArgs) -> anyhow::Result<()> {
    let list = client(&args.planner)
        .await?
        .list_interactions(pb::ListInteractionsRequest { request_id: args.request_id.clone() })
        .await
        .map_err(|s| crate::connect::rpc_error(&s))?
        .into_inner()
        .interactions;
    if list.is_empty() {
        eprintln!("no LLM calls recorded for {} (they are kept 24 h, errors 7 d)", args.request_id);
    }
    for i in list {
        let kind = pb::LlmInteractionKind::try_from(i.kind)
            .map(|k| k.as_str_name().trim_start_matches("LLM_INTERACTION_KIND_").to_ascii_lowercase())
            .unwrap_or_else(|_| "unknown".into());
        let mode = if i.structured_output_mode.is_empty() {
            String::new()
        } else {
            format!(" mode={}", i.structured_output_mode)
        };
        println!(
            "== {kind} model={}{mode} tokens={}+{} latency={}ms",
            i.model, i.prompt_tokens, i.completion_tokens, i.latency_ms
        );
        if !i.error.is_empty() {
            println!("error: {}", i.error);
        }
        println!("-- prompt\n{}\n-- response\n{}\n", i.prompt, i.response);
    }
    Ok(())
}
