//! Errors of the discovery service, mapped to gRPC statuses and to the REST
//! error body (`error`, `message`, `details`, `request_id`).

use agentmesh_core::FieldError;
use agentmesh_store::StoreError;
use http::StatusCode;
use serde_json::{Value, json};
use tonic_types::{ErrorDetails, StatusExt};

/// Everything that can go wrong in a discovery request.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A query parameter or request field has a bad value.
    #[error("{message}")]
    InvalidParameter {
        /// Parameter name.
        parameter: String,
        /// Value given.
        provided: String,
        /// Human message.
        message: String,
        /// Allowed values, when there is a fixed set.
        allowed: Option<Vec<String>>,
    },
    /// A registration failed validation.
    #[error("registration is invalid: {}", summarize(.0))]
    Validation(Vec<FieldError>),
    /// The body is not the JSON expected.
    #[error("request body is not valid: {message}")]
    InvalidJson {
        /// What is wrong.
        message: String,
        /// JSON path where it went wrong.
        path: String,
    },
    /// The body exceeds the size limit.
    #[error("request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// No such agent.
    #[error("agent `{0}` is not registered")]
    NotFound(String),
    /// Every `WatchCatalog` slot is taken.
    #[error(
        "too many WatchCatalog streams are open (max_watch_streams = {0}); close idle streams or raise discovery's max_watch_streams"
    )]
    TooManyWatchStreams(usize),
    /// The caller may not act on this agent.
    #[error("`{principal}` may not register, heartbeat or remove agent `{agent}`: {why}")]
    PermissionDenied {
        /// Who called.
        principal: String,
        /// The agent it named.
        agent: String,
        /// Why not.
        why: String,
    },
    /// An MCP agent's server did not list its tools.
    #[error("cannot list the tools of MCP agent `{agent}`: {reason}")]
    McpServer {
        /// The agent.
        agent: String,
        /// What went wrong.
        reason: String,
    },
    /// An A2A agent's card could not be read.
    #[error("cannot read the Agent Card of A2A agent `{agent}`: {reason}")]
    A2aAgent {
        /// The agent.
        agent: String,
        /// What went wrong.
        reason: String,
    },
    /// The database cannot be reached and nothing cached can answer.
    #[error("the agent registry database is unavailable: {0}")]
    Unavailable(String),
    /// Anything else.
    #[error("internal error: {0}")]
    Internal(String),
}

fn summarize(errors: &[FieldError]) -> String {
    errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect::<Vec<_>>().join("; ")
}

impl From<StoreError> for DiscoveryError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Database(e) => Self::Unavailable(agentmesh_store::describe(&e)),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl DiscoveryError {
    /// A bad parameter value.
    pub fn invalid(parameter: &str, provided: &str, message: impl Into<String>) -> Self {
        Self::InvalidParameter {
            parameter: parameter.to_owned(),
            provided: provided.to_owned(),
            message: message.into(),
            allowed: None,
        }
    }

    /// A bad parameter value from a fixed set.
    pub fn not_one_of(parameter: &str, provided: &str, allowed: &[&str]) -> Self {
        Self::InvalidParameter {
            parameter: parameter.to_owned(),
            provided: provided.to_owned(),
            message: format!("Invalid {parameter} parameter. Must be one of: {}", allowed.join(", ")),
            allowed: Some(allowed.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    /// Refuses `principal` on agent `id`, saying why.
    pub fn denied(principal: &agentmesh_server::Principal, id: &str, why: impl Into<String>) -> Self {
        Self::PermissionDenied { principal: principal.name.clone(), agent: id.to_owned(), why: why.into() }
    }

    /// HTTP status of the REST response.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::InvalidParameter { .. } | Self::Validation(_) | Self::InvalidJson { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::TooManyWatchStreams(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::PermissionDenied { .. } => StatusCode::FORBIDDEN,
            Self::McpServer { .. } | Self::A2aAgent { .. } => StatusCode::BAD_GATEWAY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The REST error body.
    pub fn body(&self, request_id: &str) -> Value {
        let (error, details) = match self {
            Self::InvalidParameter { parameter, provided, allowed, .. } => {
                let mut details = json!({"parameter": parameter, "provided": provided});
                if let Some(allowed) = allowed {
                    details["allowed"] = json!(allowed);
                }
                ("invalid_parameter", Some(details))
            }
            Self::Validation(errors) => ("validation_failed", Some(json!({"errors": errors}))),
            Self::InvalidJson { path, .. } => ("invalid_json", Some(json!({"path": path}))),
            Self::PayloadTooLarge(limit) => ("payload_too_large", Some(json!({"limit_bytes": limit}))),
            Self::NotFound(id) => ("not_found", Some(json!({"agent_id": id}))),
            Self::TooManyWatchStreams(limit) => ("too_many_watch_streams", Some(json!({"max_watch_streams": limit}))),
            Self::PermissionDenied { agent, .. } => ("permission_denied", Some(json!({"agent_id": agent}))),
            Self::McpServer { agent, .. } => ("mcp_server_unreachable", Some(json!({"agent_id": agent}))),
            Self::A2aAgent { agent, .. } => ("a2a_agent_unreachable", Some(json!({"agent_id": agent}))),
            Self::Unavailable(_) => ("unavailable", None),
            Self::Internal(_) => ("internal_error", None),
        };
        let message = match self {
            // Never leak database internals to clients; they are logged.
            Self::Internal(_) => "Failed to retrieve agent capabilities".to_owned(),
            other => other.to_string(),
        };
        let mut body = json!({"error": error, "message": message, "request_id": request_id});
        if let Some(details) = details {
            body["details"] = details;
        }
        body
    }
}

impl From<DiscoveryError> for tonic::Status {
    fn from(e: DiscoveryError) -> Self {
        let message = e.to_string();
        match e {
            DiscoveryError::InvalidParameter { parameter, .. } => {
                let details = ErrorDetails::with_bad_request_violation(parameter, message.clone());
                tonic::Status::with_error_details(tonic::Code::InvalidArgument, message, details)
            }
            DiscoveryError::Validation(errors) => {
                let mut details = ErrorDetails::new();
                for err in &errors {
                    details.add_bad_request_violation(err.field.clone(), err.message.clone());
                }
                tonic::Status::with_error_details(tonic::Code::InvalidArgument, message, details)
            }
            DiscoveryError::InvalidJson { .. } => tonic::Status::invalid_argument(message),
            DiscoveryError::PayloadTooLarge(_) => tonic::Status::resource_exhausted(message),
            DiscoveryError::NotFound(_) => tonic::Status::not_found(message),
            DiscoveryError::TooManyWatchStreams(_) => tonic::Status::resource_exhausted(message),
            DiscoveryError::PermissionDenied { .. } => tonic::Status::permission_denied(message),
            DiscoveryError::McpServer { .. } | DiscoveryError::A2aAgent { .. } | DiscoveryError::Unavailable(_) => {
                tonic::Status::unavailable(message)
            }
            DiscoveryError::Internal(_) => tonic::Status::internal(message),
        }
    }
}
