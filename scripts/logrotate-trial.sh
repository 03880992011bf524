#!/usr/bin/env bash
# logrotate-trial.sh: the full logrotate trial of spate backfill --follow.
#
# Runs TestFollowNextToLogrotate (cmd/spate) in its full form
# (SPATE_LOGROTATE_FULL=1), the way an operator ships logs: five
# applications append 200 numbered lines a second each while Debian's real
# logrotate (-f) rotates their logs every 15 s: two copytruncate (one with
# compress + delaycompress), three create (one with compress +
# delaycompress), rotate 3, the rotated files in the source directory.
# Three `spate backfill --follow` workers share the job over the default
# store (an embedded etcd the first one starts; only its port is chosen)
# with every other flag at its default (lease 15 s, --discover = lease),
# for 3 minutes; one worker is SIGKILLed (and started again), another
# SIGSTOPped for 30 s (then SIGCONTed). Once the output has been quiet
# for two leases the workers are stopped with SIGTERM.
#
# The test counts every line written: duplicates, alien lines (never
# written: a compressed archive's bytes), lines lost inside logrotate's
# copy→truncate window and outside it; the write→published latency
# (overall, outside the faults, and for lines written in the 2 s after a
# create rotation); and every 5 s it samples worker w0's /metrics
# (spate_follow_lag_seconds / _bytes / spate_follow_files) and
# `spate inspect --json` (splits in the store, parked splits, files
# waiting for a lane). It logs the WARN lines by message.
#
# It loads a 2-core machine for about 4 minutes: run it once at a time.
# Needs /usr/sbin/logrotate (apt-get install logrotate).
# Usage: scripts/logrotate-trial.sh [extra go test flags]
set -euo pipefail
cd "$(dirname "$0")/.."
export SPATE_LOGROTATE_FULL=1
go test -count=1 -run '^TestFollowNextToLogrotate$' -v -timeout 20m "$@" ./cmd/spate/ 2>&1 |
	grep -E 'logrotate_test.go|^(---|ok|FAIL|PASS)|^\s+(spate_|sample|progress)'
