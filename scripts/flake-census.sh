#!/usr/bin/env bash
# flake-census.sh: how often each real-server test fails under CPU load.
#
# Runs each package that starts real servers (embedded etcd and NATS,
# spawned redis-server, the spate binary) COUNT times with the race
# detector, as CI does (-race -p 1 -parallel 4), beside LOAD busy
# processes that keep the cores occupied, and prints per test (subtests
# included) the runs that failed out of the runs made, from
# `go test -json`. A test that failed in no run is not listed; the last
# line sums up.
#
# Usage (from anywhere in the repository):
#   scripts/flake-census.sh                    # every package below, -count=10
#   COUNT=2 scripts/flake-census.sh ./stores/nats
#   RUN='TestStoreConformanceR3' COUNT=3 scripts/flake-census.sh ./stores/nats
# Environment:
#   COUNT    runs of each package (go test -count), default 10
#   LOAD     busy processes beside the tests, default 2
#   RUN      go test -run pattern, default every test
#   PARALLEL go test -parallel, default 4 as in .ci/run
#   TIMEOUT  go test -timeout per package, default 60m
#   GO       the go command, default go
#   OUT      directory for the raw -json logs, default a temporary one
# Needs redis-server on PATH (as CI installs it) and jq. On a machine
# shared through a lock on go commands, hold the lock for the whole census
# (the load included), e.g. `flock LOCKFILE scripts/flake-census.sh`,
# rather than loading the machine while waiting for it.
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-10}
LOAD=${LOAD:-2}
RUN=${RUN:-.}
PARALLEL=${PARALLEL:-4}
TIMEOUT=${TIMEOUT:-60m}
GO=${GO:-go}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
if [ "$#" -gt 0 ]; then
  pkgs=("$@")
else
  # Every package whose tests start a real server or process.
  pkgs=(./stores/etcd ./stores/nats ./stores/redis ./cmd/spate
    ./internal/embedetcd ./internal/natsservers ./internal/redisservers
    ./internal/readmetest ./examples/rangescan)
fi
command -v jq >/dev/null || { echo "flake-census: jq is needed to read go test -json (apt-get install jq)" >&2; exit 2; }

# The load: LOAD busy loops, each its own process, stopped on exit by
# their process ids.
busy=()
stop_load() {
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_load EXIT
for _ in $(seq "$LOAD"); do
  sh -c 'while :; do :; done' &
  busy+=($!)
done

echo "flake-census: -count=$COUNT -race -p 1 -parallel $PARALLEL -run '$RUN' beside $LOAD busy processes; logs in $OUT"
status=0
for pkg in "${pkgs[@]}"; do
  log="$OUT/$(echo "$pkg" | tr -c 'A-Za-z0-9\n' '_').json"
  start=$(date +%s)
  if ! "$GO" test -race -p 1 -parallel "$PARALLEL" -json -count="$COUNT" -run "$RUN" -timeout "$TIMEOUT" "$pkg" >"$log" 2>"$log.stderr"; then
    status=1
  fi
  echo "flake-census: $pkg took $(($(date +%s) - start)) s"
done

# Per test: runs ended (pass or fail) and runs failed, over every log.
echo
printf '%-6s %-6s %s\n' FAILED RUNS TEST
cat "$OUT"/*.json | jq -rR 'fromjson? | select(.Test != null and (.Action == "pass" or .Action == "fail")) | [.Package, .Test, .Action] | @tsv' >"$OUT/ends.tsv"
awk -F'\t' '{ k = $1 " " $2; runs[k]++; if ($3 == "fail") failed[k]++ }
  END { for (k in runs) if (failed[k]) printf "%-6d %-6d %s\n", failed[k], runs[k], k }' "$OUT/ends.tsv" | sort -k3
awk -F'\t' '{ n++; if ($3 == "fail") { f++; t[$1 " " $2] = 1 } }
  END { printf "flake-census: %d test runs (subtests included), %d failed, in %d tests\n", n, f, length(t) }' "$OUT/ends.tsv"
# A package that failed with no test failing (a build failure, a timeout,
# a crash) shows in its log's package line.
for log in "$OUT"/*.json; do
  jq -rR --arg log "$log" 'fromjson? | select(.Test == null and .Action == "fail") | "flake-census: package \(.Package) failed (see \($log))"' "$log" 2>/dev/null | sort -u
done
exit "$status"
