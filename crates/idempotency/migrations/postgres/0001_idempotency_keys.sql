-- The idempotency layer's table (postgres). `IF NOT EXISTS`: databases whose table was made
-- before this crate had migrations (by `ensure_schema`'s `CREATE TABLE IF NOT EXISTS`) keep it.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    id                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope              TEXT        NOT NULL,
    idem_key           TEXT        NOT NULL CHECK (octet_length(idem_key) BETWEEN 1 AND 255),
    request_method     TEXT        NOT NULL,
    request_path       TEXT        NOT NULL,
    fingerprint        BYTEA       NOT NULL,
    state              TEXT        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    recovery_point     TEXT        NOT NULL DEFAULT 'started',
    lock_token         TEXT        NULL,
    locked_until       TIMESTAMPTZ NULL,
    attempts           INT         NOT NULL DEFAULT 1,
    response_status    INT         NULL,
    response_headers   JSONB       NULL,
    response_body      BYTEA       NULL,
    replay_unavailable BOOLEAN     NOT NULL DEFAULT FALSE,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_run_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at       TIMESTAMPTZ NULL,
    expires_at         TIMESTAMPTZ NOT NULL,
    CONSTRAINT idempotency_keys_scope_key UNIQUE (scope, idem_key),
    CONSTRAINT idempotency_keys_completed_has_response CHECK (state <> 'completed' OR response_status IS NOT NULL)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);

CREATE INDEX IF NOT EXISTS idempotency_keys_stuck ON idempotency_keys (last_run_at) WHERE state = 'in_progress';
