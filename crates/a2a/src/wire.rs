//! The A2A wire shapes both roles read and write, in the two protocol
//! versions in use: 1.0 (methods `SendMessage`, `SendStreamingMessage`,
//! `GetTask`, `CancelTask`; states `TASK_STATE_*`; parts `{"text": …}`;
//! results wrapped as `{"task": …}`) and 0.3 (methods `message/send`,
//! `message/stream`, `tasks/get`, `tasks/cancel`; states `completed`;
//! parts `{"kind": "text", …}`; objects tagged by `kind`).

use serde_json::{Map, Value, json};

/// The header naming the protocol version a request speaks.
pub const VERSION_HEADER: &str = "A2A-Version";

/// JSON-RPC error codes A2A defines, beside JSON-RPC's own.
pub mod code {
    /// The request is not valid JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a JSON-RPC request.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The parameters do not fit the method.
    pub const INVALID_PARAMS: i64 = -32602;
    /// The server failed.
    pub const INTERNAL: i64 = -32603;
    /// No such task (or not the caller's).
    pub const TASK_NOT_FOUND: i64 = -32001;
    /// The task has ended and cannot be cancelled.
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    /// The operation is not supported.
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    /// The protocol version asked for is not spoken.
    pub const VERSION_NOT_SUPPORTED: i64 = -32009;
}

/// A protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// A2A 1.0.
    V1,
    /// A2A 0.3.
    V03,
}

impl Version {
    /// Reads a declared version: `1.x` is 1.0, `0.3.x` is 0.3; anything
    /// else is not spoken here.
    pub fn parse(declared: &str) -> Option<Self> {
        let declared = declared.trim().trim_start_matches('v');
        let mut numbers = declared.split('.');
        match (numbers.next(), numbers.next()) {
            (Some("1"), _) => Some(Self::V1),
            (Some("0"), Some("3")) => Some(Self::V03),
            _ => None,
        }
    }

    /// The version as the `A2A-Version` header and cards write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "1.0",
            Self::V03 => "0.3",
        }
    }

    /// The method sending a message, streaming or not.
    pub fn send_method(self, streaming: bool) -> &'static str {
        match (self, streaming) {
            (Self::V1, false) => "SendMessage",
            (Self::V1, true) => "SendStreamingMessage",
            (Self::V03, false) => "message/send",
            (Self::V03, true) => "message/stream",
        }
    }

    /// The method reading a task.
    pub fn get_task_method(self) -> &'static str {
        match self {
            Self::V1 => "GetTask",
            Self::V03 => "tasks/get",
        }
    }
}

/// What a method asks for, whichever version names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Send a message, answer when the task ends (or at once when asked).
    Send,
    /// Send a message, stream the task's events.
    Stream,
    /// Read a task.
    GetTask,
    /// Cancel a task.
    CancelTask,
}

impl Method {
    /// The method and the version it belongs to, from its name.
    pub fn parse(name: &str) -> Option<(Self, Version)> {
        Some(match name {
            "SendMessage" => (Self::Send, Version::V1),
            "SendStreamingMessage" => (Self::Stream, Version::V1),
            "GetTask" => (Self::GetTask, Version::V1),
            "CancelTask" => (Self::CancelTask, Version::V1),
            "message/send" => (Self::Send, Version::V03),
            "message/stream" => (Self::Stream, Version::V03),
            "tasks/get" => (Self::GetTask, Version::V03),
            "tasks/cancel" => (Self::CancelTask, Version::V03),
            _ => return None,
        })
    }
}

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Received, not started.
    Submitted,
    /// Running.
    Working,
    /// Waiting for the user to say more.
    InputRequired,
    /// Waiting for the user to authenticate.
    AuthRequired,
    /// Done, with artifacts.
    Completed,
    /// Cancelled.
    Canceled,
    /// Failed.
    Failed,
    /// Refused by the agent.
    Rejected,
}

const STATES: [(State, &str, &str); 8] = [
    (State::Submitted, "TASK_STATE_SUBMITTED", "submitted"),
    (State::Working, "TASK_STATE_WORKING", "working"),
    (State::InputRequired, "TASK_STATE_INPUT_REQUIRED", "input-required"),
    (State::AuthRequired, "TASK_STATE_AUTH_REQUIRED", "auth-required"),
    (State::Completed, "TASK_STATE_COMPLETED", "completed"),
    (State::Canceled, "TASK_STATE_CANCELED", "canceled"),
    (State::Failed, "TASK_STATE_FAILED", "failed"),
    (State::Rejected, "TASK_STATE_REJECTED", "rejected"),
];

impl State {
    /// The state's name in `version`.
    pub fn name(self, version: Version) -> &'static str {
        let (_, v1, v03) = STATES.iter().find(|(s, _, _)| *s == self).copied().unwrap_or(STATES[0]);
        match version {
            Version::V1 => v1,
            Version::V03 => v03,
        }
    }

    /// Reads a state written in either version (0.3's `cancelled` too;
    /// 0.3's `unknown` and 1.0's unspecified state as still working).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "cancelled" => return Some(Self::Canceled),
            "unknown" | "TASK_STATE_UNSPECIFIED" => return Some(Self::Working),
            _ => {}
        }
        STATES.iter().find(|(_, v1, v03)| *v1 == name || *v03 == name).map(|(s, _, _)| *s)
    }

    /// Whether the task will not change any more by itself: ended, or
    /// waiting for the user.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Submitted | Self::Working)
    }
}

/// A piece of a message or an artifact.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Text.
    Text(String),
    /// Structured data.
    Data(Value),
    /// A file, by URL or inline: kept as it came.
    File(Value),
}

impl Part {
    /// Reads a part in either version.
    pub fn read(value: &Value) -> Option<Self> {
        let object = value.as_object()?;
        if let Some(text) = object.get("text").and_then(Value::as_str) {
            return Some(Self::Text(text.to_owned()));
        }
        if let Some(data) = object.get("data") {
            // 0.3 and 1.0 both carry the data as it is.
            return Some(Self::Data(data.clone()));
        }
        ["file", "url", "raw"].iter().any(|k| object.contains_key(*k)).then(|| Self::File(value.clone()))
    }

    /// Writes the part in `version`.
    pub fn write(&self, version: Version) -> Value {
        match (self, version) {
            (Self::Text(text), Version::V1) => json!({"text": text}),
            (Self::Text(text), Version::V03) => json!({"kind": "text", "text": text}),
            (Self::Data(data), Version::V1) => json!({"data": data}),
            (Self::Data(data), Version::V03) => json!({"kind": "data", "data": data}),
            (Self::File(file), _) => file.clone(),
        }
    }
}

/// Reads the parts of a message or an artifact.
pub fn read_parts(value: &Value) -> Vec<Part> {
    value
        .get("parts")
        .and_then(Value::as_array)
        .map(|parts| parts.iter().filter_map(Part::read).collect())
        .unwrap_or_default()
}

/// The text of some parts, joined by newlines.
pub fn text_of(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The caller.
    User,
    /// The agent.
    Agent,
}

/// A message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Its id.
    pub message_id: String,
    /// The conversation it belongs to.
    pub context_id: Option<String>,
    /// The task it belongs to.
    pub task_id: Option<String>,
    /// Who wrote it.
    pub role: Role,
    /// What it says.
    pub parts: Vec<Part>,
    /// Extra fields for the receiver.
    pub metadata: Option<Map<String, Value>>,
}

impl Message {
    /// Reads a message in either version.
    pub fn read(value: &Value) -> Option<Self> {
        let role = match value.get("role").and_then(Value::as_str)? {
            "ROLE_USER" | "user" => Role::User,
            _ => Role::Agent,
        };
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        Some(Self {
            message_id: text("messageId").unwrap_or_default(),
            context_id: text("contextId"),
            task_id: text("taskId"),
            role,
            parts: read_parts(value),
            metadata: value.get("metadata").and_then(Value::as_object).cloned(),
        })
    }

    /// Writes the message in `version`.
    pub fn write(&self, version: Version) -> Value {
        let mut out = Map::new();
        if version == Version::V03 {
            out.insert("kind".into(), json!("message"));
        }
        out.insert("messageId".into(), json!(self.message_id));
        if let Some(id) = &self.context_id {
            out.insert("contextId".into(), json!(id));
        }
        if let Some(id) = &self.task_id {
            out.insert("taskId".into(), json!(id));
        }
        let role = match (self.role, version) {
            (Role::User, Version::V1) => "ROLE_USER",
            (Role::Agent, Version::V1) => "ROLE_AGENT",
            (Role::User, Version::V03) => "user",
            (Role::Agent, Version::V03) => "agent",
        };
        out.insert("role".into(), json!(role));
        out.insert("parts".into(), Value::Array(self.parts.iter().map(|p| p.write(version)).collect()));
        if let Some(metadata) = &self.metadata {
            out.insert("metadata".into(), Value::Object(metadata.clone()));
        }
        Value::Object(out)
    }
}

/// An output of a task.
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    /// Its id.
    pub artifact_id: String,
    /// Its name.
    pub name: Option<String>,
    /// What it holds.
    pub parts: Vec<Part>,
}

impl Artifact {
    /// Reads an artifact in either version.
    pub fn read(value: &Value) -> Self {
        Self {
            artifact_id: value.get("artifactId").and_then(Value::as_str).unwrap_or_default().to_owned(),
            name: value.get("name").and_then(Value::as_str).map(str::to_owned),
            parts: read_parts(value),
        }
    }

    /// Writes the artifact in `version`.
    pub fn write(&self, version: Version) -> Value {
        let mut out = json!({
            "artifactId": self.artifact_id,
            "parts": self.parts.iter().map(|p| p.write(version)).collect::<Vec<_>>(),
        });
        if let Some(name) = &self.name {
            out["name"] = json!(name);
        }
        out
    }
}

/// A task: where it is, and what it made.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Its id.
    pub id: String,
    /// The conversation it belongs to.
    pub context_id: String,
    /// Where it is.
    pub state: State,
    /// What the agent said with its last state, if anything.
    pub status_message: Option<Message>,
    /// When it reached that state (RFC 3339), if known.
    pub timestamp: Option<String>,
    /// What it made.
    pub artifacts: Vec<Artifact>,
}

impl Task {
    /// A task known only by its ids, working.
    pub fn new(id: String, context_id: String) -> Self {
        Self { id, context_id, state: State::Working, status_message: None, timestamp: None, artifacts: Vec::new() }
    }

    /// Reads a task in either version; `None` when it has no state.
    pub fn read(value: &Value) -> Option<Self> {
        let status = value.get("status")?;
        Some(Self {
            id: value.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
            context_id: value.get("contextId").and_then(Value::as_str).unwrap_or_default().to_owned(),
            state: State::parse(status.get("state").and_then(Value::as_str)?)?,
            status_message: status.get("message").and_then(Message::read),
            timestamp: status.get("timestamp").and_then(Value::as_str).map(str::to_owned),
            artifacts: value
                .get("artifacts")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(Artifact::read).collect())
                .unwrap_or_default(),
        })
    }

    fn status(&self, version: Version) -> Value {
        let mut status = json!({"state": self.state.name(version)});
        if let Some(message) = &self.status_message {
            status["message"] = message.write(version);
        }
        if let Some(at) = &self.timestamp {
            status["timestamp"] = json!(at);
        }
        status
    }

    /// Writes the task in `version` (unwrapped, as `GetTask` answers it).
    pub fn write(&self, version: Version) -> Value {
        let mut out = json!({
            "id": self.id,
            "contextId": self.context_id,
            "status": self.status(version),
            "artifacts": self.artifacts.iter().map(|a| a.write(version)).collect::<Vec<_>>(),
        });
        if version == Version::V03 {
            out["kind"] = json!("task");
        }
        out
    }
}

/// One thing a task's stream (or a send's answer) says.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The whole task.
    Task(Task),
    /// A message, without a task (the agent answered at once).
    Message(Message),
    /// The task moved to a state.
    Status {
        /// The task.
        task_id: String,
        /// The conversation.
        context_id: String,
        /// Its state now.
        state: State,
        /// What the agent said with it.
        message: Option<Message>,
        /// Whether the stream ends here.
        last: bool,
    },
    /// The task made (part of) an artifact.
    Artifact {
        /// The task.
        task_id: String,
        /// The conversation.
        context_id: String,
        /// What it made.
        artifact: Artifact,
        /// Whether it adds to an artifact sent before.
        append: bool,
    },
}

impl Event {
    /// Reads a result in either version: 1.0 wraps it (`{"task": …}`,
    /// `{"statusUpdate": …}`), 0.3 tags it with `kind`.
    pub fn read(result: &Value) -> Option<Self> {
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let status = |v: &Value| {
            let status = v.get("status")?;
            let state = State::parse(status.get("state").and_then(Value::as_str)?)?;
            Some(Self::Status {
                task_id: text(v, "taskId"),
                context_id: text(v, "contextId"),
                state,
                message: status.get("message").and_then(Message::read),
                last: v.get("final").and_then(Value::as_bool).unwrap_or(state.is_final()),
            })
        };
        let artifact = |v: &Value| {
            Some(Self::Artifact {
                task_id: text(v, "taskId"),
                context_id: text(v, "contextId"),
                artifact: Artifact::read(v.get("artifact")?),
                append: v.get("append").and_then(Value::as_bool).unwrap_or(false),
            })
        };
        if let Some(task) = result.get("task") {
            return Task::read(task).map(Self::Task);
        }
        if let Some(message) = result.get("message").filter(|m| m.get("role").is_some()) {
            return Message::read(message).map(Self::Message);
        }
        if let Some(update) = result.get("statusUpdate") {
            return status(update);
        }
        if let Some(update) = result.get("artifactUpdate") {
            return artifact(update);
        }
        match result.get("kind").and_then(Value::as_str) {
            Some("task") => Task::read(result).map(Self::Task),
            Some("message") => Message::read(result).map(Self::Message),
            Some("status-update") => status(result),
            Some("artifact-update") => artifact(result),
            _ => None,
        }
    }

    /// Writes the event as a result in `version`.
    pub fn write(&self, version: Version) -> Value {
        let (key, body) = match self {
            Self::Task(task) => ("task", task.write(version)),
            Self::Message(message) => ("message", message.write(version)),
            Self::Status { task_id, context_id, state, message, last } => {
                let mut status = json!({"state": state.name(version)});
                if let Some(message) = message {
                    status["message"] = message.write(version);
                }
                let mut body = json!({"taskId": task_id, "contextId": context_id, "status": status});
                if version == Version::V03 {
                    body["kind"] = json!("status-update");
                    body["final"] = json!(last);
                }
                ("statusUpdate", body)
            }
            Self::Artifact { task_id, context_id, artifact, append } => {
                let mut body = json!({"taskId": task_id, "contextId": context_id, "artifact": artifact.write(version)});
                if *append {
                    body["append"] = json!(true);
                }
                if version == Version::V03 {
                    body["kind"] = json!("artifact-update");
                }
                ("artifactUpdate", body)
            }
        };
        match version {
            Version::V1 => json!({ key: body }),
            // 0.3 sends the object itself, tagged by `kind`.
            Version::V03 => body,
        }
    }
}

/// A JSON-RPC request.
pub fn request(id: &Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A JSON-RPC answer.
pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error answer.
pub fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_what_cards_declare() {
        assert_eq!(Version::parse("1.0"), Some(Version::V1));
        assert_eq!(Version::parse("1.0.0"), Some(Version::V1));
        assert_eq!(Version::parse("0.3.0"), Some(Version::V03));
        assert_eq!(Version::parse("0.3"), Some(Version::V03));
        assert_eq!(Version::parse("0.2.5"), None);
        assert_eq!(Version::parse(""), None);
    }

    #[test]
    fn states_read_in_both_versions_and_write_back() {
        for (state, v1, v03) in STATES {
            assert_eq!(State::parse(v1), Some(state));
            assert_eq!(State::parse(v03), Some(state));
            assert_eq!(state.name(Version::V1), v1);
            assert_eq!(state.name(Version::V03), v03);
        }
        assert_eq!(State::parse("TASK_STATE_UNSPECIFIED"), Some(State::Working));
        assert_eq!(State::parse("paused"), None);
        assert!(!State::Working.is_final());
        assert!(State::InputRequired.is_final());
    }

    #[test]
    fn a_1_0_answer_and_a_0_3_answer_read_the_same() {
        // Taken from an a2a-sdk agent's answers, ids shortened.
        let v1 = json!({"task": {"id": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_COMPLETED", "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "done"}]}},
            "artifacts": [{"artifactId": "a", "name": "answer", "parts": [{"text": "echo: hello", "mediaType": "text/plain"}]}]}});
        let v03 = json!({"kind": "task", "id": "t", "contextId": "c",
            "status": {"state": "completed", "message": {"kind": "message", "messageId": "m", "role": "agent", "parts": [{"kind": "text", "text": "done"}]}},
            "artifacts": [{"artifactId": "a", "name": "answer", "parts": [{"kind": "text", "text": "echo: hello"}]}]});
        let (Some(a), Some(b)) = (Event::read(&v1), Event::read(&v03)) else { panic!("unread") };
        assert_eq!(a, b);
        let Event::Task(task) = a else { panic!("not a task") };
        assert_eq!(task.state, State::Completed);
        assert_eq!(text_of(&task.artifacts[0].parts), "echo: hello");
        // And they write back to what they were, less what is not kept.
        assert_eq!(Event::Task(task.clone()).write(Version::V03)["status"]["state"], "completed");
        assert_eq!(Event::Task(task).write(Version::V1)["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    }

    #[test]
    fn stream_updates_read_in_both_versions() {
        let v1 = json!({"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING",
            "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "working"}]}}}});
        let v03 = json!({"kind": "status-update", "taskId": "t", "contextId": "c", "final": false,
            "status": {"state": "working", "message": {"kind": "message", "messageId": "m", "role": "agent", "parts": [{"kind": "text", "text": "working"}]}}});
        assert_eq!(Event::read(&v1), Event::read(&v03));
        let artifact = json!({"kind": "artifact-update", "taskId": "t", "contextId": "c", "append": false,
            "artifact": {"artifactId": "a", "parts": [{"kind": "data", "data": {"n": 1}}]}});
        let Some(Event::Artifact { artifact, .. }) = Event::read(&artifact) else { panic!("unread") };
        assert_eq!(artifact.parts, vec![Part::Data(json!({"n": 1}))]);
        for version in [Version::V1, Version::V03] {
            let Some(event) = Event::read(&v1) else { panic!("unread") };
            assert_eq!(Event::read(&event.write(version)), Some(event));
        }
    }

    #[test]
    fn methods_name_their_version() {
        assert_eq!(Method::parse("SendStreamingMessage"), Some((Method::Stream, Version::V1)));
        assert_eq!(Method::parse("tasks/cancel"), Some((Method::CancelTask, Version::V03)));
        assert_eq!(Method::parse("tasks/resubscribe"), None);
        assert_eq!(Version::V03.send_method(true), "message/stream");
    }
}
