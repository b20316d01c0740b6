-- The live workers of the fleet: each worker process registers itself when it starts,
-- refreshes `last_seen` while it runs (its heartbeat) and deletes its row when it stops
-- cleanly. A row not seen for `WORKER_STALE_AFTER` (the store's constant) belongs to a
-- worker that vanished: it is ignored and deleted by the next read of the registry.
-- `queues` is a JSON array of queue names (empty: every queue); `kinds` a JSON array of the
-- job kinds it runs (NULL: every kind). Times are milliseconds since the Unix epoch (UTC).
CREATE TABLE IF NOT EXISTS redrive_workers (
    name        TEXT PRIMARY KEY,
    host        TEXT   NOT NULL,
    pid         BIGINT NOT NULL,
    queues      TEXT   NOT NULL,
    kinds       TEXT,
    concurrency BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    last_seen   BIGINT NOT NULL
);

-- Lookup by idempotency key across queues (`redrive jobs --key`, `GET /v1/jobs?key=`): the
-- unique (queue, idempotency_key) index cannot serve a key without its queue.
CREATE INDEX IF NOT EXISTS redrive_jobs_key ON redrive_jobs (idempotency_key, id)
    WHERE idempotency_key IS NOT NULL;
