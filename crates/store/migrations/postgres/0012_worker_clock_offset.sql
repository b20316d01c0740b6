-- Each worker process's measured offset of its clock to the database's (database − local,
-- milliseconds), kept fresh by its registry heartbeat: `redrive workers` shows a host whose
-- clock is off. NULL: the process does not measure it (its clock is not synced).
ALTER TABLE redrive_workers ADD COLUMN IF NOT EXISTS clock_offset_ms BIGINT;
