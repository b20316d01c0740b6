-- Server-side insert throughput of redrive_jobs, no client: run with
--   psql -h 127.0.0.1 -U postgres -d test -f crates/store/bench/insert_profile.sql
-- in a scratch schema (created and dropped here). Prints rows/s per variant.
DROP SCHEMA IF EXISTS redrive_insert_profile CASCADE; CREATE SCHEMA redrive_insert_profile; SET search_path TO redrive_insert_profile;
\i crates/store/migrations/postgres/0001_init.sql
DO $$
DECLARE q text[]; k text[]; p text[]; n text[]; z int8[]; st text[]; ma int8[]; pol text[]; nn int8[]; t0 timestamptz; i int; v text;
BEGIN
 SELECT array_agg('bench'::text), array_agg('noop'::text), array_agg('{}'::text), array_agg(NULL::text), array_agg(0::int8), array_agg('available'::text), array_agg(15::int8), array_agg('payment'::text), array_agg(NULL::int8) INTO q,k,p,n,z,st,ma,pol,nn FROM generate_series(1,5000);
 FOREACH v IN ARRAY ARRAY['conflict','plain','conflict','plain','conflict','plain'] LOOP
  t0 := clock_timestamp();
  FOR i IN 1..4 LOOP
   IF v = 'conflict' THEN
    INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at)
    SELECT a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,1,1 FROM UNNEST(q,k,p,n,n,z,st,ma,pol,z,nn,nn) WITH ORDINALITY AS u(a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,ord) ORDER BY ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
   ELSE
    INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at)
    SELECT a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,1,1 FROM UNNEST(q,k,p,n,n,z,st,ma,pol,z,nn,nn) WITH ORDINALITY AS u(a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,ord) ORDER BY ord;
   END IF;
  END LOOP;
  RAISE NOTICE '% : % rows/s', v, round(20000 / extract(epoch from clock_timestamp() - t0));
 END LOOP;
END $$;
DROP INDEX redrive_jobs_state;
DO $$
DECLARE q text[]; k text[]; p text[]; n text[]; z int8[]; st text[]; ma int8[]; pol text[]; nn int8[]; t0 timestamptz; i int; v text;
BEGIN
 SELECT array_agg('bench'::text), array_agg('noop'::text), array_agg('{}'::text), array_agg(NULL::text), array_agg(0::int8), array_agg('available'::text), array_agg(15::int8), array_agg('payment'::text), array_agg(NULL::int8) INTO q,k,p,n,z,st,ma,pol,nn FROM generate_series(1,5000);
 FOREACH v IN ARRAY ARRAY['conflict','plain'] LOOP
  t0 := clock_timestamp();
  FOR i IN 1..4 LOOP
   IF v = 'conflict' THEN
    INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at)
    SELECT a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,1,1 FROM UNNEST(q,k,p,n,n,z,st,ma,pol,z,nn,nn) WITH ORDINALITY AS u(a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,ord) ORDER BY ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
   ELSE
    INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at)
    SELECT a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,1,1 FROM UNNEST(q,k,p,n,n,z,st,ma,pol,z,nn,nn) WITH ORDINALITY AS u(a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,ord) ORDER BY ord;
   END IF;
  END LOOP;
  RAISE NOTICE '% : % rows/s', v, round(20000 / extract(epoch from clock_timestamp() - t0));
 END LOOP;
END $$;
DROP INDEX redrive_jobs_claim;
DO $$
DECLARE q text[]; k text[]; p text[]; n text[]; z int8[]; st text[]; ma int8[]; pol text[]; nn int8[]; t0 timestamptz; i int; v text;
BEGIN
 SELECT array_agg('bench'::text), array_agg('noop'::text), array_agg('{}'::text), array_agg(NULL::text), array_agg(0::int8), array_agg('available'::text), array_agg(15::int8), array_agg('payment'::text), array_agg(NULL::int8) INTO q,k,p,n,z,st,ma,pol,nn FROM generate_series(1,5000);
 FOREACH v IN ARRAY ARRAY['conflict','plain'] LOOP
  t0 := clock_timestamp();
  FOR i IN 1..4 LOOP
   IF v = 'conflict' THEN
    INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at)
    SELECT a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,1,1 FROM UNNEST(q,k,p,n,n,z,st,ma,pol,z,nn,nn) WITH ORDINALITY AS u(a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,ord) ORDER BY ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
   ELSE
    INSERT INTO redrive_jobs (queue, kind, payload, idempotency_key, dependency, priority, state, max_attempts, policy, run_at, ttl_ms, deadline, created_at, updated_at)
    SELECT a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,1,1 FROM UNNEST(q,k,p,n,n,z,st,ma,pol,z,nn,nn) WITH ORDINALITY AS u(a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,ord) ORDER BY ord;
   END IF;
  END LOOP;
  RAISE NOTICE '% : % rows/s', v, round(20000 / extract(epoch from clock_timestamp() - t0));
 END LOOP;
END $$;
DROP SCHEMA redrive_insert_profile CASCADE;
