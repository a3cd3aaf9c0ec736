CREATE TABLE IF NOT EXISTS agentmesh_executions (
    id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    status TEXT NOT NULL,
    spec TEXT NOT NULL,
    traceparent TEXT NOT NULL DEFAULT '',
    last_sequence INTEGER NOT NULL DEFAULT 0,
    steps INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_expires_at_ms INTEGER,
    cancel_requested TEXT,
    error TEXT NOT NULL DEFAULT '',
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    finished_at_ms INTEGER
);

CREATE INDEX IF NOT EXISTS agentmesh_executions_by_status ON agentmesh_executions (status);
CREATE INDEX IF NOT EXISTS agentmesh_executions_by_request ON agentmesh_executions (request_id, created_at_ms);
CREATE INDEX IF NOT EXISTS agentmesh_executions_newest ON agentmesh_executions (created_at_ms DESC, id DESC);
CREATE INDEX IF NOT EXISTS agentmesh_executions_by_finish ON agentmesh_executions (finished_at_ms);

CREATE TABLE IF NOT EXISTS agentmesh_execution_events (
    execution_id TEXT NOT NULL REFERENCES agentmesh_executions (id) ON DELETE CASCADE,
    sequence INTEGER NOT NULL,
    kind TEXT NOT NULL,
    step_id TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL DEFAULT 0,
    payload TEXT NOT NULL,
    occurred_at_ms INTEGER NOT NULL,
    PRIMARY KEY (execution_id, sequence)
) WITHOUT ROWID;
