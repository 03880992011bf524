#!/usr/bin/env bash
# flake-census.sh: how often each real-server test fails under CPU load.
#
# Runs each package that starts real servers (embedded etcd and NATS,
# spawned redis-server, the spate binary) COUNT times with the race
# detector, as CI does (-race -p 1 -parallel 4), beside LOAD busy
# processes that keep the cores occupied, and prints per test (subtests
# included) the runs that failed out of the runs made, from
# `go test -json`. A test that failed in no run is not listed; the last
# line sums up. Then, per test, how often each allowance for a slow store
# or machine fired (below).
#
# Usage (from anywhere in the repository):
#   scripts/flake-census.sh                    # every package below, -count=10
#   COUNT=2 scripts/flake-census.sh ./stores/nats
#   RUN='TestStoreConformanceR3' COUNT=3 scripts/flake-census.sh ./stores/nats
# Environment:
#   COUNT    runs of each package (go test -count), default 10
#   LOAD     busy processes beside the tests, default 2
#   RUN      go test -run pattern, default every test
#   SKIP     go test -skip pattern, default none
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
SKIP=${SKIP:-}
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

echo "flake-census: -count=$COUNT -race -p 1 -parallel $PARALLEL -run '$RUN' ${SKIP:+-skip '$SKIP' }beside $LOAD busy processes; logs in $OUT"
status=0
for pkg in "${pkgs[@]}"; do
  log="$OUT/$(echo "$pkg" | tr -c 'A-Za-z0-9\n' '_').json"
  start=$(date +%s)
  if ! "$GO" test -race -p 1 -parallel "$PARALLEL" -json -count="$COUNT" -run "$RUN" ${SKIP:+-skip "$SKIP"} -timeout "$TIMEOUT" "$pkg" >"$log" 2>"$log.stderr"; then
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
# The allowances: a rule or test that accepts a slow store or machine
# logs a line each time it does, and they are counted here per test, so
# that a census shows how often each fired (a test that is green only by
# its allowances is a flake hidden, not a flake gone):
#   ttl-retry        conformance's env.withinATTL made an ephemeral pass
#                    again on a fresh key (ValueCapIsReported,
#                    OutcomeReportsWhetherTheWriteApplied);
#   witness-stall    GracefulReleaseHandsOffWithinALease took a lease or
#                    more while its witness saw the store stall;
#   starved-witness  a starvation scenario excused failed commits made
#                    while its witness saw the store stall;
#   caps-remeasure   CapabilitiesNeverBlock measured a phase again;
#   lifecycle-again  a lifecycle count was disturbed and measured again;
#   snapshot-skip    a NATS snapshot test left out checks of keys that
#                    may have expired (lines with a count above 0);
#   delete-expired   ValidKeysAreAccepted found an ephemeral key absent
#                    after its delete lost, and created and deleted it
#                    again.
echo
printf '%-6s %-16s %s\n' FIRED ALLOWANCE TEST
cat "$OUT"/*.json | jq -rR 'fromjson? | select(.Test != null and .Action == "output") | [.Package, .Test, .Output] | @tsv' |
  awk -F'\t' '
    /its key may have expired; again with a fresh key/ { a = "ttl-retry" }
    /a lease \(.*\) or more, while a witness call took .*: the store or the machine stalled/ { a = "witness-stall" }
    / failed, [1-9][0-9]* of them while the store itself stalled/ { a = "starved-witness" }
    /Capabilities .*: a round of batches was over the limit .*, measured again/ { a = "caps-remeasure" }
    /attempt [0-9]+ disturbed: .*; measuring again/ { a = "lifecycle-again" }
    /: [1-9][0-9]* of [0-9]+ stable-key checks left out/ { a = "snapshot-skip" }
    /read absent after its delete lost .*; created and deleted again/ { a = "delete-expired" }
    a != "" { n[$1 " " $2 "\t" a]++; a = "" }
    END { for (k in n) { split(k, p, "\t"); printf "%-6d %-16s %s\n", n[k], p[2], p[1] } }' | sort -k3 >"$OUT/allowances.txt"
cat "$OUT/allowances.txt"
awk '{ n += $1 } END { printf "flake-census: allowances fired %d times in %d tests\n", n, NR }' "$OUT/allowances.txt"
# A package that failed with no test failing (a build failure, a timeout,
# a crash) shows in its log's package line.
for log in "$OUT"/*.json; do
  jq -rR --arg log "$log" 'fromjson? | select(.Test == null and .Action == "fail") | "flake-census: package \(.Package) failed (see \($log))"' "$log" 2>/dev/null | sort -u
done
exit "$status"
