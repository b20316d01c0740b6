-- redrive's queue on SQLite. Times are milliseconds since the Unix epoch (UTC).
CREATE TABLE IF NOT EXISTS redrive_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    idempotency_key  TEXT,
    dependency       TEXT,
    priority         INTEGER NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    exceptions       INTEGER NOT NULL DEFAULT 0,
    defers           INTEGER NOT NULL DEFAULT 0,
    consecutive_auth INTEGER NOT NULL DEFAULT 0,
    prev_delay_ms    INTEGER,
    max_attempts     INTEGER NOT NULL,
    policy           TEXT    NOT NULL,
    run_at           INTEGER NOT NULL,
    first_attempt_at INTEGER,
    ttl_ms           INTEGER,
    deadline         INTEGER,
    lease_owner      TEXT,
    lease_token      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    defer_reason     TEXT,
    dead_reason      TEXT,
    last_error       TEXT,
    result           TEXT,
    replays          INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS redrive_jobs_queue_key
    ON redrive_jobs (queue, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS redrive_jobs_claim
    ON redrive_jobs (queue, priority, run_at, id) WHERE state IN ('scheduled', 'available', 'deferred');
CREATE INDEX IF NOT EXISTS redrive_jobs_lease
    ON redrive_jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS redrive_jobs_state ON redrive_jobs (state, queue, id);
CREATE INDEX IF NOT EXISTS redrive_jobs_finished ON redrive_jobs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS redrive_attempts (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id       INTEGER NOT NULL REFERENCES redrive_jobs (id) ON DELETE CASCADE,
    number       INTEGER NOT NULL,
    replay       INTEGER NOT NULL,
    lease_token  INTEGER NOT NULL,
    worker       TEXT,
    started_at   INTEGER NOT NULL,
    duration_ms  INTEGER NOT NULL,
    class        TEXT    NOT NULL,
    http_status  INTEGER,
    error        TEXT,
    delay_ms     INTEGER,
    mode         TEXT,
    counted      BOOLEAN NOT NULL
);
CREATE INDEX IF NOT EXISTS redrive_attempts_job ON redrive_attempts (job_id, id);

CREATE TABLE IF NOT EXISTS redrive_dependencies (
    name          TEXT PRIMARY KEY,
    state         TEXT    NOT NULL DEFAULT 'closed',
    open_until    INTEGER,
    probe_permits INTEGER NOT NULL DEFAULT 0,
    paused_until  INTEGER,
    pause_reason  TEXT,
    updated_at    INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS redrive_dependency_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    dependency TEXT    NOT NULL,
    at         INTEGER NOT NULL,
    from_state TEXT    NOT NULL,
    to_state   TEXT    NOT NULL,
    reason     TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS redrive_dependency_events_dep ON redrive_dependency_events (dependency, id);
