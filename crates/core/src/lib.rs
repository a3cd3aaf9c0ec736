//! The agentmesh domain model. Nothing here knows about gRPC, SQL or HTTP:
//! agents and their capabilities, health derived from heartbeats, invocation
//! targets, wildcard patterns, registration validation and catalog queries.

pub mod agent;
pub mod bm25;
pub mod execution;
pub mod fence;
pub mod grounding;
pub mod health;
pub mod hybrid;
pub mod import;
pub mod index;
pub mod llm;
pub mod pattern;
pub mod plan;
pub mod plan_schema;
pub mod query;
pub mod reference;
pub mod repeats;
pub mod schema;
pub mod target;
pub mod validate;

pub use agent::{AgentDefinition, AgentRecord, Capability, CapabilityKind, DeploymentType, Hints, RawJson, Transport};
pub use health::{HealthPolicy, HealthStatus, ReportedStatus};
pub use index::CatalogIndex;
pub use llm::ReasoningEffort;
pub use pattern::Pattern;
pub use query::{CapabilityQuery, CatalogPage, MatchedAgent};
pub use target::{InvocationTarget, TargetParseError};
pub use validate::{FieldError, validate_definition};
