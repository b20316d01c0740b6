-- The whole flow-control state of a dependency, shared by the fleet (breaker, pause, rate
-- limit), as one row that every write replaces with a compare-and-set on `version`.
ALTER TABLE redrive_dependencies ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE redrive_dependencies ADD COLUMN mode TEXT NOT NULL DEFAULT 'normal';
ALTER TABLE redrive_dependencies ADD COLUMN openings BIGINT NOT NULL DEFAULT 0;
ALTER TABLE redrive_dependencies ADD COLUMN probe_successes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE redrive_dependencies ADD COLUMN probe_failures BIGINT NOT NULL DEFAULT 0;
ALTER TABLE redrive_dependencies ADD COLUMN round_started BIGINT;
-- The rate limit in force (requests per second; NULL: none) and the limiter's theoretical
-- arrival time in microseconds (GCRA).
ALTER TABLE redrive_dependencies ADD COLUMN rate_rps DOUBLE PRECISION;
ALTER TABLE redrive_dependencies ADD COLUMN tat_us BIGINT;
ALTER TABLE redrive_dependencies ADD COLUMN rate_cut_at BIGINT;
ALTER TABLE redrive_dependencies ADD COLUMN rate_cap DOUBLE PRECISION;
ALTER TABLE redrive_dependencies ADD COLUMN rate_raised_at BIGINT;
