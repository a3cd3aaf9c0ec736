//! What synthesis and review ask of the model, and what they accept back.
//! Nothing here does I/O: the service feeds in the outcome of a run and the
//! catalog, sends the requests built here, and reads the answers with
//! [`Synthesizer::read_review`].
//!
//! Three rules hold whatever the model does:
//! - every piece of text that came from outside (the query, step outputs,
//!   errors, descriptions) is fenced as data ([`Fence`]);
//! - what could not be done is always said: a zero-step plan or a run
//!   where nothing succeeded is answered without the model, and failed steps
//!   are listed after the model's answer;
//! - a review's recovery action is kept only when it can be acted on: an
//!   `add_step` naming a capability in the catalog, a `retry_step` naming a
//!   step that did not succeed.

use std::collections::HashSet;
use std::fmt::Write as _;

use agentmesh_core::fence::Fence;
use agentmesh_core::plan::{AllowedCapability, PlanStep, extract_json};
use agentmesh_llm::{CompletionRequest, Message, ResponseSchema};
use serde_json::{Value, json};

/// Tuning of synthesis and review.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthesisSettings {
    /// Most tokens of an answer.
    pub answer_max_tokens: u32,
    /// Most tokens of a review.
    pub review_max_tokens: u32,
    /// Sampling temperature of answers (reviews use 0).
    pub temperature: f32,
    /// Longest step output shown to the model, in characters (longer ones
    /// are cut, and the prompt says so).
    pub max_output_chars: usize,
    /// Most capabilities a review may suggest from (the best matches for the
    /// query when the catalog is larger).
    pub review_catalog_size: usize,
    /// Further attempts after a review that could not be read.
    pub review_retries: u32,
    /// Most facts (leaf values of the step outputs) listed for the model.
    pub max_facts: usize,
    /// Replace an answer that states values found neither in the results
    /// nor in the request by an answer made of the facts (for small models,
    /// which do not keep to the results); the answer is then sent whole,
    /// not streamed.
    pub replace_ungrounded: bool,
}

impl Default for SynthesisSettings {
    fn default() -> Self {
        Self {
            answer_max_tokens: 1024,
            review_max_tokens: 600,
            temperature: 0.2,
            max_output_chars: 4_000,
            review_catalog_size: 30,
            review_retries: 1,
            max_facts: 30,
            replace_ungrounded: false,
        }
    }
}

/// Where a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepState {
    /// The agent answered.
    Succeeded,
    /// The step failed after its last attempt.
    Failed,
    /// Not run because a dependency did not succeed.
    Skipped,
    /// Stopped by a cancellation.
    Cancelled,
    /// No final result was given for it.
    Unfinished,
}

impl StepState {
    fn describe(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Skipped => "was skipped",
            Self::Cancelled => "was cancelled",
            Self::Unfinished => "did not finish",
        }
    }
}

/// One step and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// The step as planned.
    pub step: PlanStep,
    /// Where it ended.
    pub state: StepState,
    /// Its output, when it succeeded.
    pub output: Option<Value>,
    /// Why it did not succeed.
    pub error: String,
}

/// What a run produced, as synthesis and review see it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunOutcome {
    /// The user's request.
    pub query: String,
    /// The steps in plan order.
    pub steps: Vec<StepOutcome>,
    /// Why the plan has no steps, when it has none.
    pub zero_step_reason: String,
}

impl RunOutcome {
    /// The steps that did not succeed and were not made good later: a step
    /// whose tool (agent and capability) succeeded in a later step (a
    /// recovery round's retry) counts as done.
    fn not_succeeded(&self) -> impl Iterator<Item = &StepOutcome> {
        self.steps
            .iter()
            .enumerate()
            .filter(|(i, s)| s.state != StepState::Succeeded && !self.made_good(*i))
            .map(|(_, s)| s)
    }

    fn made_good(&self, index: usize) -> bool {
        let failed = &self.steps[index].step;
        self.steps[index + 1..].iter().any(|later| {
            later.state == StepState::Succeeded
                && later.step.agent == failed.agent
                && later.step.capability == failed.capability
        })
    }
}

/// How an answer is produced.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerPlan {
    /// No model needed: nothing ran or nothing succeeded; this is the answer.
    Direct(String),
    /// Ask the model, then append `footer` (the steps that did not succeed).
    Model {
        /// The request to stream.
        request: Box<CompletionRequest>,
        /// Text appended after the model's answer.
        footer: Option<String>,
        /// What the answer must keep to.
        grounding: Grounding,
    },
}

/// What an answer must keep to: the texts its values must be found in
/// (the step outputs, the request), and the facts to answer with instead.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Grounding {
    /// The step outputs as JSON text, and the request.
    pub sources: Vec<String>,
    /// The step outputs' leaf values.
    pub facts: Vec<agentmesh_core::grounding::Fact>,
}

impl Grounding {
    /// What `outcome`'s answers must keep to.
    pub fn of(outcome: &RunOutcome, max_facts: usize) -> Self {
        let outputs: Vec<(&str, &Value)> = outcome
            .steps
            .iter()
            .filter(|s| s.state == StepState::Succeeded)
            .filter_map(|s| s.output.as_ref().map(|o| (s.step.step_id.as_str(), o)))
            .collect();
        let mut sources: Vec<String> = outputs.iter().map(|(_, o)| o.to_string()).collect();
        sources.push(outcome.query.clone());
        Self { sources, facts: agentmesh_core::grounding::facts(&outputs, max_facts) }
    }

    /// The values `answer` states that the results and the request do not.
    pub fn unsupported_claims(&self, answer: &str) -> Vec<String> {
        let sources: Vec<&str> = self.sources.iter().map(String::as_str).collect();
        agentmesh_core::grounding::unsupported_claims(answer, &sources)
    }

    /// Whether `answer` states at least one of the facts (true when there
    /// are none): one of the numbers, when the results hold numbers, as
    /// they are what a small model's generic answer leaves out ("The
    /// weather in Chicago is sunny" for a result of 21 °C and sunny).
    pub fn uses_facts(&self, answer: &str) -> bool {
        use agentmesh_core::grounding::{has_number, states};
        let numeric: Vec<&agentmesh_core::grounding::Fact> =
            self.facts.iter().filter(|f| has_number(&f.value)).collect();
        if numeric.is_empty() {
            self.facts.is_empty() || self.facts.iter().any(|f| states(answer, f))
        } else {
            numeric.iter().any(|f| states(answer, f))
        }
    }
}

/// The kinds of recovery a review may suggest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run another capability.
    AddStep {
        /// Agent id (in the catalog).
        agent: String,
        /// Capability id (of that agent, in the catalog).
        capability: String,
        /// What the new step should do.
        query: String,
        /// Why it helps.
        reason: String,
    },
    /// Run a step that did not succeed again.
    RetryStep {
        /// The step.
        step_id: String,
        /// Why it helps.
        reason: String,
    },
    /// Only the user can supply what is missing.
    AskUser {
        /// What to ask.
        reason: String,
    },
}

/// A review as read from the model and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Whether the results answer the request.
    pub goal_achieved: bool,
    /// From 0 to 1.
    pub confidence: f64,
    /// What was and was not achieved.
    pub summary: String,
    /// What the user asked for that is not in the results.
    pub missing_data: Vec<String>,
    /// What to do next (empty when the goal was achieved).
    pub actions: Vec<Action>,
    /// Suggestions that were dropped, each with the reason.
    pub dropped: Vec<String>,
    /// Values the answer states that neither the results nor the request
    /// contain (found by comparing, not by the model).
    pub unsupported_claims: Vec<String>,
}

/// Builds prompts and reads answers.
#[derive(Debug, Clone, Default)]
pub struct Synthesizer {
    settings: SynthesisSettings,
}

fn truncate_chars(text: &str, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        Some((cut, _)) => (text[..cut].to_owned(), true),
        None => (text.to_owned(), false),
    }
}

/// `agent/capability` of a step.
fn tool(step: &PlanStep) -> String {
    format!("{}/{}", step.agent, step.capability)
}

/// The steps that did not succeed, one line each (for users, not models).
fn failure_lines(outcome: &RunOutcome) -> String {
    let mut out = String::new();
    for s in outcome.not_succeeded() {
        let _ = write!(out, "\n- {} ({}) {}", s.step.step_id, tool(&s.step), s.state.describe());
        if !s.error.trim().is_empty() {
            let _ = write!(out, ": {}", s.error.trim());
        }
    }
    out
}

impl Synthesizer {
    /// A synthesizer with these settings.
    pub fn new(settings: SynthesisSettings) -> Self {
        Self { settings }
    }

    /// The settings in use.
    pub fn settings(&self) -> &SynthesisSettings {
        &self.settings
    }

    /// The results section of a prompt: each step, how it ended, and its
    /// output or error fenced as data.
    fn results_text(&self, outcome: &RunOutcome, fence: &Fence) -> String {
        let mut out = String::new();
        for s in &outcome.steps {
            let _ = write!(out, "\nStep {} ({}) {}", s.step.step_id, tool(&s.step), s.state.describe());
            if !s.step.instruction.trim().is_empty() {
                let _ =
                    write!(out, "; it was asked to: {}", agentmesh_core::fence::neutralise(s.step.instruction.trim()));
            }
            match (&s.state, &s.output) {
                (StepState::Succeeded, Some(output)) => {
                    let text = match output {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let (text, cut) = truncate_chars(&text, self.settings.max_output_chars);
                    let label = if cut { "output (cut short)" } else { "output" };
                    let _ = write!(out, ".\n{}\n", fence.wrap(&format!("{label} of {}", s.step.step_id), &text));
                }
                (StepState::Succeeded, None) => out.push_str(", with no output.\n"),
                _ if !s.error.trim().is_empty() => {
                    let (text, _) = truncate_chars(s.error.trim(), 500);
                    let _ = write!(out, ".\n{}\n", fence.wrap(&format!("error of {}", s.step.step_id), &text));
                }
                _ => out.push_str(".\n"),
            }
        }
        out
    }

    /// How to answer `outcome`.
    pub fn answer(&self, outcome: &RunOutcome, fence: &Fence) -> AnswerPlan {
        if outcome.steps.is_empty() {
            let reason = outcome.zero_step_reason.trim();
            let reason = if reason.is_empty() { "the planner gave no reason" } else { reason };
            return AnswerPlan::Direct(format!(
                "Nothing was run for this request: none of the available tools can do it. Reason: {reason}"
            ));
        }
        if outcome.steps.iter().all(|s| s.state != StepState::Succeeded) {
            return AnswerPlan::Direct(format!(
                "The request could not be answered: none of its steps succeeded.{}",
                failure_lines(outcome)
            ));
        }
        let system = format!(
            "You write the final answer to a user's request from the results of the tools that were run for it. \
             Answer the request directly and briefly, in plain text. Use the listed facts and state their values \
             exactly as written; never invent values. If a step failed, say what could not be found out. {}",
            fence.rule()
        );
        let grounding = Grounding::of(outcome, self.settings.max_facts);
        let facts = agentmesh_core::grounding::fact_lines(&grounding.facts);
        let user = format!(
            "The request:\n{}\n\nThe results:{}\nFacts to use:\n{}\n\nWrite the answer to the request.",
            fence.wrap("request", &outcome.query),
            self.results_text(outcome, fence),
            fence.wrap("facts", &facts)
        );
        let failures = failure_lines(outcome);
        AnswerPlan::Model {
            request: Box::new(CompletionRequest {
                messages: vec![Message::system(system), Message::user(user)],
                temperature: Some(self.settings.temperature),
                max_tokens: Some(self.settings.answer_max_tokens),
                ..Default::default()
            }),
            footer: (!failures.is_empty()).then(|| format!("\n\nNot done:{failures}")),
            grounding,
        }
    }

    /// The capabilities a review may suggest: all of them when few, else
    /// the best matches for the query.
    pub fn review_candidates<'c>(&self, query: &str, catalog: &'c [AllowedCapability]) -> Vec<&'c AllowedCapability> {
        if catalog.len() <= self.settings.review_catalog_size {
            return catalog.iter().collect();
        }
        agentmesh_core::bm25::rank(query, catalog)
            .into_iter()
            .take(self.settings.review_catalog_size)
            .map(|(i, _)| &catalog[i])
            .collect()
    }

    /// The schema of a review: the summary first (a small model reasons in
    /// it before it judges), then the judgement; names limited to what can
    /// be acted on.
    pub fn review_schema(&self, outcome: &RunOutcome, candidates: &[&AllowedCapability]) -> Value {
        let mut agents: Vec<&str> = candidates.iter().map(|c| c.agent.as_str()).collect();
        agents.sort_unstable();
        agents.dedup();
        agents.push("");
        let mut capabilities: Vec<&str> = candidates.iter().map(|c| c.capability.as_str()).collect();
        capabilities.sort_unstable();
        capabilities.dedup();
        capabilities.push("");
        let mut steps: Vec<&str> = outcome.not_succeeded().map(|s| s.step.step_id.as_str()).collect();
        steps.push("");
        json!({
            "type": "object",
            // The summary first, so that a small model states what it found
            // before it judges; the verdict before the lists, so that an
            // answer cut off at the token limit still carries it (see
            // `close_cut_json`).
            "properties": {
                "summary": {"type": "string", "minLength": 1, "maxLength": 400},
                "goal_achieved": {"type": "boolean"},
                "confidence": {"type": "number"},
                "missing_data": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 200}, "maxItems": 5},
                "recovery_actions": {"type": "array", "maxItems": 3, "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"type": "string", "enum": ["add_step", "retry_step", "ask_user"]},
                        "agent": {"type": "string", "enum": agents},
                        "capability": {"type": "string", "enum": capabilities},
                        "step_id": {"type": "string", "enum": steps},
                        "query": {"type": "string", "maxLength": 300},
                        "reason": {"type": "string", "minLength": 1, "maxLength": 200}
                    },
                    "required": ["kind", "agent", "capability", "step_id", "query", "reason"],
                    "additionalProperties": false
                }}
            },
            "required": ["summary", "goal_achieved", "confidence", "missing_data", "recovery_actions"],
            "additionalProperties": false
        })
    }

    /// The review request for `outcome` and its `answer`.
    pub fn review_request(
        &self,
        outcome: &RunOutcome,
        answer: &str,
        candidates: &[&AllowedCapability],
        fence: &Fence,
    ) -> CompletionRequest {
        let system = format!(
            "You review whether the results of a run achieve the user's request. Judge only from the results. \
             Answer with one short JSON object: summary (one sentence: what was and was not achieved), \
             goal_achieved (true or false), confidence (0 to 1), missing_data (what the user asked for that the \
             results do not contain), and recovery_actions (empty when the goal was achieved). A recovery action is add_step (run one of \
             the listed tools: set agent, capability and query), retry_step (run a step that did not succeed \
             again: set step_id) or ask_user (only the user can supply what is missing). Leave unused fields \
             empty. {}",
            fence.rule()
        );
        let mut tools = String::new();
        for c in candidates {
            let _ = write!(tools, "\n- agent {} capability {}: {}", c.agent, c.capability, c.description);
        }
        let tools = if tools.is_empty() { "\n(none)".to_owned() } else { tools };
        let user = format!(
            "The request:\n{}\n\nThe results:{}\nThe answer given:\n{}\n\nTools that recovery may use:{}",
            fence.wrap("request", &outcome.query),
            if outcome.steps.is_empty() {
                format!("\nNo step was run: {}\n", fence.wrap("planner's reason", &outcome.zero_step_reason))
            } else {
                self.results_text(outcome, fence)
            },
            fence.wrap("answer", answer),
            agentmesh_core::fence::neutralise(&tools)
        );
        CompletionRequest {
            messages: vec![Message::system(system), Message::user(user)],
            temperature: Some(0.0),
            max_tokens: Some(self.settings.review_max_tokens),
            response_schema: Some(ResponseSchema {
                name: "review".into(),
                schema: self.review_schema(outcome, candidates),
            }),
            ..Default::default()
        }
    }

    /// Reads a review answer, tolerantly (prose around the JSON, strings for
    /// booleans and numbers, a percentage for the confidence, other
    /// spellings of the action kinds), and keeps only actions that can be
    /// acted on. The error says what is wrong, to be fed back to the model.
    pub fn read_review(
        &self,
        answer: &str,
        outcome: &RunOutcome,
        catalog: &[AllowedCapability],
    ) -> Result<Verdict, String> {
        // An object cut off at the token limit is closed and read for what it holds.
        let cut = if extract_json(answer).is_none() { close_cut_json(answer) } else { None };
        let json = extract_json(answer).or(cut.as_deref()).ok_or("the answer contains no JSON object")?;
        let json = agentmesh_core::plan::escape_control_in_strings(json);
        let value: Value = serde_json::from_str(&json).map_err(|e| format!("the answer is not valid JSON: {e}"))?;
        let goal_achieved = match value.get("goal_achieved") {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) if matches!(s.trim().to_ascii_lowercase().as_str(), "true" | "yes") => true,
            Some(Value::String(s)) if matches!(s.trim().to_ascii_lowercase().as_str(), "false" | "no") => false,
            _ => return Err("`goal_achieved` must be true or false".into()),
        };
        let confidence = match value.get("confidence") {
            Some(Value::Number(n)) => n.as_f64().unwrap_or(0.5),
            Some(Value::String(s)) => s.trim().trim_end_matches('%').parse::<f64>().unwrap_or(0.5),
            _ => 0.5,
        };
        let confidence = if confidence > 1.0 && confidence <= 100.0 { confidence / 100.0 } else { confidence };
        let confidence = if confidence.is_finite() { confidence.clamp(0.0, 1.0) } else { 0.5 };
        let summary = value.get("summary").and_then(Value::as_str).unwrap_or_default().trim().to_owned();
        let missing_data: Vec<String> = match value.get("missing_data") {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            Some(Value::String(s)) if !s.trim().is_empty() => vec![s.trim().to_owned()],
            _ => Vec::new(),
        };
        let mut verdict = Verdict {
            goal_achieved,
            confidence,
            summary,
            missing_data,
            actions: Vec::new(),
            dropped: Vec::new(),
            unsupported_claims: Vec::new(),
        };
        let suggested = value.get("recovery_actions").and_then(Value::as_array).cloned().unwrap_or_default();
        if goal_achieved {
            if !suggested.is_empty() {
                verdict
                    .dropped
                    .push(format!("{} recovery action(s) ignored: the goal was judged achieved", suggested.len()));
            }
            return Ok(verdict);
        }
        let retryable: HashSet<&str> = outcome.not_succeeded().map(|s| s.step.step_id.as_str()).collect();
        for item in suggested {
            match self.read_action(&item, &retryable, catalog) {
                Ok(action) if verdict.actions.contains(&action) => {}
                Ok(action) if verdict.actions.len() >= 3 => {
                    verdict.dropped.push(format!("{action:?} dropped: at most 3 recovery actions are kept"));
                }
                Ok(action) => verdict.actions.push(action),
                Err(why) => verdict.dropped.push(why),
            }
        }
        Ok(verdict)
    }

    fn read_action(
        &self,
        item: &Value,
        retryable: &HashSet<&str>,
        catalog: &[AllowedCapability],
    ) -> Result<Action, String> {
        let text = |key: &str| -> String {
            item.get(key)
                .or_else(|| item.get("collaboration").and_then(|c| c.get(key)))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let kind = text("kind").to_ascii_lowercase().replace(['-', ' '], "_");
        let kind = kind.trim_start_matches("recovery_action_kind_");
        let reason = text("reason");
        match kind {
            "add_step" | "add" => {
                let (agent, capability) = (text("agent"), text("capability"));
                if !catalog.iter().any(|c| c.agent == agent && c.capability == capability) {
                    return Err(format!(
                        "add_step dropped: `{agent}/{capability}` is not in the catalog (an invented or unhealthy tool)"
                    ));
                }
                let query = text("query");
                let query = if query.is_empty() { reason.clone() } else { query };
                if query.is_empty() {
                    return Err(format!("add_step dropped: `{agent}/{capability}` comes with no query"));
                }
                Ok(Action::AddStep { agent, capability, query, reason })
            }
            "retry_step" | "retry" => {
                let step_id = text("step_id");
                if !retryable.contains(step_id.as_str()) {
                    return Err(format!("retry_step dropped: `{step_id}` is not a step that failed"));
                }
                Ok(Action::RetryStep { step_id, reason })
            }
            "ask_user" | "ask" => Ok(Action::AskUser { reason }),
            other => Err(format!("recovery action dropped: unknown kind `{other}`")),
        }
    }
}

/// Turns each recovery action that would run a destructive capability
/// again into a question for the user, saying so: a `retry_step` of a
/// step whose capability is declared destructive (it may have done part of
/// its work before failing), or an `add_step` of a destructive capability
/// a step of this run already called. Small models propose "send it again"
/// freely; the recovery round must not send the email twice on its own.
/// `destructive` holds `(agent, capability)` pairs; returns how many were
/// turned.
///
/// `None`: the catalog could not be read, so whether a capability is
/// destructive is unknown, and every re-run is asked for (failing closed).
pub fn guard_destructive(
    verdict: &mut Verdict,
    outcome: &RunOutcome,
    destructive: Option<&HashSet<(String, String)>>,
) -> usize {
    let is_destructive = |agent: &str, capability: &str| {
        destructive.is_none_or(|d| d.contains(&(agent.to_owned(), capability.to_owned())))
    };
    let why = if destructive.is_some() {
        "the capability is declared destructive"
    } else {
        "whether the capability is destructive cannot be checked (discovery did not answer)"
    };
    let mut turned = 0;
    for action in &mut verdict.actions {
        let again = match action {
            Action::RetryStep { step_id, reason } => outcome
                .steps
                .iter()
                .find(|s| s.step.step_id == *step_id)
                .filter(|s| is_destructive(&s.step.agent, &s.step.capability))
                .map(|s| (format!("running {step_id} ({}/{}) again", s.step.agent, s.step.capability), reason.clone())),
            Action::AddStep { agent, capability, reason, .. } => outcome
                .steps
                .iter()
                .find(|s| s.step.agent == *agent && s.step.capability == *capability && s.state != StepState::Skipped)
                .filter(|_| is_destructive(agent, capability))
                .map(|s| (format!("calling {agent}/{capability} again (as {} did)", s.step.step_id), reason.clone())),
            Action::AskUser { .. } => None,
        };
        if let Some((what, reason)) = again {
            let proposed = if reason.is_empty() { String::new() } else { format!(" The review proposed it: {reason}") };
            *action = Action::AskUser {
                reason: format!(
                    "{what} may repeat what it already did: {why}, so it runs again only if you ask for \
                     it.{proposed}"
                ),
            };
            turned += 1;
        }
    }
    turned
}

/// A JSON object cut off before its end (an answer stopped at the token
/// limit), closed where it stops: an open string ended, a dangling `,` or
/// `"key":` dropped, every open array and object closed. `None` when there
/// is no object, or it was complete.
pub fn close_cut_json(answer: &str) -> Option<String> {
    let start = answer.find('{')?;
    let text = &answer[start..];
    let (mut open, mut in_string, mut escaped) = (Vec::new(), false, false);
    for c in text.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '{' | '[' if !in_string => open.push(c),
            '}' | ']' if !in_string => {
                open.pop();
                if open.is_empty() {
                    return None;
                }
            }
            _ => {}
        }
    }
    let mut closed = text.to_owned();
    if escaped {
        closed.pop();
    }
    if in_string {
        closed.push('"');
    }
    // A value never begun, or a key without its value, is dropped.
    loop {
        let trimmed = closed.trim_end();
        if trimmed.ends_with(',') || trimmed.ends_with(':') {
            let without = &trimmed[..trimmed.len() - 1];
            closed = if trimmed.ends_with(':') {
                // `"key":` goes whole: the key is the string before the colon.
                let key_start = without.trim_end().trim_end_matches('"').rfind('"').unwrap_or(0);
                without[..key_start].to_owned()
            } else {
                without.to_owned()
            };
        } else {
            closed.truncate(trimmed.len());
            break;
        }
    }
    for c in open.iter().rev() {
        closed.push(if *c == '{' { '}' } else { ']' });
    }
    Some(closed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_core::CapabilityKind;

    fn step(id: &str, agent: &str, capability: &str) -> PlanStep {
        PlanStep {
            step_id: id.into(),
            agent: agent.into(),
            capability: capability.into(),
            instruction: String::new(),
            parameters: json!({}),
            depends_on: Vec::new(),
        }
    }

    fn outcome() -> RunOutcome {
        RunOutcome {
            query: "Weather in Chicago and the time there".into(),
            steps: vec![
                StepOutcome {
                    step: step("s1", "weather", "get"),
                    state: StepState::Succeeded,
                    output: Some(json!({"temp_c": 21})),
                    error: String::new(),
                },
                StepOutcome {
                    step: step("s2", "clock", "now"),
                    state: StepState::Failed,
                    output: None,
                    error: "HTTP 503 after 3 attempts".into(),
                },
            ],
            zero_step_reason: String::new(),
        }
    }

    fn catalog() -> Vec<AllowedCapability> {
        ["weather/get", "clock/now", "tz/lookup"]
            .iter()
            .map(|t| {
                let (agent, capability) = t.split_once('/').unwrap_or_default();
                AllowedCapability {
                    agent: agent.into(),
                    capability: capability.into(),
                    kind: CapabilityKind::Skill,
                    description: String::new(),
                    input_schema: None,
                }
            })
            .collect()
    }

    #[test]
    fn zero_steps_and_total_failure_are_answered_without_the_model() {
        let s = Synthesizer::default();
        let fence = Fence::with_nonce("n");
        let zero = RunOutcome { query: "time?".into(), steps: vec![], zero_step_reason: "no clock tool".into() };
        let AnswerPlan::Direct(text) = s.answer(&zero, &fence) else { panic!("model asked") };
        assert!(text.contains("Reason: no clock tool"), "{text}");
        let mut failed = outcome();
        failed.steps[0].state = StepState::Skipped;
        failed.steps[0].error = "dependency failed".into();
        let AnswerPlan::Direct(text) = s.answer(&failed, &fence) else { panic!("model asked") };
        assert!(text.contains("- s2 (clock/now) failed: HTTP 503 after 3 attempts"), "{text}");
        assert!(text.contains("- s1 (weather/get) was skipped: dependency failed"), "{text}");
    }

    #[test]
    fn a_failed_step_retried_successfully_is_not_listed_as_not_done() {
        let s = Synthesizer::default();
        let mut recovered = outcome();
        let mut retry = recovered.steps[1].clone();
        retry.step.step_id = "s3".into();
        retry.state = StepState::Succeeded;
        retry.output = Some(json!({"now": "12:00"}));
        retry.error = String::new();
        recovered.steps.push(retry);
        let AnswerPlan::Model { footer, .. } = s.answer(&recovered, &Fence::with_nonce("n")) else {
            panic!("no model")
        };
        assert_eq!(footer, None, "s2 was made good by s3");
        assert!(recovered.not_succeeded().next().is_none());
    }

    #[test]
    fn partial_failure_is_listed_after_the_answer() {
        let s = Synthesizer::default();
        let AnswerPlan::Model { request, footer, .. } = s.answer(&outcome(), &Fence::with_nonce("n")) else {
            panic!("no model")
        };
        assert_eq!(footer.as_deref(), Some("\n\nNot done:\n- s2 (clock/now) failed: HTTP 503 after 3 attempts"));
        let prompt = &request.messages[1].content;
        assert!(prompt.contains("⟦data n output of s1⟧\n{\"temp_c\":21}\n⟦/data n⟧"), "{prompt}");
    }

    #[test]
    fn reviews_are_read_tolerantly_and_only_actionable_actions_kept() {
        let s = Synthesizer::default();
        let answer = r#"Sure! {"summary": "no time", "goal_achieved": "no", "confidence": "80%",
            "missing_data": "local time", "recovery_actions": [
              {"kind": "ADD_STEP", "agent": "time-tool-v1", "capability": "now", "query": "time", "reason": "r"},
              {"kind": "add_step", "agent": "tz", "capability": "lookup", "query": "", "reason": "find the zone"},
              {"kind": "retry_step", "step_id": "s1", "reason": "again"},
              {"kind": "retry", "step_id": "s2", "reason": "transient"},
              {"kind": "retry", "step_id": "s2", "reason": "transient"},
              {"kind": "dance"}]}"#;
        let v = s.read_review(answer, &outcome(), &catalog()).unwrap();
        assert!(!v.goal_achieved);
        assert!((v.confidence - 0.8).abs() < 1e-9);
        assert_eq!(v.missing_data, ["local time"]);
        assert_eq!(
            v.actions,
            [
                Action::AddStep {
                    agent: "tz".into(),
                    capability: "lookup".into(),
                    query: "find the zone".into(),
                    reason: "find the zone".into()
                },
                Action::RetryStep { step_id: "s2".into(), reason: "transient".into() },
            ]
        );
        assert_eq!(v.dropped.len(), 3, "{:?}", v.dropped);
        assert!(v.dropped[0].contains("time-tool-v1/now` is not in the catalog"), "{:?}", v.dropped);
        assert!(v.dropped[1].contains("`s1` is not a step that failed"), "{:?}", v.dropped);
    }

    #[test]
    fn a_destructive_step_is_not_run_again_without_the_user() {
        let mut outcome = outcome();
        outcome.steps[1].step = step("s2", "mailer", "send_email");
        let verdict = |actions: Vec<Action>| Verdict {
            goal_achieved: false,
            confidence: 0.5,
            summary: String::new(),
            missing_data: Vec::new(),
            actions,
            dropped: Vec::new(),
            unsupported_claims: Vec::new(),
        };
        let destructive: HashSet<(String, String)> = [("mailer".to_owned(), "send_email".to_owned())].into();
        let mut v = verdict(vec![
            Action::RetryStep { step_id: "s2".into(), reason: "it timed out".into() },
            Action::AddStep {
                agent: "mailer".into(),
                capability: "send_email".into(),
                query: "send it".into(),
                reason: String::new(),
            },
            Action::AddStep { agent: "tz".into(), capability: "lookup".into(), query: "q".into(), reason: "r".into() },
            Action::RetryStep { step_id: "s1".into(), reason: "again".into() },
        ]);
        assert_eq!(guard_destructive(&mut v, &outcome, Some(&destructive)), 2);
        let Action::AskUser { reason } = &v.actions[0] else { panic!("{:?}", v.actions[0]) };
        assert!(reason.starts_with("running s2 (mailer/send_email) again may repeat what it already did"), "{reason}");
        assert!(reason.ends_with("The review proposed it: it timed out"), "{reason}");
        let Action::AskUser { reason } = &v.actions[1] else { panic!("{:?}", v.actions[1]) };
        assert!(reason.starts_with("calling mailer/send_email again (as s2 did)"), "{reason}");
        assert!(matches!(v.actions[2], Action::AddStep { .. }) && matches!(v.actions[3], Action::RetryStep { .. }));
        // Not declared destructive: left as proposed.
        let mut v = verdict(vec![Action::RetryStep { step_id: "s2".into(), reason: "r".into() }]);
        assert_eq!(guard_destructive(&mut v, &outcome, Some(&HashSet::new())), 0);
        // Unknown (no catalog): asked for, saying why.
        assert_eq!(guard_destructive(&mut v, &outcome, None), 1);
        let Action::AskUser { reason } = &v.actions[0] else { panic!("{:?}", v.actions[0]) };
        assert!(reason.contains("cannot be checked (discovery did not answer)"), "{reason}");
    }

    #[test]
    fn unreadable_reviews_say_why() {
        let s = Synthesizer::default();
        assert_eq!(s.read_review("fine", &outcome(), &[]), Err("the answer contains no JSON object".into()));
        assert_eq!(
            s.read_review(r#"{"summary": "x"}"#, &outcome(), &[]),
            Err("`goal_achieved` must be true or false".into())
        );
        let done =
            s.read_review(r#"{"goal_achieved": true, "confidence": 7e300, "recovery_actions": [{}]}"#, &outcome(), &[]);
        let done = done.unwrap();
        assert!(done.actions.is_empty() && done.dropped.len() == 1 && done.confidence == 1.0);
    }

    #[test]
    fn an_answer_cut_off_at_the_token_limit_is_closed_and_read() {
        let s = Synthesizer::default();
        // Cut in the lists: the summary and the verdict, written before them, are kept.
        let cut = r#"{"summary": "Chicago is at 21 \u00b0C", "goal_achieved": false, "confidence": 0.9,
            "missing_data": ["the humidity", "the wi"#;
        let v = s.read_review(cut, &outcome(), &[]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!v.goal_achieved && (v.confidence - 0.9).abs() < 1e-9);
        assert_eq!(v.summary, "Chicago is at 21 °C");
        assert_eq!(v.missing_data, ["the humidity", "the wi"]);
        // Cut after a key, inside an array, after a comma.
        assert_eq!(close_cut_json(r#"x {"a": 1, "summary":"#).as_deref(), Some(r#"{"a": 1}"#));
        assert_eq!(close_cut_json(r#"{"m": ["one", "tw"#).as_deref(), Some(r#"{"m": ["one", "tw"]}"#));
        assert_eq!(close_cut_json(r#"{"m": [{"k": 1},"#).as_deref(), Some(r#"{"m": [{"k": 1}]}"#));
        assert_eq!(close_cut_json(r#"{"a": 1}"#), None, "a complete object needs nothing");
        assert_eq!(close_cut_json("no object"), None);
        // Cut before the verdict: still refused, so the model is asked again.
        let early = r#"{"summary": "half"#;
        assert_eq!(s.read_review(early, &outcome(), &[]), Err("`goal_achieved` must be true or false".into()));
    }
}
