-- Card-level stops: a Visa category 1 or Mastercard MAC 03/21 decline on a job with a card key
-- blocks every other job of that key until `until` (fleet-wide; one row per key, the latest
-- end kept). The decline that set it is named by its job and advice; an operator's lift
-- deletes the row (audited in redrive_audit).
CREATE TABLE IF NOT EXISTS redrive_card_stops (
    quota_key   TEXT    PRIMARY KEY,
    job_id      BIGINT NOT NULL,
    attempt     BIGINT NOT NULL,
    at          BIGINT  NOT NULL,
    until       BIGINT  NOT NULL,
    network     TEXT    NOT NULL,
    code        TEXT,
    category    BIGINT,
    advice_code BIGINT,
    rule        TEXT    NOT NULL
);
