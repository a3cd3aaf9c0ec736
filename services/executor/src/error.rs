//! The executor's errors and the gRPC statuses they become.

use agentmesh_core::plan::PlanError;
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo` reason of an extension that had nothing to run.
pub const NOTHING_TO_RUN: &str = "NOTHING_TO_RUN";

/// What can go wrong answering a request.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The request is malformed; each field names what to fix.
    #[error("{message}")]
    InvalidArgument {
        /// Summary.
        message: String,
        /// `(field, what is wrong)`.
        violations: Vec<(String, String)>,
    },
    /// The plan's structure is invalid.
    #[error("the plan is invalid: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidPlan(Vec<PlanError>),
    /// No such execution.
    #[error("execution `{0}` does not exist (finished executions are kept for the configured retention)")]
    NotFound(String),
    /// An execution with this id exists with a different request.
    #[error(
        "execution `{0}` already exists with a different plan or options; \
         choose another execution_id, or resend the same request to attach to it"
    )]
    AlreadyExists(String),
    /// A limit was reached; the message says which and what to change.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The execution is not in a state that allows the request.
    #[error("{0}")]
    FailedPrecondition(String),
    /// An extension asked only for collaborations, and the planner turned
    /// none of them into a step.
    #[error("nothing to run: {0}")]
    NothingToRun(String),
    /// The store cannot be reached.
    #[error("the execution store is unavailable: {0}")]
    Unavailable(String),
    /// A stored record could not be read.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<agentmesh_store::StoreError> for ExecutorError {
    fn from(e: agentmesh_store::StoreError) -> Self {
        match e {
            agentmesh_store::StoreError::Database(e) => Self::Unavailable(agentmesh_store::describe(&e)),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<ExecutorError> for tonic::Status {
    fn from(e: ExecutorError) -> Self {
        let message = e.to_string();
        match e {
            ExecutorError::InvalidArgument { violations, .. } => {
                let mut details = ErrorDetails::new();
                for (field, description) in violations {
                    details.add_bad_request_violation(field, description);
                }
                tonic::Status::with_error_details(tonic::Code::InvalidArgument, message, details)
            }
            ExecutorError::InvalidPlan(errors) => {
                let mut details = ErrorDetails::new();
                for error in &errors {
                    details.add_bad_request_violation(plan_field(error), error.to_string());
                }
                tonic::Status::with_error_details(tonic::Code::InvalidArgument, message, details)
            }
            ExecutorError::NotFound(_) => tonic::Status::not_found(message),
            ExecutorError::AlreadyExists(_) => tonic::Status::already_exists(message),
            ExecutorError::ResourceExhausted(_) => tonic::Status::resource_exhausted(message),
            ExecutorError::FailedPrecondition(_) => tonic::Status::failed_precondition(message),
            ExecutorError::NothingToRun(_) => {
                let details = ErrorDetails::with_error_info(NOTHING_TO_RUN, "agentmesh.v1.ExecutorService", []);
                tonic::Status::with_error_details(tonic::Code::FailedPrecondition, message, details)
            }
            ExecutorError::Unavailable(_) => tonic::Status::unavailable(message),
            ExecutorError::Internal(_) => tonic::Status::internal(message),
        }
    }
}

/// The request field a plan error is about.
fn plan_field(error: &PlanError) -> String {
    let step = match error {
        PlanError::UnknownAgent { step, .. }
        | PlanError::UnknownCapability { step, .. }
        | PlanError::InvalidStepId { step }
        | PlanError::DuplicateStepId { step }
        | PlanError::SelfDependency { step }
        | PlanError::UnknownDependency { step, .. }
        | PlanError::InvalidParameters { step, .. }
        | PlanError::MalformedReference { step, .. }
        | PlanError::ReferenceOutsideDependencies { step, .. } => step.as_str(),
        PlanError::Cycle { .. } => return "plan.steps".to_owned(),
    };
    let part = match error {
        PlanError::SelfDependency { .. } | PlanError::UnknownDependency { .. } => ".depends_on",
        PlanError::InvalidParameters { .. }
        | PlanError::MalformedReference { .. }
        | PlanError::ReferenceOutsideDependencies { .. } => ".parameters",
        _ => "",
    };
    format!("plan.steps[{step}]{part}")
}
