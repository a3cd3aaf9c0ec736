-- Migrations were recorded in agentmesh_schema_migrations by the first releases;
-- sqlx's _sqlx_migrations records them now (the scripts before this one are
-- idempotent, so a database from then is brought up to date as it is).
DROP TABLE IF EXISTS agentmesh_schema_migrations;
