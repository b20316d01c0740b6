-- Card declines and per-card reattempt quotas (the networks' reattempt rules).
-- A job's card key: a card fingerprint or payment-method id, never a card number.
ALTER TABLE redrive_jobs ADD COLUMN quota_key TEXT;

-- Every decline a job got, with the network's advice (shown by `redrive show`).
CREATE TABLE IF NOT EXISTS redrive_declines (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      INTEGER NOT NULL REFERENCES redrive_jobs (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    quota_key   TEXT,
    at          BIGINT  NOT NULL,
    network     TEXT    NOT NULL,
    code        TEXT,
    category    INTEGER,
    advice_code INTEGER,
    rule        TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS redrive_declines_job ON redrive_declines (job_id, id);

-- Reattempts taken against a card key's quota, fleet-wide (counted per rolling window).
-- Not tied to a job's life: a pruned job's reattempts still count against its card.
CREATE TABLE IF NOT EXISTS redrive_reattempts (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    quota_key TEXT    NOT NULL,
    network   TEXT    NOT NULL,
    job_id    INTEGER NOT NULL,
    at        BIGINT  NOT NULL
);
CREATE INDEX IF NOT EXISTS redrive_reattempts_key ON redrive_reattempts (quota_key, at);
