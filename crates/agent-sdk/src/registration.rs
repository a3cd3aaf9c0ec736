//! Registration with discovery over REST: register, heartbeat (registering
//! again when discovery no longer knows the agent), deregister.

use std::future::Future;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::SdkError;

/// Discovery as one agent talks to it.
#[derive(Debug, Clone)]
pub(crate) struct Discovery {
    base: String,
    agent_id: String,
    http: reqwest::Client,
}

/// The body of a refusal, for the error: discovery's `message` when it
/// gives one.
async fn reason(response: reqwest::Response) -> String {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or(body);
    format!("{status}: {message}")
}

impl Discovery {
    pub(crate) fn new(base: &str, agent_id: &str, token: Option<&str>) -> Result<Self, SdkError> {
        let base = base.trim().trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SdkError::Discovery(format!(
                "discovery's URL `{base}` needs a scheme, e.g. http://127.0.0.1:7400"
            )));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| SdkError::Discovery("the agent's token holds characters a header cannot".into()))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = agentmesh_telemetry::http::client_builder()
            .timeout(Duration::from_secs(10))
            .default_headers(headers)
            .build()
            .map_err(|e| SdkError::Discovery(format!("cannot build an HTTP client: {e}")))?;
        Ok(Self { base, agent_id: agent_id.to_owned(), http })
    }

    fn agent_url(&self) -> String {
        let id: String =
            percent_encoding::utf8_percent_encode(&self.agent_id, percent_encoding::NON_ALPHANUMERIC).collect();
        format!("{}/api/v1/agents/{id}", self.base)
    }

    fn unreachable(&self, e: &reqwest::Error) -> SdkError {
        let why = if e.is_connect() {
            "nothing accepts connections there (is discovery running? `agentmesh up` starts it)".to_owned()
        } else if e.is_timeout() {
            "it did not answer within 10 s".to_owned()
        } else {
            e.to_string()
        };
        SdkError::Discovery(format!(
            "agent {}: cannot reach discovery at {}: {why}; set AGENTMESH_DISCOVERY_URL or Options::discovery_url to its address",
            self.agent_id, self.base
        ))
    }

    pub(crate) async fn register(&self, registration: &Value) -> Result<(), SdkError> {
        let response = self
            .http
            .post(format!("{}/api/v1/agents", self.base))
            .json(registration)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if response.status().is_success() {
            return Ok(());
        }
        Err(SdkError::Discovery(format!(
            "agent {}: discovery at {} refused the registration: {}",
            self.agent_id,
            self.base,
            reason(response).await
        )))
    }

    /// One heartbeat; registers again when discovery answers 404 (it was
    /// removed, or discovery lost its data). Returns the heartbeat interval
    /// discovery expects, when it says.
    async fn heartbeat(&self, registration: &Value) -> Result<Option<Duration>, SdkError> {
        let response =
            self.http.post(format!("{}/heartbeat", self.agent_url())).send().await.map_err(|e| self.unreachable(&e))?;
        match response.status() {
            s if s.is_success() => {
                let said: Value = response.json().await.unwrap_or_default();
                Ok(said["heartbeat_interval_seconds"]
                    .as_f64()
                    .filter(|s| s.is_finite() && *s >= 0.05 && *s <= 3600.0)
                    .map(Duration::from_secs_f64))
            }
            StatusCode::NOT_FOUND => {
                tracing::warn!(agent = %self.agent_id, "discovery no longer knows the agent; registering again");
                self.register(registration).await.map(|()| None)
            }
            _ => Err(SdkError::Discovery(format!("heartbeat refused: {}", reason(response).await))),
        }
    }

    /// Heartbeats until `stop`, every `chosen` interval, else every interval
    /// discovery says it expects (10 s until it has said); failures are
    /// logged and the next beat tries again.
    pub(crate) async fn heartbeat_loop(
        self,
        registration: Value,
        chosen: Option<Duration>,
        stop: impl Future<Output = ()>,
    ) {
        let beats = async {
            let mut interval = chosen.unwrap_or(Duration::from_secs(10));
            loop {
                tokio::time::sleep(interval).await;
                match self.heartbeat(&registration).await {
                    Ok(Some(expected)) if chosen.is_none() => interval = expected,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(agent = %self.agent_id, error = %e, "heartbeat failed; trying again at the next interval");
                    }
                }
            }
        };
        tokio::select! {
            () = beats => {},
            () = stop => {},
        }
    }

    pub(crate) async fn deregister(&self) -> Result<(), SdkError> {
        let response = self.http.delete(self.agent_url()).send().await.map_err(|e| self.unreachable(&e))?;
        match response.status() {
            s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
            _ => Err(SdkError::Discovery(format!(
                "agent {}: discovery refused the deregistration: {}",
                self.agent_id,
                reason(response).await
            ))),
        }
    }
}
