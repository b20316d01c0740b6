-- The fleet's send cycle on the dependency's shared row: its start in milliseconds (the last
-- cut, when the PSP's bucket was empty, or a second before the first reservation after a
-- second without any, when it was full) and the slots the whole fleet reserved since, so that
-- a 429 learns what the PSP lets through over the cycle rather than over the last second,
-- which a bucket refilled during a pause inflates. `rate_pause_ms`: how long the last 429
-- paused the fleet (its Retry-After); the probe above the learned limit is slower the longer.
ALTER TABLE redrive_dependencies ADD COLUMN cycle_started BIGINT;
ALTER TABLE redrive_dependencies ADD COLUMN cycle_slots BIGINT NOT NULL DEFAULT 0;
ALTER TABLE redrive_dependencies ADD COLUMN rate_pause_ms BIGINT;
