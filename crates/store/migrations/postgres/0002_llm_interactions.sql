CREATE TABLE IF NOT EXISTS agentmesh_llm_interactions (
    id BIGSERIAL PRIMARY KEY,
    request_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    prompt TEXT NOT NULL,
    response TEXT NOT NULL,
    model TEXT NOT NULL,
    provider TEXT NOT NULL,
    structured_mode TEXT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    latency_ms BIGINT NOT NULL,
    error TEXT,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);

CREATE INDEX IF NOT EXISTS agentmesh_llm_interactions_by_request ON agentmesh_llm_interactions (request_id, id);
CREATE INDEX IF NOT EXISTS agentmesh_llm_interactions_by_expiry ON agentmesh_llm_interactions (expires_at_ms);
