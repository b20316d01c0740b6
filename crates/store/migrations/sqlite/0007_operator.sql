-- Operator controls: paused queues (workers claim nothing from them) and the audit trail of
-- every operator action.
CREATE TABLE IF NOT EXISTS redrive_paused_queues (
    queue     TEXT PRIMARY KEY,
    paused_at BIGINT NOT NULL,
    paused_by TEXT   NOT NULL
);

CREATE TABLE IF NOT EXISTS redrive_audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at     BIGINT NOT NULL,
    actor  TEXT   NOT NULL,
    via    TEXT   NOT NULL,
    action TEXT   NOT NULL,
    target TEXT   NOT NULL,
    row_count BIGINT NOT NULL
);
