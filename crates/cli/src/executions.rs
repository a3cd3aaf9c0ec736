//! `agentmesh run` and `agentmesh executions …`: clients of the executor.

use std::path::PathBuf;
use std::time::Instant;

use agentmesh_core::plan::parse_plan_document;
use agentmesh_proto::convert::plan_to_pb;
use agentmesh_proto::json::from_value;
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::executor_service_client::ExecutorServiceClient;
use agentmesh_telemetry::rpc::TracedChannel;
use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tokio_stream::StreamExt;

const DEFAULT_EXECUTOR: &str = "http://127.0.0.1:7402";

/// `agentmesh run` flags.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The plan: a JSON file in the plan format (`-` for stdin).
    plan: PathBuf,
    /// Executor address.
    #[arg(long, env = "AGENTMESH_EXECUTOR_URL", default_value = DEFAULT_EXECUTOR)]
    executor: String,
    /// Execution id to use; running the same plan again with it attaches to
    /// that execution instead of starting another (the request id is
    /// derived from it, the same each time).
    #[arg(long)]
    execution_id: Option<String>,
    /// Steps running at once [default: the executor's].
    #[arg(long)]
    max_concurrency: Option<u32>,
    /// Milliseconds one attempt of a step may take [default: the executor's].
    #[arg(long)]
    step_timeout_ms: Option<u64>,
    /// Retries after a retryable failure [default: the executor's].
    #[arg(long)]
    max_retries: Option<u32>,
    /// Replans allowed for collaboration requests [default: the executor's].
    #[arg(long)]
    replan_budget: Option<u32>,
    /// The calling orchestrator's own agent ids, never called (repeatable).
    #[arg(long = "caller")]
    callers: Vec<String>,
    /// The request the plan answers (given to the planner on loop-back).
    #[arg(long, default_value = "")]
    query: String,
}

/// `agentmesh executions` flags.
#[derive(Args, Debug)]
pub struct ExecutionsArgs {
    /// Executor address.
    #[arg(long, global = true, env = "AGENTMESH_EXECUTOR_URL", default_value = DEFAULT_EXECUTOR)]
    executor: String,
    #[command(subcommand)]
    command: ExecutionsCommand,
}

#[derive(Subcommand, Debug)]
enum ExecutionsCommand {
    /// List executions, newest first.
    List {
        /// Only these statuses: pending, running, completed, failed, cancelled (repeatable).
        #[arg(long = "status")]
        statuses: Vec<String>,
        /// Only executions of this request id.
        #[arg(long)]
        request_id: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Show one execution, its plan and every step's result, as JSON.
    Get {
        /// Execution id.
        id: String,
    },
    /// Follow an execution's events until it ends.
    Watch {
        /// Execution id.
        id: String,
        /// Only events after this sequence number (0: from the start).
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Cancel an execution.
    Cancel {
        /// Execution id.
        id: String,
        /// Why (recorded in its events).
        #[arg(long, default_value = "cancelled from the command line")]
        reason: String,
    },
}

async fn client(url: &str) -> anyhow::Result<ExecutorServiceClient<TracedChannel>> {
    Ok(ExecutorServiceClient::new(crate::connect::connect(url, "the executor", "agentmesh serve executor").await?)
        .max_decoding_message_size(64 << 20))
}

fn kind_name(kind: i32) -> &'static str {
    pb::ExecutionEventKind::try_from(kind)
        .map(|k| k.as_str_name().trim_start_matches("EXECUTION_EVENT_KIND_"))
        .unwrap_or("UNKNOWN")
}

fn status_name(status: i32) -> String {
    pb::ExecutionStatus::try_from(status)
        .map(|s| s.as_str_name().trim_start_matches("EXECUTION_STATUS_").to_lowercase())
        .unwrap_or_else(|_| "unknown".into())
}

/// One line per event, for a human following along.
fn describe(event: &pb::ExecutionEvent) -> String {
    let kind = pb::ExecutionEventKind::try_from(event.kind).unwrap_or_default();
    let step = &event.step_id;
    match kind {
        pb::ExecutionEventKind::ExecutionStarted => format!("execution {} started", event.execution_id),
        pb::ExecutionEventKind::StepStarted => {
            format!("{step} started on {} (attempt {})", event.agent_id, event.attempt)
        }
        pb::ExecutionEventKind::StepRetrying => {
            format!("{step} attempt {} failed, retrying in {} ms: {}", event.attempt, event.retry_delay_ms, event.error)
        }
        pb::ExecutionEventKind::StepSucceeded => {
            let mut line = format!("{step} succeeded in {} ms", event.duration_ms);
            if let Some(c) = &event.collaborate {
                line.push_str(&format!(" and asks {}:{} to \"{}\"", c.agent, c.capability, c.query));
            }
            line
        }
        pb::ExecutionEventKind::StepFailed => format!("{step} failed: {}", event.error),
        pb::ExecutionEventKind::StepSkipped => format!("{step} skipped: {}", event.error),
        pb::ExecutionEventKind::StepCancelled => format!("{step} cancelled"),
        pb::ExecutionEventKind::PlanExtended => {
            let added: Vec<String> =
                event.added_steps.iter().map(|s| format!("{} ({}:{})", s.step_id, s.agent, s.capability)).collect();
            format!("plan extended for {step}: {}", added.join(", "))
        }
        pb::ExecutionEventKind::ReplanRejected => format!("collaboration asked by {step} rejected: {}", event.error),
        pb::ExecutionEventKind::ExecutionCompleted => "execution completed".into(),
        pb::ExecutionEventKind::ExecutionFailed => format!("execution failed: {}", event.error),
        pb::ExecutionEventKind::ExecutionCancelled => format!("execution cancelled: {}", event.error),
        pb::ExecutionEventKind::ExecutionExtended => {
            let added: Vec<String> =
                event.added_steps.iter().map(|s| format!("{} ({}:{})", s.step_id, s.agent, s.capability)).collect();
            format!("execution extended ({}): {}", event.error, added.join(", "))
        }
        pb::ExecutionEventKind::StepProgress => {
            let Some(p) = &event.progress else { return format!("{step} progress") };
            let done = match p.total {
                Some(total) if total > 0.0 => format!("{}/{total}", p.progress),
                _ => p.progress.to_string(),
            };
            if p.message.is_empty() {
                format!("{step} progress {done}")
            } else {
                format!("{step} progress {done}: {}", p.message)
            }
        }
        pb::ExecutionEventKind::Unspecified => format!("{} {step}", kind_name(event.kind)),
    }
}

/// Prints events as they come; returns the final one.
async fn follow(
    mut events: impl tokio_stream::Stream<Item = Result<pb::ExecutionEvent, tonic::Status>> + Unpin,
) -> anyhow::Result<Option<pb::ExecutionEvent>> {
    let started = Instant::now();
    let mut last: Option<pb::ExecutionEvent> = None;
    while let Some(event) = events.next().await {
        let event = event.map_err(|s| {
            let error = crate::connect::rpc_error(&s);
            match &last {
                // The execution is stored: it goes on (on this executor
                // when it restarts, or on another replica).
                Some(seen) => error.context(format!(
                    "the stream broke after event #{seq} of execution {id}; the execution itself is durable: \
                     follow it with `agentmesh executions watch {id} --after {seq}`",
                    seq = seen.sequence,
                    id = seen.execution_id
                )),
                None => error,
            }
        })?;
        eprintln!("[{:>7} ms] #{:<4} {}", started.elapsed().as_millis(), event.sequence, describe(&event));
        last = Some(event);
    }
    Ok(last)
}

fn read(path: &PathBuf) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the plan from stdin")
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// Runs a plan file and follows it; fails unless the execution completes.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let text = read(&args.plan)?;
    let plan = parse_plan_document(&text).map_err(|e| anyhow::anyhow!("{} is not a plan: {e}", args.plan.display()))?;
    // With an execution id, the request id follows from it, so that the
    // same command run again attaches to the execution it started.
    let request_id = match &args.execution_id {
        Some(id) => format!("req_{:016x}", fnv1a(id.as_bytes())),
        None => format!("req_{:016x}", rand::random::<u64>()),
    };
    let mut request = tonic::Request::new(pb::ExecuteRequest {
        request_id: request_id.clone(),
        plan: Some(plan_to_pb(&plan)),
        options: Some(pb::ExecutionOptions {
            max_concurrency: args.max_concurrency.unwrap_or(0),
            step_timeout_ms: args.step_timeout_ms.unwrap_or(0),
            max_retries: args.max_retries,
            replan_budget: args.replan_budget,
        }),
        caller_agent_ids: args.callers,
        query: args.query,
        execution_id: args.execution_id.unwrap_or_default(),
        ..Default::default()
    });
    if let Ok(value) = request_id.parse() {
        request.metadata_mut().insert("x-request-id", value);
    }
    let mut client = client(&args.executor).await?;
    let events = client
        .execute(request)
        .await
        .map_err(|s| crate::connect::rpc_error(&s).context(format!("request {request_id}")))?
        .into_inner()
        .map(|r| r.map(|r| r.event.unwrap_or_default()));
    let last = follow(events).await?.context("the executor sent no event")?;
    let execution = client
        .get_execution(pb::GetExecutionRequest { execution_id: last.execution_id.clone() })
        .await
        .map_err(|s| crate::connect::rpc_error(&s))?
        .into_inner()
        .execution
        .unwrap_or_default();
    let outputs: serde_json::Map<String, Value> = execution
        .step_results
        .iter()
        .filter_map(|r| r.output.as_ref().map(|o| (r.step_id.clone(), from_value(o))))
        .collect();
    let status = status_name(execution.status);
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "execution_id": execution.id, "request_id": request_id, "status": status, "outputs": outputs,
            "error": execution.error,
        }))?
    );
    anyhow::ensure!(status == "completed", "execution {} {status}: {}", execution.id, execution.error);
    Ok(())
}

/// FNV-1a, 64 bits: a stable request id for an execution id.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

fn execution_json(e: &pb::Execution) -> Value {
    let steps: Vec<Value> = e
        .step_results
        .iter()
        .map(|r| {
            json!({
                "step_id": r.step_id,
                "status": pb::StepStatus::try_from(r.status).map(|s| s.as_str_name().trim_start_matches("STEP_STATUS_").to_lowercase()).unwrap_or_default(),
                "attempts": r.attempts,
                "duration_ms": r.duration_ms,
                "output": r.output.as_ref().map(from_value),
                "error": r.error,
            })
        })
        .collect();
    let plan_steps: Vec<Value> = e
        .plan
        .as_ref()
        .map(|p| {
            p.steps
                .iter()
                .map(|s| json!({"step_id": s.step_id, "agent": s.agent, "capability": s.capability, "depends_on": s.depends_on}))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "id": e.id, "request_id": e.request_id, "status": status_name(e.status), "error": e.error,
        "last_sequence": e.last_sequence, "replans_used": e.replans_used, "trace_id": e.trace_id,
        "plan": plan_steps, "steps": steps,
    })
}

/// Runs an `executions` command.
pub async fn executions(args: ExecutionsArgs) -> anyhow::Result<()> {
    let mut client = client(&args.executor).await?;
    match args.command {
        ExecutionsCommand::List { statuses, request_id, limit } => {
            let mut codes = Vec::new();
            for status in statuses {
                let name = format!("EXECUTION_STATUS_{}", status.to_uppercase());
                let code = pb::ExecutionStatus::from_str_name(&name).with_context(|| {
                    format!("unknown status `{status}`: use pending, running, completed, failed or cancelled")
                })?;
                codes.push(code as i32);
            }
            let list = client
                .list_executions(pb::ListExecutionsRequest {
                    statuses: codes,
                    request_id: request_id.unwrap_or_default(),
                    page_size: limit,
                    page_token: String::new(),
                })
                .await
                .map_err(|s| crate::connect::rpc_error(&s))?
                .into_inner();
            println!("{:<24} {:<10} {:>5} {:>6} {:<26} REQUEST", "EXECUTION", "STATUS", "STEPS", "EVENTS", "CREATED");
            for e in &list.executions {
                let created = e
                    .created_at
                    .as_ref()
                    .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default();
                println!(
                    "{:<24} {:<10} {:>5} {:>6} {:<26} {}",
                    e.id,
                    status_name(e.status),
                    e.steps,
                    e.last_sequence,
                    created,
                    e.request_id
                );
            }
        }
        ExecutionsCommand::Get { id } => {
            let execution = client
                .get_execution(pb::GetExecutionRequest { execution_id: id })
                .await
                .map_err(|s| crate::connect::rpc_error(&s))?
                .into_inner()
                .execution
                .unwrap_or_default();
            println!("{}", serde_json::to_string_pretty(&execution_json(&execution))?);
        }
        ExecutionsCommand::Watch { id, after } => {
            let events = client
                .watch_execution(pb::WatchExecutionRequest { execution_id: id, from_sequence: after })
                .await
                .map_err(|s| crate::connect::rpc_error(&s))?
                .into_inner()
                .map(|r| r.map(|r| r.event.unwrap_or_default()));
            follow(events).await?;
        }
        ExecutionsCommand::Cancel { id, reason } => {
            let execution = client
                .cancel_execution(pb::CancelExecutionRequest { execution_id: id, reason })
                .await
                .map_err(|s| crate::connect::rpc_error(&s))?
                .into_inner()
                .execution
                .unwrap_or_default();
            println!("{} {}", execution.id, status_name(execution.status));
        }
    }
    Ok(())
}
