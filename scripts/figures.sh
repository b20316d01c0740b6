#!/usr/bin/env bash
# Regenerates the figures of README.md and docs/: runs the commands that produce them, writes
# each output between its markers in the Markdown files,
#
#   <!-- figure NAME: scripts/figures.sh -->
#   ...replaced...
#   <!-- /figure -->
#
# and redraws the charts in docs/img/. Nothing between markers is edited by hand.
#
#   scripts/figures.sh                 # every figure, release build (as the README's demo)
#   scripts/figures.sh --debug         # the debug build (the demo's times are then longer)
#   scripts/figures.sh demo-run ...    # only these figures (see `figures` below)
#   scripts/figures.sh --list          # the figures and the commands behind them
#   REDRIVE_BIN=path/to/redrive scripts/figures.sh --debug   # a binary built already
#
# The simulator's figures (simulate-*) are seeded and do not depend on the machine or the
# build; the demo's (demo-*) are one run on this machine, labelled with the build, the
# machine's cores and the date. The dated records in docs/benchmarks*.md are measurements
# kept as history, each with its own command; this script does not rewrite them.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
only=()
list=0
for a in "$@"; do
  case "$a" in
    --debug) profile=debug ;;
    --list) list=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "scripts/figures.sh: unknown option $a" >&2; exit 2 ;;
    *) only+=("$a") ;;
  esac
done

# name | where | command (run in a temporary directory, `redrive` is the built binary)
figures() {
  cat <<'EOF'
demo-excerpt|README.md|redrive demo --seed 1
demo-run|docs/demo.md|redrive demo --seed 1
simulate-capacity|docs/simulate.md|redrive simulate --model capacity --clients 100 --runs 100 --strategy exponential --strategy full --strategy decorrelated --strategy exponential+ra --strategy full+ra --strategy full+breaker --strategy full+ra+limit --strategy full+ra+adaptive
simulate-capacity-chart|docs/img/simulate-capacity.svg|redrive simulate --model capacity --clients 100 --runs 100 --strategy exponential --strategy full --strategy full+ra --plot herd.svg
simulate-demo|docs/simulate.md|redrive simulate --model capacity --scenario demo --runs 5
EOF
}

if [ "$list" = 1 ]; then
  figures | awk -F'|' '{ printf "%-24s %-32s %s\n", $1, $2, $3 }'
  exit 0
fi

wanted() {
  [ "${#only[@]}" -eq 0 ] && return 0
  local n
  for n in "${only[@]}"; do [ "$n" = "$1" ] && return 0; done
  return 1
}

command_of() { figures | awk -F'|' -v n="$1" '$1 == n { print $3 }'; }

if [ -n "${REDRIVE_BIN:-}" ]; then
  bin="$(cd "$(dirname "$REDRIVE_BIN")" && pwd)/$(basename "$REDRIVE_BIN")"
elif [ "$profile" = release ]; then
  cargo build --release -p redrive-cli
  bin="$PWD/target/release/redrive"
else
  cargo build -p redrive-cli
  bin="$PWD/target/debug/redrive"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
stamp="scripts/figures.sh, $(date -u +%Y-%m-%d), $profile build, $(nproc 2>/dev/null || echo '?') cores"

# put NAME FILE: the lines of FILE become the content between NAME's markers, in every
# Markdown file that has them. A figure whose markers are missing is an error.
put() {
  local name="$1" file="$2" found=0 md
  for md in README.md docs/*.md; do
    grep -q -- "<!-- figure $name:" "$md" || continue
    found=1
    awk -v name="$name" -v file="$file" '
      $0 ~ "^<!-- figure " name ":" { print; while ((getline line < file) > 0) print line; skip = 1; next }
      skip && /^<!-- \/figure -->$/ { skip = 0 }
      !skip { print }
    ' "$md" > "$md.tmp"
    mv "$md.tmp" "$md"
    echo "figures: $name -> $md"
  done
  if [ "$found" = 0 ]; then
    echo "scripts/figures.sh: no <!-- figure $name: ... --> marker in README.md or docs/" >&2
    exit 1
  fi
}

# run NAME: runs NAME's command in the work directory, its stdout into $work/NAME.out.
run() {
  local cmd
  cmd="$(command_of "$1")"
  echo "figures: $cmd" >&2
  (cd "$work" && eval "\"$bin\" ${cmd#redrive }") > "$work/$1.out"
}

fenced() { # fenced FILE [HEADER]: FILE's lines inside a ``` block
  echo '```'
  [ -n "${2:-}" ] && echo "$2"
  cat "$1"
  echo '```'
}

if wanted demo-run || wanted demo-excerpt; then
  run demo-run
  fenced "$work/demo-run.out" "# redrive demo --seed 1 ($stamp)" > "$work/demo-run.md"
  grep -E '^(finished in|  succeeded|  attempts|  PSP load|  charges made|  => )' "$work/demo-run.out" \
    > "$work/demo-excerpt.out"
  fenced "$work/demo-excerpt.out" "# redrive demo --seed 1 ($stamp)" > "$work/demo-excerpt.md"
  wanted demo-run && put demo-run "$work/demo-run.md"
  wanted demo-excerpt && put demo-excerpt "$work/demo-excerpt.md"
  cp "$work/redrive-demo/demo-load.svg" docs/img/demo-load.svg
  echo "figures: demo chart -> docs/img/demo-load.svg"
fi

if wanted simulate-capacity; then
  run simulate-capacity
  # The rows of the printed table (strategy clients calls wasted mean p50 p99 max peak
  # x-capacity failed blocked), as the Markdown table's columns.
  awk '
    $1 == "strategy" { table = 1; next }
    table && NF >= 12 {
      s = $1
      label = "`" s "`"
      if (s == "exponential") label = label " (no jitter)"
      if (s == "full") label = label " (full jitter)"
      if (s == "exponential+ra") label = label " (honours Retry-After)"
      if (s == "full+ra+limit") label = label " (the fleet keeps to 50/s)"
      if (s == "full+ra+adaptive") label = label " (learns the limit from 429s)"
      mean = $5; sub(/s$/, " s", mean)
      x = $10; sub(/x$/, "×", x)
      printf "| %s | %s | %s | %s | %s | %s |\n", label, $3, $4, mean, $9, x
    }' "$work/simulate-capacity.out" > "$work/rows.md"
  [ -s "$work/rows.md" ] || { echo "scripts/figures.sh: no rows in simulate's output" >&2; exit 1; }
  {
    echo '| strategy (100 workers, 100 runs) | calls | wasted | done in (mean) | peak req / 100 ms | × capacity |'
    echo '|---|---:|---:|---:|---:|---:|'
    cat "$work/rows.md"
  } > "$work/simulate-capacity.md"
  put simulate-capacity "$work/simulate-capacity.md"
fi

if wanted simulate-capacity-chart; then
  run simulate-capacity-chart
  cp "$work/herd.svg" docs/img/simulate-capacity.svg
  echo "figures: simulate chart -> docs/img/simulate-capacity.svg"
fi

if wanted simulate-demo; then
  run simulate-demo
  fenced "$work/simulate-demo.out" > "$work/simulate-demo.md"
  put simulate-demo "$work/simulate-demo.md"
fi

git --no-pager diff --stat -- README.md docs/ || true
