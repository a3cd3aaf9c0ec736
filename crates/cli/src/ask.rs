//! `agentmesh ask`: a plain client of the gateway. It prints one line per
//! event as it happens (stderr), the answer as it streams (stdout), and the
//! request id whatever the outcome.

use std::io::Write as _;

use agentmesh_proto::convert::plan_from_pb;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::gateway_service_client::GatewayServiceClient;
use clap::Args;
use pb::orchestrate_response::Event;

/// `agentmesh ask` flags.
#[derive(Args, Debug)]
pub struct AskArgs {
    /// The request, in natural language.
    query: String,
    /// Gateway address.
    #[arg(long, env = "AGENTMESH_GATEWAY_URL", default_value = "http://127.0.0.1:7404")]
    gateway: String,
    /// The calling orchestrator's own agent ids (repeatable).
    #[arg(long = "caller")]
    callers: Vec<String>,
    /// Preferred model or alias for every LLM stage.
    #[arg(long)]
    model: Option<String>,
    /// Skip the review of the answer.
    #[arg(long)]
    skip_review: bool,
    /// Also plan over inactive agents (no recent heartbeat).
    #[arg(long)]
    include_unhealthy: bool,
}

fn execution_line(e: &pb::ExecutionEvent) -> String {
    let kind = pb::ExecutionEventKind::try_from(e.kind).unwrap_or_default();
    let name = kind.as_str_name().trim_start_matches("EXECUTION_EVENT_KIND_").to_ascii_lowercase();
    let mut line = format!("execution {} #{} {name}", e.execution_id, e.sequence);
    if !e.step_id.is_empty() {
        line.push_str(&format!(" {}", e.step_id));
    }
    if !e.agent_id.is_empty() {
        line.push_str(&format!(" ({})", e.agent_id));
    }
    if e.duration_ms > 0 {
        line.push_str(&format!(" {} ms", e.duration_ms));
    }
    if !e.error.is_empty() {
        line.push_str(&format!(": {}", e.error));
    }
    line
}

/// Sends the request and prints what happens until the answer or an error.
pub async fn ask(args: AskArgs) -> anyhow::Result<()> {
    let request_id = format!("req_{:016x}", rand::random::<u64>());
    let channel = crate::connect::connect(&args.gateway, "the gateway", "agentmesh serve gateway").await?;
    let mut request = tonic::Request::new(pb::OrchestrateRequest {
        request_id: request_id.clone(),
        query: args.query,
        caller_agent_ids: args.callers,
        model: args.model.unwrap_or_default(),
        options: Some(pb::OrchestrateOptions {
            skip_review: args.skip_review,
            include_unhealthy: args.include_unhealthy,
            ..Default::default()
        }),
        ..Default::default()
    });
    if let Ok(value) = request_id.parse() {
        request.metadata_mut().insert("x-request-id", value);
    }
    eprintln!("request {request_id}");
    let fail = |s: tonic::Status| crate::connect::rpc_error(&s).context(format!("request {request_id}"));
    let response = GatewayServiceClient::new(channel).orchestrate(request).await.map_err(fail)?;
    if let Some(trace) = response.metadata().get("x-trace-id").and_then(|v| v.to_str().ok()) {
        eprintln!("trace {trace}");
    }
    let mut stream = response.into_inner();
    let mut answering = false;
    let mut stdout = std::io::stdout();
    while let Some(message) = stream.message().await.map_err(fail)? {
        let round = if message.round > 0 { format!("[round {}] ", message.round) } else { String::new() };
        match message.event {
            Some(Event::PlanCreated(p)) => {
                let plan = plan_from_pb(&p.plan.unwrap_or_default());
                let steps: Vec<String> =
                    plan.steps.iter().map(|s| format!("{} {}/{}", s.step_id, s.agent, s.capability)).collect();
                if steps.is_empty() {
                    eprintln!("{round}plan: no steps: {}", p.zero_step_reason);
                } else {
                    eprintln!("{round}plan: {}", steps.join(", "));
                }
            }
            Some(Event::ExecutionEvent(e)) => eprintln!("{round}{}", execution_line(&e)),
            Some(Event::SynthesisChunk(text)) => {
                answering = true;
                print!("{text}");
                let _ = stdout.flush();
            }
            Some(Event::Review(r)) => {
                if answering {
                    println!();
                    answering = false;
                }
                eprintln!(
                    "{round}review: goal {} (confidence {:.2}): {}",
                    if r.goal_achieved { "achieved" } else { "not achieved" },
                    r.confidence,
                    r.summary
                );
            }
            Some(Event::FinalAnswer(a)) => {
                if answering {
                    println!();
                }
                eprintln!("done: goal {}", if a.goal_achieved { "achieved" } else { "not achieved (or not reviewed)" });
                return Ok(());
            }
            Some(Event::Error(e)) => {
                if answering {
                    println!();
                }
                anyhow::bail!("request {request_id}: the {} failed: {}: {}", e.service, e.code, e.message);
            }
            None => {}
        }
    }
    anyhow::bail!("request {request_id}: the gateway ended the stream without an answer")
}
