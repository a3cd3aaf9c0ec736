//! Embedded migrations: ordered SQL scripts applied once each, recorded in
//! `agentmesh_schema_migrations`.

/// One migration: a version and the script for each backend.
pub(crate) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub postgres: &'static str,
    pub sqlite: &'static str,
}

/// The table that records applied migrations (same SQL for both backends).
pub(crate) const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS agentmesh_schema_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at_ms BIGINT NOT NULL
)";

/// Every migration, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "agents and capabilities",
        postgres: include_str!("../migrations/postgres/0001_agents.sql"),
        sqlite: include_str!("../migrations/sqlite/0001_agents.sql"),
    },
    Migration {
        version: 2,
        description: "LLM interaction log",
        postgres: include_str!("../migrations/postgres/0002_llm_interactions.sql"),
        sqlite: include_str!("../migrations/sqlite/0002_llm_interactions.sql"),
    },
    Migration {
        version: 3,
        description: "executions and their event logs",
        postgres: include_str!("../migrations/postgres/0003_executions.sql"),
        sqlite: include_str!("../migrations/sqlite/0003_executions.sql"),
    },
    Migration {
        version: 4,
        description: "the gateway's orchestration events",
        postgres: include_str!("../migrations/postgres/0004_orchestration_events.sql"),
        sqlite: include_str!("../migrations/sqlite/0004_orchestration_events.sql"),
    },
];
