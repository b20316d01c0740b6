-- The W3C trace context (`traceparent`) of the request that enqueued a job, so that its
-- attempts and their outbound calls join that request's trace.
ALTER TABLE redrive_jobs ADD COLUMN traceparent TEXT;
