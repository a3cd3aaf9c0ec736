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
#[command(after_help = "Exit status: 0 when the answer came and the review judged the goal achieved \
(with --skip-review: when the execution completed); 1 when the execution failed, the goal was not \
achieved or the request could not be run. The answer is printed in every case.")]
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

/// Everything an orchestration showed, in the order it happened.
#[derive(Debug, Default)]
pub struct Transcript {
    /// The request id.
    pub request_id: String,
    /// The trace id, when the gateway exports traces.
    pub trace_id: Option<String>,
    /// Each plan with its round, zero-step reason and planning stats.
    pub plans: Vec<(u32, pb::PlanCreated)>,
    /// The executor's events with their round.
    pub events: Vec<(u32, pb::ExecutionEvent)>,
    /// The answer as streamed (every round's).
    pub answer: String,
    /// The reviews with their round.
    pub reviews: Vec<(u32, pb::Review)>,
    /// The final answer.
    pub finished: Option<pb::FinalAnswer>,
}

impl Transcript {
    /// The kind of the last execution-level event (completed, failed…).
    pub fn execution_end(&self) -> Option<pb::ExecutionEventKind> {
        use pb::ExecutionEventKind as K;
        self.events
            .iter()
            .rev()
            .map(|(_, e)| K::try_from(e.kind).unwrap_or_default())
            .find(|k| matches!(k, K::ExecutionCompleted | K::ExecutionFailed | K::ExecutionCancelled))
    }

    /// Whether the request was served: the answer came, and the review
    /// judged the goal achieved (without a review: the execution
    /// completed).
    pub fn served(&self, reviewed: bool) -> bool {
        let Some(finished) = &self.finished else { return false };
        if reviewed {
            finished.goal_achieved
        } else {
            self.execution_end() == Some(pb::ExecutionEventKind::ExecutionCompleted)
        }
    }
}

/// Sends `request` to the gateway and prints what happens (events on
/// stderr after `indent`, the answer on stdout as it streams, labelled
/// when `indent` is not empty) until the final answer; an orchestration
/// error is an `Err` naming the request.
pub async fn follow(
    channel: agentmesh_telemetry::rpc::TracedChannel,
    mut request: pb::OrchestrateRequest,
    indent: &str,
) -> anyhow::Result<Transcript> {
    if request.request_id.is_empty() {
        request.request_id = format!("req_{:016x}", rand::random::<u64>());
    }
    let request_id = request.request_id.clone();
    let mut call = tonic::Request::new(request);
    if let Ok(value) = request_id.parse() {
        call.metadata_mut().insert("x-request-id", value);
    }
    eprintln!("{indent}request {request_id}");
    let fail = |s: tonic::Status| crate::connect::rpc_error(&s).context(format!("request {request_id}"));
    let response = GatewayServiceClient::new(channel).orchestrate(call).await.map_err(fail)?;
    let mut transcript = Transcript { request_id: request_id.clone(), ..Transcript::default() };
    if let Some(trace) = response.metadata().get("x-trace-id").and_then(|v| v.to_str().ok()) {
        eprintln!("{indent}trace {trace}");
        transcript.trace_id = Some(trace.to_owned());
    }
    let mut stream = response.into_inner();
    let mut answering = false;
    let mut stdout = std::io::stdout();
    let mut end_answer = |answering: &mut bool| {
        if std::mem::take(answering) {
            let _ = writeln!(stdout);
        }
    };
    while let Some(message) = stream.message().await.map_err(fail)? {
        let round = if message.round > 0 { format!("[round {}] ", message.round) } else { String::new() };
        match message.event {
            Some(Event::PlanCreated(p)) => {
                let plan = plan_from_pb(&p.plan.clone().unwrap_or_default());
                let steps: Vec<String> = plan
                    .steps
                    .iter()
                    .map(|s| {
                        let after = if s.depends_on.is_empty() {
                            String::new()
                        } else {
                            format!(" after {}", s.depends_on.join(", "))
                        };
                        format!("{} {}/{}{after}", s.step_id, s.agent, s.capability)
                    })
                    .collect();
                let caught = p.stats.as_ref().map_or(0, |s| s.hallucinations_detected);
                let caught = if caught > 0 {
                    format!(" ({caught} invented tool(s) caught and planned again)")
                } else {
                    String::new()
                };
                if steps.is_empty() {
                    eprintln!("{indent}{round}plan: no steps{caught}: {}", p.zero_step_reason);
                } else {
                    eprintln!("{indent}{round}plan{caught}: {}", steps.join("; "));
                }
                transcript.plans.push((message.round, p));
            }
            Some(Event::ExecutionEvent(e)) => {
                eprintln!("{indent}{round}{}", execution_line(&e));
                transcript.events.push((message.round, e));
            }
            Some(Event::SynthesisChunk(text)) => {
                // Indented (the demo), the answer is labelled among the
                // events; else stdout holds the answer alone.
                if !answering && !indent.is_empty() {
                    print!("{indent}{round}answer: ");
                }
                answering = true;
                print!("{text}");
                let _ = std::io::stdout().flush();
                transcript.answer.push_str(&text);
            }
            Some(Event::Review(r)) => {
                end_answer(&mut answering);
                eprintln!(
                    "{indent}{round}review: goal {} (confidence {:.2}): {}",
                    if r.goal_achieved { "achieved" } else { "not achieved" },
                    r.confidence,
                    r.summary
                );
                for action in &r.recovery_actions {
                    let kind = pb::RecoveryActionKind::try_from(action.kind).unwrap_or_default();
                    let kind = kind.as_str_name().trim_start_matches("RECOVERY_ACTION_KIND_").to_ascii_lowercase();
                    let c = action.collaboration.clone().unwrap_or_default();
                    eprintln!("{indent}{round}  recovery action: {kind} {}/{}: {}", c.agent, c.capability, c.query);
                }
                transcript.reviews.push((message.round, r));
            }
            Some(Event::FinalAnswer(a)) => {
                end_answer(&mut answering);
                transcript.finished = Some(a);
                return Ok(transcript);
            }
            Some(Event::Error(e)) => {
                end_answer(&mut answering);
                anyhow::bail!("request {request_id}: the {} failed: {}: {}", e.service, e.code, e.message);
            }
            None => {}
        }
    }
    anyhow::bail!("request {request_id}: the gateway ended the stream without an answer")
}

/// Sends the request and prints what happens until the answer or an error;
/// fails unless the request was served.
pub async fn ask(args: AskArgs) -> anyhow::Result<()> {
    let channel = crate::connect::connect(&args.gateway, "the gateway", "agentmesh serve gateway").await?;
    let request = pb::OrchestrateRequest {
        query: args.query,
        caller_agent_ids: args.callers,
        model: args.model.unwrap_or_default(),
        options: Some(pb::OrchestrateOptions {
            skip_review: args.skip_review,
            include_unhealthy: args.include_unhealthy,
            ..Default::default()
        }),
        ..Default::default()
    };
    let transcript = follow(channel, request, "").await?;
    if transcript.served(!args.skip_review) {
        eprintln!("done: goal achieved");
        return Ok(());
    }
    let why = match transcript.execution_end() {
        Some(pb::ExecutionEventKind::ExecutionFailed) => "the execution failed",
        Some(pb::ExecutionEventKind::ExecutionCancelled) => "the execution was cancelled",
        _ if args.skip_review => "the execution did not complete",
        _ => "the review judged the goal not achieved",
    };
    anyhow::bail!("request {}: {why} (the answer above says what is missing)", transcript.request_id)
}
