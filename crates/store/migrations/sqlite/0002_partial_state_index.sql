-- The full (state, queue, id) index was rewritten on every state change (twice per job on the
-- hot path: available → running → succeeded) and on every insert. Only the dead-letter list,
-- replay/purge of dead jobs and the dashboard's cancelled list need a by-state index: keep
-- those two states indexed, in id order per queue. `counts` is a GROUP BY over the table
-- either way; lists of other states walk the primary key (or, on PostgreSQL, the partial
-- claim and lease indexes).
DROP INDEX IF EXISTS redrive_jobs_state;
CREATE INDEX IF NOT EXISTS redrive_jobs_dead ON redrive_jobs (queue, id) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS redrive_jobs_cancelled ON redrive_jobs (queue, id) WHERE state = 'cancelled';
