-- One row per write probe: readiness checks (`/readyz`) upsert it, so that "ready" means a
-- write really committed, not only that a read answered. `writes` counts the probes, so every
-- probe changes the row (SQLite writes nothing for an update that changes no byte).
CREATE TABLE IF NOT EXISTS redrive_probe (
    name       TEXT PRIMARY KEY,
    checked_at BIGINT NOT NULL,
    writes     BIGINT NOT NULL DEFAULT 1
);
