CREATE TABLE IF NOT EXISTS agentmesh_agents (
    id TEXT PRIMARY KEY,
    base_url TEXT NOT NULL,
    transport TEXT NOT NULL,
    version TEXT NOT NULL,
    deployment_type TEXT NOT NULL,
    tags TEXT NOT NULL,
    reported_status TEXT NOT NULL,
    registered_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    last_heartbeat_ms BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS agentmesh_capabilities (
    agent_id TEXT NOT NULL REFERENCES agentmesh_agents (id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,
    position INTEGER NOT NULL,
    description TEXT NOT NULL,
    tags TEXT NOT NULL,
    input_schema TEXT,
    output_schema TEXT,
    examples TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    internal BOOLEAN NOT NULL,
    PRIMARY KEY (agent_id, id)
);

CREATE INDEX IF NOT EXISTS agentmesh_capabilities_by_position ON agentmesh_capabilities (agent_id, position);
