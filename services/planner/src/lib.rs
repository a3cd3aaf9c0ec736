//! The agentmesh planner: turns a request into a plan over the capabilities
//! that really exist. [`engine::Planner`] holds the planning loop
//! (pre-selection, generation with a constrained schema, parsing, validation
//! against the set shown, and recovery); the gRPC service wraps it.

pub mod bm25;
pub mod engine;
pub mod prompt;

pub use engine::{Interaction, InteractionKind, PlanOutcome, PlanStats, Planner, PlannerSettings, PlanningError};
