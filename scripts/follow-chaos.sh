#!/usr/bin/env bash
# follow-chaos.sh: the continuous-job chaos run of spate backfill --follow.
#
# Runs TestFollowWorkersKilledAndStoppedAreExactlyOnce (cmd/spate) with its
# chaos phase lasting CHAOS (default 60s) instead of the test suite's 20s,
# on etcd (embedded, in the test process) and on a redis-server the test
# spawns, to a directory; and on etcd to a bucket of an in-process S3
# server (gofakes3). For each, three `spate backfill --follow --until-idle
# 5s` processes share one job while the test:
#
#   - appends lines to the followed files (10 s of steady state first,
#     with no fault: the latency figures of that phase are the steady
#     state's);
#   - creates a new file every 3 s;
#   - renames f0.log away, writes on into it, then writes a new f0.log;
#   - truncates f1.log once its lines are published, then writes it again;
#   - SIGKILLs a worker (and starts it again) and SIGSTOPs one past its
#     2 s lease (then SIGCONTs it) every few seconds.
#
# Once the input is idle the plan turns final, the workers exit 0, and
# `spate verify --expect` checks the output against the ledger of every
# line written: it must find each exactly once. The test logs, per run,
# the lines, the kills and stops, the verification, and the latency from a
# line's write to its publication (p50, p99) at steady state and overall.
#
# Needs redis-server on PATH. Usage: CHAOS=60s scripts/follow-chaos.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export SPATE_FOLLOW_CHAOS="${CHAOS:-60s}"
go test -count=1 -run '^TestFollowWorkersKilledAndStoppedAreExactlyOnce$' -v -timeout 20m ./cmd/spate/ 2>&1 |
	grep -E 'follow_test.go|^(---|ok|FAIL|PASS)'
