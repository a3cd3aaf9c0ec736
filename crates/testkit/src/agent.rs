//! A fake agent: a real HTTP server on an ephemeral port whose capabilities
//! answer from a script (a reply, a sequence of replies, a delay, an echo of
//! the parameters, a call that never ends), and that records every call it
//! receives: its path, headers, body, when it started and ended, and
//! whether the caller hung up before the answer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// JSON body (`Value::Null`: an empty body).
    pub body: Value,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Wait before answering.
    pub delay: Duration,
}

impl Answer {
    /// A 200 with this body.
    pub fn ok(body: Value) -> Self {
        Self { status: 200, body, headers: Vec::new(), delay: Duration::ZERO }
    }

    /// Another status with this body.
    pub fn status(status: u16, body: Value) -> Self {
        Self { status, body, headers: Vec::new(), delay: Duration::ZERO }
    }

    /// The same answer after `delay`.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// With a header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// How a capability behaves.
#[derive(Debug, Clone)]
pub enum Behavior {
    /// The same answer every time.
    Always(Answer),
    /// These answers in turn; the last one repeats.
    Sequence(Vec<Answer>),
    /// Answers `{"echo": <parameters>}` after a delay.
    Echo(Duration),
    /// Never answers.
    Hang,
}

/// One call the agent received.
#[derive(Debug, Clone)]
pub struct ReceivedCall {
    /// The capability id from the path.
    pub capability: String,
    /// Request headers.
    pub headers: HeaderMap,
    /// The JSON body.
    pub body: Value,
    /// When it arrived.
    pub started: Instant,
    /// When it was answered (`None`: not answered, or the caller hung up).
    pub ended: Option<Instant>,
    /// The caller hung up before the answer.
    pub abandoned: bool,
}

impl ReceivedCall {
    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct Shared {
    behaviors: Mutex<HashMap<String, Behavior>>,
    counters: Mutex<HashMap<String, usize>>,
    calls: Mutex<Vec<ReceivedCall>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// The fake agent; stops when dropped.
pub struct FakeAgent {
    /// Its address.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Marks a call abandoned when its handler is dropped before answering.
struct CallGuard {
    shared: Arc<Shared>,
    index: usize,
    answered: bool,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut calls) = self.shared.calls.lock()
            && let Some(call) = calls.get_mut(self.index)
        {
            if self.answered {
                call.ended = Some(Instant::now());
            } else {
                call.abandoned = true;
            }
        }
    }
}

async fn invoke(
    State(shared): State<Arc<Shared>>,
    Path((_kind, capability)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let index = {
        let mut calls = shared.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        calls.push(ReceivedCall {
            capability: capability.clone(),
            headers,
            body: body.clone(),
            started: Instant::now(),
            ended: None,
            abandoned: false,
        });
        calls.len() - 1
    };
    let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let mut guard = CallGuard { shared: shared.clone(), index, answered: false };
    let behavior = shared.behaviors.lock().ok().and_then(|b| b.get(&capability).cloned());
    let answer = match behavior {
        None => Answer::status(404, json!({"error": format!("no capability {capability}")})),
        Some(Behavior::Always(answer)) => answer,
        Some(Behavior::Sequence(list)) => {
            let n = {
                let mut counters = shared.counters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let n = counters.entry(capability.clone()).or_insert(0);
                *n += 1;
                *n
            };
            list.get(n - 1).or(list.last()).cloned().unwrap_or_else(|| Answer::ok(Value::Null))
        }
        Some(Behavior::Echo(delay)) => Answer::ok(json!({"echo": body})).after(delay),
        Some(Behavior::Hang) => {
            std::future::pending::<()>().await;
            Answer::ok(Value::Null)
        }
    };
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    guard.answered = true;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response =
        if answer.body.is_null() { status.into_response() } else { (status, axum::Json(answer.body)).into_response() };
    for (name, value) in answer.headers {
        if let (Ok(name), Ok(value)) =
            (axum::http::HeaderName::try_from(name), axum::http::HeaderValue::try_from(value))
        {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

impl FakeAgent {
    /// Starts an agent whose capabilities behave as given, at
    /// `/skills/{id}` and `/reasoners/{id}`.
    pub async fn start(behaviors: Vec<(&str, Behavior)>) -> anyhow::Result<Self> {
        let listener = crate::bind_local().await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        {
            let mut map = shared.behaviors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (id, behavior) in behaviors {
                map.insert(id.to_owned(), behavior);
            }
        }
        let app =
            axum::Router::new().route("/{kind}/{capability}", axum::routing::post(invoke)).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, shared, task })
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes how a capability behaves from now on.
    pub fn set(&self, capability: &str, behavior: Behavior) {
        if let Ok(mut map) = self.shared.behaviors.lock() {
            map.insert(capability.to_owned(), behavior);
        }
        if let Ok(mut counters) = self.shared.counters.lock() {
            counters.remove(capability);
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<ReceivedCall> {
        self.shared.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Calls of one capability.
    pub fn calls_to(&self, capability: &str) -> Vec<ReceivedCall> {
        self.calls().into_iter().filter(|c| c.capability == capability).collect()
    }

    /// The most calls that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    /// The registration document of an agent `id` served here, with these
    /// skills (`(id, output schema)`), as for `POST /api/v1/agents`.
    pub fn registration(&self, id: &str, skills: &[(&str, Option<Value>)]) -> Value {
        let skills: Vec<Value> = skills
            .iter()
            .map(|(skill, output)| {
                let mut skill = json!({"id": skill, "description": format!("{skill} of {id}")});
                if let Some(schema) = output {
                    skill["output_schema"] = schema.clone();
                }
                skill
            })
            .collect();
        json!({"id": id, "base_url": self.url(), "skills": skills})
    }
}
