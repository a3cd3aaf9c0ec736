//! The planning loop: pre-selection, generation with a schema built from the
//! allowed set, parsing, validation against the set shown to the model, and
//! bounded recovery. Every regenerated plan is validated again; whatever the
//! model does, the answer is a valid plan, a zero-step plan with a reason, or
//! an actionable error.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::plan::{
    AllowedCapability, Plan, PlanBounds, PlanError, PlanParseError, parse_plan, plan_schema, validate_plan,
};
use agentmesh_llm::{Completion, CompletionRequest, LlmError, LlmProvider, Message, ResponseSchema, StructuredMode};
use agentmesh_telemetry::{EVENT_LOG_TARGET, span_event};

use crate::prompt::{pair_id, plan_messages};
use agentmesh_core::bm25;

use crate::semantic::Semantic;

mod preselect;

/// Limits and thresholds of the planning loop.
#[derive(Debug, Clone)]
pub struct PlannerSettings {
    /// Above this many capabilities, an LLM call pre-selects the relevant ones.
    pub preselect_threshold: usize,
    /// Above this many, a lexical ranking narrows the catalog before that call.
    pub lexical_limit: usize,
    /// Retries after an answer that is not a plan.
    pub parse_retries: u32,
    /// Retries after a plan naming what was not offered.
    pub hallucination_retries: u32,
    /// Retries after other validation errors.
    pub validation_retries: u32,
    /// Temperature of the first planning call (0: the same request over the
    /// same catalog gets the same plan).
    pub temperature: f32,
    /// Temperature of retries.
    pub retry_temperature: f32,
    /// Most tokens any call may generate. A planning call asks for what the
    /// planning schema's bounds need when that is less.
    pub max_tokens: u32,
    /// How large a plan the planning schema admits.
    pub bounds: PlanBounds,
    /// Most capabilities pre-selection may keep.
    pub preselect_max: usize,
    /// With embeddings: below this relevance (0 to 1) for every
    /// capability, nothing fits and the plan has no step, without asking
    /// the model ([`agentmesh_core::hybrid`]); 0 turns the gate off.
    pub min_relevance: f64,
    /// With embeddings: how many of the best-ranked capabilities the
    /// pre-selection call chooses among (`lexical_limit` without).
    pub semantic_limit: usize,
}

impl Default for PlannerSettings {
    fn default() -> Self {
        Self {
            preselect_threshold: 20,
            lexical_limit: 60,
            parse_retries: 2,
            hallucination_retries: 1,
            validation_retries: 2,
            temperature: 0.0,
            retry_temperature: 0.0,
            max_tokens: 2048,
            bounds: PlanBounds::default(),
            preselect_max: 5,
            min_relevance: DEFAULT_MIN_RELEVANCE,
            semantic_limit: 10,
        }
    }
}

/// The default of [`PlannerSettings::min_relevance`].
pub const DEFAULT_MIN_RELEVANCE: f64 = 0.22;

/// Why the planner called an LLM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InteractionKind {
    /// Picking relevant capabilities from a large catalog.
    Preselection,
    /// The first planning call.
    Plan,
    /// A retry after a parse or validation error.
    PlanRetry,
    /// A retry after a hallucinated agent or capability.
    HallucinationRetry,
    /// Filling the steps of a collaboration request.
    Replan,
}

/// One LLM call, for the interaction log.
#[derive(Debug, Clone)]
pub struct Interaction {
    /// Why.
    pub kind: InteractionKind,
    /// The messages sent, rendered.
    pub prompt: String,
    /// The answer text (empty on error).
    pub response: String,
    /// Provider that answered (in a fallback chain, the one that did).
    pub provider: String,
    /// Model that answered.
    pub model: String,
    /// Structured-output mode used.
    pub structured_mode: Option<StructuredMode>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Completion tokens.
    pub completion_tokens: u32,
    /// Latency.
    pub latency: Duration,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// How a plan was obtained.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanStats {
    /// Capabilities offered by the catalog.
    pub catalog_size: usize,
    /// Capabilities kept by pre-selection (`None`: it did not run).
    pub preselected: Option<usize>,
    /// LLM calls made.
    pub llm_calls: u32,
    /// Planning retries.
    pub retries: u32,
    /// Retries after an answer that was not a plan.
    pub parse_retries: u32,
    /// Retries after other validation errors.
    pub validation_retries: u32,
    /// Retries after a hallucination.
    pub hallucination_retries: u32,
    /// Answers that could not be parsed as a plan.
    pub parse_errors: u32,
    /// Plans rejected for naming what was not offered.
    pub hallucinations_detected: u32,
    /// Hallucinations followed by a valid plan.
    pub hallucinations_recovered: u32,
    /// Pre-selections that failed and fell back to the whole catalog.
    pub preselection_fallbacks: u32,
    /// Answers cut off at the token limit.
    pub truncated_answers: u32,
    /// Steps that repeated an earlier one (same agent, capability and
    /// parameters) and were merged into it.
    pub repeated_steps_merged: u32,
}

/// A plan and how it came about.
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    /// The validated plan (zero steps: nothing available fits; see `reasoning`).
    pub plan: Plan,
    /// Counters.
    pub stats: PlanStats,
    /// Every LLM call made.
    pub interactions: Vec<Interaction>,
}

/// Why no plan could be produced.
#[derive(Debug, thiserror::Error)]
pub enum PlanningError {
    /// The LLM could not be called.
    #[error("the planning LLM failed: {error}")]
    Llm {
        /// What the provider answered.
        error: LlmError,
        /// Calls made until then, the failed one last (with its error).
        interactions: Vec<Interaction>,
        /// Counters until then.
        stats: PlanStats,
    },
    /// The model kept naming agents or capabilities that were not offered.
    #[error(
        "the model kept planning with {invented} that {verb} not available; available: {allowed}. \
         Register an agent that provides it, or rephrase the request"
    )]
    Hallucination {
        /// What it invented.
        invented: String,
        /// `is`/`are`.
        verb: &'static str,
        /// What was offered.
        allowed: String,
        /// Calls made until then.
        interactions: Vec<Interaction>,
        /// Counters until then.
        stats: PlanStats,
    },
    /// The model's answers stayed unusable.
    #[error("no valid plan after {attempts} attempts; last problems: {problems}")]
    Exhausted {
        /// Planning attempts.
        attempts: u32,
        /// The last answer's problems.
        problems: String,
        /// Calls made until then.
        interactions: Vec<Interaction>,
        /// Counters until then.
        stats: PlanStats,
    },
}

tokio::task_local! {
    static REQUEST_ID: String;
}

/// Runs `planning` with `request_id` attached to the engine's events
/// (`llm.hallucination_*`), which the service emits inside the request span.
pub async fn with_request_id<F: std::future::Future>(request_id: &str, planning: F) -> F::Output {
    REQUEST_ID.scope(request_id.to_owned(), planning).await
}

/// The request being planned on this task (empty outside [`with_request_id`]).
fn current_request_id() -> String {
    REQUEST_ID.try_with(String::clone).unwrap_or_default()
}

fn render(messages: &[Message]) -> String {
    messages.iter().map(|m| format!("[{:?}]\n{}", m.role, m.content)).collect::<Vec<_>>().join("\n\n")
}

/// Most steps for `query` over `allowed`: `max_steps`, and no more than
/// one per capability offered when the request names one item.
fn step_bound(max_steps: usize, query: &str, allowed: &[AllowedCapability]) -> usize {
    if bm25::names_several(query) { max_steps } else { max_steps.min(allowed.len().max(1)) }
}

/// The asks (with their best capability) that no step of `plan` serves.
fn unserved<'a>(plan: &Plan, asks: &'a [(String, AllowedCapability)]) -> Vec<&'a (String, AllowedCapability)> {
    asks.iter()
        .filter(|(_, c)| !plan.steps.iter().any(|s| s.agent == c.agent && s.capability == c.capability))
        .collect()
}

/// The planner.
pub struct Planner {
    settings: PlannerSettings,
    semantic: Option<Arc<Semantic>>,
}

struct Run<'a> {
    llm: &'a dyn LlmProvider,
    stats: PlanStats,
    interactions: Vec<Interaction>,
    /// Why nothing fits, when pre-selection decided so without the model.
    nothing_fits: Option<String>,
    /// The asks of a request joining several, each with its best
    /// capability: a plan serving only some of them is asked for again once.
    asks: Vec<(String, AllowedCapability)>,
}

impl Run<'_> {
    async fn call(
        &mut self,
        kind: InteractionKind,
        messages: Vec<Message>,
        schema: Option<ResponseSchema>,
        temperature: f32,
        max_tokens: u32,
    ) -> Result<Completion, LlmError> {
        let request = CompletionRequest {
            messages,
            temperature: Some(temperature),
            max_tokens: Some(max_tokens),
            response_schema: schema,
            ..Default::default()
        };
        self.stats.llm_calls += 1;
        let result = self.llm.complete(&request).await;
        let prompt = render(&request.messages);
        self.interactions.push(match &result {
            Ok(c) => Interaction {
                kind,
                prompt,
                response: c.text.clone(),
                provider: c.provider.clone(),
                model: c.model.clone(),
                structured_mode: c.structured_mode,
                prompt_tokens: c.usage.prompt_tokens,
                completion_tokens: c.usage.completion_tokens,
                latency: c.latency,
                error: None,
            },
            Err(e) => Interaction {
                kind,
                prompt,
                response: String::new(),
                provider: self.llm.name().to_owned(),
                model: self.llm.model().to_owned(),
                structured_mode: None,
                prompt_tokens: 0,
                completion_tokens: 0,
                latency: Duration::ZERO,
                error: Some(e.to_string()),
            },
        });
        result
    }
}

impl From<LlmError> for PlanningError {
    /// An LLM failure; the planner adds the calls made until then.
    fn from(error: LlmError) -> Self {
        Self::Llm { error, interactions: Vec::new(), stats: PlanStats::default() }
    }
}

impl Planner {
    /// A planner with these settings.
    pub fn new(settings: PlannerSettings) -> Self {
        Self { settings, semantic: None }
    }

    /// The same planner ranking candidates by meaning too (hybrid pre-selection).
    pub fn with_semantic(mut self, semantic: Arc<Semantic>) -> Self {
        self.semantic = Some(semantic);
        self
    }

    /// The catalog's vectors, when ranking by meaning.
    pub fn semantic(&self) -> Option<&Arc<Semantic>> {
        self.semantic.as_ref()
    }

    /// Plans `query` over `catalog` (already without the caller itself and
    /// internal capabilities).
    pub async fn plan(
        &self,
        llm: &dyn LlmProvider,
        query: &str,
        catalog: &[AllowedCapability],
    ) -> Result<PlanOutcome, PlanningError> {
        self.plan_as(llm, query, catalog, InteractionKind::Plan).await
    }

    /// Fills the steps of a collaboration request over the capabilities it
    /// names, validated like any plan.
    pub async fn replan(
        &self,
        llm: &dyn LlmProvider,
        query: &str,
        allowed: &[AllowedCapability],
    ) -> Result<PlanOutcome, PlanningError> {
        self.plan_as(llm, query, allowed, InteractionKind::Replan).await
    }

    async fn plan_as(
        &self,
        llm: &dyn LlmProvider,
        query: &str,
        catalog: &[AllowedCapability],
        first_kind: InteractionKind,
    ) -> Result<PlanOutcome, PlanningError> {
        let mut run = Run {
            llm,
            stats: PlanStats { catalog_size: catalog.len(), ..Default::default() },
            interactions: Vec::new(),
            nothing_fits: None,
            asks: Vec::new(),
        };
        match self.plan_in(&mut run, query, catalog, first_kind).await {
            // The calls made until the provider failed, the failed one with
            // its error, stay with the error so they can be logged.
            Err(PlanningError::Llm { error, .. }) => Err(PlanningError::Llm {
                error,
                interactions: std::mem::take(&mut run.interactions),
                stats: std::mem::take(&mut run.stats),
            }),
            other => other,
        }
    }

    async fn plan_in(
        &self,
        run: &mut Run<'_>,
        query: &str,
        catalog: &[AllowedCapability],
        first_kind: InteractionKind,
    ) -> Result<PlanOutcome, PlanningError> {
        if catalog.is_empty() {
            let plan = Plan { reasoning: "no capability is available to plan with".into(), steps: Vec::new() };
            return Ok(PlanOutcome {
                plan,
                stats: std::mem::take(&mut run.stats),
                interactions: std::mem::take(&mut run.interactions),
            });
        }
        // A collaboration request names its capabilities: no ranking.
        let mut allowed = if first_kind == InteractionKind::Replan {
            catalog.to_vec()
        } else {
            self.preselect(run, query, catalog).await?
        };
        if allowed.is_empty() {
            let reasoning = run
                .nothing_fits
                .take()
                .unwrap_or_else(|| "none of the available capabilities fits this request".into());
            let plan = Plan { reasoning, steps: Vec::new() };
            return Ok(PlanOutcome {
                plan,
                stats: std::mem::take(&mut run.stats),
                interactions: std::mem::take(&mut run.interactions),
            });
        }
        let (mut parse_left, mut hallucination_left, mut validation_left) =
            (self.settings.parse_retries, self.settings.hallucination_retries, self.settings.validation_retries);
        let mut feedback: Option<String> = None;
        let mut kind = first_kind;
        let mut hallucinated = false;
        let mut asks_retried = false;
        let mut attempts = 0;
        let mut bounds = self.settings.bounds;
        // A request that names one thing gets at most one step per
        // capability offered: the grammar has no room for a second call of
        // the one tool kept (the small model booked a meeting six times).
        // Whatever a model answers is still merged below.
        bounds.max_steps = step_bound(bounds.max_steps, query, &allowed);
        loop {
            attempts += 1;
            let schema = ResponseSchema { name: "plan".into(), schema: plan_schema(&allowed, &bounds) };
            let max_tokens = bounds.max_tokens(&allowed).min(self.settings.max_tokens);
            let temperature =
                if kind == first_kind { self.settings.temperature } else { self.settings.retry_temperature };
            let messages = plan_messages(query, &allowed, feedback.as_deref(), &bounds);
            let completion = run.call(kind, messages, Some(schema), temperature, max_tokens).await?;
            let parsed = parse_plan(&completion.text);
            if completion.truncated {
                run.stats.truncated_answers += 1;
                tracing::warn!(
                    max_tokens,
                    max_steps = bounds.max_steps,
                    parsed = parsed.is_ok(),
                    "the planning answer was cut off at the token limit; asking again for a shorter plan"
                );
            }
            let plan = match parsed {
                Ok(plan) => plan,
                Err(e) if parse_left > 0 => {
                    parse_left -= 1;
                    run.stats.parse_errors += 1;
                    run.stats.parse_retries += 1;
                    run.stats.retries += 1;
                    feedback = Some(if completion.truncated {
                        bounds = bounds.tighter();
                        format!(
                            "- your answer was cut off at {max_tokens} tokens. Write a shorter plan: at most {} \
                             steps, instructions under {} characters.",
                            bounds.max_steps, bounds.instruction_chars
                        )
                    } else {
                        format!("- {e}. Reply with the JSON plan only.")
                    });
                    kind = InteractionKind::PlanRetry;
                    continue;
                }
                Err(e) => {
                    run.stats.parse_errors += 1;
                    let problems = match e {
                        PlanParseError::NoJson | PlanParseError::Syntax(_) if completion.truncated => format!(
                            "the answer was cut off at the token limit ({max_tokens} tokens) before the plan ended"
                        ),
                        other => other.to_string(),
                    };
                    return Err(PlanningError::Exhausted {
                        attempts,
                        problems,
                        interactions: std::mem::take(&mut run.interactions),
                        stats: std::mem::take(&mut run.stats),
                    });
                }
            };
            let errors = match validate_plan(&plan, &allowed).and_then(|valid| {
                let unfilled = unfilled_placeholders(&valid);
                if unfilled.is_empty() { Ok(valid) } else { Err(unfilled) }
            }) {
                // A zero-step plan must say why nothing fits.
                Ok(valid) if valid.steps.is_empty() && valid.reasoning.trim().is_empty() && validation_left > 0 => {
                    validation_left -= 1;
                    run.stats.validation_retries += 1;
                    run.stats.retries += 1;
                    feedback =
                        Some("- a plan with no steps must say in `reasoning` why nothing listed can help\n".into());
                    kind = InteractionKind::PlanRetry;
                    continue;
                }
                // A request joining several asks, planned for only some.
                Ok(valid) if !asks_retried && !valid.steps.is_empty() && !unserved(&valid, &run.asks).is_empty() => {
                    asks_retried = true;
                    run.stats.validation_retries += 1;
                    run.stats.retries += 1;
                    let missing: Vec<String> = unserved(&valid, &run.asks)
                        .iter()
                        .map(|(ask, c)| {
                            format!("- the request also asks \"{ask}\": add a step for it ({})\n", pair_id(c))
                        })
                        .collect();
                    feedback = Some(missing.concat());
                    kind = InteractionKind::PlanRetry;
                    continue;
                }
                Ok(mut valid) => {
                    if valid.steps.is_empty() && valid.reasoning.trim().is_empty() {
                        valid.reasoning = "the model found no listed capability that fits and gave no reason".into();
                    }
                    // The same call twice would do its work twice (two emails sent).
                    for merged in agentmesh_core::repeats::merge_repeated_steps(&mut valid, query) {
                        run.stats.repeated_steps_merged += 1;
                        tracing::warn!(
                            request_id = current_request_id(),
                            removed = %merged.removed,
                            kept = %merged.kept,
                            agent = %merged.agent,
                            capability = %merged.capability,
                            "a plan step repeated an earlier call (same agent and capability, and the same parameters or none the request names): merged into it"
                        );
                    }
                    if hallucinated {
                        run.stats.hallucinations_recovered += 1;
                        let request_id = current_request_id();
                        let retries_used = run.stats.hallucination_retries;
                        span_event(
                            "llm.hallucination_recovered",
                            vec![("request_id", request_id.as_str().into()), ("retries_used", retries_used.into())],
                        );
                        tracing::info!(
                            name: "llm.hallucination_recovered",
                            target: EVENT_LOG_TARGET,
                            request_id,
                            retries_used,
                            operation = "plan",
                            steps = valid.steps.len(),
                            "llm.hallucination_recovered"
                        );
                    }
                    return Ok(PlanOutcome {
                        plan: valid,
                        stats: std::mem::take(&mut run.stats),
                        interactions: std::mem::take(&mut run.interactions),
                    });
                }
                Err(errors) => errors,
            };
            let listed: String = errors.iter().map(|e| format!("- {e}\n")).collect();
            let invented: Vec<&PlanError> = errors.iter().filter(|e| e.is_hallucination()).collect();
            if !invented.is_empty() {
                hallucinated = true;
                run.stats.hallucinations_detected += 1;
                let names: Vec<String> = invented.iter().map(|e| invented_name(e)).collect();
                let hallucinated_agent = invented.iter().find_map(|e| invented_agent(e)).unwrap_or_default();
                let request_id = current_request_id();
                let max_retries = self.settings.hallucination_retries;
                let (allowed_agent_count, hall_retry) =
                    (distinct_agents(&allowed), max_retries - hallucination_left + 1);
                span_event(
                    "llm.hallucination_detected",
                    vec![
                        ("request_id", request_id.as_str().into()),
                        ("hallucinated_agent", hallucinated_agent.into()),
                        ("allowed_agent_count", allowed_agent_count.into()),
                        ("hall_retry", hall_retry.into()),
                        ("max_hall_retries", max_retries.into()),
                        ("attempt", attempts.into()),
                        ("invented", names.join(", ").into()),
                    ],
                );
                tracing::warn!(
                    name: "llm.hallucination_detected",
                    target: EVENT_LOG_TARGET,
                    request_id,
                    hallucinated_agent,
                    allowed_agent_count,
                    hall_retry,
                    max_hall_retries = max_retries,
                    attempt = attempts,
                    operation = "plan",
                    invented = %names.join(", "),
                    problems = %listed.trim_end(),
                    "llm.hallucination_detected"
                );
                if hallucination_left == 0 {
                    span_event(
                        "llm.hallucination_unrecoverable",
                        vec![
                            ("request_id", request_id.as_str().into()),
                            ("hallucinated_agent", hallucinated_agent.into()),
                            ("retries_exhausted", max_retries.into()),
                        ],
                    );
                    tracing::error!(
                        name: "llm.hallucination_unrecoverable",
                        target: EVENT_LOG_TARGET,
                        request_id,
                        hallucinated_agent,
                        retries_exhausted = max_retries,
                        operation = "plan",
                        invented = %names.join(", "),
                        "llm.hallucination_unrecoverable"
                    );
                    return Err(PlanningError::Hallucination {
                        verb: if names.len() == 1 { "is" } else { "are" },
                        invented: names.join(", "),
                        allowed: allowed
                            .iter()
                            .map(|a| format!("{}:{}", a.agent, a.capability))
                            .collect::<Vec<_>>()
                            .join(", "),
                        interactions: std::mem::take(&mut run.interactions),
                        stats: std::mem::take(&mut run.stats),
                    });
                }
                hallucination_left -= 1;
                run.stats.hallucination_retries += 1;
                run.stats.retries += 1;
                // What the model tried becomes the hint for a new pre-selection.
                let tried: Vec<String> = plan
                    .steps
                    .iter()
                    .filter(|s| !allowed.iter().any(|a| a.agent == s.agent && a.capability == s.capability))
                    .map(|s| format!("{} {} {}", s.agent, s.capability, s.instruction))
                    .collect();
                let hint = format!("{query} {}", tried.join(" "));
                let reselected = self.preselect(run, &hint, catalog).await?;
                if !reselected.is_empty() {
                    allowed = reselected;
                    bounds.max_steps = step_bound(self.settings.bounds.max_steps, query, &allowed);
                }
                feedback = Some(format!(
                    "{listed}You may only use the capabilities listed below; if none fits, return zero steps with the reason."
                ));
                kind = InteractionKind::HallucinationRetry;
                continue;
            }
            if validation_left == 0 {
                return Err(PlanningError::Exhausted {
                    attempts,
                    problems: listed.trim_end().to_owned(),
                    interactions: std::mem::take(&mut run.interactions),
                    stats: std::mem::take(&mut run.stats),
                });
            }
            validation_left -= 1;
            run.stats.validation_retries += 1;
            run.stats.retries += 1;
            feedback = Some(listed);
            kind = InteractionKind::PlanRetry;
        }
    }
}

/// Parameters left as the prompt example's placeholder (`"<location>"`
/// for `location`): a small model copies the example instead of filling
/// them from the request.
fn unfilled_placeholders(plan: &Plan) -> Vec<PlanError> {
    let mut errors = Vec::new();
    for step in &plan.steps {
        let Some(parameters) = step.parameters.as_object() else { continue };
        let unfilled: Vec<String> = parameters
            .iter()
            .filter(|(name, value)| value.as_str() == Some(format!("<{name}>").as_str()))
            .map(|(name, _)| format!("/{name}: still the placeholder `<{name}>`; fill it from the request"))
            .collect();
        if !unfilled.is_empty() {
            errors.push(PlanError::InvalidParameters { step: step.step_id.clone(), errors: unfilled });
        }
    }
    errors
}

/// The agent a hallucination named (the agent of an invented capability too).
fn invented_agent(e: &PlanError) -> Option<&str> {
    match e {
        PlanError::UnknownAgent { agent, .. } | PlanError::UnknownCapability { agent, .. } => Some(agent),
        _ => None,
    }
}

/// How many agents the model was shown.
fn distinct_agents(allowed: &[AllowedCapability]) -> usize {
    allowed.iter().map(|a| a.agent.as_str()).collect::<HashSet<_>>().len()
}

fn invented_name(e: &PlanError) -> String {
    match e {
        PlanError::UnknownAgent { agent, .. } => format!("agent `{agent}`"),
        PlanError::UnknownCapability { agent, capability, .. } => format!("capability `{agent}:{capability}`"),
        other => other.to_string(),
    }
}
