#!/usr/bin/env bash
# A PostgreSQL primary and a synchronous streaming standby on loopback, for failover tests
# and for trying a failover by hand (docs/operations.md, "PostgreSQL failover").
#
#   scripts/pg-ha.sh start DIR PRIMARY_PORT STANDBY_PORT [async]
#       initdb a primary in DIR/primary, pg_basebackup -R a standby into DIR/standby,
#       replication synchronous (synchronous_standby_names) unless `async` is given;
#       creates database `redrive`; returns once the standby streams (and is in sync).
#   scripts/pg-ha.sh kill-primary DIR    the primary dies (pg_ctl stop -m immediate)
#   scripts/pg-ha.sh promote DIR         the standby becomes the primary (pg_ctl promote)
#   scripts/pg-ha.sh stop DIR            stops both and removes DIR
#
# Clients then use: postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/redrive?target_session_attrs=read-write
# Needs PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup); run as root it runs them
# as the `postgres` user, as initdb requires.
set -euo pipefail

bin_dir() {
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir
    return
  fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
  if [ -z "$d" ] || [ ! -x "$d/initdb" ]; then
    echo "pg-ha: PostgreSQL's server binaries (initdb, pg_ctl) are not installed" >&2
    exit 3
  fi
  echo "$d"
}

BIN=$(bin_dir)
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
psql_at() { as_pg "$BIN/psql" -h 127.0.0.1 -p "$1" -U postgres -d postgres -Atqc "$2"; }

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,15p' "$0"; exit 2; }

case "$cmd" in
start)
  p1=${3:?primary port}; p2=${4:?standby port}; mode=${5:-sync}
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  as_pg "$BIN/initdb" -D "$dir/primary" -U postgres -A trust --no-sync >"$dir/initdb.log"
  cat >>"$dir/primary/postgresql.conf" <<EOF
port = $p1
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 4
max_connections = 200
fsync = off
full_page_writes = off
EOF
  if [ "$mode" != async ]; then
    echo "synchronous_standby_names = 'standby1'" >>"$dir/primary/postgresql.conf"
  fi
  echo "host replication all 127.0.0.1/32 trust" >>"$dir/primary/pg_hba.conf"
  as_pg "$BIN/pg_ctl" -D "$dir/primary" -l "$dir/primary.log" -w -t 60 start >/dev/null
  as_pg "$BIN/pg_basebackup" -h 127.0.0.1 -p "$p1" -U postgres -D "$dir/standby" -R -X stream --no-sync
  # The standby: its own port, its name for synchronous replication, and no synchronous
  # standby of its own once promoted (else every commit would wait for one that is not there).
  cat >>"$dir/standby/postgresql.auto.conf" <<EOF
port = $p2
primary_conninfo = 'host=127.0.0.1 port=$p1 user=postgres application_name=standby1'
synchronous_standby_names = ''
EOF
  as_pg "$BIN/pg_ctl" -D "$dir/standby" -l "$dir/standby.log" -w -t 60 start >/dev/null
  psql_at "$p1" "CREATE DATABASE redrive" >/dev/null
  want=async; [ "$mode" != async ] && want=sync
  for _ in $(seq 1 100); do
    state=$(psql_at "$p1" "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'" || true)
    [ "$state" = "$want" ] && { echo "primary 127.0.0.1:$p1, standby 127.0.0.1:$p2 ($state)"; exit 0; }
    sleep 0.1
  done
  echo "pg-ha: the standby did not reach state $want (logs in $dir)" >&2
  exit 1
  ;;
kill-primary)
  as_pg "$BIN/pg_ctl" -D "$dir/primary" -m immediate -w stop >/dev/null
  ;;
promote)
  as_pg "$BIN/pg_ctl" -D "$dir/standby" -w -t 60 promote >/dev/null
  ;;
stop)
  for n in primary standby; do
    [ -d "$dir/$n" ] && as_pg "$BIN/pg_ctl" -D "$dir/$n" -m immediate -w stop >/dev/null 2>&1 || true
  done
  rm -rf "$dir"
  ;;
*)
  sed -n '2,15p' "$0"; exit 2
  ;;
esac
