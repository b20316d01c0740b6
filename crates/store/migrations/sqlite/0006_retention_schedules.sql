-- Retention and periodic jobs (issue 17, items 4 and 5). Times are milliseconds since the
-- Unix epoch (UTC).

-- Pruning reads finished jobs of one state, oldest first: one index per (state, finished_at)
-- replaces the index on finished_at alone (the old prune was its only reader), so a job's
-- finish still writes one entry to one index.
DROP INDEX IF EXISTS redrive_jobs_finished;
CREATE INDEX IF NOT EXISTS redrive_jobs_prune
    ON redrive_jobs (state, finished_at) WHERE finished_at IS NOT NULL;

-- Named leases for fleet-wide singletons (the pruner): one holder at a time until
-- `expires_at`; a holder renews before that, a crashed one's lease simply runs out.
CREATE TABLE IF NOT EXISTS redrive_leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT   NOT NULL,
    acquired_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);

-- Periodic jobs: a cron expression (UTC) and the job each tick enqueues. `next_tick` is the
-- first tick not handled yet (NULL: the expression has no more ticks); a scheduler moves it
-- with a compare-and-set in the transaction that enqueues the ticks' jobs.
CREATE TABLE IF NOT EXISTS redrive_schedules (
    name         TEXT PRIMARY KEY,
    cron         TEXT   NOT NULL,
    missed       TEXT   NOT NULL,
    queue        TEXT   NOT NULL,
    kind         TEXT   NOT NULL,
    payload      TEXT   NOT NULL,
    dependency   TEXT,
    priority     BIGINT NOT NULL DEFAULT 0,
    policy       TEXT   NOT NULL,
    max_attempts BIGINT NOT NULL,
    ttl_ms       BIGINT,
    origin       TEXT   NOT NULL,
    next_tick    BIGINT,
    last_tick    BIGINT,
    last_job_id  BIGINT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS redrive_schedules_next ON redrive_schedules (next_tick);
