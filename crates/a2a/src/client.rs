//! Sending a message to an A2A agent and waiting for its task to end:
//! streamed when the card says the agent streams (each status the agent
//! reports passed on as it comes), else sent and, when the agent answers
//! before the task ends, read again with `GetTask` until it does.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Map, Value, json};

use crate::card::Interface;
use crate::wire::{self, Event, Message, Part, Role, State, Task, Version};

/// The metadata key carrying the mesh's request id on a message.
pub const REQUEST_ID_METADATA: &str = "dev.agentmesh/request_id";

/// The metadata key naming the skill the mesh chose.
pub const SKILL_METADATA: &str = "dev.agentmesh/skill";

/// Largest answer read.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Largest stream read.
const MAX_STREAM_BYTES: usize = 64 << 20;

/// Most of an error answer's body read.
const MAX_ERROR_BYTES: usize = 4 << 10;

/// One message to one agent.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// Where.
    pub interface: &'a Interface,
    /// Whether to stream the task's events.
    pub streaming: bool,
    /// The skill chosen (told to the agent in the message's metadata).
    pub skill: &'a str,
    /// The message.
    pub text: &'a str,
    /// The message's id: the same for every attempt of a step, so an
    /// agent that sees it twice can tell.
    pub message_id: &'a str,
    /// The mesh's request id.
    pub request_id: &'a str,
    /// Extra HTTP headers (trace context, credentials).
    pub headers: &'a [(String, String)],
    /// How long the whole exchange may take.
    pub timeout: Duration,
}

/// How an exchange ended, when the agent said so.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The task, in the state it stopped in.
    Task(Task),
    /// A message, without a task.
    Message(Message),
}

/// Why an exchange did not end in an answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    /// The request did not reach the agent.
    #[error("the A2A agent could not be reached: {0}")]
    NotSent(String),
    /// The request went out and no (whole) answer came back: the agent
    /// may have acted on it.
    #[error("the A2A agent did not answer: {0}")]
    Lost(String),
    /// The agent's HTTP server refused the request.
    #[error("the A2A agent answered HTTP {status}: {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// How long it asked the caller to wait.
        retry_after: Option<Duration>,
        /// The body, shortened.
        message: String,
    },
    /// The agent answered with a JSON-RPC error.
    #[error("the A2A agent answered {method} with an error ({code}): {message}")]
    Rpc {
        /// The method called.
        method: String,
        /// The JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// The agent answered something that is not A2A.
    #[error("the A2A agent's answer cannot be read: {0}")]
    Invalid(String),
}

/// Sends the message and waits for the task to end (or to need the
/// user); `on_event` sees every event the agent sends on the way.
pub async fn send(
    http: &reqwest::Client,
    send: &Request<'_>,
    on_event: &mut (dyn FnMut(&Event) + Send),
) -> Result<Outcome, CallError> {
    let work = exchange(http, send, on_event);
    match tokio::time::timeout(send.timeout, work).await {
        Ok(outcome) => outcome,
        Err(_) => Err(CallError::Lost(format!("no answer within {} ms", send.timeout.as_millis()))),
    }
}

async fn exchange(
    http: &reqwest::Client,
    send: &Request<'_>,
    on_event: &mut (dyn FnMut(&Event) + Send),
) -> Result<Outcome, CallError> {
    let version = send.interface.version;
    let mut metadata = Map::new();
    if !send.request_id.is_empty() {
        metadata.insert(REQUEST_ID_METADATA.into(), json!(send.request_id));
    }
    metadata.insert(SKILL_METADATA.into(), json!(send.skill));
    let message = Message {
        message_id: send.message_id.to_owned(),
        context_id: None,
        task_id: None,
        role: Role::User,
        parts: vec![Part::Text(send.text.to_owned())],
        metadata: Some(metadata),
    };
    let mut params = json!({"message": message.write(version)});
    if version == Version::V03 {
        params["configuration"] = json!({"blocking": true});
    }
    let method = version.send_method(send.streaming);
    let body = wire::request(&json!(new_id()), method, params);
    let response = post(http, send, &body, send.streaming).await?;
    let first = if send.streaming {
        follow_stream(response, method, on_event).await?
    } else {
        let event = read_event(&read_json(response).await?, method)?;
        on_event(&event);
        Some(event)
    };
    let mut task = match first {
        Some(Event::Message(message)) => return Ok(Outcome::Message(message)),
        Some(Event::Task(task)) => task,
        Some(_) | None => {
            return Err(CallError::Invalid(format!("{method} was answered with neither a task nor a message")));
        }
    };
    // The agent answered before the task ended: ask again until it does.
    let mut pause = Duration::from_millis(100);
    while !task.state.is_final() {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
        let method = version.get_task_method();
        let body = wire::request(&json!(new_id()), method, json!({"id": task.id}));
        let value = read_json(post(http, send, &body, false).await?).await?;
        let result = rpc_result(&value, method)?;
        task = Task::read(&result).ok_or_else(|| CallError::Invalid(format!("{method} answered no task: {result}")))?;
        on_event(&Event::Task(task.clone()));
    }
    Ok(Outcome::Task(task))
}

async fn post(
    http: &reqwest::Client,
    send: &Request<'_>,
    body: &Value,
    streaming: bool,
) -> Result<reqwest::Response, CallError> {
    let mut request = http
        .post(&send.interface.url)
        .header(wire::VERSION_HEADER, send.interface.version.as_str())
        .header(reqwest::header::ACCEPT, if streaming { "text/event-stream" } else { "application/json" })
        .json(body);
    for (name, value) in send.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let response = request.send().await.map_err(|e| {
        let chain = agentmesh_telemetry::http::error_chain(&e);
        if e.is_connect() { CallError::NotSent(chain) } else { CallError::Lost(chain) }
    })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| agentmesh_telemetry::http::parse_retry_after(v, chrono::Utc::now()));
    let body = match read_body(response, MAX_ERROR_BYTES).await {
        Ok(body) => String::from_utf8_lossy(&body).chars().take(300).collect(),
        Err(e) => e.to_string(),
    };
    Err(CallError::Refused { status: status.as_u16(), retry_after, message: body })
}

/// Reads a body of at most `max` bytes.
pub(crate) async fn read_body(response: reqwest::Response, max: usize) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| ReadError::Cut(agentmesh_telemetry::http::error_chain(&e)))?;
        if body.len() + chunk.len() > max {
            return Err(ReadError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ReadError {
    /// The connection broke.
    #[error("the answer was cut: {0}")]
    Cut(String),
    /// Past the limit.
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
}

async fn read_json(response: reqwest::Response) -> Result<Value, CallError> {
    let body = read_body(response, MAX_ANSWER_BYTES).await.map_err(|e| match e {
        ReadError::Cut(_) => CallError::Lost(e.to_string()),
        ReadError::TooLarge(_) => CallError::Invalid(e.to_string()),
    })?;
    serde_json::from_slice(&body).map_err(|e| CallError::Invalid(format!("not JSON: {e}")))
}

/// The `result` of a JSON-RPC answer, or its error.
fn rpc_result(answer: &Value, method: &str) -> Result<Value, CallError> {
    if let Some(error) = answer.get("error").filter(|e| !e.is_null()) {
        return Err(CallError::Rpc {
            method: method.to_owned(),
            code: error.get("code").and_then(Value::as_i64).unwrap_or(wire::code::INTERNAL),
            message: error.get("message").and_then(Value::as_str).unwrap_or("no message").to_owned(),
        });
    }
    answer.get("result").cloned().ok_or_else(|| CallError::Invalid("a JSON-RPC answer without a result".into()))
}

fn read_event(answer: &Value, method: &str) -> Result<Event, CallError> {
    let result = rpc_result(answer, method)?;
    Event::read(&result).ok_or_else(|| {
        let shown: String = result.to_string().chars().take(300).collect();
        CallError::Invalid(format!("not a task, a message or a task update: {shown}"))
    })
}

/// Reads a task's stream until it ends, folding the updates into the
/// task. A stream that stops (or is cut) before the task ends gives the
/// task as far as it got, which is then read again; one that is cut
/// before naming a task is a lost exchange.
async fn follow_stream(
    response: reqwest::Response,
    method: &str,
    on_event: &mut (dyn FnMut(&Event) + Send),
) -> Result<Option<Event>, CallError> {
    let mut seen = 0_usize;
    let body = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(|e| std::io::Error::other(agentmesh_telemetry::http::error_chain(&e)))?;
        seen += chunk.len();
        if seen > MAX_STREAM_BYTES {
            return Err(std::io::Error::other(format!("the stream passed {MAX_STREAM_BYTES} bytes")));
        }
        Ok(chunk)
    });
    let mut events = sse_stream::SseByteStream::new(Box::pin(body));
    let mut task: Option<Task> = None;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(_) if task.as_ref().is_some_and(|t| !t.id.is_empty()) => break,
            Err(e) => return Err(CallError::Lost(format!("the stream was cut before the agent named a task: {e}"))),
        };
        let Some(data) = event.data.filter(|d| !d.trim().is_empty()) else { continue };
        let answer: Value =
            serde_json::from_str(&data).map_err(|e| CallError::Invalid(format!("an event is not JSON: {e}")))?;
        let event = read_event(&answer, method)?;
        on_event(&event);
        match event {
            Event::Message(message) if task.is_none() => return Ok(Some(Event::Message(message))),
            Event::Message(_) => {}
            Event::Task(whole) => task = Some(whole),
            Event::Status { task_id, context_id, state, message, last } => {
                let current = task.get_or_insert_with(|| Task::new(task_id, context_id));
                current.state = state;
                current.status_message = message;
                if last || state.is_final() {
                    break;
                }
            }
            Event::Artifact { task_id, context_id, artifact, append } => {
                let current = task.get_or_insert_with(|| Task::new(task_id, context_id));
                fold_artifact(&mut current.artifacts, artifact, append);
            }
        }
    }
    match task {
        Some(task) => Ok(Some(Event::Task(task))),
        None => Err(CallError::Lost("the stream ended before the agent named a task".into())),
    }
}

/// Takes in an artifact update: appended to the artifact of the same id
/// (text running on in the same text part), else replacing it, else added.
pub fn fold_artifact(artifacts: &mut Vec<wire::Artifact>, artifact: wire::Artifact, append: bool) {
    match artifacts.iter_mut().find(|a| a.artifact_id == artifact.artifact_id) {
        Some(known) if append => {
            for part in artifact.parts {
                match (known.parts.last_mut(), part) {
                    (Some(Part::Text(text)), Part::Text(more)) => text.push_str(&more),
                    (_, part) => known.parts.push(part),
                }
            }
        }
        Some(known) => *known = artifact,
        None => artifacts.push(artifact),
    }
}

/// What an ended exchange means for the step that sent it.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// The task completed (or the agent answered with a message): the
    /// step's output.
    Output(Value),
    /// The task failed, was rejected or was cancelled.
    Failed(String),
    /// The task waits for the user (input or authentication), which only
    /// the user can give: the reason says what the agent asked.
    NeedsUser(String),
}

/// The step's outcome from how the exchange ended: a completed task's
/// artifacts (else its last message) as output, the agent's words as the
/// reason otherwise.
pub fn ending(outcome: &Outcome) -> Ending {
    let task = match outcome {
        Outcome::Message(message) => return Ending::Output(output(&message.parts)),
        Outcome::Task(task) => task,
    };
    let said = task.status_message.as_ref().map(|m| wire::text_of(&m.parts)).unwrap_or_default();
    let said_or = |fallback: &str| if said.trim().is_empty() { fallback.to_owned() } else { said.clone() };
    match task.state {
        State::Completed => {
            let parts: Vec<Part> = task.artifacts.iter().flat_map(|a| a.parts.iter().cloned()).collect();
            if parts.is_empty() {
                let message = task.status_message.as_ref().map(|m| m.parts.clone()).unwrap_or_default();
                Ending::Output(output(&message))
            } else {
                Ending::Output(output(&parts))
            }
        }
        State::Failed => Ending::Failed(format!("the A2A task failed: {}", said_or("no reason given"))),
        State::Rejected => Ending::Failed(format!("the A2A agent rejected the task: {}", said_or("no reason given"))),
        State::Canceled => Ending::Failed("the A2A task was cancelled".into()),
        State::InputRequired => Ending::NeedsUser(format!(
            "the A2A agent needs more input from the user: {}",
            said_or("it did not say what")
        )),
        State::AuthRequired => Ending::NeedsUser(format!(
            "the A2A agent needs the user to authenticate: {}",
            said_or("it did not say how")
        )),
        State::Submitted | State::Working => Ending::Failed("the A2A task had not ended".into()),
    }
}

/// Parts as a step's output: one data part alone is the output itself;
/// otherwise the text as `{"text": …}`, with the data parts under `data`
/// and files under `files`.
pub fn output(parts: &[Part]) -> Value {
    if let [Part::Data(data)] = parts
        && data.is_object()
    {
        return data.clone();
    }
    let mut out = Map::new();
    out.insert("text".into(), json!(wire::text_of(parts)));
    let data: Vec<Value> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Data(d) => Some(d.clone()),
            _ => None,
        })
        .collect();
    if !data.is_empty() {
        out.insert("data".into(), Value::Array(data));
    }
    let files: Vec<Value> = parts
        .iter()
        .filter_map(|p| match p {
            Part::File(f) => Some(f.clone()),
            _ => None,
        })
        .collect();
    if !files.is_empty() {
        out.insert("files".into(), Value::Array(files));
    }
    Value::Object(out)
}

fn new_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("am-{nanos:x}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Artifact;

    fn task(state: State, said: &str, parts: Vec<Part>) -> Outcome {
        Outcome::Task(Task {
            id: "t".into(),
            context_id: "c".into(),
            state,
            status_message: Some(Message {
                message_id: "m".into(),
                context_id: None,
                task_id: None,
                role: Role::Agent,
                parts: vec![Part::Text(said.into())],
                metadata: None,
            }),
            timestamp: None,
            artifacts: if parts.is_empty() {
                Vec::new()
            } else {
                vec![Artifact { artifact_id: "a".into(), name: None, parts }]
            },
        })
    }

    #[test]
    fn task_states_become_step_outcomes() {
        assert_eq!(
            ending(&task(State::Completed, "done", vec![Part::Text("92 EUR".into())])),
            Ending::Output(json!({"text": "92 EUR"}))
        );
        assert_eq!(
            ending(&task(State::Completed, "done", vec![Part::Data(json!({"eur": 92}))])),
            Ending::Output(json!({"eur": 92}))
        );
        assert_eq!(
            ending(&task(State::Completed, "only words", vec![])),
            Ending::Output(json!({"text": "only words"}))
        );
        assert_eq!(
            ending(&task(State::Failed, "no rate for XYZ", vec![])),
            Ending::Failed("the A2A task failed: no rate for XYZ".into())
        );
        assert!(matches!(ending(&task(State::Rejected, "", vec![])), Ending::Failed(m) if m.contains("rejected")));
        assert_eq!(
            ending(&task(State::InputRequired, "which currency?", vec![])),
            Ending::NeedsUser("the A2A agent needs more input from the user: which currency?".into())
        );
        assert!(
            matches!(ending(&task(State::AuthRequired, "", vec![])), Ending::NeedsUser(m) if m.contains("authenticate"))
        );
        let mixed = output(&[Part::Text("a".into()), Part::Data(json!([1])), Part::Text("b".into())]);
        assert_eq!(mixed, json!({"text": "a\nb", "data": [[1]]}));
    }

    #[test]
    fn streamed_artifacts_append_and_replace() {
        let piece = |text: &str| Artifact { artifact_id: "a".into(), name: None, parts: vec![Part::Text(text.into())] };
        let mut artifacts = Vec::new();
        fold_artifact(&mut artifacts, piece("It is "), false);
        fold_artifact(&mut artifacts, piece("21 °C."), true);
        assert_eq!(artifacts, vec![piece("It is 21 °C.")]);
        fold_artifact(&mut artifacts, piece("Again."), false);
        assert_eq!(artifacts, vec![piece("Again.")]);
        let other = Artifact { artifact_id: "b".into(), name: None, parts: vec![Part::Data(json!({"n": 1}))] };
        fold_artifact(&mut artifacts, other.clone(), true);
        assert_eq!(artifacts, vec![piece("Again."), other]);
    }
}
