#!/usr/bin/env bash
# The dependency promises of the crates (docs/crates.md), checked with `cargo tree`:
# - the PSP simulator (a test double) pulls neither the runtime nor the job store;
# - the job store built for SQLite only has no PostgreSQL driver (nor its TLS stack);
# - the idempotency layer alone depends on neither the runtime nor the job store.
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
exit "$fail"
