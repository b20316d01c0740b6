#!/usr/bin/env bash
# Resident memory of `redrive serve --workers N` draining a backlog of noop jobs on PostgreSQL.
#
#   scripts/serve-rss.sh BACKLOG [SECONDS]
#
# Seeds BACKLOG available `noop` jobs (one INSERT … SELECT generate_series in a schema of its
# own), starts `redrive serve --workers $WORKERS` on it, reads VmRSS and VmHWM from
# /proc/<pid>/status every $EVERY seconds for SECONDS (default 60), prints one line per sample
# (seconds, jobs succeeded so far, VmRSS kB, VmHWM kB), then stops serve and drops the schema.
# Environment: BIN (default target/release/redrive), SERVER (a PostgreSQL URL without a
# schema, default postgres://postgres@127.0.0.1:5432/test), WORKERS (default 4), EVERY (1).
set -euo pipefail
BACKLOG=${1:?usage: scripts/serve-rss.sh BACKLOG [SECONDS]}
SECONDS_TOTAL=${2:-60}
BIN=${BIN:-target/release/redrive}
SERVER=${SERVER:-postgres://postgres@127.0.0.1:5432/test}
WORKERS=${WORKERS:-4}
EVERY=${EVERY:-1}
SCHEMA=redrive_rss_$$
DB="$SERVER?schema=$SCHEMA"
PORT=$((20000 + $$ % 10000))

cleanup() {
  [ -n "${PID:-}" ] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  psql -q "$SERVER" -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1
}
trap cleanup EXIT

"$BIN" --db "$DB" migrate >/dev/null
NOW=$(($(date +%s%3N) - 60000))
T0=$(date +%s.%N)
psql -q -v ON_ERROR_STOP=1 "$SERVER" >/dev/null <<SQL
SET search_path TO $SCHEMA;
INSERT INTO redrive_jobs (queue, kind, payload, state, attempts, max_attempts, policy, run_at,
  created_at, updated_at)
SELECT 'rss', 'noop', '{}', 'available', 0, 15, 'payment', $NOW, $NOW, $NOW
FROM generate_series(1, $BACKLOG);
ANALYZE redrive_jobs;
SQL
echo "# backlog $BACKLOG seeded in $(echo "$(date +%s.%N) - $T0" | bc) s; serve --workers $WORKERS"

"$BIN" --db "$DB" serve --addr 127.0.0.1:$PORT --workers "$WORKERS" --queue rss --kind noop \
  >/dev/null 2>&1 &
PID=$!
echo "# seconds succeeded VmRSS_kB VmHWM_kB"
for ((i = 0; i * EVERY < SECONDS_TOTAL; i++)); do
  sleep "$EVERY"
  kill -0 "$PID" 2>/dev/null || { echo "# serve exited"; exit 1; }
  RSS=$(awk '/^VmRSS/ {print $2}' /proc/$PID/status)
  HWM=$(awk '/^VmHWM/ {print $2}' /proc/$PID/status)
  DONE=$(psql -qtA "$SERVER" -c "SELECT count(*) FROM $SCHEMA.redrive_jobs WHERE state = 'succeeded'")
  echo "$(((i + 1) * EVERY)) $DONE $RSS $HWM"
done
