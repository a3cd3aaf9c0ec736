CREATE TABLE IF NOT EXISTS agentmesh_orchestration_events (
    request_id TEXT NOT NULL,
    sequence BIGINT NOT NULL,
    round BIGINT NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    PRIMARY KEY (request_id, sequence)
);

CREATE INDEX IF NOT EXISTS agentmesh_orchestration_events_by_expiry ON agentmesh_orchestration_events (expires_at_ms);
