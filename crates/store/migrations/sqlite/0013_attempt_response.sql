-- What the dependency answered to a failed attempt: an excerpt of the response body, redacted
-- by the handler (card numbers, secrets) and cut to 2 KiB on a character boundary by the
-- store. `redrive show`, the API and the dashboard show it; the dead-letter groups use its
-- start. NULL: no answer (a refused connection, a success) or a handler that keeps none.
ALTER TABLE redrive_attempts ADD COLUMN response TEXT;
