-- Who owns what, once callers have identities.
-- An agent may name a credential the executor presents when it calls it
-- (the name of a secret the executor holds, never the secret).
ALTER TABLE agentmesh_agents ADD COLUMN credential TEXT;

-- The principal an agent id was bound to by its first registration (a
-- caller with the role `agent:*`); kept when the agent goes away, so that
-- nobody else can take the id over.
CREATE TABLE IF NOT EXISTS agentmesh_agent_bindings (
    agent_id TEXT PRIMARY KEY,
    principal TEXT NOT NULL,
    bound_at_ms BIGINT NOT NULL
);

-- The client an LLM call was made for: a client reads its own interactions.
ALTER TABLE agentmesh_llm_interactions ADD COLUMN principal TEXT NOT NULL DEFAULT '';

-- The client that started an execution, as a column so that a client's
-- listing pages over its own executions only.
ALTER TABLE agentmesh_executions ADD COLUMN principal TEXT NOT NULL DEFAULT '';
UPDATE agentmesh_executions SET principal = COALESCE((spec::jsonb ->> 'principal'), '') WHERE spec LIKE '{%';
CREATE INDEX IF NOT EXISTS agentmesh_executions_by_principal ON agentmesh_executions (principal, created_at_ms DESC, id DESC);
