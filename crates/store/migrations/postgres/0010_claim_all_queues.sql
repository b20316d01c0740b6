-- A claim of every queue walks the pending jobs in claim order, whatever their queue: one
-- index over (priority, run_at, id) of the pending states, beside the per-queue claim index
-- (queue, priority, run_at, id) that a claim of one queue walks. Without it, a claim of every
-- queue had to name each queue (one arm per queue: SQLite refuses more than 500, and
-- PostgreSQL's plan grows with them) or fetch and sort every pending job. Only pending rows
-- are in it: a claimed or finished job leaves it, and history costs nothing.
CREATE INDEX IF NOT EXISTS redrive_jobs_claim_all
    ON redrive_jobs (priority, run_at, id) WHERE state IN ('scheduled', 'available', 'deferred');
