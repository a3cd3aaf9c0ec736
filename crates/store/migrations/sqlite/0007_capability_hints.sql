-- What calling a capability does to the world, when declared (MCP tool
-- annotations arrive here): a JSON object such as {"idempotent": false};
-- NULL when nothing is declared.
ALTER TABLE agentmesh_capabilities ADD COLUMN hints TEXT;
