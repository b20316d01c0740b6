-- One source of truth for the policies: every version of the policies document
-- (`redrive policy apply FILE`), whole (retry policies, breakers, quotas, egress, alerts,
-- payload, schedules), numbered from 1. A version is stored only when its text differs from
-- the latest one (`digest`: SHA-256 of `body`, hex). `applied_at` is milliseconds since the
-- Unix epoch in the database's clock; `applied_by`/`via` the audit trail's actor.
-- Workers poll MAX(version) and reload a new one while they run.
CREATE TABLE IF NOT EXISTS redrive_policy_versions (
    version    BIGINT PRIMARY KEY,
    body       TEXT   NOT NULL,
    digest     TEXT   NOT NULL,
    applied_at BIGINT NOT NULL,
    applied_by TEXT   NOT NULL,
    via        TEXT   NOT NULL,
    comment    TEXT
);

-- The policies each live worker process runs (`redrive workers`): `v3`, `file (differs from
-- v3)`, `built-in`... NULL: a worker that does not say (an older build, or a library user
-- who set none).
ALTER TABLE redrive_workers ADD COLUMN policy_version TEXT;
