//! The JSON form of an orchestration's messages, for REST and SSE: the
//! same fields as the protobuf messages, enums as lowercase names without
//! their prefix (`step_succeeded`, `add_step`).

use agentmesh_proto::convert::plan_from_pb;
use agentmesh_proto::json::from_value;
use agentmesh_proto::v1 as pb;
use pb::orchestrate_response::Event;
use serde_json::{Value, json};

fn enum_name(full: &str, prefix: &str) -> String {
    full.strip_prefix(prefix).unwrap_or(full).to_ascii_lowercase()
}

/// A plan as the plan JSON.
pub fn plan(plan: &pb::Plan) -> Value {
    serde_json::to_value(plan_from_pb(plan)).unwrap_or(Value::Null)
}

fn stats(s: &pb::PlanningStats) -> Value {
    json!({
        "llm_calls": s.llm_calls,
        "retries": s.retries,
        "hallucinations_detected": s.hallucinations_detected,
        "hallucinations_recovered": s.hallucinations_recovered,
        "preselected_capabilities": s.preselected_capabilities,
        "catalog_size": s.catalog_size,
        "latency_ms": s.latency_ms,
        "model": s.model,
        "provider": s.provider,
        "structured_output_mode": s.structured_output_mode,
    })
}

fn collaboration(c: &pb::CollaborationRequest) -> Value {
    json!({"agent": c.agent, "capability": c.capability, "query": c.query})
}

/// An executor event.
pub fn execution_event(e: &pb::ExecutionEvent) -> Value {
    let kind = pb::ExecutionEventKind::try_from(e.kind).unwrap_or_default();
    let mut out = json!({
        "execution_id": e.execution_id,
        "sequence": e.sequence,
        "kind": enum_name(kind.as_str_name(), "EXECUTION_EVENT_KIND_"),
    });
    let fields = [
        ("step_id", (!e.step_id.is_empty()).then(|| json!(e.step_id))),
        ("agent_id", (!e.agent_id.is_empty()).then(|| json!(e.agent_id))),
        ("attempt", (e.attempt > 0).then(|| json!(e.attempt))),
        ("output", e.output.as_ref().map(from_value)),
        ("error", (!e.error.is_empty()).then(|| json!(e.error))),
        ("duration_ms", (e.duration_ms > 0).then(|| json!(e.duration_ms))),
        ("retry_delay_ms", (e.retry_delay_ms > 0).then(|| json!(e.retry_delay_ms))),
        ("collaborate", e.collaborate.as_ref().map(collaboration)),
        (
            "progress",
            e.progress.as_ref().map(|p| {
                let mut progress = json!({"progress": p.progress});
                if let Some(total) = p.total {
                    progress["total"] = json!(total);
                }
                if !p.message.is_empty() {
                    progress["message"] = json!(p.message);
                }
                progress
            }),
        ),
        (
            "added_steps",
            (!e.added_steps.is_empty())
                .then(|| plan(&pb::Plan { reasoning: String::new(), steps: e.added_steps.clone() })["steps"].clone()),
        ),
    ];
    for (key, value) in fields {
        if let Some(value) = value {
            out[key] = value;
        }
    }
    out
}

/// A review.
pub fn review(r: &pb::Review) -> Value {
    let actions: Vec<Value> = r
        .recovery_actions
        .iter()
        .map(|a| {
            let kind = pb::RecoveryActionKind::try_from(a.kind).unwrap_or_default();
            let mut action =
                json!({"kind": enum_name(kind.as_str_name(), "RECOVERY_ACTION_KIND_"), "reason": a.reason});
            if let Some(c) = &a.collaboration {
                action["collaboration"] = collaboration(c);
            }
            if !a.step_id.is_empty() {
                action["step_id"] = json!(a.step_id);
            }
            action
        })
        .collect();
    json!({
        "goal_achieved": r.goal_achieved,
        "confidence": r.confidence,
        "summary": r.summary,
        "missing_data": r.missing_data,
        "recovery_actions": actions,
        "unsupported_claims": r.unsupported_claims,
    })
}

/// The SSE event name and JSON data of one orchestration message: the
/// protobuf message's fields, the event under its own name
/// (`{"request_id", "round", "sequence", "plan_created": {…}}`).
pub fn message(m: &pb::OrchestrateResponse) -> (&'static str, Value) {
    let (name, payload) = match &m.event {
        Some(Event::PlanCreated(p)) => (
            "plan_created",
            json!({
                "plan": p.plan.as_ref().map(plan),
                "zero_step_reason": p.zero_step_reason,
                "stats": p.stats.as_ref().map(stats),
            }),
        ),
        Some(Event::ExecutionEvent(e)) => ("execution_event", execution_event(e)),
        Some(Event::SynthesisChunk(text)) => ("synthesis_chunk", json!({"text": text})),
        Some(Event::Review(r)) => ("review", review(r)),
        Some(Event::FinalAnswer(a)) => {
            let usage = a.usage.unwrap_or_default();
            let usage = json!({"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens});
            let answer = json!({"text": a.text, "goal_achieved": a.goal_achieved, "execution_id": a.execution_id,
                "usage": usage});
            ("final_answer", answer)
        }
        Some(Event::Error(e)) => ("error", json!({"code": e.code, "message": e.message, "service": e.service})),
        None => ("unknown", json!({})),
    };
    let mut data = json!({"request_id": m.request_id, "round": m.round, "sequence": m.sequence});
    data[name] = payload;
    (name, data)
}

/// One line saying what a message is, from its JSON form (`kind` and
/// the payload under it), for callers that show progress as text.
pub fn describe(kind: &str, payload: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    match kind {
        "plan_created" => {
            let steps: Vec<String> = payload["plan"]["steps"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| format!("{} {}:{}", text(&s["step_id"]), text(&s["agent"]), text(&s["capability"])))
                .collect();
            if steps.is_empty() {
                format!("plan: no step ({})", text(&payload["zero_step_reason"]))
            } else {
                format!("plan: {}", steps.join(", "))
            }
        }
        "execution_event" => {
            let mut line = text(&payload["kind"]);
            for (key, separator) in [("step_id", " "), ("error", ": ")] {
                if let Some(value) = payload[key].as_str().filter(|v| !v.is_empty()) {
                    line.push_str(separator);
                    line.push_str(value);
                }
            }
            if let Some(message) = payload["progress"]["message"].as_str() {
                line.push_str(": ");
                line.push_str(message);
            }
            line
        }
        "synthesis_chunk" => format!("answer: {}", text(&payload["text"])),
        "review" => format!(
            "review: goal {}",
            if payload["goal_achieved"].as_bool() == Some(true) { "achieved" } else { "not achieved" }
        ),
        "final_answer" => "answered".into(),
        "error" => format!("error in {}: {}", text(&payload["service"]), text(&payload["message"])),
        other => other.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_lowercase_kinds_and_only_the_fields_they_carry() {
        let event = pb::ExecutionEvent {
            execution_id: "exe_1".into(),
            sequence: 3,
            kind: pb::ExecutionEventKind::StepSucceeded as i32,
            step_id: "s1".into(),
            attempt: 1,
            output: Some(agentmesh_proto::json::to_value(&json!({"temp_c": 21}))),
            ..Default::default()
        };
        let m = pb::OrchestrateResponse {
            request_id: "req_1".into(),
            round: 0,
            sequence: 4,
            event: Some(Event::ExecutionEvent(event)),
        };
        let (name, data) = message(&m);
        assert_eq!(name, "execution_event");
        assert_eq!(
            data,
            json!({"request_id": "req_1", "round": 0, "sequence": 4, "execution_event": {"execution_id": "exe_1",
                "sequence": 3, "kind": "step_succeeded", "step_id": "s1", "attempt": 1, "output": {"temp_c": 21}}})
        );
    }
}
