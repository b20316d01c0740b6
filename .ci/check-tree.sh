#!/usr/bin/env bash
# The dependency promises of the crates (docs/crates.md), checked with `cargo tree`:
# - the PSP simulator (a test double) pulls neither the runtime nor the job store;
# - the job store built for SQLite only has no PostgreSQL driver (nor its TLS stack);
# - the idempotency layer alone depends on neither the runtime nor the job store;
# - sqlx is not 0.9.0, which stopped setting TCP_NODELAY: every statement larger than one
#   send (a 200-job completion is ~30 KB) then waited ~40 ms for the server's delayed ACK
#   (PostgreSQL store-level drain at c=8: 23k jobs/s on 0.9.0, 34k on 0.9.1).
# Exits non-zero naming the crate that should not be there.
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
forbid() {
  local what="$1"; shift
  local pattern="$1"; shift
  local found
  found="$(cargo tree -e normal --prefix none "$@" | sed 's/ (\*)$//' | sort -u | grep -E "$pattern" || true)"
  if [ -n "$found" ]; then
    printf 'cargo tree %s contains %s:\n%s\n' "$*" "$what" "$found" >&2
    fail=1
  else
    printf 'ok: cargo tree %s: no %s\n' "$*" "$what"
  fi
}

forbid "redrive-runtime or redrive-store" '^redrive-(runtime|store) ' -p redrive-psp-sim
forbid "PostgreSQL driver" '^(sqlx-postgres|postgres|tokio-postgres|aws-lc-sys) ' \
  -p redrive-store --no-default-features --features sqlite
forbid "redrive-runtime or redrive-store" '^redrive-(runtime|store) ' -p redrive-idempotency
forbid "database driver" '^sqlx' -p redrive-idempotency --no-default-features
forbid "sqlx 0.9.0 (no TCP_NODELAY)" '^sqlx-core v0\.9\.0$' -p redrive-store
exit "$fail"
