-- The fleet's own measurements on the dependency's shared row: the slots the whole fleet
-- reserved in the meter's current window (its start in milliseconds, and the count) and the
-- previous window's rate (reservations per second), so that a 429 cuts the learned rate
-- relative to what the fleet got through, not one process's share. `rate_lifted` (0 or 1):
-- the learned rate grew to its ceiling and was lifted, so slow start does not start again.
ALTER TABLE redrive_dependencies ADD COLUMN rate_lifted BIGINT NOT NULL DEFAULT 0;
ALTER TABLE redrive_dependencies ADD COLUMN meter_started BIGINT;
ALTER TABLE redrive_dependencies ADD COLUMN meter_slots BIGINT NOT NULL DEFAULT 0;
ALTER TABLE redrive_dependencies ADD COLUMN meter_rate DOUBLE PRECISION;
