-- The idempotency layer's table (sqlite). `IF NOT EXISTS`: databases whose table was made
-- before this crate had migrations (by `ensure_schema`'s `CREATE TABLE IF NOT EXISTS`) keep it.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    id                 INTEGER PRIMARY KEY,
    scope              TEXT    NOT NULL,
    idem_key           TEXT    NOT NULL CHECK (length(CAST(idem_key AS BLOB)) BETWEEN 1 AND 255),
    request_method     TEXT    NOT NULL,
    request_path       TEXT    NOT NULL,
    fingerprint        BLOB    NOT NULL,
    state              TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
    recovery_point     TEXT    NOT NULL DEFAULT 'started',
    lock_token         TEXT    NULL,
    locked_until       INTEGER NULL,
    attempts           INTEGER NOT NULL DEFAULT 1,
    response_status    INTEGER NULL,
    response_headers   TEXT    NULL,
    response_body      BLOB    NULL,
    replay_unavailable INTEGER NOT NULL DEFAULT 0,
    created_at         INTEGER NOT NULL,
    last_run_at        INTEGER NOT NULL,
    completed_at       INTEGER NULL,
    expires_at         INTEGER NOT NULL,
    UNIQUE (scope, idem_key),
    CHECK (state <> 'completed' OR response_status IS NOT NULL)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);

CREATE INDEX IF NOT EXISTS idempotency_keys_stuck ON idempotency_keys (last_run_at) WHERE state = 'in_progress';
