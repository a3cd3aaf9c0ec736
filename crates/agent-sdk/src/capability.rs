//! Capabilities: a typed handler with the schemas of its input and output,
//! and what a handler is given and may answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Whether a capability is a skill (a deterministic tool) or a reasoner (it
/// thinks, usually with a model). Both are called the same way; the kind
/// decides the default path (`/skills/{id}` or `/reasoners/{id}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A tool.
    Skill,
    /// A capability that reasons.
    Reasoner,
}

impl Kind {
    /// The path segment of the kind: `skills` or `reasoners`.
    pub fn segment(self) -> &'static str {
        match self {
            Self::Skill => "skills",
            Self::Reasoner => "reasoners",
        }
    }
}

/// A failed call, as the executor should treat it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    /// What went wrong, shown in the step's error.
    pub message: String,
    /// Whether the same call may succeed later (the executor retries it).
    pub retryable: bool,
}

impl AgentError {
    /// A failure that retrying will not fix (bad data, a refused request).
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), retryable: false }
    }

    /// A failure that may pass (an upstream timeout, a busy dependency): the
    /// executor tries again, with backoff.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self { message: message.into(), retryable: true }
    }
}

/// A request for another capability to be involved (loop-back): the
/// executor asks the planner for steps that serve `query` and runs them
/// after this step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Collaboration {
    /// The agent asked for.
    pub agent: String,
    /// Its capability; empty lets the planner choose among the agent's.
    pub capability: String,
    /// What it should do, in words.
    pub query: String,
}

/// One call of a capability: who is calling and why, from the request's
/// headers (HTTP) or fields (gRPC). Empty strings where the caller sent
/// nothing (a call made by hand, say).
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// The request the call serves (`X-Request-Id`).
    pub request_id: String,
    /// The execution running the plan.
    pub execution_id: String,
    /// The plan step being run.
    pub step_id: String,
    /// The step's instruction, in words.
    pub instruction: String,
    /// `execution_id/step_id`, the same on every attempt of a step: an
    /// agent with side effects answers a repeat with its first answer (the
    /// SDK does it for successful answers, see [`crate::Agent`]).
    pub idempotency_key: String,
    /// 1 for the first attempt, then 2, 3…
    pub attempt: u32,
    /// The caller's W3C `traceparent`, as received (empty when none), for
    /// a handler that calls further services itself.
    pub traceparent: String,
    pub(crate) collaboration: Arc<Mutex<Option<Collaboration>>>,
}

impl Call {
    /// Asks for `agent`'s `capability` (empty: the planner chooses) to do
    /// `query` after this step; the answer carries the request beside the
    /// output. The last request of a call wins.
    pub fn collaborate(&self, agent: impl Into<String>, capability: impl Into<String>, query: impl Into<String>) {
        let request = Collaboration { agent: agent.into(), capability: capability.into(), query: query.into() };
        if let Ok(mut slot) = self.collaboration.lock() {
            *slot = Some(request);
        }
    }

    pub(crate) fn take_collaboration(&self) -> Option<Collaboration> {
        self.collaboration.lock().ok().and_then(|mut slot| slot.take())
    }
}

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a call ended with, before it is written for a transport.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// The output, with a collaboration request when the handler made one.
    Done { output: Value, collaborate: Option<Collaboration> },
    /// The parameters do not fit the input type: the caller's mistake.
    BadInput(String),
    /// The handler failed.
    Failed(AgentError),
}

impl Outcome {
    /// The HTTP envelope of `docs/agents.md`. The output always travels in
    /// `output`, so that an output that happens to look like an envelope
    /// (`{"error": …}`) is not misread.
    pub(crate) fn envelope(&self) -> Value {
        match self {
            Self::Done { output, collaborate: None } => json!({ "output": output }),
            Self::Done { output, collaborate: Some(c) } => json!({ "output": output, "collaborate": c }),
            Self::BadInput(message) => json!({ "error": message, "retryable": false }),
            Self::Failed(e) => json!({ "error": e.message, "retryable": e.retryable }),
        }
    }
}

type Handler = dyn Fn(Call, Value) -> BoxFuture<Outcome> + Send + Sync;

/// One capability of an agent: an id, a description for people and
/// planning models, the JSON schemas of its input and output (derived from
/// the handler's types), and the handler.
#[derive(Clone)]
pub struct Capability {
    pub(crate) id: String,
    pub(crate) kind: Kind,
    pub(crate) description: String,
    pub(crate) tags: Vec<String>,
    pub(crate) internal: bool,
    /// What calling it does to the world (`read_only`, `destructive`,
    /// `idempotent`, `idempotency_key`), as registered.
    pub(crate) hints: serde_json::Map<String, Value>,
    pub(crate) input_schema: Value,
    pub(crate) output_schema: Value,
    pub(crate) handler: Arc<Handler>,
}

impl std::fmt::Debug for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capability")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("internal", &self.internal)
            .finish_non_exhaustive()
    }
}

/// The JSON schema of an input type `T` (what deserializes into it) as a
/// registration carries it: subschemas inlined, without the `$schema`
/// line. A recursive type keeps the `$defs` its `$ref`s need.
pub fn schema_for<T: JsonSchema>() -> Value {
    schema_of::<T>(schemars::generate::SchemaSettings::draft2020_12())
}

/// The JSON schema of an output type `T`: what it serializes to.
pub fn output_schema_for<T: JsonSchema>() -> Value {
    schema_of::<T>(schemars::generate::SchemaSettings::draft2020_12().for_serialize())
}

fn schema_of<T: JsonSchema>(settings: schemars::generate::SchemaSettings) -> Value {
    let generator = settings
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    let refers = schema.to_string().contains("\"$ref\"");
    if let Some(object) = schema.as_object_mut()
        && !refers
    {
        object.remove("$defs");
    }
    schema
}

impl Capability {
    /// A skill: `handler` takes the call and the parameters as `I` and
    /// answers `O` or an [`AgentError`].
    pub fn skill<I, O, F, Fut>(id: impl Into<String>, description: impl Into<String>, handler: F) -> Self
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(Call, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, AgentError>> + Send + 'static,
    {
        Self::typed(Kind::Skill, id.into(), description.into(), handler)
    }

    /// A reasoner, otherwise as [`Capability::skill`].
    pub fn reasoner<I, O, F, Fut>(id: impl Into<String>, description: impl Into<String>, handler: F) -> Self
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(Call, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, AgentError>> + Send + 'static,
    {
        Self::typed(Kind::Reasoner, id.into(), description.into(), handler)
    }

    fn typed<I, O, F, Fut>(kind: Kind, id: String, description: String, handler: F) -> Self
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(Call, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, AgentError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased = move |call: Call, parameters: Value| -> BoxFuture<Outcome> {
            let handler = handler.clone();
            Box::pin(async move {
                let input: I = match serde_json::from_value(parameters) {
                    Ok(input) => input,
                    Err(e) => return Outcome::BadInput(format!("the parameters do not fit the input schema: {e}")),
                };
                match handler(call.clone(), input).await {
                    Ok(output) => match serde_json::to_value(output) {
                        Ok(output) => Outcome::Done { output, collaborate: call.take_collaboration() },
                        Err(e) => {
                            Outcome::Failed(AgentError::new(format!("the output cannot be written as JSON: {e}")))
                        }
                    },
                    Err(e) => Outcome::Failed(e),
                }
            })
        };
        Self {
            id,
            kind,
            description,
            tags: Vec::new(),
            internal: false,
            hints: serde_json::Map::new(),
            input_schema: schema_for::<I>(),
            output_schema: output_schema_for::<O>(),
            handler: Arc::new(erased),
        }
    }

    /// Adds tags, for discovery's filters.
    #[must_use]
    pub fn tags<S: Into<String>>(mut self, tags: impl IntoIterator<Item = S>) -> Self {
        self.tags.extend(tags.into_iter().map(Into::into));
        self
    }

    /// Marks the capability internal: never offered to a planning model
    /// and never called by the executor, only by clients that call the
    /// agent directly (an orchestrator's own entry point, say).
    #[must_use]
    pub fn internal(mut self) -> Self {
        self.internal = true;
        self
    }

    /// Declares that it changes nothing: the executor may retry it after
    /// a timeout, and a plan may call it freely.
    #[must_use]
    pub fn read_only(self) -> Self {
        self.hint("read_only", true)
    }

    /// Declares that it may delete or overwrite: a review never runs it
    /// again on its own (it asks the user), and it is not retried after a
    /// timeout unless it is idempotent or honours the idempotency key.
    #[must_use]
    pub fn destructive(self) -> Self {
        self.hint("destructive", true).hint("read_only", false)
    }

    /// Declares whether calling it twice with the same input does more
    /// than calling it once (`false`: not retried after a timeout).
    #[must_use]
    pub fn idempotent(self, idempotent: bool) -> Self {
        self.hint("idempotent", idempotent)
    }

    /// Declares that a call repeated with an idempotency key already seen
    /// answers with the first call's result without doing the work again,
    /// so the executor may retry it after a timeout even when it is not
    /// idempotent. This SDK answers repeated keys from memory while the
    /// process runs (the last 4,096); declare it when the handler also keeps
    /// its own record of [`Call::idempotency_key`] across restarts, or when
    /// a repeat after a restart does no harm.
    #[must_use]
    pub fn honours_idempotency_key(self) -> Self {
        self.hint("idempotency_key", true)
    }

    fn hint(mut self, name: &str, value: bool) -> Self {
        self.hints.insert(name.to_owned(), Value::Bool(value));
        self
    }

    /// The capability's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The JSON schema of its input.
    pub fn input_schema(&self) -> &Value {
        &self.input_schema
    }

    /// The JSON schema of its output.
    pub fn output_schema(&self) -> &Value {
        &self.output_schema
    }

    /// Runs the handler on `parameters`.
    pub(crate) async fn run(&self, call: Call, parameters: Value) -> Outcome {
        (self.handler)(call, parameters).await
    }

    /// The capability as a registration lists it.
    pub(crate) fn registration(&self) -> Value {
        let mut registration = json!({
            "id": self.id,
            "description": self.description,
            "tags": self.tags,
            "input_schema": self.input_schema,
            "output_schema": self.output_schema,
            "internal": self.internal,
        });
        if !self.hints.is_empty() {
            registration["hints"] = Value::Object(self.hints.clone());
        }
        registration
    }
}
