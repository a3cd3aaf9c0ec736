CREATE TABLE IF NOT EXISTS agentmesh_executions (
    id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    status TEXT NOT NULL,
    spec TEXT NOT NULL,
    traceparent TEXT NOT NULL DEFAULT '',
    last_sequence BIGINT NOT NULL DEFAULT 0,
    steps BIGINT NOT NULL DEFAULT 0,
    owner TEXT,
    lease_expires_at_ms BIGINT,
    cancel_requested TEXT,
    error TEXT NOT NULL DEFAULT '',
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    finished_at_ms BIGINT
);

CREATE INDEX IF NOT EXISTS agentmesh_executions_unfinished ON agentmesh_executions (lease_expires_at_ms)
    WHERE status IN ('pending', 'running');
CREATE INDEX IF NOT EXISTS agentmesh_executions_by_owner ON agentmesh_executions (owner) WHERE status IN ('pending', 'running');
CREATE INDEX IF NOT EXISTS agentmesh_executions_by_request ON agentmesh_executions (request_id, created_at_ms);
CREATE INDEX IF NOT EXISTS agentmesh_executions_newest ON agentmesh_executions (created_at_ms DESC, id DESC);
CREATE INDEX IF NOT EXISTS agentmesh_executions_by_finish ON agentmesh_executions (finished_at_ms);

CREATE TABLE IF NOT EXISTS agentmesh_execution_events (
    execution_id TEXT NOT NULL REFERENCES agentmesh_executions (id) ON DELETE CASCADE,
    sequence BIGINT NOT NULL,
    kind TEXT NOT NULL,
    step_id TEXT NOT NULL DEFAULT '',
    attempt BIGINT NOT NULL DEFAULT 0,
    payload TEXT NOT NULL,
    occurred_at_ms BIGINT NOT NULL,
    PRIMARY KEY (execution_id, sequence)
);
