//! LLM calls as client spans with the OpenTelemetry GenAI conventions:
//! provider, requested and answering model, token usage; prompts and
//! completions only when the process enables it (they may hold personal
//! data).

use tracing::Instrument;
use tracing::field::Empty;

use crate::OnText;
use crate::{Completion, CompletionRequest, LlmError, LlmProvider};

/// Calls `provider` inside a `chat {model}` span.
pub async fn generate_traced(
    provider: &dyn LlmProvider,
    request: &CompletionRequest,
    on_text: OnText<'_>,
) -> Result<Completion, LlmError> {
    let model = request.model.as_deref().unwrap_or_else(|| provider.model()).to_owned();
    let span = tracing::debug_span!(
        "gen_ai.chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.system = provider.name(),
        gen_ai.request.model = %model,
        gen_ai.request.temperature = Empty,
        gen_ai.request.max_tokens = Empty,
        gen_ai.response.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.structured_output = Empty,
        gen_ai.prompt = Empty,
        gen_ai.completion = Empty,
        error.type = Empty,
    );
    if !span.is_disabled() {
        if let Some(t) = request.temperature {
            span.record("gen_ai.request.temperature", f64::from(t));
        }
        if let Some(n) = request.max_tokens {
            span.record("gen_ai.request.max_tokens", n);
        }
        if agentmesh_telemetry::capture_llm_content() {
            span.record("gen_ai.prompt", serde_json::to_string(&request.messages).unwrap_or_default());
        }
    }
    let result = provider.generate(request, on_text).instrument(span.clone()).await;
    match &result {
        Ok(completion) => {
            span.record("gen_ai.response.model", completion.model.as_str());
            span.record("gen_ai.usage.input_tokens", completion.usage.prompt_tokens);
            span.record("gen_ai.usage.output_tokens", completion.usage.completion_tokens);
            if let Some(mode) = completion.structured_mode {
                span.record("gen_ai.structured_output", mode.as_str());
            }
            if agentmesh_telemetry::capture_llm_content() {
                span.record("gen_ai.completion", completion.text.as_str());
            }
        }
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", error_type(e));
        }
    }
    result
}

fn error_type(e: &LlmError) -> &'static str {
    match e {
        LlmError::BadRequest { .. } => "bad_request",
        LlmError::Auth { .. } => "auth",
        LlmError::Unavailable { .. } => "unavailable",
        LlmError::InvalidResponse(_) => "invalid_response",
        LlmError::Config(_) => "config",
    }
}
